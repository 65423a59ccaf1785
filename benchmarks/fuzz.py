"""make fuzz: the fault and bad-input campaign of issue 14, >= 10,000 generated inputs per loader family.

Each input runs in a worker process with a deadline (--timeout, default 10 s): an input that does not
finish in time is a hang, the worker is killed and a fresh one goes on. Memory is capped (--memory-gb)
so a huge allocation fails as a MemoryError instead of swapping. Prints the table of the issue; every
traceback, hang and wrong result is listed with the command that replays it:

    .venv/bin/python benchmarks/fuzz.py [--inputs N] [--family bundle trace workload published cli ...]
    .venv/bin/python benchmarks/fuzz.py --replay trace:1234     # one input, in this process, with its traceback
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import resource
import shutil
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fuzzcases import RandomSource
from fuzzcases_all import FAMILIES

BY_KEY = {family.key: family for family in FAMILIES}


def source_for(key: str, seed: int, index: int) -> RandomSource:
    return RandomSource(f"{key}:{seed}:{index}")


def _worker(connection, keys: list[str], seeds: str, seed: int, memory_gb: float) -> None:
    limit = int(memory_gb * (1 << 30))
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    work = Path(seeds) / f"work-{os.getpid()}"  # under the seeds directory: removed with it, even after a kill
    work.mkdir()
    for key in keys:
        BY_KEY[key].prepare(Path(seeds))
    connection.send("ready")
    while True:
        message = connection.recv()
        if message is None:
            return
        key, index = message
        try:
            outcome = BY_KEY[key].case(source_for(key, seed, index), work)
            connection.send((outcome.kind, outcome.detail, outcome.known_bad))
        except BaseException as exc:  # the campaign machinery itself failed on this input
            connection.send(("traceback", f"fuzz harness: {type(exc).__name__}: {exc}", False))


class Worker:
    def __init__(self, keys, seeds, seed, memory_gb):
        self.args = (keys, seeds, seed, memory_gb)
        self.start()

    def start(self):
        context = multiprocessing.get_context("fork")
        self.parent, child = context.Pipe()
        self.process = context.Process(target=_worker, args=(child, *self.args), daemon=True)
        self.process.start()
        if not self.parent.poll(600) or self.parent.recv() != "ready":
            raise SystemExit("fuzz: the worker did not start")

    def run(self, key: str, index: int, timeout: float):
        self.parent.send((key, index))
        if self.parent.poll(timeout):
            try:
                return self.parent.recv()
            except EOFError:
                pass
            self.process.join(5)
            code = self.process.exitcode
            self.start()
            return ("traceback", f"worker died (exit {code}) — a crash, not a Python exception", False)
        self.process.kill()
        self.process.join()
        self.start()
        return ("hang", f"no answer within {timeout} s", False)

    def stop(self):
        try:
            self.parent.send(None)
        except OSError:
            pass
        self.process.join(10)
        if self.process.is_alive():
            self.process.kill()


def campaign(keys: list[str], inputs: int, seed: int, timeout: float, memory_gb: float, show: int) -> int:
    seeds = Path(tempfile.mkdtemp(prefix="ticklab-fuzz-seeds-"))
    try:
        return _campaign(seeds, keys, inputs, seed, timeout, memory_gb, show)
    finally:
        _remove(seeds)


def _remove(directory: Path) -> None:
    for path in [directory, *directory.rglob("*")]:  # bundles are sealed read-only
        if not path.is_symlink() and path.exists():
            path.chmod(0o700)
    shutil.rmtree(directory, ignore_errors=True)


def _campaign(seeds: Path, keys: list[str], inputs: int, seed: int, timeout: float, memory_gb: float, show: int) -> int:
    for key in keys:  # build the seed files once, here, so workers only copy them
        BY_KEY[key].prepare(seeds)
    rows, examples = [], {}
    progress = sys.stderr.isatty()
    for key in keys:
        family = BY_KEY[key]
        counts, samples = Counter(), {}
        worker = Worker([key], str(seeds), seed, memory_gb)
        started = time.monotonic()
        try:
            for index in range(inputs):
                kind, detail, known_bad = worker.run(key, index, timeout)
                counts[kind] += 1
                counts["known bad"] += bool(known_bad)
                if kind in ("traceback", "hang", "wrong"):
                    samples.setdefault(kind, []).append((index, detail))
                if progress and index % 100 == 0:
                    print(f"\r{family.name}: {index}/{inputs}", end="", file=sys.stderr, flush=True)
        finally:
            worker.stop()
        if progress:
            print("\r" + " " * 60 + "\r", end="", file=sys.stderr)
        rows.append((family, counts, time.monotonic() - started))
        examples[key] = samples
    print(
        "| campaign | inputs | clear error | traceback | hang | silently accepted or wrong "
        "| accepted (valid or undetectable) | seconds |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for family, counts, seconds in rows:
        total = sum(counts[k] for k in ("error", "traceback", "hang", "wrong", "accepted"))
        print(
            f"| {family.name} | {total:,} | {counts['error']:,} | {counts['traceback']:,} | {counts['hang']:,} | "
            f"{counts['wrong']:,} | {counts['accepted']:,} | {seconds:.0f} |"
        )
    bad = 0
    for family, _counts, _ in rows:
        for kind, cases in examples[family.key].items():
            bad += len(cases)
            kinds = Counter(detail.split(":", 1)[0] for _, detail in cases)
            print(
                f"\n{family.name}: {len(cases)} {kind}(s); by input kind: "
                + ", ".join(f"{name} {n}" for name, n in kinds.most_common(8))
            )
            for index, detail in cases[:show]:
                print(f"  --replay {family.key}:{index} (seed {seed})  {detail[:240]}")
    return 1 if bad else 0


def replay(spec: str, seed: int) -> int:
    key, index = spec.split(":")
    family = BY_KEY[key]
    seeds = Path(tempfile.mkdtemp(prefix="ticklab-fuzz-seeds-"))
    family.prepare(seeds)
    work = seeds / "work"
    work.mkdir()
    import fuzzcases

    original = fuzzcases.classify

    def loud(call, **kwargs):  # show the traceback of this one input
        try:
            return original(call, **kwargs)
        finally:
            try:
                call()
            except Exception:
                traceback.print_exc()

    # every family module's classify: those that imported the name as well as those that call fuzzcases.classify
    patched = [
        m
        for m in list(sys.modules.values())
        if getattr(m, "__name__", "").startswith("fuzzcases") and getattr(m, "classify", None) is original
    ]
    for module in patched:
        module.classify = loud
    try:
        outcome = family.case(source_for(key, seed, int(index)), work)
    finally:
        for module in patched:
            module.classify = original
        _remove(seeds)
    print(f"{outcome.kind}: {outcome.detail}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, default=10000, help="inputs per family (default 10,000)")
    parser.add_argument("--family", nargs="+", choices=list(BY_KEY), default=list(BY_KEY))
    parser.add_argument("--seed", type=int, default=14, help="campaign seed (default 14): input i is reproducible")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds an input may take before it is a hang")
    parser.add_argument("--memory-gb", type=float, default=4.0, help="address-space cap of a worker (default 4 GiB)")
    parser.add_argument("--show", type=int, default=5, help="examples listed per family and outcome")
    parser.add_argument("--replay", metavar="FAMILY:INDEX", help="run one input here and show its traceback")
    args = parser.parse_args(argv)
    os.environ.setdefault("TICKLAB_TRACEBACK", "")
    if args.replay:
        return replay(args.replay, args.seed)
    return campaign(args.family, args.inputs, args.seed, args.timeout, args.memory_gb, args.show)


if __name__ == "__main__":
    sys.exit(main())
