/* Rank assignment with zones: against a reference, contiguity, stability. */
#include "rendezvous.h"
#include "testutil.h"

#include <stdio.h>
#include <string.h>

#define N_MAX 256

/* The rule written plainly: the workers listed zone by zone (zones in order
 * of first appearance of a host's first worker), host by host within a zone
 * (first appearance), each host's workers in their order; ranks follow that
 * list, and kolo_rdzv_assign_all of the list gives the rest. */
static void reference(const char *const *hosts, const char *const *zones, int n,
                      struct kolo_rdzv_slot *out)
{
	const char *hzone[N_MAX], *list[N_MAX];
	int at[N_MAX], m = 0;
	for (int i = 0; i < n; i++) {
		hzone[i] = zones[i];
		for (int k = 0; k < i; k++) {
			if (!strcmp(hosts[k], hosts[i])) {
				hzone[i] = hzone[k];
				break;
			}
		}
	}
	for (int z = 0; z < n; z++) {
		bool zfirst = true;
		for (int k = 0; k < z; k++)
			zfirst &= strcmp(hzone[k], hzone[z]) != 0;
		for (int h = z; zfirst && h < n; h++) {
			bool hfirst = !strcmp(hzone[h], hzone[z]);
			for (int k = 0; k < h; k++)
				hfirst &= strcmp(hosts[k], hosts[h]) != 0;
			for (int i = h; hfirst && i < n; i++) {
				if (!strcmp(hosts[i], hosts[h])) {
					at[m] = i;
					list[m++] = hosts[i];
				}
			}
		}
	}
	ck_assert_int_eq(m, n);
	struct kolo_rdzv_slot s[N_MAX];
	ck_assert_int_eq(kolo_rdzv_assign_all(list, n, s), KOLO_OK);
	for (int k = 0; k < n; k++)
		out[at[k]] = s[k];
}

/* Every zone's ranks form one interval. */
static void check_contiguous(const char *const *zones, int n, const struct kolo_rdzv_slot *s)
{
	const char *by_rank[N_MAX];
	for (int i = 0; i < n; i++)
		by_rank[s[i].rank] = zones[i];
	for (int r = 1; r < n; r++) {
		if (!strcmp(by_rank[r], by_rank[r - 1]))
			continue;
		for (int q = 0; q < r - 1; q++)
			ck_assert_msg(strcmp(by_rank[q], by_rank[r]) != 0, "zone %s split",
			              by_rank[r]);
	}
}

START_TEST(test_interleaved_hosts)
{
	/* Four hosts joined a, b, a, b by zone: the ring crosses zones twice. */
	const char *hosts[] = {"h0", "h1", "h2", "h3", "h0", "h1"};
	const char *zones[] = {"za", "zb", "za", "zb", "za", "zb"};
	struct kolo_rdzv_slot s[6];
	ck_assert_int_eq(kolo_rdzv_assign_zoned(hosts, zones, 6, s), KOLO_OK);
	const int rank[] = {0, 3, 2, 5, 1, 4};
	const int cross[] = {0, 2, 1, 3, 0, 1};
	const int csize[] = {4, 4, 4, 4, 2, 2};
	for (int i = 0; i < 6; i++) {
		ck_assert_int_eq(s[i].rank, rank[i]);
		ck_assert_int_eq(s[i].cross_rank, cross[i]);
		ck_assert_int_eq(s[i].cross_size, csize[i]);
	}
	check_contiguous(zones, 6, s);
}
END_TEST

START_TEST(test_no_zone_is_unzoned)
{
	const char *hosts[] = {"b", "a", "b", "c", "d", "b", "a", "d", "b", "d"};
	const char *empty[10] = {"", "", "", "", "", "", "", "", "", ""};
	struct kolo_rdzv_slot want[10], got[10], null_zones[10];
	ck_assert_int_eq(kolo_rdzv_assign_all(hosts, 10, want), KOLO_OK);
	ck_assert_int_eq(kolo_rdzv_assign_zoned(hosts, empty, 10, got), KOLO_OK);
	ck_assert_int_eq(kolo_rdzv_assign_zoned(hosts, NULL, 10, null_zones), KOLO_OK);
	ck_assert_mem_eq(want, got, sizeof(want));
	ck_assert_mem_eq(want, null_zones, sizeof(want));
}
END_TEST

