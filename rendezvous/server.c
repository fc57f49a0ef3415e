/* server: the rendezvous HTTP server (libmicrohttpd + jansson).
 *
 * One mutex guards all state. One thread of ours runs libmicrohttpd's epoll
 * set (see http_main); long polls (assignment, KV get with a timeout) suspend
 * their connection and are resumed by whoever makes them ready: a request
 * that forms a round or puts a key, or the timer thread, which drives settle
 * periods, lease expiry, poll deadlines, disconnect detection and progress
 * logs. A resumed connection re-enters the access handler, which sends the
 * response prepared for it. docs/rendezvous.md is the contract. */
#include "rendezvous.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define SUB             "rdzv"
#define WAIT_LOG_MS     5000
#define LIVENESS_MS     1000
#define DEFAULT_POLL_MS 30000
#define MAX_POLL_MS     3600000
#define EVICTED_MAX     65536
#define KV_TOTAL_MAX    ((size_t)512 * 1024 * 1024)
#define JOBS_MAX        16384
#define STOP_GRACE_MS   3000
#define IDLE_TIMEOUT_S  120 /* idle keep-alive connections; held polls are exempt */
#define DISCARD_MAX     ((size_t)64 * 1024 * 1024)

/* ---- a string-keyed hash map ---------------------------------------- */

struct map_entry {
	struct map_entry *next;
	void *val;
	char key[];
};

struct map {
	struct map_entry **b;
	size_t cap, n;
};

static uint64_t hash_str(const char *s)
{
	uint64_t h = 1469598103934665603ULL;
	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 1099511628211ULL;
	return h;
}

static struct map_entry **map_slot(struct map *m, const char *key)
{
	if (!m->cap)
		return NULL;
	struct map_entry **p = &m->b[hash_str(key) & (m->cap - 1)];
	while (*p && strcmp((*p)->key, key) != 0)
		p = &(*p)->next;
	return p;
}

static void *map_get(struct map *m, const char *key)
{
	struct map_entry **p = map_slot(m, key);
	return p && *p ? (*p)->val : NULL;
}

static bool map_grow(struct map *m)
{
	size_t cap = m->cap ? m->cap * 2 : 64;
	struct map_entry **b = calloc(cap, sizeof(*b));
	if (!b)
		return false;
	for (size_t i = 0; i < m->cap; i++) {
		for (struct map_entry *e = m->b[i], *nx; e; e = nx) {
			nx = e->next;
			struct map_entry **p = &b[hash_str(e->key) & (cap - 1)];
			e->next = *p;
			*p = e;
		}
	}
	free(m->b);
	m->b = b;
	m->cap = cap;
	return true;
}

/* Inserts or replaces; returns the old value (or NULL). *ok false on ENOMEM. */
static void *map_put(struct map *m, const char *key, void *val, bool *ok)
{
	*ok = true;
	if ((m->n + 1) * 2 > m->cap && !map_grow(m)) {
		*ok = false;
		return NULL;
	}
	struct map_entry **p = map_slot(m, key);
	if (*p) {
		void *old = (*p)->val;
		(*p)->val = val;
		return old;
	}
	size_t kl = strlen(key) + 1;
	struct map_entry *e = malloc(sizeof(*e) + kl);
	if (!e) {
		*ok = false;
		return NULL;
	}
	memcpy(e->key, key, kl);
	e->val = val;
	e->next = NULL;
	*p = e;
	m->n++;
	return NULL;
}

static void *map_del(struct map *m, const char *key)
{
	struct map_entry **p = map_slot(m, key);
	if (!p || !*p)
		return NULL;
	struct map_entry *e = *p;
	void *v = e->val;
	*p = e->next;
	free(e);
	m->n--;
	return v;
}

/* Frees the entries, calling fn on each value. */
static void map_fini(struct map *m, void (*fn)(void *))
{
	for (size_t i = 0; i < m->cap; i++) {
		for (struct map_entry *e = m->b[i], *nx; e; e = nx) {
			nx = e->next;
			if (fn)
				fn(e->val);
			free(e);
		}
	}
	free(m->b);
	memset(m, 0, sizeof(*m));
}

