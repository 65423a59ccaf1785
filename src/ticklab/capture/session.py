"""One capture session: plan → warm-ups → interleaved measured runs → rounds → one bundle, whatever makes the runs.

``ticklab capture`` (this host) and ``ticklab lab run`` (a QEMU guest boot per run) differ only in how one
run is made; everything around it is here, once:

- :func:`plan_counts` — runs, warm-ups and seed (the command line over the experiment);
- :func:`open_bundle` — the bundle with its plan: definition, tools, conditions, counts and the ``order``
  (``schedule``: warm-ups first, then blocks of one run of every condition, each in a seeded order);
- :class:`Session` — iterates :class:`~ticklab.capture.stopping.Rounds` (the plan, then the rounds the
  stopping rule asks for), hands each planned run to an :class:`Executor`, then lets it do its per-condition
  work (profiles, cross-checks); an exception (Ctrl-C included) marks the bundle ``interrupted``, flushes it
  and goes on up, so the bundle stays ``incomplete`` with every run it finished;
- :func:`add_run` — a made run into the bundle: its record in the manifest, its results (workload output,
  then the experiment's trace metrics) in results.csv unless it is a warm-up.

The executor interface (:class:`Executor`)::

    unit: str                                          # what one run is called in progress bars: "run", "boot"
    make_run(writer: BundleWriter, planned: PlannedRun) -> bool
        # make the planned run and add it (add_run); False: where runs are made cannot run the experiment
        # at all (the executor has set manifest.not_testable) and the session stops
    after_runs(writer: BundleWriter, conditions: list[Condition]) -> None
        # once the measured runs are done: per-condition work outside results.csv (profiles, cross-checks)

Executors today: ``capture.runner.HostExecutor`` (this host: knobs through ``HostChanges``, workloads,
tracing, per-run extras) and ``lab.run.LabExecutor`` (one QEMU boot of a lab guest per run, the guest
running the same capture code).

A third kind — a kexec, GRUB or manual reboot of this host per run — makes each run in a *new process*
after the boot. It works with the same pieces because the bundle on disk is the session's whole state:
the manifest's ``order`` is the plan (rounds append to it), ``runs`` are the runs made (each written
and flushed as it finishes, :meth:`BundleWriter.add_run`), ``conditions``/``seed``/``stopping`` the rest.
``Rounds`` skips every planned run the manifest already records, so a resumed process reopens the
incomplete bundle, makes the next planned run (its executor's ``make_run`` checks the boot it finds, as
the lab's ``boot_mismatch`` does) and, before rebooting for the one after, flushes the manifest. What such
an executor must add is the reopening of a bundle for writing and the boot plan; nothing here changes.
"""

from __future__ import annotations

import math
import shutil
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from .. import __version__
from ..bundle import BundleError, BundleWriter, superseded_record
from ..paths import repo_root
from ..schemas import MAX_RUNS
from .experiment import Condition, Experiment, ExperimentError, PlannedRun, metric_set_names, schedule
from .process import WorkloadOutputError
from .stopping import Rounds, StoppingRule
from .workloads import PARSERS


class Executor(Protocol):
    """How the runs of a session are made (see the module docstring)."""

    unit: str

    def make_run(self, writer: BundleWriter, planned: PlannedRun) -> bool: ...

    def after_runs(self, writer: BundleWriter, conditions: list[Condition]) -> None: ...


class Session:
    """The runs of one experiment into one bundle: rounds of planned runs, each made by ``executor``."""

    def __init__(
        self,
        experiment: Experiment,
        executor: Executor,
        writer: BundleWriter,
        plan: list[PlannedRun],
        rule: StoppingRule,
        conditions: list[Condition],
        seed: int,
        *,
        what: str,
        desc: str,
        progress: bool = True,
        log=print,
        run_lines: bool = False,
    ):
        self.experiment, self.executor, self.writer = experiment, executor, writer
        self.plan, self.rule, self.conditions, self.seed = plan, rule, conditions, seed
        self.what, self.desc, self.progress, self.log = what, desc, progress, log
        self.run_lines = run_lines  # one line per run made (a log, where no progress bar is seen)

    def run(self) -> bool:
        """Make every run; False when the executor found the experiment not testable where it makes runs."""
        experiment, writer = self.experiment, self.writer
        try:
            rounds = Rounds(self.plan, self.rule, self.conditions, self.seed, writer)
            for planned in rounds.shown(self.desc, self.executor.unit, self.progress):
                began = time.monotonic()
                if not self.executor.make_run(writer, planned):
                    return False
                if self.run_lines:
                    self.log(run_line(writer, self.experiment, planned, time.monotonic() - began))
            self.log(f"{experiment.claim}/{experiment.name}: stopped — {writer.manifest.stopping['reason']}")
            self.executor.after_runs(writer, self.conditions)
        except BaseException as exc:
            writer.manifest.interrupted = f"{type(exc).__name__}: {exc}"
            try:
                writer.flush()
            except BundleError as failed:  # a full disk: the manifest on disk stays the last one written (incomplete)
                self.log(f"{failed}; the manifest keeps the state of the last run written")
            self.log(
                f"{self.what} interrupted; {writer.path} is incomplete with {len(writer.manifest.runs)} finished run(s)"
            )
            raise
        return True


