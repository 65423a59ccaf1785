/* Small helpers shared by ticklab's measurement tools. */
#ifndef TICKLAB_COMMON_H
#define TICKLAB_COMMON_H

#include <errno.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The first line of a (sysfs) file without its newline, or "unknown". */
static inline void read_first_line(const char *path, char *buf, size_t size)
{
	FILE *f = fopen(path, "r");
	snprintf(buf, size, "unknown");
	if (!f)
		return;
	if (fgets(buf, (int)size, f))
		buf[strcspn(buf, "\n")] = 0;
	fclose(f);
}

/* CLOCK_MONOTONIC in nanoseconds. */
static inline uint64_t monotonic_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Pin the calling thread to one CPU; a warning (not an error) when that is refused. */
static inline void pin_to_cpu(const char *tool, int index, int cpu)
{
	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	if (sched_setaffinity(0, sizeof(set), &set))
		fprintf(stderr, "%s: thread %d cannot pin to CPU %d: %s\n", tool, index, cpu, strerror(errno));
}

/* An option's integer value in [low, high]; anything else is a usage error (exit 2) naming the option. */
static inline long parse_long_option(const char *tool, const char *text, const char *what, long low, long high)
{
	char *end;
	long value;

	errno = 0;
	value = strtol(text, &end, 10);
	if (errno || *end || value < low || value > high) {
		fprintf(stderr, "%s: %s must be an integer in [%ld, %ld], got '%s'\n", tool, what, low, high, text);
		exit(2);
	}
	return value;
}

/* Pin the process to ``*cpu`` (the CPU it runs on when negative, written back) and, when ``prio`` is not 0, run
 * it SCHED_FIFO at that priority: the measured loop of ftq and gapdet. 0, or 1 after saying what was refused. */
static inline int pin_and_prioritise(const char *tool, long *cpu, long prio)
{
	if (*cpu < 0)
		*cpu = sched_getcpu();
	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET(*cpu, &set);
	if (sched_setaffinity(0, sizeof(set), &set)) {
		fprintf(stderr, "%s: cannot pin to CPU %ld: %s\n", tool, *cpu, strerror(errno));
		return 1;
	}
	if (prio) {
		struct sched_param param = { .sched_priority = (int)prio };
		if (sched_setscheduler(0, SCHED_FIFO, &param)) {
			fprintf(stderr, "%s: cannot use SCHED_FIFO %ld: %s\n", tool, prio, strerror(errno));
			return 1;
		}
	}
	return 0;
}

#define CURRENT_CLOCKSOURCE "/sys/devices/system/clocksource/clocksource0/current_clocksource"

#endif
