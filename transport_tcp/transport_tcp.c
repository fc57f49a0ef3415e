/* The TCP transport: handshake, streams, chunking and progress.
 * Wire format and failure semantics: docs/transport.md. */
#include "transport_tcp.h"
#include "tcp_internal.h"

#include <endian.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/uio.h>
#include <unistd.h>

#define SUBSYS "tcp"

/* ---- wire format ------------------------------------------------------- */

#define JOB_FIELD      128
#define NONCE_SIZE     32
#define CHALLENGE_SIZE (8 + NONCE_SIZE)
/* hello: magic, version, job[128], round, src, dst, tag, stream, nstreams,
 * probe port (0: none), cnonce[32], mac[32]; the MAC covers nonce || hello[0, HELLO_MAC_OFF).
 * verdict: magic, status, reason[128], mac[32]; an acceptance's MAC covers
 * cnonce || nonce || verdict[0, VERDICT_MAC_OFF), so the connector knows that
 * the acceptor holds the token too. */
#define HELLO_CNONCE_OFF (8 + JOB_FIELD + 8 + 6 * 4)
#define HELLO_MAC_OFF    (HELLO_CNONCE_OFF + NONCE_SIZE)
#define HELLO_SIZE       (HELLO_MAC_OFF + KOLO_HMAC_SIZE)
#define REASON_SIZE      128
#define VERDICT_MAC_OFF  (8 + REASON_SIZE)
#define VERDICT_SIZE     (VERDICT_MAC_OFF + KOLO_HMAC_SIZE)
/* chunk header: magic, len, seq, offset, message length */
#define HDR_SIZE    32
#define CHUNK_MAGIC 0x4b434855u
#define MIN_CHUNK   (64u << 10)
#define MAX_CHUNK   (64u << 20)
/* Bytes one stream moves per progress call, so one direction or one busy
 * stream cannot starve the others. */
#define STREAM_BUDGET (8u << 20)
#define MAX_PENDING   1024

_Static_assert(HELLO_SIZE == 232 && VERDICT_SIZE == 168, "handshake layout");
_Static_assert(HELLO_SIZE >= VERDICT_SIZE && HELLO_SIZE >= CHALLENGE_SIZE, "handshake buffer");

static void put32(uint8_t *p, uint32_t v)
{
	v = htole32(v);
	memcpy(p, &v, 4);
}

static void put64(uint8_t *p, uint64_t v)
{
	v = htole64(v);
	memcpy(p, &v, 8);
}

static uint32_t get32(const uint8_t *p)
{
	uint32_t v;
	memcpy(&v, p, 4);
	return le32toh(v);
}

static uint64_t get64(const uint8_t *p)
{
	uint64_t v;
	memcpy(&v, p, 8);
	return le64toh(v);
}

/* ---- objects ----------------------------------------------------------- */

enum stream_state {
	SS_EMPTY,          /* acceptor: slot not arrived yet */
	SS_RESERVED,       /* acceptor: authenticated, verdict being written */
	SS_CONNECTING,     /* connector: TCP connect in progress */
	SS_READ_CHALLENGE, /* connector: reading the nonce */
	SS_WRITE_HELLO,    /* connector: writing hello + MAC */
	SS_READ_VERDICT,   /* connector: reading accept/refuse */
	SS_READY,
	SS_DEAD,
};

struct tcp_conn;

struct tcp_req {
	struct tcp_conn *conn;
	struct tcp_req *prev, *next;
	uint8_t *buf;
	size_t len;
	uint64_t seq;
	size_t done;  /* bytes written (send) or received (recv) */
	size_t cut;   /* send: bytes handed to streams */
	int inflight; /* send: chunks being written */
	bool is_send, started, complete;
};

struct req_list {
	struct tcp_req *head, *tail;
};

/* What an epoll event points at. */
enum poll_kind { PK_WAKE, PK_LISTEN, PK_PENDING, PK_STREAM };

struct poll_ref {
	enum poll_kind kind;
	int stream;
	void *obj;
};

struct tcp_stream {
	int fd;
	struct poll_ref ref;
	uint32_t ev_reg; /* events registered with epoll */
	enum stream_state state;
	uint8_t hs[HELLO_SIZE];                         /* handshake bytes */
	uint8_t anonce[NONCE_SIZE], cnonce[NONCE_SIZE]; /* the acceptor's and ours */
	size_t hs_off, hs_len;
	/* send: the chunk being written */
	struct tcp_req *sreq;
	uint8_t shdr[HDR_SIZE];
	const uint8_t *spay;
	size_t slen, ssent; /* ssent counts header + payload */
	/* receive: the header being read, or the chunk being received */
	uint8_t rhdr[HDR_SIZE];
	size_t rhdr_got;
	bool in_payload, paused;
	uint64_t pseq, poff, pmsglen;
	uint32_t plen;
	struct tcp_req *rreq;
	uint8_t *rdst;
	size_t rleft, rlen;
};

struct tcp_transport;

struct tcp_conn {
	struct kolo_conn base;
	struct tcp_transport *t;
	struct tcp_conn *prev, *next;
	bool incoming, accepted;
	int nstreams, nready;
	struct req_list sendq, recvq, doneq;
	struct tcp_req *cut_req; /* next send request to cut chunks from */
	uint64_t next_send_seq, next_recv_seq;
	uint64_t last_progress_ms;
	kolo_status_t err;
	char errmsg[256];
	char peer_addr[64];
	struct tcp_stream streams[KOLO_TCP_MAX_STREAMS];
};

enum pending_state { PS_WRITE_CHALLENGE, PS_READ_HELLO, PS_WRITE_VERDICT };

/* An incoming connection whose handshake is not done; not a conn yet. */
struct tcp_pending {
	struct tcp_pending *prev, *next;
	int fd;
	struct poll_ref ref;
	uint32_t ev_reg;
	enum pending_state state;
	uint8_t nonce[NONCE_SIZE];
	uint8_t cnonce[NONCE_SIZE]; /* the connector's, from its hello */
	uint8_t buf[HELLO_SIZE];
	size_t off, len;
	uint64_t deadline_ms;
	kolo_status_t verdict;
	struct tcp_conn *target; /* accepted: the conn the stream joins */
	int stream;
	uint16_t probe_port; /* the connector's liveness probe listener; 0: none */
	char peer[64];
};

