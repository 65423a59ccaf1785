"""One list per fact (issue 43): the names an experiment and the command line accept come from the registry that
owns them, so adding to a registry is the whole change. Each test adds a name to a registry and sees the experiment
schema and the CLI accept it, and refuse it before."""

import re
from pathlib import Path

import pytest
import yaml

from conftest import REPO
from ticklab import registry
from ticklab.capture import session, tracing
from ticklab.capture.experiment import ExperimentError, load_experiment
from ticklab.cli import build_parser
from ticklab.trace import ingest, tracemetrics

FTQ = REPO / "runners/nohz/ftq.yaml"


def _experiment(tmp_path, trace_metrics=None, lab_backend=None):
    data = yaml.safe_load(FTQ.read_text())
    if trace_metrics is not None:
        data["trace"]["metrics"] = trace_metrics
    if lab_backend is not None:
        data["lab"] = {"backend": lab_backend}
    path = tmp_path / "registry.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_metric_set_added_to_the_registry_is_one_an_experiment_may_name(tmp_path, monkeypatch):
    path = _experiment(tmp_path, trace_metrics="softirq")
    with pytest.raises(ExperimentError, match=r"trace.metrics: 'softirq' is not one of \['tick', 'hrtimer'\]$"):
        load_experiment(path)
    monkeypatch.setitem(registry.METRIC_SET_EVENTS, "softirq", ("irq:softirq_raise", "irq:softirq_exit"))
    assert load_experiment(path).trace["metrics"] == "softirq"
    assert load_experiment(path).trace["events"] == ["irq:softirq_raise", "irq:softirq_exit"]  # the set's


def test_the_metric_sets_a_run_can_get_are_the_named_ones_each_its_function():
    assert list(tracemetrics.METRIC_SETS) == list(registry.METRIC_SET_EVENTS)
    assert all(f.__name__ == f"{name}_metrics" for name, f in tracemetrics.METRIC_SETS.items())


def test_trace_metrics_may_name_several_sets_each_from_the_registry(tmp_path):
    assert load_experiment(_experiment(tmp_path, trace_metrics=["tick", "hrtimer"])).trace["metrics"] == [
        "tick",
        "hrtimer",
    ]
    with pytest.raises(ExperimentError, match=r"trace.metrics\[1\]: 'hrtimr' is not one of"):
        load_experiment(_experiment(tmp_path, trace_metrics=["tick", "hrtimr"]))
    with pytest.raises(ExperimentError, match=r"trace.metrics: \['tick', 'tick'\] has non-unique elements"):
        load_experiment(_experiment(tmp_path, trace_metrics=["tick", "tick"]))


def test_a_tracing_backend_added_to_the_registry_is_accepted_by_the_schema_and_the_cli(tmp_path, monkeypatch, capsys):
    path = _experiment(tmp_path, lab_backend="ebpf")
    with pytest.raises(ExperimentError, match=r"lab.backend: 'ebpf' is not one of \['auto', 'trace-cmd', 'tracefs'\]"):
        load_experiment(path)
    for argv in (["capture", "nohz", "--backend", "ebpf"], ["lab", "run", "nohz", "--backend", "ebpf"]):
        with pytest.raises(SystemExit):
            build_parser().parse_args(argv)
        assert "invalid choice: 'ebpf' (choose from 'auto', 'trace-cmd', 'tracefs')" in capsys.readouterr().err

    monkeypatch.setattr(registry, "TRACING_BACKENDS", (*registry.TRACING_BACKENDS, "ebpf"))
    assert load_experiment(path).lab["backend"] == "ebpf"
    assert build_parser().parse_args(["capture", "nohz", "--backend", "ebpf"]).backend == "ebpf"
    assert build_parser().parse_args(["lab", "run", "nohz", "--backend", "ebpf"]).backend == "ebpf"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["capture", "--help"])
    assert "--backend {auto,trace-cmd,tracefs,ebpf}" in capsys.readouterr().out


def test_each_backend_named_is_a_recorder_of_that_name():
    assert list(tracing.RECORDERS) == list(registry.TRACING_BACKENDS)
    assert all(cls.backend == name for name, cls in tracing.RECORDERS.items())
    for name in registry.TRACING_BACKENDS:  # each holds what it is given as the others do (their base, Recorder)
        made = tracing.recorder(
            name, None, ["a:b"], "d", buffer_kb=8, symbols=["s"], functions=["f"], optional_events=["o:p"], clock="mono"
        )
        assert isinstance(made, tracing.Recorder) and made.backend == name
        held = (made.events, made.directory, made.buffer_kb, made.symbols, made.functions, made.optional_events)
        assert held == (["a:b"], Path("d"), 8, ["s"], ["f"], ["o:p"])
        assert (made.absent_events, made.clock, made.result) == ([], "mono", None)


