"""The per-bundle cache of what the analysis derives from raw files (analysis/derived.py, issue 42 item 1): a hit is
exactly what a recomputation gives; a changed seal or code version misses; a corrupt entry is recomputed; a link at an
entry's name is refused, never written through; nothing of an unsealed bundle, or of a bundle whose raw files differ
from its manifest, is cached."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from ticklab import paths
from ticklab.analysis import derived
from ticklab.analysis.captured import BundleRef
from ticklab.bundle import SEAL, add_manifest_seal
from ticklab.claims import nohz

SMALL = Path("intel-xeon-2c-6.18.44-fc-v657-vm/hrtick/20261122T032231Z-hackbench")  # sealed, 20 kB
NOHZ_FTQ = Path("intel-xeon-2c-6.18.44-fc-v669-vm/nohz/20261122T215204Z-ftq")  # sealed, 3 MB, FTQ and osnoise
NOHZ_GAPDET = Path("amd-epyc-2c-6.18.44-fc-v595-vm/nohz/20261126T195227Z-ftq")  # sealed, 6 MB, gapdet with its traces
MODULES = ("claims/nohz.py",)


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch) -> Path:
    """An empty cache of the test's own, and no results kept in this process from other tests."""
    monkeypatch.setenv("TICKLAB_CACHE", str(tmp_path / "cache"))
    clear_process_caches()
    yield tmp_path / "cache"
    clear_process_caches()


def clear_process_caches() -> None:
    """What nohz keeps per process, as a new process starts without it."""
    for kept in (nohz._measured_ftq, nohz._ftq_check_values, nohz._ftq_run_cost):
        kept.cache_clear()


def copied(bundle: Path, tmp_path: Path, name: str = "copy") -> Path:
    target = tmp_path / name / bundle
    shutil.copytree(paths.traces_dir() / bundle, target)
    return target


def ref_of(path: Path) -> BundleRef:
    return BundleRef(host_id=path.parents[1].name, claim=path.parent.name, path=path)


def entries(cache: Path) -> list[Path]:
    return sorted(p for p in (cache / "derived").rglob("*") if p.is_file() or p.is_symlink())


class Counted:
    """A computation that says how often it ran."""

    def __init__(self, value):
        self.value, self.calls = value, 0

    def __call__(self):
        self.calls += 1
        return self.value


@pytest.mark.slow  # ~2 s quiet, more on a busy machine: 11 runs' FTQ quanta, gap detector output and traces parsed
def test_a_hit_is_exactly_the_recomputation_of_a_real_nohz_bundle(cache, monkeypatch):
    from ticklab.analysis.comparisons import measured_runs

    refs = [ref_of(paths.traces_dir() / NOHZ_GAPDET)]
    runs, _ = measured_runs(refs, nohz.CHECKS, "nohz")
    cold = nohz.tick_cost_runs(runs, refs)
    noise_cold = nohz.ftq_vs_osnoise(refs)
    samples_cold = nohz.fresh_ftq(refs)
    kinds = {p.parent.name for p in entries(cache)}
    assert {"ftq-measured", "ftq-tick-cost", "gapdet-columns", "gapdet-cost", "ftq-fresh"} <= kinds, kinds
    assert cold["matched_tick_us_median"].notna().any() and cold["ftq_tick_us_median"].notna().any()

    # warm, in a fresh process's state: nothing is read or parsed again
    clear_process_caches()

    def parsed(*args, **kwargs):
        raise AssertionError("a raw file was parsed again on a warm cache")

    for name in ("read_ftq", "read_gapdet", "read_trace"):
        monkeypatch.setattr(nohz, name, parsed)
    warm_runs, _ = measured_runs([ref_of(paths.traces_dir() / NOHZ_GAPDET)], nohz.CHECKS, "nohz")
    pd.testing.assert_frame_equal(warm_runs, runs, check_exact=True)
    warm = nohz.tick_cost_runs(warm_runs, refs)
    pd.testing.assert_frame_equal(warm, cold, check_exact=True)
    pd.testing.assert_frame_equal(nohz.ftq_vs_osnoise(refs), noise_cold, check_exact=True)
    pd.testing.assert_frame_equal(nohz.fresh_ftq(refs), samples_cold, check_exact=True)
    assert [type(v) for v in warm.iloc[0]] == [type(v) for v in cold.iloc[0]]


