"""Issue 41 item 2, "a capture ends with its answer": `ticklab capture <claim>` prints, once its bundle is sealed, the
quantities the claim's source names as the sealed bundle holds them (per condition: median, range and n), what the
source printed beside them (or ticklab derived from it), the comparisons it could not test with the command that
would, and the report line; piped, it prints one line per run as each ends; on a terminal, a progress bar instead."""

import fcntl
import math
import os
import pty
import re
import statistics
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest
import yaml

from conftest import REPO, WAIT_BOUND_S
from ticklab.bundle import load_bundle
from ticklab.capture.requirements import tools_bin

pytestmark = pytest.mark.xdist_group("machine")

needs_tools = pytest.mark.skipif(not (tools_bin() / "clockbench").exists(), reason="tools not built: run 'make tools'")
RUN_LINE = re.compile(
    r"^(?P<run>run-\d{3}) \((?P<made>\d+) of (?P<planned>\d+)\) (?P<condition>.+?)(?P<warmup> \(warm-up\))?: "
    r"(?P<seconds>[\d.]+) s(?:, (?P<metric>\w+) (?P<value>[-\d.e+]+) (?P<unit>\S+))?$"
)
CONDITION = re.compile(r"^  (?P<condition>.+), (?P<runs>\d+) measured runs?:$")
QUANTITY = re.compile(
    r"^    (?P<says>.+): median (?P<median>[\d,.]+) (?P<unit>\S+) \(runs (?P<low>[\d,.]+)–(?P<high>[\d,.]+), "
    r"n=(?P<n>\d+); (?P<metric>[\w.-]+)\)$"
)
DERIVED = re.compile(
    r"^      derived \(not printed\): (?P<value>[\d,.]+)(?: %)? = the printed (?P<cost>[\d.]+) (?P<unit>\w+) "
    r"\((?P<quote>[\w/.-]+)\) × this host's (?P<rate>[\d,.]+)/s \((?P<metric>\w+), median of these runs\)$"
)


def three_digits_of(shown: str, value: float) -> bool:
    """``shown`` is ``value`` to three significant digits (so an answer line holds the bundle's number)."""
    shown = float(shown.replace(",", ""))
    return abs(shown - value) <= 0.5 * 10 ** (math.floor(math.log10(abs(value))) - 2) * (1 + 1e-9)


def answer_of(stdout: str) -> dict:
    """The answer's quantity lines by (condition, metric), each with the lines printed under it."""
    found, condition, current = {}, None, None
    for line in stdout.splitlines():
        if match := CONDITION.match(line):
            condition, current = match["condition"], None
        elif (match := QUANTITY.match(line)) and condition is not None:
            current = found[(condition, match["metric"])] = {**match.groupdict(), "under": []}
        elif line.startswith("      ") and current is not None:
            current["under"].append(line)
        elif not line.startswith("      "):
            current = None
    return found


def measured(bundle, condition: str, metric: str) -> list[float]:
    failed = {r.run for r in bundle.manifest.runs if r.status != "ok" or r.problem}
    rows = bundle.results[
        (bundle.results["condition"] == condition)
        & (bundle.results["metric"] == metric)
        & ~bundle.results["run"].isin(failed)
    ]
    return [float(v) for v in rows["value"]]


def assert_quantity_is_the_bundles(line: dict, values: list[float], scale: float = 1) -> None:
    values = [v * scale for v in values]
    assert int(line["n"]) == len(values) > 0, line
    assert three_digits_of(line["median"], statistics.median(values)), (line, values)
    assert three_digits_of(line["low"], min(values)) and three_digits_of(line["high"], max(values)), (line, values)


def assert_one_line_per_run(stdout: str, bundle) -> None:
    """Every run of the bundle has its one line, in the order it was made, naming its condition; a measured run's
    line holds its first headline metric as results.csv has it."""
    lines = [RUN_LINE.match(line) for line in stdout.splitlines() if line.startswith("run-") and RUN_LINE.match(line)]
    runs = bundle.manifest.runs
    assert [m["run"] for m in lines] == [r.run for r in runs], stdout
    metric = bundle.manifest.definition["answer"][0]["metric"]
    for number, (match, record) in enumerate(zip(lines, runs, strict=True), start=1):
        assert match["condition"] == record.condition and bool(match["warmup"]) == record.warmup, match.string
        assert int(match["made"]) == number and int(match["planned"]) == len(bundle.manifest.order)
        if record.warmup:
            continue
        assert match["metric"] == metric, match.string
        [value] = bundle.results[(bundle.results["run"] == record.run) & (bundle.results["metric"] == metric)]["value"]
        assert math.isclose(float(match["value"]), value, rel_tol=5e-4), (match.string, value)


