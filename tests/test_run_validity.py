"""Issue 44 item 3: a run counts only if its condition took effect, shown from what the run itself recorded."""

from pathlib import Path

import pandas as pd
import pytest

from ticklab.analysis.captured import find_bundles
from ticklab.analysis.checks import (
    BUNDLE_HOST,
    MISSING,
    RUN_HZ,
    FactCheck,
    MetricCheck,
    check_table,
    excluded_runs,
    run_checks,
    run_hz,
)
from ticklab.analysis.comparisons import measured_runs
from ticklab.bundle import load_bundle
from ticklab.claims import nohz

TRACES = Path(__file__).resolve().parents[1] / "traces"
STOP = "nohz_full stopped the tick on the busy CPU (timer interrupts/s ≤ 10% of HZ)"


def _results(**metrics) -> pd.DataFrame:
    return pd.DataFrame([{"metric": k, "value": v} for k, v in metrics.items()])


def test_the_runs_hz_comes_from_the_guest_the_booted_kernel_or_the_host_facts_of_the_same_kernel():
    host = {"kernel_release": "6.1.0-50-amd64", "kernel_config": {"hz": 250}}
    assert run_hz({"guest": {"hz": 1000}, BUNDLE_HOST: host}) == 1000
    assert run_hz({"boot": {"release": "7.2.0", "hz": 1000}, BUNDLE_HOST: host}) == 1000
    # a boot plan on the kernel the facts describe: their CONFIG_HZ
    assert run_hz({"boot": {"release": "6.1.0-50-amd64"}, BUNDLE_HOST: host}) == 250
    assert run_hz({BUNDLE_HOST: host}) == 250
    # another kernel booted and its HZ not recorded: nothing to hold the rate against
    assert run_hz({"boot": {"release": "7.2.0"}, BUNDLE_HOST: host}) is MISSING


def test_the_tick_stop_check_is_computed_from_the_host_facts_where_no_guest_hz_was_recorded():
    check = MetricCheck("stopped", "local_timer_irq_rate_hz", ("nohz-full",), 0.10, RUN_HZ)
    record = {
        "condition": "nohz-full",
        "boot": {"release": "6.1.0-50-amd64"},
        BUNDLE_HOST: {"kernel_release": "6.1.0-50-amd64", "kernel_config": {"hz": 250}},
    }
    assert check.evaluate(record, _results(local_timer_irq_rate_hz=111.1)) == (
        "≤ 0.1 × the run's HZ = 25",
        "111.1",
        False,
    )
    assert check.evaluate(record, _results(local_timer_irq_rate_hz=1.7))[2] is True
    expected, observed, passed = check.evaluate({**record, BUNDLE_HOST: {}}, _results(local_timer_irq_rate_hz=1.7))
    assert passed is None and observed.startswith("not recorded: no the run's HZ")


def test_an_unchecked_run_is_left_out_with_why():
    rows = pd.DataFrame(
        [
            {
                "claim": "c",
                "setup": "s",
                "bundle": "b",
                "run": "run-001",
                "condition": "x",
                "check": "k",
                "expected": "1",
                "observed": "1",
                "passed": True,
            },
            {
                "claim": "c",
                "setup": "s",
                "bundle": "b",
                "run": "run-002",
                "condition": "x",
                "check": "k",
                "expected": "1",
                "observed": "not recorded: no guest.hz for this run",
                "passed": None,
            },
            {
                "claim": "c",
                "setup": "s",
                "bundle": "b",
                "run": "run-003",
                "condition": "x",
                "check": "k",
                "expected": "1",
                "observed": "2",
                "passed": False,
            },
        ]
    )
    assert excluded_runs(rows) == {
        ("b", "run-002"): [("k", "unchecked", "not recorded: no guest.hz for this run")],
        ("b", "run-003"): [("k", "failed", "2")],
    }
    [row] = check_table(rows).to_dict("records")
    assert row["status"] == "FAILED in 1 and unchecked in 1 of 3 runs (left out of the verdicts)"
    assert row["left_out"] == "run-002 run-003"


def test_a_fact_check_that_cannot_be_computed_says_what_is_missing():
    check = FactCheck("HZ", "guest.hz", {"hz250": 250})
    assert check.evaluate({"condition": "hz250"}, _results()) == ("250", "not recorded: no guest.hz for this run", None)