struct tcp_transport {
	struct kolo_transport base;
	char job[JOB_FIELD];
	int64_t round;
	int rank, size;
	uint8_t *token;
	size_t token_len;
	int timeout_ms, streams, socket_buffer;
	size_t chunk_bytes;
	int listen_fd, wake_fd;
	atomic_int abort_st;
	struct sockaddr_storage addr;
	socklen_t addrlen;
	char addr_str[64];
	struct tcp_conn *conns;
	struct tcp_pending *pendings;
	int npending;
	struct tcp_req *free_reqs;
	int epfd;
	struct poll_ref wake_ref, listen_ref;
	uint64_t last_sweep_ms;
	int probe_ms, probe_timeout_ms;
	struct tcp_probe *probe; /* NULL: no liveness probe */
	char lost_msg[256];      /* set with the abort that a lost peer caused */
};

#define T(kt) kolo_container_of(kt, struct tcp_transport, base)
#define C(kc) kolo_container_of(kc, struct tcp_conn, base)

/* ---- small helpers ----------------------------------------------------- */

static void list_append(struct req_list *l, struct tcp_req *r)
{
	r->next = NULL;
	r->prev = l->tail;
	if (l->tail)
		l->tail->next = r;
	else
		l->head = r;
	l->tail = r;
}

static void list_remove(struct req_list *l, struct tcp_req *r)
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

static struct tcp_req *req_get(struct tcp_transport *t)
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

static void req_put(struct tcp_transport *t, struct tcp_req *r)
{
	r->conn = NULL;
	r->next = t->free_reqs;
	t->free_reqs = r;
}

/* Closes with a reset: SO_LINGER 0 makes close() send RST. The fd leaves
 * the epoll set first: a copy inherited by a forked child would keep it
 * registered. */
static void reset_close(struct tcp_transport *t, int fd)
{
	if (fd < 0)
		return;
	epoll_ctl(t->epfd, EPOLL_CTL_DEL, fd, NULL);
	struct linger lg = {.l_onoff = 1, .l_linger = 0};
	setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
	close(fd);
}

/* Registers (EPOLL_CTL_ADD) or updates (EPOLL_CTL_MOD) fd's interest. */
static bool ep_set(struct tcp_transport *t, int op, int fd, struct poll_ref *ref, uint32_t *ev_reg,
                   uint32_t ev)
{
	struct epoll_event e = {.events = ev, .data.ptr = ref};
	*ev_reg = ev;
	return epoll_ctl(t->epfd, op, fd, &e) == 0;
}

static void touch(struct tcp_conn *c)
{
	c->last_progress_ms = kolo_now_ms();
}

static bool conn_busy(const struct tcp_conn *c)
{
	return c->sendq.head || c->recvq.head;
}

static void set_sock_opts(const struct tcp_transport *t, int fd)
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

static void conn_fail(struct tcp_conn *c, kolo_status_t st, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));

/* Marks the conn failed and resets its sockets so the peer fails fast too.
 * Requests fail when tested. */
static void conn_fail(struct tcp_conn *c, kolo_status_t st, const char *fmt, ...)
{
	if (c->err)
		return;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(c->errmsg, sizeof(c->errmsg), fmt, ap);
	va_end(ap);
	c->err = st;
	KOLO_WARN(SUBSYS, "%s (%s)", c->errmsg, kolo_status_name(st));
	for (int i = 0; i < c->nstreams; i++) {
		reset_close(c->t, c->streams[i].fd);
		c->streams[i].fd = -1;
		c->streams[i].state = SS_DEAD;
	}
}

/* n <= 0 from a socket call: true means stop (EAGAIN or the conn failed),
 * false means retry (EINTR). */
static bool io_stop(struct tcp_conn *c, ssize_t n, bool reading)
{
	if (n == 0 && reading) {
		conn_fail(c, KOLO_EPEER, "rank %d (tag %d, %s) closed the connection",
		          c->base.peer_rank, c->base.tag, c->peer_addr);
		return true;
	}
	if (errno == EINTR)
		return false;
	if (errno == EAGAIN || errno == EWOULDBLOCK)
		return true;
	conn_fail(c, KOLO_EPEER, "connection to rank %d (tag %d, %s) failed while %s: %s",
	          c->base.peer_rank, c->base.tag, c->peer_addr, reading ? "receiving" : "sending",
	          strerror(errno));
	return true;
}

/* ---- send path --------------------------------------------------------- */

static size_t chunk_len(const struct tcp_conn *c, size_t total, size_t remaining)
{
	size_t cb = c->t->chunk_bytes;
	if (c->nstreams > 1 && total > MIN_CHUNK) {
		/* Spread a mid-size message over every stream; large ones are
		 * cut into chunk_bytes pieces that streams take as they drain. */
		size_t even = (total + (size_t)c->nstreams - 1) / (size_t)c->nstreams;
		even = (even + 4095) & ~(size_t)4095;
		cb = KOLO_MIN(cb, KOLO_MAX(even, (size_t)MIN_CHUNK));
	}
	return KOLO_MIN(remaining, cb);
}

static bool take_chunk(struct tcp_conn *c, struct tcp_stream *s)
{
	struct tcp_req *r = c->cut_req;
	if (!r)
		return false;
	size_t off = r->cut;
	size_t n = chunk_len(c, r->len, r->len - off);
	put32(s->shdr, CHUNK_MAGIC);
	put32(s->shdr + 4, (uint32_t)n);
	put64(s->shdr + 8, r->seq);
	put64(s->shdr + 16, off);
	put64(s->shdr + 24, r->len);
	s->sreq = r;
	s->spay = r->buf + off;
	s->slen = n;
	s->ssent = 0;
	r->cut += n;
	r->inflight++;
	r->started = true;
	if (r->cut == r->len)
		c->cut_req = r->next;
	return true;
}

static void req_complete(struct tcp_conn *c, struct tcp_req *r)
{
	list_remove(r->is_send ? &c->sendq : &c->recvq, r);
	r->complete = true;
	list_append(&c->doneq, r);
}

static void chunk_sent(struct tcp_conn *c, struct tcp_stream *s)
{
	struct tcp_req *r = s->sreq;
	s->sreq = NULL;
	r->done += s->slen;
	r->inflight--;
	if (r->cut == r->len && r->inflight == 0)
		req_complete(c, r);
}

static void stream_send(struct tcp_conn *c, struct tcp_stream *s)
{
	size_t moved = 0;
	while (!c->err && moved < STREAM_BUDGET) {
		if (!s->sreq && !take_chunk(c, s))
			return;
		struct iovec iov[2];
		int niov = 0;
		if (s->ssent < HDR_SIZE)
			iov[niov++] = (struct iovec){s->shdr + s->ssent, HDR_SIZE - s->ssent};
		size_t pay_off = s->ssent > HDR_SIZE ? s->ssent - HDR_SIZE : 0;
		if (s->slen > pay_off)
			iov[niov++] =
			        (struct iovec){(void *)(s->spay + pay_off), s->slen - pay_off};
		struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)niov};
		ssize_t n = sendmsg(s->fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n < 0) {
			if (io_stop(c, n, false))
				return;
			continue;
		}
		touch(c);
		moved += (size_t)n;
		s->ssent += (size_t)n;
		if (s->ssent == HDR_SIZE + s->slen)
			chunk_sent(c, s);
	}
}

