"""Issue 56 item 1, "a new user's second hour": a suggested or default `ticklab report` never replaces another data
set's report (it writes beside the data it reads; `--out` onto a report of other data is refused unless --replace),
and every command a capture's answer suggests is checked against what doctor knows of this host."""

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, WAIT_BOUND_S
from ticklab import cli, paths
from ticklab.capture.answer import AnswerContext, answer_lines
from ticklab.capture.requirements import tools_bin
from ticklab.doctor import suggestion_check
from ticklab.report import outdir

BUNDLE = REPO / "traces/amd-epyc-2c-6.18.44-fc-v595-vm/nohz/20261126T195227Z-ftq"
QEMU_MISSING = "qemu: qemu-system-x86_64 is not installed"
BOOT_REFUSED = "/boot: no vmlinuz-6.18.44 (refused: this machine does not boot from /boot)"


def nohz_context(data_dir: Path, missing_here=None) -> AnswerContext:
    context = cli.answer_context("nohz", paths.published_dir(), data_dir)
    return AnswerContext(**{**context.__dict__, "missing_here": missing_here})


def lacks_qemu_and_boot(experiment):
    if experiment.lab is not None:
        return QEMU_MISSING
    return BOOT_REFUSED if "boot" in experiment.path.name else None


def test_a_suggestion_that_cannot_run_here_names_what_is_missing_and_is_no_command_to_paste():
    lines = answer_lines([BUNDLE], nohz_context(paths.traces_dir(), lacks_qemu_and_boot))
    lab = [line for line in lines if "ticklab lab run nohz" in line]
    boot = [line for line in lines if "ticklab capture nohz --boot kexec" in line]
    assert set(lab) == {
        f"    not on this host: ticklab lab run nohz cannot run here ({QEMU_MISSING}; 'ticklab doctor' says more): "
        "runners/nohz/guest-ftq.yaml on a host that has it"
    }
    assert boot and all(line.lstrip(" or:").startswith("not on this host: ") and BOOT_REFUSED in line for line in boot)
    # the comparisons are still listed under it
    assert lines[lines.index(lab[0]) + 1] == "      nohz_full vs HZ=1000: FTQ work per quantum"


def test_a_suggestion_that_runs_here_is_the_command():
    lines = answer_lines([BUNDLE], nohz_context(paths.traces_dir(), lambda experiment: None))
    assert "    ticklab lab run nohz   (QEMU guests: runners/nohz/guest-ftq.yaml)" in lines
    assert not [line for line in lines if "not on this host" in line]


def test_the_suggested_report_goes_beside_the_data_never_into_build(tmp_path):
    mine = tmp_path / "this-host"
    [line] = [line for line in answer_lines([BUNDLE], nohz_context(mine)) if line.startswith("  verdicts:")]
    assert line == f"  verdicts: ticklab report --data-dir {mine} --out {mine / 'report'} --only 05-nohz"
    # into the project's own traces/: the report of that capture goes to build/<host-id>, not over build/
    [line] = [line for line in answer_lines([BUNDLE], nohz_context(paths.traces_dir())) if "verdicts:" in line]
    assert f"--out {REPO / 'build' / 'amd-epyc-2c-6.18.44-fc-v595-vm'} " in line


def test_reports_default_output_is_beside_the_data_it_reads(tmp_path):
    assert cli.report_out(paths.traces_dir()) == REPO / "build"
    assert cli.report_out(tmp_path / "mine") == tmp_path / "mine" / "report"
    args = cli.build_parser().parse_args(["report", "--data-dir", str(tmp_path), "--only", "05-nohz"])
    assert args.out is None and not args.replace


def test_project_is_accepted_after_the_command_too(tmp_path):
    parser = cli.build_parser()
    assert parser.parse_args(["report", "--project", str(tmp_path)]).project == tmp_path
    assert parser.parse_args(["--project", str(tmp_path), "report"]).project == tmp_path
    assert parser.parse_args(["lab", "run", "nohz", "--project", str(tmp_path)]).project == tmp_path
    assert parser.parse_args(["doctor"]).project is None


