/* verbs_conn: listen, connect and accept; the handshake over the CM socket
 * that proves the job token and exchanges the two QPs (docs/transport.md,
 * "Verbs: the handshake"). One 128-byte handle per rank cannot hold a QP
 * per conn, so the handle names the port and this socket, and each conn's
 * QP travels in its handshake, as with rdma_cm. */
#include "verbs_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

/* ---- wire ---- */

#define VB_HANDLE_VERSION 1

struct handle_wire {
	uint32_t magic;
	uint8_t kind; /* KOLO_HANDLE_VERBS */
	uint8_t version;
	uint8_t roce;
	uint8_t family; /* of the CM socket's address: 4 or 6 */
	int64_t round;  /* a handle of another round is refused */
	uint16_t lid;
	uint16_t cm_port; /* network order */
	uint8_t pad[4];
	uint8_t cm_addr[16];
	uint8_t gid[16];
};
/* The hybrid transport keeps 60 bytes of a sub-handle (runtime/hybrid.c). */
_Static_assert(sizeof(struct handle_wire) <= 60, "a verbs handle fits in a hybrid one");

struct msg_nonce {
	uint32_t magic;
	uint32_t version;
	uint8_t nonce[32];
};

struct msg_verdict {
	uint32_t magic;
	uint32_t status; /* kolo_status_t; 0 = accepted */
	struct vb_qpinfo qp;
	uint8_t mac[KOLO_HMAC_SIZE]; /* the acceptor's proof of the token */
};

struct msg_ready {
	uint32_t magic;
};

static void mac_hello(const struct vb_transport *t, const uint8_t nonce[32],
                      const struct vb_hello *h, uint8_t out[KOLO_HMAC_SIZE])
{
	uint8_t m[32 + offsetof(struct vb_hello, mac)];
	memcpy(m, nonce, 32);
	memcpy(m + 32, h, offsetof(struct vb_hello, mac));
	kolo_hmac_sha256(t->token, t->token_len, m, sizeof(m), out);
}

static void mac_verdict(const struct vb_transport *t, const uint8_t hello_mac[KOLO_HMAC_SIZE],
                        const struct msg_verdict *v, uint8_t out[KOLO_HMAC_SIZE])
{
	uint8_t m[KOLO_HMAC_SIZE + offsetof(struct msg_verdict, mac)];
	memcpy(m, hello_mac, KOLO_HMAC_SIZE);
	memcpy(m + KOLO_HMAC_SIZE, v, offsetof(struct msg_verdict, mac));
	kolo_hmac_sha256(t->token, t->token_len, m, sizeof(m), out);
}

static kolo_status_t send_all(int fd, const void *buf, size_t len)
{
	/* Handshake messages are a few hundred bytes on a fresh socket. */
	ssize_t n;
	do {
		n = send(fd, buf, len, MSG_NOSIGNAL);
	} while (n < 0 && errno == EINTR);
	return n == (ssize_t)len ? KOLO_OK : KOLO_EPEER;
}

/* Reads what is there into c->hs up to `want` bytes. KOLO_OK with
 * c->hs_len < want when incomplete. */
static kolo_status_t hs_read(struct vb_conn *c, size_t want)
{
	while (c->hs_len < want) {
		ssize_t n = recv(c->fd, c->hs + c->hs_len, want - c->hs_len, MSG_DONTWAIT);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return KOLO_OK;
			return KOLO_EPEER;
		}
		if (n == 0)
			return KOLO_EPEER;
		c->hs_len += (size_t)n;
	}
	return KOLO_OK;
}

/* ---- the acceptor ---- */

static void refuse(struct vb_conn *c, kolo_status_t why, const char *reason)
{
	KOLO_WARN(VB_SUBSYS, "refused a verbs connection: %s", reason);
	struct msg_verdict v;
	memset(&v, 0, sizeof(v));
	v.magic = KOLO_TRANSPORT_MAGIC;
	v.status = (uint32_t)why;
	(void)send_all(c->fd, &v, sizeof(v));
	c->state = VB_CS_FAILED;
	c->failed = why;
}

