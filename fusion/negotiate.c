/* negotiate: the per-cycle agreement on which named operations run.
 *
 * Every rank holds the same global state (the table of announced names, the
 * response cache, who has joined) and updates it from the same gathered
 * bytes, so no coordinator is needed: each rank computes the same ordered
 * response list. Only its own local queue differs. */
#include "fusion.h"

#include <stdlib.h>
#include <string.h>

enum { L_NEW, L_CACHED, L_ANNOUNCED };
enum { R_REQ = 1, R_PARAMS = 2, R_FAIL = 3 };
enum { F_SHUTDOWN = 1 };
#define BLOCK_HDR 8

struct local_req {
	char *name;
	struct kolo_fusion_params p;
	uint64_t id;
	int state;
	int slot;
};

struct tentry {
	char *name;
	int kind;
	uint64_t first_ns;
	bool *has;
	struct kolo_fusion_params *p; /* size entries */
};

struct cslot {
	bool used;
	char *name;
	struct kolo_fusion_params p; /* canonical (as in a response) */
	uint64_t last_used;
	uint64_t pending_since;
	bool *had; /* bit per rank in the last cycle */
};

struct pending_fail {
	char *name;
	kolo_status_t st;
	char *why;
};

struct kolo_negotiator {
	int rank, size, capacity;
	uint64_t cycle;
	struct local_req *loc;
	size_t nloc, caploc;
	struct tentry *tab;
	size_t ntab, captab;
	struct cslot *cache;
	bool *joined;
	uint64_t *join_cycle;
	/* rank 0's control records for the next message */
	bool send_params;
	uint64_t p_threshold;
	double p_cycle;
	struct pending_fail *fails;
	size_t nfails;
	/* scratch */
	bool *evicted;
};

/* ---- params ------------------------------------------------------------- */

const char *kolo_fusion_kind_name(int kind)
{
	switch (kind) {
	case KOLO_FK_ALLREDUCE:
		return "ALLREDUCE";
	case KOLO_FK_GROUP:
		return "GROUPED_ALLREDUCE";
	case KOLO_FK_ALLGATHER:
		return "ALLGATHER";
	case KOLO_FK_BROADCAST:
		return "BROADCAST";
	case KOLO_FK_ALLTOALL:
		return "ALLTOALL";
	case KOLO_FK_REDUCESCATTER:
		return "REDUCESCATTER";
	case KOLO_FK_BARRIER:
		return "BARRIER";
	case KOLO_FK_JOIN:
		return "JOIN";
	case KOLO_FK_EXCLUSIVE:
		return "EXCLUSIVE";
	default:
		return "UNKNOWN";
	}
}

kolo_status_t kolo_fusion_params_copy(struct kolo_fusion_params *dst,
                                      const struct kolo_fusion_params *src)
{
	*dst = *src;
	dst->counts = NULL;
	if (src->ncounts) {
		dst->counts = malloc(src->ncounts * sizeof(uint64_t));
		if (!dst->counts)
			return KOLO_ENOMEM;
		memcpy(dst->counts, src->counts, src->ncounts * sizeof(uint64_t));
	}
	return KOLO_OK;
}

void kolo_fusion_params_fini(struct kolo_fusion_params *p)
{
	if (!p)
		return;
	free(p->counts);
	p->counts = NULL;
	p->ncounts = 0;
}

bool kolo_fusion_params_equal(const struct kolo_fusion_params *a,
                              const struct kolo_fusion_params *b)
{
	return a->kind == b->kind && a->dtype == b->dtype && a->op == b->op && a->root == b->root &&
	       a->prescale == b->prescale && a->postscale == b->postscale &&
	       a->ncounts == b->ncounts &&
	       (a->ncounts == 0 ||
	        memcmp(a->counts, b->counts, a->ncounts * sizeof(uint64_t)) == 0);
}

uint64_t kolo_fusion_params_total(const struct kolo_fusion_params *p)
{
	uint64_t t = 0;
	for (uint32_t i = 0; i < p->ncounts; i++)
		t += p->counts[i];
	return t;
}

void kolo_fusion_cycle_fini(struct kolo_fusion_cycle *c)
{
	if (!c)
		return;
	for (size_t i = 0; i < c->nresp; i++) {
		free(c->resp[i].name);
		free(c->resp[i].errmsg);
		kolo_fusion_params_fini(&c->resp[i].p);
	}
	free(c->resp);
	for (size_t i = 0; i < c->nticks; i++)
		free((char *)c->ticks[i].name);
	free(c->ticks);
	memset(c, 0, sizeof(*c));
}

