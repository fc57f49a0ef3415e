/* decide: what every rank computes from the gathered control blocks and
 * messages, the same on every rank. Records are decoded (record.c) and
 * applied to the table of announced names; then cached operations whose bits
 * every rank set, and announced names every rank has sent, become this
 * cycle's responses, in an order all ranks agree on. */
#include "fusion_internal.h"

#include <stdlib.h>
#include <string.h>

/* ---- the table ---------------------------------------------------------- */

void fusion_table_entry_fini(struct fusion_table_entry *t, int size)
{
	free(t->name);
	free(t->has);
	if (t->p)
		for (int r = 0; r < size; r++)
			fusion_params_fini(&t->p[r]);
	free(t->p);
}

static struct fusion_table_entry *table_find(struct fusion_negotiator *n, const char *name)
{
	for (size_t i = 0; i < n->ntab; i++)
		if (strcmp(n->tab[i].name, name) == 0)
			return &n->tab[i];
	return NULL;
}

static struct fusion_table_entry *table_add(struct fusion_negotiator *n, char *name, int kind,
                                            uint64_t now)
{
	if (!fusion_reserve(&n->tab, n->ntab, &n->captab, sizeof(*n->tab)))
		return NULL;
	struct fusion_table_entry *t = &n->tab[n->ntab];
	memset(t, 0, sizeof(*t));
	t->has = calloc((size_t)n->size, sizeof(bool));
	t->p = calloc((size_t)n->size, sizeof(*t->p));
	if (!t->has || !t->p) {
		free(t->has);
		free(t->p);
		return NULL;
	}
	t->name = name;
	t->kind = kind;
	t->first_ns = now;
	n->ntab++;
	return t;
}

static void table_remove(struct fusion_negotiator *n, struct fusion_table_entry *t)
{
	size_t i = (size_t)(t - n->tab);
	fusion_table_entry_fini(t, n->size);
	memmove(&n->tab[i], &n->tab[i + 1], (n->ntab - i - 1) * sizeof(*t));
	n->ntab--;
}

/* ---- the cycle's outcome ------------------------------------------------- */

/* Fills the responses and ticks of a fusion_cycle; oom is sticky. */
struct cycle_builder {
	struct fusion_cycle *c;
	size_t capr, capt;
	bool oom;
};

static struct fusion_response *add_response(struct cycle_builder *ob)
{
	struct fusion_cycle *c = ob->c;
	if (!fusion_reserve(&c->resp, c->nresp, &ob->capr, sizeof(*c->resp))) {
		ob->oom = true;
		return NULL;
	}
	struct fusion_response *r = &c->resp[c->nresp++];
	memset(r, 0, sizeof(*r));
	r->cache_slot = -1;
	r->last_rank = -1;
	return r;
}

static void add_tick(struct cycle_builder *ob, const char *name, int kind, int rank)
{
	struct fusion_cycle *c = ob->c;
	if (!fusion_reserve(&c->ticks, c->nticks, &ob->capt, sizeof(*c->ticks))) {
		ob->oom = true;
		return;
	}
	/* A copy: the table entry or cache slot may go later in this cycle. */
	char *copy = strdup(name);
	if (!copy) {
		ob->oom = true;
		return;
	}
	c->ticks[c->nticks++] = (struct fusion_tick){copy, kind, rank};
}

/* When this rank has resp queued (announced or cached), gives the response
 * its id and takes it off the local queue. */
static void claim_local(struct fusion_negotiator *n, struct fusion_response *resp)
{
	struct fusion_local_op *l = fusion_local_find(n, resp->name);
	if (l && (l->state == FUSION_LOCAL_ANNOUNCED || l->state == FUSION_LOCAL_CACHED)) {
		resp->local = true;
		resp->local_id = l->id;
		uint64_t us =
		        n->decide_ns > l->submit_ns ? (n->decide_ns - l->submit_ns) / 1000u : 0;
		us = KOLO_MAX(KOLO_MIN(us, (uint64_t)FUSION_BLOCK_AGE_MAX), 1u);
		n->wait_us = KOLO_MAX(n->wait_us, (uint32_t)us);
		fusion_local_remove(n, l);
	}
}

