"""What a tick costs the workload (issue 26): work lost per tick as the busy thread sees it, two independent ways.

* From FTQ's own samples (:func:`ftq_tick_cost`): the quanta that hold a tick against the median of the tick-free
  quanta of the same run; the loss, in units of work, is turned into µs at the tick-free rate of work.
* From the gap detector (tools/gapdet.c, :func:`gap_tick_cost`): every gap a SCHED_FIFO loop reading
  CLOCK_MONOTONIC saw, the tick's told from the others by their phase in the tick period.

Both place the tick by its period in CLOCK_MONOTONIC, the clock the tick's hrtimer runs on and the clock ftq and
gapdet read: ticks fall at one phase of TICK_NSEC = 1e9/HZ, found from the data as the phase where the work lost
is largest; the trace gives the tick rate, from which HZ is read (:func:`nominal_period_ns`). Where gapdet ran
under a trace of its own on the ``mono`` trace clock (CLOCK_MONOTONIC; the nohz experiments' traced per-run
extra), :func:`matched_gap_tick_cost` matches every traced tick to the gap it caused, one by one, and splits the
workload's loss into the part before the first tracepoint, the traced span and the part after it.

And the sound lost-work figure (:func:`ftq_lost_fraction`): 1 − mean work per quantum / median work of the
tick-free quanta, where 1 − mean/max also counts how much faster than usual the fastest quantum ran.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

NOMINAL_HZ = (100, 250, 300, 1000)
GUARD_NS = 20_000  # a tick's cost may start this long before its hrtimer's time (interrupt delivery, entry code)
SPILL_NS = 100_000  # ... and end this long after it: quanta this close to a tick are the tick's, not the reference
MIN_REFERENCE = 20  # tick-free quanta (and ticks) needed for a reference


class TickCostError(ValueError):
    """The input cannot give the asked-for cost; the message says why in one line."""


def nominal_period_ns(tick_rate_hz: float) -> int | None:
    """TICK_NSEC for the HZ nearest a measured tick rate (the tick's hrtimer fires every 1e9/HZ ns of
    CLOCK_MONOTONIC, rounded as the kernel rounds), or None when the rate is under half of every nominal HZ (no
    periodic tick: nohz_full with one task)."""
    if not np.isfinite(tick_rate_hz) or tick_rate_hz <= 0:
        return None
    hz = min(NOMINAL_HZ, key=lambda h: abs(np.log(h / tick_rate_hz)))
    return None if tick_rate_hz < hz / 2 else (1_000_000_000 + hz // 2) // hz


def tick_of_quantum(end_ns, quantum_ns: int, period_ns: int, phase_ns: float) -> np.ndarray:
    """Per quantum, the index k of the tick (at phase + k × period) whose window [tick − GUARD_NS, tick + SPILL_NS]
    it overlaps, or -1 for a tick-free quantum. Quanta start where the previous one ended (ftq's deadlines)."""
    end = np.asarray(end_ns, dtype=np.int64)
    start = np.concatenate([[end[0] - quantum_ns], end[:-1]])
    k = np.ceil((start - SPILL_NS - phase_ns) / period_ns)
    return np.where(phase_ns + k * period_ns < end + GUARD_NS, k, -1).astype(np.int64)


def _median(values: np.ndarray) -> float:
    """np.median's value (the middle one, or the mean of the two middle ones) without its per-call overhead, which
    dominated tick_phase's few thousand calls a run."""
    half = len(values) // 2
    if len(values) % 2:
        return float(np.partition(values, half)[half])
    part = np.partition(values, [half - 1, half])
    return float((part[half - 1] + part[half]) / 2)


def _per_tick_loss(counts, ticks) -> tuple[float, np.ndarray]:
    """(reference, work lost per tick in work units) for one assignment of quanta to ticks; the first and last tick
    are left out (the run may cut their window)."""
    free = counts[ticks < 0]
    if len(free) < MIN_REFERENCE:
        return np.nan, np.array([])
    reference = _median(free)
    held = ticks >= 0
    tick = ticks[held]  # non-decreasing: quanta are in time order, and so are the ticks they hold
    first_of_tick = np.flatnonzero(np.r_[True, tick[1:] != tick[:-1]])
    loss = np.add.reduceat(reference - counts[held], first_of_tick) if len(tick) else np.array([])
    return reference, loss[1:-1]


def tick_phase(counts, end_ns, quantum_ns: int, period_ns: int, steps: int = 400) -> float:
    """The phase (ns, in the quanta's clock, modulo the period) at which ticks fall: where the quanta near a tick lose
    the most work per tick against the tick-free ones. A grid of ``steps`` phases, then a finer one around the best."""
    counts = np.asarray(counts, dtype=float)

    def score(phase):
        _, loss = _per_tick_loss(counts, tick_of_quantum(end_ns, quantum_ns, period_ns, phase % period_ns))
        return loss.mean() if len(loss) >= MIN_REFERENCE else -np.inf

    grid = np.arange(steps) * (period_ns / steps)
    best = grid[int(np.argmax([score(p) for p in grid]))]
    fine = best + np.linspace(-period_ns / steps, period_ns / steps, 11)
    return float(fine[int(np.argmax([score(p) for p in fine]))] % period_ns)


def ftq_lost_fraction(counts, reference: float) -> float:
    """Work lost against a reference quantum: 1 − mean work per quantum / reference."""
    if not reference > 0:
        raise TickCostError(f"reference work per quantum is {reference!r}; it must be positive")
    return float(1 - np.mean(counts) / reference)


def ftq_tick_cost(counts, end_ns, quantum_ns: int, period_ns: int | None) -> dict:
    """FTQ's own estimate of the work a tick takes from the thread, for one run.

    ``period_ns`` is TICK_NSEC (:func:`nominal_period_ns`), None where the run had no periodic tick: then every
    quantum is the reference and no cost per tick is given. Returns reference (median work of the tick-free quanta),
    lost_fraction (1 − mean/reference), lost_fraction_max (the old 1 − mean/max, for comparison), and where ticks
    were placed: phase_ns, n (ticks), tick_lost_us_median and _p99 (per tick: the work the quanta within
    [tick − GUARD_NS, tick + SPILL_NS] lost against the reference, at the reference's rate of work, in µs),
    tick_lost_us_mean, reason (why a cost is missing, else "")."""
    counts = np.asarray(counts, dtype=float)
    end_ns = np.asarray(end_ns, dtype=np.int64)
    if len(counts) < 2 or len(counts) != len(end_ns):
        raise TickCostError(f"{len(counts)} work counts for {len(end_ns)} quantum ends: need matching lengths ≥ 2")
    if counts.max() <= 0:
        raise TickCostError("no quantum counted any work")
    out = {"quanta": len(counts), "lost_fraction_max": float(1 - counts.mean() / counts.max()), "phase_ns": np.nan,
           "n": 0, "tick_lost_us_median": np.nan, "tick_lost_us_p99": np.nan, "tick_lost_us_mean": np.nan}
    if period_ns is None:
        reference = float(np.median(counts))
        return {**out, "reference": reference, "lost_fraction": ftq_lost_fraction(counts, reference),
                "reason": "no periodic tick in this run: every quantum is tick-free"}
    if quantum_ns + GUARD_NS + SPILL_NS >= period_ns:
        return {**out, "reference": np.nan, "lost_fraction": np.nan,
                "reason": f"every {quantum_ns / 1e3:g} µs quantum is near a tick (tick period {period_ns / 1e3:g} µs): "
                          "no tick-free reference"}
    phase = tick_phase(counts, end_ns, quantum_ns, period_ns)
    reference, loss = _per_tick_loss(counts, tick_of_quantum(end_ns, quantum_ns, period_ns, phase))
    if len(loss) < MIN_REFERENCE:
        return {**out, "reference": reference, "lost_fraction": np.nan, "reason": "too few tick-free quanta or ticks"}
    lost_us = loss / reference * quantum_ns / 1e3
    return {**out, "reference": reference, "lost_fraction": ftq_lost_fraction(counts, reference), "phase_ns": phase,
            "n": int(len(lost_us)), "tick_lost_us_median": float(np.median(lost_us)),
            "tick_lost_us_p99": float(np.quantile(lost_us, 0.99)), "tick_lost_us_mean": float(lost_us.mean()),
            "reason": ""}


TICK_WINDOW_NS = 50_000  # gaps starting within this of the tick's phase are the tick's


def gap_tick_cost(gaps: pd.DataFrame, header: dict, period_ns: int | None, bin_ns: int = 10_000) -> dict:
    """The gap detector's cost per tick, for one run: gaps (start_ns, gap_ns from read_gapdet) folded onto the tick
    period in CLOCK_MONOTONIC (t0_ns + start_ns); the tick's phase is the bin of ``bin_ns`` holding the most gap
    time, the tick's gaps those starting within TICK_WINDOW_NS of it. Each tick period's tick gaps are summed, less
    one read's median cost per gap (the detector's own loop, from its calibration). Returns n (tick periods in the
    run), tick_gap_us_median/_p99/_mean (per tick period, 0 where no gap passed the threshold), ticks_with_gap,
    tick_share_of_gap_time (the share of all gap time the tick explains), gap_fraction (all gap time / run time),
    tick_fraction (tick gap time / run time), reason."""
    duration, read_ns = float(header["duration_ns"]), float(header["read_ns_median"])
    lengths = gaps["gap_ns"].to_numpy(dtype=float) - read_ns
    total = float(lengths.sum())
    out = {"gaps": len(gaps), "gap_fraction": total / duration, "n": 0, "ticks_with_gap": 0,
           "tick_gap_us_median": np.nan, "tick_gap_us_p99": np.nan, "tick_gap_us_mean": np.nan,
           "tick_share_of_gap_time": np.nan, "tick_fraction": np.nan, "phase_ns": np.nan}
    if period_ns is None:
        return {**out, "reason": "no periodic tick in this run"}
    if gaps.empty:
        return {**out, "reason": "no gaps over the threshold"}
    absolute = float(header["t0_ns"]) + gaps["start_ns"].to_numpy(dtype=float)
    phase = np.mod(absolute, period_ns)
    bins = int(np.ceil(period_ns / bin_ns))
    weight = np.bincount(np.minimum((phase // bin_ns).astype(int), bins - 1), weights=lengths, minlength=bins)
    peak = (int(np.argmax(weight)) + 0.5) * bin_ns
    distance = np.abs(np.mod(phase - peak + period_ns / 2, period_ns) - period_ns / 2)
    tick = distance <= TICK_WINDOW_NS
    t0 = float(header["t0_ns"])
    first, last = np.ceil((t0 - peak) / period_ns), np.floor((t0 + duration - peak) / period_ns)
    n = int(last - first + 1)
    if n < 1:
        return {**out, "reason": "shorter than a tick period"}
    which = np.rint((absolute[tick] - peak) / period_ns) - first
    inside = (which >= 0) & (which < n)
    per_tick = np.zeros(n)
    np.add.at(per_tick, which[inside].astype(int), lengths[tick][inside])
    per_tick /= 1e3
    tick_time = float(lengths[tick].sum())
    return {**out, "n": n, "ticks_with_gap": int((per_tick > 0).sum()), "phase_ns": peak,
            "tick_gap_us_median": float(np.median(per_tick)), "tick_gap_us_p99": float(np.quantile(per_tick, 0.99)),
            "tick_gap_us_mean": float(per_tick.mean()), "tick_share_of_gap_time": tick_time / total if total else np.nan,
            "tick_fraction": tick_time / duration, "reason": ""}


MIN_MATCHED_SHARE = 0.9  # of traced ticks inside a gap, below which the two clocks are taken to disagree


def matched_gap_tick_cost(gaps: pd.DataFrame, header: dict, interrupts: pd.DataFrame) -> dict:
    """The gap detector's cost per tick with every gap matched to the traced tick inside it, for one run traced on
    the ``mono`` trace clock (CLOCK_MONOTONIC, the clock gapdet reads) while gapdet ran.

    ``interrupts`` are the traced local timer interrupts on gapdet's CPU (tracemetrics.timer_interrupt_costs:
    entry_ns, span_end_ns, tick). An interrupt's tracepoints run while the loop is stopped, so its local_timer_entry
    lies inside the gap it causes: the gap holding a tick's entry is that tick's. The gap splits into three parts
    that add up to it: from the gap's start to the entry, what the workload loses before the first tracepoint
    (delivery, entry code, in a guest the exit to the hypervisor and back in); the traced window, from the entry to
    the exit of the last softirq attributed to the interrupt (its local_timer_exit where none ran or softirqs were
    not traced), cut at the gap's end (an attributed softirq that ran after the loop resumed is not this gap's);
    and from there to the gap's end, what it loses after the last tracepoint. Gap lengths are less one read's
    median cost (the detector's loop); the three parts are of the whole gap.

    Returns ticks (traced ticks inside gapdet's run), matched (those inside a gap), tick_gap_us_median/_p99/_mean,
    span_us_median (traced window inside the gap), before_entry_us_median, after_span_us_median,
    tick_share_of_gap_time, tick_fraction (matched tick gap time / run time), reason."""
    out = {"ticks": 0, "matched": 0, "tick_gap_us_median": np.nan, "tick_gap_us_p99": np.nan,
           "tick_gap_us_mean": np.nan, "span_us_median": np.nan, "before_entry_us_median": np.nan,
           "after_span_us_median": np.nan, "tick_share_of_gap_time": np.nan, "tick_fraction": np.nan}
    t0, duration, read_ns = float(header["t0_ns"]), float(header["duration_ns"]), float(header["read_ns_median"])
    entry = interrupts["entry_ns"].to_numpy(dtype=np.int64)
    inside_run = (entry >= t0) & (entry <= t0 + duration)
    ticks = interrupts[inside_run & interrupts["tick"].to_numpy(dtype=bool)]
    out["ticks"] = len(ticks)
    if ticks.empty:
        return {**out, "reason": "no traced tick while the gap detector ran"}
    if gaps.empty:
        return {**out, "reason": "no gaps over the threshold"}
    order = np.argsort(gaps["start_ns"].to_numpy())
    start = t0 + gaps["start_ns"].to_numpy(dtype=np.int64)[order]
    length = gaps["gap_ns"].to_numpy(dtype=np.int64)[order]
    tick_entry = ticks["entry_ns"].to_numpy(dtype=np.int64)
    holder = np.searchsorted(start, tick_entry, side="right") - 1
    matched = holder >= 0
    matched[matched] &= start[holder[matched]] + length[holder[matched]] >= tick_entry[matched]
    out["matched"] = int(matched.sum())
    if matched.sum() < MIN_MATCHED_SHARE * len(ticks):  # a tick stops the loop for far longer than the threshold
        return {**out, "reason": f"only {matched.sum()} of the {len(ticks)} traced ticks fall inside a gap: the trace "
                                 "clock and CLOCK_MONOTONIC disagree"}
    if matched.sum() < MIN_REFERENCE:
        return {**out, "matched": int(matched.sum()), "reason": f"only {matched.sum()} traced ticks matched: too few"}
    which = holder[matched]
    # a gap holding several ticks (late expiries merged, the vCPU descheduled) is one loss, shared between them
    tick_gaps, gap_of_tick, ticks_per_gap = np.unique(which, return_inverse=True, return_counts=True)
    lost_us = (length[which] - read_ns) / ticks_per_gap[gap_of_tick] / 1e3
    gap_start, gap_end = start[which], start[which] + length[which]
    window_end = np.minimum(ticks["span_end_ns"].to_numpy(dtype=np.int64)[matched], gap_end)
    span = (window_end - tick_entry[matched]) / 1e3
    before = (tick_entry[matched] - gap_start) / 1e3
    after = (gap_end - window_end) / 1e3
    tick_time = float(np.sum(length[tick_gaps] - read_ns))
    total = float(np.sum(length - read_ns))
    return {**out, "tick_gap_us_median": float(np.median(lost_us)), "tick_gap_us_p99": float(np.quantile(lost_us, 0.99)),
            "tick_gap_us_mean": float(lost_us.mean()), "span_us_median": float(np.median(span)),
            "before_entry_us_median": float(np.median(before)), "after_span_us_median": float(np.median(after)),
            "tick_share_of_gap_time": tick_time / total if total > 0 else np.nan, "tick_fraction": tick_time / duration,
            "reason": ""}
