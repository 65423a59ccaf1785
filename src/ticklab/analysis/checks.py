"""Condition checks: did a run's condition take effect (the clocksource was hpet, HRTICK was on, nohz_full
stopped the tick)? A check is not a verdict: it says whether a run may be used for one. Checks are
declared by each claim as data; each applies to the conditions its patterns match, is evaluated per run
from what the bundle recorded, and a run whose check failed is left out of every verdict.

A check that cannot be computed for a run (a fact the bundle did not record, a file it lacks) makes the run
"unchecked": it is left out of every verdict too, and checks.csv says why. A run counts only if every check that
applies to its condition was computed and passed (issue 44).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

CHECK_COLUMNS = [
    "claim",
    "setup",
    "bundle",
    "condition",
    "check",
    "expected",
    "observed",
    "runs",
    "passed",
    "failed",
    "not_recorded",
    "status",
    "left_out",
]
_SELECTOR = re.compile(r"^(?P<key>[^\[]+)\[(?P<field>[^=\]]+)=(?P<value>[^\]]*)\]$")
MISSING = object()


def fact(record: Mapping, path: str):
    """A value from a run record by dotted path; ``key[field=value]`` picks the list item whose field has that
    value (``knobs[feature=HRTICK].during``). MISSING when any step is absent."""
    value = record
    for step in path.split("."):
        selector = _SELECTOR.match(step)
        if selector:
            items = value.get(selector["key"]) if isinstance(value, Mapping) else None
            matches = [
                i for i in items or [] if isinstance(i, Mapping) and str(i.get(selector["field"])) == selector["value"]
            ]
            if not matches:
                return MISSING
            value = matches[0]
        elif isinstance(value, Mapping) and step in value:
            value = value[step]
        else:
            return MISSING
    return value


def _expected_for(condition: str, expected: Mapping[str, object]):
    for pattern, value in expected.items():
        if fnmatch.fnmatchcase(condition, pattern):
            return value
    return MISSING


@dataclass(frozen=True)
class FactCheck:
    """A recorded fact of the run equals (or, with ``contains``, includes) the value its condition expects."""

    name: str
    path: str  # dotted path into the run record (see ``fact``); a|b: the first recorded
    expected: Mapping[str, object]  # condition pattern (fnmatch) -> expected value; first match wins
    contains: bool = False
    starts_with: bool = False  # the recorded value begins with the expected one (a kernel series: "6.12.")

    def evaluate(self, record: Mapping, results: pd.DataFrame, raw: Path | None = None):
        """(expected, observed, passed) for a run this check applies to, else None; passed is None when unrecorded."""
        wanted = _expected_for(record.get("condition", ""), self.expected)
        if wanted is MISSING:
            return None
        seen = next(
            (found for found in (fact(record, p) for p in self.path.split("|")) if found is not MISSING), MISSING
        )
        if seen is MISSING:
            return str(wanted), f"not recorded: no {self.path} for this run", None
        if self.starts_with:
            return f"starts with {wanted}", str(seen), str(seen).startswith(str(wanted))
        passed = str(wanted) in str(seen) if self.contains else str(seen) == str(wanted)
        return (f"contains {wanted}" if self.contains else str(wanted)), str(seen), passed


BUNDLE_HOST = "_bundle_host"  # run_checks adds the bundle's host facts to each record under this key
BUNDLE_DEFINITION = "_bundle_definition"  # and the experiment as the bundle loaded it


def run_hz(record: Mapping):
    """The HZ the run's kernel ran at, from what the run recorded: a lab guest's own (``guest.hz``); a boot plan's
    booted kernel (``boot.hz``, its CONFIG_HZ read at the run); else the bundle's host facts (CONFIG_HZ of the kernel
    the capture ran on), where the run booted no other kernel. MISSING when none applies."""
    for path in ("guest.hz", "boot.hz"):
        value = fact(record, path)
        if value is not MISSING and value is not None:
            return value
    host = record.get(BUNDLE_HOST) or {}
    booted = fact(record, "boot.release")
    if booted is not MISSING and booted != host.get("kernel_release"):
        return MISSING  # a kernel other than the one the facts describe, and its HZ not recorded
    value = fact(host, "kernel_config.hz")
    return MISSING if value is MISSING or value is None else value


RUN_HZ = "the run's HZ"  # MetricCheck.of: run_hz


def _metric_value(results: pd.DataFrame, metrics: tuple[str, ...]):
    for metric in metrics:
        values = results.loc[results["metric"] == metric, "value"]
        if not values.empty:
            return metric, float(values.iloc[0])
    return None, None


@dataclass(frozen=True)
class MetricCheck:
    """A run's metric stays at or below (or, with ``at_least``, at or above) a share of a recorded fact (e.g. timer
    interrupts/s ≤ 10% of HZ). ``metric`` may name alternatives, the first the run has is used; ``of`` is a dotted
    path into the run record, or RUN_HZ for the HZ the run's kernel ran at (run_hz)."""

    name: str
    metric: str | tuple[str, ...]
    conditions: tuple[str, ...]  # condition patterns it applies to
    at_most: float  # share of ``of``
    of: str  # dotted path of the fact it is a share of, or RUN_HZ
    at_least: bool = False

    def evaluate(self, record: Mapping, results: pd.DataFrame, raw: Path | None = None):
        if not any(fnmatch.fnmatchcase(record.get("condition", ""), p) for p in self.conditions):
            return None
        reference = run_hz(record) if self.of == RUN_HZ else fact(record, self.of)
        metrics = (self.metric,) if isinstance(self.metric, str) else tuple(self.metric)
        metric, value = _metric_value(results, metrics)
        bound = f"{'≥' if self.at_least else '≤'} {self.at_most:g} × {self.of}"
        if reference is MISSING:
            return bound, f"not recorded: no {self.of} for this run", None
        if metric is None:
            return bound, f"not recorded: the run has no {' or '.join(metrics)}", None
        limit = self.at_most * float(reference)
        return (f"{bound} = {limit:g}", f"{value:.4g}", value >= limit if self.at_least else value <= limit)


