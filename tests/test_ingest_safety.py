"""Ingest as root on someone else's files (issue 27, items 1, 4, 7, 8, 9): no write through a link planted in
--out, no read through a link or of a FIFO in a capture directory, and trace.dat damage that used to lose events
in silence (a zlib chunk longer than its stated size, a lowered v6 CPU count) refused with one line."""

import os
import shutil
import struct
import zlib
from pathlib import Path

import pytest

import tracedat
from conftest import REPO
from test_ingest_fast import COMPRESSED, read_all, sample_files
from ticklab.cli import main
from ticklab.trace.ingest import TraceFormatError, read_trace

SECRET = "root-only-secret-0123456789-abcdefghijklmnopqrstuvwxyz\n"


@pytest.fixture(scope="module")
def samples(tmp_path_factory):
    return sample_files(tmp_path_factory.mktemp("samples"))


def secret_file(directory: Path) -> Path:
    secret = directory / "secret-0600"
    secret.write_text(SECRET)
    secret.chmod(0o600)
    return secret


# -- item 1: --out -----------------------------------------------------------------------------------------
def test_ingest_out_refuses_a_link_planted_for_a_table_and_leaves_its_target_alone(tmp_path, capsys):
    victim = tmp_path / "root-owned.conf"
    victim.write_text("precious\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "irq_vectors__local_timer_entry.parquet").symlink_to(victim)
    assert main(["ingest", str(COMPRESSED / "trace-zstd.dat"), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert victim.read_text() == "precious\n"
    assert len(err.splitlines()) == 1
    assert err.startswith("ticklab ingest: ") and "irq_vectors__local_timer_entry.parquet: is a symbolic link" in err
    assert sorted(p.name for p in out.iterdir()) == ["irq_vectors__local_timer_entry.parquet"]  # nothing else left


@pytest.mark.timeout(120)
def test_ingest_out_refuses_a_fifo_planted_for_a_table_without_waiting(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    os.mkfifo(out / "timer__tick_stop.parquet")
    assert main(["ingest", str(COMPRESSED / "trace-zstd.dat"), "--out", str(out)]) == 2
    assert (
        "timer__tick_stop.parquet: a FIFO, not a regular file; ticklab does not write through links or replace "
        "what it did not write" in capsys.readouterr().err
    )


def test_ingest_out_replaces_its_own_tables_whole(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["ingest", str(COMPRESSED / "trace-zstd.dat"), "--out", str(out)]) == 0
    first = {p.name: p.read_bytes() for p in out.iterdir()}
    assert main(["ingest", str(COMPRESSED / "trace-zstd.dat"), "--out", str(out)]) == 0
    assert {p.name: p.read_bytes() for p in out.iterdir()} == first
    assert all(not name.startswith(".") for name in first)


def test_a_trace_the_user_names_through_their_own_link_is_read(tmp_path, capsys):
    (tmp_path / "mine.dat").symlink_to(COMPRESSED / "trace-zstd.dat")
    assert main(["ingest", str(tmp_path / "mine.dat")]) == 0
    assert "irq_vectors:local_timer_entry:" in capsys.readouterr().out


# -- item 4: links inside a capture directory ------------------------------------------------------------------
@pytest.mark.parametrize(
    "name",
    ["kallsyms", "trace_clock", "page_size", "header_page", "cpu0.stats", "cpu1.raw", "formats/fake/fake_event/format"],
)
def test_a_link_inside_a_tracefs_capture_is_refused_and_its_target_never_shown(samples, tmp_path, name):
    target = tmp_path / "capture"
    shutil.copytree(samples["tracefs"], target)
    secret = secret_file(tmp_path)
    if (target / name).exists():
        (target / name).unlink()
    (target / name).symlink_to(secret)
    with pytest.raises(TraceFormatError) as caught:
        read_all(target)
    message = str(caught.value)
    assert f"{target / name}: is a symbolic link; ticklab does not read through links" == message
    assert "secret" not in message.replace(str(tmp_path), "")


def test_a_linked_directory_inside_a_tracefs_capture_is_refused(samples, tmp_path):
    target = tmp_path / "capture"
    shutil.copytree(samples["tracefs"], target)
    moved = tmp_path / "fake-elsewhere"
    shutil.move(target / "formats" / "fake", moved)
    (target / "formats" / "fake").symlink_to(moved)
    with pytest.raises(
        TraceFormatError,
        match=r"formats/fake: a symbolic link, not a directory; ticklab does not "
        r"read through links$",
    ):
        read_all(target)


def test_a_trace_dat_planted_as_a_link_in_a_run_directory_is_refused(tmp_path):
    (tmp_path / "trace.dat").symlink_to(COMPRESSED / "trace-zstd.dat")
    with pytest.raises(TraceFormatError, match=r"trace.dat: is a symbolic link; ticklab does not read through links$"):
        read_trace(tmp_path)


# -- item 7: FIFOs never hang the reader ---------------------------------------------------------------------
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "name", ["cpu0.raw", "cpu1.stats", "formats/fake/fake_event/format", "cpu0.raw.xz", "header_page", "kallsyms"]
)
def test_a_fifo_in_a_tracefs_capture_is_refused_without_waiting(samples, tmp_path, name):
    target = tmp_path / "capture"
    shutil.copytree(samples["tracefs"], target)
    if name == "cpu0.raw.xz":
        (target / "cpu0.raw").unlink()
    elif (target / name).exists():
        (target / name).unlink()
    os.mkfifo(target / name)
    # nobody writes to it: a reader that opened it blocking would wait for ever (the timeout marker fails the test)
    with pytest.raises(TraceFormatError, match=rf"{name}: a FIFO, not a regular file; refused$"):
        read_all(target)


@pytest.mark.timeout(120)
def test_a_fifo_as_the_trace_dat_is_refused_without_waiting(tmp_path):
    os.mkfifo(tmp_path / "trace.dat")
    with pytest.raises(TraceFormatError, match=r"trace.dat: a FIFO, not a regular file; refused$"):
        read_trace(tmp_path / "trace.dat")


# -- item 8: a compressed chunk longer than its stated size ----------------------------------------------------
def zlib_chunks(data: bytes) -> list[tuple[int, int, int]]:
    """(header offset, packed size, plain size) of every compressed CPU data chunk of a zlib trace.dat: a u32
    packed size and a u32 whole-pages plain size right before a zlib stream that inflates to exactly that size."""
    found = []
    for at in range(8, len(data) - 2):
        if data[at] != 0x78 or data[at + 1] not in (0x01, 0x5E, 0x9C, 0xDA):
            continue
        packed, plain = struct.unpack_from("<II", data, at - 8)
        if not plain or plain % 4096 or at + packed > len(data):
            continue
        try:
            if len(zlib.decompress(data[at : at + packed])) == plain:
                found.append((at - 8, packed, plain))
        except zlib.error:
            pass
    return found


@pytest.mark.parametrize("source", ["fixture", "synthetic"])
def test_a_zlib_chunk_holding_more_than_its_stated_size_is_refused_not_cut(samples, tmp_path, source):
    path = COMPRESSED / "trace-zlib.dat" if source == "fixture" else samples["v7-zlib"]
    whole = sum(read_trace(path).counts().values())
    data = bytearray(path.read_bytes())
    chunks = [c for c in zlib_chunks(bytes(data)) if c[2] >= 2 * 4096]
    assert chunks, "no multi-page CPU data chunk found"
    at, _, plain = chunks[0]
    struct.pack_into("<I", data, at + 4, plain - 4096)  # the header now says one page less than the chunk holds
    (tmp_path / "short.dat").write_bytes(bytes(data))
    with pytest.raises(
        TraceFormatError,
        match=rf"short.dat: CPU \d chunk \d+ decompresses to more than the "
        rf"{plain - 4096} bytes its header says at byte {at}$",
    ):
        read_all(tmp_path / "short.dat")
    assert whole > 0


# -- item 9: a v6 header whose CPU count was lowered ---------------------------------------------------------
@pytest.mark.parametrize("with_stats", [True, False])
def test_a_v6_trace_whose_cpu_count_was_lowered_is_refused(tmp_path, with_stats):
    cpu0 = [(7, 100 + i, f"t{i}", i, "x") for i in range(400)]
    cpu1 = [(5, 200 + i, f"u{i}", -i, "y") for i in range(300)]
    cpu_pages = {0: tracedat.pages_for(cpu0), 1: tracedat.pages_for(cpu1)}
    stats = {0: tracedat.stats_text(0, 400), 1: tracedat.stats_text(1, 300)} if with_stats else None
    path = tracedat.write_v6(tmp_path / "v6.dat", cpu_pages, stats)
    assert sum(read_trace(path).counts().values()) == 700
    data = bytearray(path.read_bytes())
    count_at = data.index(b"options  \0") - 4
    assert struct.unpack_from("<I", data, count_at)[0] == 2
    struct.pack_into("<I", data, count_at, 1)
    (tmp_path / "one.dat").write_bytes(bytes(data))
    expected = (
        r"the header counts 1 CPUs of data but the file has the stats of 2 CPUs"
        if with_stats
        else r"\d+ bytes of data after the last of the 1 CPUs the header counts"
    )
    with pytest.raises(TraceFormatError, match=rf"one.dat: {expected}"):
        read_all(tmp_path / "one.dat")


@pytest.mark.slow
def test_no_bundled_trace_is_refused_by_the_new_checks():
    """The cross-checks above hold for every trace ticklab's runners wrote (tracefs and trace-cmd)."""
    roots = {p.parent for p in (REPO / "traces").rglob("trace.dat*")} | {
        p.parent for p in (REPO / "traces").rglob("header_page")
    }
    assert roots
    for root in sorted(roots):
        assert sum(read_trace(root).counts().values()) >= 0


@pytest.mark.parametrize("source", ["fixture", "synthetic"])
def test_a_compressed_cpu_whose_chunk_count_was_lowered_is_refused(samples, tmp_path, source):
    """Found by the trace-counts fuzz family: one chunk fewer in the count read a CPU's first chunks only (433 of
    2,170 events) while the chunks still filled the size the file states for that CPU's data."""
    path = COMPRESSED / "trace-zlib.dat" if source == "fixture" else samples["v7-zlib"]
    data = bytearray(path.read_bytes())
    first_chunk = zlib_chunks(bytes(data))[0][0]
    count_at = first_chunk - 4
    count = struct.unpack_from("<I", data, count_at)[0]
    assert count >= 1
    struct.pack_into("<I", data, count_at, count - 1)
    (tmp_path / "fewer.dat").write_bytes(bytes(data))
    with pytest.raises(
        TraceFormatError,
        match=rf"fewer.dat: CPU \d data at byte {count_at} holds \d+ bytes of chunks "
        rf"but its {count - 1} compressed chunks end at byte \d+, not \d+",
    ):
        read_all(tmp_path / "fewer.dat")
