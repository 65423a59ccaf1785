"""C5 — the nohz tick (seed 004): stopping the periodic tick on a busy CPU removes its overhead and jitter."""

from __future__ import annotations

import fnmatch
import functools
import re
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import signal

from ..analysis import derived, palette
from ..analysis.captured import BundleRef
from ..analysis.checks import RUN_HZ, FactCheck, MetricCheck, RawCheck
from ..analysis.comparisons import Comparison, NegativeControl, usable_bundles
from ..analysis.lazy import plt
from ..analysis.published import PublishedClaim, check_derived
from ..analysis.verdicts import Margins, Target
from ..capture.workloads import WorkloadOutputError, read_ftq, read_gapdet
from ..trace import rawfile
from ..trace.ingest import TraceFormatError, read_trace
from ..trace.tickcost import TickCostError, ftq_tick_cost, gap_tick_cost, matched_gap_tick_cost, nominal_period_ns
from ..trace.tracemetrics import TIMER_ENTRY, TIMER_EXIT, timer_interrupt_costs
from ..trace.tracespots import longest_tick_gap
from . import Claim, ViewPreset

COMMON_HZ = (100, 250, 300, 1000)


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
    return pd.DataFrame(
        {
            "HZ": list(hz_values),
            "tick period (ms)": [1000 / hz for hz in hz_values],
            "tick cost (µs, published ~80)": [tick_us] * len(hz_values),
            "overhead (%)": [tick_overhead_pct(tick_us, hz) for hz in hz_values],
        }
    )


def derived_checks(published: PublishedClaim) -> pd.DataFrame:
    return pd.DataFrame(
        [
            check_derived(
                "tick overhead at HZ=1000",
                published.printed("tick_cost", "tick_overhead_hz1000"),
                lambda tick_us, period_ms: tick_us / (period_ms * 1000) * 100,
                {
                    "tick_us": published.printed("tick_cost", "tick_duration"),
                    "period_ms": published.printed("tick_cost", "tick_interval_example"),
                },
                "80 µs / 1 ms × 100",
            )
        ]
    )


def tick_overhead_figure(published: PublishedClaim):
    tick_us = published.value("tick_cost", "tick_duration")
    hz = np.linspace(50, 1200, 200)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(
        hz,
        [tick_overhead_pct(tick_us, h) for h in hz],
        color=palette.BASELINE,
        label=f"~{tick_us:g} µs per tick × HZ (arithmetic, not measured)",
    )
    for h in COMMON_HZ:
        ax.plot(h, tick_overhead_pct(tick_us, h), "o", color=palette.BASELINE)
        # HZ=250 and HZ=300 sit close together: one label above the curve, the other below it
        ax.annotate(
            f"HZ={h}: {tick_overhead_pct(tick_us, h):g}%",
            (h, tick_overhead_pct(tick_us, h)),
            textcoords="offset points",
            xytext=(6, -14) if h == 300 else (-10, 8),
            fontsize=8,
        )
    published_pct = published.value("tick_cost", "tick_overhead_hz1000")
    ax.plot(
        1000, published_pct, "*", color=palette.BLACK, markersize=14, label="published: 8% at HZ=1000 (ThinkPad T60p)"
    )
    ax.axhline(0, color=palette.CHANGED, linestyle="--", label="nohz (tick stopped): no periodic tick cost")
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


WHAT_IS_COMPARED = "tick stopped vs HZ=1000 / HZ=250: FTQ work per quantum and its spread"


# Did each run's condition take effect? Checked per run; a run that fails is left out of the verdicts.
# A run whose check fails, or cannot be computed, is left out with why (analysis/checks.py, build/checks.csv).
STARVED_SHARE = 0.05  # declared: a run whose FTQ quanta did no work at all in more than 5 % of them was starved
_TICK_OFF = ("*nohz_full*", "nohz-full")


def ftq_header(raw: Path) -> dict:
    """The header of a run's ftq.dat (the run's own record of its clocksource)."""
    return dict(_ftq_check_values(str(raw / "ftq.dat"))[0])


def ftq_starved_share(raw: Path) -> float:
    """The share of a run's measured FTQ quanta that did no work at all: quanta in which the busy thread never ran
    (its vCPU was not scheduled, or it was preempted for the whole quantum)."""
    return _ftq_check_values(str(raw / "ftq.dat"))[1]


CHECKS = [
    # a lab guest's own HZ, else a boot plan's booted kernel's CONFIG_HZ (runners/nohz/host-boot-hz.yaml: a kernel
    # built per HZ)
    FactCheck("kernel HZ as the condition says", "guest.hz|boot.hz", {"hz1000*": 1000, "hz250*": 250}),
    FactCheck("nohz_full on the kernel command line", "guest.cmdline", {"*nohz_full*": "nohz_full="}, contains=True),
    # a boot plan's run: the command line its boot was verified to have (runners/nohz/host-boot-ftq.yaml)
    FactCheck("nohz_full on the booted command line", "boot.cmdline", {"nohz-full": "nohz_full="}, contains=True),
    # against the HZ the run's kernel ran at: a guest's own, a boot plan's booted kernel, else the host facts' CONFIG_HZ
    MetricCheck(
        "nohz_full stopped the tick on the busy CPU (timer interrupts/s ≤ 10% of HZ)",
        "local_timer_irq_rate_hz",
        _TICK_OFF,
        0.10,
        RUN_HZ,
    ),
    # a tick-on run's tick rate (not starved): analysis.checks.TickRateCheck, one of the checks every claim's runs get
    # interference: what the experiment assumes of the machine, from the run's own FTQ output
    RawCheck(
        "FTQ read the clock through the TSC (the experiment's assumption: a vDSO read, no system call)",
        ("*",),
        "clocksource tsc",
        lambda raw: ftq_header(raw).get("clocksource"),
        lambda seen: seen == "tsc",
        lambda seen: f"clocksource {seen}",
    ),
    RawCheck(
        f"the busy CPU was not starved (FTQ quanta with no work ≤ {STARVED_SHARE:.0%})",
        ("*",),
        f"≤ {STARVED_SHARE:.0%} of quanta with no work",
        ftq_starved_share,
        lambda seen: seen <= STARVED_SHARE,
        lambda seen: f"{seen:.1%} of quanta with no work",
    ),
]


# -- fresh data ------------------------------------------------------------------------------------
# tick-on / nohz-full: a boot experiment's conditions, on whatever kernel the machine (or a lab guest playing it) booted
CONDITION_LABELS = {
    "hz1000": "HZ=1000, tick on",
    "hz250": "HZ=250, tick on",
    "hz1000-nohz_full": "HZ=1000, nohz_full (tick stopped)",
    "tick-on": "booted kernel, tick on",
    "nohz-full": "booted kernel, nohz_full (tick stopped)",
}
# Tick on in blues, tick stopped in orange (the palette's baseline and change); the line style says it again:
# solid at HZ=1000 (or the booted kernel's HZ), dotted at HZ=250, dashed with the tick stopped.
CONDITION_COLORS = {
    "hz1000": palette.BASELINE,
    "hz250": palette.SKY_BLUE,
    "hz1000-nohz_full": palette.CHANGED,
    "tick-on": palette.BASELINE,
    "nohz-full": palette.CHANGED,
}
CONDITION_STYLES = {"hz1000": "-", "hz250": ":", "hz1000-nohz_full": "--", "tick-on": "-", "nohz-full": "--"}
# rtla osnoise top -q: CPU #periods, runtime, noise (µs), % CPU available, max noise, max single, then counts of
# HW, NMI, IRQ, softirq and thread interference
_OSNOISE_ROW = re.compile(
    r"^\s*(\d+)\s+#\d+\s+(\d+)\s+(\d+)\s+([\d.]+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)"
    r"\s+(\d+)\s+(\d+)",
    re.M,
)


