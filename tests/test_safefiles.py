"""ticklab.safefiles: no read or write through a planted link, no FIFO read, bounded sizes and error lines."""

from __future__ import annotations

import os
import subprocess

import pytest

from ticklab.safefiles import OwnedDir, UnsafeFileError, read_bytes, read_text, shown

pytestmark = pytest.mark.xdist_group("machine")


def test_a_link_planted_below_the_root_is_refused_and_its_target_untouched(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("root's file\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "events.parquet").symlink_to(victim)
    (out / "host").symlink_to(tmp_path)
    with OwnedDir(out) as owned:
        with pytest.raises(UnsafeFileError, match=r"out/events.parquet: is a symbolic link"):
            owned.create("events.parquet")
        with pytest.raises(UnsafeFileError, match=r"out/events.parquet: is a symbolic link"):
            owned.write_atomic("events.parquet", b"x")
        with pytest.raises(UnsafeFileError, match=r"out/host: a symbolic link, not a directory"):
            owned.create("host/claim/manifest.json")
        with pytest.raises(UnsafeFileError, match=r"out/host: a symbolic link"):
            owned.mkdirs("host/claim")
    assert victim.read_text() == "root's file\n"
    assert not (tmp_path / "claim").exists()


def test_atomic_write_replaces_whole_and_leaves_no_temporary(tmp_path):
    with OwnedDir(tmp_path / "b") as owned:
        owned.write_atomic("a/manifest.json", b"one")
        owned.write_atomic("a/manifest.json", b"two")
        assert owned.read_bytes("a/manifest.json", 10) == b"two"
    assert sorted(os.listdir(tmp_path / "b" / "a")) == ["manifest.json"]


def test_exclusive_create_never_overwrites(tmp_path):
    with OwnedDir(tmp_path) as owned:
        with owned.create("x", exclusive=True) as handle:
            handle.write(b"first")
        with pytest.raises(UnsafeFileError, match="exists already"):
            owned.create("x", exclusive=True)
        with pytest.raises(UnsafeFileError, match="exists already"):
            owned.mkdir_new("d") and owned.mkdir_new("d")
    assert (tmp_path / "x").read_bytes() == b"first"


def test_paths_that_leave_the_root_are_refused(tmp_path):
    with OwnedDir(tmp_path) as owned:
        for bad in ("../x", "/etc/passwd", "a/../../x", "."):
            with pytest.raises(UnsafeFileError, match="not a path below"):
                owned.create(bad)


def test_readers_refuse_fifos_links_and_oversized_files_without_blocking(tmp_path):
    fifo = tmp_path / "cpu0.raw"
    os.mkfifo(fifo)
    with pytest.raises(UnsafeFileError, match=r"cpu0.raw: a FIFO, not a regular file"):
        read_bytes(fifo, 100)  # O_NONBLOCK: returns at once with no writer
    secret = tmp_path / "secret"
    secret.write_text("top secret text")
    (tmp_path / "page_size").symlink_to(secret)
    with pytest.raises(UnsafeFileError) as refused:
        read_text(tmp_path / "page_size", 100)
    assert "symbolic link" in str(refused.value) and "secret" not in str(refused.value).replace(str(tmp_path), "")
    big = tmp_path / "big"
    big.write_bytes(b"x" * 101)
    with pytest.raises(UnsafeFileError, match="larger than the 100 bytes"):
        read_bytes(big, 100)
    assert read_bytes(big, 101) == b"x" * 101


@pytest.fixture
def tiny_filesystem(tmp_path):
    """A 64 KiB tmpfs: a real full disk (ENOSPC), where root can mount one."""
    where = tmp_path / "tiny"
    where.mkdir()
    if (
        os.geteuid() != 0
        or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(where)], capture_output=True
        ).returncode
        != 0
    ):
        pytest.skip("needs root to mount a small tmpfs as a full disk")
    yield where
    subprocess.run(["umount", str(where)], check=True)


def test_a_full_disk_names_the_file_and_leaves_no_temporary(tiny_filesystem):
    with OwnedDir(tiny_filesystem) as owned:
        with pytest.raises(UnsafeFileError, match=r"tiny/manifest.json: cannot write \(No space left on device\)"):
            owned.write_atomic("manifest.json", b"x" * (1 << 20))
    assert os.listdir(tiny_filesystem) == []


def test_shown_bounds_and_escapes_values_in_error_lines():
    assert shown("a\nb\tc") == "a\\nb\\tc"
    long = "9" * 5000
    text = shown(long)
    assert len(text) < 240 and text.endswith("(5000 characters)")
    assert "\n" not in shown("x\n" * 1000)


def test_shown_names_a_huge_integer_by_its_size():
    assert shown(10**5000) == "an integer of about 5001 digits"  # str() of it would raise (over 4300 digits)
    assert shown(-(10**5000)).startswith("an integer of about ")
    assert shown(12345) == "12345" and shown(True) == "True"


def test_subdir_append_and_remove_never_go_through_a_link(tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "results.csv").write_text("root's file\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "host").symlink_to(victim)
    with OwnedDir(out) as owned:
        with pytest.raises(UnsafeFileError, match=r"out/host: a symbolic link, not a directory"):
            owned.subdir("host")
        with pytest.raises(UnsafeFileError, match=r"out/host: a symbolic link, not a directory"):
            owned.append("host/results.csv", b"x\n")
        with pytest.raises(UnsafeFileError, match=r"out/host: a symbolic link; ticklab removes only what it wrote"):
            owned.remove("host")
        with owned.subdir("bundle", new=True) as bundle:
            assert bundle.root == out / "bundle"
            bundle.append("results.csv", b"a\n")
            bundle.append("results.csv", b"b\n")
            (out / "bundle" / "link").symlink_to(victim / "results.csv")
            with pytest.raises(UnsafeFileError, match=r"bundle/link: is a symbolic link"):
                bundle.append("link", b"x\n")
            bundle.remove("results.csv")
        with pytest.raises(UnsafeFileError, match=r"out/bundle: exists already"):
            owned.subdir("bundle", new=True)
    assert (victim / "results.csv").read_text() == "root's file\n" and sorted(os.listdir(out / "bundle")) == ["link"]


def test_an_append_that_does_not_fit_leaves_the_file_as_it_was(tiny_filesystem):
    with OwnedDir(tiny_filesystem) as owned:
        owned.append("results.csv", b"run,condition\n")
        with pytest.raises(UnsafeFileError, match=r"tiny/results.csv: cannot write \(No space left on device\)"):
            owned.append("results.csv", b"x" * (1 << 20))
    assert (tiny_filesystem / "results.csv").read_bytes() == b"run,condition\n"


def test_owner_refuses_a_file_of_another_user_or_writable_by_others(tmp_path):
    mine = tmp_path / "plan.json"
    mine.write_text("{}")
    mine.chmod(0o600)
    assert read_bytes(mine, 10, owner=os.geteuid()) == b"{}"
    mine.chmod(0o622)
    with pytest.raises(
        UnsafeFileError,
        match=rf"plan\.json: not a regular file of uid {os.geteuid()} writable only by it "
        r"\(owner uid \d+, mode 0622\); refused",
    ):
        read_bytes(mine, 10, owner=os.geteuid())
    mine.chmod(0o600)
    with pytest.raises(UnsafeFileError, match=r"not a regular file of uid 12345 writable only by it"):
        read_bytes(mine, 10, owner=12345)
