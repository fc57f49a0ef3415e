/* Hierarchical allreduce over two sub-comms of the same transport, and the
 * α–β cost model that chooses between it, the flat ring and the
 * small-message algorithm. docs/hierarchical.md describes both.
 *
 * With L ranks on each of H hosts (rank = host * L + local rank):
 *   1. reduce-scatter inside the host over the local comm (L members, shared
 *      memory): local rank l ends with block l of the host's sum;
 *   2. allreduce of block l across hosts over the cross comm (the H ranks
 *      whose local rank is l, network): L such rings run at once, one per
 *      local rank, each carrying 1/L of the data;
 *   3. allgather inside the host over the local comm.
 * Large allreduces run these stages chunk by chunk, overlapped
 * (hier_pipeline.c): the network carries chunk k while shared memory
 * finishes chunk k - 1 and starts chunk k + 1.
 * Every reduction happens in a fixed order that does not depend on the rank
 * that computes it, and each block's final value is computed once per cross
 * comm by a deterministic collective, so every rank ends with identical bits. */
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ring_internal.h"

#define SUBSYS            "ring"
#define PROBE_SMALL_ITERS 20
#define PROBE_BIG_ITERS   2
#define PROBE_BIG_BYTES   (1u << 20)

struct kolo_ring_hier {
	struct kolo_ring_comm *parent; /* the flat comm of every rank; not owned */
	struct kolo_ring_comm *local;  /* the ranks of this host */
	struct kolo_ring_comm *cross;  /* the ranks with this local rank */
	struct kolo_ring_hier_config cfg;
	int L, H;
	size_t *counts; /* L entries: the block of each local rank */
	atomic_int failed_peer;
	struct kolo_errbuf err;
};

/* ---- the cost model --------------------------------------------------- */

static double xfer(double bytes, const struct kolo_ring_link_cost *c)
{
	double g = c->gbytes_per_s > 0 ? c->gbytes_per_s : 1e-3;
	return c->alpha_us + bytes / (g * 1e3);
}

static int ceil_log2(int n)
{
	int k = 0;
	while ((1 << k) < n)
		k++;
	return k;
}

static bool is_pow2(int n)
{
	return n > 0 && (n & (n - 1)) == 0;
}

/* Recursive doubling over n ranks, of which groups of `flows` share one link
 * when a round crosses it; `first_local` rounds stay inside a host. */
static double rd_cost(double S, int n, int first_local, int flows,
                      const struct kolo_ring_link_cost *shm, const struct kolo_ring_link_cost *net)
{
	if (n <= 1)
		return 0;
	int pof2 = 1;
	while (pof2 * 2 <= n)
		pof2 *= 2;
	int rounds = ceil_log2(pof2);
	double t = 0;
	for (int k = 0; k < rounds; k++)
		t += k < first_local ? xfer(S, shm) : xfer(S * flows, net);
	if (pof2 < n) /* the fold in and the result back out */
		t += 2 * (first_local > 0 ? xfer(S, shm) : xfer(S, net));
	return t;
}

/* Pipelined ring over n ranks whose slowest hop is `link`, shared by
 * `flows` rings at once. */
static double ring_cost(double S, int n, int flows, const struct kolo_ring_link_cost *link)
{
	if (n <= 1)
		return 0;
	return 2.0 * (n - 1) * xfer(S / n * flows, link);
}

/* The hierarchy in K ≥ 2 pipelined chunks of c = S / K (hier_pipeline.c):
 * a = one chunk's reduce-scatter (or allgather) inside the host, b = its
 * cross allreduce. The local comm runs RS(0), then, while the network
 * allreduces chunk k, AG(k - 1) and RS(k + 1); the next cross allreduce
 * starts when both are done, and AG(K - 1) ends it. */
