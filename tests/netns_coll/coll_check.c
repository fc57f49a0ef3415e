/* A worker of the multi-host tests, on the public API only.
 *
 *   coll_check matrix        every collective over dtypes x ops x counts,
 *                            checked against a float64 reference, and
 *                            allreduce/allgather/broadcast results checked
 *                            bitwise identical on every rank
 *   coll_check loop SEC MIB  float32 allreduces of MIB MiB for SEC seconds;
 *                            prints "ready pid P rank R local L" first and
 *                            "ERROR ms=T status: message" when one fails
 *
 * Exit status: 0 all good, 1 a wrong result, 3 a collective failed, 2 usage. */
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kolo/kolo.h"

static kolo_comm_t *comm;
static int rank, size;
static long checks, wrong;

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void die_st(const char *what, kolo_status_t st)
{
	printf("ERROR rank %d: %s: %s: %s\n", rank, what, kolo_status_name(st),
	       kolo_last_error(comm));
	fflush(stdout);
	exit(3);
}

/* ---- element access in float64 ----------------------------------------- */

static float h2f(uint16_t h, bool bf)
{
	if (bf) {
		uint32_t u = (uint32_t)h << 16;
		float f;
		memcpy(&f, &u, 4);
		return f;
	}
	uint32_t s = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 31, m = h & 1023, u;
	if (e == 0 && m == 0) {
		u = s;
	} else if (e == 0) { /* subnormal */
		int k = -1;
		do {
			k++;
			m <<= 1;
		} while (!(m & 1024));
		u = s | (uint32_t)(127 - 15 - k) << 23 | (m & 1023) << 13;
	} else if (e == 31) {
		u = s | 0x7f800000u | m << 13;
	} else {
		u = s | (e + 127 - 15) << 23 | m << 13;
	}
	float f;
	memcpy(&f, &u, 4);
	return f;
}

static uint16_t f2bf(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	u += 0x7fff + ((u >> 16) & 1);
	return (uint16_t)(u >> 16);
}

static uint16_t f2h(float f)
{
	/* Only values the generator makes: normal, |f| < 65504, or zero. */
	uint32_t u;
	memcpy(&u, &f, 4);
	uint32_t s = (u >> 16) & 0x8000;
	int e = (int)((u >> 23) & 255) - 127 + 15;
	uint32_t m = u & 0x7fffff;
	if ((u & 0x7fffffff) == 0 || e <= 0)
		return (uint16_t)s;
	uint32_t h = s | (uint32_t)e << 10 | m >> 13, rest = m & 0x1fff;
	if (rest > 0x1000 || (rest == 0x1000 && (h & 1)))
		h++;
	return (uint16_t)h;
}

static double get(const void *b, size_t i, kolo_dtype_t t)
{
	switch (t) {
	case KOLO_INT8:
		return ((const int8_t *)b)[i];
	case KOLO_UINT8:
		return ((const uint8_t *)b)[i];
	case KOLO_INT32:
		return ((const int32_t *)b)[i];
	case KOLO_INT64:
		return (double)((const int64_t *)b)[i];
	case KOLO_FLOAT16:
		return h2f(((const uint16_t *)b)[i], false);
	case KOLO_BFLOAT16:
		return h2f(((const uint16_t *)b)[i], true);
	case KOLO_FLOAT32:
		return ((const float *)b)[i];
	case KOLO_FLOAT64:
		return ((const double *)b)[i];
	default:
		return NAN;
	}
}

static void put(void *b, size_t i, kolo_dtype_t t, double v)
{
	switch (t) {
	/* Through int64 so that out-of-range values wrap as the dtype does. */
	case KOLO_INT8:
		((int8_t *)b)[i] = (int8_t)(int64_t)v;
		break;
	case KOLO_UINT8:
		((uint8_t *)b)[i] = (uint8_t)(int64_t)v;
		break;
	case KOLO_INT32:
		((int32_t *)b)[i] = (int32_t)(int64_t)v;
		break;
	case KOLO_INT64:
		((int64_t *)b)[i] = (int64_t)v;
		break;
	case KOLO_FLOAT16:
		((uint16_t *)b)[i] = f2h((float)v);
		break;
	case KOLO_BFLOAT16:
		((uint16_t *)b)[i] = f2bf((float)v);
		break;
	case KOLO_FLOAT32:
		((float *)b)[i] = (float)v;
		break;
	case KOLO_FLOAT64:
		((double *)b)[i] = v;
		break;
	default:
		break;
	}
}

