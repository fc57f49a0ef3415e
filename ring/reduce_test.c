/* Reduction kernels and 16-bit float conversions against independent
 * references computed in double with branchy, obviously-correct code. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ring.h"
#include "testutil.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define RANDOM_FLOATS 200000
#else
#define RANDOM_FLOATS 1000000
#endif

/* ---- references ------------------------------------------------------- */

static double ref_h2d(uint16_t h)
{
	int sign = h >> 15, e = (h >> 10) & 31, m = h & 1023;
	double v;
	if (e == 31)
		v = m ? NAN : INFINITY;
	else if (e == 0)
		v = ldexp(m, -24);
	else
		v = ldexp(1024 + m, e - 25);
	return sign ? -v : v;
}

static double ref_b2d(uint16_t h)
{
	int sign = h >> 15, e = (h >> 7) & 255, m = h & 127;
	double v;
	if (e == 255)
		v = m ? NAN : INFINITY;
	else if (e == 0)
		v = ldexp(m, -133);
	else
		v = ldexp(128 + m, e - 134);
	return sign ? -v : v;
}

/* Rounds x to a binary float with `mbits` stored mantissa bits, exponent
 * bias `bias` and `ebits` exponent bits, to nearest even. */
static uint16_t ref_round(double x, int mbits, int ebits, int bias)
{
	uint16_t sign = signbit(x) ? (uint16_t)(1u << (mbits + ebits)) : 0;
	uint16_t expmax = (uint16_t)((1u << ebits) - 1);
	if (isnan(x))
		return (uint16_t)(sign | (expmax << mbits) | (1u << (mbits - 1)));
	double ax = fabs(x);
	if (isinf(x))
		return (uint16_t)(sign | (expmax << mbits));
	int emin = 1 - bias;
	double q;
	int e;
	if (ax < ldexp(1, emin)) {
		e = emin;
		q = nearbyint(ax / ldexp(1, emin - mbits)); /* subnormal units */
		if (q >= ldexp(1, mbits))
			return (uint16_t)(sign |
			                  (1u << mbits)); /* rounds up to the smallest normal */
		return (uint16_t)(sign | (uint16_t)q);
	}
	frexp(ax, &e);
	e -= 1; /* ax in [2^e, 2^(e+1)) */
	q = nearbyint(ax / ldexp(1, e - mbits));
	if (q >= ldexp(1, mbits + 1)) {
		q /= 2;
		e++;
	}
	if (e + bias >= expmax)
		return (uint16_t)(sign | (expmax << mbits));
	return (uint16_t)(sign | ((uint16_t)(e + bias) << mbits) | ((uint16_t)q - (1u << mbits)));
}

static uint16_t ref_d2h(double x)
{
	return ref_round(x, 10, 5, 15);
}

static uint16_t ref_d2b(double x)
{
	return ref_round(x, 7, 8, 127);
}

static bool h_isnan(uint16_t h)
{
	return (h & 0x7c00) == 0x7c00 && (h & 0x3ff);
}

static bool b_isnan(uint16_t h)
{
	return (h & 0x7f80) == 0x7f80 && (h & 0x7f);
}

/* ---- conversions ------------------------------------------------------ */

START_TEST(test_f16_exhaustive)
{
	for (uint32_t i = 0; i < 65536; i++) {
		uint16_t h = (uint16_t)i;
		float f = kolo_f16_to_f32(h);
		double ref = ref_h2d(h);
		if (h_isnan(h)) {
			ck_assert(isnan(f));
			ck_assert(h_isnan(kolo_f32_to_f16(f)));
			ck_assert_int_eq(kolo_f32_to_f16(f) >> 15, h >> 15);
			continue;
		}
		ck_assert_msg((double)f == ref && !signbit(f) == !signbit(ref), "h=%04x", h);
		ck_assert_msg(kolo_f32_to_f16(f) == h, "round trip of %04x", h);
	}
}
END_TEST

/* Midpoints between neighbours round to the even one; one float ulp off the
 * midpoint rounds to the nearer one. Covers subnormals and overflow. */
