/* fusion_internal: what the files of fusion/ share, and nothing outside
 * fusion/ uses (runtime/ sees fusion.h only). Names take the fusion_ prefix,
 * as nng's nni_ and libuv's uv__, so a kolo_* name is always one that
 * another module may call.
 *
 * The negotiator, record codec, cache, planner, timeline and autotune are pure
 * or self-contained so they can be unit-tested without a network; the
 * engine's state at the end is shared by the engine's files only. */
#ifndef KOLO_FUSION_INTERNAL_H
#define KOLO_FUSION_INTERNAL_H

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "fusion.h"
#include "gpu.h"
#include "flight.h"
#include "metrics.h"

/* ---- growing arrays ------------------------------------------------------ */

/* Makes room for element n of the array *arrayp (any element type, of size
 * elem) holding *cap elements: 16 at first, then twice as many. false when
 * out of memory (the array is then unchanged). */
static inline bool fusion_reserve(void *arrayp, size_t n, size_t *cap, size_t elem)
{
	if (n < *cap)
		return true;
	void *old;
	memcpy(&old, arrayp, sizeof(old));
	size_t ncap = *cap ? *cap * 2 : 16;
	void *v = realloc(old, ncap * elem);
	if (!v)
		return false;
	memcpy(arrayp, &v, sizeof(v));
	*cap = ncap;
	return true;
}

/* ---- operation parameters (params.c) ------------------------------------ */

/* "ALLREDUCE", "ALLGATHER", ... (the timeline's activity names). */
const char *fusion_kind_name(int kind);

#define FUSION_NAME_MAX 4096

/* What one rank says about one named operation. counts is owned. */
struct fusion_params {
	uint8_t kind, dtype, op;
	uint8_t mem; /* 1: the buffers are CUDA device memory; 0: host */
	int32_t root;
	double prescale, postscale;
	uint32_t ncounts;
	uint64_t *counts;
};

/* Deep copy / free / equality. */
kolo_status_t fusion_params_copy(struct fusion_params *dst, const struct fusion_params *src);
void fusion_params_fini(struct fusion_params *p);
bool fusion_params_equal(const struct fusion_params *a, const struct fusion_params *b);
/* Sum of counts (the element count of an allreduce, group or alltoall). */
uint64_t fusion_params_total(const struct fusion_params *p);

/* ---- negotiator: the distributed state machine, without the network
 * (negotiate.c, decide.c, cache.c, stall.c) ------------------------------- */

/* One decided operation. For ALLGATHER, p.counts holds every rank's count;
 * for ALLTOALL, size*size entries, row r = rank r's sendcounts. */
struct fusion_response {
	char *name;
	struct fusion_params p;
	kolo_status_t status; /* KOLO_OK, or why the op fails on every rank */
	char *errmsg;         /* NULL when status == KOLO_OK */
	int last_rank;        /* JOIN: the last rank to join */
	bool local;           /* this rank has the op queued (else joined: zeros) */
	uint64_t local_id;    /* the id given to fusion_negotiator_submit() */
	int cache_slot;       /* slot it was served from, or -1 */
};

/* A rank reported a name for the first time (timeline ticks). */
struct fusion_tick {
	const char *name; /* valid until the next decide */
	int kind;
	int rank;
};

/* The outcome of one cycle, identical on every rank (but `local`). */
struct fusion_cycle {
	struct fusion_response *resp;
	size_t nresp;
	struct fusion_tick *ticks;
	size_t nticks;
	bool shutdown;   /* some rank asked to shut down */
	bool pending;    /* some rank still has an op that is not decided */
	bool has_params; /* rank 0 sent new tuning values (apply now) */
	uint64_t fusion_threshold;
	double cycle_time_ms;
	uint64_t evictions;  /* cache entries evicted this cycle */
	uint64_t cache_hits; /* responses served from the cache this cycle */
	/* The previous cycle's decisions, by rank: how late each rank's
	 * submission arrived, as times whose differences are the lags (ns; 0:
	 * the rank had none of them); size entries, NULL when the previous
	 * cycle decided nothing. The flight recorder's stragglers. */
	uint64_t *arrive;
};
void fusion_cycle_fini(struct fusion_cycle *c);

struct fusion_negotiator;

/* rank/size of the comm; cache_capacity 0 disables the response cache. */
kolo_status_t fusion_negotiator_create(int rank, int size, int cache_capacity,
                                       struct fusion_negotiator **out);
