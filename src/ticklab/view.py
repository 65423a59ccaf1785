"""`ticklab view <bundle> [--run R]`: open a run's trace.dat in KernelShark with a session that presets
what the claim's finding is about (KernelShark 2.x session documents, type "kshark.config.session").

The session shows the CPUs that matter, filters the table and graph to the claim's events, and puts
markers A and B on the interesting spot, zoomed around it:

    nohz     the measured (last) CPU; A/B bound the longest stretch without a local timer interrupt
    hrtick   every CPU; A/B bound the first hrtimer interrupt that found nothing to expire (spurious)
    other    every CPU; A/B on the longest local timer interrupt

KernelShark places markers by entry row (its index in the trace's entries in time order), not by
timestamp, so the rows are computed from the trace. The session also carries the file's mtime,
which KernelShark checks. A run whose trace.dat is stored xz'd is decompressed to the cache first.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from . import rawfile
from .bundle import load_bundle
from .ingest import Trace, read_trace_dat
from .lab.cache import cache_dir
from .tracedat import tracefs_to_trace_dat
from .tracemetrics import TIMER_ENTRY, TIMER_EXIT, spurious_interrupts, timer_interrupts

CLAIM_EVENTS = {
    "nohz": ["irq_vectors/local_timer_entry", "irq_vectors/local_timer_exit", "timer/hrtimer_expire_entry", "timer/tick_stop"],
    "hrtick": ["irq_vectors/local_timer_entry", "irq_vectors/local_timer_exit", "timer/hrtimer_expire_entry",
               "timer/hrtimer_start"],
}


class ViewError(ValueError):
    """The bundle or run cannot be viewed; the message says why."""


@dataclass
class Spot:
    what: str
    first_ns: int
    last_ns: int
    cpu: int | None


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


def interesting_spot(claim: str, trace: Trace, cpus: list[int], measured_cpu: int | None) -> Spot:
    if claim == "nohz" and measured_cpu is not None:
        irqs = timer_interrupts(trace, measured_cpu)
        if len(irqs) >= 2:
            gaps = irqs["entry_ns"].to_numpy()[1:] - irqs["exit_ns"].to_numpy()[:-1]
            i = int(np.argmax(gaps))
            return Spot(f"longest stretch without a timer interrupt on CPU {measured_cpu}: {gaps[i] / 1e6:.3f} ms",
                        int(irqs["exit_ns"].iloc[i]), int(irqs["entry_ns"].iloc[i + 1]), measured_cpu)
    if claim == "hrtick":
        for cpu in cpus:
            spurious = spurious_interrupts(trace, cpu)
            if len(spurious):
                row = spurious.iloc[0]
                return Spot(f"first spurious hrtimer interrupt on CPU {cpu}", int(row["entry_ns"]), int(row["exit_ns"]), cpu)
    longest = None
    for cpu in cpus:
        irqs = timer_interrupts(trace, cpu)
        if len(irqs) and (longest is None or irqs["duration_ns"].max() > longest[0]):
            row = irqs.loc[irqs["duration_ns"].idxmax()]
            longest = (int(row["duration_ns"]), int(row["entry_ns"]), int(row["exit_ns"]), cpu)
    if longest is None:
        raise ViewError(f"{trace.source}: no local timer interrupts to mark")
    return Spot(f"longest local timer interrupt on CPU {longest[3]}: {longest[0] / 1e3:.1f} µs", longest[1], longest[2], longest[3])


def _measured_run(bundle, run: str | None) -> dict:
    records = [r for r in bundle.manifest["runs"] if r.get("trace")]
    if not records:
        raise ViewError(f"{bundle.path}: no run of this bundle recorded a trace")
    if run is None:
        return next((r for r in records if not r.get("warmup")), records[0])
    found = next((r for r in records if r["run"] == run), None)
    if found is None:
        raise ViewError(f"{bundle.path}: no traced run {run!r} (traced runs: {', '.join(r['run'] for r in records)})")
    return found


def trace_file(directory: Path) -> Path:
    """The run's trace.dat as KernelShark can open it: decompressed into the cache when stored xz'd, or written
    there from a tracefs capture (ticklab.tracedat) when the run was not recorded with trace-cmd."""
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
        if not target.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(target.name + ".part")
            tracefs_to_trace_dat(directory, partial)
            partial.replace(target)
        return target
    target = cache_dir() / "view" / (hashlib.sha256(packed.read_bytes()).hexdigest()[:16] + "-trace.dat")
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(rawfile.read_bytes(packed))
    return target


def build_session(bundle_path: Path | str, run: str | None = None) -> tuple[Path, dict, Spot]:
    """(trace.dat, session document, the spot it marks) for a run of a bundle; ``session["ticklab"]`` names the
    run and condition it opened (KernelShark ignores keys it does not know)."""
    bundle = load_bundle(bundle_path)
    record = _measured_run(bundle, run)
    path = trace_file(Path(bundle_path) / "raw" / record["run"] / record["trace"]["directory"])
    trace = read_trace_dat(path)
    claim = bundle.manifest["claim"]
    cpus = sorted(int(c) for c in pd.concat([f["cpu"] for f in trace.events.values() if len(f)]).unique())
    measured = (record.get("guest") or {}).get("nproc") or bundle.manifest.get("host", {}).get("nproc")
    measured_cpu = int(measured) - 1 if measured else None
    spot = interesting_spot(claim, trace, cpus, measured_cpu)
    order = entry_order(trace)
    exit_key = TIMER_EXIT if spot.what.startswith(("first spurious", "longest local")) else TIMER_ENTRY
    first_key = TIMER_EXIT if spot.what.startswith("longest stretch") else TIMER_ENTRY
    row_a = row_of(order, spot.first_ns, spot.cpu, first_key)
    row_b = row_of(order, spot.last_ns, spot.cpu, exit_key)
    margin = max(spot.last_ns - spot.first_ns, 200_000)
    shown_cpus = [measured_cpu] if claim == "nohz" and measured_cpu in cpus else cpus
    filters = {"type": "kshark.config.filter", "filter mask": 7}
    if claim in CLAIM_EVENTS:
        filters["show event filter"] = CLAIM_EVENTS[claim]
    session = {
        "type": "kshark.config.session",
        "MainWindow": [1200, 800], "Splitter": [420, 300],
        "Model": {"type": "kshark.config.model", "range": [spot.first_ns - margin, spot.last_ns + margin], "bins": 1000},
        "data streams": [{
            "type": "kshark.config.stream", "stream id": 0,
            "data": {"type": "kshark.config.data", "file": str(path.resolve()), "name": "top buffer",
                     "time": int(os.stat(path).st_mtime)},
            "filters": filters,
            # KernelShark 2.2 expects the plugins object; missed_events marks lost-event gaps
            "plugins": {"type": "kshark.config.plugins", "registered": [["missed_events", True]]},
            "CPUPlots": shown_cpus, "TaskPlots": [],
        }],
        "ComboPlots": [],
        "Markers": {"type": "kshark.config.markers", "markA": {"isSet": True, "row": row_a},
                    "markB": {"isSet": True, "row": row_b}, "Active": "B"},
        "ViewTop": max(row_a - 2, 0), "ColorScheme": 0.75,
        "User Plugins": {"type": "kshark.config.plugins", "obj. files": []},
        "ticklab": {"run": record["run"], "condition": record.get("condition", ""), "claim": claim},
    }
    return path, session, spot


def write_session(session: dict, out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(session, indent=2) + "\n")
    return out


def open_in_kernelshark(session_path: Path) -> subprocess.Popen:
    if shutil.which("kernelshark") is None:
        raise ViewError("kernelshark is not installed (apt-get install kernelshark); the session file is "
                        f"{session_path}: open it with 'kernelshark -s {session_path}'")
    return subprocess.Popen(["kernelshark", "-s", str(session_path)])
