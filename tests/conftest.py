import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from ticklab import paths
from ticklab.claims import all_claims

REPO = paths.repo_root()
CLAIM_IDS = [claim.id for claim in all_claims()]  # in seed order

# Only so that a broken test cannot hang CI for ever: every wait of the process tests is on a file or a process.
WAIT_BOUND_S = float(os.environ.get("TICKLAB_TEST_WAIT_BOUND_S", 600))


def wait_for(condition, what: str, process: subprocess.Popen | None = None) -> None:
    """Poll ``condition`` until it holds (a file written, a process gone); no deadline a loaded host could exceed."""
    deadline = time.monotonic() + WAIT_BOUND_S
    while not condition():
        if process is not None:
            assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, f"{what}: not within {WAIT_BOUND_S} s"
        time.sleep(0.05)


def gone(pid: int) -> bool:
    """The process has exited (a zombie waiting for its reaper counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True


@pytest.fixture
def seeds():
    directory = paths.seeds_dir()
    if directory is None:
        pytest.skip("source documents not found: set TICKLAB_SEEDS or place ../shared/seeds beside the repo")
    return directory


@pytest.fixture
def published_copy(tmp_path: Path) -> Path:
    """A writable copy of traces/published to break on purpose."""
    target = tmp_path / "published"
    shutil.copytree(paths.published_dir(), target)
    return target


def make_fake_host(root: Path, *, cpus: int = 2, clocksources=("tsc", "hpet", "acpi_pm"),
                   idle_states=("POLL", "C1", "C2"), features=("GENTLE_FAIR_SLEEPERS", "NO_HRTICK", "WAKEUP_PREEMPTION")) -> Path:
    """A directory tree shaped like the sysfs/procfs/debugfs files ticklab reads and writes."""
    def put(relative: str, text: str) -> None:
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")

    put("proc/sys/kernel/osrelease", "6.12.57-ticklab")
    put("proc/cmdline", "console=ttyS0 quiet")
    put("proc/cpuinfo", "".join(f"processor\t: {n}\nmodel name\t: Fake(R) CPU 9000 @ 3.00GHz\nflags\t\t: fpu tsc hypervisor\n\n" for n in range(cpus)))
    put("sys/devices/system/cpu/online", f"0-{cpus - 1}")
    put("sys/devices/system/clocksource/clocksource0/available_clocksource", " ".join(clocksources))
    put("sys/devices/system/clocksource/clocksource0/current_clocksource", clocksources[0])
    put("sys/devices/system/cpu/cpuidle/current_driver", "acpi_idle" if idle_states else "none")
    for cpu in range(cpus):
        for index, name in enumerate(idle_states):
            base = f"sys/devices/system/cpu/cpu{cpu}/cpuidle/state{index}"
            put(f"{base}/name", name)
            put(f"{base}/latency", str(index * 10))
            put(f"{base}/disable", "0")
    put("sys/kernel/debug/sched/features", " ".join(features))
    return root


@pytest.fixture
def fake_host(tmp_path: Path) -> Path:
    return make_fake_host(tmp_path / "root")


# `make check` (the fast lane) leaves these out; `make test` runs everything. Whole modules that boot guests, run
# notebooks or start servers, and single tests measured at >= 0.7 s on the 2-core reference machine.
SLOW_MODULES = {"test_report.py", "test_lab.py", "test_lab_kexec.py", "test_fleet.py", "test_jupyter.py", "test_view.py",
                "test_new_claim.py", "test_boot_capture.py"}
SLOW_TESTS = {
    "test_a_capture_on_a_fake_busy_host_records_interference_in_every_run_and_is_flagged",
    "test_a_failing_notebook_fails_the_run_and_names_the_cell",
    "test_a_full_disk_during_a_traced_capture_is_one_line_and_puts_the_host_back",
    "test_a_killed_capture_is_put_back_by_the_next_one",
    "test_a_killed_capture_takes_its_workload_with_it",
    "test_a_partial_run_without_the_summary_succeeds",
    "test_a_project_error_exits_2_with_the_command_name",
    "test_a_real_capture_on_this_host_seals_and_puts_the_host_back",
    "test_a_real_tracefs_capture_matches_trace_cmd_report",
    "test_a_report_run_keeps_my_file_and_records_what_it_wrote",
    "test_a_signal_during_capture_restores_every_knob_and_leaves_an_incomplete_bundle",
    "test_a_tcg_guest_run_brings_back_a_sealed_bundle_with_guest_traces",
    "test_perf_profiles_a_tcg_guest_and_resolves_read_hpet",
    "test_a_tcg_guest_with_the_lab_pvspin_backend_builds_and_counts_waits_kicks_and_kick_aheads",
    "test_an_interrupted_lab_run_kills_the_guest_and_leaves_an_incomplete_bundle",
    "test_an_unreachable_mirror_is_one_line_and_leaves_no_source",
    "test_the_kernel_is_a_condition_interleaved_in_the_seeded_order",
    "test_the_host_boot_plan_kexecs_between_two_installed_kernels_interleaved",
    "test_bad_input_is_one_line_naming_the_file",
    "test_bad_requests_say_why",
    "test_capture_on_a_fake_host_seals_a_verifiable_bundle_and_restores_knobs",
    "test_capture_refuses_a_link_planted_for_its_host_directory_and_writes_nothing_there",
    "test_compare_gives_a_table_or_one_line_for_every_bundle_in_traces",
    "test_doctor_answers_every_check_and_claim_and_leaves_mounts_as_they_were",
    "test_doctor_json_is_machine_readable",
    "test_doctor_on_a_host_without_tracefs_says_so_and_goes_on",
    "test_empty_success_is_a_failure",
    "test_every_expected_output_is_written_and_not_empty",
    "test_fresh_tbench_runs_on_a_host_with_cpuidle_states_give_the_mmtests_table_and_a_verdict",
    "test_jupyterlab_serves_and_executes_a_notebook_through_a_kernel_session",
    "test_kernelshark_loads_the_session_under_xvfb",
    "test_one_changed_byte_of_the_manifest_fails_verify_naming_it",
    "test_out_dot_at_the_repository_root_refuses",
    "test_papermill_runs_one_notebook_on_its_own",
    "test_papermill_with_the_ticklab_engine_prints_no_kernel_warning",
    "test_patches_apply_to_the_real_linux_source_6_12",
    "test_published_only_parameters_give_not_testable_verdicts",
    "test_the_guest_image_is_reproducible_and_holds_what_a_run_needs",
    "test_the_playbook_brings_back_verified_bundles_and_survives_a_dead_host",
    "test_the_published_loader_never_tracebacks_or_reads_outside",
    "test_the_repository_patches_apply_to_debians_6_12",
    "test_capture_boot_dry_run_plans_the_interleaved_order_from_the_experiment",
    "test_capture_boot_names_a_kernel_pattern_that_matches_two",
    "test_the_report_renders_offline_in_headless_chromium",
    "test_the_shipped_bundles_verify_with_their_manifest_seals",
    "test_ticklab_verify_names_a_tampered_bundle",
    "test_verify_checks_every_bundle_and_reports_each_bad_one",
    "test_verify_imports_no_scipy_or_claims",
    "test_a_wheel_installed_elsewhere_runs_doctor_and_a_report_with_its_project",
    "test_a_missing_jsonschema_is_an_import_error_everywhere",
    "test_every_package_ticklab_imports_is_declared_with_a_floor",
    "test_doctor_reports_what_a_killed_capture_left_and_restore_puts_it_back",
    "test_restore_is_refused_while_the_capture_that_wrote_the_journal_runs",
    "test_a_journal_of_another_boot_is_removed_without_writing_anything",
    "test_a_change_that_cannot_be_put_back_is_one_line_naming_it",
    "test_kill_9_of_a_real_capture_then_restore_puts_this_host_back",
    # test_capture_answer.py: each runs `ticklab capture` (the claim's analysis imported for its answer, 4-5 s)
    "test_a_piped_capture_says_each_run_and_ends_with_the_bundles_numbers_and_what_the_source_printed",
    "test_printed_rows_of_one_condition_stand_under_that_condition_and_a_comparison_measured_is_said_tested",
    "test_an_experiment_without_an_answer_says_what_it_recorded",
    "test_a_published_row_the_answer_cannot_name_stops_the_capture_before_its_first_run",
    "test_on_a_terminal_a_progress_bar_and_no_line_per_run",
    "test_a_real_nohz_capture_ends_with_the_tick_cost_the_bundle_holds_beside_seed_004s",
}


# `make test` runs on two workers (pytest-xdist): each group below runs on one worker, one test at a time, in file
# order. Tests that change this machine itself run in MACHINE_MODULES' group: the host lock is taken without
# waiting (by every capture on the real root, dry runs included), a real capture moves every task and interrupt off
# the measured CPU and checks the mounts and affinities it found are back, and the fleet's namespaces and the tmpfs
# "full disks" are mounts. The guest lab's boots share the kernel and image cache (~/.cache/ticklab) in
# GUEST_MODULES' group. Every other module is a group of its own, so a module-scoped fixture (the report's
# notebooks) is built once, on one worker.
MACHINE_MODULES = {"test_capture.py", "test_host.py", "test_ingest.py", "test_function_tracing.py", "test_doctor.py",
                   "test_fleet.py", "test_bench_keep.py", "test_tools.py", "test_comparisons.py", "test_safefiles.py",
                   "test_stopping.py", "test_validation.py", "test_cli_errors.py", "test_kernelshark_names.py",
                   "test_capture_answer.py", "test_restore.py"}
GUEST_MODULES = {"test_lab.py", "test_lab_kexec.py", "test_lab_sources.py", "test_hostkernel.py", "test_hpet_profile.py"}
# single tests elsewhere that play a lab guest's side on this machine (ticklab.lab.guest.run_job takes the host lock)
MACHINE_TESTS = {"test_the_guest_side_makes_one_run_into_the_share",
                 "test_a_lab_run_records_the_physical_hosts_load_and_keeps_the_guests_beside_it",
                 # pins each vCPU thread to a host CPU: a real capture beside it moves this process off the measured
                 # CPU while it runs, so the lab sees one CPU and pins nothing
                 "test_a_tcg_guest_run_brings_back_a_sealed_bundle_with_guest_traces",
                 # runs ticklab doctor (it mounts tracefs and debugfs, as test_doctor.py does) from an installed wheel
                 "test_a_wheel_installed_elsewhere_runs_doctor_and_a_report_with_its_project"}
# The groups that take longest, handed out first (xdist's --no-loadscope-reorder keeps this order) so that the two
# long ones start at once on different workers and the short modules fill in around them.
LONGEST_FIRST = ["guests", "machine", "test_report.py", "test_new_claim.py", "test_compare.py", "test_tickcost.py"]


def group_of(nodeid: str) -> str:
    """The group of a test, from its node id (tests/<module>.py::<name>[<parameters>])."""
    path, _, name = nodeid.partition("::")
    module = path.rsplit("/", 1)[-1]
    if module in MACHINE_MODULES or name.split("[", 1)[0] in MACHINE_TESTS:
        return "machine"
    return "guests" if module in GUEST_MODULES else module


def pytest_xdist_make_scheduler(config, log):
    """xdist's scope scheduling with our groups as the scopes. (Its own --dist loadgroup reads xdist_group marks
    into the node id, which pytest 9 no longer lets a plugin rewrite: every test would be scheduled alone.)"""
    from xdist.scheduler import LoadScopeScheduling

    class MachineGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    return MachineGroups(config, log)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in SLOW_MODULES or getattr(item, "originalname", item.name) in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)
    rank = {group: index for index, group in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(group_of(item.nodeid), len(rank)))  # stable: file order otherwise


def assert_gaps_match_traced_ticks(bundle: Path, gapdet: dict) -> None:
    """The gap detector ran under its own trace on the mono clock (CLOCK_MONOTONIC, the clock it reads): nearly
    every traced tick lies inside a gap, and the workload loses at least the traced span (issue 26)."""
    from ticklab.capture.workloads import read_gapdet
    from ticklab.trace.ingest import read_trace
    from ticklab.trace.tickcost import matched_gap_tick_cost
    from ticklab.trace.tracemetrics import timer_interrupt_costs

    assert gapdet["status"] == "ok" and gapdet["trace"]["lost_events"] == 0, gapdet
    trace = read_trace(bundle / "raw" / gapdet["directory"] / gapdet["trace"]["directory"])
    assert trace.clock == "mono"
    header, gaps = read_gapdet(bundle / "raw" / gapdet["directory"] / "stdout.txt")
    cost = matched_gap_tick_cost(gaps, header, timer_interrupt_costs(trace, int(header["cpu"])))
    assert cost["reason"] == "" and cost["ticks"] > 0 and cost["matched"] >= 0.9 * cost["ticks"], cost
    assert cost["tick_gap_us_median"] >= cost["span_us_median"] > 0 and cost["before_entry_us_median"] >= 0, cost


def shortened_nohz_experiment(source: Path, directory: Path) -> Path:
    """A nohz FTQ experiment file cut to 1 s of FTQ and of each per-run extra, without its once-per-condition
    extras, written into ``directory`` under the same name: for tests of what surrounds a capture (transport,
    boot plans), which the full 5 s runs only make slower."""
    import yaml

    definition = yaml.safe_load(source.read_text())
    definition["workload"]["params"].update(samples=1000, warmup_samples=100)
    definition["extras"] = [extra for extra in definition["extras"] if extra.get("per_run")]
    for extra in definition["extras"]:
        extra["argv"] = [{"5000": "1000", "5s": "1s"}.get(word, word) for word in extra["argv"]]
    path = directory / source.name
    path.write_text(yaml.safe_dump(definition, sort_keys=False))
    return path