#define MAP_FOREACH(m, e)                                                                          \
	for (size_t i_##e = 0; i_##e < (m)->cap; i_##e++)                                          \
		for (struct map_entry *e = (m)->b[i_##e]; e; e = e->next)

/* ---- state ------------------------------------------------------------ */

enum endpoint {
	EP_HEALTHZ,
	EP_METRICS,
	EP_JOB,
	EP_WORKERS,
	EP_WORKER,
	EP_ASSIGNMENT,
	EP_HEARTBEAT,
	EP_FAILURES,
	EP_KV,
	EP_OTHER,
	EP_COUNT
};

static const char *const endpoint_names[EP_COUNT] = {
        "healthz",    "metrics",   "job",      "workers", "worker",
        "assignment", "heartbeat", "failures", "kv",      "other",
};

static const int codes[] = {200, 201, 202, 204, 400, 401, 404, 405, 410, 413, 500, 503, 507};
#define N_CODES ((int)KOLO_ARRAY_SIZE(codes))

struct worker {
	char id[KOLO_RDZV_ID_MAX];
	char host[KOLO_RDZV_HOST_MAX];
	uint64_t seq;            /* join order: smaller is older */
	uint64_t lease_deadline; /* ms; not checked while n_polls > 0 */
	int n_polls;             /* assignment long polls held open */
	int rank;                /* in the current round; -1 when waiting */
	int64_t commit_round;    /* the newest round it polled past as a member */
	struct kolo_rdzv_slot slot;
};

struct job {
	char name[KOLO_RDZV_ID_MAX];
	struct kolo_rdzv_job_config cfg;
	struct map workers; /* id -> worker */
	int n_workers;
	int64_t round;           /* current round number; 0 before the first */
	bool running;            /* the current round stands */
	bool claimed;            /* the current round was rebuilt from claims */
	bool reform_now;         /* a member was dropped: re-form without settle */
	struct worker **by_rank; /* current members; NULL holes in claimed rounds */
	int n_ranks;             /* length of by_rank */
	int n_members;           /* non-NULL entries */
	char *members_json;      /* cached members array of a formed round */
	size_t members_len;
	uint64_t last_join_ms;
	uint64_t last_claim_ms; /* the last re-registration placed in a claimed round */
	uint64_t last_wait_log_ms;
	uint64_t next_seq;
	struct map evicted;      /* id -> reason (strdup) */
	char dropped[1024];      /* who left since the last round, for its log line */
	uint64_t last_active_ms; /* the last request that named the job */
	struct map kv;           /* key -> struct kv_val */
	struct req *waiters;     /* long polls of this job */
};

struct kv_val {
	size_t len;
	char data[];
};

enum wait_kind { WAIT_NONE, WAIT_ASSIGN, WAIT_KV };

/* One request; lives from its first header until MHD says it completed. */
struct req {
	struct kolo_rdzv_server *s;
	struct MHD_Connection *conn;
	enum endpoint ep;
	char *body;
	size_t len, cap;
	bool too_large;
	size_t discarded; /* bytes dropped from a body over the limit */
	bool counted;     /* in s->inflight */
	/* a held long poll */
	enum wait_kind wkind;
	struct job *job;
	struct worker *worker;
	int64_t after_round;
	char key[KOLO_RDZV_ID_MAX];
	uint64_t deadline;
	int fd;
	struct req *wprev, *wnext;
	/* the response prepared when it was resumed */
	bool ready, gone;
	int code;
	char *resp;
	size_t resp_len;
	bool binary;
};

struct kolo_rdzv_server {
	struct kolo_rdzv_server_config cfg;
	char *token;
	struct MHD_Daemon *d;
	int listen_fd;
	int port;
	pthread_mutex_t lock;
	pthread_cond_t cond;      /* wakes the timer */
	pthread_cond_t idle_cond; /* inflight reached 0 */
	pthread_t timer;
	bool timer_started;
	pthread_t http; /* runs the daemon: http_main */
	bool http_started;
	atomic_bool http_stop;
	int wake_fd; /* eventfd: wakes http_main */
	bool stopping;
	uint64_t timer_next;
	uint64_t last_liveness;
	struct map jobs;
	int inflight;
	int n_polls;
	/* metrics */
	uint64_t requests[EP_COUNT][N_CODES + 1];
	uint64_t rounds_formed;
	uint64_t auth_failures;
	size_t kv_keys, kv_bytes;
};

static int code_index(int code)
{
	for (int i = 0; i < N_CODES; i++) {
		if (codes[i] == code)
			return i;
	}
	return N_CODES;
}

static void free_worker(void *p)
{
	free(p);
}

static void free_job(void *p)
{
	struct job *j = p;
	if (!j)
		return;
	map_fini(&j->workers, free_worker);
	map_fini(&j->evicted, free);
	map_fini(&j->kv, free);
	free(j->by_rank);
	free(j->members_json);
	free(j);
}

/* ---- waiters ---------------------------------------------------------- */

/* Wakes the timer when deadline is earlier than the one it sleeps to. With
 * lock held. */
static void timer_poke(struct kolo_rdzv_server *s, uint64_t deadline)
{
	if (deadline < s->timer_next)
		pthread_cond_signal(&s->cond);
}

static void waiter_link(struct job *j, struct req *r)
{
	r->wprev = NULL;
	r->wnext = j->waiters;
	if (j->waiters)
		j->waiters->wprev = r;
	j->waiters = r;
}

static void waiter_unlink(struct kolo_rdzv_server *s, struct req *r)
{
	if (r->wkind == WAIT_NONE)
		return;
	if (r->wprev)
		r->wprev->wnext = r->wnext;
	else
		r->job->waiters = r->wnext;
	if (r->wnext)
		r->wnext->wprev = r->wprev;
	r->wprev = r->wnext = NULL;
	if (r->wkind == WAIT_ASSIGN && r->worker) {
		r->worker->n_polls--;
		r->worker->lease_deadline = kolo_now_ms() + (uint64_t)s->cfg.lease_ms;
		timer_poke(s, r->worker->lease_deadline);
	}
	r->wkind = WAIT_NONE;
	r->worker = NULL;
	s->n_polls--;
}

/* Resumes a held request with a prepared response (body is taken). With
 * lock held. */
static void waiter_wake(struct kolo_rdzv_server *s, struct req *r, int code, char *body, size_t len,
                        bool binary)
{
	waiter_unlink(s, r);
	r->ready = true;
	r->code = code;
	r->resp = body;
	r->resp_len = len;
	r->binary = binary;
	MHD_resume_connection(r->conn);
	/* Without an internal thread libmicrohttpd has no wake-up channel of
	 * its own: http_main has to look, even when this runs in MHD_run. */
	uint64_t one = 1;
	ssize_t n = write(s->wake_fd, &one, sizeof(one));
	(void)n; /* a full counter already wakes it */
}

static char *json_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *json_err(const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	json_t *o = json_pack("{s:s}", "error", msg);
	char *out = o ? json_dumps(o, JSON_COMPACT) : NULL;
	json_decref(o);
	return out;
}

static void wake_error(struct kolo_rdzv_server *s, struct req *r, int code, const char *msg)
{
	char *b = json_err("%s", msg);
	waiter_wake(s, r, code, b, b ? strlen(b) : 0, false);
}

/* ---- rounds ----------------------------------------------------------- */

static char *assignment_body(const struct job *j, const struct worker *w, size_t *len)
{
	size_t cap = j->members_len + 256;
	char *b = malloc(cap);
	if (!b)
		return NULL;
	int n = snprintf(b, cap,
	                 "{\"round\":%" PRId64 ",\"rank\":%d,\"size\":%d,\"local_rank\":%d,"
	                 "\"local_size\":%d,\"cross_rank\":%d,\"cross_size\":%d,\"members\":",
	                 j->round, w->slot.rank, w->slot.size, w->slot.local_rank,
	                 w->slot.local_size, w->slot.cross_rank, w->slot.cross_size);
	memcpy(b + n, j->members_json, j->members_len);
	b[n + j->members_len] = '}';
	b[n + j->members_len + 1] = '\0';
	*len = (size_t)n + j->members_len + 1;
	return b;
}

/* true when w may be answered with the current round. */
static bool assignment_ready(const struct job *j, const struct worker *w, int64_t after_round)
{
	return j->running && !j->claimed && w->rank >= 0 && j->round > after_round &&
	       j->members_json;
}

static void wake_assignments(struct kolo_rdzv_server *s, struct job *j)
{
	for (struct req *r = j->waiters, *nx; r; r = nx) {
		nx = r->wnext;
		if (r->wkind != WAIT_ASSIGN || !assignment_ready(j, r->worker, r->after_round))
			continue;
		size_t len = 0;
		char *b = assignment_body(j, r->worker, &len);
		if (b)
			waiter_wake(s, r, 200, b, len, false);
		else
			wake_error(s, r, 500, "out of memory");
	}
}

static int cmp_seq(const void *a, const void *b)
{
	const struct worker *x = *(struct worker *const *)a, *y = *(struct worker *const *)b;
	return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* All live workers, ordered: current members by rank, then the others by
 * join order. Returns a malloc'd array of j->n_workers. */
static struct worker **ranked_workers(struct job *j)
{
	struct worker **v = malloc((size_t)KOLO_MAX(j->n_workers, 1) * sizeof(*v));
	if (!v)
		return NULL;
	int n = 0;
	for (int r = 0; r < j->n_ranks; r++) {
		if (j->by_rank[r])
			v[n++] = j->by_rank[r];
	}
	int members = n;
	MAP_FOREACH(&j->workers, e)
	{
		struct worker *w = e->val;
		if (w->rank < 0)
			v[n++] = w;
	}
	qsort(v + members, (size_t)(n - members), sizeof(*v), cmp_seq);
	return v;
}

static void clear_membership(struct job *j)
{
	for (int r = 0; r < j->n_ranks; r++) {
		if (j->by_rank[r])
			j->by_rank[r]->rank = -1;
	}
	free(j->by_rank);
	j->by_rank = NULL;
	j->n_ranks = j->n_members = 0;
	free(j->members_json);
	j->members_json = NULL;
	j->members_len = 0;
}

static void form_round(struct kolo_rdzv_server *s, struct job *j)
{
	struct worker **v = ranked_workers(j);
	int n = j->n_workers;
	if (j->cfg.max_np > 0 && n > j->cfg.max_np)
		n = j->cfg.max_np;
	const char **hosts = malloc((size_t)KOLO_MAX(n, 1) * sizeof(*hosts));
	struct kolo_rdzv_slot *slots = calloc((size_t)KOLO_MAX(n, 1), sizeof(*slots));
	struct worker **by_rank = calloc((size_t)KOLO_MAX(n, 1), sizeof(*by_rank));
	size_t cap = (size_t)n * (KOLO_RDZV_ID_MAX + KOLO_RDZV_HOST_MAX + 48) + 4;
	char *mj = malloc(cap);
	if (!v || !hosts || !slots || !by_rank || !mj)
		goto oom;
	for (int i = 0; i < n; i++)
		hosts[i] = v[i]->host;
	if (kolo_rdzv_assign_all(hosts, n, slots) != KOLO_OK)
		goto oom;
	/* Who is new in this round, for the log. */
	char added[512] = "";
	size_t ao = 0;
	int n_added = 0;
	for (int i = 0; i < n; i++) {
		if (v[i]->rank < 0) {
			if (n_added < 8 && ao < sizeof(added))
				ao += (size_t)snprintf(added + ao, sizeof(added) - ao, "%s%s@%s",
				                       n_added ? ", " : "", v[i]->id, v[i]->host);
			n_added++;
		}
	}
	if (n_added > 8 && ao < sizeof(added))
		snprintf(added + ao, sizeof(added) - ao, ", ... %d more", n_added - 8);
	clear_membership(j);
	for (int i = 0; i < n; i++) {
		v[i]->slot = slots[i];
		v[i]->rank = slots[i].rank;
		v[i]->commit_round = 0;
		by_rank[slots[i].rank] = v[i];
	}
	size_t o = 0;
	mj[o++] = '[';
	for (int r = 0; r < n; r++) {
		o += (size_t)snprintf(mj + o, cap - o,
		                      "%s{\"rank\":%d,\"worker_id\":\"%s\",\"host\":\"%s\"}",
		                      r ? "," : "", r, by_rank[r]->id, by_rank[r]->host);
	}
	mj[o++] = ']';
	mj[o] = '\0';
	j->by_rank = by_rank;
	j->n_ranks = j->n_members = n;
	j->members_json = mj;
	j->members_len = o;
	j->round++;
	j->running = true;
	j->claimed = false;
	j->reform_now = false;
	s->rounds_formed++;
	int n_hosts = 0;
	for (int i = 0; i < n; i++)
		n_hosts += slots[i].local_rank == 0;
	KOLO_INFO(SUB,
	          "job %s round %" PRId64 " formed: %d workers on %d hosts, rank 0 = %s@%s; "
	          "added=[%s]; dropped=[%s]; waiting=%d",
	          j->name, j->round, n, n_hosts, by_rank[0]->id, by_rank[0]->host, added,
	          j->dropped, j->n_workers - n);
	j->dropped[0] = '\0';
	free(v);
	free(hosts);
	free(slots);
	wake_assignments(s, j);
	return;
oom:
	KOLO_ERROR(SUB, "job %s: out of memory forming a round", j->name);
	free(v);
	free(hosts);
	free(slots);
	free(by_rank);
	free(mj);
}

static bool settle_due(const struct job *j, uint64_t now)
{
	return (j->cfg.max_np > 0 && j->n_workers >= j->cfg.max_np) ||
	       now >= j->last_join_ms + (uint64_t)j->cfg.settle_ms;
}

/* Workers that joined while the round runs and would fit into the next. */
static bool pending_change(const struct job *j)
{
	int waiting = j->n_workers - j->n_members;
	return j->running && waiting > 0 && (j->cfg.max_np == 0 || j->n_members < j->cfg.max_np);
}

static bool members_at_commit(const struct job *j)
{
	for (int r = 0; r < j->n_ranks; r++) {
		if (j->by_rank[r] && j->by_rank[r]->commit_round < j->round)
			return false;
	}
	return true;
}

/* A round rebuilt from claims after a restart re-forms once every member
 * that came back asks past it and no claim arrived for settle_ms: its members
 * may have been re-forming when the server went away, and the ones that did
 * not come back will never answer. */
static bool claimed_round_due(const struct job *j, uint64_t now)
{
	return j->running && j->claimed && j->n_members > 0 && members_at_commit(j) &&
	       now >= j->last_claim_ms + (uint64_t)j->cfg.settle_ms;
}

/* Applies the round-formation rules. With lock held. */
static void job_tick(struct kolo_rdzv_server *s, struct job *j, uint64_t now)
{
	if (j->reform_now) {
		j->reform_now = false;
		if (j->n_workers >= j->cfg.min_np && j->n_workers > 0) {
			form_round(s, j);
		} else {
			/* Members that all left gracefully are a job finishing (or
			 * shrinking by choice), not a failure: say so quietly. */
			bool only_left =
			        !strstr(j->dropped, "lease") && !strstr(j->dropped, "failed");
			if (only_left)
				KOLO_INFO(
				        SUB,
				        "job %s round %" PRId64 " ended: %d workers remain, fewer "
				        "than min_np %d; dropped=[%s]",
				        j->name, j->round, j->n_workers, j->cfg.min_np, j->dropped);
			else
				KOLO_WARN(SUB,
				          "job %s round %" PRId64
				          ": %d workers left, below min_np %d; "
				          "waiting; dropped=[%s]",
				          j->name, j->round, j->n_workers, j->cfg.min_np,
				          j->dropped);
			j->dropped[0] = '\0';
			clear_membership(j);
			j->running = false;
			j->claimed = false;
			j->last_wait_log_ms = now;
		}
		return;
	}
	if (!j->running) {
		if (j->n_workers >= j->cfg.min_np && j->n_workers > 0 && settle_due(j, now))
			form_round(s, j);
	} else if (pending_change(j) && members_at_commit(j) && settle_due(j, now)) {
		form_round(s, j);
	} else if (claimed_round_due(j, now)) {
		form_round(s, j);
	}
}

/* When job_tick next needs to run for a settle period; UINT64_MAX if never. */
static uint64_t job_settle_deadline(const struct job *j)
{
	bool want = (!j->running && j->n_workers >= j->cfg.min_np && j->n_workers > 0) ||
	            (pending_change(j) && members_at_commit(j));
	uint64_t d = want ? j->last_join_ms + (uint64_t)j->cfg.settle_ms : UINT64_MAX;
	if (j->running && j->claimed && j->n_members > 0 && members_at_commit(j))
		d = KOLO_MIN(d, j->last_claim_ms + (uint64_t)j->cfg.settle_ms);
	return d;
}

static void note_dropped(struct job *j, const struct worker *w, const char *why)
{
	size_t o = strlen(j->dropped);
	if (o + 80 >= sizeof(j->dropped)) {
		if (!strstr(j->dropped, "..."))
			snprintf(j->dropped + o, sizeof(j->dropped) - o, ", ...");
		return;
	}
	snprintf(j->dropped + o, sizeof(j->dropped) - o, "%s%s@%s (%s)", o ? ", " : "",
	         w ? w->id : "?", w ? w->host : "?", why);
}

static void remember_evicted(struct job *j, const char *id, const char *why)
{
	if (j->evicted.n >= EVICTED_MAX) {
		/* Forget an arbitrary old entry: the answer then says "unknown
		 * worker", and such a worker joins afresh. */
		for (size_t i = 0; i < j->evicted.cap; i++) {
			if (j->evicted.b[i]) {
				free(map_del(&j->evicted, j->evicted.b[i]->key));
				break;
			}
		}
	}
	char *reason = strdup(why);
	bool ok;
	if (reason)
		free(map_put(&j->evicted, id, reason, &ok));
	if (reason && !ok)
		free(reason);
}

/* Removes a worker: answers its long polls, frees a rank, remembers why.
 * Does not run job_tick. With lock held. */
static void drop_worker(struct kolo_rdzv_server *s, struct job *j, struct worker *w,
                        const char *why)
{
	char msg[160];
	snprintf(msg, sizeof(msg), "evicted: %s", why);
	for (struct req *r = j->waiters, *nx; r; r = nx) {
		nx = r->wnext;
		if (r->wkind == WAIT_ASSIGN && r->worker == w)
			wake_error(s, r, 410, msg);
	}
	if (w->rank >= 0 && w->rank < j->n_ranks && j->by_rank[w->rank] == w) {
		j->by_rank[w->rank] = NULL;
		j->n_members--;
		if (j->running)
			j->reform_now = true;
	}
	note_dropped(j, w, why);
	/* Evictions are news; leaves are summed up in the next round's line. */
	kolo_log(strcmp(why, "left") == 0 ? KOLO_LOG_DEBUG : KOLO_LOG_INFO, SUB,
	         "job %s: worker %s@%s dropped (%s)", j->name, w->id, w->host, why);
	remember_evicted(j, w->id, why);
	map_del(&j->workers, w->id);
	j->n_workers--;
	free(w);
}

/* A job that no worker, held poll or request has used for job_retain_ms
 * has finished: forget it. */
static bool job_idle(const struct kolo_rdzv_server *s, const struct job *j, uint64_t now)
{
	return s->cfg.job_retain_ms > 0 && j->n_workers == 0 && !j->waiters &&
	       now >= j->last_active_ms + (uint64_t)s->cfg.job_retain_ms;
}

/* Frees a job with its configuration, KV store and eviction records. With
 * lock held; the job has no workers and no waiters. */
static void job_forget(struct kolo_rdzv_server *s, struct job *j, uint64_t now)
{
	MAP_FOREACH(&j->kv, e)
	{
		const struct kv_val *v = e->val;
		s->kv_keys--;
		s->kv_bytes -= v->len;
	}
	KOLO_INFO(SUB, "job %s forgotten: no workers or requests for %" PRIu64 " s", j->name,
	          (now - j->last_active_ms) / 1000);
	map_del(&s->jobs, j->name);
	free_job(j);
}

/* Forgets every idle job. With lock held. */
static void jobs_sweep(struct kolo_rdzv_server *s, uint64_t now)
{
	bool again = true;
	while (again) {
		again = false;
		MAP_FOREACH(&s->jobs, e)
		{
			if (job_idle(s, e->val, now)) {
				job_forget(s, e->val, now);
				again = true; /* the map changed under us */
				break;
			}
		}
	}
}

static struct job *job_get(struct kolo_rdzv_server *s, const char *name, bool create)
{
	uint64_t now = kolo_now_ms();
	struct job *j = map_get(&s->jobs, name);
	if (j)
		j->last_active_ms = now;
	if (!j && create && s->jobs.n >= JOBS_MAX)
		jobs_sweep(s, now);
	if (j || !create || s->jobs.n >= JOBS_MAX)
		return j;
	j = calloc(1, sizeof(*j));
	if (!j)
		return NULL;
	snprintf(j->name, sizeof(j->name), "%s", name);
	j->cfg.min_np = KOLO_MAX(s->cfg.min_np, 1);
	j->cfg.max_np = KOLO_MAX(s->cfg.max_np, 0);
	j->cfg.settle_ms = KOLO_MAX(s->cfg.settle_ms, 0);
	if (j->cfg.max_np && j->cfg.max_np < j->cfg.min_np)
		j->cfg.max_np = j->cfg.min_np;
	j->last_join_ms = now;
	j->last_wait_log_ms = now;
	j->last_active_ms = now;
	bool ok;
	map_put(&s->jobs, name, j, &ok);
	if (!ok) {
		free(j);
		return NULL;
	}
	return j;
}

static void wait_log(struct job *j)
{
	/* The oldest ten, in join order. */
	char joined[600];
	size_t o = 0;
	joined[0] = '\0';
	struct worker **v = ranked_workers(j);
	for (int i = 0; v && i < j->n_workers && i < 10; i++) {
		int n = snprintf(joined + o, sizeof(joined) - o, "%s%s@%s", i ? ", " : "", v[i]->id,
		                 v[i]->host);
		if (n < 0 || (size_t)n >= sizeof(joined) - o)
			break;
		o += (size_t)n;
	}
	if (j->n_workers > 10 && o + 32 < sizeof(joined))
		snprintf(joined + o, sizeof(joined) - o, ", ... %d more", j->n_workers - 10);
	free(v);
	char of[32] = "";
	if (j->cfg.max_np)
		snprintf(of, sizeof(of), "/%d", j->cfg.max_np);
	KOLO_INFO(SUB, "job %s round %" PRId64 ": waiting for %d%s workers (min %d); joined=[%s]",
	          j->name, j->round + 1, j->n_workers, of, j->cfg.min_np, joined);
}

/* ---- the timer -------------------------------------------------------- */

static uint64_t timer_pass(struct kolo_rdzv_server *s, uint64_t now)
{
	uint64_t next = now + 60000;
	bool liveness = now >= s->last_liveness + LIVENESS_MS;
	if (liveness)
		s->last_liveness = now;
	jobs_sweep(s, now);
	MAP_FOREACH(&s->jobs, je)
	{
		struct job *j = je->val;
		if (s->cfg.job_retain_ms > 0 && j->n_workers == 0 && !j->waiters)
			next = KOLO_MIN(next, j->last_active_ms + (uint64_t)s->cfg.job_retain_ms);
		/* Leases. */
		bool again = true;
		while (again) {
			again = false;
			MAP_FOREACH(&j->workers, we)
			{
				struct worker *w = we->val;
				if (w->n_polls > 0)
					continue;
				if (w->lease_deadline <= now) {
					drop_worker(s, j, w, "lease expired");
					again = true; /* the map changed under us */
					break;
				}
				next = KOLO_MIN(next, w->lease_deadline);
			}
		}
		job_tick(s, j, now);
		next = KOLO_MIN(next, job_settle_deadline(j));
		/* Poll deadlines and clients that went away. */
		for (struct req *r = j->waiters, *nx; r; r = nx) {
			nx = r->wnext;
			if (r->deadline <= now) {
				if (r->wkind == WAIT_ASSIGN)
					waiter_wake(s, r, 204, NULL, 0, false);
				else
					wake_error(s, r, 404, "no such key (timed out waiting)");
				continue;
			}
			if (liveness && r->fd >= 0) {
				char c;
				ssize_t got = recv(r->fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
				if (got == 0 || (got < 0 && errno != EAGAIN &&
				                 errno != EWOULDBLOCK && errno != EINTR)) {
					r->gone = true;
					waiter_wake(s, r, 0, NULL, 0, false);
					continue;
				}
			}
			next = KOLO_MIN(next, r->deadline);
		}
		if (j->waiters)
			next = KOLO_MIN(next, s->last_liveness + LIVENESS_MS);
		if (!j->running && j->n_workers > 0) {
			if (now >= j->last_wait_log_ms + WAIT_LOG_MS) {
				j->last_wait_log_ms = now;
				wait_log(j);
			}
			next = KOLO_MIN(next, j->last_wait_log_ms + WAIT_LOG_MS);
		}
	}
	return next;
}

static void *timer_main(void *arg)
{
	struct kolo_rdzv_server *s = arg;
	pthread_mutex_lock(&s->lock);
	while (!s->stopping) {
		uint64_t now = kolo_now_ms();
		uint64_t next = timer_pass(s, now);
		if (next <= now)
			continue;
		s->timer_next = next;
		/* The cond uses CLOCK_MONOTONIC (see start). */
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		uint64_t wait_ms = next - now;
		ts.tv_sec += (time_t)(wait_ms / 1000);
		ts.tv_nsec += (long)(wait_ms % 1000) * 1000000L;
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
		pthread_cond_timedwait(&s->cond, &s->lock, &ts);
		s->timer_next = 0;
	}
	pthread_mutex_unlock(&s->lock);
	return NULL;
}

/* ---- responses -------------------------------------------------------- */

static enum MHD_Result send_buf(struct req *r, int code, char *body, size_t len, bool binary)
{
	struct kolo_rdzv_server *s = r->s;
	struct MHD_Response *resp = MHD_create_response_from_buffer(len, body ? body : (char *)"",
	                                                            body ? MHD_RESPMEM_MUST_FREE
	                                                                 : MHD_RESPMEM_PERSISTENT);
	if (!resp) {
		free(body);
		return MHD_NO;
	}
	if (len > 0 || code != 204)
		MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE,
		                        binary ? "application/octet-stream" : "application/json");
	if (code == 401)
		MHD_add_response_header(resp, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
	if (code == 405) {
		static const char *const allow[EP_COUNT] = {
		        [EP_HEALTHZ] = "GET",    [EP_METRICS] = "GET",   [EP_JOB] = "GET, PUT",
		        [EP_WORKERS] = "POST",   [EP_WORKER] = "DELETE", [EP_ASSIGNMENT] = "GET",
		        [EP_HEARTBEAT] = "POST", [EP_FAILURES] = "POST", [EP_KV] = "GET, PUT",
		        [EP_OTHER] = "",
		};
		MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, allow[r->ep]);
	}
	if (code == 503)
		MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
	enum MHD_Result ret = MHD_queue_response(r->conn, (unsigned)code, resp);
	MHD_destroy_response(resp);
	pthread_mutex_lock(&s->lock);
	s->requests[r->ep][code_index(code)]++;
	pthread_mutex_unlock(&s->lock);
	return ret;
}

static enum MHD_Result send_json(struct req *r, int code, json_t *o)
{
	char *b = o ? json_dumps(o, JSON_COMPACT) : NULL;
	json_decref(o);
	if (!b)
		return MHD_NO;
	return send_buf(r, code, b, strlen(b), false);
}

static enum MHD_Result send_error(struct req *r, int code, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));
static enum MHD_Result send_error(struct req *r, int code, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	return send_json(r, code, json_pack("{s:s}", "error", msg));
}

/* ---- routing ---------------------------------------------------------- */

struct route {
	enum endpoint ep;
	char job[KOLO_RDZV_ID_MAX];
	char id[KOLO_RDZV_ID_MAX]; /* worker id or KV key */
	bool bad_job, bad_id;
	bool v1;
};

/* Copies the segment at *p up to '/' (or to the end when rest) into out. */
static bool take_seg(const char **p, char *out, size_t size, bool rest)
{
	const char *e = rest ? *p + strlen(*p) : strchr(*p, '/');
	if (!e)
		e = *p + strlen(*p);
	size_t n = (size_t)(e - *p);
	bool ok = n > 0 && n < size;
	if (ok) {
		memcpy(out, *p, n);
		out[n] = '\0';
	} else {
		out[0] = '\0';
	}
	*p = e;
	return ok;
}

static void route(const char *url, struct route *rt)
{
	memset(rt, 0, sizeof(*rt));
	rt->ep = EP_OTHER;
	if (strcmp(url, "/healthz") == 0) {
		rt->ep = EP_HEALTHZ;
		return;
	}
	if (strcmp(url, "/metrics") == 0) {
		rt->ep = EP_METRICS;
		return;
	}
	rt->v1 = strncmp(url, "/v1/", 4) == 0 || strcmp(url, "/v1") == 0;
	if (strncmp(url, "/v1/jobs/", 9) != 0)
		return;
	const char *p = url + 9;
	rt->bad_job = !take_seg(&p, rt->job, sizeof(rt->job), false) ||
	              !kolo_rdzv_valid_id(rt->job, false);
	if (*p == '\0') {
		rt->ep = EP_JOB;
		return;
	}
	p++; /* '/' */
	if (strcmp(p, "workers") == 0) {
		rt->ep = EP_WORKERS;
	} else if (strcmp(p, "failures") == 0) {
		rt->ep = EP_FAILURES;
	} else if (strncmp(p, "workers/", 8) == 0) {
		p += 8;
		rt->bad_id = !take_seg(&p, rt->id, sizeof(rt->id), false) ||
		             !kolo_rdzv_valid_id(rt->id, false);
		if (*p == '\0')
			rt->ep = EP_WORKER;
		else if (strcmp(p, "/assignment") == 0)
			rt->ep = EP_ASSIGNMENT;
		else if (strcmp(p, "/heartbeat") == 0)
			rt->ep = EP_HEARTBEAT;
	} else if (strncmp(p, "kv/", 3) == 0) {
		p += 3;
		rt->ep = EP_KV;
		rt->bad_id = !take_seg(&p, rt->id, sizeof(rt->id), true) ||
		             !kolo_rdzv_valid_id(rt->id, true);
	}
}

static bool method_ok(enum endpoint ep, const char *m)
{
	bool get = strcmp(m, "GET") == 0, put = strcmp(m, "PUT") == 0;
	bool post = strcmp(m, "POST") == 0, del = strcmp(m, "DELETE") == 0;
	switch (ep) {
	case EP_HEALTHZ:
	case EP_METRICS:
	case EP_ASSIGNMENT:
		return get;
	case EP_JOB:
	case EP_KV:
		return get || put;
	case EP_WORKERS:
	case EP_HEARTBEAT:
	case EP_FAILURES:
		return post;
	case EP_WORKER:
		return del;
	default:
		return false;
	}
}

/* Parses an optional non-negative integer query argument. */
static bool query_int(struct MHD_Connection *c, const char *name, int64_t def, int64_t lo,
                      int64_t hi, int64_t *out)
{
	const char *v = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, name);
	if (!v || !*v) {
		*out = def;
		return true;
	}
	char *end;
	errno = 0;
	long long x = strtoll(v, &end, 10);
	if (errno || *end || end == v || x < lo || x > hi)
		return false;
	*out = x;
	return true;
}

/* ---- handlers (lock held by the caller for the state parts) ----------- */

static json_t *job_status(const struct job *j)
{
	json_t *members = json_array(), *waiting = json_array();
	for (int r = 0; r < j->n_ranks; r++) {
		const struct worker *w = j->by_rank[r];
		if (w)
			json_array_append_new(members,
			                      json_pack("{s:i,s:s,s:s}", "rank", r, "worker_id",
			                                w->id, "host", w->host));
	}
	struct worker **v = malloc((size_t)KOLO_MAX(j->n_workers, 1) * sizeof(*v));
	int n = 0;
	if (v) {
		MAP_FOREACH(&j->workers, e)
		{
			struct worker *w = e->val;
			if (w->rank < 0)
				v[n++] = w;
		}
		qsort(v, (size_t)n, sizeof(*v), cmp_seq);
		for (int i = 0; i < n; i++)
			json_array_append_new(waiting, json_pack("{s:s,s:s}", "worker_id", v[i]->id,
			                                         "host", v[i]->host));
		free(v);
	}
	return json_pack("{s:s,s:I,s:s,s:i,s:i,s:i,s:b,s:o,s:o}", "job", j->name, "round",
	                 (json_int_t)j->round, "state", j->running ? "running" : "waiting",
	                 "min_np", j->cfg.min_np, "max_np", j->cfg.max_np, "settle_ms",
	                 j->cfg.settle_ms, "pending_change", pending_change(j), "members", members,
	                 "waiting", waiting);
}

static enum MHD_Result h_job(struct req *r, const struct route *rt, bool put)
{
	struct kolo_rdzv_server *s = r->s;
	char err[256];
	pthread_mutex_lock(&s->lock);
	struct job *j = job_get(s, rt->job, put);
	if (!j) {
		pthread_mutex_unlock(&s->lock);
		if (put)
			return send_error(r, 503, "too many jobs or out of memory");
		return send_error(r, 404, "unknown job %s", rt->job);
	}
	if (put) {
		struct kolo_rdzv_job_config c = j->cfg;
		if (kolo_rdzv_parse_job_config(r->body, r->len, &c, err, sizeof(err)) != KOLO_OK) {
			pthread_mutex_unlock(&s->lock);
			return send_error(r, 400, "%s", err);
		}
		j->cfg = c;
		KOLO_INFO(SUB, "job %s configured: min_np=%d max_np=%d settle_ms=%d", j->name,
		          c.min_np, c.max_np, c.settle_ms);
		job_tick(s, j, kolo_now_ms());
		timer_poke(s, job_settle_deadline(j));
	}
	json_t *o = job_status(j);
	pthread_mutex_unlock(&s->lock);
	return send_json(r, 200, o);
}

/* Places a re-registering worker at its claimed rank when the claim fits;
 * returns false when it must join afresh. */
static bool place_claim(struct job *j, struct worker *w, int64_t round, int rank, uint64_t now)
{
	if (round > j->round) {
		clear_membership(j);
		j->round = round;
		j->running = true;
		j->claimed = true;
		j->reform_now = false;
		j->dropped[0] = '\0';
	} else if (round < j->round || !j->running) {
		return false;
	}
	if (rank >= j->n_ranks) {
		struct worker **nb = realloc(j->by_rank, (size_t)(rank + 1) * sizeof(*nb));
		if (!nb)
			return false;
		for (int i = j->n_ranks; i <= rank; i++)
			nb[i] = NULL;
		j->by_rank = nb;
		j->n_ranks = rank + 1;
	}
	if (j->by_rank[rank])
		return false;
	j->by_rank[rank] = w;
	j->n_members++;
	j->last_claim_ms = now;
	w->rank = rank;
	w->commit_round = 0;
	memset(&w->slot, 0, sizeof(w->slot));
	w->slot.rank = rank;
	/* A claimed round has no settled assignment to hand out. */
	free(j->members_json);
	j->members_json = NULL;
	j->members_len = 0;
	j->claimed = true;
	return true;
}

static enum MHD_Result h_join(struct req *r, const struct route *rt)
{
	struct kolo_rdzv_server *s = r->s;
	struct kolo_rdzv_join_req jr;
	char err[256];
	if (kolo_rdzv_parse_join(r->body, r->len, &jr, err, sizeof(err)) != KOLO_OK)
		return send_error(r, 400, "%s", err);
	pthread_mutex_lock(&s->lock);
	uint64_t now = kolo_now_ms();
	struct job *j = job_get(s, rt->job, true);
	if (!j) {
		pthread_mutex_unlock(&s->lock);
		return send_error(r, 503, "too many jobs or out of memory");
	}
	struct worker *w = jr.worker_id[0] ? map_get(&j->workers, jr.worker_id) : NULL;
	if (w) {
		/* A retry of a join that already succeeded. */
		w->lease_deadline = now + (uint64_t)s->cfg.lease_ms;
	} else {
		w = calloc(1, sizeof(*w));
		if (!w)
			goto oom;
		if (jr.worker_id[0]) {
			snprintf(w->id, sizeof(w->id), "%s", jr.worker_id);
			free(map_del(&j->evicted, w->id));
		} else {
			do {
				char hex[13];
				if (kolo_random_hex(hex, 6) != KOLO_OK)
					snprintf(hex, sizeof(hex), "%012" PRIx64, j->next_seq + 1);
				snprintf(w->id, sizeof(w->id), "w-%s", hex);
			} while (map_get(&j->workers, w->id) || map_get(&j->evicted, w->id));
		}
		snprintf(w->host, sizeof(w->host), "%s", jr.host);
		w->seq = ++j->next_seq;
		w->rank = -1;
		w->lease_deadline = now + (uint64_t)s->cfg.lease_ms;
		bool ok;
		map_put(&j->workers, w->id, w, &ok);
		if (!ok) {
			free(w);
			goto oom;
		}
		j->n_workers++;
		if (jr.round > 0 && place_claim(j, w, jr.round, jr.rank, now)) {
			KOLO_INFO(SUB,
			          "job %s: worker %s@%s re-registered as rank %d of round %" PRId64,
			          j->name, w->id, w->host, jr.rank, jr.round);
		} else {
			j->last_join_ms = now;
			KOLO_DEBUG(SUB, "job %s: worker %s@%s joined (%d workers%s)", j->name,
			           w->id, w->host, j->n_workers,
			           jr.round > 0 ? "; stale claim" : "");
		}
		job_tick(s, j, now);
		timer_poke(s, KOLO_MIN(w->lease_deadline, job_settle_deadline(j)));
	}
	json_t *o = json_pack("{s:s,s:i}", "worker_id", w->id, "lease_ms", s->cfg.lease_ms);
	pthread_mutex_unlock(&s->lock);
	return send_json(r, 201, o);
oom:
	pthread_mutex_unlock(&s->lock);
	return send_error(r, 503, "out of memory");
}

/* Looks the worker up; on failure fills the 410 message. */
static struct worker *find_worker(struct kolo_rdzv_server *s, const struct route *rt,
                                  struct job **jo, char *msg, size_t size)
{
	struct job *j = job_get(s, rt->job, false);
	*jo = j;
	struct worker *w = j ? map_get(&j->workers, rt->id) : NULL;
	if (w)
		return w;
	const char *why = j ? map_get(&j->evicted, rt->id) : NULL;
	if (why)
		snprintf(msg, size, "evicted: worker %s of job %s (%s)", rt->id, rt->job, why);
	else
		snprintf(msg, size, "unknown worker %s in job %s; register again", rt->id, rt->job);
	return NULL;
}

static enum MHD_Result h_heartbeat(struct req *r, const struct route *rt)
{
	struct kolo_rdzv_server *s = r->s;
	char msg[400];
	pthread_mutex_lock(&s->lock);
	struct job *j;
	struct worker *w = find_worker(s, rt, &j, msg, sizeof(msg));
	if (!w) {
		pthread_mutex_unlock(&s->lock);
		return send_error(r, 410, "%s", msg);
	}
	w->lease_deadline = kolo_now_ms() + (uint64_t)s->cfg.lease_ms;
	json_t *o = json_pack("{s:I,s:b}", "round", (json_int_t)j->round, "pending_change",
	                      pending_change(j));
	pthread_mutex_unlock(&s->lock);
	return send_json(r, 200, o);
}

static enum MHD_Result h_leave(struct req *r, const struct route *rt)
{
	struct kolo_rdzv_server *s = r->s;
	pthread_mutex_lock(&s->lock);
	struct job *j = job_get(s, rt->job, false);
	struct worker *w = j ? map_get(&j->workers, rt->id) : NULL;
	if (w) {
		drop_worker(s, j, w, "left");
		job_tick(s, j, kolo_now_ms());
		timer_poke(s, job_settle_deadline(j));
	}
	pthread_mutex_unlock(&s->lock);
	return send_buf(r, 204, NULL, 0, false);
}

static enum MHD_Result h_failure(struct req *r, const struct route *rt)
{
	struct kolo_rdzv_server *s = r->s;
	int64_t round;
	int rank;
	char err[256];
	if (kolo_rdzv_parse_failure(r->body, r->len, &round, &rank, err, sizeof(err)) != KOLO_OK)
		return send_error(r, 400, "%s", err);
	pthread_mutex_lock(&s->lock);
	struct job *j = job_get(s, rt->job, false);
	bool acted = false;
	if (j && j->running && round == j->round) {
		struct worker *w = rank < j->n_ranks ? j->by_rank[rank] : NULL;
		if (w) {
			char why[64];
			snprintf(why, sizeof(why), "reported failed in round %" PRId64, round);
			drop_worker(s, j, w, why);
			acted = true;
		} else if (j->claimed) {
			/* A rank that never re-registered after a restart. */
			char why[64];
			snprintf(why, sizeof(why), "rank %d missing after restart", rank);
			note_dropped(j, NULL, why);
			j->reform_now = true;
			acted = true;
		}
		if (acted) {
			job_tick(s, j, kolo_now_ms());
			timer_poke(s, job_settle_deadline(j));
		}
	}
	if (!acted)
		KOLO_DEBUG(SUB, "job %s: stale failure report (round %" PRId64 " rank %d)", rt->job,
		           round, rank);
	pthread_mutex_unlock(&s->lock);
	return send_json(r, 202, json_pack("{s:b}", "accepted", acted));
}

/* Holds the request open. With lock held; never fails. */
static void hold(struct kolo_rdzv_server *s, struct req *r, struct job *j, enum wait_kind kind,
                 uint64_t deadline)
{
	r->wkind = kind;
	r->job = j;
	r->deadline = deadline;
	const union MHD_ConnectionInfo *ci =
	        MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
	r->fd = ci ? ci->connect_fd : -1;
	waiter_link(j, r);
	s->n_polls++;
	MHD_suspend_connection(r->conn);
	timer_poke(s, deadline);
}

static enum MHD_Result h_assignment(struct req *r, const struct route *rt)
{
	struct kolo_rdzv_server *s = r->s;
	int64_t after, timeout;
	if (!query_int(r->conn, "after_round", 0, 0, INT64_MAX, &after) ||
	    !query_int(r->conn, "timeout_ms", DEFAULT_POLL_MS, 0, MAX_POLL_MS, &timeout))
		return send_error(r, 400,
		                  "after_round must be an integer >= 0 and timeout_ms one in "
		                  "[0, %d]",
		                  MAX_POLL_MS);
	char msg[400];
	pthread_mutex_lock(&s->lock);
	struct job *j;
	struct worker *w = find_worker(s, rt, &j, msg, sizeof(msg));
	if (!w) {
		pthread_mutex_unlock(&s->lock);
		return send_error(r, 410, "%s", msg);
	}
	uint64_t now = kolo_now_ms();
	w->lease_deadline = now + (uint64_t)s->cfg.lease_ms;
	if (!assignment_ready(j, w, after) && w->rank >= 0 && after >= j->round &&
	    w->commit_round < after) {
		/* A member asking past its round has reached a commit point. */
		w->commit_round = after;
		job_tick(s, j, now);
		timer_poke(s, job_settle_deadline(j));
	}
	if (assignment_ready(j, w, after)) {
		size_t len = 0;
		char *b = assignment_body(j, w, &len);
		pthread_mutex_unlock(&s->lock);
		if (!b)
			return send_error(r, 500, "out of memory");
		return send_buf(r, 200, b, len, false);
	}
	if (timeout == 0 || s->stopping) {
		bool stop = s->stopping;
		pthread_mutex_unlock(&s->lock);
		if (stop)
			return send_error(r, 503, "server shutting down");
		return send_buf(r, 204, NULL, 0, false);
	}
	r->worker = w;
	w->n_polls++;
	r->after_round = after;
	hold(s, r, j, WAIT_ASSIGN, now + (uint64_t)timeout);
	pthread_mutex_unlock(&s->lock);
	return MHD_YES;
}

static void wake_kv(struct kolo_rdzv_server *s, struct job *j, const char *key,
                    const struct kv_val *v)
{
	for (struct req *r = j->waiters, *nx; r; r = nx) {
		nx = r->wnext;
		if (r->wkind != WAIT_KV || strcmp(r->key, key) != 0)
			continue;
		char *b = malloc(KOLO_MAX(v->len, 1));
		if (!b) {
			wake_error(s, r, 500, "out of memory");
			continue;
		}
		memcpy(b, v->data, v->len);
		waiter_wake(s, r, 200, b, v->len, true);
	}
}

static enum MHD_Result h_kv(struct req *r, const struct route *rt, bool put)
{
	struct kolo_rdzv_server *s = r->s;
	int64_t timeout = 0;
	if (!put && !query_int(r->conn, "timeout_ms", 0, 0, MAX_POLL_MS, &timeout))
		return send_error(r, 400, "timeout_ms must be an integer in [0, %d]", MAX_POLL_MS);
	pthread_mutex_lock(&s->lock);
	struct job *j = job_get(s, rt->job, true);
	if (!j) {
		pthread_mutex_unlock(&s->lock);
		return send_error(r, 503, "too many jobs or out of memory");
	}
	if (put) {
		struct kv_val *old = map_get(&j->kv, rt->id);
		size_t old_len = old ? old->len : 0;
		if (s->kv_bytes - old_len + r->len > KV_TOTAL_MAX) {
			pthread_mutex_unlock(&s->lock);
			return send_error(r, 507, "KV store full (%zu bytes)", KV_TOTAL_MAX);
		}
		struct kv_val *v = malloc(sizeof(*v) + r->len);
		bool ok = v != NULL;
		if (v) {
			v->len = r->len;
			if (r->len)
				memcpy(v->data, r->body, r->len);
			old = map_put(&j->kv, rt->id, v, &ok);
		}
		if (!ok) {
			free(v);
			pthread_mutex_unlock(&s->lock);
			return send_error(r, 503, "out of memory");
		}
		if (old) {
			s->kv_bytes -= old->len;
			free(old);
		} else {
			s->kv_keys++;
		}
		s->kv_bytes += v->len;
		wake_kv(s, j, rt->id, v);
		pthread_mutex_unlock(&s->lock);
		return send_buf(r, 204, NULL, 0, false);
	}
	struct kv_val *v = map_get(&j->kv, rt->id);
	if (v) {
		char *b = malloc(KOLO_MAX(v->len, 1));
		if (b)
			memcpy(b, v->data, v->len);
		size_t len = v->len;
		pthread_mutex_unlock(&s->lock);
		if (!b)
			return send_error(r, 500, "out of memory");
		return send_buf(r, 200, b, len, true);
	}
	if (timeout == 0 || s->stopping) {
		pthread_mutex_unlock(&s->lock);
		return send_error(r, 404, "no such key %s", rt->id);
	}
	snprintf(r->key, sizeof(r->key), "%s", rt->id);
	hold(s, r, j, WAIT_KV, kolo_now_ms() + (uint64_t)timeout);
	pthread_mutex_unlock(&s->lock);
	return MHD_YES;
}

static enum MHD_Result h_metrics(struct req *r)
{
	struct kolo_rdzv_server *s = r->s;
	size_t cap = 4096, o = 0;
	char *b = NULL;
	pthread_mutex_lock(&s->lock);
	cap += s->jobs.n * 2 * (KOLO_RDZV_ID_MAX + 64) + EP_COUNT * N_CODES * 96;
	b = malloc(cap);
	if (!b) {
		pthread_mutex_unlock(&s->lock);
		return send_error(r, 500, "out of memory");
	}
#define P(...) (o += (size_t)snprintf(b + o, o < cap ? cap - o : 0, __VA_ARGS__))
	P("# HELP kolo_rdzv_workers Workers registered in the job.\n"
	  "# TYPE kolo_rdzv_workers gauge\n");
	MAP_FOREACH(&s->jobs, e)
	{
		struct job *j = e->val;
		P("kolo_rdzv_workers{job=\"%s\"} %d\n", j->name, j->n_workers);
	}
	P("# HELP kolo_rdzv_round The job's current round.\n# TYPE kolo_rdzv_round gauge\n");
	MAP_FOREACH(&s->jobs, e)
	{
		struct job *j = e->val;
		P("kolo_rdzv_round{job=\"%s\"} %" PRId64 "\n", j->name, j->round);
	}
	P("# HELP kolo_rdzv_rounds_formed_total Rounds formed since start.\n"
	  "# TYPE kolo_rdzv_rounds_formed_total counter\n"
	  "kolo_rdzv_rounds_formed_total %" PRIu64 "\n",
	  s->rounds_formed);
	P("# HELP kolo_rdzv_requests_total Requests answered, by endpoint and status code.\n"
	  "# TYPE kolo_rdzv_requests_total counter\n");
	for (int ep = 0; ep < EP_COUNT; ep++) {
		for (int c = 0; c <= N_CODES; c++) {
			if (!s->requests[ep][c])
				continue;
			char code[8];
			if (c < N_CODES)
				snprintf(code, sizeof(code), "%d", codes[c]);
			else
				snprintf(code, sizeof(code), "other");
			P("kolo_rdzv_requests_total{endpoint=\"%s\",code=\"%s\"} %" PRIu64 "\n",
			  endpoint_names[ep], code, s->requests[ep][c]);
		}
	}
	P("# HELP kolo_rdzv_kv_keys Keys in the KV store.\n# TYPE kolo_rdzv_kv_keys gauge\n"
	  "kolo_rdzv_kv_keys %zu\n"
	  "# HELP kolo_rdzv_kv_bytes Bytes of values in the KV store.\n"
	  "# TYPE kolo_rdzv_kv_bytes gauge\nkolo_rdzv_kv_bytes %zu\n",
	  s->kv_keys, s->kv_bytes);
	P("# HELP kolo_rdzv_auth_failures_total Requests refused for a missing or wrong token.\n"
	  "# TYPE kolo_rdzv_auth_failures_total counter\n"
	  "kolo_rdzv_auth_failures_total %" PRIu64 "\n",
	  s->auth_failures);
	P("# HELP kolo_rdzv_long_polls Requests held open now.\n"
	  "# TYPE kolo_rdzv_long_polls gauge\nkolo_rdzv_long_polls %d\n",
	  s->n_polls);
#undef P
	pthread_mutex_unlock(&s->lock);
	if (o >= cap)
		o = cap - 1;
	struct MHD_Response *resp = MHD_create_response_from_buffer(o, b, MHD_RESPMEM_MUST_FREE);
	if (!resp) {
		free(b);
		return MHD_NO;
	}
	MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE,
	                        "text/plain; version=0.0.4; charset=utf-8");
	enum MHD_Result ret = MHD_queue_response(r->conn, 200, resp);
	MHD_destroy_response(resp);
	pthread_mutex_lock(&s->lock);
	s->requests[EP_METRICS][code_index(200)]++;
	pthread_mutex_unlock(&s->lock);
	return ret;
}

static bool authorized(struct kolo_rdzv_server *s, struct MHD_Connection *c)
{
	if (!s->token)
		return true;
	const char *h =
	        MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
	if (!h || strncasecmp(h, "Bearer ", 7) != 0)
		return false;
	return kolo_consttime_streq(h + 7, s->token);
}

static enum MHD_Result dispatch(struct req *r, const char *url, const char *method)
{
	struct route rt;
	route(url, &rt);
	r->ep = rt.ep;
	if (rt.ep == EP_HEALTHZ && method_ok(rt.ep, method))
		return send_json(r, 200, json_pack("{s:s}", "status", "ok"));
	if (rt.ep == EP_METRICS && method_ok(rt.ep, method))
		return h_metrics(r);
	if (rt.ep == EP_OTHER)
		return send_error(r, 404, "no such path %s", url);
	if (!method_ok(rt.ep, method))
		return send_error(r, 405, "method %s not allowed on %s", method, url);
	if (r->too_large)
		return send_error(r, 413, "body larger than %d bytes", KOLO_RDZV_MAX_BODY);
	if (rt.bad_job)
		return send_error(r, 400, "invalid job id: 1-%d characters of [A-Za-z0-9._:-]",
		                  KOLO_RDZV_ID_MAX - 1);
	if (rt.bad_id)
		return send_error(r, 400, "invalid %s: 1-%d characters of [A-Za-z0-9._:-%s]",
		                  rt.ep == EP_KV ? "key" : "worker id", KOLO_RDZV_ID_MAX - 1,
		                  rt.ep == EP_KV ? "/" : "");
	bool get = strcmp(method, "GET") == 0;
	switch (rt.ep) {
	case EP_JOB:
		return h_job(r, &rt, !get);
	case EP_WORKERS:
		return h_join(r, &rt);
	case EP_WORKER:
		return h_leave(r, &rt);
	case EP_ASSIGNMENT:
		return h_assignment(r, &rt);
	case EP_HEARTBEAT:
		return h_heartbeat(r, &rt);
	case EP_FAILURES:
		return h_failure(r, &rt);
	case EP_KV:
		return h_kv(r, &rt, !get);
	default:
		return send_error(r, 404, "no such path %s", url);
	}
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls)
{
	(void)version;
	struct kolo_rdzv_server *s = cls;
	struct req *r = *con_cls;
	if (!r) {
		r = calloc(1, sizeof(*r));
		if (!r)
			return MHD_NO;
		r->s = s;
		r->conn = conn;
		r->fd = -1;
		*con_cls = r;
		pthread_mutex_lock(&s->lock);
		s->inflight++;
		r->counted = true;
		bool stopping = s->stopping;
		pthread_mutex_unlock(&s->lock);
		struct route rt;
		route(url, &rt);
		r->ep = rt.ep;
		if (stopping)
			return send_error(r, 503, "server shutting down");
		if (rt.v1 && !authorized(s, conn)) {
			pthread_mutex_lock(&s->lock);
			s->auth_failures++;
			pthread_mutex_unlock(&s->lock);
			return send_error(r, 401, "missing or wrong bearer token");
		}
		const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
		                                             MHD_HTTP_HEADER_CONTENT_LENGTH);
		if (cl && strtoull(cl, NULL, 10) > KOLO_RDZV_MAX_BODY) {
			/* A client that waits for "100 Continue" gets the refusal before
			 * it sends the body; any other would see its connection reset
			 * while still sending, so its body is read and dropped first. */
			const char *ex = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
			                                             MHD_HTTP_HEADER_EXPECT);
			if (ex && strcasecmp(ex, "100-continue") == 0)
				return send_error(r, 413, "body larger than %d bytes",
				                  KOLO_RDZV_MAX_BODY);
			r->too_large = true;
		}
		return MHD_YES;
	}
	if (*upload_data_size) {
		size_t n = *upload_data_size;
		*upload_data_size = 0;
		if (r->too_large || r->len + n > KOLO_RDZV_MAX_BODY) {
			r->too_large = true;
			r->discarded += n;
			/* Past this, stop reading: the connection is closed. */
			return r->discarded > DISCARD_MAX ? MHD_NO : MHD_YES;
		}
		if (r->len + n + 1 > r->cap) {
			size_t cap = KOLO_MAX(r->cap * 2, r->len + n + 1);
			cap = KOLO_MAX(cap, (size_t)1024);
			char *nb = realloc(r->body, cap);
			if (!nb)
				return MHD_NO;
			r->body = nb;
			r->cap = cap;
		}
		memcpy(r->body + r->len, upload_data, n);
		r->len += n;
		r->body[r->len] = '\0';
		return MHD_YES;
	}
	if (r->gone)
		return MHD_NO;
	if (r->ready) {
		char *b = r->resp;
		r->resp = NULL;
		r->ready = false;
		return send_buf(r, r->code, b, r->resp_len, r->binary);
	}
	return dispatch(r, url, method);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
	(void)conn;
	(void)toe;
	struct kolo_rdzv_server *s = cls;
	struct req *r = *con_cls;
	if (!r)
		return;
	*con_cls = NULL;
	pthread_mutex_lock(&s->lock);
	waiter_unlink(s, r);
	if (r->counted && --s->inflight == 0)
		pthread_cond_broadcast(&s->idle_cond);
	pthread_mutex_unlock(&s->lock);
	free(r->resp);
	free(r->body);
	free(r);
}

