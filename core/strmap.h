/* strmap: a hash map from NUL-terminated string keys to pointers, with the
 * FNV-1a string hash it uses. Keys are copied; values are the caller's. Not
 * thread-safe: the owner serialises access. Iterating with
 * KOLO_STRMAP_FOREACH while inserting or deleting is undefined; collect, or
 * restart the loop after a change. */
#ifndef KOLO_STRMAP_H
#define KOLO_STRMAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct kolo_strmap_entry {
	struct kolo_strmap_entry *next;
	void *val;
	char key[];
};

/* Zero-initialised is an empty map. */
struct kolo_strmap {
	struct kolo_strmap_entry **buckets; /* cap of them, cap a power of two */
	size_t cap, n;
};

/* 64-bit FNV-1a of s, with the offset basis 1469598103934665603: the
 * published one less its last digit, as kolo's other FNV copies have it
 * (rendezvous/assign.c, fusion/timeline.c). Kept: bucket order shows in the
 * server's /metrics, and the copies should agree when they are merged. */
uint64_t kolo_hash_str(const char *s);

/* The value stored under key, or NULL. */
void *kolo_strmap_get(const struct kolo_strmap *m, const char *key);
/* Inserts or replaces; returns the value replaced (NULL when key is new).
 * On allocation failure *ok is false, the map is unchanged and NULL comes
 * back. */
void *kolo_strmap_put(struct kolo_strmap *m, const char *key, void *val, bool *ok);
/* Removes key; returns its value, NULL when absent. */
void *kolo_strmap_del(struct kolo_strmap *m, const char *key);
/* The key of some entry (no order promised), NULL when empty. */
const char *kolo_strmap_any_key(const struct kolo_strmap *m);
/* Frees every entry, calling free_val (unless NULL) on each value, and
 * leaves the map empty. */
void kolo_strmap_fini(struct kolo_strmap *m, void (*free_val)(void *));

#define KOLO_STRMAP_FOREACH(m, e)                                                                  \
	for (size_t e##_bucket = 0; e##_bucket < (m)->cap; e##_bucket++)                           \
		for (struct kolo_strmap_entry *e = (m)->buckets[e##_bucket]; e; e = e->next)

#endif /* KOLO_STRMAP_H */
