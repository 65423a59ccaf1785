"""Boot plans' state on disk: a plan (:class:`Plan`) and its runs (:class:`BootRun`), loaded, saved and listed.

A plan lives in ``/var/lib/ticklab/plans/<id>/`` (made 0700 by us; refused if a directory above it is writable by
another user): ``plan.json`` (the runs and their states, rewritten atomically) and ``host-changes.json`` (the
journal of :class:`~ticklab.host.HostChanges` in ``keep`` mode: the systemd unit, its enabling link, grub's
custom.cfg entry, the one-shot ``next_entry``, the loaded kexec kernel; all put back at the end or by ``abort``).

A run's states: ``planned``, ``booting`` (its boot is under way: the plan's own kexec, reboot or manual boot),
``booted`` (its boot verified and its making started), ``made`` or ``failed``. A run ``resume`` finds ``booted`` was
being made when the machine rebooted (a crash, a power loss) or its process was killed: it is recorded failed
("the machine rebooted during the run: ..." naming the boot that came up), never made again in whatever boot came
up, and the plan goes on with the next run.

Without ``--id`` the commands act on the running plan, else the newest (``ticklab plan list`` lists them).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..registry import BOOT_MODES
from ..safefiles import OwnedDir, UnsafeFileError, shown
from ..schemas import problem as schema_problem
from . import facts
from .journal import HostChangeError, open_private, private_dir, read_private

PLANS_DIR = "var/lib/ticklab/plans"
MODES = BOOT_MODES  # registry.py: the CLI's --boot choices are the same list
ADDED_BY_BOOT = ("BOOT_IMAGE=", "initrd=")  # words a boot loader or EFI stub adds to /proc/cmdline on its own
RUN_STATES = ("planned", "booting", "booted", "made", "failed")
PLAN_STATES = ("running", "finished", "failed", "aborted")
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


class PlanError(RuntimeError):
    """One line naming the plan's file and what is wrong."""


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
        "state": {"enum": list(PLAN_STATES)},
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


def boot_facts(root: Path) -> dict:
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
def save(root: Path, plan: Plan) -> None:
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
    if any(r.state not in RUN_STATES for r in plan.runs):  # the mode is PLAN_SCHEMA's: one of the registry's
        raise PlanError(f"{path}: unknown run state; refused")
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
def plan_lock(root: Path, plan_id: str):
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


def kept_name(directory: Path, name: str) -> str:
    if not _ID.fullmatch(name) or name in ("plan.json", "plan.lock", "host-changes.json"):
        raise PlanError(f"{directory}: {name!r} cannot be kept with a plan")
    return name


def kept_file(root: Path | str, plan_id: str, name: str) -> Path:
    """A file kept with the plan (see :func:`create`), checked private to us."""
    directory = plan_dir(root, plan_id)
    path = directory / kept_name(directory, name)
    try:
        os.close(open_private(path, os.O_RDONLY))
    except HostChangeError as exc:
        raise PlanError(str(exc)) from None
    return path


def one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:500] or type(exc).__name__