static bool is_float(kolo_dtype_t t)
{
	return t >= KOLO_FLOAT16;
}

/* Rank r's element i, exactly representable in dtype t (then read back). */
static double gen(int r, size_t i, kolo_dtype_t t, kolo_op_t op)
{
	long k = (long)((r * 31 + (long)(i % 100003) * 7 + (long)(i / 100003)) % 17);
	if (op == KOLO_PRODUCT)
		return is_float(t) ? 0.5 * (double)(1 + k % 3) : (double)(1 + k % 2);
	if (t == KOLO_UINT8)
		return (double)k;
	if (is_float(t))
		return (double)(k - 8) * 0.375 + 0.0625 * (double)(r % 3);
	return (double)(k - 8);
}

static void fill(void *b, size_t off, size_t n, int r, kolo_dtype_t t, kolo_op_t op)
{
	for (size_t i = 0; i < n; i++)
		put(b, i, t, gen(r, off + i, t, op));
}

static double tol(kolo_dtype_t t, double mag)
{
	switch (t) {
	case KOLO_FLOAT16:
		return 2e-3 * mag * size + 1e-3;
	case KOLO_BFLOAT16:
		return 1.6e-2 * mag * size + 1e-2;
	case KOLO_FLOAT32:
		return 1e-6 * mag * size;
	case KOLO_FLOAT64:
		return 1e-14 * mag * size;
	default:
		return 1.0; /* integer average rounds */
	}
}

/* Reference of element i reduced over ranks, in float64 (integer results
 * wrap as the dtype does, except averages). */
static double ref_reduce(size_t i, kolo_dtype_t t, kolo_op_t op, double *mag)
{
	double acc = gen(0, i, t, op), m = fabs(acc);
	for (int r = 1; r < size; r++) {
		double v = gen(r, i, t, op);
		m += fabs(v);
		switch (op) {
		case KOLO_SUM:
		case KOLO_AVERAGE:
			acc += v;
			break;
		case KOLO_MIN:
			acc = fmin(acc, v);
			break;
		case KOLO_MAX:
			acc = fmax(acc, v);
			break;
		case KOLO_PRODUCT:
			acc *= v;
			m = fabs(acc);
			break;
		default:
			break;
		}
	}
	if (op == KOLO_AVERAGE) {
		acc /= size;
		m /= size;
	} else if (!is_float(t)) {
		char tmp[8];
		put(tmp, 0, t, acc); /* wrap like the dtype */
		acc = get(tmp, 0, t);
	}
	*mag = m;
	return acc;
}

static bool close_enough(double got, double want, kolo_dtype_t t, kolo_op_t op, double mag)
{
	if (!is_float(t) && op != KOLO_AVERAGE)
		return got == want;
	return fabs(got - want) <= tol(t, mag);
}

static void bad(const char *coll, kolo_dtype_t t, kolo_op_t op, size_t count, size_t i, double got,
                double want)
{
	if (wrong++ < 10)
		printf("WRONG rank %d: %s %s %s count %zu: element %zu is %.9g, want %.9g\n", rank,
		       coll, kolo_dtype_name(t), kolo_op_name(op), count, i, got, want);
}

static uint64_t fnv(const void *p, size_t n)
{
	uint64_t h = 1469598103934665603ull;
	for (size_t i = 0; i < n; i++)
		h = (h ^ ((const uint8_t *)p)[i]) * 1099511628211ull;
	return h;
}

/* Every rank holds the same bytes. */
static void same_everywhere(const char *coll, kolo_dtype_t t, kolo_op_t op, size_t count,
                            const void *b, size_t bytes)
{
	uint64_t h = fnv(b, bytes), *all = calloc((size_t)size, sizeof(*all));
	kolo_status_t st = kolo_allgather(comm, &h, all, 1, KOLO_INT64);
	if (st != KOLO_OK)
		die_st("allgather of hashes", st);
	checks++;
	for (int r = 0; r < size; r++) {
		if (all[r] != h) {
			if (wrong++ < 10)
				printf("WRONG rank %d: %s %s %s count %zu: rank %d's result "
				       "differs in its bits\n",
				       rank, coll, kolo_dtype_name(t), kolo_op_name(op), count, r);
			break;
		}
	}
	free(all);
}

