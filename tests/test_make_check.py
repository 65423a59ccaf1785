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
    environment = {name: value for name, value in os.environ.items()
                   if name not in ("TEST_WORKERS", "MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    done = subprocess.run(["make", "-n", "--no-print-directory", "-C", str(REPO), target],
                          capture_output=True, text=True, env=environment)
    assert done.returncode == 0, done.stderr
    commands = [line for line in done.stdout.splitlines() if " -m pytest " in line]
    assert len(commands) == 1, f"make {target} should run pytest once:\n{done.stdout}"
    words = shlex.split(commands[0])
    return [word for word in words[words.index("pytest") + 1:] if not word.startswith("<")]


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