/* libmicrohttpd's MHD_LogCallback: fmt is its own format string. */
static void mhd_log(void *cls, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
	(void)cls;
	if (!kolo_log_enabled(KOLO_LOG_DEBUG, SUB))
		return;
	char msg[512];
	vsnprintf(msg, sizeof(msg), fmt, ap);
	size_t n = strlen(msg);
	while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r'))
		msg[--n] = '\0';
	KOLO_DEBUG(SUB, "microhttpd: %s", msg);
}

static int hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/* Percent-decoding that leaves "%00" as it is, so that a NUL can never cut
 * an id or key short: the '%' then fails validation. */
static size_t unescape(void *cls, struct MHD_Connection *c, char *s)
{
	(void)cls;
	(void)c;
	char *w = s;
	for (char *r = s; *r; r++) {
		int hi, lo;
		if (r[0] == '%' && (hi = hexval(r[1])) >= 0 && (lo = hexval(r[2])) >= 0 &&
		    (hi | lo) != 0) {
			*w++ = (char)(hi * 16 + lo);
			r += 2;
		} else {
			*w++ = *r;
		}
	}
	*w = '\0';
	return (size_t)(w - s);
}

/* ---- lifecycle -------------------------------------------------------- */

/* Runs the daemon. Not libmicrohttpd's own polling thread: in 0.9.75 it
 * drains epoll in batches of 128 events, every epoll_wait with the timeout
 * computed before the first, so when the events come in an exact multiple of
 * 128 (255 resumed polls re-entering the epoll set plus one request, say)
 * the last call blocks with connections already marked ready, until an
 * unrelated event or an idle timeout. MHD_run never blocks, and
 * MHD_get_timeout is 0 while a connection has work pending. */
