/* Helpers of the transport tests. */
#include "tt_util.h"

#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "hybrid.h"
#include "transport_shm.h"
#include "transport_tcp.h"
#include "transport_verbs.h"

/* Hybrid layouts, every rank on 127.0.0.1 all the same. Hosts {0, 0, 1, 1}:
 * a pair (ranks 0 and 1) talks through shared memory; a ring of three
 * mixes both. */
static const bool pairs_share[TT_MAX_RANKS][TT_MAX_RANKS] = {
        {1, 1, 0, 0},
        {1, 1, 0, 0},
        {0, 0, 1, 1},
        {0, 0, 1, 1},
};
#if !defined(__SANITIZE_THREAD__) /* the layout runs in the other builds only (below) */
/* Hosts {0, 1, 1, 2}: a pair talks through TCP, while rank 1 has shared
 * memory set up too (for rank 2); a ring of three mixes both. */
static const bool rank0_alone[TT_MAX_RANKS][TT_MAX_RANKS] = {
        {1, 0, 0, 0},
        {0, 1, 1, 0},
        {0, 1, 1, 0},
        {0, 0, 0, 1},
};
#endif

/* The verbs emulation with completions of different QPs shuffled, so the
 * protocol never leans on an order RC does not promise. */
static const struct kolo_verbs_emu_opts verbs_ib = {.roce = false, .reorder = true};

const struct tt_transport tt_transports[] = {
        {"tcp", &kolo_transport_tcp_ops, true, NULL, NULL, NULL},
        {"shm", &kolo_transport_shm_ops, true, NULL, NULL, NULL},
        {"hybrid, pairs on one host", &kolo_transport_hybrid_ops, true, pairs_share, NULL, NULL},
        {"verbs (emulated InfiniBand)", &kolo_transport_verbs_ops, true, NULL, &verbs_ib, NULL},
#if !defined(__SANITIZE_THREAD__)
        /* One layout of the hybrid is enough for ThreadSanitizer (the hybrid adds no
         * thread of its own), which runs the suite ten times slower. */
        {"hybrid, rank 0 alone", &kolo_transport_hybrid_ops, true, rank0_alone, NULL, NULL},
#endif
};
const int tt_ntransports = (int)KOLO_ARRAY_SIZE(tt_transports);

struct kolo_transport_config tt_config(const struct tt_transport *tr, int rank, int size,
                                       int streams, int timeout_ms)
{
	static const char token[] = TT_TOKEN;
	const bool *same_host = NULL;
	/* KOLO_TT_VERBS_DEVICE (scripts/verbs-check.sh) runs the verbs entries
	 * on that RDMA device, loopback through one HCA, instead of the
	 * emulation; tests that need the emulation's hooks skip then. */
	const char *hw = getenv("KOLO_TT_VERBS_DEVICE");
	if (tr && tr->verbs_emu && !(hw && hw[0]))
		kolo_verbs_emu_enable(tr->verbs_emu);
	if (tr && tr->same_host) {
		ck_assert_int_le(size, TT_MAX_RANKS);
		same_host = tr->same_host[rank];
	}
	return (struct kolo_transport_config){
	        .job = TT_JOB,
	        .round = TT_ROUND,
	        .rank = rank,
	        .size = size,
	        .token = (const uint8_t *)token,
	        .token_len = sizeof(token) - 1,
	        .timeout_ms = timeout_ms,
	        .streams = streams,
	        .iface = "127.0.0.1",
	        .route_to = NULL,
	        .socket_buffer = 0,
	        .spin_us = 0,
	        .same_host = same_host,
	        .net = tr ? tr->net : NULL,
	        .ib_device = hw && hw[0] ? hw : NULL,
	        .ib_gid_index = -1,
	        /* Small slots and few of them: segments, credit stalls and the
	         * in-place path all happen at the suites' sizes. */
	        .verbs_slots = 8,
	        .verbs_slot_bytes = 16384,
	        .verbs_rdv_bytes = 65536,
	        .verbs_mr_cache = 4,
	};
}

