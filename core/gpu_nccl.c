/* gpu_nccl: libnccl.so.2 resolved at run time into one table (gpu_nccl.h).
 * Compiled with nccl.h (and cuda_runtime_api.h, which it includes) for the
 * types only; without them every call answers "built without NCCL". */
#include "gpu_nccl.h"

#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef KOLO_HAVE_NCCL
#define KOLO_HAVE_NCCL 0
#endif
#ifndef KOLO_HAVE_CUDA
#define KOLO_HAVE_CUDA 0
#endif

#if KOLO_HAVE_NCCL && KOLO_HAVE_CUDA

#include <nccl.h>

struct nccl_api {
	ncclResult_t (*get_unique_id)(ncclUniqueId *);
	ncclResult_t (*comm_init_rank)(ncclComm_t *, int, ncclUniqueId, int);
	ncclResult_t (*comm_init_rank_config)(ncclComm_t *, int, ncclUniqueId, int,
	                                      ncclConfig_t *); /* optional */
	ncclResult_t (*comm_destroy)(ncclComm_t);
	ncclResult_t (*comm_abort)(ncclComm_t);
	ncclResult_t (*comm_get_async_error)(ncclComm_t, ncclResult_t *);
	const char *(*get_error_string)(ncclResult_t);
	const char *(*get_last_error)(ncclComm_t); /* optional */
	ncclResult_t (*all_reduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t,
	                           ncclComm_t, cudaStream_t);
	ncclResult_t (*reduce_scatter)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t,
	                               ncclComm_t, cudaStream_t);
	ncclResult_t (*all_gather)(const void *, void *, size_t, ncclDataType_t, ncclComm_t,
	                           cudaStream_t);
	ncclResult_t (*broadcast)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t,
	                          cudaStream_t);
	ncclResult_t (*reduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, int,
	                       ncclComm_t, cudaStream_t);
	ncclResult_t (*red_op_create_pre_mul_sum)(ncclRedOp_t *, void *, ncclDataType_t,
	                                          ncclScalarResidence_t, ncclComm_t);
	ncclResult_t (*red_op_destroy)(ncclRedOp_t, ncclComm_t);
	ncclResult_t (*group_start)(void);
	ncclResult_t (*group_end)(void);
};

static struct nccl_api api;
static pthread_once_t api_once = PTHREAD_ONCE_INIT;
static const char *api_why = "libnccl not loaded yet";
static char api_why_buf[256];

#define RESOLVE(field, name, required)                                                             \
	do {                                                                                       \
		void *p_ = dlsym(h, name);                                                         \
		if (!p_ && (required) && !missing)                                                 \
			missing = name;                                                            \
		memcpy(&api.field, &p_, sizeof(p_));                                               \
	} while (0)

static void load(void)
{
	void *h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
	if (!h)
		h = dlopen("libnccl.so", RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		api_why = "libnccl.so.2 not found (not installed, or not on the loader's path)";
		return;
	}
	const char *missing = NULL;
	RESOLVE(get_unique_id, "ncclGetUniqueId", true);
	RESOLVE(comm_init_rank, "ncclCommInitRank", true);
	RESOLVE(comm_init_rank_config, "ncclCommInitRankConfig", false);
	RESOLVE(comm_destroy, "ncclCommDestroy", true);
	RESOLVE(comm_abort, "ncclCommAbort", true);
	RESOLVE(comm_get_async_error, "ncclCommGetAsyncError", true);
	RESOLVE(get_error_string, "ncclGetErrorString", true);
	RESOLVE(get_last_error, "ncclGetLastError", false);
	RESOLVE(all_reduce, "ncclAllReduce", true);
	RESOLVE(reduce_scatter, "ncclReduceScatter", true);
	RESOLVE(all_gather, "ncclAllGather", true);
	RESOLVE(broadcast, "ncclBroadcast", true);
	RESOLVE(reduce, "ncclReduce", true);
	RESOLVE(red_op_create_pre_mul_sum, "ncclRedOpCreatePreMulSum", true);
	RESOLVE(red_op_destroy, "ncclRedOpDestroy", true);
	RESOLVE(group_start, "ncclGroupStart", true);
	RESOLVE(group_end, "ncclGroupEnd", true);
	if (missing) {
		snprintf(api_why_buf, sizeof(api_why_buf), "libnccl.so.2 lacks %s (too old)",
		         missing);
		api_why = api_why_buf;
		memset(&api, 0, sizeof(api));
		dlclose(h);
		return;
	}
	api_why = NULL;
}

