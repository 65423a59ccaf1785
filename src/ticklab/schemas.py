"""JSON Schemas of what ticklab reads: bundle manifests, results.csv rows, experiment YAML, published
provenance and notebook parameters. :func:`check` validates with jsonschema and raises the caller's
error type with one line naming the file and the field (``runs[3].status: ...``)."""

from __future__ import annotations

import math
import re
from typing import Any

from .safefiles import shown


class DependencyError(ImportError):
    """A package ticklab needs is missing or too old (the CLI says so in one line)."""


# Validation is never silently off: without jsonschema >= 4 (Draft 2020-12) this module does not import (the lab
# guest's image carries it too, runners/vm/image.yaml).
try:
    from .importcost import import_jsonschema

    jsonschema = import_jsonschema()
    import jsonschema.exceptions
except ImportError as exc:
    raise DependencyError(
        f"ticklab needs jsonschema >= 4 to validate what it reads ({exc}); install it: "
        "pip install 'jsonschema>=4' (make env installs requirements.lock)"
    ) from exc
if not hasattr(jsonschema, "Draft202012Validator"):
    raise DependencyError(
        f"ticklab needs jsonschema >= 4 (Draft 2020-12 schemas); this is jsonschema "
        f"{getattr(jsonschema, '__version__', 'older than 4')}: pip install 'jsonschema>=4'"
    )

RUN_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"  # also claim, experiment and host ids: never a path separator
# a directory a manifest names under raw/ or a run's directory (run-001/gapdet, trace): names as above, no '..'
RAW_DIRECTORY = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}(/[A-Za-z0-9][A-Za-z0-9._-]{0,99}){0,2}$"
MAX_RUNS = 10000  # measured runs per condition a capture may be asked for (--runs, runs:, budget.max_runs)
# A relative path inside a bundle: no leading '/', no '.' or '..' part, no empty part, no backslash.
BUNDLE_FILE = r"^(?!.*(^|/)\.\.?(/|$))[^/\\\x00]+(/[^/\\\x00]+)*$"
# Kernel names an experiment gives (issue 55 item 6): they become tracefs paths and filter lines, so never a '/', a
# '..' or a character the kernel does not put in a name. A trace event is system:event (tracefs'
# events/<system>/<event>; a system may start with a digit, 9p), a function or symbol a C identifier with
# '.'-suffixes (foo.isra.0, as kallsyms has them).
TRACE_EVENT = r"^[A-Za-z0-9_]{1,64}:[A-Za-z_][A-Za-z0-9_]{0,127}$"
KERNEL_SYMBOL = r"^[A-Za-z_][A-Za-z0-9_]{0,255}(\.[A-Za-z0-9_]{1,64}){0,4}$"
# A number as results.csv writes it: finite (no nan, inf), plain or exponent form.
FINITE_NUMBER = r"^[-+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+)?$"
TEXT = {"type": "string", "minLength": 1, "maxLength": 1000}
COUNT = {"type": "integer", "minimum": 0}

NUMBER_OR_NULL = {"type": ["number", "null"], "minimum": 0}
COUNT_OR_NULL = {"type": ["integer", "null"], "minimum": 0}
# What else the machine was doing during a run (ticklab.capture.interference); bundles before it have none.
INTERFERENCE = {
    "type": ["object", "null"],
    "required": ["busy"],
    "properties": {
        "busy": {"type": ["boolean", "null"]},
        "why": {"type": ["string", "null"]},
        "cpus": {"type": "integer", "minimum": 1},
        "interval_s": {"type": "number", "exclusiveMinimum": 0},
        "samples": COUNT,
        "samples_over_cpus": COUNT,
        "load1_before": NUMBER_OR_NULL,
        "load1_max": NUMBER_OR_NULL,
        "runnable_before": COUNT_OR_NULL,
        "runnable_max": COUNT_OR_NULL,
        "runnable_mean": NUMBER_OR_NULL,
        "other_runnable_before": COUNT_OR_NULL,
        "other_runnable_max": COUNT_OR_NULL,
        "other_runnable_mean": NUMBER_OR_NULL,
        "steal_fraction": {"type": ["number", "null"], "minimum": 0, "maximum": 1},
    },
}

TRACE_RECORD = {
    "type": ["object", "null"],
    "properties": {"lost_events": COUNT, "directory": {"type": "string", "pattern": RAW_DIRECTORY}},
}
# what a run, an extra or a profile wrote under raw/: analyses open files below its directory
RAW_OUTPUT = {
    "type": "object",
    "properties": {"directory": {"type": "string", "pattern": RAW_DIRECTORY}, "trace": TRACE_RECORD},
}

