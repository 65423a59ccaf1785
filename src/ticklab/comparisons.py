"""Fresh-data verdicts: one comparison of two conditions of a claim, on every setup that measured both.

A *setup* is a bundle's host-id (a host, or a guest with its accelerator and kernel). Each
comparison takes one metric per run from results.csv, the ratio of medians (treatment / baseline)
with a seeded BCa bootstrap CI, a two-sided Mann-Whitney U test and Cliff's delta; p-values are
Holm-adjusted across every comparison of the claim; :func:`ticklab.verdicts.decide` turns the CI and
p into a verdict against the published ratio (direction and size; the published value is n = 1).
A setup that measured none of a claim's compared conditions gets one "not testable here" row saying
what it did measure; a comparison a setup only partly measured is left to the setups that did.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from .bundle import BundleError, load_bundle, run_failed, stopped_because
from .fresh import BundleRef
from .capture.stopping import TARGET_HALF_WIDTH, half_width_share, measured_results
from .stats import cliffs_delta, holm, mann_whitney, ratio_of_medians
from .verdicts import Verdict, decide


@dataclass(frozen=True)
class Comparison:
    comparison: str          # what is compared, in words
    metric: str              # results.csv metric, one value per run
    treatment: str           # condition names (bundles' condition column)
    baseline: str
    published_ratio: float   # treatment / baseline as the source implies it
    published_effect: str    # the published statement the ratio comes from
    experiments: tuple[str, ...] = ()  # only bundles of these experiments (all when empty)


def usable_bundles(bundles: list[BundleRef]):
    """(ref, bundle) for every bundle that loads, is sealed and was testable; measured_runs says why others are not."""
    for ref in bundles:
        try:
            bundle = load_bundle(ref.path)
        except BundleError:
            continue
        if not bundle.manifest.get("not_testable"):
            yield ref, bundle


def measured_runs(bundles: list[BundleRef]) -> tuple[pd.DataFrame, list[str]]:
    """results.csv rows of every sealed, testable bundle with host_id, bundle and experiment columns;
    and one note per bundle left out (why)."""
    frames, notes = [], []
    for ref in bundles:
        try:
            bundle = load_bundle(ref.path)
        except BundleError as exc:
            notes.append(f"{ref.host_id}/{ref.path.name}: left out ({exc})")
            continue
        if bundle.manifest.get("not_testable"):
            notes.append(f"{ref.host_id}/{ref.path.name}: not testable there ({bundle.manifest['not_testable']})")
            continue
        frame = measured_results(bundle.manifest, bundle.results).copy()
        failed = sum(run_failed(r) for r in bundle.manifest["runs"])  # a failed run often wrote no results at all
        if failed:
            notes.append(f"{ref.host_id}/{ref.path.name}: {failed} failed run(s) left out")
        frame["host_id"], frame["bundle"], frame["experiment"] = ref.host_id, str(ref.path), bundle.manifest["experiment"]
        frame["stopped"] = stopped_because(bundle.manifest)
        frames.append(frame)
    columns = ["host_id", "bundle", "experiment", "stopped", "run", "condition", "metric", "value", "unit"]
    return (pd.concat(frames, ignore_index=True)[columns] if frames else pd.DataFrame(columns=columns)), notes


def _chosen(runs: pd.DataFrame, comparison: Comparison, condition: str) -> pd.DataFrame:
    chosen = runs[(runs["metric"] == comparison.metric) & (runs["condition"] == condition)]
    if comparison.experiments:
        chosen = chosen[chosen["experiment"].isin(comparison.experiments)]
    return chosen


def precision_note(low: float, high: float, estimate: float, stopped: list[str] = ()) -> str:
    """Whether the CI meets the design's precision target, and (when it does not) why capturing stopped."""
    share = half_width_share(low, high, estimate)
    if share == float("inf"):
        return "CI half-width cannot be compared with a zero effect"
    if share <= TARGET_HALF_WIDTH:
        return f"CI half-width {share:.0%} of the effect (meets the ≤{TARGET_HALF_WIDTH:.0%} target)"
    why = "; ".join(dict.fromkeys(stopped)) or "no stopping record"
    return f"CI half-width {share:.0%} of the effect (does not meet the ≤{TARGET_HALF_WIDTH:.0%} target; capture stopped: {why})"


