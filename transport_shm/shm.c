/* shm: shared-memory transport (see transport_shm.h for the design). */
#include "transport_shm.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define SUBSYS        "shm"
#define JOB_MAX       128
#define PUBLISH_BYTES (256u << 10) /* publish progress at least this often */

/* ---- wire ---- */

struct handle_wire {
	uint32_t magic;
	uint8_t kind; /* KOLO_HANDLE_SHM */
	uint8_t pad[3];
	char name[48]; /* abstract socket name, without the leading NUL */
};
_Static_assert(sizeof(struct handle_wire) <= KOLO_TRANSPORT_HANDLE_SIZE, "handle fits");

struct msg_nonce {
	uint32_t magic;
	uint32_t version;
	uint8_t nonce[32];
};

struct msg_hello {
	uint32_t magic;
	uint32_t version;
	char job[JOB_MAX];
	int64_t round;
	int32_t src_rank, dst_rank, tag;
	uint8_t mac[KOLO_HMAC_SIZE];
};

struct msg_verdict {
	uint32_t magic;
	uint32_t status; /* kolo_status_t; 0 = accepted */
	uint64_t ring_bytes;
};

/* ---- shared segment ---- */

struct ring_ctl {
	_Atomic uint64_t head; /* bytes produced */
	char pad0[56];
	_Atomic uint64_t tail; /* bytes consumed */
	char pad1[56];
	_Atomic uint32_t consumer_waiting;
	char pad2[60];
	_Atomic uint32_t producer_waiting;
	char pad3[60];
};

#define SEG_HEADER 4096u
/* rings[0] carries connector → acceptor, rings[1] acceptor → connector. */
struct seg_header {
	struct ring_ctl rings[2];
};
_Static_assert(sizeof(struct seg_header) <= SEG_HEADER, "header fits its page");

/* ---- objects ---- */

enum conn_state {
	CS_CONNECTOR_WAIT_NONCE,
	CS_CONNECTOR_WAIT_VERDICT,
	CS_ACCEPTOR_WAIT_HELLO,
	CS_READY,
	CS_FAILED
};

struct kolo_req {
	struct shm_conn *c;
	bool send;
	bool done;
	uint8_t zero; /* the byte that stands for a zero-length message */
	uint8_t *buf;
	size_t len, moved;
	struct kolo_req *prev, *next; /* in the conn's list for this direction */
};

struct req_list {
	struct kolo_req *first, *last;
};

struct shm_conn {
	struct kolo_conn base;
	struct shm_transport *t;
	int fd;
	enum conn_state state;
	bool claimed; /* returned by accept() or connect() */
	bool acceptor;
	bool peer_closed; /* EOF on the socket: what is in the ring still counts */
	kolo_status_t failed;
	uint8_t hs[sizeof(struct msg_hello)];
	size_t hs_len;
	uint8_t nonce[32];
	uint8_t *map;
	size_t map_len, ring_bytes;
	struct ring_ctl *tx, *rx;
	uint8_t *txdata, *rxdata;
	struct req_list sends, recvs;
	uint64_t last_progress_ns;
	uint64_t created_ns;
	struct shm_conn *next_conn;
};

struct shm_transport {
	struct kolo_transport base;
	char job[JOB_MAX];
	int64_t round;
	int rank;
	uint8_t *token;
	size_t token_len;
	int timeout_ms;
	size_t ring_bytes;
	int listen_fd;
	int epfd;
	int abort_fd;
	_Atomic int abort_status;
	char name[48];
	struct shm_conn *conns;
};

static struct shm_transport *tr(struct kolo_transport *t)
{
	return kolo_container_of(t, struct shm_transport, base);
}

static struct shm_conn *cn(struct kolo_conn *c)
{
	return kolo_container_of(c, struct shm_conn, base);
}

/* ---- helpers ---- */

static void list_push(struct req_list *l, struct kolo_req *r)
{
	r->prev = l->last;
	r->next = NULL;
	if (l->last)
		l->last->next = r;
	else
		l->first = r;
	l->last = r;
}

static void list_unlink(struct req_list *l, struct kolo_req *r)
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

