/* The correctness matrix of the ring collectives: every collective x dtype x
 * op x count (0, 1, n-1, odd, large) x 2, 3, 4 and 7 ranks, in place and out
 * of place, with and without pre/postscale. Every rank's result is compared
 * with a float64 (or exact integer) reference computed here from all ranks'
 * inputs, and the results are compared bitwise across ranks. The ranks are
 * threads of this process, each with its own TCP endpoint on 127.0.0.1. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ring.h"
#include "testutil.h"
#include "world.h"

/* The large count: with the matrix's 4 KiB segments, 1 Mi bytes of float32
 * run 256 segments through the pipeline, as 4 Mi would run 1024; the
 * sanitizer builds, which check every byte, run 16 of them. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define LARGE_COUNT (1u << 14)
#else
#define LARGE_COUNT (1u << 18)
#endif

static const int sizes[] = {2, 3, 4, 7};

/* ---- data ------------------------------------------------------------- */

static uint64_t mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

static uint64_t hash3(uint64_t a, uint64_t b, uint64_t c)
{
	return mix(a * 0x100000001b3ull ^ mix(b * 31 + mix(c)));
}

static bool is_float(kolo_dtype_t dt)
{
	return dt >= KOLO_FLOAT16;
}

static double load_f(kolo_dtype_t dt, const void *buf, size_t i)
{
	const char *p = (const char *)buf + i * kolo_dtype_size(dt);
	uint16_t h;
	float f;
	double d;
	switch (dt) {
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

static int64_t load_i(kolo_dtype_t dt, const void *buf, size_t i)
{
	const char *p = (const char *)buf + i * kolo_dtype_size(dt);
	int32_t v32;
	int64_t v64;
	switch (dt) {
	case KOLO_INT8:
		return *(const int8_t *)p;
	case KOLO_UINT8:
		return *(const uint8_t *)p;
	case KOLO_INT32:
		memcpy(&v32, p, 4);
		return v32;
	default:
		memcpy(&v64, p, 8);
		return v64;
	}
}

/* Truncates v to the dtype's width (two's complement), sign-extending. */
static int64_t wrap(kolo_dtype_t dt, uint64_t v)
{
	switch (dt) {
	case KOLO_INT8:
		return (int8_t)(uint8_t)v;
	case KOLO_UINT8:
		return (uint8_t)v;
	case KOLO_INT32:
		return (int32_t)(uint32_t)v;
	default:
		return (int64_t)v;
	}
}

/* Integer scaling as documented: round half away from zero, saturate. */
static int64_t scale_i(kolo_dtype_t dt, int64_t x, double f)
{
	double lo, hi, v = round((double)x * f);
	switch (dt) {
	case KOLO_INT8:
		lo = -128, hi = 127;
		break;
	case KOLO_UINT8:
		lo = 0, hi = 255;
		break;
	case KOLO_INT32:
		lo = -2147483648.0, hi = 2147483647.0;
		break;
	default:
		lo = -9223372036854775808.0, hi = 9223372036854774784.0;
	}
	v = v < lo ? lo : v > hi ? hi : v;
	return (int64_t)v;
}

/* Fills rank `rank`'s input for case `seed`: integers over their whole range,
 * floats k/1024 in [-1, 1] (sums) or [0.5, 1.5] (products). */
static void fill(void *buf, size_t count, kolo_dtype_t dt, kolo_op_t op, uint64_t seed, int rank)
{
	size_t es = kolo_dtype_size(dt);
	for (size_t i = 0; i < count; i++) {
		uint64_t h = hash3(seed, (uint64_t)rank, i);
		char *p = (char *)buf + i * es;
		if (!is_float(dt)) {
			memcpy(p, &h, es); /* little endian: the low bytes */
			continue;
		}
		double v = op == KOLO_PRODUCT ? 0.5 + (double)(h % 1025) / 1024.0
		                              : ((double)(h % 2049) - 1024.0) / 1024.0;
		uint16_t b;
		float f = (float)v;
		switch (dt) {
		case KOLO_FLOAT16:
			b = kolo_f32_to_f16(f);
			memcpy(p, &b, 2);
			break;
		case KOLO_BFLOAT16:
			b = kolo_f32_to_bf16(f);
			memcpy(p, &b, 2);
			break;
		case KOLO_FLOAT32:
			memcpy(p, &f, 4);
			break;
		default:
			memcpy(p, &v, 8);
		}
	}
}

static void fill_bytes(void *buf, size_t bytes, uint64_t seed, uint64_t a, uint64_t b)
{
	unsigned char *p = buf;
	for (size_t i = 0; i < bytes; i++)
		p[i] = (unsigned char)hash3(seed, a * 1000003u + b, i);
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

/* Checks element i of got against the reduction of element src_i of every
 * rank's input. Returns false (and reports) on a mismatch. */
static bool check_reduced(struct world *w, int rank, const char *what, void *const *in,
                          size_t src_i, const void *got, size_t i, kolo_dtype_t dt, kolo_op_t op,
                          double pre, double post)
{
	const int n = w->n;
	double post_eff = op == KOLO_AVERAGE ? post / n : post;
	if (!is_float(dt)) {
		int64_t acc = 0;
		for (int q = 0; q < n; q++) {
			int64_t x = load_i(dt, in[q], src_i);
			if (pre != 1.0)
				x = scale_i(dt, x, pre);
			if (q == 0) {
				acc = x;
				continue;
			}
			switch (op) {
			case KOLO_SUM:
			case KOLO_AVERAGE:
				acc = wrap(dt, (uint64_t)acc + (uint64_t)x);
				break;
			case KOLO_PRODUCT:
				acc = wrap(dt, (uint64_t)acc * (uint64_t)x);
				break;
			case KOLO_MIN:
				acc = x < acc ? x : acc;
				break;
			default:
				acc = x > acc ? x : acc;
			}
		}
		if (post_eff != 1.0)
			acc = scale_i(dt, acc, post_eff);
		int64_t g = load_i(dt, got, i);
		if (g != acc) {
			world_fail(w, "%s rank %d/%d %s %s i=%zu: got %lld want %lld", what, rank,
			           n, kolo_dtype_name(dt), kolo_op_name(op), i, (long long)g,
			           (long long)acc);
			return false;
		}
		return true;
	}
	double acc = 0, mag = 0;
	for (int q = 0; q < n; q++) {
		double x = load_f(dt, in[q], src_i) * pre;
		mag += fabs(x);
		if (q == 0)
			acc = x;
		else if (op == KOLO_SUM || op == KOLO_AVERAGE)
			acc += x;
		else if (op == KOLO_PRODUCT)
			acc *= x;
		else if (op == KOLO_MIN)
			acc = x < acc ? x : acc;
		else
			acc = x > acc ? x : acc;
	}
	acc *= post_eff;
	double g = load_f(dt, got, i), u = unit_roundoff(dt), tol;
	if (op == KOLO_MIN || op == KOLO_MAX)
		tol = pre == 1.0 && post == 1.0 ? 0 : 3 * u * fabs(acc);
	else if (op == KOLO_PRODUCT)
		tol = (n + 3) * u * fabs(acc);
	else
		tol = (n + 3) * u * mag * fabs(post_eff);
	if (!(fabs(g - acc) <= tol)) {
		world_fail(w, "%s rank %d/%d %s %s i=%zu: got %.17g want %.17g (tol %g)", what,
		           rank, n, kolo_dtype_name(dt), kolo_op_name(op), i, g, acc, tol);
		return false;
	}
	return true;
}

/* Shared between the rank threads of one world (synchronised by world_sync). */
static void *g_in[WORLD_MAX];
static void *g_out[WORLD_MAX];
static size_t g_out_bytes[WORLD_MAX];

/* Every rank publishes its result; rank 0 compares them bitwise. */
static void check_identical(struct world *w, int rank, const void *out, size_t bytes,
                            const char *what)
{
	g_out[rank] = (void *)out;
	g_out_bytes[rank] = bytes;
	world_sync(w);
	if (rank == 0) {
		for (int q = 1; q < w->n; q++) {
			if (g_out_bytes[q] != bytes ||
			    (bytes && memcmp(g_out[q], out, bytes) != 0)) {
				world_fail(w, "%s: rank %d's result differs from rank 0's", what,
				           q);
				break;
			}
		}
	}
	world_sync(w);
}

static bool status_ok(struct world *w, int rank, struct kolo_ring_comm *rc, kolo_status_t st,
                      const char *what)
{
	if (st == KOLO_OK)
		return true;
	world_fail(w, "%s rank %d/%d: %s: %s", what, rank, w->n, kolo_status_name(st),
	           kolo_ring_last_error(rc));
	return false;
}

static size_t counts_for(int n, int ci)
{
	switch (ci) {
	case 0:
		return 0;
	case 1:
		return 1;
	case 2:
		return (size_t)n - 1;
	case 3:
		return 1001;
	default:
		return LARGE_COUNT;
	}
}

/* Tiny segments for the small counts, so that 1001 elements already make a
 * deep pipeline with segments that are not a multiple of the window. */
static void tune(struct kolo_ring_comm *rc, size_t small_bytes, int ci)
{
	kolo_ring_comm_tune(rc, small_bytes, ci == 4 ? 4096 : 200);
}

/* ---- allreduce -------------------------------------------------------- */

struct ar_arg {
	size_t small_bytes; /* algorithm threshold for this run */
	const char *name;
};

static void allreduce_case(struct world *w, int rank, struct kolo_ring_comm *rc, kolo_dtype_t dt,
                           kolo_op_t op, size_t count, bool inplace, double pre, double post,
                           uint64_t seed)
{
	size_t es = kolo_dtype_size(dt), bytes = count * es;
	char what[128];
	snprintf(what, sizeof(what), "allreduce[%s count=%zu %s pre=%g post=%g]",
	         ((struct ar_arg *)w->arg)->name, count, inplace ? "in-place" : "out-of-place", pre,
	         post);
	char *in = malloc(bytes + 1), *out = malloc(bytes + 1);
	fill(in, count, dt, op, seed, rank);
	g_in[rank] = in;
	world_sync(w);
	kolo_status_t st;
	if (inplace) {
		memcpy(out, in, bytes);
		st = kolo_ring_allreduce(rc, out, out, count, dt, op, pre, post);
	} else {
		memset(out, 0xA5, bytes);
		st = kolo_ring_allreduce(rc, in, out, count, dt, op, pre, post);
	}
	if (status_ok(w, rank, rc, st, what)) {
		for (size_t i = 0; i < count; i++)
			if (!check_reduced(w, rank, what, g_in, i, out, i, dt, op, pre, post))
				break;
		char *again = malloc(bytes + 1);
		fill(again, count, dt, op, seed, rank);
		if (!inplace && memcmp(in, again, bytes) != 0)
			world_fail(w, "%s: sendbuf modified", what);
		free(again);
	}
	check_identical(w, rank, out, bytes, what);
	free(in);
	free(out);
}

static void allreduce_body(struct world *w, int rank, struct kolo_ring_comm *rc)
{
	struct ar_arg *a = w->arg;
	uint64_t seed = 1;
	for (int dt = 0; dt < KOLO_DTYPE_COUNT; dt++) {
		for (int op = 0; op < KOLO_OP_COUNT; op++) {
			for (int ci = 0; ci < 4; ci++) {
				size_t c = counts_for(w->n, ci);
				tune(rc, a->small_bytes, ci);
				allreduce_case(w, rank, rc, dt, op, c, false, 1, 1, seed++);
				allreduce_case(w, rank, rc, dt, op, c, true, 1, 1, seed++);
				allreduce_case(w, rank, rc, dt, op, c, false, 0.5, 3, seed++);
			}
		}
	}
	/* Large messages for a few dtypes. */
	tune(rc, a->small_bytes, 4);
	allreduce_case(w, rank, rc, KOLO_FLOAT32, KOLO_SUM, LARGE_COUNT, true, 1, 1, seed++);
	allreduce_case(w, rank, rc, KOLO_BFLOAT16, KOLO_AVERAGE, LARGE_COUNT, false, 1, 1, seed++);
	allreduce_case(w, rank, rc, KOLO_INT32, KOLO_SUM, LARGE_COUNT + 3, false, 1, 1, seed++);
	allreduce_case(w, rank, rc, KOLO_FLOAT64, KOLO_MAX, LARGE_COUNT / 2 + 1, true, 0.5, 2,
	               seed++);
}

static struct kolo_ring_config base_cfg(void)
{
	struct kolo_ring_config cfg = {
	        .small_allreduce_bytes = 4096,
	        .segment_bytes = 4096, /* small, so even 1001 elements make a pipeline */
	        .timeout_ms = 20000,
	        .spin_us = 20,
	};
	return cfg;
}

static void run(int n, world_body_fn body, void *arg)
{
	struct world w;
	struct kolo_ring_config cfg = base_cfg();
	world_init(&w, n, &cfg);
	int failures = world_run(&w, body, arg);
	ck_assert_msg(failures == 0, "%d failures; first: %s", failures, w.first_failure);
}

START_TEST(test_allreduce_ring)
{
	struct ar_arg a = {0, "ring"};
	run(sizes[_i], allreduce_body, &a);
}
END_TEST

START_TEST(test_allreduce_small)
{
	struct ar_arg a = {SIZE_MAX, "recursive-doubling"};
	run(sizes[_i], allreduce_body, &a);
}
END_TEST

/* ---- allreduce over pieces ------------------------------------------- */

/* Piece layouts: empty pieces, one-element pieces, pieces shorter than a
 * segment and longer than a block, in place and out of place mixed. */
static const size_t piece_counts[][7] = {
        {1001, 0, 1, 3, 5000, 0, 257},
        {LARGE_COUNT / 3, 7, LARGE_COUNT / 2 + 5, 0, 0, 0, 0},
        {2, 2, 2, 2, 2, 2, 2},
};

static void pieces_case(struct world *w, int rank, struct kolo_ring_comm *rc, kolo_dtype_t dt,
                        kolo_op_t op, int layout, double pre, double post, uint64_t seed)
{
	const size_t *pc = piece_counts[layout];
	const size_t np = KOLO_ARRAY_SIZE(piece_counts[0]);
	size_t es = kolo_dtype_size(dt), total = 0;
	for (size_t i = 0; i < np; i++)
		total += pc[i];
	char what[128];
	snprintf(what, sizeof(what), "allreduce_pieces[%s %s layout=%d pre=%g post=%g]",
	         kolo_dtype_name(dt), kolo_op_name(op), layout, pre, post);
	/* in: this rank's input, concatenated; odd pieces are reduced in place
	 * (a copy of their input), even ones out of place into out[i]. */
	char *in = malloc(total * es + 1), *res = malloc(total * es + 1);
	fill(in, total, dt, op, seed, rank);
	g_in[rank] = in;
	struct kolo_ring_piece pieces[KOLO_ARRAY_SIZE(piece_counts[0])];
	size_t off = 0;
	for (size_t i = 0; i < np; i++) {
		char *o = malloc(pc[i] * es + 1);
		if (i % 2)
			memcpy(o, in + off * es, pc[i] * es);
		else
			memset(o, 0xA5, pc[i] * es);
		pieces[i] = (struct kolo_ring_piece){i % 2 ? o : in + off * es, o, pc[i]};
		off += pc[i];
	}
	world_sync(w);
	kolo_status_t st = kolo_ring_allreduce_pieces(rc, pieces, np, dt, op, pre, post);
	off = 0;
	for (size_t i = 0; i < np; i++) {
		memcpy(res + off * es, pieces[i].recv, pc[i] * es);
		off += pc[i];
		free(pieces[i].recv);
	}
	if (status_ok(w, rank, rc, st, what)) {
		for (size_t i = 0; i < total; i++)
			if (!check_reduced(w, rank, what, g_in, i, res, i, dt, op, pre, post))
				break;
	}
	check_identical(w, rank, res, total * es, what);
	free(in);
	free(res);
}

static void pieces_body(struct world *w, int rank, struct kolo_ring_comm *rc)
{
	uint64_t seed = 500;
	const kolo_dtype_t dts[] = {KOLO_FLOAT32, KOLO_FLOAT16, KOLO_INT64, KOLO_FLOAT64};
	for (size_t d = 0; d < KOLO_ARRAY_SIZE(dts); d++)
		for (int op = 0; op < KOLO_OP_COUNT; op++)
			for (int layout = 0; layout < (int)KOLO_ARRAY_SIZE(piece_counts);
			     layout++) {
				kolo_ring_comm_tune(rc, layout == 2 ? SIZE_MAX : 0,
				                    layout == 1 ? 4096 : 200);
				pieces_case(w, rank, rc, dts[d], op, layout, 1, 1, seed++);
				pieces_case(w, rank, rc, dts[d], op, layout, 0.5, 3, seed++);
			}
}

START_TEST(test_allreduce_pieces)
{
	run(sizes[_i], pieces_body, NULL);
}
END_TEST

/* ---- small allreduce, every rank to every rank ------------------------- */

START_TEST(test_allreduce_direct)
{
	struct world w;
	struct kolo_ring_config cfg = base_cfg();
	cfg.small_direct_ranks = KOLO_RING_DIRECT_MAX_RANKS;
	cfg.small_direct_bytes = SIZE_MAX;
	world_init(&w, sizes[_i], &cfg);
	struct ar_arg a = {SIZE_MAX, "direct"};
	int failures = world_run(&w, allreduce_body, &a);
	ck_assert_msg(failures == 0, "%d failures; first: %s", failures, w.first_failure);
}
END_TEST

/* ---- allgatherv ------------------------------------------------------- */

/* Pattern 0: equal counts (allgather); 1: uneven, every third rank empty. */
static size_t agv_count(int pattern, size_t c, int q)
{
	if (pattern == 0 || c == 0)
		return c;
	return q % 3 == 1 ? 0 : c + (size_t)q;
}

static void allgatherv_body(struct world *w, int rank, struct kolo_ring_comm *rc)
{
	const int n = w->n;
	uint64_t seed = 1000;
	for (int dt = 0; dt < KOLO_DTYPE_COUNT; dt++) {
		size_t es = kolo_dtype_size(dt);
		for (int ci = 0; ci < 5; ci++) {
			for (int pattern = 0; pattern < 2; pattern++) {
				for (int inplace = 0; inplace < 2; inplace++, seed++) {
					if (ci == 4 && (dt % 3 != 0 || inplace))
						continue;
					tune(rc, 4096, ci);
					size_t c = counts_for(n, ci), counts[WORLD_MAX], total = 0,
					       off = 0;
					for (int q = 0; q < n; q++) {
						counts[q] = agv_count(pattern, c, q);
						if (q < rank)
							off += counts[q];
						total += counts[q];
					}
					char what[128];
					snprintf(what, sizeof(what),
					         "allgatherv[%s c=%zu pattern=%d %s]",
					         kolo_dtype_name(dt), c, pattern,
					         inplace ? "in-place" : "out-of-place");
					char *want = malloc(total * es + 1),
					     *out = malloc(total * es + 1);
					char *in = malloc(counts[rank] * es + 1);
					size_t o = 0;
					for (int q = 0; q < n; q++) {
						fill_bytes(want + o, counts[q] * es, seed,
						           (uint64_t)q, 0);
						o += counts[q] * es;
					}
					memcpy(in, want + off * es, counts[rank] * es);
					memset(out, 0x5A, total * es);
					kolo_status_t st;
					if (inplace) {
						memcpy(out + off * es, in, counts[rank] * es);
						st = kolo_ring_allgatherv(rc, out + off * es, out,
						                          counts, dt);
					} else {
						st = kolo_ring_allgatherv(rc, in, out, counts, dt);
					}
					if (status_ok(w, rank, rc, st, what) &&
					    memcmp(out, want, total * es) != 0)
						world_fail(w, "%s rank %d/%d: wrong data", what,
						           rank, n);
					check_identical(w, rank, out, total * es, what);
					free(want);
					free(out);
					free(in);
				}
			}
		}
	}
}

START_TEST(test_allgatherv)
{
	run(sizes[_i], allgatherv_body, NULL);
}
END_TEST

/* ---- broadcast -------------------------------------------------------- */

static void broadcast_body(struct world *w, int rank, struct kolo_ring_comm *rc)
{
	const int n = w->n;
	uint64_t seed = 2000;
	for (int dt = 0; dt < KOLO_DTYPE_COUNT; dt++) {
		size_t es = kolo_dtype_size(dt);
		for (int ci = 0; ci < 5; ci++) {
			if (ci == 4 && dt != KOLO_FLOAT32 && dt != KOLO_INT8)
				continue;
			for (int root = 0; root < n; root++, seed++) {
				tune(rc, 4096, ci);
				size_t c = counts_for(n, ci), bytes = c * es;
				char what[128];
				snprintf(what, sizeof(what), "broadcast[%s c=%zu root=%d]",
				         kolo_dtype_name(dt), c, root);
				char *want = malloc(bytes + 1), *buf = malloc(bytes + 1);
				fill_bytes(want, bytes, seed, (uint64_t)root, 0);
				if (rank == root)
					memcpy(buf, want, bytes);
				else
					memset(buf, 0x3C, bytes);
				kolo_status_t st = kolo_ring_broadcast(rc, buf, c, dt, root);
				if (status_ok(w, rank, rc, st, what) &&
				    memcmp(buf, want, bytes) != 0)
					world_fail(w, "%s rank %d/%d: wrong data", what, rank, n);
				check_identical(w, rank, buf, bytes, what);
				free(want);
				free(buf);
			}
		}
	}
}

START_TEST(test_broadcast)
{
	run(sizes[_i], broadcast_body, NULL);
}
END_TEST

/* ---- reducescatter ---------------------------------------------------- */

static void reducescatter_case(struct world *w, int rank, struct kolo_ring_comm *rc,
                               kolo_dtype_t dt, kolo_op_t op, size_t c, int pattern, bool inplace,
                               double pre, double post, uint64_t seed)
{
	const int n = w->n;
	size_t es = kolo_dtype_size(dt), counts[WORLD_MAX], total = 0, off = 0;
	for (int q = 0; q < n; q++) {
		counts[q] = pattern == 0 ? kolo_reducescatter_count(c, n, q) : agv_count(1, c, q);
		if (q < rank)
			off += counts[q];
		total += counts[q];
	}
	char what[160];
	snprintf(what, sizeof(what), "reducescatter[c=%zu pattern=%d %s pre=%g post=%g]", c,
	         pattern, inplace ? "in-place" : "out-of-place", pre, post);
	char *in = malloc(total * es + 1), *out = malloc(total * es + 1);
	fill(in, total, dt, op, seed, rank);
	g_in[rank] = in;
	world_sync(w);
	kolo_status_t st;
	if (inplace) {
		memcpy(out, in, total * es);
		st = kolo_ring_reducescatter(rc, out, out, counts, dt, op, pre, post);
	} else {
		st = kolo_ring_reducescatter(rc, in, out, counts, dt, op, pre, post);
	}
	if (status_ok(w, rank, rc, st, what))
		for (size_t i = 0; i < counts[rank]; i++)
			if (!check_reduced(w, rank, what, g_in, off + i, out, i, dt, op, pre, post))
				break;
	world_sync(w); /* g_in is read by every rank */
	free(in);
	free(out);
}

static void reducescatter_body(struct world *w, int rank, struct kolo_ring_comm *rc)
{
	uint64_t seed = 3000;
	for (int dt = 0; dt < KOLO_DTYPE_COUNT; dt++)
		for (int op = 0; op < KOLO_OP_COUNT; op++)
			for (int ci = 0; ci < 4; ci++)
				for (int pattern = 0; pattern < 2; pattern++) {
					size_t c = counts_for(w->n, ci);
					tune(rc, 4096, ci);
					reducescatter_case(w, rank, rc, dt, op, c, pattern, false,
					                   1, 1, seed++);
					reducescatter_case(w, rank, rc, dt, op, c, pattern, true,
					                   0.5, 3, seed++);
				}
	tune(rc, 4096, 4);
	reducescatter_case(w, rank, rc, KOLO_FLOAT32, KOLO_SUM, LARGE_COUNT, 0, false, 1, 1,
	                   seed++);
	reducescatter_case(w, rank, rc, KOLO_INT64, KOLO_PRODUCT, LARGE_COUNT / 4, 1, true, 1, 1,
	                   seed++);
}

START_TEST(test_reducescatter)
{
	run(sizes[_i], reducescatter_body, NULL);
}
END_TEST

/* ---- alltoallv -------------------------------------------------------- */

/* Elements rank i sends to rank j. Pattern 0: all c (alltoall). */
static size_t a2a_count(int pattern, size_t c, int i, int j)
{
	if (pattern == 0 || c == 0)
		return c;
	return (i + 2 * j) % 3 == 0 ? 0 : c + (size_t)(i + j);
}

static void alltoallv_body(struct world *w, int rank, struct kolo_ring_comm *rc)
{
	const int n = w->n;
	uint64_t seed = 4000;
	for (int dt = 0; dt < KOLO_DTYPE_COUNT; dt++) {
		size_t es = kolo_dtype_size(dt);
		for (int ci = 0; ci < 5; ci++) {
			for (int pattern = 0; pattern < 2; pattern++) {
				for (int inplace = 0; inplace < 2; inplace++, seed++) {
					if (ci == 4 && (dt != KOLO_FLOAT32 || inplace))
						continue;
					size_t c = counts_for(n, ci) / (ci == 4 ? (size_t)n : 1);
					size_t sc[WORLD_MAX], rcn[WORLD_MAX], stot = 0, rtot = 0;
					for (int q = 0; q < n; q++) {
						sc[q] = a2a_count(pattern, c, rank, q);
						rcn[q] = a2a_count(pattern, c, q, rank);
						stot += sc[q];
						rtot += rcn[q];
					}
					char what[128];
					snprintf(what, sizeof(what),
					         "alltoallv[%s c=%zu pattern=%d %s]",
					         kolo_dtype_name(dt), c, pattern,
					         inplace ? "in-place" : "out-of-place");
					size_t cap = KOLO_MAX(stot, rtot) * es + 1;
					char *in = malloc(cap), *out = malloc(cap),
					     *want = malloc(cap);
					size_t o = 0;
					for (int q = 0; q < n; q++) {
						fill_bytes(in + o, sc[q] * es, seed, (uint64_t)rank,
						           (uint64_t)q);
						o += sc[q] * es;
					}
					o = 0;
					for (int q = 0; q < n; q++) {
						fill_bytes(want + o, rcn[q] * es, seed, (uint64_t)q,
						           (uint64_t)rank);
						o += rcn[q] * es;
					}
					kolo_status_t st;
					if (inplace) {
						memcpy(out, in, stot * es);
						st = kolo_ring_alltoallv(rc, out, sc, out, rcn, dt);
					} else {
						memset(out, 0x77, rtot * es);
						st = kolo_ring_alltoallv(rc, in, sc, out, rcn, dt);
					}
					if (status_ok(w, rank, rc, st, what) &&
					    memcmp(out, want, rtot * es) != 0)
						world_fail(w, "%s rank %d/%d: wrong data", what,
						           rank, n);
					free(in);
					free(out);
					free(want);
				}
			}
		}
	}
}

START_TEST(test_alltoallv)
{
	run(sizes[_i], alltoallv_body, NULL);
}
END_TEST

/* ---- barrier ---------------------------------------------------------- */

static atomic_int arrived;

/* No rank may leave barrier k before every rank has entered it. */
static void barrier_body(struct world *w, int rank, struct kolo_ring_comm *rc)
{
	if (rank == 0)
		atomic_store(&arrived, 0);
	world_sync(w);
	for (int k = 0; k < 50; k++) {
		atomic_fetch_add(&arrived, 1);
		kolo_status_t st = kolo_ring_barrier(rc);
		if (!status_ok(w, rank, rc, st, "barrier"))
			break;
		int a = atomic_load(&arrived);
		if (a < w->n * (k + 1)) {
			world_fail(w, "barrier %d: rank %d left with %d arrivals", k, rank, a);
			break;
		}
	}
	world_sync(w);
}

START_TEST(test_barrier)
{
	run(sizes[_i], barrier_body, NULL);
}
END_TEST

/* ---- size 1, errors and abort ----------------------------------------- */

START_TEST(test_size_one)
{
	struct kolo_ring_config cfg = base_cfg();
	cfg.size = 1;
	struct kolo_ring_comm *rc;
	struct kolo_errbuf eb;
	ck_assert_int_eq(kolo_ring_comm_create(&cfg, &rc, &eb), KOLO_OK);
	float in[5] = {1, 2, 3, 4, 5}, out[5];
	ck_assert_int_eq(kolo_ring_allreduce(rc, in, out, 5, KOLO_FLOAT32, KOLO_AVERAGE, 2, 3),
	                 KOLO_OK);
	for (int i = 0; i < 5; i++)
		ck_assert(out[i] == in[i] * 6);
	size_t one = 5;
	ck_assert_int_eq(kolo_ring_allgatherv(rc, in, out, &one, KOLO_FLOAT32), KOLO_OK);
	ck_assert(memcmp(in, out, sizeof(in)) == 0);
	ck_assert_int_eq(kolo_ring_reducescatter(rc, in, out, &one, KOLO_FLOAT32, KOLO_SUM, 1, 1),
	                 KOLO_OK);
	ck_assert(memcmp(in, out, sizeof(in)) == 0);
	ck_assert_int_eq(kolo_ring_alltoallv(rc, in, &one, out, &one, KOLO_FLOAT32), KOLO_OK);
	ck_assert(memcmp(in, out, sizeof(in)) == 0);
	ck_assert_int_eq(kolo_ring_broadcast(rc, out, 5, KOLO_FLOAT32, 0), KOLO_OK);
	ck_assert_int_eq(kolo_ring_barrier(rc), KOLO_OK);
	ck_assert_int_eq(kolo_ring_broadcast(rc, out, 5, KOLO_FLOAT32, 1), KOLO_EINVAL);
	ck_assert_int_eq(kolo_ring_allreduce(rc, in, out, 5, (kolo_dtype_t)99, KOLO_SUM, 1, 1),
	                 KOLO_EINVAL);
	/* Argument errors do not fail the comm. */
	ck_assert_int_eq(kolo_ring_barrier(rc), KOLO_OK);
	kolo_ring_comm_destroy(rc);
}
END_TEST

/* Rank 1 aborts rank 0's comm while rank 0 is (or is about to be) in an
 * allreduce: rank 0 fails with the abort status and stays failed; rank 1's
 * next collective fails too, because rank 0 reset its conns. */
static void abort_body(struct world *w, int rank, struct kolo_ring_comm *rc)
{
	float buf[4096] = {0};
	if (rank == 0) {
		kolo_status_t st =
		        kolo_ring_allreduce(rc, buf, buf, 4096, KOLO_FLOAT32, KOLO_SUM, 1, 1);
		if (st != KOLO_ESHUTDOWN)
			world_fail(w, "rank 0: allreduce returned %s", kolo_status_name(st));
		if (!strstr(kolo_ring_last_error(rc), "allreduce"))
			world_fail(w, "rank 0: last error '%s'", kolo_ring_last_error(rc));
		st = kolo_ring_barrier(rc);
		if (st != KOLO_ESHUTDOWN)
			world_fail(w, "rank 0: later barrier returned %s", kolo_status_name(st));
		if (kolo_ring_failed_peer(rc) != -1)
			world_fail(w, "rank 0: aborted, yet blames rank %d",
			           kolo_ring_failed_peer(rc));
	} else {
		kolo_ring_abort(w->rc[0], KOLO_ESHUTDOWN);
	}
	world_sync(w);
	if (rank == 1) {
		uint64_t t0 = kolo_now_ms();
		kolo_status_t st =
		        kolo_ring_allreduce(rc, buf, buf, 4096, KOLO_FLOAT32, KOLO_SUM, 1, 1);
		if (st == KOLO_OK)
			world_fail(w, "rank 1: allreduce without rank 0 succeeded");
		if (kolo_now_ms() - t0 > 5000)
			world_fail(w, "rank 1: took %llu ms to fail",
			           (unsigned long long)(kolo_now_ms() - t0));
		if (!strstr(kolo_ring_last_error(rc), "rank 0"))
			world_fail(w, "rank 1: last error '%s' does not name rank 0",
			           kolo_ring_last_error(rc));
		if (kolo_ring_failed_peer(rc) != 0)
			world_fail(w, "rank 1: blames rank %d", kolo_ring_failed_peer(rc));
	}
}

START_TEST(test_abort)
{
	struct world w;
	struct kolo_ring_config cfg = base_cfg();
	cfg.timeout_ms = 10000;
	world_init(&w, 2, &cfg);
	int failures = world_run(&w, abort_body, NULL);
	ck_assert_msg(failures == 0, "%d failures; first: %s", failures, w.first_failure);
}
END_TEST

/* Set once rank 2's helper has aborted it. */
static struct {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool done;
} midway = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false};

static void *abort_helper(void *rc)
{
	kolo_ring_abort(rc, KOLO_ESHUTDOWN);
	pthread_mutex_lock(&midway.lock);
	midway.done = true;
	pthread_cond_broadcast(&midway.cond);
	pthread_mutex_unlock(&midway.lock);
	return NULL;
}

/* Rank 2 of 4 is aborted by another thread, before or during its part of a
 * large allreduce (when exactly does not matter): its conns are reset, and
 * every rank, including those not adjacent to it, fails within 5 s with a
 * message. Rank 0 (not adjacent to 2) joins only once the abort is issued,
 * so the allreduce cannot complete before it, however the threads run. */
static void abort_midway_body(struct world *w, int rank, struct kolo_ring_comm *rc)
{
	size_t count = LARGE_COUNT * 4;
	float *buf = calloc(count, sizeof(float));
	pthread_t helper;
	if (rank == 2)
		pthread_create(&helper, NULL, abort_helper, rc);
	if (rank == 0) {
		struct timespec dl;
		clock_gettime(CLOCK_REALTIME, &dl);
		dl.tv_sec += 10;
		pthread_mutex_lock(&midway.lock);
		while (!midway.done &&
		       pthread_cond_timedwait(&midway.cond, &midway.lock, &dl) != ETIMEDOUT) {
		}
		bool done = midway.done;
		pthread_mutex_unlock(&midway.lock);
		if (!done)
			world_fail(w, "rank 0: rank 2's abort did not come within 10 s");
	}
	uint64_t t0 = kolo_now_ms();
	kolo_status_t st = kolo_ring_allreduce(rc, buf, buf, count, KOLO_FLOAT32, KOLO_SUM, 1, 1);
	uint64_t ms = kolo_now_ms() - t0;
	if (rank == 2)
		pthread_join(helper, NULL);
	if (st == KOLO_OK)
		world_fail(w, "rank %d: allreduce succeeded", rank);
	else if (rank == 2 && st != KOLO_ESHUTDOWN)
		world_fail(w, "rank 2: %s", kolo_status_name(st));
	if (ms > 5000)
		world_fail(w, "rank %d: took %llu ms to fail", rank, (unsigned long long)ms);
	if (!kolo_ring_last_error(rc)[0])
		world_fail(w, "rank %d: no last error", rank);
	int peer = kolo_ring_failed_peer(rc);
	if (rank == 2 ? peer != -1 : (peer < 0 || peer == rank))
		world_fail(w, "rank %d: blames rank %d", rank, peer);
	free(buf);
}

START_TEST(test_abort_midway)
{
	midway.done = false;
	struct world w;
	struct kolo_ring_config cfg = base_cfg();
	cfg.timeout_ms = 20000;
	world_init(&w, 4, &cfg);
	int failures = world_run(&w, abort_midway_body, NULL);
	ck_assert_msg(failures == 0, "%d failures; first: %s", failures, w.first_failure);
}
END_TEST

/* Rank 1 never joins the allreduce: rank 0 times out after timeout_ms and
 * names rank 1. */
static void silent_body(struct world *w, int rank, struct kolo_ring_comm *rc)
{
	if (rank == 0) {
		static float buf[1 << 16];
		uint64_t t0 = kolo_now_ms();
		kolo_status_t st =
		        kolo_ring_allreduce(rc, buf, buf, 1 << 16, KOLO_FLOAT32, KOLO_SUM, 1, 1);
		uint64_t ms = kolo_now_ms() - t0;
		if (st != KOLO_ETIMEDOUT)
			world_fail(w, "rank 0: %s: %s", kolo_status_name(st),
			           kolo_ring_last_error(rc));
		if (ms < 400 || ms > 5000)
			world_fail(w, "rank 0: timed out after %llu ms", (unsigned long long)ms);
		if (kolo_ring_failed_peer(rc) != 1)
			world_fail(w, "rank 0: blames rank %d", kolo_ring_failed_peer(rc));
	}
}

START_TEST(test_silent_peer)
{
	struct world w;
	struct kolo_ring_config cfg = base_cfg();
	cfg.timeout_ms = 500;
	world_init(&w, 2, &cfg);
	int failures = world_run(&w, silent_body, NULL);
	ck_assert_msg(failures == 0, "%d failures; first: %s", failures, w.first_failure);
}
END_TEST

/* Rank 0 passes half the count of the others (or, in the second form, runs
 * two allreduces of half where they run one: what a rank staging device
 * memory chunk by chunk does beside ranks with host memory). With 4 KiB
 * segments every message is 4 KiB on every rank, so only the streams'
 * descriptions can tell. Ranks 0 and 1, whose left neighbours differ from
 * them, are the ones that can see it: whichever checks first fails with
 * KOLO_EMISMATCH naming that neighbour and closes its conns, so the other
 * may see the closed conn first. Every rank returns an error, none waits out
 * the timeout, and none returns a result. */
static atomic_int mismatch_seen;

static void mismatch_body(struct world *w, int rank, struct kolo_ring_comm *rc)
{
	const bool chunked = *(const bool *)w->arg;
	const size_t full = 4 * 4096; /* floats: 4 blocks of 4 segments of 4 KiB */
	float *buf = calloc(full, sizeof(float));
	if (!buf) {
		world_fail(w, "rank %d: out of memory", rank);
		return;
	}
	uint64_t t0 = kolo_now_ms();
	kolo_status_t st;
	if (rank == 0) {
		st = kolo_ring_allreduce(rc, buf, buf, full / 2, KOLO_FLOAT32, KOLO_SUM, 1, 1);
		if (chunked && st == KOLO_OK)
			st = kolo_ring_allreduce(rc, buf + full / 2, buf + full / 2, full / 2,
			                         KOLO_FLOAT32, KOLO_SUM, 1, 1);
	} else {
		st = kolo_ring_allreduce(rc, buf, buf, full, KOLO_FLOAT32, KOLO_SUM, 1, 1);
	}
	uint64_t ms = kolo_now_ms() - t0;
	const char *err = kolo_ring_last_error(rc);
	if (st == KOLO_OK)
		world_fail(w, "rank %d: the allreduce succeeded", rank);
	if (st == KOLO_EMISMATCH) {
		char want[32];
		snprintf(want, sizeof(want), "rank %d runs", rank == 0 ? 3 : 0);
		if (rank > 1 || !strstr(err, want) || !strstr(err, "elements"))
			world_fail(w, "rank %d: %s", rank, err);
		atomic_fetch_add(&mismatch_seen, 1);
	}
	if (ms > 4000)
		world_fail(w, "rank %d: took %llu ms to fail", rank, (unsigned long long)ms);
	free(buf);
}

/* Runs body on 4 ranks; it must find no failure, and some rank must have
 * counted a KOLO_EMISMATCH in mismatch_seen. */
static void run_mismatch(world_body_fn body, void *arg)
{
	struct world w;
	struct kolo_ring_config cfg = base_cfg();
	cfg.timeout_ms = 10000;
	world_init(&w, 4, &cfg);
	atomic_store(&mismatch_seen, 0);
	int failures = world_run(&w, body, arg);
	ck_assert_msg(failures == 0, "%d failures; first: %s", failures, w.first_failure);
	ck_assert_msg(atomic_load(&mismatch_seen) >= 1, "no rank reported KOLO_EMISMATCH");
}

START_TEST(test_count_mismatch)
{
	static bool chunked;
	chunked = _i == 1;
	run_mismatch(mismatch_body, &chunked);
}
END_TEST

/* Rank 2 broadcasts half the count of the others, in segments of the same
 * length: without the chain's description it took the first half as its
 * result and returned KOLO_OK, and the rest stayed in its conn. */
static void bcast_mismatch_body(struct world *w, int rank, struct kolo_ring_comm *rc)
{
	const size_t full = 4 * 4096; /* floats: 16 segments of 4 KiB */
	float *buf = calloc(full, sizeof(float));
	if (!buf) {
		world_fail(w, "rank %d: out of memory", rank);
		return;
	}
	uint64_t t0 = kolo_now_ms();
	kolo_status_t st =
	        kolo_ring_broadcast(rc, buf, rank == 2 ? full / 2 : full, KOLO_FLOAT32, 0);
	uint64_t ms = kolo_now_ms() - t0;
	const char *err = kolo_ring_last_error(rc);
	if (rank >= 2 && st == KOLO_OK)
		world_fail(w, "rank %d: the broadcast succeeded", rank);
	if (rank == 2 &&
	    (st != KOLO_EMISMATCH || !strstr(err, "rank 1 broadcasts 16384 elements") ||
	     !strstr(err, "this rank has 8192")))
		world_fail(w, "rank 2: %s: %s", kolo_status_name(st), err);
	if (st == KOLO_EMISMATCH)
		atomic_fetch_add(&mismatch_seen, 1);
	if (ms > 4000)
		world_fail(w, "rank %d: took %llu ms to fail", rank, (unsigned long long)ms);
	free(buf);
}

START_TEST(test_broadcast_count_mismatch)
{
	run_mismatch(bcast_mismatch_body, NULL);
}
END_TEST

static Suite *ring_matrix_suite(void)
{
	Suite *s = suite_create("ring_matrix");
	struct {
		const char *name;
		const TTest *test;
	} cases[] = {
	        {"allreduce_ring", test_allreduce_ring},
	        {"allreduce_small", test_allreduce_small},
	        {"allreduce_direct", test_allreduce_direct},
	        {"allreduce_pieces", test_allreduce_pieces},
	        {"allgatherv", test_allgatherv},
	        {"broadcast", test_broadcast},
	        {"reducescatter", test_reducescatter},
	        {"alltoallv", test_alltoallv},
	        {"barrier", test_barrier},
	};
	for (size_t i = 0; i < KOLO_ARRAY_SIZE(cases); i++) {
		TCase *tc = tcase_create(cases[i].name);
		tcase_set_timeout(tc, 120);
		tcase_add_loop_test(tc, cases[i].test, 0, (int)KOLO_ARRAY_SIZE(sizes));
		suite_add_tcase(s, tc);
	}
	TCase *tc = tcase_create("edges");
	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, test_size_one);
	tcase_add_test(tc, test_abort);
	tcase_add_test(tc, test_abort_midway);
	tcase_add_test(tc, test_silent_peer);
	tcase_add_loop_test(tc, test_count_mismatch, 0, 2);
	tcase_add_test(tc, test_broadcast_count_mismatch);
	suite_add_tcase(s, tc);
	return s;
}

KOLO_CHECK_MAIN(ring_matrix_suite)
