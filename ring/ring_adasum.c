/* Adasum (Maleki et al., "Scaling Distributed Training with Adaptive
 * Summation"): the allreduce whose pairwise combination of two gradients a
 * and b is
 *
 *     (1 - a.b / (2 |a|^2)) a + (1 - a.b / (2 |b|^2)) b
 *
 * (a coefficient stays 1 where its vector's squared norm is below 1e-8), with
 * the dot product and the norms in float64. Pairs combine over the
 * recursive-doubling tree of allreduce_rd (ring_allreduce.c): with p the
 * largest power of two <= n and e = n - p, ranks 2i and 2i+1 (i < e) first
 * combine into one (the lower rank's vector is a), then the p survivors
 * combine at distance 1, 2, 4, ... (the lower of each pair is a), and the
 * folded ranks get the result back. For a power of two this is Horovod's
 * tree ((0,1),(2,3)) then ((01),(23)); docs/collectives.md, "Adasum". Both
 * partners of a pair compute the same combination from the same operands, so
 * every rank holds identical bits. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ring_internal.h"

#define NORM_FLOOR 1e-8

/* The sums a.b, |a|^2 and |b|^2 in float64, over four interleaved partial
 * sums (a fixed order: every rank that combines the same operands gets the
 * same bits) so that the loop is not one long chain of dependent adds. */
#define DOTS(T, CONV)                                                                              \
	static void dots_##T(const void *pa, const void *pb, size_t n, double out[3])              \
	{                                                                                          \
		const T *a = pa, *b = pb;                                                          \
		double d[4] = {0}, x2[4] = {0}, y2[4] = {0};                                       \
		size_t i = 0;                                                                      \
		for (; i + 4 <= n; i += 4)                                                         \
			for (int k = 0; k < 4; k++) {                                              \
				double x = CONV(a[i + k]), y = CONV(b[i + k]);                     \
				d[k] += x * y;                                                     \
				x2[k] += x * x;                                                    \
				y2[k] += y * y;                                                    \
			}                                                                          \
		for (; i < n; i++) {                                                               \
			double x = CONV(a[i]), y = CONV(b[i]);                                     \
			d[0] += x * y;                                                             \
			x2[0] += x * x;                                                            \
			y2[0] += y * y;                                                            \
		}                                                                                  \
		out[0] = (d[0] + d[1]) + (d[2] + d[3]);                                            \
		out[1] = (x2[0] + x2[1]) + (x2[2] + x2[3]);                                        \
		out[2] = (y2[0] + y2[1]) + (y2[2] + y2[3]);                                        \
	}

/* dst = ca a + cb b, computed in float64 (float32 for the 16-bit types, as
 * kolo's other kernels do) and rounded to the dtype once. */
#define AXPBY(T, CONV, BACK)                                                                       \
	static void axpby_##T(void *pd, const void *pa, const void *pb, size_t n, double ca,       \
	                      double cb)                                                           \
	{                                                                                          \
		T *dst = pd;                                                                       \
		const T *a = pa, *b = pb;                                                          \
		for (size_t i = 0; i < n; i++)                                                     \
			dst[i] = BACK(ca * CONV(a[i]) + cb * CONV(b[i]));                          \
	}

#define ID(x)      ((double)(x))
#define TO_F32(x)  ((float)(x))
#define TO_F64(x)  (x)
#define F16(x)     ((double)kolo_f16_to_f32(x))
#define BF16(x)    ((double)kolo_bf16_to_f32(x))
#define BACK16(x)  kolo_f32_to_f16((float)(x))
#define BACKB16(x) kolo_f32_to_bf16((float)(x))

typedef uint16_t half_t;
typedef uint16_t bhalf_t;
DOTS(float, ID)
DOTS(double, ID)
DOTS(half_t, F16)
DOTS(bhalf_t, BF16)
AXPBY(float, ID, TO_F32)
AXPBY(double, ID, TO_F64)
AXPBY(half_t, F16, BACK16)
AXPBY(bhalf_t, BF16, BACKB16)

static void adasum_dots(const void *a, const void *b, size_t n, kolo_dtype_t dt, double s[3])
{
	switch (dt) {
	case KOLO_FLOAT16:
		dots_half_t(a, b, n, s);
		break;
	case KOLO_BFLOAT16:
		dots_bhalf_t(a, b, n, s);
		break;
	case KOLO_FLOAT32:
		dots_float(a, b, n, s);
		break;
	default:
		dots_double(a, b, n, s);
	}
}

/* dst = ca a + cb b with the coefficients of the sums s (a.b, |a|^2, |b|^2). */
static void adasum_apply(void *dst, const void *a, const void *b, size_t n, kolo_dtype_t dt,
                         const double s[3])
{
	double ca = s[1] >= NORM_FLOOR ? 1.0 - s[0] / s[1] * 0.5 : 1.0;
	double cb = s[2] >= NORM_FLOOR ? 1.0 - s[0] / s[2] * 0.5 : 1.0;
	switch (dt) {
	case KOLO_FLOAT16:
		axpby_half_t(dst, a, b, n, ca, cb);
		break;
	case KOLO_BFLOAT16:
		axpby_bhalf_t(dst, a, b, n, ca, cb);
		break;
	case KOLO_FLOAT32:
		axpby_float(dst, a, b, n, ca, cb);
		break;
	default:
		axpby_double(dst, a, b, n, ca, cb);
	}
}

