/* The collectives over the transport contract. See docs/collectives.md for
 * the algorithms, their costs and the thresholds between them.
 *
 * Conns: one per peer (tag KOLO_RING_TAG), duplex, cached for the comm's
 * life. The lower rank of a pair connects and the higher one accepts; a
 * collective first starts every connect it needs and only then waits in
 * accept, so two ranks never wait on each other. Ring neighbours are
 * connected by create; other peers on first use.
 *
 * Waiting: every loop polls its requests with test(), spins for
 * cfg.spin_us without progress, then blocks in the transport's wait() for at
 * most WAIT_SLICE_MS and checks for abort. On any failure every conn is
 * closed with a reset (so the peers fail fast too, and no request keeps
 * pointing into a caller's buffer) and the comm stays failed. */
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ring.h"

#define SUBSYS        "ring"
#define RECV_WINDOW   4 /* receives in flight, and scratch segments of a reduction */
#define SEND_WINDOW   4 /* sends in flight in a pipelined pass */
#define WAIT_SLICE_MS 50

struct kolo_ring_comm {
	struct kolo_ring_config cfg;
	struct kolo_transport *t;
	int rank, size;
	struct kolo_conn **conns; /* by peer rank; NULL until connected */
	atomic_int status;        /* KOLO_OK, or what every later call returns */
	atomic_int aborted;       /* the status given to kolo_ring_abort */
	atomic_int failed_peer;   /* the peer of the first conn failure, or -1 */
	const char *coll;         /* the collective running, for messages */
	struct kolo_errbuf err;
	char *scratch; /* receive segments; the buffer of recursive doubling */
	size_t scratch_size;
	char *work; /* reducescatter's working copy, kept for the next call */
	size_t work_size;
	int *gmap;                   /* sub-comm: global rank of each member; NULL: identity */
	int tag;                     /* transport tag of every conn of this comm */
	struct kolo_ring_hier *hier; /* hierarchical allreduce; NULL when not enabled */
};

/* The transport's (global) rank of member i. */
static int gr(const struct kolo_ring_comm *rc, int i)
{
	return rc->gmap ? rc->gmap[i] : i;
}

/* ---- failure ---------------------------------------------------------- */

static void close_all(struct kolo_ring_comm *rc)
{
	for (int i = 0; i < rc->size; i++) {
		if (rc->conns[i]) {
			rc->t->ops->close(rc->conns[i]);
			rc->conns[i] = NULL;
		}
	}
}

/* Marks the comm failed with st (the first failure wins), records the
 * message and closes every conn. Returns the comm's status. */
__attribute__((format(printf, 3, 4))) static kolo_status_t
fail(struct kolo_ring_comm *rc, kolo_status_t st, const char *fmt, ...)
{
	int expected = KOLO_OK;
	if (atomic_compare_exchange_strong(&rc->status, &expected, (int)st)) {
		char msg[KOLO_ERRBUF_SIZE - 128]; /* room for the prefix */
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(msg, sizeof(msg), fmt, ap);
		va_end(ap);
		snprintf(rc->err.msg, sizeof(rc->err.msg), "%.32s on rank %d: %s (%.20s)", rc->coll,
		         gr(rc, rc->rank), msg, kolo_status_name(st));
		KOLO_WARN(SUBSYS, "%s", rc->err.msg);
		close_all(rc);
	}
	return (kolo_status_t)atomic_load(&rc->status);
}

static kolo_status_t peer_fail(struct kolo_ring_comm *rc, kolo_status_t st, int peer,
                               const char *what)
{
	if (atomic_load(&rc->aborted) != KOLO_OK)
		return fail(rc, st, "aborted while %s rank %d", what, gr(rc, peer));
	if (atomic_load(&rc->status) == KOLO_OK) {
		int none = -1;
		atomic_compare_exchange_strong(&rc->failed_peer, &none, gr(rc, peer));
	}
	return fail(rc, st, "%s rank %d: %s", what, gr(rc, peer),
	            rc->t->err.msg[0] ? rc->t->err.msg : kolo_strerror(st));
}

/* After a timeout (st), names peer as the one that went silent, unless the
 * comm was aborted or another peer was named first. Returns st. */
static kolo_status_t blame(struct kolo_ring_comm *rc, kolo_status_t st, int peer)
{
	if (st == KOLO_ETIMEDOUT && atomic_load(&rc->aborted) == KOLO_OK) {
		int none = -1;
		atomic_compare_exchange_strong(&rc->failed_peer, &none, gr(rc, peer));
	}
	return st;
}

/* ---- waiting ---------------------------------------------------------- */

struct waiter {
	uint64_t idle_since_ns;
	uint64_t progress_ns;
};

static void waiter_init(struct waiter *w)
{
	w->idle_since_ns = w->progress_ns = kolo_now_ns();
}

/* Called once per polling pass: spins while the pass made progress or the
 * spin time has not run out, else blocks in the transport for a slice. */
