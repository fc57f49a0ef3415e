/* p2p: the public point-to-point API of kolo/async.h. The comm's p2p
 * (p2p/) is made on the first send or recv: its own TCP endpoint, whose
 * address goes to the KV under "p2p/<round>/<rank>", where peers look for it
 * when they first send to this rank. A bootstrap comm has no KV: its
 * endpoint listens from kolo_bootstrap_listen() on and its address travels in
 * the second half of the rank's card. The p2p goes with the round
 * (reform.c, finalize): pending operations then fail. */
#include "p2p.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "gpu.h"
#include "runtime.h"
#include "transport_tcp.h"

struct p2p_ctx {
	struct kolo_comm *comm;
	struct kolo_ring_comm *ring; /* the round's; outlives the p2p */
	int64_t round;
};

static void p2p_key(char *key, size_t size, int64_t round, int rank)
{
	snprintf(key, size, "p2p/%" PRId64 "/%d", round, rank);
}

static kolo_status_t lookup(void *arg, int rank, struct kolo_transport_handle *out)
{
	struct p2p_ctx *x = arg;
	if (x->comm->p2p_cards) {
		*out = x->comm->p2p_cards[rank];
		return KOLO_OK;
	}
	char key[64];
	p2p_key(key, sizeof(key), x->round, rank);
	void *data = NULL;
	size_t len = 0;
	kolo_status_t st = kolo_rdzv_kv_get(x->comm->rdzv, key, 0, &data, &len);
	if (st != KOLO_OK)
		return st;
	if (len != sizeof(*out)) {
		free(data);
		return KOLO_EPROTO;
	}
	memcpy(out->bytes, data, sizeof(*out));
	free(data);
	return KOLO_OK;
}

static kolo_status_t health(void *arg, struct kolo_errbuf *eb)
{
	struct p2p_ctx *x = arg;
	if (atomic_load(&x->comm->aborted))
		return kolo_fail(eb, KOLO_ECLOSED, "the comm was aborted (kolo_abort)");
	kolo_status_t st = kolo_ring_comm_status(x->ring);
	if (st != KOLO_OK)
		return kolo_fail(eb, st, "the comm failed: %s", kolo_ring_last_error(x->ring));
	return KOLO_OK;
}

kolo_status_t kolo_runtime_p2p_listen(struct kolo_comm *comm, struct kolo_transport **out,
                                      struct kolo_transport_handle *handle)
{
	struct kolo_transport_config tc;
	kolo_runtime_transport_config(comm, &tc);
	/* Idle conns always wait for a header: deadlines are the p2p's own. */
	tc.timeout_ms = INT32_MAX;
	/* Peers close their conns when they finalize; a loss that matters
	 * fails the operations pending on it, with the transport's message. */
	tc.quiet_peer_close = true;
	struct kolo_errbuf eb = {{0}};
	struct kolo_transport *t = NULL;
	kolo_status_t st = kolo_transport_tcp_ops.create(&tc, &t, &eb);
	if (st == KOLO_OK && (st = t->ops->listen(t, handle)) != KOLO_OK)
		kolo_fail(&eb, st, "%s", t->err.msg);
	if (st != KOLO_OK) {
		if (t)
			t->ops->destroy(t);
		return kolo_comm_fail(comm, st, "point-to-point endpoint: %s", eb.msg);
	}
	*out = t;
	return KOLO_OK;
}

/* The endpoint: a bootstrap comm's, listening since its cards were made, or
 * a new one whose address goes to the KV once its p2p runs. */
static kolo_status_t endpoint(struct kolo_comm *comm, struct kolo_transport **t,
                              struct kolo_transport_handle *h)
{
	if (comm->p2p_cards) {
		if (!comm->p2p_transport)
			return kolo_comm_fail(comm, KOLO_ESHUTDOWN,
			                      "point-to-point: the comm's endpoint was closed");
		*t = comm->p2p_transport;
		comm->p2p_transport = NULL;
		return KOLO_OK;
	}
	if (!comm->rdzv || !comm->ring)
		return kolo_comm_fail(comm, KOLO_EUNSUPPORTED,
		                      "point-to-point needs a comm joined through the rendezvous "
		                      "or a bootstrap comm");
	return kolo_runtime_p2p_listen(comm, t, h);
}

