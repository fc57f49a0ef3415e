/* Rank assignment against a brute-force reference. */
#include "rendezvous.h"
#include "testutil.h"

#include <stdio.h>
#include <string.h>

/* The definition, written as plainly as possible: hosts in order of first
 * appearance; ranks contiguous per host; local rank = position within the
 * host; cross rank = position of the host among hosts with that local rank. */
static void reference(const char *const *hosts, int n, struct kolo_rdzv_slot *out)
{
	int rank = 0;
	for (int i = 0; i < n; i++) {
		bool first = true;
		for (int k = 0; k < i; k++)
			first &= strcmp(hosts[k], hosts[i]) != 0;
		if (!first)
			continue;
		/* host of i, in first-appearance order: hand out its ranks now */
		int lr = 0;
		for (int k = i; k < n; k++) {
			if (strcmp(hosts[k], hosts[i]) != 0)
				continue;
			out[k].rank = rank++;
			out[k].local_rank = lr++;
		}
		for (int k = i; k < n; k++) {
			if (strcmp(hosts[k], hosts[i]) == 0)
				out[k].local_size = lr;
		}
	}
	for (int i = 0; i < n; i++) {
		out[i].size = n;
		int cr = 0, cs = 0;
		for (int k = 0; k < n; k++) {
			/* k is the first worker of its host with this local rank */
			if (out[k].local_rank != out[i].local_rank)
				continue;
			cs++;
			if (out[k].rank < out[i].rank)
				cr++;
		}
		out[i].cross_rank = cr;
		out[i].cross_size = cs;
	}
}

static void check_against_reference(const char *const *hosts, int n)
{
	struct kolo_rdzv_slot got[512], want[512];
	ck_assert_int_le(n, 512);
	ck_assert_int_eq(kolo_rdzv_assign_all(hosts, n, got), KOLO_OK);
	reference(hosts, n, want);
	bool seen[512] = {false};
	for (int i = 0; i < n; i++) {
		ck_assert_int_eq(got[i].rank, want[i].rank);
		ck_assert_int_eq(got[i].size, n);
		ck_assert_int_eq(got[i].local_rank, want[i].local_rank);
		ck_assert_int_eq(got[i].local_size, want[i].local_size);
		ck_assert_int_eq(got[i].cross_rank, want[i].cross_rank);
		ck_assert_int_eq(got[i].cross_size, want[i].cross_size);
		ck_assert(!seen[got[i].rank]);
		seen[got[i].rank] = true;
		struct kolo_rdzv_assignment a;
		int rank_of[512];
		kolo_rdzv_assign(hosts, n, i, &a, rank_of);
		ck_assert_int_eq(a.rank, want[i].rank);
		ck_assert_int_eq(a.cross_rank, want[i].cross_rank);
		ck_assert_int_eq(a.cross_size, want[i].cross_size);
		ck_assert_int_eq(a.n_members, n);
		ck_assert_ptr_null(a.members);
		ck_assert_int_eq(rank_of[i], want[i].rank);
		kolo_rdzv_assignment_fini(&a);
	}
}

START_TEST(test_uneven_hosts)
{
	/* b:4, a:2, c:1, d:3 interleaved */
	const char *hosts[] = {"b", "a", "b", "c", "d", "b", "a", "d", "b", "d"};
	int n = (int)KOLO_ARRAY_SIZE(hosts);
	struct kolo_rdzv_slot s[10];
	ck_assert_int_eq(kolo_rdzv_assign_all(hosts, n, s), KOLO_OK);
	/* written out by hand */
	const int rank[] = {0, 4, 1, 6, 7, 2, 5, 8, 3, 9};
	const int local[] = {0, 0, 1, 0, 0, 2, 1, 1, 3, 2};
	const int lsize[] = {4, 2, 4, 1, 3, 4, 2, 3, 4, 3};
	const int cross[] = {0, 1, 0, 2, 3, 0, 1, 2, 0, 1};
	const int csize[] = {4, 4, 3, 4, 4, 2, 3, 3, 1, 2};
	for (int i = 0; i < n; i++) {
		ck_assert_int_eq(s[i].rank, rank[i]);
		ck_assert_int_eq(s[i].local_rank, local[i]);
		ck_assert_int_eq(s[i].local_size, lsize[i]);
		ck_assert_int_eq(s[i].cross_rank, cross[i]);
		ck_assert_int_eq(s[i].cross_size, csize[i]);
	}
	check_against_reference(hosts, n);
}
END_TEST

START_TEST(test_random_vs_reference)
{
	char names[16][16];
	for (int h = 0; h < 16; h++)
		snprintf(names[h], sizeof(names[h]), "h%d", h);
	uint64_t x = 88172645463325252ULL;
	for (int trial = 0; trial < 300; trial++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		int n = 1 + (int)(x % 200);
		int nh = 1 + (int)((x >> 20) % 16);
		const char *hosts[200];
		for (int i = 0; i < n; i++) {
			x ^= x << 13;
			x ^= x >> 7;
			x ^= x << 17;
			hosts[i] = names[x % (uint64_t)nh];
		}
		check_against_reference(hosts, n);
	}
}
END_TEST

