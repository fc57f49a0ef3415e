/* async: the public async API of kolo/async.h. Checks the arguments with
 * args.c (as the blocking API does), creates the fusion engine on the comm at
 * first use and hands every operation to it. */
#include "fusion.h"
#include "gpu.h"
#include "runtime.h"

#include <stdlib.h>
#include <string.h>

/* The comm's engine, created on first use. comm has passed kolo_args_comm. */
static kolo_status_t engine_of(struct kolo_comm *comm, struct kolo_engine **out)
{
	*out = NULL;
	pthread_mutex_lock(&comm->engine_lock);
	kolo_status_t st = KOLO_OK;
	if (!comm->engine) {
		struct kolo_errbuf eb = {{0}};
		struct kolo_engine_config cfg;
		kolo_runtime_engine_config(&cfg);
		cfg.flight = comm->flight;
		cfg.timeout_ms = comm->timeout_ms;
		kolo_device_engine_hooks(comm, &cfg.device);
		st = kolo_engine_create(comm->ring, comm->assignment.rank, comm->assignment.size,
		                        &cfg, &comm->engine, &eb);
		if (st != KOLO_OK)
			kolo_comm_fail(comm, st, "starting the fusion engine: %s", eb.msg);
	}
	*out = comm->engine;
	pthread_mutex_unlock(&comm->engine_lock);
	return st;
}

/* op's arguments have passed args.c. */
static kolo_status_t submit(struct kolo_comm *comm, struct kolo_engine_op *op,
                            kolo_handle_t **handle)
{
	struct kolo_engine *e;
	kolo_status_t st = engine_of(comm, &e);
	if (st != KOLO_OK)
		return st;
	op->owner = comm;
	struct kolo_errbuf eb = {{0}};
	/* Device buffers (args.c counted them): the op's work follows what the
	 * caller's stream has queued now. */
	op->device = kolo_args_mem_device() > 0;
	if (op->device && (st = kolo_device_ready_event(&op->ready_event, &eb)) != KOLO_OK)
		return kolo_comm_fail(comm, st, "%s", eb.msg);
	st = kolo_engine_enqueue(e, op, handle, &eb);
	if (st != KOLO_OK) {
		kolo_gpu_event_destroy(op->ready_event);
		return kolo_runtime_elastic_failed(comm, kolo_comm_fail(comm, st, "%s", eb.msg));
	}
	return KOLO_OK;
}

KOLO_API kolo_status_t kolo_allreduce_async(kolo_comm_t *comm, const char *name,
                                            const void *sendbuf, void *recvbuf, size_t count,
                                            kolo_dtype_t dtype, kolo_op_t op, double prescale,
                                            double postscale, kolo_callback_fn cb, void *cb_arg,
                                            kolo_handle_t **handle)
{
	kolo_args_mem_reset();
	if (handle)
		*handle = NULL;
	KOLO_CHECK(
	        kolo_args_allreduce(comm, sendbuf, recvbuf, count, dtype, op, prescale, postscale));
	KOLO_CHECK(kolo_args_name(comm, "allreduce", "name", name));
	struct kolo_engine_op o = {
	        .kind = KOLO_FK_ALLREDUCE,
	        .name = name,
	        .dtype = dtype,
	        .op = op,
	        .prescale = prescale,
	        .postscale = postscale,
	        .count = count,
	        .sendbuf = sendbuf,
	        .recvbuf = recvbuf,
	        .cb = cb,
	        .cb_arg = cb_arg,
	};
	return submit(comm, &o, handle);
}

