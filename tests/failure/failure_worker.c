/* A worker of the failure tests: a loop of allreduces, as a training job
 * would run, that exits as soon as the job fails. Public API only.
 *
 *   failure_worker COUNT STEPS [async] [url] [quiet] [elastic]
 *
 * Each step allreduces COUNT float32 (rank r contributes r + 1 + step % 7, so
 * the sum is size * (size + 1) / 2 + size * (step % 7), exact in float32) and
 * checks the first and last element; STEPS 0 loops until a failure (at most
 * 10 minutes). async: through the fusion engine (kolo_allreduce_async +
 * kolo_wait) instead of the blocking call. url: also print "URL <KOLO_RENDEZVOUS>"
 * after READY. quiet: print STEP for the first three steps only and ignore
 * SIGPIPE, as a training program that does not print (or a Python one) would:
 * such a worker is not killed by writing to the pipes of a dead kolorun.
 * elastic (with KOLO_ELASTIC=1): a failed step re-forms the comm
 * (kolo_reform), prints "ROUND <round> size <n> rank <r>", agrees with the
 * others on the step to go on from (an allreduce MAX) and goes on.
 *
 * Prints "READY rank R size N pid P" after kolo_init(), "STEP s" after every
 * step, then either "FAILED <status> <message>" and "FINALIZED <ms>" (the time
 * kolo_finalize() took) and exits 3, or, after STEPS steps, "FINALIZED <ms>"
 * and exits 0. A wrong result prints "WRONG ..." and exits 2.
 *
 * FAILURE_WORKER_LINGER=RANK:MS makes that rank sleep MS ms before its
 * kolo_finalize() on a clean finish (the others must wait for it there), and
 * FAILURE_WORKER_ABORT=RANK:MS makes that rank sleep MS ms, call kolo_abort()
 * (a program giving up after an error of its own), print "ABORTED" and go on
 * to kolo_finalize() and exit 4. FAILURE_WORKER_TRIGGER=PATH: once a rank
 * sees that file exist (carried in one more allreduced element, so that all
 * ranks agree on the step), every later step also runs an alltoall, which
 * connects every pair of ranks, not only ring neighbours; the first one that
 * completes prints "TRIGGERED <step>". */
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kolo/async.h"
#include "kolo/elastic.h"
#include "kolo/kolo.h"

static uint64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void sleep_ms(int ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
	while (nanosleep(&ts, &ts) != 0) {
	}
}

static int finish(kolo_comm_t *comm, int code)
{
	uint64_t t0 = now_ms();
	kolo_finalize(comm);
	printf("FINALIZED %llu\n", (unsigned long long)(now_ms() - t0));
	return code;
}

struct loop {
	size_t count;
	bool async;
	const char *trigger;
	bool triggered, announced;
	float *x; /* count + 1: the last element carries the trigger */
	int32_t *a2a;
	int a2a_size; /* the size a2a has room for */
};

