/* Conns: one per peer (tag cfg.tag_base + KOLO_RING_TAG), duplex, cached for
 * the comm's life. The lower rank of a pair connects and the higher one
 * accepts; a collective first starts every connect it needs and only then
 * waits in accept, so two ranks never wait on each other. Ring neighbours
 * are connected by create; other peers on first use. */
#include <stdlib.h>

#include "ring_internal.h"

/* Sends a zero-byte message to and receives one from each of peers[0..n),
 * all at once, and waits. */
static kolo_status_t greet_new_conns(struct kolo_ring_comm *rc, const int *peers, int n)
{
	static char dummy;
	struct kolo_req **reqs = calloc(2 * (size_t)n, sizeof(*reqs));
	int *rp = calloc(2 * (size_t)n, sizeof(*rp)), nr = 0;
	kolo_status_t st = KOLO_OK;
	if (!reqs || !rp) {
		st = ring_fail(rc, KOLO_ENOMEM, "out of memory");
		goto out;
	}
	for (int i = 0; i < n && st == KOLO_OK; i++) {
		rp[nr] = peers[i];
		st = kolo_irecv(rc->conns[peers[i]], &dummy, 0, &reqs[nr++]);
		if (st == KOLO_OK) {
			rp[nr] = peers[i];
			st = kolo_isend(rc->conns[peers[i]], &dummy, 0, &reqs[nr++]);
		}
		if (st != KOLO_OK)
			st = ring_peer_fail(rc, st, peers[i], "greeting");
	}
	if (st == KOLO_OK)
		st = ring_wait_all(rc, reqs, rp, nr);
out:
	free(reqs);
	free(rp);
	return st;
}

/* Makes sure conns[peers[i]] exist: connects to every higher peer first,
 * then accepts from every lower one. peers may repeat and name self. Both
 * sides then exchange a zero-byte message on every new conn, so that it is
 * complete on both sides when the collective returns: a rank that computes
 * for a long time afterwards leaves no handshake half done. */
kolo_status_t ring_ensure_conns(struct kolo_ring_comm *rc, const int *peers, int n)
{
	int have = 0; /* the common case, every conn made: nothing to allocate */
	while (have < n && (peers[have] == rc->rank || rc->conns[peers[have]]))
		have++;
	if (have == n)
		return KOLO_OK;
	const struct kolo_transport_ops *ops = rc->t->ops;
	int *fresh = calloc((size_t)n, sizeof(*fresh)), nfresh = 0;
	kolo_status_t st = KOLO_OK;
	if (!fresh)
		return ring_fail(rc, KOLO_ENOMEM, "out of memory");
	for (int i = 0; i < n; i++) {
		int p = peers[i];
		if (p == rc->rank || rc->conns[p] || p < rc->rank)
			continue;
		struct kolo_transport_handle h;
		st = rc->cfg.lookup(rc->cfg.lookup_ctx, ring_global_rank(rc, p), &h,
		                    rc->cfg.timeout_ms);
		if (st != KOLO_OK) {
			st = ring_fail(rc, st, "cannot look up the address of rank %d",
			               ring_global_rank(rc, p));
			goto out;
		}
		st = ops->connect(rc->t, &h, ring_global_rank(rc, p), rc->tag, &rc->conns[p]);
		if (st != KOLO_OK) {
			rc->conns[p] = NULL;
			st = ring_peer_fail(rc, st, p, "connecting to");
			goto out;
		}
		fresh[nfresh++] = p;
	}
	for (int i = 0; i < n; i++) {
		int p = peers[i];
		struct ring_waiter w;
		ring_waiter_init(&w);
		bool accepted = false;
		while (p < rc->rank && !rc->conns[p]) {
			st = ops->accept(rc->t, ring_global_rank(rc, p), rc->tag, &rc->conns[p]);
			if (st != KOLO_OK) {
				rc->conns[p] = NULL;
				st = ring_peer_fail(rc, st, p, "accepting from");
				goto out;
			}
			if (!rc->conns[p] &&
			    (st = ring_idle(rc, &w, false, "waiting for a connection")) !=
			            KOLO_OK) {
				ring_blame(rc, st, p);
				goto out;
			}
			accepted = rc->conns[p] != NULL;
		}
		if (accepted)
			fresh[nfresh++] = p;
	}
	if (nfresh)
		st = greet_new_conns(rc, fresh, nfresh);
out:
	free(fresh);
	return st;
}
