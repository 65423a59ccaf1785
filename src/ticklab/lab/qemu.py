"""Booting a lab kernel and the guest image under QEMU: the command line, the accelerator, the timeout.

KVM is used only when a test guest really boots with it (a /dev/kvm that exists is not enough: on
some hosts guests hang or fail under it); otherwise TCG, software emulation, which is slower but
has a real emulated HPET and runs our kernel and tracing unchanged. The probe's answer is cached
per host boot and QEMU version. QEMU is started by ``capture.process.spawn``: in its own session, killed with
anything it started when its time is up or the caller is interrupted, and killed by the kernel when ticklab dies
(PR_SET_PDEATHSIG; a ``kill -9`` included), so no QEMU process outlives a boot.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..capture.process import spawn, wait_or_kill
from ..host import facts
from ..paths import cache_dir
from ..registry import accel_choices
from .cache import LabError

QEMU = "qemu-system-x86_64"
SHARE_TAG = "ticklab"
BASE_CMDLINE = ["console=ttyS0", "panic=-1", "rdinit=/init"]
KVM_PROBE_TIMEOUT_S = 30  # a lab guest boots in about 4 s under TCG


@dataclass
class Boot:
    kernel: Path
    initrd: Path
    share: Path
    console: Path
    cmdline: list[str] = field(default_factory=list)
    accel: str = "tcg"
    smp: int = 2
    memory_mb: int = 1024
    timeout_s: float = 600
    pin_vcpus: bool = False  # each vCPU thread on its own host CPU, where the host has one for each

    def full_cmdline(self) -> str:
        return " ".join([*BASE_CMDLINE, *self.cmdline])

    def argv(self) -> list[str]:
        for path in (self.kernel, self.initrd, self.share, self.console):
            if "," in str(path):
                raise LabError(f"{path}: QEMU options cannot take a path with a comma")
        # debug-threads names each vCPU thread "CPU <n>/TCG" (or /KVM), which is how pin_vcpus finds them
        return [
            QEMU,
            "-name",
            "ticklab,debug-threads=on",
            "-nodefaults",
            "-no-user-config",
            "-display",
            "none",
            "-no-reboot",
            "-monitor",
            "none",
            "-machine",
            "pc",
            "-accel",
            self.accel,
            "-cpu",
            "host" if self.accel == "kvm" else "max",
            "-smp",
            str(self.smp),
            "-m",
            f"{self.memory_mb}M",
            "-kernel",
            str(self.kernel),
            "-initrd",
            str(self.initrd),
            "-append",
            self.full_cmdline(),
            "-serial",
            f"file:{self.console}",
            "-virtfs",
            f"local,path={self.share},mount_tag={SHARE_TAG},security_model=none,id=share",
        ]


def qemu_version() -> str | None:
    if shutil.which(QEMU) is None:
        return None
    result = subprocess.run([QEMU, "--version"], capture_output=True, text=True, check=False)
    return result.stdout.splitlines()[0] if result.stdout else None


def require_qemu() -> str:
    version = qemu_version()
    if version is None:
        raise LabError(f"{QEMU} is not installed: apt-get install qemu-system-x86")
    return version


def run_boot(boot: Boot) -> dict:
    """Boot once and wait for the guest to power off; {status: ok|timeout|failed, exit, seconds}."""
    started = time.monotonic()
    with (boot.console.with_suffix(".qemu.txt")).open("w") as qemu_log:
        process = spawn(boot.argv(), label="qemu", stdin=subprocess.DEVNULL, stdout=qemu_log, stderr=subprocess.STDOUT)
        try:
            pinning = pin_vcpu_threads(process, boot.smp) if boot.pin_vcpus else None
        except BaseException:  # interrupted while pinning: no QEMU outlives its boot
            wait_or_kill(process, 0)
            raise
        status = wait_or_kill(process, max(1.0, boot.timeout_s - (time.monotonic() - started)))
    outcome = {
        "status": status,
        "exit": process.returncode,
        "seconds": round(time.monotonic() - started, 2),
        "accel": boot.accel,
        "smp": boot.smp,
        "memory_mb": boot.memory_mb,
        "cmdline": boot.full_cmdline(),
    }
    return {**outcome, "vcpu_pinning": pinning} if pinning is not None else outcome


ONE_THREAD = -1  # vcpu_threads' key for single-threaded TCG's 'ALL CPUs/TCG' thread


def vcpu_threads(pid: int) -> dict[int, int]:
    """QEMU's vCPU threads: {vCPU index: thread id}, from the names debug-threads gives them ('CPU 1/TCG')."""
    found = {}
    for task in Path(f"/proc/{pid}/task").glob("[0-9]*"):
        try:
            name = (task / "comm").read_text().strip()
        except OSError:
            continue
        words = name.split()
        if len(words) == 2 and words[0] == "CPU" and words[1].split("/")[0].isdigit():
            found[int(words[1].split("/")[0])] = int(task.name)
        elif name.startswith("ALL CPUs/"):
            found[ONE_THREAD] = int(task.name)
    return found


