"""Every privileged write ticklab makes goes through here, and is put back.

``HostChanges`` is a context manager. Before it changes anything it appends what it is about to
change, with the value it had, to a journal file (written atomically). It restores every change in
reverse order when the block ends: normally, on an exception, on SIGINT, or on SIGTERM/SIGHUP
(turned into :class:`Interrupted`). If the process is killed outright (SIGKILL, power cut), the
journal remains; the next ``HostChanges`` on the same journal finds that its owner is gone and
restores what it lists before doing anything else. The processes a capture starts are journalled too (kind
``process``: pid and start time), so that this recovery kills a workload a SIGKILLed capture left running.

With ``dry_run`` nothing is written: each write is printed with the value it would replace.

Paths are relative to ``root`` so tests can run every knob against a fake sysfs tree.

Root trusts only files only root can have written: the journal lives in a directory ticklab creates
with mode 0700 (/run/ticklab as root; see :func:`private_dir`), recovery refuses a journal whose
directory or file another user could have written, and restores only knobs under the host's /sys or
/proc/sys. One privileged capture at a time: :class:`HostLock` holds ``<root>/run/ticklab/host.lock``
(flock) for as long as a ``HostChanges`` block is open, and a second one fails naming the holder.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from ..safefiles import OwnedDir, UnsafeFileError, kind_of, read_bytes, read_text, shown
from ..schemas import problem as schema_problem
from . import facts

JOURNAL_NAME = "host-changes.json"
MAX_JOURNAL_BYTES = 64 << 20  # a task_affinity entry takes ~50 bytes per thread moved: 100k threads fit
CATCH = (signal.SIGTERM, signal.SIGHUP)


class HostChangeError(RuntimeError):
    """A knob could not be read, written or restored; the message names the file."""


class HostBusy(HostChangeError):
    """Another ticklab process holds the host (:class:`HostLock`): nothing was touched."""

    def __init__(self, message: str, holder: str = ""):
        super().__init__(message)
        self.holder = holder  # what the lock file says of its holder: "pid N (command) since T"


class Interrupted(KeyboardInterrupt):
    """SIGTERM or SIGHUP arrived; raised so that every ``finally`` and ``with`` block unwinds."""

    def __init__(self, signum: int):
        super().__init__(f"received {signal.Signals(signum).name}")
        self.signum = signum


@contextlib.contextmanager
def interrupting_signals():
    """While inside, SIGTERM and SIGHUP raise :class:`Interrupted` (main thread only; elsewhere a no-op)."""

    def raise_interrupted(signum, _frame):
        raise Interrupted(signum)

    previous = {}
    try:
        for signum in CATCH:
            previous[signum] = signal.signal(signum, raise_interrupted)
    except ValueError:  # not the main thread: the caller must restore explicitly
        pass
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


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


def _open_private(path: Path, flags: int) -> int:
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
        fd = _open_private(self.path, os.O_RDWR | os.O_CREAT)
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


def _process_start(pid: int) -> str | None:
    """Field 22 of /proc/<pid>/stat: with the pid, it identifies a process across pid reuse."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return facts.stat_fields(stat)[19]


def _feature_token(features_text: str, feature: str) -> str | None:
    for token in features_text.split():
        if token in (feature, f"NO_{feature}"):
            return token
    return None


def format_cpu_mask(mask: int) -> str:
    """A CPU bitmask as the kernel writes it: hex in 32-bit groups separated by commas (1 -> '1')."""
    text = f"{mask:x}"
    groups = [text[max(0, i - 8) : i] for i in range(len(text), 0, -8)]
    return ",".join(reversed(groups))


def restorable(path: Path, text: str) -> str:
    """The value to write back for a file whose read form differs from its write form."""
    if path.name == "trace_clock":
        found = re.search(r"\[([^\]]+)\]", text)
        return found.group(1) if found else text
    if path.name == "set_ftrace_filter" and text.startswith("#### all functions enabled"):
        return ""  # opening the file for writing empties the filter: all functions again
    if path.name == "buffer_size_kb":
        found = re.search(r"expanded: (\d+)", text) or re.match(r"\s*(\d+)", text)
        return found.group(1) if found else text
    return text


MAX_PLAN_FILE_BYTES = 1 << 20


