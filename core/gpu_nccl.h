/* gpu_nccl: NCCL, loaded at run time (dlopen of libnccl.so.2), for the
 * collectives among the GPUs of one host (docs/gpu.md). Like gpu.h, callers
 * need no CUDA or NCCL header: communicators, streams and reduction ops are
 * opaque. Every call returns a kolo_status_t with the detail in eb. A
 * communicator is made non-blocking where the library allows
 * (ncclCommInitRankConfig with blocking = 0), so that no call waits without a
 * deadline: each call that reports "in progress" is polled until it settles
 * or the deadline passes, and then the communicator is aborted. */
#ifndef KOLO_GPU_NCCL_H
#define KOLO_GPU_NCCL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core.h"
#include "kolo/kolo.h"

#define KOLO_NCCL_ID_BYTES 128 /* sizeof(ncclUniqueId) */

struct kolo_nccl_comm; /* an ncclComm_t and what kolo keeps beside it */

/* Whether libnccl could be loaded with every entry point used here; when
 * false, *why (may be NULL) gets the reason, a static string. Thread-safe. */
bool kolo_nccl_usable(const char **why);

/* ncclGetUniqueId: the id one rank creates and every member receives. */
kolo_status_t kolo_nccl_unique_id(uint8_t id[KOLO_NCCL_ID_BYTES], struct kolo_errbuf *eb);

/* ncclCommInitRank of rank among nranks on the calling thread's current CUDA
 * device, settled within timeout_ms (aborted, KOLO_ETIMEDOUT, otherwise). */
kolo_status_t kolo_nccl_comm_init(struct kolo_nccl_comm **out, int nranks, int rank,
                                  const uint8_t id[KOLO_NCCL_ID_BYTES], int timeout_ms,
                                  struct kolo_errbuf *eb);
/* ncclCommDestroy (graceful: the members' pending work completes) where the
 * communicator is healthy, ncclCommAbort otherwise. Accepts NULL. */
void kolo_nccl_comm_free(struct kolo_nccl_comm *c);
/* ncclCommAbort: pending and blocked work is given up; for a re-form or a
 * failure. The communicator is unusable afterwards (free it). */
void kolo_nccl_comm_abort(struct kolo_nccl_comm *c);
/* KOLO_OK, or the failure the communicator reported (ncclCommGetAsyncError)
 * or met: KOLO_EPEER for a remote error, KOLO_ESYSTEM otherwise. */
kolo_status_t kolo_nccl_comm_status(struct kolo_nccl_comm *c, struct kolo_errbuf *eb);

/* Whether NCCL has dtype (every kolo dtype has an NCCL one). */
bool kolo_nccl_dtype_ok(kolo_dtype_t dtype);

/* The collectives, queued on stream (a cudaStream_t) after the work already
 * there; they run when the stream reaches them. op AVERAGE is ncclAvg; scale
 * != 1 (SUM or AVERAGE only) multiplies every input by it before the sum
 * (ncclRedOpCreatePreMulSum). Device pointers; counts in elements; for
 * reduce_scatter and all_gather, count is each rank's block. */
kolo_status_t kolo_nccl_all_reduce(struct kolo_nccl_comm *c, const void *send, void *recv,
                                   size_t count, kolo_dtype_t dtype, kolo_op_t op, double scale,
                                   void *stream, struct kolo_errbuf *eb);
kolo_status_t kolo_nccl_reduce_scatter(struct kolo_nccl_comm *c, const void *send, void *recv,
                                       size_t count, kolo_dtype_t dtype, kolo_op_t op, double scale,
                                       void *stream, struct kolo_errbuf *eb);
kolo_status_t kolo_nccl_all_gather(struct kolo_nccl_comm *c, const void *send, void *recv,
                                   size_t count, kolo_dtype_t dtype, void *stream,
                                   struct kolo_errbuf *eb);
kolo_status_t kolo_nccl_broadcast(struct kolo_nccl_comm *c, const void *send, void *recv,
                                  size_t count, kolo_dtype_t dtype, int root, void *stream,
                                  struct kolo_errbuf *eb);
kolo_status_t kolo_nccl_reduce(struct kolo_nccl_comm *c, const void *send, void *recv, size_t count,
                               kolo_dtype_t dtype, kolo_op_t op, int root, void *stream,
                               struct kolo_errbuf *eb);
/* ncclGroupStart / ncclGroupEnd around several calls of one rank. */
kolo_status_t kolo_nccl_group_start(struct kolo_errbuf *eb);
kolo_status_t kolo_nccl_group_end(struct kolo_nccl_comm *c, struct kolo_errbuf *eb);

#endif /* KOLO_GPU_NCCL_H */
