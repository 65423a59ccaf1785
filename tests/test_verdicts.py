"""The verdict vocabulary: what each verdict means, tested on decisions with known inputs and on synthetic bundles
with known truth (the layout and run records of a real bundle, the values drawn from known distributions)."""

import json
import math
from datetime import UTC, datetime
from types import SimpleNamespace

import numpy as np
import pytest

from ticklab import paths
from ticklab.analysis.captured import find_bundles
from ticklab.analysis.outputs import Outputs
from ticklab.analysis.stats import Interval
from ticklab.analysis.verdicts import Margins, Target, Verdict, consistent_band, decide
from ticklab.bundle import BundleWriter
from ticklab.claims import hpet

UP = Target(1.2, 1, "derived: a test's", "x", ())
DOWN = Target(0.573, -1, "derived: a test's", "0.481s / 0.840s", ())


def ci(estimate, low, high):
    return Interval(estimate, low, high, 0.95, "test")


M = Margins(no_effect=0.02)  # ±2 %: declared, in the quantity's own terms


def test_a_ci_on_the_source_side_and_inside_the_band_is_reproduced():
    verdict, reason = decide(UP, ci(1.21, 1.19, 1.24), 0.001, M)
    assert verdict == "reproduced" and "consistent sizes ×1.16..×1.26" in reason


def test_a_point_estimate_in_the_band_is_not_enough():
    """Issue 31: a CI of [0.13, 0.49] against ×0.25 was "reproduced" by its estimate; now the CI must fit the band."""
    quarter = Target(0.25, -1, "derived: x", "x", ())
    assert decide(quarter, ci(0.25, 0.13, 0.49), 0.001, M)[0] == "consistent, not pinned"
    # and a CI that holds the target with an estimate outside the band is no longer "direction only"
    assert (
        decide(Target(1.087, 1, "derived: x", "x", ()), ci(1.04, 1.005, 1.10), 0.001, M)[0] == "consistent, not pinned"
    )


def test_a_ci_short_of_or_beyond_the_band_says_smaller_or_larger_and_whether_it_shows_an_effect():
    verdict, reason = decide(DOWN, ci(0.282, 0.254, 0.322), 0.001, M, "our workload sets the size")
    assert verdict == "larger than the target" and reason.endswith("our workload sets the size")
    verdict, reason = decide(UP, ci(1.05, 1.03, 1.07), 0.01, M)
    assert verdict == "smaller than the target" and "an effect in the source's direction" in reason
    verdict, reason = decide(UP, ci(1.03, 0.99, 1.07), 0.3, M)
    assert verdict == "smaller than the target" and "no change is not excluded" in reason


def test_an_opposite_effect_has_its_own_word():
    verdict, reason = decide(DOWN, ci(1.2, 1.1, 1.3), 0.01, M)
    assert verdict == "opposite effect" and "other side of no change" in reason


def test_no_effect_is_shown_only_by_the_whole_ci_inside_the_declared_margin():
    verdict, reason = decide(UP, ci(1.0, 0.985, 1.015), 0.8, M)
    assert verdict == "no effect shown" and "no-effect margin ×0.98..×1.02" in reason
    # a real 20 % speed-up is never "no effect", whatever the target (issue 31: hrtick ×0.573)
    assert decide(DOWN, ci(0.8, 0.78, 0.82), 0.001, Margins(no_effect=0.05))[0] == "smaller than the target"
    with pytest.raises(ValueError, match="declared fraction"):
        Margins(no_effect=0)


def test_noise_is_inconclusive_not_absence():
    """The FTQ case: a CI that contains both 1 and the target says nothing either way."""
    assert decide(Target(1.087, 1, "derived: x", "80us", ()), ci(0.90, 0.71, 1.15), 0.64, M)[0] == "inconclusive"
    assert decide(UP, ci(1.05, 0.96, 1.24), 0.3, M)[0] == "inconclusive"
    # an unbounded CI (too few runs for the level) is inconclusive
    assert decide(UP, ci(1.2, 0.0, math.inf), 0.1, M)[0] == "inconclusive"


def test_the_word_rests_on_the_ci_not_the_p_value():
    assert decide(UP, ci(1.2, 1.17, 1.25), 0.2, M)[0] == "reproduced"


