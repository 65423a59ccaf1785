"""Where the lab keeps what it builds (outside the repository), keyed by a hash of what went in."""

from __future__ import annotations

import hashlib


class LabError(RuntimeError):
    """Something the lab needs is missing or failed; the message says what and how to fix it."""


def content_key(parts: list[tuple[str, bytes]]) -> str:
    """A short hex digest of named inputs; the same inputs in any order give the same key."""
    digest = hashlib.sha256()
    for name, data in sorted(parts):
        digest.update(name.encode() + b"\0" + str(len(data)).encode() + b"\0" + data)
    return digest.hexdigest()[:16]
