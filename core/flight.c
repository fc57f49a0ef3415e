/* flight: the flight recorder's buffer, the process's list of recorders and
 * their JSON snapshot (flight.h). */
#include "flight.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kolo/kolo.h"
#include "metrics.h"

#define ERR_MAX 240

struct fl_entry {
	uint64_t seq, cseq, bytes;
	uint64_t number;             /* with name "": the entry is named "<op>.<number>" */
	uint64_t t[KOLO_FL_NSTATES]; /* entry_now() on entering each state; 0: not yet */
	const char *op;
	int dtype;
	kolo_status_t st;
	enum kolo_flight_state state;
	char name[KOLO_FLIGHT_NAME_MAX];
	char err[ERR_MAX];
};

struct kolo_flight {
	struct kolo_flight *next; /* in the registry */
	pthread_mutex_t lock;
	char label[32];
	int rank, size;
	int *members;
	uint64_t next_seq, next_cseq;
	atomic_int activity;
	atomic_int wait_peer;
	atomic_uint_least64_t wait_since;
	atomic_int wait_unacked_ms; /* the probe to wait_peer's host; -1: unknown */
	struct fl_entry e[KOLO_FLIGHT_ENTRIES];
	/* arrival lags: lag_ms[op * lag_n + r] (-1: took no part), last[op]: the
	 * rank that arrived last (-1: none); nlag collectives recorded */
	float *lag_ms;
	int *last;
	int lag_n;
	uint64_t nlag;
	double *lag_sum; /* [lag_n]: each rank's lags summed since lag_n was set */
};

static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static struct kolo_flight *reg_head;

static const char *const state_names[] = {"submitted", "negotiated", "dataplane", "done", "failed"};
static const char *const activity_names[] = {"idle", "negotiating", "executing", "blocking"};

const char *kolo_flight_state_name(enum kolo_flight_state s)
{
	return (unsigned)s < KOLO_FL_NSTATES ? state_names[s] : "?";
}

static void set_members(struct kolo_flight *f, int rank, int size, const int *members)
{
	int *m = size > 0 ? malloc((size_t)size * sizeof(*m)) : NULL;
	for (int i = 0; m && i < size; i++)
		m[i] = members ? members[i] : i;
	free(f->members);
	f->members = m;
	f->rank = rank;
	f->size = m ? size : 0;
}

struct kolo_flight *kolo_flight_create(const char *label, int rank, int size, const int *members)
{
	struct kolo_flight *f = calloc(1, sizeof(*f));
	if (!f)
		return NULL;
	pthread_mutex_init(&f->lock, NULL);
	snprintf(f->label, sizeof(f->label), "%s", label);
	set_members(f, rank, size, members);
	f->next_seq = f->next_cseq = 1;
	atomic_init(&f->activity, KOLO_FA_IDLE);
	atomic_init(&f->wait_peer, -1);
	atomic_init(&f->wait_since, 0);
	atomic_init(&f->wait_unacked_ms, -1);
	pthread_mutex_lock(&reg_lock);
	f->next = reg_head;
	reg_head = f;
	pthread_mutex_unlock(&reg_lock);
	return f;
}

void kolo_flight_destroy(struct kolo_flight *f)
{
	if (!f)
		return;
	pthread_mutex_lock(&reg_lock);
	for (struct kolo_flight **pp = &reg_head; *pp; pp = &(*pp)->next)
		if (*pp == f) {
			*pp = f->next;
			break;
		}
	pthread_mutex_unlock(&reg_lock);
	pthread_mutex_destroy(&f->lock);
	free(f->members);
	free(f->lag_ms);
	free(f->last);
	free(f->lag_sum);
	free(f);
}

void kolo_flight_reset_members(struct kolo_flight *f, const char *label, int rank, int size,
                               const int *members)
{
	if (!f)
		return;
	pthread_mutex_lock(&f->lock);
	if (label)
		snprintf(f->label, sizeof(f->label), "%s", label);
	set_members(f, rank, size, members);
	pthread_mutex_unlock(&f->lock);
}