/* ---- receive path ------------------------------------------------------ */

static struct tcp_req *find_recv(struct tcp_conn *c, uint64_t seq)
{
	for (struct tcp_req *r = c->recvq.head; r && r->seq <= seq; r = r->next)
		if (r->seq == seq)
			return r;
	return NULL;
}

static void chunk_received(struct tcp_conn *c, struct tcp_stream *s)
{
	struct tcp_req *r = s->rreq;
	r->done += s->rlen;
	r->started = true;
	s->in_payload = false;
	s->rreq = NULL;
	if (r->done == r->len)
		req_complete(c, r);
}

/* Points the stream at the posted receive of the chunk whose header it
 * holds. false: paused (not posted yet) or the conn failed. */
static bool bind_chunk(struct tcp_conn *c, struct tcp_stream *s)
{
	struct tcp_req *r = find_recv(c, s->pseq);
	if (!r) {
		if (s->pseq >= c->next_recv_seq) {
			/* Leave the rest in the socket: TCP flow control holds
			 * the sender until the receive is posted. */
			s->paused = true;
			return false;
		}
		conn_fail(c, KOLO_EPROTO,
		          "rank %d (tag %d) sent a chunk of message %llu, which is "
		          "already complete",
		          c->base.peer_rank, c->base.tag, (unsigned long long)s->pseq);
		return false;
	}
	s->paused = false;
	if (s->pmsglen != r->len) {
		conn_fail(c, KOLO_EPROTO,
		          "rank %d (tag %d) sent %llu bytes as message %llu; the "
		          "matching receive expects %zu",
		          c->base.peer_rank, c->base.tag, (unsigned long long)s->pmsglen,
		          (unsigned long long)s->pseq, r->len);
		return false;
	}
	if (s->poff > r->len || s->plen > r->len - s->poff || s->plen > r->len - r->done) {
		conn_fail(c, KOLO_EPROTO, "rank %d (tag %d) sent a chunk outside message %llu",
		          c->base.peer_rank, c->base.tag, (unsigned long long)s->pseq);
		return false;
	}
	s->rreq = r;
	s->rdst = r->buf + s->poff;
	s->rleft = s->plen;
	s->rlen = s->plen;
	s->in_payload = true;
	if (s->plen == 0)
		chunk_received(c, s);
	return true;
}

static bool want_recv(const struct tcp_conn *c, const struct tcp_stream *s)
{
	return !s->paused && (s->in_payload || s->rhdr_got > 0 || c->recvq.head);
}

/* Data waits until every stream of the conn is in: a message sent before
 * that could complete while a handshake is half done, and the sender could
 * stop driving the endpoint while the acceptor still waits for the rest of
 * the conn's streams. */
static bool want_send(const struct tcp_conn *c, const struct tcp_stream *s)
{
	return c->nready == c->nstreams && (s->sreq || c->cut_req);
}

static void stream_recv(struct tcp_conn *c, struct tcp_stream *s)
{
	size_t moved = 0;
	while (!c->err && moved < STREAM_BUDGET && want_recv(c, s)) {
		if (!s->in_payload) {
			if (s->rhdr_got < HDR_SIZE) {
				ssize_t n = recv(s->fd, s->rhdr + s->rhdr_got,
				                 HDR_SIZE - s->rhdr_got, MSG_DONTWAIT);
				if (n <= 0) {
					if (io_stop(c, n, true))
						return;
					continue;
				}
				touch(c);
				s->rhdr_got += (size_t)n;
				if (s->rhdr_got < HDR_SIZE)
					continue;
			}
			s->rhdr_got = 0;
			if (get32(s->rhdr) != CHUNK_MAGIC) {
				conn_fail(c, KOLO_EPROTO,
				          "rank %d (tag %d) sent a corrupt chunk header",
				          c->base.peer_rank, c->base.tag);
				return;
			}
			s->plen = get32(s->rhdr + 4);
			s->pseq = get64(s->rhdr + 8);
			s->poff = get64(s->rhdr + 16);
			s->pmsglen = get64(s->rhdr + 24);
			if (!bind_chunk(c, s))
				return;
			continue;
		}
		/* The payload goes straight into the posted buffer; the next
		 * header rides along in the same readv. */
		struct iovec iov[2] = {{s->rdst, s->rleft}, {s->rhdr, HDR_SIZE}};
		ssize_t n = readv(s->fd, iov, 2);
		if (n <= 0) {
			if (io_stop(c, n, true))
				return;
			continue;
		}
		touch(c);
		moved += (size_t)n;
		if ((size_t)n < s->rleft) {
			s->rdst += n;
			s->rleft -= (size_t)n;
			continue;
		}
		s->rhdr_got = (size_t)n - s->rleft;
		s->rleft = 0;
		chunk_received(c, s);
	}
}

/* ---- connector handshake ----------------------------------------------- */

/* The MAC an acceptance carries: HMAC(token, cnonce || nonce || verdict
 * without its MAC). */
static void verdict_mac(const struct tcp_transport *t, const uint8_t *cnonce, const uint8_t *nonce,
                        const uint8_t *v, uint8_t *out)
{
	uint8_t msg[2 * NONCE_SIZE + VERDICT_MAC_OFF];
	memcpy(msg, cnonce, NONCE_SIZE);
	memcpy(msg + NONCE_SIZE, nonce, NONCE_SIZE);
	memcpy(msg + 2 * NONCE_SIZE, v, VERDICT_MAC_OFF);
	kolo_hmac_sha256(t->token, t->token_len, msg, sizeof(msg), out);
}

static void build_hello(struct tcp_conn *c, int idx, const uint8_t *nonce, const uint8_t *cnonce,
                        uint8_t *h)
{
	const struct tcp_transport *t = c->t;
	memset(h, 0, HELLO_SIZE);
	put32(h, KOLO_TRANSPORT_MAGIC);
	put32(h + 4, KOLO_WIRE_VERSION);
	memcpy(h + 8, t->job, JOB_FIELD);
	put64(h + 136, (uint64_t)t->round);
	put32(h + 144, (uint32_t)t->rank);
	put32(h + 148, (uint32_t)c->base.peer_rank);
	put32(h + 152, (uint32_t)c->base.tag);
	put32(h + 156, (uint32_t)idx);
	put32(h + 160, (uint32_t)c->nstreams);
	put32(h + 164, tcp_probe_port(t->probe));
	memcpy(h + HELLO_CNONCE_OFF, cnonce, NONCE_SIZE);
	uint8_t msg[NONCE_SIZE + HELLO_MAC_OFF];
	memcpy(msg, nonce, NONCE_SIZE);
	memcpy(msg + NONCE_SIZE, h, HELLO_MAC_OFF);
	kolo_hmac_sha256(t->token, t->token_len, msg, sizeof(msg), h + HELLO_MAC_OFF);
}

