"""Figure and table defects of issue 31 (item 8): printed numbers at their printed precision, the source's own row
labels, median labels clear of the points they summarise, the FTQ shelf measure and the fresh per-setup figures.
Each test builds its figure or table from the published layer or from a small synthetic frame, in this process."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from ticklab import paths
from ticklab.analysis.outputs import markdown_table, plain_number
from ticklab.analysis.published import load_published


def published(claim: str):
    return load_published(paths.published_dir(), claim)


# -- printed numbers are never rounded (pvspinlock: 17m12.8s = 1032.8 s, not 1033) --------------------------------


@pytest.mark.parametrize(
    "value, shown",
    [
        (1032.8, "1032.8"),
        (974.8, "974.8"),
        (-9.26, "-9.26"),
        (0.23, "0.23"),
        (22448.55, "22448.55"),
        (np.float64(1032.8), "1032.8"),
        (646515.0, "646515"),
        (1.0023328, "1.002"),
        (0.123456, "0.1235"),
    ],
)
def test_a_table_shows_a_short_number_exactly_and_cuts_only_long_arithmetic(value, shown):
    assert plain_number(value) == shown


def test_the_build_time_table_shows_every_printed_time_at_its_printed_precision():
    from ticklab.claims import pvspinlock

    pub = published("pvspinlock")
    text = markdown_table(pvspinlock.build_time_table(pub), index=False)
    raw = pub.table("kernel_build_time")
    for row in raw.itertuples():
        assert row.value_as_printed in text, row.id
        assert f"| {row.value:g} " in text, (row.id, row.value)  # seconds, e.g. 1032.8 for 17m12.8s
    assert "| 1033 " not in text


# -- seed 003's row labels as printed ("AMean Stddev", "AMean CoefVar") -------------------------------------------

PRINTED_ROWS = ["Min (MB/s)", "Max (MB/s)", "Median (MB/s)", "AMean (MB/s)", "AMean Stddev", "AMean CoefVar"]


def test_the_mmtests_table_labels_its_rows_as_seed_003_prints_them():
    from ticklab.claims import acpi_idle

    table = acpi_idle.mmtests_table(published("acpi-idle"))
    assert list(table.index) == PRINTED_ROWS
    assert table.loc["AMean Stddev", "baseline"] == "17526.70"
    assert table.loc["AMean CoefVar", "baseline"] == "78.07%"


def test_those_labels_are_the_source_documents_own(seeds):
    source = next(seeds.glob("003_*.txt")).read_text()
    for label in PRINTED_ROWS:  # each label begins one of the source's table lines, followed by its colon
        assert any(
            line.startswith(label) and line[len(label) :].lstrip().startswith(":") for line in source.splitlines()
        ), label


def test_the_tbench_figure_and_checks_use_the_printed_labels():
    from ticklab.claims import acpi_idle

    pub = published("acpi-idle")
    fig = acpi_idle.tbench_summary_figure(pub)
    [ax] = fig.axes
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert sorted(legend) == ["AMean (MB/s) ± AMean Stddev", "Median (MB/s)", "Min (MB/s) .. Max (MB/s)"]
    assert "AMean Stddev" in ax.get_title() and "printed" in ax.get_title()
    assert {t.get_text() for t in ax.texts} == {"Min 2215.06", "Min 33072.10", "Min 33016.10"}
    quantities = acpi_idle.derived_checks(pub)["quantity"].tolist()
    assert [q for q in quantities if "CoefVar" in q] == [
        f"AMean CoefVar, {k}" for k in ("baseline", "C2 disabled", "patch")
    ]
    plt.close(fig)


# -- median labels never cover a run -------------------------------------------------------------------------------


def assert_median_labels_clear_every_point(fig) -> list[str]:
    """Every "median" text of every axes lies wholly outside every plotted point (its marker's radius included);
    returns the label texts."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    texts = []
    for ax in fig.axes:
        labels = [t for t in ax.texts if t.get_text().startswith("median")]
        points = [
            (line, ax.transData.transform(np.asarray(line.get_xydata(), dtype=float)))
            for line in ax.lines
            if line.get_marker() == "o"
        ]
        assert labels and points, ax
        for text in labels:
            box = text.get_window_extent(renderer)
            for line, xy in points:
                radius = line.get_markersize() * fig.dpi / 72 / 2
                inside = (
                    (xy[:, 0] > box.x0 - radius)
                    & (xy[:, 0] < box.x1 + radius)
                    & (xy[:, 1] > box.y0 - radius)
                    & (xy[:, 1] < box.y1 + radius)
                )
                assert not inside.any(), (text.get_text(), xy[inside])
            texts.append(text.get_text())
    return texts


def synthetic_runs(values: dict[str, list[float]], metric: str, setup: str = "host-a", **extra) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "host_id": setup,
                "bundle": f"/b/{setup}",
                "experiment": extra.get("experiment", "x"),
                "kernel": extra.get("kernel", "6.12.117-ticklab"),
                "run": f"{condition}-{i}",
                "condition": condition,
                "metric": metric,
                "value": value,
                "unit": "",
            }
            for condition, series in values.items()
            for i, value in enumerate(series)
        ]
    )


