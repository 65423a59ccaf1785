"""Every command: bad input is one line on stderr naming the file, exit 2, never a traceback (issue 14, deliverable 4)."""

import os
import subprocess
import sys

import pytest

from conftest import REPO
from test_bundle import make_bundle


def _ticklab(*argv, cwd=REPO):
    env = {k: v for k, v in os.environ.items() if k != "TICKLAB_TRACEBACK"}
    return subprocess.run([sys.executable, "-m", "ticklab.cli", *map(str, argv)], capture_output=True, text=True,
                          timeout=120, cwd=cwd, env=env)


@pytest.fixture
def bad_bundle(tmp_path):
    path = make_bundle(tmp_path / "bad")
    (path / "manifest.json").chmod(0o644)
    (path / "manifest.json").write_bytes(b'{"schema_version": 1, "status": "sealed", "runs": [{"run": 5}]}')
    return path


@pytest.fixture
def bad_experiment(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_bytes(b"claim: nohz\nname: x\ndescription: d\nconditions: 5\nworkload: {argv: [true]}\nruns: many\n")
    return path


@pytest.mark.parametrize("command, named", [
    (lambda p, b, e: ["verify", b], "manifest.json"),
    (lambda p, b, e: ["compare", b], "manifest.json"),
    (lambda p, b, e: ["seal-manifest", p], "manifest.json"),
    (lambda p, b, e: ["view", b, "--session-only"], "manifest.json"),
    (lambda p, b, e: ["capture", "nohz", "--experiment", e, "--dry-run", "--out", p], "exp.yaml"),
    (lambda p, b, e: ["lab", "run", "nohz", "--experiment", e, "--out", p, "--no-build"], "exp.yaml"),
    (lambda p, b, e: ["ingest", p], str),
    (lambda p, b, e: ["report", "--out", REPO], str(REPO)),
    (lambda p, b, e: ["verify-published", "--published-dir", p], "provenance.yaml"),
])
def test_bad_input_is_one_line_naming_the_file(tmp_path, bad_bundle, bad_experiment, command, named):
    argv = command(tmp_path, bad_bundle, bad_experiment)
    proc = _ticklab(*argv)
    output = (proc.stderr or proc.stdout).strip()
    assert "Traceback" not in proc.stderr + proc.stdout
    assert proc.returncode in (1, 2), output
    lines = [line for line in output.splitlines() if line]
    assert len(lines) >= 1
    if named is not str:
        assert named in lines[0], output


def test_a_project_error_exits_2_with_the_command_name(tmp_path):
    proc = _ticklab("capture", "nohz", "--experiment", tmp_path / "missing.yaml", "--dry-run")
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"ticklab capture: {tmp_path / 'missing.yaml'}: cannot read (No such file or directory)"