def test_the_condition_checks_read_the_same_header_and_share_through_the_cache(cache):
    from ticklab.capture.workloads import read_ftq

    raw = paths.traces_dir() / NOHZ_FTQ / "raw" / "run-003"
    header, samples = read_ftq(raw / "ftq.dat")
    expected = float((samples.loc[~samples["warmup"], "count"] == 0).mean())
    assert nohz.ftq_header(raw) == header and nohz.ftq_starved_share(raw) == expected
    clear_process_caches()
    assert [p.parent.name for p in entries(cache)] == ["ftq-checks", "ftq-measured"]
    assert nohz.ftq_header(raw) == header and nohz.ftq_starved_share(raw) == expected
    assert type(nohz.ftq_starved_share(raw)) is float
    measured = nohz._measured_ftq(str(raw / "ftq.dat"))[1]
    pd.testing.assert_frame_equal(measured, samples[~samples["warmup"]], check_exact=True, check_index_type=True)


def test_values_come_back_with_their_types():
    value = {
        "nan": float("nan"),
        "inf": -float("inf"),
        "n": np.int64(3),
        "f": np.float64(0.1),
        "b": np.bool_(True),
        "none": None,
        "text": "µs",
        "nested": [1, (2.5, "x"), {"k": False}],
        "big": 2**70,
    }
    again = derived._load_json(derived._dump_json({"k": 1}, value), {"k": 1})
    assert derived._same(value, again)
    assert type(again["n"]) is np.int64 and type(again["nested"][1]) is tuple and np.isnan(again["nan"])
    assert b"NaN" not in derived._dump_json({}, value)  # a safe encoding: strict JSON, NaN tagged
    with pytest.raises(TypeError):
        derived._encode({"a set": {1}})


def test_a_value_that_cannot_be_stored_is_returned_uncached(cache, tmp_path):
    ref = ref_of(copied(SMALL, tmp_path))
    compute = Counted({"a set": {1, 2}})
    assert derived.per_run(ref, "test-kind", MODULES, "run-001", {}, compute) == {"a set": {1, 2}}
    assert derived.per_run(ref, "test-kind", MODULES, "run-001", {}, compute) == {"a set": {1, 2}}
    assert compute.calls == 2 and entries(cache) == []


def test_a_frame_and_its_meta_come_back_exactly(cache, tmp_path):
    ref = ref_of(copied(SMALL, tmp_path))
    frame = pd.DataFrame(
        {
            "a": np.arange(5, dtype=np.int64),
            "b": [0.5, np.nan, 1.0, 2.0, 3.0],
            "c": list("vwxyz"),
            "d": [True, False, True, True, False],
        }
    ).iloc[1:]
    compute = Counted(({"quantum_ns": "1000"}, frame))
    first = derived.per_run(ref, "frames", MODULES, "run-001", {"p": 1}, compute, frame=True)
    second = derived.per_run(ref, "frames", MODULES, "run-001", {"p": 1}, compute, frame=True)
    assert compute.calls == 1 and first is compute.value
    assert second[0] == {"quantum_ns": "1000"}
    pd.testing.assert_frame_equal(second[1], frame, check_exact=True, check_index_type=True)


def test_a_changed_seal_misses_and_a_copy_of_the_same_bundle_hits(cache, tmp_path):
    path = copied(SMALL, tmp_path)
    compute = Counted({"x": 1.5})
    derived.per_run(ref_of(path), "k", MODULES, "run-001", {}, compute)
    derived.per_run(ref_of(copied(SMALL, tmp_path, "elsewhere")), "k", MODULES, "run-001", {}, compute)
    assert compute.calls == 1  # keyed by the seal's content, not the bundle's path

    manifest = json.loads((path / "manifest.json").read_text())
    manifest["definition"]["description"] = manifest["definition"].get("description", "") + " (edited)"
    (path / "manifest.json").chmod(0o644)
    (path / "manifest.json").write_text(json.dumps(manifest))
    (path / SEAL).unlink()
    add_manifest_seal(path)  # sealed again over the edit: a new seal
    assert derived.per_run(ref_of(path), "k", MODULES, "run-001", {}, compute) == {"x": 1.5}
    assert compute.calls == 2 and len(entries(cache)) == 2
    assert derived.per_run(ref_of(path), "k", MODULES, "run-001", {}, compute) == {"x": 1.5} and compute.calls == 2


