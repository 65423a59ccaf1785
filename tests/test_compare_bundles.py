"""`ticklab compare` on the bundles shipped in traces/: what a new user met comparing two hosts, a host and a lab
guest, and reading the csv (issue 41 item 5). Through the CLI's own entry point, in this process."""

import io
import json
import re

import pandas as pd
import pytest

from conftest import REPO

NOHZ = {
    "intel host": REPO / "traces/intel-xeon-2c-6.18.44-fc-v669-vm/nohz/20261122T215204Z-ftq",
    "amd host": REPO / "traces/amd-epyc-2c-6.18.44-fc-v595-vm/nohz/20261126T195227Z-ftq",
    "intel guest": REPO / "traces/guest-tcg-2vcpu-6.12.117-ticklab-on-intel-xeon-2c-6.18.44-fc-v669-vm/nohz/"
    "20261122T213730Z-guest-ftq",
}


def run_cli(capsys, *argv):
    from ticklab.cli import main

    code = main(["compare", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def test_intel_and_amd_hosts_warn_that_cpus_and_kernels_differ_and_print_fractions(capsys):
    code, out, err = run_cli(capsys, NOHZ["intel host"], NOHZ["amd host"])
    assert code == 0
    warnings = [line for line in err.splitlines() if line.startswith("ticklab compare: warning:")]
    assert len(warnings) == 2, err
    assert "Intel(R) Xeon(R) Processor" in warnings[0] and "AMD EPYC" in warnings[0]
    assert "6.18.44-fc-v669" in warnings[1] and "6.18.44-fc-v595" in warnings[1]
    # the tick's share of the time is ~0.0017: never shown as 0.00
    fraction = out[out.index("local_timer_irq_time_fraction") :]
    assert not re.search(r"(?<![\d.])0\.00(?![\d])", fraction), fraction
    median = (
        pd.read_csv(NOHZ["intel host"] / "results.csv")
        .query("metric == 'local_timer_irq_time_fraction'")["value"]
        .median()
    )
    assert f"{median:.3g}" in fraction
    code, out, _ = run_cli(capsys, NOHZ["intel host"], NOHZ["amd host"], "--format", "json")
    assert len(json.loads(out)["warnings"]) == 2


def test_the_csv_of_two_hosts_has_plain_headers_and_numbers_that_match_the_bundles(capsys):
    code, out, err = run_cli(
        capsys, NOHZ["intel host"], NOHZ["amd host"], "--format", "csv", "--metric", "ftq_count_mean"
    )
    assert code == 0
    table = pd.read_csv(io.StringIO(out))
    assert not any(str(c).endswith("*") for c in table.columns)
    row = table[table.statistic == "Min"].iloc[0]
    runs = {
        side: pd.read_csv(NOHZ[side] / "results.csv").query("metric == 'ftq_count_mean'")["value"]
        for side in ("intel host", "amd host")
    }
    assert (row.a, row.b) == (runs["intel host"].min(), runs["amd host"].min())
    assert row.difference == pytest.approx(row.b - row.a)
    assert row.relative_change_pct == pytest.approx((row.b / row.a - 1) * 100)
    assert row.significant == "*" and row.p_holm < 0.05


def test_the_default_metrics_are_the_nohz_claims_and_all_is_every_shared_one(capsys):
    from ticklab.claims import get_claim
    from ticklab.paths import published_dir

    claim = get_claim("nohz")
    compared = {c.metric for c in claim.comparisons(claim.published(published_dir()))}
    shared = set.intersection(
        *(set(pd.read_csv(NOHZ[s] / "results.csv")["metric"]) for s in ("intel host", "amd host"))
    )
    code, out, err = run_cli(capsys, NOHZ["intel host"], NOHZ["amd host"], "--format", "json")
    assert code == 0 and set(json.loads(out)["metrics"]) == compared & shared
    assert f"of the {len(shared)} metrics" in err
    code, out, err = run_cli(capsys, NOHZ["intel host"], NOHZ["amd host"], "--format", "json", "--metric", "all")
    assert code == 0 and set(json.loads(out)["metrics"]) == shared
    assert {t["metric"] for t in json.loads(out)["tables"]} == shared


def test_a_host_tick_on_bundle_maps_onto_a_guest_condition(capsys):
    host, guest = NOHZ["intel host"], NOHZ["intel guest"]
    code, out, err = run_cli(capsys, host, guest)
    assert code == 2 and "share no condition" in err and "--map" in err
    code, out, err = run_cli(capsys, host, guest, "--map", "tick-on=hz1000")
    assert code == 0 and "condition tick-on vs hz1000" in out
    assert any("setups differ" in line and "lab guest" in line for line in err.splitlines()), err
    code, out, err = run_cli(capsys, host, guest, "--map", "tick-on=hz100")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "'hz100'" in err and "hz1000, hz250, hz1000-nohz_full" in err


@pytest.mark.parametrize("fmt", ["text", "md", "csv", "json"])
def test_the_cross_machine_warning_is_in_every_format_written_to_a_file(capsys, fmt):
    """Issue 56 item 3: `ticklab compare A B > file` keeps the warning that the CPUs and kernels differ."""
    code, out, err = run_cli(
        capsys, NOHZ["intel host"], NOHZ["amd host"], "--format", fmt, "--metric", "ftq_count_mean"
    )
    assert code == 0
    warned = [line.removeprefix("ticklab compare: warning: ") for line in err.splitlines() if "warning:" in line]
    assert len(warned) == 2 and warned[0].startswith("the CPUs differ") and warned[1].startswith("the kernels differ")
    if fmt == "text":
        assert out.splitlines()[:2] == [f"warning: {w}" for w in warned]
    elif fmt == "md":
        assert out.splitlines()[:3] == [f"> **warning:** {warned[0]}", ">", f"> **warning:** {warned[1]}"]
    elif fmt == "csv":
        table = pd.read_csv(io.StringIO(out))
        assert list(table.columns)[-1] == "setup_warning" and len(table) > 0
        assert set(table["setup_warning"]) == {"; ".join(warned)}
    else:
        assert json.loads(out)["warnings"] == warned


def test_one_bundles_conditions_have_no_warning_line_and_an_empty_csv_column(capsys):
    code, out, err = run_cli(capsys, NOHZ["intel guest"], "--metric", "ftq_count_mean")
    assert code == 0 and "Median" in out and "warning" not in out + err
    code, out, err = run_cli(capsys, NOHZ["intel guest"], "--format", "csv", "--metric", "ftq_count_mean")
    table = pd.read_csv(io.StringIO(out))
    assert len(table) > 0 and table["setup_warning"].isna().all()
