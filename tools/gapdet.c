/* gapdet - what the CPU takes away from a spinning thread, gap by gap (ticklab's own program).
 *
 * A thread pinned to one CPU (SCHED_FIFO when asked) reads CLOCK_MONOTONIC back to back for a fixed
 * time.  Two consecutive reads normally differ by the cost of one read; when the kernel or the
 * hypervisor takes the CPU (a tick, another interrupt, a VM exit), the difference is the time the
 * thread lost.  Every difference above the threshold is kept as a gap: its start (the read before it)
 * and its length.  CLOCK_MONOTONIC is the clock the tick's hrtimer runs on, so the tick's gaps come
 * back at one phase of the tick period.
 *
 * Calibration, in the header: the first `calibration` reads' differences give the cost of one read
 * (min and median); analyses subtract the median from each gap.  The fraction of the run spent in gaps
 * is the noise the thread saw; the rest is its own loop.
 *
 * Output: "# key: value" header lines, then one line per gap:
 *     start_ns  gap_ns
 * start_ns is relative to t0 (the first read), "# t0_ns:" gives t0 in CLOCK_MONOTONIC.
 * Gaps are kept in memory and written after the run, so output never perturbs it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "common.h"

#define CALIBRATION 100000

static void usage(const char *name)
{
	fprintf(stderr,
		"usage: %s [-d duration_ms] [-t threshold_ns] [-c cpu] [-r fifo_prio] [-m max_gaps] [-o file]\n"
		"  -d  how long to spin, ms (default 5000)\n"
		"  -t  a difference between two reads above this many ns is a gap (default 1000)\n"
		"  -c  CPU to pin to (default: the CPU it starts on)\n"
		"  -r  run SCHED_FIFO at this priority (default: normal policy)\n"
		"  -m  gaps kept at most; more are counted, not kept (default 1000000)\n"
		"  -o  output file (default stdout)\n", name);
}

static int compare_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
	long duration_ms = 5000, threshold = 1000, cpu = -1, prio = 0, max_gaps = 1000000;
	const char *out_path = NULL;
	int opt;

	while ((opt = getopt(argc, argv, "d:t:c:r:m:o:h")) != -1) {
		switch (opt) {
		case 'd': duration_ms = parse_long_option("gapdet", optarg, "duration (-d)", 1, 3600000); break;
		case 't': threshold = parse_long_option("gapdet", optarg, "threshold (-t)", 1, 1000000000); break;
		case 'c': cpu = parse_long_option("gapdet", optarg, "cpu (-c)", 0, CPU_SETSIZE - 1); break;
		case 'r': prio = parse_long_option("gapdet", optarg, "fifo priority (-r)", 1, 99); break;
		case 'm': max_gaps = parse_long_option("gapdet", optarg, "max gaps (-m)", 1, 100000000); break;
		case 'o': out_path = optarg; break;
		default: usage(argv[0]); return opt == 'h' ? 0 : 2;
		}
	}
	if (pin_and_prioritise("gapdet", &cpu, prio))
		return 1;
	uint64_t *starts = calloc((size_t)max_gaps, sizeof(*starts));
	uint64_t *lengths = calloc((size_t)max_gaps, sizeof(*lengths));
	uint64_t *calibration = calloc(CALIBRATION, sizeof(*calibration));
	if (!starts || !lengths || !calibration) {
		fprintf(stderr, "gapdet: cannot allocate %ld gaps\n", max_gaps);
		return 1;
	}
	if (mlockall(MCL_CURRENT | MCL_FUTURE) && prio)
		fprintf(stderr, "gapdet: mlockall failed (%s); page faults may add gaps\n", strerror(errno));

	/* calibration: the cost of one read, from consecutive reads' differences */
	uint64_t previous = monotonic_ns();
	for (long i = 0; i < CALIBRATION; i++) {
		uint64_t t = monotonic_ns();
		calibration[i] = t - previous;
		previous = t;
	}
	qsort(calibration, CALIBRATION, sizeof(*calibration), compare_u64);

	const uint64_t t0 = monotonic_ns(), end = t0 + (uint64_t)duration_ms * 1000000ull;
	uint64_t reads = 0, gaps = 0, gap_total = 0;
	previous = t0;
	while (previous < end) {
		uint64_t t = monotonic_ns(), delta = t - previous;
		reads++;
		if (delta > (uint64_t)threshold) {
			if (gaps < (uint64_t)max_gaps) {
				starts[gaps] = previous - t0;
				lengths[gaps] = delta;
			}
			gaps++;
			gap_total += delta;
		}
		previous = t;
	}
	const uint64_t elapsed = previous - t0;

	FILE *out = out_path ? fopen(out_path, "w") : stdout;
	if (!out) {
		fprintf(stderr, "gapdet: cannot write %s: %s\n", out_path, strerror(errno));
		return 1;
	}
	struct utsname uts;
	char clocksource[64];
	uname(&uts);
	read_first_line(CURRENT_CLOCKSOURCE, clocksource, sizeof(clocksource));
	uint64_t kept = gaps < (uint64_t)max_gaps ? gaps : (uint64_t)max_gaps;
	fprintf(out, "# gapdet: 1\n# threshold_ns: %ld\n# duration_ns: %llu\n# t0_ns: %llu\n# reads: %llu\n"
		"# read_ns_min: %llu\n# read_ns_median: %llu\n# calibration_reads: %d\n# gaps: %llu\n# gaps_kept: %llu\n"
		"# gap_ns_total: %llu\n# cpu: %ld\n# policy: %s\n# priority: %ld\n# kernel: %s\n# clocksource: %s\n"
		"# clock: CLOCK_MONOTONIC\n# columns: start_ns gap_ns\n",
		threshold, (unsigned long long)elapsed, (unsigned long long)t0, (unsigned long long)reads,
		(unsigned long long)calibration[0], (unsigned long long)calibration[CALIBRATION / 2], CALIBRATION,
		(unsigned long long)gaps, (unsigned long long)kept, (unsigned long long)gap_total, cpu,
		prio ? "SCHED_FIFO" : "SCHED_OTHER", prio, uts.release, clocksource);
	for (uint64_t i = 0; i < kept; i++)
		fprintf(out, "%llu %llu\n", (unsigned long long)starts[i], (unsigned long long)lengths[i]);
	if (out != stdout && fclose(out)) {
		fprintf(stderr, "gapdet: writing %s failed: %s\n", out_path, strerror(errno));
		return 1;
	}
	return 0;
}
