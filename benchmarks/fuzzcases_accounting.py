"""Fuzz families of issue 40 for the trace readers: inputs a reader cannot account for, and compressed-size bombs.

trace-fields  a duplicate or missing field of a trace's own bookkeeping, each placed at random in real files: a v7
              buffer option listing one CPU number twice (or two top-level buffer options), a v7 without its
              top-level buffer option, two stats options for one CPU (v6, v7), a tracefs cpuN.stats without its
              'read events:' line (with its cpuN.raw cut at a page, or whole), a second stats file for one CPU
              (cpu01.stats beside cpu1.stats); and the intact seeds. Every damaged input must be refused in one line
              (accepted is "wrong": events filed under another CPU, a lost count replaced, a cut file read short or
              0 events read as a whole trace); an intact one must read the seed's counts.
bombs         compressed files that unpack to more than they may (rawfile.UNPACK_RATIO times their size, at least
              UNPACK_FLOOR; ingest.TRACE_DATA_LIMIT a trace): a tracefs cpuN.raw.xz made of concatenated .xz
              streams of empty pages and of real pages (so its ratio falls on either side of the limit), a
              trace.dat.xz with such streams after the real file, a compressed trace.dat whose chunk or section
              headers claim more than the file may hold. Known bad exactly when the unpacked size passes the
              limit: then the reader must refuse in one line (accepted is "wrong"); within it the reader must give
              the seed's counts (a refusal is "wrong"); a MemoryError (the 4 GiB cap of `make fuzz`) is "wrong"
              whatever the input: memory must stay bounded by the limits, not by the cap.
"""

from __future__ import annotations

import lzma
import shutil
import struct
from collections import Counter
from pathlib import Path

import fuzzcases as cases
from fuzzcases import REPO, TRACE_SEED_V7, Outcome, remove_tree, tracefs_seed, writable_copy

COMPRESSED = REPO / "tests" / "data" / "compressed"
PAGE = 4096
OPTION_CPUSTAT, OPTION_BUFFER, UNKNOWN_OPTION = 2, 3, 0x7FF0


def _u16(data, at):
    return struct.unpack_from("<H", data, at)[0]


def _u32(data, at):
    return struct.unpack_from("<I", data, at)[0]


def _u64(data, at):
    return struct.unpack_from("<Q", data, at)[0]


def v7_options(data: bytes) -> list[tuple[int, int, int]]:
    """(offset, id, payload size) of every option in the uncompressed options sections of a trace.dat v7
    (trace-cmd.dat(5)), found without ticklab's reader."""
    position = data.index(b"\0", data.index(b"\0", 18) + 1) + 1  # after the compression name and its version
    next_options, found = _u64(data, position), []
    while next_options and next_options + 16 <= len(data) and not _u16(data, next_options + 2) & 1:
        at, next_options = next_options + 16, 0
        while at + 6 <= len(data):
            option, size = _u16(data, at), _u32(data, at + 2)
            found.append((at, option, size))
            if option == 0:
                next_options = _u64(data, at + 6)
                break
            at += 6 + size
    return found


def buffer_entries(data: bytes) -> tuple[int, int]:
    """(offset of the top-level buffer option's CPU count, the count)."""
    for at, option, size in v7_options(data):
        if option == OPTION_BUFFER and data[at + 14] == 0:
            end = at + 6 + size
            for count_at in range(at + 15, end - 3):
                count = _u32(data, count_at)
                if count and count_at + 4 + 20 * count == end:
                    return count_at, count
    raise ValueError("no top-level buffer option")


def v6_stats(data: bytes) -> list[int]:
    """Offsets of the 'CPU: N' text of each CPUSTAT option of a trace.dat v6."""
    options = data.find(b"options  \0")
    fly = data.find(b"flyrecord\0")
    found, at = [], options + 10
    while 0 <= options and at + 6 <= fly:
        option, size = _u16(data, at), _u32(data, at + 2)
        if option == 0:
            break
        if option == OPTION_CPUSTAT and data[at + 6 : at + 11] == b"CPU: ":
            found.append(at + 6)
        at += 6 + size
    return found


def _limits():
    """(unpack_limit, TRACE_DATA_LIMIT, MAX_BLOCK) as ticklab declares them (issue 40); the same numbers for a ticklab
    from before they were declared, so the family can be run against it too."""
    from ticklab.trace import ingest, rawfile

    data_limit = getattr(ingest, "TRACE_DATA_LIMIT", 2 << 30)
    unpack_limit = getattr(rawfile, "unpack_limit", lambda packed, limit: min(limit, max(16 << 20, 1024 * packed)))
    return unpack_limit, data_limit, ingest.MAX_BLOCK


