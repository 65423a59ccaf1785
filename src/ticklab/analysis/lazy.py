"""Heavy libraries imported when first used, not when a claim module is: ``plt`` (matplotlib.pyplot) and ``stats``
(scipy.stats).

A claim module is imported for its comparisons too (a capture's stopping rule counts them, even in a dry run, which
must answer within a second: issue 56); pyplot and scipy.stats are half of that import. Attribute access on either
name imports the library once and hands on what it names, so the code reads as it would with the library itself.
"""

from __future__ import annotations

import importlib


class _Lazy:
    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attribute: str):
        return getattr(importlib.import_module(self._name), attribute)


plt = _Lazy("matplotlib.pyplot")
stats = _Lazy("scipy.stats")
