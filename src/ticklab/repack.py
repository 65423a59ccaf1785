"""`ticklab bundle repack <bundle>`: a sealed bundle re-sealed with its raw files in the form the seal writes now
(docs/ARCHITECTURE.md §4 Bundles; issue 42 item 3), its results shown unchanged first.

A sealed bundle never changes but through this one path, and only in how its raw files are stored:

1. **verify**: ``load_bundle`` checks the seal, the schema and every file's sha256; a bundle that does not verify is
   refused, untouched.
2. **plan**: the raw files that shrink (``bundle.pack_raw_file``: the gap detector's text as its numbers,
   gaps.parquet.xz; any other file of 64 KiB or more xz'd). None: nothing is done.
3. **copy**: a new bundle at ``.<bundle>.repack`` beside it (``safefiles.OwnedDir``, nothing followed through a
   link): every file as it is but those, written in their new form; its manifest the old one with ``files`` for the
   new files, ``raw_files`` saying how they are kept now, and a ``resealed`` entry appended (when, ``from_seal``: the
   old manifest's sha256, ``files_replaced``: each old name -> the name it has ``now`` and the
   ``sha256`` the old seal listed for it, ``why``, ``ticklab_version``, ``raw_files_before``); then
   sealed (manifest.sha256) and read-only, as ``BundleWriter.seal`` leaves a bundle.
4. **check**: the copy verifies; every replaced file reads back as it was (an xz'd file unpacks to the sha256 the old
   manifest lists; the gap detector's numbers give back its text byte for byte and ``read_gapdet`` reads the same
   header and gaps from both); and the claim's per-run values, computed for the bundle and for the copy through the
   functions the notebooks call — ``measured_runs`` (results.csv less failed runs and runs a condition check leaves
   out), ``run_checks`` (what each condition check observed) and the claim's ``derived_from_raw`` tables — are the
   same, exactly, where they name the bundle's files aside. Anything different, or anything that cannot be computed:
   refused, the copy removed, the bundle untouched.
5. **swap**: the bundle's name must still hold the directory verified (device and inode, through the descriptor
   opened before ``load_bundle``), with the same seal and no file its manifest does not list; ``OwnedDir.exchange``
   then puts the copy at the bundle's name and the bundle at the copy's in one step, checking both names against
   the descriptors held (a directory put there meanwhile is swapped back, nothing removed); the old bundle's listed
   files are then removed through its own descriptor, and anything else is kept and named (issue 55 items 1-2).

A kill at any moment leaves the bundle whole at its name, old or new, never a mix; what it leaves at
``.<bundle>.repack`` (the copy, or the old bundle after the swap) is never counted by the analysis
(``captured.find_bundles`` skips names starting with '.') and the next repack names it and stops until it is removed.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd

from . import __version__
from .bundle import (
    COMPRESS_FROM_BYTES,
    MANIFEST,
    RAW,
    SEAL,
    BundleError,
    Manifest,
    load_bundle,
    pack_raw_file,
    packs,
    raw_files_record,
    seal_manifest,
)
from .safefiles import OwnedDir, UnsafeFileError, open_regular, shown
from .trace import gapfile, rawfile

WHY = (
    "issue 42 item 3, small bundles: every raw file of 64 KiB or more xz'd (the first measured run of each "
    "condition too; ticklab view unpacks a trace for KernelShark), the gap detector's text kept as its numbers"
)
WORK_SUFFIX = ".repack"


class RepackError(ValueError):
    """A bundle that is not re-packed: the message names it and says why; the bundle is as it was."""


@dataclass
class Repacked:
    """What a repack did: the bundle, each raw file replaced (old name -> new name) and its size before and after."""

    path: Path
    replaced: dict[str, str] = field(default_factory=dict)
    bytes_before: int = 0
    bytes_after: int = 0
    how: dict[str, int] = field(default_factory=dict)  # "xz" / "gapdet" -> how many files


def work_path(bundle: Path) -> Path:
    """Where the new copy of ``bundle`` is built (and, after the swap, the old one is until it is removed)."""
    return bundle.parent / f".{bundle.name}{WORK_SUFFIX}"


def repack(
    path: Path | str,
    *,
    why: str = WHY,
    say: Callable[[str], None] = lambda line: None,
    step: Callable[[str], None] = lambda name: None,
    threshold: int = COMPRESS_FROM_BYTES,
) -> Repacked | None:
    """Re-pack the sealed bundle at ``path`` (see the module's docstring); None where nothing shrinks. ``say`` gets
    one line per step; ``step`` is called with the name of each point passed ("wrote <file>", "sealed the copy",
    "checked", "swapped"; tests stop there). RepackError (one line) where it is refused: the bundle is untouched.

    Everything it writes or removes goes through descriptors opened once (issue 55 item 1): the bundle's parent, the
    bundle (``O_NOFOLLOW``) and the copy it makes there; nothing is opened again by path after a check, so a link or
    another directory put at either name meanwhile is never written through or removed."""
    path = Path(path)
    work = work_path(path)
    if os.path.lexists(work):
        raise RepackError(
            f"{shown(work)}: left by an interrupted repack ({path.name} itself is whole, old or new); "
            "remove it and run again"
        )
    try:
        parent = OwnedDir(path.parent, create=False)
        original = parent.open_dir(path.name)
    except UnsafeFileError as exc:
        if "parent" in locals():
            parent.close()
        raise RepackError(f"{exc}; not repacked") from None
    with parent, original:
        return _repack(path, work, parent, original, why, say, step, threshold)


def _repack(path, work, parent: OwnedDir, original: OwnedDir, why, say, step, threshold) -> Repacked | None:
    verified = original.identity()
    try:
        bundle = load_bundle(path)
        seal = original.read_bytes(SEAL, 4096)
    except (BundleError, UnsafeFileError) as exc:
        raise RepackError(f"{exc}; not repacked") from None
    if not bundle.sealed:
        raise RepackError(f"{path / MANIFEST}: status {bundle.manifest.status!r}; only a sealed bundle is repacked")
    listed = bundle.manifest.files
    ours = {*listed, MANIFEST, SEAL}
    _still_the_bundle(path, parent, original, verified, seal, ours)  # what load_bundle read by path was this one
    say(f"{path}: verified ({len(listed)} files)")
    if not any(packs(path / relative, relative, threshold) for relative in listed if relative.startswith(RAW + "/")):
        say(f"{path}: nothing to shrink")
        return None
    claim = _claim_of(bundle.manifest.claim, path)
    before = _per_run_values(path, path, claim)
    say(f"{path}: per-run values computed ({', '.join(before)})")

    try:
        copy = parent.subdir(work.name, new=True)
    except UnsafeFileError as exc:
        raise RepackError(f"{exc}; not repacked") from None
    made = copy.identity()
    swapped = False
    with copy:
        try:
            done = _write_copy(path, work, copy, bundle.manifest, seal, why, threshold, step)
            if not done.replaced:  # gapdet text its numbers would not give back, and small: it stays as it is
                _remove_copy(parent, copy, work)
                say(f"{path}: nothing to shrink")
                return None
            say(
                f"{path}: copy sealed at {work.name}: {done.how.get('xz', 0)} raw files xz'd, "
                f"{done.how.get('gapdet', 0)} gap detector outputs kept as their numbers"
            )
            step("sealed the copy")
            _check_copy(path, work, bundle.manifest, done.replaced)
            after = _per_run_values(work, path, claim)
            for name, value in before.items():
                difference = _difference(value, after.get(name))
                if difference:
                    raise RepackError(f"{path}: {name} differs once repacked ({difference}); not repacked")
            say(
                f"{path}: checked: the copy verifies, every replaced file reads back as it was, the per-run values "
                "are the same"
            )
            step("checked")
            _still_the_bundle(path, parent, original, verified, seal, ours)
            parent.exchange(path.name, work.name, expect=(verified, made))
            swapped = True
            step("swapped")
        except UnsafeFileError as exc:
            if not swapped:
                _remove_copy(parent, copy, work)
            raise RepackError(f"{exc}; not repacked") from None
        except BaseException:
            if not swapped:
                _remove_copy(parent, copy, work)
            raise
        done.path, done.bytes_after = path, _size(copy)
    # the old bundle, now at the copy's name: only the files its manifest lists go, through its own descriptor
    left = original.empty(keep=lambda relative: relative not in ours)
    if left or not parent.remove_empty_dir(work.name, verified):
        say(
            f"{shown(work)}: kept, holding what the old bundle's manifest does not list "
            f"({shown(', '.join(left) or 'the directory itself')}); remove it by hand"
        )
    say(f"{path}: repacked, {done.bytes_before / 1e6:.1f} MB -> {done.bytes_after / 1e6:.1f} MB")
    return done


def _still_the_bundle(path: Path, parent: OwnedDir, original: OwnedDir, verified, seal: bytes, ours: set[str]) -> None:
    """What is at the bundle's name is the directory verified (device and inode), with the same seal and no file its
    manifest does not list: anything else (another bundle swapped in, a file added) stops the repack, nothing
    deleted."""
    found = parent.entry(path.name)
    if found is None or (found.st_dev, found.st_ino) != (verified.st_dev, verified.st_ino):
        raise RepackError(
            f"{path}: another directory than the bundle verified is at its name now (put there since); "
            "nothing swapped or removed; not repacked"
        )
    try:
        now = original.read_bytes(SEAL, 4096)
    except UnsafeFileError as exc:
        raise RepackError(f"{exc}; not repacked") from None
    if now != seal:
        raise RepackError(f"{path / SEAL}: changed since the bundle was verified; not repacked")
    unlisted = [relative for relative in _files_below(original) if relative not in ours]
    if unlisted:
        raise RepackError(
            f"{path / unlisted[0]}: not listed in the manifest (added since the bundle was verified); "
            f"{len(unlisted)} such file(s); not repacked"
        )


def _files_below(directory: OwnedDir) -> list[str]:
    """Every non-directory below ``directory``, walked through descriptors without following a link."""
    found: list[str] = []

    def walk(fd: int, prefix: str) -> None:
        with os.scandir(fd) as entries:
            for entry in entries:
                relative = prefix + entry.name
                if entry.is_dir(follow_symlinks=False):
                    child = os.open(entry.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                    try:
                        walk(child, relative + "/")
                    finally:
                        os.close(child)
                else:
                    found.append(relative)

    walk(directory.fd, "")
    return sorted(found)


def _remove_copy(parent: OwnedDir, copy: OwnedDir, work: Path) -> None:
    """The copy (never swapped in): emptied through its descriptor, then its name removed if it is still the copy."""
    copy.empty()
    parent.remove_empty_dir(work.name, copy.identity())


def _size(directory: OwnedDir) -> int:
    total = 0

    def walk(fd: int) -> None:
        nonlocal total
        with os.scandir(fd) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    child = os.open(entry.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                    try:
                        walk(child)
                    finally:
                        os.close(child)
                elif entry.is_file(follow_symlinks=False):
                    total += entry.stat(follow_symlinks=False).st_size

    walk(directory.fd)
    return total


def _claim_of(claim_id: str, path: Path):
    from .claimids import claim_ids
    from .claims import get_claim

    if claim_id not in claim_ids():
        raise RepackError(
            f"{path / MANIFEST}: claim {shown(claim_id, 80)!s} is no claim of this ticklab, so its "
            "results cannot be checked; not repacked"
        )
    return get_claim(claim_id)


def _write_copy(
    path: Path, work: Path, out: OwnedDir, manifest: Manifest, old_seal: bytes, why: str, threshold: int, step
) -> Repacked:
    """The new bundle at ``work``, written through ``out`` (the descriptor of the empty directory the caller made
    there, never opened again by its name): files copied or re-packed, the manifest with its ``resealed`` entry,
    sealed and read-only."""
    done = Repacked(
        path=path, bytes_before=sum(_entry_size(path / relative) for relative in [*manifest.files, MANIFEST, SEAL])
    )
    files = dict(manifest.files)
    for relative in sorted(manifest.files):
        source = path / relative
        packed = pack_raw_file(source, relative, out, threshold) if relative.startswith(RAW + "/") else None
        if packed is None:
            with open_regular(source) as handle, out.create(relative, exclusive=True) as copy:
                shutil.copyfileobj(handle, copy)
        else:
            new, how = packed
            done.replaced[relative] = new
            del files[relative]
            files[new] = _sha256_in(out, new)
            done.how[how] = done.how.get(how, 0) + 1
        step(f"wrote {relative}")
    names = list(files)
    seal = old_seal.decode("ascii", errors="replace").split()
    updated = replace(
        manifest,
        files=dict(sorted(files.items())),
        raw_files=raw_files_record(
            sum(n.endswith(".xz") and Path(n).name != gapfile.COMPACT_NAME + ".xz" for n in names),
            sum(Path(n).name == gapfile.COMPACT_NAME + ".xz" for n in names),
            threshold,
        ),
        resealed=[
            *(manifest.resealed or []),
            {
                "when": datetime.now(UTC).isoformat(),
                "from_seal": seal[0] if seal else "",
                "files_replaced": {
                    old: {"now": new, "sha256": manifest.files[old]} for old, new in sorted(done.replaced.items())
                },
                "why": why,
                "ticklab_version": __version__,
                "raw_files_before": manifest.raw_files,
            },
        ],
    )
    out.write_new(MANIFEST, updated.file_bytes())
    seal_manifest(out, work, sorted(files))
    return done


def _entry_size(path: Path) -> int:
    try:
        return path.lstat().st_size
    except OSError:
        return 0


def _sha256_in(directory: OwnedDir, relative: str) -> str:
    digest = hashlib.sha256()
    parts = Path(relative).parts
    parent = directory._dir_fd(list(parts[:-1]), create=False, doing="read")
    try:
        with open_regular(parts[-1], dir_fd=parent, shown_as=directory.root / relative) as handle:
            for piece in iter(lambda: handle.read(1 << 20), b""):
                digest.update(piece)
    finally:
        os.close(parent)
    return digest.hexdigest()


class _Digest:
    def __init__(self):
        self.hash = hashlib.sha256()

    def write(self, piece: bytes) -> int:
        self.hash.update(piece)
        return len(piece)


def _check_copy(path: Path, work: Path, manifest: Manifest, replaced: dict[str, str]) -> None:
    """The copy verifies, and each replaced file reads back as the old one did."""
    from .capture.workloads import WorkloadOutputError, read_gapdet

    try:
        load_bundle(work)
    except BundleError as exc:
        raise RepackError(f"{path}: the repacked copy does not verify ({exc}); not repacked") from None
    for old, new in replaced.items():
        if Path(new).name == gapfile.COMPACT_NAME + ".xz":
            pairs, gaps = gapfile.read_compact(work / new)
            rows = gaps[["start_ns", "gap_ns"]].to_numpy(dtype=np.int64)
            if gapfile.text(pairs, rows) != rawfile.read_bytes(path / old, gapfile.TEXT_LIMIT):
                raise RepackError(
                    f"{path / old}: its numbers in {Path(new).name} do not give back its text; not repacked"
                )
            try:
                (header, text_gaps), (again, compact_gaps) = read_gapdet(path / old), read_gapdet(work / new)
            except WorkloadOutputError as exc:
                raise RepackError(f"{exc}; not repacked") from None
            if header != again or _difference(text_gaps, compact_gaps):
                raise RepackError(f"{path / old}: read_gapdet reads other numbers from {Path(new).name}; not repacked")
        else:
            digest = _Digest()
            rawfile.copy_into(work / new, digest)
            if digest.hash.hexdigest() != manifest.files[old]:
                raise RepackError(f"{work / new}: does not unpack to {old} as the manifest lists it; not repacked")


def _per_run_values(where: Path, original: Path, claim) -> dict[str, object]:
    """The claim's per-run values for the bundle at ``where`` (the bundle itself or its copy), through the functions
    the notebooks call, with every mention of the copy's files written as the bundle's (``_as_bundle``)."""
    from .analysis.captured import BundleRef
    from .analysis.checks import run_checks
    from .analysis.comparisons import measured_runs

    ref = BundleRef(host_id=original.parent.parent.name, claim=claim.id, path=where)
    try:
        runs, notes = measured_runs([ref], claim.checks, claim.id)
        values = {"measured runs": runs, "notes": notes, "condition checks": run_checks(claim.id, claim.checks, [ref])}
        if claim.derived_from_raw is not None:
            values.update(claim.derived_from_raw(runs, [ref]))
    except Exception as exc:  # the analysis cannot show the results unchanged: no repack
        raise RepackError(
            f"{original}: its per-run values cannot be computed ({type(exc).__name__}: "
            f"{shown(str(exc), 200)}); not repacked"
        ) from None
    return {name: _as_bundle(value, where, original) for name, value in values.items()}


def _as_bundle(value, where: Path, original: Path):
    """``value`` with the copy's path written as the bundle's, and a raw file's stored name (``name.xz``) as its
    plain name: where a table names the file a value came from, its form is no result."""
    packed = re.compile(re.escape(str(original)) + r"(/[^\s'\"]*?)\.xz\b")

    def text(item):
        if not isinstance(item, str):
            return item
        item = item.replace(str(where), str(original)).replace(where.name, original.name)
        return packed.sub(lambda m: str(original) + m.group(1), item)

    if isinstance(value, pd.DataFrame):
        value = value.copy()
        for column in value.columns:
            if value[column].dtype == object:
                value[column] = value[column].map(text)
        return value
    if isinstance(value, (list, tuple)):
        return [text(item) for item in value]
    return text(value)


def _difference(before, after) -> str:
    """'' where ``before`` and ``after`` are the same exactly (NaN equal to NaN), else the first difference."""
    if isinstance(before, pd.DataFrame) and isinstance(after, pd.DataFrame):
        try:
            pd.testing.assert_frame_equal(before, after, check_exact=True)
        except AssertionError as exc:
            return " ".join(str(exc).split())[:300]
        return ""
    return "" if before == after else f"{shown(before, 120)} vs {shown(after, 120)}"


def bundles_under(paths: list[Path]) -> list[Path]:
    """The bundles named, or held below the directories named (a name starting with '.' is no bundle)."""
    found = []
    for root in paths:
        if os.path.lexists(root / MANIFEST):
            found.append(root)
            continue
        found += [
            m.parent
            for m in sorted(root.rglob(MANIFEST))
            if not any(part.startswith(".") for part in m.parent.relative_to(root).parts)
        ]
    return sorted(dict.fromkeys(found))


def main(paths: list[Path], why: str = WHY) -> int:
    """``ticklab bundle repack``: each bundle re-packed or refused with one line; 0 when none was refused."""
    bundles = bundles_under(paths)
    if not bundles:
        print(
            f"ticklab bundle repack: no bundle (manifest.json) under {shown(', '.join(map(str, paths)))}",
            file=sys.stderr,
        )
        return 2
    refused = 0
    for bundle in bundles:
        try:
            repack(bundle, why=why, say=lambda line: print(shown(line, 400), flush=True))
        except (RepackError, BundleError, UnsafeFileError, rawfile.RawFileError, gapfile.GapFileError) as exc:
            refused += 1
            print(f"ticklab bundle repack: {' '.join(str(exc).split())}", file=sys.stderr, flush=True)
    return 2 if refused else 0
