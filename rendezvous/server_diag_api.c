/* server_diag_api: POST and GET /v1/jobs/{job}/diagnosis. The POST puts the
 * next diag/request/<n> key into the job's KV (waking the workers' polls on
 * it); the GET reads the diag/report/<rank> keys, joins them with the
 * round's members and hands both to the classifier (server_diag.c). Called
 * with the server's lock held, like every rdzv_api_ handler. */
#include "server_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The number after prefix in key ("diag/report/12" -> 12), or -1. */
static int64_t key_number(const char *key, const char *prefix)
{
	size_t n = strlen(prefix);
	if (strncmp(key, prefix, n) != 0 || key[n] < '0' || key[n] > '9')
		return -1;
	char *end;
	long long v = strtoll(key + n, &end, 10);
	return *end || v < 0 ? -1 : v;
}

/* The newest request made: the largest diag/request/<n>, or the largest
 * gen a report answered (the keys are gone after a server restart, but the
 * workers put their reports back and wait for the request after it). */
static int64_t last_request(const struct rdzv_job *j)
{
	int64_t n = 0;
	KOLO_STRMAP_FOREACH(&j->kv, e)
	{
		n = KOLO_MAX(n, key_number(e->key, RDZV_DIAG_REQUEST_PREFIX));
		if (key_number(e->key, RDZV_DIAG_REPORT_PREFIX) < 0)
			continue;
		const struct rdzv_kv_val *v = e->val;
		json_t *o = json_loadb(v->data, v->len, 0, NULL);
		json_t *gen = json_object_get(o, "gen");
		if (json_is_integer(gen))
			n = KOLO_MAX(n, (int64_t)json_integer_value(gen));
		json_decref(o);
	}
	return n;
}

/* When the newest diag/request/<n> was made (its "time_ms"), 0: none. */
static int64_t last_request_ms(const struct rdzv_job *j)
{
	int64_t best = -1, ms = 0;
	KOLO_STRMAP_FOREACH(&j->kv, e)
	{
		int64_t n = key_number(e->key, RDZV_DIAG_REQUEST_PREFIX);
		if (n <= best)
			continue;
		const struct rdzv_kv_val *v = e->val;
		json_t *o = json_loadb(v->data, v->len, 0, NULL);
		json_t *t = json_object_get(o, "time_ms");
		best = n;
		ms = json_is_integer(t) ? (int64_t)json_integer_value(t) : 0;
		json_decref(o);
	}
	return ms;
}

static struct rdzv_reply diag_request(struct kolo_rdzv_server *s, struct rdzv_job *j)
{
	int64_t n = last_request(j) + 1;
	char key[KOLO_RDZV_ID_MAX], val[96];
	snprintf(key, sizeof(key), RDZV_DIAG_REQUEST_PREFIX "%" PRId64, n);
	int len = snprintf(val, sizeof(val), "{\"request\":%" PRId64 ",\"time_ms\":%" PRIu64 "}", n,
	                   kolo_wall_us() / 1000);
	if (!rdzv_kv_fits(&s->st, j, key, (size_t)len))
		return rdzv_reply_error(507, "KV store full (%zu bytes)", RDZV_KV_TOTAL_MAX);
	if (rdzv_kv_put(&s->st, j, key, val, (size_t)len) != KOLO_OK)
		return rdzv_reply_error(503, "out of memory");
	KOLO_INFO(RDZV_SUB, "job %s: diagnosis request %" PRId64, j->name, n);
	return rdzv_reply_json(201, json_pack("{s:I}", "request", (json_int_t)n));
}

/* The reports in j's KV, parsed; reports[i].rank is -1 for a bad one, whose
 * reason is in errs[i]. */
struct reports {
	struct rdzv_diag_report *v;
	int64_t *key_rank;
	char (*errs)[160];
	int n;
};