static void list_free(struct req_list *l)
{
	struct kolo_req *r = l->first;
	while (r) {
		struct kolo_req *n = r->next;
		free(r);
		r = n;
	}
	l->first = l->last = NULL;
}

static socklen_t abstract_addr(struct sockaddr_un *sa, const char *name)
{
	memset(sa, 0, sizeof(*sa));
	sa->sun_family = AF_UNIX;
	size_t n = strlen(name);
	memcpy(sa->sun_path + 1, name, n);
	return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
}

static void compute_mac(const struct shm_transport *t, const uint8_t nonce[32],
                        const struct msg_hello *h, uint8_t out[KOLO_HMAC_SIZE])
{
	struct {
		uint8_t nonce[32];
		char job[JOB_MAX];
		int64_t round;
		int32_t src, dst, tag;
	} m;
	memset(&m, 0, sizeof(m));
	memcpy(m.nonce, nonce, 32);
	memcpy(m.job, h->job, JOB_MAX);
	m.round = h->round;
	m.src = h->src_rank;
	m.dst = h->dst_rank;
	m.tag = h->tag;
	kolo_hmac_sha256(t->token, t->token_len, &m, sizeof(m), out);
}

static void conn_fail(struct shm_conn *c, kolo_status_t st, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));

static void conn_fail(struct shm_conn *c, kolo_status_t st, const char *fmt, ...)
{
	if (c->state == CS_FAILED)
		return;
	char msg[KOLO_ERRBUF_SIZE];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	c->state = CS_FAILED;
	c->failed = st;
	kolo_fail(&c->t->base.err, st, "shm conn to rank %d (tag %d): %s", c->base.peer_rank,
	          c->base.tag, msg);
}

static kolo_status_t send_all(int fd, const void *buf, size_t len, int passfd)
{
	struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
	union {
		char b[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} ctl;
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
	if (passfd >= 0) {
		memset(&ctl, 0, sizeof(ctl));
		mh.msg_control = ctl.b;
		mh.msg_controllen = sizeof(ctl.b);
		struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(cm), &passfd, sizeof(int));
	}
	/* Handshake messages are a few hundred bytes on a fresh socket whose
	 * buffer is far larger, so one sendmsg either sends all or fails. */
	ssize_t n;
	do {
		n = sendmsg(fd, &mh, MSG_NOSIGNAL);
	} while (n < 0 && errno == EINTR);
	return n == (ssize_t)len ? KOLO_OK : KOLO_EPEER;
}

static kolo_status_t conn_map(struct shm_conn *c, int memfd, size_t ring_bytes, bool create)
{
	size_t len = SEG_HEADER + 2 * ring_bytes;
	if (create && ftruncate(memfd, (off_t)len) != 0)
		return KOLO_ESYSTEM;
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
	if (p == MAP_FAILED)
		return KOLO_ENOMEM;
	c->map = p;
	c->map_len = len;
	c->ring_bytes = ring_bytes;
	struct seg_header *h = p;
	uint8_t *d0 = (uint8_t *)p + SEG_HEADER, *d1 = d0 + ring_bytes;
	if (create) {
		for (int i = 0; i < 2; i++) {
			atomic_init(&h->rings[i].head, 0);
			atomic_init(&h->rings[i].tail, 0);
			atomic_init(&h->rings[i].consumer_waiting, 0);
			atomic_init(&h->rings[i].producer_waiting, 0);
		}
	}
	if (c->acceptor) {
		c->rx = &h->rings[0];
		c->rxdata = d0;
		c->tx = &h->rings[1];
		c->txdata = d1;
	} else {
		c->tx = &h->rings[0];
		c->txdata = d0;
		c->rx = &h->rings[1];
		c->rxdata = d1;
	}
	return KOLO_OK;
}

