"""Ingest speed and memory: ticklab against `trace-cmd report > /dev/null` on the same files, end to end.

    python benchmarks/ingest_speed.py [--runs 5] [--events 1000000] [--small-events 100000] [--keep DIR] [TRACE ...]

Inputs (each a trace.dat both tools read):
  (a) the bundled trace.dat with the most events (traces/; an .xz one is decompressed first),
  (b) a trace recorded here (root, tracefs): hackbench -p -s 8 -g 4 under ticklab's tracefs backend with
      sched_switch/sched_wakeup/hrtimer_start/hrtimer_expire_entry/local_timer_entry/exit, the loop count raised
      until the trace holds --events events or the host records no more (a busy 2-core VM gave 827,384 of
      1,000,000 in four attempts: the benchmark then uses what it recorded and says how many), then made a
      trace.dat v7 with `trace-cmd restore` (the same events every time it is run; the count varies with the host),
  (c) (b) compressed as trace-cmd compresses by default: `trace-cmd convert --compression zstd`,
  (d) the first --small-events events of (b) (`trace-cmd split -e`), where the CLI's start-up weighs most.
TRACE arguments replace (a)-(d). After recording, the rounds wait (at most 5 minutes) for the load average to fall
back to where it was before hackbench.

Each round runs every command on every input once, rotating the order (interleaved, n = --runs rounds):
  ticklab CLI  `ticklab ingest FILE --out DIR` (Parquet tables; process start and imports included)
  API arrow    `read_trace(FILE).arrow_tables()` in a fresh interpreter, timed inside (imports excluded)
  API pandas   the same, then every table as a pandas DataFrame (`trace.events`)
  reference    the reader before issue 15 (tests/reference_ingest.py) to pandas, timed inside
  trace-cmd    `trace-cmd report -i FILE > /dev/null`
Wall times are medians with min-max; "x trace-cmd" is trace-cmd's time over ticklab's in the same round, the median
of the rounds' ratios [min-max] (> 1: faster; paired, so a load that changes between rounds cancels out). CPU
seconds (user + system, GNU time) are printed too: on a shared machine they are less disturbed than wall time.
Python's bytecode cache is on for the commands timed, as it is for an installed ticklab (a private temporary
directory, PYTHONPYCACHEPREFIX, filled before the first round): with PYTHONDONTWRITEBYTECODE set, as in this
project's CI, every start compiles ticklab's modules again; `ticklab --help` is timed both ways.
Peak memory is each process's maximum RSS (GNU time %M), interpreter and imports included: GNU time forks the
command from its own ~1 MB process, so the high-water mark Linux carries across exec is time's, not this
benchmark's (a `true` run under it shows < 1 MB while the benchmark holds hundreds), the command's own VmHWM.
The numbers are as measured on this machine at this moment: on a shared or busy host they are noisy.

Run as root, it writes only through ticklab.safefiles (SECURITY.md, "What ticklab writes as root"): in --keep DIR
a link, FIFO, device or other non-directory at DIR/parquet or DIR/capture, and anything but a regular file at the
name of a trace it writes, is refused with one line, never followed or removed through; the tables of each round
go to a DIR/parquet made for it and opened by descriptor, which `ticklab ingest` is run in (`--out .`), so a link
put at DIR/parquet afterwards is never followed either. Python writes the bytecode cache itself, in the benchmark's
own temporary directory (made by tempfile, mode 0700), never in --keep DIR.
"""

from __future__ import annotations

import argparse
import contextlib
import lzma
import os
import shutil
import stat
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EVENTS = [
    "sched:sched_switch",
    "sched:sched_wakeup",
    "timer:hrtimer_start",
    "timer:hrtimer_expire_entry",
    "irq_vectors:local_timer_entry",
    "irq_vectors:local_timer_exit",
]
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


# What the timed commands import, compiled into the bytecode cache before the first round
WARM = """
import sys
sys.path.insert(0, {tests!r})
import ticklab.cli, ticklab.trace.ingest, reference_ingest, numpy, pyarrow, pyarrow.parquet, pandas
import pyarrow.pandas_compat
"""


GNU_TIME = Path("/usr/bin/time")