def fake_experiment(directory: Path, claim: str = "nohz", **overrides) -> Path:
    definition = {
        "claim": claim,
        "name": "fake-answer",
        "description": "clock reads on a fake host, with an answer",
        "runs": 2,
        "warmup": 1,
        "timeout_s": 60,
        "seed": 7,
        "requires": [],
        "conditions": {"matrix": {"clocksource": "@clocksources", "threads": [1]}},
        "knobs": {"clocksource": "clocksource"},
        "workload": {"tool": "clockbench", "argv": ["{tools}/clockbench", "-t", "{threads}", "-s", "0.05"]},
        "answer": [
            {"metric": "read_cost_mean_ns", "says": "ns per clock read", "printed": ["tick_cost/tick_duration"]},
            {
                "metric": "reads_per_s_total",
                "says": "clock reads per second",
                "cost_at_rate": {"cost": "tick_cost/tick_duration", "rate": "reads_per_s_total"},
            },
        ],
    }
    definition.update(overrides)
    path = directory / f"{definition['name']}.yaml"
    path.write_text(yaml.safe_dump(definition, sort_keys=False, allow_unicode=True))
    return path


def fake_capture(claim: str, experiment: Path, fake_host: Path, tmp_path: Path, *words: str, **popen):
    argv = [
        sys.executable,
        "-m",
        "ticklab.cli",
        "capture",
        claim,
        "--experiment",
        str(experiment),
        "--root",
        str(fake_host),
        "--journal",
        str(tmp_path / "j.json"),
        "--out",
        str(tmp_path / "traces"),
        *words,
    ]
    return subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=WAIT_BOUND_S, **popen)


def the_bundle(out: Path):
    [path] = [p.parent for p in out.glob("*/*/*/manifest.json")]
    return load_bundle(path)


@pytest.mark.slow
@needs_tools
def test_a_piped_capture_says_each_run_and_ends_with_the_bundles_numbers_and_what_the_source_printed(
    fake_host, tmp_path
):
    done = fake_capture("nohz", fake_experiment(tmp_path), fake_host, tmp_path)
    assert done.returncode == 0, done.stderr
    bundle = the_bundle(tmp_path / "traces")
    assert_one_line_per_run(done.stdout, bundle)
    answer = answer_of(done.stdout)
    conditions = [c["name"] for c in bundle.manifest.conditions]
    assert {condition for condition, _ in answer} == set(conditions) and len(conditions) == 3
    for condition in conditions:
        cost = answer[(condition, "read_cost_mean_ns")]
        assert_quantity_is_the_bundles(cost, measured(bundle, condition, "read_cost_mean_ns"))
        assert cost["says"] == "ns per clock read" and cost["unit"] == "ns"
        # the row as the source printed it, labelled so, with the id verdicts quote it by
        assert cost["under"] == [
            '      printed in the source: "80us" = about 80 us (system thinkpad-t60p-x86_32, '
            "hz 1000; nohz/tick_cost/tick_duration)"
        ]
        reads = answer[(condition, "reads_per_s_total")]
        assert_quantity_is_the_bundles(reads, measured(bundle, condition, "reads_per_s_total"))
        [derived] = [DERIVED.match(line) for line in reads["under"]]
        rate = statistics.median(measured(bundle, condition, "reads_per_s_total"))
        assert derived and derived["quote"] == "nohz/tick_cost/tick_duration" and derived["cost"] == "80"
        assert three_digits_of(derived["rate"], rate) and three_digits_of(derived["value"], 80e-6 * rate)
    # what this capture did not test: every nohz comparison, under the command whose experiment has its conditions,
    # passing --out on so that the report's --data-dir finds them all
    out = str(tmp_path / "traces")
    lines = done.stdout.splitlines()
    lab = lines.index(f"    ticklab lab run nohz --out {out}   (QEMU guests: runners/nohz/guest-ftq.yaml)")
    assert lines[lab + 1] == "      nohz_full vs HZ=1000: FTQ work per quantum"
    # the fake host has no tracefs, so doctor says the boot plan cannot run here (issue 56): no command to paste
    boot = lines.index(
        "    not on this host: ticklab capture nohz --boot kexec cannot run here (tracefs: no tracefs (kernel without "
        "CONFIG_TRACING?); 'ticklab doctor' says more): runners/nohz/host-boot-ftq.yaml on a host that has it"
    )
    assert lines[boot + 1] == "      nohz_full vs tick on, this kernel's HZ: FTQ work per quantum (a boot each)"
    assert lines[-1] == f"  verdicts: ticklab report --data-dir {out} --out {out}/report --only 05-nohz"


