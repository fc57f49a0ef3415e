/* The comm: its lifecycle and getters, how it fails, and the entry checks
 * every collective runs first. The collectives themselves are in the other
 * ring_*.c files (ring_internal.h lists them); docs/collectives.md describes
 * the algorithms, their costs and the thresholds between them.
 *
 * On any failure every conn is closed with a reset (so the peers fail fast
 * too, and no request keeps pointing into a caller's buffer) and the comm
 * stays failed: every later call returns the same status. */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ring_internal.h"

#define SUBSYS "ring"

/* ---- failure ---------------------------------------------------------- */

static void close_all(struct kolo_ring_comm *rc)
{
	for (int i = 0; i < rc->size; i++) {
		if (rc->conns[i]) {
			rc->t->ops->close(rc->conns[i]);
			rc->conns[i] = NULL;
		}
	}
}

__attribute__((format(printf, 3, 4))) kolo_status_t
ring_fail(struct kolo_ring_comm *rc, kolo_status_t st, const char *fmt, ...)
{
	int expected = KOLO_OK;
	if (atomic_compare_exchange_strong(&rc->status, &expected, (int)st)) {
		char msg[KOLO_ERRBUF_SIZE - 128]; /* room for the prefix */
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(msg, sizeof(msg), fmt, ap);
		va_end(ap);
		snprintf(rc->err.msg, sizeof(rc->err.msg), "%.32s on rank %d: %s (%.20s)", rc->coll,
		         ring_global_rank(rc, rc->rank), msg, kolo_status_name(st));
		KOLO_WARN(SUBSYS, "%s", rc->err.msg);
		close_all(rc);
	}
	return (kolo_status_t)atomic_load(&rc->status);
}

kolo_status_t ring_peer_fail(struct kolo_ring_comm *rc, kolo_status_t st, int peer,
                             const char *what)
{
	if (atomic_load(&rc->aborted) != KOLO_OK)
		return ring_fail(rc, st, "aborted while %s rank %d", what,
		                 ring_global_rank(rc, peer));
	if (atomic_load(&rc->status) == KOLO_OK) {
		int none = -1;
		atomic_compare_exchange_strong(&rc->failed_peer, &none, ring_global_rank(rc, peer));
	}
	return ring_fail(rc, st, "%s rank %d: %s", what, ring_global_rank(rc, peer),
	                 rc->t->err.msg[0] ? rc->t->err.msg : kolo_strerror(st));
}

kolo_status_t ring_blame(struct kolo_ring_comm *rc, kolo_status_t st, int peer)
{
	if (st == KOLO_ETIMEDOUT && atomic_load(&rc->aborted) == KOLO_OK) {
		int none = -1;
		atomic_compare_exchange_strong(&rc->failed_peer, &none, ring_global_rank(rc, peer));
	}
	return st;
}

kolo_status_t ring_scratch_reserve(struct kolo_ring_comm *rc, size_t bytes)
{
	if (bytes <= rc->scratch_size)
		return KOLO_OK;
	char *p = realloc(rc->scratch, bytes);
	if (!p)
		return ring_fail(rc, KOLO_ENOMEM, "cannot allocate %zu bytes of scratch", bytes);
	rc->scratch = p;
	rc->scratch_size = bytes;
	return KOLO_OK;
}

/* ---- comm ------------------------------------------------------------- */

kolo_status_t kolo_ring_comm_create(const struct kolo_ring_config *cfg, struct kolo_ring_comm **out,
                                    struct kolo_errbuf *eb)
{
	*out = NULL;
	if (!cfg || cfg->size < 1 || cfg->rank < 0 || cfg->rank >= cfg->size ||
	    (cfg->size > 1 && (!cfg->transport || !cfg->lookup)))
		return kolo_fail(eb, KOLO_EINVAL, "ring: invalid configuration");
	struct kolo_ring_comm *rc = calloc(1, sizeof(*rc));
	if (!rc)
		return kolo_fail(eb, KOLO_ENOMEM, "ring: out of memory");
	rc->cfg = *cfg;
	rc->cfg.small_direct_ranks = KOLO_MIN(cfg->small_direct_ranks, KOLO_RING_DIRECT_MAX_RANKS);
	rc->cfg.ranks = NULL; /* not kept: the copy is gmap */
	rc->tag = KOLO_RING_TAG + cfg->tag_base;
	if (cfg->ranks) {
		if (!(rc->gmap = malloc((size_t)cfg->size * sizeof(*rc->gmap)))) {
			free(rc);
			return kolo_fail(eb, KOLO_ENOMEM, "ring: out of memory");
		}
		memcpy(rc->gmap, cfg->ranks, (size_t)cfg->size * sizeof(*rc->gmap));
	}
	if (rc->cfg.segment_bytes == 0)
		rc->cfg.segment_bytes = 262144;
	if (rc->cfg.spin_us < 0)
		rc->cfg.spin_us = 0;
	rc->t = cfg->transport;
	rc->rank = cfg->rank;
	rc->size = cfg->size;
	atomic_init(&rc->status, KOLO_OK);
	atomic_init(&rc->aborted, KOLO_OK);
	atomic_init(&rc->failed_peer, -1);
	rc->coll = "create";
	rc->conns = calloc((size_t)rc->size, sizeof(*rc->conns));
	if (!rc->conns) {
		free(rc->gmap);
		free(rc);
		return kolo_fail(eb, KOLO_ENOMEM, "ring: out of memory");
	}
	if (rc->size > 1) {
		int nb[2] = {ring_wrap(rc->rank - 1, rc->size), ring_wrap(rc->rank + 1, rc->size)};
		kolo_status_t st = ring_ensure_conns(rc, nb, 2);
		if (st != KOLO_OK) {
			kolo_fail(eb, st, "%s", rc->err.msg);
			kolo_ring_comm_destroy(rc);
			return st;
		}
	}
	*out = rc;
	return KOLO_OK;
}

