"""Issue 41 item 1: every figure is readable without telling red from green.

The check: two colours as a deuteranope sees them (Machado et al. 2009, severity 1.0, in linear RGB), CIE76 ΔE
between them (palette.deuteranopia_delta_e). Every colour a figure draws its data in says something different (a
condition, a direction, a reference), so no two of them may be closer than palette.DISTINCT_DELTA_E. The figures
are rendered by the functions the notebooks call, from the published layer and the bundles under traces/."""

import math

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.colors import to_hex, to_rgba
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle

from ticklab import paths
from ticklab.analysis import palette
from ticklab.analysis.captured import find_bundles
from ticklab.analysis.comparisons import measured_runs
from ticklab.analysis.published import load_published
from ticklab.claims import acpi_idle, hpet, hrtick, nohz, pvspinlock
from ticklab.report import summary

SEABORN_RED, SEABORN_GREEN = "#c44e52", "#55a868"  # the pair the figures drew "worse" and "better" in before


def published(claim: str):
    return load_published(paths.published_dir(), claim)


def _over_white(rgba) -> str:
    """The colour a reader sees: a translucent colour blended with the white of the figure."""
    r, g, b, a = rgba
    return to_hex([a * c + (1 - a) for c in (r, g, b)])


def data_colours(fig) -> set[str]:
    """Every colour the figure's data is drawn in (bar faces, lines and markers, points, error bars, spans),
    as seen on white; text, axes, ticks and legends are left out."""
    seen = []
    for ax in fig.axes:
        for patch in ax.patches:
            if patch.get_fill():
                seen.append(patch.get_facecolor())
        for line in ax.lines:
            if line.get_linestyle() not in ("None", "none", "") and line.get_linewidth() > 0:
                seen.append(to_rgba(line.get_color(), line.get_alpha()))
            if line.get_marker() not in (None, "None", "none", ""):
                seen.append(to_rgba(line.get_markerfacecolor(), line.get_alpha()))
        for collection in ax.collections:
            seen += [tuple(c) for c in collection.get_facecolors()] + [tuple(c) for c in collection.get_edgecolors()]
    return {_over_white(c) for c in seen if c[3] > 0}


def assert_deuteranope_tells_every_colour_apart(fig, name: str) -> None:
    colours = data_colours(fig)
    assert len(colours) >= 2, f"{name}: drew fewer than two colours ({colours}); the test looked in the wrong place"
    confused = palette.confusable_for_deuteranopes(colours)
    plt.close(fig)
    assert not confused, (
        f"{name}: a deuteranope sees these less than {palette.DISTINCT_DELTA_E} ΔE apart: "
        + ", ".join(f"{a} and {b} ({d:.1f})" for a, b, d in confused)
    )


# -- the check itself ----------------------------------------------------------------------------------------------


def test_the_simulation_matches_an_independent_implementation():
    """colorspacious 1.1.2 (sRGB1+CVD, deuteranomaly, severity 100, to sRGB1; clipped; to CIELab), run once by hand:
    the Lab values a deuteranope sees for these colours."""
    reference = {
        SEABORN_RED: (52.807, -3.239, 27.084),
        SEABORN_GREEN: (61.139, -2.846, 22.388),
        palette.BLUE: (43.785, 9.495, -44.076),
        palette.ORANGE: (72.95, -6.676, 72.925),
        palette.VERMILLION: (57.995, -5.534, 62.357),
        palette.BLUISH_GREEN: (55.843, -1.284, 9.212),
    }
    for colour, lab in reference.items():
        assert palette.deuteranope_lab(colour) == pytest.approx(lab, abs=0.02), colour


def test_a_grey_looks_the_same_to_a_deuteranope():
    for grey in ("#000000", "#555555", "#999999", "#ffffff"):
        assert palette.deuteranopia_delta_e(grey, grey) == 0
        assert palette.deuteranope_lab(grey)[1:] == pytest.approx((0, 0), abs=0.05)


def test_the_check_fails_for_the_red_and_green_the_figures_used():
    assert palette.deuteranopia_delta_e(SEABORN_RED, SEABORN_GREEN) < palette.DISTINCT_DELTA_E
    assert [(a, b) for a, b, _ in palette.confusable_for_deuteranopes([SEABORN_RED, SEABORN_GREEN])] == [
        (SEABORN_GREEN, SEABORN_RED)
    ]
    # with normal colour vision the two are far apart: it is the simulation that brings them together
    assert (
        np.linalg.norm(
            palette._cielab(palette._linear(np.array(matplotlib.colors.to_rgb(SEABORN_RED))))
            - palette._cielab(palette._linear(np.array(matplotlib.colors.to_rgb(SEABORN_GREEN))))
        )
        > 60
    )