static void stream_handshake(struct tcp_conn *c, struct tcp_stream *s, short revents)
{
	int idx = (int)(s - c->streams);
	if (s->state == SS_CONNECTING) {
		if (!revents) {
			struct pollfd p = {.fd = s->fd, .events = POLLOUT};
			if (poll(&p, 1, 0) <= 0)
				return;
			revents = p.revents;
		}
		int err = 0;
		socklen_t len = sizeof(err);
		getsockopt(s->fd, SOL_SOCKET, SO_ERROR, &err, &len);
		if (err) {
			conn_fail(c, KOLO_EPEER, "cannot connect to rank %d at %s: %s",
			          c->base.peer_rank, c->peer_addr, strerror(err));
			return;
		}
		if (!(revents & POLLOUT))
			return;
		touch(c);
		s->state = SS_READ_CHALLENGE;
		s->hs_off = 0;
		s->hs_len = CHALLENGE_SIZE;
	}
	for (;;) {
		ssize_t n;
		bool reading = s->state != SS_WRITE_HELLO;
		if (reading)
			n = recv(s->fd, s->hs + s->hs_off, s->hs_len - s->hs_off, MSG_DONTWAIT);
		else
			n = send(s->fd, s->hs + s->hs_off, s->hs_len - s->hs_off,
			         MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n <= 0) {
			if (n == 0 && reading) {
				conn_fail(c, KOLO_EPEER,
				          "rank %d (%s) closed stream %d during the "
				          "handshake",
				          c->base.peer_rank, c->peer_addr, idx);
				return;
			}
			if (io_stop(c, n, reading))
				return;
			continue;
		}
		touch(c);
		s->hs_off += (size_t)n;
		if (s->hs_off < s->hs_len)
			continue;
		if (s->state == SS_READ_CHALLENGE) {
			if (get32(s->hs) != KOLO_TRANSPORT_MAGIC ||
			    get32(s->hs + 4) != KOLO_WIRE_VERSION) {
				conn_fail(c, KOLO_EPROTO,
				          "%s (rank %d) is not a kolo endpoint of "
				          "wire version %d",
				          c->peer_addr, c->base.peer_rank, KOLO_WIRE_VERSION);
				return;
			}
			memcpy(s->anonce, s->hs + 8, NONCE_SIZE);
			if (kolo_random_bytes(s->cnonce, NONCE_SIZE) != KOLO_OK) {
				conn_fail(c, KOLO_ESYSTEM, "no random bytes for the handshake");
				return;
			}
			build_hello(c, idx, s->anonce, s->cnonce, s->hs);
			s->state = SS_WRITE_HELLO;
			s->hs_off = 0;
			s->hs_len = HELLO_SIZE;
		} else if (s->state == SS_WRITE_HELLO) {
			s->state = SS_READ_VERDICT;
			s->hs_off = 0;
			s->hs_len = VERDICT_SIZE;
		} else {
			uint32_t st = get32(s->hs + 4);
			if (get32(s->hs) != KOLO_TRANSPORT_MAGIC) {
				conn_fail(c, KOLO_EPROTO,
				          "rank %d (%s) answered the handshake with "
				          "garbage",
				          c->base.peer_rank, c->peer_addr);
				return;
			}
			if (st != 0) {
				char reason[REASON_SIZE + 1];
				memcpy(reason, s->hs + 8, REASON_SIZE);
				reason[REASON_SIZE] = '\0';
				kolo_status_t kst = st == KOLO_EAUTH ? KOLO_EAUTH : KOLO_EPROTO;
				conn_fail(c, kst, "rank %d (%s) refused the connection: %s",
				          c->base.peer_rank, c->peer_addr, reason);
				return;
			}
			uint8_t mac[KOLO_HMAC_SIZE];
			verdict_mac(c->t, s->cnonce, s->anonce, s->hs, mac);
			if (!kolo_consttime_equal(mac, s->hs + VERDICT_MAC_OFF, KOLO_HMAC_SIZE)) {
				conn_fail(c, KOLO_EAUTH,
				          "rank %d (%s) accepted stream %d without proving the job "
				          "token: not our peer",
				          c->base.peer_rank, c->peer_addr, idx);
				return;
			}
			s->state = SS_READY;
			c->nready++;
			KOLO_DEBUG(SUBSYS, "stream %d/%d to rank %d tag %d ready", idx + 1,
			           c->nstreams, c->base.peer_rank, c->base.tag);
			return;
		}
	}
}

/* One stream's progress. revents: from poll(), or 0 when called blindly. */
static void stream_progress(struct tcp_conn *c, struct tcp_stream *s, short revents)
{
	if (c->err || s->fd < 0)
		return;
	switch (s->state) {
	case SS_CONNECTING:
	case SS_READ_CHALLENGE:
	case SS_WRITE_HELLO:
	case SS_READ_VERDICT:
		stream_handshake(c, s, revents);
		return;
	case SS_READY:
		break;
	default:
		return;
	}
	if (c->incoming && !c->accepted) {
		if (revents & (POLLERR | POLLHUP))
			conn_fail(c, KOLO_EPEER, "rank %d (tag %d, %s) closed the connection",
			          c->base.peer_rank, c->base.tag, c->peer_addr);
		return;
	}
	if (want_send(c, s))
		stream_send(c, s);
	if (!c->err && want_recv(c, s))
		stream_recv(c, s);
	else if (!c->err && (revents & (POLLERR | POLLHUP))) {
		int err = 0;
		socklen_t len = sizeof(err);
		getsockopt(s->fd, SOL_SOCKET, SO_ERROR, &err, &len);
		conn_fail(c, KOLO_EPEER, "connection to rank %d (tag %d, %s) broke: %s",
		          c->base.peer_rank, c->base.tag, c->peer_addr,
		          err ? strerror(err) : "closed");
	}
}

