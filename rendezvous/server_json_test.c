/* Validation of ids and of the request bodies the server accepts. */
#include "rendezvous.h"
#include "testutil.h"

#include <string.h>

#define PARSE_JOB(body, cfg) kolo_rdzv_parse_job_config(body, strlen(body), cfg, err, sizeof(err))
#define PARSE_JOIN(body, jr) kolo_rdzv_parse_join(body, strlen(body), jr, err, sizeof(err))

START_TEST(test_ids)
{
	char longest[KOLO_RDZV_ID_MAX], too_long[KOLO_RDZV_ID_MAX + 1];
	memset(longest, 'a', sizeof(longest) - 1);
	longest[sizeof(longest) - 1] = '\0';
	memset(too_long, 'a', sizeof(too_long) - 1);
	too_long[sizeof(too_long) - 1] = '\0';
	ck_assert(kolo_rdzv_valid_id("job-1.a_b:c", false));
	ck_assert(kolo_rdzv_valid_id(longest, false));
	ck_assert(!kolo_rdzv_valid_id(too_long, false));
	ck_assert(!kolo_rdzv_valid_id("", false));
	ck_assert(!kolo_rdzv_valid_id(NULL, false));
	ck_assert(!kolo_rdzv_valid_id("a b", false));
	ck_assert(!kolo_rdzv_valid_id("a%00", false));
	ck_assert(!kolo_rdzv_valid_id("a/b", false));
	ck_assert(kolo_rdzv_valid_id("round/3/addr/0", true));
	ck_assert(!kolo_rdzv_valid_id("é", true));
	ck_assert(kolo_rdzv_valid_host("node-7.cluster.local"));
	ck_assert(!kolo_rdzv_valid_host("node 7"));
	ck_assert(!kolo_rdzv_valid_host(""));
}
END_TEST

START_TEST(test_job_config)
{
	char err[256];
	struct kolo_rdzv_job_config c = {.min_np = 1, .max_np = 0, .settle_ms = 2000};
	ck_assert_int_eq(PARSE_JOB("{\"min_np\":2,\"max_np\":4,\"settle_ms\":10}", &c), KOLO_OK);
	ck_assert_int_eq(c.min_np, 2);
	ck_assert_int_eq(c.max_np, 4);
	ck_assert_int_eq(c.settle_ms, 10);
	/* absent fields keep their values */
	ck_assert_int_eq(PARSE_JOB("{\"settle_ms\":5}", &c), KOLO_OK);
	ck_assert_int_eq(c.min_np, 2);
	ck_assert_int_eq(c.settle_ms, 5);
	static const char *const bad[][2] = {
	        {"{", "malformed JSON"},
	        {"[]", "JSON object"},
	        {"", "empty body"},
	        {"{\"min_np\":\"2\"}", "\"min_np\" must be an integer"},
	        {"{\"min_np\":2.5}", "\"min_np\" must be an integer"},
	        {"{\"min_np\":0}", "\"min_np\" must be in"},
	        {"{\"max_np\":-1}", "\"max_np\" must be in"},
	        {"{\"settle_ms\":true}", "\"settle_ms\" must be an integer"},
	        {"{\"min_np\":5,\"max_np\":3}", "max_np (3)"},
	        {"{\"min_np\":1,\"min_np\":2}", "malformed JSON"},
	};
	for (size_t i = 0; i < KOLO_ARRAY_SIZE(bad); i++) {
		struct kolo_rdzv_job_config before = c;
		ck_assert_int_eq(PARSE_JOB(bad[i][0], &c), KOLO_EINVAL);
		ck_assert_msg(strstr(err, bad[i][1]) != NULL, "%s: %s", bad[i][0], err);
		ck_assert_mem_eq(&before, &c, sizeof(c));
	}
}
END_TEST

