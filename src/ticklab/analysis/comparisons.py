"""Fresh-data verdicts: one comparison of two conditions of a claim, on every setup that measured both.

A *setup* is a bundle's host-id (a host, or a guest with its accelerator and kernel). Each comparison
takes one metric per run from results.csv (runs whose condition checks failed are left out), the ratio of
treatment over baseline with its CI (:func:`ticklab.analysis.stats.ratio_interval`: for medians the Hodges-Lehmann ratio
with the exact CI that inverts the Mann-Whitney test; for other statistics a seeded percentile bootstrap), a
two-sided Mann-Whitney U test and Cliff's delta.

The multiple-comparison family is fixed: one claim on one setup, i.e. the claim's comparisons that setup measured
with at least two runs of each condition and that the claim does not call untestable there (a treatment that never
took effect). Bundles of other setups never change it. Within the family p-values are Holm-adjusted and the CIs
are simultaneous (Bonferroni: each at 1 − alpha/m), so a verdict rests on its CI alone.
:func:`ticklab.analysis.verdicts.decide` turns the CI into a word against the comparison's target and declared margins;
:mod:`ticklab.analysis.power` adds the power to detect the target and the runs it needs.

Setups that tested nothing of a claim (no bundle, not testable there, nothing comparable) collapse into
one "not testable here" row per claim that gives each setup's reason.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..bundle import BundleError, measured_results, run_failed, stopped_because
from .captured import BundleRef, all_setups
from .checks import excluded_runs, run_checks
from .power import blocked_detection_power, detection_power
from .stats import (
    STATISTIC_NAMES,
    block_pairs,
    blocks_bound,
    cliffs_delta,
    holm,
    mann_whitney,
    precision_note,
    rank_shift_rank,
    ratio_by_blocks,
    ratio_interval,
    simultaneous_level,
    wilcoxon_blocks,
)
from .verdicts import Margins, Target, Verdict, consistent_band, decide

RUN_COLUMNS = [
    "host_id",
    "bundle",
    "experiment",
    "stopped",
    "kernel",
    "run",
    "condition",
    "metric",
    "value",
    "unit",
    "block",
    "vcpu_threads",
]


@dataclass(frozen=True)
class Comparison:
    comparison: str  # what is compared, in words
    metric: str  # results.csv metric, one value per run
    treatment: str  # condition names (bundles' condition column)
    baseline: str
    target: Target
    experiments: tuple[str, ...] = ()  # only bundles of these experiments (all when empty)
    statistic: str = "median"  # of each condition's runs (ticklab.analysis.stats.STATISTICS)
    role: str = "claim"  # "premise": what the claim presupposes, tested as such
    margins: Margins | None = None  # declared per comparison, with its no-effect margin (required)
    sizes_comparable: str = ""  # whether the target's size can be expected on lab setups, and why
    kernels: str = ""  # "<7.1" / ">=7.1": the kernel releases the comparison is about (empty: any)
    kernels_why: str = ""  # what those kernels have that others do not
    # what a run needs to give the metric (e.g. events a trace must hold): where a setup ran both conditions and no run
    # gives it, the comparison is "not testable here" with this reason instead of vanishing from the table
    metric_needs: str = ""
    # why the effect needs vCPUs that run at once (HPET read sharing, pvspinlock): a setup whose vCPUs take turns in
    # one host thread (QEMU TCG thread=single) cannot test it
    needs_concurrency: str = ""

    def __post_init__(self):
        if not isinstance(self.margins, Margins):
            raise ValueError(
                f"comparison {self.comparison!r}: declare its margins (Margins(no_effect=...)), "
                "the change its quantity counts as none"
            )


@dataclass(frozen=True)
class NegativeControl:
    """A comparison with no expected effect: if it moves, something other than the condition differs."""

    comparison: str
    metric: str
    treatment: str
    baseline: str
    no_effect: float  # |ratio − 1| within which "no effect" is shown
    experiments: tuple[str, ...] = ()
    split_by_order: bool = False  # treatment and baseline are the later and earlier halves of one condition's runs


def _kernel_version(release: str) -> tuple[int, int] | None:
    parts = release.split(".")
    try:
        return int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdigit()) or 0)
    except (IndexError, ValueError):
        return None


def kernel_in_range(release: str, wanted: str) -> bool:
    """Whether a kernel release ("6.12.117-ticklab") is in a range ("<7.1", ">=7.1"); unknown releases are not."""
    if not wanted:
        return True
    version = _kernel_version(release)
    if version is None:
        return False
    op = ">=" if wanted.startswith(">=") else "<"
    bound = _kernel_version(wanted[len(op) :].strip() + ".0")
    return version >= bound if op == ">=" else version < bound


def usable_bundles(bundles: list[BundleRef]):
    """(ref, bundle) for every bundle that loads, is sealed and was testable; measured_runs says why others are not."""
    for ref in bundles:
        try:
            bundle = ref.load()
        except BundleError:
            continue
        if not bundle.manifest.not_testable:
            yield ref, bundle


def _gated(claim: str, checks, bundles: list[BundleRef]) -> dict:
    return excluded_runs(run_checks(claim, checks, bundles))


def measured_runs(
    bundles: list[BundleRef], checks=(), claim: str = "", gated: dict | None = None
) -> tuple[pd.DataFrame, list[str]]:
    """results.csv rows of every sealed, testable bundle (with host_id, bundle, experiment, stopped and kernel
    columns), less failed runs and runs whose condition checks failed or could not be computed; and one note per
    thing left out. ``gated``: the checks' excluded runs when the caller has them already."""
    frames, notes = [], []
    gated = _gated(claim, checks, bundles) if gated is None else gated
    for ref in bundles:
        try:
            bundle = ref.load()
        except BundleError as exc:
            notes.append(f"{ref.host_id}/{ref.path.name}: left out ({exc})")
            continue
        manifest = bundle.manifest
        if manifest.not_testable:
            notes.append(f"{ref.host_id}/{ref.path.name}: not testable there ({manifest.not_testable})")
            continue
        frame = measured_results(manifest, bundle.results).copy()
        failed = sum(run_failed(r) for r in manifest.runs)  # a failed run often wrote no results at all
        if failed:
            notes.append(f"{ref.host_id}/{ref.path.name}: {failed} failed run(s) left out")
        unchecked = sorted(run for path, run in gated if path == str(ref.path))
        if unchecked:
            frame = frame[~frame["run"].isin(unchecked)]
            notes.append(
                f"{ref.host_id}/{ref.path.name}: {len(unchecked)} run(s) left out because a condition check "
                f"failed or could not be computed ({', '.join(unchecked)}; build/checks.csv)"
            )
        kernels = {r.run: manifest.kernel_release(r) for r in manifest.runs}
        frame["host_id"], frame["bundle"], frame["experiment"] = (
            ref.host_id,
            str(ref.path),
            manifest.experiment,
        )
        frame["stopped"] = stopped_because(manifest)
        frame["kernel"] = frame["run"].map(kernels).fillna("")
        # the block each measured run was planned in (captures planned in blocks; older bundles have none)
        frame["block"] = frame["run"].map(manifest.blocks_by_run).astype("Int64")
        # "single" where the machine's vCPUs take turns in one host thread (declared: host.facts.DECLARED_FACTS)
        frame["vcpu_threads"] = ((manifest.host or {}).get("declared") or {}).get("vcpu_threads") or ""
        frames.append(frame)
    return (pd.concat(frames, ignore_index=True)[RUN_COLUMNS] if frames else pd.DataFrame(columns=RUN_COLUMNS)), notes


