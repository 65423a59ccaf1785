"""Verdicts: what fresh data shows about a claim, one row per claim, setup and comparison.

The vocabulary separates what was shown:

- ``reproduced``: an effect in the source's direction (CI excludes no change, adjusted p < alpha) whose
  estimated size is consistent with the target: its log-effect within a factor (1 + the declared size
  tolerance) of the target's (or, for a target that states only a direction, the direction).
- ``direction only``: an effect in the source's direction whose size is not consistent with the target;
  the reason says by how much, and whether sizes are comparable on this setup at all.
- ``not reproduced``: an effect opposite to the source's, or equivalence shown (the whole CI inside the
  comparison's declared no-effect margin).

A source that says something does *not* get worse ("no longer results in regressions") states a
non-inferiority target (``Target.no_worse_than``, a declared margin): ``reproduced`` when the whole CI lies on the
good side of that bound (a change within the margin is accepted, as the margin declares), ``not reproduced``
when the CI reaches past the bound and shows a significant change to the worse side (a regression),
``inconclusive`` otherwise.
- ``inconclusive``: neither; the reason gives the achieved power for the target and the runs per
  condition that would be needed (or says that there were too few runs to test at all).
- ``not testable here``: with the reason.

Targets carry their provenance: the value as printed in the source (with the quote ids of
traces/published) and whether the target ratio is printed there or derived by ticklab (and how).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from .stats import Interval

VERDICTS = ("reproduced", "direction only", "not reproduced", "inconclusive", "not testable here")
ROLES = ("claim", "premise")

VERDICT_COLUMNS = [
    "claim", "setup", "role", "comparison", "printed_in_source", "source_quotes", "target_ratio",
    "target_provenance", "fresh_effect", "ci_low", "ci_high", "ci_level", "p_holm", "n_per_condition",
    "cliffs_delta", "power_at_target", "runs_needed", "margins", "test", "verdict", "reason",
]
# What notebooks and the report show of a verdict row (the rest is in build/verdicts.csv).
SHOWN_COLUMNS = ["setup", "role", "comparison", "printed_in_source", "target_ratio", "target_provenance",
                 "fresh_effect", "ci_low", "ci_high", "p_holm", "n_per_condition", "cliffs_delta", "power_at_target",
                 "verdict", "reason"]


@dataclass(frozen=True)
class Target:
    """What a comparison's fresh ratio (treatment / baseline) is held against, and where it came from."""
    ratio: float | None      # None: the source states a direction only
    direction: int           # +1: treatment larger; -1: treatment smaller
    provenance: str          # "printed" or "derived: <how>"
    as_printed: str          # the source's own words/numbers the target rests on, verbatim
    quotes: tuple[str, ...]  # "<claim>/<table>/<row id>" in traces/published
    # non-inferiority: the source says the treatment is no worse than the baseline. ``direction`` is then the
    # direction of worse (+1: a larger ratio is worse), and the ratio must stay on the good side of this declared
    # bound (e.g. 1.05: at most 5 % worse); ``ratio`` is None
    no_worse_than: float | None = None

    def __post_init__(self):
        if self.direction not in (1, -1):
            raise ValueError("a target's direction is +1 or -1")
        if self.no_worse_than is not None and (self.ratio is not None or not self.no_worse_than > 0
                                               or (self.no_worse_than > 1) != (self.direction > 0)):
            raise ValueError(f"a non-inferiority bound {self.no_worse_than!r} needs no ratio and lies on the worse "
                             f"side of 1 (direction {self.direction:+d})")
        if self.ratio is not None and (not self.ratio > 0 or self.ratio == 1 or (self.ratio > 1) != (self.direction > 0)):
            raise ValueError(f"target ratio {self.ratio!r} does not state an effect in direction {self.direction:+d}")
        if not (self.provenance == "printed" or self.provenance.startswith("derived: ")):
            raise ValueError(f"target provenance {self.provenance!r} must be 'printed' or 'derived: <how>'")

    @property
    def text(self) -> str:
        if self.no_worse_than is not None:
            return f"no worse than ×{self.no_worse_than:.3g}"
        if self.ratio is None:
            return "higher" if self.direction > 0 else "lower"
        return f"×{self.ratio:.3g}"


@dataclass(frozen=True)
class Margins:
    """The standards a comparison is judged by, declared with it (never fitted to the data)."""
    size_tolerance: float = 0.25       # an estimate whose log-effect is within a factor (1 + this) of the target's is consistent
    no_effect: float | None = None     # |ratio − 1| below this is "no effect"; default: half the target's log-effect
    power_goal: float = 0.8

    def no_effect_log(self, target: Target) -> float:
        if self.no_effect is not None:
            return math.log1p(self.no_effect)
        if target.no_worse_than is not None:
            return abs(math.log(target.no_worse_than))
        if target.ratio is None:
            raise ValueError("a target that states only a direction needs a declared no-effect margin")
        return abs(math.log(target.ratio)) / 2

    def describe(self, target: Target) -> str:
        if target.no_worse_than is not None:
            return f"non-inferiority: the CI must stay on the good side of ×{target.no_worse_than:.3g} (declared)"
        no_effect = math.expm1(self.no_effect_log(target))
        text = f"no effect: ratio within ×{1 / (1 + no_effect):.3g}..×{1 + no_effect:.3g}"
        if target.ratio is not None:
            low, high = consistent_band(target, self.size_tolerance)
            text += f"; consistent size: ×{low:.3g}..×{high:.3g} (log-effect within a factor {1 + self.size_tolerance:g})"
        return text


