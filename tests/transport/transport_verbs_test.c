/* The verbs transport's own cases, on the emulation (transport_verbs.h):
 * what the shared suites cannot provoke. Credit exhaustion, completions of
 * several QPs out of order, a QP going to error mid-transfer, stale-round
 * handles, RoCE addressing, the hybrid over verbs, and the errors without a
 * device. The emulation exercises the protocol, not a NIC. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "hybrid.h"
#include "testutil.h"
#include "transport_verbs.h"
#include "tt_util.h"

static const struct kolo_verbs_emu_opts ib = {.roce = false, .reorder = false};
static const struct kolo_verbs_emu_opts ib_shuffled = {.roce = false, .reorder = true};
static const struct kolo_verbs_emu_opts roce = {.roce = true, .reorder = true};

static struct tt_transport verbs_tr(const struct kolo_verbs_emu_opts *o)
{
	return (struct tt_transport){"verbs", &kolo_transport_verbs_ops, true, NULL, o, NULL};
}

/* n messages a→b (seed k for message k), sizes lens[k]; every receive is
 * posted first when recv_first, else after all sends. */
static void stream(struct tt_pair *p, const size_t *lens, int n, bool recv_first)
{
	struct kolo_transport *ts[] = {p->a, p->b};
	uint8_t **sb = calloc((size_t)n, sizeof(*sb)), **rb = calloc((size_t)n, sizeof(*rb));
	struct kolo_req **reqs = calloc(2 * (size_t)n, sizeof(*reqs));
	ck_assert(sb && rb && reqs);
	for (int k = 0; k < n; k++) {
		sb[k] = tt_alloc(lens[k]);
		rb[k] = tt_alloc(lens[k]);
		tt_fill(sb[k], lens[k], (uint32_t)k + 100);
	}
	for (int pass = 0; pass < 2; pass++)
		for (int k = 0; k < n; k++) {
			if (pass == (recv_first ? 0 : 1))
				ck_assert_int_eq(p->ops->irecv(p->ba, rb[k], lens[k], &reqs[n + k]),
				                 KOLO_OK);
			else
				ck_assert_int_eq(p->ops->isend(p->ab, sb[k], lens[k], &reqs[k]),
				                 KOLO_OK);
		}
	ck_assert_int_eq(tt_drive(ts, 2, reqs, NULL, 2 * n, 30000), KOLO_OK);
	for (int k = 0; k < n; k++) {
		ck_assert_msg(tt_check(rb[k], lens[k], (uint32_t)k + 100) < 0,
		              "message %d (%zu bytes)", k, lens[k]);
		free(sb[k]);
		free(rb[k]);
	}
	free(sb);
	free(rb);
	free(reqs);
}

/* RoCE: the QPs are addressed by GID (the emulation refuses a write whose
 * QP lacks the target's GID), every path of the protocol once. */
START_TEST(roce_every_path)
{
	struct tt_transport tr = verbs_tr(&roce);
	struct tt_pair p;
	tt_pair_open(&p, &tr, 1, 20000);
	static const size_t lens[] = {0, 1, 16384, 16385, 50000, 65536, 1u << 20, 3, 0};
	stream(&p, lens, (int)KOLO_ARRAY_SIZE(lens), true);
	stream(&p, lens, (int)KOLO_ARRAY_SIZE(lens), false);
	struct kolo_verbs_emu_stats st;
	kolo_verbs_emu_stats(&st);
	ck_assert_uint_gt(st.writes, KOLO_ARRAY_SIZE(lens));
	ck_assert_uint_eq(st.remote_access_errors, 0);
	tt_pair_close(&p);
}
END_TEST

/* Two slots: a sender with many messages and no receive posted stalls on
 * credits instead of overrunning the peer; once receives come, every
 * message arrives intact, and no write ever found no receive (RNR). */
