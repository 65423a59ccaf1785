"""No process the lab starts outlives ticklab (issue 27): a ``kill -9`` of ``ticklab lab run`` or ``lab build-kernel``
must not leave a QEMU guest (TCG: a whole host CPU, until its own timeout) or a kernel build (6-18 minutes of
``make``) running. Both are started through ``capture.process.spawn`` (PR_SET_PDEATHSIG). Stand-ins replace QEMU
and make: a shell that writes its pid and execs ``sleep``; no kernel is built and no guest boots. Every wait is on
a file or a process, bounded only so that a broken test cannot hang."""

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from conftest import REPO, WAIT_BOUND_S, gone, wait_for
from ticklab.capture.process import spawn
from ticklab.lab import qemu

# run_boot as `ticklab lab run` calls it, QEMU being whatever qemu-system-x86_64 PATH finds first
BOOT = """import sys
from pathlib import Path
from ticklab.lab import qemu
share = Path(sys.argv[1])
qemu.run_boot(qemu.Boot(share / "bzImage", share / "initrd", share, share / "console.log", timeout_s=3600))
"""

# the kernel build's make, as build_kernel calls it; make is the stand-in (its arguments: -j2 bzImage)
BUILD = """import sys
from pathlib import Path
from ticklab.lab import kernel
with open(Path(sys.argv[1]) / "build.log", "w") as log:
    kernel._compile([sys.argv[2]], 2, log, False, "fake")
"""


def stand_in(path: Path, pid_file: Path, grandchild: Path | None = None) -> Path:
    """An executable that writes its pid (atomically) and sleeps in the same process; with ``grandchild``, it first
    starts a sleep of its own (in its process group, as make's compilers are) and writes that pid there."""
    start = f'sleep 3600 & echo $! > "{grandchild}.tmp" && mv "{grandchild}.tmp" "{grandchild}"\n' if grandchild else ""
    path.write_text(
        f'#!/bin/sh\n{start}echo $$ > "{pid_file}.tmp" && mv "{pid_file}.tmp" "{pid_file}"\nexec sleep 3600\n'
    )
    path.chmod(0o755)
    return path


def start(code: str, *args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO,
        env={**os.environ, **(env or {})},
    )


def running_pid(pid_file: Path, process: subprocess.Popen) -> int:
    wait_for(pid_file.is_file, f"{pid_file.name} never written", process)
    return int(pid_file.read_text())


