"""Raw files of a bundle may be stored xz-compressed (``name.xz``, see BundleWriter.compress_raw);
readers ask for the plain name and get the bytes either way.

Read as root from directories other users may write to, so each file is opened without following a link and
must be a regular file (:mod:`ticklab.safefiles`), and both the file and what its .xz unpacks to are bounded:
a file over the limit is an error, never silently cut. An .xz is unpacked as a stream, a piece at a time: what it
may unpack to is bounded by its own size (``UNPACK_RATIO``) before any other limit, so a small planted .xz cannot
make ticklab allocate gigabytes; ``copy_into`` streams a file into a file object (the trace reader's spool)
without holding it whole.
"""

from __future__ import annotations

import lzma
import os
from pathlib import Path

from ..safefiles import UnsafeFileError, open_regular, shown

# A raw file read whole into memory (read_bytes): a per-CPU ring buffer, an FTQ sample file or a tool's output is
# MBs; this bounds what a planted or damaged file can make ticklab allocate.
RAW_FILE_LIMIT = 8 << 30
# What an .xz may unpack to: at most UNPACK_RATIO times its own size (the bundled raw files unpack to at most 42
# times theirs; xz of zeros reaches ~7,000), and never less than UNPACK_FLOOR for a small file (issue 40).
UNPACK_RATIO = 1024
UNPACK_FLOOR = 16 << 20
READ_CHUNK = 1 << 20  # compressed or plain bytes read at a time, and the most unpacked at a time


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


def unpack_limit(packed_size: int, limit: int) -> int:
    """The most an .xz of ``packed_size`` bytes may unpack to, under an outer ``limit``."""
    return min(limit, max(UNPACK_FLOOR, UNPACK_RATIO * packed_size))


def read_bytes(path: Path | str, limit: int = RAW_FILE_LIMIT) -> bytes:
    """The file's bytes (its .xz's, unpacked), at most ``limit`` of them."""
    pieces: list[bytes] = []

    class _Pieces:
        @staticmethod
        def write(piece: bytes) -> int:
            pieces.append(piece)
            return len(piece)

    copy_into(path, _Pieces, limit)
    return b"".join(pieces)


def copy_into(path: Path | str, out, limit: int = RAW_FILE_LIMIT, *, over: str = "") -> int:
    """Write the file's bytes (its .xz's, unpacked as a stream) to ``out`` (anything with ``write``), a piece at a
    time; the number of bytes written. More than ``limit`` bytes (an .xz: more than ``unpack_limit`` of its size)
    is a RawFileError naming the file, raised as soon as it is found, with ``over`` saying what the limit is, if
    the caller's limit is not the file's own."""
    path = locate(path)
    try:
        handle = open_regular(path)
    except UnsafeFileError as exc:
        raise RawFileError(str(exc)) from None
    with handle:
        size = os.fstat(handle.fileno()).st_size
        if path.suffix != ".xz":
            if size > limit:
                raise RawFileError(f"{shown(path)}: larger than the {limit} bytes ticklab reads of it{over}")
            return _copy(handle, path, out, limit, over)
        if size > RAW_FILE_LIMIT:
            raise RawFileError(f"{shown(path)}: larger than the {RAW_FILE_LIMIT} bytes ticklab reads of it")
        bound = unpack_limit(size, limit)
        if bound < limit:
            over = f" (an .xz unpacks to at most {UNPACK_RATIO} times its {size} bytes)"
        # what the streams' indexes say they hold, before a byte is unpacked (liblzma checks each index against its
        # blocks as it unpacks, and the count below stops at the bound whatever an index says)
        if (_stated_size(handle, size, bound) or 0) > bound:
            raise RawFileError(f"{shown(path)}: unpacks to more than the {bound} bytes ticklab reads{over}")
        handle.seek(0)
        return _unpack(handle, path, out, bound, over)


XZ_HEADER_MAGIC, XZ_FOOTER_MAGIC = b"\xfd7zXZ\x00", b"YZ"


