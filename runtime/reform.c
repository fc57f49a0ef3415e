/* Elastic training in the runtime: the watcher's abort and kolo_reform()
 * (the state API and kolo_elastic_run() are in elastic_state.c). The
 * membership logic below the data plane (arbitration, watcher, SIGTERM,
 * state copies) is in elastic/; this file composes it with the ring, the
 * transport and the fusion engine. */
#include "membership.h"
#include "preempt.h"
#include "fusion.h"
#include "hybrid.h"
#include "kolo/async.h"
#include "kolo/elastic.h"
#include "metrics.h"
#include "runtime.h"
#include "transport_tcp.h"

#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SUBSYS "elastic"

bool kolo_runtime_membership_failure(kolo_status_t st)
{
	return st == KOLO_EMEMBERSHIP || st == KOLO_EPEER || st == KOLO_ETIMEDOUT ||
	       st == KOLO_ECLOSED || st == KOLO_ENOTFOUND;
}

/* ---- the data plane under the elastic lock ------------------------------ */

/* The watcher's callback: the membership of round changed; fail whatever
 * runs on the comm of that round at once. */
static void on_change(void *arg, int64_t round, bool leave)
{
	struct kolo_comm *comm = arg;
	pthread_mutex_lock(&comm->elastic_lock);
	if (comm->live_round == round && comm->live_ring)
		kolo_ring_abort(comm->live_ring, KOLO_EMEMBERSHIP);
	pthread_mutex_unlock(&comm->elastic_lock);
	(void)leave;
}

/* Aborts and frees the engine, the ring and the transport. */
static void data_plane_teardown(struct kolo_comm *comm)
{
	pthread_mutex_lock(&comm->engine_lock);
	struct kolo_engine *engine = comm->engine;
	comm->engine = NULL;
	pthread_mutex_unlock(&comm->engine_lock);
	struct kolo_ring_comm *ring = comm->ring;
	struct kolo_transport *t = comm->transport;
	pthread_mutex_lock(&comm->elastic_lock);
	comm->live_ring = NULL;
	comm->live_round = 0;
	pthread_mutex_unlock(&comm->elastic_lock);
	comm->ring = NULL;
	comm->transport = NULL;
	if (ring)
		kolo_ring_abort(ring, KOLO_EMEMBERSHIP);
	/* Every queued operation completes with KOLO_EMEMBERSHIP; the engine's
	 * thread stops at once (its ring is aborted). */
	kolo_engine_abort(engine, KOLO_EMEMBERSHIP);
	kolo_engine_destroy(engine);
	kolo_runtime_p2p_destroy(comm, KOLO_EMEMBERSHIP, "the membership changed");
	/* The round's NCCL communicator goes with its ring (ncclCommAbort: a
	 * lost member never finishes); the next round forms its own. */
	kolo_device_nccl_reset(comm);
	kolo_ring_comm_destroy(ring);
	if (t)
		t->ops->destroy(t);
}

/* Makes the comm's ring the one the watcher may abort. */
static void publish_live(struct kolo_comm *comm)
{
	pthread_mutex_lock(&comm->elastic_lock);
	comm->live_ring = comm->ring;
	comm->live_round = comm->assignment.round;
	pthread_mutex_unlock(&comm->elastic_lock);
}

