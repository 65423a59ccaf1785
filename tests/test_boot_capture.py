"""`ticklab capture <claim> --boot kexec` end to end on a fake root (test_plan_engine's: fake kexec and systemctl log
their argv, a "reboot" is the test writing a new boot_id, release and /proc/cmdline): the capture opens the bundle
with the plan's order, each `ticklab plan resume` (a new process, as the unit runs it) makes the booted run into
the bundle with the boot it verified, a wrong boot is a failed run, and the bundle is sealed when the plan ends."""

import hashlib
import json
import lzma
import stat
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from test_plan_engine import ORIGINAL, RELEASE, calls, host, reboot, resume_in_a_new_process  # noqa: F401 (fixture)
from ticklab.bundle import load_bundle
from ticklab.host import plan_engine, plan_state

pytestmark = pytest.mark.slow

EXPERIMENT = """claim: nohz
name: host-boot-echo
description: Two command lines, one boot per run; the workload prints a hackbench-like time.
runs: 2
warmup: 0
seed: 11
requires: []
conditions:
  - {name: tick-on, kernel: running, boot: "-nohz_full"}
  - {name: nohz-full, kernel: running, boot: "nohz_full={last_cpu}"}
knobs:
  kernel: host_kernel
  boot: boot_cmdline
workload:
  tool: hackbench
  argv: ["sh", "-c", "echo Time: 1.0$$"]
"""


def capture_in_a_new_process(root, tmp_path, *extra, text=EXPERIMENT, out="traces", env=None):
    """`ticklab capture nohz --boot kexec` of ``text``, written to tmp_path/host-boot-echo.yaml, into tmp_path/out."""
    experiment = tmp_path / "host-boot-echo.yaml"
    experiment.write_text(text)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "ticklab.cli",
            "capture",
            "nohz",
            "--boot",
            "kexec",
            "--experiment",
            str(experiment),
            "--root",
            str(root),
            "--journal",
            str(tmp_path / "journal.json"),
            "--out",
            str(tmp_path / out),
            "--host-id",
            "fake-boots",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def start_capture(root, tmp_path, *extra, text=EXPERIMENT):
    done = capture_in_a_new_process(root, tmp_path, *extra, text=text)
    assert done.returncode == 0, done.stderr
    [plan_id] = [p.name for p in (root / "var/lib/ticklab/plans").iterdir()]
    return plan_state.load(root, plan_id)


def planned_runs_made_short_of_a_goal(root, tmp_path):
    """A capture whose planned runs are all made, with a precision goal no two runs can meet: the stopping rule must
    ask for one more run of each condition."""
    from ticklab.capture.boot_capture import BootCapture

    plan = start_capture(
        root, tmp_path, text=EXPERIMENT.replace("seed: 11", "seed: 11\nbudget: {time_s: 3600, max_runs: 3}")
    )
    plan.capture["goals"] = [
        {
            "comparison": "nohz-full vs tick-on",
            "metric": "runtime_s",
            "treatment": "nohz-full",
            "baseline": "tick-on",
            "statistic": "median",
            "target_log_half_width": 1e-9,
            "experiments": [],
        }
    ]
    plan.capture["runs_fixed"] = False
    maker = BootCapture(plan, root, log=lambda _: None)
    for number, run in enumerate(plan.runs, start=1):
        reboot(root, f"boot-{number}", run.cmdline)
        maker.make_run(run, {"boot_id": f"boot-{number}", "release": RELEASE, "cmdline": run.cmdline})
    return plan, maker


