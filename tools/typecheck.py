"""mypy on src/ticklab, held to a per-module baseline (make lint; issue 58).

mypy runs at its default strictness with pyproject.toml's [tool.mypy]. tools/mypy-baseline.txt lists, per module,
how many errors it had when the checker came in: a module with more errors than its entry, or with errors and no
entry, fails; a module with fewer fails too, asking for the baseline to be lowered (``--update`` writes the counts
found), so that a fixed error cannot come back unseen. The baseline only shrinks.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BASELINE = REPO / "tools" / "mypy-baseline.txt"
HEADER = (
    "# mypy's errors per module when the type checker came in (issue 58): tools/typecheck.py fails on any more, and\n"
    "# asks for a lower count when there are fewer. Only ever lowered (python tools/typecheck.py --update).\n"
)
ERROR = re.compile(r"^(?P<path>[^:\s][^:]*\.py):\d+(?::\d+)?: error: ")


def error_counts(output: str) -> Counter[str]:
    """Errors per file in mypy's output (notes are not errors)."""
    return Counter(match["path"] for match in map(ERROR.match, output.splitlines()) if match)


def read_baseline(text: str) -> dict[str, int]:
    baseline = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        count, _, path = line.partition(" ")
        if not count.isdigit() or not path.strip():
            raise ValueError(f"{BASELINE.name}: line {number}: {line!r} is not 'COUNT PATH'")
        baseline[path.strip()] = int(count)
    return baseline


def format_baseline(counts: Counter[str]) -> str:
    return HEADER + "".join(f"{counts[path]} {path}\n" for path in sorted(counts) if counts[path])


def compare(counts: Counter[str], baseline: dict[str, int]) -> tuple[list[str], list[str]]:
    """(over, under): the modules with more errors than their entry (or errors and no entry), and those with fewer."""
    over, under = [], []
    for path in sorted(set(counts) | set(baseline)):
        found, allowed = counts.get(path, 0), baseline.get(path, 0)
        if found > allowed:
            over.append(f"{path}: {found} mypy error(s), the baseline allows {allowed}")
        elif found < allowed:
            under.append(f"{path}: {found} mypy error(s), the baseline still allows {allowed}")
    return over, under


def run_mypy() -> tuple[int, str]:
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-error-summary", "--no-pretty", "--show-error-codes"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    return result.returncode, result.stdout + result.stderr


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--update", action="store_true", help="lower the baseline to the counts found")
    args = parser.parse_args(argv)
    if importlib.util.find_spec("mypy") is None:
        print("tools/typecheck.py: mypy is not installed (make env installs it from the lock)", file=sys.stderr)
        return 2
    status, output = run_mypy()
    counts = error_counts(output)
    # 2: mypy itself failed (a bad config, a crash); 1 without an error line is no type check either
    if status not in (0, 1) or (status == 1) != bool(counts):
        print(output, end="", file=sys.stderr)
        print(f"tools/typecheck.py: mypy exited {status} with {sum(counts.values())} error lines", file=sys.stderr)
        return 2
    try:
        baseline = read_baseline(BASELINE.read_text())
    except (OSError, ValueError) as exc:
        print(f"tools/typecheck.py: {exc}", file=sys.stderr)
        return 2
    over, under = compare(counts, baseline)
    if over:
        worse = {line.split(":", 1)[0] for line in over}
        print("".join(line + "\n" for line in output.splitlines() if line.split(":", 1)[0] in worse), end="")
        print("\n".join(["mypy: more errors than tools/mypy-baseline.txt allows:", *over]), file=sys.stderr)
        return 1
    if args.update:  # only ever lowered: a module over its entry has failed above
        BASELINE.write_text(format_baseline(counts))
        print(f"{BASELINE.relative_to(REPO)}: {sum(counts.values())} errors in {len(+counts)} modules")
        return 0
    if under:
        print(
            "\n".join(["mypy: fewer errors than the baseline: lower it (python tools/typecheck.py --update)", *under]),
            file=sys.stderr,
        )
        return 1
    print(f"mypy: {sum(counts.values())} errors, as tools/mypy-baseline.txt allows ({len(+counts)} modules)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
