"""`ticklab capture <claim> --boot kexec|grub|manual`: an experiment whose conditions name a kernel and command-line
words becomes a boot plan (:mod:`ticklab.host.plan_engine`): the same seeded, interleaved order ``schedule`` gives a
host capture, one boot per run.

A boot experiment has a ``host_kernel`` knob (``running``, or a release pattern matched against
``/boot/vmlinuz-*``: exactly one installed kernel must match) and usually a ``boot_cmdline`` knob (words added to the
command line the machine has now: ``key=value`` replaces the original's ``key=``, ``-key`` removes it; ``{last_cpu}``
and ``{nproc}`` are filled in). Such files are named ``runners/<claim>/host-boot-*.yaml`` (checked at load), and
``experiment_paths`` leaves them out of host captures and the lab.

:func:`start` opens the bundle with the plan's order (the manifest's ``order``, as every capture's) and makes the
plan; after each boot ``ticklab plan resume`` gives the plan a :class:`BootCapture`, which reopens the bundle and
makes the booted run with the host executor (``runner.HostExecutor``: knobs, tracing, workload), its record
carrying the ``boot`` it verified (boot_id, release, /proc/cmdline). A wrong boot is a failed run with why. When
the planned runs are done the experiment's stopping rule decides, from the bundle on disk, whether a round of one
more run per condition follows (the same seeded rounds as a host capture, the time budget counted from the
plan's creation across reboots); when it does not, or the plan stops or is aborted, the bundle is sealed.
"""

from __future__ import annotations

import fnmatch
import hashlib
import lzma
import re
import time
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path

import yaml

from ..bundle import BundleError, BundleWriter, load_bundle
from ..host import HostChanges, facts, plan_engine, plan_state
from ..safefiles import shown
from . import requirements, tracing
from .experiment import (
    Condition,
    Experiment,
    ExperimentError,
    PlannedRun,
    boot_experiment_paths,
    default_boot_experiment,
    expand_conditions,
    is_boot_experiment,
    load_experiment,
    schedule,
    traced_definition,
)
from .runner import HostExecutor, check_host, checked_host_id
from .session import CapturePlan, check_counts
from .stopping import PrecisionGoal, StoppingRule, next_round_runs


def _variable(experiment: Experiment, kind: str) -> str | None:
    return next((name for name, k in experiment.knobs.items() if k == kind), None)


def installed_releases(root: Path) -> list[str]:
    return sorted(p.name[len("vmlinuz-") :] for p in (root / "boot").glob("vmlinuz-*"))


def resolve_kernel(value: str, root: Path, source: str) -> str:
    if value == "running":
        return "running"
    matches = [r for r in installed_releases(root) if fnmatch.fnmatchcase(r, value)]
    if len(matches) != 1:
        have = ", ".join(installed_releases(root)) or "none"
        raise ExperimentError(
            f"{source}: kernel {value!r} matches {len(matches)} installed kernels in {root / 'boot'} "
            f"(have: {have}); build one with 'ticklab kernel build --host' or name it exactly"
        )
    return matches[0]


def kernel_build_command(build: dict) -> str:
    """The user's command that makes a kernel a boot experiment names (its ``kernel_builds`` entry)."""
    return (
        f"ticklab kernel build --host --source /usr/src/linux-source-{build['series']}.tar.xz"
        + (" --localmodconfig" if build.get("localmodconfig", True) else "")
        + (f" --fragment {build['fragment']}" if build.get("fragment") else "")
    )


def missing_kernels(
    experiment: Experiment, conditions: list[Condition], root: Path
) -> list[tuple[str, list[str], str | None]]:
    """(pattern, its conditions, the `kernel build` command or None) for each condition kernel pattern no installed
    kernel matches, in the conditions' order."""
    kernel_var = _variable(experiment, "host_kernel")
    patterns: dict[str, list[str]] = {}
    for condition in conditions:
        value = str(condition.values.get(kernel_var, "running"))
        if value != "running":
            patterns.setdefault(value, []).append(condition.name)
    installed = installed_releases(root)
    builds = {b["kernel"]: b for b in experiment.kernel_builds}
    return [
        (pattern, names, kernel_build_command(builds[pattern]) if pattern in builds else None)
        for pattern, names in patterns.items()
        if not any(fnmatch.fnmatchcase(r, pattern) for r in installed)
    ]