START_TEST(credit_exhaustion)
{
	struct tt_transport tr = verbs_tr(&ib);
	const struct kolo_transport_ops *ops = tr.ops;
	struct kolo_transport_config ca = tt_config(&tr, 0, 2, 1, 20000);
	struct kolo_transport_config cb = tt_config(&tr, 1, 2, 1, 20000);
	ca.verbs_slots = cb.verbs_slots = 2;
	struct tt_pair p = {.ops = ops};
	p.a = tt_open(ops, &ca, &p.ha);
	p.b = tt_open(ops, &cb, &p.hb);
	ck_assert_int_eq(ops->connect(p.a, &p.hb, 1, 7, &p.ab), KOLO_OK);
	struct kolo_transport *ts[] = {p.a, p.b};
	p.ba = tt_accept(p.b, 0, 7, ts, 2, 5000);
	ck_assert_ptr_nonnull(p.ba);
	enum { N = 40 };
	size_t len = 3 * 16384 - 5; /* three segments each */
	uint8_t *sb[N], *rb[N];
	struct kolo_req *sr[N], *rr[N];
	for (int k = 0; k < N; k++) {
		sb[k] = tt_alloc(len);
		rb[k] = tt_alloc(len);
		tt_fill(sb[k], len, (uint32_t)k);
		ck_assert_int_eq(ops->isend(p.ab, sb[k], len, &sr[k]), KOLO_OK);
	}
	/* Drive both sides for a while: with two credits, at most the first
	 * message's first two segments can leave. */
	for (int i = 0; i < 50; i++) {
		ops->wait(p.a, 1);
		ops->wait(p.b, 1);
	}
	int done = 0;
	for (int k = 0; k < N; k++) {
		bool d = false;
		ck_assert_int_eq(ops->test(sr[k], &d), KOLO_OK);
		if (d) {
			sr[k] = NULL;
			done++;
		}
	}
	ck_assert_int_eq(done, 0);
	for (int k = 0; k < N; k++)
		ck_assert_int_eq(ops->irecv(p.ba, rb[k], len, &rr[k]), KOLO_OK);
	ck_assert_int_eq(tt_drive(ts, 2, rr, NULL, N, 20000), KOLO_OK);
	ck_assert_int_eq(tt_drive(ts, 2, sr, NULL, N, 20000), KOLO_OK);
	for (int k = 0; k < N; k++) {
		ck_assert_msg(tt_check(rb[k], len, (uint32_t)k) < 0, "message %d", k);
		free(sb[k]);
		free(rb[k]);
	}
	struct kolo_verbs_emu_stats st;
	kolo_verbs_emu_stats(&st);
	ck_assert_uint_eq(st.rnr_retries, 0);
	ck_assert_uint_ge(st.recv_completions, 3 * N);
	tt_pair_close(&p);
}
END_TEST

/* One endpoint with conns to three peers on one CQ, completions shuffled
 * across QPs: each conn still gets its own bytes in order. */
START_TEST(completions_out_of_order_across_qps)
{
	struct tt_transport tr = verbs_tr(&ib_shuffled);
	const struct kolo_transport_ops *ops = tr.ops;
	enum { P = 4 };
	struct kolo_transport *t[P];
	struct kolo_transport_handle h[P];
	for (int r = 0; r < P; r++) {
		struct kolo_transport_config cfg = tt_config(&tr, r, P, 1, 20000);
		t[r] = tt_open(ops, &cfg, &h[r]);
	}
	struct kolo_conn *out[P] = {0}, *in[P] = {0};
	for (int r = 1; r < P; r++) {
		ck_assert_int_eq(ops->connect(t[0], &h[r], r, 1, &out[r]), KOLO_OK);
		in[r] = tt_accept(t[r], 0, 1, t, P, 5000);
		ck_assert_ptr_nonnull(in[r]);
	}
	enum { M = 12 };
	size_t len = 40000;
	uint8_t *sb[P][M], *rb[P][M];
	struct kolo_req *reqs[2 * P * M];
	int nr = 0;
	for (int k = 0; k < M; k++)
		for (int r = 1; r < P; r++) {
			sb[r][k] = tt_alloc(len);
			rb[r][k] = tt_alloc(len);
			tt_fill(sb[r][k], len, (uint32_t)(r * 1000 + k));
			ck_assert_int_eq(ops->isend(out[r], sb[r][k], len, &reqs[nr++]), KOLO_OK);
			ck_assert_int_eq(ops->irecv(in[r], rb[r][k], len, &reqs[nr++]), KOLO_OK);
		}
	ck_assert_int_eq(tt_drive(t, P, reqs, NULL, nr, 30000), KOLO_OK);
	for (int k = 0; k < M; k++)
		for (int r = 1; r < P; r++) {
			ck_assert_msg(tt_check(rb[r][k], len, (uint32_t)(r * 1000 + k)) < 0,
			              "peer %d message %d", r, k);
			free(sb[r][k]);
			free(rb[r][k]);
		}
	struct kolo_verbs_emu_stats st;
	kolo_verbs_emu_stats(&st);
	ck_assert_uint_gt(st.reordered, 0);
	for (int r = 1; r < P; r++) {
		ops->close(out[r]);
		ops->close(in[r]);
	}
	for (int r = 0; r < P; r++)
		ops->destroy(t[r]);
}
END_TEST

/* The receiver's QP goes to error between two messages of a stream, as a
 * failing link would: its flushed receives fail its conn with KOLO_EPEER,
 * and the sender learns within the bound too. */
