"""`ticklab capture <claim> --boot kexec|grub|manual`: an experiment whose conditions name a kernel and command-line
words becomes a boot plan (:mod:`ticklab.host.bootplan`): the same seeded, interleaved order ``schedule`` gives a
host capture, one boot per run.

A boot experiment has a ``host_kernel`` knob (``running``, or a release pattern matched against
``/boot/vmlinuz-*``: exactly one installed kernel must match) and usually a ``boot_cmdline`` knob (words added to the
command line the machine has now: ``key=value`` replaces the original's ``key=``, ``-key`` removes it; ``{last_cpu}``
and ``{nproc}`` are filled in). Such files are named ``runners/<claim>/host-boot-*.yaml`` (checked at load), and
``experiment_paths`` leaves them out of host captures and the lab.
"""

from __future__ import annotations

import fnmatch
from pathlib import Path

from ..host import bootplan, facts
from .experiment import Experiment, ExperimentError, boot_experiment_paths, expand_conditions, load_experiment, schedule


def is_boot_experiment(experiment: Experiment) -> bool:
    return "host_kernel" in experiment.knobs.values() and experiment.lab is None


def _variable(experiment: Experiment, kind: str) -> str | None:
    return next((name for name, k in experiment.knobs.items() if k == kind), None)


def installed_releases(root: Path) -> list[str]:
    return sorted(p.name[len("vmlinuz-"):] for p in (root / "boot").glob("vmlinuz-*"))


def resolve_kernel(value: str, root: Path, source: str) -> str:
    if value == "running":
        return "running"
    matches = [r for r in installed_releases(root) if fnmatch.fnmatchcase(r, value)]
    if len(matches) != 1:
        have = ", ".join(installed_releases(root)) or "none"
        raise ExperimentError(f"{source}: kernel {value!r} matches {len(matches)} installed kernels in {root / 'boot'} "
                              f"(have: {have}); build one with 'ticklab kernel build --host' or name it exactly")
    return matches[0]


def boot_experiment(claim: str, experiment_path: Path | None) -> Experiment:
    paths = [experiment_path] if experiment_path else boot_experiment_paths(claim)
    found = [e for e in (load_experiment(p) for p in paths) if is_boot_experiment(e)]
    if not found:
        raise ExperimentError(f"{experiment_path or 'runners/' + claim}: no boot experiment (one with a host_kernel "
                              "knob); --boot runs those only")
    if len(found) > 1:
        raise ExperimentError(f"runners/{claim}: {len(found)} boot experiments ({', '.join(e.path.name for e in found)}); "
                              "name one with --experiment")
    return found[0]


def planned_runs(experiment: Experiment, root: Path, *, runs: int | None = None, warmup: int | None = None,
                 seed: int | None = None) -> list[bootplan.PlannedRun]:
    host = facts.collect(root)
    cpus = host.get("online_cpus") or facts.online_cpus(root)
    fill = {"last_cpu": cpus[-1] if cpus else 0, "nproc": len(cpus) or 1}
    original = (facts.read_text(root / "proc/cmdline") or "").strip()
    conditions = expand_conditions(experiment, host)
    if not conditions:
        raise ExperimentError(f"{experiment.path}: no condition is possible on this host")
    kernel_var, cmdline_var = _variable(experiment, "host_kernel"), _variable(experiment, "boot_cmdline")
    planned = []
    for run in schedule(conditions, runs or experiment.runs, experiment.warmup if warmup is None else warmup,
                        experiment.seed if seed is None else seed):
        values = run.condition.values
        source = f"{experiment.path}: conditions.{run.condition.name}"
        kernel = resolve_kernel(str(values.get(kernel_var, "running")), root, source)
        words = values.get(cmdline_var, "") if cmdline_var else ""
        words = words.split() if isinstance(words, str) else [str(w) for w in words]
        try:
            words = [w.format(**fill) for w in words]
        except (KeyError, ValueError, IndexError) as exc:
            raise ExperimentError(f"{source}: command-line word template ({exc}); known: {{last_cpu}}, {{nproc}}") from None
        planned.append(bootplan.PlannedRun(run.run, run.condition.name, kernel,
                                           bootplan.condition_cmdline(original, words), warmup=run.warmup))
    return planned
