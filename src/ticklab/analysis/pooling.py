"""One answer per comparison across many machines (issue 57): a random-effects pool of the setups of one kind.

For each comparison that at least ``MIN_SETUPS`` setups of one kind tested (``captured.pool_kind``: hosts with hosts,
the lab host with the lab host, lab guests by their kernels; a QEMU setup's accelerator unless TCG, so an emulated
CPU is never pooled with one on the hardware), the setups' log ratios are pooled with a random-effects model:

- each setup's log ratio is the log of its verdict row's estimate (the Hodges-Lehmann ratio), and its standard error
  comes from its exact CI: the CI's log width over 2 z, z the normal quantile of the CI's own level (``ci_level``,
  the simultaneous level of that setup's family). A setup whose CI is unbounded (too few runs for the level) has no
  standard error and is not pooled; it still counts in "k of n machines";
- ``statsmodels.stats.meta_analysis.combine_effects`` with the Paule-Mandel τ² (``method_re="iterated"``: τ² ≥ 0;
  its DerSimonian-Laird option leaves a negative τ² in the weights) gives the pooled mean, its variance, τ², Q and
  I² (shown as max(0, I²));
- the pooled CI is the modified Hartung-Knapp one (Knapp and Hartung 2003; Röver, Knapp and Friede 2015): a t
  interval with k − 1 degrees of freedom on the larger of the random-effects variance and its Hartung-Knapp (WLS)
  form, statsmodels' ``var_eff_w_re`` and ``var_hksj_re``. Its level is simultaneous over the claim's pooled tests of
  that kind (Bonferroni, 1 − alpha/m, m counting comparisons of the same rows once, as a setup's family does), and
  the t test's p is Holm-adjusted over the same m;
- the prediction interval for a new machine of that kind (Higgins, Thompson and Spiegelhalter 2009): the mean ± t
  with k − 2 degrees of freedom × sqrt(τ² + the CI's variance), at 1 − alpha;
- the word is ``verdicts.decide`` on the pooled CI (the same vocabulary, the same target and margins). Where
  heterogeneity is large (I² ≥ ``LARGE_I2``), the reason says so first: machines differ, with the prediction
  interval; the row lists "k of n machines" per per-setup word.

The rows go to verdicts.csv with role ``pooled`` and setup ``pooled <kind>``; ``pooled_table`` gives
``tables/<claim>/pooled.csv``. Operating characteristics: benchmarks/pooled_characteristics.py, REPRODUCING.md.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from scipy import stats

from .captured import pool_kind
from .stats import Interval, holm, simultaneous_level
from .verdicts import Margins, Target, Verdict, decide

if TYPE_CHECKING:
    from .comparisons import Comparison

MIN_SETUPS = 3  # a pool needs at least this many setups of one kind with a bounded CI (k - 2 >= 1 for the PI)
LARGE_I2 = 0.5  # I² from which heterogeneity is "large" (Higgins et al. 2003: 50% and more is substantial)
POOLED = "pooled"  # tables/<claim>/pooled.csv
POOLED_PREFIX = "pooled "  # a pooled row's setup: "pooled host", "pooled lab guest 6.12"
POOLED_COLUMNS = [
    "comparison",
    "setup_kind",
    "k",
    "pooled_ratio",
    "ci_low",
    "ci_high",
    "pi_low",
    "pi_high",
    "tau2",
    "i2",
    "verdict",
    "reason",
    "n_setups",
    "machines",
    "ci_level",
    "p_holm",
    "setups",
]


@dataclass(frozen=True)
class PooledVerdict(Verdict):
    """A pooled row: a ``Verdict`` (what verdicts.csv holds) with what only tables/<claim>/pooled.csv shows."""

    setup_kind: str = ""
    k: int = 0  # setups pooled (bounded CIs)
    n_setups: int = 0  # setups of the kind with a row for the comparison
    pi_low: float | None = None
    pi_high: float | None = None
    tau2: float | None = None
    i2: float | None = None
    machines: str = ""  # "k of n machines" per per-setup word
    setups: tuple[str, ...] = ()
    sources: tuple[str, ...] = field(default=(), compare=False)


def confidence_of(level: str) -> float | None:
    """A verdict row's ``ci_level`` as a number: "0.9875 (simultaneous 95% over …)" -> 0.9875, "95%" -> 0.95."""
    found = re.match(r"\s*([0-9.]+)(%?)", str(level))
    if not found:
        return None
    value = float(found[1]) / (100 if found[2] else 1)
    return value if 0 < value < 1 else None


def log_se(low: float, high: float, confidence: float) -> float | None:
    """The standard error of a log ratio whose CI at ``confidence`` is [low, high]: its log width over 2 z. None for
    an unbounded or empty CI."""
    if not (low and high and 0 < low < high < math.inf):
        return None
    return (math.log(high) - math.log(low)) / (2 * stats.norm.ppf(0.5 + confidence / 2))


