/* server_internal: what the rendezvous server's files share. Internal names
 * take the rdzv_ prefix (public ones are kolo_rdzv_); the second word names
 * the file: rdzv_job_ (server_state.c, server_jobs.c), rdzv_kv_
 * (server_kv.c), rdzv_wait_ (server_wait.c), rdzv_api_ (server_api.c),
 * rdzv_http_ (server_http.c), rdzv_listen_ (server_listen.c), rdzv_metrics_
 * (server_metrics.c), rdzv_timer_ (server.c).
 *
 * Locking: one mutex, kolo_rdzv_server.lock, guards every field below except
 * those marked otherwise. The job state (server_state.c, server_jobs.c,
 * server_kv.c) takes no lock and reads no clock: its callers hold the lock
 * and pass `now` in. A request takes the lock once, in server_http.c, around one
 * rdzv_api_* call, and talks to libmicrohttpd only after releasing it. The
 * exceptions are suspending and resuming a long poll, which must happen
 * under the lock that decided them (else a wake could overtake the suspend).
 * docs/rendezvous.md is the contract. */
#ifndef KOLO_RDZV_SERVER_INTERNAL_H
#define KOLO_RDZV_SERVER_INTERNAL_H

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rendezvous.h"
#include "strmap.h"

#define RDZV_LOST_ZONES 16 /* lost members whose zone a spare is matched to */
#define RDZV_SUB        "rdzv"

/* Limits and periods of the HTTP contract (docs/rendezvous.md). They are
 * part of the protocol, not settings: the settings and their defaults are in
 * core/params.def. */
#define RDZV_POLL_DEFAULT_MS 30000   /* an assignment poll without timeout_ms */
#define RDZV_POLL_MAX_MS     3600000 /* largest timeout_ms */
#define RDZV_EVICTED_MAX     65536   /* eviction records kept per job */
#define RDZV_KV_TOTAL_MAX    ((size_t)512 * 1024 * 1024)
#define RDZV_JOBS_MAX        16384
#define RDZV_WAIT_LOG_MS     5000 /* progress line of a job waiting for workers */
#define RDZV_LIVENESS_MS     1000 /* how often held sockets are checked */
#define RDZV_STOP_GRACE_MS   3000 /* requests in flight may finish this long */
#define RDZV_DROPPED_TEXT    1024 /* the "dropped=[...]" text of one round */

/* ---- job state (server_state.c): no locks, no libmicrohttpd ----------- */

struct rdzv_worker {
	char id[KOLO_RDZV_ID_MAX];
	char host[KOLO_RDZV_HOST_MAX];
	char zone[KOLO_RDZV_HOST_MAX]; /* "" when none */
	uint64_t seq;                  /* join order: smaller is older */
	uint64_t lease_deadline;       /* ms; not checked while n_polls > 0 */
	int n_polls;                   /* assignment long polls held open */
	int rank;                      /* in the current round; -1 when waiting */
	int64_t commit_round;          /* the newest round it polled past as a member */
	struct kolo_rdzv_slot slot;
};

/* A job moves only through rdzv_job_enter (server_state.c):
 *   WAITING  -> RUNNING   a round formed
 *   RUNNING  -> BROKEN    a member was dropped: re-form without settle
 *   RESTORED -> BROKEN    a member was dropped or a rank reported missing
 *   BROKEN   -> RUNNING   re-formed at the next tick
 *   BROKEN   -> WAITING   fewer than min_np workers remain
 *   RESTORED -> RUNNING   every returning member is past it (a fresh round)
 *   any      -> RESTORED  a worker re-registered with a claim on a newer
 *                         round, or in a hole of the current one
 * BROKEN lasts from a drop to the rdzv_job_tick that follows it under the
 * same lock; no request ever sees it (unless forming fails for memory, when
 * the next tick tries again). */
enum rdzv_job_state {
	RDZV_JOB_WAITING,  /* no round stands */
	RDZV_JOB_RUNNING,  /* a round formed here stands */
	RDZV_JOB_RESTORED, /* a round rebuilt from claims after a restart */
	RDZV_JOB_BROKEN,   /* a round lost a member */
};