@dataclass(frozen=True)
class RawCheck:
    """A property of the run's own raw files (its workload's output): ``observe`` reads it from the run's raw
    directory (None, or an OSError/ValueError, where it cannot) and ``accept`` says whether it passes; ``expected``
    is what checks.csv shows as wanted."""

    name: str
    conditions: tuple[str, ...]
    expected: str
    observe: Callable[[Path], object]
    accept: Callable[[object], bool]
    shown: Callable[[object], str] = str

    def evaluate(self, record: Mapping, results: pd.DataFrame, raw: Path | None = None):
        if not any(fnmatch.fnmatchcase(record.get("condition", ""), p) for p in self.conditions):
            return None
        if raw is None:
            return self.expected, "not recorded: no raw directory", None
        try:
            seen = self.observe(raw)
        except (OSError, ValueError) as exc:
            return self.expected, f"not recorded: {str(exc)[:200]}", None
        if seen is None:
            return self.expected, "not recorded", None
        return self.expected, self.shown(seen), bool(self.accept(seen))


@dataclass(frozen=True)
class MetricBound:
    """A run's metric stays within a fixed bound: at most (no kick-aheads where kick-ahead is off) or, with
    ``at_least``, at least (the path under test ran: kick-ahead acted in a build where it is on)."""

    name: str
    metric: str
    conditions: tuple[str, ...]  # condition patterns it applies to
    bound: float
    at_least: bool = False

    def evaluate(self, record: Mapping, results: pd.DataFrame, raw: Path | None = None):
        if not any(fnmatch.fnmatchcase(record.get("condition", ""), p) for p in self.conditions):
            return None
        values = results.loc[results["metric"] == self.metric, "value"]
        shown = f"{self.metric} {'≥' if self.at_least else '≤'} {self.bound:g}"
        if values.empty:
            return shown, f"not recorded: the run has no {self.metric}", None
        value = float(values.iloc[0])
        return shown, f"{value:.4g}", value >= self.bound if self.at_least else value <= self.bound


# -- whether a run ran as intended: checked for every claim, whatever its own checks (issue 52) ---------------------
TICK_ON_SHARE = 0.5  # declared: a tick-on run's CPU took at least half of HZ's ticks a second, else it was starved


@dataclass(frozen=True)
class NotBusyCheck:
    """The run's interference record (capture/interference.py) does not flag it busy: neither this machine's view
    nor, for a lab run, the guest's own. A run captured before ticklab recorded interference is not checked (no
    row): nothing says it was busy."""

    name: str = "the machine was not busy during the run (interference record)"

    def evaluate(self, record: Mapping, results: pd.DataFrame, raw: Path | None = None):
        lab = isinstance(record.get("guest_interference"), Mapping)
        views = [
            (label, record.get(key))
            for label, key in (
                ("the physical host" if lab else "the host", "interference"),
                ("the guest", "guest_interference"),
            )
        ]
        views = [(label, view) for label, view in views if isinstance(view, Mapping) and "busy" in view]
        if not views:
            return None
        busy = [f"{label} busy: {view.get('why') or 'flagged busy'}" for label, view in views if view.get("busy")]
        return "not busy", "; ".join(busy) if busy else "not busy", not busy