static bool params_match(const struct vb_transport *t, const struct vb_qpinfo *q)
{
	return q->nslots == (uint32_t)t->nslots && q->slot_bytes == t->slot_bytes;
}

static void acceptor_hello(struct vb_conn *c)
{
	struct vb_transport *t = c->t;
	if (c->hs_len >= 4 && memcmp(c->hs, &(uint32_t){KOLO_TRANSPORT_MAGIC}, 4) != 0) {
		refuse(c, KOLO_EPROTO, "bad magic (not a kolo peer)");
		return;
	}
	if (c->hs_len < sizeof(struct vb_hello))
		return;
	struct vb_hello h;
	memcpy(&h, c->hs, sizeof(h));
	uint8_t mac[KOLO_HMAC_SIZE];
	mac_hello(t, c->nonce, &h, mac);
	h.job[VB_JOB_MAX - 1] = '\0';
	char why[512];
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
	} else if (!params_match(t, &h.qp)) {
		snprintf(why, sizeof(why),
		         "rank %d has %u slots of %u bytes, this endpoint %d of %u",
		         (int)h.src_rank, h.qp.nslots, h.qp.slot_bytes, t->nslots, t->slot_bytes);
		refuse(c, KOLO_EPROTO, why);
	} else {
		c->base.peer_rank = h.src_rank;
		c->base.tag = h.tag;
		c->peer = h.qp;
		struct msg_verdict v;
		memset(&v, 0, sizeof(v));
		v.magic = KOLO_TRANSPORT_MAGIC;
		kolo_status_t st = vb_qp_setup(c, &v.qp);
		if (st == KOLO_OK)
			st = vb_qp_connect(c);
		if (st != KOLO_OK) {
			refuse(c, KOLO_ESYSTEM, "cannot bring the QP up");
			return;
		}
		mac_verdict(t, h.mac, &v, v.mac);
		if (send_all(c->fd, &v, sizeof(v)) != KOLO_OK) {
			c->state = VB_CS_FAILED;
			c->failed = KOLO_EPEER;
			return;
		}
		c->hs_len = 0;
		c->state = VB_CS_ACCEPTOR_WAIT_READY;
	}
}

void vb_acceptor_step(struct vb_conn *c)
{
	size_t want = c->state == VB_CS_ACCEPTOR_WAIT_HELLO ? sizeof(struct vb_hello)
	                                                    : sizeof(struct msg_ready);
	if (hs_read(c, want) != KOLO_OK) {
		if (c->claimed)
			vb_conn_fail(c, KOLO_EPEER, "peer closed during the handshake");
		c->state = VB_CS_FAILED;
		c->failed = KOLO_EPEER;
		return;
	}
	if (c->state == VB_CS_ACCEPTOR_WAIT_HELLO) {
		acceptor_hello(c);
		return;
	}
	if (c->hs_len < want)
		return;
	struct msg_ready r;
	memcpy(&r, c->hs, sizeof(r));
	if (r.magic != KOLO_TRANSPORT_MAGIC) {
		c->state = VB_CS_FAILED;
		c->failed = KOLO_EPROTO;
		return;
	}
	/* The connector's QP is at RTS: writes towards it are safe now. */
	c->state = VB_CS_READY;
	c->last_progress_ns = kolo_now_ns();
}

void vb_accept_new(struct vb_transport *t)
{
	if (t->listen_fd < 0)
		return;
	for (;;) {
		int fd = accept4(t->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0)
			return;
		int one = 1;
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		struct vb_conn *c;
		if (vb_conn_add(t, fd, true, -1, -1, &c) != KOLO_OK) {
			close(fd);
			continue;
		}
		struct msg_nonce n = {.magic = KOLO_TRANSPORT_MAGIC, .version = KOLO_WIRE_VERSION};
		if (kolo_random_bytes(n.nonce, sizeof(n.nonce)) != KOLO_OK ||
		    send_all(fd, &n, sizeof(n)) != KOLO_OK) {
			c->state = VB_CS_FAILED;
			c->failed = KOLO_EPEER;
			continue;
		}
		memcpy(c->nonce, n.nonce, sizeof(n.nonce));
	}
}

