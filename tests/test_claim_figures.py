"""Figure and table defects of issue 31 (item 8): printed numbers at their printed precision, the source's own row
labels, median labels clear of the points they summarise, the FTQ shelf measure and the fresh per-setup figures.
Each test builds its figure or table from the published layer or from a small synthetic frame, in this process."""

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from ticklab import paths  # noqa: E402
from ticklab.outputs import markdown_table, plain_number  # noqa: E402
from ticklab.published import load_published  # noqa: E402


def published(claim: str):
    return load_published(paths.published_dir(), claim)


# -- printed numbers are never rounded (pvspinlock: 17m12.8s = 1032.8 s, not 1033) --------------------------------

@pytest.mark.parametrize("value, shown", [(1032.8, "1032.8"), (974.8, "974.8"), (-9.26, "-9.26"), (0.23, "0.23"),
                                          (22448.55, "22448.55"), (np.float64(1032.8), "1032.8"), (646515.0, "646515"),
                                          (1.0023328, "1.002"), (0.123456, "0.1235")])
def test_a_table_shows_a_short_number_exactly_and_cuts_only_long_arithmetic(value, shown):
    assert plain_number(value) == shown


def test_the_build_time_table_shows_every_printed_time_at_its_printed_precision():
    from ticklab.claims import pvspinlock

    pub = published("pvspinlock")
    text = markdown_table(pvspinlock.build_time_table(pub), index=False)
    raw = pub.table("kernel_build_time")
    for row in raw.itertuples():
        assert row.value_as_printed in text, row.id
        assert f"| {row.value:g} " in text, (row.id, row.value)  # seconds, e.g. 1032.8 for 17m12.8s
    assert "| 1033 " not in text
