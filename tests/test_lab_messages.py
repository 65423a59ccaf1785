"""What `ticklab lab run` tells its user while it works: the kernel builds it is about to start (how
long, where they are kept, --no-build), the KVM probe and its outcome, and every phase after the
boots. The kernel builder, the guest image and QEMU are fakes: no kernel is built and no guest boots."""

import json
from pathlib import Path

import pytest
import yaml

from conftest import REPO
from ticklab.cli import main
from ticklab.lab import image as guest_image
from ticklab.lab import kernel as lab_kernel
from ticklab.lab import qemu

GUEST_FTQ = REPO / "runners" / "nohz" / "guest-ftq.yaml"


def _kernel_dir(cache, variant, hz, **record):
    directory = cache / "kernels" / f"{variant}-fake"
    directory.mkdir(parents=True)
    (directory / "bzImage").write_bytes(b"not a kernel")
    info = {
        "variant": variant,
        "key": "fake",
        "release": "6.12.57-ticklab",
        "hz": hz,
        "source": {"package": "linux-source-6.12", "version": "6.12.57-1"},
        "patches": [],
        "bzImage_sha256": "0" * 64,
        **record,
    }
    (directory / "build.json").write_text(json.dumps(info))
    return lab_kernel.LabKernel(variant, "fake", directory)


class _FakeImage:
    def __init__(self, directory):
        self.initramfs = directory / "initramfs.cpio.gz"

    def record(self):
        return {"key": "fake", "sha256": "0" * 64, "bytes": 0, "packages": {}}


