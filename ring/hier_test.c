/* Hierarchical allreduce and the cost model: the model's choices on known
 * cases, and in-process worlds (one thread per rank, TCP on 127.0.0.1) where
 * the hierarchical result must equal the float64 reference and be bitwise
 * identical on every rank, sub-comms must not disturb the flat comm on the
 * same transport, and a failure in a sub-comm must fail every rank fast. */
#include <check.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ring.h"
#include "testutil.h"
#include "transport_tcp.h"

/* ---- the cost model --------------------------------------------------- */

static const struct kolo_ring_link_cost shm = {3, 4}, net = {50, 0.125};

START_TEST(test_model_large_prefers_hier)
{
	/* 2 hosts x 2 ranks on 1 Gbit/s links: the flat ring sends 1.5 S over
	 * each link, the hierarchy S. */
	size_t S = 64u << 20;
	double flat = kolo_ring_cost_model(KOLO_RING_ALGO_RING, S, 2, 2, 1, &shm, &net);
	double hier = kolo_ring_cost_model(KOLO_RING_ALGO_HIER, S, 2, 2, 1, &shm, &net);
	ck_assert_double_lt(hier, flat);
	/* Bandwidth terms: 1.5 S / 125 MB/s vs S / 125 MB/s + shm. */
	ck_assert_double_eq_tol(flat / 1e6, 1.5 * S / 125e6, 0.01);
	ck_assert_double_eq_tol(hier / 1e6, S / 125e6 + S / 4e9, 0.01);
}
END_TEST

START_TEST(test_model_small_prefers_rd)
{
	double rd = kolo_ring_cost_model(KOLO_RING_ALGO_SMALL, 8, 1, 4, 1, &shm, &net);
	double ring = kolo_ring_cost_model(KOLO_RING_ALGO_RING, 8, 1, 4, 1, &shm, &net);
	ck_assert_double_eq_tol(rd, 2 * 50, 1.0);   /* lg 4 rounds of α */
	ck_assert_double_eq_tol(ring, 6 * 50, 1.0); /* 2(n-1) steps of α */
	ck_assert_double_lt(rd, ring);
	/* Fast network, slow shared memory: the hierarchy does not pay. */
	struct kolo_ring_link_cost slow_shm = {3, 0.5}, fast_net = {5, 10};
	ck_assert_double_gt(
	        kolo_ring_cost_model(KOLO_RING_ALGO_HIER, 64u << 20, 2, 2, 1, &slow_shm, &fast_net),
	        kolo_ring_cost_model(KOLO_RING_ALGO_RING, 64u << 20, 2, 2, 1, &slow_shm,
	                             &fast_net));
}
END_TEST

START_TEST(test_model_pipelined)
{
	/* 2 hosts x 2 ranks at 1 Gbit/s, 64 MiB in the default 32 chunks of 2
	 * MiB: per chunk, a = one local stage of 1 MiB blocks (1 step), b =
	 * the cross ring of a 1 MiB block over 2 hosts (2 steps of 1 MiB: the
	 * two local ranks' rings share the link). The network is the slower:
	 * RS(0), 32 cross allreduces back to back, AG(31). */
	size_t S = 64u << 20, K = kolo_ring_hier_chunks(S, 0);
	ck_assert_uint_eq(K, 32);
	double x = (double)S / K / 2, a = 3 + x / 4e3, b = 2 * (50 + x / 125);
	double piped = kolo_ring_cost_model(KOLO_RING_ALGO_HIER, S, 2, 2, K, &shm, &net);
	double seq = kolo_ring_cost_model(KOLO_RING_ALGO_HIER, S, 2, 2, 1, &shm, &net);
	double flat = kolo_ring_cost_model(KOLO_RING_ALGO_RING, S, 2, 2, K, &shm, &net);
	ck_assert_double_eq_tol(piped, 2 * a + 32 * b, 1.0);
	ck_assert_double_lt(piped, seq);
	ck_assert_double_lt(seq, flat);
	/* Within 1% of the link's bound, S / B, against 1.5 S / B flat. */
	ck_assert_double_lt(piped, 1.01 * S / 125);
	/* Two chunks: RS(0), AR(0) with RS(1), AR(1) with AG(0), AG(1). */
	K = 2;
	x = (double)S / K / 2, a = 3 + x / 4e3, b = 2 * (50 + x / 125);
	ck_assert_double_eq_tol(kolo_ring_cost_model(KOLO_RING_ALGO_HIER, S, 2, 2, K, &shm, &net),
	                        2 * a + 2 * b, 1.0);
	/* Shared memory the slower: the local comm (2a per chunk) sets the
	 * pace. */
	struct kolo_ring_link_cost slow_shm = {3, 0.05};
	K = 32;
	x = (double)S / K / 2, a = 3 + x / 50, b = 2 * (50 + x / 125);
	ck_assert_double_gt(2 * a, b);
	ck_assert_double_eq_tol(
	        kolo_ring_cost_model(KOLO_RING_ALGO_HIER, S, 2, 2, K, &slow_shm, &net),
	        2 * a + 2 * KOLO_MAX(a, b) + 30 * 2 * a, 1.0);
}
END_TEST

