/* Arbitration keys, the watcher and SIGTERM, against an embedded server. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "membership.h"
#include "testutil.h"

static struct kolo_rdzv_server *server;
static struct kolo_rdzv_client *client;
static char url[64];

static void setup(void)
{
	struct kolo_rdzv_server_config sc = {.listen = "127.0.0.1:0",
	                                     .token = "t",
	                                     .min_np = 1,
	                                     .settle_ms = 100,
	                                     .lease_ms = 10000};
	struct kolo_errbuf eb = {{0}};
	ck_assert_int_eq(kolo_rdzv_server_start(&sc, &server, &eb), KOLO_OK);
	snprintf(url, sizeof(url), "http://127.0.0.1:%d", kolo_rdzv_server_port(server));
	struct kolo_rdzv_client_config cc = {
	        .url = url, .job = "w", .token = "t", .host = "h", .deadline_ms = 2000};
	ck_assert_int_eq(kolo_rdzv_client_create(&cc, &client, &eb), KOLO_OK);
}

static void teardown(void)
{
	kolo_rdzv_client_destroy(client);
	kolo_rdzv_server_stop(server);
}

START_TEST(test_confirm)
{
	bool dead = true;
	ck_assert_int_eq(kolo_elastic_announce(client, 5, 1, true), KOLO_OK);
	ck_assert_int_eq(kolo_elastic_confirm_dead(client, 5, 1, 100, &dead), KOLO_OK);
	ck_assert(!dead);
	uint64_t t0 = kolo_now_ms();
	ck_assert_int_eq(kolo_elastic_confirm_dead(client, 5, 2, 100, &dead), KOLO_OK);
	ck_assert(dead);
	ck_assert_uint_ge(kolo_now_ms() - t0, 100);
	/* Another round's key says nothing. */
	ck_assert_int_eq(kolo_elastic_confirm_dead(client, 6, 1, 50, &dead), KOLO_OK);
	ck_assert(dead);
}
END_TEST

struct seen {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int64_t round;
	bool leave;
	int calls;
};

static void on_change(void *arg, int64_t round, bool leave)
{
	struct seen *s = arg;
	pthread_mutex_lock(&s->lock);
	s->round = round;
	s->leave = leave;
	s->calls++;
	pthread_cond_broadcast(&s->cond);
	pthread_mutex_unlock(&s->lock);
}

/* Waits up to ms for the callback count to reach n. */
static bool wait_calls_for(struct seen *s, int n, int ms)
{
	uint64_t end = kolo_now_ms() + (uint64_t)ms;
	pthread_mutex_lock(&s->lock);
	while (s->calls < n && kolo_now_ms() < end) {
		pthread_mutex_unlock(&s->lock);
		kolo_sleep_ms(5);
		pthread_mutex_lock(&s->lock);
	}
	bool ok = s->calls >= n;
	pthread_mutex_unlock(&s->lock);
	return ok;
}

static bool wait_calls(struct seen *s, int n)
{
	return wait_calls_for(s, n, 5000);
}

static struct kolo_elastic *watcher(struct seen *s, int grace_ms)
{
	memset(s, 0, sizeof(*s));
	pthread_mutex_init(&s->lock, NULL);
	pthread_cond_init(&s->cond, NULL);
	struct kolo_elastic_config cfg = {.url = url,
	                                  .job = "w",
	                                  .token = "t",
	                                  .host = "h",
	                                  .member = client,
	                                  .poll_ms = 100,
	                                  .leave_grace_ms = grace_ms,
	                                  .on_change = on_change,
	                                  .arg = s};
	struct kolo_elastic *e = NULL;
	struct kolo_errbuf eb = {{0}};
	ck_assert_int_eq(kolo_elastic_create(&cfg, &e, &eb), KOLO_OK);
	return e;
}

START_TEST(test_watch_change)
{
	struct seen s;
	struct kolo_elastic *e = watcher(&s, 1000);
	kolo_elastic_watch(e, 3, 0);
	kolo_sleep_ms(150); /* nothing to see yet (bounded: a negative check) */
	ck_assert(!wait_calls_for(&s, 1, 0));
	ck_assert_int_eq(kolo_elastic_announce(client, 3, 1, true), KOLO_OK);
	ck_assert(wait_calls(&s, 1));
	ck_assert_int_eq(s.round, 3);
	ck_assert(!s.leave);
	/* The watcher said it is alive before it called back. */
	bool dead = true;
	ck_assert_int_eq(kolo_elastic_confirm_dead(client, 3, 0, 1000, &dead), KOLO_OK);
	ck_assert(!dead);
	/* Once per round; then the next round. */
	kolo_elastic_watch(e, 4, 0);
	ck_assert_int_eq(kolo_elastic_announce(client, 4, 2, true), KOLO_OK);
	ck_assert(wait_calls(&s, 2));
	ck_assert_int_eq(s.round, 4);
	kolo_elastic_destroy(e);
	ck_assert(!wait_calls_for(&s, 3, 0));
}
END_TEST

START_TEST(test_sigterm_leaves)
{
	ck_assert_int_eq(kolo_elastic_signal_install(), KOLO_OK);
	struct seen s;
	struct kolo_elastic *e = watcher(&s, 0);
	kolo_elastic_watch(e, 9, 1);
	ck_assert(!kolo_elastic_leave_requested());
	raise(SIGTERM); /* handled: the process lives on */
	ck_assert(kolo_elastic_leave_requested());
	ck_assert(wait_calls(&s, 1));
	ck_assert_int_eq(s.round, 9);
	ck_assert(s.leave);
	kolo_elastic_destroy(e);
	kolo_elastic_leave_clear();
	ck_assert(!kolo_elastic_leave_requested());
}
END_TEST

static Suite *watch_suite(void)
{
	Suite *s = suite_create("elastic_watch");
	TCase *tc = tcase_create("watch");
	tcase_set_timeout(tc, 30);
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_confirm);
	tcase_add_test(tc, test_watch_change);
	tcase_add_test(tc, test_sigterm_leaves);
	suite_add_tcase(s, tc);
	return s;
}

KOLO_CHECK_MAIN(watch_suite)
