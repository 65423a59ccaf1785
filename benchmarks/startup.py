"""Start-up of the commands a new user runs first: wall time of a refused experiment, a capture's dry run and --help.

    python benchmarks/startup.py [--runs 5]

Issue 56 item 6: `capture <claim> --experiment X --dry-run` refusing a YAML anchor took 4.4 s with bytecode cached and
10.6 s where PYTHONDONTWRITEBYTECODE is set, because it imported scipy, pandas and the claim's analysis before reading
the file; `capture nohz --dry-run --runs 5` took 2.7 s (pandas through the bundle module and the trace readers) and
without --runs 1.9-2.4 s at load average 4 on 2 cores (the claim's analysis too, for precision goals its stopping
rule never looks at: nohz's experiment sets no budget). `capture hpet --dry-run` is the other kind: its experiment
sets a budget, so the dry run's stopping line counts the claim's comparisons, which needs the claim's analysis
imported. Each command is run --runs times, interleaved, as a fresh process of the venv's `ticklab` script
(`python -m ticklab.cli` where there is none), two ways, both with PYTHONDONTWRITEBYTECODE=1 (as a sandbox sets it):
  cached    PYTHONPYCACHEPREFIX in a private temporary directory, filled by one run of each command (bytecode
            written) before the rounds (as an installed ticklab that has run once, or `make`'s prefix),
  venv      PYTHONPYCACHEPREFIX unset: only the bytecode the venv holds itself (uv's --compile-bytecode, which the
            Makefile keeps out of the prefix) and none of ticklab's own sources (an editable install is not
            compiled), so this is the start of `.venv/bin/ticklab` run directly in a sandbox.
Medians with min-max, in seconds of wall time. The dry run takes the host lock (root): another capture holding it
makes that row an error, said so. The numbers are this machine's at this moment; on a loaded host they are noisy.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = Path(sys.executable).parent / "ticklab"
TICKLAB = [str(SCRIPT)] if SCRIPT.is_file() else [sys.executable, "-m", "ticklab.cli"]


def commands(scratch: Path) -> dict[str, list[str]]:
    anchored = scratch / "anchored.yaml"
    anchored.write_text("claim: nohz\nname: &x a\ndescription: *x\n")
    return {
        "refused experiment (YAML anchor)": [*TICKLAB, "capture", "nohz", "--experiment", str(anchored), "--dry-run"],
        # a real capture (no --dry-run) of a file it does not run: refused, never run
        "refused experiment (a lab one)": [*TICKLAB, "capture", "nohz", "--experiment", "runners/nohz/guest-ftq.yaml"],
        "capture nohz --dry-run": [*TICKLAB, "capture", "nohz", "--dry-run"],
        "capture nohz --dry-run --runs 5": [*TICKLAB, "capture", "nohz", "--dry-run", "--runs", "5"],
        "capture hpet --dry-run (budgeted)": [*TICKLAB, "capture", "hpet", "--dry-run"],
        "ticklab --help": [*TICKLAB, "--help"],
    }


def environments(scratch: Path) -> dict[str, dict[str, str]]:
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONPYCACHEPREFIX", "PYTHONDONTWRITEBYTECODE")}
    return {
        "fill": base | {"PYTHONPYCACHEPREFIX": str(scratch / "pycache")},
        "cached": base | {"PYTHONPYCACHEPREFIX": str(scratch / "pycache"), "PYTHONDONTWRITEBYTECODE": "1"},
        "venv": base | {"PYTHONDONTWRITEBYTECODE": "1"},
    }


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, int, str]:
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    last = done.stderr.strip().splitlines()
    return time.perf_counter() - start, done.returncode, last[-1] if last else ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ticklab-startup-") as name:
        scratch = Path(name)
        cmds, envs = commands(scratch), environments(scratch)
        fill = envs.pop("fill")
        for argv in cmds.values():  # fill the cached prefix
            timed(argv, fill)
        times: dict[tuple[str, str], list[float]] = {}
        errors: dict[tuple[str, str], str] = {}
        for round_number in range(args.runs):
            pairs = [(c, e) for c in cmds for e in envs]
            shift = round_number % len(pairs)
            for command, env in pairs[shift:] + pairs[:shift]:
                seconds, code, err = timed(cmds[command], envs[env])
                times.setdefault((command, env), []).append(seconds)
                if code not in (0, 2) or "held by" in err:
                    errors[(command, env)] = f"exit {code}: {err}"
        print(f"wall time, s: median [min-max] of {args.runs} runs each, interleaved; load average {os.getloadavg()}")
        for (command, env), values in times.items():
            note = f"  ({errors[(command, env)]})" if (command, env) in errors else ""
            print(
                f"  {command:36s} {env:7s} {statistics.median(values):6.2f} [{min(values):.2f}-{max(values):.2f}]{note}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
