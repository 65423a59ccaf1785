import ast
import json
import stat
from datetime import UTC, datetime
from pathlib import Path

import pytest

from ticklab.analysis.captured import find_bundles
from ticklab.bundle import BundleError, BundleWriter, load_bundle
from ticklab.trace import rawfile

WHEN = datetime(2026, 11, 21, 18, 0, 0, tzinfo=UTC)


def make_bundle(traces, *, runs=2, seal=True):
    writer = BundleWriter(
        traces,
        "qemu-tcg-x86_64-2c-6.12",
        "nohz",
        "ftq",
        definition={"runs": runs},
        host={"kernel": "6.12.0", "nproc": 2},
        when=WHEN,
    )
    for index in range(runs):
        raw = writer.run_dir(f"run-{index:03d}")
        (raw / "ftq.dat").write_text(f"# quantum 1000000\n{index} 12345\n")
        writer.add_run(
            {"run": f"run-{index:03d}", "condition": "hz1000", "order": index, "exit_status": 0},
            [{"metric": "work_per_quantum_median", "value": 12345 + index, "unit": "iterations"}],
        )
    return writer.seal() if seal else writer.path


def test_sealed_bundle_loads_with_results_and_read_only_files(tmp_path):
    path = make_bundle(tmp_path)
    assert path == tmp_path / "qemu-tcg-x86_64-2c-6.12/nohz/20261121T180000Z-ftq"
    bundle = load_bundle(path)
    assert bundle.sealed and len(bundle.manifest.runs) == 2
    assert bundle.results["value"].tolist() == [12345, 12346]
    assert set(bundle.manifest.files) == {"results.csv", "raw/run-000/ftq.dat", "raw/run-001/ftq.dat"}
    mode = (path / "raw/run-000/ftq.dat").stat().st_mode
    assert not mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)
    assert [b.path for b in find_bundles(tmp_path, "nohz")] == [path]


def _tamper(file):
    file.chmod(0o644)
    data = bytearray(file.read_bytes())
    data[-2] ^= 0x01
    file.write_bytes(bytes(data))


def test_sealing_xzs_large_raw_files_in_every_run(tmp_path):
    import lzma

    writer = BundleWriter(tmp_path, "host", "nohz", "ftq", definition={}, host={}, when=WHEN)
    plan = [
        ("run-001", "a", True),
        ("run-002", "a", False),
        ("run-003", "b", False),
        ("run-004", "a", False),
        ("run-005", "b", False),
    ]
    for run, condition, warmup in plan:
        trace = writer.run_dir(run) / "trace"
        trace.mkdir()
        (trace / "trace.dat").write_bytes(run.encode() * 20000)
        (trace / "trace-cmd.log").write_text("small files stay as they are\n")
        writer.add_run({"run": run, "condition": condition, "warmup": warmup, "trace": {"directory": "trace"}}, [])
    path = writer.seal()
    assert not list(path.glob("raw/*/trace/trace.dat"))  # the first measured run of each condition too (issue 42)
    for run, _, _ in plan:
        assert lzma.decompress((path / "raw" / run / "trace" / "trace.dat.xz").read_bytes()) == run.encode() * 20000
        assert rawfile.read_bytes(path / "raw" / run / "trace" / "trace.dat") == run.encode() * 20000
        assert (path / "raw" / run / "trace" / "trace-cmd.log").is_file()
    bundle = load_bundle(path)  # checksums cover the compressed files
    assert bundle.manifest.raw_files["compressed"] == 5 and "uncompressed_runs" not in bundle.manifest.raw_files
    assert "raw/run-004/trace/trace.dat.xz" in bundle.manifest.files


def test_one_changed_byte_names_the_file(tmp_path):
    path = make_bundle(tmp_path)
    _tamper(path / "raw/run-001/ftq.dat")
    with pytest.raises(BundleError, match=r"raw/run-001/ftq\.dat: sha256 differs"):
        load_bundle(path)


def test_missing_and_added_files_are_named(tmp_path):
    path = make_bundle(tmp_path)
    (path / "raw/run-000/extra.txt").write_text("x")
    with pytest.raises(BundleError, match=r"raw/run-000/extra\.txt: not listed"):
        load_bundle(path)
    (path / "raw/run-000/extra.txt").unlink()
    (path / "raw/run-000/ftq.dat").unlink()
    with pytest.raises(BundleError, match=r"raw/run-000/ftq\.dat: listed in the manifest but missing"):
        load_bundle(path)


