"""Boot plans: the seeded, interleaved run order of a capture whose conditions live in the kernel (its release or
its command line), one boot per run, kept on disk across reboots: the engine that boots, verifies, makes
and ends them.

Its state on disk is :mod:`ticklab.host.plan_state`; how a run is booted (the systemd unit, grub, kexec) is
:mod:`ticklab.host.boot_loaders`; ``ticklab plan`` is :mod:`ticklab.plancli`.

The lead's seam (the capture session wires these, see :func:`advance`, :func:`resume`):

- ``create(runs, mode=..., bundle=..., root=...) -> Plan`` with ``runs`` the session's ordered list of
  :class:`BootRun` (run name, condition name, kernel, command line);
- ``advance(plan_id, root=...)`` boots the next planned run (never returns in kexec/grub mode on a real host:
  the machine reboots; in tests the fake ``systemctl`` returns);
- ``resume(plan_id, make_run, root=...)`` — what ``ticklab plan resume`` (the unit) runs after each boot: verifies
  the boot, calls ``make_run(planned_run, boot_record) -> dict`` (the run record the session appended to the
  bundle; an exception records the run as failed with its one-line reason, :class:`CannotGoOn` ends the plan),
  then advances or finishes, all under the plan's lock (an abort cannot slip in between).
  ``make_run`` is called with no HostChanges of the plan open, so the executor may open its own.

A plan that ends (finished, failed, aborted) is saved first, then the maker is told (``failed_run``, ``finished``:
the bundle sealed while the unit that runs the resume is still installed), then the host is put back; the maker's
errors are said and raised after those steps, never instead of them.
A process killed part way through an ending leaves an ended plan: the next ``resume`` (the unit, if it is still
there) or ``abort`` puts back what is left and has the bundle sealed if it is still open.

Boot verification (``verify_boot``): the boot_id differs from the one recorded before rebooting; the kernel
release is the condition's (``running``: the release the machine had when the plan was made); /proc/cmdline,
after dropping the words a boot loader or the kernel adds on its own — ``BOOT_IMAGE=…`` (grub's ``linux``
command) and ``initrd=…`` (EFI stub loaders) — equals the condition's command line word for word, in order.
A mismatch (the default kernel after a panic= or watchdog reset, someone booting by hand) fails the run and
stops the plan: the unit is removed and the machine is left on the kernel it booted.

At the end: every host change is put back (unit and link removed, custom.cfg as it was, next_entry unset,
kexec kernel unloaded); then kexec mode kexecs back into the original kernel and command line if this boot
differs from it, grub mode reboots into the default entry (never changed), manual mode prints what to boot.
"""

from __future__ import annotations

import abc
import contextlib
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from ..safefiles import OwnedDir, UnsafeFileError, shown
from ..schemas import problem as schema_problem
from .boot_loaders import (
    GRUB_CUSTOM,
    UNIT_PATH,
    boot_mode,
    install_unit,
    kernel_files,
    put_back_what_is_there,
    return_to_original,
    run_tool,
    stop_unit,
    systemd_running,
)
from .journal import HostBusy, HostChangeError, host_lock, private_dir
from .knobs import HostChanges
from .plan_state import (
    PLAN_SCHEMA,
    BootRun,
    Plan,
    PlanError,
    boot_facts,
    boot_words,
    kept_name,
    load,
    new_plan_id,
    one_line,
    plan_dir,
    plan_lock,
    plans_dir,
    refuse_if_running,
    save,
)


class CannotGoOn(PlanError):
    """Raised by a :class:`RunMaker` when no later run could be made either (its bundle or its experiment is gone):
    the plan ends, failed, with the host put back."""


def _changes(root: Path, plan: Plan, log) -> HostChanges:
    return HostChanges(plan_dir(root, plan.id) / "host-changes.json", root=root, keep=True, log=log)


