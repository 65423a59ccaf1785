"""`ticklab capture <claim>`: run an experiment on this host into one sealed bundle.

Warm-up runs come first and are kept (marked ``warmup``); measured runs of all conditions follow
in a seeded random order, recorded in the manifest. Each run applies its condition's knobs
through :class:`HostChanges` and puts them back afterwards; an interrupted capture restores the
host, leaves the bundle ``incomplete`` with the runs it finished, and exits non-zero.
If the host cannot run the experiment, the bundle records that, with the reason, and no runs.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..bundle import BundleError, BundleWriter
from ..claimids import CLAIM_IDS
from ..host import HostChanges, collect, host_id
from ..safefiles import shown
from . import requirements, tracing
from .answer import AnswerContext, answer_lines, check_refs
from .execute import apply_knobs, execute_run, run_once, workload_values
from .experiment import (
    Condition,
    Experiment,
    ExperimentError,
    PlannedRun,
    expand_conditions,
    experiment_paths,
    fill_argv,
    is_boot_experiment,
    load_experiment,
)
from .session import CapturePlan, add_run, check_counts
from .stopping import describe

HOST_ID_PATTERN = re.compile(r"^[a-z0-9][a-z0-9._-]{0,99}$")


@dataclass
class CaptureOptions:
    runs: int | None = None
    warmup: int | None = None
    out: Path | None = None
    host_id: str | None = None
    dry_run: bool = False
    backend: str = "auto"
    root: Path = Path("/")
    journal: Path | None = None
    progress: bool = True
    seed: int | None = None
    budget_s: float | None = None  # overrides the experiment's budget.time_s (0: no added rounds)
    goals: list | None = None  # the claim's stopping.PrecisionGoal s (None: none given, a fixed run count)
    answer: AnswerContext | None = None  # what the answer printed once the bundles are sealed needs (None: no answer)
    run_lines: bool = False  # one line per run (a log: no progress bar is seen)
    build_kernels: bool = False  # capture --boot: build and install the conditions' missing kernels first
    supersedes: tuple[Path, ...] = ()  # bundles this recapture replaces (recorded in its manifest; see CapturePlan)
    supersedes_records: tuple[dict, ...] = ()  # their records made elsewhere (a lab host plan: the bundles are outside)


def check_host(host: HostChanges, experiment: Experiment, root: Path | str) -> tuple[dict, dict, dict]:
    """(facts, checked, failed): this host's facts and the experiment's requirements checked against them (tracefs
    mounted first where the experiment traces; in a dry run that is only said). ``host`` must be entered."""
    if experiment.trace:
        tracing.ensure_tracefs(host)
    facts = collect(root)
    checked, failed = requirements.check_all(experiment.requires, host, facts)
    return facts, checked, failed


def checked_host_id(given: str | None, facts: dict) -> str:
    """The <host-id> directory of the bundles: --host-id, else a slug of the host's facts."""
    identity = given or host_id(facts)
    if not HOST_ID_PATTERN.match(identity):
        raise ExperimentError(f"--host-id {identity!r}: use lower-case letters, digits, '.', '_' and '-'")
    return identity


