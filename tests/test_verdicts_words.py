"""One test per word ``decide`` can return (and ``_no_worse``'s non-inferiority outcomes), each on a CI of known
geometry against the consistent-size band, asserting the word and the facts its reason must state (issue 44 item 4:
"consistent, not pinned" said "wider than the band" of CIs that were narrower)."""

import math

import pytest

from ticklab.analysis.stats import Interval
from ticklab.analysis.verdicts import Margins, Target, band_overlap, consistent_band, decide

UP = Target(1.2, 1, "derived: a test's", "x", ())  # band ×1.157..×1.256
DOWN = Target(0.25, -1, "derived: a test's", "x", ())  # band ×0.177..×0.330
DIRECTION = Target(None, 1, "derived: a test's", "higher", ())
NO_WORSE = Target(None, 1, "derived: a test's", "no regression", (), no_worse_than=1.05)
M = Margins(no_effect=0.02)  # ±2 %, tolerance 1.25
UP_BAND = consistent_band(UP, M.size_tolerance)
DOWN_BAND = consistent_band(DOWN, M.size_tolerance)


def ci(estimate, low, high):
    return Interval(estimate, low, high, 0.95, "test")


def log_half(low, high):
    return (math.log(high) - math.log(low)) / 2


def share_inside(low, high, band):
    """The share of the CI's log width inside the band, as the reason rounds it."""
    inside = min(math.log(high), math.log(band[1])) - max(math.log(low), math.log(band[0]))
    return f"{max(inside, 0) / (math.log(high) - math.log(low)):.0%}"


def test_the_bands_are_what_the_cases_assume():
    assert UP_BAND == pytest.approx((math.exp(math.log(1.2) / 1.25), math.exp(math.log(1.2) * 1.25)))
    assert f"×{UP_BAND[0]:.3g}..×{UP_BAND[1]:.3g}" == "×1.16..×1.26"
    assert f"×{DOWN_BAND[0]:.3g}..×{DOWN_BAND[1]:.3g}" == "×0.177..×0.33"


def test_reproduced_the_whole_ci_on_the_sources_side_and_inside_the_band():
    verdict, reason = decide(UP, ci(1.20, 1.18, 1.23), 0.001, M)
    assert UP_BAND[0] < 1.18 and 1.23 < UP_BAND[1]
    assert verdict == "reproduced"
    assert "the whole CI lies on the source's side of no change and inside the consistent sizes ×1.16..×1.26" in reason
    assert "ratio 1.2 [1.18, 1.23]" in reason


def test_reproduced_for_a_direction_target_the_whole_ci_on_the_sources_side():
    verdict, reason = decide(DIRECTION, ci(1.10, 1.05, 1.15), 0.001, M)
    assert (
        verdict == "reproduced"
        and "the whole CI lies on the source's side of no change and clear of the declared no-effect margin "
        "×0.98..×1.02, which is all the source states"
        in reason
    )


def test_consistent_not_pinned_a_ci_narrower_than_the_band_straddling_its_upper_edge():
    """The Intel HZ=250 case in miniature: a CI narrower than the band that reaches across its edge, its estimate
    outside. The reason must not call it wider, and must say how much of it lies inside and where the estimate is."""
    low, high = 1.24, 1.30
    assert low < UP_BAND[1] < high and log_half(low, high) < log_half(*UP_BAND)
    verdict, reason = decide(UP, ci(1.27, low, high), 0.001, M)
    assert verdict == "consistent, not pinned"
    assert "wider" not in reason
    assert "the CI is narrower than the band" in reason
    assert f"{share_inside(low, high, UP_BAND)} of the CI lies inside the band (log scale)" in reason
    assert share_inside(low, high, UP_BAND) == "27%"
    assert "the estimate lies above the band" in reason
    assert f"log half-width {log_half(low, high):.3f} against the band's {log_half(*UP_BAND):.3f}" in reason
    assert "reaches into the consistent sizes ×1.16..×1.26" in reason


def test_consistent_not_pinned_the_hz250_timer_share_row_against_a_quarter():
    """The review's row: ×0.353 [0.317, 0.399] against ×0.25 (band ×0.177..×0.330), half-width 0.115 vs 0.312."""
    low, high = 0.317, 0.399
    verdict, reason = decide(DOWN, ci(0.353, low, high), 0.001, Margins(no_effect=0.10))
    assert verdict == "consistent, not pinned" and "wider" not in reason
    assert f"{share_inside(low, high, DOWN_BAND)} of the CI lies inside the band" in reason
    assert share_inside(low, high, DOWN_BAND) in ("17%", "18%")
    assert "the estimate lies above the band" in reason and "the CI is narrower than the band" in reason
    assert "log half-width 0.115 against the band's 0.312" in reason


