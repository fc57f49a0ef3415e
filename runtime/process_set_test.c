/* Process sets (kolo_process_set_create): forked ranks joined with the
 * bootstrap API on two "hosts" (shared memory inside one, TCP between), sets
 * that overlap, are disjoint, leave a rank out and run at the same time;
 * every result is checked against float64 sums computed here from the
 * members' inputs. Then lists that disagree or are invalid, and a set whose
 * comm moved to a new epoch (as a re-form does). */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kolo/async.h"
#include "kolo/bootstrap.h"
#include "bootstrap_fork.h"
#include "runtime.h"
#include "testutil.h"

#define COUNT 1031

/* A set of the test: its members as a bit mask over the parent's ranks. */
struct plan {
	int n;
	int nsets;
	unsigned members[4];
};

static int n_members(unsigned m)
{
	return __builtin_popcount(m);
}

/* The members of m in rank order, into out; returns their count. */
static int member_list(unsigned m, int *out)
{
	int k = 0;
	for (int r = 0; r < 32; r++)
		if (m & (1u << r))
			out[k++] = r;
	return k;
}

static double input(int rank, int set, int i)
{
	return (double)(rank + 1) * (i % 97) + set * 0.5;
}

/* Checks an allreduce (sum) on set s against the sum over its members. */
static int check_sum(const double *v, unsigned m, int s)
{
	int ranks[32], k = member_list(m, ranks);
	for (int i = 0; i < COUNT; i++) {
		double want = 0;
		for (int j = 0; j < k; j++)
			want += input(ranks[j], s, i);
		if (v[i] != want)
			return 1;
	}
	return 0;
}

/* One rank: makes every set of the plan (the same order on every rank),
 * issues an async allreduce on each set it is in and one on the comm with
 * the same name, waits for them all, checks them, then a blocking allgather
 * of set ranks on each set, and frees the sets. */
static int run_rank(struct bootstrap_fork *x, int rank, const struct plan *p, const char *host)
{
	struct kolo_bootstrap_config cfg = {
	        .rank = rank, .size = p->n, .job = "ps-test", .token = "t", .timeout_ms = 20000};
	kolo_comm_t *comm, *sets[4] = {0};
	if (bootstrap_fork_join(x, &cfg, host, &comm) != 0)
		return 10;
	int bad = 0;
	for (int s = 0; s < p->nsets && !bad; s++) {
		int ranks[32], k = member_list(p->members[s], ranks);
		/* Every rank lists the members in its own order. */
		for (int j = 0; j < k / 2; j++) {
			int t = ranks[(j + rank) % k];
			ranks[(j + rank) % k] = ranks[j];
			ranks[j] = t;
		}
		if (kolo_process_set_create(comm, ranks, k, &sets[s]) != KOLO_OK)
			bad = 11;
		bool in = p->members[s] & (1u << rank);
		if (!bad && (sets[s] != NULL) != in)
			bad = 12;
		if (!bad && in &&
		    (kolo_size(sets[s]) != k ||
		     kolo_rank(sets[s]) != n_members(p->members[s] & ((1u << rank) - 1))))
			bad = 13;
	}
	double *v[5];
	kolo_handle_t *h[5] = {0};
	for (int s = 0; s <= p->nsets && !bad; s++) {
		kolo_comm_t *c = s < p->nsets ? sets[s] : comm;
		v[s] = malloc(COUNT * sizeof(double));
		for (int i = 0; i < COUNT; i++)
			v[s][i] = input(rank, s, i);
		if (c && kolo_allreduce_async(c, "same.name", v[s], v[s], COUNT, KOLO_FLOAT64,
		                              KOLO_SUM, 1.0, 1.0, NULL, NULL, &h[s]) != KOLO_OK)
			bad = 14;
	}
	for (int s = 0; s <= p->nsets && !bad; s++) {
		if (!h[s])
			continue;
		if (kolo_wait(h[s]) != KOLO_OK)
			bad = 15;
		else if (check_sum(v[s], s < p->nsets ? p->members[s] : (1u << p->n) - 1, s))
			bad = 16;
	}
	for (int s = 0; s < p->nsets && !bad; s++) {
		if (!sets[s])
			continue;
		int32_t mine = rank, all[8];
		if (kolo_allgather(sets[s], &mine, all, 1, KOLO_INT32) != KOLO_OK)
			bad = 17;
		int ranks[32], k = member_list(p->members[s], ranks);
		for (int j = 0; j < k && !bad; j++)
			if (all[j] != ranks[j])
				bad = 18;
	}
	for (int s = 0; s <= p->nsets && !bad; s++)
		free(v[s]);
	for (int s = 0; s < p->nsets; s++)
		if (kolo_process_set_free(sets[s]) != KOLO_OK)
			bad = bad ? bad : 19;
	pthread_barrier_wait(&x->barrier);
	kolo_finalize(comm);
	return bad;
}

