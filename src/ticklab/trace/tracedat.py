"""Writing a tracefs capture (ticklab's backend where `trace-cmd record` fails) as a trace.dat v6 file, so that
tools that read only trace.dat (KernelShark, `trace-cmd report`) can open it.

The capture already holds everything a v6 file needs (trace-cmd.dat(5)): the ring buffer's header_page and
header_event descriptions, the format of every recorded event, and each CPU's raw ring-buffer pages as
trace_pipe_raw gave them. They are written unchanged, with the few kallsyms lines the capture recorded (the
symbols its experiment named); printk formats and the command-line list are left empty (the capture did not
record them), so tools show pids without names.
"""

from __future__ import annotations

import struct
from pathlib import Path

from .rawfile import read_bytes

MAGIC = b"\x17\x08Dtracing"
PAGE_SIZE = 4096


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
    header_event = capture / "header_event"
    event_text = header_event.read_bytes() if header_event.is_file() else b""
    head = MAGIC + b"6\0" + bytes([0, 8]) + _u32(PAGE_SIZE)
    head += b"header_page\0" + _u64(header_page.stat().st_size) + header_page.read_bytes()
    head += b"header_event\0" + _u64(len(event_text)) + event_text
    head += _u32(0)  # ftrace's own event formats: none recorded
    systems = sorted(p for p in (capture / "formats").iterdir() if p.is_dir()) if (capture / "formats").is_dir() else []
    head += _u32(len(systems))
    for system in systems:
        formats = sorted(system.glob("*/format"))
        head += system.name.encode() + b"\0" + _u32(len(formats))
        for fmt in formats:
            text = fmt.read_bytes()
            head += _u64(len(text)) + text
    # the kallsyms lines recorded beside the capture (the tick's callback), so trace-cmd report names them
    kallsyms = read_bytes(capture / "kallsyms") if (capture / "kallsyms").is_file() else b""
    head += _u32(len(kallsyms)) + kallsyms + _u32(0) + _u64(0)  # printk formats, saved command lines: not recorded
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
    out.write_bytes(blob + b"\0" * (-len(blob) % PAGE_SIZE) + body)
    return out
