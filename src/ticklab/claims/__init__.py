"""Per-claim analysis. Claim ids are used everywhere (file names, CLI, tables)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pandas as pd

from ..fresh import BundleRef
from ..published import PublishedClaim
from ..verdicts import Verdict


@dataclass(frozen=True)
class ClaimInfo:
    id: str
    seed: str
    notebook: str
    module: str
    title: str

    def load_module(self) -> ModuleType:
        return importlib.import_module(self.module)


CLAIMS: dict[str, ClaimInfo] = {
    info.id: info
    for info in (
        ClaimInfo("hpet", "000", "01-hpet.ipynb", "ticklab.claims.hpet", "C1 HPET read contention"),
        ClaimInfo("pvspinlock", "001", "02-pvspinlock.ipynb", "ticklab.claims.pvspinlock", "C2 pvqspinlock kick-ahead"),
        ClaimInfo("hrtick", "002", "03-hrtick.ipynb", "ticklab.claims.hrtick", "C3 HRTICK overhead"),
        ClaimInfo("acpi-idle", "003", "04-acpi-idle.ipynb", "ticklab.claims.acpi_idle", "C4 ACPI idle dummy wait"),
        ClaimInfo("nohz", "004", "05-nohz.ipynb", "ticklab.claims.nohz", "C5 nohz tick"),
    )
}

SUMMARY_NOTEBOOK = "00-summary.ipynb"


def claim_info(claim: str) -> ClaimInfo:
    if claim not in CLAIMS:
        raise KeyError(f"unknown claim {claim!r}; claims are: {', '.join(CLAIMS)}")
    return CLAIMS[claim]


def pending_verdict(claim: str, comparison: str, published_effect: str,
                    bundles: list[BundleRef], data_dir: Path | str, *, absent: bool = True) -> list[Verdict]:
    """The honest verdict while a claim has no fresh data it can analyse: per setup, the reason its
    bundle gives for not running the experiment, or that no analysis of its data exists yet; with
    ``absent``, also a row for every other setup in the data directory (it has no bundle of this claim)."""
    if not bundles:
        return [Verdict(claim=claim, setup="none analysed", comparison=comparison, published_effect=published_effect,
                        verdict="not testable here",
                        reason=f"no captured bundles for {claim} under {data_dir}: nothing measured to test the claim with")
                ] + (absent_setups(claim, comparison, published_effect, bundles, data_dir) if absent else [])
    from ..bundle import BundleError, load_bundle

    reasons: dict[str, list[str]] = {}
    for ref in bundles:
        try:
            manifest = load_bundle(ref.path).manifest
        except BundleError as exc:
            reasons.setdefault(ref.host_id, []).append(f"{ref.path.name} does not load ({exc})")
            continue
        why = manifest.get("not_testable") or (f"{ref.path.name} has data, but this version of ticklab has no "
                                               f"fresh-data analysis for {claim}; nothing was tested")
        reasons.setdefault(ref.host_id, []).append(f"{manifest['experiment']}: {why}")
    return [Verdict(claim=claim, setup=setup, comparison=comparison, published_effect=published_effect,
                    verdict="not testable here", reason="; ".join(dict.fromkeys(why)))
            for setup, why in sorted(reasons.items())] + (
                absent_setups(claim, comparison, published_effect, bundles, data_dir) if absent else [])


def absent_setups(claim: str, comparison: str, published_effect: str, bundles: list[BundleRef],
                  data_dir: Path | str) -> list[Verdict]:
    """One row for every setup in the data directory that captured other claims but not this one."""
    from ..fresh import all_setups

    have = {ref.host_id for ref in bundles}
    return [Verdict(claim=claim, setup=setup, comparison=comparison, published_effect=published_effect,
                    verdict="not testable here",
                    reason=f"no {claim} bundle from this setup: none of the claim's experiments ran there"
                           + (f" ({ABSENT_BECAUSE[claim]})" if setup.startswith("guest-") and claim in ABSENT_BECAUSE else ""))
            for setup in all_setups(data_dir) if setup not in have]


# Why a claim has no lab (guest) experiment, for the rows above.
ABSENT_BECAUSE = {"acpi-idle": "QEMU offers guests no ACPI C-states, so the dummy wait is never reached in a lab guest"}


def setup_table(published: PublishedClaim) -> pd.DataFrame:
    """What the published numbers were measured on (and patch facts), as printed."""
    frame = published.table("setup")
    return frame[["setup", "field", "value_as_printed", "qualifier"]].rename(columns={"value_as_printed": "as printed"})