/* ---- the connector ---- */

void vb_connector_step(struct vb_conn *c)
{
	struct vb_transport *t = c->t;
	if (c->stale_handle) {
		KOLO_WARN(VB_SUBSYS,
		          "refused rank %d's handle: round %lld, this endpoint is in %lld",
		          c->base.peer_rank, (long long)c->handle_round, (long long)t->round);
		vb_conn_fail(c, KOLO_EMEMBERSHIP, "handle of round %lld, this endpoint is in %lld",
		             (long long)c->handle_round, (long long)t->round);
		return;
	}
	if (c->state == VB_CS_CONNECTOR_WAIT_NONCE) {
		if (hs_read(c, sizeof(struct msg_nonce)) != KOLO_OK) {
			vb_conn_fail(c, KOLO_EPEER, "peer closed during the handshake");
			return;
		}
		if (c->hs_len < sizeof(struct msg_nonce))
			return;
		struct msg_nonce n;
		memcpy(&n, c->hs, sizeof(n));
		if (n.magic != KOLO_TRANSPORT_MAGIC) {
			vb_conn_fail(c, KOLO_EPROTO, "peer is not a kolo endpoint");
			return;
		}
		struct vb_hello h;
		memset(&h, 0, sizeof(h));
		h.magic = KOLO_TRANSPORT_MAGIC;
		h.version = KOLO_WIRE_VERSION;
		snprintf(h.job, sizeof(h.job), "%s", t->job);
		h.round = t->round;
		h.src_rank = t->rank;
		h.dst_rank = c->base.peer_rank;
		h.tag = c->base.tag;
		kolo_status_t st = vb_qp_setup(c, &h.qp);
		if (st != KOLO_OK) {
			vb_conn_fail(c, st, "cannot set the QP up: %s", t->base.err.msg);
			return;
		}
		mac_hello(t, n.nonce, &h, h.mac);
		memcpy(c->nonce, h.mac, KOLO_HMAC_SIZE); /* what the verdict's MAC covers */
		if (send_all(c->fd, &h, sizeof(h)) != KOLO_OK) {
			vb_conn_fail(c, KOLO_EPEER, "peer closed during the handshake");
			return;
		}
		c->hs_len = 0;
		c->state = VB_CS_CONNECTOR_WAIT_VERDICT;
	}
	if (c->state != VB_CS_CONNECTOR_WAIT_VERDICT)
		return;
	if (hs_read(c, sizeof(struct msg_verdict)) != KOLO_OK) {
		vb_conn_fail(c, KOLO_EPEER, "peer closed during the handshake");
		return;
	}
	if (c->hs_len < sizeof(struct msg_verdict))
		return;
	struct msg_verdict v;
	memcpy(&v, c->hs, sizeof(v));
	if (v.magic != KOLO_TRANSPORT_MAGIC || v.status != 0) {
		kolo_status_t st = v.status ? (kolo_status_t)v.status : KOLO_EPROTO;
		vb_conn_fail(c, st, "peer refused the handshake: %s", kolo_strerror(st));
		return;
	}
	uint8_t mac[KOLO_HMAC_SIZE];
	mac_verdict(t, c->nonce, &v, mac);
	if (!kolo_consttime_equal(mac, v.mac, sizeof(mac))) {
		vb_conn_fail(c, KOLO_EAUTH, "the acceptor does not prove the token");
		return;
	}
	if (!params_match(t, &v.qp)) {
		vb_conn_fail(c, KOLO_EPROTO,
		             "peer has %u slots of %u bytes, this endpoint %d of %u", v.qp.nslots,
		             v.qp.slot_bytes, t->nslots, t->slot_bytes);
		return;
	}
	c->peer = v.qp;
	if (vb_qp_connect(c) != KOLO_OK) {
		vb_conn_fail(c, KOLO_ESYSTEM, "cannot take the QP to RTS");
		return;
	}
	struct msg_ready r = {.magic = KOLO_TRANSPORT_MAGIC};
	if (send_all(c->fd, &r, sizeof(r)) != KOLO_OK) {
		vb_conn_fail(c, KOLO_EPEER, "peer closed during the handshake");
		return;
	}
	c->state = VB_CS_READY;
	c->last_progress_ns = kolo_now_ns();
}

