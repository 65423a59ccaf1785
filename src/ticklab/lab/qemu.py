"""Booting a lab kernel and the guest image under QEMU: the command line, the accelerator, the timeout.

KVM is used only when a test guest really boots with it (a /dev/kvm that exists is not enough: on
some hosts guests hang or fail under it); otherwise TCG, software emulation, which is slower but
has a real emulated HPET and runs our kernel and tracing unchanged. The probe's answer is cached
per host boot and QEMU version. QEMU is started by ``capture.process.spawn``: in its own session, killed with
anything it started when its time is up or the caller is interrupted, and killed by the kernel when ticklab dies
(PR_SET_PDEATHSIG; a ``kill -9`` included), so no QEMU process outlives a boot.

Extra ACPI tables (a lab experiment's ``lab.acpi_tables``: ASL sources in the checkout, e.g. acpi-idle's SSDT with
I/O-port C-states) are compiled here with iasl (Debian's acpica-tools) into the cache, keyed by the source's sha256
and the compiler's version, and handed to QEMU with ``-acpitable file=``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..capture.process import spawn, wait_or_kill
from ..host import facts
from ..paths import cache_dir, repo_root
from ..registry import KVM, TCG, accel_choices, accelerator
from ..safefiles import OwnedDir, UnsafeFileError, read_bytes
from .cache import LabError, content_key

QEMU = "qemu-system-x86_64"
SHARE_TAG = "ticklab"
BASE_CMDLINE = ["console=ttyS0", "panic=-1", "rdinit=/init"]
KVM_PROBE_TIMEOUT_S = 30  # a lab guest boots in about 4 s under TCG


def machine_argv(
    accel: str, smp: int, memory_mb: int, *, name: str | None = None, reboot: bool = False, thread: str | None = None
) -> list[str]:
    """QEMU's command line up to the guest's kernel, disks and consoles: every lab machine's (a lab guest, the lab
    host, the lab host's install boot) — no defaults, no display or monitor, a pc with ``smp`` vCPUs under ``accel``
    (``thread``: its thread=single|multi, for an accelerator that takes one); ``reboot``: a guest's reboot restarts
    it (the lab host's boot plans) rather than ending QEMU."""
    return [
        QEMU,
        *(["-name", name] if name else []),
        "-nodefaults",
        "-no-user-config",
        "-display",
        "none",
        *([] if reboot else ["-no-reboot"]),
        "-monitor",
        "none",
        "-machine",
        "pc",
        "-accel",
        accel if thread is None else f"{accel},thread={thread}",
        "-cpu",
        accelerator(accel).cpu,
        "-smp",
        str(smp),
        "-m",
        f"{memory_mb}M",
    ]


@dataclass
class Boot:
    kernel: Path
    initrd: Path
    share: Path
    console: Path
    cmdline: list[str] = field(default_factory=list)
    accel: str = TCG.name
    smp: int = 2
    memory_mb: int = 1024
    timeout_s: float = 600
    # the guest must reach its job (JOB_STARTED on the console) within this, else the boot is stopped there: a guest
    # hung in its kernel's boot (seen with the lab pv-spinlock backend's 16-spin waiters, ACPI init) costs this, not
    # the whole timeout_s
    boot_timeout_s: float | None = None
    pin_vcpus: bool = False  # each vCPU thread on its own host CPU, where the host has one for each
    acpi_tables: tuple[Path, ...] = ()  # compiled tables (AcpiTable.aml) QEMU adds to the guest's ACPI tables

    def full_cmdline(self) -> str:
        return " ".join([*BASE_CMDLINE, *self.cmdline])

    def argv(self) -> list[str]:
        for path in (self.kernel, self.initrd, self.share, self.console, *self.acpi_tables):
            if "," in str(path):
                raise LabError(f"{path}: QEMU options cannot take a path with a comma")
        # debug-threads names each vCPU thread "CPU <n>/TCG" (or /KVM), which is how pin_vcpus finds them
        return [
            *machine_argv(self.accel, self.smp, self.memory_mb, name="ticklab,debug-threads=on"),
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
            *[word for table in self.acpi_tables for word in ("-acpitable", f"file={table}")],
        ]


IASL = "iasl"


@dataclass(frozen=True)
class AcpiTable:
    """An extra ACPI table for lab guests: its ASL source in the checkout and the AML iasl compiled from it."""

    source: str  # path relative to the repository, as the experiment names it
    aml: Path
    source_sha256: str
    aml_sha256: str
    signature: str  # the table's, as iasl wrote it (e.g. "SSDT")
    iasl: str  # the compiler's version line

    def record(self) -> dict:
        """What the manifest keeps of it (no local paths)."""
        return {
            "source": self.source,
            "source_sha256": self.source_sha256,
            "aml_sha256": self.aml_sha256,
            "signature": self.signature,
            "iasl": self.iasl,
        }


def iasl_version() -> str:
    """iasl's version line; a LabError naming the package when it is not installed."""
    if shutil.which(IASL) is None:
        raise LabError(f"{IASL} is not installed (a lab experiment lists ACPI tables): apt-get install acpica-tools")
    result = subprocess.run([IASL, "-v"], capture_output=True, text=True, check=False)
    return next((line.strip() for line in result.stdout.splitlines() if "version" in line.lower()), "iasl (unknown)")


def compile_acpi_table(source: str, root: Path | None = None) -> AcpiTable:
    """The AML of ``source`` (an .asl under the checkout), compiled once per source content and iasl version into
    <cache>/acpi/<stem>-<key>.aml; a compile error or a table iasl wrote under another signature than the source's is a
    LabError naming the file."""
    root = root or repo_root()
    path = root / source
    try:
        text = read_bytes(path, limit=1 << 20)
    except (OSError, UnsafeFileError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc).rsplit(": ", 1)[-1]
        raise LabError(f"{source}: cannot read the ACPI table source ({why})") from None
    version = iasl_version()
    digest = hashlib.sha256(text).hexdigest()
    key = content_key([("source", text), ("iasl", version.encode())])
    name = f"{path.stem}-{key}.aml"
    target = cache_dir() / "acpi" / name
    if not target.is_file():
        with tempfile.TemporaryDirectory(prefix="ticklab-iasl-") as work:
            (Path(work) / path.name).write_bytes(text)
            try:
                outcome = subprocess.run(
                    [IASL, "-p", str(Path(work) / "table"), str(Path(work) / path.name)],
                    capture_output=True,
                    text=True,
                    timeout=120,
                    cwd=work,
                    check=False,
                )
            except subprocess.TimeoutExpired:
                raise LabError(f"{source}: iasl did not finish in 120 s") from None
            compiled = Path(work) / "table.aml"
            if outcome.returncode != 0 or not compiled.is_file():
                said = " ".join((outcome.stdout + outcome.stderr).split())[-400:]
                raise LabError(f"{source}: iasl could not compile it: {said}")
            aml = compiled.read_bytes()
            # Debian 12's iasl writes the signature "XXXX" (and unresolved names) when the DefinitionBlock's first
            # argument is not empty: a table Linux ignores without a word
            wanted = _definition_signature(text)
            if aml[:4] != wanted:
                raise LabError(
                    f"{source}: iasl wrote a table with the signature {aml[:4].decode('ascii', 'replace')!r}, not "
                    f"{wanted.decode('ascii', 'replace')!r}; leave the DefinitionBlock's first argument (the output "
                    "file name) empty"
                )
            with OwnedDir(cache_dir() / "acpi") as store:
                store.write_atomic(name, aml)
    aml = read_bytes(target, limit=1 << 20)
    return AcpiTable(
        source, target, digest, hashlib.sha256(aml).hexdigest(), aml[:4].decode("ascii", "replace"), version
    )


def _definition_signature(text: bytes) -> bytes:
    """The table signature a DefinitionBlock names (its second argument), e.g. b"SSDT"."""
    found = re.search(rb'DefinitionBlock\s*\(\s*"[^"]*"\s*,\s*"([A-Z0-9_]{4})"', text)
    return found.group(1) if found else b"SSDT"


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


JOB_STARTED = b"ticklab-guest: running job"  # runners/vm/init's line once the guest's kernel has booted
_CONSOLE_POLL_S = 0.5


def _job_started(console: Path, offset: int) -> tuple[bool, int]:
    """Whether the console says JOB_STARTED in what was written from ``offset`` on (re-reading a line's worth before
    it, so a line split between two reads is found), and where the next read starts."""
    start = max(0, offset - len(JOB_STARTED))
    try:
        with console.open("rb") as stream:
            stream.seek(start)
            chunk = stream.read()
    except OSError:
        return False, offset
    return JOB_STARTED in chunk, start + len(chunk)


def _wait_for_job(process: subprocess.Popen, boot: Boot, started: float) -> str | None:
    """Wait until the guest's job started (None) or QEMU ended (None), or 'boot-timeout' when boot_timeout_s
    passed without either."""
    offset = 0
    deadline = started + boot.boot_timeout_s
    while process.poll() is None:
        seen, offset = _job_started(boot.console, offset)
        if seen:
            return None
        if time.monotonic() >= deadline:
            return "boot-timeout"
        time.sleep(_CONSOLE_POLL_S)
    return None


def run_boot(boot: Boot) -> dict:
    """Boot once and wait for the guest to power off; {status: ok|timeout|failed, exit, seconds}; with
    ``boot.boot_timeout_s``, a guest that has not started its job by then is stopped (status timeout, ``stage``
    boot)."""
    started = time.monotonic()
    stage = None
    with (boot.console.with_suffix(".qemu.txt")).open("w") as qemu_log:
        process = spawn(boot.argv(), label="qemu", stdin=subprocess.DEVNULL, stdout=qemu_log, stderr=subprocess.STDOUT)
        try:
            pinning = pin_vcpu_threads(process, boot.smp) if boot.pin_vcpus else None
            if boot.boot_timeout_s is not None:
                stage = _wait_for_job(process, boot, started)
        except BaseException:  # interrupted while pinning or waiting: no QEMU outlives its boot
            wait_or_kill(process, 0)
            raise
        remaining = 0 if stage else max(1.0, boot.timeout_s - (time.monotonic() - started))
        status = wait_or_kill(process, remaining)
        if stage:
            status = "timeout"
    outcome = {
        "status": status,
        "exit": process.returncode,
        "seconds": round(time.monotonic() - started, 2),
        "accel": boot.accel,
        "smp": boot.smp,
        "memory_mb": boot.memory_mb,
        "cmdline": boot.full_cmdline(),
    }
    if stage:
        outcome["stage"] = "boot"
        outcome["why"] = f"the guest had not started its job {boot.boot_timeout_s:g} s after QEMU started (boot hung)"
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
        f"probing KVM: booting a test guest under it (up to {KVM_PROBE_TIMEOUT_S} s; "
        "the answer is kept until the host reboots)"
    )
    with tempfile.TemporaryDirectory(prefix="ticklab-kvm-probe-") as share:
        share = Path(share)
        boot = Boot(
            kernel,
            initrd,
            share,
            share / "console.log",
            accel=KVM.name,
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
    if preference == TCG.name:
        return TCG.name, "TCG requested"
    ok, why = probe_kvm(kernel, initrd, say)
    if ok:
        say(f"KVM usable: {why}")
        return KVM.name, why
    if preference == KVM.name:
        raise LabError(f"--accel {KVM.name}: {why}")
    reason = " ".join(why.split()).removesuffix("; using TCG")
    say(f"KVM not usable: {reason}; falling back to TCG (software emulation: slower, but runs the same kernel)")
    return TCG.name, why
