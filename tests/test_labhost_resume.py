"""A lab host run stopped part way (issue 53 item 2): its disk kept, with the command that resumes it; ``--resume``
boots that disk again and copies the bundle out, or refuses in one line. The QEMU boots are stand-ins here (the
run's preparation, boot and collection are replaced); the job driver's part is its own function, run on plan data.
The same path end to end in the lab host is tests/test_labhost.py's (make lab-host-test)."""

import importlib.util
import json
import os
import signal
from pathlib import Path

import pytest

from ticklab import cli
from ticklab.lab import labhost
from ticklab.lab.cache import LabError

REPO = Path(__file__).resolve().parents[1]
HPET = "runners/hpet/host-boot-clock-read.yaml"


class Boots:
    """Stand-ins for the run's steps that need root and QEMU: what each was asked to do."""

    def __init__(self, monkeypatch, tmp_path, boot):
        self.prepared, self.booted, self.marked = [], [], []
        self.progress = {"plan": {"id": "P", "state": "running", "runs": []}, "checked": False}
        self.boot = boot
        monkeypatch.setenv("TICKLAB_CACHE", str(tmp_path / "cache"))
        monkeypatch.setattr(
            labhost, "cached_host", lambda: labhost.HostImage("k", tmp_path / "image.raw", {"kernel": "6.1.0-50-amd64"})
        )
        monkeypatch.setattr(labhost, "labhost_id", lambda mode, accel, smp, release: f"guest-x-labhost-{mode}")
        monkeypatch.setattr(labhost, "prepare_run", self.prepare_run)
        monkeypatch.setattr(labhost, "boot_host", self.boot_host)
        monkeypatch.setattr(labhost, "collect", self.collect)
        monkeypatch.setattr(labhost, "guest_progress", lambda run_dir: self.progress)
        monkeypatch.setattr(labhost, "_mark_resume", lambda run_dir, what: self.marked.append(run_dir))

    def prepare_run(self, image, run_dir, job, say, extra_files=None, kernels=(), modules=None):
        (run_dir / "disk.raw").write_bytes(b"disk")
        self.prepared.append((run_dir, job))
        return []

    def boot_host(self, run_dir, data, timeout_s, accel="tcg", say=print):
        self.booted.append(run_dir)
        return self.boot(run_dir)

    def collect(self, run_dir):
        bundle = run_dir / "guest/traces/guest-x-labhost-kexec/hpet/B"
        bundle.mkdir(parents=True, exist_ok=True)
        (bundle / "manifest.json").write_text(json.dumps({"status": "sealed"}))
        return {"bundles": ["guest-x-labhost-kexec/hpet/B"], "plan": self.progress["plan"]}


def interrupted(run_dir):
    raise KeyboardInterrupt


def ok(run_dir):
    return {"status": "ok", "exit": 0, "seconds": 1.0, "accel": "tcg", "argv": []}


def hpet_run(**options):
    return labhost.plan_run("hpet", "kexec", experiment=HPET, say=lambda text: None, **options)


def test_an_interrupted_run_keeps_its_disk_and_names_the_command_that_resumes_it(monkeypatch, tmp_path):
    boots = Boots(monkeypatch, tmp_path, interrupted)
    out = tmp_path / "out"
    with pytest.raises(labhost.HostPlanInterrupted) as caught:
        hpet_run(out=out)
    run_dir = boots.prepared[0][0]
    assert caught.value.run_dir == run_dir and (run_dir / "disk.raw").read_bytes() == b"disk"
    assert caught.value.resume == (
        f"ticklab lab host-plan hpet --boot kexec --experiment {HPET} --out {out} --resume {run_dir}"
    )
    record = json.loads((run_dir / labhost.RUN_RECORD).read_text())
    assert (record["claim"], record["mode"], record["experiment"], record["runs"]) == ("hpet", "kexec", HPET, None)


