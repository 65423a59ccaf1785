"""The journal of host changes and the host lock: what ``HostChanges`` writes before it changes anything, and
:func:`recover`, the one path that puts back what a killed capture left changed.

A journal lists, for each change, what it was and the value it replaced (:class:`Change`); what a kind of change
means (how it is undone, which paths it may name, whether a reboot resets it) is its :class:`ChangeKind`, registered
in :data:`KINDS` by :mod:`ticklab.host.change_kinds`.

Root trusts only files only root can have written: the journal lives in a directory ticklab creates with mode 0700
(/run/ticklab as root; see :func:`private_dir`), recovery refuses a journal whose directory or file another user
could have written, and restores only knobs under the host's /sys or /proc/sys. One privileged capture at a time:
:class:`HostLock` holds ``<root>/run/ticklab/host.lock`` (flock) for as long as a ``HostChanges`` block is open, and
a second one fails naming the holder.
"""

from __future__ import annotations

import abc
import copy
import fcntl
import functools
import json
import os
import re
import stat
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import ClassVar, TypeVar

from ..safefiles import UnsafeFileError, kind_of, read_bytes, shown
from ..schemas import problem as schema_problem
from . import facts

JOURNAL_NAME = "host-changes.json"
MAX_JOURNAL_BYTES = 64 << 20  # a task_affinity entry takes ~50 bytes per thread moved: 100k threads fit


class HostChangeError(RuntimeError):
    """A knob could not be read, written or restored; the message names the file."""


class HostBusy(HostChangeError):
    """Another ticklab process holds the host (:class:`HostLock`): nothing was touched."""

    def __init__(self, message: str, holder: str = ""):
        super().__init__(message)
        self.holder = holder  # what the lock file says of its holder: "pid N (command) since T"


def state_dir() -> Path:
    """Where the journal lives: $TICKLAB_STATE_DIR, else /run/ticklab as root (gone at reboot, like the
    changes it lists), else the user's runtime directory."""
    state = os.environ.get("TICKLAB_STATE_DIR")
    if state:
        return Path(state)
    if os.geteuid() == 0:
        return Path("/run/ticklab")
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    return Path(runtime) / "ticklab" if runtime else Path.home() / ".cache" / "ticklab-state"


def default_journal() -> Path:
    return state_dir() / JOURNAL_NAME


def _describe_mode(info: os.stat_result) -> str:
    return f"owner uid {info.st_uid}, mode {stat.S_IMODE(info.st_mode):04o}"


def private_dir(path: Path | str) -> Path:
    """A directory only this user can write, made with mode 0700 when missing. An existing one must be a
    real directory (not a symlink) owned by us with no group or other access, and no directory above it
    may be writable by another user unless sticky (as /tmp is): otherwise HostChangeError."""
    path = Path(os.path.abspath(path))
    me = os.geteuid()
    for ancestor in reversed(path.parents):
        try:
            info = os.stat(ancestor)
        except FileNotFoundError:
            break
        if info.st_uid not in (0, me) or (info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX):
            raise HostChangeError(
                f"{ancestor}: another user can replace what is under it ({_describe_mode(info)}); "
                f"ticklab keeps host state only below directories root or you alone can write"
            )
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise HostChangeError(f"{path}: cannot create ({exc.strerror or exc})") from exc
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != me or info.st_mode & 0o077:
        kind = (
            "a symlink"
            if stat.S_ISLNK(info.st_mode)
            else "not a directory"
            if not stat.S_ISDIR(info.st_mode)
            else _describe_mode(info)
        )
        raise HostChangeError(
            f"{path}: must be a directory of uid {me} with mode 0700 ({kind}); "
            "ticklab does not trust host state another user could have written"
        )
    return path