def test_hrtick_fresh_figure_writes_medians_above_the_runs_not_over_them():
    from ticklab.claims import hrtick

    # the audit's case: a median (2.782) level with the next condition's points, which a label beside the bar covered
    runtime = {
        "6.12 hrtick-off": [2.70, 2.782, 2.79, 2.85],
        "6.12 hrtick-on": [2.76, 2.78, 2.80, 2.784],
        "7.2 hrtick-off": [2.60, 2.79, 2.781, 3.1],
        "7.2 hrtick-on": [2.782, 2.5, 2.9, 2.783],
    }
    reprograms = {c: [2400 + 50 * i for i in range(4)] for c in runtime}
    runs = pd.concat([synthetic_runs(runtime, "runtime_s"), synthetic_runs(reprograms, hrtick.REPROGRAMS)])
    fig = hrtick.fresh_figure(runs, "host-a", published("hrtick"))
    labels = assert_median_labels_clear_every_point(fig)
    assert "median\n2.782" in labels and "median\n2.785" in labels and "median\n2,475" in labels
    assert "fresh, 16 runs" in fig._suptitle.get_text()
    assert [ax.get_ylabel() for ax in fig.axes] == [
        "hackbench runtime (s)",
        "clockevent reprograms per second\n(counted, all: the tick's included)",
    ]
    plt.close(fig)


# -- seed 004's FTQ shelves, measured --------------------------------------------------------------------------------


def test_the_largest_shelf_is_the_densest_window_of_20_iterations():
    from ticklab.claims import nohz

    # windows of 20 iterations: [1000, 1020] holds 6 counts, [1005, 1025] and [1010, 1030] hold 7; a tick-hit tail below
    counts = [1000, 1005, 1010, 1015, 1020, 1020, 1021, 1025, 1030, 900, 850, 10]
    shelf = nohz.largest_shelf(counts)
    assert (shelf["quanta"], shelf["in_shelf"]) == (12, 7)
    assert (shelf["low"], shelf["high"]) == (1005, 1025)  # the lower of the two densest windows
    assert shelf["share"] == 7 / 12 and shelf["median"] == 1012.5
    # a window's width is max − min ≤ 20: 21 apart never share a shelf
    assert nohz.largest_shelf([0, 21])["in_shelf"] == 1 and nohz.largest_shelf([0, 20])["in_shelf"] == 2
    # ties go to the lowest window
    assert nohz.largest_shelf([0, 5, 100, 105])["low"] == 0
    with pytest.raises(ValueError):
        nohz.largest_shelf([])


def test_the_shelf_table_quotes_the_source_and_measures_each_condition():
    from ticklab.claims import nohz

    rows = []
    for run in ("r1", "r2", "r3"):
        flat = [700 + (i % 11) for i in range(80)] + [600] * 20  # 80 % within 10 iterations
        ragged = [
            600 + 25 * (i % 8) for i in range(100)
        ]  # steps of 25: one level per 20-wide window, 13 quanta at most
        rows += [
            {
                "host_id": "h",
                "bundle": "b",
                "run": f"{run}-{c}",
                "condition": c,
                "quantum_ns": 100000,
                "index": i,
                "count": v,
                "source": "s",
            }
            for c, series in (("hz1000-nohz_full", flat), ("hz1000", ragged))
            for i, v in enumerate(series)
        ]
    table = nohz.ftq_shelf_table(pd.DataFrame(rows), published("nohz")).set_index("condition")
    source = table.loc["nohz hack (tick off)"]
    assert source["largest shelf (% of quanta, median over runs)"] == "more than half (as printed)"
    assert source["shelf window (iterations)"] == "within ~20 iterations of each other (as printed)"
    assert source["measured by"].startswith("seed 004") and "published" not in " ".join(map(str, table.columns))
    off = table.loc["HZ=1000, nohz_full (tick stopped)"]
    assert off["largest shelf (% of quanta, median over runs)"] == 80.0 and off["runs"] == 3
    assert off["runs with more than half in one shelf"] == "3 of 3" and off["quantum (µs)"] == "100"
    on = table.loc["HZ=1000, tick on"]
    assert (
        on["largest shelf (% of quanta, median over runs)"] == 13.0
        and on["runs with more than half in one shelf"] == "0 of 3"
    )
    assert "not a published threshold" in nohz.SHELF_CAPTION and "quantum" in nohz.SHELF_CAPTION