START_TEST(test_f16_rounding)
{
	for (uint32_t h = 0; h < 0x7c00; h++) {
		float a = (float)ref_h2d((uint16_t)h);
		float b = h + 1 == 0x7c00 ? 65536.0f : (float)ref_h2d((uint16_t)(h + 1));
		float mid = (a + b) / 2;
		for (int s = 0; s < 2; s++) {
			float sg = s ? -1.0f : 1.0f;
			uint16_t sb = s ? 0x8000 : 0;
			uint16_t even = (uint16_t)((h & 1 ? h + 1 : h) | sb);
			ck_assert_msg(kolo_f32_to_f16(sg * mid) == even, "mid above %04x", h);
			ck_assert(kolo_f32_to_f16(sg * nextafterf(mid, 0)) == (uint16_t)(h | sb));
			ck_assert(kolo_f32_to_f16(sg * nextafterf(mid, INFINITY)) ==
			          (uint16_t)((h + 1) | sb));
		}
	}
	ck_assert_uint_eq(kolo_f32_to_f16(INFINITY), 0x7c00);
	ck_assert_uint_eq(kolo_f32_to_f16(-INFINITY), 0xfc00);
	ck_assert_uint_eq(kolo_f32_to_f16(1e30f), 0x7c00);
	ck_assert_uint_eq(kolo_f32_to_f16(1e-30f), 0);
	ck_assert_uint_eq(kolo_f32_to_f16(-0.0f), 0x8000);
	ck_assert(h_isnan(kolo_f32_to_f16(NAN)));
	/* Random floats against the reference rounding. */
	srand(7);
	for (int i = 0; i < RANDOM_FLOATS; i++) {
		uint32_t u = ((uint32_t)rand() << 16) ^ (uint32_t)rand();
		float f;
		memcpy(&f, &u, 4);
		if (isnan(f))
			continue;
		ck_assert_msg(kolo_f32_to_f16(f) == ref_d2h(f), "%a", (double)f);
	}
}
END_TEST

START_TEST(test_bf16_exhaustive)
{
	for (uint32_t i = 0; i < 65536; i++) {
		uint16_t h = (uint16_t)i;
		float f = kolo_bf16_to_f32(h);
		double ref = ref_b2d(h);
		if (b_isnan(h)) {
			ck_assert(isnan(f));
			ck_assert(b_isnan(kolo_f32_to_bf16(f)));
			continue;
		}
		ck_assert_msg((double)f == ref && !signbit(f) == !signbit(ref), "h=%04x", h);
		ck_assert_msg(kolo_f32_to_bf16(f) == h, "round trip of %04x", h);
		if (h < 0x7f80) {
			float a = f, b = h + 1 == 0x7f80 ? ldexpf(1, 127) * 2.0f
			                                 : kolo_bf16_to_f32((uint16_t)(h + 1));
			if (isinf(b))
				continue;
			float mid = a + (b - a) / 2;
			uint16_t even = (uint16_t)(h & 1 ? h + 1 : h);
			ck_assert_msg(kolo_f32_to_bf16(mid) == even, "mid above %04x", h);
			ck_assert(kolo_f32_to_bf16(nextafterf(mid, 0)) == h);
			ck_assert(kolo_f32_to_bf16(nextafterf(mid, INFINITY)) == h + 1);
		}
	}
	srand(8);
	for (int i = 0; i < RANDOM_FLOATS; i++) {
		uint32_t u = ((uint32_t)rand() << 16) ^ (uint32_t)rand();
		float f;
		memcpy(&f, &u, 4);
		if (isnan(f))
			continue;
		ck_assert_msg(kolo_f32_to_bf16(f) == ref_d2b(f), "%a", (double)f);
	}
	ck_assert_uint_eq(kolo_f32_to_bf16(3.4e38f), 0x7f80); /* rounds up to inf */
}
END_TEST

/* ---- kernels ---------------------------------------------------------- */

static uint64_t rnd64(void)
{
	return ((uint64_t)rand() << 42) ^ ((uint64_t)rand() << 21) ^ (uint64_t)rand();
}

