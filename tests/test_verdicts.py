import pytest

from ticklab.fresh import find_bundles
from ticklab.outputs import Outputs
from ticklab.stats import Interval
from ticklab.verdicts import Verdict, decide


def ci(estimate, low, high):
    return Interval(estimate, low, high, 0.95, "test")


def test_same_direction_significant_is_reproduced():
    verdict, reason = decide(2.724, ci(1.5, 1.3, 1.7), p_holm=0.001)
    assert verdict == "reproduced"
    assert "29% of the published change" in reason


def test_lower_is_better_claims_use_the_lower_side():
    assert decide(0.573, ci(0.8, 0.7, 0.9), p_holm=0.01)[0] == "reproduced"
    assert decide(0.573, ci(1.2, 1.1, 1.3), p_holm=0.01)[0] == "not reproduced"


def test_ci_around_one_that_excludes_the_published_ratio_is_not_reproduced():
    verdict, reason = decide(1.127, ci(1.0, 0.99, 1.01), p_holm=0.8)
    assert verdict == "not reproduced" and "contains 1 and excludes the published ratio" in reason


def test_wide_ci_is_inconclusive():
    assert decide(1.127, ci(1.05, 0.9, 1.2), p_holm=0.4)[0] == "inconclusive"


def test_significant_ci_excluding_one_needs_the_adjusted_p():
    assert decide(1.5, ci(1.2, 1.05, 1.3), p_holm=0.2)[0] == "inconclusive"


def test_verdict_needs_a_known_label_and_a_reason():
    with pytest.raises(ValueError, match="not one of"):
        Verdict("hpet", "x", "c", "e", verdict="maybe", reason="r")
    with pytest.raises(ValueError, match="reason"):
        Verdict("hpet", "x", "c", "e", verdict="inconclusive", reason=" ")


def test_find_bundles_skips_published_and_reads_host_ids(tmp_path):
    for bundle in ("hostA/nohz/20261121T000000Z-ftq", "published/nohz/x", "hostB/hpet/20261121T000000Z-clock"):
        (tmp_path / bundle).mkdir(parents=True)
        (tmp_path / bundle / "manifest.json").write_text("{}")
    (tmp_path / "hostC/nohz/no-manifest").mkdir(parents=True)
    refs = find_bundles(tmp_path, "nohz")
    assert [(r.host_id, r.path.name) for r in refs] == [("hostA", "20261121T000000Z-ftq")]
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
