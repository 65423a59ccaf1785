"""Derived once per sealed bundle: what the analysis computes from a run's raw files (FTQ's parsed quanta, the tick
cost per run, the gap detector's rows, osnoise's readings …), kept on disk so the next report reads it back instead
of unpacking and parsing the same files again.

A sealed bundle never changes (docs/ARCHITECTURE.md §4): its ``manifest.sha256`` covers ``manifest.json``, which
lists every file's sha256. So a result derived from its raw files is fixed by two things, and it is stored under both:

- the **seal**: the sha256 of the bundle's ``manifest.sha256`` (its content, so a bundle copied elsewhere keeps its
  entries and a re-sealed one gets new ones);
- the **code version**: the sha256 of the source files of the modules that compute it (``modules``: package-relative
  files such as ``"trace/tickcost.py"``, or a folder such as ``"trace/"`` for every ``.py`` and ``.c`` file below it),
  of this module, and of the versions of Python, numpy, pandas, scipy and pyarrow. A change to any is a new version.

``per_run(bundle, kind, modules, run, params, compute)`` returns ``compute()``'s value: read back from
``$TICKLAB_CACHE/derived/<seal>/<kind>/<key>.json|.parquet`` (``TICKLAB_CACHE`` defaults to ``~/.cache/ticklab``,
as for the lab) where an entry of the same seal, version, kind, run and ``params`` is there, else computed and
stored. ``bundle`` is

- a :class:`~ticklab.analysis.captured.BundleRef`: its ``load()`` (once per reference) verified the seal and every
  file's sha256; only a sealed bundle is cached;
- or a bundle directory (for code given only a run's raw directory, e.g. a condition check): then the seal is checked
  here (``manifest.sha256`` covers ``manifest.json``, whose status is ``sealed``) and each of ``inputs`` — the files or
  folders the computation reads, relative to the bundle (``"raw/run-003/ftq.dat"`` finds its ``.xz`` too) — must be
  what the manifest lists, byte for byte (a folder: every file in it, and no other); anything else is not cached.

Whatever cannot be cached is computed as if there were no cache: an unsealed, incomplete or unloadable bundle, a
bundle directory whose inputs differ from its manifest, a value the encodings below cannot give back exactly, a
cache directory that cannot be written. An entry that cannot be read, is not this user's own (or is writable by
others), does not decode, or names another seal, version, kind, run or params is recomputed and replaced.

Files are written and read only through :mod:`ticklab.safefiles`: the cache directory is opened component by
component below ``$TICKLAB_CACHE`` without following a link, an entry is written whole to a temporary file beside it
and renamed over it (``OwnedDir.write_atomic``), and a link, hard link, FIFO or device at an entry's name is refused,
never read or written through (the value is then returned uncached). Two encodings, no pickle:

- JSON (the default) for ``None``, ``bool``, ``int``, ``float`` (NaN and infinities as ``{"$float": "nan"}``),
  ``str``, numpy scalars (``{"$numpy": "float64", "value": …}``), and lists, tuples and dicts (string keys) of them,
  each tagged so that what is read back has the very types that were stored;
- Parquet (``frame=True``) for a pandas DataFrame, or a ``(meta, DataFrame)`` pair whose ``meta`` is JSON as above.

A value is stored only if decoding what was written gives it back exactly (same types, dtypes, index and values),
so a hit returns what a recomputation returns. ``rm -rf ~/.cache/ticklab/derived`` (or ``$TICKLAB_CACHE/derived``)
clears the cache; nothing else depends on it.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import math
import os
import platform
import re
import stat
from collections.abc import Callable, Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import TypeVar

import numpy as np
import pandas as pd

from ..bundle import MANIFEST, MAX_MANIFEST_BYTES, SEAL, BundleError, manifest_digest, sealed_files
from ..paths import cache_dir
from ..safefiles import OwnedDir, UnsafeFileError, open_regular, read_bytes
from ..trace import rawfile
from .captured import BundleRef

T = TypeVar("T")

FORMAT = 1  # the layout of an entry; a change is a new version of every entry
PACKAGE_DIR = Path(__file__).resolve().parent.parent
SUBDIR = "derived"
ENTRY_LIMIT = 1 << 30  # an entry larger than this is not read (recomputed)
_KIND = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")
_LIBRARIES = ("numpy", "pandas", "scipy", "pyarrow")


def cache_root() -> Path:
    """Where the entries are: ``$TICKLAB_CACHE/derived``."""
    return cache_dir() / SUBDIR


# -- the code version --------------------------------------------------------------------------------------------


def _sources(entry: str) -> list[Path]:
    path = PACKAGE_DIR / entry
    if entry.endswith("/"):
        found = sorted(p for p in path.rglob("*") if p.suffix in (".py", ".c") and p.is_file())
        if not found:
            raise ValueError(f"derived: {entry!r} holds no .py or .c file of the ticklab package")
        return found
    if not path.is_file():
        raise ValueError(f"derived: {entry!r} is not a source file of the ticklab package")
    return [path]


@functools.cache
def code_version(modules: tuple[str, ...]) -> str:
    """sha256 over the named source files (package-relative; a folder ending in ``/``: every .py and .c file below
    it), this module's own source, the entry format and the versions of Python and the numeric libraries."""
    digest = hashlib.sha256(f"format {FORMAT}\npython {platform.python_version()}\n".encode())
    for library in _LIBRARIES:
        try:
            digest.update(f"{library} {metadata.version(library)}\n".encode())
        except metadata.PackageNotFoundError:
            digest.update(f"{library} -\n".encode())
    own = Path(__file__).read_bytes()
    digest.update(f"analysis/derived.py {len(own)}\n".encode() + own)
    files = {path for entry in modules for path in _sources(entry)}
    for path in sorted(files):
        data = path.read_bytes()
        digest.update(f"{path.relative_to(PACKAGE_DIR).as_posix()} {len(data)}\n".encode() + data)
    return digest.hexdigest()


