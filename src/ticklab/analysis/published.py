"""The published layer: numbers transcribed from the five source documents, with provenance.

Each claim has ``traces/published/<claim>/`` holding CSV tables and a ``provenance.yaml`` that
quotes, for every row, the line of the source document the value was read from. Published values
are single observations (n = 1): they are reproduced exactly, and fresh data is held against targets
computed from them (``PublishedClaim.ratio_target``: a derived ratio, labelled as such, citing the rows),
never tested as samples.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from .. import schemas, yamlsafe
from ..safefiles import UnsafeFileError, read_bytes, read_text, shown

if TYPE_CHECKING:
    from .verdicts import Target

REQUIRED_COLUMNS = ("id", "value", "unit", "value_as_printed", "qualifier")
# Columns whose cells may be blank; every other column (id, value_as_printed, system, clocksource ...) names what
# a row is, and a blank cell there is an error naming the file, row and column.
MAY_BE_BLANK = ("value", "unit", "qualifier")
# In these tables a value may be blank beside a printed number (a date, a kernel version, an argument list:
# facts, not measurements); in every other table a blank value is only for a printed statement with no number.
DESCRIPTIVE_TABLES = ("setup.csv",)
MAX_CELL_CHARS = 1000  # a transcribed number, its unit or the words around it: never more
MAX_PROVENANCE_BYTES = 4 << 20
MAX_TABLE_BYTES = 16 << 20
MAX_SOURCE_BYTES = 64 << 20

# (?<!\d): a match starts only where a run of digits starts, so a search is linear in the text (a cell of
# 100,000 digits took minutes: each position retried the run to its end)
_DURATION = re.compile(r"(?<!\d)(?P<min>\d+)m(?P<sec>\d+(?:\.\d+)?)s")
_NUMBER = re.compile(r"[-+]?(?<!\d)\d+(?:\.\d+)?")
_WORDS = {"one": 1.0, "two": 2.0, "three": 3.0, "four": 4.0, "half": 0.5}


class PublishedDataError(ValueError):
    """A published table or its provenance is malformed; the message names the file and row."""


def parse_printed(text: str) -> float | None:
    """The number a printed value states: '3m21.9s' -> 201.9, '+1393.05%' -> 1393.05, 'one' -> 1."""
    duration = _DURATION.search(text)
    if duration:
        return int(duration["min"]) * 60 + float(duration["sec"])
    number = _NUMBER.search(text)
    if number:
        return float(number.group())
    for word, value in _WORDS.items():
        if re.search(rf"\b{word}\b", text, flags=re.IGNORECASE):
            return value
    return None


def printed_decimals(text: str) -> int:
    """Decimal places of the first number printed in ``text`` ('0.840s' -> 3, '~-42%' -> 0)."""
    number = _NUMBER.search(text)
    if not number:
        raise ValueError(f"no number in {text!r}")
    whole = number.group()
    return len(whole.split(".")[1]) if "." in whole else 0


@dataclass
class PublishedClaim:
    claim: str
    directory: Path
    source: dict
    tables: dict[str, pd.DataFrame]
    not_transcribed: list = field(default_factory=list)

    def table(self, name: str) -> pd.DataFrame:
        if name not in self.tables:
            raise PublishedDataError(
                f"{self.directory / (name + '.csv')}: no such published table for claim "
                f"{self.claim!r} (have: {', '.join(sorted(self.tables))})"
            )
        return self.tables[name]

    def row(self, table: str, row_id: str) -> pd.Series:
        frame = self.table(table)
        match = frame[frame["id"] == row_id]
        if match.empty:
            raise PublishedDataError(f"{self.directory / (table + '.csv')}: no row with id {shown(repr(row_id))}")
        return match.iloc[0]

    def value(self, table: str, row_id: str) -> float:
        """The row's number; a row whose value is blank (a statement with no number) has none to compute with."""
        value = float(self.row(table, row_id)["value"])
        if not math.isfinite(value):
            raise PublishedDataError(
                f"{self.directory / (table + '.csv')}: row id {shown(repr(row_id))}, column "
                "value: blank, so there is no published number to compute a target from"
            )
        return value

    def printed(self, table: str, row_id: str) -> str:
        return str(self.row(table, row_id)["value_as_printed"])

    def quote_id(self, table: str, row_id: str) -> str:
        """The id a verdict cites a published row by: <claim>/<table>/<row id>."""
        self.row(table, row_id)
        return f"{self.claim}/{table}/{row_id}"

    def ratio_target(self, table: str, numerator: str, denominator: str) -> Target:
        """A target ratio computed from two printed values (derived, never itself printed)."""
        from .verdicts import Target

        ratio = self.value(table, numerator) / self.value(table, denominator)
        shown = f"{self.printed(table, numerator)} / {self.printed(table, denominator)}"
        return Target(
            ratio,
            1 if ratio > 1 else -1,
            f"derived: ratio of two printed values ({shown})",
            shown,
            (self.quote_id(table, numerator), self.quote_id(table, denominator)),
        )

    def files(self, *tables: str) -> list[Path]:
        """The CSV files behind ``tables`` plus the provenance file: what a figure or table came from."""
        for name in tables:
            self.table(name)
        return [self.directory / f"{name}.csv" for name in tables] + [self.directory / "provenance.yaml"]

    def setup_table(self) -> pd.DataFrame:
        """What the published numbers were measured on (and patch facts), as printed."""
        frame = self.table("setup")
        return frame[["setup", "field", "value_as_printed", "qualifier"]].rename(
            columns={"value_as_printed": "as printed"}
        )

    def citation(self) -> str:
        s = self.source
        year = f" ({s['year']})" if s.get("year") else ""
        return f"{s.get('author', '?')}{year}, “{s.get('title', '?')}”, {s.get('venue', '?')}; seeds/{s['file']}"


