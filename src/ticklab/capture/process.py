"""Running one workload command in its run directory, killed with its process group on timeout."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path


class WorkloadOutputError(ValueError):
    """A workload's output could not be parsed; the message names the file."""


def stop(process: subprocess.Popen, timeout_s: float = 10) -> None:
    """Ask a process to end (SIGTERM); kill it if it has not within ``timeout_s``."""
    process.terminate()
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def wait_or_kill(process: subprocess.Popen, timeout_s: float) -> str:
    """Wait for a process started with start_new_session; kill its whole group on timeout or interrupt.
    'ok', 'failed' (non-zero exit) or 'timeout'."""
    status = "ok"
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        status = "timeout"
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return "failed" if status == "ok" and process.returncode != 0 else status


def run_command(argv: list[str], directory: Path, timeout_s: float) -> dict:
    """Run argv with stdout/stderr into ``directory``; kill its process group on timeout or interrupt."""
    started = time.time()
    with (directory / "stdout.txt").open("w") as out, (directory / "stderr.txt").open("w") as err:
        try:
            process = subprocess.Popen(argv, stdout=out, stderr=err, cwd=directory, start_new_session=True)
        except OSError as exc:
            raise WorkloadOutputError(f"{argv[0]}: cannot start ({exc.strerror})") from exc
        status = wait_or_kill(process, timeout_s)
    return {"argv": argv, "start": started, "end": time.time(), "exit_status": process.returncode, "status": status}