def test_interrupted_capture_leaves_an_incomplete_bundle_with_finished_runs(tmp_path):
    path = make_bundle(tmp_path, runs=1, seal=False)
    with pytest.raises(BundleError, match="incomplete \\(1 run\\(s\\) finished\\)"):
        load_bundle(path)
    bundle = load_bundle(path, allow_incomplete=True)
    assert bundle.manifest.status == "incomplete" and len(bundle.results) == 1


def test_bundles_are_never_overwritten(tmp_path):
    make_bundle(tmp_path)
    with pytest.raises(BundleError, match="exists already"):
        make_bundle(tmp_path)


def test_schema_problems_name_the_manifest(tmp_path):
    path = make_bundle(tmp_path)
    manifest = path / "manifest.json"
    manifest.chmod(0o644)
    data = json.loads(manifest.read_text())
    data["schema_version"] = 99
    manifest.write_text(json.dumps(data))
    with pytest.raises(BundleError, match=r"manifest\.json: schema version 99"):
        load_bundle(path)
    data["schema_version"] = 1
    data["runs"][0]["extras"] = [
        {"name": "gapdet", "directory": "run-001/gapdet", "trace": {"directory": "../../root"}}
    ]
    manifest.write_text(json.dumps(data))
    with pytest.raises(
        BundleError,
        match=r"manifest\.json: runs\[0\]\.extras\[0\]\.trace\.directory: '\.\./\.\./root' is not of the allowed form",
    ):
        load_bundle(path)  # analyses open files below the directories a manifest names: never outside the bundle
    manifest.write_text("{not json")
    with pytest.raises(BundleError, match=r"manifest\.json: not valid JSON"):
        load_bundle(path)
    with pytest.raises(BundleError, match="is not a bundle"):
        load_bundle(tmp_path)


def test_bundle_health_flags_lost_events_incomplete_and_tampered_bundles(tmp_path):
    from ticklab.analysis.captured import bundle_health

    writer = BundleWriter(tmp_path, "host-a", "nohz", "ftq", definition={}, host={}, when=WHEN)
    writer.add_run(
        {"run": "run-001", "condition": "tick-on", "status": "ok", "trace": {"backend": "tracefs", "lost_events": 5}},
        [],
    )
    writer.seal()
    make_bundle(tmp_path / "other", seal=False)
    tampered = make_bundle(tmp_path / "third")
    _tamper(tampered / "raw/run-001/ftq.dat")
    health = {row.bundle: row for row in bundle_health(tmp_path, ["nohz"]).itertuples()}
    [row] = health.values()
    assert (row.lost_events, row.flag) == (5, "kernel lost 5 trace event(s)")
    assert bundle_health(tmp_path / "other", ["nohz"]).iloc[0]["flag"] == "incomplete: capture was interrupted"
    flag = bundle_health(tmp_path / "third", ["nohz"]).iloc[0]["flag"]
    assert "raw/run-001/ftq.dat: sha256 differs" in flag


def test_a_claims_analysis_loads_and_verifies_each_bundle_once(monkeypatch, tmp_path):
    """Notebook 01's fresh-data cells read the bundles for five tables and the verdicts; each is verified once."""
    from collections import Counter

    from ticklab import bundle, paths
    from ticklab.analysis.comparisons import measured_runs
    from ticklab.claims import hpet
    from ticklab.report.notebook import open_claim

    loads = Counter()
    real = bundle._load

    def counted(path, *args):  # every load_bundle, whoever imported it, verifies through _load
        loads[str(path)] += 1
        return real(path, *args)

    monkeypatch.setattr(bundle, "_load", counted)
    ctx = open_claim("hpet", paths.traces_dir(), paths.published_dir(), tmp_path)
    if not ctx.bundles:
        pytest.skip("no hpet bundles under traces/")
    runs, _ = measured_runs(ctx.bundles, hpet.CHECKS, ctx.claim)
    hpet.read_rate_points(runs, hpet.condition_values(ctx.bundles))
    hpet.profile_shares(ctx.bundles)
    ctx.condition_checks()
    hpet.CLAIM.verdicts(ctx, n_boot=100)
    assert loads == Counter({str(ref.path): 1 for ref in ctx.bundles})