def _read_table(path: Path) -> pd.DataFrame:
    """One published CSV, read through ticklab.safefiles (no link, no FIFO, bounded); every cell checked."""
    try:
        text = read_text(path, MAX_TABLE_BYTES)
    except UnsafeFileError as exc:
        raise PublishedDataError(str(exc)) from None
    try:
        frame = pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False)
    except Exception as exc:  # pandas raises several parser error types
        raise PublishedDataError(f"{shown(path)}: not a readable CSV ({shown(' '.join(str(exc).split()))})") from None
    missing = [c for c in REQUIRED_COLUMNS if c not in frame.columns]
    if missing:
        raise PublishedDataError(f"{shown(path)}: missing column(s) {', '.join(missing)}")
    duplicated = frame["id"][frame["id"].duplicated()].tolist()
    if duplicated:
        raise PublishedDataError(f"{shown(path)}: duplicate id(s) {shown(', '.join(duplicated))}")
    descriptive = path.name in DESCRIPTIVE_TABLES
    for index, row in frame.iterrows():
        where = f"{shown(path)}: row {index + 2}"
        blank = [c for c in frame.columns if c not in MAY_BE_BLANK and not str(row[c]).strip()]
        if blank:
            raise PublishedDataError(f"{where}, column {shown(blank[0], 80)}: blank; every row needs it")
        long = [c for c in frame.columns if len(str(row[c])) > MAX_CELL_CHARS]
        if long:
            raise PublishedDataError(
                f"{where}, column {shown(long[0], 80)}: {len(str(row[long[0]]))} characters, "
                f"more than the {MAX_CELL_CHARS} of a published cell"
            )
        where = f"{where} (id {shown(repr(row['id']), 80)})"
        stated = parse_printed(row["value_as_printed"])
        if row["value"] == "":
            if stated is not None and not descriptive:
                raise PublishedDataError(
                    f"{where}, column value: blank, but value_as_printed "
                    f"{shown(repr(row['value_as_printed']))} states {stated:g}"
                )
            continue
        try:
            value = float(row["value"])
        except ValueError:
            raise PublishedDataError(f"{where}: value {shown(repr(row['value']))} is not a number") from None
        if not math.isfinite(value):
            raise PublishedDataError(f"{where}: value {shown(repr(row['value']))} is not a finite number")
        if stated is None or not math.isclose(value, stated, rel_tol=1e-12, abs_tol=1e-12):
            raise PublishedDataError(
                f"{where}: value {shown(row['value'])} does not match what was printed, "
                f"{shown(repr(row['value_as_printed']))}"
            )
    frame["value"] = pd.to_numeric(frame["value"].replace("", None))
    return frame


