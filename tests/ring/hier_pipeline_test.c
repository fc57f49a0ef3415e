/* The pipelined hierarchical allreduce (ring/hier_pipeline.c): worlds of H
 * hosts x L ranks (threads of this process, TCP on 127.0.0.1, the host
 * being only the rank map), with pipeline chunks small enough that every
 * allreduce runs in many chunks, counts that no split divides evenly (down
 * to fewer elements than ranks, whose blocks are empty), every dtype and op,
 * in place and out of place, pre/postscale. Each result is compared with a
 * float64 (exact for integers) reference computed here from every rank's
 * input, and bitwise across ranks; a peer that leaves or goes silent
 * mid-pipeline must fail every other rank, promptly or at the timeout. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ring.h"
#include "testutil.h"
#include "world.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define BIG_COUNT 40009u
#else
#define BIG_COUNT 400009u
#endif

/* Costs that make the model prefer the hierarchy at every size (a slow
 * network); the chunk is configured, so it is used as given. */
static const struct kolo_ring_link_cost shm_cost = {1, 4}, net_cost = {10, 0.1};

struct pcase {
	kolo_dtype_t dt;
	kolo_op_t op;
	size_t count;
	bool inplace;
	double pre, post;
};

struct setup {
	int L, H;
	size_t pipeline_bytes;
	const struct pcase *cases;
	int ncases;
	int leaver;       /* ≥ 0: this rank leaves (destroys its comm) after enabling */
	int silent;       /* ≥ 0: this rank stays connected but never calls */
	kolo_status_t st; /* the survivors' status, when a rank leaves or is silent */
	double max_ms;    /* the slowest survivor's failing allreduce */
};

/* Shared between the rank threads of one world (ordered by world_sync). */
static void *g_out[WORLD_MAX];

static uint64_t mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

static bool is_float(kolo_dtype_t dt)
{
	return dt >= KOLO_FLOAT16;
}

/* Input values: small integers (so no integer reduction overflows, not even
 * a product over 6 ranks of int8), floats k/16 in [-2, 2] or, for products,
 * [0.5, 1.5]: exact in every float type. */
static double value(kolo_dtype_t dt, kolo_op_t op, int rank, size_t i)
{
	uint64_t h = mix((uint64_t)rank * 1000003u + i);
	if (op == KOLO_PRODUCT && is_float(dt))
		return 0.5 + (double)(h % 17) / 16.0;
	if (op == KOLO_PRODUCT)
		return (double)(h % 3) - (dt == KOLO_UINT8 ? 0 : 1);
	if (dt == KOLO_UINT8)
		return (double)(h % 21);
	return is_float(dt) ? ((double)(h % 65) - 32.0) / 16.0 : (double)(h % 41) - 20.0;
}

static void store(kolo_dtype_t dt, void *buf, size_t i, double v)
{
	char *p = (char *)buf + i * kolo_dtype_size(dt);
	uint16_t h;
	float f = (float)v;
	int32_t i32 = (int32_t)v;
	int64_t i64 = (int64_t)v;
	switch (dt) {
	case KOLO_INT8:
		*(int8_t *)p = (int8_t)v;
		break;
	case KOLO_UINT8:
		*(uint8_t *)p = (uint8_t)v;
		break;
	case KOLO_INT32:
		memcpy(p, &i32, 4);
		break;
	case KOLO_INT64:
		memcpy(p, &i64, 8);
		break;
	case KOLO_FLOAT16:
		h = kolo_f32_to_f16(f);
		memcpy(p, &h, 2);
		break;
	case KOLO_BFLOAT16:
		h = kolo_f32_to_bf16(f);
		memcpy(p, &h, 2);
		break;
	case KOLO_FLOAT32:
		memcpy(p, &f, 4);
		break;
	default:
		memcpy(p, &v, 8);
	}
}

