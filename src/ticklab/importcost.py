"""jsonschema without the import that costs every process 2.4 s for nothing ticklab uses.

jsonschema checks the "iri" and "iri-reference" formats with rfc3987_syntax when that is installed (jupyter-events'
``jsonschema[format-nongpl]`` extra puts it in the environment), and rfc3987_syntax builds its Lark grammar when it is
imported: 2.4 s of start-up in every process that imports jsonschema — ticklab's commands that validate, each
notebook's kernel, and papermill and nbconvert through nbformat (``python -X importtime``). No schema ticklab or
nbformat validates with has a "format" keyword and ticklab passes no format checker, so jsonschema imported without
that module validates exactly as with it. Only the import is skipped: the module stays importable for anyone else.
"""

from __future__ import annotations

import sys

BLOCKED = "rfc3987_syntax"


def import_jsonschema():
    """The jsonschema module; imported without rfc3987_syntax when this process has imported neither yet."""
    if "jsonschema" not in sys.modules and BLOCKED not in sys.modules:
        sys.modules[BLOCKED] = None  # its import raises ImportError, which jsonschema's _format suppresses
        try:
            import jsonschema
        finally:
            if BLOCKED in sys.modules and sys.modules[BLOCKED] is None:
                del sys.modules[BLOCKED]
    import jsonschema

    return jsonschema
