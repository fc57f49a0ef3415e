/* fusion: the tensor-fusion engine behind the async API (kolo/async.h).
 *
 * One background thread per engine owns the ring comm. Each cycle every rank
 * exchanges a small control block (flags and one bit per response-cache entry
 * it has pending) and, when some rank has something new, the serialized
 * requests it has not announced yet; every rank then computes the same
 * ordered list of responses from the same data (no coordinator), packs ready
 * allreduces into the fusion buffer and runs them. See docs/fusion.md.
 *
 * The pieces below the engine (negotiator, cache, planner, timeline, autotune)
 * are pure or self-contained so they can be unit-tested without a network. */
#ifndef KOLO_FUSION_H
#define KOLO_FUSION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "core.h"
#include "kolo/async.h"
#include "ring.h"

/* ---- operation kinds and parameters ----------------------------------- */

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

/* "ALLREDUCE", "ALLGATHER", ... (the timeline's activity names). */
const char *kolo_fusion_kind_name(int kind);

#define KOLO_FUSION_NAME_MAX 4096

/* What one rank says about one named operation. counts is owned. */
struct kolo_fusion_params {
	uint8_t kind, dtype, op;
	int32_t root;
	double prescale, postscale;
	uint32_t ncounts;
	uint64_t *counts;
};

/* Deep copy / free / equality. */
kolo_status_t kolo_fusion_params_copy(struct kolo_fusion_params *dst,
                                      const struct kolo_fusion_params *src);
void kolo_fusion_params_fini(struct kolo_fusion_params *p);
bool kolo_fusion_params_equal(const struct kolo_fusion_params *a,
                              const struct kolo_fusion_params *b);
/* Sum of counts (the element count of an allreduce, group or alltoall). */
uint64_t kolo_fusion_params_total(const struct kolo_fusion_params *p);

/* ---- negotiator: the distributed state machine, without the network ---- */

/* One decided operation. For ALLGATHER, p.counts holds every rank's count;
 * for ALLTOALL, size*size entries, row r = rank r's sendcounts. */
struct kolo_fusion_response {
	char *name;
	struct kolo_fusion_params p;
	kolo_status_t status; /* KOLO_OK, or why the op fails on every rank */
	char *errmsg;         /* NULL when status == KOLO_OK */
	int last_rank;        /* JOIN: the last rank to join */
	bool local;           /* this rank has the op queued (else joined: zeros) */
	uint64_t local_id;    /* the id given to kolo_negotiator_submit() */
	int cache_slot;       /* slot it was served from, or -1 */
};

/* A rank reported a name for the first time (timeline ticks). */
struct kolo_fusion_tick {
	const char *name; /* valid until the next decide */
	int kind;
	int rank;
};

/* The outcome of one cycle, identical on every rank (but `local`). */
struct kolo_fusion_cycle {
	struct kolo_fusion_response *resp;
	size_t nresp;
	struct kolo_fusion_tick *ticks;
	size_t nticks;
	bool shutdown;   /* some rank asked to shut down */
	bool pending;    /* some rank still has an op that is not decided */
	bool has_params; /* rank 0 sent new tuning values (apply now) */
	uint64_t fusion_threshold;
	double cycle_time_ms;
	uint64_t evictions;  /* cache entries evicted this cycle */
	uint64_t cache_hits; /* responses served from the cache this cycle */
};
void kolo_fusion_cycle_fini(struct kolo_fusion_cycle *c);

struct kolo_negotiator;

/* rank/size of the comm; cache_capacity 0 disables the response cache. */
kolo_status_t kolo_negotiator_create(int rank, int size, int cache_capacity,
                                     struct kolo_negotiator **out);
void kolo_negotiator_destroy(struct kolo_negotiator *n);

/* Registers a local operation (copied). The name must not be pending locally
 * (KOLO_EINVAL). id comes back in the response. */
kolo_status_t kolo_negotiator_submit(struct kolo_negotiator *n, const char *name,
                                     const struct kolo_fusion_params *p, uint64_t id);
/* Local operations not decided yet. */
size_t kolo_negotiator_local_pending(const struct kolo_negotiator *n);
/* Removes every local operation, calling fn for each (shutdown / failure). */
void kolo_negotiator_drain(struct kolo_negotiator *n, void (*fn)(void *arg, uint64_t id),
                           void *arg);

/* Size in bytes of every rank's control block (the same on all ranks). */
size_t kolo_negotiator_block_size(const struct kolo_negotiator *n);
/* Rank 0 only: things to tell every rank in the next message. */
void kolo_negotiator_set_params(struct kolo_negotiator *n, uint64_t fusion_threshold,
                                double cycle_time_ms);
kolo_status_t kolo_negotiator_fail_name(struct kolo_negotiator *n, const char *name,
                                        kolo_status_t st, const char *why);
/* Writes this rank's control block (block_size bytes) and a malloc'd message
 * of the requests it has not announced yet (*msg NULL, *msg_len 0 when none).
 * The message length is inside the block. */
kolo_status_t kolo_negotiator_encode(struct kolo_negotiator *n, bool shutdown, uint8_t *block,
                                     uint8_t **msg, size_t *msg_len);
/* Each rank's message length, read from the gathered blocks. */
uint32_t kolo_negotiator_block_msg_len(const uint8_t *block);
/* Given every rank's block (size * block_size bytes, in rank order) and
 * message, decides this cycle. now_ns stamps the stall bookkeeping. Fills
 * *out (free with kolo_fusion_cycle_fini). KOLO_EPROTO on a malformed message. */