class Capture:
    def __init__(self, experiment: Experiment, options: CaptureOptions, log=print):
        self.experiment, self.options, self.log = experiment, options, log

    def run(self) -> Path | None:
        self.writer = None
        host = HostChanges(self.options.journal, root=self.options.root, dry_run=self.options.dry_run, log=self.log)
        try:
            return self._run(host)
        except BaseException:
            if self.writer is not None:  # host is restored by now: record the values read back, then re-raise
                self.writer.manifest.knobs = host.records()
                try:
                    self.writer.flush()
                except BundleError:  # a full disk: already said (Session); the error that stopped the capture follows
                    pass
            raise

    def _run(self, host: HostChanges) -> Path | None:
        options, experiment = self.options, self.experiment
        with host:
            facts, checked, failed = check_host(host, experiment, options.root)
            conditions = expand_conditions(experiment, facts)
            if not conditions and not failed:
                failed["conditions"] = "no condition of this experiment exists on this host"
            backend, backend_why = (
                tracing.choose_backend(host, options.backend, experiment.trace_settings().functions)
                if experiment.trace and not failed
                else (None, None)
            )
            identity = checked_host_id(options.host_id, facts)
            planned = CapturePlan.of(experiment, conditions, options, runnable=not failed)
            rule = None if failed else planned.stopping_rule(options)
            if options.dry_run:
                return self._dry_run(host, planned.runs, facts, failed, backend, rule)
            writer = self.writer = planned.open_bundle(options.out, identity, facts)
            manifest = writer.manifest
            manifest.requirements = checked
            manifest.tracing = {
                "backend": backend,
                "why": backend_why,
                "events": (experiment.trace or {}).get("events", []),
            }
            if failed:
                manifest.not_testable = requirements.unmet_text(failed)
                self.log(f"{experiment.claim}/{experiment.name}: not testable on this host — {manifest.not_testable}")
            else:
                executor = HostExecutor(experiment, host, facts, backend, self.log)
                planned.session(
                    executor,
                    writer,
                    rule,
                    what="capture",
                    desc=f"{experiment.claim}/{experiment.name}",
                    progress=options.progress,
                    log=self.log,
                    run_lines=options.run_lines,
                ).run()
        writer.manifest.knobs = host.records()  # now with the values read back after restoring
        return writer.seal()

    def _dry_run(self, host: HostChanges, planned_runs, facts: dict, failed: dict, backend, rule) -> None:
        experiment = self.experiment
        if failed:
            self.log(
                f"{experiment.claim}/{experiment.name}: not testable on this host — " + requirements.unmet_text(failed)
            )
            return None
        self.log(f"stopping: {describe(rule)}")
        if experiment.trace:
            self.log(f"dry-run: would trace with the {backend} backend")
        for planned in planned_runs:
            self.log(f"{planned.run} {planned.condition.name}{' (warm-up)' if planned.warmup else ''}:")
            values = workload_values(experiment, planned.condition, facts)
            if experiment.workload.get("server"):
                self._would_run(experiment.workload["server"], values, "workload.server", "the workload's server")
            self._would_run(experiment.workload["argv"], values, "workload.argv", f"the workload, in {planned.run}")
            for extra in experiment.extras:
                if extra.get("per_run"):
                    traced = "traced" if extra.get("traced") else "untraced"
                    self._would_run(
                        extra["argv"], values, f"extras.{extra['name']}.argv", f"extra {extra['name']}, {traced}"
                    )
            with host.scope():
                apply_knobs(host, experiment, planned.condition, facts)
                settings = experiment.trace_settings()
                if settings:
                    writes = tracing.planned_tracefs_writes(
                        host.root, settings.events, settings.buffer_kb, settings.functions, settings.clock
                    )
                    for line in writes:
                        self.log(f"dry-run: would {line}")
                    for extra in experiment.extras:
                        if extra.get("per_run") and extra.get("traced"):
                            self.log(
                                f"dry-run: would run extra {extra['name']} after the workload, traced the same way "
                                f"into {planned.run}/{extra['name']}/trace (the same writes, a new instance)"
                            )
        conditions = list(dict.fromkeys(planned.condition.name for planned in planned_runs))
        by_name = {planned.condition.name: planned.condition for planned in planned_runs}
        for name in conditions:
            values = workload_values(experiment, by_name[name], facts)
            for extra in experiment.extras_per_condition():
                self._would_run(
                    extra["argv"], values, f"extras.{extra['name']}.argv", f"extra {extra['name']}, once for {name}"
                )
            when = (experiment.profile or {}).get("when") or {}
            if experiment.profile and all(by_name[name].values.get(k) == v for k, v in when.items()):
                self._would_run(
                    ["perf", "record", "-g", "-o", "perf.data", "--", *experiment.workload["argv"]],
                    values,
                    "workload.argv",
                    f"a perf profile, once for {name}",
                )
        return None

    def _would_run(self, argv: list, values: dict, key: str, what: str) -> None:
        """A dry run's line for a command the capture would run (issue 55 item 9): its arguments as they would be,
        whose user it runs as, and a shell command line named as one."""
        filled = fill_argv(argv, values, f"{self.experiment.path}: {key}")
        uid = os.geteuid()
        who = "root" if uid == 0 else f"uid {uid}"
        line = f"dry-run: would run as {who}: {shown(shlex.join(str(a) for a in filled), 2000)} ({what})"
        program = os.path.basename(str(filled[0])) if filled else ""
        if program in SHELLS and "-c" in filled[1:]:
            script = filled[filled.index("-c", 1) + 1] if filled.index("-c", 1) + 1 < len(filled) else ""
            line += f"; a shell runs the command line {shown(repr(str(script)), 400)}"
        self.log(line)


SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "busybox", "fish", "csh", "tcsh"})


