"""Bundles: the unit of captured data (DESIGN.md, "Bundles").

    traces/<host-id>/<claim>/<UTC timestamp>-<experiment>/
        manifest.json   schema, claim, experiment definition, host facts, one record per run, checksums
        raw/<run>/...   what the tools wrote
        results.csv     tidy: run, condition, metric, value, unit

A bundle is written incrementally and marked ``incomplete`` from its first byte, so an interrupted
capture leaves the runs it finished. ``seal`` makes every file read-only and records its sha256;
``load_bundle`` verifies schema and checksums and names the file that fails. Nothing is ever
overwritten: a bundle directory that exists already is an error.
"""

from __future__ import annotations

import csv
import hashlib
import json
import lzma
import os
import shutil
import stat
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from . import __version__

SCHEMA_VERSION = 1
MANIFEST = "manifest.json"
RESULTS = "results.csv"
RESULT_COLUMNS = ["run", "condition", "metric", "value", "unit"]
COMPRESS_FROM_BYTES = 64 * 1024
REQUIRED_KEYS = ("schema_version", "status", "claim", "experiment", "definition", "host", "runs")


def run_failed(record: dict) -> bool:
    """A run that did not finish ok, or whose results came with a problem (e.g. a guest that booted wrong)."""
    return record.get("status", "ok") != "ok" or bool(record.get("problem"))


def stopped_because(manifest: dict) -> str:
    """Why a bundle's capture stopped (its stopping record); bundles from before there was one ran a fixed count."""
    reason = (manifest.get("stopping") or {}).get("reason")
    if reason:
        return reason
    if manifest.get("status") != "sealed":
        return "interrupted before the stopping rule decided"
    return "fixed run count (the manifest has no stopping record)"


