"""Forest plots of a claim's verdict rows (issue 29): per comparison, one line per setup with the fresh ratio and its
CI on a log axis, the target (solid: printed in the source; dashed: derived by ticklab) with its consistent-size band
shaded, the declared no-effect margin shaded around ×1, and the verdict word, the numbers and n at the right.

Reads verdict rows only (a DataFrame with ``VERDICT_COLUMNS``, e.g. ``build/verdicts/<claim>.csv``), never bundles,
so the same plot serves the bundled data and a directory of fleet bundles (one line per host). Premise rows get
panels of their own after the claim's; a level row without a ratio (hrtick's spurious-ratio row: no p, a level
against a printed level) gets its own panel whose axis is the level itself. Rows without a CI (a comparison a setup
could not test, and the one collapsed row of the setups that tested nothing of the claim) are listed under the plot
with their reasons. :func:`forest_table` gives the same rows as numbers.
"""

from __future__ import annotations

import math
import textwrap
from typing import Any

import numpy as np
import pandas as pd

from .lazy import plt
from .palette import GREY
from .verdicts import VERDICTS

# Okabe-Ito (colour-blind safe; "not testable here" the palette's dark grey: a light one is 7 ΔE from the reddish
# purple for a deuteranope), one colour and one marker per word, the same in every figure and the report's badges;
# the marker and the word at the right of each line say it again, so nothing rests on colour alone.
VERDICT_COLOURS = {
    "reproduced": "#009E73",
    "consistent, not pinned": "#56B4E9",
    "smaller than the target": "#E69F00",
    "target excluded": "#F0E442",
    "larger than the target": "#CC79A7",
    "opposite effect": "#D55E00",
    "no effect shown": "#0072B2",
    "inconclusive": "#000000",
    "not testable here": GREY,
}
VERDICT_MARKERS = {
    "reproduced": "o",
    "consistent, not pinned": "h",
    "smaller than the target": "<",
    "target excluded": "v",
    "larger than the target": ">",
    "opposite effect": "X",
    "no effect shown": "D",
    "inconclusive": "s",
    "not testable here": ".",
}
BAND_COLOUR, NO_EFFECT_COLOUR, BOUND_COLOUR = "#009E73", "#7F7F7F", "#D55E00"

TABLE_COLUMNS = [
    "role",
    "comparison",
    "setup",
    "shown",
    "fresh_effect",
    "ci_low",
    "ci_high",
    "ci_level",
    "target",
    "target_provenance",
    "n_per_condition",
    "verdict",
    "why not plotted",
]

_WIDTH, _LEFT, _RIGHT = 12.0, 3.3, 3.4  # inches: figure, setup labels, verdict/numbers column
_LINE, _PANEL_EXTRA, _TEXT_LINE = 0.36, 1.05, 0.19


def is_collapsed(row) -> bool:
    """The one row per claim that gathers the setups that tested nothing of it ("setup: why | setup: why")."""
    setups = [s for s in str(row["setup"]).split(", ") if s]
    return row["verdict"] == "not testable here" and str(row["reason"]).startswith(tuple(f"{s}: " for s in setups))


def is_level(row) -> bool:
    """A row that holds a level against a printed level, not a ratio of two conditions (no p, one sample)."""
    return pd.notna(row["fresh_effect"]) and pd.isna(row["p_holm"]) and " vs " not in str(row["n_per_condition"])


def _has_ci(row) -> bool:
    return pd.notna(row["fresh_effect"]) and pd.notna(row["ci_low"]) and pd.notna(row["ci_high"])


def _number(value) -> float | None:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(value) else value


def _provenance(row) -> str:
    text = str(row.get("target_provenance") or "")
    return "printed" if text == "printed" else "derived" if text.startswith("derived") else ""


def target_words(row) -> str:
    target, bound = _number(row.get("target_ratio")), _number(row.get("no_worse_than"))
    if bound is not None:
        return f"no worse than ×{bound:.3g}"
    if target is None:
        return "the source's direction (no size)"
    return (f"{target:.4g}" if is_level(row) else f"×{target:.4g}") + (
        f" ({_provenance(row)})" if _provenance(row) else ""
    )


