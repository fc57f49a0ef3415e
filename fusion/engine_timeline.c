/* engine_timeline: the engine's events on the timeline (rank 0 writes it)
 * and starting or stopping it while the engine runs. tl_lock guards e->tl:
 * the engine thread writes events while a caller may swap the timeline. */
#include "fusion_internal.h"

#include <stdlib.h>
#include <string.h>

static uint64_t now_us(void)
{
	return kolo_now_ns() / 1000;
}

/* ---- the names whose negotiation is open -------------------------------- */

static bool name_set_has(const struct fusion_name_set *s, const char *name)
{
	for (size_t i = 0; i < s->n; i++)
		if (strcmp(s->v[i], name) == 0)
			return true;
	return false;
}

static void name_set_add(struct fusion_name_set *s, const char *name)
{
	if (name_set_has(s, name))
		return;
	if (!fusion_reserve(&s->v, s->n, &s->cap, sizeof(*s->v)))
		return;
	char *c = strdup(name);
	if (c)
		s->v[s->n++] = c;
}

static bool name_set_del(struct fusion_name_set *s, const char *name)
{
	for (size_t i = 0; i < s->n; i++)
		if (strcmp(s->v[i], name) == 0) {
			free(s->v[i]);
			s->v[i] = s->v[--s->n];
			return true;
		}
	return false;
}

static void name_set_clear(struct fusion_name_set *s)
{
	for (size_t i = 0; i < s->n; i++)
		free(s->v[i]);
	free(s->v);
	memset(s, 0, sizeof(*s));
}

/* ---- events ------------------------------------------------------------- */

bool fusion_engine_tl_on(struct kolo_engine *e)
{
	pthread_mutex_lock(&e->tl_lock);
	bool on = e->tl != NULL;
	pthread_mutex_unlock(&e->tl_lock);
	return on;
}

void fusion_engine_tl_begin(struct kolo_engine *e, const char *name, const char *activity)
{
	pthread_mutex_lock(&e->tl_lock);
	if (e->tl)
		fusion_timeline_begin(e->tl, name, activity, now_us());
	pthread_mutex_unlock(&e->tl_lock);
}

void fusion_engine_tl_end(struct kolo_engine *e, const char *name)
{
	pthread_mutex_lock(&e->tl_lock);
	if (e->tl)
		fusion_timeline_end(e->tl, name, now_us());
	pthread_mutex_unlock(&e->tl_lock);
}

void fusion_engine_tl_cycle(struct kolo_engine *e, const struct fusion_cycle *c)
{
	pthread_mutex_lock(&e->tl_lock);
	if (e->tl) {
		uint64_t ts = now_us();
		if (c->nresp || c->nticks)
			fusion_timeline_mark_cycle(e->tl, ts);
		for (size_t i = 0; i < c->nticks; i++) {
			const struct fusion_tick *t = &c->ticks[i];
			if (!name_set_has(&e->tl_open, t->name)) {
				name_set_add(&e->tl_open, t->name);
				fusion_timeline_negotiate_begin(e->tl, t->name, t->kind, ts);
			}
			fusion_timeline_rank_ready(e->tl, t->name, t->rank, ts);
		}
		for (size_t i = 0; i < c->nresp; i++)
			if (name_set_del(&e->tl_open, c->resp[i].name)) {
				fusion_timeline_negotiate_end(e->tl, c->resp[i].name, ts);
				fusion_timeline_begin(e->tl, c->resp[i].name, "QUEUE", ts);
			} else {
				fusion_timeline_begin(e->tl, c->resp[i].name, "QUEUE", ts);
			}
	}
	pthread_mutex_unlock(&e->tl_lock);
}

/* ---- start / stop -------------------------------------------------------- */

/* Puts t (NULL: none) in place of the timeline, forgetting the open names,
 * and closes the old one outside the lock (it flushes to its file). */
static void swap_timeline(struct kolo_engine *e, struct fusion_timeline *t)
{
	pthread_mutex_lock(&e->tl_lock);
	struct fusion_timeline *old = e->tl;
	e->tl = t;
	name_set_clear(&e->tl_open);
	pthread_mutex_unlock(&e->tl_lock);
	fusion_timeline_destroy(old);
}

kolo_status_t kolo_engine_timeline_start(struct kolo_engine *e, const char *path,
                                         struct kolo_errbuf *eb)
{
	if (!e || !path || !path[0])
		return kolo_fail(eb, KOLO_EINVAL, "timeline: no path");
	if (e->rank != 0)
		return KOLO_OK;
	struct fusion_timeline *t;
	kolo_status_t st =
	        fusion_timeline_create(path, 1u << 20, e->cfg.timeline_mark_cycles, &t, eb);
	if (st != KOLO_OK)
		return st;
	swap_timeline(e, t);
	return KOLO_OK;
}

kolo_status_t kolo_engine_timeline_stop(struct kolo_engine *e)
{
	if (!e)
		return KOLO_EINVAL;
	swap_timeline(e, NULL);
	return KOLO_OK;
}

void fusion_engine_tl_fini(struct kolo_engine *e)
{
	swap_timeline(e, NULL);
}
