"""Trace data -> columnar tables: one Arrow table (and, on request, pandas DataFrame) per event, typed fields.

Two inputs carry the same ring-buffer pages:

* a ``trace.dat`` written by trace-cmd (file versions 6 and 7; version 7 uncompressed or compressed
  with zstd or zlib, the compressions trace-cmd writes), and
* a directory written by ticklab's tracefs backend: ``header_page``, ``formats/<system>/<event>/format``
  and one ``cpu<N>.raw`` per CPU (pages read from ``per_cpu/cpu<N>/trace_pipe_raw``), ``cpu<N>.stats``.

The page walk follows the kernel's ring-buffer layout (include/linux/ring_buffer.h and the
``events/header_page`` / ``header_event`` files it exports) and is compiled (ticklab.trace.ringbuf); it
keeps only each record's offset, timestamp and event type (14 bytes a record; the CPU follows from where
each CPU's records start). Tables are gathered per event type from those offsets, in batches, straight into
Arrow arrays; an uncompressed trace.dat is mapped, not read, and its pages are released as the walk and
the gathers go (a rare event's records a few at a time: each page fault maps the 64 KiB around it). A
trace.dat's kallsyms (MBs) is checked while reading and copied out only when asked for.
Lost events are counted from the pages' "missed events" flags and, where present, from the
per-CPU stats (overrun, dropped events).

Bad input of any kind raises :class:`TraceFormatError` with one line naming the file (and the byte
offset where it applies); nothing else escapes :func:`read_trace` and the table accessors.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import mmap
import os
import re
import struct
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..safefiles import OwnedDir, UnsafeFileError, open_fd, shown
from . import rawfile, ringbuf
from .ringbuf import COMMIT_MASK, MISSED_EVENTS, MISSED_STORED  # noqa: F401  (re-exported: tests build pages)
from .tracefs_stats import stats_lost_count

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

TRACE_DAT_MAGIC = b"\x17\x08Dtracing"

# trace.dat option ids (trace-cmd.dat(5))
OPTION_DONE, OPTION_CPUSTAT, OPTION_BUFFER, OPTION_TRACECLOCK = 0, 2, 3, 4
OPTION_HEADER_INFO, OPTION_FTRACE_EVENTS, OPTION_EVENT_FORMATS, OPTION_KALLSYMS, OPTION_CMDLINES = 16, 17, 18, 19, 21
SECTION_COMPRESSED = 1
# A page fault in a mapped file maps more than its page where the file is cached, as a trace just written or read is:
# the 64 KiB around it (the kernel's fault-around), or the whole large folio it is in, up to 2 MiB (a trace.dat
# Python wrote mapped 2 MiB a byte read). A rare event's records lie each in a region of its own, so they are gathered
# in pieces that enter at most RELEASE_REGIONS new 2 MiB regions, the trace's memory released after each.
FAULT_REGION_SHIFT = 21
RELEASE_REGIONS = 2
WALK_BYTES = 8 << 20  # pages walked between releases of a mapped trace's memory
# CPU data unpacked or copied beyond this goes to an unlinked temporary file, mapped and released as it is read like
# an uncompressed trace.dat (see _Spool): page cache the kernel can reclaim, not memory the process holds (a 668,627-
# event zstd trace.dat held 133 MB at 64 MiB, 102 MB at 16)
IN_MEMORY = 16 << 20
# All of one trace's CPU data (issue 40): a tracefs capture's cpuN.raw files, plain or unpacked, a trace.dat's CPU
# data, decompressed or not, or a trace.dat.xz unpacked, is at most TRACE_DATA_LIMIT bytes, and what is compressed
# decompresses to at most rawfile.UNPACK_RATIO times the compressed file's size. The largest bundled capture holds
# 15 MB a CPU; beyond the limit a trace is refused in one line before it is unpacked further or walked.
TRACE_DATA_LIMIT = 2 << 30
MAX_BLOCK = 1 << 28  # one compressed section or chunk; trace-cmd's are a few pages (data) or MiB (kallsyms)
# rows gathered at a time: bounds the memory a table build needs beyond the tables themselves
BATCH_ROWS = 1 << 16
# rows gathered at a time, and a row group, writing a table (write_tables): the table is never held, so its batch is
# what it costs (65,536 kept ~10 MB more resident writing a 600,000-event trace; an Arrow table built whole runs
# faster in the larger batches)
WRITE_BATCH_ROWS = 1 << 14
# rows written between asking the allocator to give back what it freed (malloc_trim: it walks the heap, so once a
# batch took a quarter more CPU time)
RELEASE_ROWS = 1 << 16


class TraceFormatError(ValueError):
    """Trace data this module cannot read; the message names the file and what is wrong."""


# What malformed bytes make Python, numpy, zstd and Arrow raise while reading: all become TraceFormatError.
_BAD_INPUT = (
    ValueError,
    UnicodeDecodeError,
    struct.error,
    OverflowError,
    MemoryError,
    OSError,
    AttributeError,
    IndexError,
    KeyError,
    TypeError,
    RecursionError,
    EOFError,
    zlib.error,
)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _guarded(source_of):
    """Run the wrapped reader; anything bad input makes it raise becomes one TraceFormatError line."""

    def wrap(function):
        @functools.wraps(function)
        def guarded(*args, **kwargs):
            try:
                return function(*args, **kwargs)
            except TraceFormatError:
                raise
            except _BAD_INPUT as exc:
                raise TraceFormatError(f"{source_of(*args)}: unreadable trace data ({_one_line(exc)})") from exc
            except Exception as exc:  # zstandard.ZstdError, pyarrow.ArrowInvalid: not importable up front
                if type(exc).__module__.split(".")[0] in ("zstandard", "pyarrow"):
                    raise TraceFormatError(f"{source_of(*args)}: unreadable trace data ({_one_line(exc)})") from exc
                raise

        return guarded

    return wrap


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
ID_LINE = re.compile(r"^ID:\s*(\d+)", re.M)


MAX_NAME_CHARS = 256  # an event or system name: a C identifier in the kernel, never this long


def _escaped(name: str, what: str, source: str) -> str:
    """An event or system name as ticklab shows it everywhere (counts, table names, errors): control and bidi
    characters escaped (``shown``), so a name from the input cannot rewrite the terminal line it is printed on; the
    same text for every kernel name."""
    if len(name) > MAX_NAME_CHARS:
        raise TraceFormatError(
            f"{source}: {what} name of {len(name)} characters ({shown(name, 40)}): not a kernel event name"
        )
    return shown(name, MAX_NAME_CHARS)


def parse_event_format(text: str, system: str | None = None, source: str = "<format>") -> EventFormat:
    name = re.search(r"^name:\s*(\S+)", text, re.M)
    ident = ID_LINE.search(text)
    if not name or not ident:
        raise TraceFormatError(f"{source}: not an event format (no name/ID line)")
    fields = []
    for match in FIELD_LINE.finditer(text):
        declaration = match["decl"].strip()
        words = re.sub(r"\[.*\]$", "", declaration).split()
        if not words:
            raise TraceFormatError(f"{source}: event {shown(name.group(1), 80)} has a field with no name")
        bare = words[-1]
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
    return EventFormat(
        system=_escaped(system or "", "system", source),
        name=_escaped(name.group(1), "event", source),
        id=int(ident.group(1)),
        fields=fields,
    )


class EventFormats(Mapping):
    """Event formats by id, each parsed on first use (a trace-cmd restore file carries ~2,300; a trace uses few)."""

    def __init__(self) -> None:
        self._texts: dict[int, tuple[str | Callable[[], str], str, str]] = {}
        self._parsed: dict[int, EventFormat] = {}

    def add_text(self, text: str, system: str, source: str, again: Callable[[], str] | None = None) -> None:
        """One format's text; ``again`` reads it again when it is parsed, so the text is not kept (a trace.dat's
        ~2,300 formats are ~2 MB of text, of which a trace uses a few)."""
        ident = ID_LINE.search(text)
        if not ident:
            raise TraceFormatError(f"{source}: not an event format (no name/ID line)")
        self._texts[int(ident.group(1))] = (again or text, system, source)
        self._parsed.pop(int(ident.group(1)), None)

    def __getitem__(self, type_id: int) -> EventFormat:
        if type_id not in self._parsed:
            text, system, source = self._texts[type_id]
            self._parsed[type_id] = parse_event_format(text() if callable(text) else text, system, source)
        return self._parsed[type_id]

    def __iter__(self) -> Iterator[int]:
        return iter(self._texts)

    def __len__(self) -> int:
        return len(self._texts)


def parse_header_page(text: str, source: str) -> tuple[int, int]:
    """(size of the commit field, offset of the data) from events/header_page."""
    commit = re.search(r"local_t commit;\s*offset:(\d+);\s*size:(\d+);", text)
    data = re.search(r"char data;\s*offset:(\d+);", text)
    if not commit or not data:
        raise TraceFormatError(f"{source}: header_page lacks the commit or data field")
    commit_size, data_offset = int(commit.group(2)), int(data.group(1))
    if commit_size not in (4, 8) or not 12 <= data_offset <= 64:
        raise TraceFormatError(
            f"{source}: header_page has a {commit_size}-byte commit and data at {data_offset}: "
            "not a ring-buffer page layout"
        )
    return commit_size, data_offset


@dataclass
class _Records:
    """Every data record of a trace, CPU by CPU in ring-buffer order: where its payload is in ``buffer``, its time
    and event type; the records of ``cpu_numbers[i]`` start at index ``cpu_firsts[i]``. Tables put one event's records
    in time order (a stable sort: ties stay in CPU order). 14 bytes a record where the buffer is under 4 GiB (4-byte
    offsets), 18 beyond: what a read trace holds until its tables are built."""

    buffer: object  # bytes, bytearray or mmap: the pages the offsets point into
    offsets: np.ndarray  # uint32, or int64 for a buffer of 4 GiB or more
    stamps: np.ndarray
    types: np.ndarray
    cpu_numbers: np.ndarray
    cpu_firsts: np.ndarray
    page_size: int = 4096

    def cpus(self, indices: np.ndarray) -> np.ndarray:
        """The CPU of each record at ``indices`` (a CPU without records has the same first index as the next one:
        the last CPU starting at or before an index is the one it belongs to)."""
        firsts = self.cpu_firsts.astype(indices.dtype)  # one type: numpy would convert every index to the other
        return self.cpu_numbers[np.searchsorted(firsts, indices, side="right") - 1]


def _empty_records() -> _Records:
    return _Records(
        b"",
        np.zeros(0, np.uint32),
        np.zeros(0, np.uint64),
        np.zeros(0, np.uint16),
        np.zeros(0, np.uint16),
        np.zeros(0, np.int64),
    )


def _offset_type(buffer) -> np.dtype:
    return np.dtype(np.uint32 if len(buffer) <= np.iinfo(np.uint32).max else np.int64)


def _kallsyms_line(kallsyms: bytes, name: bytes) -> re.Match | None:
    """The first kallsyms line "<hex address> <type> <name>[\t<module>]" for ``name``: each place the name occurs is
    checked as a whole line (a multiline pattern over a trace.dat's several MB of kallsyms took ~10 ms a name)."""
    line_pattern = re.compile(rb"([0-9a-fA-F]+) \w " + re.escape(name) + rb"(?:\t[^\n]*)?")
    at = kallsyms.find(b" " + name)
    while at >= 0:
        start = kallsyms.rfind(b"\n", 0, at) + 1
        end = kallsyms.find(b"\n", at)
        match = line_pattern.fullmatch(kallsyms, start, len(kallsyms) if end < 0 else end)
        if match:
            return match
        at = kallsyms.find(b" " + name, at + 1)
    return None


class Trace:
    """What one trace holds: events per type, lost-event counts, where it came from.

    Tables are built on first use: ``arrow(key)`` / ``arrow_tables()`` give Arrow tables,
    ``table(key)`` / ``events`` pandas DataFrames (converted from the Arrow tables once).
    """

    def __init__(
        self,
        source: str,
        formats: Mapping[int, EventFormat],
        records: _Records | None = None,
        lost_events: dict[int, int] | None = None,
        stats_lost: dict[int, int] | None = None,
        page_size: int = 4096,
        clock: str | None = None,
        kallsyms: bytes | Callable[[], bytes] = b"",
    ):
        self.source, self.formats, self.page_size, self.clock = source, formats, page_size, clock
        self._kallsyms = kallsyms
        self.lost_events = lost_events or {}
        self.stats_lost = stats_lost or {}
        self._records = records if records is not None else _empty_records()
        per_type = np.bincount(self._records.types, minlength=1)
        self._type_ids = np.flatnonzero(per_type)
        self._type_counts = per_type[self._type_ids]
        missing = [t for t in self._type_ids.tolist() if t not in formats]
        if missing:
            raise TraceFormatError(f"{source}: records of event type {missing[0]}, which has no format in the trace")
        keys: dict[str, int] = {}
        for type_id in self._type_ids.tolist():  # one table per name: two types of one name would merge or be lost
            key = formats[type_id].key
            if key in keys:
                raise TraceFormatError(f"{source}: event {key} has records of two types, {keys[key]} and {type_id}")
            keys[key] = type_id
        self._arrow: dict[str, pa.Table] = {}
        self._frames: dict[str, pd.DataFrame] | None = None

    @property
    def kallsyms(self) -> bytes:
        """/proc/kallsyms lines as recorded: all of them (trace-cmd), or the few a tracefs capture asked for. A
        trace.dat's (MBs, which ingest never reads) is checked when the trace is read and copied out of the file
        when first asked for."""
        if callable(self._kallsyms):
            self._kallsyms = self._kallsyms()
        return self._kallsyms

    @property
    def total_lost(self) -> int:
        """Events the kernel dropped: the larger of the page flags and the per-CPU stats."""
        return max(sum(self.lost_events.values()), sum(self.stats_lost.values()))

    def symbol_addresses(self, names) -> dict[str, int]:
        """Kernel addresses of the named symbols, from the kallsyms the trace carries (a name it lacks is left out;
        an address of 0, what /proc/kallsyms shows to a reader without the privilege, counts as lacking)."""
        found = {}
        for name in names:
            match = _kallsyms_line(self.kallsyms, name.encode())
            if match and int(match.group(1), 16):
                found[name] = int(match.group(1), 16)
        return found

    def keys(self) -> list[str]:
        """The recorded events, in event-type id order."""
        return [self.formats[t].key for t in self._type_ids.tolist()]

    def counts(self) -> dict[str, int]:
        return dict(
            sorted(
                (self.formats[t].key, n)
                for t, n in zip(self._type_ids.tolist(), self._type_counts.tolist(), strict=True)
            )
        )

    def _format_of(self, key: str) -> EventFormat:
        for type_id in self._type_ids.tolist():
            if self.formats[type_id].key == key:
                return self.formats[type_id]
        raise KeyError(key)

    def batches(self, key: str, rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
        """One recorded event's rows, ``rows`` at a time, as Arrow record batches (bounded memory)."""
        fmt = self._format_of(key)
        chosen = np.flatnonzero(self._records.types == fmt.id)
        if len(self._records.types) <= np.iinfo(np.uint32).max:  # half the memory of the 8-byte indices
            chosen = chosen.astype(np.uint32)
        order = np.argsort(self._records.stamps[chosen], kind="stable")
        chosen = chosen[order]
        del order
        for start in range(0, len(chosen), rows):
            batch = self._batch(fmt, chosen[start : start + rows])
            _release(self._records.buffer)
            yield batch

    def _batch(self, fmt: EventFormat, chosen: np.ndarray) -> pa.RecordBatch:
        try:
            return _guarded(lambda *_: self.source)(_gather_batch)(self._records, fmt, chosen)
        except TraceFormatError as exc:
            if str(exc).startswith(self.source):
                raise
            raise TraceFormatError(f"{self.source}: {exc}") from exc

    def arrow(self, key: str) -> pa.Table:
        """One recorded event's table as Arrow (KeyError if it was not recorded)."""
        if key not in self._arrow:
            import pyarrow as pa

            self._arrow[key] = pa.Table.from_batches(list(self.batches(key)))
        return self._arrow[key]

    def arrow_tables(self) -> dict[str, pa.Table]:
        return {key: self.arrow(key) for key in self.keys()}

    @property
    def events(self) -> dict[str, pd.DataFrame]:
        """Every recorded event's table as a pandas DataFrame."""
        if self._frames is None:
            self._frames = {key: self.arrow(key).to_pandas() for key in self.keys()}
        return self._frames

    def table(self, key: str) -> pd.DataFrame:
        """One event's table, e.g. table('timer:hrtimer_expire_entry'); clear error if absent."""
        if key not in self.keys():
            known = [self.formats[t] for t in self.formats if _format_key(self.formats, t) == key]
            if known:
                return _empty_table(known[0])
            raise KeyError(
                f"{self.source}: event {key} was not recorded (has: {', '.join(sorted(self.keys())) or 'none'})"
            )
        return self.events[key]


def _format_key(formats: Mapping[int, EventFormat], type_id: int) -> str | None:
    try:
        return formats[type_id].key
    except TraceFormatError:
        return None


def _empty_table(fmt: EventFormat) -> pd.DataFrame:
    import pandas as pd

    return pd.DataFrame(
        {
            "timestamp": pd.Series(dtype="uint64"),
            "cpu": pd.Series(dtype="uint16"),
            **{f.name: pd.Series(dtype="object") for f in fmt.fields if f.name != "common_type"},
        }
    )


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


def _cuts(buffer, starts: np.ndarray, cpus: np.ndarray) -> list[int]:
    """Where to cut rows (``starts``: their offsets in ``buffer``, in time order; ``cpus``: their CPUs) into pieces
    that each enter at most RELEASE_REGIONS 2 MiB regions of a mapped trace not entered by the row before them on the
    same CPU (a CPU's records lie in file order in its own part of the file): a piece maps at most RELEASE_REGIONS
    plus one region a CPU. One piece for a buffer that is not mapped."""
    if not isinstance(buffer, mmap.mmap) or len(starts) < 2:
        return [0, len(starts)]
    by_cpu = np.argsort(cpus, kind="stable")  # each CPU's rows together, in time order
    regions, grouped_cpus = starts[by_cpu] >> FAULT_REGION_SHIFT, cpus[by_cpu]
    entered = np.ones(len(starts), dtype=bool)
    entered[1:] = (regions[1:] != regions[:-1]) | (grouped_cpus[1:] != grouped_cpus[:-1])
    new_regions = np.empty(len(starts), dtype=np.int64)
    new_regions[by_cpu] = entered
    np.cumsum(new_regions, out=new_regions)
    cuts = np.searchsorted(new_regions, np.arange(RELEASE_REGIONS, new_regions[-1], RELEASE_REGIONS), side="right")
    return [0, *cuts.tolist(), len(starts)]


def _gathered(buffer, starts: np.ndarray, width: int, cuts: list[int]) -> np.ndarray:
    """Each record's first ``width`` bytes (ringbuf.gather), piece by piece (``cuts``), the mapped trace's memory
    released after each piece; into one array, never held twice."""
    if len(cuts) <= 2:
        raw = np.frombuffer(ringbuf.gather(buffer, starts, width), dtype=np.uint8)
        _release(buffer)
        return raw
    raw = np.empty(len(starts) * width, dtype=np.uint8)
    for first, last in zip(cuts, cuts[1:], strict=False):
        raw[first * width : last * width] = np.frombuffer(ringbuf.gather(buffer, starts[first:last], width), np.uint8)
        _release(buffer)
    return raw


def _strings(buffer, starts: np.ndarray, limits: np.ndarray, cuts: list[int] | None = None) -> pa.Array:
    """NUL-terminated strings at ``starts`` of ``buffer`` (at most ``limits`` bytes), decoded as UTF-8 with
    replacement; read piece by piece (``cuts``, default one piece), the mapped trace's memory released after each."""
    import pyarrow as pa

    starts = np.ascontiguousarray(starts, dtype=np.int64)
    limits = np.ascontiguousarray(limits, dtype=np.int64)
    offset_parts, data_parts, size = [np.zeros(1, np.int32)], [], 0
    cuts = cuts or [0, len(starts)]
    for first, last in zip(cuts, cuts[1:], strict=False):
        offsets, data = ringbuf.cstrings(buffer, starts[first:last], limits[first:last])
        _release(buffer)
        offset_parts.append(np.frombuffer(offsets, dtype=np.int32)[1:] + size)
        data_parts.append(data)
        size += len(data)
    if len(data_parts) == 1:
        offsets, data = np.frombuffer(offsets, dtype=np.int32), data_parts[0]
    else:
        offsets, data = np.concatenate(offset_parts), b"".join(data_parts)
    buffers = [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    strings = pa.Array.from_buffers(pa.string(), len(starts), buffers)
    try:  # UTF-8 checked in place: a cast to string would import pyarrow.compute, ~40 ms of the CLI's start-up
        strings.validate(full=True)
        return strings
    except pa.ArrowInvalid:  # not UTF-8: decode each value as the kernel's bytes with U+FFFD, like bytes.decode
        binary = pa.Array.from_buffers(pa.binary(), len(starts), buffers)
        return pa.array([value.decode(errors="replace") for value in binary.to_pylist()], pa.string())


def _numeric(values: np.ndarray) -> pa.Array:
    """A numpy integer column as an Arrow array, zero-copy (pa.array would import pandas to inspect it)."""
    import pyarrow as pa

    values = np.ascontiguousarray(values)
    return pa.Array.from_buffers(pa.from_numpy_dtype(values.dtype), len(values), [None, pa.py_buffer(values)])


def _gather_batch(records: _Records, fmt: EventFormat, chosen: np.ndarray) -> pa.RecordBatch:
    import pyarrow as pa

    starts = records.offsets[chosen].astype(np.int64)
    if not fmt.fields:
        raise TraceFormatError(f"event {fmt.key} has no fields")
    width = max(f.offset + f.size for f in fmt.fields)
    if width > max(records.page_size, 4096):
        raise TraceFormatError(f"event {fmt.key}: fields reach byte {width}, beyond a {records.page_size}-byte page")
    cpus = records.cpus(chosen)
    cuts = _cuts(records.buffer, starts, cpus)
    raw = _gathered(records.buffer, starts, width, cuts)
    rows = raw.view(_dtype(fmt, width)).reshape(-1)
    at_row = np.arange(len(starts), dtype=np.int64) * width
    columns = {"timestamp": _numeric(records.stamps[chosen]), "cpu": _numeric(cpus)}
    for f in fmt.fields:
        if f.name == "common_type" or f.name not in rows.dtype.names:
            continue
        column = rows[f.name]
        if f.dynamic:
            locs = column.astype(np.int64)
            begin = starts + (locs & 0xFFFF) + (f.offset + f.size if f.dynamic == "__rel_loc" else 0)
            columns[f.name] = _strings(records.buffer, begin, locs >> 16, cuts)
        elif f.char_array:  # read from the gathered rows: the trace's pages are not touched again
            columns[f.name] = _strings(raw, at_row + f.offset, np.full(len(starts), f.size, dtype=np.int64))
        elif column.dtype.kind == "V":
            packed = np.ascontiguousarray(column).tobytes()
            columns[f.name] = pa.Array.from_buffers(pa.binary(f.size), len(starts), [None, pa.py_buffer(packed)])
        else:
            columns[f.name] = _numeric(column)
    return pa.RecordBatch.from_pydict(columns)


def _release(buffer) -> None:
    """Drop a mapped trace's pages from this process's memory (they stay in the page cache; touched again, they
    come back): what keeps a walk or a table build over a large trace.dat within bounded memory."""
    if isinstance(buffer, mmap.mmap) and hasattr(mmap, "MADV_DONTNEED") and len(buffer):
        buffer.madvise(mmap.MADV_DONTNEED)


def _temporary_file():
    """An unlinked temporary file for CPU data beyond IN_MEMORY (tempfile, and random behind it, imported only then:
    an ingest of a plain trace.dat needs neither)."""
    import tempfile

    return tempfile.TemporaryFile(prefix="ticklab-trace-")


class _Spool:
    """Bytes appended in order (a file object for rawfile.copy_into): in memory up to IN_MEMORY bytes, beyond that in
    an unlinked temporary file, which ``buffer`` maps read-only, so unpacked data costs page cache, not memory that
    stays with the process (the walk and the gathers release mapped pages as they go)."""

    def __init__(self) -> None:
        self.file, self.size, self.spilled = io.BytesIO(), 0, False

    def write(self, data) -> int:
        if not self.spilled and self.size + len(data) > IN_MEMORY:
            spill = _temporary_file()
            spill.write(self.file.getbuffer())
            self.file, self.spilled = spill, True
        written = self.file.write(data)
        self.size += written
        return written

    def buffer(self):
        """What was written: bytes, or a read-only map of the temporary file (which outlives the file's closing)."""
        if not self.spilled:
            return self.file.getvalue()
        self.file.flush()
        return mmap.mmap(self.file.fileno(), 0, access=mmap.ACCESS_READ) if self.size else b""

    def __enter__(self) -> _Spool:
        return self

    def __exit__(self, *exc) -> None:
        self.file.close()


@dataclass
class _Segment:
    """One CPU's pages: ``length`` bytes at ``start`` of the trace's buffer."""

    cpu: int
    start: int
    length: int


def _assemble(
    source: str,
    formats: Mapping[int, EventFormat],
    buffer,
    segments: list[_Segment],
    page_size: int,
    header_page: str,
    stats_text: dict[int, str],
    clock: str | None,
    check_read_events: bool = False,
    kallsyms: bytes | Callable[[], bytes] = b"",
) -> Trace:
    commit_size, data_offset = parse_header_page(header_page, source)
    if page_size <= data_offset or page_size > 1 << 24:
        raise TraceFormatError(f"{source}: page size {page_size} is not a ring-buffer page size")
    numbers = [segment.cpu for segment in segments]
    if len(set(numbers)) != len(numbers):  # one CPU's events would be filed under another's, its lost count replaced
        raise TraceFormatError(
            f"{source}: CPU {next(n for n in numbers if numbers.count(n) > 1)} has two blocks of data"
        )
    total = sum(segment.length for segment in segments)
    if total > TRACE_DATA_LIMIT:
        raise TraceFormatError(
            f"{source}: {total} bytes of CPU data, more than the {TRACE_DATA_LIMIT} ticklab reads of a trace"
        )
    # each column grows in place (realloc: a large block is remapped, not copied), so the records are never held
    # twice, as joining per-chunk arrays would
    offsets, stamps, types, lost = bytearray(), bytearray(), bytearray(), {}
    offset_type = _offset_type(buffer)
    cpu_numbers, cpu_firsts, walked = [], [], 0  # the CPUs in order, where each one's records start
    step = max(1, WALK_BYTES // page_size) * page_size
    for segment in sorted(segments, key=lambda s: s.cpu):
        cpu = segment.cpu
        cpu_numbers.append(cpu)
        cpu_firsts.append(walked)
        if segment.length % page_size:
            raise TraceFormatError(
                f"{source}: CPU {cpu} data is {segment.length} bytes, not a whole number of {page_size}-byte pages"
            )
        found = 0
        lost[cpu] = 0
        for start in range(segment.start, segment.start + segment.length, step):  # pages are independent
            where, times, kinds, missed, bad_page = ringbuf.walk(
                buffer, start, min(step, segment.start + segment.length - start), page_size, commit_size, data_offset
            )
            if bad_page >= 0:
                raise TraceFormatError(
                    f"{source}: CPU {cpu} page at byte {bad_page - segment.start} claims more data "
                    f"than a {page_size}-byte page holds"
                )
            _release(buffer)
            offsets += memoryview(np.frombuffer(where, dtype=np.int64).astype(offset_type))  # bytes, not a sum
            stamps += times
            types += kinds
            lost[cpu] += missed
            found += len(times) // 8
        walked += found
        if check_read_events and cpu in stats_text:
            _check_read_events(source, cpu, found, stats_text[cpu])
    stats_lost = {cpu: stats_lost_count(text) for cpu, text in stats_text.items()}
    trace_records = None
    if walked:
        trace_records = _Records(
            buffer,
            np.frombuffer(offsets, dtype=offset_type),
            np.frombuffer(stamps, np.uint64),
            np.frombuffer(types, "<u2"),
            np.asarray(cpu_numbers, dtype=np.uint16),
            np.asarray(cpu_firsts, dtype=np.int64),
            page_size,
        )
    return Trace(
        source=source,
        formats=formats,
        records=trace_records,
        lost_events=lost,
        page_size=page_size,
        clock=clock,
        stats_lost=stats_lost,
        kallsyms=kallsyms,
    )


READ_EVENTS = re.compile(r"^\s*read events:\s*(\d+)", re.M)


def _check_read_events(source: str, cpu: int, found: int, stats: str) -> None:
    """A capture's stats are taken after its last read: its file must hold at least the events read (whatever
    'entries' says was left in the buffer, which are not in the file either way)."""
    read = READ_EVENTS.search(stats)
    if read and found < int(read.group(1)):
        raise TraceFormatError(
            f"{source}: cpu{cpu}.raw holds {found} events but cpu{cpu}.stats says {read.group(1)} "
            "were read: the file is truncated"
        )


KALLSYMS_FILE = "kallsyms"  # in a tracefs capture: the /proc/kallsyms lines of the symbols the experiment named


# -- ticklab's tracefs directory ---------------------------------------------------------------------
# Small text files of a tracefs capture (header_page, a format, cpuN.stats, trace_clock, page_size): KiBs each.
TEXT_LIMIT = 1 << 20
KALLSYMS_LIMIT = 256 << 20  # the whole of /proc/kallsyms is ~10 MB; a capture keeps the few lines it needs


@_guarded(lambda directory: directory)
def read_tracefs_dir(directory: Path | str) -> Trace:
    directory = Path(directory)
    try:
        with OwnedDir(directory, create=False) as files:
            return _read_tracefs_dir(directory, files)
    except (UnsafeFileError, rawfile.RawFileError) as exc:
        raise TraceFormatError(str(exc)) from None


def _read_tracefs_dir(directory: Path, files_dir: OwnedDir) -> Trace:
    header = directory / "header_page"
    # lexists: a link or FIFO counts as there, so that reading it refuses it by name instead of passing it over
    if not os.path.lexists(header):
        raise TraceFormatError(f"{header}: missing; {directory} is not a ticklab tracefs capture")
    header_text = files_dir.read_text("header_page", TEXT_LIMIT)
    formats = EventFormats()
    for path in sorted((directory / "formats").glob("*/*/format")):
        relative = str(path.relative_to(directory))
        formats.add_text(files_dir.read_text(relative, TEXT_LIMIT), system=path.parent.parent.name, source=str(path))
    files = {}
    for path in [*directory.glob("cpu*.raw"), *directory.glob("cpu*.raw.xz")]:
        number = path.name.split(".")[0][3:]
        if not number.isdigit():
            raise TraceFormatError(f"{shown(path)}: not a cpu<N>.raw file name")
        if int(number) in files:
            raise TraceFormatError(f"{path}: cpu{number} is there both plain and .xz")
        files[int(number)] = path
    stats = {}
    for path in directory.glob("cpu*.stats"):
        if not path.stem[3:].isdigit():
            raise TraceFormatError(f"{shown(path)}: not a cpu<N>.stats file name")
        if int(path.stem[3:]) in stats:
            raise TraceFormatError(f"{shown(path)}: a second stats file for CPU {int(path.stem[3:])}")
        stats[int(path.stem[3:])] = files_dir.read_text(path.name, TEXT_LIMIT)
    for cpu in sorted(set(stats) - set(files)):  # a capture writes cpuN.raw for every CPU it has stats of
        raise TraceFormatError(
            f"{directory / f'cpu{cpu}.raw'}: missing, but cpu{cpu}.stats is there (a ticklab "
            f"tracefs capture writes both for every CPU), so CPU {cpu}'s events would be absent"
        )
    for cpu in sorted(set(files) - set(stats)):  # without it a truncated cpuN.raw would pass for a whole one
        raise TraceFormatError(
            f"{directory / f'cpu{cpu}.stats'}: missing (a ticklab tracefs capture writes one beside "
            f"every cpu<N>.raw), so nothing tells whether {files[cpu].name} is complete"
        )
    for cpu in sorted(stats):
        # 'read events' is the one count of what the capture read: the pages' own headers (commit sizes, missed
        # events) describe only the pages that are there, so a cpuN.raw cut at a page boundary looks whole to them
        if not READ_EVENTS.search(stats[cpu]):
            raise TraceFormatError(
                f"{directory / f'cpu{cpu}.stats'}: no 'read events:' line, so nothing tells whether "
                f"{files[cpu].name} is complete (its pages' headers describe only the pages there)"
            )
    spool, segments = _Spool(), []
    with spool:
        for cpu, path in sorted(files.items()):  # streamed into one buffer, never held whole twice
            start = spool.size
            try:
                rawfile.copy_into(
                    path,
                    spool,
                    TRACE_DATA_LIMIT - start,
                    over=f" (a trace's CPU data is at most {TRACE_DATA_LIMIT} bytes in all)",
                )
            except rawfile.RawFileError as exc:
                raise TraceFormatError(str(exc)) from None
            segments.append(_Segment(cpu, start, spool.size - start))
        buffer = spool.buffer()
    clock = None
    if os.path.lexists(directory / "trace_clock"):
        found = re.search(r"\[(\w+)\]", files_dir.read_text("trace_clock", TEXT_LIMIT))
        clock = found.group(1) if found else None
    page_size = 4096
    if os.path.lexists(directory / "page_size"):
        text = files_dir.read_text("page_size", TEXT_LIMIT).strip()
        if not text.isdigit():
            raise TraceFormatError(f"{directory / 'page_size'}: not a page size: {shown(text, 40)!r}")
        page_size = int(text)
    kallsyms = (
        _read_bytes(directory / KALLSYMS_FILE, KALLSYMS_LIMIT) if rawfile.present(directory / KALLSYMS_FILE) else b""
    )
    return _assemble(
        str(directory),
        formats,
        buffer,
        segments,
        page_size,
        header_text,
        stats,
        clock,
        check_read_events=True,
        kallsyms=kallsyms,
    )


# -- trace-cmd's trace.dat ---------------------------------------------------------------------------
class _Reader:
    def __init__(self, data, source: str, position: int = 0, where: str = ""):
        self.data, self.source, self.position, self.where = data, source, position, where

    def error(self, what: str, at: int | None = None) -> TraceFormatError:
        return TraceFormatError(f"{self.source}: {what} at byte {self.position if at is None else at}{self.where}")

    def take(self, size: int) -> bytes:
        if size < 0 or self.position + size > len(self.data):
            raise self.error(f"truncated (wanted {size} more bytes, {max(0, len(self.data) - self.position)} left)")
        chunk = self.data[self.position : self.position + size]
        self.position += size
        return chunk

    def skip(self, size: int) -> None:
        if size < 0 or self.position + size > len(self.data):
            raise self.error(f"truncated (wanted {size} more bytes, {max(0, len(self.data) - self.position)} left)")
        self.position += size

    def u16(self) -> int:
        return struct.unpack("<H", self.take(2))[0]

    def u32(self) -> int:
        return struct.unpack("<I", self.take(4))[0]

    def u64(self) -> int:
        return struct.unpack("<Q", self.take(8))[0]

    def string(self) -> str:
        end = self.data.find(b"\0", self.position)
        if end < 0:
            raise self.error("unterminated string")
        return self.text(self.take(end - self.position + 1)[:-1], self.position - (end - self.position + 1))

    def text(self, raw: bytes, at: int) -> str:
        try:
            return raw.decode()
        except UnicodeDecodeError as exc:
            raise self.error(f"text that is not UTF-8 ({exc.reason})", at + exc.start) from exc


def _copied(data, start: int, size: int) -> bytes:
    return bytes(data[start : start + size])


def _section_bytes(reader: _Reader, inflate, section_at: int, start: int, size: int) -> bytes:
    """``size`` bytes at ``start`` of the trace.dat v7 section at ``section_at``, decompressed again if it is
    compressed (it was once, checked, while the trace was read)."""
    opened = _Reader(reader.data, reader.source, section_at + 2)
    if not opened.u16() & SECTION_COMPRESSED:
        return _copied(reader.data, start, size)
    plain = _decompress(_Reader(reader.data, reader.source, section_at + 16), inflate, f"section at byte {section_at}")
    return _copied(plain, start, size)


def _read_header_info(reader: _Reader) -> str:
    if reader.take(12) != b"header_page\0":
        raise reader.error("expected header_page", reader.position - 12)
    size = reader.u64()
    start = reader.position
    header_page = reader.text(reader.take(size), start)
    if reader.take(13) != b"header_event\0":
        raise reader.error("expected header_event", reader.position - 13)
    reader.take(reader.u64())
    return header_page


def _read_ftrace_formats(reader: _Reader, formats: EventFormats) -> None:
    for _ in range(reader.u32()):
        _add_format(reader, reader.u64(), "ftrace", formats)


def _read_event_formats(reader: _Reader, formats: EventFormats) -> None:
    for _ in range(reader.u32()):
        system = reader.string()
        for _ in range(reader.u32()):
            _add_format(reader, reader.u64(), system, formats)


def _add_format(reader: _Reader, size: int, system: str, formats: EventFormats) -> None:
    """The format text of ``size`` bytes at the reader, checked now (UTF-8, an ID line) and read again from the
    file's bytes when it is parsed."""
    start = reader.position
    text = reader.text(reader.take(size), start)
    formats.add_text(
        text, system, f"{reader.source} (byte {start})", again=functools.partial(_decoded, reader.data, start, size)
    )


def _decoded(data, start: int, size: int) -> str:
    return bytes(data[start : start + size]).decode()


def _read_bytes(path: Path, limit: int = rawfile.RAW_FILE_LIMIT) -> bytes:
    """A file's bytes, decompressing it when it is an .xz (bundles keep most raw traces xz'd); never through a link,
    never a FIFO or device, bounded."""
    try:
        return rawfile.read_bytes(path, limit)
    except rawfile.RawFileError as exc:
        raise TraceFormatError(str(exc)) from None


def _map_file(path: Path):
    """An uncompressed regular file (not reached through a link) mapped read-only; an .xz unpacked as a stream (into
    memory, or beyond IN_MEMORY into a mapped temporary file), at most TRACE_DATA_LIMIT bytes; bytes for an empty
    file."""
    located = rawfile.locate(path)
    if located.suffix == ".xz":
        with _Spool() as spool:
            try:
                rawfile.copy_into(path, spool, TRACE_DATA_LIMIT)
            except rawfile.RawFileError as exc:
                raise TraceFormatError(str(exc)) from None
            return spool.buffer()
    try:
        fd = open_fd(located)
    except UnsafeFileError as exc:
        raise TraceFormatError(str(exc)) from None
    try:
        if not os.fstat(fd).st_size:
            return b""
        return mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    finally:
        os.close(fd)


@_guarded(lambda path: path)
def read_trace_dat(path: Path | str) -> Trace:
    path = Path(path)
    data = _map_file(path)
    source = str(path)
    if data[: len(TRACE_DAT_MAGIC)] != TRACE_DAT_MAGIC:
        raise TraceFormatError(f"{source}: not a trace-cmd trace.dat (bad magic)")
    reader = _Reader(data, source, len(TRACE_DAT_MAGIC))
    version = reader.string()
    endian, long_size = reader.take(1)[0], reader.take(1)[0]
    if endian != 0:
        raise TraceFormatError(f"{source}: big-endian trace data is not supported")
    page_size = reader.u32()
    formats = EventFormats()
    if version == "6":
        return _read_v6(reader, formats, page_size, source)
    if version == "7":
        return _read_v7(reader, formats, page_size, source, long_size)
    raise TraceFormatError(f"{source}: trace.dat version {version!r}; ticklab reads versions 6 and 7")


def _cpu_segment(reader: _Reader, cpu: int, offset: int, size: int) -> _Segment:
    """CPU data must lie inside the file: trace-cmd refuses a trace whose data was cut short, and so do we."""
    if offset + size > len(reader.data):
        raise TraceFormatError(
            f"{reader.source}: truncated: CPU {cpu} data at byte {offset} is {size} bytes but the "
            f"file ends at byte {len(reader.data)}"
        )
    return _Segment(cpu, offset, size)


def _read_v6(reader: _Reader, formats: EventFormats, page_size: int, source: str) -> Trace:
    header_page = _read_header_info(reader)
    _read_ftrace_formats(reader, formats)
    _read_event_formats(reader, formats)
    kallsyms_size = reader.u32()
    kallsyms = functools.partial(_copied, reader.data, reader.position, kallsyms_size)  # read when asked for
    reader.skip(kallsyms_size)
    reader.take(reader.u32())  # printk formats
    reader.take(reader.u64())  # saved cmdlines
    cpus = reader.u32()
    stats: dict[int, str] = {}
    clock = None
    marker = reader.take(10)
    if marker == b"options  \0":
        while (option := reader.u16()) != OPTION_DONE:
            start = reader.position + 4
            payload = reader.take(reader.u32())
            if option == OPTION_CPUSTAT:
                _add_stats(stats, reader.text(payload.rstrip(b"\0"), start), source)
            elif option == OPTION_TRACECLOCK:
                clock = _clock_of(payload)
        marker = reader.take(10)
    if marker != b"flyrecord\0":
        raise TraceFormatError(
            f"{source}: expected flyrecord data, found {marker!r} (latency traces are not supported)"
        )
    segments = []
    for cpu in range(cpus):
        offset, size = reader.u64(), reader.u64()
        segments.append(_cpu_segment(reader, cpu, offset, size))
    _check_cpu_count(source, cpus, stats)
    # a v6 file ends with its CPU data: pages beyond the last CPU's are a CPU the header does not count
    end = max([reader.position, *(s.start + s.length for s in segments)])
    if len(reader.data) - end >= page_size:
        raise TraceFormatError(
            f"{source}: {len(reader.data) - end} bytes of data after the last of the {cpus} CPUs "
            "the header counts: the CPU count is wrong or the file is damaged"
        )
    return _assemble(source, formats, reader.data, segments, page_size, header_page, stats, clock, kallsyms=kallsyms)


def _decompressor(name: str, source: str):
    """bytes, expected size -> bytes, for the compressions trace-cmd writes (libtracecmd's zstd and zlib plugins)."""
    if name == "zstd":
        import zstandard

        context = zstandard.ZstdDecompressor()
        return lambda blob, size: context.decompress(blob, max_output_size=size)
    if name == "zlib":
        return _inflate_zlib
    raise TraceFormatError(f"{source}: compressed with {name!r}; ticklab reads zstd and zlib (and uncompressed)")


class _LongerThanStated(ValueError):
    """A compressed block holds more data than its header's uncompressed size."""


def _inflate_zlib(blob: bytes, size: int) -> bytes:
    """One zlib block that must decompress to exactly ``size`` bytes and end there: output beyond ``size`` (which a
    bounded decompress would silently leave behind) or a stream cut short is an error."""
    decompressor = zlib.decompressobj()
    plain = decompressor.decompress(blob, size)
    if decompressor.unconsumed_tail or (not decompressor.eof and decompressor.decompress(b"", 1)):
        raise _LongerThanStated(f"more than the {size} bytes its header says")
    if not decompressor.eof:
        raise zlib.error("the compressed stream ends before its end marker")
    return plain


def _decompressed_limit(file_size: int) -> int:
    """The most a compressed trace.dat of ``file_size`` bytes may decompress to, sections and CPU data each."""
    return rawfile.unpack_limit(file_size, TRACE_DATA_LIMIT)


def _decompress(reader: _Reader, inflate, what: str, room: int = MAX_BLOCK) -> bytes:
    """One compressed block at the reader: u32 compressed size, u32 uncompressed size, the data; at most ``room``
    bytes of it (what is left of the file's decompression limit)."""
    start = reader.position
    packed, size = reader.u32(), reader.u32()
    blob = reader.take(packed)
    if size > MAX_BLOCK:
        raise reader.error(
            f"{what} claims {size} bytes uncompressed (trace-cmd writes blocks of at most {MAX_BLOCK >> 20} MiB)", start
        )
    if size > room:
        raise reader.error(
            f"{what} claims {size} bytes uncompressed, beyond what ticklab decompresses of a "
            f"{len(reader.data)}-byte trace.dat (at most {rawfile.UNPACK_RATIO} times its size, "
            f"{TRACE_DATA_LIMIT} bytes in all)",
            start,
        )
    try:
        plain = inflate(blob, size)
    except _LongerThanStated as exc:
        raise reader.error(f"{what} decompresses to {exc}", start) from None
    if len(plain) != size:
        raise reader.error(f"{what} decompresses to {len(plain)} bytes, not the {size} its header says", start)
    return plain


def _read_v7(reader: _Reader, formats: EventFormats, page_size: int, source: str, long_size: int) -> Trace:
    compression = reader.string()
    reader.string()  # compression version
    inflate = None if compression == "none" else _decompressor(compression, source)
    next_options = reader.u64()
    header_page, clock = None, None
    kallsyms: bytes | Callable[[], bytes] = b""
    stats: dict[int, str] = {}
    cpu_data: list[tuple[int, int, int, bool]] = []
    top_level, instances = False, []
    inflated = 0  # bytes the compressed sections decompressed to, so far
    limit = _decompressed_limit(len(reader.data))

    def section(offset: int) -> _Reader:
        """A reader placed after the header of the section at ``offset`` (over its decompressed bytes if compressed)."""
        opened = _Reader(reader.data, source, offset)
        opened.u16()  # section id
        flags = opened.u16()
        opened.u32()  # description string id
        opened.u64()  # size
        if not flags & SECTION_COMPRESSED:
            return opened
        if inflate is None:
            raise opened.error("compressed section in a file that names no compression", offset)
        nonlocal inflated
        plain = _decompress(opened, inflate, f"section at byte {offset}", limit - inflated)
        inflated += len(plain)
        return _Reader(plain, source, 0, f" of the section at byte {offset} (decompressed)")

    seen: set[int] = set()
    while next_options:
        if next_options in seen:
            raise TraceFormatError(f"{source}: the options sections loop back to byte {next_options}")
        seen.add(next_options)
        options = section(next_options)
        next_options = 0
        while True:
            option, size = options.u16(), options.u32()
            start = options.position
            payload = options.take(size)
            value = _Reader(payload, source, 0, f" of the option at byte {start}{options.where}")
            if option == OPTION_DONE:
                next_options = value.u64()
                break
            if option == OPTION_HEADER_INFO:
                header_page = _read_header_info(section(value.u64()))
            elif option == OPTION_FTRACE_EVENTS:
                _read_ftrace_formats(section(value.u64()), formats)
            elif option == OPTION_EVENT_FORMATS:
                _read_event_formats(section(value.u64()), formats)
            elif option == OPTION_KALLSYMS:
                at = value.u64()
                symbols = section(at)  # decompressed (and checked against the limit) now, kept only if asked for
                size = symbols.u32()
                kallsyms = functools.partial(_section_bytes, reader, inflate, at, symbols.position, size)
                symbols.skip(size)
            elif option == OPTION_CPUSTAT:
                _add_stats(stats, value.text(payload.rstrip(b"\0"), 0), source)
            elif option == OPTION_BUFFER:
                flyrecord = value.u64()
                instance = value.string()
                buffer_clock = value.string()
                if instance != "":
                    instances.append(instance)
                    continue
                if top_level:  # a second list of the CPUs' data: which one is the trace?
                    raise options.error("a second buffer option for the top-level instance", start - 6)
                top_level = True
                clock = buffer_clock
                remaining = len(payload) - value.position
                if remaining >= 8 and remaining - 8 == 20 * struct.unpack_from("<I", payload, value.position + 4)[0]:
                    page_size = value.u32()  # newer trace-cmd records the sub-buffer size here
                flags = _Reader(reader.data, source, flyrecord + 2).u16()
                for _ in range(value.u32()):
                    cpu, offset, size = value.u32(), value.u64(), value.u64()
                    if any(cpu == listed for listed, *_ in cpu_data):  # two data blocks for one CPU: one would be
                        raise options.error(f"a second data entry for CPU {cpu} in the buffer option", start - 6)
                    cpu_data.append((cpu, offset, size, bool(flags & SECTION_COMPRESSED)))
    if header_page is None:
        raise TraceFormatError(f"{source}: no HEADER_INFO section")
    if not top_level:  # trace-cmd writes one for the top-level buffer even when it recorded no CPU
        also = (
            f" (only instance(s) {shown(', '.join(instances), 120)}, which ticklab does not read)" if instances else ""
        )
        raise TraceFormatError(
            f"{source}: no buffer option for the top-level instance{also}: nothing says where the "
            "CPU data is, so its events cannot be counted"
        )
    if any(compressed for *_, compressed in cpu_data):
        buffer, segments = _inflate_cpu_data(reader, inflate, cpu_data, page_size)
    else:
        buffer, segments = reader.data, [_cpu_segment(reader, cpu, offset, size) for cpu, offset, size, _ in cpu_data]
    return _assemble(source, formats, buffer, segments, page_size, header_page, stats, clock, kallsyms=kallsyms)


def _inflated_size(reader: _Reader, cpu_data) -> int:
    """What the CPU data decompresses to, from the chunk headers alone."""
    total = 0
    for _cpu, offset, size, compressed in cpu_data:
        if not compressed:
            total += size
            continue
        chunks = _Reader(reader.data, reader.source, offset)
        for _ in range(chunks.u32()):
            packed, plain = chunks.u32(), chunks.u32()
            chunks.skip(packed)
            total += plain
    return total


def _inflate_cpu_data(reader: _Reader, inflate, cpu_data, page_size: int) -> tuple[object, list[_Segment]]:
    """Compressed flyrecord data: per CPU a u32 chunk count, then chunks (u32 packed, u32 plain size, data).

    Decompressed chunk by chunk into memory, or, beyond IN_MEMORY bytes, into an unlinked temporary file that is
    then mapped like an uncompressed trace.dat (so a large compressed trace needs no more memory than its pages)."""
    if inflate is None:
        raise TraceFormatError(f"{reader.source}: compressed CPU data in a file that names no compression")
    total, limit = _inflated_size(reader, cpu_data), _decompressed_limit(len(reader.data))
    if total > limit:  # found from the chunk headers, before a byte is decompressed; each chunk is then held to its own
        raise TraceFormatError(
            f"{reader.source}: its CPU data's chunk headers say {total} bytes decompressed, beyond "
            f"what ticklab decompresses of a {len(reader.data)}-byte trace.dat (at most "
            f"{rawfile.UNPACK_RATIO} times its size, {TRACE_DATA_LIMIT} bytes in all)"
        )
    spill = total > IN_MEMORY
    out = _temporary_file() if spill else io.BytesIO()
    with out:
        segments, written = [], 0
        for cpu, offset, size, compressed in cpu_data:
            start = written
            if not compressed:
                segment = _cpu_segment(reader, cpu, offset, size)
                written += out.write(reader.data[segment.start : segment.start + segment.length])
            else:
                chunks = _Reader(reader.data, reader.source, offset)
                count = chunks.u32()
                for number in range(count):
                    written += out.write(_decompress(chunks, inflate, f"CPU {cpu} chunk {number}"))
                # the stated size is that of the chunks after the count (trace-cmd's out_write_cpu_data): a chunk
                # count or a size that disagrees with it would drop or invent data in silence
                if chunks.position != offset + 4 + size:
                    raise TraceFormatError(
                        f"{reader.source}: CPU {cpu} data at byte {offset} holds {size} bytes of "
                        f"chunks but its {count} compressed chunks end at byte {chunks.position}, "
                        f"not {offset + 4 + size}: the chunk count or a size is wrong"
                    )
            segments.append(_Segment(cpu, start, written - start))
        if not spill:
            return out.getvalue(), segments  # the buffer itself, not a copy (nothing else refers to it)
        out.flush()
        return (mmap.mmap(out.fileno(), 0, access=mmap.ACCESS_READ) if written else b""), segments


def _check_cpu_count(source: str, cpus: int, stats: dict[int, str]) -> None:
    """A v6 trace.dat has one CPUSTAT option per CPU its header counts: a CPU count that differs (a damaged or edited
    header) would silently drop or invent a CPU's events. (Not v7: its buffer lists only the CPUs recorded, while
    trace-cmd writes the stats of every CPU, as a guest run with a CPU mask showed.)"""
    if stats and len(stats) != cpus:
        raise TraceFormatError(
            f"{source}: the header counts {cpus} CPUs of data but the file has the stats of "
            f"{len(stats)} CPUs: the CPU count is wrong or the file is damaged"
        )


def _add_stats(stats: dict[int, str], text: str, source: str) -> None:
    """One CPU's stats option; a second one for the same CPU (its lost events would replace the first's) is refused."""
    cpu = _cpu_of_stats(text, len(stats))
    if cpu in stats:
        raise TraceFormatError(f"{source}: two stats options for CPU {cpu}: the lost events of one would be lost")
    stats[cpu] = text


def _cpu_of_stats(text: str, fallback: int) -> int:
    found = re.search(r"^cpu:\s*(\d+)", text, re.M | re.I)
    return int(found.group(1)) if found else fallback


def _clock_of(payload: bytes) -> str | None:
    found = re.search(rb"\[(\w+)\]", payload)
    return found.group(1).decode() if found else None


@_guarded(lambda path: path)
def read_trace(path: Path | str) -> Trace:
    """A trace.dat file (or trace.dat.xz) or a ticklab tracefs capture directory (cpuN.raw or cpuN.raw.xz).

    Raises TraceFormatError, and nothing else, for input it cannot read (one line naming the file)."""
    path = Path(path)
    if path.is_dir():
        for name in ("trace.dat", "trace.dat.xz"):
            if os.path.lexists(path / name):
                return read_trace_dat(path / name)
        return read_tracefs_dir(path)
    if not os.path.lexists(path):
        raise TraceFormatError(f"{path}: no such trace file or directory")
    return read_trace_dat(path)


def write_tables(trace: Trace, out_dir: Path | str) -> list[Path]:
    """One Parquet file per event (``<system>__<event>.parquet``), written batch by batch (bounded memory); a field
    no table can hold (``not_ingested``) is left out and named, with why, in the file's metadata."""
    out_dir = Path(out_dir)
    written = []
    try:
        # root may write here on behalf of a user who can write to out_dir: a link, hard link, FIFO or device planted
        # in it is refused, never written through or opened, and each table replaces its file whole or not at all.
        # Every table's name is checked before the first is written, so a refusal leaves the directory as it was.
        names = {}
        for key in sorted(trace.keys()):
            name = key.replace(":", "__") + ".parquet"
            if "/" in name or name.startswith("."):
                raise TraceFormatError(f"{trace.source}: event {shown(key)} cannot name a table file")
            names[key] = name
        with OwnedDir(out_dir) as out:
            for name in names.values():
                out.check_replaceable(name)
            _give_back_freed_memory()  # what reading the trace freed, before the tables need theirs
            for key, name in names.items():
                with out.replacing(name) as handle:
                    _write_table(trace, key, name, handle)
                written.append(out_dir / name)
    except UnsafeFileError as exc:
        raise TraceFormatError(str(exc)) from None
    except OSError as exc:
        raise TraceFormatError(f"{out_dir}: cannot write the tables ({exc.strerror or exc})") from None
    return written


def _give_back_freed_memory() -> None:
    """Ask the allocator Arrow uses to return what is freed (malloc_trim for the C library's: it keeps freed blocks
    for reuse, ~4 MB of them after reading a 600,000-event trace)."""
    import pyarrow as pa

    pa.default_memory_pool().release_unused()


# Parquet key-value metadata of a table that leaves a field of the event's format out: {field: why}, as JSON
NOT_INGESTED = b"ticklab.not_ingested"


def not_ingested(fmt: EventFormat) -> dict[str, str]:
    """The fields of ``fmt`` a written table leaves out, each with why: a field of size 0 holds no bytes in the
    record's fixed part — ftrace:function's ``unsigned long args[]`` (the function's arguments where the func-args
    option is on) runs to the record's end, a length the format states nowhere and the walk does not keep."""
    return {
        f.name: f"{shown(f.name_decl, 120)}: size 0 in the event's format (a variable-length array runs to the "
        "record's end, a length no field gives); not ingested"
        for f in fmt.fields
        if f.size == 0
    }


def _write_table(trace: Trace, key: str, name: str, handle) -> None:
    """One event's table into ``handle`` (Parquet), batch by batch. A table Parquet cannot store is a
    TraceFormatError naming the event and the column; an error of the file system (an errno: a full disk) is left to
    the caller, which names the file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    left_out = not_ingested(trace._format_of(key))
    writer = table = None
    unreleased = 0  # rows written since the allocator last gave back what it holds
    try:
        for batch in trace.batches(key, WRITE_BATCH_ROWS):
            table = pa.Table.from_batches([batch])
            del batch
            if left_out:  # said in the file's metadata, so a reader sees what is missing and why
                table = table.drop_columns([c for c in left_out if c in table.column_names]).replace_schema_metadata(
                    {NOT_INGESTED: json.dumps(left_out, sort_keys=True).encode()}
                )
            if writer is None:  # dictionary-encode the strings (comm names repeat)
                strings = [f.name for f in table.schema if pa.types.is_string(f.type)]
                writer = pq.ParquetWriter(handle, table.schema, use_dictionary=strings)
            # a table per batch is its own row group, written now (write_batch would buffer the event)
            writer.write_table(table, row_group_size=max(table.num_rows, 1))
            unreleased += table.num_rows
            table = None
            if unreleased >= RELEASE_ROWS:  # the allocator keeps encoding buffers otherwise
                _give_back_freed_memory()
                unreleased = 0
        done, writer = writer, None
        if done is not None:
            done.close()
    except (OSError, pa.ArrowException) as exc:
        if isinstance(exc, OSError) and exc.errno is not None:
            raise
        column = _unstorable_column(table) if table is not None else None
        raise TraceFormatError(
            f"{trace.source}: event {key}: {'its column ' + column if column else 'its table'} "
            f"cannot be stored in Parquet ({' '.join(str(exc).split())[:200]}); {name} was not "
            "written"
        ) from None
    finally:
        if writer is not None:
            with contextlib.suppress(Exception):
                writer.close()


def _unstorable_column(table) -> str | None:
    """The first column of ``table`` Parquet refuses on its own, as 'name (type)'."""
    import pyarrow.parquet as pq

    for index, field in enumerate(table.schema):
        try:
            pq.write_table(table.select([index]).slice(0, 1), io.BytesIO())
        except Exception:  # whichever error Parquet raises names the column
            return f"{shown(field.name, 80)} ({field.type})"
    return None