KOLO_API kolo_status_t kolo_grouped_allreduce_async(
        kolo_comm_t *comm, int n, const char *const *names, const void *const *sendbufs,
        void *const *recvbufs, const size_t *counts, kolo_dtype_t dtype, kolo_op_t op,
        double prescale, double postscale, kolo_callback_fn cb, void *cb_arg,
        kolo_handle_t **handle)
{
	kolo_args_mem_reset();
	if (handle)
		*handle = NULL;
	KOLO_CHECK(kolo_args_grouped_allreduce(comm, n, names, sendbufs, recvbufs, counts, dtype,
	                                       op, prescale, postscale));
	struct kolo_engine_op o = {
	        .kind = KOLO_FK_GROUP,
	        .dtype = dtype,
	        .op = op,
	        .prescale = prescale,
	        .postscale = postscale,
	        .n = n,
	        .names = names,
	        .sendbufs = sendbufs,
	        .recvbufs = recvbufs,
	        .counts = counts,
	        .cb = cb,
	        .cb_arg = cb_arg,
	};
	return submit(comm, &o, handle);
}

KOLO_API kolo_status_t kolo_allgather_async(kolo_comm_t *comm, const char *name,
                                            const void *sendbuf, size_t sendcount,
                                            kolo_dtype_t dtype, void **recvbuf, size_t *recvcounts,
                                            kolo_callback_fn cb, void *cb_arg,
                                            kolo_handle_t **handle)
{
	static const char coll[] = "allgather";
	kolo_args_mem_reset();
	if (handle)
		*handle = NULL;
	KOLO_CHECK(kolo_args_allgather(comm, sendbuf, sendcount, dtype));
	KOLO_CHECK(kolo_args_name(comm, coll, "name", name));
	KOLO_CHECK(kolo_args_ptr(comm, coll, "recvbuf", recvbuf));
	KOLO_CHECK(kolo_args_ptr(comm, coll, "recvcounts", recvcounts));
	struct kolo_engine_op o = {
	        .kind = KOLO_FK_ALLGATHER,
	        .name = name,
	        .dtype = dtype,
	        .count = sendcount,
	        .sendbuf = sendbuf,
	        .recvbuf_out = recvbuf,
	        .recvcounts = recvcounts,
	        .cb = cb,
	        .cb_arg = cb_arg,
	};
	return submit(comm, &o, handle);
}

KOLO_API kolo_status_t kolo_allgather_into_async(kolo_comm_t *comm, const char *name,
                                                 const void *sendbuf, size_t sendcount,
                                                 kolo_dtype_t dtype, void *recvbuf, size_t recvcap,
                                                 size_t *recvcounts, kolo_callback_fn cb,
                                                 void *cb_arg, kolo_handle_t **handle)
{
	static const char coll[] = "allgather";
	kolo_args_mem_reset();
	if (handle)
		*handle = NULL;
	KOLO_CHECK(kolo_args_allgather(comm, sendbuf, sendcount, dtype));
	KOLO_CHECK(kolo_args_name(comm, coll, "name", name));
	KOLO_CHECK(kolo_args_buf(comm, coll, "recvbuf", recvbuf, recvcap));
	KOLO_CHECK(kolo_args_ptr(comm, coll, "recvcounts", recvcounts));
	KOLO_CHECK(kolo_args_same_memory(comm, coll, sendbuf, sendcount, recvbuf, recvcap));
	struct kolo_engine_op o = {
	        .kind = KOLO_FK_ALLGATHER,
	        .name = name,
	        .dtype = dtype,
	        .count = sendcount,
	        .sendbuf = sendbuf,
	        .recv_into = true,
	        .recvbuf_into = recvbuf,
	        .recv_capacity = recvcap,
	        .recvcounts = recvcounts,
	        .cb = cb,
	        .cb_arg = cb_arg,
	};
	return submit(comm, &o, handle);
}

KOLO_API kolo_status_t kolo_broadcast_async(kolo_comm_t *comm, const char *name, void *buf,
                                            size_t count, kolo_dtype_t dtype, int root,
                                            kolo_callback_fn cb, void *cb_arg,
                                            kolo_handle_t **handle)
{
	kolo_args_mem_reset();
	if (handle)
		*handle = NULL;
	KOLO_CHECK(kolo_args_broadcast(comm, buf, count, dtype, root));
	KOLO_CHECK(kolo_args_name(comm, "broadcast", "name", name));
	struct kolo_engine_op o = {
	        .kind = KOLO_FK_BROADCAST,
	        .name = name,
	        .dtype = dtype,
	        .root = root,
	        .count = count,
	        .recvbuf = buf,
	        .cb = cb,
	        .cb_arg = cb_arg,
	};
	return submit(comm, &o, handle);
}

