"""Interference records: /proc sampled on a fake root, summarised exactly; recorded per run; flagged in bundle
health."""

from datetime import UTC, datetime
from pathlib import Path

import pytest

from test_capture import needs_tools, write_experiment
from ticklab.analysis.captured import bundle_health
from ticklab.bundle import BundleError, BundleWriter, load_bundle
from ticklab.capture.interference import Sample, read_sample, summarise
from ticklab.capture.runner import CaptureOptions, capture

OWN = 100  # the capturing process in the fake /proc
WHEN = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def put(root: Path, relative: str, text: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def write_proc(
    root: Path,
    *,
    load1: str,
    procs_running: int,
    cpu: str,
    threads: dict[tuple[int, int], tuple[int, str]],
    comm: str = "task",
) -> None:
    """A fake /proc: loadavg, stat, and proc/<pid>/task/<tid>/stat for threads {(pid, tid): (ppid, state)}."""
    for old in (root / "proc").glob("[0-9]*/task/[0-9]*/stat"):
        old.unlink()
    put(root, "proc/loadavg", f"{load1} 0.40 0.30 {procs_running}/90 999")
    put(root, "proc/stat", f"{cpu}\ncpu0 1 2 3 4\nintr 0\nprocs_running {procs_running}\nprocs_blocked 0")
    for (pid, tid), (ppid, state) in threads.items():
        put(root, f"proc/{pid}/task/{tid}/stat", f"{tid} ({comm}) {state} {ppid} {pid} {pid} 0 -1 4194560 0 0")


def test_samples_of_a_fake_proc_summarise_to_exact_numbers_and_the_busy_rule(tmp_path):
    root = tmp_path / "root"
    put(root, "sys/devices/system/cpu/online", "0-1")
    samples = []
    # before: only the capturing process runs; one foreign process sleeps
    write_proc(
        root,
        load1="0.50",
        procs_running=2,
        cpu="cpu  100 0 50 800 0 0 0 10 0 0",
        threads={(OWN, OWN): (1, "R"), (200, 200): (1, "S")},
    )
    samples.append(read_sample(root, own_pid=OWN))
    # during: the workload (101, two threads) and three foreign tasks (200, 201 and 200's child 300) runnable
    write_proc(
        root,
        load1="3.00",
        procs_running=6,
        cpu="cpu  200 0 100 1500 0 0 0 60 20 0",
        threads={
            (OWN, OWN): (1, "R"),
            (101, 101): (OWN, "R"),
            (101, 102): (OWN, "R"),
            (200, 200): (1, "R"),
            (201, 201): (1, "R"),
            (300, 300): (200, "R"),
        },
        comm="a (b) c",
    )
    samples.append(read_sample(root, own_pid=OWN))
    write_proc(
        root,
        load1="2.50",
        procs_running=4,
        cpu="cpu  300 0 150 2200 0 0 0 110 40 0",
        threads={
            (OWN, OWN): (1, "R"),
            (101, 101): (OWN, "R"),
            (200, 200): (1, "R"),
            (201, 201): (1, "S"),
            (300, 300): (200, "S"),
        },
    )
    samples.append(read_sample(root, own_pid=OWN))

    assert samples[1] == Sample(load1=3.0, runnable=6, other_runnable=3, cpu_ticks=1860, steal_ticks=60)
    summary = summarise(samples, cpus=2)
    assert summary == {
        "cpus": 2,
        "interval_s": 0.5,
        "samples": 3,
        "load1_before": 0.5,
        "load1_max": 3.0,
        "runnable_before": 2,
        "runnable_max": 6,
        "runnable_mean": 5.0,
        "other_runnable_before": 0,
        "other_runnable_max": 3,
        "other_runnable_mean": 2.0,
        "samples_over_cpus": 1,
        "steal_fraction": 100 / 1800,
        "busy": True,
        "why": "more runnable tasks outside the run than CPUs (2) in 1 of 3 samples (up to 3)",
    }
    # the same samples on a 4-CPU machine: never more foreign runnable tasks than CPUs, steal 5.6 %: not busy
    assert (summarise(samples, cpus=4)["busy"], summarise(samples, cpus=4)["why"]) == (False, None)
    assert summarise(samples, cpus=3)["busy"] is False  # 3 foreign tasks on 3 CPUs: each could have its own


def test_steal_alone_makes_a_run_busy_and_a_kernel_without_steal_reports_none(tmp_path):
    quiet = [Sample(0.1, 1, 0, 1000, 0), Sample(0.1, 1, 0, 2000, 250)]
    summary = summarise(quiet, cpus=2)
    assert (summary["steal_fraction"], summary["busy"], summary["why"]) == (
        0.25,
        True,
        "25% of CPU time stolen by the hypervisor",
    )
    root = tmp_path / "root"
    write_proc(root, load1="0.10", procs_running=1, cpu="cpu  10 20 30 40 5 6 7", threads={(OWN, OWN): (1, "R")})
    old_kernel = [read_sample(root, own_pid=OWN)] * 2
    assert old_kernel[0].steal_ticks is None and summarise(old_kernel, cpus=1)["steal_fraction"] is None
    assert summarise([Sample(None, None, None, None, None)] * 2, cpus=1)["busy"] is None  # /proc unreadable: unknown


def _run(run: str, busy: bool | None, warmup: bool = False, **extra) -> dict:
    interference = {
        "busy": busy,
        "cpus": 8,
        "load1_before": 40.0,
        "load1_max": 67.0,
        "other_runnable_max": 41,
        "steal_fraction": 0.0,
        "why": "more runnable tasks outside the run than CPUs (8) in 9 of 10 samples" if busy else None,
        **extra,
    }
    return {"run": run, "condition": "tick-on", "status": "ok", "warmup": warmup, "interference": interference}


def test_bundle_health_flags_runs_on_a_busy_host_and_old_bundles_still_load(tmp_path):
    writer = BundleWriter(tmp_path, "host-a", "nohz", "ftq", definition={}, host={}, when=WHEN)
    for record in (
        _run("run-001", True, warmup=True),
        _run("run-002", True),
        _run("run-003", False),
        _run("run-004", True, load1_max=45.5),
        {"run": "run-005", "condition": "tick-on", "status": "ok"},
    ):
        writer.add_run(record, [])
    writer.seal()
    [row] = bundle_health(tmp_path, ["nohz"]).itertuples()
    assert row.busy_runs == 2
    assert row.flag == (
        "2 of 4 measured run(s) on a busy host: up to 41 runnable tasks besides the run's own on "
        "8 CPU(s), load average up to 67.0"
    )

    old = BundleWriter(tmp_path / "old", "host-a", "nohz", "ftq", definition={}, host={}, when=WHEN)
    old.add_run({"run": "run-001", "condition": "tick-on", "status": "ok"}, [])
    load_bundle(old.seal())
    [row] = bundle_health(tmp_path / "old", ["nohz"]).itertuples()
    assert (row.busy_runs, row.flag) == (0, "")


def test_a_malformed_interference_record_is_refused_naming_the_field(tmp_path):
    writer = BundleWriter(tmp_path, "host-a", "nohz", "ftq", definition={}, host={}, when=WHEN)
    writer.add_run(_run("run-001", True, steal_fraction=1.5), [])
    with pytest.raises(BundleError, match=r"runs\[0\]\.interference\.steal_fraction: 1\.5 is not <= 1"):
        load_bundle(writer.seal())


@pytest.mark.slow
def test_every_bundle_in_traces_still_loads():
    from conftest import REPO

    manifests = sorted((REPO / "traces").glob("*/*/*/manifest.json"))
    assert manifests
    for manifest in manifests:
        if manifest.parent.parent.parent.name != "published":
            load_bundle(manifest.parent, allow_incomplete=True)


@pytest.mark.slow
@needs_tools
def test_a_capture_on_a_fake_busy_host_records_interference_in_every_run_and_is_flagged(fake_host, tmp_path):
    # a fake /proc that does not change: three foreign runnable tasks on the fake host's two CPUs, load 5
    write_proc(
        fake_host,
        load1="5.00",
        procs_running=4,
        cpu="cpu  100 0 50 800 0 0 0 10 0 0",
        threads={(200, 200): (1, "R"), (201, 201): (1, "R"), (202, 202): (1, "R"), (203, 203): (1, "S")},
    )
    options = CaptureOptions(out=tmp_path / "traces", root=fake_host, journal=tmp_path / "j.json", progress=False)
    said = []
    [bundle_path] = capture("hpet", options, experiment_path=write_experiment(tmp_path), log=said.append)
    runs = load_bundle(bundle_path).manifest.runs
    assert len(runs) == 9
    for record in runs:
        found = record.interference
        assert found["samples"] >= 2  # one before the workload, one after it at least
        assert {
            k: found[k]
            for k in (
                "cpus",
                "load1_before",
                "load1_max",
                "runnable_max",
                "other_runnable_before",
                "other_runnable_max",
                "other_runnable_mean",
                "steal_fraction",
                "busy",
            )
        } == {
            "cpus": 2,
            "load1_before": 5.0,
            "load1_max": 5.0,
            "runnable_max": 4,
            "other_runnable_before": 3,
            "other_runnable_max": 3,
            "other_runnable_mean": 3.0,
            "steal_fraction": None,
            "busy": True,
        }
    assert any(line.startswith("run-001: ran on a busy host — more runnable tasks outside the run") for line in said)
    [row] = bundle_health(tmp_path / "traces", ["hpet"]).itertuples()
    assert row.flag == (
        "6 of 6 measured run(s) on a busy host: up to 3 runnable tasks besides the run's own on "
        "2 CPU(s), load average up to 5.0"
    )


@pytest.mark.xdist_group("machine")
def test_a_lab_run_records_the_physical_hosts_load_and_keeps_the_guests_beside_it(fake_host, tmp_path, monkeypatch):
    """The guest side runs in this process instead of under QEMU; the host side samples a fake busy /proc."""
    import functools
    import json
    import types

    import yaml

    from ticklab.capture import interference
    from ticklab.capture.experiment import Condition, PlannedRun, load_experiment
    from ticklab.lab import qemu
    from ticklab.lab import run as lab_run_module
    from ticklab.lab.guest import run_job
    from ticklab.lab.run import LabExecutor, LabOptions

    write_proc(
        fake_host,
        load1="7.00",
        procs_running=5,
        cpu="cpu  100 0 50 800 0 0 0 10 0 0",
        threads={(200, 200): (1, "R"), (201, 201): (1, "R"), (202, 202): (1, "R")},
    )
    monkeypatch.setattr(
        lab_run_module,
        "interference",
        types.SimpleNamespace(Sampler=functools.partial(interference.Sampler, fake_host)),
    )
    guest_runs = []

    def boot_in_this_process(boot):
        guest_runs.append(run_job(boot.share / "job.json", work=tmp_path / "work"))
        return {"status": "ok", "exit": 0, "seconds": 0.0}

    monkeypatch.setattr(qemu, "run_boot", boot_in_this_process)
    definition = {
        "claim": "nohz",
        "name": "guest-echo",
        "description": "one command",
        "runs": 1,
        "warmup": 0,
        "requires": [],
        "lab": {"smp": 1},
        "conditions": [{"name": "plain"}],
        "workload": {"tool": "ftq", "argv": ["sh", "-c", "echo hello > said.txt"]},
    }
    path = tmp_path / "guest-echo.yaml"
    path.write_text(yaml.safe_dump(definition))
    kernels = {"hz1000": types.SimpleNamespace(image=tmp_path / "bzImage", info={"release": "6.12.0-fake"})}
    setting = {"kernel": "hz1000", "smp": 1, "memory_mb": 256, "cmdline": [], "clocksource": None}
    lab = LabExecutor(
        load_experiment(path),
        LabOptions(out=tmp_path / "traces", progress=False),
        kernels,
        types.SimpleNamespace(initramfs=tmp_path / "initramfs"),
        "tcg",
        {"plain": setting},
        log=lambda _: None,
    )
    writer = BundleWriter(tmp_path / "traces", "guest-fake", "nohz", "guest-echo", definition={}, host={}, when=WHEN)
    assert lab.make_run(writer, PlannedRun("run-001", 0, Condition("plain", {}), False))
    [guest] = guest_runs
    assert "error" not in guest, guest.get("error")
    record = json.loads((writer.path / "manifest.json").read_text())["runs"][0]
    host = record["interference"]
    assert (host["cpus"], host["load1_before"], host["runnable_before"], host["other_runnable_max"], host["busy"]) == (
        2,
        7.0,
        5,
        3,
        True,
    )
    assert record["guest_interference"] == guest["record"]["interference"]
    assert record["guest_interference"]["samples"] >= 2  # the guest's own sampler, around its workload
    assert "interference" not in record["boot"]
    assert bundle_health(tmp_path / "traces", ["nohz"]).iloc[0]["busy_runs"] == 1
