/* server_diag: the hang classifier. From the workers' flight-recorder
 * reports and what the server knows of the round's members, it names the
 * stalled collective and who holds it up (docs/rendezvous.md, "Diagnosis").
 * Pure: no lock, no clock (now is an input), so server_diag_test.c feeds it
 * directly.
 *
 * Per communicator, the stalled op is the oldest open entry at least min_ms
 * old. Each rank of that comm then has a part in it: waiting (it has the op
 * open), done, absent (a report newer than the op's start without it) or
 * silent (no report that new). Absent ranks did not submit it; silent,
 * stopped or departed ranks are unresponsive or dead. Waiting ranks are
 * never blamed for waiting: with waits forming a chain, only its end is
 * named. A cycle of data-plane waits with nobody else to blame is a link. */
#include "server_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LIST_SHOWN 16 /* ranks named in a sentence before "and N more" */
#define LABELS_MAX 64 /* distinct comm labels looked at */
#define STALLS_MAX 8  /* stalled ops reported, one per comm */

enum part { P_WAITING, P_DONE, P_ABSENT, P_SILENT, P_OUTSIDE };

/* One communicator's stalled op and every rank's part in it. */
struct stall {
	const char *label, *name, *op;
	double age_ms;
	int64_t start_ms;  /* wall clock: the earliest submission */
	enum part *part;   /* n; P_OUTSIDE for ranks not in the comm */
	int *edge;         /* n; the rank a waiting rank waits on, else -1 */
	int *end;          /* n; where a waiting rank's chain of waits ends, else -1 */
	char waiters[256]; /* "ranks 0, 1, 3" */
};

struct diag {
	const struct rdzv_diag_input *in;
	int n;
	bool *stale_hb; /* n: registered, heartbeat older than stale_ms */
	bool *silent;   /* n: no report since a stalled op began, while others report */
	int pending;    /* silent ranks not blamed yet: a request to them is young */
	bool *blamed;   /* n: already named as a culprit */
	json_t *culprits;
};

static const char *host_of(const struct diag *d, int r)
{
	const struct rdzv_diag_member *m = &d->in->m[r];
	if (m->host)
		return m->host;
	return m->report && m->report->host[0] ? m->report->host : "?";
}

/* A report is a witness of a rank's process when it is this recent. */
#define WITNESS_MS 3000

/* What a rank on r's host saw of r's process in its newest recent report;
 * -1 when no such report says. The witness in *who. */
static int seen_proc(const struct diag *d, int r, int *who)
{
	int best = -1;
	int64_t newest = d->in->now_ms - WITNESS_MS;
	for (int q = 0; q < d->n; q++) {
		const struct rdzv_diag_report *rep = d->in->m[q].report;
		if (q == r || !rep || rep->time_ms < newest || !strcmp(host_of(d, r), "?") ||
		    strcmp(host_of(d, q), host_of(d, r)))
			continue;
		for (int i = 0; i < rep->n_peers; i++) {
			if (rep->peers[i].rank == r) {
				best = (int)rep->peers[i].state;
				newest = rep->time_ms;
				*who = q;
			}
		}
	}
	return best;
}

/* What the liveness probes of the ranks waiting on r say of r's host: 1
 * unanswered for RDZV_DIAG_UNACKED_MS (*ms), 0 answering while a rank has
 * waited on r for a second, -1 unknown. The prober in *who. */
static int probe_says(const struct diag *d, int r, int *who, double *ms)
{
	int says = -1;
	for (int q = 0; q < d->n; q++) {
		const struct rdzv_diag_report *rep = d->in->m[q].report;
		if (q == r || !rep || rep->time_ms < d->in->now_ms - WITNESS_MS)
			continue;
		for (int i = 0; i < rep->n_comms; i++) {
			const struct rdzv_diag_comm *c = &rep->comms[i];
			if (c->waiting_on != r || c->waiting_unacked_ms < 0)
				continue;
			if (c->waiting_unacked_ms >= RDZV_DIAG_UNACKED_MS) {
				*who = q;
				*ms = c->waiting_unacked_ms;
				return 1;
			}
			if (c->waiting_ms >= 1000 && says < 0) {
				says = 0;
				*who = q;
			}
		}
	}
	return says;
}

