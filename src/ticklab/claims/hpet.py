"""C1 — HPET read contention (seed 000): one CPU reads the shared HPET counter, others reuse it."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from ..analysis import palette
from ..analysis.captured import BundleRef
from ..analysis.checks import FactCheck, excluded_runs, run_checks
from ..analysis.comparisons import Comparison, NegativeControl, usable_bundles
from ..analysis.lazy import plt
from ..analysis.published import PublishedClaim, PublishedDataError
from ..analysis.verdicts import Margins, Target
from ..bundle import BundleError
from ..trace import rawfile
from . import Claim, Headline
from ._points import runs_and_medians

SYSTEM_LABELS = {
    "haswell-ex-4s-72c": "4-socket Haswell-EX, 72 cores (HT off)",
    "ivybridge-ex-16s-240c": "16-socket IvyBridge-EX, 240 cores (HT on)",
}
CONDITIONS = [("tsc", "n/a", "TSC"), ("hpet", "without", "HPET w/o patch"), ("hpet", "with", "HPET with patch")]


def _cell(frame: pd.DataFrame, system: str, clocksource: str, patch: str) -> pd.Series:
    match = frame[(frame["system"] == system) & (frame["clocksource"] == clocksource) & (frame["patch"] == patch)]
    if len(match) != 1:  # the published table is input: an edited one is a data error, not a ticklab bug
        raise PublishedDataError(
            f"{frame.attrs.get('path', 'aim7_compute.csv')}: expected one row for system "
            f"{system}, clocksource {clocksource}, patch {patch}; found {len(match)}"
        )
    return match.iloc[0]


def throughput_table(published: PublishedClaim) -> pd.DataFrame:
    """Seed 000's AIM7 numbers as printed, with the ratios a reader computes from them (ours)."""
    frame = published.table("aim7_compute")
    rows = []
    for system, label in SYSTEM_LABELS.items():
        values = {name: _cell(frame, system, cs, patch) for cs, patch, name in CONDITIONS}
        tsc, without, with_ = (values[name]["value"] for _, _, name in CONDITIONS)
        rows.append(
            {
                "system": label,
                **{f"{name} (jobs/min)": values[name]["value_as_printed"] for _, _, name in CONDITIONS},
                "HPET w/o, % of TSC": round(100 * without / tsc, 2),
                "HPET with, % of TSC": round(100 * with_ / tsc, 2),
                "with / w/o": round(with_ / without, 3),
            }
        )
    return pd.DataFrame(rows).set_index("system")


def sharing_ratios(published: PublishedClaim) -> dict[str, float]:
    """HPET-with-patch over HPET-without throughput per system: the effect the claim is about."""
    frame = published.table("aim7_compute")
    return {
        system: _cell(frame, system, "hpet", "with")["value"] / _cell(frame, system, "hpet", "without")["value"]
        for system in SYSTEM_LABELS
    }


def throughput_figure(published: PublishedClaim):
    frame = published.table("aim7_compute")
    fig, ax = plt.subplots(figsize=(8, 4.2))
    width = 0.26
    # TSC the reference, the patch the change; each also hatched its own way, so the bars read without colour
    colors = [palette.THIRD, palette.BASELINE, palette.CHANGED]
    hatches = [palette.THIRD_HATCH, None, palette.CHANGED_HATCH]
    for i, system in enumerate(SYSTEM_LABELS):
        tsc = _cell(frame, system, "tsc", "n/a")["value"]
        for j, (cs, patch, name) in enumerate(CONDITIONS):
            row = _cell(frame, system, cs, patch)
            x = i + (j - 1) * width
            pct = 100 * row["value"] / tsc
            ax.bar(
                x,
                pct,
                width,
                color=colors[j],
                hatch=hatches[j],
                edgecolor=palette.BLACK,
                linewidth=0.5,
                label=name if i == 0 else None,
            )
            ax.text(x, pct + 1.5, f"{row['value_as_printed']}\n({pct:.1f}%)", ha="center", va="bottom", fontsize=7)
        without = _cell(frame, system, "hpet", "without")["value"]
        with_ = _cell(frame, system, "hpet", "with")["value"]
        ax.annotate(
            f"patch: {100 * (with_ / without - 1):+.1f}%",
            xy=(i + width / 2, 112),
            ha="center",
            fontsize=9,
            color=palette.BLACK,
        )
    ax.set_xticks(range(len(SYSTEM_LABELS)), list(SYSTEM_LABELS.values()), fontsize=8)
    ax.set_ylabel("AIM7 compute throughput, % of TSC")
    ax.set_ylim(0, 125)
    # the jobs/min are the source's; the percentages of TSC and the patch's change are ticklab's arithmetic on them
    ax.set_title(
        "Seed 000: AIM7 compute (1500 users), 4.6-rc1, HZ=1000 — printed jobs/min (n = 1);\n"
        "% of TSC and the patch's change computed by ticklab",
        fontsize=9,
    )
    ax.legend(loc="lower right", fontsize=8)
    return fig


