"""Recording tracepoints around a workload: trace-cmd where it works, tracefs directly where not.

Both backends leave a directory ``ingest.read_trace`` reads, and report the events the kernel lost.

* ``trace-cmd``: ``trace-cmd record`` in the background, stopped with SIGINT; writes ``trace.dat``.
  The global tracefs files it changes are guarded through :class:`HostChanges` and put back.
* ``tracefs``: a private tracefs instance (``instances/ticklab-<pid>``); a thread reads each CPU's
  ``trace_pipe_raw`` pages into ``cpu<N>.raw`` and the event formats are copied beside them. Used where
  ``trace-cmd record`` fails (for example when /proc/sys/kernel/ftrace_enabled cannot be written).
  Beside the pages go what a trace-cmd trace.dat carries so that KernelShark and ``trace-cmd report`` name what
  they show (ticklab.trace.tracedat writes both into the trace.dat it makes of the capture):

  - ``saved_cmdlines``: the kernel's pid → command cache as tracing stopped, all of it. The cache and the
    ``record-cmd`` option that fills it are global, the only global tracing state this backend touches: the
    cache is raised to ``SAVED_CMDLINES_SIZE`` entries where it keeps fewer (which empties it: it then holds the
    tasks that ran while the run was traced, none of an earlier task whose pid was reused) and the option turned
    on where it is off, both through :class:`HostChanges` and put back when the run ends.
  - ``kallsyms``: the /proc/kallsyms lines of the symbols the experiment names (``trace.symbols``: their
    addresses tell the tick's and HRTICK's timers apart) and of every function the trace's records point into
    (hrtimer callbacks, the function tracer's ip and parent_ip, ...), read after tracing stopped. A trace-cmd
    trace.dat carries all of kallsyms (5.4 MB, 0.6 MB xz'd, on this project's 6.18 hosts): too much to keep
    beside each run of a bundle, whose traces are tens to hundreds of kB.
"""

from __future__ import annotations

import bisect
import os
import pty
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from ..host import HostChanges, facts
from ..registry import TRACING_BACKENDS
from ..safefiles import OwnedDir, UnsafeFileError
from ..trace.tracefs_stats import stats_lost_count
from .process import spawn

TRACEFS_RELATIVE = "sys/kernel/tracing"
GUARDED = ("tracing_on", "current_tracer", "buffer_size_kb", "trace_clock")
FUNCTION_EVENT = "ftrace:function"  # what the function tracer records: ip (the traced function) and parent_ip
# The most pid -> command entries one may ask the kernel's cache for (PID_MAX_DEFAULT; 6.8 and later round it up to
# fill their allocation: 45,874 on 6.18): a kernel build starts thousands of short-lived tasks in one run, more than
# the 128 entries kernels before 6.8 keep by default (6.8 and later: 6,552)
SAVED_CMDLINES_SIZE = 32768
FUNCTION_SYMBOL_TYPES = frozenset("tTwW")  # kallsyms types of code: what a function pointer or an ip points into
SCAN_CHUNK = 1 << 24  # raw bytes searched for kernel addresses at a time: whole pages, so no value is cut in two


class TracingError(RuntimeError):
    """Tracing could not be set up; the message says what is missing."""


@dataclass
class TraceResult:
    backend: str
    directory: Path
    lost_events: int
    lost_per_cpu: dict[int, int] = field(default_factory=dict)
    symbols: dict[str, str] | None = None  # name -> address recorded beside a tracefs capture (None: not asked for)
    functions: list[str] = field(default_factory=list)
    absent_events: list[str] = field(default_factory=list)  # optional events this kernel does not have

    def record(self) -> dict:
        record = {
            "backend": self.backend,
            "directory": self.directory.name,
            "lost_events": self.lost_events,
            "lost_per_cpu": {str(k): v for k, v in self.lost_per_cpu.items()},
        }
        if self.symbols is not None:
            record["symbols"] = self.symbols
        if self.functions:
            record["functions"] = self.functions
        if self.absent_events:
            record["absent_events"] = self.absent_events
        return record


def ensure_tracefs(host: HostChanges) -> Path:
    """Where tracefs is, mounting it (through ``host``, so it is unmounted afterwards) if needed."""
    found = facts.tracefs_mount(host.root)
    if found:
        return found
    if not (host.root / TRACEFS_RELATIVE).is_dir():
        raise TracingError(f"{host.root / TRACEFS_RELATIVE}: missing; this kernel has no tracefs (CONFIG_TRACING)")
    host.mount("tracefs", TRACEFS_RELATIVE)
    return host.root / TRACEFS_RELATIVE


