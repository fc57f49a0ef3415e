/* A worker of the elastic tests: a loop of allreduces with a commit after
 * each step, run by kolo_elastic_run. Public API only.
 *
 *   elastic_worker STEPS COUNT STEP_MS [async]
 *
 * async: the allreduces go through the fusion engine (kolo_allreduce_async,
 * two named halves per step); a failure must then reach kolo_wait as
 * KOLO_EMEMBERSHIP.
 *
 * Step s: rank r contributes x[j] = (s+1) + j + (r - (size-1)/2), so the
 * average over ranks is (s+1) + j whatever the size; the sum is checked
 * exactly against size * ((s+1) + j) (float64, small integers and halves:
 * exact), and acc[j] accumulates the average. acc is part of the state, so
 * after any sequence of failures, restores and joins it must end at
 * STEPS*(STEPS+1)/2 + STEPS*j exactly: each step applied exactly once.
 *
 * Prints "ROUND <round> size <n> rank <r>" at every (re)start of the training
 * function, "STEP <s>" after each commit, and at the end "RESULT ok ..." (or
 * "LEFT" when it left the job on SIGTERM; "LEFT before a rank: ..." when the
 * SIGTERM came while it waited for its first round). Exit 0 on success, 2 on a wrong
 * result, 3 when the elastic loop failed.
 *
 * ELASTIC_WORKER_HANG=RANK:STEP:MS makes the worker of that rank in round 1
 * print "HANG" before step STEP and then not call kolo for MS ms (a training
 * thread stuck in user code), then go on.
 *
 * ELASTIC_WORKER_SOAK=1 (the soak test, tests/soak): acc is also checked
 * against the closed form after every commit, for the step reached (it holds
 * at any step, not only the last), so "STEP <s>" means both the allreduce and
 * the accumulator were checked; and a worker that leaves checks acc before
 * printing "LEFT". It prints "START" once its own SIGTERM handler (a
 * kolo_elastic_leave) is in place, before kolo_init. The soak runs with a
 * STEPS it never reaches and ends every worker with SIGTERM. ELASTIC_WORKER_CORRUPT=STEP adds 1 to
 * acc[0] once, at the first step >= STEP (the soak's check that a wrong result is caught).
 *
 * ELASTIC_WORKER_DEVICE=1 (blocking mode only): the allreduce runs on a CUDA
 * device buffer (libcudart.so.13 opened with dlopen: a GPU, or the fake of
 * tests/gpu/fake), each rank on GPU (its first local rank) modulo the GPUs
 * visible. With ELASTIC_WORKER_DEVICE_NCCL=1 the worker also checks, with the
 * fake's copy counters, that every allreduce of a round whose ranks share
 * one host ran in NCCL (none of the payload copied to the host): that the
 * communicator a re-form aborted was formed again. */
#include <dlfcn.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kolo/async.h"
#include "kolo/elastic.h"
#include "kolo/kolo.h"

struct ctx {
	int64_t steps;
	size_t count;
	int step_ms;
	bool async;
	bool soak;
	bool device;        /* ELASTIC_WORKER_DEVICE */
	int64_t corrupt_at; /* ELASTIC_WORKER_CORRUPT, or -1 */
	int64_t step;       /* state */
	double *acc;        /* state */
	double *x;
};

/* ---- ELASTIC_WORKER_DEVICE ---------------------------------------------- */

static struct {
	int (*malloc_)(void **, size_t);
	int (*memcpy_)(void *, const void *, size_t, int);
	int (*set_device)(int);
	int (*device_count)(int *);
	void (*stats)(uint64_t bytes[4], uint64_t ops[4]); /* the fake's; may be NULL */
	void *buf;
	bool check_nccl;
} dev;

static bool dev_load(void)
{
	void *h = dlopen("libcudart.so.13", RTLD_NOW | RTLD_LOCAL);
	if (!h)
		return false;
	void *p[5] = {dlsym(h, "cudaMalloc"), dlsym(h, "cudaMemcpy"), dlsym(h, "cudaSetDevice"),
	              dlsym(h, "cudaGetDeviceCount"), dlsym(h, "kolo_fake_cuda_stats")};
	if (!p[0] || !p[1] || !p[2] || !p[3])
		return false;
	memcpy(&dev.malloc_, &p[0], sizeof(p[0]));
	memcpy(&dev.memcpy_, &p[1], sizeof(p[1]));
	memcpy(&dev.set_device, &p[2], sizeof(p[2]));
	memcpy(&dev.device_count, &p[3], sizeof(p[3]));
	memcpy(&dev.stats, &p[4], sizeof(p[4]));
	const char *nc = getenv("ELASTIC_WORKER_DEVICE_NCCL");
	dev.check_nccl = nc && strcmp(nc, "1") == 0 && dev.stats;
	return true;
}

