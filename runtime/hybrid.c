/* hybrid: see hybrid.h. Conns and requests are thin wrappers around the
 * sub-transport's, so that the ring can call test() on the hybrid. */
#include "hybrid.h"
#include "transport_shm.h"
#include "transport_tcp.h"

#include <poll.h>
#include <stdlib.h>
#include <string.h>

#define SUBSYS     "hybrid"
#define SUB_HANDLE 60 /* bytes of each sub-handle kept in the hybrid handle */

struct hybrid_handle {
	uint32_t magic;
	uint8_t kind; /* KOLO_HANDLE_HYBRID */
	uint8_t has_local;
	uint8_t pad[2];
	uint8_t net[SUB_HANDLE];
	uint8_t local[SUB_HANDLE];
};
_Static_assert(sizeof(struct hybrid_handle) <= KOLO_TRANSPORT_HANDLE_SIZE, "handle fits");

struct hybrid {
	struct kolo_transport base;
	struct kolo_transport *net, *local;
	bool *same_host;
	int size;
	bool any_remote; /* some peer is reached through net */
	struct kolo_req *free_reqs, *all_reqs;
};

struct hybrid_conn {
	struct kolo_conn base;
	struct kolo_conn *sub;
};

/* Requests are recycled through the endpoint's free list (one thread drives
 * an endpoint); every one ever made is on `all` so destroy frees them. */
struct kolo_req {
	struct kolo_transport *sub_t;
	struct kolo_req *sub;
	struct kolo_req *next_free, *next_all;
	struct hybrid *h;
};

static struct hybrid *hy(struct kolo_transport *t)
{
	return kolo_container_of(t, struct hybrid, base);
}

static bool is_local(const struct hybrid *h, int peer)
{
	return h->local && peer >= 0 && peer < h->size && h->same_host[peer];
}

static void hybrid_destroy(struct kolo_transport *t)
{
	if (!t)
		return;
	struct hybrid *h = hy(t);
	if (h->local)
		h->local->ops->destroy(h->local);
	if (h->net)
		h->net->ops->destroy(h->net);
	while (h->all_reqs) {
		struct kolo_req *r = h->all_reqs;
		h->all_reqs = r->next_all;
		free(r);
	}
	free(h->same_host);
	free(h);
}

static kolo_status_t hybrid_listen(struct kolo_transport *t, struct kolo_transport_handle *out)
{
	struct hybrid *h = hy(t);
	struct hybrid_handle w;
	struct kolo_transport_handle sub;
	memset(&w, 0, sizeof(w));
	w.magic = KOLO_TRANSPORT_MAGIC;
	w.kind = KOLO_HANDLE_HYBRID;
	kolo_status_t st = h->net->ops->listen(h->net, &sub);
	if (st != KOLO_OK)
		return kolo_fail(&t->err, st, "%s", h->net->err.msg);
	for (size_t i = SUB_HANDLE; i < sizeof(sub.bytes); i++) {
		if (sub.bytes[i])
			return kolo_fail(&t->err, KOLO_EPROTO, "%s handle longer than %d bytes",
			                 h->net->ops->name, SUB_HANDLE);
	}
	memcpy(w.net, sub.bytes, SUB_HANDLE);
	if (h->local) {
		st = h->local->ops->listen(h->local, &sub);
		if (st != KOLO_OK)
			return kolo_fail(&t->err, st, "%s", h->local->err.msg);
		memcpy(w.local, sub.bytes, SUB_HANDLE);
		w.has_local = 1;
	}
	memset(out, 0, sizeof(*out));
	memcpy(out->bytes, &w, sizeof(w));
	return KOLO_OK;
}

static kolo_status_t wrap_conn(struct hybrid *h, struct kolo_conn *sub, int peer, int tag,
                               struct kolo_conn **out)
{
	struct hybrid_conn *c = calloc(1, sizeof(*c));
	if (!c) {
		sub->transport->ops->close(sub);
		return KOLO_ENOMEM;
	}
	c->base.transport = &h->base;
	c->base.peer_rank = peer;
	c->base.tag = tag;
	c->sub = sub;
	*out = &c->base;
	return KOLO_OK;
}

static kolo_status_t hybrid_connect(struct kolo_transport *t,
                                    const struct kolo_transport_handle *peer, int peer_rank,
                                    int tag, struct kolo_conn **out)
{
	struct hybrid *h = hy(t);
	struct hybrid_handle w;
	memcpy(&w, peer->bytes, sizeof(w));
	if (w.magic != KOLO_TRANSPORT_MAGIC || w.kind != KOLO_HANDLE_HYBRID)
		return kolo_fail(&t->err, KOLO_EINVAL, "rank %d's handle is not a kolo handle",
		                 peer_rank);
	bool local = is_local(h, peer_rank) && w.has_local;
	struct kolo_transport *sub_t = local ? h->local : h->net;
	struct kolo_transport_handle sub;
	memset(&sub, 0, sizeof(sub));
	memcpy(sub.bytes, local ? w.local : w.net, SUB_HANDLE);
	struct kolo_conn *sc;
	kolo_status_t st = sub_t->ops->connect(sub_t, &sub, peer_rank, tag, &sc);
	if (st != KOLO_OK)
		return kolo_fail(&t->err, st, "%s", sub_t->err.msg);
	return wrap_conn(h, sc, peer_rank, tag, out);
}

