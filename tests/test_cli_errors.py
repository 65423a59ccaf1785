"""Every command: bad input is one line on stderr naming the file, exit 2, never a traceback (issue 14,
deliverable 4)."""

import os
import subprocess
import sys

import pytest

from conftest import REPO
from test_bundle import make_bundle

pytestmark = pytest.mark.xdist_group("machine")


def _ticklab(*argv, cwd=REPO):
    env = {k: v for k, v in os.environ.items() if k != "TICKLAB_TRACEBACK"}
    return subprocess.run(
        [sys.executable, "-m", "ticklab.cli", *map(str, argv)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env=env,
    )


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


@pytest.mark.slow
@pytest.mark.parametrize(
    "command, named",
    [
        (lambda p, b, e: ["verify", b], "manifest.json"),
        (lambda p, b, e: ["compare", b], "manifest.json"),
        (lambda p, b, e: ["seal-manifest", p], "manifest.json"),
        (lambda p, b, e: ["view", b, "--session-only"], "manifest.json"),
        (lambda p, b, e: ["capture", "nohz", "--experiment", e, "--dry-run", "--out", p], "exp.yaml"),
        (lambda p, b, e: ["lab", "run", "nohz", "--experiment", e, "--out", p, "--no-build"], "exp.yaml"),
        (lambda p, b, e: ["ingest", p], str),
        (lambda p, b, e: ["report", "--out", REPO], str(REPO)),
        (lambda p, b, e: ["verify-published", "--published-dir", p], "provenance.yaml"),
    ],
)
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


@pytest.mark.slow
def test_a_project_error_exits_2_with_the_command_name(tmp_path):
    proc = _ticklab("capture", "nohz", "--experiment", tmp_path / "missing.yaml", "--dry-run")
    assert proc.returncode == 2
    assert (
        proc.stderr.strip() == f"ticklab capture: {tmp_path / 'missing.yaml'}: cannot read (No such file or directory)"
    )


# -- issue 27, item 16: an error line is bounded and no file name can split it ------------------------------------


def _one_line_of(text):
    lines = text.splitlines()
    assert len(lines) == 1, text[:3000]
    return lines[0]


@pytest.mark.slow
def test_issue27_a_100000_character_value_is_not_echoed_whole(tmp_path):
    experiment = tmp_path / "exp.yaml"
    experiment.write_text((REPO / "runners/nohz/ftq.yaml").read_text() + "knobs: {cpu_mode: " + "x" * 100_000 + "}\n")
    proc = _ticklab("capture", "nohz", "--experiment", experiment, "--dry-run", "--out", tmp_path)
    line = _one_line_of(proc.stderr)
    assert proc.returncode == 2 and line.startswith(f"ticklab capture: {experiment}: knobs.cpu_mode: unknown knob 'xxx")
    assert "(100002 characters)" in line and len(line) < 1000


def test_issue27_a_5000_digit_number_is_not_echoed_whole(tmp_path):
    proc = _ticklab("capture", "nohz", "--runs", "9" * 5000, "--dry-run", "--out", tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "argument --runs: '99999" in proc.stderr and len(proc.stderr) < 2000, proc.stderr[-300:]


@pytest.mark.slow
def test_issue27_a_5000_digit_published_value_is_not_echoed_whole(published_copy):
    csv = published_copy / "hpet" / "aim7_compute.csv"
    csv.write_text(csv.read_text().replace("646515,jobs/min", "9" * 5000 + ",jobs/min", 1))
    proc = _ticklab("verify-published", "--published-dir", published_copy, "hpet")
    line = _one_line_of(proc.stdout)
    assert proc.returncode == 1 and line == (
        f"hpet: {csv}: row 2, column value: 5000 characters, more than the 1000 of a published cell"
    )


@pytest.mark.slow
def test_issue27_verify_published_refuses_a_blank_value_beside_a_printed_number(published_copy):
    """verify-published said the tables load with a blank value (NaN) beside the printed 646515."""
    csv = published_copy / "hpet" / "aim7_compute.csv"
    csv.write_text(csv.read_text().replace("646515,jobs/min", ",jobs/min", 1))
    proc = _ticklab("verify-published", "--published-dir", published_copy, "hpet")
    assert proc.returncode == 1
    assert _one_line_of(proc.stdout) == (
        f"hpet: {csv}: row 2 (id 'haswell_tsc'), column value: blank, but value_as_printed '646515' states 646515"
    )


@pytest.mark.slow
def test_issue27_a_newline_in_a_bundle_name_does_not_split_the_verify_line(tmp_path):
    path = make_bundle(tmp_path / "first\nFAIL  second")
    (path / "manifest.json").chmod(0o644)
    (path / "manifest.json").write_bytes(b"{}")
    proc = _ticklab("verify", tmp_path)
    line = _one_line_of(proc.stdout)
    assert proc.returncode == 1 and line.startswith(f"FAIL  {tmp_path}/first\\nFAIL  second/")


@pytest.mark.slow
def test_issue27_a_newline_in_an_experiment_path_does_not_split_the_error_line(tmp_path):
    missing = tmp_path / "a\nticklab capture: forged.yaml"
    proc = _ticklab("capture", "nohz", "--experiment", missing, "--dry-run", "--out", tmp_path)
    assert proc.returncode == 2
    assert _one_line_of(proc.stderr) == (
        f"ticklab capture: {tmp_path}/a\\nticklab capture: forged.yaml: cannot read (No such file or directory)"
    )


@pytest.mark.slow
def test_issue27_a_non_string_key_through_the_cli_is_one_line(tmp_path):
    experiment = tmp_path / "exp.yaml"
    experiment.write_text((REPO / "runners/nohz/ftq.yaml").read_text() + "1: x\n")
    proc = _ticklab("capture", "nohz", "--experiment", experiment, "--dry-run", "--out", tmp_path)
    assert proc.returncode == 2
    assert _one_line_of(proc.stderr) == f"ticklab capture: {experiment}: key 1 is not a string (quote it)"


@pytest.mark.parametrize("dry_run", [[], ["--dry-run"]], ids=["run", "dry-run"])
@pytest.mark.slow
def test_capture_of_a_claim_with_no_host_experiment_says_what_to_run_instead(dry_run):
    """Issue 41, item 3: 'capture pvspinlock' printed nothing and exited 0 (its only experiment is a guest-lab one)."""
    proc = _ticklab("capture", "pvspinlock", *dry_run)
    assert proc.returncode == 2 and proc.stdout == ""
    [line] = proc.stderr.splitlines()
    assert (
        line.startswith("ticklab capture: pvspinlock has no host experiment") and "'ticklab lab run pvspinlock'" in line
    )
