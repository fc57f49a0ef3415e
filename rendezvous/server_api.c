/* server_api: the v1 handlers. Each turns one call into a reply while its
 * caller (server_http.c) holds the server's lock once around it; none talks
 * to libmicrohttpd or takes a lock. The replies are those of
 * docs/rendezvous.md. */
#include "server_internal.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct rdzv_reply rdzv_reply_body(int code, char *body, size_t len, enum rdzv_body_type type)
{
	return (struct rdzv_reply){.code = code, .body = body, .len = len, .type = type};
}

struct rdzv_reply rdzv_reply_json(int code, json_t *o)
{
	char *b = o ? json_dumps(o, JSON_COMPACT) : NULL;
	json_decref(o);
	struct rdzv_reply rep = rdzv_reply_body(code, b, b ? strlen(b) : 0, RDZV_BODY_JSON);
	rep.abort = b == NULL;
	return rep;
}

struct rdzv_reply rdzv_reply_error(int code, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	return rdzv_reply_json(code, json_pack("{s:s}", "error", msg));
}

static struct rdzv_reply reply_empty(int code)
{
	return rdzv_reply_body(code, NULL, 0, RDZV_BODY_JSON);
}

static struct rdzv_reply reply_held(void)
{
	return (struct rdzv_reply){.held = true};
}

/* {"rank","worker_id","host"} of w ("rank" when rank >= 0), and "zone"
 * when it has one. */
static json_t *worker_json(const struct rdzv_worker *w, int rank)
{
	json_t *o = rank >= 0 ? json_pack("{s:i,s:s,s:s}", "rank", rank, "worker_id", w->id, "host",
	                                  w->host)
	                      : json_pack("{s:s,s:s}", "worker_id", w->id, "host", w->host);
	if (o && w->zone[0])
		json_object_set_new(o, "zone", json_string(w->zone));
	return o;
}

static json_t *job_status(const struct rdzv_job *j)
{
	json_t *members = json_array(), *waiting = json_array();
	for (int r = 0; r < j->n_ranks; r++) {
		const struct rdzv_worker *w = j->by_rank[r];
		if (w)
			json_array_append_new(members, worker_json(w, r));
	}
	int n;
	struct rdzv_worker **v = rdzv_job_waiting_workers(j, &n);
	for (int i = 0; v && i < n; i++)
		json_array_append_new(waiting, worker_json(v[i], -1));
	free(v);
	return json_pack("{s:s,s:I,s:s,s:i,s:i,s:i,s:b,s:o,s:o}", "job", j->name, "round",
	                 (json_int_t)j->round, "state", rdzv_job_state_word(j), "min_np",
	                 j->cfg.min_np, "max_np", j->cfg.max_np, "settle_ms", j->cfg.settle_ms,
	                 "pending_change", rdzv_job_pending_change(j), "members", members,
	                 "waiting", waiting);
}

struct rdzv_reply rdzv_api_job(struct kolo_rdzv_server *s, struct rdzv_req *r,
                               const struct rdzv_call *c, uint64_t now)
{
	(void)r;
	bool put = c->method == RDZV_PUT;
	struct rdzv_job *j = rdzv_job_get(&s->st, c->rt.job, put, now);
	if (!j && put)
		return rdzv_reply_error(503, "too many jobs or out of memory");
	if (!j)
		return rdzv_reply_error(404, "unknown job %s", c->rt.job);
	if (put) {
		struct kolo_rdzv_job_config cfg = j->cfg;
		char err[256];
		if (kolo_rdzv_parse_job_config(c->body, c->len, &cfg, err, sizeof(err)) != KOLO_OK)
			return rdzv_reply_error(400, "%s", err);
		j->cfg = cfg;
		KOLO_INFO(RDZV_SUB, "job %s configured: min_np=%d max_np=%d settle_ms=%d", j->name,
		          cfg.min_np, cfg.max_np, cfg.settle_ms);
		rdzv_job_tick(&s->st, j, now);
		rdzv_timer_poke(s, rdzv_job_settle_deadline(j));
	}
	return rdzv_reply_json(200, job_status(j));
}

