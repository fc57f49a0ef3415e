/* The transport conformance suite: every transport in tt_transports (TCP,
 * shared memory, and the hybrid of both in two host layouts) must pass it.
 * Loop index i selects the transport (and, where noted, the stream
 * count). */
#include <check.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "hybrid.h"
#include "testutil.h"
#include "transport_shm.h"
#include "transport_tcp.h"
#include "transport_verbs.h"
#include "tt_util.h"

/* The largest message: past every transport's staging (shm's rings, verbs'
 * slots and rendezvous threshold, TCP's socket buffers) many times over.
 * ThreadSanitizer checks every byte a copy moves, so its build sends a
 * quarter, still far past them. */
#if defined(__SANITIZE_THREAD__)
#define BIG (16u << 20)
#else
#define BIG (64u << 20)
#endif

/* Loop index -> transport and stream count: every transport with 1 stream,
 * and with 4 those that use the count (TCP, and the hybrid's TCP pairs);
 * shared memory and verbs ignore it, so a second run of theirs would repeat
 * the first. */
struct combo {
	int tr, streams;
};
static struct combo combos[32];
static int ncombos;

static void combos_init(void)
{
	for (int t = 0; t < tt_ntransports && ncombos + 2 <= (int)KOLO_ARRAY_SIZE(combos); t++) {
		const struct kolo_transport_ops *ops = tt_transports[t].ops;
		combos[ncombos++] = (struct combo){t, 1};
		if (ops != &kolo_transport_shm_ops && ops != &kolo_transport_verbs_ops)
			combos[ncombos++] = (struct combo){t, 4};
	}
}

static const struct tt_transport *tr_of(int i)
{
	return &tt_transports[combos[i].tr];
}

static int streams_of(int i)
{
	return combos[i].streams;
}

/* Sends one patterned message each way on (x, y) and checks both. */
static void exchange(struct kolo_transport **ts, struct kolo_conn *x, struct kolo_conn *y,
                     size_t len, uint32_t seed)
{
	const struct kolo_transport_ops *ops = ts[0]->ops;
	uint8_t *sx = tt_alloc(len), *sy = tt_alloc(len), *rx = tt_alloc(len), *ry = tt_alloc(len);
	tt_fill(sx, len, seed);
	tt_fill(sy, len, seed + 1);
	memset(rx, 0xee, len);
	memset(ry, 0xee, len);
	struct kolo_req *reqs[4];
	ck_assert_int_eq(ops->isend(x, sx, len, &reqs[0]), KOLO_OK);
	ck_assert_int_eq(ops->irecv(y, ry, len, &reqs[1]), KOLO_OK);
	ck_assert_int_eq(ops->isend(y, sy, len, &reqs[2]), KOLO_OK);
	ck_assert_int_eq(ops->irecv(x, rx, len, &reqs[3]), KOLO_OK);
	kolo_status_t sts[4];
	ck_assert_int_eq(tt_drive(ts, 2, reqs, sts, 4, 60000), KOLO_OK);
	ck_assert_msg(tt_check(ry, len, seed) < 0, "x->y %zu bytes: byte %lld wrong", len,
	              tt_check(ry, len, seed));
	ck_assert_msg(tt_check(rx, len, seed + 1) < 0, "y->x %zu bytes: byte %lld wrong", len,
	              tt_check(rx, len, seed + 1));
	free(sx);
	free(sy);
	free(rx);
	free(ry);
}

/* A post after a failure or abort must fail with want: at once, or through
 * the request it returned. */
static void assert_post_fails(struct kolo_transport *t, kolo_status_t got, struct kolo_req *r,
                              kolo_status_t want)
{
	bool strict = true;
	for (int i = 0; i < tt_ntransports; i++)
		if (tt_transports[i].ops == t->ops)
			strict = tt_transports[i].posts_fail_after_error;
	if (!strict) {
		if (got == KOLO_OK)
			tt_drive(&t, 1, &r, NULL, 1, 2000); /* release it */
		return;
	}
	if (got == KOLO_OK)
		got = tt_drive(&t, 1, &r, NULL, 1, 2000);
	ck_assert_int_eq(got, want);
}

