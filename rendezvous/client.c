/* The rendezvous client: libcurl + jansson, the worker's half of
 * docs/rendezvous.md. Every request goes through request(), which retries
 * with exponential backoff and jitter while the server is unreachable,
 * restarting (connection refused, 5xx) or its name does not resolve yet, and
 * which re-registers the worker when the server answers 410 "unknown worker"
 * (it restarted and lost its soft state) and then puts again the KV entries
 * the worker put in the round it holds (the restart lost them too). */
#include "bytes.h"
#include "client_parse.h"
#include "rendezvous.h"

#include <curl/curl.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SUBSYS         "rdzv"
#define POLL_MAX_MS    30000 /* longest single long poll */
#define POLL_SLACK_MS  10000 /* curl timeout beyond the server-side wait */
#define SHORT_REQ_MS   15000 /* curl timeout of a plain request */
#define CONNECT_MAX_MS 5000  /* curl connect timeout */
#define BACKOFF_MIN_MS 50
#define BACKOFF_MAX_MS 2000
#define HANDLE_POOL    4
#define OWNED_MAX      64    /* KV entries of the held round kept for re-publication */
#define OWNED_BYTES    65536 /* largest value kept */

/* A KV entry this worker put in the round it holds. */
struct owned_kv {
	char key[KOLO_RDZV_ID_MAX];
	void *val;
	size_t len;
};

struct kolo_rdzv_client {
	char *url; /* without a trailing '/' */
	char *job_esc;
	char *host;
	char *auth; /* "Authorization: Bearer ..." or NULL */
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
	struct owned_kv owned[OWNED_MAX];
	int n_owned;
	int64_t owned_round;
	CURL *pool[HANDLE_POOL];
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

/* ---- HTTP plumbing ---------------------------------------------------- */

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc;

static void curl_init_once(void)
{
	kolo_crypto_init(); /* before libcurl initialises OpenSSL its own way */
	curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

struct resp {
	long code;
	char *body;
	size_t len, cap;
	bool too_big;
};

static void resp_fini(struct resp *r)
{
	free(r->body);
	memset(r, 0, sizeof(*r));
}

static size_t on_data(char *ptr, size_t size, size_t nmemb, void *ud)
{
	struct resp *r = ud;
	size_t n = size * nmemb;
	if (r->len + n > KOLO_RDZV_MAX_BODY + 65536) {
		r->too_big = true;
		return 0;
	}
	return kolo_bytes_append(&r->body, &r->len, &r->cap, ptr, n, 0) ? n : 0;
}

struct xfer_ctx {
	struct kolo_rdzv_client *c;
	bool heartbeat; /* abort when the heartbeat is told to stop */
};

/* Whether a wait of the caller's (not the heartbeat's) should end now. */
static bool cancelled(struct kolo_rdzv_client *c)
{
	pthread_mutex_lock(&c->lock);
	bool (*fn)(void *) = c->cancel;
	void *arg = c->cancel_arg;
	pthread_mutex_unlock(&c->lock);
	return fn && fn(arg);
}

/* libcurl calls this at least once a second, also while a long poll idles. */
static int on_progress(void *ud, curl_off_t a, curl_off_t b, curl_off_t d, curl_off_t e)
{
	(void)a, (void)b, (void)d, (void)e;
	struct xfer_ctx *x = ud;
	if (!x->heartbeat)
		return cancelled(x->c) ? 1 : 0;
	pthread_mutex_lock(&x->c->lock);
	bool stop = x->c->hb_stop;
	pthread_mutex_unlock(&x->c->lock);
	return stop ? 1 : 0;
}

static CURL *handle_get(struct kolo_rdzv_client *c)
{
	CURL *h = NULL;
	pthread_mutex_lock(&c->lock);
	if (c->n_pool > 0)
		h = c->pool[--c->n_pool];
	pthread_mutex_unlock(&c->lock);
	return h ? h : curl_easy_init();
}

static void handle_put(struct kolo_rdzv_client *c, CURL *h)
{
	if (!h)
		return;
	pthread_mutex_lock(&c->lock);
	if (c->n_pool < HANDLE_POOL) {
		c->pool[c->n_pool++] = h;
		h = NULL;
	}
	pthread_mutex_unlock(&c->lock);
	if (h)
		curl_easy_cleanup(h);
}

/* One attempt. Returns the curl result; r->code holds the HTTP status. */
static CURLcode http_once(struct kolo_rdzv_client *c, CURL *h, bool heartbeat, const char *method,
                          const char *path, const void *body, size_t blen, const char *ctype,
                          long timeout_ms, struct resp *r)
{
	char url[2048];
	struct curl_slist *hdrs = NULL;
	struct xfer_ctx x = {c, heartbeat};
	resp_fini(r);
	if (kolo_strfmt(url, sizeof(url), "%s%s", c->url, path) != KOLO_OK)
		return CURLE_URL_MALFORMAT;
	curl_easy_reset(h);
	curl_easy_setopt(h, CURLOPT_URL, url);
	curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, timeout_ms);
	curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)KOLO_MIN(timeout_ms, CONNECT_MAX_MS));
	curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
	curl_easy_setopt(h, CURLOPT_WRITEDATA, r);
	curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
	curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, on_progress);
	curl_easy_setopt(h, CURLOPT_XFERINFODATA, &x);
	curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
	/* Never cache a failed or stale resolution: pods appear late and move. */
	curl_easy_setopt(h, CURLOPT_DNS_CACHE_TIMEOUT, 0L);
	if (c->auth)
		hdrs = curl_slist_append(hdrs, c->auth);
	hdrs = curl_slist_append(hdrs, "Expect:");
	if (ctype) {
		char ct[64];
		snprintf(ct, sizeof(ct), "Content-Type: %s", ctype);
		hdrs = curl_slist_append(hdrs, ct);
	}
	curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
	if (strcmp(method, "GET") == 0) {
		curl_easy_setopt(h, CURLOPT_HTTPGET, 1L);
	} else {
		curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
		if (body || strcmp(method, "DELETE") != 0) {
			curl_easy_setopt(h, CURLOPT_POSTFIELDS, body ? (const char *)body : "");
			curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)blen);
		}
	}
	CURLcode cc = curl_easy_perform(h);
	curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r->code);
	curl_slist_free_all(hdrs);
	return cc;
}

