"""The lab host (issue 28): a Debian 12 disk image booted by BIOS, grub and systemd, where boot plans run as on a
user's machine.

The plans themselves take minutes of TCG boots each (a Debian boot is about a minute here), so they run in
``make lab-host-test`` (marker ``labhost``), which builds the image first; ``make test`` runs them only where the
image is built already and TICKLAB_LAB_HOST_TESTS=1 says to spend the time. The committed bundles from the lab
host's kexec and grub plans are checked here on every run.
"""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from ticklab import paths
from ticklab.bundle import load_bundle
from ticklab.lab import labhost, qemu

TRACES = paths.traces_dir()


def labhost_bundles(mode: str) -> list[Path]:
    return sorted(p.parent for p in TRACES.glob(f"*-labhost-{mode}/nohz/*-host-boot-ftq/manifest.json"))


# -- what the checkout copies into the image -------------------------------------------------------------------------
def test_checkout_files_leave_out_environments_outputs_and_bundles(tmp_path):
    repo = tmp_path / "repo"
    for name in (
        "src/ticklab/a.py",
        "README.md",
        ".venv/bin/python",
        "build/report/index.html",
        "traces/x/nohz/b/manifest.json",
        "src/ticklab/__pycache__/a.pyc",
        "new-untracked.txt",
        "ignored.log",
    ):
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text("x")
    (repo / ".gitignore").write_text("*.log\n")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "add", "src/ticklab/a.py", "README.md", ".gitignore"], check=True)
    names = [str(p) for p in labhost.checkout_files(repo)]
    assert names == [".gitignore", "README.md", "new-untracked.txt", "src/ticklab/a.py"]


def test_checkout_files_without_git_take_every_file_but_the_excluded(tmp_path):
    repo = tmp_path / "repo"
    for name in ("src/ticklab/a.py", ".venv/lib/x.py", "traces/published/nohz/x.csv", "traces/host/nohz/b/results.csv"):
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text("x")
    # the published layer goes in: a capture without --runs reads its precision targets there (the lab host's
    # first refused-boot plan failed without it)
    assert [str(p) for p in labhost.checkout_files(repo)] == ["src/ticklab/a.py", "traces/published/nohz/x.csv"]


def test_the_job_units_sit_on_either_side_of_the_plans_unit():
    before = labhost.unit_text("ticklab-lab-job-before.service")
    after = labhost.unit_text("ticklab-lab-job-after.service")
    assert (
        "Before=ticklab-plan.service" in before
        and "ExecStart=/usr/bin/python3 /usr/local/sbin/ticklab-lab-job before" in before
    )
    # the plan's unit is ordered after multi-user.target: a unit after it cannot have the target's default ordering
    assert "DefaultDependencies=no" in after and "After=basic.target multi-user.target ticklab-plan.service" in after


def test_the_image_key_follows_the_recipe_and_not_the_run_code(monkeypatch, tmp_path):
    key = labhost.host_key()
    monkeypatch.setattr(labhost, "BUILD_STEPS", labhost.BUILD_STEPS + 1)
    assert labhost.host_key() != key


def test_a_missing_image_is_one_line_naming_the_build_command(monkeypatch, tmp_path):
    monkeypatch.setenv("TICKLAB_CACHE", str(tmp_path))
    with pytest.raises(labhost.LabError, match=r"no lab host image .*ticklab lab build-host"):
        labhost.plan_run("nohz", "kexec")


def test_only_kexec_and_grub_plans_are_played():
    with pytest.raises(labhost.LabError, match="--boot manual: the lab host plays kexec or grub plans"):
        labhost.plan_run("nohz", "manual")


class _Started(Exception):
    pass


def _boot_host_argv(tmp_path, monkeypatch, data: dict, accel: str) -> list[str]:
    """The argv boot_host starts QEMU with (nothing started)."""
    seen = []

    def spawn(argv, **_):
        seen.append(argv)
        raise _Started

    monkeypatch.setattr(labhost, "spawn", spawn)
    with pytest.raises(_Started):
        labhost.boot_host(tmp_path, data, 10, accel, say=lambda _: None)
    return seen[0]


