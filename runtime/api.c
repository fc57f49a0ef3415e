/* The public getters and blocking collectives of kolo.h: argument checks,
 * then delegation to ring/. */
#include "runtime.h"

#include "fusion.h"

#include <stdlib.h>
#include <string.h>

KOLO_API int kolo_rank(const kolo_comm_t *comm)
{
	return comm ? comm->assignment.rank : -1;
}

KOLO_API int kolo_size(const kolo_comm_t *comm)
{
	return comm ? comm->assignment.size : -1;
}

KOLO_API int kolo_local_rank(const kolo_comm_t *comm)
{
	return comm ? comm->assignment.local_rank : -1;
}

KOLO_API int kolo_local_size(const kolo_comm_t *comm)
{
	return comm ? comm->assignment.local_size : -1;
}

KOLO_API int kolo_cross_rank(const kolo_comm_t *comm)
{
	return comm ? comm->assignment.cross_rank : -1;
}

KOLO_API int kolo_cross_size(const kolo_comm_t *comm)
{
	return comm ? comm->assignment.cross_size : -1;
}

KOLO_API int64_t kolo_round(const kolo_comm_t *comm)
{
	return comm ? comm->assignment.round : -1;
}

KOLO_API const char *kolo_last_error(const kolo_comm_t *comm)
{
	return comm ? comm->err.msg : "comm is NULL";
}

/* ---- argument checks -------------------------------------------------- */

#define CHECK_COMM(comm)                                                                           \
	do {                                                                                       \
		if (!(comm) || !(comm)->ring)                                                      \
			return KOLO_EINVAL;                                                        \
	} while (0)

static kolo_status_t check_dtype(struct kolo_comm *comm, const char *fn, kolo_dtype_t dtype)
{
	if ((unsigned)dtype >= KOLO_DTYPE_COUNT)
		return kolo_comm_fail(comm, KOLO_EINVAL, "%s: invalid dtype %d", fn, (int)dtype);
	return KOLO_OK;
}

static kolo_status_t check_op(struct kolo_comm *comm, const char *fn, kolo_op_t op)
{
	if ((unsigned)op >= KOLO_OP_COUNT)
		return kolo_comm_fail(comm, KOLO_EINVAL, "%s: invalid op %d", fn, (int)op);
	return KOLO_OK;
}

static kolo_status_t check_buf(struct kolo_comm *comm, const char *fn, const char *name,
                               const void *buf, size_t count)
{
	if (!buf && count > 0)
		return kolo_comm_fail(comm, KOLO_EINVAL, "%s: %s is NULL with %zu elements", fn,
		                      name, count);
	return KOLO_OK;
}

/* Elements in `count` blocks of `n`, failing on overflow of a byte count. */
static kolo_status_t check_total(struct kolo_comm *comm, const char *fn, size_t n, size_t blocks,
                                 kolo_dtype_t dtype, size_t *total)
{
	size_t es = kolo_dtype_size(dtype);
	if (blocks && n > SIZE_MAX / blocks / es)
		return kolo_comm_fail(comm, KOLO_EINVAL, "%s: %zu x %zu elements overflow", fn, n,
		                      blocks);
	*total = n * blocks;
	return KOLO_OK;
}

static kolo_status_t check_counts(struct kolo_comm *comm, const char *fn, const char *name,
                                  const size_t *counts, kolo_dtype_t dtype, size_t *total)
{
	if (!counts)
		return kolo_comm_fail(comm, KOLO_EINVAL, "%s: %s is NULL", fn, name);
	size_t es = kolo_dtype_size(dtype), sum = 0;
	for (int i = 0; i < comm->assignment.size; i++) {
		if (counts[i] > SIZE_MAX / es - sum)
			return kolo_comm_fail(comm, KOLO_EINVAL, "%s: %s overflow", fn, name);
		sum += counts[i];
	}
	*total = sum;
	return KOLO_OK;
}

