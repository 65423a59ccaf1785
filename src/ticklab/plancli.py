"""``ticklab plan list|status|resume|abort``: the boot-plan engine (:mod:`ticklab.host.plan_engine`) as a command."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from .host.journal import HostChangeError
from .host.plan_engine import RunMaker, abort, record_boot_only, resume
from .host.plan_state import NoPlan, Plan, PlanError, default_plan, list_lines, load, one_line


def status_text(plan: Plan) -> str:
    """What ``ticklab plan status`` prints: runs made, failed and left, the run under way (or cut short), why the plan
    ended, and what comes next."""
    made = sum(r.state == "made" for r in plan.runs)
    failed = [r for r in plan.runs if r.state == "failed"]
    left = sum(r.state == "planned" for r in plan.runs)
    current = plan.current()
    cut = 1 if current and plan.state != "running" else 0
    lines = [
        f"plan {plan.id} ({plan.mode}), {plan.state}: {made} made, {len(failed)} failed, "
        + (f"{cut} cut short, " if cut else "")
        + f"{left} left of {len(plan.runs)}; bundle {plan.bundle}",
        f"original: {plan.original['release']} '{plan.original['cmdline']}'",
    ]
    if current and plan.state == "running":
        lines.append(
            f"now: run {current.name} ({current.condition}) {current.state}: kernel {current.kernel}, "
            f"command line '{current.cmdline}'"
        )
    elif current:  # the plan ended while this run's boot was under way: it was never made
        lines.append(
            f"not made: run {current.name} ({current.condition}) was {current.state} when the plan "
            f"{plan.state} (command line '{current.cmdline}')"
        )
    lines += [f"failed: {r.name} ({r.condition}): {r.why}" for r in failed]
    if plan.ended_because:
        lines.append(f"ended: {plan.ended_because}")
    if plan.state == "running":
        lines.append(
            "next: "
            + (
                "the unit resumes after the boot; 'ticklab plan abort' ends the plan"
                if current
                else "'ticklab plan resume' boots the next run"
            )
        )
    return "\n".join(lines)


def command(
    args: argparse.Namespace, maker_for: Callable[[Plan, Path], RunMaker | None] = lambda plan, root: None
) -> int:
    """``ticklab plan list|status|resume|abort``; ``maker_for(plan, root)`` gives the capture's :class:`RunMaker`
    (None: a plan made without a capture, whose runs record the boot only). Without ``--id`` a command acts on
    :func:`default_plan`; ``list`` and ``status`` with no plan on the host say so and exit 0."""
    root = Path(args.root)
    try:
        if args.plan_command == "list":
            print("\n".join(list_lines(root)))
            return 0
        plan_id = getattr(args, "plan_id", None) or default_plan(root)
        if args.plan_command == "status":
            print(status_text(load(root, plan_id)))
        elif args.plan_command == "resume":
            resume(plan_id, maker_for(load(root, plan_id), root) or record_boot_only, root=root)
        else:
            plan = load(root, plan_id)
            try:
                maker = maker_for(plan, root)
            except Exception as exc:  # an abort puts the host back even when the capture side cannot be set up
                print(f"ticklab plan abort: the bundle will not be sealed ({one_line(exc)})", file=sys.stderr)
                maker = None
            abort(plan_id, root=root, maker=maker)
    except NoPlan as exc:
        if args.plan_command in ("list", "status"):
            print(exc)
            return 0
        print(f"ticklab plan {args.plan_command}: {exc}", file=sys.stderr)
        return 2
    except (PlanError, HostChangeError) as exc:
        print(f"ticklab plan {args.plan_command}: {exc}", file=sys.stderr)
        return 2
    return 0
