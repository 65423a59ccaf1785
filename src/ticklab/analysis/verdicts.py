"""Verdicts: what fresh data shows about a claim, one row per claim, setup and comparison.

Every word is a claim the comparison's CI supports (the simultaneous CI of the claim's family on that setup; the
p-value is shown beside it, never decides). With the CI on the log scale, the source's direction taken as
positive, the target's log-effect L, the consistent-size band [L / (1 + tolerance), L × (1 + tolerance)] and the
comparison's declared no-effect margin ±e (in the quantity's own terms, never derived from the target):

- ``no effect shown``: the whole CI lies within ±e (equivalence at the CI's level: two one-sided tests).
- ``opposite effect``: the whole CI lies on the other side of no change.
- ``reproduced``: the whole CI lies on the source's side of no change and inside the band; for a target that
  states only a direction, on the source's side and clear of the declared no-effect margin.
- ``smaller than the target`` / ``larger than the target``: the whole CI lies below / above the band, and (for
  "smaller") the estimate lies on the source's side of no change; the reason says whether the CI also clears no
  change and the declared no-effect margin (only then does it say "an effect in the source's direction").
- ``target excluded``: the whole CI lies short of the band but the estimate lies at or past no change: the target's
  size is ruled out and no effect in the source's direction is shown (nor, unless the CI is wholly past no change,
  which is ``opposite effect``, an opposite one).
- ``consistent, not pinned``: the CI lies on the source's side of no change and reaches into the band without
  lying wholly inside it: it may be wider than the band, or narrower and straddle one of its edges. The size is
  consistent with the target and not yet pinned to it; the reason (:func:`band_overlap`) says how much of the CI
  (log scale) lies inside the band, whether the estimate lies inside it or on which side, and whether the CI is
  wider than the band.
- ``inconclusive``: the CI holds both no change and sizes in or beyond the band; the reason gives the power for
  the target and the runs per condition that would be needed (or says there were too few runs to test at all).
- ``not testable here``: with the reason.

A source that says something does *not* get worse ("no longer results in regressions") states a non-inferiority
target (``Target.no_worse_than``, a declared bound): ``reproduced`` when the whole CI lies on the good side of that
bound, ``opposite effect`` when the whole CI lies past it on the worse side, ``inconclusive`` otherwise.

Targets carry their provenance: the value as printed in the source (with the quote ids of traces/published) and
whether the target ratio is printed there or derived by ticklab (and how).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from .stats import Interval, median_ci

VERDICTS = (
    "reproduced",
    "consistent, not pinned",
    "smaller than the target",
    "target excluded",
    "larger than the target",
    "opposite effect",
    "no effect shown",
    "inconclusive",
    "not testable here",
)
ROLES = ("claim", "premise", "pooled")  # pooled: a random-effects pool of setups of one kind (analysis/pooling.py)

VERDICT_COLUMNS = [
    "claim",
    "setup",
    "role",
    "comparison",
    "printed_in_source",
    "source_quotes",
    "target_ratio",
    "target_provenance",
    "fresh_effect",
    "ci_low",
    "ci_high",
    "ci_level",
    "p_holm",
    "n_per_condition",
    "cliffs_delta",
    "power_at_target",
    "runs_needed",
    "margins",
    "no_effect_margin",
    "band_low",
    "band_high",
    "no_worse_than",
    "test",
    "verdict",
    "reason",
]
# What notebooks and the report show of a verdict row (the rest is in build/verdicts.csv).
SHOWN_COLUMNS = [
    "setup",
    "role",
    "comparison",
    "printed_in_source",
    "target_ratio",
    "target_provenance",
    "fresh_effect",
    "ci_low",
    "ci_high",
    "p_holm",
    "n_per_condition",
    "cliffs_delta",
    "power_at_target",
    "verdict",
    "reason",
]


@dataclass(frozen=True)
class Target:
    """What a comparison's fresh ratio (treatment / baseline) is held against, and where it came from."""

    ratio: float | None  # None: the source states a direction only
    direction: int  # +1: treatment larger; -1: treatment smaller
    provenance: str  # "printed" or "derived: <how>"
    as_printed: str  # the source's own words/numbers the target rests on, verbatim
    quotes: tuple[str, ...]  # "<claim>/<table>/<row id>" in traces/published
    # non-inferiority: the source says the treatment is no worse than the baseline. ``direction`` is then the
    # direction of worse (+1: a larger ratio is worse), and the ratio must stay on the good side of this declared
    # bound (e.g. 1.05: at most 5 % worse); ``ratio`` is None
    no_worse_than: float | None = None

    def __post_init__(self):
        if self.direction not in (1, -1):
            raise ValueError("a target's direction is +1 or -1")
        if self.no_worse_than is not None and (
            self.ratio is not None or not self.no_worse_than > 0 or (self.no_worse_than > 1) != (self.direction > 0)
        ):
            raise ValueError(
                f"a non-inferiority bound {self.no_worse_than!r} needs no ratio and lies on the worse "
                f"side of 1 (direction {self.direction:+d})"
            )
        if self.ratio is not None and (
            not self.ratio > 0 or self.ratio == 1 or (self.ratio > 1) != (self.direction > 0)
        ):
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
    """The standards a comparison is judged by, declared with it (never fitted to the data or derived from the
    target's size).

    ``no_effect``: the change the quantity itself counts as none (e.g. 0.02: within ±2 % FTQ work), declared per
    comparison with its reason beside it; equivalence ("no effect shown") is the whole CI inside it, so it must be
    smaller than the smallest real effect the comparison should not call none."""

    no_effect: float
    size_tolerance: float = (
        0.25  # an estimate whose log-effect is within a factor (1 + this) of the target's is consistent
    )
    power_goal: float = 0.8

    def __post_init__(self):
        if not 0 < self.no_effect < 1:
            raise ValueError(f"no-effect margin {self.no_effect!r}: a declared fraction between 0 and 1 (0.02: ±2 %)")

    def no_effect_log(self) -> float:
        return math.log1p(self.no_effect)

    def precision_log(self, target: Target) -> float:
        """The CI half-width (log scale) that lets the words decide: narrow enough to fit inside the consistent-size
        band (a ratio target), the no-effect margin (a direction target) or the distance to a non-inferiority
        bound."""
        if target.no_worse_than is not None:
            return abs(math.log(target.no_worse_than)) / 2
        if target.ratio is None:
            return self.no_effect_log()
        low, high = consistent_band(target, self.size_tolerance)
        return (math.log(high) - math.log(low)) / 2

    def describe(self, target: Target) -> str:
        if target.no_worse_than is not None:
            return f"non-inferiority: the CI must stay on the good side of ×{target.no_worse_than:.3g} (declared)"
        text = (
            f"no effect: ratio within ×{1 / (1 + self.no_effect):.3g}..×{1 + self.no_effect:.3g} "
            f"(declared ±{self.no_effect:.3g})"
        )
        if target.ratio is not None:
            low, high = consistent_band(target, self.size_tolerance)
            text += (
                f"; consistent size: ×{low:.3g}..×{high:.3g} (log-effect within a factor {1 + self.size_tolerance:g})"
            )
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
    # the margins as numbers, for figures: the declared no-effect margin (0.02: ±2 %), the consistent-size band
    # around the target (ratios, or a level's declared band) and a non-inferiority bound
    no_effect_margin: float | None = None
    band_low: float | None = None
    band_high: float | None = None
    no_worse_than: float | None = None
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


