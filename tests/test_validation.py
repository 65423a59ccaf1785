"""Bad input gives one error naming the file and the field (issue 14, defects 8 and 9; deliverable 2)."""

import os
import subprocess
import sys

import pytest
import yaml

from conftest import REPO
from ticklab import paths
from ticklab.analysis.published import PublishedDataError, load_published, verify_against_source
from ticklab.bundle import BundleError, BundleWriter
from ticklab.capture.experiment import ExperimentError, load_experiment
from ticklab.capture.process import WorkloadOutputError
from ticklab.capture.workloads import parse_clockbench, parse_ftq, parse_hackbench, parse_timejobs
from ticklab.report.build import run_report
from ticklab.report.notebook import ParameterError, check_parameters

pytestmark = pytest.mark.xdist_group("machine")

FTQ = REPO / "runners/nohz/ftq.yaml"


def _experiment(tmp_path, **changes):
    data = yaml.safe_load(FTQ.read_text())
    for dotted, value in changes.items():
        target, *path = data, *dotted.split("__")
        keys = dotted.split("__")
        for key in keys[:-1]:
            target = target[int(key)] if isinstance(target, list) else target[key]
        target[keys[-1]] = value
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"runs": -1}, "runs: -1 is not >= 1"),
        ({"knobs": "clocksource"}, "knobs: 'clocksource' is not of type"),
        ({"runs": True}, "runs: True is not of type integer"),
        ({"runs": 10**9}, "runs: 1000000000 is not <= 10000"),
        ({"name": "../../etc/x"}, "name: '../../etc/x' is not of the allowed form"),
        ({"claim": "no/dz"}, "claim: 'no/dz' is not of the allowed form"),
        ({"timeout_s": "soon"}, "timeout_s: 'soon' is not of type number"),
        ({"trace__buffer_kb": -5}, "trace.buffer_kb: -5 is not >= 1"),
        ({"conditions": {"matrix": "threads"}}, "conditions.matrix: 'threads' is not of type object"),
        ({"conditions": [{"name": "a", "clients": {"per_cpu": "half"}}]}, "conditions"),
        ({"workload__argv": []}, "workload.argv: [] is not at least 1 item(s)"),
        # checked at load, not after each run has run (the run's results would fail, one run after another)
        ({"workload__tool": "hackbnech"}, "workload.tool 'hackbnech' is not a workload ticklab reads (known: ftq, "),
        ({"lab": {"smp": "two"}}, "lab.smp: 'two' is not of type integer"),
        ({"budget": {"time_s": 10, "max_runs": 10**8}}, "budget.max_runs: 100000000 is not <= 10000"),
        ({"requires": ["root", "bogus:thing"]}, "requires[1]: 'bogus:thing' is not of the allowed form"),
        # NaN passes every JSON Schema bound (timeout_s: .nan would turn the timeout off)
        ({"timeout_s": float("nan")}, "timeout_s: nan is not a finite number"),
        ({"lab": {"boot_timeout_s": float("inf")}}, "lab.boot_timeout_s: inf is not a finite number"),
        ({"budget": {"time_s": float("-inf")}}, "budget.time_s: -inf is not a finite number"),
        # kernel names become tracefs paths: a real capture wrote '1' to <outside>/x/enable (issue 55 item 6)
        (
            {"trace__events": ["irq:../../../../tmp/x"]},
            "trace.events[0]: 'irq:../../../../tmp/x' is not of the allowed",
        ),
        (
            {"trace__events": ["irq/irq_handler_entry"]},
            "trace.events[0]: 'irq/irq_handler_entry' is not of the allowed",
        ),
        ({"trace__events": ["..:enable"]}, "trace.events[0]: '..:enable' is not of the allowed form"),
        ({"trace__optional_events": ["timer:a b"]}, "trace.optional_events[0]: 'timer:a b' is not of the allowed"),
        ({"trace__functions": ["tick..x"]}, "trace.functions[0]: 'tick..x' is not of the allowed form"),
        ({"trace__symbols": ["tick_sched_timer", "a/b"]}, "trace.symbols[1]: 'a/b' is not of the allowed form"),
    ],
)
def test_a_bad_experiment_names_the_file_and_field(tmp_path, changes, message):
    path = _experiment(tmp_path, **changes)
    with pytest.raises(ExperimentError) as raised:
        load_experiment(path)
    text = str(raised.value)
    assert text.startswith(f"{path}: ") and message in text and "\n" not in text


