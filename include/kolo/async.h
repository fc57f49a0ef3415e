/* kolo async API: named collectives run by the fusion engine.
 *
 * A training loop enqueues named tensors as they become ready (e.g. each
 * layer's gradient as backpropagation produces it) and continues. A
 * background thread agrees with every rank on which names are ready
 * everywhere, packs small tensors of the same kind into a fusion buffer
 * (KOLO_FUSION_THRESHOLD), reduces them together and completes each
 * operation: its callback runs (on the engine thread) and its handle becomes
 * done. Names are how ranks match operations: each rank must enqueue the same
 * names, in any order, with matching dtype, count, op, root and scale
 * factors; a mismatch fails that operation on every rank with KOLO_EMISMATCH
 * and a message saying which ranks disagree and how.
 *
 * Enqueue functions are thread-safe. Buffers must stay valid and untouched
 * until the operation completes. If an enqueue function returns an error, the
 * callback is never called and no handle is returned. `handle` may be NULL
 * (fire and forget; use the callback). A name may be reused once its previous
 * operation has completed. */
#ifndef KOLO_ASYNC_H
#define KOLO_ASYNC_H

#include "kolo/kolo.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kolo_handle kolo_handle_t;

/* Called once on the engine thread when the operation completes or fails.
 * Must not block for long and must not call kolo_wait(). */
typedef void (*kolo_callback_fn)(void *arg, kolo_status_t status);

KOLO_API kolo_status_t kolo_allreduce_async(kolo_comm_t *comm, const char *name,
                                            const void *sendbuf, void *recvbuf, size_t count,
                                            kolo_dtype_t dtype, kolo_op_t op, double prescale,
                                            double postscale, kolo_callback_fn cb, void *cb_arg,
                                            kolo_handle_t **handle);

/* n allreduces negotiated and fused atomically (all run in one go or none).
 * One callback / handle for the group. */
KOLO_API kolo_status_t kolo_grouped_allreduce_async(
        kolo_comm_t *comm, int n, const char *const *names, const void *const *sendbufs,
        void *const *recvbufs, const size_t *counts, kolo_dtype_t dtype, kolo_op_t op,
        double prescale, double postscale, kolo_callback_fn cb, void *cb_arg,
        kolo_handle_t **handle);

/* Each rank contributes sendcount elements (counts may differ by rank). On
 * completion *recvbuf points to a malloc'd buffer holding every rank's
 * elements in rank order (the caller frees it) and recvcounts[r] (an array of
 * kolo_size() entries owned by the caller) holds rank r's count. With a CUDA
 * device sendbuf, *recvbuf is device memory on the same device (cudaMalloc;
 * kolo_free or cudaFree frees it). */
KOLO_API kolo_status_t kolo_allgather_async(kolo_comm_t *comm, const char *name,
                                            const void *sendbuf, size_t sendcount,
                                            kolo_dtype_t dtype, void **recvbuf, size_t *recvcounts,
                                            kolo_callback_fn cb, void *cb_arg,
                                            kolo_handle_t **handle);

/* kolo_allgather_async into the caller's recvbuf of recvcap elements (the
 * same kind of memory as sendbuf): nothing allocated, nothing copied. The
 * counts are negotiated as there; when their total exceeds recvcap this rank
 * still takes part and its operation then fails with KOLO_EINVAL. */
KOLO_API kolo_status_t kolo_allgather_into_async(kolo_comm_t *comm, const char *name,
                                                 const void *sendbuf, size_t sendcount,
                                                 kolo_dtype_t dtype, void *recvbuf, size_t recvcap,
                                                 size_t *recvcounts, kolo_callback_fn cb,
                                                 void *cb_arg, kolo_handle_t **handle);

/* kolo_alltoall_async into the caller's recvbuf of recvcap elements, as
 * kolo_allgather_into_async. */
KOLO_API kolo_status_t kolo_alltoall_into_async(kolo_comm_t *comm, const char *name,
                                                const void *sendbuf, size_t count,
                                                const size_t *sendcounts, kolo_dtype_t dtype,
                                                void *recvbuf, size_t recvcap, size_t *recvcounts,
                                                kolo_callback_fn cb, void *cb_arg,
                                                kolo_handle_t **handle);

KOLO_API kolo_status_t kolo_broadcast_async(kolo_comm_t *comm, const char *name, void *buf,
                                            size_t count, kolo_dtype_t dtype, int root,
                                            kolo_callback_fn cb, void *cb_arg,
                                            kolo_handle_t **handle);

/* sendcounts[j] elements go to rank j (NULL: equal split of count, which
 * must then divide by size). On completion *recvbuf is a malloc'd buffer (the
 * caller frees it) and recvcounts[i] the number received from rank i; with a
 * device sendbuf, device memory on the same device (as allgather's). */
