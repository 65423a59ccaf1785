"""Statistics for comparing conditions: effect sizes with CIs, rank tests, multiple-comparison
correction, and an mmtests-style compare table. Every function takes plain sequences of numbers
(one value per run) and is deterministic given its seed."""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from .lazy import stats

COMPARE_STATISTICS = ("Min", "Max", "Median", "AMean", "Stddev", "CoefVar")

PCT_DIFF_CONVENTION = (
    "% = (condition − baseline) / baseline × 100 (mmtests' pdiff): positive means the condition's "
    "value is larger; whether larger is better depends on the metric"
)


@dataclass(frozen=True)
class Interval:
    estimate: float
    low: float
    high: float
    confidence: float
    method: str

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2


def _sample(values: Sequence[float], name: str, minimum: int = 1) -> np.ndarray:
    array = np.asarray(values, dtype=float)
    if array.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D sequence of numbers, got shape {array.shape}")
    if array.size < minimum:
        raise ValueError(f"{name}: needs at least {minimum} value(s), got {array.size}")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name}: contains NaN or infinite values")
    return array


# Statistics a comparison can take the ratio of, one value per run; each takes an ``axis`` (vectorised bootstrap).
STATISTICS = {
    "median": lambda x, axis=-1: np.median(x, axis=axis),
    # The lower tail: the runs that collapse (seed 003) move it long before they move the median.
    "p10": lambda x, axis=-1: np.quantile(x, 0.10, axis=axis),
}
STATISTIC_NAMES = {"median": "medians", "p10": "10th percentiles"}


def ratio_of_statistic(
    treatment: Sequence[float],
    baseline: Sequence[float],
    *,
    statistic: str = "median",
    confidence: float = 0.95,
    n_boot: int = 10_000,
    seed: int = 0,
) -> Interval:
    """statistic(treatment) / statistic(baseline) with a seeded percentile bootstrap CI (independent samples).

    Percentile, not BCa: BCa's acceleration comes from a jackknife, which is unreliable for medians and
    quantiles (the jackknife of a median takes only two or three distinct values)."""
    if statistic not in STATISTICS:
        raise ValueError(f"statistic {statistic!r} is not one of {', '.join(STATISTICS)}")
    of = STATISTICS[statistic]
    t = _sample(treatment, "treatment", 2)
    b = _sample(baseline, "baseline", 2)
    if of(b) == 0:
        raise ValueError(f"baseline: {statistic} is 0, a ratio is undefined")
    estimate = float(of(t) / of(b))
    label = f"percentile bootstrap, {n_boot} resamples, seed {seed}"
    if np.ptp(t) == 0 and np.ptp(b) == 0:
        return Interval(estimate, estimate, estimate, confidence, "degenerate: both samples constant")
    rng = np.random.default_rng(seed)
    resampled_t = t[rng.integers(0, t.size, size=(n_boot, t.size))]
    resampled_b = b[rng.integers(0, b.size, size=(n_boot, b.size))]
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = of(resampled_t, axis=1) / of(resampled_b, axis=1)
    ratios = ratios[np.isfinite(ratios)]
    if ratios.size < n_boot / 2:
        raise ValueError(f"baseline: {statistic} is 0 in most resamples, a ratio is undefined")
    low, high = np.quantile(ratios, [(1 - confidence) / 2, (1 + confidence) / 2])
    return Interval(estimate, float(low), float(high), confidence, label)


@functools.lru_cache(maxsize=256)
def rank_sum_null(n1: int, n2: int) -> tuple[int, ...]:
    """How many of the C(n1 + n2, n1) equally likely orderings of two untied samples give each value 0 .. n1 × n2 of
    the Mann-Whitney U statistic: the coefficients of the Gaussian binomial [n1 + n2 choose n1]_q, exact integers."""
    counts = [1] + [0] * (n1 * n2)
    for i in range(1, n1 + 1):
        for k in range(len(counts) - 1, n2 + i - 1, -1):  # × (1 − q^(n2 + i))
            counts[k] -= counts[k - n2 - i]
        for k in range(i, len(counts)):  # ÷ (1 − q^i)
            counts[k] += counts[k - i]
    return tuple(counts)