/* A random element; floats are finite (no NaN), any exponent. */
static void fill_random(void *buf, size_t n, kolo_dtype_t dt)
{
	size_t es = kolo_dtype_size(dt);
	for (size_t i = 0; i < n; i++) {
		uint64_t u = rnd64();
		if (dt == KOLO_FLOAT16 && ((u >> 10) & 31) == 31)
			u &= ~(uint64_t)(1 << 14);
		if (dt == KOLO_BFLOAT16 && ((u >> 7) & 255) == 255)
			u &= ~(uint64_t)(1 << 14);
		if (dt == KOLO_FLOAT32) {
			float f = (float)((double)(int32_t)u / 65536.0) *
			          ldexpf(1, (int)(u >> 40) % 40 - 20);
			memcpy(&u, &f, 4);
		}
		if (dt == KOLO_FLOAT64) {
			double d = (double)(int32_t)u * ldexp(1, (int)(u >> 40) % 200 - 100);
			memcpy(&u, &d, 8);
		}
		memcpy((char *)buf + i * es, &u, es);
	}
}

static double op_d(kolo_op_t op, double d, double s)
{
	switch (op) {
	case KOLO_SUM:
	case KOLO_AVERAGE:
		return d + s;
	case KOLO_PRODUCT:
		return d * s;
	case KOLO_MIN:
		return s < d ? s : d;
	default:
		return s > d ? s : d;
	}
}

static uint64_t op_u(kolo_op_t op, uint64_t d, uint64_t s, int64_t di, int64_t si, bool sgn)
{
	switch (op) {
	case KOLO_SUM:
	case KOLO_AVERAGE:
		return d + s;
	case KOLO_PRODUCT:
		return d * s;
	case KOLO_MIN:
		return sgn ? (uint64_t)(si < di ? si : di) : (s < d ? s : d);
	default:
		return sgn ? (uint64_t)(si > di ? si : di) : (s > d ? s : d);
	}
}

/* The expected d op s for one element, written into out. */
static void ref_elem(kolo_dtype_t dt, kolo_op_t op, const void *d, const void *s, void *out)
{
	switch (dt) {
	case KOLO_INT8: {
		int8_t a = *(const int8_t *)d, b = *(const int8_t *)s;
		*(uint8_t *)out = (uint8_t)op_u(op, (uint8_t)a, (uint8_t)b, a, b, true);
		break;
	}
	case KOLO_UINT8: {
		uint8_t a = *(const uint8_t *)d, b = *(const uint8_t *)s;
		*(uint8_t *)out = (uint8_t)op_u(op, a, b, a, b, false);
		break;
	}
	case KOLO_INT32: {
		int32_t a, b;
		memcpy(&a, d, 4);
		memcpy(&b, s, 4);
		uint32_t r = (uint32_t)op_u(op, (uint32_t)a, (uint32_t)b, a, b, true);
		memcpy(out, &r, 4);
		break;
	}
	case KOLO_INT64: {
		int64_t a, b;
		memcpy(&a, d, 8);
		memcpy(&b, s, 8);
		uint64_t r = op_u(op, (uint64_t)a, (uint64_t)b, a, b, true);
		memcpy(out, &r, 8);
		break;
	}
	case KOLO_FLOAT16:
	case KOLO_BFLOAT16: {
		uint16_t a, b, r;
		memcpy(&a, d, 2);
		memcpy(&b, s, 2);
		bool h = dt == KOLO_FLOAT16;
		/* float32 semantics: the float32 result, then rounded to 16 bits. */
		float f = (float)op_d(op, h ? ref_h2d(a) : ref_b2d(a), h ? ref_h2d(b) : ref_b2d(b));
		r = h ? ref_d2h(f) : ref_d2b(f);
		memcpy(out, &r, 2);
		break;
	}
	case KOLO_FLOAT32: {
		float a, b;
		memcpy(&a, d, 4);
		memcpy(&b, s, 4);
		float r = (float)op_d(op, a, b);
		memcpy(out, &r, 4);
		break;
	}
	default: {
		double a, b;
		memcpy(&a, d, 8);
		memcpy(&b, s, 8);
		double r = op_d(op, a, b);
		memcpy(out, &r, 8);
		break;
	}
	}
}

static bool same_elem(kolo_dtype_t dt, const void *a, const void *b)
{
	size_t es = kolo_dtype_size(dt);
	if (memcmp(a, b, es) == 0)
		return true;
	uint16_t x, y;
	switch (dt) {
	case KOLO_FLOAT16:
		memcpy(&x, a, 2);
		memcpy(&y, b, 2);
		return h_isnan(x) && h_isnan(y);
	case KOLO_BFLOAT16:
		memcpy(&x, a, 2);
		memcpy(&y, b, 2);
		return b_isnan(x) && b_isnan(y);
	case KOLO_FLOAT32: {
		float f, g;
		memcpy(&f, a, 4);
		memcpy(&g, b, 4);
		return isnan(f) && isnan(g);
	}
	case KOLO_FLOAT64: {
		double f, g;
		memcpy(&f, a, 8);
		memcpy(&g, b, 8);
		return isnan(f) && isnan(g);
	}
	default:
		return false;
	}
}