# -- the seal ----------------------------------------------------------------------------------------------------


def _identity(info: os.stat_result) -> tuple:
    return info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns


_SEALS: dict[tuple, tuple[str, dict] | None] = {}
_HASHES: dict[tuple, str] = {}


def _sealed(bundle_dir: Path) -> tuple[str, dict] | None:
    """(seal key, the manifest's ``files``) of a sealed bundle whose manifest.sha256 covers its manifest.json, or
    None. Read again only when either file changed (their lstat)."""
    try:
        seal_info, manifest_info = os.lstat(bundle_dir / SEAL), os.lstat(bundle_dir / MANIFEST)
    except OSError:
        return None
    if not (stat.S_ISREG(seal_info.st_mode) and stat.S_ISREG(manifest_info.st_mode)):
        return None
    memo = (str(bundle_dir), _identity(seal_info), _identity(manifest_info))
    if memo not in _SEALS:
        _SEALS[memo] = _read_seal(bundle_dir)
    return _SEALS[memo]


def _read_seal(bundle_dir: Path) -> tuple[str, dict] | None:
    try:
        seal = read_bytes(bundle_dir / SEAL, 4096)
        manifest_bytes = read_bytes(bundle_dir / MANIFEST, MAX_MANIFEST_BYTES)
        words = seal.decode("ascii").split()
        if not words or words[0] != manifest_digest(manifest_bytes):
            return None
    except (UnsafeFileError, OSError, ValueError):
        return None
    files = sealed_files(manifest_bytes)
    return None if files is None else (hashlib.sha256(seal).hexdigest(), files)


def _file_sha256(path: Path) -> str | None:
    try:
        info = os.lstat(path)
        memo = (str(path), _identity(info))
        if memo not in _HASHES:
            digest = hashlib.sha256()
            with open_regular(path) as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
            _HASHES[memo] = digest.hexdigest()
        return _HASHES[memo]
    except (UnsafeFileError, OSError):
        return None


def _inputs_listed(bundle_dir: Path, files: dict, inputs: Sequence[str]) -> bool:
    """Whether each input is what the manifest lists: the file a reader opens (``rawfile.locate``: the plain name
    or its .xz) listed with its sha256; a folder, every file below it listed and no other; nothing at a name with
    nothing listed under it."""
    for name in inputs:
        parts = Path(name).parts
        if not parts or Path(name).is_absolute() or ".." in parts:
            return False
        prefix = Path(name).as_posix().rstrip("/") + "/"
        under = {rel: digest for rel, digest in files.items() if rel.startswith(prefix)}
        path = bundle_dir / name
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            info = None
        except OSError:
            return False
        if info is not None and stat.S_ISDIR(info.st_mode):
            present = set()
            for directory, dirs, names in os.walk(path, followlinks=False):
                for entry in [*dirs, *names]:
                    if not stat.S_ISDIR(os.lstat(Path(directory) / entry).st_mode):
                        present.add((Path(directory) / entry).relative_to(bundle_dir).as_posix())
            if present != set(under):
                return False
            if any(_file_sha256(bundle_dir / rel) != digest for rel, digest in under.items()):
                return False
            continue
        located = rawfile.locate(path)
        relative = located.relative_to(bundle_dir).as_posix()
        if not os.path.lexists(located):
            if under or relative in files or f"{relative}.xz" in files:
                return False
            continue
        if relative not in files or _file_sha256(located) != files[relative]:
            return False
    return True


