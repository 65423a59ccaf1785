"""`kernel build --host --root DIR`'s chroot mounts against the owner of DIR (issue 55 item 5): made for real, in a
private mount namespace (``unshare -m``, so nothing reaches the host's mounts), with a link or directory swapped in
at the window between a mount point's check and the mount, a link re-pointed or another mount put in place before
the unmount; and a file planted at DIR/proc/sys/kernel/osrelease, which must not make DIR the running system."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import debian_image_root
from ticklab.capture import hostkernel

REPO = Path(__file__).resolve().parents[1]


def _private_mounts_missing() -> str | None:
    if os.geteuid() != 0:
        return "needs root: the chroot's mounts are made for real (in a private mount namespace)"
    try:
        probe = subprocess.run(["unshare", "-m", "--propagation", "private", "true"], capture_output=True, text=True)
    except FileNotFoundError:
        return "needs unshare (util-linux) for a private mount namespace"
    if probe.returncode != 0:
        return f"cannot make a private mount namespace here (unshare -m: {probe.stderr.strip()[:120]})"
    return None


needs_private_mounts = pytest.mark.skipif(_private_mounts_missing() is not None, reason=str(_private_mounts_missing()))


def image(tmp_path: Path) -> Path:
    """A Debian root as a disk image holds it (conftest.debian_image_root), and a built kernel tree beside it."""
    root = debian_image_root(tmp_path)
    tree = tmp_path / "tree"
    (tree / "arch/x86/boot").mkdir(parents=True)
    (tree / "Makefile").write_text("VERSION = 6\nPATCHLEVEL = 12\nSUBLEVEL = 5\n")
    (tree / "arch/x86/boot/bzImage").write_bytes(b"kernel")
    (tree / "System.map").write_text("map")
    (tree / ".config").write_text("CONFIG_64BIT=y\n")
    return root


def tools(tmp_path: Path, attack: str = "") -> Path:
    """make and update-initramfs recorded, not run; chroot recorded with the filesystem each mount point has as the
    chroot sees it (through the descriptor it is given), then ``attack``, a shell line run in the chroot step's
    window with $W the chroot's directory (what the owner of DIR does meanwhile, as root of their own namespace)."""
    bin_dir, log = tmp_path / "bin", tmp_path / "argv.log"
    bin_dir.mkdir()
    for name in ("make", "update-initramfs"):
        (bin_dir / name).write_text(f'#!/bin/sh\necho {name} "$@" >> {log}\n')
    (bin_dir / "chroot").write_text(
        "#!/bin/sh\n"
        'where="$1"; shift; W=$(readlink -f "$where")\n'
        f'echo chroot "$W" "$@" proc=$(stat -f -c %T "$where/proc") sys=$(stat -f -c %T "$where/sys") '
        f'dev=$(stat -f -c %T "$where/dev") >> {log}\n'
        f"{attack}\n"
    )
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    return log


CHILD = """
import json, os, subprocess, sys
from pathlib import Path
from ticklab.capture.hostkernel import HostKernelError, build_and_install, plan_host_kernel
try:
    from ticklab.host import chrootmounts
except ImportError:  # the code before issue 55 item 5, to show what these tests find there
    chrootmounts = type(sys)("chrootmounts")
tmp = Path(sys.argv[1]); root = tmp / "image"; said = []; error = None
os.environ["PATH"] = f"{tmp / 'bin'}:{os.environ['PATH']}"
def mounts_below():
    with open("/proc/self/mountinfo") as info:
        return sorted(line.split()[4] for line in info if line.split()[4].startswith(str(tmp)))
# SETUP
plan = plan_host_kernel(root, source=tmp / "tree", work=tmp / "work")
plan.build_steps = []
try:
    build_and_install(plan, root, say=said.append)
except HostKernelError as exc:
    error = str(exc)
result = {"said": said, "error": error, "mounts": mounts_below()}
# AFTER
print(json.dumps(result))
"""


