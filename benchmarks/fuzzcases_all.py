"""Every family of the campaign, in the order `make fuzz` runs them (benchmarks/fuzz.py). The families' modules import
``fuzzcases`` (the shared classifier and seeds) and nothing imports back: the list lives here, not at the foot of
fuzzcases.py, which made the modules import each other in a circle (issue 43)."""

from __future__ import annotations

from fuzzcases import BundleFamily, CliYamlFamily, PublishedFamily, TraceFamily, WorkloadFamily
from fuzzcases_accounting import CompressedBombFamily, TraceFieldsFamily
from fuzzcases_ingest import IngestOutLinksFamily, TraceCountsFamily, TraceSpecialsFamily
from fuzzcases_outputs import OutputPlacesFamily
from fuzzcases_plans import CmdlineWordsFamily, PlanStateFamily
from fuzzcases_root import ForkFramesFamily, JournalsFamily, KernelNamesFamily, KernelRootFamily
from fuzzcases_special import SpecialFilesFamily
from fuzzcases_yaml import YamlAliasFamily, YamlEmptyTypedFamily

FAMILIES = [
    BundleFamily(),
    TraceFamily(),
    WorkloadFamily(),
    PublishedFamily(),
    CliYamlFamily(),
    SpecialFilesFamily(),
    PlanStateFamily(),
    CmdlineWordsFamily(),
    IngestOutLinksFamily(),
    TraceSpecialsFamily(),
    TraceCountsFamily(),
    TraceFieldsFamily(),
    CompressedBombFamily(),
    YamlAliasFamily(),
    YamlEmptyTypedFamily(),
    OutputPlacesFamily(),
    KernelNamesFamily(),
    JournalsFamily(),
    KernelRootFamily(),
    ForkFramesFamily(),
]