KOLO_API kolo_status_t kolo_alltoall_async(kolo_comm_t *comm, const char *name, const void *sendbuf,
                                           size_t count, const size_t *sendcounts,
                                           kolo_dtype_t dtype, void **recvbuf, size_t *recvcounts,
                                           kolo_callback_fn cb, void *cb_arg,
                                           kolo_handle_t **handle)
{
	static const char coll[] = "alltoall";
	size_t total = 0;
	kolo_args_mem_reset();
	if (handle)
		*handle = NULL;
	KOLO_CHECK(kolo_args_alltoall(comm, sendbuf, count, sendcounts, dtype, &total));
	KOLO_CHECK(kolo_args_name(comm, coll, "name", name));
	KOLO_CHECK(kolo_args_ptr(comm, coll, "recvbuf", recvbuf));
	KOLO_CHECK(kolo_args_ptr(comm, coll, "recvcounts", recvcounts));
	/* The engine takes count as the total of the sendcounts. */
	struct kolo_engine_op o = {
	        .kind = KOLO_FK_ALLTOALL,
	        .name = name,
	        .dtype = dtype,
	        .count = total,
	        .sendcounts = sendcounts,
	        .sendbuf = sendbuf,
	        .recvbuf_out = recvbuf,
	        .recvcounts = recvcounts,
	        .cb = cb,
	        .cb_arg = cb_arg,
	};
	return submit(comm, &o, handle);
}

KOLO_API kolo_status_t kolo_alltoall_into_async(kolo_comm_t *comm, const char *name,
                                                const void *sendbuf, size_t count,
                                                const size_t *sendcounts, kolo_dtype_t dtype,
                                                void *recvbuf, size_t recvcap, size_t *recvcounts,
                                                kolo_callback_fn cb, void *cb_arg,
                                                kolo_handle_t **handle)
{
	static const char coll[] = "alltoall";
	size_t total = 0;
	kolo_args_mem_reset();
	if (handle)
		*handle = NULL;
	KOLO_CHECK(kolo_args_alltoall(comm, sendbuf, count, sendcounts, dtype, &total));
	KOLO_CHECK(kolo_args_name(comm, coll, "name", name));
	KOLO_CHECK(kolo_args_buf(comm, coll, "recvbuf", recvbuf, recvcap));
	KOLO_CHECK(kolo_args_ptr(comm, coll, "recvcounts", recvcounts));
	KOLO_CHECK(kolo_args_same_memory(comm, coll, sendbuf, total, recvbuf, recvcap));
	struct kolo_engine_op o = {
	        .kind = KOLO_FK_ALLTOALL,
	        .name = name,
	        .dtype = dtype,
	        .count = total,
	        .sendcounts = sendcounts,
	        .sendbuf = sendbuf,
	        .recv_into = true,
	        .recvbuf_into = recvbuf,
	        .recv_capacity = recvcap,
	        .recvcounts = recvcounts,
	        .cb = cb,
	        .cb_arg = cb_arg,
	};
	return submit(comm, &o, handle);
}

KOLO_API kolo_status_t kolo_reducescatter_async(kolo_comm_t *comm, const char *name,
                                                const void *sendbuf, void *recvbuf, size_t count,
                                                kolo_dtype_t dtype, kolo_op_t op, double prescale,
                                                double postscale, kolo_callback_fn cb, void *cb_arg,
                                                kolo_handle_t **handle)
{
	kolo_args_mem_reset();
	if (handle)
		*handle = NULL;
	KOLO_CHECK(kolo_args_reducescatter(comm, sendbuf, recvbuf, count, dtype, op, prescale,
	                                   postscale));
	KOLO_CHECK(kolo_args_name(comm, "reducescatter", "name", name));
	struct kolo_engine_op o = {
	        .kind = KOLO_FK_REDUCESCATTER,
	        .name = name,
	        .dtype = dtype,
	        .op = op,
	        .prescale = prescale,
	        .postscale = postscale,
	        .count = count,
	        .sendbuf = sendbuf,
	        .recvbuf = recvbuf,
	        .cb = cb,
	        .cb_arg = cb_arg,
	};
	return submit(comm, &o, handle);
}

