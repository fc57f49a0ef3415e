/* engine: the background thread that owns the ring comm, runs negotiation
 * cycles while there is work, packs ready allreduces into the fusion buffer
 * and completes operations. Sleeps on a condition variable when idle. */
#include "fusion.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SUBSYS "fusion"

struct kolo_handle {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int refs;
	bool done;
	kolo_status_t st;
	void *owner;
	char msg[KOLO_ERRBUF_SIZE];
};

struct eop {
	struct eop *next;    /* in e->ops */
	struct eop *next_in; /* in e->incoming */
	uint64_t id;
	struct kolo_engine_op op; /* the caller's description; arrays below are copies */
	char *name;
	struct kolo_fusion_params p;
	const void **sendbufs;
	void **recvbufs;
	size_t *gcounts;
	kolo_handle_t *h;
};

struct name_set {
	char **v;
	size_t n, cap;
};

struct kolo_engine {
	struct kolo_ring_comm *rc;
	int rank, size;
	struct kolo_engine_config cfg;
	pthread_t thread;
	pthread_mutex_t shutdown_lock; /* one kolo_engine_shutdown at a time */
	bool thread_started;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	/* under lock */
	struct eop *ops;      /* every queued op, newest first */
	struct eop *incoming; /* not yet handed to the negotiator, oldest first */
	struct eop **incoming_tail;
	bool shutdown_req;
	bool stopped;
	bool aborted; /* kolo_engine_abort: the failure is expected */
	kolo_status_t fail_st;
	char fail_msg[KOLO_ERRBUF_SIZE];
	uint64_t next_id, barrier_seq, join_seq, excl_seq;
	/* timeline, under tl_lock */
	pthread_mutex_t tl_lock;
	struct kolo_timeline *tl;
	/* engine thread only */
	struct kolo_negotiator *neg;
	uint64_t threshold;
	double cycle_ms;
	uint8_t *fbuf;
	size_t fbuf_cap;
	struct kolo_autotune *at;
	uint64_t last_stall_warn_ns;
	uint64_t last_cycle_ns;
	bool others_pending;
	struct name_set tl_open;
	/* statistics */
	uint64_t cycles;
};

/* ---- config ------------------------------------------------------------ */

void kolo_engine_config_from_params(struct kolo_engine_config *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
	int64_t thr = kolo_param_int(KOLO_P_FUSION_THRESHOLD);
	cfg->fusion_threshold = thr > 0 ? (uint64_t)thr : 0;
	int64_t direct = kolo_param_int(KOLO_P_FUSION_DIRECT_BYTES);
	cfg->direct_bytes = direct > 0 ? (uint64_t)direct : 0;
	cfg->cycle_time_ms = kolo_param_float(KOLO_P_CYCLE_TIME);
	if (!(cfg->cycle_time_ms >= 0))
		cfg->cycle_time_ms = 0;
	int64_t cap = kolo_param_int(KOLO_P_CACHE_CAPACITY);
	cfg->cache_capacity = cap < 0 ? 0 : (cap > 1 << 20 ? 1 << 20 : (int)cap);
	snprintf(cfg->timeline, sizeof(cfg->timeline), "%s", kolo_param_str(KOLO_P_TIMELINE));
	cfg->timeline_mark_cycles = kolo_param_bool(KOLO_P_TIMELINE_MARK_CYCLES);
	cfg->stall_check = !kolo_param_bool(KOLO_P_STALL_CHECK_DISABLE);
	cfg->stall_check_s = kolo_param_float(KOLO_P_STALL_CHECK_SECONDS);
	cfg->stall_shutdown_s = kolo_param_float(KOLO_P_STALL_SHUTDOWN_SECONDS);
	cfg->autotune = kolo_param_bool(KOLO_P_AUTOTUNE);
	snprintf(cfg->autotune_log, sizeof(cfg->autotune_log), "%s",
	         kolo_param_str(KOLO_P_AUTOTUNE_LOG));
	int64_t to = kolo_param_int(KOLO_P_TIMEOUT_MS);
	cfg->timeout_ms = to > 0 && to < INT32_MAX ? (int)to : 30000;
	cfg->idle_heartbeat_ms = 0;
}

static int heartbeat_ms(const struct kolo_engine_config *cfg)
{
	if (cfg->idle_heartbeat_ms > 0)
		return cfg->idle_heartbeat_ms;
	int h = cfg->timeout_ms / 4;
	return h < 100 ? 100 : (h > 10000 ? 10000 : h);
}

/* How long a rank with nothing queued waits while other ranks have work: it
 * cannot hold anything up (no op completes without its own enqueue, which
 * wakes it), so this only paces the stall inspector. */
static int backoff_ms(const struct kolo_engine_config *cfg)
{
	int h = heartbeat_ms(cfg);
	return h < 100 ? h : 100;
}

/* ---- handles ------------------------------------------------------------ */

static kolo_handle_t *handle_new(void *owner, int refs)
{
	kolo_handle_t *h = calloc(1, sizeof(*h));
	if (!h)
		return NULL;
	pthread_mutex_init(&h->lock, NULL);
	pthread_cond_init(&h->cond, NULL);
	h->refs = refs;
	h->owner = owner;
	return h;
}

void kolo_handle_drop(kolo_handle_t *h)
{
	if (!h)
		return;
	pthread_mutex_lock(&h->lock);
	bool last = --h->refs == 0;
	pthread_mutex_unlock(&h->lock);
	if (last) {
		pthread_mutex_destroy(&h->lock);
		pthread_cond_destroy(&h->cond);
		free(h);
	}
}

static void handle_complete(kolo_handle_t *h, kolo_status_t st, const char *msg)
{
	pthread_mutex_lock(&h->lock);
	h->done = true;
	h->st = st;
	snprintf(h->msg, sizeof(h->msg), "%s", msg ? msg : "");
	pthread_cond_broadcast(&h->cond);
	pthread_mutex_unlock(&h->lock);
	kolo_handle_drop(h);
}

kolo_status_t kolo_handle_poll_done(kolo_handle_t *h, int *done)
{
	if (!h || !done)
		return KOLO_EINVAL;
	pthread_mutex_lock(&h->lock);
	*done = h->done;
	pthread_mutex_unlock(&h->lock);
	return KOLO_OK;
}

kolo_status_t kolo_handle_wait_release(kolo_handle_t *h, struct kolo_errbuf *eb)
{
	if (!h)
		return KOLO_EINVAL;
	pthread_mutex_lock(&h->lock);
	while (!h->done)
		pthread_cond_wait(&h->cond, &h->lock);
	kolo_status_t st = h->st;
	if (st != KOLO_OK && eb)
		snprintf(eb->msg, sizeof(eb->msg), "%s", h->msg);
	pthread_mutex_unlock(&h->lock);
	kolo_handle_drop(h);
	return st;
}

void *kolo_handle_owner(const kolo_handle_t *h)
{
	return h ? h->owner : NULL;
}

/* ---- small helpers ------------------------------------------------------ */

static bool set_has(const struct name_set *s, const char *name)
{
	for (size_t i = 0; i < s->n; i++)
		if (strcmp(s->v[i], name) == 0)
			return true;
	return false;
}