/* A new entry in state submitted. f->lock held. */
static struct fl_entry *entry_new(struct kolo_flight *f, const char *op, int dtype, uint64_t bytes,
                                  uint64_t now)
{
	uint64_t seq = f->next_seq++;
	struct fl_entry *e = &f->e[seq % KOLO_FLIGHT_ENTRIES];
	e->seq = seq;
	e->cseq = e->number = 0;
	e->bytes = bytes;
	memset(e->t, 0, sizeof(e->t));
	e->t[KOLO_FL_SUBMITTED] = now;
	e->op = op;
	e->dtype = dtype;
	e->st = KOLO_OK;
	e->state = KOLO_FL_SUBMITTED;
	e->name[0] = e->err[0] = '\0';
	return e;
}

/* The entries' clock: the monotonic clock at the kernel's last tick (1-4 ms
 * behind kolo_now_ns, never ahead), read without the fine clock's cost. The
 * entries are read in milliseconds ("submitted 3412 ms ago"), and a 2-rank
 * 8-byte allreduce over shared memory, 0.25 us, paid a fifth of it for the
 * three fine reads of a blocking call. */
static uint64_t entry_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t kolo_flight_submit(struct kolo_flight *f, const char *name, const char *op, int dtype,
                            uint64_t bytes)
{
	if (!f)
		return 0;
	uint64_t now = entry_now();
	size_t n = strlen(name);
	pthread_mutex_lock(&f->lock);
	struct fl_entry *e = entry_new(f, op, dtype, bytes, now);
	if (n >= sizeof(e->name))
		n = sizeof(e->name) - 1;
	memcpy(e->name, name, n);
	e->name[n] = '\0';
	uint64_t seq = e->seq;
	pthread_mutex_unlock(&f->lock);
	return seq;
}

uint64_t kolo_flight_submit_running(struct kolo_flight *f, const char *op, uint64_t number,
                                    int dtype, uint64_t bytes)
{
	if (!f)
		return 0;
	uint64_t now = entry_now();
	pthread_mutex_lock(&f->lock);
	struct fl_entry *e = entry_new(f, op, dtype, bytes, now);
	e->number = number;
	e->cseq = f->next_cseq++;
	e->t[KOLO_FL_NEGOTIATED] = e->t[KOLO_FL_DATAPLANE] = now;
	e->state = KOLO_FL_DATAPLANE;
	uint64_t seq = e->seq;
	pthread_mutex_unlock(&f->lock);
	return seq;
}

void kolo_flight_mark(struct kolo_flight *f, uint64_t seq, enum kolo_flight_state state,
                      kolo_status_t st, const char *msg)
{
	if (!f || !seq)
		return;
	uint64_t now = entry_now();
	pthread_mutex_lock(&f->lock);
	struct fl_entry *e = &f->e[seq % KOLO_FLIGHT_ENTRIES];
	if (e->seq == seq && e->state < KOLO_FL_DONE) {
		if (state == KOLO_FL_NEGOTIATED && !e->cseq)
			e->cseq = f->next_cseq++;
		if (state == KOLO_FL_FAILED) {
			e->st = st;
			snprintf(e->err, sizeof(e->err), "%s", msg ? msg : "");
		}
		e->state = state;
		e->t[state] = now;
	}
	pthread_mutex_unlock(&f->lock);
}

void kolo_flight_activity(struct kolo_flight *f, enum kolo_flight_activity a)
{
	if (f)
		atomic_store_explicit(&f->activity, (int)a, memory_order_relaxed);
}

void kolo_flight_waiting(struct kolo_flight *f, bool blocked, int peer)
{
	if (!f)
		return;
	atomic_store_explicit(&f->wait_since, blocked ? kolo_now_ns() : 0, memory_order_relaxed);
	atomic_store_explicit(&f->wait_peer, blocked ? peer : -1, memory_order_relaxed);
	atomic_store_explicit(&f->wait_unacked_ms, -1, memory_order_relaxed);
}

void kolo_flight_waiting_unacked(struct kolo_flight *f, int ms)
{
	if (f)
		atomic_store_explicit(&f->wait_unacked_ms, ms, memory_order_relaxed);
}

