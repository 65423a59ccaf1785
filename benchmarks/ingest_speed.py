"""Ingest speed and memory: ticklab against `trace-cmd report > /dev/null` on the same files, end to end.

    python benchmarks/ingest_speed.py [--runs 5] [--events 1000000] [--keep DIR] [TRACE ...]

Inputs (each a trace.dat both tools read):
  (a) the bundled trace.dat with the most events (traces/; an .xz one is decompressed first),
  (b) a >= --events trace recorded here (root, tracefs): hackbench -p -s 8 -g 4 under ticklab's tracefs
      backend with sched_switch/sched_wakeup/hrtimer_start/hrtimer_expire_entry/local_timer_entry/exit, the
      loop count raised until the trace holds --events events, then made a trace.dat v7 with
      `trace-cmd restore` (the same events every time it is run; the count varies with the host),
  (c) (b) compressed as trace-cmd compresses by default: `trace-cmd convert --compression zstd`.
TRACE arguments replace (a)-(c).

Each round runs every command on every input once, rotating the order (interleaved, n = --runs rounds):
  ticklab CLI  `ticklab ingest FILE --out DIR` (Parquet tables; process start and imports included)
  API arrow    `read_trace(FILE).arrow_tables()` in a fresh interpreter, timed inside (imports excluded)
  API pandas   the same, then every table as a pandas DataFrame (`trace.events`)
  reference    the reader before issue 15 (tests/reference_ingest.py) to pandas, timed inside
  trace-cmd    `trace-cmd report -i FILE > /dev/null`
Wall times are medians with min-max; "x trace-cmd" is trace-cmd's median over ticklab's (> 1: faster). CPU
seconds (user + system, GNU time) are printed too: on a shared machine they are less disturbed than wall time.
Peak memory is each process's maximum RSS (GNU time %M), interpreter and imports included.
The numbers are as measured on this machine at this moment: on a shared or busy host they are noisy.
"""

from __future__ import annotations

import argparse
import lzma
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EVENTS = ["sched:sched_switch", "sched:sched_wakeup", "timer:hrtimer_start", "timer:hrtimer_expire_entry",
          "irq_vectors:local_timer_entry", "irq_vectors:local_timer_exit"]
API = """
import sys, time
sys.path.insert(0, {tests!r})
mode, path = sys.argv[1], sys.argv[2]
if mode == "reference":
    from reference_ingest import read_trace
else:
    from ticklab.trace.ingest import read_trace
import pyarrow, pandas  # imports outside the timed part for every mode
start, cpu = time.perf_counter(), time.process_time()
trace = read_trace(path)
if mode == "arrow":
    trace.arrow_tables()
else:
    trace.events
print(time.perf_counter() - start, time.process_time() - cpu)
"""


GNU_TIME = Path("/usr/bin/time")


def run(argv: list[str], stdout=subprocess.DEVNULL) -> tuple[float, float, float, str]:
    """(wall seconds, CPU seconds, peak RSS in MB, stdout) of one process, measured from outside.

    The peak comes from GNU time (%M): a child forked from this Python process would start its
    high-water mark at this process's RSS (Linux carries it across exec), hiding a small tool's."""
    if not GNU_TIME.is_file():
        raise SystemExit(f"{GNU_TIME} (GNU time) is needed to measure each process's peak memory: apt-get install time")
    with tempfile.NamedTemporaryFile() as peak, tempfile.TemporaryFile() as errors:
        start = time.perf_counter()
        done = subprocess.run([str(GNU_TIME), "-f", "%M %U %S", "-o", peak.name, *argv], stdout=stdout, stderr=errors)
        wall = time.perf_counter() - start
        errors.seek(0)
        if done.returncode:
            raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}): {errors.read().decode(errors='replace')[:300]}")
        kilobytes, user, system = Path(peak.name).read_text().split()[-3:]
    return wall, float(user) + float(system), int(kilobytes) / 1024, done.stdout.decode() if done.stdout else ""