kolo_status_t kolo_runtime_elastic_start(struct kolo_comm *comm)
{
	if (!kolo_param_bool(KOLO_P_ELASTIC)) {
		const char *pre = kolo_param_str(KOLO_P_PREEMPTION);
		if (pre && *pre)
			KOLO_WARN(SUBSYS,
			          "KOLO_PREEMPTION=%s is ignored: a notice is a leave, and "
			          "only an elastic job (KOLO_ELASTIC=1) can lose a worker",
			          pre);
		return KOLO_OK;
	}
	if (kolo_elastic_signal_install() != KOLO_OK)
		KOLO_WARN(SUBSYS, "cannot install the SIGTERM handler; a reclaim will look like a "
		                  "failure");
	struct kolo_elastic_config cfg = {
	        .url = kolo_param_str(KOLO_P_RENDEZVOUS),
	        .job = kolo_param_str(KOLO_P_JOB),
	        .token = comm->token,
	        .host = comm->host,
	        .member = comm->rdzv,
	        .poll_ms = (int)kolo_param_int(KOLO_P_ELASTIC_POLL_MS),
	        .leave_grace_ms = (int)kolo_param_int(KOLO_P_ELASTIC_LEAVE_GRACE_MS),
	        .hang_ms = (int)KOLO_MIN(kolo_param_int(KOLO_P_ELASTIC_HANG_MS), INT32_MAX),
	        .on_change = on_change,
	        .arg = comm,
	};
	struct kolo_errbuf eb = {{0}};
	kolo_status_t st = kolo_elastic_create(&cfg, &comm->elastic, &eb);
	if (st != KOLO_OK)
		return kolo_comm_fail(comm, st, "starting the elastic watcher: %s", eb.msg);
	publish_live(comm);
	kolo_elastic_watch(comm->elastic, comm->assignment.round, comm->assignment.rank);
	/* Preemption notices (docs/spot.md): off unless KOLO_PREEMPTION says;
	 * a notice is a leave at the next commit point, as SIGTERM, or at once
	 * near its deadline (preempt_deadline.c). */
	struct kolo_preempt_config pc;
	st = kolo_preempt_config_load(&pc, &eb);
	pc.on_deadline = kolo_runtime_preempt_deadline;
	pc.arg = comm;
	if (st != KOLO_OK || kolo_preempt_create(&pc, &comm->preempt, &eb) != KOLO_OK)
		KOLO_WARN(SUBSYS, "not watching for preemption notices: %s", eb.msg);
	return KOLO_OK;
}

void kolo_runtime_elastic_stop(struct kolo_comm *comm)
{
	/* An Azure Preempt event is acknowledged once the worker is out. */
	kolo_preempt_destroy(comm->preempt, comm->left || comm->done);
	comm->preempt = NULL;
	kolo_elastic_destroy(comm->elastic);
	comm->elastic = NULL;
}

KOLO_API int kolo_elastic_preemption(char *buf, size_t len)
{
	return kolo_preempt_state(buf, len);
}

kolo_status_t kolo_runtime_elastic_failed(struct kolo_comm *comm, kolo_status_t st)
{
	/* The failures that end a comm (not a bad argument or a mismatch). */
	if (!comm->elastic && (st == KOLO_ETIMEDOUT || st == KOLO_EPEER || st == KOLO_EPROTO ||
	                       st == KOLO_ESYSTEM || st == KOLO_ECLOSED || st == KOLO_EMEMBERSHIP))
		kolo_runtime_diag_fatal(kolo_status_name(st));
	if (!comm->elastic || !kolo_runtime_membership_failure(st))
		return st;
	/* Wake every other rank now (their watchers abort their rings), and
	 * say that we are alive so that nobody reports us. Once per round:
	 * every failed handle of the round comes through here. */
	int64_t round = comm->assignment.round;
	pthread_mutex_lock(&comm->elastic_lock);
	bool first = comm->announced_round != round;
	comm->announced_round = round;
	pthread_mutex_unlock(&comm->elastic_lock);
	if (first)
		kolo_elastic_announce(comm->rdzv, round, comm->assignment.rank, true);
	kolo_metrics_failure_seen();
	return KOLO_EMEMBERSHIP;
}

KOLO_API bool kolo_elastic_enabled(const kolo_comm_t *comm)
{
	return comm && comm->elastic;
}

KOLO_API int kolo_elastic_resets(const kolo_comm_t *comm)
{
	return comm ? comm->resets : 0;
}

KOLO_API void kolo_elastic_leave(void)
{
	kolo_elastic_request_leave();
}

KOLO_API bool kolo_elastic_leaving(void)
{
	return kolo_elastic_leave_requested();
}

/* ---- reform -------------------------------------------------------------- */

/* Waits for a round after `after` (in which this worker was old_rank of
 * old_size). First reports `suspect` (the peer whose conn failed) when its
 * alive key does not appear within the confirm window. When no round comes
 * soon after that, the failure was not where this rank looked (a silent rank
 * found by a timeout blames whichever peer it was waiting for, often a live
 * one): then every rank of the old round without an alive key is reported.
 * Not after a commit point (failure false): everybody is alive then. */
/* Ranks of the old round whose hosts the transport found silent (the
 * liveness probe); the first KOLO_ARRAY_SIZE(ranks) of them. */
struct lost_ranks {
	int ranks[64];
	int n;
};

