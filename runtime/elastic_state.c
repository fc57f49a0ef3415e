/* elastic_state: the state API of kolo/elastic.h (register, commit,
 * restore, sync) and kolo_elastic_run(), Horovod's hvd.elastic.run, over
 * the state registry of elastic/ and kolo_reform() (reform.c). */
#include "fusion.h"
#include "kolo/async.h"
#include "kolo/elastic.h"
#include "membership.h"
#include "metrics.h"
#include "runtime.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SUBSYS "elastic"

struct kolo_state {
	struct kolo_comm *comm;
	struct kolo_elastic_state st;
	bool announced; /* the last EMEMBERSHIP came from a commit point */
	bool left;
	int64_t commits; /* the number of the last commit, the same on every rank */
	bool due;        /* the last commit is a durable one on this rank */
};

static bool engine_running(struct kolo_comm *comm)
{
	pthread_mutex_lock(&comm->engine_lock);
	bool on = comm->engine != NULL;
	pthread_mutex_unlock(&comm->engine_lock);
	return on;
}

/* Collectives of the state API: through the engine once it owns the ring
 * (the training loop uses the async API), else blocking. */
static kolo_status_t state_max_i32(struct kolo_comm *comm, int32_t *v, size_t n)
{
	if (!engine_running(comm))
		return kolo_allreduce(comm, v, v, n, KOLO_INT32, KOLO_MAX);
	kolo_handle_t *h = NULL;
	kolo_status_t st = kolo_allreduce_async(comm, "kolo.elastic.commit", v, v, n, KOLO_INT32,
	                                        KOLO_MAX, 1.0, 1.0, NULL, NULL, &h);
	return st == KOLO_OK ? kolo_wait(h) : st;
}

static kolo_status_t state_bcast(struct kolo_comm *comm, struct kolo_elastic_buf *b)
{
	if (!engine_running(comm))
		return kolo_broadcast(comm, b->buf, b->count, b->dtype, 0);
	char name[KOLO_ELASTIC_NAME_MAX + 32];
	snprintf(name, sizeof(name), "kolo.elastic.sync.%s", b->name);
	kolo_handle_t *h = NULL;
	kolo_status_t st =
	        kolo_broadcast_async(comm, name, b->buf, b->count, b->dtype, 0, NULL, NULL, &h);
	return st == KOLO_OK ? kolo_wait(h) : st;
}

KOLO_API kolo_status_t kolo_state_create(kolo_comm_t *comm, kolo_state_t **out)
{
	if (!out)
		return KOLO_EINVAL;
	*out = NULL;
	if (!comm)
		return KOLO_EINVAL;
	struct kolo_state *s = calloc(1, sizeof(*s));
	if (!s)
		return kolo_comm_fail(comm, KOLO_ENOMEM, "kolo_state_create: out of memory");
	s->comm = comm;
	kolo_elastic_state_init(&s->st);
	*out = s;
	return KOLO_OK;
}

KOLO_API void kolo_state_destroy(kolo_state_t *s)
{
	if (!s)
		return;
	kolo_elastic_state_fini(&s->st);
	free(s);
}

KOLO_API kolo_status_t kolo_state_register(kolo_state_t *s, const char *name, void *buf,
                                           size_t count, kolo_dtype_t dtype)
{
	if (!s)
		return KOLO_EINVAL;
	struct kolo_errbuf eb = {{0}};
	kolo_status_t st = kolo_elastic_state_add(&s->st, name, buf, count, dtype, &eb);
	if (st != KOLO_OK)
		return kolo_comm_fail(s->comm, st, "kolo_state_register: %s", eb.msg);
	return KOLO_OK;
}

KOLO_API kolo_status_t kolo_state_restore(kolo_state_t *s)
{
	if (!s)
		return KOLO_EINVAL;
	if (kolo_elastic_state_load(&s->st) != KOLO_OK)
		return kolo_comm_fail(s->comm, KOLO_EINVAL,
		                      "kolo_state_restore: nothing committed");
	return KOLO_OK;
}

