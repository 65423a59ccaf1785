"""`ticklab compare A [B]`: the mmtests-format compare table for bundles, in the terminal.

With one bundle, its conditions are the columns (the first, or --baseline, is the baseline). With two,
each condition they share is compared across the bundles (A is the baseline): the same experiment on
two hosts, two kernels, two days. One table per metric and condition group; ``--metric`` chooses.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from ..analysis.stats import compare_table, format_compare_table
from ..bundle import load_bundle

FORMATS = ("text", "csv", "md", "json")


class CompareError(ValueError):
    """The bundles cannot be compared as asked; the message says why."""


def _label(path: Path) -> str:
    return f"{path.parent.parent.name}/{path.name}"


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


def compare_tables(paths: list[Path], metrics: list[str] | None = None, baseline: str | None = None) -> list[tuple[str, pd.DataFrame]]:
    """(title, long compare table) for each metric (and, with two bundles, each shared condition)."""
    if len(paths) not in (1, 2):
        raise CompareError(f"give one bundle (to compare its conditions) or two (A is the baseline), not {len(paths)}")
    if len(paths) == 2 and paths[0].resolve() == paths[1].resolve():
        raise CompareError(f"{paths[0]}: the same bundle twice; give two bundles, or one to compare its conditions")
    bundles = [load_bundle(p) for p in paths]
    for path, bundle in zip(paths, bundles):
        if bundle.manifest.get("not_testable"):
            raise CompareError(f"{path}: nothing to compare, the experiment was not testable there "
                               f"({bundle.manifest['not_testable']})")
    results = [b.results for b in bundles]
    available = sorted(set.intersection(*(set(r["metric"]) for r in results)))
    chosen = metrics or claim_metrics(bundles[0].manifest.get("claim"), available) or available
    unknown = [m for m in chosen if m not in available]
    if unknown:
        raise CompareError(f"metric(s) {', '.join(unknown)} not in {'both bundles' if len(paths) == 2 else 'the bundle'} "
                           f"(have: {', '.join(available) or 'none'})")
    tables = []
    if len(bundles) == 1:
        frame = results[0]
        defined = [c["name"] for c in bundles[0].manifest.get("conditions", [])]
        conditions = [c for c in dict.fromkeys([*defined, *frame["condition"]]) if c in set(frame["condition"])]
        base = baseline or (conditions[0] if conditions else None)
        if len(conditions) < 2 or base not in conditions:
            raise CompareError(f"{paths[0]}: needs two conditions to compare (has: {', '.join(conditions) or 'none'})"
                               if len(conditions) < 2 else f"--baseline {base!r} is not a condition of {paths[0]}")
        for metric in chosen:
            rows = frame[frame["metric"] == metric]
            samples = {c: rows.loc[rows["condition"] == c, "value"].tolist() for c in conditions}
            samples = {c: v for c, v in samples.items() if v}
            if base in samples and len(samples) > 1:
                tables.append((f"{metric} — {_label(paths[0])}, baseline {base}", compare_table(samples, base)))
        return tables
    labels = [_label(p) for p in paths]
    shared = [c for c in dict.fromkeys(results[0]["condition"]) if c in set(results[1]["condition"])]
    if not shared:
        raise CompareError(f"the bundles share no condition ({paths[0]} vs {paths[1]})")
    for metric in chosen:
        for condition in shared:
            samples = {label: frame.loc[(frame["metric"] == metric) & (frame["condition"] == condition), "value"].tolist()
                       for label, frame in zip(labels, results)}
            if all(samples.values()):
                tables.append((f"{metric}, condition {condition} — baseline {labels[0]}", compare_table(samples, labels[0])))
    return tables


def render(tables: list[tuple[str, pd.DataFrame]], fmt: str) -> str:
    if fmt not in FORMATS:
        raise CompareError(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")
    if fmt == "json":
        return json.dumps([{"title": title, "test": table.attrs.get("test"), "n": table.attrs.get("n"),
                            "rows": json.loads(table.to_json(orient="records"))} for title, table in tables], indent=2)
    parts = []
    for title, table in tables:
        shown = format_compare_table(table)
        if fmt == "csv":
            parts.append(f"# {title}\n" + shown.to_csv())
        elif fmt == "md":
            parts.append(f"**{title}**\n\n{shown.to_markdown()}\n\n{shown.attrs['legend']}")
        else:
            parts.append(f"{title}\n{shown.to_string()}\n{shown.attrs['legend']}")
    return "\n\n".join(parts)
