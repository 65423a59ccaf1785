"""C1 — HPET read contention (seed 000): one CPU reads the shared HPET counter, others reuse it."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from ..published import PublishedClaim, load_published
from . import pending_verdict

CLAIM = "hpet"
OUTPUTS = {
    "figures": ["aim7_throughput", "read_hpet_profile"],
    "tables": ["aim7_throughput", "read_hpet_profile", "setup"],
}
SYSTEM_LABELS = {
    "haswell-ex-4s-72c": "4-socket Haswell-EX, 72 cores (HT off)",
    "ivybridge-ex-16s-240c": "16-socket IvyBridge-EX, 240 cores (HT on)",
}
CONDITIONS = [("tsc", "n/a", "TSC"), ("hpet", "without", "HPET w/o patch"), ("hpet", "with", "HPET with patch")]


def load(published_dir: Path | str) -> PublishedClaim:
    return load_published(published_dir, CLAIM)


def _cell(frame: pd.DataFrame, system: str, clocksource: str, patch: str) -> pd.Series:
    match = frame[(frame["system"] == system) & (frame["clocksource"] == clocksource) & (frame["patch"] == patch)]
    if len(match) != 1:
        raise ValueError(f"expected one row for {system}/{clocksource}/{patch}, found {len(match)}")
    return match.iloc[0]


def throughput_table(published: PublishedClaim) -> pd.DataFrame:
    """Seed 000's AIM7 numbers as printed, with the ratios a reader computes from them (ours)."""
    frame = published.table("aim7_compute")
    rows = []
    for system, label in SYSTEM_LABELS.items():
        values = {name: _cell(frame, system, cs, patch) for cs, patch, name in CONDITIONS}
        tsc, without, with_ = (values[name]["value"] for _, _, name in CONDITIONS)
        rows.append({
            "system": label,
            **{f"{name} (jobs/min)": values[name]["value_as_printed"] for _, _, name in CONDITIONS},
            "HPET w/o, % of TSC": round(100 * without / tsc, 2),
            "HPET with, % of TSC": round(100 * with_ / tsc, 2),
            "with / w/o": round(with_ / without, 3),
        })
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
    colors = ["#4c72b0", "#c44e52", "#55a868"]
    for i, (system, label) in enumerate(SYSTEM_LABELS.items()):
        tsc = _cell(frame, system, "tsc", "n/a")["value"]
        for j, (cs, patch, name) in enumerate(CONDITIONS):
            row = _cell(frame, system, cs, patch)
            x = i + (j - 1) * width
            pct = 100 * row["value"] / tsc
            ax.bar(x, pct, width, color=colors[j], label=name if i == 0 else None)
            ax.text(x, pct + 1.5, f"{row['value_as_printed']}\n({pct:.1f}%)", ha="center", va="bottom", fontsize=7)
        without = _cell(frame, system, "hpet", "without")["value"]
        with_ = _cell(frame, system, "hpet", "with")["value"]
        ax.annotate(f"patch: {100 * (with_ / without - 1):+.1f}%", xy=(i + width / 2, 112), ha="center", fontsize=9,
                    color="#2d6a3e")
    ax.set_xticks(range(len(SYSTEM_LABELS)), list(SYSTEM_LABELS.values()), fontsize=8)
    ax.set_ylabel("AIM7 compute throughput, % of TSC")
    ax.set_ylim(0, 125)
    ax.set_title("Seed 000: AIM7 compute (1500 users), 4.6-rc1, HZ=1000 — published, n = 1")
    ax.legend(loc="lower right", fontsize=8)
    return fig


def profile_table(published: PublishedClaim) -> pd.DataFrame:
    frame = published.table("read_hpet_profile")
    rows = []
    for system, label in SYSTEM_LABELS.items():
        without = _cell(frame, system, "hpet", "without")
        with_ = _cell(frame, system, "hpet", "with")
        printed = lambda r: f"{r['qualifier']} {r['value_as_printed']}".strip()  # noqa: E731
        rows.append({"system": label, "read_hpet, w/o patch": printed(without), "read_hpet, with patch": printed(with_)})
    return pd.DataFrame(rows).set_index("system")


def profile_figure(published: PublishedClaim):
    frame = published.table("read_hpet_profile")
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    width = 0.35
    for i, system in enumerate(SYSTEM_LABELS):
        for j, (patch, color) in enumerate([("without", "#c44e52"), ("with", "#55a868")]):
            row = _cell(frame, system, "hpet", patch)
            x = i + (j - 0.5) * width
            ax.bar(x, row["value"], width, color=color, label=f"HPET {patch} patch" if i == 0 else None,
                   hatch="//" if row["qualifier"] else None)
            ax.text(x, row["value"] + 0.6, f"{row['qualifier']} {row['value_as_printed']}".strip(), ha="center", fontsize=8)
    ax.set_xticks(range(len(SYSTEM_LABELS)), list(SYSTEM_LABELS.values()), fontsize=8)
    ax.set_ylabel("read_hpet, % of CPU time (perf)")
    ax.set_title("Seed 000: read_hpet share of CPU time — published")
    ax.legend(fontsize=8)
    ax.text(0.99, -0.22, "hatched: a lower bound ('more than')", transform=ax.transAxes, ha="right", fontsize=7)
    return fig



COMPARISON = "HPET clocksource, read sharing on vs off: throughput ratio"


def published_effect(published: PublishedClaim) -> str:
    ratios = sharing_ratios(published)
    return "; ".join(f"×{ratio:.3f} ({SYSTEM_LABELS[system]})" for system, ratio in ratios.items())


def verdicts(ctx) -> list:
    return pending_verdict(CLAIM, COMPARISON, published_effect(ctx.published), ctx.bundles, ctx.data_dir)
