"""read_hpet's share of perf samples in lab guests (runners/hpet/guest-clock-profile.yaml): the guest image's perf,
the profiling helper (ticklab.capture.perfprofile), the report parser and the tables of claims/hpet.py."""

from __future__ import annotations

import os
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from conftest import REPO
from ticklab.analysis.captured import find_bundles
from ticklab.analysis.published import load_published
from ticklab.bundle import BundleWriter, load_bundle
from ticklab.capture import perfprofile
from ticklab.capture.experiment import load_experiment
from ticklab.claims import hpet
from ticklab.lab import image as guest_image
from ticklab.lab import kernel as lab_kernel
from ticklab.lab import qemu
from ticklab.lab.cache import LabError
from ticklab.trace import rawfile

pytestmark = pytest.mark.xdist_group("guests")

DATA = Path(__file__).parent / "data" / "hpet"
WHEN = datetime(2026, 11, 27, 3, 0, 0, tzinfo=UTC)
EXPERIMENT = REPO / "runners" / "hpet" / "guest-clock-profile.yaml"


def test_the_guest_perf_report_parser_reads_every_symbol_line_of_a_real_guest_report():
    # cut from a guest's report (hpet-no-sharing-4vcpu, run-005 of the committed guest-clock-profile bundle)
    report = (DATA / "guest-perf-report.txt").read_text()
    shares = hpet.symbol_shares(report)
    assert shares == {
        "smp_call_function_many_cond": 68.78,
        "pv_native_safe_halt": 12.86,
        "ktime_get_ts64": 2.14,
        "__vdso_clock_gettime": 2.06,
        "do_syscall_64": 1.61,
        "__x64_sys_clock_gettime": 0.42,
        "read_hpet": 0.26,
    }
    assert hpet.recorded_samples((DATA / "guest-perf-record.stderr.txt").read_text()) == 3780
    assert hpet.recorded_samples("perf: no samples\n") is None
    # other sort keys put columns before the symbol; a symbol listed twice is summed
    assert hpet.symbol_shares(
        "    4.50%  clockbench  [kernel.kallsyms]  [k] read_hpet\n"
        "    1.00%  swapper     [kernel.kallsyms]  [k] read_hpet\n"
    ) == {"read_hpet": 5.5}
    assert hpet.symbol_shares("# Samples: 0\n#\n") == {}


def test_the_image_recipe_carries_perf_and_its_package():
    recipe = guest_image.recipe()
    assert "/usr/bin/perf" in recipe["programs"]
    assert "linux-perf" in guest_image.packages(recipe)


@pytest.mark.skipif(not Path("/usr/bin/perf").is_file(), reason="/usr/bin/perf absent: apt-get install linux-perf")
def test_the_image_builder_takes_perfs_shared_libraries():
    perf = Path("/usr/bin/perf")
    if perf.read_bytes()[:4] != b"\x7fELF":
        pytest.skip("/usr/bin/perf is not an ELF here (a wrapper script): the image needs the real binary")
    libraries = guest_image.shared_libraries(perf)
    names = {Path(path).name for path in libraries}
    assert {"libc.so.6", "libelf.so.1", "libdw.so.1"} <= names, names
    assert all(Path(path).is_file() for path in libraries)


def test_the_experiment_profiles_every_run_with_one_argv_and_no_shell():
    experiment = load_experiment(EXPERIMENT)
    assert experiment.claim == "hpet" and experiment.lab is not None
    names = [c["name"] for c in yaml.safe_load(EXPERIMENT.read_text())["conditions"]]
    assert names == ["hpet-no-sharing-2vcpu", "hpet-sharing-2vcpu", "hpet-no-sharing-4vcpu", "hpet-sharing-4vcpu"]
    [extra] = experiment.extras
    assert extra["name"] == hpet.GUEST_PROFILE_EXTRA and extra["per_run"] is True
    assert extra["argv"][:3] == ["python3.11", "-m", "ticklab.capture.perfprofile"]
    assert "sh" not in extra["argv"] and "-c" not in extra["argv"][: extra["argv"].index("--")]
    assert perfprofile.record_argv(["clockbench", "-t", "2"], "cpu-clock") == [
        "perf",
        "record",
        "-a",
        "-e",
        "cpu-clock",
        "-o",
        "perf.data",
        "--",
        "clockbench",
        "-t",
        "2",
    ]
    assert perfprofile.report_argv(0.1) == [
        "perf",
        "report",
        "-i",
        "perf.data",
        "--stdio",
        "--no-children",
        "--sort",
        "sym",
        "--percent-limit",
        "0.1",
    ]


