"""`ticklab kernel build --host`: planning and --dry-run on a fake root (nothing written), installing into a fake
root with fake build tools, the guard on the default boot entry. A real host kernel build is not run here (> 1 h)."""

import contextlib
import gzip
import hashlib
import io
import json
import lzma
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from conftest import debian_image_root, make_fake_host
from ticklab import cli
from ticklab.capture import hostkernel
from ticklab.capture.hostkernel import HostKernelError, build_and_install, plan_host_kernel
from ticklab.host import chrootmounts, facts

pytestmark = pytest.mark.xdist_group("guests")

DEBIAN_SOURCE = Path("/usr/src/linux-source-6.12.tar.xz")


def tree_snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): (p.stat().st_mtime_ns, p.stat().st_size) for p in sorted(root.rglob("*"))}


def fake_tarball(path: Path, version=(6, 12, 99), files: dict[str, str] | None = None) -> Path:
    makefile = f"VERSION = {version[0]}\nPATCHLEVEL = {version[1]}\nSUBLEVEL = {version[2]}\nEXTRAVERSION =\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:xz") as archive:
        for name, text in {"Makefile": makefile, **(files or {})}.items():
            data = text.encode()
            info = tarfile.TarInfo(f"linux-source-{version[0]}.{version[1]}/{name}")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


@pytest.fixture
def host_root(tmp_path):
    root = make_fake_host(tmp_path / "root")
    (root / "boot").mkdir()
    (root / "boot/vmlinuz-6.12.57-ticklab").write_bytes(b"kernel")  # /boot is what boots this fake host
    (root / "boot/config-6.12.57-ticklab").write_text('CONFIG_64BIT=y\nCONFIG_LOCALVERSION=""\n')
    (root / "proc/modules").write_text("kvm_intel 401408 0 - Live 0x0\nkvm 1404928 1 kvm_intel, Live 0x0\n")
    fake_tarball(root / "usr/src/linux-source-6.12.tar.xz")
    return root


@pytest.fixture
def running(monkeypatch):
    """The fake host stands for the running system (its own /proc files read as the kernel's): what only a real
    procfs or this process's / makes true (hostkernel.is_live; tests/test_chroot_mounts.py tests that)."""
    monkeypatch.setattr(hostkernel, "is_live", lambda root: True)


