"""A boot plan's state on someone else's machine (issue 27): plan.json, host-changes.json, plan.lock and the kept
experiment are read through ticklab.safefiles (no link, no FIFO, bounded) and plan.json is checked against its JSON
Schema on every read; an abort puts back what is really there (the unit and link ticklab installed, its grub entry
and one-shot) even when the journal is missing or broken, and never says it did what it did not."""

import json
import os
import subprocess
import sys

import pytest

from test_boot_capture import start_capture
from test_plan_engine import calls, host, reboot, resume_in_a_new_process, two_conditions  # noqa: F401 (fixture)
from ticklab.host import plan_engine, plan_state

UNIT = "etc/systemd/system/ticklab-plan.service"
LINK = "etc/systemd/system/multi-user.target.wants/ticklab-plan.service"


def a_plan_booting(root, tmp_path, plan_id="s", mode="manual"):
    plan = plan_engine.create(two_conditions(1), mode=mode, bundle=tmp_path / "b", root=root, plan_id=plan_id)
    plan_engine.advance(plan.id, root=root, say=lambda _: None)
    assert (root / UNIT).is_file() and os.path.islink(root / LINK)
    return root / "var/lib/ticklab/plans" / plan_id


def edit(path, change):
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def one_line_exit_2(done, *expected):
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert len(done.stderr.strip().splitlines()) == 1 and "unexpected" not in done.stderr, done.stderr
    for text in expected:
        assert text in done.stderr, done.stderr


# item 15: a plan.json without original.release was a KeyError, "log": "x" an AttributeError (exit 1, "a ticklab bug")
@pytest.mark.parametrize(
    "command, change, expected",
    [
        ("status", lambda d: d["original"].pop("release"), "plan.json: original: 'release' is missing"),
        (
            "abort",
            lambda d: d.update(log="x"),
            "plan.json: log: 'x' is not of type array; not a plan state ticklab wrote, refused",
        ),
        ("resume", lambda d: d["runs"][0].pop("cmdline"), "plan.json: runs[0]: 'cmdline' is missing"),
        ("abort", lambda d: d["runs"][0].update(state=["booting"]), "plan.json: runs[0].state: "),
        ("status", lambda d: d.update(id="other"), "plan.json: id: 'other' is not the plan's directory 's'"),
        ("abort", lambda d: d.update(bundle="b\nExecStart=/bin/sh"), "plan.json: bundle: "),
    ],
)
@pytest.mark.slow
def test_a_tampered_plan_json_is_one_line_naming_the_file_and_key(host, tmp_path, command, change, expected):
    root, _ = host
    directory = a_plan_booting(root, tmp_path)
    edit(directory / "plan.json", change)
    one_line_exit_2(resume_in_a_new_process(root, command, "--id", "s"), str(directory / "plan.json"), expected)


# item 7: a FIFO as plan state hung the reader (open() of a FIFO waits for a writer); a link was followed
@pytest.mark.parametrize(
    "name, command",
    [
        ("plan.json", "status"),
        ("plan.json", "abort"),
        ("host-changes.json", "abort"),
        ("host-changes.json", "resume"),
        ("plan.lock", "abort"),
    ],
)
@pytest.mark.slow
def test_a_fifo_or_a_link_as_plan_state_is_refused_without_blocking(host, tmp_path, name, command):
    root, _ = host
    directory = a_plan_booting(root, tmp_path)
    target = directory / name
    target.unlink(missing_ok=True)
    os.mkfifo(target, 0o600)
    one_line_exit_2(resume_in_a_new_process(root, command, "--id", "s"), f"{target}: a FIFO, not a regular file")
    target.unlink()
    (tmp_path / "elsewhere.json").write_text("{}")
    target.symlink_to(tmp_path / "elsewhere.json")
    one_line_exit_2(resume_in_a_new_process(root, command, "--id", "s"), str(target), "link")


@pytest.mark.slow
def test_a_fifo_as_the_only_plan_state_is_a_refused_plan_not_no_plan(host, tmp_path):
    """Without --id the plan is looked up: a plan.json that is not a regular file was skipped, and ``plan status``
    said 'no boot plan on this host' with exit 0 (the fuzz campaign's plan-state family found it)."""
    root, _ = host
    directory = a_plan_booting(root, tmp_path)
    (directory / "plan.json").unlink()
    os.mkfifo(directory / "plan.json", 0o600)
    for command in ("status", "list"):
        one_line_exit_2(
            resume_in_a_new_process(root, command), f"{directory / 'plan.json'}: a FIFO, not a regular file"
        )