LEFT_OUT_COLUMNS = ["host_id", "bundle", "experiment", "run", "condition", "why"]


def left_out_runs(bundles: list[BundleRef], gated: dict) -> pd.DataFrame:
    """One row per measured run the checks left out (``gated``: ``checks.excluded_runs``), with the checks that failed
    or could not be computed for it: what a comparison says when too few runs are left to test."""
    rows = []
    for ref, bundle in usable_bundles(bundles):
        for record in bundle.manifest.measured_runs():
            found = gated.get((str(ref.path), record.run))
            if found:
                rows.append(
                    {
                        "host_id": ref.host_id,
                        "bundle": str(ref.path),
                        "experiment": bundle.manifest.experiment,
                        "run": record.run,
                        "condition": record.condition,
                        "why": found,
                    }
                )
    return pd.DataFrame(rows, columns=LEFT_OUT_COLUMNS)


def left_out_words(left: pd.DataFrame, total: int) -> str:
    """ "N of M runs left out (check failed in n, e.g. ...; ...)": the runs of a comparison's conditions the checks
    left out, each check named with how many runs it left out and what one of them showed."""
    counts: dict[str, list] = {}
    for found in left["why"]:
        for check, status, seen in found:
            counts.setdefault(f"{check} {status}", [0, seen])[0] += 1
    why = "; ".join(f"{name} in {n} (e.g. {seen})" for name, (n, seen) in counts.items())
    return f"{len(left)} of {total} runs left out ({why}; build/checks.csv)"


