/* Allreduce: recursive doubling for small messages (latency-optimal), the
 * pipelined ring (reduce-scatter then allgather) for large ones, or the
 * hierarchical allreduce of hier.c when one is attached and the cost model
 * picks it (kolo_ring_allreduce_algo). */
#include <stdlib.h>
#include <string.h>

#include "ring_internal.h"

/* buf (count elements, this rank's prescaled data) ← the reduction over all
 * ranks, by recursive doubling. Ranks beyond the largest power of two first
 * fold into a partner and get the result back at the end. Every combination
 * is (lower rank's operand) op (higher rank's operand) on both partners, so
 * all ranks hold identical bits. */
static kolo_status_t allreduce_rd(struct kolo_ring_comm *rc, char *buf, size_t count,
                                  kolo_dtype_t dtype, kolo_op_t op)
{
	const int n = rc->size, r = rc->rank;
	const size_t bytes = count * kolo_dtype_size(dtype);
	int pof2 = 1;
	while (pof2 * 2 <= n)
		pof2 *= 2;
	const int rem = n - pof2;
	int peers[40] = {0}, np = 0, newrank;
	if (r < 2 * rem) {
		peers[np++] = r % 2 == 0 ? r + 1 : r - 1;
		newrank = r % 2 == 0 ? -1 : r / 2;
	} else {
		newrank = r - rem;
	}
	for (int mask = 1; newrank >= 0 && mask < pof2; mask <<= 1) {
		int pn = newrank ^ mask;
		peers[np++] = pn < rem ? pn * 2 + 1 : pn + rem;
	}
	KOLO_CHECK(ring_ensure_conns(rc, peers, np));
	KOLO_CHECK(ring_scratch_reserve(rc, KOLO_MAX(bytes, 1)));
	char *tmp = rc->scratch;

	if (r < 2 * rem && r % 2 == 0) {
		/* Hand the data to r + 1, then get the result back. */
		KOLO_CHECK(ring_exchange(rc, r + 1, buf, bytes, NULL, 0));
		return ring_exchange(rc, r + 1, NULL, 0, buf, bytes);
	}
	if (r < 2 * rem) {
		KOLO_CHECK(ring_exchange(rc, r - 1, NULL, 0, tmp, bytes));
		kolo_reduce(tmp, buf, count, dtype, op);
		memcpy(buf, tmp, bytes);
	}
	for (int mask = 1; mask < pof2; mask <<= 1) {
		int pn = newrank ^ mask;
		int p = pn < rem ? pn * 2 + 1 : pn + rem;
		KOLO_CHECK(ring_exchange(rc, p, buf, bytes, tmp, bytes));
		if (p < r) {
			kolo_reduce(tmp, buf, count, dtype, op);
			memcpy(buf, tmp, bytes);
		} else {
			kolo_reduce(buf, tmp, count, dtype, op);
		}
	}
	if (r < 2 * rem)
		KOLO_CHECK(ring_exchange(rc, r - 1, buf, bytes, NULL, 0));
	return KOLO_OK;
}

kolo_status_t kolo_ring_allreduce(struct kolo_ring_comm *rc, const void *sendbuf, void *recvbuf,
                                  size_t count, kolo_dtype_t dtype, kolo_op_t op, double prescale,
                                  double postscale)
{
	KOLO_CHECK(ring_enter(rc, "allreduce", dtype));
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
		if (n > 1)
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
