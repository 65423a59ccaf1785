"""Across claims: the published headline effects and the verdicts the claim notebooks wrote."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from .claims import CLAIMS
from .claims import acpi_idle, hpet, hrtick, pvspinlock
from .outputs import Outputs
from .published import load_published
from .checks import CHECK_COLUMNS
from .verdicts import VERDICT_COLUMNS

SUMMARY = "summary"


def published_effects(published_dir: Path | str) -> pd.DataFrame:
    """One row per published comparison that has a ratio: claim, setup, what, ratio, better direction."""
    rows = []
    pub = hpet.load(published_dir)
    for system, ratio in hpet.sharing_ratios(pub).items():
        rows.append(("hpet", hpet.SYSTEM_LABELS[system], "AIM7 throughput, HPET with / without sharing", ratio, "higher"))
    pub = pvspinlock.load(published_dir)
    for setup, ratio in pvspinlock.kick_ahead_ratios(pub).items():
        rows.append(("pvspinlock", setup, "kernel build time, after / before kick-ahead", ratio, "lower"))
    pub = hrtick.load(published_dir)
    rows.append(("hrtick", "112-CPU Skylake", "hackbench runtime, HRTICK / NO HRTICK", hrtick.runtime_ratio(pub), "lower"))
    pub = acpi_idle.load(published_dir)
    rows.append(("acpi-idle", "2 × 64C Zen3", "tbench AMean, patch / baseline", acpi_idle.amean_ratio(pub), "higher"))
    frame = pd.DataFrame(rows, columns=["claim", "setup", "comparison", "ratio", "better"])
    missing = sorted(set(CLAIMS) - set(frame["claim"]) - {"nohz"})
    if missing:
        raise RuntimeError(f"published effects missing for {missing}")
    return frame


def save_effects(effects: pd.DataFrame, output_dir: Path, published_dir: Path) -> None:
    sources = []
    for claim in sorted(set(effects["claim"])):
        pub = load_published(published_dir, claim)
        sources += pub.files(*pub.tables)
    Outputs(output_dir, SUMMARY).table(
        "published_effects", effects, caption="Headline effect of each claim as a ratio of published values (n = 1)",
        sources=sources)


def effects_figure(effects: pd.DataFrame):
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(effects) + 1.2))
    labels = [f"{r.claim}: {r.setup}" for r in effects.itertuples()]
    colors = ["#55a868" if (r.ratio > 1) == (r.better == "higher") else "#c44e52" for r in effects.itertuples()]
    ax.barh(range(len(effects)), effects["ratio"], left=0, color=colors)
    ax.axvline(1, color="black", linewidth=0.8)
    for i, r in enumerate(effects.itertuples()):
        ax.text(r.ratio + 0.03, i, f"×{r.ratio:.3f}", va="center", fontsize=8)
    ax.set_yticks(range(len(effects)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ratio of the printed values (green: improvement in the claimed direction)")
    ax.set_title("Published headline effects (nohz has no ratio: its figure's data is not in the text)", fontsize=9)
    return fig


def save_effects_figure(fig, output_dir: Path, published_dir: Path) -> None:
    sources = [load_published(published_dir, c).directory / "provenance.yaml" for c in CLAIMS if c != "nohz"]
    Outputs(output_dir, SUMMARY).figure("published_effects", fig, caption="Published headline effects as ratios", sources=sources)


def collect_verdicts(output_dir: Path | str) -> pd.DataFrame:
    """The verdict rows every claim notebook wrote; fails naming the claims that wrote none."""
    directory = Path(output_dir) / "verdicts"
    frames = {path.stem: pd.read_csv(path) for path in sorted(directory.glob("*.csv"))} if directory.is_dir() else {}
    missing = [claim for claim in CLAIMS if claim not in frames]
    if missing:
        raise FileNotFoundError(f"{directory}: no verdicts from {', '.join(missing)} (run their notebooks first)")
    frame = pd.concat([frames[c] for c in CLAIMS], ignore_index=True)
    return frame[VERDICT_COLUMNS]


def collect_checks(output_dir: Path | str) -> pd.DataFrame:
    """The condition checks every claim notebook wrote (claims without checks wrote an empty file)."""
    directory = Path(output_dir) / "checks"
    frames = [pd.read_csv(directory / f"{claim}.csv") for claim in CLAIMS if (directory / f"{claim}.csv").is_file()]
    frames = [f for f in frames if not f.empty]
    return pd.concat(frames, ignore_index=True)[CHECK_COLUMNS] if frames else pd.DataFrame(columns=CHECK_COLUMNS)


def verdict_sentence(verdicts: pd.DataFrame) -> str:
    counts = verdicts["verdict"].value_counts()
    parts = [f"{n} {v}" for v, n in counts.items()]
    return f"{len(verdicts)} verdict row(s) across {verdicts['claim'].nunique()} claims: " + ", ".join(parts) + "."
