/* ftq - fixed time quantum operating-system noise benchmark (ticklab's own implementation).
 *
 * Time is cut into quanta with absolute deadlines t0 + (i+1)*quantum, so lateness never
 * accumulates.  Within each quantum the program does fixed units of work and counts them; a
 * quantum in which the kernel took the CPU away (a tick, an interrupt, another task) counts fewer
 * units.  Samples are kept in memory and written after the run, so output never perturbs it.
 *
 * Output: a self-describing header of "# key: value" lines, then one line per sample:
 *     index  end_ns  count
 * end_ns is the time at which the quantum's last unit finished, relative to t0, which the header gives
 * (t0_ns, CLOCK_MONOTONIC) so that a trace on the same clock can place every tick among the quanta.  The first
 * `warmup` samples are written too and marked in the header; analyses drop them.
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

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void usage(const char *name)
{
	fprintf(stderr,
		"usage: %s [-q quantum_ns] [-n samples] [-w warmup] [-c cpu] [-r fifo_prio] [-b work_bits] [-o file]\n"
		"  -q  quantum length in ns (default 1000000 = 1 ms)\n"
		"  -n  samples to record after warm-up (default 10000)\n"
		"  -w  warm-up samples, recorded and marked (default 100)\n"
		"  -c  CPU to pin to (default: the CPU it starts on)\n"
		"  -r  run SCHED_FIFO at this priority (default: normal policy)\n"
		"  -b  one work unit is 2^bits loop iterations (default 5)\n"
		"  -o  output file (default stdout)\n", name);
}

int main(int argc, char **argv)
{
	long quantum = 1000000, samples = 10000, warmup = 100, cpu = -1, prio = 0, bits = 5;
	const char *out_path = NULL;
	int opt;

	while ((opt = getopt(argc, argv, "q:n:w:c:r:b:o:h")) != -1) {
		switch (opt) {
		case 'q': quantum = parse_long_option("ftq", optarg, "quantum (-q)", 1000, 1000000000); break;
		case 'n': samples = parse_long_option("ftq", optarg, "samples (-n)", 1, 100000000); break;
		case 'w': warmup = parse_long_option("ftq", optarg, "warm-up (-w)", 0, 100000000); break;
		case 'c': cpu = parse_long_option("ftq", optarg, "cpu (-c)", 0, CPU_SETSIZE - 1); break;
		case 'r': prio = parse_long_option("ftq", optarg, "fifo priority (-r)", 1, 99); break;
		case 'b': bits = parse_long_option("ftq", optarg, "work bits (-b)", 0, 20); break;
		case 'o': out_path = optarg; break;
		default: usage(argv[0]); return opt == 'h' ? 0 : 2;
		}
	}
	if (pin_and_prioritise("ftq", &cpu, prio))
		return 1;
	long total = samples + warmup;
	uint64_t *ends = calloc((size_t)total, sizeof(*ends));
	uint64_t *counts = calloc((size_t)total, sizeof(*counts));
	if (!ends || !counts) {
		fprintf(stderr, "ftq: cannot allocate %ld samples\n", total);
		return 1;
	}
	if (mlockall(MCL_CURRENT | MCL_FUTURE) && prio)
		fprintf(stderr, "ftq: mlockall failed (%s); page faults may add noise\n", strerror(errno));

	const uint64_t iterations = 1ull << bits;
	volatile uint64_t sink = 0;
	uint64_t t0 = now_ns(), t = t0;
	for (long i = 0; i < total; i++) {
		uint64_t deadline = t0 + (uint64_t)(i + 1) * (uint64_t)quantum, count = 0;
		while (t < deadline) {
			for (uint64_t k = 0; k < iterations; k++)
				sink += k;
			count++;
			t = now_ns();
		}
		ends[i] = t - t0;
		counts[i] = count;
	}

	FILE *out = out_path ? fopen(out_path, "w") : stdout;
	if (!out) {
		fprintf(stderr, "ftq: cannot write %s: %s\n", out_path, strerror(errno));
		return 1;
	}
	struct utsname uts;
	char clocksource[64];
	uname(&uts);
	read_first_line(CURRENT_CLOCKSOURCE, clocksource, sizeof(clocksource));
	fprintf(out, "# ftq: 1\n# quantum_ns: %ld\n# frequency_hz: %.6f\n# samples: %ld\n# warmup: %ld\n"
		"# work_bits: %ld\n# cpu: %ld\n# policy: %s\n# priority: %ld\n# kernel: %s\n# clocksource: %s\n"
		"# clock: CLOCK_MONOTONIC\n# t0_ns: %llu\n# columns: index end_ns count\n",
		quantum, 1e9 / (double)quantum, samples, warmup, bits, cpu, prio ? "SCHED_FIFO" : "SCHED_OTHER",
		prio, uts.release, clocksource, (unsigned long long)t0);
	for (long i = 0; i < total; i++)
		fprintf(out, "%ld %llu %llu\n", i, (unsigned long long)ends[i], (unsigned long long)counts[i]);
	if (out != stdout && fclose(out)) {
		fprintf(stderr, "ftq: writing %s failed: %s\n", out_path, strerror(errno));
		return 1;
	}
	return 0;
}