void fusion_negotiator_destroy(struct fusion_negotiator *n);

/* Registers a local operation (copied). The name must not be pending locally
 * (KOLO_EINVAL). id comes back in the response. */
kolo_status_t fusion_negotiator_submit(struct fusion_negotiator *n, const char *name,
                                       const struct fusion_params *p, uint64_t id);
/* Local operations not decided yet. */
size_t fusion_negotiator_local_pending(const struct fusion_negotiator *n);
/* Removes every local operation, calling fn for each (shutdown / failure). */
void fusion_negotiator_drain(struct fusion_negotiator *n, void (*fn)(void *arg, uint64_t id),
                             void *arg);

/* Size in bytes of every rank's control block (the same on all ranks). */
size_t fusion_negotiator_block_size(const struct fusion_negotiator *n);
/* Rank 0 only: things to tell every rank in the next message. */
void fusion_negotiator_set_params(struct fusion_negotiator *n, uint64_t fusion_threshold,
                                  double cycle_time_ms);
kolo_status_t fusion_negotiator_fail_name(struct fusion_negotiator *n, const char *name,
                                          kolo_status_t st, const char *why);
/* Writes this rank's control block (block_size bytes) and a malloc'd message
 * of the requests it has not announced yet (*msg NULL, *msg_len 0 when none).
 * The message length is inside the block. */
kolo_status_t fusion_negotiator_encode(struct fusion_negotiator *n, bool shutdown, uint8_t *block,
                                       uint8_t **msg, size_t *msg_len);
/* Each rank's message length, read from the gathered blocks. */
uint32_t fusion_negotiator_block_msg_len(const uint8_t *block);
/* Given every rank's block (size * block_size bytes, in rank order) and
 * message, decides this cycle. now_ns stamps the stall bookkeeping. Fills
 * *out (free with fusion_cycle_fini). KOLO_EPROTO on a malformed message. */
kolo_status_t fusion_negotiator_decide(struct fusion_negotiator *n, const uint8_t *blocks,
                                       const uint8_t *const *msgs, const size_t *msg_lens,
                                       uint64_t now_ns, struct fusion_cycle *out);

/* Stall inspector: names reported by some ranks but not all, for at least
 * min_age_ns. Writes "rank 1: [a, b, c, d, e, …]; rank 3: [x]" into buf and
 * returns the number of stalled names. */
size_t fusion_negotiator_stall_report(const struct fusion_negotiator *n, uint64_t now_ns,
                                      uint64_t min_age_ns, char *buf, size_t size);
/* true when every rank that has not joined waits on a name stalled for at
 * least min_age_ns that some other rank has not submitted: the ranks wait on
 * different names, and none can complete until a rank submits more. */
bool fusion_negotiator_deadlocked(const struct fusion_negotiator *n, uint64_t now_ns,
                                  uint64_t min_age_ns);
/* Calls fn for every name pending for at least min_age_ns. */
void fusion_negotiator_stalled(const struct fusion_negotiator *n, uint64_t now_ns,
                               uint64_t min_age_ns, void (*fn)(void *arg, const char *name),
                               void *arg);
/* Entries currently in the response cache. */
size_t fusion_negotiator_cache_size(const struct fusion_negotiator *n);

/* Fills dst with a mismatch description of the ranks' params for `name`, or
 * returns false when they agree. Exposed for tests. */
bool fusion_describe_mismatch(const char *name, const struct fusion_params *const *p,
                              const bool *present, int size, char *dst, size_t dstlen);

/* ---- fusion planner (plan.c) -------------------------------------------- */

struct fusion_item {
	uint8_t dtype, op;
	double prescale, postscale;
	uint64_t bytes;
	/* Reduced from the caller's buffers: batched with items of its kind, but
	 * its bytes take no room in the fusion buffer. */
	bool direct;
	/* Device memory: batched only with device items, in the device fusion
	 * buffer. */
	bool device;
};

/* Groups items (in order) into batches of the same dtype/op/scales whose
 * packed (not direct) bytes fit in threshold, scanning ahead past items that
 * do not match. A packed item larger than the threshold, or any item when
 * threshold is 0, is a batch of its own. batch_of[i] receives item i's batch number; batches are
 * numbered by their first item. Returns the number of batches. */
size_t fusion_plan(const struct fusion_item *items, size_t n, uint64_t threshold, size_t *batch_of);

/* ---- timeline (timeline.c) ---------------------------------------------- */

struct fusion_timeline;