def _has_event(tracefs: Path, event: str) -> bool:
    return (tracefs / "events" / event.replace(":", "/") / "format").is_file()


def present_events(tracefs: Path, optional: list[str]) -> tuple[list[str], list[str]]:
    """(the optional events this kernel has, those it has not): e.g. timer:hrtimer_rearm exists from 7.1 on."""
    return [e for e in optional if _has_event(tracefs, e)], [e for e in optional if not _has_event(tracefs, e)]


def check_events(tracefs: Path, events: list[str]) -> None:
    missing = [e for e in events if not _has_event(tracefs, e)]
    if missing:
        raise TracingError(f"{tracefs / 'events'}: this kernel has no tracepoint(s) {', '.join(missing)}")


def kallsyms_lines(text: str, names: list[str]) -> list[str]:
    """The /proc/kallsyms lines of ``names`` (address, type, name[, module]); a symbol the kernel lacks, or shows
    at address 0 (to a reader without CAP_SYSLOG under kptr_restrict), is left out."""
    wanted = set(names)
    found = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[2] in wanted and fields[0].strip("0"):
            found.append(line)
    return found


def _knob_value(path: Path) -> str | None:
    """A tracefs file's text, stripped; None where this kernel has no such file."""
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return None


class KernelFunctions:
    """/proc/kallsyms's functions in address order: which function an address in a trace lies in."""

    def __init__(self, kallsyms: str):
        entries = []
        for line in kallsyms.splitlines():
            fields = line.split(maxsplit=3)
            # an address of 0 is what a reader without CAP_SYSLOG sees under kptr_restrict: no address at all
            if len(fields) >= 3 and fields[1] in FUNCTION_SYMBOL_TYPES and fields[0].strip("0"):
                entries.append((int(fields[0], 16), line))
        entries.sort(key=lambda entry: entry[0])
        self.addresses = [address for address, _ in entries]
        self.lines = [line for _, line in entries]

    def upper_halves(self) -> set[int]:
        """The upper 32 bits kernel code addresses have here (0xffffffff on x86-64, 0xffff8000 on arm64): those in
        the kernel's half of a 64-bit address space only (a 32-bit kernel's would be 0, which every small number
        has: there the capture keeps the named symbols' lines alone)."""
        return {address >> 32 for address in self.addresses if address >> 63}

    def lines_of(self, address: int) -> list[str]:
        """The kallsyms lines of the function ``address`` lies in (every name at its start), or [] below them all."""
        after = bisect.bisect_right(self.addresses, address)
        if after == 0:
            return []
        first = bisect.bisect_left(self.addresses, self.addresses[after - 1])
        return self.lines[first:after]


def kernel_addresses(chunks: Iterable[bytes], upper_halves: set[int]) -> set[int]:
    """Every 64-bit little-endian value at a 4-byte boundary of ``chunks`` (ring-buffer pages) whose upper half is
    one of ``upper_halves``: every kernel code address the records hold, whatever field holds it (a record starts
    at a 4-byte boundary of its page and its 8-byte fields are aligned within it), and rarely a value that only
    looks like one (its kallsyms line is kept too, and shown by nothing)."""
    needles = [upper.to_bytes(4, "little") for upper in upper_halves]
    found: set[int] = set()
    for chunk in chunks:
        for needle in needles:
            at = chunk.find(needle, 4)
            while at >= 0:
                if at % 4 == 0:
                    found.add(int.from_bytes(chunk[at - 4 : at + 4], "little"))
                at = chunk.find(needle, at + 1)
    return found


def _raw_chunks(paths: list[Path]) -> Iterable[bytes]:
    for path in paths:
        with path.open("rb") as raw:
            while chunk := raw.read(SCAN_CHUNK):
                yield chunk


def kept_kallsyms(kallsyms: str, names: list[str], raw_files: list[Path]) -> list[str]:
    """The kallsyms lines a capture keeps: those of ``names`` and of every function the raw pages point into,
    in address order."""
    functions = KernelFunctions(kallsyms)
    kept = dict.fromkeys(kallsyms_lines(kallsyms, names))
    for address in kernel_addresses(_raw_chunks(raw_files), functions.upper_halves()):
        kept.update(dict.fromkeys(functions.lines_of(address)))
    return sorted(kept, key=lambda line: int(line.split()[0], 16))


