"""Boot plans: the seeded, interleaved run order of a capture whose conditions live in the kernel (its release or
its command line), one boot per run, kept on disk across reboots.

A plan lives in ``/var/lib/ticklab/plans/<id>/`` (made 0700 by us; refused if a directory above it is writable by
another user): ``plan.json`` (the runs and their states, rewritten atomically) and ``host-changes.json`` (the
journal of :class:`~ticklab.host.HostChanges` in ``keep`` mode: the systemd unit, its enabling link, grub's
custom.cfg entry, the one-shot ``next_entry``, the loaded kexec kernel; all put back at the end or by ``abort``).

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

A run's states: ``planned``, ``booting`` (its boot is under way: the plan's own kexec, reboot or manual boot),
``booted`` (its boot verified and its making started), ``made`` or ``failed``. A run ``resume`` finds ``booted`` was
being made when the machine rebooted (a crash, a power loss) or its process was killed: it is recorded failed
("the machine rebooted during the run: ..." naming the boot that came up), never made again in whatever boot came
up, and the plan goes on with the next run.

Without ``--id`` the commands act on the running plan, else the newest (``ticklab plan list`` lists them). An
abort first cancels the unit's start job queued at this boot (``systemctl --no-block stop``) and resets a failed
state, so removing the unit leaves systemd no job to fail and no failed unit.

At the end: every host change is put back (unit and link removed, custom.cfg as it was, next_entry unset,
kexec kernel unloaded); then kexec mode kexecs back into the original kernel and command line if this boot
differs from it, grub mode reboots into the default entry (never changed), manual mode prints what to boot.
"""

from __future__ import annotations

import abc
import argparse
import contextlib
import fcntl
import json
import os
import re
import shlex
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..safefiles import OwnedDir, UnsafeFileError, shown
from ..schemas import problem as schema_problem
from . import facts
from .change_kinds import read_plan_file, run_command, write_plan_file
from .journal import HostBusy, HostChangeError, host_lock, open_private, private_dir, read_private
from .knobs import HostChanges

PLANS_DIR = "var/lib/ticklab/plans"
UNIT_NAME = "ticklab-plan.service"
UNIT_PATH = f"etc/systemd/system/{UNIT_NAME}"
UNIT_LINK = f"etc/systemd/system/multi-user.target.wants/{UNIT_NAME}"
GRUB_CUSTOM = "boot/grub/custom.cfg"
MODES = ("kexec", "grub", "manual")
ADDED_BY_BOOT = ("BOOT_IMAGE=", "initrd=")  # words a boot loader or EFI stub adds to /proc/cmdline on its own
RUN_STATES = ("planned", "booting", "booted", "made", "failed")
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
_GRUB_WORD = re.compile(r"[A-Za-z0-9_.,:=/+@%-]+")  # what grub's script parser reads as one plain word


class PlanError(RuntimeError):
    """One line naming the plan's file and what is wrong."""


class CannotGoOn(PlanError):
    """Raised by a :class:`RunMaker` when no later run could be made either (its bundle or its experiment is gone):
    the plan ends, failed, with the host put back."""


@dataclass
class BootRun:
    name: str
    condition: str
    kernel: str  # "running", a kernel release (/boot/vmlinuz-<release>), or an image path
    cmdline: str  # the whole command line the run's boot must have
    initrd: str | None = None  # with an image path; a release uses /boot/initrd.img-<release> if present
    release: str | None = None  # expected uname -r (default: from kernel; an image path without it is not checked)
    warmup: bool = False  # a warm-up run (kept in the manifest, never in results.csv)
    state: str = "planned"
    boot_id_before: str | None = None
    boot_id_found: str | None = None
    release_found: str | None = None
    cmdline_found: str | None = None
    why: str | None = None
    record: dict | None = None


@dataclass
class Plan:
    id: str
    mode: str
    bundle: str
    original: dict  # release, cmdline, boot_id when the plan was made
    runs: list[BootRun]
    state: str = "running"  # running | finished | failed | aborted
    created: str = ""
    log: list[str] = field(default_factory=list)
    capture: dict = field(default_factory=dict)  # what the capture that made the plan needs after each boot
    ended_because: str | None = None  # why a plan failed (the run and its reason), for the bundle's stopping reason

    def current(self) -> BootRun | None:
        return next((r for r in self.runs if r.state in ("booting", "booted")), None)

    def next_planned(self) -> BootRun | None:
        return next((r for r in self.runs if r.state == "planned"), None)