def test_a_fact_check_with_alternative_paths_takes_the_first_recorded():
    """nohz's HZ check: a lab guest's own HZ, else a boot plan's booted kernel's (runners/nohz/host-boot-hz.yaml)."""
    check = FactCheck("HZ", "guest.hz|boot.hz", {"hz1000*": 1000})
    assert check.evaluate({"condition": "hz1000", "boot": {"hz": 1000}}, _results()) == ("1000", "1000", True)
    assert check.evaluate({"condition": "hz1000", "boot": {"hz": 250}}, _results()) == ("1000", "250", False)
    assert check.evaluate({"condition": "hz1000", "guest": {"hz": 1000}, "boot": {"hz": 250}}, _results()) == (
        "1000",
        "1000",
        True,
    )
    assert check.evaluate({"condition": "hz1000"}, _results()) == (
        "1000",
        "not recorded: no guest.hz|boot.hz for this run",
        None,
    )


def test_hrtick_checks_that_a_runs_kernel_is_the_series_its_condition_names():
    """hrtick's kernel conditions: a boot plan's run verified on a 6.12 kernel fails a "7.2 …" condition's check."""
    from ticklab.claims import hrtick

    check = next(c for c in hrtick.CHECKS if c.path == "guest.kernel|boot.release")
    assert check.evaluate(
        {"condition": "7.2 hrtick-on", "boot": {"release": "7.2.13-ticklab-0a1b2c3d"}}, _results()
    ) == ("starts with 7.2.", "7.2.13-ticklab-0a1b2c3d", True)
    assert check.evaluate(
        {"condition": "7.2 hrtick-on", "boot": {"release": "6.12.117-ticklab-7971d723"}}, _results()
    ) == ("starts with 7.2.", "6.12.117-ticklab-7971d723", False)
    assert (
        check.evaluate({"condition": "6.12 hrtick-off", "guest": {"kernel": "6.12.117-ticklab"}}, _results())[2] is True
    )
    assert check.evaluate({"condition": "hrtick-on", "boot": {"release": "6.12.117"}}, _results()) is None


def _labhost_bundles(experiment: str = "host-boot-ftq"):
    refs = [r for r in find_bundles(TRACES, "nohz") if "-labhost-" in r.host_id and r.path.name.endswith(experiment)]
    if not refs:
        pytest.skip(f"no lab host nohz {experiment} bundle in traces/")
    return refs


def test_the_lab_hosts_runs_are_named_for_their_hpet_clocksource_and_starved_cpu_and_none_enters_a_verdict():
    refs = _labhost_bundles()
    table = check_table(run_checks("nohz", nohz.CHECKS, refs))
    clock = table[table["check"].str.startswith("FTQ read the clock through the TSC")]
    assert set(clock["observed"]) == {"clocksource hpet"} and (clock["failed"] == clock["runs"]).all()
    starved = table[table["check"].str.startswith("the busy CPU was not starved")]
    assert (starved["failed"] == starved["runs"]).all()
    assert all("% of quanta with no work" in seen for seen in starved["observed"])
    # the tick-stop check is computed now (HZ=250 from the host facts): the kexec run whose tick ran (111/s) fails it
    stop = table[table["check"] == STOP]
    assert (stop["not_recorded"] == 0).all() and stop["failed"].sum() >= 1
    runs, notes = measured_runs(refs, nohz.CHECKS, "nohz")
    assert runs.empty and any("could not be computed" in note for note in notes)


def test_the_lab_hosts_hz_plan_booted_each_runs_own_build_at_its_hz_and_its_starved_vcpu_keeps_it_out():
    """The HZ plan (issue 39): each run booted the kernel its condition names, built by kernel build --host (the build
    record in its boot), at the HZ the condition says; the 6.12 kernels read the clock through the TSC even under TCG,
    but the busy vCPU was starved in every run, so none enters a verdict."""
    refs = _labhost_bundles("host-boot-hz")
    table = check_table(run_checks("nohz", nohz.CHECKS, refs))
    hz = table[table["check"] == "kernel HZ as the condition says"].set_index("condition")
    assert hz.loc["hz250", "observed"] == "250" and hz.loc["hz1000", "observed"] == "1000"
    assert (hz["passed"] == hz["runs"]).all() and set(hz["runs"]) == {3}
    clock = table[table["check"].str.startswith("FTQ read the clock through the TSC")]
    assert set(clock["observed"]) == {"clocksource tsc"} and (clock["status"] == "passed").all()
    starved = table[table["check"].str.startswith("the busy CPU was not starved")]
    assert (starved["failed"] == starved["runs"]).all()
    for ref in refs:
        runs = load_bundle(ref.path).manifest.runs
        for run in runs:
            boot = run.boot
            want = "-ticklab-hz1000-" if run.condition == "hz1000" else "-ticklab-"
            assert want in boot["release"] and boot["release"].startswith("6.12.")
            assert (
                boot["kernel_build"]["build_log_matches"] is True and len(boot["kernel_build"]["config_sha256"]) == 64
            )
        assert {r.boot["kernel_build"]["config_sha256"] for r in runs if r.condition == "hz1000"} != {
            r.boot["kernel_build"]["config_sha256"] for r in runs if r.condition == "hz250"
        }
    runs, notes = measured_runs(refs, nohz.CHECKS, "nohz")
    assert runs.empty


