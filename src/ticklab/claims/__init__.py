"""The claims, and what every claim provides (the claim contract).

A claim is a module ``ticklab/claims/<id>.py`` (``-`` in the id spelled ``_``) that defines
``CLAIM = Claim(...)``: its id, seed, title and notebook, the outputs its notebook writes, the comparisons its
verdicts test, the published headline ratios for the summary, its condition checks and negative controls,
and the KernelShark preset of ``ticklab view``. Nothing else names the claims: the registry below finds
them by listing this package, and the CLI, doctor, capture, the report and the summary take their ids and
everything else from here. CONTRIBUTING.md lists the files a new claim needs.

This module imports no analysis (pandas, scipy): the CLI reads claim ids through ``ticklab.claimids``, and
the claim modules are imported only when their analysis is wanted.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from ..claimids import claim_ids, module_name

if TYPE_CHECKING:
    from ..analysis.comparisons import Comparison, NegativeControl
    from ..analysis.published import PublishedClaim
    from ..analysis.verdicts import Verdict

SUMMARY_NOTEBOOK = "00-summary.ipynb"


class ClaimContractError(ImportError):
    """A claim module does not provide what the contract asks; the message names the module and what is wrong."""


@dataclass(frozen=True)
class Headline:
    """One published effect as a ratio of printed values (computed by ticklab), for the summary's table."""

    setup: str
    comparison: str
    ratio: float
    better: str  # "higher" | "lower": which side of 1 the source calls an improvement


@dataclass(frozen=True)
class ViewPreset:
    """What ``ticklab view`` shows of a run of this claim in KernelShark.

    ``spot(trace, cpus, measured_cpu)`` returns the :class:`ticklab.report.view.Spot` markers A and B go on, or None
    for the default (the longest local timer interrupt); ``events`` filters the table and graph (empty: all);
    ``measured_cpu_only`` shows only the run's measured (last) CPU."""

    events: tuple[str, ...] = ()
    spot: Callable | None = None
    measured_cpu_only: bool = False


@dataclass(frozen=True)
class Claim:
    id: str
    seed: str  # the source document's number in ../shared/seeds (000 …)
    title: str  # "C1 HPET read contention": the report's section title
    notebook: str  # notebooks/<NN>-<id>.ipynb
    outputs: dict  # {"figures": [...], "tables": [...]} the notebook must write
    comparisons: Callable[[PublishedClaim], list[Comparison]]
    untested: str  # the words of the verdict row for setups that tested none of the comparisons
    headlines: Callable[[PublishedClaim], list[Headline]] | None = None
    no_headline_because: str = ""  # when ``headlines`` is None: why the source gives no ratio
    checks: tuple = ()  # condition checks (ticklab.analysis.checks) gating the runs a verdict may use
    negative_controls: Callable[[PublishedClaim], list[NegativeControl]] | None = None
    not_in_lab_because: str = ""  # why lab guests cannot test the claim, for its "not testable here" row
    view: ViewPreset = field(default_factory=ViewPreset)
    # what a claim adds to the shared verdict rules: (ctx, rows, alpha=...) -> rows, at the notebook's alpha
    # (hrtick: the spurious-ratio level)
    revise_verdicts: Callable[..., list[Verdict]] | None = None
    # (runs, comparisons) -> {(setup, comparison words): reason}: comparisons the claim knows are untestable on a
    # setup before any test (pvspinlock: kick-ahead barely ran); they leave the multiple-comparison family
    untestable: Callable | None = None
    # (runs, bundles) -> {name: DataFrame}: what the notebook derives per run from the bundles' raw files rather than
    # from results.csv (nohz: FTQ's quanta, the tick cost per run, osnoise and the gap detector; hpet: perf profiles);
    # ``ticklab bundle repack`` computes it before and after re-packing a bundle and refuses where anything differs
    derived_from_raw: Callable | None = None

    def published(self, published_dir: Path | str) -> PublishedClaim:
        from ..analysis.published import load_published

        return load_published(published_dir, self.id)

    def verdicts(self, ctx, alpha: float = 0.05, n_boot: int = 10_000, seed: int = 0) -> list[Verdict]:
        """Every verdict row of the claim on the bundles of a notebook context
        (ticklab.report.notebook.ClaimContext)."""
        from ..analysis.comparisons import claim_verdicts

        rows = claim_verdicts(
            self.id,
            self.comparisons(ctx.published),
            ctx.bundles,
            ctx.data_dir,
            summary=self.untested,
            checks=self.checks,
            not_in_lab_because=self.not_in_lab_because,
            alpha=alpha,
            n_boot=n_boot,
            seed=seed,
            untestable=self.untestable,
        )
        rows = self.revise_verdicts(ctx, rows, alpha=alpha) if self.revise_verdicts else rows
        return rows + self.pooled(ctx, rows, alpha=alpha)

    def pooled(self, ctx, rows: list[Verdict], alpha: float = 0.05) -> list[Verdict]:
        """The pooled rows (analysis/pooling.py): per comparison and setup kind with at least 3 setups, one
        random-effects pool of their rows; none where no kind has 3."""
        from ..analysis.pooling import pooled_verdicts

        comparisons = self.comparisons(ctx.published)
        pooled = pooled_verdicts(self.id, rows, comparisons, alpha=alpha)
        setups = {setup for row in pooled for setup in row.setups}
        sources = sorted(str(ref.path / "results.csv") for ref in ctx.bundles if ref.host_id in setups)
        return [replace(row, sources=tuple(sources)) for row in pooled]


def _load(claim_id: str) -> Claim:
    name = f"{__name__}.{module_name(claim_id)}"
    module = importlib.import_module(name)
    claim = getattr(module, "CLAIM", None)
    if not isinstance(claim, Claim):
        raise ClaimContractError(f"{module.__file__}: defines no CLAIM = Claim(...) (see CONTRIBUTING.md)")
    if claim.id != claim_id:
        raise ClaimContractError(f"{module.__file__}: CLAIM.id is {claim.id!r}; the module's name says {claim_id!r}")
    if claim.headlines is None and not claim.no_headline_because:
        raise ClaimContractError(f"{module.__file__}: CLAIM has no headlines and no no_headline_because")
    return claim


def all_claims() -> list[Claim]:
    """Every claim, in the order of their seeds (the report's, the summary's and verdicts.csv's order)."""
    return sorted((_load(claim_id) for claim_id in claim_ids()), key=lambda c: (c.seed, c.id))


def get_claim(claim_id: str) -> Claim:
    if claim_id not in claim_ids():
        raise KeyError(f"unknown claim {claim_id!r}; claims are: {', '.join(claim_ids())}")
    return _load(claim_id)
