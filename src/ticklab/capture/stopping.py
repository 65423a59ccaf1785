"""When a capture stops: the precision rule, or the experiment's budget.

After the experiment's initial runs, each comparison of the claim whose two conditions this experiment
measures is checked the way the verdict will judge it (``stats.ratio_interval``: for medians the exact
Mann-Whitney inversion CI, at the simultaneous level over the comparisons checked here, as the verdict's family
on one setup is). The precision target of a comparison is the CI half-width, on the log scale, that lets the
verdict's words decide (``Margins.precision_log``): no wider than half the consistent-size band for a ratio
target, so the CI can lie inside the band ("reproduced") or clear of it ("smaller"/"larger than the target");
the no-effect margin for a direction target. While some comparison
is short of it, another round adds one run of *every* condition of the experiment (a block, in a seeded
random order), until all meet the target, the time budget would be passed by the next round, or a
condition has had ``max_runs`` runs. The decision and every check go into the manifest (``stopping``),
and the verdicts say which ended the capture.

The rule looks only at the CI's width, never at the estimate or the p-value; REPRODUCING ("How many
runs") says what that does and does not do to the verdicts' error rates.

An experiment without a ``budget`` section, or a capture whose run count was fixed on the command line,
runs its fixed count and says so.
"""

from __future__ import annotations

import math
import random
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..bundle import measured_results
from .experiment import Budget, Condition, Experiment, ExperimentError, PlannedRun, parse_budget

if TYPE_CHECKING:  # the results a rule checks are pandas' frames, made by the bundle; a dry run imports none (issue 56)
    import pandas as pd
    from tqdm import tqdm

# A CI from fewer runs than this is too coarse to call precise, however narrow it comes out.
MIN_RUNS = 5
ALPHA = 0.05  # the verdicts', shared out over the comparisons checked (Bonferroni), as their simultaneous CIs are
RULE = (
    f"simultaneous {1 - ALPHA:.0%} CI half-width of each compared ratio, on the log scale, ≤ the half-width the "
    f"verdict's words need (half the consistent-size band; the no-effect margin for a direction target), from at "
    f"least {MIN_RUNS} runs per condition; rounds add one run of every condition"
)


def budget_of(experiment: Experiment, time_s: float | None = None) -> Budget | None:
    """The experiment's budget, ``time_s`` overridden from the command line; None when it sets none."""
    budget = parse_budget(experiment.definition, experiment.path)
    if time_s is None:
        return budget
    if time_s < 0:
        raise ExperimentError(f"--budget-s {time_s:g}: must be 0 or more seconds")
    return Budget(float(time_s), budget.max_runs if budget else 10 * experiment.runs)


@dataclass(frozen=True)
class PrecisionGoal:
    """One comparison the stopping rule checks, as plain data: the caller (the CLI) makes these from the claim's
    comparisons (``ticklab.analysis.comparisons.precision_goals``), so capture never loads the analysis itself."""

    comparison: str  # what is compared, in words (the manifest's stopping checks name it)
    metric: str  # results.csv metric
    treatment: str  # condition names
    baseline: str
    statistic: str  # the ratio's statistic (median, p10 ...), as the verdict takes it
    target_log_half_width: float  # the precision target: the CI half-width (log scale) the verdict's words need
    experiments: tuple[str, ...] = ()  # only these experiments measure it (all when empty)


def goals_measured(experiment: Experiment, conditions: list[Condition], goals) -> list[PrecisionGoal]:
    """The goals whose two conditions this experiment has (and that name it, when they name experiments)."""
    names = {c.name for c in conditions}
    return [
        g
        for g in goals
        if {g.treatment, g.baseline} <= names and (not g.experiments or experiment.name in g.experiments)
    ]


