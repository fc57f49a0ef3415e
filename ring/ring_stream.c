/* The pipelined ring: a reduce-scatter, an allgather, or one then the other,
 * as one stream of segments around the ring (struct ring_stream). The
 * collectives fill in the stream; ring_stream_run moves it. Each pass of the
 * loop is a list of phases: post receives, post sends, finish the oldest
 * receive (reducing it when the step reduces), test the oldest sends, idle. */
#include <stdlib.h>

#include "ring_internal.h"

/* A stream in motion. A unit is one segment of one step: unit u is segment
 * u % nseg of step u / nseg; there are (nrs + nag) * nseg of them, and each
 * counter below is a number of units. */
struct stream_run {
	struct kolo_ring_comm *rc;
	const struct ring_stream *s;
	int left_peer, right_peer;
	struct kolo_conn *left, *right;
	size_t units;    /* in the whole stream */
	size_t segbytes; /* one scratch slot */
	struct kolo_req *rreq[RING_RECV_WINDOW], *sreq[RING_SEND_WINDOW];
	size_t done;                    /* receives finished (and reduced) */
	size_t rposted;                 /* receives posted */
	size_t sposted;                 /* sends posted */
	size_t sdone;                   /* sends complete */
	struct kolo_req *dsend, *drecv; /* rc->stream_desc's exchange, ahead of every segment */
	bool checked;                   /* the left neighbour's arrived and matches ours */
};

static void seg_range(const struct ring_stream *s, int b, size_t k, size_t *off, size_t *len)
{
	if (s->cuts) {
		const size_t *c = s->cuts + (size_t)b * (s->nseg + 1);
		*off = c[k];
		*len = c[k + 1] - c[k];
		return;
	}
	size_t lo = s->blen[b] * k / s->nseg, hi = s->blen[b] * (k + 1) / s->nseg;
	*off = s->boff[b] + lo;
	*len = hi - lo;
}

/* The piece that holds element off (pieces only). */
static const struct kolo_ring_piece *piece_at(const struct ring_stream *s, size_t off, size_t *in)
{
	size_t lo = 0, hi = s->npieces; /* piece_off[lo] <= off < piece_off[hi] */
	while (hi - lo > 1) {
		size_t mid = (lo + hi) / 2;
		if (s->piece_off[mid] <= off)
			lo = mid;
		else
			hi = mid;
	}
	*in = (off - s->piece_off[lo]) * s->esize;
	return &s->pieces[lo];
}

/* Where element off of the result lives. */
static char *work_at(const struct ring_stream *s, size_t off)
{
	if (!s->pieces)
		return s->work + off * s->esize;
	size_t in;
	const struct kolo_ring_piece *p = piece_at(s, off, &in);
	return (char *)p->recv + in;
}

/* Where element off of this rank's input lives (NULL: it has none). */
static const char *src_at(const struct ring_stream *s, size_t off)
{
	if (!s->pieces)
		return s->src ? s->src + off * s->esize : NULL;
	size_t in;
	const struct kolo_ring_piece *p = piece_at(s, off, &in);
	return (const char *)p->send + in;
}

/* Where the segment at element offset off of block b lives once RS step t
 * (-1 ≤ t < nrs) has produced it; in work for every block otherwise. */
static char *stream_block_at(const struct ring_stream *s, long t, int b, size_t off)
{
	if (!s->rot[0])
		return work_at(s, off);
	return s->rot[(t + 2) % 2] + (off - s->boff[b]) * s->esize;
}

/* First touch of a segment in reduce-scatter: bring in this rank's data. */
static void stream_load_own(const struct ring_stream *s, char *dst, size_t off, size_t len)
{
	const char *from = src_at(s, off);
	if (!from)
		return;
	if (from != dst || s->prescale != 1.0)
		kolo_scale(dst, from, len, s->dtype, s->prescale);
}

/* Out of place without a prescale, this rank's data is read straight from
 * src: the step-0 block is sent from there (work's copy of that block is
 * only ever written, by the allgather), and each reduction reads src and the
 * received segment and writes work, so no byte of src is copied first. */