static void *http_main(void *arg)
{
	struct kolo_rdzv_server *s = arg;
	const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_EPOLL_FD);
	struct pollfd p[2] = {{.fd = di ? di->epoll_fd : -1, .events = POLLIN},
	                      {.fd = s->wake_fd, .events = POLLIN}};
	while (!atomic_load(&s->http_stop)) {
		MHD_UNSIGNED_LONG_LONG t;
		int ms = -1;
		if (MHD_get_timeout(s->d, &t) == MHD_YES)
			ms = (int)KOLO_MIN(t, (MHD_UNSIGNED_LONG_LONG)INT_MAX);
		if (poll(p, 2, ms) < 0 && errno != EINTR) {
			KOLO_ERROR(SUB, "poll: %s", strerror(errno));
			break;
		}
		uint64_t v;
		ssize_t n = p[1].revents ? read(s->wake_fd, &v, sizeof(v)) : 0;
		(void)n; /* drained before MHD_run, so no wake-up is lost */
		MHD_run(s->d);
	}
	return NULL;
}

static kolo_status_t open_listener(const char *listen_addr, int *fd_out, int *port_out,
                                   struct kolo_errbuf *eb)
{
	char host[256];
	const char *colon = strrchr(listen_addr, ':');
	if (!colon || colon == listen_addr || (size_t)(colon - listen_addr) >= sizeof(host))
		return kolo_fail(eb, KOLO_EINVAL, "listen address \"%s\" is not HOST:PORT",
		                 listen_addr);
	size_t hl = (size_t)(colon - listen_addr);
	memcpy(host, listen_addr, hl);
	host[hl] = '\0';
	if (host[0] == '[' && hl > 2 && host[hl - 1] == ']') {
		memmove(host, host + 1, hl - 2);
		host[hl - 2] = '\0';
	}
	char *end;
	long port = strtol(colon + 1, &end, 10);
	if (*end || end == colon + 1 || port < 0 || port > 65535)
		return kolo_fail(eb, KOLO_EINVAL, "bad port in listen address \"%s\"", listen_addr);
	struct addrinfo hints = {.ai_family = AF_UNSPEC,
	                         .ai_socktype = SOCK_STREAM,
	                         .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
	struct addrinfo *ai = NULL;
	int rc = getaddrinfo(host[0] && strcmp(host, "*") ? host : NULL, colon + 1, &hints, &ai);
	if (rc != 0)
		return kolo_fail(eb, KOLO_EINVAL, "cannot resolve listen host \"%s\": %s", host,
		                 gai_strerror(rc));
	int fd = -1;
	int err = 0;
	for (struct addrinfo *a = ai; a; a = a->ai_next) {
		fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
		if (fd < 0) {
			err = errno;
			continue;
		}
		int one = 1;
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 4096) == 0)
			break;
		err = errno;
		close(fd);
		fd = -1;
	}
	freeaddrinfo(ai);
	if (fd < 0)
		return kolo_fail(eb, KOLO_ESYSTEM, "cannot listen on %s: %s", listen_addr,
		                 strerror(err));
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	if (getsockname(fd, (struct sockaddr *)&ss, &sl) != 0) {
		close(fd);
		return kolo_fail(eb, KOLO_ESYSTEM, "getsockname: %s", strerror(errno));
	}
	*port_out = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
	                                     : ntohs(((struct sockaddr_in *)&ss)->sin_port);
	*fd_out = fd;
	return KOLO_OK;
}

