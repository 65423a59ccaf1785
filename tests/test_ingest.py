"""Trace ingest: synthetic ring-buffer pages with known contents, and real traces recorded on this host."""

import os
import re
import shutil
import struct
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

from ticklab.host import HostChanges, facts
from ticklab.trace.ingest import (
    MISSED_EVENTS,
    MISSED_STORED,
    TraceFormatError,
    parse_event_format,
    read_trace,
    read_trace_dat,
)
from ticklab.trace.tracefs_stats import stats_lost_count

pytestmark = pytest.mark.xdist_group("machine")

FORMAT = """name: fake_event
ID: 42
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:char comm[16];\toffset:8;\tsize:16;\tsigned:0;
\tfield:int value;\toffset:24;\tsize:4;\tsigned:1;
\tfield:__data_loc char[] name;\toffset:28;\tsize:4;\tsigned:0;

print fmt: "comm=%s value=%d name=%s", REC->comm, REC->value, __get_str(name)
"""
HEADER_PAGE = (
    "\tfield: u64 timestamp;\toffset:0;\tsize:8;\tsigned:0;\n"
    "\tfield: local_t commit;\toffset:8;\tsize:8;\tsigned:1;\n"
    "\tfield: int overwrite;\toffset:8;\tsize:1;\tsigned:1;\n"
    "\tfield: char data;\toffset:16;\tsize:4080;\tsigned:0;\n"
)


def payload(pid: int, comm: str, value: int, name: str, pad_to: int = 0) -> bytes:
    dynamic = name.encode() + b"\0"
    body = struct.pack("<HBBi16sii", 42, 1, 0, pid, comm.encode(), value, (len(dynamic) << 16) | 32) + dynamic
    body += b"\0" * (max(pad_to, len(body)) - len(body))
    return body + b"\0" * (-len(body) % 4)


