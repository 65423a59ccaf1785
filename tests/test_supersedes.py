"""A recapture names the bundle it replaces (--supersedes): the old bundle's path and seal go into the new manifest,
the analysis counts only the recapture while both are in the data, and a bundle that is not a sealed capture of the
same experiment is refused in one line before any run."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import REPO, WAIT_BOUND_S
from ticklab.analysis.captured import find_bundles
from ticklab.bundle import SEAL, BundleError, BundleWriter, superseded_record
from ticklab.capture.experiment import load_experiment
from ticklab.capture.session import CapturePlan

WHEN = datetime(2026, 11, 29, 6, 0, 0, tzinfo=UTC)
EXPERIMENT = "guest-kbuild-lockbound"


def _sealed(
    data: Path, when: datetime, experiment: str = EXPERIMENT, supersedes=None, value: float = 40.0, claim="pvspinlock"
) -> Path:
    writer = BundleWriter(data, "guest-tcg-4vcpu-test", claim, experiment, definition={}, host={}, when=when)
    writer.manifest.supersedes = supersedes
    writer.add_run(
        {"run": "run-001", "condition": "lockbound kick-ahead-0 2x", "warmup": False, "status": "ok"},
        [{"metric": "build_time_s", "value": value, "unit": "s"}],
    )
    return writer.seal()


def test_a_recapture_records_the_old_bundles_place_and_seal_and_the_analysis_counts_only_it(tmp_path):
    old = _sealed(tmp_path, WHEN)
    record = superseded_record(old, "pvspinlock", EXPERIMENT)
    assert record["bundle"] == f"guest-tcg-4vcpu-test/pvspinlock/{old.name}"
    assert record["seal"] == hashlib.sha256((old / SEAL).read_bytes()).hexdigest()
    assert record["measured_runs"] == 1
    new = _sealed(tmp_path, WHEN.replace(hour=7), supersedes=[record], value=30.0)
    assert json.loads((new / "manifest.json").read_text())["supersedes"] == [record]
    assert [ref.path.name for ref in find_bundles(tmp_path, "pvspinlock")] == [new.name]


def test_a_superseded_bundle_that_is_no_longer_the_one_recorded_is_still_counted(tmp_path):
    old = _sealed(tmp_path, WHEN)
    record = {**superseded_record(old, "pvspinlock", EXPERIMENT), "seal": "0" * 64}
    _sealed(tmp_path, WHEN.replace(hour=7), supersedes=[record])
    assert len(find_bundles(tmp_path, "pvspinlock")) == 2


def test_a_bundle_of_another_experiment_is_refused_naming_it(tmp_path):
    old = _sealed(tmp_path, WHEN, experiment="guest-kbuild")
    with pytest.raises(BundleError, match=r"--supersedes names a bundle of pvspinlock/guest-kbuild, not pvspinlock/"):
        superseded_record(old, "pvspinlock", EXPERIMENT)


def test_the_plan_verifies_what_it_supersedes_before_any_run(tmp_path):
    experiment = load_experiment(REPO / "runners/pvspinlock/guest-kbuild-lockbound.yaml")
    old = _sealed(tmp_path, WHEN)
    (old / "results.csv").write_text("tampered\n")
    options = SimpleNamespace(runs=None, warmup=None, seed=None, supersedes=(old,))
    with pytest.raises(BundleError, match="results.csv"):
        CapturePlan.of(experiment, [], options)


def test_capture_refuses_a_supersedes_that_is_no_bundle_in_one_line(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "ticklab.cli", "capture", "nohz", "--dry-run", "--out", str(tmp_path),
         "--supersedes", str(tmp_path / "nothing")],
        capture_output=True, text=True, cwd=REPO, timeout=WAIT_BOUND_S,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("ticklab capture: ") and "nothing" in line


def test_a_lab_host_plan_verifies_here_what_it_supersedes_and_hands_the_records_to_its_capture(tmp_path):
    """The plan's capture runs inside the lab host; the bundle it replaces is outside: its record is made (and a wrong
    bundle refused) before anything boots, then passed as --supersedes-record and kept in the new manifest."""
    from ticklab.lab.cache import LabError
    from ticklab.lab.labhost import superseded_records

    plan = "runners/hrtick/host-boot-kernels.yaml"
    guest = _sealed(tmp_path, WHEN, experiment="guest-hackbench", claim="hrtick")
    with pytest.raises(LabError, match="--supersedes names a bundle of hrtick/guest-hackbench, not hrtick/host-boot"):
        superseded_records("hrtick", plan, [guest])
    old = _sealed(tmp_path, WHEN.replace(hour=8), experiment="host-boot-kernels", claim="hrtick")
    [record] = superseded_records("hrtick", plan, [old])
    assert record["bundle"].endswith(f"/hrtick/{old.name}")
    experiment = load_experiment(REPO / plan)
    options = SimpleNamespace(runs=None, warmup=None, seed=None, supersedes=(), supersedes_records=(record,))
    assert CapturePlan.of(experiment, [], options).supersedes == [record]