def check_clock(tracefs: Path, clock: str) -> None:
    """``clock`` is one of the trace clocks tracefs (or an instance of it) offers."""
    offered = (tracefs / "trace_clock").read_text().replace("[", " ").replace("]", " ").split()
    if clock not in offered:
        raise TracingError(
            f"{tracefs / 'trace_clock'}: this kernel has no trace clock {clock!r} (it has: {', '.join(offered)})"
        )


def check_functions(tracefs: Path, functions: list[str]) -> None:
    """The function tracer exists and can trace each of ``functions`` (not inlined, not notrace)."""
    if not functions:
        return
    if "function" not in (tracefs / "available_tracers").read_text().split():
        raise TracingError(
            f"{tracefs / 'available_tracers'}: no function tracer in this kernel "
            f"(CONFIG_FUNCTION_TRACER); cannot count calls of {', '.join(functions)}"
        )
    listed = tracefs / "available_filter_functions"
    try:
        available = {line.split()[0] for line in listed.read_text().splitlines() if line.strip()}
    except OSError as exc:
        raise TracingError(f"{listed}: cannot read ({exc.strerror or exc}); function tracing is refused here") from None
    missing = [name for name in functions if name not in available]
    if missing:
        raise TracingError(f"{listed}: the function tracer cannot trace {', '.join(missing)} in this kernel")


def guard_tracefs(host: HostChanges, tracefs: Path, label: str, functions: Sequence[str] = ()) -> None:
    """The global tracefs files trace-cmd changes, recorded so that they are put back."""
    for name in (*GUARDED, *(("set_ftrace_filter",) if functions else ())):
        host.guard(f"{tracefs.relative_to(host.root)}/{name}", label=f"{label} {name}")


_PROBED: dict[str, tuple[bool, str]] = {}


def probe_trace_cmd(host: HostChanges) -> tuple[bool, str]:
    """Does ``trace-cmd record`` actually work here? Tried once per process, not assumed. (works, reason)"""
    if "result" not in _PROBED:
        _PROBED["result"] = _probe(host)
    return _PROBED["result"]


def _probe(host: HostChanges) -> tuple[bool, str]:
    tool = shutil.which("trace-cmd")
    if tool is None:
        return False, "trace-cmd is not installed"
    if os.geteuid() != 0:
        return False, "trace-cmd record needs root"
    if host.dry_run:
        return False, "not tried in a dry run"
    tracefs = ensure_tracefs(host)  # mounted by us (and unmounted afterwards), not left mounted by trace-cmd
    guard_tracefs(host, tracefs, "trace-cmd probe")
    with tempfile.TemporaryDirectory(prefix="ticklab-probe-") as scratch, host.watching_mounts("trace-cmd"):
        output = Path(scratch) / "probe.dat"
        try:
            result = subprocess.run(
                [tool, "record", "-e", "sched:sched_switch", "-o", str(output), "true"],
                capture_output=True,
                text=True,
                timeout=60,
                cwd=scratch,
            )
        except subprocess.TimeoutExpired:
            return False, "trace-cmd record did not finish within 60 s"
        if result.returncode == 0 and output.is_file() and output.stat().st_size > 0:
            return True, "trace-cmd record works"
        said = " / ".join(line.strip() for line in (result.stderr + result.stdout).splitlines() if line.strip())[-200:]
        return False, f"trace-cmd record fails here (exit {result.returncode}: {said})"


# Why ``auto`` does not give a function-tracing experiment to trace-cmd: when it ends, trace-cmd
# (finalize_record_trace, read in 3.4; Debian 12's 3.1.6 behaves the same) empties set_ftrace_filter before it writes
# nop to current_tracer, so for a moment the function tracer is on every traceable function: tens of thousands of
# call sites patched through int3 and patched back, during the run's teardown. On the lab host under QEMU TCG three
# runs oopsed in that batch ("Oops: int3" at the entry of an unrelated function, function_trace_call on the stack).
# ticklab's own recorder traces through an instance of its own, patches only the filtered functions' sites, and puts
# its tracer back to nop before its filter.
FUNCTIONS_NOT_TRACE_CMD = (
    "the experiment traces functions, and trace-cmd empties set_ftrace_filter before it stops "
    "the function tracer when it ends (every kernel function traced for a moment)"
)


