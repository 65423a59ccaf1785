"""Quantities derived from ingested traces that more than one claim uses (timer interrupts, hrtimers)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from ..registry import METRIC_SET_EVENTS, registrar
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
        {
            "metric": "local_timer_irq_duration_median_us",
            "value": interrupts["duration_ns"].median() / 1e3,
            "unit": "us",
        },
        {
            "metric": "local_timer_irq_duration_p99_us",
            "value": interrupts["duration_ns"].quantile(0.99) / 1e3,
            "unit": "us",
        },
        {
            "metric": "local_timer_irq_time_fraction",
            "value": interrupts["duration_ns"].sum() / 1e9 / span_s,
            "unit": "fraction",
        },
    ]


# -- spurious hrtimer interrupts (seed 002) ---------------------------------------------------------------
# Seed 002 quotes the series' "spurious hrtimer interrupt ratio" without defining it. The series says what a
# spurious interrupt is where it accepts them, in Linux 7.2.13 (Debian's linux-source-7.2 7.2.13-1):
#   include/linux/hrtimer.h:35-41   HRTIMER_MODE_LAZY_REARM "Avoid reprogramming if the timer was the first
#                                   expiring timer and is moved into the future. Special mode for the HRTICK
#                                   timer ... Risks a pointless expiry, but that's better than reprogramming on
#                                   every context switch"
#   kernel/time/hrtimer.c:1452-1463 a lazy timer moved later returns HRTIMER_REPROGRAM_NONE: the device stays
#                                   armed for the earlier expiry (kernel/sched/core.c:1033-1034: the HRTICK timer
#                                   is set up with HRTIMER_MODE_LAZY_REARM)
#   kernel/time/hrtimer.c:2192-2251 hrtimer_interrupt(): a hard timer that is due is run by
#                                   __hrtimer_run_queues() (2077-2108), whose __run_hrtimer() emits
#                                   timer:hrtimer_expire_entry (2036); it stops at the first timer with
#                                   basenow < softexpires (2100-2101); a due soft timer is not run here but
#                                   raises HRTIMER_SOFTIRQ (2216-2220)
# So a spurious ("pointless") hrtimer interrupt is a hrtimer interrupt that found no expired timer: no
# hrtimer_expire_entry between its local_timer_entry and local_timer_exit on that CPU, and, where the trace has
# irq:softirq_raise, no raise of HRTIMER_SOFTIRQ either (where it has not, an interrupt that found only a soft
# timer due is counted as spurious). In high-resolution mode every local timer interrupt on x86 runs
# hrtimer_interrupt (the clockevent's event handler), so the ratio's denominator is every local timer
# interrupt. The definition holds before the series too (6.12): an interrupt can find nothing due there as well.
HRTIMER_SOFTIRQ_VECTOR = 8  # HRTIMER in include/linux/interrupt.h (SOFTIRQ_VECTORS below)


def spurious_interrupts(trace: Trace, cpu: int) -> pd.DataFrame:
    """The local timer interrupts on ``cpu`` that found no expired hrtimer (see the definition above): no
    hrtimer expired inside them, and no HRTIMER softirq was raised inside them where raises were traced."""
    interrupts = timer_interrupts(trace, cpu)
    entry, leave = interrupts["entry_ns"].to_numpy(), interrupts["exit_ns"].to_numpy()

    def inside(stamps: np.ndarray) -> np.ndarray:
        stamps = np.sort(stamps)
        return np.searchsorted(stamps, leave, side="right") - np.searchsorted(stamps, entry, side="left")

    expires = trace.table(HRTIMER_EXPIRE)
    found = inside(expires.loc[expires["cpu"] == cpu, "timestamp"].to_numpy(dtype=np.int64))
    if SOFTIRQ_RAISE in trace.keys():
        raises = trace.table(SOFTIRQ_RAISE)
        soft = raises[(raises["cpu"] == cpu) & (raises["vec"] == HRTIMER_SOFTIRQ_VECTOR)]
        found = found + inside(soft["timestamp"].to_numpy(dtype=np.int64))
    return interrupts[found == 0]


def spurious_count(trace: Trace) -> tuple[int, int]:
    """(spurious hrtimer interrupts, all local timer interrupts) over every CPU of the trace."""
    cpus = sorted(trace.table(TIMER_ENTRY)["cpu"].unique())
    empty = sum(len(spurious_interrupts(trace, int(cpu))) for cpu in cpus)
    total = sum(len(timer_interrupts(trace, int(cpu))) for cpu in cpus)
    return empty, total


def spurious_ratio(trace: Trace, cpu: int | None = None) -> float:
    """Share of local timer interrupts that found no expired hrtimer (spurious_interrupts), over every CPU or one."""
    if cpu is None:
        empty, total = spurious_count(trace)
    else:
        empty, total = len(spurious_interrupts(trace, cpu)), len(timer_interrupts(trace, cpu))
    return empty / total if total else float("nan")


# -- the tick's whole cost: its interrupt and the softirqs it raised ---------------------------------------------
SOFTIRQ_ENTRY = "irq:softirq_entry"
SOFTIRQ_EXIT = "irq:softirq_exit"
SOFTIRQ_RAISE = "irq:softirq_raise"
SOFTIRQ_EVENTS = (SOFTIRQ_RAISE, SOFTIRQ_ENTRY, SOFTIRQ_EXIT)
# include/linux/interrupt.h (the order softirq_entry's print fmt names them in)
SOFTIRQ_VECTORS = ("HI", "TIMER", "NET_TX", "NET_RX", "BLOCK", "IRQ_POLL", "TASKLET", "SCHED", "HRTIMER", "RCU")
# The tick's hrtimer callback (kernel/time/tick-sched.c) by kernel version: tick_sched_timer until 6.7, renamed
# tick_nohz_highres_handler in 6.8 and tick_nohz_handler from 6.9 on. An experiment that traces the tick on a
# tracefs capture lists these under trace.symbols, so that their addresses are recorded beside the trace.
TICK_CALLBACKS = ("tick_nohz_handler", "tick_nohz_highres_handler", "tick_sched_timer")


def softirqs_traced(trace: Trace) -> bool:
    """Were softirq raise, entry and exit recorded (a capture from before they were traced has none of them)?"""
    return all(key in trace.keys() for key in SOFTIRQ_EVENTS)


def _on_cpu(trace: Trace, key: str, cpu: int) -> pd.DataFrame:
    table = trace.table(key)
    return table[table["cpu"] == cpu].sort_values("timestamp", kind="stable")


def softirq_runs(trace: Trace, cpu: int, interrupts: pd.DataFrame | None = None) -> pd.DataFrame:
    """Softirq handler runs on ``cpu``: entry and exit (ns), vector, and duration (ns) less the local timer
    interrupts that arrived while it ran (softirqs run with interrupts on; their time is the interrupt's)."""
    interrupts = timer_interrupts(trace, cpu) if interrupts is None else interrupts
    entries, exits = _on_cpu(trace, SOFTIRQ_ENTRY, cpu), _on_cpu(trace, SOFTIRQ_EXIT, cpu)
    start = entries["timestamp"].to_numpy(dtype=np.int64)
    end = exits["timestamp"].to_numpy(dtype=np.int64)
    # the first exit after the entry: one run's exit and the next run's entry can share a timestamp (__do_softirq
    # goes straight from one pending vector to the next), and softirqs do not nest on a CPU
    following = np.searchsorted(end, start, side="right")
    paired = following < len(end)
    start, vector, stop = start[paired], entries["vec"].to_numpy(dtype=np.int64)[paired], following[paired]
    # a run pairs with that exit only if it is of the same vector and comes no later than the next run's entry
    keep = exits["vec"].to_numpy(dtype=np.int64)[stop] == vector
    keep &= np.append(end[stop][:-1] <= start[1:], True) if len(start) else keep
    start, vector, stop = start[keep], vector[keep], end[stop[keep]]
    irq_entry = interrupts["entry_ns"].to_numpy()
    irq_time = np.concatenate([[0], np.cumsum(interrupts["duration_ns"].to_numpy())])
    nested = irq_time[np.searchsorted(irq_entry, stop)] - irq_time[np.searchsorted(irq_entry, start)]
    return pd.DataFrame({"entry_ns": start, "exit_ns": stop, "vec": vector, "duration_ns": stop - start - nested})


def timer_interrupt_costs(trace: Trace, cpu: int) -> pd.DataFrame | None:
    """Every local timer interrupt on ``cpu`` with what it cost, or None where the trace cannot tell the tick from
    other hrtimers (it carries no address for any of TICK_CALLBACKS).

    Columns: ``entry_ns``, ``exit_ns``, ``irq_ns`` (local_timer_entry → local_timer_exit), ``tick`` (the tick's
    callback expired inside it: ``timer:hrtimer_expire_entry`` with ``function`` at a TICK_CALLBACKS address; an
    interrupt that also ran other hrtimers is still the tick), ``softirqs`` (the vectors attributed to it, e.g.
    "TIMER+RCU"), ``softirq_ns`` and ``cost_ns`` = irq_ns + softirq_ns (both NaN when softirqs were not traced), and
    ``span_end_ns``: the exit of its last attributed softirq run, or its local_timer_exit where none ran or softirqs
    were not traced (the end of the window its tracepoints cover).

    Attributed softirqs: in 6.x the softirqs an interrupt raises run after its local_timer_exit tracepoint (in
    irq_exit, or later in ksoftirqd), so the interrupt's own span leaves them out. For every vector raised on this
    CPU *during* the interrupt (``irq:softirq_raise`` between its entry and exit: the tick raises TIMER, RCU and
    SCHED, hrtimer_interrupt raises HRTIMER for soft-expiring timers), the first run of that vector on this CPU
    after the interrupt's exit and before the next local timer interrupt's entry is attributed to it, its time
    less any timer interrupt that nested inside it. A vector raised elsewhere (a device interrupt's NET_RX, a
    wakeup's SCHED) is not the timer's, and is not counted; a raised vector that does not run before the next
    timer interrupt is not counted either (its run belongs to no single interrupt). Device interrupts are not
    traced: one that nests inside an attributed softirq is counted in it.
    """
    ticks = trace.symbol_addresses(TICK_CALLBACKS)
    if not ticks:
        return None
    interrupts = timer_interrupts(trace, cpu)
    entry, leave = interrupts["entry_ns"].to_numpy(), interrupts["exit_ns"].to_numpy()
    expires = _on_cpu(trace, HRTIMER_EXPIRE, cpu)
    stamps = expires["timestamp"].to_numpy(dtype=np.int64)
    tick_stamps = stamps[expires["function"].astype("uint64").isin(list(ticks.values())).to_numpy()]
    tick = np.searchsorted(tick_stamps, leave, side="right") > np.searchsorted(tick_stamps, entry, side="left")
    frame = interrupts.rename(columns={"duration_ns": "irq_ns"}).assign(tick=tick)
    if not softirqs_traced(trace):
        return frame.assign(softirqs="", softirq_ns=np.nan, cost_ns=np.nan, span_end_ns=leave)
    runs = softirq_runs(trace, cpu, interrupts)
    raises = _on_cpu(trace, SOFTIRQ_RAISE, cpu)
    raised_at = raises["timestamp"].to_numpy(dtype=np.int64)
    inside = np.searchsorted(entry, raised_at, side="right") - 1
    found = (inside >= 0) & (raised_at <= leave[np.maximum(inside, 0)])
    next_entry = np.append(entry[1:], np.iinfo(np.int64).max)
    softirq_ns = np.zeros(len(frame))
    span_end = leave.astype(np.int64)
    names = [[] for _ in range(len(frame))]
    pairs = pd.DataFrame({"irq": inside[found], "vec": raises["vec"].to_numpy(dtype=np.int64)[found]}).drop_duplicates()
    for vec, group in pairs.groupby("vec"):
        of_vector = runs[runs["vec"] == vec]
        run_entry = of_vector["entry_ns"].to_numpy()
        irq = group["irq"].to_numpy()
        first = np.searchsorted(run_entry, leave[irq], side="left")
        ran = first < len(run_entry)
        ran[ran] &= run_entry[first[ran]] < next_entry[irq[ran]]
        np.add.at(softirq_ns, irq[ran], of_vector["duration_ns"].to_numpy()[first[ran]])
        np.maximum.at(span_end, irq[ran], of_vector["exit_ns"].to_numpy(dtype=np.int64)[first[ran]])
        for one in irq[ran]:
            names[one].append(SOFTIRQ_VECTORS[vec] if 0 <= vec < len(SOFTIRQ_VECTORS) else str(vec))
    return frame.assign(
        softirqs=["+".join(n) for n in names],
        softirq_ns=softirq_ns,
        cost_ns=frame["irq_ns"].to_numpy() + softirq_ns,
        span_end_ns=span_end,
    )


def tick_rows(trace: Trace, cpu: int) -> list[dict]:
    """The tick and the other (non-tick) local timer interrupts on ``cpu``: how often, µs each (median, p99) and
    share of the CPU, in the interrupt alone (``*_irq_*``) and with their softirqs (see timer_interrupt_costs).

    Rates: the tick's from its first to its last interrupt ((ticks − 1) / span: a periodic tick at HZ gives HZ);
    the others' as a count over the span of all local timer interrupts on the CPU, as are the shares of the CPU.
    Nothing is returned where the tick cannot be told apart; the rows a trace cannot give (softirqs not traced,
    too few interrupts of a kind) are left out rather than given as NaN."""
    costs = timer_interrupt_costs(trace, cpu)
    if costs is None or len(costs) < 2:
        return []
    span_ns = costs["entry_ns"].iloc[-1] - costs["entry_ns"].iloc[0]
    rows = []
    for kind, chosen in (("tick", costs[costs["tick"]]), ("nontick_timer", costs[~costs["tick"]])):
        rows.append({"metric": f"{kind}_irqs", "value": len(chosen), "unit": "count"})
        if kind == "tick" and len(chosen) >= 2:
            rate = (len(chosen) - 1) / ((chosen["entry_ns"].iloc[-1] - chosen["entry_ns"].iloc[0]) / 1e9)
            rows.append({"metric": "tick_rate_hz", "value": rate, "unit": "Hz"})
        elif kind != "tick":
            rows.append({"metric": f"{kind}_irq_rate_hz", "value": len(chosen) / (span_ns / 1e9), "unit": "Hz"})
        columns = [("irq_us", "irq_ns")] + ([("us", "cost_ns")] if costs["cost_ns"].notna().all() else [])
        for label, column in columns:
            if chosen.empty:
                continue
            values = chosen[column] / 1e3
            rows += [
                {"metric": f"{kind}_{label}_median", "value": values.median(), "unit": "us"},
                {"metric": f"{kind}_{label}_p99", "value": values.quantile(0.99), "unit": "us"},
                {
                    "metric": f"{kind}_{label.removesuffix('us')}time_fraction",
                    "value": chosen[column].sum() / span_ns,
                    "unit": "fraction",
                },
            ]
    return rows


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
        raise TraceContentError(
            f"{trace.source}: the function tracer recorded {calls['ip'].nunique()} different "
            f"functions; counting reprograms needs it filtered to {REPROGRAM_FUNCTION} alone"
        )
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
        {
            "metric": "clockevent_reprograms_in_timer_irq_share",
            "value": inside.mean() if len(calls) else float("nan"),
            "unit": "fraction",
        },
    ]


