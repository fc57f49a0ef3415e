/* strmap: chained buckets, doubled when the load passes one half. */
#include "strmap.h"

#include <stdlib.h>
#include <string.h>

#define STRMAP_FIRST_CAP 64

uint64_t kolo_hash_str(const char *s)
{
	uint64_t h = 1469598103934665603ULL;
	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 1099511628211ULL;
	return h;
}

/* The link that points at key's entry, or at the NULL where it would go;
 * NULL when the map has no buckets yet. */
static struct kolo_strmap_entry **strmap_link(const struct kolo_strmap *m, const char *key)
{
	if (!m->cap)
		return NULL;
	struct kolo_strmap_entry **p = &m->buckets[kolo_hash_str(key) & (m->cap - 1)];
	while (*p && strcmp((*p)->key, key) != 0)
		p = &(*p)->next;
	return p;
}

void *kolo_strmap_get(const struct kolo_strmap *m, const char *key)
{
	struct kolo_strmap_entry **p = strmap_link(m, key);
	return p && *p ? (*p)->val : NULL;
}

static bool strmap_grow(struct kolo_strmap *m)
{
	size_t cap = m->cap ? m->cap * 2 : STRMAP_FIRST_CAP;
	struct kolo_strmap_entry **b = calloc(cap, sizeof(*b));
	if (!b)
		return false;
	for (size_t i = 0; i < m->cap; i++) {
		for (struct kolo_strmap_entry *e = m->buckets[i], *nx; e; e = nx) {
			nx = e->next;
			struct kolo_strmap_entry **p = &b[kolo_hash_str(e->key) & (cap - 1)];
			e->next = *p;
			*p = e;
		}
	}
	free(m->buckets);
	m->buckets = b;
	m->cap = cap;
	return true;
}

void *kolo_strmap_put(struct kolo_strmap *m, const char *key, void *val, bool *ok)
{
	*ok = true;
	if ((m->n + 1) * 2 > m->cap && !strmap_grow(m)) {
		*ok = false;
		return NULL;
	}
	struct kolo_strmap_entry **p = strmap_link(m, key);
	if (*p) {
		void *old = (*p)->val;
		(*p)->val = val;
		return old;
	}
	size_t key_size = strlen(key) + 1;
	struct kolo_strmap_entry *e = malloc(sizeof(*e) + key_size);
	if (!e) {
		*ok = false;
		return NULL;
	}
	memcpy(e->key, key, key_size);
	e->val = val;
	e->next = NULL;
	*p = e;
	m->n++;
	return NULL;
}

void *kolo_strmap_del(struct kolo_strmap *m, const char *key)
{
	struct kolo_strmap_entry **p = strmap_link(m, key);
	if (!p || !*p)
		return NULL;
	struct kolo_strmap_entry *e = *p;
	void *v = e->val;
	*p = e->next;
	free(e);
	m->n--;
	return v;
}

const char *kolo_strmap_any_key(const struct kolo_strmap *m)
{
	for (size_t i = 0; i < m->cap; i++) {
		if (m->buckets[i])
			return m->buckets[i]->key;
	}
	return NULL;
}

void kolo_strmap_fini(struct kolo_strmap *m, void (*free_val)(void *))
{
	for (size_t i = 0; i < m->cap; i++) {
		for (struct kolo_strmap_entry *e = m->buckets[i], *nx; e; e = nx) {
			nx = e->next;
			if (free_val)
				free_val(e->val);
			free(e);
		}
	}
	free(m->buckets);
	memset(m, 0, sizeof(*m));
}