def format_p(p: float) -> str:
    """A p-value as ticklab prints it everywhere: three significant digits, scientific below 0.001."""
    if p is None or math.isnan(p):
        return "—"
    return f"{p:.3g}" if p >= 1e-3 else f"{p:.2e}"


def decide(
    target: Target, fresh: Interval, p_holm: float, margins: Margins, sizes_comparable: str = ""
) -> tuple[str, str]:
    """The verdict and its reason for a fresh ratio CI against a target (the CI at the level the caller chose)."""
    low, high = _log(fresh.low), _log(fresh.high)
    ci = f"ratio {fresh.estimate:.3g} [{fresh.low:.3g}, {_bound(fresh.high)}], p = {format_p(p_holm)}"
    if target.no_worse_than is not None:
        return _no_worse(target, low, high, ci)
    # the source's direction as positive
    low, high = (low, high) if target.direction > 0 else (-high, -low)
    no_effect = margins.no_effect_log()
    if -no_effect <= low and high <= no_effect:
        return "no effect shown", (
            f"the whole CI lies within the declared no-effect margin "
            f"×{1 / (1 + margins.no_effect):.3g}..×{1 + margins.no_effect:.3g} ({ci})"
        )
    if high < 0:
        negligible = (
            f"; its end nearest no change lies within the declared no-effect margin ×{1 / (1 + margins.no_effect):.3g}"
            f"..×{1 + margins.no_effect:.3g}: the opposite effect may be negligible"
            if high >= -no_effect
            else ""
        )
        return (
            "opposite effect",
            f"the whole CI lies on the other side of no change from the source's effect: {ci}{negligible}",
        )
    margin = f"×{1 / (1 + margins.no_effect):.3g}..×{1 + margins.no_effect:.3g}"
    if target.ratio is None:
        if low > no_effect:
            return (
                "reproduced",
                f"the whole CI lies on the source's side of no change and clear of the declared no-effect margin "
                f"{margin}, which is all the source states: {ci}",
            )
        if low > 0:
            return "inconclusive", (
                f"the CI excludes no change but reaches into the declared no-effect margin {margin}: an effect in "
                f"the source's direction is not shown to exceed a negligible one: {ci}"
            )
        return "inconclusive", f"the CI holds no change and the source's direction: {ci}"
    band_low, band_high = consistent_band(target, margins.size_tolerance)
    band = f"consistent sizes ×{band_low:.3g}..×{band_high:.3g} around the target {target.text}"
    size_low, size_high = sorted(abs(_log(x)) for x in (band_low, band_high))
    comparable = f"; {sizes_comparable}" if sizes_comparable else ""
    if high < size_low:
        estimate = _log(fresh.estimate) * target.direction
        if estimate <= 0:
            return "target excluded", (
                f"the whole CI falls short of the {band}: {ci}; the target's size is excluded, but the estimate "
                f"lies at or past no change, so no effect in the source's direction is shown{comparable}"
            )
        if low > no_effect:
            shown = "an effect in the source's direction, smaller than the target's"
        elif low > 0:
            shown = (
                f"no change is excluded, but the CI reaches into the declared no-effect margin {margin}: "
                "the effect may be negligible"
            )
        else:
            shown = "no change is not excluded (nor is an effect short of the band)"
        return "smaller than the target", f"the whole CI falls short of the {band}: {ci}; {shown}{comparable}"
    if low > size_high:
        return "larger than the target", (
            f"the whole CI lies beyond the {band}: {ci}; an effect in the source's "
            f"direction, larger than the target's{comparable}"
        )
    if low > 0:
        if size_low <= low and high <= size_high:
            return "reproduced", f"the whole CI lies on the source's side of no change and inside the {band}: {ci}"
        negligible = (
            f"; its low end lies within the declared no-effect margin {margin}: a negligible effect is not excluded"
            if low <= no_effect
            else ""
        )
        return "consistent, not pinned", (
            f"the CI lies on the source's side of no change and reaches into the {band} "
            f"without lying wholly inside it: {ci}; "
            f"{band_overlap(fresh.low, fresh.high, fresh.estimate, band_low, band_high)}{negligible}"
        )
    return "inconclusive", f"the CI holds no change and sizes consistent with the target {target.text}: {ci}"


