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

The journal, its recovery and the host lock are :mod:`ticklab.host.journal`; each kind of change, with what makes
it and what puts it back, is :mod:`ticklab.host.change_kinds`.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable
from pathlib import Path

from . import facts
from .change_kinds import (
    File,
    GrubOneshot,
    KexecLoad,
    Mkdir,
    Mount,
    Process,
    SchedFeature,
    Symlink,
    TaskAffinity,
    Write,
    feature_token,
    read_knob,
    read_plan_file,
    restorable,
    ticks_since_boot,
)
from .journal import (
    KINDS,
    Change,
    HostChangeError,
    Making,
    default_journal,
    host_lock,
    private_dir,
    process_start,
    read_journal,
    recover,
    undo_all,
    write_journal,
)

CATCH = (signal.SIGTERM, signal.SIGHUP)


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


def format_cpu_mask(mask: int) -> str:
    """A CPU bitmask as the kernel writes it: hex in 32-bit groups separated by commas (1 -> '1')."""
    text = f"{mask:x}"
    groups = [text[max(0, i - 8) : i] for i in range(len(text), 0, -8)]
    return ",".join(reversed(groups))


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
            "pid_start": process_start(os.getpid()),
            "boot_id": facts.boot_id(),
            "root": str(self.root),
            "changes": [c.record_full() for c in self.changes if not c.dry_run and c.after is None],
        }
        write_journal(self.journal, data)

    def _begin(self, change: Change) -> bool:
        """Journal a change before making it; in dry-run print it instead. True if it should be made."""
        if not self._active:
            raise HostChangeError("host changes are made only inside 'with HostChanges(...)'")
        self.changes.append(change)
        if self.dry_run:
            change.dry_run = True
            self.log(f"dry-run: would {KINDS[change.kind].describe(change)}")
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
            started=process_start(pid),
            boot_id=facts.boot_id(),
        )
        if change.started is None:  # ended already (and not yet reaped it would still have a start time)
            change.started = str(ticks_since_boot())
        if self._begin(change):
            Process.apply(change, Making())
        return change

    # -- knobs -----------------------------------------------------------------------------------
    def write(self, relative: str, value: str, *, label: str | None = None, may_refuse: bool = False) -> Change:
        """Write ``value``; with ``may_refuse`` a write the kernel refuses is recorded as refused (nothing changed)
        instead of raised."""
        path = self.root / relative
        change = Change("write", str(path), restorable(path, read_knob(path)), str(value), label=label)
        if self._begin(change):
            Write.apply(change, Making(may_refuse=may_refuse))
        return change

    def move_tasks_off(
        self, cpu: int, *, label: str = "tasks moved off the measured CPU", only: set[int] | None = None
    ) -> Change:
        """Take ``cpu`` out of the CPU list of every task (every thread of every process) that may run there, so that
        only what starts afterwards and asks for it (the pinned workload) runs there; tasks the kernel keeps on
        their CPU (per-CPU kernel threads) stay. One journal entry holds every task moved with its CPU list."""
        change = TaskAffinity.planned(self.root, cpu, label=label, only=only)
        if self._begin(change):
            TaskAffinity.apply(change, Making())
            self._save_journal()
        return change

    def isolate_cpu(self, cpu: int) -> list[Change]:
        """Leave ``cpu`` to the measured workload, as FTQ's author ran it: every interrupt whose affinity allows
        another CPU is moved off it (and the default affinity of new interrupts), then every other task."""
        changes = []
        default = self.root / "proc/irq/default_smp_affinity"
        if default.is_file():
            try:
                mask = int(read_knob(default).replace(",", ""), 16)
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
                allowed = set(facts.parse_cpu_list(read_knob(listed)))
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
        before = feature_token(read_knob(path), feature)
        if before is None:
            raise HostChangeError(f"{path}: this kernel has no sched feature {feature}")
        wanted = feature if enabled else f"NO_{feature}"
        change = Change("sched_feature", str(path), before, wanted, feature=feature, label=f"sched_feature {feature}")
        if self._begin(change):
            SchedFeature.apply(change, Making())
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
        change = Change("write", str(path), restorable(path, read_knob(path)), None, label=label or "guarded")
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
            Mkdir.apply(change, Making())
        return change

    def mount(self, fstype: str, relative: str) -> Change:
        path = self.root / relative
        change = Change("mount", str(path), "unmounted", fstype, label=f"mount {fstype}")
        if self._begin(change):
            Mount.apply(change, Making())
        return change

    # -- boot plans (kept across reboots, see ``keep``) -------------------------------------------------
    def write_file(self, relative: str, text: str, *, label: str, mode: int = 0o644) -> Change:
        """Create (or replace, keeping the old content to put back) a file only a boot plan writes."""
        path = self.root / relative
        before = read_plan_file(path)
        change = Change("file", str(path), before, text, label=label)
        if self._begin(change):
            File.apply(change, Making(mode=mode))
        return change

    def symlink(self, relative: str, target: str, *, label: str) -> Change:
        path = self.root / relative
        if os.path.lexists(path):
            raise HostChangeError(f"{path}: exists already; another boot plan may be installed")
        change = Change("symlink", str(path), None, target, label=label)
        if self._begin(change):
            Symlink.apply(change, Making())
        return change

    def grub_reboot(self, entry: str, *, label: str = "grub one-shot boot entry") -> Change:
        """``grub-reboot ENTRY``: the next boot only; the default entry stays (undone by unsetting next_entry)."""
        grubenv = self.root / "boot/grub/grubenv"
        change = Change("grub_oneshot", str(grubenv), None, entry, label=label)
        if self._begin(change):
            self._refusable(lambda: GrubOneshot.apply(change, Making(root=self.root)))
        return change

    def _refusable(self, apply: Callable[[], None]) -> None:
        """Make a change whose command may fail: then nothing changed, and the journal says it was refused."""
        try:
            apply()
        except HostChangeError:
            self._save_journal()
            raise

    def kexec_load(self, image: str, initrd: str | None, cmdline: str, *, label: str = "kexec kernel loaded") -> Change:
        """``kexec -l``: the kernel the next ``kexec -e`` (or ``systemctl kexec``) boots (undone by ``kexec -u``)."""
        argv = ["kexec", "-l", image] + (["--initrd", initrd] if initrd else []) + ["--append", cmdline]
        change = Change("kexec_load", str(self.root / "sys/kernel/kexec_loaded"), None, " ".join(argv[2:]), label=label)
        if self._begin(change):
            self._refusable(lambda: KexecLoad.apply(change, Making(argv=tuple(argv))))
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
            failures = undo_all(pending, self.log)
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