def finished_report(directory: Path, data_dir: Path) -> None:
    read = outdir.data_record(data_dir, paths.published_dir())
    foreign = outdir.claim(directory, replace=True, data=read)
    (directory / "verdicts.csv").write_text("38 rows of the bundled data\n")
    outdir.record(directory, foreign, read)


def test_a_report_onto_a_report_of_other_data_is_refused_and_leaves_it(tmp_path):
    build = tmp_path / "build"
    finished_report(build, paths.traces_dir())
    mine = outdir.data_record(tmp_path / "this-host", paths.published_dir())
    with pytest.raises(outdir.OutputDirError) as refused:
        outdir.claim(build, replace=False, data=mine)
    assert str(refused.value) == (
        f"{build}: holds the report of --data-dir {paths.traces_dir()}, not of {tmp_path / 'this-host'}; give "
        "another --out (--data-dir DIR writes DIR/report by default) or --replace to replace it"
    )
    assert (build / "verdicts.csv").read_text() == "38 rows of the bundled data\n"
    assert json.loads((build / outdir.MARKER).read_text())["data"]["data_dir"] == str(paths.traces_dir())
    # the same data: a partial run goes ahead (it updates its claim)
    outdir.claim(build, replace=False, data=outdir.data_record(paths.traces_dir(), paths.published_dir()))
    assert (build / "verdicts.csv").is_file()


def test_replace_removes_a_report_of_other_data_whole_even_for_a_partial_run(tmp_path):
    build = tmp_path / "build"
    finished_report(build, paths.traces_dir())
    mine = outdir.data_record(tmp_path / "this-host", paths.published_dir())
    outdir.claim(build, replace=False, data=mine, replace_other=True)
    assert not (build / "verdicts.csv").exists()
    assert json.loads((build / outdir.MARKER).read_text())["data"] == mine


def test_doctors_check_of_a_suggestion_names_what_is_missing(tmp_path, monkeypatch, fake_host):
    from ticklab.capture.experiment import boot_experiment_paths, experiment_paths, load_experiment

    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    missing = suggestion_check(fake_host)
    [lab] = [load_experiment(p) for p in experiment_paths("nohz") if load_experiment(p).lab is not None]
    assert missing(lab).startswith("qemu: qemu-system-x86_64 is not installed"), missing(lab)
    boot = load_experiment(boot_experiment_paths("nohz")[0])
    assert missing(boot) == "tracefs: no tracefs (kernel without CONFIG_TRACING?)"  # the fake host has none
    assert shutil.which("qemu-system-x86_64") is None


def files_of(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def ticklab(*words: str, timeout: float = WAIT_BOUND_S) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ticklab.cli", *words], capture_output=True, text=True, cwd=REPO, timeout=timeout
    )


@pytest.mark.slow
@pytest.mark.xdist_group("machine")
@pytest.mark.skipif(
    os.geteuid() != 0 or not Path("/sys/kernel/tracing").is_dir() or not (tools_bin() / "ftq").exists(),
    reason="a real capture needs root, tracefs and 'make tools'",
)
def test_the_newcomer_path_leaves_the_bundled_report_intact(tmp_path):
    """README's path: the bundled data's report, doctor, a capture, then the report line the capture suggests, run as
    printed; the bundled report is the same file for file. Then that report's data onto it: refused, still intact."""
    build = tmp_path / "build"
    made = ticklab("report", "--out", str(build), "--only", "05-nohz")
    assert made.returncode == 0, made.stderr + made.stdout
    bundled = files_of(build)
    assert (build / "verdicts.csv").is_file() and (build / "report/index.html").is_file()
    doctor = ticklab("doctor")
    assert doctor.returncode == 0, doctor.stderr
    mine = tmp_path / "this-host"
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    captured = ticklab(
        "capture", "nohz", "--runs", "2", "--warmup", "0", "--out", str(mine), "--journal", str(state / "j.json")
    )
    if "the host is held by" in captured.stderr:
        pytest.skip(f"another capture holds the host: {captured.stderr.strip()}")
    assert captured.returncode == 0, captured.stderr
    [line] = [line for line in captured.stdout.splitlines() if line.startswith("  verdicts: ")]
    words = shlex.split(line.removeprefix("  verdicts: "))
    assert words[:2] == ["ticklab", "report"] and str(mine / "report") in words, words
    suggested = ticklab(*words[1:])
    assert suggested.returncode == 0, suggested.stderr + suggested.stdout
    assert (mine / "report/report/index.html").is_file() and (mine / "report/verdicts.csv").is_file()
    assert files_of(build) == bundled
    # the same data told to write over the bundled report: refused in one line, nothing changed
    onto = ticklab("report", "--data-dir", str(mine), "--only", "05-nohz", "--out", str(build))
    assert onto.returncode == 2
    assert f"{build}: holds the report of --data-dir {paths.traces_dir()}, not of {mine}" in onto.stdout + onto.stderr
    assert files_of(build) == bundled