def read_plan_file(path: Path) -> str | None:
    """A file a boot plan replaces (grub's custom.cfg) as it is, or None when there is none: never through a link,
    never a FIFO or device, bounded (:mod:`ticklab.safefiles`); HostChangeError naming it otherwise."""
    if not os.path.lexists(path):
        return None
    try:
        return read_text(path, MAX_PLAN_FILE_BYTES)
    except UnsafeFileError as exc:
        raise HostChangeError(f"{exc}; a boot plan replaces only a regular file") from None


def _write_plan_file(path: Path, text: str, mode: int = 0o644) -> None:
    """Replace a file a boot plan writes (its unit, grub's custom.cfg) whole, atomically, never through a link."""
    try:
        with OwnedDir(path.parent) as directory:
            directory.write_atomic(path.name, text.encode(), mode=mode)
    except UnsafeFileError as exc:
        raise HostChangeError(str(exc)) from None


def _read(path: Path) -> str:
    try:
        return path.read_text().rstrip("\n")
    except OSError as exc:
        raise HostChangeError(f"{path}: cannot read ({exc.strerror or exc})") from exc


def _write(path: Path, value: str) -> None:
    try:
        with path.open("w") as handle:
            handle.write(value)
    except OSError as exc:
        raise HostChangeError(f"{path}: cannot write {value!r} ({exc.strerror or exc})") from exc


def _run(argv: list[str]) -> None:
    try:
        result = subprocess.run(argv, capture_output=True, text=True, check=False)
    except OSError as exc:  # the tool is missing: nothing was changed
        raise HostChangeError(f"{argv[0]}: cannot run ({exc.strerror or exc})") from None
    if result.returncode != 0:
        raise HostChangeError(
            f"{' '.join(argv)}: exit {result.returncode}: {' '.join((result.stderr or result.stdout).split())[:300]}"
        )


def _ticks_since_boot() -> int:
    """Now, in the unit of a task's start time (/proc/<pid>/stat field 22: clock ticks since boot)."""
    return int(float(Path("/proc/uptime").read_text().split()[0]) * os.sysconf("SC_CLK_TCK"))


def _set_affinity(tid: int, cpus: set[int]) -> str | None:
    """sched_setaffinity, or why not: None when done or when the task is gone or the kernel owns its CPUs."""
    try:
        os.sched_setaffinity(tid, cpus)
    except (ProcessLookupError, PermissionError):
        return None  # gone since, or no longer ours to set
    except OSError as exc:
        if exc.errno == errno.EINVAL:  # the kernel sets its CPUs (an exiting or bound thread), or cpuset changed
            return None
        return f"task {tid}: {exc.strerror or exc}"
    return None


def _undo_task_affinity(change: Change) -> str:
    """Give the moved tasks their CPU lists back (only those still as we left them: a list someone changed during the
    run is theirs), and give the CPU back to tasks started during the run whose list is a moved list without it
    (they inherited it from a moved parent). Nothing is done for tasks of another boot."""
    if change.boot_id and change.boot_id != facts.boot_id():
        return "another boot: no task of the journal exists any more"
    errors = []
    narrowed = set()
    for tid, (start, cpus) in (change.tasks or {}).items():
        before = set(facts.parse_cpu_list(cpus))
        narrowed.add(frozenset(before - {change.cpu}) if change.cpu is not None else frozenset())
        if _process_start(int(tid)) != start:
            continue  # gone (or its pid reused by another task): nothing of ours to put back
        try:
            now = os.sched_getaffinity(int(tid))
        except OSError:
            continue
        if change.cpu is not None and now != before - {change.cpu}:
            continue  # changed during the run by someone else: left as they set it
        failed = _set_affinity(int(tid), before)
        if failed:
            errors.append(failed)
    if change.moved_at is not None and change.cpu is not None:
        for task in Path("/proc").glob("[0-9]*/task/[0-9]*"):
            start = _process_start(int(task.name))
            if start is None or int(start) < change.moved_at:
                continue
            try:
                now = os.sched_getaffinity(int(task.name))
            except OSError:
                continue
            if frozenset(now) in narrowed:
                failed = _set_affinity(int(task.name), now | {change.cpu})
                if failed:
                    errors.append(failed)
    if errors:
        raise HostChangeError("; ".join(errors[:5]) + (f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""))
    return change.before


