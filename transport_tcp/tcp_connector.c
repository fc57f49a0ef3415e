/* The connector's side of the TCP handshake, one stream at a time: connect,
 * read the acceptor's challenge, write the hello, read the verdict and check
 * that an acceptance proves the token. */
#include "tcp_internal.h"

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#define SUBSYS "tcp"

kolo_status_t tcp_connector_start(struct tcp_conn *c, int idx, const struct sockaddr_storage *addr,
                                  socklen_t addrlen)
{
	struct tcp_transport *t = c->t;
	struct tcp_stream *s = &c->streams[idx];
	s->fd = socket(addr->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (s->fd < 0)
		return kolo_fail(&t->base.err, KOLO_ESYSTEM, "socket: %s", strerror(errno));
	tcp_fd_set_options(t, s->fd);
	s->ref = (struct tcp_poll_ref){.kind = TCP_POLL_STREAM, .stream = idx, .obj = c};
	if (!tcp_fd_poll_set(t, EPOLL_CTL_ADD, s->fd, &s->ref, &s->ev_reg, 0))
		return kolo_fail(&t->base.err, KOLO_ESYSTEM, "epoll: %s", strerror(errno));
	s->state = TCP_STREAM_CONNECTING;
	if (connect(s->fd, (const struct sockaddr *)addr, addrlen) == 0) {
		s->state = TCP_STREAM_READ_CHALLENGE;
		s->hs_len = TCP_CHALLENGE_SIZE;
	} else if (errno != EINPROGRESS && errno != EINTR) {
		tcp_conn_fail(c, KOLO_EPEER, "cannot connect to rank %d at %s: %s",
		              c->base.peer_rank, c->peer_addr, strerror(errno));
	}
	return KOLO_OK;
}

/* A connecting stream: whether its connect completed (it then reads the
 * challenge). */
static bool connect_done(struct tcp_conn *c, struct tcp_stream *s, short revents)
{
	if (!revents) {
		struct pollfd p = {.fd = s->fd, .events = POLLOUT};
		if (poll(&p, 1, 0) <= 0)
			return false;
		revents = p.revents;
	}
	int err = 0;
	socklen_t len = sizeof(err);
	getsockopt(s->fd, SOL_SOCKET, SO_ERROR, &err, &len);
	if (err) {
		tcp_conn_fail(c, KOLO_EPEER, "cannot connect to rank %d at %s: %s",
		              c->base.peer_rank, c->peer_addr, strerror(err));
		return false;
	}
	if (!(revents & POLLOUT))
		return false;
	tcp_conn_touch(c);
	s->state = TCP_STREAM_READ_CHALLENGE;
	s->hs_off = 0;
	s->hs_len = TCP_CHALLENGE_SIZE;
	return true;
}

/* The challenge is in: answer it with the hello. */
static void on_challenge(struct tcp_conn *c, struct tcp_stream *s, int idx)
{
	const struct tcp_transport *t = c->t;
	if (!tcp_wire_challenge_decode(s->hs, s->anonce)) {
		tcp_conn_fail(c, KOLO_EPROTO,
		              "%s (rank %d) is not a kolo endpoint of wire version %d",
		              c->peer_addr, c->base.peer_rank, KOLO_WIRE_VERSION);
		return;
	}
	if (kolo_random_bytes(s->cnonce, TCP_NONCE_SIZE) != KOLO_OK) {
		tcp_conn_fail(c, KOLO_ESYSTEM, "no random bytes for the handshake");
		return;
	}
	struct tcp_hello h = {
	        .round = t->round,
	        .src = t->rank,
	        .dst = c->base.peer_rank,
	        .tag = c->base.tag,
	        .stream = (uint32_t)idx,
	        .nstreams = (uint32_t)c->nstreams,
	        .probe_port = tcp_probe_port(t->probe),
	};
	memcpy(h.job, t->job, TCP_JOB_FIELD);
	memcpy(h.cnonce, s->cnonce, TCP_NONCE_SIZE);
	tcp_wire_hello_encode(&h, t->token, t->token_len, s->anonce, s->hs);
	s->state = TCP_STREAM_WRITE_HELLO;
	s->hs_off = 0;
	s->hs_len = TCP_HELLO_SIZE;
}

/* The verdict is in: the stream is ready, or the conn fails. */
static void on_verdict(struct tcp_conn *c, struct tcp_stream *s, int idx)
{
	const struct tcp_transport *t = c->t;
	uint32_t st;
	char reason[TCP_REASON_SIZE + 1];
	if (!tcp_wire_verdict_decode(s->hs, &st, reason)) {
		tcp_conn_fail(c, KOLO_EPROTO, "rank %d (%s) answered the handshake with garbage",
		              c->base.peer_rank, c->peer_addr);
		return;
	}
	if (st != 0) {
		kolo_status_t kst = st == KOLO_EAUTH ? KOLO_EAUTH : KOLO_EPROTO;
		tcp_conn_fail(c, kst, "rank %d (%s) refused the connection: %s", c->base.peer_rank,
		              c->peer_addr, reason);
		return;
	}
	if (!tcp_wire_verdict_verify(s->hs, t->token, t->token_len, s->cnonce, s->anonce)) {
		tcp_conn_fail(c, KOLO_EAUTH,
		              "rank %d (%s) accepted stream %d without proving the job token: not "
		              "our peer",
		              c->base.peer_rank, c->peer_addr, idx);
		return;
	}
	s->state = TCP_STREAM_READY;
	c->nready++;
	KOLO_DEBUG(SUBSYS, "stream %d/%d to rank %d tag %d ready", idx + 1, c->nstreams,
	           c->base.peer_rank, c->base.tag);
}

void tcp_connector_step(struct tcp_conn *c, struct tcp_stream *s, short revents)
{
	int idx = (int)(s - c->streams);
	if (s->state == TCP_STREAM_CONNECTING && !connect_done(c, s, revents))
		return;
	while (!c->err && s->state != TCP_STREAM_READY) {
		ssize_t n;
		bool reading = s->state != TCP_STREAM_WRITE_HELLO;
		if (reading)
			n = recv(s->fd, s->hs + s->hs_off, s->hs_len - s->hs_off, MSG_DONTWAIT);
		else
			n = send(s->fd, s->hs + s->hs_off, s->hs_len - s->hs_off,
			         MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n <= 0) {
			if (n == 0 && reading) {
				tcp_conn_fail(c, KOLO_EPEER,
				              "rank %d (%s) closed stream %d during the handshake",
				              c->base.peer_rank, c->peer_addr, idx);
				return;
			}
			if (tcp_conn_io_stop(c, n, reading))
				return;
			continue;
		}
		tcp_conn_touch(c);
		s->hs_off += (size_t)n;
		if (s->hs_off < s->hs_len)
			continue;
		if (s->state == TCP_STREAM_READ_CHALLENGE) {
			on_challenge(c, s, idx);
		} else if (s->state == TCP_STREAM_WRITE_HELLO) {
			s->state = TCP_STREAM_READ_VERDICT;
			s->hs_off = 0;
			s->hs_len = TCP_VERDICT_SIZE;
		} else {
			on_verdict(c, s, idx);
		}
	}
}