static void run_job(const struct plan *p)
{
	struct bootstrap_fork *x = bootstrap_fork_new(p->n, sizeof(*x));
	ck_assert_ptr_nonnull(x);
	pid_t pid[BOOTSTRAP_FORK_MAX_RANKS];
	for (int r = 0; r < p->n; r++) {
		pid[r] = fork();
		ck_assert_int_ge(pid[r], 0);
		if (pid[r] == 0)
			_exit(run_rank(x, r, p, r < (p->n + 1) / 2 ? "hostA" : "hostB"));
	}
	for (int r = 0; r < p->n; r++) {
		int ws;
		ck_assert_int_eq(waitpid(pid[r], &ws, 0), pid[r]);
		ck_assert_msg(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "n=%d rank %d: status 0x%x",
		              p->n, r, ws);
	}
	munmap(x, sizeof(*x));
}

/* Even ranks, odd ranks (disjoint, both across hosts), all but the last
 * (overlapping both; the last rank is in neither) and the first alone. */
START_TEST(test_sets)
{
	static const int sizes[] = {2, 3, 4, 5, 8};
	const int n = sizes[_i];
	unsigned even = 0, odd = 0;
	for (int r = 0; r < n; r++)
		*(r % 2 ? &odd : &even) |= 1u << r;
	struct plan p = {
	        .n = n, .nsets = 4, .members = {even, odd ? odd : 1u, ((1u << n) - 1) >> 1, 1u}};
	run_job(&p);
}
END_TEST

static const char *host_for(int rank)
{
	return rank < 2 ? "hostA" : "hostB";
}

/* Rank 2 passes other members than the rest; then rank 1 passes a rank
 * that does not exist: every rank fails, with both lists named. */
static int run_mismatch(struct bootstrap_fork *x, int rank, int n)
{
	struct kolo_bootstrap_config cfg = {
	        .rank = rank, .size = n, .job = "ps-bad", .token = "t", .timeout_ms = 20000};
	kolo_comm_t *comm, *set = (kolo_comm_t *)1;
	if (bootstrap_fork_join(x, &cfg, host_for(rank), &comm) != 0)
		return 10;
	int bad = 0;
	int a[] = {0, 1}, b[] = {0, 2}, c[] = {0, 7};
	if (kolo_process_set_create(comm, rank == 2 ? b : a, 2, &set) != KOLO_EMISMATCH ||
	    set != NULL)
		bad = 11;
	else if (!strstr(kolo_last_error(comm), "rank 0 passed [0, 1], rank 2 passed [0, 2]"))
		bad = 12;
	if (!bad && (kolo_process_set_create(comm, rank == 1 ? c : a, 2, &set) != KOLO_EINVAL ||
	             !strstr(kolo_last_error(comm),
	                     rank == 1 ? "rank 7 is not a rank" : "rank 1 passed an invalid")))
		bad = 13;
	/* The comm still works, and so does a set made after the failures. */
	if (!bad &&
	    (kolo_process_set_create(comm, a, 2, &set) != KOLO_OK || (set != NULL) != (rank < 2)))
		bad = 14;
	if (!bad && set) {
		/* The comm moves on (as kolo_reform does): the set refuses ops. */
		float v = 1;
		if (kolo_allreduce(set, &v, &v, 1, KOLO_FLOAT32, KOLO_SUM) != KOLO_OK || v != 2)
			bad = 15;
		kolo_runtime_sets_invalidate(comm);
		if (!bad &&
		    (kolo_allreduce(set, &v, &v, 1, KOLO_FLOAT32, KOLO_SUM) != KOLO_EINVAL ||
		     !strstr(kolo_last_error(set), "create the set again")))
			bad = 16;
		kolo_process_set_free(set);
	}
	if (rank == 0 && kolo_process_set_free(comm) != KOLO_EINVAL)
		bad = bad ? bad : 17;
	pthread_barrier_wait(&x->barrier);
	kolo_finalize(comm);
	return bad;
}

START_TEST(test_mismatch)
{
	const int n = 3;
	struct bootstrap_fork *x = bootstrap_fork_new(n, sizeof(*x));
	ck_assert_ptr_nonnull(x);
	pid_t pid[3];
	for (int r = 0; r < n; r++) {
		pid[r] = fork();
		ck_assert_int_ge(pid[r], 0);
		if (pid[r] == 0)
			_exit(run_mismatch(x, r, n));
	}
	for (int r = 0; r < n; r++) {
		int ws;
		ck_assert_int_eq(waitpid(pid[r], &ws, 0), pid[r]);
		ck_assert_msg(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "rank %d: status 0x%x", r, ws);
	}
	munmap(x, sizeof(*x));
}
END_TEST

static Suite *process_set_suite(void)
{
	Suite *s = suite_create("process_set");
	TCase *tc = tcase_create("process_set");
	tcase_set_timeout(tc, 120);
	tcase_add_loop_test(tc, test_sets, 0, 5);
	tcase_add_test(tc, test_mismatch);
	suite_add_tcase(s, tc);
	return s;
}

KOLO_CHECK_MAIN(process_set_suite)