def rank_shift_rank(n1: int, n2: int, confidence: float) -> tuple[int, float]:
    """k, coverage: [D(k), D(n1·n2 + 1 − k)] of the sorted pairwise differences is the exact distribution-free CI
    for a shift at ``confidence`` or more (k = 0: no bounded interval reaches it), with its exact coverage."""
    return _exact_rank(rank_sum_null(n1, n2), math.comb(n1 + n2, n1), confidence)


def _exact_rank(counts: Sequence[int], total: int, confidence: float) -> tuple[int, float]:
    """The largest k whose two tails (statistic below k, either side) hold at most 1 − confidence of the ``total``
    equally likely outcomes ``counts`` spreads over, and the exact coverage that leaves."""
    tail, k = 0, 0
    while k < len(counts) and 2 * (tail + counts[k]) <= (1 - confidence) * total:
        tail += counts[k]
        k += 1
    return k, 1 - 2 * tail / total


def _order_interval(
    ordered: np.ndarray, k: int, coverage: float, confidence: float, method: str, label: str, too_few: str
) -> Interval:
    """exp of the median of ``ordered`` (sorted log values: pairwise differences or Walsh averages), with
    [ordered(k), ordered(N + 1 − k)] as the CI; (0, ∞) when k = 0."""
    estimate = float(np.exp(np.median(ordered)))
    if k == 0:
        return Interval(
            estimate, 0.0, math.inf, confidence, f"{method}: {too_few} cannot give {confidence:.4g} coverage"
        )
    return Interval(
        estimate,
        float(np.exp(ordered[k - 1])),
        float(np.exp(ordered[ordered.size - k])),
        confidence,
        f"{method}, {label}({k})..{label}({ordered.size + 1 - k}), exact coverage {coverage:.4f}",
    )


def ratio_by_ranks(treatment: Sequence[float], baseline: Sequence[float], *, confidence: float = 0.95) -> Interval:
    """The Hodges-Lehmann ratio, the median of all n1 × n2 treatment/baseline run ratios, with the exact
    distribution-free CI that inverts the two-sided Mann-Whitney test (Bauer 1972) on the log values.

    Under a shift of the log values the CI covers the true ratio with at least ``confidence`` at any run count,
    for any distribution; a run count too small for that (3 vs 3 at 95%: the test's smallest p is 0.1) gives the
    unbounded interval (0, ∞), which no verdict can rest on. Ties make it slightly conservative."""
    t = np.log(_positive(treatment, "treatment"))
    b = np.log(_positive(baseline, "baseline"))
    differences = np.sort((t[:, None] - b[None, :]).ravel())
    k, coverage = rank_shift_rank(t.size, b.size, confidence)
    return _order_interval(
        differences,
        k,
        coverage,
        confidence,
        f"Hodges-Lehmann ratio (median of the {t.size}×{b.size} run ratios), exact Mann-Whitney inversion CI",
        "D",
        f"{t.size} vs {b.size} runs",
    )


