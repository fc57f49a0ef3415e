/* kolo: collective communication for data-parallel training, without MPI.
 *
 * A worker process calls kolo_init(), which reads the KOLO_* environment (set
 * by kolorun or by a pod spec), joins the rendezvous server, waits for its
 * assignment and connects the data plane. Collectives are then called on the
 * returned comm. Every function returns a kolo_status_t; KOLO_OK is 0 and the
 * detail of a failure is in kolo_last_error(comm).
 *
 * Threading: a comm may be used by one thread at a time for collectives;
 * kolo_rank() and friends are safe from any thread. */
#ifndef KOLO_KOLO_H
#define KOLO_KOLO_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(KOLO_BUILDING) && defined(__GNUC__)
#define KOLO_API __attribute__((visibility("default")))
#else
#define KOLO_API
#endif

#define KOLO_VERSION_MAJOR  0
#define KOLO_VERSION_MINOR  1
#define KOLO_VERSION_PATCH  0
#define KOLO_VERSION_STRING "0.1.0"

/* Status codes: few on purpose; the detail goes into kolo_last_error(). */
#define KOLO_STATUS_MAP(X)                                                                         \
	X(OK, 0, "success")                                                                        \
	X(EINVAL, 1, "invalid argument")                                                           \
	X(ETIMEDOUT, 2, "timed out")                                                               \
	X(EPEER, 3, "a peer failed")                                                               \
	X(EMEMBERSHIP, 4, "membership changed; re-form the comm")                                  \
	X(ENOMEM, 5, "out of memory")                                                              \
	X(ESYSTEM, 6, "system call failed")                                                        \
	X(EPROTO, 7, "protocol error")                                                             \
	X(EAUTH, 8, "authentication failed")                                                       \
	X(ENOTFOUND, 9, "not found")                                                               \
	X(ERENDEZVOUS, 10, "rendezvous server unreachable or refused the request")                 \
	X(ECLOSED, 11, "closed")                                                                   \
	X(EMISMATCH, 12, "ranks disagree about an operation")                                      \
	X(ESHUTDOWN, 13, "shut down")                                                              \
	X(EUNSUPPORTED, 14, "not supported")

typedef enum kolo_status {
#define KOLO_STATUS_ENUM_(name, value, text) KOLO_##name = value,
	KOLO_STATUS_MAP(KOLO_STATUS_ENUM_)
#undef KOLO_STATUS_ENUM_
} kolo_status_t;

/* A fixed description of a status code ("timed out"). Never NULL. */
KOLO_API const char *kolo_strerror(kolo_status_t status);
/* The code's name ("KOLO_ETIMEDOUT"). Never NULL. */
KOLO_API const char *kolo_status_name(kolo_status_t status);

typedef enum kolo_dtype {
	KOLO_INT8 = 0,
	KOLO_UINT8 = 1,
	KOLO_INT32 = 2,
	KOLO_INT64 = 3,
	KOLO_FLOAT16 = 4,
	KOLO_BFLOAT16 = 5,
	KOLO_FLOAT32 = 6,
	KOLO_FLOAT64 = 7,
	KOLO_DTYPE_COUNT
} kolo_dtype_t;

typedef enum kolo_op {
	KOLO_SUM = 0,
	KOLO_AVERAGE = 1,
	KOLO_MIN = 2,
	KOLO_MAX = 3,
	KOLO_PRODUCT = 4,
	KOLO_OP_COUNT, /* the element-wise ops above */
	/* Adasum (allreduce and grouped allreduce only, floating-point dtypes,
	 * host memory): each tensor's vectors combine pairwise over a tree as
	 * (1 - a.b/2|a|^2) a + (1 - a.b/2|b|^2) b, dot products and norms in
	 * float64 (docs/collectives.md, "Adasum"). Not an element-wise op: the
	 * fusion engine never fuses two tensors under it. */
	KOLO_ADASUM = 8
} kolo_op_t;

