"""Files ticklab reads and writes as root on someone else's machine: never through a symbolic link, never a
FIFO, device or socket, never more than a stated size, and every error one line that names the file.

Two halves:

- Reading an input the user named (a trace, a tracefs capture, a bundle, published tables, plan state):
  ``read_bytes`` / ``read_text`` / ``open_regular`` open with ``O_NOFOLLOW | O_NONBLOCK`` and check the
  descriptor is a regular file before reading a byte, so a planted link is refused instead of followed, a
  FIFO cannot hang the reader and a device or ``/proc`` file is never read. Sizes are bounded: a file over
  the limit is an error, never silently cut.
- Writing under a directory ticklab owns (``--out DIR``, a bundle, a plan directory): ``OwnedDir`` walks
  and creates each component below its root with directory descriptors (``mkdir``/``open`` relative to the
  parent's descriptor, ``O_NOFOLLOW``), so a link another user planted anywhere below the root is refused,
  never written through; files are created with ``O_NOFOLLOW`` (and ``O_EXCL`` where nothing may be
  replaced) and replaced atomically by ``rename`` in the same directory, whose temporary file is removed
  when the write fails (a full disk leaves no half file behind).

The root itself is the user's choice and is used as given (it may be a link the user made).
``shown`` bounds any value that goes into an error line (control characters escaped, long text cut).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

# An error line quotes at most this many characters of a value it names.
SHOWN_CHARS = 200
READ_CHUNK = 1 << 24


class UnsafeFileError(ValueError):
    """A file was refused (a link, not a regular file, too large) or could not be read or written; the message
    names it in one line."""


def shown(value: object, limit: int = SHOWN_CHARS) -> str:
    """``value`` as it may appear inside a one-line error: control characters (newlines included) escaped, and
    at most ``limit`` characters of it, saying how many there were; an integer of thousands of digits is named by
    its size."""
    if isinstance(value, int) and value.bit_length() > 4 * limit:
        # a number of thousands of digits: str() of one over 4300 digits raises, and none belongs in a line whole
        return f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"
    text = value if isinstance(value, str) else str(value)
    escaped = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[:limit + 1])
    if len(text) > limit:
        return f"{escaped[:limit]}… ({len(text)} characters)"
    return escaped


def kind_of(mode: int) -> str:
    """What a file that is not a regular file is, in words."""
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def _failed(path: object, exc: OSError, doing: str) -> UnsafeFileError:
    if exc.errno == errno.ELOOP:
        return UnsafeFileError(f"{shown(path)}: is a symbolic link; ticklab does not {doing} through links")
    return UnsafeFileError(f"{shown(path)}: cannot {doing} ({exc.strerror or exc})")


_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def open_fd(path: Path | str, *, dir_fd: int | None = None, shown_as: object = None, owner: int | None = None) -> int:
    """A read-only descriptor on ``path``, which must be a regular file reached without a symbolic link in its
    last component (``O_NOFOLLOW``; with ``dir_fd`` relative to that directory). ``owner``: the file must also
    belong to that uid and be writable by no one else (state only that user can have written)."""
    name = path if shown_as is None else shown_as
    try:
        fd = os.open(path, _READ_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        raise _failed(name, exc, "read") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise UnsafeFileError(f"{shown(name)}: {kind_of(info.st_mode)}, not a regular file; refused")
    if owner is not None and (info.st_uid != owner or info.st_mode & 0o022):
        os.close(fd)
        raise UnsafeFileError(f"{shown(name)}: not a regular file of uid {owner} writable only by it "
                              f"(owner uid {info.st_uid}, mode {stat.S_IMODE(info.st_mode):04o}); refused")
    return fd


def open_regular(path: Path | str, *, dir_fd: int | None = None, shown_as: object = None, owner: int | None = None):
    """``open_fd`` as a binary file object."""
    return os.fdopen(open_fd(path, dir_fd=dir_fd, shown_as=shown_as, owner=owner), "rb")


def read_bytes(path: Path | str, limit: int, *, dir_fd: int | None = None, shown_as: object = None,
               owner: int | None = None) -> bytes:
    """The whole of a regular file (no link, no FIFO) of at most ``limit`` bytes; a larger one is an error."""
    name = path if shown_as is None else shown_as
    with open_regular(path, dir_fd=dir_fd, shown_as=shown_as, owner=owner) as handle:
        # a read allocates what it asks for: ask in chunks, so a large limit costs only what the file holds (a
        # /proc or /sys file says size 0, so its size cannot be asked first)
        if os.fstat(handle.fileno()).st_size > limit:
            raise UnsafeFileError(f"{shown(name)}: larger than the {limit} bytes ticklab reads of it")
        pieces, total = [], 0
        try:
            while total <= limit:
                piece = handle.read(min(limit + 1 - total, READ_CHUNK))
                if not piece:
                    break
                pieces.append(piece)
                total += len(piece)
        except OSError as exc:
            raise _failed(name, exc, "read") from None
        data = b"".join(pieces)
    if len(data) > limit:
        raise UnsafeFileError(f"{shown(name)}: larger than the {limit} bytes ticklab reads of it")
    return data


def read_text(path: Path | str, limit: int, *, dir_fd: int | None = None, shown_as: object = None) -> str:
    """``read_bytes`` decoded as UTF-8; bytes that are not UTF-8 are an error naming the file."""
    name = path if shown_as is None else shown_as
    data = read_bytes(path, limit, dir_fd=dir_fd, shown_as=shown_as)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UnsafeFileError(f"{shown(name)}: not UTF-8 text (byte {exc.start})") from None


def is_regular(path: Path | str) -> bool:
    """Whether ``path`` is a regular file itself (a link to one is not)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