static const char *process_of(const struct diag *d, int r)
{
	if (!d->in->m[r].registered)
		return "gone";
	int who;
	double ms;
	int seen = seen_proc(d, r, &who);
	if (seen == RDZV_PROC_STOPPED)
		return "stopped";
	if (seen == RDZV_PROC_GONE)
		return "gone";
	if (seen == RDZV_PROC_RUNNING || !(d->stale_hb[r] || d->silent[r]))
		return "running";
	return probe_says(d, r, &who, &ms) == 1 ? "unreachable" : "not_responding";
}

static const struct rdzv_diag_comm *comm_of(const struct rdzv_diag_report *rep, const char *label)
{
	for (int i = 0; rep && i < rep->n_comms; i++) {
		if (strcmp(rep->comms[i].label, label) == 0)
			return &rep->comms[i];
	}
	return NULL;
}

/* The newest entry of the comm with this name. */
static const struct rdzv_diag_entry *entry_of(const struct rdzv_diag_comm *c, const char *name)
{
	for (int i = c ? c->n_entries - 1 : -1; i >= 0; i--) {
		if (strcmp(c->entries[i].name, name) == 0)
			return &c->entries[i];
	}
	return NULL;
}

/* "rank 2" or "ranks 0, 1, 3" of the ranks r whose part is p. */
static void ranks_text(const struct stall *s, int n, enum part p, char *out, size_t size)
{
	int k = 0, shown = 0;
	for (int r = 0; r < n; r++)
		k += s->part[r] == p;
	size_t o = (size_t)snprintf(out, size, "rank%s", k == 1 ? "" : "s");
	for (int r = 0; r < n && o < size; r++) {
		if (s->part[r] != p)
			continue;
		if (shown++ == LIST_SHOWN) {
			snprintf(out + o, size - o, " and %d more", k - LIST_SHOWN);
			break;
		}
		o += (size_t)snprintf(out + o, size - o, "%s %d", shown > 1 ? "," : "", r);
	}
}

/* ---- finding the stalled op ---------------------------------------------- */

/* How many ranks have name open on comm label. */
static int open_count(const struct diag *d, const char *label, const char *name)
{
	int k = 0;
	for (int r = 0; r < d->n; r++) {
		const struct rdzv_diag_entry *e =
		        entry_of(comm_of(d->in->m[r].report, label), name);
		k += e && rdzv_diag_state_open(e->state);
	}
	return k;
}

/* The stalled op of comm label: of the open entries at least min_ms old,
 * the one most ranks wait in, the oldest of those. (A rank that skipped an
 * op submits the next one about when the others submit the skipped one:
 * the age alone would pick either.) */
static bool stall_find(const struct diag *d, const char *label, struct stall *s)
{
	int best = 0;
	s->age_ms = -1;
	for (int r = 0; r < d->n; r++) {
		const struct rdzv_diag_comm *c = comm_of(d->in->m[r].report, label);
		for (int i = 0; c && i < c->n_entries; i++) {
			const struct rdzv_diag_entry *e = &c->entries[i];
			if (!rdzv_diag_state_open(e->state) || e->age_ms < (double)d->in->min_ms)
				continue;
			int k = open_count(d, label, e->name);
			if (k < best || (k == best && e->age_ms <= s->age_ms))
				continue;
			best = k;
			s->label = c->label;
			s->name = e->name;
			s->op = e->op[0] ? e->op : "collective";
			s->age_ms = e->age_ms;
		}
	}
	return s->age_ms >= 0;
}

/* Marks the ranks of the comm: every rank for "job", else those listed as
 * its members (and the ranks reporting it). */
static void stall_members(const struct diag *d, struct stall *s)
{
	bool job = strcmp(s->label, "job") == 0;
	for (int r = 0; r < d->n; r++)
		s->part[r] = job ? P_SILENT : P_OUTSIDE;
	for (int r = 0; r < d->n && !job; r++) {
		const struct rdzv_diag_comm *c = comm_of(d->in->m[r].report, s->label);
		if (!c)
			continue;
		s->part[r] = P_SILENT;
		for (int i = 0; i < c->n_members; i++) {
			if (c->members[i] < d->n)
				s->part[c->members[i]] = P_SILENT;
		}
	}
}