/* ---- the CM socket's address ---- */

static bool addr_of_iface(const char *name, struct sockaddr_storage *ss)
{
	struct ifaddrs *ifs;
	if (getifaddrs(&ifs) != 0)
		return false;
	bool found = false;
	for (int want6 = 0; want6 < 2 && !found; want6++)
		for (struct ifaddrs *i = ifs; i && !found; i = i->ifa_next) {
			if (!i->ifa_addr || !(i->ifa_flags & IFF_UP))
				continue;
			int fam = i->ifa_addr->sa_family;
			if (fam != (want6 ? AF_INET6 : AF_INET))
				continue;
			if (name ? strcmp(i->ifa_name, name) != 0
			         : (i->ifa_flags & IFF_LOOPBACK) != 0)
				continue;
			memset(ss, 0, sizeof(*ss));
			memcpy(ss, i->ifa_addr,
			       fam == AF_INET ? sizeof(struct sockaddr_in)
			                      : sizeof(struct sockaddr_in6));
			found = true;
		}
	freeifaddrs(ifs);
	return found;
}

/* The address the routing table uses towards host (a UDP connect sends
 * nothing). */
static bool addr_towards(const char *host, struct sockaddr_storage *ss)
{
	struct addrinfo hints = {.ai_socktype = SOCK_DGRAM}, *ai = NULL;
	if (getaddrinfo(host, "9", &hints, &ai) != 0 || !ai)
		return false;
	bool ok = false;
	int fd = socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	socklen_t len = sizeof(*ss);
	if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
	    getsockname(fd, (struct sockaddr *)ss, &len) == 0)
		ok = true;
	if (fd >= 0)
		close(fd);
	freeaddrinfo(ai);
	return ok;
}

static void pick_addr(const struct vb_transport *t, struct sockaddr_storage *ss)
{
	memset(ss, 0, sizeof(*ss));
	struct sockaddr_in *s4 = (struct sockaddr_in *)ss;
	struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)ss;
	if (t->iface[0] && inet_pton(AF_INET, t->iface, &s4->sin_addr) == 1) {
		s4->sin_family = AF_INET;
		return;
	}
	if (t->iface[0] && inet_pton(AF_INET6, t->iface, &s6->sin6_addr) == 1) {
		s6->sin6_family = AF_INET6;
		return;
	}
	if (t->iface[0] && addr_of_iface(t->iface, ss))
		return;
	if (t->route_to[0] && addr_towards(t->route_to, ss))
		return;
	if (addr_of_iface(NULL, ss))
		return;
	memset(ss, 0, sizeof(*ss));
	s4->sin_family = AF_INET;
	s4->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
}

kolo_status_t vb_listen(struct kolo_transport *base, struct kolo_transport_handle *out)
{
	struct vb_transport *t = vb_tr(base);
	if (t->listen_fd >= 0)
		return kolo_fail(&base->err, KOLO_EINVAL, "verbs: listen called twice");
	struct sockaddr_storage ss;
	pick_addr(t, &ss);
	socklen_t sl =
	        ss.ss_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
	int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return kolo_fail(&base->err, KOLO_ESYSTEM, "verbs: socket: %s", strerror(errno));
	if (bind(fd, (struct sockaddr *)&ss, sl) != 0 || listen(fd, 128) != 0 ||
	    getsockname(fd, (struct sockaddr *)&ss, &sl) != 0) {
		int e = errno;
		close(fd);
		return kolo_fail(&base->err, KOLO_ESYSTEM, "verbs: CM socket bind/listen: %s",
		                 strerror(e));
	}
	struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &t->listen_fd};
	if (epoll_ctl(t->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
		close(fd);
		return kolo_fail(&base->err, KOLO_ESYSTEM, "verbs: epoll: %s", strerror(errno));
	}
	t->listen_fd = fd;
	struct handle_wire w;
	memset(&w, 0, sizeof(w));
	w.magic = KOLO_TRANSPORT_MAGIC;
	w.kind = KOLO_HANDLE_VERBS;
	w.version = VB_HANDLE_VERSION;
	w.roce = t->roce;
	w.round = t->round;
	w.lid = t->lid;
	memcpy(w.gid, t->gid.raw, 16);
	if (ss.ss_family == AF_INET6) {
		w.family = 6;
		w.cm_port = ((struct sockaddr_in6 *)&ss)->sin6_port;
		memcpy(w.cm_addr, &((struct sockaddr_in6 *)&ss)->sin6_addr, 16);
	} else {
		w.family = 4;
		w.cm_port = ((struct sockaddr_in *)&ss)->sin_port;
		memcpy(w.cm_addr, &((struct sockaddr_in *)&ss)->sin_addr, 4);
	}
	memset(out, 0, sizeof(*out));
	memcpy(out->bytes, &w, sizeof(w));
	return KOLO_OK;
}