def test_sigterm_stops_the_run_as_ctrl_c_does_in_one_line_with_the_resume_command(monkeypatch, tmp_path, capsys):
    def terminated(run_dir):
        os.kill(os.getpid(), signal.SIGTERM)  # what a service manager or a shutdown sends
        raise AssertionError("SIGTERM did not interrupt the run")

    boots = Boots(monkeypatch, tmp_path, terminated)
    before = signal.getsignal(signal.SIGTERM)
    code = cli.main(["lab", "host-plan", "hpet", "--boot", "kexec", "--experiment", HPET])
    run_dir = boots.prepared[0][0]
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 130
    assert err == (
        "ticklab lab host-plan: interrupted (received SIGTERM); QEMU stopped, the runs made are on the run's disk, "
        f"kept in {run_dir}; resume with: ticklab lab host-plan hpet --boot kexec --experiment {HPET} "
        f"--resume {run_dir}"
    )
    assert (run_dir / "disk.raw").is_file()
    assert signal.getsignal(signal.SIGTERM) == before  # put back after the command


def test_a_run_stopped_before_its_disk_was_prepared_leaves_nothing_to_resume(monkeypatch, tmp_path):
    boots = Boots(monkeypatch, tmp_path, ok)

    def cut(image, run_dir, job, say, extra_files=None, kernels=(), modules=None):
        (run_dir / "disk.raw").write_bytes(b"half a copy")
        raise KeyboardInterrupt

    monkeypatch.setattr(labhost, "prepare_run", cut)
    with pytest.raises(KeyboardInterrupt) as caught:
        hpet_run()
    assert not isinstance(caught.value, labhost.HostPlanInterrupted)
    assert not list(labhost.runs_dir().glob("*/disk.raw")) and not list(labhost.runs_dir().glob("*/host-run.json"))
    with pytest.raises(LabError, match="no kept lab host run of hpet --boot kexec --experiment"):
        hpet_run(resume="newest")
    assert boots.booted == []


def test_resume_with_no_kept_run_is_refused_in_one_line(monkeypatch, tmp_path):
    Boots(monkeypatch, tmp_path, ok)
    with pytest.raises(LabError) as caught:
        labhost.plan_run("nohz", "grub", resume="newest", say=lambda text: None)
    assert str(caught.value) == (
        f"{labhost.runs_dir()}: no kept lab host run of nohz --boot grub to resume (a run keeps its disk when it is "
        "interrupted, or with --keep-disk); nothing done"
    )


def test_resume_refuses_another_plans_run_and_a_directory_that_is_no_run(monkeypatch, tmp_path):
    boots = Boots(monkeypatch, tmp_path, interrupted)
    with pytest.raises(labhost.HostPlanInterrupted):
        hpet_run(runs=12)
    run_dir = boots.prepared[0][0]
    with pytest.raises(LabError) as caught:
        labhost.plan_run("nohz", "kexec", resume=run_dir, say=lambda text: None)
    assert str(caught.value) == (
        f"{run_dir}: another plan's run (claim 'hpet', not 'nohz'; experiment '{HPET}', not None); nothing done"
    )
    with pytest.raises(LabError, match=r"another plan's run \(runs 12, not 10\)"):
        hpet_run(runs=10, resume=run_dir)
    with pytest.raises(LabError, match="no kept lab host run of nohz --boot kexec to resume"):
        labhost.plan_run("nohz", "kexec", resume="newest", say=lambda text: None)
    with pytest.raises(LabError, match=r"not a lab host run ticklab kept \(no readable host-run.json\)"):
        hpet_run(resume=tmp_path)
    (run_dir / "disk.raw").unlink()
    with pytest.raises(LabError, match="its disk.raw is gone"):
        hpet_run(resume=run_dir)
    assert len(boots.booted) == 1


def test_resume_boots_the_kept_disk_again_and_copies_the_bundle_out(monkeypatch, tmp_path):
    boots = Boots(monkeypatch, tmp_path, interrupted)
    out = tmp_path / "out"
    with pytest.raises(labhost.HostPlanInterrupted):
        hpet_run(runs=12, out=out)
    run_dir = boots.prepared[0][0]
    boots.boot = ok
    said = []
    view = labhost.plan_run("hpet", "kexec", experiment=HPET, resume="newest", out=out, say=said.append)
    assert len(boots.prepared) == 1  # the disk is not made again
    assert boots.marked == [run_dir] and boots.booted == [run_dir, run_dir]
    assert (out / "guest-x-labhost-kexec/hpet/B/manifest.json").is_file()
    assert view["run_dir"] == str(run_dir) and view["qemu"]["status"] == "ok"
    assert not (run_dir / "disk.raw").exists()  # done: the copy of the image goes
    assert said[0] == f"lab host run: resuming {run_dir}: plan P running: 0 made, 0 failed, 0 left"


