"""What a capture ends with: the claim's headline quantities on this host, read back from the sealed bundle.

An experiment's ``answer`` section (docs/ARCHITECTURE.md §3) names the quantities its source names, as results.csv
metrics, and the rows of ``traces/published/<claim>/`` the source printed beside them. Once the bundles are sealed,
``ticklab capture`` prints, per condition, each quantity's median over the measured runs with their range and n;
beside it every printed row, labelled "printed in the source" with its quote id, and what ticklab derives from one
(``cost_at_rate``: a printed cost per event times this host's measured rate), labelled "derived". An experiment
without an ``answer`` says what it recorded. Then come the claim's comparisons this capture did not test, grouped
under the one command whose experiment has both their conditions (``ticklab capture <claim> --boot kexec``,
``ticklab lab run <claim>``), and the ``ticklab report`` line that gives the verdicts.

The numbers are read back through ``bundle.load_bundle`` (every file checked against the seal), never taken from
memory: what is printed is what the bundle holds. Capture imports no analysis, so the published rows and the
claim's comparisons come as plain data from the CLI (:class:`PrintedValue`, ``stopping.PrecisionGoal``) in an
:class:`AnswerContext`, made before the first run so that a wrong row name stops the capture before it starts.

Every command the answer suggests is one that can run here: the CLI hands over doctor's check of an experiment
(``doctor.suggestion_check``: QEMU and kernel sources for a lab run, a /boot that boots this machine for a boot plan,
the requirements) as ``AnswerContext.missing_here``; a command that cannot run here is printed with what is missing,
as what would run it elsewhere. The report line writes beside the data (``<data-dir>/report``), or, for the
project's own traces/, into ``build/<host-id>``: never over the bundled data's report in build/.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..bundle import Bundle, load_bundle, measured_results
from ..paths import repo_root, work_dir
from .experiment import (
    Experiment,
    ExperimentError,
    boot_experiment_paths,
    default_boot_experiment,
    expand_conditions,
    experiment_paths,
    is_boot_experiment,
    load_experiment,
)

NOT_HERE = "not on this host: "
SECONDS_PER = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


@dataclass(frozen=True)
class PrintedValue:
    """One row of a claim's published layer, as plain data (the CLI reads it with ``analysis.published``)."""

    ref: str  # <table>/<row id>: how an experiment's answer names it
    quote_id: str  # <claim>/<table>/<row id>: how verdicts cite it
    as_printed: str  # the source's own words for it ('' for a row the source states without a number)
    qualifier: str  # about, more than, up to ... ('' when none)
    value: float | None
    unit: str
    context: dict = field(default_factory=dict)  # the row's other columns: the system, HZ, kernel, statistic ...


@dataclass(frozen=True)
class AnswerContext:
    """What the answer needs beyond the bundles, as plain data."""

    claim: str
    source: str  # the source document, in words ("seed 004")
    printed: dict = field(default_factory=dict)  # ref -> PrintedValue: every row of the claim's published layer
    goals: tuple = ()  # the claim's comparisons (stopping.PrecisionGoal), all of them
    notebook: str | None = None  # the claim's notebook as `ticklab report --only` names it
    data_dir: Path | None = None  # where the bundles went (capture --out)
    pass_out: bool = False  # the commands printed pass --out on (it was not the default)
    published_dir: Path | None = None  # passed on to the report when it was not the default
    # what this host lacks to run an experiment (doctor's words), None when it runs here; None: not checked
    missing_here: Callable[[Experiment], str | None] | None = None