def profile_table(published: PublishedClaim) -> pd.DataFrame:
    frame = published.table("read_hpet_profile")
    rows = []
    for system, label in SYSTEM_LABELS.items():
        without = _cell(frame, system, "hpet", "without")
        with_ = _cell(frame, system, "hpet", "with")
        printed = lambda r: f"{r['qualifier']} {r['value_as_printed']}".strip()  # noqa: E731
        rows.append(
            {"system": label, "read_hpet, w/o patch": printed(without), "read_hpet, with patch": printed(with_)}
        )
    return pd.DataFrame(rows).set_index("system")


def profile_figure(published: PublishedClaim):
    frame = published.table("read_hpet_profile")
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    width = 0.35
    for i, system in enumerate(SYSTEM_LABELS):
        for j, (patch, color) in enumerate([("without", palette.BASELINE), ("with", palette.CHANGED)]):
            row = _cell(frame, system, "hpet", patch)
            x = i + (j - 0.5) * width
            ax.bar(
                x,
                row["value"],
                width,
                color=color,
                label=f"HPET {patch} patch" if i == 0 else None,
                hatch="//" if row["qualifier"] else None,
            )
            # the hatch here says "lower bound", so the word above each bar says which side of the patch it is
            words = "w/o" if patch == "without" else "with"
            ax.text(
                x,
                row["value"] + 0.6,
                f"{words}: {row['qualifier']} {row['value_as_printed']}".replace("  ", " "),
                ha="center",
                fontsize=8,
            )
    ax.set_xticks(range(len(SYSTEM_LABELS)), list(SYSTEM_LABELS.values()), fontsize=8)
    ax.set_ylabel("read_hpet, % of CPU time (perf)")
    ax.set_title("Seed 000: read_hpet share of CPU time — published")
    ax.legend(fontsize=8)
    ax.text(0.99, -0.22, "hatched: a lower bound ('more than')", transform=ax.transAxes, ha="right", fontsize=7)
    return fig


WHAT_IS_COMPARED = "HPET clocksource, read sharing on vs off: throughput ratio"


# -- fresh data ------------------------------------------------------------------------------------
# Guest conditions (runners/hpet/guest-*.yaml): clock = tsc | hpet-no-sharing | hpet-sharing, optionally per vCPU count.
CLOCK_LABELS = {"tsc": "TSC", "hpet-no-sharing": "HPET w/o sharing", "hpet-sharing": "HPET with sharing"}
# TSC the reference, HPET without sharing the baseline, with sharing the change (as in the published figures); each
# clock also has its own marker, so the read-rate lines read without colour
CLOCK_COLORS = {
    "tsc": palette.THIRD,
    "hpet-no-sharing": palette.BASELINE,
    "hpet-sharing": palette.CHANGED,
    "kvm-clock": palette.SKY_BLUE,
    "acpi_pm": palette.BLUISH_GREEN,
}
CLOCK_MARKERS = {"tsc": "s", "hpet-no-sharing": "o", "hpet-sharing": "^", "kvm-clock": "D", "acpi_pm": "v"}
REFERENCE_SYSTEM = "haswell-ex-4s-72c"  # the smaller of the two published machines: its ratios are the reference