def _metric_sets(record: Mapping, results: pd.DataFrame) -> list[str]:
    """The trace metric sets the run's experiment named; for bundles that said only ``metrics: true`` (before the
    sets had names), the set whose metrics the run has."""
    metrics = ((record.get(BUNDLE_DEFINITION) or {}).get("trace") or {}).get("metrics") or []
    if isinstance(metrics, str):
        return [metrics]
    if isinstance(metrics, list):
        return [str(m) for m in metrics]
    have = set(results["metric"]) if "metric" in results else set()
    return ["hrtimer"] if "hrtimer_start_rate_hz" in have else ["tick"] if "local_timer_irq_rate_hz" in have else []


def _booted_cmdline(record: Mapping) -> str:
    for path in ("guest.cmdline", "boot.cmdline"):
        value = fact(record, path)
        if value is not MISSING and value:
            return str(value)
    return str((record.get(BUNDLE_HOST) or {}).get("cmdline") or "")


def _run_cpus(record: Mapping):
    for path in ("guest.nproc", "boot.nproc"):
        value = fact(record, path)
        if value is not MISSING and value:
            return int(value)
    value = (record.get(BUNDLE_HOST) or {}).get("nproc")
    return int(value) if value else None


@dataclass(frozen=True)
class TickRateCheck:
    """A tick-on run (no ``nohz_full=`` on its kernel's command line) of an experiment that traces the tick ticked at
    ≥ TICK_ON_SHARE × HZ per CPU: below that its CPU was not running (a starved vCPU), whatever the condition. The
    tick metric set gives the measured CPU's own rate (``tick_rate_hz``, else its local timer interrupts); the
    hrtimer set counts every CPU's local timer interrupts, so its rate is divided by the run's CPUs (an upper bound
    on the tick: the other timer interrupts are counted too)."""

    name: str = f"the tick ran (local timer interrupts ≥ {TICK_ON_SHARE:g} × HZ a second per CPU: not starved)"

    def evaluate(self, record: Mapping, results: pd.DataFrame, raw: Path | None = None):
        sets = _metric_sets(record, results)
        if "nohz_full=" in _booted_cmdline(record):
            return None
        if "tick" in sets:
            metric, value = _metric_value(results, ("tick_rate_hz", "local_timer_irq_rate_hz"))
            cpus, scope = 1, "on the measured CPU"
        elif "hrtimer" in sets:
            metric, value = _metric_value(results, ("local_timer_irq_rate_hz",))
            cpus, scope = _run_cpus(record), "per CPU (all CPUs' local timer interrupts / CPUs)"
        else:
            return None
        hz = run_hz(record)
        bound = f"≥ {TICK_ON_SHARE:g} × HZ {scope}"
        if hz is MISSING:
            return bound, "not recorded: the run's HZ", None
        if metric is None or not cpus:
            return bound, "not recorded: the run has no local timer interrupt rate", None
        per_cpu = value / cpus
        limit = TICK_ON_SHARE * float(hz)
        return f"{bound} = {limit:g}/s", f"{per_cpu:.4g}/s at HZ={hz}", per_cpu >= limit


def assumed_clocksource(definition: Mapping) -> str | None:
    """The clocksource an experiment assumes (its ``assumes.clocksource``): a run on another one measured another
    machine. None where the experiment's condition is the clocksource itself (hpet) or it declares none."""
    value = (definition.get("assumes") or {}).get("clocksource") if isinstance(definition, Mapping) else None
    return str(value) if value else None


ASSUMED_LATER = "_assumes_declared_later"  # where a bundle's definition predates ``assumes``, the file that declares it


def with_assumptions(claim: str, experiment: str, definition: Mapping) -> dict:
    """The bundle's experiment definition; where it was sealed before experiments declared ``assumes`` (2026-11-29),
    with the ``assumes`` of the experiment of that name in runners/<claim>/ as it is now (said in checks.csv), so that
    an older bundle's runs are held to what the experiment is known to assume."""
    found = dict(definition)
    claim = claim if isinstance(claim, str) else str(getattr(claim, "id", ""))
    if "assumes" in found or not claim or not experiment:
        return found
    try:
        from ..paths import ProjectError, repo_root
        from ..safefiles import read_text
        from ..yamlsafe import load

        path = repo_root() / "runners" / claim / f"{experiment}.yaml"
        declared = load(read_text(path, limit=1 << 20)) if path.is_file() else None
    except (OSError, ValueError, ProjectError):
        return found
    if isinstance(declared, Mapping) and isinstance(declared.get("assumes"), Mapping):
        found["assumes"] = dict(declared["assumes"])
        found[ASSUMED_LATER] = f"runners/{claim}/{experiment}.yaml"
    return found


