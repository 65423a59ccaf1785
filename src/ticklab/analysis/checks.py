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
    """A run's metric stays at or below a fixed bound (e.g. no kick-aheads where kick-ahead is off)."""

    name: str
    metric: str
    conditions: tuple[str, ...]  # condition patterns it applies to
    at_most: float

    def evaluate(self, record: Mapping, results: pd.DataFrame, raw: Path | None = None):
        if not any(fnmatch.fnmatchcase(record.get("condition", ""), p) for p in self.conditions):
            return None
        values = results.loc[results["metric"] == self.metric, "value"]
        bound = f"{self.metric} ≤ {self.at_most:g}"
        if values.empty:
            return bound, f"not recorded: the run has no {self.metric}", None
        value = float(values.iloc[0])
        return bound, f"{value:.4g}", value <= self.at_most


def run_checks(claim: str, checks, bundles) -> pd.DataFrame:
    """One row per bundle, run and applicable check: setup, bundle, run, condition, check, expected, observed, passed
    (None where the check could not be computed: the run is unchecked)."""
    from ..bundle import BundleError

    rows = []
    for ref in bundles:
        try:
            bundle = ref.load()
        except BundleError:
            continue
        if bundle.manifest.not_testable:
            continue
        by_run = dict(tuple(bundle.results.groupby("run"))) if not bundle.results.empty else {}
        for record in bundle.manifest.runs:
            if record.warmup or record.status != "ok":
                continue  # failed runs are left out as failed, not as unchecked
            results = by_run.get(record.run, pd.DataFrame(columns=["metric", "value"]))
            seen = {**record.to_json(), BUNDLE_HOST: bundle.manifest.host or {}}
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