# What the per-run derivations below are computed by (analysis/derived.py: a change to any of these files is a new
# code version, and what a sealed bundle's raw files gave before is derived again): this module, the workload
# parsers, and every module of trace/ (raw files, the trace reader and its C extension, the metrics, tickcost).
DERIVED_BY = ("claims/nohz.py", "capture/workloads.py", "trace/", "safefiles.py")


def _derived_from_run_file(path: str, kind: str, params: dict, compute, *, inputs: tuple[str, ...], frame=False):
    """``compute()`` for a file of a run, ``<bundle>/raw/<run>/<name>`` (a condition check has only the path), through
    the per-bundle cache (analysis/derived.py: the bundle's seal checked and ``inputs`` — names under the run's raw
    directory — checked against its manifest); computed directly for a path outside a bundle's raw/."""
    file = Path(path)
    if len(file.parts) < 4 or file.parent.parent.name != "raw":
        return compute()
    run = file.parent.name
    return derived.per_run(
        file.parents[2],
        kind,
        DERIVED_BY,
        run,
        params,
        compute,
        inputs=tuple(f"raw/{run}/{name}" for name in inputs),
        frame=frame,
    )


def _read_measured_ftq(path: Path) -> tuple[dict, pd.DataFrame]:
    header, samples = read_ftq(path)
    return header, samples[~samples["warmup"]]


@functools.cache
def _measured_ftq(path: str) -> tuple[dict, pd.DataFrame]:
    """One run's ftq.dat: its header and its measured quanta (warm-up dropped). Read once per process, and parsed
    once per sealed bundle (analysis/derived.py): a notebook's tables and its condition checks each need every run's
    samples (callers must not change the frame)."""
    file = Path(path)
    return _derived_from_run_file(
        path, "ftq-measured", {"file": file.name}, lambda: _read_measured_ftq(file), inputs=(file.name,), frame=True
    )


@functools.cache
def _ftq_check_values(path: str) -> tuple[dict, float]:
    """What the condition checks read of a run's ftq.dat (ftq_header, ftq_starved_share): its header and the share of
    its measured quanta with no work, once per process and once per sealed bundle (analysis/derived.py), so checking
    a run reads no quanta where they were derived before."""

    def compute() -> tuple[dict, float]:
        header, samples = _measured_ftq(path)
        return dict(header), float((samples["count"] == 0).mean())

    return _derived_from_run_file(path, "ftq-checks", {"file": Path(path).name}, compute, inputs=(Path(path).name,))


@functools.cache
def _ftq_run_cost(path: str, period_ns: int | None) -> dict:
    """tickcost.ftq_tick_cost of one run's ftq.dat for a tick period, computed once per process and once per sealed
    bundle (analysis/derived.py): each tick placed by its traced timestamp where the run's own trace (``trace/``
    beside ftq.dat) is on the mono clock and ftq wrote its t0 (tools/ftq.c since issue 44), else by the fold (the
    reason is in the result's ``method``)."""

    def compute() -> dict:
        header, samples = _measured_ftq(path)
        ticks = _traced_ticks(Path(path).parent / "trace", header) if period_ns is not None else None
        return ftq_tick_cost(samples["count"], samples["end_ns"], int(header["quantum_ns"]), period_ns, tick_ns=ticks)

    return _derived_from_run_file(
        path,
        "ftq-tick-cost",
        {"file": Path(path).name, "period_ns": period_ns},
        compute,
        inputs=(Path(path).name, "trace"),
    )


def _traced_ticks(trace_dir: Path, header: dict):
    """The run's traced ticks on ftq's CPU in ns since ftq's t0, or None where they cannot be placed among the
    quanta: no t0 in ftq.dat (captures before issue 44), no trace, a trace clock other than mono (CLOCK_MONOTONIC,
    ftq's clock), or no tick callback address to tell the tick from other hrtimers."""
    if "t0_ns" not in header or not trace_dir.is_dir():
        return None
    try:
        trace = read_trace(trace_dir)
    except TraceFormatError:
        return None
    if trace.clock != "mono":
        return None
    interrupts = timer_interrupt_costs(trace, int(header["cpu"]))
    if interrupts is None:
        return None
    ticks = interrupts.loc[interrupts["tick"], "entry_ns"].to_numpy(dtype=np.int64)
    return ticks - int(header["t0_ns"])


FRESH_FTQ_COLUMNS = ["host_id", "bundle", "run", "condition", "quantum_ns", "index", "count", "source"]


def _bundle_ftq(ref: BundleRef, measured: list[str]) -> tuple[list[dict], pd.DataFrame]:
    """The measured quanta of a bundle's ``measured`` runs, in one frame (index, count; run after run) with each run's
    quantum and number of quanta: once per sealed bundle (analysis/derived.py), so a report reads one file per bundle,
    not one per run."""

    def compute() -> tuple[list[dict], pd.DataFrame]:
        meta, frames = [], []
        for run in measured:
            header, samples = _measured_ftq(str(ref.path / "raw" / run / "ftq.dat"))
            meta.append({"run": run, "quantum_ns": int(header["quantum_ns"]), "quanta": len(samples)})
            frames.append(samples[["index", "count"]])
        return meta, pd.concat(frames, ignore_index=True)

    return derived.per_run(ref, "ftq-fresh", DERIVED_BY, None, {"runs": measured}, compute, frame=True)


def fresh_ftq(bundles: list[BundleRef]) -> pd.DataFrame:
    """Every measured FTQ sample (warm-up quanta dropped) of every testable nohz bundle."""
    runs, numbers = [], []
    for ref, bundle in usable_bundles(bundles):
        if bundle.manifest.workload_tool != "ftq":
            continue
        records = bundle.manifest.measured_runs()
        if not records:
            continue
        condition = {record.run: record.condition for record in records}
        meta, samples = _bundle_ftq(ref, [record.run for record in records])
        for run in meta:
            path = ref.path / "raw" / run["run"] / "ftq.dat"
            runs.append(
                {
                    **run,
                    "host_id": ref.host_id,
                    "bundle": ref.path.name,
                    "condition": condition[run["run"]],
                    "source": str(rawfile.locate(path)),
                }
            )
        numbers.append(samples)
    if not runs:
        return pd.DataFrame(columns=FRESH_FTQ_COLUMNS)
    # a run's labels repeated over its quanta in one step per column (a frame per run, labelled and concatenated,
    # took a second of every report for the bundled 1.8 million quanta)
    quanta = [run["quanta"] for run in runs]
    labels = {
        name: np.repeat(
            np.array([run[name] for run in runs], dtype=np.int64 if name == "quantum_ns" else object), quanta
        )
        for name in ("host_id", "bundle", "run", "condition", "quantum_ns", "source")
    }
    values = {name: np.concatenate([samples[name].to_numpy() for samples in numbers]) for name in ("index", "count")}
    return pd.DataFrame({**labels, **values}, columns=FRESH_FTQ_COLUMNS)


SORTED_CURVE_POINTS = 2000  # the figure is 840 pixels across at its 120 dpi


