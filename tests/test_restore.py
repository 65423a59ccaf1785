"""Issue 40 item 4: after kill -9 of a capture, `ticklab doctor` says what it left changed and `ticklab restore` puts
it back, without waiting for the next capture; refused while the capture still runs."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO, WAIT_BOUND_S, gone, wait_for
from ticklab.capture.requirements import tools_bin
from ticklab.doctor import render
from ticklab.host import facts
from ticklab.host.journal import HostBusy, HostLock, lock_path, write_journal

pytestmark = pytest.mark.xdist_group("machine")

CLOCK = "sys/devices/system/clocksource/clocksource0/current_clocksource"
RT_RUNTIME = "proc/sys/kernel/sched_rt_runtime_us"
IRQ_LISTS = {24: "0-1", 25: "0-1", 26: "1", 27: "0"}


def value(root: Path, relative: str) -> str:
    return (root / relative).read_text().strip()


def ticklab(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ticklab.cli", *argv], capture_output=True, text=True, cwd=REPO, timeout=WAIT_BOUND_S
    )


@pytest.fixture
def isolating_host(fake_host: Path) -> Path:
    """The fake host with what an isolating capture writes: RT throttling and interrupt affinities."""
    (fake_host / RT_RUNTIME).write_text("950000\n")
    (fake_host / "proc/irq").mkdir(parents=True)
    (fake_host / "proc/irq/default_smp_affinity").write_text("3\n")
    for irq, cpus in IRQ_LISTS.items():
        (fake_host / f"proc/irq/{irq}").mkdir()
        (fake_host / f"proc/irq/{irq}/smp_affinity_list").write_text(cpus + "\n")
    return fake_host


def host_state(root: Path) -> dict:
    return {
        "clocksource": value(root, CLOCK),
        "rt_runtime": value(root, RT_RUNTIME),
        "default_irq": value(root, "proc/irq/default_smp_affinity"),
        "irqs": {irq: value(root, f"proc/irq/{irq}/smp_affinity_list") for irq in IRQ_LISTS},
    }


def start_isolating_capture(root: Path, tmp_path: Path) -> tuple[subprocess.Popen, int, Path]:
    """A real `ticklab capture` on the fake host, as seed 004's FTQ runs (isolate, RT throttling off), whose
    workload (a shell that execs sleep) is running: (the capture, the workload's pid, its journal)."""
    experiment = tmp_path / "isolated.yaml"
    experiment.write_text(
        yaml.safe_dump(
            {
                "claim": "hpet",
                "name": "isolated",
                "description": "an isolated workload on a fake host",
                "runs": 2,
                "warmup": 0,
                "timeout_s": 600,
                "seed": 7,
                "requires": [],
                "isolate": {"cpu": "last", "rt_throttling": "off"},
                "conditions": [{"name": "on-hpet", "clocksource": "hpet"}],
                "knobs": {"clocksource": "clocksource"},
                "workload": {
                    "tool": "hackbench",
                    "argv": [
                        "sh",
                        "-c",
                        "echo $$ > workload.pid.tmp && mv workload.pid.tmp workload.pid && exec sleep 600",
                    ],
                },
            }
        )
    )
    journal = tmp_path / "state" / "host-changes.json"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ticklab.cli",
            "capture",
            "hpet",
            "--experiment",
            str(experiment),
            "--root",
            str(root),
            "--journal",
            str(journal),
            "--out",
            str(tmp_path / "traces"),
            "--no-progress",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )

    def started():
        return list((tmp_path / "traces").glob("*/hpet/*/raw/*/workload.pid"))

    wait_for(started, "the capture never started its workload", process)
    return process, int(started()[0].read_text()), journal


