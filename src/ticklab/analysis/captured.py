"""The captured bundles of a claim under a data directory (traces/<host-id>/<claim>/<bundle>/), for the
analysis: finding them, loading each once, and their health for the report."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import pandas as pd

from ..bundle import (
    MAX_MANIFEST_BYTES,
    Bundle,
    BundleError,
    Manifest,
    RunRecord,
    check_complete,
    load_bundle,
    seal_digest,
)
from ..registry import TCG
from ..safefiles import read_bytes


@dataclass(frozen=True)
class BundleRef:
    host_id: str
    claim: str
    path: Path

    def load(self, *, allow_incomplete: bool = False) -> Bundle:
        """The bundle, loaded and verified (schema, seal, every file's sha256) once per reference however many
        tables and verdicts read it; a BundleError as :func:`ticklab.bundle.load_bundle` raises it."""
        loaded = self._loaded
        if isinstance(loaded, BundleError):
            raise loaded
        if not allow_incomplete:
            check_complete(self.path, loaded.manifest)
        return loaded

    @cached_property
    def _loaded(self) -> Bundle | BundleError:
        try:
            return load_bundle(self.path, allow_incomplete=True)
        except BundleError as exc:
            return exc


_LABHOST_DIR = re.compile(r"^(?P<head>guest-[a-z0-9]+-[0-9-]+vcpu)-(?P<kernels>.+?)-on-(?P<tail>.+-labhost-[a-z]+)$")


def _release_key(release: str) -> tuple:
    return tuple(int(part) if part.isdigit() else 0 for part in re.split(r"[.-]", release)[:3]), release


def setup_of(host_dir: str, bundle: Path) -> str:
    """The setup a bundle's runs measured: its host-id, but for the lab host, whose directory is named after the
    image's own kernel (``…-6.1.0-50-amd64-on-…-labhost-kexec``), the kernels its runs booted instead (the releases a
    boot plan's runs recorded, oldest version first), so a plan on ticklab's 6.12 and 7.2 kernels is not shown
    as a 6.1 setup. The host-id as it is where the manifest cannot be read or records no boot."""
    found = _LABHOST_DIR.match(host_dir)
    if found is None:
        return host_dir
    try:
        manifest = Manifest.from_json(json.loads(read_bytes(bundle / "manifest.json", MAX_MANIFEST_BYTES)))
        releases = [str(run.boot["release"]) for run in manifest.runs if run.boot.get("release")]
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return host_dir
    booted = "-".join(sorted(set(releases), key=_release_key))
    return f"{found['head']}-{booted}-on-{found['tail']}" if booted else host_dir


# A lab setup's host-id (capture/lab): guest-<accelerator>-<vCPUs>vcpu-<kernels>-on-<physical host>, with -labhost for
# the lab host's Debian system and -kexec / -grub for a boot plan's runs.
GUEST_ID = re.compile(
    r"^guest-(?P<accel>[a-z0-9]+)-(?P<vcpus>[0-9-]+)vcpu-(?P<kernels>.+?)-on-(?P<host>.+?)"
    r"(?P<labhost>-labhost)?(?:-(?P<mode>kexec|grub))?$"
)


def kernel_versions(kernels: str) -> list[str]:
    """The X.Y series a guest id's kernels part names ("6.12.117-ticklab-7.2.13-ticklab" -> ["6.12", "7.2"])."""
    return list(dict.fromkeys(re.findall(r"(?<![\d.])(\d+\.\d+)(?:\.\d+)?", kernels)))


def setup_family(setup: str) -> str:
    """The kind of setup a host-id names, as the report's first screen heads its columns: "host" (a capture on the
    machine itself), "lab host" (the Debian system under QEMU booted by plans) or "lab guest <kernels>"."""
    guest = GUEST_ID.match(setup)
    if guest is None:
        return "host"
    if guest["labhost"]:
        return "lab host"
    return "lab guest " + " and ".join(kernel_versions(guest["kernels"]) or ["?"])


def pool_kind(setup: str) -> str:
    """The setups a random-effects pool may combine (analysis/pooling.py): the first screen's kind, and for a QEMU
    setup its accelerator too unless it is TCG, so an emulated CPU is never pooled with one that runs on the hardware
    (hosts are only ever pooled with hosts)."""
    guest = GUEST_ID.match(setup)
    family = setup_family(setup)
    return family if guest is None or guest["accel"] == TCG.name else f"{family} ({guest['accel']})"


def find_bundles(data_dir: Path | str, claim: str) -> list[BundleRef]:
    """Every bundle directory of ``claim`` (``<host-id>/<claim>/<bundle>/``); the published layer is skipped. A
    directory there without a regular manifest.json is listed too, so that loading it says what is wrong
    instead of the bundle vanishing from the analysis. A name starting with '.' is no bundle (a bundle's name is its
    time and experiment): ``ticklab bundle repack`` builds a bundle's new copy, and after the swap holds the old one,
    at ``.<bundle>.repack`` beside it, which the analysis must not count twice."""
    root = Path(data_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: data directory does not exist")
    refs = []
    for claim_dir in sorted(root.glob(f"*/{claim}")):
        host_dir = claim_dir.parent
        if host_dir.name == "published" or not claim_dir.is_dir():
            continue
        for entry in sorted(claim_dir.iterdir()):
            if entry.name.startswith("."):
                continue
            if entry.is_dir() or os.path.lexists(entry / "manifest.json"):
                refs.append(BundleRef(host_id=setup_of(host_dir.name, entry), claim=claim, path=entry))
    replaced = superseded_bundles(refs)
    return [ref for ref in refs if _place(ref.path) not in replaced]


def _place(bundle: Path) -> str:
    return "/".join(bundle.parts[-3:])


def superseded_bundles(refs: list[BundleRef]) -> set[str]:
    """The bundles (``<host-id>/<claim>/<bundle>``) that a recapture among ``refs`` says it replaces (its manifest's
    ``supersedes``, written by ``--supersedes``) and that are still the bundle it recorded (the same seal): the
    analysis counts each measurement once, the recapture's. A manifest that cannot be read supersedes nothing."""
    replaced = set()
    for ref in refs:
        try:
            manifest = Manifest.from_json(json.loads(read_bytes(ref.path / "manifest.json", MAX_MANIFEST_BYTES)))
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            continue
        for record in manifest.supersedes if isinstance(manifest.supersedes, list) else []:
            if not isinstance(record, dict) or not isinstance(record.get("bundle"), str):
                continue
            place = record["bundle"]
            old = next((other for other in refs if _place(other.path) == place and other is not ref), None)
            if old is not None and _seal_of(old.path) == record.get("seal"):
                replaced.add(place)
    return replaced


def _seal_of(bundle: Path) -> str | None:
    try:
        return seal_digest(bundle)
    except OSError:
        return None


def all_setups(data_dir: Path | str) -> list[str]:
    """Every host-id under the data directory that holds at least one bundle (of any claim)."""
    root = Path(data_dir)
    if not root.is_dir():
        return []
    return sorted(
        {setup_of(m.parent.parent.parent.name, m.parent) for m in root.glob("*/*/*/manifest.json")} - {"published"}
    )


def describe(bundles: list[BundleRef], data_dir: Path | str, claim: str) -> str:
    """One plain sentence for the notebook's fresh-data section."""
    if not bundles:
        return (
            f"No captured bundles for '{claim}' exist under {data_dir}. Fresh data comes from "
            f"`ticklab capture {claim}` on a host or `ticklab lab run {claim}` in a guest; until then "
            f"this claim's verdict is 'not testable here'."
        )
    hosts = sorted({b.host_id for b in bundles})
    return f"{len(bundles)} bundle(s) for '{claim}' from {len(hosts)} setup(s): {', '.join(hosts)}."


HEALTH_COLUMNS = [
    "host_id",
    "claim",
    "bundle",
    "status",
    "measured_runs",
    "failed_runs",
    "lost_events",
    "busy_runs",
    "stopped",
    "flag",
]


def busy_flag(runs: list[RunRecord]) -> str:
    """'N of M runs on a busy host: ...' for measured runs whose interference record says busy, or ''.
    Bundles captured before runs recorded their interference have nothing to flag."""
    busy = [r.interference for r in runs if r.interference.get("busy")]
    if not busy:
        return ""

    def most(key):
        values = [b[key] for b in busy if b.get(key) is not None]
        return max(values) if values else None

    parts = []
    if most("other_runnable_max") is not None:
        parts.append(
            f"up to {most('other_runnable_max')} runnable tasks besides the run's own on {most('cpus')} CPU(s)"
        )
    if most("load1_max") is not None:
        parts.append(f"load average up to {most('load1_max')}")
    if most("steal_fraction"):
        parts.append(f"steal up to {most('steal_fraction'):.0%} of CPU time")
    return f"{len(busy)} of {len(runs)} measured run(s) on a busy host" + (f": {', '.join(parts)}" if parts else "")


def bundle_health(data_dir: Path | str, claims: list[str]) -> pd.DataFrame:
    """One row per captured bundle: does it verify, how many runs, and how many trace events the kernel lost.

    ``flag`` is empty for a clean bundle; otherwise it says what a reader must know (tampered,
    incomplete, failed runs, lost events, runs on a busy host, not testable). Flags only: no verdict changes."""
    from ..bundle import run_failed, stopped_because

    rows = []
    root = Path(data_dir)
    for claim in claims:
        for ref in find_bundles(root, claim) if root.is_dir() else []:
            row = {"host_id": ref.host_id, "claim": claim, "bundle": ref.path.name}
            try:
                bundle = ref.load(allow_incomplete=True)
            except BundleError as exc:
                rows.append(
                    {
                        **row,
                        "status": "unreadable",
                        "measured_runs": 0,
                        "failed_runs": 0,
                        "lost_events": 0,
                        "busy_runs": 0,
                        "stopped": "",
                        "flag": str(exc),
                    }
                )
                continue
            manifest = bundle.manifest
            runs = [r for r in manifest.runs if not r.warmup]
            failed = [r for r in runs if run_failed(r)]
            lost = sum(r.trace.get("lost_events", 0) for r in manifest.runs)
            flags = []
            if manifest.status != "sealed":
                flags.append("incomplete: capture was interrupted")
            if manifest.not_testable:
                flags.append("not testable: " + manifest.not_testable)
            if failed:
                flags.append(f"{len(failed)} run(s) failed")
            if lost:
                flags.append(f"kernel lost {lost} trace event(s)")
            busy = busy_flag(runs)
            if busy:
                flags.append(busy)
            rows.append(
                {
                    **row,
                    "status": manifest.status,
                    "measured_runs": len(runs),
                    "failed_runs": len(failed),
                    "lost_events": lost,
                    "flag": "; ".join(flags),
                    "busy_runs": sum(bool(r.interference.get("busy")) for r in runs),
                    "stopped": "" if manifest.not_testable else stopped_because(manifest),
                }
            )
    return pd.DataFrame(rows, columns=HEALTH_COLUMNS)