static kolo_status_t ring_result(struct kolo_comm *comm, const char *fn, kolo_status_t st)
{
	if (st != KOLO_OK) {
		kolo_comm_fail(comm, st, "%s: %s", fn, kolo_ring_last_error(comm->ring));
		st = kolo_runtime_elastic_failed(comm, st);
	}
	return st;
}

/* One blocking collective, as a closure: run directly on the ring, or, once
 * the fusion engine owns the ring, on the engine thread at the same point of
 * every rank's sequence (kolo_engine_run_exclusive). */
enum coll_kind { C_ALLREDUCE, C_ALLGATHERV, C_BROADCAST, C_REDUCESCATTER, C_ALLTOALLV, C_BARRIER };

struct coll {
	enum coll_kind kind;
	const void *send;
	void *recv;
	size_t count;
	const size_t *counts, *rcounts;
	kolo_dtype_t dtype;
	kolo_op_t op;
	double pre, post;
	int root;
};

static kolo_status_t coll_exec(void *arg, struct kolo_ring_comm *rc)
{
	const struct coll *c = arg;
	switch (c->kind) {
	case C_ALLREDUCE:
		return kolo_ring_allreduce(rc, c->send, c->recv, c->count, c->dtype, c->op, c->pre,
		                           c->post);
	case C_ALLGATHERV:
		return kolo_ring_allgatherv(rc, c->send, c->recv, c->counts, c->dtype);
	case C_BROADCAST:
		return kolo_ring_broadcast(rc, c->recv, c->count, c->dtype, c->root);
	case C_REDUCESCATTER:
		return kolo_ring_reducescatter(rc, c->send, c->recv, c->counts, c->dtype, c->op,
		                               c->pre, c->post);
	case C_ALLTOALLV:
		return kolo_ring_alltoallv(rc, c->send, c->counts, c->recv, c->rcounts, c->dtype);
	case C_BARRIER:
		return kolo_ring_barrier(rc);
	}
	return KOLO_EINVAL;
}

static kolo_status_t run(struct kolo_comm *comm, const char *fn, struct coll *c)
{
	pthread_mutex_lock(&comm->engine_lock);
	struct kolo_engine *e = comm->engine;
	pthread_mutex_unlock(&comm->engine_lock);
	if (!e)
		return ring_result(comm, fn, coll_exec(c, comm->ring));
	struct kolo_errbuf eb = {{0}};
	kolo_status_t st = kolo_engine_run_exclusive(e, coll_exec, c, &eb);
	if (st != KOLO_OK) {
		kolo_comm_fail(comm, st, "%s: %s", fn, eb.msg);
		st = kolo_runtime_elastic_failed(comm, st);
	}
	return st;
}

/* One count per rank, each `count`. */
static size_t *counts_alloc(struct kolo_comm *comm, const char *fn, size_t count)
{
	size_t *c = malloc((size_t)comm->assignment.size * sizeof(*c));
	if (!c) {
		kolo_comm_fail(comm, KOLO_ENOMEM, "%s: out of memory", fn);
		return NULL;
	}
	for (int i = 0; i < comm->assignment.size; i++)
		c[i] = count;
	return c;
}

/* ---- collectives ------------------------------------------------------ */

KOLO_API kolo_status_t kolo_allreduce_scaled(kolo_comm_t *comm, const void *sendbuf, void *recvbuf,
                                             size_t count, kolo_dtype_t dtype, kolo_op_t op,
                                             double prescale, double postscale)
{
	static const char fn[] = "kolo_allreduce";
	size_t total = 0;
	CHECK_COMM(comm);
	KOLO_CHECK(check_dtype(comm, fn, dtype));
	KOLO_CHECK(check_op(comm, fn, op));
	KOLO_CHECK(check_buf(comm, fn, "sendbuf", sendbuf, count));
	KOLO_CHECK(check_buf(comm, fn, "recvbuf", recvbuf, count));
	KOLO_CHECK(check_total(comm, fn, count, 1, dtype, &total));
	return run(comm, fn,
	           &(struct coll){.kind = C_ALLREDUCE,
	                          .send = sendbuf,
	                          .recv = recvbuf,
	                          .count = count,
	                          .dtype = dtype,
	                          .op = op,
	                          .pre = prescale,
	                          .post = postscale});
}

