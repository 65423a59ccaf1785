"""`ticklab plan list|status|abort` on a fake root with several plans or none, and an abort while the resume unit's
start job is still queued, against a fake systemctl that keeps the unit's state as systemd would (issue 39, item 5)."""

import json
import os
from pathlib import Path

import pytest

from test_plan_engine import calls, host, resume_in_a_new_process, two_conditions  # noqa: F401 (fixture)
from ticklab.host import boot_loaders, plan_engine, plan_state

UNIT = "etc/systemd/system/ticklab-plan.service"


def set_created(root: Path, plan_id: str, created: str) -> None:
    path = root / "var/lib/ticklab/plans" / plan_id / "plan.json"
    data = json.loads(path.read_text())
    data["created"] = created
    path.write_text(json.dumps(data))


# 5b: 'plan status' with no plan exited 2 ("…/plans: no plan")
@pytest.mark.slow
def test_status_and_list_with_no_plan_say_so_and_exit_0(host):
    root, _ = host
    for command in ("status", "list"):
        done = resume_in_a_new_process(root, command)
        assert (done.returncode, done.stderr) == (0, "")
        assert done.stdout == f"no boot plan on this host ({root}/var/lib/ticklab/plans holds none)\n"
    (root / "var/lib/ticklab/plans").mkdir(parents=True)
    assert resume_in_a_new_process(root, "status").returncode == 0
    done = resume_in_a_new_process(root, "abort")  # nothing to abort is still an error
    assert done.returncode == 2
    assert done.stderr == f"ticklab plan abort: no boot plan on this host ({root}/var/lib/ticklab/plans holds none)\n"


# 5c: with two plans every command needed --id, and nothing listed the plans
@pytest.mark.slow
def test_list_shows_every_plan_and_id_defaults_to_the_running_one_else_the_newest(host, tmp_path):
    root, _ = host
    plan_engine.create(
        two_conditions(1),
        mode="kexec",
        bundle=tmp_path / "b1",
        root=root,
        plan_id="newer",
        capture={"experiment": "/src/runners/nohz/host-boot-ftq.yaml"},
    )
    plan_engine.abort("newer", root=root, say=lambda _: None)
    set_created(root, "newer", "2026-01-02T00:00:00Z")
    plan_engine.create(two_conditions(2), mode="manual", bundle=tmp_path / "b2", root=root, plan_id="older")
    set_created(root, "older", "2026-01-01T00:00:00Z")
    plan_engine.advance("older", root=root, say=lambda _: None)
    done = resume_in_a_new_process(root, "list")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "older  (no capture)  manual  running  0 made, 0 failed, 3 left of 4  created 2026-01-01T00:00:00Z"
        "  (default for --id)",
        "newer  nohz/host-boot-ftq  kexec  aborted  0 made, 0 failed, 2 left of 2  created 2026-01-02T00:00:00Z",
    ]
    status = resume_in_a_new_process(root, "status")  # the running plan, though another is newer
    assert status.returncode == 0, status.stderr
    assert status.stdout.startswith("plan older (manual), running: 0 made, 0 failed, 3 left of 4")
    aborted = resume_in_a_new_process(root, "abort")
    assert aborted.returncode == 0, aborted.stderr
    assert aborted.stdout.splitlines()[-1].startswith("boot plan older aborted: unit removed")
    assert plan_state.load(root, "older").state == "aborted"
    status = resume_in_a_new_process(root, "status")  # none running: the newest
    assert status.stdout.startswith("plan newer (kexec), aborted: 0 made, 0 failed, 2 left of 2")
    assert resume_in_a_new_process(root, "list").stdout.splitlines()[1].endswith("(default for --id)")
    explicit = resume_in_a_new_process(root, "status", "--id", "older")
    assert explicit.stdout.startswith("plan older (manual), aborted:")


