"""The guest side of `ticklab lab run`: ``python3 -m ticklab.lab.guest /mnt/share/job.json``.

Runs inside the lab guest (started by runners/vm/init) and makes exactly one planned run with the
same code `ticklab capture` uses on a host (:func:`ticklab.capture.execute.execute_run`). The run is
made in the guest's tmpfs, so tracing never writes through 9p, and then copied to the share with
result.json: the run's record, the guest's facts, the requirement checks, the tracing backend, and
whether the booted kernel matches the condition. It imports nothing the image lacks (no pandas).
"""

from __future__ import annotations

import json
import shutil
import sys
import traceback
from pathlib import Path

from ..capture import requirements, tracing
from ..capture.execute import execute_run, run_once
from ..capture.experiment import Condition, PlannedRun, load_experiment
from ..host import HostChanges, collect, plan_engine, plan_state
from ..host.facts import LAB_SWITCHES, lab_switches

WORK = Path("/tmp/ticklab-run")
# Our patches' boot switches and where the running kernel shows the value it took (host.facts.LAB_SWITCHES).
SWITCHES = LAB_SWITCHES


CPU_SYSFS = Path("sys/devices/system/cpu")


def _sysfs_text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def cpuidle_counters(root: Path = Path("/")) -> dict:
    """The cpuidle driver and, per state (by index), its name, description and usage and time (µs) summed over the
    online CPUs: read before and after a run, so the record shows which idle states the run entered, how often."""
    cpus = root / CPU_SYSFS
    states: dict[str, dict] = {}
    for cpu in sorted(cpus.glob("cpu[0-9]*"), key=lambda path: int(path.name[3:])):
        for state in sorted((cpu / "cpuidle").glob("state[0-9]*")):
            usage, time_us = _sysfs_text(state / "usage"), _sysfs_text(state / "time")
            if usage is None or time_us is None or not usage.isdigit() or not time_us.isdigit():
                continue
            entry = states.setdefault(
                state.name,
                {"name": _sysfs_text(state / "name"), "desc": _sysfs_text(state / "desc"), "usage": 0, "time_us": 0},
            )
            entry["usage"] += int(usage)
            entry["time_us"] += int(time_us)
    return {"driver": _sysfs_text(cpus / "cpuidle" / "current_driver"), "states": states}


def cpuidle_record(before: dict, after: dict) -> dict:
    """What a run record keeps of the idle states: the driver, and per state its counters before and after."""
    return {
        "driver": after.get("driver"),
        "states": [
            {
                "state": index,
                "name": state["name"],
                "desc": state["desc"],
                "usage_before": before["states"].get(index, {}).get("usage"),
                "usage_after": state["usage"],
                "time_us_before": before["states"].get(index, {}).get("time_us"),
                "time_us_after": state["time_us"],
            }
            for index, state in sorted(after["states"].items(), key=lambda item: int(item[0][5:]))
        ],
    }


def _normal(value: str) -> str:
    return {"y": "1", "yes": "1", "on": "1", "true": "1", "n": "0", "no": "0", "off": "0", "false": "0"}.get(
        value.lower(), value
    )


def boot_mismatches(
    expected_cmdline: list[str], expected_clocksource: str | None, facts: dict, expected_release: str | None = None
) -> list[str]:
    """How the booted guest differs from what the condition asked for (empty when it matches)."""
    problems = []
    if expected_release and facts.get("kernel_release") != expected_release:
        problems.append(f"the kernel is {facts.get('kernel_release')}, the condition asks for {expected_release}")
    booted = (facts.get("cmdline") or "").split()
    missing = [token for token in expected_cmdline if token not in booted]
    if missing:
        problems.append(f"/proc/cmdline lacks {' '.join(missing)}")
    for token in expected_cmdline:
        name, _, wanted = token.partition("=")
        if name in SWITCHES:
            taken = (facts.get("lab_switches") or {}).get(name)
            if taken is None or _normal(taken) != _normal(wanted):
                problems.append(f"{name} is {taken} in the running kernel, the condition asks for {wanted}")
    current = (facts.get("clocksources") or {}).get("current")
    if expected_clocksource and current != expected_clocksource:
        problems.append(f"clocksource is {current}, the condition asks for {expected_clocksource}")
    return problems


def run_job(job_path: Path, work: Path = WORK) -> dict:
    return make_job_run(json.loads(job_path.read_text()), job_path.parent, job_path.parent / "result.json", work)


