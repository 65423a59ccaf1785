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