static void set_add(struct name_set *s, const char *name)
{
	if (set_has(s, name))
		return;
	if (s->n == s->cap) {
		size_t cap = s->cap ? s->cap * 2 : 16;
		char **v = realloc(s->v, cap * sizeof(*v));
		if (!v)
			return;
		s->v = v;
		s->cap = cap;
	}
	char *c = strdup(name);
	if (c)
		s->v[s->n++] = c;
}

static bool set_del(struct name_set *s, const char *name)
{
	for (size_t i = 0; i < s->n; i++)
		if (strcmp(s->v[i], name) == 0) {
			free(s->v[i]);
			s->v[i] = s->v[--s->n];
			return true;
		}
	return false;
}

static void set_clear(struct name_set *s)
{
	for (size_t i = 0; i < s->n; i++)
		free(s->v[i]);
	free(s->v);
	memset(s, 0, sizeof(*s));
}

static uint64_t now_us(void)
{
	return kolo_now_ns() / 1000;
}

static void eop_free(struct eop *o)
{
	if (!o)
		return;
	free(o->name);
	kolo_fusion_params_fini(&o->p);
	free(o->sendbufs);
	free(o->recvbufs);
	free(o->gcounts);
	free(o);
}

/* Removes o from e->ops. Lock held. */
static void unlink_op(struct kolo_engine *e, struct eop *o)
{
	for (struct eop **pp = &e->ops; *pp; pp = &(*pp)->next)
		if (*pp == o) {
			*pp = o->next;
			return;
		}
}

static struct eop *find_op(struct kolo_engine *e, uint64_t id)
{
	pthread_mutex_lock(&e->lock);
	struct eop *o = e->ops;
	while (o && o->id != id)
		o = o->next;
	pthread_mutex_unlock(&e->lock);
	return o;
}

/* Finishes o: unlinks it, runs the callback and completes the handle. */
static void complete(struct kolo_engine *e, struct eop *o, kolo_status_t st, const char *msg)
{
	if (!o)
		return;
	pthread_mutex_lock(&e->lock);
	unlink_op(e, o);
	pthread_mutex_unlock(&e->lock);
	if (st != KOLO_OK)
		KOLO_DEBUG(SUBSYS, "'%s' failed: %s: %s", o->name, kolo_status_name(st),
		           msg ? msg : "");
	if (o->op.cb)
		o->op.cb(o->op.cb_arg, st);
	if (o->h)
		handle_complete(o->h, st, msg);
	eop_free(o);
}

/* ---- timeline glue (tl_lock guards the pointer) ------------------------- */

static bool tl_on(struct kolo_engine *e)
{
	pthread_mutex_lock(&e->tl_lock);
	bool on = e->tl != NULL;
	pthread_mutex_unlock(&e->tl_lock);
	return on;
}

static void tl_begin(struct kolo_engine *e, const char *name, const char *act)
{
	pthread_mutex_lock(&e->tl_lock);
	if (e->tl)
		kolo_timeline_begin(e->tl, name, act, now_us());
	pthread_mutex_unlock(&e->tl_lock);
}

static void tl_end(struct kolo_engine *e, const char *name)
{
	pthread_mutex_lock(&e->tl_lock);
	if (e->tl)
		kolo_timeline_end(e->tl, name, now_us());
	pthread_mutex_unlock(&e->tl_lock);
}

static void tl_ticks(struct kolo_engine *e, const struct kolo_fusion_cycle *c)
{
	pthread_mutex_lock(&e->tl_lock);
	if (e->tl) {
		uint64_t ts = now_us();
		if (c->nresp || c->nticks)
			kolo_timeline_mark_cycle(e->tl, ts);
		for (size_t i = 0; i < c->nticks; i++) {
			const struct kolo_fusion_tick *t = &c->ticks[i];
			if (!set_has(&e->tl_open, t->name)) {
				set_add(&e->tl_open, t->name);
				kolo_timeline_negotiate_begin(e->tl, t->name, t->kind, ts);
			}
			kolo_timeline_rank_ready(e->tl, t->name, t->rank, ts);
		}
		for (size_t i = 0; i < c->nresp; i++)
			if (set_del(&e->tl_open, c->resp[i].name)) {
				kolo_timeline_negotiate_end(e->tl, c->resp[i].name, ts);
				kolo_timeline_begin(e->tl, c->resp[i].name, "QUEUE", ts);
			} else {
				kolo_timeline_begin(e->tl, c->resp[i].name, "QUEUE", ts);
			}
	}
	pthread_mutex_unlock(&e->tl_lock);
}

/* ---- execution ---------------------------------------------------------- */

struct entry { /* one tensor of an allreduce batch */
	const char *name;
	const void *send; /* NULL: zeros (a joined rank) */
	void *recv;       /* NULL: discard */
	size_t count;
};

struct ar {
	struct kolo_fusion_response *r;
	struct eop *o;
	struct entry *ent;
	size_t nent;
	uint64_t bytes;
};

static kolo_status_t ring_fail(struct kolo_engine *e, kolo_status_t st, char *msg, size_t len)
{
	snprintf(msg, len, "%s", kolo_ring_last_error(e->rc));
	if (!msg[0])
		snprintf(msg, len, "%s", kolo_strerror(st));
	return st;
}

/* Allreduce of one tensor straight from / to the caller's buffers. */
static kolo_status_t run_direct(struct kolo_engine *e, const struct kolo_fusion_params *p,
                                const struct entry *en, char *msg, size_t len)
{
	size_t esz = kolo_dtype_size((kolo_dtype_t)p->dtype);
	if (en->count == 0)
		return KOLO_OK; /* nothing to reduce, on every rank alike */
	void *scratch = NULL;
	const void *send = en->send;
	void *recv = en->recv;
	if (!send || !recv) {
		scratch = calloc(en->count ? en->count : 1, esz);
		if (!scratch)
			return KOLO_ENOMEM;
		if (!send) {
			send = scratch;
			recv = scratch;
		} else {
			recv = scratch;
		}
	}
	kolo_status_t st = kolo_ring_allreduce(e->rc, send, recv, en->count, (kolo_dtype_t)p->dtype,
	                                       (kolo_op_t)p->op, p->prescale, p->postscale);
	free(scratch);
	if (st != KOLO_OK)
		return ring_fail(e, st, msg, len);
	return KOLO_OK;
}

static kolo_status_t ensure_fbuf(struct kolo_engine *e, size_t bytes)
{
	if (bytes <= e->fbuf_cap)
		return KOLO_OK;
	uint8_t *b = realloc(e->fbuf, bytes);
	if (!b)
		return KOLO_ENOMEM;
	if (!e->fbuf)
		KOLO_DEBUG(SUBSYS, "fusion buffer: %zu bytes", bytes);
	e->fbuf = b;
	e->fbuf_cap = bytes;
	return KOLO_OK;
}

/* The bytes of a fused batch that go through the ring at once: the whole
 * batch (one collective, as Horovod), or blocks of cfg.block_bytes copied in,
 * reduced and copied out one after another. */
static size_t block_bytes(const struct kolo_engine *e, size_t esz)
{
	if (!e->cfg.block_bytes)
		return SIZE_MAX - SIZE_MAX % esz;
	size_t b = (size_t)e->cfg.block_bytes;
	b -= b % esz;
	return b ? b : esz;
}

