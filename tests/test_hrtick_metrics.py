"""Seed 002's quantities from a synthetic guest trace whose answer is known: counted clockevent reprograms
(one made by an expiring timer's interrupt with no hrtimer_start, one by a cancel, starts that reprogram
nothing) and spurious hrtimer interrupts (a local timer interrupt during which no hrtimer expired)."""

import struct

import pandas as pd
import pytest

from ticklab import paths, tracemetrics
from ticklab.claims import hrtick
from ticklab.ingest import read_trace
from ticklab.tracemetrics import TraceContentError, clockevent_reprograms, reprogram_rows, spurious_ratio

# Ring-buffer layout (as tests/test_ingest.py builds it; not imported from there, whose import probes trace-cmd)
HEADER_PAGE = ("\tfield: u64 timestamp;\toffset:0;\tsize:8;\tsigned:0;\n"
               "\tfield: local_t commit;\toffset:8;\tsize:8;\tsigned:1;\n"
               "\tfield: int overwrite;\toffset:8;\tsize:1;\tsigned:1;\n"
               "\tfield: char data;\toffset:16;\tsize:4080;\tsigned:0;\n")


def record(delta: int, data: bytes) -> bytes:
    return struct.pack("<I", (delta << 5) | (len(data) // 4)) + data  # type_len: data length in words (≤ 112 bytes)


def page(timestamp: int, body: bytes) -> bytes:
    head = struct.pack("<QQ", timestamp, len(body)) + body
    return head + b"\0" * (4096 - len(head))

COMMON = ("\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n"
          "\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;\n"
          "\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;\n"
          "\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n")
# The kernel's formats of the events the guest experiment records (fields trimmed to those used here).
EVENTS = {
    "irq_vectors:local_timer_entry": (165, "\tfield:int vector;\toffset:8;\tsize:4;\tsigned:1;\n", "<i"),
    "irq_vectors:local_timer_exit": (164, "\tfield:int vector;\toffset:8;\tsize:4;\tsigned:1;\n", "<i"),
    "timer:hrtimer_expire_entry": (459, "\tfield:void * hrtimer;\toffset:8;\tsize:8;\tsigned:0;\n"
                                        "\tfield:s64 now;\toffset:16;\tsize:8;\tsigned:1;\n"
                                        "\tfield:void * function;\toffset:24;\tsize:8;\tsigned:0;\n", "<QqQ"),
    "timer:hrtimer_start": (460, "\tfield:void * hrtimer;\toffset:8;\tsize:8;\tsigned:0;\n"
                                 "\tfield:void * function;\toffset:16;\tsize:8;\tsigned:0;\n"
                                 "\tfield:s64 expires;\toffset:24;\tsize:8;\tsigned:1;\n", "<QQq"),
    "ftrace:function": (1, "\tfield:unsigned long ip;\toffset:8;\tsize:8;\tsigned:0;\n"
                           "\tfield:unsigned long parent_ip;\toffset:16;\tsize:8;\tsigned:0;\n", "<QQ"),
    # Linux 7.1+ (include/trace/events/timer.h: hrtimer_rearm) and irq:softirq_raise
    "timer:hrtimer_rearm": (470, "\tfield:s64 next_event;\toffset:8;\tsize:8;\tsigned:1;\n"
                                 "\tfield:bool deferred;\toffset:16;\tsize:1;\tsigned:0;\n", "<qB7x"),
    "irq:softirq_raise": (140, "\tfield:unsigned int vec;\toffset:8;\tsize:4;\tsigned:0;\n", "<I4x"),
}
PROGRAM_EVENT = 0xFFFFFFFF81123450  # the one function the tracer was filtered to
START, ENTRY, EXIT, EXPIRE, CALL = ("timer:hrtimer_start", "irq_vectors:local_timer_entry", "irq_vectors:local_timer_exit",
                                    "timer:hrtimer_expire_entry", "ftrace:function")
T0 = 5_000_000_000


def write_trace(directory, events: dict[int, list[tuple]], ip_of=lambda at: PROGRAM_EVENT):
    """A ticklab tracefs capture: per CPU, (µs after T0, event[, its fields]) in time order."""
    (directory / "header_page").parent.mkdir(parents=True, exist_ok=True)
    (directory / "header_page").write_text(HEADER_PAGE)
    keys = {event[1] for timeline in events.values() for event in timeline}
    for key in sorted(keys):
        type_id, fields, _ = EVENTS[key]
        system, name = key.split(":")
        (directory / "formats" / system / name).mkdir(parents=True)
        (directory / "formats" / system / name / "format").write_text(
            f"name: {name}\nID: {type_id}\nformat:\n{COMMON}{fields}\nprint fmt: \"\"\n")
    values = {ENTRY: (236,), EXIT: (236,), EXPIRE: (0xFFFF8880_0000_1000, 0, 0xFFFFFFFF81000100),
              START: (0xFFFF8880_0000_1000, 0xFFFFFFFF81000100, 0)}
    for cpu, timeline in events.items():
        body, last = b"", T0
        for at_us, key, *given in timeline:
            stamp = T0 + at_us * 1000
            type_id, _, layout = EVENTS[key]
            fields = tuple(given) or ((ip_of(at_us), 0xFFFFFFFF81000200) if key == CALL else values[key])
            body += record(stamp - last, struct.pack("<HBBi", type_id, 0, 0, 1) + struct.pack(layout, *fields))
            last = stamp
        (directory / f"cpu{cpu}.raw").write_bytes(page(T0, body))
        (directory / f"cpu{cpu}.stats").write_text("entries: 0\noverrun: 0\n")
    return directory


# CPU 0: two starts that reprogram nothing, a start that does; an expiring interrupt that reprograms without any
# start; an interrupt that finds nothing expired and reprograms; a cancel of the first timer that reprograms.
# CPU 1: two starts and an interrupt whose expiry reprograms nothing (the device is left idle).
KNOWN = {
    0: [(1_000, START), (2_000, START), (3_000, START), (3_001, CALL),
        (10_000, ENTRY), (10_001, EXPIRE), (10_002, CALL), (10_003, EXIT),
        (20_000, ENTRY), (20_001, CALL), (20_002, EXIT),
        (30_000, CALL)],
    1: [(5_000, START), (6_000, START), (15_000, ENTRY), (15_001, EXPIRE), (15_002, EXIT)],
}


def test_reprograms_are_counted_not_inferred_from_starts(tmp_path):
    trace = read_trace(write_trace(tmp_path / "trace", KNOWN))
    calls = clockevent_reprograms(trace)
    assert calls["cpu"].tolist() == [0, 0, 0, 0]
    rows = {row["metric"]: row["value"] for row in tracemetrics.hrtimer_metrics(trace, {})}
    span_s = (30_000 - 1_000) / 1e6
    assert rows["clockevent_reprograms"] == 4
    assert rows["clockevent_reprograms_per_s"] == pytest.approx(4 / span_s)
    assert rows["hrtimer_start_rate_hz"] == pytest.approx(5 / span_s)
    assert rows["clockevent_reprograms_in_timer_irq_share"] == pytest.approx(2 / 4)
    assert rows["local_timer_irq_rate_hz"] == pytest.approx(3 / span_s)
    # an hrtimer interrupt that found no expired timer: 1 of 3
    assert rows["spurious_hrtimer_interrupt_ratio"] == pytest.approx(1 / 3) == spurious_ratio(trace)


def test_a_trace_without_the_function_tracer_has_no_reprogram_count(tmp_path):
    without = {cpu: [(at, key) for at, key in timeline if key != CALL] for cpu, timeline in KNOWN.items()}
    trace = read_trace(write_trace(tmp_path / "trace", without))
    assert clockevent_reprograms(trace) is None and reprogram_rows(trace, 1.0) == []
    metrics = {row["metric"] for row in tracemetrics.hrtimer_metrics(trace, {})}
    assert "clockevent_reprograms_per_s" not in metrics and "hrtimer_start_rate_hz" in metrics


def test_calls_of_two_functions_are_refused_not_counted(tmp_path):
    trace = read_trace(write_trace(tmp_path / "trace", KNOWN, ip_of=lambda at: PROGRAM_EVENT + (at == 30_000)))
    with pytest.raises(TraceContentError, match="2 different functions.*clockevents_program_event alone"):
        clockevent_reprograms(trace)


def test_the_fresh_table_puts_counted_reprograms_beside_the_seed():
    runs = pd.DataFrame([
        {"host_id": "guest", "run": f"r{i}", "condition": condition, "metric": metric, "value": value}
        for i, (condition, reprograms) in enumerate([("hrtick-off", 1000.0), ("hrtick-off", 1200.0),
                                                     ("hrtick-on", 1400.0), ("hrtick-on", 1600.0)])
        for metric, value in (("runtime_s", 2.0), ("clockevent_reprograms_per_s", reprograms))])
    table = hrtick.fresh_table(runs, hrtick.CLAIM.published(paths.published_dir()))
    column = hrtick.FRESH_METRICS["clockevent_reprograms_per_s"]
    assert table.loc[("guest", "hrtick-off"), column] == 1100.0
    assert table.loc[("guest", "hrtick-on"), column] == 1500.0
    assert table.loc[("guest", "hrtick-on"), "seed 002 reprograms/s (HRTICK on)"] == "~2500/sec before the series, ~100/sec after"
    assert table.loc[("guest", "hrtick-off"), "seed 002 reprograms/s (HRTICK on)"] == "not stated for HRTICK off"


def test_a_bundle_without_counted_reprograms_says_so():
    runs = pd.DataFrame([{"host_id": "old", "run": "r1", "condition": "hrtick-on", "metric": metric, "value": 1.0}
                         for metric in ("runtime_s", "hrtimer_start_rate_hz")])
    table = hrtick.fresh_table(runs)
    assert table.loc[("old", "hrtick-on"), hrtick.FRESH_METRICS["clockevent_reprograms_per_s"]] == "not recorded in this bundle"
    assert hrtick.reprogram_notes(runs) == [
        "old: clockevent reprograms not recorded in this bundle (its trace has no function-tracer events of "
        "clockevents_program_event); hrtimer starts are shown, which are not a reprogram count."]
    hrtick.fresh_figure(runs, "old")  # draws hrtimer starts, labelled as such, instead of failing


REARM, RAISE = "timer:hrtimer_rearm", "irq:softirq_raise"
NOW, LATER = 0, 1   # hrtimer_rearm's deferred: at once, or at the return to user space
# A 7.2-style trace (the series applied). CPU 0: a start that rearms at once (rearm and call share a timestamp); a
# lazy start that reprograms nothing; an expiring interrupt rearmed on the way out (deferred); an interrupt that
# found nothing expired (spurious); one that found only a soft timer due (raised HRTIMER_SOFTIRQ: not spurious);
# one that raised the TIMER softirq only (still found no hrtimer: spurious); two reprograms by the tick's nohz code
# (no rearm before them). CPU 1: a rearm whose reprogram was lost (the next rearm comes first), a rearm with its
# call, an expiring interrupt.
KNOWN_72 = {
    0: [(1_000, START), (1_000, REARM, 2_000_000, NOW), (1_000, CALL),
        (2_000, START),
        (10_000, ENTRY), (10_001, EXPIRE), (10_003, EXIT), (10_010, REARM, 12_000_000, LATER), (10_010, CALL),
        (20_000, ENTRY), (20_002, EXIT), (20_005, REARM, 22_000_000, LATER), (20_006, CALL),
        (25_000, ENTRY), (25_001, RAISE, 8), (25_002, EXIT), (25_003, REARM, 27_000_000, NOW), (25_004, CALL),
        (26_000, ENTRY), (26_001, RAISE, 1), (26_002, EXIT),
        (30_000, CALL), (31_000, CALL)],
    1: [(5_000, REARM, 9_000_000, NOW), (6_000, REARM, 8_000_000, NOW), (6_001, CALL),
        (15_000, ENTRY), (15_001, EXPIRE), (15_002, EXIT)],
}


def test_a_72_trace_counts_rearms_and_says_whether_they_agree_with_the_reprograms(tmp_path):
    trace = read_trace(write_trace(tmp_path / "trace", KNOWN_72))
    rows = {row["metric"]: row["value"] for row in tracemetrics.hrtimer_metrics(trace, {})}
    span_s = (31_000 - 1_000) / 1e6
    assert rows["hrtimer_rearms"] == 6
    assert rows["hrtimer_rearms_per_s"] == pytest.approx(6 / span_s)
    assert rows["hrtimer_rearms_deferred_share"] == pytest.approx(2 / 6)
    assert rows["clockevent_reprograms"] == 7
    assert rows["clockevent_reprograms_per_s"] == pytest.approx(7 / span_s)
    # every rearm but CPU 1's first was followed by its reprogram; 5 of the 7 reprograms were rearms
    assert rows["hrtimer_rearms_reprogrammed_share"] == pytest.approx(5 / 6)
    assert rows["clockevent_reprograms_by_rearm_share"] == pytest.approx(5 / 7)
    # 5 interrupts; spurious: CPU 0 at 20 ms (nothing) and at 26 ms (a TIMER raise is not an hrtimer found)
    assert rows["spurious_hrtimer_interrupts"] == 2
    assert rows["spurious_hrtimer_interrupt_ratio"] == pytest.approx(2 / 5) == spurious_ratio(trace)
    assert spurious_ratio(trace, 1) == 0


def test_without_softirq_raises_an_interrupt_that_found_only_a_soft_timer_counts_as_spurious(tmp_path):
    without = {cpu: [event for event in timeline if event[1] != RAISE] for cpu, timeline in KNOWN_72.items()}
    trace = read_trace(write_trace(tmp_path / "trace", without))
    assert spurious_ratio(trace) == pytest.approx(3 / 5)


def test_a_trace_before_the_series_has_no_rearm_rows(tmp_path):
    trace = read_trace(write_trace(tmp_path / "trace", KNOWN))
    assert tracemetrics.hrtimer_rearms(trace) is None and tracemetrics.rearm_rows(trace, 1.0) == []
    assert not any(row["metric"].startswith("hrtimer_rearms") for row in tracemetrics.hrtimer_metrics(trace, {}))


def test_rearms_without_the_function_tracer_are_counted_without_an_agreement(tmp_path):
    without = {cpu: [event for event in timeline if event[1] != CALL] for cpu, timeline in KNOWN_72.items()}
    rows = {row["metric"]: row["value"]
            for row in tracemetrics.hrtimer_metrics(read_trace(write_trace(tmp_path / "trace", without)), {})}
    assert rows["hrtimer_rearms"] == 6 and "clockevent_reprograms" not in rows
    assert "hrtimer_rearms_reprogrammed_share" not in rows
