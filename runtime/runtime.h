/* runtime: the composition root. kolo_init() reads the parameters, joins the
 * rendezvous, creates the transport for the round, publishes its address in
 * the KV (key "addr/<round>/<rank>"), and builds the ring comm. The public
 * collectives of kolo.h delegate to ring/; the async API delegates to the
 * fusion engine, created on first use. */
#ifndef KOLO_RUNTIME_H
#define KOLO_RUNTIME_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "core.h"
#include "flight.h"
#include "rendezvous.h"
#include "ring.h"
#include "transport.h"

struct kolo_engine;       /* fusion/ */
struct kolo_device_state; /* device.c */

struct kolo_comm {
	struct kolo_rdzv_client *rdzv; /* NULL for a bootstrap comm (bootstrap.c) */
	/* Bootstrap comms: every rank's transport handle, given by the caller;
	 * NULL when the addresses come from the rendezvous KV. */
	struct kolo_transport_handle *cards;
	/* Bootstrap comms: every rank's p2p endpoint, from the second half of
	 * its card, and this rank's endpoint, listening since
	 * kolo_bootstrap_listen() until the first send or recv takes it. */
	struct kolo_transport_handle *p2p_cards;
	struct kolo_transport *p2p_transport;
	char job[KOLO_RDZV_ID_MAX];
	char route_to[KOLO_RDZV_HOST_MAX];      /* picks this rank's address; "" default */
	int timeout_ms;                         /* no-progress timeout of collectives */
	atomic_bool aborted;                    /* kolo_abort() was called */
	struct kolo_rdzv_assignment assignment; /* rank, size, ... of this round */
	struct kolo_transport *transport;
	struct kolo_ring_comm *ring;
	struct kolo_engine *engine; /* NULL until the async API is first used */
	pthread_mutex_t engine_lock;
	char *token;
	char host[KOLO_RDZV_HOST_MAX];
	struct kolo_errbuf err; /* kolo_last_error() */
	/* Elastic mode (reform.c); elastic is NULL when KOLO_ELASTIC is off. */
	struct kolo_elastic *elastic;
	pthread_mutex_t elastic_lock;     /* live_ring, live_round vs. the watcher */
	struct kolo_ring_comm *live_ring; /* the ring the watcher may abort */
	int64_t live_round;
	bool change_at_commit;   /* the next reform follows a commit point */
	int64_t announced_round; /* the round whose end this rank announced */
	int resets;              /* re-forms done */
	int rejoins;             /* times this process joined again after an eviction */
	bool left;               /* left the job (SIGTERM while re-forming, or it finished) */
	bool done;               /* training complete: kolo_finalize finishes the job */
	bool evicted;            /* left the job as a straggler (straggler.c) */
	struct kolo_straggler_watch *straggler; /* rank 0's eviction policy, or NULL */
	struct kolo_preempt *preempt; /* the preemption watcher (KOLO_PREEMPTION), or NULL */
	uint64_t reform_ns[4];        /* last reform: start, torn down, assigned, connected */
	bool metrics;                 /* holds a reference on the metrics server */
	/* Device collectives (device.c): NULL until the first; device_lock
	 * guards its creation. */
	struct kolo_device_state *device;
	pthread_mutex_t device_lock;
	/* Point-to-point (p2p.c): NULL until the first send or recv of the
	 * round; p2p_lock guards its creation and teardown. */
	struct kolo_p2p *p2p;
	void *p2p_ctx;
	pthread_mutex_t p2p_lock;
	/* Process sets (process_set.c): epoch is this comm's, made by its first
	 * set and shared with every set made from it; a re-form or the end of
	 * this comm moves it on. A set holds its parent's (parent_epoch) and the
	 * generation it was made in; sets_made numbers the sets. */
	struct kolo_set_epoch *epoch;
	struct kolo_set_epoch *parent_epoch;
	uint64_t parent_gen;
	int sets_made;
	/* The flight recorder of this comm's collectives (core/flight.h), kept
	 * across re-forms; blocking_calls numbers the blocking collectives
	 * that run without the engine. */
	struct kolo_flight *flight;
	uint64_t blocking_calls;
	bool diag; /* holds a reference on the diagnosis thread (diag.c) */
	struct kolo_durable_writer *durable; /* durable commits' writer (durable.c), or NULL */
	/* A notice's deadline (preempt_deadline.c): the forced leave runs under
	 * deadline_lock, which also guards durable's creation; deadline_off:
	 * the worker left or finalizes, the deadline does nothing. */
	pthread_mutex_t deadline_lock;
	bool deadline_off;
};