/* Every rank's part, the op's start and the waits among waiting ranks. */
static void stall_parts(const struct diag *d, struct stall *s)
{
	s->start_ms = INT64_MAX;
	for (int r = 0; r < d->n; r++) {
		const struct rdzv_diag_report *rep = d->in->m[r].report;
		const struct rdzv_diag_entry *e = entry_of(comm_of(rep, s->label), s->name);
		s->edge[r] = s->end[r] = -1;
		if (s->part[r] == P_OUTSIDE || !e)
			continue;
		if (rdzv_diag_state_open(e->state)) {
			s->part[r] = P_WAITING;
			s->start_ms = KOLO_MIN(s->start_ms, rep->time_ms - (int64_t)e->age_ms);
			int p = comm_of(rep, s->label)->waiting_on;
			if (p >= 0 && p < d->n && p != r && !d->stale_hb[r])
				s->edge[r] = p;
		} else if (e->state == RDZV_DIAG_DONE || e->state == RDZV_DIAG_FAILED) {
			s->part[r] = P_DONE;
		}
	}
	for (int r = 0; r < d->n; r++) {
		const struct rdzv_diag_report *rep = d->in->m[r].report;
		if (s->part[r] == P_SILENT && rep && rep->time_ms >= s->start_ms)
			s->part[r] = P_ABSENT;
	}
}

/* Follows r's waits; the rank where they end, or -1 in a cycle. */
static int chain_end(const struct diag *d, const struct stall *s, int r)
{
	for (int steps = 0; steps <= d->n; steps++) {
		if (s->edge[r] < 0)
			return r;
		r = s->edge[r];
	}
	return -1;
}

/* ---- culprits ------------------------------------------------------------ */

static void culprit_add(struct diag *d, int r, const char *kind, const char *detail, json_t *extra)
{
	json_t *c = json_pack("{s:i,s:s,s:s,s:s,s:s}", "rank", r, "host", host_of(d, r), "kind",
	                      kind, "detail", detail, "process", process_of(d, r));
	if (c && extra)
		json_object_update(c, extra);
	json_decref(extra);
	json_array_append_new(d->culprits, c);
	d->blamed[r] = true;
}

/* The last done entry of r in the comm, and what r has open instead. */
static void not_submitted(struct diag *d, const struct stall *s, int r)
{
	const struct rdzv_diag_comm *c = comm_of(d->in->m[r].report, s->label);
	const char *last_done = NULL, *instead = NULL;
	for (int i = 0; c && i < c->n_entries; i++) {
		if (c->entries[i].state == RDZV_DIAG_DONE)
			last_done = c->entries[i].name;
		else if (rdzv_diag_state_open(c->entries[i].state) && !instead)
			instead = c->entries[i].name;
	}
	char detail[1024];
	size_t o =
	        (size_t)snprintf(detail, sizeof(detail), "never submitted %s '%s' that %s wait in",
	                         s->op, s->name, s->waiters);
	if (last_done && o < sizeof(detail))
		o += (size_t)snprintf(detail + o, sizeof(detail) - o,
		                      "; its last completed op was '%s'", last_done);
	if (instead && o < sizeof(detail))
		snprintf(detail + o, sizeof(detail) - o, "; it submitted '%s' instead", instead);
	json_t *extra = json_object();
	if (extra && last_done)
		json_object_set_new(extra, "last_done", json_string(last_done));
	if (extra && instead)
		json_object_set_new(extra, "open_instead", json_string(instead));
	culprit_add(d, r, "not_submitted", detail, extra);
}

/* A rank that sent nothing since the op began, or whose heartbeats
 * stopped; dead when it is no longer a member. */
static void unresponsive(struct diag *d, const struct stall *s, int r)
{
	const struct rdzv_diag_member *m = &d->in->m[r];
	char why[512], detail[1024];
	int who = -1, seen = seen_proc(d, r, &who), probe = -1;
	double ms = 0;
	if (seen < 0)
		probe = probe_says(d, r, &who, &ms);
	if (!m->registered)
		snprintf(why, sizeof(why), "is no longer a member of round %lld (%s)",
		         (long long)d->in->round,
		         m->gone_why ? m->gone_why : "it left or was evicted");
	else if (seen == RDZV_PROC_STOPPED)
		snprintf(why, sizeof(why),
		         "is stopped: rank %d on the same host sees its process in state T "
		         "(SIGSTOP, "
		         "a debugger or job control)",
		         who);
	else if (seen == RDZV_PROC_GONE)
		snprintf(why, sizeof(why),
		         "is dead: rank %d on the same host no longer finds its process", who);
	else if (seen == RDZV_PROC_RUNNING)
		snprintf(why, sizeof(why),
		         "sent no report since the op began, though rank %d on the same host sees "
		         "its "
		         "process running: it is hung, or cannot reach the rendezvous",
		         who);
	else if (probe == 1)
		snprintf(why, sizeof(why),
		         "is unreachable: its host has not acknowledged rank %d's liveness probe "
		         "for "
		         "%.0f ms (the host or its network is down)",
		         who, ms);
	else if (d->stale_hb[r])
		snprintf(why, sizeof(why), "does not respond: its last heartbeat was %lld ms ago",
		         (long long)m->heartbeat_ms);
	else if (m->ignored)
		snprintf(why, sizeof(why), "sent no usable report since the op began (%s)",
		         m->ignored);
	else if (probe == 0)
		snprintf(why, sizeof(why),
		         "sent no report since the op began while its host answers rank %d's "
		         "liveness probe: the process is stopped or hung",
		         who);
	else
		snprintf(why, sizeof(why),
		         "sent no report since the op began (stopped, hung or unreachable: its "
		         "reporter thread does not answer)");
	if (s->part[r] == P_WAITING)
		snprintf(detail, sizeof(detail), "%s; it stopped inside %s '%s' that %s wait in",
		         why, s->op, s->name, s->waiters);
	else
		snprintf(detail, sizeof(detail), "%s; %s wait on it in %s '%s'", why, s->waiters,
		         s->op, s->name);
	culprit_add(d, r, m->registered && seen != RDZV_PROC_GONE ? "unresponsive" : "dead", detail,
	            NULL);
}