static double hier_pipelined(double S, int L, int H, size_t K,
                             const struct kolo_ring_link_cost *shm,
                             const struct kolo_ring_link_cost *net)
{
	const double c = S / (double)K, x = c / L;
	const double a = L > 1 ? (L - 1) * xfer(x, shm) : 0, b = ring_cost(x, H, L, net);
	return 2 * a + 2 * KOLO_MAX(b, a) + (double)(K - 2) * KOLO_MAX(b, 2 * a);
}

double kolo_ring_cost_model(enum kolo_ring_algo algo, size_t bytes, int local, int cross,
                            size_t chunks, const struct kolo_ring_link_cost *shm,
                            const struct kolo_ring_link_cost *net)
{
	const double S = (double)bytes;
	const int L = KOLO_MAX(local, 1), H = KOLO_MAX(cross, 1), n = L * H;
	/* The first lg L rounds of recursive doubling pair ranks of one host
	 * when L is a power of two (ranks are contiguous per host). */
	const int rd_local = H == 1 ? ceil_log2(n) : (is_pow2(L) ? ceil_log2(L) : 0);
	switch (algo) {
	case KOLO_RING_ALGO_SMALL:
		return rd_cost(S, n, rd_local, L, shm, net);
	case KOLO_RING_ALGO_RING:
		/* One flow per host link and direction: ring neighbours on other
		 * hosts are only the first and last rank of each host. */
		return ring_cost(S, n, 1, H > 1 ? net : shm);
	case KOLO_RING_ALGO_HIER: {
		if (chunks >= 2)
			return hier_pipelined(S, L, H, chunks, shm, net);
		/* Reduce-scatter and allgather inside the host, then L cross
		 * allreduces of S / L at once over the host's link. */
		double x = S / L, t = L > 1 ? 2.0 * (L - 1) * xfer(x, shm) : 0;
		double c_ring = ring_cost(x, H, L, net), c_rd = rd_cost(x, H, 0, L, shm, net);
		return t + KOLO_MIN(c_ring, c_rd);
	}
	}
	return INFINITY;
}

size_t kolo_ring_hier_chunks(size_t bytes, size_t pipeline_bytes)
{
	if (pipeline_bytes > 0)
		return KOLO_MAX(bytes / pipeline_bytes, 1);
	/* More chunks only shorten the fill and drain (one chunk's local
	 * stages), already small at 32, and add latencies. */
	size_t K = bytes / KOLO_RING_HIER_PIPELINE_BYTES;
	return KOLO_MAX(KOLO_MIN(K, (size_t)KOLO_RING_HIER_PIPELINE_MAX), 1);
}

/* The chunks this hierarchy runs an allreduce of `bytes` in. A configured
 * chunk is used as given; the default one only where the model predicts
 * the pipeline to pay (not with one rank per host, whose hierarchy has no
 * stage to overlap, nor where K times the latencies outweigh the overlap).
 * The same on every rank: configuration and costs are. */
static size_t hier_chunks(const struct kolo_ring_hier *h, size_t bytes)
{
	/* A zone level under the cross comm (docs/hierarchical.md, "Zones") cuts
	 * the bytes between zones, which the pipeline's flat cross stage cannot:
	 * where it takes the cross block, the stages run one after another. */
	const struct kolo_ring_hier *zone = h->cross->hier;
	if (zone && ring_hier_choose(zone, bytes / (size_t)h->L) == KOLO_RING_ALGO_HIER)
		return 1;
	size_t K = kolo_ring_hier_chunks(bytes, h->cfg.pipeline_bytes);
	if (K < 2 || h->cfg.pipeline_bytes > 0)
		return K;
	double piped = kolo_ring_cost_model(KOLO_RING_ALGO_HIER, bytes, h->L, h->H, K, &h->cfg.shm,
	                                    &h->cfg.net);
	double seq = kolo_ring_cost_model(KOLO_RING_ALGO_HIER, bytes, h->L, h->H, 1, &h->cfg.shm,
	                                  &h->cfg.net);
	return piped < seq ? K : 1;
}