static kolo_status_t create(struct kolo_comm *comm, struct kolo_p2p **out)
{
	struct kolo_transport *t = NULL;
	struct kolo_transport_handle h = {{0}};
	KOLO_CHECK(endpoint(comm, &t, &h));
	struct p2p_ctx *x = calloc(1, sizeof(*x));
	if (!x) {
		t->ops->destroy(t);
		return kolo_comm_fail(comm, KOLO_ENOMEM, "out of memory");
	}
	*x = (struct p2p_ctx){.comm = comm, .ring = comm->ring, .round = comm->assignment.round};
	struct kolo_p2p_config cfg = {.transport = t,
	                              .rank = comm->assignment.rank,
	                              .size = comm->assignment.size,
	                              .lookup = lookup,
	                              .lookup_ctx = x,
	                              .health = health,
	                              .health_ctx = x,
	                              .timeout_ms = comm->timeout_ms,
	                              .owner = comm};
	struct kolo_errbuf eb = {{0}};
	kolo_status_t st = kolo_p2p_create(&cfg, out, &eb);
	if (st != KOLO_OK) {
		free(x);
		return kolo_comm_fail(comm, st, "%s", eb.msg);
	}
	char key[64];
	p2p_key(key, sizeof(key), x->round, cfg.rank);
	if (!comm->p2p_cards &&
	    (st = kolo_rdzv_kv_put(comm->rdzv, key, h.bytes, sizeof(h.bytes))) != KOLO_OK) {
		kolo_p2p_destroy(*out);
		*out = NULL;
		free(x);
		return kolo_comm_fail(comm, st, "publishing the point-to-point address: %s",
		                      kolo_rdzv_client_error(comm->rdzv));
	}
	comm->p2p_ctx = x;
	return KOLO_OK;
}

/* The comm's p2p, made on first use. */
static kolo_status_t p2p_of(struct kolo_comm *comm, struct kolo_p2p **out)
{
	pthread_mutex_lock(&comm->p2p_lock);
	kolo_status_t st = KOLO_OK;
	if (!comm->p2p)
		st = create(comm, &comm->p2p);
	*out = comm->p2p;
	pthread_mutex_unlock(&comm->p2p_lock);
	return st;
}

void kolo_runtime_p2p_close(struct kolo_comm *comm, kolo_status_t st, const char *why)
{
	pthread_mutex_lock(&comm->p2p_lock);
	kolo_p2p_close(comm->p2p, st, why);
	pthread_mutex_unlock(&comm->p2p_lock);
}

void kolo_runtime_p2p_destroy(struct kolo_comm *comm, kolo_status_t st, const char *why)
{
	pthread_mutex_lock(&comm->p2p_lock);
	struct kolo_p2p *p = comm->p2p;
	void *x = comm->p2p_ctx;
	comm->p2p = NULL;
	comm->p2p_ctx = NULL;
	pthread_mutex_unlock(&comm->p2p_lock);
	if (!p)
		return;
	kolo_p2p_close(p, st, why);
	kolo_p2p_destroy(p);
	free(x);
}

static kolo_status_t check(struct kolo_comm *comm, const char *what, const void *buf, size_t bytes)
{
	KOLO_CHECK(kolo_args_comm(comm, what));
	if (bytes && kolo_mem_kind(buf) == KOLO_MEM_DEVICE)
		return kolo_comm_fail(comm, KOLO_EUNSUPPORTED,
		                      "%s: point-to-point takes host memory (copy device "
		                      "buffers to the host first)",
		                      what);
	return KOLO_OK;
}

KOLO_API kolo_status_t kolo_send_async(kolo_comm_t *comm, const void *buf, size_t bytes, int dst,
                                       int tag, kolo_callback_fn cb, void *cb_arg,
                                       kolo_handle_t **handle)
{
	KOLO_CHECK(check(comm, "send", buf, bytes));
	struct kolo_p2p *p;
	KOLO_CHECK(p2p_of(comm, &p));
	struct kolo_errbuf eb = {{0}};
	kolo_status_t st = kolo_p2p_send(p, buf, bytes, dst, tag, cb, cb_arg, handle, &eb);
	return st == KOLO_OK ? st : kolo_comm_fail(comm, st, "send: %s", eb.msg);
}

KOLO_API kolo_status_t kolo_recv_async(kolo_comm_t *comm, void *buf, size_t bytes, int src, int tag,
                                       int *source, kolo_callback_fn cb, void *cb_arg,
                                       kolo_handle_t **handle)
{
	KOLO_CHECK(check(comm, "recv", buf, bytes));
	struct kolo_p2p *p;
	KOLO_CHECK(p2p_of(comm, &p));
	struct kolo_errbuf eb = {{0}};
	kolo_status_t st = kolo_p2p_recv(p, buf, bytes, src, tag, source, cb, cb_arg, handle, &eb);
	return st == KOLO_OK ? st : kolo_comm_fail(comm, st, "recv: %s", eb.msg);
}

KOLO_API kolo_status_t kolo_send(kolo_comm_t *comm, const void *buf, size_t bytes, int dst, int tag)
{
	kolo_handle_t *h = NULL;
	KOLO_CHECK(kolo_send_async(comm, buf, bytes, dst, tag, NULL, NULL, &h));
	return kolo_wait(h);
}

KOLO_API kolo_status_t kolo_recv(kolo_comm_t *comm, void *buf, size_t bytes, int src, int tag,
                                 int *source)
{
	kolo_handle_t *h = NULL;
	KOLO_CHECK(kolo_recv_async(comm, buf, bytes, src, tag, source, NULL, NULL, &h));
	return kolo_wait(h);
}