def test_another_run_kind_or_params_misses(cache, tmp_path):
    ref = ref_of(copied(SMALL, tmp_path))
    compute = Counted([1, 2])
    for run, kind, params in [
        ("run-001", "k", {}),
        ("run-002", "k", {}),
        ("run-001", "j", {}),
        ("run-001", "k", {"period_ns": 1_000_000}),
        ("run-001", "k", {"period_ns": None}),
    ]:
        derived.per_run(ref, kind, MODULES, run, params, compute)
    assert compute.calls == 5 and len(entries(cache)) == 5


def test_a_changed_code_version_misses(cache, tmp_path, monkeypatch):
    ref = ref_of(copied(SMALL, tmp_path))
    compute = Counted({"x": 1})
    derived.per_run(ref, "k", MODULES, "run-001", {}, compute)
    derived.per_run(ref, "k", MODULES, "run-001", {}, compute)
    assert compute.calls == 1
    monkeypatch.setattr(derived, "code_version", lambda modules: "a-new-version")
    derived.per_run(ref, "k", MODULES, "run-001", {}, compute)
    assert compute.calls == 2


def test_the_code_version_hashes_the_named_sources(tmp_path, monkeypatch):
    package = tmp_path / "ticklab"
    (package / "trace").mkdir(parents=True)
    (package / "trace" / "tickcost.py").write_text("A = 1\n")
    (package / "trace" / "_ringbuf.c").write_text("int a;\n")
    (package / "claims").mkdir()
    (package / "claims" / "nohz.py").write_text("B = 1\n")
    monkeypatch.setattr(derived, "PACKAGE_DIR", package)
    derived.code_version.cache_clear()
    try:
        before = derived.code_version(("trace/", "claims/nohz.py"))
        assert derived.code_version(("claims/nohz.py",)) != before
        (package / "trace" / "_ringbuf.c").write_text("int b;\n")
        derived.code_version.cache_clear()
        assert derived.code_version(("trace/", "claims/nohz.py")) != before
        with pytest.raises(ValueError):
            derived.code_version(("trace/missing.py",))
    finally:
        derived.code_version.cache_clear()


@pytest.mark.parametrize("damage", [b"", b"{not json", b'{"key": {}, "value": 1}', b"PAR1 garbage"])
def test_a_corrupt_entry_is_recomputed_and_replaced(cache, tmp_path, damage):
    ref = ref_of(copied(SMALL, tmp_path))
    compute = Counted({"x": [1.0, float("nan")]})
    derived.per_run(ref, "k", MODULES, "run-001", {}, compute)
    [entry] = entries(cache)
    entry.write_bytes(damage)
    again = derived.per_run(ref, "k", MODULES, "run-001", {}, compute)
    assert compute.calls == 2 and derived._same(again, compute.value)
    assert entries(cache) == [entry] and entry.read_bytes() != damage
    derived.per_run(ref, "k", MODULES, "run-001", {}, compute)
    assert compute.calls == 2


def test_an_entry_others_may_write_is_not_read(cache, tmp_path):
    ref = ref_of(copied(SMALL, tmp_path))
    compute = Counted({"x": 1})
    derived.per_run(ref, "k", MODULES, "run-001", {}, compute)
    [entry] = entries(cache)
    entry.chmod(0o666)
    derived.per_run(ref, "k", MODULES, "run-001", {}, compute)
    assert compute.calls == 2 and entry.stat().st_mode & 0o022 == 0  # replaced by one of ours


def test_a_link_at_an_entry_is_refused_never_written_through(cache, tmp_path):
    ref = ref_of(copied(SMALL, tmp_path))
    compute = Counted({"x": 2})
    derived.per_run(ref, "k", MODULES, "run-001", {}, compute)
    [entry] = entries(cache)
    precious = tmp_path / "precious.json"
    kept = entry.read_bytes()
    precious.write_bytes(kept)  # a valid entry elsewhere: not read through the link either
    entry.unlink()
    entry.symlink_to(precious)
    assert derived.per_run(ref, "k", MODULES, "run-001", {}, compute) == {"x": 2}
    assert compute.calls == 2 and entry.is_symlink() and precious.read_bytes() == kept
    assert os.readlink(entry) == str(precious) and len(entries(cache)) == 1

    # a link in place of the bundle's folder in the cache: nothing is written where it points
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    folder = entry.parent.parent
    shutil.rmtree(folder)
    folder.symlink_to(elsewhere)
    assert derived.per_run(ref, "k", MODULES, "run-001", {}, compute) == {"x": 2}
    assert compute.calls == 3 and list(elsewhere.iterdir()) == []


