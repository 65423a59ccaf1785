"""Operating characteristics of the verdict words (issue 31 item 6): P(word | truth) on synthetic runs of known truth.

Every replicate draws runs of two conditions and hands them to the project's own verdict path,
``ticklab.analysis.comparisons.verdicts`` (Mann-Whitney p, Holm over the family, the Bonferroni-simultaneous percentile
bootstrap CI of the ratio of medians with the report's 10,000 resamples and seed, power, then
``ticklab.analysis.verdicts.decide``), for the real comparisons and targets of the claims (from their
``comparisons()`` on traces/published). Nothing of the verdict is re-implemented here: the words are read back from
its rows.

- Truths: the treatment's median is the baseline's times exp(k × the target's log-effect), k = 1 (equal to the
  target), 0.5 (half), 0.4, 2, 0 (none) and -1 (opposite).
- Noise: log-normal with coefficient of variation 2%, 10%, 50% (sigma = sqrt(log(1 + CV^2)) on the log scale).
- n = 3, 5, 10, 20 runs per condition, in rounds of one run of each condition, each round in a seeded order (as a
  capture plans them: each round is a block, ticklab.capture.experiment.schedule).
- Drift: none, or a linear fall over the run order of --drift-sigmas (default 4) log-scale sigmas from the first
  run to the last, i.e. exp(-4 sigma x (position / (2n - 1) - 1/2)). 4 sigma gives a Spearman rho between run
  order and value of about -0.78 at n = 10 to 20 (-0.80 at n = 5): the pvspinlock build times of issue 31
  (rho = -0.77). 2 sigma would give about -0.5.
- Family: --family 1 (default) tests the comparison alone (Holm and Bonferroni over m = 1), the least conservative
  family and so the hardest case for the error rates. --family m adds m - 1 companion comparisons with no effect at
  the same noise on the same setup (the verdict's family: one claim on one setup), so the comparison's CI is at
  1 - 0.05/m (the bundled data gives m = 3 or 4 for nohz and 4 for hrtick's guest).

Writes <out>/characteristics.csv (one row per comparison, drift, CV, n, truth and word), <out>/acceptance.csv
(one row per acceptance check and cell) and <out>/characteristics.md (both tables), and prints the acceptance
checks of the issue, PASS when the rate is at most 5%:

    .venv/bin/python benchmarks/verdict_characteristics.py [--replicates 400 | --quick] [--out DIR] [--family M]

Seeded (numpy Generator per cell, from --seed and the cell's parameters), so a cell's result does not depend on
which other cells run.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
import zlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats
from tqdm import tqdm

from ticklab.analysis.comparisons import Comparison, verdicts
from ticklab.analysis.stats import log_half_width
from ticklab.analysis.verdicts import Verdict
from ticklab.claims import get_claim
from ticklab.paths import published_dir

ALPHA = 0.05  # the report's
N_BOOT = 10_000  # the report's bootstrap resamples
BOOT_SEED = 0  # the report's bootstrap seed
LIMIT = 0.05  # the acceptance: each word at most 5% of the time under its truth
SETUP = "simulated"

# The comparisons whose real targets are tested: key -> (claim, comparison name in the claim's comparisons()).
COMPARISONS = {
    "nohz-full-ftq": ("nohz", "nohz_full vs HZ=1000: FTQ work per quantum"),  # ×1.087
    "hz250-ftq": ("nohz", "HZ=250 vs HZ=1000: FTQ work per quantum"),  # ×1.065
    "hz250-timer-share": ("nohz", "HZ=250 vs HZ=1000: busy CPU's time in the timer interrupt (trace)"),  # ×0.25
    "hrtick-series": ("hrtick", "series: HRTICK on vs off on 7.2, hackbench -p -s 8 runtime"),  # ×0.573
}
# the truth's log-effect as a multiple of the target's
TRUTHS = {"equal": 1.0, "half": 0.5, "0.4x": 0.4, "double": 2.0, "none": 0.0, "opposite": -1.0}
CVS = (0.02, 0.10, 0.50)
RUNS = (3, 5, 10, 20)
DRIFT_SIGMAS = 4.0


@dataclass(frozen=True)
class Word:
    verdict: str
    reason_has: str  # what the reason says that tells this word from the verdict's others ("": any)
    categories: frozenset[str]  # which acceptance categories the word falls in


def _word(verdict: str, reason_has: str, *categories: str) -> Word:
    return Word(verdict, reason_has, frozenset(categories))


# Every word and sub-reason the verdict path can return (ticklab.analysis.verdicts.decide and _no_worse,
# ticklab.analysis.comparisons.verdicts), and the acceptance categories it falls in:
#   "size inconsistent": the word asserts the effect's size is not the target's;
#   "reproduced": the word says reproduced; "no effect": the word says there is no effect;
#   "same side": the word asserts an effect on the source's side (of whatever size).
WORDS = {
    # the whole CI on the source's side of no change and inside the consistent-size band
    "reproduced": _word("reproduced", "inside the consistent sizes", "reproduced", "same side"),
    # the whole CI on the source's side, for a target that states a direction only
    "reproduced: direction target": _word("reproduced", "which is all the source states", "reproduced", "same side"),
    # on the source's side, reaching into the band without lying wholly inside it
    "consistent, not pinned": _word("consistent, not pinned", "", "same side"),
    # the whole CI short of the band, and of no change too / or holding no change
    "smaller: effect shown": _word(
        "smaller than the target", "an effect in the source's direction", "size inconsistent", "same side"
    ),
    "smaller: no change not excluded": _word(
        "smaller than the target", "no change is not excluded", "size inconsistent"
    ),
    # the whole CI short of the band, clear of no change but reaching into the declared no-effect margin
    "smaller: within the no-effect margin": _word(
        "smaller than the target", "reaches into the declared no-effect margin", "size inconsistent"
    ),
    # the whole CI short of the band with the estimate at or past no change
    "target excluded": _word("target excluded", "", "size inconsistent"),
    # the whole CI beyond the band
    "larger than the target": _word("larger than the target", "", "size inconsistent", "same side"),
    # the whole CI on the other side of no change
    "opposite effect": _word("opposite effect", "the other side of no change", "size inconsistent"),
    # the whole CI inside the declared no-effect margin
    "no effect shown": _word("no effect shown", "", "size inconsistent", "no effect"),
    # the CI holds no change and the target (or the direction)
    "inconclusive": _word("inconclusive", "the CI holds no change and sizes"),
    "inconclusive: direction target": _word("inconclusive", "the CI holds no change and the source's direction"),
    # a direction target: the CI clears no change but not the declared no-effect margin
    "inconclusive: direction within the margin": _word("inconclusive", "excludes no change but reaches into"),
    # comparisons.verdicts: fewer than 2 runs of a condition (never here: n >= 3)
    "inconclusive: too few runs": _word("inconclusive", "too few runs"),
    # comparisons.verdicts: outside the comparison's kernel range (never here: the synthetic runs have no kernel)
    "not testable here": _word("not testable here", ""),
    # _no_worse, a non-inferiority target (none of the comparisons here has one)
    "reproduced: no worse": _word("reproduced", "no worse:", "reproduced"),
    "opposite effect: worse": _word("opposite effect", "worse: the whole CI lies past", "size inconsistent"),
    "inconclusive: no worse?": _word("inconclusive", "cannot tell whether it is no worse"),
}


@dataclass(frozen=True)
class Check:
    key: str
    says: str
    category: str
    truths: tuple[str, ...]


# The acceptance of issue 31, at every n and CV: the category's rate under each of these truths is at most LIMIT.
CHECKS = (
    Check("size", "a size-inconsistent word when the truth equals the target", "size inconsistent", ("equal",)),
    Check(
        "reproduced",
        "'reproduced' when the truth is half the target's log-effect or less",
        "reproduced",
        ("half", "0.4x", "none", "opposite"),
    ),
    Check(
        "no-effect",
        "'no effect' when the truth is 0.4x the target's log-effect or more",
        "no effect",
        ("0.4x", "half", "equal", "double"),
    ),
    Check("same-side", "'reproduced' or a same-side word when there is no effect", "same side", ("none",)),
)


def word_of(row: Verdict) -> str:
    """The WORDS key of a verdict row; a word or reason this harness does not know is an error, not a guess."""
    found = [key for key, word in WORDS.items() if row.verdict == word.verdict and word.reason_has in row.reason]
    if len(found) != 1:
        raise ValueError(
            f"verdict {row.verdict!r} with reason {row.reason[:80]!r} matches {found or 'no word'} "
            "of WORDS: update the mapping"
        )
    return found[0]


def sigma_of(cv: float) -> float:
    """The log-scale standard deviation of a log-normal with this coefficient of variation."""
    return math.sqrt(math.log1p(cv**2))


@dataclass(frozen=True)
class Samples:
    treatment: np.ndarray
    baseline: np.ndarray
    treatment_order: np.ndarray  # each run's position in the run order (0 first)
    baseline_order: np.ndarray


def synthetic_runs(rng: np.random.Generator, n: int, cv: float, ratio: float, drift_sigmas: float = 0.0) -> Samples:
    """n rounds of one run per condition in a seeded order; log-normal noise of this CV around medians 1 (baseline)
    and ``ratio`` (treatment); with ``drift_sigmas``, a linear fall of that many sigmas over the run order."""
    sigma = sigma_of(cv)
    treatment_first = rng.random(n) < 0.5
    treatment_order = 2 * np.arange(n) + np.where(treatment_first, 0, 1)
    baseline_order = 2 * np.arange(n) + np.where(treatment_first, 1, 0)

    def drift(order):
        return -drift_sigmas * sigma * (order / (2 * n - 1) - 0.5)

    treatment = np.exp(math.log(ratio) + sigma * rng.standard_normal(n) + drift(treatment_order))
    baseline = np.exp(sigma * rng.standard_normal(n) + drift(baseline_order))
    return Samples(treatment, baseline, treatment_order, baseline_order)


def runs_table(comparison: Comparison, samples: Samples, setup: str, blocks: bool = False) -> pd.DataFrame:
    """The runs as comparisons.measured_runs gives them to the verdict: one row per run and metric; with ``blocks``,
    each run's block (its round)."""
    n = samples.treatment.size
    order = np.concatenate([samples.treatment_order, samples.baseline_order])
    table = pd.DataFrame(
        {
            "host_id": setup,
            "bundle": f"synthetic/{setup}",
            "experiment": "synthetic",
            "stopped": "synthetic: fixed run count",
            "kernel": "",
            "run": [f"run-{i + 1:03d}" for i in order],
            "condition": [comparison.treatment] * n + [comparison.baseline] * n,
            "metric": comparison.metric,
            "value": np.concatenate([samples.treatment, samples.baseline]),
            "unit": "",
        }
    )
    if blocks:
        table["block"] = pd.array(order // 2 + 1, dtype="Int64")
    return table


def load_comparisons(keys=tuple(COMPARISONS), published=None) -> dict[str, tuple[str, Comparison]]:
    """key -> (claim, Comparison) with the real target and margins; the experiments and kernel range are dropped
    (they choose which bundles' runs count, never how runs are judged; the synthetic runs have neither)."""
    found = {}
    for key in keys:
        claim_id, name = COMPARISONS[key]
        claim = get_claim(claim_id)
        by_name = {c.comparison: c for c in claim.comparisons(claim.published(published or published_dir()))}
        found[key] = claim_id, dataclasses.replace(by_name[name], experiments=(), kernels="")
    return found


def truth_ratio(comparison: Comparison, truth: str) -> float:
    return math.exp(TRUTHS[truth] * math.log(comparison.target.ratio))


def companions(comparison: Comparison, family: int) -> list[Comparison]:
    """``family - 1`` more comparisons of the claim on the same setup (the verdict's family), each with conditions of
    its own."""
    return [
        dataclasses.replace(
            comparison,
            comparison=f"companion {i}",
            treatment=f"companion-{i} treatment",
            baseline=f"companion-{i} baseline",
        )
        for i in range(1, family)
    ]


def one_verdict(
    claim: str,
    comparison: Comparison,
    rng: np.random.Generator,
    n: int,
    cv: float,
    ratio: float,
    drift_sigmas: float,
    family: int = 1,
    n_boot: int = N_BOOT,
    samples: Samples | None = None,
    blocks: bool = False,
) -> Verdict:
    """The verdict row of one synthetic capture (``samples``, or drawn here), with ``family - 1`` no-effect companion
    comparisons on its setup; ``blocks``: the runs carry their blocks."""
    others = companions(comparison, family)
    samples = samples if samples is not None else synthetic_runs(rng, n, cv, ratio, drift_sigmas)
    tables = [runs_table(comparison, samples, SETUP, blocks)]
    tables += [runs_table(other, synthetic_runs(rng, n, cv, 1.0, drift_sigmas), SETUP, blocks) for other in others]
    rows = verdicts(
        claim, [comparison, *others], pd.concat(tables, ignore_index=True), alpha=ALPHA, n_boot=n_boot, seed=BOOT_SEED
    )
    return next(row for row in rows if row.comparison == comparison.comparison)


def cell_rng(seed: int, *parts) -> np.random.Generator:
    """A cell's own generator: from the seed and the cell's parameters, not from the cells that ran before it."""
    return np.random.default_rng([seed, zlib.crc32("|".join(map(str, parts)).encode())])


# The analyses compared (issue 31 item 5), both through the verdict path: "independent" hands it the runs without
# their blocks (the two conditions' runs as independent samples, as for bundles planned before blocks), "blocks" with
# them (each round is a block of one run of each condition, as captures now plan their runs), so the verdict pairs
# each block's runs and takes the exact signed-rank CI of the per-block ratios where the blocks are enough for a
# bounded CI at the family's level, and the independent CI otherwise.
ANALYSES = ("independent", "blocks")


def word_counts(
    claim: str,
    key: str,
    comparison: Comparison,
    truth: str,
    cv: float,
    n: int,
    drift_sigmas: float,
    replicates: int,
    *,
    seed: int = 0,
    family: int = 1,
    n_boot: int = N_BOOT,
    analyses=ANALYSES,
) -> tuple[dict[str, Counter], dict[str, list[float]]]:
    """How often each word comes out of ``replicates`` synthetic captures of one cell, per analysis, and each
    replicate's CI half-width on the log scale (inf: unbounded). Both analyses see the same runs."""
    rng = cell_rng(seed, key, truth, cv, n, drift_sigmas, family)
    ratio = truth_ratio(comparison, truth)
    counts = {analysis: Counter() for analysis in analyses}
    widths = {analysis: [] for analysis in analyses}
    for _ in range(replicates):
        samples = synthetic_runs(rng, n, cv, ratio, drift_sigmas)
        # the companions of both analyses come from one generator state, so they see the same runs too
        state = rng.bit_generator.state
        rows = {}
        for analysis in analyses:
            rng.bit_generator.state = state
            rows[analysis] = one_verdict(
                claim,
                comparison,
                rng,
                n,
                cv,
                ratio,
                drift_sigmas,
                family,
                n_boot,
                samples=samples,
                blocks=analysis == "blocks",
            )
        for analysis, row in rows.items():
            counts[analysis][word_of(row)] += 1
            widths[analysis].append(log_half_width(row.ci_low, row.ci_high))
    return counts, widths


def drift_label(drift_sigmas: float) -> str:
    return "none" if drift_sigmas == 0 else f"linear {drift_sigmas:g} sigma"


def characteristics(
    comparisons: dict,
    truths,
    cvs,
    runs,
    drifts,
    replicates: int,
    *,
    seed: int = 0,
    family: int = 1,
    n_boot: int = N_BOOT,
    progress: bool = False,
    analyses=ANALYSES,
) -> pd.DataFrame:
    """One row per analysis, comparison, drift, CV, n, truth and word: its count and rate over the replicates, and
    the cell's median CI half-width on the log scale."""
    cells = [
        (key, drift, cv, n, truth)
        for key in comparisons
        for drift in drifts
        for cv in cvs
        for n in runs
        for truth in truths
    ]
    rows = []
    with tqdm(total=len(cells) * replicates, unit="capture", disable=not progress, file=sys.stderr) as bar:
        for key, drift, cv, n, truth in cells:
            claim, comparison = comparisons[key]
            bar.set_postfix_str(f"{key} {drift_label(drift)} CV {cv:.0%} n={n} {truth}")
            counts, widths = word_counts(
                claim,
                key,
                comparison,
                truth,
                cv,
                n,
                drift,
                replicates,
                seed=seed,
                family=family,
                n_boot=n_boot,
                analyses=analyses,
            )
            bar.update(replicates)
            for analysis in analyses:
                width = float(np.median(widths[analysis]))
                for word in WORDS:
                    rows.append(
                        {
                            "analysis": analysis,
                            "comparison": key,
                            "target": comparison.target.ratio,
                            "family": family,
                            "drift": drift_label(drift),
                            "cv": cv,
                            "n": n,
                            "truth": truth,
                            "truth_ratio": truth_ratio(comparison, truth),
                            "word": word,
                            "count": counts[analysis][word],
                            "replicates": replicates,
                            "rate": counts[analysis][word] / replicates,
                            "median_ci_log_half_width": width,
                        }
                    )
    return pd.DataFrame(rows)


def acceptance(table: pd.DataFrame) -> pd.DataFrame:
    """One row per analysis, check, comparison, drift, CV, n and truth: the category's rate, its Clopper-Pearson 95%
    CI and PASS (rate <= LIMIT) or FAIL."""
    rows = []
    cells = ["analysis", "comparison", "drift", "cv", "n", "truth"]
    for check in CHECKS:
        words = [key for key, word in WORDS.items() if check.category in word.categories]
        chosen = table[table["truth"].isin(check.truths) & table["word"].isin(words)]
        for cell, group in chosen.groupby(cells, sort=False):
            hits, replicates = int(group["count"].sum()), int(group["replicates"].iloc[0])
            ci = stats.binomtest(hits, replicates).proportion_ci()
            rows.append(
                {
                    "check": check.key,
                    **dict(zip(cells, cell, strict=True)),
                    "hits": hits,
                    "replicates": replicates,
                    "rate": hits / replicates,
                    "ci_low": ci.low,
                    "ci_high": ci.high,
                    "result": "PASS" if hits / replicates <= LIMIT else "FAIL",
                }
            )
    return pd.DataFrame(rows)


def acceptance_grid(accepted: pd.DataFrame) -> pd.DataFrame:
    """Per analysis, check, comparison, drift and CV (rows) and n (columns): PASS/FAIL with the worst truth's hits."""
    rows = []
    keys = ["analysis", "check", "comparison", "drift", "cv"]
    for (analysis, check, key, drift, cv), group in accepted.groupby(keys, sort=False):
        row = {"analysis": analysis, "check": check, "comparison": key, "drift": drift, "CV": f"{cv:.0%}"}
        for n, at_n in group.groupby("n", sort=False):
            worst = at_n.loc[at_n["rate"].idxmax()]
            which = f" {worst['truth']}" if at_n["truth"].nunique() > 1 and worst["hits"] else ""
            row[f"n={n}"] = f"{worst['result']} {worst['hits']}/{worst['replicates']}{which}"
        rows.append(row)
    return pd.DataFrame(rows)


def summary_lines(accepted: pd.DataFrame) -> list[str]:
    lines = []
    for analysis in dict.fromkeys(accepted["analysis"]):
        for check in CHECKS:
            mine = accepted[(accepted["check"] == check.key) & (accepted["analysis"] == analysis)]
            if mine.empty:
                continue  # none of its truths ran
            cells = mine.groupby(["comparison", "drift", "cv", "n"])["result"].apply(lambda r: (r == "FAIL").any())
            worst = mine.loc[mine["rate"].idxmax()]
            where = (
                (
                    f" ({worst['comparison']}, drift {worst['drift']}, CV {worst['cv']:.0%}, n={worst['n']}, truth "
                    f"{worst['truth']})"
                )
                if worst["hits"]
                else ""
            )
            lines.append(
                f"{analysis}: {check.key}: {check.says} <= {LIMIT:.0%}: {int(cells.sum())} of {cells.size} "
                f"cells FAIL; worst {worst['hits']}/{worst['replicates']}{where}"
            )
    return lines


def widths_table(table: pd.DataFrame) -> pd.DataFrame:
    """Median CI half-width (log scale) per comparison, drift, CV and n, one column per analysis (truth: equal, or
    the first truth that ran)."""
    truth = "equal" if (table["truth"] == "equal").any() else table["truth"].iloc[0]
    chosen = table[(table["truth"] == truth)].drop_duplicates(["analysis", "comparison", "drift", "cv", "n"])
    wide = chosen.pivot_table(
        index=["comparison", "drift", "cv", "n"], columns="analysis", values="median_ci_log_half_width", sort=False
    ).reset_index()
    wide["cv"] = wide["cv"].map(lambda cv: f"{cv:.0%}")
    return wide.round(4)


def markdown(table: pd.DataFrame, accepted: pd.DataFrame, comparisons: dict, header: str) -> str:
    seen = [word for word in WORDS if table.loc[table["word"] == word, "count"].sum() > 0]
    parts = [
        f"# Operating characteristics of the verdict words\n\n{header}\n",
        "## Acceptance (issue 31)\n",
        *[f"- {line}" for line in summary_lines(accepted)],
        "",
        "Each cell: the worst truth of the check, hits/replicates.\n",
        acceptance_grid(accepted).to_markdown(index=False),
        "",
        "## Median CI half-width on the log scale (inf: no bounded CI at that n)\n",
        widths_table(table).to_markdown(index=False),
        "",
    ]
    for analysis in dict.fromkeys(table["analysis"]):
        for key, (claim, comparison) in comparisons.items():
            mine = table[(table["analysis"] == analysis) & (table["comparison"] == key) & table["word"].isin(seen)]
            if mine.empty:
                continue
            wide = mine.pivot_table(
                index=["drift", "cv", "n", "truth", "truth_ratio"], columns="word", values="rate", sort=False
            )
            wide = (wide[[w for w in seen if w in wide.columns]] * 100).round(2).reset_index()
            wide["cv"] = wide["cv"].map(lambda cv: f"{cv:.0%}")
            wide["truth_ratio"] = wide["truth_ratio"].map(lambda r: f"×{r:.4g}")
            parts += [
                f"## {analysis}: {key}: P(word | truth), % of replicates\n",
                f"{claim}: {comparison.comparison}; target ×{comparison.target.ratio:.4g}; "
                f"{comparison.margins.describe(comparison.target)}\n",
                wide.to_markdown(index=False),
                "",
            ]
    return "\n".join(parts) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicates", type=int, default=400, help="synthetic captures per cell (default 400)")
    parser.add_argument("--quick", action="store_true", help="40 replicates per cell")
    parser.add_argument(
        "--out", type=Path, default=Path("bench-out/verdict-characteristics")
    )  # not build/: the report owns it
    parser.add_argument("--comparison", nargs="+", choices=list(COMPARISONS), default=list(COMPARISONS))
    parser.add_argument("--truth", nargs="+", choices=list(TRUTHS), default=list(TRUTHS))
    parser.add_argument("--cv", nargs="+", type=float, default=list(CVS), help="coefficients of variation (0.1 = 10%%)")
    parser.add_argument("--runs", nargs="+", type=int, default=list(RUNS), help="runs per condition")
    parser.add_argument(
        "--drift-sigmas",
        type=float,
        default=DRIFT_SIGMAS,
        help="total linear drift over the run order, in log-scale sigmas (0: no drifting scenario)",
    )
    parser.add_argument("--family", type=int, default=1, help="Holm/Bonferroni family size m (default 1)")
    parser.add_argument("--n-boot", type=int, default=N_BOOT, help="bootstrap resamples (default: the report's)")
    parser.add_argument(
        "--analysis",
        nargs="+",
        choices=list(ANALYSES),
        default=list(ANALYSES),
        help="independent: the runs without their blocks; blocks: with them (the verdict pairs them)",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.family < 1 or min(args.runs) < 2 or args.replicates < 1 or min(args.cv) <= 0:
        parser.error("--family and --replicates are at least 1, --runs at least 2, --cv above 0")
    replicates = 40 if args.quick else args.replicates
    drifts = [0.0] + ([args.drift_sigmas] if args.drift_sigmas else [])
    comparisons = load_comparisons(args.comparison)
    started = time.monotonic()
    table = characteristics(
        comparisons,
        args.truth,
        args.cv,
        args.runs,
        drifts,
        replicates,
        seed=args.seed,
        family=args.family,
        n_boot=args.n_boot,
        progress=sys.stderr.isatty(),
        analyses=tuple(args.analysis),
    )
    accepted = acceptance(table)
    header = (
        f"{replicates} replicates per cell, seed {args.seed}, family m = {args.family}, {args.n_boot} bootstrap "
        f"resamples; drift: none or a linear fall of {args.drift_sigmas:g} log-scale sigmas over the run order; "
        f"verdict path ticklab.analysis.comparisons.verdicts at alpha {ALPHA} without blocks (independent) "
        "and with them (blocks)"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "characteristics.csv", index=False)
    accepted.to_csv(args.out / "acceptance.csv", index=False)
    (args.out / "characteristics.md").write_text(markdown(table, accepted, comparisons, header))
    print(header)
    if not accepted.empty:
        print(acceptance_grid(accepted).to_string(index=False))
        print("\n".join(summary_lines(accepted)))
    print(
        f"wrote {args.out}/characteristics.csv, acceptance.csv, characteristics.md ({time.monotonic() - started:.0f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