def _stated_size(handle, size: int, enough: int) -> int | None:
    """The uncompressed size the .xz's stream indexes state, summed from its last stream back to its first (stopping
    once past ``enough``), or None where the file is not a clean sequence of streams (then only the count made while
    unpacking bounds it). The .xz format (xz-file-format.txt): each stream ends with its index (records of unpadded
    and uncompressed block sizes, as multibyte integers) and a 12-byte footer that gives the index's size."""
    total, end = 0, size
    try:
        while end > 0:
            handle.seek(max(0, end - 4))
            while end >= 4 and handle.read(4) == b"\0\0\0\0":  # stream padding
                end -= 4
                handle.seek(max(0, end - 4))
            if end < 24:
                return None
            handle.seek(end - 12)
            footer = handle.read(12)
            if footer[10:] != XZ_FOOTER_MAGIC:
                return None
            index_size = (int.from_bytes(footer[4:8], "little") + 1) * 4
            if index_size > end - 24:
                return None
            handle.seek(end - 12 - index_size)
            index = handle.read(index_size)
            if index[:1] != b"\0":
                return None
            at, records = _multibyte(index, 1)
            blocks = 0
            for _ in range(records):
                at, unpadded = _multibyte(index, at)
                at, uncompressed = _multibyte(index, at)
                blocks += -(-unpadded // 4) * 4
                total += uncompressed
                if total > enough:
                    return total
            end -= 12 + index_size + blocks + 12
            if end < 0:
                return None
            handle.seek(end)
            if handle.read(6) != XZ_HEADER_MAGIC:
                return None
    except (IndexError, OSError, ValueError):
        return None
    return total


def _multibyte(data: bytes, at: int) -> tuple[int, int]:
    """The .xz format's variable-length integer at ``at``: (where the next one starts, its value)."""
    value = 0
    for shift in range(0, 63, 7):
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return at, value
    raise ValueError("multibyte integer too long")


def _read(handle, path: Path, size: int) -> bytes:
    try:
        return handle.read(size)
    except OSError as exc:
        raise RawFileError(f"{shown(path)}: cannot read ({exc.strerror or exc})") from None


def _copy(handle, path: Path, out, limit: int, over: str) -> int:
    total = 0
    while piece := _read(handle, path, min(READ_CHUNK, limit + 1 - total)):
        total += out.write(piece)
        if total > limit:  # grew while read
            raise RawFileError(f"{shown(path)}: larger than the {limit} bytes ticklab reads of it{over}")
    return total


def _unpack(handle, path: Path, out, limit: int, over: str) -> int:
    """The .xz streams in the file unpacked (as lzma.decompress does: concatenated streams, trailing bytes that are
    no stream ignored), refusing to unpack more than ``limit`` bytes."""
    total, streams, given, written = 0, 0, False, 0
    decompressor = lzma.LZMADecompressor()
    data = b""
    while True:
        if not data and decompressor.needs_input:
            data = _read(handle, path, READ_CHUNK)
            if not data:
                break
        try:
            piece = decompressor.decompress(data, max_length=min(READ_CHUNK, limit + 1 - total))
        except lzma.LZMAError as exc:
            if streams and not written:  # bytes after the last stream that are no stream: ignored
                return total
            raise RawFileError(f"{shown(path)}: not a valid .xz file ({exc})") from None
        data, given = b"", True
        if piece:
            total += out.write(piece)
            written += len(piece)
        if total > limit:
            raise RawFileError(f"{shown(path)}: unpacks to more than the {limit} bytes ticklab reads{over}")
        if decompressor.eof:
            streams += 1
            data, given, written = decompressor.unused_data, False, 0
            decompressor = lzma.LZMADecompressor()
    if given:
        raise RawFileError(
            f"{shown(path)}: not a valid .xz file (Compressed data ended before the end-of-stream marker was reached)"
        )
    if not streams:
        raise RawFileError(f"{shown(path)}: not a valid .xz file (empty)")
    return total


def read_text(path: Path | str, limit: int = RAW_FILE_LIMIT) -> str:
    return read_bytes(path, limit).decode()