def _bound(value) -> str:
    value = _number(value)
    return "—" if value is None else "∞" if math.isinf(value) else f"{value:.3g}"


def _numbers(row) -> str:
    prefix = "" if is_level(row) else "×"
    return f"{prefix}{row['fresh_effect']:.3g} [{_bound(row['ci_low'])}, {_bound(row['ci_high'])}]"


def _panels(rows: pd.DataFrame) -> list[dict]:
    """Claim panels, then premise panels; per comparison (by its text, in the rows' order) the setups with a CI and
    those without (verdict, reason)."""
    panels = []
    specific = rows[~rows.apply(is_collapsed, axis=1)] if not rows.empty else rows
    pooled = specific[specific["role"] == "pooled"] if not rows.empty else rows
    for role in ("claim", "premise"):
        chosen = specific[specific["role"].fillna("claim") == role]
        for comparison in dict.fromkeys(chosen["comparison"]):
            group = chosen[chosen["comparison"] == comparison]
            with_ci = group[group.apply(_has_ci, axis=1)]
            mine = pooled[pooled["comparison"] == comparison]
            panels.append(
                {
                    "role": role,
                    "comparison": comparison,
                    "rows": with_ci,
                    # the random-effects pools of this comparison's setups (analysis/pooling.py): a diamond each,
                    # under the setups' lines
                    "pooled": mine[mine.apply(_has_ci, axis=1)] if len(mine) else mine,
                    "level": bool(len(with_ci)) and bool(with_ci.apply(is_level, axis=1).all()),
                    "missing": [
                        (r["setup"], r["verdict"], str(r["reason"])) for _, r in group.iterrows() if not _has_ci(r)
                    ],
                    "first": group.iloc[0],
                }
            )
    return panels


def untested_setups(rows: pd.DataFrame) -> list[tuple[str, str]]:
    """(setup, why) for every setup in a collapsed not-testable row: what is listed under the plot."""
    listed = []
    for _, row in rows.iterrows():
        if is_collapsed(row):
            for part in str(row["reason"]).split(" | "):
                setup, _, why = part.partition(": ")
                listed.append((setup, why))
    return listed


def _plotted(row, role: str, comparison: str, shown: str) -> dict:
    """One plotted row of the forest's table: how it is drawn, beside its verdict columns."""
    return {
        "role": role,
        "comparison": comparison,
        "setup": row["setup"],
        "shown": shown,
        "fresh_effect": row["fresh_effect"],
        "ci_low": row["ci_low"],
        "ci_high": row["ci_high"],
        "ci_level": row["ci_level"],
        "target": target_words(row),
        "target_provenance": row["target_provenance"],
        "n_per_condition": row["n_per_condition"],
        "verdict": row["verdict"],
        "why not plotted": "",
    }


def forest_table(rows: pd.DataFrame) -> pd.DataFrame:
    """The numbers the forest plot shows, one row per panel line, then every setup listed under a panel or under the
    plot with why it has no line."""
    table = []
    for panel in _panels(rows):
        for _, row in panel["rows"].iterrows():
            shown = "line (a level)" if is_level(row) else "line"
            table.append(_plotted(row, panel["role"], panel["comparison"], shown))
        for _, row in panel["pooled"].iterrows():
            table.append(_plotted(row, "pooled", panel["comparison"], f"diamond (pooled CI); {_pi_words(row)}"))
        for setup, verdict, reason in panel["missing"]:
            first = panel["first"]
            table.append(
                {
                    "role": panel["role"],
                    "comparison": panel["comparison"],
                    "setup": setup,
                    "shown": "listed under the panel",
                    "target": target_words(first),
                    "target_provenance": first["target_provenance"],
                    "verdict": verdict,
                    "why not plotted": reason,
                }
            )
    for setup, why in untested_setups(rows):
        table.append(
            {
                "role": "",
                "comparison": "(every comparison of the claim)",
                "setup": setup,
                "shown": "listed under the plot",
                "verdict": "not testable here",
                "why not plotted": why,
            }
        )
    return pd.DataFrame(table, columns=TABLE_COLUMNS)