/* The server's {"error": "..."} text, or "". */
static const char *error_text(const struct resp *r, char *buf, size_t size)
{
	return rdzv_client_parse_error(r->body, r->len, buf, size);
}

static bool retryable_curl(CURLcode cc)
{
	switch (cc) {
	case CURLE_URL_MALFORMAT:
	case CURLE_UNSUPPORTED_PROTOCOL:
	case CURLE_OUT_OF_MEMORY:
	case CURLE_ABORTED_BY_CALLBACK:
	case CURLE_WRITE_ERROR:
		return false;
	default:
		return true; /* refused, reset, not resolved, timed out, ... */
	}
}

/* Waits ms, or less when the heartbeat is told to stop (or, for the
 * caller's requests, when the cancel hook says so). Returns false then. */
static bool backoff_wait(struct kolo_rdzv_client *c, bool heartbeat, int ms)
{
	if (!heartbeat) {
		for (uint64_t end = kolo_now_ms() + (uint64_t)ms;;) {
			if (cancelled(c))
				return false;
			uint64_t now = kolo_now_ms();
			if (now >= end)
				return true;
			kolo_sleep_ms(KOLO_MIN(end - now, (uint64_t)100));
		}
	}
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	ts.tv_sec += ms / 1000;
	ts.tv_nsec += (long)(ms % 1000) * 1000000L;
	if (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&c->lock);
	while (!c->hb_stop && pthread_cond_timedwait(&c->hb_cond, &c->lock, &ts) != ETIMEDOUT)
		;
	bool go_on = !c->hb_stop;
	pthread_mutex_unlock(&c->lock);
	return go_on;
}

static kolo_status_t reregister(struct kolo_rdzv_client *c, CURL *h, bool heartbeat,
                                uint64_t seen_gen, struct kolo_errbuf *eb);
static void republish(struct kolo_rdzv_client *c, CURL *h, bool heartbeat);