def test_boot_modes_and_accelerators_are_the_registrys_in_the_cli_plans_and_schema(tmp_path, monkeypatch, capsys):
    from ticklab.host import plan_state

    assert plan_state.MODES == registry.BOOT_MODES
    assert plan_state.PLAN_SCHEMA["properties"]["mode"]["enum"] == list(registry.BOOT_MODES)
    monkeypatch.setattr(registry, "BOOT_MODES", (*registry.BOOT_MODES, "pxe"))
    monkeypatch.setattr(registry, "ACCELERATORS", (*registry.ACCELERATORS, "hvf"))
    assert build_parser().parse_args(["capture", "nohz", "--boot", "pxe"]).boot == "pxe"
    assert build_parser().parse_args(["lab", "run", "nohz", "--accel", "hvf"]).accel == "hvf"
    data = yaml.safe_load(FTQ.read_text())
    data["lab"] = {"accel": "hvf"}
    path = tmp_path / "accel.yaml"
    path.write_text(yaml.safe_dump(data))
    assert load_experiment(path).lab["accel"] == "hvf"
    monkeypatch.undo()
    with pytest.raises(ExperimentError, match=r"lab.accel: 'hvf' is not one of \['any', 'auto', 'kvm', 'tcg'\]"):
        load_experiment(path)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["lab", "run", "nohz", "--accel", "hvf"])
    assert "invalid choice: 'hvf' (choose from 'auto', 'kvm', 'tcg')" in capsys.readouterr().err


def test_a_tick_rate_is_a_lab_kernel_variant_and_an_unknown_one_is_one_line(capsys):
    from ticklab.cli import main

    assert main(["lab", "build-kernel", "--hz", "300", "--no-progress"]) != 0
    err = capsys.readouterr().err
    assert err == (
        "ticklab lab build-kernel: kernel/configs/hz300.config: no such lab kernel variant (have: hz1000, hz250)\n"
    )


def test_compare_formats_are_the_registrys_in_the_cli_and_the_writer(monkeypatch, capsys):
    from ticklab.report.compare import CompareError, render

    with pytest.raises(SystemExit):
        build_parser().parse_args(["compare", "a", "b", "--format", "html"])
    assert "invalid choice: 'html' (choose from 'text', 'csv', 'md', 'json')" in capsys.readouterr().err
    with pytest.raises(CompareError, match=r"^--format 'html': choose one of text, csv, md, json$"):
        render(None, "html")
    monkeypatch.setattr(registry, "COMPARE_FORMATS", (*registry.COMPARE_FORMATS, "html"))
    assert build_parser().parse_args(["compare", "a", "b", "--format", "html"]).format == "html"


def _ran(tmp_path, monkeypatch, metric_sets: dict, named):
    """run_results of one finished run whose workload gave one row, its trace read by each named set."""
    monkeypatch.setattr(tracemetrics, "METRIC_SETS", metric_sets)  # run_results imports both when it is called
    monkeypatch.setattr(ingest, "read_trace", lambda directory: f"trace at {directory.name}")
    monkeypatch.setitem(session.PARSERS, "ftq", lambda run_dir: [{"metric": "ftq_work", "value": 1, "unit": "count"}])
    experiment = load_experiment(FTQ)
    monkeypatch.setattr(experiment, "trace", {**experiment.trace, "metrics": named})
    record = {"run": "r1", "status": "ok", "trace": {"directory": "trace"}, "argv": ["ftq"]}
    return session.run_results(experiment, tmp_path / "r1", record, {})


def test_a_run_gets_the_rows_of_every_set_its_experiment_names_in_order(tmp_path, monkeypatch):
    sets = {
        "one": lambda trace, values: [{"metric": "a", "value": 2, "unit": "Hz"}],
        "two": lambda trace, values: [{"metric": "b", "value": 3, "unit": trace}],
    }
    rows, problem = _ran(tmp_path, monkeypatch, sets, ["two", "one"])
    assert problem is None
    assert [(r["metric"], r["value"], r["unit"]) for r in rows] == [
        ("ftq_work", 1.0, "count"),
        ("b", 3.0, "trace at trace"),
        ("a", 2.0, "Hz"),
    ]
    rows, problem = _ran(tmp_path, monkeypatch, sets, "one")
    assert problem is None and [r["metric"] for r in rows] == ["ftq_work", "a"]


