/* The levels of the hierarchical allreduce for a round (docs/hierarchical.md):
 * hosts (reduce inside each host through shared memory, allreduce across
 * hosts), and zones under them (the allreduce across hosts reduces inside
 * each zone, then across zones), each taken where the round's layout allows
 * and the cost model predicts it to pay. Every rank sees the same members
 * and parameters, so every rank builds the same levels. */
#include "runtime.h"

#include <stdlib.h>
#include <string.h>

#define SUBSYS "init"

static bool is_on(enum kolo_param_id id)
{
	return kolo_runtime_param_is(id, "1", "on", "true");
}

static bool is_off(enum kolo_param_id id)
{
	return kolo_runtime_param_is(id, "0", "off", "false");
}

/* Whether every host holds L ranks, contiguous per host. */
static bool hosts_even(const struct kolo_rdzv_assignment *a, int L)
{
	const int n = a->size;
	if (a->n_members != n)
		return false;
	for (int r = 0; r < n; r++) {
		const char *h = a->members[r].host;
		if (a->members[r].rank != r || strcmp(h, a->members[r - r % L].host) != 0 ||
		    (r % L == 0 && r > 0 && strcmp(h, a->members[r - L].host) == 0))
			return false;
	}
	return true;
}

static size_t pipeline_bytes(void)
{
	int64_t v = kolo_param_int(KOLO_P_HIER_CHUNK_BYTES);
	return v < 0 ? SIZE_MAX : (size_t)v;
}

/* The host level on comm->ring, when there are several hosts with the same
 * number (≥ 2) of ranks each. */
static kolo_status_t host_level(struct kolo_comm *comm, size_t local_segment_bytes)
{
	const struct kolo_rdzv_assignment *a = &comm->assignment;
	const int n = a->size, L = a->local_size, H = a->cross_size;
	if (is_off(KOLO_P_HIERARCHICAL) || L < 2 || H < 2 || L * H != n)
		return KOLO_OK;
	if (!hosts_even(a, L)) {
		KOLO_INFO(SUBSYS, "hosts hold different numbers of ranks: flat allreduce only");
		return KOLO_OK;
	}
	bool on = is_on(KOLO_P_HIERARCHICAL);
	struct kolo_ring_hier_config hc = {
	        .mode = on ? KOLO_RING_HIER_ON : KOLO_RING_HIER_AUTO,
	        .local_size = L,
	        .cross_size = H,
	        .shm = {kolo_param_float(KOLO_P_COST_SHM_US),
	                kolo_param_float(KOLO_P_COST_SHM_GBPS)},
	        .net = {kolo_param_float(KOLO_P_COST_NET_US),
	                kolo_param_float(KOLO_P_COST_NET_GBPS)},
	        .probe = !on && kolo_param_bool(KOLO_P_COST_PROBE),
	        .small_model =
	                strcmp(kolo_param_source(KOLO_P_SMALL_ALLREDUCE_BYTES), "default") == 0,
	        .local_segment_bytes = local_segment_bytes,
	        .pipeline_bytes = pipeline_bytes(),
	};
	struct kolo_errbuf eb = {{0}};
	kolo_status_t st = kolo_ring_hier_enable(comm->ring, &hc, &eb);
	if (st != KOLO_OK)
		return kolo_comm_fail(comm, st, "connecting the hierarchy: %s", eb.msg);
	struct kolo_ring_link_cost shm, net;
	kolo_ring_hier_costs(comm->ring, &shm, &net);
	KOLO_INFO(SUBSYS,
	          "hierarchical allreduce %s: %d hosts x %d ranks; shm %.1f us %.2f GB/s, net %.1f "
	          "us %.3f GB/s (%s)",
	          on ? "on" : "auto", H, L, shm.alpha_us, shm.gbytes_per_s, net.alpha_us,
	          net.gbytes_per_s, hc.probe ? "measured" : "configured");
	return KOLO_OK;
}

/* The zone level, when the members name ≥ 2 zones of ≥ 2 hosts each, alike
 * (kolo_rdzv_zone_count): on the host level's cross comm (one rank per host)
 * where there is one, else on the flat ring (one rank per host, or hosts
 * whose ranks the host level does not group). Its "local" link is a host's
 * link (KOLO_COST_NET_*), its "net" link the one between zones
 * (KOLO_COST_ZONE_*, where 0 is the host's); both measured at set-up with
 * KOLO_COST_PROBE=1. */
static kolo_status_t zone_level(struct kolo_comm *comm)
{
	const struct kolo_rdzv_assignment *a = &comm->assignment;
	if (is_off(KOLO_P_HIERARCHICAL_ZONES))
		return KOLO_OK;
	struct kolo_ring_comm *cross = kolo_ring_hier_sub(comm->ring, true);
	const int group = cross ? a->local_size : 1;
	const int Z =
	        kolo_rdzv_zone_count(a->members, a->n_members == a->size ? a->size : 0, group);
	if (Z == 0)
		return KOLO_OK;
	struct kolo_ring_comm *rc = cross ? cross : comm->ring;
	const int per_zone = kolo_ring_comm_size(rc) / Z;
	bool on = is_on(KOLO_P_HIERARCHICAL_ZONES);
	const struct kolo_ring_link_cost host = {kolo_param_float(KOLO_P_COST_NET_US),
	                                         kolo_param_float(KOLO_P_COST_NET_GBPS)};
	double zone_us = kolo_param_float(KOLO_P_COST_ZONE_US);
	double zone_gbps = kolo_param_float(KOLO_P_COST_ZONE_GBPS);
	const struct kolo_ring_link_cost zone = {zone_us > 0 ? zone_us : host.alpha_us,
	                                         zone_gbps > 0 ? zone_gbps : host.gbytes_per_s};
	struct kolo_ring_hier_config hc = {
	        .mode = on ? KOLO_RING_HIER_ON : KOLO_RING_HIER_AUTO,
	        .local_size = per_zone,
	        .cross_size = Z,
	        .shm = host,
	        .net = zone,
	        .shared_link = true,
	        .probe = !on && kolo_param_bool(KOLO_P_COST_PROBE),
	        .pipeline_bytes = pipeline_bytes(),
	};
	struct kolo_errbuf eb = {{0}};
	kolo_status_t st = kolo_ring_hier_enable(rc, &hc, &eb);
	if (st != KOLO_OK)
		return kolo_comm_fail(comm, st, "connecting the zone level: %s", eb.msg);
	struct kolo_ring_link_cost in, between;
	kolo_ring_hier_costs(rc, &in, &between);
	KOLO_INFO(SUBSYS,
	          "zone level %s: %d zones x %d %s; inside a zone %.1f us %.3f GB/s, between "
	          "zones %.1f us %.3f GB/s (%s); 64 MiB go by %s",
	          on ? "on" : "auto", Z, per_zone, cross ? "hosts" : "ranks", in.alpha_us,
	          in.gbytes_per_s, between.alpha_us, between.gbytes_per_s,
	          hc.probe ? "measured" : "configured",
	          kolo_ring_allreduce_algo(rc, (size_t)64 << 20) == KOLO_RING_ALGO_HIER
	                  ? "the zone level"
	                  : "one ring");
	return KOLO_OK;
}

kolo_status_t kolo_runtime_hierarchy_setup(struct kolo_comm *comm, size_t local_segment_bytes)
{
	kolo_status_t st = host_level(comm, local_segment_bytes);
	return st == KOLO_OK ? zone_level(comm) : st;
}
