"""Quantities derived from ingested traces that more than one claim uses (timer interrupts, hrtimers)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from .ingest import Trace

TIMER_ENTRY = "irq_vectors:local_timer_entry"
TIMER_EXIT = "irq_vectors:local_timer_exit"
HRTIMER_EXPIRE = "timer:hrtimer_expire_entry"


def timer_interrupts(trace: Trace, cpu: int) -> pd.DataFrame:
    """Local timer interrupts on one CPU: entry and exit timestamps (ns) and duration (ns)."""
    entries = trace.table(TIMER_ENTRY)
    exits = trace.table(TIMER_EXIT)
    start = np.sort(entries.loc[entries["cpu"] == cpu, "timestamp"].to_numpy(dtype=np.int64))
    end = np.sort(exits.loc[exits["cpu"] == cpu, "timestamp"].to_numpy(dtype=np.int64))
    following = np.searchsorted(end, start, side="left")
    paired = following < len(end)
    start, stop = start[paired], end[following[paired]]
    if len(start) > 1:  # an entry whose exit was not recorded would pair with the next interrupt's exit
        keep = np.append(stop[:-1] < start[1:], True)
        start, stop = start[keep], stop[keep]
    return pd.DataFrame({"entry_ns": start, "exit_ns": stop, "duration_ns": stop - start})


def timer_interrupt_rows(trace: Trace, cpu: int) -> list[dict]:
    """Rate, duration and share of time of the local timer interrupt on ``cpu``."""
    interrupts = timer_interrupts(trace, cpu)
    if len(interrupts) < 2:
        return [{"metric": "local_timer_irqs", "value": len(interrupts), "unit": "count"}]
    span_s = (interrupts["entry_ns"].iloc[-1] - interrupts["entry_ns"].iloc[0]) / 1e9
    return [
        {"metric": "local_timer_irqs", "value": len(interrupts), "unit": "count"},
        {"metric": "local_timer_irq_rate_hz", "value": (len(interrupts) - 1) / span_s, "unit": "Hz"},
        {"metric": "local_timer_irq_duration_median_us", "value": interrupts["duration_ns"].median() / 1e3, "unit": "us"},
        {"metric": "local_timer_irq_duration_p99_us", "value": interrupts["duration_ns"].quantile(0.99) / 1e3, "unit": "us"},
        {"metric": "local_timer_irq_time_fraction", "value": interrupts["duration_ns"].sum() / 1e9 / span_s, "unit": "fraction"},
    ]


def spurious_interrupts(trace: Trace, cpu: int) -> pd.DataFrame:
    """The local timer interrupts on ``cpu`` during which no hrtimer expired (they found nothing to run)."""
    interrupts = timer_interrupts(trace, cpu)
    expires = trace.table(HRTIMER_EXPIRE)
    stamps = np.sort(expires.loc[expires["cpu"] == cpu, "timestamp"].to_numpy(dtype=np.int64))
    inside = np.searchsorted(stamps, interrupts["exit_ns"].to_numpy()) - np.searchsorted(stamps, interrupts["entry_ns"].to_numpy())
    return interrupts[inside == 0]


def spurious_ratio(trace: Trace, cpu: int | None = None) -> float:
    """Share of local timer interrupts during which no hrtimer expired (the interrupt found nothing to run)."""
    cpus = sorted(trace.table(TIMER_ENTRY)["cpu"].unique()) if cpu is None else [cpu]
    empty = total = 0
    for one in cpus:
        empty += len(spurious_interrupts(trace, int(one)))
        total += len(timer_interrupts(trace, int(one)))
    return empty / total if total else float("nan")


# -- clockevent reprograms (seed 002) -----------------------------------------------------------------
FUNCTION_CALL = "ftrace:function"  # one event per call of a function the function tracer was filtered to
REPROGRAM_FUNCTION = "clockevents_program_event"


class TraceContentError(ValueError):
    """A trace cannot answer the question asked of it; the message says why."""


def clockevent_reprograms(trace: Trace) -> pd.DataFrame | None:
    """Every call of ``clockevents_program_event`` the function tracer recorded (timestamp, cpu), or None
    where this trace holds no function-tracer events (it was recorded without them).

    The experiment filters the function tracer to that one function (``trace.functions``); a trace with
    calls of more than one function cannot say which were reprograms, and is refused rather than guessed."""
    if FUNCTION_CALL not in trace.keys():
        return None
    calls = trace.table(FUNCTION_CALL)
    if calls["ip"].nunique() > 1:
        raise TraceContentError(f"{trace.source}: the function tracer recorded {calls['ip'].nunique()} different "
                                f"functions; counting reprograms needs it filtered to {REPROGRAM_FUNCTION} alone")
    return calls[["timestamp", "cpu"]].reset_index(drop=True)


def inside_timer_interrupts(trace: Trace, events: pd.DataFrame) -> np.ndarray:
    """For each event (timestamp, cpu), whether it happened inside a local timer interrupt on its CPU."""
    inside = np.zeros(len(events), dtype=bool)
    for cpu in events["cpu"].unique():
        interrupts = timer_interrupts(trace, int(cpu))
        mine = (events["cpu"] == cpu).to_numpy()
        stamps = events.loc[mine, "timestamp"].to_numpy(dtype=np.int64)
        before = np.searchsorted(interrupts["entry_ns"].to_numpy(), stamps, side="right") - 1
        valid = before >= 0
        ends = interrupts["exit_ns"].to_numpy()
        inside[np.flatnonzero(mine)[valid]] = stamps[valid] <= ends[before[valid]]
    return inside


def traced_span_s(trace: Trace, keys: list[str]) -> float:
    """Seconds from the first to the last event of ``keys`` (the traced part of the workload)."""
    stamps = [trace.table(key)["timestamp"].to_numpy(dtype=np.int64) for key in keys if key in trace.keys()]
    stamps = np.concatenate(stamps) if stamps else np.array([], dtype=np.int64)
    return (stamps.max() - stamps.min()) / 1e9 if len(stamps) > 1 else float("nan")


def reprogram_rows(trace: Trace, span_s: float) -> list[dict]:
    """Counted clockevent reprograms: how many, per second of ``span_s``, and the share made inside a local
    timer interrupt (the interrupt re-arming the device for the next hrtimer, with no hrtimer_start).
    Empty where the trace did not record them."""
    calls = clockevent_reprograms(trace)
    if calls is None:
        return []
    inside = inside_timer_interrupts(trace, calls)
    return [
        {"metric": "clockevent_reprograms", "value": len(calls), "unit": "count"},
        {"metric": "clockevent_reprograms_per_s", "value": len(calls) / span_s, "unit": "1/s"},
        {"metric": "clockevent_reprograms_in_timer_irq_share",
         "value": inside.mean() if len(calls) else float("nan"), "unit": "fraction"},
    ]