def test_two_sets_giving_one_metric_leave_the_run_without_results_and_say_which(tmp_path, monkeypatch):
    sets = {name: (lambda trace, values: [{"metric": "rate_hz", "value": 1, "unit": "Hz"}]) for name in ("x", "y")}
    rows, problem = _ran(tmp_path, monkeypatch, sets, ["x", "y"])
    assert rows == []
    assert problem == f"{tmp_path / 'r1'}: metric(s) rate_hz given twice (the workload's and trace.metrics' sets)"


# a choice made by comparing a boot mode's name (mode == "kexec", mode in ("kexec", ...), case "grub":)
_MODE_SWITCH = re.compile(
    r"""(?:==|!=)\s*['"](?:kexec|grub|manual)['"]|\bin\s*[(\[{]\s*['"](?:kexec|grub|manual)['"]|"""
    r"""\bcase\s+['"](?:kexec|grub|manual)['"]"""
)


def test_no_choice_is_made_on_a_boot_modes_name_outside_the_boot_mode_objects():
    package = REPO / "src/ticklab"
    found = [
        f"{path.relative_to(package)}:{number}: {line.strip()}"
        for path in sorted(package.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if _MODE_SWITCH.search(line.split("#", 1)[0])
    ]
    assert found == []


def test_each_boot_mode_is_one_object_and_an_unknown_one_is_refused_by_name(tmp_path):
    from ticklab.host import boot_loaders, plan_engine
    from ticklab.host.plan_state import BootRun, PlanError

    assert list(boot_loaders.BOOT_MODES) == list(registry.BOOT_MODES)
    assert all(isinstance(mode, boot_loaders.BootMode) for mode in boot_loaders.BOOT_MODES.values())
    assert {name: mode.name for name, mode in boot_loaders.BOOT_MODES.items()} == {n: n for n in registry.BOOT_MODES}
    with pytest.raises(PlanError, match=r"^--boot pxe: one of kexec, grub, manual$"):
        boot_loaders.boot_mode("pxe")
    with pytest.raises(PlanError, match=r"^--boot pxe: one of kexec, grub, manual$"):
        plan_engine.create([BootRun("run-001", "a", "running", "ro")], mode="pxe", bundle=tmp_path, root=tmp_path)
    assert not (tmp_path / "var").exists()  # refused before anything was looked at or made


def test_the_accelerators_are_known_in_the_registry_alone():
    package = REPO / "src/ticklab"
    named = re.compile(r"""['"](?:kvm|tcg)['"]""")
    found = [
        f"{path.relative_to(package)}:{number}: {line.strip()}"
        for path in sorted(package.rglob("*.py"))
        if path.name != "registry.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if named.search(line.split("#", 1)[0])
    ]
    assert found == []
    assert [registry.accelerator(name).cpu for name in registry.ACCELERATORS] == ["host", "max"]
    with pytest.raises(ValueError, match=r"^--accel 'hvf': choose one of kvm, tcg$"):
        registry.accelerator("hvf")


def test_parsers_and_metric_sets_are_registered_by_decorator_each_under_a_name_of_its_list():
    from ticklab.capture import workloads
    from ticklab.capture.experiment import WORKLOAD_TOOLS

    package = REPO / "src/ticklab"
    assert [str(p.relative_to(package)) for p in sorted(package.rglob("*.py")) if "globals()[" in p.read_text()] == []
    assert list(workloads.PARSERS) == list(WORKLOAD_TOOLS)
    assert list(tracemetrics.METRIC_SETS) == list(registry.METRIC_SET_EVENTS)
    with pytest.raises(ImportError, match=r"metric set 'softirq': not in the registry, or a second one"):
        tracemetrics.metric_set("softirq")(lambda trace, values: [])
    with pytest.raises(ImportError, match=r"metric set 'tick': not in the registry, or a second one"):
        tracemetrics.metric_set("tick")(lambda trace, values: [])
    with pytest.raises(ImportError, match=r"parser for 'perf': not in WORKLOAD_TOOLS, or a second one"):
        workloads.parses("perf")(lambda directory: [])
    assert tracemetrics.METRIC_SETS["tick"] is tracemetrics.tick_metrics and "softirq" not in tracemetrics.METRIC_SETS


_TICK = [
    "irq_vectors:local_timer_entry",
    "irq_vectors:local_timer_exit",
    "timer:hrtimer_expire_entry",
    "timer:tick_stop",
    "irq:softirq_raise",
    "irq:softirq_entry",
    "irq:softirq_exit",
]
_HRTIMER = [*_TICK[:3], "timer:hrtimer_start", "timer:hrtimer_cancel"]
# what each experiment traced when it listed its trace.events itself (before the metric sets declared theirs)
_TRACED_BEFORE = {
    **{f"nohz/{name}.yaml": _TICK for name in ("ftq", "guest-ftq", "host-boot-ftq", "host-boot-hz")},
    **{f"hrtick/{name}.yaml": _HRTIMER for name in ("guest-hackbench", "hackbench", "host-boot-kernels")},
}


def test_every_experiment_traces_the_events_it_traced_before_and_its_definition_says_so():
    experiments = sorted(p for p in (REPO / "runners").glob("*/*.yaml") if p.parent.name != "vm")
    traced = {}
    for path in experiments:
        experiment = load_experiment(path)
        settings = experiment.trace_settings()
        if settings is not None:
            traced[str(path.relative_to(REPO / "runners"))] = settings.events
            # the definition a bundle's manifest records, and what a capture records of its tracing
            assert experiment.definition["trace"]["events"] == experiment.trace["events"] == settings.events
    assert traced == _TRACED_BEFORE
    assert all("events" not in yaml.safe_load(path.read_text()).get("trace", {}) for path in experiments)


def test_an_experiment_listing_events_without_those_its_metric_set_reads_is_refused_in_one_line(tmp_path):
    data = yaml.safe_load(FTQ.read_text())
    data["trace"]["events"] = ["irq_vectors:local_timer_entry", "irq_vectors:local_timer_exit", "sched:sched_switch"]
    path = tmp_path / "few.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ExperimentError) as refused:
        load_experiment(path)
    assert str(refused.value) == (
        f"{path}: trace.events leaves out timer:hrtimer_expire_entry, timer:tick_stop, irq:softirq_raise, "
        "irq:softirq_entry, irq:softirq_exit, read by trace.metrics tick; list them, or leave trace.events out to "
        "trace what the metric sets read"
    )
    data["trace"]["events"] = [*_TICK, "sched:sched_switch"]  # every one the set reads, and one more: as listed
    path.write_text(yaml.safe_dump(data))
    assert load_experiment(path).trace_settings().events == [*_TICK, "sched:sched_switch"]
    del data["trace"]["metrics"], data["trace"]["events"]
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ExperimentError, match=r"few.yaml: trace: 'events' is missing$"):
        load_experiment(path)