def create(
    runs: list[BootRun],
    *,
    mode: str,
    bundle: Path | str,
    root: Path | str = "/",
    plan_id: str | None = None,
    capture: dict | None = None,
    keep: dict[str, bytes] | None = None,
) -> Plan:
    """A new plan on disk; ``keep``: files kept with it (the experiment it runs: moving or editing the user's copy
    mid-plan changes nothing), read back with :func:`kept_file`."""
    root = Path(root)
    booting = boot_mode(mode)
    if not runs:
        raise PlanError("a boot plan needs at least one run")
    refuse_if_running(root)
    plan_id = plan_id or new_plan_id()
    directory = plan_dir(root, plan_id)
    names = [kept_name(directory, name) for name in keep or {}]
    original = boot_facts(root)
    for run in runs:
        if run.kernel == "running":
            run.release = run.release or original["release"]
        elif "/" not in run.kernel:
            run.release = run.release or run.kernel
    plan = Plan(
        plan_id,
        mode,
        str(bundle),
        original,
        runs,
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        capture=capture or {},
    )
    for run in runs:  # whatever made it: a boot loader's line (grub's linux line, kexec --append) ends at a newline
        control = next((c for c in str(run.cmdline) if not c.isprintable()), None)
        if control is not None:
            raise PlanError(
                f"{plans_dir(root) / plan_id}: the command line of run {shown(run.name)} holds the control "
                f"character {control!r}; refused, no plan made"
            )
    problem = schema_problem(asdict(plan), PLAN_SCHEMA)  # what load() will check at every step after this one
    if problem:
        raise PlanError(f"{plans_dir(root) / plan_id}: {problem}; no plan made")
    for run in runs:
        kernel_files(root, plan, run)  # every kernel must exist before the first reboot
    booting.check_plan(root, plan)
    try:
        private_dir(plans_dir(root))
        os.mkdir(directory, 0o700)  # exclusively: a plan of the same id made meanwhile is never taken over
    except FileExistsError:
        raise PlanError(f"{directory}: exists already") from None
    except HostChangeError as exc:
        raise PlanError(str(exc)) from None
    try:
        private_dir(directory)
        for name, data in zip(names, (keep or {}).values(), strict=True):
            try:
                with OwnedDir(directory, create=False) as owned, owned.create(name, mode=0o600, exclusive=True) as out:
                    out.write(data)
            except UnsafeFileError as exc:
                raise PlanError(str(exc)) from None
        save(root, plan)
    except BaseException:  # a plan not made leaves no directory behind (it was made just now, by us)
        shutil.rmtree(directory, ignore_errors=True)
        raise
    return plan


class RunMaker(abc.ABC):
    """What makes a plan's runs (``capture.boot_capture.BootCapture`` for ``capture --boot``): ``make_run`` after a
    verified boot; ``failed_run`` for a run whose boot was wrong or whose making raised; ``more_runs`` when every
    planned run is done (a stopping rule's next round; [] ends the plan); ``finished`` when the plan ends (made,
    stopped by a bad boot, or aborted)."""

    @abc.abstractmethod
    def make_run(self, run: BootRun, boot: dict) -> dict:
        """The run record, after its boot was verified."""

    def failed_run(self, run: BootRun, boot: dict, why: str) -> None:
        """Record a run that failed (its boot was wrong, or its making raised); a maker that keeps no failed runs
        records nothing."""
        return None

    def more_runs(self, plan: Plan) -> list[BootRun]:
        return []

    def finished(self, plan: Plan) -> None:
        """The plan has ended (made, stopped by a bad boot, or aborted); a maker with nothing to seal does nothing."""
        return None


class _Only(RunMaker):
    def __init__(self, make_run: Callable[[BootRun, dict], dict]):
        self.make = make_run

    def make_run(self, run: BootRun, boot: dict) -> dict:
        return self.make(run, boot)


def _maker(make_run) -> RunMaker:
    return make_run if isinstance(make_run, RunMaker) else _Only(make_run)


def advance(
    plan_id: str, *, root: Path | str = "/", say: Callable[[str], None] = print, maker: RunMaker | None = None
) -> str:
    """Boot the next planned run: install the resume unit, load its kernel and command line, reboot (kexec:
    ``kexec -l`` then ``systemctl kexec``, or ``kexec -e`` without systemd; grub: a custom.cfg entry, ``grub-reboot``
    and ``systemctl reboot``; manual: print what to boot). Returns what was done (on a real host kexec and grub do
    not return). With no run left (and none more from the maker), the plan finishes."""
    root = Path(root)
    with plan_lock(root, plan_id):
        return _advance(root, load(root, plan_id), say, maker)


def _advance(root: Path, plan: Plan, say, maker: RunMaker | None) -> str:
    """:func:`advance` under the plan's lock, with the plan as just loaded or saved."""
    if plan.state != "running":
        raise PlanError(f"{plan_dir(root, plan.id)}: plan is {plan.state}")
    run = plan.next_planned()
    if run is None and maker is not None:
        try:
            more = maker.more_runs(plan)
        except Exception as exc:  # the capture cannot say what comes next: end the plan, host put back
            _end(root, plan, "failed", say, maker, why=f"no next round: {one_line(exc)}")
            raise PlanError(f"{plan_dir(root, plan.id)}: plan failed: no next round: {one_line(exc)}") from None
        if more:
            plan.runs += more
            plan.log.append(f"{len(more)} more run(s): {', '.join(r.name for r in more)}")
            save(root, plan)
            run = more[0]
    if run is None:
        return _finish(root, plan, say, maker)
    try:
        return _boot(root, plan, run, say)
    except Exception as exc:
        # a boot that cannot be started fails its run and ends the plan: no unit is left to resume it
        run.state, run.why = "failed", f"could not boot: {one_line(exc)}"
        _end(root, plan, "failed", say, maker, failed=(run, {}, run.why), why=f"run {run.name}: {run.why}")
        raise


