"""`ticklab ingest --out` in bounded memory (issue 42 item 5: 150 MB against trace-cmd report's 58 MB on a
582,000-event trace.dat): a read trace holds 14 bytes a record, tables are gathered in pieces that map at most a few
2 MiB regions of the trace, released between them, and Arrow allocates from malloc. Peak memory is the child's own
VmHWM (ru_maxrss would carry the pytest worker's across vfork and exec)."""

import os
import struct
import subprocess
import sys

import numpy as np
import pytest

import tracedat
from test_ingest import page, payload, record
from ticklab.trace import ingest, ringbuf
from ticklab.trace.ingest import read_trace

PEAK = """
import sys
from ticklab.cli import main
code = main(sys.argv[1:])
print([line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM:")][0], file=sys.stderr)
sys.exit(code)
"""


def full_pages(records: int, start: int) -> tuple[bytes, int]:
    """At least ``records`` fake_event records (comm and a __data_loc name each) in full 4 KiB pages, every page
    the same records a page later: (the pages, how many records)."""
    body, per_page = b"", 0
    while True:
        one = record(
            100,
            payload(
                1000 + per_page, ("hackbench", "kworker/0:1", "a" * 15)[per_page % 3], per_page, f"n{per_page % 7}"
            ),
        )
        if len(body) + len(one) > 4096 - 16:
            break
        body, per_page = body + one, per_page + 1
    pages = -(-records // per_page)
    tail = page(0, body)[16:]
    return b"".join(
        struct.pack("<QQ", start + n * 100 * per_page, len(body)) + tail for n in range(pages)
    ), pages * per_page


def two_cpu_trace(path, records: int) -> int:
    cpu0, first = full_pages(records // 2, 1000)
    cpu1, second = full_pages(records // 2, 1050)
    tracedat.write_v7(path, {0: cpu0, 1: cpu1})
    return first + second


def test_a_table_gathered_in_pieces_is_the_table_gathered_whole(tmp_path, monkeypatch):
    """A mapped trace's records are gathered a few at a time, its pages released between pieces: a piece boundary
    changes no row, string or order (fixed-size fields, a char[16] and a __data_loc string)."""
    trace_path = tmp_path / "trace.dat"
    count = two_cpu_trace(trace_path, 3000)
    whole = read_trace(trace_path).arrow("fake:fake_event")
    gathers, strings = [], []
    monkeypatch.setattr(ingest, "RELEASE_REGIONS", 3)
    monkeypatch.setattr(ingest, "FAULT_REGION_SHIFT", 0)  # every record a region of its own: 3 records a piece
    monkeypatch.setattr(
        ringbuf,
        "gather",
        lambda buffer, starts, width, real=ringbuf.gather: gathers.append(len(starts)) or real(buffer, starts, width),
    )
    monkeypatch.setattr(
        ringbuf,
        "cstrings",
        lambda buffer, starts, limits, real=ringbuf.cstrings: (
            strings.append((type(buffer).__name__, len(starts))) or real(buffer, starts, limits)
        ),
    )
    trace = read_trace(trace_path)
    assert type(trace._records.buffer).__name__ == "mmap"
    pieces = trace.arrow("fake:fake_event")
    assert max(gathers) == 3 and sum(gathers) == count == whole.num_rows
    assert max(n for kind, n in strings if kind == "mmap") == 3  # the __data_loc strings, read from the trace
    assert pieces.equals(whole)
    assert set(pieces.column("name").to_pylist()) == {f"n{k}" for k in range(7)}
    assert set(pieces.column("comm").to_pylist()) == {"hackbench", "kworker/0:1", "a" * 15}


def test_rows_far_apart_in_the_file_are_gathered_a_few_regions_at_a_time(tmp_path):
    """A rare event's records lie each in its own 2 MiB region, which a fault may map whole (a large folio): a piece
    enters at most RELEASE_REGIONS regions its CPU was not already in; rows close together stay one piece."""
    import mmap

    (tmp_path / "mapped").write_bytes(b"\0" * 4096)
    with open(tmp_path / "mapped", "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        region = 1 << ingest.FAULT_REGION_SHIFT
        cpus = np.array([0, 1] * 20, dtype=np.uint16)
        sparse = np.where(cpus == 0, np.arange(40) * region, 200 * region + np.arange(40) * 64)  # CPU 1: one region
        cuts = ingest._cuts(mapped, sparse, cpus)
        assert cuts[0] == 0 and cuts[-1] == 40 and len(cuts) - 1 == -(-21 // ingest.RELEASE_REGIONS)
        for first, last in zip(cuts, cuts[1:], strict=False):
            entered = {(int(c), int(at) // region) for c, at in zip(cpus[first:last], sparse[first:last], strict=True)}
            assert len(entered) <= ingest.RELEASE_REGIONS + 2  # plus the region each CPU was in
        dense = 100 * region + np.arange(40) * 64
        assert ingest._cuts(mapped, dense, cpus) == [0, 40]
        assert ingest._cuts(b"\0" * 4096, sparse, cpus) == [0, 40]  # not mapped: nothing to release


def test_a_read_trace_holds_14_bytes_a_record(tmp_path):
    """A 4-byte offset (the trace is under 4 GiB), an 8-byte time and a 2-byte type; the CPU from where its records
    start (it held 20: an 8-byte offset and a CPU number a record)."""
    count = two_cpu_trace(tmp_path / "trace.dat", 20_000)
    records = read_trace(tmp_path / "trace.dat")._records
    held = sum(value.nbytes for value in vars(records).values() if isinstance(value, np.ndarray))
    assert count * 14 <= held <= count * 14 + 64


def peak_kib(*argv: str) -> int:
    environment = {name: value for name, value in os.environ.items() if name != "ARROW_DEFAULT_MEMORY_POOL"}
    done = subprocess.run(
        [sys.executable, "-c", PEAK, *argv], capture_output=True, text=True, timeout=600, env=environment
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return int(done.stderr.strip().splitlines()[-1])


@pytest.mark.slow
def test_ingest_out_needs_at_most_45_bytes_a_record_beyond_its_start_up(tmp_path):
    """The same CLI on 2,000 and on 600,000 records of one event: the difference in peak RSS is what the records
    cost (before: 67 bytes a record; now 14 held, the event's time sort ~20 more while its table is written, and
    tables gathered 16,384 rows at a time)."""
    small = two_cpu_trace(tmp_path / "small.dat", 2_000)
    large = two_cpu_trace(tmp_path / "large.dat", 600_000)
    start_up = peak_kib("ingest", str(tmp_path / "small.dat"), "--out", str(tmp_path / "small"))
    loaded = peak_kib("ingest", str(tmp_path / "large.dat"), "--out", str(tmp_path / "large"))
    per_record = (loaded - start_up) * 1024 / (large - small)
    assert per_record <= 45, f"{per_record:.1f} bytes a record ({start_up >> 10} -> {loaded >> 10} MiB)"