def test_the_requirement_kinds_are_one_table_the_schema_and_the_checks_follow(tmp_path, monkeypatch):
    from ticklab import schemas
    from ticklab.capture import requirements
    from ticklab.capture.experiment import experiment_schema

    assert list(requirements.CHECKS) == [kind.name for kind in registry.REQUIREMENT_KINDS]
    # the form schemas.py listed apart until the table (issue 58): the same requirements accepted and refused
    before = re.compile(
        r"^(root|tracefs|cpuidle_states|cpuidle_driver:[a-z0-9_]+|sched_feature(:[A-Z_]+)?|"
        r"(program|tool):[A-Za-z0-9_.+-]+|tracer:[a-z_]+)$"
    )
    now = re.compile(schemas.requirement_schema(registry.REQUIREMENT_KINDS)["pattern"])
    said = [
        *("root", "tracefs", "cpuidle_states", "cpuidle_driver:acpi_idle", "sched_feature", "sched_feature:HRTICK_DL"),
        *("program:rtla", "tool:gapdet", "tracer:function", "program:g++-12", "root:x", "tracefs:", "cpuidle_driver"),
        *("sched_feature:hrtick", "program", "tool:", "tracer:Function", "gpu", "gpu:x", "rootx", "program:a b"),
    ]
    assert [bool(now.match(s)) for s in said] == [bool(before.match(s)) for s in said]
    assert sum(bool(now.match(s)) for s in said) == 10
    item = experiment_schema()["properties"]["requires"]["items"]
    assert item == experiment_schema()["properties"]["extras"]["items"]["properties"]["requires"]["items"]
    with pytest.raises(ImportError, match=r"check of 'gpu': not in the registry, or a second one"):
        requirements.checks("gpu")(lambda host, facts, argument: (True, ""))
    data = yaml.safe_load(FTQ.read_text())
    data["requires"] = ["root", "gpu:a100"]
    path = tmp_path / "gpu.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ExperimentError, match=r"gpu.yaml: requires\[1\]: 'gpu:a100' is not of the allowed form$"):
        load_experiment(path)
    kinds = (*registry.REQUIREMENT_KINDS, registry.RequirementKind("gpu", "[a-z0-9]+"))
    monkeypatch.setattr(registry, "REQUIREMENT_KINDS", kinds)
    assert load_experiment(path).requires == ["root", "gpu:a100"]
    tracers = {"tracers": ["nop", "function"]}
    assert requirements.check("tracer:function", None, tracers) == (True, "function tracer available")
    assert requirements.check("tracer:osnoise", None, tracers) == (False, "no osnoise tracer in this kernel")
