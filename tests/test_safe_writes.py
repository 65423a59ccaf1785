"""One way to write as root (issue 40, item 1): every write site that bypassed ticklab.safefiles now goes through
it. At each site's name another user plants a symbolic link to a file outside, a dangling link, a hard link to a
file outside, a FIFO or a device node, before the write or (through ``safefiles.between_check_and_write``) in the
window between ticklab's check and its write. Every time the outside file keeps its bytes and its mode, nothing is
created outside, what was planted is left as it was, the command refuses in one line naming the path (no
traceback), and nothing hangs (a FIFO is never opened). Names ticklab no longer writes (the report marker's and
the view cache's old temporary names) are left alone."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest

from conftest import REPO
from test_bundle import make_bundle
from test_ingest_fast import sample_files
from ticklab import bundle as bundle_module
from ticklab import paths, safefiles
from ticklab.bundle import SEAL, load_bundle
from ticklab.cli import main
from ticklab.report import outdir
from ticklab.report.build import run_report
from ticklab.report.view import ViewError, trace_file, write_session

sys.path.insert(0, str(REPO / "benchmarks"))
import fuzzcases_outputs
import ingest_speed

KINDS = ["symlink", "dangling symlink", "hard link", "fifo", "device"]
RACES = ["symlink", "dangling symlink", "hard link"]  # links planted between the check and the write
VICTIM_BYTES = b"someone else's file: root must not write here\n"
TRACE = REPO / "tests" / "data" / "compressed" / "trace-zstd.dat"
TABLES = [
    "irq_vectors__local_timer_entry.parquet",
    "irq_vectors__local_timer_exit.parquet",
    "timer__hrtimer_expire_entry.parquet",
    "timer__tick_stop.parquet",
]  # what ingest writes of TRACE
# a hang (a FIFO opened for writing) fails the test instead of stopping the run
pytestmark = pytest.mark.timeout(300)


@dataclass
class Outside:
    """A directory outside every place ticklab writes: a root-only file (mode 0600) and where a dangling link
    points (nothing must appear there)."""

    root: Path
    victim: Path
    nowhere: Path

    def plant(self, kind: str, where: Path) -> None:
        if kind == "device" and os.geteuid() != 0:
            pytest.skip("making a device node needs root (mknod)")
        fuzzcases_outputs.plant(kind, where, self.victim, self.nowhere, self.root / "directory")

    def plant_in_window(self, monkeypatch, kind: str, where: Path) -> list[Path]:
        """Plant ``kind`` at ``where`` when ticklab has checked it and is about to write it (safefiles' hook);
        the paths the hook was called with."""
        seen = []

        def hook(path: Path) -> None:
            seen.append(Path(path))
            if Path(path) == where and not os.path.lexists(self.root / "planted"):
                (self.root / "planted").touch()
                if where.is_dir() and not where.is_symlink():
                    where.rmdir()  # the empty directory ticklab just made
                elif os.path.lexists(where):
                    where.unlink()
                self.plant(kind, where)

        monkeypatch.setattr(safefiles, "between_check_and_write", hook)
        return seen

    def assert_untouched(self) -> None:
        assert self.victim.read_bytes() == VICTIM_BYTES, "the outside file was written through the planted name"
        assert stat.S_IMODE(self.victim.stat().st_mode) == 0o600, "the outside file's mode was changed"
        assert not os.path.lexists(self.nowhere), "a file was created where the dangling link points"
        assert {p.name for p in self.root.iterdir()} <= {"directory", "planted", "victim"}, "a file appeared outside"
        assert list((self.root / "directory").iterdir()) == [], "files were written into the outside directory"

    def assert_planted_left(self, kind: str, where: Path) -> None:
        info = os.lstat(where)
        if kind in ("symlink", "dangling symlink", "directory symlink"):
            assert stat.S_ISLNK(info.st_mode) and os.readlink(where) == str(
                {"symlink": self.victim, "dangling symlink": self.nowhere}.get(kind, self.root / "directory")
            )
        elif kind == "hard link":
            assert info.st_ino == self.victim.stat().st_ino
        elif kind == "fifo":
            assert stat.S_ISFIFO(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o644, "the FIFO was changed"
        else:
            assert stat.S_ISCHR(info.st_mode) and info.st_rdev == os.makedev(1, 3)
            assert stat.S_IMODE(info.st_mode) == 0o644, "the device node's mode was changed"


@pytest.fixture
def outside(tmp_path) -> Outside:
    root = tmp_path / "outside"
    root.mkdir()
    (root / "directory").mkdir()
    victim = root / "victim"
    victim.write_bytes(VICTIM_BYTES)
    victim.chmod(0o600)
    return Outside(root, victim, root / "created-through-a-dangling-link")


def one_line_naming(text: str, path: Path) -> str:
    text = text.strip()
    assert "Traceback" not in text and len(text.splitlines()) == 1, text
    assert str(path) in text, f"{path} not named in: {text}"
    return text


# -- the rule, in safefiles itself ------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("write", ["write_atomic", "write_new", "create", "append"])
def test_safefiles_refuses_every_planted_kind_before_and_during_a_write(tmp_path, outside, monkeypatch, kind, write):
    def attempt(owned):
        if write == "write_atomic":
            owned.write_atomic("f", b"new\n")
        elif write == "write_new":
            owned.write_new("f", b"new\n", mode=0o444)
        elif write == "create":
            with owned.create("f") as handle:
                handle.write(b"new\n")
        else:
            owned.append("f", b"new\n")

    before, during = tmp_path / "before", tmp_path / "during"
    outside.plant(kind, before / "f")
    with safefiles.OwnedDir(before) as owned, pytest.raises(safefiles.UnsafeFileError) as refused:
        attempt(owned)
    one_line_naming(str(refused.value), before / "f")
    outside.assert_planted_left(kind, before / "f")
    if kind in RACES:
        during.mkdir()
        if write != "write_new":  # a file of ticklab's own to replace (write_new only adds one where nothing is)
            (during / "f").write_bytes(b"ticklab's old file\n")
        outside.plant_in_window(monkeypatch, kind, during / "f")
        with safefiles.OwnedDir(during) as owned, pytest.raises(safefiles.UnsafeFileError) as refused:
            attempt(owned)
        one_line_naming(str(refused.value), during / "f")
        outside.assert_planted_left(kind, during / "f")
        assert sorted(os.listdir(during)) == ["f"]  # no temporary file left behind
    outside.assert_untouched()


def test_safefiles_replaces_its_own_file_and_sets_a_new_files_mode_on_its_descriptor(tmp_path):
    old_umask = os.umask(0o077)
    try:
        with safefiles.OwnedDir(tmp_path) as owned:
            owned.write_atomic("a", b"one")
            owned.write_atomic("a", b"two")
            owned.write_new("b", b"sealed\n", mode=0o444)
            with pytest.raises(safefiles.UnsafeFileError, match=r"/b: exists already; nothing is overwritten"):
                owned.write_new("b", b"again\n", mode=0o444)
    finally:
        os.umask(old_umask)
    assert (tmp_path / "a").read_bytes() == b"two" and (tmp_path / "b").read_bytes() == b"sealed\n"
    assert stat.S_IMODE((tmp_path / "b").stat().st_mode) == 0o444 and sorted(os.listdir(tmp_path)) == ["a", "b"]


# -- 1. ticklab seal-manifest ------------------------------------------------------------------------------------
def _unsealed_manifest(tmp_path) -> Path:
    path = make_bundle(tmp_path / "traces")
    (path / SEAL).unlink()  # as a bundle sealed by an older ticklab
    return path


@pytest.mark.parametrize("kind", KINDS)
def test_seal_manifest_refuses_a_file_planted_while_it_hashes_the_bundle(tmp_path, outside, monkeypatch, capsys, kind):
    path = _unsealed_manifest(tmp_path)
    hash_file = bundle_module._hash_regular

    def hashing(file):  # the bundle's files are being hashed: the absent seal was checked long ago
        if not os.path.lexists(path / SEAL):
            outside.plant(kind, path / SEAL)
        return hash_file(file)

    monkeypatch.setattr(bundle_module, "_hash_regular", hashing)
    assert main(["seal-manifest", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert one_line_naming(captured.err, path / SEAL).startswith("ticklab seal-manifest: ")
    outside.assert_planted_left(kind, path / SEAL)
    outside.assert_untouched()


@pytest.mark.parametrize("kind", RACES)
def test_seal_manifest_refuses_a_link_planted_between_its_check_and_its_write(
    tmp_path, outside, monkeypatch, capsys, kind
):
    path = _unsealed_manifest(tmp_path)
    seen = outside.plant_in_window(monkeypatch, kind, path / SEAL)
    assert main(["seal-manifest", str(path)]) == 2
    assert path / SEAL in seen
    assert one_line_naming(capsys.readouterr().err, path / SEAL).startswith("ticklab seal-manifest: ")
    outside.assert_planted_left(kind, path / SEAL)
    outside.assert_untouched()


def test_seal_manifest_still_writes_a_read_only_seal_whatever_the_umask(tmp_path, capsys):
    path = _unsealed_manifest(tmp_path)
    old_umask = os.umask(0o077)
    try:
        assert main(["seal-manifest", str(path)]) == 0
    finally:
        os.umask(old_umask)
    digest = hashlib.sha256((path / "manifest.json").read_bytes()).hexdigest()
    assert (path / SEAL).read_text() == f"{digest}  manifest.json\n"
    assert stat.S_IMODE((path / SEAL).stat().st_mode) == 0o444
    load_bundle(path)


# -- 2. make bench BENCH_ARGS="--keep DIR" -----------------------------------------------------------------------
def _bench(monkeypatch, keep: Path, before_ingest=lambda argv: None) -> list[list[str]]:
    """benchmarks/ingest_speed.py's main with --keep: the ticklab CLI's ingest runs for real (as the benchmark runs
    it), the other commands are not timed (no trace-cmd or GNU time needed). The ingest commands it ran."""
    ran = []
    which = shutil.which

    def run(argv, stdout=subprocess.DEVNULL, in_directory=None):
        if argv[1:2] == ["ingest"]:
            before_ingest(argv)
            ran.append(argv)
            where = (
                {} if in_directory is None else {"cwd": f"/proc/self/fd/{in_directory}", "pass_fds": (in_directory,)}
            )
            done = subprocess.run(argv, capture_output=True, text=True, **where)
            if done.returncode:
                raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr[:300]}")
        return 1.0, 1.0, 1.0, ""

    monkeypatch.setattr(ingest_speed, "run", run)
    monkeypatch.setattr(
        shutil, "which", lambda name, *a, **k: "/usr/bin/trace-cmd" if name == "trace-cmd" else which(name, *a, **k)
    )
    monkeypatch.setattr(sys, "argv", ["ingest_speed.py", "--keep", str(keep), "--runs", "5", str(TRACE)])
    ingest_speed.main()
    return ran


@pytest.mark.parametrize("kind", [*KINDS, "directory symlink"])
@pytest.mark.slow
def test_bench_keep_refuses_what_is_planted_at_its_parquet_directory(tmp_path, outside, monkeypatch, capsys, kind):
    keep = tmp_path / "keep"
    outside.plant(kind, keep / "parquet")
    with pytest.raises(SystemExit) as refused:
        _bench(monkeypatch, keep)
    one_line_naming(str(refused.value.code), keep / "parquet")
    outside.assert_planted_left(kind, keep / "parquet")
    outside.assert_untouched()


@pytest.mark.parametrize("kind", ["directory symlink", "symlink", "dangling symlink"])
@pytest.mark.slow
def test_bench_keep_refuses_a_link_planted_between_its_check_and_ingest(tmp_path, outside, monkeypatch, kind):
    keep = tmp_path / "keep"
    (keep / "parquet").mkdir(parents=True)
    (keep / "parquet" / "last-round.parquet").write_bytes(b"x")
    outside.plant_in_window(monkeypatch, kind, keep / "parquet")
    with pytest.raises(SystemExit) as refused:
        _bench(monkeypatch, keep)
    one_line_naming(str(refused.value.code), keep / "parquet")
    outside.assert_planted_left(kind, keep / "parquet")
    outside.assert_untouched()


@pytest.mark.slow
def test_bench_keep_ingests_into_the_directory_it_opened_even_if_a_link_replaces_its_name(
    tmp_path, outside, monkeypatch
):
    """ticklab ingest runs in the round's directory, reached by its descriptor: a link put at DIR/parquet after the
    benchmark opened it is never followed (the tables land in the directory the benchmark made), and the next
    round refuses the link."""
    keep = tmp_path / "keep"
    swapped = []

    def swap_first(argv):
        if not swapped:
            (keep / "parquet").rename(keep / "moved")
            outside.plant("directory symlink", keep / "parquet")
            swapped.append(argv)

    with pytest.raises(SystemExit) as refused:
        _bench(monkeypatch, keep, before_ingest=swap_first)
    one_line_naming(str(refused.value.code), keep / "parquet")
    assert len(swapped) == 1
    assert sorted(p.name for p in (keep / "moved").iterdir()) == TABLES
    outside.assert_untouched()


@pytest.mark.slow
def test_bench_keep_without_anything_planted_writes_its_tables_there(tmp_path, monkeypatch):
    keep = tmp_path / "keep"
    (keep / "parquet").mkdir(parents=True)
    (keep / "parquet" / "last-round.parquet").write_bytes(b"x")
    ran = _bench(monkeypatch, keep)
    assert len(ran) == 5
    assert sorted(p.name for p in (keep / "parquet").iterdir()) == TABLES


# -- 3. ticklab view's cache --------------------------------------------------------------------------------------
SESSION = {"type": "kshark.config.session", "ticklab": {"run": "run-000"}}


@pytest.mark.parametrize("kind", KINDS)
def test_view_session_refuses_what_is_planted_at_its_cache_file(tmp_path, outside, monkeypatch, kind):
    monkeypatch.setenv("TICKLAB_CACHE", str(tmp_path / "cache"))
    session = tmp_path / "cache" / "view" / "20261121T180000Z-ftq-first.json"
    outside.plant(kind, session)
    with pytest.raises(ViewError) as refused:
        write_session(SESSION, session)
    one_line_naming(str(refused.value), session)
    outside.assert_planted_left(kind, session)
    outside.assert_untouched()


@pytest.mark.parametrize("kind", RACES)
def test_view_session_refuses_a_link_planted_between_its_check_and_its_write(tmp_path, outside, monkeypatch, kind):
    monkeypatch.setenv("TICKLAB_CACHE", str(tmp_path / "cache"))
    session = tmp_path / "cache" / "view" / "20261121T180000Z-ftq-first.json"
    session.parent.mkdir(parents=True)
    session.write_text("{}\n")  # the last session, replaced
    outside.plant_in_window(monkeypatch, kind, session)
    with pytest.raises(ViewError) as refused:
        write_session(SESSION, session)
    one_line_naming(str(refused.value), session)
    outside.assert_planted_left(kind, session)
    outside.assert_untouched()


def test_view_cache_directory_planted_as_a_link_is_refused(tmp_path, outside, monkeypatch):
    monkeypatch.setenv("TICKLAB_CACHE", str(tmp_path / "cache"))
    outside.plant("directory symlink", tmp_path / "cache" / "view")
    with pytest.raises(ViewError) as refused:
        write_session(SESSION, tmp_path / "cache" / "view" / "b-first.json")
    one_line_naming(str(refused.value), tmp_path / "cache" / "view")
    outside.assert_untouched()


def test_view_from_the_command_line_names_a_planted_session_file_in_one_line(tmp_path, outside, monkeypatch, capsys):
    from ticklab.analysis.captured import find_bundles

    refs = [
        r
        for r in find_bundles(REPO / "traces", "hrtick")
        if r.host_id.startswith("guest-") and (r.path / SEAL).is_file()
    ]  # sealed: not one being captured now
    if not refs:
        pytest.skip("no sealed guest hrtick bundle in traces/")
    monkeypatch.setenv("TICKLAB_CACHE", str(tmp_path / "cache"))
    session = tmp_path / "cache" / "view" / f"{refs[0].path.name}-first.json"
    outside.plant("symlink", session)
    assert main(["view", str(refs[0].path), "--session-only"]) == 2
    assert one_line_naming(capsys.readouterr().err, session).startswith("ticklab view: ")
    outside.assert_untouched()


def _packed_run(tmp_path) -> tuple[Path, Path]:
    """A run directory whose trace.dat is stored xz'd, and the cache file it is decompressed to."""
    run = tmp_path / "bundle" / "raw" / "run-000" / "trace"
    run.mkdir(parents=True)
    shutil.copyfile(REPO / "tests" / "data" / "compressed" / "source-trace.dat.xz", run / "trace.dat.xz")
    digest = hashlib.sha256((run / "trace.dat.xz").read_bytes()).hexdigest()[:16]
    return run, tmp_path / "cache" / "view" / f"{digest}-trace.dat"


def _tracefs_run(tmp_path) -> tuple[Path, Path]:
    """A run directory holding a tracefs capture, and the cache file its trace.dat is written to."""
    run = sample_files(tmp_path / "bundle")["tracefs"]
    digest = hashlib.sha256()
    for path in sorted(p for p in run.rglob("*") if p.is_file()):
        digest.update(path.name.encode() + path.read_bytes())
    return run, tmp_path / "cache" / "view" / f"{digest.hexdigest()[:16]}-tracefs.dat"


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("stored", ["xz", "tracefs"])
def test_view_trace_cache_refuses_what_is_planted_at_its_name(tmp_path, outside, monkeypatch, stored, kind):
    monkeypatch.setenv("TICKLAB_CACHE", str(tmp_path / "cache"))
    run, cached = (_packed_run if stored == "xz" else _tracefs_run)(tmp_path)
    outside.plant(kind, cached)
    with pytest.raises(ViewError) as refused:
        trace_file(run)
    one_line_naming(str(refused.value), cached)
    outside.assert_planted_left(kind, cached)
    outside.assert_untouched()


@pytest.mark.parametrize("kind", RACES)
@pytest.mark.parametrize("stored", ["xz", "tracefs"])
def test_view_trace_cache_refuses_a_link_planted_between_its_check_and_its_write(
    tmp_path, outside, monkeypatch, stored, kind
):
    monkeypatch.setenv("TICKLAB_CACHE", str(tmp_path / "cache"))
    run, cached = (_packed_run if stored == "xz" else _tracefs_run)(tmp_path)
    outside.plant_in_window(monkeypatch, kind, cached)
    with pytest.raises(ViewError) as refused:
        trace_file(run)
    one_line_naming(str(refused.value), cached)
    outside.assert_planted_left(kind, cached)
    assert sorted(os.listdir(cached.parent)) == [cached.name]  # no temporary or partial file left
    outside.assert_untouched()


@pytest.mark.parametrize("kind", KINDS)
def test_view_trace_cache_never_writes_through_a_planted_partial_file(tmp_path, outside, monkeypatch, kind):
    """The tracefs conversion used to write ``<name>.part`` in the cache and rename it: it is made in a private
    directory now, so what is planted under that name is left alone (and the trace still written)."""
    monkeypatch.setenv("TICKLAB_CACHE", str(tmp_path / "cache"))
    run, cached = _tracefs_run(tmp_path)
    partial = cached.with_name(cached.name + ".part")
    outside.plant(kind, partial)
    assert trace_file(run) == cached and cached.read_bytes()[:3] == b"\x17\x08D"
    assert stat.S_ISREG(os.lstat(cached).st_mode) and os.lstat(cached).st_nlink == 1
    outside.assert_planted_left(kind, partial)
    outside.assert_untouched()


def test_view_trace_cache_is_the_same_bytes_and_a_second_call_is_a_hit(tmp_path, monkeypatch):
    from ticklab.trace import rawfile

    monkeypatch.setenv("TICKLAB_CACHE", str(tmp_path / "cache"))
    run, cached = _packed_run(tmp_path)
    assert trace_file(run) == cached and cached.read_bytes() == rawfile.read_bytes(run / "trace.dat.xz")
    stamp = os.stat(cached).st_mtime_ns
    assert trace_file(run) == cached and os.stat(cached).st_mtime_ns == stamp
    assert sorted(os.listdir(cached.parent)) == [cached.name]


# -- 4. ticklab report --out DIR -----------------------------------------------------------------------------------
@pytest.fixture
def hollow_notebooks(tmp_path) -> Path:
    """A notebook directory whose 03-hrtick notebook does nothing (the report's writes are what is tested)."""
    hollow = nbformat.v4.new_notebook()
    hollow.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    hollow.cells = [nbformat.v4.new_code_cell("output_dir = 'x'", metadata={"tags": ["parameters"]})]
    directory = tmp_path / "notebooks"
    directory.mkdir()
    nbformat.write(hollow, directory / "03-hrtick.ipynb")
    return directory


def _report_dir(tmp_path) -> Path:
    """A report directory a previous (empty) report made: its marker lists nothing."""
    out = tmp_path / "out"
    outdir.record(out, outdir.claim(out, replace=True))
    return out


def _report(out: Path, notebooks: Path) -> tuple[int, list[str]]:
    log = []
    code = run_report(
        out,
        data_dir=paths.traces_dir(),
        published_dir=paths.published_dir(),
        only=["03-hrtick"],
        notebook_dir=notebooks,
        log=log.append,
    )
    return code, log


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "name", ["summary.json", "report/index.html", "notebooks/03-hrtick.ipynb", "report/notebooks/03-hrtick.html"]
)
def test_report_refuses_what_is_planted_where_it_writes(tmp_path, outside, hollow_notebooks, kind, name):
    out = _report_dir(tmp_path)
    outside.plant(kind, out / name)
    code, log = _report(out, hollow_notebooks)
    assert code == 2 and len(log) == 1, log
    assert one_line_naming(log[0], out / name).startswith("error: ")
    assert not (out / "notebooks" / "03-hrtick.ipynb").is_file() or name == "notebooks/03-hrtick.ipynb"
    outside.assert_planted_left(kind, out / name)
    outside.assert_untouched()