/* A silent rank that may still answer: registered, heartbeats arriving,
 * and no request made during the stall has waited RDZV_DIAG_ANSWER_MS. */
static bool may_answer(const struct diag *d, const struct stall *s, int r)
{
	const struct rdzv_diag_input *in = d->in;
	bool overdue =
	        in->request_ms >= s->start_ms && in->now_ms - in->request_ms >= RDZV_DIAG_ANSWER_MS;
	return s->part[r] == P_SILENT && in->m[r].registered && !d->stale_hb[r] &&
	       !in->m[r].ignored && !overdue;
}

/* An absent rank r still waiting in the data plane of an earlier op on a
 * rank p that has completed it: what p sent never arrived (a ring's last
 * transfer lost on a cut or all but stalled link; a send completes once the
 * kernel holds the data). Returns p and r's entry of that op, else -1. */
static int lost_transfer(const struct diag *d, const struct stall *s, int r,
                         const struct rdzv_diag_entry **lost)
{
	const struct rdzv_diag_comm *c = comm_of(d->in->m[r].report, s->label);
	int p = c ? c->waiting_on : -1;
	if (p < 0 || p >= d->n || p == r || d->stale_hb[r])
		return -1;
	const struct rdzv_diag_comm *pc = comm_of(d->in->m[p].report, s->label);
	for (int i = 0; i < c->n_entries; i++) {
		const struct rdzv_diag_entry *e = &c->entries[i], *pe = entry_of(pc, e->name);
		if (e->state == RDZV_DIAG_DATAPLANE && pe && pe->state == RDZV_DIAG_DONE) {
			*lost = e;
			return p;
		}
	}
	return -1;
}

/* The link culprit of a lost transfer: p, waited on by r in op e. */
static void lost_transfer_culprit(struct diag *d, const struct stall *s, int r, int p,
                                  const struct rdzv_diag_entry *e)
{
	const char *hr = host_of(d, r), *hp = host_of(d, p);
	char detail[1024];
	size_t o =
	        strcmp(hr, hp) != 0
	                ? (size_t)snprintf(detail, sizeof(detail), "a link between %s and %s", hp,
	                                   hr)
	                : (size_t)snprintf(detail, sizeof(detail),
	                                   "the link between ranks %d and %d on host %s", p, r, hr);
	if (o < sizeof(detail))
		snprintf(detail + o, sizeof(detail) - o,
		         ": rank %d (%s) has waited %.0f ms in %s '%s' for data from rank %d (%s), "
		         "which completed it: what it sent did not arrive",
		         r, hr, comm_of(d->in->m[r].report, s->label)->waiting_ms,
		         e->op[0] ? e->op : "collective", e->name, p, hp);
	o = strlen(detail);
	if (strcmp(e->name, s->name) != 0 && o < sizeof(detail)) /* r has not submitted s */
		snprintf(detail + o, sizeof(detail) - o, "; %s wait in %s '%s'", s->waiters, s->op,
		         s->name);
	culprit_add(
	        d, p, "link", detail,
	        json_pack("{s:i,s:s,s:[s,s]}", "peer_rank", r, "peer_host", hr, "hosts", hp, hr));
}

