import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as sps

from ticklab.analysis import stats


def test_cliffs_delta_hand_computed():
    # pairs (a, b): 3>1, 3>2, 3=3 | 4>1, 4>2, 4>3  -> 5 greater, 0 less, 1 tie over 6 pairs
    assert stats.cliffs_delta([3, 4], [1, 2, 3]) == pytest.approx(5 / 6)
    assert stats.cliffs_delta([1, 2], [3, 4]) == -1.0


def test_cliffs_delta_matches_mann_whitney_u():
    rng = np.random.default_rng(3)
    a, b = rng.normal(0, 1, 13), rng.normal(0.5, 1, 9)
    u = stats.mann_whitney(a, b).statistic
    assert stats.cliffs_delta(a, b) == pytest.approx(2 * u / (13 * 9) - 1)


def test_mann_whitney_agrees_with_scipy():
    a, b = [1.1, 2.3, 2.9, 4.0, 5.5], [3.1, 4.4, 6.0, 6.5, 7.2, 8.0]
    ours = stats.mann_whitney(a, b)
    theirs = sps.mannwhitneyu(a, b, alternative="two-sided")
    # a above b: 4.0 > 3.1, 5.5 > 3.1, 5.5 > 4.4 -> U = 3
    assert ours.statistic == theirs.statistic == 3.0
    assert ours.pvalue == pytest.approx(theirs.pvalue)


def test_holm_hand_computed():
    # sorted 0.01, 0.02, 0.04 -> 3*0.01, max(0.03, 2*0.02), max(0.04, 1*0.04)
    assert stats.holm([0.04, 0.01, 0.02]) == pytest.approx([0.04, 0.03, 0.04])
    assert stats.holm([0.5, 0.6]) == pytest.approx([1.0, 1.0])


def test_holm_rejects_invalid_p():
    with pytest.raises(ValueError, match="within"):
        stats.holm([0.2, 1.5])


def test_median_ci_n10_uses_second_and_ninth_order_statistics():
    values = list(range(10, 0, -1))  # 1..10 unsorted
    ci = stats.median_ci(values)
    assert (ci.low, ci.high, ci.estimate) == (2.0, 9.0, 5.5)
    assert "0.9785" in ci.method  # 1 - 2 * 11/1024


def test_median_ci_too_few_values_says_so():
    ci = stats.median_ci([1, 2, 3, 4, 5])
    assert np.isnan(ci.low) and "too small" in ci.method


def test_ratio_of_medians_is_seeded_and_brackets_a_clear_effect():
    rng = np.random.default_rng(7)
    treatment, baseline = rng.normal(20, 1, 15), rng.normal(10, 1, 15)
    first = stats.ratio_of_medians(treatment, baseline, n_boot=2000, seed=1)
    again = stats.ratio_of_medians(treatment, baseline, n_boot=2000, seed=1)
    assert first == again
    assert first.estimate == pytest.approx(np.median(treatment) / np.median(baseline))
    assert 1.5 < first.low < first.estimate < first.high < 2.6
    assert first.method.startswith("percentile bootstrap")


def test_ratio_of_medians_constant_samples():
    ci = stats.ratio_of_medians([2, 2, 2], [1, 1, 1])
    assert (ci.estimate, ci.low, ci.high) == (2, 2, 2)


def test_ratio_of_medians_rejects_bad_input():
    with pytest.raises(ValueError, match="treatment: needs at least 2"):
        stats.ratio_of_medians([1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="baseline: contains NaN"):
        stats.ratio_of_medians([1.0, 2.0], [1.0, float("nan")])


def test_anderson_ksamp_separates_and_does_not_separate():
    rng = np.random.default_rng(0)
    sample = rng.normal(0, 1, 40)
    same = stats.anderson_ksamp([sample, rng.permutation(sample)], n_resamples=499)
    shifted = stats.anderson_ksamp([sample, rng.normal(2, 1, 40)], n_resamples=499)
    assert same.pvalue > 0.5
    assert shifted.pvalue < 0.01


def test_coefficient_of_variation_uses_sample_stddev():
    assert stats.coefficient_of_variation([2, 4, 4, 4, 5, 5, 7, 9]) == pytest.approx(
        np.std([2, 4, 4, 4, 5, 5, 7, 9], ddof=1) / 5 * 100
    )


def test_pct_diff_is_mmtests_pdiff():
    assert stats.pct_diff(33072.10, 2215.06) == pytest.approx(1393.0566, abs=1e-4)
    assert stats.pct_diff(50, 100) == -50


def test_compare_table_rows_signs_and_significance():
    base = [10.0, 11.0, 9.0, 10.5, 9.5, 10.2, 9.8, 10.1]
    fast = [v * 1.5 for v in base]
    same = [v + 0.01 for v in base[::-1]]
    table = stats.compare_table({"base": base, "fast": fast, "same": same}, "base")
    amean = table[(table.statistic == "AMean") & (table.condition == "fast")].iloc[0]
    assert amean.value == pytest.approx(np.mean(fast))
    assert amean.pct_diff == pytest.approx(50.0)
    assert bool(amean.significant) is True
    assert not table[table.condition == "same"]["significant"].iloc[0]
    assert list(dict.fromkeys(table.statistic)) == list(stats.COMPARE_STATISTICS)
    shown = stats.format_compare_table(table)
    assert list(shown.columns) == ["base", "fast *", "same"]
    assert shown.loc["AMean", "fast *"] == f"{np.mean(fast):.2f} (+50.00%)"
    assert "Mann-Whitney" in shown.attrs["legend"] and "pdiff" in shown.attrs["legend"]


def test_compare_summaries_reproduces_the_published_min_percentage():
    wide = pd.DataFrame({"baseline": {"Min": 2215.06}, "patch": {"Min": 33016.10}})
    long = stats.compare_summaries(wide, "baseline")
    assert long.set_index("condition").loc["patch", "pct_diff"] == pytest.approx(1390.5285, abs=1e-4)


samples = st.lists(st.floats(min_value=0.1, max_value=1e6, allow_nan=False), min_size=5, max_size=30)


@settings(max_examples=40, deadline=None)
@given(samples, samples)
def test_bootstrap_ci_contains_the_point_estimate(a, b):
    ci = stats.ratio_of_medians(a, b, n_boot=300, seed=0)
    assert ci.low <= ci.estimate * (1 + 1e-12) and ci.estimate <= ci.high * (1 + 1e-12)


@settings(max_examples=200)
@given(st.lists(st.floats(min_value=0, max_value=1), min_size=1, max_size=20))
def test_holm_never_lowers_a_pvalue_and_stays_a_probability(p):
    adjusted = stats.holm(p)
    assert np.all(adjusted >= np.asarray(p) - 1e-15)
    assert np.all(adjusted <= 1)


@settings(max_examples=100)
@given(st.lists(st.floats(min_value=-1e6, max_value=1e6), min_size=1, max_size=60))
def test_median_ci_contains_the_median(values):
    ci = stats.median_ci(values)
    if not np.isnan(ci.low):
        assert ci.low <= ci.estimate <= ci.high


@settings(max_examples=100)
@given(samples, samples)
def test_cliffs_delta_is_antisymmetric_and_bounded(a, b):
    d = stats.cliffs_delta(a, b)
    assert -1 <= d <= 1
    assert stats.cliffs_delta(b, a) == pytest.approx(-d)