@pytest.mark.parametrize("kind", KINDS)
def test_report_marker_planted_as_a_hard_link_fifo_or_device_is_refused(tmp_path, outside, hollow_notebooks, kind):
    out = _report_dir(tmp_path)
    (out / outdir.MARKER).unlink()
    outside.plant(kind, out / outdir.MARKER)
    code, log = _report(out, hollow_notebooks)
    assert code == 2 and len(log) == 1, log
    assert one_line_naming(log[0], out).startswith("error: ")
    outside.assert_planted_left(kind, out / outdir.MARKER)
    outside.assert_untouched()


@pytest.mark.parametrize("kind", KINDS)
def test_report_never_writes_through_a_file_planted_at_the_markers_old_temporary_name(tmp_path, outside, kind):
    out = _report_dir(tmp_path)
    outside.plant(kind, out / ".ticklab-report.tmp")
    try:
        outdir.claim(out, replace=True)
    except outdir.OutputDirError as exc:  # a link anywhere in the directory is refused as before
        one_line_naming(str(exc), out / ".ticklab-report.tmp")
    outside.assert_planted_left(kind, out / ".ticklab-report.tmp")
    outside.assert_untouched()


@pytest.mark.parametrize("kind", RACES)
@pytest.mark.parametrize("name", [pytest.param("summary.json", marks=pytest.mark.slow), outdir.MARKER])
def test_report_refuses_a_link_planted_between_its_check_and_its_write(
    tmp_path, outside, monkeypatch, hollow_notebooks, kind, name
):
    out = _report_dir(tmp_path)
    (out / "summary.json").write_text("{}\n")  # the last report's, to be replaced
    outside.plant_in_window(monkeypatch, kind, out / name)
    code, log = _report(out, hollow_notebooks)
    assert code == 2, log
    errors = [line for line in log if line.startswith("error: ")]
    assert len(errors) == 1, log
    one_line_naming(errors[0], out / name)
    outside.assert_planted_left(kind, out / name)
    outside.assert_untouched()


