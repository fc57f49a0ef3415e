/* verbs: the verbs transport's endpoint (see transport_verbs.h for the
 * design, verbs_internal.h for how the files divide the work). */
#include "verbs_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

static void vb_destroy(struct kolo_transport *base);

static int64_t param_default(enum kolo_param_id id)
{
	return strtoll(kolo_param_info(id)->def, NULL, 10);
}

static kolo_status_t vb_create(const struct kolo_transport_config *cfg, struct kolo_transport **out,
                               struct kolo_errbuf *eb)
{
	*out = NULL;
	const struct verbs_api *api = verbs_api_get(eb);
	if (!api)
		return KOLO_EUNSUPPORTED;
	struct vb_transport *t = calloc(1, sizeof(*t));
	if (!t)
		return kolo_fail(eb, KOLO_ENOMEM, "verbs: out of memory");
	t->base.ops = &kolo_transport_verbs_ops;
	t->api = api;
	t->listen_fd = t->epfd = t->abort_fd = -1;
	if (kolo_strfmt(t->job, sizeof(t->job), "%s", cfg->job ? cfg->job : "") != KOLO_OK) {
		free(t);
		return kolo_fail(eb, KOLO_EINVAL, "verbs: job id longer than %zu bytes",
		                 sizeof(t->job) - 1);
	}
	t->round = cfg->round;
	t->rank = cfg->rank;
	t->timeout_ms = cfg->timeout_ms;
	snprintf(t->iface, sizeof(t->iface), "%s", cfg->iface ? cfg->iface : "");
	snprintf(t->route_to, sizeof(t->route_to), "%s", cfg->route_to ? cfg->route_to : "");
	int64_t ns = cfg->verbs_slots > 0 ? cfg->verbs_slots : param_default(KOLO_P_VERBS_SLOTS);
	int64_t sb = cfg->verbs_slot_bytes > 0 ? (int64_t)cfg->verbs_slot_bytes
	                                       : param_default(KOLO_P_VERBS_SLOT_BYTES);
	int64_t rdv = cfg->verbs_rdv_bytes > 0 ? (int64_t)cfg->verbs_rdv_bytes
	                                       : param_default(KOLO_P_VERBS_RDV_BYTES);
	t->nslots = (int)KOLO_MIN(KOLO_MAX(ns, 2), VB_MAX_SLOTS);
	t->slot_bytes = (uint32_t)KOLO_MIN(KOLO_MAX(sb, 64), (int64_t)VB_MAX_SEG - 1) & ~7u;
	t->rdv_bytes = (size_t)KOLO_MAX(rdv, 1);
	t->mr_cap = cfg->verbs_mr_cache >= 0 ? cfg->verbs_mr_cache : 0;
	t->token_len = cfg->token_len;
	t->token = malloc(cfg->token_len + 1);
	if (!t->token) {
		free(t);
		return kolo_fail(eb, KOLO_ENOMEM, "verbs: out of memory");
	}
	if (cfg->token_len)
		memcpy(t->token, cfg->token, cfg->token_len);
	kolo_status_t st = vb_dev_open(t, cfg, eb);
	if (st != KOLO_OK) {
		vb_destroy(&t->base);
		return st;
	}
	/* A ring holds a few conns; each registers two slot rings. */
	vb_memlock_check(t, 8 * (size_t)t->nslots * t->slot_bytes + (64u << 20));
	t->epfd = epoll_create1(EPOLL_CLOEXEC);
	t->abort_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	int fl = fcntl(t->ch->fd, F_GETFL);
	struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
	struct epoll_event evc = {.events = EPOLLIN, .data.ptr = &t->ch};
	if (t->epfd < 0 || t->abort_fd < 0 || fl < 0 ||
	    fcntl(t->ch->fd, F_SETFL, fl | O_NONBLOCK) != 0 ||
	    epoll_ctl(t->epfd, EPOLL_CTL_ADD, t->abort_fd, &ev) != 0 ||
	    epoll_ctl(t->epfd, EPOLL_CTL_ADD, t->ch->fd, &evc) != 0) {
		int e = errno;
		vb_destroy(&t->base);
		return kolo_fail(eb, KOLO_ESYSTEM, "verbs: cannot create the endpoint: %s",
		                 strerror(e));
	}
	KOLO_DEBUG(VB_SUBSYS, "rank %d: %s port %u (%s) through %s, %d slots of %u bytes", t->rank,
	           t->dev_name, t->port, t->roce ? "RoCE" : "InfiniBand", api->name, t->nslots,
	           t->slot_bytes);
	*out = &t->base;
	return KOLO_OK;
}

/* Takes the completion channel's events, re-arms the CQ. */
static void cq_events(struct vb_transport *t)
{
	struct ibv_cq *cq;
	void *ctx;
	while (t->api->get_cq_event(t->ch, &cq, &ctx) == 0)
		t->cq_events++;
	/* Acknowledging takes a lock in libibverbs: in batches. */
	if (t->cq_events >= 64) {
		t->api->ack_cq_events(t->cq, t->cq_events);
		t->cq_events = 0;
	}
}

