"""What a tick costs the workload (issue 26): work lost per tick as the busy thread sees it, two independent ways.

* From FTQ's own samples (:func:`ftq_tick_cost`): the quanta that hold a tick against the median of the tick-free
  quanta of the same run; the loss, in units of work, is turned into µs at the tick-free rate of work.
* From the gap detector (tools/gapdet.c, :func:`gap_tick_cost`): every gap a SCHED_FIFO loop reading
  CLOCK_MONOTONIC saw, the tick's told from the others by their phase in the tick period.

FTQ places each tick by its own timestamp where the run traced its ticks on the ``mono`` trace clock and ftq
recorded its t0 (:func:`traced_tick_loss`); elsewhere by folding the quanta on the tick period, whose length the
trace's tick rate gives (:func:`nominal_period_ns`): ftq's deadlines and the tick's hrtimer run on the same
CLOCK_MONOTONIC, so the tick falls in the same slot of every period (:func:`folded_tick_loss`). Neither picks the
phase that maximises the loss per tick, which an earlier version did and which biased the cost upward (issue 44).
The gap detector folds its gaps on the period; where it ran under a trace of its own on the ``mono`` trace clock
(CLOCK_MONOTONIC; the nohz experiments' traced per-run extra), :func:`matched_gap_tick_cost` matches every traced
tick to the gap it caused, one by one, and splits the workload's loss into the part before the first tracepoint,
the traced span and the part after it.

And the sound lost-work figure (:func:`ftq_lost_fraction`): 1 − mean work per quantum / median work of the
tick-free quanta, where 1 − mean/max also counts how much faster than usual the fastest quantum ran.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.stats import median_abs_deviation

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


def _median(values: np.ndarray) -> float:
    """np.median's value (the middle one, or the mean of the two middle ones) without its per-call overhead, which
    dominated the fold's many calls a run."""
    half = len(values) // 2
    if len(values) % 2:
        return float(np.partition(values, half)[half])
    part = np.partition(values, [half - 1, half])
    return float((part[half - 1] + part[half]) / 2)


def ftq_lost_fraction(counts, reference: float) -> float:
    """Work lost against a reference quantum: 1 − mean work per quantum / reference."""
    if not reference > 0:
        raise TickCostError(f"reference work per quantum is {reference!r}; it must be positive")
    return float(1 - np.mean(counts) / reference)


FOLD_SEGMENT_PERIODS = 60  # tick periods a fold places the tick over at once (a run's tick may change phase)
SPILL_SHARE = 0.05  # a neighbouring slot losing more than this share of the tick slot's loss holds part of the tick
NOISE_SE = 3  # ... and more than this many standard errors of a slot's median


def _loss_summary(loss_counts: np.ndarray, reference: np.ndarray, quantum_ns: int, excess_counts: np.ndarray) -> dict:
    """Per-tick losses (work units, each with its reference) as µs at the reference's rate of work: median, p99,
    and the mean less what the same quanta lose to other noise (``excess_counts``: per tick, the tick-free quanta's
    mean loss against the reference × the quanta the tick's loss is summed over)."""
    lost_us = loss_counts / reference * quantum_ns / 1e3
    excess_us = excess_counts / reference * quantum_ns / 1e3
    return {
        "n": int(len(lost_us)),
        "tick_lost_us_median": float(np.median(lost_us)),
        "tick_lost_us_p99": float(np.quantile(lost_us, 0.99)),
        "tick_lost_us_mean": float((lost_us - excess_us).mean()),
    }


