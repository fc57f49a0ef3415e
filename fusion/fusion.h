/* fusion: the tensor-fusion engine behind the async API (kolo/async.h).
 *
 * One background thread per engine owns the ring comm. Each cycle every rank
 * exchanges a small control block (flags and one bit per response-cache entry
 * it has pending) and, when some rank has something new, the serialized
 * requests it has not announced yet; every rank then computes the same
 * ordered list of responses from the same data (no coordinator), packs ready
 * allreduces into the fusion buffer and runs them. See docs/fusion.md.
 *
 * This header is what runtime/ uses: the engine, its operations and their
 * handles. The pieces below the engine (negotiator, record codec, response
 * cache, planner, timeline, autotune), shared by the files of fusion/ only,
 * are in fusion_internal.h under the fusion_ prefix. */
#ifndef KOLO_FUSION_H
#define KOLO_FUSION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "core.h"
#include "kolo/async.h"
#include "ring.h"

/* ---- operation kinds ---------------------------------------------------- */

enum kolo_fusion_kind {
	KOLO_FK_ALLREDUCE = 1,
	KOLO_FK_GROUP, /* grouped allreduce: counts[] holds the member counts */
	KOLO_FK_ALLGATHER,
	KOLO_FK_BROADCAST,
	KOLO_FK_ALLTOALL, /* counts[] holds the sendcounts (size entries) */
	KOLO_FK_REDUCESCATTER,
	KOLO_FK_BARRIER,
	KOLO_FK_JOIN,
	KOLO_FK_EXCLUSIVE, /* runs a caller's function on the engine thread */
	KOLO_FK_COUNT
};

/* ---- device collectives --------------------------------------------------
 * A collective whose buffers include CUDA device memory runs in
 * runtime/device.c (staged through pinned host memory, or NCCL). The engine
 * cannot call runtime/, so runtime hands it these hooks in its config; the
 * blocking path (runtime/api.c) uses the same descriptor. */

enum kolo_dcoll_kind {
	KOLO_DC_ALLREDUCE,
	KOLO_DC_ALLGATHERV,    /* counts: every rank's block */
	KOLO_DC_BROADCAST,     /* recv is the buffer */
	KOLO_DC_REDUCESCATTER, /* counts: every rank's block of send */
	KOLO_DC_ALLTOALLV,     /* counts: sent to each rank; rcounts: received */
};

struct kolo_dcoll {
	enum kolo_dcoll_kind kind;
	const void *send;
	void *recv;
	size_t count; /* ALLREDUCE, BROADCAST */
	const size_t *counts, *rcounts;
	kolo_dtype_t dtype;
	kolo_op_t op;
	double pre, post;
	int root;
	/* An event (core/gpu.h) the device work must follow, or NULL: the
	 * caller's stream at the call. Not consumed. */
	void *after;
};

struct kolo_engine_device {
	/* Runs c on rc (its collectives in the same order on every rank);
	 * results are on the device when it returns. Failure detail in eb. */
	kolo_status_t (*coll)(void *arg, struct kolo_ring_comm *rc, const struct kolo_dcoll *c,
	                      struct kolo_errbuf *eb);
	/* kolo's stream on device ordinal, which becomes the calling thread's
	 * current device: work queued there before coll runs before coll's
	 * copies from the device. timeout_ms bounds the engine's own waits on
	 * it. */
	kolo_status_t (*stream)(void *arg, int ordinal, void **stream, struct kolo_errbuf *eb);
	void *arg;
	int timeout_ms;
};

/* ---- the engine ---------------------------------------------------------- */

struct kolo_engine_config {
	uint64_t fusion_threshold; /* bytes; 0 = no fusion */
	uint64_t direct_bytes;     /* allreduces this large skip the buffer; 0 = never */
	uint64_t block_bytes;      /* a fused batch goes through the ring in blocks of
	                            * this size; 0 = all at once (one collective) */
	double cycle_time_ms;      /* batching window */
	int cache_capacity;        /* 0 = no response cache */
	char timeline[1024];       /* path, "" for none */
	bool timeline_mark_cycles;
	bool stall_check;
	double stall_check_s;    /* warn after this long */
	double stall_shutdown_s; /* fail after this long; 0 never */
	bool autotune;
	char autotune_log[1024];
	int timeout_ms;        /* the ring's progress timeout (for the idle heartbeat) */
	int idle_heartbeat_ms; /* 0: derived from timeout_ms */
	/* Test hook: called on rank 0 with each stall report (engine thread). */
	void (*stall_hook)(void *arg, const char *report);
	void *stall_hook_arg;
	/* The comm's flight recorder (core/flight.h), or NULL: every op is
	 * recorded from its enqueue to its completion. Not owned. */
	struct kolo_flight *flight;
	/* Device collectives; coll NULL: none (device ops fail). */
	struct kolo_engine_device device;
};

struct kolo_engine;

/* Starts the engine thread, which owns rc from now on (no other thread may
 * use rc until kolo_engine_destroy returns). cfg is copied; runtime fills it
 * from the KOLO_* parameters (kolo_runtime_engine_config); timeout_ms > 0. */
