import math

import pytest

from conftest import CLAIM_IDS
from ticklab import paths
from ticklab.analysis.published import (
    PublishedDataError,
    check_derived,
    load_published,
    parse_printed,
    printed_decimals,
    verify_against_source,
)


@pytest.mark.parametrize("claim", CLAIM_IDS)
def test_every_claim_loads_with_a_quote_per_row(claim):
    published = load_published(paths.published_dir(), claim)
    assert published.tables, claim
    for name, frame in published.tables.items():
        assert frame["quote"].str.len().min() > 0, name


@pytest.mark.parametrize("claim", CLAIM_IDS)
def test_every_quote_occurs_verbatim_in_its_source(claim, seeds):
    published = load_published(paths.published_dir(), claim)
    assert verify_against_source(published, seeds) == []


def test_published_numbers_as_printed():
    pub = load_published(paths.published_dir(), "hpet")
    assert pub.value("aim7_compute", "ivybridge_hpet_without") == 1108537
    assert pub.row("read_hpet_profile", "ivybridge_read_hpet_without")["qualifier"] == "more than"
    build = load_published(paths.published_dir(), "pvspinlock")
    assert build.printed("kernel_build_time", "haswell_32_before") == "2m08.6s"
    assert build.value("kernel_build_time", "haswell_32_before") == pytest.approx(128.6)
    hrtick = load_published(paths.published_dir(), "hrtick")
    assert hrtick.printed("hackbench", "runtime_no_hrtick") == "0.840s"  # printed precision kept


def test_published_tables_cover_the_numbers_the_seed_index_lists():
    by_claim = {c: load_published(paths.published_dir(), c) for c in CLAIM_IDS}
    printed = {c: {v for t in p.tables.values() for v in t["value_as_printed"]} for c, p in by_claim.items()}
    expected = {
        "hpet": {"646515", "566708", "638791", "3145329", "1108537", "3019934", "4.99%", "1.41%", "34%", "2.96%"},
        "pvspinlock": {"3m21.9s", "11m20.6s", "2m08.6s", "17m12.8s", "3m03.2s", "9m21.1s", "2m08.9s", "16m14.8s"},
        "hrtick": {"0.840s", "0.481s", "-42%", "2500/sec", "100/sec", "25%"},
        "acpi-idle": {
            "2215.06",
            "33072.10",
            "+1393.05%",
            "33016.10",
            "+1390.52%",
            "22448.55",
            "+49.89%",
            "+50.85%",
            "17526.70",
            "680.14",
            "880.72",
            "78.07%",
            "2.02%",
            "2.60%",
            "74.76%",
        },
        "nohz": {"80us", "8% overhead", "one interruption", "10 second window"},
    }
    for claim, values in expected.items():
        assert values <= printed[claim], (claim, values - printed[claim])


@pytest.mark.parametrize(
    "text,value",
    [
        ("3m21.9s", 201.9),
        ("17m12.8s", 1032.8),
        ("+1393.05%", 1393.05),
        ("-42%", -42),
        ("0.840s", 0.84),
        ("HZ=1000", 1000),
        ("4-socket", 4),
        ("one interruption", 1),
        ("half", 0.5),
        ("v5", 5),
    ],
)
def test_parse_printed(text, value):
    assert parse_printed(text) == pytest.approx(value)


def test_printed_decimals_keeps_trailing_zeros():
    assert printed_decimals("0.840s") == 3
    assert printed_decimals("32938.80") == 2
    assert printed_decimals("~-42%") == 0


def test_value_that_contradicts_its_printed_text_names_file_and_row(published_copy):
    csv = published_copy / "hpet" / "aim7_compute.csv"
    csv.write_text(csv.read_text().replace("646515,jobs/min,646515", "646516,jobs/min,646515"))
    with pytest.raises(PublishedDataError, match=r"aim7_compute\.csv: row 2 \(id 'haswell_tsc'\).*646516"):
        load_published(published_copy, "hpet")