static unsigned long long bits(const void *p, size_t es)
{
	unsigned long long v = 0;
	memcpy(&v, p, es);
	return v;
}

static void check_kernels(kolo_dtype_t dt)
{
	size_t es = kolo_dtype_size(dt);
	srand(100 + (unsigned)dt);
	const size_t counts[] = {0, 1, 2, 3, 7, 15, 16, 17, 31, 33, 1003, 4099};
	for (int op = 0; op < KOLO_OP_COUNT; op++) {
		for (size_t ci = 0; ci < KOLO_ARRAY_SIZE(counts); ci++) {
			size_t n = counts[ci];
			char *d = malloc(n * es + 8), *s = malloc(n * es + 8),
			     *e = malloc(es * n + 8);
			fill_random(d, n, dt);
			fill_random(s, n, dt);
			for (size_t i = 0; i < n; i++)
				ref_elem(dt, (kolo_op_t)op, d + i * es, s + i * es, e + i * es);
			char *d0 = malloc(n * es + 8), *o = malloc(n * es + 8);
			memcpy(d0, d, n * es);
			/* The three-operand form into a separate buffer, before d changes. */
			kolo_reduce3(o, d, s, n, dt, (kolo_op_t)op);
			kolo_reduce(d, s, n, dt, (kolo_op_t)op);
			ck_assert_msg(n == 0 || memcmp(o, d, n * es) == 0,
			              "%s %s n=%zu: reduce3 differs from reduce",
			              kolo_dtype_name(dt), kolo_op_name((kolo_op_t)op), n);
			/* dst == a is the in-place form. */
			memcpy(o, d0, n * es);
			kolo_reduce3(o, o, s, n, dt, (kolo_op_t)op);
			ck_assert_msg(n == 0 || memcmp(o, d, n * es) == 0,
			              "%s %s n=%zu: reduce3 in place differs", kolo_dtype_name(dt),
			              kolo_op_name((kolo_op_t)op), n);
			free(o);
			for (size_t i = 0; i < n; i++)
				ck_assert_msg(same_elem(dt, d + i * es, e + i * es),
				              "%s %s n=%zu i=%zu: %llx op %llx = %llx, want %llx",
				              kolo_dtype_name(dt), kolo_op_name((kolo_op_t)op), n,
				              i, bits(d0 + i * es, es), bits(s + i * es, es),
				              bits(d + i * es, es), bits(e + i * es, es));
			free(d0);
			free(d);
			free(s);
			free(e);
		}
	}
}

START_TEST(test_kernels)
{
	check_kernels((kolo_dtype_t)_i);
}
END_TEST

/* float16 again without the F16C instructions (this process only: Check
 * forks per test). */
START_TEST(test_kernels_portable)
{
	kolo_reduce_force_portable(true);
	check_kernels(KOLO_FLOAT16);
	check_kernels(KOLO_BFLOAT16);
}
END_TEST

START_TEST(test_integer_wrap)
{
	int8_t a[3] = {127, -128, 100}, b[3] = {1, -1, 100};
	kolo_reduce(a, b, 3, KOLO_INT8, KOLO_SUM);
	ck_assert_int_eq(a[0], -128);
	ck_assert_int_eq(a[1], 127);
	ck_assert_int_eq(a[2], -56);
	int64_t c = INT64_MAX, d = 2;
	kolo_reduce(&c, &d, 1, KOLO_INT64, KOLO_PRODUCT);
	ck_assert(c == -2);
	int32_t e = INT32_MIN, f = -1;
	kolo_reduce(&e, &f, 1, KOLO_INT32, KOLO_PRODUCT);
	ck_assert(e == INT32_MIN);
}
END_TEST