def traced_tick_loss(counts, end_ns, quantum_ns: int, tick_ns) -> dict:
    """The work each traced tick took from FTQ: ``tick_ns`` are the ticks' times in the quanta's clock (ns since
    ftq's t0, from the run's own trace on the ``mono`` trace clock), so every tick is placed by its own timestamp,
    not by a phase fitted to the data. A tick's loss is the reference minus the work of every quantum overlapping
    [tick − GUARD_NS, tick + SPILL_NS], summed; the reference is the median quantum no tick's window touches. The
    first and last traced tick inside the run are left out (the run may cut their window)."""
    counts = np.asarray(counts, dtype=float)
    end = np.asarray(end_ns, dtype=np.int64)
    start = np.concatenate([[end[0] - quantum_ns], end[:-1]])
    ticks = np.sort(np.asarray(tick_ns, dtype=np.int64))
    ticks = ticks[(ticks - GUARD_NS >= start[0]) & (ticks + SPILL_NS <= end[-1])]
    first = np.searchsorted(end, ticks - GUARD_NS, side="right")  # first quantum ending after the window opens
    last = np.searchsorted(start, ticks + SPILL_NS, side="left") - 1  # last quantum starting before it closes
    touched = np.zeros(len(counts), dtype=bool)
    for a, b in zip(first, last, strict=True):
        touched[a : b + 1] = True
    free = counts[~touched]
    if len(free) < MIN_REFERENCE or len(ticks) < MIN_REFERENCE + 2:
        return {"reason": f"{len(ticks)} traced ticks and {len(free)} tick-free quanta: too few"}
    reference = _median(free)
    cumulative = np.concatenate([[0.0], np.cumsum(reference - counts)])
    width = (last - first + 1)[1:-1]
    loss = (cumulative[last + 1] - cumulative[first])[1:-1]
    excess = width * (reference - free.mean())
    return {
        "reason": "",
        "reference": reference,
        **_loss_summary(loss, np.full(len(loss), reference), quantum_ns, excess),
    }


def _tick_slots(loss: np.ndarray, tick_slot: int, window: int, noise: float) -> list[int]:
    """The slots (in order, as offsets that may run past the period's end) holding a tick whose median loss is
    lowest in ``tick_slot``: the run of slots around it each losing more than SPILL_SHARE of its loss and more than
    NOISE_SE standard errors of a slot's median (``noise``), where that run fits in one tick's window; else the
    tick slot alone (loss spread wider than a tick's window is not the tick's: a busy host's)."""
    slots, bar = len(loss), max(SPILL_SHARE * loss[tick_slot], NOISE_SE * noise)
    low = high = tick_slot
    while high - low + 1 < slots and loss[(low - 1) % slots] > bar:
        low -= 1
    while high - low + 1 < slots and loss[(high + 1) % slots] > bar:
        high += 1
    return list(range(low, high + 1)) if high - low + 1 <= window else [tick_slot]