def check_kernels_installed(experiment: Experiment, conditions: list[Condition], root: Path) -> None:
    """Before any plan: every condition's kernel pattern matches an installed kernel, or one line names the patterns
    with none and the exact `ticklab kernel build` command(s) that make them."""
    missing = missing_kernels(experiment, conditions, root)
    if not missing:
        return
    said = [
        f"no installed kernel matches {pattern!r} (conditions {', '.join(names)}); "
        + (f"build it: {command}" if command else "build one with 'ticklab kernel build --host'")
        for pattern, names, command in missing
    ]
    raise ExperimentError(
        f"{experiment.path}: {'; '.join(said)} (installed in {root / 'boot'}: "
        f"{', '.join(installed_releases(root)) or 'none'})"
    )


def build_missing_kernels(
    experiment: Experiment, conditions: list[Condition], root: Path, log=print, dry_run: bool = False
) -> list[str]:
    """``capture --boot --build-kernels``: each kernel the conditions name that is not installed, built and installed
    by ``ticklab kernel build --host`` (its plan's estimate said first), in the conditions' order; the releases.
    A pattern the experiment's kernel_builds does not cover is refused before anything is built."""
    from ..paths import repo_root
    from .hostkernel import build_and_install, plan_host_kernel

    missing = missing_kernels(experiment, conditions, root)
    unknown = [(pattern, names) for pattern, names, command in missing if command is None]
    if unknown:
        raise ExperimentError(
            f"{experiment.path}: no kernel_builds entry says how to build {unknown[0][0]!r} "
            f"(conditions {', '.join(unknown[0][1])}); --build-kernels builds only those"
        )
    builds = {b["kernel"]: b for b in experiment.kernel_builds}
    plans = []
    for pattern, _names, command in missing:
        build = builds[pattern]
        plan = plan_host_kernel(
            root,
            source=root / f"usr/src/linux-source-{build['series']}.tar.xz",
            localmodconfig=build.get("localmodconfig", True),
            fragment=repo_root() / build["fragment"] if build.get("fragment") else None,
        )
        for warning in plan.warnings:
            log(f"warning: {warning}")
        log(f"{pattern}: {command}: Linux {plan.release}, {plan.estimate()}")
        plans.append(plan)
    if dry_run:
        return [plan.release for plan in plans]
    return [build_and_install(plan, root, say=log) for plan in plans]


def boot_experiment(claim: str, experiment_path: Path | None) -> Experiment:
    paths = [experiment_path] if experiment_path else boot_experiment_paths(claim)
    found = [e for e in (load_experiment(p) for p in paths) if is_boot_experiment(e)]
    if not found:
        raise ExperimentError(
            f"{experiment_path or 'runners/' + claim}: no boot experiment (one with a host_kernel "
            "knob); --boot runs those only"
        )
    if len(found) > 1:
        default = default_boot_experiment(found)
        if default is not None:
            return default
        raise ExperimentError(
            f"runners/{claim}: {len(found)} boot experiments ({', '.join(e.path.name for e in found)}); "
            "name one with --experiment"
        )
    return found[0]


_TEMPLATE = re.compile(r"\{([^{}]*)\}")


def condition_words(experiment: Experiment, condition: Condition, fill: dict, source: str) -> list[str]:
    """The condition's command-line words (its ``boot_cmdline`` knob), ``{last_cpu}`` and ``{nproc}`` filled."""
    variable = _variable(experiment, "boot_cmdline")
    words = condition.values.get(variable, "") if variable else ""
    words = [str(w) for w in words] if isinstance(words, list) else str(words).split()

    def filled(match: re.Match) -> str:
        if match.group(1) not in fill:
            raise ExperimentError(
                f"{source}: command-line word template {{{shown(match.group(1), 60)}}}: known: {{last_cpu}}, {{nproc}}"
            )
        return str(fill[match.group(1)])

    words = [_TEMPLATE.sub(filled, w) for w in words]  # only the names: no format spec a word could blow up with
    bad = next((w for w in words if "{" in w or "}" in w), None)
    if bad is not None:
        raise ExperimentError(
            f"{source}: command-line word '{shown(bad, 80)}' has a brace that is not {{last_cpu}} or {{nproc}}"
        )
    return words