/* ---- mismatch descriptions ---------------------------------------------- */

static void fmt_value(char *out, size_t len, int field, const struct kolo_fusion_params *p)
{
	switch (field) {
	case 0:
		snprintf(out, len, "%s", kolo_fusion_kind_name(p->kind));
		break;
	case 1:
		snprintf(out, len, "%s", kolo_dtype_name((kolo_dtype_t)p->dtype));
		break;
	case 2:
		snprintf(out, len, "%s", kolo_op_name((kolo_op_t)p->op));
		break;
	case 3:
		snprintf(out, len, "%d", (int)p->root);
		break;
	case 4:
		snprintf(out, len, "%g", p->prescale);
		break;
	case 5:
		snprintf(out, len, "%g", p->postscale);
		break;
	default: {
		size_t o = 0;
		out[0] = '\0';
		if (p->ncounts != 1)
			o += (size_t)snprintf(out + o, len - o, "[");
		for (uint32_t i = 0; i < p->ncounts && o < len; i++) {
			if (i == 8 && p->ncounts > 9) {
				o += (size_t)snprintf(out + o, len - o, ", ...");
				break;
			}
			o += (size_t)snprintf(out + o, len - o, "%s%llu", i ? ", " : "",
			                      (unsigned long long)p->counts[i]);
		}
		if (p->ncounts != 1 && o < len)
			snprintf(out + o, len - o, "]");
	}
	}
}

static bool field_equal(int field, const struct kolo_fusion_params *a,
                        const struct kolo_fusion_params *b)
{
	switch (field) {
	case 0:
		return a->kind == b->kind;
	case 1:
		return a->dtype == b->dtype;
	case 2:
		return a->op == b->op;
	case 3:
		return a->root == b->root;
	case 4:
		return a->prescale == b->prescale;
	case 5:
		return a->postscale == b->postscale;
	default:
		return a->ncounts == b->ncounts &&
		       (a->ncounts == 0 ||
		        memcmp(a->counts, b->counts, a->ncounts * sizeof(uint64_t)) == 0);
	}
}

/* Which fields must agree for a kind (kind and dtype always). */
static bool field_checked(int field, int kind)
{
	switch (field) {
	case 0:
	case 1:
		return true;
	case 2:
	case 4:
	case 5:
		return kind == KOLO_FK_ALLREDUCE || kind == KOLO_FK_GROUP ||
		       kind == KOLO_FK_REDUCESCATTER;
	case 3:
		return kind == KOLO_FK_BROADCAST;
	default:
		return kind == KOLO_FK_ALLREDUCE || kind == KOLO_FK_GROUP ||
		       kind == KOLO_FK_BROADCAST || kind == KOLO_FK_REDUCESCATTER;
	}
}

static const char *const field_names[] = {"operation", "dtype",     "op",   "root",
                                          "prescale",  "postscale", "count"};

bool kolo_fusion_describe_mismatch(const char *name, const struct kolo_fusion_params *const *p,
                                   const bool *present, int size, char *dst, size_t dstlen)
{
	int first = -1;
	for (int r = 0; r < size; r++)
		if (present[r]) {
			first = r;
			break;
		}
	if (first < 0)
		return false;
	for (int f = 0; f < 7; f++) {
		if (f > 0 && !field_checked(f, p[first]->kind))
			continue;
		bool differ = false;
		for (int r = first + 1; r < size; r++)
			if (present[r] && !field_equal(f, p[first], p[r]))
				differ = true;
		if (f == 6 && !differ && p[first]->kind == KOLO_FK_ALLTOALL) {
			for (int r = first; r < size; r++)
				if (present[r] && p[r]->ncounts != (uint32_t)size)
					differ = true;
		}
		if (!differ)
			continue;
		/* "mismatched dtype for 'A': rank 0: float32; rank 1: float16" with
		 * the ranks that agree listed together. */
		size_t o = (size_t)snprintf(dst, dstlen, "mismatched %s for '%s':", field_names[f],
		                            name);
		bool *done = calloc((size_t)size, sizeof(bool));
		bool firstgroup = true;
		for (int r = 0; r < size && o < dstlen; r++) {
			if (!present[r] || (done && done[r]))
				continue;
			char ranks[128];
			size_t ro = 0;
			int cnt = 0;
			for (int q = r; q < size; q++) {
				if (!present[q] || !field_equal(f, p[r], p[q]))
					continue;
				if (done)
					done[q] = true;
				if (ro < sizeof(ranks) - 8)
					ro += (size_t)snprintf(ranks + ro, sizeof(ranks) - ro,
					                       "%s%d", cnt ? "," : "", q);
				else if (ro < sizeof(ranks) - 4)
					ro += (size_t)snprintf(ranks + ro, sizeof(ranks) - ro,
					                       ",...");
				cnt++;
			}
			char v[256];
			fmt_value(v, sizeof(v), f, p[r]);
			o += (size_t)snprintf(dst + o, dstlen - o, "%s rank%s %s: %s",
			                      firstgroup ? "" : ";", cnt > 1 ? "s" : "", ranks, v);
			firstgroup = false;
		}
		free(done);
		if (o >= dstlen && dstlen > 4)
			strcpy(dst + dstlen - 4, "...");
		return true;
	}
	return false;
}