def test_the_recipes_vcpus_take_turns_in_one_tcg_thread(tmp_path, monkeypatch):
    # a thread per vCPU oopsed while the hrtick plan enabled its tracing (code patched through int3): see the recipe
    def accel_option(data: dict, accel: str) -> str:
        argv = _boot_host_argv(tmp_path, monkeypatch, data, accel)
        return argv[argv.index("-accel") + 1]

    assert accel_option(labhost.recipe(), "tcg") == "tcg,thread=single"
    assert accel_option({}, "tcg") == "tcg" and accel_option({"tcg_thread": "single"}, "kvm") == "kvm"
    assert labhost.declared_facts(labhost.recipe(), "tcg") == {"vcpu_threads": "single"}
    assert labhost.declared_facts(labhost.recipe(), "kvm") == labhost.declared_facts({}, "tcg") == {}
    with pytest.raises(labhost.LabError, match=r"lab-host.yaml: tcg_thread 'two': use single or multi"):
        accel_option({"tcg_thread": "two"}, "tcg")


def test_every_lab_machine_starts_qemu_with_the_one_prefix_as_each_did_before(tmp_path, monkeypatch):
    # the argvs as lab/labhost.py and lab/qemu.py each built them before they shared qemu.machine_argv (issue 58); the
    # lab host's is recorded in its run's outcome
    common = ["-nodefaults", "-no-user-config", "-display", "none"]
    assert qemu.machine_argv("tcg", 2, 1024) == [
        "qemu-system-x86_64",
        *common,
        *("-no-reboot", "-monitor", "none", "-machine", "pc", "-accel", "tcg", "-cpu", "max", "-smp", "2"),
        *("-m", "1024M"),
    ]
    assert _boot_host_argv(tmp_path, monkeypatch, {"tcg_thread": "single", "smp": 3, "memory_mb": 512}, "kvm") == [
        *("qemu-system-x86_64", "-name", "ticklab-lab-host", *common, "-monitor", "none", "-machine", "pc"),
        *("-accel", "kvm", "-cpu", "host", "-smp", "3", "-m", "512M"),
        *("-drive", f"file={tmp_path / 'disk.raw'},format=raw,if=virtio", "-nic", "none"),
        *("-serial", f"file:{tmp_path / 'console.log'}"),
    ]
    boot = qemu.Boot(tmp_path / "k", tmp_path / "i", tmp_path, tmp_path / "c.log", accel="kvm", smp=1, memory_mb=256)
    assert boot.argv() == [
        *("qemu-system-x86_64", "-name", "ticklab,debug-threads=on", *common, "-no-reboot", "-monitor", "none"),
        *("-machine", "pc", "-accel", "kvm", "-cpu", "host", "-smp", "1", "-m", "256M"),
        *("-kernel", str(tmp_path / "k"), "-initrd", str(tmp_path / "i"), "-append", boot.full_cmdline()),
        *("-serial", f"file:{tmp_path / 'c.log'}"),
        *("-virtfs", f"local,path={tmp_path},mount_tag=ticklab,security_model=none,id=share"),
    ]


def test_a_boot_line_a_guest_crash_cut_off_is_kept_as_unreadable_and_the_later_boots_read():
    # what the hrtick plan's oops left (2026-11-28): the third boot's line a block of zeros, three boots after it
    first, later = json.dumps({"phase": "before", "boot": 1}), json.dumps({"phase": "before", "boot": 4})
    boots = labhost._boot_lines(f"{first}\n".encode() + b"\0" * 622 + f"\n{later}\n{{broken\n".encode())
    assert boots == [
        {"phase": "before", "boot": 1},
        {"unreadable": "622 zero bytes (a write the guest's crash cut off)"},
        {"phase": "before", "boot": 4},
        {"unreadable": "7 bytes that are not JSON"},
    ]


