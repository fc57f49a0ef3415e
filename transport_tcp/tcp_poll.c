/* The TCP transport's poll loop: which socket waits for what, one epoll_wait
 * dispatched to the acceptor, the connector or the data path, and the
 * deadlines and probe losses swept after it. */
#include "tcp_internal.h"

#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#define SUBSYS "tcp"

void tcp_stream_progress(struct tcp_conn *c, struct tcp_stream *s, short revents)
{
	if (c->err || s->fd < 0)
		return;
	switch (s->state) {
	case TCP_STREAM_CONNECTING:
	case TCP_STREAM_READ_CHALLENGE:
	case TCP_STREAM_WRITE_HELLO:
	case TCP_STREAM_READ_VERDICT:
		tcp_connector_step(c, s, revents);
		return;
	case TCP_STREAM_READY:
		break;
	default:
		return;
	}
	if (c->incoming && !c->accepted) {
		if (revents & (POLLERR | POLLHUP))
			tcp_conn_fail(c, KOLO_EPEER, "rank %d (tag %d, %s) closed the connection",
			              c->base.peer_rank, c->base.tag, c->peer_addr);
		return;
	}
	if (tcp_stream_want_send(c, s))
		tcp_stream_send(c, s);
	if (!c->err && tcp_stream_want_recv(c, s)) {
		tcp_stream_recv(c, s);
	} else if (!c->err && (revents & (POLLERR | POLLHUP))) {
		int err = 0;
		socklen_t len = sizeof(err);
		getsockopt(s->fd, SOL_SOCKET, SO_ERROR, &err, &len);
		tcp_conn_fail(c, KOLO_EPEER, "connection to rank %d (tag %d, %s) broke: %s",
		              c->base.peer_rank, c->base.tag, c->peer_addr,
		              err ? strerror(err) : "closed");
	}
}

void tcp_conn_progress(struct tcp_conn *c)
{
	for (int i = 0; i < c->nstreams && !c->err; i++)
		tcp_stream_progress(c, &c->streams[i], 0);
}

/* ---- deadlines ---------------------------------------------------------- */

/* Logs every conn and handshake of the endpoint: what a timeout report
 * needs to tell a stall in this rank from one in a peer. */
static void dump_state(const struct tcp_transport *t)
{
	for (const struct tcp_conn *c = t->conns; c; c = c->next) {
		char st[KOLO_TCP_MAX_STREAMS * 12 + 1] = "";
		size_t off = 0;
		for (int i = 0; i < c->nstreams && off + 12 < sizeof(st); i++) {
			const struct tcp_stream *s = &c->streams[i];
			off += (size_t)snprintf(st + off, sizeof(st) - off, " %d%s%s%s",
			                        (int)s->state, s->paused ? "p" : "",
			                        s->in_payload ? "d" : "", s->sreq ? "s" : "");
		}
		int ns = 0, nr = 0;
		for (const struct tcp_req *r = c->sendq.head; r; r = r->next)
			ns++;
		for (const struct tcp_req *r = c->recvq.head; r; r = r->next)
			nr++;
		KOLO_INFO(SUBSYS,
		          "rank %d: conn rank %d tag %d %s%s err %s streams %d/%d [%s ] sends %d "
		          "recvs %d idle %llu ms",
		          t->rank, c->base.peer_rank, c->base.tag, c->incoming ? "in" : "out",
		          c->incoming && !c->accepted ? " (not accepted)" : "",
		          kolo_status_name(c->err), c->nready, c->nstreams, st, ns, nr,
		          (unsigned long long)(kolo_now_ms() - c->last_progress_ms));
	}
	for (const struct tcp_pending *p = t->pendings; p; p = p->next)
		KOLO_INFO(SUBSYS, "rank %d: handshake from %s in state %d, %zu/%zu bytes", t->rank,
		          p->peer, (int)p->state, p->off, p->len);
}

static void conn_check_timeout(struct tcp_conn *c, uint64_t now)
{
	if (c->err)
		return;
	/* Only pending work times out; a connect with nothing queued waits. */
	if (!tcp_conn_busy(c))
		return;
	if (now - c->last_progress_ms < (uint64_t)c->t->timeout_ms)
		return;
	dump_state(c->t);
	tcp_conn_fail(c, KOLO_ETIMEDOUT,
	              "no progress on the connection to rank %d (tag %d, %s) "
	              "for %d ms",
	              c->base.peer_rank, c->base.tag, c->peer_addr, c->t->timeout_ms);
}

static void sweep_deadlines(struct tcp_transport *t, uint64_t now)
{
	for (struct tcp_conn *c = t->conns; c; c = c->next)
		conn_check_timeout(c, now);
	struct tcp_pending *next;
	for (struct tcp_pending *p = t->pendings; p; p = next) {
		next = p->next;
		if (now >= p->deadline_ms) {
			dump_state(t);
			tcp_acceptor_drop(t, p, "handshake not completed in time");
		}
	}
}

static int64_t next_deadline(const struct tcp_transport *t)
{
	int64_t d = INT64_MAX;
	for (const struct tcp_conn *c = t->conns; c; c = c->next) {
		if (!c->err && tcp_conn_busy(c))
			d = KOLO_MIN(d, (int64_t)(c->last_progress_ms + (uint64_t)t->timeout_ms));
	}
	for (const struct tcp_pending *p = t->pendings; p; p = p->next)
		d = KOLO_MIN(d, (int64_t)p->deadline_ms);
	return d;
}

