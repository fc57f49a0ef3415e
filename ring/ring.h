/* ring: collective algorithms over the transport contract, and the
 * reduction kernels they use. Knows nothing of HTTP or of which transport it
 * runs on; the runtime hands it a transport endpoint and a way to look up a
 * peer's listen handle. */
#ifndef KOLO_RING_H
#define KOLO_RING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core.h"
#include "transport.h"

/* ---- reduction kernels ------------------------------------------------ */

/* dst[i] = dst[i] (op) src[i] for i < count. AVERAGE reduces as SUM (the
 * division is a postscale). float16/bfloat16 are computed in float32 and
 * rounded to nearest even. Vectorised at -O3. */
void kolo_reduce(void *dst, const void *src, size_t count, kolo_dtype_t dtype, kolo_op_t op);
/* Tests and benchmarks: true makes kolo_reduce use only the portable kernels
 * even where the CPU has faster instructions (float16: F16C). */
void kolo_reduce_force_portable(bool on);
/* dst[i] = src[i] * factor (in float32 for 16-bit floats, float64 for
 * float64, rounded for integers). dst may equal src. */
void kolo_scale(void *dst, const void *src, size_t count, kolo_dtype_t dtype, double factor);
/* float <-> half conversions (round to nearest even). */
uint16_t kolo_f32_to_f16(float f);
float kolo_f16_to_f32(uint16_t h);
uint16_t kolo_f32_to_bf16(float f);
float kolo_bf16_to_f32(uint16_t h);

/* ---- comm ------------------------------------------------------------- */

/* Looks up peer `rank`'s listen handle, waiting up to timeout_ms. */
typedef kolo_status_t (*kolo_ring_lookup_fn)(void *ctx, int rank, struct kolo_transport_handle *out,
                                             int timeout_ms);

struct kolo_ring_config {
	struct kolo_transport *transport; /* listening already; not owned */
	int rank, size;
	kolo_ring_lookup_fn lookup;
	void *lookup_ctx;
	size_t small_allreduce_bytes; /* ≤ this: latency-optimal algorithm */
	size_t segment_bytes;         /* pipeline segment of the ring */
	int timeout_ms;               /* connection set-up and progress */
	int spin_us;                  /* spin before blocking in transport wait */
};

struct kolo_ring_comm;

/* Connects the ring neighbours (other peers are connected on first use). */
kolo_status_t kolo_ring_comm_create(const struct kolo_ring_config *cfg, struct kolo_ring_comm **out,
                                    struct kolo_errbuf *eb);
/* Closes every conn (the transport is not destroyed). Accepts NULL. */
void kolo_ring_comm_destroy(struct kolo_ring_comm *rc);
const char *kolo_ring_last_error(const struct kolo_ring_comm *rc);
/* Changes the algorithm thresholds of a comm between collectives (autotune,
 * benchmarks, tests). Every rank must use the same values. segment_bytes 0
 * keeps the current segment size. */
void kolo_ring_comm_tune(struct kolo_ring_comm *rc, size_t small_allreduce_bytes,
                         size_t segment_bytes);
/* The rank whose conn failed first (closed, reset, timed out), or -1 when
 * the comm has not failed on a conn (or was aborted). Thread-safe. */
int kolo_ring_failed_peer(const struct kolo_ring_comm *rc);
/* Thread-safe: fails the running and every later collective with st. */
void kolo_ring_abort(struct kolo_ring_comm *rc, kolo_status_t st);

/* The collectives: semantics as the same-named functions of kolo.h. After a
 * failure the comm stays failed (every later call returns the same status)
 * and kolo_ring_last_error names the collective, the peer and the cause.
 * Argument errors return KOLO_EINVAL and leave the comm usable. counts have
 * one entry per rank. In place: allreduce, alltoallv sendbuf == recvbuf;
 * allgatherv sendbuf == recvbuf + offset(rank) (or == recvbuf: the block is
 * moved to its place first); reducescatter sendbuf == recvbuf (the result
 * lands at the start). Algorithms and costs: docs/collectives.md. */
kolo_status_t kolo_ring_allreduce(struct kolo_ring_comm *rc, const void *sendbuf, void *recvbuf,
                                  size_t count, kolo_dtype_t dtype, kolo_op_t op, double prescale,
                                  double postscale);
kolo_status_t kolo_ring_allgatherv(struct kolo_ring_comm *rc, const void *sendbuf, void *recvbuf,
                                   const size_t *counts, kolo_dtype_t dtype);
kolo_status_t kolo_ring_broadcast(struct kolo_ring_comm *rc, void *buf, size_t count,
                                  kolo_dtype_t dtype, int root);
kolo_status_t kolo_ring_reducescatter(struct kolo_ring_comm *rc, const void *sendbuf, void *recvbuf,
                                      const size_t *counts, kolo_dtype_t dtype, kolo_op_t op,
                                      double prescale, double postscale);
kolo_status_t kolo_ring_alltoallv(struct kolo_ring_comm *rc, const void *sendbuf,
                                  const size_t *sendcounts, void *recvbuf, const size_t *recvcounts,
                                  kolo_dtype_t dtype);
kolo_status_t kolo_ring_barrier(struct kolo_ring_comm *rc);

#endif /* KOLO_RING_H */
