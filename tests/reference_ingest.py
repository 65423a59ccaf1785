"""The trace reader as it was before the compiled walk (issue 15), kept unchanged as the reference that
tests/test_ingest_fast.py compares the fast reader with on every bundled trace.

Trace data -> columnar tables: one pandas DataFrame per event, with typed fields.

Two inputs carry the same ring-buffer pages:

* a ``trace.dat`` written by trace-cmd (file versions 6 and 7, uncompressed), and
* a directory written by ticklab's tracefs backend: ``header_page``, ``formats/<system>/<event>/format``
  and one ``cpu<N>.raw`` per CPU (pages read from ``per_cpu/cpu<N>/trace_pipe_raw``), ``cpu<N>.stats``.

The page walk follows the kernel's ring-buffer layout (include/linux/ring_buffer.h and the
``events/header_page`` / ``header_event`` files it exports): a page header (timestamp, commit),
then records with a 32-bit header of 5 bits type_len and 27 bits time delta. Each record's
offset is kept; fields are then gathered per event type with numpy, so only the page walk is a
Python loop. Lost events are counted from the pages' "missed events" flags and, where present,
from the per-CPU stats (overrun, dropped events).
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from ticklab.trace import rawfile
from ticklab.trace.tracefs_stats import stats_lost_count

TRACE_DAT_MAGIC = b"\x17\x08Dtracing"
MISSED_EVENTS = 1 << 31
MISSED_STORED = 1 << 30
COMMIT_MASK = (1 << 27) - 1
PADDING, TIME_EXTEND, TIME_STAMP = 29, 30, 31

# trace.dat option ids (trace-cmd.dat(5))
OPTION_DONE, OPTION_CPUSTAT, OPTION_BUFFER, OPTION_TRACECLOCK = 0, 2, 3, 4
OPTION_HEADER_INFO, OPTION_FTRACE_EVENTS, OPTION_EVENT_FORMATS, OPTION_CMDLINES = 16, 17, 18, 21


class TraceFormatError(ValueError):
    """Trace data this module cannot read; the message names the file and what is wrong."""


@dataclass
class Field:
    name: str
    type: str
    offset: int
    size: int
    signed: bool

    @property
    def dynamic(self) -> str | None:
        for kind in ("__data_loc", "__rel_loc"):
            if self.type.startswith(kind):
                return kind
        return None

    @property
    def char_array(self) -> bool:
        return re.fullmatch(r"(const\s+)?(unsigned\s+|signed\s+)?char", self.type) is not None and "[" in self.name_decl

    name_decl: str = ""


@dataclass
class EventFormat:
    system: str
    name: str
    id: int
    fields: list[Field]

    @property
    def key(self) -> str:
        return f"{self.system}:{self.name}"


FIELD_LINE = re.compile(
    r"field:(?P<decl>[^;]+);\s*offset:(?P<offset>\d+);\s*size:(?P<size>\d+);\s*signed:(?P<signed>-?\d+);"
)


def parse_event_format(text: str, system: str | None = None, source: str = "<format>") -> EventFormat:
    name = re.search(r"^name:\s*(\S+)", text, re.M)
    ident = re.search(r"^ID:\s*(\d+)", text, re.M)
    if not name or not ident:
        raise TraceFormatError(f"{source}: not an event format (no name/ID line)")
    fields = []
    for match in FIELD_LINE.finditer(text):
        declaration = match["decl"].strip()
        bare = re.sub(r"\[.*\]$", "", declaration).split()[-1]
        fields.append(
            Field(
                name=bare,
                type=declaration[: declaration.rfind(bare)].strip(),
                offset=int(match["offset"]),
                size=int(match["size"]),
                signed=match["signed"] == "1",
                name_decl=declaration,
            )
        )
    return EventFormat(system=system or "", name=name.group(1), id=int(ident.group(1)), fields=fields)


def parse_header_page(text: str, source: str) -> tuple[int, int]:
    """(size of the commit field, offset of the data) from events/header_page."""
    commit = re.search(r"local_t commit;\s*offset:(\d+);\s*size:(\d+);", text)
    data = re.search(r"char data;\s*offset:(\d+);", text)
    if not commit or not data:
        raise TraceFormatError(f"{source}: header_page lacks the commit or data field")
    return int(commit.group(2)), int(data.group(1))


@dataclass
class Trace:
    """What one trace holds: events per type, lost-event counts, where it came from."""

    source: str
    formats: dict[int, EventFormat]
    events: dict[str, pd.DataFrame] = field(default_factory=dict)
    lost_events: dict[int, int] = field(default_factory=dict)
    stats_lost: dict[int, int] = field(default_factory=dict)
    page_size: int = 4096
    clock: str | None = None

    @property
    def total_lost(self) -> int:
        """Events the kernel dropped: the larger of the page flags and the per-CPU stats."""
        return max(sum(self.lost_events.values()), sum(self.stats_lost.values()))

    def table(self, key: str) -> pd.DataFrame:
        """One event's table, e.g. table('timer:hrtimer_expire_entry'); clear error if absent."""
        if key not in self.events:
            if key in {f.key for f in self.formats.values()}:
                return _empty_table(next(f for f in self.formats.values() if f.key == key))
            raise KeyError(
                f"{self.source}: event {key} was not recorded (has: {', '.join(sorted(self.events)) or 'none'})"
            )
        return self.events[key]

    def counts(self) -> dict[str, int]:
        return {key: len(frame) for key, frame in sorted(self.events.items())}


