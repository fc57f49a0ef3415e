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

static double get(const void *p, size_t i, kolo_dtype_t dt)
{
	switch (dt) {
	case KOLO_FLOAT16:
		return kolo_f16_to_f32(((const uint16_t *)p)[i]);
	case KOLO_BFLOAT16:
		return kolo_bf16_to_f32(((const uint16_t *)p)[i]);
	case KOLO_FLOAT32:
		return ((const float *)p)[i];
	default:
		return ((const double *)p)[i];
	}
}

static void put(void *p, size_t i, kolo_dtype_t dt, double v)
{
	switch (dt) {
	case KOLO_FLOAT16:
		((uint16_t *)p)[i] = kolo_f32_to_f16((float)v);
		break;
	case KOLO_BFLOAT16:
		((uint16_t *)p)[i] = kolo_f32_to_bf16((float)v);
		break;
	case KOLO_FLOAT32:
		((float *)p)[i] = (float)v;
		break;
	default:
		((double *)p)[i] = v;
	}
}

void kolo_adasum_combine(void *dst, const void *a, const void *b, size_t count, kolo_dtype_t dt)
{
	double dot = 0, aa = 0, bb = 0;
	for (size_t i = 0; i < count; i++) {
		double x = get(a, i, dt), y = get(b, i, dt);
		dot += x * y;
		aa += x * x;
		bb += y * y;
	}
	double ca = aa >= NORM_FLOOR ? 1.0 - dot / aa * 0.5 : 1.0;
	double cb = bb >= NORM_FLOOR ? 1.0 - dot / bb * 0.5 : 1.0;
	for (size_t i = 0; i < count; i++)
		put(dst, i, dt, ca * get(a, i, dt) + cb * get(b, i, dt));
}

bool kolo_adasum_dtype(kolo_dtype_t dt)
{
	return dt == KOLO_FLOAT16 || dt == KOLO_BFLOAT16 || dt == KOLO_FLOAT32 ||
	       dt == KOLO_FLOAT64;
}

/* buf (count elements of this rank) <- the Adasum of every rank's. */
kolo_status_t ring_adasum(struct kolo_ring_comm *rc, char *buf, size_t count, kolo_dtype_t dtype)
{
	const int n = rc->size, r = rc->rank;
	const size_t bytes = count * kolo_dtype_size(dtype);
	int pof2 = 1;
	while (pof2 * 2 <= n)
		pof2 *= 2;
	const int rem = n - pof2;
	int peers[40] = {0}, np = 0, newrank;
	if (r < 2 * rem) {
		peers[np++] = r % 2 == 0 ? r + 1 : r - 1;
		newrank = r % 2 == 0 ? -1 : r / 2;
	} else {
		newrank = r - rem;
	}
	for (int mask = 1; newrank >= 0 && mask < pof2; mask <<= 1) {
		int pn = newrank ^ mask;
		peers[np++] = pn < rem ? pn * 2 + 1 : pn + rem;
	}
	KOLO_CHECK(ring_ensure_conns(rc, peers, np));
	KOLO_CHECK(ring_scratch_reserve(rc, KOLO_MAX(bytes, 1)));
	char *tmp = rc->scratch;
	if (r < 2 * rem && r % 2 == 0) {
		KOLO_CHECK(ring_exchange(rc, r + 1, buf, bytes, NULL, 0));
		return ring_exchange(rc, r + 1, NULL, 0, buf, bytes);
	}
	if (r < 2 * rem) {
		KOLO_CHECK(ring_exchange(rc, r - 1, NULL, 0, tmp, bytes));
		kolo_adasum_combine(buf, tmp, buf, count, dtype);
	}
	for (int mask = 1; mask < pof2; mask <<= 1) {
		int pn = newrank ^ mask;
		int p = pn < rem ? pn * 2 + 1 : pn + rem;
		KOLO_CHECK(ring_exchange(rc, p, buf, bytes, tmp, bytes));
		if (p < r)
			kolo_adasum_combine(buf, tmp, buf, count, dtype);
		else
			kolo_adasum_combine(buf, buf, tmp, count, dtype);
	}
	if (r < 2 * rem)
		KOLO_CHECK(ring_exchange(rc, r - 1, buf, bytes, NULL, 0));
	return KOLO_OK;
}
