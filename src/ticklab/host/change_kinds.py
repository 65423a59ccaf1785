"""Every kind of change ``HostChanges`` journals, each with what makes it and what puts it back.

A kind is a :class:`~ticklab.host.journal.ChangeKind` registered in the journal by its name (the ``kind`` of a
journal entry): :func:`~ticklab.host.journal.recover` undoes an entry through its kind, so a kind without an undo
cannot be journalled. The makers (``apply``) are called by ``HostChanges`` once the change is journalled.
"""

from __future__ import annotations

import errno
import os
import re
import signal
import subprocess
from pathlib import Path
from typing import ClassVar

from ..safefiles import OwnedDir, UnsafeFileError, read_text
from . import facts
from .journal import KNOB_PATTERNS, TRACEFS, Change, ChangeKind, HostChangeError, Making, process_start, registered


def feature_token(features_text: str, feature: str) -> str | None:
    for token in features_text.split():
        if token in (feature, f"NO_{feature}"):
            return token
    return None


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


def write_plan_file(path: Path, text: str, mode: int = 0o644) -> None:
    """Replace a file a boot plan writes (its unit, grub's custom.cfg) whole, atomically, never through a link."""
    try:
        with OwnedDir(path.parent) as directory:
            directory.write_atomic(path.name, text.encode(), mode=mode)
    except UnsafeFileError as exc:
        raise HostChangeError(str(exc)) from None


def read_knob(path: Path) -> str:
    try:
        return path.read_text().rstrip("\n")
    except OSError as exc:
        raise HostChangeError(f"{path}: cannot read ({exc.strerror or exc})") from exc


def write_knob(path: Path, value: str) -> None:
    try:
        with path.open("w") as handle:
            handle.write(value)
    except OSError as exc:
        raise HostChangeError(f"{path}: cannot write {value!r} ({exc.strerror or exc})") from exc


def run_command(argv: list[str]) -> None:
    try:
        result = subprocess.run(argv, capture_output=True, text=True, check=False)
    except OSError as exc:  # the tool is missing: nothing was changed
        raise HostChangeError(f"{argv[0]}: cannot run ({exc.strerror or exc})") from None
    if result.returncode != 0:
        raise HostChangeError(
            f"{' '.join(argv)}: exit {result.returncode}: {' '.join((result.stderr or result.stdout).split())[:300]}"
        )


def ticks_since_boot() -> int:
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


def knob_left_behind(change: Change) -> str:
    """A knob as a change left it: the value written (or that another tool changed it) and the one before."""
    if change.wanted is None:
        return f"{change.path}: changed by another tool, was {change.before!r}"
    return f"{change.path}: {change.wanted!r}, was {change.before!r}"


# -- the running kernel's knobs -----------------------------------------------------------------------------
@registered
class Write(ChangeKind):
    """A knob file written, or guarded (``wanted`` None: another tool writes it, and it is put back all the same)."""

    name = "write"
    patterns = KNOB_PATTERNS

    def describe(self, change: Change) -> str:
        if change.wanted is None:
            return f"let another tool change {change.path} (now {change.before!r}) and put it back"
        return f"write {change.wanted!r} to {change.path} (now {change.before!r})"

    @staticmethod
    def apply(change: Change, making: Making) -> None:
        assert change.wanted is not None  # a guarded file (wanted None) is not written
        path = Path(change.path)
        try:
            write_knob(path, change.wanted)
        except HostChangeError as exc:
            if not making.may_refuse:
                raise
            change.refused, change.error = True, str(exc).split(f"{path}: ", 1)[-1]
        change.during = read_knob(path)

    def left_behind(self, change: Change) -> str:
        return knob_left_behind(change)

    def undo(self, change: Change) -> str | None:
        path = Path(change.path)
        if change.refused:
            return change.before  # the kernel refused the write: nothing changed
        if not path.exists() and path.parent.parent.name == "irq":
            return "gone"  # the interrupt was freed meanwhile (driver unbound, vectors resized): nothing to put back
        if restorable(path, read_knob(path)) != change.before:
            write_knob(path, change.before)
        return restorable(path, read_knob(path))


