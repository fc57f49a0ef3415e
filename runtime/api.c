/* The public getters and blocking collectives of kolo.h: the argument checks
 * of args.c (shared with the async API), then delegation to ring/. */
#include "runtime.h"

#include "fusion.h"
#include "flight.h"
#include "gpu.h"
#include "metrics.h"

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

KOLO_API int kolo_is_homogeneous(const kolo_comm_t *comm)
{
	if (!comm)
		return -1;
	const struct kolo_rdzv_assignment *a = &comm->assignment;
	for (int i = 0; i < a->n_members; i++) {
		int same = 0;
		for (int j = 0; j < a->n_members; j++)
			same += strcmp(a->members[i].host, a->members[j].host) == 0;
		if (same != a->local_size)
			return 0;
	}
	return 1;
}

KOLO_API int64_t kolo_round(const kolo_comm_t *comm)
{
	return comm ? comm->assignment.round : -1;
}

KOLO_API const char *kolo_last_error(const kolo_comm_t *comm)
{
	return comm ? comm->err.msg : "comm is NULL";
}

/* ---- running a collective --------------------------------------------- */

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
	/* Some buffer is device memory (args.c): runtime/device.c runs it, after
	 * the event recorded on the caller's stream, with its failure in eb. */
	bool device;
	struct kolo_comm *comm;
	void *after;
	struct kolo_errbuf *eb;
};

static const enum kolo_dcoll_kind dcoll_kind[] = {
        [C_ALLREDUCE] = KOLO_DC_ALLREDUCE, [C_ALLGATHERV] = KOLO_DC_ALLGATHERV,
        [C_BROADCAST] = KOLO_DC_BROADCAST, [C_REDUCESCATTER] = KOLO_DC_REDUCESCATTER,
        [C_ALLTOALLV] = KOLO_DC_ALLTOALLV,
};

static kolo_status_t device_exec(struct coll *c, struct kolo_ring_comm *rc)
{
	struct kolo_dcoll d = {.kind = dcoll_kind[c->kind],
	                       .send = c->kind == C_BROADCAST ? c->recv : c->send,
	                       .recv = c->recv,
	                       .count = c->count,
	                       .counts = c->counts,
	                       .rcounts = c->rcounts,
	                       .dtype = c->dtype,
	                       .op = c->op,
	                       .pre = c->pre,
	                       .post = c->post,
	                       .root = c->root,
	                       .after = c->after};
	return kolo_device_run(c->comm, rc, &d, c->eb);
}