def seal_key(bundle: BundleRef | Path | str, inputs: Sequence[str] = ()) -> str | None:
    """The seal key under which results derived from ``bundle`` are cached, or None where they must not be (see the
    module's docstring)."""
    if isinstance(bundle, BundleRef):
        try:
            if not bundle.load(allow_incomplete=True).sealed:
                return None
        except BundleError:
            return None
        sealed = _sealed(bundle.path)
        return sealed[0] if sealed else None
    bundle_dir = Path(bundle)
    if not inputs:
        raise ValueError("derived: a bundle given by its directory needs the inputs the computation reads")
    sealed = _sealed(bundle_dir)
    try:
        if sealed is None or not _inputs_listed(bundle_dir, sealed[1], inputs):
            return None
    except (OSError, ValueError):  # a file gone or changed while it was looked at
        return None
    return sealed[0]


# -- the encodings -----------------------------------------------------------------------------------------------


def _encode(value):
    kind = type(value)
    if value is None or kind in (bool, str, int):
        return value
    if kind is float:
        return value if math.isfinite(value) else {"$float": repr(value)}
    if isinstance(value, np.generic) and value.dtype.kind in "biuf":
        return {"$numpy": value.dtype.name, "value": _encode(value.item())}
    if kind is dict:
        if not all(type(k) is str for k in value):
            raise TypeError("derived: a dict with keys other than strings")
        return {"$dict": [[k, _encode(v)] for k, v in value.items()]}
    if kind in (list, tuple):
        return {"$list" if kind is list else "$tuple": [_encode(v) for v in value]}
    raise TypeError(f"derived: cannot store a {kind.__name__}")


def _decode(value):
    if not isinstance(value, dict):
        if isinstance(value, list):
            raise ValueError("derived: an untagged list")
        return value
    if "$float" in value:
        return float(value["$float"])
    if "$numpy" in value:
        return np.dtype(value["$numpy"]).type(_decode(value["value"]))
    if "$dict" in value:
        return {k: _decode(v) for k, v in value["$dict"]}
    if "$list" in value:
        return [_decode(v) for v in value["$list"]]
    if "$tuple" in value:
        return tuple(_decode(v) for v in value["$tuple"])
    raise ValueError("derived: an untagged object")


def _same(one, other) -> bool:
    """Exactly equal, types included (NaN equals NaN)."""
    if type(one) is not type(other):
        return False
    if isinstance(one, pd.DataFrame):
        try:
            pd.testing.assert_frame_equal(
                one, other, check_exact=True, check_index_type=True, check_column_type=True, check_flags=False
            )
        except AssertionError:
            return False
        return type(one.index) is type(other.index) and one.attrs == other.attrs
    if isinstance(one, (dict,)):
        return list(one) == list(other) and all(_same(one[k], other[k]) for k in one)
    if isinstance(one, (list, tuple)):
        return len(one) == len(other) and all(_same(a, b) for a, b in zip(one, other, strict=True))
    if isinstance(one, (float, np.floating)):
        return (math.isnan(one) and math.isnan(other)) or (
            one == other and math.copysign(1, one) == math.copysign(1, other)
        )
    if isinstance(one, np.generic):
        return one.dtype == other.dtype and one == other
    return one == other


def _dump_json(key: dict, value) -> bytes:
    return json.dumps({"key": key, "value": _encode(value)}, allow_nan=False, separators=(",", ":")).encode()


def _load_json(data: bytes, key: dict):
    document = json.loads(data.decode("utf-8"), parse_constant=_refuse_constant)
    if document.get("key") != key:
        raise ValueError("derived: another key")
    return _decode(document["value"])


def _refuse_constant(name: str):
    raise ValueError(f"derived: bare {name} in an entry")