@pytest.mark.slow
@needs_tools
def test_printed_rows_of_one_condition_stand_under_that_condition_and_a_comparison_measured_is_said_tested(
    fake_host, tmp_path
):
    experiment = fake_experiment(
        tmp_path,
        claim="hrtick",
        runs=1,
        warmup=0,
        conditions=[
            {"name": "hrtick-off", "hrtick": "off", "threads": 1},
            {"name": "hrtick-on", "hrtick": "on", "threads": 1},
        ],
        knobs={},
        answer=[
            {
                "metric": "reads_per_s_total",
                "says": "clock reads per second",
                "printed": ["hackbench/runtime_no_hrtick", "hackbench/runtime_hrtick"],
            },
            {"metric": "read_cost_mean_ns", "says": "ns per clock read"},
        ],
    )
    done = fake_capture("hrtick", experiment, fake_host, tmp_path)
    assert done.returncode == 0, done.stderr
    answer = answer_of(done.stdout)
    assert [line.split(" (")[0] for line in answer[("hrtick-off", "reads_per_s_total")]["under"]] == [
        '      printed in the source: "0.840s" = 0.84 s'
    ]
    assert [line.split(" (")[0] for line in answer[("hrtick-on", "reads_per_s_total")]["under"]] == [
        '      printed in the source: "0.481s" = 0.481 s'
    ]
    lines = done.stdout.splitlines()
    assert answer[("hrtick-on", "read_cost_mean_ns")]["under"] == []
    assert "  seed 002 prints no number for: ns per clock read" in lines  # said once, not under every condition
    tested = lines.index("  tested by this capture (the report gives the verdict):")
    assert lines[tested + 1] == "    premise: HRTICK on vs off without the series, hackbench -p -s 8 runtime"


@pytest.mark.slow
@needs_tools
def test_an_experiment_without_an_answer_says_what_it_recorded(fake_host, tmp_path):
    experiment = fake_experiment(tmp_path, claim="hpet", runs=1, warmup=0)
    definition = yaml.safe_load(experiment.read_text())
    del definition["answer"]
    experiment.write_text(yaml.safe_dump(definition))
    done = fake_capture("hpet", experiment, fake_host, tmp_path)
    assert done.returncode == 0, done.stderr
    assert (
        "  fake-answer names no headline quantity (no answer section); it recorded 3 measured run(s) of 3 "
        "condition(s) with 5 metric(s) in results.csv: read_cost_mean_ns, read_cost_p50_ns, read_cost_p99_ns, "
        "reads_per_s_per_thread, reads_per_s_total"
    ) in done.stdout.splitlines()
    # hpet has three lab experiments: the command names the one that has the comparison's conditions
    assert (
        f"    ticklab lab run hpet --experiment runners/hpet/guest-timejobs.yaml --out {tmp_path / 'traces'}   "
        "(QEMU guests: runners/hpet/guest-timejobs.yaml)"
    ) in done.stdout.splitlines()


