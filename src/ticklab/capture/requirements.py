"""What a host offers an experiment: each requirement is checked by trying, and answers (ok, why). Each kind of
registry.REQUIREMENT_KINDS is checked by the function registered for it (``@checks``)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from ..host import HostChanges
from ..host import facts as host_facts
from ..host.journal import HostChangeError
from ..paths import repo_root, work_dir
from ..registry import REQUIREMENT_KINDS, registrar

Check = Callable[[HostChanges, dict, str], tuple[bool, str]]
CHECKS: dict[str, Check] = {}  # each kind of registry.REQUIREMENT_KINDS -> its check (all of them: checked below)
_KINDS = {kind.name: kind for kind in REQUIREMENT_KINDS}


# @checks("<kind>"): the decorated function is the check of the requirement kind (a name of REQUIREMENT_KINDS),
# called with the host, its facts and the requirement's argument (the kind's default where it is left out)
checks = registrar(CHECKS, _KINDS, "capture/requirements.py: check of {name}: not in the registry, or a second one")


def tools_bin() -> Path:
    """Our measurement programs: tools/bin of the checkout, or, for the project files a wheel carries (their sources in
    site-packages, never written), of ``paths.work_dir()``."""
    return work_dir() / "tools" / "bin"


def build_tools_command() -> str:
    """How to build tools_bin(): 'make tools' in a checkout, else make on the carried sources into the work dir."""
    if work_dir() == repo_root():
        return "make tools"
    return f"make -C {repo_root() / 'tools'} BIN={tools_bin()}"


def check_root(host: HostChanges, facts: dict) -> tuple[bool, str]:
    return (True, "running as root") if os.geteuid() == 0 else (False, "not root: knobs and tracing need root")


def check_tracefs(host: HostChanges, facts: dict) -> tuple[bool, str]:
    mounted = host_facts.tracefs_mount(host.root)
    if mounted:
        return True, f"tracefs at {mounted}"
    if (host.root / "sys/kernel/tracing").is_dir():
        return True, "tracefs not mounted; capture mounts it at /sys/kernel/tracing and unmounts it afterwards"
    return False, "no tracefs (kernel without CONFIG_TRACING?)"


def check_sched_features(host: HostChanges, facts: dict, feature: str = "HRTICK") -> tuple[bool, str]:
    debugfs = host.root / host_facts.DEBUGFS
    if host_facts.sched_features_path(host.root) is None and debugfs.is_dir() and not any(debugfs.iterdir()):
        if host.dry_run:
            return False, "debugfs not mounted (a real run mounts it and tries)"
        try:
            host.mount("debugfs", host_facts.DEBUGFS)
        except HostChangeError as exc:
            return False, f"cannot mount debugfs: {exc}"
    state = host_facts.sched_features(host.root)
    if state["features"] is None:
        return False, f"sched features unreadable: {state['error']}"
    token = next((t for t in state["features"] if t in (feature, f"NO_{feature}")), None)
    if token is None:
        return False, f"{state['path']}: no {feature} feature in this kernel"
    if host.dry_run:
        return True, f"{state['path']} reads {token}; writability not tried in a dry run"
    try:
        host.set_sched_feature(feature, token == feature)  # writes the current value back: a no-op that proves access
    except HostChangeError as exc:
        return False, f"sched features not writable: {exc}"
    return True, f"{state['path']} writable ({token} now)"


def check_cpuidle(host: HostChanges, facts: dict) -> tuple[bool, str]:
    idle = facts["cpuidle"]
    if not idle["driver"]:
        return False, "no cpuidle driver (cpuidle/current_driver: none), so no idle states to configure"
    if len(idle["states"]) < 2:
        return False, f"cpuidle driver {idle['driver']} offers {len(idle['states'])} state(s); need two to compare"
    names = ", ".join(s["name"] for s in idle["states"])
    return True, f"cpuidle driver {idle['driver']}: {names}"


def check_cpuidle_driver(host: HostChanges, facts: dict, wanted: str) -> tuple[bool, str]:
    """Whether the cpuidle driver in charge is ``wanted`` (cpuidle/current_driver): an experiment about one driver's
    idle path (acpi-idle: acpi_idle's I/O-port C-state entry) records another driver's states as data otherwise."""
    idle = facts["cpuidle"]
    states = "; ".join(
        f"{s['name']}" + (f" ({s['desc']})" if s.get("desc") and s["desc"] != s["name"] else "") for s in idle["states"]
    )
    listed = f" (states: {states})" if states else ""
    if not idle["driver"]:
        return False, f"no cpuidle driver (cpuidle/current_driver: none), not {wanted}"
    if idle["driver"] != wanted:
        return False, f"cpuidle driver is {idle['driver']}, not {wanted}{listed}"
    return True, f"cpuidle driver {wanted}{listed}"


def check_program(name: str) -> tuple[bool, str]:
    where = shutil.which(name)
    return (True, where) if where else (False, f"{name} is not installed")


def check_tool(name: str) -> tuple[bool, str]:
    path = tools_bin() / name
    return (True, str(path)) if os.access(path, os.X_OK) else (False, f"{path} missing: run '{build_tools_command()}'")


@checks("root")
def _root(host: HostChanges, facts: dict, argument: str) -> tuple[bool, str]:
    return check_root(host, facts)


@checks("tracefs")
def _tracefs(host: HostChanges, facts: dict, argument: str) -> tuple[bool, str]:
    return check_tracefs(host, facts)


@checks("cpuidle_states")
def _cpuidle_states(host: HostChanges, facts: dict, argument: str) -> tuple[bool, str]:
    return check_cpuidle(host, facts)


@checks("cpuidle_driver")
def _cpuidle_driver(host: HostChanges, facts: dict, argument: str) -> tuple[bool, str]:
    return check_cpuidle_driver(host, facts, argument)


@checks("sched_feature")
def _sched_feature(host: HostChanges, facts: dict, argument: str) -> tuple[bool, str]:
    return check_sched_features(host, facts, argument)


@checks("program")
def _program(host: HostChanges, facts: dict, argument: str) -> tuple[bool, str]:
    return check_program(argument)


@checks("tool")
def _tool(host: HostChanges, facts: dict, argument: str) -> tuple[bool, str]:
    return check_tool(argument)


@checks("tracer")
def _tracer(host: HostChanges, facts: dict, argument: str) -> tuple[bool, str]:
    if argument in (facts.get("tracers") or []):
        return True, f"{argument} tracer available"
    return False, f"no {argument} tracer in this kernel"


if list(CHECKS) != list(_KINDS):
    raise ImportError(f"capture/requirements.py: checks of {list(CHECKS)}; registry.py: {list(_KINDS)}")


def check(requirement: str, host: HostChanges, facts: dict) -> tuple[bool, str]:
    kind, _, argument = requirement.partition(":")
    if kind not in CHECKS:
        raise ValueError(f"unknown requirement {requirement!r}")
    return CHECKS[kind](host, facts, argument or _KINDS[kind].default or "")


def check_all(requires: list[str], host: HostChanges, facts: dict) -> tuple[dict, dict]:
    """Every requirement checked: ({requirement: {"ok", "why"}} for the manifest, {requirement: why} unmet)."""
    checks = {r: check(r, host, facts) for r in requires}
    return (
        {r: {"ok": ok, "why": why} for r, (ok, why) in checks.items()},
        {r: why for r, (ok, why) in checks.items() if not ok},
    )


def missing(requires: list[str], host: HostChanges, facts: dict) -> str:
    """What of ``requires`` this host lacks, in unmet_text's words ('' when nothing)."""
    return unmet_text(check_all(requires, host, facts)[1])


def unmet_text(unmet: dict) -> str:
    """'requirement: why; ...' — how manifests, logs and doctor state what is missing."""
    return "; ".join(f"{r}: {why}" for r, why in unmet.items())