START_TEST(connect_accept_both_directions)
{
	const struct kolo_transport_ops *ops = tt_transports[_i].ops;
	struct tt_pair p;
	tt_pair_open(&p, &tt_transports[_i], 2, 10000);
	struct kolo_transport *ts[] = {p.a, p.b};
	/* b also connects to a, with another tag. */
	struct kolo_conn *b2a = NULL;
	ck_assert_int_eq(ops->connect(p.b, &p.ha, 0, 8, &b2a), KOLO_OK);
	struct kolo_conn *a_from_b = tt_accept(p.a, 1, 8, ts, 2, 5000);
	ck_assert_ptr_nonnull(a_from_b);
	/* The wrong tag or rank is not accepted. */
	struct kolo_conn *none = NULL;
	ck_assert_int_eq(ops->accept(p.a, 1, 9, &none), KOLO_OK);
	ck_assert_ptr_null(none);
	exchange(ts, p.ab, p.ba, 4096, 1);
	exchange(ts, b2a, a_from_b, 100000, 2);
	ops->close(b2a);
	ops->close(a_from_b);
	tt_pair_close(&p);
}
END_TEST

START_TEST(ordered_sizes)
{
	struct tt_pair p;
	tt_pair_open(&p, tr_of(_i), streams_of(_i), 20000);
	struct kolo_transport *ts[] = {p.a, p.b};
	static const size_t sizes[] = {0, 1, 3, 4097, 65537, 1u << 20, (1u << 20) + 13, BIG};
	for (size_t k = 0; k < KOLO_ARRAY_SIZE(sizes); k++)
		exchange(ts, p.ab, p.ba, sizes[k], (uint32_t)k * 3);
	tt_pair_close(&p);
}
END_TEST

/* Many sends outstanding before any receive: the n-th receive gets the n-th
 * send, whatever stream its chunks took. */
START_TEST(many_outstanding)
{
	struct tt_pair p;
	tt_pair_open(&p, tr_of(_i), streams_of(_i), 20000);
	const struct kolo_transport_ops *ops = p.ops;
	struct kolo_transport *ts[] = {p.a, p.b};
	enum { N = 300 };
	size_t lens[N];
	uint8_t *sb[N], *rb[N];
	struct kolo_req *reqs[2 * N];
	for (int k = 0; k < N; k++) {
		lens[k] = (size_t)(k * 7919) % 200000;
		if (k % 10 == 0)
			lens[k] = 0;
		sb[k] = tt_alloc(lens[k]);
		rb[k] = tt_alloc(lens[k]);
		tt_fill(sb[k], lens[k], (uint32_t)k);
		ck_assert_int_eq(ops->isend(p.ab, sb[k], lens[k], &reqs[k]), KOLO_OK);
	}
	for (int k = 0; k < N; k++)
		ck_assert_int_eq(ops->irecv(p.ba, rb[k], lens[k], &reqs[N + k]), KOLO_OK);
	ck_assert_int_eq(tt_drive(ts, 2, reqs, NULL, 2 * N, 60000), KOLO_OK);
	for (int k = 0; k < N; k++) {
		ck_assert_msg(tt_check(rb[k], lens[k], (uint32_t)k) < 0, "message %d corrupt", k);
		free(sb[k]);
		free(rb[k]);
	}
	tt_pair_close(&p);
}
END_TEST

/* Data that arrives before its receive is posted waits in the socket; the
 * receives posted later still match in order. */