def _of_experiments(frame: pd.DataFrame, experiments: tuple[str, ...]) -> pd.DataFrame:
    """The rows of these experiments (all rows when none is named)."""
    return frame[frame["experiment"].isin(experiments)] if experiments else frame


def _chosen(runs: pd.DataFrame, metric: str, condition: str, experiments: tuple[str, ...]) -> pd.DataFrame:
    return _of_experiments(runs[(runs["metric"] == metric) & (runs["condition"] == condition)], experiments)


def _target_columns(comparison: Comparison) -> dict:
    target, margins = comparison.target, comparison.margins
    band = consistent_band(target, margins.size_tolerance) if target.ratio is not None else (None, None)
    return {
        "role": comparison.role,
        "printed_in_source": target.as_printed,
        "source_quotes": ", ".join(target.quotes),
        "target_ratio": target.ratio,
        "target_provenance": target.provenance,
        "margins": margins.describe(target),
        "no_effect_margin": margins.no_effect,
        "band_low": band[0],
        "band_high": band[1],
        "no_worse_than": target.no_worse_than,
    }


@dataclass
class _Tested:
    setup: str
    comparison: Comparison
    treatment: pd.Series
    baseline: pd.Series
    stopped: list[str]
    pairs: tuple | None = None  # (treatment, baseline) values block by block, when every run is in a complete block
    blocked: bool = False  # decided per family: the blocked analysis is used
    pvalue: float = math.nan
    test: str = ""


def _block_pairs(treatment: pd.DataFrame, baseline: pd.DataFrame):
    """The two conditions' values paired by (bundle, block) (``stats.block_pairs``), or None: no blocks (an older
    bundle), or a block without one of them (a failed or left-out run)."""
    if "block" not in treatment or treatment["block"].isna().any() or baseline["block"].isna().any():
        return None
    return block_pairs(*(frame.set_index(["bundle", "block"])["value"] for frame in (treatment, baseline)))


def _not_testable(claim: str, setup: str, comparison: Comparison, *, reason: str, n_per_condition: str = "") -> Verdict:
    """A comparison that was measured on a setup and cannot be tested there, with why."""
    return Verdict(
        claim=claim,
        setup=setup,
        comparison=comparison.comparison,
        verdict="not testable here",
        n_per_condition=n_per_condition,
        reason=reason,
        **_target_columns(comparison),
    )