MAX_PLAN_BYTES = 16 << 20
_LINE = {"type": "string", "maxLength": 4096, "pattern": r"^[^\x00-\x1f\x7f]*$"}  # one line of printable text
_LINE_OR_NULL = {**_LINE, "type": ["string", "null"]}
_RUN_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "condition", "kernel", "cmdline", "state"],
    "properties": {
        "name": {"type": "string", "pattern": f"^{_ID.pattern}$"},
        "condition": {**_LINE, "minLength": 1},
        # "running", a release (/boot/vmlinuz-<release>) or the absolute path of an image
        "kernel": {"type": "string", "pattern": r"^(running|[A-Za-z0-9._+~-]{1,200}|/[^\x00-\x1f\x7f]{1,4095})$"},
        "cmdline": _LINE,
        "initrd": {"type": ["string", "null"], "pattern": r"^/[^\x00-\x1f\x7f]{1,4095}$"},
        "release": {"type": ["string", "null"], "pattern": r"^[A-Za-z0-9._+~-]{1,200}$"},
        "warmup": {"type": "boolean"},
        "state": {"enum": list(RUN_STATES)},
        **{key: _LINE_OR_NULL for key in ("boot_id_before", "boot_id_found", "release_found", "cmdline_found")},
        "why": {"type": ["string", "null"], "maxLength": 1 << 16},
        "record": {"type": ["object", "null"]},
    },
}
PLAN_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["id", "mode", "bundle", "original", "runs", "state"],
    "properties": {
        "id": {"type": "string", "pattern": f"^{_ID.pattern}$"},
        "mode": {"enum": list(MODES)},
        "bundle": {**_LINE, "minLength": 1},
        "original": {
            "type": "object",
            "required": ["release", "cmdline", "boot_id"],
            "properties": {
                "release": {"type": "string", "pattern": r"^[A-Za-z0-9._+~-]{1,200}$"},
                "cmdline": _LINE,
                "boot_id": _LINE_OR_NULL,
            },
        },
        "runs": {"type": "array", "minItems": 1, "maxItems": 100_000, "items": _RUN_SCHEMA},
        "state": {"enum": ["running", "finished", "failed", "aborted"]},
        "created": _LINE,
        "log": {"type": "array", "items": {"type": "string", "maxLength": 1 << 16}},
        "capture": {"type": "object"},
        "ended_because": {"type": ["string", "null"], "maxLength": 1 << 16},
    },
}


def plans_dir(root: Path | str) -> Path:
    return Path(root) / PLANS_DIR


def plan_dir(root: Path | str, plan_id: str) -> Path:
    if not _ID.fullmatch(plan_id or ""):
        raise PlanError(f"{plans_dir(root)}: {plan_id!r} is not a plan id")
    return plans_dir(root) / plan_id


def _boot_facts(root: Path) -> dict:
    read = lambda relative: (facts.read_text(root / relative) or "").strip()  # noqa: E731
    return {
        "boot_id": read("proc/sys/kernel/random/boot_id") or None,
        "release": read("proc/sys/kernel/osrelease") or os.uname().release,
        "cmdline": read("proc/cmdline"),
    }


def boot_words(cmdline: str) -> list[str]:
    """The command line's words without those a boot loader adds (BOOT_IMAGE=, initrd=)."""
    return [w for w in cmdline.split() if not w.startswith(ADDED_BY_BOOT)]


def condition_cmdline(original: str, words: list[str]) -> str:
    """The original command line (without loader-added words) with ``words`` added; a word ``key=value``
    replaces the original's ``key=...``, and ``-key`` removes it. Words after ``--`` are init's arguments: the
    kernel words go before it, and it and what follows are kept as they are."""
    keep = boot_words(original)
    init_args = keep[keep.index("--") :] if "--" in keep else []
    keep = keep[: len(keep) - len(init_args)]
    for word in words:
        key = word.lstrip("-").split("=", 1)[0]
        keep = [w for w in keep if w.split("=", 1)[0] != key]
        if not word.startswith("-"):
            keep.append(word)
    return " ".join(keep + init_args)


# -- state on disk -------------------------------------------------------------------------------------
def _save(root: Path, plan: Plan) -> None:
    """plan.json replaced whole (a kill or a full disk leaves the old one and no temporary), never through a link."""
    try:
        with OwnedDir(plan_dir(root, plan.id), create=False) as directory:
            directory.write_atomic("plan.json", json.dumps(asdict(plan), separators=(",", ":")).encode(), mode=0o600)
    except UnsafeFileError as exc:
        raise PlanError(str(exc)) from None


def load(root: Path | str, plan_id: str) -> Plan:
    root = Path(root)
    directory = plan_dir(root, plan_id)
    path = directory / "plan.json"
    if not directory.is_dir():
        raise PlanError(f"{directory}: no such plan")
    try:
        private_dir(directory)
        raw = read_private(path, MAX_PLAN_BYTES)  # no link, no FIFO, ours, bounded
    except HostChangeError as exc:
        raise PlanError(str(exc)) from None
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise PlanError(f"{path}: not a plan's JSON ({shown(exc)})") from None
    problem = schema_problem(data, PLAN_SCHEMA)
    if problem:
        raise PlanError(f"{path}: {problem}; not a plan state ticklab wrote, refused")
    try:
        runs = [BootRun(**r) for r in data.pop("runs")]
        plan = Plan(runs=runs, **data)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise PlanError(f"{path}: unreadable plan ({shown(exc)})") from None
    if plan.mode not in MODES or any(r.state not in RUN_STATES for r in plan.runs):
        raise PlanError(f"{path}: unknown mode or run state; refused")
    if plan.id != plan_id:
        raise PlanError(f"{path}: id: {shown(plan.id)!r} is not the plan's directory {plan_id!r}; refused")
    return plan


