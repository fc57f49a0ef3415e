/* assign: rank assignment as Horovod computes it, plus stability (the caller
 * passes survivors first, in their old rank order). */
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

kolo_status_t kolo_rdzv_assign_all(const char *const *hosts, int n, struct kolo_rdzv_slot *out)
{
	if (n <= 0)
		return KOLO_OK;
	/* Host index of every worker, hosts numbered by first appearance. */
	size_t cap = 1;
	while (cap < (size_t)n * 2)
		cap <<= 1;
	int *table = malloc(cap * sizeof(*table)); /* open addressing: worker index */
	int *host_of = malloc((size_t)n * sizeof(*host_of));
	int *count = calloc((size_t)n, sizeof(*count)); /* per host */
	int *offset = malloc((size_t)n * sizeof(*offset));
	int *first = malloc((size_t)n * sizeof(*first)); /* per host: worker index */
	int *by_host = malloc((size_t)n * sizeof(*by_host));
	int *fill = calloc((size_t)n, sizeof(*fill));
	int *crank = malloc((size_t)n * sizeof(*crank));
	kolo_status_t st = KOLO_ENOMEM;
	if (!table || !host_of || !count || !offset || !first || !by_host || !fill || !crank)
		goto out;
	memset(table, -1, cap * sizeof(*table));
	int n_hosts = 0;
	for (int i = 0; i < n; i++) {
		size_t b = hash_str(hosts[i]) & (cap - 1);
		int h = -1;
		while (table[b] >= 0) {
			if (strcmp(hosts[table[b]], hosts[i]) == 0) {
				h = host_of[table[b]];
				break;
			}
			b = (b + 1) & (cap - 1);
		}
		if (h < 0) {
			h = n_hosts++;
			first[h] = i;
			table[b] = i;
		}
		host_of[i] = h;
		out[i].local_rank = count[h]++;
	}
	int max_local = 0;
	for (int h = 0, off = 0; h < n_hosts; h++) {
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
	/* cross_rank of (host h, local rank l) = hosts before h with more than l
	 * workers; cross_size(l) = all hosts with more than l workers. */
	for (int l = 0; l < max_local; l++) {
		int c = 0;
		for (int h = 0; h < n_hosts; h++) {
			if (count[h] > l)
				crank[by_host[offset[h] + l]] = c++;
		}
		for (int h = 0; h < n_hosts; h++) {
			if (count[h] > l) {
				int i = by_host[offset[h] + l];
				out[i].cross_rank = crank[i];
				out[i].cross_size = c;
			}
		}
	}
	st = KOLO_OK;
out:
	free(table);
	free(host_of);
	free(count);
	free(offset);
	free(first);
	free(by_host);
	free(fill);
	free(crank);
	return st;
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
