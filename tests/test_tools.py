"""Our C tools: their output is self-describing and parses; bad arguments are refused with a reason."""

import subprocess

import pytest

from ticklab.capture.requirements import tools_bin
from ticklab.capture.workloads import (
    WorkloadOutputError,
    parse_clockbench,
    parse_ftq,
    parse_timejobs,
    read_clockbench,
    read_ftq,
    read_gapdet,
)

pytestmark = [
    pytest.mark.skipif(not (tools_bin() / "ftq").exists(), reason="tools not built: run 'make tools'"),
    pytest.mark.xdist_group("machine"),
]


def test_ftq_writes_its_header_and_one_line_per_sample(tmp_path):
    subprocess.run(
        [tools_bin() / "ftq", "-q", "100000", "-n", "50", "-w", "5", "-c", "0", "-o", tmp_path / "ftq.dat"], check=True
    )
    header, samples = read_ftq(tmp_path / "ftq.dat")
    assert (header["quantum_ns"], header["frequency_hz"], header["cpu"]) == ("100000", "10000.000000", "0")
    assert header["clock"] == "CLOCK_MONOTONIC" and header["kernel"] and header["clocksource"]
    assert len(samples) == 55 and samples["warmup"].sum() == 5
    # absolute deadlines: quantum i never ends before (i + 1) x quantum
    assert (samples["end_ns"] >= (samples["index"] + 1) * 100000).all()
    # A quantum may get no work at all when the CPU is busy elsewhere: on a loaded host every quantum after the
    # first can pass while ftq is descheduled (issue 27 item 18). The first quantum always counts work: it starts
    # at t0, before its deadline, and one unit is done before the clock is read again. So the parsed samples
    # start with it (no warm-up), and ftq_count_max > 0 whatever the load.
    subprocess.run(
        [tools_bin() / "ftq", "-q", "100000", "-n", "50", "-w", "0", "-c", "0", "-o", tmp_path / "ftq.dat"], check=True
    )
    _, samples = read_ftq(tmp_path / "ftq.dat")
    assert samples["count"].iloc[0] >= 1
    rows = {r["metric"]: r["value"] for r in parse_ftq(tmp_path)}
    assert 0 <= rows["ftq_count_min"] <= rows["ftq_count_mean"] <= rows["ftq_count_max"] and rows["ftq_count_mean"] > 0


def test_clockbench_reports_every_thread(tmp_path):
    out = subprocess.run(
        [tools_bin() / "clockbench", "-t", "2", "-s", "0.1", "-H", tmp_path / "h.txt"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    (tmp_path / "stdout.txt").write_text(out)
    header, rows = read_clockbench(tmp_path / "stdout.txt")
    assert header["threads"] == "2" and len(rows) == 2 and (rows["reads"] > 0).all()
    histogram = (tmp_path / "h.txt").read_text().splitlines()
    assert histogram[0] == "cost_ns count" and sum(int(row.split()[1]) for row in histogram[1:]) > 0
    metrics = {r["metric"] for r in parse_clockbench(tmp_path)}
    assert {"reads_per_s_total", "read_cost_p50_ns", "read_cost_p99_ns"} <= metrics


def test_timejobs_counts_jobs_per_minute_over_threads(tmp_path):
    out = subprocess.run(
        [tools_bin() / "timejobs", "-t", "2", "-s", "0.2", "-r", "10"], capture_output=True, text=True, check=True
    ).stdout
    (tmp_path / "stdout.txt").write_text(out)
    rows = [line.split() for line in out.splitlines() if line and not line.startswith("#")][1:]
    jobs_per_min = sum(int(jobs) * 60e9 / int(ns) for _, _, jobs, ns in rows)
    [metric] = parse_timejobs(tmp_path)
    assert metric["metric"] == "jobs_per_min" and metric["value"] == pytest.approx(jobs_per_min, rel=1e-3)
    (tmp_path / "stdout.txt").write_text(out.replace("# threads: 2", "# threads: 3"))
    with pytest.raises(WorkloadOutputError, match="stdout.txt: 2 thread rows, header says 3"):
        parse_timejobs(tmp_path)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["ftq", "-q", "5"], "ftq: quantum (-q) must be an integer in [1000, 1000000000], got '5'"),
        (["clockbench", "-t", "0"], "clockbench: threads (-t) must be 1..4096, got '0'"),
        (["clockbench", "-c", "sundial"], "clockbench: unknown clock 'sundial'"),
        (["gapdet", "-t", "0"], "gapdet: threshold (-t) must be an integer in [1, 1000000000], got '0'"),
    ],
)
def test_bad_arguments_are_refused(argv, message):
    result = subprocess.run([tools_bin() / argv[0], *argv[1:]], capture_output=True, text=True)
    assert result.returncode == 2 and message in result.stderr


def test_truncated_output_names_the_file(tmp_path):
    (tmp_path / "ftq.dat").write_text("# ftq: 1\n# samples: 10\n# warmup: 0\n0 100 5\n")
    with pytest.raises(WorkloadOutputError, match="ftq.dat: 1 samples, header says 0 \\+ 10"):
        read_ftq(tmp_path / "ftq.dat")


def test_gapdet_writes_its_calibration_and_every_gap_over_the_threshold(tmp_path):
    if not (tools_bin() / "gapdet").exists():
        pytest.skip("tools/bin/gapdet not built: run 'make tools'")
    subprocess.run(
        [tools_bin() / "gapdet", "-d", "50", "-t", "500", "-c", "0", "-o", tmp_path / "gaps.dat"], check=True
    )
    header, gaps = read_gapdet(tmp_path / "gaps.dat")
    assert header["clock"] == "CLOCK_MONOTONIC" and header["threshold_ns"] == 500 and header["reads"] > 0
    assert 0 < header["read_ns_min"] <= header["read_ns_median"]
    assert len(gaps) == header["gaps_kept"] == min(header["gaps"], 1_000_000)
    assert (gaps["gap_ns"] > 500).all() and gaps["start_ns"].is_monotonic_increasing
    assert int(header["gap_ns_total"]) == gaps["gap_ns"].sum()  # every gap kept: the total is theirs
    assert (gaps["start_ns"] + gaps["gap_ns"] <= header["duration_ns"]).all()  # each gap ends inside the run