@registered
class SchedFeature(ChangeKind):
    name = "sched_feature"
    patterns = facts.SCHED_FEATURES

    def confined(self, change: Change, root: Path) -> bool:
        """The sched features file, and tokens only (a feature, NO_ and a feature): what is written back is one."""
        return super().confined(change, root) and all(
            isinstance(value, str) and re.fullmatch(r"(?:NO_)?[A-Z][A-Z0-9_]{0,63}", value)
            for value in (change.before, change.feature)
        )

    def describe(self, change: Change) -> str:
        return f"write {change.wanted!r} to {change.path} (now {change.before!r})"

    def left_behind(self, change: Change) -> str:
        return knob_left_behind(change)

    @staticmethod
    def apply(change: Change, making: Making) -> None:
        assert change.wanted is not None  # the token written (set_sched_feature)
        path = Path(change.path)
        write_knob(path, change.wanted)
        change.during = feature_token(read_knob(path), change.feature)

    def undo(self, change: Change) -> str | None:
        path = Path(change.path)
        write_knob(path, change.before)
        return feature_token(read_knob(path), change.feature)


@registered
class TaskAffinity(ChangeKind):
    """Every task that may run on a CPU moved off it: one entry holds each task moved with its CPU list before."""

    name = "task_affinity"

    def describe(self, change: Change) -> str:
        return f"move {change.before} {change.wanted} (sched_setaffinity)"

    def left_behind(self, change: Change) -> str:
        return f"{len(change.tasks or {})} tasks' CPU lists without CPU {change.cpu} (sched_setaffinity)"

    def refusal(self, change: Change, root: Path) -> str:
        return f"{change.path!r}: not a list of thread ids and CPU lists under {root / 'proc'}"

    def confined(self, change: Change, root: Path) -> bool:
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

    @staticmethod
    def planned(root: Path, cpu: int, *, label: str, only: set[int] | None) -> Change:
        """The change listing every task (every thread of every process) that may run on ``cpu`` and elsewhere, with
        its CPU list; tasks the kernel keeps on their CPU (per-CPU kernel threads) are not listed."""
        tasks = {}
        # affinities are the running kernel's: under a fake root (tests) no task of the real system is touched
        listed = sorted(Path("/proc").glob("[0-9]*/task/[0-9]*")) if root.resolve() == Path("/") else []
        for task in listed:
            tid = int(task.name)
            if only is not None and tid not in only:
                continue
            try:
                allowed = os.sched_getaffinity(tid)
            except OSError:
                continue  # gone, or not a task of this root's system (a fake root in tests)
            start = process_start(tid)
            if cpu in allowed and len(allowed) > 1 and start is not None:
                tasks[str(tid)] = [start, facts.format_cpu_list(allowed)]
        return Change(
            "task_affinity",
            str(root / "proc"),
            f"{len(tasks)} tasks",
            f"without cpu {cpu}",
            label=label,
            tasks=tasks,
            cpu=cpu,
            boot_id=facts.boot_id(),
            moved_at=ticks_since_boot() if listed else None,
        )

    @staticmethod
    def apply(change: Change, making: Making) -> None:
        tasks, cpu = change.tasks, change.cpu
        assert tasks is not None  # planned() lists them
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

    def undo(self, change: Change) -> str:
        """Give the moved tasks their CPU lists back (only those still as we left them: a list someone changed during
        the run is theirs), and give the CPU back to tasks started during the run whose list is a moved list without
        it (they inherited it from a moved parent). Nothing is done for tasks of another boot."""
        if change.boot_id and change.boot_id != facts.boot_id():
            return "another boot: no task of the journal exists any more"
        errors = []
        narrowed = set()
        for tid, (start, cpus) in (change.tasks or {}).items():
            before = set(facts.parse_cpu_list(cpus))
            narrowed.add(frozenset(before - {change.cpu}) if change.cpu is not None else frozenset())
            if process_start(int(tid)) != start:
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
                start = process_start(int(task.name))
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