def _counts(trace) -> Counter:
    return Counter(trace.counts())


def _seed_trace_dats(seeds: Path) -> dict[str, Path]:
    found = {}
    plain = seeds / "accounting-v7.dat"
    if not plain.is_file():
        plain.write_bytes(lzma.decompress(TRACE_SEED_V7.read_bytes()))
    found["v7"] = plain
    found["v7-zstd"] = COMPRESSED / "trace-zstd.dat"
    found["v7-zlib"] = COMPRESSED / "trace-zlib.dat"
    v6 = seeds / "counts-v6.dat"  # made by the trace-counts family where trace-cmd is installed
    if not v6.is_file() and shutil.which("trace-cmd"):
        import subprocess

        subprocess.run(
            ["trace-cmd", "convert", "-i", str(plain), "-o", str(v6), "--file-version", "6", "--compression", "none"],
            capture_output=True,
            timeout=120,
            check=False,
        )
    if v6.is_file():
        found["v6"] = v6
    return found


def _plain_tracefs(seeds: Path, name: str) -> Path:
    """The first bundled tracefs capture with its raw files unpacked."""
    target = seeds / name
    if not target.is_dir():
        shutil.copytree(tracefs_seed(), target)
        for packed in target.glob("*.xz"):
            packed.with_suffix("").write_bytes(lzma.decompress(packed.read_bytes()))
            packed.unlink()
    return target


