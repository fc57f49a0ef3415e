/* The TCP transport's ops table (core/transport.h): endpoint creation and
 * listening, conns and requests as the contract sees them. The handshakes,
 * the data path and the poll loop are in the files tcp_internal.h lists. */
#include "transport_tcp.h"
#include "tcp_internal.h"

#include <errno.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#define SUBSYS "tcp"

static kolo_status_t aborted(struct tcp_transport *t)
{
	int st = atomic_load_explicit(&t->abort_st, memory_order_acquire);
	if (st && t->lost_msg[0]) /* only this thread writes lost_msg */
		return kolo_fail(&t->base.err, (kolo_status_t)st, "%s", t->lost_msg);
	if (st)
		return kolo_fail(&t->base.err, (kolo_status_t)st, "the transport was aborted (%s)",
		                 kolo_status_name((kolo_status_t)st));
	return KOLO_OK;
}

static void tcp_destroy(struct kolo_transport *kt);

static kolo_status_t tcp_create(const struct kolo_transport_config *cfg,
                                struct kolo_transport **out, struct kolo_errbuf *eb)
{
	*out = NULL;
	if (!cfg || cfg->size < 1 || cfg->rank < 0 || cfg->rank >= cfg->size ||
	    (cfg->token_len && !cfg->token))
		return kolo_fail(eb, KOLO_EINVAL, "tcp: rank %d of %d, or a token without bytes",
		                 cfg ? cfg->rank : -1, cfg ? cfg->size : 0);
	const char *job = cfg->job ? cfg->job : "";
	if (strlen(job) >= TCP_JOB_FIELD)
		return kolo_fail(eb, KOLO_EINVAL, "tcp: job id longer than %d bytes",
		                 TCP_JOB_FIELD - 1);
	struct tcp_transport *t = calloc(1, sizeof(*t));
	if (!t)
		return kolo_fail(eb, KOLO_ENOMEM, "tcp: out of memory");
	kolo_status_t st = KOLO_OK;
	t->base.ops = &kolo_transport_tcp_ops;
	t->listen_fd = -1;
	t->wake_fd = -1;
	t->epfd = -1;
	atomic_init(&t->abort_st, 0);
	memcpy(t->job, job, strlen(job));
	t->round = cfg->round;
	t->rank = cfg->rank;
	t->size = cfg->size;
	t->token_len = cfg->token_len;
	t->token = malloc(KOLO_MAX(cfg->token_len, (size_t)1));
	if (!t->token) {
		st = kolo_fail(eb, KOLO_ENOMEM, "tcp: out of memory");
		goto fail;
	}
	if (cfg->token_len)
		memcpy(t->token, cfg->token, cfg->token_len);
	t->timeout_ms = cfg->timeout_ms > 0
	                        ? cfg->timeout_ms
	                        : (int)strtol(kolo_param_info(KOLO_P_TIMEOUT_MS)->def, NULL, 10);
	t->streams = cfg->streams > 0 ? KOLO_MIN(cfg->streams, KOLO_TCP_MAX_STREAMS) : 0;
	t->socket_buffer = KOLO_MAX(cfg->socket_buffer, 0);
	t->probe_ms = KOLO_MAX(cfg->probe_ms, 0);
	t->quiet_peer_close = cfg->quiet_peer_close;
	t->probe_timeout_ms = KOLO_MAX(cfg->probe_timeout_ms, 1);
	size_t cb =
	        cfg->tcp_chunk_bytes
	                ? cfg->tcp_chunk_bytes
	                : (size_t)strtoull(kolo_param_info(KOLO_P_TCP_CHUNK_BYTES)->def, NULL, 10);
	t->chunk_bytes = KOLO_MIN(KOLO_MAX(cb, (size_t)TCP_MIN_CHUNK), (size_t)TCP_MAX_CHUNK);
	t->epfd = epoll_create1(EPOLL_CLOEXEC);
	t->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (t->epfd < 0 || t->wake_fd < 0) {
		st = kolo_fail(eb, KOLO_ESYSTEM, "tcp: epoll/eventfd: %s", strerror(errno));
		goto fail;
	}
	t->wake_ref.kind = TCP_POLL_WAKE;
	uint32_t ev;
	if (!tcp_fd_poll_set(t, EPOLL_CTL_ADD, t->wake_fd, &t->wake_ref, &ev, EPOLLIN)) {
		st = kolo_fail(eb, KOLO_ESYSTEM, "tcp: epoll: %s", strerror(errno));
		goto fail;
	}
	st = kolo_tcp_pick_address(cfg->iface, cfg->route_to, &t->addr, &t->addrlen, eb);
	if (st != KOLO_OK)
		goto fail;
	tcp_addr_str(&t->addr, t->addr_str, sizeof(t->addr_str));
	*out = &t->base;
	return KOLO_OK;
fail:
	tcp_destroy(&t->base);
	return st;
}

