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
    rows = [(claim.id, h.setup, h.comparison, h.ratio, h.better) for claim in all_claims() if claim.headlines
            for h in claim.headlines(claim.published(published_dir))]
    return pd.DataFrame(rows, columns=["claim", "setup", "comparison", "ratio", "better"])


def save_effects(effects: pd.DataFrame, output_dir: Path, published_dir: Path) -> None:
    sources = []
    for claim in sorted(set(effects["claim"])):
        pub = load_published(published_dir, claim)
        sources += pub.files(*pub.tables)
    Outputs(output_dir, SUMMARY).table(
        "published_effects", effects, caption="Headline effect of each claim as a ratio of printed values, computed by ticklab (n = 1)",
        sources=sources)


# The ratio axis's ticks: each factor and its inverse, so ×0.5 sits as far left of ×1 as ×2 sits right of it.
RATIO_TICK_FACTORS = (1.5, 2, 3, 5, 10, 20, 50, 100)


def effects_figure(effects: pd.DataFrame):
    """Each headline ratio as a bar from ×1 on a log axis centred on ×1, so a bar's length is |log ratio| (halving
    and doubling look the same size). Colour, hatch and the word beside the value all say whether the ratio went the
    way the claim says is better (Okabe-Ito colours, palette.py)."""
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(effects) + 1.4))
    labels = [f"{r.claim}: {r.setup}" for r in effects.itertuples()]
    better = [(r.ratio > 1) == (r.better == "higher") for r in effects.itertuples()]
    bars = ax.barh(range(len(effects)), effects["ratio"] - 1, left=1, edgecolor=palette.BLACK, linewidth=0.5,
                   color=[palette.CLAIMED_DIRECTION if b else palette.OPPOSITE_DIRECTION for b in better])
    for bar, is_better in zip(bars, better):
        bar.set_hatch(None if is_better else palette.OPPOSITE_HATCH)
    ax.axvline(1, color=palette.BLACK, linewidth=0.8)
    for i, (r, is_better) in enumerate(zip(effects.itertuples(), better)):
        # beyond the bar's outer end, so no label sits on the bar or on the ×1 line
        outward = r.ratio >= 1
        ax.text(r.ratio * 1.04 if outward else r.ratio / 1.04, i, f"×{r.ratio:.3f} {'better' if is_better else 'worse'}",
                va="center", ha="left" if outward else "right", fontsize=8)
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
    ax.set_xlabel("ratio of the printed values (log scale, bars drawn from ×1)\n"
                  "plain green: better in the direction the claim names; hatched vermillion: worse", fontsize=8)
    without = "; ".join(f"{c.id} has no ratio: {c.no_headline_because}" for c in all_claims() if not c.headlines)
    ax.set_title("Headline effects: ratios of values printed in the sources, computed by ticklab"
                 + (f"\n({without})" if without else ""), fontsize=9)
    return fig


def save_effects_figure(fig, output_dir: Path, published_dir: Path) -> None:
    sources = [c.published(published_dir).directory / "provenance.yaml" for c in all_claims() if c.headlines]
    Outputs(output_dir, SUMMARY).figure("published_effects", fig, caption="Headline effects as ratios of printed values (computed by ticklab)", sources=sources)


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
    frames = [pd.read_csv(directory / f"{claim}.csv") for claim in wanted_claims(claims)
              if (directory / f"{claim}.csv").is_file()]
    frames = [f for f in frames if not f.empty]
    return pd.concat(frames, ignore_index=True)[CHECK_COLUMNS] if frames else pd.DataFrame(columns=CHECK_COLUMNS)


def verdict_sentence(verdicts: pd.DataFrame) -> str:
    counts = verdicts["verdict"].value_counts()
    parts = [f"{n} {v}" for v, n in counts.items()]
    return f"{len(verdicts)} verdict row(s) across {verdicts['claim'].nunique()} claims: " + ", ".join(parts) + "."


# -- the report's first screen ---------------------------------------------------------------------
SETUP_KINDS = ("host", "lab guest")
VERDICT_CLASSES = {"reproduced": "v-yes", "consistent, not pinned": "v-con", "smaller than the target": "v-dir",
                   "larger than the target": "v-dir", "opposite effect": "v-no", "no effect shown": "v-no",
                   "inconclusive": "v-unk", "not testable here": "v-nt"}


def setup_kind(setup: str) -> str:
    """Lab guests are named guest-<accelerator>-…; everything else ran on a host."""
    return "lab guest" if setup.startswith("guest-") else "host"


def _sig(value: float) -> str:
    return f"{value:.3g}"


def effect_words(row) -> str:
    """A tested row's effect and CI and what it was held against, in a line."""
    target = ("the source's direction" if pd.isna(row["target_ratio"]) else
              f"×{_sig(row['target_ratio'])} ({'printed' if row['target_provenance'] == 'printed' else 'derived'})")
    return (f"{row['comparison']}: ×{_sig(row['fresh_effect'])} [{_sig(row['ci_low'])}, {_sig(row['ci_high'])}] "
            f"against {target}")