def open_private(path: Path, flags: int) -> int:
    """Open a file in a private directory, never through a symlink; it must be ours and not writable by others."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)  # a FIFO cannot block
    except OSError as exc:
        raise HostChangeError(f"{path}: cannot open ({exc.strerror or exc}; a symlink is refused)") from exc
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise HostChangeError(f"{path}: {kind_of(info.st_mode)}, not a regular file; refused")
    if info.st_uid != os.geteuid() or info.st_mode & 0o022:
        os.close(fd)
        raise HostChangeError(
            f"{path}: not a regular file of uid {os.geteuid()} writable only by it ({_describe_mode(info)}); refused"
        )
    return fd


def read_private(path: Path, limit: int) -> bytes:
    """The whole of a file of ours in a private directory (host state: a journal, a plan), through
    :mod:`ticklab.safefiles`: never through a link, never a FIFO or device, ours and writable only by us, at most
    ``limit`` bytes; HostChangeError naming it otherwise."""
    try:
        return read_bytes(path, limit, owner=os.geteuid())
    except UnsafeFileError as exc:
        raise HostChangeError(str(exc)) from None


def lock_path(root: Path | str) -> Path:
    """The host-wide lock: /run/ticklab/host.lock (under a fake root in tests)."""
    return Path(root) / "run" / "ticklab" / "host.lock"


def host_lock(root: Path | str, journal: Path) -> HostLock:
    """The lock a HostChanges on ``journal`` holds: the host's as root, else one beside the journal."""
    return HostLock(lock_path(root) if os.geteuid() == 0 else private_dir(journal.parent) / "host.lock")


class HostLock:
    """One privileged capture at a time on a host: an flock on a file only root can write, naming its holder."""

    def __init__(self, path: Path | str):
        self.path = Path(path)
        self.fd: int | None = None

    def acquire(self) -> HostLock:
        private_dir(self.path.parent)
        fd = open_private(self.path, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 512, 0).decode(errors="replace").strip() or "a process that has not said who it is"
            os.close(fd)
            raise HostBusy(
                f"{self.path}: the host is held by {holder}; one privileged capture at a time: wait for it or stop it",
                holder,
            ) from None
        command = " ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(sys.argv))[:200]
        since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} ({command or 'python'}) since {since}\n".encode(), 0)
        self.fd = fd
        return self

    def release(self) -> None:
        if self.fd is not None:
            os.ftruncate(self.fd, 0)
            os.close(self.fd)  # closing drops the flock
            self.fd = None


@dataclass
class Change:
    kind: str  # write | sched_feature | mkdir | mount
    path: str  # absolute path of the file, directory or mount point
    before: str | None = None  # value (or state) found before the change
    wanted: str | None = None  # value written (None: another tool writes it; we only put it back)
    during: str | None = None  # read back after writing
    after: str | None = None  # read back after restoring
    feature: str | None = None
    label: str | None = None
    dry_run: bool = False
    error: str | None = None  # why restoring failed (or, with refused, why the kernel refused the write)
    refused: bool = False  # the kernel refused the write (a per-CPU or managed interrupt): nothing changed
    tasks: dict | None = None  # kind task_affinity: {tid: [start time, cpu list before]} of the tasks moved
    moved_at: int | None = None  # kind task_affinity: clock ticks since boot when they were moved (tasks started
    # later inherited the narrowed list from a moved parent and get the CPU back)
    cpu: int | None = None  # kind task_affinity: the CPU taken out
    boot_id: str | None = None  # kinds task_affinity, process: the boot the ids belong to (none survive a reboot)
    pid: int | None = None  # kind process: a process ticklab started (a workload, its server, an extra) ...
    started: str | None = None  # ... and its start time (/proc/<pid>/stat field 22): the two identify it

    def record(self) -> dict:
        record = {k: v for k, v in asdict(self).items() if v is not None and v is not False}
        if self.kind == "task_affinity":  # the manifest gets a count; the journal (record_full) every task
            record["tasks"] = len(self.tasks or {})
        return record

    def record_full(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None and v is not False}


