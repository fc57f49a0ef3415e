/* server_state: a job's rounds, claims and leases. No locks and no clock:
 * the caller holds the server's lock and passes `now`, so round formation
 * can be driven by a fake clock (server_state_test.c). The only calls out
 * are to the long-poll registry, to answer polls a change decided; they do
 * nothing when no poll is held. */
#include "server_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ROUND_LOG_NAMES   8   /* workers named in a round's added=[...] */
#define WAIT_LOG_NAMES    10  /* workers named in a waiting job's joined=[...] */
#define MEMBER_JSON_EXTRA 64  /* {"rank":,"worker_id":"","host":"","zone":""} around the strings */
#define ASSIGN_HEAD_MAX   256 /* {"round":...,"members": before the members array */
#define DROPPED_ROOM      80  /* room left in dropped[] for an entry or ", ..." */
#define MORE_ROOM         32  /* room for ", ... N more" */

static const char *job_state_name(enum rdzv_job_state st)
{
	static const char *const names[] = {
	        [RDZV_JOB_WAITING] = "waiting",
	        [RDZV_JOB_RUNNING] = "running",
	        [RDZV_JOB_RESTORED] = "restored",
	        [RDZV_JOB_BROKEN] = "broken",
	};
	return names[st];
}

/* The one place a job's state changes. */
static void job_enter(struct rdzv_job *j, enum rdzv_job_state to, const char *why)
{
	if (j->state != to)
		KOLO_TRACE(RDZV_SUB, "job %s: %s -> %s (%s)", j->name, job_state_name(j->state),
		           job_state_name(to), why);
	j->state = to;
}

static bool job_has_round(const struct rdzv_job *j)
{
	return j->state != RDZV_JOB_WAITING;
}

const char *rdzv_job_state_word(const struct rdzv_job *j)
{
	if (j->finished)
		return "finished";
	return job_has_round(j) ? "running" : "waiting";
}