/* ---- the flight recorder's reports (diag.c, docs/diagnosis.md) ----------
 * start: the first comm of the process starts the diagnosis thread (its
 * reports to the rendezvous, when the comm has one; SIGUSR1 dumps), later
 * ones take a reference; stop drops it, the last stops the thread. identity:
 * the rank, size and round that reports and dumps carry, after every new
 * assignment of the comm that started it. fatal: writes the recorder to a
 * file, the first time only. flight_json: the recorder as JSON (the metrics
 * endpoint's /flight). */
void kolo_runtime_diag_start(struct kolo_comm *comm);
void kolo_runtime_diag_stop(struct kolo_comm *comm);
void kolo_runtime_diag_identity(const struct kolo_comm *comm);
void kolo_runtime_diag_fatal(const char *why);
/* The reporter's view of the other ranks on its host (diag_peers.c): set
 * with the identity; publish this process once per round and list the
 * others' process states as a JSON array (malloc'd; NULL: none), from the
 * reporter thread. */
void kolo_runtime_diag_peers_set(const struct kolo_comm *comm);
/* false while this round's first attempt is still to come */
bool kolo_runtime_diag_peers_publish(struct kolo_rdzv_client *c);
char *kolo_runtime_diag_peers_json(struct kolo_rdzv_client *c);
kolo_status_t kolo_runtime_flight_json(char **out, size_t *len);

/* ---- process sets (process_set.c) ------------------------------------- */
struct kolo_bootstrap;
struct kolo_bootstrap_config;
/* kolo_bootstrap_create, with the host name given (NULL: KOLO_HOSTNAME or
 * the system's, and the log identity set to the rank; a process set passes
 * its parent's host and keeps the process's identity). */
kolo_status_t kolo_runtime_bootstrap_new(const struct kolo_bootstrap_config *cfg, const char *host,
                                         struct kolo_bootstrap **out);
/* KOLO_OK, or KOLO_EINVAL ("<coll>: ...") for a set whose parent re-formed
 * or ended since the set was made. */
kolo_status_t kolo_runtime_set_check(struct kolo_comm *comm, const char *coll);
/* A re-form: the sets made from comm so far refuse every op from now on. */
void kolo_runtime_sets_invalidate(struct kolo_comm *comm);
/* The comm's end: invalidates its sets and drops its epoch references. */
void kolo_runtime_sets_release(struct kolo_comm *comm);

/* Tells the launcher (kolorun, through the pipe named by KOLO_LAUNCHER_FD)
 * this worker's rank, size and round, so that it prefixes the worker's output
 * with the rank. Does nothing without a launcher; never fails. Call after
 * every new assignment. */
kolo_status_t kolo_runtime_report_rank(const struct kolo_comm *comm);
/* Tells the launcher the worker id this worker registered under ("worker
 * ID"), so that when the process dies the launcher can name it to the
 * rendezvous. Does nothing without a launcher. Call after every join. */
void kolo_runtime_report_worker(const struct kolo_comm *comm);

struct kolo_engine_config; /* fusion/ */
/* The fusion engine's configuration from the KOLO_* parameters (and
 * Horovod's names for them). */
void kolo_runtime_engine_config(struct kolo_engine_config *cfg);

/* Point-to-point (p2p.c). close: fails the pending and later operations of
 * the round (thread-safe, non-blocking); destroy: closes, stops and frees
 * the round's p2p, the next send or recv makes a new one. */
