"""Experiment definitions (runners/<claim>/<name>.yaml): conditions, workload, events, runs, timeouts.

An experiment is data. Its ``conditions`` are either a list of named conditions or a ``matrix`` of
variables; a value may name something only the host knows:

    "@clocksources"      every available clocksource
    "@threads"           1, 2, 4, ... up to nproc, and nproc
    "@idle_configs"      "all" (every cpuidle state enabled), then "max=<state>" for each state but the
                         deepest (the deeper states disabled)
    "@deepest_disabled"  "max=<second-deepest state>": only the deepest cpuidle state disabled
    {per_cpu: 0.5}       round(0.5 x nproc), at least 1 (scales a count from the source machine)

``budget: {time_s: S, max_runs: N}`` lets the capture go on past ``runs`` (see capture/stopping.py):
rounds of one more run per condition until the claim's comparisons meet the precision target, for at
most S seconds of measured runs and N runs per condition (default 10 x runs).

``extras`` are cross-checks run once per condition after the measured runs (``per_run: true``: right
after the workload of every run, in the same boot and under the same knobs, into raw/<run>/<name>/;
``traced: true`` records the experiment's trace around it too, into raw/<run>/<name>/trace), each
only where its own ``requires`` are met (otherwise the manifest says why it was skipped); they never enter
results.csv. Variables listed under ``knobs`` are applied to the host before each run (clocksource,
sched_feature:<NAME>, idle_config); every other variable only fills the workload's argv.

An experiment with a ``lab`` section runs in a lab guest (`ticklab lab run`), not on the host:
``lab: {kernel: hz1000, smp: 2, memory_mb: 1024, cmdline: "...", accel: any|kvm, boot_timeout_s: 300}``.
Its conditions may change what the guest boots with, through the knobs ``boot_cmdline`` (kernel
command-line words), ``lab_kernel`` (a kernel/configs variant) and ``lab_smp`` (vCPUs); every run is
its own boot, so runs stay interleaved.
"""

from __future__ import annotations

import functools
import itertools
import random
from dataclasses import dataclass, field
from pathlib import Path

from .. import registry, schemas, yamlsafe
from ..paths import repo_root
from ..safefiles import UnsafeFileError, read_bytes, shown
from ..yamlsafe import preview

REQUIRED = ("claim", "name", "description", "conditions", "workload")
KNOWN = {
    *REQUIRED,
    "runs",
    "warmup",
    "timeout_s",
    "seed",
    "requires",
    "trace",
    "knobs",
    "profile",
    "extras",
    "notes",
    "lab",
    "budget",
    "isolate",
    "answer",
    "kernel_builds",
    "assumes",
}
BUDGET_KEYS = {"time_s", "max_runs"}
# host_kernel: the kernel a boot plan boots for the condition ("running" or a release pattern; capture --boot)
KNOB_KINDS = ("clocksource", "idle_config", "boot_cmdline", "lab_kernel", "lab_smp", "host_kernel")
MAX_EXPERIMENT_BYTES = 1 << 20
LAB_KEYS = {"kernel", "smp", "memory_mb", "cmdline", "accel", "boot_timeout_s", "pin_vcpus", "backend", "acpi_tables"}


class ExperimentError(ValueError):
    """An experiment definition is malformed; the message names the file and the key."""


@dataclass
class Condition:
    name: str
    values: dict

    def record(self) -> dict:
        return {"name": self.name, **self.values}


