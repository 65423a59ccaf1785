"""The claim ids, without the analysis: a claim is a module ``ticklab/claims/<id>.py`` (``-`` in the id
spelled ``_``; modules whose names start with ``_`` are not claims). The CLI, doctor and capture name
claims through this module, which lists the package's files and imports none of them
(``ticklab.claims.all_claims`` imports them and checks each keeps the claim contract)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path


def _claim_directories() -> list[Path]:
    loaded = sys.modules.get("ticklab.claims")
    if loaded is not None:
        return [Path(p) for p in loaded.__path__]
    spec = importlib.util.find_spec("ticklab.claims")  # imports ticklab, not ticklab.claims
    return [Path(p) for p in (spec.submodule_search_locations or [])] if spec else []


def module_name(claim_id: str) -> str:
    return claim_id.replace("-", "_")


def claim_ids() -> tuple[str, ...]:
    """Every claim id, in alphabetical order (``ticklab.claims.all_claims`` orders them by seed)."""
    stems = {
        path.stem
        for directory in _claim_directories()
        for path in directory.glob("*.py")
        if not path.stem.startswith("_")
    }
    return tuple(sorted(stem.replace("_", "-") for stem in stems))


CLAIM_IDS = claim_ids()
