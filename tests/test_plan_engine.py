"""Boot plans on a fake root: a tmp dir stands in for /, fake kexec, grub-reboot, grub-editenv and systemctl on PATH
log their argv. A "reboot" is the test writing a new boot_id, release and /proc/cmdline into the fake root; the
plan is then resumed by a new process (``ticklab plan resume``), so its state must survive on disk."""

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, make_fake_host
from ticklab.host import HostChangeError, boot_loaders, plan_engine, plan_state
from ticklab.host.plan_state import BootRun, PlanError

RELEASE = "6.12.57-ticklab"
ORIGINAL = "BOOT_IMAGE=/boot/vmlinuz-6.12.57-ticklab root=/dev/vda1 ro quiet"
TOOLS = ("kexec", "grub-reboot", "grub-editenv", "systemctl")


@pytest.fixture
def host(tmp_path, monkeypatch):
    root = make_fake_host(tmp_path / "root")
    (root / "proc/cmdline").write_text(ORIGINAL + "\n")
    (root / "proc/sys/kernel/random").mkdir(parents=True)
    (root / "proc/sys/kernel/random/boot_id").write_text("boot-0\n")
    (root / "boot/grub").mkdir(parents=True)
    (root / "boot/grub/grub.cfg").write_text(
        "### BEGIN /etc/grub.d/41_custom ###\n"
        "if [ -f  ${config_directory}/custom.cfg ]; then\n"
        "  source ${config_directory}/custom.cfg\nfi\n"
    )
    for release in (RELEASE, "6.12.99-ticklab-abc"):
        (root / f"boot/vmlinuz-{release}").write_bytes(b"kernel")
        (root / f"boot/initrd.img-{release}").write_bytes(b"initrd")
    (root / "run/systemd/system").mkdir(parents=True)
    (root / "var/lib").mkdir(parents=True)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "argv.log"
    for name in TOOLS:
        tool = bin_dir / name
        tool.write_text(f'#!/bin/sh\necho {name} "$@" >> {log}\n')
        tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return root, log


def reboot(root: Path, boot_id: str, cmdline: str, release: str = RELEASE) -> None:
    (root / "proc/sys/kernel/random/boot_id").write_text(boot_id + "\n")
    (root / "proc/cmdline").write_text(cmdline + "\n")
    (root / "proc/sys/kernel/osrelease").write_text(release + "\n")


def resume_in_a_new_process(root: Path, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ticklab.cli", "plan", *(argv or ("resume",)), "--root", str(root)],
        capture_output=True,
        text=True,
        timeout=120,
        env=os.environ.copy(),
    )


def two_conditions(rounds: int = 2) -> list[BootRun]:
    runs = []
    for i in range(rounds):
        runs.append(BootRun(f"run-{2 * i + 1:03d}", "nohz_full=off", "running", "root=/dev/vda1 ro quiet"))
        runs.append(BootRun(f"run-{2 * i + 2:03d}", "nohz_full=on", "running", "root=/dev/vda1 ro quiet nohz_full=1"))
    return runs