def _empty_table(fmt: EventFormat) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "timestamp": pd.Series(dtype="uint64"),
            "cpu": pd.Series(dtype="uint16"),
            **{f.name: pd.Series(dtype="object") for f in fmt.fields if f.name != "common_type"},
        }
    )


def walk_pages(
    blob: bytes, base: int, cpu: int, page_size: int, commit_size: int, data_offset: int, source: str
) -> tuple[list[int], list[int], list[int], int]:
    """Record offsets (into ``blob`` + ``base``), timestamps and lengths of every data record; lost count."""
    offsets: list[int] = []
    stamps: list[int] = []
    lengths: list[int] = []
    lost = 0
    unpack_u32 = struct.Struct("<I").unpack_from
    commit_format = struct.Struct("<Q" if commit_size == 8 else "<I").unpack_from
    if len(blob) % page_size:
        raise TraceFormatError(
            f"{source}: CPU {cpu} data is {len(blob)} bytes, not a whole number of {page_size}-byte pages"
        )
    for page in range(0, len(blob), page_size):
        timestamp = struct.unpack_from("<Q", blob, page)[0]
        commit = commit_format(blob, page + 8)[0]
        size = commit & COMMIT_MASK
        position = page + data_offset
        end = position + size
        if end > page + page_size:
            raise TraceFormatError(f"{source}: CPU {cpu} page at byte {page} claims {size} bytes of data")
        if commit & MISSED_EVENTS:
            lost += commit_format(blob, end)[0] if commit & MISSED_STORED else 1
        while position < end:
            header = unpack_u32(blob, position)[0]
            type_len = header & 0x1F
            delta = header >> 5
            if type_len <= 28:
                timestamp += delta
                if type_len == 0:
                    length = unpack_u32(blob, position + 4)[0] - 4
                    data = position + 8
                else:
                    length = type_len << 2
                    data = position + 4
                offsets.append(base + data)
                stamps.append(timestamp)
                lengths.append(length)
                position = data + length
            elif type_len == TIME_EXTEND:
                timestamp += (unpack_u32(blob, position + 4)[0] << 27) + delta
                position += 8
            elif type_len == TIME_STAMP:
                timestamp = (unpack_u32(blob, position + 4)[0] << 27) + delta | (timestamp & ~((1 << 59) - 1))
                position += 8
            else:  # padding: a discarded record or the rest of the page
                if delta == 0:
                    break
                position += 4 + unpack_u32(blob, position + 4)[0]
    return offsets, stamps, lengths, lost


def _dtype(fmt: EventFormat, width: int) -> np.dtype:
    names, formats, offsets = [], [], []
    for f in fmt.fields:
        if f.offset + f.size > width:
            continue
        if f.char_array:
            kind = f"S{f.size}"
        elif f.dynamic:
            kind = "<u4"
        elif f.size in (1, 2, 4, 8) and "[" not in f.name_decl:
            kind = f"<{'i' if f.signed else 'u'}{f.size}"
        else:
            kind = f"V{f.size}"
        names.append(f.name)
        formats.append(kind)
        offsets.append(f.offset)
    return np.dtype({"names": names, "formats": formats, "offsets": offsets, "itemsize": width})