/* The algorithm auto takes (as ring_hier_choose: least predicted time, the
 * hierarchy in its default chunking) at every size from 1 to 256 MiB. */
static enum kolo_ring_algo model_pick(size_t S, const struct kolo_ring_link_cost *s,
                                      const struct kolo_ring_link_cost *n)
{
	size_t K = kolo_ring_hier_chunks(S, 0);
	double hier = kolo_ring_cost_model(KOLO_RING_ALGO_HIER, S, 2, 2, K, s, n);
	if (K > 1)
		hier = fmin(hier, kolo_ring_cost_model(KOLO_RING_ALGO_HIER, S, 2, 2, 1, s, n));
	return hier < kolo_ring_cost_model(KOLO_RING_ALGO_RING, S, 2, 2, 1, s, n)
	               ? KOLO_RING_ALGO_HIER
	               : KOLO_RING_ALGO_RING;
}

START_TEST(test_model_picks_by_size)
{
	/* A slow network: the hierarchy at every size (measured faster at
	 * every size, docs/performance.md). */
	for (size_t S = 1u << 20; S <= (256u << 20); S *= 2)
		ck_assert_int_eq(model_pick(S, &shm, &net), KOLO_RING_ALGO_HIER);
	/* A network faster than shared memory: flat at every size. */
	struct kolo_ring_link_cost slow_shm = {3, 0.5}, fast_net = {5, 10};
	for (size_t S = 1u << 20; S <= (256u << 20); S *= 2)
		ck_assert_int_eq(model_pick(S, &slow_shm, &fast_net), KOLO_RING_ALGO_RING);
	/* The costs the probe measured on a loaded 2-core machine (shm 160 us
	 * 0.2 GB/s, net 108 us 0.124 GB/s): the stages one after another lose
	 * to the flat ring at 64 MiB, the pipeline wins (measured: flat 851
	 * ms, sequential 687 ms, pipelined 565 ms). */
	struct kolo_ring_link_cost p_shm = {160, 0.2}, p_net = {108, 0.124};
	size_t S = 64u << 20;
	double flat = kolo_ring_cost_model(KOLO_RING_ALGO_RING, S, 2, 2, 1, &p_shm, &p_net);
	ck_assert_double_gt(kolo_ring_cost_model(KOLO_RING_ALGO_HIER, S, 2, 2, 1, &p_shm, &p_net),
	                    flat);
	ck_assert_double_lt(kolo_ring_cost_model(KOLO_RING_ALGO_HIER, S, 2, 2,
	                                         kolo_ring_hier_chunks(S, 0), &p_shm, &p_net),
	                    flat);
}
END_TEST

/* ---- in-process worlds ------------------------------------------------ */

#define NMAX 8
static const uint8_t token[] = "hier-test";

