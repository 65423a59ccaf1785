"""Operating characteristics of the pooled word (issue 57 item 4): P(word | truth) on synthetic fleets of known truth.

A fleet is k machines (3, 6, 12), each a setup of one kind with its own true effect: the treatment's median is the
baseline's times exp(theta_i), theta_i = mu + tau z_i, z_i standard normal, where mu is the truth (a multiple of the
target's log-effect, as in benchmarks/verdict_characteristics.py: equal, half, 0.4x, double, none, opposite) and tau
the between-machine spread: none (0), small (0.1 x the target's log-effect) or large (0.5 x). Each machine's runs are
drawn as verdict_characteristics draws one setup's (its ``synthetic_runs``, no drift), 5, 10 or 20 runs per
condition, and given the row the verdict gives a one-comparison family (``machine_row``: the exact CI of
``stats.ratio_interval`` at 95% and ``decide``'s word); the fleet's rows then go through
``ticklab.analysis.pooling.pooled_verdicts``, the report's own pooling, and the pooled row's word is read back with
verdict_characteristics' ``word_of``. The acceptance checks are that benchmark's
``CHECKS`` on the pooled word against mu (its ``acceptance``): at most 5% in every cell.

    .venv/bin/python benchmarks/pooled_characteristics.py [--replicates 200 | --quick] [--out DIR]

Writes <out>/characteristics.csv, <out>/acceptance.csv and <out>/characteristics.md (default
bench-out/pooled-characteristics); prints the checks and the table REPRODUCING.md shows. Seeded per cell.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))

import verdict_characteristics as single  # the per-setup benchmark beside this file
from ticklab.analysis.pooling import pooled_verdicts
from ticklab.analysis.stats import ratio_interval
from ticklab.analysis.verdicts import Verdict, decide

# comparison key (verdict_characteristics.COMPARISONS) -> the run-to-run CV it is tested at
COMPARISONS = {"nohz-full-ftq": 0.02, "hz250-timer-share": 0.10, "hrtick-series": 0.10}
MACHINES = (3, 6, 12)
SPREADS = {"none": 0.0, "small": 0.1, "large": 0.5}  # tau as a multiple of the target's |log-effect|
RUNS = (5, 10, 20)


def fleet_word(claim, comparison, rng, machines: int, n: int, cv: float, mu: float, tau: float):
    """The pooled row of one synthetic fleet. Each machine's row is what ``comparisons.verdicts`` gives a one-comparison
    family without blocks — the Hodges-Lehmann ratio with the exact Mann-Whitney inversion CI at 95%
    (``stats.ratio_interval``) and ``verdicts.decide``'s word — made here without the power and p-value the pool
    never reads (they take 99% of the verdict path's time); ``test_pooling`` checks the two give the same rows."""
    rows = []
    for machine in range(machines):
        theta = mu + tau * rng.standard_normal()
        samples = single.synthetic_runs(rng, n, cv, math.exp(theta))
        rows.append(machine_row(claim, comparison, f"host-{machine:02d}", samples))
    (pooled,) = pooled_verdicts(claim, rows, [comparison], alpha=single.ALPHA)
    return pooled


def machine_row(claim, comparison, setup: str, samples) -> Verdict:
    """One machine's verdict row as the pool reads it: estimate, 95% CI, its level and word."""
    interval = ratio_interval(
        samples.treatment, samples.baseline, statistic=comparison.statistic, confidence=1 - single.ALPHA
    )
    word, reason = decide(comparison.target, interval, math.nan, comparison.margins)
    return Verdict(
        claim,
        setup,
        comparison.comparison,
        word,
        reason,
        fresh_effect=interval.estimate,
        ci_low=interval.low,
        ci_high=interval.high,
        ci_level=f"{1 - single.ALPHA:.0%}",
    )


def characteristics(comparisons, machines, spreads, runs, truths, replicates, *, seed=0, progress=False):
    cells = [(key, k, spread, n, truth) for key in comparisons for k in machines for spread in spreads for n in runs
             for truth in truths]  # fmt: skip
    rows = []
    with tqdm(total=len(cells) * replicates, unit="fleet", disable=not progress, file=sys.stderr) as bar:
        for key, k, spread, n, truth in cells:
            claim, comparison = comparisons[key]
            cv = COMPARISONS[key]
            effect = math.log(comparison.target.ratio)
            mu, tau = single.TRUTHS[truth] * effect, SPREADS[spread] * abs(effect)
            rng = single.cell_rng(seed, "pooled", key, k, spread, n, truth)
            counts, i2s, differ = Counter(), [], 0
            for _ in range(replicates):
                row = fleet_word(claim, comparison, rng, k, n, cv, mu, tau)
                counts[single.word_of(row)] += 1
                i2s.append(row.i2)
                differ += row.reason.startswith("machines differ")
            bar.update(replicates)
            for word in single.WORDS:
                rows.append(
                    {
                        # verdict_characteristics.acceptance groups by these columns: "analysis" is the fleet size
                        # and "drift" the between-machine spread here
                        "analysis": f"k={k}",
                        "comparison": key,
                        "target": comparison.target.ratio,
                        "drift": spread,
                        "cv": cv,
                        "n": n,
                        "truth": truth,
                        "truth_ratio": math.exp(mu),
                        "word": word,
                        "count": counts[word],
                        "replicates": replicates,
                        "rate": counts[word] / replicates,
                        "median_i2": float(np.median(i2s)),
                        "machines_differ": differ / replicates,
                    }
                )
    return pd.DataFrame(rows)


def summary_lines(accepted: pd.DataFrame) -> list[str]:
    lines = []
    for check in single.CHECKS:
        mine = accepted[accepted["check"] == check.key]
        if mine.empty:
            continue
        cells = mine.groupby(["analysis", "comparison", "drift", "n"])["result"].apply(lambda r: (r == "FAIL").any())
        worst = mine.loc[mine["rate"].idxmax()]
        where = (
            f" ({worst['comparison']}, {worst['analysis']}, spread {worst['drift']}, n={worst['n']}, truth "
            f"{worst['truth']})"
            if worst["hits"]
            else ""
        )
        lines.append(
            f"pooled: {check.key}: {check.says} <= {single.LIMIT:.0%}: {int(cells.sum())} of {cells.size} cells "
            f"FAIL; worst {worst['hits']}/{worst['replicates']}{where}"
        )
    return lines


def misleading_grid(accepted: pd.DataFrame) -> pd.DataFrame:
    """Per comparison, fleet size and spread (rows) and n (columns): the worst misleading rate over every check and
    truth, with the check and truth it comes from."""
    rows = []
    for (key, k, spread), group in accepted.groupby(["comparison", "analysis", "drift"], sort=False):
        row = {"comparison": key, "machines": k, "spread": spread}
        for n, at_n in group.groupby("n", sort=False):
            worst = at_n.loc[at_n["rate"].idxmax()]
            which = f" ({worst['check']}, {worst['truth']})" if worst["hits"] else ""
            row[f"n={n}"] = f"{worst['rate']:.1%}{which}"
        rows.append(row)
    return pd.DataFrame(rows)


def words_at_target(table: pd.DataFrame) -> pd.DataFrame:
    """What the pooled word says when mu equals the target (the words' informativeness), per cell."""
    chosen = table[(table["truth"] == "equal") & (table["count"] > 0)]
    rows = []
    for (key, k, spread, n), group in chosen.groupby(["comparison", "analysis", "drift", "n"], sort=False):
        ranked = group.sort_values("count", ascending=False)
        words = ", ".join(f"{w} {c}" for w, c in zip(ranked["word"], ranked["count"], strict=True))
        rows.append(
            {
                "comparison": key,
                "machines": k,
                "spread": spread,
                "n": n,
                "words (of replicates)": words,
                "median I²": f"{group['median_i2'].iloc[0]:.0%}",
                "machines differ": f"{group['machines_differ'].iloc[0]:.0%}",
            }
        )
    return pd.DataFrame(rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicates", type=int, default=400, help="synthetic fleets per cell (default 400)")
    parser.add_argument("--quick", action="store_true", help="20 fleets per cell")
    parser.add_argument("--out", type=Path, default=Path("bench-out/pooled-characteristics"))
    parser.add_argument("--comparison", nargs="+", choices=list(COMPARISONS), default=list(COMPARISONS))
    parser.add_argument("--machines", nargs="+", type=int, default=list(MACHINES))
    parser.add_argument("--spread", nargs="+", choices=list(SPREADS), default=list(SPREADS))
    parser.add_argument("--runs", nargs="+", type=int, default=list(RUNS))
    parser.add_argument("--truth", nargs="+", choices=list(single.TRUTHS), default=list(single.TRUTHS))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if min(args.machines) < 3 or min(args.runs) < 5 or args.replicates < 1:
        parser.error("--machines at least 3 (a pool needs 3), --runs at least 5 (a bounded 95% CI), --replicates >= 1")
    replicates = 20 if args.quick else args.replicates
    comparisons = single.load_comparisons(args.comparison)
    started = time.monotonic()
    table = characteristics(
        comparisons,
        args.machines,
        args.spread,
        args.runs,
        args.truth,
        replicates,
        seed=args.seed,
        progress=sys.stderr.isatty(),
    )
    accepted = single.acceptance(table)
    elapsed = time.monotonic() - started
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "characteristics.csv", index=False)
    accepted.to_csv(args.out / "acceptance.csv", index=False)
    lines = summary_lines(accepted)
    grid = misleading_grid(accepted)
    header = (
        f"{replicates} fleets per cell, seed {args.seed}, {elapsed:.0f} s; the comparison alone as each machine's "
        "family; CV " + ", ".join(f"{key} {cv:.0%}" for key, cv in COMPARISONS.items() if key in comparisons)
    )
    (args.out / "characteristics.md").write_text(
        f"# Operating characteristics of the pooled word\n\n{header}\n\n"
        + "\n".join(f"- {line}" for line in lines)
        + "\n\n## Worst misleading rate per cell (check, truth)\n\n"
        + grid.to_markdown(index=False)
        + "\n\n## The pooled word when the machines' mean equals the target\n\n"
        + words_at_target(table).to_markdown(index=False)
        + "\n"
    )
    print(header)
    for line in lines:
        print(line)
    print(grid.to_markdown(index=False))
    return 1 if (accepted["result"] == "FAIL").any() else 0


if __name__ == "__main__":
    sys.exit(main())
