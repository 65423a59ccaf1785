"""`ticklab lab run <claim>`: an experiment's runs, each in its own boot of a lab guest, into one sealed bundle.

The host plans the runs exactly as `ticklab capture` does (warm-ups, then blocks in a seeded order), boots
the lab kernel of each run's condition with its command line under QEMU, and leaves the job, the
experiment file and an empty raw directory in a 9p share. Inside, :mod:`ticklab.lab.guest` makes the
run with the capture code, compares /proc/cmdline, the lab switches and the clocksource with the condition
(``boot_mismatch``), and writes the run back through the share; the host then moves it into the bundle,
makes a mismatch the run's ``problem``, and parses the results.
Bundles go to traces/<guest host-id>/<claim>/ where the host-id names the guest, the accelerator,
the kernel and the physical host. An interrupt kills the guest, removes the share, and leaves the
bundle ``incomplete`` with the runs it finished.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from ..bundle import BundleWriter
from ..capture import interference
from ..capture.execute import workload_values
from ..capture.experiment import (
    Condition,
    Experiment,
    ExperimentError,
    PlannedRun,
    expand_conditions,
    experiment_paths,
    load_experiment,
)
from ..capture.session import CapturePlan, add_run, check_counts
from ..host import collect, host_id, interrupting_signals
from ..paths import cache_dir, traces_dir
from ..registry import KVM
from . import image as guest_image
from . import kernel as lab_kernel
from . import qemu
from .cache import LabError

DEFAULT_LAB = {
    "kernel": "hz1000",
    "smp": 2,
    "memory_mb": 1024,
    "cmdline": "",
    "accel": "any",
    "boot_timeout_s": 300,
    "pin_vcpus": False,
    "backend": "auto",
    "acpi_tables": [],
}


@dataclass
class LabOptions:
    runs: int | None = None
    warmup: int | None = None
    seed: int | None = None
    budget_s: float | None = None
    out: Path | None = None
    accel: str = "auto"
    smp: int | None = None
    cmdline: str = ""
    backend: str = "auto"
    progress: bool = True
    build: bool = True
    goals: list | None = None  # the claim's stopping.PrecisionGoal s (None: none given, a fixed run count)
    supersedes: tuple[Path, ...] = ()  # bundles this recapture replaces (recorded in its manifest; see CapturePlan)


def lab_settings(experiment: Experiment) -> dict:
    """The experiment's lab section over the defaults."""
    return {**DEFAULT_LAB, **experiment.lab}


def lab_experiments(claim: str) -> list[Path]:
    return [p for p in experiment_paths(claim) if load_experiment(p).lab is not None]


def _knob(experiment: Experiment, kind: str) -> str | None:
    return next((variable for variable, k in experiment.knobs.items() if k == kind), None)


def boot_settings(experiment: Experiment, condition: Condition, options: LabOptions) -> dict:
    """What a run of ``condition`` boots with: kernel variant, vCPUs, command-line words, clocksource."""
    lab = lab_settings(experiment)
    values = condition.values
    kernel_var, smp_var, cmdline_var = (_knob(experiment, k) for k in ("lab_kernel", "lab_smp", "boot_cmdline"))
    words = [
        *str(lab["cmdline"] or "").split(),
        *(str(values[cmdline_var]).split() if cmdline_var in values else []),
        *options.cmdline.split(),
    ]
    clocksource = next((w.split("=", 1)[1] for w in reversed(words) if w.startswith("clocksource=")), None)
    smp = (
        vcpu_count(values[smp_var], f"{experiment.path}: conditions.{smp_var}")
        if smp_var in values
        else int(options.smp or lab["smp"])
    )
    return {
        "kernel": str(values[kernel_var]) if kernel_var in values else str(lab["kernel"]),
        "smp": smp,
        "memory_mb": int(lab["memory_mb"]),
        "cmdline": words,
        "clocksource": clocksource,
    }


def experiment_kernels(experiment: Experiment) -> list[str]:
    """The lab kernels an experiment's conditions boot (its lab section's, or each condition's ``lab_kernel``)."""
    lab = lab_settings(experiment)
    conditions = expand_conditions(experiment, planning_facts(int(lab["smp"]) if str(lab["smp"]).isdigit() else 1))
    return sorted({boot_settings(experiment, c, LabOptions())["kernel"] for c in conditions})


def host_cpus() -> int:
    """The CPUs QEMU's vCPU threads may run on here."""
    return len(os.sched_getaffinity(0))


