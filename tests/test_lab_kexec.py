"""The lab guest can kexec (issue 18, the test bed of boot plans): a TCG guest of our lab kernel (CONFIG_KEXEC) with
Debian's kexec-tools in its initramfs loads its own kernel with one more command-line word and kexecs into it; the
second boot sees the new /proc/cmdline, nohz_full active and a new boot_id, and the 9p share carries state across.
Slow (~20-40 s under TCG); skipped without root, QEMU, a built lab kernel or the image tools."""

import os
import shutil

import pytest

from conftest import REPO, shortened_nohz_experiment
from ticklab.lab import image as guest_image
from ticklab.lab import kernel as lab_kernel
from ticklab.lab import qemu

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("guests")]


def kexec_kernel():
    if os.geteuid() != 0 or qemu.qemu_version() is None or not lab_kernel.SOURCE_TARBALL.is_file():
        pytest.skip("needs root, qemu-system-x86 and linux-source-6.12")
    kernel = lab_kernel.cached_kernel("hz1000")
    if kernel is None:
        pytest.skip("no built hz1000 lab kernel (ticklab lab build-kernel --variant hz1000)")
    if "CONFIG_KEXEC=y" not in (kernel.directory / "config").read_text().splitlines():
        pytest.skip(f"{kernel.directory}/config: built without CONFIG_KEXEC")
    if shutil.which("kexec") is None:
        pytest.skip("kexec-tools is not installed (apt-get install kexec-tools): the guest image takes its kexec")
    return kernel


def boot_with_share(tmp_path, after_boot: str, timeout_s: float, **files: str):
    """One TCG boot of the kexec-capable lab kernel; the share holds the kernel, the initramfs, the after-boot
    script and ``files``. (share, the Boot, QEMU's outcome)."""
    kernel = kexec_kernel()
    image = guest_image.build_image(say=lambda _: None)
    share = tmp_path / "share"
    share.mkdir()
    shutil.copy(kernel.image, share / "bzImage")
    shutil.copy(image.initramfs, share / "initrd")
    (share / "after-boot.sh").write_text(after_boot)
    for name, text in files.items():
        (share / name).write_text(text)
    boot = qemu.Boot(
        kernel.image, image.initramfs, share, tmp_path / "console.txt", accel="tcg", smp=2, timeout_s=timeout_s
    )
    return share, boot, qemu.run_boot(boot)


PLAN_AFTER_BOOT = """echo "$(cat /proc/sys/kernel/random/boot_id) $(cat /sys/devices/system/cpu/nohz_full)" >> /mnt/share/nohz_full.log
mkdir -p /var/lib/ticklab /mnt/share/state
mount -o bind /mnt/share/state /var/lib/ticklab
cd /tmp
if [ ! -d /var/lib/ticklab/plans ]; then
    python3.11 /mnt/share/make_plan.py
else
    python3.11 -m ticklab.cli plan resume
fi
sync
"""  # noqa: E501 (a shell script run in the guest, as written)

MAKE_PLAN = """import os
from ticklab.capture.experiment import Condition, schedule
from ticklab.host import plan_engine, plan_state
base = open("/proc/cmdline").read().strip()
words = {"tick": [], "nohz_full": ["nohz_full=1"]}
runs = [plan_state.BootRun(r.run, r.condition.name, "/mnt/share/bzImage", plan_state.condition_cmdline(base, words[r.condition.name]),
                               initrd="/mnt/share/initrd", release=os.uname().release)
        for r in schedule([Condition("tick", {}), Condition("nohz_full", {})], runs=2, warmup=0, seed=20261123)]
# a forced bad boot: this kernel cannot be the release the run expects, as after a panic into the default kernel
runs.append(plan_state.BootRun("run-005", "tick", "/mnt/share/bzImage", base, initrd="/mnt/share/initrd",
                                   release="0.0.0-forced-bad"))
plan = plan_engine.create(runs, mode="kexec", bundle="/mnt/share/bundle", plan_id="lab")
plan_engine.advance(plan.id)
"""  # noqa: E501 (a Python script run in the guest, as written)