/* Which items (tensors) of a batch overlap [lo, hi) of the packed bytes. */
static void tl_window(struct kolo_engine *e, struct ar **b, size_t nb, const uint64_t *item_off,
                      uint64_t lo, uint64_t hi, const char *begin)
{
	for (size_t i = 0; i < nb; i++) {
		uint64_t ilo = item_off[i], ihi = item_off[i] + b[i]->bytes;
		if (ihi <= lo || ilo >= hi || ihi == ilo)
			continue;
		if (begin)
			tl_begin(e, b[i]->r->name, begin);
		else
			tl_end(e, b[i]->r->name);
	}
}

static kolo_status_t run_batch(struct kolo_engine *e, struct ar **b, size_t nb, char *msg,
                               size_t len)
{
	const struct kolo_fusion_params *p = &b[0]->r->p;
	kolo_dtype_t dt = (kolo_dtype_t)p->dtype;
	size_t esz = kolo_dtype_size(dt);
	uint64_t total = 0;
	size_t nent = 0;
	for (size_t i = 0; i < nb; i++) {
		total += b[i]->bytes;
		nent += b[i]->nent;
	}
	bool tl = tl_on(e);
	if (tl)
		for (size_t i = 0; i < nb; i++)
			tl_end(e, b[i]->r->name); /* QUEUE */
	if (nent == 1 || e->threshold == 0 || total > e->threshold) {
		/* Alone, or a group too large for the buffer: no copies. */
		for (size_t i = 0; i < nb; i++) {
			if (tl)
				tl_begin(e, b[i]->r->name,
				         kolo_fusion_kind_name(KOLO_FK_ALLREDUCE));
			for (size_t k = 0; k < b[i]->nent; k++) {
				kolo_status_t st = run_direct(e, p, &b[i]->ent[k], msg, len);
				if (st != KOLO_OK)
					return st;
			}
			if (tl)
				tl_end(e, b[i]->r->name);
		}
		return KOLO_OK;
	}
	if (total == 0)
		return KOLO_OK;
	size_t blk = block_bytes(e, esz);
	kolo_status_t st = ensure_fbuf(e, KOLO_MIN((size_t)total, blk));
	if (st != KOLO_OK)
		return st;
	/* Where each entry and each item starts in the packed bytes. */
	uint64_t *eoff = calloc(nent, sizeof(uint64_t)), *ioff = calloc(nb, sizeof(uint64_t));
	const struct entry **ent = calloc(nent, sizeof(*ent));
	if (!eoff || !ioff || !ent) {
		free(eoff);
		free(ioff);
		free(ent);
		return KOLO_ENOMEM;
	}
	uint64_t off = 0;
	size_t k = 0;
	for (size_t i = 0; i < nb; i++) {
		ioff[i] = off;
		for (size_t j = 0; j < b[i]->nent; j++, k++) {
			ent[k] = &b[i]->ent[j];
			eoff[k] = off;
			off += ent[k]->count * esz;
		}
	}
	kolo_op_t op = (kolo_op_t)p->op;
	double factor = p->postscale;
	if (op == KOLO_AVERAGE) {
		op = KOLO_SUM;
		factor /= (double)e->size;
	}
	for (uint64_t lo = 0, hi = 0; lo < total && st == KOLO_OK; lo = hi) {
		hi = total - lo > blk ? lo + blk : total;
		if (tl)
			tl_window(e, b, nb, ioff, lo, hi, "MEMCPY_IN_FUSION_BUFFER");
		for (k = 0; k < nent; k++) {
			uint64_t a = KOLO_MAX(lo, eoff[k]),
			         z = KOLO_MIN(hi, eoff[k] + ent[k]->count * esz);
			if (a >= z)
				continue;
			uint8_t *dst = e->fbuf + (a - lo);
			const uint8_t *src = (const uint8_t *)ent[k]->send + (a - eoff[k]);
			if (!ent[k]->send)
				memset(dst, 0, z - a);
			else if (p->prescale != 1.0)
				kolo_scale(dst, src, (size_t)(z - a) / esz, dt, p->prescale);
			else
				memcpy(dst, src, z - a);
		}
		if (tl) {
			tl_window(e, b, nb, ioff, lo, hi, NULL);
			tl_window(e, b, nb, ioff, lo, hi, kolo_fusion_kind_name(KOLO_FK_ALLREDUCE));
		}
		st = kolo_ring_allreduce(e->rc, e->fbuf, e->fbuf, (size_t)(hi - lo) / esz, dt, op,
		                         1.0, 1.0);
		if (st != KOLO_OK) {
			ring_fail(e, st, msg, len);
			break;
		}
		if (tl) {
			tl_window(e, b, nb, ioff, lo, hi, NULL);
			tl_window(e, b, nb, ioff, lo, hi, "MEMCPY_OUT_FUSION_BUFFER");
		}
		for (k = 0; k < nent; k++) {
			uint64_t a = KOLO_MAX(lo, eoff[k]),
			         z = KOLO_MIN(hi, eoff[k] + ent[k]->count * esz);
			if (a >= z || !ent[k]->recv)
				continue;
			uint8_t *dst = (uint8_t *)ent[k]->recv + (a - eoff[k]);
			const uint8_t *src = e->fbuf + (a - lo);
			if (factor != 1.0)
				kolo_scale(dst, src, (size_t)(z - a) / esz, dt, factor);
			else
				memcpy(dst, src, z - a);
		}
		if (tl)
			tl_window(e, b, nb, ioff, lo, hi, NULL);
	}
	free(eoff);
	free(ioff);
	free(ent);
	return st;
}

