/* client_kv: the rendezvous client's KV store calls, failure reports and
 * job status. kolo_rdzv_kv_put keeps what a worker puts while holding a
 * round, for client_heartbeat.c to put again after a server restart. */
#include "client_internal.h"
#include "client_parse.h"

#include <curl/curl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OWNED_BYTES 65536 /* largest value kept for re-publication */

/* ---- failures, job configuration -------------------------------------- */

/* POSTs body to the job's failures endpoint. */
static kolo_status_t post_failure(struct kolo_rdzv_client *c, const char *body)
{
	struct rdzv_client_req q = {.method = "POST",
	                            .body = body,
	                            .blen = strlen(body),
	                            .ctype = "application/json",
	                            .timeout_ms = RDZV_CLIENT_SHORT_REQ_MS};
	snprintf(q.path, sizeof(q.path), "/v1/jobs/%s/failures", c->job_esc);
	struct rdzv_client_resp r = {0};
	kolo_status_t st = rdzv_client_simple(c, &q, 202, 200, &r);
	rdzv_client_resp_fini(&r);
	return st;
}

kolo_status_t kolo_rdzv_report_failure(struct kolo_rdzv_client *c, int64_t round, int rank)
{
	char body[96];
	snprintf(body, sizeof(body), "{\"round\":%" PRId64 ",\"rank\":%d}", round, rank);
	kolo_status_t st = post_failure(c, body);
	if (st == KOLO_OK)
		KOLO_INFO(RDZV_CLIENT_SUB, "reported rank %d of round %" PRId64 " as failed", rank,
		          round);
	return st;
}

kolo_status_t kolo_rdzv_report_dead(struct kolo_rdzv_client *c, const char *worker_id,
                                    int64_t round, int rank)
{
	if (!kolo_rdzv_valid_id(worker_id, false))
		return kolo_fail(&c->err, KOLO_EINVAL, "report_dead: invalid worker id");
	char body[KOLO_RDZV_ID_MAX + 96];
	int n = snprintf(body, sizeof(body), "{\"worker_id\":\"%s\"", worker_id);
	if (round > 0 && rank >= 0)
		n += snprintf(body + n, sizeof(body) - (size_t)n,
		              ",\"round\":%" PRId64 ",\"rank\":%d", round, rank);
	snprintf(body + n, sizeof(body) - (size_t)n, "}");
	kolo_status_t st = post_failure(c, body);
	if (st == KOLO_OK)
		KOLO_INFO(RDZV_CLIENT_SUB, "reported worker %s as dead", worker_id);
	return st;
}

kolo_status_t kolo_rdzv_job_configure(struct kolo_rdzv_client *c, int min_np, int max_np,
                                      int settle_ms)
{
	char body[128];
	snprintf(body, sizeof(body), "{\"min_np\":%d,\"max_np\":%d,\"settle_ms\":%d}", min_np,
	         max_np, settle_ms);
	struct rdzv_client_req q = {.method = "PUT",
	                            .body = body,
	                            .blen = strlen(body),
	                            .ctype = "application/json",
	                            .timeout_ms = RDZV_CLIENT_SHORT_REQ_MS};
	snprintf(q.path, sizeof(q.path), "/v1/jobs/%s", c->job_esc);
	struct rdzv_client_resp r = {0};
	kolo_status_t st = rdzv_client_simple(c, &q, 200, 201, &r);
	rdzv_client_resp_fini(&r);
	return st;
}

