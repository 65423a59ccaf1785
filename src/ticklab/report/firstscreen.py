"""The report's first screen: a claim × setup-family grid, readable setup names, and the verdict table as a reader
meets it (one sentence per reason with the rest folded, "not testable here" grouped by reason with a count, one p
format, colour-blind-safe badges that carry their word and the forest plots' marker).

Setup families, the grid's columns: a host (a capture on the machine itself), the lab host (a Debian system under
QEMU booted through boot plans) and the lab guests, one column per set of kernels they ran (6.12; 6.12 and 7.2).

The headline rule, the one the report states above the grid: in each family a claim's cell shows its first
comparison, in the order the claim declares them (``claims/<id>.py``, the seed's own headline first), that a setup of
the family tested, role "claim" before "premise"; several setups tested it: the one with the most runs per
condition, then the narrowest CI. Every other row of the family is one click away in the cell.
"""

from __future__ import annotations

import math
import re
from collections import Counter

import pandas as pd

from ..analysis.captured import GUEST_ID as _GUEST
from ..analysis.captured import kernel_versions as _kernel_versions
from ..analysis.captured import setup_family
from ..analysis.forest import VERDICT_COLOURS, VERDICT_MARKERS, is_collapsed, is_level
from ..analysis.pooling import pooled_kind
from ..analysis.verdicts import format_p

HEADLINE_RULE = (
    "Each cell shows the claim's headline comparison for that kind of setup: the first of the claim's "
    "comparisons, in the order the claim declares them (the source's own headline first), that a setup "
    "of this kind tested (a premise only when no claim row was tested); where several setups tested it, "
    "the one with the most runs per condition, then the narrowest CI. Every other comparison is one "
    "click away in the cell."
)

_HOST = re.compile(r"^(?P<cpu>.+?)-(?P<cores>\d+)c-(?P<release>\d+\.\d+\S*?)(?P<vm>-vm)?$")
_ACRONYMS = {"epyc": "EPYC", "amd": "AMD", "arm": "Arm", "ibm": "IBM", "hp": "HP"}
_VENDORS = {"intel", "amd", "arm", "ibm", "apple", "ampere", "qualcomm", "hygon"}
# The forest plots' markers, as characters, so a badge says its word three ways (word, marker, colour).
_GLYPHS = {"o": "●", "h": "⬢", "<": "◀", "v": "▼", ">": "▶", "X": "✖", "D": "◆", "s": "■", ".": "·"}


FAMILY_NOTES = {
    "host": "a capture on the machine itself",
    "lab host": "a Debian system under QEMU, each condition a boot (an analogue: emulated CPU)",
}


def family_note(family: str) -> str:
    return FAMILY_NOTES.get(family, "QEMU guests of ticklab's lab kernels (an analogue: emulated CPU)")


def family_order(families) -> list[str]:
    rank = {"host": 0, "lab host": 1}
    return sorted(set(families), key=lambda f: (rank.get(f, 2), f))


def _host_tag(host: str) -> str:
    """intel-xeon-2c-6.18.44-fc-v657-vm -> "Xeon v657": the CPU without its vendor, and what tells its kernel apart."""
    found = _HOST.match(host)
    if found is None:
        return host[:24]
    words = [w for w in found["cpu"].split("-") if w not in _VENDORS] or found["cpu"].split("-")
    cpu = " ".join(_ACRONYMS.get(w, w.upper() if any(ch.isdigit() for ch in w) else w.capitalize()) for w in words)
    release = found["release"]
    build = release.rsplit("-", 1)[-1] if "-" in release else ""
    tag = build if any(ch.isdigit() for ch in build) and build != release else ".".join(release.split(".")[:2])
    return f"{cpu} {tag}"


def short_setup_name(setup: str) -> str:
    """A name a reader can hold in mind (the full id goes in the tooltip and the legend)."""
    guest = _GUEST.match(setup)
    if guest is None:
        return f"host {_host_tag(setup)}"
    versions = "+".join(_kernel_versions(guest["kernels"])) or guest["kernels"]
    where = _host_tag(guest["host"])
    if guest["labhost"]:
        return f"lab host {versions} ({guest['mode'] or 'boot'}) on {where}"
    vcpus = guest["vcpus"].replace("-", "/")
    return f"{versions} guest, {vcpus} vCPU, on {where}" + (f", {guest['mode']}" if guest["mode"] else "")


def short_setup_names(setups) -> dict[str, str]:
    """Every setup's short name, unique (a repeated one gets #2, #3 …)."""
    names: dict[str, str] = {}
    seen: Counter[str] = Counter()
    for setup in sorted(set(setups)):
        name = short_setup_name(setup)
        seen[name] += 1
        names[setup] = name if seen[name] == 1 else f"{name} #{seen[name]}"
    return names


def badge(verdict: str) -> dict:
    """The word, its forest-plot marker as a character and its colour (Okabe-Ito, as the forest plots)."""
    return {
        "verdict": verdict,
        "glyph": _GLYPHS[VERDICT_MARKERS[verdict]],
        "colour": VERDICT_COLOURS[verdict],
        "cls": "v-" + re.sub(r"[^a-z]+", "-", verdict).strip("-"),
    }