def _session_members(sid: int) -> list[tuple[int, str]]:
    """(pid, start time) of every live process whose session id is ``sid`` (/proc/<pid>/stat field 6)."""
    members = []
    for entry in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = facts.stat_fields(entry.read_text())
        except OSError:
            continue  # gone meanwhile
        if len(fields) > 19 and fields[3] == str(sid) and fields[0] not in ("Z", "X"):  # a zombie has ended already
            members.append((int(entry.parent.name), fields[19]))
    return members


def _undo_process(change: Change) -> str:
    """Kill what is left of a process ticklab started (a capture killed outright leaves its workload running): the
    process itself if its pid still has the recorded start time, and every process of the session it led (it was
    started with a session of its own; its children do not inherit the parent-death signal). A pid another
    process has since (start time differs) is never signalled; nor is anything of another boot."""
    if change.boot_id and change.boot_id != facts.boot_id():
        return "another boot: the process is gone"
    now = _process_start(change.pid)
    if now is not None and now != change.started:
        return "gone (its pid belongs to another process now)"
    killed = 0
    # while any process of session <pid> lives, the kernel gives that number to no new process: they are ours
    for pid, start in _session_members(change.pid):
        if int(start) < int(change.started) or _process_start(pid) != start:
            continue
        try:
            os.kill(pid, signal.SIGKILL)
            killed += 1
        except ProcessLookupError:
            continue
    return f"killed {killed} process(es)" if killed else "exited"


def _undo(change: Change) -> str | None:
    """Put one change back; returns the value read afterwards."""
    if change.kind == "process":
        return _undo_process(change)
    path = Path(change.path)
    if change.kind == "write":
        if change.refused:
            return change.before  # the kernel refused the write: nothing changed
        if not path.exists() and path.parent.parent.name == "irq":
            return "gone"  # the interrupt was freed meanwhile (driver unbound, vectors resized): nothing to put back
        if restorable(path, _read(path)) != change.before:
            _write(path, change.before)
        return restorable(path, _read(path))
    if change.kind == "sched_feature":
        _write(path, change.before)
        return _feature_token(_read(path), change.feature)
    if change.kind == "task_affinity":
        return _undo_task_affinity(change)
    if change.kind == "mkdir":
        if path.exists():
            path.rmdir()
        return "absent"
    if change.kind == "file":
        if change.before is None:
            if path.is_file() and not path.is_symlink():
                path.unlink()
            return "absent"
        _write_plan_file(path, change.before)
        return "restored"
    if change.kind == "symlink":
        if path.is_symlink():
            path.unlink()
        return "absent"
    if change.kind in ("grub_oneshot", "kexec_load") and change.refused:
        return "not done"  # the command failed: nothing to undo
    if change.kind == "grub_oneshot":
        _run(["grub-editenv", str(path), "unset", "next_entry"])
        return "unset"
    if change.kind == "kexec_load":
        _run(["kexec", "-u"])
        return "unloaded"
    if change.kind == "mount":
        if str(path) in facts.mounts(Path("/")):  # already gone (unmounted by hand): nothing to undo
            _run(["umount", str(path)])
        return "unmounted"
    raise HostChangeError(f"{path}: unknown change kind {change.kind!r} in journal")