double kolo_flight_oldest_open_s(void)
{
	uint64_t now = kolo_now_ns(), oldest = now;
	pthread_mutex_lock(&reg_lock);
	for (struct kolo_flight *f = reg_head; f; f = f->next) {
		pthread_mutex_lock(&f->lock);
		for (int i = 0; i < KOLO_FLIGHT_ENTRIES; i++) {
			const struct fl_entry *e = &f->e[i];
			if (e->seq && e->state < KOLO_FL_DONE && e->t[KOLO_FL_SUBMITTED] < oldest)
				oldest = e->t[KOLO_FL_SUBMITTED];
		}
		pthread_mutex_unlock(&f->lock);
	}
	pthread_mutex_unlock(&reg_lock);
	return (double)(now - oldest) / 1e9;
}

/* ---- the JSON snapshot ---------------------------------------------------- */

static void json_str(struct kolo_metrics_text *t, const char *s)
{
	kolo_metrics_text_add(t, "\"");
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		if (*p == '"' || *p == '\\')
			kolo_metrics_text_add(t, "\\%c", *p);
		else if (*p < 0x20)
			kolo_metrics_text_add(t, "\\u%04x", *p);
		else
			kolo_metrics_text_add(t, "%c", *p);
	}
	kolo_metrics_text_add(t, "\"");
}

static double ms_ago(uint64_t now, uint64_t t)
{
	return t && t <= now ? (double)(now - t) / 1e6 : 0.0;
}

static void render_entry(struct kolo_metrics_text *t, const struct fl_entry *e, uint64_t now)
{
	kolo_metrics_text_add(t,
	                      "{\"seq\":%llu,\"cseq\":%llu,\"name\":", (unsigned long long)e->seq,
	                      (unsigned long long)e->cseq);
	if (!e->name[0] && e->number)
		kolo_metrics_text_add(t, "\"%s.%llu\"", e->op ? e->op : "op",
		                      (unsigned long long)e->number);
	else
		json_str(t, e->name);
	kolo_metrics_text_add(t, ",\"op\":\"%s\",\"dtype\":\"%s\",\"bytes\":%llu,\"state\":\"%s\"",
	                      e->op ? e->op : "?",
	                      e->dtype >= 0 ? kolo_dtype_name((kolo_dtype_t)e->dtype) : "none",
	                      (unsigned long long)e->bytes, state_names[e->state]);
	kolo_metrics_text_add(t, ",\"age_ms\":%.1f,\"status\":\"%s\",\"times_ms\":{",
	                      ms_ago(now, e->t[KOLO_FL_SUBMITTED]), kolo_status_name(e->st));
	bool first = true;
	for (int s = 0; s < KOLO_FL_NSTATES; s++)
		if (e->t[s]) {
			kolo_metrics_text_add(t, "%s\"%s\":%.1f", first ? "" : ",", state_names[s],
			                      ms_ago(now, e->t[s]));
			first = false;
		}
	kolo_metrics_text_add(t, "}");
	if (e->state == KOLO_FL_FAILED) {
		kolo_metrics_text_add(t, ",\"error\":");
		json_str(t, e->err);
	}
	kolo_metrics_text_add(t, "}");
}

/* Copies f's entries, oldest first, at most max (0: all), into v; returns
 * their number. f->lock held. */
static int snapshot_entries(const struct kolo_flight *f, int max, struct fl_entry *v)
{
	uint64_t last = f->next_seq - 1;
	uint64_t n = last < KOLO_FLIGHT_ENTRIES ? last : KOLO_FLIGHT_ENTRIES;
	if (max > 0 && n > (uint64_t)max)
		n = (uint64_t)max;
	for (uint64_t i = 0; i < n; i++)
		v[i] = f->e[(last - n + 1 + i) % KOLO_FLIGHT_ENTRIES];
	return (int)n;
}

static void render_lags(struct kolo_metrics_text *t, const struct kolo_flight *f);