def process_start(pid: int) -> str | None:
    """Field 22 of /proc/<pid>/stat: with the pid, it identifies a process across pid reuse."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return facts.stat_fields(stat)[19]


@dataclass(frozen=True)
class Making:
    """What making a change needs beyond its journal entry: the root it is made under (grub-reboot), whether a knob
    the kernel refuses is recorded instead of raised (write), the mode of a file written (file), the command that
    loads a kernel (kexec_load)."""

    root: Path = Path("/")
    may_refuse: bool = False
    mode: int = 0o644
    argv: tuple[str, ...] = ()


class ChangeKind(abc.ABC):
    """What one kind of journalled change means to the journal: how it is put back, which paths an entry of it may
    name, and whether a reboot resets it. Each kind is defined, with what makes it, in :mod:`.change_kinds`."""

    name: ClassVar[str]
    resets_at_reboot: ClassVar[bool] = True  # the running kernel's state; a boot plan's files outlive a reboot

    # what an entry of this kind may name, relative to the root (issue 55 item 7): each a regular expression the whole
    # path must match; a kind with its own rule overrides ``confined``
    patterns: ClassVar[tuple[str, ...]] = ()

    def confined(self, change: Change, root: Path) -> bool:
        """The entry names only what this kind changes: a path (normalised as written, no '..') that one of its
        ``patterns`` matches below ``root``."""
        return _path_matches(change.path, root, self.patterns)

    def refusal(self, change: Change, root: Path) -> str:
        """Why an entry of this kind is not put back (it names something this kind never changes)."""
        trees = f"{root / 'sys'}, {root / 'proc/sys'} or {root / 'proc/irq'}"
        return f"{change.path!r}, not a knob under {trees} that a {self.name} entry may name"

    @staticmethod
    @abc.abstractmethod
    def apply(change: Change, making: Making) -> None:
        """Make the change (called by ``HostChanges`` once it is journalled), recording what it reads back in
        ``change.during``; ``making`` holds what a kind needs beyond the entry (each kind reads only its own)."""

    @abc.abstractmethod
    def describe(self, change: Change) -> str:
        """What a dry run would do, after 'dry-run: would '."""

    @abc.abstractmethod
    def undo(self, change: Change) -> str | None:
        """Put the change back; returns the value read afterwards."""

    def left_behind(self, change: Change) -> str:
        """The change as it was made, for what ``ticklab doctor`` says a journal left behind lists."""
        return f"{change.kind} {change.path}"


KNOB_TREES = ("sys", "proc/sys", "proc/irq")
# the tracefs files a capture writes or lets trace-cmd change (the top level, or its own instance ticklab-<pid>)
TRACEFS = r"sys/kernel/(?:debug/)?tracing"
TRACEFS_FILES = (
    r"tracing_on|buffer_size_kb|trace_clock|current_tracer|set_ftrace_filter|saved_cmdlines_size|options/record-cmd"
    r"|events/[A-Za-z0-9_]{1,64}/[A-Za-z_][A-Za-z0-9_]{0,127}/enable"
)
KNOB_PATTERNS = (
    r"sys/devices/system/clocksource/clocksource\d+/current_clocksource",
    r"sys/devices/system/cpu/cpu\d+/cpuidle/state\d+/disable",
    r"proc/irq/default_smp_affinity",
    r"proc/irq/\d+/smp_affinity(?:_list)?",
    r"proc/sys/kernel/sched_rt_runtime_us",
    rf"{TRACEFS}(?:/instances/ticklab-\d+)?/(?:{TRACEFS_FILES})",
)


def _path_matches(path: str, root: Path, patterns: tuple[str, ...]) -> bool:
    if not isinstance(path, str) or os.path.normpath(path) != path:
        return False
    prefix = str(root).rstrip(os.sep) + os.sep
    return path.startswith(prefix) and any(re.fullmatch(p, path[len(prefix) :]) for p in patterns)


KINDS: dict[str, ChangeKind] = {}
KindT = TypeVar("KindT", bound=ChangeKind)


def registered(kind: type[KindT]) -> type[KindT]:
    """Class decorator: the journal knows the kind by its name."""
    KINDS[kind.name] = kind()
    return kind


def undo(change: Change) -> str | None:
    """Put one change back; returns the value read afterwards."""
    kind = KINDS.get(change.kind)
    if kind is None:
        raise HostChangeError(f"{change.path}: unknown change kind {change.kind!r} in journal")
    return kind.undo(change)


def undo_all(changes: list[Change], log: Callable[[str], None]) -> list[Change]:
    failures = []
    for change in reversed(changes):
        try:
            change.after = undo(change)
        except (HostChangeError, OSError, ValueError) as exc:
            change.error = str(exc)
            failures.append(change)
            log(f"{change.path}: could not restore {change.before!r}: {exc}")
    return failures


def confined(change: Change, root: Path) -> bool:
    """A journal entry names only what its kind changes (issue 55 item 7): a knob kind the kernel knobs ticklab writes
    (KNOB_PATTERNS, the sched features file, its tracefs instance, tracefs/debugfs mount points), the task affinities
    it moved (their CPU lists, restored with sched_setaffinity), a process it started (pid and start time: killed if
    left running), or a file a boot plan installs, nothing else."""
    kind = KINDS.get(change.kind)
    return kind is not None and kind.confined(change, root)


def refusals(data: dict, changes: list[Change], root: Path, *, boot_plan: bool) -> dict[int, str]:
    """The entries of a journal not put back, by index, each with why: an entry its kind may not name; a boot plan's
    kind in a capture's journal (a boot plan's journal is put back by its own engine); in a capture's journal, a
    process not started by the capture that wrote it (started before it)."""
    refused = {}
    started = data.get("pid_start")
    for index, change in enumerate(changes):
        kind = KINDS[change.kind]
        if not kind.confined(change, root):
            refused[index] = kind.refusal(change, root)
        elif not boot_plan and not kind.resets_at_reboot:
            refused[index] = f"{change.path!r}: a boot plan's {change.kind} entry in a capture's journal"
        elif (
            not boot_plan
            and change.kind == "process"
            and not (isinstance(started, str) and started.isdigit() and int(change.started) >= int(started))
        ):
            refused[index] = (
                f"pid {change.pid}: started before the capture that wrote the journal (start {change.started}, "
                f"capture {started}), so not one it started"
            )
    return refused


def write_journal(journal: Path, data: dict) -> None:
    """Atomically, private to us, synced: a kill at any instant leaves the old journal or the new one."""
    temporary = journal.with_name(journal.name + ".tmp")
    temporary.unlink(missing_ok=True)
    with os.fdopen(open_private(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL), "w") as handle:
        json.dump(data, handle, separators=(",", ":"))  # compact: one entry lists every task moved
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, journal)


def read_journal(journal: Path, *, root: Path | str = "/") -> list[Change]:
    """The changes a journal lists (a boot plan's, adopted by a later process), checked as :func:`recover` checks:
    an entry its kind may not name refuses the whole journal here (the plan's engine acts on all of it)."""
    journal, root = Path(journal), Path(root)
    if not os.path.lexists(journal):
        return []
    data, changes = checked_journal(journal, root)
    refused = refusals(data, changes, root, boot_plan=True)
    if refused:
        raise HostChangeError(
            f"{journal}: names {next(iter(refused.values()))}; refused (check it by hand, then delete it)"
        )
    return changes


_TEXT_OR_NULL = {"type": ["string", "null"]}  # the journal's size is bounded (MAX_JOURNAL_BYTES), not each text
JOURNAL_SCHEMA: dict = {
    "type": "object",
    "required": ["changes"],
    "properties": {
        "pid": {"type": ["integer", "null"], "minimum": 0},
        "pid_start": _TEXT_OR_NULL,
        "boot_id": _TEXT_OR_NULL,
        "root": {"type": "string"},
        "changes": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["kind", "path"],
                "additionalProperties": False,
                "properties": {
                    "kind": {"type": "string"},  # journal_schema(): one of KINDS
                    "path": {"type": "string", "minLength": 1, "maxLength": 4096},
                    **{
                        key: _TEXT_OR_NULL
                        for key in (
                            "before",
                            "wanted",
                            "during",
                            "after",
                            "feature",
                            "label",
                            "error",
                            "boot_id",
                            "started",
                        )
                    },
                    "pid": {"type": ["integer", "null"], "minimum": 0},
                    "dry_run": {"type": "boolean"},
                    "refused": {"type": "boolean"},
                    "tasks": {"type": ["object", "null"]},
                    "moved_at": {"type": ["integer", "null"], "minimum": 0},
                    "cpu": {"type": ["integer", "null"], "minimum": 0, "maximum": 1 << 20},
                },
            },
        },
    },
}


