/* Round formation, leases and claims driven by a fake clock: the state
 * functions take `now`, so every deadline is stepped over exactly. */
#include <string.h>

#include "server_internal.h"
#include "testutil.h"

static struct rdzv_state st;

static void state_setup(int min_np, int max_np, int settle_ms, int lease_ms)
{
	memset(&st, 0, sizeof(st));
	st.cfg.min_np = min_np;
	st.cfg.max_np = max_np;
	st.cfg.settle_ms = settle_ms;
	st.cfg.lease_ms = lease_ms;
}

static void state_teardown(void)
{
	kolo_strmap_fini(&st.jobs, rdzv_job_free);
}

static struct rdzv_worker *join_zone_at(struct rdzv_job *j, const char *host, const char *zone,
                                        uint64_t now)
{
	struct kolo_rdzv_join_req jr = {.round = -1, .rank = -1};
	snprintf(jr.host, sizeof(jr.host), "%s", host);
	snprintf(jr.zone, sizeof(jr.zone), "%s", zone);
	bool retry;
	struct rdzv_worker *w = rdzv_job_join(&st, j, &jr, now, &retry);
	ck_assert_ptr_nonnull(w);
	ck_assert(!retry);
	return w;
}

static struct rdzv_worker *join_at(struct rdzv_job *j, const char *host, uint64_t now)
{
	return join_zone_at(j, host, "", now);
}

static struct rdzv_worker *claim_at(struct rdzv_job *j, const char *id, int64_t round, int rank,
                                    uint64_t now)
{
	struct kolo_rdzv_join_req jr = {.round = round, .rank = rank};
	snprintf(jr.host, sizeof(jr.host), "h");
	snprintf(jr.worker_id, sizeof(jr.worker_id), "%s", id);
	bool retry;
	struct rdzv_worker *w = rdzv_job_join(&st, j, &jr, now, &retry);
	ck_assert_ptr_nonnull(w);
	return w;
}

/* A job whose first round formed from n workers joined at 0, ticked at
 * `at`; w[] (n long, or NULL) gets the workers in join order. */
static struct rdzv_job *formed_job(int n, uint64_t at, struct rdzv_worker **w)
{
	struct rdzv_job *j = rdzv_job_get(&st, "job", true, 0);
	for (int i = 0; i < n; i++) {
		struct rdzv_worker *x = join_at(j, "h", 0);
		if (w)
			w[i] = x;
	}
	rdzv_job_tick(&st, j, at);
	ck_assert_int_eq(j->round, 1);
	ck_assert_int_eq(j->n_members, n);
	return j;
}

/* The members reach the commit point of the current round. */
static void commit_all(struct rdzv_job *j)
{
	for (int r = 0; r < j->n_ranks; r++) {
		if (j->by_rank[r])
			j->by_rank[r]->commit_round = j->round;
	}
}

/* A round forms settle_ms after the last join, not a tick earlier; ranks
 * follow join order, grouped by host. */
START_TEST(settle_after_last_join)
{
	state_setup(2, 0, 100, 10000);
	struct rdzv_job *j = rdzv_job_get(&st, "job", true, 0);
	struct rdzv_worker *a = join_at(j, "h1", 0);
	struct rdzv_worker *b = join_at(j, "h2", 10);
	struct rdzv_worker *c = join_at(j, "h1", 50);
	uint64_t due = 50 + 100;
	ck_assert_uint_eq(rdzv_job_settle_deadline(j), due);
	rdzv_job_tick(&st, j, due - 1);
	ck_assert_int_eq(j->state, RDZV_JOB_WAITING);
	ck_assert_int_eq(j->round, 0);
	rdzv_job_tick(&st, j, due);
	ck_assert_int_eq(j->state, RDZV_JOB_RUNNING);
	ck_assert_int_eq(j->round, 1);
	ck_assert_int_eq(j->n_members, 3);
	ck_assert_uint_eq(st.rounds_formed, 1);
	/* h1's workers first (its first worker joined first), then h2's. */
	ck_assert_int_eq(a->rank, 0);
	ck_assert_int_eq(c->rank, 1);
	ck_assert_int_eq(b->rank, 2);
	ck_assert_int_eq(a->slot.local_size, 2);
	ck_assert(rdzv_job_assignment_ready(j, a, 0));
	ck_assert(!rdzv_job_assignment_ready(j, a, 1));
	ck_assert_str_eq(rdzv_job_state_word(j), "running");
	ck_assert_uint_eq(rdzv_job_settle_deadline(j), UINT64_MAX);
}
END_TEST

