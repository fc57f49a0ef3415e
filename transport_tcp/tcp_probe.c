/* The liveness probe of the TCP transport: finds a peer host that vanished
 * (powered off, its link cut, its network gone) within a second, without
 * ever mistaking a live but stalled process for a dead one.
 *
 * Why not the data connections: TCP_USER_TIMEOUT on them would also abort a
 * connection whose receiver is alive but not reading (zero-window probing
 * counts as unacknowledged, kernel ≥ 5.11), which is every rank that reaches
 * a collective late, and keepalive counts in whole seconds and sleeps while
 * data is queued. So each transport keeps one extra, otherwise idle TCP
 * connection to every peer on another host that it connects to, and a thread
 * writes one byte on it every period_ms with TCP_USER_TIMEOUT = timeout_ms.
 * The peer's kernel acknowledges the byte whatever its process does (stopped,
 * descheduled, computing), and the peer's probe thread reads and discards it
 * so the window never closes. No acknowledgement for timeout_ms means that
 * nothing on the path or the host answers: the peer is lost, and every conn
 * to it fails with KOLO_EPEER at the transport's next progress (wait() is
 * woken). A reset, a refusal or an orderly close means that the host answers
 * (the peer's transport is gone: a crash, a new round): not a loss; the data
 * conns see that by themselves. Design and figures: docs/elastic.md. */
#include "tcp_internal.h"
#include "transport_tcp.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <linux/sockios.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <unistd.h>

#define SUBSYS "tcp"

struct rank_set {
	uint8_t *bits;
	int cap; /* bytes */
};

enum target_state { TG_CONNECTING, TG_UP, TG_DONE };

struct probe_target {
	int rank;
	int fd;
	enum target_state state;
	struct sockaddr_storage addr;
	socklen_t addrlen;
	char addr_str[64];
};

struct tcp_probe {
	int period_ms, timeout_ms;
	int listen_fd, wake_fd, notify_fd;
	atomic_bool stop;
	uint16_t port;
	pthread_t thread;
	bool started;
	pthread_mutex_t lock;
	/* Under lock: targets added by watch() and not taken by the thread yet,
	 * and two bitmaps of ranks: watched, and found lost. */
	struct probe_target *added;
	int n_added, cap_added;
	struct rank_set watched, lost;
	atomic_int n_lost; /* lost ranks not taken by take_lost() yet */
	int *unacked_ms;   /* by rank: how long the probe has waited for an ACK */
	int cap_unacked;
	/* The thread's own: targets being probed, accepted probes being drained. */
	struct probe_target *targets;
	int n_targets, cap_targets;
	int *drain;
	int n_drain, cap_drain;
};

static bool grow(void **arr, int *cap, int want, size_t elem)
{
	if (want <= *cap)
		return true;
	int ncap = *cap ? *cap * 2 : 8;
	while (ncap < want)
		ncap *= 2;
	void *p = realloc(*arr, (size_t)ncap * elem);
	if (!p)
		return false;
	*arr = p;
	*cap = ncap;
	return true;
}

/* Sets rank; false when out of memory. */
static bool set_add(struct rank_set *s, int rank)
{
	int need = rank / 8 + 1;
	if (need > s->cap) {
		int ncap = KOLO_MAX(need, s->cap * 2);
		uint8_t *b = realloc(s->bits, (size_t)ncap);
		if (!b)
			return false;
		memset(b + s->cap, 0, (size_t)(ncap - s->cap));
		s->bits = b;
		s->cap = ncap;
	}
	s->bits[rank / 8] |= (uint8_t)(1u << (rank % 8));
	return true;
}

static bool set_has(const struct rank_set *s, int rank)
{
	return rank / 8 < s->cap && ((s->bits[rank / 8] >> (rank % 8)) & 1u);
}