static kolo_status_t conn_add(struct shm_transport *t, int fd, bool acceptor, int peer, int tag,
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
	c->state = acceptor ? CS_ACCEPTOR_WAIT_HELLO : CS_CONNECTOR_WAIT_NONCE;
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

static void conn_free(struct shm_conn *c)
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

/* ---- handshake ---- */

/* Reads what is there into c->hs up to `want` bytes; receives an fd when
 * one rides along. Returns KOLO_OK with c->hs_len < want when incomplete. */
static kolo_status_t hs_read(struct shm_conn *c, size_t want, int *fd_out)
{
	while (c->hs_len < want) {
		struct iovec iov = {.iov_base = c->hs + c->hs_len, .iov_len = want - c->hs_len};
		union {
			char b[CMSG_SPACE(sizeof(int))];
			struct cmsghdr align;
		} ctl;
		struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
		if (fd_out) {
			mh.msg_control = ctl.b;
			mh.msg_controllen = sizeof(ctl.b);
		}
		ssize_t n = recvmsg(c->fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return KOLO_OK;
			return KOLO_EPEER;
		}
		if (n == 0)
			return KOLO_EPEER;
		if (fd_out) {
			for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm;
			     cm = CMSG_NXTHDR(&mh, cm)) {
				if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS)
					memcpy(fd_out, CMSG_DATA(cm), sizeof(int));
			}
		}
		c->hs_len += (size_t)n;
	}
	return KOLO_OK;
}

static void refuse(struct shm_conn *c, kolo_status_t why, const char *reason)
{
	KOLO_WARN(SUBSYS, "refused a shared-memory connection: %s", reason);
	struct msg_verdict v = {.magic = KOLO_TRANSPORT_MAGIC, .status = (uint32_t)why};
	(void)send_all(c->fd, &v, sizeof(v), -1);
	c->state = CS_FAILED;
	c->failed = why;
}

static void acceptor_step(struct shm_conn *c)
{
	struct shm_transport *t = c->t;
	if (hs_read(c, sizeof(struct msg_hello), NULL) != KOLO_OK) {
		c->state = CS_FAILED;
		c->failed = KOLO_EPEER;
		return;
	}
	if (c->hs_len >= 4 && memcmp(c->hs, &(uint32_t){KOLO_TRANSPORT_MAGIC}, 4) != 0) {
		refuse(c, KOLO_EPROTO, "bad magic (not a kolo peer)");
		return;
	}
	if (c->hs_len < sizeof(struct msg_hello))
		return;
	struct msg_hello h;
	memcpy(&h, c->hs, sizeof(h));
	h.job[JOB_MAX - 1] = '\0';
	uint8_t mac[KOLO_HMAC_SIZE];
	char why[512];
	compute_mac(t, c->nonce, &h, mac);
	if (h.version != KOLO_WIRE_VERSION) {
		snprintf(why, sizeof(why), "wire version %u, want %u", h.version,
		         KOLO_WIRE_VERSION);
		refuse(c, KOLO_EPROTO, why);
	} else if (!kolo_consttime_equal(mac, h.mac, sizeof(mac))) {
		snprintf(why, sizeof(why), "bad token proof from rank %d", (int)h.src_rank);
		refuse(c, KOLO_EAUTH, why);
	} else if (strcmp(h.job, t->job) != 0) {
		snprintf(why, sizeof(why), "job '%s', this is '%s'", h.job, t->job);
		refuse(c, KOLO_EAUTH, why);
	} else if (h.round != t->round) {
		snprintf(why, sizeof(why), "rank %d is in round %lld, this endpoint in %lld",
		         (int)h.src_rank, (long long)h.round, (long long)t->round);
		refuse(c, KOLO_EMEMBERSHIP, why);
	} else if (h.dst_rank != t->rank) {
		snprintf(why, sizeof(why), "addressed to rank %d, this is rank %d", (int)h.dst_rank,
		         t->rank);
		refuse(c, KOLO_EPROTO, why);
	} else {
		int memfd = memfd_create("kolo-shm", MFD_CLOEXEC);
		c->base.peer_rank = h.src_rank;
		c->base.tag = h.tag;
		kolo_status_t st =
		        memfd < 0 ? KOLO_ESYSTEM : conn_map(c, memfd, t->ring_bytes, true);
		if (st == KOLO_OK) {
			struct msg_verdict v = {.magic = KOLO_TRANSPORT_MAGIC,
			                        .status = 0,
			                        .ring_bytes = t->ring_bytes};
			st = send_all(c->fd, &v, sizeof(v), memfd);
		}
		if (memfd >= 0)
			close(memfd);
		if (st != KOLO_OK) {
			c->state = CS_FAILED;
			c->failed = st;
			return;
		}
		c->state = CS_READY;
		c->last_progress_ns = kolo_now_ns();
	}
}

