/* Unit tests of p2p: ranks are p2p objects of one process, each over its own
 * TCP endpoint on 127.0.0.1; the test thread posts every rank's operations
 * and waits on their handles. Matching (tags, any source, order, sizes),
 * messages to a peer that opens point-to-point late, large and empty
 * messages, and the failures: a recv that times out, a peer that goes, a
 * comm whose health fails. */
#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "p2p.h"
#include "testutil.h"
#include "transport_tcp.h"

#define MAXR 4

static const uint8_t token[] = "p2p-test-token";

struct world {
	int n;
	struct kolo_transport_handle h[MAXR];
	atomic_bool published[MAXR];
	atomic_int health_st;
	struct kolo_p2p *p[MAXR];
};

static kolo_status_t lookup(void *ctx, int rank, struct kolo_transport_handle *out)
{
	struct world *w = ctx;
	if (!atomic_load(&w->published[rank]))
		return KOLO_ENOTFOUND;
	*out = w->h[rank];
	return KOLO_OK;
}

static kolo_status_t health(void *ctx, struct kolo_errbuf *eb)
{
	struct world *w = ctx;
	kolo_status_t st = (kolo_status_t)atomic_load(&w->health_st);
	return st == KOLO_OK ? KOLO_OK : kolo_fail(eb, st, "the comm re-formed");
}

static void open_rank(struct world *w, int r, int timeout_ms)
{
	struct kolo_transport_config tc = {
	        .job = "p2p-test",
	        .round = 1,
	        .rank = r,
	        .size = w->n,
	        .token = token,
	        .token_len = sizeof(token) - 1,
	        .timeout_ms = INT32_MAX,
	        .streams = 1,
	        .iface = "127.0.0.1",
	};
	struct kolo_transport *t = NULL;
	ck_assert_int_eq(kolo_transport_tcp_ops.create(&tc, &t, NULL), KOLO_OK);
	ck_assert_int_eq(kolo_transport_tcp_ops.listen(t, &w->h[r]), KOLO_OK);
	struct kolo_p2p_config cfg = {.transport = t,
	                              .rank = r,
	                              .size = w->n,
	                              .lookup = lookup,
	                              .lookup_ctx = w,
	                              .health = health,
	                              .health_ctx = w,
	                              .timeout_ms = timeout_ms};
	struct kolo_errbuf eb = {{0}};
	ck_assert_int_eq(kolo_p2p_create(&cfg, &w->p[r], &eb), KOLO_OK);
	atomic_store(&w->published[r], true);
}

static void world_open(struct world *w, int n, int timeout_ms)
{
	memset(w, 0, sizeof(*w));
	w->n = n;
	for (int r = 0; r < n; r++)
		open_rank(w, r, timeout_ms);
}

static void world_close(struct world *w)
{
	for (int r = 0; r < w->n; r++)
		kolo_p2p_destroy(w->p[r]);
}

static kolo_handle_t *send_(struct world *w, int from, const void *buf, size_t len, int to, int tag)
{
	kolo_handle_t *h = NULL;
	struct kolo_errbuf eb = {{0}};
	ck_assert_int_eq(kolo_p2p_send(w->p[from], buf, len, to, tag, NULL, NULL, &h, &eb),
	                 KOLO_OK);
	return h;
}

static kolo_handle_t *recv_(struct world *w, int at, void *buf, size_t len, int from, int tag,
                            int *source)
{
	kolo_handle_t *h = NULL;
	struct kolo_errbuf eb = {{0}};
	ck_assert_int_eq(kolo_p2p_recv(w->p[at], buf, len, from, tag, source, NULL, NULL, &h, &eb),
	                 KOLO_OK);
	return h;
}

static kolo_status_t wait_(kolo_handle_t *h, char *msg)
{
	struct kolo_errbuf eb = {{0}};
	kolo_status_t st = kolo_handle_wait_release(h, &eb);
	if (msg)
		snprintf(msg, KOLO_ERRBUF_SIZE, "%s", eb.msg);
	return st;
}

