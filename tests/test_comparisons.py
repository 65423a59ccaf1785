"""Fresh-data verdicts from bundles: per setup, per comparison, Holm across the claim; and the nohz
analyses that feed them (FTQ samples, spectrum, osnoise rows)."""

import subprocess
from datetime import UTC, datetime

import numpy as np
import pandas as pd
import pytest

from ticklab.analysis.captured import find_bundles
from ticklab.analysis.comparisons import Comparison, measured_runs, verdicts
from ticklab.analysis.verdicts import VERDICTS, Margins, Target
from ticklab.bundle import BundleWriter
from ticklab.capture.requirements import tools_bin
from ticklab.capture.workloads import parse_ftq
from ticklab.claims import nohz

pytestmark = pytest.mark.xdist_group("machine")

WHEN = datetime(2026, 11, 21, 18, 0, 0, tzinfo=UTC)
TWO_PERCENT = Margins(no_effect=0.02)
FASTER = Comparison(
    "b vs a", "work", "b", "a", Target(1.10, 1, "derived: a test's", "+10% work", ("nohz/t/r",)), margins=TWO_PERCENT
)


def runs_frame(values: dict) -> pd.DataFrame:
    rows = [
        {
            "host_id": setup,
            "bundle": "x",
            "experiment": "e",
            "run": f"run-{i}",
            "condition": condition,
            "metric": "work",
            "value": v,
            "unit": "u",
        }
        for (setup, condition), vs in values.items()
        for i, v in enumerate(vs)
    ]
    return pd.DataFrame(rows)


def test_a_clear_effect_is_reproduced_and_a_setup_without_the_conditions_gets_no_row():
    rng = np.random.default_rng(1)
    runs = runs_frame(
        {
            ("guest", "a"): 100 + rng.normal(0, 1, 10),
            ("guest", "b"): 111 + rng.normal(0, 1, 10),
            ("host", "a"): 100 + rng.normal(0, 1, 10),
        }
    )
    found = {v.setup: v for v in verdicts("nohz", [FASTER], runs, n_boot=2000)}
    assert set(found) == {"guest"}, "claim_verdicts, not verdicts, gives untested setups their row"
    guest = found["guest"]
    assert guest.verdict == "reproduced" and 1.09 < guest.fresh_effect < 1.13, guest.reason
    assert guest.ci_low > 1 and guest.p_holm < 0.001 and guest.cliffs_delta == 1.0 and guest.ci_level == "95%"
    assert guest.n_per_condition == "10 vs 10" and "Holm over this setup's 1" in guest.test
    assert "Hodges-Lehmann ratio (median of the 10×10 run ratios), exact Mann-Whitney inversion CI" in guest.test
    assert guest.target_ratio == 1.10 and guest.source_quotes == "nohz/t/r" and guest.power_at_target > 0.9


def test_no_effect_is_shown_and_the_family_is_the_claim_on_one_setup():
    rng = np.random.default_rng(2)
    runs = runs_frame(
        {
            ("guest", "a"): 100 + rng.normal(0, 0.5, 12),
            ("guest", "b"): 100 + rng.normal(0, 0.5, 12),
            ("guest", "c"): 130 + rng.normal(0, 0.5, 12),
        }
    )
    slower = Comparison(
        "c vs a", "work", "c", "a", Target(1.3, 1, "derived: a test's", "+30%", ()), margins=TWO_PERCENT
    )
    found = {v.comparison: v for v in verdicts("nohz", [FASTER, slower], runs, n_boot=2000)}
    assert found["b vs a"].verdict == "no effect shown" and "no-effect margin" in found["b vs a"].reason
    assert found["c vs a"].verdict == "reproduced"
    assert "Holm over this setup's 2" in found["c vs a"].test and found["c vs a"].ci_level.startswith(
        "0.975 (simultaneous 95%"
    )
    # another setup's bundle does not change this setup's family: same p, same CI
    other = runs_frame(
        {
            ("other", "a"): 100 + rng.normal(0, 0.5, 12),
            ("other", "b"): 100 + rng.normal(0, 0.5, 12),
            ("other", "c"): 100 + rng.normal(0, 0.5, 12),
        }
    )
    again = {
        v.comparison: v
        for v in verdicts("nohz", [FASTER, slower], pd.concat([runs, other]), n_boot=2000)
        if v.setup == "guest"
    }
    for name, row in found.items():
        assert (again[name].p_holm, again[name].ci_low, again[name].ci_high) == (row.p_holm, row.ci_low, row.ci_high)


