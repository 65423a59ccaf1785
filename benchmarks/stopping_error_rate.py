"""What the stopping rule does to the verdicts' false-positive rate: simulated captures with no effect.

Each simulated capture draws runs of two conditions from the same log-normal distribution (coefficient of
variation ``--cv``), starts with ``--runs`` per condition and adds rounds of one run per condition while the
verdict's 95% CI (``stats.ratio_interval``: the exact Mann-Whitney inversion CI of the Hodges-Lehmann ratio) is
wider (half-width on the log scale) than the precision target, half the consistent-size band around ``--target``
(``Margins.precision_log``), up to ``--max-runs``, as ``ticklab.capture.stopping`` decides. It then counts how
often that CI excludes no change (what every word that asserts an effect rests on) when there is none; the same
number of captures at a fixed run count is the reference.

    .venv/bin/python benchmarks/stopping_error_rate.py [--captures 400] [--cv 0.2] [--target 1.087]

Prints the false-positive rate with and without the rule and its binomial 95% CI.
"""

from __future__ import annotations

import argparse
import math

import numpy as np
from scipy import stats

from ticklab.analysis.stats import ratio_interval
from ticklab.analysis.verdicts import Margins, Target
from ticklab.capture.stopping import MIN_RUNS, log_half_width


def excludes_no_change(a, b) -> bool:
    ci = ratio_interval(a, b)
    return not ci.low <= 1 <= ci.high


def one_capture(rng, sigma: float, runs: int, max_runs: int, target_log: float):
    a = list(np.exp(rng.normal(0, sigma, runs)))
    b = list(np.exp(rng.normal(0, sigma, runs)))
    while True:
        ci = ratio_interval(a, b)
        if (log_half_width(ci.low, ci.high) <= target_log and len(a) >= MIN_RUNS) or len(a) >= max_runs:
            break
        a.append(float(np.exp(rng.normal(0, sigma))))
        b.append(float(np.exp(rng.normal(0, sigma))))
    return excludes_no_change(a, b), len(a)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--captures", type=int, default=400)
    parser.add_argument("--cv", type=float, default=0.2, help="run-to-run coefficient of variation")
    parser.add_argument(
        "--target", type=float, default=1.3, help="target ratio; the precision target is half the band around it"
    )
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--max-runs", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    sigma = math.sqrt(math.log1p(args.cv**2))
    direction = 1 if args.target > 1 else -1
    target_log = Margins(no_effect=0.01).precision_log(Target(args.target, direction, "derived: a benchmark's", "", ()))
    rng = np.random.default_rng(args.seed)
    stopped = {
        "with the stopping rule": [
            one_capture(rng, sigma, args.runs, args.max_runs, target_log) for _ in range(args.captures)
        ]
    }
    fixed = [
        excludes_no_change(np.exp(rng.normal(0, sigma, args.runs)), np.exp(rng.normal(0, sigma, args.runs)))
        for _ in range(args.captures)
    ]
    rows = [(label, [hit for hit, _ in runs]) for label, runs in stopped.items()] + [
        (f"fixed at {args.runs} runs", fixed)
    ]
    for label, excluded in rows:
        hits = sum(excluded)
        low, high = stats.binomtest(hits, len(excluded)).proportion_ci()
        print(
            f"{label:>28}: CI excludes no change in {hits}/{len(excluded)} = {hits / len(excluded):.3f} "
            f"[{low:.3f}, {high:.3f}]"
        )
    for label, runs in stopped.items():
        sizes = [n for _, n in runs]
        print(f"runs per condition, {label}: median {int(np.median(sizes))}, max {max(sizes)}")
    print(
        f"(cv {args.cv}, target ×{args.target}, precision target {target_log:.3f} on the log scale, "
        f"{args.runs} initial runs, at most {args.max_runs})"
    )


if __name__ == "__main__":
    main()