def ftq_sorted_figure(samples: pd.DataFrame, setup: str):
    """Seed 004's figure from fresh runs: every quantum's work count, sorted from least to most work (the bad
    samples on the far left, as in the source), per condition (all runs pooled), as a fraction of the setup's
    largest count, so conditions with different quanta share one axis. A sorted curve is drawn through at most
    ``SORTED_CURVE_POINTS`` evenly spaced ranks, its first and last included: more than the figure has pixels across
    (a condition pools up to 280,000 quanta in the bundled data)."""
    on_setup = samples[samples["host_id"] == setup]
    peak = on_setup["count"].max()
    fig, ax = plt.subplots(figsize=(7, 4))
    for condition, group in on_setup.groupby("condition"):
        counts = np.sort(group["count"].to_numpy()) / peak
        share = np.arange(1, len(counts) + 1) / len(counts)
        ranks = np.unique(np.linspace(0, len(counts) - 1, SORTED_CURVE_POINTS).round().astype(int))
        ax.plot(
            share[ranks],
            counts[ranks],
            color=CONDITION_COLORS.get(condition),
            linestyle=CONDITION_STYLES.get(condition, "-."),
            linewidth=1.5,
            label=f"{CONDITION_LABELS.get(condition, condition)} ({group['run'].nunique()} runs, "
            f"{len(counts)} quanta of {group['quantum_ns'].iloc[0] / 1000:g} µs)",
        )
    ax.set_xlabel("fraction of quanta (sorted by work done)")
    ax.set_ylabel("work per quantum / setup's maximum")
    ax.set_ylim(0, 1.02)
    ax.set_title(f"FTQ samples sorted by work (fresh)\n{setup}", fontsize=9)
    ax.legend(fontsize=8, loc="lower right")
    return fig


# Seed 004's statement about its FTQ figure, verbatim (lines 40-43 of the source; a test finds it there).
SHELF_STATEMENT = (
    'Notice how with the timer tick turned off, the results show long "shelves" of near-identical values. '
    "More than half the samples fall into one such shelf, consistently completing almost the same "
    "hundreds of thousands of iterations within ~20 iterations of each other."
)
# ticklab's reading of "within ~20 iterations of each other": counts at most 20 apart (max − min ≤ 20), i.e. within ±10
# of the window's centre. Our threshold for a qualitative statement, not a published number.
SHELF_WIDTH = 20


def largest_shelf(counts, width: int = SHELF_WIDTH) -> dict:
    """The largest "shelf" of one run's FTQ samples: the most quanta whose work counts lie within ``width``
    iterations of each other, i.e. in one window [low, low + width] (±width/2 around its centre), placed where it
    holds the most quanta (the densest window; every window starting at a sample's count is tried, and a densest
    window can always be slid up to start at one). Ties go to the lowest window. Returns the quanta, how many lie in
    the shelf and their share, the window's ends, and the run's median count for scale."""
    ordered = np.sort(np.asarray(counts, dtype=float))
    if ordered.size == 0:
        raise ValueError("largest_shelf: no samples")
    inside = np.searchsorted(ordered, ordered + width, side="right") - np.arange(ordered.size)
    first = int(np.argmax(inside))
    return {
        "quanta": int(ordered.size),
        "in_shelf": int(inside[first]),
        "share": float(inside[first] / ordered.size),
        "low": float(ordered[first]),
        "high": float(ordered[first] + width),
        "median": float(np.median(ordered)),
    }


SHELF_CAPTION = (
    f"Seed 004's FTQ shelf statement (its words, first row) and ticklab's measurement of it on fresh FTQ runs: per "
    f"run, the largest share of quanta whose counts lie in one window of {SHELF_WIDTH} iterations "
    f"(±{SHELF_WIDTH // 2}), placed where it holds the most (the densest window); {SHELF_WIDTH} is ticklab's "
    'reading of the source\'s qualitative "~20 iterations", not a published threshold. Our quanta and '
    "counts per quantum are not the source's (its quantum is not in the text; its samples completed "
    "hundreds of thousands of iterations), so the same window is a larger share of a quantum's work here "
    "(last column): compare conditions within a setup, not with the source"
)
SHELF_COLUMNS = [
    "measured by",
    "setup",
    "condition",
    "quantum (µs)",
    "runs",
    "median count per quantum (iterations)",
    "shelf window (iterations)",
    "largest shelf (% of quanta, median over runs)",
    "largest shelf, range over runs",
    "runs with more than half in one shelf",
    "window / median count (%)",
]


def ftq_shelf_table(samples: pd.DataFrame, published: PublishedClaim, width: int = SHELF_WIDTH) -> pd.DataFrame:
    """Seed 004's shelf statement (its words, first row) and ticklab's measurement of it on fresh FTQ runs: per setup
    and condition, each run's largest shelf (largest_shelf: the densest window of ``width`` iterations, ±width/2
    around its centre), as the median share over runs (%), its range over runs, how many runs put more than half
    their quanta in one shelf, and the median count per quantum (median over runs) with the window as a share of it
    for scale. The window width is ticklab's reading of the source's "~20 iterations", not a printed threshold."""
    row = lambda row_id: published.row("ftq_observations", row_id)  # noqa: E731
    share, spread = row("shelf_fraction"), row("shelf_width")
    rows: list[dict] = [
        {
            "measured by": "seed 004 (its statement, qualitative; n = 1)",
            "setup": "ThinkPad T60p (x86_32)",
            "condition": "nohz hack (tick off)",
            "quantum (µs)": "not in the text",
            "runs": "not in the text",
            "median count per quantum (iterations)": "hundreds of thousands (as printed)",
            "shelf window (iterations)": f"within {spread['value_as_printed']} of each other (as printed)",
            "largest shelf (% of quanta, median over runs)": (
                f"{share['qualifier']} {share['value_as_printed']} (as printed)"
            ),
            "largest shelf, range over runs": "—",
            "runs with more than half in one shelf": "—",
            "window / median count (%)": "—",
        }
    ]
    # one pass over the runs, taking only their numbers (a group's string columns cost more to copy than to group)
    runs = samples.groupby(["host_id", "condition", "bundle", "run"], sort=True)
    per_run = {
        key: (largest_shelf(counts.to_numpy(), width), quantum)
        for (key, counts), quantum in zip(runs["count"], runs["quantum_ns"].first(), strict=False)
    }
    by_condition: dict[tuple, list] = {}
    for (setup, condition, _, _), shelf_and_quantum in per_run.items():
        by_condition.setdefault((setup, condition), []).append(shelf_and_quantum)
    for (setup, condition), found in by_condition.items():
        shelves = [shelf for shelf, _ in found]
        shares = np.array([100 * s["share"] for s in shelves])
        median_count = float(np.median([s["median"] for s in shelves]))
        quanta = sorted({int(quantum) for _, quantum in found})
        rows.append(
            {
                "measured by": "ticklab, its measurement of the statement (fresh FTQ runs)",
                "setup": setup,
                "condition": CONDITION_LABELS.get(condition, condition),
                "quantum (µs)": ", ".join(f"{q / 1000:g}" for q in quanta),
                "runs": len(shelves),
                "median count per quantum (iterations)": f"{median_count:.10g}",
                "shelf window (iterations)": f"densest {width}-iteration window (±{width / 2:g}), per run",
                "largest shelf (% of quanta, median over runs)": round(float(np.median(shares)), 2),
                "largest shelf, range over runs": f"{shares.min():.2f}–{shares.max():.2f}%",
                "runs with more than half in one shelf": f"{int((shares > 50).sum())} of {len(shelves)}",
                "window / median count (%)": f"{100 * width / median_count:.3g}" if median_count else "—",
            }
        )
    return pd.DataFrame(rows, columns=SHELF_COLUMNS)


def tick_spectrum(samples: pd.DataFrame, setup: str, nperseg: int = 2048) -> pd.DataFrame:
    """Welch power spectrum of the FTQ work-count series, averaged over each condition's runs: a periodic
    tick shows as a peak at HZ (and its harmonics) when the quantum samples faster than 2 × HZ."""
    rows = []
    # each run of each bundle a series of its own (runs of two bundles share names); only its numbers are copied
    on_setup = samples.loc[samples["host_id"] == setup, ["condition", "bundle", "run", "index", "count", "quantum_ns"]]
    for (condition, _, run), group in on_setup.groupby(["condition", "bundle", "run"])[
        ["index", "count", "quantum_ns"]
    ]:
        counts = group.sort_values("index")["count"].to_numpy(dtype=float)
        rate = 1e9 / group["quantum_ns"].iloc[0]
        freq, power = signal.welch(counts - counts.mean(), fs=rate, nperseg=min(nperseg, len(counts)))
        rows.append(pd.DataFrame({"condition": condition, "run": run, "frequency_hz": freq, "power": power}))
    if not rows:
        return pd.DataFrame(columns=["condition", "frequency_hz", "power"])
    spectra = pd.concat(rows)
    return spectra.groupby(["condition", "frequency_hz"], as_index=False)["power"].mean()


