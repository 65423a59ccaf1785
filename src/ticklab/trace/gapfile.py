"""The gap detector's output (tools/gapdet.c) as a sealed bundle keeps it: the numbers, not the text.

gapdet prints a header of ``# key: value`` lines and then one ``start_ns gap_ns`` line per gap it kept (up to a
million: 15 MB of text for a 5 s run on a slow clocksource, 2.6 MB even xz'd). The seal (``bundle.BundleWriter``) and
``ticklab bundle repack`` keep the same numbers as ``gaps.parquet``, xz'd (``gaps.parquet.xz``, a quarter of the
xz'd text), in place of ``stdout.txt``:

- a Parquet table (pyarrow) of two int64 columns, ``start_step_ns`` (each gap's start minus the previous gap's
  start; the first gap's: its start, so ``start_ns`` is their running sum) and ``gap_ns`` (each gap as printed).
  The steps are what makes it small: the starts themselves grow to 10^10 and xz finds little to share between them;
- the header's keys and values, in order, in the table's key-value metadata (``ticklab.gapdet.header``, JSON).

It is lossless: :func:`text` gives back gapdet's text byte for byte, and :func:`compact` packs a text only where it
does (and where the header's ``gaps_kept`` counts its lines, so a cut-off output stays the text it is). Another tool
reads it with ``xz -d gaps.parquet.xz`` and any Parquet reader; ``start_ns`` is the running sum of
``start_step_ns``. ``capture.workloads.read_gapdet`` reads either form.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from ..safefiles import shown
from . import rawfile

# numpy, pandas and pyarrow are imported in the functions that pack or read gaps: the bundle module imports this one,
# and a capture's dry run or a refused experiment is not to wait for them (issue 56)
if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

TEXT_NAME = "stdout.txt"  # where a run's extra keeps what gapdet printed
COMPACT_NAME = "gaps.parquet"  # its compact form, stored xz'd (gaps.parquet.xz)
COLUMNS = ("start_step_ns", "gap_ns")
HEADER_KEY = b"ticklab.gapdet.header"
FIRST_LINE = b"# gapdet: 1\n"
LARGEST = 10**18  # the text reader's bound: whole numbers of at most 18 digits
TEXT_LIMIT = 1 << 30  # gapdet's text read whole to compact it; -m 100000000 gaps would be ~4 GB (never compacted)


class GapFileError(ValueError):
    """A compact gap file that cannot be read; the message names the file."""


def is_gapdet_text(data: bytes) -> bool:
    return data.startswith(FIRST_LINE)


def _parse(data: bytes) -> tuple[list[tuple[str, str]], np.ndarray] | None:
    """The header's (key, value) pairs and the (n, 2) int64 rows of gapdet's text, or None where it is not gapdet's
    text in its own layout (``text`` then gives it back byte for byte)."""
    import numpy as np

    if not is_gapdet_text(data):
        return None
    try:
        lines = data.decode("ascii").split("\n")
    except UnicodeDecodeError:
        return None
    if lines[-1] != "":
        return None  # not ended by a newline: cut off, or not gapdet's
    pairs, at = [], 0
    while at < len(lines) - 1 and lines[at].startswith("#"):
        key, colon, value = lines[at][2:].partition(":")
        if not colon:
            return None
        pairs.append((key.strip(), value.strip()))
        at += 1
    numbers = " ".join(lines[at:-1]).split()
    if len(numbers) % 2:
        return None
    try:
        rows = np.array(numbers, dtype=np.int64).reshape(-1, 2)
    except (ValueError, OverflowError):
        return None
    if len(rows) and (rows.min() < 0 or rows.max() >= LARGEST):
        return None
    return pairs, rows


def text(pairs: list[tuple[str, str]], rows: np.ndarray) -> bytes:
    """gapdet's text for a header and its rows, as tools/gapdet.c prints it."""
    head = "".join(f"# {key}: {value}\n" for key, value in pairs)
    body = "".join(f"{start} {gap}\n" for start, gap in rows.tolist())
    return (head + body).encode("ascii")


def compact(data: bytes) -> bytes | None:
    """The Parquet bytes (not yet xz'd) holding gapdet's text ``data``, or None where ``data`` is not gapdet's text
    that they give back exactly, or its header's ``gaps_kept`` does not count its lines."""
    parsed = _parse(data)
    if parsed is None:
        return None
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    pairs, rows = parsed
    if dict(pairs).get("gaps_kept") != str(len(rows)) or text(pairs, rows) != data:
        return None
    starts = rows[:, 0]
    steps = np.diff(starts, prepend=np.int64(0)) if len(starts) else starts
    table = pa.table({"start_step_ns": pa.array(steps, pa.int64()), "gap_ns": pa.array(rows[:, 1], pa.int64())})
    table = table.replace_schema_metadata({HEADER_KEY: json.dumps([list(p) for p in pairs]).encode()})
    sink = pa.BufferOutputStream()
    # plain int64 values, no Parquet compression: xz, which the bundle applies to the whole file, packs them tighter
    pq.write_table(table, sink, compression="none", use_dictionary=False, write_statistics=False)
    return sink.getvalue().to_pybytes()


def read_compact(path: Path | str) -> tuple[list[tuple[str, str]], pd.DataFrame]:
    """The header's (key, value) pairs and the gaps (start_ns, gap_ns, int64) of a compact gap file (``gaps.parquet``
    or its .xz); GapFileError (or rawfile.RawFileError) naming the file where it is not one."""
    import numpy as np
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = rawfile.locate(path)
    data = rawfile.read_bytes(path)
    try:
        table = pq.read_table(pa.BufferReader(data))
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise GapFileError(f"{shown(path)}: not a readable Parquet file ({shown(str(exc), 120)})") from None
    if tuple(table.column_names) != COLUMNS or any(t != pa.int64() for t in table.schema.types):
        raise GapFileError(
            f"{shown(path)}: columns {shown(table.column_names, 120)}, expected int64 {', '.join(COLUMNS)}"
        )
    if any(table.column(name).null_count for name in COLUMNS):
        raise GapFileError(f"{shown(path)}: a column has empty values")
    try:
        pairs = json.loads((table.schema.metadata or {}).get(HEADER_KEY, b"null"))
        if not isinstance(pairs, list) or not all(
            isinstance(p, list) and len(p) == 2 and all(isinstance(s, str) for s in p) for p in pairs
        ):
            raise ValueError
    except ValueError:
        raise GapFileError(f"{shown(path)}: no gapdet header in its metadata ({HEADER_KEY.decode()})") from None
    steps = table.column("start_step_ns").to_numpy()
    gaps = table.column("gap_ns").to_numpy()
    starts = np.cumsum(steps, dtype=np.int64)
    for name, values in (("start_ns", starts), ("gap_ns", gaps)):
        bad = np.flatnonzero((values < 0) | (values >= LARGEST))
        if len(bad):
            raise GapFileError(
                f"{shown(path)}: gap {bad[0] + 1}: {name} {values[bad[0]]} is not a whole number below 10^18"
            )
    return [(key, value) for key, value in pairs], pd.DataFrame({"start_ns": starts, "gap_ns": gaps})


def compact_path(path: Path | str) -> Path | None:
    """Where the compact form of the gapdet output at ``path`` is, when only it is there: ``path`` itself if it names
    one, else ``gaps.parquet`` beside ``path`` when neither ``path`` nor its .xz exists; None otherwise."""
    path = Path(path)
    if path.name in (COMPACT_NAME, COMPACT_NAME + ".xz"):
        return path
    beside = path.with_name(COMPACT_NAME)
    return beside if not rawfile.present(path) and rawfile.present(beside) else None
