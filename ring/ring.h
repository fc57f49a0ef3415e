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

/* One buffer of a multi-buffer allreduce: count elements reduced from send
 * into recv (send == recv: in place). */
struct kolo_ring_piece {
	const void *send;
	void *recv;
	size_t count;
};

/* ---- reduction kernels ------------------------------------------------ */

/* dst[i] = dst[i] (op) src[i] for i < count. AVERAGE reduces as SUM (the
 * division is a postscale). float16/bfloat16 are computed in float32 and
 * rounded to nearest even. Vectorised at -O3. */
void kolo_reduce(void *dst, const void *src, size_t count, kolo_dtype_t dtype, kolo_op_t op);
/* dst[i] = a[i] (op) b[i]: the same result as copying a to dst and then
 * kolo_reduce(dst, b), without the copy. dst may equal a; otherwise no two
 * of the buffers may overlap. */
void kolo_reduce3(void *dst, const void *a, const void *b, size_t count, kolo_dtype_t dtype,
                  kolo_op_t op);
/* Adasum's pairwise combination (ring_adasum.c): dst <- (1 - a.b/2|a|^2) a +
 * (1 - a.b/2|b|^2) b over count elements, sums in float64; a coefficient is
 * 1 where its vector's squared norm is below 1e-8. dst may be a or b. */
void kolo_adasum_combine(void *dst, const void *a, const void *b, size_t count, kolo_dtype_t dtype);
/* The dtypes Adasum reduces: the floating-point ones. */
bool kolo_adasum_dtype(kolo_dtype_t dtype);
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

#define KOLO_RING_DIRECT_MAX_RANKS 16

struct kolo_ring_config {
	struct kolo_transport *transport; /* listening already; not owned */
	int rank, size;
	kolo_ring_lookup_fn lookup;
	void *lookup_ctx;
	size_t small_allreduce_bytes; /* ≤ this: latency-optimal algorithm */
	/* Small allreduces of at most small_direct_bytes on comms of at most
	 * small_direct_ranks (≤ KOLO_RING_DIRECT_MAX_RANKS) ranks: every rank sends
	 * to every other, one round, instead of recursive doubling. */
	int small_direct_ranks;
	size_t small_direct_bytes;
	size_t segment_bytes; /* pipeline segment of the ring */
	int timeout_ms;       /* connection set-up and progress */
	int spin_us;          /* spin before blocking in transport wait */
	bool spin_yield;      /* sched_yield() while spinning (oversubscribed host) */
	/* Otherwise, sched_yield() once a spin has lasted this long (0: never):
	 * a peer that the scheduler put on this rank's CPU cannot answer while
	 * this rank spins there. */
	int spin_yield_after_us;
	/* A rank that waits for a peer running on its own CPU moves to another
	 * CPU of its affinity mask (ring_wait.c); off when oversubscribed. */
	bool spin_move;
	/* Sub-comms (optional; zero/NULL for a comm of every rank): ranks[i] is the
	 * transport (global) rank of member i, increasing; copied. tag_base is added
	 * to the conns' tag, so that comms over one transport never share a conn.
	 * lookup is called with global ranks; messages and failed_peer name them. */
	const int *ranks;
	int tag_base;
	/* The comm's flight recorder (core/flight.h), or NULL: a wait that
	 * blocks tells it which peer it waits for. Not owned. */
	struct kolo_flight *flight;
};

#define KOLO_RING_TAG 0 /* tag of a comm's conns, plus its tag_base */

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
/* The allreduce of n buffers as one collective: the result is that of
 * allreducing each piece on its own, but the ring runs one pipeline over
 * their concatenation, so it costs one allreduce of the total and no copies
 * (the fusion engine's large tensors). Every rank passes the same counts. */
