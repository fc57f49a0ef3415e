/* kolo on MXNet's dependency engine.
 *
 * An operation on MXNet NDArrays is pushed onto MXNet's engine
 * (MXEnginePushAsyncND) with its inputs as read and its outputs as write
 * dependencies, so the engine orders it with every other read and write of
 * those arrays: a later MXNet operation on an output waits for the
 * collective, with no explicit wait. When the engine runs it, the pushed
 * function enqueues kolo's named asynchronous collective (async.h) and
 * returns; kolo's engine thread completes the MXNet operation when the
 * collective is done. No Python runs on either thread.
 *
 * libkolo is neither compiled nor linked against MXNet: kolo_mx_bind()
 * resolves MXNet's C entry points from the libmxnet the process has already
 * loaded (it refuses to load one). CPU arrays only; their memory is used in
 * place, never copied.
 *
 * Failures: MXNet's completion callback can carry only a C++ exception, so an
 * operation that fails completes its MXNet operation as done, with its
 * outputs unchanged or partly written, and kolo records the failure: the
 * first unread one is returned (and cleared) by kolo_mx_take_error(), which
 * the bindings call before each submission and on synchronize. */
#ifndef KOLO_MXNET_H
#define KOLO_MXNET_H

#include "kolo/async.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Resolves MXNet's entry points from the library at `libmxnet_path`, which
 * must already be loaded in this process (RTLD_NOLOAD). Idempotent; KOLO_EINVAL
 * when the path is not a loaded libmxnet, KOLO_EUNSUPPORTED when it lacks an
 * entry point. */
KOLO_API kolo_status_t kolo_mx_bind(const char *libmxnet_path);

/* Pushes an allreduce of n NDArrays (handles), named names[i], counts[i]
 * elements each, from inputs[i] into outputs[i] (inputs[i] == outputs[i]:
 * in place). n > 1 is one grouped allreduce (async.h). `priority` is
 * MXNet's hint. `token` (an NDArray, or NULL) is written by the operation:
 * give the operations of one name the same token, and the engine runs them
 * in the order they were pushed (otherwise two operations of one name on
 * different arrays have no order, and could reach kolo in different orders
 * on different ranks). Returns once pushed; argument errors come back at
 * once. */
KOLO_API kolo_status_t kolo_mx_allreduce(kolo_comm_t *comm, int n, const char *const *names,
                                         void *const *inputs, void *const *outputs,
                                         const size_t *counts, kolo_dtype_t dtype, kolo_op_t op,
                                         double prescale, double postscale, int priority,
                                         void *token);

/* Pushes an in-place broadcast of `array` (count elements) from root;
 * `token` as for kolo_mx_allreduce. */
KOLO_API kolo_status_t kolo_mx_broadcast(kolo_comm_t *comm, const char *name, void *array,
                                         size_t count, kolo_dtype_t dtype, int root, int priority,
                                         void *token);

/* The two halves of an allreduce, in place on `array` (count elements) for
 * an update of this rank's share only (a sharded optimizer step). A rank's
 * share is kolo_reducescatter_count(count, size, rank) elements at the
 * offset of the shares of the ranks before it. kolo_mx_reducescatter
 * reduces the array over the ranks into this rank's share (the rest of the
 * array is left as it was); kolo_mx_allgather copies every rank's share
 * into its place on every rank. `token` as for kolo_mx_allreduce. */
KOLO_API kolo_status_t kolo_mx_reducescatter(kolo_comm_t *comm, const char *name, void *array,
                                             size_t count, kolo_dtype_t dtype, kolo_op_t op,
                                             double prescale, double postscale, int priority,
                                             void *token);
KOLO_API kolo_status_t kolo_mx_allgather(kolo_comm_t *comm, const char *name, void *array,
                                         size_t count, kolo_dtype_t dtype, int priority,
                                         void *token);

/* The first failure of a pushed operation not yet taken, with its message
 * copied into msg (len bytes, NUL-terminated); KOLO_OK and "" when none. */
KOLO_API kolo_status_t kolo_mx_take_error(char *msg, size_t len);

/* How many pushed operations have not completed yet. */
KOLO_API int kolo_mx_pending(void);

#ifdef __cplusplus
}
#endif

#endif
