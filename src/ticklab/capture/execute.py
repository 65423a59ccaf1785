"""One run of an experiment: its condition's knobs applied, the server started, the trace recorded
and the workload run, in a run directory.

The same code makes a run on this host (`ticklab capture`) and inside a lab guest (`ticklab lab run`),
so a run means the same thing in both places. Turning what the run wrote into results is done
afterwards, on the host (:func:`ticklab.capture.session.run_results`): the guest image carries no
pandas.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from ..host import HostChanges
from ..host.journal import HostChangeError
from ..paths import repo_root
from . import interference, requirements, tracing
from .experiment import Condition, Experiment, PlannedRun, fill_argv, idle_states_to_disable
from .process import WorkloadOutputError, run_command, spawn, stop

# Knobs the lab sets when it boots a guest; inside the guest they are checked, not written.
BOOT_KNOBS = ("boot_cmdline", "lab_kernel", "host_kernel")


def measured_cpu(experiment: Experiment, facts: dict) -> int | None:
    """The CPU an ``isolate`` experiment leaves to its workload (None: the experiment isolates nothing)."""
    if not experiment.isolate:
        return None
    return facts["online_cpus"][-1]  # isolate.cpu is "last", the CPU the workloads' {last_cpu} names


def apply_knobs(host: HostChanges, experiment: Experiment, condition: Condition, facts: dict) -> None:
    cpu = measured_cpu(experiment, facts)
    if cpu is not None:
        if len(facts["online_cpus"]) < 2:  # nowhere to move anything to; a SCHED_FIFO hog would own the machine
            raise HostChangeError(
                f"{experiment.path}: isolate needs a second online CPU to move interrupts and tasks "
                f"to (online here: {facts['online_cpus']})"
            )
        host.isolate_cpu(cpu)
        if experiment.isolate.get("rt_throttling") == "off":
            # a realtime task is otherwise stopped for 50 ms of every second (sched_rt_runtime_us 950000 of
            # 1000000): measured here, 5% of FTQ's quanta lost to the throttle, none of them to the tick
            host.write("proc/sys/kernel/sched_rt_runtime_us", "-1", label="RT throttling off")
    for variable, kind in experiment.knobs.items():
        if variable not in condition.values or kind in BOOT_KNOBS:
            continue
        value = condition.values[variable]
        if kind == "clocksource":
            host.set_clocksource(str(value))
        elif kind.startswith("sched_feature:"):
            host.set_sched_feature(kind.split(":", 1)[1], str(value).lower() in ("on", "1", "true", "yes"))
        elif kind == "idle_config":
            names = [s["name"] for s in facts["cpuidle"]["states"]]
            for name in idle_states_to_disable(value, names, f"{experiment.path}: knobs.{variable}"):
                host.set_cpuidle_state(name, disabled=True)


def workload_values(experiment: Experiment, condition: Condition, facts: dict) -> dict:
    params = dict(experiment.workload.get("params") or {})
    # Workloads run inside their run directory, so "{run_dir}" is "." and manifests hold no local paths.
    return {
        "tools": str(requirements.tools_bin()),
        "repo": str(repo_root()),
        "run_dir": ".",
        "nproc": facts["nproc"],
        "last_cpu": facts["online_cpus"][-1],
        **params,
        **condition.values,
    }


def execute_run(
    experiment: Experiment, planned: PlannedRun, host: HostChanges, facts: dict, backend: str | None, run_dir: Path
) -> dict:
    """Make one planned run in ``run_dir``; its manifest record (without results), with what else the machine
    was doing meanwhile (``interference``: sampled from just before the workload starts until it ends)."""
    values = workload_values(experiment, planned.condition, facts)
    argv = fill_argv(experiment.workload["argv"], values, f"{experiment.path}: workload.argv")
    server = None
    with host.scope() as scope:
        apply_knobs(host, experiment, planned.condition, facts)
        if experiment.workload.get("server"):
            server_argv = fill_argv(experiment.workload["server"], values, f"{experiment.path}: workload.server")
            try:
                server = spawn(
                    server_argv,
                    host=host,
                    label=f"server {server_argv[0]}",
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            except OSError as exc:
                raise WorkloadOutputError(
                    f"{experiment.path}: workload.server {server_argv[0]}: cannot start ({exc.strerror or exc})"
                ) from None
            time.sleep(float(experiment.workload.get("server_start_s", 1)))
        try:
            sampler = interference.Sampler(host.root)
            with sampler:
                outcome, trace_result = _record_workload(experiment, host, backend, argv, run_dir)
        finally:
            if server is not None:
                stop(server)
        checks = per_run_extras(experiment, host, facts, values, run_dir, backend) if outcome["status"] == "ok" else []
    return {
        "run": planned.run,
        "condition": planned.condition.name,
        "order": planned.order,
        "warmup": planned.warmup,
        "values": planned.condition.values,
        **outcome,
        "knobs": scope.records(),
        "trace": trace_result.record() if trace_result else None,
        "interference": sampler.summary(),
        **({"extras": checks} if checks else {}),
    }


def per_run_extras(
    experiment: Experiment, host: HostChanges, facts: dict, values: dict, run_dir: Path, backend: str | None = None
) -> list[dict]:
    """Cross-checks marked ``per_run``, right after the workload in the same run (same boot, same knobs, the
    workload's trace stopped), each in run_dir/<name>/, one marked ``traced`` under a trace of its own
    (run_dir/<name>/trace, the experiment's events and clock); where the host lacks what one needs, why it was
    skipped."""
    done = []
    for extra in experiment.extras:
        if not extra.get("per_run"):
            continue
        missing = requirements.missing(extra.get("requires", []), host, facts)
        if missing:
            done.append({"name": extra["name"], "skipped": missing})
            continue
        directory = run_dir / extra["name"]
        directory.mkdir(exist_ok=True)
        argv = fill_argv(extra["argv"], values, f"{experiment.path}: extras.{extra['name']}.argv")
        if extra.get("traced"):
            outcome, trace_result = _record_workload(experiment, host, backend, argv, directory)
            outcome = {**outcome, "trace": trace_result.record()}
        else:
            outcome = run_command(argv, directory, experiment.timeout_s, host)
        done.append({"name": extra["name"], "directory": f"{run_dir.name}/{extra['name']}", **outcome})
    return done


def _record_workload(experiment: Experiment, host: HostChanges, backend: str | None, argv: list, run_dir: Path):
    """Run ``argv`` in ``run_dir``, traced into run_dir/trace if the experiment asks for it: (outcome, trace
    result or None)."""
    settings = experiment.trace_settings()
    if settings is None:
        return run_command(argv, run_dir, experiment.timeout_s, host), None
    with tracing.recorder(
        backend,
        host,
        settings.events,
        run_dir / "trace",
        buffer_kb=settings.buffer_kb,
        symbols=settings.symbols,
        functions=settings.functions,
        optional_events=settings.optional_events,
        clock=settings.clock,
    ) as recording:
        outcome = run_command(argv, run_dir, experiment.timeout_s, host)
    return outcome, recording.result


def run_once(
    experiment: Experiment,
    condition: Condition,
    host: HostChanges,
    facts: dict,
    argv: list,
    source: str,
    directory: Path,
    wrap: Sequence[str] = (),
) -> dict:
    """``argv`` once under ``condition``'s knobs, in ``directory`` (profiles and cross-checks)."""
    filled = fill_argv(argv, workload_values(experiment, condition, facts), source)
    with host.scope():
        apply_knobs(host, experiment, condition, facts)
        return run_command([*wrap, *filled], directory, experiment.timeout_s, host)