@dataclass
class StoppingRule:
    """Decides, between rounds, whether a capture goes on; ``record`` is what the manifest keeps."""

    goals: list[PrecisionGoal]
    budget: Budget | None
    fixed_why: str | None = None  # why the run count is fixed (no budget, --runs given, nothing to compare)
    n_boot: int = 10_000
    seed: int = 0
    checks: list[dict] = field(default_factory=list)
    reason: str | None = None
    started: float | None = None

    @classmethod
    def for_capture(
        cls,
        experiment: Experiment,
        conditions: list[Condition],
        *,
        runs_fixed: bool,
        budget_s: float | None = None,
        goals=None,
    ) -> StoppingRule:
        """The rule of one capture. ``goals``: the claim's :class:`PrecisionGoal` s (None: the caller gave none,
        so the run count is fixed); only those whose two conditions the experiment has are checked."""
        budget = budget_of(experiment, budget_s)
        if runs_fixed:
            return cls([], None, "fixed run count (set on the command line)")
        if budget is None:
            return cls([], None, "fixed run count (the experiment sets no budget)")
        if goals is None:
            return cls([], None, "fixed run count (no precision goals were given to the capture)")
        compared = goals_measured(experiment, conditions, goals)
        if not compared:
            return cls([], None, "fixed run count (no comparison of the claim has both its conditions here)")
        if budget.time_s == 0:
            return cls(compared, None, "fixed run count (time budget 0)")
        return cls(compared, budget)

    def start(self) -> None:
        """The measured runs begin now (the time budget counts from here)."""
        self.started = time.monotonic()

    def _check(self, results: pd.DataFrame) -> list[dict]:
        # scipy through the analysis' stats only once a CI is checked: a dry run or a refused file never needs it
        from ..analysis.stats import blocks_bound, log_half_width, ratio_by_blocks, ratio_interval

        entries = []
        for goal in self.goals:
            values = {
                name: results[(results["metric"] == goal.metric) & (results["condition"] == name)]["value"]
                for name in (goal.treatment, goal.baseline)
            }
            n = {name: len(v) for name, v in values.items()}
            entry = {
                "comparison": goal.comparison,
                "metric": goal.metric,
                "treatment": goal.treatment,
                "baseline": goal.baseline,
                "n": [n[goal.treatment], n[goal.baseline]],
            }
            if min(n.values()) < 2:
                entries.append({**entry, "met": False, "why": "fewer than 2 runs of a condition"})
                continue
            confidence = 1 - ALPHA / len(self.goals)
            pairs = _block_pairs(results, goal) if goal.statistic == "median" else None
            try:
                if blocks_bound(pairs, confidence):
                    ratio = ratio_by_blocks(*pairs, confidence=confidence)  # as the verdict will: blocks cancel drift
                else:
                    ratio = ratio_interval(
                        values[goal.treatment],
                        values[goal.baseline],
                        statistic=goal.statistic,
                        confidence=confidence,
                        n_boot=self.n_boot,
                        seed=self.seed,
                    )
            except ValueError as exc:
                entries.append({**entry, "met": False, "why": str(exc)})
                continue
            width, target = log_half_width(ratio.low, ratio.high), goal.target_log_half_width
            entries.append(
                {
                    **entry,
                    "ratio": ratio.estimate,
                    "ci": [ratio.low, ratio.high if math.isfinite(ratio.high) else None],
                    "log_half_width": width if math.isfinite(width) else None,
                    "target_log_half_width": target,
                    "met": width <= target and min(n.values()) >= MIN_RUNS,
                }
            )
        return entries

    def next_round(
        self,
        results: pd.DataFrame,
        runs_per_condition: dict[str, int],
        seconds_per_run: float,
        conditions: list[Condition],
    ) -> list[Condition]:
        """The conditions of the next round (in run order), or [] when the capture stops (``reason`` says why)."""
        if self.fixed_why:
            self.reason = self.fixed_why
            return []
        assert self.budget is not None  # for_capture gives a budget wherever the run count is not fixed
        checks = self._check(results)
        self.checks.append({"runs_per_condition": dict(runs_per_condition), "comparisons": checks})
        short = [c for c in checks if not c["met"]]
        if not short:
            self.reason = (
                f"precision reached: all {len(checks)} comparison(s) met their target "
                f"after {max(runs_per_condition.values())} runs per condition"
            )
            return []
        wanted = list(conditions)  # a block of every condition, so later rounds never confound time with condition
        elapsed = time.monotonic() - (self.started or time.monotonic())
        if any(runs_per_condition.get(c.name, 0) >= self.budget.max_runs for c in wanted):
            self.reason = (
                f"run budget spent ({self.budget.max_runs} runs per condition); "
                f"{len(short)} of {len(checks)} comparison(s) short of the precision target"
            )
            return []
        if elapsed + seconds_per_run * len(wanted) > self.budget.time_s:
            self.reason = (
                f"time budget spent ({elapsed:.0f} s of {self.budget.time_s:.0f} s; another round would "
                f"pass it); {len(short)} of {len(checks)} comparison(s) short of the precision target"
            )
            return []
        return wanted

    def record(self) -> dict:
        return {
            "rule": RULE,
            "budget": None if self.budget is None else vars(self.budget),
            "reason": self.reason,
            "checks": self.checks,
        }


def _block_pairs(results: pd.DataFrame, goal: PrecisionGoal):
    """The goal's two conditions paired by block, or None (no blocks, or a block without one of them)."""
    if "block" not in results:
        return None
    chosen = results[results["metric"] == goal.metric]
    chosen = chosen[chosen["condition"].isin([goal.treatment, goal.baseline])]
    if chosen["block"].isna().any():
        return None
    from ..analysis.stats import block_pairs

    return block_pairs(
        *(chosen[chosen["condition"] == name].set_index("block")["value"] for name in (goal.treatment, goal.baseline))
    )


