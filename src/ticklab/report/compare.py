"""`ticklab compare A [B]`: the mmtests-format compare table for bundles, in the terminal.

With one bundle, its conditions are the columns (the first, or --baseline, is the baseline). With two,
each condition they share is compared across the bundles (A is the baseline): the same experiment on
two hosts, two kernels, two days; ``--map A=B`` pairs conditions named differently (a host's tick-on
with a lab guest's hz1000). One table per metric and condition pair; ``--metric`` chooses.

Two bundles from different machines differ by more than their conditions: where the CPU model, the kernel
release the compared runs booted or the kind of setup (a host, a lab guest, the lab host) differ, the comparison
carries one warning each, so a significance star is not read as the condition's alone. The warnings go to stderr and
into the output itself, in every format: lines above the tables in text ("warning: ...") and md (a quote block), the
``warnings`` list in json, and a ``setup_warning`` column on every csv row (empty when the setups match), so a table
redirected to a file still says it.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from .. import registry
from ..analysis.stats import compare_table, format_compare_table
from ..bundle import Bundle, Manifest, load_bundle

ALL_METRICS = "all"
CSV_COLUMNS = [
    "metric",
    "statistic",
    "a_bundle",
    "a_condition",
    "b_bundle",
    "b_condition",
    "unit",
    "a",
    "b",
    "difference",
    "relative_change_pct",
    "p_holm",
    "significant",
    "setup_warning",
]
# a lab host's bundles carry the id `ticklab lab host-plan` gives them (lab/labhost.py: labhost_id)
_LABHOST_ID = re.compile(r"-labhost(?:-|$)")
_PHYSICAL_HOST_ID = re.compile(r"-on-(?P<host>.+?)(?:-labhost)?(?:-(?:kexec|grub))?$")
_HOST_ID_CPU = re.compile(r"^(?P<cpu>.+?)-\d+c-")  # host/facts.py: host_id, <cpu model>-<n>c-<release>-<virt>


class CompareError(ValueError):
    """The bundles cannot be compared as asked; the message says why."""


@dataclass(frozen=True)
class Side:
    """What one column of a compare table holds: a bundle (its label) and one of its conditions."""

    bundle: str
    condition: str


@dataclass
class CompareTable:
    title: str
    metric: str
    unit: str
    columns: dict[str, Side]  # the long table's "condition" values, each the bundle and condition it holds
    baseline: str  # the column the others are compared with
    frame: pd.DataFrame  # stats.compare_table's long table


@dataclass
class Comparison:
    labels: list[str]
    tables: list[CompareTable]
    metrics: list[str]
    warnings: list[str]  # how the two bundles' setups differ, one line each
    note: str | None = None  # which metrics the default left out


def _label(path: Path) -> str:
    return f"{path.parent.parent.name}/{path.name}"


def by_magnitude(value: float) -> str:
    """Three significant digits, all of an integer part, scientific below 0.001 and from a million: 0.0042 is
    "0.00420", never 0.00, and 12655.85 is "12656"."""
    if value == 0 or not math.isfinite(value):
        return "0" if value == 0 else str(value)
    if not 1e-3 <= abs(value) < 1e6:
        return f"{value:.2e}"
    return f"{value:.{max(0, 2 - math.floor(math.log10(abs(value))))}f}"


def _field(mapping, key: str):
    """mapping[key] where mapping is a dict (the manifest's schema leaves host facts and lab free-form), else None."""
    return mapping.get(key) if isinstance(mapping, dict) else None


def setup_kind(manifest: Manifest) -> str:
    """ "lab host" (a Debian system under QEMU booted through boot plans), "lab guest" (``ticklab lab run``) or
    "host"."""
    host_id = str(manifest.host_id or "")
    if _LABHOST_ID.search(host_id):
        return "lab host"
    return "lab guest" if manifest.lab or host_id.startswith("guest-") else "host"


def cpu_identity(manifest: Manifest) -> tuple[tuple[str, str], str]:
    """(what decides that two setups' CPUs are the same, the words for it): a host's CPU model; a lab setup's
    emulated CPU and the CPU of the machine it ran on, known by model where the lab recorded it and always by the
    CPU part of that machine's host id (a lab host's bundles carry only that)."""
    cpu = str(manifest.host_fact("cpu_model") or "unknown CPU")
    if setup_kind(manifest) == "host":
        return (cpu, ""), cpu
    lab = manifest.lab
    found = _PHYSICAL_HOST_ID.search(str(manifest.host_id or ""))
    physical_id = str(_field(lab, "physical_host_id") or (found["host"] if found else ""))
    physical_cpu = _HOST_ID_CPU.match(physical_id)
    slug = physical_cpu["cpu"] if physical_cpu else physical_id
    under = str(_field(_field(lab, "physical_host"), "cpu_model") or slug)
    return (cpu, slug), f"{cpu} on {under}" if under else cpu


def condition_kernels(bundle: Bundle, condition: str) -> str:
    """The kernel release(s) the condition's measured runs booted (a lab run records its boot), else the host's."""
    booted = {
        str(run.boot.get("kernel_release"))
        for run in bundle.manifest.measured_runs()
        if run.condition == condition and run.boot.get("kernel_release")
    }
    return ", ".join(sorted(booted)) or str(bundle.manifest.host_fact("kernel_release") or "unknown kernel")


def setup_differences(bundles: list[Bundle], pairs: list[tuple[str, str]]) -> list[str]:
    """One line per way the two bundles' setups differ: CPU model, kernel release of the compared runs, kind."""
    first, second = (b.manifest for b in bundles)
    warnings = []
    (first_cpu, first_words), (second_cpu, second_words) = cpu_identity(first), cpu_identity(second)
    if first_cpu != second_cpu:
        warnings.append(
            f"the CPUs differ (A: {first_words}; B: {second_words}): a difference may be the machines', "
            "not the conditions'"
        )
    kernels = list(
        dict.fromkeys((condition_kernels(bundles[0], a), condition_kernels(bundles[1], b)) for a, b in pairs)
    )
    differing = [f"A: {a}; B: {b}" for a, b in kernels if a != b]
    if differing:
        warnings.append(
            f"the kernels differ ({' | '.join(differing)}): a difference may be the kernels', not the conditions'"
        )
    kinds = setup_kind(first), setup_kind(second)
    if kinds[0] != kinds[1]:
        warnings.append(
            f"the setups differ (A: {kinds[0]}; B: {kinds[1]}): a difference may be the setups', not the conditions'"
        )
    return warnings


def claim_metrics(claim: str | None, available: list[str]) -> list[str]:
    """The metrics the claim's verdicts compare, where the bundle has them (else none: then every metric)."""
    from ..claimids import claim_ids
    from ..claims import get_claim
    from ..paths import published_dir

    if claim not in claim_ids():
        return []
    definition = get_claim(claim)
    used = [c.metric for c in definition.comparisons(definition.published(published_dir()))]
    return [m for m in dict.fromkeys(used) if m in available]


def _conditions(bundle: Bundle) -> list[str]:
    """The conditions with results, in the order the experiment defines them."""
    measured = set(bundle.results["condition"])
    defined = list(bundle.manifest.conditions_by_name)
    return [c for c in dict.fromkeys([*defined, *bundle.results["condition"]]) if c in measured]


def pair_conditions(maps: list[str], paths: list[Path], conditions: list[list[str]]) -> list[tuple[str, str]]:
    """(condition of A, condition of B) to compare: each ``--map A=B``, then each condition both have that no map
    names. A condition's name may hold '=' itself (``clocksource=tsc threads=1``): the split that names a condition
    on both sides is the one meant."""
    first, second = (set(c) for c in conditions)
    mapped = []
    for text in maps:
        splits = [(text[:i], text[i + 1 :]) for i, ch in enumerate(text) if ch == "="]
        found = [(a, b) for a, b in splits if a in first and b in second]
        if len(found) > 1:
            raise CompareError(
                f"--map {text}: pairs conditions more than one way ({'; '.join(f'{a} = {b}' for a, b in found)})"
            )
        if found:
            mapped.append(found[0])
            continue
        if not splits:
            raise CompareError(f"--map {text}: write A=B, a condition of {paths[0]} = one of {paths[1]}")
        on_first = [(a, b) for a, b in splits if a in first]
        if on_first:
            missing, path, have = on_first[0][1], paths[1], conditions[1]
        else:
            missing, path, have = splits[-1][0], paths[0], conditions[0]
        raise CompareError(f"--map {text}: {missing!r} is not a condition of {path} (has: {', '.join(have) or 'none'})")
    mapped = list(dict.fromkeys(mapped))
    named = {a for a, _ in mapped} | {b for _, b in mapped}
    pairs = mapped + [(c, c) for c in conditions[0] if c in second and c not in named]
    if not pairs:
        raise CompareError(
            f"the bundles share no condition ({paths[0]} has: {', '.join(conditions[0]) or 'none'}; "
            f"{paths[1]} has: {', '.join(conditions[1]) or 'none'}); pair them with --map A=B"
        )
    return pairs


def _choose_metrics(
    requested: list[str] | None, claim: str | None, available: list[str], where: str
) -> tuple[list[str], str | None]:
    """The metrics to compare and, when the default left some out, a line saying so."""
    if requested and ALL_METRICS in requested:
        return available, None
    if requested:
        unknown = [m for m in requested if m not in available]
        if unknown:
            raise CompareError(
                f"metric(s) {', '.join(unknown)} not in {where} (have: {', '.join(available) or 'none'})"
            )
        return list(dict.fromkeys(requested)), None
    chosen = claim_metrics(claim, available) or available
    if len(chosen) == len(available):
        return chosen, None
    return chosen, (
        f"showing the {claim} claim's compared metrics ({', '.join(chosen)}): {len(chosen)} of the "
        f"{len(available)} metrics {where} {'have' if where == 'both bundles' else 'has'}; "
        f"--metric all shows every one"
    )


def _unit(frame: pd.DataFrame, metric: str) -> str:
    units = frame.loc[frame["metric"] == metric, "unit"].dropna()
    return str(units.iloc[0]) if len(units) else ""


def compare_bundles(
    paths: list[Path], metrics: list[str] | None = None, baseline: str | None = None, pairs: list[str] | None = None
) -> Comparison:
    """The compare tables of one bundle's conditions or of two bundles (A the baseline), and what differs between
    the two bundles' setups."""
    paths = [Path(p) for p in paths]
    if len(paths) not in (1, 2):
        raise CompareError(f"give one bundle (to compare its conditions) or two (A is the baseline), not {len(paths)}")
    if len(paths) == 2 and paths[0].resolve() == paths[1].resolve():
        raise CompareError(f"{paths[0]}: the same bundle twice; give two bundles, or one to compare its conditions")
    if pairs and len(paths) == 1:
        raise CompareError("--map pairs the conditions of two bundles; with one bundle, --baseline picks the baseline")
    if baseline is not None and len(paths) == 2:
        raise CompareError(
            "--baseline picks one bundle's baseline condition; with two bundles A is the baseline "
            "(--map A=B pairs conditions)"
        )
    bundles = [load_bundle(p) for p in paths]
    for path, bundle in zip(paths, bundles, strict=True):
        if bundle.manifest.not_testable:
            raise CompareError(
                f"{path}: nothing to compare, the experiment was not testable there ({bundle.manifest.not_testable})"
            )
    results = [b.results for b in bundles]
    conditions = [_conditions(b) for b in bundles]
    if len(bundles) == 2:
        paired = pair_conditions(pairs or [], paths, conditions)
    available = sorted(set.intersection(*(set(r["metric"]) for r in results)))
    chosen, note = _choose_metrics(
        metrics, bundles[0].manifest.claim, available, "both bundles" if len(paths) == 2 else "the bundle"
    )
    labels = [_label(p) for p in paths]
    if len(labels) == 2 and labels[0] == labels[1]:  # two copies of one bundle: a column each
        labels = [str(p) for p in paths]
    if len(bundles) == 1:
        tables = _condition_tables(paths[0], labels[0], results[0], conditions[0], chosen, baseline)
        warnings = []
    else:
        tables = _bundle_tables(labels, results, paired, chosen)
        warnings = setup_differences(bundles, paired)
        for metric in chosen:
            units = [_unit(frame, metric) for frame in results]
            if units[0] != units[1]:
                warnings.append(f"{metric} is in {units[0]!r} in A and {units[1]!r} in B: the numbers do not compare")
    if not tables:
        raise CompareError("nothing to compare: no metric has runs on both sides")
    return Comparison(labels, tables, chosen, warnings, note)


def compare_tables(
    paths: list[Path], metrics: list[str] | None = None, baseline: str | None = None, pairs: list[str] | None = None
) -> list[CompareTable]:
    return compare_bundles(paths, metrics, baseline, pairs).tables


def _condition_tables(
    path: Path, label: str, frame: pd.DataFrame, conditions: list[str], metrics: list[str], baseline: str | None
) -> list[CompareTable]:
    base = baseline or (conditions[0] if conditions else None)
    if len(conditions) < 2:
        raise CompareError(f"{path}: needs two conditions to compare (has: {', '.join(conditions) or 'none'})")
    if base not in conditions:
        raise CompareError(f"--baseline {base!r} is not a condition of {path} (has: {', '.join(conditions)})")
    tables = []
    for metric in metrics:
        rows = frame[frame["metric"] == metric]
        samples = {c: rows.loc[rows["condition"] == c, "value"].tolist() for c in conditions}
        samples = {c: v for c, v in samples.items() if v}
        if base in samples and len(samples) > 1:
            tables.append(
                CompareTable(
                    f"{metric} — {label}, baseline {base}",
                    metric,
                    _unit(frame, metric),
                    {c: Side(label, c) for c in samples},
                    base,
                    compare_table(samples, base),
                )
            )
    return tables


def _bundle_tables(
    labels: list[str], results: list[pd.DataFrame], pairs: list[tuple[str, str]], metrics: list[str]
) -> list[CompareTable]:
    tables = []
    for metric in metrics:
        for pair in pairs:
            samples = {
                label: frame.loc[(frame["metric"] == metric) & (frame["condition"] == condition), "value"].tolist()
                for label, frame, condition in zip(labels, results, pair, strict=True)
            }
            if all(samples.values()):
                named = pair[0] if pair[0] == pair[1] else f"{pair[0]} vs {pair[1]}"
                tables.append(
                    CompareTable(
                        f"{metric}, condition {named} — baseline {labels[0]}",
                        metric,
                        _unit(results[0], metric),
                        {label: Side(label, c) for label, c in zip(labels, pair, strict=True)},
                        labels[0],
                        compare_table(samples, labels[0]),
                    )
                )
    return tables


def csv_rows(comparison: Comparison) -> pd.DataFrame:
    """One row per statistic and compared column: a the baseline's value, b the other's, each number its own column."""
    rows = []
    for table in comparison.tables:
        frame = table.frame.set_index(["statistic", "condition"])
        base = table.columns[table.baseline]
        for statistic in dict.fromkeys(table.frame["statistic"]):
            a = frame.loc[(statistic, table.baseline), "value"]
            for column, side in table.columns.items():
                if column == table.baseline:
                    continue
                row = frame.loc[(statistic, column)]
                rows.append(
                    {
                        "metric": table.metric,
                        "statistic": statistic,
                        "a_bundle": base.bundle,
                        "a_condition": base.condition,
                        "b_bundle": side.bundle,
                        "b_condition": side.condition,
                        "unit": "%" if statistic == "CoefVar" else table.unit,
                        "a": a,
                        "b": row["value"],
                        "difference": row["value"] - a,
                        "relative_change_pct": row["pct_diff"],
                        "p_holm": row["p_holm"],
                        "significant": "*" if pd.notna(row["significant"]) and row["significant"] else "",
                        "setup_warning": "; ".join(comparison.warnings),
                    }
                )
    return pd.DataFrame(rows, columns=CSV_COLUMNS).astype(
        {c: float for c in ("a", "b", "difference", "relative_change_pct", "p_holm")}
    )


def render(comparison: Comparison, fmt: str) -> str:
    if fmt not in registry.COMPARE_FORMATS:
        raise CompareError(f"--format {fmt!r}: choose one of {', '.join(registry.COMPARE_FORMATS)}")
    if fmt == "json":
        return json.dumps(
            {
                "bundles": comparison.labels,
                "warnings": comparison.warnings,
                "metrics": comparison.metrics,
                "metrics_note": comparison.note,
                "tables": [
                    {
                        "title": t.title,
                        "metric": t.metric,
                        "unit": t.unit,
                        "baseline": t.baseline,
                        "columns": {c: {"bundle": s.bundle, "condition": s.condition} for c, s in t.columns.items()},
                        "test": t.frame.attrs.get("test"),
                        "n": t.frame.attrs.get("n"),
                        "rows": json.loads(t.frame.to_json(orient="records")),
                    }
                    for t in comparison.tables
                ],
            },
            indent=2,
        )
    if fmt == "csv":
        return csv_rows(comparison).to_csv(index=False).rstrip("\n")
    # the setups' differences head the table itself, so a redirected table carries them (issue 56 item 3)
    if fmt == "md":
        parts = [f"> **warning:** {warning}" for warning in comparison.warnings]
        parts = ["\n>\n".join(parts)] if parts else []
    else:
        parts = ["\n".join(f"warning: {warning}" for warning in comparison.warnings)] if comparison.warnings else []
    for table in comparison.tables:
        shown = format_compare_table(table.frame, number=by_magnitude)
        if fmt == "md":
            parts.append(f"**{table.title}**\n\n{shown.to_markdown()}\n\n{shown.attrs['legend']}")
        else:
            parts.append(f"{table.title}\n{shown.to_string()}\n{shown.attrs['legend']}")
    return "\n\n".join(parts)