static void conn_progress(struct tcp_conn *c)
{
	for (int i = 0; i < c->nstreams && !c->err; i++)
		stream_progress(c, &c->streams[i], 0);
}

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
	if (!conn_busy(c))
		return;
	if (now - c->last_progress_ms < (uint64_t)c->t->timeout_ms)
		return;
	dump_state(c->t);
	conn_fail(c, KOLO_ETIMEDOUT,
	          "no progress on the connection to rank %d (tag %d, %s) "
	          "for %d ms",
	          c->base.peer_rank, c->base.tag, c->peer_addr, c->t->timeout_ms);
}

/* ---- conns ------------------------------------------------------------- */

static struct tcp_conn *conn_new(struct tcp_transport *t, int peer_rank, int tag, int nstreams)
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
		c->streams[i].state = SS_EMPTY;
	}
	touch(c);
	c->next = t->conns;
	if (t->conns)
		t->conns->prev = c;
	t->conns = c;
	return c;
}

static void conn_free(struct tcp_transport *t, struct tcp_conn *c)
{
	if (c->prev)
		c->prev->next = c->next;
	else
		t->conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	for (int i = 0; i < c->nstreams; i++)
		reset_close(c->t, c->streams[i].fd);
	for (struct tcp_pending *p = t->pendings; p; p = p->next)
		if (p->target == c)
			p->target = NULL;
	struct req_list *lists[] = {&c->sendq, &c->recvq, &c->doneq};
	for (size_t i = 0; i < KOLO_ARRAY_SIZE(lists); i++) {
		while (lists[i]->head) {
			struct tcp_req *r = lists[i]->head;
			list_remove(lists[i], r);
			req_put(t, r);
		}
	}
	free(c);
}

/* ---- acceptor handshake ------------------------------------------------ */

static void pending_free(struct tcp_transport *t, struct tcp_pending *p)
{
	if (p->prev)
		p->prev->next = p->next;
	else
		t->pendings = p->next;
	if (p->next)
		p->next->prev = p->prev;
	t->npending--;
	reset_close(t, p->fd);
	free(p);
}

/* A refusal carries no MAC: it only ends a connection. */
static void pending_verdict(const struct tcp_transport *t, struct tcp_pending *p, kolo_status_t st,
                            const char *reason)
{
	memset(p->buf, 0, VERDICT_SIZE);
	put32(p->buf, KOLO_TRANSPORT_MAGIC);
	put32(p->buf + 4, (uint32_t)st);
	memcpy(p->buf + 8, reason, strnlen(reason, REASON_SIZE - 1)); /* NUL-padded */
	if (st == KOLO_OK)
		verdict_mac(t, p->cnonce, p->nonce, p->buf, p->buf + VERDICT_MAC_OFF);
	p->verdict = st;
	p->state = PS_WRITE_VERDICT;
	p->off = 0;
	p->len = VERDICT_SIZE;
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
	pending_verdict(t, p, st, reason);
}

static struct tcp_conn *find_incoming(struct tcp_transport *t, int src, int tag)
{
	for (struct tcp_conn *c = t->conns; c; c = c->next)
		if (c->incoming && !c->err && c->base.peer_rank == src && c->base.tag == tag)
			return c;
	return NULL;
}

static void printable(char *s)
{
	for (; *s; s++)
		if (*s < 0x20 || *s > 0x7e)
			*s = '?';
}

static void pending_check_hello(struct tcp_transport *t, struct tcp_pending *p)
{
	const uint8_t *h = p->buf;
	if (get32(h + 4) != KOLO_WIRE_VERSION) {
		refuse(t, p, KOLO_EPROTO, "wire version %u, expected %d", get32(h + 4),
		       KOLO_WIRE_VERSION);
		return;
	}
	uint8_t msg[NONCE_SIZE + HELLO_MAC_OFF], mac[KOLO_HMAC_SIZE];
	memcpy(msg, p->nonce, NONCE_SIZE);
	memcpy(msg + NONCE_SIZE, h, HELLO_MAC_OFF);
	kolo_hmac_sha256(t->token, t->token_len, msg, sizeof(msg), mac);
	if (!kolo_consttime_equal(mac, h + HELLO_MAC_OFF, KOLO_HMAC_SIZE)) {
		refuse(t, p, KOLO_EAUTH, "wrong job token");
		return;
	}
	memcpy(p->cnonce, h + HELLO_CNONCE_OFF, NONCE_SIZE);
	char job[JOB_FIELD + 1];
	memcpy(job, h + 8, JOB_FIELD);
	job[JOB_FIELD] = '\0';
	printable(job);
	int64_t round = (int64_t)get64(h + 136);
	int src = (int)get32(h + 144), dst = (int)get32(h + 148), tag = (int)get32(h + 152);
	uint32_t stream = get32(h + 156), nstreams = get32(h + 160);
	p->probe_port = (uint16_t)get32(h + 164);
	if (memcmp(h + 8, t->job, JOB_FIELD) != 0) {
		refuse(t, p, KOLO_EPROTO, "job '%.64s', this endpoint is in job '%.64s'", job,
		       t->job);
		return;
	}
	if (round != t->round) {
		refuse(t, p, KOLO_EPROTO, "%s round %lld, this endpoint is in round %lld",
		       round < t->round ? "stale" : "future", (long long)round,
		       (long long)t->round);
		return;
	}
	if (dst != t->rank) {
		refuse(t, p, KOLO_EPROTO, "addressed to rank %d, this is rank %d", dst, t->rank);
		return;
	}
	if (src < 0 || src >= t->size) {
		refuse(t, p, KOLO_EPROTO, "sender rank %d is not in [0, %d)", src, t->size);
		return;
	}
	if (nstreams < 1 || nstreams > KOLO_TCP_MAX_STREAMS || stream >= nstreams) {
		refuse(t, p, KOLO_EPROTO, "stream %u of %u is out of range", stream, nstreams);
		return;
	}
	struct tcp_conn *c = find_incoming(t, src, tag);
	if (c && c->nstreams != (int)nstreams) {
		refuse(t, p, KOLO_EPROTO, "rank %d tag %d: %u streams, the conn has %d", src, tag,
		       nstreams, c->nstreams);
		return;
	}
	if (c && c->streams[stream].state != SS_EMPTY) {
		refuse(t, p, KOLO_EPROTO, "rank %d tag %d: duplicate stream %u", src, tag, stream);
		return;
	}
	if (!c) {
		c = conn_new(t, src, tag, (int)nstreams);
		if (!c) {
			refuse(t, p, KOLO_EPROTO, "out of memory");
			return;
		}
		c->incoming = true;
		snprintf(c->peer_addr, sizeof(c->peer_addr), "%s", p->peer);
	}
	c->streams[stream].state = SS_RESERVED;
	p->target = c;
	p->stream = (int)stream;
	pending_verdict(t, p, KOLO_OK, "accepted");
}