def test_an_experiment_without_a_workload_tool_is_refused_at_load(tmp_path):
    data = yaml.safe_load(FTQ.read_text())
    del data["workload"]["tool"]
    path = tmp_path / "no-tool.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ExperimentError) as raised:
        load_experiment(path)
    assert (
        str(raised.value)
        == f"{path}: workload.tool missing (known: ftq, clockbench, timejobs, hackbench, tbench, kbuild)"
    )


def test_every_workload_an_experiment_may_name_has_its_parser():
    from ticklab.capture.experiment import WORKLOAD_TOOLS
    from ticklab.capture.workloads import PARSERS

    assert list(PARSERS) == list(WORKLOAD_TOOLS) and all(p.__name__ == f"parse_{t}" for t, p in PARSERS.items())


def test_an_argv_with_an_unbalanced_brace_is_one_line():
    from ticklab.capture.experiment import fill_argv

    with pytest.raises(ExperimentError, match=r"^x.yaml: argv item '-j\{nproc' is not a valid template"):
        fill_argv(["make", "-j{nproc"], {"nproc": 2}, "x.yaml")


@pytest.mark.parametrize(
    "content", [b"\xff\xfe\x00", b"[" * 5000, b"claim: [unclosed", b"- a\n- b\n", b"", b"a: &a [*a, *a]\n"]
)
def test_unreadable_experiment_yaml_is_one_line(tmp_path, content):
    path = tmp_path / "x.yaml"
    path.write_bytes(content)
    with pytest.raises(ExperimentError, match=f"^{path}: "):
        load_experiment(path)