def calls(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


@pytest.mark.slow
def test_kexec_mode_loads_each_condition_and_survives_reboots(host, tmp_path):
    root, log = host
    plan = plan_engine.create(two_conditions(), mode="kexec", bundle=tmp_path / "bundle", root=root, plan_id="p1")
    directory = root / "var/lib/ticklab/plans/p1"
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    plan_engine.advance(plan.id, root=root, say=lambda _: None)
    unit = root / "etc/systemd/system/ticklab-plan.service"
    assert "Type=oneshot" in unit.read_text() and "After=basic.target multi-user.target" in unit.read_text()
    assert "plan resume --id p1 --root" in unit.read_text()
    assert (
        os.readlink(root / "etc/systemd/system/multi-user.target.wants/ticklab-plan.service")
        == "../ticklab-plan.service"
    )
    assert calls(log) == [
        "systemctl daemon-reload",
        f"kexec -l {root}/boot/vmlinuz-{RELEASE} --initrd {root}/boot/initrd.img-{RELEASE} "
        "--append root=/dev/vda1 ro quiet",
        "systemctl --no-block kexec",
    ]
    for number, run in enumerate(plan.runs, start=1):
        reboot(root, f"boot-{number}", run.cmdline)  # kexec keeps exactly the --append line: no BOOT_IMAGE
        done = resume_in_a_new_process(root)
        assert done.returncode == 0, done.stderr
    final = plan_state.load(root, "p1")
    assert final.state == "finished"
    assert [r.state for r in final.runs] == ["made"] * 4
    assert [r.boot_id_found for r in final.runs] == ["boot-1", "boot-2", "boot-3", "boot-4"]
    assert [r.record["cmdline"] for r in final.runs] == [r.cmdline for r in plan.runs]
    assert calls(log)[-1] == "systemctl --no-block kexec" and calls(log)[-2] == (
        f"kexec -l {root}/boot/vmlinuz-{RELEASE} --initrd {root}/boot/initrd.img-{RELEASE} "
        "--append root=/dev/vda1 ro quiet"
    )
    assert "kexec -u" in calls(log)  # the journalled load was undone before the next one and at the end
    assert not unit.exists() and not os.path.lexists(
        root / "etc/systemd/system/multi-user.target.wants/ticklab-plan.service"
    )
    assert not (directory / "host-changes.json").exists()


@pytest.mark.slow
def test_grub_mode_writes_a_custom_entry_one_shot_and_puts_custom_cfg_back(host, tmp_path):
    root, log = host
    (root / "boot/grub/custom.cfg").write_text("menuentry 'mine' { }\n")
    runs = [
        BootRun("run-001", "patched", "6.12.99-ticklab-abc", "root=/dev/vda1 ro hpet_read_share=1"),
        BootRun("run-002", "stock", "running", "root=/dev/vda1 ro"),
    ]
    plan_engine.create(runs, mode="grub", bundle=tmp_path / "b", root=root, plan_id="g")
    plan_engine.advance("g", root=root, say=lambda _: None)
    custom = (root / "boot/grub/custom.cfg").read_text()
    assert custom.startswith("menuentry 'mine' { }\n")
    assert "menuentry 'ticklab-plan-g' --id 'ticklab-plan-g'" in custom
    assert "  linux /boot/vmlinuz-6.12.99-ticklab-abc root=/dev/vda1 ro hpet_read_share=1\n" in custom
    assert "  initrd /boot/initrd.img-6.12.99-ticklab-abc\n" in custom
    assert calls(log)[-2:] == [
        f"grub-reboot --boot-directory={root}/boot ticklab-plan-g",
        "systemctl --no-block reboot",
    ]
    # grub adds BOOT_IMAGE=: tolerated
    reboot(
        root,
        "boot-1",
        "BOOT_IMAGE=/boot/vmlinuz-6.12.99-ticklab-abc root=/dev/vda1 ro hpet_read_share=1",
        release="6.12.99-ticklab-abc",
    )
    assert resume_in_a_new_process(root).returncode == 0
    assert "linux /boot/vmlinuz-6.12.57-ticklab root=/dev/vda1 ro\n" in (root / "boot/grub/custom.cfg").read_text()
    assert custom.count("ticklab-plan-g") == 2  # one entry, not stacked
    assert (root / "boot/grub/custom.cfg").read_text().count("menuentry 'ticklab-plan-g'") == 1
    reboot(root, "boot-2", "BOOT_IMAGE=/boot/vmlinuz-6.12.57-ticklab root=/dev/vda1 ro")
    assert resume_in_a_new_process(root).returncode == 0
    plan = plan_state.load(root, "g")
    assert plan.state == "finished" and [r.state for r in plan.runs] == ["made", "made"]
    assert (root / "boot/grub/custom.cfg").read_text() == "menuentry 'mine' { }\n"
    assert f"grub-editenv {root}/boot/grub/grubenv unset next_entry" in calls(log)
    assert "grub.cfg" not in " ".join(calls(log))  # never regenerated


@pytest.mark.slow
def test_a_boot_into_the_default_kernel_fails_the_run_and_stops_the_plan(host, tmp_path):
    root, log = host
    runs = [
        BootRun("run-001", "patched", "6.12.99-ticklab-abc", "root=/dev/vda1 ro hpet_read_share=0"),
        BootRun("run-002", "stock", "running", "root=/dev/vda1 ro"),
    ]
    plan_engine.create(runs, mode="grub", bundle=tmp_path / "b", root=root, plan_id="bad")
    plan_engine.advance("bad", root=root, say=lambda _: None)
    reboot(root, "boot-after-panic", ORIGINAL)  # panic= reset: the default entry came up
    done = resume_in_a_new_process(root)
    assert done.returncode == 0
    plan = plan_state.load(root, "bad")
    assert plan.state == "failed"
    assert plan.runs[0].state == "failed"
    assert plan.runs[0].why == (
        f"booted kernel {RELEASE}, expected 6.12.99-ticklab-abc (a failed boot fell back to the default?)"
    )
    assert plan.runs[1].state == "planned"
    assert not (root / "etc/systemd/system/ticklab-plan.service").exists()
    assert not (root / "boot/grub/custom.cfg").exists()
    status = resume_in_a_new_process(root, "status")
    assert "plan bad (grub), failed: 0 made, 1 failed, 1 left of 2" in status.stdout


@pytest.mark.slow
def test_a_cmdline_mismatch_and_no_reboot_are_named(host, tmp_path):
    root, _ = host
    plan_engine.create(two_conditions(1), mode="kexec", bundle=tmp_path / "b", root=root, plan_id="c")
    plan_engine.advance("c", root=root, say=lambda _: None)
    done = resume_in_a_new_process(root)  # the same boot: kexec did not happen
    assert "no reboot happened (boot_id boot-0 is the one before)" in done.stdout
    plan = plan_state.load(root, "c")
    assert plan.state == "failed"
    run = BootRun("r", "c", "running", "ro nohz_full=1", release=RELEASE, boot_id_before="x")
    why = plan_engine.verify_boot(
        plan, run, {"boot_id": "y", "release": RELEASE, "cmdline": "BOOT_IMAGE=/v initrd=\\i ro"}
    )
    assert (
        why
        == "/proc/cmdline is 'BOOT_IMAGE=/v initrd=\\i ro', expected 'ro nohz_full=1' (BOOT_IMAGE= and initrd= ignored)"
    )


@pytest.mark.slow
def test_manual_mode_prints_what_to_boot_and_abort_undoes_the_unit(host, tmp_path):
    root, log = host
    plan_engine.create(two_conditions(1), mode="manual", bundle=tmp_path / "b", root=root, plan_id="m")
    said = []
    plan_engine.advance("m", root=root, say=said.append)
    assert said[-1].startswith(
        f"boot run run-001 (nohz_full=off): kernel {root}/boot/vmlinuz-{RELEASE}, "
        f"initrd {root}/boot/initrd.img-{RELEASE}, command line: root=/dev/vda1 ro quiet"
    )
    assert "kexec" not in " ".join(calls(log)) and "reboot" not in " ".join(calls(log))
    assert (root / "etc/systemd/system/ticklab-plan.service").is_file()
    status = resume_in_a_new_process(root, "status")
    assert "now: run run-001 (nohz_full=off) booting" in status.stdout
    done = resume_in_a_new_process(root, "abort")
    assert done.returncode == 0, done.stderr
    assert "aborted: unit removed" in done.stdout
    assert not (root / "etc/systemd/system/ticklab-plan.service").exists()
    assert not os.path.lexists(root / "etc/systemd/system/multi-user.target.wants/ticklab-plan.service")
    assert plan_state.load(root, "m").state == "aborted"
    assert calls(log)[-1] == "systemctl daemon-reload"
    # the run whose boot was under way is not shown as going on (the lab host's abort said "now: ... booting")
    status = resume_in_a_new_process(root, "status").stdout
    assert "plan m (manual), aborted: 0 made, 0 failed, 1 cut short, 1 left of 2" in status
    assert "not made: run run-001 (nohz_full=off) was booting when the plan aborted" in status and "now:" not in status


def test_state_in_a_directory_others_can_write_is_refused(host, tmp_path):
    root, _ = host
    (root / "var/lib").chmod(0o777)
    with pytest.raises(PlanError, match=r"var/lib: another user can replace what is under it"):
        plan_engine.create(two_conditions(1), mode="kexec", bundle=tmp_path / "b", root=root, plan_id="w")


def test_a_missing_kernel_is_refused_before_any_reboot(host, tmp_path):
    root, log = host
    runs = [BootRun("run-001", "x", "6.99.0-nope", "ro")]
    with pytest.raises(PlanError, match=r"boot/vmlinuz-6\.99\.0-nope: missing, the kernel of run run-001 \(x\)"):
        plan_engine.create(runs, mode="kexec", bundle=tmp_path / "b", root=root, plan_id="k")
    assert not calls(log)


def test_condition_cmdline_replaces_and_removes_words():
    assert (
        plan_state.condition_cmdline(ORIGINAL, ["nohz_full=1", "quiet=", "-ro"]) == "root=/dev/vda1 nohz_full=1 quiet="
    )
    assert plan_state.condition_cmdline("a=1 b c=3", ["a=2"]) == "b c=3 a=2"
    # words after "--" belong to init: kernel words go before them
    assert (
        plan_state.condition_cmdline("ro quiet -- --init-flag x=1", ["nohz_full=1", "-x"])
        == "ro quiet nohz_full=1 -- --init-flag x=1"
    )


@pytest.mark.slow
def test_capture_boot_dry_run_plans_the_interleaved_order_from_the_experiment(host, tmp_path):
    root, log = host
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "ticklab.cli",
            "capture",
            "nohz",
            "--boot",
            "kexec",
            "--dry-run",
            "--runs",
            "3",
            "--warmup",
            "1",
            "--root",
            str(root),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("  run-")]
    assert len(lines) == 8  # 2 warm-ups then 3 measured runs of each of the 2 conditions, shuffled by the seed
    # the clocksource pinned as the experiment assumes it (issue 52)
    assert lines[0].startswith(
        "  run-001 tick-on (warm-up): kernel running, command line 'root=/dev/vda1 ro quiet clocksource=tsc'"
    )
    assert lines[1].startswith(
        "  run-002 nohz-full (warm-up): kernel running, command line "
        "'root=/dev/vda1 ro quiet nohz_full=1 rcu_nocbs=1 clocksource=tsc'"
    )  # the fake host has 2 CPUs
    measured = [line.split()[1].rstrip(":") for line in lines[2:]]
    assert sorted(measured) == ["nohz-full"] * 3 + ["tick-on"] * 3
    assert not (root / "var/lib/ticklab").exists() and not calls(log)