struct rdzv_job {
	char name[KOLO_RDZV_ID_MAX];
	struct kolo_rdzv_job_config cfg;
	enum rdzv_job_state state;
	struct kolo_strmap workers; /* id -> struct rdzv_worker */
	int n_workers;
	int64_t round;                /* current round number; 0 before the first */
	struct rdzv_worker **by_rank; /* current members; NULL holes in restored rounds */
	int n_ranks;                  /* length of by_rank */
	int n_members;                /* non-NULL entries */
	char *members_json;           /* cached members array of a formed round */
	size_t members_len;
	uint64_t last_join_ms;
	uint64_t last_claim_ms; /* the last re-registration placed in a restored round */
	uint64_t last_wait_log_ms;
	uint64_t next_seq;
	struct kolo_strmap evicted;      /* id -> reason (malloc'd string) */
	char dropped[RDZV_DROPPED_TEXT]; /* who left since the last round, for its log line */
	int n_evicted_since_round;       /* of those, evicted (lease, failure report) */
	/* The zones of the members lost since the last round, one entry per
	 * member: a spare of the same zone takes each place first. */
	char lost_zones[RDZV_LOST_ZONES][KOLO_RDZV_HOST_MAX];
	int n_lost_zones;
	uint64_t last_active_ms;  /* the last request that named the job */
	struct kolo_strmap kv;    /* key -> struct rdzv_kv_val */
	struct rdzv_req *waiters; /* long polls of this job */
	/* A member left saying its training is complete: no round forms any
	 * more, and every worker still registered is told so (410 "job
	 * finished: ..."). Lifted by a join once no worker is left and
	 * lease_ms passed since the last one went (a new run of the job). */
	bool finished;
	uint64_t finished_ms; /* the finish, or the last worker dropped since */
	char finished_text[2 * KOLO_RDZV_ID_MAX + KOLO_RDZV_HOST_MAX + 96];
};

/* Everything rounds and the KV store need; embedded in the server. */
struct rdzv_state {
	struct kolo_rdzv_server_config cfg; /* defaults; listen and token NULL */
	struct kolo_strmap jobs;            /* name -> struct rdzv_job */
	uint64_t rounds_formed;
	size_t kv_keys, kv_bytes;
};

/* The job named, NULL when unknown (and !create) or when it cannot be made
 * (RDZV_JOBS_MAX, memory). Marks it active at now. */
struct rdzv_job *rdzv_job_get(struct rdzv_state *st, const char *name, bool create, uint64_t now);
void rdzv_job_free(void *job);
/* Applies the round-formation rules; may form a round (answering held
 * assignment polls through server_wait.c). */
void rdzv_job_tick(struct rdzv_state *st, struct rdzv_job *j, uint64_t now);
/* When rdzv_job_tick next needs to run for a settle period; UINT64_MAX if
 * never. */
uint64_t rdzv_job_settle_deadline(const struct rdzv_job *j);
/* Workers that joined while the round runs and would fit into the next. */
bool rdzv_job_pending_change(const struct rdzv_job *j);
/* true when w may be answered with the current round. */
bool rdzv_job_assignment_ready(const struct rdzv_job *j, const struct rdzv_worker *w,
                               int64_t after_round);
/* The assignment document of w (malloc'd, *len bytes), NULL without memory. */
char *rdzv_job_assignment_body(const struct rdzv_job *j, const struct rdzv_worker *w, size_t *len);
/* Live workers that hold no rank, oldest first; malloc'd (n_workers long),
 * NULL without memory. *n is how many. */
struct rdzv_worker **rdzv_job_waiting_workers(const struct rdzv_job *j, int *n);
/* A join. A join that names a live worker (a retry) renews its lease and
 * sets *retry. Otherwise registers a new worker, placed at its claimed rank
 * when round > 0 and the claim fits. NULL without memory. */
struct rdzv_worker *rdzv_job_join(struct rdzv_state *st, struct rdzv_job *j,
                                  const struct kolo_rdzv_join_req *jr, uint64_t now, bool *retry);
/* The worker of j with this id; else NULL and, in msg, the 410 text. */
struct rdzv_worker *rdzv_job_find_worker(struct rdzv_job *j, const char *job_name, const char *id,
                                         char *msg, size_t size);
/* Removes a worker: answers its long polls with 410, frees its rank,
 * remembers why. evicted: not a graceful leave. Does not tick. */
void rdzv_job_drop(struct rdzv_job *j, struct rdzv_worker *w, const char *why, bool evicted);
/* w leaves with its training complete: the job is finished (see struct
 * rdzv_job); w and every worker that holds no rank are dropped, their polls
 * answered 410 "job finished: ...". Ticks. */
void rdzv_job_finish(struct rdzv_state *st, struct rdzv_job *j, struct rdzv_worker *w,
                     uint64_t now);
