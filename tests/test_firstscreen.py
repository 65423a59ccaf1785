"""The report's first screen (issue 41 item 1): the claim × setup-family grid and its headline rule, readable setup
names, the verdict table's grouped "not testable here" rows, one p format, badges that do not rest on colour."""

import math

import pandas as pd
import pytest

from ticklab.analysis.forest import VERDICT_COLOURS
from ticklab.analysis.palette import confusable_for_deuteranopes
from ticklab.analysis.verdicts import VERDICTS, format_p
from ticklab.report.firstscreen import (
    badge,
    claim_grid,
    setup_family,
    short_reason,
    short_setup_name,
    short_setup_names,
    verdict_table,
)

HOST_A = "intel-xeon-2c-6.18.44-fc-v657-vm"
HOST_B = "amd-epyc-2c-6.18.44-fc-v595-vm"
GUEST_612 = "guest-tcg-2vcpu-6.12.117-ticklab-on-intel-xeon-2c-6.18.44-fc-v669-vm"
GUEST_612_KEXEC = GUEST_612 + "-kexec"
GUEST_BOTH = "guest-tcg-2vcpu-6.12.117-ticklab-7.2.13-ticklab-on-amd-epyc-2c-6.18.44-fc-v657-vm"
GUEST_MANY = "guest-tcg-1-2-4vcpu-6.12.117-ticklab-on-intel-xeon-2c-6.18.44-fc-v657-vm"
LABHOST = "guest-tcg-2vcpu-6.1.0-50-amd64-on-amd-epyc-2c-6.18.44-fc-v595-vm-labhost-grub"


@pytest.mark.parametrize(
    "setup, family, name",
    [
        (HOST_A, "host", "host Xeon v657"),
        (HOST_B, "host", "host EPYC v595"),
        (GUEST_612, "lab guest 6.12", "6.12 guest, 2 vCPU, on Xeon v669"),
        (GUEST_612_KEXEC, "lab guest 6.12", "6.12 guest, 2 vCPU, on Xeon v669, kexec"),
        (GUEST_BOTH, "lab guest 6.12 and 7.2", "6.12+7.2 guest, 2 vCPU, on EPYC v657"),
        (GUEST_MANY, "lab guest 6.12", "6.12 guest, 1/2/4 vCPU, on Xeon v657"),
        (LABHOST, "lab host", "lab host 6.1 (grub) on EPYC v595"),
        ("amd-ryzen-9-7950x-16c-6.8.0-45-generic", "host", "host Ryzen 9 7950X 6.8"),
    ],
)
def test_a_setup_has_a_family_and_a_short_readable_name(setup, family, name):
    assert (setup_family(setup), short_setup_name(setup)) == (family, name)


def test_short_names_are_unique():
    twins = ["intel-xeon-2c-6.18.44-fc-v657-vm", "intel-xeon-4c-6.18.44-fc-v657-vm"]
    assert sorted(short_setup_names(twins).values()) == ["host Xeon v657", "host Xeon v657 #2"]


@pytest.mark.parametrize(
    "p, shown",
    [
        (0.0089720248, "0.00897"),
        (6.783642781650189e-06, "6.78e-06"),
        (0.000183, "1.83e-04"),
        (1.703005e-05, "1.70e-05"),
        (0.86, "0.86"),
        (1.0, "1"),
        (0.001, "0.001"),
        (math.nan, "—"),
    ],
)
def test_p_has_one_format_three_significant_digits_scientific_below_a_thousandth(p, shown):
    assert format_p(p) == shown


def test_every_verdict_badge_says_it_with_its_word_a_marker_and_an_okabe_ito_colour():
    badges = [badge(v) for v in VERDICTS]
    assert len({b["glyph"] for b in badges}) == len(VERDICTS)
    assert len({b["cls"] for b in badges}) == len(VERDICTS)
    assert [b["colour"] for b in badges] == [VERDICT_COLOURS[v] for v in VERDICTS]


def test_no_two_verdict_colours_are_confusable_for_a_deuteranope():
    """The badges' and forest plots' colours, by the figures' check (analysis.palette: Machado 2009 at severity 1.0,
    CIE76 ΔE >= 15); the light grey "not testable here" had was 7.1 from "larger than the target"."""
    assert confusable_for_deuteranopes(list(VERDICT_COLOURS.values())) == []
    assert confusable_for_deuteranopes(["#999999", VERDICT_COLOURS["larger than the target"]]) != []


def row(
    claim,
    setup,
    comparison,
    verdict="inconclusive",
    effect=1.1,
    low=0.9,
    high=1.3,
    n="10 vs 10",
    role="claim",
    reason="the CI holds no change and the target: ratio 1.1 [0.9, 1.3], p = 0.4; more words",
):
    tested = verdict != "not testable here" and effect is not None
    return {
        "claim": claim,
        "setup": setup,
        "role": role,
        "comparison": comparison,
        "target_ratio": 1.5,
        "target_provenance": "derived: a ratio of two printed values",
        "fresh_effect": effect if tested else math.nan,
        "ci_low": low if tested else math.nan,
        "ci_high": high if tested else math.nan,
        "p_holm": 0.4 if tested else math.nan,
        "n_per_condition": n if tested else math.nan,
        "power_at_target": math.nan,
        "verdict": verdict,
        "reason": reason,
    }


