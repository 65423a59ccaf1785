"""C2 — pvqspinlock kick-ahead (seed 001): the unlocker also kicks halted vCPUs queued behind the head."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from ..analysis import palette
from ..analysis.checks import FactCheck, MetricBound
from ..analysis.comparisons import Comparison
from ..analysis.lazy import plt
from ..analysis.published import PublishedClaim
from ..analysis.verdicts import Margins, Target
from . import Claim, Headline
from ._points import runs_and_medians

# Every fresh output of this claim is a lab analogue, and says so.
LAB_LABEL = "lab analogue (TCG, halt+IPI backend)"
# What the lab guests time: not a kernel build (the guest image carries no gcc and no kernel tree) but a synthetic
# tcc build of a generated tree (runners/pvspinlock/guest-kbuild.yaml: 480 files), which forks, execs and contends the
# way a make -j build does.
LAB_BUILD = "synthetic tcc build (480 generated C files, make -j<vCPUs>), not a kernel build"
HOST_LABELS = {"westmere-ex-8s-32c": "Westmere-EX (8 × 4 cores)", "haswell-ex-4s-32c": "Haswell-EX (4 × 8 cores)"}


def build_time_table(published: PublishedClaim) -> pd.DataFrame:
    """The before/after build times as printed, in seconds, and the change (computed by ticklab)."""
    frame = published.table("kernel_build_time")
    rows = []
    for host, label in HOST_LABELS.items():
        for vcpus in sorted(frame["vcpus"].unique(), key=int):
            cell = frame[(frame["host"] == host) & (frame["vcpus"] == vcpus)].set_index("patch")
            before, after = cell.loc["before"], cell.loc["after"]
            rows.append(
                {
                    "host": label,
                    "guest vCPUs": int(vcpus),
                    "before (as printed)": before["value_as_printed"],
                    "after (as printed)": after["value_as_printed"],
                    "before (s)": before["value"],
                    "after (s)": after["value"],
                    "change (%)": round(100 * (after["value"] / before["value"] - 1), 2),
                    "after / before": round(after["value"] / before["value"], 4),
                }
            )
    return pd.DataFrame(rows)


def build_time_figure(published: PublishedClaim):
    table = build_time_table(published)
    fig, ax = plt.subplots(figsize=(8, 4))
    labels = [f"{r['host'].split(' ')[0]}\n{r['guest vCPUs']} vCPUs" for _, r in table.iterrows()]
    xs = range(len(table))
    width = 0.38
    # the patch is the change: its bars hatched as well as coloured, so they read without colour
    ax.bar(
        [x - width / 2 for x in xs],
        table["before (s)"],
        width,
        color=palette.BASELINE,
        edgecolor=palette.BLACK,
        linewidth=0.5,
        label="before patch",
    )
    ax.bar(
        [x + width / 2 for x in xs],
        table["after (s)"],
        width,
        color=palette.CHANGED,
        edgecolor=palette.BLACK,
        linewidth=0.5,
        hatch=palette.CHANGED_HATCH,
        label="after patch (kick-ahead)",
    )
    tallest = max(table["before (s)"].max(), table["after (s)"].max())
    for x, (_, row) in zip(xs, table.iterrows(), strict=True):
        # the times as printed above each bar, level (short bars are too narrow to hold them inside)
        for offset, column in ((-width / 2, "before"), (width / 2, "after")):
            ax.text(
                x + offset,
                row[f"{column} (s)"] + 0.015 * tallest,
                row[f"{column} (as printed)"],
                ha="center",
                va="bottom",
                fontsize=7,
            )
        top = max(row["before (s)"], row["after (s)"])
        ax.text(
            x,
            top + 0.075 * tallest,
            f"{row['change (%)']:+.1f}%",
            ha="center",
            va="bottom",
            fontsize=9,
            fontweight="bold",
        )
    ax.set_ylim(0, tallest * 1.2)
    ax.set_xticks(list(xs), labels, fontsize=8)
    ax.set_ylabel("kernel build time in the KVM guest (s)")
    ax.set_title(
        "Seed 001: kernel build time, hosts with 32 physical CPUs — printed times (n = 1);\n"
        "the changes in % computed by ticklab",
        fontsize=9,
    )
    ax.legend(fontsize=8)
    return fig


def kick_ahead_ratios(published: PublishedClaim) -> dict[str, float]:
    """after/before build-time ratio per host and guest size (below 1: kick-ahead is faster)."""
    table = build_time_table(published)
    return {f"{r['host']}, {r['guest vCPUs']} vCPUs": r["after (s)"] / r["before (s)"] for _, r in table.iterrows()}


def gain_sentence(table: pd.DataFrame) -> str:
    """Where kick-ahead helped most and least, from build_time_table."""
    best = table.loc[table["change (%)"].idxmin()]
    worst = table.loc[table["change (%)"].idxmax()]
    return (
        f"Largest gain: {best['host']}, {best['guest vCPUs']} vCPUs ({best['change (%)']:+.2f}%). "
        f"Smallest: {worst['host']}, {worst['guest vCPUs']} vCPUs, "
        f"{worst['after (s)'] - worst['before (s)']:+.1f} s on {worst['before (s)']:g} s "
        f'({worst["change (%)"]:+.2f}%) — the author\'s "not so much on Haswell".'
    )


WHAT_IS_COMPARED = f"{LAB_LABEL}: pv_kick_ahead on vs off, build time ratio (after / before) per vCPU level"


EXPERIMENT = "guest-kbuild"
METRIC = "build_time_s"
# The lab experiment's vCPU levels (runners/pvspinlock/guest-kbuild.yaml: vCPUs per host CPU) and the guest
# size of the source that each matches on its 32-CPU hosts (None: the source ran no guest that large).
LEVELS = {"1x": "32", "1.5x": "48", "2x": None}
# ±2 % build time: the same build under the same condition moves by about that between rounds on a quiet host; a
# spinlock change that moves a build by less is none a build-time benchmark reports.
BUILD_NO_EFFECT = 0.02
SIZES_COMPARABLE = (
    "not expected: a lab analogue under TCG on this host's CPUs, not KVM guests on 32 physical CPUs; "
    "the counter table shows how often kick-ahead ran per build"
)
KICK_AHEAD = (0, 4)
# Lock events shown per condition (lockevent_<name> metrics of the kbuild workload), in reading order.
COUNTERS = (
    "pv_lab_wait",
    "pv_lab_wait_irqoff",
    "pv_lab_halt",
    "pv_lab_wake_unkicked",
    "pv_lab_kick",
    "pv_lab_kick_before_halt",
    "pv_wait_head",
    "pv_wait_node",
    "pv_kick_unlock",
    "pv_kick_ahead",
    "pv_spurious_wakeup",
    "lock_slowpath",
)


def condition_name(kick_ahead: int, level: str) -> str:
    return f"kick-ahead-{kick_ahead} {level}"


# The lock-bound lab experiment (runners/pvspinlock/guest-kbuild-lockbound.yaml): the synthetic build beside
# tools/bin/lockhammer (threads on one futex hash bucket spinlock), in guests with more vCPUs than host CPUs, waiters
# halting after LOCKBOUND_SPINS spins (the lab knob lab_pvspin_spins= of patch 0004; upstream spins 1 << 15 times).
LOCKBOUND_EXPERIMENT = "guest-kbuild-lockbound"
LOCKBOUND_LEVELS = ("2x",)
LOCKBOUND_SPINS = 16


# The lab experiments whose lock event counters the notebook's counter and kick-ahead tables show.
LAB_EXPERIMENTS = (EXPERIMENT, LOCKBOUND_EXPERIMENT)


def lockbound_condition(kick_ahead: int, level: str) -> str:
    return f"lockbound kick-ahead-{kick_ahead} {level}"


KICK_AHEAD_NEEDS_CONCURRENCY = (
    "kick-ahead wakes halted waiters so that they are running by the time the lock reaches them, which needs the "
    "lock holder and the woken waiters to run at once"
)


def comparisons(published: PublishedClaim) -> list[Comparison]:
    """pv_kick_ahead=4 against upstream (0) per vCPU level, in TCG guests with the lab pv-spinlock backend:
    time of the synthetic tcc build (LAB_BUILD; not a kernel build), held against seed 001's Westmere-EX ratio at the
    matching guest size ("quite substantially on Westmere"). The source ran no guest of twice its CPUs: that level is
    held against the direction only, with a declared no-effect margin."""
    found = []
    for level, vcpus in LEVELS.items():
        if vcpus is None:
            westmere = published.ratio_target("kernel_build_time", "westmere_48_after", "westmere_48_before")
            target = Target(
                None,
                -1,
                "derived: direction only; the source ran no guest with twice its CPUs as "
                "vCPUs (its largest, 48 on 32 CPUs, built faster with kick-ahead)",
                westmere.as_printed,
                westmere.quotes,
            )
        else:
            target = published.ratio_target("kernel_build_time", f"westmere_{vcpus}_after", f"westmere_{vcpus}_before")
        margins = Margins(no_effect=BUILD_NO_EFFECT)
        found.append(
            Comparison(
                f"{LAB_LABEL}: pv_kick_ahead=4 vs 0, time of a synthetic tcc build (480 files, make -j<vCPUs>; not a "
                f"kernel build), vCPUs = {level} host CPUs",
                METRIC,
                condition_name(4, level),
                condition_name(0, level),
                target,
                (EXPERIMENT,),
                margins=margins,
                sizes_comparable=SIZES_COMPARABLE,
                needs_concurrency=KICK_AHEAD_NEEDS_CONCURRENCY,
            )
        )
    westmere = published.ratio_target("kernel_build_time", "westmere_48_after", "westmere_48_before")
    for level in LOCKBOUND_LEVELS:
        found.append(
            Comparison(
                f"{LAB_LABEL}: pv_kick_ahead=4 vs 0, time of a synthetic tcc build (160 files) beside a lock-bound "
                f"load (threads on one futex bucket spinlock), waiters halting after {LOCKBOUND_SPINS} spins "
                f"(lab knob lab_pvspin_spins), vCPUs = {level} host CPUs",
                METRIC,
                lockbound_condition(4, level),
                lockbound_condition(0, level),
                Target(
                    None,
                    -1,
                    "derived: direction only; the source ran no guest with more than 1.5 times its CPUs as vCPUs, "
                    "no lock-bound load and no shortened spin (its 48 vCPUs on 32 CPUs built faster with kick-ahead)",
                    westmere.as_printed,
                    westmere.quotes,
                ),
                (LOCKBOUND_EXPERIMENT,),
                margins=Margins(no_effect=BUILD_NO_EFFECT),
                sizes_comparable=SIZES_COMPARABLE,
                needs_concurrency=KICK_AHEAD_NEEDS_CONCURRENCY,
            )
        )
    return found


def _medians(runs: pd.DataFrame, metric: str) -> pd.DataFrame:
    chosen = runs[(runs["metric"] == metric) & (runs["experiment"] == EXPERIMENT)]
    return chosen.groupby(["host_id", "condition"])["value"].agg(["median", "size"])


def fresh_table(runs: pd.DataFrame, published: PublishedClaim) -> pd.DataFrame:
    """Seed 001's table with the lab analogue beside it: per setup and guest size, build time before
    (pv_kick_ahead=0) and after (4), as medians of the fresh runs, and after / before."""
    medians = _medians(runs, METRIC)
    if medians.empty:
        return pd.DataFrame()
    rows = []
    published_table = build_time_table(published)
    for _, row in published_table.iterrows():
        rows.append(
            {
                "source": "published (seed 001, n = 1)",
                "setup": row["host"],
                "guest vCPUs": f"{row['guest vCPUs']} on 32 CPUs",
                "before (s)": row["before (s)"],
                "after (s)": row["after (s)"],
                "after / before": row["after / before"],
                "runs per side": 1,
            }
        )
    for setup in sorted(medians.index.get_level_values("host_id").unique()):
        for level in LEVELS:
            keys = [(setup, condition_name(k, level)) for k in KICK_AHEAD]
            if not all(key in medians.index for key in keys):
                continue
            before, after = (medians.loc[key] for key in keys)
            vcpus = _vcpus(runs, setup, keys[0][1])
            rows.append(
                {
                    "source": LAB_LABEL,
                    "setup": setup,
                    "guest vCPUs": f"{vcpus} ({level} host CPUs)" if vcpus else f"{level} host CPUs",
                    "before (s)": round(before["median"], 3),
                    "after (s)": round(after["median"], 3),
                    "after / before": round(after["median"] / before["median"], 4),
                    "runs per side": f"{int(before['size'])} / {int(after['size'])}",
                }
            )
    return pd.DataFrame(rows)


# The fresh build-time figure's words for what was built (the lab analogue's build, never a kernel build).
LAB_BUILD_SHORT = "synthetic tcc build (480 files), not a kernel build"
# as the published figure's before (0) and after (4); the tick labels name the setting too
KICK_AHEAD_COLORS = {0: palette.BASELINE, 4: palette.CHANGED}


def fresh_build_time_figure(runs: pd.DataFrame, setup: str):
    """The lab analogue's build times on one setup: per condition (pv_kick_ahead 0 and 4 at each vCPU level) every
    measured run as a point and its median as a bar, the median written above the data (_points)."""
    chosen = runs[(runs["host_id"] == setup) & (runs["experiment"] == EXPERIMENT) & (runs["metric"] == METRIC)]
    groups: list[tuple[float, Sequence[float], str]] = []
    ticks: list[str] = []
    for level in LEVELS:
        for kick_ahead in KICK_AHEAD:
            condition = condition_name(kick_ahead, level)
            values = chosen.loc[chosen["condition"] == condition, "value"].to_numpy()
            if len(values) == 0:
                continue
            vcpus = _vcpus(runs, setup, condition)
            groups.append((len(groups), values, KICK_AHEAD_COLORS[kick_ahead]))
            ticks.append(f"pv_kick_ahead={kick_ahead}\n{level} host CPUs" + (f"\n({vcpus} vCPUs)" if vcpus else ""))
    fig, ax = plt.subplots(figsize=(max(7, 1.4 * len(groups)), 4.4))
    runs_and_medians(ax, groups, from_zero=True, label=lambda value: f"{value:.2f} s")
    ax.set_xticks(range(len(ticks)), ticks, fontsize=8)
    ax.set_xlim(-0.5, len(ticks) - 0.5)
    ax.set_ylabel(f"build time (s): {LAB_BUILD_SHORT}", fontsize=8)
    ax.set_title(
        f"{LAB_LABEL}: {LAB_BUILD_SHORT} — time per build (fresh, {len(chosen)} runs; "
        f"points = runs, bar = median)\n{setup}",
        fontsize=8,
    )
    return fig


def _vcpus(runs: pd.DataFrame, setup: str, condition: str) -> int | None:
    found = runs[(runs["host_id"] == setup) & (runs["condition"] == condition) & (runs["metric"] == "guest_vcpus")]
    return int(found["value"].median()) if not found.empty else None


def counter_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Median count of each lock event during one build, per setup and condition (lockevent_* metrics), of both lab
    experiments (guest-kbuild, guest-kbuild-lockbound)."""
    chosen = runs[runs["experiment"].isin(LAB_EXPERIMENTS) & runs["metric"].isin([f"lockevent_{c}" for c in COUNTERS])]
    if chosen.empty:
        return pd.DataFrame()
    table = chosen.pivot_table(index=["host_id", "condition"], columns="metric", values="value", aggfunc="median")
    table.columns = [c.removeprefix("lockevent_") for c in table.columns]
    return table[[c for c in COUNTERS if c in table.columns]]