def test_resume_of_a_plan_that_had_ended_and_was_checked_only_copies_the_bundle(monkeypatch, tmp_path):
    boots = Boots(monkeypatch, tmp_path, interrupted)
    with pytest.raises(labhost.HostPlanInterrupted):
        hpet_run(keep_disk=True)  # kept anyway
    run_dir = boots.prepared[0][0]
    boots.progress = {"plan": {"id": "P", "state": "finished", "runs": [{"state": "made"}] * 3}, "checked": True}
    view = hpet_run(resume=run_dir, out=tmp_path / "out")
    assert boots.booted == [run_dir] and boots.marked == []  # not booted again
    assert view["qemu"]["status"].startswith("not booted again")
    assert (tmp_path / "out/guest-x-labhost-kexec/hpet/B").is_dir()


def test_a_run_in_use_is_not_resumed_meanwhile(monkeypatch, tmp_path):
    boots = Boots(monkeypatch, tmp_path, interrupted)
    with pytest.raises(labhost.HostPlanInterrupted):
        hpet_run()
    run_dir = boots.prepared[0][0]
    with labhost._run_lock(run_dir), pytest.raises(LabError, match="in use by another 'ticklab lab host-plan'"):
        hpet_run(resume=run_dir)


def test_what_the_stopped_disk_holds_is_said_with_what_the_resume_does():
    run = {"name": "run-008", "condition": "tsc-reference"}
    plan = {"id": "P", "state": "running", "runs": [{"state": "made"}] * 7 + [{**run, "state": "booting"}]}
    assert labhost.progress_words({"plan": plan}) == (
        "plan P running: 7 made, 0 failed, 0 left; run run-008 (tsc-reference) was booting: the job boots it again"
    )
    plan["runs"][-1]["state"] = "booted"
    assert labhost.progress_words({"plan": plan}).endswith(
        "was being made: the plan records it failed (cut short) and goes on"
    )
    assert labhost.progress_words({"plan": None}).startswith("no plan made yet")


def test_the_jobs_boot_limit_covers_every_run_the_plan_may_make():
    # hrtick's stopping rule may go to its budget's max_runs (30) in each of 4 conditions, one warm-up each
    assert labhost.max_boots({"claim": "hrtick", "experiment": "runners/hrtick/host-boot-kernels.yaml"}) == 4 * 31 + 12
    # a fixed count: no rounds
    fixed = {"claim": "hrtick", "experiment": "runners/hrtick/host-boot-kernels.yaml", "runs": 20, "warmup": 0}
    assert labhost.max_boots(fixed) == 4 * 20 + 12
    assert labhost.max_boots({"claim": "nohz", "experiment": None, "runs": 3, "warmup": 0}) == 60