# -- hrtimer rearms (Linux 7.1 and later) ----------------------------------------------------------------------
# The series added the timer:hrtimer_rearm tracepoint (include/trace/events/timer.h:339-361 in 7.2.13: fields
# next_event and deferred). It fires in hrtimer_rearm_event() (kernel/time/hrtimer.c:704-708) right before
# tick_program_event() -> clockevents_program_event(): for every device reprogram the hrtimer code makes, from
# hrtimer_start's path (__hrtimer_reprogram, 710-735) and from the end of a hrtimer interrupt, at once or
# deferred to the return to user space (hrtimer_rearm, 2135-2149; deferred=1 from __hrtimer_rearm_deferred,
# 2152-2169). clockevents_program_event is also called without it by the tick's nohz code
# (kernel/time/tick-sched.c), broadcast and the oneshot setup, so the function-tracer count is the larger one:
# every rearm should be followed on its CPU by one call (nothing else can come between: both run with the
# hrtimer base lock held and interrupts off), and the calls with no rearm before them are the tick's own.
HRTIMER_REARM = "timer:hrtimer_rearm"


def hrtimer_rearms(trace: Trace) -> pd.DataFrame | None:
    """Every timer:hrtimer_rearm event (timestamp, cpu, deferred), or None where the trace has none recorded (a
    kernel before the series, or a capture that did not ask for the event)."""
    if HRTIMER_REARM not in trace.keys():
        return None
    table = trace.table(HRTIMER_REARM)
    return pd.DataFrame(
        {
            "timestamp": table["timestamp"].to_numpy(dtype=np.int64),
            "cpu": table["cpu"].to_numpy(),
            "deferred": table["deferred"].to_numpy(dtype=np.int64),
        }
    )


