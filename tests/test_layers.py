"""Imports run down the floors, never back up (docs/ARCHITECTURE.md §1): capture and lab import no analysis (but
``analysis.stats``, for the stopping rule), no claims and no report; trace imports nothing of capture, lab, the
analysis, the claims or the report; the analysis imports no claims and no report; the claims no report; host only
itself and the files and schemas below it. An import inside a function counts as much as one at the top. No module
imports a name ``ticklab.MOVED`` keeps for old callers (that would hide an import from these checks), and no two
modules import each other, however far round."""

import ast
from pathlib import Path

import pytest

import ticklab

PACKAGE = Path(ticklab.__file__).parent
ABOVE_CAPTURE = ("ticklab.analysis", "ticklab.claims", "ticklab.report")
# layer (a folder of the package) -> (modules it must not import, exceptions allowed among those)
RULES = {
    "capture": (ABOVE_CAPTURE, ("ticklab.analysis.stats",)),
    "lab": (ABOVE_CAPTURE, ("ticklab.analysis.stats",)),
    "trace": (("ticklab.capture", "ticklab.lab", "ticklab.analysis", "ticklab.claims", "ticklab.report"), ()),
    "analysis": (("ticklab.capture", "ticklab.lab", "ticklab.claims", "ticklab.report"), ()),
    "claims": (("ticklab.report",), ()),
    "host": (
        (
            "ticklab.capture",
            "ticklab.lab",
            "ticklab.trace",
            "ticklab.analysis",
            "ticklab.claims",
            "ticklab.report",
            "ticklab.bundle",
        ),
        (),
    ),
}