/* A join to a finished job: false while the job stays finished (the 410
 * text is j->finished_text); true when it was lifted or was not set. */
bool rdzv_job_admits_join(struct rdzv_state *st, struct rdzv_job *j, uint64_t now);
/* A failure report for (round, rank); true when it changed the job. */
bool rdzv_job_report_failure(struct rdzv_state *st, struct rdzv_job *j, int64_t round, int rank,
                             uint64_t now);
/* A report that worker id's process died: drops it (a member or a waiting
 * worker) as a lease expiry would, and ticks; false for an id the job does
 * not hold (gone already, or never known). */
bool rdzv_job_report_dead(struct rdzv_state *st, struct rdzv_job *j, const char *id, uint64_t now);
/* Drops the workers whose lease ran out; returns the next lease deadline
 * (UINT64_MAX: none). */
uint64_t rdzv_job_expire_leases(struct rdzv_job *j, uint64_t now);
/* Logs who a waiting job waits for every RDZV_WAIT_LOG_MS; returns when the
 * next line is due (UINT64_MAX: not waiting). */
uint64_t rdzv_job_log_waiting(struct rdzv_job *j, uint64_t now);
/* When an idle job is forgotten, UINT64_MAX if it is not idle. */
uint64_t rdzv_job_retain_deadline(const struct rdzv_state *st, const struct rdzv_job *j);
/* Forgets every job idle for job_retain_ms (configuration, KV, evictions). */
void rdzv_job_sweep(struct rdzv_state *st, uint64_t now);
/* "running", "waiting" or "finished", as the status document says. */
const char *rdzv_job_state_word(const struct rdzv_job *j);

/* ---- the KV store (server_kv.c) ------------------------------------------ */

struct rdzv_kv_val {
	size_t len;
	char data[];
};

/* Whether storing len bytes under key keeps every store within
 * RDZV_KV_TOTAL_MAX. */
bool rdzv_kv_fits(const struct rdzv_state *st, const struct rdzv_job *j, const char *key,
                  size_t len);
/* Stores a copy of data under key and answers the polls waiting for it;
 * KOLO_ENOMEM without memory (nothing changed). */
kolo_status_t rdzv_kv_put(struct rdzv_state *st, struct rdzv_job *j, const char *key,
                          const void *data, size_t len);
/* A malloc'd copy of a value (at least 1 byte allocated). */
char *rdzv_kv_copy(const struct rdzv_kv_val *v);
/* Takes j's keys out of the totals before j is freed. */
void rdzv_kv_forget(struct rdzv_state *st, struct rdzv_job *j);
/* Removes key and takes it out of the totals; false when it was absent. */
bool rdzv_kv_delete(struct rdzv_state *st, struct rdzv_job *j, const char *key);
/* How many keys j's store holds. */
size_t rdzv_kv_count(const struct rdzv_job *j);

/* What an add or a compare-and-set did. Unless RDZV_KV_STORED, nothing
 * changed. */
enum rdzv_kv_result {
	RDZV_KV_STORED,   /* a value was stored (and its polls answered) */
	RDZV_KV_KEPT,     /* compare_set: the value differs from the expected one */
	RDZV_KV_ABSENT,   /* compare_set: no such key, and a non-empty expected value */
	RDZV_KV_NOT_INT,  /* add: the value is not a decimal int64 */
	RDZV_KV_OVERFLOW, /* add: the sum is outside int64 */
	RDZV_KV_FULL,     /* storing would pass RDZV_KV_TOTAL_MAX */
	RDZV_KV_NOMEM,
};

/* torch's TCPStore add: reads the value under key as a decimal int64 ([+-]
 * and digits only; an absent key is 0), adds delta and stores the sum as
 * decimal ASCII through rdzv_kv_put. */
enum rdzv_kv_result rdzv_kv_add(struct rdzv_state *st, struct rdzv_job *j, const char *key,
                                int64_t delta);
/* torch's TCPStore compare_set: stores desired when the value under key
 * equals expected, or when key is absent and exp_len is 0 (through
 * rdzv_kv_put); RDZV_KV_KEPT or RDZV_KV_ABSENT otherwise. */
enum rdzv_kv_result rdzv_kv_compare_set(struct rdzv_state *st, struct rdzv_job *j, const char *key,
                                        const void *expected, size_t exp_len, const void *desired,
                                        size_t des_len);

/* ---- hang diagnosis (server_diag*.c; docs/rendezvous.md "Diagnosis") ---- */