def rearm_agreement(rearms: pd.DataFrame, calls: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(for each rearm, whether the next of these events on its CPU is a clockevents_program_event call; for
    each call, whether the event before it on its CPU is a rearm), in the frames' row order. A rearm and its
    call can carry the same timestamp: the rearm comes first."""
    followed = np.zeros(len(rearms), dtype=bool)
    preceded = np.zeros(len(calls), dtype=bool)
    for cpu in set(rearms["cpu"]) | set(calls["cpu"]):
        r = np.flatnonzero((rearms["cpu"] == cpu).to_numpy())
        c = np.flatnonzero((calls["cpu"] == cpu).to_numpy())
        stamps = np.concatenate([rearms["timestamp"].to_numpy()[r], calls["timestamp"].to_numpy()[c]])
        kind = np.concatenate([np.zeros(len(r), dtype=np.int64), np.ones(len(c), dtype=np.int64)])
        rows = np.concatenate([r, c])
        order = np.lexsort((kind, stamps))
        kind, rows = kind[order], rows[order]
        pair = (kind[:-1] == 0) & (kind[1:] == 1)  # a rearm directly followed by a call
        followed[rows[:-1][pair]] = True
        preceded[rows[1:][pair]] = True
    return followed, preceded


def rearm_rows(trace: Trace, span_s: float) -> list[dict]:
    """Counted hrtimer rearms (7.1+): how many, per second of ``span_s``, the deferred share; and where the
    function tracer counted reprograms too, whether the two counts agree (see above): the share of rearms
    followed by a reprogram (1 when every rearm reprogrammed) and the share of reprograms made by a rearm.
    Empty where the trace did not record the event."""
    rearms = hrtimer_rearms(trace)
    if rearms is None:
        return []
    rows = [
        {"metric": "hrtimer_rearms", "value": len(rearms), "unit": "count"},
        {"metric": "hrtimer_rearms_per_s", "value": len(rearms) / span_s, "unit": "1/s"},
        {
            "metric": "hrtimer_rearms_deferred_share",
            "value": float((rearms["deferred"] != 0).mean()) if len(rearms) else float("nan"),
            "unit": "fraction",
        },
    ]
    calls = clockevent_reprograms(trace)
    if calls is not None:
        followed, preceded = rearm_agreement(rearms, calls)
        rows += [
            {
                "metric": "hrtimer_rearms_reprogrammed_share",
                "value": followed.mean() if len(rearms) else float("nan"),
                "unit": "fraction",
            },
            {
                "metric": "clockevent_reprograms_by_rearm_share",
                "value": preceded.mean() if len(calls) else float("nan"),
                "unit": "fraction",
            },
        ]
    return rows


# -- which timer caused each clockevent reprogram (seed 002's quantity) -----------------------------------------------
# Seed 002 counts the reprogramming the HRTICK timer causes ("the hrtick deadline changes on every context switch ...
# about 2500 clockevent reprogramming cycles per second"; ~100/s after the series, below any HZ's tick rate, so its
# count cannot include the periodic tick). Every call of clockevents_program_event is attributed to the hrtimer whose
# event, on the same CPU, led to it. What the attribution rests on, in Debian's linux-source-6.12 (6.12.x):
#   kernel/time/hrtimer.c:492-496     debug_activate() emits timer:hrtimer_start when a timer is enqueued
#                                     (enqueue_hrtimer, 1092), i.e. in hrtimer_start_range_ns's path
#   kernel/time/hrtimer.c:1246-1306   __hrtimer_start_range_ns(): enqueue, then (not inside the hrtimer interrupt,
#                                     1268-1269) hrtimer_reprogram() when the timer is the first to expire, or
#                                     hrtimer_force_reprogram() for a first timer moved in place (1300-1305); both
#                                     end in __hrtimer_reprogram -> tick_program_event (689) ->
#                                     clockevents_program_event: the start event comes right before the call
#   kernel/time/hrtimer.c:1113-1138   __remove_hrtimer(): removing the first timer reprograms (force_reprogram);
#   kernel/time/hrtimer.c:1364-1385   hrtimer_try_to_cancel() emits timer:hrtimer_cancel after remove_hrtimer()
#                                     returned, i.e. right after the reprogram it made (a restarted timer emits
#                                     hrtimer_start with was_armed=1 instead)
#   kernel/time/hrtimer.c:1849-1936   hrtimer_interrupt(): runs the expired timers (hrtimer_expire_entry/exit; a
#                                     timer its callback restarts is enqueued with no reprogram, in_hrtirq being
#                                     set) and then programs the device once (1892, 1936): that reprogram is the
#                                     expired timers' — with no expiry there would be no interrupt to end
#   kernel/sched/core.c:830-915       the HRTICK timer: hrtick_clear() cancels it in __schedule, hrtick_start()
#                                     starts it (on a remote rq through an IPI, __hrtick_start, on its own CPU)
# and in Linux 7.2.13 (Debian's linux-source-7.2 7.2.13-1), where the series adds timer:hrtimer_rearm right before
# every tick_program_event the hrtimer code makes (hrtimer_rearm_event, kernel/time/hrtimer.c:704-708): from the start
# path, where it follows the start event (1250-1258 updates a queued timer in place and emits hrtimer_start), from a
# removal (__remove_hrtimer, 1139-1180; hrtimer_try_to_cancel traces the cancel after it, 1636-1639), and from the
# end of the interrupt, at once or deferred (deferred=1, __hrtimer_rearm_deferred, 2152-2169), which is the last
# interrupt's expired timers' rearm. The HRTICK timer there is armed with HRTIMER_MODE_LAZY_REARM
# (kernel/sched/core.c:1033-1034): moved later, it reprograms nothing.
# So, per CPU, in time order: a call inside a local timer interrupt is that interrupt's (the timers that expired in
# it); outside one, a call right after an hrtimer_start (only an hrtimer_rearm between them) is that timer's, a call
# right after a deferred rearm is the last interrupt's, a call right before an hrtimer_cancel is the cancelled
# timer's (where a start comes right before and a cancel right after, the nearer in time); any other call (the tick's
# own nohz code calls tick_program_event directly, 6.12 tick-sched.c:857, 1074, 1494, 1604) is "unattributed". A timer
# is the HRTICK timer when its function is at ``hrtick``'s address, the tick when at one of TICK_CALLBACKS' (their
# addresses come from the capture's kallsyms lines: ``trace.symbols``). An
# interrupt where both expired is counted as "tick and hrtick", not as the HRTICK timer's: with HRTICK off the tick
# would have raised that interrupt and its reprogram anyway, so it is not reprogramming HRTICK adds. An interrupt that
# found nothing expired (spurious: on 7.2 mostly the lazily moved HRTICK timer's old expiry) is the timer's the device
# was armed for: hrtimer_rearm's next_event (7.1+) matched to the expiry of the latest hrtimer_start for it on that
# CPU; before the series no event says what the device was armed for, and such reprograms stay "unattributed".
HRTIMER_START, HRTIMER_CANCEL = "timer:hrtimer_start", "timer:hrtimer_cancel"
HRTICK_CALLBACK = "hrtick"
REPROGRAM_CAUSES = ("hrtick", "tick", "tick and hrtick", "other timer", "unattributed")
# remove_hrtimer's reprogram and the hrtimer_cancel tracepoint after it run back to back under the base lock with
# interrupts off: a cancel further than this after a call is not that call's (declared; a TCG guest's few µs × 20)
CANCEL_TRACED_WITHIN_NS = 100_000


def reprogram_causes(trace: Trace) -> pd.DataFrame | None:
    """Every counted clockevent reprogram (timestamp, cpu) with ``cause`` (one of REPROGRAM_CAUSES) and ``via``
    (start, cancel, interrupt, spurious interrupt, deferred rearm, none), or None where the trace cannot attribute them:
    no function-tracer calls of clockevents_program_event, no hrtimer_cancel events, or no address for ``hrtick``."""
    calls = clockevent_reprograms(trace)
    addresses = trace.symbol_addresses((HRTICK_CALLBACK, *TICK_CALLBACKS))
    if calls is None or not _recorded(trace, HRTIMER_CANCEL) or HRTICK_CALLBACK not in addresses:
        return None
    hrtick = addresses[HRTICK_CALLBACK]
    ticks = {address for name, address in addresses.items() if name in TICK_CALLBACKS}

    def kind(function: int) -> str:
        return "hrtick" if function == hrtick else "tick" if function in ticks else "other timer"

    # the order a CPU's events happened in where timestamps tie: as the kernel emits them around the call
    frames = []

    def add(table: pd.DataFrame, rank: int, what, pointer=None, function=None, call=None, expires=None) -> None:
        n = len(table)
        frames.append(
            pd.DataFrame(
                {
                    "expires": np.zeros(n, np.int64) if expires is None else table[expires].to_numpy(dtype=np.int64),
                    "timestamp": table["timestamp"].to_numpy(dtype=np.int64),
                    "cpu": table["cpu"].to_numpy(dtype=np.int64),
                    "rank": np.full(n, rank),
                    "what": what if not isinstance(what, str) else np.full(n, what, dtype=object),
                    # addresses stay unsigned 64-bit: a float column would round them
                    "hrtimer": np.zeros(n, np.uint64) if pointer is None else table[pointer].to_numpy(dtype=np.uint64),
                    "function": np.zeros(n, np.uint64)
                    if function is None
                    else table[function].to_numpy(dtype=np.uint64),
                    "call": np.full(n, -1, dtype=np.int64) if call is None else call,
                }
            )
        )

    add(trace.table(HRTIMER_START), 1, "start", "hrtimer", "function", expires="expires")
    add(trace.table(HRTIMER_CANCEL), 3, "cancel", "hrtimer")  # traced after the reprogram it made
    add(trace.table(HRTIMER_EXPIRE), 1, "expire", "hrtimer", "function")
    add(trace.table(TIMER_ENTRY), 0, "irq_entry")
    add(trace.table(TIMER_EXIT), 4, "irq_exit")
    add(calls, 2, "call", call=np.arange(len(calls), dtype=np.int64))
    if HRTIMER_REARM in trace.keys():
        rearms = trace.table(HRTIMER_REARM)
        add(
            rearms,
            1,
            np.where(rearms["deferred"].to_numpy() != 0, "deferred", "rearm").astype(object),
            expires="next_event",
        )
    events = pd.concat(frames, ignore_index=True).sort_values(["cpu", "timestamp", "rank"], kind="stable")
    cause = np.full(len(calls), "unattributed", dtype=object)
    via = np.full(len(calls), "none", dtype=object)
    for _, mine in events.groupby("cpu", sort=False):
        what = mine["what"].to_numpy()
        pointers, functions = mine["hrtimer"].to_numpy(dtype=np.uint64), mine["function"].to_numpy(dtype=np.uint64)
        call_of, stamps = mine["call"].to_numpy(), mine["timestamp"].to_numpy(dtype=np.int64)
        owner: dict[int, int] = {}  # hrtimer pointer -> its function, from its starts and expiries
        expires = mine["expires"].to_numpy(dtype=np.int64)
        due: dict[int, str] = {}  # expiry -> the kind of the timer last started for it (7.1+: see below)
        in_irq, expired, last_irq = False, set(), "unattributed"
        armed_for = armed_at_entry = "unattributed"
        for i, event in enumerate(what):
            if event == "irq_entry":
                in_irq, expired, armed_at_entry = True, set(), armed_for
            elif event == "irq_exit":
                # an interrupt that found nothing expired fired for the timer the device was armed for (7.1+)
                in_irq, last_irq = False, _irq_cause(expired) if expired else armed_at_entry
            elif event in ("expire", "start"):
                owner[int(pointers[i])] = int(functions[i])
                if event == "expire":
                    expired.add(kind(int(functions[i])))
                else:
                    due[int(expires[i])] = kind(int(functions[i]))
            elif event in ("rearm", "deferred"):
                armed_for = due.get(int(expires[i]), "unattributed")
            elif event == "call":
                index = int(call_of[i])
                if in_irq:
                    cause[index], via[index] = (
                        (_irq_cause(expired), "interrupt") if expired else (armed_at_entry, "spurious interrupt")
                    )
                    continue
                before = i - 1 - (i >= 1 and what[i - 1] == "rearm")  # a rearm sits between a start and its call
                # a cancel is traced right after the reprogram it made (within CANCEL_TRACED_WITHIN_NS)
                after = (
                    i + 1
                    if (
                        i + 1 < len(what)
                        and what[i + 1] == "cancel"
                        and stamps[i + 1] - stamps[i] <= CANCEL_TRACED_WITHIN_NS
                    )
                    else -1
                )
                started = before >= 0 and what[before] == "start"
                if started and after >= 0:  # both adjacent: the nearer in time made the call (each is sub-µs away)
                    started = stamps[i] - stamps[before] <= stamps[after] - stamps[i]
                if i >= 1 and what[i - 1] == "deferred":  # the tracepoint right before tick_program_event
                    cause[index], via[index] = last_irq, "deferred rearm"
                elif started:
                    cause[index], via[index] = kind(int(functions[before])), "start"
                elif after >= 0:
                    known = owner.get(int(pointers[after]))
                    cause[index], via[index] = (kind(known) if known is not None else "other timer"), "cancel"
    return calls.assign(cause=cause, via=via)


def _recorded(trace: Trace, key: str) -> bool:
    """Was the event traced (its format is in the capture), even if it never fired?"""
    try:
        trace.table(key)
    except KeyError:
        return False
    return True


def _irq_cause(expired: set) -> str:
    if {"tick", "hrtick"} <= expired:
        return "tick and hrtick"
    for one in ("hrtick", "tick", "other timer"):
        if one in expired:
            return one
    return "unattributed"  # a spurious interrupt: nothing expired


def hrtick_starts(trace: Trace, causes: pd.DataFrame | None = None) -> pd.DataFrame | None:
    """Every hrtimer_start of the HRTICK timer (timestamp, cpu) with ``reprogrammed``: the next of the CPU's hrtimer
    events and reprogram calls is a reprogram this start caused (see reprogram_causes; ``causes``: its result, where
    the caller has it already). None where not attributable."""
    causes = reprogram_causes(trace) if causes is None else causes
    if causes is None:
        return None
    hrtick = trace.symbol_addresses((HRTICK_CALLBACK,))[HRTICK_CALLBACK]
    starts = trace.table(HRTIMER_START)
    mine = starts[starts["function"].astype("uint64") == np.uint64(hrtick)][["timestamp", "cpu"]].reset_index(drop=True)
    caused = causes[(causes["cause"] == "hrtick") & (causes["via"] == "start")]
    reprogrammed = np.zeros(len(mine), dtype=bool)
    for cpu, group in mine.groupby("cpu"):
        stamps = group["timestamp"].to_numpy(dtype=np.int64)
        hits = np.sort(caused.loc[caused["cpu"] == cpu, "timestamp"].to_numpy(dtype=np.int64))
        # each caused call belongs to the latest hrtick start at or before it
        owner = np.searchsorted(stamps, hits, side="right") - 1
        reprogrammed[group.index.to_numpy()[owner[owner >= 0]]] = True
    return mine.assign(reprogrammed=reprogrammed)


def attributed_reprogram_rows(trace: Trace, span_s: float, messages: float | None) -> list[dict]:
    """Per cause (REPROGRAM_CAUSES): reprograms, per second of ``span_s`` and per 1000 hackbench messages; the
    HRTICK timer's starts and the share of them that reprogrammed (the series' mechanism). Empty where the trace
    cannot attribute reprograms (reprogram_causes)."""
    causes = reprogram_causes(trace)
    if causes is None:
        return []
    rows = []
    for cause in REPROGRAM_CAUSES:
        name = cause.replace(" ", "_")
        count = int((causes["cause"] == cause).sum())
        rows += [
            {"metric": f"{name}_reprograms", "value": count, "unit": "count"},
            {"metric": f"{name}_reprograms_per_s", "value": count / span_s, "unit": "1/s"},
        ]
        if messages:
            rows.append(
                {"metric": f"{name}_reprograms_per_kmsg", "value": count / messages * 1000, "unit": "1/1000 messages"}
            )
    if messages:
        rows.append(
            {
                "metric": "clockevent_reprograms_per_kmsg",
                "value": len(causes) / messages * 1000,
                "unit": "1/1000 messages",
            }
        )
    starts = hrtick_starts(trace, causes)
    rows += [
        {"metric": "hrtick_starts", "value": len(starts), "unit": "count"},
        {"metric": "hrtick_starts_per_s", "value": len(starts) / span_s, "unit": "1/s"},
    ]
    if len(starts):  # no share where the timer never started (HRTICK off): a run's results must be finite
        rows.append(
            {
                "metric": "hrtick_start_reprogram_share",
                "value": float(starts["reprogrammed"].mean()),
                "unit": "fraction",
            }
        )
    return rows


def hackbench_messages(argv: list[str]) -> float | None:
    """The messages a hackbench run sends: groups × senders × receivers × loops (-g, -f: 20 senders and 20 receivers
    a group by default, -l), None where the argv is not hackbench's or does not say."""
    if not argv or Path(str(argv[0])).name != "hackbench":
        return None
    values = {"-g": 10, "-f": 20, "-l": 100}  # hackbench's defaults (rt-tests)
    for flag, value in zip(argv, argv[1:], strict=False):
        if flag in values:
            try:
                values[flag] = int(value)
            except ValueError:
                return None
    return float(values["-g"] * values["-f"] * values["-f"] * values["-l"])