bool kolo_nccl_usable(const char **why)
{
	pthread_once(&api_once, load);
	if (why)
		*why = api_why;
	return api_why == NULL;
}

struct kolo_nccl_comm {
	ncclComm_t comm;
	int timeout_ms;
	bool failed; /* an error or a deadline was met: abort, never destroy */
};

static uint64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static kolo_status_t nccl_fail(struct kolo_nccl_comm *c, ncclResult_t r, const char *what,
                               struct kolo_errbuf *eb)
{
	if (c)
		c->failed = true;
	const char *last = c && api.get_last_error ? api.get_last_error(c->comm) : NULL;
	return kolo_fail(eb, r == ncclRemoteError ? KOLO_EPEER : KOLO_ESYSTEM, "%s: %s%s%s", what,
	                 api.get_error_string(r), last && *last ? ": " : "", last ? last : "");
}

/* A call on a non-blocking communicator may return ncclInProgress; its
 * outcome is then ncclCommGetAsyncError's once it leaves that state. There is
 * no notification to wait on, so this polls, with a deadline, backing off
 * from 50 µs to 1 ms. */
static kolo_status_t settle(struct kolo_nccl_comm *c, ncclResult_t r, const char *what,
                            struct kolo_errbuf *eb)
{
	if (r == ncclSuccess)
		return KOLO_OK;
	if (r != ncclInProgress)
		return nccl_fail(c, r, what, eb);
	uint64_t deadline = now_ms() + (uint64_t)(c->timeout_ms > 0 ? c->timeout_ms : 60000);
	long pause_ns = 50000;
	for (;;) {
		ncclResult_t st = ncclInProgress;
		ncclResult_t q = api.comm_get_async_error(c->comm, &st);
		if (q != ncclSuccess)
			return nccl_fail(c, q, what, eb);
		if (st == ncclSuccess)
			return KOLO_OK;
		if (st != ncclInProgress)
			return nccl_fail(c, st, what, eb);
		if (now_ms() >= deadline) {
			c->failed = true;
			return kolo_fail(eb, KOLO_ETIMEDOUT, "%s: not settled within %d ms", what,
			                 c->timeout_ms);
		}
		struct timespec ts = {0, pause_ns};
		nanosleep(&ts, NULL);
		if (pause_ns < 1000000)
			pause_ns *= 2;
	}
}

kolo_status_t kolo_nccl_unique_id(uint8_t id[KOLO_NCCL_ID_BYTES], struct kolo_errbuf *eb)
{
	const char *why;
	if (!kolo_nccl_usable(&why))
		return kolo_fail(eb, KOLO_EUNSUPPORTED, "NCCL: %s", why);
	ncclUniqueId u;
	_Static_assert(sizeof(u) == KOLO_NCCL_ID_BYTES, "ncclUniqueId is 128 bytes");
	ncclResult_t r = api.get_unique_id(&u);
	if (r != ncclSuccess)
		return nccl_fail(NULL, r, "ncclGetUniqueId", eb);
	memcpy(id, &u, sizeof(u));
	return KOLO_OK;
}