def tick_spectrum_figure(spectrum: pd.DataFrame, setup: str):
    fig, ax = plt.subplots(figsize=(7, 4))
    for condition, group in spectrum.groupby("condition"):
        ax.semilogy(
            group["frequency_hz"],
            group["power"],
            color=CONDITION_COLORS.get(condition),
            linestyle=CONDITION_STYLES.get(condition, "-."),
            linewidth=1,
            label=CONDITION_LABELS.get(condition, condition),
        )
    for hz in (250, 1000):
        if spectrum["frequency_hz"].max() >= hz:
            ax.axvline(hz, color="grey", linestyle=":", linewidth=1)
            ax.annotate(f"{hz} Hz", (hz, ax.get_ylim()[1]), textcoords="offset points", xytext=(3, -12), fontsize=8)
    ax.set_xlabel("frequency (Hz)")
    ax.set_ylabel("power of work-count fluctuations (Welch)")
    ax.set_title(f"Welch spectrum of FTQ work counts (fresh)\n{setup}", fontsize=9)
    ax.legend(fontsize=8)
    return fig


def osnoise_rows(text: str) -> list[dict]:
    """rtla osnoise top -q rows: per CPU, runtime and noise (µs), % CPU available, and the interference counts."""
    return [
        {
            "cpu": int(m.group(1)),
            "runtime_us": int(m.group(2)),
            "noise_us": int(m.group(3)),
            "cpu_available_pct": float(m.group(4)),
            "max_noise_us": int(m.group(5)),
            "irqs": int(m.group(9)),
            "softirqs": int(m.group(10)),
        }
        for m in _OSNOISE_ROW.finditer(text)
    ]


def _osnoise_rows_of(ref: BundleRef, run: str | None, extra: dict) -> list[dict]:
    """osnoise_rows of one osnoise extra's stdout.txt, once per sealed bundle (analysis/derived.py)."""
    return derived.per_run(
        ref,
        "osnoise-rows",
        DERIVED_BY,
        run,
        {"extra": extra},
        lambda: osnoise_rows(rawfile.read_text(ref.path / "raw" / extra["directory"] / "stdout.txt")),
    )


def _osnoise_by_run(ref: BundleRef, entries: list[tuple[str, str, dict]]) -> list[dict]:
    """(condition, run, extras entry) -> one row per osnoise run that gave a reading."""
    rows = []
    for condition, run, extra in entries:
        if extra.get("name") != "osnoise" or extra.get("status") != "ok":
            continue
        parsed = _osnoise_rows_of(ref, run, extra)
        if parsed and parsed[-1]["runtime_us"] > 0:
            last, seconds = parsed[-1], parsed[-1]["runtime_us"] / 1e6
            rows.append(
                {
                    "condition": condition,
                    "run": run,
                    "noise_pct": 100 - last["cpu_available_pct"],
                    "noise_us_per_irq": last["noise_us"] / last["irqs"] if last["irqs"] else np.nan,
                    "irqs_per_s": last["irqs"] / seconds,
                    "softirqs_per_s": last["softirqs"] / seconds,
                }
            )
    return rows


OSNOISE_COLUMNS = [
    "setup",
    "condition",
    "runs",
    "FTQ: work lost (%)",
    "osnoise runs",
    "osnoise: noise (% of CPU)",
    "osnoise: IRQs/s",
    "osnoise: softirqs/s",
    "osnoise: noise per IRQ (µs, all noise / IRQs)",
    "gap detector runs",
    "gap detector: µs lost per tick (median)",
    "gap detector: lost (% of CPU)",
]


def _gap_cost(ref: BundleRef, run: str | None, extra: dict, period_ns: int | None) -> dict | None:
    """tickcost.gap_tick_cost of one gapdet extra for a tick period, or None where its output cannot be read, once
    per sealed bundle (analysis/derived.py)."""

    def compute() -> dict | None:
        try:
            header, gaps = read_gapdet(ref.path / "raw" / extra["directory"] / "stdout.txt")
        except WorkloadOutputError:
            return None
        return gap_tick_cost(gaps, header, period_ns)

    return derived.per_run(ref, "gapdet-cost", DERIVED_BY, run, {"extra": extra, "period_ns": period_ns}, compute)


def _gapdet_summary(ref: BundleRef, entries: list[tuple[str, str, dict]], condition: str, rates: pd.Series) -> dict:
    """The gap detector's per-run readings for one condition (medians over runs): µs lost per tick period at the
    tick's phase (TICK_NSEC for the HZ nearest the run's traced tick rate, ``rates`` by run), and all its lost time
    as a share of the CPU."""
    per_tick, lost = [], []
    for cond, run, extra in entries:
        if cond != condition or extra.get("name") != "gapdet" or extra.get("status") != "ok":
            continue
        cost = _gap_cost(ref, run, extra, nominal_period_ns(float(rates.get(run, np.nan))))
        if cost is None:
            continue
        per_tick.append(cost["tick_gap_us_median"])
        lost.append(100 * cost["gap_fraction"])
    return {
        "gap detector runs": len(lost),
        # NaN where no run had a periodic tick (nohz_full): no all-NaN median warning in the notebook
        "gap detector: µs lost per tick (median)": (
            float(np.nanmedian(per_tick)) if np.isfinite(per_tick).any() else np.nan
        ),
        "gap detector: lost (% of CPU)": float(np.median(lost)) if lost else np.nan,
    }


def _sound_lost(ref: BundleRef, runs, rates: pd.Series) -> float:
    """Median over ``runs`` of FTQ's work lost against the median tick-free quantum (NaN where none is tick-free)."""
    lost = []
    for run in runs:
        try:
            lost.append(
                _ftq_run_cost(
                    str(ref.path / "raw" / run / "ftq.dat"), nominal_period_ns(float(rates.get(run, np.nan)))
                )["lost_fraction"]
            )
        except (WorkloadOutputError, TickCostError):
            continue  # the per-tick table says why, per run
    return float(np.nanmedian(lost)) if lost and np.isfinite(lost).any() else np.nan


def ftq_vs_osnoise(bundles: list[BundleRef]) -> pd.DataFrame:
    """Per setup and condition: the CPU share FTQ lost (median over runs of 1 − mean / median tick-free work per
    quantum, tickcost.ftq_tick_cost; NaN where no quantum is tick-free) next to
    what osnoise measured on the same CPU (medians over its runs): right after each FTQ run in the same boot where
    the experiment runs it per run, else once per condition. osnoise's IRQ count includes the tick's interrupts."""
    rows = []
    for ref, bundle in usable_bundles(bundles):
        results = bundle.results[bundle.results["metric"] == "ftq_noise_fraction"]
        rates = bundle.results[bundle.results["metric"] == "tick_rate_hz"].set_index("run")["value"]
        entries = [(r.condition, r.run, e) for r in bundle.manifest.measured_runs() for e in r.extras]
        entries += [(e.get("condition"), None, e) for e in bundle.manifest.extras or []]
        osnoise = pd.DataFrame(
            _osnoise_by_run(ref, entries),
            columns=["condition", "run", "noise_pct", "noise_us_per_irq", "irqs_per_s", "softirqs_per_s"],
        )
        for condition, group in results.groupby("condition"):
            mine = osnoise[osnoise["condition"] == condition]
            rows.append(
                {
                    "setup": ref.host_id,
                    "condition": condition,
                    "runs": len(group),
                    "FTQ: work lost (%)": 100 * _sound_lost(ref, group["run"], rates),
                    "osnoise runs": len(mine),
                    "osnoise: noise (% of CPU)": mine["noise_pct"].median(),
                    "osnoise: IRQs/s": mine["irqs_per_s"].median(),
                    "osnoise: softirqs/s": mine["softirqs_per_s"].median(),
                    "osnoise: noise per IRQ (µs, all noise / IRQs)": mine["noise_us_per_irq"].median(),
                    **_gapdet_summary(ref, entries, condition, rates),
                }
            )
    return pd.DataFrame(rows, columns=OSNOISE_COLUMNS)