# Issue 56 item 7: capture --help describes itself and its claim; --runs too small to decide is warned with the number


def test_capture_help_describes_the_command_and_its_claim_argument():
    [capture] = [
        choice
        for action in cli.build_parser()._actions
        if isinstance(action, argparse._SubParsersAction)
        for name, choice in action.choices.items()
        if name == "capture"
    ]
    text = capture.format_help()
    assert capture.description and capture.description.startswith("Run a claim's experiments")
    [claim] = [a for a in capture._actions if a.dest == "claim"]
    assert claim.help.startswith("the claim whose experiments to run: one of acpi-idle, hpet, hrtick, nohz")
    assert "below 4 no 95% CI is bounded" in " ".join(text.split())


def test_the_fewest_runs_that_can_decide_is_the_analysis_own():
    from ticklab.analysis.power import smallest_testable_n

    assert cli.smallest_deciding_runs() == smallest_testable_n(0.05) == 4
    assert cli.smallest_deciding_runs(0.99) == smallest_testable_n(0.01)


def test_runs_below_what_a_95_percent_ci_needs_is_warned_with_the_numbers(capsys):
    assert cli.runs_warning(4) is None and cli.runs_warning(None) is None
    assert cli.runs_warning(3).startswith(
        "warning: --runs 3 is below the 4 runs per condition an exact 95% CI needs to be bounded (3 vs 3 runs: the "
        "smallest two-sided Mann-Whitney p is 0.1)"
    )
    # through main: a refused claim still exits 2, after the warning
    assert cli.main(["capture", "nohz", "--runs", "2", "--experiment", "/nonexistent.yaml", "--dry-run"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("ticklab capture: warning: --runs 2 is below the 4 runs") and "p is 0.333" in err[0]


def test_readme_examples_use_run_counts_that_can_decide():
    """Every `--runs N` README tells a user to run is at least 4, the lab-host plans included (issue 53: they make
    their experiments' own counts); README still says why the committed 3-run (nohz) lab-host bundles cannot decide."""
    text = (REPO / "README.md").read_text()
    commands = [line for line in text.splitlines() if line.startswith("    ")]
    assert [line for line in commands if "lab host-plan" in line and "--warmup 0" in line]
    small = [line for line in commands if (m := re.search(r"--runs (\d+)", line)) and int(m[1]) < 4]
    assert not small, small
    said = "the committed nohz lab-host bundles were made with\n`--runs 3`, which proves the boot-plan machinery"
    assert said in text


# Issue 56 item 6: a refused experiment is refused before the capture or the analysis is imported (its time is in
# benchmarks/startup.py, not here)

HEAVY = (
    "pandas",
    "scipy",
    "numpy",
    "matplotlib",
    "pyarrow",
    "ticklab.analysis",
    "ticklab.claims",
    "ticklab.capture.runner",
)


def imported_after(*words: str, heavy: tuple[str, ...] = HEAVY) -> tuple[int, list[str]]:
    return run_and_list_imports(*words, heavy=heavy)[:2]


def run_and_list_imports(*words: str, heavy: tuple[str, ...] = HEAVY) -> tuple[int, list[str], str, str]:
    """``ticklab WORDS`` in a fresh interpreter: its exit code, which of ``heavy`` (or their submodules) it imported,
    and what it printed (stdout before the last line, stderr)."""
    script = (
        "import sys\nfrom ticklab import cli\n"
        f"code = cli.main({list(words)!r})\n"
        f"heavy = {heavy!r}\n"
        "sys.stdout.flush()\n"
        "print(code, *sorted(m for m in sys.modules if any(m == h or m.startswith(h + '.') for h in heavy)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=WAIT_BOUND_S
    )
    *printed, last = done.stdout.splitlines() or [""]
    code, *modules = last.split() or ["-1"]
    return int(code), modules, "\n".join(printed), done.stderr


@pytest.mark.parametrize("boot", [False, True], ids=["host", "boot"])
def test_a_refused_experiment_imports_no_analysis_pandas_or_scipy(tmp_path, boot):
    anchored = tmp_path / "anchored.yaml"
    anchored.write_text("claim: nohz\nname: &x a\ndescription: *x\n")
    words = ["capture", "nohz", "--experiment", str(anchored), "--dry-run"] + (["--boot", "kexec"] if boot else [])
    assert imported_after(*words) == (2, [])


# what a dry run of a capture on this host has no need of: the analysis, the claims, and the numeric libraries (the
# capture itself it imports: it is what plans the runs)
NOT_FOR_A_DRY_RUN = tuple(h for h in HEAVY if h != "ticklab.capture.runner")


@pytest.mark.xdist_group("machine")  # a dry run on the real root takes the host lock
@pytest.mark.parametrize("boot", [False, True], ids=["host", "boot"])
def test_a_dry_run_imports_no_analysis_claim_pandas_numpy_or_scipy(boot):
    """`ticklab capture nohz --dry-run` as README shows it: nohz's host experiment sets no budget, so its stopping
    rule needs none of the claim's precision goals, nor the bundle's pandas, nor the trace readers' numpy (it took
    2.7 s for them; benchmarks/startup.py times it)."""
    words = ["capture", "nohz", "--dry-run"] + (["--boot", "kexec"] if boot else [])
    code, modules, out, err = run_and_list_imports(*words, heavy=NOT_FOR_A_DRY_RUN)
    if "the host is held by" in err:
        pytest.skip(f"another capture holds the host: {err.strip()}")
    if boot:  # a host that cannot boot a plan refuses it in one line, having imported no more
        assert (code == 0 and out.endswith("dry run: no plan written, nothing booted")) or (
            code == 2 and err.startswith("ticklab capture: ") and len(err.splitlines()) == 1
        ), out[-2000:] + err[-2000:]
    else:
        assert code == 0, out[-2000:] + err[-2000:]
        assert "stopping: fixed run count (the experiment sets no budget)" in out.splitlines() or (
            "not testable on this host" in out
        ), out[-2000:]
    assert modules == []


@pytest.mark.xdist_group("machine")  # a dry run on the real root takes the host lock
@pytest.mark.parametrize("claim", ["hpet", "hrtick", "acpi-idle"])
def test_a_budgeted_dry_run_counts_the_claims_comparisons_without_matplotlib_or_scipy(claim):
    """The claims whose host experiments set a budget: the dry run's stopping line counts the claim's comparisons, so
    the claim module is imported, but not the figures' matplotlib nor scipy.stats (analysis/lazy.py), which took it
    past a second."""
    code, modules, out, err = run_and_list_imports(
        "capture", claim, "--dry-run", heavy=("matplotlib", "scipy.stats", "ticklab.claims")
    )
    if "the host is held by" in err:
        pytest.skip(f"another capture holds the host: {err.strip()}")
    assert code in (0, 2), out[-2000:] + err[-2000:]
    assert not [m for m in modules if m.split(".")[0] == "matplotlib" or m.startswith("scipy.stats")], modules
    assert code == 2 or f"ticklab.claims.{claim.replace('-', '_')}" in modules, modules


@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "capture"])
@pytest.mark.parametrize(
    "words, said",
    [
        (["--experiment", "runners/hpet/clock-read.yaml"], "runners/hpet/clock-read.yaml: claim is 'hpet', not 'nohz'"),
        (
            ["--experiment", "runners/nohz/guest-ftq.yaml"],
            "runners/nohz/guest-ftq.yaml: a lab (guest) experiment; run it with 'ticklab lab run nohz'",
        ),
        (
            ["--experiment", "runners/nohz/host-boot-ftq.yaml"],
            "runners/nohz/host-boot-ftq.yaml: a boot experiment (a host_kernel knob); run it with 'ticklab capture "
            "nohz --boot kexec|grub|manual --experiment runners/nohz/host-boot-ftq.yaml'",
        ),
        (
            ["--boot", "kexec", "--experiment", "runners/nohz/ftq.yaml"],
            "runners/nohz/ftq.yaml: no boot experiment (one with a host_kernel knob); --boot runs those only",
        ),
    ],
    ids=["another-claims", "lab", "boot", "not-boot"],
)
def test_an_experiment_the_capture_does_not_run_is_refused_before_the_analysis_is_imported(words, said, dry_run):
    """A capture (or its dry run) of a file it does not run refuses it before the claim's analysis is imported for
    the answer or the precision goals (issue 56 item 6: every refusal of an experiment within a second)."""
    code, modules, out, err = run_and_list_imports(
        "capture", "nohz", *words, *(["--dry-run"] if dry_run else []), heavy=NOT_FOR_A_DRY_RUN
    )
    assert (code, err) == (2, f"ticklab capture: {said}\n")
    assert modules == []


