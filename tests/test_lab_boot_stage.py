"""A lab guest hung in its kernel's boot is stopped at the boot deadline (``lab.boot_timeout_s``), not after the whole
run's timeout: the guest's job starting (runners/vm/init's line on the console) ends the boot stage."""

from __future__ import annotations

import os
import time
from pathlib import Path

from ticklab.lab import qemu


class _Running:
    """A QEMU that has not ended."""

    def poll(self):
        return None


def _boot(tmp_path: Path, **how) -> qemu.Boot:
    return qemu.Boot(tmp_path / "bzImage", tmp_path / "initrd", tmp_path, tmp_path / "console.log", **how)


def test_a_guest_whose_job_started_is_past_its_boot_stage_whatever_the_time(tmp_path):
    boot = _boot(tmp_path, boot_timeout_s=1)
    # the line split across what QEMU wrote: the kernel's log, then the init's line
    boot.console.write_bytes(b"[    2.011289] Run /init as init process\n" + qemu.JOB_STARTED + b"\n")
    long_ago = time.monotonic() - 3600
    assert qemu._wait_for_job(_Running(), boot, long_ago) is None


def test_a_guest_without_its_job_line_past_the_boot_deadline_is_a_boot_timeout(tmp_path):
    boot = _boot(tmp_path, boot_timeout_s=60)
    boot.console.write_bytes(b"[    0.491566] ACPI: 1 ACPI AML tables successfully acquired and loaded\n")
    assert qemu._wait_for_job(_Running(), boot, time.monotonic() - 61) == "boot-timeout"


def test_the_job_line_is_found_when_a_read_ends_inside_it(tmp_path):
    console = tmp_path / "console.log"
    head = b"x" * 100 + qemu.JOB_STARTED[:10]
    console.write_bytes(head)
    seen, offset = qemu._job_started(console, 0)
    assert not seen and offset == len(head)
    with console.open("ab") as stream:
        stream.write(qemu.JOB_STARTED[10:] + b"\n")
    assert qemu._job_started(console, offset)[0]


def test_a_hung_boot_is_stopped_at_the_boot_deadline_with_the_stage_said(tmp_path, monkeypatch):
    """A stand-in QEMU that never starts the job (a guest hung in boot) is killed at boot_timeout_s, though the
    run's timeout is an hour; the outcome says the boot hung."""
    stand_in = tmp_path / "qemu-system-x86_64"
    stand_in.write_text("#!/bin/sh\nexec sleep 3600\n")
    stand_in.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    outcome = qemu.run_boot(_boot(tmp_path, timeout_s=3600, boot_timeout_s=0.5))
    assert outcome["status"] == "timeout" and outcome["stage"] == "boot"
    assert outcome["why"] == "the guest had not started its job 0.5 s after QEMU started (boot hung)"
    assert outcome["seconds"] < 3600


def test_a_guest_stuck_in_boot_says_stalled_not_crashed_with_the_stuck_cpus_place(tmp_path):
    """An RCU stall's NMI backtrace prints a RIP (here the lab pv-spinlock backend's HLT, a lost kick): the run's
    problem says the kernel stalled there, not that it crashed."""
    from ticklab.lab.run import _no_result, guest_crash

    console = tmp_path / "console.log"
    console.write_text(
        "[    0.482169] thermal_sys: Registered thermal governor 'user_space'\n"
        "[   57.873007] rcu: INFO: rcu_sched detected stalls on CPUs/tasks:\n"
        "[   57.873774] Sending NMI from CPU 0 to CPUs 3:\n[    1.425776] NMI backtrace for cpu 3\n"
        "[    1.425776] RIP: 0010:lab_halt+0x13/0x30\n"
    )
    assert guest_crash(console) == (
        "stalled, not crashed: rcu: INFO: rcu_sched detected stalls on CPUs/tasks (RIP: 0010:lab_halt+0x13/0x30)"
    )
    outcome = {"status": "timeout", "exit": -9, "why": "the guest had not started its job 90 s after QEMU started"}
    assert _no_result({}, outcome, tmp_path) == (
        "the guest wrote no result (boot timeout, exit -9; the guest had not started its job 90 s after QEMU started; "
        "its kernel stalled, not crashed: rcu: INFO: rcu_sched detected stalls on CPUs/tasks (RIP: "
        f"0010:lab_halt+0x13/0x30); see {console})"
    )