TICK_METRICS = {
    "local_timer_irq_rate_hz": "local timer interrupts/s (the tick and other hrtimers)",
    "local_timer_irq_duration_median_us": "median interrupt duration (µs, softirqs not included)",
    "local_timer_irq_time_fraction": "share of the busy CPU (%)",
    "ftq_noise_fraction": "sensitivity only: FTQ work lost (%, old 1 − mean/max; see the per-tick table)",
}


def fresh_tick_table(runs: pd.DataFrame) -> pd.DataFrame:
    """The tick as the busy CPU saw it, per setup and condition (medians over runs), next to which the
    published ~80 µs and 8% at HZ=1000 are read."""
    chosen = runs[runs["metric"].isin(TICK_METRICS)]
    if chosen.empty:
        return pd.DataFrame()
    table = chosen.pivot_table(index=["host_id", "condition"], columns="metric", values="value", aggfunc="median")
    for percent in ("local_timer_irq_time_fraction", "ftq_noise_fraction"):
        if percent in table:
            table[percent] = 100 * table[percent]
    table = table[[m for m in TICK_METRICS if m in table]].rename(columns=TICK_METRICS)
    table["runs"] = chosen[chosen["metric"] == "ftq_noise_fraction"].groupby(["host_id", "condition"]).size()
    return table.round(3)


# The tick's whole cost per tick (tracemetrics.tick_rows), beside seed 004's ~80 µs: (metric, quantity shown,
# shown as a percentage?, needs softirq events?)
PER_TICK_COLUMNS = [
    ("tick_rate_hz", "tick rate (Hz, from tick expiries)", False, False),
    ("tick_us_median", "µs per tick, median (irq + softirq)", False, True),
    ("tick_us_p99", "µs per tick, p99 (irq + softirq)", False, True),
    ("tick_irq_us_median", "µs per tick in the interrupt alone, median", False, False),
    ("tick_time_fraction", "tick's share of the CPU (%, irq + softirq)", True, True),
    ("nontick_timer_irq_rate_hz", "non-tick timer interrupts/s", False, False),
    ("nontick_timer_us_median", "µs per non-tick timer interrupt, median (irq + softirq)", False, True),
    ("nontick_timer_us_p99", "µs per non-tick timer interrupt, p99 (irq + softirq)", False, True),
    ("nontick_timer_time_fraction", "non-tick timer interrupts' share of the CPU (%, irq + softirq)", True, True),
]
NO_SOFTIRQS = "not recorded in this bundle (captured before softirq events were traced)"
NO_TICK_EXPIRIES = "not recorded in this bundle (captured before ticks were told from other timer interrupts)"
SOFTIRQ_EVENT = "irq:softirq_entry"


def _traced_events(bundles: list[BundleRef]) -> dict[str, set]:
    return {
        str(ref.path): set((bundle.manifest.tracing or {}).get("events") or [])
        for ref, bundle in usable_bundles(bundles)
    }


def per_tick_table(runs: pd.DataFrame, bundles: list[BundleRef], published: PublishedClaim) -> pd.DataFrame:
    """Measured µs per tick — the local timer interrupts that ran the tick's hrtimer, each with the softirqs it
    raised on that CPU (tracemetrics.timer_interrupt_costs says exactly what is attributed) — beside seed 004's
    ~80 µs, per setup and condition, one row per quantity; the same for the other (non-tick) timer interrupts.
    ``measured`` is the median over runs of the per-run value (a run's median or p99 over its ticks). A bundle
    captured before softirq events were traced says so, in one row when it has none of these quantities."""
    ftq = runs[runs["metric"] == "ftq_noise_fraction"]
    if ftq.empty:
        return pd.DataFrame()
    costs = tick_cost_runs(runs, bundles)
    events = _traced_events(bundles)
    seed_us = published.value("tick_cost", "tick_duration")
    seed_cell = (
        f"{published.row('tick_cost', 'tick_duration')['qualifier']} {seed_us:g} (printed "
        f"'{published.printed('tick_cost', 'tick_duration')}', {published.quote_id('tick_cost', 'tick_duration')})"
    )
    rows = []
    for (setup, condition), group in ftq.groupby(["host_id", "condition"]):
        chosen = runs[(runs["host_id"] == setup) & (runs["condition"] == condition)]
        traced = set().union(*(events.get(b, set()) for b in group["bundle"].unique()))
        head = {"setup": setup, "condition": condition, "runs": group["run"].nunique()}
        mine = costs[(costs["setup"] == setup) & (costs["condition"] == condition)]
        hz = 1e9 / float(mine["period_ns"].dropna().median()) if mine["period_ns"].notna().any() else float("nan")
        workload = _workload_cost_rows(mine, head, seed_us, seed_cell, hz)
        if not chosen["metric"].isin([metric for metric, *_ in PER_TICK_COLUMNS]).any():
            rows.append(
                {
                    **head,
                    "quantity": "µs per tick (irq + softirq), the tick told from other timer interrupts",
                    "measured": NO_SOFTIRQS if SOFTIRQ_EVENT not in traced else NO_TICK_EXPIRIES,
                }
            )
            rows += workload + _lost_work_rows(mine, chosen, head)
            continue
        for metric, quantity, percent, needs_softirqs in PER_TICK_COLUMNS:
            values = chosen.loc[chosen["metric"] == metric, "value"]
            row = {**head, "quantity": quantity}
            if values.empty:
                row["measured"] = NO_SOFTIRQS if needs_softirqs and SOFTIRQ_EVENT not in traced else NO_TICK_EXPIRIES
            else:
                row["measured"] = round(float(values.median()) * (100 if percent else 1), 3)
            if metric in ("tick_us_median", "tick_us_p99"):
                row["seed 004 (ThinkPad T60p, HZ=1000)"] = seed_cell
                if isinstance(row["measured"], float):
                    row["measured / seed"] = round(row["measured"] / seed_us, 3)
            rows.append(row)
        rows += workload + _lost_work_rows(mine, chosen, head)
    columns = [
        "setup",
        "condition",
        "runs",
        "quantity",
        "measured",
        "seed 004 (ThinkPad T60p, HZ=1000)",
        "measured / seed",
    ]
    return pd.DataFrame(rows).reindex(columns=columns).fillna("")


NO_GAPDET = "not recorded in this bundle (captured before the gap detector ran per run)"
TICK_COST_COLUMNS = [
    "setup",
    "condition",
    "bundle",
    "run",
    "period_ns",
    "ftq_lost_fraction",
    "ftq_lost_fraction_max",
    "ftq_ticks",
    "ftq_tick_us_median",
    "ftq_tick_us_p99",
    "ftq_tick_us_mean",
    "ftq_method",
    "ftq_reason",
    "gap_ticks",
    "gap_tick_us_median",
    "gap_tick_us_p99",
    "gap_tick_share_of_gaps",
    "gap_tick_fraction",
    "gap_reason",
    "matched_ticks",
    "matched_unmatched",
    "matched_tick_us_median",
    "matched_tick_us_p99",
    "matched_span_us_median",
    "matched_before_entry_us_median",
    "matched_after_span_us_median",
    "matched_share_of_gaps",
    "matched_tick_fraction",
    "matched_reason",
]
NO_GAPDET_TRACE = "the gap detector was not traced in this run (bundles before the traced per-run extra)"