static void render_comm(struct kolo_metrics_text *t, struct kolo_flight *f, int max,
                        struct fl_entry *v, uint64_t now)
{
	pthread_mutex_lock(&f->lock);
	int n = snapshot_entries(f, max, v);
	kolo_metrics_text_add(t, "{\"label\":");
	json_str(t, f->label);
	kolo_metrics_text_add(t, ",\"rank\":%d,\"size\":%d,\"members\":[", f->rank, f->size);
	for (int i = 0; i < f->size; i++)
		kolo_metrics_text_add(t, "%s%d", i ? "," : "", f->members[i]);
	int peer = atomic_load_explicit(&f->wait_peer, memory_order_relaxed);
	if (peer >= 0 && peer < f->size)
		peer = f->members[peer];
	kolo_metrics_text_add(t, "]");
	render_lags(t, f);
	pthread_mutex_unlock(&f->lock);
	uint64_t since = atomic_load_explicit(&f->wait_since, memory_order_relaxed);
	int a = atomic_load_explicit(&f->activity, memory_order_relaxed);
	kolo_metrics_text_add(t, ",\"activity\":\"%s\",\"waiting_on\":%d,\"waiting_ms\":%.1f",
	                      activity_names[a & 3], peer, ms_ago(now, since));
	int unacked = atomic_load_explicit(&f->wait_unacked_ms, memory_order_relaxed);
	if (peer >= 0 && unacked >= 0)
		kolo_metrics_text_add(t, ",\"waiting_unacked_ms\":%d", unacked);
	kolo_metrics_text_add(t, ",\"entries\":[");
	for (int i = 0; i < n; i++) {
		if (i)
			kolo_metrics_text_add(t, ",");
		render_entry(t, &v[i], now);
	}
	kolo_metrics_text_add(t, "]}");
}

kolo_status_t kolo_flight_render(const struct kolo_flight_identity *id, int max_entries, char **out,
                                 size_t *len)
{
	struct kolo_metrics_text t = {0};
	struct fl_entry *v = malloc(KOLO_FLIGHT_ENTRIES * sizeof(*v));
	if (!v)
		return KOLO_ENOMEM;
	uint64_t now = kolo_now_ns();
	kolo_metrics_text_add(&t, "{\"version\":1,\"rank\":%d,\"size\":%d,\"round\":%lld,\"host\":",
	                      id->rank, id->size, (long long)id->round);
	json_str(&t, id->host ? id->host : "");
	kolo_metrics_text_add(&t, ",\"job\":");
	json_str(&t, id->job ? id->job : "");
	kolo_metrics_text_add(
	        &t, ",\"pid\":%ld,\"gen\":%llu,\"time_ms\":%llu,\"reason\":", (long)getpid(),
	        (unsigned long long)id->gen, (unsigned long long)(kolo_wall_us() / 1000));
	json_str(&t, id->reason ? id->reason : "");
	if (id->peers)
		kolo_metrics_text_add(&t, ",\"peers\":%s", id->peers);
	kolo_metrics_text_add(&t, ",\"comms\":[");
	pthread_mutex_lock(&reg_lock);
	int i = 0;
	for (struct kolo_flight *f = reg_head; f; f = f->next, i++) {
		if (i)
			kolo_metrics_text_add(&t, ",");
		render_comm(&t, f, max_entries, v, now);
	}
	pthread_mutex_unlock(&reg_lock);
	kolo_metrics_text_add(&t, "]}\n");
	free(v);
	if (t.oom) {
		free(t.b);
		return KOLO_ENOMEM;
	}
	*out = t.b;
	*len = t.len;
	return KOLO_OK;
}

kolo_status_t kolo_flight_dump(const struct kolo_flight_identity *id, const char *dir, char *path,
                               size_t path_size)
{
	char *body, tmp[600];
	size_t len;
	kolo_status_t st = kolo_flight_render(id, 0, &body, &len);
	if (st != KOLO_OK)
		return st;
	char job[128];
	snprintf(job, sizeof(job), "%s", id->job && id->job[0] ? id->job : "job");
	for (char *c = job; *c; c++)
		if (*c == '/')
			*c = '_';
	snprintf(path, path_size, "%s/kolo-flight-%s-%d-%ld.json", dir && dir[0] ? dir : ".", job,
	         id->rank, (long)getpid());
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	FILE *fp = fopen(tmp, "w");
	bool ok = fp && fwrite(body, 1, len, fp) == len;
	ok = fp && fclose(fp) == 0 && ok;
	free(body);
	if (!ok || rename(tmp, path) != 0) {
		unlink(tmp);
		return KOLO_ESYSTEM;
	}
	return KOLO_OK;
}