def journal_schema() -> dict:
    """JOURNAL_SCHEMA with ``kind`` one of the registered kinds (change_kinds registers each when host/ is imported):
    the registry is the one list of kinds a journal may name."""
    return _journal_schema(tuple(KINDS))


@functools.cache
def _journal_schema(kinds: tuple[str, ...]) -> dict:
    schema = copy.deepcopy(JOURNAL_SCHEMA)
    schema["properties"]["changes"]["items"]["properties"]["kind"] = {"enum": list(kinds)}
    return schema


def checked_journal(journal: Path, root: Path) -> tuple[dict, list[Change]]:
    private_dir(journal.parent)
    raw = read_private(journal, MAX_JOURNAL_BYTES)
    try:
        data = json.loads(raw)
        problem = schema_problem(data, journal_schema())
        if problem:
            raise ValueError(problem)
        changes = [Change(**entry) for entry in data["changes"]]
        if not all(isinstance(c.path, str) and isinstance(c.kind, str) for c in changes):
            raise TypeError("a change without a path")
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        raise HostChangeError(
            f"{journal}: unreadable journal of host changes ({shown(exc, 300)}); "
            "check the knobs it names by hand, then delete it"
        ) from None
    if str(data.get("root", "/")) != str(root):
        raise HostChangeError(f"{journal}: written for root {data.get('root')!r}, not {str(root)!r}; refused")
    return data, changes