def verdicts(
    claim: str,
    comparisons: list[Comparison],
    runs: pd.DataFrame,
    *,
    alpha: float = 0.05,
    n_boot: int = 10_000,
    seed: int = 0,
    untestable: dict | None = None,
    left_out: pd.DataFrame | None = None,
) -> list[Verdict]:
    """One verdict per setup and comparison it measured; setups that measured none of a claim's comparisons get
    none (``claim_verdicts`` gives them their row). ``untestable``: {(setup, comparison words): reason} the claim
    knows before any test (they leave the family). ``left_out``: the runs the checks left out (``left_out_runs``);
    where a comparison lost runs to them and what is left cannot give a bounded CI, it is "not testable here" with
    how many runs were left out and why, never a verdict from the rest."""
    untestable = untestable or {}
    left_out = pd.DataFrame(columns=LEFT_OUT_COLUMNS) if left_out is None else left_out
    families: dict[str, list[_Tested]] = {}
    rows: list[Verdict] = []
    if "stopped" not in runs:
        runs = runs.assign(stopped="fixed run count (no stopping record)")
    if "kernel" not in runs:
        runs = runs.assign(kernel="")
    for setup in sorted(set(runs["host_id"]) | set(left_out["host_id"])):
        on_setup = runs[runs["host_id"] == setup]
        lost_here = left_out[left_out["host_id"] == setup]
        for comparison in comparisons:
            names = (comparison.treatment, comparison.baseline)
            picked = {name: _chosen(on_setup, comparison.metric, name, comparison.experiments) for name in names}
            lost = _of_experiments(lost_here[lost_here["condition"].isin(names)], comparison.experiments)
            had = {name: len(picked[name]) + int((lost["condition"] == name).sum()) for name in names}
            if any(frame.empty for frame in picked.values()):
                counts = " vs ".join(str(len(picked[name])) for name in names)
                ran = _of_experiments(on_setup[on_setup["condition"].isin(names)], comparison.experiments)
                if not (lost.empty or 0 in had.values()):
                    # every run of a condition was left out: the comparison was measured here, and cannot be tested
                    reason = (
                        f"{left_out_words(lost, sum(had.values()))}: no run of "
                        f"{' or '.join(n for n in names if picked[n].empty)} is left to compare"
                    )
                elif comparison.metric_needs and set(ran["condition"]) == set(names):
                    reason = (
                        f"its runs of {' and '.join(names)} record no {comparison.metric}: {comparison.metric_needs}"
                    )
                else:
                    continue  # left to the setups that measured both conditions
                rows.append(_not_testable(claim, setup, comparison, n_per_condition=counts, reason=reason))
                continue
            in_range = {
                name: frame[frame["kernel"].map(lambda k: kernel_in_range(k, comparison.kernels))]
                for name, frame in picked.items()
            }
            if any(frame.empty for frame in in_range.values()):
                releases = ", ".join(
                    sorted(set(picked[comparison.baseline]["kernel"]) | set(picked[comparison.treatment]["kernel"]))
                )
                rows.append(
                    _not_testable(
                        claim,
                        setup,
                        comparison,
                        reason=f"needs a kernel {comparison.kernels} ({comparison.kernels_why}); this setup ran "
                        f"{releases or 'an unrecorded kernel'}",
                    )
                )
                continue
            treatment, baseline = in_range[comparison.treatment], in_range[comparison.baseline]
            n = f"{len(treatment)} vs {len(baseline)}"
            one_thread = comparison.needs_concurrency and any(
                (frame.get("vcpu_threads", pd.Series(dtype=str)) == "single").any() for frame in (treatment, baseline)
            )
            why = untestable.get((setup, comparison.comparison))
            if one_thread:
                why = (
                    "this setup's vCPUs take turns in one host thread (QEMU TCG thread=single, as the machine "
                    f"declares), so no two run at once: {comparison.needs_concurrency}; left out of the "
                    "multiple-comparison family"
                )
            elif why:
                why = f"{why}; left out of the multiple-comparison family"
            elif not lost.empty and (
                len(treatment) < 2
                or len(baseline) < 2
                or rank_shift_rank(len(treatment), len(baseline), 1 - alpha)[0] == 0
            ):
                why = (
                    f"{left_out_words(lost, len(treatment) + len(baseline) + len(lost))}: the {n} runs "
                    f"left cannot give a bounded {1 - alpha:.0%} CI"
                )
            if why:
                rows.append(_not_testable(claim, setup, comparison, n_per_condition=n, reason=why))
                continue
            if len(treatment) < 2 or len(baseline) < 2:
                rows.append(
                    Verdict(
                        claim=claim,
                        setup=setup,
                        comparison=comparison.comparison,
                        verdict="inconclusive",
                        n_per_condition=n,
                        reason=f"too few runs: {n} measured; a CI needs at least 2 runs of each condition",
                        **_target_columns(comparison),
                    )
                )
                continue
            families.setdefault(setup, []).append(
                _Tested(
                    setup,
                    comparison,
                    treatment["value"],
                    baseline["value"],
                    [*treatment["stopped"], *baseline["stopped"]],
                    _block_pairs(treatment, baseline) if comparison.statistic == "median" else None,
                )
            )
    for tested in families.values():
        rows += _family_verdicts(claim, tested, alpha, n_boot, seed)
    order = {(c.comparison): i for i, c in enumerate(comparisons)}
    return sorted(rows, key=lambda row: (row.setup, order.get(row.comparison, len(order))))