/* ---- arrival lags ------------------------------------------------------ */

void kolo_flight_lags(struct kolo_flight *f, const uint64_t *arrive, int n)
{
	if (!f || !arrive || n <= 0)
		return;
	uint64_t first = 0;
	for (int r = 0; r < n; r++)
		if (arrive[r] && (!first || arrive[r] < first))
			first = arrive[r];
	pthread_mutex_lock(&f->lock);
	if (f->lag_n != n) { /* a new round, or the first collective */
		free(f->lag_ms);
		free(f->last);
		free(f->lag_sum);
		f->lag_ms = malloc((size_t)n * KOLO_FLIGHT_LAG_WINDOW * sizeof(float));
		f->last = malloc(KOLO_FLIGHT_LAG_WINDOW * sizeof(int));
		f->lag_sum = calloc((size_t)n, sizeof(double));
		f->lag_n = f->lag_ms && f->last && f->lag_sum ? n : 0;
		f->nlag = 0;
	}
	if (f->lag_n == n) {
		size_t op = f->nlag++ % KOLO_FLIGHT_LAG_WINDOW;
		float *v = f->lag_ms + op * (size_t)n, worst = 0;
		int last = -1;
		for (int r = 0; r < n; r++) {
			v[r] = arrive[r] ? (float)((double)(arrive[r] - first) / 1e6) : -1.0f;
			if (arrive[r])
				f->lag_sum[r] += (double)(arrive[r] - first) / 1e6;
			if (v[r] > worst && v[r] >= KOLO_FLIGHT_LAST_MIN_MS) {
				worst = v[r];
				last = r;
			}
		}
		f->last[op] = last;
	}
	pthread_mutex_unlock(&f->lock);
}

bool kolo_flight_lag_totals(struct kolo_flight *f, double *out, int n)
{
	if (!f || !out || n <= 0)
		return false;
	pthread_mutex_lock(&f->lock);
	bool ok = f->lag_n == n;
	for (int r = 0; r < n; r++)
		out[r] = ok ? f->lag_sum[r] : 0;
	pthread_mutex_unlock(&f->lock);
	return ok;
}

static int cmp_float(const void *a, const void *b)
{
	float x = *(const float *)a, y = *(const float *)b;
	return (x > y) - (x < y);
}

/* Collectives in the window. f->lock held. */
static int lag_ops(const struct kolo_flight *f)
{
	return (int)KOLO_MIN(f->nlag, (uint64_t)KOLO_FLIGHT_LAG_WINDOW);
}

/* Rank r's lags over the window into out (scratch of the window's size).
 * f->lock held. */
static void lag_of(const struct kolo_flight *f, int r, float *tmp, struct kolo_flight_lag *out)
{
	int ops = lag_ops(f), k = 0;
	*out = (struct kolo_flight_lag){.rank = r < f->size ? f->members[r] : r, .ops = ops};
	for (int op = 0; op < ops; op++) {
		float v = f->lag_ms[(size_t)op * (size_t)f->lag_n + (size_t)r];
		if (v >= 0)
			tmp[k++] = v;
		out->last += f->last[op] == r;
	}
	if (!k)
		return;
	qsort(tmp, (size_t)k, sizeof(*tmp), cmp_float);
	out->p50_ms = tmp[k / 2];
	out->p90_ms = tmp[(k * 9) / 10 < k ? (k * 9) / 10 : k - 1];
	out->max_ms = tmp[k - 1];
}

bool kolo_flight_slowest(const char *label, struct kolo_flight_lag *out)
{
	float tmp[KOLO_FLIGHT_LAG_WINDOW];
	bool found = false;
	pthread_mutex_lock(&reg_lock);
	for (struct kolo_flight *f = reg_head; f && !found; f = f->next) {
		pthread_mutex_lock(&f->lock);
		if (strcmp(f->label, label ? label : "job") == 0) {
			struct kolo_flight_lag l;
			for (int r = 0; r < f->lag_n; r++) {
				lag_of(f, r, tmp, &l);
				if (l.last > (found ? out->last : 0)) {
					*out = l;
					found = true;
				}
			}
		}
		pthread_mutex_unlock(&f->lock);
	}
	pthread_mutex_unlock(&reg_lock);
	return found;
}