STAND_IN = (
    "timejobs stands in for AIM7: the share of its work spent reading the clock is a parameter of our "
    "workload, so the size of any clock effect on it is ours to set, not AIM7's"
)


READS_NOT_AIM7 = "clock reads/s has no size in the source: only its direction is tested"

# ±2 % jobs/min: a timed job's throughput on a shared host moves by about that between runs of one condition, and a
# clocksource change smaller than that is none a throughput benchmark reports.
JOBS_NO_EFFECT = Margins(no_effect=0.02)
# ±2 % clock reads/s: the read loop's rate is the quantity itself; a change under 2 % is within the scatter of one
# condition's boots and is none a reader of the clock would notice.
READS_NO_EFFECT = Margins(no_effect=0.02)


def _reads_direction(target: Target, ratio: str, system: str) -> Target:
    """Clock reads/s against the direction of AIM7's jobs/min ratio only: the source prints no read rate, so it
    gives no size for one (its jobs/min ratio is a different quantity)."""
    return Target(
        None,
        target.direction,
        f"derived: direction only, that of AIM7's jobs/min ratio {ratio} ({target.as_printed}, {system}); "
        "the source prints no read rate, so there is no size target",
        target.as_printed,
        target.quotes,
    )


SHARING_NEEDS_CONCURRENCY = (
    "read sharing acts only when CPUs read the HPET at the same moment (one reads it and shares the value with those "
    "that arrived meanwhile), and contention needs two readers at once"
)


def comparisons(published: PublishedClaim) -> list[Comparison]:
    """Seed 000's Haswell-EX AIM7 ratios (the smaller machine) as targets for the lab's stand-ins."""
    frame = published.table("aim7_compute")
    ids = {name: _cell(frame, REFERENCE_SYSTEM, cs, patch)["id"] for cs, patch, name in CONDITIONS}
    sharing = published.ratio_target("aim7_compute", ids["HPET with patch"], ids["HPET w/o patch"])
    on_hpet = published.ratio_target("aim7_compute", ids["HPET w/o patch"], ids["TSC"])
    label = SYSTEM_LABELS[REFERENCE_SYSTEM]
    reads = _reads_direction(sharing, "with/without sharing", label)
    on_hpet_reads = _reads_direction(on_hpet, "HPET without sharing / TSC", label)
    return [
        Comparison(
            "HPET read sharing on vs off: jobs/min (timejobs, stand-in for AIM7)",
            "jobs_per_min",
            "hpet-sharing",
            "hpet-no-sharing",
            sharing,
            ("guest-timejobs",),
            margins=JOBS_NO_EFFECT,
            sizes_comparable=STAND_IN,
            needs_concurrency=SHARING_NEEDS_CONCURRENCY,
        ),
        Comparison(
            "HPET without sharing vs TSC: jobs/min (timejobs, stand-in for AIM7)",
            "jobs_per_min",
            "hpet-no-sharing",
            "tsc",
            on_hpet,
            ("guest-timejobs",),
            margins=JOBS_NO_EFFECT,
            sizes_comparable=STAND_IN,
        ),
        *[
            Comparison(
                f"HPET read sharing on vs off: clock reads/s, {n} vCPUs",
                "reads_per_s_total",
                f"hpet-sharing-{n}vcpu",
                f"hpet-no-sharing-{n}vcpu",
                reads,
                ("guest-clock-read",),
                margins=READS_NO_EFFECT,
                sizes_comparable=READS_NOT_AIM7,
                needs_concurrency=SHARING_NEEDS_CONCURRENCY,
            )
            for n in (2, 4)
        ],
        # On a real machine, each condition a boot of a kernel with our read-sharing switch
        # (runners/hpet/host-boot-clock-read.yaml: ticklab capture hpet --boot kexec)
        Comparison(
            "HPET read sharing on vs off: clock reads/s, one thread per CPU (a boot each)",
            "reads_per_s_total",
            "hpet-share-on",
            "hpet-share-off",
            reads,
            ("host-boot-clock-read",),
            margins=READS_NO_EFFECT,
            sizes_comparable=READS_NOT_AIM7,
            needs_concurrency=SHARING_NEEDS_CONCURRENCY,
        ),
        Comparison(
            "HPET without sharing vs TSC: clock reads/s, one thread per CPU (a boot each)",
            "reads_per_s_total",
            "hpet-share-off",
            "tsc-reference",
            on_hpet_reads,
            ("host-boot-clock-read",),
            margins=READS_NO_EFFECT,
            sizes_comparable=READS_NOT_AIM7,
        ),
    ]