@pytest.mark.slow
def test_an_unreadable_plan_among_several_names_itself_and_asks_for_an_id(host, tmp_path):
    root, _ = host
    for plan_id in ("a", "b"):
        plan_engine.create(two_conditions(1), mode="manual", bundle=tmp_path / plan_id, root=root, plan_id=plan_id)
        plan_engine.abort(plan_id, root=root, say=lambda _: None)
    (root / "var/lib/ticklab/plans/b/plan.json").write_text("{")
    done = resume_in_a_new_process(root, "status")
    assert done.returncode == 2
    assert done.stderr.startswith(f"ticklab plan status: {root}/var/lib/ticklab/plans/b/plan.json: not a plan's JSON")
    assert done.stderr.endswith("; name a plan with --id ('ticklab plan list' lists them)\n")
    assert resume_in_a_new_process(root, "status", "--id", "a").returncode == 0


def systemd_like_systemctl(tmp_path: Path, root: Path, log: Path) -> Path:
    """A systemctl that logs its argv and keeps ticklab-plan.service's state in a directory: ``start-job`` (its start
    job queued at this boot), ``failed``, and the journal's lines. A daemon-reload that finds the unit file gone
    while its start job is queued fails the job, as systemd does."""
    state = tmp_path / "systemd"
    state.mkdir()
    tool = tmp_path / "bin" / "systemctl"
    tool.write_text(f"""#!/bin/sh
echo systemctl "$@" >> {log}
case "$*" in
  "--no-block stop ticklab-plan.service") rm -f {state}/start-job ;;
  "reset-failed ticklab-plan.service") rm -f {state}/failed ;;
  "daemon-reload")
    if [ -e {state}/start-job ] && [ ! -e {root / UNIT} ]; then
      rm {state}/start-job; touch {state}/failed
      echo "Failed to start ticklab-plan.service" >> {state}/journal
    fi ;;
esac
""")
    return state


# 5d: 'plan abort' while the unit's start job was queued left "Failed to start ticklab-plan.service" in the journal
@pytest.mark.slow
def test_abort_with_the_units_start_job_queued_leaves_no_failed_unit(host, tmp_path):
    root, log = host
    state = systemd_like_systemctl(tmp_path, root, log)
    plan_engine.create(two_conditions(1), mode="manual", bundle=tmp_path / "b", root=root, plan_id="q")
    plan_engine.advance("q", root=root, say=lambda _: None)
    (state / "start-job").touch()  # the boot queued the unit's start (after multi-user.target); the user aborts first
    before = len(calls(log))
    done = resume_in_a_new_process(root, "abort")
    assert done.returncode == 0, done.stderr
    assert calls(log)[before:] == [
        "systemctl --no-block stop ticklab-plan.service",
        "systemctl reset-failed ticklab-plan.service",
        "systemctl daemon-reload",
    ]
    assert sorted(p.name for p in state.iterdir()) == []  # no job left, not failed, nothing in the journal
    assert not (root / UNIT).exists()


@pytest.mark.slow
def test_abort_resets_a_unit_that_failed_earlier_in_this_boot(host, tmp_path):
    root, log = host
    state = systemd_like_systemctl(tmp_path, root, log)
    plan_engine.create(two_conditions(1), mode="manual", bundle=tmp_path / "b", root=root, plan_id="f")
    plan_engine.advance("f", root=root, say=lambda _: None)
    (state / "failed").touch()  # a resume of this boot exited 2
    assert resume_in_a_new_process(root, "abort").returncode == 0
    assert not (state / "failed").exists()
    # an abort of a plan that has ended, with no unit left: nothing asked of systemd but the reload
    before = len(calls(log))
    assert resume_in_a_new_process(root, "abort").returncode == 0
    assert calls(log)[before:] == ["systemctl daemon-reload"]


@pytest.mark.slow
def test_abort_leaves_another_plans_unit_and_its_start_job_alone(host, tmp_path):
    root, log = host
    state = systemd_like_systemctl(tmp_path, root, log)
    plan_engine.create(two_conditions(1), mode="manual", bundle=tmp_path / "b", root=root, plan_id="mine")
    (root / UNIT).parent.mkdir(parents=True)
    (root / UNIT).write_text(boot_loaders.unit_text(root, "other"))
    (state / "start-job").touch()
    before = len(calls(log))
    assert resume_in_a_new_process(root, "abort", "--id", "mine").returncode == 0
    assert calls(log)[before:] == ["systemctl daemon-reload"]
    assert (state / "start-job").exists() and os.path.isfile(root / UNIT)