def test_a_direction_only_target_is_reproduced_by_the_direction():
    premise = Target(
        None, 1, "derived: before the series HRTICK regressed", "does not longer result in regressions", ()
    )
    five = Margins(no_effect=0.05)
    assert decide(premise, ci(1.3, 1.1, 1.5), 0.01, five)[0] == "reproduced"
    assert decide(premise, ci(1.0, 0.98, 1.02), 0.9, five)[0] == "no effect shown"
    assert decide(premise, ci(1.03, 0.98, 1.08), 0.9, five)[0] == "inconclusive"
    assert decide(premise, ci(0.8, 0.7, 0.9), 0.01, five)[0] == "opposite effect"


NO_REGRESSION = Target(
    None,
    1,
    "derived: the source says HRTICK no longer regresses; a margin of 5 % declared",
    "does not longer result in regressions",
    (),
    no_worse_than=1.05,
)


@pytest.mark.parametrize(
    "interval, p, verdict, words",
    [
        (ci(0.57, 0.52, 0.63), 0.001, "reproduced", "whole CI lies on the good side of the declared bound ×1.05"),
        (ci(1.01, 0.97, 1.04), 0.6, "reproduced", "good side"),  # no change shown, and none worse than 5 %
        (ci(1.02, 0.95, 1.09), 0.5, "inconclusive", "the CI reaches past the bound"),
        (
            ci(1.03, 1.01, 1.06),
            0.01,
            "inconclusive",
            "reaches past",
        ),  # a small change to the worse side, not past the bound
        (ci(1.2, 1.1, 1.3), 0.001, "opposite effect", "worse: the whole CI lies past the declared bound"),
    ],
)
def test_no_regression_is_a_non_inferiority_test_against_a_declared_bound(interval, p, verdict, words):
    got, reason = decide(NO_REGRESSION, interval, p, M)
    assert got == verdict and words in reason
    assert NO_REGRESSION.text == "no worse than ×1.05"
    assert M.describe(NO_REGRESSION) == "non-inferiority: the CI must stay on the good side of ×1.05 (declared)"
    lower_is_worse = Target(None, -1, "derived: x", "x", (), no_worse_than=0.95)
    assert decide(lower_is_worse, ci(0.99, 0.96, 1.02), 0.5, M)[0] == "reproduced"
    assert decide(lower_is_worse, ci(0.9, 0.85, 0.94), 0.001, M)[0] == "opposite effect"
    with pytest.raises(ValueError, match="non-inferiority bound 0.95 needs no ratio and lies on the worse side"):
        Target(None, 1, "derived: x", "x", (), no_worse_than=0.95)


def test_the_precision_goal_is_the_band_the_words_need():
    """Issue 31 item 3: a CI of the goal's half-width can fit inside the band (for HZ=250's ×1.065, ±0.014)."""
    hz250 = Target(1.0652, 1, "derived: x", "x", ())
    low, high = consistent_band(hz250, 0.25)
    assert M.precision_log(hz250) == pytest.approx((math.log(high) - math.log(low)) / 2)
    assert M.precision_log(hz250) == pytest.approx(0.0142, abs=0.0001)
    assert M.precision_log(Target(None, 1, "derived: x", "x", ())) == pytest.approx(math.log(1.02))


def test_targets_state_their_provenance_and_a_real_effect():
    with pytest.raises(ValueError, match="'printed' or 'derived: <how>'"):
        Target(1.1, 1, "published", "x", ())
    with pytest.raises(ValueError, match="does not state an effect"):
        Target(0.9, 1, "printed", "x", ())
    low, high = consistent_band(DOWN, 0.25)
    assert low < 0.573 < high and math.log(low) == pytest.approx(1.25 * math.log(0.573))


def test_verdict_needs_a_known_label_and_a_reason():
    with pytest.raises(ValueError, match="not one of"):
        Verdict("hpet", "x", "c", verdict="maybe", reason="r")
    with pytest.raises(ValueError, match="reason"):
        Verdict("hpet", "x", "c", verdict="inconclusive", reason=" ")


# -- synthetic bundles with known truth ------------------------------------------------------------
TEMPLATE = next(paths.repo_root().glob("traces/guest-tcg-2vcpu-*/hpet/*-guest-timejobs"), None)
needs_template = pytest.mark.skipif(TEMPLATE is None, reason="the bundled guest-timejobs bundle is not in traces/")
SHARING = "HPET read sharing on vs off: jobs/min (timejobs, stand-in for AIM7)"