def _decode_dynamic(data: np.ndarray, starts: np.ndarray, locs: np.ndarray, f: Field) -> list[str]:
    values = []
    field_end = f.offset + f.size
    for start, loc in zip(starts.tolist(), locs.tolist(), strict=False):
        offset, length = loc & 0xFFFF, loc >> 16
        if f.dynamic == "__rel_loc":
            offset += field_end
        raw = data[start + offset : start + offset + length].tobytes()
        values.append(raw.split(b"\0", 1)[0].decode(errors="replace"))
    return values


def build_tables(
    data: np.ndarray,
    formats: dict[int, EventFormat],
    offsets: np.ndarray,
    stamps: np.ndarray,
    cpus: np.ndarray,
    lengths: np.ndarray,
    source: str,
) -> dict[str, pd.DataFrame]:
    """Gather each event type's records into a typed table, ordered by time."""
    order = np.argsort(stamps, kind="stable")
    offsets, stamps, cpus, lengths = offsets[order], stamps[order], cpus[order], lengths[order]
    padded = np.concatenate([data, np.zeros(4096, dtype=np.uint8)])  # gathers may read past the last record
    types = padded[offsets] | (padded[offsets + 1].astype(np.uint16) << 8)
    tables = {}
    for type_id in np.unique(types).tolist():
        fmt = formats.get(type_id)
        if fmt is None:
            raise TraceFormatError(f"{source}: records of event type {type_id}, which has no format in the trace")
        chosen = types == type_id
        starts = offsets[chosen]
        width = max(f.offset + f.size for f in fmt.fields)
        gathered = padded[starts[:, None] + np.arange(width)]
        records = np.ascontiguousarray(gathered).view(_dtype(fmt, width)).reshape(-1)
        columns: dict[str, object] = {"timestamp": stamps[chosen], "cpu": cpus[chosen]}
        for f in fmt.fields:
            if f.name == "common_type" or f.name not in records.dtype.names:
                continue
            column = records[f.name]
            if f.dynamic:
                columns[f.name] = _decode_dynamic(padded, starts, column, f)
            elif f.char_array:
                columns[f.name] = [v.split(b"\0", 1)[0].decode(errors="replace") for v in column.tolist()]
            elif column.dtype.kind == "V":
                columns[f.name] = [bytes(v) for v in column]
            else:
                columns[f.name] = column
        tables[fmt.key] = pd.DataFrame(columns)
    return tables


def _assemble(
    source: str,
    formats: dict[int, EventFormat],
    cpu_blobs: dict[int, bytes],
    page_size: int,
    header_page: str,
    stats_text: dict[int, str],
    clock: str | None,
) -> Trace:
    commit_size, data_offset = parse_header_page(header_page, source)
    all_offsets, all_stamps, all_cpus, all_lengths, lost = [], [], [], [], {}
    chunks, base = [], 0
    for cpu, blob in sorted(cpu_blobs.items()):
        offsets, stamps, lengths, missed = walk_pages(blob, base, cpu, page_size, commit_size, data_offset, source)
        all_offsets.extend(offsets)
        all_stamps.extend(stamps)
        all_lengths.extend(lengths)
        all_cpus.extend([cpu] * len(offsets))
        lost[cpu] = missed
        chunks.append(np.frombuffer(blob, dtype=np.uint8))
        base += len(blob)
    data = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.uint8)
    trace = Trace(
        source=source,
        formats=formats,
        lost_events=lost,
        page_size=page_size,
        clock=clock,
        stats_lost={cpu: stats_lost_count(text) for cpu, text in stats_text.items()},
    )
    if all_offsets:
        trace.events = build_tables(
            data,
            formats,
            np.asarray(all_offsets, dtype=np.int64),
            np.asarray(all_stamps, dtype=np.uint64),
            np.asarray(all_cpus, dtype=np.uint16),
            np.asarray(all_lengths, dtype=np.int64),
            source,
        )
    return trace