static kolo_status_t idle(struct kolo_ring_comm *rc, struct waiter *w, bool progressed,
                          const char *what)
{
	int ab = atomic_load(&rc->aborted);
	if (ab != KOLO_OK)
		return fail(rc, (kolo_status_t)ab, "aborted while %s", what);
	uint64_t now = kolo_now_ns();
	if (progressed) {
		w->idle_since_ns = w->progress_ns = now;
		return KOLO_OK;
	}
	if (now - w->idle_since_ns < (uint64_t)rc->cfg.spin_us * 1000u) {
		/* More ranks than CPUs here: the peer we wait for may need this
		 * CPU to make the progress we wait for. */
		if (rc->cfg.spin_yield)
			sched_yield();
		return KOLO_OK;
	}
	uint64_t waited_ms = (now - w->progress_ns) / 1000000u;
	int slice = WAIT_SLICE_MS;
	if (rc->cfg.timeout_ms > 0) {
		if (waited_ms >= (uint64_t)rc->cfg.timeout_ms)
			return fail(rc, KOLO_ETIMEDOUT, "no progress for %d ms while %s",
			            rc->cfg.timeout_ms, what);
		slice = (int)KOLO_MIN((uint64_t)slice, rc->cfg.timeout_ms - waited_ms);
	}
	kolo_status_t st = rc->t->ops->wait(rc->t, KOLO_MAX(slice, 1));
	if (st != KOLO_OK)
		return fail(rc, st, "transport wait failed while %s", what);
	return KOLO_OK;
}

/* Tests *req (NULL means complete). Sets *progressed when it completes. */
static kolo_status_t poll_req(struct kolo_ring_comm *rc, struct kolo_req **req, int peer,
                              const char *what, bool *progressed)
{
	if (!*req)
		return KOLO_OK;
	bool done = false;
	kolo_status_t st = rc->t->ops->test(*req, &done);
	if (st != KOLO_OK) {
		*req = NULL;
		return peer_fail(rc, st, peer, what);
	}
	if (done) {
		*req = NULL;
		*progressed = true;
	}
	return KOLO_OK;
}

/* Waits for every request in reqs (peers[i] names the peer of reqs[i]). */
static kolo_status_t wait_all(struct kolo_ring_comm *rc, struct kolo_req **reqs, const int *peers,
                              int n)
{
	struct waiter w;
	waiter_init(&w);
	for (;;) {
		bool progressed = false, pending = false;
		for (int i = 0; i < n; i++) {
			KOLO_CHECK(
			        poll_req(rc, &reqs[i], peers[i], "exchanging with", &progressed));
			pending |= reqs[i] != NULL;
		}
		if (!pending)
			return KOLO_OK;
		kolo_status_t st = idle(rc, &w, progressed, "waiting for peers");
		if (st == KOLO_ETIMEDOUT && atomic_load(&rc->aborted) == KOLO_OK) {
			/* A silent peer: name the first one we still wait for. */
			for (int i = 0; i < n; i++) {
				int none = -1;
				if (reqs[i]) {
					atomic_compare_exchange_strong(&rc->failed_peer, &none,
					                               gr(rc, peers[i]));
					break;
				}
			}
		}
		if (st != KOLO_OK)
			return st;
	}
}

/* Sends sbuf (when not NULL) to and receives into rbuf (when not NULL) from
 * peer, and waits for both. */
static kolo_status_t exchange(struct kolo_ring_comm *rc, int peer, const void *sbuf, size_t slen,
                              void *rbuf, size_t rlen)
{
	struct kolo_req *reqs[2];
	int peers[2] = {peer, peer}, n = 0;
	kolo_status_t st;
	if (rbuf && (st = kolo_irecv(rc->conns[peer], rbuf, rlen, &reqs[n++])) != KOLO_OK)
		return peer_fail(rc, st, peer, "receiving from");
	if (sbuf && (st = kolo_isend(rc->conns[peer], sbuf, slen, &reqs[n++])) != KOLO_OK)
		return peer_fail(rc, st, peer, "sending to");
	return wait_all(rc, reqs, peers, n);
}

/* ---- conns ------------------------------------------------------------ */

/* Sends a zero-byte message to and receives one from each of peers[0..n),
 * all at once, and waits. */
