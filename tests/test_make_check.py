"""`make check`, the edit-test loop's fast lane (issue 42 item 2): it runs on make test's xdist workers with make test's
scheduling and leaves out the slow tests. Read from the command make itself would run (a dry run), so a variable or
an edited recipe cannot hide a lost option."""

import os
import shlex
import shutil
import subprocess

import pytest

from conftest import REPO


def pytest_options(target: str) -> list[str]:
    """The options of the pytest command that ``make <target>`` runs, as make expands them (``make -n``)."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    # the Makefile's defaults, not whatever this shell or an outer make passes down
    environment = {
        name: value
        for name, value in os.environ.items()
        if name not in ("TEST_WORKERS", "MAKEFLAGS", "MFLAGS", "MAKELEVEL")
    }
    done = subprocess.run(
        ["make", "-n", "--no-print-directory", "-C", str(REPO), target], capture_output=True, text=True, env=environment
    )
    assert done.returncode == 0, done.stderr
    commands = [line for line in done.stdout.splitlines() if " -m pytest " in line]
    assert len(commands) == 1, f"make {target} should run pytest once:\n{done.stdout}"
    words = shlex.split(commands[0])
    return [word for word in words[words.index("pytest") + 1 :] if not word.startswith("<")]


def option_value(options: list[str], name: str) -> str | None:
    values = [options[index + 1] for index, word in enumerate(options[:-1]) if word == name]
    values += [word.split("=", 1)[1] for word in options if word.startswith(name + "=")]
    assert len(values) <= 1, f"{name} given twice: {options}"
    return values[0] if values else None


def test_make_check_runs_on_the_workers_of_make_test_with_its_scheduling():
    check, test = pytest_options("check"), pytest_options("test")
    assert option_value(check, "-n") == option_value(test, "-n") == "2", (check, test)
    # --no-loadscope-reorder keeps conftest.py's order, the longest groups handed out first
    assert "--no-loadscope-reorder" in check, check
    for option in test:
        assert option in check, f"make test runs pytest with {option}, make check does not: {check}"


def test_make_check_leaves_out_the_tests_marked_slow_and_make_test_runs_them():
    assert option_value(pytest_options("check"), "-m") == "not slow"
    assert option_value(pytest_options("test"), "-m") is None


def test_a_tests_group_is_its_xdist_group_mark_or_its_modules_or_else_its_module(tmp_path):
    from conftest import group_of, xdist_groups

    module = tmp_path / "test_planted.py"
    module.write_text(
        "import pytest\n\npytestmark = [pytest.mark.slow, pytest.mark.xdist_group('guests')]\n\n\n"
        "@pytest.mark.xdist_group('machine')\n@pytest.mark.parametrize('x', [1])\ndef test_own(x):\n"
        "    pass\n\n\ndef test_inherits():\n    pass\n"
    )
    assert xdist_groups(module) == ("guests", {"test_own": "machine"})
    assert group_of("tests/test_capture.py::test_anything") == "machine"  # a module marked as a whole
    assert group_of("tests/test_lab_sources.py::test_anything[p]") == "guests"
    # its own mark before its module's
    assert group_of("tests/test_lab.py::test_the_guest_side_makes_one_run_into_the_share") == "machine"
    assert group_of("tests/test_ingest_fast.py::test_anything") == "test_ingest_fast.py"  # no mark: its own group


def test_the_slow_and_group_marks_are_marks_not_name_lists():
    conftest_source = (REPO / "tests" / "conftest.py").read_text()
    for name_list in ("SLOW_TESTS", "SLOW_MODULES", "MACHINE_MODULES", "MACHINE_TESTS", "GUEST_MODULES"):
        assert name_list not in conftest_source
    assert "--strict-markers" in (REPO / "pyproject.toml").read_text()  # a mistyped mark fails collection


def make_bytecode_settings(home, **environment) -> tuple[str, str]:
    """PYTHONPYCACHEPREFIX and PYTHONDONTWRITEBYTECODE as the Makefile exports them to its recipes, run with
    ``home`` as HOME."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in ("PYTHONPYCACHEPREFIX", "MAKEFLAGS", "MFLAGS", "MAKELEVEL")
    }
    env.update(HOME=str(home), **environment)
    done = subprocess.run(
        ["make", "-s", "--no-print-directory", "-C", str(REPO), "--eval",
         'show-pycache: ; @echo "$$PYTHONPYCACHEPREFIX|$$PYTHONDONTWRITEBYTECODE"', "show-pycache"],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    prefix, _, dont_write = done.stdout.strip().partition("|")
    return prefix, dont_write


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory to another user")
def test_bytecode_for_root_never_comes_from_a_directory_another_user_can_write(tmp_path):
    """Issue 55 item 3: with another user's HOME kept (sudo -E), root took its bytecode from that user's
    ~/.cache/ticklab/pycache, where a planted .pyc ran as uid 0."""
    tmp_path.chmod(0o755)
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o755)
    assert make_bytecode_settings(mine) == (f"{mine}/.cache/ticklab/pycache", "")

    theirs = tmp_path / "theirs"
    (theirs / ".cache/ticklab/pycache").mkdir(parents=True)
    for directory in (theirs, theirs / ".cache", theirs / ".cache/ticklab", theirs / ".cache/ticklab/pycache"):
        os.chown(directory, 65534, 65534)
    assert make_bytecode_settings(theirs) == ("", "1")

    shared = mine / ".cache"  # HOME ours, but a directory of the prefix writable by others
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    assert make_bytecode_settings(mine) == ("", "1")
    # a prefix inherited from the environment is held to the same rule
    assert make_bytecode_settings(mine, PYTHONPYCACHEPREFIX=str(theirs / "p")) == ("", "1")
    assert make_bytecode_settings(theirs, PYTHONPYCACHEPREFIX=str(mine / "own")) == (f"{mine}/own", "")
