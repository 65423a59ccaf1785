"""A sixth claim needs only the files CONTRIBUTING.md lists: a claim module, a notebook, published data and an
experiment. This test adds a toy claim with exactly those to a copy of the repository and shows the CLI,
doctor, capture, the report (its notebook, verdicts and the summary) and ``ticklab view`` pick it up."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pandas as pd
import pytest

from conftest import REPO, make_fake_host
from ticklab.bundle import BundleWriter
from ticklab.trace import rawfile

pytestmark = pytest.mark.slow

TOY_MODULE = '''"""C6 — a toy claim (tests/test_new_claim.py): the slow condition takes twice as long as the fast one."""

import matplotlib.pyplot as plt

from ..analysis.comparisons import Comparison
from ..analysis.published import PublishedClaim
from ..analysis.verdicts import Margins
from . import Claim, Headline, ViewPreset


def comparisons(published: PublishedClaim) -> list[Comparison]:
    # ±5 % runtime: a toy workload's runs scatter by about that
    return [Comparison("slow vs fast: runtime", "runtime_s", "slow", "fast",
                       published.ratio_target("speed", "slow", "fast"), margins=Margins(no_effect=0.05))]


def headlines(published: PublishedClaim) -> list[Headline]:
    return [Headline("toy machine", "runtime, slow / fast",
                     published.value("speed", "slow") / published.value("speed", "fast"), "lower")]


def speed_figure(published: PublishedClaim):
    frame = published.table("speed")
    fig, ax = plt.subplots()
    ax.bar(frame["id"], frame["value"])
    return fig


CLAIM = Claim(id="toy", seed="900", title="C6 toy claim", notebook="06-toy.ipynb",
              outputs={"figures": ["speed"], "tables": ["speed"]}, comparisons=comparisons,
              untested="slow vs fast: runtime ratio", headlines=headlines,
              view=ViewPreset(events=("irq_vectors/local_timer_entry", "irq_vectors/local_timer_exit")))
'''  # noqa: E501 (the toy claim's module, as written to the copy)

PROVENANCE = """claim: toy
source:
  file: 900_toy.txt
  sha256: "0000000000000000000000000000000000000000000000000000000000000000"
  title: A toy source
  author: tests
  year: 2026
  venue: tests/test_new_claim.py
  kind: test fixture
tables:
  speed.csv:
    description: Runtime of the two conditions.
    rows:
      fast: {quote: "fast: 1.0 s"}
      slow: {quote: "slow: 2.0 s"}
"""

SPEED = """id,condition,metric,value,unit,value_as_printed,qualifier
fast,fast,runtime,1.0,s,1.0 s,
slow,slow,runtime,2.0,s,2.0 s,
"""

# The workload prints "Time: <s>" as hackbench does; the process id varies the digits from run to run.
EXPERIMENT = """claim: toy
name: echo
description: The toy claim's two conditions, as a shell one-liner that prints a hackbench-like time.
runs: 4
warmup: 0
seed: 1
requires: []
conditions:
  - {name: fast, whole: "1"}
  - {name: slow, whole: "2"}
workload:
  tool: hackbench
  argv: ["sh", "-c", "echo Time: {whole}.0$$"]
"""

NOTEBOOK_CELLS = [
    ("markdown", "# C6 — a toy claim\n\nThe source says the slow condition takes twice as long as the fast one."),
    (
        "parameters",
        'data_dir = "traces"\npublished_dir = "traces/published"\noutput_dir = "build"\nalpha = 0.05\n'
        "n_boot = 2000\nseed = 0",
    ),
    (
        "code",
        "from ticklab.claims import toy as claim\nfrom ticklab.report.notebook import check_parameters, open_claim\n\n"
        "check_parameters(globals(), '06-toy.ipynb')\nctx = open_claim('toy', data_dir, published_dir, output_dir)\n"
        "pub = ctx.published",
    ),
    (
        "code",
        "ctx.out.table('speed', pub.table('speed')[['id', 'value']], caption='Toy speeds as printed', "
        "sources=pub.files('speed'))\nctx.out.figure('speed', claim.speed_figure(pub), caption='Toy speeds', "
        "sources=pub.files('speed'))",
    ),
    (
        "code",
        "ctx.condition_checks()\n"
        "verdicts = ctx.out.verdicts(claim.CLAIM.verdicts(ctx, alpha=alpha, n_boot=n_boot, seed=seed))\n"
        "ctx.forest_plot()",
    ),
]


def toy_notebook() -> nbformat.NotebookNode:
    book = nbformat.v4.new_notebook()
    for kind, source in NOTEBOOK_CELLS:
        if kind == "markdown":
            book.cells.append(nbformat.v4.new_markdown_cell(source))
        else:
            cell = nbformat.v4.new_code_cell(source)
            if kind == "parameters":
                cell.metadata["tags"] = ["parameters"]
            book.cells.append(cell)
    book.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return book


@pytest.fixture(scope="module")
def repo_with_toy(tmp_path_factory) -> Path:
    """A copy of the repository (code, notebooks, experiments, kernel configs, published data; no bundles) plus
    the toy claim's four files."""
    copy = tmp_path_factory.mktemp("repo")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copy2(REPO / "pyproject.toml", copy / "pyproject.toml")
    for directory in ("src", "notebooks", "runners", "kernel", "traces/published"):
        shutil.copytree(REPO / directory, copy / directory, ignore=ignore)
    (copy / "src/ticklab/claims/toy.py").write_text(TOY_MODULE)
    (copy / "traces/published/toy").mkdir()
    (copy / "traces/published/toy/provenance.yaml").write_text(PROVENANCE)
    (copy / "traces/published/toy/speed.csv").write_text(SPEED)
    (copy / "runners/toy").mkdir()
    (copy / "runners/toy/echo.yaml").write_text(EXPERIMENT)
    nbformat.write(toy_notebook(), copy / "notebooks/06-toy.ipynb")
    return copy