/* One step; *wrong is set (and a line printed) when a result is wrong. */
static kolo_status_t step(kolo_comm_t *comm, struct loop *l, long long s, bool *wrong)
{
	int rank = kolo_rank(comm), size = kolo_size(comm);
	size_t n = l->count + 1;
	float mine = (float)(rank + 1 + s % 7);
	for (size_t j = 0; j < l->count; j++)
		l->x[j] = mine;
	l->x[l->count] = l->trigger && access(l->trigger, F_OK) == 0 ? 1.0f : 0.0f;
	kolo_status_t st;
	if (l->async) {
		kolo_handle_t *h = NULL;
		st = kolo_allreduce_async(comm, "x", l->x, l->x, n, KOLO_FLOAT32, KOLO_SUM, 1.0,
		                          1.0, NULL, NULL, &h);
		if (st == KOLO_OK)
			st = kolo_wait(h);
	} else {
		st = kolo_allreduce(comm, l->x, l->x, n, KOLO_FLOAT32, KOLO_SUM);
	}
	if (st != KOLO_OK)
		return st;
	float want = (float)(size * (size + 1) / 2 + size * (s % 7));
	if (l->x[0] != want || l->x[l->count - 1] != want) {
		printf("WRONG step %lld: %g %g, want %g\n", s, (double)l->x[0],
		       (double)l->x[l->count - 1], (double)want);
		*wrong = true;
		return KOLO_OK;
	}
	l->triggered = l->triggered || l->x[l->count] > 0;
	if (!l->triggered)
		return KOLO_OK;
	if (size > l->a2a_size) {
		int32_t *b = realloc(l->a2a, 2 * (size_t)size * sizeof(*b));
		if (!b)
			return KOLO_ENOMEM;
		l->a2a = b;
		l->a2a_size = size;
	}
	int32_t *send = l->a2a, *recv = l->a2a + size;
	for (int j = 0; j < size; j++)
		send[j] = (int32_t)(rank * 1000 + j);
	if ((st = kolo_alltoall(comm, send, recv, 1, KOLO_INT32)) != KOLO_OK)
		return st;
	for (int i = 0; i < size; i++) {
		if (recv[i] != i * 1000 + rank) {
			printf("WRONG step %lld: alltoall got %d from rank %d, want %d\n", s,
			       (int)recv[i], i, i * 1000 + rank);
			*wrong = true;
			return KOLO_OK;
		}
	}
	if (!l->announced)
		printf("TRIGGERED %lld\n", s);
	l->announced = true;
	return KOLO_OK;
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr,
		        "usage: failure_worker COUNT STEPS [async] [url] [quiet] [elastic]\n");
		return 64;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	struct loop l = {.count = (size_t)strtoull(argv[1], NULL, 10),
	                 .trigger = getenv("FAILURE_WORKER_TRIGGER")};
	long long steps = strtoll(argv[2], NULL, 10);
	bool url = false, quiet = false, elastic = false;
	for (int i = 3; i < argc; i++) {
		l.async |= strcmp(argv[i], "async") == 0;
		url |= strcmp(argv[i], "url") == 0;
		quiet |= strcmp(argv[i], "quiet") == 0;
		elastic |= strcmp(argv[i], "elastic") == 0;
	}
	if (l.trigger && !l.trigger[0])
		l.trigger = NULL;
	if (quiet)
		signal(SIGPIPE, SIG_IGN);
	if (l.count < 1)
		l.count = 1;
	kolo_comm_t *comm = NULL;
	kolo_status_t st = kolo_init(&comm);
	if (st != KOLO_OK) {
		printf("FAILED %s kolo_init: %s\n", kolo_status_name(st), kolo_init_error());
		return 3;
	}
	printf("READY rank %d size %d pid %d\n", kolo_rank(comm), kolo_size(comm), (int)getpid());
	if (url && getenv("KOLO_RENDEZVOUS"))
		printf("URL %s\n", getenv("KOLO_RENDEZVOUS"));
	l.x = malloc((l.count + 1) * sizeof(*l.x));
	if (!l.x)
		return 1;
	uint64_t end = now_ms() + 600000;
	for (long long s = 0; (steps == 0 || s < steps) && now_ms() < end;) {
		bool wrong = false;
		st = step(comm, &l, s, &wrong);
		if (st != KOLO_OK && elastic && kolo_elastic_enabled(comm)) {
			if ((st = kolo_reform(comm)) == KOLO_OK) {
				printf("ROUND %lld size %d rank %d\n", (long long)kolo_round(comm),
				       kolo_size(comm), kolo_rank(comm));
				int64_t v[2] = {s, l.triggered};
				st = kolo_allreduce(comm, v, v, 2, KOLO_INT64, KOLO_MAX);
				s = v[0];
				l.triggered = v[1] != 0;
			}
			if (st == KOLO_OK)
				continue;
		}
		if (st != KOLO_OK) {
			printf("FAILED %s %s\n", kolo_status_name(st), kolo_last_error(comm));
			free(l.x);
			free(l.a2a);
			return finish(comm, 3);
		}
		if (wrong) {
			free(l.x);
			free(l.a2a);
			finish(comm, 2);
			return 2;
		}
		if (!quiet || s < 3)
			printf("STEP %lld\n", s);
		s++;
	}
	free(l.x);
	free(l.a2a);
	int who = -1, ms = 0;
	const char *linger = getenv("FAILURE_WORKER_LINGER");
	if (linger && sscanf(linger, "%d:%d", &who, &ms) == 2 && who == kolo_rank(comm))
		sleep_ms(ms);
	const char *abort_at = getenv("FAILURE_WORKER_ABORT");
	if (abort_at && sscanf(abort_at, "%d:%d", &who, &ms) == 2 && who == kolo_rank(comm)) {
		sleep_ms(ms);
		kolo_abort(comm);
		printf("ABORTED\n");
		return finish(comm, 4);
	}
	return finish(comm, 0);
}