def _log_or_inf(value: float) -> float:
    """The log of a positive value; -inf for 0 or less (an unbounded CI's low end), inf for inf."""
    return math.log(value) if value > 0 else -math.inf


def _share_of_ci(share: float) -> str:
    if share <= 0:
        return "none of the CI"
    if share >= 1:
        return "all of the CI"
    percent = share * 100
    return f"{'under 1%' if percent < 1 else 'over 99%' if percent > 99 else f'{percent:.0f}%'} of the CI"


def band_overlap(low: float, high: float, estimate: float, band_low: float, band_high: float) -> str:
    """How a CI ``[low, high]`` with its point ``estimate`` stands against a band ``[band_low, band_high]``, as one
    clause for a verdict's reason. All five are positive values (ratios, or a level such as a share) compared on the
    log scale; a low end of 0 or an infinite high end is an unbounded CI. The clause says how much of the CI's log
    width lies inside the band (a percentage), whether the estimate lies inside the band or below / above it, and
    whether the CI is wider than the band, narrower than it, or as wide (it says "wider" only when it is), e.g.
    "18% of the CI lies inside the band (log scale), the estimate lies above the band, and the CI is narrower than
    the band (log half-width 0.115 against the band's 0.312)"."""
    lo, hi = _log_or_inf(low), _log_or_inf(high)
    b_lo, b_hi = sorted((_log_or_inf(band_low), _log_or_inf(band_high)))
    width, band_width = hi - lo, b_hi - b_lo
    inside = max(0.0, min(hi, b_hi) - max(lo, b_lo))
    if math.isinf(width):
        shares = "none of the CI" if inside == 0 else "a vanishing share of the CI (it is unbounded)"
    elif width == 0:
        shares = _share_of_ci(1.0 if b_lo <= lo <= b_hi else 0.0)
    else:
        shares = _share_of_ci(inside / width)
    point = _log_or_inf(estimate)
    where = "inside the band" if b_lo <= point <= b_hi else "below the band" if point < b_lo else "above the band"
    if math.isclose(width, band_width, rel_tol=1e-9):
        wide = "as wide as the band"
    else:
        wide = "wider than the band" if width > band_width else "narrower than the band"
    return (
        f"{shares} lies inside the band (log scale), the estimate lies {where}, and the CI is {wide} "
        f"(log half-width {_half(width)} against the band's {_half(band_width)})"
    )