static kolo_status_t run_other(struct kolo_engine *e, struct kolo_fusion_response *r, struct eop *o,
                               char *msg, size_t len)
{
	const struct kolo_fusion_params *p = &r->p;
	kolo_dtype_t dt = (kolo_dtype_t)p->dtype;
	size_t esz = kolo_dtype_size(dt);
	int n = e->size;
	kolo_status_t st = KOLO_OK;
	if (tl_on(e)) {
		tl_end(e, r->name);
		tl_begin(e, r->name, kolo_fusion_kind_name(p->kind));
	}
	switch (p->kind) {
	case KOLO_FK_ALLGATHER: {
		size_t *counts = calloc((size_t)n, sizeof(size_t));
		size_t total = 0;
		if (!counts)
			return KOLO_ENOMEM;
		for (int i = 0; i < n; i++)
			total += counts[i] = (size_t)p->counts[i];
		void *buf = malloc(total ? total * esz : 1);
		if (!buf) {
			free(counts);
			return KOLO_ENOMEM;
		}
		st = total ? kolo_ring_allgatherv(e->rc, o->op.sendbuf, buf, counts, dt) : KOLO_OK;
		if (st == KOLO_OK) {
			memcpy(o->op.recvcounts, counts, (size_t)n * sizeof(size_t));
			*o->op.recvbuf_out = buf;
		} else {
			free(buf);
		}
		free(counts);
		break;
	}
	case KOLO_FK_ALLTOALL: {
		size_t *sc = calloc((size_t)n, sizeof(size_t)),
		       *rcv = calloc((size_t)n, sizeof(size_t));
		size_t total = 0;
		if (!sc || !rcv) {
			free(sc);
			free(rcv);
			return KOLO_ENOMEM;
		}
		for (int i = 0; i < n; i++) {
			sc[i] = (size_t)p->counts[(size_t)e->rank * (size_t)n + (size_t)i];
			total += rcv[i] =
			        (size_t)p->counts[(size_t)i * (size_t)n + (size_t)e->rank];
		}
		void *buf = malloc(total ? total * esz : 1);
		if (!buf) {
			free(sc);
			free(rcv);
			return KOLO_ENOMEM;
		}
		st = kolo_fusion_params_total(p)
		             ? kolo_ring_alltoallv(e->rc, o->op.sendbuf, sc, buf, rcv, dt)
		             : KOLO_OK;
		if (st == KOLO_OK) {
			memcpy(o->op.recvcounts, rcv, (size_t)n * sizeof(size_t));
			*o->op.recvbuf_out = buf;
		} else {
			free(buf);
		}
		free(sc);
		free(rcv);
		break;
	}
	case KOLO_FK_BROADCAST:
		if (p->counts[0])
			st = kolo_ring_broadcast(e->rc, o->op.recvbuf, (size_t)p->counts[0], dt,
			                         p->root);
		break;
	case KOLO_FK_REDUCESCATTER: {
		if (p->counts[0] == 0)
			break;
		size_t *counts = calloc((size_t)n, sizeof(size_t));
		if (!counts)
			return KOLO_ENOMEM;
		for (int i = 0; i < n; i++)
			counts[i] = kolo_reducescatter_count((size_t)p->counts[0], n, i);
		st = kolo_ring_reducescatter(e->rc, o->op.sendbuf, o->op.recvbuf, counts, dt,
		                             (kolo_op_t)p->op, p->prescale, p->postscale);
		free(counts);
		break;
	}
	case KOLO_FK_BARRIER:
		/* Every rank reached it: the negotiation was the barrier. */
		break;
	case KOLO_FK_JOIN:
		if (o->op.last_rank)
			*o->op.last_rank = r->last_rank;
		break;
	case KOLO_FK_EXCLUSIVE:
		st = o->op.fn(o->op.fn_arg, e->rc);
		if (st != KOLO_OK) {
			snprintf(msg, len, "%s", kolo_ring_last_error(e->rc));
			if (!msg[0])
				snprintf(msg, len, "%s", kolo_strerror(st));
		}
		if (tl_on(e))
			tl_end(e, r->name);
		return st;
	default:
		return KOLO_EPROTO;
	}
	if (tl_on(e))
		tl_end(e, r->name);
	if (st != KOLO_OK)
		return ring_fail(e, st, msg, len);
	return KOLO_OK;
}

static void apply_params(struct kolo_engine *e, uint64_t thr, double cyc)
{
	if (thr != e->threshold || cyc != e->cycle_ms)
		KOLO_INFO(SUBSYS, "fusion threshold %llu bytes, cycle time %g ms",
		          (unsigned long long)thr, cyc);
	e->threshold = thr;
	e->cycle_ms = cyc;
}

/* Runs the responses of one cycle. A data-plane failure is returned (the
 * ops of that collective already failed); everything else completes here. */
static kolo_status_t execute(struct kolo_engine *e, struct kolo_fusion_cycle *c, char *msg,
                             size_t len)
{
	kolo_status_t st = KOLO_OK;
	struct ar *ars = calloc(c->nresp ? c->nresp : 1, sizeof(*ars));
	struct kolo_fusion_item *items = calloc(c->nresp ? c->nresp : 1, sizeof(*items));
	size_t *batch_of = calloc(c->nresp ? c->nresp : 1, sizeof(size_t));
	struct ar **bl = calloc(c->nresp ? c->nresp : 1, sizeof(*bl));
	size_t nar = 0;
	if (!ars || !items || !batch_of || !bl) {
		st = KOLO_ENOMEM;
		goto out;
	}
	/* Errors first: they complete locally and need no collective. */
	for (size_t i = 0; i < c->nresp; i++) {
		struct kolo_fusion_response *r = &c->resp[i];
		struct eop *o = r->local ? find_op(e, r->local_id) : NULL;
		if (r->status != KOLO_OK) {
			if (tl_on(e))
				tl_end(e, r->name);
			if (o)
				KOLO_WARN(SUBSYS, "%s",
				          r->errmsg ? r->errmsg : kolo_strerror(r->status));
			complete(e, o, r->status, r->errmsg);
			continue;
		}
		if (r->p.kind != KOLO_FK_ALLREDUCE && r->p.kind != KOLO_FK_GROUP)
			continue;
		struct ar *a = &ars[nar];
		a->r = r;
		a->o = o;
		size_t esz = kolo_dtype_size((kolo_dtype_t)r->p.dtype);
		a->nent = r->p.kind == KOLO_FK_GROUP ? r->p.ncounts : 1;
		a->ent = calloc(a->nent ? a->nent : 1, sizeof(*a->ent));
		if (!a->ent) {
			st = KOLO_ENOMEM;
			goto out;
		}
		for (size_t k = 0; k < a->nent; k++) {
			struct entry *en = &a->ent[k];
			en->name = r->name;
			en->count = (size_t)r->p.counts[k];
			if (o && r->p.kind == KOLO_FK_GROUP) {
				en->send = o->sendbufs[k];
				en->recv = o->recvbufs[k];
			} else if (o) {
				en->send = o->op.sendbuf;
				en->recv = o->op.recvbuf;
			}
			a->bytes += en->count * esz;
		}
		items[nar] = (struct kolo_fusion_item){r->p.dtype,
		                                       r->p.op,
		                                       r->p.prescale,
		                                       r->p.postscale,
		                                       a->bytes,
		                                       r->p.kind == KOLO_FK_ALLREDUCE &&
		                                               e->cfg.direct_bytes &&
		                                               a->bytes >= e->cfg.direct_bytes};
		nar++;
	}
	size_t nb = kolo_fusion_plan(items, nar, e->threshold, batch_of);
	for (size_t b = 0; b < nb; b++) {
		size_t cnt = 0;
		for (size_t i = 0; i < nar; i++)
			if (batch_of[i] == b)
				bl[cnt++] = &ars[i];
		kolo_status_t bst = run_batch(e, bl, cnt, msg, len);
		uint64_t now = kolo_now_ns();
		for (size_t i = 0; i < cnt; i++) {
			if (e->at && bst == KOLO_OK) {
				uint64_t thr;
				double cyc;
				if (kolo_autotune_record(e->at, bl[i]->r->name, bl[i]->bytes, now,
				                         &thr, &cyc))
					kolo_negotiator_set_params(e->neg, thr, cyc);
			}
			complete(e, bl[i]->o, bst, bst == KOLO_OK ? NULL : msg);
			bl[i]->o = NULL;
		}
		if (bst != KOLO_OK) {
			st = bst;
			goto out;
		}
	}
	for (size_t i = 0; i < c->nresp; i++) {
		struct kolo_fusion_response *r = &c->resp[i];
		if (r->status != KOLO_OK || r->p.kind == KOLO_FK_ALLREDUCE ||
		    r->p.kind == KOLO_FK_GROUP)
			continue;
		struct eop *o = r->local ? find_op(e, r->local_id) : NULL;
		if (!o) { /* cannot happen: joined ranks only see allreduces */
			st = KOLO_EPROTO;
			snprintf(msg, len, "response '%s' without a local operation", r->name);
			goto out;
		}
		kolo_status_t ost = run_other(e, r, o, msg, len);
		complete(e, o, ost, ost == KOLO_OK ? NULL : msg);
		if (ost != KOLO_OK && r->p.kind != KOLO_FK_EXCLUSIVE) {
			st = ost;
			goto out;
		}
	}
out:
	if (ars)
		for (size_t i = 0; i < nar; i++)
			free(ars[i].ent);
	free(ars);
	free(items);
	free(batch_of);
	free(bl);
	return st;
}

