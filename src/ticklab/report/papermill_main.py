"""``python -m ticklab.report.papermill_main …``: papermill's own command line, with jsonschema imported first without
its iri-format grammar (:mod:`ticklab.importcost`: 2.4 s of each notebook's papermill process)."""

from __future__ import annotations

from ..importcost import import_jsonschema

if __name__ == "__main__":
    import_jsonschema()
    from papermill.cli import papermill

    papermill()
