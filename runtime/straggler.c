/* straggler: the eviction policy of elastic jobs at the commit points
 * (docs/diagnosis.md, "Evicting a straggler"). Rank 0 feeds each step's
 * wall time and the arrival lags its flight recorder summed for every rank
 * (the same figures on every rank: they come from the negotiation) into the
 * policy of elastic/straggler.c; its verdict travels in the commit's
 * allreduce, so that every rank acts on the same one. The evicted worker
 * leaves the job as on SIGTERM, and exits with KOLO_EXIT_EVICTED. */
#include "flight.h"
#include "kolo/elastic.h"
#include "runtime.h"
#include "straggler.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SUBSYS "straggler"

struct kolo_straggler_watch {
	struct kolo_straggler *policy;
	int64_t round; /* the round the figures below belong to */
	int size;
	uint64_t last_ns; /* the previous commit point */
	double *prev;     /* [size]: the lag sums at the previous commit point */
	double *cur, *lag;
	int64_t refused_round; /* the round in which min-np kept a straggler */
};

void kolo_runtime_straggler_free(struct kolo_comm *comm)
{
	struct kolo_straggler_watch *w = comm->straggler;
	if (!w)
		return;
	kolo_straggler_destroy(w->policy);
	free(w->prev);
	free(w->cur);
	free(w->lag);
	free(w);
	comm->straggler = NULL;
}

/* The policy's state for this round, made or started over as needed; NULL
 * when off or out of memory. true in *fresh when it starts with this step. */
static struct kolo_straggler_watch *watch_for(struct kolo_comm *comm, bool *fresh)
{
	int n = comm->assignment.size;
	struct kolo_straggler_watch *w = comm->straggler;
	*fresh = !w || w->round != comm->assignment.round || w->size != n;
	if (!*fresh)
		return w;
	if (!w) {
		w = calloc(1, sizeof(*w));
		if (!w)
			return NULL;
		w->policy = kolo_straggler_create((int)kolo_param_int(KOLO_P_STRAGGLER_EVICT_STEPS),
		                                  kolo_param_float(KOLO_P_STRAGGLER_EVICT_PCT));
		comm->straggler = w;
		if (!w->policy) {
			KOLO_WARN(SUBSYS, "the straggler policy is off: KOLO_STRAGGLER_EVICT_STEPS "
			                  "must be at least 1");
			return NULL;
		}
	}
	if (!w->policy)
		return NULL;
	if (w->size != n) {
		free(w->prev);
		free(w->cur);
		free(w->lag);
		w->prev = calloc((size_t)n, sizeof(double));
		w->cur = calloc((size_t)n, sizeof(double));
		w->lag = calloc((size_t)n, sizeof(double));
		w->size = w->prev && w->cur && w->lag ? n : 0;
	}
	w->round = comm->assignment.round;
	kolo_straggler_reset(w->policy, n);
	return w->size == n ? w : NULL;
}

/* May the job lose a worker? Not below min-np, counting the workers that
 * wait to join (a spare takes the evicted one's place). */
static bool room_for_eviction(struct kolo_comm *comm, int rank, const char *why)
{
	int min_np = 0, members = 0, waiting = 0;
	if (kolo_rdzv_job_sizes(comm->rdzv, &min_np, &members, &waiting) != KOLO_OK) {
		KOLO_WARN(SUBSYS,
		          "rank %d is a straggler, but the job's min-np cannot be read (%s): "
		          "not evicted",
		          rank, kolo_rdzv_client_error(comm->rdzv));
		return false;
	}
	if (comm->assignment.size - 1 + waiting >= min_np)
		return true;
	if (comm->straggler->refused_round != comm->assignment.round)
		KOLO_WARN(
		        SUBSYS,
		        "%s; not evicted: %d workers and %d waiting, and the job needs at least %d "
		        "(min-np)",
		        why, comm->assignment.size, waiting, min_np);
	comm->straggler->refused_round = comm->assignment.round;
	return false;
}

int32_t kolo_runtime_straggler_verdict(struct kolo_comm *comm)
{
	if (!comm->elastic || comm->assignment.rank != 0 ||
	    !(kolo_param_float(KOLO_P_STRAGGLER_EVICT_PCT) > 0))
		return 0;
	bool fresh;
	struct kolo_straggler_watch *w = watch_for(comm, &fresh);
	if (!w)
		return 0;
	uint64_t now = kolo_now_ns();
	int n = w->size;
	kolo_flight_lag_totals(comm->flight, w->cur, n);
	for (int r = 0; r < n; r++) {
		w->lag[r] = w->cur[r] - w->prev[r];
		w->prev[r] = w->cur[r];
	}
	double step_ms = (double)(now - w->last_ns) / 1e6;
	w->last_ns = now;
	if (fresh) /* the first commit point of the round only starts the clock */
		return 0;
	char why[320];
	int r = kolo_straggler_step(w->policy, step_ms, w->lag, n, why, sizeof(why));
	if (r < 0 || !room_for_eviction(comm, r, why))
		return 0;
	const char *host = r < comm->assignment.n_members ? comm->assignment.members[r].host : "?";
	KOLO_WARN(SUBSYS, "evicting rank %d on host %s from round %" PRId64 ": %s", r, host,
	          comm->assignment.round, why);
	/* The evicted worker logs why too. */
	char key[64];
	snprintf(key, sizeof(key), "straggler/%" PRId64 "/why", comm->assignment.round);
	kolo_rdzv_kv_put(comm->rdzv, key, why, strlen(why));
	return r + 1;
}

void kolo_runtime_straggler_evicted(struct kolo_comm *comm, char *why, size_t len)
{
	char key[64];
	snprintf(key, sizeof(key), "straggler/%" PRId64 "/why", comm->assignment.round);
	void *data = NULL;
	size_t n = 0;
	snprintf(why, len, "rank 0's straggler policy named it");
	if (kolo_rdzv_kv_get(comm->rdzv, key, 1000, &data, &n) == KOLO_OK && n)
		snprintf(why, len, "%.*s", (int)n, (const char *)data);
	free(data);
	comm->evicted = true;
	KOLO_WARN(SUBSYS, "this worker (rank %d) is evicted from the job as a straggler: %s",
	          comm->assignment.rank, why);
}

KOLO_API bool kolo_elastic_evicted(const kolo_comm_t *comm)
{
	return comm && comm->evicted;
}