def test_row_without_quote_is_rejected(published_copy):
    csv = published_copy / "nohz" / "tick_cost.csv"
    csv.write_text(csv.read_text() + "extra,thinkpad,1000,x,1,us,1us,\n")
    with pytest.raises(PublishedDataError, match=r"provenance\.yaml: tick_cost\.csv row\(s\) without a quote: extra"):
        load_published(published_copy, "nohz")


def test_quote_not_in_source_is_reported(published_copy, seeds):
    prov = published_copy / "hrtick" / "provenance.yaml"
    prov.write_text(prov.read_text().replace('"On a 112 CPU SKL machine this results in:"', '"On a 112 CPU SKL box"'))
    problems = verify_against_source(load_published(published_copy, "hrtick"), seeds)
    assert any("id 'cpus': quote not found verbatim" in p for p in problems), problems


def test_token_pins_the_table_column(published_copy, seeds):
    prov = published_copy / "pvspinlock" / "provenance.yaml"
    text = prov.read_text().replace(
        'westmere_48_before: {quote: "Before patch 3m21.9s 11m20.6s 2m08.6s 17m12.8s", token: 3}',
        'westmere_48_before: {quote: "Before patch 3m21.9s 11m20.6s 2m08.6s 17m12.8s", token: 4}',
    )
    prov.write_text(text)
    problems = verify_against_source(load_published(published_copy, "pvspinlock"), seeds)
    assert problems == [
        "%s id 'westmere_48_before': word 4 of the quote is '2m08.6s', not '11m20.6s'"
        % (published_copy / "pvspinlock" / "kernel_build_time.csv")
    ]


def test_missing_claim_directory_is_a_clear_error(tmp_path):
    with pytest.raises(PublishedDataError, match="provenance.yaml: missing"):
        load_published(tmp_path, "hpet")


def test_derived_checks_distinguish_rounding_from_truncation():
    pdiff = lambda new, base: new * 100 / base - 100  # noqa: E731
    min_row = check_derived("Min", "+1393.05%", pdiff, {"new": "33072.10", "base": "2215.06"}, "")
    assert min_row["finding"] == "matches (rounded)"
    assert min_row["recomputed"] == pytest.approx(1393.0566, abs=1e-4)
    amean_row = check_derived("AMean", "+49.89%", pdiff, {"new": "33649.27", "base": "22448.55"}, "")
    assert amean_row["finding"] == "matches only if truncated, not rounded"
    assert 49.895 < amean_row["recomputed_low"] < amean_row["recomputed_high"] < 49.8952
    wrong = check_derived("AMean", "+48.00%", pdiff, {"new": "33649.27", "base": "22448.55"}, "")
    assert wrong["finding"] == "does not match"
    assert math.isclose(wrong["difference"], 1.8951, abs_tol=1e-3)


# -- issue 27, item 14: a blank cell, a blank value, an unbounded provenance.yaml --------------------------------


def _edit_row(csv_path, row_id, column, value):
    lines = csv_path.read_text().splitlines()
    header = lines[0].split(",")
    for number, line in enumerate(lines):
        fields = line.split(",")
        if fields[0] == row_id:
            fields[header.index(column)] = value
            lines[number] = ",".join(fields)
            csv_path.write_text("\n".join(lines) + "\n")
            return number + 1
    raise AssertionError(row_id)


def test_issue27_a_blank_system_cell_names_file_row_and_column(published_copy):
    """A blank system loaded, then the HPET claim raised ValueError 'expected one row' (a ticklab bug to the CLI)."""
    csv = published_copy / "hpet" / "aim7_compute.csv"
    row = _edit_row(csv, "haswell_tsc", "system", "")
    with pytest.raises(PublishedDataError) as raised:
        load_published(published_copy, "hpet")
    assert str(raised.value) == f"{csv}: row {row}, column system: blank; every row needs it"