/* The largest power of two ≤ 1 GiB for which recursive doubling is
 * predicted no slower than the ring; 0 when it never is. */
static size_t small_crossover(int local, int cross, bool hier_cross,
                              const struct kolo_ring_link_cost *shm,
                              const struct kolo_ring_link_cost *net)
{
	size_t best = 0;
	for (size_t b = 8; b <= ((size_t)1 << 30); b *= 2) {
		double rd, ring;
		if (hier_cross) { /* the cross comm of a hierarchy: L rings share the link */
			rd = rd_cost((double)b, cross, 0, local, shm, net);
			ring = ring_cost((double)b, cross, local, net);
		} else {
			rd = kolo_ring_cost_model(KOLO_RING_ALGO_SMALL, b, local, cross, 1, shm,
			                          net);
			ring = kolo_ring_cost_model(KOLO_RING_ALGO_RING, b, local, cross, 1, shm,
			                            net);
		}
		if (rd <= ring)
			best = b;
	}
	return best;
}

/* With shared_link, every byte either algorithm moves also passes each
 * member's own link (cost `shm`): the ring's 2(n-1)/n S, the hierarchy's
 * 2(L-1)/L S inside the level and 2(H-1)/H S/L across it. That time bounds
 * each algorithm below, however its stages overlap. */
static double shared_link_floor(const struct kolo_ring_hier *h, enum kolo_ring_algo algo,
                                size_t bytes)
{
	const double S = (double)bytes, L = h->L, H = h->H;
	if (!h->cfg.shared_link || algo == KOLO_RING_ALGO_SMALL)
		return 0;
	if (algo == KOLO_RING_ALGO_RING)
		return ring_cost(S, h->L * h->H, 1, &h->cfg.shm);
	return 2 * (L - 1) * h->cfg.shm.alpha_us + 2 * (H - 1) * h->cfg.shm.alpha_us +
	       (2 * (L - 1) / L * S + 2 * (H - 1) / H * S / L) /
	               (KOLO_MAX(h->cfg.shm.gbytes_per_s, 1e-3) * 1e3);
}

enum kolo_ring_algo ring_hier_choose(const struct kolo_ring_hier *h, size_t bytes)
{
	if (h->cfg.mode == KOLO_RING_HIER_ON)
		return KOLO_RING_ALGO_HIER;
	const struct kolo_ring_config *pc = kolo_ring_comm_config(h->parent);
	if (!h->cfg.small_model && bytes <= pc->small_allreduce_bytes)
		return KOLO_RING_ALGO_SMALL;
	/* Where a zone level under the cross comm takes the cross block, the
	 * links between zones are what counts, and this level's model does not
	 * see them: the flat ring would cross them most, 2(n-1)/n S each way. */
	const struct kolo_ring_hier *zone = h->cross->hier;
	if (zone && ring_hier_choose(zone, bytes / (size_t)h->L) == KOLO_RING_ALGO_HIER)
		return KOLO_RING_ALGO_HIER;
	double best = INFINITY;
	enum kolo_ring_algo algo = KOLO_RING_ALGO_RING;
	for (int a = KOLO_RING_ALGO_RING; a <= KOLO_RING_ALGO_HIER; a++) {
		if (a == KOLO_RING_ALGO_SMALL && !h->cfg.small_model)
			continue;
		if (a == KOLO_RING_ALGO_HIER && h->cfg.mode == KOLO_RING_HIER_OFF)
			continue;
		double t = kolo_ring_cost_model((enum kolo_ring_algo)a, bytes, h->L, h->H,
		                                hier_chunks(h, bytes), &h->cfg.shm, &h->cfg.net);
		t = KOLO_MAX(t, shared_link_floor(h, (enum kolo_ring_algo)a, bytes));
		if (t < best) {
			best = t;
			algo = (enum kolo_ring_algo)a;
		}
	}
	return algo;
}

/* ---- the allreduce ---------------------------------------------------- */

