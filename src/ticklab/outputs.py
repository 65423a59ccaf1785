"""Writing what notebooks show into the report's output contract (docs/ARCHITECTURE.md, section 6):
figures/<claim>/<name>.png|.svg, tables/<claim>/<name>.csv|.md, verdicts/<claim>.csv, checks/<claim>.csv.
Every figure and table gets a JSON sidecar naming its caption and the files it came from."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Iterable, Sequence

import pandas as pd

from .paths import repo_root
from .checks import CHECK_COLUMNS
from .verdicts import VERDICT_COLUMNS, Verdict


def _relative(path: Path | str) -> str:
    path = Path(path).resolve()
    try:
        return str(path.relative_to(repo_root()))
    except ValueError:
        return str(path)


def plain_number(value) -> str:
    """A number as a reader wants it in a table: no scientific notation, four significant figures at most
    after the point, whole numbers whole; missing values as an em dash."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if float(value).is_integer() and abs(value) < 1e15:
        return f"{int(value):d}"
    decimals = max(0, 3 - math.floor(math.log10(abs(value))))
    return f"{value:.{decimals}f}"


def markdown_table(frame: pd.DataFrame, *, index: bool) -> str:
    """A table as Markdown: a multi-level index becomes ordinary columns (never tuples), numbers plain."""
    shown = frame.reset_index() if index and isinstance(frame.index, pd.MultiIndex) else frame
    keep_index = index and not isinstance(frame.index, pd.MultiIndex)
    shown = shown.apply(lambda column: column.map(plain_number) if column.dtype.kind in "fiu" else column)
    return shown.to_markdown(index=keep_index, disable_numparse=True)


class Outputs:
    """One claim's output writer; notebooks create one and hand it figures, tables and verdicts."""

    def __init__(self, output_dir: Path | str, claim: str):
        self.root = Path(output_dir)
        self.claim = claim

    def _sidecar(self, path: Path, kind: str, caption: str, sources: Iterable[Path | str]) -> None:
        meta = {"claim": self.claim, "kind": kind, "caption": caption,
                "sources": sorted({_relative(s) for s in sources})}
        if not meta["sources"]:
            raise ValueError(f"{path.name}: a {kind} must name the files it came from (sources)")
        path.with_suffix(".json").write_text(json.dumps(meta, indent=2) + "\n")

    def figure(self, name: str, fig, *, caption: str, sources: Sequence[Path | str]) -> Path:
        directory = self.root / "figures" / self.claim
        directory.mkdir(parents=True, exist_ok=True)
        png = directory / f"{name}.png"
        fig.savefig(png, dpi=120, bbox_inches="tight")
        fig.savefig(directory / f"{name}.svg", bbox_inches="tight")
        self._sidecar(png, "figure", caption, sources)
        return png

    def table(self, name: str, frame: pd.DataFrame, *, caption: str, sources: Sequence[Path | str]) -> Path:
        if frame.empty:
            raise ValueError(f"table {name!r} for {self.claim} is empty; refusing to write an empty output")
        directory = self.root / "tables" / self.claim
        directory.mkdir(parents=True, exist_ok=True)
        csv = directory / f"{name}.csv"
        has_index = frame.index.name is not None or not isinstance(frame.index, pd.RangeIndex)
        frame.to_csv(csv, index=has_index)
        markdown = markdown_table(frame, index=has_index)
        legend = frame.attrs.get("legend")
        text = f"**{caption}**\n\n{markdown}\n" + (f"\n{legend}\n" if legend else "")
        (directory / f"{name}.md").write_text(text)
        self._sidecar(csv, "table", caption, sources)
        return csv

    def verdicts(self, verdicts: Sequence[Verdict]) -> pd.DataFrame:
        if not verdicts:
            raise ValueError(f"{self.claim}: every claim notebook must state at least one verdict")
        frame = pd.DataFrame([v.as_row() for v in verdicts], columns=VERDICT_COLUMNS)
        directory = self.root / "verdicts"
        directory.mkdir(parents=True, exist_ok=True)
        frame.to_csv(directory / f"{self.claim}.csv", index=False)
        return frame


    def checks(self, frame: pd.DataFrame) -> pd.DataFrame:
        """The claim's condition checks (ticklab.checks.check_table); written even when empty, so the report can
        tell "nothing to check" from "not run"."""
        directory = self.root / "checks"
        directory.mkdir(parents=True, exist_ok=True)
        frame = frame[CHECK_COLUMNS]
        frame.to_csv(directory / f"{self.claim}.csv", index=False)
        return frame
