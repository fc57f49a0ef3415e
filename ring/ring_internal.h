/* ring_internal: what the files of ring/ share, and only they (fusion/ and
 * runtime/ see ring.h). Names here take the ring_ prefix, as nng's nni_ and
 * libuv's uv__, so a kolo_ring_* name is always one another module may call;
 * file-static helpers carry no prefix. The files, one job each:
 *   ring.c                the comm: lifecycle, getters, failure, entry checks
 *   ring_wait.c           waiting on requests: spin, block, time out
 *   ring_conn.c           connecting peers on first use, and the greeting
 *   ring_stream.c         the pipelined ring (reduce-scatter then allgather)
 *   ring_allreduce.c      allreduce: recursive doubling, the ring, the hierarchy
 *   ring_gather_scatter.c allgatherv and reducescatter (halves of the stream)
 *   ring_broadcast.c      broadcast: binomial tree and pipelined chain
 *   ring_pairwise.c       alltoallv and barrier: direct peer exchanges
 *   hier.c                the hierarchical allreduce and its cost model
 *   hier_pipeline.c       the hierarchy's stages overlapped chunk by chunk
 *   reduce.c              the reduction kernels
 * Algorithms, costs, waiting and failure: docs/collectives.md.
 *
 * Threading: a comm runs one collective at a time, on one thread; of the
 * functions here only the atomics of struct kolo_ring_comm are read from
 * another (kolo_ring_abort and kolo_ring_failed_peer are thread-safe). */
#ifndef KOLO_RING_INTERNAL_H
#define KOLO_RING_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ring.h"

#define RING_RECV_WINDOW 4 /* receives in flight, and scratch segments of a reduction */
#define RING_SEND_WINDOW 4 /* sends in flight in a pipelined pass */

/* What a pipelined stream (ring_stream.c) or broadcast chain
 * (ring_broadcast.c) is, as its first message tells the right neighbour:
 * both ends of a conn must run the same stream, or the
 * segments they exchange would be of different blocks. Where segment lengths
 * happen to agree (two counts, or a rank staging device memory chunk by chunk
 * beside one ring call over host memory), the transport's length check cannot
 * see the difference. */
struct ring_stream_desc {
	uint64_t total; /* elements in all blocks */
	uint64_t units; /* (nrs + nag) * nseg; a chain's segments */
	uint32_t dtype;
	uint32_t op; /* the reduction; a chain's root */
	uint32_t nrs, nag;
};

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
	uint64_t spin_ns;            /* the spin of ring_idle now (adaptive, ring_wait.c) */
	unsigned shared_waits;       /* waits in a row whose peer ran on our CPU (ring_wait.c) */
	uint64_t moved_ns;           /* when this comm last moved its thread (ring_wait.c) */
	/* The running stream's description, sent [0] and received [1]
	 * (ring_stream.c). Here rather than in the run: a failed run can be
	 * freed while its receive is still posted, until its comm fails too. */
	struct ring_stream_desc stream_desc[2];
};

/* The transport's (global) rank of member i. */
static inline int ring_global_rank(const struct kolo_ring_comm *rc, int i)
{
	return rc->gmap ? rc->gmap[i] : i;
}

/* a mod n in [0, n): the position a steps round a ring of n (a may be < 0). */
static inline int ring_wrap(long a, int n)
{
	long r = a % n;
	return (int)(r < 0 ? r + n : r);
}

/* ---- failure and entry (ring.c) ------------------------------------------ */

/* Marks the comm failed with st (the first failure wins), records the
 * message and closes every conn. Returns the comm's status. */
__attribute__((format(printf, 3, 4))) kolo_status_t
ring_fail(struct kolo_ring_comm *rc, kolo_status_t st, const char *fmt, ...);
/* A conn to peer (a member index) failed with st while `what` ("sending
 * to"): records peer as failed_peer unless aborted or already failed, and
 * fails the comm with the transport's detail. Returns the comm's status. */
kolo_status_t ring_peer_fail(struct kolo_ring_comm *rc, kolo_status_t st, int peer,
                             const char *what);
/* After a timeout (st), names peer as the one that went silent, unless the
 * comm was aborted or another peer was named first. Returns st. */
kolo_status_t ring_blame(struct kolo_ring_comm *rc, kolo_status_t st, int peer);
/* Common entry checks of a collective (the comm, its status, abort, the
 * dtype); names the collective for messages. KOLO_EINVAL for a bad dtype
 * leaves the comm usable. */
kolo_status_t ring_enter(struct kolo_ring_comm *rc, const char *coll, kolo_dtype_t dtype);
/* An argument error: the message goes to last_error, the comm stays usable.
 * Returns KOLO_EINVAL. */