def test_two_comparisons_of_the_same_data_are_one_test_in_the_family():
    """hrtick's "series" and "no regression" rows test the same runs against different targets: one p-value, one
    CI. The family counts distinct tests (issue 44 item 4): with one other comparison m is 2, not 3."""
    from ticklab.analysis.stats import holm, mann_whitney, ratio_by_ranks

    rng = np.random.default_rng(5)
    a, b, c = (100 * np.exp(rng.normal(shift, 0.05, 7)) for shift in (0.0, 0.06, 0.04))
    runs = runs_frame({("guest", "a"): a, ("guest", "b"): b, ("guest", "c"): c})
    series = FASTER
    no_regression = Comparison(
        "no regression: b vs a",
        "work",
        "b",
        "a",
        Target(None, -1, "derived: a test's", "no slower", (), no_worse_than=0.95),
        margins=TWO_PERCENT,
    )
    other = Comparison("c vs a", "work", "c", "a", Target(1.05, 1, "derived: a test's", "+5%", ()), margins=TWO_PERCENT)
    found = {v.comparison: v for v in verdicts("nohz", [series, no_regression, other], runs, n_boot=500)}
    assert len(found) == 3
    raw = [mann_whitney(b, a).pvalue, mann_whitney(c, a).pvalue]
    expected = holm(raw)
    assert expected[0] != pytest.approx(holm(raw + raw[:1])[0]), "the data must tell m = 2 from m = 3"
    assert found["b vs a"].p_holm == found["no regression: b vs a"].p_holm == pytest.approx(expected[0])
    assert found["c vs a"].p_holm == pytest.approx(expected[1])
    same_ci = ratio_by_ranks(b, a, confidence=1 - 0.05 / 2)
    for name in ("b vs a", "no regression: b vs a"):
        row = found[name]
        assert (row.ci_low, row.ci_high) == pytest.approx((same_ci.low, same_ci.high))
        assert row.ci_level.startswith("0.975 (simultaneous 95% over this setup's 2 distinct tests: Bonferroni)")
        assert "Holm over this setup's 2 distinct tests (the same test as " in row.test
    assert "the same test as no regression: b vs a: counted once" in found["b vs a"].test
    assert (
        "Holm over this setup's 2 distinct tests;" in found["c vs a"].test and "same test" not in found["c vs a"].test
    )
    # two comparisons of the same data and nothing else: one test, at the family's full level
    alone = {v.comparison: v for v in verdicts("nohz", [series, no_regression], runs, n_boot=500)}
    assert {row.ci_level for row in alone.values()} == {"95%"}
    assert alone["b vs a"].p_holm == pytest.approx(raw[0])
    assert all("Holm over this setup's 1 distinct test (" in row.test for row in alone.values())


