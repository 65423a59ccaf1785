"""A system-wide perf profile of one command, kept as text: ``python3 -m ticklab.capture.perfprofile -- ARGV``.

An experiment's per-run extra runs this in the run's extra directory (runners/hpet/guest-clock-profile.yaml):

1. ``perf record -a -e cpu-clock -o perf.data -- ARGV``: every CPU sampled while ARGV runs, on a software
   event (a lab guest under QEMU TCG has no hardware PMU), so kernel functions run on any CPU count;
2. ``perf report -i perf.data --stdio --no-children --sort sym --percent-limit L`` into ``perf-report.txt``
   (its stderr into ``perf-report.stderr.txt``); kernel symbols come from /proc/kallsyms of the same boot;
3. ``perf.data`` is removed (``--keep-data`` keeps it): a bundle keeps the text report, not megabytes of
   samples.

Each step is one argv; nothing goes through a shell. The exit status is the first non-zero one of record
and report (ARGV's own status reaches it through perf record's), 0 when both succeed.
It runs in the guest image, so it imports only the standard library.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

DATA = "perf.data"
REPORT = "perf-report.txt"
REPORT_ERRORS = "perf-report.stderr.txt"


def record_argv(argv: list[str], event: str, perf: str = "perf") -> list[str]:
    return [perf, "record", "-a", "-e", event, "-o", DATA, "--", *argv]


def report_argv(percent_limit: float, perf: str = "perf") -> list[str]:
    return [
        perf,
        "report",
        "-i",
        DATA,
        "--stdio",
        "--no-children",
        "--sort",
        "sym",
        "--percent-limit",
        str(percent_limit),
    ]


def profile(
    argv: list[str],
    directory: Path,
    event: str = "cpu-clock",
    percent_limit: float = 0.1,
    keep_data: bool = False,
    perf: str = "perf",
) -> int:
    """Record ``argv`` system-wide in ``directory``, write the text report there; the exit status."""
    recorded = subprocess.run(record_argv(argv, event, perf), cwd=directory, check=False)
    status = recorded.returncode
    data = directory / DATA
    if data.is_file():
        with (directory / REPORT).open("w") as out, (directory / REPORT_ERRORS).open("w") as err:
            reported = subprocess.run(
                report_argv(percent_limit, perf), cwd=directory, stdout=out, stderr=err, check=False
            )
        status = status or reported.returncode
        if not keep_data:
            data.unlink()
    else:
        print(f"perfprofile: perf record wrote no {DATA} (exit {recorded.returncode})", file=sys.stderr)
        status = status or 1
    return status


def main(args: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m ticklab.capture.perfprofile",
        description="perf record -a of a command, kept as perf report text",
    )
    parser.add_argument("--event", default="cpu-clock", help="perf event (default cpu-clock, a software event)")
    parser.add_argument(
        "--percent-limit", type=float, default=0.1, help="leave out symbols below this share of samples (default 0.1)"
    )
    parser.add_argument("--keep-data", action="store_true", help=f"keep {DATA} beside the report")
    parser.add_argument("--perf", default="perf", help="the perf program (default: perf on PATH)")
    parser.add_argument("argv", nargs=argparse.REMAINDER, help="-- the command to profile")
    options = parser.parse_args(args)
    argv = options.argv[1:] if options.argv[:1] == ["--"] else options.argv
    if not argv:
        parser.error("no command to profile (give it after --)")
    return profile(argv, Path.cwd(), options.event, options.percent_limit, options.keep_data, options.perf)


if __name__ == "__main__":
    sys.exit(main())