def _end(
    root: Path,
    plan: Plan,
    state: str,
    say,
    maker: RunMaker | None,
    *,
    failed: tuple[BootRun, dict, str] | None = None,
    why: str | None = None,
) -> list[str]:
    """End a plan (``finished``, ``failed`` or ``aborted``): the state on disk first (and ``why``, which the bundle's
    stopping reason gives), then the capture told (``failed``: the run, its boot and why it failed; then the seal),
    then every host change put back, whatever any step before raised. Returns what the capture could not do
    (said already), for the caller to raise (:func:`_raise_for`) once its own steps are taken. A process killed
    part way leaves an ended plan whose ending :func:`resume` or :func:`abort` completes."""
    plan.state, plan.ended_because = state, why
    plan.log.append(f"plan {state}" + (f": {why}" if why else ""))
    save(root, plan)
    return _put_back_and_tell(root, plan, say, maker, failed)


def _put_back_and_tell(
    root: Path, plan: Plan, say, maker: RunMaker | None, failed: tuple[BootRun, dict, str] | None = None
) -> list[str]:
    # The capture first (the bundle sealed), then the host: the unit running this resume is among the changes put
    # back, and once its file is gone and systemd reloaded, systemd fails its start job and starts what waits for it
    # (on the lab host, a reboot that cut a 6-run bundle's seal short, issue 28); whatever the capture did, the host
    # is put back.
    problems: list[str] = []
    try:
        problems = _tell(plan, say, maker, failed)
    finally:
        _cleanup(root, plan, say)
    return problems


def _complete_ending(root: Path, plan: Plan, say, maker: RunMaker | None) -> list[str]:
    """The last steps of an ended plan's ending again (a process killed part way): put back what is left and tell
    the capture, with the run a failed plan ended on and the boot it verified (the capture records a run once)."""
    failed = [r for r in plan.runs if r.state == "failed"] if plan.state == "failed" else []
    told = None
    if failed:
        run = failed[-1]
        boot = (
            {
                "boot_id": run.boot_id_found,
                "release": run.release_found,
                "cmdline": run.cmdline_found,
                "plan": plan.id,
                "mode": plan.mode,
            }
            if run.boot_id_found
            else {}
        )
        told = (run, boot, run.why or "")
    return _put_back_and_tell(root, plan, say, maker, told)


def _raise_for(plan: Plan, problems: list[str]) -> None:
    if problems:
        raise PlanError(f"{plan.bundle}: {problems[0]}")


def _tell(plan: Plan, say, maker: RunMaker | None, failed: tuple[BootRun, dict, str] | None) -> list[str]:
    """The capture hears that the plan ended (and which run failed); what it cannot do is said, not raised, so that
    every step of ending a plan is taken."""
    if maker is None:
        return []
    problems = []
    steps = ([lambda: maker.failed_run(*failed)] if failed else []) + [lambda: maker.finished(plan)]
    for step in steps:
        try:
            step()
        except Exception as exc:  # a bundle moved, deleted or sealed by hand: the plan still ends
            problems.append(one_line(exc))
            say(f"boot plan {plan.id}: bundle {plan.bundle} not updated: {one_line(exc)}")
    return problems


def _boot(root: Path, plan: Plan, run: BootRun, say) -> str:
    image, initrd = kernel_files(root, plan, run, planned=True)
    booting = boot_mode(plan.mode)
    with _changes(root, plan, say) as host:
        install_unit(host, root, plan)
        custom = root / GRUB_CUSTOM
        for stale in [
            c
            for c in host.changes
            if c.after is None and (c.kind in ("kexec_load", "grub_oneshot") or c.path == str(custom))
        ]:
            host.undo([stale])  # the previous run's one-shot and menu entry are spent: do not stack them
        booting.load(host, root, plan, run, image, initrd)
        run.state = "booting"
        run.boot_id_before = boot_facts(root)["boot_id"]
        save(root, plan)
    return booting.boot(root, run, image, initrd, say)


