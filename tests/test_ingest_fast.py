"""The fast trace reader: the same tables as the reference reader on every bundled trace, compressed
trace.dat v7 read like the uncompressed file, and bad input refused with one TraceFormatError line."""

import hashlib
import json
import re
import shutil
import struct
import subprocess
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import reference_ingest
import tracedat
from conftest import REPO
from ticklab.trace import ingest, ringbuf
from ticklab.trace.ingest import TraceFormatError, read_trace

COMPRESSED = REPO / "tests" / "data" / "compressed"
# the trace the compressed fixtures were converted from, kept xz-packed (tests/data/compressed/README.md)
COMPRESSED_SOURCE = COMPRESSED / "source-trace.dat.xz"
SOURCE_SHA256 = "f8fd2a3092815da1d4648f99a38c36bceb746a0302786e9a0c1f931c2c02ce67"


def bundled_traces() -> list[Path]:
    roots = {p.parent for p in (REPO / "traces").rglob("trace.dat*")}
    roots |= {p.parent for p in (REPO / "traces").rglob("header_page")}
    return sorted(roots)


def assert_same_trace(fast, reference) -> None:
    assert list(fast.events) == list(reference.events)
    for key, frame in reference.events.items():
        pd.testing.assert_frame_equal(fast.events[key], frame)
    assert fast.counts() == reference.counts()
    assert (fast.lost_events, fast.stats_lost, fast.total_lost) == (
        reference.lost_events,
        reference.stats_lost,
        reference.total_lost,
    )
    assert (fast.clock, fast.page_size) == (reference.clock, reference.page_size)


def _size(trace: Path) -> int:
    return sum(f.stat().st_size for f in trace.rglob("*") if f.is_file()) if trace.is_dir() else trace.stat().st_size


def first_of_each_condition(traces: list[Path]) -> set[Path]:
    """The smallest trace of each kind (a run's own, its gap detector's) in each condition of each bundle, the ones
    make check reads: every kernel and tracer the bundles hold, in a few seconds of CPU where all traces take over
    30 s, half of make check's minute on two cores. make test reads them all."""
    first = {}
    for trace in traces:
        run = next((parent for parent in trace.parents if parent.name.startswith("run-")), trace)
        bundle = run.parent.parent
        try:
            runs = json.loads((bundle / "manifest.json").read_text())["runs"]
        except (OSError, ValueError):  # not a sealed bundle (a repack's copy being written): its first trace
            runs = []
        condition = next((r["condition"] for r in runs if r["run"] == run.name), None)
        key = (bundle, condition, trace.relative_to(run))
        if key not in first or _size(trace) < _size(first[key]):
            first[key] = trace
    return set(first.values())


IN_MAKE_CHECK = first_of_each_condition(bundled_traces())


@pytest.mark.parametrize(
    "trace",
    [trace if trace in IN_MAKE_CHECK else pytest.param(trace, marks=pytest.mark.slow) for trace in bundled_traces()],
    ids=lambda p: str(p.relative_to(REPO / "traces")),
)
def test_fast_reader_equals_the_reference_on_every_bundled_trace(trace):
    assert_same_trace(read_trace(trace), reference_ingest.read_trace(trace))


def test_the_python_walk_equals_the_compiled_one(monkeypatch):
    if not ringbuf.COMPILED:
        pytest.skip("ticklab.trace._ringbuf is not built: only the Python walk is there")
    smallest = min(bundled_traces(), key=lambda p: sum(f.stat().st_size for f in p.iterdir() if f.is_file()))
    compiled = read_trace(smallest)
    _ = compiled.events  # decoded now, by the compiled walk, before the Python one replaces it
    for name in ("walk", "gather", "cstrings"):
        monkeypatch.setattr(ringbuf, name, getattr(ringbuf, f"py_{name}"))
    assert_same_trace(read_trace(smallest), compiled)


def trace_cmd_counts(path: Path) -> Counter:
    done = subprocess.run(["trace-cmd", "report", "-i", str(path)], capture_output=True, text=True, timeout=120)
    if done.returncode:
        pytest.skip(f"trace-cmd report cannot read {path.name}: {done.stderr.strip()[:200]}")
    return Counter(m.group(1) for m in re.finditer(r"^\s*.+?\[\d+\]\s+\S+:\s+(\w+):", done.stdout, re.M))