KOLO_API bool kolo_state_left(const kolo_state_t *s)
{
	/* The comm's flag: a job that finished while kolo_reform() waited. */
	return s && (s->left || s->comm->left);
}

KOLO_API int64_t kolo_state_commit_number(const kolo_state_t *s)
{
	return s ? s->commits : 0;
}

KOLO_API bool kolo_durable_due(const kolo_state_t *s)
{
	return s && s->due;
}

KOLO_API kolo_status_t kolo_durable_put(kolo_state_t *s, const void *data, size_t len)
{
	if (!s || (!data && len))
		return KOLO_EINVAL;
	return kolo_runtime_durable_put(s->comm, data, len, s->commits);
}

KOLO_API kolo_status_t kolo_durable_resume(kolo_state_t *s, void **data, size_t *len,
                                           int64_t *commit)
{
	if (!s || !data || !len || !commit)
		return KOLO_EINVAL;
	*data = NULL;
	*len = 0;
	if (s->st.saved || s->commits > 0)
		return KOLO_ENOTFOUND;
	kolo_status_t st = kolo_runtime_durable_resume(s->comm, data, len, commit);
	if (st == KOLO_OK)
		s->commits = *commit;
	return st;
}

/* The commit just agreed is number n: a durable one on rank 0 every
 * KOLO_DURABLE_EVERY, written here when the state has registered buffers
 * (a state without, Python's, puts its own payload). */
static void commit_numbered(struct kolo_state *s, int64_t n)
{
	s->commits = n;
	s->due = kolo_runtime_durable_due(s->comm, n);
	if (!s->due || s->st.n == 0)
		return;
	void *data = NULL;
	size_t len = 0;
	if (kolo_elastic_state_pack(&s->st, &data, &len) == KOLO_OK)
		kolo_runtime_durable_put(s->comm, data, len, n);
	else
		KOLO_WARN(SUBSYS, "durable commit %" PRId64 ": out of memory; not written", n);
	free(data);
}

/* At a sync before any commit: rank 0 takes the job's durable commit into
 * the registered buffers, which the sync then broadcasts. */
static kolo_status_t resume_buffers(struct kolo_state *s)
{
	void *data;
	size_t len;
	int64_t commit;
	kolo_status_t st = kolo_durable_resume(s, &data, &len, &commit);
	if (st == KOLO_ENOTFOUND)
		return KOLO_OK;
	if (st != KOLO_OK)
		return st;
	struct kolo_errbuf eb = {{0}};
	st = kolo_elastic_state_unpack(&s->st, data, len, &eb);
	free(data);
	if (st != KOLO_OK) {
		s->commits = 0;
		return kolo_comm_fail(s->comm, st,
		                      "durable commit %" PRId64 " cannot be resumed: %s", commit,
		                      eb.msg);
	}
	return KOLO_OK;
}

KOLO_API kolo_status_t kolo_state_sync(kolo_state_t *s)
{
	if (!s)
		return KOLO_EINVAL;
	if (s->st.n > 0) {
		kolo_status_t st = resume_buffers(s);
		if (st != KOLO_OK)
			return st;
	}
	for (size_t i = 0; i < s->st.n; i++) {
		struct kolo_elastic_buf *b = &s->st.bufs[i];
		kolo_status_t st = state_bcast(s->comm, b);
		if (st != KOLO_OK)
			return st;
	}
	kolo_elastic_state_save(&s->st);
	kolo_metrics_sync_done();
	return KOLO_OK;
}

/* Leaves the job now: out of the rendezvous, data plane closed. */
static void leave_now(struct kolo_state *s, const char *why)
{
	kolo_runtime_elastic_leave_job(s->comm, why);
	s->comm->left = true;
	s->left = true;
}