def vcpu_count(value, source: str) -> int:
    """A lab_smp value: a vCPU count, or "<k>x", k times this host's CPUs (overcommit that scales with the host)."""
    text = str(value).strip()
    try:
        count = round(float(text[:-1]) * host_cpus()) if text.endswith("x") else int(text)
    except ValueError:
        raise ExperimentError(
            f"{source}: {value!r} is neither a vCPU count nor a multiple of the host's CPUs like '1.5x'"
        ) from None
    if count < 1:
        raise ExperimentError(f"{source}: {value!r} gives {count} vCPUs")
    return count


def planning_facts(smp: int) -> dict:
    """What condition expansion may ask of the guest before it has booted (nproc is the vCPU count)."""
    return {
        "nproc": smp,
        "online_cpus": list(range(smp)),
        "clocksources": {"available": [], "current": None},
        "cpuidle": {"driver": None, "states": []},
    }


def guest_host_id(accel: str, smp_values: set[int], release: str, physical: dict, tables: Sequence[str] = ()) -> str:
    """guest-<accel>-<vCPUs>vcpu-<kernels>[-<extra ACPI tables>]-on-<physical host id>: a guest given extra ACPI
    tables (acpi-idle's SSDT with I/O-port C-states) is another setup, and its name says so."""
    vcpus = "-".join(str(n) for n in sorted(smp_values))
    tagged = "".join(f"-{Path(table).stem}" for table in tables)
    identity = f"guest-{accel}-{vcpus}vcpu-{release}{tagged}-on-{host_id(physical)}".lower()
    return "".join(c if c.isalnum() or c in "._-" else "-" for c in identity)[:100].rstrip("-.")


def say(message: str) -> None:
    """What a lab run tells its user, on stderr (stdout stays free for what a command prints as its result)."""
    print(message, file=sys.stderr, flush=True)


class LabRun:
    def __init__(self, experiment: Experiment, options: LabOptions, log=say):
        self.experiment, self.options, self.log = experiment, options, log
        self.writer: BundleWriter | None = None

    def _machines(self, settings: dict) -> None:
        """The kernels the conditions boot, the guest image, and the accelerator (building what is missing)."""
        options = self.options
        qemu.require_qemu()
        variants = sorted({s["kernel"] for s in settings.values()})
        missing = [v for v in variants if lab_kernel.cached_kernel(v) is None]
        cached = [v for v in variants if v not in missing]
        if cached:
            self.log(
                f"lab kernel{'s' if len(cached) > 1 else ''} {', '.join(cached)}: cached in "
                f"{lab_kernel.shown_dir(cache_dir() / 'kernels')}"
            )
        if missing and options.build:
            self.log(lab_kernel.build_announcement(missing, no_build_hint=True))
        build = lab_kernel.build_kernel if options.build else _cached_kernel
        self.kernels = {
            variant: build(variant, progress=options.progress, say=self.log, announce=False) for variant in variants
        }
        self.image = guest_image.build_image(say=self.log)
        tables = list(lab_settings(self.experiment)["acpi_tables"])
        self.acpi_tables = [qemu.compile_acpi_table(table) for table in tables]
        if tables:
            self.log(f"ACPI tables for the guests: {', '.join(tables)} (iasl; -acpitable)")
        first = next(iter(self.kernels.values()))
        self.accel, self.accel_why = qemu.choose_accelerator(
            options.accel, first.image, self.image.initramfs, say=self.log
        )

    def run(self) -> Path:
        experiment, options, lab = self.experiment, self.options, lab_settings(self.experiment)
        conditions = expand_conditions(experiment, planning_facts(int(options.smp or lab["smp"])))
        if not conditions:
            raise ExperimentError(f"{experiment.path}: no conditions")
        planned = CapturePlan.of(experiment, conditions, options)
        settings = {c.name: boot_settings(experiment, c, options) for c in conditions}
        self._machines(settings)
        kernels, image, accel, accel_why = self.kernels, self.image, self.accel, self.accel_why
        physical = collect()
        releases = sorted({k.info["release"] for k in kernels.values()})
        identity = guest_host_id(
            accel, {s["smp"] for s in settings.values()}, "+".join(releases), physical, lab["acpi_tables"]
        )
        rule = planned.stopping_rule(options)
        # the guest's facts, requirements and tracing come with its first boot (LabExecutor.make_run)
        writer = self.writer = planned.open_bundle(options.out or traces_dir(), identity, {})
        manifest = writer.manifest
        manifest.lab = {
            "accelerator": accel,
            "why": accel_why,
            "qemu": qemu.qemu_version(),
            "physical_host": physical,
            "physical_host_id": host_id(physical),
            "kernels": {v: k.record() for v, k in kernels.items()},
            "image": image.record(),
            "boot": settings,
            **({"acpi_tables": [table.record() for table in self.acpi_tables]} if self.acpi_tables else {}),
        }
        if lab["accel"] == KVM.name and accel != KVM.name:
            manifest.not_testable = f"needs KVM (a guest that really boots under it): {accel_why}"
            self.log(f"{experiment.claim}/{experiment.name}: not testable on this host — {manifest.not_testable}")
            return writer.seal()
        writer.flush()
        if not options.progress:
            warmups = sum(p.warmup for p in planned.runs)
            self.log(
                f"{experiment.claim}/{experiment.name} ({accel}): {len(planned.runs)} boot(s), {warmups} of them "
                f"warm-up, one guest each (more if the stopping rule asks)"
            )
        executor = LabExecutor(experiment, options, kernels, image, accel, settings, self.log)
        executor.acpi_tables = tuple(table.aml for table in self.acpi_tables)
        with interrupting_signals():
            planned.session(
                executor,
                writer,
                rule,
                what="lab run",
                desc=f"{experiment.claim}/{experiment.name} ({accel})",
                progress=options.progress,
                log=self.log,
            ).run()
        self.log(
            f"{experiment.claim}/{experiment.name}: sealing the bundle (compressing raw files, hashing every file)"
        )
        return writer.seal()