# -- duplicate and missing fields ------------------------------------------------------------------------------
class TraceFieldsFamily:
    name = "trace fields duplicated or missing"
    key = "trace-fields"
    MUTATIONS = [
        "intact",
        "duplicate cpu entry",
        "second top-level buffer",
        "no top-level buffer",
        "duplicate stats option",
        "stats without read events",
        "stats without read events, raw cut",
        "second stats file",
    ]

    def prepare(self, seeds: Path) -> None:
        from ticklab.trace.ingest import read_trace

        self.dats = _seed_trace_dats(seeds)
        self.tracefs = _plain_tracefs(seeds, "accounting-tracefs")
        self.intact = {kind: _counts(read_trace(path)) for kind, path in self.dats.items()}
        self.intact["tracefs"] = _counts(read_trace(self.tracefs))
        self.cpus = sorted(int(p.name[3:-4]) for p in self.tracefs.glob("cpu*.raw"))

    def case(self, source, work: Path) -> Outcome:
        from ticklab.trace.ingest import read_trace

        mutation = source.choice(self.MUTATIONS)
        if mutation in ("stats without read events", "stats without read events, raw cut", "second stats file") or (
            mutation == "intact" and source.integer(0, 4) == 0
        ):
            kind = "tracefs"
        elif mutation == "duplicate stats option":
            kind = source.choice([k for k in ("v6", "v7", "v7-zstd", "v7-zlib") if k in self.dats])
        else:
            kind = source.choice(
                ["v7", "v7-zstd", "v7-zlib"] + (["v6"] if mutation == "intact" and "v6" in self.dats else [])
            )
        if kind == "tracefs":
            target, detail = self._tracefs(mutation, source, work)
        else:
            target, detail = self._trace_dat(kind, mutation, source, work)
        known_bad = mutation != "intact"
        expected = self.intact[kind]

        def check(trace):
            found = _counts(trace)
            return (
                None
                if found == expected
                else f"{sum(found.values())} events where the seed has {sum(expected.values())}"
            )

        outcome = cases.classify(lambda: read_trace(target), known_bad=known_bad, check=check, bounded=True)
        outcome.detail = f"{kind} {mutation} {detail}: {outcome.detail}"
        return outcome

    def _trace_dat(self, kind: str, mutation: str, source, work: Path) -> tuple[Path, str]:
        data = bytearray(self.dats[kind].read_bytes())
        detail = ""
        if mutation in ("duplicate cpu entry", "second top-level buffer"):
            count_at, count = buffer_entries(data)
            if mutation == "duplicate cpu entry":
                one, other = source.integer(0, count - 1), source.integer(0, count - 2)
                other += other >= one
                struct.pack_into("<I", data, count_at + 4 + 20 * one, _u32(data, count_at + 4 + 20 * other))
                detail = f"entry {one} says CPU {other}"
            else:  # the top-level buffer option written again after the others: a second list of the CPUs' data
                at, _, size = next(o for o in v7_options(data) if o[1] == OPTION_BUFFER)
                copy = bytes(data[at : at + 6 + size])
                data[at:at] = copy
                detail = "buffer option twice"
        elif mutation == "no top-level buffer":
            buffers = [at for at, option, _ in v7_options(data) if option == OPTION_BUFFER]
            for at in buffers:
                struct.pack_into("<H", data, at, source.choice([UNKNOWN_OPTION, 0x7FFF, 0x1234]))
            detail = f"{len(buffers)} buffer option(s) renamed"
        elif mutation == "duplicate stats option":
            if kind == "v6":
                texts = v6_stats(bytes(data))
            else:
                texts = [
                    at + 6
                    for at, option, _ in v7_options(data)
                    if option == OPTION_CPUSTAT and data[at + 6 : at + 11] == b"CPU: "
                ]
            one, other = source.integer(0, len(texts) - 1), source.integer(0, len(texts) - 2)
            other += other >= one
            data[texts[one] + 5] = data[texts[other] + 5]  # 'CPU: N': one digit, the other option's
            detail = f"stats {one} says CPU {chr(data[texts[other] + 5])}"
        path = work / f"fields-{kind}.dat"
        path.write_bytes(bytes(data))
        return path, detail

    def _tracefs(self, mutation: str, source, work: Path) -> tuple[Path, str]:
        target = writable_copy(self.tracefs, work / "fields-tracefs")
        cpu = source.choice(self.cpus)
        detail = f"cpu{cpu}"
        if mutation.startswith("stats without read events"):
            stats = target / f"cpu{cpu}.stats"
            kept = [line for line in stats.read_text().splitlines(keepends=True) if not line.startswith("read events")]
            if source.integer(0, 3) == 0:  # the line's name damaged rather than removed
                kept.append(source.choice(["read event: 5\n", "read events 5\n", "Read Events: 5\n", "read events:\n"]))
            stats.write_text("".join(kept))
            if mutation.endswith("raw cut"):
                raw = target / f"cpu{cpu}.raw"
                data = raw.read_bytes()
                pages = source.integer(0, max(0, len(data) // PAGE - 1))
                raw.write_bytes(data[: pages * PAGE])
                detail += f" cut to {pages} page(s)"
        elif mutation == "second stats file":
            (target / f"cpu{'0' * source.integer(1, 3)}{cpu}.stats").write_bytes(
                (target / f"cpu{cpu}.stats").read_bytes()
            )
        return target, detail


# -- compressed-size bombs ---------------------------------------------------------------------------------------
class CompressedBombFamily:
    name = "compressed-size bombs"
    key = "bombs"
    KINDS = ["tracefs xz", "tracefs xz", "trace.dat.xz", "chunk claims", "section claims"]

    def prepare(self, seeds: Path) -> None:
        from ticklab.trace.ingest import read_trace

        self.tracefs = _plain_tracefs(seeds, "bomb-tracefs")
        self.cpus = sorted(int(p.name[3:-4]) for p in self.tracefs.glob("cpu*.raw"))
        self.zero = lzma.compress(b"\0" * (1 << 20))  # 1 MiB of empty pages: ~300 bytes
        real = (self.tracefs / f"cpu{self.cpus[-1]}.raw").read_bytes()
        block = (real * ((1 << 20) // max(len(real), 1) + 1))[: 1 << 20]
        self.real = lzma.compress(block)  # 1 MiB of real pages: tens of KB
        self.source_xz = TRACE_SEED_V7.read_bytes()
        self.source_size = len(lzma.decompress(self.source_xz))
        self.dats = _seed_trace_dats(seeds)
        self.intact = {
            "tracefs": _counts(read_trace(self.tracefs)),
            "trace.dat.xz": _counts(read_trace(self.dats["v7"])),
        }

    def case(self, source, work: Path) -> Outcome:
        from ticklab.trace.ingest import read_trace

        unpack_limit, data_limit, _ = _limits()
        kind = source.choice(self.KINDS)
        if kind in ("tracefs xz", "trace.dat.xz"):
            zeros = source.integer(0, source.choice([16, 64, 400, 2500]))
            reals = source.integer(0, 2 if zeros > 400 else 24)
            if not zeros + reals:
                zeros = 1
            pieces = [self.zero] * zeros + [self.real] * reals
            order = source.integer(0, 2)  # zeros first, reals first, interleaved
            if order == 1:
                pieces.reverse()
            elif order == 2:
                pieces = [p for pair in zip(pieces[::2], pieces[1::2], strict=False) for p in pair] + pieces[
                    len(pieces) // 2 * 2 :
                ]
            if kind == "tracefs xz":
                target = writable_copy(self.tracefs, work / "bomb-tracefs")
                cpu = source.choice(self.cpus)
                others = sum((target / f"cpu{c}.raw").stat().st_size for c in self.cpus if c < cpu)
                (target / f"cpu{cpu}.raw").unlink()
                packed = b"".join(pieces)
                (target / f"cpu{cpu}.raw.xz").write_bytes(packed)
                # what it holds is not the capture's: its count check is left out (the stats say 0 were read)
                stats = target / f"cpu{cpu}.stats"
                stats.write_text(
                    "".join(
                        line if not line.startswith("read events") else "read events: 0\n"
                        for line in stats.read_text().splitlines(keepends=True)
                    )
                )
                unpacked = (zeros + reals) << 20
                limit = unpack_limit(len(packed), data_limit - others)
                expected = None  # the other CPUs' events plus whatever the new pages hold: not checked by count
                detail = f"cpu{cpu}.raw.xz {len(packed)} bytes -> {unpacked >> 20} MiB (limit {limit >> 20} MiB)"
            else:
                remove_tree(work / "bomb-dat")
                target = work / "bomb-dat"
                target.mkdir(parents=True)
                packed = self.source_xz + b"".join(pieces)  # the trace, then streams whose bytes follow its data
                (target / "trace.dat.xz").write_bytes(packed)
                unpacked = self.source_size + ((zeros + reals) << 20)
                limit = unpack_limit(len(packed), data_limit)
                expected = self.intact["trace.dat.xz"]
                detail = f"trace.dat.xz {len(packed)} bytes -> {unpacked >> 20} MiB (limit {limit >> 20} MiB)"
            known_bad = unpacked > limit
        else:
            target, detail = self._claims(kind, source, work)
            known_bad, expected = True, None

        def check(trace):
            if expected is not None and _counts(trace) != expected:
                return f"{sum(_counts(trace).values())} events where the seed has {sum(expected.values())}"
            return None

        def read():
            trace = read_trace(target)
            trace.counts()
            return trace

        outcome = cases.classify(read, known_bad=known_bad, check=check, bounded=True)
        if "MemoryError" in outcome.detail:
            outcome = Outcome("wrong", f"memory not bounded by the limits: {outcome.detail}", known_bad)
        elif outcome.kind == "error" and not known_bad:
            outcome = Outcome("wrong", f"refused within the limits: {outcome.detail}", known_bad)
        outcome.detail = f"{kind} {detail}: {outcome.detail}"
        return outcome

    def _claims(self, kind: str, source, work: Path) -> tuple[Path, str]:
        """A compressed trace.dat whose chunk (or section) header claims more than the file may decompress to."""
        unpack_limit, data_limit, max_block = _limits()
        name = source.choice(["v7-zstd", "v7-zlib"])
        data = bytearray(self.dats[name].read_bytes())
        limit = unpack_limit(len(data), data_limit)
        claim = source.choice([limit + 1, limit + PAGE, max_block, max_block + 1, 0xFFFFFFFF, limit * 2])
        if kind == "chunk claims":
            count_at, count = buffer_entries(bytes(data))
            entry = count_at + 4 + 20 * source.integer(0, count - 1)
            offset = _u64(data, entry + 4)
            chunks, at = _u32(data, offset), offset + 4
            if chunks >= 2 and source.integer(0, 1):  # every chunk just under a block's most: too much only in all
                each = max_block - source.integer(0, PAGE)
                for _ in range(chunks):
                    struct.pack_into("<I", data, at + 4, each)
                    at += 8 + _u32(data, at)
                return self._written(work, name, data), f"{name} {chunks} chunks claim {each} bytes each"
            for _ in range(source.integer(0, max(0, chunks - 1))):
                at += 8 + _u32(data, at)
            struct.pack_into("<I", data, at + 4, claim)
            detail = f"{name} chunk at byte {at} claims {claim}"
        else:
            header = next(o for o in v7_options(bytes(data)) if o[1] == 16)  # HEADER_INFO: its section's offset
            section = _u64(data, header[0] + 6)
            struct.pack_into("<I", data, section + 16 + 4, claim)
            detail = f"{name} header section at byte {section} claims {claim}"
        return self._written(work, name, data), detail

    @staticmethod
    def _written(work: Path, name: str, data: bytearray) -> Path:
        path = work / f"claims-{name}.dat"
        path.write_bytes(bytes(data))
        return path
