"""`ticklab compare`: mmtests-format tables for one bundle's conditions or for two bundles."""

import json
import re
import subprocess
import sys
from datetime import UTC, datetime

import pytest

from ticklab.bundle import BundleWriter
from ticklab.report.compare import CompareError, compare_bundles, render

WHEN = datetime(2026, 11, 21, 18, 0, 0, tzinfo=UTC)


def bundle(
    root,
    host,
    values: dict,
    when=WHEN,
    *,
    claim="hrtick",
    facts=None,
    lab=None,
    metric="runtime_s",
    unit="s",
    more: dict | None = None,
):
    """A sealed bundle of `host` with `values` {condition: [one value a run]} of `metric`; `more` {metric: (unit,
    factor)} adds metrics whose value is the run's times factor; `facts` the manifest's host facts, `lab` its lab."""
    writer = BundleWriter(root, host, claim, "hackbench", definition={}, host=facts or {}, when=when)
    writer.manifest.conditions = [{"name": c} for c in values]
    writer.manifest.lab = lab
    index = 0
    for condition, runs in values.items():
        for value in runs:
            index += 1
            writer.run_dir(f"run-{index:03d}")
            rows = [{"metric": metric, "value": value, "unit": unit}]
            rows += [{"metric": name, "value": value * factor, "unit": u} for name, (u, factor) in (more or {}).items()]
            writer.add_run({"run": f"run-{index:03d}", "condition": condition, "warmup": False}, rows)
    return writer.seal()


def test_one_bundle_compares_its_conditions_in_definition_order(tmp_path):
    path = bundle(tmp_path, "host-a", {"off": [1.0, 1.1, 0.9, 1.0, 1.05, 0.95], "on": [2.0, 2.2, 1.8, 2.0, 2.1, 1.9]})
    comparison = compare_bundles([path])
    [table] = comparison.tables
    assert "baseline off" in table.title
    text = render(comparison, "text")
    assert "Median" in text and "2.00 (+100%)" in text and "on *" in text  # significant after Holm
    assert "Mann-Whitney" in text


def test_two_bundles_compare_shared_conditions_and_formats(tmp_path):
    a = bundle(tmp_path, "host-a", {"off": [1.0, 1.1, 0.9]})
    b = bundle(tmp_path, "host-b", {"off": [1.5, 1.6, 1.4]})
    comparison = compare_bundles([a, b])
    assert [t.title for t in comparison.tables] == [
        "runtime_s, condition off — baseline host-a/20261121T180000Z-hackbench"
    ]
    parsed = json.loads(render(comparison, "json"))
    assert parsed["tables"][0]["n"] == {"host-a/20261121T180000Z-hackbench": 3, "host-b/20261121T180000Z-hackbench": 3}
    assert parsed["warnings"] == []  # the same (empty) host facts: nothing differs
    assert render(comparison, "csv").startswith("metric,statistic,")
    assert "| Median" in render(comparison, "md")


@pytest.mark.slow
def test_bad_requests_say_why(tmp_path):
    a = bundle(tmp_path, "host-a", {"off": [1.0, 1.1]})
    b = bundle(tmp_path, "host-b", {"on": [1.0, 1.1]})
    with pytest.raises(CompareError, match="share no condition"):
        compare_bundles([a, b])
    with pytest.raises(CompareError, match="needs two conditions"):
        compare_bundles([a])
    with pytest.raises(CompareError, match="metric\\(s\\) nope not in the bundle"):
        compare_bundles([a], ["nope"])
    with pytest.raises(CompareError, match="the same bundle twice"):
        compare_bundles([a, a])
    result = subprocess.run([sys.executable, "-m", "ticklab.cli", "compare", str(a)], capture_output=True, text=True)
    assert result.returncode == 2 and "ticklab compare:" in result.stderr and "needs two conditions" in result.stderr


