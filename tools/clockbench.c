/* clockbench - N threads reading a clock for T seconds (ticklab's own implementation).
 *
 * Each thread, pinned to CPU (thread mod online CPUs), reads the clock back to back until told to
 * stop.  The cost of one read is the difference between consecutive readings of the same clock,
 * kept in a per-thread histogram of 1 ns buckets (the last bucket collects everything slower).
 * With -c hpet the HPET main counter is read directly through an mmap of /dev/hpet; its costs are
 * in counter ticks converted with the period the HPET reports, so their resolution is one tick.
 *
 * Output: "# key: value" header lines, then one row per thread:
 *     thread cpu reads elapsed_ns reads_per_s cost_mean_ns cost_p50_ns cost_p90_ns cost_p99_ns cost_max_ns
 * and, with -H FILE, the histogram summed over threads ("cost_ns count", non-empty buckets only).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "common.h"

#define BUCKETS 200000 /* 200 us in 1 ns steps; slower reads land in the last bucket */

struct worker {
	pthread_t thread;
	int index, cpu;
	uint64_t reads, elapsed_ns, max_ns;
	double sum_ns;
	uint32_t *histogram;
};

static clockid_t clock_id = CLOCK_MONOTONIC;
static volatile const uint64_t *hpet_counter;
static double hpet_period_ns;
static atomic_int stop_flag;
static pthread_barrier_t start_line;