START_TEST(irecv_after_arrival)
{
	struct tt_pair p;
	tt_pair_open(&p, tr_of(_i), streams_of(_i), 20000);
	const struct kolo_transport_ops *ops = p.ops;
	struct kolo_transport *ts[] = {p.a, p.b};
	static const size_t lens[] = {1000, 0, 200000, 3u << 20, 17};
	enum { N = KOLO_ARRAY_SIZE(lens) };
	uint8_t *sb[N], *rb[N];
	struct kolo_req *sreq[N], *rreq[N];
	for (int k = 0; k < N; k++) {
		sb[k] = tt_alloc(lens[k]);
		rb[k] = tt_alloc(lens[k]);
		tt_fill(sb[k], lens[k], 40u + (uint32_t)k);
		ck_assert_int_eq(ops->isend(p.ab, sb[k], lens[k], &sreq[k]), KOLO_OK);
	}
	/* The first two sends fit in the socket buffers: they complete with
	 * no receive posted. */
	ck_assert_int_eq(tt_drive(ts, 2, sreq, NULL, 2, 5000), KOLO_OK);
	/* Receive only the first; the others stay queued. */
	ck_assert_int_eq(ops->irecv(p.ba, rb[0], lens[0], &rreq[0]), KOLO_OK);
	ck_assert_int_eq(tt_drive(ts, 2, rreq, NULL, 1, 5000), KOLO_OK);
	for (int k = 0; k < 20; k++) {
		ops->wait(p.a, 1);
		ops->wait(p.b, 1);
	}
	for (int k = 1; k < N; k++)
		ck_assert_int_eq(ops->irecv(p.ba, rb[k], lens[k], &rreq[k]), KOLO_OK);
	ck_assert_int_eq(tt_drive(ts, 2, rreq + 1, NULL, N - 1, 20000), KOLO_OK);
	ck_assert_int_eq(tt_drive(ts, 2, sreq + 2, NULL, N - 2, 20000), KOLO_OK);
	for (int k = 0; k < N; k++) {
		ck_assert_msg(tt_check(rb[k], lens[k], 40u + (uint32_t)k) < 0, "message %d", k);
		free(sb[k]);
		free(rb[k]);
	}
	tt_pair_close(&p);
}
END_TEST

/* A zero-length message synchronises like any other: its receive completes
 * only once the peer has sent it (a barrier is built from them). */
START_TEST(zero_length_synchronises)
{
	struct tt_pair p;
	tt_pair_open(&p, tr_of(_i), streams_of(_i), 20000);
	const struct kolo_transport_ops *ops = p.ops;
	struct kolo_transport *ts[] = {p.a, p.b};
	for (int round = 0; round < 3; round++) {
		struct kolo_req *r, *s;
		ck_assert_int_eq(ops->irecv(p.ba, NULL, 0, &r), KOLO_OK);
		bool done = false;
		for (int k = 0; k < 50 && !done; k++) {
			ck_assert_int_eq(ops->test(r, &done), KOLO_OK);
			ops->wait(p.a, 1);
			ops->wait(p.b, 1);
		}
		ck_assert_msg(!done, "a zero-length receive completed with nothing sent");
		ck_assert_int_eq(ops->isend(p.ab, NULL, 0, &s), KOLO_OK);
		struct kolo_req *reqs[] = {r, s};
		ck_assert_int_eq(tt_drive(ts, 2, reqs, NULL, 2, 5000), KOLO_OK);
	}
	tt_pair_close(&p);
}
END_TEST

/* A receive of the wrong length is a protocol error, not silent corruption.
 * (The contract makes equal lengths the caller's duty; every transport checks
 * it.) */
