/* ring_probe: times allreduce with the latency-optimal algorithm and with the
 * pipelined ring, in one process (one thread per rank, TCP over 127.0.0.1),
 * to choose KOLO_SMALL_ALLREDUCE_BYTES. Not a test; see docs/collectives.md.
 *
 *   ring_probe [ranks] [max_bytes] [iters]
 *
 * Prints one line per size: bytes, median microseconds of each algorithm,
 * and the ring's bus bandwidth. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ring.h"
#include "world.h"

static size_t max_bytes = 4u << 20;
static int iters = 200;

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

/* Median of `iters` allreduces of `bytes` float32 bytes with threshold `small`. */
static double time_one(struct world *w, int rank, struct kolo_ring_comm *rc, float *buf,
                       size_t bytes, size_t small, uint64_t *samples)
{
	kolo_ring_comm_tune(rc, small, 0);
	int n = bytes >= (1u << 20) ? iters / 10 + 3 : iters;
	for (int i = 0; i < 5; i++)
		kolo_ring_allreduce(rc, buf, buf, bytes / 4, KOLO_FLOAT32, KOLO_SUM, 1, 1);
	for (int i = 0; i < n; i++) {
		kolo_ring_barrier(rc);
		uint64_t t0 = kolo_now_ns();
		kolo_status_t st =
		        kolo_ring_allreduce(rc, buf, buf, bytes / 4, KOLO_FLOAT32, KOLO_SUM, 1, 1);
		samples[i] = kolo_now_ns() - t0;
		if (st != KOLO_OK)
			world_fail(w, "rank %d: %s", rank, kolo_ring_last_error(rc));
	}
	qsort(samples, (size_t)n, sizeof(*samples), cmp_u64);
	return (double)samples[n / 2] / 1000.0;
}

static void body(struct world *w, int rank, struct kolo_ring_comm *rc)
{
	if (!rc)
		return;
	float *buf = calloc(max_bytes / 4 + 1, sizeof(float));
	uint64_t *samples = calloc((size_t)iters, sizeof(uint64_t));
	if (rank == 0)
		printf("%10s %12s %12s %12s\n", "bytes", "small_us", "ring_us", "ring_busbw");
	for (size_t bytes = 8; bytes <= max_bytes; bytes *= 2) {
		double small = time_one(w, rank, rc, buf, bytes, SIZE_MAX, samples);
		double ring = time_one(w, rank, rc, buf, bytes, 0, samples);
		if (rank == 0)
			printf("%10zu %12.1f %12.1f %10.3f GB/s\n", bytes, small, ring,
			       (double)bytes / ring / 1e3 * 2.0 * (w->n - 1) / w->n);
		fflush(stdout);
	}
	free(buf);
	free(samples);
}

int main(int argc, char **argv)
{
	int n = argc > 1 ? atoi(argv[1]) : 4;
	if (argc > 2)
		max_bytes = strtoull(argv[2], NULL, 0);
	if (argc > 3)
		iters = atoi(argv[3]);
	if (n < 2 || n > WORLD_MAX || iters < 1)
		return 2;
	struct kolo_ring_config cfg = {
	        .segment_bytes = (size_t)kolo_param_int(KOLO_P_SEGMENT_BYTES),
	        .timeout_ms = 30000,
	        .spin_us = (int)kolo_param_int(KOLO_P_SPIN_US),
	};
	struct world w;
	world_init(&w, n, &cfg);
	int failures = world_run(&w, body, NULL);
	if (failures)
		fprintf(stderr, "%d failures: %s\n", failures, w.first_failure);
	return failures ? 1 : 0;
}