@pytest.mark.parametrize(
    "path, message",
    [
        ("/dev/zero", "a device, not a regular file"),
        ("/tmp", "a directory, not a regular file"),
        ("/proc/self/status", "line 1, column 6: not valid YAML"),
    ],
)
def test_an_experiment_that_is_no_yaml_file_is_refused_in_bounded_memory(path, message):
    """/dev/zero as an experiment grew a capture to 10 GB before: st_size says nothing of devices or /proc files."""
    with pytest.raises(ExperimentError, match=f"^{path}: {message}"):
        load_experiment(path)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--runs", "-1"], "argument --runs: -1 is not from 1 to 10000"),
        (["--runs", "0"], "argument --runs: 0 is not from 1 to 10000"),
        (["--runs", "99999999999"], "is not from 1 to 10000"),
        (["--budget-s", "nan"], "argument --budget-s: nan is not from 0"),
        (["--warmup", "x"], "argument --warmup: 'x' is not a whole number"),
    ],
)
def test_run_counts_out_of_range_are_usage_errors(tmp_path, argv, message):
    proc = subprocess.run(
        [sys.executable, "-m", "ticklab.cli", "capture", "nohz", *argv, "--out", str(tmp_path), "--dry-run"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr
    assert not any(tmp_path.iterdir())


def test_capture_api_refuses_a_negative_run_count(tmp_path):
    from ticklab.capture.runner import CaptureOptions, capture

    with pytest.raises(ExperimentError, match="--runs -1: must be a whole number from 1 to 10000"):
        capture("nohz", CaptureOptions(runs=-1, out=tmp_path, dry_run=True, progress=False))


def test_bundle_names_with_path_separators_are_refused(tmp_path):
    with pytest.raises(BundleError, match="experiment '../escape' cannot name a directory"):
        BundleWriter(tmp_path / "out", "host", "nohz", "../escape", definition={}, host={})
    assert not (tmp_path / "escape").exists() and not (tmp_path / "out").exists()


def test_an_unwritable_out_is_one_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(BundleError, match="cannot create the bundle there"):
        BundleWriter(blocker / "traces", "host", "nohz", "ftq", definition={}, host={})


def _clockbench(tmp_path, rows):
    header = (
        "# clockbench: 1\n# threads: 2\n"
        "thread cpu reads elapsed_ns reads_per_s cost_mean_ns cost_p50_ns cost_p90_ns cost_p99_ns cost_max_ns\n"
    )
    (tmp_path / "stdout.txt").write_text(header + "\n".join(rows) + "\n")


@pytest.mark.parametrize(
    "second_row",
    [
        "1 1 1000 1000000000 1000.0",  # short: once NaN that halved the total
        "1 1 1000 1000000000 nan 20.0 20 30 40 50",
        "1 1 1000 1000000000 -1000.0 20.0 20 30 40 50",
        "1 1 1000 1000000000 inf 20.0 20 30 40 50",
    ],
)
def test_clockbench_rows_must_be_complete_finite_and_non_negative(tmp_path, second_row):
    _clockbench(tmp_path, ["0 0 1000 1000000000 1000.0 20.0 20 30 40 50", second_row])
    with pytest.raises(WorkloadOutputError, match="stdout.txt: thread row 2 is .* finite non-negative numbers"):
        parse_clockbench(tmp_path)


def test_an_oversized_ftq_integer_is_a_parse_error_not_an_abort(tmp_path):
    (tmp_path / "ftq.dat").write_text("# ftq: 1\n# samples: 1\n# warmup: 0\n0 100 99999999999999999999999\n")
    with pytest.raises(WorkloadOutputError, match="ftq.dat: sample line 1 is .* three whole numbers below 10\\^18"):
        parse_ftq(tmp_path)
    (tmp_path / "ftq.dat").write_text("# ftq: 1\n# samples: 99999999999999999999\n# warmup: 0\n0 100 5\n")
    with pytest.raises(WorkloadOutputError, match="header '# samples:' is '99999999999999999999', not a whole number"):
        parse_ftq(tmp_path)


@pytest.mark.parametrize("text", ["Time: 1.2.3\n", "Time: 1e999\n", b"\xff\xfeTime: 1\n"])
def test_one_number_outputs_are_checked(tmp_path, text):
    (tmp_path / "stdout.txt").write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(WorkloadOutputError, match="stdout.txt: "):
        parse_hackbench(tmp_path)


def test_timejobs_refuses_a_non_finite_rate(tmp_path):
    (tmp_path / "stdout.txt").write_text("# timejobs: 1\n# threads: 1\n# jobs_per_min: nan\nthread jobs\n0 5\n")
    with pytest.raises(WorkloadOutputError, match="jobs_per_min 'nan' is not a finite non-negative number"):
        parse_timejobs(tmp_path)


def test_the_published_loader_reads_nothing_outside_the_seeds_directory(tmp_path, published_copy):
    provenance = published_copy / "hpet" / "provenance.yaml"
    data = yaml.safe_load(provenance.read_text())
    data["source"]["file"] = "../../etc/hostname"
    provenance.write_text(yaml.safe_dump(data, allow_unicode=True))
    with pytest.raises(PublishedDataError, match=r"provenance\.yaml: source\.file: '\.\./\.\./etc/hostname' is not"):
        load_published(published_copy, "hpet")
    seeds = tmp_path / "seeds"
    seeds.mkdir()
    (tmp_path / "outside.txt").write_text("secret")
    published = load_published(paths.published_dir(), "hpet")
    published.source = {**published.source, "file": "../outside.txt"}
    [problem] = verify_against_source(published, seeds)
    assert "is not a file inside the seeds directory" in problem


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d["tables"].update({"../x.csv": None}), "tables: key '../x.csv' is not allowed here"),
        (lambda d: d["source"].update({"sha256": 5}), "source.sha256: 5 is not of type string"),
        (
            lambda d: next(iter(d["tables"].values()))["rows"].update({"x": {"quote": 3}}),
            "quote: 3 is not of type string",
        ),
        (lambda d: d.update(claim=["hpet"]), "claim: ['hpet'] is not of type string"),
        (lambda d: d.update(claim="nohz"), "claim: 'nohz' is not 'hpet', the claim its directory is named for"),
    ],
)
def test_provenance_of_the_wrong_shape_names_the_field(published_copy, edit, message):
    provenance = published_copy / "hpet" / "provenance.yaml"
    data = yaml.safe_load(provenance.read_text())
    edit(data)
    provenance.write_text(yaml.safe_dump(data, allow_unicode=True))
    with pytest.raises(PublishedDataError, match=f"^{provenance}: .*"):
        load_published(published_copy, "hpet")
    try:
        load_published(published_copy, "hpet")
    except PublishedDataError as exc:
        assert message in str(exc)