static void connector_step(struct shm_conn *c)
{
	struct shm_transport *t = c->t;
	if (c->state == CS_CONNECTOR_WAIT_NONCE) {
		if (hs_read(c, sizeof(struct msg_nonce), NULL) != KOLO_OK) {
			conn_fail(c, KOLO_EPEER, "peer closed during the handshake");
			return;
		}
		if (c->hs_len < sizeof(struct msg_nonce))
			return;
		struct msg_nonce n;
		memcpy(&n, c->hs, sizeof(n));
		if (n.magic != KOLO_TRANSPORT_MAGIC) {
			conn_fail(c, KOLO_EPROTO, "peer is not a kolo endpoint");
			return;
		}
		struct msg_hello h;
		memset(&h, 0, sizeof(h));
		h.magic = KOLO_TRANSPORT_MAGIC;
		h.version = KOLO_WIRE_VERSION;
		snprintf(h.job, sizeof(h.job), "%s", t->job);
		h.round = t->round;
		h.src_rank = t->rank;
		h.dst_rank = c->base.peer_rank;
		h.tag = c->base.tag;
		compute_mac(t, n.nonce, &h, h.mac);
		if (send_all(c->fd, &h, sizeof(h), -1) != KOLO_OK) {
			conn_fail(c, KOLO_EPEER, "peer closed during the handshake");
			return;
		}
		c->hs_len = 0;
		c->state = CS_CONNECTOR_WAIT_VERDICT;
	}
	if (c->state == CS_CONNECTOR_WAIT_VERDICT) {
		int memfd = -1;
		kolo_status_t st = hs_read(c, sizeof(struct msg_verdict), &memfd);
		if (st != KOLO_OK) {
			if (memfd >= 0)
				close(memfd);
			conn_fail(c, KOLO_EPEER, "peer closed during the handshake");
			return;
		}
		if (c->hs_len < sizeof(struct msg_verdict)) {
			if (memfd >= 0)
				close(memfd); /* the fd rides with the first byte only */
			return;
		}
		struct msg_verdict v;
		memcpy(&v, c->hs, sizeof(v));
		if (v.status != 0 || memfd < 0) {
			if (memfd >= 0)
				close(memfd);
			conn_fail(c, v.status ? (kolo_status_t)v.status : KOLO_EPROTO,
			          "peer refused the handshake: %s",
			          kolo_strerror((kolo_status_t)v.status));
			return;
		}
		st = conn_map(c, memfd, (size_t)v.ring_bytes, false);
		close(memfd);
		if (st != KOLO_OK) {
			conn_fail(c, st, "cannot map the shared segment");
			return;
		}
		c->state = CS_READY;
		c->last_progress_ns = kolo_now_ns();
	}
}

static void accept_new(struct shm_transport *t)
{
	for (;;) {
		int fd = accept4(t->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0)
			return;
		struct shm_conn *c;
		if (conn_add(t, fd, true, -1, -1, &c) != KOLO_OK) {
			close(fd);
			continue;
		}
		struct msg_nonce n = {.magic = KOLO_TRANSPORT_MAGIC, .version = KOLO_WIRE_VERSION};
		if (kolo_random_bytes(n.nonce, sizeof(n.nonce)) != KOLO_OK ||
		    send_all(fd, &n, sizeof(n), -1) != KOLO_OK) {
			c->state = CS_FAILED;
			c->failed = KOLO_EPEER;
			continue;
		}
		memcpy(c->nonce, n.nonce, sizeof(n.nonce));
	}
}

/* ---- data movement ---- */

