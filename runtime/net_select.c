/* net_select: which transport carries the data plane between hosts
 * (KOLO_TRANSPORT): tcp, verbs, or auto, which takes verbs only when every
 * rank of the round has an active RDMA port, agreed through the KV. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "runtime.h"
#include "transport_tcp.h"
#include "transport_verbs.h"

#define SUBSYS "init"

/* Every rank publishes whether it has verbs and reads everyone's: all
 * ranks reach the same answer from the same keys. */
static kolo_status_t all_have_verbs(struct kolo_comm *comm, bool mine, bool *all, int *without)
{
	const struct kolo_rdzv_assignment *a = &comm->assignment;
	char key[64];
	snprintf(key, sizeof(key), "rdma/%" PRId64 "/%d", a->round, a->rank);
	const char *v = mine ? "1" : "0";
	kolo_status_t st = kolo_rdzv_kv_put(comm->rdzv, key, v, 1);
	if (st != KOLO_OK)
		return kolo_comm_fail(comm, st, "publishing RDMA availability: %s",
		                      kolo_rdzv_client_error(comm->rdzv));
	*all = mine;
	*without = mine ? -1 : a->rank;
	for (int r = 0; r < a->size && *all; r++) {
		if (r == a->rank)
			continue;
		snprintf(key, sizeof(key), "rdma/%" PRId64 "/%d", a->round, r);
		void *data = NULL;
		size_t len = 0;
		st = kolo_rdzv_kv_get(comm->rdzv, key, comm->timeout_ms, &data, &len);
		if (st != KOLO_OK)
			return kolo_comm_fail(comm, st,
			                      "looking up rank %d's RDMA availability: %s", r,
			                      kolo_rdzv_client_error(comm->rdzv));
		if (len != 1 || ((char *)data)[0] != '1') {
			*all = false;
			*without = r;
		}
		free(data);
	}
	return KOLO_OK;
}

kolo_status_t kolo_runtime_net_select(struct kolo_comm *comm, const struct kolo_transport_ops **net)
{
	const char *want = kolo_param_str(KOLO_P_TRANSPORT);
	*net = &kolo_transport_tcp_ops;
	if (strcasecmp(want, "tcp") == 0)
		return KOLO_OK;
	bool is_verbs = strcasecmp(want, "verbs") == 0;
	if (!is_verbs && strcasecmp(want, "auto") != 0)
		return kolo_comm_fail(comm, KOLO_EINVAL,
		                      "KOLO_TRANSPORT=%s: want tcp, verbs or auto", want);
	struct kolo_errbuf eb = {{0}};
	bool mine = kolo_verbs_available(kolo_param_str(KOLO_P_IB_DEVICE),
	                                 kolo_param_str(KOLO_P_IFACE), &eb);
	if (is_verbs) {
		if (!mine)
			return kolo_comm_fail(comm, KOLO_EUNSUPPORTED, "KOLO_TRANSPORT=verbs: %s",
			                      eb.msg);
		*net = &kolo_transport_verbs_ops;
		KOLO_INFO(SUBSYS, "data plane between hosts: verbs (KOLO_TRANSPORT=verbs)");
		return KOLO_OK;
	}
	if (!comm->rdzv) {
		/* A bootstrap comm has no KV to agree through. */
		KOLO_INFO(SUBSYS, "data plane between hosts: tcp (KOLO_TRANSPORT=auto without a "
		                  "rendezvous cannot agree on verbs; set KOLO_TRANSPORT=verbs)");
		return KOLO_OK;
	}
	bool all = false;
	int without = -1;
	kolo_status_t st = all_have_verbs(comm, mine, &all, &without);
	if (st != KOLO_OK)
		return st;
	if (all) {
		*net = &kolo_transport_verbs_ops;
		KOLO_INFO(SUBSYS, "data plane between hosts: verbs (auto: every rank has an active "
		                  "RDMA port)");
	} else if (!mine) {
		KOLO_INFO(SUBSYS, "data plane between hosts: tcp (auto: %s)", eb.msg);
	} else {
		KOLO_INFO(SUBSYS,
		          "data plane between hosts: tcp (auto: rank %d has no active RDMA "
		          "port)",
		          without);
	}
	return KOLO_OK;
}
