"""Imports run down the floors, never back up (docs/ARCHITECTURE.md §1). Every top-level module and folder of the
package has a floor saying what of the package it may import (``MAY_IMPORT``, an allow-list: a new module without
one fails); an import inside a function counts as much as one at the top. No module imports another's private
(underscore) name, none imports a name ``ticklab.MOVED`` keeps for old callers (that would hide an import from these
checks), and no two modules import each other, however far round: in the package, benchmarks/ or tests/."""

import ast
from pathlib import Path

import pytest

import ticklab

PACKAGE = Path(ticklab.__file__).parent
REPO = PACKAGE.parent.parent

# the floor every layer stands on: standard library and the package's own files, schemas and paths
SHARED = ("safefiles", "paths", "importcost", "claimids", "lockfile", "yamlsafe", "schemas", "registry")
# each top-level module or folder -> what of the package it may import, besides itself and the package's __init__
MAY_IMPORT = {
    "safefiles": (),
    "paths": (),
    "importcost": (),
    "claimids": (),
    "lockfile": (),
    "registry": (),
    "yamlsafe": ("safefiles",),
    "schemas": ("safefiles", "importcost"),
    "trace": SHARED,
    "host": SHARED,
    "bundle": (*SHARED, "trace"),
    "analysis": (*SHARED, "trace", "bundle"),
    # the stopping rule asks the statistics how precise a ratio is
    "capture": (*SHARED, "trace", "host", "bundle", "analysis.stats"),
    "lab": (*SHARED, "trace", "host", "bundle", "capture"),
    # the claims read their workloads' raw output with capture's own readers
    "claims": (*SHARED, "trace", "bundle", "analysis", "capture.workloads"),
    "report": (*SHARED, "trace", "bundle", "analysis", "claims"),
    "repack": (*SHARED, "trace", "bundle", "analysis", "claims", "capture.workloads"),
    # 'ticklab bundle export / import': sealed bundles in and out of one archive, each verified by bundle.load_bundle
    "bundlearchive": (*SHARED, "bundle"),
    "doctor": (*SHARED, "trace", "host", "bundle", "capture", "lab"),
    # 'ticklab plan': the run maker comes from the CLI, so the plan command needs only the host's engine
    "plancli": (*SHARED, "host"),
    "cli": "everything",
}


def units(package: Path) -> list[str]:
    """The package's top-level modules and folders (each has a floor)."""
    modules = [p.stem for p in package.glob("*.py") if p.name != "__init__.py"]
    folders = [p.parent.name for p in package.glob("*/__init__.py")]
    return sorted(modules + folders)


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


def unit_of(module: str, package: Path, package_units) -> str | None:
    """The top-level module or folder of the package ``module`` (a dotted name) is in; None outside the package
    and for the package's __init__ and what it defines (``ticklab.__version__``)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == package.name and parts[1] in package_units else None


def disallowed_imports(package: Path, rules: dict = MAY_IMPORT) -> list[str]:
    """Every import of the package's own modules that its floor does not allow, and every top-level module or folder
    that has no floor."""
    package_units = units(package)
    bad = [f"{package.name}/{unit}: no floor (add it to MAY_IMPORT)" for unit in package_units if unit not in rules]
    for path in sorted(package.rglob("*.py")):
        here = unit_of(module_name(path, package), package, package_units)
        allowed = rules.get(here, ())
        if here is None or allowed == "everything":
            continue
        allowed = [f"{package.name}.{a}" for a in (here, *allowed)]
        for line, _origin, names in imported(path, package):
            for name in names:
                if unit_of(name, package, package_units) is not None and not within(name, allowed):
                    bad.append(f"{path.relative_to(package.parent)}:{line}: imports {name}")
                    break
    return bad


def private_imports(package: Path) -> list[str]:
    """Imports of another module's private (underscore) name: a helper shared is a public one."""
    bad = []
    for path in sorted(package.rglob("*.py")):
        for line, origin, names in imported(path, package):
            private = [n for n in names if n.rsplit(".", 1)[-1].startswith("_") and not n.endswith("__")]
            if private and origin != "__future__":
                bad.append(f"{path.relative_to(package.parent)}:{line}: imports {private[0]}")
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
    """Circles of the package's modules importing each other (an import of a module's own package does not count:
    a package runs before its modules)."""
    modules = {module_name(p, package): p for p in package.rglob("*.py")}
    edges = {}
    for name, path in modules.items():
        targets = set()
        for _, origin, names in imported(path, package):
            targets |= {m for m in [origin, *names] if m in modules and m != name and not name.startswith(m + ".")}
        edges[name] = sorted(targets)
    return circles_of(edges)