def test_issue27_a_blank_value_beside_a_printed_number_is_refused(published_copy):
    """A blank value beside value_as_printed '646515' loaded as NaN, and verify-published said it loads."""
    csv = published_copy / "hpet" / "aim7_compute.csv"
    row = _edit_row(csv, "haswell_tsc", "value", "")
    with pytest.raises(PublishedDataError) as raised:
        load_published(published_copy, "hpet")
    assert str(raised.value) == (
        f"{csv}: row {row} (id 'haswell_tsc'), column value: blank, but value_as_printed '646515' states 646515"
    )


def test_issue27_a_target_from_a_row_without_a_number_is_an_error_not_nan():
    """The one row of hackbench.csv that prints no number has no value: a target from it was nan."""
    published = load_published(paths.published_dir(), "hrtick")
    with pytest.raises(PublishedDataError, match=r"hackbench\.csv: row id 'no_regression_after', column value: blank"):
        published.value("hackbench", "no_regression_after")
    assert published.value("hackbench", "runtime_hrtick") == pytest.approx(0.481)


def test_issue27_the_hpet_claim_names_a_missing_published_row(published_copy):
    from ticklab.claims.hpet import throughput_table

    csv = published_copy / "hpet" / "aim7_compute.csv"
    _edit_row(csv, "haswell_tsc", "system", "another-system")
    published = load_published(published_copy, "hpet")
    with pytest.raises(
        PublishedDataError,
        match=rf"^{csv}: expected one row for system haswell-ex-4s-72c, "
        r"clocksource tsc, patch n/a; found 0$",
    ):
        throughput_table(published)


def test_issue27_provenance_is_read_with_a_size_cap(published_copy, monkeypatch):
    """A ~100 MB provenance.yaml was read whole (here the cap is lowered so the test stays small)."""
    from ticklab.analysis import published as module

    monkeypatch.setattr(module, "MAX_PROVENANCE_BYTES", 64 << 10, raising=False)
    provenance = published_copy / "hpet" / "provenance.yaml"
    provenance.write_text(provenance.read_text() + "# " + "x" * (100 << 10) + "\n")
    with pytest.raises(PublishedDataError, match=rf"^{provenance}: larger than the 65536 bytes ticklab reads of it$"):
        load_published(published_copy, "hpet")


def test_issue27_a_published_table_is_read_with_a_size_cap_and_never_through_a_link(
    published_copy, monkeypatch, tmp_path
):
    from ticklab.analysis import published as module

    monkeypatch.setattr(module, "MAX_TABLE_BYTES", 64 << 10, raising=False)
    csv = published_copy / "hpet" / "aim7_compute.csv"
    text = csv.read_text()
    csv.write_text(text + "\n" * (100 << 10))
    with pytest.raises(PublishedDataError, match=rf"^{csv}: larger than the 65536 bytes"):
        load_published(published_copy, "hpet")
    (tmp_path / "elsewhere.csv").write_text(text)
    csv.unlink()
    csv.symlink_to(tmp_path / "elsewhere.csv")
    with pytest.raises(PublishedDataError, match=rf"^{csv}: is a symbolic link"):
        load_published(published_copy, "hpet")


@pytest.mark.parametrize(
    "cell, message",
    [
        ("9" * 100_000, "column value: 100000 characters, more than the 1000 of a published cell"),
        ("9" * 900, "value '99999"),  # 1e900: not finite, quoted bounded
    ],
)
def test_issue27_a_huge_cell_is_refused_or_quoted_bounded(published_copy, cell, message):
    """A 100,000-character cell was echoed whole (and a printed value that long took minutes to parse)."""
    csv = published_copy / "hpet" / "aim7_compute.csv"
    _edit_row(csv, "haswell_tsc", "value", cell)
    with pytest.raises(PublishedDataError) as raised:
        load_published(published_copy, "hpet")
    text = str(raised.value)
    assert text.startswith(f"{csv}: row 2") and message in text and len(text) < 600 and "\n" not in text
