"""`ticklab report --out DIR` deletes or overwrites only what an earlier report wrote there (issue 14, defect 1)."""

import json
import os
import subprocess
import sys

import nbformat
import pytest

from conftest import REPO
from ticklab import paths
from ticklab.report import outdir
from ticklab.report.build import run_report


def _previous_report(directory):
    """A directory as a finished report leaves it: its outputs and the marker listing them."""
    foreign = outdir.claim(directory, replace=True)
    for relative in ("notebooks/01-hpet.ipynb", "figures/hpet/a.png", "summary.json", "verdicts.csv"):
        (directory / relative).parent.mkdir(parents=True, exist_ok=True)
        (directory / relative).write_text("old output\n")
    outdir.record(directory, foreign)


def test_a_full_run_removes_only_the_files_the_last_report_wrote(tmp_path):
    out = tmp_path / "build"
    _previous_report(out)
    (out / "figures/hpet/mine.png").write_text("my figure\n")
    (out / "notes.txt").write_text("my notes\n")
    outdir.claim(out, replace=True)
    assert (out / "figures/hpet/mine.png").read_text() == "my figure\n"
    assert (out / "notes.txt").read_text() == "my notes\n"
    assert not (out / "summary.json").exists() and not (out / "notebooks").exists()


def test_a_directory_not_made_by_report_is_refused_and_left_as_it_was(tmp_path):
    (tmp_path / "figures").mkdir()
    (tmp_path / "figures" / "mine.png").write_text("my figure\n")
    (tmp_path / "summary.json").write_text("{}")
    log = []
    code = run_report(tmp_path, data_dir=paths.traces_dir(), published_dir=paths.published_dir(), log=log.append)
    assert code == 2
    assert log == [
        f"error: {tmp_path}: not empty and not made by 'ticklab report' (no .ticklab-report in it); "
        "give a new or empty directory so nothing of yours is overwritten"
    ]
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["figures", "mine.png", "summary.json"]


