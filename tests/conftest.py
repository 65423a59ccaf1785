import ast
import functools
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from ticklab import paths
from ticklab.claims import all_claims

REPO = paths.repo_root()
CLAIM_IDS = [claim.id for claim in all_claims()]  # in seed order

# Only so that a broken test cannot hang CI for ever: every wait of the process tests is on a file or a process.
WAIT_BOUND_S = float(os.environ.get("TICKLAB_TEST_WAIT_BOUND_S", 600))


def wait_for(condition, what: str, process: subprocess.Popen | None = None) -> None:
    """Poll ``condition`` until it holds (a file written, a process gone); no deadline a loaded host could exceed."""
    deadline = time.monotonic() + WAIT_BOUND_S
    while not condition():
        if process is not None:
            assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, f"{what}: not within {WAIT_BOUND_S} s"
        time.sleep(0.05)


def gone(pid: int) -> bool:
    """The process has exited (a zombie waiting for its reaper counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True


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


def debian_image_root(base: Path) -> Path:
    """A Debian root as a disk image holds it, at ``base``/image: /boot with its 6.1 kernel, config and grub.cfg, no
    /proc contents, empty mount points."""
    root = base / "image"
    for relative in ("proc", "sys", "dev", "boot/grub", "usr/src"):
        (root / relative).mkdir(parents=True)
    (root / "boot/vmlinuz-6.1.0-50-amd64").write_bytes(b"debian kernel")
    (root / "boot/config-6.1.0-50-amd64").write_text("CONFIG_64BIT=y\nCONFIG_HZ_250=y\n")
    (root / "boot/grub/grub.cfg").write_text("set default=0\n")
    return root


def make_fake_host(
    root: Path,
    *,
    cpus: int = 2,
    clocksources=("tsc", "hpet", "acpi_pm"),
    idle_states=("POLL", "C1", "C2"),
    features=("GENTLE_FAIR_SLEEPERS", "NO_HRTICK", "WAKEUP_PREEMPTION"),
) -> Path:
    """A directory tree shaped like the sysfs/procfs/debugfs files ticklab reads and writes."""

    def put(relative: str, text: str) -> None:
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")

    put("proc/sys/kernel/osrelease", "6.12.57-ticklab")
    put("proc/cmdline", "console=ttyS0 quiet")
    put(
        "proc/cpuinfo",
        "".join(
            f"processor\t: {n}\nmodel name\t: Fake(R) CPU 9000 @ 3.00GHz\nflags\t\t: fpu tsc hypervisor\n\n"
            for n in range(cpus)
        ),
    )
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


# `make check` (the fast lane) leaves out the tests marked slow (@pytest.mark.slow, or a module's pytestmark: whole
# modules that boot guests, run notebooks or start servers, and single tests over the CPU time pyproject.toml's slow
# marker states); `make test` runs everything.
#
# `make test` runs on two workers (pytest-xdist): the tests of one xdist_group mark run on one worker, one at a time,
# in file order. Tests that change this machine itself are in the group "machine" (the host lock is taken without
# waiting by every capture on the real root, dry runs included; a real capture moves every task and interrupt off
# the measured CPU and checks the mounts and affinities it found are back; the fleet's namespaces and the tmpfs "full
# disks" are mounts; a lab guest's side played on this machine takes the host lock). The guest lab's boots share the
# kernel and image cache (~/.cache/ticklab) in the group "guests". Every other module is a group of its own, so a
# module-scoped fixture (the report's notebooks) is built once, on one worker.
# The groups that take longest, handed out first (xdist's --no-loadscope-reorder keeps this order) so that the two
# long ones start at once on different workers and the short modules fill in around them.
LONGEST_FIRST = ["guests", "machine", "test_report.py", "test_new_claim.py", "test_compare.py", "test_tickcost.py"]


def _xdist_group(expression: ast.AST) -> str | None:
    """The name in a ``pytest.mark.xdist_group("name")`` within ``expression`` (a decorator, a pytestmark)."""
    for node in ast.walk(expression):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "xdist_group"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            return node.args[0].value
    return None


@functools.cache
def xdist_groups(module: Path) -> tuple[str | None, dict[str, str]]:
    """A test module's xdist_group marks: its pytestmark's, and its test functions' own. Read from its source: the
    scheduler runs in xdist's controller, which has node ids, not collected items with their marks."""
    tree = ast.parse(module.read_text(), filename=str(module))
    whole, tests = None, {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            whole = _xdist_group(node.value)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            own = next(filter(None, map(_xdist_group, node.decorator_list)), None)
            if own is not None:
                tests[node.name] = own
    return whole, tests


def group_of(nodeid: str) -> str:
    """The group of a test, from its node id (tests/<module>.py::<name>[<parameters>]): its xdist_group mark, its
    module's, or else the module itself."""
    path, _, name = nodeid.partition("::")
    whole, tests = xdist_groups(REPO / path)
    return tests.get(name.split("[", 1)[0]) or whole or path.rsplit("/", 1)[-1]


def pytest_xdist_make_scheduler(config, log):
    """xdist's scope scheduling with our groups as the scopes. (Its own --dist loadgroup reads xdist_group marks
    into the node id, which pytest 9 no longer lets a plugin rewrite: every test would be scheduled alone.)"""
    from xdist.scheduler import LoadScopeScheduling

    class MachineGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    return MachineGroups(config, log)


def pytest_collection_modifyitems(config, items):
    rank = {group: index for index, group in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(group_of(item.nodeid), len(rank)))  # stable: file order otherwise


def assert_gaps_match_traced_ticks(bundle: Path, gapdet: dict) -> None:
    """The gap detector ran under its own trace on the mono clock (CLOCK_MONOTONIC, the clock it reads): nearly
    every traced tick lies inside a gap, and the workload loses at least the traced span (issue 26)."""
    from ticklab.capture.workloads import read_gapdet
    from ticklab.trace.ingest import read_trace
    from ticklab.trace.tickcost import matched_gap_tick_cost
    from ticklab.trace.tracemetrics import timer_interrupt_costs

    assert gapdet["status"] == "ok" and gapdet["trace"]["lost_events"] == 0, gapdet
    trace = read_trace(bundle / "raw" / gapdet["directory"] / gapdet["trace"]["directory"])
    assert trace.clock == "mono"
    header, gaps = read_gapdet(bundle / "raw" / gapdet["directory"] / "stdout.txt")
    cost = matched_gap_tick_cost(gaps, header, timer_interrupt_costs(trace, int(header["cpu"])))
    assert cost["reason"] == "" and cost["ticks"] > 0 and cost["matched"] >= 0.9 * cost["ticks"], cost
    assert cost["tick_gap_us_median"] >= cost["span_us_median"] > 0 and cost["before_entry_us_median"] >= 0, cost


def shortened_nohz_experiment(source: Path, directory: Path) -> Path:
    """A nohz FTQ experiment file cut to 1 s of FTQ and of each per-run extra, without its once-per-condition
    extras, written into ``directory`` under the same name: for tests of what surrounds a capture (transport,
    boot plans), which the full 5 s runs only make slower."""
    import yaml

    definition = yaml.safe_load(source.read_text())
    definition["workload"]["params"].update(samples=1000, warmup_samples=100)
    definition["extras"] = [extra for extra in definition["extras"] if extra.get("per_run")]
    for extra in definition["extras"]:
        extra["argv"] = [{"5000": "1000", "5s": "1s"}.get(word, word) for word in extra["argv"]]
    path = directory / source.name
    path.write_text(yaml.safe_dump(definition, sort_keys=False))
    return path
