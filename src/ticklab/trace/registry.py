"""The names an experiment and the command line choose among, each the one list of them (standard library only:
a lab guest loads experiments without numpy, and ``ticklab --help`` or ``ticklab ingest`` imports no capture code).

- ``METRIC_SET_NAMES``: the per-run trace metric sets an experiment's ``trace.metrics`` may name; each ``<set>`` is
  the function ``tracemetrics.<set>_metrics`` (``tracemetrics.METRIC_SETS`` is built from this list).
- ``TRACING_BACKENDS``: the recorders that write a run's trace, each the format ``trace.ingest`` reads back; each is
  the ``capture/tracing.py`` recorder class whose ``backend`` is that name (``tracing.RECORDERS`` is built from this
  list). An experiment's ``lab.backend`` and the CLI's ``--backend`` take ``"auto"`` or one of them."""

METRIC_SET_NAMES = ("tick", "hrtimer")
TRACING_BACKENDS = ("trace-cmd", "tracefs")


def backend_choices() -> tuple[str, ...]:
    """What ``lab.backend`` and ``--backend`` accept: "auto" (capture's choose_backend decides), then each backend."""
    return ("auto", *TRACING_BACKENDS)
