"""What a host is: kernel, CPU, clocksources, cpuidle, sched features, HZ, tracefs.

Every path is read below ``root`` so tests can describe a fake host with a directory tree.
Nothing here writes; privileged writes live in :mod:`ticklab.host.knobs`.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

CLOCKSOURCE_DIR = "sys/devices/system/clocksource/clocksource0"
CPUIDLE_DIR = "sys/devices/system/cpu/cpuidle"
CPU_DIR = "sys/devices/system/cpu"
TRACEFS_MOUNTS = ("sys/kernel/tracing", "sys/kernel/debug/tracing")
DEBUGFS = "sys/kernel/debug"
SCHED_FEATURES = ("sys/kernel/debug/sched/features", "sys/kernel/debug/sched_features")


def read_text(path: Path) -> str | None:
    """A sysfs/procfs file's content without the trailing newline, or None if it cannot be read."""
    try:
        return path.read_text().rstrip("\n")
    except OSError:
        return None


def parse_cpu_list(text: str) -> list[int]:
    """'0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11] (the kernel's cpulist format)."""
    cpus: list[int] = []
    for part in filter(None, text.strip().split(",")):
        low, _, high = part.partition("-")
        cpus.extend(range(int(low), int(high or low) + 1))
    return cpus


def format_cpu_list(cpus) -> str:
    """{0, 1, 2, 5} -> '0-2,5' (the kernel's cpulist format, which parse_cpu_list reads)."""
    ranges: list[list[int]] = []
    for cpu in sorted(cpus):
        if ranges and cpu == ranges[-1][1] + 1:
            ranges[-1][1] = cpu
        else:
            ranges.append([cpu, cpu])
    return ",".join(f"{a}-{b}" if b > a else str(a) for a, b in ranges)


def stat_fields(text: str) -> list[str]:
    """/proc/<pid>/stat after the command name: [state, ppid, ...] (field 3 on). The name may hold spaces and
    parentheses, so the split is after the last ')'."""
    return text[text.rfind(")") + 1 :].split() if ")" in text else []


def boot_id() -> str | None:
    """This boot's id (/proc/sys/kernel/random/boot_id): process ids and start times mean nothing across boots."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def online_cpus(root: Path) -> list[int]:
    text = read_text(root / CPU_DIR / "online")
    return parse_cpu_list(text) if text else list(range(os.cpu_count() or 1))


def cpu_model(root: Path) -> str:
    for line in (read_text(root / "proc/cpuinfo") or "").splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Processor", "cpu model"):
            return value.strip()
    return "unknown"


def has_hypervisor_flag(root: Path) -> bool:
    for line in (read_text(root / "proc/cpuinfo") or "").splitlines():
        if line.startswith("flags"):
            return "hypervisor" in line.split()
    return False


def detect_virt() -> str | None:
    """systemd-detect-virt's answer, if the tool exists (it may name a container, not the VM)."""
    tool = shutil.which("systemd-detect-virt")
    if not tool:
        return None
    result = subprocess.run([tool], capture_output=True, text=True, check=False)
    return result.stdout.strip() or None


def clocksources(root: Path) -> dict:
    directory = root / CLOCKSOURCE_DIR
    available = (read_text(directory / "available_clocksource") or "").split()
    return {"available": available, "current": read_text(directory / "current_clocksource")}


def cpuidle(root: Path) -> dict:
    driver = read_text(root / CPUIDLE_DIR / "current_driver")
    states = []
    cpu0 = root / CPU_DIR / "cpu0" / "cpuidle"
    for state in sorted(cpu0.glob("state[0-9]*"), key=lambda p: int(p.name[5:])):
        states.append(
            {
                "state": state.name,
                "name": read_text(state / "name"),
                "desc": read_text(state / "desc"),
                "latency_us": _int_or_none(read_text(state / "latency")),
                "residency_us": _int_or_none(read_text(state / "residency")),
                "disabled": read_text(state / "disable") == "1",
            }
        )
    return {
        "driver": driver if driver not in (None, "", "none") else None,
        "governor": read_text(root / CPUIDLE_DIR / "current_governor_ro")
        or read_text(root / CPUIDLE_DIR / "current_governor"),
        "states": states,
    }


