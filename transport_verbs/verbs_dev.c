/* verbs_dev: which device and port, the GID index, RLIMIT_MEMLOCK, and the
 * cache of registered user buffers. */
#include "verbs_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <inttypes.h>
#include <net/if.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

/* The network interface an address belongs to ("" when none). */
static void iface_of_addr(const char *addr, char *out, size_t size)
{
	out[0] = '\0';
	struct in6_addr a6;
	struct in_addr a4;
	bool v4 = inet_pton(AF_INET, addr, &a4) == 1,
	     v6 = !v4 && inet_pton(AF_INET6, addr, &a6) == 1;
	if (!v4 && !v6)
		return;
	struct ifaddrs *ifs;
	if (getifaddrs(&ifs) != 0)
		return;
	for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
		if (!i->ifa_addr)
			continue;
		if ((v4 && i->ifa_addr->sa_family == AF_INET &&
		     ((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr == a4.s_addr) ||
		    (v6 && i->ifa_addr->sa_family == AF_INET6 &&
		     memcmp(&((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr, &a6, 16) == 0)) {
			snprintf(out, size, "%s", i->ifa_name);
			break;
		}
	}
	freeifaddrs(ifs);
}

/* Whether RDMA device `dev` drives network interface `netdev` (sysfs). */
static bool dev_has_netdev(const char *dev, const char *netdev)
{
	char path[512];
	snprintf(path, sizeof(path), "/sys/class/infiniband/%s/device/net/%s", dev, netdev);
	return access(path, F_OK) == 0;
}

/* The RoCE v2 GID index of a port when sysfs says which it is, else -1. */
static int roce_v2_gid(const char *dev, int port, const struct verbs_api *api,
                       struct ibv_context *ctx)
{
	for (int i = 0; i < 16; i++) {
		char path[512], type[32] = "";
		snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports/%d/gid_attrs/types/%d",
		         dev, port, i);
		FILE *f = fopen(path, "r");
		if (!f)
			return -1;
		bool got = fgets(type, sizeof(type), f) != NULL;
		fclose(f);
		union ibv_gid g;
		if (got && strncmp(type, "RoCE v2", 7) == 0 &&
		    api->query_gid(ctx, (uint8_t)port, i, &g) == 0 &&
		    (g.global.subnet_prefix || g.global.interface_id))
			return i;
	}
	return -1;
}

static const char *link_name(const struct ibv_port_attr *pa)
{
	return pa->link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "InfiniBand";
}

kolo_status_t vb_dev_open(struct vb_transport *t, const struct kolo_transport_config *cfg,
                          struct kolo_errbuf *eb)
{
	const struct verbs_api *api = t->api;
	const char *want = cfg->ib_device && cfg->ib_device[0] ? cfg->ib_device : NULL;
	char netdev[IF_NAMESIZE + 1] = "";
	if (!want && cfg->iface && cfg->iface[0]) {
		iface_of_addr(cfg->iface, netdev, sizeof(netdev));
		if (!netdev[0])
			snprintf(netdev, sizeof(netdev), "%s", cfg->iface);
	}
	int n = 0;
	struct ibv_device **list = api->get_device_list(&n);
	if (!list || n == 0) {
		if (list)
			api->free_device_list(list);
		return kolo_fail(eb, KOLO_EUNSUPPORTED,
		                 "no RDMA device: libibverbs found no device (%s)", api->name);
	}
	/* The named device; else the one behind the interface; else the first
	 * with an active port. */
	char why[256] = "no active port";
	for (int pass = 0; pass < 2 && !t->ctx; pass++) {
		for (int i = 0; i < n && !t->ctx; i++) {
			const char *name = api->get_device_name(list[i]);
			if (want && strcmp(name, want) != 0)
				continue;
			if (!want && pass == 0 && (!netdev[0] || !dev_has_netdev(name, netdev)))
				continue;
			struct ibv_context *ctx = api->open_device(list[i]);
			if (!ctx) {
				snprintf(why, sizeof(why), "cannot open %s: %s", name,
				         strerror(errno));
				continue;
			}
			struct ibv_device_attr da;
			int nports = api->query_device(ctx, &da) == 0 ? da.phys_port_cnt : 1;
			for (int p = 1; p <= nports && !t->ctx; p++) {
				if (cfg->ib_port > 0 && p != cfg->ib_port)
					continue;
				struct ibv_port_attr pa;
				if (api->query_port(ctx, (uint8_t)p, &pa) != 0 ||
				    pa.state != IBV_PORT_ACTIVE)
					continue;
				t->ctx = ctx;
				t->port = (uint8_t)p;
				t->roce = pa.link_layer == IBV_LINK_LAYER_ETHERNET;
				t->lid = pa.lid;
				t->mtu = pa.active_mtu;
				snprintf(t->dev_name, sizeof(t->dev_name), "%s", name);
			}
			if (!t->ctx) {
				snprintf(why, sizeof(why), "no active port on %s", name);
				api->close_device(ctx);
			}
		}
		if (want)
			break;
	}
	api->free_device_list(list);
	if (!t->ctx)
		return kolo_fail(eb, KOLO_EUNSUPPORTED, "no RDMA device: %s%s%s", why,
		                 want ? " (KOLO_IB_DEVICE=" : "", want ? want : "");
	/* RoCE needs a GID (v2 routes over IP); InfiniBand uses the LID and
	 * GID 0. */
	t->gid_index = cfg->ib_gid_index;
	if (t->gid_index < 0)
		t->gid_index = t->roce ? roce_v2_gid(t->dev_name, t->port, api, t->ctx) : 0;
	if (t->gid_index < 0)
		t->gid_index = 0;
	if (api->query_gid(t->ctx, t->port, t->gid_index, &t->gid) != 0)
		memset(&t->gid, 0, sizeof(t->gid));
	if (t->roce && !t->gid.global.subnet_prefix && !t->gid.global.interface_id)
		return kolo_fail(eb, KOLO_EUNSUPPORTED, "%s port %d (RoCE): GID index %d is empty",
		                 t->dev_name, t->port, t->gid_index);
	t->pd = api->alloc_pd(t->ctx);
	t->ch = t->pd ? api->create_comp_channel(t->ctx) : NULL;
	t->cq = t->ch ? api->create_cq(t->ctx, VB_CQ_DEPTH, t, t->ch, 0) : NULL;
	if (!t->cq)
		return kolo_fail(eb, KOLO_ESYSTEM, "%s: cannot create PD/CQ: %s", t->dev_name,
		                 strerror(errno));
	if (api->req_notify_cq(t->cq, 0) != 0)
		return kolo_fail(eb, KOLO_ESYSTEM, "%s: cannot arm the CQ", t->dev_name);
	struct ibv_port_attr pa = {.link_layer = t->roce ? IBV_LINK_LAYER_ETHERNET : 0};
	KOLO_DEBUG(VB_SUBSYS, "%s port %d (%s, LID %u, GID index %d) through %s", t->dev_name,
	           t->port, link_name(&pa), t->lid, t->gid_index, api->name);
	return KOLO_OK;
}

void vb_dev_close(struct vb_transport *t)
{
	const struct verbs_api *api = t->api;
	vb_mr_clear(t);
	if (t->cq) {
		if (t->cq_events)
			api->ack_cq_events(t->cq, t->cq_events);
		api->destroy_cq(t->cq);
	}
	if (t->ch)
		api->destroy_comp_channel(t->ch);
	if (t->pd)
		api->dealloc_pd(t->pd);
	if (t->ctx)
		api->close_device(t->ctx);
	t->cq = NULL;
	t->ch = NULL;
	t->pd = NULL;
	t->ctx = NULL;
}

void vb_memlock_check(const struct vb_transport *t, size_t need)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_MEMLOCK, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY ||
	    rl.rlim_cur >= need)
		return;
	/* Registration pins pages; past the limit it fails with ENOMEM deep
	 * inside a collective. Containers often cap it at 64 KiB or 8 MiB. */
	kolo_log(t->api->emulated ? KOLO_LOG_DEBUG : KOLO_LOG_WARN, VB_SUBSYS,
	         "RLIMIT_MEMLOCK is %" PRIu64 " bytes, below the %zu that RDMA registration "
	         "needs here: registrations will fail. Raise it (ulimit -l unlimited; in a "
	         "container, the runtime's memlock ulimit and the IPC_LOCK capability)",
	         (uint64_t)rl.rlim_cur, need);
}

