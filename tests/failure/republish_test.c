/* The rendezvous client puts the KV entries of the round it holds again
 * after the server restarted (against an in-process server that is stopped
 * and started on the same port): what a running job needs survives, entries
 * of an older round and of clients that hold no round do not come back. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rendezvous.h"
#include "testutil.h"

static struct kolo_rdzv_server *srv;
static char url[64];
static char listen_addr[64];
static const char token[] = "republish-test-token";

static void server_up(const char *listen)
{
	struct kolo_rdzv_server_config cfg = {.listen = listen,
	                                      .token = token,
	                                      .min_np = 1,
	                                      .max_np = 1,
	                                      .settle_ms = 50,
	                                      .lease_ms = 10000};
	struct kolo_errbuf eb = {{0}};
	ck_assert_msg(kolo_rdzv_server_start(&cfg, &srv, &eb) == KOLO_OK, "%s", eb.msg);
	int port = kolo_rdzv_server_port(srv);
	snprintf(url, sizeof(url), "http://127.0.0.1:%d", port);
	snprintf(listen_addr, sizeof(listen_addr), "127.0.0.1:%d", port);
}

static void restart(void)
{
	kolo_rdzv_server_stop(srv);
	srv = NULL;
	server_up(listen_addr);
}

static void teardown(void)
{
	kolo_rdzv_server_stop(srv);
	srv = NULL;
}

static struct kolo_rdzv_client *client(const char *host)
{
	struct kolo_rdzv_client_config cfg = {
	        .url = url, .job = "j", .token = token, .host = host, .deadline_ms = 5000};
	struct kolo_rdzv_client *c = NULL;
	struct kolo_errbuf eb = {{0}};
	ck_assert_msg(kolo_rdzv_client_create(&cfg, &c, &eb) == KOLO_OK, "%s", eb.msg);
	return c;
}

/* The value of key, waiting up to ms for it; NULL when it does not come. */
static char *get(struct kolo_rdzv_client *c, const char *key, int ms)
{
	void *data = NULL;
	size_t len = 0;
	if (kolo_rdzv_kv_get(c, key, ms, &data, &len) != KOLO_OK)
		return NULL;
	char *s = realloc(data, len + 1);
	ck_assert_ptr_nonnull(s);
	s[len] = '\0';
	return s;
}

/* A request of the worker on its own path, as its heartbeat makes: after a
 * restart the server does not know it and it re-registers. (The adopted
 * round may re-form at once: a lone member polls past it.) */
static void poke(struct kolo_rdzv_client *c, int64_t round)
{
	struct kolo_rdzv_assignment a = {0};
	kolo_status_t st = kolo_rdzv_wait_assignment(c, round, 200, &a);
	ck_assert_msg(st == KOLO_OK || st == KOLO_ETIMEDOUT, "%s", kolo_rdzv_client_error(c));
	kolo_rdzv_assignment_fini(&a);
}

/* A worker holding round 1 that put two keys (one twice); a client without
 * a round that put one. */
static struct kolo_rdzv_client *member(void)
{
	struct kolo_rdzv_client *c = client("ha");
	ck_assert_int_eq(kolo_rdzv_join(c), KOLO_OK);
	struct kolo_rdzv_assignment a = {0};
	ck_assert_int_eq(kolo_rdzv_wait_assignment(c, 0, 10000, &a), KOLO_OK);
	ck_assert_int_eq(a.round, 1);
	kolo_rdzv_assignment_fini(&a);
	ck_assert_int_eq(kolo_rdzv_kv_put(c, "addr/1/0", "old", 3), KOLO_OK);
	ck_assert_int_eq(kolo_rdzv_kv_put(c, "addr/1/0", "here", 4), KOLO_OK);
	ck_assert_int_eq(kolo_rdzv_kv_put(c, "fin/1/0", "1", 1), KOLO_OK);
	return c;
}

START_TEST(test_restart_republishes)
{
	server_up("127.0.0.1:0");
	struct kolo_rdzv_client *c = member();
	struct kolo_rdzv_client *other = client("kolorun");
	ck_assert_int_eq(kolo_rdzv_kv_put(other, "note", "x", 1), KOLO_OK);
	restart();
	struct kolo_rdzv_client *reader = client("reader");
	ck_assert_ptr_null(get(reader, "addr/1/0", 0)); /* lost with the server */
	/* Its next request finds that the server does not know it: it
	 * re-registers and puts its keys again. */
	poke(c, 1);
	char *v = get(reader, "addr/1/0", 2000);
	ck_assert_ptr_nonnull(v);
	ck_assert_str_eq(v, "here"); /* the last value put */
	free(v);
	v = get(reader, "fin/1/0", 0);
	ck_assert_ptr_nonnull(v);
	ck_assert_str_eq(v, "1");
	free(v);
	ck_assert_ptr_null(get(reader, "note", 0)); /* not a member's: not kept */
	kolo_rdzv_client_destroy(reader);
	kolo_rdzv_client_destroy(other);
	kolo_rdzv_client_destroy(c);
}
END_TEST

START_TEST(test_older_round_dropped)
{
	server_up("127.0.0.1:0");
	struct kolo_rdzv_client *c = member();
	/* The worker moves on to round 2 (as a re-form does) and puts its new
	 * address; round 1's entries are no longer needed. */
	kolo_rdzv_set_membership(c, 2, 0);
	ck_assert_int_eq(kolo_rdzv_kv_put(c, "addr/2/0", "new", 3), KOLO_OK);
	restart();
	poke(c, 2);
	struct kolo_rdzv_client *reader = client("reader");
	char *v = get(reader, "addr/2/0", 2000);
	ck_assert_ptr_nonnull(v);
	ck_assert_str_eq(v, "new");
	free(v);
	ck_assert_ptr_null(get(reader, "addr/1/0", 0));
	ck_assert_ptr_null(get(reader, "fin/1/0", 0));
	kolo_rdzv_client_destroy(reader);
	kolo_rdzv_client_destroy(c);
}
END_TEST

static Suite *republish_suite(void)
{
	Suite *s = suite_create("rdzv_republish");
	TCase *tc = tcase_create("restart");
	tcase_add_checked_fixture(tc, NULL, teardown);
	tcase_add_test(tc, test_restart_republishes);
	tcase_add_test(tc, test_older_round_dropped);
	suite_add_tcase(s, tc);
	return s;
}

KOLO_CHECK_MAIN(republish_suite)
