/* client_http: the rendezvous client's request machinery. Every request
 * goes through rdzv_client_request(), which retries with exponential backoff
 * and jitter while the server is unreachable, restarting (connection
 * refused, 5xx) or its name does not resolve yet, which re-registers the
 * worker when the server answers 410 "unknown worker" (it restarted and lost
 * its soft state; client_heartbeat.c), and which ends a wait early when the
 * caller's cancel hook or the heartbeat's stop says so. */
#include "bytes.h"
#include "client_internal.h"
#include "client_parse.h"

#include <curl/curl.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CONNECT_MAX_MS 5000 /* curl connect timeout */
#define BACKOFF_MIN_MS 50
#define BACKOFF_MAX_MS 2000

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc;

static void curl_init_once(void)
{
	kolo_crypto_init(); /* before libcurl initialises OpenSSL its own way */
	curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

kolo_status_t rdzv_client_curl_init(struct kolo_errbuf *eb)
{
	pthread_once(&curl_once, curl_init_once);
	if (curl_init_rc != CURLE_OK)
		return kolo_fail(eb, KOLO_ESYSTEM, "curl_global_init: %s",
		                 curl_easy_strerror(curl_init_rc));
	return KOLO_OK;
}

kolo_status_t kolo_rdzv_http_init(struct kolo_errbuf *eb)
{
	return rdzv_client_curl_init(eb);
}

void rdzv_client_resp_fini(struct rdzv_client_resp *r)
{
	free(r->body);
	memset(r, 0, sizeof(*r));
}

static size_t on_data(char *ptr, size_t size, size_t nmemb, void *ud)
{
	struct rdzv_client_resp *r = ud;
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

CURL *rdzv_client_handle_get(struct kolo_rdzv_client *c)
{
	CURL *h = NULL;
	pthread_mutex_lock(&c->lock);
	if (c->n_pool > 0)
		h = c->pool[--c->n_pool];
	pthread_mutex_unlock(&c->lock);
	return h ? h : curl_easy_init();
}

void rdzv_client_handle_put(struct kolo_rdzv_client *c, CURL *h)
{
	if (!h)
		return;
	pthread_mutex_lock(&c->lock);
	if (c->n_pool < RDZV_CLIENT_HANDLE_POOL) {
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
                          long timeout_ms, struct rdzv_client_resp *r)
{
	char url[2048];
	struct curl_slist *hdrs = NULL;
	struct xfer_ctx x = {c, heartbeat};
	rdzv_client_resp_fini(r);
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

const char *rdzv_client_error_text(const struct rdzv_client_resp *r, char *buf, size_t size)
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

bool rdzv_client_backoff_wait(struct kolo_rdzv_client *c, bool heartbeat, int ms)
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

/* What one attempt's outcome asks of rdzv_client_request(). */
enum verdict {
	V_DONE,  /* return *st (KOLO_OK: r holds an answer for the caller) */
	V_REREG, /* the server forgot this worker: re-register, then retry */
	V_RETRY, /* unreachable or 5xx: back off and retry; why says what */
};

static enum verdict judge(struct kolo_rdzv_client *c, const struct rdzv_client_req *q, CURLcode cc,
                          const struct rdzv_client_resp *r, char *why, size_t why_size,
                          kolo_status_t *st, struct kolo_errbuf *eb)
{
	char etext[256];
	if (cc == CURLE_OK) {
		if (r->code == 401 || r->code == 403) {
			*st = kolo_fail(eb, KOLO_EAUTH,
			                "rendezvous %s refused %s %s (%ld): %s; check "
			                "KOLO_TOKEN / KOLO_TOKEN_FILE",
			                c->url, q->method, q->path, r->code,
			                rdzv_client_error_text(r, etext, sizeof(etext)));
			return V_DONE;
		}
		if (r->code == 410) {
			rdzv_client_error_text(r, etext, sizeof(etext));
			if (q->worker_path && !q->no_rereg &&
			    strncmp(etext, "unknown worker", 14) == 0) {
				KOLO_INFO(RDZV_CLIENT_SUB,
				          "rendezvous %s no longer knows this worker (%s); "
				          "re-registering",
				          c->url, etext);
				return V_REREG;
			}
			/* A member completed its training: the job is over, and
			 * this worker leaves it as if it had been asked to. */
			if (strncmp(etext, "job finished", 12) == 0)
				*st = kolo_fail(eb, KOLO_ESHUTDOWN, "%s (rendezvous %s)", etext,
				                c->url);
			else
				*st = kolo_fail(eb, KOLO_EMEMBERSHIP, "rendezvous %s: %s %s: %s",
				                c->url, q->method, q->path, etext);
			return V_DONE;
		}
		if (r->code < 500) {
			*st = KOLO_OK;
			return V_DONE;
		}
		snprintf(why, why_size, "HTTP %ld: %s", r->code,
		         rdzv_client_error_text(r, etext, sizeof(etext)));
		return V_RETRY;
	}
	if (!retryable_curl(cc)) {
		if (cc == CURLE_ABORTED_BY_CALLBACK)
			*st = kolo_fail(eb, KOLO_ESHUTDOWN, "%s",
			                q->heartbeat ? "heartbeat stopped"
			                             : "cancelled while waiting");
		else
			*st = kolo_fail(eb, KOLO_ERENDEZVOUS, "rendezvous %s: %s %s: %s", c->url,
			                q->method, q->path, curl_easy_strerror(cc));
		return V_DONE;
	}
	snprintf(why, why_size, "%s", curl_easy_strerror(cc));
	return V_RETRY;
}

kolo_status_t rdzv_client_request(struct kolo_rdzv_client *c, CURL *h, struct rdzv_client_req *q,
                                  struct rdzv_client_resp *r, struct kolo_errbuf *eb,
                                  char *(*path_fn)(struct kolo_rdzv_client *,
                                                   struct rdzv_client_req *))
{
	uint64_t first_fail = 0;
	int backoff = BACKOFF_MIN_MS;
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
		kolo_status_t st = KOLO_OK;
		enum verdict v = judge(c, q, cc, r, why, sizeof(why), &st, eb);
		if (v == V_DONE)
			return st;
		if (v == V_REREG) {
			KOLO_CHECK(rdzv_client_reregister(c, h, q->heartbeat, gen, eb));
			first_fail = 0;
			backoff = BACKOFF_MIN_MS;
			continue;
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
		KOLO_DEBUG(RDZV_CLIENT_SUB, "%s %s: %s; retrying in %d ms", q->method, q->path, why,
		           wait);
		if (!rdzv_client_backoff_wait(c, q->heartbeat, wait))
			return kolo_fail(eb, KOLO_ESHUTDOWN, "%s",
			                 q->heartbeat ? "heartbeat stopped"
			                              : "cancelled while waiting");
		backoff = KOLO_MIN(backoff * 2, BACKOFF_MAX_MS);
	}
}

kolo_status_t rdzv_client_simple(struct kolo_rdzv_client *c, struct rdzv_client_req *q, long ok1,
                                 long ok2, struct rdzv_client_resp *r)
{
	CURL *h = rdzv_client_handle_get(c);
	if (!h)
		return kolo_fail(&c->err, KOLO_ENOMEM, "curl_easy_init failed");
	char etext[256];
	kolo_status_t st = rdzv_client_request(c, h, q, r, &c->err, NULL);
	if (st == KOLO_OK && r->code != ok1 && r->code != ok2)
		st = kolo_fail(&c->err,
		               r->code == 400 || r->code == 413 ? KOLO_EINVAL : KOLO_EPROTO,
		               "rendezvous %s: %s %s: HTTP %ld: %s", c->url, q->method, q->path,
		               r->code, rdzv_client_error_text(r, etext, sizeof(etext)));
	rdzv_client_handle_put(c, h);
	return st;
}
