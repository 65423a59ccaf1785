"""ticklab: reproduce five published Linux timekeeping, idle and locking performance claims, and test them on your own
hardware."""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from pathlib import Path

from . import __version__, paths, registry
from .claimids import CLAIM_IDS
from .paths import ProjectError, seeds_dir
from .safefiles import shown


def report_out(data_dir: Path) -> Path:
    """``ticklab report``'s default output: build/ for the project's own traces/, else beside the data it reads
    (``<data-dir>/report``), so a report of one capture never lands on the bundled data's report."""
    defaults = {_InProject("traces").resolve().resolve(), _InProject("traces", writes=True).resolve().resolve()}
    if data_dir.resolve() in defaults:
        return _InProject("build", writes=True).resolve()
    return data_dir / "report"


def _report(args: argparse.Namespace) -> int:
    from .report import kernelfork

    if args.out is None:
        args.out = report_out(args.data_dir)
    # the kernels' fork server first: its imports run beside this process's own (report/kernelfork.py)
    with kernelfork.started(not args.no_kernel_fork) as kernel_server:
        from .report.build import run_report

        return run_report(
            args.out,
            data_dir=args.data_dir,
            published_dir=args.published_dir,
            only=args.only,
            cell_timeout=args.cell_timeout,
            notebook_timeout=args.notebook_timeout,
            jobs=args.jobs,
            kernel_server=kernel_server,
            replace_other=args.replace,
            kernel_fork=not args.no_kernel_fork,
        )


def _verify_published(args: argparse.Namespace) -> int:
    from .analysis.published import PublishedDataError, load_published, verify_against_source

    seeds = Path(args.seeds) if args.seeds else seeds_dir()
    unknown = [c for c in args.claims if c not in CLAIM_IDS]
    if unknown:
        print(f"unknown claim(s) {', '.join(unknown)}; claims are: {', '.join(CLAIM_IDS)}", file=sys.stderr)
        return 2
    status = 0
    for claim in args.claims or list(CLAIM_IDS):
        try:
            published = load_published(args.published_dir, claim)
        except PublishedDataError as exc:
            print(f"{claim}: {_one_line(exc)}")
            status = 1
            continue
        rows = sum(len(t) for t in published.tables.values())
        if seeds is None:
            print(f"{claim}: {rows} rows load; source documents not found (set TICKLAB_SEEDS) so quotes are unchecked")
            continue
        problems = verify_against_source(published, seeds)
        for problem in problems:
            print(f"{claim}: {_line(problem)}")
        verdict = (
            f"all quotes verbatim in {published.source['file']}" if not problems else f"{len(problems)} problem(s)"
        )
        print(f"{claim}: {rows} rows, {verdict}")
        status |= bool(problems)
    return status


def _claims(args: argparse.Namespace) -> int:
    """The claim ids, one a line (for the Makefile's loops): all, or those with host or lab experiments."""
    from .capture.experiment import experiment_paths, load_experiment

    for claim in CLAIM_IDS:
        if args.host or args.lab:
            kinds = {load_experiment(path).lab is not None for path in experiment_paths(claim)}
            if not ((args.host and False in kinds) or (args.lab and True in kinds)):
                continue
        print(claim)
    return 0


def _doctor(args: argparse.Namespace) -> int:
    from .doctor import main as doctor_main

    return doctor_main(args.json, root=args.root, journal=args.journal)


def _restore(args: argparse.Namespace) -> int:
    """Put back what a capture killed outright left changed (host/restore.py): 0 restored or nothing to restore, 2
    with one line when it cannot."""
    from .host import HostChangeError
    from .host.restore import journals, restore, summary

    def say(line: str) -> None:
        print(_line(line), flush=True)

    try:
        restored = restore(args.journal, root=args.root, log=say)
    except HostChangeError as exc:
        print(f"ticklab restore: {_one_line(exc)}", file=sys.stderr)
        return 2
    if restored is None:
        say(f"nothing to restore: no journal of host changes at {journals(args.journal)[0]}")
        return 0
    for line in summary(restored):
        say(f"put back: {line}")
    say(f"restored {len(restored)} host change(s); the journal is removed")
    return 0


def precision_goals(claim: str, published_dir: Path) -> list:
    """The stopping rule's precision goals for ``claim``: each of its comparisons, as the plain data capture takes.
    The one place the claim's analysis meets capture (capture imports none of it): the comparison's words,
    metric, conditions, statistic, experiments, and as the target the CI half-width (log scale) that lets the verdict's
    words decide (``Margins.precision_log``: the consistent-size band's half-width for a ratio target)."""
    from .claims import get_claim

    found = get_claim(claim)
    return _goals_of(found, found.published(published_dir))


def _goals_of(found, published) -> list:
    from .capture.stopping import PrecisionGoal

    return [
        PrecisionGoal(
            c.comparison,
            c.metric,
            c.treatment,
            c.baseline,
            c.statistic,
            c.margins.precision_log(c.target),
            tuple(c.experiments),
        )
        for c in found.comparisons(published)
    ]


def answer_context(claim: str, published_dir: Path, out: Path, root: Path | None = None):
    """What a capture's answer needs of the claim (capture/answer.py), as plain data, as the stopping rule's goals
    are: every row of its published layer, all its comparisons, its notebook, and where the bundles go; with
    ``root``, doctor's check of what this host lacks for each command the answer may suggest."""
    import math

    from .capture.answer import AnswerContext, PrintedValue
    from .claims import get_claim

    found = get_claim(claim)
    published = found.published(published_dir)
    printed = {}
    for table, frame in published.tables.items():
        for row in frame.to_dict("records"):

            def text(key: str) -> str:
                value = row.get(key)
                return "" if value is None or (isinstance(value, float) and math.isnan(value)) else str(value).strip()

            value = row.get("value")
            context = {
                key: text(key)
                for key in row
                if key
                not in ("id", "value", "unit", "value_as_printed", "qualifier", "metric", "quantity", "quote", "token")
                and text(key)
            }
            printed[f"{table}/{row['id']}"] = PrintedValue(
                f"{table}/{row['id']}",
                published.quote_id(table, row["id"]),
                text("value_as_printed"),
                text("qualifier"),
                None if value is None or not math.isfinite(float(value)) else float(value),
                text("unit"),
                context,
            )
    default_out = _InProject("traces", writes=True).resolve()
    default_published = _InProject("traces", "published").resolve()
    return AnswerContext(
        claim,
        f"seed {found.seed}",
        printed,
        tuple(_goals_of(found, published)),
        found.notebook.removesuffix(".ipynb"),
        out,
        pass_out=out.resolve() != default_out.resolve(),
        published_dir=None if published_dir.resolve() == default_published.resolve() else published_dir,
        missing_here=_suggestion_check(root) if root is not None else None,
    )


def _suggestion_check(root: Path):
    from .doctor import suggestion_check

    return suggestion_check(root)


def _goals(args: argparse.Namespace) -> list | None:
    """The precision goals a capture needs: none when --runs fixes the run count."""
    return None if args.runs is not None else precision_goals(args.claim, args.published_dir)