def test_negative_controls_use_the_verdicts_estimator_and_ci():
    """Issue 44 item 4: a control's ratio and CI are the verdicts' (stats.ratio_interval of medians: Hodges-Lehmann
    with the exact Mann-Whitney inversion CI), not a bootstrap ratio of medians."""
    from ticklab.analysis.comparisons import NegativeControl, negative_controls
    from ticklab.analysis.stats import mann_whitney, ratio_interval, ratio_of_medians

    baseline = [100.0, 101.0, 102.0, 103.0, 104.0, 105.0, 106.0]
    treatment = [99.0, 100.0, 101.0, 103.0, 115.0, 118.0, 120.0]  # ratio of medians ×1, Hodges-Lehmann ×1.0098
    runs = runs_frame({("guest", "on"): treatment, ("guest", "off"): baseline})
    control = NegativeControl("on vs off, nothing to change", "work", "on", "off", 0.05)
    [row] = negative_controls([control], runs, n_boot=500).to_dict("records")
    verdicts_ci = ratio_interval(treatment, baseline, confidence=0.95)
    assert "Hodges-Lehmann" in verdicts_ci.method
    assert (row["fresh_effect"], row["ci_low"], row["ci_high"]) == pytest.approx(
        (verdicts_ci.estimate, verdicts_ci.low, verdicts_ci.high)
    )
    assert row["fresh_effect"] == pytest.approx(np.median(np.array(treatment)[:, None] / np.array(baseline)[None, :]))
    medians = ratio_of_medians(treatment, baseline, n_boot=500)
    assert abs(row["fresh_effect"] - medians.estimate) > 0.005, "the data must tell the two estimators apart"
    assert row["p"] == pytest.approx(mann_whitney(treatment, baseline).pvalue)
    assert row["outcome"].startswith("passed: no effect detected")
    # too few runs for a bounded exact CI at 95 % (3 vs 3): the control says it tested nothing, not that it passed
    few = runs_frame({("guest", "on"): treatment[:3], ("guest", "off"): baseline[:3]})
    [row] = negative_controls([control], few, n_boot=500).to_dict("records")
    assert (row["ci_low"], row["ci_high"]) == (0.0, float("inf"))
    assert row["outcome"].startswith("not tested: 3 vs 3 runs cannot give a bounded 95% CI")


OSNOISE = """duration:   0 00:00:05 | time is in us
CPU Period       Runtime        Noise  % CPU Aval   Max Noise   Max Single          HW          NMI          IRQ      Softirq       Thread
  1 #5           5004789       776728    84.48030      210715         9609        9412            0         4528           93            5
"""  # noqa: E501 (osnoise's own lines)


def test_osnoise_rows_parse_rtla_top_output():
    assert nohz.osnoise_rows(OSNOISE) == [
        {
            "cpu": 1,
            "runtime_us": 5004789,
            "noise_us": 776728,
            "cpu_available_pct": 84.4803,
            "max_noise_us": 210715,
            "irqs": 4528,
            "softirqs": 93,
        }
    ]


@pytest.mark.skipif(not (tools_bin() / "ftq").exists(), reason="tools not built: run 'make tools'")
def test_fresh_ftq_samples_feed_the_figure_spectrum_and_verdicts(tmp_path):
    writer = BundleWriter(
        tmp_path, "guest-test", "nohz", "ftq", definition={"workload": {"tool": "ftq"}}, host={}, when=WHEN
    )
    for index, condition in enumerate(["hz1000", "hz1000-nohz_full"] * 2):
        run = f"run-{index + 1:03d}"
        directory = writer.run_dir(run)
        subprocess.run(
            [tools_bin() / "ftq", "-q", "100000", "-n", "400", "-w", "20", "-c", "0", "-o", directory / "ftq.dat"],
            check=True,
        )
        writer.add_run(
            {"run": run, "condition": condition, "warmup": False, "status": "ok", "problem": None}, parse_ftq(directory)
        )
    writer.seal()
    bundles = find_bundles(tmp_path, "nohz")
    samples = nohz.fresh_ftq(bundles)
    assert len(samples) == 4 * 400 and set(samples["condition"]) == {"hz1000", "hz1000-nohz_full"}
    assert (samples["quantum_ns"] == 100000).all()
    spectrum = nohz.tick_spectrum(samples, "guest-test")
    assert spectrum["frequency_hz"].max() == pytest.approx(5000)  # 10 kHz sampling: Nyquist 5 kHz
    nohz.ftq_sorted_figure(samples, "guest-test")
    runs, notes = measured_runs(bundles)
    assert set(runs["metric"]) >= {"ftq_count_mean", "ftq_noise_fraction"} and not notes