def test_a_boot_plan_kexecs_the_lab_guest_through_interleaved_conditions(tmp_path):
    """The guest plays a real host: the plan's state lives on the share (its /var/lib/ticklab), each boot resumes it
    (init runs after-boot.sh; a host has the systemd unit), kexecs into the next condition, and the forced bad boot
    at the end fails its run and stops the plan with everything put back. Two runs of each condition, interleaved:
    kexec adds nohz_full=1 to the command line and takes it away again. Every boot is a new boot (a new boot_id),
    one per run, and its kernel applies the command line it was given (nohz_full active exactly in the nohz_full
    boots)."""
    import json

    from ticklab.capture.experiment import Condition, schedule

    share, boot, outcome = boot_with_share(tmp_path, PLAN_AFTER_BOOT, 500, **{"make_plan.py": MAKE_PLAN})
    log = (share / "after-boot.log").read_text(errors="replace") if (share / "after-boot.log").exists() else ""
    assert outcome["status"] == "ok", log + (tmp_path / "console.txt").read_text(errors="replace")[-2000:]
    plan = json.loads((share / "state/plans/lab/plan.json").read_text())
    assert plan["state"] == "failed", log
    assert plan["original"]["cmdline"] == boot.full_cmdline()  # the first boot has the command line QEMU gave it
    runs = plan["runs"]
    expected = [r.condition.name for r in schedule([Condition("tick", {}), Condition("nohz_full", {})], 2, 0, 20261123)]
    assert [r["condition"] for r in runs[:4]] == expected and sorted(set(expected)) == ["nohz_full", "tick"]
    # interleaved, not one condition's boots then the other's: nohz_full=1 comes and goes again
    assert sum(a != b for a, b in zip(expected, expected[1:], strict=False)) >= 2, expected
    assert [r["state"] for r in runs] == ["made"] * 4 + ["failed"], log
    boot_ids = [r["boot_id_found"] for r in runs]
    assert len(set(boot_ids)) == 5 and plan["original"]["boot_id"] not in boot_ids
    for run in runs[:4]:
        assert run["cmdline_found"] == run["cmdline"] and run["record"]["boot_id"] == run["boot_id_found"]
        # word for word: the original command line with the condition's word added, nothing else
        assert run["cmdline_found"] == boot.full_cmdline() + (" nohz_full=1" if run["condition"] == "nohz_full" else "")
    # each boot as the guest saw it (boot_id, /sys/devices/system/cpu/nohz_full): the original, then one per run
    seen = [(line.split(maxsplit=1) + [""])[:2] for line in (share / "nohz_full.log").read_text().splitlines()]
    assert [boot_id for boot_id, _ in seen] == [plan["original"]["boot_id"], *boot_ids], seen
    nohz = dict(seen)
    assert nohz[plan["original"]["boot_id"]].strip() in ("", "(null)")
    for run in runs[:4]:
        active = nohz[run["boot_id_found"]].strip()
        assert active in (("1",) if run["condition"] == "nohz_full" else ("", "(null)")), (run["condition"], active)
    assert runs[4]["why"].endswith("expected 0.0.0-forced-bad (a failed boot fell back to the default?)")
    assert not (share / "state/plans/lab/host-changes.json").exists()  # the unit, its link and the kexec load undone
    print(f"{len(runs) + 1} boots in {outcome['seconds']} s under TCG; order {expected}")