kolo_status_t kolo_nccl_comm_init(struct kolo_nccl_comm **out, int nranks, int rank,
                                  const uint8_t id[KOLO_NCCL_ID_BYTES], int timeout_ms,
                                  struct kolo_errbuf *eb)
{
	*out = NULL;
	const char *why;
	if (!kolo_nccl_usable(&why))
		return kolo_fail(eb, KOLO_EUNSUPPORTED, "NCCL: %s", why);
	struct kolo_nccl_comm *c = calloc(1, sizeof(*c));
	if (!c)
		return kolo_fail(eb, KOLO_ENOMEM, "out of memory");
	c->timeout_ms = timeout_ms;
	ncclUniqueId u;
	memcpy(&u, id, sizeof(u));
	ncclResult_t r;
	if (api.comm_init_rank_config) {
		ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
		cfg.blocking = 0;
		r = api.comm_init_rank_config(&c->comm, nranks, u, rank, &cfg);
	} else {
		r = api.comm_init_rank(&c->comm, nranks, u, rank);
	}
	kolo_status_t st = r == ncclSuccess || (r == ncclInProgress && c->comm)
	                           ? settle(c, r, "ncclCommInitRank", eb)
	                           : nccl_fail(c, r, "ncclCommInitRank", eb);
	if (st != KOLO_OK) {
		if (c->comm)
			api.comm_abort(c->comm);
		free(c);
		return st;
	}
	*out = c;
	return KOLO_OK;
}

void kolo_nccl_comm_abort(struct kolo_nccl_comm *c)
{
	if (c && c->comm) {
		api.comm_abort(c->comm);
		c->comm = NULL;
		c->failed = true;
	}
}

void kolo_nccl_comm_free(struct kolo_nccl_comm *c)
{
	if (!c)
		return;
	if (c->comm) {
		if (c->failed) {
			api.comm_abort(c->comm);
		} else {
			struct kolo_errbuf eb = {{0}};
			if (settle(c, api.comm_destroy(c->comm), "ncclCommDestroy", &eb) != KOLO_OK)
				api.comm_abort(c->comm);
		}
	}
	free(c);
}

kolo_status_t kolo_nccl_comm_status(struct kolo_nccl_comm *c, struct kolo_errbuf *eb)
{
	if (!c->comm)
		return kolo_fail(eb, KOLO_ECLOSED, "NCCL communicator aborted");
	ncclResult_t st = ncclSuccess;
	ncclResult_t q = api.comm_get_async_error(c->comm, &st);
	if (q != ncclSuccess)
		return nccl_fail(c, q, "ncclCommGetAsyncError", eb);
	if (st != ncclSuccess && st != ncclInProgress)
		return nccl_fail(c, st, "NCCL communicator", eb);
	return KOLO_OK;
}

static const ncclDataType_t dtypes[KOLO_DTYPE_COUNT] = {
        [KOLO_INT8] = ncclInt8,       [KOLO_UINT8] = ncclUint8,     [KOLO_INT32] = ncclInt32,
        [KOLO_INT64] = ncclInt64,     [KOLO_FLOAT16] = ncclFloat16, [KOLO_BFLOAT16] = ncclBfloat16,
        [KOLO_FLOAT32] = ncclFloat32, [KOLO_FLOAT64] = ncclFloat64,
};

bool kolo_nccl_dtype_ok(kolo_dtype_t dtype)
{
	return (unsigned)dtype < KOLO_DTYPE_COUNT;
}

/* IEEE binary16 of f, rounded to nearest even (for PreMulSum's scalar). */
static uint16_t f32_to_f16(float f)
{
	uint32_t x;
	memcpy(&x, &f, sizeof(x));
	uint32_t sign = (x >> 16) & 0x8000u;
	int32_t exp = (int32_t)((x >> 23) & 0xffu) - 127 + 15;
	uint32_t man = x & 0x7fffffu;
	if (((x >> 23) & 0xffu) == 0xffu)
		return (uint16_t)(sign | 0x7c00u | (man ? 0x200u : 0));
	if (exp >= 31)
		return (uint16_t)(sign | 0x7c00u);
	if (exp <= 0) {
		if (exp < -10)
			return (uint16_t)sign;
		man |= 0x800000u;
		uint32_t shift = (uint32_t)(14 - exp);
		uint32_t half = man >> shift, rem = man & ((1u << shift) - 1),
		         mid = 1u << (shift - 1);
		if (rem > mid || (rem == mid && (half & 1u)))
			half++;
		return (uint16_t)(sign | half);
	}
	uint32_t half = sign | ((uint32_t)exp << 10) | (man >> 13);
	uint32_t rem = man & 0x1fffu;
	if (rem > 0x1000u || (rem == 0x1000u && (half & 1u)))
		half++; /* may carry into the exponent: still correct rounding */
	return (uint16_t)half;
}

