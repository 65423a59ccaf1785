"""The inputs of ticklab's fault and bad-input campaign (issue 14): one family per loader.

Each family builds its seed files once (``prepare``), then ``case(source, work)`` makes one input from
them — a mutation chosen and placed by ``source`` — runs the loader on it through its public API and
classifies what happened:

    error      a ticklab error (its own exception type) with a one-line message
    traceback  any other exception (a bug: the user would see a traceback)
    wrong      a known-bad input accepted, a valid one refused, or accepted with a wrong result
               (fewer trace events from a truncated file, a non-finite metric ...)
    accepted   an input the loader accepted and that is valid or not detectably bad (e.g. a byte flipped
               inside a trace event's payload, a manifest edited *and* re-sealed — see SECURITY.md)

``source`` is a :class:`RandomSource` (make fuzz: seeded, reproducible by index) or a hypothesis
``DrawSource`` (the property tests in tests/test_fuzz.py), so both drive the same mutations.

The other families live in fuzzcases_*.py, which import this module; the list of all of them is
fuzzcases_all.FAMILIES (this module imports none of them: issue 43).
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import json
import lzma
import math
import os
import random
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


@dataclass
class Outcome:
    kind: str  # error | traceback | wrong | accepted
    detail: str = ""
    known_bad: bool = False


class RandomSource:
    def __init__(self, seed: str):
        self.rng = random.Random(seed)

    def integer(self, low: int, high: int) -> int:
        return self.rng.randint(low, high)

    def choice(self, options):
        return options[self.rng.randrange(len(options))]

    def binary(self, max_size: int) -> bytes:
        return self.rng.randbytes(self.rng.randint(0, max_size))


class DrawSource:
    """The same interface over hypothesis's ``data.draw`` (shrinks to the smallest failing mutation)."""

    def __init__(self, data):
        from hypothesis import strategies as st

        self.data, self.st = data, st

    def integer(self, low: int, high: int) -> int:
        return self.data.draw(self.st.integers(low, high))

    def choice(self, options):
        return self.data.draw(self.st.sampled_from(list(options)))

    def binary(self, max_size: int) -> bytes:
        return self.data.draw(self.st.binary(max_size=max_size))


def _is_ours(exc: BaseException) -> bool:
    return type(exc).__module__.split(".")[0] == "ticklab"


# An error line of the families that opt in (bundle, published, cli) is at most this long: every value from the
# input is quoted bounded (ticklab.safefiles.shown), so a huge value or name cannot flood it (issue 27, item 16).
MAX_ERROR_CHARS = 3000


def classify(call, *, known_bad: bool, check=None, bounded: bool = False) -> Outcome:
    """Run ``call``; a ticklab error is 'error' (if one line, and with ``bounded`` at most MAX_ERROR_CHARS long),
    anything else raised a 'traceback'."""
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            result = call()
    except SystemExit as exc:  # argparse: a usage error is a clear error
        return Outcome("error" if exc.code == 2 else "accepted", f"exit {exc.code}", known_bad)
    except Exception as exc:  # classifying every exception is the point
        text = str(exc)
        if _is_ours(exc) and text and "\n" not in text.strip():
            if bounded and len(text) > MAX_ERROR_CHARS:
                return Outcome("wrong", f"unbounded error line ({len(text)} characters): {text[:200]}", known_bad)
            return Outcome("error", text[:300], known_bad)
        return Outcome(
            "traceback", f"{type(exc).__module__}.{type(exc).__name__}: {' '.join(text.split())[:300]}", known_bad
        )
    if known_bad:
        return Outcome("wrong", "a known-bad input was accepted", known_bad)
    problem = check(result) if check else None
    return Outcome("wrong", problem, known_bad) if problem else Outcome("accepted", "", known_bad)


def _flip(data: bytes, source) -> bytes:
    if not data:
        return b"\x00"
    position = source.integer(0, len(data) - 1)
    return data[:position] + bytes([data[position] ^ source.integer(1, 255)]) + data[position + 1 :]


def remove_tree(target: Path) -> None:
    """Whatever a case left at ``target``: a file or link, or a tree made writable first (bundles are sealed
    read-only)."""
    if target.is_symlink() or (target.exists() and not target.is_dir()):
        target.unlink()
    elif target.exists():
        for path in [target, *target.rglob("*")]:
            if not path.is_symlink():
                path.chmod(0o755 if path.is_dir() else 0o644)
        shutil.rmtree(target)


def writable_copy(seed: Path, target: Path) -> Path:
    remove_tree(target)
    shutil.copytree(seed, target, copy_function=shutil.copyfile, symlinks=True)
    return target


# -- bundles ---------------------------------------------------------------------------------------------