def make_job_run(job: dict, share: Path, result_path: Path, work: Path = WORK, known: dict | None = None) -> dict:
    """Make the job's run (or cross-check) with the capture code; raw files to share/raw/<run>, the result (with
    ``known``: what the caller knows of the run already, e.g. its verified boot) to ``result_path``."""
    experiment = load_experiment(share / job.get("experiment", "experiment.yaml"))
    planned = PlannedRun(
        job["run"], job["order"], Condition(job["condition"]["name"], job["condition"]["values"]), job["warmup"]
    )
    result: dict = {"run": planned.run, **(known or {})}
    run_dir = work / "raw" / planned.run
    run_dir.mkdir(parents=True, exist_ok=True)
    host = HostChanges(work / "state" / "host-changes.json", log=lambda message: print(message, file=sys.stderr))
    try:
        with host:
            if experiment.trace:
                tracing.ensure_tracefs(host)
            facts = collect()
            facts["lab_switches"] = lab_switches()
            result["facts"] = facts
            result["requirements"], failed = requirements.check_all(experiment.requires, host, facts)
            if failed:
                result["not_testable"] = requirements.unmet_text(failed)
                return result
            mismatch = boot_mismatches(job.get("cmdline", []), job.get("clocksource"), facts, job.get("kernel_release"))
            if job.get("extra"):
                result["extra"] = _extra(experiment, planned.condition, host, facts, job["extra"], run_dir)
                result["extra"]["boot_mismatch"] = mismatch
                return result
            backend, why = (
                tracing.choose_backend(host, job.get("backend", "auto"), experiment.trace_settings().functions)
                if experiment.trace
                else (None, None)
            )
            result["tracing"] = {"backend": backend, "why": why}
            idle_before = cpuidle_counters()
            record = execute_run(experiment, planned, host, facts, backend, run_dir)
            record["cpuidle"] = cpuidle_record(idle_before, cpuidle_counters())
            record["boot_mismatch"] = mismatch
            result["record"] = record
        result["knobs"] = host.records()
    except Exception:  # reported to the host, which records the run as failed with this text
        result["error"] = traceback.format_exc()
    finally:
        destination = share / "raw" / planned.run
        if run_dir.is_dir():
            shutil.copytree(run_dir, destination, dirs_exist_ok=True)
        result_path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    return result


def _extra(experiment, condition: Condition, host: HostChanges, facts: dict, name: str, run_dir: Path) -> dict:
    """A cross-check (experiment ``extras``) once under ``condition``, or why it was skipped in this guest."""
    extra = next(e for e in experiment.extras if e["name"] == name)
    missing = requirements.missing(extra.get("requires", []), host, facts)
    if missing:
        return {"name": name, "condition": condition.name, "skipped": missing}
    outcome = run_once(
        experiment, condition, host, facts, extra["argv"], f"{experiment.path}: extras.{name}.argv", run_dir
    )
    return {"name": name, "condition": condition.name, **outcome}


# -- a boot plan played by the guest (ticklab.lab.guest_plan) ------------------------------------------------
PLAN_ID = "lab"


class GuestPlanRuns(plan_engine.RunMaker):
    """The guest's maker of a boot plan's runs: each run as a lab job (``make_job_run``), its result with the boot
    the plan verified in share/runs/<run>.json; the host turns them into the bundle after the guest powers off."""

    def __init__(self, share: Path, plan_job: dict):
        self.share, self.plan_job = share, plan_job
        self.jobs = {job["run"]: job for job in plan_job["runs"]}

    def _result_path(self, run: str) -> Path:
        (self.share / "runs").mkdir(exist_ok=True)
        return self.share / "runs" / f"{run}.json"

    def make_run(self, run: plan_state.BootRun, boot: dict) -> dict:
        job = {**self.jobs[run.name], "backend": self.plan_job.get("backend", "auto")}
        result = make_job_run(job, self.share, self._result_path(run.name), known={"boot": boot})
        if "error" in result:
            raise RuntimeError(result["error"].strip().splitlines()[-1])
        return {"run": run.name, "boot_id": boot["boot_id"]}

    def failed_run(self, run: plan_state.BootRun, boot: dict, why: str) -> None:
        path = self._result_path(run.name)
        if not path.exists():
            path.write_text(json.dumps({"run": run.name, "error": why, "boot": boot}, indent=2) + "\n")


def plan_start(share: Path) -> None:
    """First boot: the plan of share/plan-job.json (runs, each condition's command-line words), then the first kexec."""
    plan_job = json.loads((share / "plan-job.json").read_text())
    original = (Path("/proc/cmdline").read_text()).strip()
    release = collect()["kernel_release"]
    # each run's kernel: the one its condition names (share/bzImage-<release>), else the one this guest booted
    runs = [
        plan_state.BootRun(
            job["run"],
            job["condition"]["name"],
            str(share / job.get("kernel_file", "bzImage")),
            plan_state.condition_cmdline(original, job["words"]),
            initrd=str(share / "initrd"),
            release=job.get("release", release),
            warmup=job["warmup"],
        )
        for job in plan_job["runs"]
    ]
    plan_engine.create(runs, mode="kexec", bundle=share / "runs", plan_id=PLAN_ID, capture={"kind": "lab-guest"})
    plan_engine.advance(PLAN_ID)


def plan_resume(share: Path) -> None:
    """Every later boot: the plan's next step, or nothing when it is over (this is the boot back to the original
    command line, and the guest powers off)."""
    state = plan_state.load(Path("/"), PLAN_ID).state
    if state != "running":
        print(f"boot plan {PLAN_ID} is {state}: powering off")
        return
    plan_engine.resume(PLAN_ID, GuestPlanRuns(share, json.loads((share / "plan-job.json").read_text())))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 2 and argv[0] in ("plan-start", "plan-resume"):
        (plan_start if argv[0] == "plan-start" else plan_resume)(Path(argv[1]))
        return 0
    if len(argv) != 1:
        print(
            "usage: python3 -m ticklab.lab.guest /mnt/share/job.json | plan-start|plan-resume /mnt/share",
            file=sys.stderr,
        )
        return 2
    result = run_job(Path(argv[0]))
    return 1 if "error" in result else 0


if __name__ == "__main__":
    sys.exit(main())