struct req {
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

/* Sends a request, retrying while the server is unreachable or answers 5xx,
 * for up to deadline_ms since the first failure. Returns KOLO_OK with r
 * filled for any other answer (the caller interprets the code), except:
 * 401/403 → KOLO_EAUTH; 410 "unknown worker" on a worker path → re-register
 * and retry; 410 otherwise → KOLO_EMEMBERSHIP. */
static kolo_status_t request(struct kolo_rdzv_client *c, CURL *h, struct req *q, struct resp *r,
                             struct kolo_errbuf *eb,
                             char *(*path_fn)(struct kolo_rdzv_client *, struct req *))
{
	uint64_t first_fail = 0;
	int backoff = BACKOFF_MIN_MS;
	char etext[256];
	for (;;) {
		if (!q->heartbeat && cancelled(c))
			return kolo_fail(eb, KOLO_ESHUTDOWN, "rendezvous %s: %s cancelled", c->url,
			                 q->method);
		pthread_mutex_lock(&c->lock);
		uint64_t gen = c->reg_gen;
		pthread_mutex_unlock(&c->lock);
		if (path_fn)
			path_fn(c, q);
		CURLcode cc = http_once(c, h, q->heartbeat, q->method, q->path, q->body, q->blen,
		                        q->ctype, q->timeout_ms, r);
		char why[300];
		if (cc == CURLE_OK) {
			if (r->code == 401 || r->code == 403)
				return kolo_fail(eb, KOLO_EAUTH,
				                 "rendezvous %s refused %s %s (%ld): %s; check "
				                 "KOLO_TOKEN / KOLO_TOKEN_FILE",
				                 c->url, q->method, q->path, r->code,
				                 error_text(r, etext, sizeof(etext)));
			if (r->code == 410) {
				error_text(r, etext, sizeof(etext));
				if (q->worker_path && !q->no_rereg &&
				    strncmp(etext, "unknown worker", 14) == 0) {
					KOLO_INFO(SUBSYS,
					          "rendezvous %s no longer knows this worker (%s); "
					          "re-registering",
					          c->url, etext);
					KOLO_CHECK(reregister(c, h, q->heartbeat, gen, eb));
					first_fail = 0;
					backoff = BACKOFF_MIN_MS;
					continue;
				}
				return kolo_fail(eb, KOLO_EMEMBERSHIP, "rendezvous %s: %s %s: %s",
				                 c->url, q->method, q->path, etext);
			}
			if (r->code < 500)
				return KOLO_OK;
			snprintf(why, sizeof(why), "HTTP %ld: %s", r->code,
			         error_text(r, etext, sizeof(etext)));
		} else {
			if (!retryable_curl(cc)) {
				if (cc == CURLE_ABORTED_BY_CALLBACK)
					return kolo_fail(eb, KOLO_ESHUTDOWN, "%s",
					                 q->heartbeat ? "heartbeat stopped"
					                              : "cancelled while waiting");
				return kolo_fail(eb, KOLO_ERENDEZVOUS, "rendezvous %s: %s %s: %s",
				                 c->url, q->method, q->path,
				                 curl_easy_strerror(cc));
			}
			snprintf(why, sizeof(why), "%s", curl_easy_strerror(cc));
		}
		uint64_t now = kolo_now_ms();
		if (!first_fail)
			first_fail = now;
		if (now - first_fail >= (uint64_t)c->deadline_ms)
			return kolo_fail(eb, KOLO_ERENDEZVOUS,
			                 "rendezvous server %s unreachable for %d ms (%s %s: %s); "
			                 "check KOLO_RENDEZVOUS",
			                 c->url, c->deadline_ms, q->method, q->path, why);
		int left = (int)((uint64_t)c->deadline_ms - (now - first_fail));
		int wait = backoff / 2 + (int)kolo_random_below((uint64_t)backoff / 2 + 1);
		wait = KOLO_MIN(wait, left);
		KOLO_DEBUG(SUBSYS, "%s %s: %s; retrying in %d ms", q->method, q->path, why, wait);
		if (!backoff_wait(c, q->heartbeat, wait))
			return kolo_fail(eb, KOLO_ESHUTDOWN, "%s",
			                 q->heartbeat ? "heartbeat stopped"
			                              : "cancelled while waiting");
		backoff = KOLO_MIN(backoff * 2, BACKOFF_MAX_MS);
	}
}

/* ---- create / destroy ------------------------------------------------- */

kolo_status_t kolo_rdzv_client_create(const struct kolo_rdzv_client_config *cfg,
                                      struct kolo_rdzv_client **out, struct kolo_errbuf *eb)
{
	*out = NULL;
	if (!cfg || !cfg->url || !cfg->url[0])
		return kolo_fail(eb, KOLO_EINVAL, "no rendezvous URL (set KOLO_RENDEZVOUS)");
	if (!cfg->job || !cfg->job[0] || strlen(cfg->job) >= KOLO_RDZV_ID_MAX)
		return kolo_fail(eb, KOLO_EINVAL, "job id must be 1..%d characters",
		                 KOLO_RDZV_ID_MAX - 1);
	if (!cfg->host || !cfg->host[0] || strlen(cfg->host) >= KOLO_RDZV_HOST_MAX)
		return kolo_fail(eb, KOLO_EINVAL, "host name must be 1..%d characters",
		                 KOLO_RDZV_HOST_MAX - 1);
	pthread_once(&curl_once, curl_init_once);
	if (curl_init_rc != CURLE_OK)
		return kolo_fail(eb, KOLO_ESYSTEM, "curl_global_init: %s",
		                 curl_easy_strerror(curl_init_rc));
	struct kolo_rdzv_client *c = calloc(1, sizeof(*c));
	if (!c)
		return kolo_fail(eb, KOLO_ENOMEM, "out of memory");
	pthread_mutex_init(&c->lock, NULL);
	pthread_mutex_init(&c->reg_lock, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&c->hb_cond, &ca);
	pthread_condattr_destroy(&ca);
	c->deadline_ms = cfg->deadline_ms > 0 ? cfg->deadline_ms : 60000;
	c->rank = -1;
	c->hb.last = KOLO_OK;
	/* Accept "host:port" without a scheme, as pod specs often write it. */
	const char *scheme = strstr(cfg->url, "://") ? "" : "http://";
	size_t ul = strlen(scheme) + strlen(cfg->url) + 1;
	c->url = malloc(ul);
	c->host = strdup(cfg->host);
	CURL *tmp = curl_easy_init();
	if (!c->url || !c->host || !tmp)
		goto nomem;
	snprintf(c->url, ul, "%s%s", scheme, cfg->url);
	while (strlen(c->url) > 0 && c->url[strlen(c->url) - 1] == '/')
		c->url[strlen(c->url) - 1] = '\0';
	char *e = curl_easy_escape(tmp, cfg->job, 0);
	c->job_esc = e ? strdup(e) : NULL;
	curl_free(e);
	c->pool[c->n_pool++] = tmp;
	if (!c->job_esc)
		goto nomem;
	if (cfg->token && cfg->token[0]) {
		size_t n = strlen(cfg->token) + 32;
		c->auth = malloc(n);
		if (!c->auth)
			goto nomem;
		snprintf(c->auth, n, "Authorization: Bearer %s", cfg->token);
	}
	*out = c;
	return KOLO_OK;
nomem:
	kolo_rdzv_client_destroy(c);
	return kolo_fail(eb, KOLO_ENOMEM, "out of memory");
}

void kolo_rdzv_client_destroy(struct kolo_rdzv_client *c)
{
	if (!c)
		return;
	kolo_rdzv_heartbeat_stop(c);
	for (int i = 0; i < c->n_pool; i++)
		curl_easy_cleanup(c->pool[i]);
	for (int i = 0; i < c->n_owned; i++)
		free(c->owned[i].val);
	pthread_cond_destroy(&c->hb_cond);
	pthread_mutex_destroy(&c->reg_lock);
	pthread_mutex_destroy(&c->lock);
	if (c->auth) /* the token is a secret: do not leave it in freed memory */
		memset(c->auth, 0, strlen(c->auth));
	free(c->auth);
	free(c->url);
	free(c->job_esc);
	free(c->host);
	free(c);
}

const char *kolo_rdzv_client_error(const struct kolo_rdzv_client *c)
{
	return c ? c->err.msg : "no client";
}

const char *kolo_rdzv_worker_id(const struct kolo_rdzv_client *c)
{
	return c->worker_id;
}

int kolo_rdzv_lease_ms(const struct kolo_rdzv_client *c)
{
	pthread_mutex_lock((pthread_mutex_t *)&c->lock);
	int l = c->lease_ms;
	pthread_mutex_unlock((pthread_mutex_t *)&c->lock);
	return l;
}

void kolo_rdzv_set_membership(struct kolo_rdzv_client *c, int64_t round, int rank)
{
	pthread_mutex_lock(&c->lock);
	c->round = round;
	c->rank = rank;
	pthread_mutex_unlock(&c->lock);
}

/* ---- join / re-register ----------------------------------------------- */

void kolo_rdzv_set_cancel(struct kolo_rdzv_client *c, bool (*fn)(void *arg), void *arg)
{
	pthread_mutex_lock(&c->lock);
	c->cancel = fn;
	c->cancel_arg = arg;
	pthread_mutex_unlock(&c->lock);
}

static bool is_joined(struct kolo_rdzv_client *c)
{
	pthread_mutex_lock(&c->lock);
	bool j = c->joined;
	pthread_mutex_unlock(&c->lock);
	return j;
}

/* POST /workers with body; stores worker_id and lease. */
static kolo_status_t do_register(struct kolo_rdzv_client *c, CURL *h, bool heartbeat, json_t *body,
                                 struct kolo_errbuf *eb)
{
	char *text = json_dumps(body, JSON_COMPACT);
	json_decref(body);
	if (!text)
		return kolo_fail(eb, KOLO_ENOMEM, "out of memory");
	struct req q = {.method = "POST",
	                .body = text,
	                .blen = strlen(text),
	                .ctype = "application/json",
	                .timeout_ms = SHORT_REQ_MS,
	                .heartbeat = heartbeat,
	                .worker_path = true,
	                .no_rereg = true};
	snprintf(q.path, sizeof(q.path), "/v1/jobs/%s/workers", c->job_esc);
	struct resp r = {0};
	char etext[256];
	kolo_status_t st = request(c, h, &q, &r, eb, NULL);
	free(text);
	if (st != KOLO_OK)
		goto out;
	if (r.code != 201 && r.code != 200) {
		st = kolo_fail(eb, r.code == 400 ? KOLO_EINVAL : KOLO_EPROTO,
		               "rendezvous %s refused the join (%ld): %s", c->url, r.code,
		               error_text(&r, etext, sizeof(etext)));
		goto out;
	}
	char wid[KOLO_RDZV_ID_MAX];
	int lease;
	if (!rdzv_client_parse_join(r.body, r.len, wid, &lease)) {
		st = kolo_fail(eb, KOLO_EPROTO, "rendezvous %s: malformed join response: %.200s",
		               c->url, r.body ? r.body : "");
		goto out;
	}
	pthread_mutex_lock(&c->lock);
	/* Written only when changed: other threads read the id unlocked. */
	if (strcmp(c->worker_id, wid) != 0)
		snprintf(c->worker_id, sizeof(c->worker_id), "%s", wid);
	c->lease_ms = lease;
	c->joined = true;
	c->reg_gen++;
	pthread_mutex_unlock(&c->lock);
out:
	resp_fini(&r);
	return st;
}

kolo_status_t kolo_rdzv_join(struct kolo_rdzv_client *c)
{
	json_t *body = json_pack("{s:s}", "host", c->host);
	if (!body)
		return kolo_fail(&c->err, KOLO_ENOMEM, "out of memory");
	CURL *h = handle_get(c);
	if (!h) {
		json_decref(body);
		return kolo_fail(&c->err, KOLO_ENOMEM, "curl_easy_init failed");
	}
	kolo_status_t st = do_register(c, h, false, body, &c->err);
	handle_put(c, h);
	if (st == KOLO_OK)
		KOLO_INFO(SUBSYS, "joined job at %s as worker %s (host %s, lease %d ms)", c->url,
		          c->worker_id, c->host, c->lease_ms);
	return st;
}

/* Re-registers with the worker id, round and rank held, unless another
 * thread already did since seen_gen. */
static kolo_status_t reregister(struct kolo_rdzv_client *c, CURL *h, bool heartbeat,
                                uint64_t seen_gen, struct kolo_errbuf *eb)
{
	kolo_status_t st = KOLO_OK;
	pthread_mutex_lock(&c->reg_lock);
	pthread_mutex_lock(&c->lock);
	bool done = c->reg_gen != seen_gen;
	char wid[KOLO_RDZV_ID_MAX];
	snprintf(wid, sizeof(wid), "%s", c->worker_id);
	int64_t round = c->round;
	int rank = c->rank;
	pthread_mutex_unlock(&c->lock);
	if (!done) {
		json_t *body =
		        round > 0 && rank >= 0
		                ? json_pack("{s:s,s:s,s:I,s:i}", "host", c->host, "worker_id", wid,
		                            "round", (json_int_t)round, "rank", rank)
		                : json_pack("{s:s,s:s}", "host", c->host, "worker_id", wid);
		if (!body)
			st = kolo_fail(eb, KOLO_ENOMEM, "out of memory");
		else
			st = do_register(c, h, heartbeat, body, eb);
		if (st == KOLO_OK)
			KOLO_INFO(SUBSYS, "re-registered as worker %s (round %" PRId64 ", rank %d)",
			          c->worker_id, round, rank);
		/* Under reg_lock: a request that saw the restart too goes on
		 * once the round's keys are back. */
		if (st == KOLO_OK && round > 0)
			republish(c, h, heartbeat);
	}
	pthread_mutex_unlock(&c->reg_lock);
	return st;
}

/* Rebuilds a worker path with the current worker id (it may change when the
 * server re-registers us under a new one). */
static char *worker_path(struct kolo_rdzv_client *c, struct req *q, const char *suffix)
{
	pthread_mutex_lock(&c->lock);
	snprintf(q->path, sizeof(q->path), "/v1/jobs/%s/workers/%s%s", c->job_esc, c->worker_id,
	         suffix);
	pthread_mutex_unlock(&c->lock);
	return q->path;
}

/* ---- assignment ------------------------------------------------------- */

static kolo_status_t parse_assignment(struct kolo_rdzv_client *c, const struct resp *r,
                                      struct kolo_rdzv_assignment *out, struct kolo_errbuf *eb)
{
	struct kolo_rdzv_assignment a;
	const char *why;
	kolo_status_t st = rdzv_client_parse_assignment(r->body, r->len, &a, &why);
	if (st == KOLO_ENOMEM)
		return kolo_fail(eb, KOLO_ENOMEM, "out of memory");
	if (st == KOLO_OK) {
		pthread_mutex_lock(&c->lock);
		bool mine = strcmp(a.members[a.rank].worker_id, c->worker_id) == 0;
		pthread_mutex_unlock(&c->lock);
		if (mine) {
			kolo_rdzv_assignment_fini(out);
			*out = a;
			return KOLO_OK;
		}
		why = "the member at my rank is another worker";
		kolo_rdzv_assignment_fini(&a);
	}
	return kolo_fail(eb, KOLO_EPROTO, "rendezvous %s: malformed assignment (%s): %.200s",
	                 c->url, why, r->body ? r->body : "");
}

struct assign_req {
	struct req q;
	int64_t after;
	int wait_ms;
};

static char *assign_path(struct kolo_rdzv_client *c, struct req *q)
{
	struct assign_req *a = kolo_container_of(q, struct assign_req, q);
	char suffix[128];
	snprintf(suffix, sizeof(suffix), "/assignment?after_round=%" PRId64 "&timeout_ms=%d",
	         a->after, a->wait_ms);
	return worker_path(c, q, suffix);
}

kolo_status_t kolo_rdzv_wait_assignment(struct kolo_rdzv_client *c, int64_t after_round,
                                        int timeout_ms, struct kolo_rdzv_assignment *out)
{
	if (!is_joined(c))
		return kolo_fail(&c->err, KOLO_EINVAL, "wait_assignment before join");
	uint64_t end = timeout_ms < 0 ? UINT64_MAX : kolo_now_ms() + (uint64_t)timeout_ms;
	CURL *h = handle_get(c);
	if (!h)
		return kolo_fail(&c->err, KOLO_ENOMEM, "curl_easy_init failed");
	struct resp r = {0};
	char etext[256];
	kolo_status_t st;
	for (;;) {
		uint64_t now = kolo_now_ms();
		int left = now >= end ? 0 : (int)KOLO_MIN(end - now, (uint64_t)POLL_MAX_MS);
		struct assign_req a = {.q = {.method = "GET",
		                             .timeout_ms = left + POLL_SLACK_MS,
		                             .worker_path = true},
		                       .after = after_round,
		                       .wait_ms = left};
		st = request(c, h, &a.q, &r, &c->err, assign_path);
		if (st != KOLO_OK)
			break;
		if (r.code == 200) {
			st = parse_assignment(c, &r, out, &c->err);
			if (st == KOLO_OK) {
				if (out->round <= after_round) {
					st = kolo_fail(&c->err, KOLO_EPROTO,
					               "rendezvous answered round %" PRId64
					               " to after_round=%" PRId64,
					               out->round, after_round);
					kolo_rdzv_assignment_fini(out);
					break;
				}
				kolo_rdzv_set_membership(c, out->round, out->rank);
			}
			break;
		}
		if (r.code == 204) {
			if (kolo_now_ms() >= end) {
				st = kolo_fail(&c->err, KOLO_ETIMEDOUT,
				               "no round after %" PRId64
				               " including worker %s within %d ms",
				               after_round, c->worker_id, timeout_ms);
				break;
			}
			continue;
		}
		st = kolo_fail(&c->err, KOLO_EPROTO, "rendezvous %s: assignment: HTTP %ld: %s",
		               c->url, r.code, error_text(&r, etext, sizeof(etext)));
		break;
	}
	resp_fini(&r);
	handle_put(c, h);
	return st;
}

/* ---- heartbeat -------------------------------------------------------- */

static char *hb_path(struct kolo_rdzv_client *c, struct req *q)
{
	return worker_path(c, q, "/heartbeat");
}

static kolo_status_t heartbeat_once(struct kolo_rdzv_client *c, CURL *h)
{
	struct req q = {.method = "POST",
	                .body = "{}",
	                .blen = 2,
	                .ctype = "application/json",
	                .timeout_ms = SHORT_REQ_MS,
	                .heartbeat = true,
	                .worker_path = true};
	struct resp r = {0};
	struct kolo_errbuf eb = {{0}};
	char etext[256];
	kolo_status_t st = request(c, h, &q, &r, &eb, hb_path);
	int64_t round = -1;
	bool pending_change = false;
	if (st == KOLO_OK) {
		if (r.code != 200 ||
		    !rdzv_client_parse_heartbeat(r.body, r.len, &round, &pending_change))
			st = kolo_fail(&eb, KOLO_EPROTO, "heartbeat: HTTP %ld: %s", r.code,
			               error_text(&r, etext, sizeof(etext)));
	}
	pthread_mutex_lock(&c->lock);
	if (st == KOLO_OK) {
		c->hb.round = round;
		c->hb.pending_change = pending_change;
	}
	if (st != KOLO_ESHUTDOWN)
		c->hb.last = st;
	if (st == KOLO_EMEMBERSHIP)
		c->hb.evicted = true;
	if (st != KOLO_OK && st != KOLO_ESHUTDOWN)
		c->hb_err = eb;
	pthread_mutex_unlock(&c->lock);
	resp_fini(&r);
	if (st != KOLO_OK && st != KOLO_ESHUTDOWN)
		KOLO_WARN(SUBSYS, "heartbeat failed: %s", eb.msg);
	return st;
}

static void *hb_main(void *arg)
{
	struct kolo_rdzv_client *c = arg;
	CURL *h = curl_easy_init();
	if (!h) {
		pthread_mutex_lock(&c->lock);
		c->hb.last = KOLO_ENOMEM;
		pthread_mutex_unlock(&c->lock);
		return NULL;
	}
	for (;;) {
		kolo_status_t st = heartbeat_once(c, h);
		if (st == KOLO_EMEMBERSHIP || st == KOLO_ESHUTDOWN)
			break;
		pthread_mutex_lock(&c->lock);
		int period = c->hb_period_ms > 0 ? c->hb_period_ms : KOLO_MAX(c->lease_ms / 3, 10);
		pthread_mutex_unlock(&c->lock);
		if (!backoff_wait(c, true, period))
			break;
	}
	curl_easy_cleanup(h);
	return NULL;
}

kolo_status_t kolo_rdzv_heartbeat_start(struct kolo_rdzv_client *c, int period_ms)
{
	if (!is_joined(c))
		return kolo_fail(&c->err, KOLO_EINVAL, "heartbeat before join");
	if (c->hb_running)
		return KOLO_OK;
	c->hb_period_ms = period_ms;
	c->hb_stop = false;
	int rc = pthread_create(&c->hb_thread, NULL, hb_main, c);
	if (rc != 0)
		return kolo_fail(&c->err, KOLO_ESYSTEM, "pthread_create: %s", strerror(rc));
	c->hb_running = true;
	return KOLO_OK;
}

void kolo_rdzv_heartbeat_stop(struct kolo_rdzv_client *c)
{
	if (!c || !c->hb_running)
		return;
	pthread_mutex_lock(&c->lock);
	c->hb_stop = true;
	pthread_cond_broadcast(&c->hb_cond);
	pthread_mutex_unlock(&c->lock);
	pthread_join(c->hb_thread, NULL);
	c->hb_running = false;
}

void kolo_rdzv_heartbeat_state(struct kolo_rdzv_client *c, struct kolo_rdzv_hb_state *out)
{
	pthread_mutex_lock(&c->lock);
	*out = c->hb;
	pthread_mutex_unlock(&c->lock);
}

kolo_status_t kolo_rdzv_rejoin(struct kolo_rdzv_client *c)
{
	/* The heartbeat thread ended when it saw the eviction. */
	kolo_rdzv_heartbeat_stop(c);
	pthread_mutex_lock(&c->lock);
	c->round = 0;
	c->rank = -1;
	c->hb = (struct kolo_rdzv_hb_state){.last = KOLO_OK};
	int period = c->hb_period_ms;
	pthread_mutex_unlock(&c->lock);
	KOLO_CHECK(kolo_rdzv_join(c));
	return kolo_rdzv_heartbeat_start(c, period);
}

/* ---- leave, failures, job configuration ------------------------------ */

static char *leave_path(struct kolo_rdzv_client *c, struct req *q)
{
	return worker_path(c, q, "");
}

kolo_status_t kolo_rdzv_leave(struct kolo_rdzv_client *c)
{
	if (!is_joined(c))
		return KOLO_OK;
	kolo_rdzv_heartbeat_stop(c);
	CURL *h = handle_get(c);
	if (!h)
		return kolo_fail(&c->err, KOLO_ENOMEM, "curl_easy_init failed");
	/* A leave after the server forgot us is a success: no re-registration. */
	struct req q = {.method = "DELETE", .timeout_ms = SHORT_REQ_MS};
	struct resp r = {0};
	char etext[256];
	kolo_status_t st = request(c, h, &q, &r, &c->err, leave_path);
	if (st == KOLO_EMEMBERSHIP)
		st = KOLO_OK;
	else if (st == KOLO_OK && r.code != 204 && r.code != 200 && r.code != 404)
		st = kolo_fail(&c->err, KOLO_EPROTO, "leave: HTTP %ld: %s", r.code,
		               error_text(&r, etext, sizeof(etext)));
	if (st == KOLO_OK) {
		pthread_mutex_lock(&c->lock);
		c->joined = false;
		pthread_mutex_unlock(&c->lock);
		KOLO_DEBUG(SUBSYS, "worker %s left", c->worker_id);
	}
	resp_fini(&r);
	handle_put(c, h);
	return st;
}

/* A plain request on the client's own job; expects one of ok1/ok2. */
static kolo_status_t simple(struct kolo_rdzv_client *c, struct req *q, long ok1, long ok2,
                            struct resp *r)
{
	CURL *h = handle_get(c);
	if (!h)
		return kolo_fail(&c->err, KOLO_ENOMEM, "curl_easy_init failed");
	char etext[256];
	kolo_status_t st = request(c, h, q, r, &c->err, NULL);
	if (st == KOLO_OK && r->code != ok1 && r->code != ok2)
		st = kolo_fail(&c->err,
		               r->code == 400 || r->code == 413 ? KOLO_EINVAL : KOLO_EPROTO,
		               "rendezvous %s: %s %s: HTTP %ld: %s", c->url, q->method, q->path,
		               r->code, error_text(r, etext, sizeof(etext)));
	handle_put(c, h);
	return st;
}

kolo_status_t kolo_rdzv_report_failure(struct kolo_rdzv_client *c, int64_t round, int rank)
{
	char body[96];
	snprintf(body, sizeof(body), "{\"round\":%" PRId64 ",\"rank\":%d}", round, rank);
	struct req q = {.method = "POST",
	                .body = body,
	                .blen = strlen(body),
	                .ctype = "application/json",
	                .timeout_ms = SHORT_REQ_MS};
	snprintf(q.path, sizeof(q.path), "/v1/jobs/%s/failures", c->job_esc);
	struct resp r = {0};
	kolo_status_t st = simple(c, &q, 202, 200, &r);
	resp_fini(&r);
	if (st == KOLO_OK)
		KOLO_INFO(SUBSYS, "reported rank %d of round %" PRId64 " as failed", rank, round);
	return st;
}

kolo_status_t kolo_rdzv_job_configure(struct kolo_rdzv_client *c, int min_np, int max_np,
                                      int settle_ms)
{
	char body[128];
	snprintf(body, sizeof(body), "{\"min_np\":%d,\"max_np\":%d,\"settle_ms\":%d}", min_np,
	         max_np, settle_ms);
	struct req q = {.method = "PUT",
	                .body = body,
	                .blen = strlen(body),
	                .ctype = "application/json",
	                .timeout_ms = SHORT_REQ_MS};
	snprintf(q.path, sizeof(q.path), "/v1/jobs/%s", c->job_esc);
	struct resp r = {0};
	kolo_status_t st = simple(c, &q, 200, 201, &r);
	resp_fini(&r);
	return st;
}

kolo_status_t kolo_rdzv_job_status(struct kolo_rdzv_client *c, char **json)
{
	*json = NULL;
	struct req q = {.method = "GET", .timeout_ms = SHORT_REQ_MS};
	snprintf(q.path, sizeof(q.path), "/v1/jobs/%s", c->job_esc);
	struct resp r = {0};
	kolo_status_t st = simple(c, &q, 200, 200, &r);
	if (st == KOLO_OK) {
		*json = r.body ? r.body : strdup("");
		r.body = NULL;
		if (!*json)
			st = KOLO_ENOMEM;
	}
	resp_fini(&r);
	return st;
}

kolo_status_t kolo_rdzv_job_round(struct kolo_rdzv_client *c, int64_t *round, int *size)
{
	*round = 0;
	*size = 0;
	char *text = NULL;
	kolo_status_t st = kolo_rdzv_job_status(c, &text);
	if (st != KOLO_OK)
		return st;
	int64_t r = 0;
	int n = 0;
	bool ok = rdzv_client_parse_job_round(text, strlen(text), &r, &n);
	free(text);
	if (!ok)
		return kolo_fail(&c->err, KOLO_EPROTO, "the job status has no round or members");
	*round = r;
	*size = n;
	return KOLO_OK;
}

/* ---- KV --------------------------------------------------------------- */

static kolo_status_t kv_path(struct kolo_rdzv_client *c, const char *key, const char *query,
                             struct req *q)
{
	if (!key || !key[0] || strlen(key) >= KOLO_RDZV_ID_MAX)
		return kolo_fail(&c->err, KOLO_EINVAL, "KV key must be 1..%d characters",
		                 KOLO_RDZV_ID_MAX - 1);
	/* Keys hold '/' ("addr/3/1"): the server takes the rest of the path
	 * as the key, so escape every other reserved character only. */
	char esc[3 * KOLO_RDZV_ID_MAX + 1];
	size_t n = 0;
	for (const char *p = key; *p; p++) {
		unsigned char ch = (unsigned char)*p;
		bool plain = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
		             (ch >= '0' && ch <= '9') || strchr("-._~/", ch);
		if (plain) {
			esc[n++] = (char)ch;
		} else {
			snprintf(esc + n, 4, "%%%02X", ch);
			n += 3;
		}
	}
	esc[n] = '\0';
	if (kolo_strfmt(q->path, sizeof(q->path), "/v1/jobs/%s/kv/%s%s", c->job_esc, esc, query) !=
	    KOLO_OK)
		return kolo_fail(&c->err, KOLO_EINVAL, "KV key too long");
	return KOLO_OK;
}

static void owned_clear(struct kolo_rdzv_client *c)
{
	for (int i = 0; i < c->n_owned; i++)
		free(c->owned[i].val);
	c->n_owned = 0;
}

/* Keeps an entry that a worker put while holding a round (its address, its
 * finalize report, ...), for republish(); entries of an older round are
 * dropped. Clients that hold no round (kolorun's, the elastic watcher's)
 * keep nothing: they never re-register. */
static void remember(struct kolo_rdzv_client *c, const char *key, const void *data, size_t len)
{
	pthread_mutex_lock(&c->lock);
	if (!c->joined || c->round <= 0)
		goto out;
	if (c->owned_round != c->round) {
		owned_clear(c);
		c->owned_round = c->round;
	}
	int i = 0;
	while (i < c->n_owned && strcmp(c->owned[i].key, key) != 0)
		i++;
	void *copy = len <= OWNED_BYTES ? malloc(KOLO_MAX(len, (size_t)1)) : NULL;
	if (!copy || (i == c->n_owned && i == OWNED_MAX)) {
		KOLO_WARN(SUBSYS, "KV key %s will not be put again after a server restart", key);
		free(copy);
		goto out;
	}
	if (len)
		memcpy(copy, data, len);
	if (i == c->n_owned) {
		snprintf(c->owned[i].key, sizeof(c->owned[i].key), "%s", key);
		c->n_owned++;
	} else {
		free(c->owned[i].val);
	}
	c->owned[i].val = copy;
	c->owned[i].len = len;
out:
	pthread_mutex_unlock(&c->lock);
}

/* Puts again the entries remember() kept for the round this worker holds,
 * after a re-registration; on h, the re-registering thread's handle. A
 * failure is logged: the request that re-registered goes on regardless. */
static void republish(struct kolo_rdzv_client *c, CURL *h, bool heartbeat)
{
	struct owned_kv copy[OWNED_MAX];
	int n = 0;
	pthread_mutex_lock(&c->lock);
	if (c->owned_round == c->round) {
		for (; n < c->n_owned; n++) {
			copy[n] = c->owned[n];
			copy[n].val = malloc(KOLO_MAX(copy[n].len, (size_t)1));
			if (!copy[n].val)
				break;
			memcpy(copy[n].val, c->owned[n].val, copy[n].len);
		}
	}
	int64_t round = c->round;
	pthread_mutex_unlock(&c->lock);
	int done = 0;
	for (int i = 0; i < n; i++) {
		struct req q = {.method = "PUT",
		                .body = copy[i].val,
		                .blen = copy[i].len,
		                .ctype = "application/octet-stream",
		                .timeout_ms = SHORT_REQ_MS,
		                .heartbeat = heartbeat};
		struct kolo_errbuf eb = {{0}};
		struct resp r = {0};
		kolo_status_t st = kv_path(c, copy[i].key, "", &q);
		if (st == KOLO_OK)
			st = request(c, h, &q, &r, &eb, NULL);
		if (st == KOLO_OK && (r.code == 204 || r.code == 200))
			done++;
		else
			KOLO_WARN(SUBSYS, "cannot put KV key %s again after the restart: %s",
			          copy[i].key, st == KOLO_OK ? "refused" : eb.msg);
		resp_fini(&r);
		free(copy[i].val);
	}
	if (n > 0)
		KOLO_INFO(SUBSYS, "put %d KV entries of round %" PRId64 " again after a restart",
		          done, round);
}

kolo_status_t kolo_rdzv_kv_put(struct kolo_rdzv_client *c, const char *key, const void *data,
                               size_t len)
{
	if (len > KOLO_RDZV_MAX_BODY || (!data && len))
		return kolo_fail(&c->err, KOLO_EINVAL, "KV value of %zu bytes (max %d)", len,
		                 KOLO_RDZV_MAX_BODY);
	struct req q = {.method = "PUT",
	                .body = data ? data : "",
	                .blen = len,
	                .ctype = "application/octet-stream",
	                .timeout_ms = SHORT_REQ_MS};
	KOLO_CHECK(kv_path(c, key, "", &q));
	struct resp r = {0};
	kolo_status_t st = simple(c, &q, 204, 200, &r);
	resp_fini(&r);
	if (st == KOLO_OK)
		remember(c, key, data, len);
	return st;
}

kolo_status_t kolo_rdzv_kv_get(struct kolo_rdzv_client *c, const char *key, int timeout_ms,
                               void **data, size_t *len)
{
	*data = NULL;
	*len = 0;
	uint64_t end = timeout_ms < 0 ? UINT64_MAX : kolo_now_ms() + (uint64_t)timeout_ms;
	CURL *h = handle_get(c);
	if (!h)
		return kolo_fail(&c->err, KOLO_ENOMEM, "curl_easy_init failed");
	struct resp r = {0};
	char etext[256];
	kolo_status_t st;
	for (;;) {
		uint64_t now = kolo_now_ms();
		int left = now >= end ? 0 : (int)KOLO_MIN(end - now, (uint64_t)POLL_MAX_MS);
		char query[48];
		snprintf(query, sizeof(query), "?timeout_ms=%d", left);
		struct req q = {.method = "GET", .timeout_ms = left + POLL_SLACK_MS};
		st = kv_path(c, key, query, &q);
		if (st != KOLO_OK)
			break;
		st = request(c, h, &q, &r, &c->err, NULL);
		if (st != KOLO_OK)
			break;
		if (r.code == 200) {
			*data = r.body ? r.body : calloc(1, 1);
			*len = r.len;
			r.body = NULL;
			st = *data ? KOLO_OK : KOLO_ENOMEM;
			break;
		}
		if (r.code == 404) {
			if (kolo_now_ms() < end)
				continue;
			st = kolo_fail(&c->err, KOLO_ENOTFOUND,
			               "KV key %s did not appear within %d ms", key, timeout_ms);
			break;
		}
		st = kolo_fail(&c->err, KOLO_EPROTO, "rendezvous %s: GET %s: HTTP %ld: %s", c->url,
		               q.path, r.code, error_text(&r, etext, sizeof(etext)));
		break;
	}
	resp_fini(&r);
	handle_put(c, h);
	return st;
}