/* ---- create / destroy --------------------------------------------------- */

kolo_status_t kolo_negotiator_create(int rank, int size, int cache_capacity,
                                     struct kolo_negotiator **out)
{
	*out = NULL;
	if (size < 1 || rank < 0 || rank >= size || cache_capacity < 0)
		return KOLO_EINVAL;
	struct kolo_negotiator *n = calloc(1, sizeof(*n));
	if (!n)
		return KOLO_ENOMEM;
	n->rank = rank;
	n->size = size;
	n->capacity = cache_capacity;
	n->joined = calloc((size_t)size, sizeof(bool));
	n->join_cycle = calloc((size_t)size, sizeof(uint64_t));
	n->cache = calloc((size_t)cache_capacity + 1, sizeof(struct cslot));
	n->evicted = calloc((size_t)cache_capacity + 1, sizeof(bool));
	if (!n->joined || !n->join_cycle || !n->cache || !n->evicted) {
		kolo_negotiator_destroy(n);
		return KOLO_ENOMEM;
	}
	*out = n;
	return KOLO_OK;
}

static void tentry_fini(struct tentry *t, int size)
{
	free(t->name);
	free(t->has);
	if (t->p)
		for (int r = 0; r < size; r++)
			kolo_fusion_params_fini(&t->p[r]);
	free(t->p);
}

static void cslot_clear(struct cslot *c)
{
	free(c->name);
	free(c->had);
	kolo_fusion_params_fini(&c->p);
	memset(c, 0, sizeof(*c));
}