@functools.lru_cache(maxsize=256)
def signed_rank_null(n: int) -> tuple[int, ...]:
    """How many of the 2^n sign patterns give each Wilcoxon signed-rank sum 0 .. n(n+1)/2 (no ties, no zeros)."""
    counts = [1] + [0] * (n * (n + 1) // 2)
    for i in range(1, n + 1):
        for k in range(len(counts) - 1, i - 1, -1):
            counts[k] += counts[k - i]
    return tuple(counts)


def signed_rank_rank(n: int, confidence: float) -> tuple[int, float]:
    """k, coverage: [W(k), W(N + 1 − k)] of the N = n(n+1)/2 sorted Walsh averages is the exact signed-rank CI for
    a centre of symmetry at ``confidence`` or more (k = 0: no bounded interval reaches it)."""
    return _exact_rank(signed_rank_null(n), 2**n, confidence)


def smallest_bounded_n(rank: Callable[[int, float], tuple[int, float]], confidence: float) -> int:
    """The fewest runs per condition (``rank_shift_rank`` with equal groups) or blocks (``signed_rank_rank``) whose
    exact CI at ``confidence`` is bounded."""
    n = 2
    while rank(n, confidence)[0] == 0:
        n += 1
    return n


def block_pairs(treatment: pd.Series, baseline: pd.Series) -> tuple[np.ndarray, np.ndarray] | None:
    """Two conditions' values, each indexed by its run's block (the caller has left out runs with none), paired block
    by block; None when a block does not hold exactly one run of each (then the runs are compared as independent
    samples)."""
    sides = (treatment, baseline)
    if any(side.index.has_duplicates for side in sides) or set(treatment.index) != set(baseline.index):
        return None
    order = sorted(treatment.index)
    return treatment.loc[order].to_numpy(), baseline.loc[order].to_numpy()


def blocks_bound(pairs, confidence: float) -> bool:
    """Whether block ``pairs`` (or None) are enough for a bounded signed-rank CI at ``confidence``: where they are,
    the verdict and the stopping rule pair the runs by block."""
    return pairs is not None and signed_rank_rank(len(pairs[0]), confidence)[0] > 0


def ratio_by_blocks(treatment: Sequence[float], baseline: Sequence[float], *, confidence: float = 0.95) -> Interval:
    """The blocked analysis: ``treatment[i]`` and ``baseline[i]`` ran in the same block (a round of one run of every
    condition, in a random order). The ratio is the Hodges-Lehmann centre of the per-block log ratios (the median of
    their Walsh averages), with the exact Wilcoxon signed-rank CI: drift between blocks cancels. Too few blocks for
    ``confidence`` give the unbounded (0, ∞)."""
    t = np.log(_positive(treatment, "treatment"))
    b = np.log(_positive(baseline, "baseline"))
    if t.size != b.size:
        raise ValueError(
            f"blocks: {t.size} treatment runs against {b.size} baseline runs; each block holds one of each"
        )
    d = t - b
    i, j = np.triu_indices(d.size)
    walsh = np.sort((d[i] + d[j]) / 2)
    k, coverage = signed_rank_rank(d.size, confidence)
    return _order_interval(
        walsh,
        k,
        coverage,
        confidence,
        f"Hodges-Lehmann ratio of {d.size} blocks (median of the Walsh averages of per-block ratios), "
        "exact signed-rank CI",
        "W",
        f"{d.size} blocks",
    )


def _positive(values: Sequence[float], name: str) -> np.ndarray:
    array = _sample(values, name, 2)
    if np.any(array <= 0):
        raise ValueError(f"{name}: a ratio by ranks needs positive values (it compares logs)")
    return array


def ratio_interval(
    treatment: Sequence[float],
    baseline: Sequence[float],
    *,
    statistic: str = "median",
    confidence: float = 0.95,
    n_boot: int = 10_000,
    seed: int = 0,
) -> Interval:
    """The ratio and CI a verdict rests on: for the median, :func:`ratio_by_ranks` (exact coverage at any run
    count); for other statistics (p10), :func:`ratio_of_statistic`'s percentile bootstrap, whose coverage at a
    few runs is below nominal (the verdict's test column says which)."""
    if statistic == "median":
        return ratio_by_ranks(treatment, baseline, confidence=confidence)
    return ratio_of_statistic(treatment, baseline, statistic=statistic, confidence=confidence, n_boot=n_boot, seed=seed)


def log_half_width(low: float, high: float) -> float:
    """Half the width of a ratio CI on the log scale (inf when a bound is not positive)."""
    if not (low > 0 and high > 0) or not math.isfinite(high):
        return math.inf
    return (math.log(high) - math.log(low)) / 2


def precision_note(low: float, high: float, target: float, stopped: Sequence[str] = ()) -> str:
    """Whether a ratio CI meets its precision target (a log-scale half-width), and when it does not, why capturing
    stopped (the stopping rule of :mod:`ticklab.capture.stopping` sets the same target)."""
    width = log_half_width(low, high)
    shown = f"CI half-width {width:.3f} on the log scale"
    if width <= target:
        return f"{shown} (meets the precision target ≤ {target:.3f})"
    reasons = list(dict.fromkeys(stopped))
    met_then = [why for why in reasons if why.startswith("precision reached")]
    if met_then:
        # the capture checked its own CI when it stopped (before any run was left out, at its own family's level and
        # targets then): say both, so the reason never reads as met and not met at once
        others = [why for why in reasons if why not in met_then]
        return (
            f"{shown}: wider than the precision target ≤ {target:.3f}, though the capture's own check found its CI "
            f"narrow enough when it stopped ({'; '.join(met_then)}) — this CI is the verdict's, over the runs that "
            "count here at this family's level" + (f"; also: {'; '.join(others)}" if others else "")
        )
    why = "; ".join(reasons) or "no stopping record"
    return f"{shown} (precision target ≤ {target:.3f} not met; capture stopped: {why})"


def ratio_of_medians(
    treatment: Sequence[float],
    baseline: Sequence[float],
    *,
    confidence: float = 0.95,
    n_boot: int = 10_000,
    seed: int = 0,
) -> Interval:
    """median(treatment) / median(baseline) with a seeded percentile bootstrap CI."""
    return ratio_of_statistic(treatment, baseline, statistic="median", confidence=confidence, n_boot=n_boot, seed=seed)


@dataclass(frozen=True)
class RankTest:
    statistic: float
    pvalue: float
    test: str


def mann_whitney(a: Sequence[float], b: Sequence[float]) -> RankTest:
    """Two-sided Mann-Whitney U test; U is the statistic of ``a``."""
    x, y = _sample(a, "a"), _sample(b, "b")
    result = stats.mannwhitneyu(x, y, alternative="two-sided", method="auto")
    return RankTest(float(result.statistic), float(result.pvalue), "Mann-Whitney U, two-sided")


def wilcoxon_blocks(treatment: Sequence[float], baseline: Sequence[float]) -> RankTest:
    """Two-sided Wilcoxon signed-rank test of the per-block log ratios (block i: treatment[i] and baseline[i])."""
    d = np.log(_positive(treatment, "treatment")) - np.log(_positive(baseline, "baseline"))
    if np.all(d == 0):
        return RankTest(0.0, 1.0, "Wilcoxon signed-rank of per-block log ratios, two-sided (all zero)")
    result = stats.wilcoxon(d, alternative="two-sided", zero_method="wilcox")
    return RankTest(
        float(result.statistic), float(result.pvalue), "Wilcoxon signed-rank of per-block log ratios, two-sided"
    )


def cliffs_delta(a: Sequence[float], b: Sequence[float]) -> float:
    """P(a > b) − P(a < b) over all pairs: +1 when every a exceeds every b, −1 the reverse."""
    x, y = _sample(a, "a"), _sample(b, "b")
    signs = np.sign(x[:, None] - y[None, :])
    return float(signs.mean())


def holm(pvalues: Sequence[float]) -> np.ndarray:
    """Holm step-down adjusted p-values (family-wise error), in the input order."""
    p = np.asarray(pvalues, dtype=float)
    if p.size == 0:
        return p
    if np.any((p < 0) | (p > 1) | ~np.isfinite(p)):
        raise ValueError("p-values must be finite and within [0, 1]")
    order = np.argsort(p, kind="stable")
    m = p.size
    stepped = np.maximum.accumulate((m - np.arange(m)) * p[order])
    adjusted = np.empty_like(p)
    adjusted[order] = np.minimum(stepped, 1.0)
    return adjusted


def median_ci(values: Sequence[float], confidence: float = 0.95) -> Interval:
    """Distribution-free CI for the median from order statistics (binomial, p = 1/2).

    Returns [x_(r), x_(n−r+1)] with the largest r whose coverage is at least ``confidence``;
    when n is too small for that coverage the bounds are NaN and the method says so."""
    x = np.sort(_sample(values, "values"))
    n = x.size
    alpha = 1 - confidence
    cdf = stats.binom.cdf(np.arange(n + 1), n, 0.5)
    allowed = np.nonzero(cdf <= alpha / 2)[0]
    estimate = float(np.median(x))
    if allowed.size == 0:
        return Interval(
            estimate,
            float("nan"),
            float("nan"),
            confidence,
            f"order statistics: n = {n} is too small for {confidence:.0%} coverage",
        )
    r = int(allowed[-1]) + 1  # 1-based rank of the lower bound
    coverage = 1 - 2 * cdf[r - 1]
    return Interval(
        estimate,
        float(x[r - 1]),
        float(x[n - r]),
        confidence,
        f"order statistics x({r})..x({n - r + 1}), exact coverage {coverage:.4f}",
    )


@dataclass(frozen=True)
class KSampleTest:
    statistic: float
    pvalue: float
    test: str


def anderson_ksamp(samples: Sequence[Sequence[float]], *, n_resamples: int = 9999, seed: int = 0) -> KSampleTest:
    """k-sample Anderson-Darling test that all samples come from one distribution, with a seeded
    permutation p-value (scipy's tabulated p-value is floored at 0.001 and capped at 0.25)."""
    arrays = [_sample(s, f"sample {i}", 2) for i, s in enumerate(samples)]
    if len(arrays) < 2:
        raise ValueError("anderson_ksamp needs at least two samples")
    method = stats.PermutationMethod(n_resamples=n_resamples, rng=np.random.default_rng(seed))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=UserWarning)
        result = stats.anderson_ksamp(arrays, method=method)
    return KSampleTest(
        float(result.statistic),
        float(result.pvalue),
        f"k-sample Anderson-Darling, permutation p ({n_resamples} resamples, seed {seed})",
    )


