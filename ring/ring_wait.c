/* Waiting on requests. Every loop polls its requests with test(), spins
 * without progress for the comm's spin time, then blocks in the transport's
 * wait() for at most WAIT_SLICE_MS and checks for abort; cfg.timeout_ms
 * without any progress fails the comm.
 *
 * The spin time adapts (docs/collectives.md, "Waiting"): it starts at
 * cfg.spin_us; a wait that blocked and was answered within SPIN_MAX_NS of
 * blocking doubles it (up to SPIN_MAX_NS), a longer one halves it (down to
 * cfg.spin_us). On a busy host a rank that blocks gives its CPU away and
 * waits to be scheduled again when its peer answers; the peer, answered late
 * in turn, blocks too, and every later message pays a wake-up (tens of µs
 * each). Spinning as long as answers come that fast ends that convoy, while a
 * rank that waits long (a slow peer, compute between collectives) spins at
 * most SPIN_MAX_NS per wait before it sleeps.
 *
 * A peer on our own CPU cannot answer while we spin, so a wait that finds the
 * peer it waits for there (the transport says where the peer last waited)
 * yields at every pass; and after MOVE_AFTER_WAITS such waits in a row, the
 * higher rank of the pair moves its thread to another CPU of its affinity
 * mask (cfg.spin_move), at most once per MOVE_EVERY_NS. Where the transport
 * cannot say where the peer runs (TCP between ranks of one host), the same
 * move follows MOVE_AFTER_WAITS waits in a row that ended right after a
 * yield that ran another thread: the peer's answer came from our CPU. */
#include <sched.h>
#include <stdatomic.h>

#include "ring_internal.h"

#include "flight.h"

#define WAIT_SLICE_MS    50
#define SPIN_MAX_NS      1000000u
#define MOVE_AFTER_WAITS 16u
#define MOVE_EVERY_NS    1000000u
#define YIELD_RAN_NS     2000u /* a sched_yield this long ran another thread */

/* The clock is read only once a pass finds nothing to do: 0 means "since the
 * next idle pass", so a wait whose requests are already complete (most
 * small-message steps) reads no clock at all. */
void ring_waiter_init(struct ring_waiter *w)
{
	w->idle_since_ns = w->progress_ns = w->blocked_ns = 0;
	w->peer = w->peer_here = -1;
	w->peer_unknown = w->yield_ran = false;
}

/* Moves this thread to another CPU of its mask, then gives the mask back:
 * the scheduler keeps two busy threads apart once they are apart, but can
 * leave two that started together on one CPU for tens of ms
 * (docs/collectives.md, "Waiting"). The CPU: the rank-th of the mask, or the
 * one after it when that is ours. */
static void move_off(const struct kolo_ring_comm *rc, int cpu)
{
	cpu_set_t mask, one;
	if (sched_getaffinity(0, sizeof(mask), &mask) != 0 || CPU_COUNT(&mask) < 2)
		return;
	int k = rc->rank % CPU_COUNT(&mask), to = -1, first = -1;
	for (int c = 0, seen = 0; c < CPU_SETSIZE; c++) {
		if (!CPU_ISSET(c, &mask))
			continue;
		if (first < 0)
			first = c;
		if (to == cpu || (to < 0 && seen == k))
			to = c;
		seen++;
	}
	if (to == cpu)
		to = first;
	CPU_ZERO(&one);
	CPU_SET(to, &one);
	if (sched_setaffinity(0, sizeof(one), &one) == 0 &&
	    sched_setaffinity(0, sizeof(mask), &mask) != 0)
		KOLO_WARN("ring", "cannot restore this thread's CPU mask");
}

/* Whether the peer w waits for last waited on our CPU; counts the waits
 * that found it there and moves off after MOVE_AFTER_WAITS of them. */
/* Counts a wait whose peer ran on our CPU (shared) or not; after
 * MOVE_AFTER_WAITS in a row the higher rank of the pair moves off. */