def _plan_ids(root: Path | str) -> list[str]:
    """Every directory holding a plan.json of any kind: one that is a link, a FIFO or a directory is a plan
    :func:`load` refuses, not a host with no plan."""
    directory = plans_dir(root)
    return sorted(p.name for p in directory.glob("*") if os.path.lexists(p / "plan.json")) if directory.is_dir() else []


class NoPlan(PlanError):
    """No plan on this host (what ``plan status`` and ``plan list`` say, exit 0)."""


def _plans(root: Path | str) -> list[Plan]:
    """Every plan on this host, oldest first; NoPlan when there is none, PlanError when one is unreadable (it might be
    the running one)."""
    ids = _plan_ids(root)
    if not ids:
        raise NoPlan(f"no boot plan on this host ({plans_dir(root)} holds none)")
    plans = []
    for plan_id in ids:
        try:
            plans.append(load(root, plan_id))
        except PlanError as exc:
            raise PlanError(f"{exc}; name a plan with --id ('ticklab plan list' lists them)") from None
    return sorted(plans, key=lambda p: (p.created, p.id))


def default_plan(root: Path | str) -> str:
    """The plan a command acts on without ``--id``: the running one (the newest, were there several), else the newest
    (by its creation time)."""
    return _default_of(_plans(root)).id


def _default_of(plans: list[Plan]) -> Plan:
    running = [p for p in plans if p.state == "running"]
    return (running or plans)[-1]


def list_lines(root: Path | str) -> list[str]:
    """One line per plan, oldest first: id, what it captures (claim/experiment), mode, state, runs made and left,
    when it was made; the one ``--id`` defaults to is marked."""
    plans = _plans(root)
    chosen = _default_of(plans).id
    lines = []
    for plan in plans:
        experiment = plan.capture.get("experiment") if isinstance(plan.capture, dict) else None
        what = f"{Path(experiment).parent.name}/{Path(experiment).stem}" if experiment else "(no capture)"
        made, failed = sum(r.state == "made" for r in plan.runs), sum(r.state == "failed" for r in plan.runs)
        left = sum(r.state == "planned" for r in plan.runs)
        lines.append(
            f"{plan.id}  {what}  {plan.mode}  {plan.state}  {made} made, {failed} failed, {left} left of "
            f"{len(plan.runs)}  created {plan.created or '?'}" + ("  (default for --id)" if plan.id == chosen else "")
        )
    return lines


@contextlib.contextmanager
def _plan_lock(root: Path, plan_id: str):
    """One process acts on a plan at a time (the unit's resume and a user's abort)."""
    path = plan_dir(root, plan_id) / "plan.lock"
    fd = open_private(path, os.O_RDWR | os.O_CREAT)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise PlanError(f"{path}: another ticklab process is acting on this plan; wait for it") from None
        yield
    finally:
        os.close(fd)


def _changes(root: Path, plan: Plan, log) -> HostChanges:
    return HostChanges(plan_dir(root, plan.id) / "host-changes.json", root=root, keep=True, log=log)


# -- making a plan ---------------------------------------------------------------------------------------
def new_plan_id() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


def refuse_if_running(root: Path | str) -> None:
    """One plan runs at a time on a machine: PlanError naming the running one."""
    root = Path(root)
    for other in _plan_ids(root):
        if load(root, other).state == "running":
            raise PlanError(
                f"{plans_dir(root) / other}: a plan is running; 'ticklab plan status' or 'ticklab plan abort'"
            )


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
    if mode not in MODES:
        raise PlanError(f"--boot {mode}: one of {', '.join(MODES)}")
    if not runs:
        raise PlanError("a boot plan needs at least one run")
    refuse_if_running(root)
    plan_id = plan_id or new_plan_id()
    directory = plan_dir(root, plan_id)
    names = [_kept_name(directory, name) for name in keep or {}]
    original = _boot_facts(root)
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
        _kernel_files(root, plan, run)  # every kernel must exist before the first reboot
    if mode == "grub":
        grub_menu_entries(plan, root)  # and every menu entry be one grub can take as it is
        takes_over = kexec_takes_over_reboots(root)
        if takes_over:
            raise PlanError(
                f"{takes_over}: kexec-tools turns every reboot into a kexec of the default kernel with this "
                "boot's command line, so no reboot would reach grub's one-shot entry; set LOAD_KEXEC=false "
                "(dpkg-reconfigure kexec-tools) or use --boot kexec"
            )
    try:
        private_dir(plans_dir(root))
        os.mkdir(directory, 0o700)  # exclusively: a plan of the same id made meanwhile is never taken over
    except FileExistsError:
        raise PlanError(f"{directory}: exists already") from None
    except HostChangeError as exc:
        raise PlanError(str(exc)) from None
    try:
        private_dir(directory)
        for name, data in zip(names, (keep or {}).values()):
            try:
                with OwnedDir(directory, create=False) as owned, owned.create(name, mode=0o600, exclusive=True) as out:
                    out.write(data)
            except UnsafeFileError as exc:
                raise PlanError(str(exc)) from None
        _save(root, plan)
    except BaseException:  # a plan not made leaves no directory behind (it was made just now, by us)
        shutil.rmtree(directory, ignore_errors=True)
        raise
    return plan