struct stall_ctx {
	struct kolo_engine *e;
	char report[1024];
};

static void stall_fail(void *arg, const char *name)
{
	struct stall_ctx *s = arg;
	char why[KOLO_ERRBUF_SIZE];
	snprintf(why, sizeof(why),
	         "'%.200s' stalled for more than %g s (KOLO_STALL_SHUTDOWN_SECONDS); missing: "
	         "%.200s",
	         name, s->e->cfg.stall_shutdown_s, s->report);
	kolo_negotiator_fail_name(s->e->neg, name, KOLO_ETIMEDOUT, why);
}

static void mismatch_fail(void *arg, const char *name)
{
	struct stall_ctx *s = arg;
	char why[KOLO_ERRBUF_SIZE];
	snprintf(why, sizeof(why),
	         "ranks disagree about operation names: every rank waits for a name that others "
	         "have not submitted (for more than %g s); missing: %.300s",
	         s->e->cfg.stall_check_s, s->report);
	kolo_negotiator_fail_name(s->e->neg, name, KOLO_EMISMATCH, why);
}

static void stall_inspect(struct kolo_engine *e, uint64_t now)
{
	if (e->rank != 0 || !e->cfg.stall_check)
		return;
	uint64_t warn_ns = (uint64_t)(e->cfg.stall_check_s * 1e9);
	if (now - e->last_stall_warn_ns >= warn_ns) {
		char rep[2048];
		size_t cnt = kolo_negotiator_stall_report(e->neg, now, warn_ns, rep, sizeof(rep));
		if (cnt) {
			KOLO_WARN(
			        SUBSYS,
			        "%zu operation(s) waiting for more than %g s: some ranks have not "
			        "enqueued them. Missing ranks: %s",
			        cnt, e->cfg.stall_check_s, rep);
			if (e->cfg.stall_hook)
				e->cfg.stall_hook(e->cfg.stall_hook_arg, rep);
			e->last_stall_warn_ns = now;
			/* Nobody can progress: fail the stalled names everywhere
			 * instead of waiting forever (Horovod's hang). */
			if (kolo_negotiator_deadlocked(e->neg, now, warn_ns)) {
				struct stall_ctx s = {.e = e};
				snprintf(s.report, sizeof(s.report), "%.1000s", rep);
				kolo_negotiator_stalled(e->neg, now, warn_ns, mismatch_fail, &s);
			}
		}
	}
	if (e->cfg.stall_shutdown_s > 0) {
		uint64_t sd_ns = (uint64_t)(e->cfg.stall_shutdown_s * 1e9);
		struct stall_ctx s = {.e = e};
		kolo_negotiator_stall_report(e->neg, now, sd_ns, s.report, sizeof(s.report));
		kolo_negotiator_stalled(e->neg, now, sd_ns, stall_fail, &s);
	}
}

/* One negotiation cycle and the work it decides. *stop is set when the
 * engine must stop (shutdown requested by some rank). */
static kolo_status_t run_cycle(struct kolo_engine *e, bool shutdown, bool *stop, char *msg,
                               size_t len)
{
	size_t bsz = kolo_negotiator_block_size(e->neg);
	int n = e->size;
	uint8_t *block = malloc(bsz), *blocks = malloc(bsz * (size_t)n), *mymsg = NULL, *all = NULL;
	size_t *counts = calloc((size_t)n, sizeof(size_t));
	size_t *lens = calloc((size_t)n, sizeof(size_t));
	const uint8_t **msgs = calloc((size_t)n, sizeof(*msgs));
	struct kolo_fusion_cycle c = {0};
	size_t mylen = 0;
	kolo_status_t st = KOLO_ENOMEM;
	if (!block || !blocks || !counts || !lens || !msgs)
		goto out;
	st = kolo_negotiator_encode(e->neg, shutdown, block, &mymsg, &mylen);
	if (st != KOLO_OK)
		goto out;
	for (int r = 0; r < n; r++)
		counts[r] = bsz;
	st = kolo_ring_allgatherv(e->rc, block, blocks, counts, KOLO_UINT8);
	if (st != KOLO_OK) {
		ring_fail(e, st, msg, len);
		goto out;
	}
	size_t total = 0;
	for (int r = 0; r < n; r++)
		total += lens[r] = kolo_negotiator_block_msg_len(blocks + (size_t)r * bsz);
	if (total) {
		all = malloc(total);
		if (!all) {
			st = KOLO_ENOMEM;
			goto out;
		}
		st = kolo_ring_allgatherv(e->rc, mymsg ? mymsg : block, all, lens, KOLO_UINT8);
		if (st != KOLO_OK) {
			ring_fail(e, st, msg, len);
			goto out;
		}
	}
	size_t off = 0;
	for (int r = 0; r < n; r++) {
		msgs[r] = all ? all + off : NULL;
		off += lens[r];
	}
	uint64_t now = kolo_now_ns();
	st = kolo_negotiator_decide(e->neg, blocks, msgs, lens, now, &c);
	if (st != KOLO_OK) {
		snprintf(msg, len, "negotiation: malformed control message (%s)",
		         kolo_status_name(st));
		goto out;
	}
	e->cycles++;
	e->others_pending = c.pending;
	tl_ticks(e, &c);
	if (c.has_params) {
		apply_params(e, c.fusion_threshold, c.cycle_time_ms);
		if (e->at)
			kolo_autotune_applied(e->at, now);
	}
	if (c.shutdown) {
		*stop = true;
		st = KOLO_OK;
		goto out;
	}
	st = execute(e, &c, msg, len);
	if (st == KOLO_OK)
		stall_inspect(e, kolo_now_ns());
out:
	kolo_fusion_cycle_fini(&c);
	free(block);
	free(blocks);
	free(mymsg);
	free(all);
	free(counts);
	free(lens);
	free(msgs);
	return st;
}

/* ---- the thread --------------------------------------------------------- */

static void abs_deadline(struct timespec *ts, uint64_t ns_from_now)
{
	clock_gettime(CLOCK_MONOTONIC, ts);
	uint64_t t = (uint64_t)ts->tv_sec * 1000000000ull + (uint64_t)ts->tv_nsec + ns_from_now;
	ts->tv_sec = (time_t)(t / 1000000000ull);
	ts->tv_nsec = (long)(t % 1000000000ull);
}

static void fail_id(void *arg, uint64_t id)
{
	(void)arg;
	(void)id;
}