@pytest.mark.parametrize("name", ["trace-zstd.dat", "trace-zlib.dat"])
def test_compressed_v7_reads_like_the_uncompressed_file(name, tmp_path):
    import lzma

    compressed = read_trace(COMPRESSED / name)
    assert (COMPRESSED / name).read_bytes()[18:22] == name[6:10].encode()
    assert sum(compressed.counts().values()) > 1000
    assert_same_trace(compressed, read_trace(COMPRESSED / "trace-zstd.dat"))
    source = tmp_path / "trace.dat"
    source.write_bytes(lzma.decompress(COMPRESSED_SOURCE.read_bytes()))
    assert hashlib.sha256(source.read_bytes()).hexdigest() == SOURCE_SHA256
    assert_same_trace(compressed, reference_ingest.read_trace(source))


@pytest.mark.skipif(shutil.which("trace-cmd") is None, reason="trace-cmd not installed")
def test_ingest_of_a_stock_zstd_trace_matches_trace_cmd_report_per_event(capsys):
    from ticklab.cli import main

    assert main(["ingest", str(COMPRESSED / "trace-zstd.dat")]) == 0
    printed = dict(re.findall(r"^\w+:(\w+): (\d+) events$", capsys.readouterr().out, re.M))
    assert {k: int(v) for k, v in printed.items()} == dict(trace_cmd_counts(COMPRESSED / "trace-zstd.dat"))


def test_written_parquet_holds_the_tables(tmp_path):
    trace = read_trace(COMPRESSED / "trace-zstd.dat")
    written = ingest.write_tables(trace, tmp_path)
    assert [p.name for p in written] == [k.replace(":", "__") + ".parquet" for k in sorted(trace.counts())]
    for key in trace.counts():
        pd.testing.assert_frame_equal(
            pd.read_parquet(tmp_path / (key.replace(":", "__") + ".parquet")), trace.table(key)
        )