@dataclass
class Experiment:
    path: Path
    claim: str
    name: str
    description: str
    conditions: dict
    workload: dict
    runs: int = 10
    warmup: int = 1
    timeout_s: float = 600
    seed: int = 1
    requires: list[str] = field(default_factory=list)
    trace: dict | None = None
    knobs: dict = field(default_factory=dict)
    profile: dict | None = None
    extras: list[dict] = field(default_factory=list)
    notes: str | None = None
    definition: dict = field(default_factory=dict)
    lab: dict | None = None
    budget: dict | None = None
    isolate: dict | None = (
        None  # {cpu: last, rt_throttling: on|off}: interrupts and other tasks moved off the measured CPU per run
    )
    answer: list[dict] = field(default_factory=list)  # what capture prints once sealed (capture/answer.py)
    # a boot experiment's kernels that `ticklab kernel build --host` makes: {kernel: <host_kernel pattern>,
    # series: "X.Y", localmodconfig: bool}; a missing kernel's error names the command (capture/boot_capture.py)
    kernel_builds: list[dict] = field(default_factory=list)
    # what the machine must be for a run to count ({clocksource: tsc}); the analysis leaves other runs out
    assumes: dict = field(default_factory=dict)

    def all_requires(self) -> list[str]:
        """What the experiment and its extras require, each once, in order."""
        return list(dict.fromkeys([*self.requires, *(r for extra in self.extras for r in extra.get("requires", []))]))

    def extras_per_condition(self) -> list[dict]:
        """The cross-checks run once per condition after the measured runs (the ``per_run`` ones run in each run)."""
        return [extra for extra in self.extras if not extra.get("per_run")]

    def trace_settings(self) -> TraceSettings | None:
        """The ``trace`` section as the recorder takes it, defaults filled in (None: the experiment traces nothing).
        The one reading of it: a dry run lists the writes these settings make, a run records with them."""
        if not self.trace:
            return None
        return TraceSettings(
            events=list(self.trace["events"]),
            buffer_kb=int(self.trace.get("buffer_kb", 4096)),
            symbols=list(self.trace.get("symbols") or []),
            functions=list(self.trace.get("functions") or []),
            optional_events=list(self.trace.get("optional_events") or []),
            clock=self.trace.get("clock"),
        )


@dataclass(frozen=True)
class TraceSettings:
    events: list[str]
    buffer_kb: int  # per CPU
    symbols: list[str]  # kallsyms lines to keep beside the trace
    functions: list[str]  # the function tracer's filter (empty: no function tracer)
    optional_events: list[str]  # recorded where the running kernel has them
    clock: str | None  # the trace clock (None: the kernel's default)


@dataclass(frozen=True)
class Budget:
    time_s: float  # wall-clock seconds for the measured runs (initial and added), warm-ups excluded
    max_runs: int  # measured runs per condition, at most


def parse_budget(data: dict, path: Path) -> Budget | None:
    spec = data.get("budget")
    if spec is None:
        return None
    runs = data.get("runs", 10)
    if not isinstance(spec, dict) or set(spec) - BUDGET_KEYS or "time_s" not in spec:
        raise ExperimentError(f"{path}: budget must be a mapping with time_s and optionally max_runs")
    try:
        budget = Budget(float(spec["time_s"]), int(spec.get("max_runs", 10 * runs)))
    except (TypeError, ValueError) as exc:
        raise ExperimentError(f"{path}: budget.time_s and budget.max_runs must be numbers") from exc
    if budget.time_s < 0 or budget.max_runs < runs:
        raise ExperimentError(f"{path}: budget needs time_s ≥ 0 and max_runs ≥ runs ({runs})")
    return budget


def runners_dir() -> Path:
    return repo_root() / "runners"


BOOT_EXPERIMENT_PREFIX = "host-boot-"


def experiment_paths(claim: str) -> list[Path]:
    """The claim's experiments a capture or the lab runs; boot experiments (host-boot-*.yaml: one reboot per run)
    are left out: only ``capture --boot`` runs them (:func:`boot_experiment_paths`)."""
    return sorted(p for p in (runners_dir() / claim).glob("*.yaml") if not p.name.startswith(BOOT_EXPERIMENT_PREFIX))


def boot_experiment_paths(claim: str) -> list[Path]:
    return sorted((runners_dir() / claim).glob(f"{BOOT_EXPERIMENT_PREFIX}*.yaml"))


def default_boot_experiment(found: list[Experiment]) -> Experiment | None:
    """Of a claim's several boot experiments, the one ``capture --boot`` runs without ``--experiment``: the only one
    that needs no kernel built, every condition booting the running kernel (nohz's host-boot-ftq beside
    host-boot-hz, whose HZ kernels are built first); None when there is not exactly one."""

    def kernel_knob(experiment: Experiment) -> str | None:
        return next((name for name, kind in experiment.knobs.items() if kind == "host_kernel"), None)

    running = [
        e
        for e in found
        if all(
            str(c.get(kernel_knob(e), "running")) == "running"
            for c in (e.conditions if isinstance(e.conditions, list) else [])
        )
    ]
    return running[0] if len(running) == 1 else None


