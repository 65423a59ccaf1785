"""`ticklab lab run <claim> --boot kexec`: a lab guest plays a real host through a whole boot plan.

One QEMU process, many boots. The guest boots the hz1000 lab kernel (CONFIG_KEXEC, kexec-tools in the image);
after every boot the image's init runs the share's ``after-boot.sh``, which keeps /var/lib/ticklab on the share
and runs ``python3 -m ticklab.lab.guest plan-start`` on the first boot and ``plan-resume`` on every later one:
the same plan engine (``ticklab.host.plan_engine``) a real host's systemd unit resumes, verifying each boot
(a new boot_id, the release, /proc/cmdline) and kexecing into the next run's command line. Each run is made
in its own boot with the capture code, as a lab job (``lab.guest.GuestPlanRuns``); the last kexecs back to the
original command line, whose boot finds the plan over and powers the guest off.

The host then builds the bundle through the capture session (``PlayedBackRuns``, an executor): the plan's order,
each run's raw files and result as the guest left them in the share, its record carrying the boot the plan
verified, a run the plan never made recorded failed with why. The guest has no pandas, so results are parsed
here, and the run count is fixed (``--runs``, default the experiment's). The bundle goes to
``traces/<guest host-id>-kexec/<claim>/``: a lab analogue of a real machine's boot plan (TCG distorts every
timing), made by the same code.
"""

from __future__ import annotations

import fnmatch
import json
import shutil
import tempfile
from pathlib import Path

from ..bundle import BundleWriter
from ..capture.boot_capture import boot_experiment, condition_words
from ..capture.experiment import Condition, Experiment, PlannedRun, expand_conditions
from ..capture.session import CapturePlan
from ..capture.stopping import StoppingRule
from ..host import collect, host_id
from ..paths import cache_dir
from ..registry import GUEST_BOOT_MODES
from . import image as guest_image
from . import kernel as lab_kernel
from . import qemu
from .cache import LabError
from .guest import PLAN_ID
from .run import LabOptions, add_guest_run, copy_from_share, guest_host_id, planning_facts, read_share_json, say

KERNEL = "hz1000"
BOOT_SECONDS = 60  # a generous bound on one TCG boot of the lab kernel (about 9 s here)

AFTER_BOOT = """mkdir -p /var/lib/ticklab /mnt/share/state /boot
mount -o bind /mnt/share/state /var/lib/ticklab
# the installed kernel a plan returns to at its end, as on a host
cp /mnt/share/bzImage /boot/vmlinuz-$(uname -r) && cp /mnt/share/initrd /boot/initrd.img-$(uname -r)
cd /tmp
echo "== boot $(cat /proc/sys/kernel/random/boot_id): $(cat /proc/cmdline)"
if [ ! -f /var/lib/ticklab/plans/lab/plan.json ]; then
    python3.11 -m ticklab.lab.guest plan-start /mnt/share
else
    python3.11 -m ticklab.lab.guest plan-resume /mnt/share
fi
sync
"""


def _words(experiment: Experiment, condition: Condition, smp: int) -> list[str]:
    """The condition's command-line words for a guest of ``smp`` vCPUs."""
    return condition_words(
        experiment, condition, {"last_cpu": smp - 1, "nproc": smp}, f"{experiment.path}: conditions.{condition.name}"
    )


def _kernel_variable(experiment: Experiment) -> str | None:
    return next((name for name, kind in experiment.knobs.items() if kind == "host_kernel"), None)


