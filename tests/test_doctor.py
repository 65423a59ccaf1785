"""ticklab doctor on this machine: every check and every claim answers, with a reason."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from ticklab import doctor
from ticklab.capture import requirements
from ticklab.capture.experiment import experiment_paths, load_experiment
from ticklab.claimids import CLAIM_IDS as CLAIMS
from ticklab.doctor import diagnose, render
from ticklab.host import HostChanges, collect, facts

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="doctor's probes (tracefs, trace-cmd, perf) need root"),
    pytest.mark.xdist_group("machine"),
]


@pytest.mark.slow
def test_doctor_answers_every_check_and_claim_and_leaves_mounts_as_they_were():
    before = facts.mounts(Path("/"))
    report = diagnose()
    assert facts.mounts(Path("/")) == before
    for name in (
        "root",
        "tracefs",
        "trace-cmd record",
        "perf tracepoints",
        "clocksources",
        "cpuidle",
        "sched features (HRTICK)",
        "/dev/kvm",
        "lab guests under KVM",
        "qemu",
        "hackbench",
        "tbench",
        "ftq",
        "clockbench",
    ):
        assert report["checks"][name]["why"], name
    assert set(report["claims"]) == set(CLAIMS)
    for claim, experiments in report["claims"].items():
        for experiment in experiments.values():
            assert experiment["why"], claim
    host = report["host"]
    # What doctor says must agree with the host facts it read.
    assert report["checks"]["cpuidle"]["ok"] == (
        host["cpuidle"]["driver"] is not None and len(host["cpuidle"]["states"]) > 1
    )
    if not report["checks"]["trace-cmd record"]["ok"]:
        assert "falls back to tracefs" in report["checks"]["trace-cmd record"]["why"]
    assert "claim" in render(report) and "trace-cmd record" in render(report)


@pytest.mark.slow
def test_doctor_json_is_machine_readable():
    result = subprocess.run(
        [sys.executable, "-m", "ticklab.cli", "doctor", "--json"], capture_output=True, text=True, check=True
    )
    assert set(json.loads(result.stdout)) == {"host", "checks", "claims", "boot_plans"}


@pytest.mark.slow
def test_doctor_on_a_host_without_tracefs_says_so_and_goes_on(fake_host, tmp_path):
    """Issue 14, defect 8: no tracefs once escaped from the trace-cmd probe as a traceback."""
    report = diagnose(fake_host, journal=tmp_path / "j.json")
    assert not report["checks"]["tracefs"]["ok"]
    assert not report["checks"]["trace-cmd record"]["ok"] and "tracefs" in report["checks"]["trace-cmd record"]["why"]
    assert report["claims"]["nohz"]["ftq"]["runs"] is False


@pytest.mark.parametrize(
    "driver, states, runs",
    [
        ("haltpoll", ["POLL", "haltpoll"], False),  # a KVM guest: idle states, but not ACPI's (issue 41, item 3)
        ("intel_idle", ["POLL", "C1", "C1E", "C6"], False),  # MWAIT entry: never acpi_idle's I/O-port path
        ("acpi_idle", ["POLL", "C1", "C2"], True),
    ],
)
def test_acpi_idle_experiments_run_only_where_acpi_idle_is_the_cpuidle_driver(tmp_path, driver, states, runs):
    """doctor's row for an acpi-idle experiment is check_all of its requires: on another driver's states a capture
    would record them as acpi-idle data, so it is 'no', naming the driver."""
    from conftest import make_fake_host

    root = make_fake_host(tmp_path / "host", idle_states=tuple(states))
    (root / "sys/devices/system/cpu/cpuidle/current_driver").write_text(driver + "\n")
    host_facts = collect(root)
    with HostChanges(tmp_path / "j.json", root=root, log=lambda _: None) as host:
        for path in experiment_paths("acpi-idle"):
            experiment = load_experiment(path)
            assert "cpuidle_driver:acpi_idle" in experiment.requires, path
            unmet = requirements.check_all(experiment.requires, host, host_facts)[1]
            assert ("cpuidle_driver:acpi_idle" not in unmet) == runs, unmet
            if not runs:
                assert f"cpuidle driver is {driver}, not acpi_idle" in unmet["cpuidle_driver:acpi_idle"]
    ok, why = requirements.check("cpuidle_driver:acpi_idle", None, {"cpuidle": {"driver": None, "states": []}})
    assert not ok and "no cpuidle driver" in why


def test_kvm_rows_name_the_device_and_the_guest_boot_apart_from_what_the_host_is():
    """'/dev/kvm answers' is whether this host can run KVM guests; whether it is a VM is the head line's fact."""
    device = doctor.kvm_device()
    assert device[1].startswith(("/dev/kvm answers (KVM API", "no /dev/kvm", "/dev/kvm does not answer"))
    assert "guest" not in device[1].split(":")[0]
    assert doctor.kvm_guests((False, "no /dev/kvm: x")) == (False, "no /dev/kvm: x")
    assert (
        doctor.virtualization({"virtualization": {"hypervisor_flag": True, "detect_virt": "kvm"}})
        == "a virtual machine (hypervisor flag in /proc/cpuinfo; systemd-detect-virt: kvm)"
    )
    assert doctor.virtualization({"virtualization": {"hypervisor_flag": False, "detect_virt": None}}).startswith(
        "not a virtual machine"
    )


def test_doctor_lists_each_boot_plans_steps_here_or_why_it_cannot_run(tmp_path):
    """Issue 39 item 3: per boot experiment, the kernel builds this host needs and then the capture, or why not:
    /boot that does not boot the machine (a VMM's kernel), a clocksource the hardware lacks, an unmet requirement."""
    from conftest import make_fake_host
    from ticklab.doctor import boot_plan_steps

    root = make_fake_host(tmp_path / "host", clocksources=("tsc", "acpi_pm"))  # no HPET
    host_facts = collect(root)
    hz = load_experiment(REPO / "runners/nohz/host-boot-hz.yaml")
    hpet = load_experiment(REPO / "runners/hpet/host-boot-clock-read.yaml")
    with HostChanges(tmp_path / "j.json", root=root, log=lambda _: None) as host:
        hpet.requires = ["root"]  # the tool and tracefs rows are other checks' business here
        hz.requires = ["root"]
        vmm = boot_plan_steps(hz, host, host_facts, root)  # no /boot/vmlinuz-<running>: the kernel comes from outside
        assert not vmm["runs"] and "so /boot is not what boots this machine" in vmm["why"]
        (root / "boot").mkdir(exist_ok=True)
        (root / f"boot/vmlinuz-{host_facts['kernel_release']}").write_bytes(b"kernel")
        no_hpet = boot_plan_steps(hpet, host, host_facts, root)
        assert not no_hpet["runs"] and no_hpet["why"] == (
            "condition hpet-share-on boots with clocksource=hpet, and this machine has no hpet (available: acpi_pm tsc)"
        )
        steps = boot_plan_steps(hz, host, host_facts, root)
    assert steps["runs"] and steps["why"] == (
        "ticklab kernel build --host --source /usr/src/linux-source-6.12.tar.xz --localmodconfig; then "
        "ticklab kernel build --host --source /usr/src/linux-source-6.12.tar.xz --localmodconfig --fragment "
        "kernel/fragments/hz1000.config; then ticklab capture nohz --boot kexec "
        "--experiment runners/nohz/host-boot-hz.yaml"
    )