def extra_round(
    conditions: list[Condition], first_order: int, round_number: int, seed: int, block: int | None = None
) -> list[PlannedRun]:
    """One more measured run of each condition, in a seeded random order that differs per round (one block)."""
    chosen = list(conditions)
    random.Random(f"{seed}/round-{round_number}").shuffle(chosen)
    return [
        PlannedRun(f"run-{first_order + i + 1:03d}", first_order + i, c, False, block) for i, c in enumerate(chosen)
    ]


def next_round_runs(
    rule: StoppingRule,
    manifest,
    results: pd.DataFrame,
    conditions: list[Condition],
    seconds_per_run: float,
    round_number: int,
    seed: int,
) -> list[PlannedRun]:
    """The rule's decision on the bundle so far: the next round's runs, appended to the manifest's ``order``, or []
    when the capture stops (``rule.reason`` says why). In-process rounds (:class:`Rounds`) and a boot plan's rounds
    across reboots (``capture.boot_capture``) both take this step."""
    counts = {c.name: 0 for c in conditions}
    for record in manifest.measured_runs():
        counts[record.condition] = counts.get(record.condition, 0) + 1
    measured = measured_results(manifest, results)
    measured = measured.assign(block=measured["run"].map(manifest.blocks_by_run).astype("Int64"))
    wanted = rule.next_round(measured, counts, seconds_per_run, conditions)
    if not wanted:
        return []
    blocks = [entry["block"] for entry in manifest.order if entry.get("block") is not None]
    # a capture planned in blocks goes on in blocks (a round is one run of every condition); an older plan has none
    block = 1 + max(blocks) if blocks and len(wanted) == len(conditions) else None
    added = extra_round(wanted, len(manifest.order), round_number, seed, block)
    manifest.order += [
        {
            "run": p.run,
            "condition": p.condition.name,
            "warmup": False,
            "round": round_number,
            **({"block": block} if block is not None else {}),
        }
        for p in added
    ]
    return added


class Rounds:
    """The runs of a capture, in order: the initial schedule, then the rounds the stopping rule asks for.

    Iterate it (or ``shown``, for a progress bar) and run each planned run before asking for the next;
    the time each took (measured here, on the host) sizes the next round against the time budget. The
    manifest's ``order`` grows with each round, and ``stopping`` holds the decision once the iteration ends.
    """

    def __init__(self, plan: list[PlannedRun], rule: StoppingRule, conditions: list[Condition], seed: int, writer):
        self.plan, self.rule, self.conditions, self.seed = plan, rule, conditions, seed
        self.writer = writer
        self.progress: tqdm | None = None
        self.durations: list[float] = []

    def shown(self, desc: str, unit: str, enabled: bool = True):
        """The same runs, with a progress bar on stderr whose total grows with the rounds."""
        from tqdm import tqdm

        with tqdm(
            total=len(self.plan),
            desc=desc,
            unit=unit,
            disable=not enabled,
            file=sys.stderr,
            initial=len(self.writer.manifest.runs),
        ) as bar:
            self.progress = bar
            for planned in self:
                bar.set_postfix_str(planned.condition.name + (" (warm-up)" if planned.warmup else ""))
                yield planned
                bar.update()

    def _timed(self, planned: list[PlannedRun]):
        made = {record.run for record in self.writer.manifest.runs}  # a resumed session skips the runs it made
        for run in planned:
            if run.run in made:
                continue
            if not run.warmup and self.rule.started is None:
                self.rule.start()
            began = time.monotonic()
            yield run
            if not run.warmup:
                self.durations.append(time.monotonic() - began)

    def __iter__(self):
        yield from self._timed(self.plan)
        manifest = self.writer.manifest
        for round_number in range(1, 10_000):
            per_run = sum(self.durations) / len(self.durations) if self.durations else 0.0
            added = next_round_runs(
                self.rule, manifest, self.writer.results(), self.conditions, per_run, round_number, self.seed
            )
            if not added:
                break
            if self.progress is not None:
                self.progress.total += len(added)
                self.progress.refresh()
            yield from self._timed(added)
        manifest.stopping = self.rule.record()
        self.writer.flush()


def describe(rule: StoppingRule) -> str:
    """What the rule will do, in words (dry runs, logs)."""
    if rule.fixed_why:
        return rule.fixed_why
    assert rule.budget is not None  # for_capture gives a budget wherever the run count is not fixed
    return (
        f"after the initial runs, add rounds until {RULE}, for {len(rule.goals)} comparison(s), "
        f"within {rule.budget.time_s:.0f} s and {rule.budget.max_runs} runs per condition"
    )
