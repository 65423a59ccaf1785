"""Where in a trace a claim's finding shows: the spot ``ticklab view`` puts KernelShark's markers A and B on.

A claim picks its finder in its :class:`ticklab.claims.ViewPreset`; a finder takes the trace, the CPUs it
holds and the run's measured CPU (None when unknown) and returns a :class:`Spot`, or None when the trace
has nothing of the kind (``ticklab view`` then marks the longest local timer interrupt)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .ingest import Trace
from .tracemetrics import TIMER_ENTRY, TIMER_EXIT, spurious_interrupts, timer_interrupts


@dataclass
class Spot:
    what: str
    first_ns: int
    last_ns: int
    cpu: int | None
    first_event: str = TIMER_ENTRY  # the events at first_ns and last_ns: they pick the markers' rows
    last_event: str = TIMER_EXIT


def longest_tick_gap(trace: Trace, cpus: list[int], measured_cpu: int | None) -> Spot | None:
    """The longest stretch without a local timer interrupt on the measured CPU."""
    if measured_cpu is None:
        return None
    irqs = timer_interrupts(trace, measured_cpu)
    if len(irqs) < 2:
        return None
    gaps = irqs["entry_ns"].to_numpy()[1:] - irqs["exit_ns"].to_numpy()[:-1]
    i = int(np.argmax(gaps))
    return Spot(
        f"longest stretch without a timer interrupt on CPU {measured_cpu}: {gaps[i] / 1e6:.3f} ms",
        int(irqs["exit_ns"].iloc[i]),
        int(irqs["entry_ns"].iloc[i + 1]),
        measured_cpu,
        first_event=TIMER_EXIT,
        last_event=TIMER_ENTRY,
    )


def first_spurious_interrupt(trace: Trace, cpus: list[int], measured_cpu: int | None) -> Spot | None:
    """The first hrtimer interrupt that found nothing to expire, on the lowest CPU that had one."""
    for cpu in cpus:
        spurious = spurious_interrupts(trace, cpu)
        if len(spurious):
            row = spurious.iloc[0]
            return Spot(
                f"first spurious hrtimer interrupt on CPU {cpu}", int(row["entry_ns"]), int(row["exit_ns"]), cpu
            )
    return None


def longest_timer_interrupt(trace: Trace, cpus: list[int], measured_cpu: int | None = None) -> Spot | None:
    longest = None
    for cpu in cpus:
        irqs = timer_interrupts(trace, cpu)
        if len(irqs) and (longest is None or irqs["duration_ns"].max() > longest[0]):
            row = irqs.loc[irqs["duration_ns"].idxmax()]
            longest = (int(row["duration_ns"]), int(row["entry_ns"]), int(row["exit_ns"]), cpu)
    if longest is None:
        return None
    return Spot(
        f"longest local timer interrupt on CPU {longest[3]}: {longest[0] / 1e3:.1f} µs",
        longest[1],
        longest[2],
        longest[3],
    )