START_TEST(length_mismatch)
{
	struct tt_pair p;
	tt_pair_open(&p, tr_of(_i), streams_of(_i), 20000);
	const struct kolo_transport_ops *ops = p.ops;
	struct kolo_transport *ts[] = {p.a, p.b};
	uint8_t sb[100] = {0}, rb[50];
	struct kolo_req *reqs[2];
	ck_assert_int_eq(ops->isend(p.ab, sb, sizeof(sb), &reqs[0]), KOLO_OK);
	ck_assert_int_eq(ops->irecv(p.ba, rb, sizeof(rb), &reqs[1]), KOLO_OK);
	kolo_status_t sts[2] = {KOLO_OK, KOLO_OK};
	tt_drive(ts, 2, reqs + 1, sts + 1, 1, 5000);
	ck_assert_int_eq(sts[1], KOLO_EPROTO);
	ck_assert_ptr_null(reqs[1]);
	tt_drive(ts, 2, reqs, sts, 1, 5000);
	tt_pair_close(&p);
}
END_TEST

struct abort_arg {
	struct kolo_transport *t;
	int delay_ms;
};

static void *abort_later(void *arg)
{
	struct abort_arg *a = arg;
	kolo_sleep_ms((uint64_t)a->delay_ms); /* lets the main thread block first */
	a->t->ops->abort(a->t, KOLO_ESHUTDOWN);
	return NULL;
}

START_TEST(abort_wakes_wait)
{
	struct tt_pair p;
	tt_pair_open(&p, &tt_transports[_i], 2, 20000);
	const struct kolo_transport_ops *ops = p.ops;
	uint8_t rb[64];
	struct kolo_req *r = NULL;
	ck_assert_int_eq(ops->irecv(p.ba, rb, sizeof(rb), &r), KOLO_OK);
	struct abort_arg arg = {p.b, 200};
	pthread_t th;
	ck_assert_int_eq(pthread_create(&th, NULL, abort_later, &arg), 0);
	uint64_t t0 = kolo_now_ms();
	kolo_status_t st = KOLO_OK;
	while (st == KOLO_OK && kolo_now_ms() - t0 < 10000)
		st = ops->wait(p.b, 10000);
	uint64_t dt = kolo_now_ms() - t0;
	pthread_join(th, NULL);
	ck_assert_int_eq(st, KOLO_ESHUTDOWN);
	ck_assert_msg(dt < 5000, "wait returned after %llu ms", (unsigned long long)dt);
	/* Pending and later operations fail with the abort status. */
	bool done = true;
	ck_assert_int_eq(ops->test(r, &done), KOLO_ESHUTDOWN);
	ck_assert(!done);
	struct kolo_req *r2 = NULL;
	assert_post_fails(p.b, ops->isend(p.ba, rb, 1, &r2), r2, KOLO_ESHUTDOWN);
	ck_assert_int_eq(ops->wait(p.b, 0), KOLO_ESHUTDOWN);
	/* abort is idempotent and keeps the first status. */
	ops->abort(p.b, KOLO_EPEER);
	ck_assert_int_eq(ops->wait(p.b, 0), KOLO_ESHUTDOWN);
	/* The other endpoint is unaffected. */
	ck_assert_int_eq(ops->wait(p.a, 0), KOLO_OK);
	tt_pair_close(&p);
}
END_TEST

/* close() resets the conn: the peer's pending receive and send fail with
 * KOLO_EPEER promptly. */
START_TEST(close_fails_peer)
{
	struct tt_pair p;
	tt_pair_open(&p, tr_of(_i), streams_of(_i), 20000);
	const struct kolo_transport_ops *ops = p.ops;
	size_t len = 32u << 20;
	uint8_t *rb = tt_alloc(len), *sb = tt_alloc(len);
	memset(sb, 1, len);
	struct kolo_req *reqs[2];
	ck_assert_int_eq(ops->irecv(p.ba, rb, len, &reqs[0]), KOLO_OK);
	ck_assert_int_eq(ops->isend(p.ba, sb, len, &reqs[1]), KOLO_OK);
	ops->close(p.ab);
	p.ab = NULL;
	struct kolo_transport *ts[] = {p.b};
	kolo_status_t sts[2] = {KOLO_OK, KOLO_OK};
	uint64_t t0 = kolo_now_ms();
	kolo_status_t st = tt_drive(ts, 1, reqs, sts, 2, 5000);
	uint64_t dt = kolo_now_ms() - t0;
	ck_assert_int_eq(st, KOLO_EPEER);
	ck_assert_int_eq(sts[0], KOLO_EPEER);
	ck_assert_int_eq(sts[1], KOLO_EPEER);
	ck_assert_msg(dt < 2000, "peer noticed the close after %llu ms", (unsigned long long)dt);
	ck_assert_ptr_nonnull(strstr(p.b->err.msg, "rank 0"));
	/* The conn stays failed. */
	struct kolo_req *r = NULL;
	assert_post_fails(p.b, ops->irecv(p.ba, rb, 1, &r), r, KOLO_EPEER);
	free(rb);
	free(sb);
	tt_pair_close(&p);
}
END_TEST

