"""Writing what notebooks show into the report's output contract (docs/ARCHITECTURE.md, section 6):
figures/<claim>/<name>.png|.svg, tables/<claim>/<name>.csv|.md, verdicts/<claim>.csv, checks/<claim>.csv.
Every figure and table gets a JSON sidecar naming its caption and the files it came from."""

from __future__ import annotations

import io
import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path

import pandas as pd

from ..paths import repo_root
from ..safefiles import OwnedDir
from .checks import CHECK_COLUMNS
from .pooling import POOLED, PooledVerdict, pooled_table
from .verdicts import VERDICT_COLUMNS, Verdict


def _relative(path: Path | str) -> str:
    path = Path(path).resolve()
    try:
        return str(path.relative_to(repo_root()))
    except ValueError:
        return str(path)


def plain_number(value) -> str:
    """A number as a reader wants it in a table: no scientific notation, whole numbers whole, missing values as an
    em dash. A number whose shortest exact decimal form has at most four digits after the point is shown in that
    form, never rounded (a transcribed 1032.8 s stays 1032.8, not 1033); only longer ones (ticklab's own
    arithmetic) are cut to four significant figures after the point."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if float(value).is_integer() and abs(value) < 1e15:
        return f"{int(value):d}"
    exact = repr(float(value))
    if "e" not in exact and len(exact.partition(".")[2]) <= 4:
        return exact
    decimals = max(0, 3 - math.floor(math.log10(abs(value))))
    return f"{value:.{decimals}f}"


def markdown_table(frame: pd.DataFrame, *, index: bool) -> str:
    """A table as Markdown: a multi-level index becomes ordinary columns (never tuples), numbers plain."""
    shown = frame.reset_index() if index and isinstance(frame.index, pd.MultiIndex) else frame
    keep_index = index and not isinstance(frame.index, pd.MultiIndex)
    shown = shown.apply(lambda column: column.map(plain_number) if column.dtype.kind in "fiu" else column)
    return shown.to_markdown(index=keep_index, disable_numparse=True)


def _show_in_notebook(fig, png: bytes) -> None:
    """In a notebook's kernel, the PNG just written is what the cell shows, and the figure is closed: the inline
    backend would otherwise draw it twice more at the cell's end (once to find its tight box, once to render)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is None or type(shell).__name__ != "ZMQInteractiveShell":
        return
    import matplotlib.pyplot as plt
    from IPython.display import Image, display

    display(Image(data=png, format="png"))
    plt.close(fig)


class Outputs:
    """One claim's output writer; notebooks create one and hand it figures, tables and verdicts."""

    def __init__(self, output_dir: Path | str, claim: str):
        self.root = Path(output_dir)
        self.claim = claim

    def _write(self, relative: str, data: bytes | str) -> Path:
        """Write root/relative whole (atomic replace), never through a link below the output directory."""
        with OwnedDir(self.root) as owned:
            return owned.write_atomic(relative, data.encode() if isinstance(data, str) else data)

    @staticmethod
    def _csv(frame: pd.DataFrame, *, index: bool) -> str:
        buffer = io.StringIO()
        frame.to_csv(buffer, index=index)
        return buffer.getvalue()

    def _sidecar(self, relative: str, kind: str, caption: str, sources: Iterable[Path | str]) -> None:
        meta = {
            "claim": self.claim,
            "kind": kind,
            "caption": caption,
            "sources": sorted({_relative(s) for s in sources}),
        }
        if not meta["sources"]:
            raise ValueError(f"{Path(relative).stem}: a {kind} must name the files it came from (sources)")
        self._write(str(Path(relative).with_suffix(".json")), json.dumps(meta, indent=2) + "\n")

    def figure(self, name: str, fig, *, caption: str, sources: Sequence[Path | str]) -> Path:
        relative = f"figures/{self.claim}/{name}"
        # savefig's bbox_inches="tight" lays the figure out once more for every file; laid out once here, the same
        # box (in inches, so the same at any dpi) serves both files.
        import matplotlib

        box = fig.get_tightbbox(fig.canvas.get_renderer()).padded(matplotlib.rcParams["savefig.pad_inches"])
        written, images = {}, {}
        for form, options in (("png", {"dpi": 120}), ("svg", {})):
            image = io.BytesIO()
            fig.savefig(image, format=form, bbox_inches=box, **options)
            images[form] = image.getvalue()
            written[form] = self._write(f"{relative}.{form}", images[form])
        self._sidecar(relative + ".png", "figure", caption, sources)
        _show_in_notebook(fig, images["png"])
        return written["png"]

    def table(self, name: str, frame: pd.DataFrame, *, caption: str, sources: Sequence[Path | str]) -> Path:
        if frame.empty:
            raise ValueError(f"table {name!r} for {self.claim} is empty; refusing to write an empty output")
        relative = f"tables/{self.claim}/{name}"
        has_index = frame.index.name is not None or not isinstance(frame.index, pd.RangeIndex)
        csv = self._write(relative + ".csv", self._csv(frame, index=has_index))
        markdown = markdown_table(frame, index=has_index)
        legend = frame.attrs.get("legend")
        text = f"**{caption}**\n\n{markdown}\n" + (f"\n{legend}\n" if legend else "")
        self._write(relative + ".md", text)
        self._sidecar(relative + ".csv", "table", caption, sources)
        return csv

    def verdicts(self, verdicts: Sequence[Verdict]) -> pd.DataFrame:
        if not verdicts:
            raise ValueError(f"{self.claim}: every claim notebook must state at least one verdict")
        frame = pd.DataFrame([v.as_row() for v in verdicts], columns=VERDICT_COLUMNS)
        self._write(f"verdicts/{self.claim}.csv", self._csv(frame, index=False))
        pooled = [v for v in verdicts if isinstance(v, PooledVerdict)]
        if pooled:  # tables/<claim>/pooled.csv only where a kind of setup had enough setups to pool
            sources = sorted({s for v in pooled for s in v.sources}) or [self.root / "verdicts" / f"{self.claim}.csv"]
            self.table(
                POOLED,
                pooled_table(pooled),
                caption="Pooled across machines: per comparison and kind of setup with at least 3 setups, the "
                "random-effects pool of their log ratios (modified Hartung-Knapp CI, prediction interval for a new "
                "machine, τ², I²) and its word",
                sources=sources,
            )
        return frame

    def checks(self, frame: pd.DataFrame) -> pd.DataFrame:
        """The claim's condition checks (ticklab.analysis.checks.check_table); written even when empty, so the report
        can tell "nothing to check" from "not run"."""
        frame = frame[CHECK_COLUMNS]
        self._write(f"checks/{self.claim}.csv", self._csv(frame, index=False))
        return frame
