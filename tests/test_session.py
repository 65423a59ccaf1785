"""One capture session, whatever makes the runs: the executor interface (capture/session.py) that the host, the
lab and, later, a reboot of this host per run plug into."""

from pathlib import Path

import pytest
import yaml

from ticklab.bundle import load_bundle
from ticklab.capture.experiment import expand_conditions, load_experiment
from ticklab.capture.session import Session, open_bundle, plan
from ticklab.capture.stopping import StoppingRule


def experiment(tmp_path: Path):
    path = tmp_path / "fake.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "claim": "hrtick",
                "name": "fake",
                "description": "made by a test executor",
                "runs": 3,
                "warmup": 1,
                "seed": 7,
                "requires": [],
                "conditions": [{"name": "off"}, {"name": "on"}],
                "workload": {"tool": "hackbench", "argv": ["true"]},
            }
        )
    )
    return load_experiment(path)


class Recorder:
    """An executor that makes each run by writing its record and one result row (none for a warm-up), as a real one
    would (load_bundle refuses a results.csv row of a warm-up run)."""

    unit = "run"

    def __init__(self, stop_at: str | None = None, not_testable_at: str | None = None):
        self.made, self.after, self.stop_at, self.not_testable_at = [], [], stop_at, not_testable_at

    def make_run(self, writer, planned) -> bool:
        if planned.run == self.stop_at:
            raise KeyboardInterrupt
        if planned.run == self.not_testable_at:
            writer.manifest.not_testable = "the boot found no tracefs"
            return False
        self.made.append(planned.run)
        writer.add_run(
            {
                "run": planned.run,
                "condition": planned.condition.name,
                "order": planned.order,
                "warmup": planned.warmup,
                "status": "ok",
                "problem": None,
            },
            [] if planned.warmup else [{"metric": "runtime_s", "value": 1.0 + planned.order, "unit": "s"}],
        )
        return True

    def after_runs(self, writer, conditions) -> None:
        self.after.append([c.name for c in conditions])


def session(tmp_path, executor, writer=None):
    exp = experiment(tmp_path)
    conditions = expand_conditions(exp, {"nproc": 2, "online_cpus": [0, 1]})
    counts = (exp.runs, exp.warmup, exp.seed)
    planned = plan(conditions, counts)
    writer = writer or open_bundle(tmp_path / "traces", "fake-host", exp, {}, conditions, counts, planned)
    made = Session(
        exp,
        executor,
        writer,
        planned,
        StoppingRule([], None, "fixed run count (a test)"),
        conditions,
        exp.seed,
        what="test capture",
        desc="test",
        progress=False,
        log=lambda _: None,
    )
    return made, writer, planned


def test_a_session_makes_every_planned_run_in_order_then_the_per_condition_work(tmp_path):
    executor = Recorder()
    made, writer, planned = session(tmp_path, executor)
    assert made.run() is True
    assert executor.made == [p.run for p in planned] and len(planned) == 2 * (3 + 1)
    assert executor.after == [["off", "on"]]
    manifest = load_bundle(writer.seal()).manifest
    assert [o["run"] for o in manifest.order] == [r.run for r in manifest.runs] == executor.made
    assert manifest.stopping["reason"] == "fixed run count (a test)"


def test_a_place_that_cannot_run_the_experiment_stops_the_session(tmp_path):
    executor = Recorder(not_testable_at="run-003")
    made, writer, _ = session(tmp_path, executor)
    assert made.run() is False
    assert executor.made == ["run-001", "run-002"] and executor.after == []
    assert writer.manifest.not_testable == "the boot found no tracefs"


def test_an_interrupt_leaves_the_bundle_incomplete_with_the_runs_it_finished(tmp_path):
    made, writer, _ = session(tmp_path, Recorder(stop_at="run-004"))
    with pytest.raises(KeyboardInterrupt):
        made.run()
    bundle = load_bundle(writer.path, allow_incomplete=True)
    assert bundle.manifest.status == "incomplete" and bundle.manifest.interrupted.startswith("KeyboardInterrupt")
    assert [r.run for r in bundle.manifest.runs] == ["run-001", "run-002", "run-003"]


def test_a_resumed_session_makes_only_the_runs_the_bundle_does_not_have(tmp_path):
    """What a reboot-per-run executor relies on: the manifest's runs are the session's progress."""
    first, writer, planned = session(tmp_path, Recorder(stop_at="run-004"))
    with pytest.raises(KeyboardInterrupt):
        first.run()
    executor = Recorder()
    resumed, _, _ = session(tmp_path, executor, writer=writer)
    assert resumed.run() is True
    assert executor.made == [p.run for p in planned][3:]
    assert [r.run for r in writer.manifest.runs] == [p.run for p in planned]
