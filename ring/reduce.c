/* Reduction kernels. Every kernel is a plain loop over restrict pointers with
 * no branch in its body, so GCC -O3 vectorises it (checked with
 * -fopt-info-vec-optimized; see docs/collectives.md). Integer arithmetic goes
 * through the unsigned type of the same width, so sums and products wrap in
 * two's complement without undefined behaviour. float16 and bfloat16 are
 * widened to float32, combined, and rounded back to nearest even, with the
 * branch-free bit arithmetic below (after Maratyszcza's FP16 library). */
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "ring.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#define HAVE_F16C_KERNELS 1
#endif

static inline uint32_t f32_bits(float f)
{
	uint32_t u;
	memcpy(&u, &f, sizeof(u));
	return u;
}

static inline float f32_from(uint32_t u)
{
	float f;
	memcpy(&f, &u, sizeof(f));
	return f;
}

/* cond ? a : b without a branch (GCC keeps some ?: on floats as jumps,
 * which stops vectorisation). */
static inline uint32_t sel(bool cond, uint32_t a, uint32_t b)
{
	const uint32_t mask = 0u - (uint32_t)cond;
	return (a & mask) | (b & ~mask);
}

static inline float h2f(uint16_t h)
{
	const uint32_t w = (uint32_t)h << 16;
	const uint32_t sign = w & 0x80000000u;
	const uint32_t two_w = w + w;
	/* Normal (and Inf/NaN): shift exponent and mantissa into place and
	 * rebias by multiplying with 2^-112 (exact). */
	const float normal = f32_from((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
	/* Subnormal: place the mantissa under a magic exponent and subtract. */
	const float sub = f32_from((two_w >> 17) | (126u << 23)) - 0.5f;
	const uint32_t r = sign | sel(two_w < (1u << 27), f32_bits(sub), f32_bits(normal));
	return f32_from(r);
}

static inline uint16_t f2h(float f)
{
	/* The float unit does the rounding: scaling by 2^112 then 2^-110 maps
	 * the value so that adding the bias below rounds at the f16 ulp, and
	 * overflows to infinity where f16 does. */
	float base = (f32_from(f32_bits(f) & 0x7FFFFFFFu) * 0x1.0p+112f) * 0x1.0p-110f;
	const uint32_t w = f32_bits(f);
	const uint32_t shl1_w = w + w;
	const uint32_t sign = w & 0x80000000u;
	uint32_t bias = shl1_w & 0xFF000000u;
	bias = sel(bias < 0x71000000u, 0x71000000u, bias);
	base = f32_from((bias >> 1) + 0x07800000u) + base;
	const uint32_t bits = f32_bits(base);
	const uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
	const uint32_t mant_bits = bits & 0x00000FFFu;
	const uint32_t nonsign = exp_bits + mant_bits;
	return (uint16_t)((sign >> 16) | sel(shl1_w > 0xFF000000u, 0x7E00u, nonsign));
}

static inline float b2f(uint16_t h)
{
	return f32_from((uint32_t)h << 16);
}

static inline uint16_t f2b(float f)
{
	const uint32_t w = f32_bits(f);
	const uint32_t rounded = (w + 0x7FFFu + ((w >> 16) & 1u)) >> 16;
	const uint32_t quiet_nan = (w >> 16) | 0x40u;
	return (uint16_t)((w & 0x7FFFFFFFu) > 0x7F800000u ? quiet_nan : rounded);
}

uint16_t kolo_f32_to_f16(float f)
{
	return f2h(f);
}

float kolo_f16_to_f32(uint16_t h)
{
	return h2f(h);
}

uint16_t kolo_f32_to_bf16(float f)
{
	return f2b(f);
}

float kolo_bf16_to_f32(uint16_t h)
{
	return b2f(h);
}

/* ---- kernels ---------------------------------------------------------- */

typedef void (*kernel_fn)(void *restrict dst, const void *restrict src, size_t n);
typedef void (*kernel3_fn)(void *restrict dst, const void *restrict a, const void *restrict b,
                           size_t n);

#define OP_SUM(a, b)  ((a) + (b))
#define OP_PROD(a, b) ((a) * (b))
#define OP_MIN(a, b)  ((b) < (a) ? (b) : (a))
#define OP_MAX(a, b)  ((b) > (a) ? (b) : (a))

/* Where the compiler supports it, every kernel is also built for AVX2 and
 * picked at load time (ifunc): twice the lanes of the x86-64 baseline. Not under
 * sanitizers: an ifunc resolver runs before their runtime is set up. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) &&                             \
        !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CLONES
#endif

/* Each kernel comes in two forms: name(dst, src) computes dst op= src, and
 * name3(dst, a, b) computes dst = a op b into a third buffer (an
 * out-of-place reduction without a copy first). Operand order is the same:
 * the first operand is dst (resp. a). */
#define KERNEL2(name, T, EXPR)                                                                     \
	CLONES static void name(void *restrict dv, const void *restrict sv, size_t n)              \
	{                                                                                          \
		T *restrict d = dv;                                                                \
		const T *restrict s = sv;                                                          \
		for (size_t i = 0; i < n; i++)                                                     \
			d[i] = EXPR(d[i], s[i]);                                                   \
	}                                                                                          \
	CLONES static void name##3(void *restrict dv, const void *restrict av,                     \
	                           const void *restrict bv, size_t n)                              \
	{                                                                                          \
		T *restrict d = dv;                                                                \
		const T *restrict a = av;                                                          \
		const T *restrict b = bv;                                                          \
		for (size_t i = 0; i < n; i++)                                                     \
			d[i] = EXPR(a[i], b[i]);                                                   \
	}

/* Integers: sum and product in the unsigned type U; min and max in T. */
#define INT_KERNELS(name, T, U)                                                                    \
	KERNEL2(name##_sum, T, name##_SUM)                                                         \
	KERNEL2(name##_prod, T, name##_PROD)                                                       \
	KERNEL2(name##_min, T, OP_MIN)                                                             \
	KERNEL2(name##_max, T, OP_MAX)

#define i8_SUM(a, b)   ((int8_t)(uint8_t)((uint8_t)(a) + (uint8_t)(b)))
#define i8_PROD(a, b)  ((int8_t)(uint8_t)((uint8_t)(a) * (uint8_t)(b)))
#define u8_SUM(a, b)   ((uint8_t)((uint8_t)(a) + (uint8_t)(b)))
#define u8_PROD(a, b)  ((uint8_t)((uint8_t)(a) * (uint8_t)(b)))
#define i32_SUM(a, b)  ((int32_t)(uint32_t)((uint32_t)(a) + (uint32_t)(b)))
#define i32_PROD(a, b) ((int32_t)(uint32_t)((uint32_t)(a) * (uint32_t)(b)))
#define i64_SUM(a, b)  ((int64_t)(uint64_t)((uint64_t)(a) + (uint64_t)(b)))
#define i64_PROD(a, b) ((int64_t)(uint64_t)((uint64_t)(a) * (uint64_t)(b)))

/* uint8 products promote to int; 255 * 255 fits, so no overflow. */
INT_KERNELS(i8, int8_t, uint8_t)
INT_KERNELS(u8, uint8_t, uint8_t)
INT_KERNELS(i32, int32_t, uint32_t)
INT_KERNELS(i64, int64_t, uint64_t)

#define FLOAT_KERNEL(name, T, OP) KERNEL2(name, T, OP)

FLOAT_KERNEL(f32_sum, float, OP_SUM)
FLOAT_KERNEL(f32_prod, float, OP_PROD)
FLOAT_KERNEL(f32_min, float, OP_MIN)
FLOAT_KERNEL(f32_max, float, OP_MAX)
FLOAT_KERNEL(f64_sum, double, OP_SUM)
FLOAT_KERNEL(f64_prod, double, OP_PROD)
FLOAT_KERNEL(f64_min, double, OP_MIN)
FLOAT_KERNEL(f64_max, double, OP_MAX)

/* 16-bit floats: widen, combine in float32, round back; one loop. */
#define HALF_OP(name, TO, FROM, OP)                                                                \
	static inline uint16_t name(uint16_t a, uint16_t b)                                        \
	{                                                                                          \
		return FROM(OP(TO(a), TO(b)));                                                     \
	}
#define HALF_KERNEL(name, TO, FROM, OP)                                                            \
	HALF_OP(name##_op, TO, FROM, OP)                                                           \
	KERNEL2(name, uint16_t, name##_op)

HALF_KERNEL(f16_sum, h2f, f2h, OP_SUM)
HALF_KERNEL(f16_prod, h2f, f2h, OP_PROD)
HALF_KERNEL(f16_min, h2f, f2h, OP_MIN)
HALF_KERNEL(f16_max, h2f, f2h, OP_MAX)
HALF_KERNEL(bf16_sum, b2f, f2b, OP_SUM)
HALF_KERNEL(bf16_prod, b2f, f2b, OP_PROD)
HALF_KERNEL(bf16_min, b2f, f2b, OP_MIN)
HALF_KERNEL(bf16_max, b2f, f2b, OP_MAX)

#ifdef HAVE_F16C_KERNELS
/* float16 with the F16C conversion instructions (x86-64 since 2012), chosen
 * at run time: a conversion is one instruction for 8 elements instead of
 * ~20 for the bit arithmetic. Same results, except that a NaN keeps its
 * payload here where the portable path writes the canonical quiet NaN. */
#define F16C_KERNEL(name, VOP, SOP)                                                                \
	/* dv may equal av: each block of 8 is read before it is written. */                       \
	__attribute__((target("avx,f16c"))) static void name##3(void *dv, const void *av,          \
	                                                        const void *bv, size_t n)          \
	{                                                                                          \
		uint16_t *d = dv;                                                                  \
		const uint16_t *x = av, *y = bv;                                                   \
		size_t i = 0;                                                                      \
		for (; i + 8 <= n; i += 8) {                                                       \
			__m256 a = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i)));     \
			__m256 b = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(y + i)));     \
			_mm_storeu_si128((__m128i *)(d + i),                                       \
			                 _mm256_cvtps_ph(VOP(b, a), _MM_FROUND_TO_NEAREST_INT));   \
		}                                                                                  \
		for (; i < n; i++)                                                                 \
			d[i] = _cvtss_sh(SOP(_cvtsh_ss(x[i]), _cvtsh_ss(y[i])),                    \
			                 _MM_FROUND_TO_NEAREST_INT);                               \
	}                                                                                          \
	__attribute__((target("avx,f16c"))) static void name(void *dv, const void *sv, size_t n)   \
	{                                                                                          \
		name##3(dv, dv, sv, n);                                                            \
	}

/* VOP(b, a) with b = src, a = dst: minps(b, a) = b < a ? b : a = OP_MIN(a, b). */
#define V_SUM(b, a)  _mm256_add_ps(a, b)
#define V_PROD(b, a) _mm256_mul_ps(a, b)
F16C_KERNEL(f16c_sum, V_SUM, OP_SUM)
F16C_KERNEL(f16c_prod, V_PROD, OP_PROD)
F16C_KERNEL(f16c_min, _mm256_min_ps, OP_MIN)
F16C_KERNEL(f16c_max, _mm256_max_ps, OP_MAX)
static const kernel_fn f16c_kernels[KOLO_OP_COUNT] = {f16c_sum, f16c_sum, f16c_min, f16c_max,
                                                      f16c_prod};
static const kernel3_fn f16c_kernels3[KOLO_OP_COUNT] = {f16c_sum3, f16c_sum3, f16c_min3, f16c_max3,
                                                        f16c_prod3};
#endif

static atomic_bool portable_only;

void kolo_reduce_force_portable(bool on)
{
	atomic_store(&portable_only, on);
}

/* Indexed by dtype, then by op (AVERAGE reduces as SUM). */
#define ROW(p)                                                                                     \
	{                                                                                          \
		p##_sum, p##_sum, p##_min, p##_max, p##_prod                                       \
	}
static const kernel_fn kernels[KOLO_DTYPE_COUNT][KOLO_OP_COUNT] = {
        [KOLO_INT8] = ROW(i8),     [KOLO_UINT8] = ROW(u8),    [KOLO_INT32] = ROW(i32),
        [KOLO_INT64] = ROW(i64),   [KOLO_FLOAT16] = ROW(f16), [KOLO_BFLOAT16] = ROW(bf16),
        [KOLO_FLOAT32] = ROW(f32), [KOLO_FLOAT64] = ROW(f64),
};

#define ROW3(p)                                                                                    \
	{                                                                                          \
		p##_sum3, p##_sum3, p##_min3, p##_max3, p##_prod3                                  \
	}
static const kernel3_fn kernels3[KOLO_DTYPE_COUNT][KOLO_OP_COUNT] = {
        [KOLO_INT8] = ROW3(i8),     [KOLO_UINT8] = ROW3(u8),    [KOLO_INT32] = ROW3(i32),
        [KOLO_INT64] = ROW3(i64),   [KOLO_FLOAT16] = ROW3(f16), [KOLO_BFLOAT16] = ROW3(bf16),
        [KOLO_FLOAT32] = ROW3(f32), [KOLO_FLOAT64] = ROW3(f64),
};

#ifdef HAVE_F16C_KERNELS
/* CPUID.1:ECX.F16C, read once (not every compiler's __builtin_cpu_supports
 * knows "f16c"). 0 unknown, 1 no, 2 yes. */
static bool cpu_f16c(void)
{
	static atomic_int known;
	int k = atomic_load_explicit(&known, memory_order_relaxed);
	if (k == 0) {
		unsigned a, b, c, d;
		k = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) ? 2 : 1;
		atomic_store_explicit(&known, k, memory_order_relaxed);
	}
	return k == 2;
}
#endif