/* One family's samples (ratio: kolo_arrival_last_ratio, else the lags) of
 * comm f. f->lock held. */
static void metrics_comm(struct kolo_metrics_text *t, struct kolo_flight *f, float *tmp, bool ratio)
{
	static const char *const q[] = {"0.5", "0.9", "1"};
	char labels[256], rank[16], val[32];
	for (int r = 0; r < f->lag_n; r++) {
		struct kolo_flight_lag l;
		lag_of(f, r, tmp, &l);
		double v[] = {l.p50_ms, l.p90_ms, l.max_ms};
		snprintf(rank, sizeof(rank), "%d", l.rank);
		for (int i = 0; i < 3 && !ratio; i++) {
			if (!kolo_metrics_labels(labels, sizeof(labels), "comm", f->label, "rank",
			                         rank, "quantile", q[i], NULL))
				continue;
			kolo_metrics_text_add(
			        t, "kolo_arrival_lag_seconds{%s} %s\n", labels,
			        kolo_metrics_fixed(val, sizeof(val), (uint64_t)(v[i] * 1000.0), 6));
		}
		if (ratio && kolo_metrics_labels(labels, sizeof(labels), "comm", f->label, "rank",
		                                 rank, NULL))
			kolo_metrics_text_add(
			        t, "kolo_arrival_last_ratio{%s} %s\n", labels,
			        kolo_metrics_fixed(
			                val, sizeof(val),
			                l.ops ? (uint64_t)l.last * 1000000u / (uint64_t)l.ops : 0,
			                6));
	}
}

void kolo_flight_metrics(struct kolo_metrics_text *t)
{
	static const char *const names[] = {"kolo_arrival_lag_seconds", "kolo_arrival_last_ratio"};
	static const char *const help[] = {
	        "How long after the first rank each rank's submission of a negotiated collective "
	        "arrived, over the last 256 collectives",
	        "Share of the last 256 negotiated collectives that this rank submitted last (by "
	        "0.5 ms or more)"};
	float tmp[KOLO_FLIGHT_LAG_WINDOW];
	for (int k = 0; k < 2; k++) {
		kolo_metrics_text_family(t, names[k], "gauge", help[k]);
		pthread_mutex_lock(&reg_lock);
		for (struct kolo_flight *f = reg_head; f; f = f->next) {
			pthread_mutex_lock(&f->lock);
			if (f->nlag)
				metrics_comm(t, f, tmp, k == 1);
			pthread_mutex_unlock(&f->lock);
		}
		pthread_mutex_unlock(&reg_lock);
	}
}

/* ,"lag":{"ops":k,"p50_ms":[...],"p90_ms":[...],"max_ms":[...],"last":[...]},
 * by comm rank, when the comm has negotiated collectives. f->lock held. */
static void render_lags(struct kolo_metrics_text *t, const struct kolo_flight *f)
{
	if (!f->nlag)
		return;
	float tmp[KOLO_FLIGHT_LAG_WINDOW];
	struct kolo_flight_lag *l = malloc((size_t)f->lag_n * sizeof(*l));
	if (!l)
		return;
	for (int r = 0; r < f->lag_n; r++) /* each rank's figures once, for four lists */
		lag_of(f, r, tmp, &l[r]);
	static const char *const keys[] = {"p50_ms", "p90_ms", "max_ms", "last"};
	kolo_metrics_text_add(t, ",\"lag\":{\"ops\":%d", lag_ops(f));
	for (int k = 0; k < 4; k++) {
		kolo_metrics_text_add(t, "%s\"%s\":[", k ? "]," : ",", keys[k]);
		for (int r = 0; r < f->lag_n; r++) {
			double v[] = {l[r].p50_ms, l[r].p90_ms, l[r].max_ms, l[r].last};
			kolo_metrics_text_add(t, k == 3 ? "%s%.0f" : "%s%.3f", r ? "," : "", v[k]);
		}
	}
	kolo_metrics_text_add(t, "]}");
	free(l);
}