def test_a_boot_plan_makes_each_run_in_its_own_boot_into_one_sealed_bundle(host, tmp_path):
    root, log = host
    (root / f"boot/config-{RELEASE}").write_text(
        "CONFIG_HZ_300=y\nCONFIG_HZ=300\n"
    )  # the booted kernel's, read at each run
    # what `kernel build --host` installs beside a kernel it built (capture/hostkernel.write_build_record)
    build_log = b"  CC      kernel/time/clocksource.o\n"
    (root / f"lib/modules/{RELEASE}").mkdir(parents=True)
    (root / f"lib/modules/{RELEASE}/ticklab-build.log.xz").write_bytes(lzma.compress(build_log))
    build_record = {
        "built_by": "ticklab kernel build --host",
        "release": RELEASE,
        "config_sha256": "c" * 64,
        "build_log": "ticklab-build.log.xz",
        "build_log_sha256": hashlib.sha256(build_log).hexdigest(),
    }
    (root / f"lib/modules/{RELEASE}/ticklab-build.json").write_text(json.dumps(build_record))
    plan = start_capture(root, tmp_path)
    bundle_path = tmp_path / "traces" / "fake-boots" / "nohz"
    [bundle_path] = list(bundle_path.iterdir())
    assert plan.bundle == str(bundle_path)
    manifest = json.loads((bundle_path / "manifest.json").read_text())
    assert manifest["status"] == "incomplete" and [o["run"] for o in manifest["order"]] == [r.name for r in plan.runs]
    assert calls(log)[-1] == "systemctl --no-block kexec"
    for number, run in enumerate(plan.runs, start=1):
        reboot(root, f"boot-{number}", run.cmdline)
        done = resume_in_a_new_process(root)
        assert done.returncode == 0, done.stderr
    final = plan_state.load(root, plan.id)
    assert final.state == "finished" and [r.state for r in final.runs] == ["made"] * 4

    bundle = load_bundle(bundle_path)
    assert bundle.manifest.status == "sealed"
    runs = bundle.manifest.runs
    assert [r.run for r in runs] == [o["run"] for o in bundle.manifest.order]
    assert sorted(r.condition for r in runs) == ["nohz-full", "nohz-full", "tick-on", "tick-on"]
    assert [r.boot["boot_id"] for r in runs] == ["boot-1", "boot-2", "boot-3", "boot-4"]
    for record, planned in zip(runs, plan.runs, strict=False):
        assert record.boot["cmdline"] == planned.cmdline and record.status == "ok"
        assert ("nohz_full=1" in record.boot["cmdline"].split()) == (record.condition == "nohz-full")
        assert record.boot["kernel_release"] == RELEASE
        # what the run's checks hold the tick rate against, and the clock its workload read (issue 44)
        assert (record.boot["hz"], record.boot["clocksource"]) == (300, "tsc")
        # the kernel's build record and its log, in the bundle (issue 39)
        kernel_build = record.boot["kernel_build"]
        assert {k: kernel_build[k] for k in build_record} == build_record and kernel_build["build_log_matches"]
        assert kernel_build["build_log_in_bundle"] == f"raw/{record.run}/kernel-build.log"
        assert (bundle_path / kernel_build["build_log_in_bundle"]).read_bytes() == build_log
    assert "BOOT_IMAGE=" not in plan.runs[0].cmdline and "quiet" in plan.runs[0].cmdline.split()
    results = pd.read_csv(bundle_path / "results.csv")
    assert sorted(results.groupby("condition").size().items()) == [("nohz-full", 2), ("tick-on", 2)]
    assert bundle.manifest.stopping["reason"] == "fixed run count (the experiment sets no budget)"
    assert bundle.manifest.boot_plan["state"] == "finished" and bundle.manifest.boot_plan["mode"] == "kexec"
    # back to the kernel and command line the machine had
    assert calls(log)[-2].endswith(
        f"--append {' '.join(w for w in ORIGINAL.split() if not w.startswith('BOOT_IMAGE='))}"
    )


def test_a_wrong_boot_is_a_failed_run_and_the_bundle_keeps_the_runs_made(host, tmp_path):
    root, _ = host
    plan = start_capture(root, tmp_path)
    first, second = plan.runs[:2]
    reboot(root, "boot-1", first.cmdline)
    assert resume_in_a_new_process(root).returncode == 0
    reboot(root, "boot-2", second.cmdline, release="6.1.0-21-amd64")  # the default kernel after a panic
    assert resume_in_a_new_process(root).returncode == 0
    assert plan_state.load(root, plan.id).state == "failed"

    [bundle_path] = list((tmp_path / "traces" / "fake-boots" / "nohz").iterdir())
    bundle = load_bundle(bundle_path)
    made, failed = bundle.manifest.runs
    assert made.status == "ok" and made.boot["boot_id"] == "boot-1"
    assert failed.status == "failed" and failed.run == second.name
    assert failed.problem == (
        f"wrong boot: booted kernel 6.1.0-21-amd64, expected {RELEASE} (a failed boot fell back to the default?)"
    )
    assert bundle.manifest.stopping["reason"].startswith(f"boot plan failed: run {second.name}: booted kernel")
    assert len(pd.read_csv(bundle_path / "results.csv")) == 1