def _pi_words(row) -> str:
    low, high = _number(row.get("pi_low")), _number(row.get("pi_high"))
    if low is None or high is None:
        return "prediction interval not known"
    return f"prediction interval for a new machine ×{low:.3g}..×{high:.3g}"


def _setup_label(setup: str) -> str:
    setup = str(setup)
    if len(setup) > 38 and "-on-" in setup:
        head, _, tail = setup.partition("-on-")
        return f"{head}\non-{tail}"
    return "\n".join(textwrap.wrap(setup, 38, break_on_hyphens=True)) or setup


def _nice_ticks(low: float, high: float, include=()) -> list[float]:
    """About six ticks between low and high on a log axis, at round numbers, always with the values in include."""
    span = math.log(high) - math.log(low)
    mantissas = (1, 1.01, 1.02, 1.03, 1.05, 1.1, 1.2, 1.25, 1.5, 2, 2.5, 3, 4, 5, 6, 7, 8, 9, 9.5)
    candidates = sorted(
        {
            round(m * 10.0**d, 12)
            for d in range(math.floor(math.log10(low)) - 1, math.ceil(math.log10(high)) + 1)
            for m in mantissas
            if low <= m * 10.0**d <= high
        }
    )
    chosen = [v for v in include if low <= v <= high]
    for value in candidates:
        if all(abs(math.log(value) - math.log(c)) >= span / 7 for c in chosen):
            chosen.append(value)
    return sorted(chosen)


def _tick_label(value: float, level: bool) -> str:
    text = f"{value:.3g}"
    return text if level else f"×{text}"


def _limits(panel: dict) -> tuple[float, float, bool]:
    rows, first, pooled = panel["rows"], panel["first"], panel.get("pooled")
    values = [rows["fresh_effect"], rows["ci_low"], rows["ci_high"]]
    if pooled is not None and len(pooled):
        values += [pooled[c] for c in ("fresh_effect", "ci_low", "ci_high", "pi_low", "pi_high") if c in pooled]
    found = [float(v) for series in values for v in series if pd.notna(v) and 0 < float(v) < math.inf]
    for name in ("target_ratio", "band_low", "band_high", "no_worse_than"):
        value = _number(first.get(name))
        if value is not None and value > 0:
            found.append(value)
    margin = _number(first.get("no_effect_margin"))
    if not panel["level"]:
        found += [1.0] + ([1 / (1 + margin), 1 + margin] if margin else [])
    low, high = min(found), max(found)
    unbounded = bool(((rows["ci_low"] <= 0) | np.isinf(rows["ci_high"].astype(float))).any())
    span = max(math.log(high) - math.log(low), 0.02)
    pad = span * (0.16 if unbounded else 0.08)
    return math.exp(math.log(low) - pad), math.exp(math.log(high) + pad), unbounded