static void wake_peer(struct shm_conn *c)
{
	static const char b = 'w';
	ssize_t n = send(c->fd, &b, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
	(void)n; /* a full socket buffer already holds a wake-up */
}

static size_t ring_copy_in(struct shm_conn *c, const uint8_t *src, size_t len)
{
	uint64_t head = atomic_load_explicit(&c->tx->head, memory_order_relaxed);
	uint64_t tail = atomic_load_explicit(&c->tx->tail, memory_order_acquire);
	size_t space = c->ring_bytes - (size_t)(head - tail);
	size_t n = KOLO_MIN(space, len);
	n = KOLO_MIN(n, (size_t)PUBLISH_BYTES);
	if (n == 0)
		return 0;
	size_t off = (size_t)(head % c->ring_bytes);
	size_t first = KOLO_MIN(n, c->ring_bytes - off);
	memcpy(c->txdata + off, src, first);
	memcpy(c->txdata, src + first, n - first);
	atomic_store_explicit(&c->tx->head, head + n, memory_order_seq_cst);
	if (atomic_load_explicit(&c->tx->consumer_waiting, memory_order_seq_cst))
		wake_peer(c);
	return n;
}

static size_t ring_copy_out(struct shm_conn *c, uint8_t *dst, size_t len)
{
	uint64_t tail = atomic_load_explicit(&c->rx->tail, memory_order_relaxed);
	uint64_t head = atomic_load_explicit(&c->rx->head, memory_order_acquire);
	size_t n = KOLO_MIN((size_t)(head - tail), len);
	n = KOLO_MIN(n, (size_t)PUBLISH_BYTES);
	if (n == 0)
		return 0;
	size_t off = (size_t)(tail % c->ring_bytes);
	size_t first = KOLO_MIN(n, c->ring_bytes - off);
	memcpy(dst, c->rxdata + off, first);
	memcpy(dst + first, c->rxdata, n - first);
	atomic_store_explicit(&c->rx->tail, tail + n, memory_order_seq_cst);
	if (atomic_load_explicit(&c->rx->producer_waiting, memory_order_seq_cst))
		wake_peer(c);
	return n;
}

/* Moves as many bytes as the rings allow. Returns true when anything moved. */
static bool conn_progress(struct shm_conn *c)
{
	bool moved = false;
	if (c->state != CS_READY)
		return false;
	for (struct kolo_req *r = c->sends.first; r; r = r->next) {
		if (r->done)
			continue;
		if (c->peer_closed) {
			conn_fail(c, KOLO_EPEER, "peer closed the connection");
			return moved;
		}
		size_t n;
		while (r->moved < r->len &&
		       (n = ring_copy_in(c, r->buf + r->moved, r->len - r->moved)) > 0) {
			r->moved += n;
			moved = true;
		}
		if (r->moved < r->len)
			break;
		r->done = true;
		moved = true;
	}
	for (struct kolo_req *r = c->recvs.first; r; r = r->next) {
		if (r->done)
			continue;
		size_t n;
		while (r->moved < r->len &&
		       (n = ring_copy_out(c, r->buf + r->moved, r->len - r->moved)) > 0) {
			r->moved += n;
			moved = true;
		}
		if (r->moved < r->len) {
			if (c->peer_closed) {
				conn_fail(c, KOLO_EPEER, "peer closed the connection");
				return moved;
			}
			break;
		}
		r->done = true;
		moved = true;
	}
	if (moved)
		c->last_progress_ns = kolo_now_ns();
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

/* Drains wake-up bytes; notices a closed peer. */
static void conn_drain(struct shm_conn *c)
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
	if (t->timeout_ms <= 0 || now < c->last_progress_ns)
		return;
	if (c->state == CS_READY && conn_pending(c) && now - c->last_progress_ns > limit)
		conn_fail(c, KOLO_ETIMEDOUT, "no progress for %d ms", t->timeout_ms);
	else if (c->state != CS_READY && c->state != CS_FAILED && now - c->created_ns > limit)
		conn_fail(c, KOLO_ETIMEDOUT, "handshake not finished after %d ms", t->timeout_ms);
}

/* One pass over everything: handshakes, data, failures. */
static bool transport_progress(struct shm_transport *t)
{
	bool any = false;
	accept_new(t);
	uint64_t now = kolo_now_ns();
	struct shm_conn **p = &t->conns;
	while (*p) {
		struct shm_conn *c = *p;
		if (c->state == CS_ACCEPTOR_WAIT_HELLO)
			acceptor_step(c);
		else if (c->state == CS_CONNECTOR_WAIT_NONCE ||
		         c->state == CS_CONNECTOR_WAIT_VERDICT)
			connector_step(c);
		/* Unclaimed handshakes that failed are strays: drop them. */
		if (c->acceptor && !c->claimed && c->state == CS_FAILED) {
			*p = c->next_conn;
			conn_free(c);
			continue;
		}
		if (c->state == CS_READY && conn_progress(c))
			any = true;
		check_timeout(c, now);
		p = &c->next_conn;
	}
	return any;
}

/* ---- ops ---- */

static void shm_destroy(struct kolo_transport *base);

static kolo_status_t shm_create(const struct kolo_transport_config *cfg,
                                struct kolo_transport **out, struct kolo_errbuf *eb)
{
	*out = NULL;
	struct shm_transport *t = calloc(1, sizeof(*t));
	if (!t)
		return kolo_fail(eb, KOLO_ENOMEM, "shm: out of memory");
	t->base.ops = &kolo_transport_shm_ops;
	t->listen_fd = t->epfd = t->abort_fd = -1;
	if (kolo_strfmt(t->job, sizeof(t->job), "%s", cfg->job ? cfg->job : "") != KOLO_OK) {
		free(t);
		return kolo_fail(eb, KOLO_EINVAL, "shm: job id longer than %zu bytes",
		                 sizeof(t->job) - 1);
	}
	t->round = cfg->round;
	t->rank = cfg->rank;
	t->timeout_ms = cfg->timeout_ms;
	/* Smaller than a page, or 0: the parameter's default. */
	size_t rb = cfg->shm_ring_bytes;
	t->ring_bytes =
	        rb >= 4096 ? rb
	                   : (size_t)strtoull(kolo_param_info(KOLO_P_SHM_BUFFER)->def, NULL, 10);
	t->token_len = cfg->token_len;
	t->token = malloc(cfg->token_len + 1);
	if (!t->token)
		goto fail;
	if (cfg->token_len)
		memcpy(t->token, cfg->token, cfg->token_len);
	t->epfd = epoll_create1(EPOLL_CLOEXEC);
	t->abort_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (t->epfd < 0 || t->abort_fd < 0)
		goto fail;
	struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
	if (epoll_ctl(t->epfd, EPOLL_CTL_ADD, t->abort_fd, &ev) != 0)
		goto fail;
	*out = &t->base;
	return KOLO_OK;
fail:
	shm_destroy(&t->base);
	return kolo_fail(eb, KOLO_ESYSTEM, "shm: cannot create the endpoint: %s", strerror(errno));
}

static kolo_status_t shm_listen(struct kolo_transport *base, struct kolo_transport_handle *out)
{
	struct shm_transport *t = tr(base);
	if (t->listen_fd >= 0)
		return kolo_fail(&base->err, KOLO_EINVAL, "shm: listen called twice");
	char rnd[33];
	KOLO_CHECK(kolo_random_hex(rnd, 16));
	snprintf(t->name, sizeof(t->name), "kolo-shm-%s", rnd);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return kolo_fail(&base->err, KOLO_ESYSTEM, "shm: socket: %s", strerror(errno));
	struct sockaddr_un sa;
	socklen_t sl = abstract_addr(&sa, t->name);
	if (bind(fd, (struct sockaddr *)&sa, sl) != 0 || listen(fd, 128) != 0) {
		int e = errno;
		close(fd);
		return kolo_fail(&base->err, KOLO_ESYSTEM, "shm: bind/listen: %s", strerror(e));
	}
	struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &t->listen_fd};
	if (epoll_ctl(t->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
		close(fd);
		return kolo_fail(&base->err, KOLO_ESYSTEM, "shm: epoll: %s", strerror(errno));
	}
	t->listen_fd = fd;
	struct handle_wire w;
	memset(&w, 0, sizeof(w));
	w.magic = KOLO_TRANSPORT_MAGIC;
	w.kind = KOLO_HANDLE_SHM;
	memcpy(w.name, t->name, sizeof(w.name));
	memset(out, 0, sizeof(*out));
	memcpy(out->bytes, &w, sizeof(w));
	return KOLO_OK;
}

static kolo_status_t shm_connect(struct kolo_transport *base,
                                 const struct kolo_transport_handle *peer, int peer_rank, int tag,
                                 struct kolo_conn **out)
{
	struct shm_transport *t = tr(base);
	struct handle_wire w;
	memcpy(&w, peer->bytes, sizeof(w));
	w.name[sizeof(w.name) - 1] = '\0';
	if (w.magic != KOLO_TRANSPORT_MAGIC || w.kind != KOLO_HANDLE_SHM)
		return kolo_fail(&base->err, KOLO_EINVAL, "shm: not a shared-memory handle");
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return kolo_fail(&base->err, KOLO_ESYSTEM, "shm: socket: %s", strerror(errno));
	struct sockaddr_un sa;
	socklen_t sl = abstract_addr(&sa, w.name);
	if (connect(fd, (struct sockaddr *)&sa, sl) != 0 && errno != EINPROGRESS &&
	    errno != EAGAIN) {
		int e = errno;
		close(fd);
		return kolo_fail(&base->err, KOLO_EPEER, "shm: connect to rank %d: %s", peer_rank,
		                 strerror(e));
	}
	struct shm_conn *c;
	if (conn_add(t, fd, false, peer_rank, tag, &c) != KOLO_OK) {
		close(fd);
		return kolo_fail(&base->err, KOLO_ESYSTEM, "shm: cannot add conn");
	}
	c->claimed = true;
	*out = &c->base;
	return KOLO_OK;
}

static kolo_status_t shm_accept(struct kolo_transport *base, int peer_rank, int tag,
                                struct kolo_conn **out)
{
	struct shm_transport *t = tr(base);
	*out = NULL;
	int ab = atomic_load(&t->abort_status);
	if (ab != KOLO_OK)
		return (kolo_status_t)ab;
	transport_progress(t);
	for (struct shm_conn *c = t->conns; c; c = c->next_conn) {
		if (c->acceptor && !c->claimed && c->state == CS_READY &&
		    c->base.peer_rank == peer_rank && c->base.tag == tag) {
			c->claimed = true;
			*out = &c->base;
			return KOLO_OK;
		}
	}
	return KOLO_OK;
}

static kolo_status_t post(struct kolo_conn *base, void *buf, size_t len, bool send,
                          struct kolo_req **out)
{
	struct shm_conn *c = cn(base);
	int ab = atomic_load(&c->t->abort_status);
	if (ab != KOLO_OK)
		return (kolo_status_t)ab;
	if (c->state == CS_FAILED)
		return c->failed;
	struct kolo_req *r = calloc(1, sizeof(*r));
	if (!r)
		return KOLO_ENOMEM;
	r->c = c;
	r->send = send;
	r->buf = buf;
	r->len = len;
	if (len == 0) {
		/* The rings carry a byte stream; a zero-length message must still
		 * synchronise (a barrier is made of them), so it travels as one
		 * byte on both sides (lengths match by contract). */
		r->buf = &r->zero;
		r->len = 1;
	}
	if (!conn_pending(c))
		c->last_progress_ns = kolo_now_ns();
	list_push(send ? &c->sends : &c->recvs, r);
	*out = r;
	return KOLO_OK;
}

static kolo_status_t shm_isend(struct kolo_conn *c, const void *buf, size_t len,
                               struct kolo_req **out)
{
	return post(c, (void *)buf, len, true, out);
}

static kolo_status_t shm_irecv(struct kolo_conn *c, void *buf, size_t len, struct kolo_req **out)
{
	return post(c, buf, len, false, out);
}

static void req_release(struct kolo_req *r)
{
	list_unlink(r->send ? &r->c->sends : &r->c->recvs, r);
	free(r);
}

static kolo_status_t shm_test(struct kolo_req *r, bool *done)
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
		if (c->state == CS_READY)
			conn_progress(c);
		else
			transport_progress(t);
	}
	if (r->done) {
		*done = true;
		req_release(r);
		return KOLO_OK;
	}
	if (c->state == CS_FAILED) {
		kolo_status_t st = c->failed;
		req_release(r);
		return st;
	}
	check_timeout(c, kolo_now_ns());
	return KOLO_OK;
}