void kolo_runtime_p2p_close(struct kolo_comm *comm, kolo_status_t st, const char *why);
void kolo_runtime_p2p_destroy(struct kolo_comm *comm, kolo_status_t st, const char *why);
/* A listening TCP endpoint for point-to-point, with the comm's transport
 * configuration; its address in *handle. */
kolo_status_t kolo_runtime_p2p_listen(struct kolo_comm *comm, struct kolo_transport **out,
                                      struct kolo_transport_handle *handle);

/* Records st and its message as the comm's last error and returns st. */
kolo_status_t kolo_comm_fail(struct kolo_comm *comm, kolo_status_t st, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));

struct kolo_elastic; /* elastic/ */
struct kolo_preempt; /* elastic/preempt.h */

/* Creates the transport for comm->assignment, publishes its address and
 * connects the ring (init.c; also what kolo_reform does for a new round). */
kolo_status_t kolo_runtime_data_plane_create(struct kolo_comm *comm);
/* The two halves of it: the transport, listening, with its handle in *out;
 * then the ring (and hierarchy), whose peer addresses come from comm->cards
 * or from the KV. */
kolo_status_t kolo_runtime_transport_create(struct kolo_comm *comm,
                                            struct kolo_transport_handle *out);
struct kolo_transport_config;
void kolo_runtime_transport_config(struct kolo_comm *comm, struct kolo_transport_config *out);
kolo_status_t kolo_runtime_ring_create(struct kolo_comm *comm);
/* The hierarchical allreduce's levels on comm->ring where the round allows
 * and the parameters ask (hierarchy.c; docs/hierarchical.md): hosts, and
 * under them zones. local_segment_bytes: the pipeline segment inside a host. */
kolo_status_t kolo_runtime_hierarchy_setup(struct kolo_comm *comm, size_t local_segment_bytes);
/* Whether the parameter's value is a, b or c, ignoring case. */
bool kolo_runtime_param_is(enum kolo_param_id id, const char *a, const char *b, const char *c);
/* The transport between hosts that KOLO_TRANSPORT asks for (net_select.c):
 * TCP, verbs (an error without an active RDMA port), or auto (verbs when
 * every rank of the round has one, agreed through the KV). Logs the choice. */
kolo_status_t kolo_runtime_net_select(struct kolo_comm *comm,
                                      const struct kolo_transport_ops **net);

/* A zeroed comm with its locks initialised, or NULL; comm_free's inverse. */
struct kolo_comm *kolo_runtime_comm_new(void);
void kolo_runtime_comm_free(struct kolo_comm *comm);
/* Records comm's last error as this thread's kolo_init_error(), frees the
 * comm and returns st. */
kolo_status_t kolo_runtime_init_fail(struct kolo_comm *comm, kolo_status_t st);
void kolo_runtime_set_init_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Elastic mode (reform.c). start: when KOLO_ELASTIC is set, installs the
 * SIGTERM handler and starts the membership watcher for the comm's round;
 * does nothing otherwise. stop: stops the watcher; accepts a comm without
 * one. failed: what a failed collective returns: in elastic mode a peer
 * failure becomes KOLO_EMEMBERSHIP and the round's end is announced to every
 * rank; otherwise st unchanged. */
/* kolo_init's first data plane: kolo_runtime_data_plane_create, and in an
 * elastic job the next round (as kolo_reform) when a member of this one was
 * lost while it connected. */
kolo_status_t kolo_runtime_elastic_connect(struct kolo_comm *comm);
/* Failures of a collective that a new round cures. ENOTFOUND: a peer's
 * address is gone from the KV (the server restarted); every member then
 * polls past the adopted round, which makes the server form a new one. */
bool kolo_runtime_membership_failure(kolo_status_t st);
/* Tells the rendezvous this worker leaves: it is dropped from the job at
 * once, and the next round forms without waiting for its lease; closes the
 * data plane. */