static kolo_status_t sub_fail(struct kolo_ring_hier *h, struct kolo_ring_comm *sub,
                              kolo_status_t st)
{
	int none = -1;
	atomic_compare_exchange_strong(&h->failed_peer, &none, kolo_ring_failed_peer(sub));
	snprintf(h->err.msg, sizeof(h->err.msg), "hierarchical: %s", kolo_ring_last_error(sub));
	/* The other sub-comm's peers may wait on us: reset its conns too. */
	ring_hier_fail(h, st);
	return st;
}

kolo_status_t ring_hier_allreduce(struct kolo_ring_hier *h, const void *sendbuf, void *recvbuf,
                                  size_t count, kolo_dtype_t dtype, kolo_op_t op, double prescale,
                                  double postscale)
{
	const int L = h->L, l = kolo_ring_comm_rank(h->local);
	const size_t es = kolo_dtype_size(dtype);
	const size_t K = hier_chunks(h, count * es);
	if (K >= 2) {
		struct kolo_ring_comm *failed = h->local;
		kolo_status_t st = ring_hier_pipeline(h->local, h->cross, sendbuf, recvbuf, count,
		                                      dtype, op, prescale, postscale, K, &failed);
		return st == KOLO_OK ? KOLO_OK : sub_fail(h, failed, st);
	}
	size_t off = 0;
	for (int i = 0; i < L; i++) {
		h->counts[i] = kolo_reducescatter_count(count, L, i);
		if (i < l)
			off += h->counts[i];
	}
	char *blk = (char *)recvbuf + off * es;
	kolo_status_t st = kolo_ring_reducescatter(h->local, sendbuf, blk, h->counts, dtype, op,
	                                           prescale, 1.0);
	if (st != KOLO_OK)
		return sub_fail(h, h->local, st);
	st = kolo_ring_allreduce(h->cross, blk, blk, h->counts[l], dtype, op, 1.0, postscale);
	if (st != KOLO_OK)
		return sub_fail(h, h->cross, st);
	st = kolo_ring_allgatherv(h->local, blk, recvbuf, h->counts, dtype);
	if (st != KOLO_OK)
		return sub_fail(h, h->local, st);
	return KOLO_OK;
}

size_t kolo_ring_allreduce_chunks(const struct kolo_ring_comm *rc, size_t bytes)
{
	if (!rc->hier || ring_hier_choose(rc->hier, bytes) != KOLO_RING_ALGO_HIER)
		return 0;
	return hier_chunks(rc->hier, bytes);
}

const char *ring_hier_last_error(const struct kolo_ring_hier *h)
{
	return h ? h->err.msg : "";
}

int ring_hier_failed_peer(const struct kolo_ring_hier *h)
{
	return h ? atomic_load(&h->failed_peer) : -1;
}

void ring_hier_fail(struct kolo_ring_hier *h, kolo_status_t st)
{
	if (!h)
		return;
	const char *why = h->err.msg[0] ? h->err.msg : "another comm of this rank failed";
	if (kolo_ring_comm_status(h->local) == KOLO_OK)
		kolo_ring_comm_fail(h->local, st, -1, why);
	if (kolo_ring_comm_status(h->cross) == KOLO_OK)
		kolo_ring_comm_fail(h->cross, st, -1, why);
}

void ring_hier_abort(struct kolo_ring_hier *h, kolo_status_t st)
{
	if (!h)
		return;
	kolo_ring_abort(h->local, st);
	kolo_ring_abort(h->cross, st);
}

void ring_hier_destroy(struct kolo_ring_hier *h)
{
	if (!h)
		return;
	kolo_ring_comm_destroy(h->local);
	kolo_ring_comm_destroy(h->cross);
	free(h->counts);
	free(h);
}

/* ---- set-up and the probe --------------------------------------------- */