KOLO_API kolo_status_t kolo_barrier_async(kolo_comm_t *comm, kolo_callback_fn cb, void *cb_arg,
                                          kolo_handle_t **handle)
{
	kolo_args_mem_reset();
	if (handle)
		*handle = NULL;
	KOLO_CHECK(kolo_args_comm(comm, "barrier"));
	struct kolo_engine_op o = {.kind = KOLO_FK_BARRIER, .cb = cb, .cb_arg = cb_arg};
	return submit(comm, &o, handle);
}

KOLO_API kolo_status_t kolo_poll(kolo_handle_t *handle, int *done)
{
	return kolo_handle_poll_done(handle, done);
}

KOLO_API kolo_status_t kolo_wait_for(kolo_handle_t *handle, int timeout_ms, int *done)
{
	return kolo_handle_wait_for(handle, timeout_ms, done);
}

KOLO_API kolo_status_t kolo_wait(kolo_handle_t *handle)
{
	if (!handle)
		return KOLO_EINVAL;
	struct kolo_comm *comm = kolo_handle_owner(handle);
	struct kolo_errbuf eb = {{0}};
	kolo_status_t st = kolo_handle_wait_release(handle, &eb);
	if (st != KOLO_OK && comm) {
		kolo_comm_fail(comm, st, "%s", eb.msg);
		st = kolo_runtime_elastic_failed(comm, st);
	}
	return st;
}

KOLO_API void kolo_handle_release(kolo_handle_t *handle)
{
	kolo_handle_drop(handle);
}

KOLO_API void kolo_free(void *ptr)
{
	if (kolo_mem_kind(ptr) == KOLO_MEM_DEVICE)
		kolo_gpu_free(ptr);
	else
		free(ptr);
}

KOLO_API kolo_status_t kolo_join(kolo_comm_t *comm, int *last_rank)
{
	KOLO_CHECK(kolo_args_comm(comm, "join"));
	struct kolo_engine *e;
	kolo_status_t st = engine_of(comm, &e);
	if (st != KOLO_OK)
		return st;
	int last = -1;
	struct kolo_engine_op o = {.kind = KOLO_FK_JOIN, .last_rank = &last, .owner = comm};
	struct kolo_errbuf eb = {{0}};
	st = kolo_engine_run(e, &o, &eb);
	if (st != KOLO_OK)
		return kolo_comm_fail(comm, st, "kolo_join: %s", eb.msg);
	if (last_rank)
		*last_rank = last;
	return KOLO_OK;
}

KOLO_API kolo_status_t kolo_timeline_start(kolo_comm_t *comm, const char *path)
{
	KOLO_CHECK(kolo_args_comm(comm, "timeline"));
	struct kolo_engine *e;
	kolo_status_t st = engine_of(comm, &e);
	if (st != KOLO_OK)
		return st;
	struct kolo_errbuf eb = {{0}};
	st = kolo_engine_timeline_start(e, path, &eb);
	if (st != KOLO_OK)
		return kolo_comm_fail(comm, st, "kolo_timeline_start: %s", eb.msg);
	return KOLO_OK;
}

KOLO_API kolo_status_t kolo_timeline_stop(kolo_comm_t *comm)
{
	if (!comm)
		return KOLO_EINVAL;
	pthread_mutex_lock(&comm->engine_lock);
	struct kolo_engine *e = comm->engine;
	pthread_mutex_unlock(&comm->engine_lock);
	return e ? kolo_engine_timeline_stop(e) : KOLO_OK;
}
