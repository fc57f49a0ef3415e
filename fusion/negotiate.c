/* negotiate: this rank's side of the negotiation. The negotiator's life,
 * the queue of operations submitted here, and the control block and message
 * it sends each cycle (what every rank then decides from is in decide.c). */
#include "fusion_internal.h"

#include <stdlib.h>
#include <string.h>

/* ---- create / destroy --------------------------------------------------- */

kolo_status_t fusion_negotiator_create(int rank, int size, int cache_capacity,
                                       struct fusion_negotiator **out)
{
	*out = NULL;
	if (size < 1 || rank < 0 || rank >= size || cache_capacity < 0)
		return KOLO_EINVAL;
	struct fusion_negotiator *n = calloc(1, sizeof(*n));
	if (!n)
		return KOLO_ENOMEM;
	n->rank = rank;
	n->size = size;
	n->capacity = cache_capacity;
	n->joined = calloc((size_t)size, sizeof(bool));
	n->join_cycle = calloc((size_t)size, sizeof(uint64_t));
	n->cache = calloc((size_t)cache_capacity + 1, sizeof(struct fusion_cache_slot));
	n->evicted = calloc((size_t)cache_capacity + 1, sizeof(bool));
	if (!n->joined || !n->join_cycle || !n->cache || !n->evicted) {
		fusion_negotiator_destroy(n);
		return KOLO_ENOMEM;
	}
	*out = n;
	return KOLO_OK;
}

void fusion_negotiator_destroy(struct fusion_negotiator *n)
{
	if (!n)
		return;
	for (size_t i = 0; i < n->nloc; i++) {
		free(n->loc[i].name);
		fusion_params_fini(&n->loc[i].p);
	}
	free(n->loc);
	for (size_t i = 0; i < n->ntab; i++)
		fusion_table_entry_fini(&n->tab[i], n->size);
	free(n->tab);
	if (n->cache)
		for (int s = 0; s < n->capacity; s++)
			fusion_cache_slot_clear(&n->cache[s]);
	free(n->cache);
	for (size_t i = 0; i < n->nfails; i++) {
		free(n->fails[i].name);
		free(n->fails[i].why);
	}
	free(n->fails);
	free(n->joined);
	free(n->join_cycle);
	free(n->evicted);
	free(n);
}

/* ---- local queue -------------------------------------------------------- */

struct fusion_local_op *fusion_local_find(struct fusion_negotiator *n, const char *name)
{
	for (size_t i = 0; i < n->nloc; i++)
		if (strcmp(n->loc[i].name, name) == 0)
			return &n->loc[i];
	return NULL;
}

kolo_status_t fusion_negotiator_submit(struct fusion_negotiator *n, const char *name,
                                       const struct fusion_params *p, uint64_t id)
{
	if (!name || strlen(name) >= FUSION_NAME_MAX || fusion_local_find(n, name))
		return KOLO_EINVAL;
	if (!fusion_reserve(&n->loc, n->nloc, &n->caploc, sizeof(*n->loc)))
		return KOLO_ENOMEM;
	struct fusion_local_op *l = &n->loc[n->nloc];
	memset(l, 0, sizeof(*l));
	l->name = strdup(name);
	if (!l->name || fusion_params_copy(&l->p, p) != KOLO_OK) {
		free(l->name);
		return KOLO_ENOMEM;
	}
	l->id = id;
	l->submit_ns = kolo_now_ns();
	l->state = FUSION_LOCAL_NEW;
	l->slot = -1;
	n->nloc++;
	return KOLO_OK;
}

size_t fusion_negotiator_local_pending(const struct fusion_negotiator *n)
{
	return n->nloc;
}

void fusion_local_remove(struct fusion_negotiator *n, struct fusion_local_op *l)
{
	size_t i = (size_t)(l - n->loc);
	free(l->name);
	fusion_params_fini(&l->p);
	memmove(&n->loc[i], &n->loc[i + 1], (n->nloc - i - 1) * sizeof(*l));
	n->nloc--;
}