def _test_key(item: _Tested) -> tuple:
    """What makes two comparisons of a family one test: the same statistic of the same runs (the same rows of the
    same metric as treatment and as baseline, with their values and blocks). Such comparisons differ only in their
    target (hrtick's "series" and "no regression" rows): the same p-value, blocking and CI."""
    pairs = None if item.pairs is None else tuple(tuple(side) for side in item.pairs)
    return (
        item.comparison.statistic,
        item.comparison.metric,
        tuple(item.treatment.index),
        tuple(item.treatment),
        tuple(item.baseline.index),
        tuple(item.baseline),
        pairs,
    )


def _family_verdicts(claim: str, tested: list[_Tested], alpha: float, n_boot: int, seed: int) -> list[Verdict]:
    """The verdicts of one family (a claim's tested comparisons on one setup): Holm p, simultaneous CIs. The family
    counts each distinct test once (``_test_key``): comparisons of the same data share one p-value in Holm's m and
    one CI in Bonferroni's, and each keeps its own row."""
    rows = []
    keys = [_test_key(item) for item in tested]
    distinct = list(dict.fromkeys(keys))
    m = len(distinct)
    confidence = 1 - alpha / m
    tests = f"{m} distinct test{'s' if m != 1 else ''}"
    level = simultaneous_level(confidence, alpha, m, f"this setup's {tests}")
    for item in tested:
        # blocks are used where the design has them and enough of them for a bounded CI at the family's level (a
        # choice made from the run count alone, never from the values)
        item.blocked = blocks_bound(item.pairs, confidence) and np.all(item.pairs[0] > 0) and np.all(item.pairs[1] > 0)
        if item.blocked:
            signed = wilcoxon_blocks(*item.pairs)
            item.pvalue, item.test = signed.pvalue, signed.test
        else:
            rank = mann_whitney(item.treatment, item.baseline)
            item.pvalue, item.test = rank.pvalue, rank.test
    first: dict[tuple, _Tested] = {}
    for key, item in zip(keys, tested, strict=True):
        first.setdefault(key, item)
    adjusted = dict(zip(distinct, holm([first[key].pvalue for key in distinct]), strict=True))
    for item, key in zip(tested, keys, strict=True):
        p = adjusted[key]
        comparison, target = item.comparison, item.comparison.target
        same = [
            other.comparison.comparison
            for other, other_key in zip(tested, keys, strict=True)
            if other_key == key and other is not item
        ]
        shared = f" (the same test as {'; '.join(same)}: counted once)" if same else ""
        ratio = (
            ratio_by_blocks(*item.pairs, confidence=confidence)
            if item.blocked
            else ratio_interval(
                item.treatment,
                item.baseline,
                statistic=comparison.statistic,
                confidence=confidence,
                n_boot=n_boot,
                seed=seed,
            )
        )
        verdict, reason = decide(target, ratio, float(p), comparison.margins, comparison.sizes_comparable)
        power_ratio = target.ratio or math.exp(target.direction * 2 * comparison.margins.no_effect_log())
        # a non-inferiority target is not a difference to detect: no detection power for it
        power = (
            None
            if target.no_worse_than is not None
            else _power(item, power_ratio, alpha / m, comparison.margins.power_goal, seed)
        )
        if verdict in ("inconclusive", "consistent, not pinned") and power is not None:
            reason += f"; {power.sentence()}" + (
                "" if target.ratio else f" (at ×{power_ratio:.3g}, twice the no-effect margin)"
            )
        reason += f"; {precision_note(ratio.low, ratio.high, comparison.margins.precision_log(target), item.stopped)}"
        rows.append(
            Verdict(
                claim=claim,
                setup=item.setup,
                comparison=comparison.comparison,
                verdict=verdict,
                reason=reason,
                fresh_effect=ratio.estimate,
                ci_low=ratio.low,
                ci_high=ratio.high,
                ci_level=level,
                p_holm=float(p),
                n_per_condition=f"{len(item.treatment)} vs {len(item.baseline)}",
                cliffs_delta=cliffs_delta(item.treatment, item.baseline),
                power_at_target=None if power is None else power.power,
                runs_needed=None if power is None or math.isinf(power.runs_needed) else power.runs_needed,
                test=(
                    f"{_ratio_words(comparison)} ({comparison.metric}), {ratio.method}, {level} CI; "
                    f"{item.test}, Holm over this setup's {tests}{shared}"
                    + ("" if power is None else f"; {power.method}")
                ),
                **_target_columns(comparison),
            )
        )
    return rows


