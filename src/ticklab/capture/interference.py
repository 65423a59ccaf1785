"""What else the machine was doing while a run ran: load average, runnable tasks, steal time, from /proc.

A :class:`Sampler` reads /proc (under ``root``, read-only) once before the run, every ``interval_s``
from a background thread while it runs, and once after; :func:`summarise` turns the samples into the
run record's ``interference`` entry. A run of ``ticklab capture`` samples the host it runs on; a lab
run samples the physical host around the QEMU process (for a TCG guest the emulator competes with
every host task) and keeps the guest's own view as ``guest_interference``.

The busy rule (:func:`busy_reasons`), and why:

* **Runnable tasks outside the run, above the number of online CPUs, in more than 10 % of samples.**
  With more foreign runnable tasks than CPUs, every CPU has another task queued at that instant and
  the run's tasks get at best a fair share of it: the run then measures contention, not the kernel
  path under test. Only tasks outside the run's process tree (the capturing process, its workload,
  server, tracer or QEMU) count, so a workload that is itself many-threaded (hackbench, tbench, a
  guest's vCPU threads) does not flag itself. The counts are instants, so a single burst (a kworker,
  a cron job) in one sample does not flag a run; a tenth of the samples does.
* **Steal above 10 % of CPU time during the run**, where the kernel reports steal (a guest with a
  paravirtual steal clock): the hypervisor ran something else on this machine's vCPUs for more than a
  tenth of the run, which is the host's load showing through.

The 1-minute load average is recorded (before the run and its maximum during) but is not part of the
rule: it is an exponentially damped average that includes the capture's own previous runs, which run
back to back, so after a heavy workload it stays above the CPU count for about a minute with nothing
else on the machine.

Cost: each sample reads /proc/loadavg, /proc/stat and every thread's stat file (about 4 ms for 120
threads on a 2-vCPU VM), twice a second by default.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path

from ..host.facts import online_cpus, stat_fields

INTERVAL_S = 0.5
BUSY_SAMPLE_FRACTION = 0.10  # more than this share of samples with more foreign runnable tasks than CPUs
BUSY_STEAL_FRACTION = 0.10  # more than this share of CPU time stolen by the hypervisor
STEAL_COLUMN = 8  # /proc/stat "cpu" line: user nice system idle iowait irq softirq steal guest guest_nice
GUEST_COLUMNS = 2  # guest and guest_nice are already counted in user and nice


@dataclass(frozen=True)
class Sample:
    """One reading of /proc. None where the file (or the field) could not be read."""

    load1: float | None
    runnable: int | None  # procs_running in /proc/stat: every runnable task, the run's own and the sampler included
    other_runnable: int | None  # runnable threads outside the run's process tree
    cpu_ticks: int | None  # all CPU time so far (USER_HZ ticks summed over CPUs), guest time not counted twice
    steal_ticks: int | None  # steal so far; None where the kernel's /proc/stat has no steal column


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


def _load1(root: Path) -> float | None:
    fields = (_read(root / "proc/loadavg") or "").split()
    try:
        return float(fields[0])
    except (IndexError, ValueError):
        return None


def _stat(root: Path) -> tuple[int | None, int | None, int | None]:
    """(procs_running, all CPU ticks, steal ticks) from /proc/stat."""
    running = ticks = steal = None
    for line in (_read(root / "proc/stat") or "").splitlines():
        fields = line.split()
        try:
            if fields and fields[0] == "cpu":
                columns = [int(f) for f in fields[1:]]
                counted = columns[:-GUEST_COLUMNS] if len(columns) > STEAL_COLUMN else columns
                ticks = sum(counted)
                steal = columns[STEAL_COLUMN - 1] if len(columns) >= STEAL_COLUMN else None
            elif fields and fields[0] == "procs_running":
                running = int(fields[1])
        except (IndexError, ValueError):
            continue
    return running, ticks, steal


def _threads(root: Path) -> list[tuple[int, int, str]]:
    """(pid, parent pid, state) of every thread under root/proc; threads that end while being read are skipped."""
    found: list[tuple[int, int, str]] = []
    proc = root / "proc"
    try:
        pids = [name for name in os.listdir(proc) if name.isdigit()]
    except OSError:
        return found
    for pid in pids:
        try:
            tids = [name for name in os.listdir(proc / pid / "task") if name.isdigit()]
        except OSError:
            continue
        for tid in tids:
            text = _read(proc / pid / "task" / tid / "stat")
            fields = stat_fields(text) if text else []
            if len(fields) >= 2 and fields[1].lstrip("-").isdigit():
                found.append((int(pid), int(fields[1]), fields[0]))
    return found


def other_runnable(threads: list[tuple[int, int, str]], own_pid: int) -> int:
    """Runnable threads ('R') of processes that are neither ``own_pid`` nor descended from it."""
    parent = {pid: ppid for pid, ppid, _ in threads}
    own: dict[int, bool] = {}

    def is_own(pid: int) -> bool:
        chain = []
        while pid not in own:
            if pid == own_pid:
                own[pid] = True
            elif pid not in parent or pid <= 1 or pid in chain:
                own[pid] = False
            else:
                chain.append(pid)
                pid = parent[pid]
        for visited in chain:
            own[visited] = own[pid]
        return own[pid]

    return sum(1 for pid, _, state in threads if state == "R" and not is_own(pid))


def read_sample(root: Path = Path("/"), own_pid: int | None = None) -> Sample:
    running, ticks, steal = _stat(root)
    threads = _threads(root)
    return Sample(
        load1=_load1(root),
        runnable=running,
        other_runnable=other_runnable(threads, os.getpid() if own_pid is None else own_pid) if threads else None,
        cpu_ticks=ticks,
        steal_ticks=steal,
    )


def busy_reasons(samples: list[Sample], cpus: int) -> tuple[list[str], int, float | None]:
    """(why the run counts as busy, empty if it does not; samples over the CPU count; steal fraction)."""
    others = [s.other_runnable for s in samples if s.other_runnable is not None]
    over = sum(1 for n in others if n > cpus)
    steal = steal_fraction(samples)
    reasons = []
    if others and over / len(others) > BUSY_SAMPLE_FRACTION:
        reasons.append(
            f"more runnable tasks outside the run than CPUs ({cpus}) in {over} of {len(others)} samples "
            f"(up to {max(others)})"
        )
    if steal is not None and steal > BUSY_STEAL_FRACTION:
        reasons.append(f"{steal:.0%} of CPU time stolen by the hypervisor")
    return reasons, over, steal


def steal_fraction(samples: list[Sample]) -> float | None:
    """Steal over all CPU time between the first and the last sample; None where it is not reported."""
    ends = [s for s in samples if s.cpu_ticks is not None and s.steal_ticks is not None]
    if len(ends) < 2 or ends[-1].cpu_ticks <= ends[0].cpu_ticks:
        return None
    return (ends[-1].steal_ticks - ends[0].steal_ticks) / (ends[-1].cpu_ticks - ends[0].cpu_ticks)


def _mean(values: list) -> float | None:
    return sum(values) / len(values) if values else None


def summarise(samples: list[Sample], cpus: int, interval_s: float = INTERVAL_S) -> dict:
    """A run's ``interference`` record from its samples: the first taken before the run, the rest during it
    (the last at its end). ``busy`` is None when /proc could not be read at all."""
    before, during = (samples[0], samples[1:]) if samples else (None, [])
    load1 = [s.load1 for s in during if s.load1 is not None]
    runnable = [s.runnable for s in during if s.runnable is not None]
    others = [s.other_runnable for s in during if s.other_runnable is not None]
    reasons, over, steal = busy_reasons(samples, cpus)
    readable = any(s.other_runnable is not None or s.steal_ticks is not None for s in samples)
    return {
        "cpus": cpus,
        "interval_s": interval_s,
        "samples": len(samples),
        "load1_before": before.load1 if before else None,
        "load1_max": max(load1) if load1 else None,
        "runnable_before": before.runnable if before else None,
        "runnable_max": max(runnable) if runnable else None,
        "runnable_mean": _mean(runnable),
        "other_runnable_before": before.other_runnable if before else None,
        "other_runnable_max": max(others) if others else None,
        "other_runnable_mean": _mean(others),
        "samples_over_cpus": over,
        "steal_fraction": steal,
        "busy": bool(reasons) if readable else None,
        "why": "; ".join(reasons) if reasons else None,
    }


class Sampler:
    """``with Sampler(root) as sampler: <run>``, then ``sampler.summary()``. Reading /proc never raises."""

    def __init__(self, root: Path | str = Path("/"), interval_s: float = INTERVAL_S, own_pid: int | None = None):
        self.root, self.interval_s = Path(root), interval_s
        self.own_pid = os.getpid() if own_pid is None else own_pid
        self.cpus = len(online_cpus(self.root))
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample_until_stopped, name="ticklab-interference", daemon=True)

    def _take(self) -> None:
        self.samples.append(read_sample(self.root, self.own_pid))

    def _sample_until_stopped(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._take()

    def __enter__(self) -> Sampler:
        self._take()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._take()

    def summary(self) -> dict:
        return summarise(list(self.samples), self.cpus, self.interval_s)
