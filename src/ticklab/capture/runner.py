"""`ticklab capture <claim>`: run an experiment on this host into one sealed bundle.

Warm-up runs come first and are kept (marked ``warmup``); measured runs of all conditions follow
in a seeded random order, recorded in the manifest. Each run applies its condition's knobs
through :class:`HostChanges` and puts them back afterwards; an interrupted capture restores the
host, leaves the bundle ``incomplete`` with the runs it finished, and exits non-zero.
If the host cannot run the experiment, the bundle records that, with the reason, and no runs.
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from .. import __version__
from ..bundle import BundleWriter
from ..claimids import CLAIM_IDS
from ..host import HostChanges, collect, host_id
from ..ingest import read_trace
from ..tracemetrics import METRIC_SETS
from ..paths import repo_root
from ..schemas import MAX_RUNS
from . import requirements, tracing
from .execute import apply_knobs, execute_run, run_once, workload_values
from .experiment import (Condition, Experiment, ExperimentError, expand_conditions, experiment_paths, load_experiment,
                         schedule)
from .process import WorkloadOutputError
from .stopping import Rounds, StoppingRule, describe
from .workloads import PARSERS

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
    goals: list | None = None      # the claim's stopping.PrecisionGoal s (None: none given, a fixed run count)


def _git_commit() -> str | None:
    try:
        result = subprocess.run(["git", "-C", str(repo_root()), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout.strip() or None


def tool_versions() -> dict:
    versions = {"ticklab": __version__, "ticklab_commit": _git_commit(), "python": sys.version.split()[0]}
    for name, argv in (("trace-cmd", ["trace-cmd", "--version"]), ("perf", ["perf", "--version"]),
                       ("hackbench", None), ("tbench", None)):
        path = shutil.which(name)
        if path and argv:
            result = subprocess.run(argv, capture_output=True, text=True, check=False)
            versions[name] = (result.stdout or result.stderr).strip().splitlines()[0] if (result.stdout or result.stderr) else path
        elif path:
            versions[name] = path
    return versions


def shown_path(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(repo_root()))
    except ValueError:
        return path.name


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
                self.writer.flush()
            raise

    def _run(self, host: HostChanges) -> Path | None:
        options, experiment = self.options, self.experiment
        with host:
            if experiment.trace:
                tracing.ensure_tracefs(host)  # in a dry run this only says it would mount
            found = collect(options.root)
            checked, failed = requirements.check_all(experiment.requires, host, found)
            conditions = expand_conditions(experiment, found)
            if not conditions and not failed:
                failed["conditions"] = "no condition of this experiment exists on this host"
            backend, backend_why = (tracing.choose_backend(host, options.backend) if experiment.trace and not failed
                                    else (None, None))
            identity = options.host_id or host_id(found)
            if not HOST_ID_PATTERN.match(identity):
                raise ExperimentError(f"--host-id {identity!r}: use lower-case letters, digits, '.', '_' and '-'")
            runs = options.runs or experiment.runs
            warmup = experiment.warmup if options.warmup is None else options.warmup
            seed = experiment.seed if options.seed is None else options.seed
            plan = [] if failed else schedule(conditions, runs, warmup, seed)
            rule = None if failed else StoppingRule.for_capture(experiment, conditions, runs_fixed=options.runs is not None,
                                                                 budget_s=options.budget_s, goals=options.goals)
            if options.dry_run:
                return self._dry_run(host, plan, found, failed, backend, rule)
            definition = {**experiment.definition, "path": shown_path(experiment.path)}
            writer = self.writer = BundleWriter(options.out, identity, experiment.claim, experiment.name, definition=definition,
                                  host=found, tools=tool_versions())
            manifest = writer.manifest
            manifest.requirements = checked
            manifest.conditions = [c.record() for c in conditions]
            manifest.seed, manifest.runs_per_condition, manifest.warmup_per_condition = seed, runs, warmup
            manifest.order = [{"run": p.run, "condition": p.condition.name, "warmup": p.warmup} for p in plan]
            manifest.tracing = {"backend": backend, "why": backend_why, "events": (experiment.trace or {}).get("events", [])}
            if failed:
                manifest.not_testable = requirements.unmet_text(failed)
                self.log(f"{experiment.claim}/{experiment.name}: not testable on this host — {manifest.not_testable}")
            else:
                self._run_plan(writer, host, Rounds(plan, rule, conditions, seed, writer), conditions, found, backend)
        writer.manifest.knobs = host.records()  # now with the values read back after restoring
        return writer.seal()

    def _run_plan(self, writer: BundleWriter, host: HostChanges, rounds: Rounds, conditions, found: dict,
                  backend) -> None:
        experiment = self.experiment
        try:
            for planned in rounds.shown(f"{experiment.claim}/{experiment.name}", "run", self.options.progress):
                self._one_run(writer, host, planned, found, backend)
            self.log(f"{experiment.claim}/{experiment.name}: stopped — {writer.manifest.stopping['reason']}")
            if experiment.profile:
                self._profiles(writer, host, conditions, found)
            if experiment.extras_per_condition():
                self._extras(writer, host, conditions, found)
        except BaseException as exc:
            writer.manifest.interrupted = f"{type(exc).__name__}: {exc}"
            writer.flush()
            self.log(f"capture interrupted; {writer.path} is incomplete with {len(writer.manifest.runs)} finished run(s)")
            raise

    def _dry_run(self, host: HostChanges, plan, found: dict, failed: dict, backend, rule) -> None:
        experiment = self.experiment
        if failed:
            self.log(f"{experiment.claim}/{experiment.name}: not testable on this host — "
                     + requirements.unmet_text(failed))
            return None
        self.log(f"stopping: {describe(rule)}")
        for planned in plan:
            self.log(f"{planned.run} {planned.condition.name}{' (warm-up)' if planned.warmup else ''}:")
            with host.scope():
                apply_knobs(host, experiment, planned.condition, found)
                if experiment.trace:
                    for line in tracing.planned_tracefs_writes(host.root, experiment.trace["events"],
                                                               int(experiment.trace.get("buffer_kb", 4096)),
                                                               experiment.trace.get("functions") or []):
                        self.log(f"dry-run: would {line}")
        return None

    def _one_run(self, writer: BundleWriter, host: HostChanges, planned, found: dict, backend: str | None) -> None:
        run_dir = writer.run_dir(planned.run)
        record = execute_run(self.experiment, planned, host, found, backend, run_dir)
        values = workload_values(self.experiment, planned.condition, found)
        add_run(writer, self.experiment, record, values, self.log)

    def _once_per_condition(self, writer: BundleWriter, host: HostChanges, conditions: list[Condition], found: dict,
                            prefix: str, argv: list, source: str, wrap: list[str] = ()) -> list[dict]:
        """Run ``argv`` once for each condition, with its knobs, in raw/<prefix>-NNN; outside results.csv."""
        done = []
        for index, condition in enumerate(conditions):
            directory = writer.run_dir(f"{prefix}-{index + 1:03d}")
            outcome = run_once(self.experiment, condition, host, found, argv, source, directory, wrap)
            done.append({"directory": directory.name, "condition": condition.name, **outcome})
        return done

    def _extras(self, writer: BundleWriter, host: HostChanges, conditions: list[Condition], found: dict) -> None:
        """Cross-checks (osnoise, timerlat ...): once per condition where the host has what they need."""
        done = []
        for extra in self.experiment.extras_per_condition():
            missing = requirements.missing(extra.get("requires", []), host, found)
            if missing:
                done.append({"name": extra["name"], "skipped": missing})
                continue
            runs = self._once_per_condition(writer, host, conditions, found, f"extra-{extra['name']}", extra["argv"],
                                            f"{self.experiment.path}: extras.{extra['name']}.argv")
            done += [{"name": extra["name"], **run} for run in runs]
        writer.manifest.extras = done

    def _profiles(self, writer: BundleWriter, host: HostChanges, conditions: list[Condition], found: dict) -> None:
        """One perf profile per condition (outside the measured runs), where perf works."""
        if shutil.which("perf") is None:
            writer.manifest.profiles = "perf is not installed"
            return
        when = self.experiment.profile.get("when") or {}
        wanted = [c for c in conditions if all(c.values.get(k) == v for k, v in when.items())]
        profiles = self._once_per_condition(writer, host, wanted, found, "profile", self.experiment.workload["argv"],
                                            f"{self.experiment.path}: workload.argv",
                                            wrap=["perf", "record", "-g", "-o", "perf.data", "--"])
        for profile in profiles:
            directory = writer.path / "raw" / profile["directory"]
            report = subprocess.run(["perf", "report", "--stdio", "--no-children", "--percent-limit", "0.5",
                                     "-i", str(directory / "perf.data")], capture_output=True, text=True, check=False)
            (directory / "perf-report.txt").write_text(report.stdout)
        writer.manifest.profiles = profiles


def run_results(experiment: Experiment, run_dir: Path, record: dict, values: dict) -> tuple[list[dict], str | None]:
    """The metric rows of a finished run (workload output, then trace metrics), or why there are none."""
    if record["status"] != "ok":
        return [], None
    try:
        results = PARSERS[experiment.workload["tool"]](run_dir)
        if record.get("trace") and experiment.trace.get("metrics"):
            metrics = METRIC_SETS[experiment.trace["metrics"]]
            results += metrics(read_trace(run_dir / record["trace"]["directory"]), values)
    except (WorkloadOutputError, KeyError, ValueError, OverflowError, TypeError) as exc:
        return [], str(exc)
    rows = [{**row, "value": float(row["value"])} for row in results]
    odd = [row["metric"] for row in rows if not math.isfinite(row["value"])]
    if odd:
        return [], f"{run_dir}: metric(s) {', '.join(odd)} not finite; the run's results are not recorded"
    return rows, None


def add_run(writer: BundleWriter, experiment: Experiment, record: dict, values: dict, log=print) -> None:
    """Add a finished run to the bundle: its record in the manifest, its results (unless a warm-up) in results.csv."""
    run_dir = writer.path / "raw" / record["run"]
    results, problem = run_results(experiment, run_dir, record, values)
    record = {**record, "problem": record.get("problem") or problem}
    trace = record.get("trace") or {}
    if trace.get("lost_events"):
        log(f"{record['run']}: the kernel lost {trace['lost_events']} trace event(s)")
    if (record.get("interference") or {}).get("busy"):
        log(f"{record['run']}: ran on a busy host — {record['interference']['why']}")
    if record["status"] != "ok" or record["problem"]:
        log(f"{record['run']} {record['condition']}: {record['status']}"
            f"{' — ' + record['problem'] if record['problem'] else ''} (see {run_dir / 'stderr.txt'})")
    if record["warmup"]:  # kept in the manifest, excluded from results.csv and so from every analysis
        record["warmup_results"] = results
    writer.add_run(record, [] if record["warmup"] else results)


def check_counts(options) -> None:
    """--runs, --warmup, --seed, --budget-s as given (argparse checks them too; this guards other callers)."""
    limits = {"runs": (1, MAX_RUNS), "warmup": (0, 1000), "seed": (0, 2**63 - 1)}
    for name, (low, high) in limits.items():
        value = getattr(options, name, None)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high):
            raise ExperimentError(f"--{name} {value!r}: must be a whole number from {low} to {high}")
    budget = getattr(options, "budget_s", None)
    if budget is not None and not (isinstance(budget, (int, float)) and math.isfinite(budget) and 0 <= budget <= 7 * 86400):
        raise ExperimentError(f"--budget-s {budget!r}: must be seconds from 0 to {7 * 86400}")


def capture(claim: str, options: CaptureOptions, experiment_path: Path | None = None, log=print) -> list[Path]:
    """Run one experiment (the given file) or every experiment of the claim; the bundles written."""
    if claim not in CLAIM_IDS:
        raise ExperimentError(f"unknown claim {claim!r}; claims are: {', '.join(CLAIM_IDS)}")
    check_counts(options)
    paths = [experiment_path] if experiment_path else experiment_paths(claim)
    if not paths:
        raise ExperimentError(f"runners/{claim}/: no experiment definitions (*.yaml)")
    bundles = []
    for path in paths:
        experiment = load_experiment(path)
        if experiment.claim != claim:
            raise ExperimentError(f"{path}: claim is {experiment.claim!r}, not {claim!r}")
        if experiment.lab is not None:
            if experiment_path:
                raise ExperimentError(f"{path}: a lab (guest) experiment; run it with 'ticklab lab run {claim}'")
            continue
        bundle = Capture(experiment, options, log=log).run()
        if bundle:
            log(f"{bundle}: sealed")
            bundles.append(bundle)
    return bundles