class HostChanges:
    def __init__(
        self,
        journal: Path | str | None = None,
        *,
        root: Path | str = "/",
        dry_run: bool = False,
        log: Callable[[str], None] = print,
        keep: bool = False,
    ):
        """``keep``: the changes outlive this process (a boot plan's unit and grub one-shot survive reboots):
        entering adopts the changes the journal lists instead of restoring them, leaving saves the journal and
        restores nothing; :meth:`restore` (the plan's end or abort) puts everything back."""
        self.keep = keep
        self.journal = Path(journal) if journal else default_journal()
        self.root = Path(root)
        self.dry_run = dry_run
        self.log = log
        self.changes: list[Change] = []
        self.recovered: list[Change] = []
        self._active = False

    # -- lifecycle -------------------------------------------------------------------------------
    def __enter__(self) -> HostChanges:
        if not self.dry_run:
            self._lock = host_lock(self.root, self.journal).acquire()
            try:
                private_dir(self.journal.parent)
                if self.keep:
                    self.changes = read_journal(self.journal, root=self.root)
                else:
                    self.recovered = recover(self.journal, root=self.root, log=self.log)
                self._save_journal()
            except BaseException:
                self._lock.release()
                raise
        self._signals = interrupting_signals()
        self._signals.__enter__()
        self._active = True
        return self

    def __exit__(self, *exc_info) -> None:
        try:
            if self.keep and not self.dry_run:
                if any(c.after is None for c in self.changes):
                    self._save_journal()
                else:
                    self.journal.unlink(missing_ok=True)
            else:
                self.restore()
        finally:
            self._signals.__exit__(None, None, None)
            self._active = False
            if getattr(self, "_lock", None) is not None:
                self._lock.release()

    def _save_journal(self) -> None:
        data = {
            "pid": os.getpid(),
            "pid_start": _process_start(os.getpid()),
            "boot_id": facts.boot_id(),
            "root": str(self.root),
            "changes": [c.record_full() for c in self.changes if not c.dry_run and c.after is None],
        }
        _write_journal(self.journal, data)

    def _begin(self, change: Change) -> bool:
        """Journal a change before making it; in dry-run print it instead. True if it should be made."""
        if not self._active:
            raise HostChangeError("host changes are made only inside 'with HostChanges(...)'")
        self.changes.append(change)
        if self.dry_run:
            change.dry_run = True
            shown = {
                "write": f"write {change.wanted!r} to {change.path} (now {change.before!r})"
                if change.wanted is not None
                else f"let another tool change {change.path} (now {change.before!r}) and put it back",
                "sched_feature": f"write {change.wanted!r} to {change.path} (now {change.before!r})",
                "mkdir": f"mkdir {change.path}",
                "mount": f"mount -t {change.wanted} {change.wanted} {change.path}",
                "task_affinity": f"move {change.before} {change.wanted} (sched_setaffinity)",
            }
            shown.update(
                {
                    "file": f"write {change.path} ({'new' if change.before is None else 'replacing its content'})",
                    "symlink": f"symlink {change.path} -> {change.wanted}",
                    "grub_oneshot": f"grub-reboot {change.wanted!r} (one boot)",
                    "kexec_load": f"kexec -l {change.wanted}",
                    "process": f"start {change.label} (killed if left running)",
                }
            )
            self.log(f"dry-run: would {shown[change.kind]}")
            return False
        self._save_journal()
        return True

    # -- processes ---------------------------------------------------------------------------------
    def record_process(self, pid: int, *, label: str) -> Change:
        """Journal a process just started (in a session of its own: a workload, its server, an extra) by pid and
        start time, so that recovery after a SIGKILL of this process kills what it left running; undoing it when
        the run ends kills what is left of its session (nothing, when it ended as it should)."""
        change = Change(
            "process",
            str(self.root / "proc"),
            None,
            None,
            label=label,
            pid=int(pid),
            started=_process_start(pid),
            boot_id=facts.boot_id(),
        )
        if change.started is None:  # ended already (and not yet reaped it would still have a start time)
            change.started = str(_ticks_since_boot())
        if self._begin(change):
            change.during = "running"
        return change

    # -- knobs -----------------------------------------------------------------------------------
    def write(self, relative: str, value: str, *, label: str | None = None, may_refuse: bool = False) -> Change:
        """Write ``value``; with ``may_refuse`` a write the kernel refuses is recorded as refused (nothing changed)
        instead of raised."""
        path = self.root / relative
        change = Change("write", str(path), restorable(path, _read(path)), str(value), label=label)
        if self._begin(change):
            try:
                _write(path, str(value))
            except HostChangeError as exc:
                if not may_refuse:
                    raise
                change.refused, change.error = True, str(exc).split(f"{path}: ", 1)[-1]
            change.during = _read(path)
        return change

    def move_tasks_off(
        self, cpu: int, *, label: str = "tasks moved off the measured CPU", only: set[int] | None = None
    ) -> Change:
        """Take ``cpu`` out of the CPU list of every task (every thread of every process) that may run there, so that
        only what starts afterwards and asks for it (the pinned workload) runs there; tasks the kernel keeps on
        their CPU (per-CPU kernel threads) stay. One journal entry holds every task moved with its CPU list."""
        tasks = {}
        # affinities are the running kernel's: under a fake root (tests) no task of the real system is touched
        listed = sorted(Path("/proc").glob("[0-9]*/task/[0-9]*")) if self.root.resolve() == Path("/") else []
        for task in listed:
            tid = int(task.name)
            if only is not None and tid not in only:
                continue
            try:
                allowed = os.sched_getaffinity(tid)
            except OSError:
                continue  # gone, or not a task of this root's system (a fake root in tests)
            start = _process_start(tid)
            if cpu in allowed and len(allowed) > 1 and start is not None:
                tasks[str(tid)] = [start, facts.format_cpu_list(allowed)]
        change = Change(
            "task_affinity",
            str(self.root / "proc"),
            f"{len(tasks)} tasks",
            f"without cpu {cpu}",
            label=label,
            tasks=tasks,
            cpu=cpu,
            boot_id=facts.boot_id(),
            moved_at=_ticks_since_boot() if listed else None,
        )
        if self._begin(change):
            moved = {}
            for tid, entry in tasks.items():
                try:
                    os.sched_setaffinity(int(tid), set(facts.parse_cpu_list(entry[1])) - {cpu})
                    moved[tid] = entry
                except OSError:  # EINVAL: a kernel thread whose CPUs only the kernel sets; ESRCH: gone since
                    continue
            change.tasks = moved  # journalled before with every candidate; now only what has to be put back
            change.before = f"{len(moved)} tasks"
            change.during = f"{len(moved)} moved, {len(tasks) - len(moved)} kept by the kernel or gone"
            self._save_journal()
        return change

    def isolate_cpu(self, cpu: int) -> list[Change]:
        """Leave ``cpu`` to the measured workload, as FTQ's author ran it: every interrupt whose affinity allows
        another CPU is moved off it (and the default affinity of new interrupts), then every other task."""
        changes = []
        default = self.root / "proc/irq/default_smp_affinity"
        if default.is_file():
            try:
                mask = int(_read(default).replace(",", ""), 16)
            except ValueError:
                mask = 0  # not a CPU mask: left alone
            if mask & (1 << cpu) and mask & ~(1 << cpu):
                changes.append(
                    self.write(
                        str(default.relative_to(self.root)),
                        format_cpu_mask(mask & ~(1 << cpu)),
                        label="default IRQ affinity",
                        may_refuse=True,
                    )
                )
        for listed in sorted(self.root.glob("proc/irq/[0-9]*/smp_affinity_list"), key=lambda p: int(p.parent.name)):
            try:
                allowed = set(facts.parse_cpu_list(_read(listed)))
            except (ValueError, HostChangeError):
                continue  # unreadable or not a CPU list: left alone
            if cpu in allowed and len(allowed) > 1:
                changes.append(
                    self.write(
                        str(listed.relative_to(self.root)),
                        facts.format_cpu_list(allowed - {cpu}),
                        label=f"IRQ {listed.parent.name} affinity",
                        may_refuse=True,
                    )
                )
        changes.append(self.move_tasks_off(cpu))
        return changes

    def set_clocksource(self, name: str) -> Change:
        available = facts.clocksources(self.root)["available"]
        if name not in available:
            raise HostChangeError(
                f"{self.root / facts.CLOCKSOURCE_DIR / 'available_clocksource'}: "
                f"{name!r} is not available (have: {' '.join(available) or 'none'})"
            )
        change = self.write(f"{facts.CLOCKSOURCE_DIR}/current_clocksource", name, label="clocksource")
        if not self.dry_run and change.during != name:
            raise HostChangeError(f"{change.path}: wrote {name!r} but the kernel kept {change.during!r}")
        return change

    def set_sched_feature(self, feature: str, enabled: bool) -> Change:
        path = facts.sched_features_path(self.root)
        if path is None:
            raise HostChangeError(f"{self.root / facts.SCHED_FEATURES[0]}: missing (is debugfs mounted?)")
        before = _feature_token(_read(path), feature)
        if before is None:
            raise HostChangeError(f"{path}: this kernel has no sched feature {feature}")
        wanted = feature if enabled else f"NO_{feature}"
        change = Change("sched_feature", str(path), before, wanted, feature=feature, label=f"sched_feature {feature}")
        if self._begin(change):
            _write(path, wanted)
            change.during = _feature_token(_read(path), feature)
        return change

    def set_cpuidle_state(self, state: str, disabled: bool, cpus: list[int] | None = None) -> list[Change]:
        """Disable (or enable) one cpuidle state, named like 'C1' or 'state2', on every online CPU."""
        cpus = facts.online_cpus(self.root) if cpus is None else cpus
        changes = []
        for cpu in cpus:
            directory = self.root / facts.CPU_DIR / f"cpu{cpu}" / "cpuidle"
            match = [
                d for d in directory.glob("state[0-9]*") if d.name == state or facts.read_text(d / "name") == state
            ]
            if not match:
                raise HostChangeError(f"{directory}: no cpuidle state {state!r}")
            relative = str((match[0] / "disable").relative_to(self.root))
            changes.append(self.write(relative, "1" if disabled else "0", label=f"cpuidle {state} cpu{cpu}"))
        return changes

    def guard(self, relative: str, *, label: str | None = None) -> Change:
        """Record a file another tool (trace-cmd) will change, so that it is put back afterwards."""
        path = self.root / relative
        change = Change("write", str(path), restorable(path, _read(path)), None, label=label or "guarded")
        if self._begin(change):
            change.during = change.before
        return change

    def adopt_mount(self, path: str, fstype: str, *, label: str) -> Change:
        """A mount another tool made (trace-cmd mounts debugfs): recorded so that restoring unmounts it."""
        change = Change("mount", path, "unmounted", fstype, during="mounted", label=label)
        if self._begin(change):
            self._save_journal()
        return change

    @contextlib.contextmanager
    def watching_mounts(self, label: str):
        """Run another tool inside this block; whatever it mounts is unmounted when we restore."""
        before = facts.mounts(self.root)
        try:
            yield
        finally:
            ours = {c.path for c in self.changes if c.kind == "mount" and c.after is None}
            for point, fstype in facts.mounts(self.root).items():
                if point not in before and point not in ours:
                    self.adopt_mount(point, fstype, label=f"mounted by {label} ({fstype})")

    def make_dir(self, relative: str, *, label: str | None = None) -> Change:
        """Create a directory the kernel backs (a tracefs instance); restoring removes it."""
        path = self.root / relative
        if path.exists():
            raise HostChangeError(f"{path}: exists already; another capture may be using it")
        change = Change("mkdir", str(path), "absent", "present", label=label)
        if self._begin(change):
            try:
                path.mkdir()
            except OSError as exc:
                raise HostChangeError(f"{path}: cannot create ({exc.strerror})") from exc
            change.during = "present"
        return change

    def mount(self, fstype: str, relative: str) -> Change:
        path = self.root / relative
        change = Change("mount", str(path), "unmounted", fstype, label=f"mount {fstype}")
        if self._begin(change):
            _run(["mount", "-t", fstype, fstype, str(path)])
            change.during = "mounted"
        return change

    # -- boot plans (kept across reboots, see ``keep``) -------------------------------------------------
    def write_file(self, relative: str, text: str, *, label: str, mode: int = 0o644) -> Change:
        """Create (or replace, keeping the old content to put back) a file only a boot plan writes."""
        path = self.root / relative
        before = read_plan_file(path)
        change = Change("file", str(path), before, text, label=label)
        if self._begin(change):
            _write_plan_file(path, text, mode)
            change.during = "written"
        return change

    def symlink(self, relative: str, target: str, *, label: str) -> Change:
        path = self.root / relative
        if os.path.lexists(path):
            raise HostChangeError(f"{path}: exists already; another boot plan may be installed")
        change = Change("symlink", str(path), None, target, label=label)
        if self._begin(change):
            path.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(target, path)
            change.during = "present"
        return change

    def grub_reboot(self, entry: str, *, label: str = "grub one-shot boot entry") -> Change:
        """``grub-reboot ENTRY``: the next boot only; the default entry stays (undone by unsetting next_entry)."""
        grubenv = self.root / "boot/grub/grubenv"
        change = Change("grub_oneshot", str(grubenv), None, entry, label=label)
        if self._begin(change):
            self._run_recorded(
                change,
                ["grub-reboot"]
                + ([f"--boot-directory={self.root / 'boot'}"] if str(self.root) != "/" else [])
                + [entry],
            )
            change.during = "set"
        return change

    def _run_recorded(self, change: Change, argv: list[str]) -> None:
        """Run a state-changing command journalled as ``change``; if it fails, nothing changed (recorded as refused)."""
        try:
            _run(argv)
        except HostChangeError as exc:
            change.refused, change.error = True, str(exc)
            self._save_journal()
            raise

    def kexec_load(self, image: str, initrd: str | None, cmdline: str, *, label: str = "kexec kernel loaded") -> Change:
        """``kexec -l``: the kernel the next ``kexec -e`` (or ``systemctl kexec``) boots (undone by ``kexec -u``)."""
        argv = ["kexec", "-l", image] + (["--initrd", initrd] if initrd else []) + ["--append", cmdline]
        change = Change("kexec_load", str(self.root / "sys/kernel/kexec_loaded"), None, " ".join(argv[2:]), label=label)
        if self._begin(change):
            self._run_recorded(change, argv)
            change.during = "loaded"
        return change

    # -- restore ---------------------------------------------------------------------------------
    def scope(self) -> Scope:
        """Changes made from now until the scope closes are undone then (e.g. one run's condition)."""
        return Scope(self)

    def undo(self, changes: list[Change]) -> None:
        pending = [c for c in changes if not c.dry_run and c.after is None]
        if not pending:
            return
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, *CATCH})
        try:
            failures = _undo_all(pending, self.log)
            self._save_journal()
            if failures:
                raise HostChangeError("could not restore: " + "; ".join(f"{c.path}: {c.error}" for c in failures))
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)

    def restore(self) -> None:
        """Undo every change, newest first; signals wait until this is done."""
        try:
            self.undo(self.changes)
        except HostChangeError as exc:
            raise HostChangeError(f"{exc} (still listed in {self.journal})") from exc
        if not self.dry_run:
            self.journal.unlink(missing_ok=True)

    def records(self) -> list[dict]:
        """What changed, for the manifest: before, during and after each knob (processes started are not knobs)."""
        return knob_records(self.changes)