/* A rank's part makes it a culprit: absent, silent, stopped or gone. */
static void blame_rank(struct diag *d, const struct stall *s, int r)
{
	if (d->blamed[r] || s->part[r] == P_OUTSIDE || s->part[r] == P_DONE)
		return;
	if (may_answer(d, s, r)) {
		d->pending++;
		return;
	}
	d->silent[r] = s->part[r] == P_SILENT && !d->in->m[r].ignored;
	if (!d->in->m[r].registered || d->stale_hb[r] || s->part[r] == P_SILENT)
		unresponsive(d, s, r);
	else if (s->part[r] == P_ABSENT) {
		const struct rdzv_diag_entry *lost = NULL;
		int p = lost_transfer(d, s, r, &lost);
		if (p >= 0 && !d->blamed[p])
			lost_transfer_culprit(d, s, r, p, lost);
		else if (p < 0)
			not_submitted(d, s, r);
	}
}

/* How suspect the edge a -> s->edge[a] is: 2 when a's liveness probe to
 * that host waits for an acknowledgement, plus 1 when it crosses hosts. */
static int edge_rank(const struct diag *d, const struct stall *s, int a)
{
	const struct rdzv_diag_comm *c = comm_of(d->in->m[a].report, s->label);
	return 2 * (c->waiting_unacked_ms >= RDZV_DIAG_UNACKED_MS) +
	       (strcmp(host_of(d, a), host_of(d, s->edge[a])) != 0);
}

/* The cycle edge most likely broken: the one whose probe goes unanswered,
 * else one crossing hosts, the one waited on longest of those. Returns its
 * waiting rank. The waits are compared by when they began (the report's time
 * less waiting_ms): the reports are written at different times. In a ring
 * every rank blocks within a millisecond of the others, so a slowed link is
 * told by its probe rather than by the waits. */
static int link_edge(const struct diag *d, const struct stall *s, int start)
{
	int best = start, best_rank = -1;
	double best_since = 0;
	int a = start;
	do {
		const struct rdzv_diag_report *rep = d->in->m[a].report;
		double since = (double)rep->time_ms - comm_of(rep, s->label)->waiting_ms;
		int rank = edge_rank(d, s, a);
		if (rank > best_rank || (rank == best_rank && since < best_since)) {
			best = a;
			best_since = since;
			best_rank = rank;
		}
		a = s->edge[a];
	} while (a != start);
	return best;
}

static void link_culprit(struct diag *d, const struct stall *s, int start)
{
	int a = link_edge(d, s, start), p = s->edge[a];
	if (d->blamed[p])
		return;
	char cyc[256], detail[1024];
	size_t o = (size_t)snprintf(cyc, sizeof(cyc), "%d", start);
	int v = start, steps = 0;
	do {
		v = s->edge[v];
		if (o < sizeof(cyc))
			o += (size_t)snprintf(cyc + o, sizeof(cyc) - o, " -> %d", v);
	} while (v != start && ++steps < d->n);
	const char *ha = host_of(d, a), *hp = host_of(d, p);
	double ms = comm_of(d->in->m[a].report, s->label)->waiting_ms;
	if (strcmp(ha, hp) != 0)
		snprintf(detail, sizeof(detail), "a link between %s and %s", hp, ha);
	else
		snprintf(detail, sizeof(detail), "the link between ranks %d and %d on host %s", p,
		         a, ha);
	o = strlen(detail);
	snprintf(detail + o, sizeof(detail) - o,
	         ": rank %d (%s) has waited %.0f ms for rank %d (%s) in %s '%s', and the waits "
	         "form a cycle with no end (%s)",
	         a, ha, ms, p, hp, s->op, s->name, cyc);
	double unacked = comm_of(d->in->m[a].report, s->label)->waiting_unacked_ms;
	o = strlen(detail);
	if (unacked >= RDZV_DIAG_UNACKED_MS && o < sizeof(detail))
		snprintf(detail + o, sizeof(detail) - o,
		         "; its liveness probe to %s has waited %.0f ms for an acknowledgement", hp,
		         unacked);
	culprit_add(
	        d, p, "link", detail,
	        json_pack("{s:i,s:s,s:[s,s]}", "peer_rank", a, "peer_host", ha, "hosts", hp, ha));
}

/* Cycles of waits: a link when they cross hosts between two ranks, or when
 * every rank of the op waits (nobody else to blame). */