static kolo_status_t tcp_listen(struct kolo_transport *kt, struct kolo_transport_handle *out)
{
	struct tcp_transport *t = tcp_transport_of(kt);
	KOLO_CHECK(aborted(t));
	if (t->listen_fd >= 0)
		return kolo_fail(&kt->err, KOLO_EINVAL, "listen() was called already");
	int fd = socket(t->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return kolo_fail(&kt->err, KOLO_ESYSTEM, "socket: %s", strerror(errno));
	int one = 1;
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (t->socket_buffer > 0) /* inherited by accepted sockets, before the window scale */
		setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &t->socket_buffer, sizeof(t->socket_buffer));
	struct sockaddr_storage ss = t->addr;
	socklen_t len = t->addrlen;
	if (bind(fd, (struct sockaddr *)&ss, len) != 0 || listen(fd, SOMAXCONN) != 0) {
		int e = errno;
		close(fd);
		return kolo_fail(&kt->err, KOLO_ESYSTEM, "cannot listen on %s: %s", t->addr_str,
		                 strerror(e));
	}
	len = sizeof(ss);
	getsockname(fd, (struct sockaddr *)&ss, &len);
	t->addr = ss;
	t->addrlen = len;
	tcp_addr_str(&t->addr, t->addr_str, sizeof(t->addr_str));
	t->listen_ref.kind = TCP_POLL_LISTEN;
	uint32_t ev;
	if (!tcp_fd_poll_set(t, EPOLL_CTL_ADD, fd, &t->listen_ref, &ev, EPOLLIN)) {
		int e = errno;
		close(fd);
		return kolo_fail(&kt->err, KOLO_ESYSTEM, "epoll: %s", strerror(e));
	}
	t->listen_fd = fd;
	tcp_handle_encode(&t->addr, out);
	if (t->probe_ms > 0) {
		struct tcp_probe_config pc = {.period_ms = t->probe_ms,
		                              .timeout_ms = t->probe_timeout_ms,
		                              .addr = &t->addr,
		                              .addrlen = t->addrlen,
		                              .notify_fd = t->wake_fd};
		struct kolo_errbuf eb = {{0}};
		if (tcp_probe_start(&pc, &t->probe, &eb) == KOLO_OK)
			tcp_handle_set_probe_port(out, tcp_probe_port(t->probe));
		else /* the job still runs; a vanished host is found by the timeouts */
			KOLO_WARN(SUBSYS, "%s", eb.msg);
	}
	KOLO_DEBUG(SUBSYS, "rank %d listening on %s (round %lld)", t->rank, t->addr_str,
	           (long long)t->round);
	return KOLO_OK;
}

/* Whether peer is this host: a loopback address or the one we listen on.
 * There the copies, not the wire, limit a stream, and more streams only add
 * system calls; between hosts a second stream keeps the link busy while one
 * waits for its window. */
bool tcp_transport_same_host(const struct tcp_transport *t, const struct sockaddr_storage *peer)
{
	if (peer->ss_family != t->addr.ss_family)
		return false;
	if (peer->ss_family == AF_INET) {
		const struct sockaddr_in *p = (const void *)peer, *me = (const void *)&t->addr;
		return (ntohl(p->sin_addr.s_addr) >> 24) == 127 ||
		       p->sin_addr.s_addr == me->sin_addr.s_addr;
	}
	if (peer->ss_family == AF_INET6) {
		const struct sockaddr_in6 *p = (const void *)peer, *me = (const void *)&t->addr;
		return IN6_IS_ADDR_LOOPBACK(&p->sin6_addr) ||
		       memcmp(&p->sin6_addr, &me->sin6_addr, sizeof(p->sin6_addr)) == 0;
	}
	return false;
}