def is_boot_experiment(experiment: Experiment) -> bool:
    """Whether ``experiment`` is run one boot of this host per run (``capture --boot``): a ``host_kernel`` knob
    outside the lab."""
    return "host_kernel" in experiment.knobs.values() and experiment.lab is None


# The workloads whose output ticklab reads: each by capture/workloads.py's parse_<tool> (its PARSERS, built from this
# list). An experiment names one as workload.tool, checked when it is loaded, before any run.
WORKLOAD_TOOLS = ("ftq", "clockbench", "timejobs", "hackbench", "tbench", "kbuild")


def experiment_schema() -> dict:
    """schemas.experiment_schema with the names of today's registries (read at each call, so the schema follows
    them; built once per set of names)."""
    metric_sets = tuple(registry.METRIC_SET_EVENTS)
    return _experiment_schema(
        metric_sets, registry.backend_choices(), registry.lab_accel_choices(), registry.REQUIREMENT_KINDS
    )


@functools.cache
def _experiment_schema(
    metric_sets: tuple[str, ...],
    backends: tuple[str, ...],
    accels: tuple[str, ...],
    requirement_kinds: tuple[registry.RequirementKind, ...],
) -> dict:
    return schemas.experiment_schema(
        metric_sets=metric_sets, backends=backends, accels=accels, requirement_kinds=requirement_kinds
    )


def load_experiment(path: Path | str) -> Experiment:
    path = Path(path)
    data = _read_yaml(path)
    if not isinstance(data, dict):
        raise ExperimentError(f"{path}: expected a mapping of experiment keys")
    check_keys_are_text(data, path)
    missing = [k for k in REQUIRED if k not in data]
    unknown = sorted(set(data) - KNOWN)
    if missing:
        raise ExperimentError(f"{path}: missing key(s) {', '.join(missing)}")
    if unknown:
        raise ExperimentError(f"{path}: unknown key(s) {_listed(unknown)} (known: {', '.join(sorted(KNOWN))})")
    if not isinstance(data["workload"], dict) or not isinstance(data["workload"].get("argv"), list):
        raise ExperimentError(f"{path}: workload.argv must be a list of arguments")
    schemas.check(data, experiment_schema(), str(path), ExperimentError)  # types first: the checks below rely on them
    tool = data["workload"].get("tool")
    if tool not in WORKLOAD_TOOLS:
        said = "missing" if tool is None else f"{preview(tool, 80)} is not a workload ticklab reads"
        raise ExperimentError(f"{path}: workload.tool {said} (known: {', '.join(WORKLOAD_TOOLS)})")
    for key in ("runs", "warmup", "seed"):
        if key in data and (not isinstance(data[key], int) or data[key] < (1 if key == "runs" else 0)):
            raise ExperimentError(f"{path}: {key} must be a {'positive' if key == 'runs' else 'non-negative'} integer")
    boot_file = path.name.startswith(BOOT_EXPERIMENT_PREFIX)
    if boot_file != ("host_kernel" in (data.get("knobs") or {}).values()):
        raise ExperimentError(
            f"{path}: a boot experiment (host_kernel knob) must be named {BOOT_EXPERIMENT_PREFIX}*.yaml, "
            "and such a file needs a host_kernel knob"
        )
    for variable, kind in (data.get("knobs") or {}).items():
        if kind not in KNOB_KINDS and not str(kind).startswith("sched_feature:"):
            raise ExperimentError(
                f"{path}: knobs.{shown(variable, 80)}: unknown knob {preview(kind, 80)} "
                f"(known: {', '.join(KNOB_KINDS)}, sched_feature:<NAME>)"
            )
    for index, extra in enumerate(data.get("extras") or []):
        if not isinstance(extra, dict) or not {"name", "argv"} <= set(extra) or not isinstance(extra["argv"], list):
            raise ExperimentError(f"{path}: extras[{index}] needs a name and an argv list")
        if extra["name"] == "trace" or [e.get("name") for e in data["extras"]].count(extra["name"]) > 1:
            raise ExperimentError(
                f"{path}: extras[{index}]: name {preview(extra['name'], 80)} is taken (by another "
                "extra, or 'trace', the run's own trace directory)"
            )
        if extra.get("traced") and not (extra.get("per_run") and data.get("trace")):
            raise ExperimentError(
                f"{path}: extras[{index}] is traced: it must be per_run and the experiment must have a "
                "trace section (its events are what the extra records)"
            )
    lab = data.get("lab")
    if lab is not None and (not isinstance(lab, dict) or set(lab) - LAB_KEYS):
        raise ExperimentError(f"{path}: lab must be a mapping with keys among {', '.join(sorted(LAB_KEYS))}")
    parse_budget(data, path)
    check_idle_configs(data, path)
    check_cmdline_words(data, path)
    check_trace_events(data, path)
    data = traced_definition(data)
    fields = {k: v for k, v in data.items() if k in KNOWN}
    return Experiment(path=path, definition=data, **fields)