static void collect_lost(struct kolo_transport *t, int old_size, struct lost_ranks *out)
{
	out->n = 0;
	if (!t || !t->ops->unreachable)
		return;
	for (int r = 0; r < old_size && out->n < (int)KOLO_ARRAY_SIZE(out->ranks); r++)
		if (t->ops->unreachable(t, r))
			out->ranks[out->n++] = r;
}

static kolo_status_t next_round(struct kolo_comm *comm, int64_t after, int old_rank, int old_size,
                                int suspect, const struct lost_ranks *lost, bool failure,
                                uint64_t end_ms, struct kolo_rdzv_assignment *out)
{
	int confirm = (int)kolo_param_int(KOLO_P_ELASTIC_CONFIRM_MS);
	bool scanned = !failure;
	kolo_status_t st;
	/* A round after ours formed already (the dead worker's launcher saw it
	 * die and reported it, or another survivor did): nothing to report or
	 * confirm, take it. */
	int64_t current = 0;
	int current_size = 0;
	if (failure && kolo_rdzv_job_round(comm->rdzv, &current, &current_size) == KOLO_OK &&
	    current > after) {
		failure = false;
		suspect = -1;
		scanned = true;
	}
	/* Hosts the liveness probe found silent: nothing there answers this
	 * rank, whether their processes live (a partition) or not, and an
	 * alive key would not make them reachable. Reported at once. */
	for (int i = 0; failure && i < lost->n; i++) {
		KOLO_INFO(SUBSYS, "round %" PRId64 ": rank %d's host is unreachable; reporting it",
		          after, lost->ranks[i]);
		kolo_rdzv_report_failure(comm->rdzv, after, lost->ranks[i]);
		if (lost->ranks[i] == suspect)
			suspect = -1;
	}
	if (suspect >= 0) {
		bool dead = false;
		st = kolo_elastic_confirm_dead(comm->rdzv, after, suspect, confirm, &dead);
		if (st == KOLO_OK && dead) {
			KOLO_INFO(SUBSYS, "round %" PRId64 ": rank %d is dead; reporting it", after,
			          suspect);
			kolo_rdzv_report_failure(comm->rdzv, after, suspect);
		}
	}
	for (;;) {
		uint64_t now = kolo_now_ms();
		if (now >= end_ms)
			return KOLO_ETIMEDOUT;
		uint64_t left = end_ms - now;
		if (!scanned)
			left = KOLO_MIN(left, (uint64_t)(2 * confirm + 100));
		st = kolo_rdzv_wait_assignment(comm->rdzv, after, (int)KOLO_MIN(left, INT32_MAX),
		                               out);
		if (st != KOLO_ETIMEDOUT || scanned)
			return st;
		scanned = true;
		/* Every live rank published its key within the window (its
		 * watcher does so as soon as the round's change key appears). */
		for (int r = 0; r < old_size; r++) {
			bool dead = false;
			if (r == old_rank ||
			    kolo_elastic_confirm_dead(comm->rdzv, after, r, 0, &dead) != KOLO_OK ||
			    !dead)
				continue;
			KOLO_INFO(SUBSYS,
			          "round %" PRId64 ": rank %d never said it is alive; "
			          "reporting it",
			          after, r);
			kolo_rdzv_report_failure(comm->rdzv, after, r);
		}
	}
}

/* Before an evicted worker joins again: waits until this host reaches the
 * host of every member of the job's current round (kolo_tcp_host_answers on
 * the address each published). After a partition that cut this worker off,
 * joining at once would have it admitted at the next commit point, cut off
 * again by the first collective across the cut, and evicted again: a re-form
 * of the whole job each time. The round that evicted this worker is often so
 * new that its members have not published their addresses yet: each address
 * is waited for, up to MEMBERS_PUBLISH_MS for all of one check together
 * (without the wait, an unpublished round read as "every member answers" and
 * the worker joined across the cut). KOLO_OK also when it cannot tell (no
 * round, an address still not published); KOLO_ESHUTDOWN on SIGTERM,
 * KOLO_ETIMEDOUT at end_ms. One KV read and one TCP connect per member and
 * check. */
