"""Fuzz families of issue 27 (boot plans): tampered plan state and kernel command-line words.

``plan-state``: a boot plan made by ``ticklab capture nohz --boot manual|grub`` on a fake root (its unit, link,
grub entry and journal installed, its bundle open), then one tampering of ``plan.json``, ``host-changes.json``,
``plan.lock`` or the kept experiment (a key removed, a type changed, a huge value, a byte flipped, a link, a FIFO,
a directory, deep nesting ...) and one of ``ticklab plan status|abort|resume`` run in this process through
``cli.main``. Every outcome must be a one-line error (exit 2) or a correct success: an abort or an ending resume that
exits 0 has really removed the unit and its link; a known-bad state accepted is "wrong"; exit 1 (a ticklab bug) is a
traceback.

``cmdline-words``: random ``boot_cmdline`` values (control characters, newlines, quotes, $, ;, braces, grub
keywords, huge lengths) in a host-boot experiment, through the experiment loader, the plan's runs and the grub
writer (``boot_loaders.grub_menu_entries``, what ``create`` checks in grub mode). Accepted only if every menu entry has
exactly one ``linux`` line and at most one ``initrd`` line and its command line is the condition's words; a value
holding a control character accepted is "wrong".
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
from pathlib import Path

from fuzzcases import Outcome, classify

RELEASE = "6.12.57-ticklab"
ORIGINAL = f"BOOT_IMAGE=/boot/vmlinuz-{RELEASE} root=/dev/vda1 ro quiet"
EXPERIMENT = """claim: nohz
name: host-boot-echo
description: Two command lines, one boot per run.
runs: 2
warmup: 0
seed: 11
requires: []
conditions:
  - {name: tick-on, kernel: running, boot: "-nohz_full"}
  - {name: nohz-full, kernel: running, boot: "nohz_full={last_cpu}"}
knobs:
  kernel: host_kernel
  boot: boot_cmdline
workload:
  tool: hackbench
  argv: ["sh", "-c", "echo Time: 1.0$$"]
"""
UNIT = "etc/systemd/system/ticklab-plan.service"
LINK = "etc/systemd/system/multi-user.target.wants/ticklab-plan.service"


def fake_host(root: Path) -> Path:
    """A fake root a boot plan runs on (the tree of tests/conftest.make_fake_host, with boot files and grub)."""

    def put(relative: str, text: str) -> None:
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")

    put("proc/sys/kernel/osrelease", RELEASE)
    put("proc/cmdline", ORIGINAL)
    put("proc/sys/kernel/random/boot_id", "boot-0")
    put("proc/cpuinfo", "".join(f"processor\t: {n}\nmodel name\t: Fake CPU\nflags\t\t: fpu tsc\n\n" for n in range(2)))
    put("sys/devices/system/cpu/online", "0-1")
    put("sys/devices/system/clocksource/clocksource0/available_clocksource", "tsc hpet")
    put("sys/devices/system/clocksource/clocksource0/current_clocksource", "tsc")
    put("sys/devices/system/cpu/cpuidle/current_driver", "none")
    put("sys/kernel/debug/sched/features", "GENTLE_FAIR_SLEEPERS NO_HRTICK")
    put(
        "boot/grub/grub.cfg",
        "### BEGIN /etc/grub.d/41_custom ###\nif [ -f  ${config_directory}/custom.cfg ]; then\n"
        "  source ${config_directory}/custom.cfg\nfi",
    )
    put("boot/grub/custom.cfg", "menuentry 'mine' { }")
    for release in (RELEASE, "6.12.99-ticklab-abc"):
        put(f"boot/vmlinuz-{release}", "kernel")
        put(f"boot/initrd.img-{release}", "initrd")
    (root / "run/systemd/system").mkdir(parents=True, exist_ok=True)
    (root / "var/lib").mkdir(parents=True, exist_ok=True)
    return root


def fake_tools(directory: Path) -> None:
    """kexec, grub-reboot, grub-editenv and systemctl that do nothing (first on PATH in every process here)."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in ("kexec", "grub-reboot", "grub-editenv", "systemctl"):
        tool = directory / name
        tool.write_text("#!/bin/sh\nexit 0\n")
        tool.chmod(0o755)
    if not os.environ["PATH"].startswith(f"{directory}:"):
        os.environ["PATH"] = f"{directory}:{os.environ['PATH']}"


def _cli(argv: list[str]) -> tuple[int, str, str]:
    from ticklab.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


# -- plan-state ------------------------------------------------------------------------------------------