static double load(kolo_dtype_t dt, const void *buf, size_t i)
{
	const char *p = (const char *)buf + i * kolo_dtype_size(dt);
	uint16_t h;
	float f;
	int32_t i32;
	int64_t i64;
	double d;
	switch (dt) {
	case KOLO_INT8:
		return *(const int8_t *)p;
	case KOLO_UINT8:
		return *(const uint8_t *)p;
	case KOLO_INT32:
		memcpy(&i32, p, 4);
		return i32;
	case KOLO_INT64:
		memcpy(&i64, p, 8);
		return (double)i64;
	case KOLO_FLOAT16:
		memcpy(&h, p, 2);
		return kolo_f16_to_f32(h);
	case KOLO_BFLOAT16:
		memcpy(&h, p, 2);
		return kolo_bf16_to_f32(h);
	case KOLO_FLOAT32:
		memcpy(&f, p, 4);
		return f;
	default:
		memcpy(&d, p, 8);
		return d;
	}
}

static double unit_roundoff(kolo_dtype_t dt)
{
	switch (dt) {
	case KOLO_FLOAT16:
		return ldexp(1, -11);
	case KOLO_BFLOAT16:
		return ldexp(1, -8);
	case KOLO_FLOAT32:
		return ldexp(1, -24);
	default:
		return ldexp(1, -53);
	}
}

/* Element i of the reduction over n ranks, in float64, and a bound on the
 * rounding error the dtype allows (integers: exact, scaling rounds half away
 * from zero as documented in ring.h). */
static double reference(const struct pcase *c, int n, size_t i, double *tol)
{
	double acc = 0, mag = 0;
	for (int q = 0; q < n; q++) {
		double x = value(c->dt, c->op, q, i);
		if (is_float(c->dt))
			x *= c->pre;
		else if (c->pre != 1.0)
			x = round(x * c->pre);
		mag += fabs(x);
		if (q == 0)
			acc = x;
		else if (c->op == KOLO_SUM || c->op == KOLO_AVERAGE)
			acc += x;
		else if (c->op == KOLO_PRODUCT)
			acc *= x;
		else if (c->op == KOLO_MIN)
			acc = fmin(acc, x);
		else
			acc = fmax(acc, x);
	}
	double post = c->op == KOLO_AVERAGE ? c->post / n : c->post;
	acc = is_float(c->dt) ? acc * post : (post != 1.0 ? round(acc * post) : acc);
	if (!is_float(c->dt))
		*tol = 0;
	else if (c->op == KOLO_MIN || c->op == KOLO_MAX)
		*tol = 3 * unit_roundoff(c->dt) * fabs(acc);
	else if (c->op == KOLO_PRODUCT)
		*tol = (n + 3) * unit_roundoff(c->dt) * fabs(acc);
	else
		*tol = (n + 3) * unit_roundoff(c->dt) * mag * fabs(post);
	return acc;
}

static struct kolo_ring_hier_config hier_config(const struct setup *s)
{
	return (struct kolo_ring_hier_config){
	        .mode = KOLO_RING_HIER_ON,
	        .local_size = s->L,
	        .cross_size = s->H,
	        .shm = shm_cost,
	        .net = net_cost,
	        .local_segment_bytes = 1024, /* several segments per block, too */
	        .pipeline_bytes = s->pipeline_bytes,
	};
}

