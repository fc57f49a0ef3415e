/* KOLO_ADASUM: forked ranks (bootstrap API, two "hosts") on 2, 3, 4, 5 and 8
 * ranks run blocking, async (two tensors in flight, never fused) and grouped
 * Adasum allreduces of float64, float32 and bfloat16 vectors; each result is
 * compared with a reference computed here in long double over the tree the
 * docs define (pairs (2i, 2i+1) folded first when the size is not a power of
 * two, then distance 1, 2, 4, ...), and must be bitwise identical on every
 * rank. Then the arguments Adasum refuses. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kolo/async.h"
#include "kolo/bootstrap.h"
#include "bootstrap_fork.h"
#include "ring.h"
#include "testutil.h"

#define COUNT 1000
#define MAXN  8

/* Rank r's input: a shared direction plus a rank's own part, so that the
 * dot products are far from 0 and the coefficients far from 1. */
static double input(int rank, int tensor, int i)
{
	return sin(0.01 * i + tensor) + 0.5 * cos(0.37 * i * (rank + 1) + rank) + 0.1 * rank;
}

typedef long double ld;

static void combine(ld *a, const ld *b, size_t n) /* a <- adasum(a, b) */
{
	ld dot = 0, aa = 0, bb = 0;
	for (size_t i = 0; i < n; i++) {
		dot += a[i] * b[i];
		aa += a[i] * a[i];
		bb += b[i] * b[i];
	}
	ld ca = aa >= 1e-8 ? 1 - dot / aa / 2 : 1, cb = bb >= 1e-8 ? 1 - dot / bb / 2 : 1;
	for (size_t i = 0; i < n; i++)
		a[i] = ca * a[i] + cb * b[i];
}

/* The tree over v[0..n-1] (each COUNT long); the result in v[0]. */
static void reference(ld v[][COUNT], int n)
{
	int p = 1;
	while (p * 2 <= n)
		p *= 2;
	int e = n - p, idx[MAXN], k = 0;
	for (int i = 0; i < e; i++) {
		combine(v[2 * i], v[2 * i + 1], COUNT);
		idx[k++] = 2 * i;
	}
	for (int r = 2 * e; r < n; r++)
		idx[k++] = r;
	for (int d = 1; d < p; d *= 2)
		for (int i = 0; i < p; i += 2 * d)
			combine(v[idx[i]], v[idx[i + d]], COUNT);
	if (idx[0] != 0)
		memcpy(v[0], v[idx[0]], sizeof(v[0]));
}

struct shared {
	struct bootstrap_fork base;
	double out[MAXN][3][COUNT]; /* per rank: blocking f64, async A, async B */
	float f32[MAXN][COUNT];
	double grouped[MAXN][2][COUNT];
};

static int run_rank(struct shared *x, int rank, int n)
{
	struct kolo_bootstrap_config cfg = {
	        .rank = rank, .size = n, .job = "adasum", .token = "t", .timeout_ms = 20000};
	kolo_comm_t *comm;
	if (bootstrap_fork_join(&x->base, &cfg, rank < (n + 1) / 2 ? "hostA" : "hostB", &comm))
		return 10;
	int bad = 0;
	static double v[3][COUNT], g[2][COUNT];
	static float f[COUNT];
	for (int t = 0; t < 3; t++)
		for (int i = 0; i < COUNT; i++)
			v[t][i] = input(rank, t, i);
	for (int i = 0; i < COUNT; i++) {
		f[i] = (float)input(rank, 0, i);
		g[0][i] = input(rank, 3, i);
		g[1][i] = input(rank, 4, i);
	}
	if (kolo_allreduce(comm, v[0], x->out[rank][0], COUNT, KOLO_FLOAT64, KOLO_ADASUM))
		bad = 11;
	/* Two tensors in flight at once: each its own Adasum, never fused. */
	kolo_handle_t *ha, *hb;
	if (!bad && (kolo_allreduce_async(comm, "a", v[1], x->out[rank][1], COUNT, KOLO_FLOAT64,
	                                  KOLO_ADASUM, 1.0, 1.0, NULL, NULL, &ha) ||
	             kolo_allreduce_async(comm, "b", v[2], x->out[rank][2], COUNT, KOLO_FLOAT64,
	                                  KOLO_ADASUM, 1.0, 1.0, NULL, NULL, &hb) ||
	             kolo_wait(ha) || kolo_wait(hb)))
		bad = 12;
	if (!bad && kolo_allreduce(comm, f, x->f32[rank], COUNT, KOLO_FLOAT32, KOLO_ADASUM))
		bad = 13;
	const char *names[] = {"g0", "g1"};
	const void *sends[] = {g[0], g[1]};
	void *recvs[] = {x->grouped[rank][0], x->grouped[rank][1]};
	size_t counts[] = {COUNT, COUNT};
	kolo_handle_t *hg;
	if (!bad &&
	    (kolo_grouped_allreduce_async(comm, 2, names, sends, recvs, counts, KOLO_FLOAT64,
	                                  KOLO_ADASUM, 1.0, 1.0, NULL, NULL, &hg) ||
	     kolo_wait(hg)))
		bad = 14;
	/* What is refused, on every rank alike: integers, reducescatter. */
	int32_t iv[4] = {0};
	if (!bad && (kolo_allreduce(comm, iv, iv, 4, KOLO_INT32, KOLO_ADASUM) != KOLO_EINVAL ||
	             !strstr(kolo_last_error(comm), "adasum takes float16")))
		bad = 15;
	if (!bad && kolo_reducescatter(comm, v[0], v[0], (size_t)n, KOLO_FLOAT64, KOLO_ADASUM) !=
	                    KOLO_EINVAL)
		bad = 16;
	pthread_barrier_wait(&x->base.barrier);
	kolo_finalize(comm);
	return bad;
}

