"""The per-run trace metric sets an experiment's ``trace.metrics`` may name: the one list of them.

Each name ``<set>`` is the function ``tracemetrics.<set>_metrics`` (``tracemetrics.METRIC_SETS`` is built from this
list). It lives apart because the experiment schema needs the names where tracemetrics cannot be imported: a lab
guest loads experiments and has no numpy or pandas (its runs' metrics are computed on the host)."""

METRIC_SET_NAMES = ("tick", "hrtimer")
