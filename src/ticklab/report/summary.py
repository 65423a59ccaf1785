"""Across claims: the published headline effects and the verdicts the claim notebooks wrote."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

from ..analysis import palette
from ..analysis.checks import CHECK_COLUMNS
from ..analysis.outputs import Outputs
from ..analysis.published import load_published
from ..analysis.verdicts import VERDICT_COLUMNS
from ..claims import all_claims

SUMMARY = "summary"


def published_effects(published_dir: Path | str) -> pd.DataFrame:
    """One row per published comparison that has a ratio (each claim's headlines): claim, setup, what, ratio,
    better direction."""
    rows = [
        (claim.id, h.setup, h.comparison, h.ratio, h.better)
        for claim in all_claims()
        if claim.headlines
        for h in claim.headlines(claim.published(published_dir))
    ]
    return pd.DataFrame(rows, columns=["claim", "setup", "comparison", "ratio", "better"])


def save_effects(effects: pd.DataFrame, output_dir: Path, published_dir: Path) -> None:
    sources = []
    for claim in sorted(set(effects["claim"])):
        pub = load_published(published_dir, claim)
        sources += pub.files(*pub.tables)
    Outputs(output_dir, SUMMARY).table(
        "published_effects",
        effects,
        caption="Headline effect of each claim as a ratio of printed values, computed by ticklab (n = 1)",
        sources=sources,
    )


# The ratio axis's ticks: each factor and its inverse, so ×0.5 sits as far left of ×1 as ×2 sits right of it.
RATIO_TICK_FACTORS = (1.5, 2, 3, 5, 10, 20, 50, 100)


def effects_figure(effects: pd.DataFrame):
    """Each headline ratio as a bar from ×1 on a log axis centred on ×1, so a bar's length is |log ratio| (halving
    and doubling look the same size). Colour, hatch and the word beside the value all say whether the ratio went the
    way the claim says is better (Okabe-Ito colours, palette.py)."""
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(effects) + 1.4))
    labels = [f"{r.claim}: {r.setup}" for r in effects.itertuples()]
    better = [(r.ratio > 1) == (r.better == "higher") for r in effects.itertuples()]
    bars = ax.barh(
        range(len(effects)),
        effects["ratio"] - 1,
        left=1,
        edgecolor=palette.BLACK,
        linewidth=0.5,
        color=[palette.CLAIMED_DIRECTION if b else palette.OPPOSITE_DIRECTION for b in better],
    )
    for bar, is_better in zip(bars, better, strict=True):
        bar.set_hatch(None if is_better else palette.OPPOSITE_HATCH)
    ax.axvline(1, color=palette.BLACK, linewidth=0.8)
    for i, (r, is_better) in enumerate(zip(effects.itertuples(), better, strict=True)):
        # beyond the bar's outer end, so no label sits on the bar or on the ×1 line
        outward = r.ratio >= 1
        ax.text(
            r.ratio * 1.04 if outward else r.ratio / 1.04,
            i,
            f"×{r.ratio:.3f} {'better' if is_better else 'worse'}",
            va="center",
            ha="left" if outward else "right",
            fontsize=8,
        )
    ax.set_xscale("log")
    # as far below ×1 as above it, with room beyond the longest bar for its label
    reach = max(max(r, 1 / r) for r in effects["ratio"]) ** 1.45
    ax.set_xlim(1 / reach, reach)
    ticks = sorted({1.0, *(t for f in RATIO_TICK_FACTORS if f < reach for t in (f, 1 / f))})
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"×{value:.3g}"))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_yticks(range(len(effects)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(
        "ratio of the printed values (log scale, bars drawn from ×1)\n"
        "plain green: better in the direction the claim names; hatched vermillion: worse",
        fontsize=8,
    )
    without = "; ".join(f"{c.id} has no ratio: {c.no_headline_because}" for c in all_claims() if not c.headlines)
    ax.set_title(
        "Headline effects: ratios of values printed in the sources, computed by ticklab"
        + (f"\n({without})" if without else ""),
        fontsize=9,
    )
    return fig


def save_effects_figure(fig, output_dir: Path, published_dir: Path) -> None:
    sources = [c.published(published_dir).directory / "provenance.yaml" for c in all_claims() if c.headlines]
    Outputs(output_dir, SUMMARY).figure(
        "published_effects",
        fig,
        caption="Headline effects as ratios of printed values (computed by ticklab)",
        sources=sources,
    )


def wanted_claims(claims: str | list[str] | None) -> list[str]:
    """The claims a summary covers: all of them, or those named (a comma-separated string from papermill)."""
    names = [c.strip() for c in claims.split(",")] if isinstance(claims, str) else list(claims or [])
    names = [c for c in names if c]
    ids = [c.id for c in all_claims()]
    unknown = [c for c in names if c not in ids]
    if unknown:
        raise ValueError(f"unknown claim(s) {', '.join(unknown)}; claims are: {', '.join(ids)}")
    return [c for c in ids if c in names] if names else ids


def collect_verdicts(output_dir: Path | str, claims: str | list[str] | None = None) -> pd.DataFrame:
    """The verdict rows the claim notebooks wrote (every claim, or those named); fails naming the claims that
    wrote none."""
    claims = wanted_claims(claims)
    directory = Path(output_dir) / "verdicts"
    frames = {path.stem: pd.read_csv(path) for path in sorted(directory.glob("*.csv"))} if directory.is_dir() else {}
    missing = [claim for claim in claims if claim not in frames]
    if missing:
        raise FileNotFoundError(f"{directory}: no verdicts from {', '.join(missing)} (run their notebooks first)")
    frame = pd.concat([frames[c] for c in claims], ignore_index=True)
    return frame[VERDICT_COLUMNS]


def collect_checks(output_dir: Path | str, claims: str | list[str] | None = None) -> pd.DataFrame:
    """The condition checks the claim notebooks wrote (claims without checks wrote an empty file)."""
    directory = Path(output_dir) / "checks"
    frames = [
        pd.read_csv(directory / f"{claim}.csv")
        for claim in wanted_claims(claims)
        if (directory / f"{claim}.csv").is_file()
    ]
    frames = [f for f in frames if not f.empty]
    return pd.concat(frames, ignore_index=True)[CHECK_COLUMNS] if frames else pd.DataFrame(columns=CHECK_COLUMNS)


def verdict_sentence(verdicts: pd.DataFrame) -> str:
    counts = verdicts["verdict"].value_counts()
    parts = [f"{n} {v}" for v, n in counts.items()]
    return f"{len(verdicts)} verdict row(s) across {verdicts['claim'].nunique()} claims: " + ", ".join(parts) + "."


def show_forests(verdicts: pd.DataFrame, output_dir: Path | str) -> list[str]:
    """Show the forest plot each claim's notebook wrote (figures/<claim>/forest.png), in the verdicts' claim order;
    for a claim without one, a sentence saying why. Returns the claims shown."""
    from IPython.display import Image, Markdown, display

    from ..analysis.forest import FOREST, has_lines, no_forest_sentence

    def say(text: str) -> None:  # as notebook.say (report.notebook imports this module: no circle)
        display(Markdown(text))

    shown = []
    for claim, rows in verdicts.groupby("claim", sort=False):
        png = Path(output_dir) / "figures" / str(claim) / f"{FOREST}.png"
        if not has_lines(rows):
            say(no_forest_sentence(str(claim)))
        elif png.is_file():
            display(Image(filename=str(png)))
            shown.append(str(claim))
        else:
            say(f"{claim}: its notebook wrote no forest plot ({png} is missing).")
    return shown
