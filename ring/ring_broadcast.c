/* Broadcast: a binomial tree for messages up to one segment, else a
 * pipelined chain along the ring from the root. */
#include "ring_internal.h"

/* Binomial tree over ranks relative to root: lg n rounds of whole messages. */
static kolo_status_t bcast_tree(struct kolo_ring_comm *rc, char *buf, size_t bytes, int root)
{
	const int n = rc->size, v = ring_wrap(rc->rank - root, n);
	int peers[40] = {0}, np = 0, parent = -1, mask = 1;
	for (; mask < n; mask <<= 1) {
		if (v & mask) {
			parent = ring_wrap(v - mask + root, n);
			peers[np++] = parent;
			break;
		}
	}
	for (mask >>= 1; mask > 0; mask >>= 1)
		if (v + mask < n)
			peers[np++] = ring_wrap(v + mask + root, n);
	KOLO_CHECK(ring_ensure_conns(rc, peers, np));
	struct kolo_req *reqs[40];
	int start = 0;
	if (parent >= 0) {
		kolo_status_t st = kolo_irecv(rc->conns[parent], buf, bytes, &reqs[0]);
		if (st != KOLO_OK)
			return ring_peer_fail(rc, st, parent, "receiving from");
		KOLO_CHECK(ring_wait_all(rc, reqs, peers, 1));
		start = 1;
	}
	for (int i = start; i < np; i++) {
		kolo_status_t st = kolo_isend(rc->conns[peers[i]], buf, bytes, &reqs[i]);
		if (st != KOLO_OK)
			return ring_peer_fail(rc, st, peers[i], "sending to");
	}
	return ring_wait_all(rc, reqs + start, peers + start, np - start);
}

/* Fails the comm unless the left neighbour's description (rc->stream_desc[1])
 * is this rank's ([0]): a count that differs but cuts segments of the same
 * length would otherwise be taken as a prefix, silently, and leave the rest
 * of the chain in the conn for the next collective. */
static kolo_status_t bcast_check_desc(struct kolo_ring_comm *rc, int left)
{
	const struct ring_stream_desc *a = &rc->stream_desc[1], *b = &rc->stream_desc[0];
	if (a->total == b->total && a->units == b->units && a->dtype == b->dtype && a->op == b->op)
		return KOLO_OK;
	return ring_fail(
	        rc, KOLO_EMISMATCH,
	        "rank %d broadcasts %llu elements of %s from rank %u (%llu segments) where "
	        "this rank has %llu of %s from rank %u (%llu): every rank must pass the "
	        "same count, dtype and root, and the same kind of memory (host or "
	        "device), to one broadcast",
	        ring_global_rank(rc, left), (unsigned long long)a->total,
	        kolo_dtype_name((kolo_dtype_t)a->dtype), a->op, (unsigned long long)a->units,
	        (unsigned long long)b->total, kolo_dtype_name((kolo_dtype_t)b->dtype), b->op,
	        (unsigned long long)b->units);
}

/* Pipelined chain root → root+1 → ... along the ring: each segment is
 * forwarded as soon as it arrives. Every rank first sends its right
 * neighbour what it broadcasts, and stores or forwards nothing of its left
 * neighbour's before that matches. */
