"""Turning what a workload printed into tidy metric rows.

Each parser reads the files a run left in its raw directory and returns rows of
``{"metric", "value", "unit"}``; it raises :class:`WorkloadOutputError` naming the file when the
output is not what the tool prints.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ..registry import registrar
from ..trace import gapfile, rawfile
from .experiment import WORKLOAD_TOOLS
from .process import WorkloadOutputError

# numpy and pandas are imported by the readers that need them: capture/session.py imports PARSERS, and a capture's dry
# run is not to wait for them (issue 56)
if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

Parser = Callable[[Path], list[dict]]
# one parser per workload an experiment may name (experiment.WORKLOAD_TOOLS, checked when it is loaded), each
# registered by @parses; every tool of the list has one (checked at the end of this module)
PARSERS: dict[str, Parser] = {}


# @parses("<tool>"): the decorated function is the parser of the tool's output (a name of experiment.WORKLOAD_TOOLS)
parses = registrar(
    PARSERS, WORKLOAD_TOOLS, "capture/workloads.py: parser for {name}: not in WORKLOAD_TOOLS, or a second one"
)


def _header(path: Path) -> tuple[dict, list[str]]:
    try:
        lines = rawfile.read_text(path).splitlines()
    except OSError as exc:
        raise WorkloadOutputError(f"{path}: cannot read ({exc.strerror or exc})") from exc
    except rawfile.RawFileError as exc:
        raise WorkloadOutputError(str(exc)) from exc
    except UnicodeDecodeError as exc:
        raise WorkloadOutputError(f"{path}: not text output (byte {exc.start} is not UTF-8)") from exc
    header = {}
    for line in lines:
        if line.startswith("# ") and ":" in line:
            key, _, value = line[2:].partition(":")
            header[key.strip()] = value.strip()
    return header, [line for line in lines if line and not line.startswith("#")]


_ROW_PATTERNS = {width: re.compile(r"\s*" + r"\s+".join([r"[0-9]{1,18}"] * width) + r"\s*") for width in (2, 3)}


def _whole_number_rows(path: Path, lines: list[str], width: int, what: str, form: str) -> np.ndarray:
    """``lines`` as an array of rows of ``width`` whole numbers below 10^18, or the error naming the first line that
    is not. (One pattern match a line: a 5,000-sample ftq.dat is read in milliseconds, not tenths of a second.)"""
    import numpy as np

    pattern = _ROW_PATTERNS[width]
    if not all(pattern.fullmatch(line) for line in lines):
        for number, row in enumerate((line.split() for line in lines), 1):
            if len(row) != width or not all(f.isdigit() and len(f) <= 18 for f in row):
                raise WorkloadOutputError(
                    f"{path}: {what} line {number} is {' '.join(row)[:80]!r}; {what} lines must be {form}"
                )
    return np.array(" ".join(lines).split(), dtype=np.int64).reshape(-1, width)


def _header_count(header: dict, key: str, path: Path) -> int:
    """A non-negative whole number from the header ('# samples: 5000')."""
    text = header.get(key)
    if text is None or not text.isdigit() or len(text) > 12:
        raise WorkloadOutputError(f"{path}: header '# {key}:' is {text!r}, not a whole number")
    return int(text)


def read_ftq(path: Path) -> tuple[dict, pd.DataFrame]:
    """ftq's header and samples (index, end_ns, count, warmup)."""
    import pandas as pd

    header, lines = _header(path)
    if header.get("ftq") != "1":
        raise WorkloadOutputError(f"{path}: not ftq output (no '# ftq: 1' header)")
    warmup, measured = _header_count(header, "warmup", path), _header_count(header, "samples", path)
    rows = _whole_number_rows(path, lines, 3, "sample", "'index end_ns count', three whole numbers below 10^18")
    samples = pd.DataFrame(rows, columns=["index", "end_ns", "count"])
    if len(samples) != warmup + measured:
        raise WorkloadOutputError(f"{path}: {len(samples)} samples, header says {warmup} + {measured}")
    if measured < 2:
        raise WorkloadOutputError(f"{path}: {measured} measured sample(s); a spread needs at least 2")
    samples["warmup"] = samples["index"] < warmup
    return header, samples