def check_refs(experiment: Experiment, context: AnswerContext) -> None:
    """Every published row the experiment's answer names exists, and a cost_at_rate's cost is a time; else one
    ExperimentError naming the file and the key."""

    def row(ref: str, where: str) -> PrintedValue:
        if ref not in context.printed:
            raise ExperimentError(
                f"{experiment.path}: {where}: {ref!r} is no row of the published layer of "
                f"{context.claim} (<table>/<row id>, traces/published/{context.claim}/)"
            )
        return context.printed[ref]

    for index, entry in enumerate(experiment.answer):
        for number, ref in enumerate(entry.get("printed") or []):
            row(ref, f"answer[{index}].printed[{number}]")
        if "cost_at_rate" in entry:
            cost = row(entry["cost_at_rate"]["cost"], f"answer[{index}].cost_at_rate.cost")
            if cost.value is None or cost.unit not in SECONDS_PER:
                raise ExperimentError(
                    f"{experiment.path}: answer[{index}].cost_at_rate.cost: {cost.quote_id} is "
                    f"{cost.value} {cost.unit!r}, not a time (one of {', '.join(SECONDS_PER)})"
                )


def figure(value: float) -> str:
    """Three significant digits, never an exponent: 5.73, 0.164, 249, 17,800."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    decimals = 2 - math.floor(math.log10(abs(value)))
    if decimals <= 0:
        return f"{round(value, decimals):,.0f}"
    return f"{value:.{decimals}f}"


def answer_lines(bundles: list[Path], context: AnswerContext) -> list[str]:
    """The answer of one capture: its sealed ``bundles`` read back, then what it did not test, then the report."""
    loaded = [load_bundle(path) for path in bundles]
    lines = []
    for bundle in loaded:
        lines += _bundle_lines(bundle, context)
    lines += _untested_lines(loaded, context)
    if context.notebook and context.data_dir is not None:
        host_id = loaded[0].manifest.host_id if loaded else "this-host"
        out = report_out(context.data_dir, host_id)
        words = [
            "ticklab",
            "report",
            "--data-dir",
            str(context.data_dir),
            "--out",
            str(out),
            "--only",
            context.notebook,
        ]
        if context.published_dir is not None:
            words += ["--published-dir", str(context.published_dir)]
        lines.append(f"  verdicts: {shlex.join(words)}")
    return lines


def report_out(data_dir: Path, host_id: str) -> Path:
    """Where the suggested report goes: beside the data (``<data-dir>/report``, ``ticklab report``'s own default for a
    --data-dir), or ``build/<host-id>`` when the data is the project's traces/, whose report is build/ itself."""
    if Path(data_dir).resolve() in {(repo_root() / "traces").resolve(), (work_dir() / "traces").resolve()}:
        return work_dir() / "build" / host_id
    return Path(data_dir) / "report"


def _bundle_lines(bundle: Bundle, context: AnswerContext) -> list[str]:
    manifest = bundle.manifest
    head = (
        f"{manifest.claim}/{manifest.experiment} on this host ({manifest.host_id}): what "
        f"{context.source} names, read back from {bundle.path}"
    )
    if manifest.not_testable:
        return [head, f"  not testable on this host, so no runs: {manifest.not_testable}"]
    results = measured_results(manifest, bundle.results)
    measured = manifest.measured_runs()
    if not measured:
        return [head, "  no measured run finished ok: see the lines above and the manifest's runs"]
    entries = manifest.definition.get("answer") or []
    lines = [head]
    if not entries:
        metrics = sorted(results["metric"].unique())
        lines.append(
            f"  {manifest.experiment} names no headline quantity (no answer section); it recorded "
            f"{len(measured)} measured run(s) of {len({r.condition for r in measured})} condition(s) with "
            f"{len(metrics)} metric(s) in results.csv: {', '.join(metrics[:12])}"
            f"{' …' if len(metrics) > 12 else ''}"
        )
        return lines
    values_of = manifest.conditions_by_name
    order = list(values_of)
    conditions = sorted({r.condition for r in measured}, key=lambda c: order.index(c) if c in order else len(order))
    for condition in conditions:
        runs = [r for r in measured if r.condition == condition]
        lines.append(f"  {condition}, {len(runs)} measured run{'s' if len(runs) != 1 else ''}:")
        mine = results[results["condition"] == condition]
        for entry in entries:
            lines += _quantity_lines(entry, mine, values_of.get(condition, {}), context)
    unprinted = [entry["says"] for entry in entries if not entry.get("printed") and "cost_at_rate" not in entry]
    if unprinted:
        lines.append(f"  {context.source} prints no number for: {'; '.join(unprinted)}")
    return lines