static kolo_status_t fail_response(struct fusion_negotiator *n, struct cycle_builder *ob,
                                   const char *name, const struct fusion_params *p,
                                   kolo_status_t st, const char *msg)
{
	struct fusion_response *r = add_response(ob);
	if (!r)
		return KOLO_ENOMEM;
	r->name = strdup(name);
	r->status = st;
	r->errmsg = strdup(msg);
	if (!r->name || !r->errmsg)
		return KOLO_ENOMEM;
	if (p && fusion_params_copy(&r->p, p) != KOLO_OK)
		return KOLO_ENOMEM;
	claim_local(n, r);
	return KOLO_OK;
}

/* The response for an entry every rank has announced: a failure when their
 * params disagree, or when a rank has joined and the kind needs every rank. */
static kolo_status_t table_response(struct fusion_negotiator *n, struct cycle_builder *ob,
                                    struct fusion_table_entry *t)
{
	int size = n->size, first = -1;
	for (int r = 0; r < size; r++)
		if (t->has[r]) {
			first = r;
			break;
		}
	if (first < 0 || size <= 0)
		return KOLO_EPROTO;
	const struct fusion_params **pp = calloc((size_t)size, sizeof(*pp));
	if (!pp)
		return KOLO_ENOMEM;
	for (int r = 0; r < size; r++)
		pp[r] = &t->p[r];
	char msg[KOLO_ERRBUF_SIZE];
	kolo_status_t st = KOLO_OK;
	bool bad = fusion_describe_mismatch(t->name, pp, t->has, size, msg, sizeof(msg));
	free(pp);
	if (bad) {
		st = fail_response(n, ob, t->name, &t->p[first], KOLO_EMISMATCH, msg);
		return st;
	}
	int kind = t->p[first].kind;
	if (kind != KOLO_FK_JOIN && kind != KOLO_FK_ALLREDUCE && kind != KOLO_FK_GROUP) {
		for (int r = 0; r < size; r++)
			if (!t->has[r]) {
				snprintf(msg, sizeof(msg),
				         "%s '%s' is not supported while rank %d has joined "
				         "(kolo_join): only allreduces are",
				         fusion_kind_name(kind), t->name, r);
				return fail_response(n, ob, t->name, &t->p[first],
				                     KOLO_EUNSUPPORTED, msg);
			}
	}
	struct fusion_response *resp = add_response(ob);
	if (!resp)
		return KOLO_ENOMEM;
	resp->name = strdup(t->name);
	if (!resp->name)
		return KOLO_ENOMEM;
	if (kind == KOLO_FK_ALLGATHER || kind == KOLO_FK_ALLTOALL) {
		size_t per = kind == KOLO_FK_ALLGATHER ? 1 : (size_t)size;
		resp->p = t->p[first];
		resp->p.ncounts = (uint32_t)(per * (size_t)size);
		resp->p.counts = calloc(per * (size_t)size, sizeof(uint64_t));
		if (!resp->p.counts)
			return KOLO_ENOMEM;
		for (int r = 0; r < size; r++)
			memcpy(resp->p.counts + (size_t)r * per, t->p[r].counts,
			       per * sizeof(uint64_t));
	} else if (fusion_params_copy(&resp->p, &t->p[first]) != KOLO_OK) {
		return KOLO_ENOMEM;
	}
	if (kind == KOLO_FK_JOIN) {
		uint64_t best = 0;
		for (int r = 0; r < size; r++)
			if (n->join_cycle[r] >= best) {
				best = n->join_cycle[r];
				resp->last_rank = r;
			}
	}
	claim_local(n, resp);
	return KOLO_OK;
}

/* ---- applying the records ------------------------------------------------ */

/* Rank r announced rec (a REQUEST): into the table, taking rec's name and
 * params. An announcement of a cached name means its params changed: every
 * rank drops the slot, and the ranks that had it pending announce it again. */
static kolo_status_t apply_request(struct fusion_negotiator *n, struct cycle_builder *ob, int r,
                                   struct fusion_record *rec, uint64_t now)
{
	if (rec->p.kind == KOLO_FK_JOIN) {
		n->joined[r] = true;
		n->join_cycle[r] = n->cycle;
	}
	int s = fusion_cache_find(n, rec->name);
	if (s >= 0 && !n->evicted[s]) {
		fusion_cache_evict(n, s);
		n->evicted[s] = true;
		ob->c->evictions++;
	}
	struct fusion_table_entry *t = table_find(n, rec->name);
	if (!t) {
		t = table_add(n, rec->name, rec->p.kind, now);
		if (!t)
			return KOLO_ENOMEM;
		rec->name = NULL; /* the table's now */
	}
	if (t->has[r])
		return KOLO_EPROTO;
	t->has[r] = true;
	t->p[r] = rec->p;
	rec->p.counts = NULL;
	rec->p.ncounts = 0;
	add_tick(ob, t->name, t->p[r].kind, r);
	return KOLO_OK;
}