static bool reads_src(const struct ring_stream *s, size_t off)
{
	if (s->prescale != 1.0)
		return false;
	if (s->pieces) {
		size_t in;
		const struct kolo_ring_piece *p = piece_at(s, off, &in);
		return p->send != p->recv;
	}
	return s->src && (s->rot[0] || s->src != s->work);
}

/* Receives first, so the next segments arrive while we reduce. */
static kolo_status_t post_recvs(struct stream_run *run)
{
	const struct ring_stream *s = run->s;
	struct kolo_ring_comm *rc = run->rc;
	const int n = rc->size;
	const size_t K = s->nseg;
	while (run->rposted < run->units && run->rposted < run->done + RING_RECV_WINDOW) {
		size_t step = run->rposted / K, k = run->rposted % K, off, len;
		/* An allgather receive overwrites a block sent n steps before:
		 * that send must be complete. */
		if (step + 1 >= (size_t)n && (step + 1 - n) * K + k >= run->sdone)
			break;
		seg_range(s, ring_wrap(rc->rank + s->shift - (long)step - 1, n), k, &off, &len);
		char *dst =
		        step < (size_t)s->nrs
		                ? rc->scratch + (run->rposted % RING_RECV_WINDOW) * run->segbytes
		                : work_at(s, off);
		kolo_status_t st = kolo_irecv(run->left, dst, len * s->esize,
		                              &run->rreq[run->rposted % RING_RECV_WINDOW]);
		if (st != KOLO_OK)
			return ring_peer_fail(rc, st, run->left_peer, "receiving from");
		run->rposted++;
	}
	return KOLO_OK;
}

/* A send of step > 0 waits for the same segment of the step before. */
static kolo_status_t post_sends(struct stream_run *run)
{
	const struct ring_stream *s = run->s;
	struct kolo_ring_comm *rc = run->rc;
	const size_t K = s->nseg;
	while (run->sposted < run->units && run->sposted < run->done + K &&
	       !run->sreq[run->sposted % RING_SEND_WINDOW]) {
		size_t step = run->sposted / K, k = run->sposted % K, off, len;
		int b = ring_wrap(rc->rank + s->shift - (long)step, rc->size);
		seg_range(s, b, k, &off, &len);
		const char *from = stream_block_at(s, (long)step - 1, b, off);
		if (step == 0 && s->nrs > 0) {
			if (reads_src(s, off))
				from = src_at(s, off);
			else
				stream_load_own(s, (char *)from, off, len);
		}
		kolo_status_t st = kolo_isend(run->right, from, len * s->esize,
		                              &run->sreq[run->sposted % RING_SEND_WINDOW]);
		if (st != KOLO_OK)
			return ring_peer_fail(rc, st, run->right_peer, "sending to");
		run->sposted++;
	}
	return KOLO_OK;
}

/* Reduces the received segment of unit `done` (an RS step) into its block. */
static void reduce_segment(struct stream_run *run)
{
	const struct ring_stream *s = run->s;
	struct kolo_ring_comm *rc = run->rc;
	const size_t step = run->done / s->nseg, k = run->done % s->nseg;
	size_t off, len;
	int b = ring_wrap(rc->rank + s->shift - (long)step - 1, rc->size);
	seg_range(s, b, k, &off, &len);
	char *dst = stream_block_at(s, (long)step, b, off);
	const char *in = rc->scratch + (run->done % RING_RECV_WINDOW) * run->segbytes;
	if (reads_src(s, off)) {
		kolo_reduce3(dst, src_at(s, off), in, len, s->dtype, s->op);
	} else {
		stream_load_own(s, dst, off, len);
		kolo_reduce(dst, in, len, s->dtype, s->op);
	}
	if (step + 1 == (size_t)s->nrs && s->postscale != 1.0)
		kolo_scale(dst, dst, len, s->dtype, s->postscale);
}

/* Once the left neighbour's description has arrived, fails the comm unless it
 * is this rank's: nothing it sent is reduced or stored before. */