def metric_set_names(named: str | list[str]) -> list[str]:
    """An experiment's trace.metrics: one set's name or a list of them."""
    return [named] if isinstance(named, str) else list(named)


def metric_set_events(trace: dict) -> list[str]:
    """The tracepoints the metric sets ``trace.metrics`` names read (registry.METRIC_SET_EVENTS), each once, in
    order."""
    names = metric_set_names(trace.get("metrics") or [])
    return list(dict.fromkeys(event for name in names for event in registry.METRIC_SET_EVENTS[name]))


def check_trace_events(data: dict, path: Path) -> None:
    """An experiment that lists trace.events traces every event its metric sets read (an experiment that leaves the
    list out traces just those: :func:`traced_definition`)."""
    trace = data.get("trace") or {}
    if "events" not in trace:
        return
    missing = [event for event in metric_set_events(trace) if event not in trace["events"]]
    if missing:
        raise ExperimentError(
            f"{path}: trace.events leaves out {', '.join(missing)}, read by trace.metrics "
            f"{', '.join(metric_set_names(trace['metrics']))}; list them, or leave trace.events out to trace what the "
            "metric sets read"
        )


def traced_definition(data):
    """The experiment ``data`` (a YAML file's, as loaded) with the events it traces: a trace section that names metric
    sets and lists no events traces the sets' events (registry.METRIC_SET_EVENTS), and its definition, as a bundle's
    manifest records it, says so; anything else as it is."""
    trace = data.get("trace") if isinstance(data, dict) else None
    if not isinstance(trace, dict) or "events" in trace or not trace.get("metrics"):
        return data
    return {**data, "trace": {"events": metric_set_events(trace), **trace}}


def _read_yaml(path: Path):
    """The experiment file's YAML: a regular file reached without a link (ticklab.safefiles), bounded, read by the
    shared loader (ticklab.yamlsafe: no anchors or aliases, no empty typed values); every problem one
    ExperimentError naming the file."""
    try:
        raw = read_bytes(path, MAX_EXPERIMENT_BYTES)
        return yamlsafe.load(raw.decode("utf-8"))
    except UnsafeFileError as exc:
        raise ExperimentError(str(exc)) from None
    except UnicodeDecodeError as exc:
        raise ExperimentError(f"{shown(path)}: not UTF-8 text (byte {exc.start})") from None
    except yamlsafe.YamlError as exc:
        raise ExperimentError(f"{shown(path)}: {exc}") from None


def _listed(names) -> str:
    """Names from the input, as a bounded, escaped list for an error line."""
    names = [shown(n, 80) for n in names]
    return ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")


def check_keys_are_text(data, path: Path, where: str = "") -> None:
    """Every mapping key in an experiment is a string: YAML reads `1:`, `on:` or `null:` as a number, a boolean or
    nothing, which no key, condition variable or argv template can be."""
    stack, seen = [(data, where)], set()
    while stack:
        node, at = stack.pop()
        if isinstance(node, (dict, list)):
            if id(node) in seen:  # a YAML alias: each node once (an alias loop, a: &a [*a], would never end)
                continue
            seen.add(id(node))
        if isinstance(node, dict):
            for key, value in node.items():
                if not isinstance(key, str):
                    raise ExperimentError(
                        f"{shown(path)}: {at + ': ' if at else ''}key {preview(key, 80)} is not a string (quote it)"
                    )
                stack.append((value, f"{at}.{shown(key, 80)}" if at else shown(key, 80)))
        elif isinstance(node, list):
            stack.extend((item, f"{at}[{index}]") for index, item in enumerate(node))