/* Reaching max_np forms the round at the join, without settling. */
START_TEST(max_np_forms_at_once)
{
	state_setup(1, 2, 100000, 10000);
	struct rdzv_job *j = rdzv_job_get(&st, "job", true, 0);
	join_at(j, "h", 0);
	ck_assert_int_eq(j->round, 0);
	join_at(j, "h", 1);
	ck_assert_int_eq(j->round, 1);
	ck_assert_int_eq(j->n_members, 2);
	/* A third waits, and is a pending change that fits no round. */
	join_at(j, "h", 2);
	ck_assert_int_eq(j->n_workers, 3);
	ck_assert(!rdzv_job_pending_change(j));
}
END_TEST

/* A worker joining a running round re-forms it only once every member
 * passed its commit point and settle_ms passed. */
START_TEST(pending_change_waits_for_commit)
{
	state_setup(2, 0, 100, 10000);
	struct rdzv_job *j = formed_job(2, 100, NULL);
	join_at(j, "h", 200);
	ck_assert(rdzv_job_pending_change(j));
	rdzv_job_tick(&st, j, 1000);
	ck_assert_int_eq(j->round, 1); /* members not at a commit point */
	ck_assert_uint_eq(rdzv_job_settle_deadline(j), UINT64_MAX);
	commit_all(j);
	ck_assert_uint_eq(rdzv_job_settle_deadline(j), 300);
	rdzv_job_tick(&st, j, 299);
	ck_assert_int_eq(j->round, 1);
	rdzv_job_tick(&st, j, 1000);
	ck_assert_int_eq(j->round, 2);
	ck_assert_int_eq(j->n_members, 3);
	ck_assert(!rdzv_job_pending_change(j));
}
END_TEST

/* A round that ended with every member alive (a timeout among live
 * ranks): once every member asks past it, the same workers form the next
 * round at once, with no change pending; the spare that max_np kept out
 * stays out. Not while one member still trains in the round. */
START_TEST(members_past_the_round_reform)
{
	state_setup(2, 3, 100, 10000);
	struct rdzv_worker *w[3];
	struct rdzv_job *j = formed_job(3, 100, w);
	struct rdzv_worker *spare = join_at(j, "h", 150);
	ck_assert(!rdzv_job_pending_change(j));
	w[0]->commit_round = w[1]->commit_round = j->round;
	rdzv_job_tick(&st, j, 200);
	ck_assert_int_eq(j->round, 1); /* w[2] has not left the round */
	w[2]->commit_round = j->round;
	rdzv_job_tick(&st, j, 201);
	ck_assert_int_eq(j->round, 2);
	ck_assert_int_eq(j->n_members, 3);
	for (int i = 0; i < 3; i++) {
		ck_assert_int_ge(w[i]->rank, 0);
		ck_assert(rdzv_job_assignment_ready(j, w[i], 1));
	}
	ck_assert_int_eq(spare->rank, -1);
	/* The new round runs until its members leave it in turn. */
	rdzv_job_tick(&st, j, 300);
	ck_assert_int_eq(j->round, 2);
}
END_TEST

/* Leases run out at exactly lease_ms; a held poll keeps them. A member
 * lost re-forms at once with the rest. */