@parses("ftq")
def parse_ftq(directory: Path) -> list[dict]:
    _, samples = read_ftq(directory / "ftq.dat")
    counts = samples.loc[~samples["warmup"], "count"].to_numpy(dtype=float)
    peak = counts.max()
    if peak <= 0:
        raise WorkloadOutputError(f"{directory / 'ftq.dat'}: no quantum counted any work")
    return [
        {"metric": "ftq_count_mean", "value": counts.mean(), "unit": "work units/quantum"},
        {"metric": "ftq_count_stddev", "value": counts.std(ddof=1), "unit": "work units/quantum"},
        {"metric": "ftq_count_min", "value": counts.min(), "unit": "work units/quantum"},
        {"metric": "ftq_count_max", "value": peak, "unit": "work units/quantum"},
        {"metric": "ftq_noise_fraction", "value": 1 - counts.mean() / peak, "unit": "fraction"},
    ]


GAPDET_HEADER = ("threshold_ns", "duration_ns", "t0_ns", "reads", "read_ns_min", "read_ns_median", "gaps", "gaps_kept")


def read_gapdet(path: Path) -> tuple[dict, pd.DataFrame]:
    """gapdet's header (its counts as ints) and gaps (start_ns, gap_ns): what tools/gapdet.c wrote, read from its text
    (``path``, or its .xz) or, where a bundle keeps only its compact form beside it (gaps.parquet.xz,
    ticklab.trace.gapfile), from that: the same header and numbers either way."""
    import pandas as pd

    compact = gapfile.compact_path(path)
    if compact is not None:
        try:
            pairs, gaps = gapfile.read_compact(compact)
        except (gapfile.GapFileError, rawfile.RawFileError) as exc:
            raise WorkloadOutputError(str(exc)) from None
        return _gapdet_header(dict(pairs), len(gaps), rawfile.locate(compact)), gaps
    header, lines = _header(path)
    _gapdet_header(header, None, path)
    rows = _whole_number_rows(path, lines, 2, "gap", "'start_ns gap_ns', two whole numbers below 10^18")
    return _gapdet_header(header, len(rows), path), pd.DataFrame(rows, columns=["start_ns", "gap_ns"])


def _gapdet_header(header: dict, gap_count: int | None, path: Path) -> dict:
    """gapdet's header with its counts as ints, checked (and against the number of gaps read, where given)."""
    if header.get("gapdet") != "1":
        raise WorkloadOutputError(f"{path}: not gapdet output (no '# gapdet: 1' header)")
    values = {}
    for key in GAPDET_HEADER:
        text = header.get(key)
        if text is None or not text.isdigit() or len(text) > 18:
            raise WorkloadOutputError(f"{path}: header '# {key}:' is {text!r}, not a whole number below 10^18")
        values[key] = int(text)
    if values["duration_ns"] <= 0:
        raise WorkloadOutputError(f"{path}: header '# duration_ns:' is 0; a run must last")
    if gap_count is not None and gap_count != values["gaps_kept"]:
        raise WorkloadOutputError(f"{path}: {gap_count} gap lines, header says {values['gaps_kept']} kept")
    return {**header, **values}


CLOCKBENCH_COLUMNS = ("reads", "reads_per_s", "cost_mean_ns", "cost_p50_ns", "cost_p99_ns")


def read_clockbench(path: Path) -> tuple[dict, pd.DataFrame]:
    import pandas as pd

    header, lines = _header(path)
    if header.get("clockbench") != "1" or not lines:
        raise WorkloadOutputError(f"{path}: not clockbench output (no '# clockbench: 1' header or no rows)")
    names = lines[0].split()
    missing = [c for c in CLOCKBENCH_COLUMNS if c not in names]
    if missing or len(set(names)) != len(names):
        raise WorkloadOutputError(f"{path}: column line {lines[0][:80]!r} lacks {', '.join(missing) or 'unique names'}")
    table = []
    for number, line in enumerate(lines[1:], 1):
        try:
            row = [float(x) for x in line.split()]
        except ValueError:
            row = []
        if len(row) != len(names) or not all(math.isfinite(x) and x >= 0 for x in row):
            raise WorkloadOutputError(
                f"{path}: thread row {number} is {line[:80]!r}; each row must have "
                f"{len(names)} finite non-negative numbers"
            )
        table.append(row)
    rows = pd.DataFrame(table, columns=names)
    threads = _header_count(header, "threads", path)
    if len(rows) != threads or threads == 0:
        raise WorkloadOutputError(f"{path}: {len(rows)} thread rows, header says {threads}")
    if rows["reads"].sum() <= 0:
        raise WorkloadOutputError(f"{path}: no reads counted")
    return header, rows