KOLO_API kolo_status_t kolo_allreduce(kolo_comm_t *comm, const void *sendbuf, void *recvbuf,
                                      size_t count, kolo_dtype_t dtype, kolo_op_t op)
{
	return kolo_allreduce_scaled(comm, sendbuf, recvbuf, count, dtype, op, 1.0, 1.0);
}

KOLO_API kolo_status_t kolo_allgatherv(kolo_comm_t *comm, const void *sendbuf, size_t sendcount,
                                       void *recvbuf, const size_t *recvcounts, kolo_dtype_t dtype)
{
	static const char fn[] = "kolo_allgatherv";
	size_t total = 0;
	CHECK_COMM(comm);
	KOLO_CHECK(check_dtype(comm, fn, dtype));
	KOLO_CHECK(check_counts(comm, fn, "recvcounts", recvcounts, dtype, &total));
	if (sendcount != recvcounts[comm->assignment.rank])
		return kolo_comm_fail(
		        comm, KOLO_EINVAL, "%s: sendcount %zu differs from recvcounts[%d] = %zu",
		        fn, sendcount, comm->assignment.rank, recvcounts[comm->assignment.rank]);
	KOLO_CHECK(check_buf(comm, fn, "sendbuf", sendbuf, sendcount));
	KOLO_CHECK(check_buf(comm, fn, "recvbuf", recvbuf, total));
	return run(comm, fn,
	           &(struct coll){.kind = C_ALLGATHERV,
	                          .send = sendbuf,
	                          .recv = recvbuf,
	                          .counts = recvcounts,
	                          .dtype = dtype});
}

KOLO_API kolo_status_t kolo_allgather(kolo_comm_t *comm, const void *sendbuf, void *recvbuf,
                                      size_t count, kolo_dtype_t dtype)
{
	static const char fn[] = "kolo_allgather";
	size_t total = 0;
	CHECK_COMM(comm);
	KOLO_CHECK(check_dtype(comm, fn, dtype));
	KOLO_CHECK(check_total(comm, fn, count, (size_t)comm->assignment.size, dtype, &total));
	KOLO_CHECK(check_buf(comm, fn, "sendbuf", sendbuf, count));
	KOLO_CHECK(check_buf(comm, fn, "recvbuf", recvbuf, total));
	size_t *counts = counts_alloc(comm, fn, count);
	if (!counts)
		return KOLO_ENOMEM;
	kolo_status_t st = run(comm, fn,
	                       &(struct coll){.kind = C_ALLGATHERV,
	                                      .send = sendbuf,
	                                      .recv = recvbuf,
	                                      .counts = counts,
	                                      .dtype = dtype});
	free(counts);
	return st;
}

KOLO_API kolo_status_t kolo_broadcast(kolo_comm_t *comm, void *buf, size_t count,
                                      kolo_dtype_t dtype, int root)
{
	static const char fn[] = "kolo_broadcast";
	size_t total = 0;
	CHECK_COMM(comm);
	KOLO_CHECK(check_dtype(comm, fn, dtype));
	if (root < 0 || root >= comm->assignment.size)
		return kolo_comm_fail(comm, KOLO_EINVAL, "%s: root %d is not a rank of 0..%d", fn,
		                      root, comm->assignment.size - 1);
	KOLO_CHECK(check_buf(comm, fn, "buf", buf, count));
	KOLO_CHECK(check_total(comm, fn, count, 1, dtype, &total));
	return run(comm, fn,
	           &(struct coll){.kind = C_BROADCAST,
	                          .recv = buf,
	                          .count = count,
	                          .dtype = dtype,
	                          .root = root});
}