_META = b"ticklab.derived"


def _dump_parquet(key: dict, value) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pair = isinstance(value, tuple)
    meta, frame = value if pair else (None, value)
    if not isinstance(frame, pd.DataFrame):
        raise TypeError("derived: frame=True stores a DataFrame or a (meta, DataFrame) pair")
    table = pa.Table.from_pandas(frame, preserve_index=None)  # a RangeIndex as metadata, any other as a column
    ours = json.dumps({"key": key, "pair": pair, "meta": _encode(meta)}, allow_nan=False).encode()
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), _META: ours})
    out = io.BytesIO()
    pq.write_table(table, out)
    return out.getvalue()


def _load_parquet(data: bytes, key: dict):
    import pyarrow as pa
    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(pa.BufferReader(data))
    ours = json.loads((parquet.schema_arrow.metadata or {})[_META].decode("utf-8"), parse_constant=_refuse_constant)
    if ours.get("key") != key:
        raise ValueError("derived: another key")
    frame = parquet.read(use_threads=False).to_pandas(use_threads=False)
    return (_decode(ours["meta"]), frame) if ours["pair"] else frame


# -- the cache ---------------------------------------------------------------------------------------------------


def _entry(
    seal: str, kind: str, run: str | None, params: Mapping, modules: Sequence[str], frame: bool
) -> tuple[dict, str]:
    key = {
        "format": FORMAT,
        "seal": seal,
        "version": code_version(tuple(modules)),
        "kind": kind,
        "run": run,
        "params": _encode(dict(sorted(params.items()))),
    }
    name = hashlib.sha256(json.dumps(key, sort_keys=True, allow_nan=False).encode()).hexdigest()[:40]
    return key, f"{SUBDIR}/{seal[:32]}/{kind}/{name}.{'parquet' if frame else 'json'}"


def _read(relative: str, key: dict, frame: bool):
    """The entry's value, or raise (anything: a miss). Read through the directory's descriptor (no component a link),
    the file itself without following a link, and only if this user owns it and no one else may write it."""
    folder, _, name = relative.rpartition("/")
    with OwnedDir(cache_dir()) as base, base.subdir(folder) as directory:
        data = read_bytes(name, ENTRY_LIMIT, dir_fd=directory.fd, shown_as=directory.root / name, owner=os.geteuid())
    return _load_parquet(data, key) if frame else _load_json(data, key)


def _write(relative: str, key: dict, value, frame: bool) -> None:
    """Store ``value`` if it decodes back exactly; a failure to encode or write leaves it unstored."""
    try:
        data = _dump_parquet(key, value) if frame else _dump_json(key, value)
        again = _load_parquet(data, key) if frame else _load_json(data, key)
    except (TypeError, ValueError, KeyError, ImportError, OverflowError):
        return
    if not _same(value, again):
        return
    try:
        with OwnedDir(cache_dir()) as base:
            base.write_atomic(relative, data, mode=0o644)
    except (UnsafeFileError, OSError):
        return


def per_run(
    bundle: BundleRef | Path | str,
    kind: str,
    modules: Sequence[str],
    run: str | None,
    params: Mapping[str, object],
    compute: Callable[[], T],
    *,
    inputs: Sequence[str] = (),
    frame: bool = False,
) -> T:
    """``compute()``'s value for one run (or a bundle-wide extra: ``run`` None) of ``bundle``, from the cache where
    the same seal, code version (``modules``), ``kind``, ``run`` and ``params`` stored it, else computed and stored.
    ``kind`` names what is derived (lower-case letters, digits, '-'); ``params`` is everything else the value depends
    on (JSON-encodable); ``inputs`` the files the computation reads when ``bundle`` is a directory; ``frame``: the value
    is a DataFrame or a (meta, DataFrame) pair, stored as Parquet. Exceptions from ``compute`` propagate and nothing
    is stored."""
    if not _KIND.fullmatch(kind):
        raise ValueError(f"derived: kind {kind!r} is not lower-case letters, digits and '-'")
    seal = seal_key(bundle, inputs)
    if seal is None:
        return compute()
    key, relative = _entry(seal, kind, run, params, modules, frame)
    try:
        return _read(relative, key, frame)
    except Exception:  # anything unreadable, foreign or corrupt is a miss, recomputed and replaced
        pass
    value = compute()
    _write(relative, key, value, frame)
    return value
