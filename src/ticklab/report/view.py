"""`ticklab view <bundle> [--run R]`: open a run's trace.dat in KernelShark with a session that presets
what the claim's finding is about (KernelShark 2.x session documents, type "kshark.config.session").

The session shows the CPUs that matter, filters the table and graph to the claim's events, and puts
markers A and B on the interesting spot, zoomed around it; each claim says which in its ``ViewPreset``
(ticklab.claims; the finders are in ticklab.trace.tracespots). Without a preset: every CPU, every event, and
A/B on the longest local timer interrupt.

KernelShark places markers by entry row (its index in the trace's entries in time order), not by
timestamp, so the rows are computed from the trace. The session also carries the file's mtime,
which KernelShark checks. A run whose trace.dat is stored xz'd is decompressed to the cache first.

The cache (``$TICKLAB_CACHE/view``: the session file and the traces made for KernelShark) is written through
ticklab.safefiles only: each file replaced whole through the directory's descriptor, and a link, hard link, FIFO
or device at its name refused with one line, never written through or opened.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pandas as pd

from ..bundle import Bundle, RunRecord, load_bundle
from ..claimids import claim_ids
from ..claims import ViewPreset, get_claim
from ..paths import cache_dir
from ..safefiles import OwnedDir, UnsafeFileError, read_bytes, replaceable
from ..trace import rawfile
from ..trace.ingest import Trace, read_trace_dat
from ..trace.tracedat import tracefs_to_trace_dat
from ..trace.tracespots import Spot, longest_timer_interrupt


class ViewError(ValueError):
    """The bundle or run cannot be viewed; the message says why."""


def entry_order(trace: Trace) -> pd.DataFrame:
    """Every event of the trace in KernelShark's row order (time, then CPU): timestamp, cpu, event."""
    frames = [frame[["timestamp", "cpu"]].assign(event=key) for key, frame in trace.events.items() if len(frame)]
    if not frames:
        raise ViewError(f"{trace.source}: the trace holds no events")
    merged = pd.concat(frames, ignore_index=True)
    return merged.sort_values(["timestamp", "cpu"], kind="stable").reset_index(drop=True)


def row_of(order: pd.DataFrame, timestamp: int, cpu: int | None, event: str) -> int:
    """The row of the entry with this timestamp (and CPU and event) in KernelShark's order."""
    match = order[(order["timestamp"] == timestamp) & (order["event"] == event)]
    if cpu is not None:
        match = match[match["cpu"] == cpu]
    if match.empty:
        raise ViewError(f"no {event} entry at {timestamp} ns" + (f" on CPU {cpu}" if cpu is not None else ""))
    return int(match.index[0])


def interesting_spot(preset: ViewPreset, trace: Trace, cpus: list[int], measured_cpu: int | None) -> Spot:
    spot = (preset.spot(trace, cpus, measured_cpu) if preset.spot else None) or longest_timer_interrupt(trace, cpus)
    if spot is None:
        raise ViewError(f"{trace.source}: no local timer interrupts to mark")
    return spot


def _measured_run(bundle: Bundle, run: str | None) -> RunRecord:
    records = [r for r in bundle.manifest.runs if r.trace]
    if not records:
        raise ViewError(f"{bundle.path}: no run of this bundle recorded a trace")
    if run is None:
        return next((r for r in records if not r.warmup), records[0])
    found = next((r for r in records if r.run == run), None)
    if found is None:
        raise ViewError(f"{bundle.path}: no traced run {run!r} (traced runs: {', '.join(r.run for r in records)})")
    return found


def _owned_parent(path: Path) -> OwnedDir:
    """The directory ``path`` is written in, opened by descriptor: below the cache root each component is made or
    opened without following a link (the root, like a --session path's directory, is the user's choice)."""
    root = cache_dir()
    try:
        relative = path.parent.relative_to(root)
    except ValueError:
        return OwnedDir(path.parent)
    if not relative.parts:
        return OwnedDir(root)
    with OwnedDir(root) as owned:
        return owned.subdir(relative)


def _cached(target: Path, make) -> Path:
    """``target`` in the cache: there already as a regular file of its own (a cache hit), else written whole from
    ``make()``; a link, hard link, FIFO or device at its name is refused (one line), never read or written through."""
    try:
        with _owned_parent(target) as owned:
            found = owned.entry(target.name)
            if not replaceable(found):
                owned.check_replaceable(target.name)  # the one line naming what is there
            if found is None:
                owned.write_atomic(target.name, make())
    except UnsafeFileError as exc:
        raise ViewError(str(exc)) from None
    return target


def _tracefs_bytes(directory: Path) -> bytes:
    """A tracefs capture as trace.dat bytes, made in a private directory of this process's (nobody else can plant
    anything where tracefs_to_trace_dat writes)."""
    with tempfile.TemporaryDirectory(prefix="ticklab-view-") as private:
        made = tracefs_to_trace_dat(directory, Path(private) / "trace.dat")
        return read_bytes(made, 2 * rawfile.RAW_FILE_LIMIT)  # a header and the CPUs' raw data


def trace_file(directory: Path) -> Path:
    """The run's trace.dat as KernelShark can open it: decompressed into the cache when stored xz'd, or written
    there from a tracefs capture (ticklab.trace.tracedat) when the run was not recorded with trace-cmd."""
    plain, packed = directory / "trace.dat", directory / "trace.dat.xz"
    if plain.is_file():
        return plain
    if not packed.is_file():
        if not (directory / "header_page").is_file():
            raise ViewError(f"{directory}: neither a trace.dat nor a tracefs capture")
        digest = hashlib.sha256()
        for path in sorted(p for p in directory.rglob("*") if p.is_file()):
            digest.update(path.name.encode() + path.read_bytes())
        target = cache_dir() / "view" / (digest.hexdigest()[:16] + "-tracefs.dat")
        return _cached(target, lambda: _tracefs_bytes(directory))
    target = cache_dir() / "view" / (hashlib.sha256(packed.read_bytes()).hexdigest()[:16] + "-trace.dat")
    return _cached(target, lambda: rawfile.read_bytes(packed))


