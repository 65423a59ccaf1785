"""The lab host's plans are sized to decide (issue 53 item 2): each plan `make lab-host-bundles` runs makes at least
the runs per condition an exact rank CI needs to be bounded at its claim's family level on the lab host, the family
counted by the verdict path itself (``analysis.comparisons.verdicts`` on stand-in runs of the plan's conditions: its
m distinct tests, Bonferroni's 0.05/m) and the claim's level rows (a 95% CI of one condition's median), and the
Makefile says that number and m beside each plan.

Capture and the lab never import the analysis: the plan's count is data (the experiment's ``runs:``, or a ``--runs``
in the Makefile), and this test holds it to what the analysis needs."""

import math
import re
import shlex
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from ticklab import paths
from ticklab.analysis.comparisons import RUN_COLUMNS, verdicts
from ticklab.analysis.power import smallest_testable_n
from ticklab.capture.boot_capture import boot_experiment
from ticklab.claims import get_claim
from ticklab.lab import labhost

REPO = Path(__file__).resolve().parents[1]
ALPHA = 0.05
MAKE_VARIABLES = {"$(BIN)/ticklab": "ticklab", "$(KERNEL_612)": "6.12", "$(KERNEL_72)": "7.2", "$(LAB_HOST_ARGS)": ""}


def makefile_plans() -> list[tuple[str, list[str]]]:
    """Each ``ticklab lab host-plan`` command of the Makefile's lab-host plan targets, with the comment above its
    target."""
    text = (REPO / "Makefile").read_text().replace("\\\n", " ")
    plans, comment = [], []
    for line in text.splitlines():
        if not line.strip():
            comment = []
        elif line.startswith("#"):
            comment.append(line.lstrip("# "))
        elif "lab host-plan" in line:
            for name, value in MAKE_VARIABLES.items():
                line = line.replace(name, value)
            plans.append((" ".join(comment), shlex.split(line)))
    return plans