def choose_backend(host: HostChanges, preference: str = "auto", functions: Sequence[str] = ()) -> tuple[str, str]:
    """(backend, why): trace-cmd if asked for or if it works (and the experiment traces no function), else
    tracefs."""
    if preference == "tracefs":
        return "tracefs", "asked for"
    if preference == "auto" and functions:
        return "tracefs", FUNCTIONS_NOT_TRACE_CMD
    works, why = probe_trace_cmd(host)
    if preference == "trace-cmd":
        if not works:
            raise TracingError(why)
        return "trace-cmd", "asked for"
    return ("trace-cmd", why) if works else ("tracefs", f"fallback: {why}")


def planned_tracefs_writes(
    root: Path, events: list[str], buffer_kb: int, functions: Sequence[str] = (), clock: str | None = None
) -> list[str]:
    """What TracefsRecorder writes, in order, for a dry run (trace-cmd, when used, writes the same kind of files)."""
    tracefs = root / TRACEFS_RELATIVE
    instance = tracefs / "instances" / "ticklab-<pid>"
    tracer = (
        [
            f"write '{' '.join(functions)}' to {instance}/set_ftrace_filter",
            f"write 'function' to {instance}/current_tracer",
        ]
        if functions
        else []
    )
    return [
        f"write '{SAVED_CMDLINES_SIZE}' to {tracefs}/saved_cmdlines_size where it keeps fewer (put back after the run)",
        f"write '1' to {tracefs}/options/record-cmd where it is 0 (put back after the run)",
        f"mkdir {instance} (removed after the run)",
        f"write '0' to {instance}/tracing_on",
        f"write '{buffer_kb}' to {instance}/buffer_size_kb",
        *([f"write '{clock}' to {instance}/trace_clock"] if clock else []),
        *[f"write '1' to {instance}/events/{event.replace(':', '/')}/enable" for event in events],
        *tracer,
        f"write '1' to {instance}/tracing_on",
        f"write '0' to {instance}/tracing_on",
    ]


class Recorder:
    """What every tracing backend's recorder is given (see :func:`recorder`) and checks first; each subclass is the
    recorder of its ``backend`` (a name of registry.TRACING_BACKENDS), used as a context manager around the run."""

    backend: str

    def __init__(
        self,
        host: HostChanges,
        events: list[str],
        directory: Path,
        *,
        buffer_kb: int = 4096,
        symbols: Sequence[str] = (),
        functions: Sequence[str] = (),
        optional_events: Sequence[str] = (),
        clock: str | None = None,
    ):
        self.host, self.events, self.directory, self.buffer_kb = host, list(events), Path(directory), buffer_kb
        self.optional_events = list(optional_events)
        self.absent_events: list[str] = []
        self.symbols, self.functions, self.clock = list(symbols), list(functions), clock
        # what went wrong in a helper thread, for the main thread to raise (tracefs: the first write that failed, a full
        # disk; trace-cmd: trace-cmd.log could not be written)
        self._error: str | None = None
        self.result: TraceResult | None = None

    def _check_events(self) -> Path:
        """The mounted tracefs, once the events and functions are known to this kernel and the optional events it
        has are added to those recorded (the others listed in ``absent_events``)."""
        tracefs = ensure_tracefs(self.host)
        check_events(tracefs, self.events)
        present, self.absent_events = present_events(tracefs, self.optional_events)
        self.events += present
        check_functions(tracefs, self.functions)
        return tracefs


