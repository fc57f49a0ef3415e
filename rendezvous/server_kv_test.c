/* The KV store's atomic operations (add, compare_set, delete, count) and the
 * server-wide totals they keep, on one job without a server. */
#include <stdint.h>
#include <string.h>

#include "server_internal.h"
#include "testutil.h"

static struct rdzv_state st;
static struct rdzv_job *j;

static void kv_setup(void)
{
	memset(&st, 0, sizeof(st));
	j = rdzv_job_get(&st, "job", true, 0);
	ck_assert_ptr_nonnull(j);
}

static void kv_teardown(void)
{
	kolo_strmap_fini(&st.jobs, rdzv_job_free);
}

static void put(const char *key, const char *text)
{
	ck_assert_int_eq(rdzv_kv_put(&st, j, key, text, strlen(text)), KOLO_OK);
}

/* The value under key is exactly text (no NUL, no newline). */
static void value_is(const char *key, const char *text)
{
	const struct rdzv_kv_val *v = kolo_strmap_get(&j->kv, key);
	ck_assert_msg(v != NULL, "%s is absent", key);
	ck_assert_uint_eq(v->len, strlen(text));
	ck_assert_msg(memcmp(v->data, text, v->len) == 0, "%s: %.*s != %s", key, (int)v->len,
	              v->data, text);
}

static void totals_are(size_t keys, size_t bytes)
{
	ck_assert_uint_eq(st.kv_keys, keys);
	ck_assert_uint_eq(st.kv_bytes, bytes);
}

/* An absent key counts as 0; every add stores the sum in decimal. */
START_TEST(add_from_absent)
{
	ck_assert_int_eq(rdzv_kv_add(&st, j, "n", 5), RDZV_KV_STORED);
	value_is("n", "5");
	totals_are(1, 1);
	ck_assert_int_eq(rdzv_kv_add(&st, j, "n", -7), RDZV_KV_STORED);
	value_is("n", "-2");
	ck_assert_int_eq(rdzv_kv_add(&st, j, "n", 0), RDZV_KV_STORED);
	value_is("n", "-2");
	totals_are(1, 2);
	ck_assert_int_eq(rdzv_kv_add(&st, j, "z", 0), RDZV_KV_STORED);
	value_is("z", "0");
	totals_are(2, 3);
}
END_TEST

/* A value put by PUT is read as [+-]digits, nothing more. */
START_TEST(add_reads_decimal_values)
{
	put("a", "0042");
	ck_assert_int_eq(rdzv_kv_add(&st, j, "a", 1), RDZV_KV_STORED);
	value_is("a", "43");
	put("b", "+7");
	ck_assert_int_eq(rdzv_kv_add(&st, j, "b", -8), RDZV_KV_STORED);
	value_is("b", "-1");
	const char *bad[] = {"", "-", "+", " 3", "3 ", "3\n", "12a", "0x10", "1e3", "--1", "1.0"};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		put("c", bad[i]);
		size_t bytes = st.kv_bytes;
		ck_assert_msg(rdzv_kv_add(&st, j, "c", 1) == RDZV_KV_NOT_INT, "\"%s\"", bad[i]);
		value_is("c", bad[i]);
		ck_assert_uint_eq(st.kv_bytes, bytes);
	}
	/* Bytes with a NUL are not a number either. */
	ck_assert_int_eq(rdzv_kv_put(&st, j, "d", "1\0002", 3), KOLO_OK);
	ck_assert_int_eq(rdzv_kv_add(&st, j, "d", 1), RDZV_KV_NOT_INT);
}
END_TEST

/* int64's bounds: reached exactly, never passed; a value past them is not
 * an integer. */
START_TEST(add_overflow)
{
	put("max", "9223372036854775807");
	ck_assert_int_eq(rdzv_kv_add(&st, j, "max", 1), RDZV_KV_OVERFLOW);
	value_is("max", "9223372036854775807");
	ck_assert_int_eq(rdzv_kv_add(&st, j, "max", INT64_MIN), RDZV_KV_STORED);
	value_is("max", "-1");
	put("min", "-9223372036854775808");
	ck_assert_int_eq(rdzv_kv_add(&st, j, "min", -1), RDZV_KV_OVERFLOW);
	ck_assert_int_eq(rdzv_kv_add(&st, j, "min", INT64_MIN), RDZV_KV_OVERFLOW);
	value_is("min", "-9223372036854775808");
	ck_assert_int_eq(rdzv_kv_add(&st, j, "min", 0), RDZV_KV_STORED);
	value_is("min", "-9223372036854775808");
	ck_assert_int_eq(rdzv_kv_add(&st, j, "min", INT64_MAX), RDZV_KV_STORED);
	value_is("min", "-1");
	ck_assert_int_eq(rdzv_kv_add(&st, j, "new", INT64_MIN), RDZV_KV_STORED);
	value_is("new", "-9223372036854775808");
	put("big", "9223372036854775808");
	ck_assert_int_eq(rdzv_kv_add(&st, j, "big", -1), RDZV_KV_NOT_INT);
	put("small", "-9223372036854775809");
	ck_assert_int_eq(rdzv_kv_add(&st, j, "small", 1), RDZV_KV_NOT_INT);
}
END_TEST

/* torch's compare_set: store on a match, or on an absent key when the
 * expected value is empty; else keep. */
