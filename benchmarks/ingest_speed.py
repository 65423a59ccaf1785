"""Ingest speed: events/s of ticklab.ingest.read_trace vs `trace-cmd report > /dev/null` on the same trace.dat.

    python benchmarks/ingest_speed.py [TRACE]      TRACE: a trace.dat or a tracefs capture directory

Without TRACE it records one (root): hackbench under the tracefs backend, sched/timer/irq events.
A tracefs capture is turned into a trace.dat with `trace-cmd restore`, so both readers read one file.
Goal: ratio >= 1.0 (ticklab at least as fast as trace-cmd report). Best of --repeat runs each.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ticklab.capture.tracing import ensure_tracefs, recorder
from ticklab.host import HostChanges
from ticklab.ingest import read_trace

EVENTS = ["sched:sched_switch", "sched:sched_wakeup", "timer:hrtimer_start", "timer:hrtimer_expire_entry",
          "irq_vectors:local_timer_entry", "irq_vectors:local_timer_exit"]


def record(directory: Path) -> Path:
    with HostChanges(log=lambda _: None) as host:
        with recorder("tracefs", host, EVENTS, directory / "trace", buffer_kb=16384):
            subprocess.run(["hackbench", "-p", "-s", "8", "-l", "3000", "-g", "4"], check=True, capture_output=True)
    return directory / "trace"


def to_trace_dat(capture: Path, directory: Path) -> Path:
    with HostChanges(log=lambda _: None) as host, host.watching_mounts("trace-cmd"):
        ensure_tracefs(host)
        subprocess.run(["trace-cmd", "restore", "-c", "-o", str(directory / "head.dat")], check=True, capture_output=True)
        cpus = sorted(str(p) for p in capture.glob("cpu*.raw"))
        subprocess.run(["trace-cmd", "restore", "-i", str(directory / "head.dat"), "-o", str(directory / "trace.dat"), *cpus],
                       check=True, capture_output=True)
    return directory / "trace.dat"


def best_of(repeat: int, action) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace", nargs="?", type=Path)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ticklab-bench-") as scratch:
        scratch = Path(scratch)
        source = args.trace or record(scratch)
        trace_dat = source if source.is_file() else to_trace_dat(source, scratch)
        events = sum(read_trace(trace_dat).counts().values())
        ours = best_of(args.repeat, lambda: read_trace(trace_dat))
        with open("/dev/null", "w") as null, HostChanges(log=lambda _: None) as host, host.watching_mounts("trace-cmd"):
            theirs = best_of(args.repeat, lambda: subprocess.run(["trace-cmd", "report", "-i", str(trace_dat)],
                                                                  stdout=null, stderr=subprocess.DEVNULL, check=True))
        print(f"trace: {trace_dat.stat().st_size / 1e6:.1f} MB, {events} events")
        print(f"ticklab ingest     : {ours:.3f} s  {events / ours:,.0f} events/s")
        print(f"trace-cmd report   : {theirs:.3f} s  {events / theirs:,.0f} events/s")
        print(f"ratio (ours/theirs): {theirs / ours:.2f}x  (goal >= 1.0)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
