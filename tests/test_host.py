"""Host facts and host knobs, against a fake sysfs tree (tests/conftest.py: make_fake_host)."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import make_fake_host
from ticklab.host import HostChangeError, HostChanges, collect, host_id
from ticklab.host.facts import format_cpu_list, parse_cpu_list

pytestmark = pytest.mark.xdist_group("machine")

CLOCK = "sys/devices/system/clocksource/clocksource0/current_clocksource"
FEATURES = "sys/kernel/debug/sched/features"


def value(root: Path, relative: str) -> str:
    return (root / relative).read_text().strip()


def test_cpu_list_format():
    assert parse_cpu_list("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]


def test_facts_of_a_fake_host(fake_host):
    found = collect(fake_host)
    assert found["clocksources"] == {"available": ["tsc", "hpet", "acpi_pm"], "current": "tsc"}
    assert found["cpuidle"]["driver"] == "acpi_idle"
    assert [s["name"] for s in found["cpuidle"]["states"]] == ["POLL", "C1", "C2"]
    assert "NO_HRTICK" in found["sched_features"]["features"]
    assert found["nproc"] == 2
    assert host_id(found) == "fake-9000-2c-6.12.57-ticklab-vm"


def test_neither_facts_nor_host_id_contain_the_hostname(monkeypatch):
    real = os.uname()
    fake = os.uname_result((real.sysname, "secret-lab-host-17", real.release, real.version, real.machine))
    monkeypatch.setattr(os, "uname", lambda: fake)
    monkeypatch.setattr("socket.gethostname", lambda: "secret-lab-host-17")
    found = collect("/")
    assert "secret-lab-host-17" not in json.dumps(found) + host_id(found)


def test_no_cpuidle_driver_reads_as_none(tmp_path):
    root = make_fake_host(tmp_path, idle_states=())
    assert collect(root)["cpuidle"] == {"driver": None, "governor": None, "states": []}


def test_changes_are_restored_on_normal_exit_and_recorded(fake_host, tmp_path):
    journal = tmp_path / "journal.json"
    with HostChanges(journal, root=fake_host, log=lambda _: None) as host:
        host.set_clocksource("hpet")
        host.set_sched_feature("HRTICK", True)
        host.set_cpuidle_state("C2", disabled=True)
        assert value(fake_host, CLOCK) == "hpet"
        assert value(fake_host, FEATURES) == "HRTICK"
        assert value(fake_host, "sys/devices/system/cpu/cpu1/cpuidle/state2/disable") == "1"
        assert json.loads(journal.read_text())["changes"][0]["before"] == "tsc"
    assert value(fake_host, CLOCK) == "tsc"
    assert value(fake_host, FEATURES) == "NO_HRTICK"
    assert value(fake_host, "sys/devices/system/cpu/cpu1/cpuidle/state2/disable") == "0"
    assert not journal.exists()
    first = host.records()[0]
    assert (first["before"], first["wanted"], first["during"], first["after"]) == ("tsc", "hpet", "hpet", "tsc")


def test_changes_are_restored_when_the_block_raises(fake_host, tmp_path):
    with pytest.raises(RuntimeError, match="workload failed"):
        with HostChanges(tmp_path / "j.json", root=fake_host, log=lambda _: None) as host:
            host.set_clocksource("acpi_pm")
            raise RuntimeError("workload failed")
    assert value(fake_host, CLOCK) == "tsc"


def test_repeated_writes_restore_the_first_value(fake_host, tmp_path):
    with HostChanges(tmp_path / "j.json", root=fake_host, log=lambda _: None) as host:
        host.set_clocksource("hpet")
        host.set_clocksource("acpi_pm")
    assert value(fake_host, CLOCK) == "tsc"


def test_dry_run_prints_every_write_and_writes_nothing(fake_host, tmp_path):
    said = []
    with HostChanges(tmp_path / "j.json", root=fake_host, dry_run=True, log=said.append) as host:
        host.set_clocksource("hpet")
        host.set_sched_feature("HRTICK", True)
    assert value(fake_host, CLOCK) == "tsc" and value(fake_host, FEATURES).startswith("GENTLE")
    assert said == [
        f"dry-run: would write 'hpet' to {fake_host / CLOCK} (now 'tsc')",
        f"dry-run: would write 'HRTICK' to {fake_host / FEATURES} (now 'NO_HRTICK')",
    ]
    assert not (tmp_path / "j.json").exists()


def test_bad_knobs_name_the_file(fake_host, tmp_path):
    with HostChanges(tmp_path / "j.json", root=fake_host, log=lambda _: None) as host:
        with pytest.raises(HostChangeError, match="available_clocksource: 'kvm-clock' is not available"):
            host.set_clocksource("kvm-clock")
        with pytest.raises(HostChangeError, match="features: this kernel has no sched feature TTWU_QUEUE"):
            host.set_sched_feature("TTWU_QUEUE", True)
        with pytest.raises(HostChangeError, match="cpuidle: no cpuidle state 'C6'"):
            host.set_cpuidle_state("C6", disabled=True)


def test_changes_outside_the_block_are_refused(fake_host, tmp_path):
    with pytest.raises(HostChangeError, match="only inside"):
        HostChanges(tmp_path / "j.json", root=fake_host).set_clocksource("hpet")


# Every wait on the holder is for a line it prints or for its exit after a signal; this bound only keeps a broken test
# from hanging CI (a loaded host made a 30 s bound fail, issue 27 item 18).
WAIT_BOUND_S = 600

HOLDER = textwrap.dedent("""
    import sys, time
    from ticklab.host import HostChanges
    root, journal = sys.argv[1], sys.argv[2]
    with HostChanges(journal, root=root, log=lambda _: None) as host:
        host.set_clocksource("hpet")
        host.set_sched_feature("HRTICK", True)
        print("changed", flush=True)
        # until a signal ends it. Short sleeps: a signal that lands between Python's check for signals and the start
        # of a long blocking wait is only acted on when that wait ends (CI once hung 600 s on a one-hour wait)
        while True:
            time.sleep(0.05)