def test_the_sorted_ftq_curve_is_drawn_through_evenly_spaced_ranks_with_both_ends():
    import numpy as np
    import pandas as pd

    counts = np.random.default_rng(4).integers(1000, 90000, size=50_001)
    samples = pd.DataFrame(
        {
            "host_id": "h",
            "condition": "hz1000",
            "run": "run-001",
            "quantum_ns": 100000,
            "index": np.arange(len(counts)),
            "count": counts,
        }
    )
    line = nohz.ftq_sorted_figure(samples, "h").axes[0].lines[0]
    share, drawn = line.get_xdata(), line.get_ydata()
    assert len(drawn) == nohz.SORTED_CURVE_POINTS and (np.diff(drawn) >= 0).all()
    assert drawn[0] == counts.min() / counts.max() and drawn[-1] == 1.0  # the fewest and the most work both drawn
    assert share[0] == 1 / len(counts) and share[-1] == 1.0
    assert "50001 quanta" in line.get_label()  # the legend counts every quantum, not the points drawn
    few = samples.head(300)
    assert len(nohz.ftq_sorted_figure(few, "h").axes[0].lines[0].get_ydata()) == 300  # fewer quanta: every one


def test_every_setup_in_the_data_is_accounted_for_in_one_row(tmp_path):
    from types import SimpleNamespace

    from ticklab import paths
    from ticklab.analysis.published import load_published

    for host, claim in (("host-a", "nohz"), ("guest-tcg-x", "hpet")):
        writer = BundleWriter(tmp_path, host, claim, "e", definition={}, host={}, when=WHEN)
        writer.manifest.not_testable = "nothing to run with"
        writer.seal()
    ctx = SimpleNamespace(published=load_published(paths.published_dir(), "acpi-idle"), bundles=[], data_dir=tmp_path)
    from ticklab.claims import acpi_idle

    [row] = acpi_idle.CLAIM.verdicts(ctx, n_boot=200)
    assert row.setup == "guest-tcg-x, host-a" and row.verdict == "not testable here"
    assert "guest-tcg-x: no acpi-idle bundle from this setup (QEMU offers guests no ACPI C-states" in row.reason
    assert "host-a: no acpi-idle bundle from this setup |" not in row.reason and row.reason.endswith(
        "host-a: no acpi-idle bundle from this setup"
    )
    ctx = SimpleNamespace(
        published=load_published(paths.published_dir(), "nohz"),
        bundles=find_bundles(tmp_path, "nohz"),
        data_dir=tmp_path,
    )
    [row] = nohz.CLAIM.verdicts(ctx, n_boot=200)
    assert (
        "host-a: e: nothing to run with" in row.reason and "guest-tcg-x: no nohz bundle from this setup" in row.reason
    )


def test_clock_read_share_sums_vdso_and_clock_functions_from_perf_report():
    from ticklab.claims import hpet

    report = """# Samples: 8K of event 'cpu-clock'
    57.08%  clockbench  [vdso]             [.] 0x000000000000079b
    11.09%  clockbench  [vdso]             [.] __vdso_clock_gettime
                --10.00%--clock_gettime@@GLIBC_2.17
    10.74%  clockbench  clockbench         [.] run
     4.50%  clockbench  [kernel.kallsyms]  [k] read_hpet
     1.82%  clockbench  clockbench         [.] clock_gettime@plt
"""
    share, hottest = hpet.clock_read_share(report)
    assert share == pytest.approx(57.08 + 11.09 + 4.50 + 1.82) and hottest == "[vdso] +0x79b (unnamed)"