static void mark_lost(struct tcp_probe *p, struct probe_target *tg, int err)
{
	KOLO_WARN(SUBSYS,
	          "rank %d's host at %s stopped answering: no TCP acknowledgement within %d ms "
	          "(%s)",
	          tg->rank, tg->addr_str, p->timeout_ms, strerror(err));
	pthread_mutex_lock(&p->lock);
	if (set_add(&p->lost, tg->rank))
		atomic_fetch_add(&p->n_lost, 1);
	pthread_mutex_unlock(&p->lock);
	uint64_t one = 1;
	ssize_t n = write(p->notify_fd, &one, sizeof(one));
	(void)n; /* a full counter already wakes the transport */
}

static void target_done(struct probe_target *tg)
{
	if (tg->fd >= 0)
		close(tg->fd);
	tg->fd = -1;
	tg->state = TG_DONE;
}

static int sock_error(int fd)
{
	int err = 0;
	socklen_t len = sizeof(err);
	if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
		err = errno;
	return err;
}

/* An error on a probe: silence is a loss, anything the host said is not. */
static void target_error(struct tcp_probe *p, struct probe_target *tg, int err)
{
	if (err == ETIMEDOUT || err == EHOSTUNREACH || err == ENETUNREACH || err == EHOSTDOWN)
		mark_lost(p, tg, err);
	else
		KOLO_DEBUG(SUBSYS, "probe of rank %d at %s ended: %s", tg->rank, tg->addr_str,
		           strerror(err));
	target_done(tg);
}