static void run_case(struct world *w, int rank, struct kolo_ring_comm *rc, const struct setup *s,
                     const struct pcase *c)
{
	const size_t es = kolo_dtype_size(c->dt), bytes = c->count * es;
	char what[160];
	snprintf(what, sizeof(what), "%dx%d %s %s count=%zu %s pre=%g post=%g", s->H, s->L,
	         kolo_dtype_name(c->dt), kolo_op_name(c->op), c->count,
	         c->inplace ? "in place" : "out of place", c->pre, c->post);
	/* The pipeline is what runs: as many chunks as the configured chunk
	 * makes (at least 2, or the case would test the unpipelined path). */
	size_t K = kolo_ring_allreduce_chunks(rc, bytes);
	if (K != kolo_ring_hier_chunks(bytes, s->pipeline_bytes) || K < 2)
		world_fail(w, "%s: %zu chunks", what, K);
	char *in = malloc(bytes + 1), *out = malloc(bytes + 1);
	for (size_t i = 0; i < c->count; i++)
		store(c->dt, in, i, value(c->dt, c->op, rank, i));
	if (c->inplace)
		memcpy(out, in, bytes);
	else
		memset(out, 0xA5, bytes + 1);
	kolo_status_t st = kolo_ring_allreduce(rc, c->inplace ? out : in, out, c->count, c->dt,
	                                       c->op, c->pre, c->post);
	if (st != KOLO_OK) {
		world_fail(w, "%s rank %d: %s: %s", what, rank, kolo_status_name(st),
		           kolo_ring_last_error(rc));
	} else {
		for (size_t i = 0; i < c->count; i++) {
			double tol, want = reference(c, w->n, i, &tol), got = load(c->dt, out, i);
			if (!(fabs(got - want) <= tol)) {
				world_fail(w, "%s rank %d i=%zu: got %.17g want %.17g (tol %g)",
				           what, rank, i, got, want, tol);
				break;
			}
		}
		for (size_t i = 0; !c->inplace && i < c->count; i++) {
			if (load(c->dt, in, i) != value(c->dt, c->op, rank, i)) {
				world_fail(w, "%s rank %d: sendbuf modified at %zu", what, rank, i);
				break;
			}
		}
		if (!c->inplace && (unsigned char)out[bytes] != 0xA5)
			world_fail(w, "%s rank %d: wrote past recvbuf", what, rank);
	}
	g_out[rank] = out;
	world_sync(w);
	if (rank == 0)
		for (int q = 1; q < w->n; q++)
			if (bytes && memcmp(g_out[q], out, bytes) != 0) {
				world_fail(w, "%s: rank %d's bits differ from rank 0's", what, q);
				break;
			}
	world_sync(w);
	free(in);
	free(out);
}

static void body(struct world *w, int rank, struct kolo_ring_comm *rc)
{
	struct setup *s = w->arg;
	struct kolo_ring_hier_config hc = hier_config(s);
	struct kolo_errbuf eb = {{0}};
	kolo_status_t st = rc ? kolo_ring_hier_enable(rc, &hc, &eb) : KOLO_EINVAL;
	if (st != KOLO_OK) {
		world_fail(w, "rank %d: enable: %s", rank, eb.msg);
		return;
	}
	for (int i = 0; i < s->ncases; i++)
		run_case(w, rank, rc, s, &s->cases[i]);
}

static struct kolo_ring_config base_cfg(int timeout_ms)
{
	return (struct kolo_ring_config){
	        .small_allreduce_bytes = 64,
	        .segment_bytes = 4096,
	        .timeout_ms = timeout_ms,
	        .spin_us = 10,
	};
}

static void run(struct setup *s)
{
	struct world w;
	struct kolo_ring_config cfg = base_cfg(20000);
	world_init(&w, s->L * s->H, &cfg);
	int failures = world_run(&w, body, s);
	ck_assert_msg(failures == 0, "%d failures; first: %s", failures, w.first_failure);
}

/* Every dtype with SUM and AVERAGE, the other ops on two, pre/postscale, in
 * place and out: counts not divisible by L x chunks, split into chunks of
 * `chunk` bytes. */
