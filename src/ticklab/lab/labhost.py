"""The lab host (issue 28): a Debian 12 installation on a disk image that QEMU boots by BIOS — grub from the MBR,
Debian's kernel and initramfs, systemd — so that boot plans run where users run them.

``build_host`` (``ticklab lab build-host``) makes the image from ``runners/vm/lab-host.yaml``:

1. ``debootstrap`` of the suite into a directory, then the recipe's packages with ``apt-get`` in a chroot, the
   packages' questions answered from the recipe (kexec-tools never takes over reboots), and a Python environment
   made from ``requirements.lock`` under the recipe's ``ticklab_dir``;
2. the directory becomes the ext4 file system of the disk's one partition (``mkfs.ext4 -d``, at a 1 MiB offset
   inside the disk file, after ``sfdisk`` wrote the partition table): no loop device or mount is needed;
3. one boot of the image's own kernel (QEMU's ``-kernel``, ``init=`` our installer script) runs ``grub-install``
   on the disk and ``update-grub``, as the Debian installer's last step does; the console must say it did.

Everything is made in a temporary directory beside the cache entry and renamed into place when complete; the key
hashes the recipe, the installer, requirements.lock and ``BUILD_STEPS``. The chroot's mounts are undone in
``finally`` blocks (an interrupted build leaves no mount behind; the next build removes the temporary directory).

``prepare_run`` copies the image for one run (the cached one is never booted), mounts the copy's partition through
a loop device at its offset, installs this checkout the way README says (its files under ``ticklab_dir``, then
``make env tools`` in a chroot) with the job the guest's driver runs (``runners/vm/lab-host-job.py`` as
``ticklab-lab-job-*.service``), builds and installs the kernels the plan needs by the user's command (``kernel build
--host --root`` against the copy, the modules a recorded boot of the image loaded kept; ``modules_record``), and
unmounts. ``boot_host`` boots the copy from its disk (no ``-kernel``: every
boot goes through the firmware and grub; a reboot is a real reset) until the guest powers off. ``collect`` mounts
the copy again and copies out what the guest left (the job's log, the plan's directory, the bundles).

A run stopped once its disk is prepared (Ctrl-C, SIGTERM or SIGHUP, QEMU's deadline, this machine going down) keeps
its disk and ``host-run.json`` (what plan it is); ``host-plan --resume`` (``plan_run(resume=...)``) checks a kept
run against the command's claim, boot mode and experiment, tells the job in the disk that it was resumed, and boots
the disk again: the plan inside goes on where it stopped (its unit resumes it after each boot; a run the stop cut off
mid-boot is booted again by the job, one that was being made is recorded cut short), and the bundle is copied out.
A disk whose plan had ended and been checked is not booted again: its bundle is copied out.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from .. import yamlsafe
from ..capture.process import spawn, wait_or_kill
from ..host.facts import DECLARED_FACTS
from ..paths import cache_dir, repo_root
from ..registry import LAB_HOST_BOOT_MODES, TCG, accelerator
from ..safefiles import OwnedDir
from .cache import LabError, content_key
from .qemu import QEMU, machine_argv, require_qemu

RECIPE = Path("runners/vm/lab-host.yaml")
INSTALLER = Path("runners/vm/lab-host-install")
JOB_DRIVER = Path("runners/vm/lab-host-job.py")
# the build's steps, in the key with the recipe, the installer and the lock: raise it when _build_into or
# _configure change what goes into the image (the run functions below change nothing in it)
BUILD_STEPS = 1
PARTITION_OFFSET = 1 << 20
INSTALL_OK = "ticklab-lab-install: ok"
PROGRAMS = ("debootstrap", "sfdisk", "mkfs.ext4", "chroot", "mount", "umount", "losetup", QEMU)
# what the chroot needs mounted for packages' scripts (udev, initramfs-tools) and pip
CHROOT_MOUNTS = (
    ("proc", "proc", ["-t", "proc"]),
    ("sys", "sys", ["-t", "sysfs"]),
    ("/dev", "dev", ["--bind"]),
    ("devpts", "dev/pts", ["-t", "devpts"]),
)
JOB_UNITS = {  # the guest's job driver, around the plan's own unit (see runners/vm/lab-host-job.py)
    "ticklab-lab-job-before.service": ("before", "Before=ticklab-plan.service\nAfter=basic.target\n"),
    "ticklab-lab-job-after.service": (
        "after",
        "DefaultDependencies=no\nRequires=sysinit.target\nAfter=basic.target multi-user.target ticklab-plan.service\n",
    ),
}
GUEST_STATE = "var/lib/ticklab-lab"  # the driver's log and results, inside the image
CHECKOUT_EXCLUDE = {".venv", "build", ".git", "__pycache__", ".pytest_cache", ".hypothesis", ".ipynb_checkpoints"}


@dataclass
class HostImage:
    key: str
    disk: Path
    info: dict


def recipe() -> dict:
    path = repo_root() / RECIPE
    try:
        data = yamlsafe.load(path.read_text())
    except (OSError, yamlsafe.YamlError) as exc:
        raise LabError(f"{path}: cannot read the lab host recipe ({' '.join(str(exc).split())})") from None
    missing = [k for k in ("suite", "mirror", "packages", "disk_gib", "ticklab_dir") if k not in (data or {})]
    if missing:
        raise LabError(f"{path}: missing key(s) {', '.join(missing)}")
    return data


def missing_programs() -> list[str]:
    return [name for name in PROGRAMS if shutil.which(name) is None]


def host_key(data: dict | None = None) -> str:
    root = repo_root()
    parts = [(str(p), (root / p).read_bytes()) for p in (RECIPE, INSTALLER, Path("requirements.lock"))]
    parts.append(("builder", str(BUILD_STEPS).encode()))
    return content_key(parts)


def hosts_dir() -> Path:
    return cache_dir() / "hosts"


def cached_host() -> HostImage | None:
    key = host_key()
    disk = hosts_dir() / key / "disk.raw"
    try:
        return HostImage(key, disk, json.loads((disk.parent / "build.json").read_text())) if disk.is_file() else None
    except (OSError, ValueError):
        return None


def _run(argv: list[str], what: str, log: Path | None = None, env: dict | None = None, timeout_s: float = 3600) -> str:
    """Run a build step; LabError naming the step and the last lines it printed."""
    result = subprocess.run(
        argv,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        errors="replace",
        env=env,
        timeout=timeout_s,
        check=False,
    )
    if log is not None:
        with log.open("a") as out:
            out.write(f"$ {' '.join(argv)}\n{result.stdout}{result.stderr}\n")
    if result.returncode != 0:
        tail = " | ".join((result.stderr or result.stdout).strip().splitlines()[-3:])
        raise LabError(f"{what} failed (exit {result.returncode}): {tail}")
    return result.stdout


@contextlib.contextmanager
def _mounts(steps: list[tuple[list[str], Path]]):
    """Mount each (mount argv, target) in order; unmount them all in reverse, whatever happens."""
    done: list[Path] = []
    try:
        for argv, target in steps:
            target.mkdir(parents=True, exist_ok=True)
            _run(["mount", *argv, str(target)], f"mount {target}")
            done.append(target)
        yield
    finally:
        for target in reversed(done):
            if subprocess.run(["umount", str(target)], capture_output=True, check=False).returncode != 0:
                subprocess.run(["umount", "-l", str(target)], capture_output=True, check=False)


def _chroot_mounts(root: Path):
    return _mounts([([*options, source], root / target) for source, target, options in CHROOT_MOUNTS])


def _chroot_env() -> dict:
    ca = (
        {name: f"/{CHROOT_CA}" for name in ("PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE")}
        if _host_ca_bundle() is not None
        else {}
    )
    return {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": "/root",
        "DEBIAN_FRONTEND": "noninteractive",
        "LC_ALL": "C.UTF-8",
        "LANG": "C.UTF-8",
        **ca,
    }


def _in_chroot(root: Path, argv: list[str], what: str, log: Path, timeout_s: float = 3600) -> str:
    return _run(["chroot", str(root), *argv], what, log, env=_chroot_env(), timeout_s=timeout_s)


CHROOT_CA = "tmp/ticklab-host-ca.pem"


def _host_ca_bundle() -> Path | None:
    """The certificates this machine trusts (a site's proxy CA included), as pip here finds them."""
    for candidate in (
        os.environ.get("PIP_CERT"),
        os.environ.get("SSL_CERT_FILE"),
        "/etc/ssl/certs/ca-certificates.crt",
    ):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


@contextlib.contextmanager
def _network_in(root: Path):
    """The chroot reaches the network as this machine does while it installs (apt, pip): its resolv.conf and the
    certificates it trusts; the image keeps none of it."""
    resolv = root / "etc/resolv.conf"
    saved = resolv.read_bytes() if resolv.is_file() and not resolv.is_symlink() else None
    if resolv.is_symlink():
        resolv.unlink()
    shutil.copyfile("/etc/resolv.conf", resolv)
    bundle = _host_ca_bundle()
    if bundle is not None:
        shutil.copyfile(bundle, root / CHROOT_CA)
    try:
        yield
    finally:
        (root / CHROOT_CA).unlink(missing_ok=True)
        if saved is None:
            resolv.unlink(missing_ok=True)
        else:
            resolv.write_bytes(saved)


def root_uuid(key: str) -> str:
    return str(uuid.UUID(hashlib.sha256(f"ticklab-lab-host-{key}".encode()).hexdigest()[:32]))


def _configure(root: Path, data: dict, key: str) -> None:
    """What an installer writes: fstab, hostname, grub's settings, no getty on the serial console we log."""
    (root / "etc/fstab").write_text(f"UUID={root_uuid(key)} / ext4 errors=remount-ro 0 1\n")
    (root / "etc/hostname").write_text("ticklab-lab-host\n")
    (root / "etc/hosts").write_text("127.0.0.1 localhost\n127.0.1.1 ticklab-lab-host\n")
    grub_d = root / "etc/default/grub.d"
    grub_d.mkdir(parents=True, exist_ok=True)
    (grub_d / "ticklab-lab.cfg").write_text(
        "# the lab host's serial console (the builder and tests read it) and a short menu\n"
        f'GRUB_CMDLINE_LINUX_DEFAULT="{data.get("grub_cmdline", "")}"\n'
        "GRUB_TIMEOUT=1\nGRUB_TERMINAL=serial\n"
        'GRUB_SERIAL_COMMAND="serial --unit=0 --speed=115200"\n'
    )
    installer = root / "usr/local/sbin/ticklab-lab-install"
    installer.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(repo_root() / INSTALLER, installer)
    installer.chmod(0o755)
    getty = root / "etc/systemd/system/serial-getty@ttyS0.service"
    getty.parent.mkdir(parents=True, exist_ok=True)
    if not os.path.lexists(getty):
        getty.symlink_to("/dev/null")


def build_host(force: bool = False, say=print) -> HostImage:
    """The cached lab host image, built when missing (or ``force``); LabError naming what failed."""
    if os.geteuid() != 0:
        raise LabError("ticklab lab build-host: needs root (debootstrap, chroot, mkfs)")
    missing = missing_programs()
    if missing:
        raise LabError(
            f"ticklab lab build-host: {', '.join(missing)} not installed "
            "(apt-get install debootstrap fdisk e2fsprogs qemu-system-x86)"
        )
    require_qemu()
    data = recipe()
    key = host_key(data)
    final = hosts_dir() / key
    found = cached_host()
    if found and not force:
        say(f"lab host {key}: cached in {final}")
        return found
    hosts_dir().mkdir(parents=True, exist_ok=True)
    for stale in hosts_dir().glob("tmp-*-*"):  # a build interrupted earlier (its process gone)
        pid = stale.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(stale, ignore_errors=True)
    work = hosts_dir() / f"tmp-{key}-{os.getpid()}"
    work.mkdir()
    started = time.monotonic()
    log = work / "build.log"
    try:
        info = _build_into(work, data, key, log, say)
        info["seconds"] = round(time.monotonic() - started)
        (work / "build.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
        shutil.rmtree(work / "root")
        if final.exists():
            shutil.rmtree(final)
        work.rename(final)
    except BaseException:
        say(f"lab host build failed; its log: {log}") if log.exists() else None
        raise
    say(f"lab host {key}: built in {info['seconds']} s: {final / 'disk.raw'}")
    return HostImage(key, final / "disk.raw", info)


def _build_into(work: Path, data: dict, key: str, log: Path, say) -> dict:
    root = work / "root"
    say(f"lab host: debootstrap {data['suite']} from {data['mirror']} (a few minutes)")
    _run(
        [
            "debootstrap",
            "--variant=minbase",
            "--include=ca-certificates,debconf",
            str(data["suite"]),
            str(root),
            str(data["mirror"]),
        ],
        "debootstrap",
        log,
    )
    policy = root / "usr/sbin/policy-rc.d"  # no service starts inside the chroot
    policy.write_text("#!/bin/sh\nexit 101\n")
    policy.chmod(0o755)
    try:
        with _chroot_mounts(root), _network_in(root):
            selections = "\n".join(data.get("debconf", [])) + "\n"
            answered = subprocess.run(
                ["chroot", str(root), "debconf-set-selections"],
                input=selections,
                text=True,
                env=_chroot_env(),
                check=False,
                capture_output=True,
            )
            if answered.returncode != 0:
                raise LabError(f"{RECIPE}: debconf answers refused: {' '.join(answered.stderr.split())[:300]}")
            say(f"lab host: apt-get install {len(data['packages'])} packages")
            _in_chroot(
                root,
                ["apt-get", "install", "-y", "--no-install-recommends", *map(str, data["packages"])],
                "apt-get install",
                log,
            )
            _in_chroot(root, ["apt-get", "clean"], "apt-get clean", log)
            target = Path(str(data["ticklab_dir"]).lstrip("/"))
            (root / target).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(repo_root() / "requirements.lock", root / target / "requirements.lock")
            say("lab host: the Python environment from requirements.lock")
            venv = f"/{target}/.venv"
            _in_chroot(root, ["python3", "-m", "venv", venv], "python3 -m venv", log)
            _in_chroot(
                root,
                [
                    f"{venv}/bin/python",
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--disable-pip-version-check",
                    "-r",
                    f"/{target}/requirements.lock",
                ],
                "pip install -r requirements.lock",
                log,
            )
            versions = _in_chroot(root, ["dpkg-query", "-W", "-f", "${Package} ${Version}\\n"], "dpkg-query", log)
    finally:
        policy.unlink(missing_ok=True)
    _configure(root, data, key)
    kernels = sorted(p.name[len("vmlinuz-") :] for p in (root / "boot").glob("vmlinuz-*"))
    if not kernels:
        raise LabError(f"{root / 'boot'}: no kernel installed (linux-image-amd64 in {RECIPE}?)")
    release = kernels[-1]
    disk = work / "disk.raw"
    size = int(data["disk_gib"]) << 30
    with disk.open("wb") as out:
        out.truncate(size)
    subprocess.run(
        ["sfdisk", "--quiet", str(disk)],
        input=f"label: dos\nstart={PARTITION_OFFSET // 512}, type=83, bootable\n",
        text=True,
        check=True,
        capture_output=True,
    )
    say("lab host: the root file system (mkfs.ext4 -d)")
    _run(
        [
            "mkfs.ext4",
            "-q",
            "-F",
            "-L",
            "ticklab-root",
            "-U",
            root_uuid(key),
            "-E",
            f"offset={PARTITION_OFFSET}",
            "-d",
            str(root),
            str(disk),
            f"{(size - PARTITION_OFFSET) >> 10}k",
        ],
        "mkfs.ext4",
        log,
    )
    say("lab host: installing grub to the disk (one boot of its kernel)")
    console = work / "install-console.log"
    argv = [
        *machine_argv(TCG.name, 2, 1024),
        "-kernel",
        str(root / "boot" / f"vmlinuz-{release}"),
        "-initrd",
        str(root / "boot" / f"initrd.img-{release}"),
        "-append",
        f"root=UUID={root_uuid(key)} rw console=ttyS0 panic=-1 init=/usr/local/sbin/ticklab-lab-install",
        "-drive",
        f"file={disk},format=raw,if=virtio",
        "-nic",
        "none",
        "-serial",
        f"file:{console}",
    ]
    process = spawn(argv, label="qemu", stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    status = wait_or_kill(process, 1800)
    text = console.read_text(errors="replace") if console.exists() else ""
    if INSTALL_OK not in text:
        tail = " | ".join(text.strip().splitlines()[-3:])
        raise LabError(f"{console}: grub was not installed ({status}): {tail}")
    return {
        "key": key,
        "suite": data["suite"],
        "kernel": release,
        "root_uuid": root_uuid(key),
        "packages": dict(line.split(" ", 1) for line in versions.splitlines() if " " in line),
        "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


# -- one run of the lab host -----------------------------------------------------------------------------------------
GUEST_TICKLAB = "opt/ticklab"


def checkout_files(root: Path) -> list[Path]:
    """The checkout's files as a user has them (git's tracked and untracked-but-not-ignored files where it is a git
    work tree, else every file), without environments, outputs and bundles (the image keeps its own); the published
    layer stays (a capture's stopping rule reads its targets)."""
    listed = subprocess.run(
        ["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=False,
    )
    if listed.returncode == 0 and listed.stdout:
        names = [Path(n) for n in listed.stdout.decode().split("\0") if n]
    else:
        names = [p.relative_to(root) for p in root.rglob("*") if p.is_file() or p.is_symlink()]
    return sorted(n for n in names if not set(n.parts) & CHECKOUT_EXCLUDE and not _a_bundle(n) and (root / n).is_file())


def _a_bundle(name: Path) -> bool:
    """Under traces/ but not the published layer (which a capture's stopping rule reads its targets from)."""
    return name.parts[:1] == ("traces",) and name.parts[1:2] != ("published",)


def _copy_checkout(source: Path, target: Path) -> int:
    files = checkout_files(source)
    for name in files:
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source / name, target / name)
    return len(files)


@contextlib.contextmanager
def mounted_disk(disk: Path, mountpoint: Path, read_only: bool = False):
    """The disk image's partition mounted through a loop device at its offset (released when unmounted)."""
    options = f"loop,offset={PARTITION_OFFSET}" + (",ro" if read_only else "")
    with _mounts([(["-o", options, str(disk)], mountpoint)]):
        yield mountpoint


def unit_text(name: str) -> str:
    phase, ordering = JOB_UNITS[name]
    return (
        f"[Unit]\nDescription=ticklab lab host job ({phase} the boot plan's unit)\n{ordering}\n"
        f"[Service]\nType=oneshot\nExecStart=/usr/bin/python3 /usr/local/sbin/ticklab-lab-job {phase}\n"
        "StandardOutput=journal+console\nStandardError=journal+console\nTimeoutStartSec=infinity\n\n"
        "[Install]\nWantedBy=multi-user.target\n"
    )


def prepare_run(
    image: HostImage,
    run_dir: Path,
    job: dict,
    say=print,
    extra_files: dict[str, bytes] | None = None,
    kernels: tuple[tuple[Path, Path | None], ...] = (),
    modules: Path | None = None,
    install_checkout: bool = True,
) -> list[dict]:
    """A copy of the image for one run, with this checkout installed (make env tools), the kernels built from
    ``kernels`` ((source, config fragment or None) pairs) installed as a user would (``kernel build --host`` against
    the copy's root, the modules its recorded boot loaded kept: ``modules``), and the job in place. Returns what each
    kernel is."""
    run_dir.mkdir(parents=True, exist_ok=True)
    disk = run_dir / "disk.raw"
    say(f"lab host run: copying the image to {disk}")
    _run(["cp", "--sparse=always", str(image.disk), str(disk)], "copying the lab host image")
    built = []
    with mounted_disk(disk, run_dir / "mnt") as root:
        if install_checkout:
            target = root / GUEST_TICKLAB
            count = _copy_checkout(repo_root(), target)
            for name, data in (extra_files or {}).items():
                path = target / name
                if ".." in Path(name).parts or Path(name).is_absolute():
                    raise LabError(f"{name}: an extra file must be a relative path inside the checkout")
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
            say(f"lab host run: {count} files of this checkout in /{GUEST_TICKLAB}; make env tools (chroot)")
            with _chroot_mounts(root), _network_in(root):
                _in_chroot(
                    root,
                    ["make", "-C", f"/{GUEST_TICKLAB}", "env", "tools"],
                    "make env tools in the lab host",
                    run_dir / "prepare.log",
                )
        for source, fragment in kernels:
            built.append(install_host_kernel(root, Path(source), image.info["kernel"], modules, say, fragment))
        (root / "etc/ticklab-lab").mkdir(exist_ok=True)
        (root / "etc/ticklab-lab/job.json").write_text(json.dumps(job, indent=2) + "\n")
        # what the capture inside cannot see of itself: how QEMU runs its vCPUs (the recipe's tcg_thread)
        (root / "etc/ticklab").mkdir(exist_ok=True)
        (root / DECLARED_FACTS).write_text(json.dumps(job.get("declared") or {}) + "\n")
        driver = root / "usr/local/sbin/ticklab-lab-job"
        shutil.copyfile(repo_root() / JOB_DRIVER, driver)
        driver.chmod(0o755)
        wants = root / "etc/systemd/system/multi-user.target.wants"
        wants.mkdir(parents=True, exist_ok=True)
        for name in JOB_UNITS:
            (root / "etc/systemd/system" / name).write_text(unit_text(name))
            link = wants / name
            if not os.path.lexists(link):
                link.symlink_to(f"../{name}")
        grub = root / "boot/grub"
        (run_dir / "grub-before").mkdir(exist_ok=True)
        for name in ("grub.cfg", "grubenv"):
            if (grub / name).is_file():
                shutil.copyfile(grub / name, run_dir / "grub-before" / name)
    return built


def install_host_kernel(
    root: Path, source: Path, release: str, modules: Path | None, say=print, fragment: Path | None = None
) -> dict:
    """``ticklab kernel build --host --root <the copy's root> --release <its kernel> --source <source>
    --localmodconfig --modules <its recorded boot's>``: the user's command, by the same code (capture/hostkernel.py),
    built once per config, patches, modules and source (cached in its work directory) and installed into this copy."""
    from ..capture.hostkernel import HostKernelError, build_and_install, plan_host_kernel

    try:
        plan = plan_host_kernel(
            root, source=source, release=release, localmodconfig=modules is not None, modules=modules, fragment=fragment
        )
        say(
            f"lab host run: kernel build --host --root {root} --source {source}: {plan.release} "
            f"({sum(c.applies for c in plan.patches)} patches apply)"
        )
        installed = build_and_install(plan, root, say=lambda line: say(f"lab host run: {line}"))
    except HostKernelError as exc:
        raise LabError(f"kernel build --host for the lab host: {exc}") from None
    return {
        "release": installed,
        "source": str(source),
        "source_version": plan.source_version,
        "patches": [c.path.name for c in plan.patches if c.applies],
        "config_sha256": hashlib.sha256(plan.config).hexdigest(),
        "modules_kept": plan.module_count,
        "build_log": str(plan.work / "build.log"),
        "fragment": str(fragment) if fragment is not None else None,
        "command": f"ticklab kernel build --host --root DIR --release {release} --source {source}"
        + (f" --localmodconfig --modules {modules}" if modules is not None else "")
        + (f" --fragment {fragment}" if fragment is not None else ""),
    }


def modules_record(image: HostImage, say=print, accel: str = TCG.name) -> Path:
    """The /proc/modules of a boot of this image (the job driver's proc-modules.txt), recorded once per image and
    kept beside the runs: what a kernel built for it keeps with localmodconfig."""
    recorded = runs_dir() / "modules" / f"{image.key}.txt"
    if recorded.is_file():
        return recorded
    runs_dir().mkdir(parents=True, exist_ok=True)
    run_dir = Path(tempfile.mkdtemp(prefix="record-modules-", dir=runs_dir()))
    try:
        prepare_run(image, run_dir, {"record_only": True}, say, install_checkout=False)
        say("lab host run: one boot of the image to record the modules it loads")
        outcome = boot_host(run_dir, recipe(), 1800, accel, say)
        collect(run_dir)
        found = run_dir / "guest" / "state" / "proc-modules.txt"
        if outcome["status"] != "ok" or not found.is_file():
            raise LabError(
                f"{run_dir}: the recording boot left no proc-modules.txt ({outcome['status']}; console "
                f"{run_dir / 'console.log'})"
            )
        recorded.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(found, recorded)
    finally:
        (run_dir / "disk.raw").unlink(missing_ok=True)
    say(f"lab host run: {len(recorded.read_text().splitlines())} modules recorded in {recorded}")
    return recorded


def _said(line: str) -> str | None:
    """A console line worth showing: the job driver's, the plan's (its unit's output, as journald prints it)."""
    for marker in ("ticklab-lab-job: ", "boot plan ", "run-"):
        at = line.find(marker)
        if at >= 0 and (marker != "run-" or line[at - 4 : at] == "run "):
            return line[at - 4 if marker == "run-" else at :]
    return None


def declared_facts(data: dict, accel: str) -> dict:
    """What the lab host declares of itself (host.facts.DECLARED_FACTS): its vCPUs' threads under TCG."""
    return {"vcpu_threads": "single"} if _accel_thread(accel, data) == "single" else {}


def _accel_thread(accel: str, data: dict) -> str | None:
    """The recipe's ``tcg_thread`` for QEMU's -accel (single: the vCPUs take turns in one thread), where ``accel``
    takes one."""
    thread = data.get("tcg_thread")
    if not accelerator(accel).threaded or thread is None:
        return None
    if thread not in ("single", "multi"):
        raise LabError(f"{repo_root() / RECIPE}: tcg_thread {thread!r}: use single or multi")
    return thread


def boot_host(run_dir: Path, data: dict, timeout_s: float, accel: str = TCG.name, say=print) -> dict:
    """Boot the run's disk through the firmware until the guest powers off; every console line is stamped with the
    seconds since QEMU started (console.timeline.tsv), and the driver's and plan's lines are said."""
    console = run_dir / "console.log"
    argv = [
        *machine_argv(
            accel,
            data.get("smp", 2),
            data.get("memory_mb", 2048),
            name="ticklab-lab-host",
            reboot=True,
            thread=_accel_thread(accel, data),
        ),
        "-drive",
        f"file={run_dir / 'disk.raw'},format=raw,if=virtio",
        "-nic",
        "none",
        "-serial",
        f"file:{console}",
    ]
    if "," in str(run_dir):
        raise LabError(f"{run_dir}: QEMU options cannot take a path with a comma")
    started = time.monotonic()
    with (run_dir / "qemu.log").open("w") as qemu_log:
        process = spawn(argv, label="qemu", stdin=subprocess.DEVNULL, stdout=qemu_log, stderr=subprocess.STDOUT)
    seen = 0
    status = "ok"
    try:
        with (run_dir / "console.timeline.tsv").open("w") as timeline:
            while True:
                ended = process.poll() is not None
                text = console.read_bytes() if console.exists() else b""
                complete = text[: text.rfind(b"\n") + 1] if not ended else text
                for raw in complete[seen:].splitlines():
                    line = raw.decode(errors="replace").rstrip("\r")
                    stamp = time.monotonic() - started
                    timeline.write(f"{stamp:.1f}\t{line}\n")
                    said = _said(line)
                    if said:
                        say(f"[{stamp:6.0f} s] {said}")
                seen = len(complete)
                timeline.flush()
                if ended:
                    break
                if time.monotonic() - started > timeout_s:
                    status = "timeout"
                    wait_or_kill(process, 0)
                    break
                time.sleep(0.5)
    except BaseException:
        wait_or_kill(process, 0)
        raise
    return {
        "status": status,
        "exit": process.returncode,
        "seconds": round(time.monotonic() - started, 1),
        "accel": accel,
        "argv": argv,
    }


def collect(run_dir: Path) -> dict:
    """What the guest left, copied out of the stopped image: the driver's state, the plan, the bundles, grub's files;
    and what a look from outside finds (grub.cfg and grubenv against their copies from before the run)."""
    out = run_dir / "guest"
    if out.exists():
        shutil.rmtree(out)
    out.mkdir()
    with mounted_disk(run_dir / "disk.raw", run_dir / "mnt", read_only=True) as root:
        for source, name in (
            (root / GUEST_STATE, "state"),
            (root / "var/lib/ticklab/plans", "plans"),
            (root / GUEST_TICKLAB / "traces", "traces"),
            (root / "boot/grub", "grub"),
        ):
            if source.is_dir():
                shutil.copytree(
                    source,
                    out / name,
                    symlinks=True,
                    ignore=shutil.ignore_patterns("*.mod", "*.img", "fonts", "locale", "i386-pc"),
                )
        view = {
            "unit": os.path.lexists(root / "etc/systemd/system/ticklab-plan.service"),
            "unit_link": os.path.lexists(root / "etc/systemd/system/multi-user.target.wants/ticklab-plan.service"),
            "custom_cfg": (root / "boot/grub/custom.cfg").exists(),
        }
    before, after = run_dir / "grub-before", out / "grub"
    view["grub_cfg_unchanged"] = (before / "grub.cfg").read_bytes() == (after / "grub.cfg").read_bytes()
    env_before = (before / "grubenv").read_text() if (before / "grubenv").exists() else ""
    env_after = (after / "grubenv").read_text() if (after / "grubenv").exists() else ""
    view["grubenv_unchanged"] = env_before == env_after
    view["grubenv_after"] = [line for line in env_after.splitlines() if not line.startswith("#")]
    final = out / "state" / "final.json"
    view["final"] = json.loads(final.read_text()) if final.is_file() else None
    boots = out / "state" / "boots.jsonl"
    view["boots"] = _boot_lines(boots.read_bytes()) if boots.is_file() else []
    plans = sorted((out / "plans").glob("*/plan.json"))
    view["plan"] = json.loads(plans[-1].read_text()) if plans else None
    view["bundles"] = sorted(
        str(p.parent.relative_to(out / "traces")) for p in (out / "traces").glob("*/*/*/manifest.json")
    )
    (run_dir / "host-view.json").write_text(json.dumps(view, indent=2) + "\n")
    return view


def _boot_lines(text: bytes) -> list[dict]:
    """The driver's boots.jsonl; a line a crash left unreadable (ext4 fills an unwritten block with zeros) is kept
    as what it is, not fatal: the boots after it were recorded."""
    boots = []
    for line in text.split(b"\n"):
        if not line.strip(b"\0 \t\r"):
            if line:
                boots.append({"unreadable": f"{len(line)} zero bytes (a write the guest's crash cut off)"})
            continue
        try:
            boots.append(json.loads(line))
        except ValueError:
            boots.append({"unreadable": f"{len(line)} bytes that are not JSON"})
    return boots


def runs_dir() -> Path:
    return cache_dir() / "host-runs"


def labhost_id(mode: str, accel: str, smp: int, release: str) -> str:
    """The bundles' host-id: a lab guest's (``guest-…``, as the report sorts setups) that played a real host's plan."""
    from ..host import collect as host_facts
    from .run import guest_host_id

    return f"{guest_host_id(accel, {smp}, release, host_facts())[:85].rstrip('-.')}-labhost-{mode}"


# what a run of the lab host is (its plan's claim, boot mode, experiment and options), beside its disk: what
# ``host-plan --resume`` checks a kept disk against
RUN_RECORD = "host-run.json"
RUN_LOCK = "host-run.lock"
IDENTITY = ("claim", "mode", "experiment", "runs", "warmup", "budget_s", "accel", "kernels")
# the QEMU run's deadline, per boot the job allows: the slowest boot-to-boot seen in a plan was 8 min (hrtick, TCG)
SECONDS_PER_BOOT = 15 * 60


class HostPlanInterrupted(KeyboardInterrupt):
    """A lab host run stopped (Ctrl-C, SIGTERM, SIGHUP) once its disk was prepared: QEMU is stopped and the disk is
    kept, and ``resume`` is the command that goes on with it."""

    def __init__(self, why: str, resume: str, run_dir: Path):
        super().__init__(why)
        self.why, self.resume, self.run_dir = why, resume, run_dir


def resume_command(what: dict, run_dir: Path, out: Path | None) -> str:
    """The one command that goes on with a kept run: its claim, boot mode and experiment, and the run's directory."""
    argv = ["ticklab", "lab", "host-plan", what["claim"], "--boot", what["mode"]]
    argv += ["--experiment", what["experiment"]] if what.get("experiment") else []
    argv += ["--out", str(out)] if out is not None else []
    return shlex.join([*argv, "--resume", str(run_dir)])


def max_boots(what: dict) -> int:
    """The job's limit on boots (a guard against a plan that reboots for ever): every run the plan may make, warm-ups
    and a stopping rule's rounds up to its max_runs included, with the boot that starts the plan, the check boot, and
    room for resumes."""
    from ..capture.boot_capture import boot_experiment
    from ..capture.experiment import ExperimentError, parse_budget

    try:
        experiment = boot_experiment(
            what["claim"], repo_root() / what["experiment"] if what.get("experiment") else None
        )
        budget = None if what.get("runs") is not None else parse_budget(experiment.definition, experiment.path)
    except ExperimentError:
        return 60  # the capture inside refuses it and says why, on its first boot
    runs = what["runs"] if what.get("runs") is not None else experiment.runs
    per_condition = (budget.max_runs if budget else runs) + (
        experiment.warmup if what.get("warmup") is None else what["warmup"]
    )
    return max(60, len(experiment.definition.get("conditions") or []) * per_condition + 12)


@contextlib.contextmanager
def _run_lock(run_dir: Path):
    """The run's directory held by this process (a resume of it meanwhile is refused)."""
    fd = os.open(run_dir / RUN_LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LabError(f"{run_dir}: in use by another 'ticklab lab host-plan'; nothing done") from None
        yield
    finally:
        os.close(fd)


def _write_record(run_dir: Path, record: dict) -> None:
    with OwnedDir(run_dir, create=False) as directory:
        directory.write_atomic(RUN_RECORD, (json.dumps(record, indent=2) + "\n").encode(), mode=0o600)


def _read_record(run_dir: Path) -> dict | None:
    try:
        record = json.loads((run_dir / RUN_RECORD).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and all(k in record for k in IDENTITY) else None


def _what_differs(record: dict, what: dict) -> list[str]:
    """The options given on the command line (claim, boot mode and experiment always) that are not the kept run's."""
    given = {k: v for k, v in what.items() if k in ("claim", "mode", "experiment") or v not in (None, [])}
    return [f"{key} {record.get(key)!r}, not {value!r}" for key, value in given.items() if record.get(key) != value]


def kept_run(resume: Path | str, what: dict) -> Path:
    """The kept run ``--resume`` goes on with: ``resume`` is its directory, or ``newest`` for the newest kept run of
    this claim, boot mode and experiment; LabError (one line) when there is none, its disk is gone, or it is another
    plan's."""
    plan = f"{what['claim']} --boot {what['mode']}" + (
        f" --experiment {what['experiment']}" if what["experiment"] else ""
    )
    if resume == "newest":
        found = []
        for record_path in sorted(runs_dir().glob(f"*/{RUN_RECORD}")) if runs_dir().is_dir() else []:
            record = _read_record(record_path.parent)
            if record and (record_path.parent / "disk.raw").is_file() and not _what_differs(record, what):
                found.append(record_path.parent)
        if not found:
            raise LabError(
                f"{runs_dir()}: no kept lab host run of {plan} to resume (a run keeps its disk when it is "
                "interrupted, or with --keep-disk); nothing done"
            )
        return found[-1]  # the directories' names start with their UTC start time
    run_dir = Path(resume)
    record = _read_record(run_dir)
    if record is None:
        raise LabError(f"{run_dir}: not a lab host run ticklab kept (no readable {RUN_RECORD}); nothing done")
    if not (run_dir / "disk.raw").is_file():
        raise LabError(f"{run_dir}: its disk.raw is gone (the run ended, or it was removed); nothing to resume")
    differs = _what_differs(record, what)
    if differs:
        raise LabError(f"{run_dir}: another plan's run ({'; '.join(differs)}); nothing done")
    return run_dir


def guest_progress(run_dir: Path) -> dict:
    """What the stopped disk holds of the plan: the newest plan's state and runs, and whether the job's check boot
    (after the plan's end) was made."""
    with mounted_disk(run_dir / "disk.raw", run_dir / "mnt", read_only=True) as root:
        plans = sorted((root / "var/lib/ticklab/plans").glob("*/plan.json"))
        try:
            plan = json.loads(plans[-1].read_text()) if plans else None
        except (OSError, ValueError):
            plan = None
        checked = (root / GUEST_STATE / "final.json").is_file()
    return {"plan": plan, "checked": checked}


def progress_words(progress: dict) -> str:
    plan = progress["plan"]
    if plan is None:
        return "no plan made yet (the capture starts it at the next boot)"
    runs = plan.get("runs", [])
    count = {state: sum(r.get("state") == state for r in runs) for state in ("made", "failed", "planned")}
    words = f"plan {plan.get('id')} {plan.get('state')}: {count['made']} made, {count['failed']} failed, "
    words += f"{count['planned']} left"
    current = next((r for r in runs if r.get("state") in ("booting", "booted")), None)
    if current and plan.get("state") == "running":
        words += f"; run {current['name']} ({current['condition']}) was " + (
            "booting: the job boots it again"
            if current["state"] == "booting"
            else "being made: the plan records it failed (cut short) and goes on"
        )
    return words


def _mark_resume(run_dir: Path, what: dict) -> None:
    """Tell the job in the disk that the host resumed it: its first boot then boots a run the stop cut off mid-boot
    again (runners/vm/lab-host-job.py), with room for the boots a resume adds."""
    with mounted_disk(run_dir / "disk.raw", run_dir / "mnt") as root:
        path = root / "etc/ticklab-lab/job.json"
        job = json.loads(path.read_text())
        job["resumes"] = int(job.get("resumes", 0)) + 1
        job["max_boots"] = max(int(job.get("max_boots", 60)), max_boots(what)) + 4 * job["resumes"]
        path.write_text(json.dumps(job, indent=2) + "\n")


def plan_run(
    claim: str,
    mode: str,
    *,
    runs: int | None = None,
    warmup: int | None = None,
    experiment: str | None = None,
    budget_s: float | None = None,
    abort_when_made: int | None = None,
    hide_kernel_when_made: int | None = None,
    out: Path | None = None,
    accel: str = TCG.name,
    timeout_s: float | None = None,
    keep_disk: bool = False,
    extra_files: dict[str, bytes] | None = None,
    kernels: tuple[tuple[Path, Path | None], ...] = (),
    resume: Path | str | None = None,
    supersedes: tuple[Path, ...] = (),
    say=print,
) -> dict:
    """One boot plan in the lab host, driven without interaction: the capture started at its first boot, the user's
    abort or a hidden kernel image on cue, a check boot at the end; what was found (``host-view.json``), and the
    bundle copied into ``out`` (when given) under the lab host's host-id. ``extra_files``: files put into the
    installed checkout beside this one's (a test's own experiment).

    Stopped once its disk is prepared (Ctrl-C, SIGTERM, SIGHUP: :class:`HostPlanInterrupted`; a QEMU deadline; the
    machine going down), the run keeps its disk; ``resume`` (its directory, or ``newest``) boots that disk again, the
    plan inside goes on where it stopped (its own ``ticklab plan resume`` runs after each boot), and the bundle is
    copied out as usual; a disk whose plan had ended and been checked is not booted again."""
    if mode not in LAB_HOST_BOOT_MODES:
        raise LabError(f"--boot {mode}: the lab host plays {' or '.join(LAB_HOST_BOOT_MODES)} plans")
    what = {
        "claim": claim,
        "mode": mode,
        "experiment": experiment,
        "runs": runs,
        "warmup": warmup,
        "budget_s": budget_s,
        "accel": accel,
        "kernels": [[str(source), None if fragment is None else str(fragment)] for source, fragment in kernels],
    }
    if resume is not None:
        return _resume(kept_run(resume, what), what, out, keep_disk, timeout_s, say)
    replaced = superseded_records(claim, experiment, supersedes)
    image = cached_host()
    if image is None:
        raise LabError(f"no lab host image for this recipe (key {host_key()}): ticklab lab build-host (make lab-host)")
    data = recipe()
    smp = int(data.get("smp", 2))
    hid = labhost_id(mode, accel, smp, image.info["kernel"])
    ticklab = f"/{GUEST_TICKLAB}/.venv/bin/ticklab"
    argv = [ticklab, "capture", claim, "--boot", mode, "--no-progress", "--host-id", hid]
    argv += ["--runs", str(runs)] if runs is not None else []
    argv += ["--warmup", str(warmup)] if warmup is not None else []
    argv += ["--budget-s", f"{budget_s:g}"] if budget_s is not None else []
    argv += ["--experiment", experiment] if experiment else []
    # the bundles this plan replaces are here, not in the lab host: verified here, their records handed to the capture
    argv += [arg for record in replaced for arg in ("--supersedes-record", json.dumps(record, sort_keys=True))]
    job = {
        "argv": argv,
        "cwd": f"/{GUEST_TICKLAB}",
        "ticklab": ticklab,
        "abort_when_made": abort_when_made,
        "hide_kernel_when_made": hide_kernel_when_made,
        "max_boots": max_boots(what),
        "declared": declared_facts(data, accel),
    }
    runs_dir().mkdir(parents=True, exist_ok=True)
    run_dir = Path(
        tempfile.mkdtemp(prefix=f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{claim}-{mode}-", dir=runs_dir())
    )
    modules = modules_record(image, say, accel) if kernels else None
    record = None
    with _run_lock(run_dir):
        try:
            built = prepare_run(image, run_dir, job, say, extra_files, kernels=tuple(kernels), modules=modules)
            record = {**what, "job": job, "host_id": hid, "image": image.key, "kernels_built": built}
            _write_record(run_dir, record)  # from here on the disk can be resumed
            say(f"lab host run: booting {run_dir / 'disk.raw'} ({accel}); console {run_dir / 'console.log'}")
            outcome = boot_host(run_dir, data, timeout_s or SECONDS_PER_BOOT * job["max_boots"], accel, say)
            view = collect(run_dir)
        except KeyboardInterrupt as exc:
            if record is not None:
                raise HostPlanInterrupted(str(exc) or "SIGINT", resume_command(what, run_dir, out), run_dir) from None
            _drop_disk(run_dir, keep_disk)  # nothing booted yet: nothing to resume
            raise
        except LabError as exc:
            if record is not None:
                raise LabError(f"{exc}; the run's disk is kept: {resume_command(what, run_dir, out)}") from None
            _drop_disk(run_dir, keep_disk)
            raise
        except BaseException:
            _drop_disk(run_dir, keep_disk)
            raise
        return _finish(run_dir, record, outcome, view, what, out, keep_disk, say)


def superseded_records(claim: str, experiment: str | None, supersedes) -> list[dict]:
    """The records of the bundles a plan replaces (``--supersedes``), made here where they are and handed to the
    capture inside the lab host (``capture --supersedes-record``); LabError naming a bundle that is not a sealed
    capture of the plan's experiment."""
    if not supersedes:
        return []
    from ..bundle import BundleError, superseded_record
    from ..capture.boot_capture import boot_experiment
    from ..capture.experiment import ExperimentError

    try:
        name = boot_experiment(claim, repo_root() / experiment if experiment else None).name
        return [superseded_record(old, claim, name) for old in supersedes]
    except (BundleError, ExperimentError) as exc:
        raise LabError(str(exc)) from None


def _sealed_on_disk(bundle: Path) -> bool:
    try:
        return json.loads((bundle / "manifest.json").read_text()).get("status") == "sealed"
    except (OSError, ValueError, AttributeError):
        return False


def _drop_disk(run_dir: Path, keep_disk: bool) -> None:
    """The run's copy of the image removed (gigabytes; what the run left is in its console and logs) unless kept."""
    if not keep_disk:
        (run_dir / "disk.raw").unlink(missing_ok=True)


def _resume(run_dir: Path, what: dict, out: Path | None, keep_disk: bool, timeout_s: float | None, say) -> dict:
    """Boot a kept run's disk again until the job powers it off (not at all when its plan had ended and been checked),
    then what :func:`plan_run` does after a boot."""
    record = _read_record(run_dir)
    with _run_lock(run_dir):
        try:
            progress = guest_progress(run_dir)
            say(f"lab host run: resuming {run_dir}: {progress_words(progress)}")
            if progress["checked"]:
                say("lab host run: the plan had ended and the check boot was made: copying out what it left")
                outcome = {"status": "not booted again (the plan had ended and its check boot was made)"}
            else:
                _mark_resume(run_dir, {**record, **{k: v for k, v in what.items() if v not in (None, [])}})
                say(f"lab host run: booting {run_dir / 'disk.raw'} again ({record['accel']})")
                deadline = timeout_s or SECONDS_PER_BOOT * int(record["job"].get("max_boots", 60))
                outcome = boot_host(run_dir, recipe(), deadline, record["accel"], say)
            view = collect(run_dir)
        except KeyboardInterrupt as exc:
            raise HostPlanInterrupted(str(exc) or "SIGINT", resume_command(record, run_dir, out), run_dir) from None
        except LabError as exc:
            raise LabError(f"{exc}; the run's disk is kept: {resume_command(record, run_dir, out)}") from None
        return _finish(run_dir, record, outcome, view, record, out, keep_disk, say)


def _finish(
    run_dir: Path, record: dict, outcome: dict, view: dict, what: dict, out: Path | None, keep_disk: bool, say
) -> dict:
    """The run's view completed and saved, the bundles copied into ``out``, the disk removed (unless kept: asked
    for, or QEMU stopped at its deadline, so the run can be resumed)."""
    view.update(
        {
            "qemu": outcome,
            "job": record["job"],
            "host_id": record["host_id"],
            "image": record["image"],
            "run_dir": str(run_dir),
            "kernels_built": record["kernels_built"],
        }
    )
    (run_dir / "host-view.json").write_text(json.dumps(view, indent=2) + "\n")
    if out is not None:
        for bundle in view["bundles"]:
            target = Path(out) / bundle
            if not _sealed_on_disk(run_dir / "guest" / "traces" / bundle):
                # a capture stopped before it made its plan, started again on a resume: its first bundle holds no run
                say(f"lab host run: {bundle} was never sealed; not copied (it stays in {run_dir / 'guest/traces'})")
                continue
            if target.exists():
                raise LabError(f"{target}: exists already; the lab host's bundle stays in {run_dir / 'guest/traces'}")
            shutil.copytree(run_dir / "guest" / "traces" / bundle, target)
            say(f"lab host run: bundle {target}")
    if outcome.get("status") == "timeout":
        say(
            f"lab host run: QEMU stopped at its deadline ({outcome.get('seconds')} s); the disk is kept: "
            f"{resume_command(what, run_dir, out)} goes on with it"
        )
    elif not keep_disk:
        (run_dir / "disk.raw").unlink(missing_ok=True)
    return view


_BOOT_LINE = re.compile(
    r"ticklab-lab-job: before boot (\d+) \(([^,]+), up ([\d.]+) s\): '([^']*)'; plan (\S+), (\d+) made"
)


def timeline(run_dir: Path) -> list[tuple[float, str]]:
    """The run's boots and the plan's steps, at the seconds since QEMU started (console.timeline.tsv): each boot
    with the uptime at which its userspace reached the job driver and its command line's words of interest."""
    try:
        rows = (run_dir / "console.timeline.tsv").read_text(errors="replace").splitlines()
    except OSError:
        return []
    found = []
    for row in rows:
        stamp, _, line = row.partition("\t")
        boot = _BOOT_LINE.search(line)
        if boot:
            number, release, uptime, cmdline, state, made = boot.groups()
            loader = "grub" if "BOOT_IMAGE=" in cmdline else "kexec"
            words = " ".join(w for w in cmdline.split() if w.startswith(("nohz_full=", "root=UUID=0")))
            found.append(
                (
                    float(stamp),
                    f"boot {number} ({release}, by {loader}): userspace after {float(uptime):.0f} s; "
                    f"plan {state}, {made} made{'; ' + words if words else ''}",
                )
            )
            continue
        said = _said(line)
        if said and not said.startswith(
            (
                "ticklab-lab-job: after boot",
                "ticklab-lab-job: before boot",
                "ticklab-lab-job: status|",
                "ticklab-lab-job: |",
            )
        ):
            found.append((float(stamp), said[:200]))
    return found


def summary_lines(view: dict) -> list[str]:
    """What a lab host run showed, for its user: the boots in order, the plan's runs, the check boot's findings."""
    plan = view.get("plan") or {}
    qemu = view.get("qemu", {})
    lines = [
        f"lab host run {view.get('run_dir')}: QEMU {qemu.get('status')} after {qemu.get('seconds')} s "
        f"({qemu.get('accel')}); plan {plan.get('id')} ({plan.get('mode')}) {plan.get('state')}"
        + (f": {plan['ended_because']}" if plan.get("ended_because") else "")
    ]
    lines += (
        [f"  {seconds:7.1f} s  {text}" for seconds, text in timeline(Path(view["run_dir"]))]
        if view.get("run_dir")
        else []
    )
    for run in plan.get("runs", []):
        lines.append(
            f"  run {run['name']} ({run['condition']}): {run['state']}"
            + (f", boot {run['boot_id_found']}" if run.get("boot_id_found") else "")
            + (f": {run['why']}" if run.get("why") else "")
        )
    final = view.get("final") or {}
    lines.append(
        f"  after: unit {'left' if view.get('unit') else 'gone'}, grub.cfg "
        f"{'unchanged' if view.get('grub_cfg_unchanged') else 'CHANGED'}, grubenv "
        f"{'unchanged' if view.get('grubenv_unchanged') else 'changed: ' + ' '.join(view.get('grubenv_after', []))}, "
        f"custom.cfg {'present' if view.get('custom_cfg') else 'absent'}, kexec loaded {final.get('kexec_loaded')}"
    )
    lines.append(f"  check boot: {final.get('release')} '{' '.join(final.get('boot_words', []))}'")
    lines += [f"  | {line}" for line in str(final.get("plan_status", "")).splitlines()]
    lines += [
        f"  kernel built: {k['release']} from {k['source']} ({', '.join(k['patches']) or 'no patches'}; "
        f"{k['modules_kept']} modules kept; log {k['build_log']})"
        for k in view.get("kernels_built", [])
    ]
    lines += [f"  bundle: {b}" for b in view.get("bundles", [])]
    return lines
