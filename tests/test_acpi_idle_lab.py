"""acpi-idle's lab analogue (issue 54): the SSDT the build compiles and QEMU is given, the guest's cpuidle counters,
and the checks that leave out every run whose I/O-port C-state path did not run as its condition says."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import pytest

from ticklab import paths
from ticklab.analysis.captured import find_bundles
from ticklab.analysis.checks import check_table, run_checks
from ticklab.analysis.comparisons import measured_runs
from ticklab.bundle import BundleWriter
from ticklab.capture.experiment import ExperimentError, load_experiment
from ticklab.claims import acpi_idle
from ticklab.lab import qemu
from ticklab.lab.cache import LabError
from ticklab.lab.guest import cpuidle_counters, cpuidle_record
from ticklab.lab.run import guest_host_id

REPO = paths.repo_root()
SSDT = "runners/acpi-idle/ssdt-cst.asl"
WHEN = datetime(2026, 11, 29, 3, 0, 0, tzinfo=UTC)
needs_iasl = pytest.mark.skipif(shutil.which("iasl") is None, reason="iasl (acpica-tools) is not installed")


@needs_iasl
def test_the_ssdt_compiles_to_a_table_giving_each_of_qemus_four_processors_a_cst(tmp_path, monkeypatch):
    monkeypatch.setenv("TICKLAB_CACHE", str(tmp_path / "cache"))
    table = qemu.compile_acpi_table(SSDT)
    aml = table.aml.read_bytes()
    assert aml[:4] == b"SSDT" and table.record()["signature"] == "SSDT"
    for cpu in ("C000", "C001", "C002", "C003"):
        assert cpu.encode() in aml
    assert b"_CST" in aml
    # the I/O port of C2 (0x0814) as a SystemIO generic register: space id 1, then width 8, offset 0, access 0
    assert bytes([0x82, 0x0C, 0x00, 0x01, 0x08, 0x00, 0x00, 0x14, 0x08]) in aml
    again = qemu.compile_acpi_table(SSDT)
    assert again.aml == table.aml and again.aml_sha256 == table.aml_sha256  # compiled once, from the cache
    boot = qemu.Boot(tmp_path / "k", tmp_path / "i", tmp_path, tmp_path / "c", acpi_tables=(table.aml,))
    argv = boot.argv()
    assert argv[argv.index("-acpitable") + 1] == f"file={table.aml}"


@needs_iasl
def test_a_table_iasl_cannot_compile_or_read_is_one_line_naming_the_file(tmp_path, monkeypatch):
    monkeypatch.setenv("TICKLAB_CACHE", str(tmp_path / "cache"))
    (tmp_path / "runners" / "x").mkdir(parents=True)
    (tmp_path / "runners/x/broken.asl").write_text('DefinitionBlock ("", "SSDT", 2, "T", "T", 1) { Scope ( }\n')
    with pytest.raises(LabError, match=r"^runners/x/broken\.asl: iasl could not compile it: ") as error:
        qemu.compile_acpi_table("runners/x/broken.asl", root=tmp_path)
    assert "\n" not in str(error.value)
    with pytest.raises(LabError, match=r"^runners/x/missing\.asl: cannot read the ACPI table source"):
        qemu.compile_acpi_table("runners/x/missing.asl", root=tmp_path)


@pytest.mark.parametrize("table", ["../etc/x.asl", "/etc/x.asl", "runners/acpi-idle/ssdt-cst.aml", "ssdt.asl"])
def test_lab_acpi_tables_take_only_asl_files_under_runners(tmp_path, table):
    text = (REPO / "runners/acpi-idle/guest-wakeups.yaml").read_text().replace(SSDT, table)
    path = tmp_path / "guest-x.yaml"
    path.write_text(text)
    with pytest.raises(ExperimentError, match=r"acpi_tables"):
        load_experiment(path)


def test_the_lab_experiments_ask_for_the_ssdt_four_vcpus_and_acpi_idle():
    for name in ("guest-wakeups",):
        experiment = load_experiment(REPO / f"runners/acpi-idle/{name}.yaml")
        assert experiment.lab["acpi_tables"] == [SSDT] and experiment.lab["smp"] == 4
        assert "cpuidle_driver:acpi_idle" in experiment.requires
        assert {c["name"]: c["boot"] for c in experiment.definition["conditions"]} == {
            acpi_idle.LAB_ON: "processor.dummy_wait=1",
            acpi_idle.LAB_OFF: "processor.dummy_wait=0",
        }


def test_a_guest_given_extra_acpi_tables_is_a_setup_of_its_own_and_its_name_says_so(monkeypatch):
    from ticklab.lab import run

    monkeypatch.setattr(run, "host_id", lambda facts: "intel-xeon-2c-6.18.44-fc-v669-vm")
    physical = {}
    plain = guest_host_id("tcg", {4}, "6.12.117-ticklab", physical)
    tabled = guest_host_id("tcg", {4}, "6.12.117-ticklab", physical, [SSDT])
    assert plain == "guest-tcg-4vcpu-6.12.117-ticklab-on-intel-xeon-2c-6.18.44-fc-v669-vm"
    assert tabled == "guest-tcg-4vcpu-6.12.117-ticklab-ssdt-cst-on-intel-xeon-2c-6.18.44-fc-v669-vm"


def _state(root: Path, cpu: int, index: int, name: str, desc: str, usage: int, time_us: int) -> None:
    state = root / f"sys/devices/system/cpu/cpu{cpu}/cpuidle/state{index}"
    state.mkdir(parents=True, exist_ok=True)
    for field, value in (("name", name), ("desc", desc), ("usage", usage), ("time", time_us)):
        (state / field).write_text(f"{value}\n")


def test_the_guest_records_each_idle_state_summed_over_its_cpus_before_and_after(tmp_path):
    (tmp_path / "sys/devices/system/cpu/cpuidle").mkdir(parents=True)
    (tmp_path / "sys/devices/system/cpu/cpuidle/current_driver").write_text("acpi_idle\n")
    for cpu in (0, 1):
        _state(tmp_path, cpu, 0, "POLL", "CPUIDLE CORE POLL IDLE", 1, 10)
        _state(tmp_path, cpu, 2, "C2", "ACPI IOPORT 0x814", 100, 400)
    before = cpuidle_counters(tmp_path)
    _state(tmp_path, 1, 2, "C2", "ACPI IOPORT 0x814", 350, 900)
    record = cpuidle_record(before, cpuidle_counters(tmp_path))
    assert record["driver"] == "acpi_idle"
    c2 = record["states"][1]
    assert (c2["name"], c2["usage_before"], c2["usage_after"], c2["time_us_before"], c2["time_us_after"]) == (
        "C2",
        200,
        450,
        800,
        1300,
    )


def _lab_bundle(tmp_path: Path, runs: list[dict]) -> None:
    setup = "guest-tcg-4vcpu-6.12.117-ticklab-ssdt-cst-on-test"
    writer = BundleWriter(tmp_path, setup, "acpi-idle", "guest-wakeups", definition={}, host={}, when=WHEN)
    for index, run in enumerate(runs, 1):
        writer.add_run(
            {
                "run": f"run-{index:03d}",
                "condition": run["condition"],
                "warmup": False,
                "status": "ok",
                "guest": {"switches": {"processor.dummy_wait": run.get("switch")}},
                **({"cpuidle": run["cpuidle"]} if "cpuidle" in run else {}),
            },
            [{"metric": "runtime_s", "value": run["value"], "unit": "s"}],
        )
    writer.seal()


def _cpuidle(entries: int, driver: str = "acpi_idle", desc: str = "ACPI IOPORT 0x814") -> dict:
    return {
        "driver": driver,
        "states": [
            {
                "state": "state2",
                "name": "C2",
                "desc": desc,
                "usage_before": 1000,
                "usage_after": 1000 + entries,
                "time_us_before": 5000,
                "time_us_after": 5000 + 3 * entries,
            }
        ],
    }


def test_a_lab_run_whose_ioport_path_did_not_run_as_its_condition_says_is_left_out(tmp_path):
    on, off = acpi_idle.LAB_ON, acpi_idle.LAB_OFF
    good_on = {"condition": on, "switch": "1", "cpuidle": _cpuidle(40_000)}
    good_off = {"condition": off, "switch": "0", "cpuidle": _cpuidle(90_000)}
    runs = [
        *({**good_on, "value": v} for v in (12.0, 12.1, 11.9, 12.05, 12.02)),
        *({**good_off, "value": v} for v in (10.0, 10.1, 9.9, 10.05, 10.02)),
        {"condition": on, "switch": "1", "cpuidle": _cpuidle(0, driver="none", desc="x"), "value": 50.0},  # 011
        {"condition": on, "switch": "1", "cpuidle": _cpuidle(0), "value": 51.0},  # 012: C2 never entered
        {"condition": off, "switch": "1", "cpuidle": _cpuidle(80_000), "value": 52.0},  # 013: the wrong switch
        {"condition": off, "switch": "0", "value": 53.0},  # 014: no counters recorded
    ]
    _lab_bundle(tmp_path, runs)
    bundles = find_bundles(tmp_path, "acpi-idle")
    per_run = run_checks("acpi-idle", acpi_idle.CLAIM.checks, bundles)
    failed = per_run[per_run["passed"].ne(True)].groupby("run")["check"].apply(set).to_dict()
    assert set(failed) == {"run-011", "run-012", "run-013", "run-014"}
    assert "cpuidle driver is acpi_idle (lab analogue)" in failed["run-011"]
    assert failed["run-012"] == {
        "I/O-port C-state entered during the run (lab analogue)",
        "dummy wait taken or skipped as the condition says (lab analogue)",
    }
    assert failed["run-013"] == {"dummy wait taken or skipped as the condition says (lab analogue)"}
    observed = per_run.set_index(["run", "check"])["observed"]
    assert observed[("run-001", "dummy wait taken or skipped as the condition says (lab analogue)")] == (
        "processor.dummy_wait=1: 40000 dummy waits over 40000 I/O-port entries"
    )
    assert observed[("run-006", "dummy wait taken or skipped as the condition says (lab analogue)")] == (
        "processor.dummy_wait=0: 0 dummy waits over 90000 I/O-port entries"
    )
    assert observed[("run-001", "I/O-port C-state entered during the run (lab analogue)")] == (
        "C2 (ACPI IOPORT 0x814): +40000 entries, +120000 µs, 3.00 µs an entry"
    )
    table = check_table(per_run)
    assert table["status"].str.contains("left out of the verdicts").sum() >= 3
    measured, _ = measured_runs(bundles, acpi_idle.CLAIM.checks, "acpi-idle")
    assert sorted(set(measured["run"])) == [f"run-{i:03d}" for i in range(1, 11)]
    ctx = SimpleNamespace(
        published=acpi_idle.CLAIM.published(paths.published_dir()), bundles=bundles, data_dir=tmp_path
    )
    rows = [v for v in acpi_idle.CLAIM.verdicts(ctx, n_boot=200) if v.verdict != "not testable here"]
    [row] = rows
    assert row.comparison.startswith(acpi_idle.LAB_LABEL) and row.n_per_condition == "5 vs 5"
    assert row.fresh_effect == pytest.approx(10 / 12, rel=0.02) and "hackbench" in row.comparison
    idle = acpi_idle.lab_idle_table(bundles).set_index("condition")
    assert idle.loc[on, "runs"] == 6 and idle.loc[on, "I/O-port entries per run"] == "40000 [0–40000]"
    assert idle.loc[on, "dummy waits per run"] == "40000 [0–40000]" and idle.loc[on, "µs per I/O-port entry"] == (
        "3.00 [0.00–3.00]"
    )
    # run-013 booted with the switch on under the off condition: its waits show here, and the checks leave it out
    assert idle.loc[off, "dummy waits per run"] == "0 [0–80000]" and idle.loc[off, "runs"] == 6


def test_host_runs_of_the_same_claim_are_not_gated_by_the_lab_checks():
    """The checks apply to the lab conditions only: a host's boot-plan runs (dummy-wait-on/off) carry no guest
    cpuidle record and must not be left out for it."""
    record = {"condition": "dummy-wait-on", "guest": {}}
    for check in acpi_idle.CLAIM.checks:
        assert check.evaluate(record, None) is None