static bool use_f16c(kolo_dtype_t dtype)
{
#ifdef HAVE_F16C_KERNELS
	return dtype == KOLO_FLOAT16 && __builtin_cpu_supports("avx") && cpu_f16c() &&
	       !atomic_load_explicit(&portable_only, memory_order_relaxed);
#else
	(void)dtype;
	return false;
#endif
}

void kolo_reduce(void *dst, const void *src, size_t count, kolo_dtype_t dtype, kolo_op_t op)
{
	if ((unsigned)dtype >= KOLO_DTYPE_COUNT || (unsigned)op >= KOLO_OP_COUNT || count == 0)
		return;
#ifdef HAVE_F16C_KERNELS
	if (use_f16c(dtype)) {
		f16c_kernels[op](dst, src, count);
		return;
	}
#endif
	kernels[dtype][op](dst, src, count);
}

void kolo_reduce3(void *dst, const void *a, const void *b, size_t count, kolo_dtype_t dtype,
                  kolo_op_t op)
{
	if ((unsigned)dtype >= KOLO_DTYPE_COUNT || (unsigned)op >= KOLO_OP_COUNT || count == 0)
		return;
	if (dst == a) {
		kolo_reduce(dst, b, count, dtype, op);
		return;
	}
#ifdef HAVE_F16C_KERNELS
	if (use_f16c(dtype)) {
		f16c_kernels3[op](dst, a, b, count);
		return;
	}
#endif
	kernels3[dtype][op](dst, a, b, count);
}

