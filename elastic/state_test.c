/* The state registry: commit, restore, argument checks. */
#include <string.h>

#include "membership.h"
#include "testutil.h"

START_TEST(test_commit_restore)
{
	struct kolo_elastic_state s;
	struct kolo_errbuf eb = {{0}};
	float w[4] = {1, 2, 3, 4};
	int64_t step = 7;
	kolo_elastic_state_init(&s);
	ck_assert_int_eq(kolo_elastic_state_load(&s), KOLO_EINVAL);
	ck_assert_int_eq(kolo_elastic_state_add(&s, "w", w, 4, KOLO_FLOAT32, &eb), KOLO_OK);
	ck_assert_int_eq(kolo_elastic_state_add(&s, "step", &step, 1, KOLO_INT64, &eb), KOLO_OK);
	kolo_elastic_state_save(&s);
	w[2] = -1;
	step = 9;
	ck_assert_int_eq(kolo_elastic_state_load(&s), KOLO_OK);
	ck_assert(w[2] == 3.0f && w[0] == 1.0f);
	ck_assert_int_eq(step, 7);
	step = 11;
	kolo_elastic_state_save(&s);
	step = 0;
	ck_assert_int_eq(kolo_elastic_state_load(&s), KOLO_OK);
	ck_assert_int_eq(step, 11);
	kolo_elastic_state_fini(&s);
}
END_TEST

START_TEST(test_bad_args)
{
	struct kolo_elastic_state s;
	struct kolo_errbuf eb = {{0}};
	double d[2] = {0, 0};
	kolo_elastic_state_init(&s);
	ck_assert_int_eq(kolo_elastic_state_add(&s, "d", d, 2, KOLO_FLOAT64, &eb), KOLO_OK);
	ck_assert_int_eq(kolo_elastic_state_add(&s, "d", d, 2, KOLO_FLOAT64, &eb), KOLO_EINVAL);
	ck_assert(strstr(eb.msg, "twice") != NULL);
	ck_assert_int_eq(kolo_elastic_state_add(&s, "", d, 2, KOLO_FLOAT64, &eb), KOLO_EINVAL);
	ck_assert_int_eq(kolo_elastic_state_add(&s, "x", d, 2, (kolo_dtype_t)99, &eb), KOLO_EINVAL);
	ck_assert_int_eq(kolo_elastic_state_add(&s, "n", NULL, 2, KOLO_FLOAT64, &eb), KOLO_EINVAL);
	ck_assert_int_eq(kolo_elastic_state_add(&s, "empty", NULL, 0, KOLO_FLOAT64, &eb), KOLO_OK);
	kolo_elastic_state_save(&s);
	ck_assert_int_eq(kolo_elastic_state_load(&s), KOLO_OK);
	kolo_elastic_state_fini(&s);
}
END_TEST

START_TEST(test_keys)
{
	char k[96];
	kolo_elastic_key_alive(k, sizeof(k), 3, 12);
	ck_assert_str_eq(k, "elastic/3/alive/12");
	kolo_elastic_key_change(k, sizeof(k), 4);
	ck_assert_str_eq(k, "elastic/4/change");
}
END_TEST

static Suite *elastic_suite(void)
{
	Suite *s = suite_create("elastic");
	TCase *tc = tcase_create("state");
	tcase_set_timeout(tc, 10);
	tcase_add_test(tc, test_commit_restore);
	tcase_add_test(tc, test_bad_args);
	tcase_add_test(tc, test_keys);
	suite_add_tcase(s, tc);
	return s;
}

KOLO_CHECK_MAIN(elastic_suite)