/* close() with requests still pending releases them. */
START_TEST(close_releases_pending)
{
	struct tt_pair p;
	tt_pair_open(&p, &tt_transports[_i], 2, 20000);
	const struct kolo_transport_ops *ops = p.ops;
	uint8_t rb[16];
	struct kolo_req *r = NULL;
	for (int k = 0; k < 10; k++)
		ck_assert_int_eq(ops->irecv(p.ab, rb, sizeof(rb), &r), KOLO_OK);
	ops->close(p.ab);
	p.ab = NULL;
	ops->close(NULL);
	ops->destroy(NULL);
	tt_pair_close(&p);
}
END_TEST

/* Three endpoints in a ring, set up as the ring module does (connect to
 * higher ranks, accept from lower ones), each driven by its own thread:
 * every rank sends to both neighbours and receives from both. */
enum { RING_N = 3 };

struct ring_rank {
	const struct kolo_transport_ops *ops;
	struct kolo_transport *t[RING_N];
	struct kolo_transport_handle h[RING_N];
	int rank, streams;
	kolo_status_t st;
	pthread_barrier_t *bar;
};

static void *ring_rank_main(void *arg)
{
	struct ring_rank *rr = arg;
	const struct kolo_transport_ops *ops = rr->ops;
	int r = rr->rank;
	struct kolo_transport *t = rr->t[r];
	int nb[2] = {(r + RING_N - 1) % RING_N, (r + 1) % RING_N};
	struct kolo_conn *conns[RING_N] = {0};
	rr->st = KOLO_OK;
	for (int i = 0; i < 2; i++)
		if (nb[i] > r &&
		    (rr->st = ops->connect(t, &rr->h[nb[i]], nb[i], 0, &conns[nb[i]])) != KOLO_OK)
			return NULL;
	uint64_t end = kolo_now_ms() + 10000;
	for (int i = 0; i < 2; i++) {
		while (nb[i] < r && !conns[nb[i]] && kolo_now_ms() < end) {
			if ((rr->st = ops->accept(t, nb[i], 0, &conns[nb[i]])) != KOLO_OK)
				return NULL;
			if (!conns[nb[i]])
				ops->wait(t, 1);
		}
		if (!conns[nb[i]]) {
			rr->st = KOLO_ETIMEDOUT;
			return NULL;
		}
	}
	size_t len = 3u << 20;
	for (size_t round = 0; round < 3; round++) {
		size_t n = round == 0 ? 0 : len / round;
		uint8_t *sb = tt_alloc(n), *rb[2] = {tt_alloc(n), tt_alloc(n)};
		tt_fill(sb, n, (uint32_t)r);
		struct kolo_req *reqs[4];
		for (int i = 0; i < 2; i++) {
			ops->irecv(conns[nb[i]], rb[i], n, &reqs[2 * i]);
			ops->isend(conns[nb[i]], sb, n, &reqs[2 * i + 1]);
		}
		rr->st = tt_drive(&t, 1, reqs, NULL, 4, 20000);
		for (int i = 0; i < 2 && rr->st == KOLO_OK; i++)
			if (tt_check(rb[i], n, (uint32_t)nb[i]) >= 0)
				rr->st = KOLO_EPROTO;
		free(sb);
		free(rb[0]);
		free(rb[1]);
		if (rr->st != KOLO_OK)
			break;
	}
	/* Nobody closes before everybody is done. */
	pthread_barrier_wait(rr->bar);
	for (int i = 0; i < RING_N; i++)
		ops->close(conns[i]);
	return NULL;
}