def run_cli(*argv, env=None):
    return subprocess.run(
        [sys.executable, "-m", "ticklab.cli", *argv],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


def test_dry_run_prints_the_plan_and_writes_nothing(host_root, tmp_path):
    cache = tmp_path / "cache"
    before = tree_snapshot(host_root)
    done = run_cli(
        "kernel", "build", "--host", "--dry-run", "--root", str(host_root), env={"TICKLAB_CACHE": str(cache)}
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert f"config: {host_root}/boot/config-6.12.57-ticklab" in out
    assert f"source: {host_root}/usr/src/linux-source-6.12.tar.xz (Linux 6.12.99)" in out
    # the fake tarball holds none of the files the patches change: every patch is reported as not applying
    assert "0001-hpet-read-share.patch: does NOT apply, left out" in out
    assert "localversion: -ticklab-" in out and "new kernel release 6.12.99-ticklab-" in out
    assert "an estimate, not a measurement" in out
    assert "update-initramfs -c -k 6.12.99-ticklab-" in out
    assert "make install" not in out.replace("no 'make install'", "") and "update-grub" not in out.replace(
        "no update-grub", ""
    )
    assert "dry run: nothing built, nothing installed" in out
    assert tree_snapshot(host_root) == before
    assert not cache.exists()


def test_config_falls_back_to_proc_config_gz_and_says_what_to_install(tmp_path):
    root = make_fake_host(tmp_path / "root")
    (root / "boot").mkdir()
    (root / "boot/vmlinuz-6.12.57-ticklab").write_bytes(b"kernel")
    (root / "proc/config.gz").write_bytes(gzip.compress(b"CONFIG_64BIT=y\n"))
    with pytest.raises(
        HostKernelError,
        match=r"usr/src: no linux-source-\*\.tar\.xz; install Debian's kernel source "
        r"with 'apt-get install linux-source-6\.12'",
    ):
        plan_host_kernel(root)
    fake_tarball(root / "usr/src/linux-source-6.12.tar.xz")
    plan = plan_host_kernel(root, work=tmp_path / "work")
    assert plan.config_source == str(root / "proc/config.gz") and plan.config == b"CONFIG_64BIT=y\n"
    (root / "proc/config.gz").unlink()
    with pytest.raises(HostKernelError, match=r"boot/config-6\.12\.57-ticklab: missing, and .*proc/config\.gz too"):
        plan_host_kernel(root)


def test_localversion_follows_the_config_and_localmodconfig_counts_modules(host_root, tmp_path, running):
    first = plan_host_kernel(host_root, localmodconfig=True, jobs=2, work=tmp_path / "w")
    assert first.module_count == 2 and "localmodconfig keeps about 2 modules" in first.estimate()
    assert any("localmodconfig" in step for step in first.build_steps)
    (host_root / "boot/config-6.12.57-ticklab").write_text("CONFIG_64BIT=y\nCONFIG_HZ_1000=y\n")
    second = plan_host_kernel(host_root, work=tmp_path / "w")
    assert first.localversion != second.localversion and second.localversion.startswith("-ticklab-")


@pytest.mark.slow
@pytest.mark.skipif(not DEBIAN_SOURCE.is_file(), reason=f"{DEBIAN_SOURCE} missing (apt-get install linux-source-6.12)")
def test_the_repository_patches_apply_to_debians_6_12(host_root, tmp_path):
    plan = plan_host_kernel(host_root, source=DEBIAN_SOURCE, work=tmp_path / "w")
    assert plan.series == "6.12"
    assert [(c.path.name, c.applies) for c in plan.patches] == [
        ("0001-hpet-read-share.patch", True),
        ("0002-pv-kick-ahead.patch", True),
        ("0003-acpi-dummy-wait.patch", True),
        ("0004-lab-pvspin.patch", True),
    ]


def fake_tools(bin_dir: Path, log: Path, grub_cfg: Path | None = None) -> None:
    bin_dir.mkdir()
    touch = f"echo changed >> {grub_cfg}\n" if grub_cfg else ""
    for name in ("make", "update-initramfs"):
        tool = bin_dir / name
        tool.write_text(f'#!/bin/sh\necho {name} "$@" >> {log}\n' + (touch if name == "update-initramfs" else ""))
        tool.chmod(0o755)


def recorded_chroot(bin_dir: Path, log: Path, monkeypatch) -> None:
    """chroot recorded, not run, with the directory it was given as a path (it is given DIR's descriptor,
    /proc/self/fd/N, which readlink follows in the child), and the chroot's mounts recorded, not made: the real ones
    need root and a private mount namespace (tests/test_chroot_mounts.py makes them there)."""
    tool = bin_dir / "chroot"
    tool.write_text(f'#!/bin/sh\nwhere=$(readlink -f "$1"); shift\necho chroot "$where" "$@" >> {log}\n')
    tool.chmod(0o755)

    @contextlib.contextmanager
    def mounts(root, say, warn, mounts=chrootmounts.CHROOT_MOUNTS):
        chrootmounts.check_mount_points(root, mounts)
        with log.open("a") as out:
            out.writelines(f"mount {m.source} on {root / m.point}\n" for m in mounts)
        fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            yield chrootmounts.ChrootMounts(root, fd)
        finally:
            os.close(fd)
            with log.open("a") as out:
                out.writelines(f"umount {root / m.point}\n" for m in reversed(mounts))

    monkeypatch.setattr(chrootmounts, "chroot_mounts", mounts)


def fake_system_tools(tmp_path: Path, monkeypatch) -> Path:
    """fake_tools and recorded_chroot, first on PATH; the log of every call."""
    log = tmp_path / "argv.log"
    fake_tools(tmp_path / "bin", log)
    recorded_chroot(tmp_path / "bin", log, monkeypatch)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    return log


def fake_tree(tmp_path: Path) -> Path:
    tree = tmp_path / "tree"
    (tree / "arch/x86/boot").mkdir(parents=True)
    (tree / "scripts").mkdir()
    (tree / "Makefile").write_text("VERSION = 6\nPATCHLEVEL = 12\nSUBLEVEL = 5\n")
    (tree / "arch/x86/boot/bzImage").write_bytes(b"kernel")
    (tree / "System.map").write_text("map")
    (tree / ".config").write_text("CONFIG_64BIT=y\n")
    return tree


def test_install_into_a_fake_root_leaves_the_default_boot_entry(host_root, tmp_path, monkeypatch, running):
    log = tmp_path / "argv.log"
    fake_tools(tmp_path / "bin", log)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    (host_root / "boot/grub").mkdir()
    (host_root / "boot/grub/grub.cfg").write_text("set default=0\n")
    plan = plan_host_kernel(host_root, source=fake_tree(tmp_path), work=tmp_path / "work")
    plan.build_steps = []  # compiling is the real make's job; here only the install steps run
    release = build_and_install(plan, host_root, say=lambda _: None)
    assert (host_root / f"boot/vmlinuz-{release}").read_bytes() == b"kernel"
    assert (host_root / f"boot/System.map-{release}").read_text() == "map"
    assert (host_root / "boot/grub/grub.cfg").read_text() == "set default=0\n"
    calls = log.read_text().splitlines()
    assert calls[0].endswith(f"modules_install INSTALL_MOD_PATH={host_root}")
    assert calls[1] == f"update-initramfs -c -k {release}"
    with pytest.raises(HostKernelError, match=rf"vmlinuz-{release}: exists already; ticklab never overwrites"):
        build_and_install(plan, host_root, say=lambda _: None)


def test_a_hook_that_changes_grub_cfg_is_an_error_naming_it(host_root, tmp_path, monkeypatch, running):
    (host_root / "boot/grub").mkdir()
    grub_cfg = host_root / "boot/grub/grub.cfg"
    grub_cfg.write_text("set default=0\n")
    fake_tools(tmp_path / "bin", tmp_path / "argv.log", grub_cfg=grub_cfg)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    plan = plan_host_kernel(host_root, source=fake_tree(tmp_path), work=tmp_path / "work")
    plan.build_steps = []
    with pytest.raises(HostKernelError, match=r"boot/grub/grub\.cfg: changed while installing"):
        build_and_install(plan, host_root, say=lambda _: None)


# issue 39, item 4: `kernel build --host` tells the truth first
CONFIG_OF_6_12_57 = (
    "CONFIG_64BIT=y\nCONFIG_HZ_1000=y\n# CONFIG_OLD_GONE is not set\nCONFIG_NEW_A=y\nCONFIG_NEW_B=m\n"
    'CONFIG_LOCALVERSION=""\nCONFIG_NEW_C="x"\nCONFIG_NEW_D=y\nCONFIG_NEW_E=y\nCONFIG_NEW_F=y\n'
    "CONFIG_NEW_A=y\n"
)
KCONFIG_OF_6_1 = {
    "init/Kconfig": 'config LOCALVERSION\n\tstring "Local version"\n\thelp\n\t  config NEW_A is in 6.12\n',
    "arch/x86/Kconfig": "config 64BIT\n\tbool\nchoice\n\tmenuconfig  HZ_1000 # the tick\n",
    "kernel/Kconfig.hz": "config OLD_GONE\n",
}


def test_an_older_source_is_said_first_with_what_olddefconfig_drops(host_root, tmp_path):
    """4e: a source older than the running kernel: one line before the plan naming the options set in the config that
    the source's Kconfig does not define (olddefconfig drops them)."""
    (host_root / "boot/config-6.12.57-ticklab").write_text(CONFIG_OF_6_12_57)
    fake_tarball(host_root / "usr/src/linux-source-6.1.tar.xz", (6, 1, 90), KCONFIG_OF_6_1)
    (host_root / "usr/src/linux-source-6.12.tar.xz").unlink()
    cache = tmp_path / "cache"
    done = run_cli(
        "kernel", "build", "--host", "--dry-run", "--root", str(host_root), env={"TICKLAB_CACHE": str(cache)}
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == (
        "ticklab kernel build: warning: the source is Linux 6.1.90, older than the running kernel 6.12.57-ticklab: "
        f"olddefconfig will drop 6 of the 9 options set in {host_root}/boot/config-6.12.57-ticklab, which Linux 6.1.90 "
        "does not know: CONFIG_NEW_A, CONFIG_NEW_B, CONFIG_NEW_C, CONFIG_NEW_D, CONFIG_NEW_E and 1 more\n"
    )
    assert done.stdout.startswith("base kernel: 6.12.57-ticklab\n") and "dry run: nothing built" in done.stdout
    assert not cache.exists()
    # a tree: its Kconfig files are read the same way; a config the source knows whole is said to lose nothing
    tree = tmp_path / "tree"
    for name, text in {"Makefile": "VERSION = 6\nPATCHLEVEL = 1\nSUBLEVEL = 90\n", **KCONFIG_OF_6_1}.items():
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_text(text)
    (tree / ".git").mkdir()
    (tree / ".git/Kconfig").write_text("config NEW_B\n")  # not the source's
    plan = plan_host_kernel(host_root, source=tree, work=tmp_path / "w")
    assert plan.warnings == [
        "the source is Linux 6.1.90, older than the running kernel 6.12.57-ticklab: olddefconfig will drop 6 of the 9 "
        f"options set in {host_root}/boot/config-6.12.57-ticklab, which Linux 6.1.90 does not know: CONFIG_NEW_A, "
        "CONFIG_NEW_B, CONFIG_NEW_C, CONFIG_NEW_D, CONFIG_NEW_E and 1 more"
    ]
    (tmp_path / "known.config").write_text("CONFIG_64BIT=y\nCONFIG_HZ_1000=y\n")
    plan = plan_host_kernel(host_root, source=tree, config=tmp_path / "known.config", work=tmp_path / "w")
    assert plan.warnings == [
        "the source is Linux 6.1.90, older than the running kernel 6.12.57-ticklab: olddefconfig "
        f"drops none of the 2 options set in {tmp_path}/known.config"
    ]


def test_a_source_as_new_as_the_running_kernel_warns_nothing(host_root, tmp_path, running):
    assert plan_host_kernel(host_root, work=tmp_path / "w").warnings == []  # 6.12.99 against 6.12.57
    (host_root / "proc/version").write_text(
        "Linux version 6.12.0-1-amd64 (debian-kernel@lists.debian.org) #1 SMP "
        "PREEMPT_DYNAMIC Debian 6.12.100-1 (2026-01-01)\n"
    )
    (host_root / "proc/sys/kernel/osrelease").write_text("6.12.0-1-amd64\n")
    (host_root / "boot/vmlinuz-6.12.0-1-amd64").write_bytes(b"kernel")
    (host_root / "boot/config-6.12.0-1-amd64").write_text("CONFIG_64BIT=y\n")
    # Debian's release names the ABI (6.12.0-1), /proc/version the upstream version the source is older than
    [warning] = plan_host_kernel(host_root, work=tmp_path / "w").warnings
    assert warning.startswith(
        "the source is Linux 6.12.99, older than the running kernel 6.12.0-1-amd64 "
        "(Linux 6.12.100): olddefconfig will drop 1 of the 1 options"
    )


@pytest.mark.parametrize(
    "boot, expected",
    [
        (None, "boot: no such directory, so /boot is not what boots this machine"),
        (
            {"vmlinuz-6.1.0-21-amd64": b"k", "config-6.12.57-ticklab": b"CONFIG_64BIT=y\n"},
            "boot: no vmlinuz-6.12.57-ticklab, the running kernel's image (has vmlinuz-6.1.0-21-amd64), "
            "so /boot is not what boots this machine",
        ),
    ],
)
def test_a_machine_that_does_not_boot_from_boot_is_refused_in_one_line(
    tmp_path, boot, expected, running, capsys, monkeypatch
):
    """4f: a VM whose kernel the VMM supplies (Firecracker): a kernel installed in /boot would never be booted. (The
    command in this process: the fake host stands for the running system.)"""
    root = make_fake_host(tmp_path / "root")
    fake_tarball(root / "usr/src/linux-source-6.12.tar.xz")
    (root / "proc/config.gz").write_bytes(gzip.compress(b"CONFIG_64BIT=y\n"))
    if boot is not None:
        (root / "boot").mkdir()
        for name, data in boot.items():
            (root / "boot" / name).write_bytes(data)
    before = tree_snapshot(root)
    monkeypatch.setenv("TICKLAB_CACHE", str(tmp_path / "c"))
    outcomes = []
    for argv in (["--dry-run"], []):
        code = cli.main(["kernel", "build", "--host", *argv, "--root", str(root)])
        outcomes.append((code, *capsys.readouterr()))
    for code, stdout, stderr in outcomes:
        assert (code, stdout) == (2, "")
        assert stderr == (
            f"ticklab kernel build: {root}/{expected} (its kernel is supplied from outside, as a "
            "Firecracker VM's by the VMM) and a kernel installed there would never be booted; "
            "refused\n"
        )
    assert tree_snapshot(root) == before and not (tmp_path / "c").exists()


# issue 39 item 1: a kernel for a system at rest (a disk image's mounted root), by the same code path
@pytest.fixture
def image_root(tmp_path):
    return debian_image_root(tmp_path)


def test_a_root_at_rest_builds_from_its_own_kernel_never_this_machines(image_root, tmp_path):
    source = fake_tree(tmp_path)
    plan = plan_host_kernel(image_root, source=source, work=tmp_path / "w")
    assert plan.running_release == "6.1.0-50-amd64" and plan.config_source == str(
        image_root / "boot/config-6.1.0-50-amd64"
    )
    assert plan.install_steps[-1] == ["chroot", str(image_root), "update-initramfs", "-c", "-k", plan.release]
    (image_root / "boot/vmlinuz-6.1.0-49-amd64").write_bytes(b"older")
    with pytest.raises(
        HostKernelError,
        match=r"boot: 2 kernel images \(6\.1\.0-49-amd64, 6\.1\.0-50-amd64\) in a "
        r"system that is not running here; name the one it boots with --release",
    ):
        plan_host_kernel(image_root, source=source, work=tmp_path / "w")
    assert (
        plan_host_kernel(image_root, source=source, work=tmp_path / "w", release="6.1.0-50-amd64").release
        == plan.release
    )


def test_localmodconfig_on_a_root_at_rest_takes_the_modules_recorded_at_its_boot(image_root, tmp_path):
    source = fake_tree(tmp_path)
    with pytest.raises(
        HostKernelError,
        match=r"image: not a running system, so it has no /proc/modules; "
        r"--localmodconfig needs --modules FILE",
    ):
        plan_host_kernel(image_root, source=source, localmodconfig=True, work=tmp_path / "w")
    recorded = tmp_path / "modules"
    recorded.write_text("virtio_net 65536 0 - Live 0x0\next4 1007616 1 - Live 0x0\n")
    plan = plan_host_kernel(image_root, source=source, localmodconfig=True, modules=recorded, work=tmp_path / "w")
    assert plan.module_count == 2 and plan.modules.splitlines()[0].startswith("virtio_net 65536")
    # other modules kept: another kernel, so another release name and another cached build
    recorded.write_text("virtio_net 65536 0 - Live 0x0\n")
    assert (
        plan_host_kernel(image_root, source=source, localmodconfig=True, modules=recorded, work=tmp_path / "w").release
        != plan.release
    )
    recorded.write_text("not a module list\n")
    with pytest.raises(HostKernelError, match=r"modules: not a /proc/modules list \('not a module list'\)"):
        plan_host_kernel(image_root, source=source, localmodconfig=True, modules=recorded, work=tmp_path / "w")


def test_installing_into_a_root_at_rest_mounts_for_its_chroot_and_unmounts_and_reuses_the_build(
    image_root, tmp_path, monkeypatch
):
    log = fake_system_tools(tmp_path, monkeypatch)
    plan = plan_host_kernel(image_root, source=fake_tree(tmp_path), work=tmp_path / "work")
    plan.build_steps = [["make", "-C", "tree", "bzImage"]]
    said = []
    release = build_and_install(plan, image_root, say=said.append)
    calls = log.read_text().splitlines()
    assert calls[0] == "make -C tree bzImage" and calls[1].endswith(f"modules_install INSTALL_MOD_PATH={image_root}")
    assert calls[2:] == [  # the chroot's mounts recorded (made for real in tests/test_chroot_mounts.py)
        f"mount proc on {image_root}/proc",
        f"mount sysfs on {image_root}/sys",
        f"mount /dev on {image_root}/dev",
        f"chroot {image_root} update-initramfs -c -k {release}",
        f"umount {image_root}/dev",
        f"umount {image_root}/sys",
        f"umount {image_root}/proc",
    ], calls
    assert f"chroot {image_root} update-initramfs" in (tmp_path / "work/build.log").read_text()  # the log shows DIR
    assert (image_root / f"boot/vmlinuz-{release}").read_bytes() == b"kernel"
    assert (image_root / "boot/grub/grub.cfg").read_text() == "set default=0\n"
    # beside its modules, what made the kernel: a capture on it records this (facts.kernel_build)
    record = json.loads((image_root / f"lib/modules/{release}/ticklab-build.json").read_text())
    log_text = lzma.decompress((image_root / f"lib/modules/{release}/ticklab-build.log.xz").read_bytes())
    assert record["release"] == release and record["built_by"] == "ticklab kernel build --host"
    assert record["config_sha256"] == hashlib.sha256((image_root / f"boot/config-{release}").read_bytes()).hexdigest()
    assert record["build_log_sha256"] == hashlib.sha256(log_text).hexdigest() and log_text
    assert record["patches"] == [
        {"name": c.path.name, "sha256": hashlib.sha256(c.path.read_bytes()).hexdigest()}
        for c in plan.patches
        if c.applies
    ]
    assert facts.kernel_build(image_root, release) == record
    # a second system (another copy of the image) gets the same build, not a second compile
    second = tmp_path / "second"
    shutil.copytree(image_root, second)
    (second / f"boot/vmlinuz-{release}").unlink()
    shutil.rmtree(second / f"lib/modules/{release}")
    log.write_text("")
    assert (
        build_and_install(
            plan_host_kernel(second, source=fake_tree(tmp_path / "t2"), work=tmp_path / "work"), second, say=said.append
        )
        == release
    )
    assert not any(line.startswith("make -C tree bzImage") for line in log.read_text().splitlines())
    assert any("built before" in line for line in said)


def test_a_mount_point_that_is_not_empty_is_refused_before_anything_is_mounted(image_root, tmp_path, monkeypatch):
    log = tmp_path / "argv.log"
    fake_tools(tmp_path / "bin", log)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    (image_root / "proc/left-behind").write_text("x")
    plan = plan_host_kernel(image_root, source=fake_tree(tmp_path), work=tmp_path / "work")
    plan.build_steps = []
    with pytest.raises(HostKernelError, match=r"image/proc: not an empty directory to mount proc on for the chroot"):
        build_and_install(plan, image_root, say=lambda _: None)
    assert not log.exists() or not any(line.startswith("mount") for line in log.read_text().splitlines())


def test_a_dev_holding_debootstraps_static_nodes_is_mounted_on_but_a_dev_symlink_is_refused(
    image_root, tmp_path, monkeypatch
):
    """A debootstrapped root at rest has /dev/null, /dev/console… in its /dev (the lab host image's had): the bind
    mount covers them for update-initramfs, as devtmpfs does at boot. A /dev that is a link is refused."""
    log = fake_system_tools(tmp_path, monkeypatch)
    (image_root / "dev").rename(tmp_path / "real-dev")
    (image_root / "dev").symlink_to(tmp_path / "real-dev")
    plan = plan_host_kernel(image_root, source=fake_tree(tmp_path), work=tmp_path / "work")
    plan.build_steps = []
    with pytest.raises(HostKernelError, match=r"image/dev: not a directory to mount dev on for the chroot"):
        build_and_install(plan, image_root, say=lambda _: None)
    assert not log.exists() or not any(line.startswith("mount") for line in log.read_text().splitlines())
    (image_root / "dev").unlink()
    (tmp_path / "real-dev").rename(image_root / "dev")
    (image_root / "dev/null").write_text("")
    build_and_install(plan, image_root, say=lambda _: None)
    mounts = [line for line in log.read_text().splitlines() if line.startswith("mount")]
    assert any(line.endswith(str(image_root / "dev")) for line in mounts), mounts


def test_an_interrupted_compile_resumes_and_a_build_cut_before_its_config_is_refused(image_root, tmp_path, monkeypatch):
    """A compile stopped half-way (Ctrl-C, a reboot) resumes with make, which is incremental; a tree cut before its
    config was made is refused, naming it."""
    log = tmp_path / "argv.log"
    fake_tools(tmp_path / "bin", log)
    (tmp_path / "bin/tar").write_text(f'#!/bin/sh\necho tar "$@" >> {log}\n')
    (tmp_path / "bin/tar").chmod(0o755)
    recorded_chroot(tmp_path / "bin", log, monkeypatch)
    (tmp_path / "bin/make").write_text(
        f'#!/bin/sh\necho make "$@" >> {log}\ncase "$*" in *bzImage*) [ -e {tmp_path}/compiled ] || exit 2;; esac\n'
    )
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    tarball = fake_tarball(tmp_path / "src/linux-source-6.12.tar.xz")
    plan = plan_host_kernel(image_root, source=tarball, work=tmp_path / "work")
    plan.build_steps = [step for step in plan.build_steps if step[0] in ("tar", "make")]
    (tmp_path / "work/linux").mkdir(parents=True)  # what tar extracted before the compile failed
    with pytest.raises(HostKernelError, match=r"work/linux: left by a build interrupted before its config was made"):
        build_and_install(plan, image_root, say=lambda _: None)
    (tmp_path / "work/linux").rmdir()
    with pytest.raises(HostKernelError, match=r"exited 2"):
        build_and_install(plan, image_root, say=lambda _: None)
    tree = tmp_path / "work/linux"
    (tree / "arch/x86/boot").mkdir(parents=True, exist_ok=True)
    (tree / "arch/x86/boot/bzImage").write_bytes(b"kernel")
    (tree / "System.map").write_text("map")
    (tree / ".config").write_text("CONFIG_64BIT=y\n")
    (tmp_path / "compiled").write_text("")
    log.write_text("")
    said = []
    release = build_and_install(plan, image_root, say=said.append)
    ran = log.read_text().splitlines()
    assert [line for line in ran if line.startswith("tar ") or "olddefconfig" in line] == []  # not prepared again
    assert any("bzImage" in line for line in ran) and any("resuming an interrupted compile" in line for line in said)
    assert (image_root / f"boot/vmlinuz-{release}").read_bytes() == b"kernel"


HZ1000 = Path(__file__).resolve().parents[1] / "kernel/fragments/hz1000.config"


def test_a_fragment_is_set_after_localmodconfig_names_the_release_and_is_checked_before_install(
    image_root, tmp_path, monkeypatch
):
    """nohz's HZ comparison needs a kernel per HZ (issue 39): --fragment sets options after the base config, the
    release says which fragment made it, and a built config that lost an option is never installed."""
    plain = plan_host_kernel(image_root, source=fake_tree(tmp_path / "a"), work=tmp_path / "w1")
    plan = plan_host_kernel(image_root, source=fake_tree(tmp_path / "b"), work=tmp_path / "w2", fragment=HZ1000)
    assert plan.localversion.startswith("-ticklab-hz1000-") and plan.release != plain.release
    config_steps = [step for step in plan.build_steps if step[0].endswith("scripts/config")]
    assert config_steps[-1][3:] == [
        "--enable",
        "HZ_1000",
        "--disable",
        "HZ_100",
        "--disable",
        "HZ_250",
        "--disable",
        "HZ_300",
        "--set-val",
        "HZ",
        "1000",
    ]
    olddefconfig = next(i for i, step in enumerate(plan.build_steps) if step[-1] == "olddefconfig")
    assert plan.build_steps.index(config_steps[-1]) == olddefconfig - 1
    assert "fragment: " + str(HZ1000) in plan.describe()

    fake_system_tools(tmp_path, monkeypatch)
    plan.build_steps = []  # the fake tree's .config is what "olddefconfig" left: HZ 250
    (tmp_path / "b/tree/.config").write_text("CONFIG_64BIT=y\nCONFIG_HZ_250=y\nCONFIG_HZ=250\n")
    with pytest.raises(
        HostKernelError,
        match=r"hz1000\.config: the built config does not hold CONFIG_HZ_1000=y "
        r"\(it has it unset\); CONFIG_HZ_250=n \(it has CONFIG_HZ_250=y\); "
        r"CONFIG_HZ=1000 \(it has CONFIG_HZ=250\); nothing installed",
    ):
        build_and_install(plan, image_root, say=lambda _: None)
    assert not (image_root / f"boot/vmlinuz-{plan.release}").exists()
    (tmp_path / "b/tree/.config").write_text(
        "CONFIG_64BIT=y\nCONFIG_HZ_1000=y\n# CONFIG_HZ_250 is not set\nCONFIG_HZ=1000\n"
    )
    assert build_and_install(plan, image_root, say=lambda _: None) == plan.release
    record = facts.kernel_build(image_root, plan.release)
    assert record["fragment"] == {
        "name": "hz1000.config",
        "options": {
            "CONFIG_HZ_1000": "y",
            "CONFIG_HZ_100": "n",
            "CONFIG_HZ_250": "n",
            "CONFIG_HZ_300": "n",
            "CONFIG_HZ": "1000",
        },
    }


@pytest.mark.parametrize(
    "text, problem",
    [
        ("CONFIG_HZ=1000\nHZ_250=y\n", r"bad\.config:2: not CONFIG_X=value or '# CONFIG_X is not set': 'HZ_250=y'"),
        ("# only a comment\n", r"bad\.config: sets no option"),
        ("CONFIG_X=$(shell id)\n", r"bad\.config:1: not CONFIG_X=value"),
    ],
)
def test_a_fragment_that_is_not_config_lines_is_refused_naming_the_line(image_root, tmp_path, text, problem):
    fragment = tmp_path / "bad.config"
    fragment.write_text(text)
    with pytest.raises(HostKernelError, match=problem):
        plan_host_kernel(image_root, source=fake_tree(tmp_path), work=tmp_path / "w", fragment=fragment)