# -- 5. ticklab ingest --out ---------------------------------------------------------------------------------------
TABLE = "timer__tick_stop.parquet"


@pytest.mark.parametrize("kind", KINDS)
def test_ingest_out_refuses_what_is_planted_at_a_tables_name(tmp_path, outside, capsys, kind):
    out = tmp_path / "out"
    outside.plant(kind, out / TABLE)
    assert main(["ingest", str(TRACE), "--out", str(out)]) == 2
    assert one_line_naming(capsys.readouterr().err, out / TABLE).startswith("ticklab ingest: ")
    assert sorted(os.listdir(out)) == [TABLE]  # checked before the first table is written: nothing else there
    outside.assert_planted_left(kind, out / TABLE)
    outside.assert_untouched()


@pytest.mark.parametrize("kind", RACES)
def test_ingest_out_refuses_a_link_planted_between_its_check_and_its_write(
    tmp_path, outside, monkeypatch, capsys, kind
):
    out = tmp_path / "out"
    out.mkdir()
    (out / TABLE).write_bytes(b"the last ingest's table\n")
    outside.plant_in_window(monkeypatch, kind, out / TABLE)
    assert main(["ingest", str(TRACE), "--out", str(out)]) == 2
    assert one_line_naming(capsys.readouterr().err, out / TABLE).startswith("ticklab ingest: ")
    assert not any(name.startswith(".") for name in os.listdir(out))  # no temporary file left
    outside.assert_planted_left(kind, out / TABLE)
    outside.assert_untouched()


def test_ingest_out_replaces_its_own_tables_with_the_same_bytes(tmp_path, capsys):
    first, second = tmp_path / "first", tmp_path / "second"
    assert main(["ingest", str(TRACE), "--out", str(first)]) == 0
    second.mkdir()
    for table in os.listdir(first):
        (second / table).write_bytes(b"an older table\n")
    assert main(["ingest", str(TRACE), "--out", str(second)]) == 0
    assert {p.name: p.read_bytes() for p in first.iterdir()} == {p.name: p.read_bytes() for p in second.iterdir()}
    assert all(os.lstat(p).st_nlink == 1 for p in second.iterdir())