def _quantity_lines(entry: dict, results, condition_values: dict, context: AnswerContext) -> list[str]:
    chosen = results[results["metric"] == entry["metric"]]
    scale = 100 if entry.get("percent") else 1
    values = sorted(float(v) * scale for v in chosen["value"])
    if not values:
        return [f"    {entry['says']}: not recorded in these runs (no {entry['metric']} in results.csv)"]
    unit = "%" if entry.get("percent") else str(chosen["unit"].iloc[0])
    middle = _median(values)
    lines = [
        f"    {entry['says']}: median {figure(middle)} {unit} (runs {figure(values[0])}–{figure(values[-1])}, "
        f"n={len(values)}; {entry['metric']})"
    ]
    for ref in entry.get("printed") or []:
        row = context.printed[ref]
        if _other_condition(row, condition_values):
            continue
        lines.append(f"      {_printed_words(row)}")
    if "cost_at_rate" in entry:
        lines.append(f"      {_cost_at_rate(entry, results, context)}")
    return lines


def _median(values: list[float]) -> float:
    middle = len(values) // 2
    return values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2


def _other_condition(row: PrintedValue, condition_values: dict) -> bool:
    """A printed row that names a condition variable's value (hrtick: on) belongs to that condition only."""
    return any(
        key in condition_values and str(condition_values[key]) != str(value) for key, value in row.context.items()
    )


def _printed_words(row: PrintedValue) -> str:
    where = ", ".join(f"{key} {value}" for key, value in row.context.items())
    number = " ".join(w for w in (row.qualifier, "" if row.value is None else f"{row.value:g}", row.unit) if w)
    if not row.as_printed:
        return f"transcribed, not printed as a number: {number or '(no number)'} ({where}; {row.quote_id})"
    return f'printed in the source: "{row.as_printed}"{" = " + number if number else ""} ({where}; {row.quote_id})'


def _cost_at_rate(entry: dict, results, context: AnswerContext) -> str:
    spec = entry["cost_at_rate"]
    cost = context.printed[spec["cost"]]
    rates = sorted(float(v) for v in results.loc[results["metric"] == spec["rate"], "value"])
    if not rates:
        return f"derived: not computable here (no {spec['rate']} in these runs to take {cost.quote_id} at)"
    rate = _median(rates)
    share = cost.value * SECONDS_PER[cost.unit] * rate * (100 if entry.get("percent") else 1)
    unit = " %" if entry.get("percent") else ""
    return (
        f"derived (not printed): {figure(share)}{unit} = the printed {cost.value:g} {cost.unit} ({cost.quote_id}) "
        f"× this host's {figure(rate)}/s ({spec['rate']}, median of these runs)"
    )


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(repo_root()))
    except ValueError:
        return str(path)


def _condition_names(experiment: Experiment, facts: dict) -> set[str]:
    """The experiment's condition names: a list's as written; a matrix's as this host's facts expand it."""
    spec = experiment.conditions
    if isinstance(spec, list):
        return {str(item["name"]) for item in spec if isinstance(item, dict) and "name" in item}
    try:
        return {c.name for c in expand_conditions(experiment, facts)}
    except ExperimentError:
        return set()


def _claim_experiments(claim: str) -> list[Experiment]:
    found = []
    for path in [*experiment_paths(claim), *boot_experiment_paths(claim)]:
        try:
            found.append(load_experiment(path))
        except ExperimentError:
            continue  # a broken file is its own command's error, not the answer's
    return found