char *rdzv_job_assignment_body(const struct rdzv_job *j, const struct rdzv_worker *w, size_t *len)
{
	size_t cap = j->members_len + ASSIGN_HEAD_MAX;
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

bool rdzv_job_assignment_ready(const struct rdzv_job *j, const struct rdzv_worker *w,
                               int64_t after_round)
{
	return j->state == RDZV_JOB_RUNNING && w->rank >= 0 && j->round > after_round &&
	       j->members_json;
}

static int cmp_join_order(const void *a, const void *b)
{
	const struct rdzv_worker *x = *(struct rdzv_worker *const *)a;
	const struct rdzv_worker *y = *(struct rdzv_worker *const *)b;
	return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* Appends the workers without a rank to v[*n], oldest first. */
static void append_waiting(const struct rdzv_job *j, struct rdzv_worker **v, int *n)
{
	int first = *n;
	KOLO_STRMAP_FOREACH(&j->workers, e)
	{
		struct rdzv_worker *w = e->val;
		if (w->rank < 0)
			v[(*n)++] = w;
	}
	qsort(v + first, (size_t)(*n - first), sizeof(*v), cmp_join_order);
}

struct rdzv_worker **rdzv_job_waiting_workers(const struct rdzv_job *j, int *n)
{
	struct rdzv_worker **v = malloc((size_t)KOLO_MAX(j->n_workers, 1) * sizeof(*v));
	*n = 0;
	if (v)
		append_waiting(j, v, n);
	return v;
}

/* All live workers, ordered: current members by rank, then the others by
 * join order. Returns a malloc'd array of j->n_workers. */
static struct rdzv_worker **ranked_workers(const struct rdzv_job *j)
{
	struct rdzv_worker **v = malloc((size_t)KOLO_MAX(j->n_workers, 1) * sizeof(*v));
	if (!v)
		return NULL;
	int n = 0;
	for (int r = 0; r < j->n_ranks; r++) {
		if (j->by_rank[r])
			v[n++] = j->by_rank[r];
	}
	append_waiting(j, v, &n);
	return v;
}

static void clear_membership(struct rdzv_job *j)
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

static void forget_dropped(struct rdzv_job *j)
{
	j->dropped[0] = '\0';
	j->n_evicted_since_round = 0;
	j->n_lost_zones = 0;
}

/* v: the members (n_members of them, by rank), then the waiting workers in
 * join order. When seats are short (max_np), a lost member's place goes
 * first to the oldest waiting worker of its zone: each such worker moves to
 * the front of the waiting ones, in the order the members were lost. */
static void spares_by_zone(const struct rdzv_job *j, struct rdzv_worker **v)
{
	if (j->cfg.max_np <= 0 || j->n_workers <= j->cfg.max_np)
		return;
	int next = j->n_members; /* the first waiting worker not placed yet */
	for (int z = 0; z < j->n_lost_zones && next < j->n_workers; z++) {
		for (int i = next; i < j->n_workers; i++) {
			if (strcmp(v[i]->zone, j->lost_zones[z]) != 0)
				continue;
			struct rdzv_worker *w = v[i];
			memmove(v + next + 1, v + next, (size_t)(i - next) * sizeof(*v));
			v[next++] = w;
			break;
		}
	}
}

/* "id@host, ..." of the workers of v[0..n) new in this round, for the log. */
static void round_added_text(struct rdzv_worker *const *v, int n, char *out, size_t size)
{
	size_t o = 0;
	int n_added = 0;
	out[0] = '\0';
	for (int i = 0; i < n; i++) {
		if (v[i]->rank >= 0)
			continue;
		if (n_added < ROUND_LOG_NAMES && o < size)
			o += (size_t)snprintf(out + o, size - o, "%s%s@%s", n_added ? ", " : "",
			                      v[i]->id, v[i]->host);
		n_added++;
	}
	if (n_added > ROUND_LOG_NAMES && o < size)
		snprintf(out + o, size - o, ", ... %d more", n_added - ROUND_LOG_NAMES);
}

/* The members array of a round, written into mj (cap bytes); its length. */
static size_t round_members_json(struct rdzv_worker *const *by_rank, int n, char *mj, size_t cap)
{
	size_t o = 0;
	mj[o++] = '[';
	for (int r = 0; r < n; r++) {
		const struct rdzv_worker *w = by_rank[r];
		o += (size_t)snprintf(mj + o, cap - o,
		                      "%s{\"rank\":%d,\"worker_id\":\"%s\",\"host\":\"%s\"%s%s%s}",
		                      r ? "," : "", r, w->id, w->host,
		                      w->zone[0] ? ",\"zone\":\"" : "", w->zone,
		                      w->zone[0] ? "\"" : "");
	}
	mj[o++] = ']';
	mj[o] = '\0';
	return o;
}

/* " in Z zones" when a member of by_rank[0..n) has a zone (a zone's ranks
 * are contiguous, so Z counts the changes of zone along the ranks), else "". */
static void round_zones_text(struct rdzv_worker *const *by_rank, int n, char *out, size_t size)
{
	int n_zones = 1;
	bool any = false;
	for (int r = 0; r < n; r++) {
		any = any || by_rank[r]->zone[0];
		n_zones += r > 0 && strcmp(by_rank[r]->zone, by_rank[r - 1]->zone) != 0;
	}
	if (any)
		snprintf(out, size, " in %d zones", n_zones);
	else
		out[0] = '\0';
}

/* Installs the round whose members are v[0..n) with these slots. */
static void round_install(struct rdzv_state *st, struct rdzv_job *j, struct rdzv_worker **v, int n,
                          const struct kolo_rdzv_slot *slots, struct rdzv_worker **by_rank,
                          char *mj, size_t mj_cap)
{
	char added[512];
	round_added_text(v, n, added, sizeof(added));
	clear_membership(j);
	for (int i = 0; i < n; i++) {
		v[i]->slot = slots[i];
		v[i]->rank = slots[i].rank;
		v[i]->commit_round = 0;
		by_rank[slots[i].rank] = v[i];
	}
	j->by_rank = by_rank;
	j->n_ranks = j->n_members = n;
	j->members_json = mj;
	j->members_len = round_members_json(by_rank, n, mj, mj_cap);
	j->round++;
	job_enter(j, RDZV_JOB_RUNNING, "round formed");
	st->rounds_formed++;
	int n_hosts = 0;
	for (int i = 0; i < n; i++)
		n_hosts += slots[i].local_rank == 0;
	char zones[64];
	round_zones_text(by_rank, n, zones, sizeof(zones));
	KOLO_INFO(RDZV_SUB,
	          "job %s round %" PRId64 " formed: %d workers on %d hosts%s, rank 0 = %s@%s; "
	          "added=[%s]; dropped=[%s]; waiting=%d",
	          j->name, j->round, n, n_hosts, zones, by_rank[0]->id, by_rank[0]->host, added,
	          j->dropped, j->n_workers - n);
	forget_dropped(j);
}

static void form_round(struct rdzv_state *st, struct rdzv_job *j)
{
	struct rdzv_worker **v = ranked_workers(j);
	if (v)
		spares_by_zone(j, v);
	int n = j->n_workers;
	if (j->cfg.max_np > 0 && n > j->cfg.max_np)
		n = j->cfg.max_np;
	size_t n_alloc = (size_t)KOLO_MAX(n, 1);
	const char **hosts = malloc(n_alloc * sizeof(*hosts));
	const char **zones = malloc(n_alloc * sizeof(*zones));
	struct kolo_rdzv_slot *slots = calloc(n_alloc, sizeof(*slots));
	struct rdzv_worker **by_rank = calloc(n_alloc, sizeof(*by_rank));
	size_t mj_cap =
	        (size_t)n * (KOLO_RDZV_ID_MAX + 2 * KOLO_RDZV_HOST_MAX + MEMBER_JSON_EXTRA) + 4;
	char *mj = malloc(mj_cap);
	bool ok = v && hosts && zones && slots && by_rank && mj;
	for (int i = 0; ok && i < n; i++) {
		hosts[i] = v[i]->host;
		zones[i] = v[i]->zone;
	}
	ok = ok && kolo_rdzv_assign_zoned(hosts, zones, n, slots) == KOLO_OK;
	if (ok) {
		round_install(st, j, v, n, slots, by_rank, mj, mj_cap);
	} else {
		KOLO_ERROR(RDZV_SUB, "job %s: out of memory forming a round", j->name);
		free(by_rank);
		free(mj);
	}
	free(v);
	free(hosts);
	free(zones);
	free(slots);
	if (ok)
		rdzv_wait_wake_assignments(j);
}

static bool settle_due(const struct rdzv_job *j, uint64_t now)
{
	return (j->cfg.max_np > 0 && j->n_workers >= j->cfg.max_np) ||
	       now >= j->last_join_ms + (uint64_t)j->cfg.settle_ms;
}

bool rdzv_job_pending_change(const struct rdzv_job *j)
{
	int waiting = j->n_workers - j->n_members;
	return !j->finished && job_has_round(j) && waiting > 0 &&
	       (j->cfg.max_np == 0 || j->n_members < j->cfg.max_np);
}

static bool members_at_commit(const struct rdzv_job *j)
{
	for (int r = 0; r < j->n_ranks; r++) {
		if (j->by_rank[r] && j->by_rank[r]->commit_round < j->round)
			return false;
	}
	return true;
}

static bool enough_workers(const struct rdzv_job *j)
{
	return j->n_workers >= j->cfg.min_np && j->n_workers > 0;
}

/* A round rebuilt from claims after a restart re-forms once every member
 * that came back asks past it and no claim arrived for settle_ms: its members
 * may have been re-forming when the server went away, and the ones that did
 * not come back will never answer. */
static bool restored_round_waits_for_settle(const struct rdzv_job *j)
{
	return j->state == RDZV_JOB_RESTORED && j->n_members > 0 && members_at_commit(j);
}

/* A round lost a member: re-form at once, or wait below min_np. */
static void tick_broken(struct rdzv_state *st, struct rdzv_job *j, uint64_t now)
{
	if (enough_workers(j)) {
		form_round(st, j);
		return;
	}
	/* Members that all left gracefully are a job finishing (or shrinking by
	 * choice), not a failure: say so quietly. */
	if (j->n_evicted_since_round == 0)
		KOLO_INFO(RDZV_SUB,
		          "job %s round %" PRId64 " ended: %d workers remain, fewer "
		          "than min_np %d; dropped=[%s]",
		          j->name, j->round, j->n_workers, j->cfg.min_np, j->dropped);
	else
		KOLO_WARN(RDZV_SUB,
		          "job %s round %" PRId64 ": %d workers left, below min_np %d; "
		          "waiting; dropped=[%s]",
		          j->name, j->round, j->n_workers, j->cfg.min_np, j->dropped);
	forget_dropped(j);
	clear_membership(j);
	job_enter(j, RDZV_JOB_WAITING, "below min_np");
	j->last_wait_log_ms = now;
}

void rdzv_job_tick(struct rdzv_state *st, struct rdzv_job *j, uint64_t now)
{
	if (j->finished) {
		/* The members left are finishing too: no round forms. */
		if (j->state == RDZV_JOB_BROKEN) {
			forget_dropped(j);
			clear_membership(j);
			job_enter(j, RDZV_JOB_WAITING, "finished");
		}
		return;
	}
	switch (j->state) {
	case RDZV_JOB_BROKEN:
		tick_broken(st, j, now);
		break;
	case RDZV_JOB_WAITING:
		if (enough_workers(j) && settle_due(j, now))
			form_round(st, j);
		break;
	case RDZV_JOB_RUNNING:
	case RDZV_JOB_RESTORED:
		if (rdzv_job_pending_change(j) && members_at_commit(j) && settle_due(j, now))
			form_round(st, j);
		else if (restored_round_waits_for_settle(j) &&
		         now >= j->last_claim_ms + (uint64_t)j->cfg.settle_ms)
			form_round(st, j);
		else if (j->state == RDZV_JOB_RUNNING && !rdzv_job_pending_change(j) &&
		         members_at_commit(j))
			/* Every member asks past the round and none was reported:
			 * the round ended by a failure that found nobody dead (a
			 * timeout among live ranks). The same workers, with spares
			 * in any room, form the next; nothing else would. */
			form_round(st, j);
		break;
	}
}

uint64_t rdzv_job_settle_deadline(const struct rdzv_job *j)
{
	if (j->finished)
		return UINT64_MAX;
	bool want = (!job_has_round(j) && enough_workers(j)) ||
	            (rdzv_job_pending_change(j) && members_at_commit(j));
	uint64_t d = want ? j->last_join_ms + (uint64_t)j->cfg.settle_ms : UINT64_MAX;
	if (restored_round_waits_for_settle(j))
		d = KOLO_MIN(d, j->last_claim_ms + (uint64_t)j->cfg.settle_ms);
	return d;
}

static void note_dropped(struct rdzv_job *j, const struct rdzv_worker *w, const char *why)
{
	size_t o = strlen(j->dropped);
	if (o + DROPPED_ROOM >= sizeof(j->dropped)) {
		if (!strstr(j->dropped, "..."))
			snprintf(j->dropped + o, sizeof(j->dropped) - o, ", ...");
		return;
	}
	snprintf(j->dropped + o, sizeof(j->dropped) - o, "%s%s@%s (%s)", o ? ", " : "",
	         w ? w->id : "?", w ? w->host : "?", why);
}

static void remember_evicted(struct rdzv_job *j, const char *id, const char *why)
{
	if (j->evicted.n >= RDZV_EVICTED_MAX) {
		/* Forget an arbitrary old entry: the answer then says "unknown
		 * worker", and such a worker joins afresh. */
		free(kolo_strmap_del(&j->evicted, kolo_strmap_any_key(&j->evicted)));
	}
	char *reason = strdup(why);
	bool ok;
	if (reason)
		free(kolo_strmap_put(&j->evicted, id, reason, &ok));
	if (reason && !ok)
		free(reason);
}

void rdzv_job_drop(struct rdzv_job *j, struct rdzv_worker *w, const char *why, bool evicted)
{
	char msg[160];
	snprintf(msg, sizeof(msg), "evicted: %s", why);
	rdzv_wait_evict(j, w, j->finished ? j->finished_text : msg);
	if (w->rank >= 0 && w->rank < j->n_ranks && j->by_rank[w->rank] == w) {
		j->by_rank[w->rank] = NULL;
		j->n_members--;
		if (w->zone[0] && j->n_lost_zones < RDZV_LOST_ZONES)
			snprintf(j->lost_zones[j->n_lost_zones++], KOLO_RDZV_HOST_MAX, "%s",
			         w->zone);
		if (job_has_round(j))
			job_enter(j, RDZV_JOB_BROKEN, "member dropped");
	}
	note_dropped(j, w, why);
	j->n_evicted_since_round += evicted;
	/* Evictions are news; leaves are summed up in the next round's line. */
	kolo_log(evicted ? KOLO_LOG_INFO : KOLO_LOG_DEBUG, RDZV_SUB,
	         "job %s: worker %s@%s dropped (%s)", j->name, w->id, w->host, why);
	remember_evicted(j, w->id, why);
	kolo_strmap_del(&j->workers, w->id);
	j->n_workers--;
	free(w);
}

bool rdzv_job_report_failure(struct rdzv_state *st, struct rdzv_job *j, int64_t round, int rank,
                             uint64_t now)
{
	if (!job_has_round(j) || round != j->round)
		return false;
	char why[64];
	struct rdzv_worker *w = rank < j->n_ranks ? j->by_rank[rank] : NULL;
	if (w) {
		snprintf(why, sizeof(why), "reported failed in round %" PRId64, round);
		rdzv_job_drop(j, w, why, true);
	} else if (j->state == RDZV_JOB_RESTORED) {
		/* A rank that never re-registered after a restart. */
		snprintf(why, sizeof(why), "rank %d missing after restart", rank);
		note_dropped(j, NULL, why);
		job_enter(j, RDZV_JOB_BROKEN, "rank missing after restart");
	} else {
		return false;
	}
	rdzv_job_tick(st, j, now);
	return true;
}

/* An id names one registration of one process: a worker that joins again
 * after an eviction gets a new id, and one that re-registers after a server
 * restart keeps its own. So, unlike a rank, an id cannot have passed to
 * another worker, and the report is never stale for the worker it finds. */
bool rdzv_job_report_dead(struct rdzv_state *st, struct rdzv_job *j, const char *id, uint64_t now)
{
	struct rdzv_worker *w = kolo_strmap_get(&j->workers, id);
	if (!w)
		return false;
	if (j->finished)
		j->finished_ms = now;
	rdzv_job_drop(j, w, "its process died", true);
	rdzv_job_tick(st, j, now);
	return true;
}

uint64_t rdzv_job_expire_leases(struct rdzv_job *j, uint64_t now)
{
	uint64_t next = UINT64_MAX;
	bool again = true;
	while (again) {
		again = false;
		KOLO_STRMAP_FOREACH(&j->workers, e)
		{
			struct rdzv_worker *w = e->val;
			if (w->n_polls > 0)
				continue;
			if (w->lease_deadline <= now) {
				if (j->finished)
					j->finished_ms = now;
				rdzv_job_drop(j, w, "lease expired", true);
				again = true; /* the map changed under us */
				break;
			}
			next = KOLO_MIN(next, w->lease_deadline);
		}
	}
	return next;
}

static void log_waiting_line(const struct rdzv_job *j)
{
	/* The oldest few, in join order. */
	char joined[600];
	size_t o = 0;
	joined[0] = '\0';
	struct rdzv_worker **v = ranked_workers(j);
	for (int i = 0; v && i < j->n_workers && i < WAIT_LOG_NAMES; i++) {
		int n = snprintf(joined + o, sizeof(joined) - o, "%s%s@%s", i ? ", " : "", v[i]->id,
		                 v[i]->host);
		if (n < 0 || (size_t)n >= sizeof(joined) - o)
			break;
		o += (size_t)n;
	}
	if (j->n_workers > WAIT_LOG_NAMES && o + MORE_ROOM < sizeof(joined))
		snprintf(joined + o, sizeof(joined) - o, ", ... %d more",
		         j->n_workers - WAIT_LOG_NAMES);
	free(v);
	char of[32] = "";
	if (j->cfg.max_np)
		snprintf(of, sizeof(of), "/%d", j->cfg.max_np);
	KOLO_INFO(RDZV_SUB,
	          "job %s round %" PRId64 ": waiting for %d%s workers (min %d); joined=[%s]",
	          j->name, j->round + 1, j->n_workers, of, j->cfg.min_np, joined);
}

uint64_t rdzv_job_log_waiting(struct rdzv_job *j, uint64_t now)
{
	if (job_has_round(j) || j->n_workers == 0)
		return UINT64_MAX;
	if (now >= j->last_wait_log_ms + RDZV_WAIT_LOG_MS) {
		j->last_wait_log_ms = now;
		log_waiting_line(j);
	}
	return j->last_wait_log_ms + RDZV_WAIT_LOG_MS;
}

/* Places a re-registering worker at its claimed rank when the claim fits;
 * returns false when it must join afresh. */
static bool place_claim(struct rdzv_job *j, struct rdzv_worker *w, int64_t round, int rank,
                        uint64_t now)
{
	if (round > j->round) {
		clear_membership(j);
		j->round = round;
		job_enter(j, RDZV_JOB_RESTORED, "claim on a newer round");
		forget_dropped(j);
	} else if (round < j->round || !job_has_round(j)) {
		return false;
	}
	if (rank >= j->n_ranks) {
		struct rdzv_worker **nb = realloc(j->by_rank, (size_t)(rank + 1) * sizeof(*nb));
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
	/* A restored round has no settled assignment to hand out. */
	free(j->members_json);
	j->members_json = NULL;
	j->members_len = 0;
	job_enter(j, RDZV_JOB_RESTORED, "claim placed");
	return true;
}

/* A new worker with the id asked for, or a fresh unique one. */
static struct rdzv_worker *new_worker(struct rdzv_state *st, struct rdzv_job *j,
                                      const struct kolo_rdzv_join_req *jr, uint64_t now)
{
	struct rdzv_worker *w = calloc(1, sizeof(*w));
	if (!w)
		return NULL;
	if (jr->worker_id[0]) {
		snprintf(w->id, sizeof(w->id), "%s", jr->worker_id);
		free(kolo_strmap_del(&j->evicted, w->id));
	} else {
		do {
			char hex[13];
			if (kolo_random_hex(hex, 6) != KOLO_OK)
				snprintf(hex, sizeof(hex), "%012" PRIx64, j->next_seq + 1);
			snprintf(w->id, sizeof(w->id), "w-%s", hex);
		} while (kolo_strmap_get(&j->workers, w->id) ||
		         kolo_strmap_get(&j->evicted, w->id));
	}
	snprintf(w->host, sizeof(w->host), "%s", jr->host);
	snprintf(w->zone, sizeof(w->zone), "%s", jr->zone);
	w->seq = ++j->next_seq;
	w->rank = -1;
	w->lease_deadline = now + (uint64_t)st->cfg.lease_ms;
	bool ok;
	kolo_strmap_put(&j->workers, w->id, w, &ok);
	if (!ok) {
		free(w);
		return NULL;
	}
	j->n_workers++;
	return w;
}

struct rdzv_worker *rdzv_job_join(struct rdzv_state *st, struct rdzv_job *j,
                                  const struct kolo_rdzv_join_req *jr, uint64_t now, bool *retry)
{
	struct rdzv_worker *w =
	        jr->worker_id[0] ? kolo_strmap_get(&j->workers, jr->worker_id) : NULL;
	*retry = w != NULL;
	if (w) {
		/* A retry of a join that already succeeded. */
		w->lease_deadline = now + (uint64_t)st->cfg.lease_ms;
		return w;
	}
	w = new_worker(st, j, jr, now);
	if (!w)
		return NULL;
	if (jr->round > 0 && place_claim(j, w, jr->round, jr->rank, now)) {
		KOLO_INFO(RDZV_SUB,
		          "job %s: worker %s@%s re-registered as rank %d of round %" PRId64,
		          j->name, w->id, w->host, jr->rank, jr->round);
	} else {
		j->last_join_ms = now;
		KOLO_DEBUG(RDZV_SUB, "job %s: worker %s@%s joined (%d workers%s)", j->name, w->id,
		           w->host, j->n_workers, jr->round > 0 ? "; stale claim" : "");
	}
	rdzv_job_tick(st, j, now);
	return w;
}

struct rdzv_worker *rdzv_job_find_worker(struct rdzv_job *j, const char *job_name, const char *id,
                                         char *msg, size_t size)
{
	struct rdzv_worker *w = j ? kolo_strmap_get(&j->workers, id) : NULL;
	if (w)
		return w;
	if (j && j->finished) {
		snprintf(msg, size, "%s", j->finished_text);
		return NULL;
	}
	const char *why = j ? kolo_strmap_get(&j->evicted, id) : NULL;
	if (why)
		snprintf(msg, size, "evicted: worker %s of job %s (%s)", id, job_name, why);
	else
		snprintf(msg, size, "unknown worker %s in job %s; register again", id, job_name);
	return NULL;
}

void rdzv_job_finish(struct rdzv_state *st, struct rdzv_job *j, struct rdzv_worker *w, uint64_t now)
{
	if (!j->finished) {
		j->finished = true;
		snprintf(j->finished_text, sizeof(j->finished_text),
		         "job finished: worker %s@%s (rank %d of round %" PRId64
		         ") completed its training",
		         w->id, w->host, w->rank, j->round);
		int waiting = j->n_workers - j->n_members;
		KOLO_INFO(RDZV_SUB,
		          "job %s finished: worker %s@%s (rank %d of round %" PRId64
		          ") completed its training; no round forms any more%s",
		          j->name, w->id, w->host, w->rank, j->round,
		          waiting > 0 ? ", and the workers waiting to join are told so" : "");
	}
	j->finished_ms = now;
	rdzv_job_drop(j, w, "finished", false);
	/* Workers without a rank would wait for a round that never comes. */
	int n;
	struct rdzv_worker **v = rdzv_job_waiting_workers(j, &n);
	for (int i = 0; v && i < n; i++)
		rdzv_job_drop(j, v[i], "job finished", false);
	free(v);
	rdzv_wait_finish_all(j);
	rdzv_job_tick(st, j, now);
}

bool rdzv_job_admits_join(struct rdzv_state *st, struct rdzv_job *j, uint64_t now)
{
	if (!j->finished)
		return true;
	if (j->n_workers > 0 || now < j->finished_ms + (uint64_t)st->cfg.lease_ms)
		return false;
	KOLO_INFO(RDZV_SUB, "job %s: a join %d ms after it finished starts it again", j->name,
	          (int)(now - j->finished_ms));
	j->finished = false;
	j->finished_text[0] = '\0';
	return true;
}