@pytest.mark.slow
def test_out_dot_at_the_repository_root_refuses(tmp_path):
    tracked = subprocess.run(["git", "ls-files", "notebooks"], cwd=REPO, capture_output=True, text=True).stdout.split()
    proc = subprocess.run(
        [sys.executable, "-m", "ticklab.cli", "report", "--out", "."],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "not empty and not made by 'ticklab report'" in proc.stdout + proc.stderr
    assert all((REPO / name).is_file() for name in tracked) and tracked
    assert not (REPO / outdir.MARKER).exists()


def test_an_unwritable_out_is_one_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    log = []
    assert (
        run_report(
            blocker / "sub",
            data_dir=paths.traces_dir(),
            published_dir=paths.published_dir(),
            only=["05-nohz"],
            log=log.append,
        )
        == 2
    )
    assert len(log) == 1 and str(blocker / "sub") in log[0] and "cannot write" in log[0]


@pytest.mark.slow
def test_a_report_run_keeps_my_file_and_records_what_it_wrote(tmp_path):
    hollow = nbformat.v4.new_notebook()
    hollow.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    hollow.cells = [nbformat.v4.new_code_cell("output_dir = 'x'", metadata={"tags": ["parameters"]})]
    notebook_dir = tmp_path / "notebooks"
    notebook_dir.mkdir()
    nbformat.write(hollow, notebook_dir / "03-hrtick.ipynb")
    out = tmp_path / "out"
    _previous_report(out)
    (out / "mine.txt").write_text("keep me\n")
    run_report(
        out,
        data_dir=paths.traces_dir(),
        published_dir=paths.published_dir(),
        only=["03-hrtick"],
        notebook_dir=notebook_dir,
        log=lambda _: None,
    )
    assert (out / "mine.txt").read_text() == "keep me\n"
    marker = json.loads((out / outdir.MARKER).read_text())
    assert "notebooks/03-hrtick.ipynb" in marker["files"] and "mine.txt" not in marker["files"]
    outdir.claim(out, replace=True)  # the next full run
    assert (out / "mine.txt").read_text() == "keep me\n" and not (out / "notebooks").exists()


def test_an_interrupted_run_still_knows_its_files(tmp_path):
    out = tmp_path / "out"
    _previous_report(out)
    (out / "mine.txt").write_text("keep me\n")
    outdir.claim(out, replace=True)
    (out / "figures").mkdir()
    (out / "figures" / "half-written.png").write_text("x")  # then the run is killed: no record()
    outdir.claim(out, replace=True)
    assert sorted(p.name for p in out.iterdir()) == [outdir.MARKER, "mine.txt"]


def test_files_a_user_adds_after_a_killed_run_are_kept(tmp_path):
    out = tmp_path / "out"
    foreign = outdir.claim(out, replace=True)
    (out / "notebooks").mkdir()
    (out / "notebooks" / "01-hpet.ipynb").write_text("x")
    outdir.progress(out, foreign)  # after the first notebook; then the run is SIGKILLed
    (out / "figures").mkdir()
    (out / "figures" / "half-written.png").write_text("x")
    (out / "my-notes.txt").write_text("added after the kill\n")
    outdir.claim(out, replace=True)
    assert sorted(p.name for p in out.iterdir()) == [outdir.MARKER, "my-notes.txt"]


def _planted(tmp_path):
    """A report directory whose marker lists a file reached through a symlinked subdirectory."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious").write_text("keep me\n")
    out = tmp_path / "out"
    out.mkdir(mode=0o700)
    (out / "sub").symlink_to(victim)
    (out / outdir.MARKER).write_text(json.dumps({"files": ["sub/precious"]}))
    return out, victim


def test_a_marker_never_deletes_through_a_symlinked_directory(tmp_path):
    out, victim = _planted(tmp_path)
    with pytest.raises(outdir.OutputDirError, match="a symbolic link in the output directory"):
        outdir.claim(out, replace=True)
    assert (victim / "precious").read_text() == "keep me\n"


def test_a_symlinked_subdirectory_is_refused_before_anything_is_written(tmp_path):
    out = tmp_path / "out"
    outdir.claim(out, replace=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (out / "notebooks").symlink_to(elsewhere)
    log = []
    assert (
        run_report(
            out, data_dir=paths.traces_dir(), published_dir=paths.published_dir(), only=["05-nohz"], log=log.append
        )
        == 2
    )
    assert log == [
        f"error: {out / 'notebooks'}: a symbolic link in the output directory; ticklab report does not "
        "write through links (remove it or choose another --out)"
    ]
    assert list(elsewhere.iterdir()) == []


def test_a_directory_other_users_can_write_is_refused(tmp_path):
    out, victim = _planted(tmp_path)
    out.chmod(0o777)
    log = []
    assert run_report(out, data_dir=paths.traces_dir(), published_dir=paths.published_dir(), log=log.append) == 2
    assert log == [
        f"error: {out}: the directory is writable by other users (mode 777); "
        "ticklab report only replaces files in a directory nobody else can write"
    ]
    assert (victim / "precious").read_text() == "keep me\n"


def test_a_marker_owned_by_another_user_is_not_trusted(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("changing a file's owner needs root")
    out, victim = _planted(tmp_path)
    os.chown(out / outdir.MARKER, 65534, 65534, follow_symlinks=False)
    with pytest.raises(outdir.OutputDirError, match=r"its report marker is owned by uid 65534, not by you"):
        outdir.claim(out, replace=True)
    assert (victim / "precious").read_text() == "keep me\n"


def test_an_out_below_a_directory_others_can_change_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # not sticky: another user could swap out/ for a link between our checks and our writes
    log = []
    assert (
        run_report(
            shared / "out",
            data_dir=paths.traces_dir(),
            published_dir=paths.published_dir(),
            only=["05-nohz"],
            log=log.append,
        )
        == 2
    )
    assert log == [
        f"error: {shared / 'out'}: {shared} above it can be changed by another user (owner uid "
        f"{os.geteuid()}, mode 777); choose an --out below directories only root or you can change"
    ]
    assert not (shared / "out").exists()


def test_a_notebook_writes_no_output_through_a_link_planted_under_the_output_directory(tmp_path):
    """Outputs (what every notebook writes) opens each directory below --out by descriptor: a link another user
    planted there (between the report's check and the notebook's write) is refused and its target untouched."""
    import pandas as pd

    from ticklab.analysis.outputs import Outputs
    from ticklab.safefiles import UnsafeFileError

    victim = tmp_path / "victim"
    victim.mkdir()
    out = tmp_path / "build"
    (out / "tables").mkdir(parents=True)
    (out / "tables" / "nohz").symlink_to(victim)
    with pytest.raises(UnsafeFileError, match=r"build/tables/nohz: a symbolic link, not a directory"):
        Outputs(out, "nohz").table("t", pd.DataFrame({"a": [1]}), caption="c", sources=["x"])
    assert list(victim.iterdir()) == []
    written = Outputs(out, "hpet").table("t", pd.DataFrame({"a": [1]}), caption="c", sources=["x"])
    assert written.read_text() == "a\n1\n" and sorted(p.name for p in written.parent.iterdir()) == [
        "t.csv",
        "t.json",
        "t.md",
    ]
