"""How a boot plan ends when something around it goes wrong: a plan of the same id made meanwhile, a missing boot
tool, a tool's error on several lines, a bundle moved away, an ending cut short (cases found by a review)."""

import json
import os
import subprocess
import sys

import pytest

from test_boot_capture import bundle_of, capture_in_a_new_process, start_capture
from test_plan_engine import ORIGINAL, host, reboot, resume_in_a_new_process, two_conditions  # noqa: F401
from ticklab.bundle import load_bundle
from ticklab.host import plan_engine, plan_state


# 1. create's rmtree removes a plan directory another process made (two captures in the same second share the
#    plan id new_plan_id gives: private_dir accepts the existing directory, the O_EXCL of the kept file fails)
def test_create_failure_does_not_remove_a_directory_it_did_not_make(host, tmp_path, monkeypatch):
    root, _ = host
    real = plan_engine.private_dir
    state = {"first": True}

    def other_process_creates_the_same_id_meanwhile(directory):
        if state["first"]:
            state["first"] = False
            monkeypatch.setattr(plan_engine, "private_dir", real)
            plan_engine.create(
                two_conditions(1),
                mode="kexec",
                bundle=tmp_path / "bundle-A",
                root=root,
                plan_id="same",
                keep={"host-boot-experiment.yaml": b"A's experiment\n"},
            )
        return real(directory)

    monkeypatch.setattr(plan_engine, "private_dir", other_process_creates_the_same_id_meanwhile)
    with pytest.raises(Exception):
        plan_engine.create(
            two_conditions(1),
            mode="kexec",
            bundle=tmp_path / "bundle-B",
            root=root,
            plan_id="same",
            keep={"host-boot-experiment.yaml": b"B's experiment\n"},
        )
    # A's plan must survive B's failure
    assert (root / "var/lib/ticklab/plans/same/plan.json").is_file(), "B's rmtree removed A's plan"


# 2. --boot kexec on a host without kexec-tools: the load never happened, yet its journal entry cannot be undone;
#    the CLI error names the cleanup, not the cause, and every later abort fails
@pytest.mark.slow
def test_a_missing_kexec_tool_leaves_no_journal_entry_abort_cannot_clear(host, tmp_path):
    root, log = host
    bin_dir = tmp_path / "bin"
    (bin_dir / "kexec").unlink()
    env = {**os.environ, "PATH": str(bin_dir)}
    done = capture_in_a_new_process(root, tmp_path, env=env)
    [plan_id] = [p.name for p in (root / "var/lib/ticklab/plans").iterdir()]
    journal = root / "var/lib/ticklab/plans" / plan_id / "host-changes.json"
    aborted = subprocess.run(
        [sys.executable, "-m", "ticklab.cli", "plan", "abort", "--root", str(root)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert "kexec" in done.stderr and "No such file" in done.stderr and "could not restore" not in done.stderr, (
        "the error should say kexec is missing, not that a load that never happened cannot be undone"
    )
    assert aborted.returncode == 0 and not journal.exists()


# 3. an error a boot tool prints on two lines is a two-line error on the CLI
@pytest.mark.slow
def test_a_boot_tool_error_on_two_lines_is_one_line_on_the_cli(host, tmp_path):
    root, _ = host
    (tmp_path / "bin" / "kexec").write_text(
        "#!/bin/sh\necho 'Cannot load /boot/vmlinuz' >&2\n"
        "echo 'kexec_load failed: Operation not permitted' >&2\nexit 1\n"
    )
    done = capture_in_a_new_process(root, tmp_path)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_a_daemon_reload_error_on_two_lines_is_one_line_on_plan_abort(host, tmp_path):
    root, _ = host
    plan = plan_engine.create(two_conditions(1), mode="manual", bundle=tmp_path / "b", root=root, plan_id="two")
    plan_engine.advance(plan.id, root=root, say=lambda _: None)
    (tmp_path / "bin" / "systemctl").write_text(
        "#!/bin/sh\necho 'Failed to reload daemon:' >&2\necho 'Access denied' >&2\nexit 1\n"
    )
    done = resume_in_a_new_process(root, "abort")
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1


# 4. abort with the bundle moved away: exit 0, "N run(s) made are kept in <bundle>" although nothing was sealed
@pytest.mark.slow
def test_abort_with_the_bundle_gone_does_not_exit_0(host, tmp_path):
    root, _ = host
    plan = start_capture(root, tmp_path)
    reboot(root, "boot-1", plan.runs[0].cmdline)
    assert resume_in_a_new_process(root).returncode == 0
    bundle_of(tmp_path).rename(tmp_path / "away")
    done = resume_in_a_new_process(root, "abort")
    assert json.loads((tmp_path / "away" / "manifest.json").read_text())["status"] == "incomplete"
    assert done.returncode != 0, "the bundle was not sealed, yet abort exits 0"


# 5. an ending cut short after a wrong boot: the failed run never reaches the bundle when resume completes it
@pytest.mark.slow
def test_an_ending_cut_short_still_records_the_failed_run(host, tmp_path):
    root, _ = host
    plan = start_capture(root, tmp_path)
    run = plan.runs[0]
    run.state, run.why = "failed", "booted kernel 6.1.0-21-amd64, expected x"
    plan.state, plan.ended_because = "failed", f"run {run.name}: {run.why}"
    plan_state.save(root, plan)  # killed right after _end saved the state
    reboot(root, "boot-1", ORIGINAL, release="6.1.0-21-amd64")
    done = resume_in_a_new_process(root)
    assert done.returncode == 0, done.stderr
    sealed = load_bundle(bundle_of(tmp_path))
    assert [r.run for r in sealed.manifest.runs] == [run.name]