""")


def start_holder(root: Path, journal: Path) -> subprocess.Popen:
    process = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(root), str(journal)], stdout=subprocess.PIPE, text=True
    )
    assert process.stdout.readline().strip() == "changed"
    assert value(root, CLOCK) == "hpet"
    return process


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
@pytest.mark.slow
def test_a_signal_restores_every_knob(fake_host, tmp_path, signum):
    journal = tmp_path / "j.json"
    process = start_holder(fake_host, journal)
    process.send_signal(signum)
    process.wait(timeout=WAIT_BOUND_S)
    assert process.returncode != 0
    assert value(fake_host, CLOCK) == "tsc"
    assert value(fake_host, FEATURES) == "NO_HRTICK"
    assert not journal.exists()


@pytest.mark.slow
def test_a_killed_process_is_restored_by_the_next_run(fake_host, tmp_path):
    journal = tmp_path / "j.json"
    process = start_holder(fake_host, journal)
    process.kill()
    process.wait(timeout=WAIT_BOUND_S)
    assert value(fake_host, CLOCK) == "hpet" and journal.exists()
    said = []
    with HostChanges(journal, root=fake_host, log=said.append) as host:
        assert value(fake_host, CLOCK) == "tsc"
        assert value(fake_host, FEATURES) == "NO_HRTICK"
        assert [c.path for c in host.recovered] == [str(fake_host / CLOCK), str(fake_host / FEATURES)]
    assert "left by an interrupted capture" in said[0]


@pytest.mark.slow
def test_a_journal_held_by_a_live_process_is_not_touched(fake_host, tmp_path):
    journal = tmp_path / "j.json"
    process = start_holder(fake_host, journal)
    try:
        with pytest.raises(HostChangeError, match=f"host.lock: the host is held by pid {process.pid} "):
            with HostChanges(journal, root=fake_host, log=lambda _: None):
                pass
        assert value(fake_host, CLOCK) == "hpet"
    finally:
        process.terminate()
        process.wait(timeout=WAIT_BOUND_S)
    assert value(fake_host, CLOCK) == "tsc"


# -- issue 27 item 5: a workload a killed capture left running is killed by the next recovery --------------------


def _process_start(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]


def _dead_owner() -> tuple[int, str]:
    """A capture that ran and was killed: its pid and start time (what a process it started follows)."""
    owner = subprocess.Popen(["true"])
    owner_start = _process_start(owner.pid)
    owner.wait()  # gone: the journal's owner was killed
    return owner.pid, owner_start


def _journal_of_a_dead_owner(
    fake_host: Path, journal: Path, entries: list[dict], owner: tuple[int, str] | None = None
) -> None:
    from ticklab.host import facts
    from ticklab.host.journal import write_journal

    owner_pid, owner_start = owner or _dead_owner()
    journal.parent.mkdir(mode=0o700, exist_ok=True)
    write_journal(
        journal,
        {
            "pid": owner_pid,
            "pid_start": owner_start,
            "root": str(fake_host),
            "changes": [
                {
                    "kind": "process",
                    "path": str(fake_host / "proc"),
                    "label": "workload ftq",
                    "during": "running",
                    "boot_id": facts.boot_id(),
                    **entry,
                }
                for entry in entries
            ],
        },
    )


def test_recovery_kills_a_workload_a_killed_capture_left_running(fake_host, tmp_path):
    owner = _dead_owner()  # the capture started before its workload
    # the workload and a child it forked (which does not inherit the parent-death signal), in a session of its own
    # (echo is the shell's own: no third process of the session may be about when recovery counts them)
    workload = subprocess.Popen(
        ["sh", "-c", "sleep 600 & echo $! > child.pid; wait"], cwd=tmp_path, start_new_session=True
    )
    try:
        child = tmp_path / "child.pid"
        while not (child.exists() and child.read_text().endswith("\n")):
            assert workload.poll() is None
            time.sleep(0.01)
        child_pid = int(child.read_text())
        journal = tmp_path / "state" / "j.json"
        _journal_of_a_dead_owner(
            fake_host, journal, [{"pid": workload.pid, "started": _process_start(workload.pid)}], owner
        )
        with HostChanges(journal, root=fake_host, log=lambda _: None) as host:
            assert [c.kind for c in host.recovered] == ["process"]
            assert host.recovered[0].after == "killed 2 process(es)"
        assert workload.wait(timeout=WAIT_BOUND_S) == -signal.SIGKILL
        deadline = time.monotonic() + WAIT_BOUND_S
        while (
            os.path.exists(f"/proc/{child_pid}")
            and Path(f"/proc/{child_pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        ):
            assert time.monotonic() < deadline, f"the workload's child {child_pid} survived recovery"
            time.sleep(0.05)
        assert not journal.exists()
    finally:
        if workload.poll() is None:  # the test failed: leave nothing running
            os.killpg(workload.pid, signal.SIGKILL)
            workload.wait()


def test_recovery_never_kills_a_process_that_got_a_recorded_pid_again(fake_host, tmp_path):
    owner = _dead_owner()
    stranger = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        journal = tmp_path / "state" / "j.json"
        # the journal's workload had this pid but started at another time: the pid was recycled
        recycled = str(int(_process_start(stranger.pid)) + 1)
        _journal_of_a_dead_owner(fake_host, journal, [{"pid": stranger.pid, "started": recycled}], owner)
        with HostChanges(journal, root=fake_host, log=lambda _: None) as host:
            assert host.recovered[0].after.startswith("gone")
        assert stranger.poll() is None
    finally:
        stranger.terminate()
    # had recovery sent SIGKILL, the process would have died of it, whatever came after
    assert stranger.wait(timeout=WAIT_BOUND_S) == -signal.SIGTERM


def test_a_process_entry_must_name_a_pid_and_start_time(fake_host, tmp_path):
    journal = tmp_path / "state" / "j.json"
    _journal_of_a_dead_owner(fake_host, journal, [{"pid": "1; rm", "started": "5"}])
    with pytest.raises(HostChangeError, match=r"not a knob under|changes\[0\]\.pid: .1; rm. is not of type"):
        with HostChanges(journal, root=fake_host, log=lambda _: None):
            pass


def test_processes_started_are_journalled_but_are_not_knobs_in_the_manifest(fake_host, tmp_path):
    journal = tmp_path / "j.json"
    with HostChanges(journal, root=fake_host, log=lambda _: None) as host:
        host.set_clocksource("hpet")
        process = subprocess.Popen(["true"], start_new_session=True)
        host.record_process(process.pid, label="workload true")
        assert [c["kind"] for c in json.loads(journal.read_text())["changes"]] == ["write", "process"]
        process.wait()
        assert [r["label"] for r in host.records()] == ["clocksource"]
    assert [c.after for c in host.changes] == ["tsc", "exited"]


# -- issue 14: root trusts only its own files; one privileged capture at a time ---------------------------


def _planted_journal(directory: Path, root: Path, target: Path) -> Path:
    journal = directory / "host-changes.json"
    journal.write_text(
        json.dumps(
            {
                "pid": 1,
                "pid_start": None,
                "root": str(root),
                "changes": [{"kind": "write", "path": str(target), "before": "owned"}],
            }
        )
    )
    return journal


def test_a_journal_in_a_world_writable_directory_is_refused(fake_host, tmp_path):
    shared = tmp_path / "vartmp"
    shared.mkdir()
    shared.chmod(0o777)
    target = fake_host / CLOCK
    journal = _planted_journal(shared, fake_host, target)
    with pytest.raises(HostChangeError, match=f"{shared}: must be a directory of uid {os.geteuid()} with mode 0700"):
        with HostChanges(journal, root=fake_host, log=lambda _: None):
            pass
    assert value(fake_host, CLOCK) == "tsc" and journal.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the journal to another user")
def test_a_journal_owned_by_another_user_is_refused(fake_host, tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    journal = _planted_journal(state, fake_host, fake_host / CLOCK)
    os.chown(journal, 65534, 65534)
    with pytest.raises(HostChangeError, match="host-changes.json: not a regular file of uid 0 writable only by it"):
        with HostChanges(journal, root=fake_host, log=lambda _: None):
            pass
    assert value(fake_host, CLOCK) == "tsc"


def test_a_journal_naming_a_file_outside_the_knob_trees_is_refused(fake_host, tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    precious = fake_host / "etc" / "shadow"
    precious.parent.mkdir()
    precious.write_text("root:secret\n")
    journal = _planted_journal(state, fake_host, precious)
    with pytest.raises(HostChangeError, match="etc/shadow', not a knob under"):
        with HostChanges(journal, root=fake_host, log=lambda _: None):
            pass
    assert precious.read_text() == "root:secret\n"
    sneaky = _planted_journal(state, fake_host, fake_host / "sys" / ".." / "etc" / "shadow")
    with pytest.raises(HostChangeError, match="not a knob under"):
        with HostChanges(sneaky, root=fake_host, log=lambda _: None):
            pass
    assert precious.read_text() == "root:secret\n"


def test_a_symlinked_journal_is_refused(fake_host, tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    elsewhere = _planted_journal(tmp_path, fake_host, fake_host / CLOCK)
    (state / "host-changes.json").symlink_to(elsewhere)
    with pytest.raises(HostChangeError, match="is a symbolic link; ticklab does not read through links"):
        with HostChanges(state / "host-changes.json", root=fake_host, log=lambda _: None):
            pass


def test_the_default_journal_is_in_a_private_directory(monkeypatch, tmp_path):
    from ticklab.host import journal

    monkeypatch.delenv("TICKLAB_STATE_DIR", raising=False)
    if os.geteuid() == 0:
        assert journal.default_journal() == Path("/run/ticklab/host-changes.json")
    monkeypatch.setenv("TICKLAB_STATE_DIR", str(tmp_path / "state"))
    made = journal.private_dir(journal.default_journal().parent)
    assert made.stat().st_mode & 0o777 == 0o700


@pytest.mark.skipif(os.geteuid() != 0, reason="the host lock is root's (as a user no knob can be changed)")
def test_a_second_capture_with_another_journal_fails_naming_the_holder(fake_host, tmp_path):
    with HostChanges(tmp_path / "a.json", root=fake_host, log=lambda _: None) as first:
        first.set_clocksource("hpet")
        with pytest.raises(HostChangeError) as raised:
            with HostChanges(tmp_path / "b.json", root=fake_host, log=lambda _: None) as second:
                second.set_clocksource("acpi_pm")
        message = str(raised.value)
        assert "\n" not in message
        assert message.startswith(f"{fake_host}/run/ticklab/host.lock: the host is held by pid {os.getpid()} (")
        assert value(fake_host, CLOCK) == "hpet"
    assert value(fake_host, CLOCK) == "tsc"
    assert (fake_host / "run/ticklab").stat().st_mode & 0o777 == 0o700
    with HostChanges(tmp_path / "b.json", root=fake_host, log=lambda _: None):
        pass  # released with the first block


@pytest.mark.skipif(os.geteuid() != 0, reason="the host lock is root's")
def test_a_lock_file_others_can_write_is_refused(fake_host, tmp_path):
    lock = fake_host / "run/ticklab/host.lock"
    lock.parent.mkdir(parents=True, mode=0o700)
    lock.write_text("")
    lock.chmod(0o666)
    with pytest.raises(HostChangeError, match="host.lock: not a regular file of uid 0 writable only by it"):
        with HostChanges(tmp_path / "a.json", root=fake_host, log=lambda _: None):
            pass


def _irqs(root: Path, lists: dict, default: str = "3") -> None:
    (root / "proc/irq").mkdir(parents=True, exist_ok=True)
    (root / "proc/irq/default_smp_affinity").write_text(default + "\n")
    for irq, cpus in lists.items():
        (root / f"proc/irq/{irq}").mkdir()
        (root / f"proc/irq/{irq}/smp_affinity_list").write_text(cpus + "\n")


def test_isolating_a_cpu_moves_every_interrupt_that_may_leave_it_and_puts_them_back(fake_host, tmp_path):
    _irqs(fake_host, {24: "0-1", 25: "0-3", 26: "1", 27: "0"})
    with HostChanges(tmp_path / "j.json", root=fake_host, log=lambda _: None) as host:
        changes = host.isolate_cpu(1)
        assert value(fake_host, "proc/irq/24/smp_affinity_list") == "0"
        assert value(fake_host, "proc/irq/25/smp_affinity_list") == "0,2-3"
        assert value(fake_host, "proc/irq/26/smp_affinity_list") == "1"  # only the measured CPU: it stays
        assert value(fake_host, "proc/irq/27/smp_affinity_list") == "0"
        assert value(fake_host, "proc/irq/default_smp_affinity") == "1"
        assert [c.label for c in changes] == [
            "default IRQ affinity",
            "IRQ 24 affinity",
            "IRQ 25 affinity",
            "tasks moved off the measured CPU",
        ]
        assert changes[-1].tasks == {}  # under a fake root no task of the real system is touched
    assert value(fake_host, "proc/irq/24/smp_affinity_list") == "0-1"
    assert value(fake_host, "proc/irq/25/smp_affinity_list") == "0-3"
    assert value(fake_host, "proc/irq/default_smp_affinity") == "3"


@pytest.mark.slow
def test_interrupt_affinities_left_by_a_killed_capture_are_put_back(fake_host, tmp_path):
    _irqs(fake_host, {30: "0-1"})
    journal = tmp_path / "j.json"
    script = textwrap.dedent("""
        import sys, time
        from ticklab.host import HostChanges
        with HostChanges(sys.argv[2], root=sys.argv[1], log=lambda _: None) as host:
            host.isolate_cpu(1)
            print("changed", flush=True)
            time.sleep(3600)  # until killed
    """)
    process = subprocess.Popen(
        [sys.executable, "-c", script, str(fake_host), str(journal)], stdout=subprocess.PIPE, text=True
    )
    assert process.stdout.readline().strip() == "changed"
    process.kill()
    process.wait(timeout=WAIT_BOUND_S)
    assert value(fake_host, "proc/irq/30/smp_affinity_list") == "0"
    with HostChanges(journal, root=fake_host, log=lambda _: None):
        assert value(fake_host, "proc/irq/30/smp_affinity_list") == "0-1"
        assert value(fake_host, "proc/irq/default_smp_affinity") == "3"


@pytest.mark.skipif(
    os.geteuid() != 0 or len(os.sched_getaffinity(0)) < 2,
    reason="moving another process's CPUs needs root and two CPUs",
)
def test_a_task_moved_off_the_measured_cpu_gets_its_cpus_back(tmp_path):
    child = subprocess.Popen(["sleep", "60"])
    try:
        allowed = os.sched_getaffinity(child.pid)
        measured = max(allowed)
        with HostChanges(tmp_path / "j.json", log=lambda _: None) as host:
            change = host.move_tasks_off(measured, only={child.pid})
            assert os.sched_getaffinity(child.pid) == allowed - {measured}
            assert list(change.tasks) == [str(child.pid)] and change.record()["tasks"] == 1
            journal = json.loads((tmp_path / "j.json").read_text())
            assert journal["changes"][-1]["tasks"][str(child.pid)][1] == format_cpu_list(allowed)
        assert os.sched_getaffinity(child.pid) == allowed
    finally:
        child.kill()
        child.wait()


def test_a_journal_over_a_megabyte_is_still_recovered(fake_host, tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    journal = state / "j.json"
    change = {
        "kind": "write",
        "path": str(fake_host / CLOCK),
        "before": "tsc",
        "wanted": "hpet",
        "label": "x" * (2 << 20),
    }  # as big as the task list of a host with ~40,000 threads
    (fake_host / CLOCK).write_text("hpet\n")
    journal.write_text(json.dumps({"pid": 999999, "root": str(fake_host), "changes": [change]}))
    journal.chmod(0o600)
    with HostChanges(journal, root=fake_host, log=lambda _: None):
        assert value(fake_host, CLOCK) == "tsc"


def test_an_interrupt_freed_during_the_run_is_not_a_failure(fake_host, tmp_path):
    import shutil

    _irqs(fake_host, {24: "0-1", 25: "0-1"})
    with HostChanges(tmp_path / "j.json", root=fake_host, log=lambda _: None) as host:
        host.isolate_cpu(1)
        shutil.rmtree(fake_host / "proc/irq/25")  # the driver let go of it
    assert value(fake_host, "proc/irq/24/smp_affinity_list") == "0-1"
    assert not (tmp_path / "j.json").exists()


def test_a_recovery_that_fails_in_part_keeps_only_what_is_left(fake_host, tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    journal = state / "j.json"
    (fake_host / CLOCK).write_text("hpet\n")
    stuck = fake_host / "sys/devices/system/cpu/cpu7/cpuidle/state9/disable"
    stuck.mkdir(parents=True)  # a directory: cannot be read or written as a knob
    changes = [
        {"kind": "write", "path": str(fake_host / CLOCK), "before": "tsc", "wanted": "hpet"},
        {"kind": "write", "path": str(stuck), "before": "1", "wanted": "0"},
    ]
    journal.write_text(json.dumps({"pid": 999999, "root": str(fake_host), "changes": changes}))
    journal.chmod(0o600)
    with pytest.raises(
        HostChangeError, match=rf"could not restore {stuck} .*; set these by hand, then delete {journal}"
    ):
        with HostChanges(journal, root=fake_host, log=lambda _: None):
            pass
    assert value(fake_host, CLOCK) == "tsc"
    assert [c["path"] for c in json.loads(journal.read_text())["changes"]] == [str(stuck)]


def test_isolating_needs_a_second_cpu(fake_host, tmp_path):
    from ticklab.capture.execute import apply_knobs
    from ticklab.capture.experiment import Condition, Experiment

    experiment = Experiment(
        path=tmp_path / "x.yaml",
        claim="nohz",
        name="x",
        description="",
        conditions={},
        workload={"argv": ["true"]},
        isolate={"cpu": "last", "rt_throttling": "off"},
    )
    with HostChanges(tmp_path / "j.json", root=fake_host, log=lambda _: None) as host:
        with pytest.raises(HostChangeError, match=r"isolate needs a second online CPU .*\(online here: \[0\]\)"):
            apply_knobs(host, experiment, Condition("c", {}), {"online_cpus": [0]})
        assert host.changes == []


@pytest.mark.skipif(
    os.geteuid() != 0 or len(os.sched_getaffinity(0)) < 2,
    reason="moving another process's CPUs needs root and two CPUs",
)
def test_tasks_started_during_the_run_get_the_cpu_back_and_a_list_set_meanwhile_is_kept(tmp_path):
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent("""
        import subprocess, sys
        for line in sys.stdin:
            print(subprocess.Popen(["sleep", "60"]).pid, flush=True)
    """),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    other = subprocess.Popen(["sleep", "60"])
    try:
        allowed = os.sched_getaffinity(parent.pid)
        measured = max(allowed)
        with HostChanges(tmp_path / "j.json", log=lambda _: None) as host:
            host.move_tasks_off(measured, only={parent.pid, other.pid})
            parent.stdin.write("fork\n")
            parent.stdin.flush()
            child = int(parent.stdout.readline())
            assert os.sched_getaffinity(child) == allowed - {measured}  # inherited from its moved parent
            os.sched_setaffinity(other.pid, {measured})  # somebody else's choice during the run
        assert os.sched_getaffinity(parent.pid) == allowed
        assert os.sched_getaffinity(child) == allowed
        assert os.sched_getaffinity(other.pid) == {measured}
        os.kill(child, signal.SIGKILL)
    finally:
        for process in (parent, other):
            process.kill()
            process.wait()


def test_every_kind_a_journal_may_list_is_registered_with_its_own_undo():
    """recover() puts each entry back through its kind: a kind the journal's schema admits with no registered kind, or
    one that has no undo of its own, would be journalled and never put back."""
    from ticklab.host import journal
    from ticklab.schemas import problem

    admitted = journal.journal_schema()["properties"]["changes"]["items"]["properties"]["kind"]["enum"]
    assert admitted == list(journal.KINDS) and len(admitted) == 10
    assert problem({"changes": [{"kind": "teleport", "path": "/x"}]}, journal.journal_schema()).startswith(
        "changes[0].kind: 'teleport' is not one of ['write', 'sched_feature'"
    )
    for name, kind in journal.KINDS.items():
        assert kind.name == name
        assert type(kind).undo is not journal.ChangeKind.undo, f"{name}: no undo of its own"
        assert type(kind).describe is not journal.ChangeKind.describe, f"{name}: no dry-run line of its own"
    with pytest.raises(HostChangeError, match="unknown change kind 'teleport' in journal"):
        journal.undo(journal.Change("teleport", "/sys/x"))
