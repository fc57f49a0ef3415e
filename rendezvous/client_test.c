/* Unit tests of the rendezvous client against the in-process server. */
#include <check.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rendezvous.h"
#include "testutil.h"

static struct kolo_rdzv_server *srv;
static char url[64];
static const char token[] = "client-test-token";

static void start_server(int min_np, int max_np, int lease_ms)
{
	struct kolo_rdzv_server_config cfg = {.listen = "127.0.0.1:0",
	                                      .token = token,
	                                      .min_np = min_np,
	                                      .max_np = max_np,
	                                      .settle_ms = 100,
	                                      .lease_ms = lease_ms};
	struct kolo_errbuf eb = {{0}};
	ck_assert_msg(kolo_rdzv_server_start(&cfg, &srv, &eb) == KOLO_OK, "%s", eb.msg);
	snprintf(url, sizeof(url), "http://127.0.0.1:%d", kolo_rdzv_server_port(srv));
}

static void teardown(void)
{
	kolo_rdzv_server_stop(srv);
	srv = NULL;
}

static struct kolo_rdzv_client *client(const char *job, const char *host, const char *tok)
{
	struct kolo_rdzv_client_config cfg = {
	        .url = url, .job = job, .token = tok, .host = host, .deadline_ms = 2000};
	struct kolo_rdzv_client *c = NULL;
	struct kolo_errbuf eb = {{0}};
	ck_assert_msg(kolo_rdzv_client_create(&cfg, &c, &eb) == KOLO_OK, "%s", eb.msg);
	return c;
}

static struct kolo_rdzv_client *zone_client(const char *host, const char *zone)
{
	struct kolo_rdzv_client_config cfg = {
	        .url = url, .job = "jz", .token = token, .host = host, .zone = zone};
	struct kolo_rdzv_client *c = NULL;
	struct kolo_errbuf eb = {{0}};
	ck_assert_msg(kolo_rdzv_client_create(&cfg, &c, &eb) == KOLO_OK, "%s", eb.msg);
	ck_assert_int_eq(kolo_rdzv_join(c), KOLO_OK);
	return c;
}

/* Workers that report zones a, b, a get ranks zone by zone; every member of
 * the assignment and the job status show the zones. A zone that is not a
 * host name is refused. */
START_TEST(test_zones)
{
	start_server(3, 3, 10000);
	struct kolo_rdzv_client *c[3] = {zone_client("h1", "a"), zone_client("h2", "b"),
	                                 zone_client("h3", "a")};
	const int want[] = {0, 2, 1};
	for (int i = 0; i < 3; i++) {
		struct kolo_rdzv_assignment a = {0};
		ck_assert_int_eq(kolo_rdzv_wait_assignment(c[i], 0, 10000, &a), KOLO_OK);
		ck_assert_int_eq(a.rank, want[i]);
		ck_assert_int_eq(a.n_members, 3);
		for (int r = 0; r < 3; r++)
			ck_assert_str_eq(a.members[r].zone, r < 2 ? "a" : "b");
		kolo_rdzv_assignment_fini(&a);
	}
	char *status = NULL;
	ck_assert_int_eq(kolo_rdzv_job_status(c[0], &status), KOLO_OK);
	ck_assert_msg(strstr(status, "\"host\":\"h2\",\"zone\":\"b\""), "%s", status);
	free(status);
	for (int i = 0; i < 3; i++)
		kolo_rdzv_client_destroy(c[i]);
	struct kolo_rdzv_client_config bad = {
	        .url = url, .job = "jz", .token = token, .host = "h", .zone = "a b"};
	struct kolo_rdzv_client *x = NULL;
	struct kolo_errbuf eb = {{0}};
	ck_assert_int_eq(kolo_rdzv_client_create(&bad, &x, &eb), KOLO_EINVAL);
	ck_assert_ptr_nonnull(strstr(eb.msg, "zone"));
}
END_TEST