def test_papermill_parameter_files_set_only_notebook_parameters():
    import nbformat
    import yaml

    from conftest import REPO

    files = sorted((REPO / "notebooks" / "params").glob("*.yaml"))
    assert [f.stem for f in files] == ["fleet", "published-only", "this-host"]
    for notebook in sorted((REPO / "notebooks").glob("*.ipynb")):
        book = nbformat.read(notebook, as_version=4)
        [cell] = [c for c in book.cells if "parameters" in c.metadata.get("tags", [])]
        names = {
            line.split("=")[0].strip() for line in cell.source.splitlines() if "=" in line and not line.startswith("#")
        }
        for path in files:
            params = yaml.safe_load(path.read_text())
            assert set(params) <= names, (path.name, notebook.name)
            assert all(isinstance(v, (str, int, float)) for v in params.values()), path.name


@pytest.mark.slow
def test_published_only_parameters_give_not_testable_verdicts(tmp_path):
    import yaml

    from conftest import REPO
    from ticklab.report.build import run_notebook

    params = yaml.safe_load((REPO / "notebooks" / "params" / "published-only.yaml").read_text())
    params["output_dir"] = str(tmp_path)
    result = run_notebook(
        REPO / "notebooks" / "05-nohz.ipynb",
        tmp_path / "05.ipynb",
        params,
        cell_timeout=300,
        notebook_timeout=600,
        claim="nohz",
    )
    assert result.status == "ok", result.error
    verdicts = (tmp_path / "verdicts" / "nohz.csv").read_text()
    assert "not testable here" in verdicts and "no captured bundles" in verdicts
    # without fresh data the fresh cells say so in words; an empty table is what a reader must not get
    executed = json.loads((tmp_path / "05.ipynb").read_text())
    tables = [
        "".join(out["data"]["text/html"])
        for cell in executed["cells"]
        for out in cell.get("outputs", [])
        if "text/html" in out.get("data", {})
    ]
    assert tables, "the notebook shows no table at all"
    empty = [html[:200] for html in tables if not re.search(r"<tbody>.*<tr", html, re.S)]
    assert not empty, empty


@pytest.mark.slow
def test_ticklab_verify_names_a_tampered_bundle(tmp_path):
    good = bundle(tmp_path, "host-a", {"off": [1.0, 1.1]})
    bad = bundle(tmp_path, "host-b", {"off": [1.0, 1.1]})
    results = bad / "results.csv"
    results.chmod(0o644)
    results.write_text(results.read_text().replace("1.1", "9.9"))
    run = subprocess.run([sys.executable, "-m", "ticklab.cli", "verify", str(tmp_path)], capture_output=True, text=True)
    assert run.returncode == 1
    assert f"ok    {good}" in run.stdout and f"FAIL  {bad}" in run.stdout and "results.csv" in run.stdout


@pytest.mark.slow
def test_compare_gives_a_table_or_one_line_for_every_bundle_in_traces(capsys):
    """The README's own examples: every bundle shipped in traces/, with the claim's metric chosen for it (through the
    CLI's own entry point, in this process: a bug that is not ticklab's own error would surface as an exception)."""
    from conftest import REPO
    from ticklab.cli import main

    shipped = [m.parent for m in sorted((REPO / "traces").glob("*/*/*/manifest.json")) if "published" not in m.parts]
    assert shipped
    for path in shipped:
        code = main(["compare", str(path)])
        out, err = capsys.readouterr()
        if code == 0:
            assert "statistic" in out and "Median" in out, path
        else:
            assert code == 2 and len(err.strip().splitlines()) == 1, (path, err)
            assert str(path) in err


def test_zero_constant_and_single_run_data_compare_without_errors(tmp_path):
    single = bundle(tmp_path, "host-a", {"off": [1.0], "on": [2.0]})
    zeros = bundle(tmp_path, "host-b", {"off": [0.0, 0.0, 0.0], "on": [0.0, 1.0, 2.0]})
    text = render(compare_bundles([single]), "text") + render(compare_bundles([zeros]), "text")
    assert "—" in text and "nan" not in text.lower()
    [table] = compare_bundles([single]).tables
    assert table.frame["p_holm"].isna().all(), "one run a side gives no p-value"