def in_private_mounts(tmp_path: Path, setup: str = "", after: str = "") -> dict:
    """CHILD run as root in a mount namespace of its own (private: nothing it mounts reaches the host); its result."""
    script = CHILD.replace("# SETUP", textwrap.dedent(setup)).replace("# AFTER", textwrap.dedent(after))
    done = subprocess.run(
        ["unshare", "-m", "--propagation", "private", sys.executable, "-c", script, str(tmp_path)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


@needs_private_mounts
def test_the_chroot_step_has_proc_sys_and_dev_mounted_and_nothing_is_left(tmp_path):
    root = image(tmp_path)
    log = tools(tmp_path)
    result = in_private_mounts(
        tmp_path,
        after="""
        real = tmp / "real"; (real / "proc").mkdir(parents=True)
        subprocess.run(["mount", "-t", "proc", "proc", str(real / "proc")], check=True)
        from ticklab.capture.hostkernel import is_live
        result["live"] = [is_live(Path("/")), is_live(root), is_live(real)]
        """,
    )
    dev = subprocess.run(["stat", "-f", "-c", "%T", "/dev"], capture_output=True, text=True).stdout.strip()
    [chroot] = [line for line in log.read_text().splitlines() if line.startswith("chroot")]
    assert chroot.startswith(f"chroot {root} update-initramfs -c -k 6.12.5-ticklab-")  # entered by DIR's descriptor
    assert chroot.endswith(f" proc=proc sys=sysfs dev={dev}")
    assert result["error"] is None and result["mounts"] == []  # nothing left in DIR
    assert result["live"] == [True, False, True]  # "/" and a real procfs make a running system; DIR at rest does not
    build_log = (tmp_path / "work/build.log").read_text()
    for point in ("proc", "sys", "dev"):
        assert f" on {root}/{point} (mount id " in build_log and f"$ umount {root}/{point} (mount id " in build_log


@needs_private_mounts
@pytest.mark.parametrize("planted", ["a link", "another directory"])
def test_a_mount_point_swapped_after_its_check_is_refused_and_nothing_is_mounted_outside(tmp_path, planted):
    """The window of the finding: DIR/sys checked, then renamed away and replaced, by a link to a host directory or by
    a directory of the owner's, before the mount. The mount goes on the directory checked, the name is then found
    not to lead to it: refused in one line, ticklab's mounts taken down, nothing mounted on the victim."""
    root = image(tmp_path)
    log = tools(tmp_path)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_text("host file\n")
    replace = f"target.symlink_to({str(victim)!r})" if planted == "a link" else "target.mkdir()"
    result = in_private_mounts(
        tmp_path,
        setup=f"""
        def swap(target):
            if target.name == "sys":
                target.rename(target.with_name("sys.away"))
                {replace}
        chrootmounts.between_check_and_mount = swap
        """,
    )
    assert result["error"] == (
        f"{root}/sys: changed while it was being mounted on ("
        + ("a symbolic link or not a directory now" if planted == "a link" else "it is not the directory checked")
        + "); refused, ticklab's mount taken down"
    )
    assert result["mounts"] == []  # nothing mounted anywhere below the test's directory, the victim included
    assert sorted(p.name for p in victim.iterdir()) == ["keep"]
    assert not any(line.startswith("chroot") for line in log.read_text().splitlines())  # the chroot never ran


@needs_private_mounts
def test_a_link_re_pointed_before_the_unmount_does_not_unmount_another_mount(tmp_path):
    """The owner of DIR, from a namespace of their own, moves ticklab's sys mount point away and puts a link to
    another mount in its place during the chroot step: ticklab unmounts its own mount, through its descriptor, and the
    other mount stays."""
    root = image(tmp_path)
    tools(
        tmp_path,
        attack='unshare -m --propagation private sh -c "umount -l $W/sys && mv $W/sys $W/sys.away && '
        f'ln -s {tmp_path}/victim $W/sys"',
    )
    (tmp_path / "victim").mkdir()
    result = in_private_mounts(
        tmp_path, setup='subprocess.run(["mount", "-t", "tmpfs", "victim", str(tmp / "victim")], check=True)'
    )
    assert result["error"] is None and result["said"][-1].startswith("installing")  # no line about a mount
    assert result["mounts"] == [str(tmp_path / "victim")]  # the other mount stays; ticklab's are all gone
    assert (root / "sys").is_symlink() and (root / "sys.away").is_dir()


@needs_private_mounts
def test_a_mount_that_is_no_longer_ticklabs_is_not_unmounted(tmp_path):
    """ticklab's mount on DIR/sys taken down during the chroot step and another put there: at the end that mount id is
    not ticklab's, so nothing is unmounted there, in one line; the others are unmounted."""
    root = image(tmp_path)
    tools(tmp_path, attack='umount -l "$W/sys" && mount -t tmpfs other "$W/sys"')
    result = in_private_mounts(tmp_path)
    assert result["error"] is None and result["mounts"] == [str(root / "sys")]
    [line] = [line for line in result["said"] if "left as it is" in line]
    assert line.startswith(f"{root}/sys: left as it is: ticklab's mount there (id ")
    assert line.endswith("is no longer attached, so what is there now is not ticklab's; nothing unmounted")


def test_a_file_at_proc_sys_kernel_osrelease_does_not_make_dir_the_running_system(tmp_path):
    """A regular file planted at DIR/proc/sys/kernel/osrelease: DIR is still a system at rest. The dry run plans its
    own update-initramfs in a chroot (never the host's), from its own kernel (not the release the file names)."""
    root = image(tmp_path)
    (root / "proc/sys/kernel").mkdir(parents=True)
    (root / "proc/sys/kernel/osrelease").write_text("6.18.44-fc-v857\n")
    (root / "proc/modules").write_text("evil 4096 0 - Live 0x0\n")
    assert not hostkernel.is_live(root) and hostkernel.is_live(Path("/"))
    done = subprocess.run(
        [sys.executable, "-m", "ticklab.cli", "kernel", "build", "--host", "--dry-run", "--root", str(root),
         "--source", str(tmp_path / "tree")],
        capture_output=True, text=True, env={**os.environ, "TICKLAB_CACHE": str(tmp_path / "cache")}, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "base kernel: 6.1.0-50-amd64"
    assert any(line.startswith(f"  chroot {root} update-initramfs -c -k 6.12.5-ticklab-") for line in lines)
    assert not any(line.lstrip().startswith("update-initramfs") for line in lines)
    assert (
        f"    (for it only: proc mounted on {root}/proc, sysfs mounted on {root}/sys, /dev mounted on {root}/dev"
        in (done.stdout)
    )
    # nor do its /proc files stand for the running kernel's modules
    denied = subprocess.run(
        [sys.executable, "-m", "ticklab.cli", "kernel", "build", "--host", "--dry-run", "--root", str(root),
         "--source", str(tmp_path / "tree"), "--localmodconfig"],
        capture_output=True, text=True, env={**os.environ, "TICKLAB_CACHE": str(tmp_path / "cache")}, timeout=300,
    )  # fmt: skip
    assert (denied.returncode, denied.stdout) == (2, "")
    assert denied.stderr == (
        f"ticklab kernel build: {root}: not a running system, so it has no /proc/modules; --localmodconfig needs "
        "--modules FILE, the /proc/modules recorded at a boot of it\n"
    )