def coefficient_of_variation(values: Sequence[float]) -> float:
    """Sample standard deviation (n − 1) over the arithmetic mean, in percent (mmtests' CoefVar)."""
    x = _sample(values, "values", 2)
    mean = x.mean()
    if mean == 0:
        raise ValueError("values: mean is 0, the coefficient of variation is undefined")
    return float(x.std(ddof=1) / mean * 100)


def pct_diff(value: float, baseline: float) -> float:
    """mmtests' pdiff: value × 100 / baseline − 100."""
    if baseline == 0:
        raise ValueError("baseline is 0, a percent difference is undefined")
    return value * 100 / baseline - 100


def summarize(values: Sequence[float]) -> dict[str, float]:
    """The six rows of an mmtests compare table for one condition; a statistic the runs cannot give (the spread of
    one run, the CoefVar of a zero mean) is NaN, shown as "—"."""
    x = _sample(values, "values", 1)
    spread = float(x.std(ddof=1)) if x.size > 1 else float("nan")
    return {
        "Min": float(x.min()),
        "Max": float(x.max()),
        "Median": float(np.median(x)),
        "AMean": float(x.mean()),
        "Stddev": spread,
        "CoefVar": spread / float(x.mean()) * 100 if x.size > 1 and x.mean() != 0 else float("nan"),
    }