/* bfloat16 and float16 are combined in float32 and rounded once. */
START_TEST(test_half_accumulation)
{
	uint16_t a = kolo_f32_to_bf16(256.0f), b = kolo_f32_to_bf16(1.0f);
	kolo_reduce(&a, &b, 1, KOLO_BFLOAT16, KOLO_SUM);
	ck_assert(kolo_bf16_to_f32(a) == 256.0f); /* 257 ties to even */
	a = kolo_f32_to_bf16(256.0f);
	b = kolo_f32_to_bf16(1.5f);
	kolo_reduce(&a, &b, 1, KOLO_BFLOAT16, KOLO_SUM);
	ck_assert(kolo_bf16_to_f32(a) == 258.0f);
	uint16_t h = kolo_f32_to_f16(2048.0f), one = kolo_f32_to_f16(1.0f);
	kolo_reduce(&h, &one, 1, KOLO_FLOAT16, KOLO_SUM);
	ck_assert(kolo_f16_to_f32(h) == 2048.0f);
	uint16_t big = kolo_f32_to_f16(60000.0f), two = kolo_f32_to_f16(2.0f);
	kolo_reduce(&big, &two, 1, KOLO_FLOAT16, KOLO_PRODUCT);
	ck_assert_uint_eq(big, 0x7c00);
}
END_TEST

START_TEST(test_scale)
{
	int8_t i8[4] = {100, -100, 3, -3};
	kolo_scale(i8, i8, 4, KOLO_INT8, 2.0);
	ck_assert(i8[0] == 127 && i8[1] == -128 && i8[2] == 6 && i8[3] == -6);
	int32_t i32[3] = {5, -5, 7}, o32[3];
	kolo_scale(o32, i32, 3, KOLO_INT32, 0.5);
	ck_assert(o32[0] == 3 && o32[1] == -3 && o32[2] == 4); /* half away from zero */
	int64_t i64 = INT64_MAX;
	kolo_scale(&i64, &i64, 1, KOLO_INT64, 4.0);
	ck_assert(i64 == 9223372036854774784LL);
	uint8_t u8 = 200;
	kolo_scale(&u8, &u8, 1, KOLO_UINT8, -1.0);
	ck_assert(u8 == 0);
	srand(3);
	for (int dt = KOLO_FLOAT16; dt <= KOLO_FLOAT64; dt++) {
		size_t es = kolo_dtype_size((kolo_dtype_t)dt), n = 1001;
		char *x = malloc(n * es), *y = malloc(n * es);
		fill_random(x, n, (kolo_dtype_t)dt);
		double factor = 1.0 / 3.0;
		kolo_scale(y, x, n, (kolo_dtype_t)dt, factor);
		for (size_t i = 0; i < n; i++) {
			char want[8];
			if (dt == KOLO_FLOAT16 || dt == KOLO_BFLOAT16) {
				uint16_t v, r;
				memcpy(&v, x + i * 2, 2);
				bool h = dt == KOLO_FLOAT16;
				float f = (float)((h ? ref_h2d(v) : ref_b2d(v)) *
				                  (double)(float)factor);
				r = h ? ref_d2h(f) : ref_d2b(f);
				memcpy(want, &r, 2);
			} else if (dt == KOLO_FLOAT32) {
				float v;
				memcpy(&v, x + i * 4, 4);
				float r = (float)(v * factor);
				memcpy(want, &r, 4);
			} else {
				double v;
				memcpy(&v, x + i * 8, 8);
				double r = v * factor;
				memcpy(want, &r, 8);
			}
			ck_assert_msg(same_elem((kolo_dtype_t)dt, y + i * es, want), "%s i=%zu",
			              kolo_dtype_name((kolo_dtype_t)dt), i);
		}
		free(x);
		free(y);
	}
}
END_TEST

static Suite *reduce_suite(void)
{
	Suite *s = suite_create("reduce");
	TCase *tc = tcase_create("conversions");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_f16_exhaustive);
	tcase_add_test(tc, test_f16_rounding);
	tcase_add_test(tc, test_bf16_exhaustive);
	suite_add_tcase(s, tc);
	tc = tcase_create("kernels");
	tcase_set_timeout(tc, 60);
	tcase_add_loop_test(tc, test_kernels, 0, KOLO_DTYPE_COUNT);
	tcase_add_test(tc, test_kernels_portable);
	tcase_add_test(tc, test_integer_wrap);
	tcase_add_test(tc, test_half_accumulation);
	tcase_add_test(tc, test_scale);
	suite_add_tcase(s, tc);
	return s;
}

KOLO_CHECK_MAIN(reduce_suite)