struct rdzv_reply rdzv_api_join(struct kolo_rdzv_server *s, struct rdzv_req *r,
                                const struct rdzv_call *c, uint64_t now)
{
	(void)r;
	struct kolo_rdzv_join_req jr;
	char err[256];
	if (kolo_rdzv_parse_join(c->body, c->len, &jr, err, sizeof(err)) != KOLO_OK)
		return rdzv_reply_error(400, "%s", err);
	struct rdzv_job *j = rdzv_job_get(&s->st, c->rt.job, true, now);
	if (!j)
		return rdzv_reply_error(503, "too many jobs or out of memory");
	if (!rdzv_job_admits_join(&s->st, j, now))
		return rdzv_reply_error(410, "%s", j->finished_text);
	bool retry;
	struct rdzv_worker *w = rdzv_job_join(&s->st, j, &jr, now, &retry);
	if (!w)
		return rdzv_reply_error(503, "out of memory");
	if (!retry)
		rdzv_timer_poke(s, KOLO_MIN(w->lease_deadline, rdzv_job_settle_deadline(j)));
	return rdzv_reply_json(
	        201, json_pack("{s:s,s:i}", "worker_id", w->id, "lease_ms", s->st.cfg.lease_ms));
}

struct rdzv_reply rdzv_api_heartbeat(struct kolo_rdzv_server *s, struct rdzv_req *r,
                                     const struct rdzv_call *c, uint64_t now)
{
	(void)r;
	char msg[400];
	struct rdzv_job *j = rdzv_job_get(&s->st, c->rt.job, false, now);
	struct rdzv_worker *w = rdzv_job_find_worker(j, c->rt.job, c->rt.id, msg, sizeof(msg));
	if (!w)
		return rdzv_reply_error(410, "%s", msg);
	w->lease_deadline = now + (uint64_t)s->st.cfg.lease_ms;
	return rdzv_reply_json(200, json_pack("{s:I,s:b}", "round", (json_int_t)j->round,
	                                      "pending_change", rdzv_job_pending_change(j)));
}

struct rdzv_reply rdzv_api_leave(struct kolo_rdzv_server *s, struct rdzv_req *r,
                                 const struct rdzv_call *c, uint64_t now)
{
	(void)r;
	if (!c->query_ok)
		return rdzv_reply_error(400, "finished must be 0 or 1");
	struct rdzv_job *j = rdzv_job_get(&s->st, c->rt.job, false, now);
	struct rdzv_worker *w = j ? kolo_strmap_get(&j->workers, c->rt.id) : NULL;
	if (w && c->finished) {
		rdzv_job_finish(&s->st, j, w, now);
	} else if (w) {
		if (j->finished)
			j->finished_ms = now;
		rdzv_job_drop(j, w, "left", false);
		rdzv_job_tick(&s->st, j, now);
		rdzv_timer_poke(s, rdzv_job_settle_deadline(j));
	}
	return reply_empty(204);
}

struct rdzv_reply rdzv_api_failure(struct kolo_rdzv_server *s, struct rdzv_req *r,
                                   const struct rdzv_call *c, uint64_t now)
{
	(void)r;
	struct kolo_rdzv_failure f;
	char err[256];
	if (kolo_rdzv_parse_failure(c->body, c->len, &f, err, sizeof(err)) != KOLO_OK)
		return rdzv_reply_error(400, "%s", err);
	struct rdzv_job *j = rdzv_job_get(&s->st, c->rt.job, false, now);
	/* By id when given: round and rank then only serve older servers. */
	bool acted =
	        j && (f.worker_id[0] ? rdzv_job_report_dead(&s->st, j, f.worker_id, now)
	                             : rdzv_job_report_failure(&s->st, j, f.round, f.rank, now));
	if (acted)
		rdzv_timer_poke(s, rdzv_job_settle_deadline(j));
	else if (f.worker_id[0])
		KOLO_DEBUG(RDZV_SUB, "job %s: report of worker %s, which is gone already",
		           c->rt.job, f.worker_id);
	else
		KOLO_DEBUG(RDZV_SUB, "job %s: stale failure report (round %" PRId64 " rank %d)",
		           c->rt.job, f.round, f.rank);
	return rdzv_reply_json(202, json_pack("{s:b}", "accepted", acted));
}