@registered
class Mkdir(ChangeKind):
    """A directory the kernel backs (a tracefs instance), removed again."""

    name = "mkdir"
    patterns = (rf"{TRACEFS}/instances/ticklab-\d+",)

    def describe(self, change: Change) -> str:
        return f"mkdir {change.path}"

    def left_behind(self, change: Change) -> str:
        return f"{change.path} created"

    @staticmethod
    def apply(change: Change, making: Making) -> None:
        path = Path(change.path)
        try:
            path.mkdir()
        except OSError as exc:
            raise HostChangeError(f"{path}: cannot create ({exc.strerror})") from exc
        change.during = "present"

    def undo(self, change: Change) -> str | None:
        path = Path(change.path)
        if path.exists():
            path.rmdir()
        return "absent"


@registered
class Mount(ChangeKind):
    """A filesystem mounted, by us or by another tool we watched (trace-cmd mounts debugfs), unmounted again."""

    name = "mount"
    patterns = ("sys/kernel/tracing", "sys/kernel/debug", "sys/kernel/debug/tracing")

    def confined(self, change: Change, root: Path) -> bool:
        """tracefs or debugfs at the mount points a capture (or trace-cmd) mounts them on: nothing else is
        unmounted."""
        return super().confined(change, root) and change.wanted in ("tracefs", "debugfs")

    def describe(self, change: Change) -> str:
        return f"mount -t {change.wanted} {change.wanted} {change.path}"

    def left_behind(self, change: Change) -> str:
        return f"{change.wanted} mounted at {change.path}"

    @staticmethod
    def apply(change: Change, making: Making) -> None:
        assert change.wanted is not None  # the filesystem type
        run_command(["mount", "-t", change.wanted, change.wanted, change.path])
        change.during = "mounted"

    def undo(self, change: Change) -> str | None:
        path = Path(change.path)
        if str(path) in facts.mounts(Path("/")):  # already gone (unmounted by hand): nothing to undo
            run_command(["umount", str(path)])
        return "unmounted"


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


# -- processes ticklab started ------------------------------------------------------------------------------
@registered
class Process(ChangeKind):
    """A process ticklab started in a session of its own (a workload, its server, an extra), by pid and start time:
    nothing is made, the journal entry is what lets a recovery kill what a killed capture left running."""

    name = "process"

    def describe(self, change: Change) -> str:
        return f"start {change.label} (killed if left running)"

    def left_behind(self, change: Change) -> str:
        return f"pid {change.pid} started" + (" (still running)" if process_start(change.pid) == change.started else "")

    def refusal(self, change: Change, root: Path) -> str:
        return f"{change.path!r}: not a process (pid and start time) under {root / 'proc'}"

    def confined(self, change: Change, root: Path) -> bool:
        return (
            change.path == str(root / "proc")
            and type(change.pid) is int
            and change.pid > 1
            and isinstance(change.started, str)
            and change.started.isdigit()
        )

    @staticmethod
    def apply(change: Change, making: Making) -> None:
        """Nothing to make: the process is running already (the entry is what lets a recovery kill it)."""
        change.during = "running"

    def undo(self, change: Change) -> str:
        """Kill what is left of a process ticklab started (a capture killed outright leaves its workload running): the
        process itself if its pid still has the recorded start time, and every process of the session it led (it was
        started with a session of its own; its children do not inherit the parent-death signal). A pid another
        process has since (start time differs) is never signalled; nor is anything of another boot."""
        if change.boot_id and change.boot_id != facts.boot_id():
            return "another boot: the process is gone"
        now = process_start(change.pid)
        if now is not None and now != change.started:
            return "gone (its pid belongs to another process now)"
        killed = 0
        # while any process of session <pid> lives, the kernel gives that number to no new process: they are ours
        for pid, start in _session_members(change.pid):
            if int(start) < int(change.started) or process_start(pid) != start:
                continue
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                continue
        return f"killed {killed} process(es)" if killed else "exited"