void kolo_negotiator_destroy(struct kolo_negotiator *n)
{
	if (!n)
		return;
	for (size_t i = 0; i < n->nloc; i++) {
		free(n->loc[i].name);
		kolo_fusion_params_fini(&n->loc[i].p);
	}
	free(n->loc);
	for (size_t i = 0; i < n->ntab; i++)
		tentry_fini(&n->tab[i], n->size);
	free(n->tab);
	if (n->cache)
		for (int s = 0; s < n->capacity; s++)
			cslot_clear(&n->cache[s]);
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

static struct local_req *local_find(struct kolo_negotiator *n, const char *name)
{
	for (size_t i = 0; i < n->nloc; i++)
		if (strcmp(n->loc[i].name, name) == 0)
			return &n->loc[i];
	return NULL;
}

kolo_status_t kolo_negotiator_submit(struct kolo_negotiator *n, const char *name,
                                     const struct kolo_fusion_params *p, uint64_t id)
{
	if (!name || strlen(name) >= KOLO_FUSION_NAME_MAX || local_find(n, name))
		return KOLO_EINVAL;
	if (n->nloc == n->caploc) {
		size_t cap = n->caploc ? n->caploc * 2 : 16;
		struct local_req *v = realloc(n->loc, cap * sizeof(*v));
		if (!v)
			return KOLO_ENOMEM;
		n->loc = v;
		n->caploc = cap;
	}
	struct local_req *l = &n->loc[n->nloc];
	memset(l, 0, sizeof(*l));
	l->name = strdup(name);
	if (!l->name || kolo_fusion_params_copy(&l->p, p) != KOLO_OK) {
		free(l->name);
		return KOLO_ENOMEM;
	}
	l->id = id;
	l->state = L_NEW;
	l->slot = -1;
	n->nloc++;
	return KOLO_OK;
}

size_t kolo_negotiator_local_pending(const struct kolo_negotiator *n)
{
	return n->nloc;
}

static void local_remove(struct kolo_negotiator *n, struct local_req *l)
{
	size_t i = (size_t)(l - n->loc);
	free(l->name);
	kolo_fusion_params_fini(&l->p);
	memmove(&n->loc[i], &n->loc[i + 1], (n->nloc - i - 1) * sizeof(*l));
	n->nloc--;
}

void kolo_negotiator_drain(struct kolo_negotiator *n, void (*fn)(void *arg, uint64_t id), void *arg)
{
	while (n->nloc) {
		uint64_t id = n->loc[0].id;
		local_remove(n, &n->loc[0]);
		if (fn)
			fn(arg, id);
	}
}

/* ---- cache -------------------------------------------------------------- */

/* Rank r's view of a canonical params (what rank r would have submitted). */
static void rank_view(const struct kolo_negotiator *n, const struct kolo_fusion_params *canon,
                      int r, struct kolo_fusion_params *out)
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

static int cache_find(const struct kolo_negotiator *n, const char *name)
{
	for (int s = 0; s < n->capacity; s++)
		if (n->cache[s].used && strcmp(n->cache[s].name, name) == 0)
			return s;
	return -1;
}

size_t kolo_negotiator_cache_size(const struct kolo_negotiator *n)
{
	size_t c = 0;
	for (int s = 0; s < n->capacity; s++)
		c += n->cache[s].used;
	return c;
}

static void cache_evict(struct kolo_negotiator *n, int s)
{
	for (size_t i = 0; i < n->nloc; i++)
		if (n->loc[i].state == L_CACHED && n->loc[i].slot == s) {
			n->loc[i].state = L_NEW;
			n->loc[i].slot = -1;
		}
	cslot_clear(&n->cache[s]);
}

static bool cacheable(int kind)
{
	return kind == KOLO_FK_ALLREDUCE || kind == KOLO_FK_ALLGATHER ||
	       kind == KOLO_FK_BROADCAST || kind == KOLO_FK_ALLTOALL ||
	       kind == KOLO_FK_REDUCESCATTER;
}

static kolo_status_t cache_insert(struct kolo_negotiator *n, const char *name,
                                  const struct kolo_fusion_params *p, uint64_t *evictions)
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
		cache_evict(n, s);
		(*evictions)++;
	}
	struct cslot *c = &n->cache[s];
	c->name = strdup(name);
	c->had = calloc((size_t)n->size, sizeof(bool));
	if (!c->name || !c->had || kolo_fusion_params_copy(&c->p, p) != KOLO_OK) {
		cslot_clear(c);
		return KOLO_ENOMEM;
	}
	c->used = true;
	c->last_used = n->cycle;
	return KOLO_OK;
}

/* ---- wire --------------------------------------------------------------- */

struct wbuf {
	uint8_t *b;
	size_t len, cap;
	bool oom;
};

static void wput(struct wbuf *w, const void *p, size_t len)
{
	if (w->oom)
		return;
	if (w->len + len > w->cap) {
		size_t cap = w->cap ? w->cap * 2 : 256;
		while (cap < w->len + len)
			cap *= 2;
		uint8_t *nb = realloc(w->b, cap);
		if (!nb) {
			w->oom = true;
			return;
		}
		w->b = nb;
		w->cap = cap;
	}
	memcpy(w->b + w->len, p, len);
	w->len += len;
}

static void wu8(struct wbuf *w, uint8_t v)
{
	wput(w, &v, 1);
}
static void wu32(struct wbuf *w, uint32_t v)
{
	wput(w, &v, 4);
}
static void wu64(struct wbuf *w, uint64_t v)
{
	wput(w, &v, 8);
}
static void wf64(struct wbuf *w, double v)
{
	wput(w, &v, 8);
}
static void wstr(struct wbuf *w, const char *s)
{
	uint32_t l = (uint32_t)strlen(s);
	wu32(w, l);
	wput(w, s, l);
}

struct rbuf {
	const uint8_t *b;
	size_t len, off;
	bool bad;
};

static void rget(struct rbuf *r, void *p, size_t len)
{
	if (r->bad || r->len - r->off < len) {
		r->bad = true;
		memset(p, 0, len);
		return;
	}
	memcpy(p, r->b + r->off, len);
	r->off += len;
}

static uint8_t ru8(struct rbuf *r)
{
	uint8_t v;
	rget(r, &v, 1);
	return v;
}
static uint32_t ru32(struct rbuf *r)
{
	uint32_t v;
	rget(r, &v, 4);
	return v;
}
static uint64_t ru64(struct rbuf *r)
{
	uint64_t v;
	rget(r, &v, 8);
	return v;
}
static double rf64(struct rbuf *r)
{
	double v;
	rget(r, &v, 8);
	return v;
}
/* A malloc'd copy of a length-prefixed string, or NULL (r->bad set). */
static char *rstr(struct rbuf *r, size_t max)
{
	uint32_t l = ru32(r);
	if (r->bad || l >= max || r->len - r->off < l) {
		r->bad = true;
		return NULL;
	}
	char *s = malloc((size_t)l + 1);
	if (!s) {
		r->bad = true;
		return NULL;
	}
	memcpy(s, r->b + r->off, l);
	s[l] = '\0';
	r->off += l;
	return s;
}

