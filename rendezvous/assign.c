/* assign: rank assignment as Horovod computes it, plus stability (the caller
 * passes survivors first, in their old rank order) and zones (hosts of one
 * zone get contiguous ranks). */
#include "rendezvous.h"

#include <stdlib.h>
#include <string.h>

static uint64_t hash_str(const char *s)
{
	uint64_t h = 1469598103934665603ULL;
	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 1099511628211ULL;
	return h;
}

/* Numbers the distinct strings of keys[0..n) by first appearance: id[i] is
 * the number of keys[i]; returns how many there are, -1 without memory. */
static int number_by_first(const char *const *keys, int n, int *id)
{
	size_t cap = 1;
	while (cap < (size_t)n * 2)
		cap <<= 1;
	int *table = malloc(cap * sizeof(*table)); /* open addressing: index into keys */
	if (!table)
		return -1;
	memset(table, -1, cap * sizeof(*table));
	int n_ids = 0;
	for (int i = 0; i < n; i++) {
		size_t b = hash_str(keys[i]) & (cap - 1);
		id[i] = -1;
		while (table[b] >= 0) {
			if (strcmp(keys[table[b]], keys[i]) == 0) {
				id[i] = id[table[b]];
				break;
			}
			b = (b + 1) & (cap - 1);
		}
		if (id[i] < 0) {
			id[i] = n_ids++;
			table[b] = i;
		}
	}
	free(table);
	return n_ids;
}

/* order[0..n_hosts): the hosts grouped by zone, zones in order of their first
 * host, hosts within a zone in their own order (a stable sort by zone). The
 * zone of a host is the zone of its first worker. */
static kolo_status_t order_hosts(const char *const *zones, const int *host_of, int n, int n_hosts,
                                 int *order)
{
	const char **hzone = malloc((size_t)n_hosts * sizeof(*hzone));
	int *zid = malloc((size_t)n_hosts * sizeof(*zid));
	int *start = calloc((size_t)n_hosts + 1, sizeof(*start));
	kolo_status_t st = KOLO_ENOMEM;
	if (!hzone || !zid || !start)
		goto out;
	for (int h = 0; h < n_hosts; h++)
		hzone[h] = NULL;
	for (int i = 0; i < n; i++) {
		if (!hzone[host_of[i]])
			hzone[host_of[i]] = zones && zones[i] ? zones[i] : "";
	}
	int n_zones = number_by_first(hzone, n_hosts, zid);
	if (n_zones < 0)
		goto out;
	for (int h = 0; h < n_hosts; h++)
		start[zid[h] + 1]++;
	for (int z = 0; z < n_zones; z++)
		start[z + 1] += start[z];
	for (int h = 0; h < n_hosts; h++)
		order[start[zid[h]]++] = h;
	st = KOLO_OK;
out:
	free(hzone);
	free(zid);
	free(start);
	return st;
}

/* cross_rank of (host h, local rank l) = hosts before h with more than l
 * workers; cross_size(l) = all hosts with more than l workers. by_host lists
 * workers host after host (in rank order), offset[h] is h's first. */
static void cross_ranks(const int *order, const int *count, const int *offset, const int *by_host,
                        int n_hosts, int max_local, struct kolo_rdzv_slot *out)
{
	for (int l = 0; l < max_local; l++) {
		int c = 0;
		for (int k = 0; k < n_hosts; k++) {
			int h = order[k];
			if (count[h] > l)
				out[by_host[offset[h] + l]].cross_rank = c++;
		}
		for (int k = 0; k < n_hosts; k++) {
			int h = order[k];
			if (count[h] > l)
				out[by_host[offset[h] + l]].cross_size = c;
		}
	}
}

