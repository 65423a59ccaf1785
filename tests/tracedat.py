"""Small trace files built from known records, laid out as trace-cmd.dat(5) v6 and v7 describe them
(v7 uncompressed or with zstd/zlib sections and chunked CPU data), and as ticklab's tracefs captures.
Used by the reader's property tests; every field written here is read back and compared."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

from test_ingest import FORMAT, HEADER_PAGE, page, payload, record

MAGIC = b"\x17\x08Dtracing"
PAGE = 4096
HEADER_EVENT = "# compressed entry header\n\ttype_len    :    5 bits\n\ttime_delta  :   27 bits\n"


def pages_for(events: list[tuple[int, int, str, int, str]], start: int = 1000) -> bytes:
    """(delta, pid, comm, value, name) records packed into as many 4 KiB pages as they need."""
    out, body, stamp, first = b"", b"", start, start
    for delta, pid, comm, value, name in events:
        one = record(delta, payload(pid, comm, value, name))
        if len(body) + len(one) > PAGE - 16:
            out += page(first, body)
            body, first = b"", stamp
        body += one
        stamp += delta
    return out + (page(first, body) if body else b"")


def stats_text(cpu: int, read: int) -> str:
    return (
        f"CPU: {cpu}\nentries: 0\noverrun: 0\ncommit overrun: 0\nbytes: 0\noldest event ts: 0.0\n"
        f"now ts: 0.0\ndropped events: 0\nread events: {read}\n"
    )


def _u16(v):
    return struct.pack("<H", v)


def _u32(v):
    return struct.pack("<I", v)


def _u64(v):
    return struct.pack("<Q", v)


def _header_info() -> bytes:
    return (
        b"header_page\0"
        + _u64(len(HEADER_PAGE))
        + HEADER_PAGE.encode()
        + b"header_event\0"
        + _u64(len(HEADER_EVENT))
        + HEADER_EVENT.encode()
    )


def _event_formats() -> bytes:
    return _u32(1) + b"fake\0" + _u32(1) + _u64(len(FORMAT)) + FORMAT.encode()


def _align(blob: bytes) -> bytes:
    return blob + b"\0" * (-len(blob) % PAGE)


def write_v6(path: Path, cpu_pages: dict[int, bytes], stats: dict[int, str] | None = None) -> Path:
    head = MAGIC + b"6\0" + bytes([0, 8]) + _u32(PAGE) + _header_info() + _u32(0) + _event_formats()
    head += _u32(0) + _u32(0) + _u64(0) + _u32(len(cpu_pages))
    head += b"options  \0"
    for _cpu, text in sorted((stats or {}).items()):
        head += _u16(2) + _u32(len(text) + 1) + text.encode() + b"\0"
    head += _u16(0) + b"flyrecord\0"
    table_size = 16 * len(cpu_pages)
    offset = len(head) + table_size
    offset += -offset % PAGE
    table, data = b"", b""
    for _cpu, blob in sorted(cpu_pages.items()):
        table += _u64(offset + len(data)) + _u64(len(blob))
        data += blob
    path.write_bytes(_align(head + table) + data)
    return path


def _compress(name: str, blob: bytes) -> bytes:
    if name == "zstd":
        import zstandard

        return zstandard.ZstdCompressor().compress(blob)
    return zlib.compress(blob, 9)


def write_v7(
    path: Path,
    cpu_pages: dict[int, bytes],
    compression: str = "none",
    stats: dict[int, str] | None = None,
    chunk_pages: int = 2,
) -> Path:
    """header, HEADER_INFO and EVENT_FORMATS sections, the flyrecord section with each CPU's data, then the
    options section (it points at all of them); compressed files compress sections and CPU data in chunks."""
    packed = compression != "none"
    out = bytearray(
        MAGIC + b"7\0" + bytes([0, 8]) + _u32(PAGE) + compression.encode() + b"\0" + (b"1.0" if packed else b"") + b"\0"
    )
    first_options_at = len(out)
    out += _u64(0)

    def section(section_id: int, body: bytes) -> int:
        at = len(out)
        content = (
            _u32(len(_compress(compression, body))) + _u32(len(body)) + _compress(compression, body) if packed else body
        )
        out.extend(_u16(section_id) + _u16(1 if packed else 0) + _u32(0) + _u64(len(content)) + content)
        return at

    header_at = section(16, _header_info())
    formats_at = section(18, _event_formats())
    flyrecord_at = len(out)
    out += _u16(3) + _u16(1 if packed else 0) + _u32(0) + _u64(0)
    cpus = []
    for cpu, blob in sorted(cpu_pages.items()):
        out.extend(b"\0" * (-len(out) % PAGE))
        at = len(out)
        if packed:  # the count, then the chunks; the stated size is the chunks' alone, as trace-cmd writes it
            chunks = [blob[i : i + chunk_pages * PAGE] for i in range(0, len(blob), chunk_pages * PAGE)]
            data = b"".join(
                _u32(len(_compress(compression, c))) + _u32(len(c)) + _compress(compression, c) for c in chunks
            )
            out += _u32(len(chunks))
        else:
            data = blob
        out += data
        cpus.append((cpu, at, len(data)))
    options = _u16(16) + _u32(8) + _u64(header_at) + _u16(18) + _u32(8) + _u64(formats_at)
    for _cpu, text in sorted((stats or {}).items()):
        options += _u16(2) + _u32(len(text) + 1) + text.encode() + b"\0"
    buffer = _u64(flyrecord_at) + b"\0" + b"local\0" + _u32(PAGE) + _u32(len(cpus))
    buffer += b"".join(_u32(cpu) + _u64(at) + _u64(size) for cpu, at, size in cpus)
    options += _u16(3) + _u32(len(buffer)) + buffer + _u16(0) + _u32(8) + _u64(0)
    options_at = len(out)
    out += _u16(0) + _u16(0) + _u32(0) + _u64(len(options)) + options  # the first options section is never compressed
    out[first_options_at : first_options_at + 8] = _u64(options_at)
    path.write_bytes(bytes(out))
    return path


def write_tracefs(directory: Path, cpu_pages: dict[int, bytes], stats: dict[int, str] | None = None) -> Path:
    (directory / "formats" / "fake" / "fake_event").mkdir(parents=True, exist_ok=True)
    (directory / "formats" / "fake" / "fake_event" / "format").write_text(FORMAT)
    (directory / "header_page").write_text(HEADER_PAGE)
    for cpu, blob in cpu_pages.items():
        (directory / f"cpu{cpu}.raw").write_bytes(blob)
    for cpu, text in (stats or {}).items():
        (directory / f"cpu{cpu}.stats").write_text(text)
    return directory