def test_the_stopping_rule_adds_rounds_across_boots(host, tmp_path):
    """A plan whose runs are done asks the experiment's stopping rule, from the bundle on disk, for another round."""
    root, _ = host
    plan, maker = planned_runs_made_short_of_a_goal(root, tmp_path)
    more = maker.more_runs(plan)
    assert sorted(r.condition for r in more) == ["nohz-full", "tick-on"] and [r.name for r in more] == [
        "run-005",
        "run-006",
    ]
    assert {r.cmdline for r in more} == {r.cmdline for r in plan.runs}
    manifest = json.loads(Path(plan.bundle, "manifest.json").read_text())
    assert [o.get("round") for o in manifest["order"]] == [None] * 4 + [1, 1]
    assert manifest["stopping"]["reason"] is None  # still going: the rule has not ended the capture
    assert manifest["stopping"]["checks"][-1]["comparisons"][0]["met"] is False


def test_a_boot_experiment_without_boot_is_refused_naming_the_file(tmp_path):
    experiment = tmp_path / "host-boot-echo.yaml"
    experiment.write_text(EXPERIMENT)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "ticklab.cli",
            "capture",
            "nohz",
            "--experiment",
            str(experiment),
            "--out",
            str(tmp_path / "traces"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and not (tmp_path / "traces").exists()
    assert done.stderr.strip() == (
        f"ticklab capture: {experiment}: a boot experiment (a host_kernel knob); run it with "
        f"'ticklab capture nohz --boot kexec|grub|manual --experiment {experiment}'"
    )


def test_a_first_boot_that_cannot_start_fails_its_run_and_seals_the_bundle(host, tmp_path):
    root, _ = host
    (tmp_path / "bin" / "kexec").write_text(
        "#!/bin/sh\necho 'kexec_load failed: Operation not permitted' >&2\nexit 1\n"
    )
    done = capture_in_a_new_process(root, tmp_path)
    assert done.returncode == 2 and done.stderr.strip().endswith("exit 1: kexec_load failed: Operation not permitted")
    assert len(done.stderr.strip().splitlines()) == 1
    [bundle_path] = list((tmp_path / "traces" / "fake-boots" / "nohz").iterdir())
    bundle = load_bundle(bundle_path)  # sealed: nothing waits for a resume that will never come
    [failed] = bundle.manifest.runs
    assert failed.status == "failed" and failed.problem.startswith("could not boot")
    assert bundle.manifest.stopping["reason"] == (f"boot plan failed: run {failed.run}: {failed.problem}")
    assert failed.problem.endswith("exit 1: kexec_load failed: Operation not permitted")
    assert not (root / "etc/systemd/system/ticklab-plan.service").exists()


def bundle_of(tmp_path) -> Path:
    [path] = list((tmp_path / "traces" / "fake-boots" / "nohz").iterdir())
    return path


def test_the_plan_runs_the_experiment_kept_with_it_and_abort_needs_no_file(host, tmp_path):
    """The user's experiment file moved, edited or deleted mid-plan changes nothing: the plan keeps its own copy,
    and an abort reads neither it nor the bundle before putting the host back."""
    root, _ = host
    plan = start_capture(root, tmp_path)
    kept = root / "var/lib/ticklab/plans" / plan.id / "host-boot-experiment.yaml"
    assert kept.read_text() == EXPERIMENT and stat.S_IMODE(kept.stat().st_mode) == 0o600
    (tmp_path / "host-boot-echo.yaml").write_text(EXPERIMENT.replace("echo Time: 1.0$$", "exit 3"))
    reboot(root, "boot-1", plan.runs[0].cmdline)
    assert resume_in_a_new_process(root).returncode == 0
    (tmp_path / "host-boot-echo.yaml").unlink()
    kept.unlink()  # even the plan's own copy gone: abort still ends the plan
    done = resume_in_a_new_process(root, "abort")
    assert done.returncode == 0, done.stderr
    assert plan_state.load(root, plan.id).state == "aborted"
    assert not (root / "etc/systemd/system/ticklab-plan.service").exists()
    bundle = load_bundle(bundle_of(tmp_path))
    [made] = bundle.manifest.runs
    assert made.status == "ok" and made.boot["boot_id"] == "boot-1"  # run with the kept experiment, not the edit
    assert bundle.manifest.status == "sealed" and bundle.manifest.stopping["reason"] == "boot plan aborted"


def test_a_run_whose_experiment_is_gone_ends_the_plan_and_seals_the_runs_made(host, tmp_path):
    root, _ = host
    plan = start_capture(root, tmp_path)
    reboot(root, "boot-1", plan.runs[0].cmdline)
    assert resume_in_a_new_process(root).returncode == 0
    (root / "var/lib/ticklab/plans" / plan.id / "host-boot-experiment.yaml").unlink()
    reboot(root, "boot-2", plan.runs[1].cmdline)
    done = resume_in_a_new_process(root)
    assert done.returncode == 2 and "plan failed: the plan's experiment:" in done.stderr
    final = plan_state.load(root, plan.id)
    assert final.state == "failed" and [r.state for r in final.runs] == ["made", "failed", "planned", "planned"]
    assert not (root / "etc/systemd/system/ticklab-plan.service").exists()
    bundle = load_bundle(bundle_of(tmp_path))
    assert [r.status for r in bundle.manifest.runs] == ["ok", "failed"]
    assert bundle.manifest.runs[1].problem.startswith("the plan's experiment:")


def test_a_bundle_moved_mid_plan_ends_the_plan_with_the_host_put_back(host, tmp_path):
    root, log = host
    plan = start_capture(root, tmp_path)
    moved = tmp_path / "moved-bundle"
    bundle_of(tmp_path).rename(moved)
    reboot(root, "boot-1", plan.runs[0].cmdline)
    done = resume_in_a_new_process(root)
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("ticklab plan resume: ") and f"the plan's bundle: {plan.bundle}" in line
    final = plan_state.load(root, plan.id)
    assert final.state == "failed" and final.runs[0].state == "failed"
    assert not (root / "etc/systemd/system/ticklab-plan.service").exists()
    assert not (root / "var/lib/ticklab/plans" / plan.id / "host-changes.json").exists()
    assert calls(log)[-2:] == ["kexec -u", "systemctl daemon-reload"]  # no next boot loaded: the host is put back
    assert json.loads((moved / "manifest.json").read_text())["status"] == "incomplete"  # moved: left as it was


def test_a_wrong_boot_puts_the_host_back_even_when_the_bundle_is_gone(host, tmp_path):
    root, _ = host
    plan = start_capture(root, tmp_path)
    bundle_of(tmp_path).rename(tmp_path / "moved-bundle")
    reboot(root, "boot-1", plan.runs[0].cmdline, release="6.1.0-21-amd64")
    done = resume_in_a_new_process(root)
    assert done.returncode == 2 and "the plan's bundle:" in done.stderr
    assert f"run {plan.runs[0].name} failed: booted kernel 6.1.0-21-amd64" in done.stdout
    assert plan_state.load(root, plan.id).state == "failed"
    assert not (root / "etc/systemd/system/ticklab-plan.service").exists()


def test_a_round_in_the_manifest_but_not_in_the_plan_is_not_drawn_twice(host, tmp_path):
    """A process killed after the stopping rule added a round to the bundle's order, before the plan was saved: the
    next ask returns that round, and the order has no runs that will never be made."""
    root, _ = host
    plan, maker = planned_runs_made_short_of_a_goal(root, tmp_path)
    first = maker.more_runs(plan)
    again = maker.more_runs(plan)  # plan.json never took the first answer
    assert [(r.name, r.condition, r.cmdline) for r in again] == [(r.name, r.condition, r.cmdline) for r in first]
    assert [o["run"] for o in json.loads(Path(plan.bundle, "manifest.json").read_text())["order"]] == [
        r.name for r in plan.runs
    ] + ["run-005", "run-006"]


def test_an_ended_plan_whose_bundle_came_back_is_sealed_by_abort(host, tmp_path):
    root, _ = host
    plan = start_capture(root, tmp_path)
    reboot(root, "boot-1", plan.runs[0].cmdline)
    assert resume_in_a_new_process(root).returncode == 0
    bundle = bundle_of(tmp_path)
    bundle.rename(tmp_path / "away")
    reboot(root, "boot-2", plan.runs[1].cmdline)
    assert resume_in_a_new_process(root).returncode == 2  # the plan ends: its bundle is gone
    (tmp_path / "away").rename(bundle)
    done = resume_in_a_new_process(root, "abort")
    assert done.returncode == 0, done.stderr
    assert f"boot plan {plan.id} had failed already: what was left of its host changes is put back" in done.stdout
    sealed = load_bundle(bundle)
    assert [r.status for r in sealed.manifest.runs] == ["ok", "failed"]  # the run the plan ended on, too
    assert sealed.manifest.runs[1].problem.startswith("the plan's bundle:")
    assert sealed.manifest.stopping["reason"].startswith(
        f"boot plan failed: run {plan.runs[1].name}: the plan's bundle:"
    )


def test_an_ending_cut_short_is_completed_by_the_next_resume(host, tmp_path):
    """A process killed after saving the plan's end, before putting the host back: the unit, still installed,
    runs resume at the next boot, which puts the host back and seals the bundle."""
    root, log = host
    plan = start_capture(root, tmp_path)
    plan.state, plan.ended_because = "failed", "run run-001: killed"
    plan_state.save(root, plan)
    assert (root / "etc/systemd/system/ticklab-plan.service").is_file()
    reboot(root, "boot-1", ORIGINAL)
    done = resume_in_a_new_process(root)
    assert done.returncode == 0, done.stderr
    assert f"boot plan {plan.id}: nothing to resume (plan failed); host changes put back" in done.stdout
    assert not (root / "etc/systemd/system/ticklab-plan.service").exists() and calls(log)[-2] == "kexec -u"
    sealed = load_bundle(bundle_of(tmp_path))
    assert sealed.manifest.runs == [] and sealed.manifest.stopping["reason"] == "boot plan failed: run run-001: killed"


def test_a_plan_made_before_plans_kept_their_experiment_runs_the_users_file(host, tmp_path):
    root, _ = host
    plan = start_capture(root, tmp_path)
    del plan.capture["experiment_file"]
    plan_state.save(root, plan)
    reboot(root, "boot-1", plan.runs[0].cmdline)
    assert resume_in_a_new_process(root).returncode == 0
    [made] = load_bundle(bundle_of(tmp_path), allow_incomplete=True).manifest.runs
    assert made.status == "ok"


def test_a_capture_refused_by_a_running_plan_opens_no_bundle(host, tmp_path):
    root, _ = host
    plan = start_capture(root, tmp_path)
    done = capture_in_a_new_process(root, tmp_path, out="more")
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"ticklab capture: {root}/var/lib/ticklab/plans/{plan.id}: a plan is running; "
        "'ticklab plan status' or 'ticklab plan abort'"
    )
    assert not (tmp_path / "more").exists()