/* Rank 0 failed a name (a FAIL record): a failed response for it, whether it
 * is announced or pending in the cache. */
static kolo_status_t apply_fail(struct fusion_negotiator *n, struct cycle_builder *ob,
                                const struct fusion_record *rec)
{
	kolo_status_t st = KOLO_OK;
	struct fusion_table_entry *t = table_find(n, rec->name);
	int s = fusion_cache_find(n, rec->name);
	if (t) {
		int first = 0;
		while (first < n->size && !t->has[first])
			first++;
		st = fail_response(n, ob, rec->name, &t->p[first], rec->status, rec->why);
		table_remove(n, t);
	} else if (s >= 0 && n->cache[s].pending_since) {
		st = fail_response(n, ob, rec->name, &n->cache[s].p, rec->status, rec->why);
		n->cache[s].pending_since = 0;
		memset(n->cache[s].had, 0, (size_t)n->size * sizeof(bool));
		/* Bits already sent this cycle for it are ignored. */
		n->evicted[s] = true;
	}
	return st;
}

/* Decodes rank r's message record by record, applying each before the next
 * is read. PARAMS and FAIL come from rank 0 only. */
static kolo_status_t apply_message(struct fusion_negotiator *n, struct cycle_builder *ob, int r,
                                   const uint8_t *msg, size_t len, uint64_t now)
{
	size_t off = 0;
	while (off < len) {
		struct fusion_record rec;
		kolo_status_t st = fusion_record_decode(msg, len, &off, &rec);
		if (st != KOLO_OK)
			return st;
		if (rec.type == FUSION_RECORD_REQUEST) {
			st = apply_request(n, ob, r, &rec, now);
		} else if (rec.type == FUSION_RECORD_PARAMS && r == 0) {
			ob->c->has_params = true;
			ob->c->fusion_threshold = rec.fusion_threshold;
			ob->c->cycle_time_ms = rec.cycle_time_ms;
		} else if (rec.type == FUSION_RECORD_FAIL && r == 0) {
			st = apply_fail(n, ob, &rec);
		} else {
			st = KOLO_EPROTO;
		}
		fusion_record_fini(&rec);
		if (st != KOLO_OK)
			return st;
	}
	return KOLO_OK;
}

/* ---- the phases of a decision -------------------------------------------- */

/* Cached operations: ready when every rank that has not joined set its bit.
 * Served in slot order. */
static kolo_status_t serve_cached(struct fusion_negotiator *n, struct cycle_builder *ob,
                                  const uint8_t *blocks, uint64_t now_ns)
{
	struct fusion_cycle *out = ob->c;
	size_t bsz = fusion_negotiator_block_size(n);
	for (int s = 0; s < n->capacity; s++) {
		struct fusion_cache_slot *c = &n->cache[s];
		if (!c->used || n->evicted[s])
			continue;
		bool any = false, all = true;
		for (int r = 0; r < n->size; r++) {
			const uint8_t *bits = blocks + (size_t)r * bsz + FUSION_BLOCK_HDR;
			bool bit = (bits[s / 8] >> (s % 8)) & 1u;
			if (bit && !c->had[r])
				add_tick(ob, c->name, c->p.kind, r);
			c->had[r] = bit;
			any |= bit;
			if (!bit && !n->joined[r])
				all = false;
		}
		if (any && !c->pending_since)
			c->pending_since = now_ns ? now_ns : 1;
		if (any && all) {
			struct fusion_response *resp = add_response(ob);
			if (!resp)
				return KOLO_ENOMEM;
			resp->name = strdup(c->name);
			if (!resp->name || fusion_params_copy(&resp->p, &c->p) != KOLO_OK)
				return KOLO_ENOMEM;
			resp->cache_slot = s;
			claim_local(n, resp);
			c->last_used = n->cycle;
			c->pending_since = 0;
			memset(c->had, 0, (size_t)n->size * sizeof(bool));
			out->cache_hits++;
		} else if (any) {
			out->pending = true;
		} else {
			c->pending_since = 0;
		}
	}
	return KOLO_OK;
}

/* Announced operations every rank has sent (a joined rank counts, but for a
 * JOIN), in the order they were first announced. */