kolo_status_t kolo_rdzv_assign_zoned(const char *const *hosts, const char *const *zones, int n,
                                     struct kolo_rdzv_slot *out)
{
	if (n <= 0)
		return KOLO_OK;
	int *host_of = malloc((size_t)n * sizeof(*host_of));
	int *count = calloc((size_t)n, sizeof(*count)); /* per host */
	int *offset = malloc((size_t)n * sizeof(*offset));
	int *order = malloc((size_t)n * sizeof(*order)); /* hosts in rank order */
	int *by_host = malloc((size_t)n * sizeof(*by_host));
	int *fill = calloc((size_t)n, sizeof(*fill));
	kolo_status_t st = KOLO_ENOMEM;
	if (!host_of || !count || !offset || !order || !by_host || !fill)
		goto out;
	int n_hosts = number_by_first(hosts, n, host_of);
	if (n_hosts < 0 || order_hosts(zones, host_of, n, n_hosts, order) != KOLO_OK)
		goto out;
	for (int i = 0; i < n; i++)
		out[i].local_rank = count[host_of[i]]++;
	int max_local = 0;
	for (int k = 0, off = 0; k < n_hosts; k++) {
		int h = order[k];
		offset[h] = off;
		off += count[h];
		max_local = KOLO_MAX(max_local, count[h]);
	}
	for (int i = 0; i < n; i++) {
		int h = host_of[i];
		out[i].rank = offset[h] + out[i].local_rank;
		out[i].size = n;
		out[i].local_size = count[h];
		by_host[offset[h] + fill[h]++] = i;
	}
	cross_ranks(order, count, offset, by_host, n_hosts, max_local, out);
	st = KOLO_OK;
out:
	free(host_of);
	free(count);
	free(offset);
	free(order);
	free(by_host);
	free(fill);
	return st;
}

kolo_status_t kolo_rdzv_assign_all(const char *const *hosts, int n, struct kolo_rdzv_slot *out)
{
	return kolo_rdzv_assign_zoned(hosts, NULL, n, out);
}

void kolo_rdzv_assign(const char *const *hosts, int n, int index, struct kolo_rdzv_assignment *out,
                      int *rank_of_index)
{
	memset(out, 0, sizeof(*out));
	out->rank = -1;
	if (n <= 0)
		return;
	struct kolo_rdzv_slot *slots = calloc((size_t)n, sizeof(*slots));
	if (!slots || kolo_rdzv_assign_all(hosts, n, slots) != KOLO_OK) {
		free(slots);
		return;
	}
	if (index >= 0 && index < n) {
		out->rank = slots[index].rank;
		out->size = slots[index].size;
		out->local_rank = slots[index].local_rank;
		out->local_size = slots[index].local_size;
		out->cross_rank = slots[index].cross_rank;
		out->cross_size = slots[index].cross_size;
	}
	out->n_members = n;
	if (rank_of_index) {
		for (int i = 0; i < n; i++)
			rank_of_index[i] = slots[i].rank;
	}
	free(slots);
}

void kolo_rdzv_assignment_fini(struct kolo_rdzv_assignment *a)
{
	if (!a)
		return;
	free(a->members);
	a->members = NULL;
	a->n_members = 0;
}

/* Whether the zone of members[r] is the zone that starts at `start`. */
static bool same_zone(const struct kolo_rdzv_member *m, int r, int start)
{
	return m[r].zone[0] && m[r].rank == r && strcmp(m[r].zone, m[start].zone) == 0;
}

int kolo_rdzv_zone_count(const struct kolo_rdzv_member *members, int n, int group)
{
	if (!members || group < 1 || n < 2 || n % group != 0)
		return 0;
	int zones = 0, size = 0; /* size: the ranks of every zone */
	for (int start = 0; start < n; zones++) {
		int end = start;
		while (end < n && same_zone(members, end, start))
			end++;
		if (end == start || (size && end - start != size))
			return 0; /* no zone, or zones of different sizes */
		size = end - start;
		for (int q = 0; q < start; q += size) /* a zone seen before: not contiguous */
			if (strcmp(members[q].zone, members[start].zone) == 0)
				return 0;
		start = end;
	}
	return zones >= 2 && size % group == 0 && size / group >= 2 ? zones : 0;
}