# -- what a run's trace gives its results.csv (an experiment's ``trace.metrics`` names the sets) ------------------
MetricSet = Callable[[Trace, dict], list[dict]]
# registry.METRIC_SET_EVENTS' sets -> their functions, each registered by @metric_set (all of them: checked below)
METRIC_SETS: dict[str, MetricSet] = {}


# @metric_set("<name>"): the decorated function is that metric set (one of registry.METRIC_SET_EVENTS, where the
# tracepoints it reads are declared)
metric_set = registrar(
    METRIC_SETS, METRIC_SET_EVENTS, "trace/tracemetrics.py: metric set {name}: not in the registry, or a second one"
)


@metric_set("tick")
def tick_metrics(trace: Trace, values: dict) -> list[dict]:
    """Per-run metrics from the trace of an ftq run: the tick as the busy CPU saw it — every local timer interrupt,
    then the tick (its hrtimer callback's expiries) and the other timer interrupts apart, each with the softirqs
    it raised where they were traced (tick_rows)."""
    cpu = int(values["last_cpu"])
    stops = trace.table("timer:tick_stop")
    return [
        *timer_interrupt_rows(trace, cpu),
        *tick_rows(trace, cpu),
        {"metric": "tick_stop_events", "value": int((stops["cpu"] == cpu).sum()), "unit": "count"},
    ]


