"""Issue 40, item 2: the trace readers refuse what they cannot account for, in one line naming the file, found by a
fuzzing campaign against trace-cmd's counts (its facts 5, 6, 8, 9, 10 and the event names):

5  a trace.dat v7 whose buffer option lists one CPU number twice (CPU 1's events were filed under CPU 0, and the
   first entry's lost-event count replaced);
6  a trace.dat v7 without a buffer option for the top-level instance (0 events and "lost events: 0", exit 0);
8  memory: a small cpuN.raw.xz that unpacks to gigabytes, a sparse cpuN.raw of gigabytes, a compressed trace.dat
   whose chunks claim more than it can hold (each took ~2 bytes of memory a byte, 8 GiB a file, any number of files);
9  a cpuN.stats without 'read events:' (the one truncation check was skipped: a cpu1.raw cut to one page gave 416 of
   1718 local_timer_entry events, exit 0);
10 ``ingest --out`` of a bundled hrtick capture (ftrace:function's zero-size ``unsigned long args[]``: nothing was
   written and the message blamed the output file);
   and event names with control or bidi characters, which were printed as they are.
"""

import json
import lzma
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import tracedat
from conftest import REPO
from test_ingest import FORMAT, page, payload, record
from test_ingest_fast import COMPRESSED_SOURCE, read_all
from ticklab.cli import main
from ticklab.trace import ingest, rawfile
from ticklab.trace.ingest import TraceFormatError, read_trace

HRTICK_RUN = (
    REPO / "traces/guest-tcg-2vcpu-6.12.117-ticklab-7.2.13-ticklab-on-amd-epyc-2c-6.18.44-fc-v657-vm/hrtick/"
    "20261124T190845Z-guest-hackbench/raw/run-004/trace"
)


def _u16(data, at):
    return struct.unpack_from("<H", data, at)[0]


def _u32(data, at):
    return struct.unpack_from("<I", data, at)[0]


def _u64(data, at):
    return struct.unpack_from("<Q", data, at)[0]


def v7_options(data: bytes) -> list[tuple[int, int, int]]:
    """(offset, id, payload size) of every option in the uncompressed options sections of a trace.dat v7, read from
    trace-cmd.dat(5) independently of ticklab's reader."""
    position = data.index(b"\0", data.index(b"\0", 18) + 1) + 1  # after the compression name and version
    next_options, found = _u64(data, position), []
    while next_options and not _u16(data, next_options + 2) & 1:
        at, next_options = next_options + 16, 0
        while True:
            option, size = _u16(data, at), _u32(data, at + 2)
            found.append((at, option, size))
            if option == 0:
                next_options = _u64(data, at + 6)
                break
            at += 6 + size
    return found


def buffer_entries(data: bytes) -> tuple[int, int]:
    """(offset of the top-level buffer option's CPU count, its value): after the flyrecord offset, the instance name
    (empty), the clock and, in newer files, the page size."""
    for at, option, size in v7_options(data):
        if option == 3 and data[at + 14] == 0:  # payload: u64 flyrecord, then the instance name ("" for the top level)
            end = at + 6 + size
            for count_at in range(at + 15, end - 3):
                count = _u32(data, count_at)
                if count and count_at + 4 + 20 * count == end:
                    return count_at, count
    raise AssertionError("no top-level buffer option found")