IDLE_HOST_VALUES = ("@idle_configs", "@deepest_disabled")


def check_idle_configs(data: dict, path: Path) -> None:
    """Every value an idle_config knob can take is "all", "max=<cpuidle state>" or a host value that gives those
    (@idle_configs, @deepest_disabled)."""
    variables = [v for v, kind in (data.get("knobs") or {}).items() if kind == "idle_config"]
    spec = data.get("conditions")
    for variable in variables:
        if isinstance(spec, dict):
            found = [(f"conditions.matrix.{variable}", (spec.get("matrix") or {}).get(variable))]
        else:
            found = [
                (f"conditions[{i}].{variable}", item.get(variable))
                for i, item in enumerate(spec or [])
                if isinstance(item, dict)
            ]
        for where, values in found:
            for value in values if isinstance(values, list) else [values]:
                if value is None or value in IDLE_HOST_VALUES:
                    continue
                if not idle_config_form(value):
                    raise ExperimentError(
                        f"{shown(path)}: {shown(where, 120)}: {preview(value, 80)} is not an "
                        "idle config (all, max=<cpuidle state>, @idle_configs or @deepest_disabled)"
                    )


def idle_config_form(value) -> bool:
    return value == "all" or (isinstance(value, str) and value.startswith("max=") and len(value) > 4)


def idle_states_to_disable(value, names: list[str], source: str) -> list[str]:
    """The cpuidle states an idle config disables on a host with states ``names`` (shallowest first)."""
    if value == "all":
        return []
    deepest = str(value)[4:] if idle_config_form(value) else None
    if deepest not in names:
        raise ExperimentError(
            f"{source}: idle config {preview(value, 80)} names no cpuidle state of this host (states: {_listed(names)})"
        )
    return names[names.index(deepest) + 1 :]


def _cmdline_problem(value, *, words_list: bool) -> str | None:
    """Why ``value`` is not kernel command-line words (a string of words; with ``words_list`` also a list of words),
    or None. A word is printable text: a newline, tab or other control character would end a boot loader's line
    (grub's ``linux`` line: a ``\n  initrd ...`` would add a line of its own)."""
    if words_list and isinstance(value, list):
        for item in value:
            found = _cmdline_problem(item, words_list=False)
            if found:
                return found
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return None
    if not isinstance(value, str):
        return f"{preview(value, 200)} is not a string of command-line words"
    bad = next((c for c in value if not c.isprintable() and c != " "), None)
    if bad is not None:
        return (
            f"'{shown(value)}' holds the control character {bad!r}; kernel command-line words are printable text, "
            "separated by spaces"
        )
    return None


def check_cmdline_words(data: dict, path: Path) -> None:
    """Kernel command-line words (the values of a ``boot_cmdline`` knob, ``lab.cmdline``) are words: printable text,
    no newline or other control character; ExperimentError naming the file and key otherwise."""
    lab = data.get("lab")
    if isinstance(lab, dict) and lab.get("cmdline") is not None:
        found = _cmdline_problem(lab["cmdline"], words_list=False)
        if found:
            raise ExperimentError(f"{path}: lab.cmdline: {found}")
    variables = [name for name, kind in (data.get("knobs") or {}).items() if kind == "boot_cmdline"]
    spec = data.get("conditions")
    if not variables:
        return
    if isinstance(spec, dict) and isinstance(spec.get("matrix"), dict):  # each alternative is one condition's words
        for name in variables:
            if name not in spec["matrix"]:
                continue
            values = spec["matrix"][name]
            for index, value in enumerate(values if isinstance(values, list) else [values]):
                found = _cmdline_problem(value, words_list=False)
                if found:
                    raise ExperimentError(f"{path}: conditions.matrix.{name}[{index}]: {found}")
    elif isinstance(spec, list):  # a condition's value: a string of words or a list of words
        for index, item in enumerate(spec):
            for name in variables:
                if isinstance(item, dict) and name in item:
                    found = _cmdline_problem(item[name], words_list=True)
                    if found:
                        raise ExperimentError(f"{path}: conditions[{index}].{name}: {found}")