@pytest.mark.slow
@pytest.mark.skipif(
    subprocess.run(["sh", "-c", "command -v tbench tbench_srv"], capture_output=True).returncode != 0,
    reason="tbench is not installed (Debian: dbench)",
)
def test_fresh_tbench_runs_on_a_host_with_cpuidle_states_give_the_mmtests_table_and_a_verdict(fake_host, tmp_path):
    """A fake host with POLL, C1, C2 (knobs in a directory tree) and real tbench over loopback."""
    import json
    from types import SimpleNamespace

    import yaml

    from ticklab import paths
    from ticklab.analysis.published import load_published
    from ticklab.capture.experiment import load_experiment
    from ticklab.capture.runner import CaptureOptions, capture
    from ticklab.claims import acpi_idle

    definition = load_experiment(paths.repo_root() / "runners" / "acpi-idle" / "tbench.yaml").definition
    definition = {**definition, "workload": {**definition["workload"], "params": {"seconds": 2}}, "profile": None}
    path = tmp_path / "tbench.yaml"
    path.write_text(yaml.safe_dump(definition))
    options = CaptureOptions(
        runs=3,
        warmup=0,
        out=tmp_path / "traces",
        host_id="fake-idle",
        root=fake_host,
        journal=tmp_path / "j.json",
        progress=False,
    )
    [bundle] = capture("acpi-idle", options, experiment_path=path, log=lambda _: None)
    conditions = {c["name"]: c for c in json.loads((bundle / "manifest.json").read_text())["conditions"]}
    assert conditions["deepest-disabled"]["idle"] == "max=C1" and conditions["all-states"]["idle"] == "all"
    bundles = find_bundles(tmp_path / "traces", "acpi-idle")
    runs, _ = measured_runs(bundles)
    [table] = acpi_idle.fresh_mmtests_tables(runs).values()
    assert list(table.index) == ["Min", "Max", "Median", "AMean", "Stddev", "CoefVar"]
    assert [c.rstrip(" *") for c in table.columns] == ["all-states", "deepest-disabled"]
    assert "%)" in table.iloc[0, 1] and "%)" not in table.iloc[0, 0]
    ctx = SimpleNamespace(
        published=load_published(paths.published_dir(), "acpi-idle"), bundles=bundles, data_dir=tmp_path / "traces"
    )
    median, tail = acpi_idle.CLAIM.verdicts(ctx, n_boot=500)
    assert median.setup == tail.setup == "fake-idle" and median.n_per_condition == "3 vs 3"
    assert median.verdict in VERDICTS and median.verdict != "not testable here" and median.fresh_effect > 0
    assert median.printed_in_source == "33476.60 / 32191.80" and median.target_provenance.startswith("derived: ratio")
    assert "10th percentile" in tail.comparison and "proxy for Min" in tail.target_provenance
    lower = acpi_idle.lower_tail_table(runs, n_resamples=200)
    assert list(lower["condition"]) == ["all-states", "deepest-disabled"] and lower["runs"].tolist() == [3, 3]