class Scope:
    """A span of a HostChanges: ``with host.scope() as scope`` (or ``close()``) undoes what was changed in it."""

    def __init__(self, host: HostChanges):
        self.host, self.mark = host, len(host.changes)

    @property
    def changes(self) -> list[Change]:
        return self.host.changes[self.mark :]

    def records(self) -> list[dict]:
        """The knobs changed in this scope, for the manifest (as :meth:`HostChanges.records`)."""
        return knob_records(self.changes)

    def close(self) -> None:
        self.host.undo(self.changes)

    def __enter__(self) -> Scope:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def knob_records(changes: list[Change]) -> list[dict]:
    return [c.record() for c in changes if c.kind != "process"]


def _undo_all(changes: list[Change], log: Callable[[str], None]) -> list[Change]:
    failures = []
    for change in reversed(changes):
        try:
            change.after = _undo(change)
        except (HostChangeError, OSError, ValueError) as exc:
            change.error = str(exc)
            failures.append(change)
            log(f"{change.path}: could not restore {change.before!r}: {exc}")
    return failures


KNOB_TREES = ("sys", "proc/sys", "proc/irq")
# The files a boot plan may create: its systemd unit, the link that enables it, and grub's custom.cfg entry.
PLAN_FILES = {
    "file": ("etc/systemd/system/ticklab-plan.service", "boot/grub/custom.cfg"),
    "symlink": ("etc/systemd/system/multi-user.target.wants/ticklab-plan.service",),
    "grub_oneshot": ("boot/grub/grubenv",),
    "kexec_load": ("sys/kernel/kexec_loaded",),
}