@dataclass(frozen=True)
class ClocksourceCheck:
    """The run's clocksource is the one its experiment assumes (``assumes.clocksource``): a lab guest's own, else the
    booted kernel's at a boot plan's run, else the host's when the bundle was opened."""

    name: str = "the clocksource the experiment assumes"

    def evaluate(self, record: Mapping, results: pd.DataFrame, raw: Path | None = None):
        definition = record.get(BUNDLE_DEFINITION) or {}
        wanted = assumed_clocksource(definition)
        if wanted is None:
            return None
        later = definition.get(ASSUMED_LATER)
        shown = f"{wanted} (as {later} assumes; the bundle predates the declaration)" if later else wanted
        seen = next(
            (
                v
                for v in (fact(record, p) for p in ("guest.clocksource", "boot.clocksource"))
                if v not in (MISSING, None)
            ),
            ((record.get(BUNDLE_HOST) or {}).get("clocksources") or {}).get("current"),
        )
        if not seen:
            # a bundle that declared the assumption had its clocksource to record; an older one may not have
            return None if later else (shown, "not recorded: the run's clocksource", None)
        return shown, str(seen), str(seen) == wanted


VALIDITY_CHECKS = (NotBusyCheck(), TickRateCheck(), ClocksourceCheck())


def run_checks(claim: str, checks, bundles) -> pd.DataFrame:
    """One row per bundle, run and applicable check: setup, bundle, run, condition, check, expected, observed, passed
    (None where the check could not be computed: the run is unchecked). The run-validity checks (VALIDITY_CHECKS:
    not busy, not starved, the assumed clocksource) come first, for every claim."""
    from ..bundle import BundleError

    checks = (*VALIDITY_CHECKS, *checks)
    rows = []
    for ref in bundles:
        try:
            bundle = ref.load()
        except BundleError:
            continue
        if bundle.manifest.not_testable:
            continue
        by_run = dict(tuple(bundle.results.groupby("run"))) if not bundle.results.empty else {}
        definition = with_assumptions(claim, bundle.manifest.experiment, bundle.manifest.definition or {})
        for record in bundle.manifest.runs:
            if record.warmup or record.status != "ok":
                continue  # failed runs are left out as failed, not as unchecked
            results = by_run.get(record.run, pd.DataFrame(columns=["metric", "value"]))
            seen = {
                **record.to_json(),
                BUNDLE_HOST: bundle.manifest.host or {},
                BUNDLE_DEFINITION: definition,
            }
            raw = ref.path / "raw" / record.run
            for check in checks:
                outcome = check.evaluate(seen, results, raw)
                if outcome is None:
                    continue
                expected, observed, passed = outcome
                rows.append(
                    {
                        "claim": claim,
                        "setup": ref.host_id,
                        "bundle": str(ref.path),
                        "run": record.run,
                        "condition": record.condition,
                        "check": check.name,
                        "expected": expected,
                        "observed": observed,
                        "passed": passed,
                    }
                )
    return pd.DataFrame(
        rows, columns=["claim", "setup", "bundle", "run", "condition", "check", "expected", "observed", "passed"]
    )


def excluded_runs(per_run: pd.DataFrame) -> dict[tuple[str, str], list[tuple[str, str, str]]]:
    """(bundle, run) → [(check, "failed" or "unchecked", what was observed)], for every run a check failed for or
    could not be computed for: none of them may enter a verdict."""
    out: dict[tuple[str, str], list[tuple[str, str, str]]] = {}
    for row in per_run.itertuples():
        if row.passed is True:
            continue
        out.setdefault((row.bundle, row.run), []).append(
            (row.check, "failed" if row.passed is False else "unchecked", str(row.observed))
        )
    return out


def check_table(per_run: pd.DataFrame) -> pd.DataFrame:
    """Per setup, bundle, condition and check: how many runs passed, failed or went unchecked, and what was seen."""
    rows = []
    for (claim, setup, bundle, condition, check), group in per_run.groupby(
        ["claim", "setup", "bundle", "condition", "check"], sort=True
    ):
        passed, failed = int(group["passed"].eq(True).sum()), int(group["passed"].eq(False).sum())
        unrecorded = int(group["passed"].isna().sum())
        left_out = failed + unrecorded
        parts = ([f"FAILED in {failed}"] if failed else []) + ([f"unchecked in {unrecorded}"] if unrecorded else [])
        status = f"{' and '.join(parts)} of {len(group)} runs (left out of the verdicts)" if left_out else "passed"
        rows.append(
            {
                "claim": claim,
                "setup": setup,
                "bundle": bundle.rsplit("/", 1)[-1],
                "condition": condition,
                "check": check,
                "expected": "; ".join(dict.fromkeys(group["expected"])),
                "observed": "; ".join(dict.fromkeys(group["observed"])),
                "runs": len(group),
                "passed": passed,
                "failed": failed,
                "not_recorded": unrecorded,
                "status": status,
                # each run this check left out of the verdicts, by name
                "left_out": " ".join(sorted(group.loc[group["passed"].ne(True), "run"])),
            }
        )
    return pd.DataFrame(rows, columns=CHECK_COLUMNS)