RUN_RECORD = {
    "type": "object",
    "required": ["run", "condition"],
    "properties": {
        "run": {"type": "string", "pattern": RUN_NAME},
        "condition": TEXT,
        "status": TEXT,
        "warmup": {"type": "boolean"},
        "order": COUNT,
        "problem": {"type": ["string", "null"]},
        "exit_status": {"type": ["integer", "null"]},
        "start": {"type": ["number", "null"]},
        "end": {"type": ["number", "null"]},
        "values": {"type": "object"},
        "argv": {"type": "array"},
        "trace": TRACE_RECORD,
        "extras": {"type": "array", "items": RAW_OUTPUT},  # per-run extras: each in raw/<run>/<name>
        "knobs": {"type": "array"},
        "interference": INTERFERENCE,  # optional: the machine the run competed on (a lab run's physical host)
        "guest_interference": INTERFERENCE,  # a lab run's guest, as the guest saw it
    },
}

MANIFEST = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["schema_version", "status", "claim", "experiment", "definition", "host", "runs"],
    "properties": {
        "schema_version": {"const": 1},
        "status": {"enum": ["incomplete", "sealed"]},
        "claim": {"type": "string", "pattern": RUN_NAME},
        "experiment": {"type": "string", "pattern": RUN_NAME},
        "host_id": {"type": "string", "pattern": RUN_NAME},
        "definition": {"type": "object"},
        "host": {"type": "object"},
        "runs": {"type": "array", "items": RUN_RECORD},
        "extras": {"type": "array", "items": RAW_OUTPUT},  # once-per-condition cross-checks
        "profiles": {"type": "array", "items": RAW_OUTPUT},
        "conditions": {
            "type": "array",
            "items": {"type": "object", "required": ["name"], "properties": {"name": TEXT}},
        },
        "files": {
            "type": "object",
            "propertyNames": {"pattern": BUNDLE_FILE, "maxLength": 4096},
            "additionalProperties": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
        },
        "not_testable": {"type": ["string", "null"]},
        "stopping": {"type": ["object", "null"]},
        "runs_per_condition": {"type": "integer", "minimum": 1},
        "warmup_per_condition": COUNT,
    },
    "if": {"properties": {"status": {"const": "sealed"}}},
    "then": {"required": ["files"]},
}

RESULT_ROW = {
    "type": "object",
    "required": ["run", "condition", "metric", "value", "unit"],
    "properties": {
        "run": {"type": "string", "pattern": RUN_NAME},
        "condition": TEXT,
        "metric": {"type": "string", "pattern": r"^[A-Za-z0-9_.:-]{1,200}$"},
        "value": {"type": "string", "pattern": FINITE_NUMBER},
        "unit": {"type": "string", "maxLength": 100},
    },
}

CONDITION_VALUE = {
    "anyOf": [
        {"type": ["string", "number", "boolean", "null"]},
        {"type": "array", "maxItems": 1000, "items": {"type": ["string", "number", "boolean"]}},
        {
            "type": "object",
            "required": ["per_cpu"],
            "additionalProperties": False,
            "properties": {"per_cpu": {"type": "number", "exclusiveMinimum": 0, "maximum": 1024}},
        },
    ]
}

