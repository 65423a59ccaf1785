"""`ticklab compare`: mmtests-format tables for one bundle's conditions or for two bundles."""

import json
import re
import subprocess
import sys
from datetime import datetime, timezone

import pytest

from ticklab.bundle import BundleWriter
from ticklab.report.compare import CompareError, compare_tables, render

WHEN = datetime(2026, 11, 21, 18, 0, 0, tzinfo=timezone.utc)


def bundle(root, host, values: dict, when=WHEN):
    writer = BundleWriter(root, host, "hrtick", "hackbench", definition={}, host={}, when=when)
    writer.manifest.conditions = [{"name": c} for c in values]
    index = 0
    for condition, runs in values.items():
        for value in runs:
            index += 1
            writer.run_dir(f"run-{index:03d}")
            writer.add_run({"run": f"run-{index:03d}", "condition": condition, "warmup": False},
                           [{"metric": "runtime_s", "value": value, "unit": "s"}])
    return writer.seal()


def test_one_bundle_compares_its_conditions_in_definition_order(tmp_path):
    path = bundle(tmp_path, "host-a", {"off": [1.0, 1.1, 0.9, 1.0, 1.05, 0.95], "on": [2.0, 2.2, 1.8, 2.0, 2.1, 1.9]})
    [(title, table)] = compare_tables([path])
    assert "baseline off" in title
    text = render([(title, table)], "text")
    assert "Median" in text and "2.00 (+100.00%)" in text and "on *" in text  # significant after Holm
    assert "Mann-Whitney" in text


def test_two_bundles_compare_shared_conditions_and_formats(tmp_path):
    a = bundle(tmp_path, "host-a", {"off": [1.0, 1.1, 0.9]})
    b = bundle(tmp_path, "host-b", {"off": [1.5, 1.6, 1.4]})
    tables = compare_tables([a, b])
    assert [t for t, _ in tables] == ["runtime_s, condition off — baseline host-a/20261121T180000Z-hackbench"]
    parsed = json.loads(render(tables, "json"))
    assert parsed[0]["n"] == {"host-a/20261121T180000Z-hackbench": 3, "host-b/20261121T180000Z-hackbench": 3}
    assert render(tables, "csv").startswith("# runtime_s, condition off")
    assert "| Median" in render(tables, "md")


def test_bad_requests_say_why(tmp_path):
    a = bundle(tmp_path, "host-a", {"off": [1.0, 1.1]})
    b = bundle(tmp_path, "host-b", {"on": [1.0, 1.1]})
    with pytest.raises(CompareError, match="share no condition"):
        compare_tables([a, b])
    with pytest.raises(CompareError, match="needs two conditions"):
        compare_tables([a])
    with pytest.raises(CompareError, match="metric\\(s\\) nope not in the bundle"):
        compare_tables([a], ["nope"])
    with pytest.raises(CompareError, match="the same bundle twice"):
        compare_tables([a, a])
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
        names = {line.split("=")[0].strip() for line in cell.source.splitlines() if "=" in line and not line.startswith("#")}
        for path in files:
            params = yaml.safe_load(path.read_text())
            assert set(params) <= names, (path.name, notebook.name)
            assert all(isinstance(v, (str, int, float)) for v in params.values()), path.name


def test_published_only_parameters_give_not_testable_verdicts(tmp_path):
    import yaml

    from conftest import REPO
    from ticklab.report.build import run_notebook

    params = yaml.safe_load((REPO / "notebooks" / "params" / "published-only.yaml").read_text())
    params["output_dir"] = str(tmp_path)
    result = run_notebook(REPO / "notebooks" / "05-nohz.ipynb", tmp_path / "05.ipynb", params, cell_timeout=300,
                          notebook_timeout=600, claim="nohz")
    assert result.status == "ok", result.error
    verdicts = (tmp_path / "verdicts" / "nohz.csv").read_text()
    assert "not testable here" in verdicts and "no captured bundles" in verdicts
    # without fresh data the fresh cells say so in words; an empty table is what a reader must not get
    executed = json.loads((tmp_path / "05.ipynb").read_text())
    tables = ["".join(out["data"]["text/html"]) for cell in executed["cells"] for out in cell.get("outputs", [])
              if "text/html" in out.get("data", {})]
    assert tables, "the notebook shows no table at all"
    empty = [html[:200] for html in tables if not re.search(r"<tbody>.*<tr", html, re.S)]
    assert not empty, empty


def test_ticklab_verify_names_a_tampered_bundle(tmp_path):
    good = bundle(tmp_path, "host-a", {"off": [1.0, 1.1]})
    bad = bundle(tmp_path, "host-b", {"off": [1.0, 1.1]})
    results = bad / "results.csv"
    results.chmod(0o644)
    results.write_text(results.read_text().replace("1.1", "9.9"))
    run = subprocess.run([sys.executable, "-m", "ticklab.cli", "verify", str(tmp_path)], capture_output=True, text=True)
    assert run.returncode == 1
    assert f"ok    {good}" in run.stdout and f"FAIL  {bad}" in run.stdout and "results.csv" in run.stdout


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
    from ticklab.report.compare import compare_tables, render

    single = bundle(tmp_path, "host-a", {"off": [1.0], "on": [2.0]})
    zeros = bundle(tmp_path, "host-b", {"off": [0.0, 0.0, 0.0], "on": [0.0, 1.0, 2.0]})
    text = render(compare_tables([single]), "text") + render(compare_tables([zeros]), "text")
    assert "—" in text and "nan" not in text.lower()
    [(_, table)] = compare_tables([single])
    assert table["p_holm"].isna().all(), "one run a side gives no p-value"