static void count_shared(struct kolo_ring_comm *rc, const struct ring_waiter *w, bool shared,
                         uint64_t now)
{
	rc->shared_waits = shared ? rc->shared_waits + 1 : 0;
	if (shared && rc->cfg.spin_move && rc->shared_waits >= MOVE_AFTER_WAITS &&
	    ring_global_rank(rc, rc->rank) > ring_global_rank(rc, w->peer) &&
	    now - rc->moved_ns >= MOVE_EVERY_NS) {
		move_off(rc, sched_getcpu());
		rc->moved_ns = now;
		rc->shared_waits = 0;
	}
}

/* Whether the peer w waits for last waited on our CPU, as the transport
 * tells (shared memory); false, with w->peer_unknown, where it cannot. */
static bool peer_here(struct kolo_ring_comm *rc, struct ring_waiter *w, uint64_t now)
{
	if (w->peer < 0 || !rc->conns[w->peer] || w->peer_unknown)
		return false;
	int cpu = sched_getcpu();
	int at = cpu >= 0 && rc->t->ops->peer_cpu ? rc->t->ops->peer_cpu(rc->conns[w->peer], cpu)
	                                          : -1;
	if (at < 0) {
		w->peer_unknown = true;
		return false;
	}
	bool here = at == cpu;
	if (w->peer_here < 0)
		count_shared(rc, w, here, now);
	w->peer_here = here;
	return here;
}

/* A wait that had blocked made progress `blocked` ns after it blocked. */
static void adapt_spin(struct kolo_ring_comm *rc, uint64_t blocked)
{
	uint64_t base = (uint64_t)rc->cfg.spin_us * 1000u;
	/* Spinning disabled, or a spin that never yields: spinning longer
	 * would hold off a peer that shares our CPU. */
	if (!base || (!rc->cfg.spin_yield && rc->cfg.spin_yield_after_us <= 0))
		return;
	if (blocked < SPIN_MAX_NS)
		rc->spin_ns =
		        KOLO_MIN(KOLO_MAX(rc->spin_ns, base) * 2, KOLO_MAX(SPIN_MAX_NS, base));
	else
		rc->spin_ns = KOLO_MAX(rc->spin_ns / 2, base);
}

void ring_waiter_end(struct kolo_ring_comm *rc, struct ring_waiter *w)
{
	/* Where the transport cannot tell: a wait that ended right after a
	 * yield that ran another thread was answered from our CPU. */
	if (w->peer_unknown && w->peer >= 0 && w->idle_since_ns) {
		count_shared(rc, w, w->yield_ran, kolo_now_ns());
		w->yield_ran = false;
	}
	if (w->blocked_ns) {
		adapt_spin(rc, kolo_now_ns() - w->blocked_ns);
		w->blocked_ns = 0;
		kolo_flight_waiting(rc->cfg.flight, false, -1);
	}
}

kolo_status_t ring_idle(struct kolo_ring_comm *rc, struct ring_waiter *w, bool progressed,
                        const char *what)
{
	int ab = atomic_load(&rc->aborted);
	if (ab != KOLO_OK)
		return ring_fail(rc, (kolo_status_t)ab, "aborted while %s", what);
	if (progressed) {
		ring_waiter_end(rc, w);
		w->idle_since_ns = w->progress_ns = 0;
		return KOLO_OK;
	}
	uint64_t now = kolo_now_ns();
	if (!w->idle_since_ns)
		w->idle_since_ns = w->progress_ns = now;
	if (now - w->idle_since_ns < KOLO_MAX(rc->spin_ns, (uint64_t)rc->cfg.spin_us * 1000u)) {
		/* More ranks than CPUs here: the peer we wait for may need this
		 * CPU to make the progress we wait for. */
		if (peer_here(rc, w, now) || rc->cfg.spin_yield ||
		    (rc->cfg.spin_yield_after_us > 0 &&
		     now - w->idle_since_ns >= (uint64_t)rc->cfg.spin_yield_after_us * 1000u)) {
			sched_yield();
			if (w->peer_unknown)
				w->yield_ran = kolo_now_ns() - now >= YIELD_RAN_NS;
		}
		return KOLO_OK;
	}
	if (!w->blocked_ns) {
		w->blocked_ns = now;
		kolo_flight_waiting(rc->cfg.flight, true,
		                    w->peer >= 0 ? ring_global_rank(rc, w->peer) : -1);
	}
	if (rc->cfg.flight && w->peer >= 0 && rc->conns[w->peer] && rc->t->ops->unacked_ms)
		kolo_flight_waiting_unacked(
		        rc->cfg.flight,
		        rc->t->ops->unacked_ms(rc->t, rc->conns[w->peer]->peer_rank));
	uint64_t waited_ms = (now - w->progress_ns) / 1000000u;
	int slice = WAIT_SLICE_MS;
	if (rc->cfg.timeout_ms > 0) {
		if (waited_ms >= (uint64_t)rc->cfg.timeout_ms)
			return ring_fail(rc, KOLO_ETIMEDOUT, "no progress for %d ms while %s",
			                 rc->cfg.timeout_ms, what);
		slice = (int)KOLO_MIN((uint64_t)slice, rc->cfg.timeout_ms - waited_ms);
	}
	kolo_status_t st = rc->t->ops->wait(rc->t, KOLO_MAX(slice, 1));
	if (st != KOLO_OK)
		return ring_fail(rc, st, "transport wait failed while %s", what);
	return KOLO_OK;
}