static kolo_status_t serve_announced(struct fusion_negotiator *n, struct cycle_builder *ob)
{
	for (size_t i = 0; i < n->ntab;) {
		struct fusion_table_entry *t = &n->tab[i];
		bool ready = true;
		for (int r = 0; r < n->size; r++)
			if (!t->has[r] && (t->kind == KOLO_FK_JOIN || !n->joined[r]))
				ready = false;
		if (!ready) {
			ob->c->pending = true;
			i++;
			continue;
		}
		kolo_status_t st = table_response(n, ob, t);
		if (st != KOLO_OK)
			return st;
		table_remove(n, t);
	}
	return KOLO_OK;
}

/* Remembers what ran with every rank taking part, in response order; a
 * completed JOIN ends every rank's join. */
static kolo_status_t remember(struct fusion_negotiator *n, struct fusion_cycle *out)
{
	for (size_t i = 0; i < out->nresp && n->capacity > 0; i++) {
		struct fusion_response *r = &out->resp[i];
		if (r->status != KOLO_OK || r->cache_slot >= 0 || !fusion_cache_accepts(r->p.kind))
			continue;
		bool everyone = true;
		for (int q = 0; q < n->size; q++)
			if (n->joined[q])
				everyone = false;
		if (!everyone)
			continue;
		kolo_status_t st = fusion_cache_insert(n, r->name, &r->p, &out->evictions);
		if (st != KOLO_OK)
			return st;
	}
	for (size_t i = 0; i < out->nresp; i++)
		if (out->resp[i].p.kind == KOLO_FK_JOIN && out->resp[i].status == KOLO_OK) {
			memset(n->joined, 0, (size_t)n->size * sizeof(bool));
			memset(n->join_cycle, 0, (size_t)n->size * sizeof(uint64_t));
		}
	return KOLO_OK;
}

/* From the waits in the blocks (the previous cycle's decisions): a rank
 * that waited w_r while the longest wait was w arrived w - w_r after the
 * first; as times whose differences are those lags, 0 for a rank without
 * a wait. NULL when no rank waited, or out of memory (the lags are then
 * not recorded, nothing else changes). */
static uint64_t *arrivals(const struct fusion_negotiator *n, const uint8_t *blocks)
{
	size_t bsz = fusion_negotiator_block_size(n);
	uint64_t most = 0;
	for (int r = 0; r < n->size; r++) {
		uint32_t flags;
		memcpy(&flags, blocks + (size_t)r * bsz, 4);
		most = KOLO_MAX(most, (uint64_t)(flags >> FUSION_BLOCK_AGE_SHIFT));
	}
	uint64_t *a = most ? malloc((size_t)n->size * sizeof(*a)) : NULL;
	for (int r = 0; a && r < n->size; r++) {
		uint32_t flags;
		memcpy(&flags, blocks + (size_t)r * bsz, 4);
		uint64_t wr = flags >> FUSION_BLOCK_AGE_SHIFT;
		a[r] = wr ? 1000000000ull + (most - wr) * 1000u : 0;
	}
	return a;
}

kolo_status_t fusion_negotiator_decide(struct fusion_negotiator *n, const uint8_t *blocks,
                                       const uint8_t *const *msgs, const size_t *msg_lens,
                                       uint64_t now_ns, struct fusion_cycle *out)
{
	memset(out, 0, sizeof(*out));
	struct cycle_builder ob = {out, 0, 0, false};
	size_t bsz = fusion_negotiator_block_size(n);
	kolo_status_t st = KOLO_OK;
	n->cycle++;
	out->arrive = arrivals(n, blocks);
	n->decide_ns = now_ns;
	n->wait_us = 0;
	memset(n->evicted, 0, (size_t)n->capacity * sizeof(bool));

	for (int r = 0; r < n->size; r++) {
		uint32_t flags;
		memcpy(&flags, blocks + (size_t)r * bsz, 4);
		if (flags & FUSION_BLOCK_SHUTDOWN)
			out->shutdown = true;
	}
	for (int r = 0; r < n->size && st == KOLO_OK; r++)
		st = apply_message(n, &ob, r, msgs[r], msg_lens[r], now_ns);
	if (st == KOLO_OK)
		st = serve_cached(n, &ob, blocks, now_ns);
	if (st == KOLO_OK)
		st = serve_announced(n, &ob);
	if (st == KOLO_OK)
		st = remember(n, out);
	if (ob.oom && st == KOLO_OK)
		st = KOLO_ENOMEM;
	return st;
}