@pytest.mark.parametrize("content", [b"\xff\xfe", b"source: [", b"[" * 3000])
def test_unreadable_provenance_is_one_line(published_copy, content):
    (published_copy / "hpet" / "provenance.yaml").write_bytes(content)
    with pytest.raises(PublishedDataError, match="provenance.yaml: "):
        load_published(published_copy, "hpet")


@pytest.mark.parametrize("name", ["provenance.yaml", "aim7_compute.csv"])
def test_a_fifo_in_the_published_layer_is_refused_without_blocking(published_copy, name):
    path = published_copy / "hpet" / name
    assert path.is_file()
    path.unlink()
    os.mkfifo(path)
    with pytest.raises(PublishedDataError, match=f"^{path}: a FIFO, not a regular file; refused$"):
        load_published(published_copy, "hpet")


@pytest.mark.parametrize(
    "values, message",
    [
        ({"alpha": "abc"}, "alpha: 'abc' is not of type number"),
        ({"alpha": 1.5}, "alpha: 1.5 is not < 1"),
        ({"alpha": 0}, "alpha: 0 is not > 0"),
        ({"n_boot": 10.5}, "n_boot: 10.5 is not of type integer"),
        ({"seed": -1}, "seed: -1 is not >= 0"),
        ({"alpha": float("nan")}, "alpha: nan is not a finite number"),
    ],
)
def test_notebook_parameters_are_checked(values, message):
    with pytest.raises(ParameterError, match=f"^01-hpet.ipynb: {message}"):
        check_parameters({"alpha": 0.05, "n_boot": 1000, "seed": 0, **values}, "01-hpet.ipynb")


def test_report_refuses_bad_parameters_before_running_anything(tmp_path):
    log = []
    assert (
        run_report(
            tmp_path / "out",
            data_dir=paths.traces_dir(),
            published_dir=paths.published_dir(),
            parameters={"alpha": "abc"},
            log=log.append,
        )
        == 2
    )
    assert log == ["error: ticklab report parameters: alpha: 'abc' is not of type number"]
    assert not (tmp_path / "out").exists()


def test_a_non_finite_metric_makes_the_run_a_problem_not_a_nan_row(tmp_path, monkeypatch):
    from ticklab.capture import session

    experiment = load_experiment(REPO / "runners/hrtick/hackbench.yaml")
    experiment.trace = None
    monkeypatch.setitem(
        session.PARSERS, "hackbench", lambda _: [{"metric": "runtime_s", "value": float("nan"), "unit": "s"}]
    )
    rows, problem = session.run_results(experiment, tmp_path, {"status": "ok"}, {})
    assert rows == [] and "metric(s) runtime_s not finite" in problem


# -- issue 27, item 13: experiment YAML that reached a traceback -----------------------------------------------

ACPI_IDLE = REPO / "runners/acpi-idle/tbench.yaml"


