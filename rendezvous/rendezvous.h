/* rendezvous: the control plane. The server (embeddable, and the
 * kolo-rendezvous binary) decides membership rounds and serves a KV store;
 * the client (libcurl) is what a worker uses to join, learn its assignment,
 * heartbeat, leave, report failures and exchange data-plane addresses.
 * The HTTP contract is docs/rendezvous.md. */
#ifndef KOLO_RENDEZVOUS_H
#define KOLO_RENDEZVOUS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core.h"

#define KOLO_RDZV_DEFAULT_PORT 29470
#define KOLO_RDZV_MAX_BODY     (1024 * 1024)
#define KOLO_RDZV_ID_MAX       128 /* job ids, worker ids, KV keys */
#define KOLO_RDZV_HOST_MAX     256 /* host names */

/* ---- rank assignment (pure; unit-tested) ------------------------------ */

/* One member of a round, in join order of its host then of itself. */
struct kolo_rdzv_member {
	int rank;
	char worker_id[KOLO_RDZV_ID_MAX];
	char host[KOLO_RDZV_HOST_MAX];
	char zone[KOLO_RDZV_HOST_MAX]; /* "" when none */
};

struct kolo_rdzv_assignment {
	int64_t round;
	int rank, size;
	int local_rank, local_size;
	int cross_rank, cross_size;
	int n_members;
	struct kolo_rdzv_member *members; /* n_members, by rank; owned */
};

/* Given workers in the order they should be ranked (oldest first), computes
 * ranks contiguous per host (hosts ordered by their first worker), and for
 * worker `index` its local and cross ranks as Horovod does. members[] is
 * written in rank order; out->members is NOT set. */
void kolo_rdzv_assign(const char *const *hosts, int n, int index, struct kolo_rdzv_assignment *out,
                      int *rank_of_index);
void kolo_rdzv_assignment_fini(struct kolo_rdzv_assignment *a);

/* One worker's place in a round. */
struct kolo_rdzv_slot {
	int rank, size;
	int local_rank, local_size;
	int cross_rank, cross_size;
};
/* kolo_rdzv_assign for every worker at once in O(n + hosts * max local size):
 * out[i] is worker i's slot. KOLO_ENOMEM on allocation failure. */
kolo_status_t kolo_rdzv_assign_all(const char *const *hosts, int n, struct kolo_rdzv_slot *out);
/* kolo_rdzv_assign_all with each worker's zone (zones[i]; "" or a NULL
 * array: none): hosts are grouped by zone, zones in order of their first
 * worker, hosts within a zone by their first worker, so that ranks are
 * contiguous per zone as well as per host. A host's zone is its first
 * worker's. With every zone empty the result is kolo_rdzv_assign_all's. */
kolo_status_t kolo_rdzv_assign_zoned(const char *const *hosts, const char *const *zones, int n,
                                     struct kolo_rdzv_slot *out);
/* The zones of a round for a zone level of the hierarchical allreduce
 * (docs/hierarchical.md): members[0..n) by rank, in groups of `group`
 * consecutive ranks (the ranks of one host, or 1). Returns the number of
 * zones Z when every member names a zone, each zone's ranks are contiguous
 * and start on a group boundary, every zone holds the same number of groups
 * and that number is at least 2, and Z ≥ 2; else 0 (no zone level). */
int kolo_rdzv_zone_count(const struct kolo_rdzv_member *members, int n, int group);

/* ---- server ----------------------------------------------------------- */

struct kolo_rdzv_server_config {
	const char *listen; /* "HOST:PORT"; port 0 picks a free one */
	const char *token;  /* "" or NULL: no authentication */
	int min_np;         /* defaults for jobs never configured */
	int max_np;         /* 0: no limit */
	int settle_ms;
	int lease_ms;
	int64_t job_retain_ms; /* forget a job idle (no workers, polls or requests) this long; 0
	                          never */
	bool log_json;
};

struct kolo_rdzv_server;

/* Binds and starts serving in background threads. */
kolo_status_t kolo_rdzv_server_start(const struct kolo_rdzv_server_config *cfg,
                                     struct kolo_rdzv_server **out, struct kolo_errbuf *eb);
/* The port actually bound. */
int kolo_rdzv_server_port(const struct kolo_rdzv_server *s);
/* Stops accepting, finishes in-flight requests (long polls answer 503),
 * joins the threads and frees. Accepts NULL. */
void kolo_rdzv_server_stop(struct kolo_rdzv_server *s);

/* ---- server: request validation (pure; unit-tested) -------------------- */

/* true when s is 1..KOLO_RDZV_ID_MAX-1 characters of [A-Za-z0-9._:-], plus
 * '/' when allow_slash (KV keys). */