static kolo_status_t check_desc(struct stream_run *run, bool *progressed)
{
	struct kolo_ring_comm *rc = run->rc;
	KOLO_CHECK(ring_poll_req(rc, &run->drecv, run->left_peer, "receiving from", progressed));
	if (run->drecv)
		return KOLO_OK;
	const struct ring_stream_desc *a = &rc->stream_desc[1], *b = &rc->stream_desc[0];
	if (a->total != b->total || a->units != b->units || a->dtype != b->dtype ||
	    a->op != b->op || a->nrs != b->nrs || a->nag != b->nag)
		return ring_fail(
		        rc, KOLO_EMISMATCH,
		        "rank %d runs this collective over %llu elements of %s (%llu "
		        "segments in %u+%u steps, %s) where this rank has %llu of %s (%llu in "
		        "%u+%u, %s): every rank must pass the same count, dtype and op, and "
		        "the same kind of memory (host or device) to one blocking collective",
		        ring_global_rank(rc, run->left_peer), (unsigned long long)a->total,
		        kolo_dtype_name((kolo_dtype_t)a->dtype), (unsigned long long)a->units,
		        a->nrs, a->nag, kolo_op_name((kolo_op_t)a->op),
		        (unsigned long long)b->total, kolo_dtype_name((kolo_dtype_t)b->dtype),
		        (unsigned long long)b->units, b->nrs, b->nag,
		        kolo_op_name((kolo_op_t)b->op));
	run->checked = true;
	return KOLO_OK;
}

/* Tests the oldest receive; once it is complete, reduces it (RS steps) and
 * counts it done. */
static kolo_status_t finish_recv(struct stream_run *run, bool *progressed)
{
	const struct ring_stream *s = run->s;
	const size_t K = s->nseg;
	if (!run->checked)
		KOLO_CHECK(check_desc(run, progressed));
	if (!run->checked)
		return KOLO_OK;
	/* With rotating buffers, RS step t overwrites the block of step
	 * t - 2, which step t - 1 sends: that send must be complete. */
	bool hold = s->rot[0] && run->done / K >= 1 && run->sdone <= run->done - K;
	if (run->done >= run->rposted || hold)
		return KOLO_OK;
	struct kolo_req **req = &run->rreq[run->done % RING_RECV_WINDOW];
	KOLO_CHECK(ring_poll_req(run->rc, req, run->left_peer, "receiving from", progressed));
	if (*req)
		return KOLO_OK;
	if (run->done / K < (size_t)s->nrs)
		reduce_segment(run);
	run->done++;
	return KOLO_OK;
}

/* Fills boff/blen from counts, points s at them and picks the segmentation. */
static void stream_layout(struct kolo_ring_comm *rc, struct ring_stream *s, const size_t *counts,
                          size_t *boff, size_t *blen)
{
	size_t off = 0, maxlen = 0;
	for (int i = 0; i < rc->size; i++) {
		boff[i] = off;
		blen[i] = counts[i];
		off += counts[i];
		maxlen = KOLO_MAX(maxlen, counts[i]);
	}
	size_t per = KOLO_MAX(rc->cfg.segment_bytes / s->esize, 1);
	s->boff = boff;
	s->blen = blen;
	s->nseg = KOLO_MAX((maxlen + per - 1) / per, 1);
	s->seg_elems = (maxlen + s->nseg - 1) / s->nseg;
}

/* Pieces: cuts each block into the same number of segments, none spanning two
 * pieces and none longer than per elements (the largest piece of a block
 * takes the segments a block with fewer pieces has spare). Every rank cuts
 * alike. */