# a row of a claim's published layer, as an experiment's answer names it: <table>/<row id>
PUBLISHED_ROW = {"type": "string", "pattern": r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$"}


def requirement_schema(kinds) -> dict:
    """A requirement of one of ``kinds`` (registry.REQUIREMENT_KINDS): its name, then ``:`` and an argument of its form
    where it takes one (optionally where it has a default)."""
    forms = [
        re.escape(kind.name)
        if kind.argument is None
        else f"{re.escape(kind.name)}(:{kind.argument})" + ("?" if kind.default is not None else "")
        for kind in kinds
    ]
    return {"type": "string", "pattern": f"^({'|'.join(forms)})$"}


def experiment_schema(*, metric_sets, backends, accels, requirement_kinds) -> dict:
    """The schema of a runners/<claim>/*.yaml experiment. The names that have a registry elsewhere come from it
    (capture/experiment.py passes them, from ticklab/registry.py): ``metric_sets`` METRIC_SET_EVENTS' names,
    ``backends`` backend_choices(), ``accels`` lab_accel_choices(), ``requirement_kinds`` REQUIREMENT_KINDS (what
    capture/requirements.check knows how to check)."""
    metric_set = {"type": "string", "enum": list(metric_sets)}
    requirement = requirement_schema(requirement_kinds)
    return {
        "type": "object",
        "required": ["claim", "name", "description", "conditions", "workload"],
        "properties": {
            "claim": {"type": "string", "pattern": RUN_NAME},
            "name": {"type": "string", "pattern": RUN_NAME},
            "description": {"type": "string"},
            "conditions": {
                "oneOf": [
                    {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "required": ["name"],
                            "properties": {"name": {"type": ["string", "number"]}},
                            "additionalProperties": CONDITION_VALUE,
                        },
                    },
                    {
                        "type": "object",
                        "required": ["matrix"],
                        "additionalProperties": False,
                        "properties": {
                            "matrix": {"type": "object", "minProperties": 1, "additionalProperties": CONDITION_VALUE}
                        },
                    },
                ]
            },
            "workload": {
                "type": "object",
                "required": ["argv"],
                "properties": {
                    "argv": {"type": "array", "minItems": 1, "items": {"type": ["string", "number"]}},
                    "tool": {"type": "string"},
                },
            },
            "runs": {"type": "integer", "minimum": 1, "maximum": MAX_RUNS},
            # the measured CPU left to the workload: every movable interrupt and other task moved off it for each run
            "isolate": {
                "type": "object",
                "required": ["cpu"],
                "additionalProperties": False,
                # "last": the CPU the workloads' {last_cpu} names (the others are the housekeeping CPUs)
                "properties": {"cpu": {"const": "last"}, "rt_throttling": {"enum": ["on", "off"]}},
            },
            "warmup": {"type": "integer", "minimum": 0, "maximum": 1000},
            "seed": {"type": "integer", "minimum": 0, "maximum": 2**63 - 1},  # as --seed
            "timeout_s": {"type": "number", "exclusiveMinimum": 0, "maximum": 7 * 86400},
            "requires": {"type": "array", "items": requirement},
            # a trace records its events: a trace section with neither them nor a metric set (whose events
            # capture/experiment.py traces when the list is left out) has nothing to record
            "trace": {
                "type": ["object", "null"],
                "if": {"not": {"required": ["metrics"]}},
                "then": {"required": ["events"]},
                "properties": {
                    "events": {"type": "array", "items": {"type": "string", "pattern": TRACE_EVENT}},
                    # traced where the running kernel has them (e.g. timer:hrtimer_rearm, 7.1+); the run's trace record
                    # lists those it lacked (absent_events)
                    "optional_events": {"type": "array", "items": {"type": "string", "pattern": TRACE_EVENT}},
                    "symbols": {"type": "array", "items": {"type": "string", "pattern": KERNEL_SYMBOL}},
                    "buffer_kb": {"type": "integer", "minimum": 1, "maximum": 1 << 22},
                    # kernel functions whose every call the function tracer records (a C identifier each)
                    "functions": {"type": "array", "items": {"type": "string", "pattern": KERNEL_SYMBOL}},
                    # which per-run metrics its trace gives results.csv: a set of registry.METRIC_SET_EVENTS, or a
                    # list of them
                    "metrics": {
                        "anyOf": [
                            metric_set,
                            {"type": "array", "minItems": 1, "uniqueItems": True, "items": metric_set},
                        ]
                    },
                    # the tracefs trace clock; "mono" is CLOCK_MONOTONIC, the clock our tools stamp their samples
                    # with, so their samples and the trace's events can be matched one by one (default: the
                    # kernel's, "local")
                    "clock": {"enum": ["local", "global", "mono", "mono_raw", "boot"]},
                },
            },
            "knobs": {"type": ["object", "null"], "additionalProperties": {"type": "string"}},
            "profile": {"type": ["object", "null"]},
            "extras": {
                "type": ["array", "null"],
                "items": {
                    "type": "object",
                    "required": ["name", "argv"],
                    "additionalProperties": False,
                    "properties": {
                        "name": {"type": "string", "pattern": RUN_NAME},
                        "argv": {"type": "array"},
                        "requires": {"type": "array", "items": requirement},
                        "per_run": {"type": "boolean"},
                        # recorded with the experiment's trace into
                        # raw/<run>/<name>/trace (per_run extras only)
                        "traced": {"type": "boolean"},
                    },
                },
            },
            "notes": {"type": ["string", "null"]},
            # what the machine must be for a run to count (analysis/checks.py: a run on another clocksource is left
            # out); not for an experiment whose condition is the clocksource
            "assumes": {
                "type": "object",
                "additionalProperties": False,
                "properties": {"clocksource": {"type": "string", "pattern": "^[a-z0-9_-]{1,32}$"}},
            },
            "kernel_builds": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["kernel", "series"],
                    "additionalProperties": False,
                    "properties": {
                        "kernel": {"type": "string", "minLength": 1, "maxLength": 100},
                        "series": {"type": "string", "pattern": r"^[0-9]+\.[0-9]+$"},
                        "localmodconfig": {"type": "boolean"},
                        # a config fragment in the checkout (kernel/fragments/*.config): --fragment
                        "fragment": {"type": "string", "pattern": r"^kernel/fragments/[a-z0-9-]+\.config$"},
                    },
                },
            },
            "lab": {
                "type": ["object", "null"],
                "properties": {
                    "kernel": {"type": "string", "pattern": RUN_NAME},
                    "smp": {"type": "integer", "minimum": 1, "maximum": 256},
                    "memory_mb": {"type": "integer", "minimum": 64, "maximum": 1 << 20},
                    "cmdline": {"type": "string"},
                    "accel": {"enum": list(accels)},
                    "boot_timeout_s": {"type": "number", "exclusiveMinimum": 0, "maximum": 86400},
                    "pin_vcpus": {"type": "boolean"},
                    # the tracing backend inside the guest when the command line leaves it at auto
                    "backend": {"enum": list(backends)},
                    # extra ACPI tables for the guest (QEMU -acpitable): ASL sources in the checkout, compiled with
                    # iasl by `ticklab lab run` (lab/qemu.compile_acpi_table), e.g. acpi-idle's SSDT with _CST
                    "acpi_tables": {
                        "type": "array",
                        "minItems": 1,
                        "maxItems": 4,
                        "uniqueItems": True,
                        "items": {"type": "string", "pattern": r"^runners/[a-z0-9-]+/[a-z0-9][a-z0-9-]*\.asl$"},
                    },
                },
            },
            "budget": {
                "type": ["object", "null"],
                "properties": {
                    "time_s": {"type": "number", "minimum": 0, "maximum": 7 * 86400},
                    "max_runs": {"type": "integer", "minimum": 1, "maximum": MAX_RUNS},
                },
            },
            # what 'ticklab capture' prints once the bundle is sealed (capture/answer.py): the quantities the source
            # names, as results.csv metrics, each beside the rows of traces/published/<claim>/ (<table>/<row id>) the
            # source printed it in; cost_at_rate: a printed cost per event (a time) times this host's measured rate
            "answer": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["metric", "says"],
                    "additionalProperties": False,
                    "properties": {
                        "metric": {"type": "string", "pattern": RUN_NAME},
                        "says": {"type": "string", "minLength": 1, "maxLength": 200},
                        "percent": {"type": "boolean"},
                        "printed": {"type": "array", "items": PUBLISHED_ROW},
                        "cost_at_rate": {
                            "type": "object",
                            "required": ["cost", "rate"],
                            "additionalProperties": False,
                            "properties": {"cost": PUBLISHED_ROW, "rate": {"type": "string", "pattern": RUN_NAME}},
                        },
                    },
                },
            },
        },
    }


