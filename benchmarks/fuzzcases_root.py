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
kernel-root    `kernel build --host --root DIR` against DIR's owner (issue 55 item 5), each input in a private mount
               namespace of its own (`unshare -m`): a mount point planted as a link (to a victim directory outside
               DIR, or to /), a file, a FIFO, missing, not empty or a mount already; swapped at the window between its
               check and the mount (link, directory, file, gone); during the chroot step ticklab's mount moved away
               and a link to another mount put in its place, or replaced by another mount, or taken down; or files
               planted at DIR/proc (osrelease, modules, version). Wrong: anything mounted outside DIR, a mount
               ticklab did not make unmounted, one of its own left in DIR, the chroot without its mounts, a refusal
               not naming the mount point, or a plan that takes DIR for the running system.
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
        import ticklab.host.change_kinds
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


def _private_mounts() -> bool:
    if os.geteuid() != 0:
        return False
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "true"], capture_output=True, check=False)
    return probe.returncode == 0


class KernelRootFamily:
    name = "kernel build --root DIR: planted and swapped mount points, /proc files"
    key = "kernel-root"
    POINTS = ("proc", "sys", "dev")
    PLANTS = ("link-victim", "link-root", "file", "fifo", "missing", "not-empty", "mounted")
    SWAPS = ("link-victim", "directory", "file", "missing")
    ATTACKS = ("relink", "replace", "unmount")
    RELEASE = "6.1.0-50-amd64"

    def prepare(self, seeds: Path) -> None:
        import ticklab.capture.hostkernel  # noqa: F401

        self.mounts = _private_mounts()  # without root or unshare: the plan's /proc inputs only
        self.devfs = subprocess.run(["stat", "-f", "-c", "%T", "/dev"], capture_output=True, text=True).stdout.strip()

    def _tree(self, base: Path, attack: str) -> tuple[Path, Path]:
        root = base / "image"
        for relative in ("proc", "sys", "dev", "boot/grub", "usr/src"):
            (root / relative).mkdir(parents=True)
        (root / f"boot/vmlinuz-{self.RELEASE}").write_bytes(b"debian kernel")
        (root / f"boot/config-{self.RELEASE}").write_text("CONFIG_64BIT=y\n")
        (root / "boot/grub/grub.cfg").write_text("set default=0\n")
        tree = base / "tree"
        (tree / "arch/x86/boot").mkdir(parents=True)
        (tree / "Makefile").write_text("VERSION = 6\nPATCHLEVEL = 12\nSUBLEVEL = 5\n")
        (tree / "arch/x86/boot/bzImage").write_bytes(b"kernel")
        (tree / "System.map").write_text("map")
        (tree / ".config").write_text("CONFIG_64BIT=y\n")
        for victim in ("victim", "victim-mount"):
            (base / victim).mkdir()
        (base / "victim/keep").write_text("host file\n")
        bin_dir, log = base / "bin", base / "argv.log"
        bin_dir.mkdir()
        for name in ("make", "update-initramfs"):
            (bin_dir / name).write_text(f'#!/bin/sh\necho {name} "$@" >> {log}\n')
        (bin_dir / "chroot").write_text(
            '#!/bin/sh\nwhere="$1"; shift; W=$(readlink -f "$where")\n'
            f'echo chroot "$W" "$@" proc=$(stat -f -c %T "$where/proc") sys=$(stat -f -c %T "$where/sys") '
            f'dev=$(stat -f -c %T "$where/dev") >> {log}\n{attack}\n'
        )
        for tool in bin_dir.iterdir():
            tool.chmod(0o755)
        return root, log

    def case(self, source, work: Path) -> Outcome:
        base = work / "kernel-root"
        cases.remove_tree(base)
        shape = source.integer(0, 4) if self.mounts else 4
        point = source.choice(self.POINTS)
        spec = {"base": str(base), "point": point, "plant": None, "swap": None, "attack": None, "plan_only": shape == 4}
        known_bad = False
        attack = ""
        if shape == 3:
            spec["attack"] = source.choice(self.ATTACKS)
            attack = {
                "relink": f'unshare -m --propagation private sh -c "umount -l $W/{point} && mv $W/{point} '
                f'$W/{point}.away && ln -s {base}/victim-mount $W/{point}"',
                "replace": f'umount -l "$W/{point}" && mount -t tmpfs other "$W/{point}"',
                "unmount": f'umount -l "$W/{point}"',
            }[spec["attack"]]
        root, log = self._tree(base, attack)
        target = root / point
        if shape == 1:
            plant = spec["plant"] = source.choice(self.PLANTS)
            known_bad = not (plant == "not-empty" and point == "dev")  # /dev may hold debootstrap's nodes
            if plant in ("link-victim", "link-root", "file", "fifo", "missing"):
                target.rmdir()
            if plant == "link-victim":
                target.symlink_to(base / "victim")
            elif plant == "link-root":
                target.symlink_to("/")
            elif plant == "file":
                target.write_text("")
            elif plant == "fifo":
                os.mkfifo(target)
            elif plant == "not-empty":
                (target / "left").write_text("x")
        elif shape == 2:
            spec["swap"] = source.choice(self.SWAPS)
            known_bad = True
        elif shape == 4:
            release = source.choice(["6.18.44-fc-v857", self.RELEASE, "9.9.9-evil", "x" * source.integer(1, 80)])
            planted = {"sys/kernel/osrelease": release + "\n", "modules": "evil 4096 0 - Live 0x0\n",
                       "version": "Linux version 9.9.9 Debian 9.9.9-1\n"}  # fmt: skip
            for relative, text in planted.items():
                if source.integer(0, 3):
                    (root / "proc" / relative).parent.mkdir(parents=True, exist_ok=True)
                    (root / "proc" / relative).write_text(text)
        (base / "spec.json").write_text(json.dumps(spec))
        argv = [sys.executable, str(Path(__file__).resolve()), "kernel-root-child", str(base / "spec.json")]
        done = subprocess.run(
            (["unshare", "-m", "--propagation", "private"] if self.mounts else []) + argv,
            capture_output=True,
            text=True,
            check=False,
            env={
                **os.environ,
                "PYTHONPATH": os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(REPO / "src")])),
            },
        )
        try:
            result = json.loads(done.stdout.splitlines()[-1])
        except (IndexError, ValueError):
            return Outcome("traceback", f"the child exited {done.returncode}: {done.stderr.strip()[-300:]}", known_bad)
        return self._judge(result, spec, root, base, log, known_bad)

    def _judge(self, result: dict, spec: dict, root: Path, base: Path, log: Path, known_bad: bool) -> Outcome:
        if result.get("traceback"):
            return Outcome("traceback", result["traceback"], known_bad)
        if "live" not in result:  # nothing planted reaches the plan: a refusal there read a planted file
            return Outcome("wrong", f"the plan refused: {result['error']}", known_bad)
        if result["live"] or result["initramfs"][0] != "chroot" or result["release"] != self.RELEASE:
            return Outcome("wrong", f"DIR taken for the running system: {result['initramfs']}", known_bad)
        if spec["plan_only"]:
            return Outcome("accepted", "", known_bad)
        escaped = []
        allowed = {str(base / "victim-mount")}
        if spec["plant"] == "mounted" or spec["attack"] == "replace":
            allowed.add(str(root / spec["point"]))
        if str(base / "victim-mount") not in result["mounts"]:
            escaped.append("a mount ticklab never made was unmounted")
        if not result["victim_kept"]:
            escaped.append("the other mount's file is gone")
        outside = [m for m in result["mounts"] if m not in allowed and not m.startswith(f"{root}/")]
        left = [m for m in result["mounts"] if m not in allowed and m.startswith(f"{root}/")]
        if outside:
            escaped.append(f"mounted outside DIR: {outside[0]}")
        if sorted(p.name for p in (base / "victim").iterdir()) != ["keep"]:
            escaped.append("the victim directory changed")
        if escaped:
            return Outcome("wrong", "escape: " + ", ".join(escaped), known_bad)
        if left:
            return Outcome("wrong", f"ticklab's mount left in DIR: {left[0]}", known_bad)
        error = result["error"]
        if error is not None:
            if "\n" in error or str(root / spec["point"]) not in error:
                return Outcome("wrong", f"a refusal not naming {spec['point']} in one line: {error[:200]}", known_bad)
            return Outcome("error", error[:300], known_bad)
        if known_bad:
            return Outcome("wrong", f"accepted: {spec}", known_bad)
        chroot = [line for line in log.read_text().splitlines() if line.startswith("chroot")]
        if chroot != [line for line in chroot if line.endswith(f"proc=proc sys=sysfs dev={self.devfs}")] or not chroot:
            return Outcome("wrong", f"the chroot step without its mounts: {chroot}", known_bad)
        if spec["attack"] in ("replace", "unmount") and not any("left as it is" in line for line in result["said"]):
            return Outcome("wrong", "a mount no longer ticklab's passed without a line", known_bad)
        return Outcome("accepted", "", known_bad)


