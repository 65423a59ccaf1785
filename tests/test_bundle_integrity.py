"""The seal covers everything (issue 14, defects 3 and 6): manifest.json itself, file entries confined to the
bundle, regular files only, bounded verification, and no foreign exception out of load_bundle."""

import hashlib
import json
import os
import subprocess
import sys

import pytest

from conftest import REPO
from test_bundle import make_bundle
from ticklab.bundle import SEAL, BundleError, add_manifest_seal, load_bundle
from ticklab.lab.run import copy_from_share


def _rewrite(path, edit, *, reseal_files=False):
    """Edit a sealed manifest in place as an attacker would (optionally fixing the files' checksums too)."""
    manifest = path / "manifest.json"
    manifest.chmod(0o644)
    data = json.loads(manifest.read_text())
    edit(data)
    manifest.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def _verify(*paths):
    return subprocess.run(
        [sys.executable, "-m", "ticklab.cli", "verify", *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )  # a bound for a hung run only (a loaded host is slow)


@pytest.mark.slow
def test_one_changed_byte_of_the_manifest_fails_verify_naming_it(tmp_path):
    path = make_bundle(tmp_path)
    manifest = path / "manifest.json"
    manifest.chmod(0o644)
    text = manifest.read_text()
    manifest.write_text(text.replace('"exit_status": 0', '"exit_status": 1', 1))
    proc = _verify(path)
    assert proc.returncode == 1
    assert f"FAIL  {path}: {manifest}: sha256 differs from {SEAL} (manifest modified after sealing)" in proc.stdout


def test_the_seal_is_sha256sum_of_the_manifest(tmp_path):
    path = make_bundle(tmp_path)
    digest = hashlib.sha256((path / "manifest.json").read_bytes()).hexdigest()
    assert (path / SEAL).read_text() == f"{digest}  manifest.json\n"
    assert not (path / SEAL).stat().st_mode & 0o222


def test_a_deleted_seal_is_not_a_way_around_it(tmp_path):
    path = make_bundle(tmp_path)
    (path / SEAL).unlink()
    _rewrite(path, lambda d: d["runs"][0].update(status="failed"))
    with pytest.raises(BundleError, match=f"{SEAL}: missing, so nothing covers manifest.json"):
        load_bundle(path)


def test_a_sealed_bundle_edited_to_incomplete_is_tampered_not_incomplete(tmp_path):
    path = make_bundle(tmp_path)
    _rewrite(path, lambda d: d.update(status="incomplete"))
    with pytest.raises(BundleError, match="manifest.json: sha256 differs from manifest.sha256"):
        load_bundle(path, allow_incomplete=True)


def test_seal_manifest_adds_the_seal_only_to_an_intact_bundle(tmp_path):
    path = make_bundle(tmp_path)
    (path / SEAL).unlink()  # as a bundle sealed by an older ticklab
    assert add_manifest_seal(path) == path / SEAL
    load_bundle(path)
    with pytest.raises(BundleError, match="exists already"):
        add_manifest_seal(path)
    other = make_bundle(tmp_path / "b")
    (other / SEAL).unlink()
    (other / "raw/run-000/ftq.dat").chmod(0o644)
    (other / "raw/run-000/ftq.dat").write_text("changed\n")
    with pytest.raises(BundleError, match="ftq.dat: sha256 differs"):
        add_manifest_seal(other)
    assert not (other / SEAL).exists()


@pytest.mark.parametrize("entry", ["../outside.txt", "/etc/hostname", "raw/../../outside.txt", "./results.csv", ""])
def test_file_entries_outside_the_bundle_are_refused(tmp_path, entry):
    path = make_bundle(tmp_path / "t")
    (tmp_path / "t" / "outside.txt").write_text("x")
    _rewrite(path, lambda d: d["files"].update({entry: hashlib.sha256(b"x").hexdigest()}))
    with pytest.raises(BundleError, match=r"manifest\.json: files: key .* is not allowed here"):
        load_bundle(path, require_seal=False)


def test_symlinks_and_special_files_in_a_bundle_are_refused_without_reading_them(tmp_path):
    path = make_bundle(tmp_path)
    target = path / "raw/run-000/ftq.dat"
    target.unlink()
    target.symlink_to("/proc/self/pagemap")
    with pytest.raises(BundleError, match=r"raw/run-000/ftq\.dat: a symbolic link in the bundle"):
        load_bundle(path)
    target.unlink()
    os.mkfifo(target)  # opening it for reading would block for ever
    with pytest.raises(BundleError, match=r"raw/run-000/ftq\.dat: a FIFO in the bundle"):
        load_bundle(path)
    target.unlink()
    (path / "raw/run-000").rename(path / "raw/real")
    (path / "raw/run-000").symlink_to(path / "raw/real")
    with pytest.raises(BundleError, match=r"raw/run-000: a symbolic link in the bundle"):
        load_bundle(path)


def test_a_symlinked_manifest_is_refused(tmp_path):
    path = make_bundle(tmp_path)
    (path / "manifest.json").rename(tmp_path / "m.json")
    (path / "manifest.json").symlink_to("/proc/self/pagemap")
    with pytest.raises(BundleError, match=r"manifest\.json: is a symbolic link; ticklab does not read through links"):
        load_bundle(path)


@pytest.mark.parametrize(
    "content, message",
    [
        ("run,condition,metric,value,unit\nrun-000,a,m,nan,s\n", r"row 2: value: 'nan' is not of the allowed form"),
        ("run,condition,metric,value,unit\nrun-000,a,m,inf,s\n", r"row 2: value: 'inf' is not of the allowed form"),
        ("run,condition,metric,value,unit\nrun-000,a,m,1e999,s\n", r"row 2: value: '1e999' is not a finite number"),
        ("run,condition,metric,value,unit\nrun-000,a,m,fast,s\n", r"row 2: value: 'fast' is not of the allowed form"),
        ("run,condition,metric,value,unit\nrun-000,a,m,1\n", r"row 2: unit: '' is not|not a readable CSV|row 2"),
        (b"\xff\xfe\x00garbage", r"not a readable CSV"),
        ("", r"not a readable CSV"),
    ],
)
def test_non_finite_or_text_values_in_results_are_refused(tmp_path, content, message):
    path = make_bundle(tmp_path, seal=False)
    results = path / "results.csv"
    results.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(BundleError, match=r"results\.csv: .*" if "|" in message else r"results\.csv: " + message):
        load_bundle(path, allow_incomplete=True)


@pytest.mark.parametrize(
    "manifest",
    [
        b"\xff\xfe not utf-8",
        b"[" * 100000 + b"]" * 100000,
        b'{"schema_version": 1, "status": "sealed"}',
        b'{"schema_version": 1, "status": "sealed", "claim": "nohz", "experiment": "ftq", "definition": {}, '
        b'"host": {}, "runs": "many", "files": {}}',
        b"[]",
        b'"text"',
        b"1e999",
    ],
)
def test_no_foreign_exception_escapes_load_bundle(tmp_path, manifest):
    path = make_bundle(tmp_path)
    (path / "manifest.json").chmod(0o644)
    (path / "manifest.json").write_bytes(manifest)
    with pytest.raises(BundleError, match=r"manifest\.json: "):
        load_bundle(path)


def test_a_wrong_type_names_the_field(tmp_path):
    path = make_bundle(tmp_path)
    _rewrite(path, lambda d: d["runs"][1].update(warmup="yes"))
    with pytest.raises(BundleError, match=r"manifest\.json: runs\[1\]\.warmup: 'yes' is not of type boolean"):
        load_bundle(path, require_seal=False)


@pytest.mark.slow
def test_verify_checks_every_bundle_and_reports_each_bad_one(tmp_path):
    good = make_bundle(tmp_path / "good")
    bad = make_bundle(tmp_path / "bad")
    (bad / "manifest.json").chmod(0o644)
    (bad / "manifest.json").write_bytes(b"\xff\xfe")
    worse = make_bundle(tmp_path / "worse")
    (worse / "results.csv").chmod(0o644)
    (worse / "results.csv").write_text("run,condition,metric,value,unit\nrun-000,a,m,nan,s\n")
    proc = _verify(bad, good, worse)
    assert proc.returncode == 1
    lines = proc.stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["FAIL", "ok", "FAIL"], proc.stdout
    assert "not UTF-8" in lines[0] and "results.csv: sha256 differs" in lines[2]
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_the_shipped_bundles_verify_with_their_manifest_seals():
    proc = _verify(REPO / "traces")
    assert proc.returncode == 0, proc.stdout
    assert proc.stdout.count("ok    ") >= 9 and "FAIL" not in proc.stdout


def test_lab_results_are_copied_from_the_share_without_following_symlinks(tmp_path):
    share, run_dir = tmp_path / "share", tmp_path / "run"
    (share / "trace").mkdir(parents=True)
    (share / "stdout.txt").write_text("Time: 1.0\n")
    (share / "trace" / "trace.dat").write_bytes(b"tracing")
    (share / "secret").symlink_to("/etc/shadow")
    (share / "trace" / "dir").symlink_to("/etc")
    os.mkfifo(share / "fifo")
    skipped = copy_from_share(share, run_dir)
    assert sorted(skipped) == ["dir", "fifo", "secret"]
    assert sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*")) == ["stdout.txt", "trace", "trace/trace.dat"]
    assert not any(p.is_symlink() for p in run_dir.rglob("*"))


def test_a_bundle_whose_manifest_was_replaced_by_a_link_is_reported_not_skipped(tmp_path):
    """A bundle directory whose manifest.json is a dangling link (or gone) shows as unreadable in the report's
    bundle health, naming the file, instead of vanishing from the analysis."""
    from ticklab.analysis.captured import bundle_health, find_bundles

    data = tmp_path / "data"
    path = make_bundle(data)
    (path / "manifest.json").chmod(0o644)
    (path / "manifest.json").unlink()
    (path / "manifest.json").symlink_to(tmp_path / "nowhere")
    assert [ref.path for ref in find_bundles(data, "nohz")] == [path]
    health = bundle_health(data, ["nohz"])
    assert list(health["status"]) == ["unreadable"]
    assert "manifest.json" in health["flag"].iloc[0] and "symbolic link" in health["flag"].iloc[0]


# -- issue 27, item 12: results.csv rows cross-checked against the manifest's runs -----------------------------------


def _reseal_results(path, edit):
    """Edit a sealed bundle's results.csv and re-seal everything, as one who can write the bundle would."""
    from ticklab.bundle import MANIFEST

    results = path / "results.csv"
    for file in (results, path / MANIFEST, path / SEAL):
        file.chmod(0o644)
    lines = results.read_text().splitlines()
    results.write_text("\n".join(edit(lines)) + "\n")
    data = json.loads((path / MANIFEST).read_text())
    data["files"]["results.csv"] = hashlib.sha256(results.read_bytes()).hexdigest()
    (path / MANIFEST).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    (path / SEAL).write_text(hashlib.sha256((path / MANIFEST).read_bytes()).hexdigest() + "  manifest.json\n")


@pytest.mark.parametrize(
    "edit, message",
    [
        (
            lambda lines: [*lines, lines[1]],
            r"row 4: a second work_per_quantum_median row for run run-000 \(the first is row 2\)$",
        ),
        (
            lambda lines: [*lines, lines[1].replace("run-000", "run-007")],
            r"row 4: run run-007 is not a run of manifest\.json$",
        ),
        (
            lambda lines: [*lines[:2], lines[2].replace("hz1000", "hz250")],
            r"row 3: condition 'hz250' is not run run-001's condition in manifest\.json, 'hz1000'$",
        ),
    ],
)
@pytest.mark.slow
def test_issue27_resealed_results_rows_must_match_the_manifest(tmp_path, edit, message):
    """A re-sealed results.csv with a duplicated row, or a row for a run the manifest does not have, loaded fine."""
    path = make_bundle(tmp_path)
    _reseal_results(path, edit)
    with pytest.raises(BundleError, match=rf"^{path / 'results.csv'}: {message}"):
        load_bundle(path)
    proc = _verify(path)
    assert proc.returncode == 1 and proc.stdout.count("\n") == 1 and "results.csv: row" in proc.stdout


def test_issue27_a_results_row_of_a_warmup_run_is_refused(tmp_path):
    path = make_bundle(tmp_path, seal=False)
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["runs"][0]["warmup"] = True
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match=r"results\.csv: row 2: run run-000 is a warm-up run, which has no rows"):
        load_bundle(path, allow_incomplete=True)


def test_issue27_rows_of_a_run_with_a_problem_still_load(tmp_path):
    """The lab keeps the results of a run whose guest booted wrong beside its problem; analyses leave them out."""
    from ticklab.bundle import measured_results

    path = make_bundle(tmp_path, seal=False)
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["runs"][1]["problem"] = "booted HZ=250, asked for HZ=1000"
    (path / "manifest.json").write_text(json.dumps(manifest))
    bundle = load_bundle(path, allow_incomplete=True)
    assert list(measured_results(bundle.manifest, bundle.results)["run"]) == ["run-000"]