def consistent_band(target: Target, tolerance: float) -> tuple[float, float]:
    """The ratios whose log-effect lies within a factor (1 + tolerance) of the target's, as (low, high)."""
    effect = math.log(target.ratio)
    ends = sorted((math.exp(effect / (1 + tolerance)), math.exp(effect * (1 + tolerance))))
    return ends[0], ends[1]


@dataclass(frozen=True)
class Verdict:
    claim: str
    setup: str
    comparison: str
    verdict: str
    reason: str
    role: str = "claim"
    printed_in_source: str = ""
    source_quotes: str = ""
    target_ratio: float | None = None
    target_provenance: str = ""
    fresh_effect: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    ci_level: str = ""
    p_holm: float | None = None
    n_per_condition: str = ""
    cliffs_delta: float | None = None
    power_at_target: float | None = None
    runs_needed: float | None = None
    margins: str = ""
    test: str = ""

    def __post_init__(self):
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict {self.verdict!r} is not one of {VERDICTS}")
        if self.role not in ROLES:
            raise ValueError(f"role {self.role!r} is not one of {ROLES}")
        if not self.reason.strip():
            raise ValueError("a verdict needs its reason")

    def as_row(self) -> dict:
        return asdict(self)


def _log(value: float) -> float:
    return math.log(max(value, 1e-300))


def decide(target: Target, fresh: Interval, p_holm: float, alpha: float, margins: Margins,
           sizes_comparable: str = "") -> tuple[str, str]:
    """The verdict and its reason for a fresh ratio CI against a target (the CI at the level the caller chose)."""
    low, high, estimate = _log(fresh.low), _log(fresh.high), _log(fresh.estimate)
    ci = f"ratio {fresh.estimate:.3g} [{fresh.low:.3g}, {fresh.high:.3g}], p = {p_holm:.2g}"
    significant = p_holm < alpha
    same_side = low > 0 if target.direction > 0 else high < 0
    opposite = high < 0 if target.direction > 0 else low > 0
    no_effect = margins.no_effect_log(target)
    if target.no_worse_than is not None:
        return _no_worse(target, low, high, significant, ci)
    if opposite and significant:
        return "not reproduced", f"effect opposite to the source's: {ci}"
    if -no_effect <= low and high <= no_effect:
        return "not reproduced", (f"no effect: the whole CI lies within the no-effect margin "
                                  f"×{math.exp(-no_effect):.3g}..×{math.exp(no_effect):.3g} ({ci})")
    if same_side and significant:
        if target.ratio is None:
            return "reproduced", f"effect in the source's direction, which is all the source states: {ci}"
        band_low, band_high = consistent_band(target, margins.size_tolerance)
        if band_low <= fresh.estimate <= band_high:
            return "reproduced", (f"effect in the source's direction and of a consistent size: {ci}; target {target.text}, "
                                  f"consistent sizes ×{band_low:.3g}..×{band_high:.3g}")
        times = estimate / math.log(target.ratio)
        return "direction only", (f"effect in the source's direction, {times:.2g} times the target's size on the log "
                                  f"scale: {ci}, outside the consistent sizes ×{band_low:.3g}..×{band_high:.3g} around "
                                  f"the target {target.text}" + (f"; {sizes_comparable}" if sizes_comparable else ""))
    return "inconclusive", f"cannot tell the target {target.text} from no effect: {ci}"


def _no_worse(target: Target, low: float, high: float, significant: bool, ci: str) -> tuple[str, str]:
    """A non-inferiority target: the CI (log scale) against the declared bound on the worse side."""
    bound = math.log(target.no_worse_than)
    worse_side = (lambda x: x > 0) if target.direction > 0 else (lambda x: x < 0)
    near, far = (high, low) if target.direction > 0 else (low, high)   # the CI end toward worse, and the other
    if not worse_side(near - bound):
        return "reproduced", (f"no worse: the whole CI lies on the good side of the declared bound ×{target.no_worse_than:.3g} "
                              f"({ci})")
    if worse_side(far) and significant:
        return "not reproduced", f"worse: a significant change to the worse side ({ci}; bound ×{target.no_worse_than:.3g})"
    return "inconclusive", (f"cannot tell whether it is no worse than ×{target.no_worse_than:.3g}: the CI reaches past "
                            f"the bound ({ci})")