def kexec_takes_over_reboots(root: Path | str) -> str | None:
    """The file that makes Debian's kexec-tools kexec at every reboot (``LOAD_KEXEC=true`` in /etc/default/kexec or a
    snippet of /etc/default/kexec.d, as its init script reads them: the last assignment wins), or None."""
    root = Path(root)
    files = [root / "etc/default/kexec"] + sorted((root / "etc/default/kexec.d").glob("*"))
    found = None
    for path in files:
        text = facts.read_text(path) or ""
        for line in text.splitlines():
            words = line.split("#", 1)[0].strip()
            if words.startswith("LOAD_KEXEC="):
                value = words[len("LOAD_KEXEC=") :].strip().strip("\"'")
                found = path if value == "true" else None
    return str(found) if found else None


def _kept_name(directory: Path, name: str) -> str:
    if not _ID.fullmatch(name) or name in ("plan.json", "plan.lock", "host-changes.json"):
        raise PlanError(f"{directory}: {name!r} cannot be kept with a plan")
    return name


def kept_file(root: Path | str, plan_id: str, name: str) -> Path:
    """A file kept with the plan (see :func:`create`), checked private to us."""
    directory = plan_dir(root, plan_id)
    path = directory / _kept_name(directory, name)
    try:
        os.close(open_private(path, os.O_RDONLY))
    except HostChangeError as exc:
        raise PlanError(str(exc)) from None
    return path


def _kernel_files(root: Path, plan: Plan, run: BootRun, *, planned: bool = False) -> tuple[Path, Path | None]:
    """The run's kernel image and initrd; ``planned``: the plan was made with them (checked then), so a missing image
    was moved or removed since."""
    if "/" in run.kernel:
        image, initrd = Path(run.kernel), Path(run.initrd) if run.initrd else None
    else:
        release = plan.original["release"] if run.kernel == "running" else run.kernel
        image = root / "boot" / f"vmlinuz-{release}"
        initrd = root / "boot" / f"initrd.img-{release}"
        initrd = initrd if initrd.is_file() else None
    if not image.is_file() and planned:
        raise PlanError(
            f"{image}: missing, the kernel of run {run.name} ({run.condition}); it was there when the plan "
            "was made, so it was moved or removed since"
        )
    if not image.is_file():
        raise PlanError(
            f"{image}: missing, the kernel of run {run.name} ({run.condition}); "
            "build and install it first (ticklab kernel build --host)"
        )
    return image, initrd


# -- the steps ---------------------------------------------------------------------------------------------
def _named_project() -> list[str]:
    """``--project DIR`` when the plan's project was named (--project or $TICKLAB_PROJECT): the unit starts with
    systemd's environment, where neither is, and a wheel installed elsewhere would find no project at boot."""
    from ..paths import ProjectError, find_project

    try:
        directory, named_by = find_project()
    except ProjectError:
        return []
    return ["--project", str(directory)] if named_by in ("--project", "TICKLAB_PROJECT") else []


def unit_text(root: Path, plan_id: str) -> str:
    argv = [sys.executable, "-m", "ticklab.cli", *_named_project(), "plan", "resume", "--id", plan_id]
    if str(root) != "/":
        argv += ["--root", str(root)]
    # DefaultDependencies=no: multi-user.target would otherwise order itself after the units it wants,
    # a cycle with After=multi-user.target
    return (
        "[Unit]\n"
        f"Description=ticklab boot plan {plan_id}: verify this boot, make the next run\n"
        "DefaultDependencies=no\n"
        "Requires=sysinit.target\n"
        "After=basic.target multi-user.target network-online.target\n"
        "Conflicts=shutdown.target\nBefore=shutdown.target\n\n"
        "[Service]\nType=oneshot\n"
        f"ExecStart={shlex.join(argv)}\n"
        "StandardOutput=journal+console\nStandardError=journal+console\n"
        # the run's lines reach the journal before systemd stops this unit for the reboot it queued
        "Environment=PYTHONUNBUFFERED=1\n"
        "TimeoutStartSec=infinity\n\n"
        "[Install]\nWantedBy=multi-user.target\n"
    )


def _systemd_running(root: Path) -> bool:
    return (root / "run/systemd/system").is_dir()


def _run_tool(argv: list[str]) -> None:
    """A command that changes nothing ticklab journals (daemon-reload, the reboot itself), as knobs runs its own."""
    try:
        run_command(argv)
    except HostChangeError as exc:
        raise PlanError(str(exc)) from None