def load_published(published_dir: Path | str, claim: str) -> PublishedClaim:
    """Load and validate every table of one claim; errors name the file and the row at fault. Nothing but
    PublishedDataError escapes."""
    directory = Path(published_dir) / claim
    try:
        return _load_published(directory, claim)
    except PublishedDataError:
        raise
    except RecursionError:
        raise PublishedDataError(f"{directory / 'provenance.yaml'}: nested too deeply") from None
    except (OSError, ValueError, TypeError, KeyError, AttributeError, IndexError, OverflowError) as exc:
        where = getattr(exc, "filename", None) or directory
        raise PublishedDataError(f"{shown(where)}: {type(exc).__name__}: {shown(' '.join(str(exc).split()))}") from None


def _load_published(directory: Path, claim: str) -> PublishedClaim:
    provenance_path = directory / "provenance.yaml"
    if not os.path.lexists(provenance_path):
        raise PublishedDataError(
            f"{shown(provenance_path)}: missing (no published data for claim {shown(repr(claim))})"
        )
    try:  # no link, no FIFO or device (which would block or never end), at most MAX_PROVENANCE_BYTES; the shared
        # loader refuses anchors and aliases (an alias bomb) and empty typed values, each in one line
        provenance = yamlsafe.load(read_text(provenance_path, MAX_PROVENANCE_BYTES))
    except UnsafeFileError as exc:
        raise PublishedDataError(str(exc)) from None
    except yamlsafe.YamlError as exc:
        raise PublishedDataError(f"{shown(provenance_path)}: {exc}") from None
    if not isinstance(provenance, dict) or "source" not in provenance or "tables" not in provenance:
        raise PublishedDataError(f"{provenance_path}: needs top-level 'source' and 'tables'")
    schemas.check(provenance, schemas.PROVENANCE, str(provenance_path), PublishedDataError)
    if provenance.get("claim", claim) != claim:
        raise PublishedDataError(
            f"{shown(provenance_path)}: claim: {yamlsafe.preview(provenance['claim'])} is not "
            f"{claim!r}, the claim its directory is named for"
        )

    listed = set(provenance["tables"])
    present = {p.name for p in directory.glob("*.csv")}
    if listed != present:
        raise PublishedDataError(
            f"{shown(provenance_path)}: tables listed {shown(sorted(listed))} differ from CSV files present "
            f"{shown(sorted(present))}"
        )

    tables = {}
    for filename, meta in provenance["tables"].items():
        frame = _read_table(directory / filename)
        rows = (meta or {}).get("rows") or {}
        ids = set(frame["id"])
        unquoted = sorted(ids - set(rows))
        if unquoted:
            raise PublishedDataError(
                f"{shown(provenance_path)}: {filename} row(s) without a quote: {shown(', '.join(unquoted))}"
            )
        orphans = sorted(set(rows) - ids)
        if orphans:
            raise PublishedDataError(
                f"{shown(provenance_path)}: quotes for rows not in {filename}: {shown(', '.join(map(str, orphans)))}"
            )
        frame["quote"] = frame["id"].map(lambda i: rows[i]["quote"])
        frame["token"] = frame["id"].map(lambda i: rows[i].get("token"))
        frame.attrs["description"] = (meta or {}).get("description", "")
        frame.attrs["path"] = str(directory / filename)
        tables[filename.removesuffix(".csv")] = frame
    return PublishedClaim(
        claim=claim,
        directory=directory,
        source=provenance["source"],
        tables=tables,
        not_transcribed=provenance.get("not_transcribed", []),
    )