# -- ticklab's tracefs directory ---------------------------------------------------------------------
def read_tracefs_dir(directory: Path | str) -> Trace:
    directory = Path(directory)
    header = directory / "header_page"
    if not header.is_file():
        raise TraceFormatError(f"{header}: missing; {directory} is not a ticklab tracefs capture")
    formats = {}
    for path in sorted((directory / "formats").glob("*/*/format")):
        fmt = parse_event_format(path.read_text(), system=path.parent.parent.name, source=str(path))
        formats[fmt.id] = fmt
    blobs = {
        int(p.name.split(".")[0][3:]): _read_bytes(p)
        for p in [*directory.glob("cpu*.raw"), *directory.glob("cpu*.raw.xz")]
    }
    stats = {int(p.stem[3:]): p.read_text() for p in directory.glob("cpu*.stats")}
    clock_file = directory / "trace_clock"
    clock = re.search(r"\[(\w+)\]", clock_file.read_text()).group(1) if clock_file.is_file() else None
    page_size = int((directory / "page_size").read_text()) if (directory / "page_size").is_file() else 4096
    return _assemble(str(directory), formats, blobs, page_size, header.read_text(), stats, clock)


# -- trace-cmd's trace.dat ---------------------------------------------------------------------------
class _Reader:
    def __init__(self, data: bytes, source: str, position: int = 0):
        self.data, self.source, self.position = data, source, position

    def take(self, size: int) -> bytes:
        if self.position + size > len(self.data):
            raise TraceFormatError(f"{self.source}: truncated at byte {self.position} (wanted {size} more bytes)")
        chunk = self.data[self.position : self.position + size]
        self.position += size
        return chunk

    def u16(self) -> int:
        return struct.unpack("<H", self.take(2))[0]

    def u32(self) -> int:
        return struct.unpack("<I", self.take(4))[0]

    def u64(self) -> int:
        return struct.unpack("<Q", self.take(8))[0]

    def string(self) -> str:
        end = self.data.index(b"\0", self.position)
        text = self.data[self.position : end].decode()
        self.position = end + 1
        return text


def _read_header_info(reader: _Reader) -> str:
    if reader.take(12) != b"header_page\0":
        raise TraceFormatError(f"{reader.source}: expected header_page at byte {reader.position - 12}")
    header_page = reader.take(reader.u64()).decode()
    if reader.take(13) != b"header_event\0":
        raise TraceFormatError(f"{reader.source}: expected header_event at byte {reader.position - 13}")
    reader.take(reader.u64())
    return header_page


def _read_ftrace_formats(reader: _Reader, formats: dict[int, EventFormat]) -> None:
    for _ in range(reader.u32()):
        fmt = parse_event_format(reader.take(reader.u64()).decode(), "ftrace", reader.source)
        formats[fmt.id] = fmt


def _read_event_formats(reader: _Reader, formats: dict[int, EventFormat]) -> None:
    for _ in range(reader.u32()):
        system = reader.string()
        for _ in range(reader.u32()):
            fmt = parse_event_format(reader.take(reader.u64()).decode(), system, reader.source)
            formats[fmt.id] = fmt


def _read_bytes(path: Path) -> bytes:
    """A file's bytes, decompressing it when it is an .xz (bundles keep most raw traces xz'd)."""
    try:
        return rawfile.read_bytes(path)
    except rawfile.RawFileError as exc:
        raise TraceFormatError(str(exc)) from exc


def read_trace_dat(path: Path | str) -> Trace:
    path = Path(path)
    data = _read_bytes(path)
    source = str(path)
    if not data.startswith(TRACE_DAT_MAGIC):
        raise TraceFormatError(f"{source}: not a trace-cmd trace.dat (bad magic)")
    reader = _Reader(data, source, len(TRACE_DAT_MAGIC))
    version = reader.string()
    endian, long_size = reader.take(1)[0], reader.take(1)[0]
    if endian != 0:
        raise TraceFormatError(f"{source}: big-endian trace data is not supported")
    page_size = reader.u32()
    formats: dict[int, EventFormat] = {}
    if version == "6":
        return _read_v6(reader, formats, page_size, source)
    if version == "7":
        return _read_v7(reader, formats, page_size, source, long_size)
    raise TraceFormatError(f"{source}: trace.dat version {version!r}; ticklab reads versions 6 and 7")


