#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "testutil.h"

START_TEST(status_strings)
{
	ck_assert_str_eq(kolo_strerror(KOLO_OK), "success");
	ck_assert_str_eq(kolo_status_name(KOLO_ETIMEDOUT), "KOLO_ETIMEDOUT");
	ck_assert_str_eq(kolo_strerror((kolo_status_t)999), "unknown status");
}
END_TEST

START_TEST(dtypes_and_ops)
{
	kolo_dtype_t d;
	ck_assert_int_eq(kolo_dtype_parse("bfloat16", &d), KOLO_OK);
	ck_assert_int_eq(d, KOLO_BFLOAT16);
	ck_assert_uint_eq(kolo_dtype_size(d), 2);
	ck_assert_int_eq(kolo_dtype_parse("float", &d), KOLO_OK);
	ck_assert_int_eq(d, KOLO_FLOAT32);
	ck_assert_int_eq(kolo_dtype_parse("complex", &d), KOLO_EINVAL);
	ck_assert_uint_eq(kolo_dtype_size((kolo_dtype_t)42), 0);
	kolo_op_t op;
	ck_assert_int_eq(kolo_op_parse("max", &op), KOLO_OK);
	ck_assert_int_eq(op, KOLO_MAX);
	ck_assert_int_eq(kolo_op_parse("xor", &op), KOLO_EINVAL);
}
END_TEST

START_TEST(reducescatter_split)
{
	/* 10 over 4 ranks: 3,3,2,2; the parts add up for any count. */
	ck_assert_uint_eq(kolo_reducescatter_count(10, 4, 0), 3);
	ck_assert_uint_eq(kolo_reducescatter_count(10, 4, 3), 2);
	for (size_t count = 0; count < 40; count++) {
		for (int n = 1; n <= 7; n++) {
			size_t sum = 0;
			for (int r = 0; r < n; r++)
				sum += kolo_reducescatter_count(count, n, r);
			ck_assert_uint_eq(sum, count);
		}
	}
}
END_TEST

START_TEST(params_env_alias_default)
{
	unsetenv("KOLO_FUSION_THRESHOLD");
	unsetenv("HOROVOD_FUSION_THRESHOLD");
	ck_assert_int_eq(kolo_param_int(KOLO_P_FUSION_THRESHOLD), 128 * 1024 * 1024);
	ck_assert_str_eq(kolo_param_source(KOLO_P_FUSION_THRESHOLD), "default");
	setenv("HOROVOD_FUSION_THRESHOLD", "1048576", 1);
	ck_assert_int_eq(kolo_param_int(KOLO_P_FUSION_THRESHOLD), 1048576);
	ck_assert_str_eq(kolo_param_source(KOLO_P_FUSION_THRESHOLD), "alias");
	setenv("KOLO_FUSION_THRESHOLD", "64M", 1);
	ck_assert_int_eq(kolo_param_int(KOLO_P_FUSION_THRESHOLD), 64 * 1024 * 1024);
	ck_assert_str_eq(kolo_param_source(KOLO_P_FUSION_THRESHOLD), "env");
	setenv("HOROVOD_GLOO_TIMEOUT_SECONDS", "7", 1);
	unsetenv("KOLO_TIMEOUT_MS");
	ck_assert_int_eq(kolo_param_int(KOLO_P_TIMEOUT_MS), 7000);
	setenv("KOLO_ELASTIC", "true", 1);
	ck_assert(kolo_param_bool(KOLO_P_ELASTIC));
	setenv("KOLO_ELASTIC", "0", 1);
	ck_assert(!kolo_param_bool(KOLO_P_ELASTIC));
}
END_TEST

START_TEST(parse_size)
{
	uint64_t x;
	ck_assert_int_eq(kolo_parse_size("4096", &x), KOLO_OK);
	ck_assert_uint_eq(x, 4096);
	ck_assert_int_eq(kolo_parse_size("256M", &x), KOLO_OK);
	ck_assert_uint_eq(x, 256ull << 20);
	ck_assert_int_eq(kolo_parse_size("1GiB", &x), KOLO_OK);
	ck_assert_uint_eq(x, 1ull << 30);
	ck_assert_int_eq(kolo_parse_size("12Q", &x), KOLO_EINVAL);
	ck_assert_int_eq(kolo_parse_size("", &x), KOLO_EINVAL);
}
END_TEST