static double max_rel(const double *got, const ld *want)
{
	ld norm = 0, err = 0;
	for (int i = 0; i < COUNT; i++) {
		norm = fmaxl(norm, fabsl(want[i]));
		err = fmaxl(err, fabsl((ld)got[i] - want[i]));
	}
	return (double)(err / norm);
}

START_TEST(test_adasum)
{
	static const int sizes[] = {2, 3, 4, 5, 8};
	const int n = sizes[_i];
	struct shared *x = bootstrap_fork_new(n, sizeof(*x));
	ck_assert_ptr_nonnull(x);
	pid_t pid[MAXN];
	for (int r = 0; r < n; r++) {
		pid[r] = fork();
		ck_assert_int_ge(pid[r], 0);
		if (pid[r] == 0)
			_exit(run_rank(x, r, n));
	}
	for (int r = 0; r < n; r++) {
		int ws;
		ck_assert_int_eq(waitpid(pid[r], &ws, 0), pid[r]);
		ck_assert_msg(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "n=%d rank %d: 0x%x", n, r,
		              ws);
	}
	static ld v[MAXN][COUNT];
	static const int tensors[] = {0, 1, 2, 3, 4};
	for (int k = 0; k < 5; k++) {
		for (int r = 0; r < n; r++)
			for (int i = 0; i < COUNT; i++)
				v[r][i] = input(r, tensors[k], i);
		reference(v, n);
		for (int r = 0; r < n; r++) {
			const double *got = k < 3 ? x->out[r][k] : x->grouped[r][k - 3];
			double e = max_rel(got, v[0]);
			ck_assert_msg(e < 1e-12, "n=%d tensor %d rank %d: relative error %g", n, k,
			              r, e);
			ck_assert(memcmp(got, k < 3 ? x->out[0][k] : x->grouped[0][k - 3],
			                 COUNT * sizeof(double)) == 0);
		}
	}
	/* float32: within float32's roundoff of the float64 tree of the
	 * float32 inputs, identical on every rank. */
	for (int r = 0; r < n; r++)
		for (int i = 0; i < COUNT; i++)
			v[r][i] = (float)input(r, 0, i);
	reference(v, n);
	for (int r = 0; r < n; r++) {
		double got[COUNT];
		for (int i = 0; i < COUNT; i++)
			got[i] = x->f32[r][i];
		ck_assert_msg(max_rel(got, v[0]) < 1e-5, "n=%d float32 rank %d", n, r);
		ck_assert(memcmp(x->f32[r], x->f32[0], sizeof(x->f32[0])) == 0);
	}
	munmap(x, sizeof(*x));
}
END_TEST

/* The combination itself: orthogonal vectors add, equal ones average,
 * opposite ones cancel, and a zero vector leaves the other unchanged. */
START_TEST(test_combine)
{
	double a[2] = {1, 0}, b[2] = {0, 2}, d[2];
	kolo_adasum_combine(d, a, b, 2, KOLO_FLOAT64);
	ck_assert(d[0] == 1 && d[1] == 2);
	double c[2] = {3, 4};
	kolo_adasum_combine(d, c, c, 2, KOLO_FLOAT64);
	ck_assert(d[0] == 3 && d[1] == 4);
	double z[2] = {0, 0};
	kolo_adasum_combine(d, z, c, 2, KOLO_FLOAT64);
	ck_assert(d[0] == 3 && d[1] == 4);
	double m[2] = {-3, -4};
	kolo_adasum_combine(d, c, m, 2, KOLO_FLOAT64);
	ck_assert(fabs(d[0]) < 1e-15 && fabs(d[1]) < 1e-15);
	uint16_t h[2] = {kolo_f32_to_bf16(1.0f), kolo_f32_to_bf16(0.0f)}, hd[2];
	kolo_adasum_combine(hd, h, h, 2, KOLO_BFLOAT16);
	ck_assert(kolo_bf16_to_f32(hd[0]) == 1.0f && kolo_bf16_to_f32(hd[1]) == 0.0f);
	kolo_op_t op;
	ck_assert_int_eq(kolo_op_parse("adasum", &op), KOLO_OK);
	ck_assert_int_eq(op, KOLO_ADASUM);
	ck_assert_str_eq(kolo_op_name(KOLO_ADASUM), "adasum");
}
END_TEST

static Suite *adasum_suite(void)
{
	Suite *s = suite_create("adasum");
	TCase *tc = tcase_create("adasum");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_combine);
	tcase_add_loop_test(tc, test_adasum, 0, 5);
	suite_add_tcase(s, tc);
	return s;
}

KOLO_CHECK_MAIN(adasum_suite)