@pytest.mark.slow
def test_doctor_reports_what_a_killed_capture_left_and_restore_puts_it_back(isolating_host, tmp_path):
    root = isolating_host
    before = host_state(root)
    process, workload, journal = start_isolating_capture(root, tmp_path)
    process.kill()
    process.communicate(timeout=WAIT_BOUND_S)
    wait_for(lambda: gone(workload), "the workload outlived its capture")
    left = host_state(root)
    assert left == {
        "clocksource": "hpet",
        "rt_runtime": "-1",
        "default_irq": "1",
        "irqs": {24: "0", 25: "0", 26: "1", 27: "0"},
    }  # the host as the kill left it
    assert journal.exists()

    if os.geteuid() == 0:  # doctor's probes (tracefs, trace-cmd, perf) need root
        doctor = ticklab("doctor", "--json", "--root", str(root), "--journal", str(journal))
        assert doctor.returncode == 0, doctor.stderr
        report = json.loads(doctor.stdout)
        row = report["checks"]["host changes left behind"]
        assert not row["ok"]
        assert f"change(s) left by pid {process.pid}, which is gone" in row["why"]
        assert row["why"].endswith("put them back: ticklab restore")
        assert row["left"]["writer"] == "gone" and row["left"]["pid"] == process.pid
        assert "capture hpet" in row["left"]["owner"] and row["left"]["started"] and row["left"]["written"]
        labels = [change.get("label") for change in row["left"]["changes"]]
        assert {
            "clocksource",
            "RT throttling off",
            "default IRQ affinity",
            "IRQ 24 affinity",
            "tasks moved off the measured CPU",
        } <= set(labels)
        assert any(
            line.startswith("RT throttling off: ") and "'-1', was '950000'" in line for line in row["left"]["summary"]
        )
        shown = render(report).splitlines()  # what `ticklab doctor` prints: the left changes first, then the command
        assert shown[2].startswith(f"This host is still changed by pid {process.pid} (") and "which is gone" in shown[2]
        assert any(line.startswith("  RT throttling off: ") for line in shown)
        assert "Put it back: ticklab restore" in shown
        assert host_state(root) == left and journal.exists()  # doctor says; it puts nothing back

    restored = ticklab("restore", "--root", str(root), "--journal", str(journal))
    assert restored.returncode == 0, restored.stderr
    assert "put back: RT throttling off: " in restored.stdout and "restored " in restored.stdout
    assert host_state(root) == before
    assert not journal.exists()
    again = ticklab("restore", "--root", str(root), "--journal", str(journal))
    assert again.returncode == 0
    assert again.stdout.strip() == f"nothing to restore: no journal of host changes at {journal}"


@pytest.mark.slow
def test_restore_is_refused_while_the_capture_that_wrote_the_journal_runs(isolating_host, tmp_path):
    root = isolating_host
    before = host_state(root)
    process, workload, journal = start_isolating_capture(root, tmp_path)
    try:
        refused = ticklab("restore", "--root", str(root), "--journal", str(journal))
        assert refused.returncode == 2
        [line] = refused.stderr.splitlines()
        assert line.startswith(f"ticklab restore: {journal}: not restored: the host is held by pid {process.pid} (")
        assert host_state(root)["rt_runtime"] == "-1" and journal.exists()  # nothing touched
    finally:
        process.terminate()  # the capture puts the host back itself
        process.communicate(timeout=WAIT_BOUND_S)
    assert host_state(root) == before and not journal.exists()