struct rdzv_reply rdzv_api_assignment(struct kolo_rdzv_server *s, struct rdzv_req *r,
                                      const struct rdzv_call *c, uint64_t now)
{
	if (!c->query_ok)
		return rdzv_reply_error(400,
		                        "after_round must be an integer >= 0 and timeout_ms one in "
		                        "[0, %d]",
		                        RDZV_POLL_MAX_MS);
	char msg[400];
	struct rdzv_job *j = rdzv_job_get(&s->st, c->rt.job, false, now);
	struct rdzv_worker *w = rdzv_job_find_worker(j, c->rt.job, c->rt.id, msg, sizeof(msg));
	if (!w)
		return rdzv_reply_error(410, "%s", msg);
	if (j->finished)
		return rdzv_reply_error(410, "%s", j->finished_text);
	int64_t after = c->after_round;
	w->lease_deadline = now + (uint64_t)s->st.cfg.lease_ms;
	if (!rdzv_job_assignment_ready(j, w, after) && w->rank >= 0 && after >= j->round &&
	    w->commit_round < after) {
		/* A member asking past its round has reached a commit point. */
		w->commit_round = after;
		rdzv_job_tick(&s->st, j, now);
		rdzv_timer_poke(s, rdzv_job_settle_deadline(j));
	}
	if (rdzv_job_assignment_ready(j, w, after)) {
		size_t len = 0;
		char *b = rdzv_job_assignment_body(j, w, &len);
		if (!b)
			return rdzv_reply_error(500, "out of memory");
		return rdzv_reply_body(200, b, len, RDZV_BODY_JSON);
	}
	if (s->stopping)
		return rdzv_reply_error(503, "server shutting down");
	if (c->timeout_ms == 0)
		return reply_empty(204);
	r->worker = w;
	w->n_polls++;
	r->after_round = after;
	rdzv_wait_hold(s, r, j, RDZV_WAIT_ASSIGN, now + (uint64_t)c->timeout_ms);
	return reply_held();
}

/* The 400 of a KV call whose query or body is wrong; code 0 when none. */
static struct rdzv_reply kv_refusal(const struct rdzv_call *c)
{
	struct rdzv_reply none = {0};
	if (c->method == RDZV_GET && !c->query_ok)
		return rdzv_reply_error(400, "timeout_ms must be an integer in [0, %d]",
		                        RDZV_POLL_MAX_MS);
	if (c->method != RDZV_POST)
		return none;
	if (c->add == c->compare_set)
		return rdzv_reply_error(400, "POST takes ?add=N or ?compare_set&expected_len=L");
	if (c->add && !c->query_ok)
		return rdzv_reply_error(400, "add must be a decimal integer within int64");
	if (c->add && c->len > 0)
		return rdzv_reply_error(400, "add takes an empty body (%zu bytes sent)", c->len);
	if (c->compare_set && (!c->query_ok || (size_t)c->expected_len > c->len))
		return rdzv_reply_error(
		        400, "expected_len must be an integer from 0 to %zu (the body's length)",
		        c->len);
	return none;
}

/* 200 with a copy of v. */
static struct rdzv_reply reply_value(const struct rdzv_kv_val *v)
{
	char *b = rdzv_kv_copy(v);
	if (!b)
		return rdzv_reply_error(500, "out of memory");
	return rdzv_reply_body(200, b, v->len, RDZV_BODY_BINARY);
}

static struct rdzv_reply kv_get(struct kolo_rdzv_server *s, struct rdzv_req *r, struct rdzv_job *j,
                                const struct rdzv_call *c, uint64_t now)
{
	const struct rdzv_kv_val *v = kolo_strmap_get(&j->kv, c->rt.id);
	if (v)
		return reply_value(v);
	if (c->timeout_ms == 0 || s->stopping)
		return rdzv_reply_error(404, "no such key %s", c->rt.id);
	snprintf(r->key, sizeof(r->key), "%s", c->rt.id);
	rdzv_wait_hold(s, r, j, RDZV_WAIT_KV, now + (uint64_t)c->timeout_ms);
	return reply_held();
}

