"""Ingest as root on other users' files (issue 27): three families.

ingest-out-links  ``ticklab ingest --out DIR`` where another user prepared DIR: a link, FIFO, socket or directory
                  planted under a table's name, a dangling link, a hard link to a file of someone else's, the
                  temporary name taken. A planted special file or hard link must be refused (one line; since
                  issue 40 a hard link is refused, no longer replaced) and nothing written through it: the victim
                  file keeps its bytes, no file appears where a dangling link points; an old table of ours is
                  replaced (renamed over), never written into.
trace-fifos       a FIFO, socket, device, directory or link (to /dev/zero, a root-only file, a FIFO, a good copy,
                  nowhere) in place of every file of a tracefs capture and of a run directory's trace.dat, and a
                  linked formats/ directory: always a one-line error, never a hang, never a refused file's content
                  in the message.
trace-counts      structural damage to real trace.dat files (v6, v7 uncompressed, zstd, zlib) — the CPU count, a
                  CPU's data offset or size, a compressed chunk's count or sizes, a page's commit field, a cut at a
                  page — each read by ticklab and, where installed, by ``trace-cmd report``: when ticklab accepts,
                  its per-event counts must be trace-cmd's (or, where trace-cmd cannot read the file, the intact
                  file's): fewer or more events in silence is wrong.
"""

from __future__ import annotations

import lzma
import os
import re
import shutil
import socket
import struct
import subprocess
from collections import Counter
from pathlib import Path

from fuzzcases import REPO, TRACE_SEED_V7, Outcome, classify, remove_tree, tracefs_seed, writable_copy
from fuzzcases_special import SPECIALS, plant_special

COMPRESSED = REPO / "tests" / "data" / "compressed"
PAGE = 4096
VICTIM_TEXT = b"someone else's file: must keep these bytes\n"


# -- ingest --out ------------------------------------------------------------------------------------------------
class IngestOutLinksFamily:
    name = "ingest --out planted files"
    key = "ingest-out-links"
    PLANTS = [
        "nothing",
        "old tables",
        "link to a victim",
        "link to a victim directory",
        "dangling link",
        "fifo",
        "socket",
        "directory",
        "hard link to a victim",
        "temporary name taken",
        "out is the user's link",
    ]

    def prepare(self, seeds: Path) -> None:
        from ticklab.trace.ingest import read_trace

        self.trace = COMPRESSED / "trace-zstd.dat"
        self.tables = sorted(key.replace(":", "__") + ".parquet" for key in read_trace(self.trace).counts())

    def case(self, source, work: Path) -> Outcome:
        from ticklab.trace.ingest import read_trace, write_tables

        root = work / "ingest-out"
        remove_tree(root)
        root.mkdir(parents=True)
        out = root / "out"
        out.mkdir()
        victim = root / "victim.conf"
        victim.write_bytes(VICTIM_TEXT)
        victim_dir = root / "victim-dir"
        victim_dir.mkdir()
        plant = source.choice(self.PLANTS)
        table = source.choice(self.tables)
        where = out / table
        if plant == "old tables":
            for name in self.tables:
                (out / name).write_bytes(b"an older table\n")
        elif plant == "link to a victim":
            where.symlink_to(victim)
        elif plant == "link to a victim directory":
            where.symlink_to(victim_dir)
        elif plant == "dangling link":
            where.symlink_to(root / "created-through-a-link")
        elif plant == "fifo":
            os.mkfifo(where)
        elif plant == "socket":
            sock = socket.socket(socket.AF_UNIX)
            sock.bind(str(where))
            sock.close()
        elif plant == "directory":
            where.mkdir()
        elif plant == "hard link to a victim":
            os.link(victim, where)
        elif plant == "temporary name taken":  # the name write_atomic would use in this process, made a link
            (out / f".{table}.tmp-{os.getpid()}").symlink_to(victim)
        elif plant == "out is the user's link":
            real = root / "real-out"
            real.mkdir()
            shutil.rmtree(out)
            out.symlink_to(real)
        known_bad = plant in (
            "link to a victim",
            "link to a victim directory",
            "dangling link",
            "fifo",
            "socket",
            "directory",
            "hard link to a victim",
        )

        def check(written):
            if sorted(p.name for p in written) != self.tables:
                return f"wrote {sorted(p.name for p in written)}"
            return None

        outcome = classify(
            lambda: write_tables(read_trace(self.trace), out), known_bad=known_bad, check=check, bounded=True
        )
        if victim.read_bytes() != VICTIM_TEXT:
            outcome = Outcome("wrong", "the victim file was written through the planted name", known_bad)
        elif any(victim_dir.iterdir()):
            outcome = Outcome("wrong", "a table was written into the victim directory", known_bad)
        elif os.path.lexists(root / "created-through-a-link"):
            outcome = Outcome("wrong", "a file was created where a dangling link pointed", known_bad)
        elif (
            plant == "temporary name taken"
            and outcome.kind == "accepted"
            and (out / f".{table}.tmp-{os.getpid()}").is_symlink() is False
        ):
            outcome = Outcome("wrong", "the planted temporary name was replaced", known_bad)
        elif (
            plant == "hard link to a victim"
            and outcome.kind == "accepted"
            and os.stat(out / table).st_ino == os.stat(victim).st_ino
        ):
            outcome = Outcome("wrong", "the table was written into a hard link's inode", known_bad)
        outcome.detail = f"{plant} as {table}: {outcome.detail}"
        return outcome