/* ---- interests ---------------------------------------------------------- */

static short stream_events(const struct tcp_conn *c, const struct tcp_stream *s)
{
	switch (s->state) {
	case TCP_STREAM_CONNECTING:
	case TCP_STREAM_WRITE_HELLO:
		return POLLOUT;
	case TCP_STREAM_READ_CHALLENGE:
	case TCP_STREAM_READ_VERDICT:
		return POLLIN;
	case TCP_STREAM_READY:
		if (c->incoming && !c->accepted)
			return 0; /* errors and hang-ups only */
		return (short)((tcp_stream_want_send(c, s) ? POLLOUT : 0) |
		               (tcp_stream_want_recv(c, s) ? POLLIN : 0));
	default:
		return 0;
	}
}

/* Brings every socket's epoll interest up to date (a syscall only where it
 * changed). */
static void arm(struct tcp_transport *t)
{
	for (struct tcp_pending *p = t->pendings; p; p = p->next) {
		uint32_t ev = p->state == TCP_PENDING_READ_HELLO ? EPOLLIN : EPOLLOUT;
		if (ev != p->ev_reg)
			tcp_fd_poll_set(t, EPOLL_CTL_MOD, p->fd, &p->ref, &p->ev_reg, ev);
	}
	for (struct tcp_conn *c = t->conns; c; c = c->next) {
		if (c->err)
			continue;
		for (int i = 0; i < c->nstreams; i++) {
			struct tcp_stream *s = &c->streams[i];
			uint32_t ev = (uint32_t)(uint16_t)stream_events(c, s);
			if (s->fd >= 0 && ev != s->ev_reg)
				tcp_fd_poll_set(t, EPOLL_CTL_MOD, s->fd, &s->ref, &s->ev_reg, ev);
		}
	}
}

/* ---- the loop ----------------------------------------------------------- */

/* A peer the liveness probe lost fails the whole endpoint, as abort() does
 * but with KOLO_EPEER and a message naming it: a collective that never
 * touches the lost peer's conns (the small-message algorithms, a partition
 * between two ranks that are not ring neighbours) must fail too, or the job
 * would go on with a member it cannot reach. */
void tcp_poll_fail_lost(struct tcp_transport *t)
{
	if (!tcp_probe_pending(t->probe))
		return;
	tcp_probe_ack(t->probe);
	for (struct tcp_conn *c = t->conns; c; c = c->next) {
		if (c->err || !tcp_probe_lost(t->probe, c->base.peer_rank))
			continue;
		tcp_conn_fail(c, KOLO_EPEER,
		              "rank %d's host (%s) stopped answering: no TCP acknowledgement "
		              "within %d ms (KOLO_PROBE_TIMEOUT_MS)",
		              c->base.peer_rank, c->peer_addr, t->probe_timeout_ms);
		if (!t->lost_msg[0])
			snprintf(t->lost_msg, sizeof(t->lost_msg), "%s", c->errmsg);
	}
	if (!t->lost_msg[0])
		snprintf(t->lost_msg, sizeof(t->lost_msg),
		         "a peer's host stopped answering: no TCP acknowledgement within %d ms "
		         "(KOLO_PROBE_TIMEOUT_MS)",
		         t->probe_timeout_ms);
	tcp_transport_abort(&t->base, KOLO_EPEER);
}

/* timeout_ms shortened to the next deadline (negative: wait for it). */
static int wait_ms(const struct tcp_transport *t, int timeout_ms)
{
	int64_t until = next_deadline(t) - (int64_t)kolo_now_ms();
	int to = timeout_ms;
	if (until < INT64_MAX / 2) {
		int64_t u = KOLO_MAX(until, (int64_t)0);
		if (to < 0 || u < to)
			to = (int)KOLO_MIN(u, (int64_t)INT32_MAX);
	}
	return to;
}

void tcp_poll_progress(struct tcp_transport *t, int timeout_ms)
{
	arm(t);
	struct epoll_event evs[64];
	int n = epoll_wait(t->epfd, evs, (int)KOLO_ARRAY_SIZE(evs), wait_ms(t, timeout_ms));
	for (int i = 0; i < n; i++) {
		struct tcp_poll_ref *r = evs[i].data.ptr;
		/* EPOLLIN/OUT/ERR/HUP have poll()'s values. */
		short rev = (short)(evs[i].events & (EPOLLIN | EPOLLOUT | EPOLLERR | EPOLLHUP));
		switch (r->kind) {
		case TCP_POLL_WAKE:
			break;
		case TCP_POLL_LISTEN:
			tcp_acceptor_accept(t);
			break;
		case TCP_POLL_PENDING:
			tcp_acceptor_step(t, r->obj);
			break;
		case TCP_POLL_STREAM: {
			struct tcp_conn *c = r->obj;
			tcp_stream_progress(c, &c->streams[r->stream], rev);
			break;
		}
		}
	}
	sweep_deadlines(t, kolo_now_ms());
	tcp_poll_fail_lost(t);
	t->last_sweep_ms = kolo_now_ms();
	/* Leave the interests current for a caller that polls poll_fd(). */
	arm(t);
}
