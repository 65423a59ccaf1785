"""The names experiments, plans and the command line choose among, each the one list of them. Standard library
only, at the shared floor: a lab guest loads experiments without numpy, ``ticklab --help`` and ``ticklab ingest``
import no capture or host code, and every layer may read it.

- ``METRIC_SET_EVENTS``: the per-run trace metric sets an experiment's ``trace.metrics`` may name, each with the
  tracepoints it reads (an experiment naming it traces them: capture/experiment.py checks or fills its
  ``trace.events``); each ``<set>`` is the function registered as ``@metric_set("<set>")`` in
  ``trace/tracemetrics.py`` (its ``METRIC_SETS``, checked against this table at import).
- ``TRACING_BACKENDS``: the recorders that write a run's trace, each a format ``trace.ingest`` reads back; each is
  the ``capture/tracing.py`` recorder class whose ``backend`` is that name (``tracing.RECORDERS`` is built from this
  list). An experiment's ``lab.backend`` and ``--backend`` take ``backend_choices()``.
- ``BOOT_MODES``: how a boot plan reaches each run's kernel (``capture --boot``, a plan's ``mode``); each is the
  ``host/boot_loaders.py`` object registered under that name (``boot_loaders.BOOT_MODES``, checked at import).
- ``ACCELERATORS``: what QEMU boots a lab guest with (``--accel``, an experiment's ``lab.accel``), each an
  :class:`Accelerator` (``KVM``, ``TCG``) holding what differs between them; :func:`accelerator` finds one by name.
- ``REQUIREMENT_KINDS``: what an experiment's ``requires`` may name (``kind`` or ``kind:argument``), each with the form
  of its argument; each kind is checked by the function registered as ``@checks("<kind>")`` in
  ``capture/requirements.py`` (its ``CHECKS``, checked against this table at import).
- ``COMPARE_FORMATS``: what ``ticklab compare --format`` writes (``report/compare.py`` writes each)."""

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import TypeVar

_Registered = TypeVar("_Registered", bound=Callable)


def registrar(table: dict, names: Collection[str], refusal: str) -> Callable[[str], Callable]:
    """The decorator that registers a function in ``table`` under one of ``names``, once: ``@parses``, ``@checks`` and
    ``@metric_set`` are each one of these. A name not in ``names``, or registered twice, raises ImportError with
    ``refusal`` (formatted with the name's repr as ``{name}``), so a slip stops the import, not a later capture."""

    def register_as(name: str) -> Callable[[_Registered], _Registered]:
        def register(function: _Registered) -> _Registered:
            if name not in names or name in table:
                raise ImportError(refusal.format(name=repr(name)))
            table[name] = function
            return function

        return register

    return register_as


_TIMER_INTERRUPTS = ("irq_vectors:local_timer_entry", "irq_vectors:local_timer_exit", "timer:hrtimer_expire_entry")
METRIC_SET_EVENTS = {
    # the tick's interrupts, its stops and the softirqs it raised (tracemetrics.tick_rows)
    "tick": (*_TIMER_INTERRUPTS, "timer:tick_stop", "irq:softirq_raise", "irq:softirq_entry", "irq:softirq_exit"),
    # hrtimer starts and cancels beside the expiries and interrupts: what tracemetrics.reprogram_causes needs to
    # attribute each reprogram to the timer that caused it
    "hrtimer": (*_TIMER_INTERRUPTS, "timer:hrtimer_start", "timer:hrtimer_cancel"),
}
TRACING_BACKENDS = ("trace-cmd", "tracefs")
BOOT_MODES = ("kexec", "grub", "manual")
LAB_HOST_BOOT_MODES = ("kexec", "grub")  # the lab host's plans run unattended: nobody is there to boot by hand
GUEST_BOOT_MODES = ("kexec",)  # a lab guest playing a host has no boot loader to drive


@dataclass(frozen=True)
class Accelerator:
    """How QEMU runs a lab guest's vCPUs, and what that changes in the guest's command line and record."""

    name: str  # QEMU's -accel name
    cpu: str  # QEMU's -cpu model: the host's own CPU (KVM), or every feature the emulator has (TCG)
    threaded: bool  # its -accel takes thread=single|multi: all vCPUs in one host thread, or one thread each


KVM = Accelerator("kvm", cpu="host", threaded=False)  # hardware: used only where a test guest boots with it
TCG = Accelerator("tcg", cpu="max", threaded=True)  # software emulation: slower, always there (the default)
ACCELERATORS = tuple(a.name for a in (KVM, TCG))
_ACCELERATORS = {a.name: a for a in (KVM, TCG)}


def accelerator(name: str) -> Accelerator:
    """The accelerator named ``name``; ValueError naming the choices for one there is none of."""
    try:
        return _ACCELERATORS[name]
    except KeyError:
        raise ValueError(f"--accel {name!r}: choose one of {', '.join(_ACCELERATORS)}") from None


@dataclass(frozen=True)
class RequirementKind:
    """A kind of requirement: ``name`` alone, or ``name:<argument>``."""

    name: str
    argument: str | None = None  # the argument's form, a regular expression; None: the kind takes no argument
    default: str | None = None  # what a kind whose argument may be left out checks then; None: it must be given


REQUIREMENT_KINDS = (
    RequirementKind("root"),
    RequirementKind("tracefs"),
    RequirementKind("cpuidle_states"),  # a cpuidle driver with two or more states to compare
    RequirementKind("cpuidle_driver", "[a-z0-9_]+"),  # the driver in charge is this one
    RequirementKind("sched_feature", "[A-Z_]+", default="HRTICK"),  # a sched feature that can be read and written
    RequirementKind("program", "[A-Za-z0-9_.+-]+"),  # a program on PATH
    RequirementKind("tool", "[A-Za-z0-9_.+-]+"),  # one of ticklab's tools (tools/bin), built
    RequirementKind("tracer", "[a-z_]+"),  # a tracer of this kernel (available_tracers)
)

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