def _draw_panel(ax, panel: dict) -> set[str]:
    """One comparison: a line per setup. Returns the legend entries it used."""
    rows, first, level = panel["rows"].reset_index(drop=True), panel["first"], panel["level"]
    used = set()
    low, high, _ = _limits(panel)
    ax.set_xscale("log")
    ax.set_xlim(low, high)
    pooled = panel.get("pooled")
    pooled = pooled.reset_index(drop=True) if pooled is not None else pd.DataFrame()
    n = len(rows) + len(pooled)
    ax.set_ylim(n - 0.4, -0.6)
    margin = _number(first.get("no_effect_margin"))
    if not level:
        ax.axvline(1, color="#444444", linewidth=0.9, linestyle=":", zorder=1)
        used.add("no change")
        if margin:
            ax.axvspan(1 / (1 + margin), 1 + margin, color=NO_EFFECT_COLOUR, alpha=0.28, linewidth=0, zorder=0)
            used.add("no effect")
    band = (_number(first.get("band_low")), _number(first.get("band_high")))
    if None not in band:
        ax.axvspan(*band, color=BAND_COLOUR, alpha=0.16, linewidth=0, zorder=0)
        used.add("band")
    target = _number(first.get("target_ratio"))
    if target is not None:
        printed = _provenance(first) == "printed"
        ax.axvline(
            target,
            color="black",
            linewidth=1.6,
            linestyle="-" if printed else "--",
            zorder=2,
            label="target printed" if printed else "target derived",
        )
        used.add("printed" if printed else "derived")
    bound = _number(first.get("no_worse_than"))
    if bound is not None:
        ax.axvline(bound, color=BOUND_COLOUR, linewidth=1.6, linestyle="-.", zorder=2)
        used.add("bound")
    for y, row in rows.iterrows():
        verdict = row["verdict"]
        colour = VERDICT_COLOURS.get(verdict, "#000000")
        estimate, ci_low, ci_high = float(row["fresh_effect"]), float(row["ci_low"]), float(row["ci_high"])
        left = ci_low if ci_low > 0 else None
        right = ci_high if math.isfinite(ci_high) else None
        ax.hlines(y, left or low, right or high, color=colour, linewidth=2.6, zorder=3)
        for edge, end in ((left, low), (right, high)):
            if edge is None:  # an unbounded CI: an arrow to the axis edge
                ax.annotate(
                    "",
                    xy=(end, y),
                    xytext=(estimate, y),
                    zorder=3,
                    annotation_clip=False,
                    arrowprops={"arrowstyle": "-|>", "color": colour, "linewidth": 2.6, "mutation_scale": 16},
                )
                used.add("unbounded")
        ax.plot(
            [estimate],
            [y],
            marker=VERDICT_MARKERS.get(verdict, "o"),
            markersize=9,
            color=colour,
            markeredgecolor="white" if verdict == "inconclusive" else "black",
            markeredgewidth=0.7,
            zorder=4,
        )
        used.add(verdict)
        n_text = row["n_per_condition"]
        ax.text(
            1.024,
            y,
            f"{verdict}\n{_numbers(row)}, n {n_text}" + (" runs" if level else " runs per condition"),
            transform=ax.get_yaxis_transform(),
            va="center",
            ha="left",
            fontsize=8.5,
            linespacing=1.25,
            fontweight="normal",
            color="black",
        )
        ax.plot(
            [1.008],
            [y],
            marker=VERDICT_MARKERS.get(verdict, "o"),
            color=colour,
            markersize=7,
            markeredgecolor="black",
            markeredgewidth=0.5,
            transform=ax.get_yaxis_transform(),
            clip_on=False,
        )
    for index, row in pooled.iterrows():
        used |= _draw_pool(ax, len(rows) + index, row, low, high)
    labels = [_setup_label(s) for s in rows["setup"]]
    labels += [f"{row['setup']}\n({row['n_per_condition']})" for _, row in pooled.iterrows()]
    ax.set_yticks(range(n), labels, fontsize=8)
    ticks = _nice_ticks(low, high, ([] if level else [1.0]) + ([target] if target is not None else []))
    from matplotlib.ticker import FixedLocator, NullFormatter, NullLocator

    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.set_xticklabels([_tick_label(t, level) for t in ticks], fontsize=8.5)
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel(
        "the level itself (median over runs, a share; log scale)"
        if level
        else "fresh ratio, treatment / baseline (log scale)",
        fontsize=8.5,
    )
    ax.grid(axis="x", color="#e4e4e4", linewidth=0.6, zorder=0)
    ax.tick_params(axis="y", length=0)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    return used


def _draw_pool(ax, y: float, row, low: float, high: float) -> set[str]:
    """A pooled row: its CI as a diamond (widest at the estimate), its prediction interval for a new machine as a thin
    line with end ticks through it, and at the right its word, numbers and the PI."""
    verdict = row["verdict"]
    colour = VERDICT_COLOURS.get(verdict, "#000000")
    estimate, ci_low, ci_high = float(row["fresh_effect"]), float(row["ci_low"]), float(row["ci_high"])
    used = {verdict, "pooled"}
    pi_low, pi_high = _number(row.get("pi_low")), _number(row.get("pi_high"))
    if pi_low is not None and pi_high is not None:
        ax.hlines(y, max(pi_low, low), min(pi_high, high), color="#333333", linewidth=1.1, zorder=3)
        for end in (pi_low, pi_high):
            if low <= end <= high:
                ax.vlines(end, y - 0.18, y + 0.18, color="#333333", linewidth=1.1, zorder=3)
        used.add("prediction")
    ax.fill(
        [ci_low, estimate, ci_high, estimate],
        [y, y - 0.32, y, y + 0.32],
        facecolor=colour,
        edgecolor="black",
        linewidth=0.8,
        zorder=4,
    )
    ax.text(
        1.024,
        y,
        f"{verdict} (pooled)\n{_numbers(row)}, {_pi_words(row).replace('prediction interval for a new machine', 'PI')}",
        transform=ax.get_yaxis_transform(),
        va="center",
        ha="left",
        fontsize=8.5,
        linespacing=1.25,
        fontweight="bold",
        color="black",
    )
    ax.axhline(y - 0.5, color="#bbbbbb", linewidth=0.6, zorder=1)
    return used


