"""ticklab bundle export / import (issue 57 item 3): sealed bundles in one archive, verified on the way in."""

from __future__ import annotations

import io
import math
import tarfile
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest

from ticklab import cli
from ticklab.bundle import BundleWriter
from ticklab.bundlearchive import ArchiveError, export, import_archive

WHEN = datetime(2026, 11, 21, 18, 0, 0, tzinfo=UTC)


def make_bundle(root: Path, host: str, seed: int, runs: int = 4) -> Path:
    rng = np.random.default_rng(seed)
    writer = BundleWriter(root, host, "nohz", "e", definition={}, host={}, when=WHEN)
    for index in range(2 * runs):
        writer.add_run(
            {
                "run": f"run-{index + 1:03d}",
                "condition": "ab"[index % 2],
                "warmup": False,
                "status": "ok",
                "problem": None,
            },
            [{"metric": "work", "value": 100 * math.exp(rng.normal(0, 0.01)), "unit": "u"}],
        )
        raw = writer.path / "raw" / f"run-{index + 1:03d}"
        raw.mkdir(parents=True, exist_ok=True)
        (raw / "stdout.txt").write_bytes(rng.bytes(3000))
    writer.seal()
    return writer.path


def files_of(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def two_hosts(tmp_path):
    data = tmp_path / "data"
    make_bundle(data, "host-a", 1)
    make_bundle(data, "host-b", 2)
    return data


def test_export_then_import_round_trips_byte_for_byte_and_exports_the_same_archive_again(tmp_path, two_hosts, capsys):
    archive = tmp_path / "bundles.tar"
    assert cli.main(["bundle", "export", str(two_hosts), "--out", str(archive)]) == 0
    into = tmp_path / "theirs"
    assert cli.main(["bundle", "import", str(archive), "--into", str(into)]) == 0
    out = capsys.readouterr().out
    assert out.count("imported ") == 2 and "2 imported, 0 already there" in out
    assert files_of(into) == files_of(two_hosts)
    assert not [p for p in into.rglob(".*")]  # no staging left
    again = tmp_path / "again.tar"
    export([into], again)
    assert again.read_bytes() == archive.read_bytes()
    # a bundle already there (same seal digest) is skipped, saying where
    assert cli.main(["bundle", "import", str(archive), "--into", str(into)]) == 0
    out = capsys.readouterr().out
    assert "0 imported, 2 already there" in out and "skipped " in out
    assert files_of(into) == files_of(two_hosts)


def test_a_tampered_archive_is_refused_in_one_line_naming_the_file_and_nothing_is_imported(tmp_path, two_hosts, capsys):
    archive = tmp_path / "bundles.tar"
    export([two_hosts], archive)
    data = bytearray(archive.read_bytes())
    where = data.index(b"run,condition,metric")  # host-a's results.csv, inside the archive
    data[where + 40] ^= 0x01
    tampered = tmp_path / "tampered.tar"
    tampered.write_bytes(bytes(data))
    into = tmp_path / "theirs"
    assert cli.main(["bundle", "import", str(tampered), "--into", str(into)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"ticklab bundle import: {tampered}: host-a/nohz/")
    assert "results.csv" in err and "refused, nothing imported" in err
    assert not [p for p in into.rglob("*") if p.is_file()]


def test_a_cut_off_archive_is_refused(tmp_path, two_hosts):
    archive = tmp_path / "bundles.tar"
    export([two_hosts], archive)
    cut = tmp_path / "cut.tar"
    cut.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
    with pytest.raises(ArchiveError, match="refused"):
        import_archive(cut, tmp_path / "theirs")
    assert not [p for p in (tmp_path / "theirs").rglob("*") if p.is_file()]


def _archive_with(tmp_path, member: tarfile.TarInfo, data: bytes = b"") -> Path:
    path = tmp_path / "evil.tar"
    with tarfile.open(path, "w") as tar:
        tar.addfile(member, io.BytesIO(data) if data else None)
    return path


@pytest.mark.parametrize(
    ("name", "kind", "says"),
    [
        ("../../escape/nohz/b/x", tarfile.REGTYPE, "'..'"),
        ("/abs/nohz/b/x", tarfile.REGTYPE, "absolute"),
        ("host/nohz/b/link", tarfile.SYMTYPE, "a symbolic link"),
        ("host/nohz/b/hard", tarfile.LNKTYPE, "a hard link"),
        ("host/nohz/b/dev", tarfile.CHRTYPE, "a device"),
        ("host/nohz/b/fifo", tarfile.FIFOTYPE, "a FIFO"),
        ("loose-file", tarfile.REGTYPE, "not <host-id>/<claim>/<bundle>"),
    ],
)
def test_links_devices_absolute_and_dotdot_members_are_refused(tmp_path, name, kind, says):
    member = tarfile.TarInfo(name)
    member.type = kind
    member.linkname = "/etc/passwd" if kind in (tarfile.SYMTYPE, tarfile.LNKTYPE) else ""
    data = b"x" if kind == tarfile.REGTYPE else b""
    member.size = len(data)
    archive = _archive_with(tmp_path, member, data)
    into = tmp_path / "theirs"
    with pytest.raises(ArchiveError, match=says) as caught:
        import_archive(archive, into)
    assert str(archive) in str(caught.value) and "\n" not in str(caught.value)
    assert not (tmp_path / "escape").exists() and not Path("/abs").exists()
    assert not [p for p in into.rglob("*") if p.is_file()]


def test_export_refuses_an_unsealed_bundle_and_an_existing_out(tmp_path, two_hosts):
    open_one = BundleWriter(tmp_path / "open", "host-c", "nohz", "e", definition={}, host={}, when=WHEN)
    with pytest.raises(ArchiveError, match="not exported"):
        export([open_one.path], tmp_path / "x.tar")
    assert not (tmp_path / "x.tar").exists()
    (tmp_path / "there.tar").write_bytes(b"mine")
    with pytest.raises(ArchiveError, match="exists already"):
        export([two_hosts], tmp_path / "there.tar")
    assert (tmp_path / "there.tar").read_bytes() == b"mine"


def test_an_archive_tar_made_by_hand_from_the_data_directory_imports_too(tmp_path, two_hosts):
    """`tar cf` of host directories: their <host-id>/ and <host-id>/<claim>/ directory members are taken as they are."""
    archive = tmp_path / "by-hand.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(two_hosts / "host-a", arcname="host-a")
    done = import_archive(archive, tmp_path / "theirs")
    assert [p.parent.parent.name for p in done.added] == ["host-a"]
    assert files_of(tmp_path / "theirs") == {k: v for k, v in files_of(two_hosts).items() if k.startswith("host-a/")}
