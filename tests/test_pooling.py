"""Pooled rows across machines (issue 57): the random-effects pool of setups of one kind, its word, pooled.csv and
the pooled rows of verdicts.csv."""

from __future__ import annotations

import json
import math
import shutil
from datetime import UTC, datetime
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from ticklab import paths
from ticklab.analysis.captured import find_bundles, pool_kind, setup_family
from ticklab.analysis.comparisons import Comparison, claim_verdicts
from ticklab.analysis.outputs import Outputs
from ticklab.analysis.pooling import (
    POOLED_COLUMNS,
    PooledVerdict,
    confidence_of,
    log_se,
    pool_logs,
    pooled_verdicts,
)
from ticklab.analysis.verdicts import VERDICT_COLUMNS, VERDICTS, Margins, Target, Verdict
from ticklab.bundle import BundleWriter
from ticklab.claims import get_claim

WHEN = datetime(2026, 11, 21, 18, 0, 0, tzinfo=UTC)
TARGET = Target(1.1, 1, "derived: a ratio of two printed values", "+10 %", ("x/t/2",))
COMPARISON = Comparison("b vs a: work", "work", "b", "a", TARGET, margins=Margins(no_effect=0.02))
GUEST = "guest-tcg-2vcpu-6.12.117-ticklab-on-intel-xeon-2c-6.18.44-fc-v669-vm"


def host_bundle(
    root, host: str, effect: float, sigma: float, runs: int, rng, claim: str = "nohz", conditions=("a", "b")
):
    """A sealed bundle of one host: ``runs`` blocks of one run of each condition, log-normal values, the second
    condition ``effect`` times the first."""
    writer = BundleWriter(root, host, claim, "e", definition={}, host={}, when=WHEN)
    for index in range(2 * runs):
        condition = conditions[index % 2]
        value = 100 * (effect if condition == conditions[1] else 1) * math.exp(rng.normal(0, sigma))
        writer.add_run(
            {"run": f"run-{index + 1:03d}", "condition": condition, "warmup": False, "status": "ok", "problem": None},
            [{"metric": "work", "value": value, "unit": "u"}],
        )
    writer.seal()


def row(setup, estimate, low, high, verdict="reproduced", level="95%"):
    """A per-setup verdict row of COMPARISON with the target columns every such row carries."""
    return Verdict(
        "nohz",
        setup,
        COMPARISON.comparison,
        verdict,
        "r",
        fresh_effect=estimate,
        ci_low=low,
        ci_high=high,
        ci_level=level,
        target_ratio=TARGET.ratio,
        band_low=1.1 ** (1 / 1.25),
        band_high=1.1**1.25,
    )


def test_a_setups_standard_error_is_its_exact_cis_log_width_over_2z_at_the_cis_own_level():
    z95, z = stats.norm.ppf(0.975), stats.norm.ppf(1 - 0.05 / 8)
    assert log_se(math.exp(-z95 * 0.1), math.exp(z95 * 0.1), 0.95) == pytest.approx(0.1)
    assert confidence_of("0.9875 (simultaneous 95% over this setup's 4 distinct tests: Bonferroni)") == 0.9875
    assert confidence_of("95%") == 0.95
    assert log_se(1 / math.exp(z * 0.05), math.exp(z * 0.05), 1 - 0.05 / 4) == pytest.approx(0.05)
    assert log_se(0.0, math.inf, 0.95) is None and log_se(0.5, math.inf, 0.95) is None


def test_identical_setups_pool_with_no_heterogeneity_and_different_ones_with_much():
    same = pool_logs([0.1, 0.1, 0.1], [0.02, 0.02, 0.02])
    assert same.tau2 == 0 and same.i2 == 0 and same.mean == pytest.approx(0.1)
    # the modified Hartung-Knapp CI is never narrower than the random-effects normal one: t with k - 1 = 2 df here
    assert same.high - same.mean == pytest.approx(stats.t.ppf(0.975, 2) * 0.02 / math.sqrt(3))
    apart = pool_logs([0.0, 0.2, 0.4], [0.02, 0.02, 0.02])
    assert apart.i2 > 0.9 and apart.tau2 == pytest.approx(0.04, rel=0.05)
    # the prediction interval for a new machine holds the spread between machines: far wider than the CI
    assert apart.pi_low < apart.low < apart.mean < apart.high < apart.pi_high
    assert apart.pi_high - apart.pi_low > 3 * (apart.high - apart.low)
    with pytest.raises(ValueError, match="at least 3"):
        pool_logs([0.1, 0.2], [0.01, 0.01])