/* Opens path and starts the writer thread. queue_cap bounds the events held
 * in memory; when full, events are dropped (counted), never blocking. */
kolo_status_t fusion_timeline_create(const char *path, size_t queue_cap, bool mark_cycles,
                                     struct fusion_timeline **out, struct kolo_errbuf *eb);
/* Flushes, closes the JSON array and the file. Accepts NULL. */
void fusion_timeline_destroy(struct fusion_timeline *t);
/* Events (thread-safe, non-blocking). ts_us is kolo_now_ns()/1000. */
void fusion_timeline_negotiate_begin(struct fusion_timeline *t, const char *name, int kind,
                                     uint64_t ts_us);
void fusion_timeline_rank_ready(struct fusion_timeline *t, const char *name, int rank,
                                uint64_t ts_us);
void fusion_timeline_negotiate_end(struct fusion_timeline *t, const char *name, uint64_t ts_us);
/* An activity (QUEUE, MEMCPY_IN_FUSION_BUFFER, ALLREDUCE, ...) of a tensor. */
void fusion_timeline_begin(struct fusion_timeline *t, const char *name, const char *activity,
                           uint64_t ts_us);
void fusion_timeline_end(struct fusion_timeline *t, const char *name, uint64_t ts_us);
void fusion_timeline_mark_cycle(struct fusion_timeline *t, uint64_t ts_us);
uint64_t fusion_timeline_dropped(const struct fusion_timeline *t);

/* ---- autotune (autotune.c) ---------------------------------------------- */

struct fusion_autotune_config {
	uint64_t threshold; /* starting values */
	double cycle_time_ms;
	int steps_per_sample;      /* steps measured per sample */
	int warmup_samples;        /* discarded after each change */
	int samples_per_candidate; /* median of this many */
	const char *log_path;      /* CSV, or NULL */
};

struct fusion_autotune;

kolo_status_t fusion_autotune_create(const struct fusion_autotune_config *cfg,
                                     struct fusion_autotune **out);
void fusion_autotune_destroy(struct fusion_autotune *a);
/* Records that `bytes` of tensor `name` were reduced at now_ns. Returns true
 * when the tuner wants new values (*threshold, *cycle_ms) to be applied from
 * now on; the caller applies them on every rank and calls
 * fusion_autotune_applied() once they are in force. */
bool fusion_autotune_record(struct fusion_autotune *a, const char *name, uint64_t bytes,
                            uint64_t now_ns, uint64_t *threshold, double *cycle_ms);
void fusion_autotune_applied(struct fusion_autotune *a, uint64_t now_ns);
/* true once the search has finished and the best values are fixed. */
bool fusion_autotune_done(const struct fusion_autotune *a);
/* The best values found so far. */
void fusion_autotune_best(const struct fusion_autotune *a, uint64_t *threshold, double *cycle_ms);

/* ---- record codec (record.c) -------------------------------------------- */

/* A rank's message is a sequence of records, each a type byte and its fields
 * in host byte order (every rank of a job runs the same build):
 *   REQUEST  kind u8, dtype u8, op u8, mem u8, root u32, prescale f64, postscale f64,
 *            ncounts u32, counts u64[ncounts], name (u32 length + bytes)
 *   PARAMS   fusion_threshold u64, cycle_time_ms f64       (rank 0 only)
 *   FAIL     status u8, name, why (each u32 length + bytes) (rank 0 only) */
enum fusion_record_type {
	FUSION_RECORD_REQUEST = 1,
	FUSION_RECORD_PARAMS = 2,
	FUSION_RECORD_FAIL = 3,
};

/* One decoded record. name, why and p.counts are owned (fusion_record_fini). */
struct fusion_record {
	uint8_t type;
	char *name;                /* REQUEST, FAIL */
	struct fusion_params p;    /* REQUEST */
	uint64_t fusion_threshold; /* PARAMS */
	double cycle_time_ms;      /* PARAMS */
	kolo_status_t status;      /* FAIL */
	char *why;                 /* FAIL */
};

/* Decodes the record at msg[*off] (*off < len) into *out and advances *off
 * past it. Reads only its arguments: no negotiator state. KOLO_EPROTO when
 * the bytes are not a record (truncated, unknown type or kind, a name of
 * FUSION_NAME_MAX bytes or more, a reason of 64 KiB or more), KOLO_ENOMEM;
 * on failure *out holds nothing to free. */
kolo_status_t fusion_record_decode(const uint8_t *msg, size_t len, size_t *off,
                                   struct fusion_record *out);