kolo_status_t vb_connect(struct kolo_transport *base, const struct kolo_transport_handle *peer,
                         int peer_rank, int tag, struct kolo_conn **out)
{
	struct vb_transport *t = vb_tr(base);
	struct handle_wire w;
	memcpy(&w, peer->bytes, sizeof(w));
	if (w.magic != KOLO_TRANSPORT_MAGIC || w.kind != KOLO_HANDLE_VERBS ||
	    w.version != VB_HANDLE_VERSION || (w.family != 4 && w.family != 6))
		return kolo_fail(&base->err, KOLO_EINVAL, "verbs: not a verbs handle");
	struct sockaddr_storage ss;
	memset(&ss, 0, sizeof(ss));
	socklen_t sl;
	if (w.family == 6) {
		struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
		s6->sin6_family = AF_INET6;
		s6->sin6_port = w.cm_port;
		memcpy(&s6->sin6_addr, w.cm_addr, 16);
		sl = sizeof(*s6);
	} else {
		struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
		s4->sin_family = AF_INET;
		s4->sin_port = w.cm_port;
		memcpy(&s4->sin_addr, w.cm_addr, 4);
		sl = sizeof(*s4);
	}
	int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return kolo_fail(&base->err, KOLO_ESYSTEM, "verbs: socket: %s", strerror(errno));
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	if (connect(fd, (struct sockaddr *)&ss, sl) != 0 && errno != EINPROGRESS) {
		int e = errno;
		close(fd);
		return kolo_fail(&base->err, KOLO_EPEER, "verbs: connect to rank %d: %s", peer_rank,
		                 strerror(e));
	}
	struct vb_conn *c;
	if (vb_conn_add(t, fd, false, peer_rank, tag, &c) != KOLO_OK) {
		close(fd);
		return kolo_fail(&base->err, KOLO_ESYSTEM, "verbs: cannot add conn");
	}
	c->claimed = true;
	*out = &c->base;
	/* A handle of another round names a QP world that is gone: refused at
	 * the conn's first step (a refused handshake fails the requests, not
	 * connect), before any QP of ours is described to it. */
	c->stale_handle = w.round != t->round;
	c->handle_round = w.round;
	if ((bool)w.roce != t->roce) {
		vb_conn_fail(c, KOLO_EPROTO, "peer's port is %s, this one %s",
		             w.roce ? "RoCE" : "InfiniBand", t->roce ? "RoCE" : "InfiniBand");
	}
	return KOLO_OK;
}

kolo_status_t vb_accept(struct kolo_transport *base, int peer_rank, int tag, struct kolo_conn **out)
{
	struct vb_transport *t = vb_tr(base);
	*out = NULL;
	int ab = atomic_load(&t->abort_status);
	if (ab != KOLO_OK)
		return (kolo_status_t)ab;
	vb_progress(t);
	for (struct vb_conn *c = t->conns; c; c = c->next_conn) {
		if (c->acceptor && !c->claimed && c->state == VB_CS_READY &&
		    c->base.peer_rank == peer_rank && c->base.tag == tag) {
			c->claimed = true;
			*out = &c->base;
			return KOLO_OK;
		}
	}
	return KOLO_OK;
}