bool kolo_rdzv_valid_id(const char *s, bool allow_slash);
/* true when s is a valid host name: 1..KOLO_RDZV_HOST_MAX-1 characters of
 * [A-Za-z0-9._:-]. */
bool kolo_rdzv_valid_host(const char *s);

struct kolo_rdzv_job_config {
	int min_np, max_np, settle_ms;
};
/* Parses a PUT /v1/jobs/{job} body over the values already in *cfg (fields
 * are optional; present ones must be integers in range). On error returns
 * KOLO_EINVAL with a message for the client in err. */
kolo_status_t kolo_rdzv_parse_job_config(const char *body, size_t len,
                                         struct kolo_rdzv_job_config *cfg, char *err,
                                         size_t errsize);

struct kolo_rdzv_join_req {
	char host[KOLO_RDZV_HOST_MAX];
	char zone[KOLO_RDZV_HOST_MAX];    /* "" when none */
	char worker_id[KOLO_RDZV_ID_MAX]; /* "" when the server picks one */
	int64_t round;                    /* -1 when not a re-registration */
	int rank;                         /* -1 when not a re-registration */
};
/* Parses a POST /workers body ({"host"} required; "zone", "worker_id",
 * "round", "rank" optional, round and rank together). KOLO_EINVAL + err on error. */
kolo_status_t kolo_rdzv_parse_join(const char *body, size_t len, struct kolo_rdzv_join_req *out,
                                   char *err, size_t errsize);
struct kolo_rdzv_failure {
	char worker_id[KOLO_RDZV_ID_MAX]; /* "" when the report names a rank */
	int64_t round;                    /* -1 when not given */
	int rank;                         /* -1 when not given */
};
/* Parses a POST /failures body: {"round":int,"rank":int} (a peer reports a
 * rank of a round), or {"worker_id":str} (a launcher reports a worker whose
 * process it saw die), optionally with "round" and "rank" too. */
kolo_status_t kolo_rdzv_parse_failure(const char *body, size_t len, struct kolo_rdzv_failure *out,
                                      char *err, size_t errsize);

/* ---- client ----------------------------------------------------------- */

struct kolo_rdzv_client_config {
	const char *url; /* "http://host:port" */
	const char *job;
	const char *token; /* "" or NULL: none */
	const char *host;  /* this worker's host name */
	const char *zone;  /* its zone or rack; "" or NULL: none */
	int deadline_ms;   /* retry budget for an unreachable server */
};

struct kolo_rdzv_client;

/* What the background heartbeat has learnt. */
struct kolo_rdzv_hb_state {
	int64_t round;       /* the server's current round */
	bool pending_change; /* a join or leave waits for the next commit */
	bool evicted;        /* the server evicted this worker */
	kolo_status_t last;  /* status of the last heartbeat */
};

/* Initialises libcurl once per process (the clients do it themselves); for
 * other users of libcurl in kolo, e.g. the preemption watcher. */
kolo_status_t kolo_rdzv_http_init(struct kolo_errbuf *eb);

kolo_status_t kolo_rdzv_client_create(const struct kolo_rdzv_client_config *cfg,
                                      struct kolo_rdzv_client **out, struct kolo_errbuf *eb);
/* Stops the heartbeat and frees. Does not leave. Accepts NULL. */
void kolo_rdzv_client_destroy(struct kolo_rdzv_client *c);
/* The detail of the last failure of a call (the heartbeat thread's failures
 * show in kolo_rdzv_heartbeat_state() instead). Calls other than the
 * heartbeat ones may be made from several threads; each uses its own curl
 * handle. */
const char *kolo_rdzv_client_error(const struct kolo_rdzv_client *c);
/* POST /workers. Retries with backoff and jitter until the deadline. */
kolo_status_t kolo_rdzv_join(struct kolo_rdzv_client *c);
const char *kolo_rdzv_worker_id(const struct kolo_rdzv_client *c);
int kolo_rdzv_lease_ms(const struct kolo_rdzv_client *c);
/* Long-polls until a round newer than after_round that includes this worker
 * exists (KOLO_OK), timeout_ms passes (KOLO_ETIMEDOUT; < 0 waits without
 * limit) or the worker was evicted (KOLO_EMEMBERSHIP). Re-registers after a
 * server restart. On success also records the round and rank as with
 * kolo_rdzv_set_membership(). */
kolo_status_t kolo_rdzv_wait_assignment(struct kolo_rdzv_client *c, int64_t after_round,
                                        int timeout_ms, struct kolo_rdzv_assignment *out);