def test_the_profiler_keeps_the_report_and_removes_perf_data(tmp_path):
    """With a stand-in perf that records its arguments: the steps, their order, and what is left."""
    fake = tmp_path / "perf"
    fake.write_text(
        "#!/usr/bin/env python3\n"
        "import sys, pathlib\n"
        "log = pathlib.Path('calls.txt'); log.write_text(log.read_text() + ' '.join(sys.argv[1:]) + '\\n'"
        " if log.exists() else ' '.join(sys.argv[1:]) + '\\n')\n"
        "if sys.argv[1] == 'record':\n"
        "    pathlib.Path('perf.data').write_bytes(b'x' * 1000); sys.exit(0)\n"
        "print('    0.26%  [k] read_hpet')\n"
    )
    fake.chmod(0o755)
    status = perfprofile.profile(["true"], tmp_path, perf=str(fake))
    assert status == 0
    assert (tmp_path / "calls.txt").read_text().splitlines() == [
        "record -a -e cpu-clock -o perf.data -- true",
        "report -i perf.data --stdio --no-children --sort sym --percent-limit 0.1",
    ]
    assert hpet.symbol_shares((tmp_path / "perf-report.txt").read_text()) == {"read_hpet": 0.26}
    assert not (tmp_path / "perf.data").exists()
    # a record that writes nothing is a failure, and there is no report
    (tmp_path / "calls.txt").unlink()
    (tmp_path / "perf-report.txt").unlink()
    fake.write_text("#!/bin/sh\nexit 3\n")
    assert perfprofile.profile(["true"], tmp_path, perf=str(fake)) == 3
    assert not (tmp_path / "perf-report.txt").exists()


def _profile_bundle(traces: Path, shares: dict[str, list[float | None]]) -> Path:
    """A sealed guest-clock-profile bundle whose runs' perf reports list read_hpet at the given shares (None: not
    listed, under the report's limit)."""
    writer = BundleWriter(
        traces, "guest-tcg-test", "hpet", "guest-clock-profile", definition={"name": "x"}, host={"nproc": 2}, when=WHEN
    )
    writer.manifest.conditions = [
        {"name": f"{clock}-{vcpus}vcpu", "clock": clock, "vcpus": vcpus, "boot": "clocksource=hpet"}
        for clock, vcpus in (("hpet-no-sharing", 2), ("hpet-sharing", 2))
    ]
    index = 0
    for condition, values in shares.items():
        for share in values:
            index += 1
            run = f"run-{index:03d}"
            directory = writer.run_dir(run) / "perf-profile"
            directory.mkdir()
            lines = ["# Samples: 1K of event 'cpu-clock'", "    50.00%  [k] ktime_get_ts64"]
            if share is not None:
                lines.append(f"    {share:.2f}%  [k] read_hpet")
            (directory / "perf-report.txt").write_text("\n".join(lines) + "\n")
            (directory / "stderr.txt").write_text(
                f"[ perf record: Captured and wrote 0.2 MB perf.data ({1000 + index} samples) ]\n"
            )
            extra = {
                "name": "perf-profile",
                "directory": f"{run}/perf-profile",
                "status": "ok",
                "exit_status": 0,
                "argv": ["python3.11", "-m", "ticklab.capture.perfprofile", "--percent-limit", "0.1", "--", "cb"],
            }
            # the facts the condition checks read (a run whose check cannot be computed enters nothing: issue 44)
            guest = {
                "clocksource": "hpet",
                "switches": {"hpet_read_share": "N" if condition.startswith("hpet-no-sharing") else "Y"},
            }
            writer.add_run(
                {
                    "run": run,
                    "condition": condition,
                    "order": index,
                    "exit_status": 0,
                    "status": "ok",
                    "extras": [extra],
                    "guest": guest,
                },
                [{"metric": "reads_per_s_total", "value": 1000.0, "unit": "1/s"}],
            )
    return writer.seal()