static bool same_host(const struct tcp_transport *t, const struct sockaddr_storage *peer);

/* The verdict is written: hand an accepted stream to its conn. */
static void pending_done(struct tcp_transport *t, struct tcp_pending *p)
{
	struct tcp_conn *c = p->target;
	if (p->verdict == KOLO_OK && c && !c->err) {
		struct tcp_stream *s = &c->streams[p->stream];
		s->fd = p->fd;
		s->state = SS_READY;
		s->ref = (struct poll_ref){.kind = PK_STREAM, .stream = p->stream, .obj = c};
		ep_set(t, EPOLL_CTL_MOD, s->fd, &s->ref, &s->ev_reg, 0);
		p->fd = -1;
		c->nready++;
		touch(c);
		/* Probe the connector too: each side of a conn can find the
		 * other's host gone, whichever one connected. */
		struct sockaddr_storage ss;
		socklen_t len = sizeof(ss);
		if (t->probe && p->probe_port &&
		    getpeername(s->fd, (struct sockaddr *)&ss, &len) == 0 && !same_host(t, &ss))
			tcp_probe_watch(t->probe, c->base.peer_rank, &ss, len, p->probe_port);
		KOLO_DEBUG(SUBSYS, "accepted stream %d/%d from rank %d tag %d (%s)", p->stream + 1,
		           c->nstreams, c->base.peer_rank, c->base.tag, p->peer);
	}
	pending_free(t, p);
}

static void pending_drop(struct tcp_transport *t, struct tcp_pending *p, const char *why)
{
	KOLO_WARN(SUBSYS, "dropped a connection from %s to %s: %s", p->peer, t->addr_str, why);
	if (p->target && p->verdict == KOLO_OK)
		conn_fail(p->target, KOLO_EPEER, "rank %d (tag %d, %s): %s",
		          p->target->base.peer_rank, p->target->base.tag, p->peer, why);
	pending_free(t, p);
}

static void pending_step(struct tcp_transport *t, struct tcp_pending *p)
{
	for (;;) {
		bool reading = p->state == PS_READ_HELLO;
		ssize_t n;
		if (reading)
			n = recv(p->fd, p->buf + p->off, p->len - p->off, MSG_DONTWAIT);
		else
			n = send(p->fd, p->buf + p->off, p->len - p->off,
			         MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n == 0 && reading) {
			pending_drop(t, p, "closed during the handshake");
			return;
		}
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return;
			if (p->state == PS_WRITE_VERDICT && p->verdict != KOLO_OK) {
				pending_free(t, p); /* refused already; the peer left */
				return;
			}
			pending_drop(t, p, strerror(errno));
			return;
		}
		p->off += (size_t)n;
		if (reading && p->off >= 4 && get32(p->buf) != KOLO_TRANSPORT_MAGIC) {
			refuse(t, p, KOLO_EPROTO, "bad magic (not a kolo peer)");
			continue;
		}
		if (p->off < p->len)
			continue;
		switch (p->state) {
		case PS_WRITE_CHALLENGE:
			p->state = PS_READ_HELLO;
			p->off = 0;
			p->len = HELLO_SIZE;
			break;
		case PS_READ_HELLO:
			pending_check_hello(t, p);
			break;
		case PS_WRITE_VERDICT:
			pending_done(t, p);
			return;
		}
	}
}

static void accept_new(struct tcp_transport *t)
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
		struct tcp_pending *p = NULL;
		if (t->npending >= MAX_PENDING || !(p = calloc(1, sizeof(*p)))) {
			KOLO_WARN(SUBSYS, "dropped a connection from %s: too many handshakes",
			          peer);
			reset_close(t, fd);
			continue;
		}
		set_sock_opts(t, fd);
		p->fd = fd;
		snprintf(p->peer, sizeof(p->peer), "%s", peer);
		p->deadline_ms = kolo_now_ms() + (uint64_t)t->timeout_ms;
		p->verdict = KOLO_OK;
		p->ref = (struct poll_ref){.kind = PK_PENDING, .obj = p};
		if (kolo_random_bytes(p->nonce, NONCE_SIZE) != KOLO_OK ||
		    !ep_set(t, EPOLL_CTL_ADD, fd, &p->ref, &p->ev_reg, EPOLLOUT)) {
			KOLO_WARN(SUBSYS, "dropped a connection from %s: %s", peer,
			          strerror(errno));
			reset_close(t, fd);
			free(p);
			continue;
		}
		put32(p->buf, KOLO_TRANSPORT_MAGIC);
		put32(p->buf + 4, KOLO_WIRE_VERSION);
		memcpy(p->buf + 8, p->nonce, NONCE_SIZE);
		p->state = PS_WRITE_CHALLENGE;
		p->len = CHALLENGE_SIZE;
		p->next = t->pendings;
		if (t->pendings)
			t->pendings->prev = p;
		t->pendings = p;
		t->npending++;
		pending_step(t, p);
	}
}

/* ---- progress of everything ------------------------------------------- */

static short stream_events(const struct tcp_conn *c, const struct tcp_stream *s)
{
	switch (s->state) {
	case SS_CONNECTING:
	case SS_WRITE_HELLO:
		return POLLOUT;
	case SS_READ_CHALLENGE:
	case SS_READ_VERDICT:
		return POLLIN;
	case SS_READY:
		if (c->incoming && !c->accepted)
			return 0; /* errors and hang-ups only */
		return (short)((want_send(c, s) ? POLLOUT : 0) | (want_recv(c, s) ? POLLIN : 0));
	default:
		return 0;
	}
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
			pending_drop(t, p, "handshake not completed in time");
		}
	}
}

static int64_t next_deadline(const struct tcp_transport *t)
{
	int64_t d = INT64_MAX;
	for (const struct tcp_conn *c = t->conns; c; c = c->next) {
		if (!c->err && conn_busy(c))
			d = KOLO_MIN(d, (int64_t)(c->last_progress_ms + (uint64_t)t->timeout_ms));
	}
	for (const struct tcp_pending *p = t->pendings; p; p = p->next)
		d = KOLO_MIN(d, (int64_t)p->deadline_ms);
	return d;
}

/* Brings every socket's epoll interest up to date (a syscall only where it
 * changed). */