def _matched_gap_row(ref: BundleRef, entry: dict, header: dict, gaps: pd.DataFrame) -> dict:
    """The matched_* columns of tick_cost_runs for one gapdet extra: its gaps matched to the ticks of its own trace
    (tickcost.matched_gap_tick_cost), or the reason they cannot be."""
    if not entry.get("trace"):
        return {"matched_reason": NO_GAPDET_TRACE}
    try:
        trace = read_trace(ref.path / "raw" / entry["directory"] / entry["trace"]["directory"])
    except TraceFormatError as exc:
        return {"matched_reason": str(exc)}
    if trace.clock != "mono":
        return {
            "matched_reason": f"the gap detector's trace is on the {trace.clock or 'unknown'} trace clock, not mono "
            "(CLOCK_MONOTONIC): its ticks cannot be matched to gaps"
        }
    interrupts = timer_interrupt_costs(trace, int(header["cpu"]))
    if interrupts is None:
        return {
            "matched_reason": "the gap detector's trace cannot tell the tick from other hrtimers (no tick "
            "callback address)"
        }
    if entry["trace"].get("lost_events"):
        return {"matched_reason": f"the gap detector's trace lost {entry['trace']['lost_events']} events"}
    matched = matched_gap_tick_cost(gaps, header, interrupts)
    return {
        "matched_ticks": matched["ticks"],
        "matched_unmatched": matched["ticks"] - matched["matched"],
        "matched_tick_us_median": matched["tick_gap_us_median"],
        "matched_tick_us_p99": matched["tick_gap_us_p99"],
        "matched_span_us_median": matched["span_us_median"],
        "matched_before_entry_us_median": matched["before_entry_us_median"],
        "matched_after_span_us_median": matched["after_span_us_median"],
        "matched_share_of_gaps": matched["tick_share_of_gap_time"],
        "matched_tick_fraction": matched["tick_fraction"],
        "matched_reason": matched["reason"],
    }


def _gap_columns(ref: BundleRef, run: str, entry: dict, period_ns: int | None) -> dict:
    """The gap_* and matched_* columns of tick_cost_runs for one run's gapdet extra (tickcost.gap_tick_cost for the
    run's tick period and _matched_gap_row), or its gap_reason where the output cannot be read; once per sealed bundle
    (analysis/derived.py)."""

    def compute() -> dict:
        columns: dict = {}
        try:
            header, gaps = read_gapdet(ref.path / "raw" / entry["directory"] / "stdout.txt")
            gap = gap_tick_cost(gaps, header, period_ns)
            columns.update(
                gap_ticks=gap["n"],
                gap_tick_us_median=gap["tick_gap_us_median"],
                gap_tick_us_p99=gap["tick_gap_us_p99"],
                gap_tick_share_of_gaps=gap["tick_share_of_gap_time"],
                gap_tick_fraction=gap["tick_fraction"],
                gap_reason=gap["reason"],
            )
            columns.update(_matched_gap_row(ref, entry, header, gaps))
        except WorkloadOutputError as exc:
            columns["gap_reason"] = str(exc)
        return columns

    return derived.per_run(ref, "gapdet-columns", DERIVED_BY, run, {"extra": entry, "period_ns": period_ns}, compute)


def tick_cost_runs(runs: pd.DataFrame, bundles: list[BundleRef]) -> pd.DataFrame:
    """Per measured run of every testable FTQ bundle: the work the tick takes from the workload (issue 26), from
    FTQ's own quanta (tickcost.ftq_tick_cost: quanta near a tick against the median tick-free quantum, and lost work
    against that median) and from the gap detector run right after it (tickcost.gap_tick_cost), each with the
    reason where a run cannot give it. The tick period is TICK_NSEC for the HZ nearest the run's traced tick rate
    (``tick_rate_hz``, else ``local_timer_irq_rate_hz``, in ``runs``). Runs not in ``runs`` (left out by their
    condition checks) are not measured."""
    needed = {"host_id", "bundle", "run", "metric", "value"}
    if not needed <= set(runs.columns):
        raise ValueError(f"tick_cost_runs needs runs with columns {sorted(needed)}, got {sorted(runs.columns)}")
    rows = []
    for ref, bundle in usable_bundles(bundles):
        if bundle.manifest.workload_tool != "ftq":
            continue
        mine = runs[runs["bundle"] == str(ref.path)]
        for record in bundle.manifest.measured_runs():
            if record.run not in set(mine["run"]):
                continue  # left out of ``runs`` (a condition check failed or could not be computed): not measured here
            metrics = mine[mine["run"] == record.run].set_index("metric")["value"]
            rate = metrics.get("tick_rate_hz", metrics.get("local_timer_irq_rate_hz", np.nan))
            period = nominal_period_ns(float(rate))
            row = {
                "setup": ref.host_id,
                "condition": record.condition,
                "bundle": str(ref.path),
                "run": record.run,
                "period_ns": period,
            }
            try:
                ftq = _ftq_run_cost(str(ref.path / "raw" / record.run / "ftq.dat"), period)
                row.update(
                    ftq_lost_fraction=ftq["lost_fraction"],
                    ftq_lost_fraction_max=ftq["lost_fraction_max"],
                    ftq_ticks=ftq["n"],
                    ftq_tick_us_median=ftq["tick_lost_us_median"],
                    ftq_tick_us_p99=ftq["tick_lost_us_p99"],
                    ftq_tick_us_mean=ftq["tick_lost_us_mean"],
                    ftq_method=ftq["method"],
                    ftq_reason=ftq["reason"],
                )
            except (WorkloadOutputError, TickCostError) as exc:
                row["ftq_reason"] = str(exc)
            entry = record.extra("gapdet")
            if entry is None or entry.get("status") != "ok":
                row["gap_reason"] = (
                    NO_GAPDET
                    if entry is None
                    else f"gapdet {entry.get('status') or 'skipped'}: "
                    f"{entry.get('skipped') or entry.get('error') or ''}"
                )
            else:
                row.update(_gap_columns(ref, record.run, entry, period))
            row.setdefault("matched_reason", row.get("gap_reason") or NO_GAPDET_TRACE)
            rows.append(row)
    return pd.DataFrame(rows).reindex(columns=TICK_COST_COLUMNS)