struct world {
	int n, L, H;
	int Z; /* > 0: a zone level of Z zones on the cross comm (H / Z hosts each) */
	enum kolo_ring_hier_mode zone_mode;
	double zone_gbps; /* the link between zones (auto mode; the one inside is `net`) */
	enum kolo_ring_hier_mode mode;
	struct kolo_transport *t[NMAX];
	struct kolo_transport_handle h[NMAX];
	pthread_barrier_t bar;
	int failures;
	pthread_mutex_t lock;
	uint64_t hash[NMAX];
	int kill_rank; /* ≥ 0: that rank leaves after enabling; the others must fail */
	kolo_status_t st[NMAX];
	enum kolo_ring_algo algo_small, algo_big;
	enum kolo_ring_algo zone_algo_big;
	size_t chunks_big;
};

static kolo_status_t lookup(void *ctx, int rank, struct kolo_transport_handle *out, int timeout_ms)
{
	struct world *w = ctx;
	(void)timeout_ms;
	if (rank < 0 || rank >= w->n)
		return KOLO_ENOTFOUND;
	*out = w->h[rank];
	return KOLO_OK;
}

static void wfail(struct world *w, const char *msg, int rank)
{
	pthread_mutex_lock(&w->lock);
	if (w->failures++ < 5)
		fprintf(stderr, "rank %d: %s\n", rank, msg);
	pthread_mutex_unlock(&w->lock);
}

static uint64_t fnv(const void *p, size_t n)
{
	uint64_t h = 1469598103934665603ull;
	for (size_t i = 0; i < n; i++)
		h = (h ^ ((const uint8_t *)p)[i]) * 1099511628211ull;
	return h;
}

static float val(int r, size_t i)
{
	return (float)((long)((r * 13 + (long)i * 7) % 23) - 11) * 0.3125f + 0.01f * (float)r;
}

struct targ {
	struct world *w;
	int rank;
};

static void *rank_main(void *p)
{
	struct targ *a = p;
	struct world *w = a->w;
	const int r = a->rank, n = w->n;
	struct kolo_ring_config cfg = {
	        .transport = w->t[r],
	        .rank = r,
	        .size = n,
	        .lookup = lookup,
	        .lookup_ctx = w,
	        .small_allreduce_bytes = 4096,
	        .segment_bytes = 65536,
	        .timeout_ms = 10000,
	        .spin_us = 10,
	};
	struct kolo_ring_comm *rc = NULL;
	struct kolo_errbuf eb = {{0}};
	kolo_status_t st = kolo_ring_comm_create(&cfg, &rc, &eb);
	struct kolo_ring_hier_config hc = {
	        .mode = w->mode,
	        .local_size = w->L,
	        .cross_size = w->H,
	        .shm = shm,
	        .net = net,
	        .probe = w->mode == KOLO_RING_HIER_AUTO,
	        .small_model = false,
	};
	if (st == KOLO_OK)
		st = kolo_ring_hier_enable(rc, &hc, &eb);
	struct kolo_ring_comm *cross = st == KOLO_OK ? kolo_ring_hier_sub(rc, true) : NULL;
	if (cross && w->Z > 0) { /* hosts in zones: a level under the cross comm */
		struct kolo_ring_hier_config zc = {
		        .mode = w->zone_mode,
		        .local_size = w->H / w->Z,
		        .cross_size = w->Z,
		        .shm = net,
		        .net = {net.alpha_us, w->zone_gbps > 0 ? w->zone_gbps : net.gbytes_per_s},
		        .shared_link = true,
		};
		st = kolo_ring_hier_enable(cross, &zc, &eb);
	}
	if (st != KOLO_OK)
		wfail(w, eb.msg, r);
	if (r == 0 && st == KOLO_OK) {
		w->algo_small = kolo_ring_allreduce_algo(rc, 8);
		w->algo_big = kolo_ring_allreduce_algo(rc, 64u << 20);
		w->zone_algo_big = kolo_ring_allreduce_algo(cross, 32u << 20);
		w->chunks_big = kolo_ring_allreduce_chunks(rc, 64u << 20);
	}
	const size_t count = 300001; /* odd: uneven blocks at both levels */
	float *buf = malloc(count * sizeof(float)), *out = malloc(count * sizeof(float));
	for (size_t i = 0; i < count; i++)
		buf[i] = val(r, i);
	if (st == KOLO_OK && r == w->kill_rank) {
		/* Leave mid-job: the conns reset, every other rank must fail. */
		kolo_ring_comm_destroy(rc);
		rc = NULL;
	} else if (st == KOLO_OK) {
		/* The flat comm still works beside the sub-comms. */
		int one = 1, sum = 0;
		st = kolo_ring_allreduce(rc, &one, &sum, 1, KOLO_INT32, KOLO_SUM, 1, 1);
		if (st == KOLO_OK && sum != n)
			wfail(w, "flat sum wrong", r);
		if (st == KOLO_OK)
			st = kolo_ring_allreduce(rc, buf, out, count, KOLO_FLOAT32, KOLO_AVERAGE, 1,
			                         1);
		if (st == KOLO_OK)
			st = kolo_ring_allreduce(rc, out, out, count, KOLO_FLOAT32, KOLO_SUM, 1, 1);
		w->st[r] = st;
		if (st == KOLO_OK) {
			for (size_t i = 0; i < count; i++) {
				double ref = 0;
				for (int q = 0; q < n; q++)
					ref += val(q, i);
				/* average then sum over n ranks again: the sum */
				if (fabs(out[i] - ref) > 1e-4 * (fabs(ref) + 4)) {
					char m[128];
					snprintf(m, sizeof(m), "element %zu: %g, want %g", i,
					         (double)out[i], ref);
					wfail(w, m, r);
					break;
				}
			}
			w->hash[r] = fnv(out, count * sizeof(float));
		} else if (w->kill_rank < 0) {
			wfail(w, kolo_ring_last_error(rc), r);
		}
	}
	free(buf);
	free(out);
	pthread_barrier_wait(&w->bar);
	kolo_ring_comm_destroy(rc);
	return NULL;
}