def run_line(writer: BundleWriter, experiment: Experiment, planned: PlannedRun, seconds: float) -> str:
    """One line for a run just made: its id, how far the capture is, its condition, how long it took (the run and its
    per-run extras) and the value of the experiment's first headline metric (its ``answer``), as results.csv has it."""
    manifest = writer.manifest
    record = next((r for r in reversed(manifest.runs) if r.run == planned.run), None)
    made, planned_count = len(manifest.runs), max(len(manifest.order or []), len(manifest.runs))
    line = (
        f"{planned.run} ({made} of {planned_count}) {planned.condition.name}"
        f"{' (warm-up)' if planned.warmup else ''}: {seconds:.1f} s"
    )
    if record is None:
        return line + ", not recorded"
    if record.failed:
        return line + f", {record.status}{' with a problem' if record.problem else ''} (left out of the analysis)"
    metric = (experiment.answer or [{}])[0].get("metric")
    if metric is None:
        return line
    if record.warmup:
        rows = record.details.get("warmup_results") or []
    else:
        results = writer.results()
        rows = results[results["run"] == record.run].to_dict("records")
    found = next((row for row in rows if row.get("metric") == metric), None)
    if found is None:
        return line + f", no {metric}"
    return line + f", {metric} {float(found['value']):.4g} {found.get('unit', '')}".rstrip()


@dataclass
class CapturePlan:
    """What every way of capturing (``capture``, ``capture --boot``, ``lab run``, ``lab run --boot``) decides before
    its bundle exists: the conditions, the counts (runs, warm-ups, seed) and the first runs in order; then the one
    way from it to the bundle (:meth:`open_bundle`) and to the session that makes the runs (:meth:`session`)."""

    experiment: Experiment
    conditions: list[Condition]
    counts: tuple[int, int, int]
    runs: list[PlannedRun]
    supersedes: list[dict] = field(default_factory=list)  # bundle.superseded_record of each --supersedes bundle

    @classmethod
    def of(cls, experiment: Experiment, conditions: list[Condition], options, *, runnable: bool = True) -> CapturePlan:
        """The plan of ``options`` (--runs, --warmup, --seed over the experiment's); no runs when not ``runnable``
        (the host cannot test it: its bundle says why and holds none). Each bundle ``options.supersedes`` names is
        verified here, before the first run (BundleError naming it)."""
        counts = plan_counts(experiment, options)
        replaced = [
            superseded_record(old, experiment.claim, experiment.name) for old in getattr(options, "supersedes", ())
        ] + list(getattr(options, "supersedes_records", ()))
        return cls(experiment, conditions, counts, plan(conditions, counts) if runnable else [], replaced)

    def stopping_rule(self, options) -> StoppingRule:
        """The rule the command line asks for: a fixed count with --runs, else the claim's goals within a budget."""
        return StoppingRule.for_capture(
            self.experiment,
            self.conditions,
            runs_fixed=options.runs is not None,
            budget_s=options.budget_s,
            goals=options.goals,
        )

    def open_bundle(self, out: Path, identity: str, host: dict) -> BundleWriter:
        writer = open_bundle(out, identity, self.experiment, host, self.conditions, self.counts, self.runs)
        writer.manifest.supersedes = self.supersedes or None
        return writer

    def session(self, executor: Executor, writer: BundleWriter, rule: StoppingRule, **how) -> Session:
        """The session making these runs into ``writer`` (``how``: Session's what, desc, progress, log, run_lines)."""
        return Session(self.experiment, executor, writer, self.runs, rule, self.conditions, self.counts[2], **how)


def plan(conditions: list[Condition], counts: tuple[int, int, int]) -> list[PlannedRun]:
    """The first plan: ``warmup`` warm-ups of each condition, then ``runs`` of each in a ``seed``-ed shuffle."""
    runs, warmup, seed = counts
    return schedule(conditions, runs, warmup, seed)


def plan_counts(experiment: Experiment, options) -> tuple[int, int, int]:
    """(measured runs per condition, warm-ups per condition, seed): ``options`` (--runs ...) over the experiment."""
    runs = options.runs or experiment.runs
    warmup = experiment.warmup if options.warmup is None else options.warmup
    seed = experiment.seed if options.seed is None else options.seed
    return runs, warmup, seed


