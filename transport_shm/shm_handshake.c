/* shm_handshake: listen, connect and accept; the handshake over the unix
 * socket that proves the job token and hands the memfd to the connector. */
#include "shm_internal.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define SUBSYS "shm"

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

struct msg_verdict {
	uint32_t magic;
	uint32_t status; /* kolo_status_t; 0 = accepted */
	uint64_t ring_bytes;
};

static socklen_t abstract_addr(struct sockaddr_un *sa, const char *name)
{
	memset(sa, 0, sizeof(*sa));
	sa->sun_family = AF_UNIX;
	size_t n = strlen(name);
	memcpy(sa->sun_path + 1, name, n);
	return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
}

static void compute_mac(const struct shm_transport *t, const uint8_t nonce[32],
                        const struct shm_msg_hello *h, uint8_t out[KOLO_HMAC_SIZE])
{
	struct {
		uint8_t nonce[32];
		char job[SHM_JOB_MAX];
		int64_t round;
		int32_t src, dst, tag;
	} m;
	memset(&m, 0, sizeof(m));
	memcpy(m.nonce, nonce, 32);
	memcpy(m.job, h->job, SHM_JOB_MAX);
	m.round = h->round;
	m.src = h->src_rank;
	m.dst = h->dst_rank;
	m.tag = h->tag;
	kolo_hmac_sha256(t->token, t->token_len, &m, sizeof(m), out);
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
	c->state = SHM_CS_FAILED;
	c->failed = why;
}

void shm_acceptor_step(struct shm_conn *c)
{
	struct shm_transport *t = c->t;
	if (hs_read(c, sizeof(struct shm_msg_hello), NULL) != KOLO_OK) {
		c->state = SHM_CS_FAILED;
		c->failed = KOLO_EPEER;
		return;
	}
	if (c->hs_len >= 4 && memcmp(c->hs, &(uint32_t){KOLO_TRANSPORT_MAGIC}, 4) != 0) {
		refuse(c, KOLO_EPROTO, "bad magic (not a kolo peer)");
		return;
	}
	if (c->hs_len < sizeof(struct shm_msg_hello))
		return;
	struct shm_msg_hello h;
	memcpy(&h, c->hs, sizeof(h));
	h.job[SHM_JOB_MAX - 1] = '\0';
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
		        memfd < 0 ? KOLO_ESYSTEM : shm_ring_map(c, memfd, t->ring_bytes, true);
		if (st == KOLO_OK) {
			struct msg_verdict v = {.magic = KOLO_TRANSPORT_MAGIC,
			                        .status = 0,
			                        .ring_bytes = t->ring_bytes};
			st = send_all(c->fd, &v, sizeof(v), memfd);
		}
		if (memfd >= 0)
			close(memfd);
		if (st != KOLO_OK) {
			c->state = SHM_CS_FAILED;
			c->failed = st;
			return;
		}
		c->state = SHM_CS_READY;
		c->last_progress_ns = kolo_now_ns();
	}
}

void shm_connector_step(struct shm_conn *c)
{
	struct shm_transport *t = c->t;
	if (c->state == SHM_CS_CONNECTOR_WAIT_NONCE) {
		if (hs_read(c, sizeof(struct msg_nonce), NULL) != KOLO_OK) {
			shm_conn_fail(c, KOLO_EPEER, "peer closed during the handshake");
			return;
		}
		if (c->hs_len < sizeof(struct msg_nonce))
			return;
		struct msg_nonce n;
		memcpy(&n, c->hs, sizeof(n));
		if (n.magic != KOLO_TRANSPORT_MAGIC) {
			shm_conn_fail(c, KOLO_EPROTO, "peer is not a kolo endpoint");
			return;
		}
		struct shm_msg_hello h;
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
			shm_conn_fail(c, KOLO_EPEER, "peer closed during the handshake");
			return;
		}
		c->hs_len = 0;
		c->state = SHM_CS_CONNECTOR_WAIT_VERDICT;
	}
	if (c->state == SHM_CS_CONNECTOR_WAIT_VERDICT) {
		int memfd = -1;
		kolo_status_t st = hs_read(c, sizeof(struct msg_verdict), &memfd);
		if (st != KOLO_OK) {
			if (memfd >= 0)
				close(memfd);
			shm_conn_fail(c, KOLO_EPEER, "peer closed during the handshake");
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
			shm_conn_fail(c, v.status ? (kolo_status_t)v.status : KOLO_EPROTO,
			              "peer refused the handshake: %s",
			              kolo_strerror((kolo_status_t)v.status));
			return;
		}
		st = shm_ring_map(c, memfd, (size_t)v.ring_bytes, false);
		close(memfd);
		if (st != KOLO_OK) {
			shm_conn_fail(c, st, "cannot map the shared segment");
			return;
		}
		c->state = SHM_CS_READY;
		c->last_progress_ns = kolo_now_ns();
	}
}

void shm_accept_new(struct shm_transport *t)
{
	for (;;) {
		int fd = accept4(t->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0)
			return;
		struct shm_conn *c;
		if (shm_conn_add(t, fd, true, -1, -1, &c) != KOLO_OK) {
			close(fd);
			continue;
		}
		struct msg_nonce n = {.magic = KOLO_TRANSPORT_MAGIC, .version = KOLO_WIRE_VERSION};
		if (kolo_random_bytes(n.nonce, sizeof(n.nonce)) != KOLO_OK ||
		    send_all(fd, &n, sizeof(n), -1) != KOLO_OK) {
			c->state = SHM_CS_FAILED;
			c->failed = KOLO_EPEER;
			continue;
		}
		memcpy(c->nonce, n.nonce, sizeof(n.nonce));
	}
}

kolo_status_t shm_listen(struct kolo_transport *base, struct kolo_transport_handle *out)
{
	struct shm_transport *t = shm_tr(base);
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

kolo_status_t shm_connect(struct kolo_transport *base, const struct kolo_transport_handle *peer,
                          int peer_rank, int tag, struct kolo_conn **out)
{
	struct shm_transport *t = shm_tr(base);
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
	if (shm_conn_add(t, fd, false, peer_rank, tag, &c) != KOLO_OK) {
		close(fd);
		return kolo_fail(&base->err, KOLO_ESYSTEM, "shm: cannot add conn");
	}
	c->claimed = true;
	*out = &c->base;
	return KOLO_OK;
}

kolo_status_t shm_accept(struct kolo_transport *base, int peer_rank, int tag,
                         struct kolo_conn **out)
{
	struct shm_transport *t = shm_tr(base);
	*out = NULL;
	int ab = atomic_load(&t->abort_status);
	if (ab != KOLO_OK)
		return (kolo_status_t)ab;
	shm_progress(t);
	for (struct shm_conn *c = t->conns; c; c = c->next_conn) {
		if (c->acceptor && !c->claimed && c->state == SHM_CS_READY &&
		    c->base.peer_rank == peer_rank && c->base.tag == tag) {
			c->claimed = true;
			*out = &c->base;
			return KOLO_OK;
		}
	}
	return KOLO_OK;
}