def folded_tick_loss(counts, end_ns, quantum_ns: int, period_ns: int) -> dict:
    """The work each tick took from FTQ where the ticks were not traced, by folding the quanta on the tick period.

    ftq's quanta have fixed deadlines (t0 + i × quantum) and the tick's hrtimer fires every TICK_NSEC of the same
    CLOCK_MONOTONIC, so where the period is a whole number S of quanta the tick falls in the same slot (i mod S)
    of every period for as long as its phase holds. Per block of FOLD_SEGMENT_PERIODS periods: the slot whose
    median work is lowest holds the tick; a neighbouring slot whose median lost more than SPILL_SHARE of that
    slot's loss holds the rest of a tick that straddles a quantum's end (:func:`_tick_slots`); the other slots are
    the reference (their median). Each tick's loss is the reference minus the work of its period's tick slots,
    summed. The phase is chosen once per block from slot medians over hundreds of quanta, not tick by tick, so its
    choice follows the tick and not the noise of single quanta (the estimator is tested unbiased within 5 % on
    synthetic runs)."""
    counts = np.asarray(counts, dtype=float)
    end = np.asarray(end_ns, dtype=np.int64)
    slots = int(round(period_ns / quantum_ns))
    if slots < 2 or abs(slots * quantum_ns - period_ns) > quantum_ns // 1000:
        return {
            "reason": f"the tick period ({period_ns / 1e3:g} µs) is not a whole number (≥ 2) of "
            f"{quantum_ns / 1e3:g} µs "
            "quanta: the ticks were not traced and a fold cannot place them"
        }
    index = np.rint(end / quantum_ns).astype(np.int64) - 1  # the quantum's position since ftq's t0
    window = int(np.ceil((GUARD_NS + SPILL_NS) / quantum_ns)) + 1  # the most quanta one tick's window can overlap
    losses, references, excesses, free_all = [], [], [], []
    block = FOLD_SEGMENT_PERIODS * slots
    for begin in range(int(index.min()), int(index.max()) + 1, block):
        mine = (index >= begin) & (index < begin + block)
        slot = index[mine] % slots
        values = counts[mine]
        medians = np.array([_median(values[slot == s]) if np.any(slot == s) else np.nan for s in range(slots)])
        if np.isnan(medians).any() or min(np.bincount(slot, minlength=slots)) < MIN_REFERENCE:
            continue  # a block too short to place the tick (the run's tail)
        tick_slot = int(np.argmin(medians))
        loss = np.nanmax(medians) - medians
        # a slot median's standard error: 1.2533 σ / √n for normal noise, σ from the block's MAD
        noise = 1.2533 * median_abs_deviation(values, scale="normal") / np.sqrt(len(values) / slots)
        held = _tick_slots(loss, tick_slot, window, noise)
        if len(held) >= slots:
            continue  # every slot is the tick's: no reference in this block
        in_tick = np.isin(slot, [h % slots for h in held])
        free = values[~in_tick]
        reference = _median(free)
        if not reference > 0:
            continue  # the thread did no work in most of this block (a starved CPU): nothing to measure a loss against
        # a tick's quanta: its slot and the held neighbours, the one before it belonging to the same tick
        anchor = index[mine] - held[0]
        tick_of = np.floor_divide(anchor, slots)[in_tick]
        ids, first = np.unique(tick_of, return_index=True)
        sums = np.add.reduceat(reference - values[in_tick], first) if len(ids) else np.array([])
        widths = np.diff(np.append(first, in_tick.sum()))
        keep = widths == len(held)  # ticks the block cut are left out
        losses.append(sums[keep])
        references.append(np.full(int(keep.sum()), reference))
        excesses.append(widths[keep] * (reference - free.mean()))
        free_all.append(free)
    if not losses or sum(len(x) for x in losses) < MIN_REFERENCE:
        return {"reason": "too few tick-free quanta or ticks"}
    return {
        "reason": "",
        "reference": _median(np.concatenate(free_all)),
        **_loss_summary(np.concatenate(losses), np.concatenate(references), quantum_ns, np.concatenate(excesses)),
    }