kolo_status_t kolo_rdzv_server_start(const struct kolo_rdzv_server_config *cfg,
                                     struct kolo_rdzv_server **out, struct kolo_errbuf *eb)
{
	*out = NULL;
	struct kolo_rdzv_server *s = calloc(1, sizeof(*s));
	if (!s)
		return kolo_fail(eb, KOLO_ENOMEM, "out of memory");
	s->cfg = *cfg;
	s->cfg.listen = NULL;
	s->cfg.token = NULL;
	if (s->cfg.lease_ms <= 0)
		s->cfg.lease_ms = 10000;
	s->listen_fd = -1;
	s->wake_fd = -1;
	atomic_init(&s->http_stop, false);
	kolo_status_t st;
	pthread_mutex_init(&s->lock, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&s->cond, &ca);
	pthread_cond_init(&s->idle_cond, &ca);
	pthread_condattr_destroy(&ca);
	if (cfg->token && cfg->token[0] && !(s->token = strdup(cfg->token))) {
		st = kolo_fail(eb, KOLO_ENOMEM, "out of memory");
		goto fail;
	}
	s->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (s->wake_fd < 0) {
		st = kolo_fail(eb, KOLO_ESYSTEM, "eventfd: %s", strerror(errno));
		goto fail;
	}
	st = open_listener(cfg->listen && *cfg->listen ? cfg->listen : "0.0.0.0:29470",
	                   &s->listen_fd, &s->port, eb);
	if (st != KOLO_OK)
		goto fail;
	s->d = MHD_start_daemon(MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG, 0,
	                        NULL, NULL, on_request, s, MHD_OPTION_EXTERNAL_LOGGER, mhd_log,
	                        NULL, MHD_OPTION_UNESCAPE_CALLBACK, unescape, NULL,
	                        MHD_OPTION_LISTEN_SOCKET, s->listen_fd, MHD_OPTION_CONNECTION_LIMIT,
	                        (unsigned)16384, MHD_OPTION_CONNECTION_TIMEOUT,
	                        (unsigned)IDLE_TIMEOUT_S, MHD_OPTION_NOTIFY_COMPLETED, on_completed,
	                        s, MHD_OPTION_END);
	if (!s->d) {
		st = kolo_fail(eb, KOLO_ESYSTEM, "cannot start the HTTP daemon");
		goto fail;
	}
	if (pthread_create(&s->http, NULL, http_main, s) != 0) {
		st = kolo_fail(eb, KOLO_ESYSTEM, "cannot start the HTTP thread");
		goto fail;
	}
	s->http_started = true;
	if (pthread_create(&s->timer, NULL, timer_main, s) != 0) {
		st = kolo_fail(eb, KOLO_ESYSTEM, "cannot start the timer thread");
		goto fail;
	}
	s->timer_started = true;
	KOLO_INFO(SUB,
	          "serving on port %d (auth %s; defaults min_np=%d max_np=%d settle_ms=%d "
	          "lease_ms=%d)",
	          s->port, s->token ? "on" : "off", cfg->min_np, cfg->max_np, cfg->settle_ms,
	          s->cfg.lease_ms);
	*out = s;
	return KOLO_OK;
fail:
	kolo_rdzv_server_stop(s);
	return st;
}