struct kolo_transport *tt_open(const struct kolo_transport_ops *ops,
                               const struct kolo_transport_config *cfg,
                               struct kolo_transport_handle *h)
{
	struct kolo_transport *t = NULL;
	ck_assert_int_eq(ops->create(cfg, &t, NULL), KOLO_OK);
	ck_assert_ptr_nonnull(t);
	ck_assert_int_eq(ops->listen(t, h), KOLO_OK);
	return t;
}

struct kolo_conn *tt_accept(struct kolo_transport *t, int peer, int tag, struct kolo_transport **ts,
                            int nt, int timeout_ms)
{
	uint64_t end = kolo_now_ms() + (uint64_t)timeout_ms;
	for (;;) {
		struct kolo_conn *c = NULL;
		ck_assert_int_eq(t->ops->accept(t, peer, tag, &c), KOLO_OK);
		if (c)
			return c;
		if (kolo_now_ms() >= end)
			return NULL;
		for (int i = 0; i < nt; i++)
			ts[i]->ops->wait(ts[i], 1);
	}
}

void tt_pair_open(struct tt_pair *p, const struct tt_transport *tr, int streams, int timeout_ms)
{
	const struct kolo_transport_ops *ops = tr->ops;
	memset(p, 0, sizeof(*p));
	p->ops = ops;
	struct kolo_transport_config ca = tt_config(tr, 0, 2, streams, timeout_ms);
	struct kolo_transport_config cb = tt_config(tr, 1, 2, streams, timeout_ms);
	p->a = tt_open(ops, &ca, &p->ha);
	p->b = tt_open(ops, &cb, &p->hb);
	ck_assert_int_eq(ops->connect(p->a, &p->hb, 1, 7, &p->ab), KOLO_OK);
	ck_assert_ptr_nonnull(p->ab);
	struct kolo_transport *ts[] = {p->a, p->b};
	p->ba = tt_accept(p->b, 0, 7, ts, 2, 5000);
	ck_assert_msg(p->ba != NULL, "accept timed out");
	ck_assert_int_eq(p->ba->peer_rank, 0);
	ck_assert_int_eq(p->ba->tag, 7);
	ck_assert_int_eq(p->ab->peer_rank, 1);
}

void tt_pair_close(struct tt_pair *p)
{
	p->ops->close(p->ab);
	p->ops->close(p->ba);
	p->ops->destroy(p->a);
	p->ops->destroy(p->b);
	memset(p, 0, sizeof(*p));
}

kolo_status_t tt_drive(struct kolo_transport **ts, int nt, struct kolo_req **reqs,
                       kolo_status_t *sts, int n, int timeout_ms)
{
	uint64_t end = kolo_now_ms() + (uint64_t)timeout_ms;
	kolo_status_t first = KOLO_OK;
	for (;;) {
		int left = 0;
		bool moved = false;
		for (int i = 0; i < n; i++) {
			if (!reqs[i])
				continue;
			bool done = false;
			kolo_status_t st = ts[0]->ops->test(reqs[i], &done);
			if (st != KOLO_OK || done) {
				reqs[i] = NULL;
				if (sts)
					sts[i] = st;
				if (st != KOLO_OK && first == KOLO_OK)
					first = st;
				moved = true;
				continue;
			}
			left++;
		}
		if (!left)
			return first;
		if (kolo_now_ms() >= end)
			return first != KOLO_OK ? first : KOLO_ETIMEDOUT;
		if (!moved)
			for (int i = 0; i < nt; i++)
				ts[i]->ops->wait(ts[i], 1);
	}
}

static uint8_t pattern(size_t i, uint32_t seed)
{
	uint64_t x = (uint64_t)i * 0x9e3779b97f4a7c15ull + seed * 0x632be59bd9b4e019ull;
	return (uint8_t)(x >> 56 ^ x >> 29 ^ i);
}

void tt_fill(void *buf, size_t len, uint32_t seed)
{
	uint8_t *p = buf;
	for (size_t i = 0; i < len; i++)
		p[i] = pattern(i, seed);
}

long long tt_check(const void *buf, size_t len, uint32_t seed)
{
	const uint8_t *p = buf;
	for (size_t i = 0; i < len; i++)
		if (p[i] != pattern(i, seed))
			return (long long)i;
	return -1;
}

void *tt_alloc(size_t len)
{
	void *p = malloc(len ? len : 1);
	ck_assert_ptr_nonnull(p);
	return p;
}