/* Fails every queued op with st. Lock not held. */
static void fail_all(struct kolo_engine *e, kolo_status_t st, const char *msg)
{
	kolo_negotiator_drain(e->neg, fail_id, NULL);
	for (;;) {
		pthread_mutex_lock(&e->lock);
		struct eop *o = e->ops;
		if (o) {
			e->ops = o->next;
			o->next = NULL;
		}
		e->incoming = NULL;
		e->incoming_tail = &e->incoming;
		pthread_mutex_unlock(&e->lock);
		if (!o)
			break;
		if (o->op.cb)
			o->op.cb(o->op.cb_arg, st);
		if (o->h)
			handle_complete(o->h, st, msg);
		eop_free(o);
	}
}

static void *engine_main(void *arg)
{
	struct kolo_engine *e = arg;
	char msg[KOLO_ERRBUF_SIZE];
	kolo_status_t st = KOLO_OK;
	bool stop = false;
	pthread_mutex_lock(&e->lock);
	while (st == KOLO_OK && !stop) {
		/* Wait for something to do. */
		if (!e->shutdown_req && !e->incoming &&
		    kolo_negotiator_local_pending(e->neg) == 0) {
			int ms = e->others_pending ? backoff_ms(&e->cfg) : heartbeat_ms(&e->cfg);
			struct timespec dl;
			abs_deadline(&dl, (uint64_t)ms * 1000000ull);
			while (!e->shutdown_req && !e->incoming)
				if (pthread_cond_timedwait(&e->cond, &e->lock, &dl) != 0)
					break;
		}
		/* Batch: cycles start at most once per cycle time. */
		uint64_t cyc_ns = (uint64_t)(e->cycle_ms * 1e6);
		uint64_t next = e->last_cycle_ns + cyc_ns, now = kolo_now_ns();
		if (!e->shutdown_req && now < next) {
			struct timespec dl;
			abs_deadline(&dl, next - now);
			while (!e->shutdown_req)
				if (pthread_cond_timedwait(&e->cond, &e->lock, &dl) != 0)
					break;
		}
		/* Hand new ops to the negotiator, oldest first. */
		struct eop *in = e->incoming;
		e->incoming = NULL;
		e->incoming_tail = &e->incoming;
		bool shutdown = e->shutdown_req;
		pthread_mutex_unlock(&e->lock);
		for (struct eop *o = in; o; o = o->next_in) {
			kolo_status_t sst = kolo_negotiator_submit(e->neg, o->name, &o->p, o->id);
			if (sst != KOLO_OK)
				complete(e, o, sst, "cannot queue the operation");
		}
		e->last_cycle_ns = kolo_now_ns();
		msg[0] = '\0';
		st = run_cycle(e, shutdown, &stop, msg, sizeof(msg));
		pthread_mutex_lock(&e->lock);
	}
	if (st != KOLO_OK) {
		e->fail_st = st;
		snprintf(e->fail_msg, sizeof(e->fail_msg), "fusion engine stopped: %s",
		         msg[0] ? msg : kolo_strerror(st));
		kolo_log(e->aborted || st == KOLO_EMEMBERSHIP ? KOLO_LOG_INFO : KOLO_LOG_ERROR,
		         SUBSYS, "%s", e->fail_msg);
	} else {
		e->fail_st = KOLO_ESHUTDOWN;
		snprintf(e->fail_msg, sizeof(e->fail_msg), "the fusion engine was shut down");
	}
	e->stopped = true;
	kolo_status_t fst = e->fail_st;
	char fmsg[KOLO_ERRBUF_SIZE];
	snprintf(fmsg, sizeof(fmsg), "%s", e->fail_msg);
	pthread_cond_broadcast(&e->cond);
	pthread_mutex_unlock(&e->lock);
	fail_all(e, fst, fmsg);
	return NULL;
}

/* ---- lifecycle ---------------------------------------------------------- */

kolo_status_t kolo_engine_create(struct kolo_ring_comm *rc, int rank, int size,
                                 const struct kolo_engine_config *cfg, struct kolo_engine **out,
                                 struct kolo_errbuf *eb)
{
	*out = NULL;
	if (!rc || size < 1 || rank < 0 || rank >= size)
		return kolo_fail(eb, KOLO_EINVAL, "engine: invalid arguments");
	struct kolo_engine *e = calloc(1, sizeof(*e));
	if (!e)
		return KOLO_ENOMEM;
	e->rc = rc;
	e->rank = rank;
	e->size = size;
	if (cfg)
		e->cfg = *cfg;
	else
		kolo_engine_config_from_params(&e->cfg);
	if (e->cfg.timeout_ms <= 0)
		e->cfg.timeout_ms = 30000;
	e->threshold = e->cfg.fusion_threshold;
	e->cycle_ms = e->cfg.cycle_time_ms > 0 ? e->cfg.cycle_time_ms : 0;
	pthread_mutex_init(&e->lock, NULL);
	pthread_mutex_init(&e->tl_lock, NULL);
	pthread_mutex_init(&e->shutdown_lock, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&e->cond, &ca);
	pthread_condattr_destroy(&ca);
	e->incoming_tail = &e->incoming;
	e->last_stall_warn_ns = kolo_now_ns();
	kolo_status_t st = kolo_negotiator_create(rank, size, e->cfg.cache_capacity, &e->neg);
	if (st != KOLO_OK) {
		kolo_fail(eb, st, "engine: negotiator");
		goto fail;
	}
	/* "DYNAMIC" (Horovod's spelling): only kolo_timeline_start() writes. */
	if (rank == 0 && e->cfg.timeline[0] && strcmp(e->cfg.timeline, "DYNAMIC") != 0) {
		st = kolo_timeline_create(e->cfg.timeline, 1u << 20, e->cfg.timeline_mark_cycles,
		                          &e->tl, eb);
		if (st != KOLO_OK)
			goto fail;
	}
	if (rank == 0 && e->cfg.autotune) {
		struct kolo_autotune_config ac = {
		        .threshold = e->threshold,
		        .cycle_time_ms = e->cycle_ms,
		        .steps_per_sample = 10,
		        .warmup_samples = 1,
		        .samples_per_candidate = 3,
		        .log_path = e->cfg.autotune_log[0] ? e->cfg.autotune_log : NULL,
		};
		st = kolo_autotune_create(&ac, &e->at);
		if (st != KOLO_OK) {
			kolo_fail(eb, st, "engine: autotune log %s", e->cfg.autotune_log);
			goto fail;
		}
	}
	if (pthread_create(&e->thread, NULL, engine_main, e) != 0) {
		st = kolo_fail(eb, KOLO_ESYSTEM, "engine: cannot start the thread");
		goto fail;
	}
	e->thread_started = true;
	KOLO_DEBUG(SUBSYS, "engine started: threshold %llu, cycle %g ms, cache %d, heartbeat %d ms",
	           (unsigned long long)e->threshold, e->cycle_ms, e->cfg.cache_capacity,
	           heartbeat_ms(&e->cfg));
	*out = e;
	return KOLO_OK;
fail:
	kolo_engine_destroy(e);
	return st;
}

