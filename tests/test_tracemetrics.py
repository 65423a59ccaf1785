"""The tick's whole cost from traces whose answer is known: ticks with and without softirqs, a softirq another
interrupt raised, a timer interrupt nested in a softirq, non-tick hrtimer and empty interrupts; and a real guest
trace."""

import struct
from pathlib import Path

import pytest

from conftest import REPO
from test_ingest import HEADER_PAGE, page, record
from ticklab.trace.ingest import read_trace
from ticklab.trace.tracemetrics import tick_rows, timer_interrupt_costs

HEADER = (
    "\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n"
    "\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;\n"
    "\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;\n"
    "\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n"
)
# (system, name, id, fields as (declaration, struct code)), as this host's tracefs describes them
EVENTS = {
    "local_timer_entry": ("irq_vectors", 165, [("int vector", "i")]),
    "local_timer_exit": ("irq_vectors", 164, [("int vector", "i")]),
    "hrtimer_expire_entry": ("timer", 459, [("void * hrtimer", "Q"), ("s64 now", "q"), ("void * function", "Q")]),
    "softirq_raise": ("irq", 221, [("unsigned int vec", "I")]),
    "softirq_entry": ("irq", 223, [("unsigned int vec", "I")]),
    "softirq_exit": ("irq", 222, [("unsigned int vec", "I")]),
}
TICK_FN, WAKEUP_FN = 0xFFFFFFFF814352E0, 0xFFFFFFFF814204B0
KALLSYMS = f"{TICK_FN:x} t tick_nohz_handler\n"
TIMER, SCHED, HRTIMER, RCU, BLOCK = 1, 7, 8, 9, 4
MS, US = 1_000_000, 1_000


def format_text(name: str) -> str:
    system, ident, fields = EVENTS[name]
    lines, offset = [], 8
    for declaration, code in fields:
        size = struct.calcsize(code)
        lines.append(f"\tfield:{declaration};\toffset:{offset};\tsize:{size};\tsigned:{int(code.islower())};\n")
        offset += size
    return f'name: {name}\nID: {ident}\nformat:\n{HEADER}{"".join(lines)}\nprint fmt: ""\n'


def payload(name: str, *values) -> bytes:
    _, ident, fields = EVENTS[name]
    return struct.pack("<HBBi" + "".join(code for _, code in fields), ident, 0, 0, 0, *values)


def write_capture(
    directory: Path,
    events: dict[int, list[tuple[int, str, tuple]]],
    kallsyms: str | None = KALLSYMS,
    softirqs: bool = True,
) -> Path:
    """A tracefs capture of ``events`` per CPU ((timestamp ns, event, field values)), one page per CPU."""
    directory.mkdir(parents=True)
    (directory / "header_page").write_text(HEADER_PAGE)
    for name, (system, _, _) in EVENTS.items():
        if softirqs or system != "irq":
            (directory / "formats" / system / name).mkdir(parents=True)
            (directory / "formats" / system / name / "format").write_text(format_text(name))
    for cpu, listed in events.items():
        listed = sorted((e for e in listed if softirqs or not e[1].startswith("softirq")), key=lambda e: e[0])
        body, last = b"", listed[0][0]
        for stamp, name, values in listed:
            body += record(stamp - last, payload(name, *values))
            last = stamp
        (directory / f"cpu{cpu}.raw").write_bytes(page(listed[0][0], body))
        (directory / f"cpu{cpu}.stats").write_text(f"entries: 0\noverrun: 0\nread events: {len(listed)}\n")
    if kallsyms is not None:
        (directory / "kallsyms").write_text(kallsyms)
    return directory


def interrupt(start: int, irq_us: int, expired=(), raised=()) -> list:
    """A local timer interrupt at ``start`` lasting ``irq_us``: the hrtimers that expired and softirqs raised in it."""
    events = [(start, "local_timer_entry", (236,)), (start + irq_us * US, "local_timer_exit", (236,))]
    events += [(start + 1 * US, "hrtimer_expire_entry", (0xFFFF888000001000, start, fn)) for fn in expired]
    events += [(start + 2 * US, "softirq_raise", (vec,)) for vec in raised]
    return events


def softirq(start: int, vec: int, us: int) -> list:
    return [(start, "softirq_entry", (vec,)), (start + us * US, "softirq_exit", (vec,))]


def known_events() -> dict[int, list]:
    """CPU 1 takes a 250 Hz tick (ticks at 1, 5, 9, 13, 17 ms, 10 µs each in the interrupt), costing in all
    19, 10, 14, 25 and 12 µs, and three other timer interrupts costing 10, 5 and 3 µs; CPU 0 has a tick of its own."""
    t = [1 * MS + k * 4 * MS for k in range(5)]
    cpu1 = [
        *interrupt(t[0], 10, [TICK_FN], [TIMER, RCU]),
        *softirq(t[0] + 11 * US, TIMER, 3),
        *softirq(t[0] + 14 * US, RCU, 6),
        *interrupt(t[1], 10, [TICK_FN]),  # a tick that raised nothing
        # a non-tick hrtimer (a sleeper's wakeup) raising HRTIMER: 8 µs + 2 µs
        *interrupt(t[1] + 2 * MS, 8, [WAKEUP_FN], [HRTIMER]),
        *softirq(t[1] + 2 * MS + 9 * US, HRTIMER, 2),
        # SCHED raised by the tick runs after a BLOCK run a disk interrupt raised, which is not the tick's
        *interrupt(t[2], 10, [TICK_FN], [SCHED]),
        *softirq(t[2] + 10 * US + 500, BLOCK, 2),
        *softirq(t[2] + 12 * US + 500, SCHED, 4),
        # RCU runs 20 µs, 5 of them in a nested non-tick interrupt (which is its own 5 µs): the tick costs 10 + 15
        *interrupt(t[3], 10, [TICK_FN], [RCU]),
        *softirq(t[3] + 11 * US, RCU, 20),
        *interrupt(t[3] + 15 * US, 5, [WAKEUP_FN]),
        *interrupt(t[3] + 3 * MS, 3),  # an interrupt that found no expired hrtimer
        # TIMER raised here runs 2 µs; a second TIMER run before the next interrupt is not the tick's
        *interrupt(t[4], 10, [TICK_FN], [TIMER]),
        *softirq(t[4] + 10 * US, TIMER, 2),
        *softirq(t[4] + 1 * MS, TIMER, 50),
    ]
    cpu0 = [*interrupt(t[0] + 100 * US, 40, [TICK_FN], [RCU]), *softirq(t[0] + 141 * US, RCU, 70)]
    return {0: cpu0, 1: cpu1}