def reset_by_reboot(change: Change) -> bool:
    """What a reboot puts back by itself: the running kernel's state. (A boot plan's files and grub's one-shot entry
    outlive a reboot; a boot plan's journal is put back by its own engine, never by recover.)"""
    return KINDS[change.kind].resets_at_reboot


def journal_boot(data: dict, changes: list[Change]) -> str | None:
    """The boot a journal was written in (its own field, else what its task or process entries say), or None."""
    return data.get("boot_id") or next((c.boot_id for c in changes if c.boot_id), None)


def owner_running(data: dict) -> bool:
    """The process that wrote a journal still runs (its pid has the start time the journal records, in this boot):
    what it lists is its own to put back."""
    pid = data.get("pid")
    return bool(pid and pid != os.getpid() and data.get("pid_start") and process_start(pid) == data["pid_start"])


def recover(journal: Path, *, root: Path | str = "/", log: Callable[[str], None] = print) -> list[Change]:
    """Restore what a killed capture left changed, as listed in its journal. The journal must sit in a
    private directory (mode 0700, ours) and be our own file; it may only name knobs under /sys or /proc/sys.
    A journal of another boot (a state directory on disk) lists kernel state the reboot reset: none of it is
    written back (the previous boot's interrupt numbers and values mean nothing now)."""
    journal, root = Path(journal), Path(root)
    if not os.path.lexists(journal):
        return []
    data, listed = checked_journal(journal, root)
    refused_at = refusals(data, listed, root, boot_plan=False)
    refused = [listed[index] for index in sorted(refused_at)]
    for index in sorted(refused_at):  # each named; every other entry is still put back (issue 55 item 7)
        log(f"{journal}: refused, left as it is: {refused_at[index]}")
        listed[index].error = "refused: " + refused_at[index]
    changes = [change for index, change in enumerate(listed) if index not in refused_at]
    pid = data.get("pid")
    boot = journal_boot(data, changes)
    pending = changes
    if boot and boot != facts.boot_id():
        pending = [c for c in changes if not reset_by_reboot(c)]
        for change in changes:
            if reset_by_reboot(change):
                change.after = "another boot: reset by the reboot"
        log(f"{journal}: written in another boot (pid {pid}); the reboot reset the kernel state it lists")
    elif owner_running(data):
        raise HostChangeError(f"{journal}: held by a running ticklab process (pid {pid}); wait for it or stop it")
    if pending:
        log(f"{journal}: restoring {len(pending)} host change(s) left by an interrupted capture (pid {pid})")
    failures = undo_all(pending, log)
    if failures or refused:
        # only what is still to be put back (or was refused) stays listed: the rest is not written again at every
        # later start
        write_journal(journal, {**data, "changes": [c.record_full() for c in [*refused, *failures]]})
        problems = [f"could not restore {c.path} ({c.error})" for c in failures]
        problems += [f"refused {refused_at[index]}" for index in sorted(refused_at)]
        raise HostChangeError(
            f"{journal}: "
            + "; ".join(problems)
            + (f"; put back the {len(pending) - len(failures)} other change(s)" if pending else "")
            + f"; set these by hand, then delete {journal}"
        )
    journal.unlink()
    return changes
