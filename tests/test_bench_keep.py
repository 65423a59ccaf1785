"""make bench BENCH_ARGS="--keep DIR": the benchmark keeps its traces in a directory the user made (mode 0755)."""

from __future__ import annotations

import lzma
import os
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

import ingest_speed  # noqa: E402

pytestmark = pytest.mark.xdist_group("machine")


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("trace-cmd") is None,
    reason="needs root and trace-cmd (the benchmark's steps change tracefs mounts)",
)
def test_a_keep_directory_of_mode_0755_is_used_not_refused(tmp_path):
    keep = tmp_path / "keep"
    keep.mkdir(mode=0o755)
    source = keep / "trace.dat"
    source.write_bytes(lzma.decompress((REPO / "tests" / "data" / "compressed" / "source-trace.dat.xz").read_bytes()))
    converted = ingest_speed.compressed(source, keep)
    assert converted == keep / "trace-zstd.dat" and ingest_speed.is_compressed(converted)
    assert sorted(p.name for p in keep.iterdir()) == ["trace-zstd.dat", "trace.dat"]  # no host state left in it
