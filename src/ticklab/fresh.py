"""Finding captured bundles for a claim under a data directory (traces/<host-id>/<claim>/<bundle>/)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class BundleRef:
    host_id: str
    claim: str
    path: Path


def find_bundles(data_dir: Path | str, claim: str) -> list[BundleRef]:
    """Every bundle directory (one holding manifest.json) for ``claim``; the published layer is skipped."""
    root = Path(data_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: data directory does not exist")
    refs = []
    for manifest in sorted(root.glob(f"*/{claim}/*/manifest.json")):
        host_dir = manifest.parent.parent.parent
        if host_dir.name == "published":
            continue
        refs.append(BundleRef(host_id=host_dir.name, claim=claim, path=manifest.parent))
    return refs


def describe(bundles: list[BundleRef], data_dir: Path | str, claim: str) -> str:
    """One plain sentence for the notebook's fresh-data section."""
    if not bundles:
        return (f"No captured bundles for '{claim}' exist under {data_dir}. Fresh data comes from "
                f"`ticklab capture {claim}` on a host or `ticklab lab run {claim}` in a guest; until then "
                f"this claim's verdict is 'not testable here'.")
    hosts = sorted({b.host_id for b in bundles})
    return f"{len(bundles)} bundle(s) for '{claim}' from {len(hosts)} setup(s): {', '.join(hosts)}."