def option(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def stand_in_release(kernel: str) -> str:
    """A release the condition's kernel pattern matches (the comparisons' kernel ranges read its X.Y)."""
    return "6.1.0-50-amd64" if kernel == "running" else kernel.replace("*", "0").replace("?", "0")


def stand_in_runs(claim: str, experiment, comparisons, n: int, vcpu_threads: str) -> pd.DataFrame:
    """n runs of each of the experiment's conditions, in n complete blocks (a boot plan's order), with a value of
    every metric the claim compares between them: what a plan of n runs a condition gives the verdict path."""
    kernel_knob = next(name for name, kind in experiment.knobs.items() if kind == "host_kernel")
    conditions = {c["name"]: stand_in_release(str(c[kernel_knob])) for c in experiment.conditions}
    metrics = sorted(
        {
            c.metric
            for c in comparisons
            if {c.treatment, c.baseline} <= set(conditions) and (not c.experiments or experiment.name in c.experiments)
        }
    )
    rows = []
    for index, (condition, kernel) in enumerate(conditions.items()):
        for block in range(1, n + 1):
            for metric in metrics:
                rows.append(
                    {
                        "host_id": "guest-tcg-2vcpu-labhost-kexec",
                        "bundle": "b",
                        "experiment": experiment.name,
                        "stopped": "fixed run count",
                        "kernel": kernel,
                        "run": f"{condition}-{block}",
                        "condition": condition,
                        "metric": metric,
                        "value": (1 + index) * (1 + 0.01 * block),
                        "unit": "",
                        "block": block,
                        "vcpu_threads": vcpu_threads,
                    }
                )
    return pd.DataFrame(rows, columns=RUN_COLUMNS).astype({"block": "Int64"})


def family(claim: str, experiment, n: int, vcpu_threads: str) -> tuple[int, list]:
    """The verdict path's family on a setup that ran the experiment's conditions n times each: its m and the rows it
    tested (those with a CI)."""
    found = get_claim(claim)
    comparisons = found.comparisons(found.published(paths.repo_root() / "traces" / "published"))
    rows = verdicts(claim, comparisons, stand_in_runs(claim, experiment, comparisons, n, vcpu_threads), n_boot=200)
    tested = [r for r in rows if r.ci_level]
    counts = {int(re.search(r"Holm over this setup's (\d+) distinct test", r.test)[1]) for r in tested}
    assert len(counts) == 1, counts
    return counts.pop(), tested


def level_rows_need(claim: str) -> int:
    """The fewest runs of one condition a claim's level rows (one quantity against a printed value, outside the
    comparisons' family: hrtick's spurious interrupt ratio on 7.2 with HRTICK on) need for a bounded 95% CI of the
    median, by the verdict path's own level verdict; 0 for a claim without one."""
    if claim != "hrtick":
        return 0
    from ticklab.claims.hrtick import spurious_level

    return next(
        n for n in range(2, 50) if spurious_level([0.25 + 0.001 * i for i in range(n)], 0.25)[0] != "inconclusive"
    )


PLANS = makefile_plans()


def test_the_makefile_runs_the_five_lab_host_plans_with_their_experiments_counts():
    named = [(argv[3], option(argv, "--boot"), option(argv, "--experiment")) for _, argv in PLANS]
    assert named == [
        ("nohz", "kexec", None),
        ("nohz", "grub", None),
        ("hpet", "kexec", "runners/hpet/host-boot-clock-read.yaml"),
        ("nohz", "kexec", "runners/nohz/host-boot-hz.yaml"),
        ("hrtick", "kexec", "runners/hrtick/host-boot-kernels.yaml"),
    ]
    # the experiment's own count and stopping rule: no --runs override
    assert not [argv for _, argv in PLANS if "--runs" in argv]


@pytest.mark.parametrize("comment, argv", PLANS, ids=[" ".join(argv[3:6]) for _, argv in PLANS])
def test_each_lab_host_plan_makes_the_runs_its_familys_exact_ci_needs(comment, argv):
    claim, experiment_path = argv[3], option(argv, "--experiment")
    experiment = boot_experiment(claim, REPO / experiment_path if experiment_path else None)
    runs = int(option(argv, "--runs") or experiment.runs)
    declared = labhost.declared_facts(labhost.recipe(), option(argv, "--accel") or "tcg").get("vcpu_threads", "")
    m, tested = family(claim, experiment, runs, declared)
    needed = max(smallest_testable_n(ALPHA / m), level_rows_need(claim))
    assert runs >= needed, f"{experiment.name}: {runs} runs a condition; its {m} distinct tests need {needed}"
    # at the plan's count every comparison of the family has a bounded CI, as the verdict computes it
    assert tested and all(math.isfinite(r.ci_high) and r.ci_low > 0 for r in tested)
    # one run fewer than the number needed leaves a row without a bounded CI: the number is the least
    _, short = family(claim, experiment, needed - 1, declared)
    assert level_rows_need(claim) == needed or all(not np.isfinite(r.ci_high) or r.ci_low == 0 for r in short)
    # the Makefile says the number, the family and the runs made
    assert f"m = {m}" in comment and f"bounded from {needed} runs a condition" in comment, comment
    assert f"{runs} runs a condition" in comment, comment


def test_the_hpet_plans_family_on_the_lab_host_leaves_out_the_sharing_row_its_single_tcg_thread_cannot_test():
    experiment = boot_experiment("hpet", REPO / "runners/hpet/host-boot-clock-read.yaml")
    assert family("hpet", experiment, 10, "single")[0] == 1
    # on a machine whose CPUs run at once the sharing row is tested too: two tests, 5 runs a condition
    m, _ = family("hpet", experiment, 10, "")
    assert (m, smallest_testable_n(ALPHA / m)) == (2, 5)


def test_hricks_spurious_level_row_needs_six_runs_of_its_condition():
    """The spurious interrupt ratio is judged by the median of 7.2 HRTICK-on's runs with its order-statistics CI: 5 runs
    cannot give 95% (2 x 0.5^5 = 0.0625), 6 can (0.031), so the hrtick plan is bounded from 6 runs a condition, not
    the comparisons' 5 (a 5-run plan left that row "too few runs", 2026-11-29)."""
    assert level_rows_need("hrtick") == 6