START_TEST(tags_match_out_of_order)
{
	struct world w;
	world_open(&w, 2, 10000);
	int a[3][4], b[3][4] = {{0}};
	for (int t = 0; t < 3; t++)
		for (int i = 0; i < 4; i++)
			a[t][i] = 100 * t + i;
	kolo_handle_t *s[3], *r[3];
	for (int t = 0; t < 3; t++) /* tags 10, 11, 12 sent; received 12, 11, 10 */
		s[t] = send_(&w, 0, a[t], sizeof(a[t]), 1, 10 + t);
	for (int t = 2; t >= 0; t--)
		r[t] = recv_(&w, 1, b[t], sizeof(b[t]), 0, 10 + t, NULL);
	for (int t = 0; t < 3; t++) {
		ck_assert_int_eq(wait_(s[t], NULL), KOLO_OK);
		ck_assert_int_eq(wait_(r[t], NULL), KOLO_OK);
		ck_assert_mem_eq(a[t], b[t], sizeof(a[t]));
	}
	world_close(&w);
}
END_TEST

START_TEST(any_source_names_the_sender)
{
	struct world w;
	world_open(&w, 4, 10000);
	int64_t v[MAXR], got[3] = {0};
	int src[3] = {-2, -2, -2};
	kolo_handle_t *r[3], *s[MAXR];
	for (int i = 0; i < 3; i++)
		r[i] = recv_(&w, 0, &got[i], sizeof(got[i]), KOLO_P2P_ANY_SOURCE, 7, &src[i]);
	for (int k = 1; k < 4; k++) {
		v[k] = 1000 + k;
		s[k] = send_(&w, k, &v[k], sizeof(v[k]), 0, 7);
	}
	int seen = 0;
	for (int i = 0; i < 3; i++) {
		ck_assert_int_eq(wait_(r[i], NULL), KOLO_OK);
		ck_assert_int_ge(src[i], 1);
		ck_assert_int_le(src[i], 3);
		ck_assert_int_eq(got[i], 1000 + src[i]);
		seen |= 1 << src[i];
	}
	ck_assert_int_eq(seen, 0xe);
	for (int k = 1; k < 4; k++)
		ck_assert_int_eq(wait_(s[k], NULL), KOLO_OK);
	world_close(&w);
}
END_TEST

/* 200 messages of one tag: the first 100 sent before any recv (held in
 * memory), the rest into posted recvs; every recv gets its own in order. */
START_TEST(order_is_kept_for_early_and_late_messages)
{
	struct world w;
	world_open(&w, 2, 10000);
	enum { N = 200 };
	static int out[N], in[N];
	kolo_handle_t *s[N], *r[N];
	for (int i = 0; i < N; i++)
		out[i] = i * 7 + 1;
	for (int i = 0; i < N / 2; i++)
		s[i] = send_(&w, 1, &out[i], sizeof(int), 0, 3);
	for (int i = 0; i < N / 2; i++)
		ck_assert_int_eq(wait_(s[i], NULL), KOLO_OK);
	usleep(20000); /* not synchronisation: lets some arrive before the recvs */
	for (int i = 0; i < N; i++)
		r[i] = recv_(&w, 0, &in[i], sizeof(int), 1, 3, NULL);
	for (int i = N / 2; i < N; i++)
		s[i] = send_(&w, 1, &out[i], sizeof(int), 0, 3);
	for (int i = 0; i < N; i++) {
		ck_assert_int_eq(wait_(r[i], NULL), KOLO_OK);
		ck_assert_int_eq(in[i], out[i]);
	}
	for (int i = N / 2; i < N; i++)
		ck_assert_int_eq(wait_(s[i], NULL), KOLO_OK);
	world_close(&w);
}
END_TEST

