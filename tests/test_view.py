"""`ticklab view`: KernelShark sessions preset for a claim, checked against the trace and, where
KernelShark and Xvfb exist, loaded by KernelShark itself (its saved session must hold our markers)."""

import ctypes
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from conftest import REPO
from ticklab.analysis.captured import find_bundles
from ticklab.report.view import ViewError, build_session, entry_order
from ticklab.trace.ingest import read_trace_dat
from ticklab.trace.tracemetrics import TIMER_ENTRY, TIMER_EXIT

pytestmark = pytest.mark.slow


def guest_bundle(claim: str) -> Path:
    # a lab guest's bundle (its runs record the guest's boot), not the lab host's, whose runs are a host capture's
    refs = [
        r
        for r in find_bundles(REPO / "traces", claim)
        if r.host_id.startswith("guest-") and "-labhost-" not in r.host_id
    ]
    if not refs:
        pytest.skip(f"no guest {claim} bundle in traces/")
    return refs[0].path


def test_hrtick_session_marks_the_first_spurious_interrupt_by_entry_row():
    path, session, spot = build_session(guest_bundle("hrtick"))
    assert spot.what.startswith("first spurious hrtimer interrupt")
    order = entry_order(read_trace_dat(path))
    marks = session["Markers"]
    a, b = order.loc[marks["markA"]["row"]], order.loc[marks["markB"]["row"]]
    assert (a["event"], a["timestamp"], a["cpu"]) == (TIMER_ENTRY, spot.first_ns, spot.cpu)
    assert (b["event"], b["timestamp"], b["cpu"]) == (TIMER_EXIT, spot.last_ns, spot.cpu)
    low, high = session["Model"]["range"]
    assert low < spot.first_ns < spot.last_ns < high
    stream = session["data streams"][0]
    assert stream["data"]["time"] == int(os.stat(path).st_mtime)
    assert "timer/hrtimer_start" in stream["filters"]["show event filter"]
    assert session["type"] == "kshark.config.session"


def test_nohz_session_shows_the_measured_cpu_and_a_compressed_run_is_decompressed(tmp_path, monkeypatch):
    monkeypatch.setenv("TICKLAB_CACHE", str(tmp_path))
    bundle = guest_bundle("nohz")
    manifest = json.loads((bundle / "manifest.json").read_text())
    packed = next(r for r in manifest["runs"] if (bundle / "raw" / r["run"] / "trace" / "trace.dat.xz").is_file())
    path, session, spot = build_session(bundle, packed["run"])
    assert path.is_relative_to(tmp_path) and path.read_bytes()[:3] == b"\x17\x08D"
    assert session["data streams"][0]["CPUPlots"] == [packed["guest"]["nproc"] - 1]
    assert spot.what.startswith("longest stretch without a timer interrupt")
    with pytest.raises(ViewError, match="no traced run 'run-999'"):
        build_session(bundle, "run-999")


def test_a_tracefs_capture_opens_as_a_trace_dat_that_trace_cmd_reads(tmp_path, monkeypatch):
    """Captures made where `trace-cmd record` fails (this host's tracefs backend) are written as trace.dat v6 into
    the cache: the same events as the capture, and `trace-cmd report` counts them the same."""
    from ticklab.trace.ingest import read_tracefs_dir

    monkeypatch.setenv("TICKLAB_CACHE", str(tmp_path))
    refs = [r for r in find_bundles(REPO / "traces", "nohz") if not r.host_id.startswith("guest-")]
    if not refs:
        pytest.skip("no host nohz bundle in traces/")
    path, session, spot = build_session(refs[0].path)
    assert path.is_relative_to(tmp_path) and path.name.endswith("-tracefs.dat")
    assert session["ticklab"]["condition"] == "tick-on" and session["ticklab"]["run"].startswith("run-")
    capture = refs[0].path / "raw" / session["ticklab"]["run"] / "trace"
    expected = {key: len(frame) for key, frame in read_tracefs_dir(capture).events.items()}
    assert {key: len(frame) for key, frame in read_trace_dat(path).events.items()} == expected and sum(
        expected.values()
    )
    if shutil.which("trace-cmd"):
        report = subprocess.run(["trace-cmd", "report", str(path)], capture_output=True, text=True, timeout=120)
        assert report.returncode == 0, report.stderr[-400:]
        for key, count in expected.items():
            assert report.stdout.count(f" {key.split(':')[1]}:") == count, key