def test_a_plan_that_cannot_be_made_leaves_no_bundle_and_no_plan_directory(host, tmp_path):
    root, _ = host
    (root / "var/lib").chmod(0o777)  # the plan's state would sit where another user can replace it
    done = capture_in_a_new_process(root, tmp_path)
    assert done.returncode == 2 and "var/lib: another user can replace what is under it" in done.stderr
    assert list((tmp_path / "traces" / "fake-boots" / "nohz").iterdir()) == []
    assert not (root / "var/lib/ticklab").exists()


def test_the_bundle_says_which_run_ended_the_plan_and_why(host, tmp_path):
    """A run whose making failed does not stop the plan; the wrong boot after it does, and the bundle names that."""
    from ticklab.capture.boot_capture import BootCapture

    root, _ = host
    plan = start_capture(root, tmp_path)

    class FirstRunBreaks(BootCapture):
        def make_run(self, run, boot):
            if run.name == plan.runs[0].name:
                raise RuntimeError("workload crashed")
            return super().make_run(run, boot)

    reboot(root, "boot-1", plan.runs[0].cmdline)
    plan_engine.resume(plan.id, FirstRunBreaks(plan, root, log=lambda _: None), root=root, say=lambda _: None)
    reboot(root, "boot-2", ORIGINAL, release="6.1.0-21-amd64")
    plan_engine.resume(plan.id, FirstRunBreaks(plan, root, log=lambda _: None), root=root, say=lambda _: None)
    bundle = load_bundle(bundle_of(tmp_path))
    assert [(r.run, r.status) for r in bundle.manifest.runs] == [
        (plan.runs[0].name, "failed"),
        (plan.runs[1].name, "failed"),
    ]
    assert bundle.manifest.stopping["reason"] == (
        f"boot plan failed: run {plan.runs[1].name}: booted kernel "
        f"6.1.0-21-amd64, expected {RELEASE} (a failed boot fell back to the default?)"
    )
    assert (
        f"ended: run {plan.runs[1].name}: booted kernel 6.1.0-21-amd64"
        in resume_in_a_new_process(root, "status").stdout
    )


