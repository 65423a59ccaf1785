"""Fuzz families of issue 55: inputs that reach what root does.

kernel-names   a real traced experiment (runners/nohz/*.yaml) with one trace event, optional event, function or symbol
               replaced by a generated name: path pieces ('..', '/', '.', absolute paths), control characters, spaces,
               wildcards, long names, or a valid kernel name. A name that is not a kernel name must be refused in one
               line naming the file; one accepted must be a kernel name (no '/', no '..': it becomes a tracefs path).
               Accepted with '/' or '..' in it is an escape ("wrong").
journals       a hand-edited host-changes journal on a fake root, each entry drawn from: the knobs a capture writes
               (valid), core_pattern, a file under /etc, an event path climbing out with '..', the boot plan's unit
               with any content, a mount of another point or type, a process started before the capture (a real
               sleeping process), a task list with a bad CPU list. `recover` must put back every valid entry and
               refuse the rest in one line; wrong: a file outside the knobs written, the unit written, the sleeper
               killed (an escape), or a valid entry not put back (a silent loss).
fork-frames    frames sent to a real report fork server (kernelfork.started): deep nesting, floats and other types
               where a request has strings, huge frames, bytes that are not JSON, partial frames then a close. Each
               must end that connection only: wrong is a server that no longer accepts, or a kernel forked for it.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import fuzzcases as cases
from fuzzcases import REPO, Outcome

KERNEL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _is_event(name: str) -> bool:
    system, colon, event = name.partition(":")
    return (
        bool(colon)
        and bool(re.fullmatch(r"[A-Za-z0-9_]{1,64}", system))
        and bool(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,127}", event))
    )


def _is_symbol(name: str) -> bool:
    return bool(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,255}(\.[A-Za-z0-9_]{1,64}){0,4}", name))


class KernelNamesFamily:
    name = "kernel names in experiments (events, functions, symbols)"
    key = "kernel-names"
    PIECES = ["..", "/", ".", "irq", "timer", "hrtimer_start", "x", "../..", "/tmp/x", " ", "\t", "\n", "*", "?",
              "\x00", "\x1b", "é", "-", ":", "tick_sched_timer", "isra", "0", "enable"]  # fmt: skip

    def prepare(self, seeds: Path) -> None:
        import ticklab.capture.experiment  # noqa: F401 (imported before the first input's deadline)

        self.experiments = sorted(p for p in (REPO / "runners/nohz").glob("*.yaml") if "trace:" in p.read_text())

    def _name(self, source) -> str:
        shape = source.integer(0, 5)
        if shape == 0:  # a valid kernel name of the right form
            return "irq:irq_handler_entry"
        if shape == 1:
            return f"irq:{'../' * source.integer(1, 6)}tmp/x"
        if shape == 2:
            return "/".join(source.choice(self.PIECES) for _ in range(source.integer(1, 4)))
        if shape == 3:
            return "x" * source.integer(1, 400)
        return "".join(source.choice(self.PIECES) for _ in range(source.integer(1, 6)))

    def case(self, source, work: Path) -> Outcome:
        import yaml

        from ticklab.capture.experiment import load_experiment

        seed = source.choice(self.experiments)
        data = yaml.safe_load(seed.read_text())
        field = source.choice(["events", "optional_events", "functions", "symbols"])
        name = self._name(source)
        trace = data["trace"]
        names = list(trace.get(field) or [])
        if names and source.integer(0, 1):
            names[source.integer(0, len(names) - 1)] = name
        else:
            names.append(name)
        trace[field] = names
        path = work / "experiment.yaml"
        path.write_text(yaml.safe_dump(data))
        valid = _is_event(name) if "events" in field else _is_symbol(name)

        def check(experiment) -> str | None:
            got = experiment.trace_settings()
            every = [*got.events, *got.optional_events, *got.functions, *got.symbols]
            bad = [n for n in every if "/" in n or ".." in n or not n.isprintable()]
            return f"escape: accepted {bad[0][:80]!r} as a kernel name" if bad else None

        outcome = cases.classify(lambda: load_experiment(path), known_bad=not valid, check=check)
        if outcome.kind == "error" and str(path) not in outcome.detail:
            return Outcome("wrong", f"refusal without the file: {outcome.detail}", outcome.known_bad)
        return outcome


class JournalsFamily:
    name = "hand-edited journals: restore"
    key = "journals"
    RT = "proc/sys/kernel/sched_rt_runtime_us"
    SAVED = "sys/kernel/tracing/saved_cmdlines_size"
    UNIT = "etc/systemd/system/ticklab-plan.service"

    def prepare(self, seeds: Path) -> None:
        import ticklab.host.change_kinds  # noqa: F401
        import ticklab.host.journal  # noqa: F401

    def _root(self, work: Path) -> Path:
        root = work / "root"
        for relative, text in [
            (self.RT, "-1\n"),
            (self.SAVED, "32768\n"),
            ("proc/sys/kernel/core_pattern", "core\n"),
            ("etc/shadow", "root:secret\n"),
            ("outside/x/enable", "0\n"),
        ]:
            (root / relative).parent.mkdir(parents=True, exist_ok=True)
            (root / relative).write_text(text)
        (root / "sys/kernel/tracing/instances").mkdir(parents=True, exist_ok=True)
        return root

    def case(self, source, work: Path) -> Outcome:
        from ticklab.host import facts
        from ticklab.host.journal import HostChangeError, process_start, recover, write_journal

        root = self._root(work)
        sleeper = subprocess.Popen(["sleep", "600"], start_new_session=True)
        try:
            started = process_start(sleeper.pid)
            owner = subprocess.Popen(["true"])
            owner_start = process_start(owner.pid)
            owner.wait()
            while int(owner_start) <= int(started):  # the capture started a tick after the sleeper
                owner = subprocess.Popen(["true"])
                owner_start = process_start(owner.pid)
                owner.wait()
            pool = [
                ("valid", {"kind": "write", "path": str(root / self.RT), "before": "950000", "wanted": "-1"}),
                ("valid", {"kind": "write", "path": str(root / self.SAVED), "before": "128", "wanted": "32768"}),
                ("bad", {"kind": "write", "path": str(root / "proc/sys/kernel/core_pattern"), "before": "|/x"}),
                ("bad", {"kind": "write", "path": str(root / "etc/shadow"), "before": "root::0:"}),
                ("bad", {"kind": "write", "path": str(root / "sys/../etc/shadow"), "before": "x"}),
                (
                    "bad",
                    {
                        "kind": "write",
                        "path": str(root / "sys/kernel/tracing/events/irq/../../../../outside/x/enable"),
                        "before": "1",
                    },
                ),
                ("bad", {"kind": "file", "path": str(root / self.UNIT), "before": "[Service]\nExecStart=/x\n"}),
                ("bad", {"kind": "mount", "path": str(root / "home"), "before": "unmounted", "wanted": "tracefs"}),
                ("bad", {"kind": "mount", "path": str(root / "sys/kernel/tracing"), "wanted": "ext4"}),
                ("bad", {"kind": "mkdir", "path": str(root / "etc/cron.d"), "before": "absent"}),
                (
                    "bad",
                    {
                        "kind": "process",
                        "path": str(root / "proc"),
                        "pid": sleeper.pid,
                        "started": started,
                        "boot_id": facts.boot_id(),
                    },
                ),
                (
                    "bad",
                    {
                        "kind": "sched_feature",
                        "path": str(root / "sys/kernel/debug/sched/features"),
                        "before": "HRTICK\nX",
                        "feature": "HRTICK",
                    },
                ),  # fmt: skip
            ]
            chosen = [source.choice(pool) for _ in range(source.integer(1, 6))]
            kinds = [kind for kind, _ in chosen]
            journal = work / "state" / "host-changes.json"
            journal.parent.mkdir(mode=0o700, exist_ok=True)
            write_journal(
                journal,
                {
                    "pid": owner.pid,
                    "pid_start": owner_start,
                    "boot_id": facts.boot_id(),
                    "root": str(root),
                    "changes": [entry for _, entry in chosen],
                },
            )

            def check(_result) -> str | None:
                return None

            outcome = cases.classify(
                lambda: recover(journal, root=root, log=lambda line: None), known_bad="bad" in kinds, check=check
            )
            if outcome.kind == "traceback" and HostChangeError.__name__ in outcome.detail:
                outcome = Outcome("error", outcome.detail, outcome.known_bad)
            escaped = []
            if (root / "proc/sys/kernel/core_pattern").read_text() != "core\n":
                escaped.append("core_pattern written")
            if (root / "etc/shadow").read_text() != "root:secret\n":
                escaped.append("etc/shadow written")
            if (root / "outside/x/enable").read_text() != "0\n":
                escaped.append("outside/x/enable written")
            if (root / self.UNIT).exists() or (root / "etc/cron.d").exists():
                escaped.append("a file of a boot plan or a directory outside the knobs made")
            if sleeper.poll() is not None:
                escaped.append("a process started before the capture killed")
            if escaped:
                return Outcome("wrong", "escape: " + ", ".join(escaped), outcome.known_bad)
            lost = []
            if "valid" in kinds:
                wanted = {self.RT: "950000", self.SAVED: "128"}
                for _kind, entry in chosen:
                    relative = entry["path"][len(str(root)) + 1 :]
                    if _kind == "valid" and (root / relative).read_text().strip() != wanted[relative]:
                        lost.append(relative)
            if lost:
                return Outcome("wrong", f"silent loss: {', '.join(lost)} not put back", outcome.known_bad)
            return outcome
        finally:
            sleeper.kill()
            sleeper.wait()


class ForkFramesFamily:
    name = "report fork server: malformed frames"
    key = "fork-frames"

    def prepare(self, seeds: Path) -> None:
        import multiprocessing

        self.server = None
        if multiprocessing.current_process().name != "MainProcess":  # the worker's, before it says it is ready
            self._started()

    def _started(self):
        if self.server is None:
            from ticklab.report import kernelfork

            self._context = kernelfork.started()
            self.server = self._context.__enter__()
            atexit.register(self._context.__exit__, None, None, None)  # ended before the interpreter's teardown
            if self.server is not None:  # serving once its imports are done (it then ends an empty connection)
                probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                probe.connect(self.server)
                probe.shutdown(socket.SHUT_WR)
                while probe.recv(4096):
                    pass
                probe.close()
        return self.server

    def _frame(self, source) -> bytes:
        shape = source.integer(0, 6)
        if shape == 0:
            depth = source.integer(5, 300_000)
            return b"[" * depth + b"]" * depth + b"\n"
        if shape == 1:
            depth = source.integer(5, 300_000)
            return b'{"a":' * depth + b"1" + b"}" * depth + b"\n"
        if shape == 2:  # a request whose fields have other types
            value = source.choice([2.0, None, True, [1], {"a": 1}, "x" * source.integer(0, 100), 10**30])
            field = source.choice(["role", "arguments", "cwd", "env"])
            request = {"role": "kernel", "arguments": [], "cwd": "/", "env": {"X": "1"}, field: value}
            return json.dumps(request).encode() + b"\n"
        if shape == 3:
            return source.binary(4096) + b"\n"
        if shape == 4:
            return b'{"role": "kernel", "arguments": ["' + b"a" * source.integer(1, 3 << 20) + b'"]}\n'
        if shape == 5:
            return b'{"role": "kernel", "argu'  # then the connection closes
        return b'{"signal": 2.0}\n'

    def case(self, source, work: Path) -> Outcome:
        path = self._started()
        if path is None:
            return Outcome("wrong", "no fork server started")
        frame = self._frame(source)
        null = os.open(os.devnull, os.O_RDWR)
        reply = b""
        try:
            connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            connection.settimeout(60)
            connection.connect(path)
            try:
                sent = socket.send_fds(connection, [frame], [null] * source.integer(0, 3))
                connection.sendall(frame[sent:])  # a frame larger than the socket's buffer goes in pieces
                connection.shutdown(socket.SHUT_WR)
                while True:
                    piece = connection.recv(4096)
                    if not piece:
                        break
                    reply += piece
            except (BrokenPipeError, ConnectionResetError):
                pass
            finally:
                connection.close()
        finally:
            os.close(null)
        if b'"pid"' in reply:
            return Outcome("wrong", f"a kernel forked for a malformed frame ({frame[:60]!r})", True)
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
        except ConnectionRefusedError:
            self.server = None  # started again for the next input
            return Outcome("wrong", f"the server ended on a frame ({frame[:60]!r})", True)
        finally:
            probe.close()
        return Outcome("error", "connection ended, server still serving", True)


if __name__ == "__main__":
    sys.exit("run through benchmarks/fuzz.py --family kernel-names|journals|fork-frames")
