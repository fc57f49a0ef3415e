/* The straggler eviction policy: who is named, when, and who never is. */
#include <string.h>

#include "straggler.h"
#include "testutil.h"

/* Feeds steps of step_ms where rank slow (or nobody: -1) has lag slow_ms and
 * every other rank a small lag; returns the first step (1-based) at which a
 * rank was named, into *named, or 0. */
static int feed(struct kolo_straggler *p, int steps, int size, double step_ms, int slow,
                double slow_ms, int *named, char *why, size_t len)
{
	double lag[8];
	for (int s = 1; s <= steps; s++) {
		for (int r = 0; r < size; r++)
			lag[r] = r == slow ? slow_ms : 0.05 * r;
		int got = kolo_straggler_step(p, step_ms, lag, size, why, len);
		if (got >= 0) {
			*named = got;
			return s;
		}
	}
	*named = -1;
	return 0;
}

START_TEST(test_persistent_straggler_named_after_window)
{
	struct kolo_straggler *p = kolo_straggler_create(10, 20);
	char why[256] = "";
	int named;
	/* 30 ms of a 100 ms step: the others take 70, it makes them 43 % longer. */
	ck_assert_int_eq(feed(p, 30, 4, 100, 2, 30, &named, why, sizeof(why)), 10);
	ck_assert_int_eq(named, 2);
	ck_assert_msg(strstr(why, "rank 2 was the slowest in 10 of the last 10 steps") &&
	                      strstr(why, "43 %"),
	              "%s", why);
	/* The window starts over after a verdict. */
	ck_assert_int_eq(feed(p, 9, 4, 100, 2, 30, &named, why, sizeof(why)), 0);
	ck_assert_int_eq(feed(p, 1, 4, 100, 2, 30, &named, why, sizeof(why)), 1);
	ck_assert_int_eq(named, 2);
	kolo_straggler_destroy(p);
}
END_TEST

START_TEST(test_below_threshold_never)
{
	struct kolo_straggler *p = kolo_straggler_create(10, 20);
	int named;
	/* 15 of 100 ms: 17.6 % longer, under 20 %. */
	ck_assert_int_eq(feed(p, 100, 4, 100, 1, 15, &named, NULL, 0), 0);
	/* 17 of 100 ms: 20.5 %: named, a window after the reset. */
	kolo_straggler_reset(p, 4);
	ck_assert_int_eq(feed(p, 100, 4, 100, 1, 17, &named, NULL, 0), 10);
	ck_assert_int_eq(named, 1);
	/* Nobody slow at all. */
	ck_assert_int_eq(feed(p, 100, 4, 100, -1, 0, &named, NULL, 0), 0);
	kolo_straggler_destroy(p);
}
END_TEST

/* Slowest in 7 of 10 steps is not persistent; 8 of 10 is. */
START_TEST(test_three_steps_in_four)
{
	for (int hits = 7; hits <= 8; hits++) {
		struct kolo_straggler *p = kolo_straggler_create(10, 20);
		int got = -1;
		for (int s = 0; s < 10; s++) {
			double lag[3] = {0, 0, 0};
			/* the others: rank 0 is slowest in the remaining steps */
			if (s < hits)
				lag[2] = 50;
			else
				lag[0] = 50;
			got = kolo_straggler_step(p, 100, lag, 3, NULL, 0);
			if (s < 9)
				ck_assert_int_eq(got, -1);
		}
		ck_assert_int_eq(got, hits == 8 ? 2 : -1);
		kolo_straggler_destroy(p);
	}
}
END_TEST

/* Noise: the slowest rank changes every step. */
START_TEST(test_rotating_slowest_never)
{
	struct kolo_straggler *p = kolo_straggler_create(8, 10);
	for (int s = 0; s < 200; s++) {
		double lag[4] = {0.1, 0.1, 0.1, 0.1};
		lag[s % 4] = 40;
		ck_assert_int_eq(kolo_straggler_step(p, 100, lag, 4, NULL, 0), -1);
	}
	kolo_straggler_destroy(p);
}
END_TEST

/* A new round (reset, or another size) starts the window over. */
START_TEST(test_reset_and_resize)
{
	struct kolo_straggler *p = kolo_straggler_create(5, 20);
	int named;
	ck_assert_int_eq(feed(p, 4, 4, 100, 3, 50, &named, NULL, 0), 0);
	kolo_straggler_reset(p, 4);
	ck_assert_int_eq(feed(p, 4, 4, 100, 3, 50, &named, NULL, 0), 0);
	ck_assert_int_eq(feed(p, 4, 3, 100, 2, 50, &named, NULL, 0), 0); /* resized */
	ck_assert_int_eq(feed(p, 1, 3, 100, 2, 50, &named, NULL, 0), 1);
	ck_assert_int_eq(named, 2);
	/* A lag under the minimum makes nobody the slowest. */
	ck_assert_int_eq(feed(p, 50, 3, 1, 2, 0.4, &named, NULL, 0), 0);
	kolo_straggler_destroy(p);
}
END_TEST

START_TEST(test_bad_args)
{
	ck_assert_ptr_null(kolo_straggler_create(0, 20));
	ck_assert_ptr_null(kolo_straggler_create(10, 0));
	ck_assert_ptr_null(kolo_straggler_create(10, -5));
	double lag[1] = {100};
	ck_assert_int_eq(kolo_straggler_step(NULL, 1, lag, 1, NULL, 0), -1);
	struct kolo_straggler *p = kolo_straggler_create(1, 20);
	ck_assert_int_eq(kolo_straggler_step(p, 100, lag, 1, NULL, 0), -1); /* one rank */
	ck_assert_int_eq(kolo_straggler_step(p, 100, NULL, 2, NULL, 0), -1);
	kolo_straggler_destroy(p);
	kolo_straggler_destroy(NULL);
}
END_TEST

static Suite *straggler_suite(void)
{
	Suite *s = suite_create("straggler");
	TCase *tc = tcase_create("policy");
	tcase_set_timeout(tc, 10);
	tcase_add_test(tc, test_persistent_straggler_named_after_window);
	tcase_add_test(tc, test_below_threshold_never);
	tcase_add_test(tc, test_three_steps_in_four);
	tcase_add_test(tc, test_rotating_slowest_never);
	tcase_add_test(tc, test_reset_and_resize);
	tcase_add_test(tc, test_bad_args);
	suite_add_tcase(s, tc);
	return s;
}

KOLO_CHECK_MAIN(straggler_suite)
