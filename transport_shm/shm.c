/* shm: shared-memory transport (see transport_shm.h for the design, and
 * shm_internal.h for how the files divide the work). */
#include "shm_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

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

static kolo_status_t shm_wait(struct kolo_transport *base, int timeout_ms)
{
	struct shm_transport *t = shm_tr(base);
	int ab = atomic_load(&t->abort_status);
	if (ab != KOLO_OK)
		return (kolo_status_t)ab;
	/* Announce that we are about to sleep, then look once more: a peer
	 * that produced after our last look either sees the flag and wakes us
	 * or its bytes are seen here (both sides use seq_cst). */
	for (struct shm_conn *c = t->conns; c; c = c->next_conn) {
		if (c->state != SHM_CS_READY)
			continue;
		atomic_store(&c->rx->consumer_waiting, 1);
		atomic_store(&c->tx->producer_waiting, 1);
	}
	bool progressed = shm_progress(t);
	if (!progressed && timeout_ms > 0) {
		struct epoll_event evs[32];
		int n = epoll_wait(t->epfd, evs, 32, timeout_ms);
		for (int i = 0; i < n; i++) {
			struct shm_conn *c = evs[i].data.ptr;
			if (c && (void *)c != (void *)&t->listen_fd && c->state == SHM_CS_READY)
				shm_conn_drain(c);
		}
	}
	for (struct shm_conn *c = t->conns; c; c = c->next_conn) {
		if (c->state != SHM_CS_READY)
			continue;
		/* wait(0) leaves the wake-ups armed for a caller that then blocks
		 * in poll() on poll_fd() (the hybrid transport): without them, a
		 * peer's bytes would not make the fd readable. The cost is a
		 * wake-up write per message by the peer until our next wait. */
		if (timeout_ms > 0) {
			atomic_store(&c->rx->consumer_waiting, 0);
			atomic_store(&c->tx->producer_waiting, 0);
		}
		shm_conn_drain(c);
	}
	ab = atomic_load(&t->abort_status);
	return (kolo_status_t)ab;
}

static void shm_abort(struct kolo_transport *base, kolo_status_t st)
{
	struct shm_transport *t = shm_tr(base);
	int expected = KOLO_OK;
	atomic_compare_exchange_strong(&t->abort_status, &expected, (int)st);
	uint64_t one = 1;
	ssize_t n = write(t->abort_fd, &one, sizeof(one));
	(void)n;
}

static void shm_destroy(struct kolo_transport *base)
{
	if (!base)
		return;
	struct shm_transport *t = shm_tr(base);
	while (t->conns) {
		struct shm_conn *c = t->conns;
		t->conns = c->next_conn;
		shm_conn_free(c);
	}
	while (t->free_reqs) {
		struct kolo_req *r = t->free_reqs;
		t->free_reqs = r->next;
		free(r);
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
	return shm_tr(base)->epfd;
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
        .peer_cpu = shm_peer_cpu,
};