def _dry_run_goals(args: argparse.Namespace) -> list | None:
    """The precision goals a host capture's dry run describes its stopping rule with: none where the rule cannot look
    at them (--runs given, or no experiment it would run may add rounds: no budget, no --budget-s), unless
    --published-dir names a published layer of the user's, which the dry run reads as the capture would. The rule's
    words are the same either way ("fixed run count ..."); the claim's analysis (pandas, scipy, matplotlib) is then
    not imported for nothing (issue 56)."""
    default_published = _InProject("traces", "published").resolve()
    if args.runs is not None or (
        not _may_add_rounds(args) and args.published_dir.resolve() == default_published.resolve()
    ):
        return None
    return precision_goals(args.claim, args.published_dir)


def _may_add_rounds(args: argparse.Namespace) -> bool:
    """Whether the stopping rule of an experiment ``ticklab capture`` (on this host, not --boot) would run may add
    rounds: --budget-s given, or one of them sets a budget (not the lab experiments it leaves to ``lab run``, nor one
    it refuses)."""
    from .capture.experiment import ExperimentError, experiment_paths, load_experiment
    from .capture.runner import runs_on_this_host
    from .capture.stopping import budget_of

    if args.budget_s is not None:
        return True
    for path in [args.experiment] if args.experiment else experiment_paths(args.claim):
        experiment = load_experiment(path)
        try:
            if not runs_on_this_host(experiment, args.claim, given=args.experiment is not None):
                continue
        except ExperimentError:
            continue  # the capture refuses it when it comes to it
        if budget_of(experiment) is not None:
            return True
    return False


def no_host_experiment(claim: str) -> str | None:
    """Why ``ticklab capture <claim>`` has nothing to run on this host, and what to run instead (one line), or None
    when the claim has a host experiment (or none at all: capture says so itself)."""
    from .capture.experiment import boot_experiment_paths, experiment_paths, load_experiment

    found = experiment_paths(claim)
    lab = [path.name for path in found if load_experiment(path).lab is not None]
    if not found or len(lab) < len(found):
        return None
    instead = [f"'ticklab lab run {claim}' (in QEMU guests: {', '.join(lab)})"] if lab else []
    boot = [path.name for path in boot_experiment_paths(claim)]
    if boot:
        instead.append(f"'ticklab capture {claim} --boot kexec' (one boot of this host per run: {', '.join(boot)})")
    held = "guest-lab experiments only" if lab else "no experiment to run without rebooting"
    return f"{claim} has no host experiment (runners/{claim}/ holds {held}); run {' or '.join(instead)} instead"


def _refused_experiment(args: argparse.Namespace) -> str | None:
    """The first experiment file this capture would run that does not load (its one-line error), checked before
    anything of the capture or the analysis is imported: a refusal costs the YAML and the schema, not pandas."""
    from .capture.experiment import ExperimentError, boot_experiment_paths, experiment_paths, load_experiment

    try:
        if args.experiment:
            found = [args.experiment]
        else:
            found = boot_experiment_paths(args.claim) if args.boot else experiment_paths(args.claim)
        for path in found:
            load_experiment(path)
    except ExperimentError as exc:
        return _one_line(exc)
    return None


def _capture_options(args: argparse.Namespace, **how):
    """The CaptureOptions of ``ticklab capture`` (on this host or ``--boot``: the same options, read once), with
    ``how`` what the two ways set apart (progress, goals, the answer, run lines, superseded records)."""
    from .capture.runner import CaptureOptions

    return CaptureOptions(
        runs=args.runs,
        warmup=args.warmup,
        out=args.out,
        host_id=args.host_id,
        dry_run=args.dry_run,  # --boot --dry-run returns before its options are made
        backend=args.backend,
        root=args.root,
        journal=args.journal,
        seed=args.seed,
        budget_s=args.budget_s,
        build_kernels=args.build_kernels,  # refused without --boot before the options are made
        supersedes=tuple(args.supersedes),
        **how,
    )