void kolo_ring_comm_destroy(struct kolo_ring_comm *rc)
{
	if (!rc)
		return;
	ring_hier_destroy(rc->hier);
	if (rc->conns)
		close_all(rc);
	free(rc->conns);
	free(rc->gmap);
	free(rc->scratch);
	free(rc->work);
	free(rc);
}

void kolo_ring_comm_tune(struct kolo_ring_comm *rc, size_t small_allreduce_bytes,
                         size_t segment_bytes)
{
	if (!rc)
		return;
	rc->cfg.small_allreduce_bytes = small_allreduce_bytes;
	if (segment_bytes > 0)
		rc->cfg.segment_bytes = segment_bytes;
}

const char *kolo_ring_last_error(const struct kolo_ring_comm *rc)
{
	return rc ? rc->err.msg : "";
}

int kolo_ring_failed_peer(const struct kolo_ring_comm *rc)
{
	return rc ? atomic_load(&rc->failed_peer) : -1;
}

void kolo_ring_abort(struct kolo_ring_comm *rc, kolo_status_t st)
{
	if (!rc)
		return;
	if (st == KOLO_OK)
		st = KOLO_ECLOSED;
	int expected = KOLO_OK;
	atomic_compare_exchange_strong(&rc->aborted, &expected, (int)st);
	ring_hier_abort(rc->hier, st);
	if (rc->t)
		rc->t->ops->abort(rc->t, st);
}

kolo_status_t kolo_ring_comm_fail(struct kolo_ring_comm *rc, kolo_status_t st, int failed_peer,
                                  const char *msg)
{
	if (!rc)
		return st;
	if (failed_peer >= 0 && atomic_load(&rc->status) == KOLO_OK) {
		int none = -1;
		atomic_compare_exchange_strong(&rc->failed_peer, &none, failed_peer);
	}
	if (st == KOLO_OK)
		st = KOLO_ECLOSED;
	int expected = KOLO_OK;
	if (atomic_compare_exchange_strong(&rc->status, &expected, (int)st)) {
		/* msg already names the collective, the rank and the cause. */
		snprintf(rc->err.msg, sizeof(rc->err.msg), "%s", msg);
		close_all(rc);
	}
	kolo_status_t out = (kolo_status_t)atomic_load(&rc->status);
	ring_hier_fail(rc->hier, out);
	return out;
}

kolo_status_t kolo_ring_comm_status(const struct kolo_ring_comm *rc)
{
	return rc ? (kolo_status_t)atomic_load(&rc->status) : KOLO_EINVAL;
}

int kolo_ring_comm_rank(const struct kolo_ring_comm *rc)
{
	return rc ? rc->rank : -1;
}

int kolo_ring_comm_size(const struct kolo_ring_comm *rc)
{
	return rc ? rc->size : 0;
}

struct kolo_transport *kolo_ring_comm_transport(const struct kolo_ring_comm *rc)
{
	return rc ? rc->t : NULL;
}

const struct kolo_ring_config *kolo_ring_comm_config(const struct kolo_ring_comm *rc)
{
	return &rc->cfg;
}

enum kolo_ring_algo kolo_ring_allreduce_algo(const struct kolo_ring_comm *rc, size_t bytes)
{
	if (rc->hier)
		return ring_hier_choose(rc->hier, bytes);
	return bytes <= rc->cfg.small_allreduce_bytes ? KOLO_RING_ALGO_SMALL : KOLO_RING_ALGO_RING;
}

bool kolo_ring_hier_costs(const struct kolo_ring_comm *rc, struct kolo_ring_link_cost *shm,
                          struct kolo_ring_link_cost *net)
{
	return rc && ring_hier_costs_of(rc->hier, shm, net);
}

void ring_set_hier(struct kolo_ring_comm *rc, struct kolo_ring_hier *h)
{
	ring_hier_destroy(rc->hier);
	rc->hier = h;
}

__attribute__((format(printf, 2, 3))) kolo_status_t ring_bad_arg(struct kolo_ring_comm *rc,
                                                                 const char *fmt, ...)
{
	char msg[KOLO_ERRBUF_SIZE - 64];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	snprintf(rc->err.msg, sizeof(rc->err.msg), "%.32s: %s", rc->coll, msg);
	return KOLO_EINVAL;
}

kolo_status_t ring_enter(struct kolo_ring_comm *rc, const char *coll, kolo_dtype_t dtype)
{
	if (!rc)
		return KOLO_EINVAL;
	int st = atomic_load(&rc->status);
	if (st != KOLO_OK)
		return (kolo_status_t)st;
	rc->coll = coll;
	int ab = atomic_load(&rc->aborted);
	if (ab != KOLO_OK)
		return ring_fail(rc, (kolo_status_t)ab, "aborted");
	if (kolo_dtype_size(dtype) == 0)
		return ring_bad_arg(rc, "invalid dtype %d", (int)dtype);
	return KOLO_OK;
}