/* ---- scaling ---------------------------------------------------------- */

/* dst may equal src here, so no restrict; the loops still vectorise
 * because each element is read before it is written. */
#define SCALE_INT(name, T, LO, HI)                                                                 \
	static void name(void *dv, const void *sv, size_t n, double factor)                        \
	{                                                                                          \
		T *d = dv;                                                                         \
		const T *s = sv;                                                                   \
		for (size_t i = 0; i < n; i++) {                                                   \
			double v = round((double)s[i] * factor);                                   \
			v = v < (LO) ? (LO) : v;                                                   \
			v = v > (HI) ? (HI) : v;                                                   \
			d[i] = (T)(v == v ? v : 0);                                                \
		}                                                                                  \
	}

SCALE_INT(scale_i8, int8_t, -128.0, 127.0)
SCALE_INT(scale_u8, uint8_t, 0.0, 255.0)
SCALE_INT(scale_i32, int32_t, -2147483648.0, 2147483647.0)
/* The largest double below 2^63 keeps the conversion defined. */
SCALE_INT(scale_i64, int64_t, -9223372036854775808.0, 9223372036854774784.0)

static void scale_f16(void *dv, const void *sv, size_t n, double factor)
{
	uint16_t *d = dv;
	const uint16_t *s = sv;
	const float f = (float)factor;
	for (size_t i = 0; i < n; i++)
		d[i] = f2h(h2f(s[i]) * f);
}