def test_kinds_pool_hosts_with_hosts_never_a_tcg_guest_with_hardware():
    assert setup_family(GUEST) == "lab guest 6.12" and pool_kind(GUEST) == "lab guest 6.12"
    assert pool_kind(GUEST.replace("tcg", "kvm")) == "lab guest 6.12 (kvm)"
    assert pool_kind("intel-xeon-2c-6.18.44-fc-v669-vm") == "host"
    assert pool_kind(GUEST.replace("-vm", "-vm-labhost-kexec")) == "lab host"
    rows = [row("host-a", 1.1, 1.05, 1.15), row("host-b", 1.1, 1.04, 1.16), row(GUEST, 1.1, 1.05, 1.15)]
    assert pooled_verdicts("nohz", rows, [COMPARISON]) == []  # two hosts and a guest: no kind has 3


def test_three_setups_of_a_kind_give_one_pooled_row_with_k_of_n_machines_per_word():
    rows = [
        row("host-a", 1.100, 1.095, 1.105),
        row("host-b", 1.102, 1.097, 1.107),
        row("host-c", 1.098, 1.093, 1.103),
        row("host-d", 1.2, 0.0, math.inf, "inconclusive"),  # an unbounded CI: counted, not pooled
    ]
    [pooled] = pooled_verdicts("nohz", rows, [COMPARISON])
    assert isinstance(pooled, PooledVerdict) and pooled.role == "pooled" and pooled.setup == "pooled host"
    assert pooled.k == 3 and pooled.n_setups == 4 and pooled.n_per_condition == "3 of 4 setups"
    assert pooled.machines == "reproduced 3 of 4, inconclusive 1 of 4"
    assert pooled.verdict == "reproduced", pooled.reason
    assert pooled.ci_low < pooled.fresh_effect < pooled.ci_high and pooled.pi_low < pooled.ci_low
    assert "per machine: reproduced 3 of 4, inconclusive 1 of 4 (1 not pooled: no bounded CI)" in pooled.reason
    assert pooled.verdict in VERDICTS and pooled.target_ratio == 1.1 and pooled.band_low < 1.1 < pooled.band_high


def test_large_heterogeneity_is_said_first_in_the_reason():
    rows = [row("host-a", 1.02, 1.01, 1.03), row("host-b", 1.10, 1.09, 1.11), row("host-c", 1.25, 1.24, 1.26)]
    [pooled] = pooled_verdicts("nohz", rows, [COMPARISON])
    assert pooled.i2 > 0.9
    assert pooled.reason.startswith("machines differ (I² = "), pooled.reason
    assert "a new host setup's ratio is predicted in" in pooled.reason


def test_fewer_than_three_bounded_cis_is_an_inconclusive_row_saying_why():
    rows = [row("host-a", 1.1, 1.05, 1.15), row("host-b", 1.2, 0.0, math.inf), row("host-c", 1.2, 0.0, math.inf)]
    [pooled] = pooled_verdicts("nohz", rows, [COMPARISON])
    assert pooled.verdict == "inconclusive" and pooled.fresh_effect is None
    assert pooled.reason.startswith("not pooled: 1 of the 3 host setups that tested it have a bounded CI")