# -- the committed bundles from the lab host ---------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["kexec", "grub"])
def test_the_lab_host_bundle_has_one_verified_boot_per_run_interleaved(mode):
    bundles = labhost_bundles(mode)
    if not bundles:
        pytest.skip(f"no lab host {mode} bundle in traces/ (make lab-host-bundles)")
    bundle = load_bundle(bundles[-1])
    assert bundle.sealed
    manifest = bundle.manifest
    assert manifest.boot_plan["mode"] == mode and manifest.boot_plan["state"] == "finished"
    records = manifest.runs
    assert [r["run"] for r in manifest.order] == [r.run for r in records]  # every planned run made, in order
    boots = [r.boot for r in records]
    assert all(b["mode"] == mode and b["plan"] == manifest.boot_plan["id"] for b in boots)
    ids = [b["boot_id"] for b in boots]
    assert len(set(ids)) == len(ids), "a run shares its boot with another"
    for record in records:
        words = record.boot["cmdline"].split()
        assert any(w.startswith("nohz_full=") for w in words) == (record.condition == "nohz-full"), words
        assert any(w.startswith("BOOT_IMAGE=") for w in words) == (mode == "grub")  # grub's linux command adds it
        assert record.status == "ok"
    # interleaved: each block holds one run of each condition
    blocks = {}
    for entry in manifest.order:
        blocks.setdefault(entry["block"], []).append(entry["condition"])
    assert len(blocks) >= 2 and all(sorted(b) == ["nohz-full", "tick-on"] for b in blocks.values())
    assert set(bundle.results["condition"]) == {"tick-on", "nohz-full"}


# -- the plans, end to end in the lab host (make lab-host-test) -------------------------------------------------------
def _image_or_skip():
    if os.environ.get("TICKLAB_LAB_HOST_TESTS") != "1":
        pytest.skip("the lab host's plans take minutes of TCG boots each: make lab-host-test runs them")
    if os.geteuid() != 0 or shutil.which("qemu-system-x86_64") is None:
        pytest.skip("needs root and qemu-system-x86_64")
    if labhost.cached_host() is None:
        pytest.skip("no lab host image built for this recipe: make lab-host")


def _check_put_back(view: dict) -> None:
    """After any ending: the unit gone, grub's default untouched, no one-shot left, the machine on its own kernel."""
    final = view["final"]
    assert final is not None, "the check boot never came"
    assert not view["unit"] and not view["unit_link"] and not final["plan_unit"]
    assert view["grub_cfg_unchanged"] and not view["custom_cfg"]
    assert not [line for line in view["grubenv_after"] if line.startswith("next_entry=ticklab")]
    assert final["kexec_loaded"] == "0"
    original = view["plan"]["original"]
    assert final["release"] == original["release"]
    assert final["boot_words"] == [
        w for w in original["cmdline"].split() if not w.startswith(("BOOT_IMAGE=", "initrd="))
    ]
    assert final["boot_words"] and not any(w.startswith("nohz_full=") for w in final["boot_words"])


def _bundle_of(view: dict):
    assert len(view["bundles"]) == 1, view["bundles"]
    return load_bundle(Path(view["run_dir"]) / "guest" / "traces" / view["bundles"][0])


@pytest.mark.labhost
@pytest.mark.timeout(3 * 3600)  # minutes of TCG boots each; pytest's 600 s would kill QEMU mid-plan
@pytest.mark.parametrize("mode", ["kexec", "grub"])
def test_plan_abort_in_the_middle_puts_the_machine_back(mode):
    _image_or_skip()
    view = labhost.plan_run("nohz", mode, runs=2, warmup=0, abort_when_made=1, say=lambda text: None)
    plan = view["plan"]
    assert plan["state"] == "aborted"
    assert [r["state"] for r in plan["runs"]][:1] == ["made"] and sum(r["state"] == "made" for r in plan["runs"]) == 1
    _check_put_back(view)
    assert "aborted" in view["final"]["plan_status"]
    bundle = _bundle_of(view)
    assert bundle.sealed and bundle.manifest.boot_plan["state"] == "aborted"
    assert [r.status for r in bundle.manifest.runs] == ["ok"]