def test_a_host_without_acpi_idle_is_refused_before_any_reboot_even_without_the_kernel(host, tmp_path):
    """Issue 39 item 2: acpi-idle's boot plan on a host whose cpuidle driver is haltpoll (a KVM guest; QEMU offers no
    ACPI C-states) learns it before the first reboot — a sealed bundle saying why, no plan, no kexec — even where the
    patched kernel its conditions name is not installed (that was asked for first, and the user built a kernel for
    nothing)."""
    from conftest import REPO

    root, log = host
    (root / "sys/devices/system/cpu/cpuidle/current_driver").write_text("haltpoll\n")
    for image in (root / "boot").glob("*-ticklab-*"):
        image.unlink()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "ticklab.cli",
            "capture",
            "acpi-idle",
            "--boot",
            "kexec",
            "--experiment",
            str(REPO / "runners/acpi-idle/host-boot-tbench.yaml"),
            "--root",
            str(root),
            "--journal",
            str(tmp_path / "journal.json"),
            "--out",
            str(tmp_path / "out"),
            "--host-id",
            "fake-haltpoll",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "not testable on this host" in done.stdout + done.stderr and "haltpoll" in done.stdout + done.stderr
    [manifest] = (tmp_path / "out").glob("*/acpi-idle/*/manifest.json")
    sealed = json.loads(manifest.read_text())
    assert sealed["status"] == "sealed" and "haltpoll" in sealed["not_testable"] and sealed["runs"] == []
    assert not (root / "var/lib/ticklab/plans").exists() or not any((root / "var/lib/ticklab/plans").iterdir())
    assert calls(log) == []  # no kexec, no systemctl: nothing was booted