static kolo_status_t bcast_chain(struct kolo_ring_comm *rc, char *buf, size_t count,
                                 kolo_dtype_t dtype, int root)
{
	const int n = rc->size, r = rc->rank, v = ring_wrap(r - root, n);
	const int lp = ring_wrap(r - 1, n), rp = ring_wrap(r + 1, n); /* left, right peers */
	const bool has_left = v > 0, has_right = v < n - 1;
	const size_t bytes = count * kolo_dtype_size(dtype);
	const size_t K = (bytes + rc->cfg.segment_bytes - 1) / rc->cfg.segment_bytes;
	struct kolo_req *rreq[RING_RECV_WINDOW] = {0}, *sreq[RING_SEND_WINDOW] = {0};
	struct kolo_req *dsend = NULL, *drecv = NULL;
	size_t done = has_left ? 0 : K, rposted = done, sposted = has_right ? 0 : K,
	       sdone = sposted;
	bool checked = !has_left;
	struct ring_waiter w;
	ring_waiter_init(&w);
	w.peer = has_left ? lp : -1;
	kolo_status_t st;
	/* The chain's description; op holds the root. Posted before any
	 * segment: each conn delivers in order. */
	rc->stream_desc[0] = (struct ring_stream_desc){
	        .total = count, .units = K, .dtype = (uint32_t)dtype, .op = (uint32_t)root};
	if (has_left) {
		st = kolo_irecv(rc->conns[lp], &rc->stream_desc[1], sizeof(rc->stream_desc[1]),
		                &drecv);
		if (st != KOLO_OK)
			return ring_peer_fail(rc, st, lp, "receiving from");
	}
	if (has_right) {
		st = kolo_isend(rc->conns[rp], &rc->stream_desc[0], sizeof(rc->stream_desc[0]),
		                &dsend);
		if (st != KOLO_OK)
			return ring_peer_fail(rc, st, rp, "sending to");
	}
	while (!checked || dsend || done < K || sdone < K) {
		bool progressed = false;
		if (dsend)
			KOLO_CHECK(ring_poll_req(rc, &dsend, rp, "sending to", &progressed));
		if (!checked) {
			KOLO_CHECK(ring_poll_req(rc, &drecv, lp, "receiving from", &progressed));
			if (!drecv) {
				KOLO_CHECK(bcast_check_desc(rc, lp));
				checked = true;
			}
		}
		while (rposted < K && rposted < done + RING_RECV_WINDOW) {
			size_t lo = bytes * rposted / K, hi = bytes * (rposted + 1) / K;
			st = kolo_irecv(rc->conns[lp], buf + lo, hi - lo,
			                &rreq[rposted % RING_RECV_WINDOW]);
			if (st != KOLO_OK)
				return ring_peer_fail(rc, st, lp, "receiving from");
			rposted++;
		}
		while (sposted < K && sposted < done && !sreq[sposted % RING_SEND_WINDOW]) {
			size_t lo = bytes * sposted / K, hi = bytes * (sposted + 1) / K;
			st = kolo_isend(rc->conns[rp], buf + lo, hi - lo,
			                &sreq[sposted % RING_SEND_WINDOW]);
			if (st != KOLO_OK)
				return ring_peer_fail(rc, st, rp, "sending to");
			sposted++;
		}
		if (checked && done < rposted) {
			KOLO_CHECK(ring_poll_req(rc, &rreq[done % RING_RECV_WINDOW], lp,
			                         "receiving from", &progressed));
			if (!rreq[done % RING_RECV_WINDOW])
				done++;
		}
		KOLO_CHECK(ring_test_sends(rc, sreq, &sdone, sposted, rp, &progressed));
		st = ring_idle(rc, &w, progressed, "in the broadcast chain");
		if (st != KOLO_OK)
			return ring_blame(rc, st, !checked || done < K ? lp : rp);
	}
	return KOLO_OK;
}

kolo_status_t kolo_ring_broadcast(struct kolo_ring_comm *rc, void *buf, size_t count,
                                  kolo_dtype_t dtype, int root)
{
	KOLO_CHECK(ring_enter(rc, "broadcast", dtype));
	if (root < 0 || root >= rc->size)
		return ring_bad_arg(rc, "invalid root %d", root);
	const size_t bytes = count * kolo_dtype_size(dtype);
	if (rc->size == 1 || bytes == 0)
		return KOLO_OK;
	if (bytes <= rc->cfg.segment_bytes)
		return bcast_tree(rc, buf, bytes, root);
	return bcast_chain(rc, buf, count, dtype, root);
}