START_TEST(compare_set_rules)
{
	ck_assert_int_eq(rdzv_kv_compare_set(&st, j, "k", "x", 1, "new", 3), RDZV_KV_ABSENT);
	ck_assert_ptr_null(kolo_strmap_get(&j->kv, "k"));
	totals_are(0, 0);
	ck_assert_int_eq(rdzv_kv_compare_set(&st, j, "k", "", 0, "first", 5), RDZV_KV_STORED);
	value_is("k", "first");
	totals_are(1, 5);
	/* An empty expected value matches only an absent key or an empty one. */
	ck_assert_int_eq(rdzv_kv_compare_set(&st, j, "k", "", 0, "other", 5), RDZV_KV_KEPT);
	ck_assert_int_eq(rdzv_kv_compare_set(&st, j, "k", "firs", 4, "other", 5), RDZV_KV_KEPT);
	ck_assert_int_eq(rdzv_kv_compare_set(&st, j, "k", "first!", 6, "other", 5), RDZV_KV_KEPT);
	ck_assert_int_eq(rdzv_kv_compare_set(&st, j, "k", "First", 5, "other", 5), RDZV_KV_KEPT);
	value_is("k", "first");
	ck_assert_int_eq(rdzv_kv_compare_set(&st, j, "k", "first", 5, "2nd", 3), RDZV_KV_STORED);
	value_is("k", "2nd");
	totals_are(1, 3);
	ck_assert_int_eq(rdzv_kv_compare_set(&st, j, "k", "2nd", 3, "", 0), RDZV_KV_STORED);
	value_is("k", "");
	totals_are(1, 0);
	ck_assert_int_eq(rdzv_kv_compare_set(&st, j, "k", "", 0, "\0b", 2), RDZV_KV_STORED);
	ck_assert_int_eq(rdzv_kv_compare_set(&st, j, "k", "\0a", 2, "no", 2), RDZV_KV_KEPT);
	ck_assert_int_eq(rdzv_kv_compare_set(&st, j, "k", "\0b", 2, "yes", 3), RDZV_KV_STORED);
	value_is("k", "yes");
	totals_are(1, 3);
}
END_TEST

/* Neither operation passes RDZV_KV_TOTAL_MAX; a refused one changes
 * nothing. */
START_TEST(store_full)
{
	put("k", "12");
	st.kv_bytes = RDZV_KV_TOTAL_MAX; /* as if the other jobs held the rest */
	ck_assert_int_eq(rdzv_kv_add(&st, j, "n", 1), RDZV_KV_FULL);
	ck_assert_ptr_null(kolo_strmap_get(&j->kv, "n"));
	ck_assert_int_eq(rdzv_kv_add(&st, j, "k", 100), RDZV_KV_FULL);
	value_is("k", "12");
	ck_assert_int_eq(rdzv_kv_add(&st, j, "k", 1), RDZV_KV_STORED); /* same length */
	value_is("k", "13");
	ck_assert_int_eq(rdzv_kv_compare_set(&st, j, "k", "13", 2, "abc", 3), RDZV_KV_FULL);
	ck_assert_int_eq(rdzv_kv_compare_set(&st, j, "c", "", 0, "a", 1), RDZV_KV_FULL);
	ck_assert_int_eq(rdzv_kv_compare_set(&st, j, "k", "13", 2, "x", 1), RDZV_KV_STORED);
	value_is("k", "x");
	totals_are(1, RDZV_KV_TOTAL_MAX - 1);
}
END_TEST

/* Deletes take a key out of its job and of the totals; the count follows. */
START_TEST(delete_and_count)
{
	ck_assert_uint_eq(rdzv_kv_count(j), 0);
	ck_assert(!rdzv_kv_delete(&st, j, "nothing"));
	put("a", "1");
	put("b", "22");
	put("c/d", "");
	ck_assert_uint_eq(rdzv_kv_count(j), 3);
	totals_are(3, 3);
	struct rdzv_job *other = rdzv_job_get(&st, "other", true, 0);
	ck_assert_int_eq(rdzv_kv_put(&st, other, "b", "4444", 4), KOLO_OK);
	totals_are(4, 7);
	ck_assert(rdzv_kv_delete(&st, j, "b"));
	ck_assert_ptr_null(kolo_strmap_get(&j->kv, "b"));
	ck_assert_uint_eq(rdzv_kv_count(j), 2);
	ck_assert_uint_eq(rdzv_kv_count(other), 1);
	totals_are(3, 5);
	ck_assert(!rdzv_kv_delete(&st, j, "b"));
	totals_are(3, 5);
	ck_assert(rdzv_kv_delete(&st, j, "c/d"));
	ck_assert(rdzv_kv_delete(&st, j, "a"));
	ck_assert_uint_eq(rdzv_kv_count(j), 0);
	totals_are(1, 4);
	/* A deleted counter starts from 0 again. */
	ck_assert_int_eq(rdzv_kv_add(&st, j, "a", 3), RDZV_KV_STORED);
	value_is("a", "3");
	totals_are(2, 5);
	/* Forgetting the jobs leaves the totals at 0. */
	rdzv_kv_forget(&st, j);
	rdzv_kv_forget(&st, other);
	totals_are(0, 0);
}
END_TEST

static Suite *server_kv_suite(void)
{
	Suite *s = suite_create("server_kv");
	TCase *tc = tcase_create("kv");
	tcase_add_checked_fixture(tc, kv_setup, kv_teardown);
	tcase_add_test(tc, add_from_absent);
	tcase_add_test(tc, add_reads_decimal_values);
	tcase_add_test(tc, add_overflow);
	tcase_add_test(tc, compare_set_rules);
	tcase_add_test(tc, store_full);
	tcase_add_test(tc, delete_and_count);
	suite_add_tcase(s, tc);
	return s;
}

KOLO_CHECK_MAIN(server_kv_suite)