def test_every_committed_manifest_reads_into_the_typed_manifest_and_back_exactly():
    """Manifest/RunRecord lose nothing: each bundle under traces/ gives back its manifest.json byte for byte, and
    RunRecord.measured agrees with what the analysis took as measured before there was a type (status ok, no
    problem, not a warm-up)."""
    import json

    from ticklab.bundle import Manifest
    from ticklab.paths import traces_dir

    paths = sorted(p for p in traces_dir().glob("*/*/*/manifest.json") if p.parts[-4] != "published")
    assert paths, "no committed bundles under traces/"
    for path in paths:
        text = path.read_text()
        manifest = Manifest.from_json(json.loads(text))
        assert json.dumps(manifest.to_json(), indent=2, sort_keys=True) + "\n" == text, path
        assert manifest.file_bytes() == path.read_bytes() == load_bundle(path.parent).manifest.file_bytes(), path
        plain = json.loads(text)["runs"]
        assert [r.run for r in manifest.measured_runs()] == [
            r["run"] for r in plain if not r.get("warmup") and r.get("status") == "ok" and not r.get("problem")
        ], path


def test_a_run_record_keeps_absent_keys_absent_and_says_whether_it_was_measured():
    from ticklab.bundle import RunRecord

    bare = {"run": "run-001", "condition": "a", "knobs": []}
    record = RunRecord.from_json(bare)
    assert record.to_json() == bare and record.measured and record.details == {"knobs": []}
    assert not RunRecord.from_json({**bare, "warmup": True}).measured
    assert RunRecord.from_json({**bare, "problem": "booted with the wrong clocksource"}).failed
    assert RunRecord.from_json({**bare, "status": "timeout"}).failed


def test_a_manifest_keeps_keys_written_as_null_and_its_accessors_read_what_was_written():
    from ticklab.bundle import Manifest

    written = {
        "schema_version": 1,
        "status": "sealed",
        "claim": "nohz",
        "experiment": "ftq",
        "definition": {"workload": {"tool": "ftq"}},
        "host": {"kernel_release": "6.12.57", "nproc": 2},
        "not_testable": None,  # the schema allows null here; a repack must write it back as it was
        "stopping": None,
        "conditions": [{"name": "hz1000", "hz": 1000}, {"name": "hz250", "hz": 250}],
        "order": [{"run": "run-001", "block": 1}, {"run": "run-002"}],
        "boot_plan": {"id": "p1", "mode": "kexec"},
        "runs": [
            {"run": "run-001", "condition": "hz1000", "guest": {"kernel": "7.2.0"}, "extras": [{"name": "gapdet"}]},
            {"run": "run-002", "condition": "hz250", "boot": {"kernel_release": "6.12.99"}, "trace": "not a dict"},
        ],
    }
    manifest = Manifest.from_json(written)
    assert manifest.to_json() == written and json.loads(manifest.file_bytes()) == written
    assert manifest.details == {} and manifest.boot_plan == {"id": "p1", "mode": "kexec"}
    first, second = manifest.runs
    assert manifest.runs_by_name == {"run-001": first, "run-002": second}
    assert (
        list(manifest.conditions_by_name) == ["hz1000", "hz250"] and manifest.conditions_by_name["hz250"]["hz"] == 250
    )
    assert manifest.blocks_by_run == {"run-001": 1, "run-002": None}
    assert manifest.workload_tool == "ftq" and manifest.host_fact("nproc") == 2 and manifest.host_fact("cpu") is None
    assert [manifest.kernel_release(r) for r in manifest.runs] == ["7.2.0", "6.12.99"]
    assert first.extra("gapdet") == {"name": "gapdet"} and first.extra("osnoise") is None and first.trace == {}
    assert second.trace == {} and second.extras == [] and second.boot == {"kernel_release": "6.12.99"}
    bare = Manifest.from_json({**written, "host": {}, "runs": [{"run": "run-001", "condition": "a"}]})
    assert bare.kernel_release(bare.runs[0]) == ""


def test_an_incomplete_bundle_reopens_for_more_runs_and_a_sealed_one_does_not(tmp_path):
    writer = BundleWriter(tmp_path, "host-a", "hpet", "exp", definition={"name": "exp"}, host={"nproc": 2})
    writer.add_run(
        {"run": "run-001", "condition": "a", "warmup": False, "status": "ok"},
        [{"metric": "m", "value": 1.0, "unit": "s"}],
    )
    again = BundleWriter.reopen(writer.path)  # as a new process after a reboot would
    again.add_run(
        {"run": "run-002", "condition": "b", "warmup": False, "status": "ok"},
        [{"metric": "m", "value": 2.0, "unit": "s"}],
    )
    again.seal()
    bundle = load_bundle(writer.path)
    assert [r.run for r in bundle.manifest.runs] == ["run-001", "run-002"]
    assert bundle.results["value"].tolist() == [1.0, 2.0]
    with pytest.raises(BundleError, match="status 'sealed'; only an incomplete bundle takes more runs"):
        BundleWriter.reopen(writer.path)


