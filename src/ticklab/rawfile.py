"""Raw files of a bundle may be stored xz-compressed (``name.xz``, see BundleWriter.compress_raw);
readers ask for the plain name and get the bytes either way."""

from __future__ import annotations

import lzma
from pathlib import Path


class RawFileError(ValueError):
    """A raw file is missing or its .xz is damaged; the message names the file."""


def locate(path: Path | str) -> Path:
    """``path`` if it exists, else its ``.xz`` sibling, else ``path`` (so the caller's error names it)."""
    path = Path(path)
    packed = path.with_name(path.name + ".xz")
    return packed if not path.exists() and packed.exists() else path


def read_bytes(path: Path | str) -> bytes:
    path = locate(path)
    if path.suffix != ".xz":
        return path.read_bytes()
    try:
        return lzma.decompress(path.read_bytes())
    except lzma.LZMAError as exc:
        raise RawFileError(f"{path}: not a valid .xz file ({exc})") from exc


def read_text(path: Path | str) -> str:
    return read_bytes(path).decode()
