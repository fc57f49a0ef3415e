/* The runtime reads the fusion engine's KOLO_* parameters, and Horovod's names
 * as aliases. */
#include <stdlib.h>
#include <string.h>

#include "fusion.h"
#include "runtime.h"
#include "testutil.h"

START_TEST(test_defaults)
{
	struct kolo_engine_config c;
	kolo_runtime_engine_config(&c);
	ck_assert_uint_eq(c.fusion_threshold, 128u << 20);
	ck_assert(c.cycle_time_ms == 1.0);
	ck_assert_int_eq(c.cache_capacity, 1024);
	ck_assert_str_eq(c.timeline, "");
	ck_assert(c.stall_check);
	ck_assert(c.stall_check_s == 60.0);
	ck_assert(c.stall_shutdown_s == 0.0);
	ck_assert(!c.autotune);
	ck_assert_int_eq(c.timeout_ms, 30000);
}
END_TEST

START_TEST(test_horovod_aliases)
{
	setenv("HOROVOD_FUSION_THRESHOLD", "67108864", 1);
	setenv("HOROVOD_CYCLE_TIME", "3.5", 1);
	setenv("HOROVOD_CACHE_CAPACITY", "0", 1);
	setenv("HOROVOD_TIMELINE", "/tmp/x.json", 1);
	setenv("HOROVOD_STALL_CHECK_TIME_SECONDS", "5", 1);
	setenv("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "9", 1);
	setenv("HOROVOD_AUTOTUNE", "1", 1);
	setenv("HOROVOD_AUTOTUNE_LOG", "/tmp/at.csv", 1);
	setenv("KOLO_FUSION_THRESHOLD", "1M", 1); /* kolo's own name wins */
	struct kolo_engine_config c;
	kolo_runtime_engine_config(&c);
	ck_assert_uint_eq(c.fusion_threshold, 1u << 20);
	ck_assert(c.cycle_time_ms == 3.5);
	ck_assert_int_eq(c.cache_capacity, 0);
	ck_assert_str_eq(c.timeline, "/tmp/x.json");
	ck_assert(c.stall_check_s == 5.0);
	ck_assert(c.stall_shutdown_s == 9.0);
	ck_assert(c.autotune);
	ck_assert_str_eq(c.autotune_log, "/tmp/at.csv");
	unsetenv("KOLO_FUSION_THRESHOLD");
	kolo_runtime_engine_config(&c);
	ck_assert_uint_eq(c.fusion_threshold, 64u << 20);
}
END_TEST

static Suite *config_suite(void)
{
	Suite *s = suite_create("fusion_config");
	TCase *tc = tcase_create("core");
	tcase_set_timeout(tc, 10);
	tcase_add_test(tc, test_defaults);
	tcase_add_test(tc, test_horovod_aliases);
	suite_add_tcase(s, tc);
	return s;
}

KOLO_CHECK_MAIN(config_suite)
