"""The colours of every figure: the Okabe-Ito palette, and the check that two colours stay apart for a deuteranope.

Okabe & Ito, "Color Universal Design" (2002, jfly.uni-koeln.de/color): eight colours that people with any of the
common colour-vision deficiencies can tell apart. A figure still never rests on colour alone: each colour that means
something is said again by a hatch, a marker shape, a line style or a word in the label.

The check (``deuteranopia_delta_e``): both colours as a deuteranope sees them, by the Machado, Oliveira & Fernandes
2009 simulation at severity 1.0 (IEEE TVCG 15(6), its supplementary matrix, applied to linear RGB), then their CIE76
ΔE (Euclidean distance in CIELAB, D65). Two colours that mean different things in one figure must be at least
``DISTINCT_DELTA_E`` apart."""

from __future__ import annotations

import numpy as np

ORANGE = "#E69F00"
SKY_BLUE = "#56B4E9"
BLUISH_GREEN = "#009E73"
YELLOW = "#F0E442"
BLUE = "#0072B2"
VERMILLION = "#D55E00"
REDDISH_PURPLE = "#CC79A7"
BLACK = "#000000"
# Not Okabe-Ito's: for what is no condition (reference lines, context). Dark: a light grey (#999999) is only 7 ΔE
# from the reddish purple and 12 from the bluish green for a deuteranope.
GREY = "#555555"
OKABE_ITO = (ORANGE, SKY_BLUE, BLUISH_GREEN, YELLOW, BLUE, VERMILLION, REDDISH_PURPLE, BLACK)

# One meaning, one colour, in every figure: the condition without the change (before a patch, a setting off, the
# baseline kernel) and the one with it.
BASELINE, CHANGED = BLUE, ORANGE
# A third condition beside those two (an alternative to the change, or a reference such as TSC).
THIRD = REDDISH_PURPLE
# An effect in the direction a claim names, and the opposite (as forest.py's "reproduced" and "opposite effect").
CLAIMED_DIRECTION, OPPOSITE_DIRECTION = BLUISH_GREEN, VERMILLION
# The hatches that say again what those colours say, for bars (the cue that is not colour).
CHANGED_HATCH, THIRD_HATCH, OPPOSITE_HATCH = "//", "..", "xx"

# 15 CIE76 units, between the two sides of what the simulation shows: the red and green the figures used before
# (#c44e52 and #55a868, seaborn's) come out 9.6 apart and matplotlib's tab:red and tab:green 7.3, while the closest
# two of the eight Okabe-Ito colours (orange and yellow) are 17.0 apart. 10, the round number, would pass a pair only
# 0.4 from one known to be confused; 15 (about six just-noticeable differences of 2.3, Sharma 2003) keeps a margin
# on both sides.
DISTINCT_DELTA_E = 15.0

# Machado et al. 2009, deuteranomaly at severity 1.0 (deuteranopia): linear RGB in, linear RGB out.
DEUTERANOPIA_MACHADO_2009 = np.array(
    [[0.367322, 0.860646, -0.227968], [0.280085, 0.672501, 0.047413], [-0.011820, 0.042940, 0.968881]]
)
# IEC 61966-2-1 (sRGB): linear RGB to CIE XYZ, and the D65 white point the XYZ is relative to.
_LINEAR_RGB_TO_XYZ = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]])
_D65_WHITE = _LINEAR_RGB_TO_XYZ.sum(axis=1)


def _linear(srgb: np.ndarray) -> np.ndarray:
    return np.where(srgb <= 0.04045, srgb / 12.92, ((srgb + 0.055) / 1.055) ** 2.4)


def _cielab(linear_rgb: np.ndarray) -> np.ndarray:
    t = _LINEAR_RGB_TO_XYZ @ linear_rgb / _D65_WHITE
    f = np.where(t > (6 / 29) ** 3, np.cbrt(t), t / (3 * (6 / 29) ** 2) + 4 / 29)
    return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


def deuteranope_lab(colour) -> np.ndarray:
    """CIELAB (D65) of ``colour`` (any matplotlib colour) as a deuteranope sees it; the simulated colour is clipped
    to what a screen can show."""
    from matplotlib.colors import to_rgb

    simulated = DEUTERANOPIA_MACHADO_2009 @ _linear(np.array(to_rgb(colour)))
    return _cielab(np.clip(simulated, 0.0, 1.0))


def deuteranopia_delta_e(first, second) -> float:
    """CIE76 ΔE between two colours as a deuteranope sees them (see the module's doc)."""
    return float(np.linalg.norm(deuteranope_lab(first) - deuteranope_lab(second)))


def confusable_for_deuteranopes(colours) -> list[tuple[str, str, float]]:
    """Every pair of distinct ``colours`` (hex strings) that a deuteranope sees less than DISTINCT_DELTA_E apart,
    with the ΔE."""
    unique = sorted({c.lower() for c in colours})
    found = []
    for i, first in enumerate(unique):
        for second in unique[i + 1 :]:
            distance = deuteranopia_delta_e(first, second)
            if distance < DISTINCT_DELTA_E:
                found.append((first, second, distance))
    return found
