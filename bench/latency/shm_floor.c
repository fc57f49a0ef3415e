/* shm_floor: the floor of a small allreduce over shared memory on this
 * machine, to compare kolo's and Open MPI's small-message latency against
 * (docs/performance.md, "Small-message latency, run after run").
 *
 *   cc -O2 -std=c11 -Wall -Wextra -Werror -o build/shm_floor bench/latency/shm_floor.c
 *   build/shm_floor RANKS BYTES ITERS [YIELD]
 *
 * RANKS processes (forked, up to 16) share one anonymous mapping. Each
 * allreduce, every rank copies its BYTES (float32, at most 4088) into its own
 * slot and publishes the call's number in the same slot (release); it waits
 * until every slot holds that number (acquire), spinning, or calling
 * sched_yield() between looks with YIELD=1 (for more ranks than CPUs), and
 * sums the slots in rank order. Two rows of slots alternate, so a slot is
 * rewritten only after every rank has read it. Nothing else: no library, no
 * failure detection, no sleeping, no timeout. It prints the median iteration,
 * the slowest rank's, as kolo-bench and mpi_bench do, and checks every result. */
#define _GNU_SOURCE
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_RANKS  16
#define MAX_FLOATS 1022

struct slot {
	_Atomic uint32_t seq;
	uint32_t pad;
	float data[MAX_FLOATS];
} __attribute__((aligned(64)));

struct seg {
	struct slot s[2][MAX_RANKS];
	double median[MAX_RANKS];
	int wrong[MAX_RANKS];
};

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static void rank_main(struct seg *g, int n, int r, int count, int iters, int yield)
{
	float buf[MAX_FLOATS], acc[MAX_FLOATS];
	double *t = malloc(sizeof(double) * (size_t)iters);
	if (!t)
		_exit(1);
	float want = (float)(n * (n - 1) / 2);
	double prev = now_s();
	for (uint32_t k = 1; k <= (uint32_t)iters; k++) {
		for (int i = 0; i < count; i++)
			buf[i] = (float)r;
		struct slot *row = g->s[k & 1];
		memcpy(row[r].data, buf, sizeof(float) * (size_t)count);
		atomic_store_explicit(&row[r].seq, k, memory_order_release);
		for (int q = 0; q < n; q++)
			while (atomic_load_explicit(&row[q].seq, memory_order_acquire) != k)
				if (yield)
					sched_yield();
		memcpy(acc, row[0].data, sizeof(float) * (size_t)count);
		for (int q = 1; q < n; q++)
			for (int i = 0; i < count; i++)
				acc[i] += row[q].data[i];
		memcpy(buf, acc, sizeof(float) * (size_t)count);
		double t1 = now_s();
		t[k - 1] = t1 - prev;
		prev = t1;
		for (int i = 0; i < count; i++)
			g->wrong[r] += buf[i] != want;
	}
	qsort(t, (size_t)iters, sizeof(double), cmp_double);
	g->median[r] = t[iters / 2];
	free(t);
	_exit(0);
}

int main(int argc, char **argv)
{
	if (argc < 4) {
		fprintf(stderr, "usage: %s RANKS BYTES ITERS [YIELD]\n", argv[0]);
		return 2;
	}
	int n = atoi(argv[1]), bytes = atoi(argv[2]), iters = atoi(argv[3]);
	int yield = argc > 4 && atoi(argv[4]) != 0;
	int count = bytes / (int)sizeof(float);
	if (n < 1 || n > MAX_RANKS || count < 1 || count > MAX_FLOATS || iters < 1) {
		fprintf(stderr, "%s: RANKS 1..%d, BYTES 4..%zu, ITERS >= 1\n", argv[0], MAX_RANKS,
		        MAX_FLOATS * sizeof(float));
		return 2;
	}
	struct seg *g =
	        mmap(NULL, sizeof(*g), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (g == MAP_FAILED) {
		perror("mmap");
		return 1;
	}
	for (int r = 0; r < n; r++) {
		pid_t p = fork();
		if (p < 0) {
			perror("fork"); /* the ranks already started wait for ever: stop them */
			kill(0, SIGKILL);
		}
		if (p == 0)
			rank_main(g, n, r, count, iters, yield);
	}
	int failed = 0, status;
	for (int r = 0; r < n; r++)
		if (wait(&status) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
			failed = 1;
	double m = 0;
	long wrong = 0;
	for (int r = 0; r < n; r++) {
		m = g->median[r] > m ? g->median[r] : m;
		wrong += g->wrong[r];
	}
	printf("shm_floor: %d ranks, %d bytes, %d iterations%s: median %.3f us, wrong %ld\n", n,
	       count * (int)sizeof(float), iters, yield ? ", yielding" : "", m * 1e6, wrong);
	return failed || wrong ? 1 : 0;
}