static int all_cases(struct pcase *out, size_t count)
{
	int n = 0;
	for (int t = 0; t < KOLO_DTYPE_COUNT; t++) {
		kolo_dtype_t dt = (kolo_dtype_t)t;
		out[n++] = (struct pcase){dt, KOLO_SUM, count, false, 1, 1};
		out[n++] = (struct pcase){dt, KOLO_AVERAGE, count + 2, true, 1, 1};
	}
	out[n++] = (struct pcase){KOLO_FLOAT32, KOLO_SUM, count, true, 0.5, 3};
	out[n++] = (struct pcase){KOLO_BFLOAT16, KOLO_SUM, count, false, 2, 0.25};
	out[n++] = (struct pcase){KOLO_INT32, KOLO_SUM, count, false, 3, 0.5};
	for (int o = KOLO_MIN; o <= KOLO_PRODUCT; o++) {
		kolo_op_t op = (kolo_op_t)o;
		out[n++] = (struct pcase){KOLO_FLOAT64, op, count, op == KOLO_MAX, 1, 1};
		out[n++] = (struct pcase){KOLO_INT8, op, count + 1, op != KOLO_MAX, 1, 1};
	}
	return n;
}

static void run_matrix(int H, int L)
{
	struct pcase cases[64];
	/* 10007 elements (prime) in chunks of 2000 bytes: 5 to 40 chunks
	 * by dtype, every split uneven. */
	int n = all_cases(cases, 10007);
	struct setup s = {.L = L,
	                  .H = H,
	                  .pipeline_bytes = 2000,
	                  .cases = cases,
	                  .ncases = n,
	                  .leaver = -1,
	                  .silent = -1};
	run(&s);
}

START_TEST(test_pipe_2x2)
{
	run_matrix(2, 2);
}
END_TEST

START_TEST(test_pipe_3x2)
{
	run_matrix(3, 2);
}
END_TEST

START_TEST(test_pipe_2x3)
{
	run_matrix(2, 3);
}
END_TEST

/* One rank per host (no local stage) and one host (no cross stage). */
START_TEST(test_pipe_4x1_1x4)
{
	run_matrix(4, 1);
	run_matrix(1, 4);
}
END_TEST

/* Tiny buffers: fewer elements than ranks and chunks of one element, so
 * most blocks of most chunks are empty; and one large buffer in 23
 * (float32) and 11 (bfloat16) chunks of several segments each. */
START_TEST(test_pipe_tiny_and_large)
{
	static const struct pcase tiny[] = {
	        {KOLO_FLOAT32, KOLO_SUM, 2, false, 1, 1},
	        {KOLO_FLOAT64, KOLO_AVERAGE, 3, true, 1, 1},
	        {KOLO_INT32, KOLO_MAX, 5, false, 1, 1},
	        {KOLO_FLOAT16, KOLO_SUM, 7, true, 0.5, 2},
	        {KOLO_FLOAT32, KOLO_PRODUCT, 13, false, 1, 1},
	};
	struct setup s = {.L = 2,
	                  .H = 3,
	                  .pipeline_bytes = 1,
	                  .cases = tiny,
	                  .ncases = 5,
	                  .leaver = -1,
	                  .silent = -1};
	run(&s);
	static const struct pcase large[] = {
	        {KOLO_FLOAT32, KOLO_SUM, BIG_COUNT, false, 1, 1},
	        {KOLO_BFLOAT16, KOLO_AVERAGE, BIG_COUNT, true, 1, 1},
	};
	struct setup s2 = {.L = 2,
	                   .H = 2,
	                   .pipeline_bytes = BIG_COUNT / 6 + 7,
	                   .cases = large,
	                   .ncases = 2,
	                   .leaver = -1,
	                   .silent = -1};
	run(&s2);
}
END_TEST

/* ---- failures --------------------------------------------------------- */

static double now_ms(void)
{
	return (double)kolo_now_ns() / 1e6;
}