kolo_status_t kolo_rdzv_job_status(struct kolo_rdzv_client *c, char **json)
{
	*json = NULL;
	struct rdzv_client_req q = {.method = "GET", .timeout_ms = RDZV_CLIENT_SHORT_REQ_MS};
	snprintf(q.path, sizeof(q.path), "/v1/jobs/%s", c->job_esc);
	struct rdzv_client_resp r = {0};
	kolo_status_t st = rdzv_client_simple(c, &q, 200, 200, &r);
	if (st == KOLO_OK) {
		*json = r.body ? r.body : strdup("");
		r.body = NULL;
		if (!*json)
			st = KOLO_ENOMEM;
	}
	rdzv_client_resp_fini(&r);
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

kolo_status_t kolo_rdzv_job_sizes(struct kolo_rdzv_client *c, int *min_np, int *members,
                                  int *waiting)
{
	char *text = NULL;
	kolo_status_t st = kolo_rdzv_job_status(c, &text);
	if (st != KOLO_OK)
		return st;
	bool ok = rdzv_client_parse_job_sizes(text, strlen(text), min_np, members, waiting);
	free(text);
	return ok ? KOLO_OK
	          : kolo_fail(&c->err, KOLO_EPROTO,
	                      "the job status has no min_np, members or waiting workers");
}

/* ---- KV --------------------------------------------------------------- */

kolo_status_t rdzv_client_kv_path(struct kolo_rdzv_client *c, const char *key, const char *query,
                                  struct rdzv_client_req *q)
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
 * finalize report, ...), for rdzv_client_republish(); entries of an older round are
 * dropped. Clients that hold no round (kolorun's, the elastic watcher's)
 * keep nothing: they never re-register. */
static void rdzv_client_remember(struct kolo_rdzv_client *c, const char *key, const void *data,
                                 size_t len)
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
	if (!copy || (i == c->n_owned && i == RDZV_CLIENT_OWNED_MAX)) {
		KOLO_WARN(RDZV_CLIENT_SUB, "KV key %s will not be put again after a server restart",
		          key);
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

kolo_status_t kolo_rdzv_kv_put(struct kolo_rdzv_client *c, const char *key, const void *data,
                               size_t len)
{
	if (len > KOLO_RDZV_MAX_BODY || (!data && len))
		return kolo_fail(&c->err, KOLO_EINVAL, "KV value of %zu bytes (max %d)", len,
		                 KOLO_RDZV_MAX_BODY);
	struct rdzv_client_req q = {.method = "PUT",
	                            .body = data ? data : "",
	                            .blen = len,
	                            .ctype = "application/octet-stream",
	                            .timeout_ms = RDZV_CLIENT_SHORT_REQ_MS};
	KOLO_CHECK(rdzv_client_kv_path(c, key, "", &q));
	struct rdzv_client_resp r = {0};
	kolo_status_t st = rdzv_client_simple(c, &q, 204, 200, &r);
	rdzv_client_resp_fini(&r);
	if (st == KOLO_OK)
		rdzv_client_remember(c, key, data, len);
	return st;
}

kolo_status_t kolo_rdzv_kv_get(struct kolo_rdzv_client *c, const char *key, int timeout_ms,
                               void **data, size_t *len)
{
	*data = NULL;
	*len = 0;
	uint64_t end = timeout_ms < 0 ? UINT64_MAX : kolo_now_ms() + (uint64_t)timeout_ms;
	CURL *h = rdzv_client_handle_get(c);
	if (!h)
		return kolo_fail(&c->err, KOLO_ENOMEM, "curl_easy_init failed");
	struct rdzv_client_resp r = {0};
	char etext[256];
	kolo_status_t st;
	for (;;) {
		uint64_t now = kolo_now_ms();
		int left = now >= end ? 0
		                      : (int)KOLO_MIN(end - now, (uint64_t)RDZV_CLIENT_POLL_MAX_MS);
		char query[48];
		snprintf(query, sizeof(query), "?timeout_ms=%d", left);
		struct rdzv_client_req q = {.method = "GET",
		                            .timeout_ms = left + RDZV_CLIENT_POLL_SLACK_MS};
		st = rdzv_client_kv_path(c, key, query, &q);
		if (st != KOLO_OK)
			break;
		st = rdzv_client_request(c, h, &q, &r, &c->err, NULL);
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
		               q.path, r.code, rdzv_client_error_text(&r, etext, sizeof(etext)));
		break;
	}
	rdzv_client_resp_fini(&r);
	rdzv_client_handle_put(c, h);
	return st;
}