@pytest.mark.parametrize(
    "edit, message",
    [
        # PyYAML's int() raises ValueError (over 4300 digits) outside the YAML error handler
        (
            lambda t: t.replace("seed: 20261121", "seed: " + "1" * 5000),
            "seed: !!int value '1111111111111111111111111111111111111111… (5000 characters)' cannot be read "
            "(a number of thousands of digits)",
        ),
        # in hex it loads (no digit limit for base 16): refused by size, and the message does not try to print it
        (
            lambda t: t.replace("seed: 20261121", "seed: 0x" + "f" * 5000),
            "seed: an integer of about 6021 digits is too large",
        ),
        (lambda t: t.replace("seed: 20261121", "seed: 18446744073709551616"), "seed: 18446744073709551616 is not <= "),
        # a non-string key: sorting and joining the unknown keys raised TypeError
        (lambda t: t + "1: x\n", "key 1 is not a string (quote it)"),
        (
            lambda t: t.replace("  params: {seconds: 30}", "  params: {seconds: 30, on: 1}"),
            "workload.params: key True is not a string",
        ),
        # a trace without events: KeyError 'events' in the dry run
        (lambda t: t + "trace: {buffer_kb: 1024}\n", "trace: 'events' is missing"),
        # idle: shallow: IndexError in apply_knobs when the run applied it
        (
            lambda t: t.replace('idle: "@deepest_disabled"', "idle: shallow"),
            "conditions[1].idle: 'shallow' is not an idle config (all, max=<cpuidle state>",
        ),
        (
            lambda t: t.replace('idle: "@deepest_disabled"', "idle: max="),
            "conditions[1].idle: 'max=' is not an idle config",
        ),
        (
            lambda t: t.replace('idle: "@deepest_disabled"', "idle: [all, 3]"),
            "conditions[1].idle: 3 is not an idle config",
        ),
    ],
)
def test_issue27_experiment_yaml_that_raised_is_one_line(tmp_path, edit, message):
    path = tmp_path / "tbench.yaml"
    path.write_text(edit(ACPI_IDLE.read_text()))
    with pytest.raises(ExperimentError) as raised:
        load_experiment(path)
    text = str(raised.value)
    assert text.startswith(f"{path}: ") and message in text and "\n" not in text and len(text) < 400, text


def test_issue27_idle_configs_of_every_form_load(tmp_path):
    text = ACPI_IDLE.read_text().replace('idle: "@deepest_disabled"', 'idle: [all, "max=C1", "@idle_configs"]')
    path = tmp_path / "tbench.yaml"
    path.write_text(text)
    assert load_experiment(path).knobs == {"idle": "idle_config"}


class _IdleHost:
    def __init__(self):
        self.disabled = []

    def set_cpuidle_state(self, state, disabled):
        self.disabled.append(state)


@pytest.mark.parametrize("value, disabled", [("all", []), ("max=POLL", ["C1", "C2"]), ("max=C2", [])])
def test_issue27_an_idle_config_disables_the_deeper_states(value, disabled):
    from ticklab.capture.execute import apply_knobs
    from ticklab.capture.experiment import Condition

    experiment = load_experiment(ACPI_IDLE)
    host = _IdleHost()
    apply_knobs(
        host,
        experiment,
        Condition("c", {"idle": value}),
        {"online_cpus": [0, 1], "cpuidle": {"states": [{"name": "POLL"}, {"name": "C1"}, {"name": "C2"}]}},
    )
    assert host.disabled == disabled


@pytest.mark.parametrize("value", ["shallow", "max=C9", "max="])
def test_issue27_an_idle_config_this_host_cannot_apply_is_one_line(value):
    """idle: shallow raised IndexError in apply_knobs, max=C9 ValueError (a state this host does not have)."""
    from ticklab.capture.execute import apply_knobs
    from ticklab.capture.experiment import Condition

    experiment = load_experiment(ACPI_IDLE)
    host = _IdleHost()
    with pytest.raises(
        ExperimentError,
        match=rf"tbench.yaml: knobs.idle: idle config '{value}' names no cpuidle "
        r"state of this host \(states: POLL, C1\)$",
    ):
        apply_knobs(
            host,
            experiment,
            Condition("c", {"idle": value}),
            {"online_cpus": [0, 1], "cpuidle": {"states": [{"name": "POLL"}, {"name": "C1"}]}},
        )
    assert host.disabled == []
