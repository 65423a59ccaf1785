"""Putting the host back after a capture was killed outright, without waiting for the next capture.

A capture's :class:`~ticklab.host.knobs.HostChanges` journals each change before making it and puts everything back
when the capture ends, however it ends short of SIGKILL or a power cut. These leave the journal
(``/run/ticklab/host-changes.json`` as root) and the host changed — RT throttling off, interrupts and tasks moved off
the measured CPU, a tracefs instance, a debugfs mount — until something puts it back. The next capture does, first
thing; ``ticklab restore`` does it now (:func:`restore`), and ``ticklab doctor`` says what a journal left behind lists
and which command puts it back (:func:`left_behind`, :func:`summary`).

There is one restore path: :func:`ticklab.host.journal.recover`, the one the next capture runs (its checks of the
journal, its order, what a failure leaves listed). This module only finds the journals, takes the host lock and calls
it. The journal's writer holds the host lock (:class:`~ticklab.host.journal.HostLock`: an flock, which the kernel drops
when the process dies, however it dies) from before its first change until everything is put back; restore takes
the lock without waiting, so it never acts while the capture that wrote the journal runs — that capture puts the host
back itself when it ends. ``recover`` checks the journal's pid and start time as well.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from . import facts
from .journal import (
    KINDS,
    Change,
    HostBusy,
    HostChangeError,
    checked_journal,
    default_journal,
    host_lock,
    journal_boot,
    lock_path,
    owner_running,
    read_private,
    recover,
)

# doctor's own probes (mounting tracefs, writing a sched feature back) are journalled apart from a capture's, so that
# doctor can report a capture's journal without putting it back
DOCTOR_JOURNAL_NAME = "doctor-changes.json"
RESTORE_COMMAND = "ticklab restore"


def doctor_journal(journal: Path | None = None) -> Path:
    """Where doctor journals its own probes: beside the capture journal."""
    return (Path(journal) if journal else default_journal()).with_name(DOCTOR_JOURNAL_NAME)


def journals(journal: Path | None = None) -> list[Path]:
    """The journals ``ticklab restore`` puts back: a capture's (the default one, or ``journal``) and doctor's."""
    journal = Path(journal) if journal else default_journal()
    return [journal, doctor_journal(journal)]


def _utc(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def _boot_time() -> float | None:
    """When this boot began (/proc/stat btime, seconds since the epoch)."""
    try:
        for line in Path("/proc/stat").read_text().splitlines():
            if line.startswith("btime "):
                return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def _lock_line(root: Path, journal: Path, pid: int | None) -> str | None:
    """What the host lock file says of the process that last took it ('pid N (command) since T'), if that is the
    journal's writer: a process killed outright never cleared it."""
    path = lock_path(root) if os.geteuid() == 0 else journal.parent / "host.lock"
    try:
        line = read_private(path, 4096).decode(errors="replace").strip()
    except (HostChangeError, OSError):
        return None
    return line if pid and line.startswith(f"pid {pid} (") else None


@dataclass
class LeftBehind:
    """A journal of host changes found on the host, and what is known of the process that wrote it."""

    journal: Path
    pid: int | None = None
    running: bool = False  # its writer still runs: the changes are its own to put back when it ends
    other_boot: bool = False  # written in another boot: the reboot reset the kernel state it lists
    owner: str | None = None  # the host lock's line for the writer: 'pid N (ticklab capture …) since T'
    started: str | None = None  # when the writer started (UTC), from its start time, in this boot
    written: str | None = None  # when the journal was last written (UTC)
    changes: list[Change] = field(default_factory=list)
    problem: str | None = None  # why the journal is refused (restore refuses it too)

    def who(self) -> str:
        """The writer in words: its pid, its command line and when it started, as far as they are known."""
        if self.owner:
            return self.owner
        started = f" started {self.started}" if self.started else ""
        return f"pid {self.pid}{started}" if self.pid else "a process that did not record its pid"

    def state(self) -> str:
        if self.problem:
            return "refused"
        if self.other_boot:
            return "another boot"
        return "running" if self.running else "gone"

    def record(self) -> dict:
        """For ``doctor --json``: every change as the manifest records it (a task list as its count)."""
        return {
            "journal": str(self.journal),
            "pid": self.pid,
            "writer": self.state(),
            "owner": self.owner,
            "started": self.started,
            "written": self.written,
            "problem": self.problem,
            "changes": [c.record() for c in self.changes],
            "summary": summary(self.changes),
            "restore": RESTORE_COMMAND,
        }