MEANINGS = {
    "reproduced": "the whole CI on the source's side and inside the consistent-size band",
    "consistent, not pinned": "on the source's side, reaching into the band without lying wholly inside it (the reason "
    "says how much of the CI lies inside, where the estimate lies and whether the CI is wider "
    "than the band)",
    "smaller than the target": "the whole CI short of the band, the estimate on the source's side of no change",
    "target excluded": "the whole CI short of the band, the estimate at or past no change: the target's size is "
    "ruled out, no effect in the source's direction shown",
    "larger than the target": "the whole CI beyond the band",
    "opposite effect": "the whole CI on the other side of no change",
    "no effect shown": "the whole CI inside the comparison's declared no-effect margin",
    "inconclusive": "the CI holds no change and the target",
    "not testable here": "with the reason",
}


def legend() -> list[dict]:
    return [{**badge(verdict), "meaning": meaning} for verdict, meaning in MEANINGS.items()]


def first_sentence(reason: str) -> tuple[str, str]:
    """(the reason's first clause, the rest) — the verdict rules join their clauses with "; "."""
    head, _, rest = str(reason).partition("; ")
    return head, rest


def _sig(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return "∞" if math.isinf(value) else f"{value:.3g}"


def effect_text(row) -> str:
    """A ratio as ×r [low, high]; a level (nohz's µs per tick, hrtick's spurious share) as the level itself."""
    prefix = "" if is_level(row) else "×"
    return f"{prefix}{_sig(row['fresh_effect'])} [{_sig(row['ci_low'])}, {_sig(row['ci_high'])}]"


def _setups(row) -> list[str]:
    return [s for s in str(row["setup"]).split(", ") if s and s != "none analysed"]


def reasons_by_setup(row) -> dict[str, str]:
    """A collapsed "not testable here" row's reason, split back into its setups."""
    reasons = {}
    for part in str(row["reason"]).split(" | "):
        setup, _, why = part.partition(": ")
        reasons[setup] = why
    return reasons


def grouped_reasons(setups_reasons: dict[str, str], names: dict[str, str]) -> list[dict]:
    """The reasons of setups that tested nothing, one entry per distinct reason with its count and its setups' short
    names; the most common first."""
    groups: dict[str, list[str]] = {}
    for setup, why in setups_reasons.items():
        groups.setdefault(why, []).append(names.get(setup, setup))
    return [
        {
            "why": why,
            "count": len(who),
            "setups": sorted(who),
            "text": _counted(why, len(who)),
            "brief": short_reason(_counted(why, len(who)))[0],
        }
        for why, who in sorted(groups.items(), key=lambda item: (-len(item[1]), item[0]))
    ]


def _counted(why: str, count: int) -> str:
    if count == 1:
        return why
    if "from this setup" in why:
        return why.replace("from this setup", f"from any of these {count} setups", 1)
    return f"{why} ({count} setups)"


BRIEF_CHARS = 160


def short_reason(reason: str) -> tuple[str, str]:
    """A reason cut for a grid cell: its first clause (after a leading "experiment: "), up to the first colon or
    semicolon and at most BRIEF_CHARS at a word's end; and the rest, for a fold."""
    text = str(reason)
    lead = re.match(r"^[A-Za-z0-9._-]+: ", text)
    start = lead.end() if lead else 0
    cuts = [i for i in (text.find(": ", start), text.find("; ", start)) if i > 0]
    cut = min(cuts) if cuts else len(text)
    if cut > BRIEF_CHARS:
        cut = text.rfind(" ", 0, BRIEF_CHARS) if text.rfind(" ", 0, BRIEF_CHARS) > start else BRIEF_CHARS
        return text[:cut] + " …", text[cut:].lstrip()
    return text[:cut], text[cut + 2 :] if cut < len(text) else ""


def _declared_rank(order: list[str]):
    index = {words: i for i, words in enumerate(order)}
    return lambda row: index.get(row["comparison"], len(index))


def _precision(row) -> float:
    try:
        return math.log(float(row["ci_high"]) / float(row["ci_low"]))
    except (TypeError, ValueError, ZeroDivisionError):
        return math.inf


def _n(row) -> int:
    return (
        sum(int(x) for x in re.findall(r"\d+", str(row["n_per_condition"]))) if pd.notna(row["n_per_condition"]) else 0
    )


def _entry(row, names: dict[str, str]) -> dict:
    tested = pd.notna(row["fresh_effect"])
    setups = _setups(row)
    head, rest = first_sentence(row["reason"])
    brief, detail = short_reason(row["reason"])
    return {
        "brief": brief,
        "detail": detail,
        **badge(row["verdict"]),
        "comparison": row["comparison"],
        "role": row["role"],
        "effect": effect_text(row) if tested else "",
        "n": row["n_per_condition"] if tested else "",
        "setup": ", ".join(names.get(s, s) for s in setups),
        "setup_ids": ", ".join(setups),
        "reason": head,
        "more": rest,
    }


def claim_grid(verdicts: pd.DataFrame, titles: dict[str, str], declared: dict[str, list[str]]) -> dict:
    """The first screen: {"families": [...], "rows": one per claim with a cell per family}. ``titles`` gives each
    claim's title in report order; ``declared`` each claim's comparisons in the order the claim declares them."""
    pools = verdicts[verdicts["role"] == "pooled"]  # analysis/pooling.py: a kind's pool, not a setup
    verdicts = verdicts[verdicts["role"] != "pooled"]
    names = short_setup_names(s for cell in verdicts["setup"] for s in str(cell).split(", ") if s != "none analysed")
    families = family_order(setup_family(s) for s in names)
    rows = []
    for claim, title in titles.items():
        mine = verdicts[verdicts["claim"] == claim]
        if mine.empty:
            continue
        rank = _declared_rank(declared.get(claim, []))
        cells: list[dict] = []
        for family in families:
            in_family = [row for _, row in mine.iterrows() if any(setup_family(s) == family for s in _setups(row))]
            if not in_family:
                cells.append({"family": family, "state": "no data"})
                continue
            listed = [row for row in in_family if not is_collapsed(row)]
            tested = [row for row in listed if pd.notna(row["fresh_effect"])]
            candidates = sorted(tested, key=lambda r: (r["role"] != "claim", rank(r), -_n(r), _precision(r)))
            untestable = {
                s: why
                for row in in_family
                if is_collapsed(row)
                for s, why in reasons_by_setup(row).items()
                if setup_family(s) == family
            }
            groups = grouped_reasons(untestable, names)
            pooled = _pooled_entries(pools[pools["claim"] == claim], family, rank)
            if candidates:
                headline = candidates[0]
                others = sorted(
                    (r for r in listed if r is not headline), key=lambda r: (r["role"] != "claim", rank(r), r["setup"])
                )
                cells.append(
                    {
                        "family": family,
                        "state": "tested",
                        "headline": _entry(headline, names),
                        "others": [_entry(r, names) for r in others],
                        "untestable": groups,
                        "pooled": pooled,
                    }
                )
            elif listed:  # rows of this family that could not be tested (too few runs, a kernel without the series)
                first = sorted(listed, key=lambda r: (r["role"] != "claim", rank(r)))
                cells.append(
                    {
                        "family": family,
                        "state": "untested",
                        "headline": _entry(first[0], names),
                        "others": [_entry(r, names) for r in first[1:]],
                        "untestable": groups,
                        "pooled": pooled,
                    }
                )
            else:
                cells.append(
                    {"family": family, "state": "not testable", **badge("not testable here"), "untestable": groups}
                )
        rows.append(
            {
                "claim": claim,
                "title": title,
                "cells": cells,
                "published_only": not any(c["state"] == "tested" for c in cells),
            }
        )
    return {"families": [{"name": f, "note": family_note(f)} for f in families], "rows": rows, "names": names}


def _pooled_entries(pools: pd.DataFrame, family: str, rank) -> list[dict]:
    """The pooled words of a family's cell (analysis/pooling.py: one per comparison pooled over the family's setups,
    in the claim's order), each with its pooled ratio [CI], k, and whether the machines differ."""
    mine = [row for _, row in pools.iterrows() if pooled_kind(row["setup"]).split(" (")[0] == family]
    return [
        {
            **badge(row["verdict"]),
            "comparison": row["comparison"],
            "effect": effect_text(row) if pd.notna(row["fresh_effect"]) else "",
            "k": row["n_per_condition"],
            "differ": str(row["reason"]).startswith("machines differ"),
            "brief": short_reason(row["reason"])[0],
        }
        for row in sorted(mine, key=rank)
    ]


def verdict_table(verdicts: pd.DataFrame, names: dict[str, str]) -> list[dict]:
    """The full verdict table as the report shows it: short setup names (full ids in the title and the legend),
    three significant figures, p in one format, the reason's first clause with the rest folded, and a "not testable
    here" row's setups grouped by reason with a count."""
    shown = []
    for _, row in verdicts.iterrows():
        tested = pd.notna(row["fresh_effect"])
        provenance = row["target_provenance"] if isinstance(row["target_provenance"], str) else ""
        target = (
            "direction"
            if pd.isna(row["target_ratio"])
            else f"{'' if is_level(row) else '×'}{_sig(row['target_ratio'])}"
        )
        source, _, how = provenance.partition(": ")
        entry = {
            **_entry(row, names),
            "claim": row["claim"],
            "target": f"{target} — {source}" if provenance else "",
            "target_how": how,
            "p": format_p(row["p_holm"]) if tested and pd.notna(row["p_holm"]) else "—",
            "n": row["n_per_condition"] if tested else "—",
            "power": f"{row['power_at_target']:.0%}" if tested and pd.notna(row["power_at_target"]) else "—",
            "effect": effect_text(row) if tested else "—",
            "groups": [],
        }
        if is_collapsed(row):
            entry["groups"] = grouped_reasons(reasons_by_setup(row), names)
            entry["setup"] = f"{len(_setups(row))} setups"
            entry["reason"], entry["more"] = "", ""
        shown.append(entry)
    return shown
