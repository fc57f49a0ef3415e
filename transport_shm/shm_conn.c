/* shm_conn: conns and requests, the data path over the rings, and the
 * progress pass that drives handshakes, data and deadlines. */
#include "shm_internal.h"
#include "metrics.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

/* ---- helpers ---- */

static void list_push(struct shm_req_list *l, struct kolo_req *r)
{
	r->prev = l->last;
	r->next = NULL;
	if (l->last)
		l->last->next = r;
	else
		l->first = r;
	l->last = r;
}

static void list_unlink(struct shm_req_list *l, struct kolo_req *r)
{
	if (r->prev)
		r->prev->next = r->next;
	else
		l->first = r->next;
	if (r->next)
		r->next->prev = r->prev;
	else
		l->last = r->prev;
}

static void list_free(struct shm_req_list *l)
{
	struct kolo_req *r = l->first;
	while (r) {
		struct kolo_req *n = r->next;
		free(r);
		r = n;
	}
	l->first = l->last = NULL;
}

void shm_conn_fail(struct shm_conn *c, kolo_status_t st, const char *fmt, ...)
{
	if (c->state == SHM_CS_FAILED)
		return;
	char msg[KOLO_ERRBUF_SIZE];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	c->state = SHM_CS_FAILED;
	c->failed = st;
	kolo_metrics_transport_error(KOLO_MTRANSPORT_SHM, st);
	kolo_fail(&c->t->base.err, st, "shm conn to rank %d (tag %d): %s", c->base.peer_rank,
	          c->base.tag, msg);
}

kolo_status_t shm_conn_add(struct shm_transport *t, int fd, bool acceptor, int peer, int tag,
                           struct shm_conn **out)
{
	struct shm_conn *c = calloc(1, sizeof(*c));
	if (!c)
		return KOLO_ENOMEM;
	c->base.transport = &t->base;
	c->base.peer_rank = peer;
	c->base.tag = tag;
	c->t = t;
	c->fd = fd;
	c->acceptor = acceptor;
	c->state = acceptor ? SHM_CS_ACCEPTOR_WAIT_HELLO : SHM_CS_CONNECTOR_WAIT_NONCE;
	c->created_ns = c->last_progress_ns = kolo_now_ns();
	struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.ptr = c};
	if (epoll_ctl(t->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
		free(c);
		return KOLO_ESYSTEM;
	}
	c->next_conn = t->conns;
	t->conns = c;
	*out = c;
	return KOLO_OK;
}

void shm_conn_free(struct shm_conn *c)
{
	if (c->fd >= 0) {
		epoll_ctl(c->t->epfd, EPOLL_CTL_DEL, c->fd, NULL);
		close(c->fd);
	}
	if (c->map)
		munmap(c->map, c->map_len);
	list_free(&c->sends);
	list_free(&c->recvs);
	free(c);
}

static void conn_unlink(struct shm_transport *t, struct shm_conn *c)
{
	for (struct shm_conn **p = &t->conns; *p; p = &(*p)->next_conn) {
		if (*p == c) {
			*p = c->next_conn;
			return;
		}
	}
}

/* ---- data movement ---- */

/* A message on the rings is its length (8 bytes, host order: both ends are on
 * this host), then its bytes. The receiver checks the length against its
 * receive before it stores any byte, as the TCP transport does: ranks that
 * disagree about a count fail with KOLO_EPROTO instead of reading each
 * other's messages out of step. r->moved counts both parts. The length and
 * the bytes are published together, and consumed together, so that the
 * length costs no extra wake-up of a sleeping peer. */
#define SHM_HDR sizeof(uint64_t)

static size_t send_some(struct shm_conn *c, struct kolo_req *r)
{
	if (r->moved < SHM_HDR)
		return shm_ring_writev(c, (const uint8_t *)&r->hdr + r->moved, SHM_HDR - r->moved,
		                       r->buf, r->len);
	return shm_ring_write(c, r->buf + (r->moved - SHM_HDR), SHM_HDR + r->len - r->moved);
}