def inspect(journal: Path, root: Path | str = "/") -> LeftBehind | None:
    """What the journal at ``journal`` lists and who wrote it, read as recovery reads it, changing nothing (no
    lock taken); None when there is no journal."""
    journal, root = Path(journal), Path(root)
    if not os.path.lexists(journal):
        return None
    left = LeftBehind(journal)
    try:
        left.written = _utc(os.lstat(journal).st_mtime)
        data, left.changes = checked_journal(journal, root)
    except (HostChangeError, OSError) as exc:
        left.problem = str(exc)
        return left
    left.pid = data.get("pid")
    boot = journal_boot(data, left.changes)
    left.other_boot = bool(boot and boot != facts.boot_id())
    if left.other_boot:
        return left
    left.running = owner_running(data)
    left.owner = _lock_line(root, journal, left.pid)
    booted, start = _boot_time(), data.get("pid_start")
    if booted is not None and isinstance(start, str) and start.isdigit():
        left.started = _utc(booted + int(start) / os.sysconf("SC_CLK_TCK"))
    return left


def left_behind(journal: Path | None = None, root: Path | str = "/") -> LeftBehind | None:
    """The capture journal (the default one, or ``journal``) as :func:`inspect` reads it."""
    return inspect(Path(journal) if journal else default_journal(), root)


def _group(change: Change) -> str:
    """Changes of one kind told apart only by a number (IRQ 24 and IRQ 25, cpu0 and cpu1) or an event name are
    summed up on one line."""
    label = change.label or change.kind
    return "trace events enabled" if label.startswith("event ") else re.sub(r"\d+", "N", label)


def _what(change: Change) -> str:
    """One change as it was made (or, once restored, what was read back)."""
    kind = KINDS.get(change.kind)
    text = kind.left_behind(change) if kind else f"{change.kind} {change.path}"
    if change.after is None:
        return text
    return text + (
        " -> put back"
        if change.kind == "task_affinity" and change.after == change.before
        else f" -> now {change.after!r}"
    )


def summary(changes: list[Change]) -> list[str]:
    """What the changes did, one line per group (see :func:`_group`), in the order they were made; a write the kernel
    refused changed nothing and is left out."""
    groups: dict[str, list[Change]] = {}
    for change in changes:
        if not change.refused:
            groups.setdefault(_group(change), []).append(change)
    return [
        f"{name}: {_what(group[0])}" + (f" (and {len(group) - 1} more like it)" if len(group) > 1 else "")
        for name, group in groups.items()
    ]


class RestoreRefused(HostChangeError):
    """The writer of the journal still runs (it holds the host lock): nothing was touched."""


def restore(
    journal: Path | None = None, *, root: Path | str = "/", log: Callable[[str], None] = print
) -> list[Change] | None:
    """Put back what the journals a killed capture (or doctor) left list — :func:`ticklab.host.journal.recover`, the
    restore path the next capture runs — holding the host lock. None when there is no journal; the changes put back
    (``after``: what was read back) otherwise. One-line :class:`HostChangeError` when it cannot: the journal's writer
    still runs (:class:`RestoreRefused`), the journal is refused, or a change could not be put back (the journal
    then lists only those)."""
    root = Path(root)
    found = [path for path in journals(journal) if os.path.lexists(path)]
    if not found:
        return None
    try:
        lock = host_lock(root, found[0]).acquire()
    except HostBusy as exc:
        holder = exc.holder or "a process that has not said who it is"
        raise RestoreRefused(
            f"{found[0]}: not restored: the host is held by {holder}, which is still running and "
            "puts back what it changed when it ends; stop it (Ctrl-C, or kill -TERM its pid) or wait "
            "for it"
        ) from None
    try:
        restored: list[Change] = []
        for path in found:
            restored += recover(path, root=root, log=log)
        return restored
    finally:
        lock.release()