kolo_status_t kolo_ring_allreduce_pieces(struct kolo_ring_comm *rc,
                                         const struct kolo_ring_piece *pieces, size_t n,
                                         kolo_dtype_t dtype, kolo_op_t op, double prescale,
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

/* ---- comm internals for the layers above ------------------------------ */

/* Fails the comm with st (the first failure wins) as if one of its own conns
 * had failed: records msg and failed_peer (a global rank, or -1) and resets
 * every conn so its peers fail fast. Returns the comm's status. */
kolo_status_t kolo_ring_comm_fail(struct kolo_ring_comm *rc, kolo_status_t st, int failed_peer,
                                  const char *msg);
/* KOLO_OK, or the status of the failure every later call returns. */
kolo_status_t kolo_ring_comm_status(const struct kolo_ring_comm *rc);
int kolo_ring_comm_rank(const struct kolo_ring_comm *rc); /* index in the comm */
int kolo_ring_comm_size(const struct kolo_ring_comm *rc);
struct kolo_transport *kolo_ring_comm_transport(const struct kolo_ring_comm *rc);
/* The comm's configuration (thresholds as last tuned). */
const struct kolo_ring_config *kolo_ring_comm_config(const struct kolo_ring_comm *rc);

/* ---- hierarchical allreduce (hier.c; docs/hierarchical.md) --------------- */

/* Cost of one kind of link, α–β: a message of b bytes takes
 * alpha_us + b / (gbytes_per_s * 1e3) microseconds. */
struct kolo_ring_link_cost {
	double alpha_us;
	double gbytes_per_s;
};

enum kolo_ring_hier_mode { KOLO_RING_HIER_OFF = 0, KOLO_RING_HIER_ON = 1, KOLO_RING_HIER_AUTO = 2 };
enum kolo_ring_algo { KOLO_RING_ALGO_RING, KOLO_RING_ALGO_SMALL, KOLO_RING_ALGO_HIER };

struct kolo_ring_hier_config {
	enum kolo_ring_hier_mode mode;
	/* Homogeneous hosts: local_size ranks on each of cross_size hosts, ranks
	 * contiguous per host (rank = host index * local_size + local rank). */
	int local_size, cross_size;
	struct kolo_ring_link_cost shm; /* between ranks of one host */
	struct kolo_ring_link_cost net; /* one host's link to the others */
	bool probe;       /* measure both costs at enable (then agreed by a MAX allreduce) */
	bool small_model; /* set the small-message thresholds from the model, not the config */
	/* The local and cross stages share each member's link (a zone level: the
	 * network inside a zone and the one between zones both go through the
	 * host's link, whose cost is `shm`): the model bounds the hierarchy
	 * below by the bytes through that link, however the stages overlap. */
	bool shared_link;
	size_t local_segment_bytes; /* segment of the sub-comm inside a host; 0: the parent's */
	/* Pipeline chunk of the hierarchy: an allreduce of S bytes runs in
	 * kolo_ring_hier_chunks(S, pipeline_bytes) chunks whose stages overlap.
	 * 0: the default chunking, where the cost model predicts the pipeline
	 * to pay; otherwise chunks of this size always (SIZE_MAX: never). */
	size_t pipeline_bytes;
};

/* The default chunking: chunks of at least 1 MiB, at most 32 of them
 * (measured on 2 hosts x 2 ranks at 1 Gbit/s: 1 to 4 MiB chunks ran 64 MiB
 * alike, 256 KiB chunks lost to the stages one after another; docs/
 * hierarchical.md). */
#define KOLO_RING_HIER_PIPELINE_BYTES ((size_t)1 << 20)
#define KOLO_RING_HIER_PIPELINE_MAX   32

struct kolo_ring_hier;

/* Collective over every rank of rc (which must have size local_size *
 * cross_size > 1): builds the local and cross sub-comms over rc's transport
 * (tag_base + 1 and + 2), optionally probes the link costs, and attaches them
 * so that kolo_ring_allreduce on rc picks flat ring, small-message or
 * hierarchical by the cost model. rc owns them from then on. */
kolo_status_t kolo_ring_hier_enable(struct kolo_ring_comm *rc,
                                    const struct kolo_ring_hier_config *hc, struct kolo_errbuf *eb);
/* The algorithm kolo_ring_allreduce on rc would use for `bytes`; RING or
 * SMALL when no hierarchy is attached. Pure: the same on every rank. */
enum kolo_ring_algo kolo_ring_allreduce_algo(const struct kolo_ring_comm *rc, size_t bytes);
/* The pipeline chunks kolo_ring_allreduce on rc runs an allreduce of `bytes`
 * in (1: the hierarchy's stages one after another); 0 when it does not take
 * the hierarchy. Pure: the same on every rank. */
size_t kolo_ring_allreduce_chunks(const struct kolo_ring_comm *rc, size_t bytes);
/* The hierarchy's sub-comm over the ranks of this host (cross false) or over
 * the ranks of every host with this local rank (cross true); NULL when no
 * hierarchy is attached. Owned by rc. For the GPU path (runtime/device_nccl.c),
 * whose stage inside a host runs in NCCL and whose stage between hosts runs on
 * the cross sub-comm. */
struct kolo_ring_comm *kolo_ring_hier_sub(const struct kolo_ring_comm *rc, bool cross);
/* The costs in use (measured or configured); false when none attached. */
bool kolo_ring_hier_costs(const struct kolo_ring_comm *rc, struct kolo_ring_link_cost *shm,
                          struct kolo_ring_link_cost *net);
/* The model's predicted time in µs of one allreduce of `bytes` by algo on n =
 * local * cross ranks (local or cross may be 1); HIER runs in `chunks`
 * pipelined chunks (1: its three stages one after another; ignored by the
 * other algorithms). Unit-tested; documented. */
double kolo_ring_cost_model(enum kolo_ring_algo algo, size_t bytes, int local, int cross,
                            size_t chunks, const struct kolo_ring_link_cost *shm,
                            const struct kolo_ring_link_cost *net);
/* The chunks of a pipelined allreduce of `bytes`: bytes / pipeline_bytes, at
 * least 1 (chunks of at least pipeline_bytes); pipeline_bytes 0: the default
 * chunking, bytes / KOLO_RING_HIER_PIPELINE_BYTES up to
 * KOLO_RING_HIER_PIPELINE_MAX. */
size_t kolo_ring_hier_chunks(size_t bytes, size_t pipeline_bytes);

#endif /* KOLO_RING_H */
