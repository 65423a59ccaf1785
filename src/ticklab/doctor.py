"""`ticklab doctor`: what this host can run for each claim, and why not. Everything is tried, not assumed.

Anything the checks change (mounting tracefs/debugfs, writing a sched feature back to its own value)
goes through HostChanges and is put back before doctor returns. Doctor journals these in a journal of its own
(host/restore.py: ``doctor-changes.json`` beside the capture journal), so that a journal a killed capture left is
reported — what it changed, by which process, when, whether that process is gone — and left for ``ticklab restore``,
never put back behind the user's back.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from tabulate import tabulate

from .capture import requirements, tracing
from .capture.experiment import (
    ExperimentError,
    boot_experiment_paths,
    expand_conditions,
    experiment_paths,
    is_boot_experiment,
    load_experiment,
)
from .claimids import claim_ids
from .host import HostChangeError, HostChanges, collect
from .host import restore as host_restore
from .lab import kernel as lab_kernel
from .lab import qemu
from .lab import sources as lab_sources
from .lab.cache import LabError
from .lab.run import experiment_kernels
from .registry import KVM

KVM_GET_API_VERSION = 0xAE00


def perf_tracepoints() -> tuple[bool, str]:
    if shutil.which("perf") is None:
        return False, "perf is not installed"
    with tempfile.TemporaryDirectory(prefix="ticklab-perf-") as scratch:
        output = Path(scratch) / "perf.data"
        result = subprocess.run(
            ["perf", "record", "-q", "-e", "sched:sched_switch", "-a", "-o", str(output), "--", "sleep", "0.2"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if result.returncode == 0 and output.is_file():
            return True, "perf record -e sched:sched_switch -a works"
        return False, f"perf record fails (exit {result.returncode}: {result.stderr.strip()[-200:]})"


KVM_DEVICE = "/dev/kvm"
KVM_GUESTS = "lab guests under KVM"


def kvm_device() -> tuple[bool, str]:
    """Whether /dev/kvm answers here: this host can run KVM guests (not whether it is one: see ``virtualization``)."""
    if not os.path.exists("/dev/kvm"):
        return False, "no /dev/kvm: this host offers QEMU no KVM (lab guests run under TCG)"
    try:
        with open("/dev/kvm", "rb") as device:
            version = fcntl.ioctl(device, KVM_GET_API_VERSION)
    except OSError as exc:
        return False, f"/dev/kvm does not answer ({exc.strerror}): lab guests run under TCG"
    return True, f"/dev/kvm answers (KVM API {version})"


def kvm_guests(device: tuple[bool, str]) -> tuple[bool, str]:
    """Whether a lab guest boots under KVM here: known only from a test guest booted on this host boot
    ('ticklab lab run' boots one first and falls back to TCG)."""
    if not device[0]:
        return False, device[1]
    if shutil.which("qemu-system-x86_64") is None:
        return False, "QEMU is not installed, so no guest boot was tried"
    probed = qemu.cached_kvm_probe()
    if probed is not None:
        return probed
    return False, (
        "not known yet: no test guest was booted under KVM since this host booted ('ticklab lab run' "
        "boots one first and falls back to TCG)"
    )


def virtualization(facts: dict) -> str:
    """What this host is: a virtual machine (the CPU's hypervisor flag; systemd-detect-virt names the hypervisor)
    or not — a fact about the host, apart from whether it can run KVM guests itself."""
    virt = facts.get("virtualization") or {}
    detected = virt.get("detect_virt")
    named = f"; systemd-detect-virt: {detected}" if detected else ""
    if virt.get("hypervisor_flag"):
        return f"a virtual machine (hypervisor flag in /proc/cpuinfo{named})"
    return f"not a virtual machine (no hypervisor flag in /proc/cpuinfo{named})"


def source_check(series: str) -> str:
    return f"kernel source {series}"


def lab_checks() -> dict[str, tuple[bool, str]]:
    """What the guest lab needs: QEMU, the kernel sources (kernel/sources.yaml), built kernels, the image's programs."""
    checks = {"qemu": requirements.check_program("qemu-system-x86_64")}
    try:
        for series, spec, here in lab_sources.status():
            if here:
                checks[source_check(series)] = (True, f"{spec.package} {here.version}, {here.origin}: {here.tarball}")
            else:
                checks[source_check(series)] = (
                    False,
                    f"{spec.package} not here; "
                    + (
                        "the first 'ticklab lab build-kernel --variant "
                        f"{lab_sources.canonical_name(series, 'hz1000')}' "
                        f"fetches it from Debian {spec.suite}"
                        if spec.suite
                        else f"apt-get install {spec.package}"
                    ),
                )
                continue
            for name in lab_kernel.kernel_names():
                if lab_sources.split_name(name)[0] != series:
                    continue
                built = lab_kernel.cached_kernel(name)
                checks[f"lab kernel {name}"] = (
                    (True, f"built: {built.directory}")
                    if built
                    else (False, f"not built yet: ticklab lab build-kernel --variant {name}")
                )
    except LabError as exc:
        checks["kernel sources"] = (False, str(exc))
    for program in ("busybox", "cpio"):
        checks[program] = requirements.check_program(program)
    # the ACPI tables a lab experiment gives its guests (lab.acpi_tables: acpi-idle's SSDT) are compiled with it
    found, where = requirements.check_program("iasl")
    checks["iasl"] = (found, where if found else "iasl is not installed: apt-get install acpica-tools")
    return checks


def lab_experiment(experiment, checks: dict) -> dict:
    """Whether a guest experiment can run here: QEMU, the kernel sources its kernels build from (one that can be
    fetched counts: the first build fetches it), and KVM where it insists on it."""
    missing = [f"qemu: {checks['qemu'][1]}"] if not checks["qemu"][0] else []
    try:
        for series in sorted({lab_sources.split_name(name)[0] for name in experiment_kernels(experiment)}):
            ok, why = checks.get(source_check(series), (False, "not checked"))
            if not ok and not lab_sources.spec(series).suite:
                missing.append(f"{source_check(series)}: {why}")
    except (LabError, ExperimentError) as exc:
        missing.append(str(exc))
    iasl = checks.get("iasl", (False, "iasl not checked"))
    if (experiment.lab or {}).get("acpi_tables") and not iasl[0]:
        missing.append(f"its ACPI tables need iasl: {iasl[1]}")
    if (experiment.lab or {}).get("accel") == KVM.name and not checks[KVM_GUESTS][0]:
        missing.append(f"needs KVM: {checks[KVM_GUESTS][1]}")
    return {
        "runs": not missing,
        "why": "; ".join(missing)
        or "in the guest lab: ticklab lab run " + experiment.claim + (" (KVM)" if checks[KVM_GUESTS][0] else " (TCG)"),
    }


def _tried(check) -> tuple[bool, str]:
    """A check that needs tracefs or a knob: its failure is the answer (doctor reports it and goes on)."""
    try:
        return check()
    except (tracing.TracingError, HostChangeError) as exc:
        return False, str(exc)


def named_requirements(experiments) -> list[str]:
    """The programs, our tools and the tracers the experiments (and their extras) name, each once: host
    experiments' as they are, lab experiments' tools only (built here and copied into the guest image; the
    guest's programs and tracers come with the image and the lab kernel)."""
    named = []
    for experiment in experiments:
        kinds = ("tool",) if experiment.lab is not None else ("program", "tool", "tracer")
        for requirement in experiment.all_requires():
            if requirement.partition(":")[0] in kinds:
                named.append(requirement)
    order = {"program": 0, "tool": 1, "tracer": 2}
    return sorted(dict.fromkeys(named), key=lambda r: (order[r.partition(":")[0]], r))


def _requirement_label(requirement: str) -> str:
    kind, _, name = requirement.partition(":")
    return f"{name} tracer" if kind == "tracer" else name


LEFT_BEHIND = "host changes left behind"


def left_behind_check(left: host_restore.LeftBehind | None, journal: Path) -> tuple[bool, str]:
    """Doctor's row for a capture's journal: none, its capture still running, or what a killed one left and the
    command that puts it back."""
    if left is None:
        return True, f"none: no journal of host changes at {journal}"
    if left.problem:
        return False, f"{left.problem} ({host_restore.RESTORE_COMMAND} refuses it too)"
    if left.other_boot:
        return False, (
            f"{left.journal}: written in another boot by {left.who()}; the reboot reset what it lists: "
            f"{host_restore.RESTORE_COMMAND} removes it and writes nothing"
        )
    if left.running:
        return True, (
            f"{left.journal}: {left.who()} is running and puts back its {len(left.changes)} change(s) when it ends"
        )
    return False, (
        f"{left.journal}: {len(left.changes)} change(s) left by pid {left.pid}, which is gone; put them "
        f"back: {host_restore.RESTORE_COMMAND}"
    )


def boot_plan_steps(experiment, host, facts: dict, root: Path) -> dict:
    """A boot experiment (``capture <claim> --boot``) on this host: the steps it needs here (the kernels to build,
    then the capture), or why it cannot run here at all — what no kernel built or booted can change."""
    from .capture.boot_capture import missing_kernels
    from .capture.hostkernel import HostKernelError, check_boots_from_boot

    try:
        missing = requirements.check_all(experiment.requires, host, facts)[1]
    except (tracing.TracingError, HostChangeError) as exc:
        missing = {"host": str(exc)}
    if missing:
        return {"runs": False, "why": requirements.unmet_text(missing)}
    try:
        check_boots_from_boot(root, facts["kernel_release"])
    except HostKernelError as exc:
        return {"runs": False, "why": str(exc)}
    conditions = expand_conditions(experiment, facts)
    available = set(facts["clocksources"].get("available") or [])
    for condition in conditions:  # a clocksource the hardware lacks: no boot makes one
        for word in str(condition.values.get("boot", "")).split():
            if word.startswith("clocksource=") and word.split("=", 1)[1] not in available:
                return {
                    "runs": False,
                    "why": f"condition {condition.name} boots with {word}, and this machine has no "
                    f"{word.split('=', 1)[1]} (available: {' '.join(sorted(available))})",
                }
    steps = []
    for pattern, names, command in missing_kernels(experiment, conditions, root):
        if command is None:
            return {
                "runs": False,
                "why": f"conditions {', '.join(names)} need a kernel matching {pattern!r}, which "
                "this experiment does not say how to build",
            }
        steps.append(command)
    relative = (
        experiment.path.relative_to(experiment.path.parents[2]) if len(experiment.path.parents) > 2 else experiment.path
    )
    steps.append(f"ticklab capture {experiment.claim} --boot kexec --experiment {relative}")
    return {"runs": True, "why": "; then ".join(steps)}


def suggestion_check(root: Path | str = "/"):
    """For a capture's answer (capture/answer.py): a function telling, of an experiment the answer would suggest
    running, what this host lacks to run it (doctor's own checks, in its words), or None when it can run here. Lab
    experiments: ``lab_experiment``'s checks (QEMU, kernel sources, KVM); boot experiments: ``boot_plan_steps``
    (requirements, a /boot that boots this machine, clocksources); host experiments: their requirements. Nothing is
    changed: the checks run on a dry-run HostChanges, so they take no host lock."""
    root = Path(root)
    cache: dict = {}

    def lab() -> dict:
        if "lab" not in cache:
            checks = lab_checks()
            checks[KVM_DEVICE] = kvm_device()
            checks[KVM_GUESTS] = kvm_guests(checks[KVM_DEVICE])
            cache["lab"] = checks
        return cache["lab"]

    def missing(experiment) -> str | None:
        if experiment.lab is not None:
            answer = lab_experiment(experiment, lab())
            return None if answer["runs"] else answer["why"]
        with HostChanges(root=root, dry_run=True, log=lambda _: None) as host:
            facts = cache.setdefault("facts", collect(root))
            if is_boot_experiment(experiment):
                answer = boot_plan_steps(experiment, host, facts, root)
                return None if answer["runs"] else answer["why"]
            try:
                return requirements.missing(experiment.requires, host, facts) or None
            except (tracing.TracingError, HostChangeError) as exc:
                return str(exc)

    return missing


def diagnose(root: Path | str = "/", journal: Path | None = None) -> dict:
    """``journal``: the capture journal to report on (default: the host's); doctor's own probes are journalled
    beside it (:func:`ticklab.host.restore.doctor_journal`)."""
    root = Path(root)
    journal = Path(journal) if journal else host_restore.default_journal()
    # before doctor takes the host lock: the lock file still names the process a kill left holding it
    left = host_restore.left_behind(journal, root)
    with HostChanges(host_restore.doctor_journal(journal), root=root, log=lambda _: None) as host:
        checks: dict[str, tuple[bool, str]] = {}
        checks[LEFT_BEHIND] = left_behind_check(left, journal)
        checks["root"] = requirements.check_root(host, {})
        try:
            tracing.ensure_tracefs(host)
            checks["tracefs"] = requirements.check_tracefs(host, {})
        except (tracing.TracingError, HostChangeError) as exc:
            checks["tracefs"] = (False, str(exc))
        facts = collect(root)
        works, why = _tried(lambda: tracing.probe_trace_cmd(host))
        checks["trace-cmd record"] = (works, why if works else f"{why}; capture falls back to tracefs directly")
        checks["perf tracepoints"] = perf_tracepoints()
        sources = facts["clocksources"]
        checks["clocksources"] = (True, f"available: {' '.join(sources['available'])}; current: {sources['current']}")
        checks["cpuidle"] = requirements.check_cpuidle(host, facts)
        checks["sched features (HRTICK)"] = requirements.check_sched_features(host, facts, "HRTICK")
        checks[KVM_DEVICE] = kvm_device()
        checks[KVM_GUESTS] = kvm_guests(checks[KVM_DEVICE])
        checks.update(lab_checks())
        by_claim = {claim: [load_experiment(path) for path in experiment_paths(claim)] for claim in claim_ids()}
        for requirement in named_requirements([e for experiments in by_claim.values() for e in experiments]):
            checks[_requirement_label(requirement)] = _tried(lambda: requirements.check(requirement, host, facts))
        claims = {}
        for claim, loaded in by_claim.items():
            experiments = {}
            for experiment in loaded:
                if experiment.lab is not None:
                    experiments[experiment.name] = lab_experiment(experiment, checks)
                    continue
                try:
                    missing = requirements.check_all(experiment.requires, host, facts)[1]
                except (tracing.TracingError, HostChangeError) as exc:
                    missing = {"host": str(exc)}
                experiments[experiment.name] = {
                    "runs": not missing,
                    "why": requirements.unmet_text(missing) or "all requirements met",
                }
            if not experiments:
                experiments["(none)"] = {
                    "runs": False,
                    "why": "no host experiment; this claim needs the guest lab (ticklab lab)",
                }
            claims[claim] = experiments
        boot_plans: dict[str, dict] = {}
        for claim in claim_ids():
            for path in boot_experiment_paths(claim):
                try:
                    experiment = load_experiment(path)
                    boot_plans.setdefault(claim, {})[experiment.name] = boot_plan_steps(experiment, host, facts, root)
                except ExperimentError as exc:
                    boot_plans.setdefault(claim, {})[path.stem] = {"runs": False, "why": str(exc)}
    report = {
        "host": facts,
        "checks": {k: {"ok": ok, "why": why} for k, (ok, why) in checks.items()},
        "claims": claims,
        "boot_plans": boot_plans,
    }
    if left is not None:
        report["checks"][LEFT_BEHIND]["left"] = left.record()
    return report


def render(report: dict) -> str:
    checks = [[name, "yes" if c["ok"] else "no", c["why"]] for name, c in report["checks"].items()]
    claims = [
        [claim, name, "yes" if e["runs"] else "no", e["why"]]
        for claim, experiments in report["claims"].items()
        for name, e in experiments.items()
    ]
    host = report["host"]
    head = (
        f"host: {host['cpu_model']}, {host['nproc']} CPUs, kernel {host['kernel_release']}, "
        f"HZ={host['kernel_config']['hz'] or 'unknown'}, {virtualization(host)}"
    )
    left = report["checks"].get(LEFT_BEHIND, {}).get("left")
    if left and left["writer"] == "gone":
        # what a killed capture left changed comes first: every other answer is about a host still changed
        head += "\n\n" + "\n".join(
            [
                f"This host is still changed by {left['owner'] or 'pid ' + str(left['pid'])}, which is gone (killed "
                f"outright?); its journal {left['journal']}, last written {left['written']}, lists:",
                *(f"  {line}" for line in left["summary"]),
                f"Put it back: {left['restore']}",
            ]
        )
    boots = [
        [claim, name, "yes" if e["runs"] else "no", e["why"]]
        for claim, experiments in report.get("boot_plans", {}).items()
        for name, e in experiments.items()
    ]
    parts = [
        head,
        tabulate(checks, headers=["check", "ok", "why"], tablefmt="simple", maxcolwidths=[None, None, 90]),
        tabulate(
            claims,
            headers=["claim", "experiment", "runs here", "why"],
            tablefmt="simple",
            maxcolwidths=[None, None, None, 80],
        ),
    ]
    if boots:  # own hardware, a kernel per condition: what to do here, in order, or why it cannot be done
        parts.append(
            tabulate(
                boots,
                headers=["claim", "boot plan", "possible", "steps here, or why not"],
                tablefmt="simple",
                maxcolwidths=[None, None, None, 80],
            )
        )
    return "\n\n".join(parts)


def main(as_json: bool, root: Path | str = "/", journal: Path | None = None) -> int:
    report = diagnose(root, journal)
    print(json.dumps(report, indent=2, default=str) if as_json else render(report))
    return 0