def open_bundle(
    out: Path,
    identity: str,
    experiment: Experiment,
    host: dict,
    conditions: list[Condition],
    counts: tuple[int, int, int],
    plan: list[PlannedRun],
) -> BundleWriter:
    """A new bundle holding the session's plan (the manifest keys every capture has)."""
    runs, warmup, seed = counts
    definition = {**experiment.definition, "path": shown_path(experiment.path)}
    writer = BundleWriter(
        out,
        identity,
        experiment.claim,
        experiment.name,
        definition=definition,
        host=host,
        tools=tool_versions(experiment),
    )
    manifest = writer.manifest
    manifest.conditions = [c.record() for c in conditions]
    manifest.seed, manifest.runs_per_condition, manifest.warmup_per_condition = seed, runs, warmup
    manifest.order = [
        {
            "run": p.run,
            "condition": p.condition.name,
            "warmup": p.warmup,
            **({"block": p.block} if p.block is not None else {}),
        }
        for p in plan
    ]
    return writer


def _git_commit() -> str | None:
    try:
        result = subprocess.run(
            ["git", "-C", str(repo_root()), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout.strip() or None


def tool_versions(experiment: Experiment | None = None) -> dict:
    """ticklab's version and commit, Python's, the tracers' and where each program the experiment requires
    (``program:NAME``, its extras' too) was found."""
    versions = {"ticklab": __version__, "ticklab_commit": _git_commit(), "python": sys.version.split()[0]}
    required = [] if experiment is None else experiment.all_requires()
    programs = [r.partition(":")[2] for r in required if r.startswith("program:")]
    for name, argv in (
        ("trace-cmd", ["trace-cmd", "--version"]),
        ("perf", ["perf", "--version"]),
        *((program, None) for program in programs),
    ):
        path = shutil.which(name)
        if path and argv:
            result = subprocess.run(argv, capture_output=True, text=True, check=False)
            versions[name] = (
                (result.stdout or result.stderr).strip().splitlines()[0] if (result.stdout or result.stderr) else path
            )
        elif path:
            versions[name] = path
    return versions


def shown_path(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(repo_root()))
    except ValueError:
        return path.name


def run_results(experiment: Experiment, run_dir: Path, record: dict, values: dict) -> tuple[list[dict], str | None]:
    """The metric rows of a finished run (workload output, then trace metrics), or why there are none."""
    if record["status"] != "ok":
        return [], None
    # the trace reader and metric sets (numpy, pandas) here, where a run's results are made: a dry run imports neither
    from ..trace.ingest import read_trace
    from ..trace.tracemetrics import METRIC_SETS

    try:
        results = PARSERS[experiment.workload["tool"]](run_dir)
        if record.get("trace") and experiment.trace.get("metrics"):
            trace = read_trace(run_dir / record["trace"]["directory"])
            # the run's argv too: a metric per unit of work needs the work's size (hackbench's messages)
            for name in metric_set_names(experiment.trace["metrics"]):
                results += METRIC_SETS[name](trace, {**values, "argv": record.get("argv")})
    except (WorkloadOutputError, KeyError, ValueError, OverflowError, TypeError) as exc:
        return [], str(exc)
    rows = [{**row, "value": float(row["value"])} for row in results]
    odd = [row["metric"] for row in rows if not math.isfinite(row["value"])]
    if odd:
        return [], f"{run_dir}: metric(s) {', '.join(odd)} not finite; the run's results are not recorded"
    twice = sorted(metric for metric, count in Counter(row["metric"] for row in rows).items() if count > 1)
    if twice:
        return [], f"{run_dir}: metric(s) {', '.join(twice)} given twice (the workload's and trace.metrics' sets)"
    return rows, None


def add_run(writer: BundleWriter, experiment: Experiment, record: dict, values: dict, log=print) -> None:
    """Add a finished run to the bundle: its record in the manifest, its results (unless a warm-up) in results.csv."""
    run_dir = writer.path / "raw" / record["run"]
    results, problem = run_results(experiment, run_dir, record, values)
    record = {**record, "problem": record.get("problem") or problem}
    trace = record.get("trace") or {}
    if trace.get("lost_events"):
        log(f"{record['run']}: the kernel lost {trace['lost_events']} trace event(s)")
    for extra in record.get("extras") or []:
        if (extra.get("trace") or {}).get("lost_events"):
            log(
                f"{record['run']}: the kernel lost {extra['trace']['lost_events']} trace event(s) while extra "
                f"{extra['name']} ran"
            )
    if (record.get("interference") or {}).get("busy"):
        log(f"{record['run']}: ran on a busy host — {record['interference']['why']}")
    if record["status"] != "ok" or record["problem"]:
        log(
            f"{record['run']} {record['condition']}: {record['status']}"
            f"{' — ' + record['problem'] if record['problem'] else ''} (see {run_dir / 'stderr.txt'})"
        )
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
    if budget is not None and not (
        isinstance(budget, (int, float)) and math.isfinite(budget) and 0 <= budget <= 7 * 86400
    ):
        raise ExperimentError(f"--budget-s {budget!r}: must be seconds from 0 to {7 * 86400}")