START_TEST(lease_expiry_reforms)
{
	state_setup(3, 0, 0, 1000);
	struct rdzv_worker *w[3];
	struct rdzv_job *j = formed_job(3, 0, w);
	struct rdzv_worker *a = w[0];
	struct rdzv_worker *keep[2];
	int k = 0;
	for (int r = 0; r < j->n_ranks; r++) {
		if (j->by_rank[r] != a)
			keep[k++] = j->by_rank[r];
	}
	keep[0]->lease_deadline = keep[1]->lease_deadline = 5000;
	char a_id[KOLO_RDZV_ID_MAX];
	snprintf(a_id, sizeof(a_id), "%s", a->id);
	st.cfg.min_np = j->cfg.min_np = 2;
	ck_assert_uint_eq(rdzv_job_expire_leases(j, 999), 1000);
	ck_assert_int_eq(j->n_workers, 3);
	ck_assert_uint_eq(rdzv_job_expire_leases(j, 1000), 5000);
	ck_assert_int_eq(j->n_workers, 2);
	ck_assert_int_eq(j->state, RDZV_JOB_BROKEN);
	ck_assert_int_eq(j->n_evicted_since_round, 1);
	rdzv_job_tick(&st, j, 1000);
	ck_assert_int_eq(j->state, RDZV_JOB_RUNNING);
	ck_assert_int_eq(j->round, 2);
	ck_assert_int_eq(j->n_members, 2);
	ck_assert_int_eq(j->n_evicted_since_round, 0);
	char msg[400];
	ck_assert_ptr_null(rdzv_job_find_worker(j, "job", a_id, msg, sizeof(msg)));
	ck_assert_ptr_nonnull(strstr(msg, "(lease expired)"));
	/* A worker with a poll held is never expired. */
	keep[0]->n_polls = 1;
	rdzv_job_expire_leases(j, 6000);
	ck_assert_int_eq(j->n_workers, 1);
}
END_TEST

/* Hosts joined zone a, b, a, b get ranks zone by zone; after a loss, the
 * survivors keep their order and a newcomer takes its place in its zone. */
START_TEST(zones_contiguous_and_stable)
{
	state_setup(4, 0, 0, 1000);
	struct rdzv_job *j = rdzv_job_get(&st, "job", true, 0);
	const char *host[] = {"a1", "b1", "a2", "b2"}, *zone[] = {"a", "b", "a", "b"};
	struct rdzv_worker *w[4];
	for (int i = 0; i < 4; i++)
		w[i] = join_zone_at(j, host[i], zone[i], 0);
	rdzv_job_tick(&st, j, 0);
	ck_assert_int_eq(j->round, 1);
	const int want1[] = {0, 2, 1, 3};
	for (int i = 0; i < 4; i++)
		ck_assert_int_eq(w[i]->rank, want1[i]);
	st.cfg.min_np = j->cfg.min_np = 3;
	rdzv_job_drop(j, w[2], "test", true); /* a2, rank 1 */
	struct rdzv_worker *a3 = join_zone_at(j, "a3", "a", 0);
	rdzv_job_tick(&st, j, 0);
	ck_assert_int_eq(j->round, 2);
	ck_assert_ptr_eq(j->by_rank[0], w[0]);
	ck_assert_ptr_eq(j->by_rank[1], a3);
	ck_assert_ptr_eq(j->by_rank[2], w[1]);
	ck_assert_ptr_eq(j->by_rank[3], w[3]);
}
END_TEST

/* Seats for 2 (max_np): a lost member of zone a is replaced by the oldest
 * spare of zone a, not by an older spare of zone b; with no spare of its
 * zone, by the oldest spare. */