START_TEST(qp_error_mid_transfer)
{
	struct tt_transport tr = verbs_tr(&ib);
	struct tt_pair p;
	tt_pair_open(&p, &tr, 1, 20000);
	const struct kolo_transport_ops *ops = p.ops;
	struct kolo_transport *ts[] = {p.a, p.b};
	enum { N = 4 };
	size_t len = 1u << 20;
	uint8_t *sb = tt_alloc(len), *rb = tt_alloc(len);
	tt_fill(sb, len, 9);
	struct kolo_req *s[N], *r[N];
	for (int k = 0; k < N; k++)
		ck_assert_int_eq(ops->isend(p.ab, sb, len, &s[k]), KOLO_OK);
	for (int k = 0; k < 2; k++)
		ck_assert_int_eq(ops->irecv(p.ba, rb, len, &r[k]), KOLO_OK);
	ck_assert_int_eq(tt_drive(ts, 2, r, NULL, 2, 10000), KOLO_OK);
	ck_assert(tt_check(rb, len, 9) < 0);
	ck_assert_int_eq(kolo_verbs_emu_qp_error(kolo_verbs_conn_qpn(p.ba)), KOLO_OK);
	for (int k = 2; k < N; k++)
		ck_assert_int_eq(ops->irecv(p.ba, rb, len, &r[k]), KOLO_OK);
	kolo_status_t sts[N] = {KOLO_OK};
	uint64_t t0 = kolo_now_ms();
	ck_assert_int_eq(tt_drive(ts, 2, r + 2, sts + 2, 2, 5000), KOLO_EPEER);
	ck_assert_int_eq(sts[2], KOLO_EPEER);
	ck_assert_int_eq(sts[3], KOLO_EPEER);
	ck_assert_ptr_nonnull(strstr(p.b->err.msg, "rank 0"));
	ck_assert_ptr_nonnull(strstr(p.b->err.msg, "Flush"));
	/* The sender's remaining messages fail too, promptly. */
	kolo_status_t st = tt_drive(ts, 2, s, NULL, N, 5000);
	ck_assert_msg(st == KOLO_EPEER || st == KOLO_OK, "sender: %s", kolo_status_name(st));
	struct kolo_req *more = NULL;
	kolo_status_t pst = ops->isend(p.ab, sb, 10, &more);
	if (pst == KOLO_OK)
		pst = tt_drive(ts, 2, &more, NULL, 1, 5000);
	ck_assert_int_eq(pst, KOLO_EPEER);
	ck_assert_uint_lt(kolo_now_ms() - t0, 5000);
	struct kolo_verbs_emu_stats est;
	kolo_verbs_emu_stats(&est);
	ck_assert_uint_gt(est.flushed, 0);
	free(sb);
	free(rb);
	tt_pair_close(&p);
}
END_TEST

/* A handle of another round is refused on both sides: the stale
 * connector's conn fails with KOLO_EMEMBERSHIP and the acceptor never
 * hands one out; a handle that is not a verbs handle is an error at once. */
START_TEST(stale_round_handle_refused)
{
	struct tt_transport tr = verbs_tr(&ib);
	const struct kolo_transport_ops *ops = tr.ops;
	struct kolo_transport_config ca = tt_config(&tr, 0, 2, 1, 5000);
	struct kolo_transport_config cb = tt_config(&tr, 1, 2, 1, 5000);
	cb.round = TT_ROUND + 1;
	struct kolo_transport_handle ha, hb;
	struct kolo_transport *a = tt_open(ops, &ca, &ha);
	struct kolo_transport *b = tt_open(ops, &cb, &hb);
	struct kolo_transport *ts[] = {a, b};
	struct kolo_conn *ab = NULL, *ba = NULL;
	ck_assert_int_eq(ops->connect(a, &hb, 1, 2, &ab), KOLO_OK);
	ck_assert_int_eq(ops->connect(b, &ha, 0, 3, &ba), KOLO_OK);
	uint8_t buf[16] = {0};
	struct kolo_req *r[2];
	ck_assert_int_eq(ops->isend(ab, buf, sizeof(buf), &r[0]), KOLO_OK);
	ck_assert_int_eq(ops->isend(ba, buf, sizeof(buf), &r[1]), KOLO_OK);
	kolo_status_t sts[2];
	tt_drive(ts, 2, r, sts, 2, 3000);
	ck_assert_int_eq(sts[0], KOLO_EMEMBERSHIP);
	ck_assert_int_ne(sts[1], KOLO_OK);
	ck_assert_ptr_nonnull(strstr(a->err.msg, "round"));
	struct kolo_conn *none = NULL;
	ck_assert_int_eq(ops->accept(a, 1, 3, &none), KOLO_OK);
	ck_assert_ptr_null(none);
	ck_assert_int_eq(ops->accept(b, 0, 2, &none), KOLO_OK);
	ck_assert_ptr_null(none);
	struct kolo_transport_handle junk;
	memset(&junk, 0, sizeof(junk));
	ck_assert_int_eq(ops->connect(a, &junk, 1, 4, &none), KOLO_EINVAL);
	ops->close(ab);
	ops->close(ba);
	ops->destroy(a);
	ops->destroy(b);
}
END_TEST