/* Mean µs of one allreduce of `bytes` on rc (thresholds forced by small). */
static kolo_status_t time_allreduce(struct kolo_ring_comm *rc, char *buf, size_t bytes, bool small,
                                    int iters, double *us)
{
	const struct kolo_ring_config *c = kolo_ring_comm_config(rc);
	size_t keep = c->small_allreduce_bytes;
	kolo_ring_comm_tune(rc, small ? SIZE_MAX : 0, 0);
	size_t count = bytes / sizeof(float);
	kolo_status_t st = kolo_ring_allreduce(rc, buf, buf, count, KOLO_FLOAT32, KOLO_MAX, 1, 1);
	uint64_t t0 = kolo_now_ns();
	for (int i = 0; i < iters && st == KOLO_OK; i++)
		st = kolo_ring_allreduce(rc, buf, buf, count, KOLO_FLOAT32, KOLO_MAX, 1, 1);
	*us = (double)(kolo_now_ns() - t0) / 1e3 / iters;
	kolo_ring_comm_tune(rc, keep, 0);
	return st;
}

/* α from small recursive-doubling allreduces, β from ring allreduces of
 * PROBE_BIG_BYTES; `flows` rings share the link (the cross comms). */
static kolo_status_t probe_link(struct kolo_ring_comm *rc, char *buf, int flows,
                                struct kolo_ring_link_cost *out)
{
	const int n = kolo_ring_comm_size(rc);
	double t_small, t_big;
	KOLO_CHECK(time_allreduce(rc, buf, 8, true, PROBE_SMALL_ITERS, &t_small));
	KOLO_CHECK(time_allreduce(rc, buf, PROBE_BIG_BYTES, false, PROBE_BIG_ITERS, &t_big));
	int pof2 = 1;
	while (pof2 * 2 <= n)
		pof2 *= 2;
	int rounds = ceil_log2(pof2) + (pof2 < n ? 2 : 0);
	out->alpha_us = KOLO_MAX(t_small / rounds, 0.1);
	double per_step = t_big / (2.0 * (n - 1)) - out->alpha_us;
	double bytes = (double)PROBE_BIG_BYTES / n * flows;
	out->gbytes_per_s = bytes / (KOLO_MAX(per_step, 0.01) * 1e3);
	return KOLO_OK;
}

/* Every rank must decide alike: the costs become the maximum over ranks of
 * α and of 1/bandwidth. */
static kolo_status_t probe(struct kolo_ring_hier *h, struct kolo_ring_comm *rc)
{
	char *buf = calloc(1, PROBE_BIG_BYTES);
	if (!buf)
		return KOLO_ENOMEM;
	struct kolo_ring_link_cost shm = h->cfg.shm, net = h->cfg.net;
	kolo_status_t st = probe_link(h->local, buf, 1, &shm);
	if (st == KOLO_OK)
		st = probe_link(h->cross, buf, h->L, &net);
	double v[4] = {shm.alpha_us, 1.0 / shm.gbytes_per_s, net.alpha_us, 1.0 / net.gbytes_per_s};
	if (st == KOLO_OK)
		st = kolo_ring_allreduce(rc, v, v, 4, KOLO_FLOAT64, KOLO_MAX, 1, 1);
	free(buf);
	if (st != KOLO_OK)
		return st;
	h->cfg.shm = (struct kolo_ring_link_cost){v[0], 1.0 / v[1]};
	h->cfg.net = (struct kolo_ring_link_cost){v[2], 1.0 / v[3]};
	return KOLO_OK;
}

/* A sub-comm of rc over its members ranks[0..size) (rc's own numbering,
 * mapped here to the transport's: rc may itself be a sub-comm, as the cross
 * comm under a zone level is). */
static kolo_status_t sub_create(struct kolo_ring_comm *rc, int *ranks, int size, int index,
                                int tag_off, struct kolo_ring_comm **out, struct kolo_errbuf *eb)
{
	for (int i = 0; i < size; i++)
		ranks[i] = ring_global_rank(rc, ranks[i]);
	struct kolo_ring_config c = *kolo_ring_comm_config(rc);
	c.rank = index;
	c.size = size;
	c.ranks = ranks;
	c.tag_base += tag_off;
	return kolo_ring_comm_create(&c, out, eb);
}