#define RDZV_DIAG_REPORT_PREFIX  "diag/report/"  /* + rank: a worker's flight recorder */
#define RDZV_DIAG_REQUEST_PREFIX "diag/request/" /* + n: the n-th diagnosis request */
#define RDZV_DIAG_MIN_MS_DEFAULT 1000            /* an open entry this old is a stall */
#define RDZV_DIAG_RANKS_MAX      65536

/* An entry's state as a worker's report names it. */
enum rdzv_diag_state {
	RDZV_DIAG_SUBMITTED,
	RDZV_DIAG_NEGOTIATED,
	RDZV_DIAG_DATAPLANE,
	RDZV_DIAG_DONE,
	RDZV_DIAG_FAILED,
	RDZV_DIAG_UNKNOWN,
};

/* One flight-recorder entry. Strings point into the report's JSON; "" when
 * absent. */
struct rdzv_diag_entry {
	const char *name, *op, *status, *error;
	enum rdzv_diag_state state;
	double age_ms; /* since submitted, as of the report's time_ms */
};

/* One communicator of a report ("job", or a process set). */
struct rdzv_diag_comm {
	const char *label, *activity;
	int waiting_on; /* global rank its data plane waits for; -1 none */
	double waiting_ms;
	double waiting_unacked_ms; /* the liveness probe to waiting_on's host; -1: unknown */
	int *members;              /* global ranks; NULL when not given */
	int n_members;
	struct rdzv_diag_entry *entries; /* oldest first */
	int n_entries;
};

/* What a worker saw of another rank's process on its host (/proc). */
enum rdzv_diag_proc { RDZV_PROC_RUNNING, RDZV_PROC_STOPPED, RDZV_PROC_GONE };
struct rdzv_diag_peer {
	int rank;
	enum rdzv_diag_proc state;
};

/* A parsed diag/report/<rank>. Missing fields read as -1 / ""; extra ones
 * are ignored. */
struct rdzv_diag_report {
	json_t *root; /* owns every string below */
	int rank, size;
	int64_t round, gen, time_ms;
	const char *host, *worker_id;
	struct rdzv_diag_comm *comms;
	int n_comms;
	struct rdzv_diag_peer *peers; /* the ranks on its host it could see */
	int n_peers;
};

/* Parses a report (pure). KOLO_EINVAL with the reason in err when it is not
 * JSON, not an object, or lacks an integer rank; out is then empty. */
kolo_status_t rdzv_diag_report_parse(const char *text, size_t len, struct rdzv_diag_report *out,
                                     char *err, size_t errsize);
/* Frees what parse made; accepts a zeroed report. */
void rdzv_diag_report_fini(struct rdzv_diag_report *r);
/* An entry is open while submitted, negotiated or in the data plane. */
bool rdzv_diag_state_open(enum rdzv_diag_state s);

/* One rank of the diagnosed round, as the server knows it. */
struct rdzv_diag_member {
	const char *host, *worker_id;          /* NULL when unknown */
	bool registered;                       /* a member of the round now */
	const char *gone_why;                  /* !registered: why, when known */
	int64_t heartbeat_ms;                  /* since its last request; -1 unknown */
	const struct rdzv_diag_report *report; /* NULL: none usable */
	const char *ignored;                   /* why a report was not used; NULL */
};

/* What the classifier sees: the round's ranks (m[r] is rank r) and the
 * clock. Pure: no server, no lock. */
struct rdzv_diag_input {
	const char *job;
	int64_t round;
	int64_t request;  /* > 0: say whether every live rank answered it */
	int64_t min_ms;   /* open entries younger than this are no stall */
	int64_t stale_ms; /* a heartbeat older than this: not responding */
	int64_t now_ms;   /* wall clock (ms since 1970), to age reports */
	/* When the newest diagnosis request was made (wall clock, ms; 0: none).
	 * A rank that sent no report since a stall began is blamed only once
	 * a request made during the stall has gone unanswered for
	 * RDZV_DIAG_ANSWER_MS (or its heartbeats stopped, or it left): a live
	 * worker with nothing open reports only when asked. */
	int64_t request_ms;
	const struct rdzv_diag_member *m;
	int n;
};

#define RDZV_DIAG_ANSWER_MS 500
/* A wait whose peer's host has left the waiter's liveness probe without an
 * acknowledgement this long (a probe beat is 200 ms; a live path answers in
 * well under one) is on a path that stopped answering or all but stalled. */
#define RDZV_DIAG_UNACKED_MS 200

