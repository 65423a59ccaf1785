/* Small helpers shared by ticklab's measurement tools. */
#ifndef TICKLAB_COMMON_H
#define TICKLAB_COMMON_H

#include <errno.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
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

#define CURRENT_CLOCKSOURCE "/sys/devices/system/clocksource/clocksource0/current_clocksource"

#endif