def test_a_condition_whose_kernel_is_not_installed_names_the_kernel_build_command_in_one_line(host, tmp_path):
    """Before any plan or bundle: the patterns no installed kernel matches, their conditions, and the exact command
    the experiment's kernel_builds gives (issue 39 item 3)."""
    root, _ = host
    wanted = "6.12.*-ticklab-ffffffff"
    text = (
        EXPERIMENT.replace('kernel: running, boot: "-nohz_full"', f'kernel: "{wanted}", boot: "-nohz_full"')
        .replace('kernel: running, boot: "nohz_full', 'kernel: "7.2.*", boot: "nohz_full')
        .replace(
            "knobs:", f'kernel_builds:\n  - {{kernel: "{wanted}", series: "6.12", localmodconfig: true}}\nknobs:', 1
        )
    )
    done = capture_in_a_new_process(root, tmp_path, text=text)
    assert done.returncode == 2 and done.stdout == ""
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(
        f"ticklab capture: {tmp_path / 'host-boot-echo.yaml'}: no installed kernel matches "
        "'6.12.*-ticklab-ffffffff' (conditions tick-on); build it: ticklab kernel build --host --source "
        "/usr/src/linux-source-6.12.tar.xz --localmodconfig; no installed kernel matches '7.2.*' "
        "(conditions nohz-full); build one with 'ticklab kernel build --host'"
    ), line
    installed = ", ".join(sorted(p.name[len("vmlinuz-") :] for p in (root / "boot").glob("vmlinuz-*")))
    assert line.endswith(f"(installed in {root / 'boot'}: {installed})") and RELEASE in installed
    assert not (tmp_path / "traces").exists() and not (root / "var/lib/ticklab/plans").exists()