static kolo_status_t tcp_connect(struct kolo_transport *kt,
                                 const struct kolo_transport_handle *peer, int peer_rank, int tag,
                                 struct kolo_conn **out)
{
	struct tcp_transport *t = tcp_transport_of(kt);
	*out = NULL;
	KOLO_CHECK(aborted(t));
	struct sockaddr_storage ss;
	socklen_t len;
	if (!peer || kolo_tcp_handle_decode(peer, &ss, &len) != KOLO_OK)
		return kolo_fail(&kt->err, KOLO_EINVAL, "rank %d's handle is not a TCP handle",
		                 peer_rank);
	bool local = tcp_transport_same_host(t, &ss);
	int nstreams = t->streams ? t->streams : 1; /* measured: docs/transport.md */
	struct tcp_conn *c = tcp_conn_new(t, peer_rank, tag, nstreams);
	if (!c)
		return kolo_fail(&kt->err, KOLO_ENOMEM, "out of memory");
	tcp_addr_str(&ss, c->peer_addr, sizeof(c->peer_addr));
	/* A host can only vanish from another host. */
	if (!local)
		tcp_probe_watch(t->probe, peer_rank, &ss, len, tcp_handle_probe_port(peer));
	for (int i = 0; i < c->nstreams && !c->err; i++) {
		kolo_status_t st = tcp_connector_start(c, i, &ss, len);
		if (st != KOLO_OK) {
			tcp_conn_free(t, c);
			return st;
		}
	}
	tcp_conn_progress(c);
	if (tcp_probe_lost(t->probe, peer_rank))
		tcp_poll_fail_lost(t);
	*out = &c->base;
	return KOLO_OK;
}

static kolo_status_t tcp_accept(struct kolo_transport *kt, int peer_rank, int tag,
                                struct kolo_conn **out)
{
	struct tcp_transport *t = tcp_transport_of(kt);
	*out = NULL;
	KOLO_CHECK(aborted(t));
	if (t->listen_fd < 0)
		return kolo_fail(&kt->err, KOLO_EINVAL, "accept() before listen()");
	tcp_poll_progress(t, 0);
	for (struct tcp_conn *c = t->conns; c; c = c->next) {
		if (!c->incoming || c->accepted || c->base.peer_rank != peer_rank ||
		    c->base.tag != tag || (c->nready < c->nstreams && !c->err))
			continue;
		c->accepted = true;
		tcp_conn_touch(c);
		*out = &c->base;
		return KOLO_OK;
	}
	return KOLO_OK;
}

static kolo_status_t post(struct kolo_conn *kc, void *buf, size_t len, bool is_send,
                          struct kolo_req **out)
{
	struct tcp_conn *c = tcp_conn_of(kc);
	struct tcp_transport *t = c->t;
	*out = NULL;
	KOLO_CHECK(aborted(t));
	if (c->err)
		return kolo_fail(&t->base.err, c->err, "%s", c->errmsg);
	if (!buf && len)
		return kolo_fail(&t->base.err, KOLO_EINVAL, "NULL buffer of %zu bytes", len);
	struct tcp_req *r = tcp_req_get(t);
	if (!r)
		return kolo_fail(&t->base.err, KOLO_ENOMEM, "out of memory");
	if (!tcp_conn_busy(c))
		tcp_conn_touch(c);
	r->conn = c;
	r->buf = buf;
	r->len = len;
	r->is_send = is_send;
	*out = (struct kolo_req *)r;
	if (is_send) {
		r->seq = c->next_send_seq++;
		tcp_req_list_append(&c->sendq, r);
		if (!c->cut_req)
			c->cut_req = r;
		/* Send eagerly: a small message leaves before the first test. */
		for (int i = 0; i < c->nstreams && c->cut_req && !c->err; i++)
			if (tcp_stream_want_send(c, &c->streams[i]))
				tcp_stream_send(c, &c->streams[i]);
	} else {
		r->seq = c->next_recv_seq++;
		tcp_req_list_append(&c->recvq, r);
		for (int i = 0; i < c->nstreams && !c->err; i++) {
			struct tcp_stream *s = &c->streams[i];
			if (s->paused && s->rchunk.seq == r->seq)
				tcp_stream_bind_chunk(c, s);
		}
	}
	return KOLO_OK;
}

static kolo_status_t tcp_isend(struct kolo_conn *kc, const void *buf, size_t len,
                               struct kolo_req **out)
{
	return post(kc, (void *)buf, len, true, out);
}

static kolo_status_t tcp_irecv(struct kolo_conn *kc, void *buf, size_t len, struct kolo_req **out)
{
	return post(kc, buf, len, false, out);
}