REQUIRED_PLAN_KEYS = ("id", "mode", "bundle", "original", "runs", "state")
REQUIRED_RUN_KEYS = ("name", "condition", "kernel", "cmdline", "state")
NULLABLE = {
    "pid",
    "pid_start",
    "before",
    "wanted",
    "during",
    "after",
    "feature",
    "label",
    "error",
    "tasks",
    "moved_at",
    "cpu",
    "boot_id",
    "initrd",
    "release",
    "boot_id_before",
    "boot_id_found",
    "release_found",
    "cmdline_found",
    "why",
    "record",
    "ended_because",
}
VALUES = [
    "x",
    "",
    5,
    -1,
    0,
    1.5,
    1e308,
    None,
    True,
    False,
    [],
    {},
    ["a"],
    {"a": 1},
    "a\nb",
    "../../etc/passwd",
    "running",
    "booting",
    "kexec",
    "\x00",
    "é" * 3,
]


def _json_type(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return {str: "string", list: "array", dict: "object"}[type(value)]


def _paths(data, prefix=()):
    """Every (path, value) below ``data``: dict keys and list indices."""
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    for key, value in items:
        yield (*prefix, key), value
        yield from _paths(value, (*prefix, key))


class PlanStateFamily:
    name = "boot plan state: plan status / abort / resume"
    key = "plan-state"
    MODES = ("manual", "grub")

    def prepare(self, seeds: Path) -> None:
        self.seeds = seeds
        fake_tools(seeds / "plan-tools")
        for mode in self.MODES:
            pristine = seeds / f"plan-pristine-{mode}"
            if pristine.is_dir():
                continue
            live = seeds / f"plan-{mode}"
            root = fake_host(live / "root")
            (live / "host-boot-echo.yaml").write_text(EXPERIMENT)
            code, _, err = _cli(
                [
                    "capture",
                    "nohz",
                    "--boot",
                    mode,
                    "--experiment",
                    str(live / "host-boot-echo.yaml"),
                    "--root",
                    str(root),
                    "--journal",
                    str(live / "state" / "journal.json"),
                    "--out",
                    str(live / "traces"),
                    "--host-id",
                    "fake-boots",
                ]
            )
            if code != 0:
                raise SystemExit(f"plan-state: the seed capture failed: {err}")
            shutil.copytree(live, pristine, symlinks=True)

    def _fresh(self, mode: str) -> Path:
        """The seed plan, as made, at the path it was made at (its journal, unit and plan name that path)."""
        live = self.seeds / f"plan-{mode}"
        if live.exists():
            for path in [live, *live.rglob("*")]:
                if not path.is_symlink() and path.is_dir():
                    path.chmod(0o700)
            shutil.rmtree(live)
        shutil.copytree(self.seeds / f"plan-pristine-{mode}", live, symlinks=True)
        return live / "root"

    def case(self, source, work: Path) -> Outcome:
        mode = source.choice(self.MODES)
        root = self._fresh(mode)
        [directory] = list((root / "var/lib/ticklab/plans").iterdir())
        target = source.choice(
            [
                "plan.json",
                "plan.json",
                "plan.json",
                "host-changes.json",
                "host-changes.json",
                "plan.lock",
                "host-boot-experiment.yaml",
            ]
        )
        path = directory / target
        command = source.choice(["status", "abort", "resume"])
        rebooted = source.integer(0, 7) == 0  # a real next boot: resume makes the run (slower: the workload runs)
        kind, known_bad = self._tamper(source, path, target, command)
        if rebooted:
            plan = json.loads((directory / "plan.json").read_text()) if kind == "intact" else None
            cmdline = plan["runs"][0]["cmdline"] if plan else "root=/dev/vda1 ro quiet"
            (root / "proc/sys/kernel/random/boot_id").write_text("boot-1\n")
            (root / "proc/cmdline").write_text(cmdline + "\n")
        detail = f"{mode} {target} {kind} -> plan {command}{' (rebooted)' if rebooted else ''}"

        try:
            code, out, err = _cli(["plan", command, "--root", str(root)])
        except Exception as exc:  # cli.main lets nothing out but this family's own failures
            return Outcome("traceback", f"{detail}: {type(exc).__name__}: {exc}"[:400], known_bad)
        lines = err.strip().splitlines()
        if code == 1 or "a ticklab bug" in err or code not in (0, 2) or (code == 2 and len(lines) != 1):
            return Outcome("traceback", f"{detail}: exit {code}: {' | '.join(lines)[-300:]}", known_bad)
        if code == 2:
            return Outcome("error", f"{detail}: {lines[0][:300]}", known_bad)
        problem = self._check(out, root, directory, command, known_bad)
        return Outcome("wrong" if problem else "accepted", f"{detail}: {problem or ''}", known_bad)

    @staticmethod
    def _check(text: str, root: Path, directory: Path, command: str, known_bad: bool) -> str | None:
        """Why an exit 0 is wrong, or None."""
        if known_bad:
            return f"a known-bad plan state was accepted by plan {command}"
        try:
            state = json.loads((directory / "plan.json").read_text())["state"]
        except (OSError, ValueError, KeyError, TypeError):
            state = None
        if command == "abort" or (command == "resume" and state != "running"):
            left = [p for p in (UNIT, LINK) if os.path.lexists(root / p)]
            if left:
                return f"plan {command} exited 0 but {left[0]} is still there"
        return None

    def _tamper(self, source, path: Path, target: str, command: str) -> tuple[str, bool]:
        """One tampering of ``path``; whether the command must refuse it."""
        reads = {
            "plan.json": True,
            "host-changes.json": command in ("abort", "resume"),
            "plan.lock": command in ("abort", "resume"),
            "host-boot-experiment.yaml": False,
        }[target]
        kind = source.choice(
            [
                "intact",
                "remove key",
                "type change",
                "huge value",
                "flip",
                "truncate",
                "link",
                "fifo",
                "directory",
                "delete",
                "deep nesting",
                "empty",
                "not json",
            ]
        )
        if kind == "intact":
            return kind, False
        if kind in ("link", "fifo", "directory", "delete"):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
            if kind == "link":
                other = source.choice([path.parent / "plan.json", Path("/etc/hostname"), path.parent.parent])
                path.symlink_to(other)
            elif kind == "fifo":
                os.mkfifo(path, 0o600)
            elif kind == "directory":
                path.mkdir()
            # a missing journal or lock is no error (the abort puts back what is there; the lock is made anew)
            bad = reads and not (kind == "delete" and target in ("host-changes.json", "plan.lock"))
            return f"{kind}", bad
        if target in ("plan.lock", "host-boot-experiment.yaml") or not path.is_file():
            raw = path.read_bytes() if path.is_file() else b""
            if kind == "flip" and raw:
                at = source.integer(0, len(raw) - 1)
                raw = raw[:at] + bytes([raw[at] ^ source.integer(1, 255)]) + raw[at + 1 :]
            elif kind == "huge value":
                raw = raw + b"#" * source.choice([10, 10**5, 3 * 10**6])
            elif kind in ("truncate", "empty"):
                raw = raw[: source.integer(0, len(raw))] if kind == "truncate" and raw else b""
            path.write_bytes(raw)
            return f"{kind} (unstructured)", False
        data = json.loads(path.read_text())
        if kind == "flip":
            raw = path.read_bytes()
            at = source.integer(0, len(raw) - 1)
            raw = raw[:at] + bytes([raw[at] ^ source.integer(1, 255)]) + raw[at + 1 :]
            path.write_bytes(raw)
            try:
                same = json.loads(raw) == data
            except ValueError:
                return "flip (not JSON any more)", reads
            return f"flip{' (same JSON)' if same else ''}", False
        if kind == "truncate":
            raw = path.read_bytes()
            path.write_bytes(raw[: source.integer(0, len(raw) - 1)])
            return kind, reads
        if kind == "empty":
            path.write_bytes(b"")
            return kind, reads
        if kind == "not json":
            path.write_bytes(source.choice([b"[]", b"null", b"42", b'"plan"', b"{", b"NaN", b"\xff\xfe"]))
            return kind, reads
        if kind == "deep nesting":
            depth = source.choice([50, 5000, 200000])
            path.write_text("[" * depth + "]" * depth)
            return f"{kind} {depth}", reads
        paths = [p for p in _paths(data) if p[0][0] != "capture" and not (len(p[0]) > 2 and p[0][2] == "record")]
        where, value = source.choice(paths)
        parent = data
        for key in where[:-1]:
            parent = parent[key]
        if kind == "remove key":
            if isinstance(parent, list):
                parent.pop(where[-1])
                bad = target == "plan.json" and where == ("runs", 0) and len(parent) == 0
            else:
                parent.pop(where[-1])
                required = (
                    REQUIRED_PLAN_KEYS
                    if len(where) == 1
                    else REQUIRED_RUN_KEYS
                    if where[0] == "runs" and len(where) == 3
                    else ("release", "cmdline", "boot_id")
                    if where[0] == "original"
                    else ()
                )
                journal_required = ("changes",) if len(where) == 1 else ("kind", "path") if len(where) == 3 else ()
                bad = where[-1] in (required if target == "plan.json" else journal_required)
            path.write_text(json.dumps(data))
            return f"remove {'.'.join(map(str, where))}", bad and reads
        if kind == "type change":
            new = source.choice(VALUES)
            parent[where[-1]] = new
            path.write_text(json.dumps(data))
            # null where ticklab itself may write null (an optional field, a pid_start /proc did not give) is valid
            bad = (
                value is not None
                and _json_type(new) != _json_type(value)
                and not (new is None and where[-1] in NULLABLE)
            )
            return f"{'.'.join(map(str, where))}: {_json_type(value)} -> {new!r}"[:120], bad and reads
        # huge value: a long string in place of a value
        size = source.choice([10**3, 10**5, 17 * 2**20])
        parent[where[-1]] = "x" * size
        path.write_text(json.dumps(data))
        over = size > (16 if target == "plan.json" else 64) * 2**20  # more than a plan or journal holds
        return f"huge {'.'.join(map(str, where))} ({size} characters)", reads and (
            over or (value is not None and not isinstance(value, str))
        )


# -- cmdline-words -----------------------------------------------------------------------------------------

PIECES = [
    "nohz_full=1",
    "quiet",
    "-rcu_nocbs",
    "{last_cpu}",
    "{nproc}",
    "init=/bin/sh",
    "console=ttyS0,115200",
    "\n",
    "\r",
    "\t",
    "\x00",
    "\x1b",
    "\x7f",
    "\x85",
    "\u2028",
    "\x0b",
    "\x0c",
    " ",
    "  ",
    "'",
    '"',
    "$",
    ";",
    "{",
    "}",
    "\\",
    "linux",
    "initrd",
    "menuentry",
    "search",
    "set",
    "source",
    "#",
    "`",
    "&&",
    "|",
    "é",
    "=",
    "a" * 300,
    ".",
    "[0]",
    ":>99999999",
    "!r",
    "{{",
    "}}",
    "{last_cpu:>9}",
    "{nproc.real}",
]


class CmdlineWordsFamily:
    name = "kernel command-line words: experiment loader and grub writer"
    key = "cmdline-words"

    def prepare(self, seeds: Path) -> None:
        self.root = seeds / "words-root"
        if not (self.root / "boot/grub/grub.cfg").is_file():
            fake_host(self.root)

    def case(self, source, work: Path) -> Outcome:
        import yaml

        from ticklab.capture.boot_capture import boot_experiment, planned_runs
        from ticklab.host import boot_loaders, plan_state

        def text() -> str:
            parts = [source.choice(PIECES) for _ in range(source.integer(1, 8))]
            if source.integer(0, 9) == 0:
                parts.append(source.choice(["x", "\n", "y "]) * source.choice([5000, 100000]))
            return "".join(parts)

        shape = source.choice(["string", "string", "list", "number"])
        value = (
            text()
            if shape == "string"
            else [text() for _ in range(source.integer(1, 3))]
            if shape == "list"
            else source.choice([7, 1.5, -3])
        )
        definition = yaml.safe_load(EXPERIMENT)
        index = source.integer(0, 1)
        definition["conditions"][index]["boot"] = value
        changed = definition["conditions"][index]["name"]
        path = work / "host-boot-words.yaml"
        path.write_text(yaml.safe_dump(definition))
        words = (
            value.split()
            if isinstance(value, str)
            else [str(w) for w in value]
            if isinstance(value, list)
            else [str(value)]
        )
        flat = " ".join(value) if isinstance(value, list) else str(value)
        known_bad = any(not c.isprintable() and c != " " for c in flat)
        entries_made = []

        def run():
            experiment = boot_experiment("nohz", path)
            runs = planned_runs(experiment, self.root, runs=1, warmup=0, seed=1)
            plan = plan_state.Plan(
                "words",
                "grub",
                str(work / "bundle"),
                {"release": RELEASE, "cmdline": ORIGINAL, "boot_id": "boot-0"},
                runs,
            )
            for planned in runs:
                planned.release = planned.release or RELEASE
            entries_made.extend(boot_loaders.grub_menu_entries(plan, self.root))
            return runs

        def check(runs) -> str | None:
            for planned, entry in zip(runs, entries_made, strict=False):
                lines = entry.splitlines()
                linux = [line for line in lines if line.split()[:1] == ["linux"]]
                initrd = [line for line in lines if line.split()[:1] == ["initrd"]]
                if len(linux) != 1 or len(initrd) > 1 or len(lines) != 4 + len(initrd):
                    return f"entry of {len(lines)} lines, {len(linux)} linux, {len(initrd)} initrd: {entry[:200]!r}"
                if linux[0].split(" ")[4:] != planned.cmdline.split(" "):
                    return f"linux line {linux[0][:200]!r} is not the run's command line {planned.cmdline[:200]!r}"
                if planned.condition == changed:
                    filled = [w.replace("{last_cpu}", "1").replace("{nproc}", "2") for w in words]
                    expected = plan_state.condition_cmdline(ORIGINAL, filled)
                    if planned.cmdline != expected:
                        return f"command line {planned.cmdline[:200]!r} is not the condition's words {expected[:200]!r}"
            return None

        outcome = classify(run, known_bad=known_bad, check=check)
        outcome.detail = f"{shape} {flat[:60]!r}: {outcome.detail}"
        return outcome