size_t kolo_negotiator_block_size(const struct kolo_negotiator *n)
{
	return BLOCK_HDR + ((size_t)n->capacity + 7) / 8;
}

uint32_t kolo_negotiator_block_msg_len(const uint8_t *block)
{
	uint32_t v;
	memcpy(&v, block + 4, 4);
	return v;
}

void kolo_negotiator_set_params(struct kolo_negotiator *n, uint64_t fusion_threshold,
                                double cycle_time_ms)
{
	n->send_params = true;
	n->p_threshold = fusion_threshold;
	n->p_cycle = cycle_time_ms;
}

kolo_status_t kolo_negotiator_fail_name(struct kolo_negotiator *n, const char *name,
                                        kolo_status_t st, const char *why)
{
	struct pending_fail *v = realloc(n->fails, (n->nfails + 1) * sizeof(*v));
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

static bool local_matches_slot(const struct kolo_negotiator *n, const struct local_req *l, int s)
{
	struct kolo_fusion_params v;
	rank_view(n, &n->cache[s].p, n->rank, &v);
	return kolo_fusion_params_equal(&v, &l->p);
}

kolo_status_t kolo_negotiator_encode(struct kolo_negotiator *n, bool shutdown, uint8_t *block,
                                     uint8_t **msg, size_t *msg_len)
{
	struct wbuf w = {0};
	size_t bsz = kolo_negotiator_block_size(n);
	memset(block, 0, bsz);
	uint8_t *bits = block + BLOCK_HDR;
	if (n->rank == 0) {
		if (n->send_params) {
			wu8(&w, R_PARAMS);
			wu64(&w, n->p_threshold);
			wf64(&w, n->p_cycle);
		}
		for (size_t i = 0; i < n->nfails; i++) {
			wu8(&w, R_FAIL);
			wu8(&w, (uint8_t)n->fails[i].st);
			wstr(&w, n->fails[i].name);
			wstr(&w, n->fails[i].why);
		}
	}
	for (size_t i = 0; i < n->nloc; i++) {
		struct local_req *l = &n->loc[i];
		if (l->state == L_NEW) {
			int s = cacheable(l->p.kind) ? cache_find(n, l->name) : -1;
			if (s >= 0 && local_matches_slot(n, l, s)) {
				l->state = L_CACHED;
				l->slot = s;
			} else {
				wu8(&w, R_REQ);
				wu8(&w, l->p.kind);
				wu8(&w, l->p.dtype);
				wu8(&w, l->p.op);
				wu32(&w, (uint32_t)l->p.root);
				wf64(&w, l->p.prescale);
				wf64(&w, l->p.postscale);
				wu32(&w, l->p.ncounts);
				for (uint32_t k = 0; k < l->p.ncounts; k++)
					wu64(&w, l->p.counts[k]);
				wstr(&w, l->name);
				l->state = L_ANNOUNCED;
			}
		}
		if (l->state == L_CACHED)
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
	uint32_t flags = shutdown ? F_SHUTDOWN : 0, len = (uint32_t)w.len;
	memcpy(block, &flags, 4);
	memcpy(block + 4, &len, 4);
	*msg = w.b;
	*msg_len = w.len;
	return KOLO_OK;
}

/* ---- decide ------------------------------------------------------------- */

static struct tentry *table_find(struct kolo_negotiator *n, const char *name)
{
	for (size_t i = 0; i < n->ntab; i++)
		if (strcmp(n->tab[i].name, name) == 0)
			return &n->tab[i];
	return NULL;
}

static struct tentry *table_add(struct kolo_negotiator *n, char *name, int kind, uint64_t now)
{
	if (n->ntab == n->captab) {
		size_t cap = n->captab ? n->captab * 2 : 16;
		struct tentry *v = realloc(n->tab, cap * sizeof(*v));
		if (!v)
			return NULL;
		n->tab = v;
		n->captab = cap;
	}
	struct tentry *t = &n->tab[n->ntab];
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

static void table_remove(struct kolo_negotiator *n, struct tentry *t)
{
	size_t i = (size_t)(t - n->tab);
	tentry_fini(t, n->size);
	memmove(&n->tab[i], &n->tab[i + 1], (n->ntab - i - 1) * sizeof(*t));
	n->ntab--;
}

struct out_builder {
	struct kolo_fusion_cycle *c;
	size_t capr, capt;
	bool oom;
};

static struct kolo_fusion_response *add_resp(struct out_builder *ob)
{
	struct kolo_fusion_cycle *c = ob->c;
	if (c->nresp == ob->capr) {
		size_t cap = ob->capr ? ob->capr * 2 : 16;
		struct kolo_fusion_response *v = realloc(c->resp, cap * sizeof(*v));
		if (!v) {
			ob->oom = true;
			return NULL;
		}
		c->resp = v;
		ob->capr = cap;
	}
	struct kolo_fusion_response *r = &c->resp[c->nresp++];
	memset(r, 0, sizeof(*r));
	r->cache_slot = -1;
	r->last_rank = -1;
	return r;
}

static void add_tick(struct out_builder *ob, const char *name, int kind, int rank)
{
	struct kolo_fusion_cycle *c = ob->c;
	if (c->nticks == ob->capt) {
		size_t cap = ob->capt ? ob->capt * 2 : 16;
		struct kolo_fusion_tick *v = realloc(c->ticks, cap * sizeof(*v));
		if (!v) {
			ob->oom = true;
			return;
		}
		c->ticks = v;
		ob->capt = cap;
	}
	/* A copy: the table entry or cache slot may go later in this cycle. */
	char *copy = strdup(name);
	if (!copy) {
		ob->oom = true;
		return;
	}
	c->ticks[c->nticks++] = (struct kolo_fusion_tick){copy, kind, rank};
}

static void set_local(struct kolo_negotiator *n, struct kolo_fusion_response *resp)
{
	struct local_req *l = local_find(n, resp->name);
	if (l && (l->state == L_ANNOUNCED || l->state == L_CACHED)) {
		resp->local = true;
		resp->local_id = l->id;
		local_remove(n, l);
	}
}

static kolo_status_t fail_response(struct kolo_negotiator *n, struct out_builder *ob,
                                   const char *name, const struct kolo_fusion_params *p,
                                   kolo_status_t st, const char *msg)
{
	struct kolo_fusion_response *r = add_resp(ob);
	if (!r)
		return KOLO_ENOMEM;
	r->name = strdup(name);
	r->status = st;
	r->errmsg = strdup(msg);
	if (!r->name || !r->errmsg)
		return KOLO_ENOMEM;
	if (p && kolo_fusion_params_copy(&r->p, p) != KOLO_OK)
		return KOLO_ENOMEM;
	set_local(n, r);
	return KOLO_OK;
}

static kolo_status_t table_response(struct kolo_negotiator *n, struct out_builder *ob,
                                    struct tentry *t)
{
	int size = n->size, first = -1;
	for (int r = 0; r < size; r++)
		if (t->has[r]) {
			first = r;
			break;
		}
	if (first < 0 || size <= 0)
		return KOLO_EPROTO;
	const struct kolo_fusion_params **pp = calloc((size_t)size, sizeof(*pp));
	if (!pp)
		return KOLO_ENOMEM;
	for (int r = 0; r < size; r++)
		pp[r] = &t->p[r];
	char msg[KOLO_ERRBUF_SIZE];
	kolo_status_t st = KOLO_OK;
	bool bad = kolo_fusion_describe_mismatch(t->name, pp, t->has, size, msg, sizeof(msg));
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
				         kolo_fusion_kind_name(kind), t->name, r);
				return fail_response(n, ob, t->name, &t->p[first],
				                     KOLO_EUNSUPPORTED, msg);
			}
	}
	struct kolo_fusion_response *resp = add_resp(ob);
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
	} else if (kolo_fusion_params_copy(&resp->p, &t->p[first]) != KOLO_OK) {
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
	set_local(n, resp);
	return KOLO_OK;
}