void kolo_adasum_combine(void *dst, const void *a, const void *b, size_t count, kolo_dtype_t dt)
{
	double s[3];
	adasum_dots(a, b, count, dt, s);
	adasum_apply(dst, a, b, count, dt, s);
}

bool kolo_adasum_dtype(kolo_dtype_t dt)
{
	return dt == KOLO_FLOAT16 || dt == KOLO_BFLOAT16 || dt == KOLO_FLOAT32 ||
	       dt == KOLO_FLOAT64;
}

/* v <- the sum of v over the 2d newranks of this one's group (those that
 * agree with it above bit d), by recursive doubling: every member ends with
 * the same bits (each step adds two identical operands, commutatively). */
static kolo_status_t group_sum(struct kolo_ring_comm *rc, int newrank, int d, int rem, double v[3])
{
	for (int m = 1; m <= d; m <<= 1) {
		double o[3];
		KOLO_CHECK(ring_exchange(rc, ring_rd_member(newrank ^ m, rem), v, sizeof(o), o,
		                         sizeof(o)));
		for (int k = 0; k < 3; k++)
			v[k] += o[k];
	}
	return KOLO_OK;
}

/* The power-of-two part: vector halving, distance doubling (Horovod's
 * order). At distance d a pair holds the same piece of the two vectors the
 * level combines, a (the lower block's) and b (the higher's); each keeps half
 * of the piece and receives the partner's half of it, the pair's group of 2d
 * ranks sums the partial dot products and norms, and each combines its half.
 * Then the pieces are gathered back, distance halving. Each element is
 * combined by one rank, so every rank ends with the same bits. */
static kolo_status_t adasum_vhdd(struct kolo_ring_comm *rc, char *buf, char *tmp, size_t count,
                                 kolo_dtype_t dt, int newrank, int pof2, int rem)
{
	const size_t es = kolo_dtype_size(dt);
	size_t lo = 0, hi = count, los[32], his[32];
	int lv = 0;
	for (int d = 1; d < pof2; d <<= 1, lv++) {
		const int peer = ring_rd_member(newrank ^ d, rem);
		const size_t mid = lo + (hi - lo) / 2;
		const bool lower = (newrank & d) == 0;
		const size_t klo = lower ? lo : mid, khi = lower ? mid : hi;
		const size_t slo = lower ? mid : lo, shi = lower ? hi : mid;
		KOLO_CHECK(ring_exchange(rc, peer, buf + slo * es, (shi - slo) * es, tmp,
		                         (khi - klo) * es));
		const void *a = lower ? (void *)(buf + klo * es) : (void *)tmp;
		const void *b = lower ? (void *)tmp : (void *)(buf + klo * es);
		double sums[3];
		adasum_dots(a, b, khi - klo, dt, sums);
		KOLO_CHECK(group_sum(rc, newrank, d, rem, sums));
		adasum_apply(buf + klo * es, a, b, khi - klo, dt, sums);
		los[lv] = lo;
		his[lv] = hi;
		lo = klo;
		hi = khi;
	}
	for (int d = pof2 / 2; d >= 1; d >>= 1) {
		lv--;
		const size_t mid = los[lv] + (his[lv] - los[lv]) / 2;
		const bool lower = (newrank & d) == 0;
		const size_t olo = lower ? mid : los[lv], ohi = lower ? his[lv] : mid;
		KOLO_CHECK(ring_exchange(rc, ring_rd_member(newrank ^ d, rem), buf + lo * es,
		                         (hi - lo) * es, buf + olo * es, (ohi - olo) * es));
		lo = los[lv];
		hi = his[lv];
	}
	return KOLO_OK;
}

struct adasum_ctx {
	size_t count;
	kolo_dtype_t dtype;
};

/* buf <- adasum(lower, buf), the lower rank's vector as a. */
static void fold_adasum(void *arg, char *buf, char *lower)
{
	const struct adasum_ctx *c = arg;
	kolo_adasum_combine(buf, lower, buf, c->count, c->dtype);
}

/* buf (count elements of this rank) <- the Adasum of every rank's. */
kolo_status_t ring_adasum(struct kolo_ring_comm *rc, char *buf, size_t count, kolo_dtype_t dtype)
{
	const size_t bytes = count * kolo_dtype_size(dtype);
	struct adasum_ctx c = {count, dtype};
	struct ring_rd rd;
	bool done;
	KOLO_CHECK(ring_rd_begin(rc, buf, bytes, fold_adasum, &c, &rd, &done));
	if (done)
		return KOLO_OK;
	KOLO_CHECK(adasum_vhdd(rc, buf, rd.tmp, count, dtype, rd.newrank, rd.pof2, rd.rem));
	return ring_rd_end(rc, &rd, buf, bytes);
}