void fusion_record_fini(struct fusion_record *r);

/* A growing message; oom is sticky (the message is then incomplete). */
struct fusion_wbuf {
	uint8_t *b;
	size_t len, cap;
	bool oom;
};
void fusion_record_put_request(struct fusion_wbuf *w, const char *name,
                               const struct fusion_params *p);
void fusion_record_put_params(struct fusion_wbuf *w, uint64_t fusion_threshold,
                              double cycle_time_ms);
void fusion_record_put_fail(struct fusion_wbuf *w, kolo_status_t st, const char *name,
                            const char *why);

/* The control block every rank sends each cycle: flags u32, the length of
 * its message u32, then one bit per response-cache slot it has pending.
 * The flags' top 24 bits hold the rank's longest negotiation wait, in µs
 * (saturated), for the operations the previous cycle decided (0: none): the
 * ranks that waited least arrived last (the straggler figures). */
#define FUSION_BLOCK_HDR 8
enum { FUSION_BLOCK_SHUTDOWN = 1 };
#define FUSION_BLOCK_AGE_SHIFT 8
#define FUSION_BLOCK_AGE_MAX   0xffffffu

/* ---- negotiator state (negotiate.c, decide.c, cache.c, stall.c) --------- */

/* Where a local operation stands: not sent yet, waiting on its cache bit,
 * or announced by a REQUEST record. */
enum fusion_local_state { FUSION_LOCAL_NEW, FUSION_LOCAL_CACHED, FUSION_LOCAL_ANNOUNCED };

/* An operation this rank submitted that is not decided yet. */
struct fusion_local_op {
	char *name;
	struct fusion_params p;
	uint64_t id;
	enum fusion_local_state state;
	int slot;           /* FUSION_LOCAL_CACHED: the cache slot */
	uint64_t submit_ns; /* when it was handed to the negotiator */
};

/* An announced name: which ranks have announced it, and with what. */
struct fusion_table_entry {
	char *name;
	int kind;
	uint64_t first_ns;
	bool *has;
	struct fusion_params *p; /* size entries */
};

/* A response-cache slot: a name that ran before with every rank. */
struct fusion_cache_slot {
	bool used;
	char *name;
	struct fusion_params p; /* canonical (as in a response) */
	uint64_t last_used;
	uint64_t pending_since;
	bool *had; /* bit per rank in the last cycle */
};

/* A FAIL record rank 0 will send in its next message. */
struct fusion_pending_fail {
	char *name;
	kolo_status_t st;
	char *why;
};

struct fusion_negotiator {
	int rank, size, capacity;
	uint64_t cycle;
	/* This rank's longest negotiation wait (submission to decision, µs) of
	 * the operations the last decide gave it; sent in the next block. */
	uint64_t decide_ns;
	uint32_t wait_us;
	struct fusion_local_op *loc;
	size_t nloc, caploc;
	struct fusion_table_entry *tab;
	size_t ntab, captab;
	struct fusion_cache_slot *cache; /* capacity slots */
	bool *joined;
	uint64_t *join_cycle;
	/* rank 0's control records for the next message */
	bool send_params;
	uint64_t p_threshold;
	double p_cycle;
	struct fusion_pending_fail *fails;
	size_t nfails;
	/* scratch: slots evicted (or failed) in this cycle */
	bool *evicted;
};

/* The local queue (negotiate.c). */
struct fusion_local_op *fusion_local_find(struct fusion_negotiator *n, const char *name);
void fusion_local_remove(struct fusion_negotiator *n, struct fusion_local_op *l);

/* The announced-name table (decide.c). */
void fusion_table_entry_fini(struct fusion_table_entry *t, int size);

/* The response cache (cache.c). */
bool fusion_cache_accepts(int kind);
int fusion_cache_find(const struct fusion_negotiator *n, const char *name);
/* true when local op l is what slot s holds from this rank's view. */
bool fusion_cache_matches_local(const struct fusion_negotiator *n, const struct fusion_local_op *l,
                                int s);
/* Drops slot s; local ops waiting on it go back to FUSION_LOCAL_NEW. */
void fusion_cache_evict(struct fusion_negotiator *n, int s);
void fusion_cache_slot_clear(struct fusion_cache_slot *c);
/* Stores name in a free slot or the least recently used one (counted in
 * *evictions). */
kolo_status_t fusion_cache_insert(struct fusion_negotiator *n, const char *name,
                                  const struct fusion_params *p, uint64_t *evictions);

