"""The type checker's baseline (tools/typecheck.py, tools/mypy-baseline.txt; issue 58): mypy on src/ticklab never
has more errors in a module than its entry, and a module off the list none."""

import importlib.util
import subprocess
import sys
from collections import Counter

import pytest

from conftest import REPO

SPEC = importlib.util.spec_from_file_location("typecheck", REPO / "tools" / "typecheck.py")
typecheck = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(typecheck)


def test_error_counts_are_per_file_and_skip_notes():
    output = (
        "src/ticklab/a.py:3: error: Incompatible types in assignment  [assignment]\n"
        "src/ticklab/a.py:3: note: Right operand is of type 'float | None'\n"
        "src/ticklab/a.py:9:5: error: Item 'None' has no attribute 'x'  [union-attr]\n"
        "src/ticklab/b/c.py:1: error: Name 'y' is not defined  [name-defined]\n"
    )
    assert typecheck.error_counts(output) == Counter({"src/ticklab/a.py": 2, "src/ticklab/b/c.py": 1})


def test_more_errors_or_a_new_module_fails_and_fewer_asks_for_a_lower_baseline():
    baseline = {"src/ticklab/a.py": 2, "src/ticklab/b.py": 3}
    assert typecheck.compare(Counter({"src/ticklab/a.py": 2, "src/ticklab/b.py": 3}), baseline) == ([], [])
    over, under = typecheck.compare(
        Counter({"src/ticklab/a.py": 3, "src/ticklab/new.py": 1, "src/ticklab/b.py": 1}), baseline
    )
    assert over == [
        "src/ticklab/a.py: 3 mypy error(s), the baseline allows 2",
        "src/ticklab/new.py: 1 mypy error(s), the baseline allows 0",
    ]
    assert under == ["src/ticklab/b.py: 1 mypy error(s), the baseline still allows 3"]


def test_baseline_round_trips_and_a_bad_line_is_named():
    counts = Counter({"src/ticklab/b.py": 3, "src/ticklab/a.py": 1})
    text = typecheck.format_baseline(counts)
    assert text.splitlines()[2:] == ["1 src/ticklab/a.py", "3 src/ticklab/b.py"]
    assert typecheck.read_baseline(text) == dict(counts)
    with pytest.raises(ValueError, match=r"mypy-baseline.txt: line 2: 'many src/ticklab/a.py' is not 'COUNT PATH'"):
        typecheck.read_baseline("# header\nmany src/ticklab/a.py\n")


def test_committed_baseline_names_only_existing_modules():
    baseline = typecheck.read_baseline(typecheck.BASELINE.read_text())
    assert baseline, "tools/mypy-baseline.txt is empty: delete it with the checker, or list the modules"
    assert [path for path in baseline if not (REPO / path).is_file()] == []
    assert all(count > 0 for count in baseline.values())


@pytest.mark.slow
def test_mypy_on_the_package_is_within_its_baseline():
    if importlib.util.find_spec("mypy") is None:
        pytest.skip("mypy is not installed (make env installs it from requirements.lock)")
    result = subprocess.run(
        [sys.executable, str(REPO / "tools" / "typecheck.py")], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("mypy: ") and "as tools/mypy-baseline.txt allows" in result.stdout