def _panel_title(panel: dict) -> str:
    first = panel["first"]
    words = "\n".join(textwrap.wrap(str(panel["comparison"]), 125))
    kind = "; a level, not a ratio: drawn against the printed level" if panel["level"] else ""
    return f"{words}\ntarget: {target_words(first)}{kind}"


def _missing_lines(missing: list[tuple[str, str, str]], limit: int = 260) -> list[str]:
    lines = []
    for setup, verdict, reason in missing:
        reason = reason if len(reason) <= limit else reason[: limit - 1] + "…"
        lines += textwrap.wrap(f"• {setup} — {verdict}: {reason}", 175, subsequent_indent="    ")
    return lines


def _grouped_lines(untested: list[tuple[str, str]], limit: int = 260) -> list[str]:
    """The setups that tested nothing, one bullet per reason naming every setup it holds for."""
    by_reason: dict[str, list[str]] = {}
    for setup, why in untested:
        by_reason.setdefault(why, []).append(setup)
    lines = []
    for why, setups in by_reason.items():
        why = why if len(why) <= limit else why[: limit - 1] + "…"
        lines += textwrap.wrap(f"• {why}: {', '.join(setups)}", 175, subsequent_indent="    ")
    return lines


def _legend() -> dict:
    """The legend's entries (artists made when a figure is drawn: matplotlib is imported then, analysis/pyplot.py)."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    return {
        "printed": (Line2D([], [], color="black", linewidth=1.6), "target printed in the source"),
        "derived": (Line2D([], [], color="black", linewidth=1.6, linestyle="--"), "target derived by ticklab"),
        "band": (Patch(color=BAND_COLOUR, alpha=0.16), "consistent-size band around the target"),
        "no effect": (Patch(color=NO_EFFECT_COLOUR, alpha=0.28), "declared no-effect margin around ×1"),
        "no change": (Line2D([], [], color="#444444", linewidth=0.9, linestyle=":"), "no change (×1)"),
        "bound": (
            Line2D([], [], color=BOUND_COLOUR, linewidth=1.6, linestyle="-."),
            "non-inferiority bound (declared)",
        ),
        "pooled": (
            Patch(facecolor="#bbbbbb", edgecolor="black"),
            "pooled over the setups of one kind: diamond = its CI (random effects)",
        ),
        "prediction": (
            Line2D([], [], color="#333333", linewidth=1.1, marker="|", markersize=8),
            "prediction interval for a new machine of that kind",
        ),
        "unbounded": (
            Line2D([], [], color="#555555", linewidth=2.6, marker=">", markersize=7),
            "CI unbounded: too few runs (arrow to the edge)",
        ),
    }


def forest_figure(rows: pd.DataFrame, title: str | None = None):
    """One claim's verdict rows as a forest plot (see the module's docstring). ``rows``: VERDICT_COLUMNS rows of one
    claim, e.g. from several setups or fleet hosts."""
    from matplotlib.lines import Line2D

    if rows.empty:
        raise ValueError("a forest plot needs verdict rows")
    rows = rows.reset_index(drop=True)
    for column in (
        "fresh_effect",
        "ci_low",
        "ci_high",
        "p_holm",
        "target_ratio",
        "band_low",
        "band_high",
        "no_effect_margin",
        "no_worse_than",
        "pi_low",
        "pi_high",
    ):
        if column in rows:
            rows[column] = pd.to_numeric(rows[column], errors="coerce")
    claim = str(rows["claim"].iloc[0])
    panels = _panels(rows)
    untested = untested_setups(rows)
    blocks: list[tuple[str, float, Any]] = []  # (kind, height in inches, payload)
    blocks.append(("legend", 0.75, None))
    roles = {p["role"] for p in panels}
    for role in ("claim", "premise"):
        chosen = [p for p in panels if p["role"] == role]
        if role == "premise" and chosen:
            blocks.append(("header", 0.42, "Premise rows: what the claim presupposes, tested as such (not the claim)"))
        elif role == "claim" and chosen and "premise" in roles:
            blocks.append(("header", 0.42, "Claim rows"))
        for panel in chosen:
            title_lines = _panel_title(panel).count("\n") + 1
            if len(panel["rows"]):
                blocks.append(
                    (
                        "panel",
                        _PANEL_EXTRA
                        + title_lines * 0.17
                        + _LINE * (len(panel["rows"]) + len(panel["pooled"]))
                        + 0.12 * len(panel["pooled"])
                        + 0.12 * panel["rows"]["setup"].map(lambda s: "\n" in _setup_label(s)).sum(),
                        panel,
                    )
                )
            else:
                blocks.append(("title", 0.1 + title_lines * 0.19, panel))
            if panel["missing"]:
                lines = ["No line (no CI) for:"] + _missing_lines(panel["missing"])
                blocks.append(("notes", 0.12 + _TEXT_LINE * len(lines), lines))
    if untested:
        lines = ["Setups that tested nothing of this claim (no line in any panel), by reason:"] + _grouped_lines(
            untested
        )
        blocks.append(("notes", 0.15 + _TEXT_LINE * len(lines), lines))
    height = sum(b[1] for b in blocks) + 0.5
    fig = plt.figure(figsize=(_WIDTH, height))
    fig.suptitle(
        title or f"{claim}: fresh effect and its simultaneous CI per setup, against the target",
        x=0.01,
        ha="left",
        y=1 - 0.08 / height,
        va="top",
        fontsize=11,
        fontweight="bold",
    )
    top = height - 0.45
    used: set[str] = set()
    legend_ax = None
    for kind, size, payload in blocks:
        bottom = top - size
        if kind == "legend":
            legend_ax = fig.add_axes([0.01, bottom / height, 0.98, size / height])
            legend_ax.axis("off")
        elif kind == "panel":
            title_lines = _panel_title(payload).count("\n") + 1
            axis_top = top - 0.1 - title_lines * 0.17
            axis_bottom = bottom + 0.62
            ax = fig.add_axes(
                [
                    _LEFT / _WIDTH,
                    axis_bottom / height,
                    (_WIDTH - _LEFT - _RIGHT) / _WIDTH,
                    (axis_top - axis_bottom) / height,
                ]
            )
            used |= _draw_panel(ax, payload)
            fig.text(
                0.01,
                (top - 0.05) / height,
                _panel_title(payload),
                ha="left",
                va="top",
                fontsize=9.5,
                fontweight="bold" if payload["role"] == "claim" else "normal",
                color="black" if payload["role"] == "claim" else "#3b3b8f",
            )
        elif kind == "title":
            fig.text(
                0.01,
                (top - 0.05) / height,
                _panel_title(payload) + "\n(no setup gave this comparison a CI)",
                ha="left",
                va="top",
                fontsize=9.5,
                fontweight="bold",
            )
        elif kind == "header":
            fig.text(
                0.01,
                (top - 0.1) / height,
                payload,
                ha="left",
                va="top",
                fontsize=10.5,
                fontweight="bold",
                color="#3b3b8f" if payload.startswith("Premise") else "black",
            )
            fig.add_artist(Line2D([0.01, 0.99], [(top - 0.02) / height] * 2, color="#888888", linewidth=1))
        elif kind == "notes":
            fig.text(
                _LEFT / _WIDTH * 0.15,
                (top - 0.04) / height,
                "\n".join(payload),
                ha="left",
                va="top",
                fontsize=8,
                color="#333333",
                linespacing=1.35,
            )
        top = bottom
    handles = [
        (
            Line2D(
                [],
                [],
                linestyle="none",
                marker=VERDICT_MARKERS[v],
                color=VERDICT_COLOURS[v],
                markersize=8,
                markeredgecolor="black",
                markeredgewidth=0.6,
            ),
            v,
        )
        for v in VERDICTS
        if v in used
    ]
    legend = _legend()
    handles += [legend[key] for key in legend if key in used]
    if legend_ax is not None and handles:
        legend_ax.legend(
            [h for h, _ in handles],
            [label for _, label in handles],
            loc="center left",
            ncol=4,
            fontsize=8.5,
            frameon=False,
            handlelength=2.4,
            columnspacing=1.6,
        )
    return fig


FOREST = "forest"  # figures/<claim>/forest.png|.svg and tables/<claim>/forest.csv|.md, written by the claim's notebook


def no_forest_sentence(claim: str) -> str:
    """What a notebook says of a claim none of whose rows has a CI."""
    return f"{claim}: no setup gave a comparison a CI, so no forest plot (the verdict table above says why)."


def has_lines(rows: pd.DataFrame) -> bool:
    """Whether a claim's rows give the plot at least one line (a fresh effect with its CI)."""
    return bool(len(rows)) and bool(rows.apply(_has_ci, axis=1).any())