kolo_status_t kolo_negotiator_decide(struct kolo_negotiator *n, const uint8_t *blocks,
                                     const uint8_t *const *msgs, const size_t *msg_lens,
                                     uint64_t now_ns, struct kolo_fusion_cycle *out);

/* Stall inspector: names reported by some ranks but not all, for at least
 * min_age_ns. Writes "rank 1: [a, b, c, d, e, …]; rank 3: [x]" into buf and
 * returns the number of stalled names. */
size_t kolo_negotiator_stall_report(const struct kolo_negotiator *n, uint64_t now_ns,
                                    uint64_t min_age_ns, char *buf, size_t size);
/* true when every rank that has not joined waits on a name stalled for at
 * least min_age_ns that some other rank has not submitted: the ranks wait on
 * different names, and none can complete until a rank submits more. */
bool kolo_negotiator_deadlocked(const struct kolo_negotiator *n, uint64_t now_ns,
                                uint64_t min_age_ns);
/* Calls fn for every name pending for at least min_age_ns. */
void kolo_negotiator_stalled(const struct kolo_negotiator *n, uint64_t now_ns, uint64_t min_age_ns,
                             void (*fn)(void *arg, const char *name), void *arg);
/* Entries currently in the response cache. */
size_t kolo_negotiator_cache_size(const struct kolo_negotiator *n);

/* Fills dst with a mismatch description of the ranks' params for `name`, or
 * returns false when they agree. Exposed for tests. */
bool kolo_fusion_describe_mismatch(const char *name, const struct kolo_fusion_params *const *p,
                                   const bool *present, int size, char *dst, size_t dstlen);

/* ---- fusion planner ----------------------------------------------------- */

struct kolo_fusion_item {
	uint8_t dtype, op;
	double prescale, postscale;
	uint64_t bytes;
	bool solo; /* never packed with others */
};

/* Groups items (in order) into batches of the same dtype/op/scales whose
 * bytes fit in threshold, scanning ahead past items that do not match. An
 * item larger than the threshold, a solo item, or any item when threshold is
 * 0, is a batch of its own. batch_of[i] receives item i's batch number; batches are
 * numbered by their first item. Returns the number of batches. */
size_t kolo_fusion_plan(const struct kolo_fusion_item *items, size_t n, uint64_t threshold,
                        size_t *batch_of);

/* ---- timeline ------------------------------------------------------------ */

struct kolo_timeline;

/* Opens path and starts the writer thread. queue_cap bounds the events held
 * in memory; when full, events are dropped (counted), never blocking. */
kolo_status_t kolo_timeline_create(const char *path, size_t queue_cap, bool mark_cycles,
                                   struct kolo_timeline **out, struct kolo_errbuf *eb);
/* Flushes, closes the JSON array and the file. Accepts NULL. */
void kolo_timeline_destroy(struct kolo_timeline *t);
/* Events (thread-safe, non-blocking). ts_us is kolo_now_ns()/1000. */
void kolo_timeline_negotiate_begin(struct kolo_timeline *t, const char *name, int kind,
                                   uint64_t ts_us);
void kolo_timeline_rank_ready(struct kolo_timeline *t, const char *name, int rank, uint64_t ts_us);
void kolo_timeline_negotiate_end(struct kolo_timeline *t, const char *name, uint64_t ts_us);
/* An activity (QUEUE, MEMCPY_IN_FUSION_BUFFER, ALLREDUCE, ...) of a tensor. */
void kolo_timeline_begin(struct kolo_timeline *t, const char *name, const char *activity,
                         uint64_t ts_us);
void kolo_timeline_end(struct kolo_timeline *t, const char *name, uint64_t ts_us);
void kolo_timeline_mark_cycle(struct kolo_timeline *t, uint64_t ts_us);
uint64_t kolo_timeline_dropped(const struct kolo_timeline *t);

/* ---- autotune ------------------------------------------------------------ */

struct kolo_autotune_config {
	uint64_t threshold; /* starting values */
	double cycle_time_ms;
	int steps_per_sample;      /* steps measured per sample */
	int warmup_samples;        /* discarded after each change */
	int samples_per_candidate; /* median of this many */
	const char *log_path;      /* CSV, or NULL */
};

struct kolo_autotune;

kolo_status_t kolo_autotune_create(const struct kolo_autotune_config *cfg,
                                   struct kolo_autotune **out);
void kolo_autotune_destroy(struct kolo_autotune *a);
/* Records that `bytes` of tensor `name` were reduced at now_ns. Returns true
 * when the tuner wants new values (*threshold, *cycle_ms) to be applied from
 * now on; the caller applies them on every rank and calls
 * kolo_autotune_applied() once they are in force. */
bool kolo_autotune_record(struct kolo_autotune *a, const char *name, uint64_t bytes,
                          uint64_t now_ns, uint64_t *threshold, double *cycle_ms);
void kolo_autotune_applied(struct kolo_autotune *a, uint64_t now_ns);
/* true once the search has finished and the best values are fixed. */
bool kolo_autotune_done(const struct kolo_autotune *a);
/* The best values found so far. */
void kolo_autotune_best(const struct kolo_autotune *a, uint64_t *threshold, double *cycle_ms);

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
};

/* Defaults from the KOLO_* parameters (reads the environment once). */
void kolo_engine_config_from_params(struct kolo_engine_config *cfg);

struct kolo_engine;

/* Starts the engine thread, which owns rc from now on (no other thread may
 * use rc until kolo_engine_destroy returns). cfg NULL: from the params. */
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
void kolo_handle_drop(kolo_handle_t *h);
void *kolo_handle_owner(const kolo_handle_t *h);

#endif /* KOLO_FUSION_H */