PROVENANCE = {
    "type": "object",
    "required": ["source", "tables"],
    "properties": {
        "claim": {"type": "string", "pattern": "^[a-z0-9-]+$"},
        "source": {
            "type": "object",
            "required": ["file"],
            "properties": {
                "file": {"type": "string", "pattern": BUNDLE_FILE},
                "sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
            },
        },
        "tables": {
            "type": "object",
            "minProperties": 1,
            "propertyNames": {"pattern": r"^[A-Za-z0-9_.-]+\.csv$"},
            "additionalProperties": {
                "type": ["object", "null"],
                "properties": {
                    "description": {"type": "string"},
                    "rows": {
                        "type": ["object", "null"],
                        "additionalProperties": {
                            "type": "object",
                            "required": ["quote"],
                            "properties": {
                                "quote": {"type": "string", "minLength": 1},
                                "token": {"type": ["integer", "null"], "minimum": 0},
                            },
                        },
                    },
                },
            },
        },
        "not_transcribed": {"type": ["array", "null"]},
    },
}

NOTEBOOK_PARAMETERS = {
    "type": "object",
    "properties": {
        "data_dir": {"type": "string", "minLength": 1},
        "published_dir": {"type": "string", "minLength": 1},
        "output_dir": {"type": "string", "minLength": 1},
        "alpha": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
        "n_boot": {"type": "integer", "minimum": 100, "maximum": 1_000_000},
        "seed": {"type": "integer", "minimum": 0},
        "claims": {"type": "string", "pattern": "^[a-z0-9,-]*$"},
    },
}