def test_the_eight_okabe_ito_colours_pass_the_check():
    assert len(palette.OKABE_ITO) == 8
    assert palette.confusable_for_deuteranopes(palette.OKABE_ITO) == []


def test_the_palettes_named_roles_pass_the_check():
    roles = [
        palette.BASELINE,
        palette.CHANGED,
        palette.THIRD,
        palette.CLAIMED_DIRECTION,
        palette.OPPOSITE_DIRECTION,
        palette.GREY,
        palette.BLACK,
    ]
    assert len(set(roles)) == len(roles)
    assert palette.confusable_for_deuteranopes(roles) == []


def test_the_figure_check_finds_red_and_green_bars():
    fig, ax = plt.subplots()
    ax.bar([0, 1], [1, 2], color=[SEABORN_RED, SEABORN_GREEN])
    with pytest.raises(AssertionError, match="#55a868 and #c44e52"):
        assert_deuteranope_tells_every_colour_apart(fig, "red and green bars")


# -- the ratio figure: a log axis centred on ×1, bars drawn from ×1 -----------------------------------------------


def effects_figure():
    return summary.effects_figure(summary.published_effects(paths.published_dir()))


def test_the_effects_figure_puts_ratios_on_a_log_axis_centred_on_x1():
    fig = effects_figure()
    [ax] = fig.axes
    assert ax.get_xscale() == "log"
    low, high = ax.get_xlim()
    assert math.sqrt(low * high) == pytest.approx(1.0), (low, high)  # as far below ×1 as above, on the log scale
    fig.canvas.draw()
    assert "×1" in [t.get_text() for t in ax.get_xticklabels()]
    assert any(
        isinstance(line, Line2D) and set(np.asarray(line.get_xdata(), dtype=float)) == {1.0} for line in ax.lines
    )
    plt.close(fig)


def _effects_bars():
    """The published effects, their figure, its axes and its bars top to bottom."""
    effects = summary.published_effects(paths.published_dir())
    fig = summary.effects_figure(effects)
    [ax] = fig.axes
    return effects, fig, ax, sorted((p for p in ax.patches if isinstance(p, Rectangle)), key=lambda p: p.get_y())


def test_each_effect_bar_runs_from_x1_to_its_ratio_so_halving_and_doubling_look_the_same_size():
    effects, fig, ax, bars = _effects_bars()
    assert len(bars) == len(effects)
    fig.canvas.draw()
    per_log_unit = []
    for bar, ratio in zip(bars, effects["ratio"], strict=True):
        ends = sorted((bar.get_x(), bar.get_x() + bar.get_width()))
        assert ends == pytest.approx(sorted((1.0, ratio))), (ends, ratio)
        left, right = (ax.transData.transform((x, bar.get_y()))[0] for x in ends)
        per_log_unit.append((right - left) / abs(math.log(ratio)))
    assert max(per_log_unit) == pytest.approx(min(per_log_unit), rel=1e-6)  # length ∝ |log ratio|
    plt.close(fig)


def test_the_effects_figure_says_better_or_worse_without_colour():
    effects, fig, ax, bars = _effects_bars()
    better = [(r.ratio > 1) == (r.better == "higher") for r in effects.itertuples()]
    assert set(better) == {True, False}  # the bundled data has both, so the test sees both cues
    hatches = {
        b: {bar.get_hatch() for bar, is_better in zip(bars, better, strict=True) if is_better == b}
        for b in (True, False)
    }
    assert len(hatches[True]) == len(hatches[False]) == 1 and hatches[True] != hatches[False]
    words = [t.get_text() for t in ax.texts]
    assert sum("better" in w for w in words) == better.count(True)
    assert sum("worse" in w for w in words) == better.count(False)
    plt.close(fig)


def test_the_build_time_figure_hatches_after_and_not_before():
    fig = pvspinlock.build_time_figure(published("pvspinlock"))
    [ax] = fig.axes
    by_colour = {}
    for bar in ax.patches:
        by_colour.setdefault(to_hex(bar.get_facecolor()), set()).add(bar.get_hatch())
    assert by_colour == {palette.BASELINE.lower(): {None}, palette.CHANGED.lower(): {palette.CHANGED_HATCH}}
    plt.close(fig)