START_TEST(hmac_rfc4231)
{
	/* RFC 4231 test case 2. */
	static const uint8_t want[KOLO_HMAC_SIZE] = {
	        0x5b, 0xdc, 0xc1, 0x46, 0xbf, 0x60, 0x75, 0x4e, 0x6a, 0x04, 0x24,
	        0x26, 0x08, 0x95, 0x75, 0xc7, 0x5a, 0x00, 0x3f, 0x08, 0x9d, 0x27,
	        0x39, 0x83, 0x9d, 0xec, 0x58, 0xb9, 0x64, 0xec, 0x38, 0x43};
	uint8_t got[KOLO_HMAC_SIZE];
	const char *msg = "what do ya want for nothing?";
	kolo_hmac_sha256("Jefe", 4, msg, strlen(msg), got);
	ck_assert(kolo_consttime_equal(got, want, sizeof(want)));
	got[31] ^= 1;
	ck_assert(!kolo_consttime_equal(got, want, sizeof(want)));
	ck_assert(kolo_consttime_streq("secret", "secret"));
	ck_assert(!kolo_consttime_streq("secret", "secreT"));
	ck_assert(!kolo_consttime_streq("secret", "secret2"));
}
END_TEST

START_TEST(random_hex_distinct)
{
	char a[33], b[33];
	ck_assert_int_eq(kolo_random_hex(a, 16), KOLO_OK);
	ck_assert_int_eq(kolo_random_hex(b, 16), KOLO_OK);
	ck_assert_uint_eq(strlen(a), 32);
	ck_assert_str_ne(a, b);
	for (int i = 0; i < 1000; i++)
		ck_assert_uint_lt(kolo_random_below(7), 7);
}
END_TEST

START_TEST(cpu_quota)
{
	ck_assert_int_eq(kolo_cpu_quota_parse("max 100000"), 0);
	ck_assert_int_eq(kolo_cpu_quota_parse("200000 100000"), 2);
	ck_assert_int_eq(kolo_cpu_quota_parse("150000 100000"), 2); /* 1.5 CPUs: rounded up */
	ck_assert_int_eq(kolo_cpu_quota_parse("50000 100000"), 1);
	ck_assert_int_eq(kolo_cpu_quota_parse("-1 100000"), 0); /* cgroup v1: no limit */
	ck_assert_int_eq(kolo_cpu_quota_parse("100000 0"), 0);
	ck_assert_int_eq(kolo_cpu_quota_parse("100000"), 0);
	ck_assert_int_eq(kolo_cpu_quota_parse("abc 100000"), 0);
	ck_assert_int_eq(kolo_cpu_quota_parse(""), 0);
	ck_assert_int_eq(kolo_cpu_quota_parse(NULL), 0);
	cpu_set_t set;
	ck_assert_int_eq(sched_getaffinity(0, sizeof(set), &set), 0);
	int n = kolo_cpu_count();
	ck_assert_int_ge(n, 1);
	ck_assert_int_le(n, CPU_COUNT(&set));
}
END_TEST

START_TEST(fail_formats)
{
	struct kolo_errbuf eb = {{0}};
	ck_assert_int_eq(kolo_fail(&eb, KOLO_EPEER, "rank %d died", 3), KOLO_EPEER);
	ck_assert_str_eq(eb.msg, "rank 3 died");
	char small[4];
	ck_assert_int_eq(kolo_strfmt(small, sizeof(small), "%s", "abcdef"), KOLO_EINVAL);
	ck_assert_int_eq(kolo_strfmt(small, sizeof(small), "%s", "abc"), KOLO_OK);
}
END_TEST

static Suite *core_suite(void)
{
	Suite *s = suite_create("core");
	TCase *tc = tcase_create("core");
	tcase_add_test(tc, status_strings);
	tcase_add_test(tc, dtypes_and_ops);
	tcase_add_test(tc, reducescatter_split);
	tcase_add_test(tc, params_env_alias_default);
	tcase_add_test(tc, parse_size);
	tcase_add_test(tc, hmac_rfc4231);
	tcase_add_test(tc, random_hex_distinct);
	tcase_add_test(tc, fail_formats);
	tcase_add_test(tc, cpu_quota);
	suite_add_tcase(s, tc);
	return s;
}

KOLO_CHECK_MAIN(core_suite)