static void arm(struct tcp_transport *t)
{
	for (struct tcp_pending *p = t->pendings; p; p = p->next) {
		uint32_t ev = p->state == PS_READ_HELLO ? EPOLLIN : EPOLLOUT;
		if (ev != p->ev_reg)
			ep_set(t, EPOLL_CTL_MOD, p->fd, &p->ref, &p->ev_reg, ev);
	}
	for (struct tcp_conn *c = t->conns; c; c = c->next) {
		if (c->err)
			continue;
		for (int i = 0; i < c->nstreams; i++) {
			struct tcp_stream *s = &c->streams[i];
			uint32_t ev = (uint32_t)(uint16_t)stream_events(c, s);
			if (s->fd >= 0 && ev != s->ev_reg)
				ep_set(t, EPOLL_CTL_MOD, s->fd, &s->ref, &s->ev_reg, ev);
		}
	}
}

/* Waits for at most timeout_ms (negative: until the next deadline) and
 * progresses whatever is ready. */
static void tcp_abort(struct kolo_transport *kt, kolo_status_t st);

/* A peer the liveness probe lost fails the whole endpoint, as abort() does
 * but with KOLO_EPEER and a message naming it: a collective that never
 * touches the lost peer's conns (the small-message algorithms, a partition
 * between two ranks that are not ring neighbours) must fail too, or the job
 * would go on with a member it cannot reach. */
static void fail_lost(struct tcp_transport *t)
{
	if (!tcp_probe_pending(t->probe))
		return;
	tcp_probe_ack(t->probe);
	for (struct tcp_conn *c = t->conns; c; c = c->next) {
		if (c->err || !tcp_probe_lost(t->probe, c->base.peer_rank))
			continue;
		conn_fail(c, KOLO_EPEER,
		          "rank %d's host (%s) stopped answering: no TCP acknowledgement within %d "
		          "ms (KOLO_PROBE_TIMEOUT_MS)",
		          c->base.peer_rank, c->peer_addr, t->probe_timeout_ms);
		if (!t->lost_msg[0])
			snprintf(t->lost_msg, sizeof(t->lost_msg), "%s", c->errmsg);
	}
	if (!t->lost_msg[0])
		snprintf(t->lost_msg, sizeof(t->lost_msg),
		         "a peer's host stopped answering: no TCP acknowledgement within %d ms "
		         "(KOLO_PROBE_TIMEOUT_MS)",
		         t->probe_timeout_ms);
	tcp_abort(&t->base, KOLO_EPEER);
}

static void progress_all(struct tcp_transport *t, int timeout_ms)
{
	arm(t);
	uint64_t now = kolo_now_ms();
	int64_t until = next_deadline(t) - (int64_t)now;
	int to = timeout_ms;
	if (until < INT64_MAX / 2) {
		int64_t u = KOLO_MAX(until, (int64_t)0);
		if (to < 0 || u < to)
			to = (int)KOLO_MIN(u, (int64_t)INT32_MAX);
	}
	struct epoll_event evs[64];
	int n = epoll_wait(t->epfd, evs, (int)KOLO_ARRAY_SIZE(evs), to);
	for (int i = 0; i < n; i++) {
		struct poll_ref *r = evs[i].data.ptr;
		/* EPOLLIN/OUT/ERR/HUP have poll()'s values. */
		short rev = (short)(evs[i].events & (EPOLLIN | EPOLLOUT | EPOLLERR | EPOLLHUP));
		switch (r->kind) {
		case PK_WAKE:
			break;
		case PK_LISTEN:
			accept_new(t);
			break;
		case PK_PENDING:
			pending_step(t, r->obj);
			break;
		case PK_STREAM: {
			struct tcp_conn *c = r->obj;
			stream_progress(c, &c->streams[r->stream], rev);
			break;
		}
		}
	}
	sweep_deadlines(t, kolo_now_ms());
	fail_lost(t);
	t->last_sweep_ms = kolo_now_ms();
	/* Leave the interests current for a caller that polls poll_fd(). */
	arm(t);
}

/* ---- ops --------------------------------------------------------------- */

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
                                struct kolo_transport **out)
{
	*out = NULL;
	if (!cfg || cfg->size < 1 || cfg->rank < 0 || cfg->rank >= cfg->size ||
	    (cfg->token_len && !cfg->token))
		return KOLO_EINVAL;
	const char *job = cfg->job ? cfg->job : "";
	if (strlen(job) >= JOB_FIELD) {
		KOLO_ERROR(SUBSYS, "job id longer than %d bytes", JOB_FIELD - 1);
		return KOLO_EINVAL;
	}
	struct tcp_transport *t = calloc(1, sizeof(*t));
	if (!t)
		return KOLO_ENOMEM;
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
		st = KOLO_ENOMEM;
		goto fail;
	}
	if (cfg->token_len)
		memcpy(t->token, cfg->token, cfg->token_len);
	t->timeout_ms = cfg->timeout_ms > 0 ? cfg->timeout_ms : 30000;
	t->streams = cfg->streams > 0 ? KOLO_MIN(cfg->streams, KOLO_TCP_MAX_STREAMS) : 0;
	t->socket_buffer = KOLO_MAX(cfg->socket_buffer, 0);
	t->probe_ms = KOLO_MAX(cfg->probe_ms, 0);
	t->probe_timeout_ms = KOLO_MAX(cfg->probe_timeout_ms, 1);
	int64_t cb = kolo_param_int(KOLO_P_TCP_CHUNK_BYTES);
	t->chunk_bytes = (size_t)KOLO_MIN(KOLO_MAX(cb, (int64_t)MIN_CHUNK), (int64_t)MAX_CHUNK);
	t->epfd = epoll_create1(EPOLL_CLOEXEC);
	t->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (t->epfd < 0 || t->wake_fd < 0) {
		st = KOLO_ESYSTEM;
		goto fail;
	}
	t->wake_ref.kind = PK_WAKE;
	uint32_t ev;
	if (!ep_set(t, EPOLL_CTL_ADD, t->wake_fd, &t->wake_ref, &ev, EPOLLIN)) {
		st = KOLO_ESYSTEM;
		goto fail;
	}
	struct kolo_errbuf eb = {{0}};
	st = kolo_tcp_pick_address(cfg->iface, cfg->route_to, &t->addr, &t->addrlen, &eb);
	if (st != KOLO_OK) {
		KOLO_ERROR(SUBSYS, "%s", eb.msg);
		goto fail;
	}
	tcp_addr_str(&t->addr, t->addr_str, sizeof(t->addr_str));
	*out = &t->base;
	return KOLO_OK;
fail:
	tcp_destroy(&t->base);
	return st;
}

