"""ticklab: reproduce five Linux-kernel timekeeping, idle and locking performance claims."""

import importlib
import importlib.machinery
import sys

__version__ = "0.1.0"

# Modules that stood flat in ticklab/ until the layers got packages of their own (issue 30): the old name still
# imports the module where it lives now (the same module object), for notebooks and code written against it and
# for installs whose entry points name ticklab.papermill_engine. Nothing inside the package uses these names
# (tests/test_layers.py checks it).
MOVED = {
    "rawfile": "trace.rawfile",
    "tracefs_stats": "trace.tracefs_stats",
    "ringbuf": "trace.ringbuf",
    "tracedat": "trace.tracedat",
    "ingest": "trace.ingest",
    "tracemetrics": "trace.tracemetrics",
    "tracespots": "trace.tracespots",
    "tickcost": "trace.tickcost",
    "published": "analysis.published",
    "stats": "analysis.stats",
    "power": "analysis.power",
    "verdicts": "analysis.verdicts",
    "comparisons": "analysis.comparisons",
    "checks": "analysis.checks",
    "captured": "analysis.captured",
    "outputs": "analysis.outputs",
    "forest": "analysis.forest",
    "summary": "report.summary",
    "notebook": "report.notebook",
    "view": "report.view",
    "compare": "report.compare",
    "outdir": "report.outdir",
    "papermill_engine": "report.papermill_engine",
    "hostkernel": "capture.hostkernel",
}


class _MovedModules:
    """Finds ``ticklab.<old name>`` (``MOVED``) and hands back the module at its new place (a meta path finder and
    its loader; standard library only, as the lab guest imports this package too)."""

    def find_spec(self, fullname, path=None, target=None):
        package, _, name = fullname.partition(".")
        if package == __name__ and name in MOVED:
            return importlib.machinery.ModuleSpec(fullname, self)
        return None

    def create_module(self, spec):
        return importlib.import_module(f"{__name__}.{MOVED[spec.name.partition('.')[2]]}")

    def exec_module(self, module):
        pass  # already executed where it lives


if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
    sys.meta_path.append(_MovedModules())
