/* The pipelined hierarchical allreduce: the buffer is cut into K chunks,
 * and while the cross comm allreduces chunk k over the network, the local
 * comm allgathers chunk k - 1 and reduce-scatters chunk k + 1 through shared
 * memory. docs/hierarchical.md ("Pipelining") describes it and its cost.
 *
 * One thread moves both comms (core/transport.h: one thread drives a
 * transport, and the local and cross comms share the hybrid one), so every
 * stage is a ring_stream_run polled in one loop. A comm runs one stream at a
 * time, because the n-th receive of a conn matches the n-th send of the
 * peer: every rank must post the streams of one comm in the same order. The
 * local comm's order is fixed (SEQ below); the cross comm runs chunks in
 * order. Stage dependencies follow the chunks forward, so no rank can wait
 * on one that waits on it.
 *
 * Results: each chunk is an allreduce by the hierarchy of ring/hier.c, with
 * its own blocks, so every rank still ends with identical bits (the bits
 * differ from the unpipelined hierarchy's: the blocks, hence the orders of
 * reduction, differ). */
#include <stdlib.h>

#include "ring_internal.h"

enum stage { RS, AG };

struct pipe {
	struct kolo_ring_comm *local, *cross;
	const char *src;
	char *dst;
	size_t es, count, K;
	kolo_dtype_t dtype;
	kolo_op_t op;
	double prescale, postscale;
	int L, l, H;
	size_t *bcounts; /* L: the blocks of the chunk being laid out */
	/* the local comm: position in SEQ and its stream */
	size_t lnext;
	struct ring_stream ls;
	struct ring_stream_run *lrun;
	enum stage lstage;
	size_t lchunk;
	/* the cross comm */
	size_t ar_next; /* the next chunk to allreduce, or the one running */
	struct ring_stream cs;
	struct ring_stream_run *crun;
	size_t rs_done, ar_done, ag_done; /* chunks through each stage (in order) */
	struct kolo_ring_comm *failed;
};

/* The local comm's op i of 2K: RS(0), RS(1), AG(0), RS(2), AG(1), ...,
 * RS(K-1), AG(K-2), AG(K-1). While the cross comm allreduces chunk k, the
 * local comm allgathers k - 1 and then reduce-scatters k + 1, so the next
 * cross allreduce can start as soon as this one ends. */
static void seq(size_t K, size_t i, enum stage *st, size_t *chunk)
{
	if (i == 0) {
		*st = RS;
		*chunk = 0;
	} else if (i == 2 * K - 1) {
		*st = AG;
		*chunk = K - 1;
	} else if (i % 2 == 1) {
		*st = RS;
		*chunk = (i + 1) / 2;
	} else {
		*st = AG;
		*chunk = i / 2 - 1;
	}
}

static void chunk_range(const struct pipe *p, size_t c, size_t *off, size_t *cnt)
{
	/* The first count % K chunks hold one more element. */
	size_t base = p->count / p->K, extra = p->count % p->K;
	*off = c * base + KOLO_MIN(c, extra);
	*cnt = base + (c < extra ? 1 : 0);
}

/* Fills bcounts with chunk c's blocks; returns the element offset (in the
 * chunk) and count of this rank's block. */
static size_t lay_chunk(struct pipe *p, size_t cnt, size_t *mine)
{
	size_t before = 0;
	for (int i = 0; i < p->L; i++) {
		p->bcounts[i] = kolo_reducescatter_count(cnt, p->L, i);
		if (i < p->l)
			before += p->bcounts[i];
	}
	*mine = p->bcounts[p->l];
	return before;
}

static void fail_on(struct pipe *p, struct kolo_ring_comm *rc)
{
	if (!p->failed)
		p->failed = rc;
}

/* Starts the local comm's next op when its inputs are ready; an op with
 * nothing to send (L = 1) completes at once. */
static kolo_status_t local_start(struct pipe *p, bool *progressed)
{
	while (!p->lrun && p->lnext < 2 * p->K) {
		enum stage stg;
		size_t c, off, cnt, mine;
		seq(p->K, p->lnext, &stg, &c);
		if (stg == AG && p->ar_done <= c)
			return KOLO_OK;
		chunk_range(p, c, &off, &cnt);
		p->lnext++;
		*progressed = true;
		if (p->L == 1) {
			if (stg == RS) {
				kolo_scale(p->dst + off * p->es, p->src + off * p->es, cnt,
				           p->dtype, p->prescale);
				p->rs_done = c + 1;
			} else {
				p->ag_done = c + 1;
			}
			continue;
		}
		lay_chunk(p, cnt, &mine);
		p->lstage = stg;
		p->lchunk = c;
		if (stg == RS) {
			p->local->coll = "reducescatter";
			p->ls = (struct ring_stream){
			        .work = p->dst + off * p->es,
			        .src = p->src + off * p->es,
			        .prescale = p->prescale,
			        .postscale = 1.0,
			        .esize = p->es,
			        .dtype = p->dtype,
			        .op = p->op,
			        .nrs = p->L - 1,
			        .shift = -1, /* the last step leaves block l reduced */
			};
		} else {
			/* Block l is in place: the reduce-scatter left it there and
			 * the cross allreduce works on it in place. */
			p->local->coll = "allgatherv";
			p->ls = (struct ring_stream){
			        .work = p->dst + off * p->es,
			        .esize = p->es,
			        .dtype = p->dtype,
			        .nag = p->L - 1,
			};
		}
		kolo_status_t st = ring_stream_start(p->local, &p->ls, p->bcounts, 0, &p->lrun);
		if (st != KOLO_OK) {
			fail_on(p, p->local);
			return st;
		}
	}
	return KOLO_OK;
}