kolo_status_t ring_poll_req(struct kolo_ring_comm *rc, struct kolo_req **req, int peer,
                            const char *what, bool *progressed)
{
	if (!*req)
		return KOLO_OK;
	bool done = false;
	kolo_status_t st = rc->t->ops->test(*req, &done);
	if (st != KOLO_OK) {
		*req = NULL;
		return ring_peer_fail(rc, st, peer, what);
	}
	if (done) {
		*req = NULL;
		*progressed = true;
	}
	return KOLO_OK;
}

kolo_status_t ring_wait_all(struct kolo_ring_comm *rc, struct kolo_req **reqs, const int *peers,
                            int n)
{
	struct ring_waiter w;
	ring_waiter_init(&w);
	for (;;) {
		bool progressed = false, pending = false;
		for (int i = 0; i < n; i++) {
			KOLO_CHECK(ring_poll_req(rc, &reqs[i], peers[i], "exchanging with",
			                         &progressed));
			if (reqs[i] && !pending)
				w.peer = peers[i];
			pending |= reqs[i] != NULL;
		}
		if (!pending) {
			ring_waiter_end(rc, &w);
			return KOLO_OK;
		}
		kolo_status_t st = ring_idle(rc, &w, progressed, "waiting for peers");
		if (st == KOLO_ETIMEDOUT && atomic_load(&rc->aborted) == KOLO_OK) {
			/* A silent peer: name the first one we still wait for. */
			for (int i = 0; i < n; i++) {
				int none = -1;
				if (reqs[i]) {
					atomic_compare_exchange_strong(
					        &rc->failed_peer, &none,
					        ring_global_rank(rc, peers[i]));
					break;
				}
			}
		}
		if (st != KOLO_OK)
			return st;
	}
}

kolo_status_t ring_exchange(struct kolo_ring_comm *rc, int peer, const void *sbuf, size_t slen,
                            void *rbuf, size_t rlen)
{
	struct kolo_req *reqs[2];
	int peers[2] = {peer, peer}, n = 0;
	kolo_status_t st;
	if (rbuf && (st = kolo_irecv(rc->conns[peer], rbuf, rlen, &reqs[n++])) != KOLO_OK)
		return ring_peer_fail(rc, st, peer, "receiving from");
	if (sbuf && (st = kolo_isend(rc->conns[peer], sbuf, slen, &reqs[n++])) != KOLO_OK)
		return ring_peer_fail(rc, st, peer, "sending to");
	return ring_wait_all(rc, reqs, peers, n);
}

kolo_status_t ring_test_sends(struct kolo_ring_comm *rc, struct kolo_req **sreq, size_t *sdone,
                              size_t sposted, int peer, bool *progressed)
{
	while (*sdone < sposted) {
		struct kolo_req **req = &sreq[*sdone % RING_SEND_WINDOW];
		KOLO_CHECK(ring_poll_req(rc, req, peer, "sending to", progressed));
		if (*req)
			break;
		(*sdone)++;
	}
	return KOLO_OK;
}