void fusion_negotiator_drain(struct fusion_negotiator *n, void (*fn)(void *arg, uint64_t id),
                             void *arg)
{
	while (n->nloc) {
		uint64_t id = n->loc[0].id;
		fusion_local_remove(n, &n->loc[0]);
		if (fn)
			fn(arg, id);
	}
}

/* ---- what this rank sends ------------------------------------------------ */

size_t fusion_negotiator_block_size(const struct fusion_negotiator *n)
{
	return FUSION_BLOCK_HDR + ((size_t)n->capacity + 7) / 8;
}

uint32_t fusion_negotiator_block_msg_len(const uint8_t *block)
{
	uint32_t v;
	memcpy(&v, block + 4, 4);
	return v;
}

void fusion_negotiator_set_params(struct fusion_negotiator *n, uint64_t fusion_threshold,
                                  double cycle_time_ms)
{
	n->send_params = true;
	n->p_threshold = fusion_threshold;
	n->p_cycle = cycle_time_ms;
}

kolo_status_t fusion_negotiator_fail_name(struct fusion_negotiator *n, const char *name,
                                          kolo_status_t st, const char *why)
{
	struct fusion_pending_fail *v = realloc(n->fails, (n->nfails + 1) * sizeof(*v));
	if (!v)
		return KOLO_ENOMEM;
	n->fails = v;
	v[n->nfails].name = strdup(name);
	v[n->nfails].why = strdup(why ? why : "");
	v[n->nfails].st = st;
	if (!v[n->nfails].name || !v[n->nfails].why) {
		free(v[n->nfails].name);
		free(v[n->nfails].why);
		return KOLO_ENOMEM;
	}
	n->nfails++;
	return KOLO_OK;
}

kolo_status_t fusion_negotiator_encode(struct fusion_negotiator *n, bool shutdown, uint8_t *block,
                                       uint8_t **msg, size_t *msg_len)
{
	struct fusion_wbuf w = {0};
	size_t bsz = fusion_negotiator_block_size(n);
	memset(block, 0, bsz);
	uint8_t *bits = block + FUSION_BLOCK_HDR;
	if (n->rank == 0) {
		if (n->send_params) {
			fusion_record_put_params(&w, n->p_threshold, n->p_cycle);
		}
		for (size_t i = 0; i < n->nfails; i++) {
			fusion_record_put_fail(&w, n->fails[i].st, n->fails[i].name,
			                       n->fails[i].why);
		}
	}
	for (size_t i = 0; i < n->nloc; i++) {
		struct fusion_local_op *l = &n->loc[i];
		if (l->state == FUSION_LOCAL_NEW) {
			int s = fusion_cache_accepts(l->p.kind) ? fusion_cache_find(n, l->name)
			                                        : -1;
			if (s >= 0 && fusion_cache_matches_local(n, l, s)) {
				l->state = FUSION_LOCAL_CACHED;
				l->slot = s;
			} else {
				fusion_record_put_request(&w, l->name, &l->p);
				l->state = FUSION_LOCAL_ANNOUNCED;
			}
		}
		if (l->state == FUSION_LOCAL_CACHED)
			bits[l->slot / 8] |= (uint8_t)(1u << (l->slot % 8));
	}
	if (w.oom) {
		free(w.b);
		return KOLO_ENOMEM;
	}
	if (w.len > UINT32_MAX) {
		free(w.b);
		return KOLO_EINVAL;
	}
	/* Control records are sent once. */
	n->send_params = false;
	for (size_t i = 0; i < n->nfails; i++) {
		free(n->fails[i].name);
		free(n->fails[i].why);
	}
	n->nfails = 0;
	uint32_t flags = shutdown ? FUSION_BLOCK_SHUTDOWN : 0, len = (uint32_t)w.len;
	flags |= n->wait_us << FUSION_BLOCK_AGE_SHIFT;
	memcpy(block, &flags, 4);
	memcpy(block + 4, &len, 4);
	*msg = w.b;
	*msg_len = w.len;
	return KOLO_OK;
}