def record(delta: int, data: bytes) -> bytes:
    if len(data) <= 112:
        return struct.pack("<I", (delta << 5) | (len(data) // 4)) + data
    return struct.pack("<II", delta << 5, len(data) + 4) + data  # type_len 0: the length word counts itself


def page(timestamp: int, body: bytes, flags: int = 0, missed: int = 0) -> bytes:
    data = body + (struct.pack("<Q", missed) if flags & MISSED_STORED else b"")
    page_bytes = struct.pack("<QQ", timestamp, len(body) | flags) + data
    return page_bytes + b"\0" * (4096 - len(page_bytes))


def write_capture(directory: Path, cpu_pages: dict[int, bytes]) -> Path:
    (directory / "formats" / "fake" / "fake_event").mkdir(parents=True)
    (directory / "formats" / "fake" / "fake_event" / "format").write_text(FORMAT)
    (directory / "header_page").write_text(HEADER_PAGE)
    for cpu, pages in cpu_pages.items():
        (directory / f"cpu{cpu}.raw").write_bytes(pages)
        # read events: 0 — the kernel's count of what was read (these tests are not about truncation)
        (directory / f"cpu{cpu}.stats").write_text("entries: 0\noverrun: 0\nread events: 0\n")
    return directory


def test_xz_compressed_raw_pages_read_the_same(tmp_path):
    import lzma

    pages = page(1000, record(5, payload(11, "alpha", -7, "one")))
    plain = read_trace(write_capture(tmp_path / "plain", {0: pages}))
    packed = write_capture(tmp_path / "packed", {})
    (packed / "cpu0.raw.xz").write_bytes(lzma.compress(pages))
    (packed / "cpu0.stats").write_text("entries: 0\noverrun: 0\nread events: 1\n")
    assert read_trace(packed).table("fake:fake_event").equals(plain.table("fake:fake_event"))
    (packed / "cpu0.raw.xz").write_bytes(b"not xz")
    with pytest.raises(TraceFormatError, match="cpu0.raw.xz: not a valid .xz file"):
        read_trace(packed)


def test_format_files_parse_into_typed_fields():
    fmt = parse_event_format(FORMAT, "fake")
    assert (fmt.key, fmt.id) == ("fake:fake_event", 42)
    by_name = {f.name: f for f in fmt.fields}
    assert by_name["comm"].char_array and (by_name["comm"].offset, by_name["comm"].size) == (8, 16)
    assert by_name["name"].dynamic == "__data_loc" and by_name["value"].signed


def test_synthetic_pages_decode_exactly(tmp_path):
    time_extend = struct.pack("<II", (3 << 5) | 30, 1)  # adds (1 << 27) + 3
    padding = struct.pack("<II", (1 << 5) | 29, 8) + b"\xff" * 4  # a discarded record (array[0] counts itself): skipped
    first = page(
        1000,
        record(5, payload(11, "alpha", -7, "one"))
        + time_extend
        + record(2, payload(12, "beta", 8, "two"))
        + padding
        + record(1, payload(13, "gamma", 9, "three", pad_to=120)),
    )
    second = page(5000, record(0, payload(21, "delta", 1, "four")), flags=MISSED_EVENTS | MISSED_STORED, missed=7)
    trace = read_trace(write_capture(tmp_path, {0: first, 1: second}))
    frame = trace.table("fake:fake_event")
    assert frame["timestamp"].tolist() == [1005, 5000, 1005 + (1 << 27) + 3 + 2, 1005 + (1 << 27) + 3 + 2 + 1]
    assert frame["cpu"].tolist() == [0, 1, 0, 0]
    assert frame["common_pid"].tolist() == [11, 21, 12, 13]
    assert frame["comm"].tolist() == ["alpha", "delta", "beta", "gamma"]
    assert frame["value"].tolist() == [-7, 1, 8, 9]
    assert frame["name"].tolist() == ["one", "four", "two", "three"]
    assert trace.lost_events == {0: 0, 1: 7} and trace.total_lost == 7


def test_unreadable_traces_name_the_file(tmp_path):
    bad = tmp_path / "trace.dat"
    bad.write_bytes(b"not a trace")
    with pytest.raises(TraceFormatError, match=f"{bad}: not a trace-cmd trace.dat"):
        read_trace_dat(bad)
    capture = write_capture(tmp_path / "capture", {0: page(0, b"")[:1000]})
    with pytest.raises(TraceFormatError, match="CPU 0 data is 1000 bytes, not a whole number of 4096-byte pages"):
        read_trace(capture)
    with pytest.raises(TraceFormatError, match="not a ticklab tracefs capture"):
        read_trace(tmp_path / "capture" / "formats")


def test_lost_events_are_read_from_cpu_stats():
    stats = "entries: 10\noverrun: 3\ncommit overrun: 0\nbytes: 100\ndropped events: 2\nread events: 5\n"
    assert stats_lost_count(stats) == 5
    assert stats_lost_count("CPU: 0\n" + stats + "CPU: 1\n" + stats) == 10


def can_trace() -> str | None:
    if os.geteuid() != 0:
        return "needs root"
    if not Path("/sys/kernel/tracing").is_dir():
        return "no tracefs"
    return None


@pytest.mark.slow
@pytest.mark.skipif(can_trace() is not None, reason=str(can_trace()))
def test_a_real_tracefs_capture_matches_trace_cmd_report(tmp_path):
    from ticklab.capture.tracing import recorder

    mounts_before = facts.mounts(Path("/"))
    events = ["sched:sched_switch", "timer:hrtimer_expire_entry", "irq_vectors:local_timer_entry"]
    with HostChanges(tmp_path / "j.json", log=lambda _: None) as host:
        with recorder("tracefs", host, events, tmp_path / "trace") as recording:
            subprocess.run(["sh", "-c", "for i in $(seq 200); do true; done; sleep 0.3"], check=True)
    trace = read_trace(tmp_path / "trace")
    switches = trace.table("sched:sched_switch")
    assert len(switches) > 0 and switches["timestamp"].is_monotonic_increasing
    assert recording.result.lost_events == trace.total_lost == 0
    if shutil.which("trace-cmd") is None:
        pytest.skip("trace-cmd not installed: cannot compare with trace-cmd report")
    # trace-cmd restore turns the same per-CPU pages into a trace.dat; both readers must agree with it.
    cpus = sorted(str(p) for p in (tmp_path / "trace").glob("cpu*.raw"))
    with HostChanges(tmp_path / "j2.json", log=lambda _: None) as host, host.watching_mounts("trace-cmd"):
        from ticklab.capture.tracing import ensure_tracefs

        ensure_tracefs(host)

        def trace_cmd(*argv):
            return subprocess.run(["trace-cmd", *map(str, argv)], check=True, capture_output=True, text=True)

        trace_cmd("restore", "-c", "-o", tmp_path / "head.dat")
        trace_cmd("restore", "-i", tmp_path / "head.dat", "-o", tmp_path / "trace.dat", *cpus)
        report = trace_cmd("report", "-i", tmp_path / "trace.dat").stdout
        trace_cmd("convert", "-i", tmp_path / "trace.dat", "-o", tmp_path / "v6.dat", "--file-version", "6")
        compressed = subprocess.run(
            [
                "trace-cmd",
                "convert",
                "-i",
                str(tmp_path / "trace.dat"),
                "-o",
                str(tmp_path / "z.dat"),
                "--compression",
                "any",
            ],
            capture_output=True,
        )
    names = Counter(m.group(1) for m in re.finditer(r"^\s*.+?\[\d+\]\s+\S+:\s+(\w+):", report, re.M))
    assert {f"{k.split(':')[1]}": v for k, v in trace.counts().items()} == dict(names)
    from_dat = read_trace(tmp_path / "trace.dat")
    assert (tmp_path / "trace.dat").read_bytes()[10:12] == b"7\0"
    from_v6 = read_trace(tmp_path / "v6.dat")
    for key in trace.counts():
        pd.testing.assert_frame_equal(trace.table(key), from_dat.table(key))
        pd.testing.assert_frame_equal(trace.table(key), from_v6.table(key))
    if compressed.returncode == 0:  # trace-cmd's default for v7 where it has a compression plugin (zstd on Debian)
        assert (tmp_path / "z.dat").read_bytes()[18:22] != b"none"
        from_compressed = read_trace(tmp_path / "z.dat")
        for key in trace.counts():
            pd.testing.assert_frame_equal(trace.table(key), from_compressed.table(key))
    assert facts.mounts(Path("/")) == mounts_before, "trace-cmd's mounts must be put back"


@pytest.mark.skipif(can_trace() is not None, reason=str(can_trace()))
def test_a_tracefs_capture_on_the_mono_clock_stamps_events_in_clock_monotonic(tmp_path):
    """trace.clock mono (issue 26: gapdet's gaps matched to traced ticks): the events fall between two
    CLOCK_MONOTONIC readings taken around them; the global trace clock is left as it was."""
    from ticklab.capture.tracing import TracingError, recorder

    global_clock = Path("/sys/kernel/tracing/trace_clock").read_text()
    with HostChanges(tmp_path / "j.json", log=lambda _: None) as host:
        with recorder("tracefs", host, ["sched:sched_switch"], tmp_path / "trace", clock="mono"):
            before = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
            subprocess.run(["sleep", "0.2"], check=True)
            after = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        with pytest.raises(
            TracingError, match=r"trace_clock: this kernel has no trace clock 'sundial' \(it has: .*mono"
        ):
            with recorder("tracefs", host, ["sched:sched_switch"], tmp_path / "never", clock="sundial"):
                pass
    trace = read_trace(tmp_path / "trace")
    assert trace.clock == "mono"
    stamps = trace.table("sched:sched_switch")["timestamp"]
    assert ((stamps > before - 10**9) & (stamps < after + 10**9)).all()  # tracing starts a little before `before`
    assert ((stamps > before) & (stamps < after)).sum() >= 2  # sleep's switches out and back in
    assert Path("/sys/kernel/tracing/trace_clock").read_text() == global_clock


def trace_cmd_record_reason() -> str | None:
    if can_trace():
        return can_trace()
    from ticklab.capture.tracing import probe_trace_cmd

    # the journal needs a private directory (mode 0700): a world-writable /tmp is refused (issue 14)
    with (
        tempfile.TemporaryDirectory(prefix="ticklab-probe-") as scratch,
        HostChanges(Path(scratch) / "journal.json", log=lambda _: None) as host,
    ):
        works, why = probe_trace_cmd(host)
    return None if works else why


def test_the_trace_cmd_backend_records_a_trace_ingest_reads(tmp_path):
    from ticklab.capture.tracing import recorder

    # probed here, not at collection: the probe takes the host lock, and every test worker collects every module
    why = trace_cmd_record_reason()
    if why is not None:
        pytest.skip(f"trace-cmd backend: {why}")
    with HostChanges(tmp_path / "j.json", log=lambda _: None) as host:
        with recorder("trace-cmd", host, ["sched:sched_switch"], tmp_path / "trace") as recording:
            subprocess.run(["sh", "-c", "sleep 0.2; true"], check=True)
    assert recording.result.backend == "trace-cmd"
    trace = read_trace(tmp_path / "trace")
    assert len(trace.table("sched:sched_switch")) > 0
    assert recording.result.lost_events == trace.total_lost