def module_name(path: Path, package: Path) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path, package: Path) -> list[tuple[int, str, list[str]]]:
    """Every import statement of ``path``, wherever it is: its line, the module it imports from (absolute; relative
    imports resolved) and each name it imports under that module ("from . import claims" imports the module
    ticklab.claims)."""
    name = module_name(path, package)
    is_package = path.name == "__init__.py"
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, [alias.name]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base if is_package else base[:-1]
                base = base[: len(base) - (node.level - 1)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module
            found.append((node.lineno, origin, [f"{origin}.{alias.name}" for alias in node.names]))
    return found


def within(module: str, names) -> bool:
    return any(module == n or module.startswith(n + ".") for n in names)


def upward_imports(package: Path, rules: dict = RULES) -> list[str]:
    bad = []
    for layer, (forbidden, allowed) in rules.items():
        for path in sorted((package / layer).rglob("*.py")):
            for line, origin, names in imported(path, package):
                wrong = [n for n in names if within(n, forbidden) and not within(n, allowed)]
                if wrong:
                    whole = within(origin, forbidden) and not any(within(a, [origin]) for a in allowed)
                    shown = origin if whole else wrong[0]  # "from ..analysis import verdicts": not all of it
                    bad.append(f"{path.relative_to(package.parent)}:{line}: imports {shown}")
    return bad


def old_name_imports(package: Path, moved=ticklab.MOVED) -> list[str]:
    old = [f"{package.name}.{name}" for name in moved]
    bad = []
    for path in sorted(package.rglob("*.py")):
        for line, origin, names in imported(path, package):
            module = next((m for m in [origin, *names] if within(m, old)), None)
            if module:
                bad.append(f"{path.relative_to(package.parent)}:{line}: imports {module}")
    return bad


def import_circles(package: Path) -> list[list[str]]:
    """Circles of modules importing each other (an import of a module's own package does not count: a package
    runs before its modules)."""
    modules = {module_name(p, package): p for p in package.rglob("*.py")}
    edges = {}
    for name, path in modules.items():
        targets = set()
        for _, origin, names in imported(path, package):
            targets |= {m for m in [origin, *names] if m in modules and m != name and not name.startswith(m + ".")}
        edges[name] = sorted(targets)
    circles, state = [], {}

    def visit(name: str, stack: list[str]) -> None:
        state[name] = "open"
        for target in edges[name]:
            if state.get(target) == "open":
                circles.append(stack[stack.index(target) :] + [name, target] if target in stack else [name, target])
            elif target not in state:
                visit(target, stack + [name])
        state[name] = "done"

    for name in sorted(modules):
        if name not in state:
            visit(name, [])
    return circles


def test_imports_run_down_the_floors():
    assert upward_imports(PACKAGE) == []


@pytest.mark.slow
def test_no_module_imports_an_old_name():
    assert old_name_imports(PACKAGE) == []


@pytest.mark.slow
def test_no_import_circle():
    assert import_circles(PACKAGE) == []


def test_old_names_are_the_modules_where_they_live_now():
    import importlib

    for old, new in ticklab.MOVED.items():
        if old != "papermill_engine":  # papermill imports it from its entry points: tests/test_report.py runs it
            assert importlib.import_module(f"ticklab.{old}") is importlib.import_module(f"ticklab.{new}"), old


def plant(tmp_path: Path, files: dict[str, str]) -> Path:
    package = tmp_path / "ticklab"
    for name, text in {"__init__.py": "", **files}.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(text)
    return package


def test_the_check_finds_planted_upward_imports(tmp_path):
    package = plant(
        tmp_path,
        {
            "capture/__init__.py": "",
            "capture/fine.py": "from ..bundle import BundleWriter\nfrom . import experiment\nfrom ..trace import ingest\n"
            "from ..analysis.stats import log_half_width\n",
            "capture/bad.py": "def later():\n    from ..claims import get_claim\n    return get_claim\n",
            "lab/worse.py": "import ticklab.analysis.comparisons\nfrom .. import report\nfrom ..analysis import stats, verdicts\n"
            "from ..analysis import stats\n",
            "trace/ingest.py": "from ..safefiles import read_bytes\nfrom ..analysis import stats\n",
            "trace/rawfile.py": "def later():\n    from ticklab.capture.workloads import PARSERS\n",
            "analysis/verdicts.py": "from .stats import ratio_interval\nfrom ..trace import tracemetrics\n"
            "from ..report.notebook import open_claim\n",
            "claims/hpet.py": "from ..analysis.comparisons import Comparison\nfrom ..report import view\n",
            "host/knobs.py": "from ..safefiles import OwnedDir\nfrom ..bundle import BundleWriter\n",
        },
    )
    assert upward_imports(package) == [
        "ticklab/capture/bad.py:2: imports ticklab.claims",
        "ticklab/lab/worse.py:1: imports ticklab.analysis.comparisons",
        "ticklab/lab/worse.py:2: imports ticklab.report",
        "ticklab/lab/worse.py:3: imports ticklab.analysis.verdicts",
        "ticklab/trace/ingest.py:2: imports ticklab.analysis",
        "ticklab/trace/rawfile.py:2: imports ticklab.capture.workloads",
        "ticklab/analysis/verdicts.py:3: imports ticklab.report.notebook",
        "ticklab/claims/hpet.py:2: imports ticklab.report",
        "ticklab/host/knobs.py:2: imports ticklab.bundle",
    ]


def test_the_check_finds_a_planted_old_name_and_circle(tmp_path):
    package = plant(
        tmp_path,
        {
            "claims/hpet.py": "from ..stats import median_ci\nfrom ..analysis.stats import median_ci\n",
            "capture/runner.py": "from .boot import planned_runs\n",
            "capture/boot.py": "def later():\n    from .runner import HostExecutor\n",
            "capture/session.py": "from . import stopping\n",
            "capture/stopping.py": "from .. import bundle\n",
            "bundle.py": "from . import capture\n",
        },
    )
    assert old_name_imports(package, {"stats": "analysis.stats"}) == ["ticklab/claims/hpet.py:1: imports ticklab.stats"]
    assert sorted(import_circles(package)) == [
        ["ticklab.capture.boot", "ticklab.capture.runner", "ticklab.capture.boot"]
    ]
