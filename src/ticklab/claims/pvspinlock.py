"""C2 — pvqspinlock kick-ahead (seed 001): the unlocker also kicks halted vCPUs queued behind the head."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from ..published import PublishedClaim, load_published
from ..comparisons import Comparison, claim_verdicts

CLAIM = "pvspinlock"
OUTPUTS = {"figures": ["kernel_build_time"], "tables": ["kernel_build_time", "setup"]}
HOST_LABELS = {"westmere-ex-8s-32c": "Westmere-EX (8 × 4 cores)", "haswell-ex-4s-32c": "Haswell-EX (4 × 8 cores)"}


def load(published_dir: Path | str) -> PublishedClaim:
    return load_published(published_dir, CLAIM)


def build_time_table(published: PublishedClaim) -> pd.DataFrame:
    """The before/after build times as printed, in seconds, and the change (computed by ticklab)."""
    frame = published.table("kernel_build_time")
    rows = []
    for host, label in HOST_LABELS.items():
        for vcpus in sorted(frame["vcpus"].unique(), key=int):
            cell = frame[(frame["host"] == host) & (frame["vcpus"] == vcpus)].set_index("patch")
            before, after = cell.loc["before"], cell.loc["after"]
            rows.append({
                "host": label, "guest vCPUs": int(vcpus),
                "before (as printed)": before["value_as_printed"], "after (as printed)": after["value_as_printed"],
                "before (s)": before["value"], "after (s)": after["value"],
                "change (%)": round(100 * (after["value"] / before["value"] - 1), 2),
                "after / before": round(after["value"] / before["value"], 4),
            })
    return pd.DataFrame(rows)


def build_time_figure(published: PublishedClaim):
    table = build_time_table(published)
    fig, ax = plt.subplots(figsize=(8, 4))
    labels = [f"{r['host'].split(' ')[0]}\n{r['guest vCPUs']} vCPUs" for _, r in table.iterrows()]
    xs = range(len(table))
    width = 0.38
    ax.bar([x - width / 2 for x in xs], table["before (s)"], width, color="#c44e52", label="before patch")
    ax.bar([x + width / 2 for x in xs], table["after (s)"], width, color="#55a868", label="after patch (kick-ahead)")
    for x, (_, row) in zip(xs, table.iterrows()):
        top = max(row["before (s)"], row["after (s)"])
        ax.text(x, top + 15, f"{row['change (%)']:+.1f}%", ha="center", fontsize=9)
        ax.text(x - width / 2, row["before (s)"] / 2, row["before (as printed)"], ha="center", rotation=90, fontsize=7, color="white")
        ax.text(x + width / 2, row["after (s)"] / 2, row["after (as printed)"], ha="center", rotation=90, fontsize=7, color="white")
    ax.set_xticks(list(xs), labels, fontsize=8)
    ax.set_ylabel("kernel build time in the KVM guest (s)")
    ax.set_title("Seed 001: kernel build time, hosts with 32 physical CPUs — published, n = 1")
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
    return (f"Largest gain: {best['host']}, {best['guest vCPUs']} vCPUs ({best['change (%)']:+.2f}%). "
            f"Smallest: {worst['host']}, {worst['guest vCPUs']} vCPUs, "
            f"{worst['after (s)'] - worst['before (s)']:+.1f} s on {worst['before (s)']:g} s "
            f"({worst['change (%)']:+.2f}%) — the author's \"not so much on Haswell\".")


COMPARISON = "pv_kick_ahead on vs off: kernel build time ratio (after / before)"


# The lab conditions (runners/pvspinlock/guest-lock-contention.yaml).
FRESH_BASELINE, FRESH_TREATMENT = "kick-ahead-0", "kick-ahead-4"


def comparisons(published: PublishedClaim) -> list[Comparison]:
    """pv_kick_ahead=4 against upstream (0) in an overcommitted KVM guest: hackbench -T runtime standing in for
    the kernel build, held against the source's overcommitted Westmere-EX build-time ratio."""
    target = published.ratio_target("kernel_build_time", "westmere_48_after", "westmere_48_before")
    return [Comparison("pv_kick_ahead=4 vs 0: hackbench -T runtime, overcommitted KVM guest (stand-in for the kernel build)",
                       "runtime_s", FRESH_TREATMENT, FRESH_BASELINE, target, ("guest-lock-contention",),
                       sizes_comparable="hackbench -T stands in for the kernel build, on fewer vCPUs than the source's 48")]


def fresh_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Per setup and condition: median hackbench runtime (s), its range and the number of runs."""
    chosen = runs[(runs["metric"] == "runtime_s") & runs["condition"].isin([FRESH_BASELINE, FRESH_TREATMENT])]
    if chosen.empty:
        return pd.DataFrame()
    grouped = chosen.groupby(["host_id", "condition"])["value"]
    return pd.DataFrame({"median runtime (s)": grouped.median(), "min (s)": grouped.min(), "max (s)": grouped.max(),
                         "runs": grouped.size()}).round(4)


# No condition of this claim has a recorded fact to check yet.
CHECKS: list = []


def verdicts(ctx, alpha: float = 0.05, n_boot: int = 10_000, seed: int = 0) -> list:
    return claim_verdicts(CLAIM, comparisons(ctx.published), ctx.bundles, ctx.data_dir, summary=COMPARISON,
                          checks=CHECKS, alpha=alpha, n_boot=n_boot, seed=seed)