static kolo_status_t hybrid_accept(struct kolo_transport *t, int peer_rank, int tag,
                                   struct kolo_conn **out)
{
	struct hybrid *h = hy(t);
	struct kolo_transport *sub_t = is_local(h, peer_rank) ? h->local : h->net;
	struct kolo_conn *sc = NULL;
	*out = NULL;
	kolo_status_t st = sub_t->ops->accept(sub_t, peer_rank, tag, &sc);
	if (st != KOLO_OK)
		return kolo_fail(&t->err, st, "%s", sub_t->err.msg);
	/* Keep the other transport's handshakes moving too: a stray there must
	 * be refused even while nobody accepts on it. */
	struct kolo_transport *other = sub_t == h->net ? h->local : h->net;
	struct kolo_conn *none = NULL;
	if (other)
		other->ops->accept(other, -1, -1, &none);
	if (!sc)
		return KOLO_OK;
	return wrap_conn(h, sc, peer_rank, tag, out);
}

static kolo_status_t post(struct kolo_conn *c, void *buf, size_t len, bool send,
                          struct kolo_req **out)
{
	struct hybrid_conn *hc = kolo_container_of(c, struct hybrid_conn, base);
	struct hybrid *h = hy(c->transport);
	struct kolo_req *r = h->free_reqs;
	if (r) {
		h->free_reqs = r->next_free;
	} else {
		if (!(r = malloc(sizeof(*r))))
			return KOLO_ENOMEM;
		r->next_all = h->all_reqs;
		h->all_reqs = r;
	}
	r->sub_t = hc->sub->transport;
	r->h = h;
	kolo_status_t st = send ? kolo_isend(hc->sub, buf, len, &r->sub)
	                        : kolo_irecv(hc->sub, buf, len, &r->sub);
	if (st != KOLO_OK) {
		r->next_free = h->free_reqs;
		h->free_reqs = r;
		return kolo_fail(&c->transport->err, st, "%s", r->sub_t->err.msg);
	}
	*out = r;
	return KOLO_OK;
}

static kolo_status_t hybrid_isend(struct kolo_conn *c, const void *buf, size_t len,
                                  struct kolo_req **out)
{
	return post(c, (void *)buf, len, true, out);
}

static kolo_status_t hybrid_irecv(struct kolo_conn *c, void *buf, size_t len, struct kolo_req **out)
{
	return post(c, buf, len, false, out);
}

static kolo_status_t hybrid_test(struct kolo_req *r, bool *done)
{
	kolo_status_t st = r->sub_t->ops->test(r->sub, done);
	if (st != KOLO_OK)
		kolo_fail(&r->h->base.err, st, "%s", r->sub_t->err.msg);
	if (st != KOLO_OK || *done) {
		r->next_free = r->h->free_reqs;
		r->h->free_reqs = r;
	}
	return st;
}

static kolo_status_t hybrid_wait(struct kolo_transport *t, int timeout_ms)
{
	struct hybrid *h = hy(t);
	if (!h->local)
		return h->net->ops->wait(h->net, timeout_ms);
	if (!h->any_remote)
		return h->local->ops->wait(h->local, timeout_ms);
	/* Let each sub-transport arm its wake-ups and make any progress it can
	 * without blocking, then block on both at once. */
	kolo_status_t st = h->local->ops->wait(h->local, 0);
	if (st == KOLO_OK)
		st = h->net->ops->wait(h->net, 0);
	if (st != KOLO_OK || timeout_ms == 0)
		return st;
	int fl = h->local->ops->poll_fd ? h->local->ops->poll_fd(h->local) : -1;
	int fn = h->net->ops->poll_fd ? h->net->ops->poll_fd(h->net) : -1;
	if (fl >= 0 && fn >= 0) {
		/* The local wait(0) above may itself have completed requests
		 * without making its fd readable: sleep 1 ms at most, so that
		 * the caller sees them soon. */
		struct pollfd p[2] = {{.fd = fl, .events = POLLIN}, {.fd = fn, .events = POLLIN}};
		poll(p, 2, KOLO_MIN(timeout_ms, 1));
		return KOLO_OK;
	}
	/* Without pollable fds, share the time between the two. */
	int slice = KOLO_MAX(1, KOLO_MIN(timeout_ms, 2) / 2);
	st = h->local->ops->wait(h->local, slice);
	return st != KOLO_OK ? st : h->net->ops->wait(h->net, slice);
}

