"""Sealed bundles that travel between users (issue 57 item 3): ``ticklab bundle export BUNDLE... --out FILE`` and
``ticklab bundle import FILE --into DIR``.

The archive is a plain POSIX tar (a bundle's large raw files are xz'd already) whose members are
``<host-id>/<claim>/<bundle>/...`` — the data directory's layout, host-id and claim from each bundle's manifest — with
every directory and file of each sealed bundle as it is, in a fixed order with fixed owner, time and modes, so the
same bundles always give the same bytes. Export loads (``bundle.load_bundle``: the seal, the schema, every file's
sha256) and refuses an unsealed or damaged bundle before it writes anything; the archive is written whole or not at
all (``OwnedDir.replacing``), and an existing file is never overwritten.

Import reads the archive as a stream and refuses, in one line naming the archive and the member, anything but
directories and regular files (links, hard links, devices, FIFOs), an absolute name, a ``..`` or ``.`` component, a
name outside the ``<host-id>/<claim>/<bundle>/`` layout, a member larger than ``MEMBER_LIMIT``, more than
``TOTAL_LIMIT`` bytes or ``MEMBER_COUNT_LIMIT`` members, and a cut-off archive. Each bundle is unpacked through
``OwnedDir`` beside where it goes, at ``DIR/<host-id>/<claim>/.<bundle>.import-<pid>`` (a ``.`` name: the analysis
never counts it), verified there with ``load_bundle`` (a tampered or partial bundle is refused in one line naming the
file), its manifest's host-id and claim checked against its place, and only when every bundle of the archive passed
is each renamed into place. A bundle whose seal digest (the sha256 of its ``manifest.sha256``) is already under DIR
is skipped, saying where; a different bundle at the same name is refused. Nothing is written outside DIR.
"""

from __future__ import annotations

import os
import re
import stat
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from .bundle import MANIFEST, SEAL, BundleError, load_bundle, seal_digest
from .safefiles import OwnedDir, UnsafeFileError, open_regular, shown

MEMBER_LIMIT = 4 << 30  # one file of a bundle (a trace's CPU data is at most 2 GiB before xz)
TOTAL_LIMIT = 64 << 30  # the whole archive's contents
MEMBER_COUNT_LIMIT = 1_000_000
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+@,=-]*$")  # a host-id, claim or bundle name
_COPY_CHUNK = 1 << 20


class ArchiveError(ValueError):
    """An archive or bundle ticklab refuses; the message is one line naming the file."""


def bundles_under(paths: Iterable[Path | str]) -> list[Path]:
    """Each path that is a bundle (has a manifest.json), and the bundles below each other directory, in order; names
    starting with '.' are no bundle (a repack's or an import's leftover)."""
    found = []
    for path in map(Path, paths):
        if os.path.lexists(path / MANIFEST):
            found.append(path)
        elif path.is_dir() and not path.is_symlink():
            found += sorted(
                manifest.parent
                for manifest in path.rglob(MANIFEST)
                if not any(part.startswith(".") for part in manifest.relative_to(path).parts)
            )
        else:
            raise ArchiveError(f"{shown(path)}: not a bundle, nor a directory holding bundles")
    return list(dict.fromkeys(found))


def _tarinfo(name: str, *, size: int = 0, directory: bool = False) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE if directory else tarfile.REGTYPE
    info.mode = 0o755 if directory else 0o444
    info.size = size
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def _bundle_entries(bundle: Path) -> list[tuple[str, bool]]:
    """(relative path, is a directory) for everything in a bundle, directories before what they hold; anything but
    a directory or a regular file is refused (load_bundle has checked every listed file)."""
    entries = []
    for root, dirs, files in os.walk(bundle, followlinks=False):
        dirs.sort()
        here = Path(root)
        for name in sorted(files) + dirs:
            path = here / name
            mode = os.lstat(path).st_mode
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                raise ArchiveError(f"{shown(path)}: neither a regular file nor a directory; not exported")
        entries += [(str((here / d).relative_to(bundle)), True) for d in dirs]
        entries += [(str((here / f).relative_to(bundle)), False) for f in sorted(files)]
    return sorted(entries, key=lambda e: Path(e[0]).parts)


