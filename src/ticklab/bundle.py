"""Bundles: the unit of captured data (docs/ARCHITECTURE.md, "4. Bundles").

    traces/<host-id>/<claim>/<UTC timestamp>-<experiment>/
        manifest.json   schema, claim, experiment definition, host facts, one record per run, checksums
        raw/<run>/...   what the tools wrote
        results.csv     tidy: run, condition, metric, value, unit

A bundle is written incrementally and marked ``incomplete`` from its first byte, so an interrupted
capture leaves the runs it finished. ``seal`` makes every file read-only and records its sha256;
``load_bundle`` verifies schema and checksums and names the file that fails. The manifest itself is
covered by ``manifest.sha256`` (its sha256, in sha256sum's format), written last; every ``files`` entry
is a regular file inside the bundle (no symlink, no '..', no absolute path). Nothing is ever
overwritten: a bundle directory that exists already is an error.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import lzma
import math
import os
import re
import shutil
import stat
import weakref
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from . import __version__, schemas
from .safefiles import OwnedDir, UnsafeFileError, is_regular, kind_of, open_fd, open_regular, read_bytes, shown
from .trace import gapfile, rawfile

if TYPE_CHECKING:  # pandas is imported where results are read, not by a capture's dry run or a refusal (issue 56)
    import pandas as pd

SCHEMA_VERSION = 1
MANIFEST = "manifest.json"
SEAL = "manifest.sha256"  # sha256 of manifest.json, written last when sealing
RESULTS = "results.csv"
RESULT_COLUMNS = ["run", "condition", "metric", "value", "unit"]
COMPRESS_FROM_BYTES = 64 * 1024
XZ_PRESET = 6  # preset 9 packs a trace.dat 0.1 % tighter in 25 % more time
REQUIRED_KEYS = ("schema_version", "status", "claim", "experiment", "definition", "host", "runs")


def _or_empty(value, kind: type):
    return value if isinstance(value, kind) else kind()


@dataclass
class RunRecord:
    """One run in a manifest's ``runs``: the keys every reader decides on, typed; every other key (values, argv,
    knobs, trace, interference, extras, a lab run's guest and boot ...) kept as written in ``details``.
    ``from_json``/``to_json`` give back exactly the JSON object they read (a key absent stays absent)."""

    run: str
    condition: str
    warmup: bool = False
    status: str = "ok"
    problem: str | None = None
    details: dict = field(default_factory=dict)
    absent: frozenset = field(default=frozenset(), repr=False, compare=False)  # typed keys the record did not have

    TYPED = ("run", "condition", "warmup", "status", "problem")

    @property
    def failed(self) -> bool:
        """It did not finish ok, or its results came with a problem (e.g. a guest that booted wrong)."""
        return self.status != "ok" or bool(self.problem)

    @property
    def measured(self) -> bool:
        """The one definition of a measured run: not a warm-up, not failed. Only these reach any analysis."""
        return not self.warmup and not self.failed

    # The records readers open most, each {} (or []) where the run has none (older bundles lack the later ones) or
    # where it is not what ticklab writes (the schema leaves them free-form).
    @property
    def trace(self) -> dict:
        """The trace the run recorded (``directory`` in raw/<run>/, ``lost_events``, ...)."""
        return _or_empty(self.details.get("trace"), dict)

    @property
    def guest(self) -> dict:
        """A lab run's guest, as it reported itself (``kernel``, ``nproc``, ...)."""
        return _or_empty(self.details.get("guest"), dict)

    @property
    def boot(self) -> dict:
        """The boot a lab or boot-plan run ran in (``kernel_release``, ``cmdline``, ...)."""
        return _or_empty(self.details.get("boot"), dict)

    @property
    def interference(self) -> dict:
        """What else the machine ran during the run (``busy`` and its measures)."""
        return _or_empty(self.details.get("interference"), dict)

    @property
    def extras(self) -> list:
        """The run's per-run cross-checks (each with its ``name``, ``status``, ``directory``)."""
        return _or_empty(self.details.get("extras"), list)

    def extra(self, name: str) -> dict | None:
        """The run's first cross-check called ``name``."""
        return next((e for e in self.extras if e.get("name") == name), None)

    @classmethod
    def from_json(cls, data: dict) -> RunRecord:
        typed = {k: data[k] for k in cls.TYPED if k in data}
        return cls(
            **typed,
            details={k: v for k, v in data.items() if k not in cls.TYPED},
            absent=frozenset(k for k in cls.TYPED if k not in data),
        )

    def to_json(self) -> dict:
        typed = {k: getattr(self, k) for k in self.TYPED if k not in self.absent}
        return {**typed, **self.details}


