"""`ticklab kernel build --host`: a kernel for this machine with ticklab's patches, installed beside the others.

It refuses first where /boot is not what boots the machine (:func:`check_boots_from_boot`: no /boot, or no
``/boot/vmlinuz-<running release>``, as in a VM whose kernel the VMM supplies, e.g. Firecracker): a kernel
installed there would never be booted. A source older than the running kernel is said first, in one line
(``warnings``): the options set in the config that the source's Kconfig files do not define, which ``olddefconfig``
drops.

The plan (:func:`plan_host_kernel`) is computed without changing anything, and is all ``--dry-run`` prints:

- **config**: the file given, else the running kernel's (``/boot/config-<release>``, else ``/proc/config.gz``);
- **source**: the tree given, else Debian's linux-source package (``/usr/src/linux-source-<X.Y>.tar.xz``; the one
  matching the running kernel's X.Y is preferred). Without one the error names the package to install; ticklab
  never runs apt-get;
- **patches**: ``kernel/patches/<X.Y>/*.patch`` for the source's X.Y, each checked with ``patch --dry-run``
  (a tarball: only the files the patches touch are extracted for the check); the plan says which apply;
- **localversion** ``-ticklab-<8 hex>``: a hash of the config and the patches that apply, so a different
  kernel never takes an installed one's name, and an installed release is never overwritten (refused);
- optional ``localmodconfig`` against the modules loaded now (``/proc/modules``);
- the config is edited only where it must be: the localversion (``LOCALVERSION_AUTO`` off, so the release is
  exactly the one planned), ``KEXEC`` on (a boot plan kexecs from this kernel into the next run's), and Debian's
  signing-key paths emptied (``SYSTEM_TRUSTED_KEYS``/``SYSTEM_REVOCATION_KEYS`` name files only Debian's build has).

Checked on this machine up to the compile (not run: > 1 h on 2 cores): the tarball extracts, the four 6.12 patches
apply, ``scripts/config``, ``localmodconfig`` and ``olddefconfig`` succeed and ``make kernelrelease`` prints the
planned release.

A system at rest — a disk image's mounted root, ``--root DIR`` (the lab host's image, issue 39) — is built for by
the same steps: its release is ``--release`` or its only ``/boot/vmlinuz-*`` (never this machine's kernel), its
config ``DIR/boot/config-<release>``, the modules ``--localmodconfig`` keeps come from ``--modules FILE`` (its
/proc/modules recorded at a boot of it; they enter the localversion hash, so other modules make another release),
and its initramfs is made by its own ``update-initramfs`` in a chroot, with /proc, /sys and /dev mounted on its
empty mount points for that step only and unmounted after it — by descriptor, never by a name below DIR, which its
owner may change meanwhile (``host/chrootmounts.py``, issue 55 item 5). DIR is the running system only where it is
this process's ``/`` or its ``proc`` is a real procfs (:func:`is_live`), never because of a file in it. The work
directory is named by the release, i.e. by the config, patches and modules: a build that finished there (the
``built`` marker) is installed again without compiling, into another copy of the image.

Installing never changes which kernel the machine boots by default. Debian's ``make install`` runs
installkernel, whose ``/etc/kernel/postinst.d/zz-update-grub`` regenerates grub.cfg; with ``GRUB_DEFAULT=0`` a
kernel that sorts newer than the running one would become the first entry, i.e. the default. So ticklab does
not run ``make install`` nor update-grub: it runs ``make modules_install``, copies vmlinuz, System.map and
config into /boot, and runs ``update-initramfs -c -k <release>`` (which does not touch grub.cfg). A boot plan
boots the kernel with kexec (which needs no menu entry); ``--boot grub`` needs a menu entry, and for that the
user runs update-grub and ticklab's plan then checks the default entry (``ticklab plan``). As a last guard, the
sha256 of /boot/grub/grub.cfg and /boot/grub/grubenv are taken before installing and compared afterwards; a
change is reported as an error naming the file.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import lzma
import os
import re
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from .. import __version__
from ..bundle import file_sha256
from ..host import chrootmounts
from ..host.facts import KERNEL_BUILD_LOG, KERNEL_BUILD_RECORD
from ..paths import cache_dir, repo_root
from ..safefiles import OwnedDir
from .process import kill_group, spawn


class HostKernelError(RuntimeError):
    """A one-line reason the host kernel cannot be planned, built or installed, naming the file."""


# Rough costs for the estimate (said to be one): a distribution config compiles ~3,500 modules; measured
# order of magnitude on x86 servers is ~4 CPU-hours for all of it, ~25 CPU-minutes for the core, and
# ~3 CPU-seconds per module on top.
FULL_CONFIG_CPU_MINUTES = 240
CORE_CPU_MINUTES = 25
CPU_SECONDS_PER_MODULE = 3
GUARDED_BOOT_FILES = ("boot/grub/grub.cfg", "boot/grub/grubenv")


@dataclass
class PatchCheck:
    path: Path
    applies: bool
    why: str


@dataclass
class HostKernelPlan:
    running_release: str
    config_source: str  # the file the config comes from
    config: bytes
    source: Path  # a tree or a tarball
    source_version: str  # X.Y.Z of the source
    patches: list[PatchCheck]
    localversion: str
    release: str  # the release the new kernel will report (uname -r)
    localmodconfig: bool
    module_count: int | None
    jobs: int
    work: Path  # where the tree (from a tarball), the config copy, lsmod list and build.log go
    build_steps: list[list[str]] = field(default_factory=list)
    install_steps: list[list[str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # one line each, said before anything else
    modules: str | None = None  # the /proc/modules lines localmodconfig keeps (None without it)
    fragment: Path | None = None  # --fragment: config options set after the base config (and localmodconfig)
    fragment_options: dict[str, str] | None = None

    @property
    def series(self) -> str:
        return ".".join(self.source_version.split(".")[:2])

    def estimate(self) -> str:
        cores = os.cpu_count() or 1
        if self.localmodconfig and self.module_count is not None:
            cpu_minutes = CORE_CPU_MINUTES + self.module_count * CPU_SECONDS_PER_MODULE / 60
            basis = f"localmodconfig keeps about {self.module_count} modules"
        else:
            cpu_minutes = FULL_CONFIG_CPU_MINUTES
            basis = "the whole config"
        minutes = cpu_minutes / max(1, min(self.jobs, cores))
        low, high = max(1, round(minutes * 0.5)), max(2, round(minutes * 1.5))
        return (
            f"an estimate, not a measurement: {low}-{high} min with -j{self.jobs} on {cores} "
            f"core{'' if cores == 1 else 's'} ({basis})"
        )

    def describe(self) -> str:
        lines = [
            f"base kernel: {self.running_release}",
            f"config: {self.config_source}",
            f"source: {self.source} (Linux {self.source_version})",
            f"patches (kernel/patches/{self.series}/):",
        ]
        if not self.patches:
            lines.append(f"  none for {self.series} (kernel/patches/{self.series}/ is missing or empty)")
        for check in self.patches:
            lines.append(
                f"  {check.path.name}: {'applies' if check.applies else 'does NOT apply, left out'}"
                + ("" if check.applies else f" ({check.why})")
            )
        lines += [
            f"localversion: {self.localversion} (new kernel release {self.release})",
            f"localmodconfig: {'yes, ' + str(self.module_count) + ' modules loaded' if self.localmodconfig else 'no'}",
            "fragment: "
            + (
                f"{self.fragment} ({', '.join(f'{k}={v}' for k, v in self.fragment_options.items())};"
                " checked in the built config before anything is installed)"
                if self.fragment_options
                else "none"
            ),
            f"build time: {self.estimate()}",
            "build steps:",
        ] + [f"  {shown(step)}" for step in self.build_steps]
        lines += ["install steps (the default boot entry is not changed: no 'make install', no update-grub):"]
        for step in self.install_steps:
            lines.append(f"  {shown(step)}")
            if step[0] == "chroot":
                lines.append(
                    "    (for it only: "
                    + ", ".join(f"{m.source} mounted on {Path(step[1]) / m.point}" for m in chrootmounts.CHROOT_MOUNTS)
                    + ", each onto the directory checked and unmounted after by its mount id)"
                )
        return "\n".join(lines)


def shown(argv: list[str]) -> str:
    return " ".join(a if a and re.fullmatch(r"[\w@%+=:,./-]+", a) else repr(a) for a in argv)


def is_live(root: Path) -> bool:
    """Whether ``root`` is the running system (this process's ``/`` by device and inode, or a tree whose ``proc`` is
    a real procfs mount), not a system at rest such as a disk image's mounted root. A regular file at
    ``root/proc/sys/kernel/osrelease`` does not make it one (issue 55 item 5: the dry run then planned the host's
    own update-initramfs)."""
    return chrootmounts.is_running_system(root)


def running_release(root: Path, given: str | None = None) -> str:
    """The release the build starts from: ``given`` (``--release``), else the running kernel's; for a system at rest
    (a disk image's root) the only ``/boot/vmlinuz-*`` it has, never this machine's kernel."""
    if given:
        return given
    if is_live(root):  # a system at rest has no /proc of its own: a file there says nothing about its kernel
        try:
            return (root / "proc/sys/kernel/osrelease").read_text().strip()
        except OSError:
            return os.uname().release
    images = sorted(p.name[len("vmlinuz-") :] for p in (root / "boot").glob("vmlinuz-*"))
    if len(images) == 1:
        return images[0]
    raise HostKernelError(
        f"{root / 'boot'}: {len(images)} kernel images ({', '.join(images[:4]) or 'none'}) in a "
        "system that is not running here; name the one it boots with --release"
    )


def check_boots_from_boot(root: Path, release: str) -> None:
    """HostKernelError unless /boot holds the running kernel's image (``vmlinuz-<release>``): without it /boot is not
    what boots this machine (a Firecracker VM's kernel comes from its VMM), and a kernel installed there would never
    be booted, by a boot plan's kexec or by grub."""
    boot = root / "boot"
    why = (
        "so /boot is not what boots this machine (its kernel is supplied from outside, as a Firecracker VM's by "
        "the VMM) and a kernel installed there would never be booted; refused"
    )
    if not boot.is_dir():
        raise HostKernelError(f"{boot}: no such directory, {why}")
    if not (boot / f"vmlinuz-{release}").is_file():
        have = sorted(p.name for p in boot.glob("vmlinuz-*"))
        raise HostKernelError(
            f"{boot}: no vmlinuz-{release}, the running kernel's image (has "
            f"{', '.join(have[:3]) + (', ...' if len(have) > 3 else '') if have else 'none'}), {why}"
        )


def _version_numbers(text: str) -> tuple[int, int, int] | None:
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    return (int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)) if match else None


def running_version(root: Path, release: str) -> str:
    """X.Y.Z of the running kernel: Debian's upstream version from /proc/version (``... Debian 6.1.90-1 ...``) where
    the release names only the ABI (``6.1.0-21-amd64``), else the release's leading numbers."""
    try:
        text = (root / "proc/version").read_text(errors="replace")[:4096] if is_live(root) else ""
    except OSError:
        text = ""
    debian = re.search(r"\bDebian (\d+\.\d+\.\d+)", text)
    numbers = _version_numbers(release)
    if debian and (numbers is None or _version_numbers(debian.group(1))[:2] == numbers[:2]):
        return debian.group(1)
    return ".".join(str(n) for n in numbers) if numbers else release


_KCONFIG_SYMBOL = re.compile(rb"^[ \t]*(?:menu)?config[ \t]+([A-Za-z0-9_]+)[ \t]*(?:#.*)?$", re.M)


def config_symbols(config: bytes) -> list[str]:
    """The options a .config sets (``CONFIG_X=...``; not ``# CONFIG_X is not set``), in its order, without CONFIG_."""
    return [m.group(1).decode() for m in re.finditer(rb"^CONFIG_([A-Za-z0-9_]+)=", config, re.M)]


def source_symbols(source: Path) -> set[str]:
    """The symbols the source's Kconfig files define (``config X`` / ``menuconfig X``), read by streaming a
    tarball (xz cannot seek) or walking a tree."""
    found: set[str] = set()
    if source.is_file():
        try:
            with tarfile.open(source, "r:xz") as archive:
                for member in archive:
                    if member.isfile() and member.name.rsplit("/", 1)[-1].startswith("Kconfig"):
                        found.update(
                            m.group(1).decode() for m in _KCONFIG_SYMBOL.finditer(archive.extractfile(member).read())
                        )
        except (OSError, tarfile.TarError, EOFError) as exc:
            raise HostKernelError(f"{source}: unreadable ({exc})") from None
        return found
    for directory, subdirectories, files in os.walk(source):
        subdirectories[:] = [d for d in subdirectories if not d.startswith(".")]
        for name in files:
            if name.startswith("Kconfig"):
                try:
                    found.update(
                        m.group(1).decode() for m in _KCONFIG_SYMBOL.finditer(Path(directory, name).read_bytes())
                    )
                except OSError as exc:
                    raise HostKernelError(f"{Path(directory, name)}: unreadable ({exc.strerror or exc})") from None
    return found


def older_source_warning(
    root: Path, release: str, version: str, source: Path, config_source: str, config: bytes
) -> str | None:
    """One line when the source is older than the running kernel: how many of the options set in the config the
    source does not know (olddefconfig drops them), and the first few; None otherwise."""
    running = running_version(root, release)
    if not (
        _version_numbers(version)
        and _version_numbers(running)
        and _version_numbers(version) < _version_numbers(running)
    ):
        return None
    options = list(dict.fromkeys(config_symbols(config)))
    known = source_symbols(source)
    dropped = [name for name in options if name not in known]
    head = f"the source is Linux {version}, older than the running kernel {release}" + (
        f" (Linux {running})" if not release.startswith(running) else ""
    )
    if not dropped:
        return f"{head}: olddefconfig drops none of the {len(options)} options set in {config_source}"
    shown_names = ", ".join(f"CONFIG_{name}" for name in dropped[:5]) + (
        f" and {len(dropped) - 5} more" if len(dropped) > 5 else ""
    )
    return (
        f"{head}: olddefconfig will drop {len(dropped)} of the {len(options)} options set in {config_source}, "
        f"which Linux {version} does not know: {shown_names}"
    )


def find_config(root: Path, release: str, given: Path | None) -> tuple[str, bytes]:
    if given is not None:
        try:
            return str(given), given.read_bytes()
        except OSError as exc:
            raise HostKernelError(f"{given}: cannot read the kernel config ({exc.strerror or exc})") from None
    boot = root / "boot" / f"config-{release}"
    if boot.is_file():
        return str(boot), boot.read_bytes()
    proc = root / "proc/config.gz"
    if proc.is_file():
        try:
            return str(proc), gzip.decompress(proc.read_bytes())
        except (OSError, EOFError) as exc:
            raise HostKernelError(f"{proc}: not a gzip'd config ({exc})") from None
    raise HostKernelError(f"{boot}: missing, and {proc} too (no CONFIG_IKCONFIG_PROC); give one with --config FILE")


def _tree_version(tree: Path) -> str:
    makefile = tree / "Makefile"
    try:
        text = makefile.read_text(errors="replace")[:4096]
    except OSError:
        raise HostKernelError(f"{makefile}: missing; --source must name a Linux source tree") from None
    parts = [re.search(rf"^{key}\s*=\s*(\d*)\s*$", text, re.M) for key in ("VERSION", "PATCHLEVEL", "SUBLEVEL")]
    if not all(parts) or not parts[0].group(1):
        raise HostKernelError(f"{makefile}: no VERSION/PATCHLEVEL/SUBLEVEL; --source must name a Linux source tree")
    return ".".join(p.group(1) or "0" for p in parts)


def _tarball_version(tarball: Path) -> str:
    """X.Y.Z from the tarball's top Makefile (read by streaming: xz cannot seek)."""
    try:
        with tarfile.open(tarball, "r:xz") as archive:
            for member in archive:
                if member.name.count("/") == 1 and member.name.endswith("/Makefile") and member.isfile():
                    text = archive.extractfile(member).read(4096).decode(errors="replace")
                    parts = [
                        re.search(rf"^{k}\s*=\s*(\d*)\s*$", text, re.M) for k in ("VERSION", "PATCHLEVEL", "SUBLEVEL")
                    ]
                    if all(parts):
                        return ".".join(p.group(1) or "0" for p in parts)
    except (OSError, tarfile.TarError, EOFError) as exc:
        raise HostKernelError(f"{tarball}: unreadable ({exc})") from None
    raise HostKernelError(f"{tarball}: no top-level Makefile with the kernel version")


def find_source(root: Path, release: str, given: Path | None) -> Path:
    if given is not None:
        if not given.exists():
            raise HostKernelError(f"{given}: no such source tree or tarball")
        return given
    wanted = ".".join(release.split(".")[:2])
    tarballs = sorted(
        (root / "usr/src").glob("linux-source-*.tar.xz"), key=lambda p: [int(x) for x in re.findall(r"\d+", p.name)]
    )
    for tarball in tarballs:
        if tarball.name == f"linux-source-{wanted}.tar.xz":
            return tarball
    if tarballs:
        return tarballs[-1]
    raise HostKernelError(
        f"{root / 'usr/src'}: no linux-source-*.tar.xz; install Debian's kernel source with "
        f"'apt-get install linux-source-{wanted}' (or linux-source for the distribution's own), "
        "or give a tree with --source DIR"
    )


def patch_paths(series: str) -> list[Path]:
    return sorted((repo_root() / "kernel" / "patches" / series).glob("*.patch"))


def patch_files(patch: Path) -> list[str]:
    return [m.group(1) for m in re.finditer(r"^\+\+\+ b/(\S+)", patch.read_text(errors="replace"), re.M)]


def check_patches(source: Path, patches: list[Path]) -> list[PatchCheck]:
    """``patch --dry-run`` of each patch in order; against a tarball, on the files the patches touch only."""
    if not patches:
        return []
    with tempfile.TemporaryDirectory(prefix="ticklab-patchcheck-") as scratch:
        tree = source
        if source.is_file():
            wanted = {name for p in patches for name in patch_files(p)}
            tree = Path(scratch)
            try:
                with tarfile.open(source, "r:xz") as archive:
                    for member in archive:
                        parts = member.name.split("/", 1)
                        if len(parts) == 2 and parts[1] in wanted and member.isfile():
                            target = tree / parts[1]
                            target.parent.mkdir(parents=True, exist_ok=True)
                            target.write_bytes(archive.extractfile(member).read())
            except (OSError, tarfile.TarError, EOFError) as exc:
                raise HostKernelError(f"{source}: unreadable ({exc})") from None
        checks = []
        for patch in patches:
            result = subprocess.run(
                ["patch", "-p1", "--dry-run", "--batch", "--forward", "-d", str(tree), "-i", str(patch)],
                capture_output=True,
                text=True,
                check=False,
            )
            why = (result.stdout + result.stderr).strip().splitlines()
            checks.append(PatchCheck(patch, result.returncode == 0, why[-1] if why else f"exit {result.returncode}"))
    return checks


def modules_list(root: Path, given: Path | None = None) -> str:
    """The loaded modules (/proc/modules format) localmodconfig keeps: ``given`` (``--modules``, recorded at a boot
    of the system), else ``root``'s /proc/modules; a system at rest has none of its own."""
    path = given or root / "proc/modules"
    if given is None and not is_live(root):
        raise HostKernelError(
            f"{root}: not a running system, so it has no /proc/modules; --localmodconfig needs "
            "--modules FILE, the /proc/modules recorded at a boot of it"
        )
    try:
        text = path.read_text()
    except OSError as exc:
        raise HostKernelError(f"{path}: cannot read the loaded modules ({exc.strerror or exc})") from None
    lines = [line for line in text.splitlines() if line.strip()]
    bad = next((line for line in lines if len(line.split()) < 2 or not line.split()[1].isdigit()), None)
    if bad is not None:
        raise HostKernelError(f"{path}: not a /proc/modules list ({bad[:60]!r})")
    return "\n".join(lines) + "\n" if lines else ""


def loaded_modules(root: Path, given: Path | None = None) -> int:
    try:
        return len(modules_list(root, given).splitlines())
    except HostKernelError:
        return 0


_FRAGMENT_SET = re.compile(r'^(CONFIG_[A-Za-z0-9_]+)=(y|m|n|-?[0-9]+|0x[0-9a-fA-F]+|"[^"\\]*")$')
_FRAGMENT_UNSET = re.compile(r"^# (CONFIG_[A-Za-z0-9_]+) is not set$")
MAX_FRAGMENT_BYTES = 1 << 16


def read_fragment(path: Path) -> dict[str, str]:
    """A config fragment: ``CONFIG_X=value`` and ``# CONFIG_X is not set`` lines (other comments and blank lines
    skipped), as option -> value ("n" for not set). Anything else is refused naming the file and line."""
    try:
        if path.is_symlink() or not path.is_file():
            raise HostKernelError(f"{path}: not a plain file (a config fragment)")
        if path.stat().st_size > MAX_FRAGMENT_BYTES:
            raise HostKernelError(f"{path}: over {MAX_FRAGMENT_BYTES} bytes; not a config fragment")
        text = path.read_text()
    except UnicodeDecodeError:
        raise HostKernelError(f"{path}: not text (a config fragment is CONFIG_X=value lines)") from None
    except OSError as exc:
        raise HostKernelError(f"{path}: cannot read the config fragment ({exc.strerror or exc})") from None
    options = config_options(
        text,
        refuse=lambda number, line: HostKernelError(
            f"{path}:{number}: not CONFIG_X=value or '# CONFIG_X is not set': {line[:60]!r}"
        ),
    )
    if not options:
        raise HostKernelError(f"{path}: sets no option (lines CONFIG_X=value or '# CONFIG_X is not set')")
    return options


def config_options(text: str, refuse=None) -> dict[str, str]:
    """A .config's or a fragment's options, option -> value ("n" for '# CONFIG_X is not set'); other comments and
    blank lines skipped. ``refuse(number, line)``: the error another line raises (None: such lines are skipped)."""
    options: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        unset, setting = _FRAGMENT_UNSET.match(line), _FRAGMENT_SET.match(line)
        if unset:
            options[unset.group(1)] = "n"
        elif setting:
            options[setting.group(1)] = setting.group(2)
        elif refuse is not None and line and not line.startswith("#"):
            raise refuse(number, line)
    return options


def fragment_name(path: Path) -> str:
    """The fragment's file name as it goes into the release: lower-case letters and digits, at most 16."""
    name = re.sub(r"[^a-z0-9]", "", path.stem.lower())[:16]
    if not name:
        raise HostKernelError(f"{path}: a fragment's file name needs a letter or digit (it names the kernel)")
    return name


def _scripts_config_args(options: dict[str, str]) -> list[str]:
    args = []
    for option, value in options.items():
        name = option[len("CONFIG_") :]
        if value == "y":
            args += ["--enable", name]
        elif value == "m":
            args += ["--module", name]
        elif value == "n":
            args += ["--disable", name]
        elif value.startswith('"'):
            args += ["--set-str", name, value[1:-1]]
        else:
            args += ["--set-val", name, value]
    return args


def fragment_problems(config_text: str, options: dict[str, str]) -> list[str]:
    """The fragment's options the final .config does not hold as asked (olddefconfig drops what a dependency
    forbids)."""
    found = config_options(config_text)
    return [
        f"{option}={value} (it has "
        + (f"{option}={found[option]}" if option in found and found[option] != "n" else "it unset")
        + ")"
        for option, value in options.items()
        if found.get(option, "n") != value
    ]


def plan_host_kernel(
    root: Path | str = "/",
    *,
    config: Path | None = None,
    source: Path | None = None,
    localmodconfig: bool = False,
    jobs: int | None = None,
    work: Path | None = None,
    release: str | None = None,
    modules: Path | None = None,
    fragment: Path | None = None,
) -> HostKernelPlan:
    """Everything the build would do, computed without changing anything. ``root`` other than ``/`` is the system
    the kernel is for: a disk image's mounted root (``release``: the kernel it boots; ``modules``: its recorded
    /proc/modules for localmodconfig), whose own update-initramfs makes the initramfs, in a chroot."""
    root = Path(root)
    release = running_release(root, release)
    check_boots_from_boot(root, release)
    config_source, config_bytes = find_config(root, release, config)
    source = find_source(root, release, source)
    version = _tarball_version(source) if source.is_file() else _tree_version(source)
    older = older_source_warning(root, release, version, source, config_source, config_bytes)
    series = ".".join(version.split(".")[:2])
    checks = check_patches(source, patch_paths(series))
    kept_modules = modules_list(root, modules) if localmodconfig else None
    digest = hashlib.sha256(config_bytes)
    for check in checks:
        if check.applies:
            digest.update(check.path.name.encode() + b"\0" + check.path.read_bytes())
    if kept_modules is not None:  # the modules kept make another kernel: another name, another cached build
        digest.update(
            b"localmodconfig\0" + " ".join(sorted(line.split()[0] for line in kept_modules.splitlines())).encode()
        )
    fragment_options = read_fragment(fragment) if fragment is not None else None
    if fragment_options is not None:  # another config, another release: the fragment's name and options in it
        digest.update(b"fragment\0" + "\n".join(f"{k}={v}" for k, v in fragment_options.items()).encode())
    named = f"{fragment_name(fragment)}-" if fragment is not None else ""
    localversion = f"-ticklab-{named}{digest.hexdigest()[:8]}"
    new_release = version + localversion
    jobs = jobs or os.cpu_count() or 1
    work = work or cache_dir() / "host-kernels" / new_release
    tree = work / "linux" if source.is_file() else source
    build = []
    if source.is_file():
        build.append(["tar", "-xf", str(source), "-C", str(work), "--one-top-level=linux", "--strip-components=1"])
    build += [["patch", "-p1", "--batch", "--forward", "-d", str(tree), "-i", str(c.path)] for c in checks if c.applies]
    build.append(["cp", str(work / "config"), str(tree / ".config")])  # the config bytes read now, written there
    build.append(
        [
            str(tree / "scripts/config"),
            "--file",
            str(tree / ".config"),
            "--set-str",
            "LOCALVERSION",
            localversion,
            "--disable",
            "LOCALVERSION_AUTO",
            "--enable",
            "KEXEC",
            "--set-str",
            "SYSTEM_TRUSTED_KEYS",
            "",
            "--set-str",
            "SYSTEM_REVOCATION_KEYS",
            "",
        ]
    )
    if localmodconfig:
        build.append(["make", "-C", str(tree), f"LSMOD={work / 'lsmod'}", "localmodconfig"])
    if fragment_options:
        build.append(
            [str(tree / "scripts/config"), "--file", str(tree / ".config"), *_scripts_config_args(fragment_options)]
        )
    build += [["make", "-C", str(tree), "olddefconfig"], ["make", "-C", str(tree), f"-j{jobs}", "bzImage", "modules"]]
    boot = root / "boot"
    install = [
        ["make", "-C", str(tree), "modules_install"] + ([f"INSTALL_MOD_PATH={root}"] if str(root) != "/" else []),
        ["install", "-m", "0644", str(tree / "arch/x86/boot/bzImage"), str(boot / f"vmlinuz-{new_release}")],
        ["install", "-m", "0644", str(tree / "System.map"), str(boot / f"System.map-{new_release}")],
        ["install", "-m", "0644", str(tree / ".config"), str(boot / f"config-{new_release}")],
        (["update-initramfs"] if is_live(root) else ["chroot", str(root), "update-initramfs"])
        + ["-c", "-k", new_release],
    ]
    plan = HostKernelPlan(
        release,
        config_source,
        config_bytes,
        source,
        version,
        checks,
        localversion,
        new_release,
        localmodconfig,
        len(kept_modules.splitlines()) if kept_modules is not None else None,
        jobs,
        work,
        build,
        install,
        [older] if older else [],
    )
    plan.modules = kept_modules
    plan.fragment, plan.fragment_options = fragment, fragment_options
    return plan


BUILT_MARKER = "built"  # in the work directory: the release whose build steps all finished there
# the release whose tree is extracted, patched and configured there: an interrupted compile resumes (make is
# incremental) instead of a 1-2 GB tree being removed and made again
PREPARED_MARKER = "prepared"


def _is_compile(argv: list[str]) -> bool:
    return argv[:1] == ["make"] and "bzImage" in argv


def _check_mount_points(root: Path) -> None:
    """Every mount point the chroot step uses, checked (by descriptor, as it is when mounted: host/chrootmounts.py)
    before any is mounted and before anything is installed: a refusal there leaves no half-installed kernel."""
    try:
        chrootmounts.check_mount_points(root)
    except chrootmounts.ChrootMountError as exc:
        raise HostKernelError(str(exc)) from None


@contextlib.contextmanager
def _system_mounts(root: Path, log, say):
    """/proc, /sys and /dev inside a system at rest for its update-initramfs (the plan's chroot step; a running
    system needs none), unmounted again whatever happens, in reverse order. /proc and /sys must be empty directories
    of that root; /dev must be a directory, and may hold the static nodes debootstrap makes (null, zero, console…),
    which a booted system's devtmpfs covers too: the bind mount hides them only for the step, and nothing under them
    is written. Yields the mounts (DIR's descriptor, for the chroot)."""

    def logged(line: str) -> None:
        log.write(line + "\n")
        log.flush()

    def warned(line: str) -> None:
        logged(line)
        say(line)

    try:
        with chrootmounts.chroot_mounts(root, logged, warned) as mounts:
            yield mounts
    except chrootmounts.ChrootMountError as exc:
        raise HostKernelError(str(exc)) from None


def _boot_digests(root: Path) -> dict[str, str | None]:
    digests = {}
    for relative in GUARDED_BOOT_FILES:
        path = root / relative
        digests[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None
    return digests


def _step(argv: list[str], log, *, dies_with_ticklab: bool, run_as: list[str] | None = None, pass_fds=()) -> None:
    """One build or install command. A build step (``dies_with_ticklab``) runs as a process group that ends with
    ticklab, a kill -9 included (capture.process.spawn), so no compile goes on burning the CPUs of a machine whose
    ticklab is gone; an install step runs to its end even then: a kernel half-installed into /boot and
    /lib/modules is worse than one installed. ``run_as``: the argv run, where it reaches a path by descriptor
    (``pass_fds``) instead of the name ``argv`` shows."""
    log.write(f"$ {shown(argv)}\n")
    log.flush()
    if dies_with_ticklab:
        process = spawn(argv, label="host kernel build", whole_group=True, stdout=log, stderr=subprocess.STDOUT)
        try:
            returncode = process.wait()
        finally:
            kill_group(process)  # interrupted: the build's whole group
    else:
        returncode = subprocess.run(
            run_as or argv, stdout=log, stderr=subprocess.STDOUT, check=False, pass_fds=pass_fds
        ).returncode
    if returncode != 0:
        raise HostKernelError(f"{log.name}: '{shown(argv)[:120]}' exited {returncode}")


def write_build_record(plan: HostKernelPlan, root: Path, log_path: Path) -> dict:
    """What made this kernel, beside its modules: the source, the patches applied, the config's digest, the build's
    log (xz) and its digest. A capture that runs on the kernel records it (facts.kernel_build), so a bundle says which
    build it ran on."""
    modules_dir = root / "lib/modules" / plan.release
    if modules_dir.is_symlink() or (modules_dir.exists() and not modules_dir.is_dir()):
        raise HostKernelError(f"{modules_dir}: not the directory modules_install made; no build record written")
    modules_dir.mkdir(parents=True, exist_ok=True)  # the release is this build's own name (a kernel without modules)
    config = root / "boot" / f"config-{plan.release}"
    log_bytes = log_path.read_bytes()
    record = {
        "built_by": "ticklab kernel build --host",
        "ticklab_version": __version__,
        "release": plan.release,
        "source": str(plan.source),
        "source_version": plan.source_version,
        "patches": [{"name": c.path.name, "sha256": file_sha256(c.path)} for c in plan.patches if c.applies],
        "config_source": plan.config_source,
        "config_sha256": file_sha256(config) if config.is_file() else None,
        "localmodconfig": plan.localmodconfig,
        "modules_kept": plan.module_count,
        "fragment": ({"name": plan.fragment.name, "options": plan.fragment_options} if plan.fragment_options else None),
        "build_log": KERNEL_BUILD_LOG,
        "build_log_sha256": hashlib.sha256(log_bytes).hexdigest(),
        "build_log_bytes": len(log_bytes),
    }
    with OwnedDir(modules_dir, create=False) as owned:  # new files only: never through a link, never over a file
        owned.write_new(KERNEL_BUILD_LOG, lzma.compress(log_bytes, preset=6))
        owned.write_new(KERNEL_BUILD_RECORD, (json.dumps(record, indent=2) + "\n").encode())
    return record


def build_and_install(plan: HostKernelPlan, root: Path | str = "/", say=print) -> str:
    """Build and install; returns the new release. Refuses to overwrite an installed release; checks afterwards
    that grub.cfg and grubenv (the default boot entry) are byte for byte what they were."""
    root = Path(root)
    for target in (root / "boot" / f"vmlinuz-{plan.release}", root / "lib/modules" / plan.release):
        if target.exists():
            raise HostKernelError(
                f"{target}: exists already; ticklab never overwrites an installed kernel "
                f"(remove it by hand if it is a stale ticklab build)"
            )
    work = plan.work
    built = work / BUILT_MARKER
    cached = built.is_file() and built.read_text().strip() == plan.release
    prepared_marker = work / PREPARED_MARKER
    prepared = prepared_marker.is_file() and prepared_marker.read_text().strip() == plan.release
    if not cached and not prepared and plan.source.is_file() and (work / "linux").exists():
        raise HostKernelError(
            f"{work / 'linux'}: left by a build interrupted before its config was made; remove it to build again"
        )
    if any(argv[0] == "chroot" for argv in plan.install_steps):
        _check_mount_points(root)  # before an hour of compiling, not after it
    work.mkdir(parents=True, exist_ok=True)
    before = _boot_digests(root)
    log_path = work / "build.log"
    with log_path.open("a") as log:
        if cached:  # the same config, patches, modules and source: the tree built before is this kernel
            say(f"Linux {plan.release}: built before ({work}); installing that build")
        else:
            (work / "config").write_bytes(plan.config)
            if plan.localmodconfig:
                (work / "lsmod").write_text(
                    "Module Size Used by\n"
                    + "".join(f"{line.split()[0]} {line.split()[1]} 0\n" for line in (plan.modules or "").splitlines())
                )
            compile_steps = [argv for argv in plan.build_steps if _is_compile(argv)]
            steps = compile_steps if prepared else plan.build_steps
            say(
                f"building Linux {plan.source_version}{plan.localversion}: {plan.estimate()}; log {log_path}"
                + (" (resuming an interrupted compile: make picks up where it stopped)" if prepared else "")
            )
            for argv in steps:
                if _is_compile(argv) and not prepared:
                    prepared_marker.write_text(plan.release + "\n")
                    prepared = True
                _step(argv, log, dies_with_ticklab=True)
            built.write_text(plan.release + "\n")
        if plan.fragment_options:
            tree = work / "linux" if plan.source.is_file() else plan.source
            dropped = fragment_problems((tree / ".config").read_text(errors="replace"), plan.fragment_options)
            if dropped:
                raise HostKernelError(
                    f"{plan.fragment}: the built config does not hold {'; '.join(dropped)}; nothing installed"
                )
        say(f"installing {plan.release} into {root} (modules, /boot files, initramfs); the default boot entry stays")
        for argv in plan.install_steps:
            if argv[0] != "chroot":
                _step(argv, log, dies_with_ticklab=False)
                continue
            with _system_mounts(root, log, say) as mounts:  # entered by DIR's descriptor, never its name again
                _step(argv, log, dies_with_ticklab=False, run_as=["chroot", mounts.chroot_path, *argv[2:]],
                      pass_fds=(mounts.root_fd,))  # fmt: skip
    write_build_record(plan, root, log_path)
    changed = [path for path, digest in _boot_digests(root).items() if digest != before[path]]
    if changed:
        raise HostKernelError(
            f"{changed[0]}: changed while installing {plan.release} (a distribution hook?); "
            "check that the default boot entry is still the kernel you want"
        )
    return plan.release