/* Reads what the rings hold of r's message; *bad when its length, complete
 * now, is not the receive's (nothing of it was stored). */
static size_t recv_some(struct shm_conn *c, struct kolo_req *r, bool *bad)
{
	if (r->moved >= SHM_HDR)
		return shm_ring_read(c, r->buf + (r->moved - SHM_HDR), SHM_HDR + r->len - r->moved);
	size_t need = SHM_HDR - r->moved;
	size_t got = shm_ring_peek(c, (uint8_t *)&r->hdr + r->moved, need);
	if (got < need) /* a length cut by a full ring: take its part */
		return shm_ring_readv(c, got, NULL, 0);
	if (r->hdr != r->len) {
		*bad = true;
		return got;
	}
	return shm_ring_readv(c, need, r->buf, r->len);
}

/* Moves as many bytes as the rings allow. Returns true when anything moved. */
static bool conn_progress(struct shm_conn *c)
{
	bool moved = false;
	if (c->state != SHM_CS_READY)
		return false;
	for (struct kolo_req *r = c->sends.first; r; r = r->next) {
		if (r->done)
			continue;
		if (c->peer_closed) {
			shm_conn_fail(c, KOLO_EPEER, "peer closed the connection");
			return moved;
		}
		size_t n;
		while (r->moved < SHM_HDR + r->len && (n = send_some(c, r)) > 0) {
			r->moved += n;
			moved = true;
		}
		if (r->moved < SHM_HDR + r->len)
			break;
		r->done = true;
		moved = true;
	}
	for (struct kolo_req *r = c->recvs.first; r; r = r->next) {
		if (r->done)
			continue;
		size_t n;
		bool bad = false;
		while (r->moved < SHM_HDR + r->len && (n = recv_some(c, r, &bad)) > 0) {
			moved = true;
			if (bad) {
				shm_conn_fail(
				        c, KOLO_EPROTO,
				        "the peer sent %llu bytes as one message; the matching "
				        "receive expects %zu (do the ranks pass the same count "
				        "and dtype to this collective?)",
				        (unsigned long long)r->hdr, r->len);
				return moved;
			}
			r->moved += n;
		}
		if (r->moved < SHM_HDR + r->len) {
			if (c->peer_closed) {
				shm_conn_fail(c, KOLO_EPEER, "peer closed the connection");
				return moved;
			}
			break;
		}
		r->done = true;
		moved = true;
	}
	if (moved)
		c->progress++;
	return moved;
}

static bool conn_pending(const struct shm_conn *c)
{
	for (struct kolo_req *r = c->sends.first; r; r = r->next)
		if (!r->done)
			return true;
	for (struct kolo_req *r = c->recvs.first; r; r = r->next)
		if (!r->done)
			return true;
	return false;
}

void shm_conn_drain(struct shm_conn *c)
{
	char buf[256];
	for (;;) {
		ssize_t n = recv(c->fd, buf, sizeof(buf), MSG_DONTWAIT);
		if (n > 0)
			continue;
		if (n < 0 && errno == EINTR)
			continue;
		if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
			/* Stop polling a closed socket, or wait() would spin. */
			c->peer_closed = true;
			epoll_ctl(c->t->epfd, EPOLL_CTL_DEL, c->fd, NULL);
		}
		return;
	}
}

static void check_timeout(struct shm_conn *c, uint64_t now)
{
	struct shm_transport *t = c->t;
	uint64_t limit = (uint64_t)t->timeout_ms * 1000000ull;
	if (c->progress != c->progress_seen) {
		c->progress_seen = c->progress;
		c->last_progress_ns = now;
	}
	if (t->timeout_ms <= 0 || now < c->last_progress_ns)
		return;
	if (c->state == SHM_CS_READY && conn_pending(c) && now - c->last_progress_ns > limit)
		shm_conn_fail(c, KOLO_ETIMEDOUT, "no progress for %d ms", t->timeout_ms);
	else if (c->state != SHM_CS_READY && c->state != SHM_CS_FAILED &&
	         now - c->created_ns > limit)
		shm_conn_fail(c, KOLO_ETIMEDOUT, "handshake not finished after %d ms",
		              t->timeout_ms);
}