def negative_controls(published: PublishedClaim) -> list[NegativeControl]:
    """Read sharing with one vCPU: nobody to share a read with, so sharing can change nothing (within ±5%)."""
    return [
        NegativeControl(
            "HPET read sharing on vs off with 1 vCPU (nobody to share with): clock reads/s",
            "reads_per_s_total",
            "hpet-sharing-1vcpu",
            "hpet-no-sharing-1vcpu",
            0.05,
            ("guest-clock-read",),
        )
    ]


# Did each guest run on the clocksource and sharing switch its condition names?
CHECKS = [
    # a lab guest's clocksource, else a boot plan's run's (the booted kernel's current_clocksource at the run)
    FactCheck(
        "clocksource as the condition says", "guest.clocksource|boot.clocksource", {"tsc*": "tsc", "hpet-*": "hpet"}
    ),
    FactCheck(
        "HPET read sharing switch as the condition says",
        "guest.switches.hpet_read_share",
        {"hpet-sharing*": "Y", "hpet-no-sharing*": "N"},
    ),
    # a boot plan's run: the switch as the booted kernel took it (/sys/module/kernel/parameters/hpet_read_share,
    # recorded from 2026-11-29; an older run cannot show it and is left out)
    FactCheck(
        "HPET read sharing switch as the booted kernel took it",
        "boot.switches.hpet_read_share",
        {"hpet-share-on": "Y", "hpet-share-off": "N"},
    ),
    # a boot plan's run (runners/hpet/host-boot-clock-read.yaml): the command line its boot was verified to have
    FactCheck(
        "HPET read sharing on the booted command line",
        "boot.cmdline",
        {"hpet-share-on": "hpet_read_share=1", "hpet-share-off": "hpet_read_share=0"},
        contains=True,
    ),
]


def condition_values(bundles: list[BundleRef]) -> dict[tuple[str, str], dict]:
    """(host_id, condition) -> the condition's variables, from the bundles' manifests."""
    values = {}
    for ref in bundles:
        try:
            manifest = ref.load(allow_incomplete=True).manifest
        except BundleError:  # measured_runs says why it is left out
            continue
        for name, condition in manifest.conditions_by_name.items():
            values[(ref.host_id, name)] = {k: v for k, v in condition.items() if k != "name"}
    return values


def fresh_throughput_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Seed 000's table from fresh timejobs runs: medians per setup, % of TSC, and with / w/o."""
    jobs = runs[runs["metric"] == "jobs_per_min"]
    rows = []
    for setup, group in jobs.groupby("host_id"):
        median = group.groupby("condition")["value"].median()
        counts = group.groupby("condition")["value"].size()
        if not {"tsc", "hpet-no-sharing", "hpet-sharing"} <= set(median.index):
            continue
        rows.append(
            {
                "setup": setup,
                **{
                    f"{CLOCK_LABELS[c]} (jobs/min, median of {counts[c]})": round(median[c])
                    for c in ("tsc", "hpet-no-sharing", "hpet-sharing")
                },
                "HPET w/o, % of TSC": round(100 * median["hpet-no-sharing"] / median["tsc"], 2),
                "HPET with, % of TSC": round(100 * median["hpet-sharing"] / median["tsc"], 2),
                "with / w/o": round(median["hpet-sharing"] / median["hpet-no-sharing"], 3),
            }
        )
    return pd.DataFrame(rows).set_index("setup") if rows else pd.DataFrame()


