/* A connection of an old round never reaches the re-formed ring: a ghost
 * endpoint of round 1 connects to a rank of round 2 as the peer that rank
 * waits for, first; the ring of round 2 still forms with the real peer and
 * computes correctly, and the ghost's connection is refused. */
#include <pthread.h>
#include <string.h>

#include "ring.h"
#include "testutil.h"
#include "transport_tcp.h"

static const char job[] = "stale-job";
static const char secret[] = "stale-secret";

static struct kolo_transport_config config(int64_t round, int rank, int size)
{
	struct kolo_transport_config c = {
	        .job = job,
	        .round = round,
	        .rank = rank,
	        .size = size,
	        .token = (const uint8_t *)secret,
	        .token_len = sizeof(secret) - 1,
	        .timeout_ms = 10000,
	        .streams = 1,
	        .iface = "127.0.0.1",
	        .spin_us = 0,
	};
	return c;
}

static struct kolo_transport_handle handles[2];

static kolo_status_t lookup(void *ctx, int rank, struct kolo_transport_handle *out, int timeout_ms)
{
	(void)ctx, (void)timeout_ms;
	*out = handles[rank];
	return KOLO_OK;
}

struct member {
	struct kolo_transport *t;
	int rank;
	kolo_status_t st;
	double result[4];
};

static void *member_main(void *arg)
{
	struct member *m = arg;
	struct kolo_ring_config rc = {.transport = m->t,
	                              .rank = m->rank,
	                              .size = 2,
	                              .lookup = lookup,
	                              .timeout_ms = 10000};
	struct kolo_ring_comm *ring = NULL;
	struct kolo_errbuf eb = {{0}};
	m->st = kolo_ring_comm_create(&rc, &ring, &eb);
	if (m->st == KOLO_OK) {
		for (int i = 0; i < 4; i++)
			m->result[i] = (m->rank + 1) * (i + 1);
		m->st = kolo_ring_allreduce(ring, m->result, m->result, 4, KOLO_FLOAT64, KOLO_SUM,
		                            1.0, 1.0);
	}
	kolo_ring_comm_destroy(ring);
	return NULL;
}

START_TEST(test_stale_round_refused)
{
	const struct kolo_transport_ops *ops = &kolo_transport_tcp_ops;
	struct member m[2];
	memset(m, 0, sizeof(m));
	for (int r = 0; r < 2; r++) {
		struct kolo_transport_config c = config(2, r, 2);
		m[r].rank = r;
		ck_assert_int_eq(ops->create(&c, &m[r].t, NULL), KOLO_OK);
		ck_assert_int_eq(ops->listen(m[r].t, &handles[r]), KOLO_OK);
	}
	/* The ghost: rank 0 of round 1, connecting to rank 1 with the ring's tag. */
	struct kolo_transport_config gc = config(1, 0, 2);
	struct kolo_transport *ghost = NULL;
	struct kolo_transport_handle gh;
	ck_assert_int_eq(ops->create(&gc, &ghost, NULL), KOLO_OK);
	ck_assert_int_eq(ops->listen(ghost, &gh), KOLO_OK);
	struct kolo_conn *gconn = NULL;
	ck_assert_int_eq(ops->connect(ghost, &handles[1], 1, 0, &gconn), KOLO_OK);
	static char byte = 'x';
	struct kolo_req *req = NULL;
	ck_assert_int_eq(ops->isend(gconn, &byte, 1, &req), KOLO_OK);
	/* Rank 1 starts first and sees the ghost's handshake before the real one. */
	pthread_t th[2];
	pthread_create(&th[1], NULL, member_main, &m[1]);
	kolo_status_t gst = KOLO_OK;
	bool done = false;
	uint64_t end = kolo_now_ms() + 10000;
	while (gst == KOLO_OK && !done && kolo_now_ms() < end) {
		gst = ops->test(req, &done);
		if (gst == KOLO_OK && !done)
			ops->wait(ghost, 10);
	}
	ck_assert_msg(gst != KOLO_OK, "the ghost's send was not refused (done %d)", done);
	pthread_create(&th[0], NULL, member_main, &m[0]);
	pthread_join(th[0], NULL);
	pthread_join(th[1], NULL);
	for (int r = 0; r < 2; r++) {
		ck_assert_int_eq(m[r].st, KOLO_OK);
		for (int i = 0; i < 4; i++)
			ck_assert(m[r].result[i] == 3.0 * (i + 1));
	}
	ops->close(gconn);
	ops->destroy(ghost);
	ops->destroy(m[0].t);
	ops->destroy(m[1].t);
}
END_TEST

static Suite *stale_suite(void)
{
	Suite *s = suite_create("elastic_stale_round");
	TCase *tc = tcase_create("stale");
	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, test_stale_round_refused);
	suite_add_tcase(s, tc);
	return s;
}

KOLO_CHECK_MAIN(stale_suite)
