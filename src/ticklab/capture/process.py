"""Running one workload command in its run directory, killed with its process group on timeout.

Every process a capture starts (workload, server, per-run extra, trace-cmd), and every long-lived one the lab
starts (QEMU, the kernel build's make), is started by :func:`spawn`: it dies with ticklab (``PR_SET_PDEATHSIG`` =
SIGKILL, set in the child before it runs the program, so a ``kill -9`` of the capture cannot leave a SCHED_FIFO
workload running on the isolated CPU, nor one of ``lab run`` a QEMU guest) and, given a ``HostChanges``, is
recorded in its journal by pid and start time (:meth:`~ticklab.host.HostChanges.record_process`), so that the
next capture's recovery kills what is left of its session (children of the workload, which do not inherit the
death signal) — and only that: a pid the kernel gave to another process since is never signalled. The death
signal comes when the *thread* that forked the child ends, so :func:`spawn` runs only on the main thread.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

PR_SET_PDEATHSIG = 1


class WorkloadOutputError(ValueError):
    """A workload's output could not be parsed; the message names the file."""


_PRCTL = None


def _prctl():
    global _PRCTL
    if _PRCTL is None:
        function = ctypes.CDLL(None, use_errno=True).prctl
        function.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
        function.restype = ctypes.c_int
        _PRCTL = function
    return _PRCTL


def _dies_with_parent(parent: int, death_signal: int = signal.SIGKILL):
    """A ``preexec_fn``: the child gets ``death_signal`` when the thread that started it ends; if ``parent`` is
    already gone (it died between fork and here, so the death signal would never come), the child ends itself at
    once."""
    prctl = _prctl()  # resolved before the fork: the child only calls it

    def in_child() -> None:
        if prctl(PR_SET_PDEATHSIG, death_signal, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)

    return in_child


# Leads a process group whose members do not get the death signal (make's recipes, sub-makes, compilers): it runs
# the command in the background and, when the kernel sends it SIGTERM because ticklab died, kills the whole group.
# The command comes as "$@", never interpolated into the script.
GROUP_KEEPER = ["/bin/sh", "-c", 'trap "kill -KILL 0" TERM; "$@" & wait $!']


def spawn(argv: list, *, host=None, label: str = "workload", whole_group: bool = False, **popen) -> subprocess.Popen:
    """``subprocess.Popen(argv, start_new_session=True, **popen)`` that dies with this process and, with ``host``
    (a ``HostChanges``), is recorded in its journal so that recovery after a SIGKILL kills what it left. Only on
    the main thread: PR_SET_PDEATHSIG fires when the forking thread ends, which would kill the child early.
    ``whole_group``: everything the command starts dies too (a build: make's children do not inherit the death
    signal, and a SIGTERM make passes on reaches only the shells of its recipes); the returned process is then a
    shell that leads the group and exits with the command's status."""
    death_signal = signal.SIGKILL
    if whole_group:
        argv, death_signal = [*GROUP_KEEPER, f"ticklab {label}", *argv], signal.SIGTERM
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError(
            f"{label}: spawn runs on the main thread only (the child's death signal would come when "
            f"thread {threading.current_thread().name!r} ends)"
        )
    process = subprocess.Popen(
        argv, start_new_session=True, preexec_fn=_dies_with_parent(os.getpid(), death_signal), **popen
    )
    if host is not None:
        try:
            host.record_process(process.pid, label=label)
        except BaseException:
            kill_group(process)
            raise
    return process


def kill_group(process: subprocess.Popen) -> None:
    """SIGKILL the process group of a process started by :func:`spawn` (its own session) and reap it."""
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()


def stop(process: subprocess.Popen, timeout_s: float = 10) -> None:
    """Ask a process to end (SIGTERM); kill its group if it has not within ``timeout_s``."""
    process.terminate()
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_group(process)


def wait_or_kill(process: subprocess.Popen, timeout_s: float) -> str:
    """Wait for a process started with start_new_session; kill its whole group on timeout or interrupt.
    'ok', 'failed' (non-zero exit) or 'timeout'."""
    status = "ok"
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        status = "timeout"
    finally:
        kill_group(process)
    return "failed" if status == "ok" and process.returncode != 0 else status


def run_command(argv: list[str], directory: Path, timeout_s: float, host=None) -> dict:
    """Run argv with stdout/stderr into ``directory``; kill its process group on timeout or interrupt. With ``host``
    the process is recorded in its journal (see :func:`spawn`)."""
    started = time.time()
    with (directory / "stdout.txt").open("w") as out, (directory / "stderr.txt").open("w") as err:
        try:
            process = spawn(
                argv,
                host=host,
                label=f"workload {os.path.basename(str(argv[0]))}",
                stdout=out,
                stderr=err,
                cwd=directory,
            )
        except OSError as exc:
            raise WorkloadOutputError(f"{argv[0]}: cannot start ({exc.strerror})") from exc
        status = wait_or_kill(process, timeout_s)
    return {"argv": argv, "start": started, "end": time.time(), "exit_status": process.returncode, "status": status}