def with_prediction(rows: pd.DataFrame, pooled_csv) -> pd.DataFrame:
    """The verdict rows with each pooled row's prediction interval (``pi_low``, ``pi_high``) from the claim's pooled
    table (analysis/pooling.py writes it beside the verdicts), matched by comparison and setup kind; the rows as they
    are where no row is pooled or the table is not there."""
    from pathlib import Path

    from .pooling import POOLED_PREFIX

    if rows.empty or "role" not in rows or not (rows["role"] == "pooled").any() or not Path(pooled_csv).is_file():
        return rows
    table = pd.read_csv(pooled_csv)
    table["setup"] = POOLED_PREFIX + table["setup_kind"].astype(str)
    return rows.merge(table[["comparison", "setup", "pi_low", "pi_high"]], on=["comparison", "setup"], how="left")


def save_forest(rows: pd.DataFrame, output_dir, data_dir=None):
    """Write one claim's forest plot and its table beside it (figures/<claim>/forest, tables/<claim>/forest), with
    the claim's verdict CSV and the manifests of the bundles behind it as sources. Returns the figure."""
    from pathlib import Path

    from .captured import find_bundles
    from .outputs import Outputs

    claim = str(rows["claim"].iloc[0])
    sources = [Path(output_dir) / "verdicts" / f"{claim}.csv"]
    if data_dir is not None and Path(data_dir).is_dir():
        sources += [
            ref.path / "manifest.json"
            for ref in find_bundles(data_dir, claim)
            if (ref.path / "manifest.json").is_file()
        ]
    sources = [s for s in sources if Path(s).is_file()]
    rows = with_prediction(rows, Path(output_dir) / "tables" / claim / "pooled.csv")
    if "pi_low" in rows:
        sources.append(Path(output_dir) / "tables" / claim / "pooled.csv")
    fig = forest_figure(rows)
    out = Outputs(output_dir, claim)
    setups = rows[rows.apply(_has_ci, axis=1) & (rows["role"] != "pooled")]["setup"].nunique()
    out.figure(
        FOREST,
        fig,
        caption=(
            f"Forest plot: per comparison, the fresh ratio and its simultaneous CI on each of {setups} setup(s) "
            "with a CI (log axis), the target (solid: printed in the source; dashed: derived by ticklab) with its "
            "consistent-size "
            "band, the declared no-effect margin around ×1, and the verdict with the numbers and n; where 3 or more "
            "setups of one kind tested a comparison, their random-effects pool under them (diamond: its CI; thin line: "
            "the prediction interval for a new machine); setups without a CI are listed under the plot with why"
        ),
        sources=sources,
    )
    out.table(
        FOREST,
        forest_table(rows),
        caption="The numbers in the forest plot: one row per line, then every setup "
        "listed under it with why it has no line",
        sources=sources,
    )
    return fig