def boot_runs(experiment: Experiment, planned: list[PlannedRun], root: Path, host: dict) -> list[plan_state.BootRun]:
    """The capture's planned runs as boots of this host (``host``: its facts): each condition's kernel and the
    command line it has now with the condition's words."""
    cpus = host.get("online_cpus") or facts.online_cpus(root)
    fill = {"last_cpu": cpus[-1] if cpus else 0, "nproc": len(cpus) or 1}
    original = (facts.read_text(root / "proc/cmdline") or "").strip()
    kernel_var = _variable(experiment, "host_kernel")
    check_kernels_installed(experiment, list({id(r.condition): r.condition for r in planned}.values()), root)
    booted = []
    for run in planned:
        source = f"{experiment.path}: conditions.{run.condition.name}"
        kernel = resolve_kernel(str(run.condition.values.get(kernel_var, "running")), root, source)
        words = condition_words(experiment, run.condition, fill, source)
        booted.append(
            plan_state.BootRun(
                run.run, run.condition.name, kernel, plan_state.condition_cmdline(original, words), warmup=run.warmup
            )
        )
    return booted


def _conditions_here(experiment: Experiment, host: dict) -> list[Condition]:
    conditions = expand_conditions(experiment, host)
    if not conditions:
        raise ExperimentError(f"{experiment.path}: no condition is possible on this host")
    return conditions


def planned_runs(
    experiment: Experiment, root: Path, *, runs: int | None = None, warmup: int | None = None, seed: int | None = None
) -> list[plan_state.BootRun]:
    host = facts.collect(root)
    order = schedule(
        _conditions_here(experiment, host),
        runs or experiment.runs,
        experiment.warmup if warmup is None else warmup,
        experiment.seed if seed is None else seed,
    )
    return boot_runs(experiment, order, root, host)


KEPT_EXPERIMENT = "host-boot-experiment.yaml"  # the plan's copy (a boot experiment's file name, as the loader requires)


def start(claim: str, options, experiment_path: Path | None, mode: str, log=print) -> plan_state.Plan | None:
    """The bundle and the boot plan of a boot experiment, then the first boot (``options``: runner.CaptureOptions).
    A host that cannot run the experiment gets a sealed bundle saying why, and no plan."""
    check_counts(options)
    experiment = boot_experiment(claim, experiment_path)
    root = Path(options.root)
    plan_state.refuse_if_running(root)
    host = HostChanges(options.journal, root=root, log=log)
    with host:
        here, checked, failed = check_host(host, experiment, root)
    identity = checked_host_id(options.host_id, here)
    conditions = _conditions_here(experiment, here)
    planned = CapturePlan.of(experiment, conditions, options)
    if failed:  # said before the kernels are looked for: a host that cannot test the claim needs none built
        writer = planned.open_bundle(options.out, identity, here)
        writer.manifest.requirements = checked
        writer.manifest.not_testable = requirements.unmet_text(failed)
        log(f"{experiment.claim}/{experiment.name}: not testable on this host — {writer.manifest.not_testable}")
        writer.seal()
        return None
    if getattr(options, "build_kernels", False):
        build_missing_kernels(experiment, conditions, root, log)
    runs = boot_runs(experiment, planned.runs, root, here)  # every condition's kernel must exist before the bundle
    kept = experiment.path.read_bytes()  # the plan runs this copy: the user's file may move or change mid-plan
    if traced_definition(yaml.safe_load(kept)) != experiment.definition:
        raise ExperimentError(f"{experiment.path}: changed while the capture started; start it again")
    writer = planned.open_bundle(options.out, identity, here)
    writer.manifest.requirements = checked
    context = {
        "experiment": str(experiment.path.resolve()),
        "experiment_file": KEPT_EXPERIMENT,
        "backend": options.backend,
        "journal": str(options.journal) if options.journal else None,
        "runs_fixed": options.runs is not None,
        "budget_s": options.budget_s,
        "seed": planned.counts[2],
        "goals": None if options.goals is None else [asdict(g) for g in options.goals],
    }
    plan_id = plan_state.new_plan_id()
    # the bundle is written for the last time in this process before the plan exists: from then on an abort may
    # seal it at any moment
    writer.manifest.boot_plan = {"id": plan_id, "mode": mode}
    writer.flush()
    try:
        created = plan_engine.create(
            runs,
            mode=mode,
            bundle=writer.path,
            root=root,
            plan_id=plan_id,
            capture=context,
            keep={KEPT_EXPERIMENT: kept},
        )
    except Exception:
        writer.discard()  # no plan, no run: the bundle opened for it holds nothing
        raise
    log(
        f"boot plan {created.id}: {len(runs)} boots into {writer.path}; 'ticklab plan status' shows it, "
        "'ticklab plan abort' ends it (the runs made are kept)"
    )
    plan_engine.advance(created.id, root=root, say=log, maker=BootCapture(created, root, log))
    return created