def pin_vcpu_threads(process: subprocess.Popen, smp: int, wait_s: float = 10.0) -> dict:
    """Pin vCPU n's thread to the n-th CPU this process may use, when there is one for each vCPU; what was pinned
    (vCPU -> host CPU) or why nothing was. QEMU's own process, not a host setting: it ends with the boot."""
    host_cpus = sorted(os.sched_getaffinity(0))
    if len(host_cpus) < smp:
        return {"pinned": {}, "why_not": f"{smp} vCPUs on {len(host_cpus)} host CPUs: not one each"}
    deadline = time.monotonic() + wait_s
    threads = vcpu_threads(process.pid)
    # QEMU starts its vCPU threads before the guest runs; one that exits (or runs every vCPU in one thread,
    # 'ALL CPUs/TCG') stops the wait
    while len(threads) < smp and time.monotonic() < deadline and process.poll() is None:
        if ONE_THREAD in threads:
            return {"pinned": {}, "why_not": "QEMU runs every vCPU in one thread (single-threaded TCG)"}
        time.sleep(0.02)
        threads = vcpu_threads(process.pid)
    threads.pop(ONE_THREAD, None)
    pinned = {}
    for index, tid in sorted(threads.items()):
        try:
            os.sched_setaffinity(tid, {host_cpus[index]})
            pinned[str(index)] = host_cpus[index]
        except (OSError, IndexError):
            continue
    why = None if len(pinned) == smp else f"found {len(threads)} of {smp} vCPU threads, pinned {len(pinned)}"
    return {"pinned": pinned, **({"why_not": why} if why else {})}


def cached_kvm_probe() -> tuple[bool, str] | None:
    """The KVM probe's answer for this host boot and QEMU version, if a probe ran; else None."""
    version = qemu_version()
    try:
        cached = json.loads((cache_dir() / "kvm-probe.json").read_text())
        if version and cached.get("identity") == {"boot_id": facts.boot_id(), "qemu": version}:
            return cached["ok"], cached["why"]
    except (OSError, ValueError, KeyError):
        pass
    return None


def kvm_device_usable() -> bool:
    return os.access("/dev/kvm", os.R_OK | os.W_OK)


def probe_kvm(kernel: Path, initrd: Path, say=print) -> tuple[bool, str]:
    """Does a test guest boot under KVM here? (answer, reason); cached per host boot and QEMU version.
    Says so before booting the test guest, which can take up to KVM_PROBE_TIMEOUT_S."""
    if not kvm_device_usable():
        return False, "/dev/kvm is missing or not accessible"
    version = require_qemu()
    cache = cache_dir() / "kvm-probe.json"
    identity = {"boot_id": facts.boot_id(), "qemu": version}
    cached = cached_kvm_probe()
    if cached is not None:
        return cached
    say(
        f"probing KVM: booting a test guest under it (up to {KVM_PROBE_TIMEOUT_S} s; the answer is kept until the host reboots)"
    )
    with tempfile.TemporaryDirectory(prefix="ticklab-kvm-probe-") as share:
        share = Path(share)
        boot = Boot(
            kernel,
            initrd,
            share,
            share / "console.log",
            accel="kvm",
            smp=1,
            memory_mb=512,
            timeout_s=KVM_PROBE_TIMEOUT_S,
        )
        outcome = run_boot(boot)
        booted = (share / "booted").is_file()
        tail = (share / "console.qemu.txt").read_text()[-200:].strip()
    if booted:
        ok, why = True, f"a test guest booted under KVM in {outcome['seconds']:.0f} s"
    else:
        ok, why = (
            False,
            (
                f"a test guest did not boot under KVM ({outcome['status']}, exit {outcome['exit']}"
                f"{': ' + tail if tail else ''}); using TCG"
            ),
        )
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps({"identity": identity, "ok": ok, "why": why}, indent=2) + "\n")
    return ok, why


def choose_accelerator(preference: str, kernel: Path, initrd: Path, say=print) -> tuple[str, str]:
    """(accelerator, why) for ``--accel auto|kvm|tcg``; says what the KVM probe found."""
    if preference not in accel_choices():
        raise LabError(f"--accel {preference!r}: choose one of {', '.join(accel_choices())}")
    if preference == "tcg":
        return "tcg", "TCG requested"
    ok, why = probe_kvm(kernel, initrd, say)
    if ok:
        say(f"KVM usable: {why}")
        return "kvm", why
    if preference == "kvm":
        raise LabError(f"--accel kvm: {why}")
    reason = " ".join(why.split()).removesuffix("; using TCG")
    say(f"KVM not usable: {reason}; falling back to TCG (software emulation: slower, but runs the same kernel)")
    return "tcg", why
