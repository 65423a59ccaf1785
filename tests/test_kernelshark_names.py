"""KernelShark on a tracefs capture (issue 41 item 6): the trace.dat ticklab writes from a tracefs capture names
the tasks and the functions its events point at, as a trace-cmd trace.dat does.

KernelShark reads a trace.dat through libtraceevent, as `trace-cmd report` does: a task is named from the file's
command-line list (else shown as ``<...>``), a ``%ps`` field (hrtimer callbacks, the function tracer's ip and
parent_ip) from its kallsyms (else shown as a hex address). The capture here is real: a short trace of this host
under a workload of short-lived processes that sleep (their hrtimer_wakeup timers) and one that spins (timer
interrupts landing in a task, not in idle).
"""

from __future__ import annotations

import lzma
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ticklab import paths
from ticklab.capture.tracing import KernelFunctions, kept_kallsyms
from ticklab.host import HostChanges
from ticklab.trace import rawfile
from ticklab.trace.ingest import read_trace
from ticklab.trace.tracedat import tracefs_to_trace_dat

pytestmark = pytest.mark.xdist_group("machine")

TRACEFS = Path("/sys/kernel/tracing")
EVENTS = ["timer:hrtimer_start", "timer:hrtimer_expire_entry", "irq_vectors:local_timer_entry"]
TRACED_FUNCTION = "hrtimer_start_range_ns"  # called from many places: its callers are many parent_ip values
# A trace-cmd report line: "<comm>-<pid> [<cpu>] <seconds>: <event>: <fields>" (a comm may hold spaces and dashes)
REPORT_LINE = re.compile(
    r"^\s*(?P<comm>.+?)-(?P<pid>\d+)\s+\[(?P<cpu>\d+)\]\s+[\d.]+:"
    r"\s+(?P<event>\w+):\s*(?P<fields>.*)$"
)
SPIN = "import time\nend = time.monotonic() + 0.4\nwhile time.monotonic() < end: pass"
WORKLOAD = f"for i in $(seq 150); do sleep 0.002; done & {sys.executable} -c '{SPIN}'; wait"


def cannot_capture() -> str | None:
    if os.geteuid() != 0:
        return "a real tracefs capture needs root"
    if not TRACEFS.is_dir():
        return f"{TRACEFS}: no tracefs on this host"
    if shutil.which("trace-cmd") is None:
        return "trace-cmd is not installed: nothing reads the converted file as KernelShark does"
    return None


def has_function_tracer() -> bool:
    try:
        traceable = (TRACEFS / "available_filter_functions").read_text().splitlines()
        return "function" in (TRACEFS / "available_tracers").read_text().split() and any(
            line.split()[0] == TRACED_FUNCTION for line in traceable
        )
    except OSError:
        return False


def report(trace_dat: Path) -> list[dict]:
    """Every event line of `trace-cmd report` (libtraceevent, KernelShark's reader) as its parts."""
    text = subprocess.run(
        ["trace-cmd", "report", "-i", str(trace_dat)], check=True, capture_output=True, text=True
    ).stdout
    return [match.groupdict() for match in map(REPORT_LINE.match, text.splitlines()) if match]


needs_a_capture = pytest.mark.skipif(cannot_capture() is not None, reason=str(cannot_capture()))


def first_trace_dat_per_kernel() -> list[Path]:
    """A trace-cmd trace.dat (all of its kernel's kallsyms inside) of each guest kernel the bundles hold."""
    found = {}
    for path in sorted(paths.traces_dir().glob("guest-*/*/*/raw/run-*/trace/trace.dat*")):  # sealed: trace.dat.xz
        found.setdefault(path.relative_to(paths.traces_dir()).parts[0].split("-on-")[0], path)
    return sorted(found.values())


@pytest.mark.parametrize("trace_dat", first_trace_dat_per_kernel(), ids=lambda p: p.parts[-7].split("-on-")[0])
def test_the_kept_lines_cover_every_callback_of_a_bundled_trace_of_another_kernel(trace_dat, tmp_path):
    """The search for kernel addresses in the pages, on other kernels' real traces (the bundled guests', 6.1 and
    6.12): every hrtimer callback their events name lies in a function whose kallsyms line is kept, and what is
    kept is a few lines of the kernel's tens of thousands."""
    if trace_dat.suffix == ".xz":  # the recorder scans the plain pages it wrote
        (tmp_path / "trace.dat").write_bytes(rawfile.read_bytes(trace_dat))
        trace_dat = tmp_path / "trace.dat"
    trace = read_trace(trace_dat)
    everything = trace.kallsyms.decode(errors="replace")
    kept = kept_kallsyms(everything, [], [trace_dat])
    functions = KernelFunctions(everything)
    callbacks = {int(v) for v in trace.table("timer:hrtimer_expire_entry")["function"]}
    assert callbacks
    for callback in callbacks:
        assert set(functions.lines_of(callback)) <= set(kept), f"{callback:#x}'s function is not kept"
    assert 0 < len(kept) < len(functions.lines) / 100


