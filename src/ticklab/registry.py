"""The names experiments, plans and the command line choose among, each the one list of them. Standard library
only, at the shared floor: a lab guest loads experiments without numpy, ``ticklab --help`` and ``ticklab ingest``
import no capture or host code, and every layer may read it.

- ``METRIC_SET_NAMES``: the per-run trace metric sets an experiment's ``trace.metrics`` may name; each ``<set>`` is
  the function ``trace/tracemetrics.<set>_metrics`` (``tracemetrics.METRIC_SETS`` is built from this list).
- ``TRACING_BACKENDS``: the recorders that write a run's trace, each a format ``trace.ingest`` reads back; each is
  the ``capture/tracing.py`` recorder class whose ``backend`` is that name (``tracing.RECORDERS`` is built from this
  list). An experiment's ``lab.backend`` and ``--backend`` take ``backend_choices()``.
- ``BOOT_MODES``: how a boot plan reaches each run's kernel (``capture --boot``, a plan's ``mode``).
- ``ACCELERATORS``: what QEMU boots a lab guest with (``--accel``, an experiment's ``lab.accel``).
- ``COMPARE_FORMATS``: what ``ticklab compare --format`` writes (``report/compare.py`` writes each)."""

METRIC_SET_NAMES = ("tick", "hrtimer")
TRACING_BACKENDS = ("trace-cmd", "tracefs")
BOOT_MODES = ("kexec", "grub", "manual")
LAB_HOST_BOOT_MODES = ("kexec", "grub")  # the lab host's plans run unattended: nobody is there to boot by hand
GUEST_BOOT_MODES = ("kexec",)  # a lab guest playing a host has no boot loader to drive
ACCELERATORS = ("kvm", "tcg")
COMPARE_FORMATS = ("text", "csv", "md", "json")  # ticklab compare --format


def backend_choices() -> tuple[str, ...]:
    """What ``lab.backend`` and ``--backend`` accept: "auto" (capture's choose_backend decides), then each backend."""
    return ("auto", *TRACING_BACKENDS)


def accel_choices() -> tuple[str, ...]:
    """What ``ticklab lab run --accel`` accepts: "auto" (KVM if a test guest boots with it, else TCG), then each."""
    return ("auto", *ACCELERATORS)


def lab_accel_choices() -> tuple[str, ...]:
    """What an experiment's ``lab.accel`` may say: "any" (the default: the claim needs neither), or an --accel
    choice ("kvm": not testable without KVM)."""
    return ("any", *accel_choices())