def event_count(path: Path) -> int:
    from ticklab.trace.ingest import read_trace

    return sum(read_trace(path).counts().values())


def bundled_largest(directory: Path) -> Path:
    """The bundled trace.dat (or trace.dat.xz, decompressed into ``directory``) with the most events."""
    dats = sorted([*(REPO / "traces").rglob("trace.dat"), *(REPO / "traces").rglob("trace.dat.xz")])
    if not dats:
        raise SystemExit("no bundled trace.dat under traces/")
    largest = max(dats, key=event_count)
    if largest.suffix != ".xz":
        return largest
    target = directory / "bundled.dat"
    target.write_bytes(lzma.decompress(largest.read_bytes()))
    print(f"(a) is {largest.relative_to(REPO)}, decompressed", file=sys.stderr)
    return target


def trace_cmd(host, *argv: str) -> None:
    with host.watching_mounts("trace-cmd"):
        from ticklab.capture.tracing import ensure_tracefs

        ensure_tracefs(host)
        subprocess.run(["trace-cmd", *argv], check=True, capture_output=True)


def host_changes():
    """The host changes of a benchmark step, journalled where every ticklab command journals them (as root
    /run/ticklab): a --keep directory the user made (mode 0755) is only where traces go, never host state."""
    from ticklab.host import HostChanges

    return HostChanges(log=lambda _: None)


