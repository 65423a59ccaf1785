"""`ticklab capture <claim>`: run an experiment on this host into one sealed bundle.

Warm-up runs come first and are kept (marked ``warmup``); measured runs of all conditions follow
in a seeded random order, recorded in the manifest. Each run applies its condition's knobs
through :class:`HostChanges` and puts them back afterwards; an interrupted capture restores the
host, leaves the bundle ``incomplete`` with the runs it finished, and exits non-zero.
If the host cannot run the experiment, the bundle records that, with the reason, and no runs.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from .. import __version__
from ..bundle import BundleWriter
from ..claims import CLAIMS
from ..host import HostChanges, collect, host_id
from ..ingest import read_trace
from ..paths import repo_root
from . import requirements, tracing
from .experiment import (Condition, Experiment, ExperimentError, expand_conditions, experiment_paths, fill_argv,
                         load_experiment, schedule)
from .workloads import PARSERS, WorkloadOutputError, run_command

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


def apply_knobs(host: HostChanges, experiment: Experiment, condition: Condition, found: dict) -> None:
    for variable, kind in experiment.knobs.items():
        if variable not in condition.values:
            continue
        value = condition.values[variable]
        if kind == "clocksource":
            host.set_clocksource(str(value))
        elif kind.startswith("sched_feature:"):
            host.set_sched_feature(kind.split(":", 1)[1], str(value).lower() in ("on", "1", "true", "yes"))
        elif kind == "idle_config":
            names = [s["name"] for s in found["cpuidle"]["states"]]
            if value != "all":
                deepest = str(value).split("=", 1)[1]
                for name in names[names.index(deepest) + 1:]:
                    host.set_cpuidle_state(name, disabled=True)


def _values(experiment: Experiment, condition: Condition, found: dict, run_dir: Path) -> dict:
    params = dict(experiment.workload.get("params") or {})
    # Workloads run inside their run directory, so "{run_dir}" is "." and manifests hold no local paths.
    return {"tools": str(requirements.tools_bin()), "repo": str(repo_root()), "run_dir": ".",
            "nproc": found["nproc"], "last_cpu": found["online_cpus"][-1], **params, **condition.values}


def _shown_path(path: Path) -> str:
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
                self.writer.manifest["knobs"] = host.records()
                self.writer.flush()
            raise

    def _run(self, host: HostChanges) -> Path | None:
        options, experiment = self.options, self.experiment
        with host:
            if experiment.trace:
                tracing.ensure_tracefs(host)  # in a dry run this only says it would mount
            found = collect(options.root)
            checks = {r: requirements.check(r, host, found) for r in experiment.requires}
            failed = {r: why for r, (ok, why) in checks.items() if not ok}
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
            if options.dry_run:
                return self._dry_run(host, plan, found, failed, backend)
            definition = {**experiment.definition, "path": _shown_path(experiment.path)}
            writer = self.writer = BundleWriter(options.out, identity, experiment.claim, experiment.name, definition=definition,
                                  host=found, tools=tool_versions())
            writer.manifest.update({
                "requirements": {r: {"ok": ok, "why": why} for r, (ok, why) in checks.items()},
                "conditions": [c.record() for c in conditions], "seed": seed, "runs_per_condition": runs,
                "warmup_per_condition": warmup, "order": [{"run": p.run, "condition": p.condition.name, "warmup": p.warmup}
                                                          for p in plan],
                "tracing": {"backend": backend, "why": backend_why, "events": (experiment.trace or {}).get("events", [])},
            })
            if failed:
                writer.manifest["not_testable"] = "; ".join(f"{r}: {why}" for r, why in failed.items())
                self.log(f"{experiment.claim}/{experiment.name}: not testable on this host — {writer.manifest['not_testable']}")
            else:
                self._run_plan(writer, host, plan, conditions, found, backend)
        writer.manifest["knobs"] = host.records()  # now with the values read back after restoring
        return writer.seal()

    def _run_plan(self, writer: BundleWriter, host: HostChanges, plan, conditions, found: dict, backend) -> None:
        experiment = self.experiment
        try:
            bar = tqdm(plan, desc=f"{experiment.claim}/{experiment.name}", unit="run", disable=not self.options.progress,
                       file=sys.stderr)
            for planned in bar:
                bar.set_postfix_str(planned.condition.name + (" (warm-up)" if planned.warmup else ""))
                self._one_run(writer, host, planned, found, backend)
            if experiment.profile:
                self._profiles(writer, host, conditions, found)
            if experiment.extras:
                self._extras(writer, host, conditions, found)
        except BaseException as exc:
            writer.manifest["interrupted"] = f"{type(exc).__name__}: {exc}"
            writer.flush()
            self.log(f"capture interrupted; {writer.path} is incomplete with {len(writer.manifest['runs'])} finished run(s)")
            raise

    def _dry_run(self, host: HostChanges, plan, found: dict, failed: dict, backend) -> None:
        experiment = self.experiment
        if failed:
            self.log(f"{experiment.claim}/{experiment.name}: not testable on this host — "
                     + "; ".join(f"{r}: {why}" for r, why in failed.items()))
            return None
        for planned in plan:
            self.log(f"{planned.run} {planned.condition.name}{' (warm-up)' if planned.warmup else ''}:")
            with host.scope():
                apply_knobs(host, experiment, planned.condition, found)
                if experiment.trace:
                    for line in tracing.planned_tracefs_writes(host.root, experiment.trace["events"],
                                                               int(experiment.trace.get("buffer_kb", 4096))):
                        self.log(f"dry-run: would {line}")
        return None

    def _one_run(self, writer: BundleWriter, host: HostChanges, planned, found: dict, backend: str | None) -> None:
        experiment = self.experiment
        run_dir = writer.run_dir(planned.run)
        values = _values(experiment, planned.condition, found, run_dir)
        argv = fill_argv(experiment.workload["argv"], values, f"{experiment.path}: workload.argv")
        trace_result = None
        server = None
        with host.scope() as scope:
            apply_knobs(host, experiment, planned.condition, found)
            if experiment.workload.get("server"):
                server_argv = fill_argv(experiment.workload["server"], values, f"{experiment.path}: workload.server")
                server = subprocess.Popen(server_argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                          start_new_session=True)
                time.sleep(float(experiment.workload.get("server_start_s", 1)))
            try:
                if experiment.trace:
                    trace_dir = run_dir / "trace"
                    with tracing.recorder(backend, host, experiment.trace["events"], trace_dir,
                                          buffer_kb=int(experiment.trace.get("buffer_kb", 4096))) as recording:
                        outcome = run_command(argv, run_dir, experiment.timeout_s)
                    trace_result = recording.result
                else:
                    outcome = run_command(argv, run_dir, experiment.timeout_s)
            finally:
                if server is not None:
                    server.terminate()
                    try:
                        server.wait(timeout=10)
                    except subprocess.TimeoutExpired:
                        server.kill()
                        server.wait()
        results, problem = [], None
        if outcome["status"] == "ok":
            try:
                results = PARSERS[experiment.workload["tool"]](run_dir)
                if trace_result is not None and experiment.trace.get("metrics"):
                    module = CLAIMS[experiment.claim].load_module()
                    results += module.trace_metrics(read_trace(trace_result.directory), values)
            except (WorkloadOutputError, KeyError, ValueError) as exc:
                problem = str(exc)
        results = [{**row, "value": float(row["value"])} for row in results]
        record = {"run": planned.run, "condition": planned.condition.name, "order": planned.order,
                  "warmup": planned.warmup, "values": planned.condition.values, **outcome,
                  "knobs": [c.record() for c in scope.changes],
                  "trace": trace_result.record() if trace_result else None, "problem": problem}
        if trace_result and trace_result.lost_events:
            self.log(f"{planned.run}: the kernel lost {trace_result.lost_events} trace event(s)")
        if outcome["status"] != "ok" or problem:
            self.log(f"{planned.run} {planned.condition.name}: {outcome['status']}{' — ' + problem if problem else ''} "
                     f"(see {run_dir / 'stderr.txt'})")
        if planned.warmup:  # kept in the manifest, excluded from results.csv and so from every analysis
            record["warmup_results"] = results
        writer.add_run(record, [] if planned.warmup else results)

    def _once_per_condition(self, writer: BundleWriter, host: HostChanges, conditions: list[Condition], found: dict,
                            prefix: str, argv: list, source: str, wrap: list[str] = ()) -> list[dict]:
        """Run ``argv`` once for each condition, with its knobs, in raw/<prefix>-NNN; outside results.csv."""
        done = []
        for index, condition in enumerate(conditions):
            directory = writer.run_dir(f"{prefix}-{index + 1:03d}")
            filled = fill_argv(argv, _values(self.experiment, condition, found, directory), source)
            with host.scope():
                apply_knobs(host, self.experiment, condition, found)
                outcome = run_command([*wrap, *filled], directory, self.experiment.timeout_s)
            done.append({"directory": directory.name, "condition": condition.name, **outcome})
        return done

    def _extras(self, writer: BundleWriter, host: HostChanges, conditions: list[Condition], found: dict) -> None:
        """Cross-checks (osnoise, timerlat ...): once per condition where the host has what they need."""
        done = []
        for extra in self.experiment.extras:
            checks = {r: requirements.check(r, host, found) for r in extra.get("requires", [])}
            missing = "; ".join(f"{r}: {why}" for r, (ok, why) in checks.items() if not ok)
            if missing:
                done.append({"name": extra["name"], "skipped": missing})
                continue
            runs = self._once_per_condition(writer, host, conditions, found, f"extra-{extra['name']}", extra["argv"],
                                            f"{self.experiment.path}: extras.{extra['name']}.argv")
            done += [{"name": extra["name"], **run} for run in runs]
        writer.manifest["extras"] = done

    def _profiles(self, writer: BundleWriter, host: HostChanges, conditions: list[Condition], found: dict) -> None:
        """One perf profile per condition (outside the measured runs), where perf works."""
        if shutil.which("perf") is None:
            writer.manifest["profiles"] = "perf is not installed"
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
        writer.manifest["profiles"] = profiles


def capture(claim: str, options: CaptureOptions, experiment_path: Path | None = None, log=print) -> list[Path]:
    """Run one experiment (the given file) or every experiment of the claim; the bundles written."""
    if claim not in CLAIMS:
        raise ExperimentError(f"unknown claim {claim!r}; claims are: {', '.join(CLAIMS)}")
    paths = [experiment_path] if experiment_path else experiment_paths(claim)
    if not paths:
        raise ExperimentError(f"runners/{claim}/: no experiment definitions (*.yaml)")
    bundles = []
    for path in paths:
        experiment = load_experiment(path)
        if experiment.claim != claim:
            raise ExperimentError(f"{path}: claim is {experiment.claim!r}, not {claim!r}")
        bundle = Capture(experiment, options, log=log).run()
        if bundle:
            log(f"{bundle}: sealed")
            bundles.append(bundle)
    return bundles
