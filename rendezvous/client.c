/* The rendezvous client: libcurl + jansson, the worker's half of
 * docs/rendezvous.md. This file creates and destroys the client, joins,
 * leaves and rejoins, and waits for assignments; client_internal.h says
 * where the rest lives. */
#include "client_internal.h"
#include "client_parse.h"

#include <curl/curl.h>
#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
	if (cfg->zone && cfg->zone[0] && !kolo_rdzv_valid_host(cfg->zone))
		return kolo_fail(eb, KOLO_EINVAL,
		                 "zone \"%s\" must be empty or 1..%d characters of [A-Za-z0-9._:-]",
		                 cfg->zone, KOLO_RDZV_HOST_MAX - 1);
	KOLO_CHECK(rdzv_client_curl_init(eb));
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
	snprintf(c->zone, sizeof(c->zone), "%s", cfg->zone ? cfg->zone : "");
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

/* ---- join / leave ---------------------------------------------------- */

void kolo_rdzv_set_cancel(struct kolo_rdzv_client *c, bool (*fn)(void *arg), void *arg)
{
	pthread_mutex_lock(&c->lock);
	c->cancel = fn;
	c->cancel_arg = arg;
	pthread_mutex_unlock(&c->lock);
}

bool rdzv_client_is_joined(struct kolo_rdzv_client *c)
{
	pthread_mutex_lock(&c->lock);
	bool j = c->joined;
	pthread_mutex_unlock(&c->lock);
	return j;
}

