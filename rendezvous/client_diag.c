/* client_diag: asking the server for a hang diagnosis (POST then GET
 * /v1/jobs/{job}/diagnosis, docs/rendezvous.md "Diagnosis"). */
#include "client_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DIAG_POLL_PAUSE_MS 200 /* between GETs while the reports come in */

/* The integer field key of a JSON text, or -1. */
static int64_t body_int(const struct rdzv_client_resp *r, const char *key)
{
	json_t *o = r->body ? json_loadb(r->body, r->len, 0, NULL) : NULL;
	json_t *v = json_object_get(o, key);
	int64_t n = json_is_integer(v) ? json_integer_value(v) : -1;
	json_decref(o);
	return n;
}

static bool body_complete(const char *text)
{
	json_t *o = json_loads(text, 0, NULL);
	bool done = json_is_true(json_object_get(o, "complete"));
	json_decref(o);
	return done;
}

/* POST: the number of the request made. */
static kolo_status_t diag_request(struct kolo_rdzv_client *c, int64_t *n)
{
	struct rdzv_client_req q = {.method = "POST",
	                            .body = "",
	                            .ctype = "application/json",
	                            .timeout_ms = RDZV_CLIENT_SHORT_REQ_MS};
	snprintf(q.path, sizeof(q.path), "/v1/jobs/%s/diagnosis", c->job_esc);
	struct rdzv_client_resp r = {0};
	kolo_status_t st = rdzv_client_simple(c, &q, 201, 200, &r);
	*n = st == KOLO_OK ? body_int(&r, "request") : -1;
	rdzv_client_resp_fini(&r);
	if (st == KOLO_OK && *n < 1)
		st = kolo_fail(&c->err, KOLO_EPROTO,
		               "rendezvous %s: the diagnosis request has no "
		               "request number",
		               c->url);
	return st;
}

/* One GET; *json is the body (malloc'd). */
static kolo_status_t diag_get(struct kolo_rdzv_client *c, int64_t n, int min_ms, char **json)
{
	struct rdzv_client_req q = {.method = "GET", .timeout_ms = RDZV_CLIENT_SHORT_REQ_MS};
	int o = snprintf(q.path, sizeof(q.path), "/v1/jobs/%s/diagnosis", c->job_esc);
	if (n > 0 && o > 0 && (size_t)o < sizeof(q.path))
		o += snprintf(q.path + o, sizeof(q.path) - (size_t)o, "?request=%lld",
		              (long long)n);
	if (min_ms >= 0 && o > 0 && (size_t)o < sizeof(q.path))
		snprintf(q.path + o, sizeof(q.path) - (size_t)o, "%cmin_ms=%d", n > 0 ? '&' : '?',
		         min_ms);
	struct rdzv_client_resp r = {0};
	kolo_status_t st = rdzv_client_simple(c, &q, 200, 200, &r);
	if (st == KOLO_OK) {
		*json = r.body ? r.body : strdup("{}");
		r.body = NULL;
		st = *json ? KOLO_OK : KOLO_ENOMEM;
	}
	rdzv_client_resp_fini(&r);
	return st;
}

kolo_status_t kolo_rdzv_diagnosis(struct kolo_rdzv_client *c, bool request, int wait_ms, int min_ms,
                                  char **json)
{
	*json = NULL;
	int64_t n = 0;
	if (request)
		KOLO_CHECK(diag_request(c, &n));
	uint64_t end = kolo_now_ms() + (uint64_t)KOLO_MAX(wait_ms, 0);
	for (;;) {
		char *body = NULL;
		kolo_status_t st = diag_get(c, n, min_ms, &body);
		if (st != KOLO_OK) {
			free(*json);
			*json = NULL;
			return st;
		}
		free(*json);
		*json = body;
		uint64_t now = kolo_now_ms();
		if (!request || now >= end || body_complete(body))
			return KOLO_OK;
		int pause = (int)KOLO_MIN(end - now, (uint64_t)DIAG_POLL_PAUSE_MS);
		if (!rdzv_client_backoff_wait(c, false, pause))
			return KOLO_OK; /* cancelled: the last answer stands */
	}
}