def test_three_synthetic_host_bundles_give_pooled_rows_in_pooled_csv_and_verdicts_csv(tmp_path):
    """The Done-when's fleet of known truth: three hosts whose effect is the target, through bundles on disk, the
    verdicts, the pool and the notebook's writer."""
    fleet, out = tmp_path / "fleet", tmp_path / "out"
    rng = np.random.default_rng(7)
    for host, effect in (("host-a", 1.10), ("host-b", 1.10), ("host-c", 1.10)):
        host_bundle(fleet, host, effect, 0.005, 10, rng)
    rows = claim_verdicts("nohz", [COMPARISON], find_bundles(fleet, "nohz"), fleet, summary="b vs a", n_boot=500)
    assert [r.verdict for r in rows] == ["reproduced"] * 3, [r.reason for r in rows]
    pooled = pooled_verdicts("nohz", rows, [COMPARISON], sources=[str(fleet)])
    Outputs(out, "nohz").verdicts(rows + pooled)
    table = pd.read_csv(out / "tables/nohz/pooled.csv")
    assert list(table.columns[:12]) == [
        "comparison", "setup_kind", "k", "pooled_ratio", "ci_low", "ci_high", "pi_low", "pi_high", "tau2", "i2",
        "verdict", "reason",
    ]  # fmt: skip
    assert list(table.columns) == POOLED_COLUMNS
    [line] = table.to_dict("records")
    assert line["setup_kind"] == "host" and line["k"] == 3 and line["verdict"] == "reproduced"
    assert line["ci_low"] < 1.1 < line["ci_high"] and line["pi_low"] < line["ci_low"]
    assert line["machines"] == "reproduced 3 of 3"
    verdicts = pd.read_csv(out / "verdicts/nohz.csv")
    assert list(verdicts.columns) == VERDICT_COLUMNS
    pooled_row = verdicts[verdicts["role"] == "pooled"].iloc[0]
    assert pooled_row["setup"] == "pooled host" and pooled_row["verdict"] == "reproduced"
    assert pooled_row["fresh_effect"] == pytest.approx(line["pooled_ratio"])
    assert json.loads((out / "tables/nohz/pooled.json").read_text())["sources"]


def test_no_pool_no_pooled_table(tmp_path):
    rows = [row("host-a", 1.1, 1.05, 1.15), row("host-b", 1.1, 1.05, 1.15)]
    Outputs(tmp_path, "nohz").verdicts(rows + pooled_verdicts("nohz", rows, [COMPARISON]))
    assert not (tmp_path / "tables/nohz/pooled.csv").exists()
    assert "pooled" not in set(pd.read_csv(tmp_path / "verdicts/nohz.csv")["role"])


NOHZ_HOSTS = sorted(p for p in paths.repo_root().glob("traces/*-vm/nohz/*-ftq") if not p.parts[-3].startswith("guest-"))


@pytest.mark.skipif(len(NOHZ_HOSTS) < 2, reason="the two bundled nohz host captures are not in traces/")
def test_the_two_bundled_nohz_hosts_and_a_synthetic_third_pool_nothing_as_the_bundled_ones_measured_one_condition(
    tmp_path,
):
    """The Done-when's data directory: the bundled nohz host captures (Intel v669, AMD v595) beside a synthetic third
    host that measured tick on and nohz_full. The bundled captures ran FTQ with the tick on only (one condition:
    nothing to compare), so no comparison has three hosts and there is no pooled row; the collapsed row says why the
    two tested nothing. (The pooled rows of three host bundles: the synthetic fleet test above.)"""
    data = tmp_path / "data"
    for bundle in NOHZ_HOSTS:
        shutil.copytree(bundle, data / bundle.parent.parent.name / "nohz" / bundle.name)
    from ticklab.claims import nohz as nohz_module

    nohz = get_claim("nohz")
    comparisons = nohz.comparisons(nohz.published(paths.published_dir()))
    tick = next(c for c in comparisons if c.treatment == "nohz-full" and c.baseline == "tick-on")
    writer = BundleWriter(data, "synthetic-host-3", "nohz", tick.experiments[0], definition={}, host={}, when=WHEN)
    rng = np.random.default_rng(3)
    for index in range(20):
        condition = ("tick-on", "nohz-full")[index % 2]
        value = 1000 * (1.08 if condition == "nohz-full" else 1) * math.exp(rng.normal(0, 0.01))
        writer.add_run(
            {"run": f"run-{index + 1:03d}", "condition": condition, "warmup": False, "status": "ok", "problem": None},
            [{"metric": tick.metric, "value": value, "unit": "u"}],
        )
    writer.seal()
    ctx = SimpleNamespace(
        published=nohz.published(paths.published_dir()), bundles=find_bundles(data, "nohz"), data_dir=data
    )
    rows = nohz.verdicts(ctx, n_boot=200)
    assert not [r for r in rows if r.role == "pooled"]
    # the third host's runs lack the raw files nohz checks; the two bundled hosts' only tested rows are their own µs
    # per tick, a level per host (issue 52), which no pool combines
    tested = [r for r in rows if r.fresh_effect is not None]
    assert {(r.setup, r.comparison) for r in tested} == {
        (bundle.parent.parent.name, nohz_module.TICK_COST_LEVEL) for bundle in NOHZ_HOSTS
    }
    collapsed = next(r for r in rows if r.verdict == "not testable here" and ", " in r.setup)
    for bundle in NOHZ_HOSTS:
        assert f"{bundle.parent.parent.name}: ftq measured tick-on" in collapsed.reason