/* The diagnosis document of docs/rendezvous.md; NULL without memory. */
json_t *rdzv_diag_classify(const struct rdzv_diag_input *in);

/* ---- replies and requests --------------------------------------------- */

enum rdzv_endpoint {
	RDZV_EP_HEALTHZ,
	RDZV_EP_METRICS,
	RDZV_EP_JOB,
	RDZV_EP_WORKERS,
	RDZV_EP_WORKER,
	RDZV_EP_ASSIGNMENT,
	RDZV_EP_HEARTBEAT,
	RDZV_EP_FAILURES,
	RDZV_EP_KV,
	RDZV_EP_KV_STORE,  /* /kv itself: the store as a whole */
	RDZV_EP_DIAGNOSIS, /* counted as "job" in /metrics */
	RDZV_EP_OTHER,
	RDZV_EP_COUNT
};

enum rdzv_body_type { RDZV_BODY_JSON, RDZV_BODY_BINARY, RDZV_BODY_PROMETHEUS };

/* What to answer. Built under the lock, sent after it. */
struct rdzv_reply {
	int code;
	char *body; /* malloc'd, or NULL for none */
	size_t len;
	enum rdzv_body_type type;
	bool held;  /* a long poll was held: nothing to send now */
	bool abort; /* the body could not be made: close the connection */
};

/* {"error": <formatted>}; abort set when out of memory. */
struct rdzv_reply rdzv_reply_error(int code, const char *fmt, ...)
        __attribute__((format(printf, 2, 3)));
/* json_dumps of o (o is taken). */
struct rdzv_reply rdzv_reply_json(int code, json_t *o);
/* A body (taken) of a type; NULL body with code 204 is an empty answer. */
struct rdzv_reply rdzv_reply_body(int code, char *body, size_t len, enum rdzv_body_type type);

/* A parsed URL. */
struct rdzv_route {
	enum rdzv_endpoint ep;
	char job[KOLO_RDZV_ID_MAX];
	char id[KOLO_RDZV_ID_MAX]; /* worker id or KV key */
	bool bad_job, bad_id;
	bool v1;
};

/* The methods a v1 endpoint may allow (server_http.c refuses the others). */
enum rdzv_method { RDZV_GET, RDZV_PUT, RDZV_POST, RDZV_DELETE };

/* One v1 call as the handlers see it: no libmicrohttpd. */
struct rdzv_call {
	struct rdzv_route rt;
	enum rdzv_method method;
	const char *body; /* the request body, NUL-terminated; NULL when empty */
	size_t len;
	bool query_ok; /* the query arguments below parsed and were in range */
	int64_t after_round, timeout_ms;
	int64_t finished; /* a leave: 1 when the worker's training is complete */
	/* a KV POST: whether ?add=N and ?compare_set&expected_len=L were named */
	bool add, compare_set;
	int64_t add_n, expected_len;
	/* a diagnosis GET: ?request=N (0: none) and ?min_ms=M */
	int64_t diag_request, diag_min_ms;
};

enum rdzv_wait_kind { RDZV_WAIT_NONE, RDZV_WAIT_ASSIGN, RDZV_WAIT_KV };

/* One HTTP request; lives from its first header until libmicrohttpd says it
 * completed. */
struct rdzv_req {
	struct kolo_rdzv_server *s;
	struct MHD_Connection *conn;
	enum rdzv_endpoint ep;
	char *body;
	size_t len, cap;
	bool too_large;
	size_t discarded; /* bytes dropped from a body over the limit */
	bool counted;     /* in s->inflight */
	/* a held long poll (server_wait.c) */
	enum rdzv_wait_kind wkind;
	struct rdzv_job *job;
	struct rdzv_worker *worker;
	int64_t after_round;
	char key[KOLO_RDZV_ID_MAX];
	uint64_t deadline;
	int fd;
	struct rdzv_req *wprev, *wnext;
	/* set when it was woken: the reply to send when it re-enters */
	bool ready, gone;
	struct rdzv_reply reply;
};

/* ---- the long-poll registry (server_wait.c) -------------------------- */

/* Holds r open until woken or deadline; suspends its connection. */
void rdzv_wait_hold(struct kolo_rdzv_server *s, struct rdzv_req *r, struct rdzv_job *j,
                    enum rdzv_wait_kind kind, uint64_t deadline);