/* ---- the registration cache ---- */

static void entry_free(struct vb_transport *t, struct vb_mr_entry *e)
{
	if (e->mr)
		t->api->dereg_mr(e->mr);
	free(e);
	t->mr_count--;
}

struct vb_mr_entry *vb_mr_get(struct vb_transport *t, void *buf, size_t len, int access)
{
	uintptr_t a = (uintptr_t)buf;
	for (struct vb_mr_entry *e = t->mrs; e; e = e->next) {
		if (a >= e->addr && len <= e->len && a - e->addr <= e->len - len &&
		    (e->access & access) == access) {
			e->refs++;
			e->used = ++t->mr_clock;
			return e;
		}
	}
	/* Evict the least recently used idle entries beyond the cap. */
	while (t->mr_count >= KOLO_MAX(t->mr_cap, 0)) {
		struct vb_mr_entry **victim = NULL;
		for (struct vb_mr_entry **p = &t->mrs; *p; p = &(*p)->next)
			if ((*p)->refs == 0 && (!victim || (*p)->used < (*victim)->used))
				victim = p;
		if (!victim)
			break;
		struct vb_mr_entry *v = *victim;
		*victim = v->next;
		entry_free(t, v);
	}
	/* Whole pages: neighbouring buffers then share an entry. */
	long pg = sysconf(_SC_PAGESIZE);
	uintptr_t lo = a & ~(uintptr_t)(pg - 1);
	uintptr_t hi = (a + len + (uintptr_t)pg - 1) & ~(uintptr_t)(pg - 1);
	struct vb_mr_entry *e = calloc(1, sizeof(*e));
	if (!e) {
		kolo_fail(&t->base.err, KOLO_ENOMEM, "verbs: out of memory");
		return NULL;
	}
	e->addr = lo;
	e->len = hi - lo;
	e->access = access;
	e->mr = t->api->reg_mr(t->pd, (void *)lo, e->len, access);
	if (!e->mr) {
		int err = errno;
		free(e);
		kolo_fail(&t->base.err, KOLO_ESYSTEM, "verbs: registering %zu bytes failed: %s%s",
		          hi - lo, strerror(err),
		          err == ENOMEM ? " (RLIMIT_MEMLOCK too low?)" : "");
		return NULL;
	}
	e->refs = 1;
	e->used = ++t->mr_clock;
	e->next = t->mrs;
	t->mrs = e;
	t->mr_count++;
	return e;
}

void vb_mr_put(struct vb_transport *t, struct vb_mr_entry *e)
{
	if (!e)
		return;
	e->refs--;
	if (e->refs == 0 && t->mr_count > t->mr_cap) {
		for (struct vb_mr_entry **p = &t->mrs; *p; p = &(*p)->next)
			if (*p == e) {
				*p = e->next;
				entry_free(t, e);
				return;
			}
	}
}

void vb_mr_clear(struct vb_transport *t)
{
	while (t->mrs) {
		struct vb_mr_entry *e = t->mrs;
		t->mrs = e->next;
		entry_free(t, e);
	}
}