# -- issue 27 item 2: a bundle is made and written below --out without following a planted link ------------------


@pytest.mark.parametrize("planted", ["host", "host/nohz"])
def test_a_link_planted_below_the_traces_directory_is_refused_and_nothing_lands_outside(tmp_path, planted):
    traces, elsewhere = tmp_path / "traces", tmp_path / "elsewhere"
    elsewhere.mkdir()
    (traces / planted).parent.mkdir(parents=True, exist_ok=True)
    (traces / planted).symlink_to(elsewhere)
    with pytest.raises(
        BundleError, match=f"traces/{planted}: a symbolic link, not a directory; ticklab does not write through links"
    ):
        BundleWriter(traces, "host", "nohz", "ftq", definition={}, host={}, when=WHEN)
    assert list(elsewhere.iterdir()) == []


def test_every_bundle_file_is_written_below_the_bundle_directory_it_made(tmp_path):
    writer = BundleWriter(tmp_path / "traces", "host", "nohz", "ftq", definition={}, host={}, when=WHEN)
    # a link swapped in for the bundle directory after it was made: writes go on into the directory made
    made = writer.path
    made.rename(tmp_path / "moved")
    made.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (tmp_path / "elsewhere").mkdir()
    writer.run_dir("run-001")
    writer.add_run({"run": "run-001", "condition": "c"}, [{"metric": "m", "value": 1.0, "unit": "u"}])
    assert list((tmp_path / "elsewhere").iterdir()) == []
    assert sorted(p.name for p in (tmp_path / "moved").iterdir()) == ["manifest.json", "raw", "results.csv"]
    assert (tmp_path / "moved" / "results.csv").read_text().splitlines() == [
        "run,condition,metric,value,unit",
        "run-001,c,m,1.0,u",
    ]


# -- issue 43 part 4: a manifest is read typed everywhere; only bundle.py sees its JSON ------------------------------

_READS = {"get", "setdefault", "pop", "items", "keys", "values"}  # a dict's ways in


def _names_manifest(node) -> bool:
    """``manifest``, ``x.manifest``, ``old_manifest``, ``x.manifest.details`` or ``x.manifest.to_json()``."""
    if isinstance(node, ast.Call):
        return isinstance(node.func, ast.Attribute) and node.func.attr == "to_json" and _names_manifest(node.func.value)
    if isinstance(node, ast.Attribute) and node.attr == "details":
        return _names_manifest(node.value)
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return name.lower() == "manifest" or name.lower().endswith("_manifest")


def raw_manifest_reads(source: str) -> list[str]:
    """Each ``...manifest[...]`` and ``...manifest.get(...)`` (or another dict method) in ``source``, as its line."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Subscript):
            hit = _names_manifest(node.value)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            hit = node.func.attr in _READS and _names_manifest(node.func.value)
        else:
            hit = False
        if hit:
            found.append(f"{node.lineno}: {ast.get_source_segment(source, node)}")
    return found


def test_the_raw_manifest_read_finder_finds_each_form_and_leaves_typed_reads_alone():
    planted = """
a = bundle.manifest["runs"]
b = manifest.get("host_id")
c = manifest["claim"]
d = ref.load().manifest.get("not_testable", "")
e = writer.manifest.details["boot_plan"]
f = bundle.manifest.to_json()["files"]
g = old_manifest["status"]
h = [k for k in manifest.keys()]
"""
    assert [line.split(":")[0] for line in raw_manifest_reads(planted)] == ["2", "3", "4", "5", "6", "7", "8", "9"]
    typed = """
a = bundle.manifest.runs[0].details["boot"]
b = manifest.host_fact("nproc") or manifest.conditions_by_name.get("hz250")
c = (writer.manifest.stopping or {})["reason"]
d = manifests[0]
e = manifest_bytes[:10]
"""
    assert raw_manifest_reads(typed) == []


def test_no_module_but_bundle_py_reads_a_manifest_as_a_dict():
    import ticklab

    package = Path(ticklab.__file__).parent
    sources = sorted(p for p in package.rglob("*.py") if p != package / "bundle.py")
    assert len(sources) > 50
    reads = {str(p.relative_to(package)): raw_manifest_reads(p.read_text()) for p in sources}
    assert {path: lines for path, lines in reads.items() if lines} == {}, (
        "read the typed Manifest (bundle.Manifest's fields and accessors) instead"
    )