def _half(width: float) -> str:
    return "∞" if math.isinf(width) else f"{width / 2:.3f}"


def _bound(value: float) -> str:
    return "∞" if math.isinf(value) else f"{value:.3g}"


def _no_worse(target: Target, low: float, high: float, ci: str) -> tuple[str, str]:
    """A non-inferiority target: the CI (log scale) against the declared bound on the worse side."""
    bound = math.log(target.no_worse_than)
    if target.direction < 0:  # worse as positive
        low, high, bound = -high, -low, -bound
    if high < bound:
        return "reproduced", (
            f"no worse: the whole CI lies on the good side of the declared bound ×{target.no_worse_than:.3g} ({ci})"
        )
    if low > bound:
        return "opposite effect", (
            f"worse: the whole CI lies past the declared bound ×{target.no_worse_than:.3g} on the worse side ({ci})"
        )
    return "inconclusive", (
        f"cannot tell whether it is no worse than ×{target.no_worse_than:.3g}: the CI reaches past the bound ({ci})"
    )


def level_verdict(
    values, printed: float, tolerance: float, alpha: float, printed_as: str, describe=lambda x: f"{x:.3g}"
) -> tuple[str, str, Interval]:
    """A level (one quantity of one setup's runs, no second condition) against a printed value: the median of the
    per-run values with its order-statistics CI (stats.median_ci, distribution-free); ``reproduced`` when the whole CI
    lies in the declared band ×1/tolerance..×tolerance around the printed value, ``smaller than the target`` /
    ``larger than the target`` when it lies wholly below / above it, ``consistent, not pinned`` when it reaches into
    the band without lying wholly inside it (how much of it does: band_overlap). ``printed_as``: the printed value as
    the reason shows it; ``describe(x)`` formats the others.
    (verdict, reason, interval)"""
    interval = median_ci(values, 1 - alpha)
    low, high = printed / tolerance, printed * tolerance
    shown = (
        f"median {describe(interval.estimate)} [{describe(interval.low)}, {describe(interval.high)}] over "
        f"{len(values)} runs; consistent with about {printed_as}: {describe(low)}..{describe(high)}"
    )
    if math.isnan(interval.low):
        return (
            "inconclusive",
            f"too few runs for a {1 - alpha:.0%} CI of the median ({interval.method}); {shown}",
            interval,
        )
    if low <= interval.low and interval.high <= high:
        return "reproduced", f"the whole CI lies in the band: {shown}", interval
    if interval.high < low:
        return "smaller than the target", f"the whole CI lies below the band: {shown}", interval
    if interval.low > high:
        return "larger than the target", f"the whole CI lies above the band: {shown}", interval
    return (
        "consistent, not pinned",
        f"the CI reaches into the band without lying wholly inside it: {shown}; "
        f"{band_overlap(interval.low, interval.high, interval.estimate, low, high)}",
        interval,
    )


def level_row(
    claim: str,
    setup: str,
    comparison: str,
    found: tuple[str, str, Interval],
    *,
    printed: float,
    tolerance: float,
    alpha: float,
    n: int,
    published_as: tuple[str, str],
    measured: str,
) -> Verdict:
    """The verdict row of a level (``found``: level_verdict's verdict, reason and interval) against a printed value
    (``published_as``: its printed text and quote id); ``measured`` names the per-run quantity whose median it is."""
    verdict, reason, interval = found
    return Verdict(
        claim=claim,
        setup=setup,
        role="claim",
        comparison=comparison,
        verdict=verdict,
        reason=reason,
        printed_in_source=published_as[0],
        source_quotes=published_as[1],
        target_ratio=printed,
        target_provenance="printed",
        fresh_effect=interval.estimate,
        ci_low=interval.low,
        ci_high=interval.high,
        ci_level=f"{1 - alpha:.0%}",
        n_per_condition=str(n),
        margins=f"consistent: ×{1 / tolerance:.3g}..×{tolerance:.3g} of the printed level (declared)",
        band_low=printed / tolerance,
        band_high=printed * tolerance,
        test=f"median of per-run {measured}, {interval.method}; a level against the printed value: no test of a "
        "difference, so no p",
    )