START_TEST(large_and_empty_messages)
{
	struct world w;
	world_open(&w, 3, 20000);
	size_t n = (size_t)8 << 20;
	uint8_t *a = malloc(n), *b = calloc(1, n);
	for (size_t i = 0; i < n; i++)
		a[i] = (uint8_t)(i * 31 + 5);
	kolo_handle_t *r = recv_(&w, 2, b, n, 1, 0, NULL);
	kolo_handle_t *re = recv_(&w, 2, NULL, 0, 0, 0, NULL);
	kolo_handle_t *s = send_(&w, 1, a, n, 2, 0);
	kolo_handle_t *se = send_(&w, 0, NULL, 0, 2, 0);
	ck_assert_int_eq(wait_(s, NULL), KOLO_OK);
	ck_assert_int_eq(wait_(se, NULL), KOLO_OK);
	ck_assert_int_eq(wait_(re, NULL), KOLO_OK);
	ck_assert_int_eq(wait_(r, NULL), KOLO_OK);
	ck_assert_int_eq(memcmp(a, b, n), 0);
	free(a);
	free(b);
	world_close(&w);
}
END_TEST

START_TEST(wrong_size_fails_the_recv_and_keeps_the_message)
{
	struct world w;
	world_open(&w, 2, 10000);
	int64_t v = 42, small = 0, right = 0;
	char msg[KOLO_ERRBUF_SIZE];
	ck_assert_int_eq(wait_(send_(&w, 0, &v, sizeof(v), 1, 5), NULL), KOLO_OK);
	ck_assert_int_eq(wait_(recv_(&w, 1, &small, 4, 0, 5, NULL), msg), KOLO_EMISMATCH);
	ck_assert_ptr_nonnull(strstr(msg, "sent 8 bytes with tag 5"));
	ck_assert_int_eq(wait_(recv_(&w, 1, &right, sizeof(right), 0, 5, NULL), NULL), KOLO_OK);
	ck_assert_int_eq(right, 42);
	world_close(&w);
}
END_TEST

START_TEST(send_to_a_peer_that_opens_late)
{
	struct world w;
	memset(&w, 0, sizeof(w));
	w.n = 2;
	open_rank(&w, 0, 10000);
	int v = 9, got = 0;
	kolo_handle_t *s = send_(&w, 0, &v, sizeof(v), 1, 1);
	usleep(50000); /* rank 1 opens after the send is queued */
	open_rank(&w, 1, 10000);
	ck_assert_int_eq(wait_(recv_(&w, 1, &got, sizeof(got), 0, 1, NULL), NULL), KOLO_OK);
	ck_assert_int_eq(wait_(s, NULL), KOLO_OK);
	ck_assert_int_eq(got, 9);
	world_close(&w);
}
END_TEST

START_TEST(recv_times_out)
{
	struct world w;
	world_open(&w, 2, 300);
	int got = 0;
	char msg[KOLO_ERRBUF_SIZE];
	uint64_t t0 = kolo_now_ms();
	ck_assert_int_eq(wait_(recv_(&w, 0, &got, sizeof(got), 1, 2, NULL), msg), KOLO_ETIMEDOUT);
	uint64_t dt = kolo_now_ms() - t0;
	ck_assert_uint_ge(dt, 290);
	ck_assert_uint_lt(dt, 3000);
	ck_assert_ptr_nonnull(strstr(msg, "no message from rank 1 with tag 2"));
	/* One recv timing out leaves the others usable. */
	int v = 3;
	ck_assert_int_eq(wait_(send_(&w, 1, &v, sizeof(v), 0, 2), NULL), KOLO_OK);
	ck_assert_int_eq(wait_(recv_(&w, 0, &got, sizeof(got), 1, 2, NULL), NULL), KOLO_OK);
	ck_assert_int_eq(got, 3);
	world_close(&w);
}
END_TEST

