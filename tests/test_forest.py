"""Forest plots of verdict rows (issue 29): a panel per comparison, a line per setup, the target's provenance in its
line style, unbounded CIs as arrows, premise and level rows apart, and every setup without a line listed with why."""

import json
import math
from datetime import UTC, datetime

import matplotlib
import numpy as np
import pandas as pd
import pytest
from matplotlib.text import Annotation

from ticklab.analysis.captured import find_bundles
from ticklab.analysis.comparisons import Comparison, claim_verdicts
from ticklab.analysis.forest import VERDICT_COLOURS, forest_figure, forest_table, save_forest
from ticklab.analysis.verdicts import VERDICT_COLUMNS, Margins, Target, Verdict
from ticklab.bundle import BundleWriter

matplotlib.use("Agg")

HOST, GUEST, FLEET = "host-a", "guest-tcg-2vcpu-6.12-on-host-a", "fleet-c"
PRINTED = Target(0.8, -1, "printed", "20 % faster", ("x/t/1",))
DERIVED = Target(1.1, 1, "derived: a ratio of two printed values", "+10 %", ("x/t/2",))
MARGINS = Margins(no_effect=0.02)


def _row(
    setup,
    comparison,
    verdict,
    target,
    *,
    role="claim",
    effect=None,
    low=None,
    high=None,
    n="6 vs 6",
    p=0.01,
    reason="the CI says so",
):
    band = (
        (None, None)
        if target is None or target.ratio is None
        else tuple(sorted((math.exp(math.log(target.ratio) / 1.25), math.exp(math.log(target.ratio) * 1.25))))
    )
    return Verdict(
        claim="x",
        setup=setup,
        comparison=comparison,
        verdict=verdict,
        reason=reason,
        role=role,
        target_ratio=None if target is None else target.ratio,
        target_provenance="" if target is None else target.provenance,
        fresh_effect=effect,
        ci_low=low,
        ci_high=high,
        ci_level="95%",
        p_holm=None if effect is None else p,
        n_per_condition=n,
        no_effect_margin=None if target is None else 0.02,
        band_low=band[0],
        band_high=band[1],
    ).as_row()


def synthetic_rows() -> pd.DataFrame:
    runtime, work = "treatment vs baseline: runtime", "treatment vs baseline: work"
    rows = [
        _row(HOST, runtime, "reproduced", PRINTED, effect=0.79, low=0.75, high=0.83),
        _row(
            GUEST,
            runtime,
            "inconclusive",
            PRINTED,
            effect=0.9,
            low=0.0,
            high=math.inf,
            n="2 vs 2",
            reason="unbounded: too few runs for a bounded CI",
        ),
        _row(FLEET, runtime, "smaller than the target", PRINTED, effect=0.95, low=0.93, high=0.97),
        _row(HOST, work, "consistent, not pinned", DERIVED, effect=1.12, low=1.03, high=1.25),
        _row(GUEST, work, "no effect shown", DERIVED, effect=1.0, low=0.99, high=1.01),
        _row(FLEET, work, "inconclusive", DERIVED, n="1 vs 3", reason="too few runs: 1 vs 3 measured"),
        _row(
            HOST,
            "premise: the feature is on",
            "opposite effect",
            DERIVED,
            role="premise",
            effect=0.9,
            low=0.85,
            high=0.95,
        ),
        Verdict(
            claim="x",
            setup=GUEST,
            comparison="a level, beside ~25 %",
            verdict="smaller than the target",
            reason="below the band",
            target_ratio=0.25,
            target_provenance="printed",
            fresh_effect=0.1,
            ci_low=0.09,
            ci_high=0.12,
            n_per_condition="12",
            band_low=0.2,
            band_high=0.3125,
        ).as_row(),
        _row(
            "guest-tcg-x, host-z",
            "the claim",
            "not testable here",
            None,
            reason="guest-tcg-x: no x bundle from this setup | host-z: x: no driver to switch",
        ),
    ]
    return pd.DataFrame(rows, columns=VERDICT_COLUMNS)


def _panels(fig):
    return [ax for ax in fig.axes if ax.get_xscale() == "log"]


def _labels(ax):
    return [t.get_text().replace("\n", "") for t in ax.get_yticklabels()]