static kolo_status_t parse_msg(struct kolo_negotiator *n, struct out_builder *ob, int r,
                               const uint8_t *msg, size_t len, uint64_t now)
{
	struct rbuf rb = {msg, len, 0, false};
	while (!rb.bad && rb.off < rb.len) {
		uint8_t type = ru8(&rb);
		if (type == R_REQ) {
			struct kolo_fusion_params p = {0};
			p.kind = ru8(&rb);
			p.dtype = ru8(&rb);
			p.op = ru8(&rb);
			p.root = (int32_t)ru32(&rb);
			p.prescale = rf64(&rb);
			p.postscale = rf64(&rb);
			p.ncounts = ru32(&rb);
			if (rb.bad || p.ncounts > (rb.len - rb.off) / 8 || p.kind == 0 ||
			    p.kind >= KOLO_FK_COUNT)
				return KOLO_EPROTO;
			if (p.ncounts) {
				p.counts = malloc(p.ncounts * sizeof(uint64_t));
				if (!p.counts)
					return KOLO_ENOMEM;
				for (uint32_t k = 0; k < p.ncounts; k++)
					p.counts[k] = ru64(&rb);
			}
			char *name = rstr(&rb, KOLO_FUSION_NAME_MAX);
			if (!name) {
				kolo_fusion_params_fini(&p);
				return KOLO_EPROTO;
			}
			if (p.kind == KOLO_FK_JOIN) {
				n->joined[r] = true;
				n->join_cycle[r] = n->cycle;
			}
			int s = cache_find(n, name);
			if (s >= 0 && !n->evicted[s]) {
				/* Same name, other params: every rank drops the entry, and the
				 * ranks that had it pending announce it again. */
				cache_evict(n, s);
				n->evicted[s] = true;
				ob->c->evictions++;
			}
			struct tentry *t = table_find(n, name);
			if (t) {
				free(name);
			} else {
				t = table_add(n, name, p.kind, now);
				if (!t) {
					free(name);
					kolo_fusion_params_fini(&p);
					return KOLO_ENOMEM;
				}
			}
			if (t->has[r]) {
				kolo_fusion_params_fini(&p);
				return KOLO_EPROTO;
			}
			t->has[r] = true;
			t->p[r] = p;
			add_tick(ob, t->name, p.kind, r);
		} else if (type == R_PARAMS && r == 0) {
			ob->c->has_params = true;
			ob->c->fusion_threshold = ru64(&rb);
			ob->c->cycle_time_ms = rf64(&rb);
		} else if (type == R_FAIL && r == 0) {
			kolo_status_t st = (kolo_status_t)ru8(&rb);
			char *name = rstr(&rb, KOLO_FUSION_NAME_MAX);
			char *why = rstr(&rb, 65536);
			if (!name || !why) {
				free(name);
				free(why);
				return KOLO_EPROTO;
			}
			kolo_status_t fst = KOLO_OK;
			struct tentry *t = table_find(n, name);
			int s = cache_find(n, name);
			if (t) {
				int first = 0;
				while (first < n->size && !t->has[first])
					first++;
				fst = fail_response(n, ob, name, &t->p[first], st, why);
				table_remove(n, t);
			} else if (s >= 0 && n->cache[s].pending_since) {
				fst = fail_response(n, ob, name, &n->cache[s].p, st, why);
				n->cache[s].pending_since = 0;
				memset(n->cache[s].had, 0, (size_t)n->size * sizeof(bool));
				/* Bits already sent this cycle for it are ignored. */
				n->evicted[s] = true;
			}
			free(name);
			free(why);
			if (fst != KOLO_OK)
				return fst;
		} else {
			return KOLO_EPROTO;
		}
	}
	return rb.bad ? KOLO_EPROTO : KOLO_OK;
}

