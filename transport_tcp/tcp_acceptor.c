/* The acceptor's side of the TCP handshake: every incoming connection is a
 * tcp_pending that writes a challenge, reads the hello, checks it and writes
 * the verdict; an accepted one then becomes a stream of its conn. */
#include "tcp_internal.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#define SUBSYS "tcp"

void tcp_pending_free(struct tcp_transport *t, struct tcp_pending *p)
{
	TCP_LIST_UNLINK(t->pendings, p);
	t->npending--;
	tcp_fd_reset_close(t, p->fd);
	free(p);
}

static void write_verdict(const struct tcp_transport *t, struct tcp_pending *p, kolo_status_t st,
                          const char *reason)
{
	tcp_wire_verdict_encode(st, reason, t->token, t->token_len, p->cnonce, p->nonce, p->buf);
	p->verdict = st;
	p->state = TCP_PENDING_WRITE_VERDICT;
	p->off = 0;
	p->len = TCP_VERDICT_SIZE;
}

static void refuse(struct tcp_transport *t, struct tcp_pending *p, kolo_status_t st,
                   const char *fmt, ...) __attribute__((format(printf, 4, 5)));

static void refuse(struct tcp_transport *t, struct tcp_pending *p, kolo_status_t st,
                   const char *fmt, ...)
{
	char reason[256];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(reason, sizeof(reason), fmt, ap);
	va_end(ap);
	KOLO_WARN(SUBSYS, "refused a connection from %s to %s: %s", p->peer, t->addr_str, reason);
	write_verdict(t, p, st, reason);
}

static struct tcp_conn *find_incoming(struct tcp_transport *t, int src, int tag)
{
	for (struct tcp_conn *c = t->conns; c; c = c->next)
		if (c->incoming && !c->err && c->base.peer_rank == src && c->base.tag == tag)
			return c;
	return NULL;
}

/* The whole hello is in: refuse it, or reserve its stream in its conn
 * (made on its first stream) and accept it. */
static void check_hello(struct tcp_transport *t, struct tcp_pending *p)
{
	struct tcp_hello h;
	char why[256];
	if (tcp_wire_hello_decode(p->buf, TCP_HELLO_SIZE, &h, why, sizeof(why)) != KOLO_OK) {
		refuse(t, p, KOLO_EPROTO, "%s", why);
		return;
	}
	if (!tcp_wire_hello_verify(p->buf, t->token, t->token_len, p->nonce)) {
		refuse(t, p, KOLO_EAUTH, "wrong job token");
		return;
	}
	memcpy(p->cnonce, h.cnonce, TCP_NONCE_SIZE);
	p->probe_port = h.probe_port;
	struct tcp_hello_expect e = {
	        .job = t->job, .round = t->round, .rank = t->rank, .size = t->size};
	if (tcp_wire_hello_admit(&h, &e, why, sizeof(why)) != KOLO_OK) {
		refuse(t, p, KOLO_EPROTO, "%s", why);
		return;
	}
	struct tcp_conn *c = find_incoming(t, h.src, h.tag);
	if (c && c->nstreams != (int)h.nstreams) {
		refuse(t, p, KOLO_EPROTO, "rank %d tag %d: %u streams, the conn has %d", h.src,
		       h.tag, h.nstreams, c->nstreams);
		return;
	}
	if (c && c->streams[h.stream].state != TCP_STREAM_EMPTY) {
		refuse(t, p, KOLO_EPROTO, "rank %d tag %d: duplicate stream %u", h.src, h.tag,
		       h.stream);
		return;
	}
	if (!c) {
		c = tcp_conn_new(t, h.src, h.tag, (int)h.nstreams);
		if (!c) {
			refuse(t, p, KOLO_EPROTO, "out of memory");
			return;
		}
		c->incoming = true;
		snprintf(c->peer_addr, sizeof(c->peer_addr), "%s", p->peer);
	}
	c->streams[h.stream].state = TCP_STREAM_RESERVED;
	p->target = c;
	p->stream = (int)h.stream;
	write_verdict(t, p, KOLO_OK, "accepted");
}

/* The verdict is written: hand an accepted stream to its conn. */
static void verdict_written(struct tcp_transport *t, struct tcp_pending *p)
{
	struct tcp_conn *c = p->target;
	if (p->verdict == KOLO_OK && c && !c->err) {
		struct tcp_stream *s = &c->streams[p->stream];
		s->fd = p->fd;
		s->state = TCP_STREAM_READY;
		s->ref = (struct tcp_poll_ref){
		        .kind = TCP_POLL_STREAM, .stream = p->stream, .obj = c};
		tcp_fd_poll_set(t, EPOLL_CTL_MOD, s->fd, &s->ref, &s->ev_reg, 0);
		p->fd = -1;
		c->nready++;
		tcp_conn_touch(c);
		/* Probe the connector too: each side of a conn can find the
		 * other's host gone, whichever one connected. */
		struct sockaddr_storage ss;
		socklen_t len = sizeof(ss);
		if (t->probe && p->probe_port &&
		    getpeername(s->fd, (struct sockaddr *)&ss, &len) == 0 &&
		    !tcp_transport_same_host(t, &ss))
			tcp_probe_watch(t->probe, c->base.peer_rank, &ss, len, p->probe_port);
		KOLO_DEBUG(SUBSYS, "accepted stream %d/%d from rank %d tag %d (%s)", p->stream + 1,
		           c->nstreams, c->base.peer_rank, c->base.tag, p->peer);
	}
	tcp_pending_free(t, p);
}

