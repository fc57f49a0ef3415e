/* cache: the response cache. A name that ran with every rank taking part
 * keeps a slot, the same slot on every rank; next time a rank submits it with
 * the same params it sends one bit instead of a REQUEST record. */
#include "fusion_internal.h"

#include <stdlib.h>
#include <string.h>

/* Rank r's view of a canonical params (what rank r would have submitted). */
static void rank_view(const struct fusion_negotiator *n, const struct fusion_params *canon, int r,
                      struct fusion_params *out)
{
	*out = *canon;
	if (canon->kind == KOLO_FK_ALLGATHER) {
		out->ncounts = 1;
		out->counts = canon->counts + r;
	} else if (canon->kind == KOLO_FK_ALLTOALL) {
		out->ncounts = (uint32_t)n->size;
		out->counts = canon->counts + (size_t)r * (size_t)n->size;
	}
}

int fusion_cache_find(const struct fusion_negotiator *n, const char *name)
{
	for (int s = 0; s < n->capacity; s++)
		if (n->cache[s].used && strcmp(n->cache[s].name, name) == 0)
			return s;
	return -1;
}

size_t fusion_negotiator_cache_size(const struct fusion_negotiator *n)
{
	size_t c = 0;
	for (int s = 0; s < n->capacity; s++)
		c += n->cache[s].used;
	return c;
}

void fusion_cache_evict(struct fusion_negotiator *n, int s)
{
	for (size_t i = 0; i < n->nloc; i++)
		if (n->loc[i].state == FUSION_LOCAL_CACHED && n->loc[i].slot == s) {
			n->loc[i].state = FUSION_LOCAL_NEW;
			n->loc[i].slot = -1;
		}
	fusion_cache_slot_clear(&n->cache[s]);
}

bool fusion_cache_accepts(int kind)
{
	return kind == KOLO_FK_ALLREDUCE || kind == KOLO_FK_ALLGATHER ||
	       kind == KOLO_FK_BROADCAST || kind == KOLO_FK_ALLTOALL ||
	       kind == KOLO_FK_REDUCESCATTER;
}

kolo_status_t fusion_cache_insert(struct fusion_negotiator *n, const char *name,
                                  const struct fusion_params *p, uint64_t *evictions)
{
	int s = -1;
	for (int i = 0; i < n->capacity; i++)
		if (!n->cache[i].used) {
			s = i;
			break;
		}
	if (s < 0) { /* least recently used; ties to the lowest slot */
		for (int i = 0; i < n->capacity; i++)
			if (s < 0 || n->cache[i].last_used < n->cache[s].last_used)
				s = i;
		fusion_cache_evict(n, s);
		(*evictions)++;
	}
	struct fusion_cache_slot *c = &n->cache[s];
	c->name = strdup(name);
	c->had = calloc((size_t)n->size, sizeof(bool));
	if (!c->name || !c->had || fusion_params_copy(&c->p, p) != KOLO_OK) {
		fusion_cache_slot_clear(c);
		return KOLO_ENOMEM;
	}
	c->used = true;
	c->last_used = n->cycle;
	return KOLO_OK;
}

void fusion_cache_slot_clear(struct fusion_cache_slot *c)
{
	free(c->name);
	free(c->had);
	fusion_params_fini(&c->p);
	memset(c, 0, sizeof(*c));
}

bool fusion_cache_matches_local(const struct fusion_negotiator *n, const struct fusion_local_op *l,
                                int s)
{
	struct fusion_params v;
	rank_view(n, &n->cache[s].p, n->rank, &v);
	return fusion_params_equal(&v, &l->p);
}