JOBS_ORDER = ("tsc", "hpet-no-sharing", "hpet-sharing")


def fresh_jobs_figure(runs: pd.DataFrame, setup: str):
    """timejobs throughput on one setup (the guest-timejobs bundles): per clocksource condition every measured run
    as a point and its median as a bar, the median written above the data (_points)."""
    chosen = runs[(runs["host_id"] == setup) & (runs["metric"] == "jobs_per_min")]
    present = set(chosen["condition"])
    conditions = [c for c in JOBS_ORDER if c in present] + sorted(present - set(JOBS_ORDER))
    groups = [
        (x, chosen.loc[chosen["condition"] == c, "value"].to_numpy(), CLOCK_COLORS.get(c, palette.GREY))
        for x, c in enumerate(conditions)
    ]
    fig, ax = plt.subplots(figsize=(max(6, 1.8 * len(conditions)), 4.4))
    runs_and_medians(ax, groups, from_zero=True, label=lambda value: f"{value:,.0f}")
    ax.set_xticks(range(len(conditions)), [f"{CLOCK_LABELS.get(c, c)}\n({c})" for c in conditions], fontsize=8)
    ax.set_xlim(-0.5, len(conditions) - 0.5)
    ax.yaxis.set_major_formatter(plt.FuncFormatter(lambda value, _: f"{value:,.0f}"))
    ax.set_ylabel("timejobs throughput (jobs/min)")
    ax.set_title(
        f"timejobs jobs/min per clocksource (fresh, {len(chosen)} runs; points = runs, bar = median);\n"
        f"a stand-in for AIM7, not AIM7 — {setup}",
        fontsize=8,
    )
    return fig


def read_rate_points(runs: pd.DataFrame, values: dict) -> pd.DataFrame:
    """Aggregate clock reads/s and mean read cost per run, with the clock and thread count of its condition."""
    reads = runs[runs["metric"].isin(["reads_per_s_total", "read_cost_mean_ns"])]
    rows = []
    for _, row in reads.iterrows():
        condition = values.get((row["host_id"], row["condition"]), {})
        clock = condition.get("clock") or condition.get("clocksource")
        threads = condition.get("vcpus") or condition.get("threads")
        if clock is None or threads is None:
            continue
        rows.append(
            {
                "host_id": row["host_id"],
                "clock": clock,
                "threads": int(threads),
                "run": row["run"],
                "metric": row["metric"],
                "value": row["value"],
            }
        )
    return pd.DataFrame(rows, columns=["host_id", "clock", "threads", "run", "metric", "value"])


