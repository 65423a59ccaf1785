"""ticklab as an installed package (issue 41, item 5): it declares every package it imports with the floor the code
needs, validation is never silently off, and it finds its project directory (notebooks, runners, kernel/, traces/)
only from --project, $TICKLAB_PROJECT or the checkout it runs from or was installed from — never the working
directory. A wheel installed into a fresh environment runs doctor and a report from another directory when told
where the checkout is, and says in one line what it needs when not."""

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from conftest import REPO
from ticklab import paths
from ticklab.cli import main

# import name -> distribution name, where they differ
DISTRIBUTIONS = {"yaml": "pyyaml", "IPython": "ipython"}


def _declared() -> dict[str, Requirement]:
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())
    return {canonicalize_name(r.name): r for r in map(Requirement, meta["project"]["dependencies"])}


def _floor(requirement: Requirement) -> Version | None:
    floors = [Version(s.version) for s in requirement.specifier if s.operator == ">="]
    return max(floors) if floors else None


def _imported_packages() -> dict[str, set[str]]:
    """Every third-party top-level module src/ticklab imports, with the files that import it."""
    found: dict[str, set[str]] = {}
    for path in (REPO / "src" / "ticklab").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module]
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                else []
            )
            for name in names:
                top = name.split(".")[0]
                if top != "ticklab" and top not in sys.stdlib_module_names:
                    found.setdefault(top, set()).add(str(path.relative_to(REPO)))
    return found


@pytest.mark.slow
def test_every_package_ticklab_imports_is_declared_with_a_floor():
    declared = _declared()
    imported = _imported_packages()
    assert "jsonschema" in imported and "jupyter_client" in imported
    missing = {
        m: sorted(files) for m, files in imported.items() if canonicalize_name(DISTRIBUTIONS.get(m, m)) not in declared
    }
    assert missing == {}, "imported but not in pyproject.toml's dependencies"
    assert [name for name, r in declared.items() if _floor(r) is None] == []


def test_pyproject_floors_are_what_the_code_needs_and_requirements_in_asks():
    """jsonschema >= 4 (Draft202012Validator; nbformat alone accepts 2.6), ipykernel >= 7.4 (requirements.in's floor),
    and no floor in requirements.in above pyproject's: an install from pyproject gets what the lock was made for."""
    declared = _declared()
    assert _floor(declared["jsonschema"]) >= Version("4")
    assert _floor(declared["ipykernel"]) >= Version("7.4")
    lower = {}
    for line in (REPO / "requirements.in").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            wanted = Requirement(line)
            name = canonicalize_name(wanted.name)
            if _floor(wanted) and name in declared and (_floor(declared[name]) or Version("0")) < _floor(wanted):
                lower[name] = (str(declared[name].specifier), str(wanted.specifier))
    assert lower == {}, "pyproject.toml's floor is below requirements.in's"


