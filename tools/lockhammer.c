/*
 * lockhammer: many threads on one kernel spinlock, until SIGTERM or SIGINT.
 *
 *   lockhammer <threads>
 *
 * The lock-bound load pvspinlock's lab analogue runs beside its synthetic build (python3 -m ticklab.lab.kbuild
 * --hammer): every thread calls FUTEX_WAIT_PRIVATE on one futex word with a value the word never holds. The kernel
 * takes the word's futex hash bucket lock (a spinlock: futex_q_lock), reads the word, sees the mismatch, drops the
 * lock and returns EAGAIN, so all the threads queue on that one spinlock, and in an overcommitted guest a vCPU
 * preempted while holding it leaves the others waiting, halting (pv_wait) and queueing behind a halted head: the case
 * kick-ahead acts on. On exit it prints "# lockhammer: 1", the threads and the futex calls made.
 */
#define _GNU_SOURCE
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common.h"

static atomic_int stop;
static int word;
static atomic_ullong calls;

static void on_signal(int sig)
{
	(void)sig;
	atomic_store(&stop, 1);
}

static void *hammer(void *arg)
{
	unsigned long long made = 0;

	(void)arg;
	while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
		/* word is 0, the call waits only while it is 1: the bucket lock is taken and dropped each time */
		syscall(SYS_futex, &word, FUTEX_WAIT_PRIVATE, 1, NULL, NULL, 0);
		made++;
	}
	atomic_fetch_add(&calls, made);
	return NULL;
}

int main(int argc, char **argv)
{
	char *end;
	long threads = argc == 2 ? strtol(argv[1], &end, 10) : 0;
	pthread_t *ids;
	struct sigaction action = {.sa_handler = on_signal};
	sigset_t set;
	int sig;

	if (argc != 2 || *end || threads < 1 || threads > 4096) {
		fprintf(stderr, "usage: lockhammer <threads 1-4096> (runs until SIGTERM or SIGINT)\n");
		return 2;
	}
	/* the threads never take the signals: main waits for them with sigwait, then stops the threads */
	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	pthread_sigmask(SIG_BLOCK, &set, NULL);
	sigaction(SIGTERM, &action, NULL);
	ids = calloc((size_t)threads, sizeof(*ids));
	if (!ids)
		return 1;
	for (long i = 0; i < threads; i++) {
		if (pthread_create(&ids[i], NULL, hammer, NULL)) {
			fprintf(stderr, "lockhammer: cannot start thread %ld: %s\n", i, strerror(errno));
			return 1;
		}
	}
	printf("# lockhammer: started %ld threads\n", threads);
	fflush(stdout);
	sigwait(&set, &sig);
	on_signal(sig);
	for (long i = 0; i < threads; i++)
		pthread_join(ids[i], NULL);
	printf("# lockhammer: 1\n# threads: %ld\n# futex_calls: %llu\n", threads, (unsigned long long)atomic_load(&calls));
	free(ids);
	return 0;
}