class TracefsRecorder(Recorder):
    backend = "tracefs"

    def __init__(self, *args, **kwargs):  # as Recorder's
        super().__init__(*args, **kwargs)
        self._symbols_found: dict[str, str] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._files: dict[int, tuple[int, BinaryIO, Path]] = {}

    def __enter__(self) -> TracefsRecorder:
        tracefs = self._check_events()
        self._scope = self.host.scope()
        try:
            self._start(tracefs)
        except BaseException:
            self._close_files()  # an open trace_pipe_raw keeps the instance busy: it could not be removed
            self._scope.close()
            raise
        return self

    def _start(self, tracefs: Path) -> None:
        instance = tracefs / "instances" / f"ticklab-{os.getpid()}"
        relative = str(instance.relative_to(self.host.root))
        self.tracefs, self.instance, self.relative = tracefs, instance, relative
        self._keep_command_lines(tracefs)  # before the instance: it takes record-cmd from the top level when made
        self.host.make_dir(relative, label="tracefs instance")
        self.host.write(f"{relative}/tracing_on", "0", label="tracing_on")
        self.host.write(f"{relative}/buffer_size_kb", str(self.buffer_kb), label="buffer_size_kb")
        if self.clock:
            check_clock(instance, self.clock)
            self.host.write(f"{relative}/trace_clock", self.clock, label="trace_clock")
        for event in self.events:
            self.host.write(f"{relative}/events/{event.replace(':', '/')}/enable", "1", label=f"event {event}")
        if self.functions:  # the instance's own filter and tracer: the global ones are not touched
            self.host.write(f"{relative}/set_ftrace_filter", " ".join(self.functions), label="function filter")
            self.host.write(f"{relative}/current_tracer", "function", label="function tracer")
        self.directory.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(tracefs / "events" / "header_page", self.directory / "header_page")
        shutil.copyfile(tracefs / "events" / "header_event", self.directory / "header_event")
        for event in [*self.events, *([FUNCTION_EVENT] if self.functions else [])]:
            system, name = event.split(":")
            target = self.directory / "formats" / system / name
            target.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(tracefs / "events" / system / name / "format", target / "format")
        (self.directory / "trace_clock").write_text((instance / "trace_clock").read_text())
        (self.directory / "page_size").write_text(f"{os.sysconf('SC_PAGE_SIZE')}\n")
        for cpu_dir in sorted((instance / "per_cpu").glob("cpu[0-9]*")):
            cpu = int(cpu_dir.name[3:])
            fd = os.open(cpu_dir / "trace_pipe_raw", os.O_RDONLY | os.O_NONBLOCK)
            try:
                out = (self.directory / f"cpu{cpu}.raw").open("wb")
            except BaseException:
                os.close(fd)
                raise
            self._files[cpu] = (fd, out, self.directory / f"cpu{cpu}.raw")
        self._thread = threading.Thread(target=self._pump, name="ticklab-tracefs-reader", daemon=True)
        self._thread.start()
        self.host.write(f"{relative}/tracing_on", "1", label="tracing_on")

    def _keep_command_lines(self, tracefs: Path) -> None:
        """Make the kernel's pid -> command cache hold every task of a run: as large as it goes and filled."""
        relative = tracefs.relative_to(self.host.root)
        size = _knob_value(tracefs / "saved_cmdlines_size")
        if size is not None and size.isdigit() and int(size) < SAVED_CMDLINES_SIZE:
            # refused where the kernel cannot allocate so much (it keeps the size it had): fewer names, same trace
            self.host.write(
                f"{relative}/saved_cmdlines_size",
                str(SAVED_CMDLINES_SIZE),
                label="saved_cmdlines_size",
                may_refuse=True,
            )
        if _knob_value(tracefs / "options" / "record-cmd") == "0":
            self.host.write(f"{relative}/options/record-cmd", "1", label="record-cmd")

    def _write_names(self, raw_files: list[Path]) -> None:
        """saved_cmdlines and kallsyms beside the pages (module docstring), read after tracing stopped: the traced
        CPUs never see /proc/kallsyms's few MB being parsed, and the cache holds the tasks of the whole run."""
        try:  # bytes: a task may name itself anything (prctl PR_SET_NAME), and is kept as it named itself
            command_lines = (self.tracefs / "saved_cmdlines").read_bytes()
        except OSError:
            command_lines = None
        kallsyms_path = self.host.root / "proc" / "kallsyms"
        try:
            kallsyms = kallsyms_path.read_text(errors="replace")
        except OSError as exc:
            if self.symbols:  # the experiment's metrics need their addresses
                self._error = self._error or (
                    f"{kallsyms_path}: cannot read ({exc.strerror or exc}); the addresses "
                    f"of {', '.join(self.symbols)} are not known"
                )
                return
            kallsyms = ""  # nothing to name the trace's functions with: tools show their addresses
        try:
            lines = kept_kallsyms(kallsyms, self.symbols, raw_files)
        except OSError as exc:
            self._error = self._error or f"{exc.filename}: cannot read back ({exc.strerror or exc})"
            return
        if self.symbols:
            wanted = set(self.symbols)
            self._symbols_found = {
                fields[2]: f"0x{fields[0]}" for fields in map(str.split, lines) if fields[2] in wanted
            }
        try:
            with OwnedDir(self.directory, create=False) as capture:
                if command_lines is not None:  # a kernel without the cache: the tasks go unnamed, as with trace-cmd
                    capture.write_new("saved_cmdlines", command_lines)
                capture.write_new("kallsyms", "".join(f"{line}\n" for line in lines).encode())
        except UnsafeFileError as exc:
            self._error = self._error or str(exc)

    def _drain_once(self) -> bool:
        """Move what the kernel has buffered into the cpu<N>.raw files; a file that cannot be written (a full disk)
        is recorded in ``_error`` and nothing more is moved."""
        page = os.sysconf("SC_PAGE_SIZE")
        moved = False
        for fd, out, path in self._files.values():
            while self._error is None:
                try:
                    chunk = os.read(fd, page)
                except BlockingIOError:
                    break
                except OSError as exc:
                    self._error = f"{self.instance / 'per_cpu'}: cannot read trace_pipe_raw ({exc.strerror or exc})"
                    break
                if not chunk:
                    break
                try:
                    out.write(chunk)
                except OSError as exc:
                    self._error = f"{path}: cannot write ({exc.strerror or exc}); the trace of this run is incomplete"
                    break
                moved = True
        return moved

    def _pump(self) -> None:
        """The reader thread: it never raises (a traceback there would be all the user sees); an error it meets
        stops it and is raised by ``__exit__`` in the thread that runs the capture."""
        try:
            while not self._stop.is_set() and self._error is None:
                if not self._drain_once():
                    self._stop.wait(0.05)
        except BaseException as exc:  # not a write error (those are in _error already): still the main thread's
            self._error = self._error or f"{self.directory}: the tracefs reader stopped ({type(exc).__name__}: {exc})"

    def _close_files(self) -> None:
        """Close every trace_pipe_raw and cpu<N>.raw (an error closing one, a full disk, is kept in ``_error``)."""
        files, self._files = self._files, {}
        for fd, out, path in files.values():
            os.close(fd)
            try:
                out.close()
            except OSError as exc:
                self._error = (
                    self._error or f"{path}: cannot write ({exc.strerror or exc}); the trace of this run is incomplete"
                )

    def __exit__(self, *exc_info) -> None:
        try:
            if self._thread is not None:
                self.host.write(f"{self.relative}/tracing_on", "0", label="tracing_on")
                self._stop.set()
                self._thread.join()
                self._drain_once()
                cpus = list(self._files)
                raw_files = [path for _, _, path in self._files.values()]
                self._close_files()
                if self._error is None:
                    self._write_names(raw_files)
                lost = {}
                for cpu in cpus:
                    stats = (self.instance / "per_cpu" / f"cpu{cpu}" / "stats").read_text()
                    lost[cpu] = stats_lost_count(stats)
                    if self._error is None:
                        try:
                            (self.directory / f"cpu{cpu}.stats").write_text(stats)
                        except OSError as exc:
                            self._error = f"{self.directory / f'cpu{cpu}.stats'}: cannot write ({exc.strerror or exc})"
                self.result = TraceResult(
                    self.backend,
                    self.directory,
                    sum(lost.values()),
                    lost,
                    self._symbols_found,
                    self.functions,
                    self.absent_events,
                )
        finally:
            self._close_files()  # before the instance is removed: an open trace_pipe_raw keeps it busy
            self._scope.close()
        if self._error is not None and exc_info[0] is None:
            raise TracingError(self._error)