START_TEST(a_peer_that_goes_fails_the_recv_at_once)
{
	struct world w;
	world_open(&w, 2, 20000);
	int v = 1, got = 0;
	ck_assert_int_eq(wait_(send_(&w, 1, &v, sizeof(v), 0, 0), NULL), KOLO_OK);
	ck_assert_int_eq(wait_(recv_(&w, 0, &got, sizeof(got), 1, 0, NULL), NULL), KOLO_OK);
	kolo_handle_t *r = recv_(&w, 0, &got, sizeof(got), 1, 0, NULL);
	uint64_t t0 = kolo_now_ms();
	kolo_p2p_destroy(w.p[1]);
	w.p[1] = NULL;
	char msg[KOLO_ERRBUF_SIZE];
	ck_assert_int_eq(wait_(r, msg), KOLO_EPEER);
	ck_assert_uint_lt(kolo_now_ms() - t0, 2000);
	ck_assert_ptr_nonnull(strstr(msg, "rank 1"));
	/* The p2p stays failed: a later operation is refused at once. */
	struct kolo_errbuf eb = {{0}};
	ck_assert_int_eq(
	        kolo_p2p_recv(w.p[0], &got, sizeof(got), 1, 0, NULL, NULL, NULL, NULL, &eb),
	        KOLO_EPEER);
	world_close(&w);
}
END_TEST

START_TEST(a_failed_comm_fails_pending_operations)
{
	struct world w;
	world_open(&w, 3, 20000);
	int got = 0;
	kolo_handle_t *r = recv_(&w, 0, &got, sizeof(got), KOLO_P2P_ANY_SOURCE, 0, NULL);
	atomic_store(&w.health_st, KOLO_EMEMBERSHIP);
	char msg[KOLO_ERRBUF_SIZE];
	ck_assert_int_eq(wait_(r, msg), KOLO_EMEMBERSHIP);
	ck_assert_ptr_nonnull(strstr(msg, "re-formed"));
	world_close(&w);
}
END_TEST

START_TEST(bad_arguments_are_refused)
{
	struct world w;
	world_open(&w, 2, 1000);
	int v = 0;
	struct kolo_errbuf eb = {{0}};
	ck_assert_int_eq(kolo_p2p_send(w.p[0], &v, 4, 0, 0, NULL, NULL, NULL, &eb), KOLO_EINVAL);
	ck_assert_ptr_nonnull(strstr(eb.msg, "itself"));
	ck_assert_int_eq(kolo_p2p_send(w.p[0], &v, 4, 2, 0, NULL, NULL, NULL, &eb), KOLO_EINVAL);
	ck_assert_int_eq(kolo_p2p_recv(w.p[0], &v, 4, -5, 0, NULL, NULL, NULL, NULL, &eb),
	                 KOLO_EINVAL);
	ck_assert_int_eq(kolo_p2p_send(w.p[0], NULL, 4, 1, 0, NULL, NULL, NULL, &eb), KOLO_EINVAL);
	/* Still usable. */
	ck_assert_int_eq(wait_(send_(&w, 0, &v, 4, 1, 0), NULL), KOLO_OK);
	ck_assert_int_eq(wait_(recv_(&w, 1, &v, 4, 0, 0, NULL), NULL), KOLO_OK);
	world_close(&w);
}
END_TEST

static Suite *p2p_suite(void)
{
	Suite *s = suite_create("p2p");
	TCase *tc = tcase_create("p2p");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, tags_match_out_of_order);
	tcase_add_test(tc, any_source_names_the_sender);
	tcase_add_test(tc, order_is_kept_for_early_and_late_messages);
	tcase_add_test(tc, large_and_empty_messages);
	tcase_add_test(tc, wrong_size_fails_the_recv_and_keeps_the_message);
	tcase_add_test(tc, send_to_a_peer_that_opens_late);
	tcase_add_test(tc, recv_times_out);
	tcase_add_test(tc, a_peer_that_goes_fails_the_recv_at_once);
	tcase_add_test(tc, a_failed_comm_fails_pending_operations);
	tcase_add_test(tc, bad_arguments_are_refused);
	suite_add_tcase(s, tc);
	return s;
}

KOLO_CHECK_MAIN(p2p_suite)
