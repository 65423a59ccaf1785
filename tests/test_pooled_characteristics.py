"""benchmarks/pooled_characteristics.py judges each synthetic machine as the verdict does and pools with the report's
own pooling (issue 57 item 4); its numbers are a benchmark's, its parts are tested here."""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd

from conftest import REPO
from ticklab.analysis.comparisons import verdicts

sys.path.insert(0, str(REPO / "benchmarks"))

import pooled_characteristics as pc
import verdict_characteristics as vc


def test_a_machines_row_is_the_one_the_verdict_path_gives_a_one_comparison_family():
    (claim, comparison), *_ = vc.load_comparisons(["hz250-timer-share"]).values()
    rng = np.random.default_rng(5)
    for n, cv in ((5, 0.1), (20, 0.5)):
        samples = vc.synthetic_runs(rng, n, cv, 0.3)
        [full] = verdicts(claim, [comparison], vc.runs_table(comparison, samples, "m"), n_boot=200)
        mine = pc.machine_row(claim, comparison, "m", samples)
        assert (mine.fresh_effect, mine.ci_low, mine.ci_high, mine.ci_level, mine.verdict) == (
            full.fresh_effect,
            full.ci_low,
            full.ci_high,
            full.ci_level,
            full.verdict,
        )


def test_a_fleet_at_the_target_without_spread_is_pooled_and_judged_against_it():
    (claim, comparison), *_ = vc.load_comparisons(["hz250-timer-share"]).values()
    rng = np.random.default_rng(1)
    row = pc.fleet_word(claim, comparison, rng, 6, 20, 0.1, np.log(comparison.target.ratio), 0.0)
    assert row.role == "pooled" and row.k == 6 and row.verdict == "reproduced", row.reason
    table = pc.characteristics({"hz250-timer-share": (claim, comparison)}, [3], ["none"], [5], ["none"], 3)
    assert int(table["count"].sum()) == 3 and set(table["analysis"]) == {"k=3"}
    assert isinstance(vc.acceptance(table), pd.DataFrame)