def synthetic_bundle(root, ratio: float, sigma: float, runs: int, seed: int):
    """A bundle laid out like the bundled guest-timejobs one (its manifest's run records, so the condition checks
    see real guest facts), with jobs/min drawn from log-normal distributions: sharing = ratio × no-sharing."""
    manifest = json.loads((TEMPLATE / "manifest.json").read_text())
    records = {}
    for record in manifest["runs"]:
        if not record.get("warmup"):
            records.setdefault(record["condition"], record)
    rng = np.random.default_rng(seed)
    medians = {"tsc": 100_000.0, "hpet-no-sharing": 50_000.0, "hpet-sharing": 50_000.0 * ratio}
    writer = BundleWriter(
        root,
        manifest["host_id"],
        "hpet",
        manifest["experiment"],
        definition=manifest["definition"],
        host=manifest["host"],
        when=datetime(2026, 11, 22, tzinfo=UTC),
    )
    order = [condition for _ in range(runs) for condition in medians]
    for index, condition in enumerate(order):
        record = {**records[condition], "run": f"run-{index + 1:03d}", "order": index}
        value = medians[condition] * math.exp(rng.normal(0, sigma))
        writer.add_run(record, [{"metric": "jobs_per_min", "value": value, "unit": "jobs/min"}])
    writer.seal()
    ctx = SimpleNamespace(
        published=hpet.CLAIM.published(paths.published_dir()), bundles=find_bundles(root, "hpet"), data_dir=root
    )
    return next(v for v in hpet.CLAIM.verdicts(ctx, n_boot=2000) if v.comparison == SHARING)


@needs_template
def test_synthetic_the_target_with_low_power_is_inconclusive(tmp_path):
    verdict = synthetic_bundle(tmp_path, 1.127, 0.30, 4, seed=1)
    assert verdict.verdict == "inconclusive", verdict.reason
    assert verdict.power_at_target < 0.5 and verdict.runs_needed > 4
    assert "power" in verdict.reason and "runs per condition" in verdict.reason


@needs_template
def test_synthetic_no_effect_with_a_tight_ci_is_no_effect_shown(tmp_path):
    verdict = synthetic_bundle(tmp_path, 1.0, 0.01, 30, seed=2)
    assert verdict.verdict == "no effect shown" and "no-effect margin" in verdict.reason, verdict.reason


@needs_template
def test_synthetic_five_times_the_target_is_larger_than_the_target(tmp_path):
    verdict = synthetic_bundle(tmp_path, math.exp(5 * math.log(1.127)), 0.05, 20, seed=3)
    assert verdict.verdict == "larger than the target", verdict.reason
    assert "beyond the consistent sizes" in verdict.reason


@needs_template
def test_synthetic_the_target_with_a_tight_ci_is_reproduced(tmp_path):
    verdict = synthetic_bundle(tmp_path, 1.127, 0.02, 30, seed=4)
    assert verdict.verdict == "reproduced", verdict.reason
    assert verdict.target_ratio == pytest.approx(638791 / 566708)
    assert verdict.target_provenance == "derived: ratio of two printed values (638791 / 566708)"
    assert verdict.source_quotes == "hpet/aim7_compute/haswell_hpet_with, hpet/aim7_compute/haswell_hpet_without"


@needs_template
def test_a_run_whose_condition_check_failed_is_left_out(tmp_path):
    """Runs that booted on the wrong clocksource never reach a verdict; the check table says so."""
    from ticklab.analysis.checks import check_table, run_checks
    from ticklab.analysis.comparisons import measured_runs
    from ticklab.bundle import add_manifest_seal

    synthetic_bundle(tmp_path, 1.127, 0.02, 6, seed=5)
    [bundle] = find_bundles(tmp_path, "hpet")
    manifest_path = bundle.path / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["runs"][1]["guest"] = {**manifest["runs"][1]["guest"], "clocksource": "tsc"}  # an hpet-no-sharing run
    manifest_path.chmod(0o644)
    manifest_path.write_text(json.dumps(manifest))
    (bundle.path / "manifest.sha256").unlink()  # sealed again over the edit, as if captured this way
    add_manifest_seal(bundle.path)
    table = check_table(run_checks("hpet", hpet.CHECKS, [bundle]))
    failed = table[table["failed"] > 0]
    assert list(failed["condition"]) == ["hpet-no-sharing"] and failed["status"].iloc[0].startswith("FAILED in 1 of 6")
    runs, notes = measured_runs([bundle], hpet.CHECKS, "hpet")
    assert "run-002" not in set(runs["run"]) and any(
        "condition check failed or could not be computed (run-002" in n for n in notes
    )