int kolo_rdzv_server_port(const struct kolo_rdzv_server *s)
{
	return s ? s->port : -1;
}

void kolo_rdzv_server_stop(struct kolo_rdzv_server *s)
{
	if (!s)
		return;
	pthread_mutex_lock(&s->lock);
	s->stopping = true;
	MAP_FOREACH(&s->jobs, e)
	{
		struct job *j = e->val;
		while (j->waiters)
			wake_error(s, j->waiters, 503, "server shutting down");
	}
	pthread_cond_broadcast(&s->cond);
	pthread_mutex_unlock(&s->lock);
	if (s->timer_started)
		pthread_join(s->timer, NULL);
	if (s->d) {
		/* After quiescing, the listening socket is ours to close;
		 * otherwise MHD_stop_daemon closes it. */
		MHD_socket lfd = MHD_quiesce_daemon(s->d);
		s->listen_fd = lfd != MHD_INVALID_SOCKET ? lfd : -1;
		/* Let requests in flight, and the long polls just answered, finish. */
		pthread_mutex_lock(&s->lock);
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		ts.tv_sec += STOP_GRACE_MS / 1000;
		while (s->inflight > 0) {
			if (pthread_cond_timedwait(&s->idle_cond, &s->lock, &ts) == ETIMEDOUT)
				break;
		}
		pthread_mutex_unlock(&s->lock);
	}
	if (s->http_started) {
		atomic_store(&s->http_stop, true);
		uint64_t one = 1;
		ssize_t n = write(s->wake_fd, &one, sizeof(one));
		(void)n;
		pthread_join(s->http, NULL);
	}
	if (s->d)
		MHD_stop_daemon(s->d);
	if (s->listen_fd >= 0)
		close(s->listen_fd);
	if (s->wake_fd >= 0)
		close(s->wake_fd);
	map_fini(&s->jobs, free_job);
	free(s->token);
	pthread_cond_destroy(&s->cond);
	pthread_cond_destroy(&s->idle_cond);
	pthread_mutex_destroy(&s->lock);
	free(s);
}
