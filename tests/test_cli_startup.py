"""The CLI starts without the analysis stack: commands that do not analyse import neither scipy, pandas nor
the claims (what they import is read from sys.modules of a fresh interpreter, not timed)."""

import json
import subprocess
import sys

import pytest

from conftest import REPO
from ticklab.claimids import CLAIM_IDS

HEAVY = ("scipy", "pandas", "ticklab.claims", "matplotlib")
PROBE = """
import json, sys
from ticklab.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
print(json.dumps({"code": code, "modules": sorted(sys.modules)}), file=sys.stderr)
"""


def imported_by(*argv: str) -> tuple[int, set[str]]:
    done = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=300)
    report = json.loads(done.stderr.strip().splitlines()[-1])
    return report["code"], set(report["modules"])


def a_bundled_trace():
    # a run's own trace (raw/<run>/trace/trace.dat), not a traced extra's (raw/<run>/<extra>/trace/trace.dat)
    found = sorted(
        p
        for p in (REPO / "traces").rglob("trace.dat*")
        if p.parents[2].name == "raw" and p.name in ("trace.dat", "trace.dat.xz")
    )  # a sealed bundle keeps it xz'd (ingest reads either)
    if not found:
        pytest.skip("no bundled trace.dat under traces/")
    return min(found, key=lambda p: p.stat().st_size)


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["--version"],
        ["ingest", "--help"],
        ["doctor", "--help"],
        ["capture", "--help"],
        ["verify", "--help"],
        ["lab", "run", "--help"],
        ["kernel", "build", "--help"],
        ["plan", "status", "--help"],
    ],
)
def test_help_imports_no_analysis(argv):
    code, modules = imported_by(*argv)
    assert code == 0
    assert [m for m in HEAVY if m in modules] == []
    assert "numpy" not in modules and "pyarrow" not in modules


def test_ingest_imports_no_pandas_or_scipy(tmp_path):
    code, modules = imported_by("ingest", str(a_bundled_trace()), "--out", str(tmp_path))
    assert code == 0 and list(tmp_path.glob("*.parquet"))
    assert [m for m in HEAVY if m in modules] == []


@pytest.mark.slow
def test_verify_imports_no_scipy_or_claims():
    bundle = a_bundled_trace().parents[3]
    code, modules = imported_by("verify", str(bundle))
    assert code == 0
    # pandas stays: load_bundle reads results.csv with it
    assert [m for m in HEAVY if m in modules and m != "pandas"] == []


def test_claim_ids_match_the_claims():
    from ticklab.claims import all_claims

    assert sorted(c.id for c in all_claims()) == list(CLAIM_IDS)


def test_capture_help_documents_boot_plans_and_plan_status_exists():
    capture_help = subprocess.run(
        [sys.executable, "-m", "ticklab.cli", "capture", "--help"], capture_output=True, text=True, timeout=120
    )
    assert "--boot {kexec,grub,manual}" in capture_help.stdout
    status = subprocess.run(
        [sys.executable, "-m", "ticklab.cli", "plan", "status", "--help"], capture_output=True, text=True, timeout=120
    )
    assert status.returncode == 0 and "--id PLAN_ID" in status.stdout