static kolo_status_t coll_exec(void *arg, struct kolo_ring_comm *rc)
{
	struct coll *c = arg;
	if (c->device && c->kind != C_BARRIER)
		return device_exec(c, rc);
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

static const char *const coll_name[] = {
        [C_ALLREDUCE] = "allreduce", [C_ALLGATHERV] = "allgather",
        [C_BROADCAST] = "broadcast", [C_REDUCESCATTER] = "reducescatter",
        [C_ALLTOALLV] = "alltoall",  [C_BARRIER] = "barrier",
};

static uint64_t coll_bytes(const struct kolo_comm *comm, const struct coll *c);

/* A blocking collective without the engine in the flight recorder: named
 * "<family>.<n>", n counting the comm's blocking calls (the same on every
 * rank, as their order is), and in the data plane from the start. */
static uint64_t record_blocking(struct kolo_comm *comm, const struct coll *c)
{
	if (!comm->flight)
		return 0;
	uint64_t seq = kolo_flight_submit_running(
	        comm->flight, coll_name[c->kind], ++comm->blocking_calls,
	        c->kind == C_BARRIER ? -1 : (int)c->dtype, coll_bytes(comm, c));
	kolo_flight_activity(comm->flight, KOLO_FA_BLOCKING);
	return seq;
}

static kolo_status_t record_end(struct kolo_comm *comm, uint64_t seq, kolo_status_t st)
{
	if (!seq)
		return st;
	kolo_flight_activity(comm->flight, KOLO_FA_IDLE);
	kolo_flight_mark(comm->flight, seq, st == KOLO_OK ? KOLO_FL_DONE : KOLO_FL_FAILED, st,
	                 comm->err.msg);
	return st;
}

static kolo_status_t run_coll(struct kolo_comm *comm, const char *fn, struct coll *c)
{
	pthread_mutex_lock(&comm->engine_lock);
	struct kolo_engine *e = comm->engine;
	pthread_mutex_unlock(&comm->engine_lock);
	uint64_t seq = e ? 0 : record_blocking(comm, c);
	if (!e && !c->device)
		return record_end(comm, seq, ring_result(comm, fn, coll_exec(c, comm->ring)));
	struct kolo_errbuf eb = {{0}};
	kolo_status_t st =
	        e ? kolo_engine_run_exclusive(e, coll_exec, c, &eb) : coll_exec(c, comm->ring);
	if (st != KOLO_OK) {
		/* The device path's own message says more than the engine's. */
		kolo_comm_fail(comm, st, "%s: %s", fn,
		               c->device && c->eb->msg[0] ? c->eb->msg : eb.msg);
		st = kolo_runtime_elastic_failed(comm, st);
	}
	return record_end(comm, seq, st);
}

static const enum kolo_metrics_coll coll_metric[] = {
        [C_ALLREDUCE] = KOLO_MCOLL_ALLREDUCE, [C_ALLGATHERV] = KOLO_MCOLL_ALLGATHER,
        [C_BROADCAST] = KOLO_MCOLL_BROADCAST, [C_REDUCESCATTER] = KOLO_MCOLL_REDUCESCATTER,
        [C_ALLTOALLV] = KOLO_MCOLL_ALLTOALL,  [C_BARRIER] = KOLO_MCOLL_BARRIER,
};

/* The bytes the metrics count (metrics.h): the buffer, the gathered output,
 * the reducescatter's input, what alltoall sends. */
static uint64_t coll_bytes(const struct kolo_comm *comm, const struct coll *c)
{
	uint64_t n = c->count; /* 0 for a barrier and the kinds with counts */
	if (c->kind == C_ALLGATHERV || c->kind == C_REDUCESCATTER || c->kind == C_ALLTOALLV)
		for (int i = 0; i < comm->assignment.size; i++)
			n += c->counts[i];
	return n * kolo_dtype_size(c->dtype);
}

/* A collective with device buffers: after an event on the caller's stream.
 * Its errbuf lives here, not in struct coll, so that the host path does not
 * zero it on every call. */
static kolo_status_t run_device(struct kolo_comm *comm, const char *fn, struct coll *c)
{
	struct kolo_errbuf eb;
	eb.msg[0] = '\0';
	c->device = true;
	c->comm = comm;
	c->eb = &eb;
	kolo_status_t st = kolo_device_ready_event(&c->after, &eb);
	if (st != KOLO_OK)
		return kolo_comm_fail(comm, st, "%s: %s", fn, eb.msg);
	st = run_coll(comm, fn, c);
	kolo_gpu_event_destroy(c->after);
	return st;
}

static kolo_status_t run(struct kolo_comm *comm, const char *fn, struct coll *c)
{
	uint64_t t0 = kolo_metrics_start();
	kolo_status_t st =
	        kolo_args_mem_device() > 0 ? run_device(comm, fn, c) : run_coll(comm, fn, c);
	kolo_metrics_coll_done(coll_metric[c->kind], KOLO_MMODE_BLOCKING, coll_bytes(comm, c), t0,
	                       st);
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
	kolo_args_mem_reset();
	static const char fn[] = "kolo_allreduce";
	KOLO_CHECK(
	        kolo_args_allreduce(comm, sendbuf, recvbuf, count, dtype, op, prescale, postscale));
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
	kolo_args_mem_reset();
	static const char fn[] = "kolo_allgatherv", coll[] = "allgather";
	size_t total = 0;
	KOLO_CHECK(kolo_args_allgather(comm, sendbuf, sendcount, dtype));
	KOLO_CHECK(kolo_args_counts(comm, coll, "recvcounts", recvcounts, dtype, &total));
	int rank = comm->assignment.rank;
	if (sendcount != recvcounts[rank])
		return kolo_args_fail(comm, coll, "sendcount %zu differs from recvcounts[%d] = %zu",
		                      sendcount, rank, recvcounts[rank]);
	KOLO_CHECK(kolo_args_buf(comm, coll, "recvbuf", recvbuf, total));
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
	kolo_args_mem_reset();
	static const char fn[] = "kolo_allgather", coll[] = "allgather";
	size_t total = 0;
	KOLO_CHECK(kolo_args_allgather(comm, sendbuf, count, dtype));
	KOLO_CHECK(kolo_args_elements(comm, coll, count, (size_t)comm->assignment.size, dtype,
	                              &total));
	KOLO_CHECK(kolo_args_buf(comm, coll, "recvbuf", recvbuf, total));
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
	kolo_args_mem_reset();
	static const char fn[] = "kolo_broadcast";
	KOLO_CHECK(kolo_args_broadcast(comm, buf, count, dtype, root));
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
	kolo_args_mem_reset();
	static const char fn[] = "kolo_reducescatter";
	KOLO_CHECK(kolo_args_reducescatter(comm, sendbuf, recvbuf, count, dtype, op, 1.0, 1.0));
	int size = comm->assignment.size;
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
	kolo_args_mem_reset();
	static const char fn[] = "kolo_alltoallv", coll[] = "alltoall";
	size_t rtotal = 0;
	/* Unlike kolo_alltoall_async's, these sendcounts are not optional. */
	KOLO_CHECK(kolo_args_comm(comm, coll));
	KOLO_CHECK(kolo_args_ptr(comm, coll, "sendcounts", sendcounts));
	KOLO_CHECK(kolo_args_alltoall(comm, sendbuf, 0, sendcounts, dtype, NULL));
	KOLO_CHECK(kolo_args_counts(comm, coll, "recvcounts", recvcounts, dtype, &rtotal));
	KOLO_CHECK(kolo_args_buf(comm, coll, "recvbuf", recvbuf, rtotal));
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
	kolo_args_mem_reset();
	static const char fn[] = "kolo_alltoall", coll[] = "alltoall";
	size_t total = 0;
	KOLO_CHECK(kolo_args_comm(comm, coll));
	KOLO_CHECK(kolo_args_dtype(comm, coll, dtype));
	KOLO_CHECK(kolo_args_elements(comm, coll, count, (size_t)comm->assignment.size, dtype,
	                              &total));
	KOLO_CHECK(kolo_args_alltoall(comm, sendbuf, total, NULL, dtype, NULL));
	KOLO_CHECK(kolo_args_buf(comm, coll, "recvbuf", recvbuf, total));
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
	kolo_args_mem_reset();
	KOLO_CHECK(kolo_args_comm(comm, "barrier"));
	return run(comm, "kolo_barrier", &(struct coll){.kind = C_BARRIER});
}