/* Starts / stops a background thread that heartbeats every period_ms (0: a
 * third of the lease), re-registering with the current round and rank after a
 * server restart. */
kolo_status_t kolo_rdzv_heartbeat_start(struct kolo_rdzv_client *c, int period_ms);
void kolo_rdzv_heartbeat_stop(struct kolo_rdzv_client *c);
/* Thread-safe snapshot of what the heartbeat has learnt. */
void kolo_rdzv_heartbeat_state(struct kolo_rdzv_client *c, struct kolo_rdzv_hb_state *out);
/* Tells the client which round and rank it holds, for re-registration. */
void kolo_rdzv_set_membership(struct kolo_rdzv_client *c, int64_t round, int rank);
/* Joins again as a new worker (a fresh id, no round or rank held) after the
 * server evicted this one, and restarts the heartbeat at its old period. */
kolo_status_t kolo_rdzv_rejoin(struct kolo_rdzv_client *c);
/* While fn is set (NULL clears it), requests other than the heartbeat's stop
 * waiting when fn(arg) returns true: a long poll within about a second
 * (libcurl's progress callback), a retry's back-off within 100 ms. They fail
 * with KOLO_ESHUTDOWN. fn runs on the caller's thread, so it must be cheap. */
void kolo_rdzv_set_cancel(struct kolo_rdzv_client *c, bool (*fn)(void *arg), void *arg);
/* DELETE /workers/{id}. */
kolo_status_t kolo_rdzv_leave(struct kolo_rdzv_client *c);
/* DELETE /workers/{id}?finished=1: this worker's training is complete, so
 * the job is: no round forms any more, and the workers still waiting to join
 * it fail with KOLO_ESHUTDOWN ("job finished: ...") instead of waiting. */
kolo_status_t kolo_rdzv_finish(struct kolo_rdzv_client *c);
/* POST /failures {"round","rank"}: a peer's report of a member it lost. */
kolo_status_t kolo_rdzv_report_failure(struct kolo_rdzv_client *c, int64_t round, int rank);
/* POST /failures {"worker_id"[,"round","rank"]}: the process of worker id is
 * known to be dead (its launcher reaped it); the server drops that worker
 * wherever it is. round > 0 and rank >= 0, when known, go along for servers
 * that predate reports by id (they act on those alone). */
kolo_status_t kolo_rdzv_report_dead(struct kolo_rdzv_client *c, const char *worker_id,
                                    int64_t round, int rank);
/* PUT /kv/{key}; len ≤ KOLO_RDZV_MAX_BODY. */
kolo_status_t kolo_rdzv_kv_put(struct kolo_rdzv_client *c, const char *key, const void *data,
                               size_t len);
/* GET /kv/{key}, waiting up to timeout_ms for it to appear (KOLO_ENOTFOUND
 * after that). *data is malloc'd; the caller frees it. */
kolo_status_t kolo_rdzv_kv_get(struct kolo_rdzv_client *c, const char *key, int timeout_ms,
                               void **data, size_t *len);
/* PUT /v1/jobs/{job}: sets the job's min_np, max_np and settle_ms. */
kolo_status_t kolo_rdzv_job_configure(struct kolo_rdzv_client *c, int min_np, int max_np,
                                      int settle_ms);
/* GET /v1/jobs/{job}: the status document as JSON text; the caller frees it. */
kolo_status_t kolo_rdzv_job_status(struct kolo_rdzv_client *c, char **json);
/* The job's current round and its number of members (0 before the first). */
kolo_status_t kolo_rdzv_job_round(struct kolo_rdzv_client *c, int64_t *round, int *size);
/* The job's min_np, and how many workers are members of its current round
 * and how many wait (spares, joiners). */
kolo_status_t kolo_rdzv_job_sizes(struct kolo_rdzv_client *c, int *min_np, int *members,
                                  int *waiting);
/* The job's hang diagnosis (docs/rendezvous.md, "Diagnosis") as JSON text;
 * the caller frees *json. With request, first asks every worker for a fresh
 * report (POST /diagnosis gives its number N), then GETs ?request=N every
 * 200 ms until "complete" or wait_ms passed, and returns the last answer;
 * without, one GET of what the reports say now. Blocks at most wait_ms plus
 * one request's time (and the retry deadline while the server is down).
 * min_ms >= 0: open entries younger than this are no stall (the server's
 * default otherwise). KOLO_EPROTO (with the server's text) for an unknown
 * job. */
kolo_status_t kolo_rdzv_diagnosis(struct kolo_rdzv_client *c, bool request, int wait_ms, int min_ms,
                                  char **json);

#endif /* KOLO_RENDEZVOUS_H */
