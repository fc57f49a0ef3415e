/* The collectives in which every rank talks to its peers directly, without
 * the ring: alltoallv (all pairs at once) and the dissemination barrier. */
#include <stdlib.h>
#include <string.h>

#include "ring_internal.h"

/* Posts a receive from and a send to every other rank at once (in pairwise
 * order, rank+k / rank-k, so the transport moves them concurrently) and
 * waits for all of them. */
static kolo_status_t exchange_blocks(struct kolo_ring_comm *rc, const char *src,
                                     const size_t *sendcounts, void *recvbuf,
                                     const size_t *recvcounts, size_t es)
{
	const int n = rc->size, r = rc->rank;
	kolo_status_t st = KOLO_OK;
	struct kolo_req **reqs = calloc(2 * (size_t)n, sizeof(*reqs));
	int *peers = calloc(2 * (size_t)n, sizeof(*peers));
	size_t *soff = calloc((size_t)n, sizeof(*soff));
	size_t *roff = calloc((size_t)n, sizeof(*roff));
	if (!reqs || !peers || !soff || !roff) {
		st = ring_fail(rc, KOLO_ENOMEM, "out of memory");
		goto out;
	}
	for (int i = 1; i < n; i++) {
		soff[i] = soff[i - 1] + sendcounts[i - 1];
		roff[i] = roff[i - 1] + recvcounts[i - 1];
	}
	int np = 0;
	for (int k = 1; k < n; k++)
		peers[np++] = ring_wrap(r + k, n);
	st = ring_ensure_conns(rc, peers, np);
	if (st != KOLO_OK)
		goto out;
	np = 0;
	for (int k = 1; k < n && st == KOLO_OK; k++) {
		int to = ring_wrap(r + k, n), from = ring_wrap(r - k, n);
		peers[np] = from;
		st = kolo_irecv(rc->conns[from], (char *)recvbuf + roff[from] * es,
		                recvcounts[from] * es, &reqs[np++]);
		if (st != KOLO_OK) {
			st = ring_peer_fail(rc, st, from, "receiving from");
			break;
		}
		peers[np] = to;
		st = kolo_isend(rc->conns[to], src + soff[to] * es, sendcounts[to] * es,
		                &reqs[np++]);
		if (st != KOLO_OK)
			st = ring_peer_fail(rc, st, to, "sending to");
	}
	if (st == KOLO_OK)
		st = ring_wait_all(rc, reqs, peers, np);
out:
	free(reqs);
	free(peers);
	free(soff);
	free(roff);
	return st;
}

/* Every pair exchanges its blocks directly over a lazily connected conn. In
 * place (sendbuf == recvbuf), the input is copied first: a block received
 * may land where a block still to be sent lies. */
kolo_status_t kolo_ring_alltoallv(struct kolo_ring_comm *rc, const void *sendbuf,
                                  const size_t *sendcounts, void *recvbuf, const size_t *recvcounts,
                                  kolo_dtype_t dtype)
{
	KOLO_CHECK(ring_enter(rc, "alltoallv", dtype));
	const int n = rc->size, r = rc->rank;
	const size_t es = kolo_dtype_size(dtype);
	size_t stotal = 0, soff_r = 0, roff_r = 0;
	for (int i = 0; i < n; i++) {
		if (i < r) {
			soff_r += sendcounts[i];
			roff_r += recvcounts[i];
		}
		stotal += sendcounts[i];
	}
	const char *src = sendbuf;
	char *copy = NULL;
	if (sendbuf == recvbuf && n > 1 && stotal > 0) {
		copy = malloc(stotal * es);
		if (!copy)
			return ring_fail(rc, KOLO_ENOMEM, "cannot allocate %zu bytes", stotal * es);
		memcpy(copy, sendbuf, stotal * es);
		src = copy;
	}
	if (recvcounts[r] > 0 && (const char *)recvbuf + roff_r * es != src + soff_r * es)
		memmove((char *)recvbuf + roff_r * es, src + soff_r * es, recvcounts[r] * es);
	kolo_status_t st = KOLO_OK;
	if (n > 1)
		st = exchange_blocks(rc, src, sendcounts, recvbuf, recvcounts, es);
	free(copy);
	return st;
}

/* Dissemination: in round k every rank signals rank + 2^k and waits for
 * rank - 2^k, with zero-byte messages; ⌈lg n⌉ rounds. */
kolo_status_t kolo_ring_barrier(struct kolo_ring_comm *rc)
{
	KOLO_CHECK(ring_enter(rc, "barrier", KOLO_UINT8));
	const int n = rc->size, r = rc->rank;
	int peers[80] = {0}, np = 0;
	for (int d = 1; d < n; d <<= 1) {
		peers[np++] = ring_wrap(r + d, n);
		peers[np++] = ring_wrap(r - d, n);
	}
	KOLO_CHECK(ring_ensure_conns(rc, peers, np));
	static char dummy;
	for (int i = 0; i < np; i += 2) {
		struct kolo_req *reqs[2];
		int pr[2] = {peers[i], peers[i + 1]};
		kolo_status_t st = kolo_isend(rc->conns[pr[0]], &dummy, 0, &reqs[0]);
		if (st != KOLO_OK)
			return ring_peer_fail(rc, st, pr[0], "signalling");
		st = kolo_irecv(rc->conns[pr[1]], &dummy, 0, &reqs[1]);
		if (st != KOLO_OK)
			return ring_peer_fail(rc, st, pr[1], "waiting for");
		KOLO_CHECK(ring_wait_all(rc, reqs, pr, 2));
	}
	return KOLO_OK;
}