def run_failed(record: RunRecord) -> bool:
    """Whether a run is failed: :attr:`RunRecord.failed`."""
    return record.failed


@dataclass
class Manifest:
    """A bundle's manifest.json, typed (docs/ARCHITECTURE.md, "4. Bundles"). Optional keys are None when the
    manifest does not have them and are then left out of the JSON; keys this class does not name are kept as
    written in ``details``. ``Manifest.from_json(m).to_json() == m`` for every manifest (an optional key written
    as null stays null)."""

    claim: str
    experiment: str
    definition: dict
    host: dict
    runs: list[RunRecord] = field(default_factory=list)
    schema_version: int = SCHEMA_VERSION
    status: str = "incomplete"  # "incomplete" from the first byte, "sealed" at the end
    host_id: str | None = None
    tools: dict | None = None
    ticklab_version: str | None = None
    started: str | None = None
    sealed: str | None = None
    requirements: dict | None = None
    conditions: list | None = None
    seed: int | None = None
    runs_per_condition: int | None = None
    warmup_per_condition: int | None = None
    order: list | None = None  # every planned run; runs added by the stopping rule carry "round"
    tracing: dict | None = None
    stopping: dict | None = None
    knobs: list | None = None
    extras: list | None = None
    profiles: list | str | None = None
    not_testable: str | None = None
    interrupted: str | None = None
    lab: dict | None = None
    boot_plan: dict | None = None  # a capture made through a boot plan: its id, mode and how it ended
    raw_files: dict | None = None
    files: dict | None = None
    resealed: list | None = None  # each re-seal (ticklab bundle repack): when, from which seal, what, why
    supersedes: list | None = None  # the bundles this recapture replaces (--supersedes): each one's path and seal
    details: dict = field(default_factory=dict)
    nulls: frozenset = field(default=frozenset(), repr=False, compare=False)  # optional keys written as null

    def measured_runs(self) -> list[RunRecord]:
        return [r for r in self.runs if r.measured]

    def failed_runs(self) -> list[RunRecord]:
        return [r for r in self.runs if r.failed]

    @property
    def runs_by_name(self) -> dict[str, RunRecord]:
        return {r.run: r for r in self.runs}

    @property
    def conditions_by_name(self) -> dict[str, dict]:
        """Each condition's record (its ``name`` and its variables' values), in the experiment's order."""
        return {c.get("name"): c for c in self.conditions or []}

    @property
    def blocks_by_run(self) -> dict[str, int | None]:
        """The block each planned run was planned in (None for captures not planned in blocks)."""
        return {entry["run"]: entry.get("block") for entry in self.order or []}

    @property
    def workload_tool(self) -> str | None:
        return (self.definition.get("workload") or {}).get("tool")

    def host_fact(self, name: str):
        """One of the host facts (None where it is not recorded)."""
        return _or_empty(self.host, dict).get(name)

    def kernel_release(self, run: RunRecord) -> str:
        """The kernel the run ran on: its guest's, else its boot's, else the host's ("" where none is recorded)."""
        return str(run.guest.get("kernel") or run.boot.get("kernel_release") or self.host_fact("kernel_release") or "")

    @classmethod
    def _keys(cls) -> list[str]:
        return [f.name for f in fields(cls) if f.name not in ("details", "nulls")]

    @classmethod
    def from_json(cls, data: dict) -> Manifest:
        keys = cls._keys()
        typed = {k: data[k] for k in keys if k in data and k != "runs"}
        return cls(
            **typed,
            runs=[RunRecord.from_json(r) for r in data.get("runs", [])],
            details={k: v for k, v in data.items() if k not in keys},
            nulls=frozenset(k for k, v in typed.items() if v is None),
        )

    def to_json(self) -> dict:
        data = {
            k: getattr(self, k)
            for k in self._keys()
            if k != "runs" and (getattr(self, k) is not None or k in self.nulls)
        }
        return {**data, "runs": [r.to_json() for r in self.runs], **self.details}

    def file_bytes(self) -> bytes:
        """manifest.json as ticklab writes it."""
        return (json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n").encode()


def measured_results(manifest: Manifest, results: pd.DataFrame) -> pd.DataFrame:
    """results.csv rows of the runs that finished ok (failed runs and runs with a problem left out)."""
    failed = {r.run for r in manifest.failed_runs()}
    return results[~results["run"].isin(failed)]


def stopped_because(manifest: Manifest) -> str:
    """Why a bundle's capture stopped (its stopping record); bundles from before there was one ran a fixed count."""
    reason = (manifest.stopping or {}).get("reason")
    if reason:
        return reason
    if manifest.status != "sealed":
        return "interrupted before the stopping rule decided"
    return "fixed run count (the manifest has no stopping record)"


class BundleError(ValueError):
    """A bundle is malformed, incomplete or tampered with; the message names the file."""


def bundle_name(experiment: str, when: datetime) -> str:
    return f"{when.astimezone(UTC).strftime('%Y%m%dT%H%M%SZ')}-{experiment}"


class BundleWriter:
    def __init__(
        self,
        traces_dir: Path | str,
        host_id: str,
        claim: str,
        experiment: str,
        *,
        definition: dict,
        host: dict,
        tools: dict | None = None,
        when: datetime | None = None,
    ):
        when = when or datetime.now(UTC)
        for what, name in (("host id", host_id), ("claim", claim), ("experiment", experiment)):
            if not isinstance(name, str) or not re.match(schemas.RUN_NAME, name):
                raise BundleError(
                    f"{traces_dir}: {what} {name!r} cannot name a directory (letters, digits, '.', '_', "
                    "'-'; no path separator)"
                )
        relative = Path(host_id) / claim / bundle_name(experiment, when)
        self.path = Path(traces_dir) / relative
        try:
            # every component below traces_dir made or opened by descriptor: a link planted there (traces/<host-id>
            # pointing elsewhere) is refused, never followed; the bundle directory itself is new
            with OwnedDir(traces_dir) as traces:
                self.files = traces.subdir(relative, new=True)
            weakref.finalize(self, self.files.close)  # its descriptor, when the writer is dropped unsealed
        except UnsafeFileError as exc:
            if "exists already" in str(exc):
                raise BundleError(f"{self.path}: bundle exists already; bundles are never overwritten") from None
            raise BundleError(f"{exc} (cannot create the bundle there)") from None
        try:
            self.manifest = Manifest(
                claim=claim,
                experiment=experiment,
                definition=definition,
                host_id=host_id,
                host=host,
                tools=tools or {},
                ticklab_version=__version__,
                started=when.astimezone(UTC).isoformat(),
            )
            self.flush()
            self._write(lambda: self.files.append(RESULTS, _csv_rows([RESULT_COLUMNS])))
        except BaseException:
            self.files.close()
            raise

    @classmethod
    def reopen(cls, path: Path | str) -> BundleWriter:
        """An incomplete bundle, to append runs to (a capture that goes on in a new process, e.g. after a reboot).
        A sealed bundle is never reopened."""
        bundle = load_bundle(path, allow_incomplete=True)
        if bundle.manifest.status != "incomplete":
            raise BundleError(
                f"{Path(path) / MANIFEST}: status {bundle.manifest.status!r}; only an incomplete bundle takes more runs"
            )
        writer = cls.__new__(cls)
        writer.path = Path(path)
        writer.manifest = bundle.manifest
        writer.files = writer._write(lambda: OwnedDir(path, create=False))
        weakref.finalize(writer, writer.files.close)
        return writer

    def _write(self, write):
        """``write()``, its failure (a link refused, a full disk) a BundleError naming the file."""
        try:
            return write()
        except UnsafeFileError as exc:
            raise BundleError(str(exc)) from None

    def flush(self) -> None:
        data = self.manifest.file_bytes()
        self._write(lambda: self.files.write_atomic(MANIFEST, data))

    def discard(self) -> None:
        """Remove the bundle this writer just opened, before any run went into it (a capture refused after opening
        it); a bundle holding anything else is refused."""
        present = sorted(os.listdir(self.files.fd))
        if self.manifest.runs or present != sorted([MANIFEST, RESULTS]):
            raise BundleError(f"{self.path}: holds runs or files ({', '.join(present)}); not discarded")
        for name in present:
            self._write(lambda: self.files.remove(name))
        self.files.close()
        with OwnedDir(self.path.parent, create=False) as parent:
            self._write(lambda: parent.remove(self.path.name))

    def run_dir(self, run: str) -> Path:
        """raw/<run>, made here and now (it must not exist): the directory a run's workload and tracer write in."""
        self._write(lambda: self.files.mkdirs("raw"))
        self._write(lambda: self.files.mkdir_new(Path("raw") / run))
        return self.path / "raw" / run

    def add_run_file(self, run: str, name: str, data: bytes) -> str:
        """A new file in a made run's raw/<run>/ (never over one there); its path inside the bundle."""
        relative = Path("raw") / run / name
        self._write(lambda: self.files.write_new(relative, data))
        return str(relative)

    def add_run(self, record: dict | RunRecord, results: list[dict]) -> None:
        """Record one finished run and its tidy results; the manifest on disk stays current. The rows are appended
        whole or not at all (a full disk leaves results.csv as it was, and the run unrecorded)."""
        if isinstance(record, dict):
            missing = [k for k in ("run", "condition") if k not in record]
            if missing:
                raise BundleError(f"{self.path / MANIFEST}: run record lacks {', '.join(missing)}")
            record = RunRecord.from_json(record)
        if results:
            text = io.StringIO(newline="")
            writer = csv.DictWriter(text, fieldnames=RESULT_COLUMNS)
            for row in results:
                writer.writerow({"run": record.run, "condition": record.condition, **row})
            self._write(lambda: self.files.append(RESULTS, text.getvalue().encode()))
        self.manifest.runs.append(record)
        self.flush()

    def results(self) -> pd.DataFrame:
        """results.csv as written so far."""
        import pandas as pd

        return pd.read_csv(self.path / RESULTS)

    def compress_raw(self, threshold: int = COMPRESS_FROM_BYTES) -> None:
        """Every raw file in the form a sealed bundle keeps it (:func:`pack_raw_file`): the gap detector's text as its
        numbers (gaps.parquet.xz), any other file of ``threshold`` bytes or more xz'd, in every run (``ticklab view``
        unpacks a run's trace for KernelShark into its cache). ticklab's readers take either form
        (:mod:`ticklab.trace.rawfile`, ``capture.workloads.read_gapdet``)."""
        counts = {"xz": 0, "gapdet": 0}
        raw = self.path / RAW
        for path in sorted(raw.rglob("*")) if os.path.isdir(raw) else []:
            if not is_regular(path):
                continue
            relative = path.relative_to(self.path)
            packed = self._write(lambda: pack_raw_file(path, relative, self.files, threshold))
            if packed is not None:
                self._write(lambda: self.files.remove(relative))
                counts[packed[1]] += 1
        if any(counts.values()):
            self.manifest.raw_files = raw_files_record(counts["xz"], counts["gapdet"], threshold)

    def seal(self) -> Path:
        self.compress_raw()
        relatives = sorted(_bundle_files(self.path))
        self.manifest.files = {relative: _hash_regular(self.path / relative) for relative in relatives}
        self.manifest.status = "sealed"
        self.manifest.sealed = datetime.now(UTC).isoformat()
        self.flush()
        self._write(lambda: seal_manifest(self.files, self.path, relatives))
        self.files.close()
        return self.path


RAW = "raw"
PACKED_HOW = (
    "raw files of {threshold} bytes or more are xz'd (xz -d for other tools; ticklab view unpacks a trace "
    "for KernelShark); the gap detector's output is kept as its numbers, gaps.parquet.xz in place of its "
    "stdout.txt (ticklab.trace.gapfile: lossless, its text given back byte for byte)"
)


def raw_files_record(compressed: int, compacted: int, threshold: int = COMPRESS_FROM_BYTES) -> dict:
    """The manifest's ``raw_files``: how many raw files the seal xz'd and how many gap detector outputs it kept as
    numbers, and how."""
    return {"compressed": compressed, "compacted": compacted, "how": PACKED_HOW.format(threshold=threshold)}


def _starts_with(path: Path, prefix: bytes) -> bool:
    """Whether the file (unpacked, for an .xz) begins with ``prefix``; read without following a link."""
    try:
        with open_regular(path) as handle:
            if path.suffix != ".xz":
                return handle.read(len(prefix)) == prefix
            with lzma.open(handle) as unpacked:
                return unpacked.read(len(prefix)) == prefix
    except (UnsafeFileError, OSError, lzma.LZMAError, EOFError):
        return False


def packs(source: Path, relative: Path | str, threshold: int = COMPRESS_FROM_BYTES) -> bool:
    """Whether :func:`pack_raw_file` would rewrite the raw file, as far as its name, size and first line say: the gap
    detector's text (which stays text where its numbers would not give it back), or a file of ``threshold`` bytes or
    more not yet xz'd."""
    name = Path(relative).name
    if name in (gapfile.TEXT_NAME, gapfile.TEXT_NAME + ".xz") and _starts_with(source, gapfile.FIRST_LINE):
        return True
    return not name.endswith(".xz") and source.lstat().st_size >= threshold


def pack_raw_file(
    source: Path, relative: Path | str, out: OwnedDir, threshold: int = COMPRESS_FROM_BYTES
) -> tuple[str, str] | None:
    """Write the raw file ``relative`` (read from ``source``) into ``out`` in the form a sealed bundle keeps it, and
    say where and how: (new relative path, "gapdet") for the gap detector's text (``stdout.txt`` or its .xz),
    written as its numbers to ``gaps.parquet.xz`` beside it (:func:`ticklab.trace.gapfile.compact`, which packs only
    what it gives back byte for byte); (relative + ".xz", "xz") for any other file of ``threshold`` bytes or more
    not yet xz'd; None where the file stays as it is (nothing written). The new file must not exist in ``out``."""
    relative = Path(relative)
    if relative.name in (gapfile.TEXT_NAME, gapfile.TEXT_NAME + ".xz") and _starts_with(source, gapfile.FIRST_LINE):
        try:
            numbers = gapfile.compact(rawfile.read_bytes(source, gapfile.TEXT_LIMIT))
        except rawfile.RawFileError:
            numbers = None
        if numbers is not None:
            target = relative.with_name(gapfile.COMPACT_NAME + ".xz")
            out.write_new(target, lzma.compress(numbers, preset=XZ_PRESET))
            return str(target), "gapdet"
    if relative.suffix == ".xz" or source.lstat().st_size < threshold:
        return None
    target = relative.with_name(relative.name + ".xz")
    with (
        open_regular(source) as plain,
        out.create(target, exclusive=True) as packed_file,
        lzma.open(packed_file, "wb", preset=XZ_PRESET) as packed,
    ):
        try:
            shutil.copyfileobj(plain, packed)
        except OSError as exc:
            raise BundleError(f"{out.root / target}: cannot write ({exc.strerror or exc})") from None
    return str(target), "xz"


def seal_manifest(files: OwnedDir, path: Path, relatives: list[str]) -> None:
    """Seal the bundle ``files`` holds (at ``path``), whose manifest.json is written: its manifest.sha256 written,
    then every file (``relatives``, the manifest and the seal) made read-only on its descriptor."""
    manifest = files.read_bytes(MANIFEST, MAX_MANIFEST_BYTES)
    files.write_atomic(SEAL, _seal_text(manifest).encode())
    for relative in [*relatives, MANIFEST, SEAL]:
        fd = open_fd(relative, dir_fd=files.fd, shown_as=path / relative)
        try:
            os.fchmod(fd, stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
        finally:
            os.close(fd)


def _csv_rows(rows: list[list]) -> bytes:
    text = io.StringIO(newline="")
    csv.writer(text).writerows(rows)
    return text.getvalue().encode()


@dataclass
class Bundle:
    path: Path
    manifest: Manifest
    results: pd.DataFrame

    @property
    def sealed(self) -> bool:
        return self.manifest.status == "sealed"


MAX_MANIFEST_BYTES = 64 << 20
MAX_RESULTS_BYTES = 256 << 20


def _read_regular(path: Path, limit: int) -> bytes:
    """The bytes of a regular file reached without a link, at most ``limit`` of them (ticklab.safefiles: a FIFO,
    a device or /proc/self/pagemap is never read); BundleError otherwise."""
    if not os.path.lexists(path):
        raise BundleError(f"{shown(path)}: missing")
    try:
        return read_bytes(path, limit)
    except UnsafeFileError as exc:
        raise BundleError(str(exc)) from None


def file_sha256(path: Path) -> str:
    """sha256 of a regular file, as the manifest's ``files`` lists it (read without following a link)."""
    return _hash_regular(path)


def _hash_regular(path: Path) -> str:
    """sha256 of a regular file inside the bundle, read through a descriptor that cannot follow a symlink."""
    digest = hashlib.sha256()
    try:
        with open_regular(path) as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    except UnsafeFileError as exc:
        raise BundleError(str(exc)) from None
    except OSError as exc:
        raise BundleError(f"{shown(path)}: cannot read ({exc.strerror or exc})") from None
    return digest.hexdigest()


def _bundle_files(path: Path) -> set[str]:
    """Every file of a bundle (relative), walking without following links; a symlink or a special file is an error."""
    found = set()
    for directory, dirs, files in os.walk(path, followlinks=False, onerror=lambda exc: _walk_error(exc)):
        for name in [*dirs, *files]:
            entry = Path(directory) / name
            info = os.lstat(entry)
            if stat.S_ISDIR(info.st_mode):
                continue
            if not stat.S_ISREG(info.st_mode):
                raise BundleError(
                    f"{shown(entry)}: {kind_of(info.st_mode)} in the bundle; a bundle holds regular files only"
                )
            found.add(str(entry.relative_to(path)))
    return found - {MANIFEST, SEAL}


def _walk_error(exc: OSError):
    raise BundleError(f"{shown(exc.filename)}: cannot list ({exc.strerror or exc})")


def manifest_digest(manifest_bytes: bytes) -> str:
    return hashlib.sha256(manifest_bytes).hexdigest()


def _seal_text(manifest_bytes: bytes) -> str:
    return f"{manifest_digest(manifest_bytes)}  {MANIFEST}\n"  # the format of sha256sum: `sha256sum -c manifest.sha256`


def _check_seal(path: Path, manifest_bytes: bytes) -> None:
    seal = path / SEAL
    if not os.path.lexists(seal):
        raise BundleError(
            f"{seal}: missing, so nothing covers {MANIFEST} (a bundle sealed before ticklab sealed "
            f"its manifest: 'ticklab seal-manifest {path}' adds it after checking every file)"
        )
    text = _read_regular(seal, 4096).decode("ascii", errors="replace")
    expected = text.split()[0] if text.split() else ""
    if expected != manifest_digest(manifest_bytes):
        raise BundleError(f"{path / MANIFEST}: sha256 differs from {SEAL} (manifest modified after sealing)")


def _check_files(path: Path, listed: dict) -> None:
    present = _bundle_files(path)
    added = sorted(present - set(listed))
    if added:
        raise BundleError(f"{shown(path / added[0])}: not listed in the manifest (added after sealing)")
    for relative, expected in sorted(listed.items()):
        file = path / relative
        if relative not in present:
            raise BundleError(f"{shown(file)}: listed in the manifest but missing")
        if _hash_regular(file) != expected:
            raise BundleError(f"{shown(file)}: sha256 differs from the manifest (modified after sealing)")


def _read_results(path: Path, runs: list[dict]) -> pd.DataFrame:
    """results.csv, every row checked against its schema (five fields, a finite number in ``value``) and against
    the manifest's ``runs`` (:func:`_check_row_run`)."""
    import pandas as pd

    file = path / RESULTS
    if not os.path.lexists(file):
        return pd.DataFrame(columns=RESULT_COLUMNS)
    try:
        text = _read_regular(file, MAX_RESULTS_BYTES).decode("utf-8")
        rows = list(csv.reader(io.StringIO(text, newline="")))
    except UnicodeDecodeError as exc:
        raise BundleError(f"{file}: not a readable CSV (not UTF-8 at byte {exc.start})") from None
    except csv.Error as exc:
        raise BundleError(f"{file}: not a readable CSV ({exc})") from None
    if not rows or rows[0] != RESULT_COLUMNS:
        raise BundleError(f"{file}: not a readable CSV: columns {rows[0] if rows else []}, expected {RESULT_COLUMNS}")
    records, by_run = [], {r["run"]: r for r in runs}
    first_row: dict[tuple[str, str], int] = {}
    for number, row in enumerate(rows[1:], 2):
        if len(row) != len(RESULT_COLUMNS):
            raise BundleError(f"{file}: row {number}: {len(row)} field(s), expected {len(RESULT_COLUMNS)}")
        record = dict(zip(RESULT_COLUMNS, row, strict=True))
        schemas.check(record, schemas.RESULT_ROW, f"{file}: row {number}", BundleError)
        value = float(record["value"])
        if not math.isfinite(value):
            raise BundleError(f"{file}: row {number}: value: {shown(repr(record['value']))} is not a finite number")
        _check_row_run(f"{file}: row {number}", record, by_run)
        key = (record["run"], record["metric"])
        if key in first_row:
            raise BundleError(
                f"{file}: row {number}: a second {record['metric']} row for run {record['run']} "
                f"(the first is row {first_row[key]})"
            )
        first_row[key] = number
        records.append({**record, "value": value})
    return pd.DataFrame(records, columns=RESULT_COLUMNS)


def _check_row_run(where: str, record: dict, by_run: dict[str, dict]) -> None:
    """A results.csv row belongs to a run the manifest records, that is not a warm-up (warm-ups keep their
    results in the manifest, never in results.csv), under that run's condition. Rows of a failed run may be
    there (a lab run whose guest booted wrong keeps its results beside its problem); no analysis reads them."""
    run = by_run.get(record["run"])
    if run is None:
        raise BundleError(f"{where}: run {record['run']} is not a run of {MANIFEST}")
    if run.get("warmup"):
        raise BundleError(f"{where}: run {record['run']} is a warm-up run, which has no rows in {RESULTS}")
    if run["condition"] != record["condition"]:
        raise BundleError(
            f"{where}: condition {shown(repr(record['condition']), 80)} is not run {record['run']}'s "
            f"condition in {MANIFEST}, {shown(repr(run['condition']), 80)}"
        )


def check_complete(path: Path, manifest: Manifest) -> None:
    """A BundleError unless the bundle finished (a reader that wants only complete bundles)."""
    if manifest.status == "incomplete":
        raise BundleError(
            f"{path / MANIFEST}: bundle is incomplete ({len(manifest.runs)} run(s) finished); "
            "pass allow_incomplete to read what it has"
        )


def load_bundle(path: Path | str, *, allow_incomplete: bool = False, require_seal: bool = True) -> Bundle:
    """Load a bundle, verifying its schema, its manifest's seal and (when sealed) every file's checksum.
    Any problem is a BundleError naming the file (and the field); nothing else escapes."""
    path = Path(path)
    try:
        return _load(path, allow_incomplete, require_seal)
    except BundleError:
        raise
    except RecursionError:
        raise BundleError(f"{path / MANIFEST}: nested too deeply") from None
    except (OSError, ValueError, TypeError, KeyError, AttributeError, MemoryError) as exc:
        where = getattr(exc, "filename", None) or path
        raise BundleError(f"{shown(where)}: {type(exc).__name__}: {shown(str(exc))}") from None


def _load(path: Path, allow_incomplete: bool, require_seal: bool) -> Bundle:
    manifest_path = path / MANIFEST
    if not os.path.lexists(manifest_path):
        raise BundleError(f"{manifest_path}: missing; {path} is not a bundle")
    manifest_bytes = _read_regular(manifest_path, MAX_MANIFEST_BYTES)
    try:
        manifest = json.loads(manifest_bytes.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise BundleError(f"{manifest_path}: not UTF-8 (byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise BundleError(f"{manifest_path}: not valid JSON ({exc})") from None
    if isinstance(manifest, dict) and "schema_version" in manifest and manifest["schema_version"] != SCHEMA_VERSION:
        raise BundleError(
            f"{manifest_path}: schema version {manifest['schema_version']!r}, this ticklab reads {SCHEMA_VERSION}"
        )
    schemas.check(manifest, schemas.MANIFEST, str(manifest_path), BundleError)
    if manifest["status"] != "sealed" and os.path.lexists(path / SEAL):
        # a sealed bundle edited back to 'incomplete' would otherwise be read without any of its checks
        _check_seal(path, manifest_bytes)
    typed = Manifest.from_json(manifest)
    if not allow_incomplete:
        check_complete(path, typed)
    if manifest["status"] == "sealed":
        if require_seal:
            _check_seal(path, manifest_bytes)
        _check_files(path, manifest["files"])
    results = _read_results(path, manifest["runs"])
    return Bundle(path=path, manifest=typed, results=results)


def sealed_files(manifest_bytes: bytes) -> dict | None:
    """The ``files`` of a sealed manifest.json's bytes, or None where they are no sealed manifest (a reader that
    trusts a seal it checked itself and verifies nothing else, such as the derived-data cache)."""
    try:
        manifest = json.loads(manifest_bytes.decode("utf-8"))
    except (ValueError, RecursionError):  # not UTF-8, not JSON, or nested too deeply
        return None
    if not isinstance(manifest, dict) or manifest.get("status") != "sealed":
        return None
    return manifest["files"] if isinstance(manifest.get("files"), dict) else None


def add_manifest_seal(path: Path | str) -> Path:
    """For a bundle sealed before the manifest had its own seal: check every file, then write manifest.sha256.
    The one change ever made to a sealed bundle, and only by adding that file (see SECURITY.md): through the
    bundle directory's descriptor, created where nothing is (a link or anything else put there while the files
    are hashed is refused, never written through) and made read-only on its descriptor."""
    path = Path(path)
    seal = path / SEAL
    if os.path.lexists(seal):
        raise BundleError(f"{seal}: exists already")
    try:
        files = OwnedDir(path, create=False)
    except UnsafeFileError as exc:
        raise BundleError(str(exc)) from None
    with files:
        bundle = load_bundle(path, require_seal=False)
        if not bundle.sealed:
            raise BundleError(f"{path / MANIFEST}: not sealed; only a sealed bundle gets a manifest seal")
        try:
            manifest = files.read_bytes(MANIFEST, MAX_MANIFEST_BYTES)
            files.write_new(SEAL, _seal_text(manifest).encode(), mode=stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
        except UnsafeFileError as exc:
            raise BundleError(str(exc)) from None
    load_bundle(path)
    return seal


def seal_digest(bundle: Path) -> str:
    """A sealed bundle's identity across copies: the sha256 of its manifest.sha256."""
    return hashlib.sha256(read_bytes(bundle / SEAL, 4096)).hexdigest()


def superseded_record(old: Path | str, claim: str, experiment: str) -> dict:
    """What a recapture records of a bundle it replaces (``--supersedes OLD``): OLD's place under its data directory
    (``<host-id>/<claim>/<bundle>``), its seal (the sha256 of its manifest.sha256, as bundle export names it), when
    it was sealed and how many runs it measured. OLD must be a sealed bundle whose every file verifies, of the same
    claim and experiment: a recapture replaces a capture of the same experiment. BundleError naming OLD otherwise."""
    old = Path(old)
    bundle = load_bundle(old)
    manifest = bundle.manifest
    if (manifest.claim, manifest.experiment) != (claim, experiment):
        raise BundleError(
            f"{old}: --supersedes names a bundle of {manifest.claim}/{manifest.experiment}, not {claim}/{experiment}: "
            "a recapture replaces a capture of the same experiment"
        )
    resolved = old.resolve()
    return {
        "bundle": "/".join(resolved.parts[-3:]),
        "seal": seal_digest(old),
        "sealed": manifest.sealed,
        "measured_runs": len(manifest.measured_runs()),
    }
