"""``python -m ticklab.report.papermill_main …``: papermill's own command line, with jsonschema imported first without
its iri-format grammar (:mod:`ticklab.importcost`: 2.4 s of each notebook's papermill process). Under ``ticklab
report`` the same ``main`` runs in a process forked from the kernels' fork server (kernelfork.py), imports done."""

from __future__ import annotations

from ..importcost import import_jsonschema


def main() -> None:
    import_jsonschema()
    from papermill.cli import papermill

    papermill()


if __name__ == "__main__":
    main()