static void target_connect(struct tcp_probe *p, struct probe_target *tg)
{
	tg->fd = socket(tg->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (tg->fd < 0) {
		KOLO_WARN(SUBSYS, "probe socket: %s", strerror(errno));
		tg->state = TG_DONE;
		return;
	}
	int one = 1;
	unsigned int uto = (unsigned int)p->timeout_ms;
	setsockopt(tg->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	/* Bounds the SYN retries as well as the data's acknowledgement. */
	setsockopt(tg->fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &uto, sizeof(uto));
	tg->state = TG_CONNECTING;
	if (connect(tg->fd, (struct sockaddr *)&tg->addr, tg->addrlen) == 0)
		tg->state = TG_UP;
	else if (errno != EINPROGRESS && errno != EINTR)
		target_error(p, tg, errno);
}

/* Takes the targets watch() added. */
static void take_added(struct tcp_probe *p)
{
	pthread_mutex_lock(&p->lock);
	int n = p->n_added;
	if (n &&
	    grow((void **)&p->targets, &p->cap_targets, p->n_targets + n, sizeof(*p->targets))) {
		for (int i = 0; i < n; i++) {
			struct probe_target *tg = &p->targets[p->n_targets++];
			*tg = p->added[i];
			target_connect(p, tg);
		}
		p->n_added = 0;
	}
	pthread_mutex_unlock(&p->lock);
}

static void accept_probes(struct tcp_probe *p)
{
	for (;;) {
		int fd = accept4(p->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0)
			return;
		if (!grow((void **)&p->drain, &p->cap_drain, p->n_drain + 1, sizeof(int))) {
			close(fd);
			return;
		}
		p->drain[p->n_drain++] = fd;
	}
}

/* Reads and drops what a peer's probe wrote; false when the probe ended. */
static bool drain_probe(int fd)
{
	uint8_t buf[256];
	for (;;) {
		ssize_t n = read(fd, buf, sizeof(buf));
		if (n > 0)
			continue;
		if (n < 0 && errno == EINTR)
			continue;
		return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
	}
}

/* Before each beat: how long the target's bytes have waited for an ACK (0
 * when none waits: a live path acknowledged the last beat's long ago). The
 * send queue counts bytes sent and not acknowledged, and bytes the kernel
 * could not send at all (a route that drops them). */
static void note_unacked(struct tcp_probe *p, const struct probe_target *tg)
{
	struct tcp_info ti;
	socklen_t len = sizeof(ti);
	int ms = 0, queued = 0;
	if (ioctl(tg->fd, SIOCOUTQ, &queued) == 0 && queued > 0 &&
	    getsockopt(tg->fd, IPPROTO_TCP, TCP_INFO, &ti, &len) == 0)
		ms = (int)ti.tcpi_last_ack_recv;
	pthread_mutex_lock(&p->lock);
	int old = p->cap_unacked;
	if (grow((void **)&p->unacked_ms, &p->cap_unacked, tg->rank + 1, sizeof(int))) {
		for (int r = old; r < p->cap_unacked; r++)
			p->unacked_ms[r] = -1;
		p->unacked_ms[tg->rank] = ms;
	}
	pthread_mutex_unlock(&p->lock);
}

static void beat(struct tcp_probe *p)
{
	static const uint8_t byte = 0;
	for (int i = 0; i < p->n_targets; i++) {
		struct probe_target *tg = &p->targets[i];
		if (tg->state != TG_UP)
			continue;
		note_unacked(p, tg);
		/* EAGAIN: bytes are queued unacknowledged already, and
		 * TCP_USER_TIMEOUT runs on them. */
		if (send(tg->fd, &byte, 1, MSG_NOSIGNAL | MSG_DONTWAIT) < 0 && errno != EAGAIN &&
		    errno != EWOULDBLOCK && errno != EINTR)
			target_error(p, tg, errno);
	}
}

static void on_target_event(struct tcp_probe *p, struct probe_target *tg, short rev)
{
	if (rev & POLLERR) {
		target_error(p, tg, sock_error(tg->fd));
		return;
	}
	if (tg->state == TG_CONNECTING && (rev & (POLLOUT | POLLHUP))) {
		int err = sock_error(tg->fd);
		if (err)
			target_error(p, tg, err);
		else
			tg->state = TG_UP;
		return;
	}
	if (rev & (POLLIN | POLLHUP)) {
		/* The peer never writes: this is its close (a new round, a
		 * crash the kernel reported) or a reset. */
		uint8_t b;
		ssize_t n = recv(tg->fd, &b, 1, MSG_DONTWAIT);
		if (n == 0)
			target_done(tg);
		else if (n < 0 && errno != EAGAIN && errno != EINTR)
			target_error(p, tg, errno);
	}
}

static void *probe_main(void *arg)
{
	struct tcp_probe *p = arg;
	struct pollfd *pfd = NULL;
	int cap_pfd = 0;
	uint64_t next_beat = kolo_now_ms();
	for (;;) {
		take_added(p);
		/* Forget finished targets and drains, keeping the order. */
		int k = 0;
		for (int i = 0; i < p->n_targets; i++)
			if (p->targets[i].state != TG_DONE)
				p->targets[k++] = p->targets[i];
		p->n_targets = k;
		int want = 2 + p->n_targets + p->n_drain;
		if (!grow((void **)&pfd, &cap_pfd, want, sizeof(*pfd))) {
			KOLO_ERROR(SUBSYS, "the liveness probe is out of memory; it stops");
			break;
		}
		pfd[0] = (struct pollfd){.fd = p->wake_fd, .events = POLLIN};
		pfd[1] = (struct pollfd){.fd = p->listen_fd, .events = POLLIN};
		for (int i = 0; i < p->n_targets; i++) {
			struct probe_target *tg = &p->targets[i];
			pfd[2 + i] = (struct pollfd){
			        .fd = tg->fd,
			        .events = (short)(tg->state == TG_CONNECTING ? POLLOUT : POLLIN)};
		}
		for (int i = 0; i < p->n_drain; i++)
			pfd[2 + p->n_targets + i] =
			        (struct pollfd){.fd = p->drain[i], .events = POLLIN};
		uint64_t now = kolo_now_ms();
		int to = next_beat > now ? (int)(next_beat - now) : 0;
		int n = poll(pfd, (nfds_t)want, to);
		if (n < 0 && errno != EINTR) {
			KOLO_ERROR(SUBSYS, "liveness probe: poll: %s; it stops", strerror(errno));
			break;
		}
		if (atomic_load(&p->stop))
			break;
		if (pfd[0].revents) {
			uint64_t v;
			ssize_t r = read(p->wake_fd, &v, sizeof(v));
			(void)r;
		}
		/* The drains accept_probes() adds have no slot in pfd yet. */
		int nd_polled = p->n_drain;
		if (pfd[1].revents & POLLIN)
			accept_probes(p);
		int nt = p->n_targets;
		for (int i = 0; i < nt; i++)
			if (pfd[2 + i].revents)
				on_target_event(p, &p->targets[i], pfd[2 + i].revents);
		int kd = 0, nd = p->n_drain;
		for (int i = 0; i < nd; i++) {
			int fd = p->drain[i];
			if (i >= nd_polled || !pfd[2 + nt + i].revents || drain_probe(fd))
				p->drain[kd++] = fd;
			else
				close(fd);
		}
		p->n_drain = kd;
		if (kolo_now_ms() >= next_beat) {
			beat(p);
			next_beat = kolo_now_ms() + (uint64_t)p->period_ms;
		}
	}
	free(pfd);
	return NULL;
}

kolo_status_t tcp_probe_start(const struct tcp_probe_config *cfg, struct tcp_probe **out,
                              struct kolo_errbuf *eb)
{
	*out = NULL;
	struct tcp_probe *p = calloc(1, sizeof(*p));
	if (!p)
		return kolo_fail(eb, KOLO_ENOMEM, "out of memory");
	p->period_ms = KOLO_MAX(cfg->period_ms, 1);
	p->timeout_ms = KOLO_MAX(cfg->timeout_ms, 1);
	p->notify_fd = cfg->notify_fd;
	p->listen_fd = -1;
	atomic_init(&p->n_lost, 0);
	pthread_mutex_init(&p->lock, NULL);
	atomic_init(&p->stop, false);
	p->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	kolo_status_t st = KOLO_OK;
	if (p->wake_fd < 0) {
		st = kolo_fail(eb, KOLO_ESYSTEM, "eventfd: %s", strerror(errno));
		goto fail;
	}
	p->listen_fd = socket(cfg->addr->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	struct sockaddr_storage ss = *cfg->addr;
	socklen_t len = cfg->addrlen;
	if (ss.ss_family == AF_INET6)
		((struct sockaddr_in6 *)&ss)->sin6_port = 0;
	else
		((struct sockaddr_in *)&ss)->sin_port = 0;
	if (p->listen_fd < 0 || bind(p->listen_fd, (struct sockaddr *)&ss, len) != 0 ||
	    listen(p->listen_fd, SOMAXCONN) != 0) {
		st = kolo_fail(eb, KOLO_ESYSTEM, "liveness probe: cannot listen: %s",
		               strerror(errno));
		goto fail;
	}
	len = sizeof(ss);
	getsockname(p->listen_fd, (struct sockaddr *)&ss, &len);
	p->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
	                                         : ((struct sockaddr_in *)&ss)->sin_port);
	if (pthread_create(&p->thread, NULL, probe_main, p) != 0) {
		st = kolo_fail(eb, KOLO_ESYSTEM, "liveness probe: cannot start its thread");
		goto fail;
	}
	p->started = true;
	*out = p;
	return KOLO_OK;
fail:
	tcp_probe_stop(p);
	return st;
}

uint16_t tcp_probe_port(const struct tcp_probe *p)
{
	return p ? p->port : 0;
}

void tcp_probe_watch(struct tcp_probe *p, int rank, const struct sockaddr_storage *addr,
                     socklen_t addrlen, uint16_t port)
{
	if (!p || rank < 0 || port == 0)
		return;
	pthread_mutex_lock(&p->lock);
	if (set_has(&p->watched, rank) ||
	    !grow((void **)&p->added, &p->cap_added, p->n_added + 1, sizeof(*p->added)) ||
	    !set_add(&p->watched, rank))
		goto out;
	struct probe_target *tg = &p->added[p->n_added++];
	memset(tg, 0, sizeof(*tg));
	tg->rank = rank;
	tg->fd = -1;
	tg->addr = *addr;
	tg->addrlen = addrlen;
	if (addr->ss_family == AF_INET6)
		((struct sockaddr_in6 *)&tg->addr)->sin6_port = htons(port);
	else
		((struct sockaddr_in *)&tg->addr)->sin_port = htons(port);
	tcp_addr_str(&tg->addr, tg->addr_str, sizeof(tg->addr_str));
out:
	pthread_mutex_unlock(&p->lock);
	uint64_t one = 1;
	ssize_t n = write(p->wake_fd, &one, sizeof(one));
	(void)n; /* a full counter wakes the thread already */
}

bool tcp_probe_pending(const struct tcp_probe *p)
{
	return p && atomic_load_explicit(&((struct tcp_probe *)p)->n_lost, memory_order_acquire);
}

bool tcp_probe_lost(struct tcp_probe *p, int rank)
{
	if (!p || rank < 0)
		return false;
	pthread_mutex_lock(&p->lock);
	bool lost = set_has(&p->lost, rank);
	pthread_mutex_unlock(&p->lock);
	return lost;
}

int tcp_probe_unacked_ms(struct tcp_probe *p, int rank)
{
	if (!p || rank < 0)
		return -1;
	pthread_mutex_lock(&p->lock);
	int ms = rank < p->cap_unacked ? p->unacked_ms[rank] : -1;
	pthread_mutex_unlock(&p->lock);
	return ms;
}

void tcp_probe_ack(struct tcp_probe *p)
{
	if (p)
		atomic_store(&p->n_lost, 0);
}

void tcp_probe_stop(struct tcp_probe *p)
{
	if (!p)
		return;
	if (p->started) {
		uint64_t one = 1;
		atomic_store(&p->stop, true);
		ssize_t n = write(p->wake_fd, &one, sizeof(one));
		(void)n;
		pthread_join(p->thread, NULL);
	}
	for (int i = 0; i < p->n_targets; i++)
		if (p->targets[i].fd >= 0)
			close(p->targets[i].fd);
	for (int i = 0; i < p->n_drain; i++)
		close(p->drain[i]);
	if (p->listen_fd >= 0)
		close(p->listen_fd);
	if (p->wake_fd >= 0)
		close(p->wake_fd);
	pthread_mutex_destroy(&p->lock);
	free(p->added);
	free(p->watched.bits);
	free(p->lost.bits);
	free(p->unacked_ms);
	free(p->targets);
	free(p->drain);
	free(p);
}

bool kolo_tcp_host_answers(const struct kolo_transport_handle *h, int timeout_ms)
{
	struct sockaddr_storage ss;
	socklen_t len;
	if (kolo_tcp_handle_decode(h, &ss, &len) != KOLO_OK)
		return false;
	uint16_t port = tcp_handle_probe_port(h);
	if (port && ss.ss_family == AF_INET6)
		((struct sockaddr_in6 *)&ss)->sin6_port = htons(port);
	else if (port)
		((struct sockaddr_in *)&ss)->sin_port = htons(port);
	int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return false;
	unsigned int uto = (unsigned int)KOLO_MAX(timeout_ms, 1);
	setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &uto, sizeof(uto));
	int err = 0;
	if (connect(fd, (struct sockaddr *)&ss, len) != 0) {
		err = errno;
		if (err == EINPROGRESS || err == EINTR) {
			struct pollfd pfd = {.fd = fd, .events = POLLOUT};
			err = poll(&pfd, 1, KOLO_MAX(timeout_ms, 0)) == 1 ? sock_error(fd)
			                                                  : ETIMEDOUT;
		}
	}
	close(fd);
	/* Accepted, or refused by the host's kernel: it answers. */
	return err == 0 || err == ECONNREFUSED || err == ECONNRESET;
}
