/* stall: the stall inspector's view of the negotiation. Names that some
 * ranks announced (or set a cache bit for) and others have not, how long
 * they have waited, and whether the ranks wait on each other for good. It
 * only reads the negotiator; the engine decides what to do (engine.c). */
#include "fusion_internal.h"

#include <stdlib.h>
#include <string.h>

struct stall_name {
	const char *name;
	const bool *has;
	uint64_t since;
};

static size_t collect_stalled(const struct fusion_negotiator *n, uint64_t now, uint64_t min_age,
                              struct stall_name **out)
{
	size_t cnt = 0, cap = n->ntab + (size_t)n->capacity;
	struct stall_name *v = calloc(cap ? cap : 1, sizeof(*v));
	*out = v;
	if (!v)
		return 0;
	for (size_t i = 0; i < n->ntab; i++) {
		const struct fusion_table_entry *t = &n->tab[i];
		if (t->first_ns + min_age <= now)
			v[cnt++] = (struct stall_name){t->name, t->has, t->first_ns};
	}
	for (int s = 0; s < n->capacity; s++) {
		const struct fusion_cache_slot *c = &n->cache[s];
		if (c->used && c->pending_since && c->pending_since + min_age <= now)
			v[cnt++] = (struct stall_name){c->name, c->had, c->pending_since};
	}
	return cnt;
}

bool fusion_negotiator_deadlocked(const struct fusion_negotiator *n, uint64_t now_ns,
                                  uint64_t min_age_ns)
{
	struct stall_name *v;
	size_t cnt = collect_stalled(n, now_ns, min_age_ns, &v);
	bool all_waiting = cnt > 0;
	for (int r = 0; r < n->size && all_waiting; r++) {
		bool waits = n->joined[r];
		for (size_t i = 0; i < cnt && !waits; i++)
			waits = v[i].has[r];
		all_waiting = waits;
	}
	free(v);
	return all_waiting;
}

void fusion_negotiator_stalled(const struct fusion_negotiator *n, uint64_t now_ns,
                               uint64_t min_age_ns, void (*fn)(void *arg, const char *name),
                               void *arg)
{
	struct stall_name *v;
	size_t cnt = collect_stalled(n, now_ns, min_age_ns, &v);
	for (size_t i = 0; i < cnt; i++)
		fn(arg, v[i].name);
	free(v);
}

size_t fusion_negotiator_stall_report(const struct fusion_negotiator *n, uint64_t now_ns,
                                      uint64_t min_age_ns, char *buf, size_t size)
{
	struct stall_name *v;
	size_t cnt = collect_stalled(n, now_ns, min_age_ns, &v);
	size_t o = 0;
	if (size)
		buf[0] = '\0';
	bool first_rank = true;
	for (int r = 0; r < n->size && o < size; r++) {
		if (n->joined[r])
			continue;
		int listed = 0;
		for (size_t i = 0; i < cnt && o < size; i++) {
			if (v[i].has[r])
				continue;
			if (listed == 0)
				o += (size_t)snprintf(buf + o, size - o, "%srank %d: [",
				                      first_rank ? "" : "; ", r);
			if (listed == 5) {
				o += (size_t)snprintf(buf + o, size - o, ", \xe2\x80\xa6");
				listed++;
				break;
			}
			if (o < size)
				o += (size_t)snprintf(buf + o, size - o, "%s%s", listed ? ", " : "",
				                      v[i].name);
			listed++;
		}
		if (listed && o < size) {
			o += (size_t)snprintf(buf + o, size - o, "]");
			first_rank = false;
		}
	}
	free(v);
	return cnt;
}