/* The NCCL op for op and scale, created in *made when it is a PreMulSum (the
 * caller destroys it). KOLO_EUNSUPPORTED for a scale NCCL cannot apply
 * (integers, or an op other than a sum). */
static kolo_status_t red_op(struct kolo_nccl_comm *c, kolo_op_t op, double scale,
                            kolo_dtype_t dtype, ncclRedOp_t *out, bool *made,
                            struct kolo_errbuf *eb)
{
	*made = false;
	static const ncclRedOp_t ops[KOLO_OP_COUNT] = {[KOLO_SUM] = ncclSum,
	                                               [KOLO_AVERAGE] = ncclAvg,
	                                               [KOLO_MIN] = ncclMin,
	                                               [KOLO_MAX] = ncclMax,
	                                               [KOLO_PRODUCT] = ncclProd};
	if ((unsigned)op >= KOLO_OP_COUNT || !kolo_nccl_dtype_ok(dtype))
		return kolo_fail(eb, KOLO_EINVAL, "NCCL: invalid op or dtype");
	if (scale == 1.0) {
		*out = ops[op];
		return KOLO_OK;
	}
	if (op != KOLO_SUM && op != KOLO_AVERAGE)
		return kolo_fail(eb, KOLO_EUNSUPPORTED,
		                 "NCCL: a scale applies to sum and average only");
	union {
		float f32;
		double f64;
		uint16_t u16;
	} s;
	switch (dtype) {
	case KOLO_FLOAT32:
		s.f32 = (float)scale;
		break;
	case KOLO_FLOAT64:
		s.f64 = scale;
		break;
	case KOLO_FLOAT16:
		s.u16 = f32_to_f16((float)scale);
		break;
	case KOLO_BFLOAT16: {
		float f = (float)scale;
		uint32_t x;
		memcpy(&x, &f, sizeof(x));
		x += 0x7fffu + ((x >> 16) & 1u);
		s.u16 = (uint16_t)(x >> 16);
		break;
	}
	default:
		return kolo_fail(eb, KOLO_EUNSUPPORTED, "NCCL: no scale for integer %s",
		                 kolo_dtype_name(dtype));
	}
	ncclResult_t r = api.red_op_create_pre_mul_sum(out, &s, dtypes[dtype],
	                                               ncclScalarHostImmediate, c->comm);
	kolo_status_t st = settle(c, r, "ncclRedOpCreatePreMulSum", eb);
	if (st == KOLO_OK)
		*made = true;
	return st;
}

static kolo_status_t live(struct kolo_nccl_comm *c, struct kolo_errbuf *eb)
{
	if (!c || !c->comm)
		return kolo_fail(eb, KOLO_ECLOSED, "NCCL communicator aborted");
	if (c->failed)
		return kolo_fail(eb, KOLO_EPEER, "NCCL communicator failed earlier");
	return KOLO_OK;
}

/* Averaging a scaled sum: ncclAvg cannot take a PreMulSum, so AVERAGE with a
 * scale is the caller's to fold into scale (1 / n); here it is refused. */