def rows_of(directory: Path, cpu: int = 1) -> dict[str, float]:
    return {row["metric"]: row["value"] for row in tick_rows(read_trace(directory), cpu)}


def test_ticks_and_other_timer_interrupts_cost_what_was_written(tmp_path):
    trace = read_trace(write_capture(tmp_path / "trace", known_events()))
    costs = timer_interrupt_costs(trace, 1)
    assert costs["tick"].tolist() == [True, True, False, True, True, False, False, True]
    assert (costs["cost_ns"] / US).tolist() == [19, 10, 10, 14, 25, 5, 3, 12]
    assert costs["softirqs"].tolist() == ["TIMER+RCU", "", "HRTIMER", "SCHED", "RCU", "", "", "TIMER"]
    # the window the tracepoints cover: to the last attributed softirq's exit (the nested interrupt's inside RCU's)
    assert ((costs["span_end_ns"] - costs["entry_ns"]) / US).tolist() == [20, 10, 11, 16.5, 31, 5, 3, 12]
    span_us = 16_000  # first to last timer interrupt on CPU 1
    assert rows_of(tmp_path / "trace") == pytest.approx(
        {
            "tick_irqs": 5,
            "tick_rate_hz": 250.0,
            "tick_irq_us_median": 10,
            "tick_irq_us_p99": 10,
            "tick_irq_time_fraction": 50 / span_us,
            "tick_us_median": 14,
            "tick_us_p99": 19 + 0.96 * 6,
            "tick_time_fraction": 80 / span_us,
            "nontick_timer_irqs": 3,
            "nontick_timer_irq_rate_hz": 3 / 0.016,
            "nontick_timer_irq_us_median": 5,
            "nontick_timer_irq_us_p99": 5 + 0.98 * 3,
            "nontick_timer_irq_time_fraction": 16 / span_us,
            "nontick_timer_us_median": 5,
            "nontick_timer_us_p99": 5 + 0.98 * 5,
            "nontick_timer_time_fraction": 18 / span_us,
        }
    )
    [cpu0] = timer_interrupt_costs(trace, 0)[["tick", "cost_ns"]].itertuples(index=False)
    assert tuple(cpu0) == (True, 110 * US)


def test_without_softirq_events_only_the_interrupts_are_measured(tmp_path):
    rows = rows_of(write_capture(tmp_path / "trace", known_events(), softirqs=False))
    assert rows["tick_rate_hz"] == pytest.approx(250.0) and rows["tick_irq_us_median"] == 10
    assert not {"tick_us_median", "tick_us_p99", "tick_time_fraction", "nontick_timer_us_median"} & set(rows)


@pytest.mark.parametrize("kallsyms", [None, "", f"{0:016x} t tick_nohz_handler\n"])
def test_without_the_tick_callbacks_address_no_tick_is_claimed(tmp_path, kallsyms):
    """No kallsyms, none of the tick's names, or the zero address an unprivileged reader sees: nothing tells a tick."""
    directory = write_capture(tmp_path / "trace", known_events(), kallsyms=kallsyms)
    assert timer_interrupt_costs(read_trace(directory), 1) is None
    assert rows_of(directory) == {}


def test_a_guest_trace_dat_names_the_tick_from_its_own_kallsyms():
    """A bundled TCG guest run at HZ=250: trace-cmd's trace.dat carries the guest's kallsyms."""
    import json

    # the guest-ftq bundles (HZ=1000/250/nohz_full lab kernels), not the lab host's or kexec plans' bundles
    bundles = sorted(
        p
        for p in (REPO / "traces").glob("guest-tcg-2vcpu-*/nohz/*-guest-ftq")
        if any(c["name"] == "hz250" for c in json.loads((p / "manifest.json").read_text())["conditions"])
    )
    if not bundles:
        pytest.skip("no bundled guest nohz bundle with an hz250 condition")
    manifest = json.loads((bundles[0] / "manifest.json").read_text())
    run = next(r for r in manifest["runs"] if r["condition"] == "hz250" and r["status"] == "ok" and r.get("trace"))
    trace = read_trace(bundles[0] / "raw" / run["run"] / run["trace"]["directory"])
    assert set(trace.symbol_addresses(["tick_nohz_handler", "tick_sched_timer"])) == {"tick_nohz_handler"}
    rows = {row["metric"]: row["value"] for row in tick_rows(trace, 1)}
    assert abs(rows["tick_rate_hz"] - 250) / 250 < 0.1
    # softirq events were traced in this bundle: the tick's cost includes the softirqs it raised
    assert rows["tick_us_median"] >= rows["tick_irq_us_median"] > 0
