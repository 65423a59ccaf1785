import shutil
from pathlib import Path

import pytest

from ticklab import paths

REPO = paths.repo_root()
CLAIM_IDS = ["hpet", "pvspinlock", "hrtick", "acpi-idle", "nohz"]


@pytest.fixture
def seeds():
    directory = paths.seeds_dir()
    if directory is None:
        pytest.skip("source documents not found: set TICKLAB_SEEDS or place ../shared/seeds beside the repo")
    return directory


@pytest.fixture
def published_copy(tmp_path: Path) -> Path:
    """A writable copy of traces/published to break on purpose."""
    target = tmp_path / "published"
    shutil.copytree(paths.published_dir(), target)
    return target


def make_fake_host(root: Path, *, cpus: int = 2, clocksources=("tsc", "hpet", "acpi_pm"),
                   idle_states=("POLL", "C1", "C2"), features=("GENTLE_FAIR_SLEEPERS", "NO_HRTICK", "WAKEUP_PREEMPTION")) -> Path:
    """A directory tree shaped like the sysfs/procfs/debugfs files ticklab reads and writes."""
    def put(relative: str, text: str) -> None:
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")

    put("proc/sys/kernel/osrelease", "6.12.57-ticklab")
    put("proc/cmdline", "console=ttyS0 quiet")
    put("proc/cpuinfo", "".join(f"processor\t: {n}\nmodel name\t: Fake(R) CPU 9000 @ 3.00GHz\nflags\t\t: fpu tsc hypervisor\n\n" for n in range(cpus)))
    put("sys/devices/system/cpu/online", f"0-{cpus - 1}")
    put("sys/devices/system/clocksource/clocksource0/available_clocksource", " ".join(clocksources))
    put("sys/devices/system/clocksource/clocksource0/current_clocksource", clocksources[0])
    put("sys/devices/system/cpu/cpuidle/current_driver", "acpi_idle" if idle_states else "none")
    for cpu in range(cpus):
        for index, name in enumerate(idle_states):
            base = f"sys/devices/system/cpu/cpu{cpu}/cpuidle/state{index}"
            put(f"{base}/name", name)
            put(f"{base}/latency", str(index * 10))
            put(f"{base}/disable", "0")
    put("sys/kernel/debug/sched/features", " ".join(features))
    return root


@pytest.fixture
def fake_host(tmp_path: Path) -> Path:
    return make_fake_host(tmp_path / "root")