# (column of tick_cost_runs, quantity shown, scale, compared with seed 004's µs per tick?)
WORKLOAD_COST_ROWS = [
    (
        "ftq_tick_us_median",
        "µs of work lost per tick, FTQ (the quanta holding a tick vs the median tick-free quantum), median",
        1,
        True,
    ),
    ("ftq_method", "how FTQ's quanta were matched to ticks", 1, False),
    ("ftq_tick_us_p99", "µs of work lost per tick, FTQ, p99", 1, True),
    ("ftq_ticks", "ticks measured by FTQ (per run)", 1, False),
    ("ftq_tick_share", "tick's share of the CPU from FTQ's cost (%, median µs lost per tick × tick rate)", 100, False),
    (
        "gap_tick_us_median",
        "µs lost per tick, gap detector (gaps at the tick's phase, per tick period), median",
        1,
        True,
    ),
    ("gap_tick_us_p99", "µs lost per tick, gap detector, p99", 1, True),
    ("gap_ticks", "tick periods seen by the gap detector (per run)", 1, False),
    ("gap_tick_fraction", "tick's share of the CPU from the gap detector (%)", 100, False),
    ("gap_tick_share_of_gaps", "share of the gap detector's lost time the tick explains (%)", 100, False),
    (
        "matched_tick_us_median",
        "µs lost per tick, gap detector with each traced tick matched to its gap, median",
        1,
        True,
    ),
    ("matched_tick_us_p99", "µs lost per tick, gap detector matched to traced ticks, p99", 1, True),
    (
        "matched_span_us_median",
        "… of which the traced span (local_timer_entry to the last attributed softirq's exit), µs, median",
        1,
        False,
    ),
    (
        "matched_before_entry_us_median",
        "… lost before local_timer_entry (delivery, entry code, VM exit), µs, median",
        1,
        False,
    ),
    (
        "matched_after_span_us_median",
        "… lost after the traced span (exit code, return to the task), µs, median",
        1,
        False,
    ),
    ("matched_ticks", "traced ticks while the gap detector ran (per run)", 1, False),
    ("matched_unmatched", "traced ticks inside no gap (per run; above 0 means the clocks disagree)", 1, False),
    ("matched_tick_fraction", "tick's share of the CPU from the matched gaps (%)", 100, False),
    ("matched_share_of_gaps", "share of the gap detector's lost time the matched ticks explain (%)", 100, False),
]


def _workload_cost_rows(costs: pd.DataFrame, head: dict, seed_us: float, seed_cell: str, hz: float) -> list[dict]:
    """Issue 26: the tick's cost as the workload loses it, beside the tracepoint span and seed 004's ~80 µs."""
    if costs.empty:
        return []
    costs = costs.assign(ftq_tick_share=pd.to_numeric(costs["ftq_tick_us_median"], errors="coerce") * hz / 1e6)
    rows = []
    for column, quantity, scale, seeded in WORKLOAD_COST_ROWS:
        if column == "ftq_method":
            methods = [m for m in costs[column].dropna().unique() if m]
            reasons = [r for r in costs["ftq_reason"].dropna().unique() if r]
            rows.append(
                {
                    **head,
                    "quantity": quantity,
                    "measured": "; ".join(f"{m} ({int((costs[column] == m).sum())} runs)" for m in methods)
                    or (f"no tick placed: {reasons[0]}" if reasons else "not measurable"),
                }
            )
            continue
        values = pd.to_numeric(costs[column], errors="coerce").dropna()
        reason_column = {"gap": "gap_reason", "matched": "matched_reason"}.get(column.split("_")[0], "ftq_reason")
        if values.empty:
            reasons = [r for r in costs[reason_column].dropna().unique() if r]
            rows.append({**head, "quantity": quantity, "measured": reasons[0] if reasons else "not measurable"})
            continue
        row = {**head, "quantity": quantity, "measured": round(float(values.median()) * scale, 3)}
        if seeded:
            row["seed 004 (ThinkPad T60p, HZ=1000)"] = seed_cell
            row["measured / seed"] = round(row["measured"] / seed_us, 3)
        rows.append(row)
    return rows


def _lost_work_rows(costs: pd.DataFrame, chosen: pd.DataFrame, head: dict) -> list[dict]:
    """FTQ's lost work per run against the median tick-free quantum (1 − mean / median work of the quanta no tick
    touches, tickcost.ftq_lost_fraction), the old 1 − mean/max as a labelled sensitivity row (it also counts how much
    faster than usual the fastest quantum ran), and the share of the lost work the traced tick explains (the tick's
    traced share of the CPU over the lost work, per run, median over runs)."""
    rows = []
    lost = costs.set_index(["bundle", "run"])["ftq_lost_fraction"].astype(float).dropna()
    if lost.empty:
        reasons = [r for r in costs["ftq_reason"].dropna().unique() if r]
        rows.append(
            {
                **head,
                "quantity": "FTQ work lost (%, 1 − mean / median tick-free quantum)",
                "measured": reasons[0] if reasons else "not measurable",
            }
        )
    else:
        rows.append(
            {
                **head,
                "quantity": "FTQ work lost (%, 1 − mean / median tick-free quantum)",
                "measured": round(float(lost.median()) * 100, 3),
            }
        )
    old = costs["ftq_lost_fraction_max"].astype(float).dropna()
    if not old.empty:
        rows.append(
            {
                **head,
                "quantity": "sensitivity only: FTQ work lost (%, old 1 − mean/max; counts speed jitter)",
                "measured": round(float(old.median()) * 100, 3),
            }
        )
    tick = chosen[chosen["metric"] == "tick_time_fraction"].set_index(["bundle", "run"])["value"]
    paired = pd.concat([tick.rename("tick"), lost.rename("lost")], axis=1, join="inner")
    paired = paired[paired["lost"] > 0]
    if not paired.empty:
        rows.append(
            {
                **head,
                "quantity": "share of FTQ's lost work the traced tick span explains (%)",
                "measured": round(float((paired["tick"] / paired["lost"]).median()) * 100, 3),
            }
        )
    return rows


def derived_targets_from_measured(costs: pd.DataFrame) -> pd.DataFrame:
    """What this setup's own workload-side cost per tick implies, beside what seed 004's 80 µs implies (both derived
    by ticklab, neither printed): the work per quantum nohz_full would give back (1 / (1 − cost × HZ)) and HZ=250 vs
    HZ=1000 ((1 − cost × 250) / (1 − cost × 1000)), per setup and condition, from the median over runs of the mean µs
    lost per tick (FTQ, else the gap detector with each traced tick matched to its gap, else its gaps folded on the
    tick period; the median, as FTQ's mean also counts other noise in the quanta next to a tick)."""
    rows = []
    for (setup, condition), group in costs.groupby(["setup", "condition"]):
        for column, source in (
            ("ftq_tick_us_median", "FTQ"),
            ("matched_tick_us_median", "gap detector, matched ticks"),
            ("gap_tick_us_median", "gap detector, folded"),
        ):
            values = pd.to_numeric(group[column], errors="coerce").dropna()
            if values.empty:
                continue
            us, hz = float(values.median()), 1e9 / float(group["period_ns"].dropna().median())
            rows.append(
                {
                    "setup": setup,
                    "condition": condition,
                    "µs per tick": round(us, 3),
                    "from": source,
                    "HZ": round(hz),
                    "nohz_full gain at this HZ": round(1 / (1 - us * hz / 1e6), 5),
                    "nohz_full gain at HZ=1000": round(1 / (1 - us * 1000 / 1e6), 5),
                    "HZ=250 vs HZ=1000": round((1 - us * 250 / 1e6) / (1 - us * 1000 / 1e6), 5),
                    "provenance": f"derived from this setup's measured cost ({source}, {us:.1f} µs per tick)",
                }
            )
            break
    return pd.DataFrame(rows)


SIZES = (
    "the target assumes the ThinkPad T60p's ~80 µs per tick at every HZ; a tick's cost depends on the CPU "
    "(and under TCG on the emulator), so only the direction carries over to other setups unchanged"
)