def kick_ahead_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Per setup and condition: how many builds kicked ahead at all, and the range of kick-aheads per build.
    Not a check (a build whose queue never held a waiter behind the head cannot kick ahead), but the measure
    of how much of the build the kick-ahead path could have touched."""
    chosen = runs[runs["experiment"].isin(LAB_EXPERIMENTS) & (runs["metric"] == "lockevent_pv_kick_ahead")]
    if chosen.empty:
        return pd.DataFrame()
    rows = []
    for (setup, condition), group in chosen.groupby(["host_id", "condition"]):
        values = group["value"]
        rows.append(
            {
                "setup": setup,
                "condition": condition,
                "runs": len(values),
                "runs with kick-aheads": int((values > 0).sum()),
                "kick-aheads per build": f"{int(values.min())}–{int(values.max())}",
                "median unlock kicks per build": float(
                    runs[
                        (runs["host_id"] == setup)
                        & (runs["condition"] == condition)
                        & (runs["metric"] == "lockevent_pv_kick_unlock")
                    ]["value"].median()
                ),
            }
        )
    return pd.DataFrame(rows)


def kick_ahead_sentence(table: pd.DataFrame) -> str:
    """How much of the builds the kick-ahead path touched, from kick_ahead_table."""
    on = table[table["condition"].str.startswith("kick-ahead-4")]
    if on.empty:
        return "No builds with pv_kick_ahead=4."
    most = max(int(r.split("–")[1]) for r in on["kick-aheads per build"])
    return (
        f"With pv_kick_ahead=4, {int(on['runs with kick-aheads'].sum())} of {int(on['runs'].sum())} builds kicked "
        f"ahead at all, at most {most} time(s) per build, against a median of "
        f"{on['median unlock kicks per build'].median():g} unlock kicks: this load rarely queues a halted vCPU "
        "behind the queue head, so the switch can change little of a build here."
    )


# Fewer kick-aheads than this per build (median over the pv_kick_ahead=4 builds) cannot be what moves a build by the
# target's 9-18 %: each kick-ahead saves at most one halted vCPU's wake-up, assumed here to be a few milliseconds under
# TCG, so 100 a build add up to ~0.3 s, 1 % of a 30 s build. Below it the build-time ratio says nothing of kick-ahead.
MIN_KICK_AHEADS_PER_BUILD = 100


CHECKS = [
    FactCheck(
        "pv_kick_ahead as the condition says",
        "guest.switches.pv_kick_ahead",
        {
            "kick-ahead-0 *": "0",
            "kick-ahead-4 *": "4",
            "lockbound kick-ahead-0 *": "0",
            "lockbound kick-ahead-4 *": "4",
        },
    ),
    MetricBound(
        "no kick-aheads with pv_kick_ahead=0",
        "lockevent_pv_kick_ahead",
        ("kick-ahead-0 *", "lockbound kick-ahead-0 *"),
        0,
    ),
    # issue 54: the lock-bound analogue exists to make kick-ahead act, so a pv_kick_ahead=4 build in which it acted
    # fewer than MIN_KICK_AHEADS_PER_BUILD times did not run the path under test and is left out (named in
    # checks.csv with its count). The comparison is then conditional on the mechanism having acted; the runs left
    # out are counted in the row, and if too few remain it is "not testable here". guest-kbuild's builds, where
    # kick-ahead rarely acts at all, keep the median rule of kick_ahead_barely_ran, which says so with the counts.
    MetricBound(
        "kick-ahead acted in the build (the path under test ran)",
        "lockevent_pv_kick_ahead",
        ("lockbound kick-ahead-4 *",),
        MIN_KICK_AHEADS_PER_BUILD,
        at_least=True,
    ),
    FactCheck(
        "waiters halt after the lab knob's spins (lab_pvspin_spins)",
        "guest.switches.lab_pvspin_spins",
        {"lockbound *": str(LOCKBOUND_SPINS)},
    ),
]


def kick_ahead_barely_ran(runs: pd.DataFrame, found: list[Comparison]) -> dict[tuple[str, str], str]:
    """(setup, comparison) -> why that comparison tests nothing of kick-ahead there: its pv_kick_ahead=4 builds
    kicked ahead fewer than MIN_KICK_AHEADS_PER_BUILD times each (median), by the bundle's lockevent counter. These
    rows are "not testable here" and leave the multiple-comparison family."""
    untestable = {}
    for comparison in found:
        counters = runs[runs["experiment"].isin(comparison.experiments) & (runs["metric"] == "lockevent_pv_kick_ahead")]
        builds = runs[runs["experiment"].isin(comparison.experiments) & (runs["metric"] == METRIC)]
        for setup, group in counters[counters["condition"] == comparison.treatment].groupby("host_id"):
            per_build = group["value"]
            if per_build.median() >= MIN_KICK_AHEADS_PER_BUILD:
                continue
            vcpus = _vcpus(runs, setup, comparison.treatment)
            times = builds[
                (builds["host_id"] == setup) & builds["condition"].isin([comparison.treatment, comparison.baseline])
            ]
            medians = times.groupby("condition")["value"].median()
            shown = ", ".join(
                f"{name} median {medians[name]:.1f} s"
                for name in (comparison.treatment, comparison.baseline)
                if name in medians
            )
            untestable[(setup, comparison.comparison)] = (
                f"kick-ahead barely ran: {per_build.sum():g} kick-aheads in {len(per_build)} builds "
                "with pv_kick_ahead=4"
                + (f" on {vcpus} vCPUs" if vcpus else "")
                + f" (median {per_build.median():g} a build, below the declared minimum {MIN_KICK_AHEADS_PER_BUILD}: "
                "it needs a halted waiter queued behind the queue head), so the build-time ratio says nothing of "
                f"kick-ahead ({shown})"
            )
    return untestable


def headlines(published: PublishedClaim) -> list[Headline]:
    return [
        Headline(setup, "kernel build time, after / before kick-ahead", ratio, "lower")
        for setup, ratio in kick_ahead_ratios(published).items()
    ]


CLAIM = Claim(
    id="pvspinlock",
    seed="001",
    title="C2 pvqspinlock kick-ahead",
    notebook="02-pvspinlock.ipynb",
    outputs={"figures": ["kernel_build_time"], "tables": ["kernel_build_time", "setup"]},
    comparisons=comparisons,
    untested=WHAT_IS_COMPARED,
    headlines=headlines,
    checks=tuple(CHECKS),
    untestable=kick_ahead_barely_ran,
)