@pytest.fixture
def fake_lab(tmp_path, monkeypatch):
    """hz1000 cached (its build took 10 min with -j2), hz250 not; /dev/kvm present but guests hang under it.
    Returns the variants the fake builder built."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("TICKLAB_CACHE", str(cache))
    cached = {"hz1000": _kernel_dir(cache, "hz1000", 1000, build_seconds=600.0, jobs=2, built="2026-11-22T10:00:00Z")}
    built = []

    def build_kernel(variant, jobs=None, progress=True, say=print, force=False, announce=True):
        if variant in cached:
            return cached[variant]
        built.append(variant)
        cached[variant] = _kernel_dir(tmp_path / "built", variant, 250)
        return cached[variant]

    def run_boot(boot):
        boot.console.with_suffix(".qemu.txt").write_text("qemu-system-x86_64: vCPU 0 hung\n")
        return {
            "status": "timeout",
            "exit": -9,
            "seconds": 30.0,
            "accel": boot.accel,
            "smp": boot.smp,
            "memory_mb": boot.memory_mb,
            "cmdline": boot.full_cmdline(),
        }

    monkeypatch.setattr(lab_kernel, "cached_kernel", lambda variant: cached.get(variant))
    monkeypatch.setattr(lab_kernel, "build_kernel", build_kernel)
    monkeypatch.setattr(guest_image, "build_image", lambda say=print, force=False: _FakeImage(tmp_path))
    monkeypatch.setattr(qemu, "qemu_version", lambda: "QEMU emulator version 7.2.0 (fake)")
    monkeypatch.setattr(qemu, "kvm_device_usable", lambda: True)
    monkeypatch.setattr(qemu, "run_boot", run_boot)
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    return built


def _once_per_condition(directory: Path) -> Path:
    """guest-ftq with its osnoise cross-check in boots of its own (once per condition), not after every run."""
    definition = yaml.safe_load(GUEST_FTQ.read_text())
    definition["extras"] = [extra for extra in definition["extras"] if extra["name"] == "osnoise"]  # not gapdet
    for extra in definition["extras"]:
        extra.pop("per_run", None)
    path = directory / "guest-ftq.yaml"
    path.write_text(yaml.safe_dump(definition, sort_keys=False))
    return path


def _lab_run(out, *extra):
    out.mkdir(parents=True, exist_ok=True)
    return main(
        [
            "lab",
            "run",
            "nohz",
            "--experiment",
            str(_once_per_condition(out.parent)),
            "--runs",
            "1",
            "--warmup",
            "0",
            "--out",
            str(out),
            *extra,
        ]
    )


def test_lab_run_announces_the_build_the_kvm_probe_and_every_later_phase(tmp_path, fake_lab, capsys):
    assert _lab_run(tmp_path / "traces") == 0
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert fake_lab == ["hz250"]
    assert "lab kernel hz1000: cached in " + str(tmp_path / "cache" / "kernels") in lines
    assert (
        "building lab kernel hz250 (not cached): about 6-18 min with -j2 on 2 cores (last build here: 10 min "
        f"with -j2); kept in {tmp_path / 'cache' / 'kernels'} afterwards; --no-build refuses instead of building"
    ) in lines
    probing = lines.index(
        "probing KVM: booting a test guest under it (up to 30 s; the answer is kept until the host reboots)"
    )
    assert lines[probing + 1] == (
        "KVM not usable: a test guest did not boot under KVM (timeout, exit -9: "
        "qemu-system-x86_64: vCPU 0 hung); falling back to TCG (software emulation: "
        "slower, but runs the same kernel)"
    )
    # stderr is not a terminal here: no progress bars, one line for the boots instead
    assert (
        "nohz/guest-ftq (tcg): 3 boot(s), 0 of them warm-up, one guest each (more if the stopping rule asks)" in lines
    )
    assert "nohz/guest-ftq: cross-check osnoise: 3 more boot(s), one per condition" in lines
    sealing = lines.index("nohz/guest-ftq: sealing the bundle (compressing raw files, hashing every file)")
    assert lines[sealing + 1].endswith(": sealed")
    assert lines.index("nohz/guest-ftq: cross-check osnoise: 3 more boot(s), one per condition") < sealing
    assert "\r" not in err and out == ""


def test_a_cached_kernel_and_a_cached_probe_say_one_line_each(tmp_path, fake_lab, capsys):
    assert _lab_run(tmp_path / "first", "--accel", "auto") == 0
    capsys.readouterr()
    assert _lab_run(tmp_path / "second") == 0
    err = capsys.readouterr().err
    assert "probing KVM" not in err  # answered from the cache this time
    assert err.count("KVM not usable: ") == 1
    # hz250 was built by the first run: now both kernels are cached, said in one line, and nothing is built
    assert fake_lab == ["hz250"] and "building" not in err
    assert [line for line in err.splitlines() if "lab kernel" in line] == [
        f"lab kernels hz1000, hz250: cached in {tmp_path / 'cache' / 'kernels'}"
    ]


def test_no_build_refuses_without_announcing_a_build(tmp_path, fake_lab, capsys):
    assert _lab_run(tmp_path / "traces", "--no-build") == 2
    err = capsys.readouterr().err
    assert fake_lab == [] and "building lab kernel" not in err
    assert "lab kernel hz250 is not built: run 'ticklab lab build-kernel --variant hz250'" in err


def test_the_build_estimate_scales_with_cores_and_names_the_last_build(tmp_path, monkeypatch):
    monkeypatch.setenv("TICKLAB_CACHE", str(tmp_path))
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    assert lab_kernel.build_estimate() == "2-4 min with -j8 on 8 cores"
    assert lab_kernel.build_estimate(2) == "6-18 min with -j2 on 8 cores"
    _kernel_dir(tmp_path, "hz250", 250, build_seconds=1054.0, jobs=2, built="2026-11-22T17:00:00Z")
    _kernel_dir(tmp_path, "hz1000", 1000, build_seconds=252.0, jobs=2, built="2026-11-22T12:00:00Z")
    assert lab_kernel.build_estimate(1) == "12-36 min with -j1 on 8 cores (last build here: 18 min with -j2)"
    assert lab_kernel.build_announcement(["hz1000", "hz250"], 8) == (
        "building lab kernels hz1000, hz250 (not cached): each about 2-4 min with -j8 on 8 cores (last build "
        f"here: 18 min with -j2); kept in {tmp_path / 'kernels'} afterwards"
    )


def test_a_kvm_probe_that_boots_says_kvm_is_usable(tmp_path, monkeypatch):
    monkeypatch.setenv("TICKLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(qemu, "qemu_version", lambda: "QEMU emulator version 7.2.0 (fake)")
    monkeypatch.setattr(qemu, "kvm_device_usable", lambda: True)

    def run_boot(boot):
        (boot.share / "booted").write_text("")
        boot.console.with_suffix(".qemu.txt").write_text("")
        return {"status": "ok", "exit": 0, "seconds": 3.2}

    monkeypatch.setattr(qemu, "run_boot", run_boot)
    said = []
    assert qemu.choose_accelerator("auto", tmp_path, tmp_path, say=said.append) == (
        "kvm",
        "a test guest booted under KVM in 3 s",
    )
    assert said[1:] == ["KVM usable: a test guest booted under KVM in 3 s"]
    said.clear()
    assert qemu.choose_accelerator("tcg", tmp_path, tmp_path, say=said.append) == ("tcg", "TCG requested")
    assert said == []
