/* verbs_loader: libibverbs resolved at run time into one table, so that one
 * binary runs with or without RDMA and nothing links against the library.
 * rdma-core's headers give the types and constants only. */
#include "verbs_internal.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

static struct verbs_api lib_api;
static char lib_error[256];
static bool lib_ok;
static pthread_once_t lib_once = PTHREAD_ONCE_INIT;

/* The emulation, once kolo_verbs_emu_enable (verbs_emu.c) chose it. */
static _Atomic(const struct verbs_api *) override;

/* Real symbols behind verbs.h's inline wrappers. */
static int (*real_query_port)(struct ibv_context *, uint8_t, struct _compat_ibv_port_attr *);

/* verbs.h implements these as static inline calls through the context's
 * ops; re-stating them here keeps every call going through the table. */
static int w_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
	return qp->context->ops.post_send(qp, wr, bad);
}

static int w_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	return qp->context->ops.post_recv(qp, wr, bad);
}

static int w_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
	return cq->context->ops.poll_cq(cq, n, wc);
}

static int w_req_notify_cq(struct ibv_cq *cq, int solicited_only)
{
	return cq->context->ops.req_notify_cq(cq, solicited_only);
}

static int w_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr)
{
	/* As ___ibv_query_port: the extended op when the provider has one. */
	struct verbs_context *vctx = verbs_get_ctx_op(ctx, query_port);
	if (vctx)
		return vctx->query_port(ctx, port, attr, sizeof(*attr));
	memset(attr, 0, sizeof(*attr));
	return real_query_port(ctx, port, (struct _compat_ibv_port_attr *)attr);
}

static void *sym(void *h, const char *name, bool *ok)
{
	void *p = dlsym(h, name);
	if (!p && *ok) {
		snprintf(lib_error, sizeof(lib_error), "libibverbs.so.1 lacks %s", name);
		*ok = false;
	}
	return p;
}

/* Casts through void * are how dlsym hands out functions (POSIX). */
#define RESOLVE(field, name)                                                                       \
	do {                                                                                       \
		void *p_ = sym(h, name, &ok);                                                      \
		memcpy(&lib_api.field, &p_, sizeof(p_));                                           \
	} while (0)

static void load(void)
{
	void *h = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		const char *e = dlerror();
		snprintf(lib_error, sizeof(lib_error), "no RDMA device: libibverbs not found (%s)",
		         e ? e : "dlopen failed");
		return;
	}
	bool ok = true;
	lib_api.name = "libibverbs.so.1";
	lib_api.emulated = false;
	RESOLVE(get_device_list, "ibv_get_device_list");
	RESOLVE(free_device_list, "ibv_free_device_list");
	RESOLVE(get_device_name, "ibv_get_device_name");
	RESOLVE(open_device, "ibv_open_device");
	RESOLVE(close_device, "ibv_close_device");
	RESOLVE(query_device, "ibv_query_device");
	RESOLVE(query_gid, "ibv_query_gid");
	RESOLVE(alloc_pd, "ibv_alloc_pd");
	RESOLVE(dealloc_pd, "ibv_dealloc_pd");
	RESOLVE(reg_mr, "ibv_reg_mr");
	RESOLVE(dereg_mr, "ibv_dereg_mr");
	RESOLVE(create_comp_channel, "ibv_create_comp_channel");
	RESOLVE(destroy_comp_channel, "ibv_destroy_comp_channel");
	RESOLVE(create_cq, "ibv_create_cq");
	RESOLVE(destroy_cq, "ibv_destroy_cq");
	RESOLVE(get_cq_event, "ibv_get_cq_event");
	RESOLVE(ack_cq_events, "ibv_ack_cq_events");
	RESOLVE(create_qp, "ibv_create_qp");
	RESOLVE(modify_qp, "ibv_modify_qp");
	RESOLVE(destroy_qp, "ibv_destroy_qp");
	RESOLVE(wc_status_str, "ibv_wc_status_str");
	void *qp = sym(h, "ibv_query_port", &ok);
	memcpy(&real_query_port, &qp, sizeof(qp));
	lib_api.query_port = w_query_port;
	lib_api.post_send = w_post_send;
	lib_api.post_recv = w_post_recv;
	lib_api.poll_cq = w_poll_cq;
	lib_api.req_notify_cq = w_req_notify_cq;
	lib_api.block_cap_ms = NULL;
	if (!ok) {
		dlclose(h);
		return;
	}
	lib_ok = true; /* the handle stays open for the life of the process */
}

void vb_loader_use(const struct verbs_api *api)
{
	atomic_store(&override, api);
}

const struct verbs_api *verbs_api_get(struct kolo_errbuf *eb)
{
	const struct verbs_api *o = atomic_load(&override);
	if (o)
		return o;
	pthread_once(&lib_once, load);
	if (!lib_ok) {
		kolo_fail(eb, KOLO_EUNSUPPORTED, "%s", lib_error);
		return NULL;
	}
	return &lib_api;
}