def test_consistent_not_pinned_a_ci_wider_than_the_band_holding_it():
    low, high = 1.10, 1.35
    assert low < UP_BAND[0] and UP_BAND[1] < high
    verdict, reason = decide(UP, ci(1.20, low, high), 0.001, M)
    assert verdict == "consistent, not pinned"
    assert "the CI is wider than the band" in reason and "the estimate lies inside the band" in reason
    expected = (math.log(UP_BAND[1]) - math.log(UP_BAND[0])) / (math.log(high) - math.log(low))
    assert f"{expected:.0%} of the CI lies inside the band" in reason and f"{expected:.0%}" == "40%"


def test_consistent_not_pinned_below_a_falling_band_names_the_side_in_ratios():
    """A falling target: a narrow CI across the band's low end, its estimate below the band (a larger effect)."""
    low, high = 0.15, 0.19
    assert low < DOWN_BAND[0] < high and log_half(low, high) < log_half(*DOWN_BAND)
    verdict, reason = decide(DOWN, ci(0.16, low, high), 0.001, M)
    assert verdict == "consistent, not pinned"
    assert "the estimate lies below the band" in reason and "the CI is narrower than the band" in reason
    assert f"{share_inside(low, high, DOWN_BAND)} of the CI lies inside the band" in reason


def test_smaller_than_the_target_the_whole_ci_short_of_the_band():
    verdict, reason = decide(UP, ci(1.05, 1.03, 1.07), 0.01, M)
    assert 1.07 < UP_BAND[0] and verdict == "smaller than the target"
    assert "the whole CI falls short of the consistent sizes ×1.16..×1.26" in reason
    assert "an effect in the source's direction, smaller than the target's" in reason
    verdict, reason = decide(UP, ci(1.03, 0.99, 1.07), 0.3, M)
    assert verdict == "smaller than the target" and "no change is not excluded" in reason


def test_larger_than_the_target_the_whole_ci_beyond_the_band():
    verdict, reason = decide(UP, ci(1.35, 1.30, 1.40), 0.001, M, "our workload sets the size")
    assert 1.30 > UP_BAND[1] and verdict == "larger than the target"
    assert "the whole CI lies beyond the consistent sizes ×1.16..×1.26" in reason
    assert "larger than the target's" in reason and reason.endswith("our workload sets the size")


def test_opposite_effect_the_whole_ci_on_the_other_side_of_no_change():
    verdict, reason = decide(UP, ci(0.85, 0.80, 0.90), 0.001, M)
    assert verdict == "opposite effect" and "the whole CI lies on the other side of no change" in reason
    assert decide(DOWN, ci(1.2, 1.1, 1.3), 0.001, M)[0] == "opposite effect"


def test_no_effect_shown_the_whole_ci_inside_the_declared_margin():
    verdict, reason = decide(UP, ci(1.0, 0.99, 1.015), 0.7, M)
    assert (
        verdict == "no effect shown" and "the whole CI lies within the declared no-effect margin ×0.98..×1.02" in reason
    )
    # one end past the margin: not shown
    assert decide(UP, ci(1.0, 0.97, 1.015), 0.7, M)[0] != "no effect shown"


def test_inconclusive_the_ci_holds_no_change_and_the_band():
    verdict, reason = decide(UP, ci(1.10, 0.95, 1.25), 0.2, M)
    assert 0.95 < 1 < UP_BAND[0] < 1.25 and verdict == "inconclusive"
    assert "the CI holds no change and sizes consistent with the target ×1.2" in reason
    verdict, reason = decide(DIRECTION, ci(1.05, 0.95, 1.15), 0.3, M)
    assert verdict == "inconclusive" and "the CI holds no change and the source's direction" in reason


@pytest.mark.parametrize(
    "interval, verdict, words",
    [
        (
            ci(1.00, 0.97, 1.04),
            "reproduced",
            "no worse: the whole CI lies on the good side of the declared bound ×1.05",
        ),
        (
            ci(1.10, 1.07, 1.15),
            "opposite effect",
            "worse: the whole CI lies past the declared bound ×1.05 on the worse side",
        ),
        (
            ci(1.03, 1.00, 1.07),
            "inconclusive",
            "cannot tell whether it is no worse than ×1.05: the CI reaches past the bound",
        ),
    ],
)
def test_non_inferiority_against_the_declared_bound(interval, verdict, words):
    got, reason = decide(NO_WORSE, interval, 0.05, M)
    assert got == verdict and words in reason