static kolo_status_t reduce_call(struct kolo_nccl_comm *c, int which, const void *send, void *recv,
                                 size_t count, kolo_dtype_t dtype, kolo_op_t op, double scale,
                                 int root, void *stream, struct kolo_errbuf *eb)
{
	kolo_status_t st = live(c, eb);
	if (st != KOLO_OK)
		return st;
	if (op == KOLO_AVERAGE && scale != 1.0)
		return kolo_fail(eb, KOLO_EUNSUPPORTED,
		                 "NCCL: average with a scale (fold 1/n into the scale of a sum)");
	ncclRedOp_t rop = ncclSum;
	bool made;
	st = red_op(c, op, scale, dtype, &rop, &made, eb);
	if (st != KOLO_OK)
		return st;
	ncclResult_t r;
	const char *what;
	cudaStream_t s = (cudaStream_t)stream;
	switch (which) {
	case 0:
		what = "ncclAllReduce";
		r = api.all_reduce(send, recv, count, dtypes[dtype], rop, c->comm, s);
		break;
	case 1:
		what = "ncclReduceScatter";
		r = api.reduce_scatter(send, recv, count, dtypes[dtype], rop, c->comm, s);
		break;
	default:
		what = "ncclReduce";
		r = api.reduce(send, recv, count, dtypes[dtype], rop, root, c->comm, s);
		break;
	}
	st = settle(c, r, what, eb);
	if (made)
		api.red_op_destroy(rop, c->comm);
	return st;
}

kolo_status_t kolo_nccl_all_reduce(struct kolo_nccl_comm *c, const void *send, void *recv,
                                   size_t count, kolo_dtype_t dtype, kolo_op_t op, double scale,
                                   void *stream, struct kolo_errbuf *eb)
{
	return reduce_call(c, 0, send, recv, count, dtype, op, scale, 0, stream, eb);
}

kolo_status_t kolo_nccl_reduce_scatter(struct kolo_nccl_comm *c, const void *send, void *recv,
                                       size_t count, kolo_dtype_t dtype, kolo_op_t op, double scale,
                                       void *stream, struct kolo_errbuf *eb)
{
	return reduce_call(c, 1, send, recv, count, dtype, op, scale, 0, stream, eb);
}

kolo_status_t kolo_nccl_reduce(struct kolo_nccl_comm *c, const void *send, void *recv, size_t count,
                               kolo_dtype_t dtype, kolo_op_t op, int root, void *stream,
                               struct kolo_errbuf *eb)
{
	return reduce_call(c, 2, send, recv, count, dtype, op, 1.0, root, stream, eb);
}

kolo_status_t kolo_nccl_all_gather(struct kolo_nccl_comm *c, const void *send, void *recv,
                                   size_t count, kolo_dtype_t dtype, void *stream,
                                   struct kolo_errbuf *eb)
{
	kolo_status_t st = live(c, eb);
	if (st != KOLO_OK)
		return st;
	return settle(
	        c, api.all_gather(send, recv, count, dtypes[dtype], c->comm, (cudaStream_t)stream),
	        "ncclAllGather", eb);
}

kolo_status_t kolo_nccl_broadcast(struct kolo_nccl_comm *c, const void *send, void *recv,
                                  size_t count, kolo_dtype_t dtype, int root, void *stream,
                                  struct kolo_errbuf *eb)
{
	kolo_status_t st = live(c, eb);
	if (st != KOLO_OK)
		return st;
	return settle(c,
	              api.broadcast(send, recv, count, dtypes[dtype], root, c->comm,
	                            (cudaStream_t)stream),
	              "ncclBroadcast", eb);
}

kolo_status_t kolo_nccl_group_start(struct kolo_errbuf *eb)
{
	const char *why;
	if (!kolo_nccl_usable(&why))
		return kolo_fail(eb, KOLO_EUNSUPPORTED, "NCCL: %s", why);
	ncclResult_t r = api.group_start();
	return r == ncclSuccess ? KOLO_OK : nccl_fail(NULL, r, "ncclGroupStart", eb);
}

kolo_status_t kolo_nccl_group_end(struct kolo_nccl_comm *c, struct kolo_errbuf *eb)
{
	return settle(c, api.group_end(), "ncclGroupEnd", eb);
}

#else /* built without NCCL */

#define WITHOUT "this libkolo was built without NCCL"