def _install_unit(host: HostChanges, root: Path, plan: Plan) -> None:
    if any(c.kind == "file" and c.path == str(root / UNIT_PATH) for c in host.changes):
        return
    if os.path.lexists(root / UNIT_PATH):
        raise PlanError(
            f"{root / UNIT_PATH}: exists already (another plan's, or left by hand); "
            "'ticklab plan abort' for its plan, or remove it"
        )
    host.write_file(UNIT_PATH, unit_text(root, plan.id), label="boot plan resume unit")
    host.symlink(UNIT_LINK, f"../{UNIT_NAME}", label="boot plan resume unit enabled")
    if _systemd_running(root):
        _run_tool(["systemctl", "daemon-reload"])


def _grub_entry(root: Path, plan: Plan, run: BootRun, image: Path, initrd: Path | None) -> tuple[str, str]:
    """A menu entry in /boot/grub/custom.cfg (Debian's grub.cfg sources it via 41_custom; grub.cfg is not
    regenerated and its default is untouched) for this run's kernel and command line."""
    # whatever made the command line: a newline (or any control character) would end the linux line and start
    # another (an initrd or linux of its own); grub's script parser would read quotes, $, ; and braces
    control = next((c for c in run.cmdline if not c.isprintable()), None)
    if control is not None:
        raise PlanError(
            f"{root / GRUB_CUSTOM}: the command line of run {run.name} holds the control character "
            f"{control!r}; it cannot go into a grub menu entry (nor any command line)"
        )
    unsafe = [w for w in run.cmdline.split(" ") if w and not _GRUB_WORD.fullmatch(w)]
    if unsafe:
        raise PlanError(
            f"{root / GRUB_CUSTOM}: command-line word '{shown(unsafe[0])}' of run {run.name} cannot go "
            "into a grub menu entry as it is; use --boot kexec or manual"
        )
    separate_boot = str(root / "boot") in facts.mounts(root)

    def on_disk(path: Path) -> str:
        try:
            text = "/" + str(path.relative_to(root))
        except ValueError:
            raise PlanError(
                f"{root / GRUB_CUSTOM}: the kernel file {shown(path)} of run {run.name} is not under "
                f"{root}; grub boots files of this root only"
            ) from None
        text = text[len("/boot") :] if separate_boot and text.startswith("/boot/") else text
        if not _GRUB_WORD.fullmatch(text):
            raise PlanError(
                f"{root / GRUB_CUSTOM}: the kernel file '{shown(text)}' of run {run.name} cannot go into a "
                "grub menu entry as it is; use --boot kexec or manual"
            )
        return text

    title = f"ticklab-plan-{plan.id}"
    lines = [
        f"menuentry '{title}' --id '{title}' {{",
        f"  search --no-floppy --file --set=root {on_disk(image)}",
        f"  linux {on_disk(image)} {run.cmdline}",
    ]
    if initrd:
        lines.append(f"  initrd {on_disk(initrd)}")
    return "\n".join(lines + ["}"]) + "\n", title


def grub_menu_entries(plan: Plan, root: Path | str = "/") -> list[str]:
    """The custom.cfg menu entry each run of ``plan`` would boot with in grub mode (what :func:`create` checks before
    the first boot); PlanError for a run no entry can be written for."""
    root = Path(root)
    return [_grub_entry(root, plan, run, *_kernel_files(root, plan, run))[0] for run in plan.runs]


class RunMaker(abc.ABC):
    """What makes a plan's runs (``capture.boot_capture.BootCapture`` for ``capture --boot``): ``make_run`` after a
    verified boot; ``failed_run`` for a run whose boot was wrong or whose making raised; ``more_runs`` when every
    planned run is done (a stopping rule's next round; [] ends the plan); ``finished`` when the plan ends (made,
    stopped by a bad boot, or aborted)."""

    @abc.abstractmethod
    def make_run(self, run: BootRun, boot: dict) -> dict:
        """The run record, after its boot was verified."""

    def failed_run(self, run: BootRun, boot: dict, why: str) -> None:
        pass

    def more_runs(self, plan: Plan) -> list[BootRun]:
        return []

    def finished(self, plan: Plan) -> None:
        pass


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
    with _plan_lock(root, plan_id):
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
            _end(root, plan, "failed", say, maker, why=f"no next round: {_one_line(exc)}")
            raise PlanError(f"{plan_dir(root, plan.id)}: plan failed: no next round: {_one_line(exc)}") from None
        if more:
            plan.runs += more
            plan.log.append(f"{len(more)} more run(s): {', '.join(r.name for r in more)}")
            _save(root, plan)
            run = more[0]
    if run is None:
        return _finish(root, plan, say, maker)
    try:
        return _boot(root, plan, run, say)
    except Exception as exc:
        # a boot that cannot be started fails its run and ends the plan: no unit is left to resume it
        run.state, run.why = "failed", f"could not boot: {_one_line(exc)}"
        _end(root, plan, "failed", say, maker, failed=(run, {}, run.why), why=f"run {run.name}: {run.why}")
        raise


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:500] or type(exc).__name__


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
    _save(root, plan)
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
            problems.append(_one_line(exc))
            say(f"boot plan {plan.id}: bundle {plan.bundle} not updated: {_one_line(exc)}")
    return problems