def run(argv: list[str], stdout=subprocess.DEVNULL, in_directory: int | None = None) -> tuple[float, float, float, str]:
    """(wall seconds, CPU seconds, peak RSS in MB, stdout) of one process, measured from outside; ``in_directory``:
    a directory descriptor the process starts in (its working directory, reached through that descriptor and no
    name).

    The peak comes from GNU time (%M): a child forked from this Python process would start its
    high-water mark at this process's RSS (Linux carries it across exec), hiding a small tool's."""
    if not GNU_TIME.is_file():
        raise SystemExit(f"{GNU_TIME} (GNU time) is needed to measure each process's peak memory: apt-get install time")
    with tempfile.NamedTemporaryFile() as peak, tempfile.TemporaryFile() as errors:
        start = time.perf_counter()
        where = {} if in_directory is None else {"cwd": f"/proc/self/fd/{in_directory}", "pass_fds": (in_directory,)}
        done = subprocess.run(
            [str(GNU_TIME), "-f", "%M %U %S", "-o", peak.name, *argv], stdout=stdout, stderr=errors, **where
        )
        wall = time.perf_counter() - start
        errors.seek(0)
        if done.returncode:
            raise SystemExit(
                f"{' '.join(argv)} failed ({done.returncode}): {errors.read().decode(errors='replace')[:300]}"
            )
        kilobytes, user, system = Path(peak.name).read_text().split()[-3:]
    return wall, float(user) + float(system), int(kilobytes) / 1024, done.stdout.decode() if done.stdout else ""


def refused(exc: Exception) -> SystemExit:
    return SystemExit(f"ingest_speed: {' '.join(str(exc).split())}")


def fresh_directory(work: Path, name: str):
    """work/name as an empty directory made now (the last round's removed first), an OwnedDir opened by descriptor:
    a link or anything but a directory there is refused with one line, never followed or removed through."""
    from ticklab import safefiles
    from ticklab.safefiles import OwnedDir, UnsafeFileError, kind_of, shown

    try:
        with OwnedDir(work) as owned:
            found = owned.entry(name)
            if found is not None and not stat.S_ISDIR(found.st_mode):
                what = "a regular file" if stat.S_ISREG(found.st_mode) else kind_of(found.st_mode)
                raise SystemExit(
                    f"ingest_speed: {shown(work / name)}: {what}, not a directory; "
                    "the benchmark does not write through it (remove it or choose another --keep)"
                )
            if found is not None:
                try:  # by descriptor, each directory checked to be the one found: never through a link
                    shutil.rmtree(name, dir_fd=owned.fd)
                except OSError as exc:
                    raise SystemExit(
                        f"ingest_speed: {shown(work / name)}: cannot remove the last round's files "
                        f"({exc.strerror or exc})"
                    ) from None
            owned.mkdir_new(name)
            safefiles.between_check_and_write(work / name)
            return owned.subdir(name)  # O_NOFOLLOW: a link put there meanwhile is refused
    except UnsafeFileError as exc:
        raise refused(exc) from None


def make_room(work: Path, name: str) -> Path:
    """work/name, where a tool (trace-cmd) is about to write a file: the last one removed if it is a regular file;
    a link, FIFO, device or directory there is refused with one line."""
    from ticklab.safefiles import OwnedDir, UnsafeFileError

    try:
        with OwnedDir(work) as owned:
            found = owned.entry(name)
            if found is not None and not stat.S_ISREG(found.st_mode):
                owned.check_replaceable(name)  # the one-line refusal naming what it is
            owned.remove(name, missing_ok=True)
    except UnsafeFileError as exc:
        raise refused(exc) from None
    return work / name


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
    from ticklab.safefiles import OwnedDir, UnsafeFileError

    try:
        with OwnedDir(directory) as owned:
            target = owned.write_atomic("bundled.dat", lzma.decompress(largest.read_bytes()))
    except UnsafeFileError as exc:
        raise refused(exc) from None
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


def record_hackbench(directory: Path, loops: int, name: str) -> Path:
    """One recording: ``hackbench -l loops`` under ticklab's tracefs backend, made a trace.dat v7 at directory/name
    (see the module docstring)."""
    from ticklab.capture.tracing import recorder

    capture = directory / "capture"
    fresh_directory(directory, "capture").close()
    with host_changes() as host:
        with recorder("tracefs", host, EVENTS, capture, buffer_kb=16384):
            subprocess.run(["hackbench", "-p", "-s", "8", "-l", str(loops), "-g", "4"], check=True, capture_output=True)
    with host_changes() as host:
        trace_cmd(host, "restore", "-c", "-o", str(make_room(directory, "head.dat")))
        trace_cmd(
            host,
            "restore",
            "-i",
            str(directory / "head.dat"),
            "-o",
            str(make_room(directory, name)),
            *sorted(str(p) for p in capture.glob("cpu*.raw")),
        )
    return directory / name


