"""The report's output directory: ticklab deletes or replaces only what it wrote there itself.

A directory becomes a report directory when ``ticklab report`` creates it (or finds it empty) and
writes the marker ``.ticklab-report`` into it. The marker lists every file the last report wrote; a
new full run removes exactly those files (and directories they leave empty), nothing else. A
non-empty directory without the marker belongs to someone else and is refused, so ``--out .`` at the
repository root or ``--out ~`` can neither delete nor overwrite anything.

While a run is writing, the marker also lists the files that were there before it started
(``foreign``) and is brought up to date after each notebook, so that after an interruption the next
run still knows which files are its own: the listed ones, and of the rest only files where a report
writes (REPORT_PLACES) that were not there before.

The marker is trusted only in a directory of the user's own: the directory and the marker must be
owned by the user running ticklab and writable by no other user, below directories no other user can
change (a world-writable parent must be sticky, as /tmp is) (a marker planted in a shared
directory would otherwise make root delete what it lists). Nothing is removed or written through a
symbolic link: a directory holding one is refused.

Every file the report writes goes through ticklab.safefiles (the marker too): replaced whole through its
directory's descriptor, never opened for writing in place. What is at a name the report will write (the marker,
or anything under REPORT_PLACES) must be a regular file with one link or a directory: a hard link (a file whose
other name is elsewhere), a FIFO, a socket or a device there is refused before any notebook runs, with one line
naming it, without being opened.

The marker also records which data the report read (``data``: the data directory and the published directory,
resolved). A run onto a report of other data is refused, saying whose it is, unless the caller says to replace it
(``ticklab report --replace``): a report over one capture never takes the place of the bundled data's report.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from ..safefiles import OwnedDir, UnsafeFileError, kind_of, read_text, shown

MARKER = ".ticklab-report"
# where a report writes (build.py's output contract): after an interruption, only new files here are its own
REPORT_PLACES = (
    "notebooks",
    "report",
    "figures",
    "tables",
    "verdicts",
    "checks",
    "summary.json",
    "verdicts.csv",
    "checks.csv",
)


class OutputDirError(ValueError):
    """The output directory cannot be used; the message names it and says why."""


def _files(root: Path) -> set[str]:
    found = set()
    for directory, dirs, files in os.walk(root):
        for name in files:
            found.add(os.path.relpath(os.path.join(directory, name), root))
        # symlinked directories are listed as entries, never walked into
        found.update(
            os.path.relpath(os.path.join(directory, d), root)
            for d in dirs
            if os.path.islink(os.path.join(directory, d))
        )
    found.discard(MARKER)
    return found


def _check_own(path: Path, what: str) -> None:
    """``path`` (not followed if a link) is the user's own and writable by nobody else."""
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        raise OutputDirError(f"{path}: is a symbolic link; ticklab report does not write through links")
    if info.st_uid != os.geteuid():
        raise OutputDirError(
            f"{path}: {what} is owned by uid {info.st_uid}, not by you (uid {os.geteuid()}); "
            "ticklab report only replaces files in a directory of your own"
        )
    shared_group = info.st_mode & stat.S_IWGRP and info.st_gid != os.getegid()
    if info.st_mode & stat.S_IWOTH or shared_group:
        raise OutputDirError(
            f"{path}: {what} is writable by other users (mode {stat.S_IMODE(info.st_mode):o}); "
            "ticklab report only replaces files in a directory nobody else can write"
        )


def _check_parents(path: Path) -> None:
    """No directory above ``path`` lets another user swap what is under it (writable by others and not sticky, or
    owned by another user than root and us): otherwise the directory checked could be replaced by a link."""
    me = os.geteuid()
    for ancestor in path.parents:
        try:
            info = os.stat(ancestor)
        except OSError:
            continue
        shared = info.st_mode & stat.S_IWOTH or (info.st_mode & stat.S_IWGRP and info.st_gid != os.getegid())
        if info.st_uid not in (0, me) or (shared and not info.st_mode & stat.S_ISVTX):
            raise OutputDirError(
                f"{path}: {ancestor} above it can be changed by another user (owner uid "
                f"{info.st_uid}, mode {stat.S_IMODE(info.st_mode):o}); choose an --out below "
                "directories only root or you can change"
            )


def _links(root: Path) -> list[str]:
    found = []
    for directory, dirs, files in os.walk(root):
        found += [
            os.path.relpath(os.path.join(directory, n), root)
            for n in (*dirs, *files)
            if os.path.islink(os.path.join(directory, n))
        ]
    return sorted(found)


def _read_marker(root: Path) -> dict:
    marker = root / MARKER
    _check_own(marker, "its report marker")
    try:
        data = json.loads(read_text(marker, 64 << 20))
        if not isinstance(data, dict) or not isinstance(data.get("files", []), list):
            raise ValueError("not a ticklab report marker")
        return data
    except (OSError, ValueError) as exc:  # UnsafeFileError too (a FIFO or a hard link is never read)
        raise OutputDirError(
            f"{marker}: unreadable ({exc}); remove the directory's contents yourself or choose another --out"
        ) from None


def _write_marker(root: Path, data: dict) -> None:
    """The marker, replaced whole through the directory's descriptor (ticklab.safefiles)."""
    try:
        with OwnedDir(root, create=False) as owned:
            owned.write_atomic(MARKER, (json.dumps(data, indent=1, sort_keys=True) + "\n").encode())
    except UnsafeFileError as exc:
        raise OutputDirError(str(exc)) from None