def _confined(change: Change, root: Path) -> bool:
    """A journal entry names a kernel knob of this host (under <root>/sys, <root>/proc/sys or <root>/proc/irq), or
    is the task affinities it moved (their CPU lists, restored with sched_setaffinity), or a process it started (pid
    and start time: killed if left running), nothing else."""
    if change.kind == "process":
        return (
            change.path == str(root / "proc")
            and type(change.pid) is int
            and change.pid > 1
            and isinstance(change.started, str)
            and change.started.isdigit()
        )
    if change.kind == "task_affinity":
        return (
            change.path == str(root / "proc")
            and isinstance(change.tasks, dict)
            and all(
                str(tid).isdigit()
                and isinstance(entry, list)
                and len(entry) == 2
                and isinstance(entry[1], str)
                and re.fullmatch(r"\d+(-\d+)?(,\d+(-\d+)?)*", entry[1])
                for tid, entry in change.tasks.items()
            )
        )
    path = os.path.normpath(change.path)
    if change.kind in PLAN_FILES:
        return path == change.path and path in {str(root / p) for p in PLAN_FILES[change.kind]}
    return (
        change.kind != "task_affinity"
        and path == change.path
        and any(path.startswith(str(root / tree) + os.sep) for tree in KNOB_TREES)
    )