__attribute__((format(printf, 2, 3))) kolo_status_t ring_bad_arg(struct kolo_ring_comm *rc,
                                                                 const char *fmt, ...);
/* Grows rc->scratch to at least bytes (fails the comm when out of memory). */
kolo_status_t ring_scratch_reserve(struct kolo_ring_comm *rc, size_t bytes);

/* ---- waiting (ring_wait.c) ----------------------------------------------- */

/* The clock of one waiting loop: when it last progressed, and since when it
 * has spun without progress. */
struct ring_waiter {
	uint64_t idle_since_ns;
	uint64_t progress_ns;
	uint64_t blocked_ns; /* when this wait first blocked in the transport; 0: not yet */
	int peer;            /* the member waited for, if one is known; else -1 */
	int peer_here;       /* it runs on our CPU: 1, elsewhere: 0, not looked yet: -1 */
	bool peer_unknown;   /* the transport cannot say where the peer runs (TCP) */
	bool yield_ran;      /* the last yield of this wait ran another thread */
};

void ring_waiter_init(struct ring_waiter *w);
/* A waiting loop is done: a wait that had blocked adapts the comm's spin. */
void ring_waiter_end(struct kolo_ring_comm *rc, struct ring_waiter *w);
/* Called once per polling pass: spins while the pass made progress or the
 * spin time has not run out, else blocks in the transport for a slice.
 * Fails the comm on abort, on cfg.timeout_ms without progress, or when the
 * transport's wait fails; `what` goes into the message. */
kolo_status_t ring_idle(struct kolo_ring_comm *rc, struct ring_waiter *w, bool progressed,
                        const char *what);
/* Tests *req (NULL means complete; set to NULL when it completes or fails).
 * Sets *progressed when it completes; a failure fails the comm, naming peer. */
kolo_status_t ring_poll_req(struct kolo_ring_comm *rc, struct kolo_req **req, int peer,
                            const char *what, bool *progressed);
/* Tests the sends of a pipelined pass in order, oldest first (sreq is a
 * window of RING_SEND_WINDOW, indexed by send number mod the window): only
 * the oldest is tested, since a test progresses the whole conn and later
 * sends are seen as they become the oldest. Advances *sdone up to sposted. */
kolo_status_t ring_test_sends(struct kolo_ring_comm *rc, struct kolo_req **sreq, size_t *sdone,
                              size_t sposted, int peer, bool *progressed);
/* Waits for every request in reqs (peers[i] names the peer of reqs[i]); a
 * timeout names the first peer still waited for. */
kolo_status_t ring_wait_all(struct kolo_ring_comm *rc, struct kolo_req **reqs, const int *peers,
                            int n);
/* The member of newrank pn under rem folded pairs. */
static inline int ring_rd_member(int pn, int rem)
{
	return pn < rem ? pn * 2 + 1 : pn + rem;
}
/* Recursive doubling's fold (ring_allreduce.c), around a body over the pof2
 * survivors: with pof2 the largest power of two <= size and rem = size -
 * pof2, ranks 2i < 2 rem fold into 2i + 1; newrank is a rank's place among
 * the survivors (ring_rd_member maps it back). begin: connects every
 * partner, takes rc->scratch (bytes) as rd->tmp, then rank 2i hands buf to
 * 2i + 1 and gets the result back (*done: nothing more to do), and rank
 * 2i + 1 sets buf to fold(ctx, buf, the lower rank's data). end: rank 2i + 1
 * hands the result back. */
struct ring_rd {
	int pof2, rem, newrank;
	char *tmp;
};
/* lower is scratch: the fold may overwrite it. */
typedef void (*ring_rd_fold_fn)(void *ctx, char *buf, char *lower);
kolo_status_t ring_rd_begin(struct kolo_ring_comm *rc, char *buf, size_t bytes,
                            ring_rd_fold_fn fold, void *ctx, struct ring_rd *rd, bool *done);
kolo_status_t ring_rd_end(struct kolo_ring_comm *rc, const struct ring_rd *rd, char *buf,
                          size_t bytes);
/* buf (count elements, prescaled) <- the Adasum of every rank's buf over the
 * recursive-doubling tree (ring_adasum.c). */
kolo_status_t ring_adasum(struct kolo_ring_comm *rc, char *buf, size_t count, kolo_dtype_t dtype);
/* Sends sbuf (when not NULL) to and receives into rbuf (when not NULL) from
 * peer, and waits for both. */
kolo_status_t ring_exchange(struct kolo_ring_comm *rc, int peer, const void *sbuf, size_t slen,
                            void *rbuf, size_t rlen);

/* ---- conns (ring_conn.c) ------------------------------------------------- */