# -- special files where a trace is read -----------------------------------------------------------------------
class TraceSpecialsFamily:
    name = "special files in traces"
    key = "trace-fifos"

    def prepare(self, seeds: Path) -> None:
        self.tracefs = seeds / "tracefs-special"
        if not self.tracefs.is_dir():
            shutil.copytree(tracefs_seed(), self.tracefs)
        self.names = sorted(str(p.relative_to(self.tracefs)) for p in self.tracefs.rglob("*") if p.is_file())
        self.names += ["cpu0.raw.xz", "formats", f"formats/{next((self.tracefs / 'formats').iterdir()).name}"]

    def case(self, source, work: Path) -> Outcome:
        from ticklab.trace.ingest import read_trace

        for leftover in ("secret-0600", "a-fifo"):
            if os.path.lexists(work / leftover):
                (work / leftover).unlink()
        special = source.choice(SPECIALS)
        if source.integer(0, 4) == 0:  # a run directory's trace.dat
            run = work / "run-trace"
            remove_tree(run)
            run.mkdir(parents=True)
            (run / "trace.dat").write_bytes(b"")
            what = "trace.dat"
            plant_special(run / "trace.dat", special, work)
            target = run
        else:
            target = writable_copy(self.tracefs, work / "tracefs")
            what = source.choice(self.names)
            if what == "cpu0.raw.xz":
                for name in ("cpu0.raw", "cpu0.raw.xz"):
                    if os.path.lexists(target / name):
                        (target / name).unlink()
                (target / what).write_bytes(b"")
            elif not os.path.lexists(target / what):
                (target / what).write_bytes(b"")
            plant_special(target / what, special, work)

        def read():
            trace = read_trace(target)
            trace.arrow_tables()
            return trace

        # header_event is copied into a capture for KernelShark's sake; ingest never opens it
        outcome = classify(read, known_bad=what != "header_event", bounded=True)
        if outcome.kind == "error" and "private" in outcome.detail:
            outcome = Outcome("wrong", f"an error line shows a refused file's content: {outcome.detail}", True)
        outcome.detail = f"{what} as {special}: {outcome.detail}"
        return outcome