def export(paths: Iterable[Path | str], out: Path | str) -> list[str]:
    """Write the sealed bundles of ``paths`` into one archive at ``out`` (refused if something is there); the
    archive's bundle prefixes, in order."""
    out = Path(out)
    if os.path.lexists(out):
        raise ArchiveError(f"{shown(out)}: exists already; nothing is overwritten")
    bundles = bundles_under(paths)
    if not bundles:
        raise ArchiveError("no bundle to export under " + ", ".join(shown(p) for p in paths))
    prefixes: dict[str, Path] = {}
    for bundle in bundles:
        try:
            manifest = load_bundle(bundle).manifest
        except BundleError as exc:
            raise ArchiveError(f"{exc}; not exported") from None
        prefix = f"{manifest.host_id}/{manifest.claim}/{bundle.name}"
        if not all(_NAME.match(part) for part in prefix.split("/")):
            raise ArchiveError(
                f"{shown(bundle)}: host-id, claim or name {shown(prefix)} cannot be a path; not exported"
            )
        if prefix in prefixes:
            raise ArchiveError(f"{shown(bundle)} and {shown(prefixes[prefix])} are both {prefix}; export one of them")
        prefixes[prefix] = bundle
    with OwnedDir(out.parent if str(out.parent) else ".") as owned:
        with owned.replacing(out.name) as handle:
            with tarfile.open(fileobj=handle, mode="w|", format=tarfile.PAX_FORMAT) as tar:
                for prefix in sorted(prefixes):
                    bundle = prefixes[prefix]
                    tar.addfile(_tarinfo(prefix, directory=True))
                    for relative, directory in _bundle_entries(bundle):
                        name = f"{prefix}/{relative}"
                        if directory:
                            tar.addfile(_tarinfo(name, directory=True))
                            continue
                        with open_regular(bundle / relative) as source:
                            size = os.fstat(source.fileno()).st_size
                            tar.addfile(_tarinfo(name, size=size), source)
    return sorted(prefixes)


@dataclass
class Imported:
    """What an import did: bundles put in place, and bundles skipped as already there (with where)."""

    added: list[Path] = field(default_factory=list)
    skipped: list[tuple[Path, Path]] = field(default_factory=list)


def _checked_name(archive: Path, member: tarfile.TarInfo) -> tuple[str, ...]:
    name = member.name
    where = f"{shown(archive)}: member {shown(name)}"
    if not (member.isreg() or member.isdir()):
        kind = (
            "a symbolic link"
            if member.issym()
            else "a hard link"
            if member.islnk()
            else "a FIFO"
            if member.isfifo()
            else "a device"
            if member.isdev()
            else "not a regular file or directory"
        )
        raise ArchiveError(f"{where}: {kind}; a bundle archive holds only directories and regular files; refused")
    if name.startswith("/") or "\\" in name or "\x00" in name:
        raise ArchiveError(f"{where}: an absolute or unsafe name; refused")
    parts = tuple(p for p in name.split("/") if p)
    if any(p in ("..", ".") for p in name.split("/")) or not parts:
        raise ArchiveError(f"{where}: a '..' or '.' component; refused")
    short = member.isdir() and len(parts) < 3  # a host's or a claim's directory, as tar cf writes them
    if (len(parts) < 3 and not short) or not all(_NAME.match(p) for p in parts[:3]) or parts[0] == "published":
        raise ArchiveError(
            f"{where}: not <host-id>/<claim>/<bundle>/… (the layout ticklab bundle export writes); refused"
        )
    if member.isreg() and len(parts) < 4:
        raise ArchiveError(f"{where}: a file where a bundle directory belongs; refused")
    if member.size > MEMBER_LIMIT:
        raise ArchiveError(
            f"{where}: {member.size} bytes, more than the {MEMBER_LIMIT} a bundle file may hold; refused"
        )
    return parts


def _staging(prefix: tuple[str, ...]) -> str:
    return f"{prefix[0]}/{prefix[1]}/.{prefix[2]}.import-{os.getpid()}"


def _present(into: Path) -> dict[str, Path]:
    """Seal digest -> bundle, for every sealed bundle already under the data directory."""
    found: dict[str, Path] = {}
    for seal in sorted(into.glob(f"*/*/*/{SEAL}")):
        bundle = seal.parent
        if any(part.startswith(".") for part in bundle.relative_to(into).parts):
            continue
        try:
            found.setdefault(seal_digest(bundle), bundle)
        except (OSError, UnsafeFileError):
            continue
    return found


def _remove_tree(owned: OwnedDir, relative: str) -> None:
    """Remove what an import unpacked at ``relative`` (below ``owned``): regular files and directories only."""
    root = owned.root / relative
    if not os.path.lexists(root):
        return
    for here, dirs, files in os.walk(root, topdown=False, followlinks=False):
        for name in files + dirs:
            owned.remove(str((Path(here) / name).relative_to(owned.root)))
    owned.remove(relative)