def yaml_value_problem(exc: ValueError) -> str:
    """What a ValueError from ``yaml.safe_load`` says, in words for an error line."""
    text = " ".join(str(exc).split())
    if "integer string conversion" in text:  # int() of a number of over 4300 digits (Python's own limit)
        return "a number of thousands of digits"
    return shown(text)


def _where(path) -> str:
    where = ""
    for part in path:
        # a key from the input: bounded, and no newline in it can split the error line
        where += f"[{part}]" if isinstance(part, int) else (f".{shown(part, 80)}" if where else shown(part, 80))
    return where or "(top level)"


# An integer of more bits than this is refused wherever a schema checks it: no count, seed or size needs
# thousands of digits, and Python cannot print one of over 4300 (jsonschema's own messages would raise).
MAX_INT_BITS = 1024


def _short(value: Any) -> str:
    try:
        text = repr(value)
    except ValueError:  # holds an integer too long to print
        return shown(value, 57) if isinstance(value, int) else f"a {type(value).__name__} holding a huge integer"
    return shown(text, 57) if len(text) > 60 else text


def _unusable_number(value: Any) -> bool:
    return (isinstance(value, float) and not math.isfinite(value)) or (
        isinstance(value, int) and value.bit_length() > MAX_INT_BITS
    )


def _non_finite(instance: Any, path: tuple = ()) -> tuple | None:
    """Where ``instance`` holds a NaN or infinity (YAML's .nan and .inf) or an integer of hundreds of digits, or
    None. JSON Schema's number bounds do not catch the first: NaN compares false with every bound (timeout_s: .nan
    would disable the timeout); the second would make jsonschema's own message raise."""
    if _unusable_number(instance):
        return path
    items = (
        instance.items() if isinstance(instance, dict) else enumerate(instance) if isinstance(instance, list) else ()
    )
    for key, value in items:
        found = _non_finite(value, (*path, key))
        if found is not None:
            return found
    return None


_VALIDATORS: dict[int, tuple[dict, Any]] = {}


def _validator(schema: dict):
    """One validator per schema for the process: building one costs more than checking a results.csv row with it
    (a bundle has thousands). Keyed by identity, the schema kept beside it so that its id is never reused."""
    found = _VALIDATORS.get(id(schema))
    if found is None or found[0] is not schema:
        found = _VALIDATORS[id(schema)] = (schema, jsonschema.Draft202012Validator(schema))
    return found[1]


def problem(instance: Any, schema: dict) -> str | None:
    """The first schema violation as 'field: what is wrong', or None. No number may be NaN or infinite."""
    try:
        bad = _non_finite(instance)
    except RecursionError:
        return "nested too deeply"
    if bad is not None:
        value = instance
        for key in bad:
            value = value[key]
        if isinstance(value, int):
            return f"{_where(bad)}: {shown(value)} is too large a number"
        return f"{_where(bad)}: {value!r} is not a finite number"
    validator = _validator(schema)
    try:
        if validator.is_valid(instance):
            return None
        error = jsonschema.exceptions.best_match(validator.iter_errors(instance))
    except RecursionError:
        return "nested too deeply"
    if error is None:
        return None
    field = _where(error.absolute_path)
    if error.validator == "required":
        return f"{field}: {error.message.split(' is a required')[0]} is missing"
    if error.validator == "propertyNames" or "propertyNames" in error.schema_path:
        return f"{field}: key {_short(error.instance)} is not allowed here"
    if error.validator in (
        "type",
        "enum",
        "const",
        "pattern",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "minLength",
        "maxLength",
        "minItems",
    ):
        expected = {
            "type": f"of type {error.validator_value}",
            "enum": f"one of {error.validator_value}",
            "const": f"{error.validator_value!r}",
            "pattern": "of the allowed form",
            "minimum": f">= {error.validator_value}",
            "maximum": f"<= {error.validator_value}",
            "exclusiveMinimum": f"> {error.validator_value}",
            "exclusiveMaximum": f"< {error.validator_value}",
            "minLength": f"at least {error.validator_value} character(s)",
            "maxLength": f"at most {error.validator_value} characters",
            "minItems": f"at least {error.validator_value} item(s)",
        }[error.validator]
        return f"{field}: {_short(error.instance)} is not {expected}"
    return f"{field}: {error.message[:200]}".replace("\n", " ")


def check(instance: Any, schema: dict, source: str, error: type[Exception]) -> None:
    """Raise ``error('<source>: <field>: <what is wrong>')`` unless ``instance`` fits ``schema``."""
    found = problem(instance, schema)
    if found:
        raise error(f"{source}: {found}")


def finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