@parses("clockbench")
def parse_clockbench(directory: Path) -> list[dict]:
    _, rows = read_clockbench(directory / "stdout.txt")
    return [
        {"metric": "reads_per_s_total", "value": rows["reads_per_s"].sum(), "unit": "reads/s"},
        {"metric": "reads_per_s_per_thread", "value": rows["reads_per_s"].mean(), "unit": "reads/s"},
        {
            "metric": "read_cost_mean_ns",
            "value": (rows["cost_mean_ns"] * rows["reads"]).sum() / rows["reads"].sum(),
            "unit": "ns",
        },
        {"metric": "read_cost_p50_ns", "value": rows["cost_p50_ns"].median(), "unit": "ns"},
        {"metric": "read_cost_p99_ns", "value": rows["cost_p99_ns"].max(), "unit": "ns"},
    ]


@parses("timejobs")
def parse_timejobs(directory: Path) -> list[dict]:
    """timejobs: total jobs/min over all threads (the AIM7-compute stand-in of the hpet guest experiment)."""
    path = directory / "stdout.txt"
    header, lines = _header(path)
    if header.get("timejobs") != "1" or "jobs_per_min" not in header:
        raise WorkloadOutputError(f"{path}: not timejobs output (no '# timejobs: 1' header or no jobs_per_min)")
    if len(lines) - 1 != _header_count(header, "threads", path):
        raise WorkloadOutputError(f"{path}: {len(lines) - 1} thread rows, header says {header['threads']}")
    for number, line in enumerate(lines[1:], 1):
        fields = line.split()
        if len(fields) != len(lines[0].split()) or not all(f.isdigit() and len(f) <= 18 for f in fields):
            raise WorkloadOutputError(
                f"{path}: thread row {number} is {line[:80]!r}; each row must have "
                f"{len(lines[0].split())} whole numbers"
            )
    return [
        {"metric": "jobs_per_min", "value": _finite(header["jobs_per_min"], path, "jobs_per_min"), "unit": "jobs/min"}
    ]


def _finite(text: str, path: Path, what: str) -> float:
    """A finite, non-negative number a tool printed; WorkloadOutputError naming the file otherwise."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise WorkloadOutputError(f"{path}: {what} {text[:40]!r} is not a finite non-negative number")
    return value


def _one_number(directory: Path, pattern: str, expected: str, metric: str, unit: str) -> list[dict]:
    path = directory / "stdout.txt"
    try:
        text = rawfile.read_text(path)
    except OSError as exc:
        raise WorkloadOutputError(f"{path}: cannot read ({exc.strerror or exc})") from exc
    except (rawfile.RawFileError, UnicodeDecodeError) as exc:
        raise WorkloadOutputError(f"{path}: not text output ({exc})") from exc
    found = re.search(pattern, text, re.M)
    if not found:
        raise WorkloadOutputError(f"{path}: no '{expected}' line")
    return [{"metric": metric, "value": _finite(found.group(1), path, expected), "unit": unit}]


@parses("hackbench")
def parse_hackbench(directory: Path) -> list[dict]:
    return _one_number(directory, r"^Time:\s*(\S+)\s*$", "Time: <seconds>", "runtime_s", "s")


@parses("tbench")
def parse_tbench(directory: Path) -> list[dict]:
    rows = _one_number(
        directory, r"^Throughput\s+([\d.]+)\s+MB/sec", "Throughput <n> MB/sec", "throughput_mb_s", "MB/s"
    )
    if rows[0]["value"] == 0:  # tbench measures after its warm-up; a run shorter than that reports 0
        raise WorkloadOutputError(
            f"{directory / 'stdout.txt'}: tbench reported 0 MB/sec (the run ended within "
            "tbench's warm-up: give it more seconds)"
        )
    return rows


@parses("kbuild")
def parse_kbuild(directory: Path) -> list[dict]:
    """kbuild (ticklab.lab.kbuild): the build's wall time and each lock event counted during it."""
    path = directory / "stdout.txt"
    header, _ = _header(path)
    if header.get("kbuild") != "1" or "build_seconds" not in header:
        raise WorkloadOutputError(f"{path}: not kbuild output (no '# kbuild: 1' header or no build_seconds)")
    rows = [{"metric": "build_time_s", "value": float(header["build_seconds"]), "unit": "s"}]
    if "cpus" in header:
        rows.append({"metric": "guest_vcpus", "value": float(header["cpus"]), "unit": "CPUs"})
    for key, value in header.items():
        if key.startswith("lock_event "):
            rows.append({"metric": "lockevent_" + key.split(" ", 1)[1], "value": float(value), "unit": "events"})
    return rows


if list(PARSERS) != list(WORKLOAD_TOOLS):
    raise ImportError(f"capture/workloads.py: parsers for {list(PARSERS)}; experiment.WORKLOAD_TOOLS: {WORKLOAD_TOOLS}")
