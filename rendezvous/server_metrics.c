/* server_metrics: the counters behind GET /metrics and their Prometheus
 * text (format 0.0.4). */
#include "server_internal.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

static const char *const endpoint_names[RDZV_EP_COUNT] = {
        [RDZV_EP_HEALTHZ] = "healthz",
        [RDZV_EP_METRICS] = "metrics",
        [RDZV_EP_JOB] = "job",
        [RDZV_EP_WORKERS] = "workers",
        [RDZV_EP_WORKER] = "worker",
        [RDZV_EP_ASSIGNMENT] = "assignment",
        [RDZV_EP_HEARTBEAT] = "heartbeat",
        [RDZV_EP_FAILURES] = "failures",
        [RDZV_EP_KV] = "kv",
        [RDZV_EP_KV_STORE] = "kv_store",
        [RDZV_EP_OTHER] = "other",
};

/* Room for the text: the fixed lines, two per job, one per counter. */
#define TEXT_FIXED_BYTES  4096
#define TEXT_JOB_LINE     (KOLO_RDZV_ID_MAX + 64)
#define TEXT_COUNTER_LINE 96

static const int counted_codes[RDZV_N_CODES] = {200, 201, 202, 204, 400, 401, 404,
                                                405, 409, 410, 413, 500, 503, 507};

/* code's column in s->requests; RDZV_N_CODES for "other". */
static int code_column(int code)
{
	for (int i = 0; i < RDZV_N_CODES; i++) {
		if (counted_codes[i] == code)
			return i;
	}
	return RDZV_N_CODES;
}

void rdzv_metrics_count(struct kolo_rdzv_server *s, enum rdzv_endpoint ep, int code)
{
	pthread_mutex_lock(&s->lock);
	s->requests[ep][code_column(code)]++;
	pthread_mutex_unlock(&s->lock);
}

void rdzv_metrics_auth_failure(struct kolo_rdzv_server *s)
{
	pthread_mutex_lock(&s->lock);
	s->auth_failures++;
	pthread_mutex_unlock(&s->lock);
}

/* A bounded text buffer: writes past cap are counted, not made. */
struct text {
	char *b;
	size_t o, cap;
};

static void text_add(struct text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void text_add(struct text *t, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(t->b + KOLO_MIN(t->o, t->cap), t->o < t->cap ? t->cap - t->o : 0, fmt,
	                  ap);
	va_end(ap);
	t->o += (size_t)n;
}

static void text_jobs(struct text *t, const struct rdzv_state *st)
{
	text_add(t, "# HELP kolo_rdzv_workers Workers registered in the job.\n"
	            "# TYPE kolo_rdzv_workers gauge\n");
	KOLO_STRMAP_FOREACH(&st->jobs, e)
	{
		const struct rdzv_job *j = e->val;
		text_add(t, "kolo_rdzv_workers{job=\"%s\"} %d\n", j->name, j->n_workers);
	}
	text_add(t, "# HELP kolo_rdzv_round The job's current round.\n"
	            "# TYPE kolo_rdzv_round gauge\n");
	KOLO_STRMAP_FOREACH(&st->jobs, e)
	{
		const struct rdzv_job *j = e->val;
		text_add(t, "kolo_rdzv_round{job=\"%s\"} %" PRId64 "\n", j->name, j->round);
	}
	text_add(t,
	         "# HELP kolo_rdzv_rounds_formed_total Rounds formed since start.\n"
	         "# TYPE kolo_rdzv_rounds_formed_total counter\n"
	         "kolo_rdzv_rounds_formed_total %" PRIu64 "\n",
	         st->rounds_formed);
}

static void text_requests(struct text *t, const struct kolo_rdzv_server *s)
{
	text_add(t, "# HELP kolo_rdzv_requests_total Requests answered, by endpoint and status "
	            "code.\n"
	            "# TYPE kolo_rdzv_requests_total counter\n");
	for (int ep = 0; ep < RDZV_EP_COUNT; ep++) {
		for (int c = 0; c <= RDZV_N_CODES; c++) {
			if (!s->requests[ep][c])
				continue;
			char code[8];
			if (c < RDZV_N_CODES)
				snprintf(code, sizeof(code), "%d", counted_codes[c]);
			else
				snprintf(code, sizeof(code), "other");
			text_add(t,
			         "kolo_rdzv_requests_total{endpoint=\"%s\",code=\"%s\"} %" PRIu64
			         "\n",
			         endpoint_names[ep], code, s->requests[ep][c]);
		}
	}
}

static void text_totals(struct text *t, const struct kolo_rdzv_server *s)
{
	text_add(t,
	         "# HELP kolo_rdzv_kv_keys Keys in the KV store.\n# TYPE kolo_rdzv_kv_keys gauge\n"
	         "kolo_rdzv_kv_keys %zu\n"
	         "# HELP kolo_rdzv_kv_bytes Bytes of values in the KV store.\n"
	         "# TYPE kolo_rdzv_kv_bytes gauge\nkolo_rdzv_kv_bytes %zu\n",
	         s->st.kv_keys, s->st.kv_bytes);
	text_add(t,
	         "# HELP kolo_rdzv_auth_failures_total Requests refused for a missing or wrong "
	         "token.\n"
	         "# TYPE kolo_rdzv_auth_failures_total counter\n"
	         "kolo_rdzv_auth_failures_total %" PRIu64 "\n",
	         s->auth_failures);
	text_add(t,
	         "# HELP kolo_rdzv_long_polls Requests held open now.\n"
	         "# TYPE kolo_rdzv_long_polls gauge\nkolo_rdzv_long_polls %d\n",
	         s->n_polls);
}

struct rdzv_reply rdzv_metrics_text(struct kolo_rdzv_server *s)
{
	struct text t = {.cap = TEXT_FIXED_BYTES + s->st.jobs.n * 2 * TEXT_JOB_LINE +
	                        RDZV_EP_COUNT * RDZV_N_CODES * TEXT_COUNTER_LINE};
	t.b = malloc(t.cap);
	if (!t.b)
		return rdzv_reply_error(500, "out of memory");
	text_jobs(&t, &s->st);
	text_requests(&t, s);
	text_totals(&t, s);
	if (t.o >= t.cap)
		t.o = t.cap - 1;
	return rdzv_reply_body(200, t.b, t.o, RDZV_BODY_PROMETHEUS);
}
