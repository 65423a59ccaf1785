"""Lab kernels from more than one Debian kernel source (kernel/sources.yaml): names, patches and fragments per
series, cache keys, finding a fetched source, one clear line when the mirror cannot be reached, and the kernel as
a condition of the hrtick experiment (interleaved in the seeded order). No network: the unreachable mirror is a
closed port on this machine."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from ticklab.capture.experiment import expand_conditions, load_experiment, schedule
from ticklab.cli import main
from ticklab.lab import kernel as lab_kernel
from ticklab.lab import sources
from ticklab.lab.cache import LabError
from ticklab.lab.guest import boot_mismatches
from ticklab.lab.run import LabOptions, boot_settings, experiment_kernels, planning_facts

pytestmark = pytest.mark.xdist_group("guests")


def test_a_kernel_name_says_its_series_and_variant():
    assert sources.split_name("hz1000") == ("6.12", "hz1000")
    assert sources.split_name("7.2-hz1000") == ("7.2", "hz1000")
    assert sources.split_name("6.12-hz250") == ("6.12", "hz250")
    assert sources.canonical_name("6.12", "hz250") == "hz250"
    assert sources.canonical_name("7.2", "hz250") == "7.2-hz250"
    assert {"hz1000", "hz250", "7.2-hz1000", "7.2-hz250"} <= set(lab_kernel.kernel_names())
    with pytest.raises(
        LabError, match=r"^lab kernel 9.9-hz1000: no source 9.9 in kernel/sources.yaml \(have: 6.12, 7.2"
    ):
        sources.split_name("9.9-hz1000")


def test_patches_and_fragments_are_per_series():
    assert [p.name for p in lab_kernel.patch_paths("6.12")] == [
        "0001-hpet-read-share.patch",
        "0002-pv-kick-ahead.patch",
        "0003-acpi-dummy-wait.patch",
        "0004-lab-pvspin.patch",
    ]
    assert lab_kernel.patch_paths("7.2") == []  # the series is upstream in 7.2; the 6.12 switches are not carried
    assert lab_kernel.patch_paths() == lab_kernel.patch_paths("6.12")
    old = [p.relative_to(REPO).as_posix() for p in lab_kernel.fragment_paths("hz1000")]
    new = [p.relative_to(REPO).as_posix() for p in lab_kernel.fragment_paths("7.2-hz1000")]
    assert old == [
        "kernel/configs/guest-base.config",
        "kernel/configs/sources/6.12.config",
        "kernel/configs/hz1000.config",
    ]
    assert new == [
        "kernel/configs/guest-base.config",
        "kernel/configs/sources/7.2.config",
        "kernel/configs/hz1000.config",
    ]
    wanted_new = lab_kernel.fragment_options(lab_kernel.fragment_paths("7.2-hz1000"))
    # what the hrtick experiment needs on 7.2 (issue 25): SCHED_DEBUG is gone there (6.16 made it unconditional)
    for option in (
        "CONFIG_SCHED_HRTICK",
        "CONFIG_HIGH_RES_TIMERS",
        "CONFIG_GENERIC_ENTRY",
        "CONFIG_FUNCTION_TRACER",
        "CONFIG_DEBUG_FS",
        "CONFIG_HRTIMER_REARM_DEFERRED",
        "CONFIG_HZ_1000",
    ):
        assert wanted_new[option] == "y", option
    assert "CONFIG_SCHED_DEBUG" not in wanted_new
    assert lab_kernel.fragment_options(lab_kernel.fragment_paths("hz1000"))["CONFIG_SCHED_DEBUG"] == "y"


def test_the_cache_key_names_the_source_and_its_series_files(tmp_path, monkeypatch):
    copy = tmp_path / "kernel"
    shutil.copytree(REPO / "kernel", copy)
    monkeypatch.setattr(lab_kernel, "kernel_dir", lambda: copy)
    monkeypatch.setenv("TICKLAB_CACHE", str(tmp_path / "cache"))
    old, new = lab_kernel.kernel_key("6.12.117-1", "hz1000"), lab_kernel.kernel_key("7.2.13-1", "7.2-hz1000")
    assert old != new and new != lab_kernel.kernel_key("7.2.14-1", "7.2-hz1000")
    assert lab_kernel.kernel_key("6.12.117-1", "6.12-hz1000") == old  # the same kernel by either name
    key, directory = lab_kernel.kernel_path("7.2-hz1000", "7.2.13-1")
    assert key == new and directory == tmp_path / "cache" / "kernels" / f"7.2-hz1000-{new}"
    assert lab_kernel.kernel_path("6.12-hz1000", "6.12.117-1")[1].name == f"hz1000-{old}"
    (copy / "configs" / "sources" / "7.2.config").write_text("CONFIG_HRTIMER_REARM_DEFERRED=y\nCONFIG_X=y\n")
    assert lab_kernel.kernel_key("7.2.13-1", "7.2-hz1000") != new
    assert lab_kernel.kernel_key("6.12.117-1", "hz1000") == old  # another series' fragment is not this kernel's
    (copy / "patches" / "7.2" / "0001-x.patch").write_text("--- a/x\n+++ b/x\n")
    assert [p.name for p in lab_kernel.patch_paths("7.2")] == ["0001-x.patch"]
    assert lab_kernel.kernel_key("6.12.117-1", "hz1000") == old


def _fetched(cache: Path, version: str, complete: bool = True) -> Path:
    top = cache / "sources" / "linux-source-7.2" / version
    (top / "usr" / "src").mkdir(parents=True)
    (top / "usr" / "src" / "linux-source-7.2.tar.xz").write_bytes(b"not really xz")
    if complete:
        (top / "fetched.json").write_text(
            json.dumps(
                {
                    "package": "linux-source-7.2",
                    "version": version,
                    "suite": "sid",
                    "mirror": "http://deb.debian.org/debian",
                }
            )
        )
    return top


def test_a_fetched_source_is_found_in_the_cache_without_the_network(tmp_path, monkeypatch):
    monkeypatch.setenv("TICKLAB_CACHE", str(tmp_path))
    spec = sources.spec("7.2")
    assert sources.fetched(spec) is None
    _fetched(tmp_path, "7.2.14-1", complete=False)  # an interrupted fetch: no fetched.json, not a source
    assert sources.fetched(spec) is None
    with pytest.raises(
        LabError,
        match=r"^linux-source-7.2: not installed and not fetched; 'ticklab lab build-kernel' "
        r"fetches it from Debian sid$",
    ):
        sources.require("7.2", fetch=False) if sources.installed(spec) is None else pytest.skip("7.2 is installed")
    _fetched(tmp_path, "7.2.13-1")
    found = sources.fetched(spec)
    assert (found.version, found.origin, found.top) == (
        "7.2.13-1",
        "fetched from http://deb.debian.org/debian sid",
        "linux-source-7.2",
    )
    assert found.record() == {
        "package": "linux-source-7.2",
        "version": "7.2.13-1",
        "series": "7.2",
        "origin": "fetched from http://deb.debian.org/debian sid",
    }
    if shutil.which("dpkg"):
        shutil.rmtree(tmp_path / "sources" / "linux-source-7.2" / "7.2.14-1")
        _fetched(tmp_path, "7.2.9-1")
        assert sources.fetched(spec).version == "7.2.13-1"  # dpkg's order: 7.2.13 is newer than 7.2.9
    assert "7.2: linux-source-7.2 7.2.13-1, fetched from" in sources.describe() or sources.installed(spec)


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("apt-get") is None or not Path("/usr/share/keyrings/debian-archive-keyring.gpg").is_file(),
    reason="needs apt-get and debian-archive-keyring",
)
def test_an_unreachable_mirror_is_one_line_and_leaves_no_source(tmp_path, monkeypatch):
    monkeypatch.setenv("TICKLAB_CACHE", str(tmp_path))
    spec = sources.SourceSpec(
        "7.2",
        "linux-source-7.2",
        "sid",
        "http://127.0.0.1:9/debian",
        Path("/usr/share/keyrings/debian-archive-keyring.gpg"),
    )
    said = []
    with pytest.raises(LabError) as caught:
        sources.fetch_source(spec, progress=False, say=said.append)
    message = str(caught.value)
    assert (
        message.startswith("cannot get linux-source-7.2 from http://127.0.0.1:9/debian sid: ") and "\n" not in message
    )
    assert said == [
        f"fetching linux-source-7.2 from Debian sid (http://127.0.0.1:9/debian) with a private apt "
        f"configuration in {tmp_path / 'apt' / 'sid'}"
    ]
    assert sources.fetched(spec) is None
    # the private configuration names only this suite, in the cache; the system's apt files are not used
    assert (tmp_path / "apt" / "sid" / "sources.list").read_text() == (
        "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://127.0.0.1:9/debian sid main\n"
    )
    options = sources.AptConfig(spec).options()
    assert f"Dir::Cache={tmp_path / 'apt' / 'sid' / 'cache'}" in options
    assert f"Dir::State::Lists={tmp_path / 'apt' / 'sid' / 'lists'}" in options


def test_a_bad_sources_file_is_one_line(tmp_path):
    path = tmp_path / "sources.yaml"
    path.write_text("default: '6.12'\nmirror: ftp://x\nsources: {'6.12': {package: linux-source-6.12}}\n")
    with pytest.raises(LabError, match=r"sources.yaml: mirror: 'ftp://x' is not an http\(s\) URL$"):
        sources.load_specs(path)
    path.write_text("default: '7.3'\nmirror: http://x\nsources: {'6.12': {package: linux-source-6.12}}\n")
    with pytest.raises(LabError, match=r"default: '7.3' is not one of the sources \(6.12\)$"):
        sources.load_specs(path)
    path.write_text("default: '6.12'\nmirror: http://x\nsources: {'6.12': {package: 'x; rm -rf /'}}\n")
    with pytest.raises(LabError, match=r"sources.6.12.package: 'x; rm -rf /' is not linux-source-<major>.<minor>$"):
        sources.load_specs(path)


def test_the_cli_names_the_sources_and_refuses_an_unknown_series_in_one_line(capsys):
    with pytest.raises(SystemExit) as done:
        main(["lab", "build-kernel", "--help"])
    help_text = capsys.readouterr().out
    assert done.value.code == 0
    assert (
        "kernel sources here (kernel/sources.yaml):" in help_text and "  6.12 (default): linux-source-6.12" in help_text
    )
    assert "  7.2: linux-source-7.2" in help_text
    assert main(["lab", "build-kernel", "--variant", "9.9-hz1000"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == (
        "ticklab lab build-kernel: lab kernel 9.9-hz1000: no source 9.9 in kernel/sources.yaml (have: 6.12, 7.2)\n"
    )


@pytest.mark.slow
def test_the_kernel_is_a_condition_interleaved_in_the_seeded_order():
    experiment = load_experiment(REPO / "runners" / "hrtick" / "guest-hackbench.yaml")
    assert experiment_kernels(experiment) == ["7.2-hz250", "hz250"]
    conditions = expand_conditions(experiment, planning_facts(2))
    planned = schedule(conditions, 3, 1, experiment.seed)
    kernels = {c.name: boot_settings(experiment, c, LabOptions())["kernel"] for c in conditions}
    assert kernels == {
        "6.12 hrtick-off": "hz250",
        "6.12 hrtick-on": "hz250",
        "7.2 hrtick-off": "7.2-hz250",
        "7.2 hrtick-on": "7.2-hz250",
    }
    assert [p.condition.name for p in planned[:4]] == list(kernels) and all(p.warmup for p in planned[:4])
    measured = [p.condition.name for p in planned[4:]]
    assert sorted(measured) == sorted(list(kernels) * 3)
    # the seeded shuffle (random.Random(seed).shuffle), not kernel by kernel: both kernels boot in each half
    assert measured == [p.condition.name for p in schedule(conditions, 3, 1, experiment.seed)[4:]]
    halves = [{kernels[name] for name in measured[:6]}, {kernels[name] for name in measured[6:]}]
    assert halves == [{"hz250", "7.2-hz250"}] * 2
    switches = sum(kernels[a] != kernels[b] for a, b in zip(measured, measured[1:], strict=False))
    assert switches >= 3, measured


def test_a_guest_that_booted_another_kernel_is_a_mismatch():
    facts = {"cmdline": "console=ttyS0", "kernel_release": "6.12.117-ticklab"}
    assert boot_mismatches([], None, facts, "6.12.117-ticklab") == []
    assert boot_mismatches([], None, facts, "7.2.13-ticklab") == [
        "the kernel is 6.12.117-ticklab, the condition asks for 7.2.13-ticklab"
    ]
    assert boot_mismatches([], None, facts) == []


@pytest.mark.slow
def test_the_host_boot_plan_kexecs_between_two_installed_kernels_interleaved(tmp_path):
    from conftest import make_fake_host

    root = make_fake_host(tmp_path / "root", features=("NO_HRTICK", "NO_HRTICK_DL", "WAKEUP_PREEMPTION"))
    (root / "proc/cmdline").write_text("BOOT_IMAGE=/boot/vmlinuz-6.12.57-1-amd64 root=/dev/vda1 ro quiet\n")
    for release in ("6.12.57-1-amd64", "7.2.13-1-amd64"):
        (root / "boot").mkdir(exist_ok=True)
        (root / f"boot/vmlinuz-{release}").write_bytes(b"kernel")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "ticklab.cli",
            "capture",
            "hrtick",
            "--boot",
            "kexec",
            "--dry-run",
            "--runs",
            "2",
            "--warmup",
            "1",
            "--root",
            str(root),
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("  run-")]
    assert len(lines) == 12  # a warm-up of each of the 4 conditions, then 2 measured runs of each, shuffled
    kernel_of = {"6.12": "6.12.57-1-amd64", "7.2": "7.2.13-1-amd64"}
    for line in lines:
        condition = line.split(":")[0].split(maxsplit=1)[1].removesuffix(" (warm-up)")
        assert f"kernel {kernel_of[condition.split()[0]]}," in line, line
    measured = [line.split(":")[0].split(maxsplit=1)[1] for line in lines[4:]]
    assert sorted(measured) == sorted(["6.12 hrtick-off", "6.12 hrtick-on", "7.2 hrtick-off", "7.2 hrtick-on"] * 2)
    assert not (root / "var/lib/ticklab").exists()


def test_a_guest_kernel_crash_is_named_in_the_failed_runs_problem(tmp_path):
    from ticklab.lab.run import _no_result, guest_crash

    console = tmp_path / "console.log"
    console.write_text(
        "[    2.338522] Run /init as init process\nticklab-guest: running job\n"
        "[   16.585226] Oops: int3: 0000 [#1] SMP\n[   16.585575] RIP: 0010:cpu_util.constprop.0+0x1/0x1c0\n"
        "[   16.586589] RIP: 0010:cpu_util.constprop.0+0x1/0x1c0\n"
        "[   16.586708] Kernel panic - not syncing: Fatal exception in interrupt\n"
    )
    assert guest_crash(console) == (
        "Oops: int3: 0000 [#1] SMP; RIP: 0010:cpu_util.constprop.0+0x1/0x1c0; "
        "Kernel panic - not syncing: Fatal exception in interrupt"
    )
    assert _no_result({}, {"status": "ok", "exit": 0}, tmp_path) == (
        "the guest wrote no result (boot ok, exit 0; its kernel crashed: Oops: int3: 0000 [#1] SMP; RIP: "
        "0010:cpu_util.constprop.0+0x1/0x1c0; Kernel panic - not syncing: Fatal exception in interrupt; see "
        f"{console})"
    )
    assert guest_crash(tmp_path / "absent.log") == ""


def test_the_guest_hrtick_experiment_traces_with_ticklabs_tracefs_backend(tmp_path):
    from ticklab.capture.experiment import ExperimentError
    from ticklab.lab.run import lab_settings

    experiment = load_experiment(REPO / "runners" / "hrtick" / "guest-hackbench.yaml")
    assert lab_settings(experiment)["backend"] == "tracefs"
    assert lab_settings(load_experiment(REPO / "runners" / "nohz" / "guest-ftq.yaml"))["backend"] == "auto"
    bad = tmp_path / "guest-bad.yaml"
    bad.write_text(
        (REPO / "runners" / "hrtick" / "guest-hackbench.yaml").read_text().replace("backend: tracefs", "backend: perf")
    )
    with pytest.raises(ExperimentError, match="guest-bad.yaml"):
        load_experiment(bad)


def test_a_lab_guest_plays_the_host_boot_plan_with_each_conditions_lab_kernel(monkeypatch, tmp_path):
    from types import SimpleNamespace

    from ticklab.lab import guest_plan

    built = {
        name: SimpleNamespace(variant=name, info={"release": release}, image=tmp_path / name)
        for name, release in (("hz1000", "6.12.117-ticklab"), ("7.2-hz1000", "7.2.13-ticklab"))
    }
    monkeypatch.setattr(lab_kernel, "cached_kernel", lambda name: built.get(name))
    experiment = load_experiment(REPO / "runners" / "hrtick" / "host-boot-kernels.yaml")
    conditions = expand_conditions(experiment, planning_facts(2))
    kernels = guest_plan.plan_kernels(experiment, conditions, built["hz1000"])
    assert {name: k.variant for name, k in kernels.items()} == {
        "6.12 hrtick-off": "hz1000",
        "6.12 hrtick-on": "hz1000",
        "7.2 hrtick-off": "7.2-hz1000",
        "7.2 hrtick-on": "7.2-hz1000",
    }
    del built["7.2-hz1000"]
    with pytest.raises(
        LabError,
        match=r"host-boot-kernels.yaml: kernel '7.2.\*' matches 0 built lab kernels \(have: "
        r"hz1000 \(6.12.117-ticklab\)\); build the one it names, e.g. ticklab lab "
        r"build-kernel --variant 7.2-hz1000",
    ):
        guest_plan.plan_kernels(experiment, conditions, built["hz1000"])
    nohz = load_experiment(REPO / "runners" / "nohz" / "host-boot-ftq.yaml")
    running = guest_plan.plan_kernels(nohz, expand_conditions(nohz, planning_facts(2)), built["hz1000"])
    assert {k.variant for k in running.values()} == {"hz1000"}  # "running": the kernel the guest booted first