static int world_run(struct world *w)
{
	pthread_mutex_init(&w->lock, NULL);
	pthread_barrier_init(&w->bar, NULL, (unsigned)w->n);
	for (int r = 0; r < w->n; r++) {
		struct kolo_transport_config tc = {
		        .job = "hier-test",
		        .round = 1,
		        .rank = r,
		        .size = w->n,
		        .token = token,
		        .token_len = sizeof(token) - 1,
		        .timeout_ms = 10000,
		        .streams = 1,
		        .iface = "127.0.0.1",
		        .spin_us = 10,
		};
		ck_assert_int_eq(kolo_transport_tcp_ops.create(&tc, &w->t[r], NULL), KOLO_OK);
		ck_assert_int_eq(kolo_transport_tcp_ops.listen(w->t[r], &w->h[r]), KOLO_OK);
	}
	pthread_t th[NMAX];
	struct targ args[NMAX];
	for (int r = 0; r < w->n; r++) {
		args[r] = (struct targ){w, r};
		pthread_create(&th[r], NULL, rank_main, &args[r]);
	}
	for (int r = 0; r < w->n; r++)
		pthread_join(th[r], NULL);
	for (int r = 0; r < w->n; r++)
		kolo_transport_tcp_ops.destroy(w->t[r]);
	pthread_barrier_destroy(&w->bar);
	pthread_mutex_destroy(&w->lock);
	return w->failures;
}

static void assert_bits_alike(const struct world *w)
{
	for (int r = 1; r < w->n; r++)
		ck_assert_msg(w->hash[r] == w->hash[0], "rank %d's bits differ from rank 0's", r);
}

/* 4 hosts of 2 ranks in 2 zones, the host level on, the zone level in
 * zone_mode; kill_rank ≥ 0 leaves mid-job. */
static struct world zoned_world(enum kolo_ring_hier_mode zone_mode, int kill_rank)
{
	return (struct world){.n = 8,
	                      .L = 2,
	                      .H = 4,
	                      .Z = 2,
	                      .mode = KOLO_RING_HIER_ON,
	                      .zone_mode = zone_mode,
	                      .kill_rank = kill_rank};
}