static kolo_status_t shm_wait(struct kolo_transport *base, int timeout_ms)
{
	struct shm_transport *t = tr(base);
	int ab = atomic_load(&t->abort_status);
	if (ab != KOLO_OK)
		return (kolo_status_t)ab;
	/* Announce that we are about to sleep, then look once more: a peer
	 * that produced after our last look either sees the flag and wakes us
	 * or its bytes are seen here (both sides use seq_cst). */
	for (struct shm_conn *c = t->conns; c; c = c->next_conn) {
		if (c->state != CS_READY)
			continue;
		atomic_store(&c->rx->consumer_waiting, 1);
		atomic_store(&c->tx->producer_waiting, 1);
	}
	bool progressed = transport_progress(t);
	if (!progressed && timeout_ms > 0) {
		struct epoll_event evs[32];
		int n = epoll_wait(t->epfd, evs, 32, timeout_ms);
		for (int i = 0; i < n; i++) {
			struct shm_conn *c = evs[i].data.ptr;
			if (c && (void *)c != (void *)&t->listen_fd && c->state == CS_READY)
				conn_drain(c);
		}
	}
	for (struct shm_conn *c = t->conns; c; c = c->next_conn) {
		if (c->state != CS_READY)
			continue;
		/* wait(0) leaves the wake-ups armed for a caller that then blocks
		 * in poll() on poll_fd() (the hybrid transport): without them, a
		 * peer's bytes would not make the fd readable. The cost is a
		 * wake-up write per message by the peer until our next wait. */
		if (timeout_ms > 0) {
			atomic_store(&c->rx->consumer_waiting, 0);
			atomic_store(&c->tx->producer_waiting, 0);
		}
		conn_drain(c);
	}
	ab = atomic_load(&t->abort_status);
	return (kolo_status_t)ab;
}

