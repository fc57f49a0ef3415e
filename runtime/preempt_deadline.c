/* preempt_deadline: a preemption notice's deadline in the runtime
 * (docs/spot.md). A notice is a leave at the next commit point; when none
 * came by the deadline less KOLO_PREEMPTION_MARGIN_MS, the watcher thread
 * that saw the notice calls kolo_runtime_preempt_deadline(), which takes
 * the worker out of the job (the process then exits 0): the others learn at
 * once and restore their last commit, as after any lost member, instead of
 * waiting for a machine that the cloud stops mid-step. */
#include "durable.h"
#include "kolo/elastic.h"
#include "membership.h"
#include "preempt.h"
#include "runtime.h"

#include <inttypes.h>
#include <stdio.h>

#define SUBSYS "elastic"
/* Of the time left, kept for the leave itself (a DELETE, a KV put, the
 * exit) after waiting for a durable commit in flight. */
#define LEAVE_RESERVE_MS 500

/* The rendezvous requests of the forced leave end at the deadline (or
 * LEAVE_RESERVE_MS from now when it is that close): a server that does not
 * answer must not hold the exit until the cloud stops the machine. Static: the hook outlives the
 * call, and only one such leave ever runs (the process exits). */
static uint64_t leave_by;

static bool past_leave_by(void *arg)
{
	(void)arg;
	return kolo_now_ms() >= leave_by;
}

bool kolo_runtime_preempt_deadline(void *arg, const char *notice, int64_t left_ms)
{
	struct kolo_comm *comm = arg;
	pthread_mutex_lock(&comm->deadline_lock);
	if (comm->deadline_off) {
		pthread_mutex_unlock(&comm->deadline_lock);
		return false;
	}
	/* Held until the process exits: a leave at a commit point or a
	 * kolo_finalize() that comes now waits in kolo_runtime_preempt_disarm. */
	KOLO_WARN(SUBSYS,
	          "%s: no commit point came and the machine goes in %" PRId64
	          " ms: leaving the job now rather than being stopped mid-step "
	          "(KOLO_PREEMPTION_MARGIN_MS); the others restore their last commit",
	          notice, left_ms);
	if (comm->durable) {
		int wait = (int)KOLO_MAX(left_ms - LEAVE_RESERVE_MS, 0);
		uint64_t t0 = kolo_now_ms();
		if (kolo_durable_writer_wait(comm->durable, wait))
			KOLO_INFO(SUBSYS,
			          "the durable commit in flight is written (waited %" PRIu64 " ms)",
			          kolo_now_ms() - t0);
		else
			KOLO_WARN(SUBSYS,
			          "a durable commit still being written after %d ms: leaving "
			          "without it (the previous one stands)",
			          wait);
	}
	pthread_mutex_lock(&comm->elastic_lock);
	int64_t round = comm->live_round; /* 0 while re-forming */
	pthread_mutex_unlock(&comm->elastic_lock);
	kolo_elastic_left(comm->elastic); /* its watcher forces no second leave */
	/* Replaces the hook of a re-form in progress, which cancels every
	 * request once a leave is asked for: these must go out. */
	leave_by = kolo_now_ms() + (uint64_t)KOLO_MAX(kolo_preempt_deadline_ms(), LEAVE_RESERVE_MS);
	kolo_rdzv_set_cancel(comm->rdzv, past_leave_by, NULL);
	if (kolo_rdzv_leave(comm->rdzv) != KOLO_OK)
		KOLO_WARN(SUBSYS, "leave: %s", kolo_rdzv_client_error(comm->rdzv));
	if (round > 0) {
		/* The round's end: every member's watcher aborts its ring now,
		 * and finds the round the DELETE formed. */
		char key[96];
		kolo_elastic_key_change(key, sizeof(key), round);
		kolo_rdzv_kv_put(comm->rdzv, key, "1", 1);
	}
	return true;
}

void kolo_runtime_preempt_disarm(struct kolo_comm *comm)
{
	pthread_mutex_lock(&comm->deadline_lock);
	comm->deadline_off = true;
	pthread_mutex_unlock(&comm->deadline_lock);
}

KOLO_API int64_t kolo_elastic_preemption_deadline_ms(void)
{
	return kolo_preempt_deadline_ms();
}