START_TEST(test_join_assign_leave)
{
	start_server(1, 1, 10000);
	struct kolo_rdzv_client *c = client("j1", "ha", token);
	ck_assert_int_eq(kolo_rdzv_join(c), KOLO_OK);
	ck_assert_int_gt(strlen(kolo_rdzv_worker_id(c)), 0);
	ck_assert_int_eq(kolo_rdzv_lease_ms(c), 10000);
	struct kolo_rdzv_assignment a = {0};
	ck_assert_int_eq(kolo_rdzv_wait_assignment(c, 0, 10000, &a), KOLO_OK);
	ck_assert_int_eq(a.round, 1);
	ck_assert_int_eq(a.rank, 0);
	ck_assert_int_eq(a.size, 1);
	ck_assert_int_eq(a.n_members, 1);
	ck_assert_str_eq(a.members[0].worker_id, kolo_rdzv_worker_id(c));
	ck_assert_str_eq(a.members[0].host, "ha");
	/* Its only member asks past round 1: the round is over for every
	 * member, and round 2 forms with the same worker. */
	struct kolo_rdzv_assignment b = {0};
	ck_assert_int_eq(kolo_rdzv_wait_assignment(c, 1, 10000, &b), KOLO_OK);
	ck_assert_int_eq(b.round, 2);
	ck_assert_int_eq(b.rank, 0);
	ck_assert_str_eq(b.members[0].worker_id, kolo_rdzv_worker_id(c));
	kolo_rdzv_assignment_fini(&b);
	ck_assert_int_eq(kolo_rdzv_leave(c), KOLO_OK);
	ck_assert_int_eq(kolo_rdzv_leave(c), KOLO_OK); /* idempotent */
	kolo_rdzv_assignment_fini(&a);
	kolo_rdzv_client_destroy(c);
}
END_TEST

START_TEST(test_wrong_token)
{
	start_server(1, 1, 10000);
	struct kolo_rdzv_client *c = client("j1", "ha", "wrong");
	ck_assert_int_eq(kolo_rdzv_join(c), KOLO_EAUTH);
	ck_assert_ptr_nonnull(strstr(kolo_rdzv_client_error(c), "401"));
	kolo_rdzv_client_destroy(c);
	c = client("j1", "ha", NULL);
	ck_assert_int_eq(kolo_rdzv_join(c), KOLO_EAUTH);
	kolo_rdzv_client_destroy(c);
}
END_TEST

START_TEST(test_unreachable)
{
	/* Nothing listens on port 1; the deadline is 2 s. */
	snprintf(url, sizeof(url), "http://127.0.0.1:1");
	struct kolo_rdzv_client *c = client("j1", "ha", token);
	uint64_t t0 = kolo_now_ms();
	ck_assert_int_eq(kolo_rdzv_join(c), KOLO_ERENDEZVOUS);
	uint64_t took = kolo_now_ms() - t0;
	ck_assert_uint_ge(took, 2000);
	ck_assert_uint_lt(took, 6000);
	ck_assert_ptr_nonnull(strstr(kolo_rdzv_client_error(c), "unreachable"));
	kolo_rdzv_client_destroy(c);
	/* A name that does not resolve is retried the same way. */
	snprintf(url, sizeof(url), "http://kolo-no-such-host.invalid:29470");
	c = client("j1", "ha", token);
	ck_assert_int_eq(kolo_rdzv_join(c), KOLO_ERENDEZVOUS);
	kolo_rdzv_client_destroy(c);
}
END_TEST

START_TEST(test_kv)
{
	start_server(1, 0, 10000);
	struct kolo_rdzv_client *c = client("kv", "ha", token);
	static char big[KOLO_RDZV_MAX_BODY + 1];
	for (size_t i = 0; i < sizeof(big); i++)
		big[i] = (char)(i * 7);
	ck_assert_int_eq(kolo_rdzv_kv_put(c, "addr/1/0", big, KOLO_RDZV_MAX_BODY), KOLO_OK);
	ck_assert_int_eq(kolo_rdzv_kv_put(c, "addr/1/1", big, sizeof(big)), KOLO_EINVAL);
	void *data;
	size_t len;
	ck_assert_int_eq(kolo_rdzv_kv_get(c, "addr/1/0", 1000, &data, &len), KOLO_OK);
	ck_assert_uint_eq(len, KOLO_RDZV_MAX_BODY);
	ck_assert(memcmp(data, big, len) == 0);
	free(data);
	ck_assert_int_eq(kolo_rdzv_kv_put(c, "empty", NULL, 0), KOLO_OK);
	ck_assert_int_eq(kolo_rdzv_kv_get(c, "empty", 1000, &data, &len), KOLO_OK);
	ck_assert_uint_eq(len, 0);
	free(data);
	uint64_t t0 = kolo_now_ms();
	ck_assert_int_eq(kolo_rdzv_kv_get(c, "missing", 300, &data, &len), KOLO_ENOTFOUND);
	ck_assert_uint_ge(kolo_now_ms() - t0, 250);
	ck_assert_ptr_null(data);
	ck_assert_int_eq(kolo_rdzv_kv_get(c, "bad key!", 0, &data, &len) != KOLO_OK, 1);
	kolo_rdzv_client_destroy(c);
}
END_TEST

