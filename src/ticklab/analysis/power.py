"""How likely the runs were to show a target effect, and how many runs would.

Both answers come from the runs' own spread: each condition's values are turned into log-residuals
around that condition's median and pooled, so the noise model is "the run-to-run scatter this setup
showed", and a target ratio is a shift of that scatter on the log scale. "Detect" is what the verdict
needs to call an effect: its CI (the exact Mann-Whitney inversion CI at the level the verdict uses, alpha
shared out Bonferroni-style over the setup's comparisons) excludes no change on the target's side.

- ``achieved_power``: resampling (a bootstrap of the pooled residuals) at the runs per condition the data had;
  a resampled tie counts against detection, and a run count too small for a bounded CI at that level has
  power exactly 0.
- ``runs_needed``: Noether's (1987) sample-size formula for the Mann-Whitney test, with P(X < Y) under
  the target taken from the same pooled residuals. It is an approximation (good from ~10 runs up) and
  is labelled as one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .lazy import stats
from .stats import rank_shift_rank, signed_rank_rank, smallest_bounded_n


@dataclass(frozen=True)
class Power:
    power: float  # share of resampled experiments at the observed n whose test detects the target
    n_per_condition: int  # the n it was computed at (the smaller of the two conditions)
    runs_needed: float  # per condition for ``goal`` power (Noether); inf when the target cannot be told from noise
    goal: float
    method: str

    def sentence(self) -> str:
        needed = (
            "more runs than any capture can make (the target is inside the noise)"
            if math.isinf(self.runs_needed)
            else f"~{self.runs_needed:,.0f} runs per condition"
        )
        return (
            f"power {self.power:.0%} to detect the target at {self.n_per_condition} runs per condition; "
            f"{self.goal:.0%} power needs {needed}"
        )


def pooled_log_residuals(*samples: Sequence[float]) -> np.ndarray:
    """Every run's log value minus its condition's log median, all conditions pooled (positive values only)."""
    residuals = []
    for sample in samples:
        values = np.asarray(sample, dtype=float)
        if values.size < 2 or np.any(values <= 0) or not np.all(np.isfinite(values)):
            raise ValueError("power needs at least 2 positive, finite values per condition")
        logs = np.log(values)
        residuals.append(logs - np.median(logs))
    return np.concatenate(residuals)


def _p_shifted_exceeds(residuals: np.ndarray, shift: float) -> float:
    """P(r1 + shift > r2) + ½ P(tie) over independent draws of the pooled residuals."""
    diff = residuals[:, None] + shift - residuals[None, :]
    return float((diff > 0).mean() + 0.5 * (diff == 0).mean())


def noether_runs(residuals: np.ndarray, target_ratio: float, alpha: float, goal: float) -> float:
    """Runs per condition (equal groups) for a two-sided Mann-Whitney test at ``alpha`` to reach ``goal`` power."""
    p_exceeds = _p_shifted_exceeds(residuals, math.log(target_ratio))
    distance = abs(p_exceeds - 0.5)
    if distance < 1e-9:
        return math.inf
    z = stats.norm.ppf(1 - alpha / 2) + stats.norm.ppf(goal)
    return max(float(smallest_testable_n(alpha)), math.ceil(z**2 / (3 * distance**2) / 2))


def smallest_testable_n(alpha: float) -> int:
    """The fewest runs per condition (equal groups) whose exact two-sided CI at 1 − alpha is bounded."""
    return smallest_bounded_n(lambda n, confidence: rank_shift_rank(n, n, confidence), 1 - alpha)


def detection_power(
    treatment: Sequence[float],
    baseline: Sequence[float],
    target_ratio: float,
    *,
    alpha: float,
    goal: float = 0.8,
    reps: int = 2000,
    seed: int = 0,
) -> Power:
    """Power of the verdict's CI to exclude no change on the target's side, given these runs' scatter, and the runs
    needed."""
    if not target_ratio > 0 or target_ratio == 1:
        raise ValueError(f"target ratio {target_ratio!r}: power needs a positive ratio other than 1")
    residuals = pooled_log_residuals(treatment, baseline)
    n1, n2 = len(treatment), len(baseline)
    k, _ = rank_shift_rank(n1, n2, 1 - alpha)
    method = (
        f"power of the exact Mann-Whitney inversion CI at {1 - alpha:.4g} to exclude no change on the target's side, "
        f"by resampling the runs' pooled log-residuals ({reps} reps, seed {seed}); runs needed by Noether's formula"
    )
    runs_needed = noether_runs(residuals, target_ratio, alpha, goal)
    if k == 0:
        return Power(0.0, int(min(n1, n2)), runs_needed, goal, method)
    rng = np.random.default_rng(seed)
    shift = math.log(target_ratio)
    base = residuals[rng.integers(0, residuals.size, size=(reps, n2))]
    shifted = residuals[rng.integers(0, residuals.size, size=(reps, n1))] + shift
    differences = (shifted[:, :, None] - base[:, None, :]) * math.copysign(1, shift)
    # the CI's lower end on the target's side is D(k): above no change when fewer than k differences are not above it
    power = float(np.mean((differences <= 0).sum(axis=(1, 2)) < k))
    return Power(power, int(min(n1, n2)), runs_needed, goal, method)


def blocked_detection_power(
    treatment: Sequence[float],
    baseline: Sequence[float],
    target_ratio: float,
    *,
    alpha: float,
    goal: float = 0.8,
    reps: int = 2000,
    seed: int = 0,
) -> Power:
    """The blocked analysis's power: the share of resamples of the per-block log ratios' residuals (around their
    median), shifted by the target, whose exact signed-rank CI at 1 − alpha excludes no change on the target's side
    (0 when the block count cannot give a bounded CI); blocks needed by Noether's formula for the signed-rank test."""
    if not target_ratio > 0 or target_ratio == 1:
        raise ValueError(f"target ratio {target_ratio!r}: power needs a positive ratio other than 1")
    t, b = np.asarray(treatment, dtype=float), np.asarray(baseline, dtype=float)
    if t.size != b.size or t.size < 2 or np.any(t <= 0) or np.any(b <= 0):
        raise ValueError("blocked power needs at least 2 blocks of positive values")
    d = np.log(t) - np.log(b)
    residuals = d - np.median(d)
    n = d.size
    shift = math.log(target_ratio)
    k, _ = signed_rank_rank(n, 1 - alpha)
    method = (
        f"power of the exact signed-rank CI at {1 - alpha:.4g} to exclude no change on the target's side, by "
        f"resampling the per-block log ratios' residuals ({reps} reps, seed {seed}); blocks needed by Noether's "
        f"formula"
    )
    pair_sums = residuals[:, None] + residuals[None, :] + 2 * shift
    p_positive = float((np.sign(shift) * pair_sums > 0).mean() + 0.5 * (pair_sums == 0).mean())
    distance = abs(p_positive - 0.5)
    z = stats.norm.ppf(1 - alpha / 2) + stats.norm.ppf(goal)
    smallest = smallest_bounded_n(signed_rank_rank, 1 - alpha)
    needed = math.inf if distance < 1e-9 else max(float(smallest), math.ceil(z**2 / (3 * distance**2)))
    if k == 0:
        return Power(0.0, n, needed, goal, method)
    rng = np.random.default_rng(seed)
    drawn = (residuals[rng.integers(0, n, size=(reps, n))] + shift) * math.copysign(1, shift)
    i, j = np.triu_indices(n)
    walsh = (drawn[:, i] + drawn[:, j]) / 2
    power = float(np.mean((walsh <= 0).sum(axis=1) < k))
    return Power(power, n, needed, goal, method)