@dataclass(frozen=True)
class Pool:
    """The random-effects pool of k log ratios: the mean and its CI, the PI, τ², I², Q and the t test's p."""

    k: int
    mean: float
    low: float
    high: float
    pi_low: float
    pi_high: float
    tau2: float
    i2: float
    q: float
    pvalue: float
    confidence: float


def pool_logs(effects: Sequence[float], ses: Sequence[float], confidence: float = 0.95, pi_level: float = 0.95) -> Pool:
    """Pool log ratios with their standard errors (statsmodels' combine_effects, Paule-Mandel τ²): the modified
    Hartung-Knapp CI at ``confidence`` and the prediction interval for a new setup at ``pi_level``."""
    from statsmodels.stats.meta_analysis import combine_effects

    log_ratios, standard_errors = np.asarray(effects, dtype=float), np.asarray(ses, dtype=float)
    k = log_ratios.size
    if (
        k < MIN_SETUPS
        or standard_errors.size != k
        or not np.all(np.isfinite(log_ratios))
        or not np.all(standard_errors > 0)
    ):
        raise ValueError(f"a pool needs at least {MIN_SETUPS} finite effects with positive standard errors")
    result = combine_effects(log_ratios, standard_errors**2, method_re="iterated")
    mean, tau2 = float(result.mean_effect_re), max(0.0, float(result.tau2))
    variance = max(float(result.var_eff_w_re), float(result.var_hksj_re))  # modified Hartung-Knapp
    se = math.sqrt(variance)
    half = stats.t.ppf(0.5 + confidence / 2, k - 1) * se
    spread = stats.t.ppf(0.5 + pi_level / 2, k - 2) * math.sqrt(tau2 + variance)
    return Pool(
        k=k,
        mean=mean,
        low=mean - half,
        high=mean + half,
        pi_low=mean - spread,
        pi_high=mean + spread,
        tau2=tau2,
        i2=max(0.0, float(result.i2)) if math.isfinite(result.i2) else 0.0,
        q=float(result.q),
        pvalue=float(2 * stats.t.sf(abs(mean) / se, k - 1)) if se > 0 else (0.0 if mean else 1.0),
        confidence=confidence,
    )


def is_pooled(row) -> bool:
    """A pooled row of verdicts.csv (a ``Verdict`` or a row read back)."""
    role = row.role if isinstance(row, Verdict) else row["role"]
    return role == "pooled"


def pooled_kind(setup: str) -> str:
    """The setup kind of a pooled row's setup ("pooled host" -> "host")."""
    return str(setup)[len(POOLED_PREFIX) :] if str(setup).startswith(POOLED_PREFIX) else ""


def _machines(words: list[str]) -> str:
    n = len(words)
    return ", ".join(f"{word} {count} of {n}" for word, count in Counter(words).most_common())


def _target_fields(row: Verdict) -> dict:
    names = (
        "printed_in_source",
        "source_quotes",
        "target_ratio",
        "target_provenance",
        "margins",
        "no_effect_margin",
        "band_low",
        "band_high",
        "no_worse_than",
    )
    return {name: getattr(row, name) for name in names}


@dataclass
class _Group:
    comparison: Comparison
    kind: str
    rows: list[Verdict]
    bounded: list[tuple[Verdict, float, float]]  # (row, log ratio, its standard error)
    pool: Pool | None = None
    p_holm: float | None = None
    family: int = 0  # the kind's distinct pooled tests (m)


def pooled_verdicts(
    claim: str, rows: Sequence[Verdict], comparisons, *, alpha: float = 0.05, sources: Sequence[str] = ()
) -> list[PooledVerdict]:
    """The pooled rows of a claim's per-setup verdict rows: one per comparison and setup kind with at least
    ``MIN_SETUPS`` setups that tested it (module docstring). ``sources``: the files the rows came from (the pooled
    table's sidecar)."""
    by_name = {c.comparison: c for c in comparisons}
    groups: dict[tuple[str, str], _Group] = {}
    for row in rows:
        comparison = by_name.get(row.comparison)
        if comparison is None or is_pooled(row) or row.verdict == "not testable here":
            continue  # the collapsed not-testable row, a claim's own level row, or a setup that could not test it
        if ", " in row.setup:
            continue
        group = groups.setdefault(
            (row.comparison, pool_kind(row.setup)), _Group(comparison, pool_kind(row.setup), [], [])
        )
        group.rows.append(row)
        confidence = confidence_of(row.ci_level)
        se = None if confidence is None else log_se(row.ci_low, row.ci_high, confidence)
        if se is not None and row.fresh_effect and row.fresh_effect > 0:
            group.bounded.append((row, math.log(row.fresh_effect), se))
    chosen = [g for g in groups.values() if len(g.rows) >= MIN_SETUPS]
    for kind in dict.fromkeys(g.kind for g in chosen):
        family = [g for g in chosen if g.kind == kind and len(g.bounded) >= MIN_SETUPS]
        keys = [tuple((r.setup, y, se) for r, y, se in g.bounded) for g in family]
        distinct = list(dict.fromkeys(keys))
        if not distinct:
            continue
        confidence = 1 - alpha / len(distinct)
        pools = {
            key: pool_logs([y for _, y, _ in key], [se for _, _, se in key], confidence, 1 - alpha) for key in distinct
        }
        adjusted = dict(zip(distinct, holm([pools[key].pvalue for key in distinct]), strict=True))
        for group, key in zip(family, keys, strict=True):
            group.pool, group.p_holm, group.family = pools[key], float(adjusted[key]), len(distinct)
    order = {c.comparison: i for i, c in enumerate(comparisons)}
    chosen.sort(key=lambda g: (g.kind, order.get(g.comparison.comparison, len(order))))
    return [_row(claim, group, alpha, sources) for group in chosen]