static void scale_bf16(void *dv, const void *sv, size_t n, double factor)
{
	uint16_t *d = dv;
	const uint16_t *s = sv;
	const float f = (float)factor;
	for (size_t i = 0; i < n; i++)
		d[i] = f2b(b2f(s[i]) * f);
}

static void scale_f32(void *dv, const void *sv, size_t n, double factor)
{
	float *d = dv;
	const float *s = sv;
	for (size_t i = 0; i < n; i++)
		d[i] = (float)((double)s[i] * factor);
}

static void scale_f64(void *dv, const void *sv, size_t n, double factor)
{
	double *d = dv;
	const double *s = sv;
	for (size_t i = 0; i < n; i++)
		d[i] = s[i] * factor;
}

typedef void (*scale_fn)(void *dst, const void *src, size_t n, double factor);
static const scale_fn scalers[KOLO_DTYPE_COUNT] = {
        [KOLO_INT8] = scale_i8,     [KOLO_UINT8] = scale_u8,    [KOLO_INT32] = scale_i32,
        [KOLO_INT64] = scale_i64,   [KOLO_FLOAT16] = scale_f16, [KOLO_BFLOAT16] = scale_bf16,
        [KOLO_FLOAT32] = scale_f32, [KOLO_FLOAT64] = scale_f64,
};

void kolo_scale(void *dst, const void *src, size_t count, kolo_dtype_t dtype, double factor)
{
	if ((unsigned)dtype >= KOLO_DTYPE_COUNT || count == 0)
		return;
	if (factor == 1.0) {
		if (dst != src)
			memmove(dst, src, count * kolo_dtype_size(dtype));
		return;
	}
	scalers[dtype](dst, src, count, factor);
}