@pytest.fixture(scope="module")
def capture(tmp_path_factory) -> Path:
    """A short real tracefs capture of this host, through ticklab's own recorder."""
    from ticklab.capture.tracing import recorder

    where = tmp_path_factory.mktemp("kernelshark")  # mode 0700: HostChanges keeps its journal only there
    functions = [TRACED_FUNCTION] if has_function_tracer() else []
    size_before = (TRACEFS / "saved_cmdlines_size").read_text()
    with HostChanges(where / "journal.json", log=lambda _: None) as host:
        with recorder("tracefs", host, EVENTS, where / "trace", functions=functions):
            subprocess.run(["sh", "-c", WORKLOAD], check=True)
    assert (TRACEFS / "saved_cmdlines_size").read_text() == size_before, "the command-line cache's size is put back"
    return where / "trace"


@pytest.fixture(scope="module")
def reported(capture) -> list[dict]:
    return report(tracefs_to_trace_dat(capture, capture.parent / "trace.dat"))


@needs_a_capture
def test_the_converted_capture_names_the_task_of_almost_every_event(reported):
    assert len(reported) > 200, "the capture holds events enough to count"
    unnamed = [line for line in reported if line["comm"] == "<...>"]
    assert len(unnamed) <= 0.01 * len(reported), f"{len(unnamed)} of {len(reported)} events show <...> for their task"
    # idle's events are named whatever the file holds (pid 0 is <idle> to libtraceevent): the tasks' own must be too
    in_tasks = [line for line in reported if line["pid"] != "0"]
    assert len(in_tasks) > 100
    assert sum(line["comm"] == "<...>" for line in in_tasks) <= 0.01 * len(in_tasks)
    assert "sleep" in {line["comm"] for line in in_tasks}, "the workload's own tasks are named"


@needs_a_capture
def test_the_converted_capture_names_every_hrtimer_callback(reported):
    callbacks = [
        re.search(r"function=(\S+)", line["fields"]).group(1)
        for line in reported
        if line["event"] in ("hrtimer_start", "hrtimer_expire_entry")
    ]
    assert callbacks, "the capture holds hrtimer_start/hrtimer_expire_entry events"
    unresolved = sorted({c for c in callbacks if c.startswith("0x")})
    assert not unresolved, f"{len(unresolved)} callback addresses are not named: {unresolved[:5]}"
    names = {c.split("/")[0].split("+")[0] for c in callbacks}
    assert "hrtimer_wakeup" in names, f"the sleeps' own timers are named (found: {sorted(names)[:10]})"


@needs_a_capture
def test_the_converted_capture_names_the_function_tracers_ip_and_caller(capture, reported):
    if not (capture / "formats" / "ftrace" / "function").is_dir():
        pytest.skip(f"no function tracer able to trace {TRACED_FUNCTION} here")
    calls = [line["fields"] for line in reported if line["event"] == "function"]
    assert calls, f"the capture holds calls of {TRACED_FUNCTION}"
    hex_address = re.compile(r"\b0x[0-9a-f]{8,}\b|\b[0-9a-f]{16}\b")
    unresolved = [fields for fields in calls if hex_address.search(fields)]
    assert not unresolved, f"{len(unresolved)} of {len(calls)} calls show an address, not a name: {unresolved[:3]}"
    assert all(fields.startswith(TRACED_FUNCTION) for fields in calls)


@needs_a_capture
def test_the_names_are_kept_for_every_address_a_function_pointer_field_holds(capture):
    """What the capture keeps beside the trace covers every value of its %ps fields, read back by ticklab's own
    reader: the kallsyms lines of the function each lies in are kept."""
    trace = read_trace(capture)
    pointers = {
        int(v) for key in ("timer:hrtimer_start", "timer:hrtimer_expire_entry") for v in trace.table(key)["function"]
    }
    if (capture / "formats" / "ftrace" / "function").is_dir():
        calls = trace.table("ftrace:function")
        pointers |= {int(v) for v in calls["ip"]} | {int(v) for v in calls["parent_ip"]}
    assert pointers
    kept = set((capture / "kallsyms").read_text().splitlines())
    functions = KernelFunctions(Path("/proc/kallsyms").read_text())
    for pointer in pointers:
        assert functions.lines_of(pointer), f"{pointer:#x} lies in no function of /proc/kallsyms"
        assert set(functions.lines_of(pointer)) <= kept, (
            f"{pointer:#x} lies in {functions.lines_of(pointer)}, not kept in {capture / 'kallsyms'}"
        )


@needs_a_capture
def test_the_command_lines_and_symbols_are_read_when_stored_xzd(capture, reported, tmp_path):
    """A sealed bundle xz's the raw files of 64 KiB or more (BundleWriter.compress_raw): kallsyms and
    saved_cmdlines of a large capture among them; the converted file names the same tasks and functions."""
    packed = tmp_path / "trace"
    shutil.copytree(capture, packed)
    for name in ("kallsyms", "saved_cmdlines"):
        (packed / f"{name}.xz").write_bytes(lzma.compress((packed / name).read_bytes()))
        (packed / name).unlink()
    assert report(tracefs_to_trace_dat(packed, tmp_path / "trace.dat")) == reported