#define MEMBERS_PUBLISH_MS 2000
static kolo_status_t wait_members_answer(struct kolo_comm *comm, uint64_t end_ms)
{
	bool told = false;
	for (;;) {
		int64_t round = 0;
		int size = 0, silent = -1;
		if (kolo_rdzv_job_round(comm->rdzv, &round, &size) != KOLO_OK)
			return KOLO_OK;
		uint64_t publish_end = kolo_now_ms() + MEMBERS_PUBLISH_MS;
		for (int r = 0; r < size && silent < 0; r++) {
			char key[64];
			snprintf(key, sizeof(key), "addr/%" PRId64 "/%d", round, r);
			void *data = NULL;
			size_t len = 0;
			uint64_t now = kolo_now_ms();
			int wait_ms = now < publish_end ? (int)(publish_end - now) : 0;
			if (kolo_rdzv_kv_get(comm->rdzv, key, wait_ms, &data, &len) != KOLO_OK)
				continue;
			struct kolo_transport_handle h, net;
			if (len == sizeof(h)) {
				memcpy(h.bytes, data, sizeof(h));
				/* Only a TCP handle can be probed (a verbs one names
				 * no probe port). */
				if (kolo_hybrid_net_handle(&h, &net) == KOLO_OK &&
				    net.bytes[4] == KOLO_HANDLE_TCP &&
				    !kolo_tcp_host_answers(&net, 1000))
					silent = r;
			}
			free(data);
		}
		if (silent < 0) {
			if (told)
				KOLO_INFO(SUBSYS, "every member of round %" PRId64 " answers again",
				          round);
			return KOLO_OK;
		}
		if (!told)
			KOLO_WARN(SUBSYS,
			          "rank %d of round %" PRId64 " does not answer from this host (a "
			          "partition?); joining again once every member does",
			          silent, round);
		told = true;
		if (kolo_elastic_leave_requested())
			return KOLO_ESHUTDOWN;
		if (kolo_now_ms() >= end_ms)
			return KOLO_ETIMEDOUT;
		poll(NULL, 0, 500); /* the back-off between two checks */
	}
}

static kolo_status_t reform(struct kolo_comm *comm);

void kolo_runtime_elastic_leave_job(struct kolo_comm *comm, const char *why)
{
	kolo_runtime_preempt_disarm(comm);
	KOLO_INFO(SUBSYS, "leaving the job (%s)", why);
	kolo_elastic_left(comm->elastic);
	kolo_elastic_announce(comm->rdzv, comm->assignment.round, comm->assignment.rank, false);
	if (kolo_rdzv_leave(comm->rdzv) != KOLO_OK)
		KOLO_WARN(SUBSYS, "leave: %s", kolo_rdzv_client_error(comm->rdzv));
	data_plane_teardown(comm);
}

KOLO_API kolo_status_t kolo_reform(kolo_comm_t *comm)
{
	if (!comm)
		return KOLO_EINVAL;
	if (!comm->elastic)
		return kolo_comm_fail(comm, KOLO_EINVAL,
		                      "kolo_reform: the comm is not elastic (set KOLO_ELASTIC=1 or "
		                      "run under kolorun --min-np)");
	if (comm->left)
		return kolo_comm_fail(comm, KOLO_ESHUTDOWN,
		                      "kolo_reform: this worker left the job");
	/* A spot reclaim while we wait for a round (which may take until
	 * replacements come) must not wait with us: the rendezvous waits end
	 * within a second of SIGTERM, and the worker leaves. */
	kolo_rdzv_set_cancel(comm->rdzv, kolo_elastic_leave_cancels, NULL);
	kolo_status_t st = reform(comm);
	kolo_rdzv_set_cancel(comm->rdzv, NULL, NULL);
	if (st == KOLO_ESHUTDOWN && !kolo_elastic_leave_requested()) {
		/* A member completed the training while this worker waited:
		 * the job is over, and this worker is out of it. */
		KOLO_INFO(SUBSYS, "%s", comm->err.msg);
		kolo_elastic_left(comm->elastic);
		comm->left = true;
		return st;
	}
	if (st == KOLO_OK || !kolo_elastic_leave_requested())
		return st;
	kolo_runtime_elastic_leave_job(comm, "SIGTERM while re-forming");
	comm->left = true;
	return kolo_comm_fail(comm, KOLO_ESHUTDOWN,
	                      "kolo_reform: this worker left the job (SIGTERM while waiting for "
	                      "the next round)");
}