def test_the_forest_plot_draws_each_pool_as_a_diamond_with_its_prediction_interval_under_the_setups(tmp_path):
    from matplotlib.patches import Polygon

    from ticklab.analysis.forest import save_forest

    fleet, out = tmp_path / "fleet", tmp_path / "out"
    rng = np.random.default_rng(11)
    for host, effect in (("host-a", 1.06), ("host-b", 1.10), ("host-c", 1.14), ("host-d", 1.10)):
        host_bundle(fleet, host, effect, 0.01, 8, rng)
    rows = claim_verdicts("nohz", [COMPARISON], find_bundles(fleet, "nohz"), fleet, summary="b vs a", n_boot=300)
    Outputs(out, "nohz").verdicts(rows + pooled_verdicts("nohz", rows, [COMPARISON], sources=[str(fleet)]))
    fig = save_forest(pd.read_csv(out / "verdicts/nohz.csv"), out, fleet)
    [ax] = [a for a in fig.axes if any(t.get_text() == "host-a" for t in a.get_yticklabels())]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels[:4] == ["host-a", "host-b", "host-c", "host-d"] and labels[4].startswith("pooled host\n(4 setups)")
    [diamond] = [p for p in ax.patches if isinstance(p, Polygon)]
    pooled = pd.read_csv(out / "tables/nohz/pooled.csv").iloc[0]
    xs = sorted(diamond.get_xy()[:, 0])
    assert xs[0] == pytest.approx(pooled["ci_low"]) and xs[-1] == pytest.approx(pooled["ci_high"])
    assert any(t.get_text().startswith(f"{pooled['verdict']} (pooled)") for t in ax.texts)
    table = pd.read_csv(out / "tables/nohz/forest.csv")
    line = table[table["role"] == "pooled"].iloc[0]
    assert line["setup"] == "pooled host" and f"×{pooled['pi_low']:.3g}..×{pooled['pi_high']:.3g}" in line["shown"]
    sources = json.loads((out / "figures/nohz/forest.json").read_text())["sources"]
    assert any(s.endswith("tables/nohz/pooled.csv") for s in sources)
    fig.savefig(tmp_path / "forest.png")


def test_the_first_screen_cell_gains_the_pooled_word_and_never_takes_a_pool_for_a_setup():
    from ticklab.report.firstscreen import claim_grid, verdict_table

    rows = [
        row("intel-xeon-2c-6.18.44-fc-v669-vm", 1.02, 1.01, 1.03, "smaller than the target"),
        row("amd-epyc-2c-6.18.44-fc-v595-vm", 1.10, 1.09, 1.11),
        row("intel-xeon-4c-6.18.44-fc-v700-vm", 1.25, 1.24, 1.26, "larger than the target"),
    ]
    rows = [r for r in rows] + pooled_verdicts("nohz", rows, [COMPARISON])
    frame = pd.DataFrame([r.as_row() for r in rows], columns=VERDICT_COLUMNS)
    grid = claim_grid(frame, {"nohz": "nohz"}, {"nohz": [COMPARISON.comparison]})
    assert [f["name"] for f in grid["families"]] == ["host"] and "pooled host" not in grid["names"]
    [cell] = grid["rows"][0]["cells"]
    assert cell["headline"]["setup_ids"] != "pooled host"
    [pooled] = cell["pooled"]
    assert pooled["verdict"] == rows[-1].verdict and pooled["k"] == "3 setups" and pooled["differ"]
    assert pooled["effect"].startswith(f"×{rows[-1].fresh_effect:.3g} [")
    shown = verdict_table(frame, grid["names"])
    assert shown[-1]["setup"] == "pooled host" and shown[-1]["role"] == "pooled"
