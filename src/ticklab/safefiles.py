"""Files ticklab reads and writes as root on someone else's machine: never through a symbolic link, never a
FIFO, device or socket, never more than a stated size, and every error one line that names the file.

Two halves:

- Reading an input the user named (a trace, a tracefs capture, a bundle, published tables, plan state):
  ``read_bytes`` / ``read_text`` / ``open_regular`` open with ``O_NOFOLLOW | O_NONBLOCK`` and check the
  descriptor is a regular file before reading a byte, so a planted link is refused instead of followed, a
  FIFO cannot hang the reader and a device or ``/proc`` file is never read. Sizes are bounded: a file over
  the limit is an error, never silently cut.
- Writing. Every write ticklab makes goes through ``OwnedDir`` (issue 40: one way to write as root): it
  walks and creates each component below its root with directory descriptors (``mkdir``/``open`` relative to
  the parent's descriptor, ``O_NOFOLLOW``), so a link another user planted anywhere below the root is
  refused, never written through. A file it writes is

  * replaced, never written in place (``write_atomic`` / ``replacing``): the new content goes to a temporary
    file created ``O_EXCL | O_NOFOLLOW`` beside it, synced, and renamed over the old one in the same
    directory (``renameat2``: ``RENAME_NOREPLACE`` where nothing was, ``RENAME_EXCHANGE`` and a check that
    what it took away is what it checked where a file was), so whatever is put at the name between the check
    and the rename is refused, not replaced; the temporary file is removed when the write fails (a full disk
    leaves no half file behind);
  * or new (``write_new``, ``create(exclusive=True)``): ``O_EXCL | O_NOFOLLOW``, never replacing anything;
  * or, for ``append`` (a bundle's results.csv as runs end) and ``create`` without ``exclusive``, a file of
    ticklab's own written in place after the same check, through an ``O_PATH`` descriptor checked to be the file
    checked and reopened through /proc (no second lookup of the name, nothing opened that is not that file);
  * its mode set on the open descriptor (``fchmod``), never by path.

  What is at a name ticklab writes must be nothing or a regular file with one link (``st_nlink == 1``): a
  symbolic link (dangling or not), a hard link to a file elsewhere, a FIFO, a socket, a device node or a
  directory is refused with one line naming the path and what it is, found by ``lstat`` through the
  directory's descriptor, so a FIFO or a device is never opened.
  ``between_check_and_write`` is called between that check and the write (a no-op; tests plant a link there
  to show the window is closed). SECURITY.md ("One way to write") states the rule and lists the writers not
  moved onto this module yet.

The root itself is the user's choice and is used as given (it may be a link the user made).
``shown`` bounds any value that goes into an error line (control characters escaped, long text cut).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import stat
from collections.abc import Callable
from pathlib import Path

# An error line quotes at most this many characters of a value it names.
SHOWN_CHARS = 200
READ_CHUNK = 1 << 24


def _no_op(path: Path) -> None:
    return None


# Called with the path about to be written, after ticklab checked what is there and before it creates, opens or
# renames anything at that name: a test sets it to plant a link in that window. No-op otherwise.
between_check_and_write: Callable[[Path], None] = _no_op


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
    escaped = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[: limit + 1])
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


def replaceable(info: os.stat_result | None) -> bool:
    """Whether ticklab may put a file of its own where ``info`` (``lstat``) is: nothing, or a regular file with
    one link."""
    return info is None or (stat.S_ISREG(info.st_mode) and info.st_nlink == 1)


def _refused(target: object, info: os.stat_result, *, appeared: bool = False) -> UnsafeFileError:
    """The one line refusing to write ``target``, where ``info`` (``lstat``) is."""
    if stat.S_ISLNK(info.st_mode):
        what = "is a symbolic link"
    elif stat.S_ISREG(info.st_mode) and info.st_nlink > 1:
        what = f"a regular file with {info.st_nlink} links (a hard link)"
    elif stat.S_ISREG(info.st_mode):
        what = "a regular file other than the one ticklab checked"
    else:
        what = f"{kind_of(info.st_mode)}, not a regular file"
    if appeared:
        what += ", put there while ticklab was writing it"
    return UnsafeFileError(
        f"{shown(target)}: {what}; ticklab does not write through links or replace what it did not write"
    )


def _lstat(name: str, dir_fd: int, target: object) -> os.stat_result | None:
    try:
        return os.lstat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _failed(target, exc, "write") from None


_RENAME_NOREPLACE, _RENAME_EXCHANGE = 1, 2
_UNSUPPORTED = (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP)
_renameat2_call: Callable[..., int] | None
try:
    _renameat2_call = ctypes.CDLL(None, use_errno=True).renameat2
    _renameat2_call.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
except (AttributeError, OSError):  # a C library without renameat2 (glibc < 2.28): rename after a second look
    _renameat2_call = None


def _renameat2(source: str, target: str, dir_fd: int, flags: int) -> None:
    """renameat2(2) within one directory; OSError (ENOSYS where the C library lacks it)."""
    if _renameat2_call is None:
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))
    if _renameat2_call(dir_fd, os.fsencode(source), dir_fd, os.fsencode(target), flags) != 0:
        number = ctypes.get_errno()
        raise OSError(number, os.strerror(number))


def _same(one: os.stat_result | None, other: os.stat_result | None) -> bool:
    if one is None or other is None:
        return one is other
    return (one.st_dev, one.st_ino) == (other.st_dev, other.st_ino)


def _put_in_place(temporary: str, name: str, parent: int, target: object, checked: os.stat_result | None) -> None:
    """Rename ``temporary`` to ``name`` (both in ``parent``), which held ``checked`` when it was checked: whatever
    else is there now (a link planted since) is refused and left as it is, never replaced or written through."""
    if checked is None:
        try:
            _renameat2(temporary, name, parent, _RENAME_NOREPLACE)
            return
        except FileExistsError:
            found = _lstat(name, parent, target)
            raise (
                _refused(target, found, appeared=True)
                if found is not None
                else UnsafeFileError(f"{shown(target)}: changed while ticklab was writing it; refused")
            ) from None
        except OSError as exc:
            if exc.errno not in _UNSUPPORTED:
                raise
    else:
        try:
            _renameat2(temporary, name, parent, _RENAME_EXCHANGE)
        except FileNotFoundError:  # the old file went away meanwhile: nothing may appear in its place either
            return _put_in_place(temporary, name, parent, target, None)
        except OSError as exc:
            if exc.errno not in _UNSUPPORTED:
                raise
        else:
            taken = _lstat(temporary, parent, target)  # what was at the name: it must be the file checked
            if _same(taken, checked) and stat.S_ISREG(taken.st_mode):
                os.unlink(temporary, dir_fd=parent)
                return
            _renameat2(temporary, name, parent, _RENAME_EXCHANGE)  # put it back as it was; ours is removed
            raise (
                _refused(target, taken, appeared=True)
                if taken is not None
                else UnsafeFileError(f"{shown(target)}: changed while ticklab was writing it; refused")
            )
    # a file system without renameat2's flags (NFS, older kernels): look again, then rename (which never follows
    # a link either: the worst a name planted in between can get is replaced)
    found = _lstat(name, parent, target)
    if not _same(found, checked):
        raise (
            _refused(target, found, appeared=True)
            if found is not None
            else UnsafeFileError(f"{shown(target)}: changed while ticklab was writing it; refused")
        )
    os.replace(temporary, name, src_dir_fd=parent, dst_dir_fd=parent)


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
        raise UnsafeFileError(
            f"{shown(name)}: not a regular file of uid {owner} writable only by it "
            f"(owner uid {info.st_uid}, mode {stat.S_IMODE(info.st_mode):04o}); refused"
        )
    return fd


def open_regular(path: Path | str, *, dir_fd: int | None = None, shown_as: object = None, owner: int | None = None):
    """``open_fd`` as a binary file object."""
    return os.fdopen(open_fd(path, dir_fd=dir_fd, shown_as=shown_as, owner=owner), "rb")


def read_bytes(
    path: Path | str, limit: int, *, dir_fd: int | None = None, shown_as: object = None, owner: int | None = None
) -> bytes:
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


def _abandon(temporary: str, parent: int, target: Path, exc: BaseException) -> UnsafeFileError | None:
    """Remove a write's temporary file after ``exc``; the one-line error an OSError becomes (None: re-raise ``exc``)."""
    try:
        os.unlink(temporary, dir_fd=parent)
    except OSError:
        pass
    return _failed(target, exc, "write") if isinstance(exc, OSError) else None