KOLO_API kolo_status_t kolo_state_commit(kolo_state_t *s)
{
	if (!s)
		return KOLO_EINVAL;
	struct kolo_comm *comm = s->comm;
	s->due = false;
	kolo_elastic_state_save(&s->st);
	if (!comm->elastic) {
		commit_numbered(s, s->commits + 1);
		return KOLO_OK;
	}
	struct kolo_rdzv_hb_state hb;
	kolo_rdzv_heartbeat_state(comm->rdzv, &hb);
	int64_t round = comm->assignment.round;
	/* A heartbeat from before this round says nothing about it. flags[2]:
	 * rank 0's straggler verdict (the rank to evict plus one). flags[3]: this
	 * commit's number, the highest proposed (a joiner's count starts at 0). */
	int32_t flags[4] = {
	        hb.last == KOLO_OK && hb.round == round && hb.pending_change,
	        kolo_elastic_leave_requested(),
	        kolo_runtime_straggler_verdict(comm),
	        (int32_t)(s->commits + 1),
	};
	int32_t mine = flags[1];
	kolo_status_t st = state_max_i32(comm, flags, 4);
	if (st != KOLO_OK)
		return st;
	commit_numbered(s, flags[3]);
	if (!flags[0] && !flags[1] && !flags[2])
		return KOLO_OK;
	s->announced = true;
	comm->change_at_commit = true;
	if (flags[2] - 1 == comm->assignment.rank) {
		char why[320];
		kolo_runtime_straggler_evicted(comm, why, sizeof(why));
		leave_now(s, "evicted as a straggler, at a commit point");
		return kolo_comm_fail(comm, KOLO_EMEMBERSHIP,
		                      "this worker was evicted from the job as a straggler: %s",
		                      why);
	}
	if (mine) {
		leave_now(s, "asked to leave (SIGTERM or a preemption notice), at a commit point");
		return kolo_comm_fail(comm, KOLO_EMEMBERSHIP, "this worker left the job");
	}
	return kolo_comm_fail(comm, KOLO_EMEMBERSHIP,
	                      "membership change at a commit point of round %" PRId64 ": %s", round,
	                      flags[0]   ? "workers wait to join"
	                      : flags[1] ? "a worker leaves"
	                                 : "rank 0 evicts a straggler");
}

KOLO_API void kolo_elastic_done(kolo_comm_t *comm)
{
	if (comm)
		comm->done = true;
}

KOLO_API kolo_status_t kolo_elastic_run(kolo_comm_t *comm, kolo_state_t *s, kolo_train_fn fn,
                                        void *arg)
{
	if (!comm || !s || !fn || s->comm != comm)
		return KOLO_EINVAL;
	int64_t limit = kolo_param_int(KOLO_P_ELASTIC_RESET_LIMIT);
	int resets = 0;
	for (;;) {
		kolo_status_t st = s->left ? KOLO_EMEMBERSHIP : kolo_state_sync(s);
		if (st == KOLO_OK)
			st = fn(comm, s, arg);
		if (st == KOLO_OK) {
			comm->done = true;
			return KOLO_OK;
		}
		if (s->left)
			return KOLO_ESHUTDOWN;
		if (!comm->elastic || !kolo_runtime_membership_failure(st))
			return st;
		if (kolo_elastic_leave_requested()) {
			/* SIGTERM while blocked: the collective was aborted. */
			leave_now(s, "SIGTERM, aborted a blocked collective");
			return KOLO_ESHUTDOWN;
		}
		if (!s->announced && kolo_elastic_state_load(&s->st) != KOLO_OK)
			KOLO_DEBUG(SUBSYS, "nothing committed yet to restore");
		KOLO_INFO(SUBSYS, "round %" PRId64 ": %s; %s", comm->assignment.round,
		          comm->err.msg[0] ? comm->err.msg : kolo_strerror(st),
		          s->announced ? "re-forming" : "restored the last commit, re-forming");
		s->announced = false;
		if (limit > 0 && resets >= limit)
			return kolo_comm_fail(comm, st,
			                      "kolo_elastic_run: reset limit %" PRId64
			                      " reached (KOLO_ELASTIC_RESET_LIMIT)",
			                      limit);
		resets++;
		st = kolo_reform(comm);
		if (st != KOLO_OK) {
			s->left = comm->left;
			return st;
		}
	}
}