@pytest.mark.slow
def test_a_fifo_as_the_kept_experiment_is_refused_without_blocking(host, tmp_path):
    root, _ = host
    plan = start_capture(root, tmp_path)
    kept = root / "var/lib/ticklab/plans" / plan.id / "host-boot-experiment.yaml"
    kept.unlink()
    os.mkfifo(kept, 0o600)
    reboot(root, "boot-1", plan.runs[0].cmdline)
    done = resume_in_a_new_process(root)
    one_line_exit_2(done, "plan failed: the plan's experiment:", f"{kept}: ")
    assert not (root / UNIT).exists()


@pytest.mark.slow
def test_a_huge_plan_json_is_refused_not_read_whole(host, tmp_path):
    root, _ = host
    directory = a_plan_booting(root, tmp_path)
    with open(directory / "plan.json", "r+b") as handle:
        handle.truncate(plan_state.MAX_PLAN_BYTES + 1)
    one_line_exit_2(resume_in_a_new_process(root, "status", "--id", "s"), "plan.json: larger than")


# item 11: abort with the journal missing said "unit removed, host changes put back", exit 0, the unit still there
@pytest.mark.slow
def test_abort_with_the_journal_missing_removes_the_unit_and_link_it_recognises(host, tmp_path):
    root, log = host
    directory = a_plan_booting(root, tmp_path)
    (directory / "host-changes.json").unlink()
    done = resume_in_a_new_process(root, "abort")
    assert done.returncode == 0, done.stderr
    assert not (root / UNIT).exists() and not os.path.lexists(root / LINK)
    assert "aborted: unit removed" in done.stdout
    assert calls(log)[-1] == "systemctl daemon-reload"


@pytest.mark.slow
def test_abort_with_the_journal_broken_removes_what_it_recognises_and_says_what_it_could_not(host, tmp_path):
    root, _ = host
    (root / "boot/grub/custom.cfg").write_text("menuentry 'mine' { }\n")
    directory = a_plan_booting(root, tmp_path, mode="grub")
    assert "ticklab-plan-s" in (root / "boot/grub/custom.cfg").read_text()
    (directory / "host-changes.json").write_text('{"changes": [{"kind": "write"')
    done = resume_in_a_new_process(root, "abort")
    one_line_exit_2(done, "host-changes.json: unreadable journal of host changes")
    assert "unit removed, host changes put back" not in done.stdout
    assert not (root / UNIT).exists() and not os.path.lexists(root / LINK)
    assert (root / "boot/grub/custom.cfg").read_text() == "menuentry 'mine' { }\n"


@pytest.mark.slow
def test_abort_leaves_a_unit_that_is_not_this_plans_and_says_so(host, tmp_path):
    root, _ = host
    directory = a_plan_booting(root, tmp_path)
    (directory / "host-changes.json").unlink()
    (root / UNIT).write_text("[Service]\nExecStart=/usr/bin/someone-elses\n")
    done = resume_in_a_new_process(root, "abort")
    assert done.returncode == 0, done.stderr
    assert f"{root / UNIT}: not ticklab's unit of plan s; left as it is, with its link" in done.stdout
    assert (
        "unit removed" not in done.stdout and f"aborted: {root / UNIT} left as it is (not this plan's)" in done.stdout
    )
    assert (root / UNIT).read_text() == "[Service]\nExecStart=/usr/bin/someone-elses\n"
    assert os.path.islink(root / LINK)  # it enables that unit now: not ours to remove


@pytest.mark.slow
def test_a_unit_removed_by_hand_with_its_link_left_is_cleaned_up(host, tmp_path):
    root, _ = host
    directory = a_plan_booting(root, tmp_path)
    (directory / "host-changes.json").unlink()
    (root / UNIT).unlink()
    done = resume_in_a_new_process(root, "abort")
    assert done.returncode == 0, done.stderr
    assert not os.path.lexists(root / LINK)


def test_in_process_cli_main_never_reports_a_ticklab_bug_for_plan_state(host, tmp_path, capsys):
    from ticklab.cli import main

    root, _ = host
    directory = a_plan_booting(root, tmp_path)
    (directory / "plan.json").write_text("[" * 100000)
    assert main(["plan", "status", "--root", str(root)]) == 2
    assert "plan.json: not a plan's JSON" in capsys.readouterr().err


@pytest.mark.slow
def test_a_fifo_as_custom_cfg_is_refused_without_blocking(host, tmp_path):
    root, log = host
    os.mkfifo(root / "boot/grub/custom.cfg")
    plan_engine.create(two_conditions(1), mode="grub", bundle=tmp_path / "b", root=root, plan_id="f")
    done = subprocess.run(
        [sys.executable, "-m", "ticklab.cli", "plan", "resume", "--id", "f", "--root", str(root)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    one_line_exit_2(done, "custom.cfg: a FIFO, not a regular file")
    assert "grub-reboot" not in " ".join(calls(log))