def _empty_below(fd: int, prefix: str, keep: Callable[[str], bool]) -> list[str]:
    """``OwnedDir.empty`` of the directory ``fd`` (whose path below the root is ``prefix``): what is left."""
    left = []
    with os.scandir(fd) as entries:
        names = [entry.name for entry in entries]
    for name in names:
        relative = f"{prefix}{name}"
        found = _lstat(name, fd, relative)
        if found is None:
            continue
        if stat.S_ISDIR(found.st_mode):
            try:
                child = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError:
                left.append(relative)
                continue
            try:
                if not _same(os.fstat(child), found):
                    left.append(relative)
                    continue
                below = _empty_below(child, relative + "/", keep)
            finally:
                os.close(child)
            if below:
                left += below
                continue
            try:
                os.rmdir(name, dir_fd=fd)
            except OSError:
                left.append(relative)
        elif keep(relative):
            left.append(relative)
        else:
            try:
                os.unlink(name, dir_fd=fd)
            except FileNotFoundError:
                pass
            except OSError:
                left.append(relative)
    return left


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
                        raise UnsafeFileError(
                            f"{shown(here)}: {what}, not a directory; ticklab does not {doing} through links"
                        ) from None
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
        """A new (``exclusive``: nothing may be there) or emptied regular file root/relative opened for binary
        writing; what is there must be nothing or a regular file with one link (a link, a hard link, a FIFO or a
        device is refused without being opened)."""
        parts = self._parts(relative)
        parent = self._dir_fd(parts[:-1], create=True)
        target = self.root / relative
        flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            found = _lstat(parts[-1], parent, target)
            if found is not None and exclusive:
                raise UnsafeFileError(f"{shown(target)}: exists already; nothing is overwritten")
            if not replaceable(found):
                raise _refused(target, found)
            between_check_and_write(target)
            fd = (
                self._open_new(parts[-1], parent, target, flags, mode)
                if exclusive or found is None
                else self._reopen(parts[-1], parent, target, found, os.O_WRONLY)
            )
        finally:
            os.close(parent)
        info = os.fstat(fd)
        if info.st_size:
            os.ftruncate(fd, 0)
        return os.fdopen(fd, "wb")

    @staticmethod
    def _open_new(name: str, parent: int, target: Path, flags: int, mode: int) -> int:
        try:
            return os.open(name, flags | os.O_EXCL, mode, dir_fd=parent)
        except FileExistsError:
            raise UnsafeFileError(f"{shown(target)}: exists already; nothing is overwritten") from None
        except OSError as exc:
            raise _failed(target, exc, "write") from None

    @staticmethod
    def _reopen(name: str, parent: int, target: Path, checked: os.stat_result, flags: int) -> int:
        """A descriptor for writing on the regular file ``checked`` at ``name``: first an ``O_PATH`` one (which opens
        nothing: a FIFO or device swapped in meanwhile is not opened), checked to be that file still, then reopened
        for writing through /proc (the same inode, no second lookup of the name). Never O_TRUNC."""
        try:
            handle = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
        except OSError as exc:
            raise _failed(target, exc, "write") from None
        try:
            info = os.fstat(handle)
            if not (stat.S_ISREG(info.st_mode) and info.st_nlink == 1 and _same(info, checked)):
                raise _refused(target, info, appeared=True)
            try:
                return os.open(f"/proc/self/fd/{handle}", flags | os.O_NONBLOCK | os.O_CLOEXEC)
            except FileNotFoundError:
                pass  # no /proc (a bare chroot): open the name again, and check it is still that file
            except OSError as exc:
                raise _failed(target, exc, "write") from None
        finally:
            os.close(handle)
        try:
            fd = os.open(name, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=parent)
        except OSError as exc:
            raise _failed(target, exc, "write") from None
        info = os.fstat(fd)
        if not (stat.S_ISREG(info.st_mode) and info.st_nlink == 1 and _same(info, checked)):
            os.close(fd)
            raise _refused(target, info, appeared=True)
        return fd

    def entry(self, relative: Path | str) -> os.stat_result | None:
        """``lstat`` of root/relative (a link is a link, never followed), None when nothing is there."""
        parts = self._parts(relative)
        parent = self._dir_fd(parts[:-1], create=False, doing="read")
        try:
            return _lstat(parts[-1], parent, self.root / relative)
        finally:
            os.close(parent)

    def check_replaceable(self, relative: Path | str) -> None:
        """Refuse (one line) what ticklab would not replace at root/relative: anything but nothing or a regular
        file with one link. For a writer that checks every name before it writes the first."""
        parts = self._parts(relative)
        try:
            parent = self._dir_fd(parts[:-1], create=False)
        except UnsafeFileError as exc:
            if "No such file" in str(exc):
                return  # the directory is not there yet: nothing below it either
            raise
        try:
            found = _lstat(parts[-1], parent, self.root / relative)
        finally:
            os.close(parent)
        if not replaceable(found):
            raise _refused(self.root / relative, found)

    def write_atomic(self, relative: Path | str, data: bytes, *, mode: int = 0o644) -> Path:
        """Replace root/relative with ``data`` whole or not at all (see ``replacing``)."""
        with self.replacing(relative, mode=mode) as handle:
            handle.write(data)
        return self.root / relative

    @contextlib.contextmanager
    def replacing(self, relative: Path | str, *, mode: int = 0o644):
        """A binary file to write root/relative's new content to: a temporary file beside it, synced and renamed
        over it when the block ends normally, removed when anything fails (a full disk leaves no half file); what is
        there now must be nothing or a regular file with one link (a link, a hard link, a FIFO or a device is
        refused, never opened or written through), and must still be that file when the new one takes its place
        (a link planted meanwhile is refused, not replaced)."""
        parts = self._parts(relative)
        parent = self._dir_fd(parts[:-1], create=True)
        target = self.root / relative
        temporary = f".{parts[-1]}.tmp-{os.getpid()}"
        try:
            checked = _lstat(parts[-1], parent, target)
            if not replaceable(checked):
                raise _refused(target, checked)
            try:
                fd = os.open(
                    temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=parent
                )
            except OSError as exc:
                raise _failed(target, exc, "write") from None
            try:
                with os.fdopen(fd, "wb") as handle:
                    yield handle
                    handle.flush()
                    os.fsync(handle.fileno())
                between_check_and_write(target)
                _put_in_place(temporary, parts[-1], parent, target, checked)
            except BaseException as exc:
                failure = _abandon(temporary, parent, target, exc)
                if failure is not None:
                    raise failure from None
                raise
        finally:
            os.close(parent)

    def write_new(self, relative: Path | str, data: bytes, *, mode: int = 0o644) -> Path:
        """Add root/relative holding ``data``, whole or not at all, where nothing is (anything there, or put there
        while it is written, is refused and left as it is); ``mode`` is set on the open descriptor (``fchmod``),
        so it holds whatever the umask."""
        parts = self._parts(relative)
        parent = self._dir_fd(parts[:-1], create=True)
        target = self.root / relative
        temporary = f".{parts[-1]}.tmp-{os.getpid()}"
        try:
            if _lstat(parts[-1], parent, target) is not None:
                raise UnsafeFileError(f"{shown(target)}: exists already; nothing is overwritten")
            try:
                fd = os.open(
                    temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=parent
                )
            except OSError as exc:
                raise _failed(target, exc, "write") from None
            try:
                with os.fdopen(fd, "wb") as handle:
                    handle.write(data)
                    handle.flush()
                    os.fchmod(handle.fileno(), mode)
                    os.fsync(handle.fileno())
                between_check_and_write(target)
                try:
                    _put_in_place(temporary, parts[-1], parent, target, None)
                except UnsafeFileError:
                    raise UnsafeFileError(
                        f"{shown(target)}: exists already (put there while ticklab was writing "
                        "it); nothing is overwritten"
                    ) from None
            except BaseException as exc:
                failure = _abandon(temporary, parent, target, exc)
                if failure is not None:
                    raise failure from None
                raise
        finally:
            os.close(parent)
        return target

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
            found = _lstat(parts[-1], parent, target)
            if not replaceable(found):
                raise _refused(target, found)
            between_check_and_write(target)
            if found is None:
                try:
                    fd = os.open(
                        parts[-1],
                        os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                        0o644,
                        dir_fd=parent,
                    )
                except FileExistsError:
                    now = _lstat(parts[-1], parent, target)
                    raise (
                        _refused(target, now, appeared=True)
                        if now is not None
                        else UnsafeFileError(f"{shown(target)}: changed while ticklab was writing it; refused")
                    ) from None
                except OSError as exc:
                    raise _failed(target, exc, "write") from None
            else:
                fd = self._reopen(parts[-1], parent, target, found, os.O_WRONLY | os.O_APPEND)
        finally:
            os.close(parent)
        try:
            info = os.fstat(fd)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            except OSError as exc:
                try:
                    os.ftruncate(fd, info.st_size)
                except OSError:
                    pass
                raise _failed(target, exc, "write") from None
        finally:
            os.close(fd)

    def remove(self, relative: Path | str, *, missing_ok: bool = False) -> None:
        """Remove the regular file or empty directory root/relative (a link there is refused, not followed);
        ``missing_ok``: nothing there is not an error."""
        parts = self._parts(relative)
        parent = self._dir_fd(parts[:-1], create=False)
        target = self.root / relative
        try:
            try:
                mode = os.lstat(parts[-1], dir_fd=parent).st_mode
            except FileNotFoundError:
                if missing_ok:
                    return
                raise
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

    def exchange(self, one: str, other: str, *, expect: tuple[os.stat_result, os.stat_result] | None = None) -> None:
        """Swap two directories of root, ``one`` and ``other``, in one step (``renameat2`` ``RENAME_EXCHANGE``): a
        reader, or a kill at any moment, finds one or the other at each name, never neither (a bundle replaced whole,
        ``ticklab bundle repack``). Anything but a real directory at either name is refused; so is a file system
        that cannot swap in one step (UnsafeFileError, one line). ``expect``: what must be at ``one`` and ``other``
        (device and inode, as ``fstat`` of descriptors the caller holds gave them), checked before the swap and
        again after it; a directory put at either name meanwhile is refused and, where the swap was made, swapped
        back, so nothing but the two expected directories ever changes names."""
        for index, name in enumerate((one, other)):
            if len(self._parts(name)) != 1:
                raise UnsafeFileError(f"{shown(self.root / name)}: not a name in {shown(self.root)}; nothing swapped")
            found = _lstat(name, self.fd, self.root / name)
            if found is None or not stat.S_ISDIR(found.st_mode):
                what = (
                    "missing"
                    if found is None
                    else "a regular file"
                    if stat.S_ISREG(found.st_mode)
                    else kind_of(found.st_mode)
                )
                raise UnsafeFileError(f"{shown(self.root / name)}: {what}, not a directory; nothing swapped")
            if expect is not None and not _same(found, expect[index]):
                raise UnsafeFileError(
                    f"{shown(self.root / name)}: another directory than the one ticklab checked (put there since); "
                    "nothing swapped"
                )
        between_check_and_write(self.root / one)
        try:
            _renameat2(one, other, self.fd, _RENAME_EXCHANGE)
        except OSError as exc:
            if exc.errno in _UNSUPPORTED:
                raise UnsafeFileError(
                    f"{shown(self.root)}: this file system cannot swap two directories in one step "
                    "(renameat2 RENAME_EXCHANGE); nothing swapped"
                ) from None
            raise _failed(self.root / one, exc, "swap") from None
        if expect is None:
            return
        now_one, now_other = _lstat(one, self.fd, self.root / one), _lstat(other, self.fd, self.root / other)
        if _same(now_one, expect[1]) and _same(now_other, expect[0]):
            return
        try:  # a directory swapped in between the check and the swap: put the names back as they were
            _renameat2(one, other, self.fd, _RENAME_EXCHANGE)
        except OSError as exc:
            raise _failed(self.root / one, exc, "swap back") from None
        raise UnsafeFileError(
            f"{shown(self.root / one)}: another directory was put at {shown(one)} or {shown(other)} while ticklab "
            "swapped them; swapped back, nothing removed"
        )

    def identity(self) -> os.stat_result:
        """``fstat`` of the directory this holds open (its device and inode stay its own whatever its name)."""
        return os.fstat(self.fd)

    def open_dir(self, name: str) -> OwnedDir:
        """The existing directory root/name (one component, not a link) as an ``OwnedDir``, opened by descriptor."""
        parts = self._parts(name)
        fd = self._dir_fd(parts, create=False, doing="read")
        owned = OwnedDir.__new__(OwnedDir)
        owned.root, owned.fd = self.root / name, fd
        return owned

    def empty(self, keep: Callable[[str], bool] = lambda relative: False) -> list[str]:
        """Remove what this directory holds, through its descriptor and those of the directories below it (opened
        ``O_NOFOLLOW``, so whatever is put at a name meanwhile, nothing outside is touched): every entry but those
        ``keep`` (given the path relative to root) says to leave, and then each directory left empty. The relative
        paths left, sorted."""
        return sorted(_empty_below(self.fd, "", keep))

    def remove_empty_dir(self, name: str, identity: os.stat_result) -> bool:
        """rmdir root/name when it is the directory ``identity`` (``fstat`` of a descriptor the caller holds) and
        empty; False, and nothing removed, otherwise (another directory put at the name is left as it is)."""
        found = _lstat(name, self.fd, self.root / name)
        if found is None or not stat.S_ISDIR(found.st_mode) or not _same(found, identity):
            return False
        try:
            os.rmdir(name, dir_fd=self.fd)
        except OSError:
            return False
        return True

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