@pytest.mark.slow
def test_capture_boot_names_a_kernel_pattern_that_matches_two(host, tmp_path):
    root, _ = host
    (root / "boot/vmlinuz-6.12.100-ticklab-def").write_bytes(b"kernel")
    done = subprocess.run(
        [sys.executable, "-m", "ticklab.cli", "capture", "hpet", "--boot", "grub", "--dry-run", "--root", str(root)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert (
        "host-boot-clock-read.yaml: conditions.hpet-share-on: kernel '*-ticklab-*' matches 2 installed kernels in "
        f"{root}/boot (have: 6.12.100-ticklab-def, 6.12.57-ticklab, 6.12.99-ticklab-abc)"
    ) in done.stderr


def test_a_host_kernel_knob_outside_a_host_boot_file_is_refused(tmp_path):
    from ticklab.capture.experiment import ExperimentError, load_experiment

    text = (REPO / "runners/nohz/host-boot-ftq.yaml").read_text()
    (tmp_path / "ftq-reboots.yaml").write_text(text)
    with pytest.raises(
        ExperimentError,
        match=r"ftq-reboots\.yaml: a boot experiment \(host_kernel knob\) must be named "
        r"host-boot-\*\.yaml",
    ):
        load_experiment(tmp_path / "ftq-reboots.yaml")


def test_a_boot_that_cannot_start_fails_the_run_and_removes_the_unit(host, tmp_path):
    root, log = host
    kexec = Path(os.environ["PATH"].split(":")[0]) / "kexec"
    kexec.write_text("#!/bin/sh\necho 'kexec_load failed: Operation not permitted' >&2\nexit 1\n")
    plan_engine.create(two_conditions(1), mode="kexec", bundle=tmp_path / "b", root=root, plan_id="lock")
    with pytest.raises(HostChangeError, match=r"kexec -l .*: exit 1: kexec_load failed: Operation not permitted"):
        plan_engine.advance("lock", root=root, say=lambda _: None)
    plan = plan_state.load(root, "lock")
    assert plan.state == "failed" and plan.runs[0].state == "failed"
    assert plan.runs[0].why.startswith("could not boot: ") and "Operation not permitted" in plan.runs[0].why
    assert not (root / "etc/systemd/system/ticklab-plan.service").exists()
    assert not (root / "var/lib/ticklab/plans/lock/host-changes.json").exists()


def test_grub_mode_refuses_a_word_grub_would_interpret(host, tmp_path):
    root, log = host
    runs = [BootRun("run-001", "x", "running", "root=/dev/vda1 ro init=/bin/sh;reboot")]
    with pytest.raises(
        PlanError, match=r"custom\.cfg: command-line word 'init=/bin/sh;reboot' of run run-001 cannot go"
    ):
        plan_engine.create(runs, mode="grub", bundle=tmp_path / "b", root=root, plan_id="q")  # refused before any boot
    assert not (root / "boot/grub/custom.cfg").exists() and "grub-reboot" not in " ".join(calls(log))
    assert not (root / "var/lib/ticklab/plans/q").exists()


def test_a_unit_already_installed_is_not_replaced(host, tmp_path):
    root, _ = host
    unit = root / "etc/systemd/system/ticklab-plan.service"
    unit.parent.mkdir(parents=True)
    unit.write_text("someone else's\n")
    plan_engine.create(two_conditions(1), mode="manual", bundle=tmp_path / "b", root=root, plan_id="u")
    with pytest.raises(PlanError, match=r"ticklab-plan\.service: exists already"):
        plan_engine.advance("u", root=root, say=lambda _: None)
    assert unit.read_text() == "someone else's\n"


@pytest.mark.slow
def test_an_abort_cannot_slip_in_between_a_run_and_the_next_boot(host, tmp_path):
    """resume holds the plan's lock until the next boot is under way: an abort started meanwhile (here, by the fake
    kexec that loads the next kernel) is refused, and does not end a plan that then boots on."""
    root, log = host
    plan = plan_engine.create(two_conditions(1), mode="kexec", bundle=tmp_path / "b", root=root, plan_id="race")
    plan_engine.advance(plan.id, root=root, say=lambda _: None)
    aborted = tmp_path / "abort.out"
    kexec = Path(os.environ["PATH"].split(":")[0]) / "kexec"
    kexec.write_text(
        f'#!/bin/sh\necho kexec "$@" >> {log}\n'
        f"{sys.executable} -m ticklab.cli plan abort --root {root} >> {aborted} 2>&1; echo exit $? >> {aborted}\n"
    )
    reboot(root, "boot-1", plan.runs[0].cmdline)
    done = resume_in_a_new_process(root)
    assert done.returncode == 0, done.stderr
    assert aborted.read_text().splitlines()[-2:] == [
        f"ticklab plan abort: {root}/var/lib/ticklab/plans/race/plan.lock: another ticklab process is acting on this "
        "plan; wait for it",
        "exit 2",
    ]
    after = plan_state.load(root, "race")
    assert after.state == "running" and [r.state for r in after.runs] == ["made", "booting"]
    assert (root / "etc/systemd/system/ticklab-plan.service").is_file()


def test_a_seal_that_fails_still_puts_the_host_back_and_returns_to_the_original_kernel(host, tmp_path):
    root, log = host

    class SealFails(plan_engine.RunMaker):
        def make_run(self, run, boot):
            return {"run": run.name}

        def finished(self, plan):
            raise OSError(f"{plan.bundle}/manifest.json: Read-only file system")

    plan = plan_engine.create(two_conditions(1), mode="kexec", bundle=tmp_path / "b", root=root, plan_id="seal")
    plan_engine.advance(plan.id, root=root, say=lambda _: None)
    reboot(root, "boot-1", plan.runs[0].cmdline)
    plan_engine.resume(plan.id, SealFails(), root=root, say=lambda _: None)
    reboot(root, "boot-2", plan.runs[1].cmdline)
    with pytest.raises(PlanError, match=r"/b: .*/b/manifest.json: Read-only file system$"):
        plan_engine.resume(plan.id, SealFails(), root=root, say=lambda _: None)
    assert plan_state.load(root, "seal").state == "finished"
    assert not (root / "etc/systemd/system/ticklab-plan.service").exists()
    assert calls(log)[-2:] == [
        f"kexec -l {root}/boot/vmlinuz-{RELEASE} --initrd {root}/boot/initrd.img-{RELEASE} "
        "--append root=/dev/vda1 ro quiet",
        "systemctl --no-block kexec",
    ]


@pytest.mark.slow
def test_a_plan_cut_short_between_a_run_and_the_next_boot_goes_on_at_the_next_resume(host, tmp_path):
    root, log = host
    plan = plan_engine.create(two_conditions(1), mode="kexec", bundle=tmp_path / "b", root=root, plan_id="cut")
    plan_engine.advance(plan.id, root=root, say=lambda _: None)
    reboot(root, "boot-1", plan.runs[0].cmdline)
    plan_engine.resume(plan.id, plan_engine.record_boot_only, root=root, say=lambda _: None, go_on=False)  # killed here
    assert "'ticklab plan resume' boots the next run" in resume_in_a_new_process(root, "status").stdout
    done = resume_in_a_new_process(root)
    assert done.returncode == 0, done.stderr
    assert [r.state for r in plan_state.load(root, "cut").runs] == ["made", "booting"]
    assert calls(log)[-2].endswith("--append root=/dev/vda1 ro quiet nohz_full=1")


@pytest.mark.slow
def test_abort_of_a_plan_that_does_not_exist_says_so_in_one_line(host, tmp_path):
    root, _ = host
    done = resume_in_a_new_process(root, "abort", "--id", "nope")
    assert done.returncode == 2
    assert done.stderr.strip() == f"ticklab plan abort: {root}/var/lib/ticklab/plans/nope: no such plan"


# issue 27, item 3: a command line holding a newline would add lines of its own to the grub menu entry
def test_grub_mode_refuses_a_command_line_holding_a_newline_before_any_boot(host, tmp_path):
    root, log = host
    runs = [BootRun("run-001", "x", "running", "root=/dev/vda1 quiet\n  initrd /tmp/evil\n  linux /tmp/evil init=/x")]
    with pytest.raises(PlanError, match=r"plans/nl: the command line of run run-001 holds the control character '\\n'"):
        plan_engine.create(runs, mode="grub", bundle=tmp_path / "b", root=root, plan_id="nl")
        plan_engine.advance("nl", root=root, say=lambda _: None)
    assert not (root / "boot/grub/custom.cfg").exists() and "grub-reboot" not in " ".join(calls(log))
    assert not (root / "var/lib/ticklab/plans/nl").exists()  # refused when made: no plan to abort
    # and the grub writer itself, whatever handed it the command line
    plan = plan_state.Plan("nl", "grub", "b", {"release": RELEASE, "cmdline": ORIGINAL, "boot_id": "x"}, runs)
    with pytest.raises(
        PlanError, match=r"custom\.cfg: the command line of run run-001 holds the control character '\\n'"
    ):
        boot_loaders.grub_menu_entries(plan, root)


def test_an_experiment_whose_boot_words_hold_a_newline_is_refused_naming_the_key(tmp_path):
    from ticklab.capture.experiment import ExperimentError, load_experiment

    text = (REPO / "runners/nohz/host-boot-ftq.yaml").read_text()
    bad = text.replace(
        'boot: "-nohz_full -rcu_nocbs clocksource=tsc"',
        'boot: "quiet\\n  initrd /tmp/evil\\n  linux /tmp/evil init=/x"',
    )
    assert bad != text
    (tmp_path / "host-boot-ftq.yaml").write_text(bad)
    with pytest.raises(ExperimentError) as raised:
        load_experiment(tmp_path / "host-boot-ftq.yaml")
    assert str(raised.value).startswith(f"{tmp_path}/host-boot-ftq.yaml: conditions[0].boot: 'quiet\\n  initrd ")
    assert "control character '\\n'" in str(raised.value) and "\n" not in str(raised.value)
    for value, key in (
        ('["nohz_full=1", "a\\tb"]', "conditions[0].boot"),
        ("7.5", None),
        ("[1, 2]", None),
        ("null", "conditions[0].boot"),
        ("{x: 1}", "conditions[0].boot"),
    ):
        (tmp_path / "host-boot-ftq.yaml").write_text(text.replace('"-nohz_full -rcu_nocbs clocksource=tsc"', value))
        if key is None:
            load_experiment(tmp_path / "host-boot-ftq.yaml")  # numbers are words
            continue
        with pytest.raises(ExperimentError, match=rf"host-boot-ftq\.yaml: {re.escape(key)}: "):
            load_experiment(tmp_path / "host-boot-ftq.yaml")
    guest = (REPO / "runners/nohz/guest-ftq.yaml").read_text()
    (tmp_path / "guest-ftq.yaml").write_text(
        guest.replace('cmdline: "clocksource=tsc tsc=reliable"', 'cmdline: "a\\rb"', 1)
    )
    with pytest.raises(ExperimentError, match=r"guest-ftq\.yaml: lab\.cmdline: 'a\\rb' holds the control character"):
        load_experiment(tmp_path / "guest-ftq.yaml")


@pytest.mark.parametrize(
    "files, refused",
    [
        ({"etc/default/kexec": "LOAD_KEXEC=true\n"}, "etc/default/kexec"),
        ({"etc/default/kexec": 'LOAD_KEXEC="true"  # Debian asked\n'}, "etc/default/kexec"),
        (
            {"etc/default/kexec": "LOAD_KEXEC=false\n", "etc/default/kexec.d/local": "LOAD_KEXEC=true\n"},
            "etc/default/kexec.d/local",
        ),
        ({"etc/default/kexec": "LOAD_KEXEC=true\n", "etc/default/kexec.d/off": "LOAD_KEXEC=false\n"}, None),
        ({"etc/default/kexec": "# LOAD_KEXEC=true\nLOAD_KEXEC=false\n"}, None),
    ],
)
def test_grub_mode_refuses_a_host_whose_kexec_tools_take_over_reboots(host, tmp_path, files, refused):
    """Debian's kexec-tools with LOAD_KEXEC=true kexecs the default kernel, with the running command line, at every
    reboot: grub's one-shot entry would never be booted (found on the lab host, issue 28)."""
    root, log = host
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    if refused is None:
        plan_engine.create(two_conditions(1), mode="grub", bundle=tmp_path / "b", root=root, plan_id="k")
        return
    with pytest.raises(
        PlanError, match=rf"{re.escape(str(root / refused))}: kexec-tools turns every reboot into a kexec"
    ):
        plan_engine.create(two_conditions(1), mode="grub", bundle=tmp_path / "b", root=root, plan_id="k")
    assert not (root / "var/lib/ticklab/plans/k").exists()
    plan_engine.create(
        two_conditions(1), mode="kexec", bundle=tmp_path / "b", root=root, plan_id="k2"
    )  # kexec mode is fine


def test_the_resume_unit_writes_its_lines_unbuffered(host):
    """systemd stops the unit for the reboot it queued: a buffered stdout would lose the run's lines (lab host)."""
    root, _ = host
    assert "Environment=PYTHONUNBUFFERED=1\n" in boot_loaders.unit_text(root, "p")


def test_the_resume_unit_names_the_project_the_plan_was_made_with(host, tmp_path, monkeypatch):
    """systemd starts the unit without the environment ticklab ran in: a plan made with $TICKLAB_PROJECT (or
    --project) resumes in that project, and the unit is still recognised as the plan's."""
    from conftest import REPO
    from ticklab import paths

    root, _ = host
    monkeypatch.setattr(paths, "_explicit", None)
    monkeypatch.setenv(paths.ENV, str(REPO))
    text = boot_loaders.unit_text(root, "p")
    [exec_start] = [line for line in text.splitlines() if line.startswith("ExecStart=")]
    assert f"-m ticklab.cli --project {REPO} plan resume --id p" in exec_start
    assert boot_loaders.is_plan_unit(text, "p") and not boot_loaders.is_plan_unit(text, "q")
    monkeypatch.delenv(paths.ENV)  # the checkout it runs from needs no naming
    assert "--project" not in boot_loaders.unit_text(root, "p")


def test_the_bundle_is_sealed_while_the_resume_unit_is_still_installed(host, tmp_path):
    """The capture is told before the host is put back: removing the unit under a running resume (and reloading
    systemd) fails its start job, and on the lab host the reboot that followed cut a 6-run bundle's seal short."""
    root, _ = host
    unit = root / "etc/systemd/system/ticklab-plan.service"
    seen = []

    class Maker(plan_engine.RunMaker):
        def make_run(self, run, boot):
            return {}

        def finished(self, plan):
            seen.append((plan.state, unit.is_file()))

    plan_engine.create(two_conditions(1), mode="kexec", bundle=tmp_path / "b", root=root, plan_id="s")
    plan_engine.advance("s", root=root, say=lambda _: None)
    assert unit.is_file()
    plan_engine.abort("s", root=root, say=lambda _: None, maker=Maker())
    assert seen == [("aborted", True)] and not unit.exists()


@pytest.mark.slow
def test_a_kernel_image_gone_mid_plan_fails_the_next_boot_saying_it_was_there_when_planned(host, tmp_path):
    """The lab host's hidden-kernel run said 'build and install it first' of a kernel the plan had booted twice."""
    root, _ = host
    plan_engine.create(two_conditions(1), mode="kexec", bundle=tmp_path / "b", root=root, plan_id="g")
    plan_engine.advance("g", root=root, say=lambda _: None)
    reboot(root, "boot-1", "root=/dev/vda1 ro quiet")
    (root / f"boot/vmlinuz-{RELEASE}").unlink()
    done = resume_in_a_new_process(root)
    plan = plan_state.load(root, "g")
    assert plan.state == "failed" and plan.runs[0].state == "made", done.stdout + done.stderr
    assert plan.runs[1].why == (
        f"could not boot: {root}/boot/vmlinuz-{RELEASE}: missing, the kernel of run run-002 "
        "(nohz_full=on); it was there when the plan was made, so it was moved or removed since"
    )
    assert not (root / "etc/systemd/system/ticklab-plan.service").exists()


class PowerLoss(BaseException):
    """The machine going down mid-run: nothing after it runs in that process (no except Exception catches it)."""


class Recorder(plan_engine.RunMaker):
    def __init__(self, crash_in: str | None = None):
        self.crash_in, self.made, self.failed = crash_in, [], []

    def make_run(self, run, boot):
        if run.name == self.crash_in:
            raise PowerLoss()
        self.made.append((run.name, boot["boot_id"]))
        return {"run": run.name}

    def failed_run(self, run, boot, why):
        self.failed.append((run.name, boot["boot_id"], why))


# issue 39, item 5a: a run cut by a crash was made again when the default entry's command line was the condition's
@pytest.mark.slow
def test_a_machine_that_rebooted_during_a_run_fails_that_run_and_the_plan_goes_on(host, tmp_path):
    root, log = host
    plan = plan_engine.create(two_conditions(1), mode="kexec", bundle=tmp_path / "b", root=root, plan_id="crash")
    plan_engine.advance(plan.id, root=root, say=lambda _: None)
    reboot(root, "boot-1", plan.runs[0].cmdline)  # the plan's own kexec into run-001
    with pytest.raises(PowerLoss):
        plan_engine.resume(plan.id, Recorder(crash_in="run-001"), root=root, say=lambda _: None)
    assert [r.state for r in plan_state.load(root, "crash").runs] == ["booted", "planned"]
    # the machine comes back through the default entry, whose command line is run-001's but for BOOT_IMAGE=
    reboot(root, "boot-2", ORIGINAL)
    maker, said = Recorder(), []
    plan_engine.resume(plan.id, maker, root=root, say=said.append)
    why = (
        f"the machine rebooted during the run: boot_id boot-2, release {RELEASE}, /proc/cmdline '{ORIGINAL}' came "
        "up; the run was being made in boot_id boot-1"
    )
    after = plan_state.load(root, "crash")
    assert after.state == "running" and [r.state for r in after.runs] == ["failed", "booting"]
    assert after.runs[0].why == why and after.runs[0].record is None
    assert (after.runs[0].boot_id_found, after.runs[0].cmdline_found) == ("boot-1", plan.runs[0].cmdline)
    assert maker.made == [] and maker.failed == [("run-001", "boot-1", why)]
    assert said[0] == f"boot plan crash: run run-001 (nohz_full=off) failed: {why}; 1 left"
    assert calls(log)[-2:] == [
        f"kexec -l {root}/boot/vmlinuz-{RELEASE} --initrd {root}/boot/initrd.img-{RELEASE} "
        "--append root=/dev/vda1 ro quiet nohz_full=1",
        "systemctl --no-block kexec",
    ]
    reboot(root, "boot-3", plan.runs[1].cmdline)
    plan_engine.resume(plan.id, maker, root=root, say=lambda _: None)
    final = plan_state.load(root, "crash")
    assert final.state == "finished" and [r.state for r in final.runs] == ["failed", "made"]
    assert maker.made == [("run-002", "boot-3")]
    status = resume_in_a_new_process(root, "status", "--id", "crash").stdout
    assert "plan crash (kexec), finished: 1 made, 1 failed, 0 left of 2" in status
    assert f"failed: run-001 (nohz_full=off): {why}" in status


@pytest.mark.slow
def test_a_run_whose_process_was_killed_in_its_boot_is_not_made_twice(host, tmp_path):
    root, _ = host
    plan = plan_engine.create(two_conditions(1), mode="kexec", bundle=tmp_path / "b", root=root, plan_id="kill")
    plan_engine.advance(plan.id, root=root, say=lambda _: None)
    reboot(root, "boot-1", plan.runs[0].cmdline)
    with pytest.raises(PowerLoss):
        plan_engine.resume(plan.id, Recorder(crash_in="run-001"), root=root, say=lambda _: None)
    done = resume_in_a_new_process(root, "resume", "--id", "kill")  # by hand, in the same boot
    assert done.returncode == 0, done.stderr
    after = plan_state.load(root, "kill")
    assert [r.state for r in after.runs] == ["failed", "booting"]
    assert after.runs[0].why == (
        "the run's process ended before the run was made (no reboot: boot_id boot-1 is the "
        "run's boot); it is not made again"
    )


@pytest.mark.slow
def test_capture_boot_grub_dry_run_refuses_the_boot_words_the_real_plan_refuses(host, tmp_path):
    """Issue 55 item 9: a grub dry run accepted boot words that the real plan then refused."""
    root, log = host
    (root / "proc/cmdline").write_text("root=/dev/vda1 ro quiet init=$evil;x\n")
    done = subprocess.run(
        [sys.executable, "-m", "ticklab.cli", "capture", "nohz", "--boot", "grub", "--dry-run", "--root", str(root)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stdout
    [line] = done.stderr.splitlines()
    assert "command-line word 'init=$evil;x' of run run-001 cannot go into a grub menu entry" in line
    assert not (root / "var/lib/ticklab").exists() and not calls(log)