def verdicts(claim: str, comparisons: list[Comparison], runs: pd.DataFrame, *, alpha: float = 0.05,
             n_boot: int = 10_000, seed: int = 0) -> list[Verdict]:
    """One verdict per setup and comparison (Holm across all tested comparisons of the claim)."""
    tested, untested = [], []
    if "stopped" not in runs:
        runs = runs.assign(stopped="fixed run count (no stopping record)")
    for setup in sorted(runs["host_id"].unique()):
        on_setup = runs[runs["host_id"] == setup]
        tested_here = 0
        for comparison in comparisons:
            treatment = _chosen(on_setup, comparison, comparison.treatment)
            baseline = _chosen(on_setup, comparison, comparison.baseline)
            if len(treatment) < 2 or len(baseline) < 2:
                continue
            stopped = [*treatment["stopped"], *baseline["stopped"]]
            treatment, baseline = treatment["value"], baseline["value"]
            ratio = ratio_of_medians(treatment, baseline, n_boot=n_boot, seed=seed)
            tested.append((setup, comparison, treatment, baseline, ratio, mann_whitney(treatment, baseline), stopped))
            tested_here += 1
        if not tested_here:
            wanted = sorted({name for c in comparisons for name in (c.treatment, c.baseline)})
            untested.append(Verdict(
                claim=claim, setup=setup, comparison="; ".join(c.comparison for c in comparisons),
                published_effect="; ".join(dict.fromkeys(c.published_effect for c in comparisons)),
                verdict="not testable here",
                reason=f"this setup measured {', '.join(sorted(on_setup['condition'].unique()))}; every comparison "
                       f"needs at least 2 runs of two of {', '.join(wanted)}"))
    adjusted = holm([t[5].pvalue for t in tested]) if tested else []
    done = []
    for (setup, comparison, treatment, baseline, ratio, rank, stopped), p in zip(tested, adjusted):
        verdict, reason = decide(comparison.published_ratio, ratio, float(p), alpha)
        done.append(Verdict(
            claim=claim, setup=setup, comparison=comparison.comparison, published_effect=comparison.published_effect,
            verdict=verdict, reason=f"{reason}; {precision_note(ratio.low, ratio.high, ratio.estimate, stopped)}",
            fresh_effect=ratio.estimate, ci_low=ratio.low, ci_high=ratio.high, p_holm=float(p),
            n_per_condition=f"{len(treatment)} vs {len(baseline)}", cliffs_delta=cliffs_delta(treatment, baseline),
            test=f"ratio of medians ({comparison.metric}), {ratio.method}; {rank.test}; Holm over {len(tested)}",
        ))
    return done + untested


def claim_verdicts(claim: str, comparisons: list[Comparison], bundles: list[BundleRef], data_dir, *, summary: str,
                   published_effect: str, alpha: float = 0.05, n_boot: int = 10_000, seed: int = 0) -> list[Verdict]:
    """Every verdict row of a claim: the tested comparisons, and for each setup whose bundles gave nothing to
    compare (not testable there, failed, unreadable) or when there are no bundles, the reason."""
    from .claims import absent_setups, pending_verdict

    runs, _ = measured_runs(bundles)
    found = verdicts(claim, comparisons, runs, alpha=alpha, n_boot=n_boot, seed=seed) if not runs.empty else []
    covered = {v.setup for v in found}
    rest = [ref for ref in bundles if ref.host_id not in covered]
    if not bundles:
        return pending_verdict(claim, summary, published_effect, bundles, data_dir)
    unexplained = pending_verdict(claim, summary, published_effect, rest, data_dir, absent=False) if rest else []
    return found + unexplained + absent_setups(claim, summary, published_effect, bundles, data_dir)