def import_archive(archive: Path | str, into: Path | str) -> Imported:
    """Unpack, verify and place the bundles of ``archive`` under the data directory ``into`` (module docstring)."""
    archive, into = Path(archive), Path(into)
    done = Imported()
    staged: dict[tuple[str, ...], str] = {}  # bundle prefix -> its staging directory (relative to into)
    total = count = 0
    with OwnedDir(into) as owned:
        try:
            with open_regular(archive) as source:
                try:
                    tar = tarfile.open(fileobj=source, mode="r|")
                except tarfile.TarError as exc:
                    raise ArchiveError(f"{shown(archive)}: not a tar archive ({exc}); refused") from None
                with tar:
                    for member in tar:
                        count += 1
                        total += member.size
                        if count > MEMBER_COUNT_LIMIT or total > TOTAL_LIMIT:
                            raise ArchiveError(
                                f"{shown(archive)}: more than {MEMBER_COUNT_LIMIT} members or {TOTAL_LIMIT} bytes; "
                                "refused"
                            )
                        parts = _checked_name(archive, member)
                        if len(parts) < 3:
                            continue  # a <host-id>/ or <host-id>/<claim>/ directory: made with its bundles
                        prefix = parts[:3]
                        if prefix not in staged:
                            staged[prefix] = _staging(prefix)
                            owned.mkdir_new(staged[prefix])
                        relative = "/".join((staged[prefix], *parts[3:]))
                        if member.isdir():
                            if len(parts) > 3:
                                owned.mkdirs(relative)
                            continue
                        _unpack(owned, relative, tar, member, archive)
        except tarfile.TarError as exc:
            _clean(owned, staged)
            raise ArchiveError(f"{shown(archive)}: damaged or cut off ({exc}); refused, nothing imported") from None
        except BaseException:
            _clean(owned, staged)
            raise
        try:
            if not staged:
                raise ArchiveError(f"{shown(archive)}: holds no bundle")
            present = _present(into)
            placing = []
            for prefix, stage in staged.items():
                bundle = into / stage
                try:
                    manifest = load_bundle(bundle).manifest
                except BundleError as exc:
                    raise ArchiveError(
                        f"{shown(archive)}: {'/'.join(prefix)}: {exc}; refused, nothing imported"
                    ) from None
                if (manifest.host_id, manifest.claim) != prefix[:2]:
                    raise ArchiveError(
                        f"{shown(archive)}: {'/'.join(prefix)}: its manifest names host {shown(manifest.host_id)} "
                        f"and claim {shown(manifest.claim)}; refused, nothing imported"
                    )
                digest = seal_digest(bundle)
                target = into.joinpath(*prefix)
                if digest in present:
                    done.skipped.append((target, present[digest]))
                elif os.path.lexists(target):
                    raise ArchiveError(
                        f"{shown(archive)}: {'/'.join(prefix)}: {shown(target)} exists and is another bundle (a "
                        "different seal); refused, nothing imported"
                    )
                else:
                    placing.append((prefix, stage, target))
                    present[digest] = target
            for prefix, stage, target in placing:
                with owned.subdir(f"{prefix[0]}/{prefix[1]}") as parent:
                    if parent.entry(prefix[2]) is not None:
                        raise ArchiveError(f"{shown(target)}: appeared while importing; refused")
                    os.rename(Path(stage).name, prefix[2], src_dir_fd=parent.fd, dst_dir_fd=parent.fd)
                staged[prefix] = ""
                done.added.append(target)
        finally:
            _clean(owned, staged)
    return done


def _unpack(owned: OwnedDir, relative: str, tar: tarfile.TarFile, member: tarfile.TarInfo, archive: Path) -> None:
    source = tar.extractfile(member)
    written = 0
    with owned.create(relative, mode=0o444, exclusive=True) as handle:
        while True:
            piece = source.read(_COPY_CHUNK)
            if not piece:
                break
            written += len(piece)
            handle.write(piece)
        os.fchmod(handle.fileno(), 0o444)
    if written != member.size:
        raise ArchiveError(f"{shown(archive)}: member {shown(member.name)} cut off; refused, nothing imported")


def _clean(owned: OwnedDir, staged: dict[tuple[str, ...], str]) -> None:
    for stage in staged.values():
        if stage:
            _remove_tree(owned, stage)