@metric_set("hrtimer")
def hrtimer_metrics(trace: Trace, values: dict) -> list[dict]:
    """Per-run metrics from a hackbench trace: counted clockevent reprograms (and on 7.1+ the hrtimer rearms the
    tracepoint counts, with whether the two agree), hrtimer arming, timer interrupts and spurious hrtimer
    interrupts (a hrtimer interrupt that found no expired timer: the definition above spurious_interrupts),
    counts over the traced run and rates per second of it.

    ``clockevent_reprograms_per_s`` counts the calls of clockevents_program_event (the function tracer filtered
    to it), recorded only by bundles whose experiment asked for it. ``hrtimer_start_rate_hz`` counts every
    hrtimer arm; it bounds reprograms neither way (an expiring hrtimer's interrupt reprograms without a start,
    cancelling the first timer reprograms, and most starts reprogram nothing)."""
    starts = trace.table("timer:hrtimer_start")
    entries = trace.table(TIMER_ENTRY)
    span_s = traced_span_s(trace, ["timer:hrtimer_start", TIMER_ENTRY, FUNCTION_CALL, HRTIMER_REARM])
    spurious, interrupts = spurious_count(trace)
    return [
        {"metric": "hrtimer_start_rate_hz", "value": len(starts) / span_s, "unit": "Hz"},
        {"metric": "local_timer_irq_rate_hz", "value": len(entries) / span_s, "unit": "Hz"},
        {"metric": "spurious_hrtimer_interrupts", "value": spurious, "unit": "count"},
        {
            "metric": "spurious_hrtimer_interrupt_ratio",
            "value": spurious / interrupts if interrupts else float("nan"),
            "unit": "fraction",
        },
        *reprogram_rows(trace, span_s),
        *rearm_rows(trace, span_s),
        *attributed_reprogram_rows(trace, span_s, hackbench_messages(values.get("argv") or [])),
    ]


if list(METRIC_SETS) != list(METRIC_SET_EVENTS):
    raise ImportError(f"trace/tracemetrics.py: metric sets {list(METRIC_SETS)}; registry.py: {list(METRIC_SET_EVENTS)}")