@pytest.mark.parametrize(
    "experiment, said",
    [
        (
            "anchored",
            "line 2: anchor &x: YAML anchors and aliases are not accepted (write the value out where it is used)",
        ),
        ("runners/nohz/ftq.yaml", "not a lab experiment (no 'lab:' section); run it with 'ticklab capture nohz'"),
        ("runners/hpet/guest-clock-read.yaml", "claim is 'hpet', not 'nohz'"),
    ],
    ids=["anchor", "not-lab", "another-claims"],
)
def test_an_experiment_lab_run_does_not_run_is_refused_before_the_analysis_is_imported(tmp_path, experiment, said):
    if experiment == "anchored":
        experiment = tmp_path / "anchored.yaml"
        experiment.write_text("claim: nohz\nname: &x a\ndescription: *x\n")
    code, modules, out, err = run_and_list_imports(
        "lab", "run", "nohz", "--experiment", str(experiment), "--no-progress", heavy=NOT_FOR_A_DRY_RUN
    )
    assert (code, err) == (2, f"ticklab lab run: {experiment}: {said}\n")
    assert modules == []


@pytest.mark.slow
@pytest.mark.xdist_group("machine")  # a dry run on the real root takes the host lock
def test_a_dry_run_with_a_fixed_count_imports_no_scipy_and_no_claim():
    """The stopping rule imports the analysis' stats only when it checks a CI, which a dry run never does."""
    script = (
        "import sys\nfrom ticklab import cli\n"
        "code = cli.main(['capture', 'nohz', '--dry-run', '--runs', '5'])\n"
        "print('exit', code, *sorted(m for m in ('scipy', 'matplotlib', 'ticklab.analysis.stats', 'ticklab.claims')"
        " if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=WAIT_BOUND_S
    )
    if "the host is held by" in done.stderr:
        pytest.skip(f"another capture holds the host: {done.stderr.strip()}")
    assert done.stdout.splitlines()[-1] == "exit 0", done.stdout[-2000:] + done.stderr[-2000:]