static kolo_status_t tcp_listen(struct kolo_transport *kt, struct kolo_transport_handle *out)
{
	struct tcp_transport *t = T(kt);
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
	t->listen_ref.kind = PK_LISTEN;
	uint32_t ev;
	if (!ep_set(t, EPOLL_CTL_ADD, fd, &t->listen_ref, &ev, EPOLLIN)) {
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
static bool same_host(const struct tcp_transport *t, const struct sockaddr_storage *peer)
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
	struct tcp_transport *t = T(kt);
	*out = NULL;
	KOLO_CHECK(aborted(t));
	struct sockaddr_storage ss;
	socklen_t len;
	if (!peer || kolo_tcp_handle_decode(peer, &ss, &len) != KOLO_OK)
		return kolo_fail(&kt->err, KOLO_EINVAL, "rank %d's handle is not a TCP handle",
		                 peer_rank);
	bool local = same_host(t, &ss);
	int nstreams = t->streams ? t->streams : local ? 1 : 2;
	struct tcp_conn *c = conn_new(t, peer_rank, tag, nstreams);
	if (!c)
		return kolo_fail(&kt->err, KOLO_ENOMEM, "out of memory");
	tcp_addr_str(&ss, c->peer_addr, sizeof(c->peer_addr));
	/* A host can only vanish from another host. */
	if (!local)
		tcp_probe_watch(t->probe, peer_rank, &ss, len, tcp_handle_probe_port(peer));
	for (int i = 0; i < c->nstreams; i++) {
		struct tcp_stream *s = &c->streams[i];
		s->fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
		if (s->fd < 0) {
			kolo_status_t st =
			        kolo_fail(&kt->err, KOLO_ESYSTEM, "socket: %s", strerror(errno));
			conn_free(t, c);
			return st;
		}
		set_sock_opts(t, s->fd);
		s->ref = (struct poll_ref){.kind = PK_STREAM, .stream = i, .obj = c};
		if (!ep_set(t, EPOLL_CTL_ADD, s->fd, &s->ref, &s->ev_reg, 0)) {
			kolo_status_t st =
			        kolo_fail(&kt->err, KOLO_ESYSTEM, "epoll: %s", strerror(errno));
			conn_free(t, c);
			return st;
		}
		s->state = SS_CONNECTING;
		if (connect(s->fd, (struct sockaddr *)&ss, len) == 0) {
			s->state = SS_READ_CHALLENGE;
			s->hs_len = CHALLENGE_SIZE;
		} else if (errno != EINPROGRESS && errno != EINTR) {
			conn_fail(c, KOLO_EPEER, "cannot connect to rank %d at %s: %s", peer_rank,
			          c->peer_addr, strerror(errno));
			break;
		}
	}
	conn_progress(c);
	if (tcp_probe_lost(t->probe, peer_rank))
		fail_lost(t);
	*out = &c->base;
	return KOLO_OK;
}

static kolo_status_t tcp_accept(struct kolo_transport *kt, int peer_rank, int tag,
                                struct kolo_conn **out)
{
	struct tcp_transport *t = T(kt);
	*out = NULL;
	KOLO_CHECK(aborted(t));
	if (t->listen_fd < 0)
		return kolo_fail(&kt->err, KOLO_EINVAL, "accept() before listen()");
	progress_all(t, 0);
	for (struct tcp_conn *c = t->conns; c; c = c->next) {
		if (!c->incoming || c->accepted || c->base.peer_rank != peer_rank ||
		    c->base.tag != tag || (c->nready < c->nstreams && !c->err))
			continue;
		c->accepted = true;
		touch(c);
		*out = &c->base;
		return KOLO_OK;
	}
	return KOLO_OK;
}

static kolo_status_t post(struct kolo_conn *kc, void *buf, size_t len, bool is_send,
                          struct kolo_req **out)
{
	struct tcp_conn *c = C(kc);
	struct tcp_transport *t = c->t;
	*out = NULL;
	KOLO_CHECK(aborted(t));
	if (c->err)
		return kolo_fail(&t->base.err, c->err, "%s", c->errmsg);
	if (!buf && len)
		return kolo_fail(&t->base.err, KOLO_EINVAL, "NULL buffer of %zu bytes", len);
	struct tcp_req *r = req_get(t);
	if (!r)
		return kolo_fail(&t->base.err, KOLO_ENOMEM, "out of memory");
	if (!conn_busy(c))
		touch(c);
	r->conn = c;
	r->buf = buf;
	r->len = len;
	r->is_send = is_send;
	*out = (struct kolo_req *)r;
	if (is_send) {
		r->seq = c->next_send_seq++;
		list_append(&c->sendq, r);
		if (!c->cut_req)
			c->cut_req = r;
		/* Send eagerly: a small message leaves before the first test. */
		for (int i = 0; i < c->nstreams && c->cut_req && !c->err; i++)
			if (want_send(c, &c->streams[i]))
				stream_send(c, &c->streams[i]);
	} else {
		r->seq = c->next_recv_seq++;
		list_append(&c->recvq, r);
		for (int i = 0; i < c->nstreams && !c->err; i++) {
			struct tcp_stream *s = &c->streams[i];
			if (s->paused && s->pseq == r->seq)
				bind_chunk(c, s);
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
		list_remove(&c->doneq, r);
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
		list_remove(r->is_send ? &c->sendq : &c->recvq, r);
	}
	req_put(c->t, r);
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
				conn_fail(c, st, "the transport was aborted");
			req_release(c, r);
			return st;
		}
		conn_progress(c);
		uint64_t now = kolo_now_ms();
		/* Handshakes and timeouts move on while the caller spins. */
		if (now != t->last_sweep_ms)
			progress_all(t, 0);
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
	struct tcp_transport *t = T(kt);
	KOLO_CHECK(aborted(t));
	progress_all(t, timeout_ms);
	return aborted(t);
}

static void tcp_abort(struct kolo_transport *kt, kolo_status_t st)
{
	struct tcp_transport *t = T(kt);
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
	return T(kt)->epfd;
}

static bool tcp_unreachable(struct kolo_transport *kt, int peer_rank)
{
	return tcp_probe_lost(T(kt)->probe, peer_rank);
}

static void tcp_close(struct kolo_conn *kc)
{
	if (!kc)
		return;
	struct tcp_conn *c = C(kc);
	conn_free(c->t, c);
}

static void tcp_destroy(struct kolo_transport *kt)
{
	if (!kt)
		return;
	struct tcp_transport *t = T(kt);
	tcp_probe_stop(t->probe); /* it writes wake_fd */
	while (t->conns)
		conn_free(t, t->conns);
	while (t->pendings)
		pending_free(t, t->pendings);
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
        .abort = tcp_abort,
        .close = tcp_close,
        .destroy = tcp_destroy,
        .unreachable = tcp_unreachable,
        .poll_fd = tcp_poll_fd,
};