START_TEST(test_stability_rank0_oldest_survivor)
{
	/* Round 1 in join order. */
	const char *joined[] = {"a", "b", "a", "c", "b", "a"};
	int n = 6;
	struct kolo_rdzv_slot s1[6];
	ck_assert_int_eq(kolo_rdzv_assign_all(joined, n, s1), KOLO_OK);
	/* Workers by rank of round 1. */
	int by_rank[6];
	for (int i = 0; i < n; i++)
		by_rank[s1[i].rank] = i;
	ck_assert_int_eq(by_rank[0], 0);
	/* Rank 0 and one worker of b die: survivors in old rank order, then a
	 * new worker on host b. */
	const char *next[6];
	int who[6], m = 0;
	for (int r = 0; r < n; r++) {
		int i = by_rank[r];
		if (i == 0 || i == 1)
			continue;
		who[m] = i;
		next[m++] = joined[i];
	}
	who[m] = 6;
	next[m++] = "b";
	struct kolo_rdzv_slot s2[6];
	ck_assert_int_eq(kolo_rdzv_assign_all(next, m, s2), KOLO_OK);
	/* Rank 0 is the oldest survivor (worker 2, the older a). */
	for (int k = 0; k < m; k++) {
		if (s2[k].rank == 0)
			ck_assert_int_eq(who[k], 2);
	}
	/* Survivors keep their relative order. */
	for (int k = 0; k + 1 < m - 1; k++) {
		for (int l = k + 1; l < m - 1; l++) {
			if (s1[who[k]].rank < s1[who[l]].rank)
				ck_assert_int_lt(s2[k].rank, s2[l].rank);
		}
	}
	check_against_reference(next, m);
	/* Same input, same output. */
	struct kolo_rdzv_slot s3[6];
	kolo_rdzv_assign_all(next, m, s3);
	ck_assert_mem_eq(s2, s3, sizeof(struct kolo_rdzv_slot) * (size_t)m);
}
END_TEST

START_TEST(test_edges)
{
	const char *one[] = {"solo"};
	struct kolo_rdzv_slot s[1];
	ck_assert_int_eq(kolo_rdzv_assign_all(one, 1, s), KOLO_OK);
	ck_assert_int_eq(s[0].rank, 0);
	ck_assert_int_eq(s[0].size, 1);
	ck_assert_int_eq(s[0].cross_size, 1);
	ck_assert_int_eq(kolo_rdzv_assign_all(one, 0, s), KOLO_OK);
	struct kolo_rdzv_assignment a;
	kolo_rdzv_assign(one, 1, 5, &a, NULL); /* index out of range */
	ck_assert_int_eq(a.rank, -1);
	kolo_rdzv_assignment_fini(&a);
	kolo_rdzv_assignment_fini(NULL);
	/* 1024 workers, each its own host, and all on one host. */
	static char names[1024][16];
	static const char *hosts[1024];
	static struct kolo_rdzv_slot big[1024];
	for (int i = 0; i < 1024; i++) {
		snprintf(names[i], sizeof(names[i]), "n%d", i);
		hosts[i] = names[i];
	}
	ck_assert_int_eq(kolo_rdzv_assign_all(hosts, 1024, big), KOLO_OK);
	for (int i = 0; i < 1024; i++) {
		ck_assert_int_eq(big[i].rank, i);
		ck_assert_int_eq(big[i].cross_rank, i);
		ck_assert_int_eq(big[i].cross_size, 1024);
		ck_assert_int_eq(big[i].local_size, 1);
		hosts[i] = "same";
	}
	ck_assert_int_eq(kolo_rdzv_assign_all(hosts, 1024, big), KOLO_OK);
	for (int i = 0; i < 1024; i++) {
		ck_assert_int_eq(big[i].rank, i);
		ck_assert_int_eq(big[i].local_rank, i);
		ck_assert_int_eq(big[i].local_size, 1024);
		ck_assert_int_eq(big[i].cross_rank, 0);
		ck_assert_int_eq(big[i].cross_size, 1);
	}
}
END_TEST

static Suite *assign_suite(void)
{
	Suite *s = suite_create("rdzv_assign");
	TCase *tc = tcase_create("assign");
	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, test_uneven_hosts);
	tcase_add_test(tc, test_random_vs_reference);
	tcase_add_test(tc, test_stability_rank0_oldest_survivor);
	tcase_add_test(tc, test_edges);
	suite_add_tcase(s, tc);
	return s;
}

KOLO_CHECK_MAIN(assign_suite)