# -- the job driver in the disk: the first boot after a resume ---------------------------------------------------------
def job_driver():
    spec = importlib.util.spec_from_file_location("lab_host_job", REPO / "runners/vm/lab-host-job.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def a_plan(mode, state="booting", kernel="6.12.117-ticklab-abc"):
    return {
        "id": "20261129T010203Z",
        "mode": mode,
        "state": "running",
        "original": {"release": "6.1.0-50-amd64", "cmdline": "BOOT_IMAGE=/boot/vmlinuz-6.1.0-50-amd64 root=UUID=1 ro"},
        "runs": [
            {"name": "run-001", "condition": "a", "kernel": kernel, "cmdline": "root=UUID=1 ro x=1", "state": "made"},
            {
                "name": "run-002",
                "condition": "b",
                "kernel": kernel,
                "release": kernel,
                "cmdline": "root=UUID=1 ro clocksource=tsc",
                "state": state,
            },
        ],
    }


DEFAULT_BOOT = ("6.1.0-50-amd64", "BOOT_IMAGE=/boot/vmlinuz-6.1.0-50-amd64 root=UUID=1 ro")


def test_after_a_resume_a_run_cut_off_mid_kexec_is_kexecd_again_with_its_kernel_and_command_line():
    driver = job_driver()
    state = {"boots": 9}
    commands = driver.resumed_boot({"resumes": 1}, state, a_plan("kexec"), *DEFAULT_BOOT)
    assert commands == [
        ["kexec", "-l", "/boot/vmlinuz-6.12.117-ticklab-abc", "--append", "root=UUID=1 ro clocksource=tsc"],
        ["systemctl", "--no-block", "kexec"],
    ]
    assert state["resumes_seen"] == 1
    # once per resume: the boot after it is the plan's to judge
    assert driver.resumed_boot({"resumes": 1}, state, a_plan("kexec"), *DEFAULT_BOOT) == []


def test_after_a_resume_a_grub_run_whose_one_shot_was_spent_gets_the_plans_entry_again():
    driver = job_driver()
    commands = driver.resumed_boot({"resumes": 2}, {"resumes_seen": 1}, a_plan("grub"), *DEFAULT_BOOT)
    assert commands == [["grub-reboot", "ticklab-plan-20261129T010203Z"], ["systemctl", "--no-block", "reboot"]]


def test_after_a_resume_nothing_is_booted_again_unless_a_run_was_cut_off_mid_boot():
    driver = job_driver()
    # a run being made: the plan records it cut short and goes on
    assert driver.resumed_boot({"resumes": 1}, {}, a_plan("kexec", state="booted"), *DEFAULT_BOOT) == []
    # the run's own boot came up (grub's one-shot was still set)
    own = ("6.12.117-ticklab-abc", "BOOT_IMAGE=/boot/vmlinuz-6.12.117-ticklab-abc root=UUID=1 ro clocksource=tsc")
    assert driver.resumed_boot({"resumes": 1}, {}, a_plan("grub"), *own) == []
    # no resume: a wrong boot is the plan's to judge (it ends the plan)
    assert driver.resumed_boot({}, {}, a_plan("kexec"), *DEFAULT_BOOT) == []
    # the plan had ended
    ended = {**a_plan("kexec"), "state": "finished"}
    assert driver.resumed_boot({"resumes": 1}, {}, ended, *DEFAULT_BOOT) == []
    # a 'running' kernel boots the plan's original release
    running = a_plan("kexec", kernel="running")
    del running["runs"][1]["release"]
    assert driver.resumed_boot({"resumes": 1}, {}, running, "6.1.0-50-amd64", "root=UUID=9 ro")[0][:3] == [
        "kexec",
        "-l",
        "/boot/vmlinuz-6.1.0-50-amd64",
    ]


def test_the_run_cut_off_is_booted_again_by_the_jobs_commands_and_the_plans_unit_held_back(monkeypatch, capsys):
    driver = job_driver()
    ran, slept = [], []
    monkeypatch.setattr(driver, "run", lambda argv, cwd=None: ran.append(argv) or 0)
    monkeypatch.setattr(driver.time, "sleep", slept.append)
    plan = a_plan("kexec")
    commands = driver.resumed_boot({"resumes": 1}, {}, plan, *DEFAULT_BOOT)
    assert driver.boot_again(commands, plan, limit_s=0) == 0
    assert ran == commands
    assert capsys.readouterr().out.splitlines()[0] == (
        "ticklab-lab-job: resumed by the host: run run-002 (b) was booting when QEMU stopped; booting it again"
    )
    # a command that fails leaves the boot to the plan's resume (which ends the plan: a wrong boot)
    monkeypatch.setattr(driver, "run", lambda argv, cwd=None: ran.append(argv) or 1)
    assert driver.boot_again(commands, plan, limit_s=3600) == 0 and not slept
    assert "failed: the plan's resume will judge this boot" in capsys.readouterr().out