void tcp_acceptor_drop(struct tcp_transport *t, struct tcp_pending *p, const char *why)
{
	KOLO_WARN(SUBSYS, "dropped a connection from %s to %s: %s", p->peer, t->addr_str, why);
	if (p->target && p->verdict == KOLO_OK)
		tcp_conn_fail(p->target, KOLO_EPEER, "rank %d (tag %d, %s): %s",
		              p->target->base.peer_rank, p->target->base.tag, p->peer, why);
	tcp_pending_free(t, p);
}

void tcp_acceptor_step(struct tcp_transport *t, struct tcp_pending *p)
{
	for (;;) {
		bool reading = p->state == TCP_PENDING_READ_HELLO;
		ssize_t n;
		if (reading)
			n = recv(p->fd, p->buf + p->off, p->len - p->off, MSG_DONTWAIT);
		else
			n = send(p->fd, p->buf + p->off, p->len - p->off,
			         MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n == 0 && reading) {
			tcp_acceptor_drop(t, p, "closed during the handshake");
			return;
		}
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return;
			if (p->state == TCP_PENDING_WRITE_VERDICT && p->verdict != KOLO_OK) {
				tcp_pending_free(t, p); /* refused already; the peer left */
				return;
			}
			tcp_acceptor_drop(t, p, strerror(errno));
			return;
		}
		p->off += (size_t)n;
		if (reading && p->off >= 4 && !tcp_wire_magic_ok(p->buf)) {
			refuse(t, p, KOLO_EPROTO, "bad magic (not a kolo peer)");
			continue;
		}
		if (p->off < p->len)
			continue;
		switch (p->state) {
		case TCP_PENDING_WRITE_CHALLENGE:
			p->state = TCP_PENDING_READ_HELLO;
			p->off = 0;
			p->len = TCP_HELLO_SIZE;
			break;
		case TCP_PENDING_READ_HELLO:
			check_hello(t, p);
			break;
		case TCP_PENDING_WRITE_VERDICT:
			verdict_written(t, p);
			return;
		}
	}
}

/* Starts the handshake of a connection just accepted with its challenge;
 * out of handshakes, memory or entropy, resets it instead. */
static void pending_start(struct tcp_transport *t, int fd, const char *peer)
{
	struct tcp_pending *p = NULL;
	if (t->npending >= TCP_MAX_PENDING || !(p = calloc(1, sizeof(*p)))) {
		KOLO_WARN(SUBSYS, "dropped a connection from %s: too many handshakes", peer);
		tcp_fd_reset_close(t, fd);
		return;
	}
	tcp_fd_set_options(t, fd);
	p->fd = fd;
	snprintf(p->peer, sizeof(p->peer), "%s", peer);
	p->deadline_ms = kolo_now_ms() + (uint64_t)t->timeout_ms;
	p->verdict = KOLO_OK;
	p->ref = (struct tcp_poll_ref){.kind = TCP_POLL_PENDING, .obj = p};
	if (kolo_random_bytes(p->nonce, TCP_NONCE_SIZE) != KOLO_OK ||
	    !tcp_fd_poll_set(t, EPOLL_CTL_ADD, fd, &p->ref, &p->ev_reg, EPOLLOUT)) {
		KOLO_WARN(SUBSYS, "dropped a connection from %s: %s", peer, strerror(errno));
		tcp_fd_reset_close(t, fd);
		free(p);
		return;
	}
	tcp_wire_challenge_encode(p->nonce, p->buf);
	p->state = TCP_PENDING_WRITE_CHALLENGE;
	p->len = TCP_CHALLENGE_SIZE;
	TCP_LIST_PUSH(t->pendings, p);
	t->npending++;
	tcp_acceptor_step(t, p);
}

void tcp_acceptor_accept(struct tcp_transport *t)
{
	for (;;) {
		struct sockaddr_storage ss;
		socklen_t len = sizeof(ss);
		int fd = accept4(t->listen_fd, (struct sockaddr *)&ss, &len,
		                 SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			if (errno != EAGAIN && errno != EWOULDBLOCK)
				KOLO_WARN(SUBSYS, "accept on %s: %s", t->addr_str, strerror(errno));
			return;
		}
		char peer[64];
		tcp_addr_str(&ss, peer, sizeof(peer));
		pending_start(t, fd, peer);
	}
}