def comparisons(published: PublishedClaim) -> list[Comparison]:
    """What the source's ~80 µs per tick implies for FTQ work per quantum and for the tick's share of the CPU
    (n = 1; every target here is derived by ticklab from the printed 80 µs, none is printed)."""
    tick_us = published.value("tick_cost", "tick_duration")
    lost_1000, lost_250 = tick_overhead_pct(tick_us, 1000) / 100, tick_overhead_pct(tick_us, 250) / 100
    printed = (
        f"{published.printed('tick_cost', 'tick_duration')}; "
        f"{published.printed('tick_cost', 'tick_overhead_hz1000')} on hz=1000"
    )
    quotes = (published.quote_id("tick_cost", "tick_duration"), published.quote_id("tick_cost", "tick_overhead_hz1000"))
    no_tick = 1 / (1 - lost_1000)
    # ±1 % FTQ work per quantum: 10 µs of each millisecond, under one tick's cost on any setup measured here; a
    # change that small is none a tick setting makes.
    work = Margins(no_effect=FTQ_NO_EFFECT)
    # ±10 % of the timer interrupt's share of the busy CPU (e.g. 0.52 % ↔ 0.47–0.57 %): it moves run to run by about
    # that with what else the interrupt finds to do.
    share = Margins(no_effect=0.10)
    quarter = (1 - lost_250) / (1 - lost_1000)
    return [
        Comparison(
            "nohz_full vs HZ=1000: FTQ work per quantum",
            "ftq_count_mean",
            "hz1000-nohz_full",
            "hz1000",
            Target(
                no_tick,
                1,
                f"derived: 1 / (1 − {tick_us:g} µs × 1000/s), the work the tick's share gives back when it stops",
                printed,
                quotes,
            ),
            margins=work,
            sizes_comparable=SIZES,
        ),
        Comparison(
            "HZ=250 vs HZ=1000: FTQ work per quantum",
            "ftq_count_mean",
            "hz250",
            "hz1000",
            Target(
                quarter,
                1,
                f"derived: (1 − {tick_us:g} µs × 250/s) / (1 − {tick_us:g} µs × 1000/s), "
                f"the same cost per tick at a quarter of the ticks",
                printed,
                quotes,
            ),
            margins=work,
            sizes_comparable=SIZES,
        ),
        # On a real machine with its own kernel, each condition a boot (runners/nohz/host-boot-ftq.yaml:
        # ticklab capture nohz --boot kexec); the target is the source's HZ=1000 one.
        Comparison(
            "nohz_full vs tick on, this kernel's HZ: FTQ work per quantum (a boot each)",
            "ftq_count_mean",
            "nohz-full",
            "tick-on",
            Target(
                no_tick,
                1,
                f"derived: 1 / (1 − {tick_us:g} µs × 1000/s), the work the tick's share "
                f"gives back when it stops, at the source's HZ=1000",
                printed,
                quotes,
            ),
            ("host-boot-ftq",),
            margins=work,
            sizes_comparable=SIZES + "; the kernel booted runs at its own HZ (the bundle's boot record), so "
            "at HZ=250 a quarter of the target's gain is all the source's cost implies",
        ),
        # The mechanism itself, from the trace: the share of the busy CPU's time in the local timer interrupt.
        Comparison(
            "HZ=250 vs HZ=1000: busy CPU's time in the timer interrupt (trace)",
            "local_timer_irq_time_fraction",
            "hz250",
            "hz1000",
            Target(
                0.25,
                -1,
                f"derived: a quarter of the ticks at the same ~{tick_us:g} µs per tick "
                f"(the source assumes a cost per tick independent of HZ)",
                printed,
                quotes,
            ),
            margins=share,
            sizes_comparable="the ×0.25 holds only if a tick costs the same at HZ=250 as at HZ=1000",
        ),
    ]


FTQ_NO_EFFECT = 0.01


def negative_controls(published: PublishedClaim) -> list[NegativeControl]:
    """HZ=1000 against itself (its later runs vs its earlier ones): anything but 'no effect' means drift over
    the capture, not the tick. The margins are the comparisons' declared no-effect margins."""
    work_margin = FTQ_NO_EFFECT
    return [
        NegativeControl(
            "HZ=1000 vs itself, later vs earlier half of its runs: FTQ work per quantum",
            "ftq_count_mean",
            "hz1000",
            "hz1000",
            work_margin,
            split_by_order=True,
        ),
        NegativeControl(
            "HZ=1000 vs itself, later vs earlier half of its runs: time in the timer interrupt (trace)",
            "local_timer_irq_time_fraction",
            "hz1000",
            "hz1000",
            0.10,
            split_by_order=True,
        ),
    ]


TICK_COST_TOLERANCE = 1.25  # declared: "about 80 µs" is consistent within ×1/1.25..×1.25 of it (64–100 µs)
TICK_COST_LEVEL = "µs of work lost per tick, tick on (FTQ's quanta; a level, beside the printed ~80 µs)"


def _is_host(setup: str) -> bool:
    """A capture on the machine itself (not a lab guest or the lab host): where a tick's cost is a CPU's, not an
    emulator's."""
    return not setup.startswith("guest-")


def tick_cost_level_verdicts(ctx, found: list, alpha: float = 0.05) -> list:
    """Seed 004's ~80 µs per tick beside each host's own: the median over the tick-on runs of each run's median µs of
    FTQ work lost per tick (tick_cost_runs: the quanta holding a tick against the median tick-free quantum), with its
    order-statistics CI against the printed value (verdicts.level_verdict); the gap detector's reading of the same
    runs beside it in the reason. Hosts only: in a TCG guest the cost is the emulator's."""
    from ..analysis.comparisons import measured_runs
    from ..analysis.verdicts import level_row, level_verdict

    runs, _ = measured_runs(ctx.bundles, CHECKS, "nohz")
    hosts = runs[runs["host_id"].map(_is_host)] if not runs.empty else runs
    if hosts.empty:
        return found
    costs = tick_cost_runs(hosts, ctx.bundles)
    costs = costs[~costs["condition"].map(lambda c: any(fnmatch.fnmatchcase(c, p) for p in _TICK_OFF))]
    printed = ctx.published.value("tick_cost", "tick_duration")
    for setup, frame in costs.groupby("setup"):
        values = pd.to_numeric(frame["ftq_tick_us_median"], errors="coerce").dropna().to_numpy()
        if len(values) == 0:
            continue
        verdict, reason, interval = level_verdict(
            values, printed, TICK_COST_TOLERANCE, alpha, f"{printed:g} µs", lambda x: f"{x:.3g} µs"
        )
        gaps = pd.to_numeric(frame["gap_tick_us_median"], errors="coerce").dropna()
        beside = (
            f"the gap detector run after each, folded on the tick period: median {gaps.median():.3g} µs per tick "
            f"over {len(gaps)} runs"
            if not gaps.empty
            else "no gap detector reading in these runs"
        )
        found.append(
            level_row(
                "nohz",
                setup,
                TICK_COST_LEVEL,
                (verdict, f"{reason}; {beside}", interval),
                printed=printed,
                tolerance=TICK_COST_TOLERANCE,
                alpha=alpha,
                n=len(values),
                published_as=(
                    ctx.published.printed("tick_cost", "tick_duration"),
                    ctx.published.quote_id("tick_cost", "tick_duration"),
                ),
                measured="ftq_tick_us_median (tickcost.ftq_tick_cost)",
            )
        )
    return found


CLAIM = Claim(
    id="nohz",
    seed="004",
    title="C5 nohz tick",
    notebook="05-nohz.ipynb",
    outputs={
        "figures": ["tick_overhead_vs_hz"],
        "tables": ["tick_cost", "tick_overhead_vs_hz", "derived_checks", "ftq_observations", "ftq_shelf", "setup"],
    },
    comparisons=comparisons,
    untested=WHAT_IS_COMPARED,
    no_headline_because="its figure's data is not in the text",
    checks=tuple(CHECKS),
    negative_controls=negative_controls,
    view=ViewPreset(
        events=(TIMER_ENTRY, TIMER_EXIT, "timer/hrtimer_expire_entry", "timer/tick_stop"),
        spot=longest_tick_gap,
        measured_cpu_only=True,
    ),
    revise_verdicts=tick_cost_level_verdicts,
    derived_from_raw=lambda runs, bundles: {
        "fresh_ftq": fresh_ftq(bundles),
        "tick_cost_runs": tick_cost_runs(runs, bundles),
        "ftq_vs_osnoise": ftq_vs_osnoise(bundles),
    },
)