# -- counts against trace-cmd ----------------------------------------------------------------------------------
def trace_cmd_counts(path: Path) -> Counter | None:
    """Events per name as ``trace-cmd report`` prints them; None when it is not installed or cannot read the file."""
    if shutil.which("trace-cmd") is None:
        return None
    try:
        done = subprocess.run(
            ["trace-cmd", "report", "-i", str(path)], capture_output=True, text=True, timeout=60, errors="replace"
        )
    except subprocess.TimeoutExpired:
        return None
    if done.returncode or re.search(r"^\s*(trace-cmd: |\s*error)", done.stderr, re.M):
        return None
    counts = Counter(m.group(1) for m in re.finditer(r"^\s*.+?\[\d+\]\s+\S+:\s+(\w+):", done.stdout, re.M))
    # a record whose payload a flip garbled: trace-cmd prints it without a name, ticklab by its type id's format
    counts[UNNAMED] = len(re.findall(r"^\[UNKNOWN EVENT\]", done.stdout, re.M))
    return counts


UNNAMED = "(a record trace-cmd prints as [UNKNOWN EVENT])"


def _disagreement(ours: Counter, theirs: Counter) -> str | None:
    """None when ticklab read the records trace-cmd printed: the same number in all, each name trace-cmd printed
    at least as often, and the records trace-cmd could not name no more than ticklab's surplus."""
    named = {name: n for name, n in theirs.items() if name != UNNAMED}
    surplus = sum(ours.values()) - sum(named.values())
    if (
        sum(ours.values()) == sum(theirs.values())
        and all(ours[name] >= n for name, n in named.items())
        and surplus == theirs[UNNAMED]
    ):
        return None
    return (
        f"{sum(ours.values())} events where trace-cmd report reads {sum(theirs.values())}: {_difference(ours, theirs)}"
    )


def _u32(data, at):
    return struct.unpack_from("<I", data, at)[0]


def _u64(data, at):
    return struct.unpack_from("<Q", data, at)[0]


def cpu_table(data: bytes) -> tuple[int, int, int] | None:
    """Where a trace.dat says where each CPU's data is: (offset of the u32 CPU count or None, offset of the first
    entry, entry stride) — found by its shape, independently of ticklab's reader: v6's flyrecord table of
    (u64 offset, u64 size), v7's BUFFER option entries of (u32 cpu, u64 offset, u64 size)."""
    version = data[10:12]
    if version == b"6\0":
        fly = data.find(b"flyrecord\0")
        options = data.find(b"options  \0")
        count_at = (options if 0 <= options < fly else fly) - 4
        return count_at, fly + 10, 16
    for at in range(len(data) - 8):
        count = _u32(data, at)
        if not 1 <= count <= 64 or at + 4 + 20 * count > len(data):
            continue
        entries = [
            (_u32(data, at + 4 + 20 * k), _u64(data, at + 8 + 20 * k), _u64(data, at + 16 + 20 * k))
            for k in range(count)
        ]
        if all(
            cpu == k and offset % PAGE == 0 and 0 < offset < len(data) and offset + size <= len(data)
            for k, (cpu, offset, size) in enumerate(entries)
        ):
            return at, at + 4, 20
    return None