class LabExecutor:
    """Makes each run in its own boot of a lab guest (the session's :class:`~ticklab.capture.session.Executor`):
    the condition's kernel, vCPUs and command line (``settings``), the job in a 9p share, the guest running the
    capture code; after the runs, each once-per-condition cross-check in a boot of its own."""

    unit = "boot"
    acpi_tables: tuple[Path, ...] = ()  # compiled tables every boot gets (the experiment's lab.acpi_tables)

    def __init__(
        self, experiment: Experiment, options: LabOptions, kernels: dict, image, accel: str, settings: dict, log=say
    ):
        self.experiment, self.options, self.kernels, self.image, self.accel = experiment, options, kernels, image, accel
        self.settings, self.log = settings, log

    def make_run(self, writer: BundleWriter, planned: PlannedRun) -> bool:
        return self._one_boot(writer, planned, self.settings[planned.condition.name])

    def after_runs(self, writer: BundleWriter, conditions: list[Condition]) -> None:
        if self.experiment.extras_per_condition():
            self._extras(writer, conditions, self.settings)

    def _boot(self, writer: BundleWriter, directory: str, job: dict, setting: dict) -> tuple[dict, dict, Path]:
        """One guest boot running ``job``; (QEMU outcome, the guest's result.json, raw/<directory> in the bundle)."""
        experiment = self.experiment
        lab = lab_settings(experiment)
        with tempfile.TemporaryDirectory(prefix="ticklab-lab-") as share_name:
            share = Path(share_name)
            (share / "raw").mkdir()
            shutil.copyfile(experiment.path, share / "experiment.yaml")
            kernel = self.kernels[setting["kernel"]]
            backend = self.options.backend if self.options.backend != "auto" else str(lab["backend"])
            job = {
                **job,
                "run": directory,
                "backend": backend,
                "cmdline": setting["cmdline"],
                "clocksource": setting["clocksource"],
                "kernel_release": kernel.info["release"],
            }
            (share / "job.json").write_text(json.dumps(job, indent=2) + "\n")
            boot = qemu.Boot(
                kernel.image,
                self.image.initramfs,
                share,
                share / "console.log",
                cmdline=setting["cmdline"],
                accel=self.accel,
                smp=setting["smp"],
                memory_mb=setting["memory_mb"],
                timeout_s=float(lab["boot_timeout_s"]) + experiment.timeout_s,
                boot_timeout_s=float(lab["boot_timeout_s"]),
                pin_vcpus=bool(lab["pin_vcpus"]),
                acpi_tables=self.acpi_tables,
            )
            # the physical host's load while the guest runs: a TCG guest's vCPUs compete with every host task
            with interference.Sampler() as host_load:
                outcome = qemu.run_boot(boot)
            result = read_share_json(share / "result.json")
            run_dir = writer.run_dir(directory)
            skipped = copy_from_share(share / "raw" / directory, run_dir)
            for name in ("console.log", "guest.log"):
                skipped += copy_from_share(share / name, run_dir / name)
            if skipped:
                self.log(
                    f"{directory}: not copied from the guest's share (not regular files): {', '.join(skipped[:5])}"
                )
        # each run's kernel: the lab kernel's name, the release it booted, the source package it was built from
        outcome = {
            **outcome,
            "kernel": setting["kernel"],
            "kernel_release": kernel.info["release"],
            "kernel_source": kernel.info.get("source"),
            "interference": host_load.summary(),
        }
        return outcome, result, run_dir

    def _one_boot(self, writer: BundleWriter, planned, setting: dict) -> bool:
        """Boot for one planned run; False when the guest says the experiment is not testable there."""
        job = {
            "order": planned.order,
            "warmup": planned.warmup,
            "condition": {"name": planned.condition.name, "values": planned.condition.values},
        }
        outcome, result, run_dir = self._boot(writer, planned.run, job, setting)
        return add_guest_run(writer, self.experiment, planned, result, outcome, run_dir, setting["smp"], self.log)

    def _extras(self, writer: BundleWriter, conditions: list[Condition], settings: dict) -> None:
        """Each cross-check once per condition, each in its own boot; outside results.csv."""
        experiment, progress = self.experiment, self.options.progress
        once = experiment.extras_per_condition()
        names = ", ".join(extra["name"] for extra in once)
        boots = len(once) * len(conditions)
        self.log(
            f"{experiment.claim}/{experiment.name}: cross-check{'s' if len(once) > 1 else ''} "
            f"{names}: {boots} more boot(s), one per condition"
        )
        done = []
        with tqdm(
            total=boots,
            desc=f"{experiment.claim}/{experiment.name} cross-checks",
            unit="boot",
            disable=not progress,
            file=sys.stderr,
        ) as bar:
            for extra in once:
                for index, condition in enumerate(conditions):
                    done.append(self._extra(writer, extra, index, condition, settings))
                    writer.manifest.extras = done
                    writer.flush()
                    bar.update()

    def _extra(self, writer: BundleWriter, extra: dict, index: int, condition: Condition, settings: dict) -> dict:
        """One cross-check boot: its entry in the manifest's extras."""
        directory = f"extra-{extra['name']}-{index + 1:03d}"
        job = {
            "order": None,
            "warmup": False,
            "extra": extra["name"],
            "condition": {"name": condition.name, "values": condition.values},
        }
        outcome, result, run_dir = self._boot(writer, directory, job, settings[condition.name])
        entry = result.get("extra") or {
            "name": extra["name"],
            "condition": condition.name,
            "status": "failed",
            "problem": _no_result(result, outcome, run_dir),
        }
        return {**entry, "directory": directory, "guest": guest_summary(result.get("facts") or {}), "boot": outcome}