START_TEST(ring_of_three_threads)
{
	const struct kolo_transport_ops *ops = tr_of(_i)->ops;
	struct ring_rank rr[RING_N];
	pthread_barrier_t bar;
	pthread_barrier_init(&bar, NULL, RING_N);
	struct kolo_transport *t[RING_N];
	struct kolo_transport_handle h[RING_N];
	for (int r = 0; r < RING_N; r++) {
		struct kolo_transport_config cfg =
		        tt_config(tr_of(_i), r, RING_N, streams_of(_i), 20000);
		t[r] = tt_open(ops, &cfg, &h[r]);
	}
	pthread_t th[RING_N];
	for (int r = 0; r < RING_N; r++) {
		rr[r] = (struct ring_rank){.ops = ops, .rank = r, .bar = &bar};
		memcpy(rr[r].t, t, sizeof(t));
		memcpy(rr[r].h, h, sizeof(h));
		ck_assert_int_eq(pthread_create(&th[r], NULL, ring_rank_main, &rr[r]), 0);
	}
	for (int r = 0; r < RING_N; r++)
		pthread_join(th[r], NULL);
	for (int r = 0; r < RING_N; r++) {
		ck_assert_msg(rr[r].st == KOLO_OK, "rank %d: %s: %s", r, kolo_status_name(rr[r].st),
		              t[r]->err.msg);
		ops->destroy(t[r]);
	}
	pthread_barrier_destroy(&bar);
}
END_TEST

/* A connector whose first send completed may stop driving its endpoint (it
 * went on to compute): the acceptor must still get the whole conn. */
START_TEST(accept_after_sender_stops)
{
	const struct kolo_transport_ops *ops = tr_of(_i)->ops;
	struct kolo_transport_config ca = tt_config(tr_of(_i), 0, 2, streams_of(_i), 10000);
	struct kolo_transport_config cb = tt_config(tr_of(_i), 1, 2, streams_of(_i), 10000);
	struct kolo_transport_handle ha, hb;
	struct kolo_transport *a = tt_open(ops, &ca, &ha);
	struct kolo_transport *b = tt_open(ops, &cb, &hb);
	struct kolo_conn *ab = NULL;
	ck_assert_int_eq(ops->connect(a, &hb, 1, 3, &ab), KOLO_OK);
	uint8_t msg[100], got[100];
	tt_fill(msg, sizeof(msg), 5);
	struct kolo_req *r = NULL;
	ck_assert_int_eq(ops->isend(ab, msg, sizeof(msg), &r), KOLO_OK);
	/* Both sides drive until the send is done; then only b runs. */
	struct kolo_transport *ts[] = {a, b};
	ck_assert_int_eq(tt_drive(ts, 2, &r, NULL, 1, 5000), KOLO_OK);
	struct kolo_conn *ba = tt_accept(b, 0, 3, &b, 1, 3000);
	ck_assert_msg(ba != NULL, "the conn is incomplete once the sender stopped driving");
	ck_assert_int_eq(ops->irecv(ba, got, sizeof(got), &r), KOLO_OK);
	ck_assert_int_eq(tt_drive(&b, 1, &r, NULL, 1, 5000), KOLO_OK);
	ck_assert(tt_check(got, sizeof(got), 5) < 0);
	ops->close(ab);
	ops->close(ba);
	ops->destroy(a);
	ops->destroy(b);
}
END_TEST