static void shm_abort(struct kolo_transport *base, kolo_status_t st)
{
	struct shm_transport *t = tr(base);
	int expected = KOLO_OK;
	atomic_compare_exchange_strong(&t->abort_status, &expected, (int)st);
	uint64_t one = 1;
	ssize_t n = write(t->abort_fd, &one, sizeof(one));
	(void)n;
}

static void shm_close(struct kolo_conn *base)
{
	if (!base)
		return;
	struct shm_conn *c = cn(base);
	conn_unlink(c->t, c);
	conn_free(c);
}

static void shm_destroy(struct kolo_transport *base)
{
	if (!base)
		return;
	struct shm_transport *t = tr(base);
	while (t->conns) {
		struct shm_conn *c = t->conns;
		t->conns = c->next_conn;
		conn_free(c);
	}
	if (t->listen_fd >= 0)
		close(t->listen_fd);
	if (t->epfd >= 0)
		close(t->epfd);
	if (t->abort_fd >= 0)
		close(t->abort_fd);
	free(t->token);
	free(t);
}

static int shm_poll_fd(struct kolo_transport *base)
{
	return tr(base)->epfd;
}

const struct kolo_transport_ops kolo_transport_shm_ops = {
        .name = "shm",
        .create = shm_create,
        .listen = shm_listen,
        .connect = shm_connect,
        .accept = shm_accept,
        .isend = shm_isend,
        .irecv = shm_irecv,
        .test = shm_test,
        .wait = shm_wait,
        .abort = shm_abort,
        .close = shm_close,
        .destroy = shm_destroy,
        .poll_fd = shm_poll_fd,
};