/* ---- the matrix ------------------------------------------------------- */

static void check_allreduce(kolo_dtype_t t, kolo_op_t op, size_t count, bool inplace)
{
	size_t es = kolo_dtype_size(t);
	char *s = malloc(count * es + 1), *d = inplace ? s : malloc(count * es + 1);
	fill(s, 0, count, rank, t, op);
	kolo_status_t st = kolo_allreduce(comm, s, d, count, t, op);
	if (st != KOLO_OK)
		die_st("allreduce", st);
	for (size_t i = 0; i < count; i++) {
		double mag, want = ref_reduce(i, t, op, &mag), got = get(d, i, t);
		checks++;
		if (!close_enough(got, want, t, op, mag)) {
			bad("allreduce", t, op, count, i, got, want);
			break;
		}
	}
	same_everywhere("allreduce", t, op, count, d, count * es);
	if (!inplace)
		free(d);
	free(s);
}

static void check_allgather(kolo_dtype_t t, size_t count)
{
	size_t es = kolo_dtype_size(t);
	char *s = malloc(count * es + 1), *d = malloc(count * es * (size_t)size + 1);
	fill(s, 0, count, rank, t, KOLO_SUM);
	kolo_status_t st = kolo_allgather(comm, s, d, count, t);
	if (st != KOLO_OK)
		die_st("allgather", st);
	for (int r = 0; r < size; r++) {
		for (size_t i = 0; i < count; i++) {
			double want = gen(r, i, t, KOLO_SUM),
			       got = get(d, (size_t)r * count + i, t);
			checks++;
			if (got != want) {
				bad("allgather", t, KOLO_SUM, count, (size_t)r * count + i, got,
				    want);
				r = size;
				break;
			}
		}
	}
	same_everywhere("allgather", t, KOLO_SUM, count, d, count * es * (size_t)size);
	free(s);
	free(d);
}

static void check_broadcast(kolo_dtype_t t, size_t count, int root)
{
	size_t es = kolo_dtype_size(t);
	char *b = malloc(count * es + 1);
	fill(b, 0, count, rank == root ? root : rank + 1000, t, KOLO_SUM);
	kolo_status_t st = kolo_broadcast(comm, b, count, t, root);
	if (st != KOLO_OK)
		die_st("broadcast", st);
	for (size_t i = 0; i < count; i++) {
		double want = gen(root, i, t, KOLO_SUM), got = get(b, i, t);
		checks++;
		if (got != want) {
			bad("broadcast", t, KOLO_SUM, count, i, got, want);
			break;
		}
	}
	same_everywhere("broadcast", t, KOLO_SUM, count, b, count * es);
	free(b);
}

static void check_reducescatter(kolo_dtype_t t, kolo_op_t op, size_t count)
{
	size_t es = kolo_dtype_size(t), off = 0;
	for (int r = 0; r < rank; r++)
		off += kolo_reducescatter_count(count, size, r);
	size_t mine = kolo_reducescatter_count(count, size, rank);
	char *s = malloc(count * es + 1), *d = malloc(mine * es + 1);
	fill(s, 0, count, rank, t, op);
	kolo_status_t st = kolo_reducescatter(comm, s, d, count, t, op);
	if (st != KOLO_OK)
		die_st("reducescatter", st);
	for (size_t i = 0; i < mine; i++) {
		double mag, want = ref_reduce(off + i, t, op, &mag), got = get(d, i, t);
		checks++;
		if (!close_enough(got, want, t, op, mag)) {
			bad("reducescatter", t, op, count, i, got, want);
			break;
		}
	}
	free(s);
	free(d);
}