class BundleError(ValueError):
    """A bundle is malformed, incomplete or tampered with; the message names the file."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _write_json_atomically(path: Path, data: dict) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(temporary, path)


def bundle_name(experiment: str, when: datetime) -> str:
    return f"{when.astimezone(timezone.utc).strftime('%Y%m%dT%H%M%SZ')}-{experiment}"


class BundleWriter:
    def __init__(self, traces_dir: Path | str, host_id: str, claim: str, experiment: str, *,
                 definition: dict, host: dict, tools: dict | None = None, when: datetime | None = None):
        when = when or datetime.now(timezone.utc)
        self.path = Path(traces_dir) / host_id / claim / bundle_name(experiment, when)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.path.mkdir()
        except FileExistsError:
            raise BundleError(f"{self.path}: bundle exists already; bundles are never overwritten") from None
        self.manifest = {
            "schema_version": SCHEMA_VERSION, "status": "incomplete", "claim": claim, "experiment": experiment,
            "definition": definition, "host_id": host_id, "host": host, "tools": tools or {},
            "ticklab_version": __version__, "started": when.astimezone(timezone.utc).isoformat(), "runs": [],
        }
        self.flush()
        with (self.path / RESULTS).open("w", newline="") as handle:
            csv.writer(handle).writerow(RESULT_COLUMNS)

    def flush(self) -> None:
        _write_json_atomically(self.path / MANIFEST, self.manifest)

    def run_dir(self, run: str) -> Path:
        directory = self.path / "raw" / run
        directory.mkdir(parents=True, exist_ok=False)
        return directory

    def add_run(self, record: dict, results: list[dict]) -> None:
        """Record one finished run and its tidy results; the manifest on disk stays current."""
        missing = [k for k in ("run", "condition") if k not in record]
        if missing:
            raise BundleError(f"{self.path / MANIFEST}: run record lacks {', '.join(missing)}")
        with (self.path / RESULTS).open("a", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=RESULT_COLUMNS)
            for row in results:
                writer.writerow({"run": record["run"], "condition": record["condition"], **row})
        self.manifest["runs"].append(record)
        self.flush()

    def results(self) -> pd.DataFrame:
        """results.csv as written so far."""
        return pd.read_csv(self.path / RESULTS)

    def compress_raw(self, keep_per_condition: int = 1, threshold: int = COMPRESS_FROM_BYTES) -> None:
        """xz every raw file of ``threshold`` bytes or more (trace.dat, tracefs cpuN.raw, ftq.dat ...) except in
        the first ``keep_per_condition`` measured runs of each condition, which stay as they are so that
        KernelShark and a reader of the bundle can open them directly. ticklab's readers take either form
        (:mod:`ticklab.rawfile`)."""
        kept, seen = [], {}
        for record in self.manifest["runs"]:
            if record.get("warmup"):
                continue
            seen[record["condition"]] = seen.get(record["condition"], 0) + 1
            if seen[record["condition"]] <= keep_per_condition:
                kept.append(record["run"])
        packed = 0
        for record in self.manifest["runs"]:
            if record["run"] in kept:
                continue
            for path in sorted((self.path / "raw" / record["run"]).rglob("*")):
                if path.is_file() and path.suffix != ".xz" and path.stat().st_size >= threshold:
                    with path.open("rb") as source, lzma.open(path.with_name(path.name + ".xz"), "wb", preset=6) as target:
                        shutil.copyfileobj(source, target)
                    path.unlink()
                    packed += 1
        if packed:
            self.manifest["raw_files"] = {"uncompressed_runs": kept, "compressed": packed,
                                          "how": f"files of {threshold} bytes or more in the other runs are xz'd (xz -d for other tools)"}

    def seal(self) -> Path:
        self.compress_raw()
        files = sorted(p for p in self.path.rglob("*") if p.is_file() and p.name != MANIFEST)
        self.manifest["files"] = {str(p.relative_to(self.path)): _sha256(p) for p in files}
        self.manifest["status"] = "sealed"
        self.manifest["sealed"] = datetime.now(timezone.utc).isoformat()
        self.flush()
        for path in [*files, self.path / MANIFEST]:
            path.chmod(stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
        return self.path


@dataclass
class Bundle:
    path: Path
    manifest: dict
    results: pd.DataFrame

    @property
    def sealed(self) -> bool:
        return self.manifest["status"] == "sealed"


def load_bundle(path: Path | str, *, allow_incomplete: bool = False) -> Bundle:
    """Load a bundle, verifying its schema and (when sealed) every file's checksum."""
    path = Path(path)
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        raise BundleError(f"{manifest_path}: missing; {path} is not a bundle")
    try:
        manifest = json.loads(manifest_path.read_text())
    except json.JSONDecodeError as exc:
        raise BundleError(f"{manifest_path}: not valid JSON ({exc})") from exc
    missing = [k for k in REQUIRED_KEYS if k not in manifest]
    if missing:
        raise BundleError(f"{manifest_path}: missing key(s) {', '.join(missing)}")
    if manifest["schema_version"] != SCHEMA_VERSION:
        raise BundleError(f"{manifest_path}: schema version {manifest['schema_version']}, this ticklab reads {SCHEMA_VERSION}")
    if manifest["status"] == "incomplete" and not allow_incomplete:
        raise BundleError(f"{manifest_path}: bundle is incomplete ({len(manifest['runs'])} run(s) finished); "
                          "pass allow_incomplete to read what it has")
    if manifest["status"] == "sealed":
        listed = manifest.get("files", {})
        present = {str(p.relative_to(path)) for p in path.rglob("*") if p.is_file() and p.name != MANIFEST}
        added = sorted(present - set(listed))
        if added:
            raise BundleError(f"{path / added[0]}: not listed in the manifest (added after sealing)")
        for relative, expected in sorted(listed.items()):
            file = path / relative
            if not file.is_file():
                raise BundleError(f"{file}: listed in the manifest but missing")
            if _sha256(file) != expected:
                raise BundleError(f"{file}: sha256 differs from the manifest (modified after sealing)")
    results = pd.read_csv(path / RESULTS) if (path / RESULTS).is_file() else pd.DataFrame(columns=RESULT_COLUMNS)
    if list(results.columns) != RESULT_COLUMNS:
        raise BundleError(f"{path / RESULTS}: columns {list(results.columns)}, expected {RESULT_COLUMNS}")
    return Bundle(path=path, manifest=manifest, results=results)
