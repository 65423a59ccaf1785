"""Per-claim analysis. Claim ids are used everywhere (file names, CLI, tables)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

import pandas as pd

from ..published import PublishedClaim


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


# Why a claim has no lab (guest) experiment, for the rows above.
ABSENT_BECAUSE = {"acpi-idle": "QEMU offers guests no ACPI C-states, so the dummy wait is never reached in a lab guest"}


def setup_table(published: PublishedClaim) -> pd.DataFrame:
    """What the published numbers were measured on (and patch facts), as printed."""
    frame = published.table("setup")
    return frame[["setup", "field", "value_as_printed", "qualifier"]].rename(columns={"value_as_printed": "as printed"})