/* Size of one element in bytes; 0 for an invalid dtype. */
KOLO_API size_t kolo_dtype_size(kolo_dtype_t dtype);
/* "float32", "bfloat16", ...; "invalid" for an invalid dtype. */
KOLO_API const char *kolo_dtype_name(kolo_dtype_t dtype);
/* Parses a dtype name; returns KOLO_EINVAL for an unknown name. */
KOLO_API kolo_status_t kolo_dtype_parse(const char *name, kolo_dtype_t *out);
/* "sum", "average", ...; "invalid" for an invalid op. */
KOLO_API const char *kolo_op_name(kolo_op_t op);
KOLO_API kolo_status_t kolo_op_parse(const char *name, kolo_op_t *out);

typedef struct kolo_comm kolo_comm_t;

/* Joins the job described by the environment (KOLO_RENDEZVOUS, KOLO_JOB,
 * KOLO_TOKEN, ...; see `kolo-info --params`), waits for an assignment and
 * connects to the peers. Blocks up to KOLO_INIT_TIMEOUT_MS. On failure *comm
 * is NULL and the reason is logged and available from kolo_init_error().
 * KOLO_ESHUTDOWN: the job finished (a member's training completed, see
 * kolo_elastic_done) before this worker got a rank; it should exit 0. */
KOLO_API kolo_status_t kolo_init(kolo_comm_t **comm);
/* The message of the last failed kolo_init() in this thread. */
KOLO_API const char *kolo_init_error(void);
/* Leaves the job gracefully and frees the comm. Accepts NULL. */
KOLO_API kolo_status_t kolo_finalize(kolo_comm_t *comm);
/* Gives up on the job after a failure this rank knows of (an exception in
 * the training program, a fatal signal being handled): every pending and
 * later collective on comm fails with KOLO_ECLOSED, the peers see this rank
 * go at once, and a following kolo_finalize() does not wait for the others.
 * Thread-safe, non-blocking, idempotent. Accepts NULL. */
KOLO_API void kolo_abort(kolo_comm_t *comm);

KOLO_API int kolo_rank(const kolo_comm_t *comm);
KOLO_API int kolo_size(const kolo_comm_t *comm);
KOLO_API int kolo_local_rank(const kolo_comm_t *comm);
KOLO_API int kolo_local_size(const kolo_comm_t *comm);
KOLO_API int kolo_cross_rank(const kolo_comm_t *comm);
KOLO_API int kolo_cross_size(const kolo_comm_t *comm);
/* 1 when every host holds the same number of ranks (each host's count is
 * kolo_local_size()), 0 when not; -1 for NULL. */
KOLO_API int kolo_is_homogeneous(const kolo_comm_t *comm);
/* The membership round this comm was formed in (1 for the first). */
KOLO_API int64_t kolo_round(const kolo_comm_t *comm);
/* The message of the last failed call on this comm; "" when none. */
KOLO_API const char *kolo_last_error(const kolo_comm_t *comm);

/* Blocking collectives. Every rank must call the same collective with the
 * same count, dtype, op and root. sendbuf == recvbuf means in place. Results
 * are bitwise identical on every rank. */

/* recvbuf = op over ranks of (prescale * sendbuf), then times postscale.
 * AVERAGE is SUM with postscale / size. */
KOLO_API kolo_status_t kolo_allreduce(kolo_comm_t *comm, const void *sendbuf, void *recvbuf,
                                      size_t count, kolo_dtype_t dtype, kolo_op_t op);
KOLO_API kolo_status_t kolo_allreduce_scaled(kolo_comm_t *comm, const void *sendbuf, void *recvbuf,
                                             size_t count, kolo_dtype_t dtype, kolo_op_t op,
                                             double prescale, double postscale);
/* recvbuf holds size * count elements: rank r's block at r * count. */
KOLO_API kolo_status_t kolo_allgather(kolo_comm_t *comm, const void *sendbuf, void *recvbuf,
                                      size_t count, kolo_dtype_t dtype);
/* Rank r contributes recvcounts[r] elements; recvbuf holds their sum, in rank
 * order. sendcount must equal recvcounts[rank]. */