static kolo_status_t stream_cut_pieces(struct kolo_ring_comm *rc, struct ring_stream *s, size_t per,
                                       size_t **cuts_out)
{
	const int n = rc->size;
	size_t K = 1;
	for (int b = 0; b < n; b++) {
		size_t lo = s->boff[b], hi = lo + s->blen[b], need = 0;
		for (size_t p = 0; p < s->npieces; p++) {
			size_t a = KOLO_MAX(lo, s->piece_off[p]),
			       z = KOLO_MIN(hi, s->piece_off[p + 1]);
			if (a < z)
				need += (z - a + per - 1) / per;
		}
		K = KOLO_MAX(K, need);
	}
	size_t *cuts = calloc((size_t)n * (K + 1), sizeof(size_t));
	if (!cuts)
		return ring_fail(rc, KOLO_ENOMEM, "out of memory");
	size_t most = 0;
	for (int b = 0; b < n; b++) {
		size_t lo = s->boff[b], hi = lo + s->blen[b], need = 0, big = 0, biglen = 0;
		for (size_t p = 0; p < s->npieces; p++) {
			size_t a = KOLO_MAX(lo, s->piece_off[p]),
			       z = KOLO_MIN(hi, s->piece_off[p + 1]);
			if (a >= z)
				continue;
			need += (z - a + per - 1) / per;
			if (z - a > biglen) {
				biglen = z - a;
				big = p;
			}
		}
		size_t *c = cuts + (size_t)b * (K + 1), k = 0;
		c[0] = lo;
		for (size_t p = 0; p < s->npieces; p++) {
			size_t a = KOLO_MAX(lo, s->piece_off[p]),
			       z = KOLO_MIN(hi, s->piece_off[p + 1]);
			if (a >= z)
				continue;
			size_t m = (z - a + per - 1) / per + (p == big ? K - need : 0);
			for (size_t j = 1; j <= m; j++) {
				c[k + j] = a + (z - a) * j / m;
				most = KOLO_MAX(most, c[k + j] - c[k + j - 1]);
			}
			k += m;
		}
		for (; k < K; k++) /* an empty block: empty segments */
			c[k + 1] = hi;
	}
	s->nseg = K;
	s->seg_elems = most;
	s->cuts = cuts;
	*cuts_out = cuts;
	return KOLO_OK;
}

/* Sets run up to move s, whose layout is set. */
static kolo_status_t run_init(struct stream_run *run, struct kolo_ring_comm *rc,
                              const struct ring_stream *s)
{
	const int n = rc->size, r = rc->rank;
	*run = (struct stream_run){
	        .rc = rc,
	        .s = s,
	        .left_peer = ring_wrap(r - 1, n),
	        .right_peer = ring_wrap(r + 1, n),
	        .units = (size_t)(s->nrs + s->nag) * s->nseg,
	        .segbytes = s->seg_elems * s->esize,
	};
	if (s->nrs > 0)
		KOLO_CHECK(ring_scratch_reserve(rc, RING_RECV_WINDOW * KOLO_MAX(run->segbytes, 1)));
	run->left = rc->conns[run->left_peer];
	run->right = rc->conns[run->right_peer];
	size_t total = 0;
	for (int i = 0; i < n; i++)
		total += s->blen[i];
	rc->stream_desc[0] = (struct ring_stream_desc){.total = total,
	                                               .units = run->units,
	                                               .dtype = (uint32_t)s->dtype,
	                                               .op = s->nrs > 0 ? (uint32_t)s->op : 0,
	                                               .nrs = (uint32_t)s->nrs,
	                                               .nag = (uint32_t)s->nag};
	/* Posted before any segment: each conn delivers in order. */
	kolo_status_t st =
	        kolo_irecv(run->left, &rc->stream_desc[1], sizeof(rc->stream_desc[1]), &run->drecv);
	if (st != KOLO_OK)
		return ring_peer_fail(rc, st, run->left_peer, "receiving from");
	st = kolo_isend(run->right, &rc->stream_desc[0], sizeof(rc->stream_desc[0]), &run->dsend);
	if (st != KOLO_OK)
		return ring_peer_fail(rc, st, run->right_peer, "sending to");
	return KOLO_OK;
}

/* One polling pass; *progressed when a request completed. */
static kolo_status_t run_pass(struct stream_run *run, bool *progressed)
{
	if (run->dsend)
		KOLO_CHECK(ring_poll_req(run->rc, &run->dsend, run->right_peer, "sending to",
		                         progressed));
	KOLO_CHECK(post_recvs(run));
	KOLO_CHECK(post_sends(run));
	KOLO_CHECK(finish_recv(run, progressed));
	return ring_test_sends(run->rc, run->sreq, &run->sdone, run->sposted, run->right_peer,
	                       progressed);
}