def verify_boot(plan: Plan, run: BootRun, found: dict) -> str | None:
    """Why this boot is not the run's, or None."""
    if run.boot_id_before and found["boot_id"] == run.boot_id_before:
        return f"no reboot happened (boot_id {found['boot_id']} is the one before)"
    if run.release and found["release"] != run.release:
        return f"booted kernel {found['release']}, expected {run.release} (a failed boot fell back to the default?)"
    if boot_words(found["cmdline"]) != boot_words(run.cmdline):
        return f"/proc/cmdline is '{found['cmdline']}', expected '{run.cmdline}' (BOOT_IMAGE= and initrd= ignored)"
    return None


def resume(
    plan_id: str,
    make_run: RunMaker | Callable[[BootRun, dict], dict],
    *,
    root: Path | str = "/",
    say: Callable[[str], None] = print,
    go_on: bool = True,
) -> Plan:
    """After a boot: verify it, make the run (``make_run(planned_run, boot_record) -> run record``, or a
    :class:`RunMaker`), then advance (``go_on``) or finish, all under the plan's lock. A wrong boot fails the run
    and stops the plan; a make_run error fails the run only, unless it is :class:`CannotGoOn`. A running plan with
    no run booting (a process killed between a run and the next boot) goes on with the next boot."""
    root = Path(root)
    maker = _maker(make_run)
    with plan_lock(root, plan_id):
        plan = load(root, plan_id)
        run = plan.current()
        if plan.state != "running":  # an ending cut short (the unit still there)
            problems = _complete_ending(root, plan, say, maker)
            say(f"boot plan {plan.id}: nothing to resume (plan {plan.state}); host changes put back")
            _raise_for(plan, problems)
            return plan
        if run is None and not go_on:
            raise PlanError(f"{plan_dir(root, plan_id)}: nothing to resume (no run booting)")
        if run is not None and not _make(root, plan, run, maker, say):
            return plan
        if go_on:
            _advance(root, plan, say, maker)
    return load(root, plan_id)


def _make(root: Path, plan: Plan, run: BootRun, maker: RunMaker, say) -> bool:
    """Verify the boot and make its run; False when the plan ended. A run found ``booted`` was being made when its
    process ended (the machine crashed, lost power or was reset, or the process was killed): it is recorded failed,
    never made again in whatever boot came up (the default entry may have the condition's command line)."""
    found = boot_facts(root)
    if run.state == "booted":
        return _cut_short(root, plan, run, found, maker, say)
    run.boot_id_found, run.release_found, run.cmdline_found = found["boot_id"], found["release"], found["cmdline"]
    why = verify_boot(plan, run, found)
    boot = {**found, "plan": plan.id, "mode": plan.mode}
    if why:
        run.state, run.why = "failed", why
        say(f"boot plan {plan.id}: run {run.name} failed: {why}; stopping the plan and putting the host back")
        _raise_for(
            plan,
            _end(
                root, plan, "failed", say, maker, failed=(run, boot, f"wrong boot: {why}"), why=f"run {run.name}: {why}"
            ),
        )
        return False
    run.state = "booted"
    save(root, plan)
    try:
        run.record = maker.make_run(run, boot)
        run.state = "made"
    except Exception as exc:  # the run is recorded failed; the plan goes on with the next boot
        run.state, run.why = "failed", one_line(exc if isinstance(exc, PlanError) else f"{type(exc).__name__}: {exc}")
        save(root, plan)
        if isinstance(exc, CannotGoOn):
            _end(root, plan, "failed", say, maker, failed=(run, boot, run.why), why=f"run {run.name}: {run.why}")
            raise PlanError(f"{plan_dir(root, plan.id)}: plan failed: {one_line(exc)}") from None
        _tell_failed(root, plan, run, boot, maker, say)
    save(root, plan)
    _say_done(plan, run, say)
    return True


def _say_done(plan: Plan, run: BootRun, say) -> None:
    say(
        f"boot plan {plan.id}: run {run.name} ({run.condition}) {run.state}"
        + (f": {run.why}" if run.why else "")
        + f"; {sum(r.state == 'planned' for r in plan.runs)} left"
    )


def _tell_failed(root: Path, plan: Plan, run: BootRun, boot: dict, maker: RunMaker, say) -> None:
    """The capture records the failed run; when it cannot (the bundle takes no record: no later run could be kept
    either), the plan ends, failed."""
    try:
        maker.failed_run(run, boot, run.why)
    except Exception as told:
        _end(root, plan, "failed", say, maker, why=f"run {run.name}: not recorded: {one_line(told)}")
        raise PlanError(
            f"{plan_dir(root, plan.id)}: plan failed: run {run.name} not recorded: {one_line(told)}"
        ) from None