struct putter {
	struct kolo_rdzv_client *c;
	uint64_t at_ms;
};

static void *put_later(void *arg)
{
	struct putter *p = arg;
	while (kolo_now_ms() < p->at_ms)
		kolo_sleep_ms(5); /* the scenario: a value that appears late */
	ck_assert_int_eq(kolo_rdzv_kv_put(p->c, "late", "v", 1), KOLO_OK);
	return NULL;
}

START_TEST(test_kv_wait)
{
	start_server(1, 0, 10000);
	struct kolo_rdzv_client *c = client("kv", "ha", token);
	struct kolo_rdzv_client *c2 = client("kv", "hb", token);
	struct putter p = {c2, kolo_now_ms() + 200};
	pthread_t t;
	pthread_create(&t, NULL, put_later, &p);
	void *data;
	size_t len;
	ck_assert_int_eq(kolo_rdzv_kv_get(c, "late", 10000, &data, &len), KOLO_OK);
	ck_assert_uint_ge(kolo_now_ms(), p.at_ms);
	ck_assert_uint_eq(len, 1);
	free(data);
	pthread_join(t, NULL);
	kolo_rdzv_client_destroy(c);
	kolo_rdzv_client_destroy(c2);
}
END_TEST

START_TEST(test_heartbeat_failure_report)
{
	start_server(1, 2, 10000);
	struct kolo_rdzv_client *c[2] = {client("hb", "ha", token), client("hb", "hb", token)};
	struct kolo_rdzv_assignment a[2] = {{0}};
	for (int i = 0; i < 2; i++) {
		ck_assert_int_eq(kolo_rdzv_join(c[i]), KOLO_OK);
		ck_assert_int_eq(kolo_rdzv_heartbeat_start(c[i], 20), KOLO_OK);
	}
	for (int i = 0; i < 2; i++) {
		ck_assert_int_eq(kolo_rdzv_wait_assignment(c[i], 0, 10000, &a[i]), KOLO_OK);
		ck_assert_int_eq(a[i].rank, i);
	}
	/* Worker 0 reports worker 1 dead: 1 is evicted, 0 gets round 2 alone. */
	ck_assert_int_eq(kolo_rdzv_report_failure(c[0], 1, 1), KOLO_OK);
	struct kolo_rdzv_assignment b = {0};
	ck_assert_int_eq(kolo_rdzv_wait_assignment(c[0], 1, 10000, &b), KOLO_OK);
	ck_assert_int_eq(b.round, 2);
	ck_assert_int_eq(b.size, 1);
	ck_assert_int_eq(b.rank, 0);
	/* The evicted worker's heartbeat learns it (bounded poll of its state). */
	struct kolo_rdzv_hb_state hs;
	uint64_t end = kolo_now_ms() + 10000;
	do {
		kolo_rdzv_heartbeat_state(c[1], &hs);
		if (!hs.evicted)
			kolo_sleep_ms(5);
	} while (!hs.evicted && kolo_now_ms() < end);
	ck_assert(hs.evicted);
	ck_assert_int_eq(hs.last, KOLO_EMEMBERSHIP);
	ck_assert_int_eq(kolo_rdzv_wait_assignment(c[1], 1, 1000, &b), KOLO_EMEMBERSHIP);
	/* Stopping a heartbeat with a long period is prompt. */
	kolo_rdzv_heartbeat_stop(c[0]);
	ck_assert_int_eq(kolo_rdzv_heartbeat_start(c[0], 60000), KOLO_OK);
	uint64_t t0 = kolo_now_ms();
	kolo_rdzv_heartbeat_stop(c[0]);
	ck_assert_uint_lt(kolo_now_ms() - t0, 1500);
	kolo_rdzv_heartbeat_state(c[0], &hs);
	ck_assert(!hs.evicted);
	ck_assert_int_ge(hs.round, 1);
	for (int i = 0; i < 2; i++) {
		kolo_rdzv_assignment_fini(&a[i]);
		kolo_rdzv_client_destroy(c[i]);
	}
	kolo_rdzv_assignment_fini(&b);
}
END_TEST