def flat_import_circles(directory: Path) -> list[list[str]]:
    """Circles among the modules of a folder that import each other by bare name (benchmarks/, tests/)."""
    modules = {p.stem: p for p in directory.glob("*.py")}
    edges = {}
    for name, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level:
                targets.add(node.module)
        edges[name] = sorted(t for t in targets if t in modules and t != name)
    return circles_of(edges)


def circles_of(edges: dict[str, list[str]]) -> list[list[str]]:
    circles, state = [], {}

    def visit(name: str, stack: list[str]) -> None:
        state[name] = "open"
        for target in edges[name]:
            if state.get(target) == "open":
                circles.append(stack[stack.index(target) :] + [name, target] if target in stack else [name, target])
            elif target not in state:
                visit(target, stack + [name])
        state[name] = "done"

    for name in sorted(edges):
        if name not in state:
            visit(name, [])
    return circles


def test_imports_run_down_the_floors():
    assert disallowed_imports(PACKAGE) == []


def test_no_module_imports_another_modules_private_name():
    assert private_imports(PACKAGE) == []


@pytest.mark.slow
def test_no_module_imports_an_old_name():
    assert old_name_imports(PACKAGE) == []


@pytest.mark.slow
def test_no_import_circle():
    assert import_circles(PACKAGE) == []
    assert flat_import_circles(REPO / "benchmarks") == []
    assert flat_import_circles(REPO / "tests") == []


def test_old_names_are_the_modules_where_they_live_now():
    import importlib

    for old, new in ticklab.MOVED.items():
        if old != "papermill_engine":  # papermill imports it from its entry points: tests/test_report.py runs it
            assert importlib.import_module(f"ticklab.{old}") is importlib.import_module(f"ticklab.{new}"), old


def plant(tmp_path: Path, files: dict[str, str]) -> Path:
    """A package ``ticklab`` holding ``files`` (every folder a package)."""
    package = tmp_path / "ticklab"
    for name, text in {"__init__.py": "", **files}.items():
        path = package / name
        for folder in [path.parent, *path.parent.parents]:
            if folder == package.parent:
                break
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "__init__.py").touch()
        path.write_text(text)
    return package


def _module_of(unit: str) -> str:
    return f"{unit}/planted.py" if unit in FOLDERS else f"{unit}.py"


FOLDERS = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}


def test_every_floor_can_fail_on_every_unit_it_may_not_import(tmp_path):
    """For each floor, a module importing every other top-level module or folder: exactly those MAY_IMPORT does not
    list are reported (each rule proved able to fail, and none wider than written)."""
    everything = units(PACKAGE)
    files = {_module_of(unit): "" for unit in everything}
    expected = []
    for unit in everything:
        others = [u for u in everything if u != unit]
        files[_module_of(unit)] = "".join(f"def f{i}():\n    import ticklab.{o}\n" for i, o in enumerate(others))
        allowed = MAY_IMPORT[unit]
        if allowed != "everything":
            expected += [
                f"ticklab/{_module_of(unit)}:{2 * i + 2}: imports ticklab.{o}"
                for i, o in enumerate(others)
                if not within(f"ticklab.{o}", [f"ticklab.{a}" for a in allowed])
            ]
    assert sorted(disallowed_imports(plant(tmp_path, files))) == sorted(expected)
    assert len(expected) > 100  # the table forbids most arrows: a floor that allowed all would shrink this