def test_the_share_table_gives_median_range_and_n_per_condition_and_the_ratio_beside_the_source(tmp_path):
    _profile_bundle(tmp_path, {"hpet-no-sharing-2vcpu": [4.0, 2.0, 3.0], "hpet-sharing-2vcpu": [1.5, None, 1.0]})
    runs = hpet.guest_profile_runs(find_bundles(tmp_path, "hpet"), hpet.CHECKS)
    assert len(runs) == 6 and runs["samples"].tolist() == [1001, 1002, 1003, 1004, 1005, 1006]
    table = hpet.guest_profile_table(runs).set_index("condition")
    off, on = table.loc["hpet-no-sharing-2vcpu"], table.loc["hpet-sharing-2vcpu"]
    assert (off["n runs"], off["read_hpet, % of samples (median)"], off["read_hpet min"], off["read_hpet max"]) == (
        3,
        3.0,
        2.0,
        4.0,
    )
    assert (on["read_hpet, % of samples (median)"], on["read_hpet min"], on["read_hpet max"]) == (1.0, 0.0, 1.5)
    assert on["runs with read_hpet under the report's limit"] == 1 and on["read sharing"] == "on"
    assert off["clock-reading functions, % (median)"] == 53.0  # ktime_get_ts64 50 + read_hpet 3
    beside = hpet.read_hpet_beside_source(load_published(REPO / "traces" / "published", "hpet"), runs)
    rows = beside.reset_index().to_dict("records")
    assert rows[0]["read_hpet w/o sharing (%)"] == "4.99%" and rows[0]["with / w/o"] == "0.283"
    assert rows[1]["read_hpet w/o sharing (%)"] == "more than 34%" and rows[1]["with / w/o"] == "< 0.087"
    assert rows[2]["where"].startswith("lab analogue, 2 vCPUs") and rows[2]["where"].endswith("guest-tcg-test")
    assert rows[2]["read_hpet w/o sharing (%)"] == "3 [2–4], n = 3"
    assert rows[2]["read_hpet with sharing (%)"] == "1 [0–1.5], n = 3 (1 under the report's 0.1% limit, counted as 0)"
    assert rows[2]["with / w/o"] == "0.333"


def test_without_profiles_the_table_holds_the_source_rows_only(tmp_path):
    runs = hpet.guest_profile_runs(find_bundles(tmp_path, "hpet"), hpet.CHECKS)
    assert runs.empty
    beside = hpet.read_hpet_beside_source(load_published(REPO / "traces" / "published", "hpet"), runs)
    assert len(beside) == 2 and all(where.startswith("seed 000") for where in beside.index)


def _cached_kernel(variant):
    try:
        return lab_kernel.cached_kernel(variant)
    except LabError:
        return None


def _why_no_guest() -> str:
    if os.geteuid() != 0 or qemu.qemu_version() is None:
        return "needs root and qemu-system-x86"
    if not _cached_kernel("hz1000"):
        return "lab kernel hz1000 not built (ticklab lab build-kernel --variant hz1000)"
    missing = guest_image.missing_programs()
    if missing:
        return f"the guest image needs {', '.join(missing)}"
    if not (REPO / "tools" / "bin" / "clockbench").exists():
        return "tools not built: run 'make tools'"
    return ""


@pytest.mark.slow
@pytest.mark.skipif(bool(_why_no_guest()), reason=_why_no_guest() or "ready")
def test_perf_profiles_a_tcg_guest_and_resolves_read_hpet(tmp_path, monkeypatch):
    from ticklab.lab.run import LabOptions, lab_run

    definition = yaml.safe_load(EXPERIMENT.read_text())
    definition["conditions"] = [c for c in definition["conditions"] if c["name"] == "hpet-no-sharing-2vcpu"]
    definition["name"] = "guest-clock-profile-short"
    argv = definition["extras"][0]["argv"]
    argv[argv.index("--percent-limit") + 1] = "0"  # every symbol listed: read_hpet's line is there however small
    path = tmp_path / "guest-clock-profile-short.yaml"
    path.write_text(yaml.safe_dump(definition, sort_keys=False))
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    [bundle_path] = lab_run(
        "hpet",
        LabOptions(runs=1, warmup=0, out=tmp_path / "traces", accel="tcg", progress=False),
        experiment_path=path,
        log=lambda m: None,
    )
    bundle = load_bundle(bundle_path)
    [record] = bundle.manifest.runs
    assert record.status == "ok" and not record.problem, record
    assert record.guest["clocksource"] == "hpet"
    [extra] = record.extras
    assert extra["status"] == "ok" and extra["exit_status"] == 0, extra
    directory = bundle_path / "raw" / extra["directory"]
    assert not (directory / "perf.data").exists() and not (directory / "perf.data.xz").exists()
    report = rawfile.read_text(directory / "perf-report.txt")  # sealed: xz'd when 64 KiB or more
    assert "of event 'cpu-clock'" in report
    shares = hpet.symbol_shares(report)
    # kernel symbols resolve from the guest's /proc/kallsyms: clock reads go through the system call to read_hpet
    assert shares.get("read_hpet", 0) > 0 and shares.get("__x64_sys_clock_gettime", 0) > 0, shares
    assert hpet.recorded_samples((directory / "stderr.txt").read_text()) > 0
    assert not list(temp.iterdir())