bool kolo_nccl_usable(const char **why)
{
	if (why)
		*why = WITHOUT;
	return false;
}

kolo_status_t kolo_nccl_unique_id(uint8_t id[KOLO_NCCL_ID_BYTES], struct kolo_errbuf *eb)
{
	(void)id;
	return kolo_fail(eb, KOLO_EUNSUPPORTED, "NCCL: " WITHOUT);
}

kolo_status_t kolo_nccl_comm_init(struct kolo_nccl_comm **out, int nranks, int rank,
                                  const uint8_t id[KOLO_NCCL_ID_BYTES], int timeout_ms,
                                  struct kolo_errbuf *eb)
{
	(void)nranks, (void)rank, (void)id, (void)timeout_ms;
	*out = NULL;
	return kolo_fail(eb, KOLO_EUNSUPPORTED, "NCCL: " WITHOUT);
}

void kolo_nccl_comm_free(struct kolo_nccl_comm *c)
{
	(void)c;
}

void kolo_nccl_comm_abort(struct kolo_nccl_comm *c)
{
	(void)c;
}

kolo_status_t kolo_nccl_comm_status(struct kolo_nccl_comm *c, struct kolo_errbuf *eb)
{
	(void)c;
	return kolo_fail(eb, KOLO_EUNSUPPORTED, "NCCL: " WITHOUT);
}

bool kolo_nccl_dtype_ok(kolo_dtype_t dtype)
{
	(void)dtype;
	return false;
}

#define UNSUP(...)                                                                                 \
	{                                                                                          \
		return kolo_fail(eb, KOLO_EUNSUPPORTED, "NCCL: " WITHOUT);                         \
	}

kolo_status_t kolo_nccl_all_reduce(struct kolo_nccl_comm *c, const void *send, void *recv,
                                   size_t count, kolo_dtype_t dtype, kolo_op_t op, double scale,
                                   void *stream, struct kolo_errbuf *eb)
{
	(void)c, (void)send, (void)recv, (void)count, (void)dtype, (void)op, (void)scale,
	        (void)stream;
	UNSUP();
}

kolo_status_t kolo_nccl_reduce_scatter(struct kolo_nccl_comm *c, const void *send, void *recv,
                                       size_t count, kolo_dtype_t dtype, kolo_op_t op, double scale,
                                       void *stream, struct kolo_errbuf *eb)
{
	(void)c, (void)send, (void)recv, (void)count, (void)dtype, (void)op, (void)scale,
	        (void)stream;
	UNSUP();
}

kolo_status_t kolo_nccl_reduce(struct kolo_nccl_comm *c, const void *send, void *recv, size_t count,
                               kolo_dtype_t dtype, kolo_op_t op, int root, void *stream,
                               struct kolo_errbuf *eb)
{
	(void)c, (void)send, (void)recv, (void)count, (void)dtype, (void)op, (void)root,
	        (void)stream;
	UNSUP();
}

kolo_status_t kolo_nccl_all_gather(struct kolo_nccl_comm *c, const void *send, void *recv,
                                   size_t count, kolo_dtype_t dtype, void *stream,
                                   struct kolo_errbuf *eb)
{
	(void)c, (void)send, (void)recv, (void)count, (void)dtype, (void)stream;
	UNSUP();
}

kolo_status_t kolo_nccl_broadcast(struct kolo_nccl_comm *c, const void *send, void *recv,
                                  size_t count, kolo_dtype_t dtype, int root, void *stream,
                                  struct kolo_errbuf *eb)
{
	(void)c, (void)send, (void)recv, (void)count, (void)dtype, (void)root, (void)stream;
	UNSUP();
}

kolo_status_t kolo_nccl_group_start(struct kolo_errbuf *eb)
{
	UNSUP();
}

kolo_status_t kolo_nccl_group_end(struct kolo_nccl_comm *c, struct kolo_errbuf *eb)
{
	(void)c;
	UNSUP();
}

#endif