def kernel_root_child(spec_path: str) -> None:
    """One kernel-root input, in the private mount namespace its parent made: the plan and (unless plan_only) the
    install with fake tools, the victim mount made first; prints what happened as one JSON line."""
    spec = json.loads(Path(spec_path).read_text())
    base = Path(spec["base"])
    root, target = base / "image", base / "image" / spec["point"]
    os.environ["PATH"] = f"{base / 'bin'}:{os.environ['PATH']}"
    from ticklab.capture import hostkernel
    from ticklab.capture.hostkernel import HostKernelError, build_and_install, is_live, plan_host_kernel

    try:
        from ticklab.host import chrootmounts
    except ImportError:  # the code before issue 55 item 5 (to show what the family finds there): no hook
        chrootmounts = None

    if not spec["plan_only"]:
        subprocess.run(["mount", "-t", "tmpfs", "victim", str(base / "victim-mount")], check=True)
        (base / "victim-mount/keep").write_text("kept\n")
        if spec["plant"] == "mounted":
            subprocess.run(["mount", "-t", "tmpfs", "planted", str(target)], check=True)

    def swap(checked: Path) -> None:
        if checked != target:
            return
        checked.rename(checked.with_name(checked.name + ".away"))
        if spec["swap"] == "link-victim":
            checked.symlink_to(base / "victim")
        elif spec["swap"] == "directory":
            checked.mkdir()
        elif spec["swap"] == "file":
            checked.write_text("")

    if spec["swap"] and chrootmounts is not None:
        chrootmounts.between_check_and_mount = swap
    elif spec["swap"]:  # before: the window is after the check _system_mounts makes (the second), before its mounts
        checks, check = [], hostkernel._check_mount_points

        def check_then_swap(checked_root: Path) -> None:
            check(checked_root)
            checks.append(checked_root)
            if len(checks) == 2:
                swap(target)

        hostkernel._check_mount_points = check_then_swap
    result = {"error": None, "traceback": None, "said": []}
    try:
        plan = plan_host_kernel(root, source=base / "tree", work=base / "work")
        result.update(live=is_live(root), release=plan.running_release, initramfs=plan.install_steps[-1])
        if not spec["plan_only"]:
            plan.build_steps = []
            build_and_install(plan, root, say=result["said"].append)
    except HostKernelError as exc:
        result["error"] = str(exc)
    except Exception as exc:  # the campaign reports it
        result["traceback"] = f"{type(exc).__module__}.{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
    with open("/proc/self/mountinfo") as info:
        result["mounts"] = sorted(line.split()[4] for line in info if line.split()[4].startswith(str(base)))
    try:
        result["victim_kept"] = spec["plan_only"] or (base / "victim-mount/keep").read_text() == "kept\n"
    except OSError:
        result["victim_kept"] = False
    print(json.dumps(result))


if __name__ == "__main__":
    if sys.argv[1:2] == ["kernel-root-child"]:
        kernel_root_child(sys.argv[2])
    else:
        sys.exit("run through benchmarks/fuzz.py --family kernel-names|journals|kernel-root|fork-frames")