@pytest.mark.slow
def test_a_published_row_the_answer_cannot_name_stops_the_capture_before_its_first_run(fake_host, tmp_path):
    experiment = fake_experiment(
        tmp_path,
        answer=[{"metric": "read_cost_mean_ns", "says": "ns per clock read", "printed": ["tick_cost/no_such_row"]}],
    )
    done = fake_capture("nohz", experiment, fake_host, tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [
        f"ticklab capture: {experiment}: answer[0].printed[0]: 'tick_cost/no_such_row' "
        "is no row of the published layer of nohz (<table>/<row id>, "
        "traces/published/nohz/)"
    ]
    assert not (tmp_path / "traces").exists()


@pytest.mark.slow
@needs_tools
def test_on_a_terminal_a_progress_bar_and_no_line_per_run(fake_host, tmp_path):
    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # a terminal's size, as a user's has
    argv = [
        sys.executable,
        "-m",
        "ticklab.cli",
        "capture",
        "nohz",
        "--experiment",
        str(fake_experiment(tmp_path)),
        "--root",
        str(fake_host),
        "--journal",
        str(tmp_path / "j.json"),
        "--out",
        str(tmp_path / "traces"),
    ]
    process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=terminal, stderr=terminal, cwd=REPO)
    os.close(terminal)
    shown = b""
    while True:  # until the capture closes the terminal (EIO): whatever it wrote, read as it comes
        try:
            chunk = os.read(controller, 65536)
        except OSError:
            break
        if not chunk:
            break
        shown += chunk
    os.close(controller)
    assert process.wait(timeout=WAIT_BOUND_S) == 0, shown.decode(errors="replace")
    text = shown.decode(errors="replace")
    assert "nohz/fake-answer:" in text and "9/9" in text  # tqdm's bar, counting the 9 runs
    assert not [line for line in text.splitlines() if RUN_LINE.match(line.strip())], text
    assert "  verdicts: ticklab report --data-dir" in text


@pytest.mark.slow
@needs_tools
@pytest.mark.skipif(
    os.geteuid() != 0 or not Path("/sys/kernel/tracing").is_dir(), reason="a real capture needs root and tracefs"
)
def test_a_real_nohz_capture_ends_with_the_tick_cost_the_bundle_holds_beside_seed_004s(tmp_path):
    """The new-user trial's command: `ticklab capture nohz --runs 2 --warmup 0`, piped, on this host."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    out = tmp_path / "traces"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "ticklab.cli",
            "capture",
            "nohz",
            "--runs",
            "2",
            "--warmup",
            "0",
            "--out",
            str(out),
            "--journal",
            str(state / "j.json"),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=WAIT_BOUND_S,
    )
    if "the host is held by" in done.stderr:
        pytest.skip(f"another capture holds the host: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    bundle = the_bundle(out)
    assert_one_line_per_run(done.stdout, bundle)
    answer = answer_of(done.stdout)
    per_tick = answer[("tick-on", "tick_us_median")]
    assert_quantity_is_the_bundles(per_tick, measured(bundle, "tick-on", "tick_us_median"))
    assert per_tick["unit"] == "us" and int(per_tick["n"]) == 2
    assert [line.split(" (")[0] for line in per_tick["under"]] == ['      printed in the source: "80us" = about 80 us']
    share = answer[("tick-on", "tick_time_fraction")]
    assert_quantity_is_the_bundles(share, measured(bundle, "tick-on", "tick_time_fraction"), scale=100)
    assert share["unit"] == "%"
    printed, derived_line = share["under"]
    assert printed.startswith('      printed in the source: "8% overhead" = 8 % (system thinkpad-t60p-x86_32, hz 1000')
    derived = DERIVED.match(derived_line)
    rate = statistics.median(measured(bundle, "tick-on", "tick_rate_hz"))
    assert derived and three_digits_of(derived["value"], 80e-6 * rate * 100), derived_line
    lines = done.stdout.splitlines()
    # each suggestion as doctor says of this host: the command, or what is missing here
    from ticklab.capture.experiment import boot_experiment_paths, experiment_paths, load_experiment
    from ticklab.doctor import suggestion_check

    missing = suggestion_check("/")
    boot = missing(load_experiment(boot_experiment_paths("nohz")[0]))
    [lab] = [missing(load_experiment(p)) for p in experiment_paths("nohz") if load_experiment(p).lab is not None]
    for words, lacks in (("ticklab capture nohz --boot kexec", boot), ("ticklab lab run nohz", lab)):
        shown = [line.strip().removeprefix("or: ") for line in lines if words in line]
        if lacks:
            assert any(line.startswith(f"not on this host: {words}") and f"({lacks};" in line for line in shown)
        else:
            assert any(line.startswith(f"{words} --out {out}") for line in shown), (words, shown)
    assert lines[-1] == f"  verdicts: ticklab report --data-dir {out} --out {out}/report --only 05-nohz"