@pytest.fixture(scope="module")
def real_v7(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("real") / "source-trace.dat"
    path.write_bytes(lzma.decompress(COMPRESSED_SOURCE.read_bytes()))
    return path


def two_cpus(directory: Path, compression: str = "none") -> Path:
    cpu0 = [(7, 100 + i, f"t{i}", i, "x") for i in range(150)]
    cpu1 = [(5, 200 + i, f"u{i}", -i, "y") for i in range(90)]
    return tracedat.write_v7(
        directory / f"v7-{compression}.dat",
        {0: tracedat.pages_for(cpu0), 1: tracedat.pages_for(cpu1)},
        compression,
        {0: tracedat.stats_text(0, 150), 1: tracedat.stats_text(1, 90)},
    )


# -- fact 5: one CPU number twice in the buffer option ------------------------------------------------------------
@pytest.mark.parametrize("source", ["trace-cmd", "none", "zstd", "zlib"])
def test_a_v7_buffer_option_naming_one_cpu_twice_is_refused(real_v7, tmp_path, source):
    path = real_v7 if source == "trace-cmd" else two_cpus(tmp_path, source)
    intact = read_trace(path)
    assert len(intact.lost_events) >= 2 and sum(intact.counts().values()) > 0
    data = bytearray(path.read_bytes())
    count_at, count = buffer_entries(data)
    assert [_u32(data, count_at + 4 + 20 * k) for k in range(count)] == list(range(count))
    struct.pack_into("<I", data, count_at + 4 + 20, 0)  # the second entry now says CPU 0 too
    (tmp_path / "twice.dat").write_bytes(bytes(data))
    with pytest.raises(
        TraceFormatError,
        match=r"twice.dat: a second data entry for CPU 0 in the buffer option at byte "
        r"\d+$",
    ):
        read_all(tmp_path / "twice.dat")


def test_two_stats_options_for_one_cpu_are_refused(tmp_path):
    path = tracedat.write_v6(
        tmp_path / "v6.dat",
        {0: tracedat.pages_for([(1, 1, "a", 1, "b")]), 1: tracedat.pages_for([(1, 1, "a", 1, "b")])},
        {0: tracedat.stats_text(0, 1), 1: tracedat.stats_text(0, 1)},
    )
    with pytest.raises(TraceFormatError, match=r"v6.dat: two stats options for CPU 0"):
        read_trace(path)


# -- fact 6: no buffer option for the top-level instance ----------------------------------------------------------
@pytest.mark.parametrize("source", ["trace-cmd", "none", "zstd", "zlib"])
def test_a_v7_without_a_top_level_buffer_option_is_refused(real_v7, tmp_path, source):
    path = real_v7 if source == "trace-cmd" else two_cpus(tmp_path, source)
    data = bytearray(path.read_bytes())
    buffers = [at for at, option, _ in v7_options(data) if option == 3]
    assert buffers
    for at in buffers:
        struct.pack_into("<H", data, at, 0x7FF0)  # an option id no reader knows: skipped
    (tmp_path / "nobuffer.dat").write_bytes(bytes(data))
    with pytest.raises(
        TraceFormatError,
        match=r"nobuffer.dat: no buffer option for the top-level instance: nothing "
        r"says where the CPU data is, so its events cannot be counted$",
    ):
        read_all(tmp_path / "nobuffer.dat")


def test_the_cli_says_so_in_one_line_and_exits_2(real_v7, tmp_path, capsys):
    data = bytearray(real_v7.read_bytes())
    for at, option, _ in v7_options(data):
        if option == 3:
            struct.pack_into("<H", data, at, 0x7FF0)
    (tmp_path / "nobuffer.dat").write_bytes(bytes(data))
    assert main(["ingest", str(tmp_path / "nobuffer.dat")]) == 2
    captured = capsys.readouterr()
    assert "lost events" not in captured.out and len(captured.err.strip().splitlines()) == 1


# -- fact 9: a cpuN.stats without 'read events:' -------------------------------------------------------------------
def cut_capture(tmp_path: Path, keep_read_events: bool) -> Path:
    capture = tmp_path / "capture"
    shutil.copytree(HRTICK_RUN, capture)
    pages = lzma.decompress((capture / "cpu1.raw.xz").read_bytes())
    (capture / "cpu1.raw.xz").unlink()
    (capture / "cpu1.raw").write_bytes(pages[:4096])  # cut to its first page
    if not keep_read_events:
        stats = (capture / "cpu1.stats").read_text()
        (capture / "cpu1.stats").write_text(
            "".join(line for line in stats.splitlines(keepends=True) if not line.startswith("read events"))
        )
    return capture


def test_a_stats_file_without_read_events_is_refused_so_a_cut_raw_file_is_never_read_short(tmp_path):
    whole = read_trace(HRTICK_RUN).counts()["irq_vectors:local_timer_entry"]
    assert whole > 1000
    capture = cut_capture(tmp_path, keep_read_events=False)
    with pytest.raises(
        TraceFormatError,
        match=r"capture/cpu1.stats: no 'read events:' line, so nothing tells whether "
        r"cpu1.raw is complete \(its pages' headers describe only the pages "
        r"there\)$",
    ):
        read_trace(capture)


def test_with_its_read_events_the_same_cut_is_refused_as_truncated(tmp_path):
    with pytest.raises(
        TraceFormatError,
        match=r"cpu1.raw holds \d+ events but cpu1.stats says 17061 were read: the "
        "file is truncated",
    ):
        read_trace(cut_capture(tmp_path, keep_read_events=True))


# -- fact 10: ingest --out of a bundled hrtick capture -----------------------------------------------------------
def test_ingest_out_of_a_bundled_hrtick_capture_writes_every_table(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["ingest", str(HRTICK_RUN), "--out", str(out)]) == 0
    trace = read_trace(HRTICK_RUN)
    assert sorted(p.name for p in out.iterdir()) == sorted(k.replace(":", "__") + ".parquet" for k in trace.keys())
    function = pq.read_table(out / "ftrace__function.parquet")
    assert "args" not in function.column_names and function.num_rows == trace.counts()["ftrace:function"]
    left_out = json.loads(function.schema.metadata[ingest.NOT_INGESTED])
    assert list(left_out) == ["args"] and left_out["args"].startswith("unsigned long args[]: size 0")
    assert function.equals(
        trace.arrow("ftrace:function").drop_columns(["args"]).replace_schema_metadata(function.schema.metadata)
    )
    for key in trace.keys():
        if key != "ftrace:function":
            table = pq.read_table(out / (key.replace(":", "__") + ".parquet"))
            assert table.schema.metadata is None or ingest.NOT_INGESTED not in table.schema.metadata
            assert table.equals(trace.arrow(key).replace_schema_metadata(table.schema.metadata))


def test_a_table_parquet_cannot_store_is_blamed_on_its_column_not_the_output_file(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(ingest, "not_ingested", lambda fmt: {})  # as before: the zero-size column kept
    out = tmp_path / "out"
    assert main(["ingest", str(HRTICK_RUN), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"ticklab ingest: {HRTICK_RUN}: event ftrace:function: its column args (fixed_size_binary[0]) cannot "
        "be stored in Parquet (Invalid FIXED_LEN_BYTE_ARRAY length: 0); ftrace__function.parquet was not "
        "written"
    )
    assert not any(p.name.startswith("ftrace__function") for p in out.iterdir())


# -- event names ---------------------------------------------------------------------------------------------------
def test_event_names_with_control_or_bidi_characters_are_shown_escaped(tmp_path, capsys):
    capture = tmp_path / "capture"
    tracedat.write_tracefs(capture, {0: tracedat.pages_for([(1, 1, "a", 1, "b")])}, {0: tracedat.stats_text(0, 1)})
    fmt = capture / "formats" / "fake" / "fake_event" / "format"
    fmt.write_text(FORMAT.replace("name: fake_event", "name: fake\x1b[2J\u202eevent"))
    shown_name = "fake:fake\\x1b[2J\\u202eevent"
    assert list(read_trace(capture).counts()) == [shown_name]
    assert main(["ingest", str(capture)]) == 0
    out = capsys.readouterr().out
    assert f"{shown_name}: 1 events" in out and "\x1b" not in out and "\u202e" not in out


def test_two_recorded_types_of_one_name_are_refused(tmp_path):
    capture = tmp_path / "capture"
    tracedat.write_tracefs(capture, {0: tracedat.pages_for([(1, 1, "a", 1, "b")])}, {0: tracedat.stats_text(0, 2)})
    twin = capture / "formats" / "fake" / "fake_twin"
    twin.mkdir()
    (twin / "format").write_text(FORMAT.replace("ID: 42", "ID: 43"))  # the same name:, another type id
    other = payload(1, "a", 2, "b")
    (capture / "cpu0.raw").write_bytes(
        page(1000, record(1, payload(1, "a", 1, "b")) + record(1, struct.pack("<H", 43) + other[2:]))
    )
    with pytest.raises(TraceFormatError, match=r"capture: event fake:fake_event has records of two types, 42 and 43"):
        read_trace(capture)


# -- fact 8: memory ------------------------------------------------------------------------------------------------
def zero_pages_xz(megabytes: int) -> bytes:
    """An .xz of ``megabytes`` MiB of empty ring-buffer pages: one stream of 1 MiB repeated (concatenated streams are
    one valid .xz), ~250 bytes a MiB."""
    return lzma.compress(b"\0" * (1 << 20)) * megabytes


def bomb_capture(tmp_path: Path, name: str, megabytes: int) -> Path:
    capture = tmp_path / name
    shutil.copytree(HRTICK_RUN, capture)
    (capture / "cpu1.raw.xz").write_bytes(zero_pages_xz(megabytes))
    return capture


CAPPED = """
import resource, sys
limit = int(float(sys.argv.pop(1)) * (1 << 30))
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
from ticklab.cli import main
status = main(sys.argv[1:])
# VmHWM is this process's own address space's peak; ru_maxrss keeps the parent's across vfork and exec (a big pytest
# worker's 497 MiB on CI)
hwm = [line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM:")]
print(hwm[0], file=sys.stderr)
sys.exit(status)
"""


def run_capped(argv: list[str], limit_gib: float = 2.5) -> tuple[int, list[str], int]:
    """``ticklab argv`` in a child whose address space is capped (RLIMIT_AS): (exit status, stderr lines, peak RSS
    in KiB)."""
    done = subprocess.run(
        [sys.executable, "-c", CAPPED, str(limit_gib), *argv],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "TICKLAB_TRACEBACK": ""},
    )
    lines = done.stderr.strip().splitlines()
    assert lines and lines[-1].isdigit(), done.stderr[-2000:]
    return done.returncode, lines[:-1], int(lines[-1])


@pytest.mark.timeout(600)
def test_an_xz_bomb_in_a_capture_is_refused_in_one_line_within_bounded_memory(tmp_path):
    """153 KB of cpu1.raw.xz took 2.1 GB and 13.6 s; now it is refused once it unpacks past 1024 times its size."""
    capture = bomb_capture(tmp_path, "bomb", 2100)
    packed = (capture / "cpu1.raw.xz").stat().st_size
    assert packed < 1 << 20
    status, err, peak_kib = run_capped(["ingest", str(capture)])
    limit = rawfile.unpack_limit(
        packed, ingest.TRACE_DATA_LIMIT - len(lzma.decompress((HRTICK_RUN / "cpu0.raw.xz").read_bytes()))
    )
    assert (status, err) == (
        2,
        [
            f"ticklab ingest: {capture / 'cpu1.raw.xz'}: unpacks to more than the {limit} bytes "
            f"ticklab reads (an .xz unpacks to at most {rawfile.UNPACK_RATIO} times its {packed} "
            "bytes)"
        ],
    )
    assert peak_kib < 400 << 10, f"peak RSS {peak_kib >> 10} MiB"


@pytest.mark.timeout(600)
def test_a_sparse_raw_file_beyond_the_trace_limit_is_refused_before_it_is_read(tmp_path):
    capture = tmp_path / "sparse"
    shutil.copytree(HRTICK_RUN, capture)
    (capture / "cpu1.raw.xz").unlink()
    with open(capture / "cpu1.raw", "wb") as handle:
        handle.truncate(ingest.TRACE_DATA_LIMIT + 4096)
    status, err, peak_kib = run_capped(["ingest", str(capture)])
    assert status == 2 and len(err) == 1
    assert err[0].startswith(f"ticklab ingest: {capture / 'cpu1.raw'}: larger than the ") and err[0].endswith(
        f"bytes ticklab reads of it (a trace's CPU data is at most {ingest.TRACE_DATA_LIMIT} bytes in all)"
    )
    assert peak_kib < 400 << 10, f"peak RSS {peak_kib >> 10} MiB"


def test_a_capture_within_the_limits_unpacks_beyond_memory_into_a_mapped_file(tmp_path, monkeypatch):
    """What is unpacked past IN_MEMORY goes to an unlinked temporary file, mapped: the same tables either way."""
    in_memory = read_trace(HRTICK_RUN)
    monkeypatch.setattr(ingest, "IN_MEMORY", 1 << 16)
    spilled = read_trace(HRTICK_RUN)
    assert type(spilled._records.buffer).__name__ == "mmap"
    assert spilled.counts() == in_memory.counts()
    for key in in_memory.keys():
        assert spilled.arrow(key).equals(in_memory.arrow(key))


def test_a_compressed_trace_dat_whose_chunks_claim_too_much_is_refused_before_decompressing(tmp_path):
    pages = b"".join(page(1000 + k, b"") for k in range(8192))  # 32 MiB of empty pages: zstd packs them to ~1 KB
    path = tracedat.write_v7(
        tmp_path / "claims.dat", {0: pages}, "zstd", {0: tracedat.stats_text(0, 0)}, chunk_pages=64
    )
    size = path.stat().st_size
    assert 1024 * size < 32 << 20
    with pytest.raises(
        TraceFormatError,
        match=rf"claims.dat: its CPU data's chunk headers say {32 << 20} bytes "
        rf"decompressed, beyond what ticklab decompresses of a {size}-byte "
        rf"trace.dat \(at most 1024 times its size, {ingest.TRACE_DATA_LIMIT} "
        r"bytes in all\)$",
    ):
        read_trace(path)


@pytest.mark.parametrize("tail", [b"", b"not a stream"], ids=["by its index", "while unpacking"])
def test_a_trace_dat_xz_bomb_is_refused(tmp_path, tail):
    """Refused from what its streams' indexes state, before a byte is unpacked; where they cannot be read (bytes after
    the last stream, which lzma ignores), once the unpacking passes the bound."""
    (tmp_path / "trace.dat.xz").write_bytes(zero_pages_xz(64) + tail)
    with pytest.raises(
        TraceFormatError,
        match=r"trace.dat.xz: unpacks to more than the \d+ bytes ticklab reads \(an "
        r".xz unpacks to at most 1024 times its \d+ bytes\)$",
    ):
        read_trace(tmp_path)


@pytest.mark.timeout(600)
@pytest.mark.slow
def test_an_xz_bomb_whose_index_cannot_be_read_is_refused_within_bounded_memory(tmp_path):
    capture = bomb_capture(tmp_path, "bomb", 2100)
    with open(capture / "cpu1.raw.xz", "ab") as handle:
        handle.write(b"trailing bytes that are no stream")
    status, err, peak_kib = run_capped(["ingest", str(capture)])
    assert status == 2 and len(err) == 1 and "cpu1.raw.xz: unpacks to more than the" in err[0], err
    assert peak_kib < 400 << 10, f"peak RSS {peak_kib >> 10} MiB"


def test_the_limits_are_the_declared_ones():
    """SECURITY.md states them: 2 GiB of CPU data a trace; an .xz or a compressed trace.dat at most 1024 times its
    size (at least 16 MiB)."""
    assert ingest.TRACE_DATA_LIMIT == 2 << 30
    assert (rawfile.UNPACK_RATIO, rawfile.UNPACK_FLOOR) == (1024, 16 << 20)