void kolo_engine_shutdown(struct kolo_engine *e)
{
	if (!e)
		return;
	pthread_mutex_lock(&e->shutdown_lock);
	if (!e->thread_started) {
		pthread_mutex_unlock(&e->shutdown_lock);
		return;
	}
	pthread_mutex_lock(&e->lock);
	e->shutdown_req = true;
	pthread_cond_broadcast(&e->cond);
	/* Peers answer within their idle heartbeat; a dead one fails the ring
	 * within its timeout. Past both, stop waiting. */
	uint64_t wait_ns =
	        ((uint64_t)heartbeat_ms(&e->cfg) + (uint64_t)e->cfg.timeout_ms + 2000) * 1000000ull;
	struct timespec dl;
	abs_deadline(&dl, wait_ns);
	while (!e->stopped)
		if (pthread_cond_timedwait(&e->cond, &e->lock, &dl) != 0)
			break;
	bool stopped = e->stopped;
	pthread_mutex_unlock(&e->lock);
	if (!stopped) {
		KOLO_WARN(SUBSYS, "engine: peers did not answer the shutdown; aborting the ring");
		kolo_ring_abort(e->rc, KOLO_ESHUTDOWN);
	}
	pthread_join(e->thread, NULL);
	e->thread_started = false;
	pthread_mutex_unlock(&e->shutdown_lock);
}

void kolo_engine_abort(struct kolo_engine *e, kolo_status_t st)
{
	if (!e)
		return;
	pthread_mutex_lock(&e->lock);
	e->aborted = true;
	pthread_cond_broadcast(&e->cond);
	pthread_mutex_unlock(&e->lock);
	kolo_ring_abort(e->rc, st == KOLO_OK ? KOLO_EMEMBERSHIP : st);
}

void kolo_engine_destroy(struct kolo_engine *e)
{
	if (!e)
		return;
	kolo_engine_shutdown(e);
	if (e->neg) {
		/* Only ops that never reached the thread can be left. */
		fail_all(e, KOLO_ESHUTDOWN, "the fusion engine was shut down");
		kolo_negotiator_destroy(e->neg);
	}
	kolo_timeline_destroy(e->tl);
	kolo_autotune_destroy(e->at);
	set_clear(&e->tl_open);
	free(e->fbuf);
	pthread_mutex_destroy(&e->lock);
	pthread_mutex_destroy(&e->tl_lock);
	pthread_mutex_destroy(&e->shutdown_lock);
	pthread_cond_destroy(&e->cond);
	free(e);
}

kolo_status_t kolo_engine_timeline_start(struct kolo_engine *e, const char *path,
                                         struct kolo_errbuf *eb)
{
	if (!e || !path || !path[0])
		return kolo_fail(eb, KOLO_EINVAL, "timeline: no path");
	if (e->rank != 0)
		return KOLO_OK;
	struct kolo_timeline *t;
	kolo_status_t st =
	        kolo_timeline_create(path, 1u << 20, e->cfg.timeline_mark_cycles, &t, eb);
	if (st != KOLO_OK)
		return st;
	pthread_mutex_lock(&e->tl_lock);
	struct kolo_timeline *old = e->tl;
	e->tl = t;
	set_clear(&e->tl_open);
	pthread_mutex_unlock(&e->tl_lock);
	kolo_timeline_destroy(old);
	return KOLO_OK;
}

kolo_status_t kolo_engine_timeline_stop(struct kolo_engine *e)
{
	if (!e)
		return KOLO_EINVAL;
	pthread_mutex_lock(&e->tl_lock);
	struct kolo_timeline *old = e->tl;
	e->tl = NULL;
	set_clear(&e->tl_open);
	pthread_mutex_unlock(&e->tl_lock);
	kolo_timeline_destroy(old);
	return KOLO_OK;
}

/* ---- enqueue ------------------------------------------------------------ */

static kolo_status_t build(struct kolo_engine *e, const struct kolo_engine_op *op, uint64_t seq,
                           struct eop *o, struct kolo_errbuf *eb)
{
	int n = e->size;
	struct kolo_fusion_params *p = &o->p;
	p->kind = (uint8_t)op->kind;
	p->dtype = (uint8_t)op->dtype;
	p->op = (uint8_t)op->op;
	p->root = op->root;
	p->prescale = op->prescale;
	p->postscale = op->postscale;
	bool named = op->kind != KOLO_FK_BARRIER && op->kind != KOLO_FK_JOIN &&
	             op->kind != KOLO_FK_EXCLUSIVE && op->kind != KOLO_FK_GROUP;
	if (op->kind <= 0 || op->kind >= KOLO_FK_COUNT)
		return kolo_fail(eb, KOLO_EINVAL, "unknown operation kind %d", op->kind);
	if (named && (!op->name || !op->name[0] || strlen(op->name) >= 1024))
		return kolo_fail(eb, KOLO_EINVAL, "an operation needs a name (1-1023 bytes)");
	bool typed = op->kind != KOLO_FK_BARRIER && op->kind != KOLO_FK_JOIN &&
	             op->kind != KOLO_FK_EXCLUSIVE;
	if (typed && (unsigned)op->dtype >= KOLO_DTYPE_COUNT)
		return kolo_fail(eb, KOLO_EINVAL, "'%s': invalid dtype %d",
		                 op->name ? op->name : "", (int)op->dtype);
	if (!typed)
		p->dtype = 0;
	bool reducing = op->kind == KOLO_FK_ALLREDUCE || op->kind == KOLO_FK_GROUP ||
	                op->kind == KOLO_FK_REDUCESCATTER;
	if (reducing) {
		if ((unsigned)op->op >= KOLO_OP_COUNT)
			return kolo_fail(eb, KOLO_EINVAL, "invalid op %d", (int)op->op);
		if (!isfinite(op->prescale) || !isfinite(op->postscale))
			return kolo_fail(eb, KOLO_EINVAL, "scale factors must be finite");
	} else {
		p->op = 0;
		p->prescale = p->postscale = 1.0;
	}
	if (op->kind != KOLO_FK_BROADCAST)
		p->root = 0;
	char nb[64];
	switch (op->kind) {
	case KOLO_FK_ALLREDUCE:
	case KOLO_FK_REDUCESCATTER:
	case KOLO_FK_BROADCAST:
		if (op->count &&
		    (op->kind == KOLO_FK_BROADCAST ? !op->recvbuf : (!op->sendbuf || !op->recvbuf)))
			return kolo_fail(eb, KOLO_EINVAL, "'%s': NULL buffer", op->name);
		if (op->kind == KOLO_FK_BROADCAST && (op->root < 0 || op->root >= n))
			return kolo_fail(eb, KOLO_EINVAL, "'%s': root %d is not a rank", op->name,
			                 op->root);
		p->ncounts = 1;
		break;
	case KOLO_FK_ALLGATHER:
		if ((op->count && !op->sendbuf) || !op->recvbuf_out || !op->recvcounts)
			return kolo_fail(eb, KOLO_EINVAL, "'%s': NULL buffer", op->name);
		p->ncounts = 1;
		break;
	case KOLO_FK_ALLTOALL:
		if ((op->count && !op->sendbuf) || !op->recvbuf_out || !op->recvcounts)
			return kolo_fail(eb, KOLO_EINVAL, "'%s': NULL buffer", op->name);
		if (!op->sendcounts && op->count % (size_t)n)
			return kolo_fail(eb, KOLO_EINVAL,
			                 "'%s': count %zu does not split evenly over %d ranks",
			                 op->name, op->count, n);
		p->ncounts = (uint32_t)n;
		break;
	case KOLO_FK_GROUP:
		if (op->n < 1 || !op->names || !op->sendbufs || !op->recvbufs || !op->counts)
			return kolo_fail(eb, KOLO_EINVAL, "grouped allreduce: bad arguments");
		p->ncounts = (uint32_t)op->n;
		break;
	case KOLO_FK_EXCLUSIVE:
		if (!op->fn)
			return kolo_fail(eb, KOLO_EINVAL, "exclusive operation without a function");
		break;
	default:
		break;
	}
	if (p->ncounts) {
		p->counts = calloc(p->ncounts, sizeof(uint64_t));
		if (!p->counts)
			return KOLO_ENOMEM;
	}
	switch (op->kind) {
	case KOLO_FK_ALLTOALL:
		for (int i = 0; i < n; i++)
			p->counts[i] = op->sendcounts ? op->sendcounts[i] : op->count / (size_t)n;
		break;
	case KOLO_FK_GROUP: {
		size_t len = 7;
		for (int i = 0; i < op->n; i++) {
			if (!op->names[i] || !op->names[i][0])
				return kolo_fail(eb, KOLO_EINVAL, "grouped allreduce: empty name");
			if (op->counts[i] && (!op->sendbufs[i] || !op->recvbufs[i]))
				return kolo_fail(eb, KOLO_EINVAL,
				                 "grouped allreduce '%s': NULL buffer",
				                 op->names[i]);
			for (int j = 0; j < i; j++)
				if (strcmp(op->names[i], op->names[j]) == 0)
					return kolo_fail(eb, KOLO_EINVAL,
					                 "grouped allreduce: '%s' appears twice",
					                 op->names[i]);
			len += strlen(op->names[i]) + 1;
			p->counts[i] = op->counts[i];
		}
		if (len >= KOLO_FUSION_NAME_MAX)
			return kolo_fail(eb, KOLO_EINVAL, "grouped allreduce: names too long");
		o->name = malloc(len + 1);
		o->sendbufs = calloc((size_t)op->n, sizeof(void *));
		o->recvbufs = calloc((size_t)op->n, sizeof(void *));
		if (!o->name || !o->sendbufs || !o->recvbufs)
			return KOLO_ENOMEM;
		strcpy(o->name, "group:");
		for (int i = 0; i < op->n; i++) {
			strcat(o->name, op->names[i]);
			strcat(o->name, i + 1 < op->n ? "," : "");
			o->sendbufs[i] = op->sendbufs[i];
			o->recvbufs[i] = op->recvbufs[i];
		}
		break;
	}
	default:
		if (p->ncounts)
			p->counts[0] = op->count;
	}
	if (!o->name) {
		if (named) {
			o->name = strdup(op->name);
		} else {
			snprintf(nb, sizeof(nb), "kolo.%s.%llu",
			         op->kind == KOLO_FK_BARRIER
			                 ? "barrier"
			                 : (op->kind == KOLO_FK_JOIN ? "join" : "exclusive"),
			         (unsigned long long)seq);
			o->name = strdup(nb);
		}
		if (!o->name)
			return KOLO_ENOMEM;
	}
	o->op = *op;
	o->op.name = NULL;
	o->op.names = NULL;
	o->op.sendbufs = NULL;
	o->op.recvbufs = NULL;
	o->op.counts = NULL;
	o->op.sendcounts = NULL;
	return KOLO_OK;
}