static struct rdzv_reply kv_put(struct kolo_rdzv_server *s, struct rdzv_job *j,
                                const struct rdzv_call *c)
{
	if (!rdzv_kv_fits(&s->st, j, c->rt.id, c->len))
		return rdzv_reply_error(507, "KV store full (%zu bytes)", RDZV_KV_TOTAL_MAX);
	if (rdzv_kv_put(&s->st, j, c->rt.id, c->body, c->len) != KOLO_OK)
		return rdzv_reply_error(503, "out of memory");
	return reply_empty(204);
}

/* The answer to an add or a compare_set: the value stored afterwards. */
static struct rdzv_reply kv_post_reply(const struct rdzv_job *j, const struct rdzv_call *c,
                                       enum rdzv_kv_result res)
{
	const char *key = c->rt.id;
	switch (res) {
	case RDZV_KV_STORED:
	case RDZV_KV_KEPT:
		return reply_value(kolo_strmap_get(&j->kv, key));
	case RDZV_KV_ABSENT:
		return rdzv_reply_error(404, "no such key %s", key);
	case RDZV_KV_NOT_INT:
		return rdzv_reply_error(409, "value of key %s is not an integer", key);
	case RDZV_KV_OVERFLOW:
		return rdzv_reply_error(409, "adding %" PRId64 " to key %s overflows int64",
		                        c->add_n, key);
	case RDZV_KV_FULL:
		return rdzv_reply_error(507, "KV store full (%zu bytes)", RDZV_KV_TOTAL_MAX);
	default:
		return rdzv_reply_error(503, "out of memory");
	}
}

/* ?add=N, or ?compare_set with the expected bytes then the desired ones. */
static struct rdzv_reply kv_post(struct kolo_rdzv_server *s, struct rdzv_job *j,
                                 const struct rdzv_call *c)
{
	if (c->add)
		return kv_post_reply(j, c, rdzv_kv_add(&s->st, j, c->rt.id, c->add_n));
	size_t n = (size_t)c->expected_len;
	const char *desired = c->body ? c->body + n : NULL;
	return kv_post_reply(
	        j, c, rdzv_kv_compare_set(&s->st, j, c->rt.id, c->body, n, desired, c->len - n));
}

static struct rdzv_reply kv_delete(struct kolo_rdzv_server *s, struct rdzv_job *j,
                                   const struct rdzv_call *c)
{
	if (!rdzv_kv_delete(&s->st, j, c->rt.id))
		return rdzv_reply_error(404, "no such key %s", c->rt.id);
	return reply_empty(204);
}

struct rdzv_reply rdzv_api_kv(struct kolo_rdzv_server *s, struct rdzv_req *r,
                              const struct rdzv_call *c, uint64_t now)
{
	struct rdzv_reply refusal = kv_refusal(c);
	if (refusal.code)
		return refusal;
	struct rdzv_job *j = rdzv_job_get(&s->st, c->rt.job, true, now);
	if (!j)
		return rdzv_reply_error(503, "too many jobs or out of memory");
	switch (c->method) {
	case RDZV_PUT:
		return kv_put(s, j, c);
	case RDZV_POST:
		return kv_post(s, j, c);
	case RDZV_DELETE:
		return kv_delete(s, j, c);
	default:
		return kv_get(s, r, j, c, now);
	}
}

struct rdzv_reply rdzv_api_kv_store(struct kolo_rdzv_server *s, struct rdzv_req *r,
                                    const struct rdzv_call *c, uint64_t now)
{
	(void)r;
	struct rdzv_job *j = rdzv_job_get(&s->st, c->rt.job, true, now);
	if (!j)
		return rdzv_reply_error(503, "too many jobs or out of memory");
	return rdzv_reply_json(200, json_pack("{s:I}", "num_keys", (json_int_t)rdzv_kv_count(j)));
}