START_TEST(spare_of_the_lost_zone_first)
{
	state_setup(2, 2, 0, 1000);
	struct rdzv_job *j = rdzv_job_get(&st, "job", true, 0);
	struct rdzv_worker *a1 = join_zone_at(j, "a1", "a", 0);
	struct rdzv_worker *b1 = join_zone_at(j, "b1", "b", 0);
	rdzv_job_tick(&st, j, 0);
	ck_assert_int_eq(j->round, 1);
	struct rdzv_worker *b2 = join_zone_at(j, "b2", "b", 1);
	struct rdzv_worker *a2 = join_zone_at(j, "a2", "a", 2);
	st.cfg.min_np = j->cfg.min_np = 1;
	rdzv_job_drop(j, a1, "test", true);
	rdzv_job_tick(&st, j, 3);
	ck_assert_int_eq(j->round, 2);
	ck_assert_ptr_eq(j->by_rank[0], b1); /* the survivor keeps rank 0 */
	ck_assert_ptr_eq(j->by_rank[1], a2);
	ck_assert_int_eq(b2->rank, -1);
	ck_assert_int_eq(j->n_lost_zones, 0);
	/* b1 lost, no spare of zone b left but b2: b2 it is; then a2 lost with
	 * only c1 waiting: c1. */
	struct rdzv_worker *c1 = join_zone_at(j, "c1", "c", 4);
	rdzv_job_drop(j, b1, "test", true);
	rdzv_job_tick(&st, j, 5);
	ck_assert_int_eq(j->round, 3);
	ck_assert_int_ge(b2->rank, 0);
	ck_assert_int_eq(c1->rank, -1);
	rdzv_job_drop(j, a2, "test", true);
	rdzv_job_tick(&st, j, 6);
	ck_assert_int_eq(j->round, 4);
	ck_assert_int_ge(c1->rank, 0);
}
END_TEST

/* Members that all leave gracefully end the round without an eviction on
 * the count; the job then waits. */
START_TEST(graceful_leaves_are_counted_apart)
{
	state_setup(2, 0, 0, 1000);
	struct rdzv_worker *w[2];
	struct rdzv_job *j = formed_job(2, 0, w);
	struct rdzv_worker *a = w[0];
	char a_id[KOLO_RDZV_ID_MAX];
	snprintf(a_id, sizeof(a_id), "%s", a->id);
	rdzv_job_drop(j, a, "left", false);
	ck_assert_int_eq(j->state, RDZV_JOB_BROKEN);
	ck_assert_int_eq(j->n_evicted_since_round, 0);
	ck_assert_ptr_nonnull(strstr(j->dropped, "(left)"));
	rdzv_job_tick(&st, j, 10);
	ck_assert_int_eq(j->state, RDZV_JOB_WAITING);
	ck_assert_str_eq(rdzv_job_state_word(j), "waiting");
	ck_assert_int_eq(j->n_members, 0);
	ck_assert_str_eq(j->dropped, "");
	/* The worker that left is remembered with its reason; a stranger is
	 * told to register again. */
	char msg[400];
	ck_assert_ptr_null(rdzv_job_find_worker(j, "job", a_id, msg, sizeof(msg)));
	ck_assert_ptr_nonnull(strstr(msg, "(left)"));
	ck_assert_ptr_null(rdzv_job_find_worker(j, "job", "x", msg, sizeof(msg)));
	ck_assert_ptr_nonnull(strstr(msg, "unknown worker x"));
}
END_TEST

/* After a restart, claims rebuild the round; it re-forms settle_ms after
 * the last claim once every returning member is past it, and a rank that
 * never came back, reported failed, re-forms it at once. */
START_TEST(restored_round_from_claims)
{
	state_setup(1, 0, 100, 10000);
	struct rdzv_job *j = rdzv_job_get(&st, "job", true, 0);
	struct rdzv_worker *a = claim_at(j, "w-a", 7, 1, 0);
	ck_assert_int_eq(j->state, RDZV_JOB_RESTORED);
	ck_assert_int_eq(j->round, 7);
	ck_assert_int_eq(a->rank, 1);
	ck_assert(!rdzv_job_assignment_ready(j, a, 0)); /* no settled assignment */
	struct rdzv_worker *b = claim_at(j, "w-b", 7, 2, 40);
	ck_assert_int_eq(j->n_members, 2);
	/* A stale claim joins afresh. */
	struct rdzv_worker *c = claim_at(j, "w-c", 6, 0, 50);
	ck_assert_int_eq(c->rank, -1);
	rdzv_job_tick(&st, j, 500);
	ck_assert_int_eq(j->round, 7); /* the members are not past it */
	a->commit_round = b->commit_round = 7;
	ck_assert_uint_eq(rdzv_job_settle_deadline(j), 40 + 100);
	/* Rank 0 never came back: its failure report re-forms at once. */
	ck_assert(!rdzv_job_report_failure(&st, j, 6, 0, 60));
	ck_assert(rdzv_job_report_failure(&st, j, 7, 0, 60));
	ck_assert_int_eq(j->state, RDZV_JOB_RUNNING);
	ck_assert_int_eq(j->round, 8);
	ck_assert_int_eq(j->n_members, 3);
	ck_assert(rdzv_job_assignment_ready(j, c, 7));
}
END_TEST