/* Starts the cross allreduce of the next chunk once its reduce-scatter is
 * done; a chunk whose block is empty here is empty on every rank of the
 * cross comm (they share the local rank), and H = 1 needs no network. */
static kolo_status_t cross_start(struct pipe *p, bool *progressed)
{
	while (!p->crun && p->ar_next < p->K && p->rs_done > p->ar_next) {
		size_t c = p->ar_next, off, cnt, mine;
		chunk_range(p, c, &off, &cnt);
		size_t boff = lay_chunk(p, cnt, &mine);
		char *blk = p->dst + (off + boff) * p->es;
		*progressed = true;
		if (p->H == 1 || mine == 0) {
			if (p->postscale != 1.0)
				kolo_scale(blk, blk, mine, p->dtype, p->postscale);
			p->ar_done = ++p->ar_next;
			continue;
		}
		p->cross->coll = "allreduce";
		p->cs = (struct ring_stream){
		        .work = blk,
		        .src = blk,
		        .prescale = 1.0,
		        .postscale = p->postscale,
		        .esize = p->es,
		        .dtype = p->dtype,
		        .op = p->op,
		        .nrs = p->H - 1,
		        .nag = p->H - 1,
		};
		kolo_status_t st = ring_stream_start(p->cross, &p->cs, NULL, mine, &p->crun);
		if (st != KOLO_OK) {
			fail_on(p, p->cross);
			return st;
		}
	}
	return KOLO_OK;
}

static kolo_status_t local_poll(struct pipe *p, bool *progressed)
{
	if (!p->lrun)
		return KOLO_OK;
	bool fin = false;
	kolo_status_t st = ring_stream_pass(p->lrun, progressed, &fin);
	if (st != KOLO_OK) {
		fail_on(p, p->local);
		return st;
	}
	if (fin) {
		ring_stream_end(p->lrun);
		p->lrun = NULL;
		if (p->lstage == RS)
			p->rs_done = p->lchunk + 1;
		else
			p->ag_done = p->lchunk + 1;
		*progressed = true;
	}
	return KOLO_OK;
}

static kolo_status_t cross_poll(struct pipe *p, bool *progressed)
{
	if (!p->crun)
		return KOLO_OK;
	bool fin = false;
	kolo_status_t st = ring_stream_pass(p->crun, progressed, &fin);
	if (st != KOLO_OK) {
		fail_on(p, p->cross);
		return st;
	}
	if (fin) {
		ring_stream_end(p->crun);
		p->crun = NULL;
		p->ar_done = ++p->ar_next;
		*progressed = true;
	}
	return KOLO_OK;
}

static kolo_status_t pipe_run(struct pipe *p)
{
	struct ring_waiter w;
	ring_waiter_init(&w);
	while (p->ag_done < p->K) {
		bool progressed = false;
		KOLO_CHECK(local_start(p, &progressed));
		KOLO_CHECK(cross_start(p, &progressed));
		KOLO_CHECK(cross_poll(p, &progressed));
		KOLO_CHECK(local_poll(p, &progressed));
		/* Idle on the comm whose stream is running (the cross one when
		 * both are: either wakes the shared transport's wait); a
		 * timeout names the peer that stream waits for. */
		struct kolo_ring_comm *rc = p->crun || !p->lrun ? p->cross : p->local;
		struct ring_stream_run *run = p->crun ? p->crun : p->lrun;
		kolo_status_t st = ring_idle(rc, &w, progressed, "in the pipelined hierarchy");
		if (st != KOLO_OK) {
			fail_on(p, rc);
			return run ? ring_stream_blame(run, st) : st;
		}
	}
	return KOLO_OK;
}

kolo_status_t ring_hier_pipeline(struct kolo_ring_comm *local, struct kolo_ring_comm *cross,
                                 const void *sendbuf, void *recvbuf, size_t count,
                                 kolo_dtype_t dtype, kolo_op_t op, double prescale,
                                 double postscale, size_t chunks, struct kolo_ring_comm **failed)
{
	struct pipe p = {
	        .local = local,
	        .cross = cross,
	        .src = sendbuf,
	        .dst = recvbuf,
	        .es = kolo_dtype_size(dtype),
	        .count = count,
	        .K = KOLO_MAX(KOLO_MIN(chunks, count), 1),
	        .dtype = dtype,
	        .op = op,
	        .prescale = prescale,
	        .postscale = postscale,
	        .L = kolo_ring_comm_size(local),
	        .l = kolo_ring_comm_rank(local),
	        .H = kolo_ring_comm_size(cross),
	};
	kolo_status_t st = ring_enter(local, "allreduce", dtype);
	if (st != KOLO_OK) {
		*failed = local;
		return st;
	}
	if ((st = ring_enter(cross, "allreduce", dtype)) != KOLO_OK) {
		*failed = cross;
		return st;
	}
	p.bcounts = calloc((size_t)p.L, sizeof(size_t));
	if (!p.bcounts) {
		*failed = local;
		return ring_fail(local, KOLO_ENOMEM, "out of memory");
	}
	st = pipe_run(&p);
	/* After a failure the failed comm's conns are closed, and the caller
	 * fails the other comm, which releases the requests of its run. */
	ring_stream_end(p.lrun);
	ring_stream_end(p.crun);
	free(p.bcounts);
	*failed = p.failed ? p.failed : local;
	return st;
}