# -- synthetic files: what was written is what is read, in every container ----------------------------------
EVENTS = st.lists(
    st.tuples(
        st.integers(0, 5000),
        st.integers(-(2**31), 2**31 - 1),
        st.text(st.characters(min_codepoint=32, max_codepoint=0x2FF), max_size=5),
        st.integers(-(2**31), 2**31 - 1),
        st.text(st.characters(min_codepoint=1, max_codepoint=0x10FFFF, blacklist_categories=("Cs",)), max_size=12),
    ),
    min_size=0,
    max_size=300,
)
FAST = settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def containers(directory: Path, cpu_pages: dict, stats: dict) -> dict[str, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    return {
        "tracefs": tracedat.write_tracefs(directory / "tracefs", cpu_pages, stats),
        "v6": tracedat.write_v6(directory / "v6.dat", cpu_pages, stats),
        "v7": tracedat.write_v7(directory / "v7.dat", cpu_pages, "none", stats),
        "v7-zstd": tracedat.write_v7(directory / "v7z.dat", cpu_pages, "zstd", stats),
        "v7-zlib": tracedat.write_v7(directory / "v7l.dat", cpu_pages, "zlib", stats),
    }


def encoded(text: str, size: int) -> str:
    """What a fixed char[size] field holds of text (cut at the byte limit, then at the first NUL)."""
    return text.encode()[:size].split(b"\0", 1)[0].decode(errors="replace")


@FAST
@given(cpu0=EVENTS, cpu1=EVENTS)
def test_records_read_back_the_same_from_every_container(tmp_path_factory, cpu0, cpu1):
    cpu_pages = {0: tracedat.pages_for(cpu0), 1: tracedat.pages_for(cpu1, start=500)}
    stats = {0: tracedat.stats_text(0, len(cpu0)), 1: tracedat.stats_text(1, len(cpu1))}
    paths = containers(tmp_path_factory.mktemp("c"), cpu_pages, stats)
    references = {kind: reference_ingest.read_trace(paths[kind]) for kind in ("tracefs", "v6", "v7")}
    written = sorted(
        [(1000 + sum(e[0] for e in cpu0[: i + 1]), 0, i, e) for i, e in enumerate(cpu0)]
        + [(500 + sum(e[0] for e in cpu1[: i + 1]), 1, i, e) for i, e in enumerate(cpu1)],
        key=lambda row: row[0],
    )
    for kind, path in paths.items():
        trace = read_trace(path)
        if not written:
            assert trace.counts() == {}, kind
            continue
        frame = trace.table("fake:fake_event")
        assert frame["timestamp"].tolist() == [row[0] for row in written], kind
        assert frame["cpu"].tolist() == [row[1] for row in written], kind
        assert frame["common_pid"].tolist() == [row[3][1] for row in written], kind
        assert frame["value"].tolist() == [row[3][3] for row in written], kind
        assert frame["comm"].tolist() == [encoded(row[3][2], 16) for row in written], kind
        assert frame["name"].tolist() == [row[3][4].split("\0")[0] for row in written], kind
        assert_same_trace(trace, references[kind[:2] if kind.startswith("v7") else kind])


# -- bad input: one TraceFormatError, never another exception, a hang or fewer events ---------------------
def read_all(path: Path):
    trace = read_trace(path)
    trace.arrow_tables()
    return trace


def sample_files(directory: Path) -> dict[str, Path]:
    cpu0 = [(7, 100 + i, f"t{i}", i, "x" * (i % 9)) for i in range(150)]
    cpu1 = [(5, 200 + i, f"u{i}", -i, "y" * (i % 5)) for i in range(90)]
    cpu_pages = {0: tracedat.pages_for(cpu0), 1: tracedat.pages_for(cpu1)}
    return containers(directory, cpu_pages, {0: tracedat.stats_text(0, 150), 1: tracedat.stats_text(1, 90)})


@pytest.fixture(scope="module")
def samples(tmp_path_factory):
    return sample_files(tmp_path_factory.mktemp("samples"))


def mutate(data: bytes, edits: list[tuple[int, int]], cut: int | None) -> bytes:
    out = bytearray(data)
    for where, value in edits:
        out[where % len(out)] = value
    return bytes(out[:cut]) if cut is not None else bytes(out)


@settings(
    max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    kind=st.sampled_from(["v6", "v7", "v7-zstd", "v7-zlib"]),
    edits=st.lists(st.tuples(st.integers(0, 2**20), st.integers(0, 255)), max_size=6),
    cut=st.none() | st.integers(0, 2**16),
)
@pytest.mark.timeout(300)
@pytest.mark.slow
def test_mutated_trace_dat_gives_a_table_or_one_trace_format_error(samples, tmp_path_factory, kind, edits, cut):
    target = tmp_path_factory.mktemp("m") / "trace.dat"
    target.write_bytes(mutate(samples[kind].read_bytes(), edits, cut))
    try:
        read_all(target)
    except TraceFormatError as exc:
        assert str(exc).startswith(str(target)) and "\n" not in str(exc)


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(["v6", "v7", "tracefs"]), cut_pages=st.integers(1, 8))
def test_a_trace_cut_short_is_refused_not_read_with_fewer_events(samples, tmp_path_factory, kind, cut_pages):
    """trace-cmd refuses a truncated trace.dat; a tracefs cpuN.raw cut at a page boundary is caught by cpuN.stats."""
    directory = tmp_path_factory.mktemp("t")
    if kind == "tracefs":
        target = directory / "capture"
        shutil.copytree(samples["tracefs"], target)
        raw = target / "cpu0.raw"
        data = raw.read_bytes()
        raw.write_bytes(data[: max(0, len(data) - cut_pages * tracedat.PAGE)])
        expected = "cpu0.raw holds .* events but cpu0.stats says 150 were read"
    else:
        target = directory / "trace.dat"
        data = samples[kind].read_bytes()
        target.write_bytes(data[: len(data) - cut_pages * 512])
        expected = "truncated"
    with pytest.raises(TraceFormatError, match=expected):
        read_all(target)


def test_a_tracefs_capture_without_its_stats_is_refused(samples, tmp_path):
    target = tmp_path / "capture"
    shutil.copytree(samples["tracefs"], target)
    (target / "cpu0.stats").unlink()
    with pytest.raises(TraceFormatError, match=r"cpu0.stats: missing .* nothing tells whether cpu0.raw is complete$"):
        read_all(target)


def test_a_cycle_in_the_v7_options_chain_is_refused(samples, tmp_path):
    data = bytearray(samples["v7"].read_bytes())
    first = struct.unpack_from("<Q", data, 18 + len(b"none\0\0"))[0]
    done = data.rindex(struct.pack("<HI", 0, 8) + struct.pack("<Q", 0))
    data[done + 6 : done + 14] = struct.pack("<Q", first)  # the last DONE points back at the first options section
    (tmp_path / "loop.dat").write_bytes(bytes(data))
    with pytest.raises(TraceFormatError, match=f"loop.dat: the options sections loop back to byte {first}"):
        read_trace(tmp_path / "loop.dat")


