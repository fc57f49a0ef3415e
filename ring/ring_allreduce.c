/* Allreduce: recursive doubling for small messages (latency-optimal), the
 * pipelined ring (reduce-scatter then allgather) for large ones, or the
 * hierarchical allreduce of hier.c when one is attached and the cost model
 * picks it (kolo_ring_allreduce_algo). */
#include <stdlib.h>
#include <string.h>

#include "ring_internal.h"

/* The layout (ring_internal.h, struct ring_rd): this rank's newrank, and in
 * peers[0..*np) every member it exchanges with, connected. */
static kolo_status_t ring_rd_layout(struct kolo_ring_comm *rc, int *pof2, int *rem, int *newrank,
                                    int *peers, int *np)
{
	const int n = rc->size, r = rc->rank;
	int p = 1;
	while (p * 2 <= n)
		p *= 2;
	const int e = n - p;
	*pof2 = p;
	*rem = e;
	*np = 0;
	if (r < 2 * e) {
		peers[(*np)++] = r % 2 == 0 ? r + 1 : r - 1;
		*newrank = r % 2 == 0 ? -1 : r / 2;
	} else {
		*newrank = r - e;
	}
	for (int mask = 1; *newrank >= 0 && mask < p; mask <<= 1)
		peers[(*np)++] = ring_rd_member(*newrank ^ mask, e);
	return ring_ensure_conns(rc, peers, *np);
}

kolo_status_t ring_rd_begin(struct kolo_ring_comm *rc, char *buf, size_t bytes,
                            ring_rd_fold_fn fold, void *ctx, struct ring_rd *rd, bool *done)
{
	const int r = rc->rank;
	int peers[40], np;
	*done = false;
	KOLO_CHECK(ring_rd_layout(rc, &rd->pof2, &rd->rem, &rd->newrank, peers, &np));
	KOLO_CHECK(ring_scratch_reserve(rc, KOLO_MAX(bytes, 1)));
	rd->tmp = rc->scratch;
	if (r < 2 * rd->rem && r % 2 == 0) {
		/* Hand the data to r + 1, then get the result back. */
		*done = true;
		KOLO_CHECK(ring_exchange(rc, r + 1, buf, bytes, NULL, 0));
		return ring_exchange(rc, r + 1, NULL, 0, buf, bytes);
	}
	if (r < 2 * rd->rem) {
		KOLO_CHECK(ring_exchange(rc, r - 1, NULL, 0, rd->tmp, bytes));
		fold(ctx, buf, rd->tmp);
	}
	return KOLO_OK;
}

kolo_status_t ring_rd_end(struct kolo_ring_comm *rc, const struct ring_rd *rd, char *buf,
                          size_t bytes)
{
	if (rc->rank < 2 * rd->rem)
		return ring_exchange(rc, rc->rank - 1, buf, bytes, NULL, 0);
	return KOLO_OK;
}

struct reduce_ctx {
	size_t count;
	kolo_dtype_t dtype;
	kolo_op_t op;
};

/* buf <- lower (op) buf, in that order (the lower rank's operand first). */
static void fold_reduce(void *arg, char *buf, char *lower)
{
	const struct reduce_ctx *c = arg;
	kolo_reduce(lower, buf, c->count, c->dtype, c->op);
	memcpy(buf, lower, c->count * kolo_dtype_size(c->dtype));
}

/* buf (count elements, this rank's prescaled data) ← the reduction over all
 * ranks, by recursive doubling. Ranks beyond the largest power of two first
 * fold into a partner and get the result back at the end. Every combination
 * is (lower rank's operand) op (higher rank's operand) on both partners, so
 * all ranks hold identical bits. */