bool shm_progress(struct shm_transport *t)
{
	bool any = false;
	shm_accept_new(t);
	uint64_t now = kolo_now_ns();
	struct shm_conn **p = &t->conns;
	while (*p) {
		struct shm_conn *c = *p;
		if (c->state == SHM_CS_ACCEPTOR_WAIT_HELLO)
			shm_acceptor_step(c);
		else if (c->state == SHM_CS_CONNECTOR_WAIT_NONCE ||
		         c->state == SHM_CS_CONNECTOR_WAIT_VERDICT)
			shm_connector_step(c);
		/* Unclaimed handshakes that failed are strays: drop them. */
		if (c->acceptor && !c->claimed && c->state == SHM_CS_FAILED) {
			*p = c->next_conn;
			shm_conn_free(c);
			continue;
		}
		if (c->state == SHM_CS_READY && conn_progress(c))
			any = true;
		check_timeout(c, now);
		p = &c->next_conn;
	}
	return any;
}

/* ---- requests ---- */

static kolo_status_t post(struct kolo_conn *base, void *buf, size_t len, bool send,
                          struct kolo_req **out)
{
	struct shm_conn *c = shm_cn(base);
	int ab = atomic_load(&c->t->abort_status);
	if (ab != KOLO_OK)
		return (kolo_status_t)ab;
	if (c->state == SHM_CS_FAILED)
		return c->failed;
	struct kolo_req *r = c->t->free_reqs;
	if (r) {
		c->t->free_reqs = r->next;
		*r = (struct kolo_req){0};
	} else if (!(r = calloc(1, sizeof(*r)))) {
		return KOLO_ENOMEM;
	}
	r->c = c;
	r->send = send;
	r->buf = buf;
	r->len = len;
	r->hdr = len; /* a send's length header; a receive's is read into it */
	if (!conn_pending(c))
		c->progress++; /* the deadline counts from now */
	list_push(send ? &c->sends : &c->recvs, r);
	*out = r;
	return KOLO_OK;
}

kolo_status_t shm_isend(struct kolo_conn *c, const void *buf, size_t len, struct kolo_req **out)
{
	return post(c, (void *)buf, len, true, out);
}

kolo_status_t shm_irecv(struct kolo_conn *c, void *buf, size_t len, struct kolo_req **out)
{
	return post(c, buf, len, false, out);
}

static void req_release(struct kolo_req *r)
{
	struct shm_transport *t = r->c->t;
	list_unlink(r->send ? &r->c->sends : &r->c->recvs, r);
	r->next = t->free_reqs;
	t->free_reqs = r;
}

kolo_status_t shm_test(struct kolo_req *r, bool *done)
{
	struct shm_conn *c = r->c;
	struct shm_transport *t = c->t;
	*done = false;
	int ab = atomic_load(&t->abort_status);
	if (ab != KOLO_OK) {
		req_release(r);
		return (kolo_status_t)ab;
	}
	if (!r->done) {
		if (c->state == SHM_CS_READY)
			conn_progress(c);
		else
			shm_progress(t);
	}
	if (r->done) {
		*done = true;
		req_release(r);
		return KOLO_OK;
	}
	if (c->state == SHM_CS_FAILED) {
		kolo_status_t st = c->failed;
		req_release(r);
		return st;
	}
	/* Every test would read the clock; every 64th is often enough, since
	 * wait() checks every conn too. */
	if (++c->tests_unchecked >= 64) {
		c->tests_unchecked = 0;
		check_timeout(c, kolo_now_ns());
	}
	return KOLO_OK;
}

void shm_close(struct kolo_conn *base)
{
	if (!base)
		return;
	struct shm_conn *c = shm_cn(base);
	conn_unlink(c->t, c);
	shm_conn_free(c);
}