/* Makes sure conns[peers[i]] exist (peers are member indices, may repeat
 * and name self): connects to every higher peer first, then accepts from
 * every lower one, then greets every new conn with a zero-byte exchange. */
kolo_status_t ring_ensure_conns(struct kolo_ring_comm *rc, const int *peers, int n);

/* ---- the pipelined ring (ring_stream.c) ---------------------------------- */

/* A stream of steps around the ring over n blocks of `work`. At step s a rank
 * sends block (rank + shift - s) to its right and receives block
 * (rank + shift - s - 1) from its left, one segment at a time; the first nrs
 * steps reduce what arrives into the block (reduce-scatter), the rest store
 * it (allgather). A segment is forwarded as soon as it is final, so the
 * pipeline spans all steps. */
struct ring_stream {
	char *work;
	/* Allreduce over several buffers (kolo_ring_allreduce_pieces): instead
	 * of work and src, the logical concatenation of pieces; piece_off[i] is
	 * the element offset of piece i (npieces + 1 entries). Segments are cut
	 * so that none spans two pieces. */
	const struct kolo_ring_piece *pieces;
	const size_t *piece_off;
	size_t npieces;
	const size_t *cuts; /* per block nseg + 1 segment bounds; NULL: even */
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
	const size_t *boff, *blen; /* elements; set by ring_stream_run */
	int nrs, nag, shift;
	size_t nseg;      /* segments per block */
	size_t seg_elems; /* most elements in one segment */
};

/* Lays s out over n blocks of counts[i] elements (counts NULL: the even
 * split of count elements, kolo_reducescatter_count), picks the segmentation
 * from cfg.segment_bytes and runs it to the end over the ring neighbours'
 * conns. Sets s->boff, blen, nseg and seg_elems (boff and blen are NULL
 * again on return); the caller sets the rest. */
kolo_status_t ring_stream_run(struct kolo_ring_comm *rc, struct ring_stream *s,
                              const size_t *counts, size_t count);

/* The same stream moved by the caller, so that one thread can move streams of
 * several comms at once (the pipelined hierarchy, hier_pipeline.c): start
 * lays s out (s must outlive the run), each pass polls it once without
 * blocking, and the caller idles when no stream progressed. A failure fails
 * rc as ring_stream_run would; end frees the run (after a failure too) and
 * touches no request. */
struct ring_stream_run;
kolo_status_t ring_stream_start(struct kolo_ring_comm *rc, struct ring_stream *s,
                                const size_t *counts, size_t count, struct ring_stream_run **out);
kolo_status_t ring_stream_pass(struct ring_stream_run *sr, bool *progressed, bool *finished);
/* After a timeout st, names the peer the run waits for. Returns st. */
kolo_status_t ring_stream_blame(const struct ring_stream_run *sr, kolo_status_t st);
void ring_stream_end(struct ring_stream_run *sr);

/* ---- the hierarchy, between ring.c, ring_allreduce.c and hier.c ---------- */

/* rc owns h from then on (a previous one is destroyed). */
void ring_set_hier(struct kolo_ring_comm *rc, struct kolo_ring_hier *h);
enum kolo_ring_algo ring_hier_choose(const struct kolo_ring_hier *h, size_t bytes);
kolo_status_t ring_hier_allreduce(struct kolo_ring_hier *h, const void *sendbuf, void *recvbuf,
                                  size_t count, kolo_dtype_t dtype, kolo_op_t op, double prescale,
                                  double postscale);
/* hier_pipeline.c: the allreduce of hier.c in `chunks` pipelined chunks over
 * the local and cross comms of this rank (docs/hierarchical.md). On a
 * failure *failed is the comm that failed first; the caller must fail the
 * other too (its conns may still hold requests into recvbuf). */
kolo_status_t ring_hier_pipeline(struct kolo_ring_comm *local, struct kolo_ring_comm *cross,
                                 const void *sendbuf, void *recvbuf, size_t count,
                                 kolo_dtype_t dtype, kolo_op_t op, double prescale,
                                 double postscale, size_t chunks, struct kolo_ring_comm **failed);
const char *ring_hier_last_error(const struct kolo_ring_hier *h);
int ring_hier_failed_peer(const struct kolo_ring_hier *h);
void ring_hier_fail(struct kolo_ring_hier *h, kolo_status_t st);
void ring_hier_abort(struct kolo_ring_hier *h, kolo_status_t st);
void ring_hier_destroy(struct kolo_ring_hier *h);
bool ring_hier_costs_of(const struct kolo_ring_hier *h, struct kolo_ring_link_cost *shm,
                        struct kolo_ring_link_cost *net);

#endif /* KOLO_RING_INTERNAL_H */