def add_guest_run(
    writer: BundleWriter, experiment: Experiment, planned, result: dict, outcome: dict, run_dir: Path, smp: int, log=say
) -> bool:
    """A run the guest made (its result.json, the boot's ``outcome``) into the bundle; False when the guest said
    the experiment is not testable there. ``outcome["interference"]``, when present, is the physical host's."""
    manifest = writer.manifest
    if result.get("facts") and not manifest.host:
        manifest.host = result["facts"]
        manifest.tracing = {**(result.get("tracing") or {}), "events": (experiment.trace or {}).get("events", [])}
        manifest.requirements = result.get("requirements", {})
    if result.get("not_testable"):
        manifest.host = result.get("facts") or manifest.host
        manifest.requirements = result.get("requirements", {})
        manifest.not_testable = result["not_testable"]
        log(f"{experiment.claim}/{experiment.name}: not testable in the guest — {result['not_testable']}")
        return False
    record = result.get("record")
    if record is None:
        record = {
            "run": planned.run,
            "condition": planned.condition.name,
            "order": planned.order,
            "warmup": planned.warmup,
            "values": planned.condition.values,
            "argv": [],
            "start": None,
            "end": None,
            "exit_status": None,
            "status": "failed",
            "knobs": [],
            "trace": None,
            "problem": _no_result(result, outcome, run_dir),
        }
    facts = result.get("facts") or {}
    record["guest"] = guest_summary(facts)
    # the run's interference is the physical host's, sampled around the boot; the guest's own view is kept beside it
    record["guest_interference"] = record.pop("interference", None)
    record["interference"] = outcome.pop("interference", None)
    record["boot"] = outcome
    if record.get("boot_mismatch"):
        record["problem"] = "; ".join(record["boot_mismatch"])
    values = workload_values(experiment, planned.condition, facts or planning_facts(smp))
    add_run(writer, experiment, record, values, log)
    return True


def guest_summary(facts: dict) -> dict:
    """What a run's record keeps of the guest it ran in: enough to check it booted as the condition asked."""
    return {
        "cmdline": facts.get("cmdline"),
        "kernel": facts.get("kernel_release"),
        "clocksource": (facts.get("clocksources") or {}).get("current"),
        "hz": (facts.get("kernel_config") or {}).get("hz"),
        "nproc": facts.get("nproc"),
        "switches": facts.get("lab_switches"),
    }


