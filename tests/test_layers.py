"""Capture never imports analysis: no module under ticklab/capture or ticklab/lab imports the claims, the
comparisons, the report or the notebooks' modules, at the top or inside a function (docs/ARCHITECTURE.md §1)."""

import ast
from pathlib import Path

import ticklab

PACKAGE = Path(ticklab.__file__).parent
CAPTURE_LAYERS = ("capture", "lab")
ANALYSIS = ("ticklab.claims", "ticklab.comparisons", "ticklab.report", "ticklab.summary", "ticklab.view",
            "ticklab.notebook", "ticklab.captured", "ticklab.fresh")


def module_name(path: Path, package: Path) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path, package: Path) -> list[tuple[int, str]]:
    """Every module ``path`` imports (absolute names; relative imports resolved), with its line, wherever it is."""
    name = module_name(path, package)
    is_package = path.name == "__init__.py"
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base if is_package else base[:-1]
                base = base[:len(base) - (node.level - 1)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module
            # "from . import claims" imports the module ticklab.claims: name each imported name under its origin too
            found += [(node.lineno, origin)] + [(node.lineno, f"{origin}.{alias.name}") for alias in node.names]
    return found


def analysis_imports(package: Path) -> list[str]:
    bad = []
    for layer in CAPTURE_LAYERS:
        for path in sorted((package / layer).rglob("*.py")):
            flagged = set()
            for line, module in imported(path, package):
                if line not in flagged and any(module == a or module.startswith(a + ".") for a in ANALYSIS):
                    flagged.add(line)
                    bad.append(f"{path.relative_to(package.parent)}:{line}: imports {module}")
    return bad


def test_capture_and_lab_import_no_analysis():
    assert analysis_imports(PACKAGE) == []


def test_the_check_finds_a_planted_import_of_the_analysis(tmp_path):
    package = tmp_path / "ticklab"
    (package / "capture").mkdir(parents=True)
    (package / "lab").mkdir()
    (package / "__init__.py").write_text("")
    (package / "capture" / "__init__.py").write_text("")
    (package / "capture" / "fine.py").write_text("from ..bundle import BundleWriter\nfrom . import experiment\n")
    (package / "capture" / "bad.py").write_text("def later():\n    from ..claims import get_claim\n    return get_claim\n")
    (package / "lab" / "worse.py").write_text("import ticklab.comparisons\nfrom .. import report\n")
    assert analysis_imports(package) == [
        "ticklab/capture/bad.py:2: imports ticklab.claims",
        "ticklab/lab/worse.py:1: imports ticklab.comparisons",
        "ticklab/lab/worse.py:2: imports ticklab.report",
    ]