GUI_TOOLS = ("kernelshark", "Xvfb", "xdotool", "import", "convert")


@pytest.mark.skipif(
    any(shutil.which(t) is None for t in GUI_TOOLS),
    reason="needs kernelshark, xvfb, xdotool and imagemagick (apt-get install kernelshark xvfb xdotool imagemagick)",
)
def test_kernelshark_loads_the_session_under_xvfb(tmp_path):
    from ticklab.report.view import write_session

    path, session, spot = build_session(guest_bundle("hrtick"))
    session_file = write_session(session, tmp_path / "session.json")
    display = next(f":{n}" for n in range(90, 200) if not Path(f"/tmp/.X{n}-lock").exists())
    xvfb = subprocess.Popen(
        ["Xvfb", display, "-screen", "0", "1280x900x24"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    env = {**os.environ, "DISPLAY": display, "KS_USER_CACHE_DIR": str(tmp_path)}
    shark = None
    try:
        time.sleep(1)
        shark = subprocess.Popen(
            ["kernelshark", "-s", str(session_file)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )

        def wait_for_window(name: str) -> None:
            deadline = time.monotonic() + 30
            while subprocess.run(["xdotool", "search", "--name", name], env=env, capture_output=True).returncode:
                assert shark.poll() is None and time.monotonic() < deadline, f"KernelShark showed no '{name}' window"
                time.sleep(0.5)

        if os.geteuid() == 0:  # KernelShark first shows a "running with root privileges" notice
            wait_for_window("KernelShark")
            time.sleep(1)
            subprocess.run(["xdotool", "key", "Return"], env=env, check=True)
        wait_for_window("Kernel Shark")
        time.sleep(4)
        assert shark.poll() is None, f"KernelShark exited ({shark.returncode}) loading {session_file}"
        artifacts = (
            REPO / "test-artifacts"
        )  # not under build/: that is the report's, and it refuses files it did not write
        artifacts.mkdir(parents=True, exist_ok=True)
        shot = artifacts / "kernelshark-hrtick.png"
        subprocess.run(["import", "-window", "root", str(shot)], env=env, check=True)
        colours = int(
            subprocess.run(
                ["convert", str(shot), "-format", "%k", "info:"], capture_output=True, text=True, check=True
            ).stdout
        )
        assert colours > 50, "the screenshot is blank"
        # File > Quit: KernelShark saves the session it is showing, which must be ours
        subprocess.run(["xdotool", "mousemove", "20", "10", "click", "1"], env=env, check=True)
        time.sleep(1)
        subprocess.run(["xdotool", "mousemove", "47", "109", "click", "1"], env=env, check=True)
        shark.wait(timeout=20)
        saved = json.loads((tmp_path / "lastsession.json").read_text())
        assert saved["Markers"]["markA"] == {"isSet": True, "row": session["Markers"]["markA"]["row"]}
        assert saved["Markers"]["markB"] == {"isSet": True, "row": session["Markers"]["markB"]["row"]}
        assert saved["data streams"][0]["CPUPlots"] == session["data streams"][0]["CPUPlots"]
        assert saved["data streams"][0]["data"]["file"] == str(path.resolve())
    finally:
        for process in (shark, xvfb):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()


# Issue 56 item 4: every event of a session as KernelShark's own resolver finds it, and the markers on its rows


class KsharkEntry(ctypes.Structure):
    """libkshark 2.x's struct kshark_entry (libkshark.h), as kshark_load_entries returns them."""

    _fields_ = [
        ("next", ctypes.c_void_p),
        ("visible", ctypes.c_uint16),
        ("stream_id", ctypes.c_int16),
        ("event_id", ctypes.c_int16),
        ("cpu", ctypes.c_int16),
        ("pid", ctypes.c_int32),
        ("offset", ctypes.c_int64),
        ("ts", ctypes.c_int64),
    ]


def libkshark():
    try:
        lib = ctypes.CDLL("libkshark.so.2")
    except OSError:
        pytest.skip("libkshark 2 is not installed (apt-get install kernelshark)")
    lib.kshark_instance.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
    lib.kshark_instance.restype = ctypes.c_bool
    lib.kshark_open.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.kshark_get_data_stream.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.kshark_get_data_stream.restype = ctypes.c_void_p
    lib.kshark_find_event_id.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.kshark_event_from_id.argtypes = [ctypes.c_int, ctypes.c_int]
    lib.kshark_event_from_id.restype = ctypes.c_void_p
    lib.kshark_load_entries.argtypes = [
        ctypes.c_void_p,
        ctypes.c_int,
        ctypes.POINTER(ctypes.POINTER(ctypes.POINTER(KsharkEntry))),
    ]
    lib.kshark_load_entries.restype = ctypes.c_ssize_t
    return lib


@pytest.mark.parametrize("claim", ["hrtick", "nohz"])
def test_kernelshark_resolves_every_event_of_the_session_and_the_markers_rows(claim, tmp_path, monkeypatch):
    monkeypatch.setenv("TICKLAB_CACHE", str(tmp_path))
    lib = libkshark()
    path, session, spot = build_session(guest_bundle(claim))
    context = ctypes.c_void_p()
    assert lib.kshark_instance(ctypes.byref(context))
    stream_id = lib.kshark_open(context, str(path).encode())
    assert stream_id >= 0
    stream = lib.kshark_get_data_stream(context, stream_id)
    shown = session["data streams"][0]["filters"]["show event filter"]
    assert TIMER_ENTRY.replace(":", "/") in shown and TIMER_EXIT.replace(":", "/") in shown
    for event in shown:
        assert lib.kshark_find_event_id(stream, event.encode()) >= 0, f"KernelShark skips {event!r}"
    # what the sessions held before: KernelShark's resolver finds no event so named
    assert lib.kshark_find_event_id(stream, TIMER_ENTRY.encode()) < 0
    rows = ctypes.POINTER(ctypes.POINTER(KsharkEntry))()
    assert lib.kshark_load_entries(context, stream_id, ctypes.byref(rows)) > 0
    for mark, (event, timestamp) in (
        ("markA", (spot.first_event, spot.first_ns)),
        ("markB", (spot.last_event, spot.last_ns)),
    ):
        entry = rows[session["Markers"][mark]["row"]].contents
        name = ctypes.string_at(lib.kshark_event_from_id(stream_id, entry.event_id)).decode()
        assert (name, entry.ts) == (event.replace(":", "/"), timestamp), mark
        if spot.cpu is not None:
            assert entry.cpu == spot.cpu


def test_view_of_a_capture_without_saved_task_names_says_so(tmp_path, monkeypatch, capsys):
    from ticklab.cli import main

    monkeypatch.setenv("TICKLAB_CACHE", str(tmp_path))
    refs = [r for r in find_bundles(REPO / "traces", "nohz") if r.host_id == "amd-epyc-2c-6.18.44-fc-v595-vm"]
    if not refs:
        pytest.skip("no tracefs host nohz bundle in traces/")
    _, session, _ = build_session(refs[0].path)
    run = session["ticklab"]["run"]
    assert session["ticklab"]["note"] == (
        f"{refs[0].path / 'raw' / run / 'trace'}: captured before ticklab kept the kernel's saved_cmdlines, so the "
        "trace names no task: KernelShark shows <...> for the tasks it cannot name (recapture to have them)"
    )
    capsys.readouterr()
    assert main(["view", str(refs[0].path), "--session-only", "--session", str(tmp_path / "s.json")]) == 0
    assert f"  note: {session['ticklab']['note']}" in capsys.readouterr().out.splitlines()
    # a capture that kept them: no note
    kept = REPO / (
        "traces/guest-tcg-2vcpu-6.1.0-50-amd64-on-amd-epyc-2c-6.18.44-fc-v857-vm-labhost-kexec/hrtick/"
        "20261129T093027Z-host-boot-kernels"
    )
    if kept.is_dir():
        assert build_session(kept, "run-001")[1]["ticklab"]["note"] is None