START_TEST(test_join)
{
	char err[256];
	struct kolo_rdzv_join_req jr;
	ck_assert_int_eq(PARSE_JOIN("{\"host\":\"h1\"}", &jr), KOLO_OK);
	ck_assert_str_eq(jr.host, "h1");
	ck_assert_str_eq(jr.worker_id, "");
	ck_assert_int_eq(jr.round, -1);
	ck_assert_int_eq(jr.rank, -1);
	ck_assert_int_eq(
	        PARSE_JOIN("{\"host\":\"h1\",\"worker_id\":\"w-1\",\"round\":7,\"rank\":3}", &jr),
	        KOLO_OK);
	ck_assert_str_eq(jr.worker_id, "w-1");
	ck_assert_int_eq(jr.round, 7);
	ck_assert_int_eq(jr.rank, 3);
	/* round 0: never had a round, a plain join under its old id */
	ck_assert_int_eq(
	        PARSE_JOIN("{\"host\":\"h1\",\"worker_id\":\"w-1\",\"round\":0,\"rank\":0}", &jr),
	        KOLO_OK);
	ck_assert_int_eq(jr.round, -1);
	/* zone: optional; "" or null is none */
	ck_assert_str_eq(jr.zone, "");
	ck_assert_int_eq(PARSE_JOIN("{\"host\":\"h1\",\"zone\":\"eu-west-1a\"}", &jr), KOLO_OK);
	ck_assert_str_eq(jr.zone, "eu-west-1a");
	ck_assert_int_eq(PARSE_JOIN("{\"host\":\"h1\",\"zone\":\"\"}", &jr), KOLO_OK);
	ck_assert_str_eq(jr.zone, "");
	ck_assert_int_eq(PARSE_JOIN("{\"host\":\"h1\",\"zone\":null}", &jr), KOLO_OK);
	ck_assert_str_eq(jr.zone, "");
	static const char *const bad[][2] = {
	        {"{}", "missing field \"host\""},
	        {"{\"host\":null}", "missing field \"host\""},
	        {"{\"host\":3}", "\"host\" must be a string"},
	        {"{\"host\":\"\"}", "\"host\" must be"},
	        {"{\"host\":\"a\\nb\"}", "\"host\" must be"},
	        {"{\"host\":\"h\",\"worker_id\":5}", "\"worker_id\" must be a string"},
	        {"{\"host\":\"h\",\"worker_id\":\"a b\"}", "\"worker_id\" must be"},
	        {"{\"host\":\"h\",\"worker_id\":\"w\",\"round\":1}", "go together"},
	        {"{\"host\":\"h\",\"round\":1,\"rank\":0}", "needs \"worker_id\""},
	        {"{\"host\":\"h\",\"worker_id\":\"w\",\"round\":1,\"rank\":-1}",
	         "\"rank\" must be in"},
	        {"{\"host\":\"h\",\"worker_id\":\"w\",\"round\":\"1\",\"rank\":0}",
	         "\"round\" must be an integer"},
	        {"{\"host\":\"h\",\"zone\":1}", "\"zone\" must be a string"},
	        {"{\"host\":\"h\",\"zone\":\"a/b\"}", "\"zone\" must be empty or"},
	        {"not json", "malformed JSON"},
	};
	for (size_t i = 0; i < KOLO_ARRAY_SIZE(bad); i++) {
		ck_assert_int_eq(PARSE_JOIN(bad[i][0], &jr), KOLO_EINVAL);
		ck_assert_msg(strstr(err, bad[i][1]) != NULL, "%s: %s", bad[i][0], err);
	}
}
END_TEST

#define PARSE_FAILURE(body, f) kolo_rdzv_parse_failure(body, strlen(body), f, err, sizeof(err))

START_TEST(test_failure)
{
	char err[256];
	struct kolo_rdzv_failure f;
	ck_assert_int_eq(PARSE_FAILURE("{\"round\":4,\"rank\":2}", &f), KOLO_OK);
	ck_assert_int_eq(f.round, 4);
	ck_assert_int_eq(f.rank, 2);
	ck_assert_str_eq(f.worker_id, "");
	/* A launcher's report names the worker, with or without its rank. */
	ck_assert_int_eq(PARSE_FAILURE("{\"worker_id\":\"w-1\"}", &f), KOLO_OK);
	ck_assert_str_eq(f.worker_id, "w-1");
	ck_assert_int_eq(f.round, -1);
	ck_assert_int_eq(f.rank, -1);
	ck_assert_int_eq(PARSE_FAILURE("{\"worker_id\":\"w-1\",\"round\":3,\"rank\":0}", &f),
	                 KOLO_OK);
	ck_assert_str_eq(f.worker_id, "w-1");
	ck_assert_int_eq(f.round, 3);
	ck_assert_int_eq(f.rank, 0);
	static const char *const bad[][2] = {
	        {"{\"rank\":2}", "missing field \"round\""},
	        {"{}", "missing field \"round\" (or \"worker_id\")"},
	        {"{\"round\":2}", "missing field \"rank\""},
	        {"{\"round\":2,\"rank\":\"x\"}", "\"rank\" must be an integer"},
	        {"{\"round\":-2,\"rank\":1}", "\"round\" must be in"},
	        {"{\"worker_id\":\"a b\"}", "\"worker_id\" must be 1-"},
	        {"{\"worker_id\":\"\"}", "\"worker_id\" must be 1-"},
	        {"{\"worker_id\":7}", "\"worker_id\" must be a string"},
	        {"{\"worker_id\":\"w\",\"round\":2}", "go together"},
	        {"[", "malformed JSON"},
	};
	for (size_t i = 0; i < KOLO_ARRAY_SIZE(bad); i++) {
		ck_assert_int_eq(PARSE_FAILURE(bad[i][0], &f), KOLO_EINVAL);
		ck_assert_msg(strstr(err, bad[i][1]) != NULL, "%s: %s", bad[i][0], err);
	}
	/* a body that is not NUL-terminated is read only up to len */
	const char buf[] = "{\"round\":1,\"rank\":0}garbage";
	ck_assert_int_eq(kolo_rdzv_parse_failure(buf, 20, &f, err, sizeof(err)), KOLO_OK);
}
END_TEST

static Suite *server_json_suite(void)
{
	Suite *s = suite_create("rdzv_server_json");
	TCase *tc = tcase_create("validation");
	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, test_ids);
	tcase_add_test(tc, test_job_config);
	tcase_add_test(tc, test_join);
	tcase_add_test(tc, test_failure);
	suite_add_tcase(s, tc);
	return s;
}

KOLO_CHECK_MAIN(server_json_suite)