class TraceCmdRecorder(Recorder):
    """trace-cmd writes the whole of /proc/kallsyms into trace.dat: ``symbols`` needs no extra step here."""

    backend = "trace-cmd"

    def __init__(self, *args, **kwargs):  # as Recorder's
        super().__init__(*args, **kwargs)
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> TraceCmdRecorder:
        tracefs = self._check_events()
        if self.clock:
            check_clock(tracefs, self.clock)
        self._scope = self.host.scope()
        guard_tracefs(self.host, tracefs, "trace-cmd", self.functions)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.log_path = self.directory / "trace-cmd.log"
        # uncompressed (trace-cmd 3 compresses v7 files with zstd when it can), so ingest reads every trace.dat
        argv = [
            "trace-cmd",
            "record",
            "--compression",
            "none",
            "-b",
            str(self.buffer_kb),
            "-o",
            str(self.directory / "trace.dat"),
        ]
        for event in self.events:
            argv += ["-e", event]
        if self.clock:
            argv += ["-C", self.clock]
        if self.functions:
            argv += ["-p", "function", *[part for name in self.functions for part in ("-l", name)]]
        self.log = self.log_path.open("wb")
        # trace-cmd block-buffers stdout that is not a terminal, so "Hit Ctrl^C" would only arrive at
        # exit: give it a pseudo-terminal and copy what it says into trace-cmd.log.
        terminal, child_side = pty.openpty()
        self._started = threading.Event()
        with self.host.watching_mounts("trace-cmd record"):
            self.process = spawn(
                argv,
                host=self.host,
                label="trace-cmd record",
                stdin=subprocess.DEVNULL,
                stdout=child_side,
                stderr=child_side,
                cwd=self.directory,
            )
        os.close(child_side)
        self._copier = threading.Thread(target=self._copy_output, args=(terminal,), daemon=True)
        self._copier.start()
        deadline = time.monotonic() + 120
        while not self._started.wait(0.05):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.process.kill()
                self.process.wait()
                self._copier.join(5)
                self.log.close()
                self._scope.close()
                raise TracingError(
                    f"{self.log_path}: trace-cmd record did not start: {self.log_path.read_text()[-300:]}"
                )
        return self

    def _copy_output(self, terminal: int) -> None:
        seen = b""
        try:
            while True:
                try:
                    chunk = os.read(terminal, 4096)
                except OSError:  # EIO: trace-cmd exited and closed the terminal
                    break
                if not chunk:
                    break
                if self._error is None:  # a full disk: trace-cmd's output is still read (it would block), not kept
                    try:
                        self.log.write(chunk)
                        self.log.flush()
                    except OSError as exc:
                        self._error = f"{self.log_path}: cannot write ({exc.strerror or exc})"
                seen = (seen + chunk)[-64:]
                if b"Hit Ctrl^C" in seen:
                    self._started.set()
        finally:
            os.close(terminal)

    def __exit__(self, *exc_info) -> None:
        try:
            if self.process and self.process.poll() is None:
                self.process.send_signal(signal.SIGINT)
                try:
                    self.process.wait(timeout=120)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait()
            self._copier.join(30)
            try:
                self.log.close()
            except OSError as exc:
                self._error = self._error or f"{self.log_path}: cannot write ({exc.strerror or exc})"
            if self._error and exc_info[0] is None:
                raise TracingError(self._error)
            lost = stats_lost_count(self.log_path.read_text())
            self.result = TraceResult(
                self.backend, self.directory, lost, functions=self.functions, absent_events=self.absent_events
            )
            assert self.process is not None  # started by __enter__
            if self.process.returncode not in (0, -signal.SIGINT) and exc_info[0] is None:
                raise TracingError(f"{self.log_path}: trace-cmd record exited {self.process.returncode}")
        finally:
            self._scope.close()