def _no_result(result: dict, outcome: dict, run_dir: Path) -> str:
    crash = guest_crash(run_dir / "console.log")
    return result.get("error") or (
        f"the guest wrote no result (boot {outcome['status']}, exit {outcome['exit']}"
        + (f"; {outcome['why']}" if outcome.get("why") else "")
        + (
            f"; its kernel {crash}"
            if crash.startswith("stalled")
            else f"; its kernel crashed: {crash}"
            if crash
            else ""
        )
        + f"; see {run_dir / 'console.log'})"
    )


_CRASH = re.compile(r"\]\s+((?:Oops|BUG|Kernel panic)\b.*|RIP: \S+)$")
# the kernel's stall detectors print a RIP too, in an NMI backtrace of a CPU that is stuck, not crashed
_STALL = re.compile(
    r"\]\s+(rcu: INFO: \S+ detected stalls on CPUs/tasks|watchdog: BUG: soft lockup\b.*|"
    r"INFO: task \S+ blocked for more than \d+ seconds)"
)


def guest_crash(console: Path) -> str:
    """The guest kernel's own words when it crashed (its Oops/BUG line, the RIP, the panic), from the console log;
    when a stall detector printed the RIP (an NMI backtrace of a stuck CPU), "stalled" with the detector's line."""
    try:
        text = console.read_text(errors="replace")[-200_000:]
    except OSError:
        return ""
    found = []
    stall = None
    for line in text.splitlines():
        stalled = _STALL.search(line.strip())
        if stalled and stall is None:
            stall = stalled.group(1)
        match = _CRASH.search(line.strip())
        if match and match.group(1) not in found:
            found.append(match.group(1))
    if stall is not None and not any(not f.startswith("RIP: ") for f in found):
        return f"stalled, not crashed: {stall}" + (f" ({'; '.join(found[:2])})" if found else "")
    return "; ".join(found[:3])[:300]


def _open_regular(path: Path) -> int | None:
    """A descriptor on ``path`` if it is a regular file reached without a symlink, else None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


def copy_from_share(source: Path, target: Path) -> list[str]:
    """Copy a file or a directory tree the guest wrote into the 9p share, never following a symlink: the
    guest is not trusted with the host's files. Symlinks and special files are skipped and returned."""
    skipped: list[str] = []
    if not os.path.lexists(source):
        return skipped
    if os.path.isdir(source) and not os.path.islink(source):
        target.mkdir(parents=True, exist_ok=True)
        for entry in sorted(os.listdir(source)):
            skipped += copy_from_share(source / entry, target / entry)
        return skipped
    fd = _open_regular(source)
    if fd is None:
        return [source.name]
    with os.fdopen(fd, "rb") as reader, open(target, "wb") as writer:
        shutil.copyfileobj(reader, writer)
    return skipped


def read_share_json(path: Path) -> dict:
    """A JSON object a guest left in its share ({} if it is missing, not a regular file, not JSON, or not an
    object: a guest's file is never trusted to be what it should)."""
    fd = _open_regular(path)
    if fd is None:
        return {}
    try:
        with os.fdopen(fd, "rb") as handle:
            data = json.loads(handle.read(16 << 20))
    except (OSError, ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def _cached_kernel(variant: str, progress: bool = True, say=say, announce: bool = True):
    kernel = lab_kernel.cached_kernel(variant)
    if kernel is None:
        raise LabError(f"lab kernel {variant} is not built: run 'ticklab lab build-kernel --variant {variant}'")
    return kernel


def check_lab_experiment(experiment: Experiment, claim: str) -> None:
    """ExperimentError where ``ticklab lab run <claim>`` refuses ``experiment``: not a lab experiment, another
    claim's."""
    path = experiment.path
    if experiment.lab is None:
        raise ExperimentError(
            f"{path}: not a lab experiment (no 'lab:' section); run it with 'ticklab capture {claim}'"
        )
    if experiment.claim != claim:
        raise ExperimentError(f"{path}: claim is {experiment.claim!r}, not {claim!r}")


def lab_run(claim: str, options: LabOptions, experiment_path: Path | None = None, log=say) -> list[Path]:
    check_counts(options)
    paths = [experiment_path] if experiment_path else lab_experiments(claim)
    if not paths:
        raise ExperimentError(f"runners/{claim}/: no lab experiments (an experiment with a 'lab:' section)")
    bundles = []
    for path in paths:
        experiment = load_experiment(path)
        check_lab_experiment(experiment, claim)
        bundle = LabRun(experiment, options, log=log).run()
        log(f"{bundle}: sealed")
        bundles.append(bundle)
    return bundles
