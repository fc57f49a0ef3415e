/* The TCP transport's conns and requests: their lifetime, their failure, and
 * the setup of the sockets they own. */
#include "tcp_internal.h"
#include "metrics.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#define SUBSYS "tcp"

/* ---- requests ----------------------------------------------------------- */

void tcp_req_list_append(struct tcp_req_list *l, struct tcp_req *r)
{
	r->next = NULL;
	r->prev = l->tail;
	if (l->tail)
		l->tail->next = r;
	else
		l->head = r;
	l->tail = r;
}

void tcp_req_list_remove(struct tcp_req_list *l, struct tcp_req *r)
{
	if (r->prev)
		r->prev->next = r->next;
	else
		l->head = r->next;
	if (r->next)
		r->next->prev = r->prev;
	else
		l->tail = r->prev;
	r->prev = r->next = NULL;
}

struct tcp_req *tcp_req_get(struct tcp_transport *t)
{
	struct tcp_req *r = t->free_reqs;
	if (r)
		t->free_reqs = r->next;
	else
		r = malloc(sizeof(*r));
	if (r)
		memset(r, 0, sizeof(*r));
	return r;
}

void tcp_req_put(struct tcp_transport *t, struct tcp_req *r)
{
	r->conn = NULL;
	r->next = t->free_reqs;
	t->free_reqs = r;
}

void tcp_req_complete(struct tcp_conn *c, struct tcp_req *r)
{
	tcp_req_list_remove(r->is_send ? &c->sendq : &c->recvq, r);
	r->complete = true;
	tcp_req_list_append(&c->doneq, r);
}

/* ---- sockets ------------------------------------------------------------ */

/* SO_LINGER 0 makes close() send RST. The fd leaves the epoll set first: a
 * copy inherited by a forked child would keep it registered. */
void tcp_fd_reset_close(struct tcp_transport *t, int fd)
{
	if (fd < 0)
		return;
	epoll_ctl(t->epfd, EPOLL_CTL_DEL, fd, NULL);
	struct linger lg = {.l_onoff = 1, .l_linger = 0};
	setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
	close(fd);
}

bool tcp_fd_poll_set(struct tcp_transport *t, int op, int fd, struct tcp_poll_ref *ref,
                     uint32_t *ev_reg, uint32_t ev)
{
	struct epoll_event e = {.events = ev, .data.ptr = ref};
	*ev_reg = ev;
	return epoll_ctl(t->epfd, op, fd, &e) == 0;
}

void tcp_fd_set_options(const struct tcp_transport *t, int fd)
{
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
	/* Keepalive probes a quiet peer within about the progress timeout.
	 * TCP_USER_TIMEOUT is a backstop at twice the timeout: the progress
	 * timer already fails a conn with pending work, and a tighter value
	 * would let the kernel abort a conn whose receiver legitimately left
	 * a completed message unread for a while (zero-window probing). */
	int idle = KOLO_MAX(1, t->timeout_ms / 3000);
	int intvl = KOLO_MAX(1, idle / 3);
	int cnt = 3;
	unsigned int uto = (unsigned int)KOLO_MIN((int64_t)t->timeout_ms * 2, (int64_t)INT32_MAX);
	setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
	setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
	setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
	setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &uto, sizeof(uto));
	/* Setting SO_SNDBUF/SO_RCVBUF turns the kernel's autotuning off for
	 * the socket, so only when asked. */
	if (t->socket_buffer > 0) {
		setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &t->socket_buffer, sizeof(t->socket_buffer));
		setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &t->socket_buffer, sizeof(t->socket_buffer));
	}
}

/* ---- conns -------------------------------------------------------------- */

void tcp_conn_touch(struct tcp_conn *c)
{
	c->last_progress_ms = kolo_now_ms();
}

bool tcp_conn_busy(const struct tcp_conn *c)
{
	return c->sendq.head || c->recvq.head;
}

struct tcp_conn *tcp_conn_new(struct tcp_transport *t, int peer_rank, int tag, int nstreams)
{
	struct tcp_conn *c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	c->base.transport = &t->base;
	c->base.peer_rank = peer_rank;
	c->base.tag = tag;
	c->t = t;
	c->nstreams = nstreams;
	for (int i = 0; i < KOLO_TCP_MAX_STREAMS; i++) {
		c->streams[i].fd = -1;
		c->streams[i].state = TCP_STREAM_EMPTY;
	}
	tcp_conn_touch(c);
	TCP_LIST_PUSH(t->conns, c);
	return c;
}

void tcp_conn_free(struct tcp_transport *t, struct tcp_conn *c)
{
	TCP_LIST_UNLINK(t->conns, c);
	for (int i = 0; i < c->nstreams; i++)
		tcp_fd_reset_close(c->t, c->streams[i].fd);
	for (struct tcp_pending *p = t->pendings; p; p = p->next)
		if (p->target == c)
			p->target = NULL;
	struct tcp_req_list *lists[] = {&c->sendq, &c->recvq, &c->doneq};
	for (size_t i = 0; i < KOLO_ARRAY_SIZE(lists); i++) {
		while (lists[i]->head) {
			struct tcp_req *r = lists[i]->head;
			tcp_req_list_remove(lists[i], r);
			tcp_req_put(t, r);
		}
	}
	free(c);
}

void tcp_conn_fail(struct tcp_conn *c, kolo_status_t st, const char *fmt, ...)
{
	if (c->err)
		return;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(c->errmsg, sizeof(c->errmsg), fmt, ap);
	va_end(ap);
	c->err = st;
	if (st == KOLO_EPEER && c->t->quiet_peer_close) {
		KOLO_DEBUG(SUBSYS, "%s (%s)", c->errmsg, kolo_status_name(st));
	} else {
		kolo_metrics_transport_error(KOLO_MTRANSPORT_TCP, st);
		KOLO_WARN(SUBSYS, "%s (%s)", c->errmsg, kolo_status_name(st));
	}
	for (int i = 0; i < c->nstreams; i++) {
		tcp_fd_reset_close(c->t, c->streams[i].fd);
		c->streams[i].fd = -1;
		c->streams[i].state = TCP_STREAM_DEAD;
	}
}

bool tcp_conn_io_stop(struct tcp_conn *c, ssize_t n, bool reading)
{
	if (n == 0 && reading) {
		tcp_conn_fail(c, KOLO_EPEER, "rank %d (tag %d, %s) closed the connection",
		              c->base.peer_rank, c->base.tag, c->peer_addr);
		return true;
	}
	if (errno == EINTR)
		return false;
	if (errno == EAGAIN || errno == EWOULDBLOCK)
		return true;
	tcp_conn_fail(c, KOLO_EPEER, "connection to rank %d (tag %d, %s) failed while %s: %s",
	              c->base.peer_rank, c->base.tag, c->peer_addr,
	              reading ? "receiving" : "sending", strerror(errno));
	return true;
}