static bool reports_load(const struct rdzv_job *j, struct reports *rs)
{
	size_t cap = KOLO_MAX(j->kv.n, (size_t)1);
	rs->v = calloc(cap, sizeof(*rs->v));
	rs->key_rank = calloc(cap, sizeof(*rs->key_rank));
	rs->errs = calloc(cap, sizeof(*rs->errs));
	if (!rs->v || !rs->key_rank || !rs->errs)
		return false;
	KOLO_STRMAP_FOREACH(&j->kv, e)
	{
		int64_t r = key_number(e->key, RDZV_DIAG_REPORT_PREFIX);
		if (r < 0 || r >= RDZV_DIAG_RANKS_MAX || (size_t)rs->n == cap)
			continue;
		const struct rdzv_kv_val *v = e->val;
		rs->key_rank[rs->n] = r;
		if (rdzv_diag_report_parse(v->data, v->len, &rs->v[rs->n], rs->errs[rs->n],
		                           sizeof(rs->errs[0])) == KOLO_ENOMEM)
			return false;
		rs->n++;
	}
	return true;
}

static void reports_free(struct reports *rs)
{
	for (int i = 0; rs->v && i < rs->n; i++)
		rdzv_diag_report_fini(&rs->v[i]);
	free(rs->v);
	free(rs->key_rank);
	free(rs->errs);
}

/* How many ranks the round has: its members, or what its reports say when
 * the server no longer holds them (the job fell back to waiting). */
static int round_size(const struct rdzv_job *j, const struct reports *rs)
{
	int64_t n = j->n_ranks;
	for (int i = 0; i < rs->n; i++) {
		const struct rdzv_diag_report *p = &rs->v[i];
		if (p->rank >= 0 && p->round == j->round)
			n = KOLO_MAX(n, KOLO_MAX((int64_t)p->rank + 1, (int64_t)p->size));
	}
	return (int)KOLO_MIN(n, RDZV_DIAG_RANKS_MAX);
}

/* What the server knows of rank r: its worker, its last request. */
static void member_fill(const struct kolo_rdzv_server *s, const struct rdzv_job *j, int r,
                        uint64_t now, struct rdzv_diag_member *m)
{
	const struct rdzv_worker *w = r < j->n_ranks ? j->by_rank[r] : NULL;
	m->heartbeat_ms = -1;
	if (!w)
		return;
	m->registered = true;
	m->host = w->host;
	m->worker_id = w->id;
	/* A held assignment poll is checked for liveness every second. */
	uint64_t last = w->lease_deadline - (uint64_t)s->st.cfg.lease_ms;
	m->heartbeat_ms = w->n_polls > 0 || now < last ? 0 : (int64_t)(now - last);
}

/* Puts each report at its rank, or says why it is not used. */
static void members_join(const struct rdzv_job *j, struct reports *rs, struct rdzv_diag_member *m,
                         int n, char (*notes)[160])
{
	for (int i = 0; i < rs->n; i++) {
		int64_t r = rs->key_rank[i];
		const struct rdzv_diag_report *p = &rs->v[i];
		if (r >= n)
			continue;
		if (p->rank < 0)
			m[r].ignored = rs->errs[i];
		else if (p->rank != r || p->round != j->round)
			snprintf(notes[r], sizeof(notes[r]),
			         "report of rank %d in round %" PRId64 ", not rank %" PRId64
			         " in round %" PRId64,
			         p->rank, p->round, r, j->round);
		else
			m[r].report = p;
		if (notes[r][0])
			m[r].ignored = notes[r];
		if (!m[r].registered && p->rank >= 0 && p->worker_id[0])
			m[r].gone_why = kolo_strmap_get(&j->evicted, p->worker_id);
	}
}

/* The stragglers of the job's comm, from the "lag" block of the lowest rank's
 * report of this round (every rank computes the same figures): the ranks
 * that submitted last in at least half of the window's collectives, by 1 ms
 * or more on median, as [{"rank","last","ops","p50_ms","p90_ms","max_ms"}]. */