@pytest.mark.labhost
@pytest.mark.timeout(3 * 3600)  # minutes of TCG boots each; pytest's 600 s would kill QEMU mid-plan
def test_a_kernel_image_gone_before_the_next_boot_fails_the_plan_and_puts_the_machine_back():
    _image_or_skip()
    view = labhost.plan_run("nohz", "kexec", runs=2, warmup=0, hide_kernel_when_made=1, say=lambda text: None)
    plan = view["plan"]
    assert plan["state"] == "failed"
    failed = [r for r in plan["runs"] if r["state"] == "failed"]
    assert len(failed) == 1 and "missing" in failed[0]["why"] and "moved or removed since" in failed[0]["why"]
    _check_put_back(view)
    assert "failed" in view["final"]["plan_status"]
    bundle = _bundle_of(view)
    assert bundle.sealed and bundle.manifest.boot_plan["state"] == "failed"
    statuses = {r.run: r.status for r in bundle.manifest.runs}
    assert statuses[failed[0]["name"]] == "failed"


@pytest.mark.labhost
@pytest.mark.timeout(3 * 3600)  # minutes of TCG boots each; pytest's 600 s would kill QEMU mid-plan
def test_a_plan_stopped_mid_boot_and_resumed_makes_every_run_and_puts_the_machine_back():
    """Issue 53: QEMU stopped as Ctrl-C stops it, at the third boot (the second run's kexec'd kernel, before the plan's
    unit verified it), then ``--resume``: the plan goes on from the same disk, the run cut off is booted again, and
    nothing made before the stop is lost."""
    _image_or_skip()

    def stop_at_the_third_boot(text: str) -> None:
        if "ticklab-lab-job: before boot 3 " in text:
            raise KeyboardInterrupt

    with pytest.raises(labhost.HostPlanInterrupted) as caught:
        labhost.plan_run("nohz", "kexec", runs=2, warmup=0, say=stop_at_the_third_boot)
    run_dir = caught.value.run_dir
    assert (run_dir / "disk.raw").is_file() and f"--resume {run_dir}" in caught.value.resume
    said = []
    view = labhost.plan_run("nohz", "kexec", runs=2, warmup=0, resume="newest", say=said.append)
    assert view["run_dir"] == str(run_dir)
    plan = view["plan"]
    assert plan["state"] == "finished", plan
    states = [r["state"] for r in plan["runs"]]
    assert len(states) == 4 and states[0] == "made" and set(states) <= {"made", "failed"}
    # a run is failed only when it was being made as QEMU stopped ("the machine rebooted during the run")
    assert all("rebooted during the run" in r["why"] for r in plan["runs"] if r["state"] == "failed")
    if plan["runs"][1]["state"] == "made":  # it was still booting: the job booted it again
        assert any("booting it again" in line for line in said), said
    _check_put_back(view)
    bundle = _bundle_of(view)
    assert bundle.sealed and bundle.manifest.boot_plan["state"] == "finished"
    assert sum(r.status == "ok" for r in bundle.manifest.runs) == states.count("made")


REFUSED = """claim: nohz
name: host-boot-refused
description: a boot plan whose second condition names a root file system that does not exist (ticklab's lab host test)
runs: 1
warmup: 0
timeout_s: 120
seed: 1
requires: [root]
conditions:
  - {name: tick-on, kernel: running, boot: "-nohz_full"}
  - {name: no-root, kernel: running, boot: "root=UUID=00000000-0000-4000-8000-000000000000 rootdelay=2 panic=5"}
knobs:
  kernel: host_kernel
  boot: boot_cmdline
workload:
  tool: ftq
  argv: ["{tools}/ftq", "-q", "1000000", "-n", "500", "-w", "10", "-o", "{run_dir}/ftq.dat"]
"""