def record(directory: Path, events: int) -> Path:
    """A trace.dat of >= ``events`` events recorded here (see the module docstring)."""
    from ticklab.capture.tracing import recorder

    if os.geteuid() != 0:
        raise SystemExit("recording the 1M-event trace needs root (tracefs); pass TRACE files instead")
    loops = max(1000, events // 90)
    for _ in range(4):
        capture = directory / "capture"
        shutil.rmtree(capture, ignore_errors=True)
        with host_changes() as host:
            with recorder("tracefs", host, EVENTS, capture, buffer_kb=16384):
                subprocess.run(["hackbench", "-p", "-s", "8", "-l", str(loops), "-g", "4"], check=True, capture_output=True)
        with host_changes() as host:
            trace_cmd(host, "restore", "-c", "-o", str(directory / "head.dat"))
            trace_cmd(host, "restore", "-i", str(directory / "head.dat"), "-o", str(directory / "recorded.dat"),
                      *sorted(str(p) for p in capture.glob("cpu*.raw")))
        found = event_count(directory / "recorded.dat")
        if found >= events:
            return directory / "recorded.dat"
        loops = int(loops * events / max(found, 1) * 1.1)
    raise SystemExit(f"could not record {events} events (last: {found})")


def compressed(source: Path, directory: Path) -> Path:
    target = directory / (source.stem + "-zstd.dat")
    with host_changes() as host:
        trace_cmd(host, "convert", "-i", str(source), "-o", str(target), "--compression", "zstd")
    return target


def is_compressed(path: Path) -> bool:
    with open(path, "rb") as handle:
        head = handle.read(22)
    return head[10:12] == b"7\0" and head[18:22] != b"none"


def commands(path: Path, out: Path) -> dict[str, list[str]]:
    ticklab = shutil.which("ticklab", path=str(Path(sys.executable).parent)) or "ticklab"
    api = API.format(tests=str(REPO / "tests"))
    chosen = {"ticklab CLI": [ticklab, "ingest", str(path), "--out", str(out)],
              "API arrow": [sys.executable, "-c", api, "arrow", str(path)],
              "API pandas": [sys.executable, "-c", api, "pandas", str(path)],
              "reference": [sys.executable, "-c", api, "reference", str(path)],
              "trace-cmd": ["trace-cmd", "report", "-i", str(path)]}
    if is_compressed(path):  # the reader before issue 15 refused compressed files
        del chosen["reference"]
    return chosen


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} [{min(values):.3f}-{max(values):.3f}]"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("traces", nargs="*", type=Path)
    parser.add_argument("--runs", type=int, default=5, help="rounds (n per command and input; default 5)")
    parser.add_argument("--events", type=int, default=1_000_000, help="events of the recorded trace (b)")
    parser.add_argument("--keep", type=Path, help="keep the recorded traces here (default: a temporary directory)")
    args = parser.parse_args()
    if args.runs < 5:
        parser.error("--runs must be at least 5")
    if shutil.which("trace-cmd") is None:
        raise SystemExit("trace-cmd is not installed: it is what ticklab is compared with")
    from tabulate import tabulate

    with tempfile.TemporaryDirectory(prefix="ticklab-bench-") as scratch:
        work = args.keep or Path(scratch)
        work.mkdir(parents=True, exist_ok=True)
        if args.traces:
            inputs = {path.name: path for path in args.traces}
        else:
            print("finding the bundled trace with the most events ...", file=sys.stderr)
            bundled = bundled_largest(work)
            print(f"recording a >= {args.events}-event trace (tracefs, hackbench) ...", file=sys.stderr)
            big = record(work, args.events)
            inputs = {"(a) bundled": bundled, "(b) recorded": big, "(c) recorded, zstd v7": compressed(big, work)}
        sizes = {label: (event_count(path), path.stat().st_size) for label, path in inputs.items()}
        help_times = []
        times: dict[tuple[str, str], list[float]] = {}
        cpu_times: dict[tuple[str, str], list[float]] = {}
        memory: dict[tuple[str, str], list[float]] = {}
        for round_number in range(args.runs):
            print(f"round {round_number + 1}/{args.runs}", file=sys.stderr)
            help_times.append(run([shutil.which("ticklab", path=str(Path(sys.executable).parent)) or "ticklab",
                                   "--help"])[0])
            for label, path in inputs.items():
                out = work / "parquet"
                shutil.rmtree(out, ignore_errors=True)
                todo = list(commands(path, out).items())
                shift = round_number % len(todo)
                for name, argv in todo[shift:] + todo[:shift]:
                    wall, cpu, peak, printed = run(argv, stdout=subprocess.PIPE if name.startswith(("API", "ref")) else subprocess.DEVNULL)
                    if printed.strip():  # the API rows time themselves, after their imports
                        wall, cpu = map(float, printed.split())
                    times.setdefault((label, name), []).append(wall)
                    cpu_times.setdefault((label, name), []).append(cpu)
                    memory.setdefault((label, name), []).append(peak)
        rows = []
        for label, (events, size) in sizes.items():
            theirs = statistics.median(times[(label, "trace-cmd")])
            their_cpu = statistics.median(cpu_times[(label, "trace-cmd")])
            their_memory = statistics.median(memory[(label, "trace-cmd")])
            for name in ("ticklab CLI", "API arrow", "API pandas", "reference", "trace-cmd"):
                if (label, name) not in times:
                    rows.append(["", name, "refused (compressed)", "", "", "", "", "", ""])
                    continue
                wall = statistics.median(times[(label, name)])
                peak = statistics.median(memory[(label, name)])
                cpu = statistics.median(cpu_times[(label, name)])
                rows.append([label if name == "ticklab CLI" else "", name, summary(times[(label, name)]),
                             f"{events / wall:,.0f}", f"{theirs / wall:.2f}", f"{cpu:.3f}", f"{their_cpu / cpu:.2f}",
                             f"{peak:.0f}", f"{peak / their_memory:.2f}"])
        print(f"host: {os.uname().nodename}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}; n = {args.runs} "
              "interleaved rounds; the machine may be shared, so expect noise")
        for label, (events, size) in sizes.items():
            print(f"{label}: {inputs[label]}  ({events:,} events, {size / 1e6:.1f} MB)")
        print(tabulate(rows, headers=["input", "command", "wall s: median [min-max]", "events/s", "x trace-cmd",
                                      "CPU s", "x trace-cmd CPU", "peak MB", "memory / trace-cmd"],
                       disable_numparse=True))
        print(f"`ticklab --help`: {summary(help_times)} s (goal < 0.3 s)")
        print("API rows time the read in a fresh interpreter after its imports; their peak memory includes them.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