void kolo_runtime_elastic_leave_job(struct kolo_comm *comm, const char *why);
kolo_status_t kolo_runtime_elastic_start(struct kolo_comm *comm);
void kolo_runtime_elastic_stop(struct kolo_comm *comm);
kolo_status_t kolo_runtime_elastic_failed(struct kolo_comm *comm, kolo_status_t st);

/* ---- a preemption notice's deadline (preempt_deadline.c) -----------------
 * deadline: the preemption watcher's on_deadline (arg: the comm), on its
 * thread: unless disarmed, logs why, waits for a durable commit in flight
 * (rank 0) while it fits in left_ms, deletes the worker from the job and
 * ends the round for the others; true when it did (the process then exits).
 * disarm: the worker left or finalizes; waits for a forced leave in
 * progress (which ends in the exit). */
bool kolo_runtime_preempt_deadline(void *arg, const char *notice, int64_t left_ms);
void kolo_runtime_preempt_disarm(struct kolo_comm *comm);

/* ---- the straggler eviction policy (straggler.c) --------------------------
 * At a commit point, on rank 0 of an elastic job with KOLO_STRAGGLER_EVICT_PCT
 * set: the rank to evict plus one, or 0 (always 0 elsewhere). */
int32_t kolo_runtime_straggler_verdict(struct kolo_comm *comm);
/* This worker was evicted: marks the comm and logs why (rank 0 put it in
 * the KV), into why. */
void kolo_runtime_straggler_evicted(struct kolo_comm *comm, char *why, size_t len);
void kolo_runtime_straggler_free(struct kolo_comm *comm);

/* ---- durable commits (durable.c, docs/durable.md) ------------------------
 * due: KOLO_DURABLE_DIR is set, this is rank 0 and commit is a multiple of
 * KOLO_DURABLE_EVERY. put: hands a copy of the payload to the comm's writer
 * (created at the first put), which writes it and records the commit in the
 * rendezvous KV ("durable/commit"); a failure is logged, never fatal.
 * resume: on rank 0, the job's durable commit when one exists (KOLO_OK,
 * *data malloc'd), KOLO_ENOTFOUND when there is none or durable commits are
 * off, KOLO_EINVAL (comm's error set) for a damaged file. stop: waits for
 * the writes in progress (bounded) and frees the writer. */
bool kolo_runtime_durable_due(const struct kolo_comm *comm, int64_t commit);
kolo_status_t kolo_runtime_durable_put(struct kolo_comm *comm, const void *data, size_t len,
                                       int64_t commit);
kolo_status_t kolo_runtime_durable_resume(struct kolo_comm *comm, void **data, size_t *len,
                                          int64_t *commit);
void kolo_runtime_durable_stop(struct kolo_comm *comm);

/* ---- the metrics endpoint (metrics_http.c) ------------------------------
 * KOLO_METRICS_LISTEN is HOST:PORT or :PORT; a worker listens on PORT plus
 * its local rank (so that the workers of one host do not collide), PORT 0
 * on any free port. One server per process, started by its first comm. */

/* Splits spec into host ("" for every address) and the port for local_rank;
 * KOLO_EINVAL with the reason in eb for a malformed value. */
kolo_status_t kolo_runtime_metrics_parse(const char *spec, int local_rank, char *host,
                                         size_t host_size, int *port, struct kolo_errbuf *eb);
/* Checks KOLO_METRICS_LISTEN's form before anything else happens (kolo_init
 * calls it before joining, so a typo fails at once). */
kolo_status_t kolo_runtime_metrics_check(struct kolo_comm *comm);
/* Records comm's assignment in the metrics, and when KOLO_METRICS_LISTEN is
 * set starts the server (the first comm of the process) or takes a
 * reference on it. Fails with the comm's last error set. */
kolo_status_t kolo_runtime_metrics_start(struct kolo_comm *comm);
/* Drops comm's reference; the last one stops the server. Accepts a comm
 * without one. */
void kolo_runtime_metrics_stop(struct kolo_comm *comm);
/* The port the server listens on, -1 when none runs. */
int kolo_runtime_metrics_port(void);