KOLO_API kolo_status_t kolo_reducescatter(kolo_comm_t *comm, const void *sendbuf, void *recvbuf,
                                          size_t count, kolo_dtype_t dtype, kolo_op_t op)
{
	static const char fn[] = "kolo_reducescatter";
	size_t total = 0;
	CHECK_COMM(comm);
	KOLO_CHECK(check_dtype(comm, fn, dtype));
	KOLO_CHECK(check_op(comm, fn, op));
	KOLO_CHECK(check_total(comm, fn, count, 1, dtype, &total));
	int size = comm->assignment.size, rank = comm->assignment.rank;
	KOLO_CHECK(check_buf(comm, fn, "sendbuf", sendbuf, count));
	KOLO_CHECK(check_buf(comm, fn, "recvbuf", recvbuf,
	                     kolo_reducescatter_count(count, size, rank)));
	size_t *counts = counts_alloc(comm, fn, 0);
	if (!counts)
		return KOLO_ENOMEM;
	for (int i = 0; i < size; i++)
		counts[i] = kolo_reducescatter_count(count, size, i);
	kolo_status_t st = run(comm, fn,
	                       &(struct coll){.kind = C_REDUCESCATTER,
	                                      .send = sendbuf,
	                                      .recv = recvbuf,
	                                      .counts = counts,
	                                      .dtype = dtype,
	                                      .op = op,
	                                      .pre = 1.0,
	                                      .post = 1.0});
	free(counts);
	return st;
}

KOLO_API kolo_status_t kolo_alltoallv(kolo_comm_t *comm, const void *sendbuf,
                                      const size_t *sendcounts, void *recvbuf,
                                      const size_t *recvcounts, kolo_dtype_t dtype)
{
	static const char fn[] = "kolo_alltoallv";
	size_t stotal = 0, rtotal = 0;
	CHECK_COMM(comm);
	KOLO_CHECK(check_dtype(comm, fn, dtype));
	KOLO_CHECK(check_counts(comm, fn, "sendcounts", sendcounts, dtype, &stotal));
	KOLO_CHECK(check_counts(comm, fn, "recvcounts", recvcounts, dtype, &rtotal));
	KOLO_CHECK(check_buf(comm, fn, "sendbuf", sendbuf, stotal));
	KOLO_CHECK(check_buf(comm, fn, "recvbuf", recvbuf, rtotal));
	return run(comm, fn,
	           &(struct coll){.kind = C_ALLTOALLV,
	                          .send = sendbuf,
	                          .recv = recvbuf,
	                          .counts = sendcounts,
	                          .rcounts = recvcounts,
	                          .dtype = dtype});
}

KOLO_API kolo_status_t kolo_alltoall(kolo_comm_t *comm, const void *sendbuf, void *recvbuf,
                                     size_t count, kolo_dtype_t dtype)
{
	static const char fn[] = "kolo_alltoall";
	size_t total = 0;
	CHECK_COMM(comm);
	KOLO_CHECK(check_dtype(comm, fn, dtype));
	KOLO_CHECK(check_total(comm, fn, count, (size_t)comm->assignment.size, dtype, &total));
	KOLO_CHECK(check_buf(comm, fn, "sendbuf", sendbuf, total));
	KOLO_CHECK(check_buf(comm, fn, "recvbuf", recvbuf, total));
	size_t *counts = counts_alloc(comm, fn, count);
	if (!counts)
		return KOLO_ENOMEM;
	kolo_status_t st = run(comm, fn,
	                       &(struct coll){.kind = C_ALLTOALLV,
	                                      .send = sendbuf,
	                                      .recv = recvbuf,
	                                      .counts = counts,
	                                      .rcounts = counts,
	                                      .dtype = dtype});
	free(counts);
	return st;
}

KOLO_API kolo_status_t kolo_barrier(kolo_comm_t *comm)
{
	CHECK_COMM(comm);
	return run(comm, "kolo_barrier", &(struct coll){.kind = C_BARRIER});
}