class BootCapture(plan_engine.RunMaker):
    """The capture's side of a boot plan, in the process ``ticklab plan resume`` starts after each boot. It runs the
    experiment kept with the plan (the user's file may move or change mid-plan) and reads nothing until asked: an
    abort needs neither the experiment nor the bundle."""

    def __init__(self, plan: plan_state.Plan, root: Path | str = "/", log=print):
        self.plan, self.root, self.log = plan, Path(root), log
        self.context = plan.capture
        self._experiment: Experiment | None = None

    @property
    def experiment(self) -> Experiment:
        if self._experiment is None:
            try:
                kept = self.context.get("experiment_file")  # a plan made before plans kept it: the user's file
                self._experiment = load_experiment(
                    plan_state.kept_file(self.root, self.plan.id, kept) if kept else self.context["experiment"]
                )
            except Exception as exc:  # no later run could be made either
                raise plan_engine.CannotGoOn(f"the plan's experiment: {exc}") from None
        return self._experiment

    def _writer(self) -> BundleWriter:
        try:
            return BundleWriter.reopen(self.plan.bundle)
        except (BundleError, OSError) as exc:
            raise plan_engine.CannotGoOn(f"the plan's bundle: {exc}") from None

    def _writer_unless_sealed(self) -> BundleWriter | None:
        """The bundle to finish, or None when it is sealed already (an ending completed again): a bundle gone or
        unreadable raises, and the plan's ending says so."""
        try:
            return self._writer()
        except plan_engine.CannotGoOn:
            if _sealed(self.plan.bundle):
                self.log(f"boot plan {self.plan.id}: {self.plan.bundle}: sealed already")
                return None
            raise

    @staticmethod
    def _conditions(writer: BundleWriter) -> list[Condition]:
        return [Condition(c["name"], {k: v for k, v in c.items() if k != "name"}) for c in writer.manifest.conditions]

    def make_run(self, run: plan_state.BootRun, boot: dict) -> dict:

        experiment, writer = self.experiment, self._writer()
        condition = {c.name: c for c in self._conditions(writer)}[run.condition]
        order = next(i for i, entry in enumerate(writer.manifest.order) if entry["run"] == run.name)
        journal = Path(self.context["journal"]) if self.context.get("journal") else None
        with HostChanges(journal, root=self.root, log=self.log) as host:
            if experiment.trace:
                tracing.ensure_tracefs(host)
            here = facts.collect(self.root)
            backend = (
                tracing.choose_backend(host, self.context["backend"], experiment.trace_settings().functions)[0]
                if experiment.trace
                else None
            )
            HostExecutor(experiment, host, here, backend, self.log).make_run(
                writer, PlannedRun(run.name, order, condition, run.warmup)
            )
        record = writer.manifest.runs[-1]
        # as a lab run's boot names its kernel; with the booted kernel's HZ and clocksource, which the run's checks
        # need (the bundle's host facts describe the kernel the plan was made on, not necessarily this one)
        record.details["boot"] = {
            **boot,
            "kernel_release": boot["release"],
            "hz": here["kernel_config"]["hz"],
            "clocksource": here["clocksources"]["current"],
            # the lab switches as the booted kernel took them (hpet's checks compare them with the condition)
            "switches": facts.lab_switches(self.root),
            "kernel_build": self._kernel_build(writer, run.name, here.get("kernel_build")),
        }
        writer.flush()
        return record.to_json()

    def _kernel_build(self, writer, run: str, record: dict | None) -> dict | None:
        """The booted kernel's build record (facts.kernel_build), its build log copied into the run's raw files
        (sealed and compressed with them) and named there; None for a kernel ticklab did not build."""
        if record is None:
            return None
        log = self.root / "lib/modules" / record.get("release", "") / str(record.get("build_log", ""))
        try:
            if log.is_symlink() or not log.is_file() or log.name != facts.KERNEL_BUILD_LOG:
                raise OSError("not the build log a ticklab install writes")
            text = lzma.decompress(log.read_bytes())
        except (OSError, lzma.LZMAError) as exc:
            return {**record, "build_log_in_bundle": None, "build_log_problem": f"{log}: {exc}"}
        return {
            **record,
            "build_log_in_bundle": writer.add_run_file(run, "kernel-build.log", text),
            "build_log_matches": hashlib.sha256(text).hexdigest() == record.get("build_log_sha256"),
        }

    def failed_run(self, run: plan_state.BootRun, boot: dict, why: str) -> None:
        writer = self._writer_unless_sealed()
        if writer is None:
            return
        if any(r.run == run.name for r in writer.manifest.runs):
            return  # made, then failed afterwards: the record says how the run went
        writer.add_run(
            {
                "run": run.name,
                "condition": run.condition,
                "warmup": run.warmup,
                "status": "failed",
                "problem": why,
                "boot": boot,
            },
            [],
        )

    def more_runs(self, plan: plan_state.Plan) -> list[plan_state.BootRun]:
        """A round of one more run per condition while the stopping rule asks for it ([] when it does not). A round
        already in the manifest's order but not in the plan (a process killed before the plan was saved) is that
        round: the rule is not asked twice."""
        writer = self._writer()
        manifest, conditions = writer.manifest, self._conditions(writer)
        in_plan = {r.name for r in plan.runs}
        pending = [(entry["run"], entry["condition"]) for entry in manifest.order if entry["run"] not in in_plan]
        if pending:
            return self._booted(plan, pending)
        goals = self.context.get("goals")
        rule = StoppingRule.for_capture(
            self.experiment,
            conditions,
            runs_fixed=self.context["runs_fixed"],
            budget_s=self.context["budget_s"],
            goals=None
            if goals is None
            else [PrecisionGoal(**{**g, "experiments": tuple(g["experiments"])}) for g in goals],
        )
        elapsed = time.time() - datetime.fromisoformat(manifest.started).timestamp()
        rule.started = time.monotonic() - elapsed  # the time budget counts across reboots, from the capture's start
        per_boot = elapsed / max(len(manifest.runs), 1)  # every run, warm-up or failed, took one boot of that time
        round_number = 1 + max((entry.get("round", 0) for entry in manifest.order), default=0)
        added = next_round_runs(
            rule, manifest, writer.results(), conditions, per_boot, round_number, self.context["seed"]
        )
        manifest.stopping = rule.record()
        writer.flush()
        return self._booted(plan, [(p.run, p.condition.name) for p in added])

    @staticmethod
    def _booted(plan: plan_state.Plan, runs: list[tuple[str, str]]) -> list[plan_state.BootRun]:
        """Runs of a later round, each booted as its condition was first planned (kernel, command line)."""
        booted = {r.condition: r for r in plan.runs}
        return [
            plan_state.BootRun(
                name,
                condition,
                booted[condition].kernel,
                booted[condition].cmdline,
                initrd=booted[condition].initrd,
                release=booted[condition].release,
            )
            for name, condition in runs
        ]

    def finished(self, plan: plan_state.Plan) -> None:
        """The plan ended (made, stopped by a bad boot, or aborted): the bundle is sealed with every run it has."""
        writer = self._writer_unless_sealed()
        if writer is None:
            return
        if plan.state != "finished" or not writer.manifest.stopping:
            writer.manifest.stopping = {
                "rule": "boot plan",
                "budget": None,
                "checks": [],
                "reason": f"boot plan {plan.state}" + (f": {plan.ended_because}" if plan.ended_because else ""),
            }
        writer.manifest.boot_plan = {
            **(writer.manifest.boot_plan or {}),
            "state": plan.state,
            "ended": datetime.now(UTC).isoformat(),
        }
        path = writer.seal()
        self.log(f"{path}: sealed")


def _sealed(bundle: str) -> bool:
    try:
        return load_bundle(bundle).sealed
    except BundleError:
        return False