static inline uint64_t read_clock(void)
{
	if (hpet_counter)
		return *hpet_counter;
	struct timespec ts;
	clock_gettime(clock_id, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline uint64_t to_ns(uint64_t ticks)
{
	return hpet_counter ? (uint64_t)((double)ticks * hpet_period_ns + 0.5) : ticks;
}

static void *run(void *arg)
{
	struct worker *w = arg;
	pin_to_cpu("clockbench", w->index, w->cpu);
	pthread_barrier_wait(&start_line);
	uint64_t begin = monotonic_ns(), previous = read_clock(), reads = 0, max = 0;
	double sum = 0;
	while (!atomic_load_explicit(&stop_flag, memory_order_relaxed)) {
		uint64_t current = read_clock();
		uint64_t cost = to_ns(current - previous);
		previous = current;
		w->histogram[cost < BUCKETS ? cost : BUCKETS - 1]++;
		sum += (double)cost;
		if (cost > max)
			max = cost;
		reads++;
	}
	w->elapsed_ns = monotonic_ns() - begin;
	w->reads = reads;
	w->sum_ns = sum;
	w->max_ns = max;
	return NULL;
}

static uint64_t percentile(const uint32_t *histogram, uint64_t total, double q)
{
	uint64_t target = (uint64_t)(q * (double)total), seen = 0;
	for (uint64_t ns = 0; ns < BUCKETS; ns++) {
		seen += histogram[ns];
		if (seen > target)
			return ns;
	}
	return BUCKETS - 1;
}

static int open_hpet(void)
{
	int fd = open("/dev/hpet", O_RDONLY);
	if (fd < 0) {
		fprintf(stderr, "clockbench: /dev/hpet: %s (needs CONFIG_HPET and an HPET)\n", strerror(errno));
		return -1;
	}
	void *map = mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, 0);
	close(fd);
	if (map == MAP_FAILED) {
		fprintf(stderr, "clockbench: mmap /dev/hpet: %s (needs CONFIG_HPET_MMAP)\n", strerror(errno));
		return -1;
	}
	const volatile uint64_t *registers = map;
	hpet_period_ns = (double)(registers[0] >> 32) / 1e6; /* capabilities: period in femtoseconds */
	hpet_counter = (const volatile uint64_t *)((const volatile char *)map + 0xf0);
	return 0;
}

static void usage(const char *name)
{
	fprintf(stderr, "usage: %s [-t threads] [-s seconds] [-c monotonic|realtime|monotonic_raw|boottime|hpet] [-H histogram_file]\n",
		name);
}

int main(int argc, char **argv)
{
	int threads = 1, opt;
	double seconds = 1.0;
	const char *clock_name = "monotonic", *histogram_path = NULL;
	char *end;

	while ((opt = getopt(argc, argv, "t:s:c:H:h")) != -1) {
		switch (opt) {
		case 't':
			threads = (int)strtol(optarg, &end, 10);
			if (*end || threads < 1 || threads > 4096) {
				fprintf(stderr, "clockbench: threads (-t) must be 1..4096, got '%s'\n", optarg);
				return 2;
			}
			break;
		case 's':
			seconds = strtod(optarg, &end);
			if (*end || seconds <= 0 || seconds > 3600) {
				fprintf(stderr, "clockbench: seconds (-s) must be in (0, 3600], got '%s'\n", optarg);
				return 2;
			}
			break;
		case 'c': clock_name = optarg; break;
		case 'H': histogram_path = optarg; break;
		default: usage(argv[0]); return opt == 'h' ? 0 : 2;
		}
	}
	if (!strcmp(clock_name, "monotonic")) clock_id = CLOCK_MONOTONIC;
	else if (!strcmp(clock_name, "realtime")) clock_id = CLOCK_REALTIME;
	else if (!strcmp(clock_name, "monotonic_raw")) clock_id = CLOCK_MONOTONIC_RAW;
	else if (!strcmp(clock_name, "boottime")) clock_id = CLOCK_BOOTTIME;
	else if (!strcmp(clock_name, "hpet")) { if (open_hpet()) return 1; }
	else {
		fprintf(stderr, "clockbench: unknown clock '%s'\n", clock_name);
		usage(argv[0]);
		return 2;
	}

	long online = sysconf(_SC_NPROCESSORS_ONLN);
	struct worker *workers = calloc((size_t)threads, sizeof(*workers));
	if (!workers)
		return 1;
	pthread_barrier_init(&start_line, NULL, (unsigned)threads + 1);
	for (int i = 0; i < threads; i++) {
		workers[i].index = i;
		workers[i].cpu = (int)(i % online);
		workers[i].histogram = calloc(BUCKETS, sizeof(uint32_t));
		if (!workers[i].histogram || pthread_create(&workers[i].thread, NULL, run, &workers[i])) {
			fprintf(stderr, "clockbench: cannot start thread %d\n", i);
			return 1;
		}
	}
	pthread_barrier_wait(&start_line);
	struct timespec nap = { .tv_sec = (time_t)seconds, .tv_nsec = (long)((seconds - (double)(time_t)seconds) * 1e9) };
	while (nanosleep(&nap, &nap) && errno == EINTR)
		;
	atomic_store(&stop_flag, 1);
	for (int i = 0; i < threads; i++)
		pthread_join(workers[i].thread, NULL);

	struct utsname uts;
	char clocksource[64];
	uname(&uts);
	read_first_line(CURRENT_CLOCKSOURCE, clocksource, sizeof(clocksource));
	printf("# clockbench: 1\n# clock: %s\n# clocksource: %s\n# kernel: %s\n# threads: %d\n# online_cpus: %ld\n"
	       "# seconds: %.3f\n# resolution_ns: %.3f\n",
	       clock_name, clocksource, uts.release, threads, online, seconds, hpet_counter ? hpet_period_ns : 1.0);
	printf("thread cpu reads elapsed_ns reads_per_s cost_mean_ns cost_p50_ns cost_p90_ns cost_p99_ns cost_max_ns\n");
	for (int i = 0; i < threads; i++) {
		struct worker *w = &workers[i];
		printf("%d %d %llu %llu %.1f %.2f %llu %llu %llu %llu\n", w->index, w->cpu, (unsigned long long)w->reads,
		       (unsigned long long)w->elapsed_ns, (double)w->reads * 1e9 / (double)w->elapsed_ns,
		       w->reads ? w->sum_ns / (double)w->reads : 0.0,
		       (unsigned long long)percentile(w->histogram, w->reads, 0.5),
		       (unsigned long long)percentile(w->histogram, w->reads, 0.9),
		       (unsigned long long)percentile(w->histogram, w->reads, 0.99), (unsigned long long)w->max_ns);
	}
	if (histogram_path) {
		FILE *h = fopen(histogram_path, "w");
		if (!h) {
			fprintf(stderr, "clockbench: cannot write %s: %s\n", histogram_path, strerror(errno));
			return 1;
		}
		fprintf(h, "cost_ns count\n");
		for (uint64_t ns = 0; ns < BUCKETS; ns++) {
			uint64_t count = 0;
			for (int i = 0; i < threads; i++)
				count += workers[i].histogram[ns];
			if (count)
				fprintf(h, "%llu %llu\n", (unsigned long long)ns, (unsigned long long)count);
		}
		fclose(h);
	}
	return 0;
}