def kernelshark_event_name(event: str) -> str:
    """An event as KernelShark's session loader resolves it: ``system/name``. Its tep resolver
    (``tepdata_find_event_id``, what ``kshark_find_event_id`` calls for a trace.dat) splits the name at the first
    "/" and skips a name it cannot find, so ``irq_vectors:local_timer_entry``, ticklab's own spelling (trace-cmd's
    ``-e system:name``), would drop out of the filter; tests/test_view.py asks libkshark itself."""
    system, sep, name = event.replace(":", "/", 1).partition("/")
    if not sep or not system or not name:
        raise ViewError(f"{event!r}: not an event as system:name or system/name")
    return f"{system}/{name}"


def task_names_note(directory: Path) -> str | None:
    """Why KernelShark will show ``<...>`` for most tasks of a run, or None: a tracefs capture made before ticklab kept
    the kernel's saved_cmdlines beside it (issue 41 item 6) has no pid -> command list to name them from."""
    if (directory / "trace.dat").is_file() or (directory / "trace.dat.xz").is_file():
        return None  # trace-cmd's own file carries its command lines
    if (directory / "saved_cmdlines").is_file() or (directory / "saved_cmdlines.xz").is_file():
        return None
    return (
        f"{directory}: captured before ticklab kept the kernel's saved_cmdlines, so the trace names no task: "
        "KernelShark shows <...> for the tasks it cannot name (recapture to have them)"
    )


def build_session(bundle_path: Path | str, run: str | None = None) -> tuple[Path, dict, Spot]:
    """(trace.dat, session document, the spot it marks) for a run of a bundle; ``session["ticklab"]`` names the
    run and condition it opened (KernelShark ignores keys it does not know)."""
    bundle = load_bundle(bundle_path)
    record = _measured_run(bundle, run)
    path = trace_file(Path(bundle_path) / "raw" / record.run / record.trace["directory"])
    trace = read_trace_dat(path)
    claim = bundle.manifest.claim
    preset = get_claim(claim).view if claim in claim_ids() else ViewPreset()
    cpus = sorted(int(c) for c in pd.concat([f["cpu"] for f in trace.events.values() if len(f)]).unique())
    measured = record.guest.get("nproc") or bundle.manifest.host_fact("nproc")
    measured_cpu = int(measured) - 1 if measured else None
    spot = interesting_spot(preset, trace, cpus, measured_cpu)
    order = entry_order(trace)
    row_a = row_of(order, spot.first_ns, spot.cpu, spot.first_event)
    row_b = row_of(order, spot.last_ns, spot.cpu, spot.last_event)
    margin = max(spot.last_ns - spot.first_ns, 200_000)
    shown_cpus = [measured_cpu] if preset.measured_cpu_only and measured_cpu in cpus else cpus
    filters = {"type": "kshark.config.filter", "filter mask": 7}
    if preset.events:
        filters["show event filter"] = [kernelshark_event_name(event) for event in preset.events]
    session = {
        "type": "kshark.config.session",
        "MainWindow": [1200, 800],
        "Splitter": [420, 300],
        "Model": {
            "type": "kshark.config.model",
            "range": [spot.first_ns - margin, spot.last_ns + margin],
            "bins": 1000,
        },
        "data streams": [
            {
                "type": "kshark.config.stream",
                "stream id": 0,
                "data": {
                    "type": "kshark.config.data",
                    "file": str(path.resolve()),
                    "name": "top buffer",
                    "time": int(os.stat(path).st_mtime),
                },
                "filters": filters,
                # KernelShark 2.2 expects the plugins object; missed_events marks lost-event gaps
                "plugins": {"type": "kshark.config.plugins", "registered": [["missed_events", True]]},
                "CPUPlots": shown_cpus,
                "TaskPlots": [],
            }
        ],
        "ComboPlots": [],
        "Markers": {
            "type": "kshark.config.markers",
            "markA": {"isSet": True, "row": row_a},
            "markB": {"isSet": True, "row": row_b},
            "Active": "B",
        },
        "ViewTop": max(row_a - 2, 0),
        "ColorScheme": 0.75,
        "User Plugins": {"type": "kshark.config.plugins", "obj. files": []},
        "ticklab": {
            "run": record.run,
            "condition": record.condition,
            "claim": claim,
            "note": task_names_note(Path(bundle_path) / "raw" / record.run / record.trace["directory"]),
        },
    }
    return path, session, spot


def write_session(session: dict, out: Path) -> Path:
    """Write the session file ``out`` whole, through its directory's descriptor (a link, hard link, FIFO or device
    at its name is refused with one line)."""
    out = Path(out)
    try:
        with _owned_parent(out) as owned:
            owned.write_atomic(out.name, (json.dumps(session, indent=2) + "\n").encode())
    except UnsafeFileError as exc:
        raise ViewError(str(exc)) from None
    return out


def open_in_kernelshark(session_path: Path) -> subprocess.Popen:
    if shutil.which("kernelshark") is None:
        raise ViewError(
            "kernelshark is not installed (apt-get install kernelshark); the session file is "
            f"{session_path}: open it with 'kernelshark -s {session_path}'"
        )
    return subprocess.Popen(["kernelshark", "-s", str(session_path)])