/* Every member dies at once and its launcher reports each by id: the first
 * report ends the round (below min_np), so the second one's rank report
 * would be stale, but the id still finds it. The replacements then form a
 * round at once, without the dead; a report of an id that is gone, or of a
 * waiting worker, touches nobody else. */
START_TEST(dead_workers_reported_by_id)
{
	state_setup(2, 2, 100, 10000);
	struct rdzv_worker *w[2];
	struct rdzv_job *j = formed_job(2, 0, w);
	char a_id[KOLO_RDZV_ID_MAX], b_id[KOLO_RDZV_ID_MAX];
	snprintf(a_id, sizeof(a_id), "%s", w[0]->id);
	snprintf(b_id, sizeof(b_id), "%s", w[1]->id);
	ck_assert(rdzv_job_report_dead(&st, j, a_id, 10));
	ck_assert_int_eq(j->state, RDZV_JOB_WAITING);
	ck_assert_int_eq(j->n_workers, 1);
	ck_assert(!rdzv_job_report_failure(&st, j, 1, 1, 10)); /* the round is over */
	ck_assert_int_eq(j->n_workers, 1);
	ck_assert(rdzv_job_report_dead(&st, j, b_id, 10));
	ck_assert_int_eq(j->n_workers, 0);
	ck_assert(!rdzv_job_report_dead(&st, j, b_id, 10));
	char msg[400];
	ck_assert_ptr_null(rdzv_job_find_worker(j, "job", b_id, msg, sizeof(msg)));
	ck_assert_ptr_nonnull(strstr(msg, "(its process died)"));
	/* Long before the dead workers' leases would have run out. */
	struct rdzv_worker *c = join_at(j, "h", 20);
	struct rdzv_worker *d = join_at(j, "h", 20);
	ck_assert_int_eq(j->state, RDZV_JOB_RUNNING);
	ck_assert_int_eq(j->round, 2);
	ck_assert_int_eq(j->n_members, 2);
	ck_assert_int_ge(c->rank, 0);
	ck_assert_int_ge(d->rank, 0);
	ck_assert(!rdzv_job_report_dead(&st, j, a_id, 30));
	ck_assert_int_eq(j->round, 2);
	ck_assert_int_eq(j->n_members, 2);
	struct rdzv_worker *e = join_at(j, "h", 30); /* a spare beyond max_np */
	ck_assert_int_eq(e->rank, -1);
	ck_assert(rdzv_job_report_dead(&st, j, e->id, 40));
	ck_assert_int_eq(j->state, RDZV_JOB_RUNNING);
	ck_assert_int_eq(j->round, 2);
	ck_assert_int_eq(j->n_workers, 2);
	ck_assert_int_eq(j->n_members, 2);
}
END_TEST

/* Idle jobs are forgotten job_retain_ms after their last request. */
START_TEST(idle_jobs_forgotten)
{
	state_setup(1, 0, 0, 1000);
	st.cfg.job_retain_ms = 500;
	struct rdzv_job *j = rdzv_job_get(&st, "job", true, 100);
	ck_assert_uint_eq(rdzv_job_retain_deadline(&st, j), 600);
	ck_assert_int_eq(rdzv_kv_put(&st, j, "k", "abc", 3), KOLO_OK);
	ck_assert_uint_eq(st.kv_bytes, 3);
	rdzv_job_sweep(&st, 599);
	ck_assert_ptr_eq(rdzv_job_get(&st, "job", false, 599), j); /* and touched */
	rdzv_job_sweep(&st, 1098);
	ck_assert_uint_eq(st.jobs.n, 1);
	rdzv_job_sweep(&st, 1099);
	ck_assert_uint_eq(st.jobs.n, 0);
	ck_assert_uint_eq(st.kv_keys, 0);
	ck_assert_uint_eq(st.kv_bytes, 0);
}
END_TEST