def read_rate_figure(points: pd.DataFrame, setup: str):
    """Aggregate read rate and per-read cost against threads, per clock (median and range over runs)."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    on_setup = points[points["host_id"] == setup]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), layout="constrained")
    for ax, metric, label in (
        (axes[0], "reads_per_s_total", "aggregate clock reads/s"),
        (axes[1], "read_cost_mean_ns", "mean cost of one read (ns)"),
    ):
        for clock, group in on_setup[on_setup["metric"] == metric].groupby("clock"):
            summary = group.groupby("threads")["value"].agg(["median", "min", "max"])
            ax.errorbar(
                summary.index,
                summary["median"],
                yerr=[summary["median"] - summary["min"], summary["max"] - summary["median"]],
                marker=CLOCK_MARKERS.get(clock, "x"),
                capsize=3,
                color=CLOCK_COLORS.get(clock, palette.GREY),
                label=CLOCK_LABELS.get(clock, clock),
            )
        ax.set_xticks(sorted(on_setup["threads"].unique()))
        ax.set_xlabel("threads reading at once (one per vCPU / CPU)")
        ax.set_ylabel(label)
        ax.set_yscale("log")
        # a narrow range on a log axis gets one or two decades' ticks only: label 1, 2 and 5 of each decade
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:,.0f}" if value >= 1 else f"{value:g}"))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda value, _: ""))
        ax.legend(fontsize=8)
    fig.suptitle(f"Clock reads vs threads (fresh, median and range over runs)\n{setup}", fontsize=9)
    return fig


# Functions that read a clock, in user space (vDSO, libc) and in the kernel (clocksource read hooks).
CLOCK_READ_SYMBOL = re.compile(r"clock_gettime|gettimeofday|read_hpet|hpet_readl|read_tsc|kvm_clock|pvclock|ktime_get")
_PERF_LINE = re.compile(r"^\s+([\d.]+)%\s+\S+\s+(\S+)\s+\[[.k]\]\s+(\S+)", re.M)


def clock_read_share(report: str) -> tuple[float, str]:
    """From `perf report --stdio --no-children`: the share of samples in clock-reading functions (%), and
    the hottest such function. Everything in the vDSO counts (its unnamed addresses are the inlined
    clock read paths, e.g. pvclock)."""
    hits = [
        (float(pct), _symbol_name(dso, symbol))
        for pct, dso, symbol in _PERF_LINE.findall(report)
        if dso == "[vdso]" or CLOCK_READ_SYMBOL.search(symbol)
    ]
    return sum(pct for pct, _ in hits), (max(hits)[1] if hits else "")


def _symbol_name(dso: str, symbol: str) -> str:
    """perf prints a bare address where the vDSO has no symbol; a reader needs to know where it is."""
    if symbol.startswith("0x"):
        return f"{dso} +{int(symbol, 16):#x} (unnamed)"
    return symbol


def profile_shares(bundles: list[BundleRef]) -> pd.DataFrame:
    """Where a bundle has perf profiles: per condition, the clock-reading share of CPU time, the measure
    seed 000 quotes for read_hpet (4.99% → 1.41% on Haswell-EX)."""
    rows = []
    for ref, bundle in usable_bundles(bundles):
        profiles = bundle.manifest.profiles
        for profile in profiles if isinstance(profiles, list) else []:  # a string says why there are none
            report = ref.path / "raw" / profile["directory"] / "perf-report.txt"
            if profile.get("status") != "ok" or not rawfile.present(report):
                continue
            share, hottest = clock_read_share(rawfile.read_text(report))  # xz'd by the seal from 64 KiB
            rows.append(
                {
                    "setup": ref.host_id,
                    "condition": profile["condition"],
                    "workload": Path(profile["argv"][profile["argv"].index("--") + 1]).name,
                    "clock reading, % of samples": round(share, 2),
                    "hottest clock function": hottest,
                    "source": str(report),
                }
            )
    return pd.DataFrame(
        rows,
        columns=["setup", "condition", "workload", "clock reading, % of samples", "hottest clock function", "source"],
    )


# -- read_hpet's share of perf samples in lab guests (runners/hpet/guest-clock-profile.yaml) ----------------------
GUEST_PROFILE_EXTRA = "perf-profile"  # the per-run extra that keeps perf-profile/perf-report.txt
# A line of `perf report --stdio --no-children` of any --sort that ends in the symbol: "  64.32%  [k] name".
_SYMBOL_LINE = re.compile(r"^\s*([\d.]+)%\s+(?:.*?\s)?\[([.kgu])\]\s+(\S.*?)\s*$", re.M)
# perf record's last line on stderr: the exact sample count (the report's "# Samples: 3K" is rounded).
_RECORDED = re.compile(r"perf record: Captured and wrote .* \((\d+) samples\)")
_PERCENT_LIMIT = re.compile(r"--percent-limit\s+([\d.]+)")
LAB_ANALOGUE = (
    "lab analogue: clockbench (every vCPU reading CLOCK_MONOTONIC in a loop) in a QEMU TCG guest, "
    "where an HPET read is an emulated MMIO access handled by QEMU: its cost and its share of the samples "
    "are TCG's, not a real HPET's, and the workload is not AIM7"
)


def symbol_shares(report: str) -> dict[str, float]:
    """From `perf report --stdio --no-children [--sort sym]`: each listed symbol's share of the samples (%), a
    symbol listed more than once (user and kernel, or one per command) summed. Symbols under the report's
    --percent-limit are not listed."""
    shares: dict[str, float] = {}
    for pct, _, symbol in _SYMBOL_LINE.findall(report):
        shares[symbol] = shares.get(symbol, 0.0) + float(pct)
    return shares


def recorded_samples(stderr: str) -> int | None:
    """The sample count perf record printed on stderr (None if it printed none)."""
    found = _RECORDED.findall(stderr)
    return int(found[-1]) if found else None


def guest_profile_runs(bundles: list[BundleRef], checks=()) -> pd.DataFrame:
    """One row per measured run with a perf-profile extra (guest-clock-profile): read_hpet's share of the samples
    (%; 0 where the report does not list it, i.e. it was under the report's --percent-limit, said in
    ``read_hpet_listed``), the clock-reading functions' share (CLOCK_READ_SYMBOL), the samples perf recorded, and
    the report it came from. Failed runs and runs a condition check failed for or could not check are left out."""
    gated = excluded_runs(run_checks("hpet", checks, bundles))
    rows = []
    for ref, bundle in usable_bundles(bundles):
        values = bundle.manifest.conditions_by_name
        for run in bundle.manifest.measured_runs():
            if (str(ref.path), run.run) in gated:
                continue
            extra = run.extra(GUEST_PROFILE_EXTRA)
            if extra is None or extra.get("status") != "ok":
                continue
            directory = ref.path / "raw" / extra["directory"]
            report_path = directory / "perf-report.txt"
            if not rawfile.present(report_path):
                continue
            shares = symbol_shares(rawfile.read_text(report_path))
            if not shares:
                continue
            stderr = rawfile.read_text(directory / "stderr.txt") if rawfile.present(directory / "stderr.txt") else ""
            condition = values.get(run.condition, {})
            limit = _PERCENT_LIMIT.findall(" ".join(map(str, extra.get("argv", []))))
            rows.append(
                {
                    "setup": ref.host_id,
                    "condition": run.condition,
                    "run": run.run,
                    "vcpus": condition.get("vcpus"),
                    "clock": condition.get("clock"),
                    "read_hpet_pct": shares.get("read_hpet", 0.0),
                    "read_hpet_listed": "read_hpet" in shares,
                    "percent_limit": float(limit[-1]) if limit else None,
                    "clock_reading_pct": sum(v for k, v in shares.items() if CLOCK_READ_SYMBOL.search(k)),
                    "samples": recorded_samples(stderr),
                    "source": str(rawfile.locate(report_path)),
                }
            )
    return pd.DataFrame(
        rows,
        columns=[
            "setup",
            "condition",
            "run",
            "vcpus",
            "clock",
            "read_hpet_pct",
            "read_hpet_listed",
            "percent_limit",
            "clock_reading_pct",
            "samples",
            "source",
        ],
    )


def guest_profile_table(profile_runs: pd.DataFrame) -> pd.DataFrame:
    """Per setup and condition: read_hpet's share of the perf samples (%), median over runs with the runs' range
    and n, the clock-reading functions' share likewise, and the median samples per run."""
    rows = []
    for (setup, condition), group in profile_runs.groupby(["setup", "condition"], sort=True):
        share, clock = group["read_hpet_pct"], group["clock_reading_pct"]
        rows.append(
            {
                "setup": setup,
                "condition": condition,
                "vCPUs": group["vcpus"].iloc[0],
                "read sharing": {"hpet-sharing": "on", "hpet-no-sharing": "off"}.get(group["clock"].iloc[0], "?"),
                "n runs": len(group),
                "read_hpet, % of samples (median)": round(share.median(), 6),
                "read_hpet min": round(share.min(), 6),
                "read_hpet max": round(share.max(), 6),
                "runs with read_hpet under the report's limit": int((~group["read_hpet_listed"]).sum()),
                "clock-reading functions, % (median)": round(clock.median(), 6),
                "samples per run (median)": group["samples"].median(),
            }
        )
    return pd.DataFrame(rows)


