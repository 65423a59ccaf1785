"""What the stopping rule does to the verdicts' false-positive rate: simulated captures with no effect.

Each simulated capture draws runs of two conditions from the same log-normal distribution (coefficient of
variation ``--cv``), starts with ``--runs`` per condition and adds rounds of one run per condition while the
95% percentile-bootstrap CI of the ratio of medians is wider (half-width on the log scale) than the
precision target, up to ``--max-runs``, as ``ticklab.capture.stopping`` decides. It then applies
the verdict's test (two-sided Mann-Whitney, alpha 0.05) and counts how often it calls a difference that is
not there; the same number of captures at a fixed run count is the reference.

    .venv/bin/python benchmarks/stopping_error_rate.py [--captures 400] [--cv 0.2] [--target 1.087]

Prints the false-positive rate with and without the rule and its binomial 95% CI.
"""

from __future__ import annotations

import argparse
import math

import numpy as np
from scipy import stats

from ticklab.capture.stopping import MIN_RUNS, log_half_width
from ticklab.stats import ratio_of_medians


def one_capture(rng, sigma: float, runs: int, max_runs: int, target_log: float, n_boot: int, seed: int):
    a = list(np.exp(rng.normal(0, sigma, runs)))
    b = list(np.exp(rng.normal(0, sigma, runs)))
    while True:
        ci = ratio_of_medians(a, b, n_boot=n_boot, seed=seed)
        if (log_half_width(ci.low, ci.high) <= target_log and len(a) >= MIN_RUNS) or len(a) >= max_runs:
            break
        a.append(float(np.exp(rng.normal(0, sigma))))
        b.append(float(np.exp(rng.normal(0, sigma))))
    return stats.mannwhitneyu(a, b, alternative="two-sided").pvalue, len(a)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--captures", type=int, default=400)
    parser.add_argument("--cv", type=float, default=0.2, help="run-to-run coefficient of variation")
    parser.add_argument("--target", type=float, default=1.087, help="target ratio; the precision target is half its log")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--max-runs", type=int, default=60)
    parser.add_argument("--n-boot", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    sigma = math.sqrt(math.log1p(args.cv ** 2))
    target_log = abs(math.log(args.target)) / 2
    rng = np.random.default_rng(args.seed)
    stopped = {"with the stopping rule": [one_capture(rng, sigma, args.runs, args.max_runs, target_log, args.n_boot,
                                                      args.seed) for _ in range(args.captures)]}
    fixed = [stats.mannwhitneyu(np.exp(rng.normal(0, sigma, args.runs)), np.exp(rng.normal(0, sigma, args.runs)),
                                alternative="two-sided").pvalue for _ in range(args.captures)]
    rows = [(label, [p for p, _ in runs]) for label, runs in stopped.items()] + [(f"fixed at {args.runs} runs", fixed)]
    for label, pvalues in rows:
        hits = sum(p < 0.05 for p in pvalues)
        low, high = stats.binomtest(hits, len(pvalues)).proportion_ci()
        print(f"{label:>28}: false positives {hits}/{len(pvalues)} = {hits / len(pvalues):.3f} "
              f"[{low:.3f}, {high:.3f}]")
    for label, runs in stopped.items():
        sizes = [n for _, n in runs]
        print(f"runs per condition, {label}: median {int(np.median(sizes))}, max {max(sizes)}")
    print(f"(cv {args.cv}, target ×{args.target}, precision target {target_log:.3f} on the log scale, "
          f"{args.runs} initial runs, at most {args.max_runs})")


if __name__ == "__main__":
    main()