# each tracing backend trace/registry.py names (the experiment schema and the CLI take the names from there), its
# recorder: a backend named there without a recorder here fails when this module is imported
RECORDERS = {cls.backend: cls for cls in (TraceCmdRecorder, TracefsRecorder)}
if list(RECORDERS) != list(TRACING_BACKENDS):
    raise ImportError(f"capture/tracing.py: recorders for {list(RECORDERS)}; registry.py: {TRACING_BACKENDS}")


def recorder(
    backend: str,
    host: HostChanges,
    events: list[str],
    directory: Path,
    *,
    buffer_kb: int = 4096,
    symbols: Sequence[str] = (),
    functions: Sequence[str] = (),
    optional_events: Sequence[str] = (),
    clock: str | None = None,
):
    """A recorder of ``events``, of those ``optional_events`` the running kernel has (the others go into the
    result's ``absent_events``) and, where ``functions`` are named, of every call of those functions
    (the function tracer filtered to them; each call is an ``ftrace:function`` event), its timestamps on the trace
    clock ``clock`` (None: the kernel's default, ``local``)."""
    cls = RECORDERS.get(backend)
    if cls is None:
        raise TracingError(f"unknown tracing backend {backend!r} (have: {', '.join(RECORDERS)})")
    return cls(
        host,
        events,
        directory,
        buffer_kb=buffer_kb,
        symbols=symbols,
        functions=functions,
        optional_events=optional_events,
        clock=clock,
    )