def _ratio_words(comparison: Comparison) -> str:
    return "ratio" if comparison.statistic == "median" else f"ratio of {STATISTIC_NAMES[comparison.statistic]}"


def _power(item: _Tested, ratio: float, alpha: float, goal: float, seed: int):
    try:
        if item.blocked:
            return blocked_detection_power(*item.pairs, ratio, alpha=alpha, goal=goal, seed=seed)
        return detection_power(item.treatment, item.baseline, ratio, alpha=alpha, goal=goal, seed=seed)
    except ValueError:
        return None  # non-positive values: no log-scale noise model


def _why_summary(left_out: dict[str, list[tuple[str, str, str]]]) -> str:
    """The checks that left runs out, each with how many runs and its first observation: one clause a check."""
    counts: dict[str, list] = {}
    for found in left_out.values():
        for check, status, seen in found:
            counts.setdefault(check, [0, status, seen])[0] += 1
    return "; ".join(
        f"{check} {status} in {n} of {len(left_out)} runs (e.g. {seen})" for check, (n, status, seen) in counts.items()
    )


def _setup_reasons(
    claim: str,
    bundles: list[BundleRef],
    runs: pd.DataFrame,
    comparisons: list[Comparison],
    checks=(),
    gated: dict | None = None,
) -> dict[str, list[str]]:
    """Why each setup with bundles of this claim tested none of its comparisons."""
    wanted = sorted({name for c in comparisons for name in (c.treatment, c.baseline)})
    reasons: dict[str, list[str]] = {}
    gated = _gated(claim, checks, bundles) if gated is None else gated
    for ref in bundles:
        try:
            manifest = ref.load().manifest
        except BundleError as exc:
            reasons.setdefault(ref.host_id, []).append(f"{ref.path.name} does not load ({exc})")
            continue
        if manifest.not_testable:
            reasons.setdefault(ref.host_id, []).append(f"{manifest.experiment}: {manifest.not_testable}")
            continue
        measured = sorted(runs.loc[runs["bundle"] == str(ref.path), "condition"].unique())
        left_out = {run: why for (path, run), why in gated.items() if path == str(ref.path)}
        if left_out and not measured:
            reasons.setdefault(ref.host_id, []).append(
                f"{manifest.experiment}: {len(left_out)} of {len(manifest.measured_runs())} measured runs left out "
                f"by the checks of how the run ran and whether its condition took effect ({_why_summary(left_out)}; "
                "build/checks.csv)"
            )
            continue
        # only what is missing: for each comparison with a condition measured here, the other one
        partners = sorted(
            {
                other
                for c in comparisons
                for have, other in ((c.treatment, c.baseline), (c.baseline, c.treatment))
                if have in measured and other not in measured
            }
        )
        missing = (
            f"a comparison with it needs {', '.join(partners)} too"
            if partners
            else f"the comparisons need {', '.join(wanted)}"
        )
        reasons.setdefault(ref.host_id, []).append(
            f"{manifest.experiment} measured {', '.join(measured) or 'no usable runs'}; {missing}"
        )
    return reasons