def test_the_shelf_statement_is_quoted_verbatim(seeds):
    from ticklab.claims import nohz

    source = " ".join(next(seeds.glob("004_*.txt")).read_text().split())
    assert nohz.SHELF_STATEMENT in source


def test_the_shelf_table_is_a_declared_output_of_notebook_05():
    from ticklab.claims import nohz

    assert "ftq_shelf" in nohz.CLAIM.outputs["tables"]


def test_without_fresh_runs_the_shelf_table_still_holds_the_sources_statement():
    from ticklab.claims import nohz

    table = nohz.ftq_shelf_table(nohz.fresh_ftq([]), published("nohz"))
    assert len(table) == 1 and table["measured by"].iloc[0].startswith("seed 004")


# -- fresh per-setup figures: pvspinlock build times, hpet jobs/min --------------------------------------------------


def test_the_pvspinlock_fresh_figure_shows_every_build_and_names_the_lab_build():
    from ticklab.claims import pvspinlock

    times = {
        pvspinlock.condition_name(k, level): [30.0 + k + i for i in range(4)]
        for level in pvspinlock.LEVELS
        for k in pvspinlock.KICK_AHEAD
    }
    vcpus = {condition: [2.0] * 4 for condition in times}
    runs = pd.concat(
        [
            synthetic_runs(times, pvspinlock.METRIC, experiment=pvspinlock.EXPERIMENT),
            synthetic_runs(vcpus, "guest_vcpus", experiment=pvspinlock.EXPERIMENT),
        ]
    )
    fig = pvspinlock.fresh_build_time_figure(runs, "host-a")
    [ax] = fig.axes
    assert (
        pvspinlock.LAB_LABEL in ax.get_title()
        and "synthetic tcc build (480 files), not a kernel build" in ax.get_title()
    )
    assert "fresh, 24 runs" in ax.get_title()
    assert ax.get_ylabel().startswith("build time (s)")
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    assert ticks[0] == "pv_kick_ahead=0\n1x host CPUs\n(2 vCPUs)" and len(ticks) == 6
    assert sum(len(line.get_xdata()) for line in ax.lines if line.get_marker() == "o") == 24
    labels = assert_median_labels_clear_every_point(fig)
    assert labels.count("median\n31.50 s") == 3 and labels.count("median\n35.50 s") == 3
    plt.close(fig)


def test_the_hpet_fresh_figure_shows_jobs_per_min_per_clocksource():
    from ticklab.claims import hpet

    jobs = {
        "hpet-sharing": [520000.0, 530000.0, 510000.0],
        "tsc": [1.8e6, 1.7e6, 1.9e6],
        "hpet-no-sharing": [500000.0, 505000.0, 498000.0],
    }
    fig = hpet.fresh_jobs_figure(synthetic_runs(jobs, "jobs_per_min", experiment="guest-timejobs"), "host-a")
    [ax] = fig.axes
    assert [t.get_text() for t in ax.get_xticklabels()] == [
        "TSC\n(tsc)",
        "HPET w/o sharing\n(hpet-no-sharing)",
        "HPET with sharing\n(hpet-sharing)",
    ]
    assert ax.get_ylabel() == "timejobs throughput (jobs/min)" and "fresh, 9 runs" in ax.get_title()
    assert assert_median_labels_clear_every_point(fig) == ["median\n1,800,000", "median\n500,000", "median\n520,000"]
    plt.close(fig)
