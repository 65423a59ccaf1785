"""Issue 56 item 5, "a wheel on its own": a wheel carries what doctor, capture and report on the user's own data need
(notebooks, runners/, kernel/, the published tables, the tools' sources; not the captured bundles), and from a fresh
venv holding only that wheel of ticklab, run from /tmp: `ticklab doctor`, `capture nohz --dry-run` and
`papermill --engine ticklab` on a notebook with `-p data_dir` work; a notebook without a project ends in one line.

The wheel is built from a copy of the checkout's files the wheel needs (so no build/ is written into the checkout and
no bundle is at hand); its dependencies come from this environment's site-packages through a .pth line (no index is
asked), which does not run this environment's editable-install hook: `ticklab` is the wheel's."""

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from conftest import REPO, WAIT_BOUND_S

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("machine")]  # the dry run takes the host lock

COPIED = ["src", "setup.py", "pyproject.toml", "README.md", "LICENSE", "MANIFEST.in", "notebooks", "runners", "kernel"]


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory):
    base = tmp_path_factory.mktemp("wheel")
    source = base / "src"
    source.mkdir()
    for name in COPIED:
        (shutil.copytree if (REPO / name).is_dir() else shutil.copy2)(REPO / name, source / name)
    shutil.copytree(REPO / "tools", source / "tools", ignore=shutil.ignore_patterns("bin"))
    shutil.copytree(REPO / "traces/published", source / "traces/published")
    for stale in [*source.rglob("*.so"), *source.rglob("__pycache__")]:
        shutil.rmtree(stale) if stale.is_dir() else stale.unlink()
    wheels = base / "wheels"
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(wheels),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=WAIT_BOUND_S,
    )
    assert built.returncode == 0, built.stderr
    [wheel] = wheels.glob("ticklab-*.whl")
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=WAIT_BOUND_S)
    [site] = venv.glob("lib/python3*/site-packages")
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(site), str(wheel)],
        capture_output=True,
        text=True,
        timeout=WAIT_BOUND_S,
    )
    assert installed.returncode == 0, installed.stderr
    home = base / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TICKLAB_")} | {"TICKLAB_HOME": str(home)}
    return wheel, venv, site, home, env


def run(venv: Path, env: dict, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(venv / "bin/python"), *argv], capture_output=True, text=True, cwd="/tmp", env=env, timeout=WAIT_BOUND_S
    )


def test_the_wheel_carries_the_project_files_but_no_bundle(wheel_venv):
    wheel = wheel_venv[0]
    names = zipfile.ZipFile(wheel).namelist()
    carried = {n.split("/")[2] for n in names if n.startswith("ticklab/project/")}
    assert carried == {"notebooks", "runners", "kernel", "traces", "tools", "pyproject.toml"}
    assert "ticklab/project/notebooks/05-nohz.ipynb" in names and "ticklab/project/tools/ftq.c" in names
    assert "ticklab/project/traces/published/nohz/provenance.yaml" in names
    assert not [n for n in names if n.startswith("ticklab/project/traces/") and "/published/" not in n]
    assert not [n for n in names if n.startswith("ticklab/project/tools/bin")]


def test_ticklab_from_the_wheel_finds_its_own_project_and_writes_in_ticklab_home(wheel_venv):
    _, venv, site, home, env = wheel_venv
    done = run(
        venv, env, "-c", "import ticklab.paths as p; print(p.__file__); print(*p.find_project()); print(p.work_dir())"
    )
    where, project, work = done.stdout.splitlines()
    assert where == str(site / "ticklab/paths.py")
    assert project == f"{site / 'ticklab/project'} the project files this wheel carries" and work == str(home)


def test_doctor_and_a_capture_dry_run_from_tmp(wheel_venv):
    _, venv, site, home, env = wheel_venv
    doctor = run(venv, env, "-m", "ticklab.cli", "doctor")
    assert doctor.returncode == 0 and "nohz" in doctor.stdout, doctor.stderr
    dry = run(venv, env, "-m", "ticklab.cli", "capture", "nohz", "--dry-run")
    if "the host is held by" in dry.stderr:
        pytest.skip(f"another capture holds the host: {dry.stderr.strip()}")
    assert dry.returncode == 0, dry.stderr
    assert "no project directory" not in dry.stdout + dry.stderr
    # what it cannot run says how to build the tools from the carried sources into TICKLAB_HOME, not site-packages
    if "missing: run" in dry.stdout:
        assert f"run 'make -C {site / 'ticklab/project/tools'} BIN={home / 'tools/bin'}'" in dry.stdout
    assert not (site / "ticklab/project/build").exists() and not (site / "ticklab/project/tools/bin").exists()


def test_papermill_runs_a_notebook_with_data_dir_from_tmp_and_writes_in_ticklab_home(wheel_venv, tmp_path):
    _, venv, site, home, env = wheel_venv
    executed = tmp_path / "out.ipynb"
    notebook = site / "ticklab/project/notebooks/01-hpet.ipynb"
    done = run(
        venv,
        env,
        "-m",
        "papermill",
        "--engine",
        "ticklab",
        "-p",
        "data_dir",
        str(tmp_path),
        str(notebook),
        str(executed),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert (home / "build/verdicts/hpet.csv").is_file()
    assert not (site / "ticklab/project/build").exists()


def test_a_notebook_without_a_project_ends_in_one_line(wheel_venv, tmp_path):
    _, venv, site, home, env = wheel_venv
    notebook = site / "ticklab/project/notebooks/01-hpet.ipynb"
    env = env | {"TICKLAB_PROJECT": str(tmp_path / "none")}
    done = run(venv, env, "-m", "papermill", "--engine", "ticklab", str(notebook), str(tmp_path / "out.ipynb"))
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()
    assert re.fullmatch(
        rf"ticklab: TICKLAB_PROJECT {re.escape(str(tmp_path / 'none'))}: no such directory \(it must name a ticklab "
        r"checkout\) \(cell \d+\)",
        last[-1],
    ), last[-1]
    assert "Traceback" not in done.stderr and "PapermillExecutionError" not in done.stderr