def thread_counts(nproc: int) -> list[int]:
    counts, n = [], 1
    while n < nproc:
        counts.append(n)
        n *= 2
    return [*counts, nproc]


def idle_configs(states: list[dict]) -> list[str]:
    names = [s["name"] for s in states]
    return ["all", *[f"max={name}" for name in names[:-1]]] if names else []


def resolve_value(value, host: dict, source: str):
    if isinstance(value, dict) and set(value) == {"per_cpu"}:
        return max(1, round(float(value["per_cpu"]) * host["nproc"]))
    if value == "@clocksources":
        return list(host["clocksources"]["available"])
    if value == "@threads":
        return thread_counts(host["nproc"])
    if value == "@idle_configs":
        return idle_configs(host["cpuidle"]["states"])
    if value == "@deepest_disabled":
        configs = idle_configs(host["cpuidle"]["states"])
        return configs[-1] if len(configs) > 1 else []
    if isinstance(value, str) and value.startswith("@"):
        raise ExperimentError(
            f"{source}: unknown host value {preview(value, 80)} "
            "(known: @clocksources, @threads, @idle_configs, @deepest_disabled)"
        )
    return value


def expand_conditions(experiment: Experiment, host: dict) -> list[Condition]:
    """The experiment's conditions on this host, in definition order."""
    spec, source = experiment.conditions, f"{experiment.path}: conditions"
    if isinstance(spec, dict) and "matrix" in spec:
        axes = {
            name: resolve_value(values, host, f"{source}.matrix.{shown(name, 80)}")
            for name, values in spec["matrix"].items()
        }
        axes = {name: values if isinstance(values, list) else [values] for name, values in axes.items()}
        empty = [name for name, values in axes.items() if not values]
        if empty:
            return []
        combos = itertools.product(*axes.values())
        return [
            Condition(
                " ".join(f"{k}={v}" for k, v in zip(axes, combo, strict=True)), dict(zip(axes, combo, strict=True))
            )
            for combo in combos
        ]
    if isinstance(spec, list):
        conditions = []
        for index, item in enumerate(spec):
            if not isinstance(item, dict) or "name" not in item:
                raise ExperimentError(f"{source}[{index}]: each condition needs a name")
            values = {
                k: resolve_value(v, host, f"{source}[{index}].{shown(k, 80)}") for k, v in item.items() if k != "name"
            }
            if any(v == [] for v in values.values()):
                continue  # a host value this host does not have (e.g. a second cpuidle state)
            conditions.append(Condition(str(item["name"]), values))
        return conditions
    raise ExperimentError(f"{source}: expected a list of conditions or a matrix")


@dataclass
class PlannedRun:
    run: str
    order: int
    condition: Condition
    warmup: bool
    block: int | None = None  # measured runs: the round (1, 2 ...) that holds one run of every condition


def schedule(conditions: list[Condition], runs: int, warmup: int, seed: int) -> list[PlannedRun]:
    """Warm-ups first (each condition in turn), then ``runs`` blocks, each one run of every condition in a seeded
    random order: the k-th runs of all conditions share block k, so a verdict can pair them and let drift between
    blocks cancel (comparisons: the blocked analysis)."""
    rng = random.Random(seed)
    planned: list[tuple[Condition, bool, int | None]] = [(c, True, None) for _ in range(warmup) for c in conditions]
    for block in range(1, runs + 1):
        chosen = list(conditions)
        rng.shuffle(chosen)
        planned += [(c, False, block) for c in chosen]
    return [PlannedRun(f"run-{i + 1:03d}", i, c, w, b) for i, (c, w, b) in enumerate(planned)]


def fill_argv(argv: list, values: dict, source: str) -> list[str]:
    filled = []
    for part in argv:
        try:
            filled.append(str(part).format(**values))
        except KeyError as exc:
            raise ExperimentError(
                f"{source}: argv uses {{{shown(exc.args[0], 80)}}}, which no condition or param defines"
            ) from exc
        except (ValueError, IndexError, AttributeError) as exc:  # an unbalanced brace, {0}, {x.y}
            raise ExperimentError(
                f"{source}: argv item {shown(repr(str(part)), 80)} is not a valid template ({shown(exc, 120)})"
            ) from None
    return filled