class BundleFamily:
    name = "bundle load / verify / compare"
    key = "bundle"

    def prepare(self, seeds: Path) -> None:
        from datetime import UTC, datetime

        from ticklab.bundle import BundleWriter

        self.seed = seeds / "bundle"
        if (self.seed / "manifest.json").is_file():
            return
        writer = BundleWriter(
            seeds / "bundle-build",
            "fuzz-host",
            "nohz",
            "ftq",
            definition={"runs": 3},
            host={"nproc": 2},
            when=datetime(2026, 11, 22, tzinfo=UTC),
        )
        writer.manifest.conditions = [{"name": "hz1000"}, {"name": "hz250"}]
        run = 0
        for condition in ("hz1000", "hz250"):
            for index in range(3):
                run += 1
                name = f"run-{run:03d}"
                raw = writer.run_dir(name)
                (raw / "stdout.txt").write_text(f"Time: {1 + run / 10}\n")
                writer.add_run(
                    {
                        "run": name,
                        "condition": condition,
                        "order": run,
                        "status": "ok",
                        "warmup": False,
                        "problem": None,
                        "trace": {"lost_events": 0},
                    },
                    [{"metric": "runtime_s", "value": 1 + run / 10 + index, "unit": "s"}],
                )
        built = writer.seal()
        shutil.copytree(built, self.seed, symlinks=True)

    # edits that a schema must refuse, applied to the manifest and then re-sealed like an attacker would
    BAD_FIELDS = [
        ("runs.0.warmup", "yes"),
        ("runs.1.run", 5),
        ("runs.2.run", "../x"),
        ("status", "done"),
        ("claim", 1),
        ("runs", "many"),
        ("schema_version", 2),
        ("runs.0.trace", {"lost_events": -1}),
        ("runs.0.trace", {"lost_events": "many"}),
        ("files.../outside.txt", "0" * 64),
        ("files./etc/hostname", "0" * 64),
        ("files.results.csv", "zz"),
        ("experiment", "../../x"),
        ("runs.3.condition", ""),
        ("host", []),
        ("definition", None),
        ("runs.0", "run-001"),
    ]
    GOOD_FIELDS = [
        ("runs.0.status", "failed"),
        ("runs.1.problem", "a guest booted wrong"),
        ("runs.2.trace", {"lost_events": 7}),
        ("not_testable", "no HPET here"),
    ]

    @staticmethod
    def _set(data, dotted: str, value):
        if dotted.startswith("files."):
            data["files"][dotted[6:]] = value
            return
        keys = dotted.split(".")
        for key in keys[:-1]:
            data = data[int(key)] if isinstance(data, list) else data[key]
        data[int(keys[-1]) if isinstance(data, list) else keys[-1]] = value

    @staticmethod
    def _reseal(path: Path, data: dict | None = None, *, files: bool = False) -> None:
        from ticklab.bundle import MANIFEST, SEAL

        manifest = path / MANIFEST
        data = json.loads(manifest.read_text()) if data is None else data
        if files:
            data["files"] = {
                str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(path.rglob("*"))
                if p.is_file() and p.name not in (MANIFEST, SEAL)
            }
        manifest.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
        (path / SEAL).write_text(hashlib.sha256(manifest.read_bytes()).hexdigest() + "  manifest.json\n")

    def case(self, source, work: Path) -> Outcome:
        from ticklab.bundle import load_bundle
        from ticklab.report.compare import compare_tables

        path = writable_copy(self.seed, work / "bundle")
        manifest, results = path / "manifest.json", path / "results.csv"
        kind = source.choice(
            [
                "intact",
                "flip manifest",
                "flip results",
                "flip raw",
                "edit manifest",
                "bad field resealed",
                "good field resealed",
                "bad value resealed",
                "add file",
                "symlink",
                "fifo",
                "delete",
                "truncate manifest",
                "random manifest",
                "nested manifest",
                "truncate results",
                "short row resealed",
                "duplicate row resealed",
                "foreign row resealed",
                "huge value resealed",
                "newline in a name",
            ]
        )
        known_bad = kind not in ("intact", "good field resealed")
        if kind == "flip manifest":
            manifest.write_bytes(_flip(manifest.read_bytes(), source))
        elif kind == "flip results":
            results.write_bytes(_flip(results.read_bytes(), source))
        elif kind == "flip raw":
            raw = path / "raw" / f"run-{source.integer(1, 6):03d}" / "stdout.txt"
            raw.write_bytes(_flip(raw.read_bytes(), source))
        elif kind == "edit manifest":
            data = json.loads(manifest.read_text())
            self._set(data, *source.choice(self.GOOD_FIELDS + self.BAD_FIELDS))
            manifest.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
        elif kind in ("bad field resealed", "good field resealed"):
            data = json.loads(manifest.read_text())
            self._set(data, *source.choice(self.BAD_FIELDS if kind.startswith("bad") else self.GOOD_FIELDS))
            self._reseal(path, data)
        elif kind == "bad value resealed":
            rows = results.read_text().splitlines()
            line = source.integer(1, len(rows) - 1)
            fields = rows[line].split(",")
            fields[3] = source.choice(["nan", "inf", "-inf", "NaN", "fast", "", "1e999", "0x10", "1,5"])
            rows[line] = ",".join(fields)
            results.write_text("\n".join(rows) + "\n")
            self._reseal(path, files=True)
        elif kind in ("duplicate row resealed", "foreign row resealed", "huge value resealed"):
            rows = results.read_text().splitlines()
            line = source.integer(1, len(rows) - 1)
            fields = rows[line].split(",")
            if kind == "duplicate row resealed":
                rows.append(rows[line])
            elif kind == "foreign row resealed":  # a run the manifest lacks, or another run's condition
                which = source.integer(0, 1)
                fields[which] = ["run-099", "hz1000" if fields[1] == "hz250" else "hz250"][which]
                rows[line] = ",".join(fields)
            else:
                fields[source.choice([2, 3, 4])] = source.choice(["9" * 5000, "x" * 100_000])
                rows[line] = ",".join(fields)
            results.write_text("\n".join(rows) + "\n")
            self._reseal(path, files=True)
        elif kind == "newline in a name":
            (path / "raw" / "run-001" / source.choice(["a\nFAIL  b", "x" * 255, "\x1b[2J"])).write_bytes(b"x")
        elif kind == "short row resealed":
            rows = results.read_text().splitlines()
            line = source.integer(1, len(rows) - 1)
            rows[line] = ",".join(rows[line].split(",")[: source.integer(1, 4)])
            results.write_text("\n".join(rows) + "\n")
            self._reseal(path, files=True)
        elif kind == "add file":
            (path / "raw" / "run-001" / source.choice(["extra.txt", ".hidden", "stdout.txt.xz"])).write_bytes(b"x")
        elif kind == "symlink":
            target = path / "raw" / f"run-{source.integer(1, 6):03d}" / "stdout.txt"
            target.unlink()
            target.symlink_to(
                source.choice(["/proc/self/pagemap", "/etc/hostname", "../run-001/stdout.txt", "/dev/zero"])
            )
        elif kind == "fifo":
            target = path / "raw" / f"run-{source.integer(1, 6):03d}" / "stdout.txt"
            target.unlink()
            os.mkfifo(target)
        elif kind == "delete":
            target = source.choice([results, path / "raw" / "run-002" / "stdout.txt", path / "manifest.sha256"])
            target.unlink()
        elif kind == "truncate manifest":
            data = manifest.read_bytes()
            manifest.write_bytes(data[: source.integer(0, len(data) - 1)])
        elif kind == "random manifest":
            manifest.write_bytes(source.binary(200))
        elif kind == "nested manifest":
            depth = source.integer(100, 50000)
            manifest.write_text("[" * depth + "]" * depth)
        elif kind == "truncate results":
            data = results.read_bytes()
            results.write_bytes(data[: source.integer(0, len(data) - 1)])

        def load():
            bundle = load_bundle(path)
            compare_tables([path])
            return bundle

        outcome = classify(load, known_bad=known_bad, bounded=True)
        outcome.detail = f"{kind}: {outcome.detail}"
        return outcome