def verify_against_source(published: PublishedClaim, seeds_dir: Path) -> list[str]:
    """Problems found checking every quote against the source document (empty list: all good). The source
    is read only from inside ``seeds_dir``: 'source.file: ../...' is a problem, not a file read."""
    seeds = Path(seeds_dir).resolve()
    source_path = Path(seeds_dir) / str(published.source.get("file", ""))
    if not source_path.resolve().is_relative_to(seeds) or source_path.resolve() == seeds:
        return [
            f"{published.directory / 'provenance.yaml'}: source.file {published.source.get('file')!r} is not a file "
            f"inside the seeds directory {seeds}"
        ]
    if not os.path.lexists(source_path):
        return [f"{shown(source_path)}: source document not found"]
    try:
        raw = read_bytes(source_path, MAX_SOURCE_BYTES)
    except UnsafeFileError as exc:
        return [str(exc)]
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return [f"{source_path}: not UTF-8 text (byte {exc.start})"]
    problems = []
    expected_sha = published.source.get("sha256")
    if expected_sha and hashlib.sha256(raw).hexdigest() != expected_sha:
        problems.append(f"{source_path}: sha256 differs from provenance (a different version of the document)")
    text = raw.decode("utf-8")
    for name, frame in published.tables.items():
        for _, row in frame.iterrows():
            where = f"{published.directory / (name + '.csv')} id {row['id']!r}"
            quote = row["quote"]
            if quote not in text:
                problems.append(f"{where}: quote not found verbatim in {source_path.name}: {quote!r}")
            if row["value_as_printed"] not in quote:
                problems.append(f"{where}: {row['value_as_printed']!r} does not occur in its quote {quote!r}")
            token = row["token"]
            if token is not None and not (isinstance(token, float) and math.isnan(token)):
                words = quote.split()
                word = words[int(token)].strip("()") if int(token) < len(words) else None
                if word != row["value_as_printed"]:
                    problems.append(
                        f"{where}: word {int(token)} of the quote is {word!r}, not {row['value_as_printed']!r}"
                    )
    return problems


# --- derived numbers ---------------------------------------------------------------------------


def rounding_bucket(printed: str) -> tuple[float, float]:
    """Values that print as ``printed`` when rounded to its precision (half-open in practice)."""
    value, half = parse_printed(printed), 0.5 * 10 ** -printed_decimals(printed)
    return value - half, value + half


def truncation_bucket(printed: str) -> tuple[float, float]:
    """Values that print as ``printed`` when truncated toward zero to its precision."""
    value, step = parse_printed(printed), 10 ** -printed_decimals(printed)
    return (value, value + step) if value >= 0 else (value - step, value)


def derived_range(func: Callable[..., float], printed_inputs: Mapping[str, str]) -> tuple[float, float, float]:
    """Recompute ``func`` from printed inputs: (from the printed values, lowest, highest) over every
    combination of each input's rounding bucket. Exact for functions monotone in each input,
    which covers the ratios and percent differences the documents derive."""
    names = list(printed_inputs)
    point = func(**{n: parse_printed(printed_inputs[n]) for n in names})
    corners = [
        func(**dict(zip(names, combo, strict=True)))
        for combo in itertools.product(*(rounding_bucket(printed_inputs[n]) for n in names))
    ]
    return point, min(corners), max(corners)


def _overlaps(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def check_derived(
    label: str, printed: str, func: Callable[..., float], printed_inputs: Mapping[str, str], formula: str
) -> dict:
    """One row of a derived-number check: is the printed derived value what its printed inputs give?"""
    point, low, high = derived_range(func, printed_inputs)
    rounds = _overlaps((low, high), rounding_bucket(printed))
    truncates = _overlaps((low, high), truncation_bucket(printed))
    if rounds:
        finding = "matches (rounded)"
    elif truncates:
        finding = "matches only if truncated, not rounded"
    else:
        finding = "does not match"
    return {
        "quantity": label,
        "formula": formula,
        "printed": printed,
        "recomputed": point,
        "recomputed_low": low,
        "recomputed_high": high,
        "difference": point - parse_printed(printed),
        "finding": finding,
    }