kolo_status_t kolo_negotiator_decide(struct kolo_negotiator *n, const uint8_t *blocks,
                                     const uint8_t *const *msgs, const size_t *msg_lens,
                                     uint64_t now_ns, struct kolo_fusion_cycle *out)
{
	memset(out, 0, sizeof(*out));
	struct out_builder ob = {out, 0, 0, false};
	size_t bsz = kolo_negotiator_block_size(n);
	int size = n->size;
	kolo_status_t st = KOLO_OK;
	n->cycle++;
	memset(n->evicted, 0, (size_t)n->capacity * sizeof(bool));

	for (int r = 0; r < size; r++) {
		uint32_t flags;
		memcpy(&flags, blocks + (size_t)r * bsz, 4);
		if (flags & F_SHUTDOWN)
			out->shutdown = true;
	}
	for (int r = 0; r < size && st == KOLO_OK; r++)
		st = parse_msg(n, &ob, r, msgs[r], msg_lens[r], now_ns);
	if (st != KOLO_OK)
		goto done;

	/* Cached operations: ready when every rank that has not joined set its
	 * bit. Served in slot order. */
	for (int s = 0; s < n->capacity; s++) {
		struct cslot *c = &n->cache[s];
		if (!c->used || n->evicted[s])
			continue;
		bool any = false, all = true;
		for (int r = 0; r < size; r++) {
			const uint8_t *bits = blocks + (size_t)r * bsz + BLOCK_HDR;
			bool bit = (bits[s / 8] >> (s % 8)) & 1u;
			if (bit && !c->had[r])
				add_tick(&ob, c->name, c->p.kind, r);
			c->had[r] = bit;
			any |= bit;
			if (!bit && !n->joined[r])
				all = false;
		}
		if (any && !c->pending_since)
			c->pending_since = now_ns ? now_ns : 1;
		if (any && all) {
			struct kolo_fusion_response *resp = add_resp(&ob);
			if (!resp) {
				st = KOLO_ENOMEM;
				goto done;
			}
			resp->name = strdup(c->name);
			if (!resp->name || kolo_fusion_params_copy(&resp->p, &c->p) != KOLO_OK) {
				st = KOLO_ENOMEM;
				goto done;
			}
			resp->cache_slot = s;
			set_local(n, resp);
			c->last_used = n->cycle;
			c->pending_since = 0;
			memset(c->had, 0, (size_t)size * sizeof(bool));
			out->cache_hits++;
		} else if (any) {
			out->pending = true;
		} else {
			c->pending_since = 0;
		}
	}

	/* Announced operations, in the order they were first announced. */
	for (size_t i = 0; i < n->ntab;) {
		struct tentry *t = &n->tab[i];
		bool ready = true;
		for (int r = 0; r < size; r++)
			if (!t->has[r] && (t->kind == KOLO_FK_JOIN || !n->joined[r]))
				ready = false;
		if (!ready) {
			out->pending = true;
			i++;
			continue;
		}
		st = table_response(n, &ob, t);
		if (st != KOLO_OK)
			goto done;
		table_remove(n, t);
	}

	/* Remember what ran with every rank taking part, in response order. */
	for (size_t i = 0; i < out->nresp && n->capacity > 0; i++) {
		struct kolo_fusion_response *r = &out->resp[i];
		if (r->status != KOLO_OK || r->cache_slot >= 0 || !cacheable(r->p.kind))
			continue;
		bool everyone = true;
		for (int q = 0; q < size; q++)
			if (n->joined[q])
				everyone = false;
		if (!everyone)
			continue;
		st = cache_insert(n, r->name, &r->p, &out->evictions);
		if (st != KOLO_OK)
			goto done;
	}
	for (size_t i = 0; i < out->nresp; i++)
		if (out->resp[i].p.kind == KOLO_FK_JOIN && out->resp[i].status == KOLO_OK) {
			memset(n->joined, 0, (size_t)size * sizeof(bool));
			memset(n->join_cycle, 0, (size_t)size * sizeof(uint64_t));
		}
done:
	if (ob.oom && st == KOLO_OK)
		st = KOLO_ENOMEM;
	return st;
}