def test_band_overlap_states_share_estimate_side_and_width_in_any_geometry():
    band = (2.0, 4.0)  # log half-width ln 2 / 2
    inside = band_overlap(2.5, 3.5, 3.0, *band)
    assert inside.startswith("all of the CI lies inside the band") and "the estimate lies inside the band" in inside
    assert "the CI is narrower than the band" in inside
    apart = band_overlap(5.0, 6.0, 5.5, *band)
    assert apart.startswith("none of the CI") and "the estimate lies above the band" in apart
    same = band_overlap(2 * math.sqrt(2), 4 * math.sqrt(2), 4.5, *band)  # half of it past the band's high end
    assert "the CI is as wide as the band" in same and "wider" not in same
    assert "50% of the CI" in same and "the estimate lies above the band" in same
    assert "the estimate lies below the band" in band_overlap(1.5, 2.5, 1.8, *band)
    wide = band_overlap(1.0, 8.0, 3.0, *band)
    assert "33% of the CI" in wide and "the CI is wider than the band" in wide
    unbounded = band_overlap(0.0, math.inf, 3.0, *band)
    assert "a vanishing share of the CI (it is unbounded)" in unbounded and "log half-width ∞" in unbounded
    assert band_overlap(1.0, 2.005, 1.5, *band).startswith("under 1% of the CI")
    # the band's ends may come in either order; a level (a share, not a ratio) works the same way
    assert band_overlap(0.22, 0.27, 0.24, 0.3125, 0.2) == band_overlap(0.22, 0.27, 0.24, 0.2, 0.3125)


# Issue 52 item 2: words that say no more than the CI shows.
def test_target_excluded_a_ci_short_of_the_band_with_its_estimate_past_no_change():
    # hrtick's reprograms/s row on the busy Intel guest: ×1.02 [0.54, 1.87] against the printed ×0.04 (fewer)
    target = Target(0.04, -1, "derived: a test's", "2500/s -> 100/s", ())
    verdict, reason = decide(target, ci(1.02, 0.54, 1.87), 0.9, Margins(no_effect=0.10))
    assert verdict == "target excluded"
    assert "the target's size is excluded" in reason
    assert "no effect in the source's direction is shown" in reason
    assert "smaller" not in reason


def test_target_excluded_when_the_estimate_is_exactly_no_change():
    verdict, _ = decide(UP, ci(1.0, 0.9, 1.1), 0.9, M)
    assert verdict == "target excluded"


def test_smaller_than_the_target_needs_the_estimate_on_the_sources_side():
    # the series row on the busy Intel guest: ×1.45 [0.752, 3.27] against ×0.573 (faster): the estimate is slower
    target = Target(0.573, -1, "derived: a test's", "0.840 s -> 0.481 s", ())
    verdict, reason = decide(target, ci(1.45, 0.752, 3.27), 0.9, Margins(no_effect=0.05))
    assert verdict != "smaller than the target"
    verdict, reason = decide(UP, ci(1.03, 0.99, 1.08), 0.2, M)
    assert verdict == "smaller than the target" and "no change is not excluded" in reason


def test_an_effect_in_the_sources_direction_never_when_the_ci_reaches_into_the_no_effect_margin():
    # the HZ=250 FTQ row on the Intel guest: low end ×1.002 inside the declared ±1 %
    target = Target(1.065, 1, "derived: a test's", "80 µs per tick", ())
    verdict, reason = decide(target, ci(1.03, 1.002, 1.05), 0.01, Margins(no_effect=0.01))
    assert verdict == "smaller than the target"
    assert "an effect in the source's direction" not in reason
    assert "reaches into the declared no-effect margin ×0.99..×1.01" in reason
    verdict, reason = decide(target, ci(1.03, 1.015, 1.045), 0.01, Margins(no_effect=0.01))
    assert verdict == "smaller than the target" and "an effect in the source's direction" in reason


def test_a_direction_target_is_not_reproduced_by_a_ci_reaching_into_the_margin():
    verdict, reason = decide(DIRECTION, ci(1.05, 1.01, 1.10), 0.01, M)
    assert verdict == "inconclusive"
    assert "excludes no change but reaches into the declared no-effect margin" in reason


def test_consistent_not_pinned_says_when_its_low_end_is_negligible():
    verdict, reason = decide(UP, ci(1.15, 1.01, 1.3), 0.01, M)
    assert verdict == "consistent, not pinned"
    assert "a negligible effect is not excluded" in reason
    verdict, reason = decide(UP, ci(1.2, 1.1, 1.3), 0.01, M)
    assert verdict == "consistent, not pinned" and "negligible" not in reason


def test_an_opposite_effect_says_when_it_may_be_negligible():
    # the acpi-idle lab analogue: ×1.03 [1.0003, 1.07] against a faster runtime, declared ±2 %
    verdict, reason = decide(
        DIRECTION.__class__(None, -1, "derived: a test's", "faster", ()), ci(1.03, 1.0003, 1.07), 0.05, M
    )
    assert verdict == "opposite effect" and "the opposite effect may be negligible" in reason
    verdict, reason = decide(UP, ci(0.8, 0.7, 0.9), 0.01, M)
    assert verdict == "opposite effect" and "negligible" not in reason