KOLO_API kolo_status_t kolo_alltoall_async(kolo_comm_t *comm, const char *name, const void *sendbuf,
                                           size_t count, const size_t *sendcounts,
                                           kolo_dtype_t dtype, void **recvbuf, size_t *recvcounts,
                                           kolo_callback_fn cb, void *cb_arg,
                                           kolo_handle_t **handle);

/* As kolo_reducescatter(): recvbuf gets kolo_reducescatter_count(count, size,
 * rank) elements. */
KOLO_API kolo_status_t kolo_reducescatter_async(kolo_comm_t *comm, const char *name,
                                                const void *sendbuf, void *recvbuf, size_t count,
                                                kolo_dtype_t dtype, kolo_op_t op, double prescale,
                                                double postscale, kolo_callback_fn cb, void *cb_arg,
                                                kolo_handle_t **handle);

KOLO_API kolo_status_t kolo_barrier_async(kolo_comm_t *comm, kolo_callback_fn cb, void *cb_arg,
                                          kolo_handle_t **handle);

/* Point-to-point, between any two ranks, beside the collectives (they run
 * on an endpoint and a thread of their own, made on the first call).
 * kolo_send_async queues `bytes` bytes of buf for rank dst with tag; it
 * completes once they are handed to the transport. kolo_recv_async receives
 * a message of exactly `bytes` bytes with tag from src, or from any rank
 * (KOLO_ANY_SOURCE), into buf; *source (may be NULL) names the sender when it
 * completes. Matching is MPI's: a recv takes the earliest message from its
 * source (or any) with its tag; one sender's messages with one tag arrive in
 * order; a message that comes before its recv waits in memory. A message of
 * another size fails the recv with KOLO_EMISMATCH and stays. A recv without
 * a message, or a send to a rank that never calls send or recv, fails after
 * KOLO_TIMEOUT_MS with KOLO_ETIMEDOUT. A peer that goes fails the round's
 * pending point-to-point operations (KOLO_EPEER; in an elastic job
 * KOLO_EMEMBERSHIP), as does a failed or aborted comm. Host memory only.
 * Callbacks and handles as for the collectives. */
#define KOLO_ANY_SOURCE (-1)
KOLO_API kolo_status_t kolo_send_async(kolo_comm_t *comm, const void *buf, size_t bytes, int dst,
                                       int tag, kolo_callback_fn cb, void *cb_arg,
                                       kolo_handle_t **handle);
KOLO_API kolo_status_t kolo_recv_async(kolo_comm_t *comm, void *buf, size_t bytes, int src, int tag,
                                       int *source, kolo_callback_fn cb, void *cb_arg,
                                       kolo_handle_t **handle);
/* The blocking forms: the async call and kolo_wait. */
KOLO_API kolo_status_t kolo_send(kolo_comm_t *comm, const void *buf, size_t bytes, int dst,
                                 int tag);
KOLO_API kolo_status_t kolo_recv(kolo_comm_t *comm, void *buf, size_t bytes, int src, int tag,
                                 int *source);

/* *done = true once the operation has completed (successfully or not). */
KOLO_API kolo_status_t kolo_poll(kolo_handle_t *handle, int *done);
/* Blocks until the operation completes, returns its status and releases the
 * handle. The detail of a failure is in kolo_last_error(comm). */
KOLO_API kolo_status_t kolo_wait(kolo_handle_t *handle);
/* Waits up to timeout_ms (>= 0) for the operation to complete; *done says
 * whether it has. The handle stays held: kolo_wait then gives its status at
 * once, or kolo_handle_release lets it run on. */
KOLO_API kolo_status_t kolo_wait_for(kolo_handle_t *handle, int timeout_ms, int *done);
/* Releases a handle without waiting; the operation still runs. */
KOLO_API void kolo_handle_release(kolo_handle_t *handle);

/* This rank has run out of data: until every rank has joined, it takes part
 * in the other ranks' allreduces with zeros. Blocks until all ranks have
 * joined; *last_rank (may be NULL) is the last rank to join. */
KOLO_API kolo_status_t kolo_join(kolo_comm_t *comm, int *last_rank);

/* Frees a buffer that kolo allocated for the caller (the results of
 * kolo_allgather_async and kolo_alltoall_async), as free() does, or as
 * cudaFree does for device memory; for bindings that cannot reach the C
 * library's free(). Accepts NULL. */
KOLO_API void kolo_free(void *ptr);

/* Starts / stops writing the Chrome-trace timeline (as KOLO_TIMELINE). */
KOLO_API kolo_status_t kolo_timeline_start(kolo_comm_t *comm, const char *path);
KOLO_API kolo_status_t kolo_timeline_stop(kolo_comm_t *comm);

#ifdef __cplusplus
}
#endif
#endif /* KOLO_ASYNC_H */