def _dead_pid() -> tuple[int, str]:
    owner = subprocess.Popen(["true"])
    start = Path(f"/proc/{owner.pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    owner.wait()
    return owner.pid, start


@pytest.mark.slow
def test_a_journal_of_another_boot_is_removed_without_writing_anything(isolating_host, tmp_path):
    """A state directory on disk keeps a journal across a reboot: what it lists, the reboot reset (and the previous
    boot's interrupt numbers mean nothing now): restore writes nothing and removes it."""
    root = isolating_host
    (root / RT_RUNTIME).write_text("950000\n")  # the new boot's value, which the old journal would overwrite
    journal = tmp_path / "state" / "host-changes.json"
    journal.parent.mkdir(mode=0o700)
    pid, start = _dead_pid()
    write_journal(
        journal,
        {
            "pid": pid,
            "pid_start": start,
            "boot_id": "another-boot",
            "root": str(root),
            "changes": [
                {
                    "kind": "write",
                    "path": str(root / RT_RUNTIME),
                    "before": "100000",
                    "wanted": "-1",
                    "label": "RT throttling off",
                }
            ],
        },
    )
    restored = ticklab("restore", "--root", str(root), "--journal", str(journal))
    assert restored.returncode == 0, restored.stderr
    assert "written in another boot" in restored.stdout
    assert value(root, RT_RUNTIME) == "950000" and not journal.exists()


@pytest.mark.slow
def test_a_change_that_cannot_be_put_back_is_one_line_naming_it(isolating_host, tmp_path):
    root = isolating_host
    stuck = root / "sys/devices/system/cpu/cpu7/cpuidle/state9/disable"
    stuck.mkdir(parents=True)  # a directory: cannot be written as a knob
    (root / RT_RUNTIME).write_text("-1\n")
    journal = tmp_path / "state" / "host-changes.json"
    journal.parent.mkdir(mode=0o700)
    pid, start = _dead_pid()
    write_journal(
        journal,
        {
            "pid": pid,
            "pid_start": start,
            "boot_id": facts.boot_id(),
            "root": str(root),
            "changes": [
                {"kind": "write", "path": str(root / RT_RUNTIME), "before": "950000", "wanted": "-1"},
                {"kind": "write", "path": str(stuck), "before": "1", "wanted": "0"},
            ],
        },
    )
    failed = ticklab("restore", "--root", str(root), "--journal", str(journal))
    assert failed.returncode == 2
    [line] = failed.stderr.splitlines()
    assert line.startswith(f"ticklab restore: {journal}: could not restore {stuck} (") and "set these by hand" in line
    assert value(root, RT_RUNTIME) == "950000"  # the rest is put back
    assert [c["path"] for c in json.loads(journal.read_text())["changes"]] == [str(stuck)]


# -- a real capture on this host, killed outright ------------------------------------------------------------------


def _all_task_cpus() -> dict:
    """(tid, start time) -> CPU list of every task."""
    cpus = {}
    for task in Path("/proc").glob("[0-9]*/task/[0-9]*"):
        try:
            start = (task / "stat").read_text().rsplit(")", 1)[1].split()[19]
            cpus[(task.name, start)] = frozenset(os.sched_getaffinity(int(task.name)))
        except (OSError, IndexError):
            continue  # gone meanwhile
    return cpus


def _real_host_state() -> dict:
    irqs = {p.parent.name: p.read_text() for p in Path("/proc/irq").glob("*/smp_affinity_list")}
    return {
        "rt_runtime": Path("/proc/sys/kernel/sched_rt_runtime_us").read_text(),
        "default_irq": Path("/proc/irq/default_smp_affinity").read_text(),
        "irqs": irqs,
        # the mounts a capture makes (another test's tmpfs "full disk" may come and go meanwhile)
        "mounts": {point: kind for point, kind in facts.mounts(Path("/")).items() if kind in ("tracefs", "debugfs")},
        "instances": sorted(os.listdir("/sys/kernel/tracing/instances")),
        "tasks": _all_task_cpus(),
    }


def _with_the_host_free(read):
    """``read()`` while holding the host lock, so that no capture (another user's) changes the host meanwhile; waits
    for one that runs to end."""

    def free():
        try:
            held.append(HostLock(lock_path("/")).acquire())
            return True
        except HostBusy:
            return False

    held = []
    wait_for(free, "the host lock was never free")
    try:
        return read()
    finally:
        held[0].release()


def _isolation_journalled(journal: Path) -> bool:
    """The capture has moved the tasks off the measured CPU and started its workload (journalled before made)."""
    try:
        changes = json.loads(journal.read_text())["changes"]
    except (OSError, ValueError):
        return False  # not yet written (it is replaced whole, never seen half-written)
    return any(c["kind"] == "task_affinity" and "during" in c for c in changes) and any(
        c["kind"] == "process" and c.get("label", "").startswith("workload ") for c in changes
    )


def _restored(journal: Path) -> bool:
    """`ticklab restore` put the host back; False when it was refused because another capture (another user's, with
    its own journal) took the host after the kill: that one ends by putting back only what it changed."""
    done = ticklab("restore", "--journal", str(journal))
    if done.returncode == 2 and "not restored: the host is held by" in done.stderr:
        return False
    assert done.returncode == 0, done.stderr
    return True


# online CPUs, not this process's CPU list: started while another capture isolates a CPU, it has one CPU fewer
@pytest.mark.slow
@pytest.mark.skipif(
    os.geteuid() != 0 or not Path("/sys/kernel/tracing").is_dir() or len(facts.online_cpus(Path("/"))) < 2,
    reason="a real isolating capture needs root, tracefs and two CPUs",
)
@pytest.mark.skipif(not (tools_bin() / "ftq").exists(), reason="tools not built: run 'make tools'")
def test_kill_9_of_a_real_capture_then_restore_puts_this_host_back(tmp_path):
    journal = tmp_path / "state" / "host-changes.json"
    argv = [
        sys.executable,
        "-m",
        "ticklab.cli",
        "capture",
        "nohz",
        "--experiment",
        str(REPO / "runners/nohz/ftq.yaml"),
        "--runs",
        "1",
        "--warmup",
        "0",
        "--journal",
        str(journal),
        "--out",
        str(tmp_path / "traces"),
        "--no-progress",
    ]
    try:
        while True:  # another capture may take the host between our look at it and our start: then start again
            before = _with_the_host_free(_real_host_state)
            process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
            wait_for(
                lambda: process.poll() is not None or _isolation_journalled(journal),
                "the capture never isolated its CPU",
            )
            if process.poll() is None:
                break
            _, stderr = process.communicate()
            assert "the host is held by" in stderr, stderr
        process.kill()
        process.communicate(timeout=WAIT_BOUND_S)
        assert Path("/proc/sys/kernel/sched_rt_runtime_us").read_text().strip() == "-1"  # as the kill left it
        wait_for(lambda: _restored(journal), "ticklab restore never found the host free")
        after = _with_the_host_free(_real_host_state)
    finally:
        if journal.exists():  # the test failed: leave the shared host as it was
            wait_for(lambda: _restored(journal), "ticklab restore never found the host free")
    assert not journal.exists()
    for key in ("rt_runtime", "default_irq", "mounts", "instances"):
        assert after[key] == before[key], key
    assert {irq: cpus for irq, cpus in after["irqs"].items() if irq in before["irqs"]} == before["irqs"]
    changed = {
        task: (cpus, after["tasks"][task])
        for task, cpus in before["tasks"].items()
        if task in after["tasks"] and after["tasks"][task] != cpus
    }
    assert not changed, f"{len(changed)} tasks kept another CPU list, e.g. {list(changed.items())[:5]}"


def test_restore_puts_back_every_valid_entry_and_names_each_refused_one(isolating_host, tmp_path):
    """Issue 55 items 6-7: a hand-edited journal made restore write core_pattern (a later crash ran the helper as root),
    write the boot plan's unit with any content and kill another user's process; and an event name with '..' in it
    made restore refuse the whole journal, leaving the tracefs instance and saved_cmdlines_size changed. Each entry is
    now checked against what its kind may touch: the valid ones are put back, each refused one named."""
    root = isolating_host
    stranger = subprocess.Popen(["sleep", "600"], start_new_session=True)  # started before the capture
    try:
        stranger_start = int(facts.stat_fields(Path(f"/proc/{stranger.pid}/stat").read_text())[19])
        pid, start = _dead_pid()
        while int(start) <= stranger_start:  # a clock tick later (start times count ticks)
            pid, start = _dead_pid()
        (root / RT_RUNTIME).write_text("-1\n")
        core = root / "proc/sys/kernel/core_pattern"
        core.write_text("core\n")
        unit = root / "etc/systemd/system/ticklab-plan.service"
        saved = root / "sys/kernel/tracing/saved_cmdlines_size"
        saved.parent.mkdir(parents=True, exist_ok=True)
        saved.write_text("32768\n")
        outside = tmp_path / "outside"
        (outside / "x").mkdir(parents=True)
        escaped = root / "sys/kernel/tracing/instances/ticklab-1/events/irq/../../../../../../outside/x/enable"
        journal = tmp_path / "state" / "host-changes.json"
        journal.parent.mkdir(mode=0o700)
        write_journal(
            journal,
            {
                "pid": pid,
                "pid_start": start,
                "boot_id": facts.boot_id(),
                "root": str(root),
                "changes": [
                    {"kind": "write", "path": str(root / RT_RUNTIME), "before": "950000", "wanted": "-1"},
                    {"kind": "write", "path": str(saved), "before": "128", "wanted": "32768"},
                    {"kind": "write", "path": str(core), "before": "|/tmp/helper", "wanted": "core"},
                    {"kind": "write", "path": str(escaped), "before": "0", "wanted": "1"},
                    {"kind": "file", "path": str(unit), "before": "[Service]\nExecStart=/tmp/evil\n"},
                    {"kind": "mount", "path": str(root / "home"), "before": "unmounted", "wanted": "tracefs"},
                    {
                        "kind": "process",
                        "path": str(root / "proc"),
                        "pid": stranger.pid,
                        "started": facts.stat_fields(Path(f"/proc/{stranger.pid}/stat").read_text())[19],
                        "boot_id": facts.boot_id(),
                    },
                ],
            },
        )
        failed = ticklab("restore", "--root", str(root), "--journal", str(journal))
        assert stranger.poll() is None  # not killed: started before the capture that wrote the journal
    finally:
        stranger.kill()
        stranger.wait()
    assert failed.returncode == 2
    assert value(root, RT_RUNTIME) == "950000" and value(root, "sys/kernel/tracing/saved_cmdlines_size") == "128"
    assert value(root, "proc/sys/kernel/core_pattern") == "core" and not unit.exists()
    assert not (outside / "x/enable").exists()
    err = failed.stderr
    assert "Traceback" not in err
    for named in (
        "core_pattern",
        "outside/x/enable",
        "ticklab-plan.service",
        str(root / "home"),
        f"pid {stranger.pid}",
    ):
        assert named in err
    left = json.loads(journal.read_text())["changes"]
    assert len(left) == 5 and {c["kind"] for c in left} == {"write", "file", "mount", "process"}