/* Takes r out of its job's list (no-op when not held). */
void rdzv_wait_unlink(struct rdzv_req *r);
/* Resumes r with a reply (taken). */
void rdzv_wait_wake(struct rdzv_req *r, struct rdzv_reply rep);
/* Answers every assignment poll of j that the current round satisfies. */
void rdzv_wait_wake_assignments(struct rdzv_job *j);
/* Answers w's assignment polls with 410 and msg. */
void rdzv_wait_evict(struct rdzv_job *j, const struct rdzv_worker *w, const char *msg);
/* Answers every assignment poll of a finished job with 410 and its text. */
void rdzv_wait_finish_all(struct rdzv_job *j);
/* Answers the polls of j waiting for key with its value. */
void rdzv_wait_wake_kv(struct rdzv_job *j, const char *key, const struct rdzv_kv_val *v);
/* Answers the polls past their deadline and, when check_sockets, drops
 * those whose client went away. Returns the next deadline (UINT64_MAX:
 * none). */
uint64_t rdzv_wait_expire(struct rdzv_job *j, uint64_t now, bool check_sockets);
/* Answers every held poll with 503 (shutdown). */
void rdzv_wait_close_all(struct kolo_rdzv_server *s);

/* ---- handlers (server_api.c): called with the lock held ---------------- */

typedef struct rdzv_reply rdzv_api_fn(struct kolo_rdzv_server *s, struct rdzv_req *r,
                                      const struct rdzv_call *c, uint64_t now);
rdzv_api_fn rdzv_api_job, rdzv_api_join, rdzv_api_leave, rdzv_api_assignment, rdzv_api_heartbeat,
        rdzv_api_failure, rdzv_api_kv, rdzv_api_kv_store;
/* POST and GET /diagnosis (server_diag_api.c). */
rdzv_api_fn rdzv_api_diagnosis;

/* ---- HTTP (server_http.c, the only file that includes microhttpd.h) --- */

/* Parses a URL into rt (pure). */
void rdzv_http_route(const char *url, struct rdzv_route *rt);
/* server_listen.c: binds listen_addr ("HOST:PORT", port 0 picks one). */
kolo_status_t rdzv_listen_open(const char *listen_addr, int *fd_out, int *port_out,
                               struct kolo_errbuf *eb);
/* Starts the daemon on s->listen_fd and the thread that runs it. */
kolo_status_t rdzv_http_start(struct kolo_rdzv_server *s, struct kolo_errbuf *eb);
/* Stops accepting; lets requests in flight finish (RDZV_STOP_GRACE_MS),
 * stops the thread and the daemon. Accepts a half-started server. */
void rdzv_http_stop(struct kolo_rdzv_server *s);
/* Suspends r's connection and notes its socket (for liveness checks). */
void rdzv_http_suspend(struct rdzv_req *r);
/* Resumes r's connection and wakes the HTTP thread. */
void rdzv_http_resume(struct rdzv_req *r);

/* ---- metrics (server_metrics.c) --------------------------------------- */

#define RDZV_N_CODES 14 /* the status codes counted apart; others count as "other" */

/* Counts an answer; takes the lock. */
void rdzv_metrics_count(struct kolo_rdzv_server *s, enum rdzv_endpoint ep, int code);
/* Counts a refused token; takes the lock. */
void rdzv_metrics_auth_failure(struct kolo_rdzv_server *s);
/* The Prometheus text; with the lock held. */
struct rdzv_reply rdzv_metrics_text(struct kolo_rdzv_server *s);

/* ---- the server (server.c) --------------------------------------------- */

struct kolo_rdzv_server {
	struct rdzv_state st;
	char *token; /* NULL: no authentication; read-only after start */
	struct MHD_Daemon *d;
	int listen_fd;
	int port;
	pthread_mutex_t lock;
	pthread_cond_t cond;      /* wakes the timer */
	pthread_cond_t idle_cond; /* inflight reached 0 */
	pthread_t timer;
	bool timer_started;
	pthread_t http; /* runs the daemon (server_http.c) */
	bool http_started;
	atomic_bool http_stop; /* not under the lock */
	int wake_fd;           /* eventfd: wakes the HTTP thread; read-only after start */
	bool stopping;
	uint64_t timer_next;
	uint64_t last_liveness;
	int inflight;
	int n_polls;
	/* metrics */
	uint64_t requests[RDZV_EP_COUNT][RDZV_N_CODES + 1];
	uint64_t auth_failures;
};

/* Wakes the timer when deadline is earlier than the one it sleeps to. */
void rdzv_timer_poke(struct kolo_rdzv_server *s, uint64_t deadline);

#endif /* KOLO_RDZV_SERVER_INTERNAL_H */
