"""`ticklab ingest` imports what it needs and no more (issue 42 item 5): at ~100,000 events the CLI's start-up
(~0.2 s of imports) is most of its time against `trace-cmd report`. What it imports is read from sys.modules of a
fresh interpreter after the command ran (never timed here: benchmarks/ingest_speed.py times it)."""

import json
import os
import subprocess
import sys

import tracedat

# Nothing an ingest of a plain trace.dat needs: the analysis stack, the other layers, Arrow's compute functions
# (pyarrow.compute wraps ~280 functions with their docs when imported, ~40 ms; a cast to string imported it), the
# zstd decompressor, tempfile (only for CPU data beyond 16 MiB unpacked)
NOT_FOR_INGEST = (
    "pyarrow.compute",
    "pyarrow.dataset",
    "pandas",
    "scipy",
    "matplotlib",
    "ticklab.claims",
    "ticklab.analysis",
    "ticklab.report",
    "ticklab.capture",
    "ticklab.lab",
    "ticklab.host",
    "zstandard",
    "tempfile",
)
PROBE = """
import json, sys
from ticklab.cli import main
code = main(sys.argv[1:])
import pyarrow
print(json.dumps({"code": code, "modules": sorted(sys.modules), "pool": pyarrow.default_memory_pool().backend_name}),
      file=sys.stderr)
"""


def ingest_in_a_fresh_interpreter(*argv: str, env: dict | None = None) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, "ingest", *argv], capture_output=True, text=True, timeout=300, env=env
    )
    return json.loads(done.stderr.strip().splitlines()[-1])


def a_trace_with_strings(path):
    """A trace.dat v7 whose event has a char[16] field and a __data_loc string (what sched_switch's comm and a
    tracepoint's dynamic strings are), on two CPUs."""
    events = [(100, 1000 + n, f"task-{n % 5}", n, f"name-{n % 3}") for n in range(300)]
    return tracedat.write_v7(path, {0: tracedat.pages_for(events), 1: tracedat.pages_for(events, start=1050)})


def test_ingest_of_a_trace_with_strings_imports_only_what_it_needs(tmp_path):
    report = ingest_in_a_fresh_interpreter(
        str(a_trace_with_strings(tmp_path / "trace.dat")), "--out", str(tmp_path / "tables")
    )
    assert report["code"] == 0 and [p.name for p in (tmp_path / "tables").iterdir()] == ["fake__fake_event.parquet"]
    assert [name for name in NOT_FOR_INGEST if name in report["modules"]] == []


def test_ingest_writes_its_tables_through_the_c_allocator_unless_told_otherwise(tmp_path):
    """mimalloc, Arrow's default, kept 14-25 MB more resident than malloc writing a 600,000-event trace's tables;
    ARROW_DEFAULT_MEMORY_POOL, set by the user, still decides."""
    trace = a_trace_with_strings(tmp_path / "trace.dat")
    environment = {name: value for name, value in os.environ.items() if name != "ARROW_DEFAULT_MEMORY_POOL"}
    assert ingest_in_a_fresh_interpreter(str(trace), "--out", str(tmp_path / "a"), env=environment)["pool"] == "system"
    chosen = ingest_in_a_fresh_interpreter(
        str(trace), "--out", str(tmp_path / "b"), env={**environment, "ARROW_DEFAULT_MEMORY_POOL": "mimalloc"}
    )
    assert chosen["pool"] == "mimalloc"