static void check_alltoall(kolo_dtype_t t, size_t count)
{
	size_t es = kolo_dtype_size(t), n = count * (size_t)size;
	char *s = malloc(n * es + 1), *d = malloc(n * es + 1);
	/* Block j of rank r: gen(r, j * count + i). */
	fill(s, 0, n, rank, t, KOLO_SUM);
	kolo_status_t st = kolo_alltoall(comm, s, d, count, t);
	if (st != KOLO_OK)
		die_st("alltoall", st);
	for (int r = 0; r < size; r++) {
		for (size_t i = 0; i < count; i++) {
			double want = gen(r, (size_t)rank * count + i, t, KOLO_SUM);
			double got = get(d, (size_t)r * count + i, t);
			checks++;
			if (got != want) {
				bad("alltoall", t, KOLO_SUM, count, (size_t)r * count + i, got,
				    want);
				r = size;
				break;
			}
		}
	}
	free(s);
	free(d);
}

static int matrix(void)
{
	static const size_t counts[] = {0, 1, 7, 1000, 65537};
	double t0 = now_ms();
	for (int t = 0; t < KOLO_DTYPE_COUNT; t++) {
		for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
			for (int op = 0; op < KOLO_OP_COUNT; op++)
				check_allreduce((kolo_dtype_t)t, (kolo_op_t)op, counts[c], op == 1);
			check_allgather((kolo_dtype_t)t, counts[c]);
			check_broadcast((kolo_dtype_t)t, counts[c], (int)(c + (size_t)t) % size);
			check_reducescatter((kolo_dtype_t)t, t % 2 ? KOLO_MAX : KOLO_SUM,
			                    counts[c] * 3);
			check_alltoall((kolo_dtype_t)t, counts[c] / 4);
		}
	}
	/* Large enough for the pipelined ring and the hierarchy's every stage. */
	check_allreduce(KOLO_FLOAT32, KOLO_SUM, (4u << 20) + 5, false);
	check_allreduce(KOLO_BFLOAT16, KOLO_AVERAGE, (1u << 20) + 3, true);
	check_allreduce(KOLO_INT32, KOLO_MAX, (1u << 20) + 1, false);
	check_broadcast(KOLO_FLOAT32, (1u << 20) + 7, size - 1);
	printf("%s rank %d: %ld checks, %ld wrong, %.0f ms\n", wrong ? "FAIL" : "PASS", rank,
	       checks, wrong, now_ms() - t0);
	return wrong ? 1 : 0;
}

static int loop(double seconds, size_t mib)
{
	size_t count = mib * (1u << 20) / sizeof(float);
	float *b = malloc(count * sizeof(float));
	for (size_t i = 0; i < count; i++)
		b[i] = (float)(i % 7);
	printf("ready pid %d rank %d local %d\n", (int)getpid(), rank, kolo_local_rank(comm));
	fflush(stdout);
	double t0 = now_ms();
	long iters = 0;
	while (now_ms() - t0 < seconds * 1e3) {
		double ts = now_ms();
		kolo_status_t st = kolo_allreduce(comm, b, b, count, KOLO_FLOAT32, KOLO_MAX);
		if (st != KOLO_OK) {
			printf("ERROR ms=%.0f iter=%ld %s: %s\n", now_ms() - ts, iters,
			       kolo_status_name(st), kolo_last_error(comm));
			fflush(stdout);
			free(b);
			return 3;
		}
		iters++;
	}
	printf("DONE rank %d iters %ld\n", rank, iters);
	free(b);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc < 2 || (strcmp(argv[1], "matrix") != 0 && strcmp(argv[1], "loop") != 0) ||
	    (strcmp(argv[1], "loop") == 0 && argc != 4)) {
		fprintf(stderr, "usage: coll_check matrix | coll_check loop SECONDS MIB\n");
		return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	kolo_status_t st = kolo_init(&comm);
	if (st != KOLO_OK) {
		printf("ERROR kolo_init: %s: %s\n", kolo_status_name(st), kolo_init_error());
		return 3;
	}
	rank = kolo_rank(comm);
	size = kolo_size(comm);
	int rc = strcmp(argv[1], "matrix") == 0 ? matrix()
	                                        : loop(atof(argv[2]), (size_t)atol(argv[3]));
	if (rc == 3) {
		/* A failed job: do not wait in finalize for peers that are gone. */
		_exit(rc);
	}
	kolo_finalize(comm);
	return rc;
}
