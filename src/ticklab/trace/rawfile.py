"""Raw files of a bundle may be stored xz-compressed (``name.xz``, see BundleWriter.compress_raw);
readers ask for the plain name and get the bytes either way.

Read as root from directories other users may write to, so each file is opened without following a link and
must be a regular file (:mod:`ticklab.safefiles`), and both the file and what its .xz unpacks to are bounded:
a file over the limit is an error, never silently cut.
"""

from __future__ import annotations

import lzma
import os
from pathlib import Path

from ..safefiles import UnsafeFileError, shown
from ..safefiles import read_bytes as safe_read_bytes

# A raw file is read whole into memory: a per-CPU ring buffer, an FTQ sample file or a tool's output is MBs; this
# bounds what a planted or damaged file (an .xz that unpacks to terabytes) can make ticklab allocate.
RAW_FILE_LIMIT = 8 << 30


class RawFileError(ValueError):
    """A raw file is missing, not a regular file, too large, or its .xz is damaged; the message names the file."""


def locate(path: Path | str) -> Path:
    """``path`` if anything is there (a link too: the reader refuses it), else its ``.xz`` sibling if anything is
    there, else ``path`` (so the caller's error names it)."""
    path = Path(path)
    packed = path.with_name(path.name + ".xz")
    return packed if not os.path.lexists(path) and os.path.lexists(packed) else path


def present(path: Path | str) -> bool:
    """Whether ``path`` or its .xz is there at all (a link or a FIFO counts: reading it then says what is wrong)."""
    return os.path.lexists(locate(path))


def read_bytes(path: Path | str, limit: int = RAW_FILE_LIMIT) -> bytes:
    path = locate(path)
    try:
        data = safe_read_bytes(path, limit)
    except UnsafeFileError as exc:
        raise RawFileError(str(exc)) from None
    return data if path.suffix != ".xz" else _unpack(data, path, limit)


def _unpack(data: bytes, path: Path, limit: int) -> bytes:
    """The .xz streams in ``data`` unpacked (as lzma.decompress does: concatenated streams, trailing bytes that
    are no stream ignored), refusing to unpack more than ``limit`` bytes."""
    out, total = [], 0
    while data:
        decompressor = lzma.LZMADecompressor()
        try:
            piece = decompressor.decompress(data, max_length=limit + 1 - total)
        except lzma.LZMAError as exc:
            if out:
                break
            raise RawFileError(f"{shown(path)}: not a valid .xz file ({exc})") from None
        total += len(piece)
        out.append(piece)
        if total > limit:
            raise RawFileError(f"{shown(path)}: unpacks to more than the {limit} bytes ticklab reads of a raw file")
        if not decompressor.eof:
            raise RawFileError(f"{shown(path)}: not a valid .xz file (Compressed data ended before the end-of-stream "
                               "marker was reached)")
        data = decompressor.unused_data
    if not out:
        raise RawFileError(f"{shown(path)}: not a valid .xz file (empty)")
    return b"".join(out)


def read_text(path: Path | str, limit: int = RAW_FILE_LIMIT) -> str:
    return read_bytes(path, limit).decode()