/* The cancel hook: true once its deadline passed. */
static bool past(void *arg)
{
	return kolo_now_ms() >= *(uint64_t *)arg;
}

START_TEST(test_cancel_wait)
{
	start_server(2, 0, 10000); /* one worker: no round forms */
	struct kolo_rdzv_client *c = client("jc", "ha", token);
	ck_assert_int_eq(kolo_rdzv_join(c), KOLO_OK);
	uint64_t t0 = kolo_now_ms(), at = t0 + 200;
	kolo_rdzv_set_cancel(c, past, &at);
	struct kolo_rdzv_assignment a = {0};
	ck_assert_int_eq(kolo_rdzv_wait_assignment(c, 0, 20000, &a), KOLO_ESHUTDOWN);
	uint64_t ms = kolo_now_ms() - t0;
	ck_assert_msg(ms >= 200 && ms < 3000, "the wait ended after %llu ms",
	              (unsigned long long)ms);
	/* A KV wait too, and at once when the hook already says so. */
	void *v = NULL;
	size_t n = 0;
	t0 = kolo_now_ms();
	ck_assert_int_eq(kolo_rdzv_kv_get(c, "never", 20000, &v, &n), KOLO_ESHUTDOWN);
	ck_assert_uint_lt(kolo_now_ms() - t0, 1000);
	/* Cleared: requests work again, and the leave goes through. */
	kolo_rdzv_set_cancel(c, NULL, NULL);
	/* Still no round: a bounded wait times out. */
	t0 = kolo_now_ms();
	ck_assert_int_eq(kolo_rdzv_wait_assignment(c, 0, 300, &a), KOLO_ETIMEDOUT);
	ck_assert_uint_ge(kolo_now_ms() - t0, 250);
	ck_assert_int_eq(kolo_rdzv_kv_put(c, "k", "v", 1), KOLO_OK);
	ck_assert_int_eq(kolo_rdzv_leave(c), KOLO_OK);
	kolo_rdzv_client_destroy(c);
}
END_TEST

START_TEST(test_bad_config)
{
	struct kolo_rdzv_client *c = NULL;
	struct kolo_errbuf eb = {{0}};
	struct kolo_rdzv_client_config cfg = {.url = "", .job = "j", .host = "h"};
	ck_assert_int_eq(kolo_rdzv_client_create(&cfg, &c, &eb), KOLO_EINVAL);
	ck_assert_ptr_nonnull(strstr(eb.msg, "KOLO_RENDEZVOUS"));
	cfg.url = "127.0.0.1:1";
	cfg.host = "";
	ck_assert_int_eq(kolo_rdzv_client_create(&cfg, &c, &eb), KOLO_EINVAL);
	ck_assert_ptr_null(c);
	kolo_rdzv_client_destroy(NULL);
}
END_TEST

static Suite *client_suite(void)
{
	Suite *s = suite_create("rdzv_client");
	TCase *tc = tcase_create("client");
	tcase_add_checked_fixture(tc, NULL, teardown);
	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, test_join_assign_leave);
	tcase_add_test(tc, test_zones);
	tcase_add_test(tc, test_wrong_token);
	tcase_add_test(tc, test_unreachable);
	tcase_add_test(tc, test_kv);
	tcase_add_test(tc, test_kv_wait);
	tcase_add_test(tc, test_heartbeat_failure_report);
	tcase_add_test(tc, test_cancel_wait);
	tcase_add_test(tc, test_bad_config);
	suite_add_tcase(s, tc);
	return s;
}

KOLO_CHECK_MAIN(client_suite)