def _row(claim: str, group: _Group, alpha: float, sources: Sequence[str]) -> PooledVerdict:
    comparison, pool, m = group.comparison, group.pool, group.family
    words = [r.verdict for r in group.rows]
    n, k = len(group.rows), len(group.bounded)
    machines = _machines(words)
    common = {
        "claim": claim,
        "setup": POOLED_PREFIX + group.kind,
        "comparison": comparison.comparison,
        "role": "pooled",
        "setup_kind": group.kind,
        "k": k,
        "n_setups": n,
        "machines": machines,
        "setups": tuple(r.setup for r in group.rows),
        "sources": tuple(sources),
        **_target_fields(group.rows[0]),
    }
    if pool is None:
        unbounded = ", ".join(r.setup for r in group.rows if all(r is not b for b, _, _ in group.bounded))
        return PooledVerdict(
            verdict="inconclusive",
            reason=(
                f"not pooled: {k} of the {n} {group.kind} setups that tested it have a bounded CI, and a pool needs "
                f"{MIN_SETUPS} (unbounded or none: {unbounded}); per machine: {machines}"
            ),
            n_per_condition=f"{k} of {n} setups",
            test="random-effects pool of the setups' log ratios: not made (too few bounded CIs)",
            **common,
        )
    interval = Interval(
        math.exp(pool.mean), math.exp(pool.low), math.exp(pool.high), pool.confidence, "modified Hartung-Knapp"
    )
    target: Target = comparison.target
    margins: Margins = comparison.margins
    verdict, reason = decide(target, interval, group.p_holm, margins, comparison.sizes_comparable)
    pi = f"×{math.exp(pool.pi_low):.3g}..×{math.exp(pool.pi_high):.3g}"
    spread = f"I² = {pool.i2:.0%}, τ² = {pool.tau2:.3g} (τ ×{math.exp(math.sqrt(pool.tau2)):.3g})"
    if pool.i2 >= LARGE_I2:
        reason = (
            f"machines differ ({spread}): a new {group.kind} setup's ratio is predicted in {pi} ({1 - alpha:.0%} "
            f"prediction interval), and the word is about the machines' mean; {reason}"
        )
    else:
        reason += f"; heterogeneity {spread}, a new {group.kind} setup predicted in {pi} ({1 - alpha:.0%} PI)"
    reason += f"; per machine: {machines}" + (f" ({n - k} not pooled: no bounded CI)" if n > k else "")
    level = simultaneous_level(pool.confidence, alpha, m, f"this kind's {m} pooled tests")
    return PooledVerdict(
        verdict=verdict,
        reason=reason,
        fresh_effect=interval.estimate,
        ci_low=interval.low,
        ci_high=interval.high,
        ci_level=level,
        p_holm=group.p_holm,
        n_per_condition=f"{k} setups" if n == k else f"{k} of {n} setups",
        pi_low=math.exp(pool.pi_low),
        pi_high=math.exp(pool.pi_high),
        tau2=pool.tau2,
        i2=pool.i2,
        test=(
            f"random-effects pool of {k} {group.kind} setups' log ratios (statsmodels combine_effects, Paule-Mandel "
            f"τ²), each setup's standard error from its exact CI (log width / 2z at the CI's level); modified "
            f"Hartung-Knapp t CI with {k - 1} df at {level}; prediction interval t with {k - 2} df at {1 - alpha:.0%}; "
            f"p of the t test, Holm over this kind's {m} pooled test{'s' if m != 1 else ''}"
        ),
        **common,
    )


def pooled_table(rows: Sequence[Verdict]) -> pd.DataFrame:
    """tables/<claim>/pooled.csv: one row per pooled verdict (``POOLED_COLUMNS``)."""
    table = [
        {
            "comparison": row.comparison,
            "setup_kind": row.setup_kind,
            "k": row.k,
            "pooled_ratio": row.fresh_effect,
            "ci_low": row.ci_low,
            "ci_high": row.ci_high,
            "pi_low": row.pi_low,
            "pi_high": row.pi_high,
            "tau2": row.tau2,
            "i2": row.i2,
            "verdict": row.verdict,
            "reason": row.reason,
            "n_setups": row.n_setups,
            "machines": row.machines,
            "ci_level": row.ci_level,
            "p_holm": row.p_holm,
            "setups": ", ".join(row.setups),
        }
        for row in rows
        if isinstance(row, PooledVerdict)
    ]
    return pd.DataFrame(table, columns=POOLED_COLUMNS)