static uint64_t dev_d2h(void)
{
	uint64_t b[4] = {0};
	if (dev.stats)
		dev.stats(b, NULL);
	return b[2]; /* cudaMemcpyDeviceToHost */
}

/* x = allreduce(x) through a device buffer. */
static kolo_status_t dev_allreduce(kolo_comm_t *comm, double *x, size_t count)
{
	if (!dev.buf) {
		int n = 0;
		if (dev.device_count(&n) != 0 || n < 1 ||
		    dev.set_device(kolo_local_rank(comm) % n) != 0 ||
		    dev.malloc_(&dev.buf, count * sizeof(double)) != 0) {
			printf("WRONG: no CUDA device buffer\n");
			fflush(stdout);
			exit(2);
		}
	}
	dev.memcpy_(dev.buf, x, count * sizeof(double), 1 /* host to device */);
	uint64_t before = dev_d2h();
	kolo_status_t st = kolo_allreduce(comm, dev.buf, dev.buf, count, KOLO_FLOAT64, KOLO_SUM);
	uint64_t moved = dev_d2h() - before;
	if (st != KOLO_OK)
		return st;
	if (dev.check_nccl && kolo_size(comm) > 1 && kolo_local_size(comm) == kolo_size(comm) &&
	    moved != 0) {
		printf("WRONG: round %" PRId64 " staged %llu bytes through the host, not NCCL\n",
		       kolo_round(comm), (unsigned long long)moved);
		fflush(stdout);
		exit(2);
	}
	dev.memcpy_(x, dev.buf, count * sizeof(double), 2 /* device to host */);
	return KOLO_OK;
}

static void sleep_ms(int ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
	while (nanosleep(&ts, &ts) != 0) {
	}
}

/* acc after n steps is n(n+1)/2 + n*j: prints the first mismatch and returns
 * false. */
static bool acc_ok(const struct ctx *c)
{
	double n = (double)c->step;
	for (size_t j = 0; j < c->count; j++) {
		double want = n * (n + 1) / 2 + n * (double)j;
		if (c->acc[j] != want) {
			printf("WRONG acc[%zu] = %.17g, want %.17g at step %" PRId64 "\n", j,
			       c->acc[j], want, c->step);
			fflush(stdout);
			return false;
		}
	}
	return true;
}

static kolo_status_t train(kolo_comm_t *comm, kolo_state_t *state, void *arg)
{
	struct ctx *c = arg;
	printf("ROUND %" PRId64 " size %d rank %d step %" PRId64 "\n", kolo_round(comm),
	       kolo_size(comm), kolo_rank(comm), c->step);
	fflush(stdout);
	const char *hang = getenv("ELASTIC_WORKER_HANG");
	int hang_rank = -1, hang_ms = 0;
	long long hang_step = -1;
	if (hang && sscanf(hang, "%d:%lld:%d", &hang_rank, &hang_step, &hang_ms) != 3)
		hang_rank = -1;
	while (c->step < c->steps) {
		int size = kolo_size(comm), rank = kolo_rank(comm);
		if (rank == hang_rank && c->step == hang_step && kolo_round(comm) == 1) {
			printf("HANG\n");
			fflush(stdout);
			sleep_ms(hang_ms);
			hang_rank = -1;
		}
		double base = (double)(c->step + 1), off = rank - (size - 1) / 2.0;
		for (size_t j = 0; j < c->count; j++)
			c->x[j] = base + (double)j + off;
		kolo_status_t st;
		if (c->async) {
			size_t half = c->count / 2;
			kolo_handle_t *h[2] = {NULL, NULL};
			st = kolo_allreduce_async(comm, "a", c->x, c->x, half, KOLO_FLOAT64,
			                          KOLO_SUM, 1.0, 1.0, NULL, NULL, &h[0]);
			if (st == KOLO_OK)
				st = kolo_allreduce_async(comm, "b", c->x + half, c->x + half,
				                          c->count - half, KOLO_FLOAT64, KOLO_SUM,
				                          1.0, 1.0, NULL, NULL, &h[1]);
			for (int i = 0; i < 2; i++) {
				kolo_status_t w = h[i] ? kolo_wait(h[i]) : KOLO_OK;
				if (st == KOLO_OK)
					st = w;
			}
			if (st != KOLO_OK && st != KOLO_EMEMBERSHIP) {
				printf("OPFAIL %s\n", kolo_status_name(st));
				fflush(stdout);
			}
		} else if (c->device) {
			st = dev_allreduce(comm, c->x, c->count);
		} else {
			st = kolo_allreduce(comm, c->x, c->x, c->count, KOLO_FLOAT64, KOLO_SUM);
		}
		if (st != KOLO_OK)
			return st;
		for (size_t j = 0; j < c->count; j++) {
			double want = size * (base + (double)j);
			if (c->x[j] != want) {
				printf("WRONG step %" PRId64
				       " j %zu got %.17g want %.17g size %d\n",
				       c->step, j, c->x[j], want, size);
				fflush(stdout);
				exit(2);
			}
			c->acc[j] += c->x[j] / size;
		}
		c->step++;
		if ((st = kolo_state_commit(state)) != KOLO_OK)
			return st;
		if (c->corrupt_at >= 0 && c->step >= c->corrupt_at) {
			c->acc[0] += 1;
			c->corrupt_at = -1;
		}
		if (c->soak && !acc_ok(c))
			exit(2);
		printf("STEP %" PRId64 "\n", c->step);
		fflush(stdout);
		if (c->step_ms > 0)
			sleep_ms(c->step_ms);
	}
	return KOLO_OK;
}