def _not_replaceable(root: Path) -> list[tuple[str, str]]:
    """(relative path, what it is) of everything at a name the report writes (the marker, REPORT_PLACES) that it
    would not replace: a hard-linked file, a FIFO, a socket, a device. Found by lstat; nothing is opened."""
    found = []
    for directory, _dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(directory, name)
            relative = os.path.relpath(path, root)
            if relative != MARKER and Path(relative).parts[0] not in REPORT_PLACES:
                continue  # someone's own file: the report never writes there
            info = os.lstat(path)
            if stat.S_ISREG(info.st_mode) and info.st_nlink > 1:
                found.append((relative, f"a regular file with {info.st_nlink} links (a hard link)"))
            elif not stat.S_ISREG(info.st_mode) and not stat.S_ISLNK(info.st_mode):
                found.append((relative, f"{kind_of(info.st_mode)}, not a regular file"))
    return sorted(found)


def _owned(root: Path, data: dict) -> set[str]:
    """What the last run wrote: its list, or (interrupted while writing) everything not there before it."""
    listed = {str(f) for f in data.get("files", [])}
    if data.get("writing"):
        new = _files(root) - set(data.get("foreign", []))
        return listed | {name for name in new if Path(name).parts[0] in REPORT_PLACES}
    return listed


def _remove(root: Path, relative: set[str]) -> None:
    for name in sorted(relative, key=lambda r: -r.count(os.sep)):
        if os.path.isabs(name) or ".." in Path(name).parts:
            continue  # never outside the directory, whatever the marker says
        path = root / name
        if any(parent.is_symlink() for parent in path.parents if parent != root and root in parent.parents):
            continue  # never through a link to somewhere else
        if path.is_symlink() or path.is_file():
            path.unlink()
        parent = path.parent
        while parent != root and parent.is_dir() and not parent.is_symlink() and not any(parent.iterdir()):
            parent.rmdir()
            parent = parent.parent


def data_record(data_dir: Path | str, published_dir: Path | str) -> dict:
    """What the marker says a report read: its data and published directories, resolved."""
    return {"data_dir": str(Path(data_dir).resolve()), "published_dir": str(Path(published_dir).resolve())}


def _other_data(output_dir: Path, recorded, data: dict) -> str | None:
    """Why the report in ``output_dir`` is of other data than ``data`` (one clause), or None when it is the same or
    the marker does not say (a report written before the marker recorded it)."""
    if not isinstance(recorded, dict):
        return None
    for key, what in (("data_dir", "--data-dir"), ("published_dir", "--published-dir")):
        if key in recorded and str(recorded[key]) != data[key]:
            return (
                f"{output_dir}: holds the report of {what} {shown(recorded[key])}, not of {data[key]}; "
                f"give another --out (--data-dir DIR writes DIR/report by default) or --replace to replace it"
            )
    return None


def claim(output_dir: Path, *, replace: bool, data: dict | None = None, replace_other: bool = False) -> set[str]:
    """Make ``output_dir`` ready for a report run; ``replace``: remove the previous run's files first. ``data``
    (:func:`data_record`): what this run reads; a report there of other data is refused unless ``replace_other``,
    and then removed whole as a full run's would be. Returns the files present before this run (not to be claimed as
    ours afterwards)."""
    if output_dir.exists() and not output_dir.is_dir():
        raise OutputDirError(f"{output_dir}: exists and is not a directory")
    _check_parents(output_dir)
    if output_dir.is_dir():
        _check_own(output_dir, "the directory")
    marked = (output_dir / MARKER).is_file() or (output_dir / MARKER).is_symlink()
    if output_dir.is_dir() and not marked and any(output_dir.iterdir()):
        raise OutputDirError(
            f"{output_dir}: not empty and not made by 'ticklab report' (no {MARKER} in it); "
            "give a new or empty directory so nothing of yours is overwritten"
        )
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        data_was = _read_marker(output_dir) if marked else {"files": []}
        other = _other_data(output_dir, data_was.get("data"), data) if data is not None else None
        if other and not replace_other:
            raise OutputDirError(other)
        owned = _owned(output_dir, data_was)
        if replace or other:
            _remove(output_dir, owned)
            owned = set()
        links = _links(output_dir)
        if links:
            raise OutputDirError(
                f"{output_dir / links[0]}: a symbolic link in the output directory; ticklab report "
                "does not write through links (remove it or choose another --out)"
            )
        unsafe = _not_replaceable(output_dir)
        if unsafe:
            relative, what = unsafe[0]
            raise OutputDirError(
                f"{shown(output_dir / relative)}: {what} where the report writes; ticklab report "
                "replaces only regular files of its own (remove it or choose another --out)"
            )
        before = _files(output_dir)
        _write_marker(
            output_dir,
            {"writing": True, "files": sorted(owned), "foreign": sorted(before - owned)} | _with_data(data),
        )
    except OSError as exc:
        raise OutputDirError(f"{output_dir}: cannot write there ({exc.strerror or exc})") from None
    return before - owned


def _with_data(data: dict | None) -> dict:
    return {"data": data} if data is not None else {}


def progress(output_dir: Path, foreign: set[str], data: dict | None = None) -> None:
    """During the run (after each notebook): the marker lists what has been written so far."""
    _write_marker(
        output_dir,
        {"writing": True, "files": sorted(_files(output_dir) - foreign), "foreign": sorted(foreign)} | _with_data(data),
    )


def record(output_dir: Path, foreign: set[str], data: dict | None = None) -> None:
    """After the run: the marker lists every file this directory holds that was not there before, and the data."""
    _write_marker(output_dir, {"writing": False, "files": sorted(_files(output_dir) - foreign)} | _with_data(data))
