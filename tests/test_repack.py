"""Small bundles (issue 42 item 3): the seal leaves no plain raw file of 64 KiB or more and keeps the gap detector's
output as its numbers; `ticklab bundle repack` re-seals a bundle sealed before that, only after it verifies and its
per-run values come out the same, and a refusal or a crash at any point leaves the bundle whole, old or new."""

from __future__ import annotations

import hashlib
import json
import lzma
import os
import shutil
import signal
import stat
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from ticklab import paths, repack, safefiles
from ticklab.analysis.captured import find_bundles
from ticklab.bundle import COMPRESS_FROM_BYTES, BundleWriter, load_bundle, manifest_digest
from ticklab.capture.workloads import read_gapdet
from ticklab.trace import gapfile, rawfile

WHEN = datetime(2026, 11, 27, 12, 0, 0, tzinfo=UTC)
# a real bundle whose gap detector ran under its own trace in every run (11 runs, tracefs captures)
NOHZ_GAPDET = Path("amd-epyc-2c-6.18.44-fc-v595-vm/nohz/20261126T195227Z-ftq")


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TICKLAB_CACHE", str(tmp_path / "cache"))


def gapdet_text(gaps: int, seed: int = 1) -> bytes:
    """What tools/gapdet.c prints (its header lines, then 'start_ns gap_ns' lines), for ``gaps`` gaps."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1001, 90_000, gaps)
    starts = np.cumsum(rng.integers(1_000, 1_000_000, gaps)) + np.concatenate([[0], np.cumsum(lengths)[:-1]])
    header = (
        f"# gapdet: 1\n# threshold_ns: 1000\n# duration_ns: {int(starts[-1] + lengths[-1])}\n# t0_ns: 122216849700\n"
        f"# reads: {gaps * 40}\n# read_ns_min: 20\n# read_ns_median: 25\n# calibration_reads: 100000\n"
        f"# gaps: {gaps}\n# gaps_kept: {gaps}\n# gap_ns_total: {int(lengths.sum())}\n# cpu: 1\n"
        "# policy: SCHED_FIFO\n# priority: 99\n# kernel: 6.1.0-50-amd64\n# clocksource: hpet\n"
        "# clock: CLOCK_MONOTONIC\n# columns: start_ns gap_ns\n"
    )
    return (header + "".join(f"{s} {g}\n" for s, g in zip(starts, lengths, strict=True))).encode()


def plain_raw_files_from(path: Path, size: int = COMPRESS_FROM_BYTES) -> list[str]:
    return sorted(
        str(p.relative_to(path))
        for p in (path / "raw").rglob("*")
        if p.is_file() and p.suffix != ".xz" and p.stat().st_size >= size
    )


def test_the_seal_leaves_no_plain_raw_file_of_64_kib_or_more_and_keeps_gapdets_numbers(tmp_path):
    writer = BundleWriter(tmp_path, "host", "nohz", "ftq", definition={}, host={}, when=WHEN)
    wrote = {}
    for index, (condition, warmup) in enumerate([("a", True), ("a", False), ("b", False), ("a", False)], 1):
        run = f"run-{index:03d}"
        raw = writer.run_dir(run)
        (raw / "trace").mkdir()
        (raw / "gapdet").mkdir()
        wrote[f"raw/{run}/trace/trace.dat"] = run.encode() * 40_000
        wrote[f"raw/{run}/gapdet/stdout.txt"] = gapdet_text(3000 + index, seed=index)
        wrote[f"raw/{run}/ftq.dat"] = b"# ftq: 1\n" + b"1 2 3\n" * 10  # small: stays as it is
        for relative, data in wrote.items():
            if relative.startswith(f"raw/{run}/"):
                (writer.path / relative).write_bytes(data)
        writer.add_run({"run": run, "condition": condition, "warmup": warmup, "trace": {"directory": "trace"}}, [])
    (writer.path / "raw/boot-plan").mkdir()
    wrote["raw/boot-plan/console.txt"] = b"[    0.000000] Linux version 6.1.0\n" * 3000  # outside any run
    (writer.path / "raw/boot-plan/console.txt").write_bytes(wrote["raw/boot-plan/console.txt"])
    path = writer.seal()

    assert plain_raw_files_from(path) == []  # the first measured run of each condition included
    for relative, data in wrote.items():
        if relative.endswith("gapdet/stdout.txt"):
            assert not rawfile.present(path / relative)
            compact = (path / relative).with_name("gaps.parquet.xz")
            assert compact.is_file()
            header, gaps = read_gapdet(path / relative)  # asked for by its text's name, as the analysis does
            (tmp_path / "text.txt").write_bytes(data)
            text_header, text_gaps = read_gapdet(tmp_path / "text.txt")
            assert header == text_header
            pd.testing.assert_frame_equal(gaps, text_gaps, check_exact=True)
            pairs, _ = gapfile.read_compact(compact)
            assert gapfile.text(pairs, gaps.to_numpy()) == data  # lossless
        else:
            assert rawfile.read_bytes(path / relative) == data
            assert (path / relative).is_file() == (len(data) < COMPRESS_FROM_BYTES)
    bundle = load_bundle(path)
    assert bundle.manifest.raw_files["compressed"] == 5 and bundle.manifest.raw_files["compacted"] == 4


def test_gapdets_text_that_its_numbers_would_not_give_back_stays_text(tmp_path):
    text = gapdet_text(10)
    assert gapfile.compact(text) is not None
    for changed in (
        text.replace(b"# gaps_kept: 10", b"# gaps_kept: 11"),  # cut off: fewer lines than it kept
        text.replace(b"\n", b"\n\n", 20),
        text + b"# a note\n",
        text.replace(b" ", b"  ", 30),
        text[:-1],
        b"# ftq: 1\n" + text,
    ):
        assert gapfile.compact(changed) is None


@pytest.fixture(scope="module")
def sealed_before(tmp_path_factory) -> Path:
    """The real bundle NOHZ_GAPDET as a seal before issue 42 item 3 could leave it: every raw file plain (an xz'd
    file unpacked, the gap detector's numbers written back as its text), sealed anew."""
    source = paths.traces_dir() / NOHZ_GAPDET
    target = tmp_path_factory.mktemp("before") / "traces" / NOHZ_GAPDET
    manifest = json.loads((source / "manifest.json").read_text())
    files = {}
    for relative in manifest["files"]:
        data = (source / relative).read_bytes()
        if relative.endswith("/gaps.parquet.xz"):
            pairs, gaps = gapfile.read_compact(source / relative)
            data = gapfile.text(pairs, gaps.to_numpy())
            relative = relative.replace("gaps.parquet.xz", "stdout.txt")
        elif relative.endswith(".xz"):
            data, relative = lzma.decompress(data), relative[:-3]
        (target / relative).parent.mkdir(parents=True, exist_ok=True)
        (target / relative).write_bytes(data)
        files[relative] = hashlib.sha256(data).hexdigest()
    manifest["files"] = files
    for key in ("raw_files", "resealed"):
        manifest.pop(key, None)
    manifest_bytes = (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()
    (target / "manifest.json").write_bytes(manifest_bytes)
    (target / "manifest.sha256").write_text(f"{manifest_digest(manifest_bytes)}  manifest.json\n")
    load_bundle(target)
    assert any(
        name.endswith("gapdet/stdout.txt") and (target / name).stat().st_size >= COMPRESS_FROM_BYTES for name in files
    )
    return target


def copy_of(bundle: Path, tmp_path: Path) -> Path:
    target = tmp_path / "traces" / bundle.relative_to(bundle.parents[3])
    shutil.copytree(bundle, target)
    return target


def snapshot(path: Path) -> dict:
    """Every file and directory below ``path``: its bytes' sha256 and mode."""
    return {
        str(p.relative_to(path)): (
            hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir",
            stat.S_IMODE(p.lstat().st_mode),
        )
        for p in sorted(path.rglob("*"))
    }


def test_the_gap_detector_reader_gives_the_same_numbers_from_both_forms_on_a_real_bundle(tmp_path):
    bundle = paths.traces_dir() / NOHZ_GAPDET
    manifest = json.loads((bundle / "manifest.json").read_text())
    gapdets = [e for r in manifest["runs"] for e in r.get("extras") or [] if e.get("name") == "gapdet"]
    replaced = {
        old: entry for record in manifest.get("resealed") or [] for old, entry in record["files_replaced"].items()
    }
    assert len(gapdets) == 11
    texts_checked = 0
    for number, extra in enumerate(gapdets):
        stored = bundle / "raw" / extra["directory"] / "stdout.txt"
        header, gaps = read_gapdet(stored)
        other = tmp_path / str(number) / "stdout.txt"
        other.parent.mkdir()
        compact = gapfile.compact_path(stored)
        if compact is not None:  # stored as numbers: its text, given back, reads the same
            pairs, _ = gapfile.read_compact(compact)
            text = gapfile.text(pairs, gaps.to_numpy())
            name = str(stored.relative_to(bundle))
            was = replaced.get(name) or replaced[name + ".xz"]  # the older seal xz'd it outside a first run
            assert was["now"] == str(rawfile.locate(compact).relative_to(bundle))
            if name in replaced:
                assert hashlib.sha256(text).hexdigest() == was["sha256"]  # the very text the old seal covered
                texts_checked += 1
            other.write_bytes(text)
        else:  # stored as text: its numbers read the same
            packed = gapfile.compact(rawfile.read_bytes(stored))
            assert packed is not None
            other.with_name("gaps.parquet.xz").write_bytes(lzma.compress(packed))
        again_header, again = read_gapdet(other)
        assert again_header == header and len(gaps) == header["gaps_kept"] > 0
        pd.testing.assert_frame_equal(again, gaps, check_exact=True)
        assert again.dtypes.tolist() == [np.int64, np.int64]
    assert texts_checked or not replaced  # repacked: its text, given back, is the one the old seal covered


@pytest.mark.slow  # ~30 s quiet: the nohz analysis (11 runs' FTQ quanta, gap detector output and traces) twice
def test_repack_re_seals_a_real_bundle_with_the_same_per_run_values_and_says_so(sealed_before, tmp_path):
    path = copy_of(sealed_before, tmp_path)
    before = load_bundle(path).manifest
    old_seal = (path / "manifest.sha256").read_text().split()[0]
    lines = []
    done = repack.repack(path, say=lines.append)
    assert done is not None and done.bytes_after < done.bytes_before / 2
    bundle = load_bundle(path)
    assert plain_raw_files_from(path) == []
    record = bundle.manifest.resealed[-1]
    assert record["from_seal"] == old_seal and record["why"] == repack.WHY
    assert set(record["files_replaced"]) == set(before.files) - set(bundle.manifest.files)
    assert {old: entry["sha256"] for old, entry in record["files_replaced"].items()} == {
        old: before.files[old] for old in record["files_replaced"]
    }
    assert all(entry["now"] in bundle.manifest.files for entry in record["files_replaced"].values())
    numbers = [name for name in bundle.manifest.files if name.endswith("gaps.parquet.xz")]
    assert len(numbers) == 11
    texts = [old for old, entry in record["files_replaced"].items() if entry["now"] in numbers]
    assert sum((path / name).stat().st_size for name in numbers) < sum(
        len(lzma.compress((sealed_before / old).read_bytes())) for old in texts
    )  # smaller than the xz'd text
    assert bundle.manifest.sealed == before.sealed and bundle.manifest.to_json()["runs"] == before.to_json()["runs"]
    assert not os.path.lexists(repack.work_path(path))
    assert any("per-run values are the same" in line for line in lines)
    assert repack.repack(path) is None  # nothing left to shrink: untouched
    assert load_bundle(path).manifest.to_json() == bundle.manifest.to_json()


def small_bundle(tmp_path: Path, claim: str = "hrtick") -> Path:
    """A sealed bundle as a seal before issue 42 item 3 left the first run of each condition: its large raw files
    plain."""
    writer = BundleWriter(tmp_path / "traces", "host", claim, "hackbench", definition={}, host={}, when=WHEN)
    for index in range(3):
        run = f"run-{index:03d}"
        raw = writer.run_dir(run)
        (raw / "big.dat").write_bytes(bytes(range(256)) * (400 + index))
        (raw / "small.txt").write_text("stays\n")
        writer.add_run(
            {"run": run, "condition": "HRTICK" if index % 2 else "NO_HRTICK", "exit_status": 0},
            [{"metric": "runtime_s", "value": 1.5 + index, "unit": "s"}],
        )
    writer.compress_raw = lambda *args, **kwargs: None  # as the older seal did for a first run
    path = writer.seal()
    assert len(plain_raw_files_from(path)) == 3
    return path


def test_repack_refuses_a_tampered_bundle_and_leaves_it_as_it_is(tmp_path, capsys):
    path = small_bundle(tmp_path)
    target = path / "raw/run-001/big.dat"
    target.chmod(0o644)
    target.write_bytes(target.read_bytes()[:-1] + b"!")
    target.chmod(0o444)
    kept = snapshot(path)
    with pytest.raises(
        repack.RepackError, match=r"raw/run-001/big\.dat: sha256 differs from the manifest.*not repacked"
    ):
        repack.repack(path)
    assert snapshot(path) == kept and not os.path.lexists(repack.work_path(path))

    assert repack.main([path]) == 2  # the command: one line, no traceback
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("ticklab bundle repack: ") and "Traceback" not in err

    other = small_bundle(tmp_path / "second")
    manifest = other / "manifest.json"
    manifest.chmod(0o644)
    manifest.write_text(manifest.read_text().replace('"status": "sealed"', '"status":  "sealed"'))
    kept = snapshot(other)
    with pytest.raises(repack.RepackError, match="manifest.json: sha256 differs from manifest.sha256"):
        repack.repack(other)
    assert snapshot(other) == kept and not os.path.lexists(repack.work_path(other))


def test_repack_refuses_when_a_replaced_file_would_read_back_otherwise(tmp_path, monkeypatch):
    path = small_bundle(tmp_path)
    kept = snapshot(path)
    real = repack.pack_raw_file

    def one_byte_off(source, relative, out, threshold=COMPRESS_FROM_BYTES):
        made = real(source, relative, out, threshold)
        if made and made[0].endswith("run-001/big.dat.xz"):
            out.remove(made[0])
            out.write_new(made[0], lzma.compress(source.read_bytes()[:-1] + b"?"))
        return made

    monkeypatch.setattr(repack, "pack_raw_file", one_byte_off)
    with pytest.raises(repack.RepackError, match=r"big\.dat\.xz: does not unpack to raw/run-001/big\.dat"):
        repack.repack(path)
    assert snapshot(path) == kept and not os.path.lexists(repack.work_path(path))


@pytest.mark.slow  # ~30 s quiet: the nohz analysis twice
def test_repack_refuses_a_bundle_whose_per_run_values_would_change(sealed_before, tmp_path, monkeypatch):
    """With the read-back check of each file taken away, the per-run values still catch gaps changed on the way."""
    path = copy_of(sealed_before, tmp_path)
    kept = snapshot(path)
    real = repack.pack_raw_file

    def gaps_doubled(source, relative, out, threshold=COMPRESS_FROM_BYTES):
        made = real(source, relative, out, threshold)
        if made and made[1] == "gapdet":
            pairs, gaps = gapfile.read_compact(out.root / made[0])
            rows = gaps.to_numpy() * np.array([1, 2])
            out.remove(made[0])
            out.write_new(made[0], lzma.compress(gapfile.compact(gapfile.text(pairs, rows))))
        return made

    monkeypatch.setattr(repack, "pack_raw_file", gaps_doubled)
    monkeypatch.setattr(repack, "_check_copy", lambda *args: None)
    with pytest.raises(
        repack.RepackError, match=r"(tick_cost_runs|ftq_vs_osnoise) differs once repacked .*not repacked"
    ):
        repack.repack(path)
    assert snapshot(path) == kept and not os.path.lexists(repack.work_path(path))


@pytest.mark.parametrize("stop", ["wrote raw/run-001/big.dat", "sealed the copy", "checked"])
def test_an_error_mid_way_leaves_the_bundle_as_it_was(tmp_path, stop):
    path = small_bundle(tmp_path)
    kept = snapshot(path)

    def crash(name):
        if name == stop:
            raise KeyboardInterrupt(name)

    with pytest.raises(KeyboardInterrupt):
        repack.repack(path, step=crash)
    assert snapshot(path) == kept and not os.path.lexists(repack.work_path(path))
    assert repack.repack(path) is not None  # and the next repack goes through


KILLED_AT = """
import os, signal, sys
from ticklab import repack
def step(name):
    if name == sys.argv[2]:
        os.kill(os.getpid(), signal.SIGKILL)
repack.repack(sys.argv[1], step=step)
"""


@pytest.mark.parametrize("stop", ["wrote raw/run-000/big.dat", "checked", "swapped"])
@pytest.mark.slow
def test_a_kill_at_any_point_leaves_the_old_bundle_or_the_new_never_a_mix(tmp_path, stop):
    path = small_bundle(tmp_path)
    kept = snapshot(path)
    killed = subprocess.run([sys.executable, "-c", KILLED_AT, str(path), stop], capture_output=True, text=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    bundle = load_bundle(path)  # whole at its name, whichever it is
    if stop == "swapped":
        assert bundle.manifest.resealed and plain_raw_files_from(path) == []
        assert snapshot(repack.work_path(path)) == kept  # the old bundle, whole, beside it until removed
    else:
        assert snapshot(path) == kept
    leftover = repack.work_path(path)
    assert os.path.lexists(leftover)
    assert [ref.path for ref in find_bundles(tmp_path / "traces", "hrtick")] == [path]  # never counted twice
    with pytest.raises(repack.RepackError, match=r"\.repack: left by an interrupted repack .*remove it and run again"):
        repack.repack(path)
    shutil.rmtree(leftover)
    assert (repack.repack(path) is None) == (stop == "swapped")


def test_a_link_swapped_in_for_the_copy_is_never_written_through(tmp_path, monkeypatch):
    """Issue 55 item 1: the copy's directory was made, closed and opened again by its name, so another user who can
    write the bundle's parent swapped it for a link and root wrote the whole copy where it pointed. The hook plants
    that link when the copy's directory is first closed (at once, in the code before the fix)."""
    path = small_bundle(tmp_path)
    kept = snapshot(path)
    victim = tmp_path / "root-only"
    victim.mkdir(mode=0o700)
    work = repack.work_path(path)
    real_close = repack.OwnedDir.close
    planted = []

    def close(self):
        real_close(self)
        if self.root == work and not planted and not os.path.islink(work):
            os.rename(work, work.with_name(".moved-away"))
            os.symlink(victim, work)
            planted.append(work)

    monkeypatch.setattr(repack.OwnedDir, "close", close)
    try:
        repack.repack(path)
    except repack.RepackError as exc:
        assert "\n" not in str(exc)
    assert planted and os.listdir(victim) == []
    bundle = load_bundle(path)  # whole at its name, old or new
    if not bundle.manifest.resealed:
        assert snapshot(path) == kept
    assert os.path.islink(work)  # what was planted is left as it is


def swap_at(name: str, path: Path, other: Path):
    """A step that exchanges the bundle with the sealed bundle ``other`` when the repack reaches ``name``."""

    def step(reached):
        if reached == name:
            os.rename(path, path.with_name("mine"))
            os.rename(other, path)

    return step


def test_another_bundle_swapped_in_before_the_swap_is_not_deleted(tmp_path):
    """Issue 55 item 2: exchanging the bundle with another sealed bundle while repack checked its copy made repack
    delete that other bundle and say "repacked"."""
    path = small_bundle(tmp_path)
    other = small_bundle(tmp_path / "second")
    theirs, mine = snapshot(other), snapshot(path)
    with pytest.raises(repack.RepackError, match=r"another directory than the bundle verified .*not repacked"):
        repack.repack(path, step=swap_at("checked", path, other))
    assert snapshot(path) == theirs and snapshot(path.with_name("mine")) == mine
    assert not os.path.lexists(repack.work_path(path))


def test_another_bundle_swapped_in_between_the_check_and_the_swap_is_swapped_back(tmp_path, monkeypatch):
    path = small_bundle(tmp_path)
    other = small_bundle(tmp_path / "second")
    theirs, mine = snapshot(other), snapshot(path)
    work = repack.work_path(path)

    def plant(target):
        if Path(target) == path:
            os.rename(path, path.with_name("mine"))
            os.rename(other, path)

    monkeypatch.setattr(safefiles, "between_check_and_write", plant)
    with pytest.raises(repack.RepackError, match=r"while ticklab swapped them; swapped back, nothing removed"):
        repack.repack(path)
    assert snapshot(path) == theirs and snapshot(path.with_name("mine")) == mine
    assert not os.path.lexists(work)


def test_a_file_added_after_verification_is_not_dropped(tmp_path):
    path = small_bundle(tmp_path)

    def add(reached):
        if reached == "checked":
            (path / "raw" / "late.txt").write_text("added after verification\n")

    with pytest.raises(repack.RepackError, match=r"raw/late\.txt: not listed in the manifest .*not repacked"):
        repack.repack(path, step=add)
    assert (path / "raw" / "late.txt").read_text() == "added after verification\n"
    assert not os.path.lexists(repack.work_path(path))