static kolo_status_t allreduce_rd(struct kolo_ring_comm *rc, char *buf, size_t count,
                                  kolo_dtype_t dtype, kolo_op_t op)
{
	const int r = rc->rank;
	const size_t bytes = count * kolo_dtype_size(dtype);
	struct ring_rd rd;
	struct reduce_ctx c = {count, dtype, op};
	bool done;
	KOLO_CHECK(ring_rd_begin(rc, buf, bytes, fold_reduce, &c, &rd, &done));
	if (done)
		return KOLO_OK;
	const int pof2 = rd.pof2, rem = rd.rem, newrank = rd.newrank;
	char *tmp = rd.tmp;
	for (int mask = 1; mask < pof2; mask <<= 1) {
		int p = ring_rd_member(newrank ^ mask, rem);
		KOLO_CHECK(ring_exchange(rc, p, buf, bytes, tmp, bytes));
		if (p < r) {
			kolo_reduce(tmp, buf, count, dtype, op);
			memcpy(buf, tmp, bytes);
		} else {
			kolo_reduce(buf, tmp, count, dtype, op);
		}
	}
	return ring_rd_end(rc, &rd, buf, bytes);
}

/* buf ← the reduction over all ranks in one step: every rank sends its data
 * to every other and reduces the n contributions itself, in rank order, so
 * all ranks hold identical bits. One round instead of ⌈lg n⌉: on a host with
 * more ranks than CPUs each round waits for a peer to be scheduled, and a
 * rank whose data is sent need not run again for the others to finish. */
static kolo_status_t allreduce_direct(struct kolo_ring_comm *rc, char *buf, size_t count,
                                      kolo_dtype_t dtype, kolo_op_t op)
{
	const int n = rc->size, r = rc->rank;
	const size_t bytes = count * kolo_dtype_size(dtype);
	struct kolo_req *reqs[2 * KOLO_RING_DIRECT_MAX_RANKS];
	int peers[2 * KOLO_RING_DIRECT_MAX_RANKS], np = 0;
	for (int k = 1; k < n; k++)
		peers[np++] = ring_wrap(r + k, n);
	KOLO_CHECK(ring_ensure_conns(rc, peers, np));
	KOLO_CHECK(ring_scratch_reserve(rc, bytes * (size_t)n));
	char *slot = rc->scratch;
	np = 0;
	for (int k = 1; k < n; k++) {
		int from = ring_wrap(r - k, n), to = ring_wrap(r + k, n);
		kolo_status_t st =
		        kolo_irecv(rc->conns[from], slot + (size_t)from * bytes, bytes, &reqs[np]);
		if (st != KOLO_OK)
			return ring_peer_fail(rc, st, from, "receiving from");
		peers[np++] = from;
		st = kolo_isend(rc->conns[to], buf, bytes, &reqs[np]);
		if (st != KOLO_OK)
			return ring_peer_fail(rc, st, to, "sending to");
		peers[np++] = to;
	}
	KOLO_CHECK(ring_wait_all(rc, reqs, peers, np));
	memcpy(slot + (size_t)r * bytes, buf, bytes);
	kolo_reduce3(buf, slot, slot + bytes, count, dtype, op);
	for (int i = 2; i < n; i++)
		kolo_reduce(buf, slot + (size_t)i * bytes, count, dtype, op);
	return KOLO_OK;
}

static kolo_status_t allreduce_adasum(struct kolo_ring_comm *rc, const void *sendbuf, void *recvbuf,
                                      size_t count, kolo_dtype_t dtype, double prescale,
                                      double postscale)
{
	if (!kolo_adasum_dtype(dtype))
		return ring_bad_arg(rc, "adasum of %s", kolo_dtype_name(dtype));
	if (count == 0)
		return KOLO_OK;
	kolo_scale(recvbuf, sendbuf, count, dtype, prescale);
	if (rc->size > 1)
		KOLO_CHECK(ring_adasum(rc, recvbuf, count, dtype));
	if (postscale != 1.0)
		kolo_scale(recvbuf, recvbuf, count, dtype, postscale);
	return KOLO_OK;
}