static kolo_status_t reform(struct kolo_comm *comm)
{
	uint64_t t0 = kolo_now_ms();
	comm->reform_ns[0] = kolo_now_ns();
	kolo_runtime_sets_invalidate(comm);
	int timeout = (int)KOLO_MIN(kolo_param_int(KOLO_P_ELASTIC_TIMEOUT_MS), INT32_MAX);
	uint64_t end = t0 + (uint64_t)KOLO_MAX(timeout, 0);
	int64_t round = comm->assignment.round;
	int old_rank = comm->assignment.rank, old_size = comm->assignment.size;
	bool at_commit = comm->change_at_commit;
	comm->change_at_commit = false;
	int suspect = comm->ring ? kolo_ring_failed_peer(comm->ring) : -1;
	struct lost_ranks lost;
	collect_lost(comm->transport, old_size, &lost);
	kolo_elastic_watch(comm->elastic, 0, old_rank);
	if (kolo_elastic_take_dropped(comm->elastic)) {
		/* The watcher took us out while this thread was stuck: come back
		 * as a new worker, as after an eviction. */
		if (comm->rejoins >= kolo_param_int(KOLO_P_ELASTIC_REJOINS))
			return kolo_comm_fail(comm, KOLO_EMEMBERSHIP,
			                      "kolo_reform: this worker was taken out of the job "
			                      "(its training thread did not re-form within "
			                      "KOLO_ELASTIC_HANG_MS) and has joined again %d times",
			                      comm->rejoins);
		KOLO_WARN(SUBSYS, "this worker was taken out of the job while its training thread "
		                  "was stuck; joining again as a new worker");
		comm->rejoins++;
		kolo_status_t rst = kolo_rdzv_rejoin(comm->rdzv);
		if (rst != KOLO_OK)
			return kolo_comm_fail(comm, rst, "kolo_reform: joining again: %s",
			                      kolo_rdzv_client_error(comm->rdzv));
		kolo_runtime_report_worker(comm);
		suspect = -1;
		lost.n = 0;
		at_commit = true;
	}
	/* Alive before we reset our conns; the round's end for everyone when
	 * it ended by a failure (at a commit point everyone knows already). */
	kolo_elastic_announce(comm->rdzv, round, old_rank, !at_commit);
	data_plane_teardown(comm);
	uint64_t t_down = kolo_now_ms();
	comm->reform_ns[1] = kolo_now_ns();
	kolo_status_t st;
	for (;;) {
		struct kolo_rdzv_assignment a;
		memset(&a, 0, sizeof(a));
		st = next_round(comm, round, old_rank, old_size, suspect, &lost, !at_commit, end,
		                &a);
		if (st == KOLO_ETIMEDOUT)
			return kolo_comm_fail(
			        comm, st,
			        "kolo_reform: no round including this worker formed "
			        "within %d ms after round %" PRId64
			        " (KOLO_ELASTIC_TIMEOUT_MS): fewer than min-np workers "
			        "remain and none joined",
			        timeout, round);
		if (st == KOLO_EMEMBERSHIP &&
		    comm->rejoins < kolo_param_int(KOLO_P_ELASTIC_REJOINS)) {
			/* Alive after all (a long pause, a false report): come
			 * back as a new worker; the others grow the job again. */
			KOLO_WARN(SUBSYS,
			          "the rendezvous evicted this worker (%s); joining again as a "
			          "new worker",
			          kolo_rdzv_client_error(comm->rdzv));
			comm->rejoins++;
			st = wait_members_answer(comm, end);
			if (st != KOLO_OK)
				return kolo_comm_fail(
				        comm, st,
				        "kolo_reform: evicted, and %s before this worker "
				        "could reach every member of the job again",
				        st == KOLO_ESHUTDOWN ? "SIGTERM came"
				                             : "KOLO_ELASTIC_TIMEOUT_MS passed");
			st = kolo_rdzv_rejoin(comm->rdzv);
			if (st != KOLO_OK)
				return kolo_comm_fail(comm, st, "kolo_reform: joining again: %s",
				                      kolo_rdzv_client_error(comm->rdzv));
			kolo_runtime_report_worker(comm);
			suspect = -1;
			lost.n = 0;
			at_commit = true; /* nothing of the old round to report */
			continue;
		}
		if (st == KOLO_EMEMBERSHIP)
			return kolo_comm_fail(
			        comm, st,
			        "kolo_reform: the rendezvous evicted this worker (it "
			        "was reported dead or missed its lease), %d times: %s",
			        comm->rejoins + 1, kolo_rdzv_client_error(comm->rdzv));
		if (st != KOLO_OK)
			return kolo_comm_fail(comm, st,
			                      "kolo_reform: waiting for the next round: %s",
			                      kolo_rdzv_client_error(comm->rdzv));
		kolo_rdzv_assignment_fini(&comm->assignment);
		comm->assignment = a;
		uint64_t t_round = kolo_now_ms();
		comm->reform_ns[2] = kolo_now_ns();
		st = kolo_runtime_data_plane_create(comm);
		if (st == KOLO_OK) {
			const struct kolo_rdzv_assignment *n = &comm->assignment;
			kolo_log_set_identity(comm->host, n->rank);
			kolo_runtime_report_rank(comm);
			publish_live(comm);
			kolo_elastic_watch(comm->elastic, n->round, n->rank);
			comm->reform_ns[3] = kolo_now_ns();
			comm->resets++;
			kolo_metrics_reform_done(comm->reform_ns, at_commit);
			uint64_t t1 = kolo_now_ms();
			KOLO_INFO(SUBSYS,
			          "re-formed: round %" PRId64 " -> %" PRId64
			          ", rank %d -> %d, size %d -> %d in %" PRIu64
			          " ms (teardown %" PRIu64 ", round %" PRIu64 ", connect %" PRIu64
			          ")%s",
			          round, n->round, old_rank, n->rank, old_size, n->size, t1 - t0,
			          t_down - t0, t_round - t_down, t1 - t_round,
			          at_commit ? " at a commit point" : "");
			comm->err.msg[0] = '\0';
			return KOLO_OK;
		}
		if (!kolo_runtime_membership_failure(st) && st != KOLO_ENOTFOUND)
			return st;
		/* The new round lost a member while connecting: next one. */
		KOLO_WARN(SUBSYS, "round %" PRId64 " failed while connecting: %s",
		          comm->assignment.round, comm->err.msg);
		round = comm->assignment.round;
		old_rank = comm->assignment.rank;
		old_size = comm->assignment.size;
		at_commit = false;
		suspect = comm->ring ? kolo_ring_failed_peer(comm->ring) : -1;
		collect_lost(comm->transport, old_size, &lost);
		kolo_elastic_announce(comm->rdzv, round, comm->assignment.rank, true);
		data_plane_teardown(comm);
	}
}

