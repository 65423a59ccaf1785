"""ticklab doctor on this machine: every check and every claim answers, with a reason."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ticklab.claimids import CLAIM_IDS as CLAIMS
from ticklab.doctor import diagnose, render
from ticklab.host import facts

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="doctor's probes (tracefs, trace-cmd, perf) need root")


def test_doctor_answers_every_check_and_claim_and_leaves_mounts_as_they_were():
    before = facts.mounts(Path("/"))
    report = diagnose()
    assert facts.mounts(Path("/")) == before
    for name in ("root", "tracefs", "trace-cmd record", "perf tracepoints", "clocksources", "cpuidle",
                 "sched features (HRTICK)", "kvm guest", "qemu", "hackbench", "tbench", "ftq", "clockbench"):
        assert report["checks"][name]["why"], name
    assert set(report["claims"]) == set(CLAIMS)
    for claim, experiments in report["claims"].items():
        for experiment in experiments.values():
            assert experiment["why"], claim
    host = report["host"]
    # What doctor says must agree with the host facts it read.
    assert report["checks"]["cpuidle"]["ok"] == (host["cpuidle"]["driver"] is not None and len(host["cpuidle"]["states"]) > 1)
    if not report["checks"]["trace-cmd record"]["ok"]:
        assert "falls back to tracefs" in report["checks"]["trace-cmd record"]["why"]
    assert "claim" in render(report) and "trace-cmd record" in render(report)


def test_doctor_json_is_machine_readable():
    result = subprocess.run([sys.executable, "-m", "ticklab.cli", "doctor", "--json"], capture_output=True, text=True, check=True)
    assert set(json.loads(result.stdout)) == {"host", "checks", "claims"}


def test_doctor_on_a_host_without_tracefs_says_so_and_goes_on(fake_host, tmp_path):
    """Issue 14, defect 8: no tracefs once escaped from the trace-cmd probe as a traceback."""
    report = diagnose(fake_host, journal=tmp_path / "j.json")
    assert not report["checks"]["tracefs"]["ok"]
    assert not report["checks"]["trace-cmd record"]["ok"] and "tracefs" in report["checks"]["trace-cmd record"]["why"]
    assert report["claims"]["nohz"]["ftq"]["runs"] is False
