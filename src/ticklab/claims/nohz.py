"""C5 — the nohz tick (seed 004): stopping the periodic tick on a busy CPU removes its overhead and jitter."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ..published import PublishedClaim, check_derived, load_published
from . import pending_verdict

CLAIM = "nohz"
OUTPUTS = {
    "figures": ["tick_overhead_vs_hz"],
    "tables": ["tick_cost", "tick_overhead_vs_hz", "derived_checks", "ftq_observations", "setup"],
}
COMMON_HZ = (100, 250, 300, 1000)


def load(published_dir: Path | str) -> PublishedClaim:
    return load_published(published_dir, CLAIM)


def tick_cost_table(published: PublishedClaim) -> pd.DataFrame:
    frame = published.table("tick_cost")
    return frame[["id", "hz", "metric", "qualifier", "value_as_printed", "quote"]]


def tick_overhead_pct(tick_us: float, hz: float) -> float:
    """Share of CPU time spent in the tick when every tick costs ``tick_us``: tick_us × HZ / 1e6."""
    return tick_us * hz / 1e6 * 100


def tick_overhead_table(published: PublishedClaim, hz_values=COMMON_HZ) -> pd.DataFrame:
    """Arithmetic on the published ~80 µs per tick for the usual HZ choices — not a measurement:
    it assumes the tick costs the same at every HZ, as the author's own 8% figure does."""
    tick_us = published.value("tick_cost", "tick_duration")
    return pd.DataFrame({
        "HZ": list(hz_values),
        "tick period (ms)": [1000 / hz for hz in hz_values],
        "tick cost (µs, published ~80)": [tick_us] * len(hz_values),
        "overhead (%)": [tick_overhead_pct(tick_us, hz) for hz in hz_values],
    })


def derived_checks(published: PublishedClaim) -> pd.DataFrame:
    return pd.DataFrame([check_derived(
        "tick overhead at HZ=1000", published.printed("tick_cost", "tick_overhead_hz1000"),
        lambda tick_us, period_ms: tick_us / (period_ms * 1000) * 100,
        {"tick_us": published.printed("tick_cost", "tick_duration"),
         "period_ms": published.printed("tick_cost", "tick_interval_example")},
        "80 µs / 1 ms × 100",
    )])


def tick_overhead_figure(published: PublishedClaim):
    tick_us = published.value("tick_cost", "tick_duration")
    hz = np.linspace(50, 1200, 200)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(hz, [tick_overhead_pct(tick_us, h) for h in hz], color="#4c72b0",
            label=f"~{tick_us:g} µs per tick × HZ (arithmetic, not measured)")
    for h in COMMON_HZ:
        ax.plot(h, tick_overhead_pct(tick_us, h), "o", color="#4c72b0")
        ax.annotate(f"HZ={h}: {tick_overhead_pct(tick_us, h):g}%", (h, tick_overhead_pct(tick_us, h)),
                    textcoords="offset points", xytext=(-10, 8), fontsize=8)
    published_pct = published.value("tick_cost", "tick_overhead_hz1000")
    ax.plot(1000, published_pct, "*", color="#c44e52", markersize=14, label="published: 8% at HZ=1000 (ThinkPad T60p)")
    ax.axhline(0, color="#55a868", linestyle="--", label="nohz (tick stopped): no periodic tick cost")
    ax.set_xlabel("HZ (ticks per second)")
    ax.set_ylabel("CPU time spent in the tick (%)")
    ax.set_title("Seed 004: tick overhead vs HZ from the published ~80 µs per tick", fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    return fig


def ftq_observations_table(published: PublishedClaim) -> pd.DataFrame:
    frame = published.table("ftq_observations")
    shown = frame[["system", "condition", "metric", "qualifier", "value_as_printed", "unit"]].copy()
    shown["as printed"] = (shown["qualifier"] + " " + shown["value_as_printed"]).str.strip()
    return shown.drop(columns=["qualifier", "value_as_printed"])


COMPARISON = "tick stopped vs HZ=1000 / HZ=250: FTQ work per quantum and its spread"


def published_effect(published: PublishedClaim) -> str:
    return (f"tick costs ~{published.printed('tick_cost', 'tick_duration')} every 1/HZ s "
            f"({published.printed('tick_cost', 'tick_overhead_hz1000')} at HZ=1000); without it FTQ samples form tight shelves")


def verdicts(ctx) -> list:
    return pending_verdict(CLAIM, COMPARISON, published_effect(ctx.published), ctx.bundles, ctx.data_dir)


def trace_metrics(trace, values: dict) -> list[dict]:
    """Per-run metrics from the trace of an ftq run: the tick as the busy CPU saw it."""
    from ..tracemetrics import timer_interrupt_rows

    cpu = int(values["last_cpu"])
    stops = trace.table("timer:tick_stop")
    return [*timer_interrupt_rows(trace, cpu),
            {"metric": "tick_stop_events", "value": int((stops["cpu"] == cpu).sum()), "unit": "count"}]
