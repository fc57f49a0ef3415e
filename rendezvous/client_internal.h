/* client_internal: what the rendezvous client's files share (the worker's
 * half of docs/rendezvous.md). Internal names take the rdzv_client_ prefix
 * (public ones are kolo_rdzv_): client.c creates and destroys the client,
 * joins, leaves and waits for assignments; client_http.c sends every request
 * (curl handles, retries with back-off, cancellation); client_heartbeat.c
 * runs the heartbeat thread, re-registers the worker after a server restart
 * and puts its KV entries again; client_kv.c holds KV get/put, failure
 * reports and the job status; client_parse.c reads the replies.
 *
 * Locking: kolo_rdzv_client.lock guards the fields below it; reg_lock
 * serialises re-registrations and is taken before lock. */
#ifndef KOLO_RDZV_CLIENT_INTERNAL_H
#define KOLO_RDZV_CLIENT_INTERNAL_H

#include <curl/curl.h>
#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rendezvous.h"

#define RDZV_CLIENT_SUB           "rdzv"
#define RDZV_CLIENT_POLL_MAX_MS   30000 /* longest single long poll */
#define RDZV_CLIENT_POLL_SLACK_MS 10000 /* curl timeout beyond the server-side wait */
#define RDZV_CLIENT_SHORT_REQ_MS  15000 /* curl timeout of a plain request */
#define RDZV_CLIENT_HANDLE_POOL   4
#define RDZV_CLIENT_OWNED_MAX     64 /* KV entries of the held round kept for re-publication */

/* A KV entry this worker put in the round it holds. */
struct rdzv_client_owned {
	char key[KOLO_RDZV_ID_MAX];
	void *val;
	size_t len;
};

struct kolo_rdzv_client {
	char *url; /* without a trailing '/' */
	char *job_esc;
	char *host;
	char zone[KOLO_RDZV_HOST_MAX]; /* "" when none */
	char *auth;                    /* "Authorization: Bearer ..." or NULL */
	int deadline_ms;
	struct kolo_errbuf err;

	pthread_mutex_t lock; /* everything below */
	char worker_id[KOLO_RDZV_ID_MAX];
	bool joined;
	int lease_ms;
	int64_t round; /* held membership, for re-registration */
	int rank;
	uint64_t reg_gen; /* bumped by every (re-)registration */
	/* what kv_put stored while holding owned_round, put again after a
	 * re-registration: the server that lost us lost them too */
	struct rdzv_client_owned owned[RDZV_CLIENT_OWNED_MAX];
	int n_owned;
	int64_t owned_round;
	CURL *pool[RDZV_CLIENT_HANDLE_POOL];
	int n_pool;

	/* heartbeat */
	pthread_mutex_t reg_lock; /* serialises re-registrations */
	pthread_cond_t hb_cond;
	pthread_t hb_thread;
	bool hb_running;
	bool hb_stop;
	int hb_period_ms;
	/* other requests: end a wait when this says so (kolo_rdzv_set_cancel) */
	bool (*cancel)(void *arg);
	void *cancel_arg;
	struct kolo_rdzv_hb_state hb;
	struct kolo_errbuf hb_err;
};

/* One answer: the HTTP status and the body read so far. */
struct rdzv_client_resp {
	long code;
	char *body;
	size_t len, cap;
	bool too_big;
};

/* One request of the client's; path is rebuilt per attempt by a path_fn. */
struct rdzv_client_req {
	const char *method;
	char path[1024];
	const void *body;
	size_t blen;
	const char *ctype;
	long timeout_ms;  /* curl timeout of one attempt */
	bool heartbeat;   /* runs on the heartbeat thread */
	bool worker_path; /* path names this worker: retry after re-registering */
	bool no_rereg;    /* this is the registration itself */
};

/* ---- client_http.c ---- */

/* Initialises libcurl once per process. */
kolo_status_t rdzv_client_curl_init(struct kolo_errbuf *eb);
void rdzv_client_resp_fini(struct rdzv_client_resp *r);
/* A pooled curl handle (NULL without memory), and its return to the pool. */
CURL *rdzv_client_handle_get(struct kolo_rdzv_client *c);
void rdzv_client_handle_put(struct kolo_rdzv_client *c, CURL *h);
/* The server's {"error": "..."} text, or "". */
const char *rdzv_client_error_text(const struct rdzv_client_resp *r, char *buf, size_t size);
/* Waits ms, or less when the heartbeat is told to stop (or, for the
 * caller's requests, when the cancel hook says so). Returns false then. */
bool rdzv_client_backoff_wait(struct kolo_rdzv_client *c, bool heartbeat, int ms);
/* Sends a request, retrying while the server is unreachable or answers 5xx,
 * for up to deadline_ms since the first failure. Returns KOLO_OK with r
 * filled for any other answer (the caller interprets the code), except:
 * 401/403 → KOLO_EAUTH; 410 "unknown worker" on a worker path → re-register
 * and retry; 410 otherwise → KOLO_EMEMBERSHIP. path_fn, when not NULL,
 * rebuilds q->path before each attempt. */
kolo_status_t rdzv_client_request(struct kolo_rdzv_client *c, CURL *h, struct rdzv_client_req *q,
                                  struct rdzv_client_resp *r, struct kolo_errbuf *eb,
                                  char *(*path_fn)(struct kolo_rdzv_client *,
                                                   struct rdzv_client_req *));
/* A plain request on the client's own job; expects one of ok1/ok2. */
kolo_status_t rdzv_client_simple(struct kolo_rdzv_client *c, struct rdzv_client_req *q, long ok1,
                                 long ok2, struct rdzv_client_resp *r);

/* ---- client.c ---- */

bool rdzv_client_is_joined(struct kolo_rdzv_client *c);
/* POST /workers with body (consumed); stores worker_id and lease. */
kolo_status_t rdzv_client_register(struct kolo_rdzv_client *c, CURL *h, bool heartbeat,
                                   json_t *body, struct kolo_errbuf *eb);
/* Rebuilds a worker path with the current worker id (it may change when the
 * server re-registers us under a new one). */
char *rdzv_client_worker_path(struct kolo_rdzv_client *c, struct rdzv_client_req *q,
                              const char *suffix);

/* ---- client_heartbeat.c ---- */

/* Re-registers with the worker id, round and rank held, unless another
 * thread already did since seen_gen. */
kolo_status_t rdzv_client_reregister(struct kolo_rdzv_client *c, CURL *h, bool heartbeat,
                                     uint64_t seen_gen, struct kolo_errbuf *eb);
/* Puts again the KV entries kept for the round this worker holds. */
void rdzv_client_republish(struct kolo_rdzv_client *c, CURL *h, bool heartbeat);

/* ---- client_kv.c ---- */

/* Fills q->path with the KV path of key (escaped) and query. */
kolo_status_t rdzv_client_kv_path(struct kolo_rdzv_client *c, const char *key, const char *query,
                                  struct rdzv_client_req *q);

#endif /* KOLO_RDZV_CLIENT_INTERNAL_H */