# -- trace files through the public read API -------------------------------------------------------------

# a trace.dat v7 recorded by trace-cmd in a lab guest, kept as a test fixture (tests/data/compressed/README.md), so
# that recapturing the bundles does not change the campaign
TRACE_SEED_V7 = REPO / "tests" / "data" / "compressed" / "source-trace.dat.xz"


def tracefs_seed() -> Path:
    """The first tracefs capture in the bundled data (a directory with header_page), in sorted order."""
    found = sorted(p.parent for p in (REPO / "traces").glob("*/*/*/raw/*/trace/header_page"))
    if not found:
        raise FileNotFoundError(f"{REPO / 'traces'}: no tracefs capture to seed the trace campaign with")
    return found[0]


class TraceFamily:
    name = "trace ingest"
    key = "trace"

    def prepare(self, seeds: Path) -> None:
        from ticklab.trace.ingest import read_trace

        self.seeds = seeds
        self.kinds = []
        v7 = seeds / "v7.dat"
        if not v7.is_file():
            v7.write_bytes(lzma.decompress(TRACE_SEED_V7.read_bytes()))
        self.kinds.append("v7")
        v6 = seeds / "v6.dat"
        if not v6.is_file() and shutil.which("trace-cmd"):
            subprocess.run(
                ["trace-cmd", "convert", "-i", str(v7), "-o", str(v6), "--file-version", "6", "--compression", "none"],
                capture_output=True,
                timeout=120,
                check=False,
            )
        if v6.is_file():
            self.kinds.append("v6")
        tracefs = seeds / "tracefs"
        if not tracefs.is_dir():
            shutil.copytree(tracefs_seed(), tracefs)
            for packed in tracefs.glob("*.xz"):
                packed.with_suffix("").write_bytes(lzma.decompress(packed.read_bytes()))
                packed.unlink()
        self.kinds.append("tracefs")
        self.events = {kind: sum(read_trace(self._seed(kind)).counts().values()) for kind in self.kinds}

    def _seed(self, kind: str) -> Path:
        return {"v7": self.seeds / "v7.dat", "v6": self.seeds / "v6.dat", "tracefs": self.seeds / "tracefs"}[kind]

    def case(self, source, work: Path) -> Outcome:
        from ticklab.trace.ingest import read_trace

        kind = source.choice(self.kinds)
        seed = self._seed(kind)
        if kind == "tracefs":
            target = writable_copy(seed, work / "tracefs")
            victim = target / source.choice(
                [
                    "cpu0.raw",
                    "cpu1.raw",
                    "cpu0.raw",
                    "cpu1.raw",
                    "header_page",
                    "cpu0.stats",
                    "page_size",
                    "trace_clock",
                    "formats/irq_vectors/local_timer_entry/format",
                ]
            )
        else:
            target = work / "trace.dat"
            shutil.copyfile(seed, target)
            victim = target
        data = victim.read_bytes()
        mutation = source.choice(
            ["intact", "truncate", "truncate at page", "flip", "flip header", "word", "insert", "delete victim"]
            if victim.suffix == ".raw" or victim == target
            else ["flip", "truncate", "insert", "delete victim", "intact"]
        )
        truncated = False
        if mutation == "truncate" and data:
            cut = source.integer(0, len(data) - 1)
            victim.write_bytes(data[:cut])
            truncated = victim.suffix in (".raw", ".dat")
        elif mutation == "truncate at page" and len(data) > 4096:
            cut = 4096 * source.integer(0, len(data) // 4096 - 1)
            victim.write_bytes(data[:cut])
            truncated = True
        elif mutation == "flip":
            victim.write_bytes(_flip(data, source))
        elif mutation == "flip header":
            head = min(len(data), 4096)
            victim.write_bytes(_flip(data[:head], source) + data[head:])
        elif mutation == "word" and len(data) >= 8:
            at = source.integer(0, len(data) - 8)
            word = source.choice(
                [
                    b"\xff" * 8,
                    b"\x7f" + b"\xff" * 7,
                    b"\x00" * 8,
                    (1 << 40).to_bytes(8, "little"),
                    (at).to_bytes(8, "little"),
                ]
            )
            victim.write_bytes(data[:at] + word + data[at + 8 :])
        elif mutation == "insert":
            at = source.integer(0, len(data))
            victim.write_bytes(data[:at] + source.binary(64) + data[at:])
        elif mutation == "delete victim":
            victim.unlink()
        expected = self.events[kind]

        def check(trace):
            found = sum(trace.counts().values())
            if truncated and found < expected:
                return f"truncated {victim.name} loaded with {found} of {expected} events"
            return None

        outcome = classify(lambda: read_trace(target), known_bad=False, check=check)
        outcome.detail = f"{kind} {mutation} {victim.name}: {outcome.detail}"
        outcome.known_bad = truncated
        return outcome


# -- workload outputs --------------------------------------------------------------------------------------


class WorkloadFamily:
    name = "workload parsers"
    key = "workload"

    def prepare(self, seeds: Path) -> None:
        pass

    @staticmethod
    def _valid(tool: str, source) -> tuple[str, str]:
        """(file name, text) as the tool prints it."""
        if tool == "ftq":
            warmup, samples = source.integer(0, 3), source.integer(2, 6)
            lines = [f"{i} {(i + 1) * 1000000 + 17} {source.integer(1, 50000)}" for i in range(warmup + samples)]
            return "ftq.dat", (
                f"# ftq: 1\n# quantum_ns: 1000000\n# samples: {samples}\n# warmup: {warmup}\n" + "\n".join(lines) + "\n"
            )
        if tool == "clockbench":
            threads = source.integer(1, 4)
            rows = [
                f"{t} {t} {source.integer(1, 10**7)} 1000000000 {source.integer(1, 10**7)}.0 "
                f"{source.integer(10, 900)}.50 20 30 40 50"
                for t in range(threads)
            ]
            return "stdout.txt", (
                "# clockbench: 1\n# clock: monotonic\n# threads: " + str(threads) + "\n"
                "thread cpu reads elapsed_ns reads_per_s cost_mean_ns cost_p50_ns cost_p90_ns "
                "cost_p99_ns cost_max_ns\n" + "\n".join(rows) + "\n"
            )
        if tool == "timejobs":
            threads = source.integer(1, 4)
            return "stdout.txt", (
                f"# timejobs: 1\n# threads: {threads}\n# jobs_per_min: {source.integer(1, 10**6)}.5\n"
                "thread cpu jobs ns\n" + "".join(f"{t} {t} 100 1000000000\n" for t in range(threads))
            )
        if tool == "hackbench":
            return "stdout.txt", f"Running in process mode with 2 groups\nTime: {source.integer(1, 9999) / 1000}\n"
        return (
            "stdout.txt",
            f"Throughput {source.integer(1, 99999) / 10} MB/sec  8 clients  8 procs  max_latency=1.0 ms\n",
        )

    BAD_NUMBERS = ["nan", "inf", "-inf", "-5", "-0.5", "99999999999999999999999999", "1e999", "NaN"]

    def case(self, source, work: Path) -> Outcome:
        from ticklab.capture.workloads import PARSERS

        tool = source.choice(sorted(PARSERS))
        name, text = self._valid(tool, source)
        mutation = source.choice(
            ["intact", "bad number", "short row", "drop line", "flip", "truncate", "non-utf8", "header count", "insert"]
        )
        known_bad = mutation in ("bad number", "short row", "drop line", "non-utf8", "header count")
        lines = text.splitlines()
        numeric = [
            (i, j)
            for i, line in enumerate(lines)
            for j, field in enumerate(line.replace(":", " ").split())
            if _number(field)
            and not (line.startswith("#") and tool != "timejobs")
            and not (tool == "hackbench" and not line.startswith("Time"))
            and not (tool == "tbench" and j != 1)
        ]
        if mutation == "bad number" and numeric:
            i, j = source.choice(numeric)
            fields = lines[i].replace(":", ": ").split() if lines[i].startswith("#") else lines[i].split()
            if lines[i].startswith("#"):
                value = source.choice(self.BAD_NUMBERS)
                # a huge rate is absurd but finite: only non-finite or negative values are known bad here
                known_bad = "jobs_per_min" in lines[i] and value != self.BAD_NUMBERS[5]
                lines[i] = lines[i].rsplit(" ", 1)[0] + " " + value
            else:
                fields[j] = source.choice(self.BAD_NUMBERS)
                lines[i] = " ".join(fields)
                # a huge number is a wrong value only where the tool prints a 64-bit integer
                known_bad = fields[j] != self.BAD_NUMBERS[5] or tool == "ftq"
            text = "\n".join(lines) + "\n"
        elif mutation == "short row":
            rows = [
                i
                for i, line in enumerate(lines)
                if line
                and not line.startswith("#")
                and len(line.split()) > 2
                and not line.startswith("thread")
                and tool in ("ftq", "clockbench")
            ]
            if rows:
                i = source.choice(rows)
                lines[i] = " ".join(lines[i].split()[: source.integer(1, len(lines[i].split()) - 1)])
            else:
                known_bad = False
            text = "\n".join(lines) + "\n"
        elif mutation == "drop line":
            rows = [
                i
                for i, line in enumerate(lines)
                if line
                and not line.startswith("#")
                and tool in ("ftq", "clockbench", "timejobs")
                and not line.startswith("thread")
            ]
            if rows:
                del lines[source.choice(rows)]
            else:
                known_bad = False
            text = "\n".join(lines) + "\n"
        elif mutation == "header count":
            if tool in ("ftq", "clockbench", "timejobs"):
                key = {"ftq": "# samples:", "clockbench": "# threads:", "timejobs": "# threads:"}[tool]
                lines = [
                    f"{key} {source.choice(['0', '-1', 'x', '99999999999999999999999', '7'])}"
                    if line.startswith(key)
                    else line
                    for line in lines
                ]
                text = "\n".join(lines) + "\n"
            else:
                known_bad = False
        data = text.encode()
        if mutation == "flip":
            data = _flip(data, source)
        elif mutation == "truncate":
            data = data[: source.integer(0, len(data))]
        elif mutation == "non-utf8":
            at = source.integer(0, len(data))
            data = data[:at] + b"\xff\xfe" + data[at:]
        elif mutation == "insert":
            at = source.integer(0, len(data))
            data = data[:at] + source.binary(16) + data[at:]
        directory = work / "workload"
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        (directory / name).write_bytes(data)

        def check(rows):
            odd = [
                r
                for r in rows
                if not isinstance(r.get("value"), (int, float)) or not math.isfinite(r["value"]) or r["value"] < 0
            ]
            return f"non-finite or negative metric {odd[0]}" if odd else None

        outcome = classify(lambda: PARSERS[tool](directory), known_bad=known_bad, check=check)
        outcome.detail = f"{tool} {mutation}: {outcome.detail}"
        return outcome


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


# -- the published layer -----------------------------------------------------------------------------------


class PublishedFamily:
    name = "published loader"
    key = "published"

    def prepare(self, seeds: Path) -> None:
        from ticklab.paths import published_dir, seeds_dir

        self.seed = seeds / "published"
        if not self.seed.is_dir():
            shutil.copytree(published_dir(), self.seed)
        self.claims = sorted(p.name for p in self.seed.iterdir() if (p / "provenance.yaml").is_file())
        env_seeds = os.environ.get("TICKLAB_SEEDS")
        self.documents = Path(env_seeds) if env_seeds else seeds_dir() or (REPO.parent.parent / "shared" / "seeds")

    BAD_PROVENANCE = [
        ("source.file", "../../etc/hostname"),
        ("source.file", "/etc/hostname"),
        ("source", "text"),
        ("source.sha256", 5),
        ("tables", []),
        ("tables", {}),
        ("source.file", 7),
    ]

    def case(self, source, work: Path) -> Outcome:
        import yaml

        from ticklab.analysis.published import load_published, verify_against_source

        claim = source.choice(self.claims)
        root = work / "published"
        writable_copy(self.seed / claim, root / claim)
        directory = root / claim
        provenance = directory / "provenance.yaml"
        tables = sorted(directory.glob("*.csv"))
        mutation = source.choice(
            [
                "intact",
                "flip provenance",
                "flip csv",
                "bad provenance field",
                "value mismatch",
                "value inf",
                "duplicate id",
                "drop column",
                "truncate csv",
                "non-utf8",
                "table key outside",
                "quote type",
                "token",
                "yaml garbage",
                "blank cell",
                "blank value",
                "huge value",
                "huge provenance",
                "newline in a name",
            ]
        )
        known_bad = mutation not in ("intact", "flip provenance", "flip csv", "truncate csv")
        if mutation == "flip provenance":
            provenance.write_bytes(_flip(provenance.read_bytes(), source))
        elif mutation == "flip csv":
            table = source.choice(tables)
            table.write_bytes(_flip(table.read_bytes(), source))
        elif mutation == "truncate csv":
            table = source.choice(tables)
            data = table.read_bytes()
            table.write_bytes(data[: source.integer(0, len(data))])
        elif mutation in ("bad provenance field", "table key outside", "quote type", "token"):
            data = yaml.safe_load(provenance.read_text(encoding="utf-8"))
            if mutation == "bad provenance field":
                dotted, value = source.choice(self.BAD_PROVENANCE)
                target, keys = data, dotted.split(".")
                for key in keys[:-1]:
                    target = target[key]
                target[keys[-1]] = value
            elif mutation == "table key outside":
                data["tables"]["../" + source.choice(list(data["tables"]))] = None
            else:
                table = source.choice(list(data["tables"]))
                rows = (data["tables"][table] or {}).get("rows") or {}
                if not rows:
                    known_bad = False
                else:
                    row = source.choice(sorted(rows))
                    if mutation == "quote type":
                        rows[row]["quote"] = source.choice([3, None, ["a"], ""])
                    else:
                        rows[row]["token"] = source.choice([-1, "x", 10**6, 2.5])
                        known_bad = rows[row]["token"] != 10**6  # a token past the quote is found by verify, not load
            provenance.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
        elif mutation in ("value mismatch", "value inf", "duplicate id", "drop column"):
            table = source.choice(tables)
            lines = table.read_text(encoding="utf-8").splitlines()
            header = lines[0].split(",")
            numbered = [i for i, line in enumerate(lines[1:], 1) if line.split(",")[header.index("value")] not in ("",)]
            if mutation == "drop column":
                lines = [
                    ",".join(f for k, f in enumerate(line.split(",")) if k != header.index("unit")) for line in lines
                ]
            elif mutation == "duplicate id" and len(lines) > 1:
                lines.append(lines[1])
            elif numbered:
                i = source.choice(numbered)
                fields = lines[i].split(",")
                column = header.index("value")
                fields[column] = "inf" if mutation == "value inf" else str(float(fields[column]) * 3 + 1)
                lines[i] = ",".join(fields)
            else:
                known_bad = False
            table.write_text("\n".join(lines) + "\n", encoding="utf-8")
        elif mutation in ("blank cell", "blank value", "huge value"):
            from ticklab.analysis.published import DESCRIPTIVE_TABLES, MAY_BE_BLANK, parse_printed

            table = source.choice(tables)
            with table.open(newline="", encoding="utf-8") as handle:
                rows = list(csv.reader(handle))
            header = rows[0]
            if len(rows) < 2:
                known_bad = False
            else:
                row = rows[source.integer(1, len(rows) - 1)]
                if mutation == "blank cell":
                    row[header.index(source.choice([c for c in header if c not in MAY_BE_BLANK]))] = ""
                elif mutation == "blank value":
                    printed = row[header.index("value_as_printed")]
                    known_bad = table.name not in DESCRIPTIVE_TABLES and parse_printed(printed) is not None
                    row[header.index("value")] = ""
                else:
                    row[header.index(source.choice(["value", "id", "value_as_printed"]))] = source.choice(
                        ["9" * 5000, "1" * 100_000, "x" * 100_000]
                    )
            with table.open("w", newline="", encoding="utf-8") as handle:
                csv.writer(handle).writerows(rows)
        elif mutation == "huge provenance":  # over the cap: a sparse file, refused before a byte is parsed
            from ticklab.analysis.published import MAX_PROVENANCE_BYTES

            with provenance.open("r+b") as handle:
                handle.truncate(MAX_PROVENANCE_BYTES + source.integer(1, 100 << 20))
        elif mutation == "newline in a name":
            (directory / source.choice(["a\nb.csv", "x" * 250 + ".csv", "\x1b[2J.csv"])).write_text("id\n")
        elif mutation == "non-utf8":
            target = source.choice([provenance, *tables])
            data = target.read_bytes()
            at = source.integer(0, len(data))
            target.write_bytes(data[:at] + b"\xff\xfe\xfa" + data[at:])
        elif mutation == "yaml garbage":
            provenance.write_bytes(
                source.choice(
                    [
                        b"[" * 5000,
                        b"a: &x [*x]",
                        b"source: [\n",
                        b"- 1\n- 2\n",
                        b"",
                        b"tables: !!python/object:os.system {}\n",
                    ]
                )
            )

        def load():
            published = load_published(root, claim)
            if self.documents.is_dir():
                problems = verify_against_source(published, self.documents)
                if problems:
                    from ticklab.analysis.published import PublishedDataError

                    raise PublishedDataError(problems[0])
            return published

        outcome = classify(load, known_bad=known_bad, bounded=True)
        outcome.detail = f"{claim} {mutation}: {outcome.detail}"
        return outcome


# -- CLI arguments and experiment YAML ---------------------------------------------------------------------

FAKE_HOST = {
    "nproc": 2,
    "online_cpus": [0, 1],
    "clocksources": {"available": ["tsc", "hpet"], "current": "tsc"},
    "cpuidle": {"states": [{"name": "POLL"}, {"name": "C1"}]},
}


class _NoHost:
    """A host on which every knob change is accepted and nothing is written (the fuzz applies knobs for their
    checks only)."""

    root = "/nonexistent"

    def __getattr__(self, name):
        return lambda *args, **kwargs: []


class CliYamlFamily:
    name = "CLI and experiment YAML"
    key = "cli"

    BAD_EXPERIMENT = [
        ("runs", -1),
        ("runs", 0),
        ("runs", 10**9),
        ("runs", True),
        ("runs", "10"),
        ("warmup", -2),
        ("seed", "x"),
        ("timeout_s", "soon"),
        ("timeout_s", -1),
        ("name", "../../x"),
        ("name", "a/b"),
        ("claim", 5),
        ("conditions", 5),
        ("conditions", {"matrix": "threads"}),
        ("conditions", [{"name": "a", "clients": {"per_cpu": "half"}}]),
        ("conditions", [5]),
        ("workload", []),
        ("workload", {"argv": "ftq"}),
        ("workload", {"argv": []}),
        ("knobs", {"x": "warp"}),
        ("knobs", []),
        ("trace", {"events": "x"}),
        ("trace", {"buffer_kb": -1}),
        ("lab", {"smp": "two"}),
        ("lab", {"memory_mb": 1}),
        ("budget", {"time_s": "x"}),
        ("budget", {"time_s": 10, "max_runs": 10**9}),
        ("extras", [{"name": "x"}]),
        ("extras", "x"),
        ("requires", "root"),
        ("unknown_key", 1),
        ("description", None),
    ]
    GOOD_EXPERIMENT = [("runs", 3), ("warmup", 0), ("seed", 7), ("timeout_s", 30.5), ("notes", "n")]

    WORDS = [
        "capture",
        "lab",
        "run",
        "verify",
        "compare",
        "report",
        "doctor",
        "ingest",
        "view",
        "seal-manifest",
        "verify-published",
        "nohz",
        "hpet",
        "bogus",
        "--runs",
        "--warmup",
        "--seed",
        "--budget-s",
        "--out",
        "--only",
        "--cell-timeout",
        "--smp",
        "--format",
        "--metric",
        "-1",
        "0",
        "1",
        "3",
        "10001",
        "99999999999999999999",
        "nan",
        "inf",
        "-inf",
        "1e9",
        "abc",
        "../x",
        "/",
        "",
        "--dry-run",
        "--help",
        "text",
        "--version",
        "\x00",
        "9" * 5000,
        "x" * 100_000,
        "a\nb",
    ]

    # appended to an experiment's text (a later key wins in PyYAML): what reached a traceback before issue 27
    RAW_BAD = [
        "seed: " + "1" * 5000,
        "seed: 0x" + "f" * 5000,
        "runs: " + "9" * 5000,
        "1: x",
        "null: x",
        "on: 1",
        "trace: {buffer_kb: 1024}",
        "knobs: {x: " + "y" * 100_000 + "}",
        "name: " + "x" * 100_000,
        "workload: {argv: [true], params: {1: 2}}",
        "when: 2026-13-45",
        "conditions: [{name: a, idle: shallow}]\nknobs: {idle: idle_config}",
        "conditions: [{name: a, idle: 'max='}]\nknobs: {idle: idle_config}",
        "conditions: {matrix: {idle: [all, 5]}}\nknobs: {idle: idle_config}",
    ]
    # known good or undetectable (a state this host lacks is found when the knob is applied: an error then)
    RAW_IDLE = [
        "conditions: [{name: a, idle: all}, {name: b, idle: 'max=POLL'}]\nknobs: {idle: idle_config}",
        "conditions: [{name: a, idle: 'max=C9'}]\nknobs: {idle: idle_config}",
        "conditions: {matrix: {idle: '@idle_configs'}}\nknobs: {idle: idle_config}",
    ]

    def prepare(self, seeds: Path) -> None:
        self.experiments = sorted(p for p in (REPO / "runners").glob("*/*.yaml"))

    def case(self, source, work: Path) -> Outcome:
        if source.integer(0, 1):
            return self._cli(source)
        return self._experiment(source, work)

    def _cli(self, source) -> Outcome:
        from ticklab.capture.session import check_counts
        from ticklab.cli import build_parser

        argv = [source.choice(self.WORDS) for _ in range(source.integer(1, 6))]
        counts = {
            "--runs": (1, 10000),
            "--warmup": (0, 1000),
            "--seed": (0, 2**63 - 1),
            "--budget-s": (0, 7 * 86400),
            "--smp": (1, 256),
            "--cell-timeout": (1, 86400),
        }

        def bad_count(args) -> bool:
            for option, (low, high) in counts.items():
                value = getattr(args, option[2:].replace("-", "_"), None)
                if value is not None and (
                    isinstance(value, float) and not math.isfinite(value) or not low <= value <= high
                ):
                    return True
            return False

        def parse():
            args = build_parser().parse_args(argv)
            if args.command in ("capture", "lab"):
                check_counts(args)
            return args

        outcome = classify(
            parse,
            known_bad=False,
            check=lambda a: "out-of-range count accepted" if bad_count(a) else None,
            bounded=True,
        )
        outcome.detail = f"argv {argv!r}: {outcome.detail}"
        return outcome

    def _experiment(self, source, work: Path) -> Outcome:
        import yaml

        from ticklab.capture.execute import apply_knobs
        from ticklab.capture.experiment import expand_conditions, fill_argv, load_experiment, schedule

        seed = source.choice(self.experiments)
        text = seed.read_text()
        mutation = source.choice(
            ["intact", "good field", "bad field", "flip", "truncate", "non-utf8", "garbage", "raw bad", "raw idle"]
        )
        known_bad = mutation in ("bad field", "non-utf8", "garbage", "raw bad")
        if mutation in ("good field", "bad field"):
            data = yaml.safe_load(text)
            key, value = source.choice(self.GOOD_EXPERIMENT if mutation == "good field" else self.BAD_EXPERIMENT)
            data[key] = value
            text = yaml.safe_dump(data)
        if mutation in ("raw bad", "raw idle"):
            text = text + "\n" + source.choice(self.RAW_BAD if mutation == "raw bad" else self.RAW_IDLE) + "\n"
        raw = text.encode()
        if mutation == "flip":
            raw = _flip(raw, source)
        elif mutation == "truncate":
            raw = raw[: source.integer(0, len(raw))]
        elif mutation == "non-utf8":
            at = source.integer(0, len(raw))
            raw = raw[:at] + b"\xff\xfe" + raw[at:]
        elif mutation == "garbage":
            raw = source.choice(
                [
                    b"[" * 3000,
                    b"- a\n- b\n",
                    b"",
                    b"claim: [",
                    b"!!python/object/apply:os.system ['true']",
                    b"a: &a [*a, *a]\n",
                ]
            )
        path = work / "experiment.yaml"
        path.write_bytes(raw)

        def run():
            experiment = load_experiment(path)
            conditions = expand_conditions(experiment, FAKE_HOST)
            plan = schedule(conditions, experiment.runs, experiment.warmup, experiment.seed)
            for planned in plan[:3]:
                values = {
                    "tools": "/t",
                    "repo": "/r",
                    "run_dir": ".",
                    "nproc": 2,
                    "last_cpu": 1,
                    **(experiment.workload.get("params") or {}),
                    **planned.condition.values,
                }
                fill_argv(experiment.workload["argv"], values, str(path))
                apply_knobs(_NoHost(), experiment, planned.condition, FAKE_HOST)  # the knobs as a run applies them
            return plan

        outcome = classify(run, known_bad=known_bad, bounded=True)
        outcome.detail = f"{seed.parent.name}/{seed.name} {mutation}: {outcome.detail}"
        return outcome