START_TEST(test_random_vs_reference)
{
	static const char *hn[] = {"h0", "h1", "h2", "h3", "h4", "h5", "h6", "h7", "h8", "h9"};
	static const char *zn[] = {"", "z1", "z2", "z3"};
	uint64_t x = 2463534242ULL;
	for (int trial = 0; trial < 300; trial++) {
		int n = 1 + (int)(x % 120), nh = 1 + (int)((x >> 16) % 10);
		int nz = 1 + (int)((x >> 24) % 4);
		const char *hosts[N_MAX], *zones[N_MAX];
		for (int i = 0; i < n; i++) {
			x ^= x << 13;
			x ^= x >> 7;
			x ^= x << 17;
			hosts[i] = hn[x % (uint64_t)nh];
			/* mostly the zone of the host; sometimes another (ignored) */
			int h = (int)(hosts[i][1] - '0');
			zones[i] = zn[((x >> 32) % 8 ? (uint64_t)h : x >> 40) % (uint64_t)nz];
		}
		struct kolo_rdzv_slot got[N_MAX], want[N_MAX];
		ck_assert_int_eq(kolo_rdzv_assign_zoned(hosts, zones, n, got), KOLO_OK);
		reference(hosts, zones, n, want);
		ck_assert_mem_eq(got, want, sizeof(*got) * (size_t)n);
	}
}
END_TEST

/* Survivors of a zoned round, listed in their old rank order, keep that order
 * in the next round, and rank 0; a newcomer goes into its zone's block. */
START_TEST(test_stability)
{
	const char *hosts[] = {"a1", "b1", "a2", "b2"};
	const char *zones[] = {"A", "B", "A", "B"};
	struct kolo_rdzv_slot s1[4];
	ck_assert_int_eq(kolo_rdzv_assign_zoned(hosts, zones, 4, s1), KOLO_OK);
	/* ranks: a1 0, a2 1, b1 2, b2 3. a2 dies; a3 (zone A) joins. */
	const char *h2[] = {"a1", "b1", "b2", "a3"};
	const char *z2[] = {"A", "B", "B", "A"};
	struct kolo_rdzv_slot s2[4];
	ck_assert_int_eq(kolo_rdzv_assign_zoned(h2, z2, 4, s2), KOLO_OK);
	ck_assert_int_eq(s2[0].rank, 0);
	ck_assert_int_lt(s2[1].rank, s2[2].rank);
	ck_assert_int_eq(s2[3].rank, 1);
	check_contiguous(z2, 4, s2);
	/* A newcomer of a new zone goes last; no zone at all is a zone too. */
	const char *h3[] = {"a1", "a3", "b1", "b2", "c1", "d1"};
	const char *z3[] = {"A", "A", "B", "B", "C", ""};
	struct kolo_rdzv_slot s3[6];
	ck_assert_int_eq(kolo_rdzv_assign_zoned(h3, z3, 6, s3), KOLO_OK);
	for (int i = 0; i < 6; i++)
		ck_assert_int_eq(s3[i].rank, i);
}
END_TEST

/* members[0..n) by rank with the zones named by the letters of z ('-': none). */
static int zone_count(const char *z, int group)
{
	struct kolo_rdzv_member m[16];
	memset(m, 0, sizeof(m));
	int n = (int)strlen(z);
	for (int r = 0; r < n; r++) {
		m[r].rank = r;
		if (z[r] != '-')
			snprintf(m[r].zone, sizeof(m[r].zone), "zone-%c", z[r]);
	}
	return kolo_rdzv_zone_count(m, n, group);
}

/* A zone level needs ≥ 2 zones of ≥ 2 groups each, all alike, contiguous,
 * starting on group boundaries, every member in a zone. */
START_TEST(test_zone_count)
{
	ck_assert_int_eq(zone_count("aabb", 1), 2);
	ck_assert_int_eq(zone_count("aaabbbccc", 1), 3);
	ck_assert_int_eq(zone_count("aaaabbbb", 2), 2); /* 2 hosts of 2 ranks per zone */
	ck_assert_int_eq(zone_count("aabb", 2), 0);     /* one host per zone: hosts suffice */
	ck_assert_int_eq(zone_count("aaaa", 1), 0);     /* one zone */
	ck_assert_int_eq(zone_count("aaabb", 1), 0);    /* zones of different sizes */
	ck_assert_int_eq(zone_count("abab", 1), 0);     /* not contiguous */
	ck_assert_int_eq(zone_count("aabbaa", 1), 0);   /* a zone seen twice */
	ck_assert_int_eq(zone_count("aab-", 1), 0);     /* a member without a zone */
	ck_assert_int_eq(zone_count("----", 1), 0);     /* no zones at all */
	ck_assert_int_eq(zone_count("aaabbb", 2), 0);   /* a zone of 3 ranks, hosts of 2 */
	ck_assert_int_eq(zone_count("ab", 1), 0);       /* one rank per zone */
	ck_assert_int_eq(kolo_rdzv_zone_count(NULL, 4, 1), 0);
}
END_TEST

static Suite *assign_zone_suite(void)
{
	Suite *s = suite_create("rdzv_assign_zone");
	TCase *tc = tcase_create("zones");
	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, test_interleaved_hosts);
	tcase_add_test(tc, test_no_zone_is_unzoned);
	tcase_add_test(tc, test_random_vs_reference);
	tcase_add_test(tc, test_stability);
	tcase_add_test(tc, test_zone_count);
	suite_add_tcase(s, tc);
	return s;
}

KOLO_CHECK_MAIN(assign_zone_suite)