static void hybrid_abort(struct kolo_transport *t, kolo_status_t st)
{
	struct hybrid *h = hy(t);
	if (h->local)
		h->local->ops->abort(h->local, st);
	h->net->ops->abort(h->net, st);
}

static void hybrid_close(struct kolo_conn *c)
{
	if (!c)
		return;
	struct hybrid_conn *hc = kolo_container_of(c, struct hybrid_conn, base);
	hc->sub->transport->ops->close(hc->sub);
	free(hc);
}

static int hybrid_poll_fd(struct kolo_transport *t)
{
	struct hybrid *h = hy(t);
	/* One fd cannot stand for two; callers fall back to wait(). */
	return h->local ? -1 : (h->net->ops->poll_fd ? h->net->ops->poll_fd(h->net) : -1);
}

static bool hybrid_unreachable(struct kolo_transport *t, int peer_rank)
{
	struct hybrid *h = hy(t);
	return h->net->ops->unreachable && h->net->ops->unreachable(h->net, peer_rank);
}

static int hybrid_unacked_ms(struct kolo_transport *t, int peer_rank)
{
	struct hybrid *h = hy(t);
	return h->net->ops->unacked_ms ? h->net->ops->unacked_ms(h->net, peer_rank) : -1;
}

static int hybrid_peer_cpu(struct kolo_conn *c, int cpu)
{
	struct kolo_conn *sub = kolo_container_of(c, struct hybrid_conn, base)->sub;
	return sub->transport->ops->peer_cpu ? sub->transport->ops->peer_cpu(sub, cpu) : -1;
}

/* Shared memory for the peers cfg->same_host marks (created only if there
 * is one), TCP for the others. */
static kolo_status_t hybrid_create(const struct kolo_transport_config *cfg,
                                   struct kolo_transport **out, struct kolo_errbuf *eb)
{
	const struct kolo_transport_ops *local = &kolo_transport_shm_ops;
	const struct kolo_transport_ops *net = cfg && cfg->net ? cfg->net : &kolo_transport_tcp_ops;
	*out = NULL;
	if (!cfg || cfg->size < 1 || cfg->rank < 0 || cfg->rank >= cfg->size)
		return kolo_fail(eb, KOLO_EINVAL, "hybrid: rank %d of %d", cfg ? cfg->rank : -1,
		                 cfg ? cfg->size : 0);
	struct hybrid *h = calloc(1, sizeof(*h));
	if (!h)
		return kolo_fail(eb, KOLO_ENOMEM, "hybrid: out of memory");
	h->base.ops = &kolo_transport_hybrid_ops;
	h->size = cfg->size;
	h->same_host = calloc((size_t)cfg->size, sizeof(bool));
	if (!h->same_host) {
		free(h);
		return kolo_fail(eb, KOLO_ENOMEM, "hybrid: out of memory");
	}
	bool any_local = false;
	for (int r = 0; r < cfg->size; r++) {
		h->same_host[r] = cfg->same_host && cfg->same_host[r] && r != cfg->rank;
		any_local |= h->same_host[r];
		h->any_remote |= r != cfg->rank && !h->same_host[r];
	}
	kolo_status_t st = net->create(cfg, &h->net, eb);
	if (st == KOLO_OK && any_local)
		st = local->create(cfg, &h->local, eb);
	if (st != KOLO_OK) {
		hybrid_destroy(&h->base);
		return st;
	}
	*out = &h->base;
	return KOLO_OK;
}

const struct kolo_transport_ops kolo_transport_hybrid_ops = {
        .name = "hybrid",
        .create = hybrid_create,
        .listen = hybrid_listen,
        .connect = hybrid_connect,
        .accept = hybrid_accept,
        .isend = hybrid_isend,
        .irecv = hybrid_irecv,
        .test = hybrid_test,
        .wait = hybrid_wait,
        .abort = hybrid_abort,
        .close = hybrid_close,
        .destroy = hybrid_destroy,
        .poll_fd = hybrid_poll_fd,
        .unreachable = hybrid_unreachable,
        .unacked_ms = hybrid_unacked_ms,
        .peer_cpu = hybrid_peer_cpu,
};

kolo_status_t kolo_hybrid_net_handle(const struct kolo_transport_handle *h,
                                     struct kolo_transport_handle *net)
{
	struct hybrid_handle w;
	memcpy(&w, h->bytes, sizeof(w));
	if (w.magic != KOLO_TRANSPORT_MAGIC || w.kind != KOLO_HANDLE_HYBRID)
		return KOLO_EINVAL;
	memset(net, 0, sizeof(*net));
	memcpy(net->bytes, w.net, SUB_HANDLE);
	return KOLO_OK;
}
