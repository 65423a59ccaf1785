"""Condition checks: did a run's condition take effect (the clocksource was hpet, HRTICK was on, nohz_full
stopped the tick)? A check is not a verdict: it says whether a run may be used for one. Checks are
declared by each claim as data; each applies to the conditions its patterns match, is evaluated per run
from what the bundle recorded, and a run whose check failed is left out of every verdict.

A fact the bundle did not record (an older bundle, a host run without a guest section) is reported as
"not recorded" and does not gate: the table says which runs went unchecked.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from typing import Mapping

import pandas as pd

CHECK_COLUMNS = ["claim", "setup", "bundle", "condition", "check", "expected", "observed", "runs", "passed", "failed",
                 "not_recorded", "status"]
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
            matches = [i for i in items or [] if isinstance(i, Mapping) and str(i.get(selector["field"])) == selector["value"]]
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
    path: str                           # dotted path into the run record (see ``fact``)
    expected: Mapping[str, object]      # condition pattern (fnmatch) -> expected value; first match wins
    contains: bool = False

    def evaluate(self, record: Mapping, results: pd.DataFrame):
        """(expected, observed, passed) for a run this check applies to, else None; passed is None when unrecorded."""
        wanted = _expected_for(record.get("condition", ""), self.expected)
        if wanted is MISSING:
            return None
        seen = fact(record, self.path)
        if seen is MISSING:
            return str(wanted), "not recorded", None
        passed = str(wanted) in str(seen) if self.contains else str(seen) == str(wanted)
        return (f"contains {wanted}" if self.contains else str(wanted)), str(seen), passed


@dataclass(frozen=True)
class MetricCheck:
    """A run's metric stays at or below a share of a recorded fact (e.g. timer interrupts/s ≤ 10% of HZ)."""
    name: str
    metric: str
    conditions: tuple[str, ...]         # condition patterns it applies to
    at_most: float                      # share of ``of``
    of: str                             # dotted path of the fact it is a share of

    def evaluate(self, record: Mapping, results: pd.DataFrame):
        if not any(fnmatch.fnmatchcase(record.get("condition", ""), p) for p in self.conditions):
            return None
        reference = fact(record, self.of)
        values = results.loc[results["metric"] == self.metric, "value"]
        bound = f"≤ {self.at_most:g} × {self.of}"
        if reference is MISSING or values.empty:
            return bound, "not recorded", None
        limit = self.at_most * float(reference)
        value = float(values.iloc[0])
        return f"{bound} = {limit:g}", f"{value:.4g}", value <= limit


@dataclass(frozen=True)
class MetricBound:
    """A run's metric stays at or below a fixed bound (e.g. no kick-aheads where kick-ahead is off)."""
    name: str
    metric: str
    conditions: tuple[str, ...]         # condition patterns it applies to
    at_most: float

    def evaluate(self, record: Mapping, results: pd.DataFrame):
        if not any(fnmatch.fnmatchcase(record.get("condition", ""), p) for p in self.conditions):
            return None
        values = results.loc[results["metric"] == self.metric, "value"]
        bound = f"{self.metric} ≤ {self.at_most:g}"
        if values.empty:
            return bound, "not recorded", None
        value = float(values.iloc[0])
        return bound, f"{value:.4g}", value <= self.at_most


def run_checks(claim: str, checks, bundles) -> pd.DataFrame:
    """One row per bundle, run and applicable check: setup, bundle, run, condition, check, expected, observed, passed."""
    from ..bundle import BundleError

    rows = []
    for ref in bundles:
        try:
            bundle = ref.load()
        except BundleError:
            continue
        if bundle.manifest.get("not_testable"):
            continue
        by_run = dict(tuple(bundle.results.groupby("run"))) if not bundle.results.empty else {}
        for record in bundle.manifest["runs"]:
            if record.get("warmup"):
                continue
            results = by_run.get(record["run"], pd.DataFrame(columns=["metric", "value"]))
            for check in checks:
                outcome = check.evaluate(record, results)
                if outcome is None:
                    continue
                expected, observed, passed = outcome
                rows.append({"claim": claim, "setup": ref.host_id, "bundle": str(ref.path), "run": record["run"],
                             "condition": record.get("condition", ""), "check": check.name, "expected": expected,
                             "observed": observed, "passed": passed})
    return pd.DataFrame(rows, columns=["claim", "setup", "bundle", "run", "condition", "check", "expected", "observed",
                                       "passed"])


def failed_runs(per_run: pd.DataFrame) -> set[tuple[str, str]]:
    """(bundle, run) of every run a check failed for."""
    failed = per_run[per_run["passed"].eq(False)]
    return set(zip(failed["bundle"], failed["run"]))


def check_table(per_run: pd.DataFrame) -> pd.DataFrame:
    """Per setup, bundle, condition and check: how many runs passed, failed or went unrecorded, and what was seen."""
    rows = []
    for (claim, setup, bundle, condition, check), group in per_run.groupby(
            ["claim", "setup", "bundle", "condition", "check"], sort=True):
        passed, failed = int(group["passed"].eq(True).sum()), int(group["passed"].eq(False).sum())
        unrecorded = int(group["passed"].isna().sum())
        status = (f"FAILED in {failed} of {len(group)} runs (left out of the verdicts)" if failed
                  else "not recorded" if unrecorded == len(group)
                  else "passed" + (f" ({unrecorded} runs not recorded)" if unrecorded else ""))
        rows.append({"claim": claim, "setup": setup, "bundle": bundle.rsplit("/", 1)[-1], "condition": condition,
                     "check": check, "expected": "; ".join(dict.fromkeys(group["expected"])),
                     "observed": "; ".join(dict.fromkeys(group["observed"])), "runs": len(group), "passed": passed,
                     "failed": failed, "not_recorded": unrecorded, "status": status})
    return pd.DataFrame(rows, columns=CHECK_COLUMNS)