def _cut_short(root: Path, plan: Plan, run: BootRun, found: dict, maker: RunMaker, say) -> bool:
    """A run found ``booted`` at resume: its making had started (the plan's own boot into it was verified, its state
    saved) when its process ended. A new boot_id is a machine that rebooted during the run (a crash, a power loss, a
    watchdog reset): whatever came up is not a boot the plan asked for, so the run is recorded failed naming that
    boot, and the plan goes on with the next run. The same boot_id is a process killed mid-run: failed too, the run
    is not made twice in one boot."""
    if found["boot_id"] != run.boot_id_found:
        why = (
            f"the machine rebooted during the run: boot_id {found['boot_id']}, release {found['release']}, "
            f"/proc/cmdline '{found['cmdline']}' came up; the run was being made in boot_id {run.boot_id_found}"
        )
    else:
        why = (
            f"the run's process ended before the run was made (no reboot: boot_id {found['boot_id']} is the run's "
            "boot); it is not made again"
        )
    run.state, run.why = "failed", why
    save(root, plan)
    boot = {
        "boot_id": run.boot_id_found,
        "release": run.release_found,
        "cmdline": run.cmdline_found,
        "plan": plan.id,
        "mode": plan.mode,
    }  # the boot the run was being made in
    _tell_failed(root, plan, run, boot, maker, say)
    _say_done(plan, run, say)
    return True


def _cleanup(root: Path, plan: Plan, say) -> None:
    """Put back every change the journal lists, then what is really there and recognisably this plan's (the journal
    may be missing or broken: a disk that lost it, a hand that deleted it): PlanError naming what could not be put
    back, after doing all that could."""
    try:
        with _changes(root, plan, say) as host:
            host.restore()
        unlisted = None
    except HostBusy:
        raise  # another capture is changing the host: nothing is touched meanwhile
    except HostChangeError as exc:
        unlisted = exc
    with _host_lock(root, plan):
        problems = put_back_what_is_there(root, plan, say)
    if systemd_running(root):
        run_tool(["systemctl", "daemon-reload"])
    if unlisted is not None:
        problems.insert(
            0,
            f"{one_line(unlisted)}; ticklab's unit, link, grub entry and one-shot of plan {plan.id} "
            "are put back" + (" except as follows" if problems else ""),
        )
    if problems:
        raise PlanError("; ".join(problems))


@contextlib.contextmanager
def _host_lock(root: Path, plan: Plan):
    lock = host_lock(root, plan_dir(root, plan.id) / "host-changes.json").acquire()
    try:
        yield
    finally:
        lock.release()


def _finish(root: Path, plan: Plan, say, maker: RunMaker | None) -> str:
    """Every run done: the plan ends (:func:`_end`), then the machine goes back to the original kernel and command
    line; a sealing error is raised after that."""
    problems = _end(root, plan, "finished", say, maker)
    text = return_to_original(root, plan)
    say(f"boot plan {plan.id}: {text}")
    _raise_for(plan, problems)
    return text


def abort(
    plan_id: str, *, root: Path | str = "/", say: Callable[[str], None] = print, maker: RunMaker | None = None
) -> Plan:
    """Remove the unit and put back every host change; the bundle and the runs made are kept (and sealed). A plan
    that has ended already has what is left of its ending done again."""
    root = Path(root)
    with plan_lock(root, plan_id):
        plan = load(root, plan_id)
        made = sum(r.state == "made" for r in plan.runs)
        stop_unit(root, plan, say)
        if plan.state == "running":
            problems = _end(root, plan, "aborted", say, maker)
            unit = (
                "unit removed"
                if not os.path.lexists(root / UNIT_PATH)
                else f"{root / UNIT_PATH} left as it is (not this plan's)"
            )
            say(
                f"boot plan {plan.id} aborted: {unit}, host changes put back; "
                f"{made} run(s) made are kept in {plan.bundle}"
            )
        else:
            problems = _complete_ending(root, plan, say, maker)
            say(
                f"boot plan {plan.id} had {plan.state} already: what was left of its host changes is put back; "
                f"{made} run(s) made are kept in {plan.bundle}"
            )
        _raise_for(plan, problems)
    return plan


def record_boot_only(run: BootRun, boot: dict) -> dict:
    """The ``make_run`` of ``ticklab plan resume`` until the capture session is wired in: the boot it verified."""
    return {
        "run": run.name,
        "condition": run.condition,
        "boot_id": boot["boot_id"],
        "release": boot["release"],
        "cmdline": boot["cmdline"],
    }