class OwnedDir:
    """A directory ticklab writes below: ``root`` as given; every component under it is made or opened without
    following a link. Use as a context manager or call ``close``."""

    def __init__(self, root: Path | str, *, create: bool = True, mode: int = 0o755):
        self.root = Path(root)
        if create:
            try:
                self.root.mkdir(parents=True, exist_ok=True, mode=mode)
            except OSError as exc:
                raise _failed(self.root, exc, "create") from None
        try:
            self.fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise _failed(self.root, exc, "open") from None

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> OwnedDir:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _parts(self, relative: Path | str) -> list[str]:
        parts = Path(relative).parts
        if not parts or Path(relative).is_absolute() or any(p in ("..", ".") for p in parts):
            raise UnsafeFileError(f"{shown(self.root / relative)}: not a path below {shown(self.root)}")
        return list(parts)

    def _dir_fd(self, parts: list[str], *, create: bool, mode: int = 0o755, doing: str = "write") -> int:
        """A descriptor on root/parts..., each component a real directory (made when ``create``)."""
        fd = os.dup(self.fd)
        here = self.root
        try:
            for part in parts:
                here = here / part
                if create:
                    try:
                        os.mkdir(part, mode, dir_fd=fd)
                    except FileExistsError:
                        pass
                    except OSError as exc:
                        raise _failed(here, exc, "create") from None
                try:
                    child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        try:
                            what = kind_of(os.lstat(part, dir_fd=fd).st_mode)
                        except OSError:
                            what = "not a directory"
                        raise UnsafeFileError(f"{shown(here)}: {what}, not a directory; ticklab does not {doing} "
                                              "through links") from None
                    raise _failed(here, exc, "open") from None
                os.close(fd)
                fd = child
            return fd
        except BaseException:
            os.close(fd)
            raise

    def mkdirs(self, relative: Path | str, mode: int = 0o755) -> Path:
        """Make root/relative (and what is between) as real directories; its path."""
        os.close(self._dir_fd(self._parts(relative), create=True, mode=mode))
        return self.root / relative

    def mkdir_new(self, relative: Path | str, mode: int = 0o755) -> Path:
        """Make root/relative, which must not exist yet (its parents may); its path."""
        parts = self._parts(relative)
        parent = self._dir_fd(parts[:-1], create=True)
        try:
            os.mkdir(parts[-1], mode, dir_fd=parent)
        except FileExistsError:
            raise UnsafeFileError(f"{shown(self.root / relative)}: exists already; nothing is overwritten") from None
        except OSError as exc:
            raise _failed(self.root / relative, exc, "create") from None
        finally:
            os.close(parent)
        return self.root / relative

    def create(self, relative: Path | str, *, mode: int = 0o644, exclusive: bool = False):
        """A new (``exclusive``) or truncated regular file root/relative opened for binary writing."""
        parts = self._parts(relative)
        parent = self._dir_fd(parts[:-1], create=True)
        flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_EXCL if exclusive else os.O_TRUNC)
        try:
            try:
                fd = os.open(parts[-1], flags | os.O_NONBLOCK, mode, dir_fd=parent)
            except FileExistsError:
                raise UnsafeFileError(f"{shown(self.root / relative)}: exists already; nothing is overwritten") \
                    from None
            except OSError as exc:
                raise _failed(self.root / relative, exc, "write") from None
        finally:
            os.close(parent)
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            os.close(fd)
            raise UnsafeFileError(f"{shown(self.root / relative)}: {kind_of(info.st_mode)}, not a regular file; "
                                  "refused")
        return os.fdopen(fd, "wb")

    def write_atomic(self, relative: Path | str, data: bytes, *, mode: int = 0o644) -> Path:
        """Replace root/relative with ``data`` whole or not at all (see ``replacing``)."""
        with self.replacing(relative, mode=mode) as handle:
            handle.write(data)
        return self.root / relative

    @contextlib.contextmanager
    def replacing(self, relative: Path | str, *, mode: int = 0o644):
        """A binary file to write root/relative's new content to: a temporary file beside it, synced and renamed
        over it when the block ends normally, removed when anything fails (a full disk leaves no half file); what is
        there now must be a regular file or nothing (a link or FIFO is refused, never written through)."""
        parts = self._parts(relative)
        parent = self._dir_fd(parts[:-1], create=True)
        target = self.root / relative
        temporary = f".{parts[-1]}.tmp-{os.getpid()}"
        try:
            try:
                mode_now = os.lstat(parts[-1], dir_fd=parent).st_mode
            except FileNotFoundError:
                mode_now = None
            if mode_now is not None and not stat.S_ISREG(mode_now):
                what = "is a symbolic link" if stat.S_ISLNK(mode_now) else f"{kind_of(mode_now)}, not a regular file"
                raise UnsafeFileError(f"{shown(target)}: {what}; ticklab does not write through links or replace "
                                      "what it did not write")
            try:
                fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode,
                             dir_fd=parent)
            except OSError as exc:
                raise _failed(target, exc, "write") from None
            try:
                with os.fdopen(fd, "wb") as handle:
                    yield handle
                    handle.flush()
                    os.fsync(handle.fileno())
                os.replace(temporary, parts[-1], src_dir_fd=parent, dst_dir_fd=parent)
            except BaseException as exc:
                try:
                    os.unlink(temporary, dir_fd=parent)
                except OSError:
                    pass
                if isinstance(exc, OSError):
                    raise _failed(target, exc, "write") from None
                raise
        finally:
            os.close(parent)

    def subdir(self, relative: Path | str, *, new: bool = False, mode: int = 0o755) -> OwnedDir:
        """root/relative as an ``OwnedDir`` of its own, opened by descriptor from this one (no component a link, no
        window in which one could be swapped in); ``new``: made here and now, it must not exist yet."""
        parts = self._parts(relative)
        if new:
            self.mkdir_new(relative, mode=mode)
        fd = self._dir_fd(parts, create=not new, mode=mode)
        owned = OwnedDir.__new__(OwnedDir)
        owned.root, owned.fd = self.root / relative, fd
        return owned

    def append(self, relative: Path | str, data: bytes) -> None:
        """Add ``data`` at the end of the regular file root/relative (made if missing), whole or not at all: a write
        that fails part-way (a full disk) is cut back off, so the file ends as it was."""
        parts = self._parts(relative)
        parent = self._dir_fd(parts[:-1], create=True)
        target = self.root / relative
        try:
            try:
                fd = os.open(parts[-1], os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
                             | os.O_CLOEXEC, 0o644, dir_fd=parent)
            except OSError as exc:
                raise _failed(target, exc, "write") from None
        finally:
            os.close(parent)
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise UnsafeFileError(f"{shown(target)}: {kind_of(info.st_mode)}, not a regular file; refused")
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            except OSError as exc:
                try:
                    os.ftruncate(fd, info.st_size)
                except OSError:
                    pass
                raise _failed(target, exc, "write") from None
        finally:
            os.close(fd)

    def remove(self, relative: Path | str) -> None:
        """Remove the regular file or empty directory root/relative (a link there is refused, not followed)."""
        parts = self._parts(relative)
        parent = self._dir_fd(parts[:-1], create=False)
        target = self.root / relative
        try:
            mode = os.lstat(parts[-1], dir_fd=parent).st_mode
            if stat.S_ISDIR(mode):
                os.rmdir(parts[-1], dir_fd=parent)
            elif stat.S_ISREG(mode):
                os.unlink(parts[-1], dir_fd=parent)
            else:
                raise UnsafeFileError(f"{shown(target)}: {kind_of(mode)}; ticklab removes only what it wrote")
        except OSError as exc:
            raise _failed(target, exc, "remove") from None
        finally:
            os.close(parent)

    def read_bytes(self, relative: Path | str, limit: int) -> bytes:
        """A regular file below root, no component a link, at most ``limit`` bytes."""
        return self._read(read_bytes, relative, limit)

    def read_text(self, relative: Path | str, limit: int) -> str:
        """``read_bytes`` decoded as UTF-8; bytes that are not UTF-8 are an error naming the file."""
        return self._read(read_text, relative, limit)

    def _read(self, reader, relative: Path | str, limit: int):
        parts = self._parts(relative)
        parent = self._dir_fd(parts[:-1], create=False, doing="read")
        try:
            return reader(parts[-1], limit, dir_fd=parent, shown_as=self.root / relative)
        finally:
            os.close(parent)