/* ---- argument checks (args.c) ------------------------------------------
 * The one judge of the public collectives' arguments: the blocking entry
 * points (api.c) and the async ones (async.c) call these before anything
 * runs, so the same bad call gets the same status and message on both. Each
 * returns KOLO_OK, or KOLO_EINVAL with comm's last error set to
 * "<collective>: <what is wrong>", where <collective> is the family's name
 * ("allreduce", "allgather" for allgather(v), "alltoall" for alltoall(v),
 * ...), never the entry point's. A NULL comm is KOLO_EINVAL with no message
 * (kolo_last_error(NULL) says "comm is NULL"). A buffer in CUDA device
 * memory (core/gpu.h) passes where the device data path can run (counted
 * for kolo_args_mem_device) and is KOLO_EUNSUPPORTED, "<collective>:
 * <buffer> is CUDA device memory; ...", where it cannot. The layers below
 * may assert what these check, but do not judge it again. */

/* The per-collective checks both paths share, in this order: comm, dtype,
 * op, scale factors (finite), byte counts (no size_t overflow), buffers (NULL
 * only with 0 elements), root. reducescatter's recvbuf holds this rank's
 * block (kolo_reducescatter_count). */
kolo_status_t kolo_args_allreduce(struct kolo_comm *comm, const void *sendbuf, const void *recvbuf,
                                  size_t count, kolo_dtype_t dtype, kolo_op_t op, double prescale,
                                  double postscale);
kolo_status_t kolo_args_reducescatter(struct kolo_comm *comm, const void *sendbuf,
                                      const void *recvbuf, size_t count, kolo_dtype_t dtype,
                                      kolo_op_t op, double prescale, double postscale);
kolo_status_t kolo_args_broadcast(struct kolo_comm *comm, const void *buf, size_t count,
                                  kolo_dtype_t dtype, int root);
/* The sending side of allgather(v): this rank's sendcount elements. */
kolo_status_t kolo_args_allgather(struct kolo_comm *comm, const void *sendbuf, size_t sendcount,
                                  kolo_dtype_t dtype);
/* The sending side of alltoall(v): sendcounts[j] elements to rank j, or, with
 * sendcounts NULL, count elements in total split evenly over the ranks.
 * *total (may be NULL) gets the elements sent. */
kolo_status_t kolo_args_alltoall(struct kolo_comm *comm, const void *sendbuf, size_t count,
                                 const size_t *sendcounts, kolo_dtype_t dtype, size_t *total);
/* n >= 1 tensors, each named (distinct, as kolo_args_name) with its buffers;
 * the counts together must fit in size_t bytes. */
kolo_status_t kolo_args_grouped_allreduce(struct kolo_comm *comm, int n, const char *const *names,
                                          const void *const *sendbufs, void *const *recvbufs,
                                          const size_t *counts, kolo_dtype_t dtype, kolo_op_t op,
                                          double prescale, double postscale);

/* The pieces, for what only one path has (a receive side, an async name or
 * output pointer). comm must have passed kolo_args_comm. */
kolo_status_t kolo_args_comm(struct kolo_comm *comm, const char *coll);
kolo_status_t kolo_args_dtype(struct kolo_comm *comm, const char *coll, kolo_dtype_t dtype);
/* blocks x count elements of dtype fit in size_t bytes; *total (may be NULL)
 * gets blocks x count. */
kolo_status_t kolo_args_elements(struct kolo_comm *comm, const char *coll, size_t count,
                                 size_t blocks, kolo_dtype_t dtype, size_t *total);
/* counts (what: its name in the message) is not NULL and its kolo_size()
 * entries add up to bytes that fit in size_t; *total (may be NULL) gets the
 * sum. */
kolo_status_t kolo_args_counts(struct kolo_comm *comm, const char *coll, const char *what,
                               const size_t *counts, kolo_dtype_t dtype, size_t *total);