def test_setups_that_tested_nothing_collapse_into_one_row(tmp_path):
    for host in ("host-a", "guest-tcg-x"):
        writer = BundleWriter(
            tmp_path, host, "hpet", "e", definition={}, host={}, when=datetime(2026, 11, 22, tzinfo=UTC)
        )
        writer.manifest.not_testable = f"nothing to run with on {host}"
        writer.seal()
    ctx = SimpleNamespace(
        published=hpet.CLAIM.published(paths.published_dir()), bundles=find_bundles(tmp_path, "hpet"), data_dir=tmp_path
    )
    [row] = hpet.CLAIM.verdicts(ctx, n_boot=200)
    assert row.verdict == "not testable here" and row.setup == "guest-tcg-x, host-a"
    assert "guest-tcg-x: e: nothing to run with on guest-tcg-x | host-a: e: nothing to run with on host-a" == row.reason


def test_too_few_runs_say_so():
    import pandas as pd

    from ticklab.analysis.comparisons import Comparison, verdicts

    runs = pd.DataFrame(
        [
            {
                "host_id": "h",
                "bundle": "b",
                "experiment": "e",
                "run": f"r{i}",
                "condition": c,
                "metric": "work",
                "value": 1.0 + i,
                "unit": "u",
            }
            for i, c in enumerate(["a", "b", "b"])
        ]
    )
    [row] = verdicts("nohz", [Comparison("b vs a", "work", "b", "a", UP, margins=M)], runs, n_boot=200)
    assert row.verdict == "inconclusive" and row.reason.startswith("too few runs: 2 vs 1 measured")


def test_find_bundles_skips_published_and_reads_host_ids(tmp_path):
    for bundle in ("hostA/nohz/20261121T000000Z-ftq", "published/nohz/x", "hostB/hpet/20261121T000000Z-clock"):
        (tmp_path / bundle).mkdir(parents=True)
        (tmp_path / bundle / "manifest.json").write_text("{}")
    (tmp_path / "hostC/nohz/no-manifest").mkdir(parents=True)
    refs = find_bundles(tmp_path, "nohz")
    # a directory without a manifest is listed too: loading it says what is wrong instead of it vanishing
    assert [(r.host_id, r.path.name) for r in refs] == [("hostA", "20261121T000000Z-ftq"), ("hostC", "no-manifest")]
    with pytest.raises(FileNotFoundError, match="does not exist"):
        find_bundles(tmp_path / "nope", "nohz")


def test_outputs_refuse_empty_tables_and_sourceless_figures(tmp_path):
    import matplotlib.pyplot as plt
    import pandas as pd

    out = Outputs(tmp_path, "nohz")
    with pytest.raises(ValueError, match="empty"):
        out.table("t", pd.DataFrame(), caption="c", sources=["x"])
    fig, _ = plt.subplots()
    with pytest.raises(ValueError, match="must name the files it came from"):
        out.figure("f", fig, caption="c", sources=[])
    with pytest.raises(ValueError, match="at least one verdict"):
        out.verdicts([])


def test_blocked_power_is_zero_where_no_bounded_ci_exists_and_high_for_a_clear_effect():
    from ticklab.analysis.power import blocked_detection_power

    rng = np.random.default_rng(5)
    base = np.exp(rng.normal(0, 0.02, 10))
    treated = base * np.exp(rng.normal(0, 0.02, 10))
    assert blocked_detection_power(treated[:5], base[:5], 1.2, alpha=0.05).power == 0.0  # 5 blocks: p >= 0.0625
    clear = blocked_detection_power(treated, base, 1.2, alpha=0.05)
    assert clear.power > 0.95 and clear.runs_needed >= 6 and "signed-rank" in clear.method
