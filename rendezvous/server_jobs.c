/* server_jobs: the table of jobs. A job is made by the first request that
 * names it, with the server's defaults, and forgotten once idle for
 * job_retain_ms. No locks: the caller holds the server's. */
#include "server_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

void rdzv_job_free(void *job)
{
	struct rdzv_job *j = job;
	if (!j)
		return;
	kolo_strmap_fini(&j->workers, free);
	kolo_strmap_fini(&j->evicted, free);
	kolo_strmap_fini(&j->kv, free);
	free(j->by_rank);
	free(j->members_json);
	free(j);
}

uint64_t rdzv_job_retain_deadline(const struct rdzv_state *st, const struct rdzv_job *j)
{
	if (st->cfg.job_retain_ms > 0 && j->n_workers == 0 && !j->waiters)
		return j->last_active_ms + (uint64_t)st->cfg.job_retain_ms;
	return UINT64_MAX;
}

/* Frees a job with its configuration, KV store and eviction records; it
 * has no workers and no waiters. */
static void job_forget(struct rdzv_state *st, struct rdzv_job *j, uint64_t now)
{
	rdzv_kv_forget(st, j);
	KOLO_INFO(RDZV_SUB, "job %s forgotten: no workers or requests for %" PRIu64 " s", j->name,
	          (now - j->last_active_ms) / 1000);
	kolo_strmap_del(&st->jobs, j->name);
	rdzv_job_free(j);
}

void rdzv_job_sweep(struct rdzv_state *st, uint64_t now)
{
	bool again = true;
	while (again) {
		again = false;
		KOLO_STRMAP_FOREACH(&st->jobs, e)
		{
			if (now >= rdzv_job_retain_deadline(st, e->val)) {
				job_forget(st, e->val, now);
				again = true; /* the map changed under us */
				break;
			}
		}
	}
}

struct rdzv_job *rdzv_job_get(struct rdzv_state *st, const char *name, bool create, uint64_t now)
{
	struct rdzv_job *j = kolo_strmap_get(&st->jobs, name);
	if (j)
		j->last_active_ms = now;
	if (!j && create && st->jobs.n >= RDZV_JOBS_MAX)
		rdzv_job_sweep(st, now);
	if (j || !create || st->jobs.n >= RDZV_JOBS_MAX)
		return j;
	j = calloc(1, sizeof(*j));
	if (!j)
		return NULL;
	snprintf(j->name, sizeof(j->name), "%s", name); /* calloc: RDZV_JOB_WAITING */
	j->cfg.min_np = KOLO_MAX(st->cfg.min_np, 1);
	j->cfg.max_np = KOLO_MAX(st->cfg.max_np, 0);
	j->cfg.settle_ms = KOLO_MAX(st->cfg.settle_ms, 0);
	if (j->cfg.max_np && j->cfg.max_np < j->cfg.min_np)
		j->cfg.max_np = j->cfg.min_np;
	j->last_join_ms = now;
	j->last_wait_log_ms = now;
	j->last_active_ms = now;
	bool ok;
	kolo_strmap_put(&st->jobs, name, j, &ok);
	if (!ok) {
		free(j);
		return NULL;
	}
	return j;
}