static void run_hier(int H, int L, enum kolo_ring_hier_mode mode)
{
	struct world w = {.n = H * L, .L = L, .H = H, .mode = mode, .kill_rank = -1};
	ck_assert_int_eq(world_run(&w), 0);
	assert_bits_alike(&w);
	if (mode == KOLO_RING_HIER_ON)
		ck_assert_int_eq(w.algo_big, KOLO_RING_ALGO_HIER);
}

START_TEST(test_hier_3x2)
{
	run_hier(3, 2, KOLO_RING_HIER_ON);
}
END_TEST

START_TEST(test_hier_2x3)
{
	run_hier(2, 3, KOLO_RING_HIER_ON);
}
END_TEST

START_TEST(test_hier_auto_probe)
{
	run_hier(2, 2, KOLO_RING_HIER_AUTO);
}
END_TEST

/* 4 hosts of 2 ranks in 2 zones: the cross comm (one rank per host) has a
 * zone level of its own, which the host level's cross stage takes (without
 * the host level's pipeline); sums right, bits alike on every rank. */
START_TEST(test_hier_nested_zones)
{
	struct world w = zoned_world(KOLO_RING_HIER_ON, -1);
	ck_assert_int_eq(world_run(&w), 0);
	assert_bits_alike(&w);
	ck_assert_int_eq(w.algo_big, KOLO_RING_ALGO_HIER);
	ck_assert_int_eq(w.zone_algo_big, KOLO_RING_ALGO_HIER);
	ck_assert_uint_eq(w.chunks_big, 1);
}
END_TEST

/* In auto mode, with the link between zones 8 times slower than the hosts'
 * links, the model takes the zone level for a large cross block, and the
 * host level then runs its stages one after another. */
START_TEST(test_hier_zones_auto)
{
	struct world w = zoned_world(KOLO_RING_HIER_AUTO, -1);
	w.zone_gbps = net.gbytes_per_s / 8;
	ck_assert_int_eq(world_run(&w), 0);
	assert_bits_alike(&w);
	ck_assert_int_eq(w.zone_algo_big, KOLO_RING_ALGO_HIER);
	ck_assert_uint_eq(w.chunks_big, 1);
}
END_TEST

/* A rank of the zone level's comms leaves: every other rank fails. */
START_TEST(test_hier_nested_peer_leaves)
{
	struct world w = zoned_world(KOLO_RING_HIER_ON, 5);
	world_run(&w);
	for (int r = 0; r < 8; r++)
		if (r != 5)
			ck_assert_int_ne(w.st[r], KOLO_OK);
}
END_TEST

START_TEST(test_hier_peer_leaves)
{
	struct world w = {.n = 4, .L = 2, .H = 2, .mode = KOLO_RING_HIER_ON, .kill_rank = 3};
	world_run(&w);
	/* Every survivor failed (none hung: the test's timeout would fire). */
	for (int r = 0; r < 3; r++)
		ck_assert_int_ne(w.st[r], KOLO_OK);
}
END_TEST

static Suite *hier_suite(void)
{
	Suite *s = suite_create("hier");
	TCase *tc = tcase_create("model");
	tcase_add_test(tc, test_model_large_prefers_hier);
	tcase_add_test(tc, test_model_small_prefers_rd);
	tcase_add_test(tc, test_model_pipelined);
	tcase_add_test(tc, test_model_picks_by_size);
	suite_add_tcase(s, tc);
	tc = tcase_create("world");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_hier_3x2);
	tcase_add_test(tc, test_hier_2x3);
	tcase_add_test(tc, test_hier_auto_probe);
	tcase_add_test(tc, test_hier_peer_leaves);
	tcase_add_test(tc, test_hier_nested_zones);
	tcase_add_test(tc, test_hier_zones_auto);
	tcase_add_test(tc, test_hier_nested_peer_leaves);
	suite_add_tcase(s, tc);
	return s;
}

KOLO_CHECK_MAIN(hier_suite)