KOLO_API kolo_status_t kolo_allgatherv(kolo_comm_t *comm, const void *sendbuf, size_t sendcount,
                                       void *recvbuf, const size_t *recvcounts, kolo_dtype_t dtype);
KOLO_API kolo_status_t kolo_broadcast(kolo_comm_t *comm, void *buf, size_t count,
                                      kolo_dtype_t dtype, int root);
/* sendbuf holds `count` elements, split over the ranks in rank order with
 * kolo_reducescatter_count() elements each (the first count % size ranks get
 * one more). recvbuf receives this rank's reduced block. */
KOLO_API kolo_status_t kolo_reducescatter(kolo_comm_t *comm, const void *sendbuf, void *recvbuf,
                                          size_t count, kolo_dtype_t dtype, kolo_op_t op);
KOLO_API size_t kolo_reducescatter_count(size_t count, int size, int rank);
/* sendbuf holds size blocks of count elements; block j goes to rank j, and
 * recvbuf's block i comes from rank i. */
KOLO_API kolo_status_t kolo_alltoall(kolo_comm_t *comm, const void *sendbuf, void *recvbuf,
                                     size_t count, kolo_dtype_t dtype);
/* As alltoall with sendcounts[j] elements to rank j and recvcounts[i] from
 * rank i, blocks packed contiguously in rank order. */
KOLO_API kolo_status_t kolo_alltoallv(kolo_comm_t *comm, const void *sendbuf,
                                      const size_t *sendcounts, void *recvbuf,
                                      const size_t *recvcounts, kolo_dtype_t dtype);
KOLO_API kolo_status_t kolo_barrier(kolo_comm_t *comm);

/* Process sets: a comm over a subset of comm's ranks, for Horovod's process
 * sets and torch's new_group. Collective over every rank of comm, called in
 * the same order as its other collectives: each rank passes the same members
 * (any order; rank numbers of comm, each once). A member gets *set, a comm
 * of its own whose rank r is the r-th smallest member, on which every
 * collective (kolo.h, async.h) and point-to-point runs with its own rings,
 * fusion and names, never waiting for ops of comm or of other sets; a rank
 * outside the set gets *set == NULL. Ranks that disagree on the members get
 * KOLO_EMISMATCH on every rank (KOLO_EINVAL for an invalid list), with both
 * lists in kolo_last_error(comm), and no set is made. A set is not elastic:
 * once comm re-forms (kolo_reform) or is finalized, every op on the set
 * fails with KOLO_EINVAL; free it and create it again from the new round. */
KOLO_API kolo_status_t kolo_process_set_create(kolo_comm_t *comm, const int *ranks, int n,
                                               kolo_comm_t **set);
/* Frees a set: a barrier of its members (skipped when the set is already
 * broken), then its connections close. Every member calls it, before comm
 * is finalized. Accepts NULL. */
KOLO_API kolo_status_t kolo_process_set_free(kolo_comm_t *set);

/* CUDA device memory: every collective, blocking and async, accepts CUDA
 * device pointers, recognised with cudaPointerGetAttributes (nothing to
 * say); managed memory is read by the CPU as host memory. The work is
 * ordered after what the calling thread's CUDA stream had queued at the call
 * (an event kolo records there); results are on the device, visible to
 * every stream, when the blocking call returns or the async operation
 * completes (callback, kolo_wait). Every rank passes the same kind of memory
 * to one collective. Where CUDA cannot run (no libcudart, no GPU, a build
 * without CUDA) a device pointer is KOLO_EUNSUPPORTED with the reason.
 *
 * The calling thread's stream (a cudaStream_t); NULL, the default, is the
 * legacy default stream. KOLO_EUNSUPPORTED for a non-NULL stream where CUDA
 * cannot run. Per thread: it applies to the collectives this thread calls. */
KOLO_API kolo_status_t kolo_cuda_set_stream(void *stream);
KOLO_API void *kolo_cuda_get_stream(void);

#ifdef __cplusplus
}
#endif
#endif /* KOLO_KOLO_H */