kolo_status_t rdzv_client_register(struct kolo_rdzv_client *c, CURL *h, bool heartbeat,
                                   json_t *body, struct kolo_errbuf *eb)
{
	if (c->zone[0])
		json_object_set_new(body, "zone", json_string(c->zone));
	char *text = json_dumps(body, JSON_COMPACT);
	json_decref(body);
	if (!text)
		return kolo_fail(eb, KOLO_ENOMEM, "out of memory");
	struct rdzv_client_req q = {.method = "POST",
	                            .body = text,
	                            .blen = strlen(text),
	                            .ctype = "application/json",
	                            .timeout_ms = RDZV_CLIENT_SHORT_REQ_MS,
	                            .heartbeat = heartbeat,
	                            .worker_path = true,
	                            .no_rereg = true};
	snprintf(q.path, sizeof(q.path), "/v1/jobs/%s/workers", c->job_esc);
	struct rdzv_client_resp r = {0};
	char etext[256];
	kolo_status_t st = rdzv_client_request(c, h, &q, &r, eb, NULL);
	free(text);
	if (st != KOLO_OK)
		goto out;
	if (r.code != 201 && r.code != 200) {
		st = kolo_fail(eb, r.code == 400 ? KOLO_EINVAL : KOLO_EPROTO,
		               "rendezvous %s refused the join (%ld): %s", c->url, r.code,
		               rdzv_client_error_text(&r, etext, sizeof(etext)));
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
	rdzv_client_resp_fini(&r);
	return st;
}

kolo_status_t kolo_rdzv_join(struct kolo_rdzv_client *c)
{
	json_t *body = json_pack("{s:s}", "host", c->host);
	if (!body)
		return kolo_fail(&c->err, KOLO_ENOMEM, "out of memory");
	CURL *h = rdzv_client_handle_get(c);
	if (!h) {
		json_decref(body);
		return kolo_fail(&c->err, KOLO_ENOMEM, "curl_easy_init failed");
	}
	kolo_status_t st = rdzv_client_register(c, h, false, body, &c->err);
	rdzv_client_handle_put(c, h);
	if (st == KOLO_OK)
		KOLO_INFO(RDZV_CLIENT_SUB,
		          "joined job at %s as worker %s (host %s%s%s, lease %d ms)", c->url,
		          c->worker_id, c->host, c->zone[0] ? ", zone " : "", c->zone, c->lease_ms);
	return st;
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

static char *leave_path(struct kolo_rdzv_client *c, struct rdzv_client_req *q)
{
	return rdzv_client_worker_path(c, q, "");
}

static char *finish_path(struct kolo_rdzv_client *c, struct rdzv_client_req *q)
{
	return rdzv_client_worker_path(c, q, "?finished=1");
}

static kolo_status_t leave(struct kolo_rdzv_client *c, bool finished)
{
	if (!rdzv_client_is_joined(c))
		return KOLO_OK;
	kolo_rdzv_heartbeat_stop(c);
	CURL *h = rdzv_client_handle_get(c);
	if (!h)
		return kolo_fail(&c->err, KOLO_ENOMEM, "curl_easy_init failed");
	/* A leave after the server forgot us, or after the job finished, is a
	 * success: no re-registration. */
	struct rdzv_client_req q = {.method = "DELETE", .timeout_ms = RDZV_CLIENT_SHORT_REQ_MS};
	struct rdzv_client_resp r = {0};
	char etext[256];
	kolo_status_t st =
	        rdzv_client_request(c, h, &q, &r, &c->err, finished ? finish_path : leave_path);
	if (st == KOLO_EMEMBERSHIP || st == KOLO_ESHUTDOWN)
		st = KOLO_OK;
	else if (st == KOLO_OK && r.code != 204 && r.code != 200 && r.code != 404)
		st = kolo_fail(&c->err, KOLO_EPROTO, "leave: HTTP %ld: %s", r.code,
		               rdzv_client_error_text(&r, etext, sizeof(etext)));
	if (st == KOLO_OK) {
		pthread_mutex_lock(&c->lock);
		c->joined = false;
		pthread_mutex_unlock(&c->lock);
		KOLO_DEBUG(RDZV_CLIENT_SUB, "worker %s left%s", c->worker_id,
		           finished ? " (training complete)" : "");
	}
	rdzv_client_resp_fini(&r);
	rdzv_client_handle_put(c, h);
	return st;
}

kolo_status_t kolo_rdzv_leave(struct kolo_rdzv_client *c)
{
	return leave(c, false);
}

kolo_status_t kolo_rdzv_finish(struct kolo_rdzv_client *c)
{
	return leave(c, true);
}

char *rdzv_client_worker_path(struct kolo_rdzv_client *c, struct rdzv_client_req *q,
                              const char *suffix)
{
	pthread_mutex_lock(&c->lock);
	snprintf(q->path, sizeof(q->path), "/v1/jobs/%s/workers/%s%s", c->job_esc, c->worker_id,
	         suffix);
	pthread_mutex_unlock(&c->lock);
	return q->path;
}

/* ---- assignment ------------------------------------------------------- */

static kolo_status_t parse_assignment(struct kolo_rdzv_client *c, const struct rdzv_client_resp *r,
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
	struct rdzv_client_req q;
	int64_t after;
	int wait_ms;
};

static char *assign_path(struct kolo_rdzv_client *c, struct rdzv_client_req *q)
{
	struct assign_req *a = kolo_container_of(q, struct assign_req, q);
	char suffix[128];
	snprintf(suffix, sizeof(suffix), "/assignment?after_round=%" PRId64 "&timeout_ms=%d",
	         a->after, a->wait_ms);
	return rdzv_client_worker_path(c, q, suffix);
}

kolo_status_t kolo_rdzv_wait_assignment(struct kolo_rdzv_client *c, int64_t after_round,
                                        int timeout_ms, struct kolo_rdzv_assignment *out)
{
	if (!rdzv_client_is_joined(c))
		return kolo_fail(&c->err, KOLO_EINVAL, "wait_assignment before join");
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
		struct assign_req a = {.q = {.method = "GET",
		                             .timeout_ms = left + RDZV_CLIENT_POLL_SLACK_MS,
		                             .worker_path = true},
		                       .after = after_round,
		                       .wait_ms = left};
		st = rdzv_client_request(c, h, &a.q, &r, &c->err, assign_path);
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
		               c->url, r.code, rdzv_client_error_text(&r, etext, sizeof(etext)));
		break;
	}
	rdzv_client_resp_fini(&r);
	rdzv_client_handle_put(c, h);
	return st;
}