def test_absurd_sizes_and_odd_inputs_are_one_line_errors(samples, tmp_path):
    data = bytearray(samples["v6"].read_bytes())
    at = data.index(b"header_page\0") + 12
    data[at : at + 8] = struct.pack("<Q", 228 << 30)  # a 228 GiB header
    (tmp_path / "huge.dat").write_bytes(bytes(data))
    with pytest.raises(
        TraceFormatError, match=rf"huge.dat: truncated \(wanted {228 << 30} more bytes.* at byte {at + 8}"
    ):
        read_trace(tmp_path / "huge.dat")
    data = bytearray(samples["v6"].read_bytes())
    at = data.index(b"name: fake_event")
    data[at + 6] = 0xFF  # not UTF-8
    (tmp_path / "latin.dat").write_bytes(bytes(data))
    with pytest.raises(TraceFormatError, match=f"latin.dat: text that is not UTF-8 .* at byte {at + 6}"):
        read_trace(tmp_path / "latin.dat")
    (tmp_path / "dir.dat").mkdir()
    with pytest.raises(TraceFormatError, match="dir.dat: a directory, not a regular file; refused$"):
        ingest.read_trace_dat(tmp_path / "dir.dat")
    (tmp_path / "empty.dat").write_bytes(b"")
    with pytest.raises(TraceFormatError, match="empty.dat: not a trace-cmd trace.dat"):
        read_trace(tmp_path / "empty.dat")


def test_large_compressed_data_is_decompressed_to_a_mapped_temporary_file(monkeypatch):
    in_memory = read_trace(COMPRESSED / "trace-zstd.dat")
    monkeypatch.setattr(ingest, "IN_MEMORY", 0)
    spilled = read_trace(COMPRESSED / "trace-zstd.dat")
    assert type(spilled._records.buffer).__name__ == "mmap"
    assert_same_trace(spilled, in_memory)


@settings(
    max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    name=st.sampled_from(
        ["cpu0.raw", "cpu1.raw", "header_page", "formats/fake/fake_event/format", "cpu0.stats", "page_size"]
    ),
    edits=st.lists(st.tuples(st.integers(0, 2**16), st.integers(0, 255)), max_size=6),
    cut=st.none() | st.integers(0, 2**14),
)
@pytest.mark.timeout(300)
def test_a_mutated_tracefs_capture_gives_tables_or_one_trace_format_error(samples, tmp_path_factory, name, edits, cut):
    target = tmp_path_factory.mktemp("f") / "capture"
    shutil.copytree(samples["tracefs"], target)
    if name == "page_size":
        (target / name).write_text("4096\n")
    data = (target / name).read_bytes()
    if data:
        (target / name).write_bytes(mutate(data, edits, cut))
    try:
        read_all(target)
    except TraceFormatError as exc:
        assert "\n" not in str(exc) and str(target) in str(exc)


def test_a_tracefs_capture_missing_a_cpu_file_its_stats_name_is_refused(samples, tmp_path):
    target = tmp_path / "capture"
    shutil.copytree(samples["tracefs"], target)
    (target / "cpu1.raw").unlink()
    with pytest.raises(
        TraceFormatError,
        match=r"cpu1.raw: missing, but cpu1.stats is there .* CPU 1's events would "
        r"be absent$",
    ):
        read_trace(target)


def test_a_missing_cpu_file_is_refused_whatever_its_stats_say(samples, tmp_path):
    """Issue 27 item 10: cpu0.raw gone and cpu0.stats saying 'entries: 1' (events left in the buffer) loaded as a
    trace without CPU 0."""
    target = tmp_path / "capture"
    shutil.copytree(samples["tracefs"], target)
    (target / "cpu0.raw").unlink()
    stats = (target / "cpu0.stats").read_text()
    (target / "cpu0.stats").write_text(stats.replace("entries: 0", "entries: 1"))
    assert "entries: 1" in (target / "cpu0.stats").read_text()
    with pytest.raises(TraceFormatError, match=r"cpu0.raw: missing, but cpu0.stats is there"):
        read_trace(target)
