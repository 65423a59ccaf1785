"""A kernel-build-like load for lab guests: ``python3 -m ticklab.lab.kbuild --files N --jobs J``.

Seed 001 timed Linux kernel builds. The guest image cannot carry gcc and a kernel tree, so this
generates a source tree shaped like one (many C files, each including a few of a set of shared
headers, a Makefile with one compile per object writing a dependency file, and a final relocatable
link of every object) and builds it with ``make -jJ`` and Debian's tcc: many short processes that
fork, exec, read headers, write objects and exit, which is what makes a kernel build contend on the
kernel's locks (runqueues, page allocator, dcache, tmpfs inodes). The tree is generated before the
clock starts, in a directory of its own that is removed afterwards, so only the build is timed and
only its output stays in the run directory.

With ``--lock-threads N --lockhammer PATH`` (tools/bin/lockhammer) a lock-bound load runs beside the build, from
just before its clock starts until the build ends: N threads on one kernel spinlock (a futex hash bucket's), so
waiters queue on one lock while the build's processes take the host CPUs from under the vCPUs that hold it.

Around the build it reads the lock event counters (CONFIG_LOCK_EVENT_COUNTS, debugfs
lock_event_counts/) and prints the build's share of each (after minus before), so every run shows
which spinlock path ran: the pv slow path's waits and kicks, the kick-aheads of pv_kick_ahead=, and
the lab backend's halts (pv_lab_*). Output, on stdout::

    # kbuild: 1
    # files: 480
    # functions: 4
    # jobs: 4
    # compiler: tcc version 0.9.27 ...
    # build_seconds: 41.237
    # lock_event pv_kick_ahead: 312
    ...
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LOCK_EVENTS = Path("/sys/kernel/debug/lock_event_counts")
# Counters that are plain event counts (the pv_latency_* and pv_hash_hops files print averages).
AVERAGED = ("pv_latency_kick", "pv_latency_wake", "pv_hash_hops")
HEADERS = 24
HEADERS_PER_FILE = 8
FUNCTIONS_PER_FILE = 24


class KbuildError(RuntimeError):
    pass


def lock_event_counts(root: Path = LOCK_EVENTS) -> dict[str, int]:
    """Every counting lock event the kernel exposes, by name."""
    if not root.is_dir():
        raise KbuildError(f"{root}: missing; the kernel needs CONFIG_LOCK_EVENT_COUNTS and debugfs mounted")
    counts = {}
    for path in sorted(root.iterdir()):
        if path.name.startswith(".") or path.name in AVERAGED:
            continue
        try:
            counts[path.name] = int(path.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return counts


def _header(index: int) -> str:
    lines = [f"#ifndef KB_H{index}", f"#define KB_H{index}", ""]
    for k in range(8):
        lines.append(f"#define KB_H{index}_C{k} ({index * 131 + k * 7}u)")
    lines.append(f"struct kb_s{index} {{ unsigned long a, b; int c[{4 + index % 5}]; struct kb_s{index} *next; }};")
    for k in range(6):
        lines += [
            f"static inline unsigned long kb_h{index}_f{k}(unsigned long x)",
            "{",
            f"\treturn (x * KB_H{index}_C{k % 8} + {k}u) ^ (x >> {1 + k % 7});",
            "}",
        ]
    lines += ["", "#endif", ""]
    return "\n".join(lines)


def _source(index: int, headers: list[int], functions: int) -> str:
    lines = [f'#include "kb{h}.h"' for h in headers] + [""]
    for f in range(functions):
        h = headers[f % len(headers)]
        lines += [
            f"unsigned long kb_{index}_{f}(unsigned long n, struct kb_s{h} *s)",
            "{",
            "\tunsigned long acc = 0, i;",
            "\tfor (i = 0; i < n; i++) {",
            f"\t\tacc += kb_h{h}_f{f % 6}(i) + (s ? s->a : 0);",
            f"\t\tif (acc & KB_H{h}_C{f % 8})",
            "\t\t\tacc ^= i << 3;",
            "\t\telse",
            "\t\t\tacc -= i;",
            "\t}",
            "\tswitch (acc & 3) {",
            "\tcase 0: return acc + 1;",
            "\tcase 1: return acc * 3;",
            "\tcase 2: return acc >> 1;",
            "\tdefault: return acc;",
            "\t}",
            "}",
            "",
        ]
    return "\n".join(lines)


MAKEFILE = """\
CC := tcc
OBJS := $(patsubst %.c,%.o,$(sort $(wildcard src/*.c)))

built-in.o: $(OBJS)
\t$(CC) -r -o $@ $(OBJS)

src/%.o: src/%.c
\t$(CC) -c -Iinclude -MD -MF $(@:.o=.d) -o $@ $<

-include $(wildcard src/*.d)
"""


def generate(tree: Path, files: int, seed: int, functions: int = FUNCTIONS_PER_FILE) -> None:
    """The source tree: include/kb<i>.h, src/f<i>.c, Makefile."""
    rng = random.Random(seed)
    (tree / "include").mkdir(parents=True)
    (tree / "src").mkdir()
    for index in range(HEADERS):
        (tree / "include" / f"kb{index}.h").write_text(_header(index))
    for index in range(files):
        (tree / "src" / f"f{index}.c").write_text(
            _source(index, sorted(rng.sample(range(HEADERS), HEADERS_PER_FILE)), functions)
        )
    (tree / "Makefile").write_text(MAKEFILE)


def compiler_version() -> str:
    result = subprocess.run(["tcc", "-v"], capture_output=True, text=True, check=False)
    return (result.stdout or result.stderr).strip().splitlines()[0] if (result.stdout or result.stderr) else "tcc"


def start_hammer(lockhammer: str, threads: int) -> subprocess.Popen:
    """tools/bin/lockhammer with ``threads`` threads, once it says they are running."""
    try:
        process = subprocess.Popen([lockhammer, str(threads)], stdout=subprocess.PIPE, text=True)
    except OSError as exc:
        raise KbuildError(f"{lockhammer}: cannot start ({exc.strerror or exc}); run 'make tools'") from None
    first = process.stdout.readline()
    if not first.startswith("# lockhammer: started"):
        process.kill()
        process.wait()
        raise KbuildError(f"{lockhammer} {threads}: did not start its threads ({first.strip() or 'no output'})")
    return process


def stop_hammer(process: subprocess.Popen) -> int:
    """Stop the lock-bound load; the futex calls it made."""
    process.terminate()
    out, _ = process.communicate()
    for line in out.splitlines():
        if line.startswith("# futex_calls: "):
            return int(line.split(": ", 1)[1])
    raise KbuildError(f"lockhammer exited {process.returncode} without its count")


def build(
    files: int,
    jobs: int,
    seed: int = 1,
    workdir: Path | None = None,
    counters: Path = LOCK_EVENTS,
    functions: int = FUNCTIONS_PER_FILE,
    lock_threads: int = 0,
    lockhammer: str | None = None,
) -> dict:
    """Generate, then time ``make -j<jobs>`` (with ``lock_threads`` > 0, beside the lock-bound load); the seconds,
    each lock event's count during the build and the lock-bound load's futex calls."""
    for program in ("make", "tcc"):
        if shutil.which(program) is None:
            raise KbuildError(f"{program} is not installed (the guest image carries it: runners/vm/image.yaml)")
    if lock_threads and not lockhammer:
        raise KbuildError("--lock-threads needs --lockhammer (tools/bin/lockhammer)")
    with tempfile.TemporaryDirectory(prefix="kbuild-", dir=workdir) as tree_name:
        tree = Path(tree_name)
        generate(tree, files, seed, functions)
        hammer = start_hammer(lockhammer, lock_threads) if lock_threads else None
        try:
            before = lock_event_counts(counters)
            started = time.monotonic()
            result = subprocess.run(
                ["make", "-s", f"-j{jobs}", "-C", str(tree)], capture_output=True, text=True, check=False
            )
            seconds = time.monotonic() - started
            after = lock_event_counts(counters)
        finally:
            futex_calls = stop_hammer(hammer) if hammer else None
        if result.returncode != 0:
            raise KbuildError(
                f"make -j{jobs} failed (exit {result.returncode}): {(result.stdout + result.stderr)[-500:]}"
            )
        objects = len(list((tree / "src").glob("*.o")))
        if objects != files or not (tree / "built-in.o").is_file():
            raise KbuildError(f"make built {objects} of {files} objects")
    return {
        "seconds": seconds,
        "events": {name: after[name] - before.get(name, 0) for name in after},
        "futex_calls": futex_calls,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m ticklab.lab.kbuild", description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, required=True, help="C files in the generated tree")
    parser.add_argument("--jobs", type=int, required=True, help="make -j")
    parser.add_argument(
        "--functions", type=int, default=FUNCTIONS_PER_FILE, help="functions per C file (compile length)"
    )
    parser.add_argument("--seed", type=int, default=1, help="seeds which headers each file includes")
    parser.add_argument(
        "--lock-threads", type=int, default=0, help="threads of the lock-bound load beside the build (0: none)"
    )
    parser.add_argument(
        "--lock-threads-per-cpu",
        type=int,
        default=0,
        help="threads of the lock-bound load per CPU of this machine (instead of --lock-threads)",
    )
    parser.add_argument("--lockhammer", help="the lock-bound load's program (tools/bin/lockhammer)")
    args = parser.parse_args(argv)
    if min(args.files, args.jobs, args.functions) < 1 or min(args.lock_threads, args.lock_threads_per_cpu) < 0:
        parser.error("--files, --jobs and --functions must be at least 1, --lock-threads[-per-cpu] at least 0")
    if args.lock_threads_per_cpu:
        args.lock_threads = args.lock_threads_per_cpu * (os.cpu_count() or 1)
    try:
        done = build(
            args.files,
            args.jobs,
            args.seed,
            functions=args.functions,
            lock_threads=args.lock_threads,
            lockhammer=args.lockhammer,
        )
    except KbuildError as exc:
        print(f"kbuild: {exc}", file=sys.stderr)
        return 1
    print("# kbuild: 1")
    print(f"# files: {args.files}")
    print(f"# functions: {args.functions}")
    print(f"# jobs: {args.jobs}")
    print(f"# cpus: {os.cpu_count()}")
    print(f"# compiler: {compiler_version()}")
    print(f"# build_seconds: {done['seconds']:.3f}")
    if args.lock_threads:
        print(f"# lock_threads: {args.lock_threads}")
        print(f"# lock_futex_calls: {done['futex_calls']}")
    for name, count in done["events"].items():
        print(f"# lock_event {name}: {count}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