def _int_or_none(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def sched_features_path(root: Path) -> Path | None:
    for candidate in SCHED_FEATURES:
        if (root / candidate).exists():
            return root / candidate
    return None


def sched_features(root: Path) -> dict:
    """The sched features file and its tokens ('HRTICK' or 'NO_HRTICK'), with why it can't be read."""
    path = sched_features_path(root)
    if path is None:
        debugfs = root / DEBUGFS
        mounted = debugfs.is_dir() and any(debugfs.iterdir())
        why = "no sched features file in debugfs" + ("" if mounted else " (debugfs not mounted)")
        return {"path": None, "features": None, "error": why}
    try:
        return {"path": str(path), "features": path.read_text().split(), "error": None}
    except OSError as exc:
        return {"path": str(path), "features": None, "error": f"{path}: {exc.strerror}"}


def kernel_hz(root: Path, release: str) -> dict:
    """CONFIG_HZ from /proc/config.gz or /boot/config-<release>, with where it came from."""
    for candidate in (root / "proc/config.gz", root / "boot" / f"config-{release}"):
        try:
            data = gzip.decompress(candidate.read_bytes()) if candidate.suffix == ".gz" else candidate.read_bytes()
        except OSError:
            continue
        text = data.decode(errors="replace")
        found = re.search(r"^CONFIG_HZ=(\d+)$", text, re.M)
        options = {
            key: value
            for key, value in re.findall(
                r"^(CONFIG_(?:NO_HZ\w*|HPET\w*|HIGH_RES_TIMERS|SCHED_DEBUG|PARAVIRT_SPINLOCKS))=(\w+)$", text, re.M
            )
        }
        return {"hz": int(found.group(1)) if found else None, "source": str(candidate), "config": options}
    return {"hz": None, "source": None, "config": {}}


# what `ticklab kernel build --host` installs in /lib/modules/<release>/ (capture/hostkernel.write_build_record)
KERNEL_BUILD_RECORD = "ticklab-build.json"
KERNEL_BUILD_LOG = "ticklab-build.log.xz"


def kernel_build(root: Path, release: str) -> dict | None:
    """The record `ticklab kernel build --host` installed beside this kernel's modules (source, patches, config and
    build log digests), or None for a kernel it did not build. Read only from a plain file of root (or of this user)
    that no one else may write."""
    path = root / "lib/modules" / release / KERNEL_BUILD_RECORD
    try:
        info = path.lstat()
        if (
            not stat.S_ISREG(info.st_mode)
            or info.st_uid not in (0, os.geteuid())
            or info.st_mode & 0o022
            or info.st_size > 1 << 16
        ):
            return None
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def tracefs_mount(root: Path) -> Path | None:
    """Where tracefs is mounted (its 'trace' file is present), if anywhere."""
    for candidate in TRACEFS_MOUNTS:
        if (root / candidate / "trace").exists():
            return root / candidate
    return None


def mounts(root: Path) -> dict[str, str]:
    """Mount point -> filesystem type, from /proc/mounts."""
    found = {}
    for line in (read_text(root / "proc/mounts") or "").splitlines():
        parts = line.split()
        if len(parts) >= 3:
            found[parts[1]] = parts[2]
    return found


# ticklab's lab patches' boot switches (kernel/patches) and where the running kernel shows the value it took
LAB_SWITCHES = {
    "hpet_read_share": "sys/module/kernel/parameters/hpet_read_share",
    "pv_kick_ahead": "sys/module/kernel/parameters/pv_kick_ahead",
    "processor.dummy_wait": "sys/module/processor/parameters/dummy_wait",
    "lab_pvspin_spins": "sys/module/kernel/parameters/lab_pvspin_spins",
}


def lab_switches(root: Path | str = "/") -> dict[str, str | None]:
    """Each lab switch as the running kernel reports it (None where this kernel lacks it)."""
    return {name: read_text(Path(root) / relative) for name, relative in LAB_SWITCHES.items()}


DECLARED_FACTS = "etc/ticklab/machine.json"
# What a machine's owner (root) may declare of it that no file under /proc or /sys shows, and the values each takes:
# vcpu_threads "single" where the hypervisor runs every vCPU in one host thread, taking turns (QEMU TCG thread=single:
# the lab host), so nothing two CPUs do at once can happen there.
DECLARABLE = {"vcpu_threads": ("single", "own")}


def declared(root: Path | str = "/") -> dict:
    """The facts ``/etc/ticklab/machine.json`` declares (root-owned, a JSON object of DECLARABLE keys); {} where
    there is none. A file another user can write, or one that declares anything else, is refused: nothing of it is
    recorded."""
    path = Path(root) / DECLARED_FACTS
    try:
        info = path.lstat()
        if not stat.S_ISREG(info.st_mode) or info.st_uid != 0 or info.st_mode & 0o022 or info.st_size > 4096:
            return {}
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(found, dict) or any(found.get(k) not in DECLARABLE.get(k, ()) for k in found):
        return {}
    return found


def collect(root: Path | str = "/") -> dict:
    """Host facts recorded in every manifest. No hostname, by design."""
    root = Path(root)
    release = read_text(root / "proc/sys/kernel/osrelease") or os.uname().release
    tracefs = tracefs_mount(root)
    return {
        "kernel_release": release,
        "kernel_version": read_text(root / "proc/sys/kernel/version"),
        "cmdline": read_text(root / "proc/cmdline"),
        "machine": os.uname().machine,
        "cpu_model": cpu_model(root),
        "nproc": len(online_cpus(root)),
        "online_cpus": online_cpus(root),
        "virtualization": {
            "hypervisor_flag": has_hypervisor_flag(root),
            "detect_virt": detect_virt() if root == Path("/") else None,
        },
        "clocksources": clocksources(root),
        "cpuidle": cpuidle(root),
        "sched_features": sched_features(root),
        "kernel_config": kernel_hz(root, release),
        "kernel_build": kernel_build(root, release),
        "tracefs": str(tracefs) if tracefs else None,
        "tracers": (read_text(tracefs / "available_tracers") or "").split() if tracefs else [],
        "declared": declared(root),
    }


def _slug(text: str) -> str:
    text = re.sub(r"\((r|tm|c)\)", "", text.lower())
    text = re.sub(r"\b(cpu|processor|with|radeon graphics)\b", " ", text)
    text = re.sub(r"@.*", "", text)
    return re.sub(r"[^a-z0-9.]+", "-", text).strip("-")


def host_id(facts: dict) -> str:
    """A readable slug: CPU model, cores, kernel release, virtualization. Never the hostname."""
    virt = "vm" if facts["virtualization"]["hypervisor_flag"] else "metal"
    release = re.sub(r"[^a-z0-9.]+", "-", facts["kernel_release"].lower()).strip("-")
    return f"{_slug(facts['cpu_model']) or 'cpu'}-{facts['nproc']}c-{release}-{virt}"