/* The hybrid with verbs between hosts: ranks on one host still meet in
 * shared memory, the others over (emulated) RDMA. */
START_TEST(hybrid_over_verbs)
{
	static const bool hosts[TT_MAX_RANKS][TT_MAX_RANKS] = {
	        {1, 1, 0, 0}, {1, 1, 0, 0}, {0, 0, 1, 1}, {0, 0, 1, 1}};
	struct tt_transport tr = {"hybrid over verbs", &kolo_transport_hybrid_ops, true, hosts,
	                          &ib_shuffled,        &kolo_transport_verbs_ops};
	const struct kolo_transport_ops *ops = tr.ops;
	struct kolo_transport *t[3];
	struct kolo_transport_handle h[3];
	for (int r = 0; r < 3; r++) {
		struct kolo_transport_config cfg = tt_config(&tr, r, 3, 1, 20000);
		t[r] = tt_open(ops, &cfg, &h[r]);
	}
	/* 0→1 on one host (shared memory), 0→2 across (verbs). */
	struct kolo_conn *c01, *c02, *c10, *c20;
	ck_assert_int_eq(ops->connect(t[0], &h[1], 1, 0, &c01), KOLO_OK);
	ck_assert_int_eq(ops->connect(t[0], &h[2], 2, 0, &c02), KOLO_OK);
	c10 = tt_accept(t[1], 0, 0, t, 3, 5000);
	c20 = tt_accept(t[2], 0, 0, t, 3, 5000);
	ck_assert(c10 && c20);
	static const size_t lens[] = {0, 1000, 300000};
	for (size_t k = 0; k < KOLO_ARRAY_SIZE(lens); k++) {
		size_t n = lens[k];
		uint8_t *s = tt_alloc(n), *r1 = tt_alloc(n), *r2 = tt_alloc(n);
		tt_fill(s, n, (uint32_t)k);
		struct kolo_req *q[4];
		ck_assert_int_eq(ops->isend(c01, s, n, &q[0]), KOLO_OK);
		ck_assert_int_eq(ops->isend(c02, s, n, &q[1]), KOLO_OK);
		ck_assert_int_eq(ops->irecv(c10, r1, n, &q[2]), KOLO_OK);
		ck_assert_int_eq(ops->irecv(c20, r2, n, &q[3]), KOLO_OK);
		ck_assert_int_eq(tt_drive(t, 3, q, NULL, 4, 20000), KOLO_OK);
		ck_assert(tt_check(r1, n, (uint32_t)k) < 0 && tt_check(r2, n, (uint32_t)k) < 0);
		free(s);
		free(r1);
		free(r2);
	}
	ops->close(c01);
	ops->close(c02);
	ops->close(c10);
	ops->close(c20);
	for (int r = 0; r < 3; r++)
		ops->destroy(t[r]);
}
END_TEST

/* Without the emulation, on a machine without RDMA: create() fails and
 * says why in words an operator can act on. Skipped where a device exists. */
START_TEST(no_device_is_a_clear_error)
{
	struct kolo_errbuf eb = {{0}};
	if (kolo_verbs_available(NULL, NULL, &eb))
		return; /* real hardware: nothing to check here */
	ck_assert_ptr_nonnull(strstr(eb.msg, "no RDMA device"));
	struct kolo_transport_config cfg = tt_config(NULL, 0, 1, 1, 1000);
	struct kolo_transport *t = NULL;
	struct kolo_errbuf eb2 = {{0}};
	ck_assert_int_eq(kolo_transport_verbs_ops.create(&cfg, &t, &eb2), KOLO_EUNSUPPORTED);
	ck_assert_ptr_null(t);
	ck_assert_ptr_nonnull(strstr(eb2.msg, "no RDMA device"));
	struct kolo_verbs_info info;
	kolo_verbs_query(&info);
	ck_assert(!info.emulated);
	ck_assert(!info.loaded || info.ndevs == 0 || !info.devs[0].ports[0].active);
}
END_TEST

static Suite *verbs_suite(void)
{
	Suite *s = suite_create("transport_verbs");
	TCase *tc = tcase_create("verbs");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, roce_every_path);
	tcase_add_test(tc, credit_exhaustion);
	tcase_add_test(tc, completions_out_of_order_across_qps);
	tcase_add_test(tc, qp_error_mid_transfer);
	tcase_add_test(tc, stale_round_handle_refused);
	tcase_add_test(tc, hybrid_over_verbs);
	tcase_add_test(tc, no_device_is_a_clear_error);
	suite_add_tcase(s, tc);
	return s;
}

KOLO_CHECK_MAIN(verbs_suite)