static kolo_status_t hello(struct kolo_ring_comm *rc, const int *peers, int n)
{
	static char dummy;
	struct kolo_req **reqs = calloc(2 * (size_t)n, sizeof(*reqs));
	int *rp = calloc(2 * (size_t)n, sizeof(*rp)), nr = 0;
	kolo_status_t st = KOLO_OK;
	if (!reqs || !rp) {
		st = fail(rc, KOLO_ENOMEM, "out of memory");
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
			st = peer_fail(rc, st, peers[i], "greeting");
	}
	if (st == KOLO_OK)
		st = wait_all(rc, reqs, rp, nr);
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
static kolo_status_t ensure_conns(struct kolo_ring_comm *rc, const int *peers, int n)
{
	if (n == 0)
		return KOLO_OK;
	const struct kolo_transport_ops *ops = rc->t->ops;
	int *fresh = calloc((size_t)n, sizeof(*fresh)), nfresh = 0;
	kolo_status_t st = KOLO_OK;
	if (!fresh)
		return fail(rc, KOLO_ENOMEM, "out of memory");
	for (int i = 0; i < n; i++) {
		int p = peers[i];
		if (p == rc->rank || rc->conns[p] || p < rc->rank)
			continue;
		struct kolo_transport_handle h;
		st = rc->cfg.lookup(rc->cfg.lookup_ctx, gr(rc, p), &h, rc->cfg.timeout_ms);
		if (st != KOLO_OK) {
			st = fail(rc, st, "cannot look up the address of rank %d", gr(rc, p));
			goto out;
		}
		st = ops->connect(rc->t, &h, gr(rc, p), rc->tag, &rc->conns[p]);
		if (st != KOLO_OK) {
			rc->conns[p] = NULL;
			st = peer_fail(rc, st, p, "connecting to");
			goto out;
		}
		fresh[nfresh++] = p;
	}
	for (int i = 0; i < n; i++) {
		int p = peers[i];
		struct waiter w;
		waiter_init(&w);
		bool accepted = false;
		while (p < rc->rank && !rc->conns[p]) {
			st = ops->accept(rc->t, gr(rc, p), rc->tag, &rc->conns[p]);
			if (st != KOLO_OK) {
				rc->conns[p] = NULL;
				st = peer_fail(rc, st, p, "accepting from");
				goto out;
			}
			if (!rc->conns[p] &&
			    (st = idle(rc, &w, false, "waiting for a connection")) != KOLO_OK) {
				blame(rc, st, p);
				goto out;
			}
			accepted = rc->conns[p] != NULL;
		}
		if (accepted)
			fresh[nfresh++] = p;
	}
	if (nfresh)
		st = hello(rc, fresh, nfresh);
out:
	free(fresh);
	return st;
}

static int mod(long a, int n)
{
	long r = a % n;
	return (int)(r < 0 ? r + n : r);
}

static kolo_status_t scratch_reserve(struct kolo_ring_comm *rc, size_t bytes)
{
	if (bytes <= rc->scratch_size)
		return KOLO_OK;
	char *p = realloc(rc->scratch, bytes);
	if (!p)
		return fail(rc, KOLO_ENOMEM, "cannot allocate %zu bytes of scratch", bytes);
	rc->scratch = p;
	rc->scratch_size = bytes;
	return KOLO_OK;
}

/* ---- comm ------------------------------------------------------------- */

kolo_status_t kolo_ring_comm_create(const struct kolo_ring_config *cfg, struct kolo_ring_comm **out,
                                    struct kolo_errbuf *eb)
{
	*out = NULL;
	if (!cfg || cfg->size < 1 || cfg->rank < 0 || cfg->rank >= cfg->size ||
	    (cfg->size > 1 && (!cfg->transport || !cfg->lookup)))
		return kolo_fail(eb, KOLO_EINVAL, "ring: invalid configuration");
	struct kolo_ring_comm *rc = calloc(1, sizeof(*rc));
	if (!rc)
		return kolo_fail(eb, KOLO_ENOMEM, "ring: out of memory");
	rc->cfg = *cfg;
	rc->cfg.ranks = NULL; /* not kept: the copy is gmap */
	rc->tag = KOLO_RING_TAG + cfg->tag_base;
	if (cfg->ranks) {
		if (!(rc->gmap = malloc((size_t)cfg->size * sizeof(*rc->gmap)))) {
			free(rc);
			return kolo_fail(eb, KOLO_ENOMEM, "ring: out of memory");
		}
		memcpy(rc->gmap, cfg->ranks, (size_t)cfg->size * sizeof(*rc->gmap));
	}
	if (rc->cfg.segment_bytes == 0)
		rc->cfg.segment_bytes = 262144;
	if (rc->cfg.spin_us < 0)
		rc->cfg.spin_us = 0;
	rc->t = cfg->transport;
	rc->rank = cfg->rank;
	rc->size = cfg->size;
	atomic_init(&rc->status, KOLO_OK);
	atomic_init(&rc->aborted, KOLO_OK);
	atomic_init(&rc->failed_peer, -1);
	rc->coll = "create";
	rc->conns = calloc((size_t)rc->size, sizeof(*rc->conns));
	if (!rc->conns) {
		free(rc->gmap);
		free(rc);
		return kolo_fail(eb, KOLO_ENOMEM, "ring: out of memory");
	}
	if (rc->size > 1) {
		int nb[2] = {mod(rc->rank - 1, rc->size), mod(rc->rank + 1, rc->size)};
		kolo_status_t st = ensure_conns(rc, nb, 2);
		if (st != KOLO_OK) {
			kolo_fail(eb, st, "%s", rc->err.msg);
			kolo_ring_comm_destroy(rc);
			return st;
		}
	}
	*out = rc;
	return KOLO_OK;
}

void kolo_ring_comm_destroy(struct kolo_ring_comm *rc)
{
	if (!rc)
		return;
	kolo_ring_hier_destroy(rc->hier);
	if (rc->conns)
		close_all(rc);
	free(rc->conns);
	free(rc->gmap);
	free(rc->scratch);
	free(rc->work);
	free(rc);
}

void kolo_ring_comm_tune(struct kolo_ring_comm *rc, size_t small_allreduce_bytes,
                         size_t segment_bytes)
{
	if (!rc)
		return;
	rc->cfg.small_allreduce_bytes = small_allreduce_bytes;
	if (segment_bytes > 0)
		rc->cfg.segment_bytes = segment_bytes;
}

const char *kolo_ring_last_error(const struct kolo_ring_comm *rc)
{
	return rc ? rc->err.msg : "";
}

int kolo_ring_failed_peer(const struct kolo_ring_comm *rc)
{
	return rc ? atomic_load(&rc->failed_peer) : -1;
}

void kolo_ring_abort(struct kolo_ring_comm *rc, kolo_status_t st)
{
	if (!rc)
		return;
	if (st == KOLO_OK)
		st = KOLO_ECLOSED;
	int expected = KOLO_OK;
	atomic_compare_exchange_strong(&rc->aborted, &expected, (int)st);
	kolo_ring_hier_abort(rc->hier, st);
	if (rc->t)
		rc->t->ops->abort(rc->t, st);
}

kolo_status_t kolo_ring_comm_fail(struct kolo_ring_comm *rc, kolo_status_t st, int failed_peer,
                                  const char *msg)
{
	if (!rc)
		return st;
	if (failed_peer >= 0 && atomic_load(&rc->status) == KOLO_OK) {
		int none = -1;
		atomic_compare_exchange_strong(&rc->failed_peer, &none, failed_peer);
	}
	if (st == KOLO_OK)
		st = KOLO_ECLOSED;
	int expected = KOLO_OK;
	if (atomic_compare_exchange_strong(&rc->status, &expected, (int)st)) {
		/* msg already names the collective, the rank and the cause. */
		snprintf(rc->err.msg, sizeof(rc->err.msg), "%s", msg);
		close_all(rc);
	}
	kolo_status_t out = (kolo_status_t)atomic_load(&rc->status);
	kolo_ring_hier_fail(rc->hier, out);
	return out;
}

kolo_status_t kolo_ring_comm_status(const struct kolo_ring_comm *rc)
{
	return rc ? (kolo_status_t)atomic_load(&rc->status) : KOLO_EINVAL;
}

int kolo_ring_comm_rank(const struct kolo_ring_comm *rc)
{
	return rc ? rc->rank : -1;
}

int kolo_ring_comm_size(const struct kolo_ring_comm *rc)
{
	return rc ? rc->size : 0;
}

struct kolo_transport *kolo_ring_comm_transport(const struct kolo_ring_comm *rc)
{
	return rc ? rc->t : NULL;
}

const struct kolo_ring_config *kolo_ring_comm_config(const struct kolo_ring_comm *rc)
{
	return &rc->cfg;
}

enum kolo_ring_algo kolo_ring_allreduce_algo(const struct kolo_ring_comm *rc, size_t bytes)
{
	if (rc->hier)
		return kolo_ring_hier_choose(rc->hier, bytes);
	return bytes <= rc->cfg.small_allreduce_bytes ? KOLO_RING_ALGO_SMALL : KOLO_RING_ALGO_RING;
}

bool kolo_ring_hier_costs(const struct kolo_ring_comm *rc, struct kolo_ring_link_cost *shm,
                          struct kolo_ring_link_cost *net)
{
	return rc && kolo_ring_hier_costs_of(rc->hier, shm, net);
}

void kolo_ring_comm_set_hier(struct kolo_ring_comm *rc, struct kolo_ring_hier *h)
{
	kolo_ring_hier_destroy(rc->hier);
	rc->hier = h;
}

/* An argument error: reported, but the comm stays usable. */
__attribute__((format(printf, 2, 3))) static kolo_status_t bad_arg(struct kolo_ring_comm *rc,
                                                                   const char *fmt, ...)
{
	char msg[KOLO_ERRBUF_SIZE - 64];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	snprintf(rc->err.msg, sizeof(rc->err.msg), "%.32s: %s", rc->coll, msg);
	return KOLO_EINVAL;
}

/* Common entry checks; names the collective for messages. */
static kolo_status_t enter(struct kolo_ring_comm *rc, const char *coll, kolo_dtype_t dtype)
{
	if (!rc)
		return KOLO_EINVAL;
	int st = atomic_load(&rc->status);
	if (st != KOLO_OK)
		return (kolo_status_t)st;
	rc->coll = coll;
	int ab = atomic_load(&rc->aborted);
	if (ab != KOLO_OK)
		return fail(rc, (kolo_status_t)ab, "aborted");
	if (kolo_dtype_size(dtype) == 0)
		return bad_arg(rc, "invalid dtype %d", (int)dtype);
	return KOLO_OK;
}

/* ---- the pipelined ring ----------------------------------------------- */

/* A stream of steps around the ring over n blocks of `work`. At step s a rank
 * sends block (rank + shift - s) to its right and receives block
 * (rank + shift - s - 1) from its left, one segment at a time; the first nrs
 * steps reduce what arrives into the block (reduce-scatter), the rest store
 * it (allgather). A segment is forwarded as soon as it is final, so the
 * pipeline spans all steps. */
struct stream {
	char *work;
	/* Reduce-scatter only (nag == 0), instead of a full-size work: the block
	 * a rank produces at RS step t (t = -1: its prescaled step-0 block) lives
	 * in rot[(t + 2) % 2] until step t + 1 has sent it, so two block-sized
	 * buffers replace a copy of the whole input. */
	char *rot[2];
	const char *src;  /* reduce-scatter: where each block's own data comes from */
	double prescale;  /* applied when src is copied in */
	double postscale; /* applied to each segment the last RS step finishes */
	size_t esize;
	kolo_dtype_t dtype;
	kolo_op_t op;
	const size_t *boff, *blen; /* elements */
	int nrs, nag, shift;
	size_t nseg;      /* segments per block */
	size_t seg_elems; /* most elements in one segment */
};

static void seg_range(const struct stream *s, int b, size_t k, size_t *off, size_t *len)
{
	size_t lo = s->blen[b] * k / s->nseg, hi = s->blen[b] * (k + 1) / s->nseg;
	*off = s->boff[b] + lo;
	*len = hi - lo;
}

/* Where the segment at element offset off of block b lives once RS step t
 * (-1 ≤ t < nrs) has produced it; in work for every block otherwise. */
static char *blk(const struct stream *s, long t, int b, size_t off)
{
	if (!s->rot[0])
		return s->work + off * s->esize;
	return s->rot[(t + 2) % 2] + (off - s->boff[b]) * s->esize;
}

/* First touch of a segment in reduce-scatter: bring in this rank's data. */
static void prep(const struct stream *s, char *dst, size_t off, size_t len)
{
	if (!s->src)
		return;
	const char *from = s->src + off * s->esize;
	if (from != dst || s->prescale != 1.0)
		kolo_scale(dst, from, len, s->dtype, s->prescale);
}

/* Out of place without a prescale, this rank's data is read straight from
 * src: the step-0 block is sent from there (work's copy of that block is
 * only ever written, by the allgather), and each reduction reads src and the
 * received segment and writes work, so no byte of src is copied first. */
static bool reads_src(const struct stream *s)
{
	return s->src && (s->rot[0] || s->src != s->work) && s->prescale == 1.0;
}

static kolo_status_t run_stream(struct kolo_ring_comm *rc, const struct stream *s)
{
	const int n = rc->size, r = rc->rank;
	const int lp = mod(r - 1, n), rp = mod(r + 1, n);
	const size_t K = s->nseg, U = (size_t)(s->nrs + s->nag) * K, es = s->esize;
	const size_t segbytes = s->seg_elems * es;
	if (s->nrs > 0)
		KOLO_CHECK(scratch_reserve(rc, RECV_WINDOW * KOLO_MAX(segbytes, 1)));
	struct kolo_conn *left = rc->conns[lp], *right = rc->conns[rp];
	struct kolo_req *rreq[RECV_WINDOW] = {0}, *sreq[SEND_WINDOW] = {0};
	size_t done = 0, rposted = 0, sposted = 0, sdone = 0;
	struct waiter w;
	waiter_init(&w);
	kolo_status_t st;

	while (done < U || sdone < U) {
		bool progressed = false;
		/* Receives first, so the next segments arrive while we reduce. */
		while (rposted < U && rposted < done + RECV_WINDOW) {
			size_t step = rposted / K, k = rposted % K, off, len;
			/* An allgather receive overwrites a block sent n steps before:
			 * that send must be complete. */
			if (step + 1 >= (size_t)n && (step + 1 - n) * K + k >= sdone)
				break;
			seg_range(s, mod(r + s->shift - (long)step - 1, n), k, &off, &len);
			char *dst = step < (size_t)s->nrs
			                    ? rc->scratch + (rposted % RECV_WINDOW) * segbytes
			                    : s->work + off * es;
			st = kolo_irecv(left, dst, len * es, &rreq[rposted % RECV_WINDOW]);
			if (st != KOLO_OK)
				return peer_fail(rc, st, lp, "receiving from");
			rposted++;
		}
		/* A send of step > 0 waits for the same segment of the step before. */
		while (sposted < U && sposted < done + K && !sreq[sposted % SEND_WINDOW]) {
			size_t step = sposted / K, k = sposted % K, off, len;
			int b = mod(r + s->shift - (long)step, n);
			seg_range(s, b, k, &off, &len);
			const char *from = blk(s, (long)step - 1, b, off);
			if (step == 0 && s->nrs > 0) {
				if (reads_src(s))
					from = s->src + off * es;
				else
					prep(s, (char *)from, off, len);
			}
			st = kolo_isend(right, from, len * es, &sreq[sposted % SEND_WINDOW]);
			if (st != KOLO_OK)
				return peer_fail(rc, st, rp, "sending to");
			sposted++;
		}
		/* With rotating buffers, RS step t overwrites the block of step
		 * t - 2, which step t - 1 sends: that send must be complete. */
		bool hold = s->rot[0] && done / K >= 1 && sdone <= done - K;
		if (done < rposted && !hold) {
			struct kolo_req **req = &rreq[done % RECV_WINDOW];
			KOLO_CHECK(poll_req(rc, req, lp, "receiving from", &progressed));
			if (!*req) {
				size_t step = done / K, k = done % K, off, len;
				if (step < (size_t)s->nrs) {
					int b = mod(r + s->shift - (long)step - 1, n);
					seg_range(s, b, k, &off, &len);
					char *dst = blk(s, (long)step, b, off);
					const char *in =
					        rc->scratch + (done % RECV_WINDOW) * segbytes;
					if (reads_src(s)) {
						kolo_reduce3(dst, s->src + off * es, in, len,
						             s->dtype, s->op);
					} else {
						prep(s, dst, off, len);
						kolo_reduce(dst, in, len, s->dtype, s->op);
					}
					if (step + 1 == (size_t)s->nrs && s->postscale != 1.0)
						kolo_scale(dst, dst, len, s->dtype, s->postscale);
				}
				done++;
			}
		}
		/* Only the oldest send is tested: a test progresses the whole
		 * conn, and later sends are seen as they become the oldest. */
		while (sdone < sposted) {
			KOLO_CHECK(poll_req(rc, &sreq[sdone % SEND_WINDOW], rp, "sending to",
			                    &progressed));
			if (sreq[sdone % SEND_WINDOW])
				break;
			sdone++;
		}
		st = idle(rc, &w, progressed, "in the ring");
		if (st != KOLO_OK)
			return blame(rc, st, done < U ? lp : rp);
	}
	return KOLO_OK;
}

/* Fills boff/blen from counts and picks the segmentation. */
static void stream_layout(struct kolo_ring_comm *rc, struct stream *s, const size_t *counts,
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

static kolo_status_t alloc_layout(struct kolo_ring_comm *rc, size_t **arr)
{
	*arr = calloc(3 * (size_t)rc->size, sizeof(size_t));
	if (!*arr)
		return fail(rc, KOLO_ENOMEM, "out of memory");
	return KOLO_OK;
}

/* ---- allreduce -------------------------------------------------------- */

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
	KOLO_CHECK(ensure_conns(rc, peers, np));
	KOLO_CHECK(scratch_reserve(rc, KOLO_MAX(bytes, 1)));
	char *tmp = rc->scratch;

	if (r < 2 * rem && r % 2 == 0) {
		/* Hand the data to r + 1, then get the result back. */
		KOLO_CHECK(exchange(rc, r + 1, buf, bytes, NULL, 0));
		return exchange(rc, r + 1, NULL, 0, buf, bytes);
	}
	if (r < 2 * rem) {
		KOLO_CHECK(exchange(rc, r - 1, NULL, 0, tmp, bytes));
		kolo_reduce(tmp, buf, count, dtype, op);
		memcpy(buf, tmp, bytes);
	}
	for (int mask = 1; mask < pof2; mask <<= 1) {
		int pn = newrank ^ mask;
		int p = pn < rem ? pn * 2 + 1 : pn + rem;
		KOLO_CHECK(exchange(rc, p, buf, bytes, tmp, bytes));
		if (p < r) {
			kolo_reduce(tmp, buf, count, dtype, op);
			memcpy(buf, tmp, bytes);
		} else {
			kolo_reduce(buf, tmp, count, dtype, op);
		}
	}
	if (r < 2 * rem)
		KOLO_CHECK(exchange(rc, r - 1, buf, bytes, NULL, 0));
	return KOLO_OK;
}

kolo_status_t kolo_ring_allreduce(struct kolo_ring_comm *rc, const void *sendbuf, void *recvbuf,
                                  size_t count, kolo_dtype_t dtype, kolo_op_t op, double prescale,
                                  double postscale)
{
	KOLO_CHECK(enter(rc, "allreduce", dtype));
	if ((unsigned)op >= KOLO_OP_COUNT)
		return bad_arg(rc, "invalid op %d", (int)op);
	const int n = rc->size;
	const size_t es = kolo_dtype_size(dtype);
	if (op == KOLO_AVERAGE)
		postscale /= n;
	if (count == 0)
		return KOLO_OK;
	enum kolo_ring_algo algo = kolo_ring_allreduce_algo(rc, count * es);
	if (algo == KOLO_RING_ALGO_HIER) {
		kolo_status_t st = kolo_ring_hier_allreduce(
		        rc->hier, sendbuf, recvbuf, count, dtype,
		        op == KOLO_AVERAGE ? KOLO_SUM : op, prescale, postscale);
		if (st != KOLO_OK)
			return kolo_ring_comm_fail(rc, st, kolo_ring_hier_failed_peer(rc->hier),
			                           kolo_ring_hier_last_error(rc->hier));
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
	size_t *lay;
	KOLO_CHECK(alloc_layout(rc, &lay));
	for (int i = 0; i < n; i++)
		lay[2 * n + i] = kolo_reducescatter_count(count, n, i);
	struct stream s = {
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
	stream_layout(rc, &s, lay + 2 * n, lay, lay + n);
	kolo_status_t st = run_stream(rc, &s);
	free(lay);
	return st;
}

/* ---- allgatherv ------------------------------------------------------- */

kolo_status_t kolo_ring_allgatherv(struct kolo_ring_comm *rc, const void *sendbuf, void *recvbuf,
                                   const size_t *counts, kolo_dtype_t dtype)
{
	KOLO_CHECK(enter(rc, "allgatherv", dtype));
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
	size_t *lay;
	KOLO_CHECK(alloc_layout(rc, &lay));
	struct stream s = {
	        .work = recvbuf,
	        .esize = es,
	        .dtype = dtype,
	        .op = KOLO_SUM,
	        .prescale = 1.0,
	        .postscale = 1.0,
	        .nrs = 0,
	        .nag = n - 1,
	        .shift = 0,
	};
	stream_layout(rc, &s, counts, lay, lay + n);
	kolo_status_t st = run_stream(rc, &s);
	free(lay);
	return st;
}

/* ---- reducescatter ---------------------------------------------------- */

kolo_status_t kolo_ring_reducescatter(struct kolo_ring_comm *rc, const void *sendbuf, void *recvbuf,
                                      const size_t *counts, kolo_dtype_t dtype, kolo_op_t op,
                                      double prescale, double postscale)
{
	KOLO_CHECK(enter(rc, "reducescatter", dtype));
	if ((unsigned)op >= KOLO_OP_COUNT)
		return bad_arg(rc, "invalid op %d", (int)op);
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
	size_t *lay;
	KOLO_CHECK(alloc_layout(rc, &lay));
	size_t maxblock = 0;
	for (int i = 0; i < n; i++)
		maxblock = KOLO_MAX(maxblock, counts[i]);
	const size_t half = maxblock * es;
	if (rc->work_size < 2 * half) {
		char *p = realloc(rc->work, 2 * half);
		if (!p) {
			free(lay);
			return fail(rc, KOLO_ENOMEM, "cannot allocate %zu bytes", 2 * half);
		}
		rc->work = p;
		rc->work_size = 2 * half;
	}
	/* Step s sends block r-1-s, so the last step (n - 2) leaves block r
	 * in rot[n % 2]; it is copied out once every send is done, which lets
	 * recvbuf overlap sendbuf anywhere. */
	struct stream s = {
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
	stream_layout(rc, &s, counts, lay, lay + n);
	kolo_status_t st = run_stream(rc, &s);
	if (st == KOLO_OK && counts[r] > 0)
		memmove(recvbuf, s.rot[n % 2], counts[r] * es);
	free(lay);
	return st;
}

/* ---- broadcast -------------------------------------------------------- */

/* Binomial tree over ranks relative to root: lg n rounds of whole messages. */
static kolo_status_t bcast_tree(struct kolo_ring_comm *rc, char *buf, size_t bytes, int root)
{
	const int n = rc->size, v = mod(rc->rank - root, n);
	int peers[40] = {0}, np = 0, parent = -1, mask = 1;
	for (; mask < n; mask <<= 1) {
		if (v & mask) {
			parent = mod(v - mask + root, n);
			peers[np++] = parent;
			break;
		}
	}
	for (mask >>= 1; mask > 0; mask >>= 1)
		if (v + mask < n)
			peers[np++] = mod(v + mask + root, n);
	KOLO_CHECK(ensure_conns(rc, peers, np));
	struct kolo_req *reqs[40];
	int start = 0;
	if (parent >= 0) {
		kolo_status_t st = kolo_irecv(rc->conns[parent], buf, bytes, &reqs[0]);
		if (st != KOLO_OK)
			return peer_fail(rc, st, parent, "receiving from");
		KOLO_CHECK(wait_all(rc, reqs, peers, 1));
		start = 1;
	}
	for (int i = start; i < np; i++) {
		kolo_status_t st = kolo_isend(rc->conns[peers[i]], buf, bytes, &reqs[i]);
		if (st != KOLO_OK)
			return peer_fail(rc, st, peers[i], "sending to");
	}
	return wait_all(rc, reqs + start, peers + start, np - start);
}

/* Pipelined chain root → root+1 → ... along the ring: each segment is
 * forwarded as soon as it arrives. */
static kolo_status_t bcast_chain(struct kolo_ring_comm *rc, char *buf, size_t bytes, int root)
{
	const int n = rc->size, r = rc->rank, v = mod(r - root, n);
	const int lp = mod(r - 1, n), rp = mod(r + 1, n);
	const bool has_left = v > 0, has_right = v < n - 1;
	const size_t K = (bytes + rc->cfg.segment_bytes - 1) / rc->cfg.segment_bytes;
	struct kolo_req *rreq[RECV_WINDOW] = {0}, *sreq[SEND_WINDOW] = {0};
	size_t done = has_left ? 0 : K, rposted = done, sposted = has_right ? 0 : K,
	       sdone = sposted;
	struct waiter w;
	waiter_init(&w);
	kolo_status_t st;
	while (done < K || sdone < K) {
		bool progressed = false;
		while (rposted < K && rposted < done + RECV_WINDOW) {
			size_t lo = bytes * rposted / K, hi = bytes * (rposted + 1) / K;
			st = kolo_irecv(rc->conns[lp], buf + lo, hi - lo,
			                &rreq[rposted % RECV_WINDOW]);
			if (st != KOLO_OK)
				return peer_fail(rc, st, lp, "receiving from");
			rposted++;
		}
		while (sposted < K && sposted < done && !sreq[sposted % SEND_WINDOW]) {
			size_t lo = bytes * sposted / K, hi = bytes * (sposted + 1) / K;
			st = kolo_isend(rc->conns[rp], buf + lo, hi - lo,
			                &sreq[sposted % SEND_WINDOW]);
			if (st != KOLO_OK)
				return peer_fail(rc, st, rp, "sending to");
			sposted++;
		}
		if (done < rposted) {
			KOLO_CHECK(poll_req(rc, &rreq[done % RECV_WINDOW], lp, "receiving from",
			                    &progressed));
			if (!rreq[done % RECV_WINDOW])
				done++;
		}
		/* Only the oldest send is tested: a test progresses the whole
		 * conn, and later sends are seen as they become the oldest. */
		while (sdone < sposted) {
			KOLO_CHECK(poll_req(rc, &sreq[sdone % SEND_WINDOW], rp, "sending to",
			                    &progressed));
			if (sreq[sdone % SEND_WINDOW])
				break;
			sdone++;
		}
		st = idle(rc, &w, progressed, "in the broadcast chain");
		if (st != KOLO_OK)
			return blame(rc, st, done < K ? lp : rp);
	}
	return KOLO_OK;
}

kolo_status_t kolo_ring_broadcast(struct kolo_ring_comm *rc, void *buf, size_t count,
                                  kolo_dtype_t dtype, int root)
{
	KOLO_CHECK(enter(rc, "broadcast", dtype));
	if (root < 0 || root >= rc->size)
		return bad_arg(rc, "invalid root %d", root);
	const size_t bytes = count * kolo_dtype_size(dtype);
	if (rc->size == 1 || bytes == 0)
		return KOLO_OK;
	if (bytes <= rc->cfg.segment_bytes)
		return bcast_tree(rc, buf, bytes, root);
	return bcast_chain(rc, buf, bytes, root);
}

/* ---- alltoallv -------------------------------------------------------- */

/* Every pair exchanges its blocks directly over a lazily connected conn: all
 * sends and receives are posted at once (in pairwise order, rank+k / rank-k),
 * so the transport moves them concurrently. */
kolo_status_t kolo_ring_alltoallv(struct kolo_ring_comm *rc, const void *sendbuf,
                                  const size_t *sendcounts, void *recvbuf, const size_t *recvcounts,
                                  kolo_dtype_t dtype)
{
	KOLO_CHECK(enter(rc, "alltoallv", dtype));
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
			return fail(rc, KOLO_ENOMEM, "cannot allocate %zu bytes", stotal * es);
		memcpy(copy, sendbuf, stotal * es);
		src = copy;
	}
	if (recvcounts[r] > 0 && (const char *)recvbuf + roff_r * es != src + soff_r * es)
		memmove((char *)recvbuf + roff_r * es, src + soff_r * es, recvcounts[r] * es);
	kolo_status_t st = KOLO_OK;
	struct kolo_req **reqs = NULL;
	int *peers = NULL;
	size_t *soff = NULL, *roff = NULL;
	if (n == 1)
		goto out;
	reqs = calloc(2 * (size_t)n, sizeof(*reqs));
	peers = calloc(2 * (size_t)n, sizeof(*peers));
	soff = calloc((size_t)n, sizeof(*soff));
	roff = calloc((size_t)n, sizeof(*roff));
	if (!reqs || !peers || !soff || !roff) {
		st = fail(rc, KOLO_ENOMEM, "out of memory");
		goto out;
	}
	for (int i = 1; i < n; i++) {
		soff[i] = soff[i - 1] + sendcounts[i - 1];
		roff[i] = roff[i - 1] + recvcounts[i - 1];
	}
	int np = 0;
	for (int k = 1; k < n; k++)
		peers[np++] = mod(r + k, n);
	st = ensure_conns(rc, peers, np);
	if (st != KOLO_OK)
		goto out;
	np = 0;
	for (int k = 1; k < n && st == KOLO_OK; k++) {
		int to = mod(r + k, n), from = mod(r - k, n);
		peers[np] = from;
		st = kolo_irecv(rc->conns[from], (char *)recvbuf + roff[from] * es,
		                recvcounts[from] * es, &reqs[np++]);
		if (st != KOLO_OK) {
			st = peer_fail(rc, st, from, "receiving from");
			break;
		}
		peers[np] = to;
		st = kolo_isend(rc->conns[to], src + soff[to] * es, sendcounts[to] * es,
		                &reqs[np++]);
		if (st != KOLO_OK)
			st = peer_fail(rc, st, to, "sending to");
	}
	if (st == KOLO_OK)
		st = wait_all(rc, reqs, peers, np);
out:
	free(copy);
	free(reqs);
	free(peers);
	free(soff);
	free(roff);
	return st;
}

/* ---- barrier ---------------------------------------------------------- */

/* Dissemination: in round k every rank signals rank + 2^k and waits for
 * rank - 2^k, with zero-byte messages; ⌈lg n⌉ rounds. */
kolo_status_t kolo_ring_barrier(struct kolo_ring_comm *rc)
{
	KOLO_CHECK(enter(rc, "barrier", KOLO_UINT8));
	const int n = rc->size, r = rc->rank;
	int peers[80] = {0}, np = 0;
	for (int d = 1; d < n; d <<= 1) {
		peers[np++] = mod(r + d, n);
		peers[np++] = mod(r - d, n);
	}
	KOLO_CHECK(ensure_conns(rc, peers, np));
	static char dummy;
	for (int i = 0; i < np; i += 2) {
		struct kolo_req *reqs[2];
		int pr[2] = {peers[i], peers[i + 1]};
		kolo_status_t st = kolo_isend(rc->conns[pr[0]], &dummy, 0, &reqs[0]);
		if (st != KOLO_OK)
			return peer_fail(rc, st, pr[0], "signalling");
		st = kolo_irecv(rc->conns[pr[1]], &dummy, 0, &reqs[1]);
		if (st != KOLO_OK)
			return peer_fail(rc, st, pr[1], "waiting for");
		KOLO_CHECK(wait_all(rc, reqs, pr, 2));
	}
	return KOLO_OK;
}