kolo_status_t kolo_engine_create(struct kolo_ring_comm *rc, int rank, int size,
                                 const struct kolo_engine_config *cfg, struct kolo_engine **out,
                                 struct kolo_errbuf *eb);
/* Asks every rank's engine to stop: every pending operation (here and, via
 * the negotiation, on the other ranks) fails with KOLO_ESHUTDOWN and later
 * enqueues fail with it. Waits for the engine thread (aborting the ring with
 * KOLO_ESHUTDOWN if peers do not answer within the idle heartbeat plus the
 * ring's timeout). Idempotent. */
void kolo_engine_shutdown(struct kolo_engine *e);
/* Shuts down if needed and frees. Accepts NULL. */
void kolo_engine_destroy(struct kolo_engine *e);
/* A membership change (elastic): fails every pending and later operation
 * with st (≠ KOLO_OK) at once, on this rank, without negotiating with the
 * others (they are gone or re-forming), by aborting the ring. Thread-safe,
 * non-blocking; kolo_engine_destroy then stops the thread at once. The next
 * engine, on the next round's ring, starts with fresh negotiation state. */
void kolo_engine_abort(struct kolo_engine *e, kolo_status_t st);

/* One operation to enqueue. Buffers stay the caller's. */
struct kolo_engine_op {
	int kind;
	const char *name; /* NULL for BARRIER / JOIN / EXCLUSIVE (the engine numbers them) */
	kolo_dtype_t dtype;
	kolo_op_t op;
	int root;
	double prescale, postscale;
	size_t count;
	const void *sendbuf;
	void *recvbuf;
	/* GROUP */
	int n;
	const char *const *names;
	const void *const *sendbufs;
	void *const *recvbufs;
	const size_t *counts;
	/* ALLGATHER / ALLTOALL outputs; ALLTOALL sendcounts (NULL: equal split) */
	void **recvbuf_out;
	/* ALLGATHER / ALLTOALL into the caller's buffer of recv_capacity
	 * elements instead of a new one in *recvbuf_out (then NULL) */
	bool recv_into;
	void *recvbuf_into;
	size_t recv_capacity;
	size_t *recvcounts;
	const size_t *sendcounts;
	/* JOIN result */
	int *last_rank;
	/* EXCLUSIVE: run on the engine thread when every rank has reached it */
	kolo_status_t (*fn)(void *arg, struct kolo_ring_comm *rc);
	void *fn_arg;
	kolo_callback_fn cb;
	void *cb_arg;
	void *owner; /* stored in the handle (kolo_handle_owner) */
	/* The buffers are CUDA device memory (every rank must agree, as on
	 * dtype); ready_event (core/gpu.h; may be NULL) was recorded on the
	 * caller's stream at enqueue: the engine owns it once
	 * kolo_engine_enqueue succeeded (the caller, when it failed). */
	bool device;
	void *ready_event;
};

/* Validates and queues op. On success *handle (when handle is not NULL)
 * receives a handle; on failure the callback is never called and the detail
 * is in eb. Thread-safe. */
kolo_status_t kolo_engine_enqueue(struct kolo_engine *e, const struct kolo_engine_op *op,
                                  kolo_handle_t **handle, struct kolo_errbuf *eb);
/* Enqueues op and waits for it (for JOIN and blocking collectives run through
 * the engine). The failure detail is in eb. */
kolo_status_t kolo_engine_run(struct kolo_engine *e, const struct kolo_engine_op *op,
                              struct kolo_errbuf *eb);
/* Runs fn(arg, rc) on the engine thread at the same point of the response
 * order on every rank (negotiated like a barrier) and waits for it: how a
 * blocking collective uses the ring while the engine owns it. */
kolo_status_t kolo_engine_run_exclusive(struct kolo_engine *e,
                                        kolo_status_t (*fn)(void *arg, struct kolo_ring_comm *rc),
                                        void *arg, struct kolo_errbuf *eb);
/* Starts / stops the timeline (rank 0 writes it; other ranks ignore). */
kolo_status_t kolo_engine_timeline_start(struct kolo_engine *e, const char *path,
                                         struct kolo_errbuf *eb);
kolo_status_t kolo_engine_timeline_stop(struct kolo_engine *e);

/* Handles (kolo_handle_t of async.h). */
kolo_status_t kolo_handle_poll_done(kolo_handle_t *h, int *done);
/* Waits, copies the failure message (if any) into eb, releases the handle. */
kolo_status_t kolo_handle_wait_release(kolo_handle_t *h, struct kolo_errbuf *eb);
/* Waits up to timeout_ms for completion; *done says whether it came. Keeps the handle. */
kolo_status_t kolo_handle_wait_for(kolo_handle_t *h, int timeout_ms, int *done);
void kolo_handle_drop(kolo_handle_t *h);
void *kolo_handle_owner(const kolo_handle_t *h);
/* For other producers of handles (p2p/): a handle starts with refs
 * references, the producer's and the caller's when it is given out;
 * complete marks it done, wakes its waiters and drops the producer's; a
 * handle never given out is discarded. */
kolo_handle_t *fusion_handle_create(void *owner, int refs);
void fusion_handle_complete(kolo_handle_t *h, kolo_status_t st, const char *msg);
void fusion_handle_discard(kolo_handle_t *h);

#endif /* KOLO_FUSION_H */