kolo_status_t kolo_runtime_elastic_connect(struct kolo_comm *comm)
{
	kolo_status_t st = kolo_runtime_data_plane_create(comm);
	if (st == KOLO_OK || !kolo_param_bool(KOLO_P_ELASTIC))
		return st;
	int timeout = (int)KOLO_MIN(kolo_param_int(KOLO_P_ELASTIC_TIMEOUT_MS), INT32_MAX);
	uint64_t end = kolo_now_ms() + (uint64_t)KOLO_MAX(timeout, 0);
	while (st != KOLO_OK && kolo_runtime_membership_failure(st)) {
		/* A member of the first round died while the round connected (a
		 * kill as the round formed): the others end the round and take
		 * the next one, and so does this worker, instead of failing. */
		const struct kolo_rdzv_assignment *cur = &comm->assignment;
		int64_t round = cur->round;
		int rank = cur->rank, size = cur->size;
		int suspect = comm->ring ? kolo_ring_failed_peer(comm->ring) : -1;
		struct lost_ranks lost;
		collect_lost(comm->transport, size, &lost);
		KOLO_WARN(SUBSYS,
		          "round %" PRId64 " failed while connecting: %s; taking the next one",
		          round, comm->err.msg);
		kolo_elastic_announce(comm->rdzv, round, rank, true);
		data_plane_teardown(comm);
		struct kolo_rdzv_assignment a;
		memset(&a, 0, sizeof(a));
		st = next_round(comm, round, rank, size, suspect, &lost, true, end, &a);
		if (st != KOLO_OK)
			return kolo_comm_fail(comm, st,
			                      "kolo_init: the first round failed while connecting, "
			                      "and no next one came: %s",
			                      kolo_rdzv_client_error(comm->rdzv));
		kolo_rdzv_assignment_fini(&comm->assignment);
		comm->assignment = a;
		kolo_log_set_identity(comm->host, a.rank);
		kolo_runtime_report_rank(comm);
		comm->err.msg[0] = '\0';
		st = kolo_runtime_data_plane_create(comm);
	}
	return st;
}