static bool run_finished(const struct stream_run *run)
{
	return run->checked && !run->dsend && run->done >= run->units && run->sdone >= run->units;
}

/* After a timeout, the peer this run waits for. */
static kolo_status_t run_blame(const struct stream_run *run, kolo_status_t st)
{
	return ring_blame(run->rc, st, run->done < run->units ? run->left_peer : run->right_peer);
}

/* Runs s, whose layout is set, to the end. */
static kolo_status_t run_laid_out(struct kolo_ring_comm *rc, const struct ring_stream *s)
{
	struct stream_run run;
	KOLO_CHECK(run_init(&run, rc, s));
	struct ring_waiter w;
	ring_waiter_init(&w);
	w.peer = run.left_peer;
	while (!run_finished(&run)) {
		bool progressed = false;
		KOLO_CHECK(run_pass(&run, &progressed));
		kolo_status_t st = ring_idle(rc, &w, progressed, "in the ring");
		if (st != KOLO_OK)
			return run_blame(&run, st);
	}
	return KOLO_OK;
}

kolo_status_t ring_stream_run(struct kolo_ring_comm *rc, struct ring_stream *s,
                              const size_t *counts, size_t count)
{
	const int n = rc->size;
	size_t *layout = calloc(3 * (size_t)n, sizeof(size_t)); /* boff, blen, counts */
	if (!layout)
		return ring_fail(rc, KOLO_ENOMEM, "out of memory");
	if (!counts) {
		for (int i = 0; i < n; i++)
			layout[2 * n + i] = kolo_reducescatter_count(count, n, i);
		counts = layout + 2 * n;
	}
	stream_layout(rc, s, counts, layout, layout + n);
	size_t *cuts = NULL;
	kolo_status_t st = KOLO_OK;
	if (s->pieces)
		st = stream_cut_pieces(rc, s, KOLO_MAX(rc->cfg.segment_bytes / s->esize, 1), &cuts);
	if (st == KOLO_OK)
		st = run_laid_out(rc, s);
	free(cuts);
	free(layout);
	s->boff = s->blen = s->cuts = NULL;
	return st;
}

/* A stream moved by its caller: the run and the layout it points s at. */
struct ring_stream_run {
	struct stream_run run;
	struct ring_stream *s;
	size_t layout[]; /* boff, blen, counts: 3 n */
};

kolo_status_t ring_stream_start(struct kolo_ring_comm *rc, struct ring_stream *s,
                                const size_t *counts, size_t count, struct ring_stream_run **out)
{
	const int n = rc->size;
	*out = NULL;
	if (s->pieces) /* their cuts live in ring_stream_run */
		return ring_fail(rc, KOLO_EINVAL,
		                 "a stream of pieces cannot be moved by its caller");
	struct ring_stream_run *sr = calloc(1, sizeof(*sr) + 3 * (size_t)n * sizeof(size_t));
	if (!sr)
		return ring_fail(rc, KOLO_ENOMEM, "out of memory");
	if (!counts) {
		for (int i = 0; i < n; i++)
			sr->layout[2 * n + i] = kolo_reducescatter_count(count, n, i);
		counts = sr->layout + 2 * n;
	}
	sr->s = s;
	stream_layout(rc, s, counts, sr->layout, sr->layout + n);
	kolo_status_t st = run_init(&sr->run, rc, s);
	if (st != KOLO_OK) {
		ring_stream_end(sr);
		return st;
	}
	*out = sr;
	return KOLO_OK;
}

kolo_status_t ring_stream_pass(struct ring_stream_run *sr, bool *progressed, bool *finished)
{
	kolo_status_t st = run_pass(&sr->run, progressed);
	*finished = st == KOLO_OK && run_finished(&sr->run);
	return st;
}

kolo_status_t ring_stream_blame(const struct ring_stream_run *sr, kolo_status_t st)
{
	return run_blame(&sr->run, st);
}

void ring_stream_end(struct ring_stream_run *sr)
{
	if (!sr)
		return;
	sr->s->boff = sr->s->blen = NULL;
	free(sr);
}