@pytest.mark.slow
def test_a_missing_jsonschema_is_an_import_error_everywhere(tmp_path):
    blocker = tmp_path / "blocked" / "jsonschema"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('No module named jsonschema (blocked by the test)')\n")
    env = {**os.environ, "PYTHONPATH": f"{blocker.parent}{os.pathsep}{REPO / 'src'}"}
    proc = subprocess.run(
        [sys.executable, "-c", "import ticklab.schemas"], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 1 and "DependencyError: ticklab needs jsonschema >= 4" in proc.stderr, proc.stderr
    proc = subprocess.run(
        [sys.executable, "-m", "ticklab.cli", "verify", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 2 and proc.stderr.startswith("ticklab verify: ticklab needs jsonschema >= 4"), proc.stderr
    # the lab guest's runner too (its image carries jsonschema, runners/vm/image.yaml): validation is never off
    proc = subprocess.run(
        [sys.executable, "-m", "ticklab.lab.guest"], capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path
    )
    assert proc.returncode == 1 and "DependencyError: ticklab needs jsonschema >= 4" in proc.stderr, proc.stderr


@pytest.fixture
def no_project(monkeypatch):
    """This process as a wheel installed elsewhere: no --project, no $TICKLAB_PROJECT, no checkout around it."""
    monkeypatch.setattr(paths, "_explicit", None)
    monkeypatch.delenv(paths.ENV, raising=False)
    monkeypatch.setattr(paths, "_in_tree", lambda: None)
    monkeypatch.setattr(paths, "_installed_from", lambda: None)


def _checkout(directory: Path) -> Path:
    (directory / "traces").mkdir(parents=True)
    (directory / "pyproject.toml").write_text('[project]\nname = "ticklab"\n')
    return directory


def test_the_project_is_what_project_or_the_environment_names_never_the_working_directory(
    no_project, monkeypatch, tmp_path
):
    monkeypatch.chdir(REPO)  # a checkout as the working directory is not taken by accident
    with pytest.raises(paths.ProjectError, match="no project directory: pass --project DIR or set TICKLAB_PROJECT"):
        paths.repo_root()
    other = _checkout(tmp_path / "other")
    monkeypatch.setenv(paths.ENV, str(other))
    assert paths.repo_root() == other.resolve() and paths.published_dir() == other.resolve() / "traces" / "published"
    paths.set_project(REPO)  # --project wins over the environment, and is handed to the processes ticklab starts
    assert paths.repo_root() == REPO and os.environ[paths.ENV] == str(REPO)
    with pytest.raises(paths.ProjectError, match="not a ticklab checkout"):
        paths.set_project(tmp_path)
    monkeypatch.setenv(paths.ENV, str(tmp_path / "gone"))
    monkeypatch.setattr(paths, "_explicit", None)
    with pytest.raises(paths.ProjectError, match="TICKLAB_PROJECT .*gone: no such directory"):
        paths.repo_root()


@pytest.mark.parametrize(
    "argv",
    [
        ["doctor"],
        ["report", "--only", "02-pvspinlock"],
        ["capture", "nohz", "--dry-run"],
        ["claims", "--host"],
        ["lab", "run", "nohz", "--runs", "1"],
    ],
)
def test_without_a_project_a_command_that_needs_one_says_so_in_one_line(no_project, capsys, argv):
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert (
        captured.err == "ticklab: no project directory: pass --project DIR or set TICKLAB_PROJECT to a ticklab "
        "checkout\n"
    )


def test_commands_that_need_no_project_run_without_one(no_project, capsys):
    assert main(["claims"]) == 0
    assert "pvspinlock" in capsys.readouterr().out.split()
    with pytest.raises(SystemExit) as exited:
        main(["lab", "build-kernel", "--help"])  # its epilog lists kernel/sources.yaml: it says why it cannot
    assert exited.value.code == 0 and "no project directory" in capsys.readouterr().out


def test_a_pip_install_from_a_checkout_finds_that_checkout(monkeypatch, tmp_path):
    """PEP 610: `pip install DIR` records the directory (dir_info); a wheel file or an index records an archive."""
    import importlib.metadata

    checkout = _checkout(tmp_path / "checkout")
    recorded = {}

    class Installed:
        def read_text(self, name):
            return json.dumps(recorded) if name == "direct_url.json" else None

    monkeypatch.setattr(importlib.metadata, "distribution", lambda name: Installed())
    paths._installed_from.cache_clear()
    try:
        recorded.update(url=checkout.as_uri(), dir_info={})
        assert paths._installed_from() == checkout
        paths._installed_from.cache_clear()
        recorded.clear()
        recorded.update(url=(tmp_path / "ticklab-0.1.0-py3-none-any.whl").as_uri(), archive_info={})
        assert paths._installed_from() is None
    finally:
        paths._installed_from.cache_clear()


def _copy_sources(target: Path) -> Path:
    """What the wheel is built from, in a scratch directory: setuptools writes build/ and *.egg-info beside the sources,
    and build/ in the checkout is the report's."""
    target.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md", "LICENSE"):
        shutil.copy2(REPO / name, target / name)
    shutil.copytree(
        REPO / "src" / "ticklab",
        target / "src" / "ticklab",
        ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.egg-info"),
    )
    return target


@pytest.mark.slow
@pytest.mark.xdist_group("machine")
def test_a_wheel_installed_elsewhere_runs_doctor_and_a_report_with_its_project(tmp_path):
    """Build the wheel offline, install it alone into a fresh environment (its dependencies come from this one's
    site-packages, appended after its own), and run it from a directory outside the checkout."""
    sources = _copy_sources(tmp_path / "sources")
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--quiet",
            "-w",
            str(tmp_path / "dist"),
            str(sources),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    [wheel] = (tmp_path / "dist").glob("ticklab-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    installed = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(venv / "bin" / "python"),
            "install",
            "--no-deps",
            "--no-index",
            "--quiet",
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert installed.returncode == 0, installed.stderr[-3000:]
    site = Path(
        subprocess.run(
            [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    (site / "ticklab-test-dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {
        k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", paths.ENV, "TICKLAB_TRACEBACK")
    }
    # nbconvert's templates live in the share/ of the environment its package came from (an ordinary install puts
    # both in the new one)
    env["JUPYTER_PATH"] = str(Path(sys.prefix) / "share" / "jupyter")

    def ticklab(*argv, project=None):
        return subprocess.run(
            [str(venv / "bin" / "ticklab"), *argv],
            capture_output=True,
            text=True,
            cwd=elsewhere,
            env={**env, **({paths.ENV: str(project)} if project else {})},
            timeout=900,
            stdin=subprocess.DEVNULL,
        )

    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import ticklab; print(ticklab.__file__)"],
        capture_output=True,
        text=True,
        cwd=elsewhere,
        env=env,
        check=True,
    ).stdout
    assert where.startswith(str(site)), where  # the wheel's package, not the checkout's sources

    for argv in (
        ["doctor"],
        ["report", "--only", "02-pvspinlock", "--out", str(tmp_path / "nowhere")],
        ["capture", "nohz", "--dry-run"],
    ):
        proc = ticklab(*argv)
        assert (proc.returncode, proc.stdout, proc.stderr) == (
            2,
            "",
            "ticklab: no project directory: pass --project DIR or set TICKLAB_PROJECT to a ticklab checkout\n",
        )
    assert not (tmp_path / "nowhere").exists()

    doctor = ticklab("doctor", project=REPO)
    assert doctor.returncode == 0, doctor.stderr[-3000:]
    assert "needs the guest lab" not in doctor.stdout and re.search(r"^nohz +ftq ", doctor.stdout, re.M), doctor.stdout
    out = tmp_path / "report"
    report = ticklab("report", "--only", "02-pvspinlock", "--out", str(out), project=REPO)
    assert report.returncode == 0, report.stdout[-2000:] + report.stderr[-3000:]
    assert (out / "verdicts" / "pvspinlock.csv").stat().st_size > 0
    assert json.loads((out / "summary.json").read_text())["notebooks"][0]["status"] == "ok"
    listed = ticklab("--project", str(REPO), "claims", "--host")
    assert listed.returncode == 0 and "hpet" in listed.stdout.split(), listed.stderr
