"""The mounts `ticklab kernel build --host --root DIR` makes for the chroot step, made and unmade by descriptor.

DIR (a disk image's mounted root) may belong to another user, who can rename and replace anything in it while
root works, from a mount namespace of their own, where root's mounts are not mount points and can be moved
(issue 55 item 5: sysfs landed on a host directory through a link swapped in after the check, and ``umount`` by
path unmounted a mount ticklab never made). So nothing here is done by path below DIR:

- DIR is opened once; each mount point is opened beneath it with ``openat2`` (``RESOLVE_BENEATH``,
  ``RESOLVE_NO_SYMLINKS``, ``RESOLVE_NO_XDEV``; on a kernel without it, ``openat`` of the one component with
  ``O_NOFOLLOW``), and must be a directory on DIR's filesystem (``st_dev``) in DIR's mount, not already a mount
  point, and empty where it must be;
- the filesystem is made with the new mount API (``fsopen``/``fsmount``; /dev with ``open_tree``) and attached
  onto that descriptor with ``move_mount``, so it goes on the directory checked, wherever a name now points;
- the mount's id is recorded from its own descriptor, and the name ``DIR/<point>`` must then lead to that very
  mount (a directory renamed away and replaced between the check and the mount is found here): otherwise the
  mount is taken down again and the step refused;
- each mount is taken down through its own descriptor (``/proc/self/fd/N``: the kernel follows it to that mount,
  never a name), after checking its id is still the one recorded and it is still attached; a mismatch unmounts
  nothing and says so. ``MNT_DETACH``: the descriptor held for this is itself a use of the mount.

The chroot itself is entered through DIR's descriptor (``chroot /proc/self/fd/N``), not its name.

What this does not make safe: the chroot runs DIR's own ``update-initramfs`` and hooks as root, and root is not
confined by a chroot. SECURITY.md says what the owner of DIR can and cannot make root do.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

# syscall numbers of the generic table (the same on every architecture since Linux 5.1, alpha aside)
SYS_OPEN_TREE, SYS_MOVE_MOUNT, SYS_FSOPEN, SYS_FSCONFIG, SYS_FSMOUNT, SYS_OPENAT2 = 428, 429, 430, 431, 432, 437
RESOLVE_NO_XDEV, RESOLVE_NO_SYMLINKS, RESOLVE_BENEATH = 0x01, 0x04, 0x08
OPEN_TREE_CLONE, OPEN_TREE_CLOEXEC = 1, os.O_CLOEXEC
FSOPEN_CLOEXEC, FSMOUNT_CLOEXEC, FSCONFIG_CMD_CREATE = 1, 1, 6
MOUNT_ATTR_NOSUID, MOUNT_ATTR_NODEV, MOUNT_ATTR_NOEXEC = 0x02, 0x04, 0x08
MOVE_MOUNT_F_EMPTY_PATH, MOVE_MOUNT_T_EMPTY_PATH = 0x04, 0x40
MNT_DETACH = 2
PROC_SUPER_MAGIC = 0x9FA0
AT_FDCWD = -100

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_libc.fstatfs.argtypes = [ctypes.c_int, ctypes.c_void_p]


class ChrootMountError(RuntimeError):
    """A one-line reason a chroot mount was refused, or could not be made or taken down, naming the path."""


@dataclass(frozen=True)
class ChrootMount:
    source: str  # a filesystem type ("proc", "sysfs"), or a host directory bound ("/dev")
    point: str  # one component below the root: "proc", "sys", "dev"
    must_be_empty: bool = True


# what a system's own update-initramfs needs mounted in a chroot (its hooks read /proc, /sys and /dev). /dev may
# hold the static nodes debootstrap makes (null, console…), which the bind covers as devtmpfs does at boot
CHROOT_MOUNTS = (ChrootMount("proc", "proc"), ChrootMount("sysfs", "sys"), ChrootMount("/dev", "dev", False))


def _no_op(point: Path) -> None:
    return None


# called between a mount point's check and the mount onto it: tests and make fuzz set it to swap a link or a
# directory in at that window (a no-op otherwise)
between_check_and_mount: Callable[[Path], None] = _no_op


def _syscall(number: int, *args) -> int:
    result = _libc.syscall(ctypes.c_long(number), *args)
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return result


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_openat2_missing = False


def open_beneath(dir_fd: int, name: str, flags: int, resolve: int) -> int:
    """``name`` (one component) opened below ``dir_fd`` with ``openat2``'s ``resolve`` flags; where the kernel has
    no openat2, ``openat`` with ``O_NOFOLLOW`` (for one component the same: nothing above it is looked up), the
    mount checked by the caller."""
    global _openat2_missing
    if "/" in name or name in ("", ".", ".."):
        raise ValueError(f"{name!r}: one component below the root")
    flags |= os.O_NOFOLLOW | os.O_CLOEXEC
    if not _openat2_missing:
        how = _OpenHow(flags, 0, resolve)
        try:
            return _syscall(
                SYS_OPENAT2, ctypes.c_int(dir_fd), ctypes.c_char_p(os.fsencode(name)), ctypes.byref(how),
                ctypes.c_size_t(ctypes.sizeof(how)),
            )  # fmt: skip
        except OSError as exc:
            if exc.errno != errno.ENOSYS:
                raise
            _openat2_missing = True
    return os.open(name, flags, dir_fd=dir_fd)


def mount_id(fd: int) -> int:
    """The id of the mount ``fd`` is on (``mnt_id`` of /proc/self/fdinfo: the ids /proc/self/mountinfo lists)."""
    with open(f"/proc/self/fdinfo/{fd}") as info:
        for line in info:
            if line.startswith("mnt_id:"):
                return int(line.split()[1])
    raise ChrootMountError(f"/proc/self/fdinfo/{fd}: no mnt_id")


def attached_mount_ids() -> set[int]:
    with open("/proc/self/mountinfo") as info:
        return {int(line.split(maxsplit=1)[0]) for line in info if line.strip()}


def filesystem_type(fd: int) -> int:
    """``f_type`` of ``fstatfs`` (valid on an O_PATH descriptor): which filesystem ``fd`` is on."""
    buffer = ctypes.create_string_buffer(256)  # struct statfs is 120 bytes on x86_64; f_type comes first
    if _libc.fstatfs(fd, buffer) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return ctypes.c_long.from_buffer(buffer).value


def is_running_system(root: Path) -> bool:
    """Whether ``root`` is the running system: it is this process's ``/`` (device and inode), or its ``proc`` is a
    real procfs mount (statfs, on ``proc`` opened without following a link). A file planted at
    ``root/proc/sys/kernel/osrelease`` makes neither true."""
    try:
        root_fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        here, slash = os.fstat(root_fd), os.stat("/")
        if (here.st_dev, here.st_ino) == (slash.st_dev, slash.st_ino):
            return True
        try:
            proc = os.open("proc", os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=root_fd)
        except OSError:
            return False
        try:
            return filesystem_type(proc) == PROC_SUPER_MAGIC
        finally:
            os.close(proc)
    finally:
        os.close(root_fd)


def open_root(root: Path) -> int:
    """DIR, opened once: the directory every mount point is opened beneath and the chroot enters."""
    try:
        return os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise ChrootMountError(f"{root}: cannot open the root for the chroot ({exc.strerror})") from None


def open_mount_point(root_fd: int, root: Path, mount: ChrootMount) -> int:
    """The mount point, opened beneath DIR without following a link or crossing a mount, checked: a directory on
    DIR's filesystem, in DIR's mount, empty where it must be. Its descriptor (O_RDONLY: a directory, never a FIFO)."""
    target = root / mount.point
    where = f"to mount {mount.point} on for the chroot"
    try:
        fd = open_beneath(root_fd, mount.point, os.O_RDONLY | os.O_DIRECTORY, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS
                          | RESOLVE_NO_XDEV)  # fmt: skip
    except OSError as exc:
        why = {
            errno.ELOOP: "a symbolic link",
            errno.ENOTDIR: "not a directory",
            errno.ENOENT: "missing",
            errno.EXDEV: "a mount point already",
        }.get(exc.errno, exc.strerror)
        raise ChrootMountError(f"{target}: not a directory {where} ({why})") from None
    try:
        info, root_info = os.fstat(fd), os.fstat(root_fd)
        if not stat.S_ISDIR(info.st_mode):
            raise ChrootMountError(f"{target}: not a directory {where}")
        if info.st_dev != root_info.st_dev or mount_id(fd) != mount_id(root_fd):
            raise ChrootMountError(f"{target}: not a directory {where} (a mount point already)")
        if mount.must_be_empty and os.listdir(fd):
            raise ChrootMountError(f"{target}: not an empty directory {where}")
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_mount_points(root: Path, mounts=CHROOT_MOUNTS) -> None:
    """Every mount point checked as :func:`open_mount_point` will before mounting, nothing mounted (before a build:
    a refusal then leaves no half-installed kernel)."""
    root_fd = open_root(root)
    try:
        for mount in mounts:
            os.close(open_mount_point(root_fd, root, mount))
    finally:
        os.close(root_fd)


def _new_mount(mount: ChrootMount) -> int:
    """A detached mount of ``mount.source`` (its descriptor): a new procfs or sysfs instance (nosuid, nodev, noexec,
    as a booted system has them), or a clone of a host directory (not recursive, as ``mount --bind``)."""
    if mount.source.startswith("/"):
        return _syscall(
            SYS_OPEN_TREE, ctypes.c_int(AT_FDCWD), ctypes.c_char_p(os.fsencode(mount.source)),
            ctypes.c_uint(OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC),
        )  # fmt: skip
    context = _syscall(SYS_FSOPEN, ctypes.c_char_p(mount.source.encode()), ctypes.c_uint(FSOPEN_CLOEXEC))
    try:
        _syscall(
            SYS_FSCONFIG, ctypes.c_int(context), ctypes.c_uint(FSCONFIG_CMD_CREATE), ctypes.c_char_p(None),
            ctypes.c_void_p(None), ctypes.c_int(0),
        )  # fmt: skip
        return _syscall(
            SYS_FSMOUNT, ctypes.c_int(context), ctypes.c_uint(FSMOUNT_CLOEXEC),
            ctypes.c_uint(MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC),
        )  # fmt: skip
    finally:
        os.close(context)


@dataclass
class Mounted:
    """One mount ticklab made: its descriptor (the mount's root), the id it was given, where it was put."""

    target: Path
    fd: int
    id: int


def _unmount(mounted: Mounted, say: Callable[[str], None], warn: Callable[[str], None]) -> bool:
    """Take down one mount ticklab made, through its own descriptor, if it is still that mount and attached."""
    try:
        now = mount_id(mounted.fd)
        if now != mounted.id or mounted.id not in attached_mount_ids():
            warn(
                f"{mounted.target}: left as it is: ticklab's mount there (id {mounted.id}) is "
                f"{'now id ' + str(now) if now != mounted.id else 'no longer attached'}, so what is there now is not "
                "ticklab's; nothing unmounted"
            )
            return False
        if _libc.umount2(f"/proc/self/fd/{mounted.fd}".encode(), MNT_DETACH) != 0:
            code = ctypes.get_errno()
            warn(f"{mounted.target}: could not unmount ticklab's mount (id {mounted.id}): {os.strerror(code)}")
            return False
        say(f"$ umount {mounted.target} (mount id {mounted.id}, through its descriptor)")
        return True
    finally:
        os.close(mounted.fd)


@dataclass
class ChrootMounts:
    """DIR's descriptor (``root_fd``, for the chroot) and the mounts made on it."""

    root: Path
    root_fd: int
    mounted: list[Mounted] = field(default_factory=list)

    @property
    def chroot_path(self) -> str:
        """DIR as the chroot's child reaches it: its own descriptor (``pass_fds``), never DIR's name again."""
        return f"/proc/self/fd/{self.root_fd}"


def _mount_one(chroot: ChrootMounts, mount: ChrootMount, say: Callable[[str], None]) -> None:
    target = chroot.root / mount.point
    point = open_mount_point(chroot.root_fd, chroot.root, mount)
    try:
        between_check_and_mount(target)
        try:
            new = _new_mount(mount)
        except OSError as exc:
            if exc.errno == errno.ENOSYS:
                raise ChrootMountError(
                    f"{target}: this kernel has no new mount API (fsopen, open_tree, move_mount: Linux 5.2), "
                    "which the chroot's mounts need"
                ) from None
            raise ChrootMountError(f"{target}: cannot make a {mount.source} mount ({exc.strerror})") from None
        try:
            _syscall(
                SYS_MOVE_MOUNT, ctypes.c_int(new), ctypes.c_char_p(b""), ctypes.c_int(point), ctypes.c_char_p(b""),
                ctypes.c_uint(MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH),
            )  # fmt: skip
        except OSError as exc:
            os.close(new)
            raise ChrootMountError(f"{target}: cannot mount {mount.source} there ({exc.strerror})") from None
        mounted = Mounted(target, new, mount_id(new))
        chroot.mounted.append(mounted)
        say(f"$ mount {mount.source} on {target} (mount id {mounted.id}, onto the directory checked)")
    finally:
        os.close(point)
    # the name must now lead to this mount: a directory renamed away and replaced after the check took the mount
    # with it, somewhere in DIR's filesystem, and the step must not go on with DIR's name meaning something else
    try:
        check = open_beneath(chroot.root_fd, mount.point, os.O_PATH | os.O_DIRECTORY, RESOLVE_BENEATH
                             | RESOLVE_NO_SYMLINKS)  # fmt: skip
    except OSError as exc:
        why = {errno.ELOOP: "a symbolic link", errno.ENOTDIR: "a symbolic link or not a directory", errno.ENOENT:
               "missing"}.get(exc.errno, exc.strerror)  # fmt: skip
        raise ChrootMountError(
            f"{target}: changed while it was being mounted on ({why} now); refused, ticklab's mount taken down"
        ) from None
    try:
        if mount_id(check) != mounted.id:
            raise ChrootMountError(
                f"{target}: changed while it was being mounted on (it is not the directory checked); refused, "
                "ticklab's mount taken down"
            )
    finally:
        os.close(check)


@contextlib.contextmanager
def chroot_mounts(
    root: Path, say: Callable[[str], None], warn: Callable[[str], None], mounts=CHROOT_MOUNTS
) -> Iterator[ChrootMounts]:
    """The mounts made for the chroot step, in order, and taken down again whatever happens, newest first, each only
    if it is still the mount ticklab made (else one line to ``warn``, and that mount point left as it is); ``say``
    gets a line for each mount made and taken down. Yields DIR's descriptor and the mounts."""
    chroot = ChrootMounts(root, open_root(root))
    try:
        for mount in mounts:
            _mount_one(chroot, mount, say)
        yield chroot
    finally:
        for mounted in reversed(chroot.mounted):
            try:
                _unmount(mounted, say, warn)
            except (OSError, ChrootMountError) as exc:  # the others are still taken down
                warn(f"{mounted.target}: could not check ticklab's mount (id {mounted.id}): {exc}; not unmounted")
        os.close(chroot.root_fd)