def _reasons_by_setup(row) -> dict[str, str]:
    """A collapsed not-testable row's reason, split back into its setups."""
    reasons = {}
    for part in str(row["reason"]).split(" | "):
        setup, _, why = part.partition(": ")
        reasons[setup] = why
    return reasons


# Which tested row a claim's line shows in words: the strongest evidence first.
_HEADLINE_ORDER = ["reproduced", "consistent, not pinned", "smaller than the target", "larger than the target",
                   "opposite effect", "no effect shown", "inconclusive", "not testable here"]


def at_a_glance(verdicts: pd.DataFrame) -> list[dict]:
    """One line per claim: per kind of setup, a badge per comparison tested (or not testable, with why), and the
    most decisive tested row in words; a claim tested nowhere is 'published only'."""
    lines = []
    titles = {c.id: c.title for c in all_claims()}
    for claim in [c for c in titles if c in set(verdicts["claim"])]:
        rows = verdicts[verdicts["claim"] == claim]
        cells = []
        for kind in SETUP_KINDS:
            badges, why_not, tested = [], [], []
            for _, row in rows.iterrows():
                setups = [s for s in str(row["setup"]).split(", ") if setup_kind(s) == kind and s != "none analysed"]
                if not setups:
                    continue
                # the row of the setups that tested nothing: its reason is "<setup>: why | <setup>: why"
                collapsed = str(row["reason"]).startswith(tuple(f"{x}: " for x in str(row["setup"]).split(", ")))
                if pd.notna(row["fresh_effect"]):
                    tested.append(row)
                    badges.append({"verdict": row["verdict"], "cls": VERDICT_CLASSES[row["verdict"]],
                                   "title": f"{row['role']}: {effect_words(row)}"})
                elif not collapsed:  # a comparison this setup could not test (too few runs, a kernel without a series)
                    badges.append({"verdict": row["verdict"], "cls": VERDICT_CLASSES[row["verdict"]],
                                   "title": f"{row['comparison']}: {row['reason']}"})
                else:
                    reasons = _reasons_by_setup(row)
                    why_not += [reasons.get(s, row["reason"]) for s in setups]
            if not badges and why_not:
                badges.append({"verdict": "not testable here", "cls": VERDICT_CLASSES["not testable here"],
                               "title": "; ".join(dict.fromkeys(why_not))})
            decisive = sorted(tested, key=lambda r: _HEADLINE_ORDER.index(r["verdict"]))
            cells.append({"kind": kind, "badges": badges,
                          "words": effect_words(decisive[0]) if decisive else
                          ("; ".join(dict.fromkeys(why_not))[:160] if why_not else "no setup of this kind in the data")})
        fresh = any(c["badges"] and any(b["verdict"] != "not testable here" for b in c["badges"]) for c in cells)
        lines.append({"claim": claim, "title": titles[claim], "cells": cells, "published_only": not fresh})
    return lines


def setup_labels(verdicts: pd.DataFrame) -> dict[str, str]:
    """Short labels (H1, G1, …) for the report's table; the legend holds the full host-ids."""
    setups = sorted({s for cell in verdicts["setup"] for s in str(cell).split(", ")} - {"none analysed"})
    hosts = [s for s in setups if setup_kind(s) == "host"]
    guests = [s for s in setups if setup_kind(s) == "lab guest"]
    return {**{s: f"H{i}" for i, s in enumerate(hosts, 1)}, **{s: f"G{i}" for i, s in enumerate(guests, 1)},
            "none analysed": "—"}


def verdict_rows(verdicts: pd.DataFrame) -> list[dict]:
    """The full verdict table as the report shows it: short setup labels, three significant figures."""
    labels = setup_labels(verdicts)
    shown = []
    for _, row in verdicts.iterrows():
        tested = pd.notna(row["fresh_effect"])
        target = ("direction" if pd.isna(row["target_ratio"]) else f"×{_sig(row['target_ratio'])}")
        shown.append({
            "claim": row["claim"], "setup": ", ".join(labels.get(s, s) for s in str(row["setup"]).split(", ")),
            "role": row["role"], "comparison": row["comparison"],
            "target": "" if not row["target_provenance"] or pd.isna(row["target_provenance"]) else
                      f"{target} — {row['target_provenance']}",
            "fresh": f"×{_sig(row['fresh_effect'])} [{_sig(row['ci_low'])}, {_sig(row['ci_high'])}]" if tested else "—",
            "p": _sig(row["p_holm"]) if tested else "—", "n": row["n_per_condition"] if tested else "—",
            "power": f"{row['power_at_target']:.0%}" if tested and pd.notna(row["power_at_target"]) else "—",
            "verdict": row["verdict"], "cls": VERDICT_CLASSES[row["verdict"]], "reason": row["reason"]})
    return shown