def _capture(args: argparse.Namespace) -> int:
    refused = _refused_experiment(args)
    if refused:
        print(f"ticklab capture: {refused}", file=sys.stderr)
        return 2
    if args.boot:
        return _capture_boot(args)
    if args.build_kernels:
        print(
            "ticklab capture: --build-kernels builds the kernels a boot plan boots; add --boot kexec|grub|manual",
            file=sys.stderr,
        )
        return 2
    # the published layer's errors (analysis.published.PublishedDataError) are ticklab's own: main() prints them in the
    # same one line, so the analysis is not imported here for a name to catch
    from .bundle import BundleError
    from .capture.experiment import ExperimentError, load_experiment
    from .capture.runner import capture, runs_on_this_host
    from .capture.tracing import TracingError
    from .host import HostChangeError

    try:
        gap = None if args.experiment else no_host_experiment(args.claim)
        if gap:
            print(f"ticklab capture: {gap}", file=sys.stderr)
            return 2
        if args.experiment:  # another claim's, a lab or a boot experiment: refused before the claim's analysis is read
            runs_on_this_host(load_experiment(args.experiment), args.claim, given=True)
        # the answer's context before the first run, so that a published row it cannot name stops the capture there
        answer = None if args.dry_run else answer_context(args.claim, args.published_dir, args.out, args.root)
        goals = None if args.runs is not None else list(answer.goals) if answer else _dry_run_goals(args)
        progress = _progress(args)
        options = _capture_options(
            args, progress=progress, goals=goals, answer=answer, run_lines=not progress or not sys.stdout.isatty()
        )
        # flushed line by line: a log or a pipe shows each run as it ends, not all of them at exit
        capture(args.claim, options, experiment_path=args.experiment, log=lambda line: print(line, flush=True))
        _say_superseded(args)
    except (ExperimentError, BundleError, HostChangeError, TracingError) as exc:
        print(f"ticklab capture: {_one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        print(f"ticklab capture: interrupted ({exc or 'SIGINT'}); host knobs restored", file=sys.stderr)
        return 130
    return 0


def _kernel(args: argparse.Namespace) -> int:
    from .capture.hostkernel import build_and_install, plan_host_kernel

    if not args.host:
        print(
            "ticklab kernel build: only --host kernels are built here; lab kernels: ticklab lab build-kernel",
            file=sys.stderr,
        )
        return 2
    if args.modules and not args.localmodconfig:
        print(
            "ticklab kernel build: --modules lists the modules --localmodconfig keeps; add --localmodconfig",
            file=sys.stderr,
        )
        return 2
    plan = plan_host_kernel(
        args.root,
        config=args.config,
        source=args.source,
        localmodconfig=args.localmodconfig,
        jobs=args.jobs,
        release=args.release,
        modules=args.modules,
        fragment=args.fragment,
    )
    for warning in plan.warnings:  # before the plan and before any work
        print(f"ticklab kernel build: warning: {warning}", file=sys.stderr, flush=True)
    print(plan.describe())
    if args.dry_run:
        print("dry run: nothing built, nothing installed")
        return 0
    release = build_and_install(plan, args.root)
    print(
        f"installed {release}; the default boot entry is unchanged. Boot it for one run with a boot plan "
        f"(ticklab capture <claim> --boot kexec), or by hand: kexec -l /boot/vmlinuz-{release} "
        f"--initrd /boot/initrd.img-{release} --reuse-cmdline && systemctl kexec"
    )
    return 0


def _plan(args: argparse.Namespace) -> int:
    from . import plancli

    def maker_for(plan, root):
        """A plan made by 'capture --boot' makes its runs into its bundle; one made otherwise (a lab guest's test
        plan, which has no pandas to import the capture with) records the boots only."""
        if "experiment" not in plan.capture:
            return None
        from .capture.boot_capture import BootCapture

        return BootCapture(plan, root)

    return plancli.command(args, maker_for=maker_for)


def _capture_boot(args: argparse.Namespace) -> int:
    # the published layer's errors (analysis.published.PublishedDataError) are ticklab's own: main() prints them in the
    # same one line, so a dry run imports no analysis for a name to catch
    from .bundle import BundleError
    from .capture.boot_capture import boot_experiment, planned_runs, start
    from .capture.experiment import ExperimentError
    from .capture.hostkernel import HostKernelError
    from .capture.tracing import TracingError
    from .host import HostChangeError, plan_state

    try:
        if args.dry_run and args.build_kernels:
            from .capture.boot_capture import build_missing_kernels
            from .capture.experiment import expand_conditions
            from .host import facts

            experiment = boot_experiment(args.claim, args.experiment)
            conditions = expand_conditions(experiment, facts.collect(args.root))
            built = build_missing_kernels(experiment, conditions, args.root, log=print, dry_run=True)
            print(
                f"dry run: {len(built)} kernel(s) would be built and installed first"
                + (f" ({', '.join(built)})" if built else "")
                + "; nothing built, no plan written"
            )
            return 0
        if args.dry_run:
            experiment = boot_experiment(args.claim, args.experiment)
            runs = planned_runs(experiment, args.root, runs=args.runs, warmup=args.warmup, seed=args.seed)
            print(f"boot plan ({args.boot}) of {experiment.path.name}: {len(runs)} boots, one run each, in this order:")
            from .host.boot_loaders import boot_mode

            for run in runs:
                boot_mode(args.boot).check_run(args.root, run.name, run.cmdline)  # as the real plan refuses it
                print(
                    f"  {run.name} {run.condition}{' (warm-up)' if run.warmup else ''}: kernel {run.kernel}, "
                    f"command line '{shown(run.cmdline, 4000)}'"
                )
            print("dry run: no plan written, nothing booted")
            return 0
        boot_experiment(args.claim, args.experiment)  # a file --boot does not run: refused before the goals are made
        options = _capture_options(
            args, progress=False, goals=_goals(args), supersedes_records=tuple(args.supersedes_record)
        )
        start(args.claim, options, args.experiment, args.boot)
    except (
        ExperimentError,
        plan_state.PlanError,
        HostChangeError,
        BundleError,
        TracingError,
        HostKernelError,
    ) as exc:
        print(f"ticklab capture: {_one_line(exc)}", file=sys.stderr)
        return 2
    return 0


def _lab(args: argparse.Namespace) -> int:
    # the published layer's errors (analysis.published.PublishedDataError) are ticklab's own: main() prints them in the
    # same one line, so no lab command imports the analysis for a name to catch
    from .bundle import BundleError
    from .capture.experiment import ExperimentError, load_experiment
    from .lab.cache import LabError

    try:
        if args.lab_command == "build-kernel":
            from .lab.kernel import build_kernel

            variants = args.variant or [f"hz{args.hz}"]
            for variant in variants:
                build_kernel(variant, jobs=args.jobs, progress=_progress(args), force=args.force)
        elif args.lab_command == "build-image":
            from .lab.image import build_image, packages

            if args.list_packages:
                print(" ".join(packages()))
                return 0
            image = build_image(force=args.force)
            print(f"guest image {image.key}: {image.initramfs}")
        elif args.lab_command == "build-host":
            from .lab.labhost import build_host

            image = build_host(force=args.force, say=lambda text: print(text, file=sys.stderr, flush=True))
            print(f"lab host {image.key}: {image.disk}")
        elif args.lab_command == "host-plan":
            from .host.knobs import interrupting_signals
            from .lab.labhost import HostPlanInterrupted, plan_run, summary_lines

            try:
                with interrupting_signals():  # SIGTERM and SIGHUP stop QEMU and keep the disk, as Ctrl-C does
                    view = plan_run(
                        args.claim,
                        args.boot,
                        runs=args.runs,
                        warmup=args.warmup,
                        experiment=args.experiment,
                        budget_s=args.budget_s,
                        abort_when_made=args.abort_after_runs,
                        hide_kernel_when_made=args.hide_kernel_after_runs,
                        out=args.out,
                        accel=args.accel,
                        keep_disk=args.keep_disk,
                        kernels=tuple((_kernel_source(source), None) for source in args.kernel)
                        + tuple((_kernel_source(source), Path(fragment)) for source, fragment in args.kernel_fragment),
                        resume=args.resume,
                        supersedes=tuple(args.supersedes),
                        say=lambda text: print(text, file=sys.stderr, flush=True),
                    )
            except HostPlanInterrupted as exc:
                print(
                    f"ticklab lab host-plan: interrupted ({exc.why}); QEMU stopped, the runs made are on the run's "
                    f"disk, kept in {exc.run_dir}; resume with: {exc.resume}",
                    file=sys.stderr,
                )
                return 130
            print("\n".join(summary_lines(view)))
            _say_superseded(args)
        elif args.boot:
            from .lab.guest_plan import lab_boot_plan
            from .lab.run import LabOptions

            options = LabOptions(
                runs=args.runs,
                warmup=args.warmup,
                seed=args.seed,
                out=args.out,
                accel=args.accel,
                smp=args.smp,
                cmdline=args.cmdline or "",
                backend=args.backend,
                progress=False,
                supersedes=tuple(args.supersedes),
            )
            print(f"{lab_boot_plan(args.claim, options, args.experiment, args.boot)}: sealed", file=sys.stderr)
        else:
            from .lab.run import LabOptions, check_lab_experiment, lab_run

            if args.experiment:  # a file lab run does not run: refused before the claim's analysis makes the goals
                check_lab_experiment(load_experiment(args.experiment), args.claim)
            options = LabOptions(
                runs=args.runs,
                warmup=args.warmup,
                seed=args.seed,
                budget_s=args.budget_s,
                out=args.out,
                accel=args.accel,
                smp=args.smp,
                cmdline=args.cmdline or "",
                backend=args.backend,
                progress=_progress(args),
                build=not args.no_build,
                goals=_goals(args),
                supersedes=tuple(args.supersedes),
            )
            lab_run(args.claim, options, experiment_path=args.experiment)
            _say_superseded(args)
    except (LabError, ExperimentError, BundleError) as exc:
        print(f"ticklab lab {args.lab_command}: {_one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        print(
            f"ticklab lab {args.lab_command}: interrupted ({exc or 'SIGINT'}); no guest is left running",
            file=sys.stderr,
        )
        return 130
    return 0


def _compare(args: argparse.Namespace) -> int:
    from .bundle import BundleError
    from .report.compare import CompareError, compare_bundles, render

    try:
        comparison = compare_bundles(args.bundles, args.metric, args.baseline, args.map)
        text = render(comparison, args.format)
        for warning in comparison.warnings:
            print(f"ticklab compare: warning: {_line(warning)}", file=sys.stderr)
        if comparison.note:
            print(f"ticklab compare: {comparison.note}", file=sys.stderr)
        print(text)
    except BrokenPipeError:  # `ticklab compare ... | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (CompareError, BundleError) as exc:
        print(f"ticklab compare: {_one_line(exc)}", file=sys.stderr)
        return 2
    return 0


def _verify(args: argparse.Namespace) -> int:
    from .bundle import BundleError, load_bundle

    manifests = sorted(
        {
            m
            for root in args.paths
            for m in ([root / "manifest.json"] if (root / "manifest.json").is_file() else root.rglob("manifest.json"))
        }
    )
    if not manifests:
        print(
            f"ticklab verify: no bundle (manifest.json) under {_line(', '.join(map(str, args.paths)))}", file=sys.stderr
        )
        return 2
    failed = 0
    for manifest in manifests:
        try:
            bundle = load_bundle(manifest.parent)
            count = len(bundle.manifest.files or {})
            print(
                f"ok    {_line(manifest.parent)}  ({count} file{'' if count == 1 else 's'}, {bundle.manifest.status})"
            )
        except BundleError as exc:
            failed += 1
            print(f"FAIL  {_line(manifest.parent)}: {_one_line(exc)}")
    return 1 if failed else 0


class _LateEpilogParser(argparse.ArgumentParser):
    """A parser whose epilog is computed only when its help is shown (``late_epilog``: a function)."""

    def format_help(self) -> str:
        late = getattr(self, "late_epilog", None)
        if late is not None:
            self.epilog = late()
        return super().format_help()


def _kernel_source(given: str) -> Path:
    """A lab host kernel's source: a tarball or tree, or a series (\"7.2\") of kernel/sources.yaml, installed or
    fetched from the suite it names, as the lab kernels' are."""
    if not re.fullmatch(r"\d+\.\d+", given):
        return Path(given)
    from .lab import sources

    found = sources.require(given, progress=False, say=lambda text: print(text, file=sys.stderr, flush=True))
    print(
        f"kernel source {given}: {found.tarball} ({found.package} {found.version}, {found.origin})",
        file=sys.stderr,
        flush=True,
    )
    return found.tarball


def _kernel_sources_epilog() -> str:
    from .lab import sources

    try:
        paths.repo_root()
    except ProjectError as exc:
        return f"kernel sources (kernel/sources.yaml): unknown, {exc}"
    return "kernel sources here (kernel/sources.yaml):\n" + "\n".join(
        f"  {line}" for line in sources.describe().splitlines()
    )


def _progress(args: argparse.Namespace) -> bool:
    """Progress bars on a terminal only: in a log they would be hundreds of carriage-return updates."""
    return not args.no_progress and sys.stderr.isatty()


def _repack(args: argparse.Namespace) -> int:
    from .repack import WHY, main

    return main(args.paths, args.why or WHY)


def _bundle_export(args: argparse.Namespace) -> int:
    from .bundle import BundleError
    from .bundlearchive import ArchiveError, export
    from .safefiles import UnsafeFileError

    try:
        prefixes = export(args.bundles, args.out)
    except (ArchiveError, BundleError, UnsafeFileError, OSError) as exc:
        print(f"ticklab bundle export: {_one_line(exc)}", file=sys.stderr)
        return 2
    print(f"exported {len(prefixes)} sealed bundle(s) to {args.out}")
    return 0


def _bundle_import(args: argparse.Namespace) -> int:
    from .bundle import BundleError
    from .bundlearchive import ArchiveError, import_archive
    from .safefiles import UnsafeFileError

    try:
        done = import_archive(args.archive, args.into)
    except (ArchiveError, BundleError, UnsafeFileError, OSError) as exc:
        print(f"ticklab bundle import: {_one_line(exc)}", file=sys.stderr)
        return 2
    for path in done.added:
        print(f"imported {path}")
    for path, there in done.skipped:
        print(f"skipped {path}: the same sealed bundle (seal digest) is already at {there}")
    print(
        f"{len(done.added)} imported, {len(done.skipped)} already there; "
        f"ticklab report --data-dir {args.into} pools them"
    )
    return 0


def _seal_manifest(args: argparse.Namespace) -> int:
    from .bundle import BundleError, add_manifest_seal

    status = 0
    for path in args.bundles:
        try:
            print(f"sealed {add_manifest_seal(path)}")
        except BundleError as exc:
            print(f"ticklab seal-manifest: {_one_line(exc)}", file=sys.stderr)
            status = 2
    return status


def _view(args: argparse.Namespace) -> int:
    from .bundle import BundleError
    from .paths import cache_dir
    from .report.view import ViewError, build_session, open_in_kernelshark, write_session

    try:
        trace, session, spot = build_session(args.bundle, args.run)
        out = args.session or cache_dir() / "view" / f"{Path(args.bundle).resolve().name}-{args.run or 'first'}.json"
        write_session(session, out)
        opened = session["ticklab"]
        print(
            f"{opened['claim']}: run {opened['run']}, condition {opened['condition']}\n{trace}\n  session {out}\n"
            f"  markers A/B: {spot.what}"
        )
        if opened.get("note"):
            print(f"  note: {opened['note']}")
        if not args.session_only:
            open_in_kernelshark(out).wait()
    except (ViewError, BundleError, KeyError, ValueError) as exc:
        print(f"ticklab view: {_one_line(exc)}", file=sys.stderr)
        return 2
    return 0


def _ingest(args: argparse.Namespace) -> int:
    # Arrow's allocator is chosen when pyarrow is first imported (here, by write_tables): the C library's malloc
    # keeps 14-25 MB less resident than mimalloc, Arrow's default, writing a 600,000-event trace's tables
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
    from .trace.ingest import TraceFormatError, read_trace, write_tables

    try:  # tables are built as they are written, so bad records can surface there too
        # the trace the user named may be a link they made (followed once, here); what ticklab finds inside a
        # directory is never read through a link
        trace = read_trace(args.trace.resolve() if args.trace.is_symlink() else args.trace)
        for key, count in trace.counts().items():
            print(f"{key}: {count} events")
        print(f"lost events: {trace.total_lost}")
        if args.out:
            for path in write_tables(trace, args.out):
                print(path)
    except TraceFormatError as exc:
        print(f"ticklab ingest: {_one_line(exc)}", file=sys.stderr)
        return 2
    return 0


def _whole(low: int, high: int):
    """An argparse type: a whole number from low to high ('--runs -1' is a usage error, not a bundle without runs)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{shown(repr(text), 80)} is not a whole number") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{shown(value, 80)} is not from {low} to {high}")
        return value

    return parse


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{shown(repr(text), 80)} is not a number of seconds") from None
    if not 0 <= value <= 7 * 86400:  # also refuses nan and inf
        raise argparse.ArgumentTypeError(f"{shown(text, 80)} is not from 0 to {7 * 86400} seconds")
    return value


def smallest_deciding_runs(confidence: float = 0.95) -> int:
    """The fewest runs per condition (equal groups) whose exact two-sided CI at ``confidence`` is bounded: the
    verdicts' ratio CI inverts the exact Mann-Whitney test (analysis/stats.ratio_by_ranks), whose smallest two-sided
    p with n runs a side is 2 / C(2n, n). Standard library only (the CLI checks --runs before importing the analysis);
    tests/test_newcomer_path.py holds it to ``analysis.power.smallest_testable_n``."""
    n = 2
    while (1 - confidence) * math.comb(2 * n, n) < 2:
        n += 1
    return n


def runs_warning(runs: int | None) -> str | None:
    """What to say of a --runs too small for any comparison to be decided (None when it can be)."""
    needed = smallest_deciding_runs()
    if runs is None or runs >= needed:
        return None
    smallest_p = 2 / math.comb(2 * runs, runs)
    return (
        f"warning: --runs {runs} is below the {needed} runs per condition an exact 95% CI needs to be bounded "
        f"({runs} vs {runs} runs: the smallest two-sided Mann-Whitney p is {smallest_p:.3g}), so no comparison can be "
        f"decided from these runs (inconclusive); a claim's simultaneous CI over several comparisons needs more: "
        f"the report's runs_needed says how many"
    )


def _say_superseded(args: argparse.Namespace) -> None:
    if getattr(args, "dry_run", False):
        return
    for old in args.supersedes:
        print(
            f"{old}: superseded (its path and seal are in the new bundle's manifest; the analysis leaves it out while "
            "both are in the data); nothing deleted: remove it to free its space",
            file=sys.stderr,
        )


def _superseded_record(text: str) -> dict:
    """--supersedes-record: a record bundle.superseded_record made where the old bundle is (a lab host plan's
    capture runs inside the lab host, the bundle it replaces outside)."""
    try:
        record = json.loads(text)
    except ValueError:
        raise argparse.ArgumentTypeError("not JSON") from None
    if not (
        isinstance(record, dict)
        and isinstance(record.get("bundle"), str)
        and len(record["bundle"].split("/")) == 3
        and isinstance(record.get("seal"), str)
        and re.fullmatch(r"[0-9a-f]{64}", record["seal"])
    ):
        raise argparse.ArgumentTypeError("a record of a bundle ('bundle': <host-id>/<claim>/<bundle>, 'seal': sha256)")
    return record


def _supersedes_argument(parser: argparse.ArgumentParser, records: bool = False) -> None:
    """--supersedes: a recapture names the bundles it replaces; their paths and seals go into its manifest."""
    if records:
        parser.add_argument(
            "--supersedes-record", type=_superseded_record, action="append", default=[], help=argparse.SUPPRESS
        )
    parser.add_argument(
        "--supersedes",
        type=Path,
        action="append",
        default=[],
        metavar="BUNDLE",
        help="a sealed bundle of the same experiment this capture replaces (repeatable): its path and seal are "
        "recorded in the new manifest and the analysis leaves it out while both are in the data; ticklab deletes "
        "nothing (remove it yourself to free its space)",
    )


def _run_count_arguments(parser: argparse.ArgumentParser) -> None:
    """How many runs a capture makes: the same options for host captures and lab runs."""
    parser.add_argument(
        "--runs",
        type=_whole(1, 10000),
        help="measured runs per condition, fixed: no rounds added (default: the experiment's, then "
        f"rounds until the precision target or its budget); below {smallest_deciding_runs()} no 95%% CI is bounded "
        "and ticklab warns",
    )
    parser.add_argument("--warmup", type=_whole(0, 1000), help="warm-up runs per condition (default: the experiment's)")
    parser.add_argument("--seed", type=_whole(0, 2**63 - 1), help="seed of the run order (default: the experiment's)")
    parser.add_argument(
        "--budget-s",
        type=_seconds,
        help="seconds of measured runs the capture may spend adding rounds for precision "
        "(default: the experiment's budget.time_s; 0: none)",
    )
    parser.add_argument(
        "--published-dir",
        type=Path,
        default=_InProject("traces", "published"),
        help="transcribed published numbers the stopping rule's precision targets come from "
        "(default: traces/published/)",
    )


class _InProject:
    """A default path inside the project directory, resolved only once the command line is read (``--project``
    comes first), and only for a command that has it: ``--help`` and commands that need no project never look.
    ``writes``: a default ticklab writes to (build/, traces/ for bundles), inside ``paths.work_dir()`` (the project
    for a checkout; ``~/ticklab`` for the project files a wheel carries, never written). ``data``: the captured
    data, the work directory's traces/ where it has one, else the project's."""

    def __init__(self, *parts: str, writes: bool = False, data: bool = False):
        self.parts = parts
        self.writes = writes
        self.data = data

    def resolve(self) -> Path:
        mine = paths.work_dir().joinpath(*self.parts)
        if self.writes or (self.data and mine.is_dir()):
            return mine
        return paths.repo_root().joinpath(*self.parts)

    def __repr__(self) -> str:
        return "/".join(self.parts) + "/"


# Commands that read the project's files (runners, notebooks, kernel/, tools/bin, traces/published): without a
# project directory they stop at once with one line. The others (ingest, verify, compare of bundles named, view,
# seal-manifest, plan) look for it only if they need it.
NEEDS_PROJECT = {"report", "doctor", "capture", "kernel", "lab"}


def _resolve_project(args: argparse.Namespace) -> None:
    """Apply --project, then the defaults inside the project; ProjectError when the command needs one and there is
    none."""
    if args.project is not None:
        paths.set_project(args.project)
    for key, value in vars(args).items():
        if isinstance(value, _InProject):
            setattr(args, key, value.resolve())
    if args.command in NEEDS_PROJECT or (args.command == "claims" and (args.host or args.lab)):
        paths.repo_root()


class _Parser(argparse.ArgumentParser):
    """argparse, with its usage errors (an invalid choice quotes the argument whole) bounded and escaped; its
    subcommands' parsers are of this class too."""

    def error(self, message: str):
        super().error(_line(message))


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="ticklab", description=__doc__)
    parser.add_argument("--version", action="version", version=f"ticklab {__version__}")
    parser.add_argument(
        "--project",
        type=Path,
        metavar="DIR",
        help=f"the ticklab checkout whose notebooks, runners, kernel/ and traces/ to use (default: "
        f"${paths.ENV}, else the checkout this ticklab runs from or was installed from)",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _add_report_parser(sub)
    _add_verify_published_parser(sub)
    _add_claims_parser(sub)
    _add_doctor_parser(sub)
    _add_restore_parser(sub)
    _add_capture_parser(sub)
    _add_kernel_parser(sub)
    _add_plan_parser(sub)
    _add_lab_parser(sub)
    _add_compare_parser(sub)
    _add_verify_parser(sub)
    _add_bundle_parser(sub)
    _add_seal_manifest_parser(sub)
    _add_view_parser(sub)
    _add_ingest_parser(sub)
    _project_after_command(parser)
    return parser


def _project_after_command(parser: argparse.ArgumentParser) -> None:
    """``--project DIR`` after the command too (``ticklab report --project DIR``): every subcommand's parser takes
    it, with no default of its own, so the one given before the command stands unless one is given after it."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                if any("--project" in a.option_strings for a in child._actions):
                    continue
                child.add_argument(
                    "--project", type=Path, metavar="DIR", default=argparse.SUPPRESS, help="as before the command"
                )
                _project_after_command(child)


def _add_report_parser(sub) -> None:
    report = sub.add_parser("report", help="run every notebook with papermill and build the report")
    report.add_argument(
        "--out",
        type=Path,
        help="output directory (default: build/ for the project's traces/, else DATA_DIR/report: a report of other "
        "data is never replaced by default)",
    )
    report.add_argument(
        "--replace",
        action="store_true",
        help="replace the report in --out even when it is of other data (--data-dir, --published-dir)",
    )
    report.add_argument(
        "--data-dir",
        type=Path,
        default=_InProject("traces", data=True),
        help="where captured bundles live (default: traces/)",
    )
    report.add_argument(
        "--published-dir",
        type=Path,
        default=_InProject("traces", "published"),
        help="transcribed published numbers (default: traces/published/)",
    )
    report.add_argument("--only", nargs="+", metavar="NOTEBOOK", help="run only these notebooks (e.g. 03-hrtick)")
    report.add_argument(
        "--cell-timeout", type=_whole(1, 86400), default=600, help="seconds one cell may run (default 600)"
    )
    report.add_argument(
        "--notebook-timeout",
        type=_whole(1, 7 * 86400),
        default=1800,
        help="seconds one notebook may run (default 1800)",
    )
    report.add_argument(
        "--jobs",
        type=_whole(1, 64),
        default=None,
        help="claims' notebooks run at once (default: one per CPU this process may use)",
    )
    report.add_argument(
        "--no-kernel-fork",
        action="store_true",
        help="start every notebook's kernel and papermill as an ordinary process, not forked from one that imported "
        "what they import (also TICKLAB_KERNEL_FORK=0)",
    )
    report.set_defaults(func=_report)


def _add_verify_published_parser(sub) -> None:
    verify = sub.add_parser("verify-published", help="check the published layer against the source documents")
    verify.add_argument(
        "claims", nargs="*", metavar="CLAIM", help=f"claims to check (default: all of {', '.join(CLAIM_IDS)})"
    )
    verify.add_argument(
        "--published-dir",
        type=Path,
        default=_InProject("traces", "published"),
        help="transcribed published numbers (default: traces/published/)",
    )
    verify.add_argument(
        "--seeds", help="directory of the source documents (default: $TICKLAB_SEEDS or ../shared/seeds)"
    )
    verify.set_defaults(func=_verify_published)


def _add_claims_parser(sub) -> None:
    claims = sub.add_parser("claims", help="list the claim ids (ticklab/claims/<id>.py), one a line")
    which = claims.add_mutually_exclusive_group()
    which.add_argument("--host", action="store_true", help="only claims with an experiment for 'ticklab capture'")
    which.add_argument("--lab", action="store_true", help="only claims with an experiment for 'ticklab lab run'")
    claims.set_defaults(func=_claims)


def _add_doctor_parser(sub) -> None:
    doctor = sub.add_parser("doctor", help="what this host can run for each claim, and why not")
    doctor.add_argument("--json", action="store_true", help="machine-readable output")
    doctor.add_argument("--root", type=Path, default=Path("/"), help=argparse.SUPPRESS)
    doctor.add_argument("--journal", type=Path, help=argparse.SUPPRESS)
    doctor.set_defaults(func=_doctor)


def _add_restore_parser(sub) -> None:
    restore = sub.add_parser(
        "restore",
        help="put back what a capture killed outright (kill -9, a crash) left changed on this host, from its journal",
    )
    restore.add_argument("--root", type=Path, default=Path("/"), help=argparse.SUPPRESS)
    restore.add_argument("--journal", type=Path, help=argparse.SUPPRESS)
    restore.set_defaults(func=_restore)


def _add_capture_parser(sub) -> None:
    cap = sub.add_parser(
        "capture",
        help="run a claim's experiments on this host into sealed bundles",
        description="Run a claim's experiments (runners/<claim>/*.yaml) on this host: warm-ups, then blocks of one "
        "run of every condition in a seeded order, each host change put back after its run, into sealed bundles "
        "under --out; it ends with the claim's headline numbers as measured here beside the source's, the "
        "comparisons it could not test with the command that would, and the report line for the verdicts. Root. "
        "'ticklab doctor' says first what this host can run.",
    )
    cap.add_argument(
        "claim",
        choices=list(CLAIM_IDS),
        metavar="claim",
        help=f"the claim whose experiments to run: one of {', '.join(CLAIM_IDS)} ('ticklab claims --host' lists "
        "those with a host experiment)",
    )
    _run_count_arguments(cap)
    _supersedes_argument(cap, records=True)
    cap.add_argument(
        "--out", type=Path, default=_InProject("traces", writes=True), help="where bundles go (default: traces/)"
    )
    cap.add_argument("--host-id", help="the <host-id> directory (default: a slug of CPU, cores, kernel, virt)")
    cap.add_argument("--experiment", type=Path, help="one experiment file instead of every runners/<claim>/*.yaml")
    cap.add_argument(
        "--backend",
        choices=registry.backend_choices(),
        default="auto",
        help="tracing backend (default: trace-cmd where 'trace-cmd record' works, else tracefs)",
    )
    cap.add_argument("--dry-run", action="store_true", help="print every privileged write, change nothing, run nothing")
    cap.add_argument(
        "--boot",
        choices=registry.BOOT_MODES,
        help="kernel conditions (a kernel, a command line): one boot per run in the seeded order, "
        "resumed by a systemd unit after each reboot: kexec (default choice), grub (one-shot "
        "grub-reboot, where kexec is locked down) or manual (you boot what it says); the default "
        "boot entry is never changed. See 'ticklab plan status|abort'",
    )
    cap.add_argument(
        "--build-kernels",
        action="store_true",
        help="with --boot: first build and install (ticklab kernel build --host) the kernels the "
        "conditions name that are not installed, as the experiment's kernel_builds says, the "
        "estimate said first; with --dry-run, only the estimates",
    )
    cap.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar: one line per run instead (as when the output is not a terminal)",
    )
    cap.add_argument("--root", type=Path, default=Path("/"), help=argparse.SUPPRESS)
    cap.add_argument("--journal", type=Path, help=argparse.SUPPRESS)
    cap.set_defaults(func=_capture)


def _add_kernel_parser(sub) -> None:
    kernel_cmd = sub.add_parser("kernel", help="kernels for this host: ticklab kernel build --host")
    kernel_sub = kernel_cmd.add_subparsers(dest="kernel_command", required=True, metavar="COMMAND")
    host_build = kernel_sub.add_parser(
        "build",
        help="build and install a kernel for this host (running config + "
        "kernel/patches), without changing the default boot entry",
    )
    host_build.add_argument("--host", action="store_true", help="a kernel for this machine (the only kind built here)")
    host_build.add_argument(
        "--config", type=Path, help="kernel config (default: /boot/config-$(uname -r), else /proc/config.gz)"
    )
    host_build.add_argument(
        "--source", type=Path, help="a Linux source tree or tarball (default: /usr/src/linux-source-X.Y.tar.xz)"
    )
    host_build.add_argument(
        "--localmodconfig",
        action="store_true",
        help="keep only the modules loaded now, or those --modules lists (faster build)",
    )
    host_build.add_argument("--jobs", type=_whole(1, 1024), help="parallel compile jobs (default: number of CPUs)")
    host_build.add_argument(
        "--dry-run", action="store_true", help="print config, patches, localversion and steps; change nothing"
    )
    host_build.add_argument(
        "--root",
        type=Path,
        default=Path("/"),
        metavar="DIR",
        help="the system to build for and install into (default: /): e.g. a disk image's mounted "
        "root; its own update-initramfs runs in a chroot",
    )
    host_build.add_argument(
        "--release",
        metavar="RELEASE",
        help="the kernel the system boots, whose config is the base (default: the running one; "
        "for a --root at rest, its only /boot/vmlinuz-*)",
    )
    host_build.add_argument(
        "--modules",
        type=Path,
        metavar="FILE",
        help="with --localmodconfig: the /proc/modules recorded at a boot of the system "
        "(default: /proc/modules of --root, which a system at rest does not have)",
    )
    host_build.add_argument(
        "--fragment",
        type=Path,
        metavar="FILE",
        help="config options set after the base config and --localmodconfig (lines CONFIG_X=value "
        "or '# CONFIG_X is not set'; e.g. kernel/fragments/hz1000.config), checked in the "
        "built config before anything is installed; its name goes into the release "
        "(-ticklab-hz1000-<hash>)",
    )
    host_build.set_defaults(func=_kernel)


def _add_plan_parser(sub) -> None:
    plan = sub.add_parser("plan", help="boot plans (capture --boot): list, status, resume after a reboot, abort")
    plan_sub = plan.add_subparsers(dest="plan_command", required=True, metavar="COMMAND")
    for name, text in (
        ("list", "one line per plan: id, claim/experiment, mode, state, runs made and left, created"),
        ("status", "runs done and left, the current state, what to do next"),
        ("resume", "verify this boot and go on (run by ticklab-plan.service after each reboot)"),
        ("abort", "remove the unit, put back every host change; keep the bundle and the runs made"),
    ):
        one = plan_sub.add_parser(name, help=text)
        if name != "list":
            one.add_argument(
                "--id", dest="plan_id", help="the plan (default: the running one, else the newest; 'ticklab plan list')"
            )
        one.add_argument("--root", type=Path, default=Path("/"), help=argparse.SUPPRESS)
        one.set_defaults(func=_plan)


def _add_lab_parser(sub) -> None:
    lab = sub.add_parser("lab", help="the guest lab: lab kernels, the guest image, experiments in QEMU guests")
    lab_sub = lab.add_subparsers(dest="lab_command", required=True, metavar="COMMAND", parser_class=_LateEpilogParser)
    _add_lab_build_kernel_parser(lab_sub)
    _add_lab_build_image_parser(lab_sub)
    _add_lab_build_host_parser(lab_sub)
    _add_lab_host_plan_parser(lab_sub)
    _add_lab_run_parser(lab_sub)


def _add_lab_build_kernel_parser(lab_sub) -> None:
    kernel = lab_sub.add_parser(
        "build-kernel",
        help="build (or find cached) a lab kernel from a Debian linux-source",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Build a lab kernel from Debian's linux-source-<series> (installed, or\n"
        "fetched from the Debian suite kernel/sources.yaml names into ticklab's\n"
        "cache), kernel/patches/<series>/ and kernel/configs/.",
    )
    kernel.late_epilog = _kernel_sources_epilog
    kernel.add_argument(
        "--hz", type=int, default=1000, help="tick rate: the variant hz<N> of kernel/configs/ (default 1000)"
    )
    kernel.add_argument(
        "--variant",
        nargs="+",
        help="lab kernels instead of --hz: <variant> on the default source (hz1000 hz250) or "
        "<series>-<variant> (7.2-hz1000)",
    )
    kernel.add_argument("--jobs", type=_whole(1, 1024), help="parallel compile jobs (default: number of CPUs)")
    kernel.add_argument("--force", action="store_true", help="rebuild even when cached")
    kernel.add_argument("--no-progress", action="store_true", help="no progress bar")
    kernel.set_defaults(func=_lab)


def _add_lab_build_image_parser(lab_sub) -> None:
    image = lab_sub.add_parser("build-image", help="build (or find cached) the guest initramfs")
    image.add_argument("--force", action="store_true", help="rebuild even when cached")
    image.add_argument(
        "--list-packages",
        action="store_true",
        help="print the Debian packages the image's programs come from (runners/vm/image.yaml) and exit",
    )
    image.set_defaults(func=_lab)


def _add_lab_build_host_parser(lab_sub) -> None:
    build_host = lab_sub.add_parser(
        "build-host",
        help="build (or find cached) the lab host: a Debian 12 disk image "
        "booted by BIOS and grub, for boot plans (runners/vm/lab-host.yaml)",
    )
    build_host.add_argument("--force", action="store_true", help="rebuild even when cached")
    build_host.set_defaults(func=_lab)


def _add_lab_host_plan_parser(lab_sub) -> None:
    host_plan = lab_sub.add_parser(
        "host-plan",
        help="run a boot plan (capture --boot) in the lab host, driven without "
        "interaction, and check the machine from outside afterwards",
    )
    host_plan.add_argument("claim", choices=list(CLAIM_IDS))
    host_plan.add_argument("--boot", choices=registry.LAB_HOST_BOOT_MODES, required=True)
    _supersedes_argument(host_plan)
    host_plan.add_argument(
        "--runs",
        type=_whole(1, 1000),
        help="measured runs per condition, fixed (default: the experiment's, then the rounds its stopping rule adds "
        "across boots)",
    )
    host_plan.add_argument(
        "--warmup", type=_whole(0, 100), help="warm-up runs per condition (default: the experiment's)"
    )
    host_plan.add_argument(
        "--experiment", help="the boot experiment, as a path inside the checkout (runners/<claim>/host-boot-*.yaml)"
    )
    host_plan.add_argument(
        "--abort-after-runs",
        type=_whole(0, 100000),
        metavar="N",
        help="'ticklab plan abort' at the boot after N runs were made, as a user would",
    )
    host_plan.add_argument(
        "--hide-kernel-after-runs",
        type=_whole(0, 100000),
        metavar="N",
        help="move the next run's kernel image away at the boot after N runs were made (put back "
        "when the plan has ended)",
    )
    host_plan.add_argument(
        "--out",
        type=Path,
        help="copy the plan's bundle here, under the lab host's host-id (default: kept in the run's directory only)",
    )
    host_plan.add_argument(
        "--accel", choices=registry.ACCELERATORS, default=registry.TCG.name, help="QEMU accelerator (default tcg)"
    )
    host_plan.add_argument(
        "--budget-s",
        type=_seconds,
        help="seconds the plan's stopping rule may spend adding rounds (default: the experiment's budget.time_s)",
    )
    host_plan.add_argument(
        "--keep-disk",
        action="store_true",
        help="keep the run's disk image (a run that is interrupted or reaches its deadline keeps it anyway)",
    )
    host_plan.add_argument(
        "--resume",
        nargs="?",
        const="newest",
        metavar="RUN_DIR",
        help="boot a kept run's disk again (default: the newest kept run of this claim, --boot and --experiment): "
        "its plan goes on where it stopped, and its bundle is copied out; a plan that had ended is only copied out",
    )
    host_plan.add_argument(
        "--kernel",
        action="append",
        default=[],
        metavar="SOURCE",
        help="build a kernel from this source (tarball or tree, or a series of kernel/sources.yaml "
        "such as 7.2: Debian's linux-source-7.2, fetched if not installed; kernel/patches/<X.Y> "
        "applied) with "
        "'ticklab kernel build --host --root' against the run's copy of the image, keeping the "
        "modules a recorded boot of it loaded, and install it there before the plan (repeat "
        "for several; each build is cached)",
    )
    host_plan.add_argument(
        "--kernel-fragment",
        nargs=2,
        action="append",
        default=[],
        metavar=("SOURCE", "FRAGMENT"),
        help="as --kernel, with 'kernel build --host --fragment FRAGMENT' (a config fragment, e.g. "
        "kernel/fragments/hz1000.config; repeat for several)",
    )
    host_plan.set_defaults(func=_lab)


def _add_lab_run_parser(lab_sub) -> None:
    lab_run = lab_sub.add_parser("run", help="run a claim's lab experiments in QEMU guests into sealed bundles")
    lab_run.add_argument("claim", choices=list(CLAIM_IDS))
    lab_run.add_argument(
        "--accel",
        choices=registry.accel_choices(),
        default="auto",
        help="KVM only if a test guest boots with it (auto, the default), or force one",
    )
    lab_run.add_argument("--smp", type=_whole(1, 256), help="vCPUs (default: the experiment's)")
    lab_run.add_argument("--cmdline", help="extra kernel command-line words for every boot")
    _run_count_arguments(lab_run)
    _supersedes_argument(lab_run)
    lab_run.add_argument(
        "--out", type=Path, default=_InProject("traces", writes=True), help="where bundles go (default: traces/)"
    )
    lab_run.add_argument("--experiment", type=Path, help="one lab experiment file instead of all of the claim's")
    lab_run.add_argument(
        "--backend",
        choices=registry.backend_choices(),
        default="auto",
        help="tracing backend inside the guest (default: trace-cmd where it works)",
    )
    lab_run.add_argument("--no-build", action="store_true", help="fail instead of building a missing lab kernel")
    lab_run.add_argument(
        "--boot",
        choices=registry.GUEST_BOOT_MODES,
        help="play a real host: one guest runs a boot experiment's plan (runners/<claim>/host-boot-*.yaml), "
        "kexecing into each run's command line, as 'ticklab capture --boot kexec' does on a host",
    )
    lab_run.add_argument("--no-progress", action="store_true", help="no progress bars")
    lab_run.set_defaults(func=_lab)


def _add_compare_parser(sub) -> None:
    compare = sub.add_parser(
        "compare", help="mmtests-format compare table of one bundle's conditions or of two bundles"
    )
    compare.add_argument(
        "bundles", nargs="+", type=Path, metavar="BUNDLE", help="one bundle (its conditions) or two (A is the baseline)"
    )
    compare.add_argument(
        "--metric",
        nargs="+",
        help="metrics to compare, or 'all' (default: the metrics the claim's verdicts compare, "
        "the first bundle's claim, those the bundles have; every metric they have when the "
        "claim compares none of them; --metric all for every one)",
    )
    compare.add_argument("--baseline", help="with one bundle: the baseline condition (default: its first)")
    compare.add_argument(
        "--map",
        action="append",
        metavar="A=B",
        help="with two bundles: compare condition A of the first with condition B of the second "
        "(repeatable; conditions no map names pair by name)",
    )
    compare.add_argument("--format", choices=registry.COMPARE_FORMATS, default="text")
    compare.set_defaults(func=_compare)


def _add_verify_parser(sub) -> None:
    verify = sub.add_parser("verify", help="check bundles against their manifests (schema, every file's sha256)")
    verify.add_argument("paths", nargs="+", type=Path, metavar="PATH", help="bundles, or directories holding bundles")
    verify.set_defaults(func=_verify)


def _add_bundle_parser(sub) -> None:
    bundle_cmd = sub.add_parser("bundle", help="sealed bundles: ticklab bundle repack, export, import")
    bundle_sub = bundle_cmd.add_subparsers(dest="bundle_command", required=True, metavar="COMMAND")
    repack = bundle_sub.add_parser(
        "repack",
        help="re-seal sealed bundles with their raw files as the seal keeps them "
        "now (xz, the gap detector's numbers), after checking their per-run "
        "values do not change (docs/ARCHITECTURE.md §4)",
    )
    repack.add_argument("paths", nargs="+", type=Path, metavar="PATH", help="bundles, or directories holding bundles")
    repack.add_argument("--why", help="what the resealed record says (default: the reason of issue 42 item 3)")
    repack.set_defaults(func=_repack)
    exporting = bundle_sub.add_parser(
        "export",
        help="write sealed bundles, each verified first, into one archive to send (a tar of "
        "<host-id>/<claim>/<bundle>/ as they are)",
    )
    exporting.add_argument(
        "bundles", nargs="+", type=Path, metavar="BUNDLE", help="bundles, or directories holding bundles"
    )
    exporting.add_argument("--out", type=Path, required=True, metavar="FILE", help="the archive (must not exist)")
    exporting.set_defaults(func=_bundle_export)
    importing = bundle_sub.add_parser(
        "import",
        help="take the bundles of an archive into a data directory: every seal verified, a tampered or partial "
        "bundle refused, a bundle already there skipped, nothing written outside DIR",
    )
    importing.add_argument("archive", type=Path, metavar="FILE", help="an archive ticklab bundle export wrote")
    importing.add_argument(
        "--into", type=Path, required=True, metavar="DIR", help="the data directory (e.g. traces/fleet)"
    )
    importing.set_defaults(func=_bundle_import)


def _add_seal_manifest_parser(sub) -> None:
    seal = sub.add_parser(
        "seal-manifest",
        help="one-off: give a bundle sealed by an older ticklab its manifest.sha256 "
        "(after checking every file; see SECURITY.md)",
    )
    seal.add_argument("bundles", nargs="+", type=Path, metavar="BUNDLE")
    seal.set_defaults(func=_seal_manifest)


def _add_view_parser(sub) -> None:
    view = sub.add_parser("view", help="open a run's trace.dat in KernelShark with a session preset for the claim")
    view.add_argument("bundle", type=Path, help="a bundle directory")
    view.add_argument("--run", help="the run (default: the first measured run with a trace)")
    view.add_argument("--session", type=Path, help="where to write the session (default: ~/.cache/ticklab/view/)")
    view.add_argument("--session-only", action="store_true", help="write the session, do not start KernelShark")
    view.set_defaults(func=_view)


def _add_ingest_parser(sub) -> None:
    ingest = sub.add_parser("ingest", help="trace.dat or a tracefs capture -> one Parquet table per event")
    ingest.add_argument("trace", type=Path, help="a trace.dat, or a bundle run's trace/ directory")
    ingest.add_argument("--out", type=Path, help="write <system>__<event>.parquet files here")
    ingest.set_defaults(func=_ingest)


# An error line is at most this many characters of message (a value in it is bounded where it is quoted).
MAX_LINE_CHARS = 2000


def _line(text: object) -> str:
    """``text`` as one bounded line: a newline or other control character (in a file name, a value) escaped, so
    nothing from the input can split or flood the line."""
    return shown(text, MAX_LINE_CHARS)


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.filename is not None:
        text = f"{exc.filename}: {exc.strerror or exc}"
    else:
        text = str(exc) or type(exc).__name__
    return _line(text)


def main(argv: list[str] | None = None) -> int:
    """Every command's errors end here: one line naming the file (and field or offset), exit 2 — never a
    traceback for bad input. An error that is not ticklab's own is a bug: one line too, exit 1, and
    TICKLAB_TRACEBACK=1 shows where it came from."""
    args = build_parser().parse_args(argv)
    name = " ".join(
        filter(
            None,
            [
                "ticklab",
                args.command,
                getattr(args, "lab_command", None),
                getattr(args, "kernel_command", None),
                getattr(args, "plan_command", None),
            ],
        )
    )
    try:
        _resolve_project(args)
        warning = runs_warning(getattr(args, "runs", None))
        if warning:
            print(f"{name}: {warning}", file=sys.stderr)
        return args.func(args)
    except ProjectError as exc:  # what is missing is the same for every command: one line, no command name
        print(f"ticklab: {_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        print(f"{name}: interrupted ({exc or 'SIGINT'})", file=sys.stderr)
        return 130
    except Exception as exc:
        if os.environ.get("TICKLAB_TRACEBACK"):
            raise
        if type(exc).__module__.split(".")[0] == "ticklab" or isinstance(exc, OSError):
            print(f"{name}: {_one_line(exc)}", file=sys.stderr)
            return 2
        print(
            f"{name}: unexpected {type(exc).__name__}: {_one_line(exc)} (a ticklab bug: please report it; "
            "TICKLAB_TRACEBACK=1 shows where)",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