def _read_v6(reader: _Reader, formats: dict, page_size: int, source: str) -> Trace:
    header_page = _read_header_info(reader)
    _read_ftrace_formats(reader, formats)
    _read_event_formats(reader, formats)
    reader.take(reader.u32())  # kallsyms
    reader.take(reader.u32())  # printk formats
    reader.take(reader.u64())  # saved cmdlines
    cpus = reader.u32()
    stats, clock = {}, None
    marker = reader.take(10)
    if marker == b"options  \0":
        while (option := reader.u16()) != OPTION_DONE:
            payload = reader.take(reader.u32())
            if option == OPTION_CPUSTAT:
                text = payload.rstrip(b"\0").decode()
                stats[_cpu_of_stats(text, len(stats))] = text
            elif option == OPTION_TRACECLOCK:
                clock = _clock_of(payload)
        marker = reader.take(10)
    if marker != b"flyrecord\0":
        raise TraceFormatError(
            f"{source}: expected flyrecord data, found {marker!r} (latency traces are not supported)"
        )
    blobs = {}
    for cpu in range(cpus):
        offset, size = reader.u64(), reader.u64()
        blobs[cpu] = reader.data[offset : offset + size]
    return _assemble(source, formats, blobs, page_size, header_page, stats, clock)


def _read_v7(reader: _Reader, formats: dict, page_size: int, source: str, long_size: int) -> Trace:
    compression = reader.string()
    reader.string()  # compression version
    if compression != "none":
        raise TraceFormatError(
            f"{source}: compressed with {compression}; record with --file-version 6 or no compression"
        )
    next_options = reader.u64()
    header_page, stats, clock, blobs = None, {}, None, {}

    def section(offset: int) -> _Reader:
        """A reader placed after the header of the section at ``offset``."""
        opened = _Reader(reader.data, source, offset)
        opened.u16()  # section id
        if opened.u16() & 1:
            raise TraceFormatError(f"{source}: compressed section at byte {offset}")
        opened.u32()  # description string id
        opened.u64()  # size
        return opened

    while next_options:
        options = section(next_options)
        next_options = 0
        while True:
            option, size = options.u16(), options.u32()
            payload = options.take(size)
            value = _Reader(payload, source)
            if option == OPTION_DONE:
                next_options = value.u64()
                break
            if option == OPTION_HEADER_INFO:
                header_page = _read_header_info(section(value.u64()))
            elif option == OPTION_FTRACE_EVENTS:
                _read_ftrace_formats(section(value.u64()), formats)
            elif option == OPTION_EVENT_FORMATS:
                _read_event_formats(section(value.u64()), formats)
            elif option == OPTION_CPUSTAT:
                text = payload.rstrip(b"\0").decode()
                stats[_cpu_of_stats(text, len(stats))] = text
            elif option == OPTION_BUFFER:
                value.u64()  # the flyrecord section itself; CPU data offsets follow
                instance = value.string()
                buffer_clock = value.string()
                if instance == "":
                    clock = buffer_clock
                    remaining = len(payload) - value.position
                    if (
                        remaining >= 8
                        and remaining - 8 == 20 * struct.unpack_from("<I", payload, value.position + 4)[0]
                    ):
                        page_size = value.u32()  # newer trace-cmd records the sub-buffer size here
                    for _ in range(value.u32()):
                        cpu, offset, size = value.u32(), value.u64(), value.u64()
                        blobs[cpu] = reader.data[offset : offset + size]
    if header_page is None:
        raise TraceFormatError(f"{source}: no HEADER_INFO section")
    return _assemble(source, formats, blobs, page_size, header_page, stats, clock)


def _cpu_of_stats(text: str, fallback: int) -> int:
    found = re.search(r"^cpu:\s*(\d+)", text, re.M | re.I)
    return int(found.group(1)) if found else fallback


def _clock_of(payload: bytes) -> str | None:
    found = re.search(rb"\[(\w+)\]", payload)
    return found.group(1).decode() if found else None


def read_trace(path: Path | str) -> Trace:
    """A trace.dat file (or trace.dat.xz) or a ticklab tracefs capture directory (cpuN.raw or cpuN.raw.xz)."""
    path = Path(path)
    if path.is_dir():
        for name in ("trace.dat", "trace.dat.xz"):
            if (path / name).is_file():
                return read_trace_dat(path / name)
        return read_tracefs_dir(path)
    if not path.exists():
        raise TraceFormatError(f"{path}: no such trace file or directory")
    return read_trace_dat(path)


def write_tables(trace: Trace, out_dir: Path | str) -> list[Path]:
    """One Parquet file per event (``<system>__<event>.parquet``)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for key, frame in sorted(trace.events.items()):
        target = out_dir / (key.replace(":", "__") + ".parquet")
        frame.to_parquet(target, index=False)
        written.append(target)
    return written