def read_hpet_beside_source(published: PublishedClaim, profile_runs: pd.DataFrame) -> pd.DataFrame:
    """Seed 000's read_hpet shares as printed (without → with the patch) and, per lab setup and vCPU count, the
    guests' read_hpet share with sharing off → on (medians over runs, with n), and the with / without ratio of
    each (ours: the source prints no ratio; for IvyBridge-EX the 'more than 34%' makes it an upper bound)."""
    frame = published.table("read_hpet_profile")
    rows = []
    for system, label in SYSTEM_LABELS.items():
        without, with_ = _cell(frame, system, "hpet", "without"), _cell(frame, system, "hpet", "with")
        ratio = with_["value"] / without["value"]
        rows.append(
            {
                "where": f"seed 000, {label}, AIM7 compute (printed, n = 1)",
                "read_hpet w/o sharing (%)": f"{without['qualifier']} {without['value_as_printed']}".strip(),
                "read_hpet with sharing (%)": f"{with_['qualifier']} {with_['value_as_printed']}".strip(),
                "with / w/o": f"{'< ' if without['qualifier'] else ''}{ratio:.3f}",
            }
        )
    for (setup, vcpus), group in profile_runs.groupby(["setup", "vcpus"], sort=True):
        parts = dict(tuple(group.groupby("clock")))
        sides = {clock: part["read_hpet_pct"] for clock, part in parts.items()}
        off, on = sides.get("hpet-no-sharing"), sides.get("hpet-sharing")

        def described(clock: str) -> str:
            if clock not in parts:
                return "no runs"
            share, part = sides[clock], parts[clock]
            # perf prints shares to 2 decimals; a median of an even n adds a third: shown as computed (6 digits)
            text = f"{share.median():.6g} [{share.min():.6g}–{share.max():.6g}], n = {len(share)}"
            unlisted = part[~part["read_hpet_listed"]]
            if len(unlisted):
                limits = ", ".join(f"{limit:g}%" for limit in sorted(unlisted["percent_limit"].dropna().unique()))
                text += f" ({len(unlisted)} under the report's {limits or 'percent'} limit, counted as 0)"
            return text

        ratio = (
            f"{on.median() / off.median():.3f}" if off is not None and on is not None and off.median() > 0 else "n/a"
        )
        rows.append(
            {
                "where": f"lab analogue, {vcpus} vCPUs, clockbench (TCG guest): {setup}",
                "read_hpet w/o sharing (%)": described("hpet-no-sharing"),
                "read_hpet with sharing (%)": described("hpet-sharing"),
                "with / w/o": ratio,
            }
        )
    table = pd.DataFrame(rows).set_index("where")
    table.attrs["legend"] = (
        "Lab rows: median [min–max] over runs of read_hpet's share of perf samples (cpu-clock, "
        "all vCPUs), n runs; with / w/o is the ratio of the medians. " + LAB_ANALOGUE + "."
    )
    return table


def headlines(published: PublishedClaim) -> list[Headline]:
    return [
        Headline(SYSTEM_LABELS[system], "AIM7 throughput, HPET with / without sharing", ratio, "higher")
        for system, ratio in sharing_ratios(published).items()
    ]


CLAIM = Claim(
    id="hpet",
    seed="000",
    title="C1 HPET read contention",
    notebook="01-hpet.ipynb",
    outputs={
        "figures": ["aim7_throughput", "read_hpet_profile"],
        "tables": ["aim7_throughput", "read_hpet_profile", "read_hpet_profile_lab", "setup"],
    },
    comparisons=comparisons,
    untested=WHAT_IS_COMPARED,
    headlines=headlines,
    checks=tuple(CHECKS),
    negative_controls=negative_controls,
    derived_from_raw=lambda runs, bundles: {
        "profile_shares": profile_shares(bundles),
        "guest_profile_runs": guest_profile_runs(bundles, CHECKS),
    },
)