def test_the_check_finds_planted_upward_imports_however_they_are_written(tmp_path):
    package = plant(
        tmp_path,
        {
            "capture/fine.py": "from ..bundle import BundleWriter\nfrom . import experiment\n"
            "from ..trace import ingest\nfrom ..analysis.stats import log_half_width\nimport papermill.cli\n"
            "from .. import __version__\n",
            "capture/bad.py": "def later():\n    from ..claims import get_claim\n    return get_claim\n",
            "lab/worse.py": "import ticklab.analysis.comparisons\nfrom .. import report\n"
            "from ..analysis import stats, verdicts\nfrom ..capture import session\n",
            "trace/ingest.py": "from ..safefiles import read_bytes\nfrom ..analysis import stats\n",
            "trace/rawfile.py": "def later():\n    from ticklab.capture.workloads import PARSERS\n",
            "analysis/verdicts.py": "from .stats import ratio_interval\nfrom ..trace import tracemetrics\n"
            "from ..report.notebook import open_claim\n",
            "claims/hpet.py": "from ..analysis.comparisons import Comparison\n"
            "from ..capture.workloads import read_ftq\nfrom ..capture.session import add_run\n",
            "host/knobs.py": "from ..safefiles import OwnedDir\nfrom ..bundle import BundleWriter\n",
            "safefiles.py": "from . import paths\n",
            "bundle.py": "from .trace import rawfile\n",
            "paths.py": "",
            "report/notebook.py": "",
            "newtool.py": "from . import bundle\n",
        },
    )
    assert disallowed_imports(package) == [
        "ticklab/newtool: no floor (add it to MAY_IMPORT)",
        "ticklab/analysis/verdicts.py:3: imports ticklab.report.notebook.open_claim",
        "ticklab/capture/bad.py:2: imports ticklab.claims.get_claim",
        "ticklab/claims/hpet.py:3: imports ticklab.capture.session.add_run",
        "ticklab/host/knobs.py:2: imports ticklab.bundle.BundleWriter",
        "ticklab/lab/worse.py:1: imports ticklab.analysis.comparisons",
        "ticklab/lab/worse.py:2: imports ticklab.report",
        "ticklab/lab/worse.py:3: imports ticklab.analysis.stats",
        "ticklab/newtool.py:1: imports ticklab.bundle",
        "ticklab/safefiles.py:1: imports ticklab.paths",
        "ticklab/trace/ingest.py:2: imports ticklab.analysis.stats",
        "ticklab/trace/rawfile.py:2: imports ticklab.capture.workloads.PARSERS",
    ]


def test_the_check_finds_a_planted_private_import(tmp_path):
    package = plant(
        tmp_path,
        {
            "host/knobs.py": "def _run():\n    pass\n",
            "host/plan.py": "from .knobs import HostChanges, _run\n",
            "lab/run.py": "def f():\n    from ..host.knobs import _run\n",
            "trace/ringbuf.py": "from __future__ import annotations\nfrom .tracedat import __doc__\n",
        },
    )
    assert private_imports(package) == [
        "ticklab/host/plan.py:1: imports ticklab.host.knobs._run",
        "ticklab/lab/run.py:2: imports ticklab.host.knobs._run",
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


def test_the_check_finds_a_planted_circle_among_benchmarks(tmp_path):
    (tmp_path / "fuzzcases.py").write_text("import os\n")
    (tmp_path / "fuzzcases_yaml.py").write_text("import fuzzcases as cases\n")
    (tmp_path / "fuzzcases_all.py").write_text("from fuzzcases_yaml import Family\n")
    assert flat_import_circles(tmp_path) == []
    (tmp_path / "fuzzcases.py").write_text("def families():\n    from fuzzcases_all import FAMILIES\n")
    assert flat_import_circles(tmp_path) == [["fuzzcases", "fuzzcases_all", "fuzzcases_yaml", "fuzzcases"]]