static kolo_status_t vb_wait(struct kolo_transport *base, int timeout_ms)
{
	struct vb_transport *t = vb_tr(base);
	int ab = atomic_load(&t->abort_status);
	if (ab != KOLO_OK)
		return (kolo_status_t)ab;
	bool progressed = vb_progress(t);
	if (!progressed && timeout_ms > 0) {
		/* Arm, then look once more: a completion between the last poll
		 * and the arming would otherwise sleep until the timeout. */
		t->api->req_notify_cq(t->cq, 0);
		progressed = vb_progress(t);
	}
	if (!progressed && timeout_ms > 0) {
		int cap = t->api->block_cap_ms ? t->api->block_cap_ms() : 0;
		int ms = cap > 0 ? KOLO_MIN(timeout_ms, cap) : timeout_ms;
		struct epoll_event evs[32];
		int n = epoll_wait(t->epfd, evs, 32, ms);
		for (int i = 0; i < n; i++) {
			void *p = evs[i].data.ptr;
			if (p == &t->ch)
				cq_events(t);
			else if (p && p != (void *)&t->listen_fd) {
				struct vb_conn *c = p;
				if (c->state == VB_CS_READY)
					vb_conn_drain(c);
			}
		}
		vb_progress(t);
	}
	ab = atomic_load(&t->abort_status);
	return (kolo_status_t)ab;
}

static void vb_abort(struct kolo_transport *base, kolo_status_t st)
{
	struct vb_transport *t = vb_tr(base);
	int expected = KOLO_OK;
	atomic_compare_exchange_strong(&t->abort_status, &expected, (int)st);
	uint64_t one = 1;
	ssize_t n = write(t->abort_fd, &one, sizeof(one));
	(void)n;
}

static void vb_destroy(struct kolo_transport *base)
{
	if (!base)
		return;
	struct vb_transport *t = vb_tr(base);
	while (t->conns) {
		struct vb_conn *c = t->conns;
		t->conns = c->next_conn;
		vb_conn_free(c);
	}
	if (t->listen_fd >= 0)
		close(t->listen_fd);
	if (t->epfd >= 0)
		close(t->epfd);
	if (t->abort_fd >= 0)
		close(t->abort_fd);
	vb_dev_close(t);
	free(t->token);
	free(t);
}

static int vb_poll_fd(struct kolo_transport *base)
{
	struct vb_transport *t = vb_tr(base);
	/* The emulation cannot make the fd readable for another process's
	 * write: no fd, so that the hybrid slices its waits instead. */
	if (t->api->block_cap_ms)
		return -1;
	t->api->req_notify_cq(t->cq, 0);
	return t->epfd;
}

const struct kolo_transport_ops kolo_transport_verbs_ops = {
        .name = "verbs",
        .create = vb_create,
        .listen = vb_listen,
        .connect = vb_connect,
        .accept = vb_accept,
        .isend = vb_isend,
        .irecv = vb_irecv,
        .test = vb_test,
        .wait = vb_wait,
        .abort = vb_abort,
        .close = vb_close,
        .destroy = vb_destroy,
        .poll_fd = vb_poll_fd,
};

/* ---- availability ---- */

bool kolo_verbs_available(const char *ib_device, const char *iface, struct kolo_errbuf *eb)
{
	const struct verbs_api *api = verbs_api_get(eb);
	if (!api)
		return false;
	struct vb_transport t;
	memset(&t, 0, sizeof(t));
	t.api = api;
	struct kolo_transport_config cfg = {
	        .ib_device = ib_device, .iface = iface, .ib_gid_index = -1};
	kolo_status_t st = vb_dev_open(&t, &cfg, eb);
	vb_dev_close(&t);
	return st == KOLO_OK;
}

void kolo_verbs_query(struct kolo_verbs_info *out)
{
	memset(out, 0, sizeof(*out));
	struct kolo_errbuf eb = {{0}};
	const struct verbs_api *api = verbs_api_get(&eb);
	if (!api) {
		snprintf(out->why, sizeof(out->why), "%s", eb.msg);
		return;
	}
	out->loaded = true;
	out->emulated = api->emulated;
	int n = 0;
	struct ibv_device **list = api->get_device_list(&n);
	if (!list || n == 0) {
		snprintf(out->why, sizeof(out->why), "libibverbs found no device");
		if (list)
			api->free_device_list(list);
		return;
	}
	for (int i = 0; i < n && out->ndevs < (int)KOLO_ARRAY_SIZE(out->devs); i++) {
		struct kolo_verbs_dev_info *d = &out->devs[out->ndevs++];
		snprintf(d->name, sizeof(d->name), "%s", api->get_device_name(list[i]));
		struct ibv_context *ctx = api->open_device(list[i]);
		if (!ctx)
			continue;
		struct ibv_device_attr da;
		d->nports = api->query_device(ctx, &da) == 0 ? da.phys_port_cnt : 0;
		for (int p = 1; p <= d->nports && p <= (int)KOLO_ARRAY_SIZE(d->ports); p++) {
			struct ibv_port_attr pa;
			struct kolo_verbs_port_info *pi = &d->ports[p - 1];
			pi->port = p;
			if (api->query_port(ctx, (uint8_t)p, &pa) != 0)
				continue;
			pi->active = pa.state == IBV_PORT_ACTIVE;
			pi->roce = pa.link_layer == IBV_LINK_LAYER_ETHERNET;
			pi->lid = pa.lid;
		}
		api->close_device(ctx);
	}
	api->free_device_list(list);
}