static void find_links(struct diag *d, const struct stall *s, bool all_wait)
{
	int *seen = calloc((size_t)KOLO_MAX(d->n, 1), sizeof(*seen));
	for (int r = 0; seen && r < d->n; r++) {
		int v = r;
		while (v >= 0 && !seen[v]) {
			seen[v] = r + 1;
			v = s->edge[v];
		}
		if (v < 0 || seen[v] != r + 1)
			continue; /* a chain, or a cycle found from an earlier start */
		bool two_hosts = s->edge[s->edge[v]] == v &&
		                 strcmp(host_of(d, v), host_of(d, s->edge[v])) != 0;
		if (all_wait || two_hosts)
			link_culprit(d, s, v);
	}
	free(seen);
}

/* Culprits of one stall: chain ends first, then other ranks, then links. */
static void stall_blame(struct diag *d, struct stall *s)
{
	ranks_text(s, d->n, P_WAITING, s->waiters, sizeof(s->waiters));
	int n_other = 0;
	for (int r = 0; r < d->n; r++) {
		s->end[r] = s->part[r] == P_WAITING ? chain_end(d, s, r) : -1;
		n_other += s->part[r] != P_WAITING && s->part[r] != P_OUTSIDE;
	}
	for (int r = 0; r < d->n; r++) {
		if (s->end[r] >= 0 && s->end[r] != r)
			blame_rank(d, s, s->end[r]);
	}
	/* A waiting rank whose peer completed the op: what the peer sent was lost. */
	for (int r = 0; r < d->n; r++) {
		int p = s->edge[r];
		const struct rdzv_diag_entry *e =
		        entry_of(comm_of(d->in->m[r].report, s->label), s->name);
		const struct rdzv_diag_entry *pe =
		        p >= 0 ? entry_of(comm_of(d->in->m[p].report, s->label), s->name) : NULL;
		if (pe && pe->state == RDZV_DIAG_DONE && e->state == RDZV_DIAG_DATAPLANE &&
		    !d->blamed[p])
			lost_transfer_culprit(d, s, r, p, e);
	}
	for (int r = 0; r < d->n; r++)
		blame_rank(d, s, r);
	find_links(d, s, n_other == 0);
}

/* The ranks an error text names ("rank 0 passed [4], rank 2 passed [8]"). */
static json_t *named_ranks(const char *text)
{
	json_t *a = json_array();
	for (const char *p = text; a && (p = strstr(p, "rank ")) != NULL;) {
		p += 5;
		char *end;
		long r = strtol(p, &end, 10);
		if (end != p && r >= 0 && r < RDZV_DIAG_RANKS_MAX)
			json_array_append_new(a, json_integer(r));
		p = end;
	}
	return a;
}

static bool mismatch_known(const struct diag *d, const char *label, const char *name)
{
	size_t i;
	json_t *c;
	json_array_foreach(d->culprits, i, c)
	{
		if (strcmp(json_string_value(json_object_get(c, "kind")), "mismatch") == 0 &&
		    strcmp(json_string_value(json_object_get(c, "comm")), label) == 0 &&
		    strcmp(json_string_value(json_object_get(c, "name")), name) == 0)
			return true;
	}
	return false;
}

/* A KOLO_EMISMATCH entry, once per op. The culprit is the other side the
 * text names (a rank never blames itself), else the reporter. */
static void mismatch(struct diag *d, int r, const struct rdzv_diag_comm *c,
                     const struct rdzv_diag_entry *e)
{
	if (mismatch_known(d, c->label, e->name))
		return;
	json_t *ranks = named_ranks(e->error);
	int blamed = r;
	size_t i;
	json_t *v;
	json_array_foreach(ranks, i, v)
	{
		if (json_integer_value(v) != r && json_integer_value(v) < d->n && blamed == r)
			blamed = (int)json_integer_value(v);
	}
	char detail[1024];
	snprintf(detail, sizeof(detail), "%s '%s' failed: %s", e->op[0] ? e->op : "collective",
	         e->name, e->error[0] ? e->error : "arguments differ between ranks");
	culprit_add(d, blamed, "mismatch", detail,
	            json_pack("{s:s,s:s,s:i,s:o}", "comm", c->label, "name", e->name, "reported_by",
	                      r, "ranks", ranks ? ranks : json_array()));
}

/* Failed entries with KOLO_EMISMATCH in any report. */
static void find_mismatches(struct diag *d)
{
	for (int r = 0; r < d->n; r++) {
		const struct rdzv_diag_report *rep = d->in->m[r].report;
		for (int i = 0; rep && i < rep->n_comms; i++) {
			const struct rdzv_diag_comm *c = &rep->comms[i];
			for (int k = 0; k < c->n_entries; k++) {
				if (c->entries[k].state == RDZV_DIAG_FAILED &&
				    strcmp(c->entries[k].status, "KOLO_EMISMATCH") == 0)
					mismatch(d, r, c, &c->entries[k]);
			}
		}
	}
}

