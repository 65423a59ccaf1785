/* timejobs - throughput of jobs that mix computation with clock reads (ticklab's own program).
 *
 * A stand-in for AIM7's "compute" mix, which the HPET series (seed 000) measured in jobs/min: it is
 * not AIM7. Each of N threads, pinned to CPU (thread mod online CPUs), repeats a job for T seconds:
 * L rounds of integer arithmetic (a fixed 64-bit LCG walk), each followed by one clock_gettime(
 * CLOCK_MONOTONIC), the way compute-heavy programs time their work. With a slow, shared clocksource
 * the clock reads dominate and contend; with a fast one the arithmetic does.
 *
 * Output: "# key: value" header lines, then one row per thread: thread cpu jobs elapsed_ns
 * and a final "# jobs_per_min: X" line (all threads).
 */
#define _GNU_SOURCE
#include <getopt.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "common.h"

struct worker {
	pthread_t thread;
	int index, cpu;
	uint64_t jobs, elapsed_ns, checksum;
};

static int rounds = 100, work_per_round = 200;
static atomic_int stop_flag;
static pthread_barrier_t start_line;

static void *run(void *arg)
{
	struct worker *w = arg;
	pin_to_cpu("timejobs", w->index, w->cpu);
	uint64_t x = 0x9e3779b97f4a7c15ull + (uint64_t)w->index, stamp = 0;
	pthread_barrier_wait(&start_line);
	uint64_t start = monotonic_ns();
	while (!atomic_load_explicit(&stop_flag, memory_order_relaxed)) {
		for (int r = 0; r < rounds; r++) {
			for (int i = 0; i < work_per_round; i++)
				x = x * 6364136223846793005ull + 1442695040888963407ull;
			stamp ^= monotonic_ns();
		}
		w->jobs++;
	}
	w->elapsed_ns = monotonic_ns() - start;
	w->checksum = x ^ stamp;
	return NULL;
}

static void usage(const char *argv0)
{
	fprintf(stderr, "usage: %s [-t threads] [-s seconds] [-r rounds per job] [-w work per round]\n", argv0);
	exit(2);
}

int main(int argc, char **argv)
{
	int threads = 1, opt;
	double seconds = 1.0;
	while ((opt = getopt(argc, argv, "t:s:r:w:")) != -1) {
		switch (opt) {
		case 't': threads = atoi(optarg); break;
		case 's': seconds = atof(optarg); break;
		case 'r': rounds = atoi(optarg); break;
		case 'w': work_per_round = atoi(optarg); break;
		default: usage(argv[0]);
		}
	}
	if (threads < 1 || seconds <= 0 || rounds < 1 || work_per_round < 0)
		usage(argv[0]);
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	struct worker *workers = calloc((size_t)threads, sizeof(*workers));
	if (!workers)
		return 1;
	pthread_barrier_init(&start_line, NULL, (unsigned)threads + 1);
	for (int i = 0; i < threads; i++) {
		workers[i].index = i;
		workers[i].cpu = (int)(i % cpus);
		if (pthread_create(&workers[i].thread, NULL, run, &workers[i]) != 0) {
			perror("pthread_create");
			return 1;
		}
	}
	pthread_barrier_wait(&start_line);
	struct timespec pause = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
	nanosleep(&pause, NULL);
	atomic_store(&stop_flag, 1);
	char clocksource[64];
	read_first_line(CURRENT_CLOCKSOURCE, clocksource, sizeof(clocksource));
	printf("# timejobs: 1\n# threads: %d\n# seconds: %g\n# rounds_per_job: %d\n# work_per_round: %d\n"
	       "# clocksource: %s\nthread cpu jobs elapsed_ns\n", threads, seconds, rounds, work_per_round, clocksource);
	double per_min = 0;
	uint64_t checksum = 0;
	for (int i = 0; i < threads; i++) {
		pthread_join(workers[i].thread, NULL);
		printf("%d %d %llu %llu\n", i, workers[i].cpu, (unsigned long long)workers[i].jobs,
		       (unsigned long long)workers[i].elapsed_ns);
		per_min += (double)workers[i].jobs * 60e9 / (double)workers[i].elapsed_ns;
		checksum ^= workers[i].checksum;
	}
	printf("# jobs_per_min: %.1f\n# checksum: %llx\n", per_min, (unsigned long long)checksum);
	free(workers);
	return 0;
}
