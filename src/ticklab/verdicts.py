"""Verdicts: does a published effect hold in fresh data? One row per claim, setup and comparison."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .stats import Interval

VERDICTS = ("reproduced", "not reproduced", "inconclusive", "not testable here")

VERDICT_COLUMNS = [
    "claim", "setup", "comparison", "published_effect", "fresh_effect", "ci_low", "ci_high",
    "p_holm", "n_per_condition", "cliffs_delta", "test", "verdict", "reason",
]


@dataclass(frozen=True)
class Verdict:
    claim: str
    setup: str
    comparison: str
    published_effect: str
    verdict: str
    reason: str
    fresh_effect: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    p_holm: float | None = None
    n_per_condition: str = ""
    cliffs_delta: float | None = None
    test: str = ""

    def __post_init__(self):
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict {self.verdict!r} is not one of {VERDICTS}")
        if not self.reason.strip():
            raise ValueError("a verdict needs its reason")

    def as_row(self) -> dict:
        return asdict(self)


def decide(published_ratio: float, fresh: Interval, p_holm: float, alpha: float = 0.05) -> tuple[str, str]:
    """Compare a fresh ratio-of-medians CI with the published ratio (n = 1, direction and size).

    reproduced: the CI excludes 1 on the published side and the adjusted p is below alpha.
    not reproduced: the CI excludes 1 on the opposite side, or it contains 1 but excludes the
    published ratio (the published effect is demonstrably absent here).
    inconclusive: anything else (too few runs or too much noise to say)."""
    if published_ratio == 1:
        raise ValueError("a published ratio of exactly 1 states no effect to reproduce")
    direction = 1 if published_ratio > 1 else -1
    excludes_one = fresh.low > 1 or fresh.high < 1
    same_side = (fresh.low > 1) if direction > 0 else (fresh.high < 1)
    relative = (fresh.estimate - 1) / (published_ratio - 1)
    if excludes_one and p_holm < alpha:
        if same_side:
            return "reproduced", (
                f"effect in the published direction: ratio {fresh.estimate:.3f} "
                f"[{fresh.low:.3f}, {fresh.high:.3f}], {relative:.0%} of the published change, p = {p_holm:.2g}")
        return "not reproduced", (
            f"effect opposite to the published one: ratio {fresh.estimate:.3f} [{fresh.low:.3f}, {fresh.high:.3f}], p = {p_holm:.2g}")
    published_inside = fresh.low <= published_ratio <= fresh.high
    if not excludes_one and not published_inside:
        return "not reproduced", (
            f"no effect: CI [{fresh.low:.3f}, {fresh.high:.3f}] contains 1 and excludes the published ratio {published_ratio:.3f}")
    return "inconclusive", (
        f"CI [{fresh.low:.3f}, {fresh.high:.3f}] (p = {p_holm:.2g}) cannot separate no effect from the published ratio {published_ratio:.3f}")