def assert_dies(pids: list[int], what: str) -> None:
    try:
        wait_for(lambda: all(gone(pid) for pid in pids), what)
    finally:
        for pid in pids:  # a failed test leaves nothing running
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
def test_a_killed_lab_run_takes_its_qemu_with_it(tmp_path):
    """kill -9 of the process in run_boot: QEMU (here a stand-in) dies with it instead of running to its timeout."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stand_in(bin_dir / qemu.QEMU, tmp_path / "qemu.pid")
    process = start(BOOT, str(tmp_path), env={"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"})
    guest = running_pid(tmp_path / "qemu.pid", process)
    process.kill()
    process.communicate(timeout=WAIT_BOUND_S)
    assert_dies([guest], f"QEMU stand-in (pid {guest}) still running after its lab run was killed")


def test_a_killed_kernel_build_takes_its_make_with_it(tmp_path):
    """kill -9 of the process running the kernel build: make (here a stand-in) dies with it."""
    make = stand_in(tmp_path / "make", tmp_path / "make.pid")
    process = start(BUILD, str(tmp_path), str(make), env={"TICKLAB_CACHE": str(tmp_path / "cache")})
    build = running_pid(tmp_path / "make.pid", process)
    process.kill()
    process.communicate(timeout=WAIT_BOUND_S)
    assert_dies([build], f"make stand-in (pid {build}) still running after its kernel build was killed")


@pytest.mark.skipif(not Path("/usr/bin/make").exists(), reason="GNU make not installed")
def test_a_killed_kernel_build_takes_makes_sub_makes_and_their_recipes_with_it(tmp_path):
    """A real GNU make whose recipe runs a sub-make whose recipe is a long compile (a sleep): the death signal
    reaches only the top make, which must pass it on (SIGTERM: make forwards it to its children; a SIGKILL would
    leave the sub-make and its compile running)."""
    (tmp_path / "sub.mk").write_text(
        f'all:\n\techo $$$$ > "{tmp_path}/cc.pid.tmp" && mv "{tmp_path}/cc.pid.tmp" '
        f'"{tmp_path}/cc.pid" && exec sleep 3600\n'
    )
    (tmp_path / "Makefile").write_text(f'all:\n\t$(MAKE) -f "{tmp_path}/sub.mk"\n')
    make = tmp_path / "make"
    make.write_text(f'#!/bin/sh\nexec /usr/bin/make -C "{tmp_path}"\n')
    make.chmod(0o755)
    process = start(BUILD, str(tmp_path), str(make), env={"TICKLAB_CACHE": str(tmp_path / "cache")})
    compile_pid = running_pid(tmp_path / "cc.pid", process)
    process.kill()
    process.communicate(timeout=WAIT_BOUND_S)
    assert_dies(
        [compile_pid], f"a sub-make's recipe (pid {compile_pid}) still running after its kernel build was killed"
    )


def test_an_interrupted_kernel_build_kills_makes_whole_process_group(tmp_path):
    """Ctrl-C of the kernel build: make and what it started (its process group) are killed, as before spawn."""
    make = stand_in(tmp_path / "make", tmp_path / "make.pid", grandchild=tmp_path / "cc.pid")
    process = start(BUILD, str(tmp_path), str(make), env={"TICKLAB_CACHE": str(tmp_path / "cache")})
    build = running_pid(tmp_path / "make.pid", process)
    compiler = running_pid(tmp_path / "cc.pid", process)
    process.send_signal(signal.SIGINT)
    output = process.communicate(timeout=WAIT_BOUND_S)[0]
    assert "KeyboardInterrupt" in output
    assert_dies([build, compiler], "make's process group still running after an interrupted build")


def test_spawn_refuses_a_thread_other_than_the_main_one(tmp_path):
    """The death signal fires when the *thread* that forked the child ends: a child spawned from a helper thread
    would be killed when that thread ends, so spawn refuses there; run_boot and the kernel build are called only from
    the main thread."""
    raised = []

    def in_thread():
        try:
            spawn(["true"])
        except RuntimeError as exc:
            raised.append(str(exc))

    thread = threading.Thread(target=in_thread)
    thread.start()
    thread.join()
    assert raised and "main thread" in raised[0]
    process = spawn(["true"])
    assert process.wait() == 0


# a host kernel build step as `ticklab kernel build --host` runs it
HOST_BUILD_STEP = """import sys
from pathlib import Path
from ticklab.capture import hostkernel
with open(Path(sys.argv[1]) / "build.log", "w") as log:
    hostkernel._step([sys.argv[2]], log, dies_with_ticklab=True)
"""


def test_a_killed_host_kernel_build_takes_its_whole_build_with_it(tmp_path):
    """`ticklab kernel build --host` ran its compile with subprocess.run: after a kill -9 of ticklab the build (and
    what it started) went on. Now a build step dies whole with it."""
    make = stand_in(tmp_path / "make", tmp_path / "make.pid", grandchild=tmp_path / "cc.pid")
    process = start(HOST_BUILD_STEP, str(tmp_path), str(make))
    build = running_pid(tmp_path / "make.pid", process)
    compiler = running_pid(tmp_path / "cc.pid", process)
    process.kill()
    process.communicate(timeout=WAIT_BOUND_S)
    assert_dies([build, compiler], "a host kernel build step still running after ticklab was killed")


def test_a_host_kernel_build_step_that_fails_names_its_exit_status(tmp_path):
    from ticklab.capture.hostkernel import HostKernelError, _step

    failing = tmp_path / "fail"
    failing.write_text("#!/bin/sh\necho compiling\nexit 3\n")
    failing.chmod(0o755)
    with (
        open(tmp_path / "build.log", "w") as log,
        pytest.raises(HostKernelError, match=r"build.log: '.*fail' exited 3$"),
    ):
        _step([str(failing)], log, dies_with_ticklab=True)
    assert "compiling" in (tmp_path / "build.log").read_text()