ATTEMPTS = 4
GROWTH = 1.1  # an attempt that adds less than this factor to the most recorded so far: the recorder is saturated


def record(directory: Path, events: int, record_once=None) -> tuple[Path, int]:
    """(a trace.dat, its event count): as many events as this host records, up to ``events``.

    ``record_once(directory, loops, name)`` records one trace (``record_hackbench``). The loop count is raised
    until a trace holds ``events`` events, an attempt adds less than 10 % to the most recorded so far, or
    ``ATTEMPTS`` attempts were made: what the tracefs reader keeps of hackbench varies with the host and its load
    (a busy 2-core VM gave 827,384 of 1,000,000, another time 675,331 of 700,000). The attempt with the most events
    is kept, the others' files removed; falling short of ``events`` is said on stderr, never an error."""
    record_once = record_once or record_hackbench
    loops = max(1000, events // 90)
    best: tuple[int, Path] | None = None
    attempts = [f"recorded-{number}.dat" for number in range(1, ATTEMPTS + 1)]
    for number, name in enumerate(attempts, 1):
        path = record_once(directory, loops, name)
        found = event_count(path)
        print(f"  attempt {number}: hackbench -l {loops}: {found:,} events", file=sys.stderr)
        saturated = best is not None and found < best[0] * GROWTH
        if best is None or found > best[0]:
            best = (found, path)
        if found >= events or saturated or found == 0:
            break
        loops = int(loops * events / found * GROWTH)
    found, path = best
    if not found:
        raise SystemExit(f"ingest_speed: {path}: the recording holds no events (is tracefs recording?)")
    for name in attempts:  # this run's other attempts, and an earlier run's in a --keep directory
        if name != path.name:
            make_room(directory, name)
    if found < events:
        print(
            f"recorded {found:,} events, not the {events:,} asked: this host's recorder gives no more; the "
            "benchmark uses what it recorded",
            file=sys.stderr,
        )
    return path, found


SETTLE_S = 300


def settle(before: float) -> None:
    """The load average, a one-minute moving average, still counts hackbench's hundreds of tasks after recording (36
    on a 2-core VM): wait until it is back within 0.5 of what it was before, at most SETTLE_S seconds."""
    deadline = time.monotonic() + SETTLE_S
    print(f"waiting for the load average to settle (it was {before:.2f} before recording) ...", file=sys.stderr)
    while os.getloadavg()[0] > before + 0.5 and time.monotonic() < deadline:
        time.sleep(5)
    print(f"  load average {os.getloadavg()[0]:.2f}", file=sys.stderr)


def first_events(source: Path, events: int, directory: Path) -> Path:
    """The first ``events`` events of ``source`` as a trace.dat of their own (``trace-cmd split -e``, which writes
    <name>.1): real records, sized where the CLI's start-up weighs most."""
    target = make_room(directory, "first.dat.1")
    with host_changes() as host:
        trace_cmd(host, "split", "-i", str(source), "-o", str(directory / "first.dat"), "-e", str(events))
    return target


def compressed(source: Path, directory: Path) -> Path:
    target = make_room(directory, source.stem + "-zstd.dat")
    with host_changes() as host:
        trace_cmd(host, "convert", "-i", str(source), "-o", str(target), "--compression", "zstd")
    return target


def is_compressed(path: Path) -> bool:
    with open(path, "rb") as handle:
        head = handle.read(22)
    return head[10:12] == b"7\0" and head[18:22] != b"none"


def commands(path: Path) -> dict[str, list[str]]:
    """The commands timed on ``path``; "ticklab CLI" writes its tables to its working directory (``--out .``: run
    in the round's fresh directory, see ``run``)."""
    ticklab = shutil.which("ticklab", path=str(Path(sys.executable).parent)) or "ticklab"
    api = API.format(tests=str(REPO / "tests"))
    chosen = {
        "ticklab CLI": [ticklab, "ingest", os.path.abspath(path), "--out", "."],
        "API arrow": [sys.executable, "-c", api, "arrow", str(path)],
        "API pandas": [sys.executable, "-c", api, "pandas", str(path)],
        "reference": [sys.executable, "-c", api, "reference", str(path)],
        "trace-cmd": ["trace-cmd", "report", "-i", str(path)],
    }
    if is_compressed(path):  # the reader before issue 15 refused compressed files
        del chosen["reference"]
    return chosen


@contextlib.contextmanager
def bytecode_cache(scratch: str):
    """Python's bytecode cache on for the commands timed meanwhile (the environment they inherit), kept in the
    benchmark's own temporary directory (never --keep, never the checkout): an installed ticklab's modules are
    compiled once (pip compiles them, a checkout on first import), but with PYTHONDONTWRITEBYTECODE set, as in this
    project's CI and sandboxes, every start compiles ticklab's ~10 modules again. Yields what the report says of it;
    the environment is put back after."""
    saved = {name: os.environ.get(name) for name in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")}
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["PYTHONPYCACHEPREFIX"] = os.path.join(scratch, "pycache")
    try:
        print("compiling what the commands import into the bytecode cache ...", file=sys.stderr)
        subprocess.run([sys.executable, "-c", WARM.format(tests=str(REPO / "tests"))], check=True)
        was = saved["PYTHONDONTWRITEBYTECODE"]
        yield (
            "Python's bytecode cache is on for the timed commands (in the benchmark's temporary directory, filled "
            f"before the first round){'; this environment sets PYTHONDONTWRITEBYTECODE=' + was if was else ''}."
        )
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def paired(times: dict[tuple[str, str], list[float]], label: str, name: str) -> str:
    """trace-cmd's time over this command's, round by round (the two ran within the same round, so a load that
    changed between rounds cancels out): the median ratio [min-max]; > 1 is faster than trace-cmd."""
    ratios = [
        theirs / ours
        for theirs, ours in zip(times[(label, "trace-cmd")], times[(label, name)], strict=False)
        if ours > 0 and theirs > 0
    ]
    if not ratios:  # GNU time counts CPU time in hundredths of a second: a small file's run can read 0
        return "-"
    return f"{statistics.median(ratios):.2f} [{min(ratios):.2f}-{max(ratios):.2f}]"


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} [{min(values):.3f}-{max(values):.3f}]"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("traces", nargs="*", type=Path)
    parser.add_argument("--runs", type=int, default=5, help="rounds (n per command and input; default 5)")
    parser.add_argument(
        "--events",
        type=int,
        default=1_000_000,
        help="events to record for (b): the most asked for; a host that records fewer gives fewer (default 1,000,000)",
    )
    parser.add_argument(
        "--small-events",
        type=int,
        default=100_000,
        help="events of (d), the start of (b), where start-up weighs most (default 100,000)",
    )
    parser.add_argument("--keep", type=Path, help="keep the recorded traces here (default: a temporary directory)")
    args = parser.parse_args()
    if args.runs < 5:
        parser.error("--runs must be at least 5")
    if args.events < 1 or args.small_events < 1:
        parser.error("--events and --small-events must be at least 1")
    if shutil.which("trace-cmd") is None:
        raise SystemExit("trace-cmd is not installed: it is what ticklab is compared with")
    from tabulate import tabulate

    with tempfile.TemporaryDirectory(prefix="ticklab-bench-") as scratch:
        work = args.keep or Path(scratch)
        work.mkdir(parents=True, exist_ok=True)
        notes: list[str] = []
        if args.traces:
            inputs = {path.name: path for path in args.traces}
        else:
            print("finding the bundled trace with the most events ...", file=sys.stderr)
            bundled = bundled_largest(work)
            if os.geteuid() != 0:
                raise SystemExit("ingest_speed: recording a trace needs root (tracefs); pass TRACE files instead")
            load_before = os.getloadavg()[0]
            print(f"recording up to {args.events:,} events (tracefs, hackbench) ...", file=sys.stderr)
            big, recorded = record(work, args.events)
            if recorded < args.events:
                notes.append(
                    f"(b) holds {recorded:,} events, not the {args.events:,} asked (--events): what this "
                    "host's recorder gave"
                )
            inputs = {"(a) bundled": bundled, "(b) recorded": big, "(c) recorded, zstd v7": compressed(big, work)}
            if recorded > args.small_events:
                inputs["(d) (b)'s first events"] = first_events(big, args.small_events, work)
            settle(load_before)
        sizes = {label: (event_count(path), path.stat().st_size) for label, path in inputs.items()}
        ticklab = shutil.which("ticklab", path=str(Path(sys.executable).parent)) or "ticklab"
        help_times, help_uncached = [], []
        times: dict[tuple[str, str], list[float]] = {}
        cpu_times: dict[tuple[str, str], list[float]] = {}
        memory: dict[tuple[str, str], list[float]] = {}
        with bytecode_cache(scratch) as bytecode:
            loads = [os.getloadavg()[0]]  # the 1-minute load average before each round and after the last
            for round_number in range(args.runs):
                print(f"round {round_number + 1}/{args.runs} (load average {loads[-1]:.2f})", file=sys.stderr)
                help_times.append(run([ticklab, "--help"])[0])
                help_uncached.append(
                    run(["env", "-u", "PYTHONPYCACHEPREFIX", "PYTHONDONTWRITEBYTECODE=1", ticklab, "--help"])[0]
                )
                for label, path in inputs.items():
                    todo = list(commands(path).items())
                    shift = round_number % len(todo)
                    with fresh_directory(work, "parquet") as out:  # ticklab's tables, written in it by descriptor
                        for name, argv in todo[shift:] + todo[:shift]:
                            self_timed = name.startswith(("API", "ref"))
                            wall, cpu, peak, printed = run(
                                argv,
                                stdout=subprocess.PIPE if self_timed else subprocess.DEVNULL,
                                in_directory=out.fd if name == "ticklab CLI" else None,
                            )
                            if printed.strip():  # the API rows time themselves, after their imports
                                wall, cpu = map(float, printed.split())
                            times.setdefault((label, name), []).append(wall)
                            cpu_times.setdefault((label, name), []).append(cpu)
                            memory.setdefault((label, name), []).append(peak)
                loads.append(os.getloadavg()[0])
        rows = []
        for label, (events, _size) in sizes.items():
            theirs = statistics.median(times[(label, "trace-cmd")])
            their_memory = statistics.median(memory[(label, "trace-cmd")])
            for name in ("ticklab CLI", "API arrow", "API pandas", "reference", "trace-cmd"):
                if (label, name) not in times:
                    rows.append(["", name, "refused (compressed)", "", "", "", "", "", ""])
                    continue
                wall = statistics.median(times[(label, name)])
                peak = statistics.median(memory[(label, name)])
                cpu = statistics.median(cpu_times[(label, name)])
                rows.append(
                    [
                        label if name == "ticklab CLI" else "",
                        name,
                        summary(times[(label, name)]),
                        f"{events / wall:,.0f}",
                        paired(times, label, name),
                        f"{cpu:.3f}",
                        paired(cpu_times, label, name),
                        f"{peak:.0f}",
                        f"{peak / their_memory:.2f}",
                    ]
                )
        print(
            f"host: {os.uname().nodename}, {os.cpu_count()} CPUs; n = {args.runs} interleaved rounds; 1-minute load "
            f"average {loads[0]:.2f} before the first round, {max(loads):.2f} at most, {loads[-1]:.2f} after the "
            "last (a shared machine: expect noise)"
        )
        for label, (events, size) in sizes.items():
            print(f"{label}: {inputs[label]}  ({events:,} events, {size / 1e6:.1f} MB)")
        for note in notes:
            print(note)
        print(
            tabulate(
                rows,
                headers=[
                    "input",
                    "command",
                    "wall s: median [min-max]",
                    "events/s",
                    "x trace-cmd [min-max]",
                    "CPU s",
                    "x trace-cmd CPU",
                    "peak MB",
                    "memory / trace-cmd",
                ],
                disable_numparse=True,
            )
        )
        print(
            f"`ticklab --help`: {summary(help_times)} s (goal < 0.3 s); {summary(help_uncached)} s with "
            "PYTHONDONTWRITEBYTECODE=1 (every start compiles ticklab's modules)"
        )
        print(bytecode)
        print("API rows time the read in a fresh interpreter after its imports; their peak memory includes them.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