class HostExecutor:
    """Makes each run on this host (the session's :class:`~ticklab.capture.session.Executor`): the condition's
    knobs through ``host``, the workload, tracing and per-run extras (``execute.execute_run``); after the runs,
    the experiment's profiles and once-per-condition cross-checks."""

    unit = "run"

    def __init__(self, experiment: Experiment, host: HostChanges, facts: dict, backend: str | None, log=print):
        self.experiment, self.host, self.facts, self.backend, self.log = experiment, host, facts, backend, log

    def make_run(self, writer: BundleWriter, planned: PlannedRun) -> bool:
        run_dir = writer.run_dir(planned.run)
        record = execute_run(self.experiment, planned, self.host, self.facts, self.backend, run_dir)
        values = workload_values(self.experiment, planned.condition, self.facts)
        add_run(writer, self.experiment, record, values, self.log)
        return True

    def after_runs(self, writer: BundleWriter, conditions: list[Condition]) -> None:
        if self.experiment.profile:
            self._profiles(writer, conditions)
        if self.experiment.extras_per_condition():
            self._extras(writer, conditions)

    def _once_per_condition(
        self,
        writer: BundleWriter,
        conditions: list[Condition],
        prefix: str,
        argv: list,
        source: str,
        wrap: Sequence[str] = (),
    ) -> list[dict]:
        """Run ``argv`` once for each condition, with its knobs, in raw/<prefix>-NNN; outside results.csv."""
        done = []
        for index, condition in enumerate(conditions):
            directory = writer.run_dir(f"{prefix}-{index + 1:03d}")
            outcome = run_once(self.experiment, condition, self.host, self.facts, argv, source, directory, wrap)
            done.append({"directory": directory.name, "condition": condition.name, **outcome})
        return done

    def _extras(self, writer: BundleWriter, conditions: list[Condition]) -> None:
        """Cross-checks (osnoise, timerlat ...): once per condition where the host has what they need."""
        done = []
        for extra in self.experiment.extras_per_condition():
            missing = requirements.missing(extra.get("requires", []), self.host, self.facts)
            if missing:
                done.append({"name": extra["name"], "skipped": missing})
                continue
            runs = self._once_per_condition(
                writer,
                conditions,
                f"extra-{extra['name']}",
                extra["argv"],
                f"{self.experiment.path}: extras.{extra['name']}.argv",
            )
            done += [{"name": extra["name"], **run} for run in runs]
        writer.manifest.extras = done

    def _profiles(self, writer: BundleWriter, conditions: list[Condition]) -> None:
        """One perf profile per condition (outside the measured runs), where perf works."""
        if shutil.which("perf") is None:
            writer.manifest.profiles = "perf is not installed"
            return
        when = self.experiment.profile.get("when") or {}
        wanted = [c for c in conditions if all(c.values.get(k) == v for k, v in when.items())]
        profiles = self._once_per_condition(
            writer,
            wanted,
            "profile",
            self.experiment.workload["argv"],
            f"{self.experiment.path}: workload.argv",
            wrap=["perf", "record", "-g", "-o", "perf.data", "--"],
        )
        for profile in profiles:
            directory = writer.path / "raw" / profile["directory"]
            report = subprocess.run(
                [
                    "perf",
                    "report",
                    "--stdio",
                    "--no-children",
                    "--percent-limit",
                    "0.5",
                    "-i",
                    str(directory / "perf.data"),
                ],
                capture_output=True,
                text=True,
                check=False,
            )
            (directory / "perf-report.txt").write_text(report.stdout)
        writer.manifest.profiles = profiles


def runs_on_this_host(experiment: Experiment, claim: str, given: bool) -> bool:
    """Whether ``ticklab capture <claim>`` runs ``experiment`` (False: a lab experiment of the claim's, left to
    ``lab run``); ExperimentError where it refuses it: another claim's, a lab experiment ``given`` with --experiment,
    a boot experiment."""
    path = experiment.path
    if experiment.claim != claim:
        raise ExperimentError(f"{path}: claim is {experiment.claim!r}, not {claim!r}")
    if experiment.lab is not None:
        if given:
            raise ExperimentError(f"{path}: a lab (guest) experiment; run it with 'ticklab lab run {claim}'")
        return False
    if is_boot_experiment(experiment):  # its conditions are kernels and command lines: one boot per run
        raise ExperimentError(
            f"{path}: a boot experiment (a host_kernel knob); run it with "
            f"'ticklab capture {claim} --boot kexec|grub|manual --experiment {path}'"
        )
    return True


def capture(claim: str, options: CaptureOptions, experiment_path: Path | None = None, log=print) -> list[Path]:
    """Run one experiment (the given file) or every experiment of the claim; the bundles written. With
    ``options.answer``, the capture ends with its answer (capture/answer.py), read back from the sealed bundles."""
    if claim not in CLAIM_IDS:
        raise ExperimentError(f"unknown claim {claim!r}; claims are: {', '.join(CLAIM_IDS)}")
    check_counts(options)
    paths = [experiment_path] if experiment_path else experiment_paths(claim)
    if not paths:
        raise ExperimentError(f"runners/{claim}/: no experiment definitions (*.yaml)")
    if options.answer is not None:  # a wrong published row stops the capture before its first run, not after
        for path in paths:
            check_refs(load_experiment(path), options.answer)
    bundles = []
    for path in paths:
        experiment = load_experiment(path)
        if not runs_on_this_host(experiment, claim, given=experiment_path is not None):
            continue
        bundle = Capture(experiment, options, log=log).run()
        if bundle:
            log(f"{bundle}: sealed")
            bundles.append(bundle)
    if options.answer is not None and bundles:
        for line in answer_lines(bundles, options.answer):
            log(line)
    return bundles