def test_the_lab_hosts_hrtick_plan_booted_each_conditions_kernel_with_its_hrtick_setting_and_its_build_record():
    """The hrtick plan (issue 39): 6.12 and 7.2, each built by kernel build --host against the image's config, HRTICK
    on and off in each; every run's boot is the release its condition's series names, the feature was as the
    condition says during the run, and the trace was recorded by ticklab's tracefs instance (the experiment traces a
    function: trace-cmd's teardown would trace every function for a moment) with nothing lost."""
    from ticklab.claims import hrtick

    refs = [r for r in find_bundles(TRACES, "hrtick") if "-labhost-" in r.host_id]
    if not refs:
        pytest.skip("no lab host hrtick bundle in traces/")
    table = check_table(run_checks("hrtick", hrtick.CHECKS, refs))
    assert set(table["check"]) >= {"HRTICK sched feature during the run", "the run's kernel is the condition's series"}
    assert (table["passed"] == table["runs"]).all() and table.groupby("check")["runs"].sum().eq(12).all()
    for ref in refs:
        manifest = load_bundle(ref.path).manifest
        assert manifest.status == "sealed" and len(manifest.runs) == 12
        for run in manifest.runs:
            series = run.condition.split()[0]
            assert run.status == "ok" and run.boot["release"].startswith(f"{series}.")
            assert "-ticklab-" in run.boot["release"] and run.boot["kernel_build"]["build_log_matches"] is True
            assert run.trace["backend"] == "tracefs" and run.trace["lost_events"] == 0
        builds = {r.boot["release"]: r.boot["kernel_build"]["source_version"] for r in manifest.runs}
        assert sorted(builds.values()) == ["6.12.117", "7.2.13"]
    runs, _ = measured_runs(refs, hrtick.CHECKS, "hrtick")
    assert set(runs["condition"]) == {"6.12 hrtick-off", "6.12 hrtick-on", "7.2 hrtick-off", "7.2 hrtick-on"}
    assert runs.groupby("condition")["run"].nunique().eq(3).all()


def test_the_lab_hosts_rows_are_not_testable_here_naming_why_and_the_forest_shows_no_point_for_them():
    from types import SimpleNamespace

    from ticklab import paths
    from ticklab.analysis.forest import forest_table

    refs = _labhost_bundles()
    ctx = SimpleNamespace(published=nohz.CLAIM.published(paths.published_dir()), bundles=refs, data_dir=TRACES)
    rows = nohz.CLAIM.verdicts(ctx, n_boot=200)
    assert [r.verdict for r in rows] == ["not testable here"]
    reason = rows[0].reason
    for setup in {r.host_id for r in refs}:
        assert f"{setup}: host-boot-ftq: its condition did not take effect, or could not be shown to" in reason
    assert (
        "FTQ read the clock through the TSC (the experiment's assumption: a vDSO read, no system call) failed in 6 "
        "of 6 runs (e.g. clocksource hpet)" in reason
    )
    assert "the busy CPU was not starved (FTQ quanta with no work ≤ 5%) failed in 6 of 6 runs (e.g. " in reason
    shown = forest_table(pd.DataFrame([vars(r) for r in rows]))
    assert not (shown["shown"].str.startswith("line")).any()
    assert {r.host_id for r in refs} <= set(shown["setup"]) and set(shown["shown"]) == {"listed under the plot"}


def test_the_guest_and_host_runs_pass_the_new_checks():
    refs = [r for r in find_bundles(TRACES, "nohz") if "-labhost-" not in r.host_id]
    if not refs:
        pytest.skip("no nohz bundle in traces/")
    table = check_table(run_checks("nohz", nohz.CHECKS, refs))
    assert (table["status"] == "passed").all(), table[table["status"] != "passed"][["setup", "check", "observed"]]


def test_a_setup_that_measured_one_side_is_told_only_what_is_missing():
    from types import SimpleNamespace

    from ticklab import paths

    refs = [r for r in find_bundles(TRACES, "nohz") if r.host_id == "amd-epyc-2c-6.18.44-fc-v595-vm"]
    if not refs:
        pytest.skip("no AMD host nohz bundle in traces/")
    ctx = SimpleNamespace(published=nohz.CLAIM.published(paths.published_dir()), bundles=refs, data_dir=TRACES)
    [row] = [r for r in nohz.CLAIM.verdicts(ctx, n_boot=200) if "amd-epyc-2c-6.18.44-fc-v595-vm" in r.setup]
    assert (
        "amd-epyc-2c-6.18.44-fc-v595-vm: ftq measured tick-on; a comparison with it needs nohz-full too" in row.reason
    )