/* ---- the document -------------------------------------------------------- */

static json_t *stall_json(const struct diag *d, const struct stall *s)
{
	json_t *w = json_array();
	for (int r = 0; w && r < d->n; r++) {
		if (s->part[r] == P_WAITING)
			json_array_append_new(w, json_integer(r));
	}
	return json_pack("{s:s,s:s,s:s,s:o,s:I}", "comm", s->label, "name", s->name, "op", s->op,
	                 "waiting_ranks", w, "waiting_ms", (json_int_t)s->age_ms);
}

/* One row of the ranks table. */
static json_t *rank_json(const struct diag *d, const struct stall *s, int r)
{
	const struct rdzv_diag_member *m = &d->in->m[r];
	const struct rdzv_diag_report *rep = m->report;
	const struct rdzv_diag_comm *c = s ? comm_of(rep, s->label) : NULL;
	if (!c && rep && rep->n_comms)
		c = &rep->comms[0];
	const char *open = NULL, *state = rep ? "idle" : "no_report";
	double open_age = -1;
	for (int i = 0; rep && i < rep->n_comms; i++) {
		for (int k = 0; k < rep->comms[i].n_entries; k++) {
			const struct rdzv_diag_entry *e = &rep->comms[i].entries[k];
			if (rdzv_diag_state_open(e->state) && e->age_ms > open_age) {
				open = e->name;
				open_age = e->age_ms;
				state = "busy";
			}
		}
	}
	if (s && s->part[r] == P_WAITING)
		state = "waiting";
	else if (s && s->part[r] == P_SILENT && rep)
		state = "stale_report";
	if (!m->registered)
		state = "gone";
	json_t *o =
	        json_pack("{s:i,s:s,s:s?,s:s,s:s}", "rank", r, "host", host_of(d, r), "worker_id",
	                  m->worker_id, "state", state, "process", process_of(d, r));
	if (!o)
		return NULL;
	json_object_set_new(o, "heartbeat_ms",
	                    m->heartbeat_ms >= 0 ? json_integer(m->heartbeat_ms) : json_null());
	json_object_set_new(o, "report_age_ms",
	                    rep ? json_integer(d->in->now_ms - rep->time_ms) : json_null());
	json_object_set_new(o, "gen", rep ? json_integer(rep->gen) : json_null());
	json_object_set_new(o, "waiting_on", json_integer(c ? c->waiting_on : -1));
	json_object_set_new(o, "open", open ? json_string(open) : json_null());
	json_object_set_new(o, "activity", c ? json_string(c->activity) : json_null());
	if (m->ignored)
		json_object_set_new(o, "report_error", json_string(m->ignored));
	return o;
}

/* Whether every live member answered request n. */
static bool request_complete(const struct diag *d)
{
	for (int r = 0; r < d->n; r++) {
		const struct rdzv_diag_member *m = &d->in->m[r];
		if (m->registered && !d->stale_hb[r] &&
		    (!m->report || m->report->gen < d->in->request))
			return false;
	}
	return true;
}

static json_t *summary(const struct diag *d, const struct stall *s)
{
	size_t n = json_array_size(d->culprits);
	char text[1536];
	const json_t *c = json_array_get(d->culprits, 0);
	const char *kind = json_string_value(json_object_get(c, "kind"));
	const char *detail = json_string_value(json_object_get(c, "detail"));
	if (!c && !s)
		snprintf(text, sizeof(text), "no stalled collective");
	else if (!c && d->pending)
		snprintf(text, sizeof(text),
		         "%s '%s' has been open %.0f ms in %s; waiting for the reports of %d "
		         "rank%s",
		         s->op, s->name, s->age_ms, s->waiters, d->pending,
		         d->pending > 1 ? "s" : "");
	else if (!c)
		snprintf(text, sizeof(text),
		         "%s '%s' has been open %.0f ms in %s; no rank is to blame", s->op, s->name,
		         s->age_ms, s->waiters);
	else if (strcmp(kind, "link") == 0 || strcmp(kind, "mismatch") == 0)
		snprintf(text, sizeof(text), "%s%s", s ? "" : "no stalled collective; ", detail);
	else {
		const char *proc = json_string_value(json_object_get(c, "process"));
		snprintf(text, sizeof(text), "rank %d (host %s) %s; its process is %s",
		         (int)json_integer_value(json_object_get(c, "rank")),
		         json_string_value(json_object_get(c, "host")), detail,
		         strcmp(proc, "not_responding") == 0 ? "not responding" : proc);
	}
	if (n > 1) {
		size_t o = strlen(text);
		snprintf(text + o, sizeof(text) - o, " (and %zu more culprit%s)", n - 1,
		         n > 2 ? "s" : "");
	}
	return json_string(text);
}

