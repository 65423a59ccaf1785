"""The per-CPU ``stats`` text of a tracefs ring buffer (per_cpu/cpuN/stats), read by capture and by ingest.

Its own module, with no imports of ticklab, so that :mod:`ticklab.trace.ingest` reads a capture's stats without
importing capture (and the host modules behind it), and the capture code that runs in a lab guest keeps
to the standard library.
"""

from __future__ import annotations

import re

LOST_EVENTS = re.compile(r"^\s*(?:overrun|dropped events):\s*(\d+)", re.M)


def stats_lost_count(text: str) -> int:
    """Events lost according to per_cpu/cpuN/stats text (one or several CPUs): 'overrun' plus 'dropped events'."""
    return sum(int(v) for v in LOST_EVENTS.findall(text))
