"""Fresh runs as points with their median, for the claims' per-setup figures (not a claim: the registry skips `_*`).

Each group of runs is drawn at its x position as jittered points with a black bar at the median. The median's value
is written above every point of the axes, in a band kept free of data at its top, so a label can never cover a run
(issue 31: a "median" label beside the bar overlapped the next group's points)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

# the share of the data's range kept free above it for the median labels, and where in it the labels start
HEADROOM = 0.28
LABEL_GAP = 0.06


def median_text(value: float) -> str:
    """A fresh median as a label: thousands separated and whole from 100 up, else three decimals."""
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3f}"


def runs_and_medians(
    ax,
    groups: Sequence[tuple[float, Sequence[float], str]],
    *,
    also: Sequence[float] = (),
    from_zero: bool = False,
    label: Callable[[float], str] = median_text,
    label_prefix: str = "median",
) -> dict[float, float]:
    """Draw each (x, values, color) group's runs as points and its median as a bar; write each median above the
    data. ``also``: other y values drawn on the axes (reference lines) that the labels must clear too.
    ``from_zero``: the y axis starts at 0. Returns x -> median."""
    medians: dict[float, float] = {}
    everything = [float(v) for _, values, _ in groups for v in values] + [float(v) for v in also]
    if not everything:
        return medians
    low, high = (0.0 if from_zero else min(everything)), max(everything)
    span = (high - low) or abs(high) or 1.0
    for x, group_values, color in groups:
        values = np.asarray(group_values, dtype=float)
        if values.size == 0:
            continue
        jitter = np.linspace(-0.12, 0.12, values.size) if values.size > 1 else np.zeros(1)
        ax.plot(x + jitter, values, "o", alpha=0.6, color=color)
        median = float(np.median(values))
        ax.hlines(median, x - 0.25, x + 0.25, color="black")
        ax.text(x, high + LABEL_GAP * span, f"{label_prefix}\n{label(median)}", ha="center", va="bottom", fontsize=8)
        medians[x] = median
    ax.set_ylim(low if from_zero else low - 0.05 * span, high + HEADROOM * span)
    return medians