def _command(experiment: Experiment, claim_experiments: list[Experiment], context: AnswerContext) -> str:
    """The one command that runs ``experiment``, with what it is."""
    out = ["--out", str(context.data_dir)] if context.pass_out and context.data_dir is not None else []
    if experiment.lab is not None:
        kind, words, what = "lab", ["ticklab", "lab", "run", context.claim], "QEMU guests"
    elif is_boot_experiment(experiment):
        kind, words, what = (
            "boot",
            ["ticklab", "capture", context.claim, "--boot", "kexec"],
            "one boot of this host per run",
        )
    else:
        kind, words, what = "host", ["ticklab", "capture", context.claim], "this host"
    lacks = context.missing_here(experiment) if context.missing_here is not None else None
    same_kind = [
        e
        for e in claim_experiments
        if ("lab" if e.lab is not None else "boot" if is_boot_experiment(e) else "host") == kind
    ]
    # --boot without --experiment runs the claim's default boot experiment
    default = default_boot_experiment(same_kind) if kind == "boot" else None
    if len(same_kind) > 1 and (default is None or default.path != experiment.path):
        words += ["--experiment", _shown(experiment.path)]
    if lacks:
        return (
            f"{NOT_HERE}{shlex.join(words)} cannot run here ({lacks}; 'ticklab doctor' says more): "
            f"{_shown(experiment.path)} on a host that has it"
        )
    return f"{shlex.join(words + out)}   ({what}: {_shown(experiment.path)})"


def _untested_lines(bundles: list[Bundle], context: AnswerContext) -> list[str]:
    """The claim's comparisons this capture did not measure both conditions of, under the command that would."""
    if not context.goals:
        return []
    measured: dict[str, set[str]] = {}  # condition -> experiments that measured it
    captured, not_testable = {}, {}
    for bundle in bundles:
        name = bundle.manifest.experiment
        captured[name] = bundle
        if bundle.manifest.not_testable:
            not_testable[name] = bundle.manifest.not_testable
        for record in bundle.manifest.measured_runs():
            measured.setdefault(record.condition, set()).add(name)
    facts = (bundles[0].manifest.host or {}) if bundles else {}  # a matrix's names as this host has them
    claim_experiments = _claim_experiments(context.claim)
    tested: list[str] = []
    by_command: dict[tuple[str, ...], list[str]] = {}
    for goal in context.goals:
        both = measured.get(goal.treatment, set()) & measured.get(goal.baseline, set())
        if goal.experiments:
            both &= set(goal.experiments)
        if both:
            tested.append(goal.comparison)
            continue
        commands = []
        for experiment in claim_experiments:
            if goal.experiments and experiment.name not in goal.experiments:
                continue
            if not {goal.treatment, goal.baseline} <= _condition_names(experiment, facts):
                continue
            if experiment.name in captured:
                why = (
                    "not testable here, as said above"
                    if experiment.name in not_testable
                    else "its runs here did not measure both"
                )
                commands.append(
                    f"a host where {_shown(experiment.path)} runs both conditions ({why}; "
                    f"'ticklab doctor' says what each experiment needs)"
                )
            else:
                commands.append(_command(experiment, claim_experiments, context))
        commands.sort(key=lambda command: command.startswith(NOT_HERE))  # a command that runs here first
        key = tuple(commands) or ("no experiment of the claim has both conditions",)
        by_command.setdefault(key, []).append(goal.comparison)
    lines = []
    if tested:
        lines.append("  tested by this capture (the report gives the verdict):")
        lines += [f"    {comparison}" for comparison in dict.fromkeys(tested)]
    if by_command:
        lines.append(
            "  not tested by this capture: the claim's comparisons whose two conditions it did not measure, "
            "under the command that would"
        )
        for alternatives, comparisons in by_command.items():
            lines.append(f"    {alternatives[0]}")
            lines += [f"    or: {command}" for command in alternatives[1:]]
            lines += [f"      {comparison}" for comparison in dict.fromkeys(comparisons)]
    return lines