kolo_status_t kolo_ring_hier_enable(struct kolo_ring_comm *rc,
                                    const struct kolo_ring_hier_config *hc, struct kolo_errbuf *eb)
{
	const int L = hc->local_size, H = hc->cross_size, n = kolo_ring_comm_size(rc);
	if (L < 1 || H < 1 || L * H != n || n < 2)
		return kolo_fail(eb, KOLO_EINVAL, "hierarchical: %d x %d ranks for a comm of %d", H,
		                 L, n);
	const int r = kolo_ring_comm_rank(rc);
	struct kolo_ring_hier *h = calloc(1, sizeof(*h));
	int *ranks = calloc((size_t)KOLO_MAX(L, H), sizeof(int));
	kolo_status_t st = KOLO_ENOMEM;
	if (!h || !ranks || !(h->counts = calloc((size_t)L, sizeof(size_t)))) {
		kolo_fail(eb, st, "hierarchical: out of memory");
		goto fail;
	}
	h->parent = rc;
	h->cfg = *hc;
	h->L = L;
	h->H = H;
	atomic_init(&h->failed_peer, -1);
	const int host = r / L, lr = r % L;
	for (int i = 0; i < L; i++)
		ranks[i] = host * L + i;
	if ((st = sub_create(rc, ranks, L, lr, 1, &h->local, eb)) != KOLO_OK)
		goto fail;
	for (int i = 0; i < H; i++)
		ranks[i] = i * L + lr;
	if ((st = sub_create(rc, ranks, H, host, 2, &h->cross, eb)) != KOLO_OK)
		goto fail;
	if (hc->probe && (st = probe(h, rc)) != KOLO_OK) {
		const char *why = kolo_ring_comm_status(h->local) != KOLO_OK
		                          ? kolo_ring_last_error(h->local)
		                  : kolo_ring_comm_status(h->cross) != KOLO_OK
		                          ? kolo_ring_last_error(h->cross)
		                          : kolo_ring_last_error(rc);
		kolo_fail(eb, st, "hierarchical: measuring the links: %s", why);
		goto fail;
	}
	if (hc->local_segment_bytes > 0)
		kolo_ring_comm_tune(h->local,
		                    kolo_ring_comm_config(h->local)->small_allreduce_bytes,
		                    hc->local_segment_bytes);
	if (hc->small_model) {
		kolo_ring_comm_tune(rc, small_crossover(L, H, false, &h->cfg.shm, &h->cfg.net), 0);
		kolo_ring_comm_tune(h->cross, small_crossover(L, H, true, &h->cfg.shm, &h->cfg.net),
		                    0);
	}
	free(ranks);
	KOLO_DEBUG(SUBSYS,
	           "hierarchical allreduce: %d hosts x %d ranks, mode %d; shm %.1f us %.2f GB/s, "
	           "net %.1f us %.3f GB/s",
	           H, L, (int)hc->mode, h->cfg.shm.alpha_us, h->cfg.shm.gbytes_per_s,
	           h->cfg.net.alpha_us, h->cfg.net.gbytes_per_s);
	ring_set_hier(rc, h);
	return KOLO_OK;
fail:
	free(ranks);
	ring_hier_destroy(h);
	return st;
}

bool ring_hier_costs_of(const struct kolo_ring_hier *h, struct kolo_ring_link_cost *shm,
                        struct kolo_ring_link_cost *net)
{
	if (!h)
		return false;
	*shm = h->cfg.shm;
	*net = h->cfg.net;
	return true;
}

struct kolo_ring_comm *kolo_ring_hier_sub(const struct kolo_ring_comm *rc, bool cross)
{
	if (!rc->hier)
		return NULL;
	return cross ? rc->hier->cross : rc->hier->local;
}