def test_lab_run_boot_kexec_makes_a_sealed_bundle_one_boot_per_run(tmp_path):
    """`ticklab lab run nohz --boot kexec`: one guest plays a host through the nohz boot experiment's plan (two
    conditions, one run each: the interleaving over rounds is the plan test's above, and the committed bundle's);
    the bundle the host builds has the runs in the planned order, each in its own boot (its own boot_id) with its
    condition's command line, and the plan's own record beside them."""
    from ticklab.bundle import load_bundle
    from ticklab.lab.guest_plan import lab_boot_plan
    from ticklab.lab.run import LabOptions

    kexec_kernel()
    experiment = shortened_nohz_experiment(REPO / "runners/nohz/host-boot-ftq.yaml", tmp_path)
    path = lab_boot_plan(
        "nohz", LabOptions(runs=1, warmup=0, out=tmp_path / "traces", accel="tcg"), experiment, log=lambda _: None
    )
    bundle = load_bundle(path)
    manifest = bundle.manifest
    assert path.parent.parent.name.endswith("-kexec") and manifest.boot_plan["state"] == "finished"
    runs = manifest.runs
    assert [r.run for r in runs] == [o["run"] for o in manifest.order]
    assert sorted(r.condition for r in runs) == ["nohz-full", "tick-on"]
    assert len({r.boot["boot_id"] for r in runs}) == 2 and all(r.status == "ok" for r in runs)
    for record in runs:
        booted = record.boot["cmdline"].split()
        assert record.boot["cmdline"] == record.boot["expected_cmdline"]
        assert ("nohz_full=1" in booted) == (record.condition == "nohz-full")
    rates = bundle.results[bundle.results["metric"] == "local_timer_irq_rate_hz"].groupby("condition")["value"].max()
    assert rates["nohz-full"] < 0.1 * rates["tick-on"]  # the tick stopped on the measured CPU in every nohz_full boot
    assert (path / "raw/boot-plan/plan.json").is_file()


def test_lab_run_boot_kexec_moves_between_the_6_12_and_7_2_lab_kernels(tmp_path):
    """hrtick's host boot experiment played by one lab guest (issue 25 item 6): each run kexecs into the lab kernel
    its condition's release pattern names (6.12.* or 7.2.*) and verifies the release it booted; HRTICK switched in
    each boot; a rearm count only where the kernel has the tracepoint."""
    import yaml

    from ticklab.bundle import load_bundle
    from ticklab.lab.guest_plan import lab_boot_plan
    from ticklab.lab.run import LabOptions

    kexec_kernel()
    if lab_kernel.cached_kernel("7.2-hz1000") is None:
        pytest.skip("no built 7.2-hz1000 lab kernel (ticklab lab build-kernel --variant 7.2-hz1000)")
    definition = yaml.safe_load((REPO / "runners/hrtick/host-boot-kernels.yaml").read_text())
    definition["workload"]["params"].update(loops=200, groups=2)
    # two of the four conditions (each boot under TCG is what this test's time goes to): a kexec from the 6.12
    # kernel into 7.2 and back, HRTICK on in one boot and off in the other
    definition["conditions"] = [
        c for c in definition["conditions"] if c["name"] in ("6.12 hrtick-on", "7.2 hrtick-off")
    ]
    path = tmp_path / "host-boot-kernels.yaml"
    path.write_text(yaml.safe_dump(definition, sort_keys=False))
    # ticklab's tracefs capture: the function filter is written before the tracer (see guest-hackbench.yaml)
    bundle_path = lab_boot_plan(
        "hrtick",
        LabOptions(runs=1, warmup=0, out=tmp_path / "traces", accel="tcg", backend="tracefs"),
        path,
        log=lambda _: None,
    )
    bundle = load_bundle(bundle_path)
    runs = bundle.manifest.runs
    assert bundle.manifest.boot_plan["state"] == "finished"
    assert sorted(r.condition for r in runs) == ["6.12 hrtick-on", "7.2 hrtick-off"]
    assert len({r.boot["boot_id"] for r in runs}) == 2 and all(r.status == "ok" for r in runs), runs
    for record in runs:
        assert record.boot["release"].startswith(record.condition.split()[0] + "."), record.boot
    rearms = bundle.results[bundle.results["metric"] == "hrtimer_rearms"]
    assert set(rearms["condition"]) == {"7.2 hrtick-off"}