static void fail_body(struct world *w, int rank, struct kolo_ring_comm *rc)
{
	struct setup *s = w->arg;
	struct kolo_ring_hier_config hc = hier_config(s);
	struct kolo_errbuf eb = {{0}};
	if (!rc || kolo_ring_hier_enable(rc, &hc, &eb) != KOLO_OK) {
		world_fail(w, "rank %d: enable: %s", rank, eb.msg);
		return;
	}
	const size_t count = BIG_COUNT;
	float *buf = calloc(count, sizeof(float));
	world_sync(w);
	if (rank == s->leaver) {
		/* Its conns reset: every peer in any stage must fail at once. */
		kolo_ring_comm_destroy(rc);
		w->rc[rank] = NULL;
	} else if (rank != s->silent) {
		double t0 = now_ms();
		kolo_status_t st =
		        kolo_ring_allreduce(rc, buf, buf, count, KOLO_FLOAT32, KOLO_SUM, 1, 1);
		double ms = now_ms() - t0;
		pthread_mutex_lock(&w->lock);
		if (st == KOLO_OK)
			s->st = KOLO_OK;
		if (ms > s->max_ms)
			s->max_ms = ms;
		pthread_mutex_unlock(&w->lock);
		if (st == KOLO_OK)
			world_fail(w, "rank %d: allreduce succeeded without a peer", rank);
		else if (!strstr(kolo_ring_last_error(rc), "hierarchical"))
			world_fail(w, "rank %d: error does not name the hierarchy: %s", rank,
			           kolo_ring_last_error(rc));
	}
	/* The silent rank waits here until every other one has failed. */
	world_sync(w);
	free(buf);
}

static struct setup fail_setup(int leaver, int silent)
{
	return (struct setup){.L = 2,
	                      .H = 2,
	                      .pipeline_bytes = 32768,
	                      .leaver = leaver,
	                      .silent = silent,
	                      .st = KOLO_EPEER};
}

START_TEST(test_pipe_peer_leaves)
{
	/* The other rank of its host fails in a local stage, the others in
	 * the cross stage or behind it; none waits for the timeout. */
	struct setup s = fail_setup(3, -1);
	struct world w;
	struct kolo_ring_config cfg = base_cfg(20000);
	world_init(&w, 4, &cfg);
	int failures = world_run(&w, fail_body, &s);
	ck_assert_msg(failures == 0, "%d failures; first: %s", failures, w.first_failure);
	ck_assert_int_ne(s.st, KOLO_OK);
	ck_assert_msg(s.max_ms < 10000, "a survivor took %.0f ms to fail", s.max_ms);
}
END_TEST

START_TEST(test_pipe_peer_silent)
{
	/* A peer that keeps its conns but never calls: the progress timeout
	 * fails the ranks that wait on it, and their failure the others. */
	struct setup s = fail_setup(-1, 2);
	struct world w;
	struct kolo_ring_config cfg = base_cfg(1000);
	world_init(&w, 4, &cfg);
	int failures = world_run(&w, fail_body, &s);
	ck_assert_msg(failures == 0, "%d failures; first: %s", failures, w.first_failure);
	ck_assert_int_ne(s.st, KOLO_OK);
	/* Not at once: after the timeout, counted from the conn's last progress,
	 * which may come a little before the call (999.6 ms has been seen). */
	ck_assert_msg(s.max_ms >= 900 && s.max_ms < 10000, "the last survivor failed after %.1f ms",
	              s.max_ms);
}
END_TEST

static Suite *hier_pipeline_suite(void)
{
	Suite *s = suite_create("hier_pipeline");
	TCase *tc = tcase_create("matrix");
	tcase_add_test(tc, test_pipe_2x2);
	tcase_add_test(tc, test_pipe_3x2);
	tcase_add_test(tc, test_pipe_2x3);
	tcase_add_test(tc, test_pipe_4x1_1x4);
	tcase_add_test(tc, test_pipe_tiny_and_large);
	suite_add_tcase(s, tc);
	tc = tcase_create("failure");
	tcase_add_test(tc, test_pipe_peer_leaves);
	tcase_add_test(tc, test_pipe_peer_silent);
	suite_add_tcase(s, tc);
	return s;
}

KOLO_CHECK_MAIN(hier_pipeline_suite)