/* Every comm label that has a stalled op, oldest op first, into stalls. */
static int stalls_find(const struct diag *d, struct stall *stalls, int max)
{
	const char *labels[LABELS_MAX];
	int n_labels = 0, k = 0;
	for (int r = 0; r < d->n; r++) {
		const struct rdzv_diag_report *rep = d->in->m[r].report;
		for (int i = 0; rep && i < rep->n_comms && n_labels < LABELS_MAX; i++) {
			bool known = false;
			for (int j = 0; j < n_labels && !known; j++)
				known = strcmp(labels[j], rep->comms[i].label) == 0;
			if (!known)
				labels[n_labels++] = rep->comms[i].label;
		}
	}
	for (int i = 0; i < n_labels && k < max; i++)
		k += stall_find(d, labels[i], &stalls[k]);
	for (int i = 1; i < k; i++) {
		for (int j = i; j > 0 && stalls[j].age_ms > stalls[j - 1].age_ms; j--) {
			struct stall t = stalls[j];
			stalls[j] = stalls[j - 1];
			stalls[j - 1] = t;
		}
	}
	return k;
}

static json_t *document(struct diag *d, struct stall *st, int k)
{
	json_t *ranks = json_array(), *ops = json_array();
	for (int r = 0; ranks && r < d->n; r++)
		json_array_append_new(ranks, rank_json(d, k ? &st[0] : NULL, r));
	for (int i = 0; ops && i < k; i++)
		json_array_append_new(ops, stall_json(d, &st[i]));
	json_t *o = json_pack("{s:s,s:I,s:b,s:o,s:o,s:o,s:o,s:O,s:I,s:I}", "job", d->in->job,
	                      "round", (json_int_t)d->in->round, "stalled", k > 0, "summary",
	                      summary(d, k ? &st[0] : NULL), "stalled_op",
	                      k ? stall_json(d, &st[0]) : json_null(), "stalled_ops", ops, "ranks",
	                      ranks, "culprits", d->culprits, "min_ms", (json_int_t)d->in->min_ms,
	                      "stale_ms", (json_int_t)d->in->stale_ms);
	if (o && d->in->request > 0) {
		json_object_set_new(o, "request", json_integer(d->in->request));
		json_object_set_new(o, "complete", json_boolean(request_complete(d)));
	}
	return o;
}

json_t *rdzv_diag_classify(const struct rdzv_diag_input *in)
{
	struct diag d = {.in = in, .n = in->n, .culprits = json_array()};
	size_t n = (size_t)KOLO_MAX(in->n, 1);
	d.stale_hb = calloc(n, sizeof(bool));
	d.silent = calloc(n, sizeof(bool));
	d.blamed = calloc(n, sizeof(bool));
	struct stall st[STALLS_MAX] = {{0}};
	bool ok = d.culprits && d.stale_hb && d.silent && d.blamed;
	for (int i = 0; ok && i < STALLS_MAX; i++) {
		st[i].part = calloc(n, sizeof(enum part));
		st[i].edge = calloc(n, sizeof(int));
		st[i].end = calloc(n, sizeof(int));
		ok = st[i].part && st[i].edge && st[i].end;
	}
	json_t *out = NULL;
	if (ok) {
		for (int r = 0; r < in->n; r++)
			d.stale_hb[r] = in->m[r].registered && in->m[r].heartbeat_ms > in->stale_ms;
		int k = stalls_find(&d, st, STALLS_MAX);
		for (int i = 0; i < k; i++) {
			stall_members(&d, &st[i]);
			stall_parts(&d, &st[i]);
			stall_blame(&d, &st[i]);
		}
		find_mismatches(&d);
		out = document(&d, st, k);
	}
	for (int i = 0; i < STALLS_MAX; i++) {
		free(st[i].part);
		free(st[i].edge);
		free(st[i].end);
	}
	free(d.stale_hb);
	free(d.silent);
	free(d.blamed);
	json_decref(d.culprits);
	return out;
}
