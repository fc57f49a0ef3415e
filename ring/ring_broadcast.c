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

/* Pipelined chain root → root+1 → ... along the ring: each segment is
 * forwarded as soon as it arrives. */
static kolo_status_t bcast_chain(struct kolo_ring_comm *rc, char *buf, size_t bytes, int root)
{
	const int n = rc->size, r = rc->rank, v = ring_wrap(r - root, n);
	const int lp = ring_wrap(r - 1, n), rp = ring_wrap(r + 1, n); /* left, right peers */
	const bool has_left = v > 0, has_right = v < n - 1;
	const size_t K = (bytes + rc->cfg.segment_bytes - 1) / rc->cfg.segment_bytes;
	struct kolo_req *rreq[RING_RECV_WINDOW] = {0}, *sreq[RING_SEND_WINDOW] = {0};
	size_t done = has_left ? 0 : K, rposted = done, sposted = has_right ? 0 : K,
	       sdone = sposted;
	struct ring_waiter w;
	ring_waiter_init(&w);
	kolo_status_t st;
	while (done < K || sdone < K) {
		bool progressed = false;
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
		if (done < rposted) {
			KOLO_CHECK(ring_poll_req(rc, &rreq[done % RING_RECV_WINDOW], lp,
			                         "receiving from", &progressed));
			if (!rreq[done % RING_RECV_WINDOW])
				done++;
		}
		KOLO_CHECK(ring_test_sends(rc, sreq, &sdone, sposted, rp, &progressed));
		st = ring_idle(rc, &w, progressed, "in the broadcast chain");
		if (st != KOLO_OK)
			return ring_blame(rc, st, done < K ? lp : rp);
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
	return bcast_chain(rc, buf, bytes, root);
}