kolo_status_t kolo_engine_enqueue(struct kolo_engine *e, const struct kolo_engine_op *op,
                                  kolo_handle_t **handle, struct kolo_errbuf *eb)
{
	if (handle)
		*handle = NULL;
	if (!e || !op)
		return kolo_fail(eb, KOLO_EINVAL, "no engine or operation");
	struct eop *o = calloc(1, sizeof(*o));
	if (!o)
		return KOLO_ENOMEM;
	if (handle) {
		o->h = handle_new(op->owner, 2);
		if (!o->h) {
			eop_free(o);
			return KOLO_ENOMEM;
		}
	}
	/* The lock covers numbering, so concurrent barriers get distinct names. */
	pthread_mutex_lock(&e->lock);
	uint64_t seq = 0;
	if (op->kind == KOLO_FK_BARRIER)
		seq = e->barrier_seq;
	else if (op->kind == KOLO_FK_JOIN)
		seq = e->join_seq;
	else if (op->kind == KOLO_FK_EXCLUSIVE)
		seq = e->excl_seq;
	kolo_status_t st = build(e, op, seq, o, eb);
	if (st != KOLO_OK) {
		pthread_mutex_unlock(&e->lock);
		if (o->h) {
			o->h->refs = 1;
			kolo_handle_drop(o->h);
		}
		eop_free(o);
		return st;
	}
	if (e->stopped || e->shutdown_req) {
		kolo_status_t fst = e->stopped ? e->fail_st : KOLO_ESHUTDOWN;
		kolo_fail(eb, fst, "%s",
		          e->stopped ? e->fail_msg : "the fusion engine is shutting down");
		pthread_mutex_unlock(&e->lock);
		if (o->h) {
			o->h->refs = 1;
			kolo_handle_drop(o->h);
		}
		eop_free(o);
		return fst;
	}
	for (struct eop *q = e->ops; q; q = q->next)
		if (strcmp(q->name, o->name) == 0) {
			pthread_mutex_unlock(&e->lock);
			kolo_fail(eb, KOLO_EINVAL,
			          "'%s' is already pending (a name may be reused "
			          "once its operation has completed)",
			          o->name);
			if (o->h) {
				o->h->refs = 1;
				kolo_handle_drop(o->h);
			}
			eop_free(o);
			return KOLO_EINVAL;
		}
	if (op->kind == KOLO_FK_BARRIER)
		e->barrier_seq++;
	else if (op->kind == KOLO_FK_JOIN)
		e->join_seq++;
	else if (op->kind == KOLO_FK_EXCLUSIVE)
		e->excl_seq++;
	o->id = ++e->next_id;
	o->next = e->ops;
	e->ops = o;
	*e->incoming_tail = o;
	e->incoming_tail = &o->next_in;
	if (handle)
		*handle = o->h;
	pthread_cond_broadcast(&e->cond);
	pthread_mutex_unlock(&e->lock);
	return KOLO_OK;
}

kolo_status_t kolo_engine_run(struct kolo_engine *e, const struct kolo_engine_op *op,
                              struct kolo_errbuf *eb)
{
	kolo_handle_t *h = NULL;
	KOLO_CHECK(kolo_engine_enqueue(e, op, &h, eb));
	return kolo_handle_wait_release(h, eb);
}

kolo_status_t kolo_engine_run_exclusive(struct kolo_engine *e,
                                        kolo_status_t (*fn)(void *arg, struct kolo_ring_comm *rc),
                                        void *arg, struct kolo_errbuf *eb)
{
	struct kolo_engine_op op = {.kind = KOLO_FK_EXCLUSIVE, .fn = fn, .fn_arg = arg};
	return kolo_engine_run(e, &op, eb);
}