def _write_journal(journal: Path, data: dict) -> None:
    """Atomically, private to us, synced: a kill at any instant leaves the old journal or the new one."""
    temporary = journal.with_name(journal.name + ".tmp")
    temporary.unlink(missing_ok=True)
    with os.fdopen(_open_private(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL), "w") as handle:
        json.dump(data, handle, separators=(",", ":"))  # compact: one entry lists every task moved
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, journal)


def read_journal(journal: Path, *, root: Path | str = "/") -> list[Change]:
    """The changes a journal lists (a boot plan's, adopted by a later process), checked as :func:`recover` checks."""
    journal, root = Path(journal), Path(root)
    if not os.path.lexists(journal):
        return []
    return _checked_journal(journal, root)[1]


_TEXT_OR_NULL = {"type": ["string", "null"]}  # the journal's size is bounded (MAX_JOURNAL_BYTES), not each text
JOURNAL_SCHEMA = {
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
                    "kind": {
                        "enum": [
                            "write",
                            "sched_feature",
                            "task_affinity",
                            "mkdir",
                            "mount",
                            "file",
                            "symlink",
                            "grub_oneshot",
                            "kexec_load",
                            "process",
                        ]
                    },
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


def _checked_journal(journal: Path, root: Path) -> tuple[dict, list[Change]]:
    private_dir(journal.parent)
    raw = read_private(journal, MAX_JOURNAL_BYTES)
    try:
        data = json.loads(raw)
        problem = schema_problem(data, JOURNAL_SCHEMA)
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
    outside = [c.path for c in changes if not _confined(c, root)]
    if outside:
        raise HostChangeError(
            f"{journal}: names {outside[0]!r}, not a knob under {root / 'sys'}, "
            f"{root / 'proc/sys'} or {root / 'proc/irq'}; refused (check it by hand, then delete it)"
        )
    return data, changes


# What a reboot puts back by itself: the running kernel's state. (A boot plan's files and grub's one-shot entry
# outlive a reboot; a boot plan's journal is put back by its own engine, never by recover.)
REBOOT_RESETS = frozenset({"write", "sched_feature", "task_affinity", "mkdir", "mount", "process", "kexec_load"})


def journal_boot(data: dict, changes: list[Change]) -> str | None:
    """The boot a journal was written in (its own field, else what its task or process entries say), or None."""
    return data.get("boot_id") or next((c.boot_id for c in changes if c.boot_id), None)


def owner_running(data: dict) -> bool:
    """The process that wrote a journal still runs (its pid has the start time the journal records, in this boot):
    what it lists is its own to put back."""
    pid = data.get("pid")
    return bool(pid and pid != os.getpid() and data.get("pid_start") and _process_start(pid) == data["pid_start"])


def recover(journal: Path, *, root: Path | str = "/", log: Callable[[str], None] = print) -> list[Change]:
    """Restore what a killed capture left changed, as listed in its journal. The journal must sit in a
    private directory (mode 0700, ours) and be our own file; it may only name knobs under /sys or /proc/sys.
    A journal of another boot (a state directory on disk) lists kernel state the reboot reset: none of it is
    written back (the previous boot's interrupt numbers and values mean nothing now)."""
    journal, root = Path(journal), Path(root)
    if not os.path.lexists(journal):
        return []
    data, changes = _checked_journal(journal, root)
    pid = data.get("pid")
    boot = journal_boot(data, changes)
    pending = changes
    if boot and boot != facts.boot_id():
        pending = [c for c in changes if c.kind not in REBOOT_RESETS]
        for change in changes:
            if change.kind in REBOOT_RESETS:
                change.after = "another boot: reset by the reboot"
        log(f"{journal}: written in another boot (pid {pid}); the reboot reset the kernel state it lists")
    elif owner_running(data):
        raise HostChangeError(f"{journal}: held by a running ticklab process (pid {pid}); wait for it or stop it")
    if pending:
        log(f"{journal}: restoring {len(pending)} host change(s) left by an interrupted capture (pid {pid})")
    failures = _undo_all(pending, log)
    if failures:
        # only what is still to be put back stays listed: the rest is not written again at every later start
        _write_journal(journal, {**data, "changes": [c.record_full() for c in failures]})
        raise HostChangeError(
            f"{journal}: could not restore "
            + "; ".join(f"{c.path} ({c.error})" for c in failures)
            + f"; set these by hand, then delete {journal}"
        )
    journal.unlink()
    return changes