def compare_summaries(summaries: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """Long table (statistic, condition, value, pct_diff) from a wide table whose index holds
    statistics and whose columns hold conditions (one of them ``baseline``)."""
    if baseline not in summaries.columns:
        raise ValueError(f"baseline {baseline!r} is not one of the conditions {list(summaries.columns)}")
    rows = []
    for statistic in summaries.index:
        base = float(summaries.loc[statistic, baseline])
        for condition in summaries.columns:
            value = float(summaries.loc[statistic, condition])
            defined = base != 0 and math.isfinite(base) and math.isfinite(value)
            rows.append(
                {
                    "statistic": statistic,
                    "condition": condition,
                    "value": value,
                    "pct_diff": None if condition == baseline else (pct_diff(value, base) if defined else float("nan")),
                }
            )
    return pd.DataFrame(rows)


def compare_table(samples: Mapping[str, Sequence[float]], baseline: str, *, alpha: float = 0.05) -> pd.DataFrame:
    """mmtests-style comparison of runs per condition against ``baseline``.

    Long table: statistic, condition, value, pct_diff, plus for each non-baseline condition the
    Mann-Whitney U p-value against the baseline, Holm-adjusted across the conditions compared,
    and ``significant`` (adjusted p < alpha)."""
    if baseline not in samples:
        raise ValueError(f"baseline {baseline!r} is not one of the conditions {list(samples)}")
    summaries = pd.DataFrame({condition: summarize(values) for condition, values in samples.items()})
    summaries = summaries.loc[list(COMPARE_STATISTICS)]
    table = compare_summaries(summaries, baseline)
    # a rank test needs at least two runs a side; with fewer there is no p-value to give
    others = [c for c in samples if c != baseline and len(samples[c]) > 1 and len(samples[baseline]) > 1]
    raw = [mann_whitney(samples[c], samples[baseline]).pvalue for c in others]
    adjusted = dict(zip(others, holm(raw), strict=True)) if others else {}
    table["p_holm"] = table["condition"].map(adjusted)
    table["significant"] = table["p_holm"].map(lambda p: None if pd.isna(p) else bool(p < alpha))
    table.attrs["test"] = f"two-sided Mann-Whitney U vs {baseline}, Holm-adjusted across conditions, alpha = {alpha}"
    table.attrs["n"] = {c: len(v) for c, v in samples.items()}
    return table


def format_compare_table(
    table: pd.DataFrame, *, decimals: int = 2, number: Callable[[float], str] | None = None
) -> pd.DataFrame:
    """Render a long compare table the way mmtests prints it: 'value (+pct%)' per cell, statistics
    as rows, conditions as columns, '*' after conditions that differ significantly. ``number`` formats
    each value and percentage (default: ``decimals`` places, as mmtests does)."""
    number = number or (lambda x: f"{x:.{decimals}f}")
    conditions = list(dict.fromkeys(table["condition"]))
    statistics = list(dict.fromkeys(table["statistic"]))
    cells = pd.DataFrame(index=statistics, columns=conditions, dtype=object)
    for _, row in table.iterrows():
        unit = "%" if row["statistic"] == "CoefVar" else ""
        if not math.isfinite(row["value"]):
            cells.loc[row["statistic"], row["condition"]] = "—"
            continue
        text = f"{number(row['value'])}{unit}"
        if row["pct_diff"] is not None and not pd.isna(row["pct_diff"]) and row["statistic"] != "CoefVar":
            pct = number(row["pct_diff"])
            text += f" ({pct if pct.startswith('-') else '+' + pct}%)"
        cells.loc[row["statistic"], row["condition"]] = text
    if "significant" in table.columns:
        marks = table.drop_duplicates("condition").set_index("condition")["significant"]
        cells.columns = [f"{c} *" if marks.get(c) else c for c in conditions]
    legend = PCT_DIFF_CONVENTION
    if "test" in table.attrs:
        legend += f"; * = {table.attrs['test']}"
    cells.attrs["legend"] = legend
    cells.index.name = "statistic"
    return cells


def simultaneous_level(confidence: float, alpha: float, m: int, over: str) -> str:
    """A CI's level as the verdict tables print it: "95%" alone, or Bonferroni's 1 − alpha/m "over" a family."""
    return f"{confidence:.4g} (simultaneous {1 - alpha:.0%} over {over}: Bonferroni)" if m > 1 else f"{confidence:.0%}"