static json_t *stragglers(const struct rdzv_job *j, const struct reports *rs)
{
	json_t *out = json_array(), *best = NULL;
	int64_t best_rank = INT64_MAX;
	for (int i = 0; i < rs->n; i++) /* parsed already: only the chosen one again */
		if (rs->v[i].rank >= 0 && rs->v[i].round == j->round && rs->key_rank[i] < best_rank)
			best_rank = rs->key_rank[i];
	char key[64];
	snprintf(key, sizeof(key), RDZV_DIAG_REPORT_PREFIX "%" PRId64, best_rank);
	const struct rdzv_kv_val *v = best_rank < INT64_MAX ? kolo_strmap_get(&j->kv, key) : NULL;
	if (v)
		best = json_loadb(v->data, v->len, 0, NULL);
	size_t i;
	json_t *c, *lag = NULL;
	json_array_foreach(json_object_get(best, "comms"), i, c)
	{
		if (json_is_string(json_object_get(c, "label")) &&
		    strcmp(json_string_value(json_object_get(c, "label")), "job") == 0)
			lag = json_object_get(c, "lag");
	}
	json_int_t ops = json_integer_value(json_object_get(lag, "ops"));
	json_t *last = json_object_get(lag, "last"), *p50 = json_object_get(lag, "p50_ms");
	json_t *p90 = json_object_get(lag, "p90_ms"), *mx = json_object_get(lag, "max_ms");
	for (size_t r = 0; out && ops > 0 && r < json_array_size(last); r++) {
		json_int_t k = (json_int_t)json_number_value(json_array_get(last, r));
		double med = json_number_value(json_array_get(p50, r));
		if (2 * k >= ops && med >= 1.0)
			json_array_append_new(
			        out, json_pack("{s:I,s:I,s:I,s:f,s:f,s:f}", "rank", (json_int_t)r,
			                       "last", k, "ops", ops, "p50_ms", med, "p90_ms",
			                       json_number_value(json_array_get(p90, r)), "max_ms",
			                       json_number_value(json_array_get(mx, r))));
	}
	json_decref(best);
	return out;
}

static struct rdzv_reply diag_get(struct kolo_rdzv_server *s, struct rdzv_job *j,
                                  const struct rdzv_call *c, uint64_t now)
{
	struct reports rs = {0};
	struct rdzv_diag_member *m = NULL;
	char(*notes)[160] = NULL;
	json_t *doc = NULL;
	if (!reports_load(j, &rs))
		goto out;
	int n = round_size(j, &rs);
	m = calloc((size_t)KOLO_MAX(n, 1), sizeof(*m));
	notes = calloc((size_t)KOLO_MAX(n, 1), sizeof(*notes));
	if (!m || !notes)
		goto out;
	for (int r = 0; r < n; r++)
		member_fill(s, j, r, now, &m[r]);
	members_join(j, &rs, m, n, notes);
	struct rdzv_diag_input in = {
	        .job = j->name,
	        .round = j->round,
	        .request = c->diag_request,
	        .min_ms = c->diag_min_ms,
	        .stale_ms = 2 * (int64_t)s->st.cfg.lease_ms / 3,
	        .now_ms = (int64_t)(kolo_wall_us() / 1000),
	        .request_ms = last_request_ms(j),
	        .m = m,
	        .n = n,
	};
	doc = rdzv_diag_classify(&in);
	if (doc)
		json_object_set_new(doc, "stragglers", stragglers(j, &rs));
out:
	free(notes);
	free(m);
	reports_free(&rs);
	if (!doc)
		return rdzv_reply_error(500, "out of memory");
	return rdzv_reply_json(200, doc);
}

struct rdzv_reply rdzv_api_diagnosis(struct kolo_rdzv_server *s, struct rdzv_req *r,
                                     const struct rdzv_call *c, uint64_t now)
{
	(void)r;
	if (!c->query_ok)
		return rdzv_reply_error(400, "request and min_ms must be integers >= 0");
	struct rdzv_job *j = rdzv_job_get(&s->st, c->rt.job, false, now);
	if (!j)
		return rdzv_reply_error(404, "unknown job %s", c->rt.job);
	if (c->method == RDZV_POST)
		return diag_request(s, j);
	return diag_get(s, j, c, now);
}
