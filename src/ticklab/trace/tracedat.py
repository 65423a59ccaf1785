"""Writing a tracefs capture (ticklab's backend where `trace-cmd record` fails) as a trace.dat v6 file, so that
tools that read only trace.dat (KernelShark, `trace-cmd report`) can open it.

The capture already holds everything a v6 file needs (trace-cmd.dat(5)): the ring buffer's header_page and
header_event descriptions, the format of every recorded event, and each CPU's raw ring-buffer pages as
trace_pipe_raw gave them. They are written unchanged, with what the capture kept beside them so that the tools
name what they show (ticklab.capture.tracing): ``saved_cmdlines``, the kernel's pid -> command cache, as the
file's command-line list (tasks' names instead of ``<...>``), and ``kallsyms``, the lines of the functions the
records point into, as its kallsyms (hrtimer callbacks' and the function tracer's names instead of addresses).
Either may be stored xz'd (a sealed bundle's files of 64 KiB or more are) or absent (captures before issue 41:
pids without names, only the experiment's named symbols). printk formats are left empty: no recorded event prints
through trace_printk.
"""

from __future__ import annotations

import struct
from pathlib import Path

from ..safefiles import OwnedDir, UnsafeFileError
from . import rawfile
from .rawfile import read_bytes

MAGIC = b"\x17\x08Dtracing"
PAGE_SIZE = 4096
FORMAT_LIMIT = 1 << 20  # a header or event format description: a few hundred bytes
KALLSYMS_LIMIT = 256 << 20  # all of /proc/kallsyms is ~5 MB; a capture keeps the few lines its trace needs
COMMAND_LINES_LIMIT = 16 << 20  # the kernel's cache: tens of thousands of "pid command" lines at most, ~1 MB


def _u32(value: int) -> bytes:
    return struct.pack("<I", value)


def _u64(value: int) -> bytes:
    return struct.pack("<Q", value)


def _raw_files(capture: Path) -> dict[int, Path]:
    found = {}
    for path in sorted(capture.glob("cpu*.raw*")):
        number = path.name[3:].split(".", 1)[0]
        if number.isdigit():
            found[int(number)] = path
    return found


def tracefs_to_trace_dat(capture: Path | str, out: Path | str) -> Path:
    """Write ``out`` (trace.dat v6) from a tracefs capture directory; raises ValueError naming what is missing."""
    capture, out = Path(capture), Path(out)
    header_page = capture / "header_page"
    raws = _raw_files(capture)
    if not header_page.is_file() or not raws:
        raise ValueError(f"{capture}: not a tracefs capture (needs header_page and cpuN.raw files)")
    page_text = _capture_file(header_page, FORMAT_LIMIT)
    event_text = _capture_file(capture / "header_event", FORMAT_LIMIT)
    head = MAGIC + b"6\0" + bytes([0, 8]) + _u32(PAGE_SIZE)
    head += b"header_page\0" + _u64(len(page_text)) + page_text
    head += b"header_event\0" + _u64(len(event_text)) + event_text
    head += _u32(0)  # ftrace's own event formats: none recorded
    systems = sorted(p for p in (capture / "formats").iterdir() if p.is_dir()) if (capture / "formats").is_dir() else []
    head += _u32(len(systems))
    for system in systems:
        formats = sorted(system.glob("*/format"))
        head += system.name.encode() + b"\0" + _u32(len(formats))
        for fmt in formats:
            text = _capture_file(fmt, FORMAT_LIMIT)
            head += _u64(len(text)) + text
    kallsyms = _capture_file(capture / "kallsyms", KALLSYMS_LIMIT)
    command_lines = _capture_file(capture / "saved_cmdlines", COMMAND_LINES_LIMIT)
    head += _u32(len(kallsyms)) + kallsyms + _u32(0) + _u64(len(command_lines)) + command_lines  # 0: printk formats
    cpus = max(raws) + 1
    head += _u32(cpus) + b"options  \0" + struct.pack("<H", 0) + b"flyrecord\0"
    data = {cpu: read_bytes(raws[cpu]) if cpu in raws else b"" for cpu in range(cpus)}
    offset = len(head) + 16 * cpus
    offset += -offset % PAGE_SIZE
    table, body = b"", b""
    for cpu in range(cpus):
        table += _u64(offset + len(body) if data[cpu] else 0) + _u64(len(data[cpu]))
        body += data[cpu]
    blob = head + table
    try:
        with OwnedDir(out.parent, create=False) as directory:
            directory.write_atomic(out.name, blob + b"\0" * (-len(blob) % PAGE_SIZE) + body)
    except UnsafeFileError as exc:
        raise ValueError(str(exc)) from None
    return out


def _capture_file(path: Path, limit: int) -> bytes:
    """A file of the capture (plain or .xz; never through a link, never a FIFO or device: ticklab.rawfile), or
    nothing where there is none."""
    if not rawfile.present(path):
        return b""
    try:
        return read_bytes(path, limit)
    except rawfile.RawFileError as exc:
        raise ValueError(str(exc)) from None