# -- issue 41 item 5: what a new user met ------------------------------------------------------------------------

INTEL = {"cpu_model": "Intel(R) Xeon(R) Processor", "kernel_release": "6.18.44-fc-v669"}
AMD = {"cpu_model": "AMD EPYC", "kernel_release": "6.18.44-fc-v595"}
GUEST = {"cpu_model": "QEMU TCG CPU version 2.5+", "kernel_release": "6.12.117-ticklab"}
OFF, ON = [1.0, 1.1, 0.9, 1.0], [2.0, 2.2, 1.8, 2.1]


def run_cli(capsys, *argv):
    from ticklab.cli import main

    code = main(["compare", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def test_bundles_of_different_cpus_kernels_and_setups_warn_one_line_each_on_stderr_and_in_json(tmp_path, capsys):
    intel = bundle(tmp_path, "intel-xeon-2c-6.18.44-fc-v669-vm", {"off": OFF}, claim="demo", facts=INTEL)
    amd = bundle(tmp_path, "amd-epyc-2c-6.18.44-fc-v595-vm", {"off": ON}, claim="demo", facts=AMD)
    code, out, err = run_cli(capsys, intel, amd)
    assert code == 0 and "Median" in out
    warnings = [line for line in err.splitlines() if "warning" in line]
    assert len(warnings) == 2, err
    assert "CPU" in warnings[0] and "Intel(R) Xeon(R) Processor" in warnings[0] and "AMD EPYC" in warnings[0]
    assert "kernel" in warnings[1] and "6.18.44-fc-v669" in warnings[1] and "6.18.44-fc-v595" in warnings[1]
    code, out, err = run_cli(capsys, intel, amd, "--format", "json")
    parsed = json.loads(out)
    assert [w.split(" ")[:3] for w in parsed["warnings"]] == [["the", "CPUs", "differ"], ["the", "kernels", "differ"]]
    # the same machine twice warns of nothing
    again = bundle(tmp_path / "again", "intel-xeon-2c-6.18.44-fc-v669-vm", {"off": ON}, claim="demo", facts=INTEL)
    code, out, err = run_cli(capsys, intel, again)
    assert code == 0 and "warning" not in err


def test_a_host_a_lab_guest_and_the_lab_host_are_three_setup_kinds(tmp_path):
    from ticklab.report.compare import setup_kind

    host = bundle(tmp_path, "intel-xeon-2c-6.18.44-fc-v669-vm", {"off": OFF}, claim="demo", facts=INTEL)
    guest = bundle(
        tmp_path,
        "guest-tcg-2vcpu-6.12.117-ticklab-on-intel-xeon-2c-6.18.44-fc-v669-vm",
        {"off": ON},
        claim="demo",
        facts=GUEST,
        lab={"physical_host": INTEL, "physical_host_id": "intel-xeon-2c-6.18.44-fc-v669-vm"},
    )
    labhost = bundle(
        tmp_path,
        "guest-tcg-2vcpu-6.12.117-ticklab-on-intel-xeon-2c-6.18.44-fc-v669-vm-labhost-kexec",
        {"off": ON},
        claim="demo",
        facts=GUEST,
    )
    from ticklab.bundle import load_bundle

    assert [setup_kind(load_bundle(p).manifest) for p in (host, guest, labhost)] == ["host", "lab guest", "lab host"]
    # on one machine, the lab host (whose bundle names that machine only in its host id) and a lab guest differ in
    # their kind alone
    [setups] = compare_bundles([guest, labhost]).warnings
    assert setups.startswith("the setups differ") and "lab guest" in setups and "lab host" in setups
    warned = compare_bundles([host, guest]).warnings
    assert any("setups differ" in w and "host" in w and "lab guest" in w for w in warned), warned
    # the guest's emulated CPU is named with the machine under it
    assert any("CPUs differ" in w and "QEMU TCG CPU version 2.5+ on Intel(R) Xeon(R) Processor" in w for w in warned)


def test_map_pairs_a_condition_of_the_first_bundle_with_one_of_the_second(tmp_path, capsys):
    host = bundle(tmp_path, "host-a", {"tick-on": OFF}, claim="demo")
    guest = bundle(tmp_path, "guest-b", {"hz1000": ON, "hz250": ON, "hz1000-nohz_full": OFF}, claim="demo")
    with pytest.raises(CompareError, match="share no condition.*--map"):
        compare_bundles([host, guest])
    [table] = compare_bundles([host, guest], pairs=["tick-on=hz1000"]).tables
    assert "condition tick-on vs hz1000" in table.title
    assert [(s.condition) for s in table.columns.values()] == ["tick-on", "hz1000"]
    assert table.frame.set_index(["statistic", "condition"]).loc[("Median", table.baseline), "value"] == 1.0
    two = compare_bundles([host, guest], pairs=["tick-on=hz1000", "tick-on=hz250"]).tables
    assert [t.title.split(" — ")[0] for t in two] == [
        "runtime_s, condition tick-on vs hz1000",
        "runtime_s, condition tick-on vs hz250",
    ]
    # a bad map: one line naming what does not exist and what does, exit 2
    for arg, missing, listed in (
        ("tick-on=hz100", "hz100", "hz1000, hz250, hz1000-nohz_full"),
        ("tick=hz1000", "tick", "tick-on"),
        ("tick-on", "tick-on", ""),
    ):
        code, out, err = run_cli(capsys, host, guest, "--map", arg)
        assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, (arg, err)
        assert f"--map {arg}" in err and repr(missing) in err or arg == "tick-on", (arg, err)
        assert listed in err, (arg, err)
    code, out, err = run_cli(capsys, host, "--map", "tick-on=hz1000")
    assert code == 2 and "--map" in err and "two bundles" in err


def test_map_finds_conditions_whose_names_hold_an_equals_sign(tmp_path):
    a = bundle(tmp_path, "host-a", {"clocksource=tsc threads=1": OFF}, claim="demo")
    b = bundle(tmp_path, "host-b", {"clocksource=hpet threads=1": ON}, claim="demo")
    [table] = compare_bundles([a, b], pairs=["clocksource=tsc threads=1=clocksource=hpet threads=1"]).tables
    assert [s.condition for s in table.columns.values()] == ["clocksource=tsc threads=1", "clocksource=hpet threads=1"]


def test_the_default_metrics_are_the_claims_and_all_shows_every_one(tmp_path, capsys):
    """--help states the default rule; the behaviour follows it: the metrics the claim's verdicts compare where the
    bundles have them (hrtick compares runtime_s), else every metric both have; --metric all: every metric."""
    from ticklab.cli import build_parser

    compare_help = build_parser()._subparsers._group_actions[0].choices["compare"].format_help()
    compare_help = " ".join(compare_help.split())
    assert "every metric both sides have)" not in compare_help
    assert "the metrics the claim's verdicts compare" in compare_help and "--metric all" in compare_help
    extra = {"context_switches": ("count", 1000.0)}
    a = bundle(tmp_path, "host-a", {"off": OFF}, claim="hrtick", more=extra)
    b = bundle(tmp_path, "host-b", {"off": ON}, claim="hrtick", more=extra)
    code, out, err = run_cli(capsys, a, b)
    assert code == 0 and "runtime_s" in out and "context_switches" not in out
    assert "1 of the 2 metrics" in err and "--metric all" in err  # says what it left out
    code, out, err = run_cli(capsys, a, b, "--metric", "all")
    assert code == 0 and "runtime_s" in out and "context_switches" in out and "of the" not in err
    # a claim that compares none of them: every metric both have, and nothing to say about it
    c = bundle(tmp_path, "host-c", {"off": OFF}, claim="demo", more=extra)
    d = bundle(tmp_path, "host-d", {"off": ON}, claim="demo", more=extra)
    assert [t.metric for t in compare_bundles([c, d]).tables] == ["context_switches", "runtime_s"]


def test_numbers_print_three_significant_digits_or_scientific():
    from ticklab.report.compare import by_magnitude

    assert [by_magnitude(x) for x in (0.0042, 0.05527, 1.78, 224.83, 12655.85, 0.0, -33.25, 2.5e-5, 3.2e7)] == [
        "0.00420",
        "0.0553",
        "1.78",
        "225",
        "12656",
        "0",
        "-33.2",
        "2.50e-05",
        "3.20e+07",
    ]


def test_a_fraction_never_prints_as_zero(tmp_path):
    fractions = bundle(
        tmp_path,
        "host-a",
        {"off": [0.0042, 0.0044, 0.0041], "on": [0.0031, 0.0030, 0.0032]},
        claim="demo",
        metric="tick_time_fraction",
        unit="fraction",
    )
    text = render(compare_bundles([fractions]), "text")
    assert "0.00420" in text and "0.00310 (-26.2%)" in text
    assert not re.search(r"(?<![\d.])0\.00(?![\d])", text), text


def test_csv_is_one_table_with_a_number_in_each_cell_and_plain_headers(tmp_path):
    import io

    import pandas as pd

    a = bundle(tmp_path, "host-a", {"off": OFF, "on": OFF}, claim="demo")
    b = bundle(tmp_path, "host-b", {"off": ON, "on": [1.0, 1.1, 0.9, 1.05]}, claim="demo")
    comparison = compare_bundles([a, b])
    table = pd.read_csv(io.StringIO(render(comparison, "csv")), converters={"significant": str})
    assert list(table.columns) == [
        "metric",
        "statistic",
        "a_bundle",
        "a_condition",
        "b_bundle",
        "b_condition",
        "unit",
        "a",
        "b",
        "difference",
        "relative_change_pct",
        "p_holm",
        "significant",
        "setup_warning",
    ]
    for column in ("a", "b", "difference", "relative_change_pct", "p_holm"):
        assert pd.api.types.is_float_dtype(table[column]), column
    assert len(table) == 2 * 6  # two condition pairs, six statistics
    median_off = table[(table.statistic == "Median") & (table.a_condition == "off")].iloc[0]
    assert (median_off.a, median_off.b) == (1.0, 2.05)
    assert median_off.difference == pytest.approx(1.05) and median_off.relative_change_pct == pytest.approx(105)
    assert median_off.significant == "*" and median_off.p_holm < 0.05
    assert (table[table.a_condition == "on"].significant == "").all()
    assert (
        table.loc[table.statistic == "CoefVar", "unit"].eq("%").all()
        and table.loc[table.statistic == "Min", "unit"].eq("s").all()
    )
    # one bundle: the baseline condition is a, each other condition b
    one = pd.read_csv(io.StringIO(render(compare_bundles([b]), "csv")))
    assert set(one.a_condition) == {"off"} and set(one.b_condition) == {"on"} and (one.a_bundle == one.b_bundle).all()


def test_two_copies_of_one_bundle_are_two_columns(tmp_path):
    import shutil

    a = bundle(tmp_path / "one", "host-a", {"off": OFF})
    copy = tmp_path / "two" / a.relative_to(tmp_path / "one")
    shutil.copytree(a, copy)
    [table] = compare_bundles([a, copy]).tables
    assert list(table.columns) == [str(a), str(copy)]
    assert table.frame.attrs["n"] == {str(a): 4, str(copy): 4}