# -- what a boot plan installs (kept across reboots: HostChanges' keep) -------------------------------------
class BootPlanKind(ChangeKind):
    """A change of a boot plan: it names only the files a plan may change (its systemd unit, the link that enables
    it, grub's custom.cfg and grubenv, the kexec kernel), and outlives a reboot unless said otherwise."""

    resets_at_reboot = False
    paths: ClassVar[tuple[str, ...]]

    def confined(self, change: Change, root: Path) -> bool:
        path = os.path.normpath(change.path)
        return path == change.path and path in {str(root / p) for p in self.paths}

    def refusal(self, change: Change, root: Path) -> str:
        return f"{change.path!r}, not a file a boot plan's {self.name} entry may name"


@registered
class File(BootPlanKind):
    """A file created or replaced whole (its old content kept to put back)."""

    name = "file"
    paths = ("etc/systemd/system/ticklab-plan.service", "boot/grub/custom.cfg")

    def describe(self, change: Change) -> str:
        return f"write {change.path} ({'new' if change.before is None else 'replacing its content'})"

    @staticmethod
    def apply(change: Change, making: Making) -> None:
        assert change.wanted is not None  # the text written
        write_plan_file(Path(change.path), change.wanted, making.mode)
        change.during = "written"

    def undo(self, change: Change) -> str | None:
        path = Path(change.path)
        if change.before is None:
            if path.is_file() and not path.is_symlink():
                path.unlink()
            return "absent"
        write_plan_file(path, change.before)
        return "restored"


@registered
class Symlink(BootPlanKind):
    name = "symlink"
    paths = ("etc/systemd/system/multi-user.target.wants/ticklab-plan.service",)

    def describe(self, change: Change) -> str:
        return f"symlink {change.path} -> {change.wanted}"

    @staticmethod
    def apply(change: Change, making: Making) -> None:
        assert change.wanted is not None  # the link's target
        path = Path(change.path)
        path.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(change.wanted, path)
        change.during = "present"

    def undo(self, change: Change) -> str | None:
        path = Path(change.path)
        if path.is_symlink():
            path.unlink()
        return "absent"


def run_refusable(change: Change, argv: list[str]) -> None:
    """Run a state-changing command journalled as ``change``; if it fails, nothing changed: recorded as refused (the
    caller journals that) and raised."""
    try:
        run_command(argv)
    except HostChangeError as exc:
        change.refused, change.error = True, str(exc)
        raise


@registered
class GrubOneshot(BootPlanKind):
    """``grub-reboot ENTRY``: the next boot only; the default entry stays (undone by unsetting next_entry)."""

    name = "grub_oneshot"
    paths = ("boot/grub/grubenv",)

    def describe(self, change: Change) -> str:
        return f"grub-reboot {change.wanted!r} (one boot)"

    @staticmethod
    def apply(change: Change, making: Making) -> None:
        assert change.wanted is not None  # the entry
        root = making.root
        boot_directory = [f"--boot-directory={root / 'boot'}"] if str(root) != "/" else []
        run_refusable(change, ["grub-reboot", *boot_directory, change.wanted])
        change.during = "set"

    def undo(self, change: Change) -> str | None:
        if change.refused:
            return "not done"  # the command failed: nothing to undo
        run_command(["grub-editenv", change.path, "unset", "next_entry"])
        return "unset"


@registered
class KexecLoad(BootPlanKind):
    """``kexec -l``: the kernel the next ``kexec -e`` (or ``systemctl kexec``) boots (undone by ``kexec -u``)."""

    name = "kexec_load"
    paths = ("sys/kernel/kexec_loaded",)
    resets_at_reboot = True  # a loaded kernel is the running kernel's state

    def describe(self, change: Change) -> str:
        return f"kexec -l {change.wanted}"

    @staticmethod
    def apply(change: Change, making: Making) -> None:
        run_refusable(change, list(making.argv))
        change.during = "loaded"

    def undo(self, change: Change) -> str | None:
        if change.refused:
            return "not done"  # the command failed: nothing to undo
        run_command(["kexec", "-u"])
        return "unloaded"
