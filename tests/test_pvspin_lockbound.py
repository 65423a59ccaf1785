"""pvspinlock's lock-bound lab analogue (issue 54): the lock-bound load beside the build, the spin-threshold lab knob,
and rows that say "not testable here" with the counts where kick-ahead still ran fewer than 100 times a build."""

from __future__ import annotations

import shutil
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import pytest

from ticklab import paths
from ticklab.analysis.captured import find_bundles
from ticklab.analysis.checks import run_checks
from ticklab.analysis.comparisons import measured_runs
from ticklab.bundle import BundleWriter
from ticklab.capture.experiment import load_experiment
from ticklab.capture.requirements import tools_bin
from ticklab.claims import pvspinlock
from ticklab.lab import kbuild
from ticklab.lab.guest import SWITCHES, boot_mismatches

REPO = paths.repo_root()
WHEN = datetime(2026, 11, 29, 3, 0, 0, tzinfo=UTC)
LOCKHAMMER = tools_bin() / "lockhammer"


def test_patch_0004_adds_the_spin_threshold_knob_and_the_guest_checks_it():
    text = (REPO / "kernel/patches/6.12/0004-lab-pvspin.patch").read_text()
    assert "+core_param(lab_pvspin_spins, lab_pvspin_spins, int, 0444);" in text
    assert text.count("+\t\tfor (wait_early = false, loop = pv_spin_threshold(); loop; loop--) {") == 1
    assert text.count("+\t\tfor (loop = pv_spin_threshold(); loop; loop--) {") == 1
    assert SWITCHES["lab_pvspin_spins"] == "sys/module/kernel/parameters/lab_pvspin_spins"
    facts = {"cmdline": "lab_pvspin=1 lab_pvspin_spins=64", "lab_switches": {"lab_pvspin_spins": "32768"}}
    assert boot_mismatches(["lab_pvspin_spins=64"], None, facts) == [
        "lab_pvspin_spins is 32768 in the running kernel, the condition asks for 64"
    ]