static void on_term(int sig)
{
	(void)sig;
	kolo_elastic_leave();
}

int main(int argc, char **argv)
{
	if (argc != 4 && !(argc == 5 && strcmp(argv[4], "async") == 0)) {
		fprintf(stderr, "usage: elastic_worker STEPS COUNT STEP_MS [async]\n");
		return 64;
	}
	struct ctx c = {
	        .steps = atoll(argv[1]),
	        .count = (size_t)atoll(argv[2]),
	        .step_ms = atoi(argv[3]),
	        .async = argc == 5,
	};
	const char *soak = getenv("ELASTIC_WORKER_SOAK");
	c.soak = soak && strcmp(soak, "1") == 0;
	if (c.soak) {
		/* The soak's SIGTERM may come before kolo_init installs kolo's
		 * handler: this one asks for the same leave, and "START" tells the
		 * soak that from now on a SIGTERM is a leave, not a death. */
		struct sigaction sa = {.sa_handler = on_term};
		sigemptyset(&sa.sa_mask);
		sigaction(SIGTERM, &sa, NULL);
		printf("START\n");
		fflush(stdout);
	}
	const char *corrupt = getenv("ELASTIC_WORKER_CORRUPT");
	c.corrupt_at = corrupt ? atoll(corrupt) : -1;
	const char *device = getenv("ELASTIC_WORKER_DEVICE");
	if (device && strcmp(device, "1") == 0) {
		if (c.async || !dev_load()) {
			fprintf(stderr,
			        "ELASTIC_WORKER_DEVICE=1: blocking mode and libcudart.so.13 "
			        "needed\n");
			return 64;
		}
		c.device = true;
	}
	c.acc = calloc(c.count, sizeof(double));
	c.x = calloc(c.count, sizeof(double));
	if (!c.acc || !c.x)
		return 1;
	kolo_comm_t *comm = NULL;
	kolo_status_t st = kolo_init(&comm);
	if (st == KOLO_ESHUTDOWN) { /* the job finished, or SIGTERM came, before a rank */
		printf("%s: %s\n", kolo_elastic_leaving() ? "LEFT before a rank" : "elastic_worker",
		       kolo_init_error());
		free(c.acc);
		free(c.x);
		return 0;
	}
	if (st != KOLO_OK) {
		fprintf(stderr, "kolo_init: %s: %s\n", kolo_strerror(st), kolo_init_error());
		return 3;
	}
	kolo_state_t *state = NULL;
	if (kolo_state_create(comm, &state) != KOLO_OK ||
	    kolo_state_register(state, "step", &c.step, 1, KOLO_INT64) != KOLO_OK ||
	    kolo_state_register(state, "acc", c.acc, c.count, KOLO_FLOAT64) != KOLO_OK) {
		fprintf(stderr, "state: %s\n", kolo_last_error(comm));
		return 3;
	}
	st = kolo_elastic_run(comm, state, train, &c);
	int rc = 0;
	if (st == KOLO_ESHUTDOWN && kolo_state_left(state)) {
		if (c.soak && !acc_ok(&c))
			rc = 2;
		else if (kolo_elastic_evicted(comm))
			rc = KOLO_EXIT_EVICTED;
		else
			printf("LEFT step %" PRId64 "\n", c.step);
	} else if (st != KOLO_OK) {
		fprintf(stderr, "kolo_elastic_run: %s: %s\n", kolo_strerror(st),
		        kolo_last_error(comm));
		printf("FAILED %s: %s\n", kolo_status_name(st), kolo_last_error(comm));
		rc = 3;
	} else {
		double n = (double)c.steps;
		for (size_t j = 0; j < c.count; j++) {
			double want = n * (n + 1) / 2 + n * (double)j;
			if (c.acc[j] != want) {
				printf("WRONG acc[%zu] = %.17g, want %.17g\n", j, c.acc[j], want);
				rc = 2;
				break;
			}
		}
		if (rc == 0)
			printf("RESULT ok size %d rank %d round %" PRId64 " resets %d\n",
			       kolo_size(comm), kolo_rank(comm), kolo_round(comm),
			       kolo_elastic_resets(comm));
	}
	fflush(stdout);
	kolo_state_destroy(state);
	kolo_finalize(comm);
	free(c.acc);
	free(c.x);
	return rc;
}