class TraceCountsFamily:
    name = "trace counts against trace-cmd"
    key = "trace-counts"
    MUTATIONS = [
        "intact",
        "cpu count",
        "cpu data offset",
        "cpu data size",
        "chunk count",
        "chunk plain size",
        "chunk packed size",
        "page commit",
        "cut at a page",
        "flip in cpu data",
    ]

    def prepare(self, seeds: Path) -> None:
        from ticklab.trace.ingest import read_trace

        self.seeds = {}
        source = seeds / "counts-v7-none.dat"
        if not source.is_file():
            source.write_bytes(lzma.decompress(TRACE_SEED_V7.read_bytes()))
        self.seeds["v7"] = source
        self.seeds["v7-zstd"] = COMPRESSED / "trace-zstd.dat"
        self.seeds["v7-zlib"] = COMPRESSED / "trace-zlib.dat"
        v6 = seeds / "counts-v6.dat"
        if not v6.is_file() and shutil.which("trace-cmd"):
            subprocess.run(
                [
                    "trace-cmd",
                    "convert",
                    "-i",
                    str(source),
                    "-o",
                    str(v6),
                    "--file-version",
                    "6",
                    "--compression",
                    "none",
                ],
                capture_output=True,
                timeout=120,
                check=False,
            )
        if v6.is_file():
            self.seeds["v6"] = v6
        self.intact = {
            kind: Counter({k.split(":")[1]: n for k, n in read_trace(path).counts().items()})
            for kind, path in self.seeds.items()
        }
        self.tables = {kind: cpu_table(path.read_bytes()) for kind, path in self.seeds.items()}

    def _entries(self, kind: str, data: bytes) -> list[tuple[int, int, int]]:
        """(offset, size, where the entry's offset field is) per CPU."""
        count_at, first, stride = self.tables[kind]
        skip = 4 if stride == 20 else 0
        return [
            (
                _u64(data, first + stride * k + skip),
                _u64(data, first + stride * k + skip + 8),
                first + stride * k + skip,
            )
            for k in range(_u32(data, count_at))
        ]

    def case(self, source, work: Path) -> Outcome:
        from ticklab.trace.ingest import read_trace

        kind = source.choice(sorted(self.seeds))
        data = bytearray(self.seeds[kind].read_bytes())
        mutation = source.choice(self.MUTATIONS)
        compressed = kind in ("v7-zstd", "v7-zlib")
        entries = self._entries(kind, data)
        cpu = source.integer(0, len(entries) - 1)
        offset, size, field = entries[cpu]
        delta = source.choice([-PAGE, PAGE, -1, 1, -2 * PAGE, 8])
        if mutation == "cpu count":
            count_at = self.tables[kind][0]
            struct.pack_into("<I", data, count_at, max(0, _u32(data, count_at) + source.choice([-1, 1, -2])))
        elif mutation == "cpu data offset":
            struct.pack_into("<Q", data, field, max(0, offset + delta))
        elif mutation == "cpu data size":
            struct.pack_into("<Q", data, field + 8, max(0, size + delta))
        elif mutation.startswith("chunk") and compressed and size >= 4:
            chunks = _u32(data, offset)
            if mutation == "chunk count":
                struct.pack_into("<I", data, offset, max(0, chunks + source.choice([-1, 1])))
            elif chunks:
                at, number = offset + 4, source.integer(0, chunks - 1)
                for _ in range(number):
                    at += 8 + _u32(data, at)
                which = 4 if mutation == "chunk plain size" else 0
                struct.pack_into("<I", data, at + which, max(0, _u32(data, at + which) + delta))
        elif mutation == "page commit" and not compressed and size >= PAGE:
            page = offset + PAGE * source.integer(0, size // PAGE - 1)
            struct.pack_into(
                "<Q", data, page + 8, source.choice([0, 1, 8, PAGE - 16, PAGE, 1 << 40, _u64(data, page + 8) - 8])
            )
        elif mutation == "cut at a page":
            data = data[: max(0, offset + PAGE * source.integer(0, max(0, size // PAGE)))]
        elif mutation == "flip in cpu data" and size:
            at = offset + source.integer(0, size - 1)
            data[at] ^= source.integer(1, 255)
        path = work / f"counts-{kind}.dat"
        path.write_bytes(bytes(data))
        intact = self.intact[kind]
        reference = None if kind == "v7-zlib" else trace_cmd_counts(path)

        def check(trace):
            counts = Counter({k.split(":")[1]: n for k, n in trace.counts().items()})
            if reference is not None:
                return _disagreement(counts, reference)
            if mutation != "flip in cpu data" and counts != intact:
                return (
                    f"{sum(counts.values())} events where the intact file has {sum(intact.values())} and "
                    f"trace-cmd cannot read it: {_difference(counts, intact)}"
                )
            return None

        outcome = classify(lambda: read_trace(path), known_bad=False, check=check, bounded=True)
        counted = f"trace-cmd {sum(reference.values())}" if reference is not None else "trace-cmd refuses or absent"
        outcome.detail = f"{kind} {mutation} cpu {cpu} ({counted}): {outcome.detail}"
        return outcome


def _difference(ours: Counter, theirs: Counter) -> str:
    names = sorted(set(ours) | set(theirs))
    return ", ".join(f"{n} {ours[n]} vs {theirs[n]}" for n in names if ours[n] != theirs[n])[:200]