def ticklab(repo: Path, *argv: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(repo / "src"), "TICKLAB_CACHE": str(repo / "cache")}
    done = subprocess.run(
        [sys.executable, "-m", "ticklab.cli", *argv], cwd=repo, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, (
        f"ticklab {' '.join(argv)}: exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    )
    return done


def test_the_copy_runs_its_own_code(repo_with_toy):
    done = subprocess.run(
        [sys.executable, "-c", "import ticklab; print(ticklab.__file__)"],
        cwd=repo_with_toy,
        env={**os.environ, "PYTHONPATH": str(repo_with_toy / "src")},
        capture_output=True,
        text=True,
    )
    assert done.stdout.strip().startswith(str(repo_with_toy / "src"))


def test_the_cli_and_doctor_name_the_new_claim(repo_with_toy):
    assert "toy" in ticklab(repo_with_toy, "claims").stdout.split()
    assert "toy" in ticklab(repo_with_toy, "claims", "--host").stdout.split()
    assert "toy" not in ticklab(repo_with_toy, "claims", "--lab").stdout.split()
    assert "toy" in ticklab(repo_with_toy, "capture", "--help").stdout
    fake = make_fake_host(repo_with_toy / "fake-host")
    report = json.loads(ticklab(repo_with_toy, "doctor", "--json", "--root", str(fake)).stdout)
    assert report["claims"]["toy"] == {"echo": {"runs": True, "why": "all requirements met"}}


def test_capture_report_verdicts_summary_and_view_pick_up_the_new_claim(repo_with_toy, tmp_path):
    repo = repo_with_toy
    fake = make_fake_host(tmp_path / "fake-host")
    ticklab(repo, "capture", "toy", "--root", str(fake), "--journal", str(tmp_path / "journal.json"), "--no-progress")
    [bundle] = list((repo / "traces").glob("*/toy/*-echo"))
    results = pd.read_csv(bundle / "results.csv")
    assert sorted(results.groupby("condition").size().items()) == [("fast", 4), ("slow", 4)]

    ticklab(repo, "report", "--only", "06-toy", "00-summary", "--out", str(repo / "build"))
    build = repo / "build"
    verdicts = pd.read_csv(build / "verdicts.csv")
    [row] = verdicts[verdicts["claim"] == "toy"].to_dict("records")
    assert row["comparison"] == "slow vs fast: runtime" and row["setup"] == bundle.parent.parent.name
    assert row["target_ratio"] == 2.0 and row["source_quotes"] == "toy/speed/slow, toy/speed/fast"
    assert 1.8 < row["fresh_effect"] < 2.2 and row["n_per_condition"] == "4 vs 4"
    effects = pd.read_csv(build / "tables/summary/published_effects.csv")
    assert effects[effects["claim"] == "toy"][["setup", "ratio", "better"]].values.tolist() == [
        ["toy machine", 2.0, "lower"]
    ]
    assert {
        "figures/toy/speed.png",
        "tables/toy/speed.csv",
        "verdicts/toy.csv",
        "figures/toy/forest.png",
        "tables/toy/forest.csv",
    } <= {str(p.relative_to(build)) for p in build.rglob("*") if p.is_file()}
    forest = pd.read_csv(build / "tables/toy/forest.csv")  # drawn by the toy's notebook from its verdict row
    assert forest["comparison"].tolist() == ["slow vs fast: runtime"]
    summary_notebook = (build / "notebooks/00-summary.ipynb").read_text()
    assert summary_notebook.count('"image/png"') >= 2  # the published effects, and the forest plots the claims drew
    assert "C6 toy claim" in (build / "report/index.html").read_text()

    traced = make_traced_bundle(repo / "traces", claim="toy")
    session_path = tmp_path / "session.json"
    ticklab(repo, "view", str(traced), "--session-only", "--session", str(session_path))
    session = json.loads(session_path.read_text())
    [stream] = session["data streams"]
    assert session["ticklab"]["claim"] == "toy"
    assert stream["filters"]["show event filter"] == ["irq_vectors/local_timer_entry", "irq_vectors/local_timer_exit"]


def make_traced_bundle(traces: Path, claim: str) -> Path:
    """A sealed bundle of ``claim`` with one run holding the smallest trace.dat bundled in the repository."""
    trace = min(
        (p for p in (REPO / "traces").rglob("trace.dat*") if p.name in ("trace.dat", "trace.dat.xz")),
        key=lambda p: p.stat().st_size,
        default=None,
    )  # a sealed bundle keeps it xz'd
    if trace is None:
        pytest.skip("no bundled trace.dat under traces/")
    writer = BundleWriter(
        traces,
        "guest-toy",
        claim,
        "traced",
        definition={"name": "traced"},
        host={"nproc": 2, "kernel_release": "6.12.0"},
    )
    run_dir = writer.run_dir("run-001")
    (run_dir / "trace").mkdir()
    (run_dir / "trace/trace.dat").write_bytes(rawfile.read_bytes(trace))
    writer.add_run(
        {
            "run": "run-001",
            "condition": "fast",
            "warmup": False,
            "status": "ok",
            "trace": {"directory": "trace", "backend": "trace-cmd"},
        },
        [],
    )
    return writer.seal()