def _cpu_ticks(pid: int) -> int:
    """utime + stime of a process, all its threads, in clock ticks (/proc/PID/stat fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


@pytest.mark.skipif(not LOCKHAMMER.exists(), reason="tools/bin/lockhammer not built: run 'make tools'")
def test_lockhammer_runs_its_threads_until_told_to_stop_and_counts_its_calls():
    process = subprocess.Popen([str(LOCKHAMMER), "3"], stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "# lockhammer: started 3 threads"
    # stopped once its threads have run (a clock tick of CPU between them, thousands of futex calls), not at once: on
    # a loaded machine a SIGTERM right after the line could land before any thread was scheduled
    deadline = time.monotonic() + 300  # a bound for a loaded machine, never a timing
    while _cpu_ticks(process.pid) < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    process.terminate()
    out, _ = process.communicate()
    header = dict(line[2:].split(": ", 1) for line in out.splitlines() if ": " in line)
    assert process.returncode == 0 and header["lockhammer"] == "1" and header["threads"] == "3"
    assert int(header["futex_calls"]) > 0
    refused = subprocess.run([str(LOCKHAMMER), "0"], capture_output=True, text=True)
    assert refused.returncode == 2 and "usage: lockhammer <threads 1-4096>" in refused.stderr


@pytest.mark.skipif(
    not LOCKHAMMER.exists() or shutil.which("tcc") is None or shutil.which("make") is None,
    reason="needs tools/bin/lockhammer, tcc and make",
)
def test_kbuild_runs_the_lock_bound_load_beside_the_build_and_reports_its_calls(tmp_path, capsys):
    counters = tmp_path / "counters"
    counters.mkdir()
    (counters / "pv_kick_ahead").write_text("7\n")
    done = kbuild.build(8, 2, counters=counters, functions=1, lock_threads=2, lockhammer=str(LOCKHAMMER))
    assert done["futex_calls"] > 0 and done["events"] == {"pv_kick_ahead": 0}
    with pytest.raises(kbuild.KbuildError, match="--lock-threads needs --lockhammer"):
        kbuild.build(8, 2, counters=counters, functions=1, lock_threads=2)
    with pytest.raises(kbuild.KbuildError, match="cannot start"):
        kbuild.build(8, 2, counters=counters, functions=1, lock_threads=2, lockhammer=str(tmp_path / "none"))


def test_the_lock_bound_experiment_overcommits_shortens_the_spin_and_runs_the_load():
    experiment = load_experiment(REPO / "runners/pvspinlock/guest-kbuild-lockbound.yaml")
    assert f"lab_pvspin_spins={pvspinlock.LOCKBOUND_SPINS}" in experiment.lab["cmdline"].split()
    assert "lab_pvspin=1" in experiment.lab["cmdline"].split()
    assert {c["name"] for c in experiment.definition["conditions"]} == {
        pvspinlock.lockbound_condition(k, level) for k in (0, 4) for level in pvspinlock.LOCKBOUND_LEVELS
    }
    assert "--lock-threads-per-cpu" in experiment.workload["argv"] and "tool:lockhammer" in experiment.requires


def _bundle(tmp_path: Path, kicks_on: list[float], spins: str = "16") -> None:
    setup = "guest-tcg-4vcpu-6.12.117-ticklab-on-test"
    writer = BundleWriter(
        tmp_path, setup, "pvspinlock", pvspinlock.LOCKBOUND_EXPERIMENT, definition={}, host={}, when=WHEN
    )
    times = {0: [40.0, 41.0, 39.5, 40.5, 40.2, 39.8], 4: [36.0, 36.5, 35.8, 36.2, 36.1, 35.9]}
    index = 0
    for kick_ahead, values in times.items():
        for i, value in enumerate(values):
            index += 1
            kicks = kicks_on[i] if kick_ahead == 4 else 0.0
            writer.add_run(
                {
                    "run": f"run-{index:03d}",
                    "condition": pvspinlock.lockbound_condition(kick_ahead, "2x"),
                    "warmup": False,
                    "status": "ok",
                    "guest": {"switches": {"pv_kick_ahead": str(kick_ahead), "lab_pvspin_spins": spins}},
                },
                [
                    {"metric": "build_time_s", "value": value, "unit": "s"},
                    {"metric": "guest_vcpus", "value": 4, "unit": "CPUs"},
                    {"metric": "lockevent_pv_kick_ahead", "value": kicks, "unit": "events"},
                    {"metric": "lockevent_pv_kick_unlock", "value": 900.0, "unit": "events"},
                ],
            )
    writer.seal()


def _lockbound_row(tmp_path: Path):
    bundles = find_bundles(tmp_path, "pvspinlock")
    ctx = SimpleNamespace(
        published=pvspinlock.CLAIM.published(paths.published_dir()), bundles=bundles, data_dir=tmp_path
    )
    [row] = [v for v in pvspinlock.CLAIM.verdicts(ctx, n_boot=500) if "lock-bound load" in v.comparison]
    return row


def test_lock_bound_builds_that_kicked_ahead_100_times_get_a_tested_row(tmp_path):
    _bundle(tmp_path, [150.0, 180.0, 120.0, 210.0, 160.0, 140.0])
    row = _lockbound_row(tmp_path)
    assert row.verdict != "not testable here" and row.n_per_condition == "6 vs 6"
    assert row.comparison.startswith("lab analogue (TCG, halt+IPI backend): pv_kick_ahead=4 vs 0")
    assert "lab_pvspin_spins" in row.comparison and row.target_provenance.startswith("derived: direction only")


def test_lock_bound_builds_below_100_kick_aheads_are_left_out_and_the_row_says_so_with_a_count(tmp_path):
    _bundle(tmp_path, [12.0, 30.0, 8.0, 50.0, 20.0, 15.0])
    row = _lockbound_row(tmp_path)
    assert row.verdict == "not testable here"
    assert row.reason.startswith(
        "6 of 12 runs left out (kick-ahead acted in the build (the path under test ran) failed in 6 (e.g. 12)"
    )


def test_a_lock_bound_build_where_kick_ahead_acted_fewer_than_100_times_is_left_out_and_named(tmp_path):
    _bundle(tmp_path, [150.0, 180.0, 99.0, 210.0, 160.0, 40.0])
    runs, _ = measured_runs(find_bundles(tmp_path, "pvspinlock"), pvspinlock.CHECKS, "pvspinlock")
    kept = runs[(runs["metric"] == "lockevent_pv_kick_ahead") & (runs["condition"].str.contains("kick-ahead-4"))]
    assert sorted(kept["value"]) == [150.0, 160.0, 180.0, 210.0]
    checks = run_checks("pvspinlock", pvspinlock.CHECKS, find_bundles(tmp_path, "pvspinlock"))
    failed = checks[(checks["check"] == "kick-ahead acted in the build (the path under test ran)") & ~checks["passed"]]
    assert sorted(failed["observed"]) == ["40", "99"]
    assert set(failed["expected"]) == {"lockevent_pv_kick_ahead ≥ 100"}
    row = _lockbound_row(tmp_path)
    assert row.n_per_condition == "4 vs 6"


def test_a_lock_bound_run_whose_kernel_ignored_the_spin_knob_is_left_out(tmp_path):
    _bundle(tmp_path, [150.0] * 6, spins="32768")
    runs, notes = measured_runs(find_bundles(tmp_path, "pvspinlock"), pvspinlock.CHECKS, "pvspinlock")
    assert runs.empty and any("condition check failed or could not be computed" in n for n in notes)