/* ---- engine state (engine.c, enqueue.c, execute.c, engine_timeline.c,
 * handle.c) ---------------------------------------------------------------- */

/* A queued operation. */
struct fusion_queued_op {
	struct fusion_queued_op *next;    /* in e->ops */
	struct fusion_queued_op *next_in; /* in e->incoming */
	uint64_t id;
	struct kolo_engine_op op; /* the caller's description; arrays below are copies */
	char *name;
	struct fusion_params p;
	const void **sendbufs;
	void **recvbufs;
	size_t *gcounts;
	kolo_handle_t *h;
	uint64_t enqueued_ns; /* kolo_metrics_start() at enqueue */
	uint64_t fl_seq;      /* its flight-recorder entry; 0: none */
};

/* A set of names (the timeline's open negotiations). */
struct fusion_name_set {
	char **v;
	size_t n, cap;
};

struct kolo_engine {
	struct kolo_ring_comm *rc;
	int rank, size;
	struct kolo_engine_config cfg;
	pthread_t thread;
	pthread_mutex_t shutdown_lock; /* one kolo_engine_shutdown at a time */
	bool thread_started;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	/* under lock */
	struct fusion_queued_op *ops;      /* every queued op, newest first */
	struct fusion_queued_op *incoming; /* not yet handed to the negotiator, oldest first */
	struct fusion_queued_op **incoming_tail;
	bool shutdown_req;
	bool stopped;
	bool aborted; /* kolo_engine_abort: the failure is expected */
	kolo_status_t fail_st;
	char fail_msg[KOLO_ERRBUF_SIZE];
	uint64_t next_id, barrier_seq, join_seq, excl_seq;
	/* timeline, under tl_lock */
	pthread_mutex_t tl_lock;
	struct fusion_timeline *tl;
	/* engine thread only */
	struct fusion_negotiator *neg;
	uint64_t threshold;
	double cycle_ms;
	uint8_t *fbuf;
	size_t fbuf_cap;
	/* The device fusion buffer (core/gpu.h), on device dfbuf_dev. */
	void *dfbuf;
	size_t dfbuf_cap;
	int dfbuf_dev;
	struct fusion_autotune *at;
	uint64_t last_stall_warn_ns;
	uint64_t last_cycle_ns;
	bool others_pending;
	struct fusion_name_set tl_open;
	/* statistics */
	uint64_t cycles;
};

/* Handles (handle.c): fusion_handle_create/complete/discard in fusion.h. */

/* Queued operations (engine.c). */
void fusion_queued_op_free(struct fusion_queued_op *o);
/* The queued op with this id, or NULL. Takes e->lock. */
struct fusion_queued_op *fusion_engine_find_op(struct kolo_engine *e, uint64_t id);
/* Finishes o (NULL: nothing): unlinks it, runs the callback, completes the
 * handle and frees it. */
void fusion_engine_complete(struct kolo_engine *e, struct fusion_queued_op *o, kolo_status_t st,
                            const char *msg);
/* Counts o, completing with st, in the worker's metrics (engine_metrics.c). */
void fusion_engine_metrics_done(const struct kolo_engine *e, const struct fusion_queued_op *o,
                                kolo_status_t st);
/* Copies the ring's last error (or st's text) into msg; returns st. */
kolo_status_t fusion_engine_ring_error(struct kolo_engine *e, kolo_status_t st, char *msg,
                                       size_t len);

/* Execute (execute.c): runs the responses of one cycle. A data-plane
 * failure is returned (the ops of that collective already failed);
 * everything else completes there. */
kolo_status_t fusion_engine_execute(struct kolo_engine *e, struct fusion_cycle *c, char *msg,
                                    size_t len);

/* The engine's timeline events (engine_timeline.c); tl_lock guards e->tl. */
bool fusion_engine_tl_on(struct kolo_engine *e);
void fusion_engine_tl_begin(struct kolo_engine *e, const char *name, const char *activity);
void fusion_engine_tl_end(struct kolo_engine *e, const char *name);
/* A cycle's ticks and responses: NEGOTIATE spans, then QUEUE. */
void fusion_engine_tl_cycle(struct kolo_engine *e, const struct fusion_cycle *c);
/* Closes the timeline and forgets the open names (kolo_engine_destroy). */
void fusion_engine_tl_fini(struct kolo_engine *e);

#endif /* KOLO_FUSION_INTERNAL_H */