def frame(*rows):
    return pd.DataFrame(list(rows))


def test_the_headline_is_the_first_declared_comparison_a_family_tested_then_most_runs():
    verdicts = frame(
        row("c", GUEST_612, "second", verdict="reproduced", n="30 vs 30"),
        row("c", GUEST_612, "first", verdict="inconclusive", n="5 vs 5"),
        row("c", GUEST_612_KEXEC, "first", verdict="opposite effect", effect=0.8, low=0.7, high=0.9, n="8 vs 8"),
        row("c", GUEST_612, "premise", verdict="reproduced", role="premise"),
        row(
            "c",
            f"{HOST_A}, {LABHOST}",
            "summary",
            verdict="not testable here",
            reason=f"{HOST_A}: no c bundle from this setup | {LABHOST}: no c bundle from this setup",
        ),
    )
    grid = claim_grid(verdicts, {"c": "C9 a claim"}, {"c": ["premise", "first", "second"]})
    assert [f["name"] for f in grid["families"]] == ["host", "lab host", "lab guest 6.12"]
    [line] = grid["rows"]
    host, labhost, guests = line["cells"]
    assert guests["state"] == "tested"
    # "first" is declared before "second" and is a claim row (the premise is declared first but is a premise);
    # of the two setups that tested it, the one with more runs per condition
    assert (guests["headline"]["comparison"], guests["headline"]["verdict"]) == ("first", "opposite effect")
    assert guests["headline"]["setup"] == "6.12 guest, 2 vCPU, on Xeon v669, kexec"
    assert guests["headline"]["effect"] == "×0.8 [0.7, 0.9]"
    assert [o["comparison"] for o in guests["others"]] == ["first", "second", "premise"]
    assert host["state"] == labhost["state"] == "not testable"
    assert host["untestable"] == [
        {
            "why": "no c bundle from this setup",
            "count": 1,
            "setups": ["host Xeon v657"],
            "text": "no c bundle from this setup",
            "brief": "no c bundle from this setup",
        }
    ]
    assert not line["published_only"]


def test_a_premise_heads_a_cell_only_when_no_claim_row_was_tested_and_a_family_without_setups_says_so():
    verdicts = frame(
        row(
            "c",
            GUEST_612,
            "claim row",
            verdict="not testable here",
            effect=None,
            reason="too few runs: 2 of the 5 it needs",
        ),
        row("c", GUEST_612, "premise", role="premise"),
        row("d", HOST_A, "d's row"),
    )
    grid = claim_grid(verdicts, {"c": "C", "d": "D"}, {"c": ["claim row", "premise"]})
    c_host, c_guest = grid["rows"][0]["cells"]
    assert c_host == {"family": "host", "state": "no data"}
    assert c_guest["headline"]["comparison"] == "premise"
    assert [o["comparison"] for o in c_guest["others"]] == ["claim row"]
    assert c_guest["others"][0]["brief"] == "too few runs"


def test_not_testable_setups_are_grouped_by_reason_with_a_count_not_listed():
    setups = [HOST_A, HOST_B, GUEST_612, GUEST_BOTH, LABHOST]
    reason = " | ".join(f"{s}: no c bundle from this setup" for s in setups[:4]) + f" | {LABHOST}: its check failed"
    verdicts = frame(row("c", ", ".join(setups), "summary", verdict="not testable here", reason=reason))
    names = short_setup_names(setups)
    [shown] = verdict_table(verdicts, names)
    assert shown["setup"] == "5 setups" and shown["p"] == "—" and shown["effect"] == "—"
    assert [(g["why"], g["count"]) for g in shown["groups"]] == [
        ("no c bundle from this setup", 4),
        ("its check failed", 1),
    ]
    assert shown["groups"][0]["text"] == "no c bundle from any of these 4 setups"
    assert HOST_A not in str(shown["groups"])  # short names, the full ids live in the legend


def test_a_tested_rows_reason_shows_its_first_clause_and_folds_the_rest():
    [shown] = verdict_table(frame(row("c", HOST_A, "x")), {HOST_A: "host Xeon v657"})
    assert shown["reason"] == "the CI holds no change and the target: ratio 1.1 [0.9, 1.3], p = 0.4"
    assert shown["more"] == "more words"
    assert (shown["p"], shown["target"], shown["target_how"]) == (
        "0.4",
        "×1.5 — derived",
        "a ratio of two printed values",
    )


@pytest.mark.parametrize(
    "reason, brief",
    [
        (
            "host-boot-ftq: its condition did not take effect: all 6 runs left out",
            "host-boot-ftq: its condition did not take effect",
        ),
        ("ftq measured tick-on; a comparison with it needs nohz-full too", "ftq measured tick-on"),
        ("no c bundle from this setup", "no c bundle from this setup"),
    ],
)
def test_a_grid_cell_shows_a_reasons_first_clause(reason, brief):
    assert short_reason(reason)[0] == brief
