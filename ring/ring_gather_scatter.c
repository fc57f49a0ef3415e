/* Allgatherv and reducescatter: each is one half of the pipelined ring
 * (ring_stream.c), the allgather steps or the reduce-scatter steps alone. */
#include <stdlib.h>
#include <string.h>

#include "ring_internal.h"

kolo_status_t kolo_ring_allgatherv(struct kolo_ring_comm *rc, const void *sendbuf, void *recvbuf,
                                   const size_t *counts, kolo_dtype_t dtype)
{
	KOLO_CHECK(ring_enter(rc, "allgatherv", dtype));
	const int n = rc->size, r = rc->rank;
	const size_t es = kolo_dtype_size(dtype);
	size_t before = 0, total = 0;
	for (int i = 0; i < n; i++) {
		if (i < r)
			before += counts[i];
		total += counts[i];
	}
	char *own = (char *)recvbuf + before * es;
	if (counts[r] > 0 && (const char *)sendbuf != own)
		memmove(own, sendbuf, counts[r] * es);
	if (n == 1 || total == 0)
		return KOLO_OK;
	/* Allgather steps only: no src, op or scales (nothing is reduced). */
	struct ring_stream s = {.work = recvbuf, .esize = es, .dtype = dtype, .nag = n - 1};
	return ring_stream_run(rc, &s, counts, 0);
}

kolo_status_t kolo_ring_reducescatter(struct kolo_ring_comm *rc, const void *sendbuf, void *recvbuf,
                                      const size_t *counts, kolo_dtype_t dtype, kolo_op_t op,
                                      double prescale, double postscale)
{
	KOLO_CHECK(ring_enter(rc, "reducescatter", dtype));
	if ((unsigned)op >= KOLO_OP_COUNT)
		return ring_bad_arg(rc, "invalid op %d", (int)op);
	const int n = rc->size, r = rc->rank;
	const size_t es = kolo_dtype_size(dtype);
	if (op == KOLO_AVERAGE)
		postscale /= n;
	size_t total = 0;
	for (int i = 0; i < n; i++)
		total += counts[i];
	if (total == 0)
		return KOLO_OK;
	if (n == 1) {
		kolo_scale(recvbuf, sendbuf, counts[0], dtype, prescale);
		if (postscale != 1.0)
			kolo_scale(recvbuf, recvbuf, counts[0], dtype, postscale);
		return KOLO_OK;
	}
	size_t maxblock = 0;
	for (int i = 0; i < n; i++)
		maxblock = KOLO_MAX(maxblock, counts[i]);
	const size_t half = maxblock * es;
	if (rc->work_size < 2 * half) {
		char *p = realloc(rc->work, 2 * half);
		if (!p)
			return ring_fail(rc, KOLO_ENOMEM, "cannot allocate %zu bytes", 2 * half);
		rc->work = p;
		rc->work_size = 2 * half;
	}
	/* Step s sends block r-1-s, so the last step (n - 2) leaves block r
	 * in rot[n % 2]; it is copied out once every send is done, which lets
	 * recvbuf overlap sendbuf anywhere. */
	struct ring_stream s = {
	        .rot = {rc->work, rc->work + half},
	        .src = sendbuf,
	        .prescale = prescale,
	        .postscale = postscale,
	        .esize = es,
	        .dtype = dtype,
	        .op = op,
	        .nrs = n - 1,
	        .nag = 0,
	        .shift = -1,
	};
	kolo_status_t st = ring_stream_run(rc, &s, counts, 0);
	if (st == KOLO_OK && counts[r] > 0)
		memmove(recvbuf, s.rot[n % 2], counts[r] * es);
	return st;
}