def claim_verdicts(
    claim: str,
    comparisons: list[Comparison],
    bundles: list[BundleRef],
    data_dir,
    *,
    summary: str,
    checks=(),
    not_in_lab_because: str = "",
    alpha: float = 0.05,
    n_boot: int = 10_000,
    seed: int = 0,
    untestable=None,
) -> list[Verdict]:
    """Every verdict row of a claim: one per setup and comparison it measured, and one row for all the setups
    that tested nothing of it (each with its reason; ``not_in_lab_because`` says why lab guests have no bundle)."""
    gated = _gated(claim, checks, bundles)  # the checks read the runs' raw files: once
    runs, _ = measured_runs(bundles, checks, claim, gated=gated)
    left_out = untestable(runs, comparisons) if untestable and not runs.empty else {}
    lost = left_out_runs(bundles, gated)
    found = (
        verdicts(claim, comparisons, runs, alpha=alpha, n_boot=n_boot, seed=seed, untestable=left_out, left_out=lost)
        if not (runs.empty and lost.empty)
        else []
    )
    covered = {v.setup for v in found}
    reasons = {
        setup: why
        for setup, why in _setup_reasons(claim, bundles, runs, comparisons, checks, gated).items()
        if setup not in covered
    }
    for setup in all_setups(data_dir):
        if setup not in covered and setup not in reasons:
            reasons[setup] = [
                f"no {claim} bundle from this setup"
                + (f" ({not_in_lab_because})" if setup.startswith("guest-") and not_in_lab_because else "")
            ]
    printed = "; ".join(dict.fromkeys(c.target.as_printed for c in comparisons if c.role == "claim"))
    quotes = ", ".join(dict.fromkeys(q for c in comparisons for q in c.target.quotes))
    if not bundles and not reasons:
        reasons["none analysed"] = [
            f"no captured bundles for {claim} under {data_dir}: nothing measured to test the claim with"
        ]
    if reasons:
        found.append(
            Verdict(
                claim=claim,
                setup=", ".join(sorted(reasons)),
                comparison=summary,
                verdict="not testable here",
                printed_in_source=printed,
                source_quotes=quotes,
                reason=" | ".join(
                    f"{setup}: {'; '.join(dict.fromkeys(why))}" for setup, why in sorted(reasons.items())
                ),
            )
        )
    return found


CONTROL_COLUMNS = [
    "setup",
    "control",
    "fresh_effect",
    "ci_low",
    "ci_high",
    "p",
    "n_per_condition",
    "no_effect_margin",
    "outcome",
]


def negative_controls(
    controls: list[NegativeControl], runs: pd.DataFrame, *, alpha: float = 0.05, n_boot: int = 10_000, seed: int = 0
) -> pd.DataFrame:
    """Per setup and control the data holds: the ratio, its CI and p, and whether the control stayed still. The ratio
    and CI are the verdicts' (``stats.ratio_interval`` of medians: the Hodges-Lehmann ratio with the exact CI that
    inverts the Mann-Whitney test, at 1 − alpha: a control is not in a claim's family), the p the same test's."""
    rows = []
    for setup in sorted(runs["host_id"].unique()) if not runs.empty else []:
        on_setup = runs[runs["host_id"] == setup]
        for control in controls:
            treatment = _chosen(on_setup, control.metric, control.treatment, control.experiments)
            baseline = _chosen(on_setup, control.metric, control.baseline, control.experiments)
            if control.split_by_order:
                ordered = baseline.sort_values("run")
                half = len(ordered) // 2
                baseline, treatment = ordered.iloc[:half], ordered.iloc[half:]
            if len(treatment) < 2 or len(baseline) < 2:
                continue
            ratio = ratio_interval(
                treatment["value"], baseline["value"], confidence=1 - alpha, n_boot=n_boot, seed=seed
            )
            p = mann_whitney(treatment["value"], baseline["value"]).pvalue
            margin = math.log1p(control.no_effect)
            low, high = math.log(max(ratio.low, 1e-300)), math.log(max(ratio.high, 1e-300))
            if not (ratio.low > 0 and math.isfinite(ratio.high)):
                outcome = (
                    f"not tested: {len(treatment)} vs {len(baseline)} runs cannot give a bounded "
                    f"{1 - alpha:.0%} CI ({ratio.method})"
                )
            elif -margin <= low and high <= margin:
                outcome = f"passed: no effect shown (the CI lies within ±{control.no_effect:.0%})"
            elif p >= alpha and ratio.low <= 1 <= ratio.high:
                outcome = (
                    f"passed: no effect detected (CI contains 1), but not shown to be within ±{control.no_effect:.0%}"
                )
            else:
                outcome = "FAILED: the control moved; something other than the condition differs between its runs"
            rows.append(
                {
                    "setup": setup,
                    "control": control.comparison,
                    "fresh_effect": ratio.estimate,
                    "ci_low": ratio.low,
                    "ci_high": ratio.high,
                    "p": p,
                    "n_per_condition": f"{len(treatment)} vs {len(baseline)}",
                    "no_effect_margin": f"±{control.no_effect:.0%}",
                    "outcome": outcome,
                }
            )
    return pd.DataFrame(rows, columns=CONTROL_COLUMNS)