kolo_status_t kolo_ring_allreduce(struct kolo_ring_comm *rc, const void *sendbuf, void *recvbuf,
                                  size_t count, kolo_dtype_t dtype, kolo_op_t op, double prescale,
                                  double postscale)
{
	KOLO_CHECK(ring_enter(rc, "allreduce", dtype));
	if (op == KOLO_ADASUM)
		return allreduce_adasum(rc, sendbuf, recvbuf, count, dtype, prescale, postscale);
	if ((unsigned)op >= KOLO_OP_COUNT)
		return ring_bad_arg(rc, "invalid op %d", (int)op);
	const int n = rc->size;
	const size_t es = kolo_dtype_size(dtype);
	if (op == KOLO_AVERAGE)
		postscale /= n;
	if (count == 0)
		return KOLO_OK;
	enum kolo_ring_algo algo = kolo_ring_allreduce_algo(rc, count * es);
	if (algo == KOLO_RING_ALGO_HIER) {
		kolo_status_t st = ring_hier_allreduce(rc->hier, sendbuf, recvbuf, count, dtype,
		                                       op == KOLO_AVERAGE ? KOLO_SUM : op, prescale,
		                                       postscale);
		if (st != KOLO_OK)
			return kolo_ring_comm_fail(rc, st, ring_hier_failed_peer(rc->hier),
			                           ring_hier_last_error(rc->hier));
		return KOLO_OK;
	}
	if (n == 1 || algo == KOLO_RING_ALGO_SMALL) {
		kolo_scale(recvbuf, sendbuf, count, dtype, prescale);
		if (n > 1 && n <= rc->cfg.small_direct_ranks &&
		    count * es <= rc->cfg.small_direct_bytes)
			KOLO_CHECK(allreduce_direct(rc, recvbuf, count, dtype, op));
		else if (n > 1)
			KOLO_CHECK(allreduce_rd(rc, recvbuf, count, dtype, op));
		if (postscale != 1.0)
			kolo_scale(recvbuf, recvbuf, count, dtype, postscale);
		return KOLO_OK;
	}
	struct ring_stream s = {
	        .work = recvbuf,
	        .src = sendbuf,
	        .prescale = prescale,
	        .postscale = postscale,
	        .esize = es,
	        .dtype = dtype,
	        .op = op,
	        .nrs = n - 1,
	        .nag = n - 1,
	        .shift = 0,
	};
	return ring_stream_run(rc, &s, NULL, count);
}

kolo_status_t kolo_ring_allreduce_pieces(struct kolo_ring_comm *rc,
                                         const struct kolo_ring_piece *pieces, size_t n,
                                         kolo_dtype_t dtype, kolo_op_t op, double prescale,
                                         double postscale)
{
	KOLO_CHECK(ring_enter(rc, "allreduce", dtype));
	if ((unsigned)op >= KOLO_OP_COUNT && op != KOLO_ADASUM)
		return ring_bad_arg(rc, "invalid op %d", (int)op);
	const size_t es = kolo_dtype_size(dtype);
	size_t total = 0, nonempty = 0;
	for (size_t i = 0; i < n; i++) {
		total += pieces[i].count;
		nonempty += pieces[i].count > 0;
	}
	/* One piece, or an algorithm other than the flat ring, or Adasum (each
	 * tensor its own dot products): one by one. */
	if (nonempty <= 1 || rc->size == 1 || op == KOLO_ADASUM ||
	    kolo_ring_allreduce_algo(rc, total * es) != KOLO_RING_ALGO_RING) {
		for (size_t i = 0; i < n; i++)
			if (pieces[i].count)
				KOLO_CHECK(kolo_ring_allreduce(rc, pieces[i].send, pieces[i].recv,
				                               pieces[i].count, dtype, op, prescale,
				                               postscale));
		return KOLO_OK;
	}
	size_t *off = malloc((n + 1) * sizeof(*off));
	if (!off)
		return ring_fail(rc, KOLO_ENOMEM, "out of memory");
	off[0] = 0;
	for (size_t i = 0; i < n; i++)
		off[i + 1] = off[i] + pieces[i].count;
	struct ring_stream s = {
	        .pieces = pieces,
	        .piece_off = off,
	        .npieces = n,
	        .prescale = prescale,
	        .postscale = op == KOLO_AVERAGE ? postscale / rc->size : postscale,
	        .esize = es,
	        .dtype = dtype,
	        .op = op,
	        .nrs = rc->size - 1,
	        .nag = rc->size - 1,
	        .shift = 0,
	};
	kolo_status_t st = ring_stream_run(rc, &s, NULL, total);
	free(off);
	return st;
}