@pytest.mark.labhost
@pytest.mark.timeout(3 * 3600)  # minutes of TCG boots each; pytest's 600 s would kill QEMU mid-plan
@pytest.mark.parametrize("mode", ["kexec", "grub"])
def test_a_boot_the_kernel_refuses_ends_in_the_default_entry_and_fails_the_plan(mode):
    _image_or_skip()
    view = labhost.plan_run(
        "nohz",
        mode,
        experiment="runners/nohz/host-boot-refused.yaml",
        extra_files={"runners/nohz/host-boot-refused.yaml": REFUSED.encode()},
        say=lambda text: None,
    )
    plan = view["plan"]
    assert plan["state"] == "failed"
    refused = [r for r in plan["runs"] if r["condition"] == "no-root"]
    assert refused[0]["state"] == "failed" and "/proc/cmdline" in refused[0]["why"]
    _check_put_back(view)
    bundle = _bundle_of(view)
    assert bundle.sealed and bundle.manifest.boot_plan["state"] == "failed"
    assert [r.status for r in bundle.manifest.runs if r.condition == "no-root"] == ["failed"]


def test_the_timeline_names_each_boot_its_loader_and_the_plans_steps(tmp_path):
    (tmp_path / "console.timeline.tsv").write_text(
        "10.5\t[   30.1] python3[2]: ticklab-lab-job: before boot 1 (6.1.0-50-amd64, up 30.1 s): "
        "'BOOT_IMAGE=/boot/vmlinuz-6.1.0-50-amd64 root=UUID=1 ro'; plan None, 0 made\n"
        "11.0\t         Starting ticklab-lab-job-b…b (before the boot plan's unit)...\n"
        "12.0\t[   31.0] python3[3]: ticklab-lab-job: after boot 1 (6.1.0-50-amd64, up 31.0 s): 'x'; "
        "plan None, 0 made\n"
        "90.0\t[   80.0] python[9]: boot plan P: run run-001 (tick-on) made; 1 left\n"
        "91.0\t[   81.0] python[9]: run run-002 (nohz-full): kexec into /boot/vmlinuz-6.1.0-50-amd64 "
        "with 'ro nohz_full=1'\n"
        "150.2\t[   33.0] python3[2]: ticklab-lab-job: before boot 2 (6.1.0-50-amd64, up 33.0 s): "
        "'root=UUID=1 ro nohz_full=1 rcu_nocbs=1'; plan running, 1 made\n"
    )
    assert labhost.timeline(tmp_path) == [
        (10.5, "boot 1 (6.1.0-50-amd64, by grub): userspace after 30 s; plan None, 0 made"),
        (90.0, "boot plan P: run run-001 (tick-on) made; 1 left"),
        (91.0, "run run-002 (nohz-full): kexec into /boot/vmlinuz-6.1.0-50-amd64 with 'ro nohz_full=1'"),
        (150.2, "boot 2 (6.1.0-50-amd64, by kexec): userspace after 33 s; plan running, 1 made; nohz_full=1"),
    ]


# -- a kernel source named by its series ------------------------------------------------------------------------------
def test_host_plan_kernel_by_series_resolves_to_the_series_tarball(monkeypatch, tmp_path, capsys):
    from ticklab import cli
    from ticklab.lab import sources

    tarball = tmp_path / "linux-source-7.2.tar.xz"
    tarball.write_bytes(b"not read here")
    spec = sources.spec("7.2")
    monkeypatch.setattr(sources, "installed", lambda source: None)
    monkeypatch.setattr(
        sources,
        "fetched",
        lambda source: sources.Source(spec, "7.2.13-1", tarball, "fetched from X sid") if source == spec else None,
    )
    assert cli._kernel_source("7.2") == tarball
    assert (
        "kernel source 7.2: " + str(tarball) + " (linux-source-7.2 7.2.13-1, fetched from X sid)"
        in capsys.readouterr().err
    )
    assert cli._kernel_source("/usr/src/linux-source-6.12.tar.xz") == Path("/usr/src/linux-source-6.12.tar.xz")


def test_host_plan_kernel_series_not_in_sources_yaml_is_one_line(capsys):
    from ticklab.cli import main

    assert main(["lab", "host-plan", "hrtick", "--boot", "kexec", "--kernel", "9.9"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ticklab lab host-plan: no kernel source 9.9 in kernel/sources.yaml (have: ")
    assert "\n" not in err and "Traceback" not in err