def test_a_link_at_the_cache_folder_is_not_followed(cache, tmp_path):
    ref = ref_of(copied(SMALL, tmp_path))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    cache.mkdir()
    (cache / "derived").symlink_to(elsewhere)
    compute = Counted({"x": 3})
    assert derived.per_run(ref, "k", MODULES, "run-001", {}, compute) == {"x": 3}
    assert derived.per_run(ref, "k", MODULES, "run-001", {}, compute) == {"x": 3}
    assert compute.calls == 2 and list(elsewhere.iterdir()) == []


def test_an_unsealed_bundle_is_never_cached(cache, tmp_path):
    path = copied(SMALL, tmp_path)
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["status"] = "incomplete"
    manifest.pop("sealed", None)
    (path / "manifest.json").chmod(0o644)
    (path / "manifest.json").write_text(json.dumps(manifest))
    (path / SEAL).unlink()
    ref = ref_of(path)
    assert not ref.load(allow_incomplete=True).sealed
    compute = Counted({"x": 4})
    for _ in range(2):
        assert derived.per_run(ref, "k", MODULES, "run-001", {}, compute) == {"x": 4}
    assert derived.seal_key(path, ["results.csv"]) is None
    assert compute.calls == 2 and entries(cache) == []


def test_a_bundle_that_does_not_load_is_never_cached(cache, tmp_path):
    path = copied(SMALL, tmp_path)
    (path / "results.csv").chmod(0o644)
    with (path / "results.csv").open("a") as handle:
        handle.write("\n")  # sha256 differs from the manifest: the bundle does not load
    compute = Counted({"x": 5})
    derived.per_run(ref_of(path), "k", MODULES, "run-001", {}, compute)
    derived.per_run(path, "k", MODULES, "run-001", {}, compute, inputs=["results.csv"])
    assert compute.calls == 2 and entries(cache) == []


def test_a_run_file_whose_bytes_differ_from_the_manifest_is_not_cached(cache, tmp_path):
    path = copied(NOHZ_FTQ, tmp_path)
    raw = path / "raw" / "run-003"
    assert derived.seal_key(path, ["raw/run-003/ftq.dat", "raw/run-003/trace"]) is not None
    nohz.ftq_header(raw)
    assert len(entries(cache)) == 2
    clear_process_caches()
    packed = raw / "ftq.dat.xz"
    packed.chmod(0o644)
    shutil.copyfile(path / "raw" / "run-004" / "ftq.dat.xz", packed)  # another run's quanta under this run's name
    assert derived.seal_key(path, ["raw/run-003/ftq.dat"]) is None
    from ticklab.capture.workloads import read_ftq

    assert nohz.ftq_header(raw) == read_ftq(packed.with_suffix(""))[0]  # read from the file, not the cache
    assert len(entries(cache)) == 2

    # a file added to a folder the computation reads, or an input that is not there
    (raw / "trace" / "extra").write_text("x")
    assert derived.seal_key(path, ["raw/run-005/trace"]) is not None
    assert derived.seal_key(path, ["raw/run-003/trace"]) is None
    assert derived.seal_key(path, ["raw/run-005/nothing.txt"]) is not None  # absent and listed nowhere
    assert derived.seal_key(path, ["../elsewhere"]) is None


def test_a_path_outside_a_bundle_is_computed_uncached(cache, tmp_path):
    from ticklab.capture.workloads import read_ftq

    source = paths.traces_dir() / NOHZ_FTQ / "raw" / "run-003" / "ftq.dat.xz"
    shutil.copyfile(source, tmp_path / "ftq.dat.xz")
    assert nohz.ftq_header(tmp_path) == read_ftq(source.with_suffix(""))[0]
    assert entries(cache) == []


def test_a_kind_is_a_plain_name(tmp_path):
    with pytest.raises(ValueError):
        derived.per_run(ref_of(paths.traces_dir() / SMALL), "../up", MODULES, None, {}, lambda: 1)