static void req_release(struct tcp_conn *c, struct tcp_req *r)
{
	if (r->complete) {
		tcp_req_list_remove(&c->doneq, r);
	} else {
		for (int i = 0; i < c->nstreams; i++) {
			if (c->streams[i].sreq == r || c->streams[i].rreq == r) {
				/* Only on a failed conn or abort: the stream dies. */
				c->streams[i].sreq = NULL;
				c->streams[i].rreq = NULL;
				c->streams[i].in_payload = false;
			}
		}
		if (c->cut_req == r)
			c->cut_req = r->next;
		tcp_req_list_remove(r->is_send ? &c->sendq : &c->recvq, r);
	}
	tcp_req_put(c->t, r);
}

static kolo_status_t tcp_test(struct kolo_req *kr, bool *done)
{
	struct tcp_req *r = (struct tcp_req *)kr;
	struct tcp_conn *c = r->conn;
	struct tcp_transport *t = c->t;
	*done = false;
	if (!r->complete && !c->err) {
		kolo_status_t st = aborted(t);
		if (st != KOLO_OK) {
			if (!c->err)
				tcp_conn_fail(c, st, "the transport was aborted");
			req_release(c, r);
			return st;
		}
		tcp_conn_progress(c);
		uint64_t now = kolo_now_ms();
		/* Handshakes and timeouts move on while the caller spins. */
		if (now != t->last_sweep_ms)
			tcp_poll_progress(t, 0);
	}
	if (r->complete) {
		req_release(c, r);
		*done = true;
		return KOLO_OK;
	}
	if (c->err) {
		kolo_status_t st = kolo_fail(&t->base.err, c->err, "%s", c->errmsg);
		req_release(c, r);
		return st;
	}
	return KOLO_OK;
}

static kolo_status_t tcp_wait(struct kolo_transport *kt, int timeout_ms)
{
	struct tcp_transport *t = tcp_transport_of(kt);
	KOLO_CHECK(aborted(t));
	tcp_poll_progress(t, timeout_ms);
	return aborted(t);
}

void tcp_transport_abort(struct kolo_transport *kt, kolo_status_t st)
{
	struct tcp_transport *t = tcp_transport_of(kt);
	if (st == KOLO_OK)
		st = KOLO_ECLOSED;
	int expected = 0;
	atomic_compare_exchange_strong(&t->abort_st, &expected, (int)st);
	uint64_t one = 1;
	ssize_t n = write(t->wake_fd, &one, sizeof(one));
	(void)n; /* a full counter already wakes the waiter */
}

static int tcp_poll_fd(struct kolo_transport *kt)
{
	/* The epoll set: readable when a socket is ready for what wait()
	 * would do, or after abort(). Interests are armed by wait(). */
	return tcp_transport_of(kt)->epfd;
}

static bool tcp_unreachable(struct kolo_transport *kt, int peer_rank)
{
	return tcp_probe_lost(tcp_transport_of(kt)->probe, peer_rank);
}

static int tcp_unacked_ms(struct kolo_transport *kt, int peer_rank)
{
	return tcp_probe_unacked_ms(tcp_transport_of(kt)->probe, peer_rank);
}

static void tcp_close(struct kolo_conn *kc)
{
	if (!kc)
		return;
	struct tcp_conn *c = tcp_conn_of(kc);
	tcp_conn_free(c->t, c);
}

static void tcp_destroy(struct kolo_transport *kt)
{
	if (!kt)
		return;
	struct tcp_transport *t = tcp_transport_of(kt);
	tcp_probe_stop(t->probe); /* it writes wake_fd */
	while (t->conns)
		tcp_conn_free(t, t->conns);
	while (t->pendings)
		tcp_pending_free(t, t->pendings);
	while (t->free_reqs) {
		struct tcp_req *r = t->free_reqs;
		t->free_reqs = r->next;
		free(r);
	}
	if (t->listen_fd >= 0)
		close(t->listen_fd);
	if (t->wake_fd >= 0)
		close(t->wake_fd);
	if (t->epfd >= 0)
		close(t->epfd);
	free(t->token);
	free(t);
}

const struct kolo_transport_ops kolo_transport_tcp_ops = {
        .name = "tcp",
        .create = tcp_create,
        .listen = tcp_listen,
        .connect = tcp_connect,
        .accept = tcp_accept,
        .isend = tcp_isend,
        .irecv = tcp_irecv,
        .test = tcp_test,
        .wait = tcp_wait,
        .abort = tcp_transport_abort,
        .close = tcp_close,
        .destroy = tcp_destroy,
        .unreachable = tcp_unreachable,
        .unacked_ms = tcp_unacked_ms,
        .poll_fd = tcp_poll_fd,
};