def _boot(root: Path, plan: Plan, run: BootRun, say) -> str:
    image, initrd = _kernel_files(root, plan, run, planned=True)
    with _changes(root, plan, say) as host:
        _install_unit(host, root, plan)
        custom = root / GRUB_CUSTOM
        for stale in [
            c
            for c in host.changes
            if c.after is None and (c.kind in ("kexec_load", "grub_oneshot") or c.path == str(custom))
        ]:
            host.undo([stale])  # the previous run's one-shot and menu entry are spent: do not stack them
        if plan.mode == "kexec":
            host.kexec_load(str(image), str(initrd) if initrd else None, run.cmdline)
        elif plan.mode == "grub":
            grub_cfg = read_plan_file(root / "boot/grub/grub.cfg") or ""
            if "custom.cfg" not in grub_cfg:
                raise PlanError(
                    f"{root / 'boot/grub/grub.cfg'}: does not source custom.cfg (Debian's /etc/grub.d/41_custom); "
                    "--boot grub needs it, or use --boot kexec|manual"
                )
            user_custom = read_plan_file(custom) or ""
            entry, title = _grub_entry(root, plan, run, image, initrd)
            host.write_file(
                GRUB_CUSTOM,
                user_custom + ("\n" if user_custom and not user_custom.endswith("\n") else "") + entry,
                label="boot plan grub entry",
            )
            host.grub_reboot(title)
        run.state = "booting"
        run.boot_id_before = _boot_facts(root)["boot_id"]
        _save(root, plan)
    if plan.mode == "manual":
        text = (
            f"boot run {run.name} ({run.condition}): kernel {image}"
            + (f", initrd {initrd}" if initrd else "")
            + f", command line: {run.cmdline}\n"
            "then ticklab-plan.service resumes the plan (or run 'ticklab plan resume'); the default entry is unchanged"
        )
        say(text)
        return text
    # --no-block: the unit running this waits for nothing; systemd stops it and goes on to kexec/reboot
    reboot = (
        (["systemctl", "--no-block", "kexec"] if _systemd_running(root) else ["kexec", "-e"])
        if plan.mode == "kexec"
        else ["systemctl", "--no-block", "reboot"]
    )
    say(
        f"run {run.name} ({run.condition}): {'kexec' if plan.mode == 'kexec' else 'reboot'} into {image} "
        f"with '{run.cmdline}'"
    )
    _run_tool(reboot)
    return " ".join(reboot)


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
    with _plan_lock(root, plan_id):
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
    found = _boot_facts(root)
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
    _save(root, plan)
    try:
        run.record = maker.make_run(run, boot)
        run.state = "made"
    except Exception as exc:  # the run is recorded failed; the plan goes on with the next boot
        run.state, run.why = "failed", _one_line(exc if isinstance(exc, PlanError) else f"{type(exc).__name__}: {exc}")
        _save(root, plan)
        if isinstance(exc, CannotGoOn):
            _end(root, plan, "failed", say, maker, failed=(run, boot, run.why), why=f"run {run.name}: {run.why}")
            raise PlanError(f"{plan_dir(root, plan.id)}: plan failed: {_one_line(exc)}") from None
        _tell_failed(root, plan, run, boot, maker, say)
    _save(root, plan)
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
        _end(root, plan, "failed", say, maker, why=f"run {run.name}: not recorded: {_one_line(told)}")
        raise PlanError(
            f"{plan_dir(root, plan.id)}: plan failed: run {run.name} not recorded: {_one_line(told)}"
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
    _save(root, plan)
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
        problems = _put_back_what_is_there(root, plan, say)
    if _systemd_running(root):
        _run_tool(["systemctl", "daemon-reload"])
    if unlisted is not None:
        problems.insert(
            0,
            f"{_one_line(unlisted)}; ticklab's unit, link, grub entry and one-shot of plan {plan.id} "
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


def _is_plan_unit(text: str, plan_id: str | None = None) -> bool:
    """Whether ``text`` is a unit :func:`unit_text` wrote (for ``plan_id``, or for any plan when None)."""
    lines = text.splitlines()
    described = [
        line[len("Description=ticklab boot plan ") :].split(":", 1)[0]
        for line in lines
        if line.startswith("Description=ticklab boot plan ")
    ]
    started = []
    for line in lines:
        if line.startswith("ExecStart="):
            try:
                argv = shlex.split(line[len("ExecStart=") :])
            except ValueError:
                return False
            if "--project" in argv[:-1]:  # the unit names the plan's project (_named_project)
                at = argv.index("--project")
                argv = argv[:at] + argv[at + 2 :]
            marker = ["-m", "ticklab.cli", "plan", "resume", "--id"]
            at = next((i for i in range(len(argv)) if argv[i : i + len(marker)] == marker), None)
            if at is not None and at + len(marker) < len(argv):
                started.append(argv[at + len(marker)])
    if len(described) != 1 or started != described:
        return False
    return plan_id is None or described[0] == plan_id


def _put_back_what_is_there(root: Path, plan: Plan, say) -> list[str]:
    """Remove what this plan installed and the journal no longer lists: its unit (recognised by its content) and the
    link enabling it, its grub menu entry and one-shot next_entry, a kexec kernel loaded for it. Returns what could
    not be put back, one phrase each; what belongs to someone else (another plan's unit) is left as it is."""
    problems, done = [], []
    unit, link = root / UNIT_PATH, root / UNIT_LINK
    ours_gone = True
    if os.path.lexists(unit):
        try:
            text = read_plan_file(unit) or ""
        except HostChangeError as exc:
            text = None
            problems.append(f"{_one_line(exc)}; not ticklab's unit of plan {plan.id}, left as it is")
        if text is not None and _is_plan_unit(text, plan.id):
            try:
                unit.unlink()
                done.append(f"removed {unit}")
            except OSError as exc:
                problems.append(f"{unit}: cannot remove ({exc.strerror or exc})")
                ours_gone = False
        elif text is not None:  # another plan's or someone else's unit (and its link): not this plan's to remove
            say(f"boot plan {plan.id}: {unit}: not ticklab's unit of plan {plan.id}; left as it is, with its link")
            ours_gone = False
    if ours_gone and os.path.lexists(link):
        if os.path.islink(link) and os.readlink(link) == f"../{UNIT_NAME}":
            try:
                link.unlink()
                done.append(f"removed {link}")
            except OSError as exc:
                problems.append(f"{link}: cannot remove ({exc.strerror or exc})")
        else:
            problems.append(f"{link}: not the link ticklab makes (-> ../{UNIT_NAME}); left as it is")
    title = f"ticklab-plan-{plan.id}"
    custom = root / GRUB_CUSTOM
    try:
        text = read_plan_file(custom)
        opening = f"menuentry '{title}' --id '{title}' {{\n"
        if text is not None and opening in text:
            start = text.index(opening)
            end = text.find("\n}\n", start)
            end = len(text) if end < 0 else end + 3
            rest = text[:start] + text[end:]
            if rest.strip():
                write_plan_file(custom, rest)
            else:
                custom.unlink()
            done.append(f"removed the menu entry {title} from {custom}")
    except (HostChangeError, OSError) as exc:
        problems.append(f"{_one_line(exc)} (the menu entry {title} may be left in it)")
    grubenv = root / "boot/grub/grubenv"
    try:
        env = read_plan_file(grubenv)
        if env is not None and f"next_entry={title}" in env.splitlines():
            run_command(["grub-editenv", str(grubenv), "unset", "next_entry"])
            done.append(f"unset next_entry={title} in {grubenv}")
    except HostChangeError as exc:
        problems.append(f"{_one_line(exc)} (next_entry={title} may be left in it)")
    if plan.mode == "kexec" and (facts.read_text(root / "sys/kernel/kexec_loaded") or "").strip() == "1":
        try:
            run_command(["kexec", "-u"])
            done.append("unloaded the kexec kernel")
        except HostChangeError as exc:
            problems.append(f"a kexec kernel is still loaded: {_one_line(exc)}")
    if done:
        say(f"boot plan {plan.id}: not in its journal, put back: {'; '.join(done)}")
    return problems


def _finish(root: Path, plan: Plan, say, maker: RunMaker | None) -> str:
    """Every run done: the plan ends (:func:`_end`), then the machine goes back to the original kernel and command
    line; a sealing error is raised after that."""
    problems = _end(root, plan, "finished", say, maker)
    text = _return_to_original(root, plan)
    say(f"boot plan {plan.id}: {text}")
    _raise_for(plan, problems)
    return text


def _return_to_original(root: Path, plan: Plan) -> str:
    here = _boot_facts(root)
    same = here["release"] == plan.original["release"] and boot_words(here["cmdline"]) == boot_words(
        plan.original["cmdline"]
    )
    if same:
        return "finished; this boot is already the original kernel and command line"
    if plan.mode == "kexec":
        image = root / "boot" / f"vmlinuz-{plan.original['release']}"
        initrd = root / "boot" / f"initrd.img-{plan.original['release']}"
        if not image.is_file():
            return f"finished; {image} missing: reboot to return to the default kernel"
        argv = (
            ["kexec", "-l", str(image)]
            + (["--initrd", str(initrd)] if initrd.is_file() else [])
            + ["--append", " ".join(boot_words(plan.original["cmdline"]))]
        )
        _run_tool(argv)
        _run_tool(["systemctl", "--no-block", "kexec"] if _systemd_running(root) else ["kexec", "-e"])
        return f"finished; kexec back into {plan.original['release']} with the original command line"
    if plan.mode == "grub":
        _run_tool(["systemctl", "--no-block", "reboot"])
        return "finished; rebooting into the default entry (never changed)"
    return (
        f"finished; boot the default entry again (kernel {plan.original['release']}, "
        f"command line '{plan.original['cmdline']}')"
    )


def abort(
    plan_id: str, *, root: Path | str = "/", say: Callable[[str], None] = print, maker: RunMaker | None = None
) -> Plan:
    """Remove the unit and put back every host change; the bundle and the runs made are kept (and sealed). A plan
    that has ended already has what is left of its ending done again."""
    root = Path(root)
    with _plan_lock(root, plan_id):
        plan = load(root, plan_id)
        made = sum(r.state == "made" for r in plan.runs)
        _stop_unit(root, plan, say)
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


def _stop_unit(root: Path, plan: Plan, say) -> None:
    """Before an abort removes this plan's unit: its start job, queued at this boot (the unit starts after
    multi-user.target), is cancelled by queueing a stop (``--no-block``: the cancel is done when the stop job is
    queued, and nothing waits on the unit's ordering), and a failed state from an earlier resume of this boot is
    reset. Otherwise systemd fails the queued job once the unit file is gone and reloaded ("Failed to start
    ticklab-plan.service") and lists the unit failed. Never from the unit itself: only an abort, which the unit does
    not run (a resume that ends its plan removes the unit it runs in)."""
    if not _systemd_running(root) or not os.path.lexists(root / UNIT_PATH):
        return
    try:
        text = read_plan_file(root / UNIT_PATH) or ""
    except HostChangeError:
        return  # not a file ticklab wrote: the abort says so when putting things back
    if not _is_plan_unit(text, plan.id):
        return
    for argv in (["systemctl", "--no-block", "stop", UNIT_NAME], ["systemctl", "reset-failed", UNIT_NAME]):
        try:
            run_command(argv)
        except HostChangeError as exc:  # the unit is removed all the same; systemd may list it failed
            say(f"boot plan {plan.id}: {_one_line(exc)}; systemd may report {UNIT_NAME} failed")


def status_text(plan: Plan) -> str:
    made = sum(r.state == "made" for r in plan.runs)
    failed = [r for r in plan.runs if r.state == "failed"]
    left = sum(r.state == "planned" for r in plan.runs)
    current = plan.current()
    cut = 1 if current and plan.state != "running" else 0
    lines = [
        f"plan {plan.id} ({plan.mode}), {plan.state}: {made} made, {len(failed)} failed, "
        + (f"{cut} cut short, " if cut else "")
        + f"{left} left of {len(plan.runs)}; bundle {plan.bundle}",
        f"original: {plan.original['release']} '{plan.original['cmdline']}'",
    ]
    if current and plan.state == "running":
        lines.append(
            f"now: run {current.name} ({current.condition}) {current.state}: kernel {current.kernel}, "
            f"command line '{current.cmdline}'"
        )
    elif current:  # the plan ended while this run's boot was under way: it was never made
        lines.append(
            f"not made: run {current.name} ({current.condition}) was {current.state} when the plan "
            f"{plan.state} (command line '{current.cmdline}')"
        )
    lines += [f"failed: {r.name} ({r.condition}): {r.why}" for r in failed]
    if plan.ended_because:
        lines.append(f"ended: {plan.ended_because}")
    if plan.state == "running":
        lines.append(
            "next: "
            + (
                "the unit resumes after the boot; 'ticklab plan abort' ends the plan"
                if current
                else "'ticklab plan resume' boots the next run"
            )
        )
    return "\n".join(lines)


def record_boot_only(run: BootRun, boot: dict) -> dict:
    """The ``make_run`` of ``ticklab plan resume`` until the capture session is wired in: the boot it verified."""
    return {
        "run": run.name,
        "condition": run.condition,
        "boot_id": boot["boot_id"],
        "release": boot["release"],
        "cmdline": boot["cmdline"],
    }


def command(
    args: argparse.Namespace, maker_for: Callable[[Plan, Path], RunMaker | None] = lambda plan, root: None
) -> int:
    """``ticklab plan list|status|resume|abort``; ``maker_for(plan, root)`` gives the capture's :class:`RunMaker`
    (None: a plan made without a capture, whose runs record the boot only). Without ``--id`` a command acts on
    :func:`default_plan`; ``list`` and ``status`` with no plan on the host say so and exit 0."""
    root = Path(args.root)
    try:
        if args.plan_command == "list":
            print("\n".join(list_lines(root)))
            return 0
        plan_id = getattr(args, "plan_id", None) or default_plan(root)
        if args.plan_command == "status":
            print(status_text(load(root, plan_id)))
        elif args.plan_command == "resume":
            resume(plan_id, maker_for(load(root, plan_id), root) or record_boot_only, root=root)
        else:
            plan = load(root, plan_id)
            try:
                maker = maker_for(plan, root)
            except Exception as exc:  # an abort puts the host back even when the capture side cannot be set up
                print(f"ticklab plan abort: the bundle will not be sealed ({_one_line(exc)})", file=sys.stderr)
                maker = None
            abort(plan_id, root=root, maker=maker)
    except NoPlan as exc:
        if args.plan_command in ("list", "status"):
            print(exc)
            return 0
        print(f"ticklab plan {args.plan_command}: {exc}", file=sys.stderr)
        return 2
    except (PlanError, HostChangeError) as exc:
        print(f"ticklab plan {args.plan_command}: {exc}", file=sys.stderr)
        return 2
    return 0