/* buf may be NULL only when it holds 0 elements. */
kolo_status_t kolo_args_buf(struct kolo_comm *comm, const char *coll, const char *what,
                            const void *buf, size_t count);
/* A pointer the call cannot do without (an output, an array). */
/* sendbuf and recvbuf are both host or both device memory (when both hold elements). */
kolo_status_t kolo_args_same_memory(struct kolo_comm *comm, const char *coll, const void *sendbuf,
                                    size_t sendcount, const void *recvbuf, size_t recvcount);
kolo_status_t kolo_args_ptr(struct kolo_comm *comm, const char *coll, const char *what,
                            const void *ptr);
/* An async operation's name: not NULL, 1 to 1023 bytes. */
kolo_status_t kolo_args_name(struct kolo_comm *comm, const char *coll, const char *what,
                             const char *name);
/* Formats "<coll>: <fmt...>" as comm's last error; returns KOLO_EINVAL. */
kolo_status_t kolo_args_fail(struct kolo_comm *comm, const char *coll, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));

/* ---- device buffers (device.c) -------------------------------------------
 * A collective over CUDA device memory: staged through pinned host memory in
 * chunks (KOLO_GPU_STAGE_CHUNK_BYTES) on a kolo stream per comm and device,
 * after the caller's stream (c->after), or run by NCCL where
 * kolo_device_nccl_try takes it. */

struct kolo_dcoll;         /* fusion.h */
struct kolo_engine_device; /* fusion.h */

/* Runs c on rc (comm's ring, or the engine's when it owns the ring): the
 * same ring collectives on every rank whatever the memory of its buffers,
 * except that an allreduce, broadcast, allgather or reducescatter larger
 * than one chunk is split into chunks or rounds (the ranks of such a call
 * must all take this path). Results are on
 * the device, visible to every stream, when it returns; every wait is
 * bounded by comm->timeout_ms (KOLO_ETIMEDOUT). Failure detail in eb. */
kolo_status_t kolo_device_run(struct kolo_comm *comm, struct kolo_ring_comm *rc,
                              const struct kolo_dcoll *c, struct kolo_errbuf *eb);
/* The staged allreduce alone (never the NCCL path): the NCCL path's
 * cross-host part, on the hierarchy's cross ring rc. */
kolo_status_t kolo_device_allreduce(struct kolo_comm *comm, struct kolo_ring_comm *rc,
                                    const void *sendbuf, void *recvbuf, size_t count,
                                    kolo_dtype_t dtype, kolo_op_t op, double prescale,
                                    double postscale, void *after, struct kolo_errbuf *eb);
/* The NCCL path (device_nccl.c, docs/gpu.md): runs c and returns its status,
 * or KOLO_EUNSUPPORTED (eb untouched) when it does not apply, and the staged
 * path runs. The first call of a round is collective over rc (it forms the
 * round's NCCL communicator, or decides none applies). */
kolo_status_t kolo_device_nccl_try(struct kolo_comm *comm, struct kolo_ring_comm *rc,
                                   const struct kolo_dcoll *c, struct kolo_errbuf *eb);
/* Aborts and frees comm's NCCL communicator (device_nccl.c), formed again by
 * the next device collective: for a re-form and the comm's end. */
void kolo_device_nccl_reset(struct kolo_comm *comm);
/* The engine's hooks over comm (fusion.h). */
void kolo_device_engine_hooks(struct kolo_comm *comm, struct kolo_engine_device *out);
/* An event recorded now on the calling thread's stream (kolo_cuda_get_stream),
 * in *event; the caller destroys it. */
kolo_status_t kolo_device_ready_event(void **event, struct kolo_errbuf *eb);
/* Frees comm's device state (streams, staging). Accepts NULL. */
void kolo_device_state_destroy(struct kolo_device_state *d);

/* Since kolo_args_mem_reset, how many buffers the kolo_args_* checks of this
 * thread found in device memory (the caller then takes the device path). */
void kolo_args_mem_reset(void);
int kolo_args_mem_device(void);

#endif /* KOLO_RUNTIME_H */