/* Fixed socket buffers (cfg.socket_buffer > 0) change nothing visible. */
START_TEST(fixed_socket_buffers)
{
	const struct kolo_transport_ops *ops = tr_of(_i)->ops;
	struct kolo_transport_config ca = tt_config(tr_of(_i), 0, 2, streams_of(_i), 20000);
	struct kolo_transport_config cb = tt_config(tr_of(_i), 1, 2, streams_of(_i), 20000);
	ca.socket_buffer = cb.socket_buffer = 256 << 10;
	struct kolo_transport_handle ha, hb;
	struct kolo_transport *a = tt_open(ops, &ca, &ha);
	struct kolo_transport *b = tt_open(ops, &cb, &hb);
	struct kolo_conn *ab = NULL;
	ck_assert_int_eq(ops->connect(a, &hb, 1, 7, &ab), KOLO_OK);
	struct kolo_transport *ts[] = {a, b};
	struct kolo_conn *ba = tt_accept(b, 0, 7, ts, 2, 5000);
	ck_assert_ptr_nonnull(ba);
	exchange(ts, ab, ba, 8u << 20, 11);
	exchange(ts, ab, ba, 0, 12);
	ops->close(ab);
	ops->close(ba);
	ops->destroy(a);
	ops->destroy(b);
}
END_TEST

/* The hybrid only: a pair on one host sets shared memory up beside TCP (so
 * its poll_fd() is -1, hybrid.h), a pair on two does not; either way the
 * handle carries the TCP handle that re-forming reads back. */
START_TEST(hybrid_routes_by_host)
{
	const struct tt_transport *tr = &tt_transports[_i];
	if (tr->ops != &kolo_transport_hybrid_ops)
		return;
	struct tt_pair p;
	tt_pair_open(&p, tr, 1, 10000);
	bool shared = tr->same_host[0][1];
	ck_assert_int_eq(p.ops->poll_fd(p.a) < 0, shared);
	ck_assert_int_eq(p.ops->poll_fd(p.b) < 0, shared);
	struct kolo_transport_handle net;
	struct sockaddr_storage ss;
	socklen_t len;
	ck_assert_int_eq(kolo_hybrid_net_handle(&p.ha, &net), KOLO_OK);
	ck_assert_int_eq(kolo_tcp_handle_decode(&net, &ss, &len), KOLO_OK);
	ck_assert_int_eq(kolo_hybrid_net_handle(&net, &net), KOLO_EINVAL);
	struct kolo_transport *ts[] = {p.a, p.b};
	exchange(ts, p.ab, p.ba, 100000, 9);
	tt_pair_close(&p);
}
END_TEST

static Suite *conformance_suite(void)
{
	Suite *s = suite_create("transport_conformance");
	TCase *tc = tcase_create("conformance");
	tcase_set_timeout(tc, 240);
	int n = tt_ntransports;
	combos_init();
	tcase_add_loop_test(tc, connect_accept_both_directions, 0, n);
	tcase_add_loop_test(tc, ordered_sizes, 0, ncombos);
	tcase_add_loop_test(tc, many_outstanding, 0, ncombos);
	tcase_add_loop_test(tc, irecv_after_arrival, 0, ncombos);
	tcase_add_loop_test(tc, zero_length_synchronises, 0, ncombos);
	tcase_add_loop_test(tc, length_mismatch, 0, ncombos);
	tcase_add_loop_test(tc, abort_wakes_wait, 0, n);
	tcase_add_loop_test(tc, close_fails_peer, 0, ncombos);
	tcase_add_loop_test(tc, close_releases_pending, 0, n);
	tcase_add_loop_test(tc, ring_of_three_threads, 0, ncombos);
	tcase_add_loop_test(tc, accept_after_sender_stops, 0, ncombos);
	tcase_add_loop_test(tc, fixed_socket_buffers, 0, ncombos);
	tcase_add_loop_test(tc, hybrid_routes_by_host, 0, n);
	suite_add_tcase(s, tc);
	return s;
}

KOLO_CHECK_MAIN(conformance_suite)