def test_a_panel_per_comparison_a_line_per_setup_and_the_target_in_its_provenance_style():
    fig = forest_figure(synthetic_rows())
    runtime, work, level, premise = _panels(fig)
    assert _labels(runtime) == [HOST, GUEST, FLEET]
    assert _labels(work) == [HOST, GUEST]  # the fleet host has no CI for it: listed under the panel instead
    assert _labels(level) == [GUEST] and "level itself" in level.get_xlabel()
    assert _labels(premise) == [HOST]
    targets = {ax: [line for line in ax.lines if line.get_label().startswith("target")] for ax in (runtime, work)}
    [printed], [derived] = targets[runtime], targets[work]
    assert printed.get_linestyle() == "-" and printed.get_xdata()[0] == pytest.approx(0.8)
    assert derived.get_linestyle() == "--" and derived.get_xdata()[0] == pytest.approx(1.1)
    # the CI bar is drawn in its verdict's colour; the verdict word, the numbers and n sit at the right of each line
    words = [t.get_text() for t in runtime.texts if not isinstance(t, Annotation)]
    assert words[0].startswith("reproduced\n×0.79 [0.75, 0.83], n 6 vs 6")
    assert words[1].startswith("inconclusive\n×0.9 [—, ∞]") or words[1].startswith("inconclusive\n×0.9 [0, ∞]")
    bars = runtime.collections
    assert matplotlib.colors.to_hex(bars[0].get_color()[0]) == VERDICT_COLOURS["reproduced"].lower()
    # the unbounded CI: arrows from the estimate to both edges of the axis
    arrows = [t for t in runtime.texts if isinstance(t, Annotation)]
    low, high = runtime.get_xlim()
    assert sorted(a.xy[0] for a in arrows) == pytest.approx([low, high])
    # the no-effect margin is shaded around ×1 and the band around the target
    spans = [p.get_x() for p in runtime.patches]
    assert any(x == pytest.approx(1 / 1.02) for x in spans)
    assert any(x == pytest.approx(math.exp(math.log(0.8) * 1.25)) for x in spans)
    # premise rows come after a header of their own, and every setup without a line is listed with its reason
    text = "\n".join(t.get_text() for t in fig.texts)
    assert text.index("Premise rows") < text.index("premise: the feature is on")
    assert "fleet-c — inconclusive: too few runs: 1 vs 3 measured" in text
    assert "no x bundle from this setup: guest-tcg-x" in text and "x: no driver to switch: host-z" in text
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert {
        "target printed in the source",
        "target derived by ticklab",
        "reproduced",
        "CI unbounded: too few runs (arrow to the edge)",
    } <= set(legend)


def test_the_table_gives_the_plotted_numbers_and_every_listed_setup():
    table = forest_table(synthetic_rows())
    lines = table[table["shown"].str.startswith("line")]
    assert len(lines) == 7 and list(lines["role"]).count("premise") == 1
    assert (
        lines.set_index(["comparison", "setup"]).loc[("treatment vs baseline: runtime", GUEST), "ci_high"] == math.inf
    )
    assert set(table.loc[table["shown"] == "listed under the plot", "setup"]) == {"guest-tcg-x", "host-z"}
    [panel_note] = table[table["shown"] == "listed under the panel"].itertuples()
    assert panel_note.setup == FLEET and panel_note._13 == "too few runs: 1 vs 3 measured"
    assert table.loc[table["comparison"] == "a level, beside ~25 %", "target"].item() == "0.25 (printed)"


WHEN = datetime(2026, 11, 21, 18, 0, 0, tzinfo=UTC)


def test_fleet_bundles_of_three_hosts_give_one_line_per_host_and_list_the_host_that_could_not(tmp_path):
    """Bundles laid out as the Ansible playbook fetches them (<host-id>/<claim>/<bundle>), three hosts that measured
    both conditions and one whose capture was not testable: verdict rows, then the plot, as notebook 00-summary
    makes it."""
    fleet = tmp_path / "fleet"
    rng = np.random.default_rng(3)
    for host, effect in (("fleet-a", 1.10), ("fleet-b", 1.00), ("fleet-c", 1.30)):
        writer = BundleWriter(fleet, host, "nohz", "e", definition={}, host={}, when=WHEN)
        for index in range(12):
            condition = ("a", "b")[index % 2]
            value = 100 * (effect if condition == "b" else 1) * (1 + rng.normal(0, 0.01))
            writer.add_run(
                {
                    "run": f"run-{index + 1:03d}",
                    "condition": condition,
                    "warmup": False,
                    "status": "ok",
                    "problem": None,
                },
                [{"metric": "work", "value": value, "unit": "u"}],
            )
        writer.seal()
    dead = BundleWriter(fleet, "fleet-d", "nohz", "e", definition={}, host={}, when=WHEN)
    dead.manifest.not_testable = "no nohz_full in this kernel"
    dead.seal()
    comparison = Comparison("b vs a: work", "work", "b", "a", DERIVED, margins=MARGINS)
    found = claim_verdicts("nohz", [comparison], find_bundles(fleet, "nohz"), fleet, summary="b vs a", n_boot=500)
    rows = pd.DataFrame([v.as_row() for v in found], columns=VERDICT_COLUMNS)
    out = tmp_path / "out"
    out.mkdir()
    rows.to_csv((out / "verdicts").mkdir() or out / "verdicts" / "nohz.csv", index=False)
    fig = save_forest(pd.read_csv(out / "verdicts" / "nohz.csv"), out, fleet)
    [panel] = _panels(fig)
    assert _labels(panel) == ["fleet-a", "fleet-b", "fleet-c"]
    words = [t.get_text().split("\n")[0] for t in panel.texts if not isinstance(t, Annotation)]
    assert words == list(rows.loc[rows["fresh_effect"].notna(), "verdict"])
    assert words[0] in ("reproduced", "consistent, not pinned") and words[2] == "larger than the target"
    assert "• e: no nohz_full in this kernel: fleet-d" in "\n".join(t.get_text() for t in fig.texts)
    sidecar = json.loads((out / "figures/nohz/forest.json").read_text())
    assert sum(s.endswith("manifest.json") for s in sidecar["sources"]) == 4
    assert any(s.endswith("verdicts/nohz.csv") for s in sidecar["sources"])
    table = pd.read_csv(out / "tables/nohz/forest.csv")
    assert list(table["setup"]) == ["fleet-a", "fleet-b", "fleet-c", "fleet-d"]
    assert (out / "figures/nohz/forest.png").stat().st_size > 10_000 and (out / "figures/nohz/forest.svg").is_file()