/* ---- stall inspector ---------------------------------------------------- */

struct stall_name {
	const char *name;
	const bool *has;
	uint64_t since;
};

static size_t collect_stalled(const struct kolo_negotiator *n, uint64_t now, uint64_t min_age,
                              struct stall_name **out)
{
	size_t cnt = 0, cap = n->ntab + (size_t)n->capacity;
	struct stall_name *v = calloc(cap ? cap : 1, sizeof(*v));
	*out = v;
	if (!v)
		return 0;
	for (size_t i = 0; i < n->ntab; i++) {
		const struct tentry *t = &n->tab[i];
		if (t->first_ns + min_age <= now)
			v[cnt++] = (struct stall_name){t->name, t->has, t->first_ns};
	}
	for (int s = 0; s < n->capacity; s++) {
		const struct cslot *c = &n->cache[s];
		if (c->used && c->pending_since && c->pending_since + min_age <= now)
			v[cnt++] = (struct stall_name){c->name, c->had, c->pending_since};
	}
	return cnt;
}

bool kolo_negotiator_deadlocked(const struct kolo_negotiator *n, uint64_t now_ns,
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

void kolo_negotiator_stalled(const struct kolo_negotiator *n, uint64_t now_ns, uint64_t min_age_ns,
                             void (*fn)(void *arg, const char *name), void *arg)
{
	struct stall_name *v;
	size_t cnt = collect_stalled(n, now_ns, min_age_ns, &v);
	for (size_t i = 0; i < cnt; i++)
		fn(arg, v[i].name);
	free(v);
}

size_t kolo_negotiator_stall_report(const struct kolo_negotiator *n, uint64_t now_ns,
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