def plan_kernels(experiment: Experiment, conditions: list[Condition], first) -> dict:
    """Each condition's lab kernel: ``running`` is the guest's first kernel (``first``, hz1000); a release pattern
    (host-boot-kernels.yaml: "7.2.*") is matched against the built HZ=1000 lab kernel of every series, as a host
    matches /boot/vmlinuz-*: exactly one must match."""
    variable = _kernel_variable(experiment)
    wanted = {str(c.values.get(variable, "running")) for c in conditions}
    found = {"running": first}
    if wanted - {"running"}:
        candidates = [
            k
            for k in (lab_kernel.cached_kernel(name) for name in lab_kernel.kernel_names() if name.endswith(KERNEL))
            if k is not None
        ]
        for pattern in sorted(wanted - {"running"}):
            matches = [k for k in candidates if fnmatch.fnmatchcase(k.info["release"], pattern)]
            if len(matches) != 1:
                have = ", ".join(f"{k.variant} ({k.info['release']})" for k in candidates) or "none built"
                raise LabError(
                    f"{experiment.path}: kernel {pattern!r} matches {len(matches)} built lab kernels (have: "
                    f"{have}); build the one it names, e.g. ticklab lab build-kernel --variant 7.2-{KERNEL}"
                )
            found[pattern] = matches[0]
    return {c.name: found[str(c.values.get(variable, "running"))] for c in conditions}


def lab_boot_plan(claim: str, options: LabOptions, experiment_path: Path | None, mode: str = "kexec", log=say) -> Path:
    """Run a boot experiment's plan in one lab guest; the sealed bundle."""
    if mode not in GUEST_BOOT_MODES:
        raise LabError(f"--boot {mode}: a lab guest has no boot loader to drive; it plays a host with --boot kexec")
    experiment = boot_experiment(claim, experiment_path)
    smp = options.smp or 2
    qemu.require_qemu()
    kernel = lab_kernel.cached_kernel(KERNEL)
    if kernel is None:
        raise LabError(f"lab kernel {KERNEL} is not built: run 'ticklab lab build-kernel --variant {KERNEL}'")
    if "CONFIG_KEXEC=y" not in (kernel.directory / "config").read_text().splitlines():
        raise LabError(
            f"{kernel.directory}/config: built without CONFIG_KEXEC; rebuild it (ticklab lab build-kernel "
            f"--variant {KERNEL} --force)"
        )
    image = guest_image.build_image(say=log)
    accel, why = qemu.choose_accelerator(options.accel, kernel.image, image.initramfs, say=log)
    physical = collect()
    identity = guest_host_id(accel, {smp}, kernel.info["release"], physical)[:94].rstrip("-.") + "-kexec"
    conditions = expand_conditions(experiment, planning_facts(smp))
    kernels = plan_kernels(experiment, conditions, kernel)
    capture_plan = CapturePlan.of(experiment, conditions, options)
    planned = capture_plan.runs
    plan_job = {
        "backend": options.backend,
        "experiment": experiment.path.name,
        "runs": [
            {
                "run": p.run,
                "order": p.order,
                "warmup": p.warmup,
                "experiment": experiment.path.name,
                "kernel_file": f"bzImage-{kernels[p.condition.name].info['release']}",
                "release": kernels[p.condition.name].info["release"],
                "words": _words(experiment, p.condition, smp),
                "cmdline": [w for w in _words(experiment, p.condition, smp) if not w.startswith("-")],
                "condition": {"name": p.condition.name, "values": p.condition.values},
            }
            for p in planned
        ],
    }
    work = Path(tempfile.mkdtemp(prefix="bootplan-", dir=_scratch()))
    try:
        share = work / "share"
        (share / "raw").mkdir(parents=True)
        shutil.copy(kernel.image, share / "bzImage")
        for booted in {k.info["release"]: k for k in kernels.values()}.values():  # each condition's kernel, once
            shutil.copy(booted.image, share / f"bzImage-{booted.info['release']}")
        shutil.copy(image.initramfs, share / "initrd")
        shutil.copyfile(experiment.path, share / experiment.path.name)  # boot experiments keep their host-boot-* name
        (share / "plan-job.json").write_text(json.dumps(plan_job, indent=2) + "\n")
        (share / "after-boot.sh").write_text(AFTER_BOOT)
        timeout = (len(planned) + 1) * (BOOT_SECONDS + experiment.timeout_s)
        log(
            f"{claim}/{experiment.name}: {len(planned) + 1} boots of one {accel} guest, one run each and one back "
            f"to the original command line; at most {timeout} s"
        )
        outcome = qemu.run_boot(
            qemu.Boot(
                kernel.image,
                image.initramfs,
                share,
                work / "console.txt",
                cmdline=options.cmdline.split(),
                accel=accel,
                smp=smp,
                timeout_s=timeout,
            )
        )
        played = read_share_json(share / "state" / "plans" / PLAN_ID / "plan.json")
        if not played:
            log_tail = (
                (share / "after-boot.log").read_text(errors="replace")[-600:]
                if (share / "after-boot.log").is_file()
                else ""
            )
            raise LabError(
                f"the guest made no boot plan (QEMU {outcome['status']}); after-boot.log ends: "
                f"{' '.join(log_tail.split())}"
            )
        writer = capture_plan.open_bundle(options.out, identity, {})
        writer.manifest.lab = {
            "accelerator": accel,
            "why": why,
            "qemu": qemu.qemu_version(),
            "physical_host": physical,
            "physical_host_id": host_id(physical),
            "kernels": {k.variant: k.record() for k in [kernel, *kernels.values()]},
            "image": image.record(),
            "qemu_outcome": outcome,
            "smp": smp,
        }
        writer.manifest.boot_plan = {
            "mode": "kexec",
            "state": played.get("state"),
            "original": played.get("original"),
            "log": played.get("log", []),
            "played_by": "a lab guest (ticklab lab run --boot kexec)",
        }
        rule = StoppingRule([], None, "fixed run count (a lab guest's boot plan: the guest carries no analysis)")
        executor = PlayedBackRuns(experiment, share, played, smp, log)
        capture_plan.session(
            executor,
            writer,
            rule,
            what="lab boot plan",
            desc=f"{claim}/{experiment.name} (kexec)",
            progress=False,
            log=log,
        ).run()
        kept = writer.path / "raw" / "boot-plan"  # what the guest's plan did, for a reader of the bundle
        kept.mkdir(parents=True)
        copy_from_share(share / "after-boot.log", kept / "after-boot.log")
        copy_from_share(share / "state" / "plans" / PLAN_ID / "plan.json", kept / "plan.json")
        copy_from_share(work / "console.txt", kept / "console.txt")
        return writer.seal()
    finally:
        shutil.rmtree(work, ignore_errors=True)