# -- every figure the notebooks draw -------------------------------------------------------------------------------

PUBLISHED_FIGURES = {
    "summary: published_effects": effects_figure,
    "pvspinlock: kernel_build_time": lambda: pvspinlock.build_time_figure(published("pvspinlock")),
    "hpet: aim7_throughput": lambda: hpet.throughput_figure(published("hpet")),
    "hpet: read_hpet_profile": lambda: hpet.profile_figure(published("hpet")),
    "hrtick: runtime_and_reprogramming": lambda: hrtick.runtime_and_reprogramming_figure(published("hrtick")),
    "acpi-idle: tbench_summary": lambda: acpi_idle.tbench_summary_figure(published("acpi-idle")),
    "nohz: tick_overhead_vs_hz": lambda: nohz.tick_overhead_figure(published("nohz")),
}


@pytest.mark.parametrize("name", PUBLISHED_FIGURES)
def test_a_deuteranope_tells_apart_every_colour_of_a_published_figure(name):
    assert_deuteranope_tells_every_colour_apart(PUBLISHED_FIGURES[name](), name)


def fresh(claim, module):
    bundles = find_bundles(paths.repo_root() / "traces", claim)
    runs, _ = measured_runs(bundles, module.CHECKS, claim)
    return bundles, runs


def fresh_figures(claim: str):
    """(name, figure) for every fresh figure of ``claim``'s notebook, per setup, as the notebook makes them."""
    if claim == "pvspinlock":
        _, runs = fresh(claim, pvspinlock)
        for setup in sorted(runs.loc[runs["metric"] == pvspinlock.METRIC, "host_id"].unique()):
            yield f"build_time__{setup}", pvspinlock.fresh_build_time_figure(runs, setup)
    elif claim == "hpet":
        bundles, runs = fresh(claim, hpet)
        for setup in sorted(runs.loc[runs["metric"] == "jobs_per_min", "host_id"].unique()):
            yield f"timejobs_jobs_per_min__{setup}", hpet.fresh_jobs_figure(runs, setup)
        points = hpet.read_rate_points(runs, hpet.condition_values(bundles))
        for setup in sorted(points["host_id"].unique()):
            yield f"read_rate_vs_threads__{setup}", hpet.read_rate_figure(points, setup)
    elif claim == "hrtick":
        _, runs = fresh(claim, hrtick)
        table = hrtick.fresh_table(runs, published("hrtick"))
        for setup in sorted(table.index.get_level_values("host_id").unique() if not table.empty else []):
            yield f"runtime_and_reprogramming__{setup}", hrtick.fresh_figure(runs, setup, published("hrtick"))
    elif claim == "nohz":
        samples = nohz.fresh_ftq(find_bundles(paths.repo_root() / "traces", claim))
        for setup in sorted(samples["host_id"].unique()):
            yield f"ftq_sorted__{setup}", nohz.ftq_sorted_figure(samples, setup)
            yield f"tick_spectrum__{setup}", nohz.tick_spectrum_figure(nohz.tick_spectrum(samples, setup), setup)


# nohz reads every FTQ sample of eight bundles (seconds): slow
@pytest.mark.parametrize("claim", ["pvspinlock", "hpet", "hrtick", pytest.param("nohz", marks=pytest.mark.slow)])
def test_a_deuteranope_tells_apart_every_colour_of_a_fresh_figure_from_the_bundled_data(claim):
    made = 0
    for name, fig in fresh_figures(claim):
        # a setup that ran one condition draws one colour: nothing there to confuse
        if len(data_colours(fig)) >= 2:
            assert_deuteranope_tells_every_colour_apart(fig, f"{claim}: {name}")
            made += 1
        plt.close(fig)
    assert made, f"{claim}: the bundled data made no fresh figure with two conditions"


def test_the_nohz_conditions_are_told_apart_by_line_style_too():
    """Lines have no hatch: each condition of a setup has its own line style (tick stopped dashed), so the legend
    reads without colour."""
    assert set(nohz.CONDITION_STYLES) == set(nohz.CONDITION_COLORS)
    for condition, style in nohz.CONDITION_STYLES.items():
        assert (style == "--") == ("nohz" in condition), condition
    for together in (("tick-on", "nohz-full"), ("hz1000", "hz250", "hz1000-nohz_full")):  # the bundles' setups
        assert len({nohz.CONDITION_STYLES[c] for c in together}) == len(together)