def test_nohz_defaults_to_the_boot_experiment_that_needs_no_kernel_and_its_hz_plan_names_both_builds(host, tmp_path):
    """runners/nohz holds host-boot-ftq (the running kernel) and host-boot-hz (a kernel per HZ): without --experiment
    the first; the second on a host without its kernels names both `kernel build` commands, the fragment in one."""
    from ticklab.capture.boot_capture import boot_experiment

    assert boot_experiment("nohz", None).name == "host-boot-ftq"
    root, _ = host
    from ticklab.capture.boot_capture import check_kernels_installed, load_experiment
    from ticklab.capture.experiment import ExperimentError, expand_conditions
    from ticklab.host import facts

    hz = load_experiment(Path(__file__).resolve().parents[1] / "runners/nohz/host-boot-hz.yaml")
    with pytest.raises(ExperimentError) as refused:
        check_kernels_installed(hz, expand_conditions(hz, facts.collect(root)), root)
    line = str(refused.value)
    assert "\n" not in line
    assert (
        "no installed kernel matches '*-ticklab-hz1000-*' (conditions hz1000); build it: ticklab kernel build "
        "--host --source /usr/src/linux-source-6.12.tar.xz --localmodconfig --fragment "
        "kernel/fragments/hz1000.config"
    ) in line, line


def test_build_kernels_builds_what_is_missing_in_the_conditions_order_after_saying_the_estimate(
    host, tmp_path, monkeypatch
):
    """capture --boot --build-kernels (issue 39 item 3): each missing kernel planned by `kernel build --host` from the
    experiment's kernel_builds (series source, localmodconfig, fragment), its estimate said, then built and installed;
    afterwards every condition has its kernel. A pattern without a kernel_builds entry is refused before any build."""
    from ticklab.capture import boot_capture, hostkernel
    from ticklab.capture.experiment import ExperimentError, expand_conditions
    from ticklab.host import facts

    root, _ = host
    planned, built = [], []

    class Plan:
        def __init__(self, release):
            self.release, self.warnings = release, []

        def estimate(self):
            return "an estimate, not a measurement: 7-20 min"

    def fake_plan(root_, *, source, localmodconfig, fragment):
        planned.append((source, localmodconfig, fragment and fragment.name))
        return Plan("6.12.117-ticklab-hz1000-0123abcd" if fragment else "6.12.117-ticklab-89abcdef")

    def fake_build(plan, root_, say):
        (root_ / f"boot/vmlinuz-{plan.release}").write_bytes(b"kernel")
        built.append(plan.release)
        return plan.release

    monkeypatch.setattr(hostkernel, "plan_host_kernel", fake_plan)
    monkeypatch.setattr(hostkernel, "build_and_install", fake_build)
    hz = boot_capture.load_experiment(Path(__file__).resolve().parents[1] / "runners/nohz/host-boot-hz.yaml")
    conditions = expand_conditions(hz, facts.collect(root))
    said = []
    assert boot_capture.build_missing_kernels(hz, conditions, root, said.append, dry_run=True) == [
        "6.12.117-ticklab-89abcdef",
        "6.12.117-ticklab-hz1000-0123abcd",
    ]
    assert built == [] and all("an estimate, not a measurement" in line for line in said)
    assert (
        boot_capture.build_missing_kernels(hz, conditions, root, said.append)
        == built
        == ["6.12.117-ticklab-89abcdef", "6.12.117-ticklab-hz1000-0123abcd"]
    )
    assert planned[-2:] == [
        (root / "usr/src/linux-source-6.12.tar.xz", True, None),
        (root / "usr/src/linux-source-6.12.tar.xz", True, "hz1000.config"),
    ]
    boot_capture.check_kernels_installed(hz, conditions, root)  # every condition has its kernel now
    hz.kernel_builds = hz.kernel_builds[:1]
    (root / "boot/vmlinuz-6.12.117-ticklab-hz1000-0123abcd").unlink()
    built.clear()
    with pytest.raises(
        ExperimentError,
        match=r"no kernel_builds entry says how to build '\*-ticklab-hz1000-\*' "
        r"\(conditions hz1000\); --build-kernels builds only those",
    ):
        boot_capture.build_missing_kernels(hz, conditions, root, said.append)
    assert built == []


def test_build_kernels_without_boot_is_refused_in_one_line():
    done = subprocess.run(
        [sys.executable, "-m", "ticklab.cli", "capture", "nohz", "--build-kernels"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and done.stderr == (
        "ticklab capture: --build-kernels builds the kernels a boot plan boots; add --boot kexec|grub|manual\n"
    )