class PlayedBackRuns:
    """The session's executor for runs a guest already made in its boot plan: each from the share, in order."""

    unit = "run"

    def __init__(self, experiment: Experiment, share: Path, played: dict, smp: int, log=say):
        self.experiment, self.share, self.smp, self.log = experiment, share, smp, log
        self.plan_runs = {r.get("name"): r for r in played.get("runs", []) if isinstance(r, dict)}
        self.ended = played.get("state")

    def make_run(self, writer: BundleWriter, planned: PlannedRun) -> bool:
        result = read_share_json(self.share / "runs" / f"{planned.run}.json")
        booted = self.plan_runs.get(planned.run) or {}
        boot = result.get("boot") or {
            "boot_id": booted.get("boot_id_found"),
            "release": booted.get("release_found"),
            "cmdline": booted.get("cmdline_found"),
        }
        if not result:
            why = booted.get("why") or f"the plan ended ({self.ended}) before this run"
            result = {"error": f"not made: {why}"}
        outcome = {
            "status": "ok" if "error" not in result else "failed",
            "exit": None,
            **boot,
            "kernel_release": boot.get("release"),
            "expected_cmdline": booted.get("cmdline"),
        }
        run_dir = writer.run_dir(planned.run)
        skipped = copy_from_share(self.share / "raw" / planned.run, run_dir)
        if skipped:
            self.log(f"{planned.run}: not copied from the guest's share (not regular files): {', '.join(skipped[:5])}")
        return add_guest_run(writer, self.experiment, planned, result, outcome, run_dir, self.smp, self.log)

    def after_runs(self, writer: BundleWriter, conditions: list[Condition]) -> None:
        pass


def _scratch() -> Path:
    """Scratch space in the cache (the share holds a kernel, an initramfs and the runs' raw files)."""
    directory = cache_dir() / "scratch"
    directory.mkdir(parents=True, exist_ok=True)
    return directory