def test_kick_ahead_lab_runs_give_seed_001s_table_counters_checks_and_lab_analogue_verdicts(tmp_path):
    """The analysis a lab bundle gets: build times and lock event counts per run as the kbuild workload reports
    them (made up here, as a bundle writer would record them, and never shipped)."""
    from types import SimpleNamespace

    from ticklab import paths
    from ticklab.analysis.published import load_published
    from ticklab.claims import pvspinlock

    setup = "guest-tcg-2-3-4vcpu-test"
    writer = BundleWriter(tmp_path, setup, "pvspinlock", "guest-kbuild", definition={}, host={}, when=WHEN)
    times = {
        "0 1.5x": [30.0, 31.0, 29.5, 30.5, 30.2, 29.8],
        "4 1.5x": [27.0, 27.5, 26.8, 27.2, 27.1, 26.9],
        "0 1x": [20.0, 20.4, 19.8, 20.2],
        "4 1x": [20.1, 20.3, 19.9, 20.0],
    }
    index = 0
    for key, values in times.items():
        kick_ahead, level = key.split()
        vcpus = {"1x": 2, "1.5x": 3}[level]
        for value in values:
            index += 1
            kicks = 150.0 if (kick_ahead == "4" and vcpus >= 3) else 0.0
            if index == 2:
                kicks = 1.0  # a kick-ahead with pv_kick_ahead=0: the switch did not work, the run is left out
            rows = [
                {"metric": "build_time_s", "value": value, "unit": "s"},
                {"metric": "guest_vcpus", "value": vcpus, "unit": "CPUs"},
            ]
            rows += [
                {"metric": f"lockevent_{name}", "value": count, "unit": "events"}
                for name, count in (
                    ("pv_lab_wait", 900),
                    ("pv_lab_halt", 700),
                    ("pv_wait_head", 400),
                    ("pv_wait_node", 500),
                    ("pv_kick_unlock", 650),
                    ("pv_kick_ahead", kicks),
                )
            ]
            writer.add_run(
                {
                    "run": f"run-{index:03d}",
                    "condition": f"kick-ahead-{kick_ahead} {level}",
                    "warmup": False,
                    "status": "ok",
                    "guest": {"switches": {"pv_kick_ahead": kick_ahead}},
                },
                rows,
            )
    writer.seal()
    bundles = find_bundles(tmp_path, "pvspinlock")
    runs, notes = measured_runs(bundles, pvspinlock.CHECKS, "pvspinlock")
    assert "run-002" not in set(runs["run"]) and any(
        "condition check failed or could not be computed (run-002" in n for n in notes
    )
    published = load_published(paths.published_dir(), "pvspinlock")
    table = pvspinlock.fresh_table(runs, published)
    lab = table[table["source"] == "lab analogue (TCG, halt+IPI backend)"].set_index("guest vCPUs")
    assert list(lab.index) == ["2 (1x host CPUs)", "3 (1.5x host CPUs)"]
    assert lab.loc["3 (1.5x host CPUs)", "after / before"] == pytest.approx(round(27.05 / 30.0, 4))
    assert lab.loc["3 (1.5x host CPUs)", "runs per side"] == "5 / 6"
    assert len(table[table["source"].str.startswith("published")]) == 4
    kick_aheads = pvspinlock.kick_ahead_table(runs).set_index("condition")
    assert kick_aheads.loc["kick-ahead-4 1.5x", "runs with kick-aheads"] == 6
    counters = pvspinlock.counter_table(runs)
    assert counters.loc[(setup, "kick-ahead-4 1.5x"), "pv_kick_ahead"] == 150
    ctx = SimpleNamespace(published=published, bundles=bundles, data_dir=tmp_path)
    found = {v.comparison.rsplit("= ", 1)[1]: v for v in pvspinlock.CLAIM.verdicts(ctx, n_boot=1000)}
    assert set(found) == {"1x host CPUs", "1.5x host CPUs"}
    assert found["1x host CPUs"].verdict == "not testable here"
    assert found["1x host CPUs"].reason.startswith(
        "kick-ahead barely ran: 0 kick-aheads in 4 builds with "
        "pv_kick_ahead=4 on 2 vCPUs (median 0 a build, below the declared "
        "minimum 100"
    )
    assert found["1x host CPUs"].reason.endswith("left out of the multiple-comparison family")
    overcommitted = found["1.5x host CPUs"]
    assert overcommitted.comparison.startswith("lab analogue (TCG, halt+IPI backend): ")
    treated, base = np.array(times["4 1.5x"]), np.array([v for i, v in enumerate(times["0 1.5x"]) if i != 1])
    assert overcommitted.fresh_effect == pytest.approx(np.median(treated[:, None] / base[None, :]))
    assert overcommitted.n_per_condition == "6 vs 5" and "Holm over this setup's 1" in overcommitted.test
    assert overcommitted.printed_in_source == "9m21.1s / 11m20.6s" and overcommitted.target_ratio == pytest.approx(
        561.1 / 680.6
    )
    assert overcommitted.target_provenance.startswith("derived: ratio of two printed values")


def test_runs_of_two_bundles_of_one_setup_are_two_series_in_the_spectrum_not_one_interleaved():
    import numpy as np
    import pandas as pd
    from scipy import signal

    rng = np.random.default_rng(7)
    # two bundles of one setup, each with its run-001: a pure 1 kHz tone in one, noise in the other
    tone = 1000 + 500 * np.sin(2 * np.pi * 1000 * np.arange(4096) / 10_000)
    noise = rng.normal(1000, 50, size=4096)
    samples = pd.concat(
        [
            pd.DataFrame(
                {
                    "host_id": "h",
                    "bundle": bundle,
                    "run": "run-001",
                    "condition": "hz1000",
                    "quantum_ns": 100_000,
                    "index": np.arange(4096),
                    "count": counts,
                }
            )
            for bundle, counts in (("b1", tone), ("b2", noise))
        ],
        ignore_index=True,
    )
    spectrum = nohz.tick_spectrum(samples, "h")
    expected = np.mean([signal.welch(c - c.mean(), fs=10_000, nperseg=2048)[1] for c in (tone, noise)], axis=0)
    assert np.allclose(spectrum["power"].to_numpy(), expected)  # the mean of the two runs' own spectra