def ftq_tick_cost(counts, end_ns, quantum_ns: int, period_ns: int | None, tick_ns=None) -> dict:
    """FTQ's own estimate of the work a tick takes from the thread, for one run.

    ``period_ns`` is TICK_NSEC (:func:`nominal_period_ns`), None where the run had no periodic tick: then every
    quantum is the reference and no cost per tick is given. ``tick_ns``: the run's traced ticks in the quanta's
    clock (ns since ftq's t0), where the run was traced on CLOCK_MONOTONIC and ftq recorded its t0: each tick is
    then placed by its timestamp (:func:`traced_tick_loss`); else the ticks are placed by folding the quanta on the
    period (:func:`folded_tick_loss`). Returns reference (median work of the tick-free quanta), lost_fraction
    (1 − mean/reference), lost_fraction_max (the old 1 − mean/max, for comparison), method (how the ticks were
    placed), n (ticks), tick_lost_us_median and _p99 (per tick, µs at the reference's rate of work),
    tick_lost_us_mean (less the other noise the same quanta carry), reason (why a cost is missing, else "")."""
    counts = np.asarray(counts, dtype=float)
    end_ns = np.asarray(end_ns, dtype=np.int64)
    if len(counts) < 2 or len(counts) != len(end_ns):
        raise TickCostError(f"{len(counts)} work counts for {len(end_ns)} quantum ends: need matching lengths ≥ 2")
    if counts.max() <= 0:
        raise TickCostError("no quantum counted any work")
    out = {
        "quanta": len(counts),
        "lost_fraction_max": float(1 - counts.mean() / counts.max()),
        "method": "",
        "n": 0,
        "tick_lost_us_median": np.nan,
        "tick_lost_us_p99": np.nan,
        "tick_lost_us_mean": np.nan,
    }
    if period_ns is None:
        reference = float(np.median(counts))
        return {
            **out,
            "reference": reference,
            "lost_fraction": ftq_lost_fraction(counts, reference),
            "reason": "no periodic tick in this run: every quantum is tick-free",
        }
    if quantum_ns + GUARD_NS + SPILL_NS >= period_ns:
        return {
            **out,
            "reference": np.nan,
            "lost_fraction": np.nan,
            "reason": f"every {quantum_ns / 1e3:g} µs quantum is near a tick (tick period {period_ns / 1e3:g} µs): "
            "no tick-free reference",
        }
    if tick_ns is not None:
        found, method = traced_tick_loss(counts, end_ns, quantum_ns, tick_ns), TRACED
    else:
        found, method = folded_tick_loss(counts, end_ns, quantum_ns, period_ns), FOLDED
    if found["reason"]:
        return {
            **out,
            "reference": found.get("reference", np.nan),
            "lost_fraction": np.nan,
            "method": method,
            "reason": found["reason"],
        }
    return {**out, **found, "method": method, "lost_fraction": ftq_lost_fraction(counts, found["reference"])}


TRACED = "each traced tick placed by its timestamp"
FOLDED = "ticks placed by folding the quanta on the tick period (not traced)"


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
    out = {
        "gaps": len(gaps),
        "gap_fraction": total / duration,
        "n": 0,
        "ticks_with_gap": 0,
        "tick_gap_us_median": np.nan,
        "tick_gap_us_p99": np.nan,
        "tick_gap_us_mean": np.nan,
        "tick_share_of_gap_time": np.nan,
        "tick_fraction": np.nan,
        "phase_ns": np.nan,
    }
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
    return {
        **out,
        "n": n,
        "ticks_with_gap": int((per_tick > 0).sum()),
        "phase_ns": peak,
        "tick_gap_us_median": float(np.median(per_tick)),
        "tick_gap_us_p99": float(np.quantile(per_tick, 0.99)),
        "tick_gap_us_mean": float(per_tick.mean()),
        "tick_share_of_gap_time": tick_time / total if total else np.nan,
        "tick_fraction": tick_time / duration,
        "reason": "",
    }


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
    out = {
        "ticks": 0,
        "matched": 0,
        "tick_gap_us_median": np.nan,
        "tick_gap_us_p99": np.nan,
        "tick_gap_us_mean": np.nan,
        "span_us_median": np.nan,
        "before_entry_us_median": np.nan,
        "after_span_us_median": np.nan,
        "tick_share_of_gap_time": np.nan,
        "tick_fraction": np.nan,
    }
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
        return {
            **out,
            "reason": f"only {matched.sum()} of the {len(ticks)} traced ticks fall inside a gap: the trace "
            "clock and CLOCK_MONOTONIC disagree",
        }
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
    return {
        **out,
        "tick_gap_us_median": float(np.median(lost_us)),
        "tick_gap_us_p99": float(np.quantile(lost_us, 0.99)),
        "tick_gap_us_mean": float(lost_us.mean()),
        "span_us_median": float(np.median(span)),
        "before_entry_us_median": float(np.median(before)),
        "after_span_us_median": float(np.median(after)),
        "tick_share_of_gap_time": tick_time / total if total > 0 else np.nan,
        "tick_fraction": tick_time / duration,
        "reason": "",
    }