/* A member that completes its training finishes the job: the workers
 * waiting to join are dropped with "job finished", no round forms when the
 * other members leave, and joins are refused until lease_ms after the last
 * worker went, when the job can run again. */
START_TEST(finished_job_forms_no_round)
{
	state_setup(1, 3, 100000, 1000);
	struct rdzv_job *j = rdzv_job_get(&st, "job", true, 0);
	struct rdzv_worker *a = join_at(j, "h", 0);
	struct rdzv_worker *b = join_at(j, "h", 0);
	struct rdzv_worker *c = join_at(j, "h", 0); /* max_np: the round forms */
	struct rdzv_worker *d = join_at(j, "h", 0);
	ck_assert_int_eq(j->round, 1);
	ck_assert_int_eq(j->n_members, 3);
	ck_assert_int_eq(d->rank, -1);
	char d_id[KOLO_RDZV_ID_MAX];
	snprintf(d_id, sizeof(d_id), "%s", d->id);
	rdzv_job_finish(&st, j, a, 100);
	ck_assert(j->finished);
	ck_assert_str_eq(rdzv_job_state_word(j), "finished");
	ck_assert_int_eq(j->n_workers, 2); /* b and c: still finishing */
	ck_assert_int_eq(j->round, 1);
	char msg[400];
	ck_assert_ptr_null(rdzv_job_find_worker(j, "job", d_id, msg, sizeof(msg)));
	ck_assert_msg(strncmp(msg, "job finished: worker ", 21) == 0, "%s", msg);
	ck_assert_ptr_nonnull(strstr(msg, "completed its training"));
	ck_assert_uint_eq(rdzv_job_settle_deadline(j), UINT64_MAX);
	/* A member leaves: c alone (min_np is 1) forms no round. */
	rdzv_job_drop(j, b, "left", false);
	rdzv_job_tick(&st, j, 150);
	ck_assert_int_eq(j->round, 1);
	ck_assert_str_eq(rdzv_job_state_word(j), "finished");
	ck_assert(!rdzv_job_assignment_ready(j, c, 0));
	rdzv_job_drop(j, c, "left", false);
	rdzv_job_tick(&st, j, 160);
	ck_assert_int_eq(j->n_workers, 0);
	/* A late spare is refused; a run lease_ms later starts afresh. */
	ck_assert(!rdzv_job_admits_join(&st, j, 1099));
	ck_assert(rdzv_job_admits_join(&st, j, 1100));
	ck_assert(!j->finished);
	for (int i = 0; i < 3; i++)
		join_at(j, "h", 1100);
	ck_assert_int_eq(j->round, 2);
	ck_assert_str_eq(rdzv_job_state_word(j), "running");
}
END_TEST

static Suite *server_state_suite(void)
{
	Suite *s = suite_create("server_state");
	TCase *tc = tcase_create("rounds");
	tcase_add_checked_fixture(tc, NULL, state_teardown);
	tcase_add_test(tc, settle_after_last_join);
	tcase_add_test(tc, max_np_forms_at_once);
	tcase_add_test(tc, pending_change_waits_for_commit);
	tcase_add_test(tc, members_past_the_round_reform);
	tcase_add_test(tc, lease_expiry_reforms);
	tcase_add_test(tc, zones_contiguous_and_stable);
	tcase_add_test(tc, spare_of_the_lost_zone_first);
	tcase_add_test(tc, graceful_leaves_are_counted_apart);
	tcase_add_test(tc, restored_round_from_claims);
	tcase_add_test(tc, dead_workers_reported_by_id);
	tcase_add_test(tc, idle_jobs_forgotten);
	tcase_add_test(tc, finished_job_forms_no_round);
	suite_add_tcase(s, tc);
	return s;
}

KOLO_CHECK_MAIN(server_state_suite)
