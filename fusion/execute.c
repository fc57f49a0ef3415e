/* execute: running the responses of one cycle. Failed responses complete at
 * once; allreduces are planned into batches, each packed into the fusion
 * buffer (or run straight from the caller's buffers), reduced and unpacked;
 * every other kind runs its own collective. */
#include "fusion_internal.h"

#include <stdlib.h>
#include <string.h>

#define SUBSYS "fusion"

struct batch_entry { /* one tensor of an allreduce batch */
	const char *name;
	const void *send; /* NULL: zeros (a joined rank) */
	void *recv;       /* NULL: discard */
	size_t count;
};

/* One allreduce or grouped allreduce response: its tensors and their bytes. */
struct fused_item {
	struct fusion_response *r;
	struct fusion_queued_op *o;
	struct batch_entry *ent;
	size_t nent;
	uint64_t bytes;
	bool direct; /* fusion_item.direct */
};

/* Allreduce of one tensor straight from / to the caller's buffers. */
static kolo_status_t run_direct(struct kolo_engine *e, const struct fusion_params *p,
                                const struct batch_entry *en, char *msg, size_t len)
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
		return fusion_engine_ring_error(e, st, msg, len);
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

/* Begins (or, begin NULL, ends) an activity for the items of a batch that
 * overlap [lo, hi) of the packed bytes. */
static void tl_window(struct kolo_engine *e, struct fused_item **b, size_t nb,
                      const uint64_t *item_off, uint64_t lo, uint64_t hi, const char *begin)
{
	for (size_t i = 0; i < nb; i++) {
		uint64_t ilo = item_off[i], ihi = item_off[i] + b[i]->bytes;
		if (ihi <= lo || ilo >= hi || ihi == ilo)
			continue;
		if (begin)
			fusion_engine_tl_begin(e, b[i]->r->name, begin);
		else
			fusion_engine_tl_end(e, b[i]->r->name);
	}
}

/* ---- a fused batch ------------------------------------------------------ */

/* Where each tensor (entry) and each item of a batch starts in the packed
 * bytes. */
struct batch_layout {
	const struct batch_entry **ent;
	uint64_t *entry_off;
	uint64_t *item_off;
	size_t nent;
};

static void layout_free(struct batch_layout *l)
{
	free(l->entry_off);
	free(l->item_off);
	free(l->ent);
}

static kolo_status_t layout_build(struct batch_layout *l, struct fused_item **b, size_t nb,
                                  size_t nent, size_t esz)
{
	l->nent = nent;
	l->entry_off = calloc(nent, sizeof(uint64_t));
	l->item_off = calloc(nb, sizeof(uint64_t));
	l->ent = calloc(nent, sizeof(*l->ent));
	if (!l->entry_off || !l->item_off || !l->ent) {
		layout_free(l);
		return KOLO_ENOMEM;
	}
	uint64_t off = 0;
	size_t k = 0;
	for (size_t i = 0; i < nb; i++) {
		l->item_off[i] = off;
		for (size_t j = 0; j < b[i]->nent; j++, k++) {
			l->ent[k] = &b[i]->ent[j];
			l->entry_off[k] = off;
			off += l->ent[k]->count * esz;
		}
	}
	return KOLO_OK;
}

/* Copies [lo, hi) of the packed bytes into the fusion buffer, prescaled;
 * a joined rank's entries are zeros. */
static void pack_window(struct kolo_engine *e, kolo_dtype_t dt, double prescale,
                        const struct batch_layout *l, uint64_t lo, uint64_t hi)
{
	size_t esz = kolo_dtype_size(dt);
	for (size_t k = 0; k < l->nent; k++) {
		uint64_t a = KOLO_MAX(lo, l->entry_off[k]),
		         z = KOLO_MIN(hi, l->entry_off[k] + l->ent[k]->count * esz);
		if (a >= z)
			continue;
		uint8_t *dst = e->fbuf + (a - lo);
		const uint8_t *src = (const uint8_t *)l->ent[k]->send + (a - l->entry_off[k]);
		if (!l->ent[k]->send)
			memset(dst, 0, z - a);
		else if (prescale != 1.0)
			kolo_scale(dst, src, (size_t)(z - a) / esz, dt, prescale);
		else
			memcpy(dst, src, z - a);
	}
}

/* Copies [lo, hi) of the reduced fusion buffer out, scaled by factor. */
static void unpack_window(struct kolo_engine *e, kolo_dtype_t dt, double factor,
                          const struct batch_layout *l, uint64_t lo, uint64_t hi)
{
	size_t esz = kolo_dtype_size(dt);
	for (size_t k = 0; k < l->nent; k++) {
		uint64_t a = KOLO_MAX(lo, l->entry_off[k]),
		         z = KOLO_MIN(hi, l->entry_off[k] + l->ent[k]->count * esz);
		if (a >= z || !l->ent[k]->recv)
			continue;
		uint8_t *dst = (uint8_t *)l->ent[k]->recv + (a - l->entry_off[k]);
		const uint8_t *src = e->fbuf + (a - lo);
		if (factor != 1.0)
			kolo_scale(dst, src, (size_t)(z - a) / esz, dt, factor);
		else
			memcpy(dst, src, z - a);
	}
}

/* A batch run tensor by tensor from the caller's buffers: a lone tensor, or
 * a batch too large for the buffer (no copies). */
static kolo_status_t run_unfused(struct kolo_engine *e, struct fused_item **b, size_t nb, bool tl,
                                 char *msg, size_t len)
{
	const struct fusion_params *p = &b[0]->r->p;
	for (size_t i = 0; i < nb; i++) {
		if (tl)
			fusion_engine_tl_begin(e, b[i]->r->name,
			                       fusion_kind_name(KOLO_FK_ALLREDUCE));
		for (size_t k = 0; k < b[i]->nent; k++) {
			kolo_status_t st = run_direct(e, p, &b[i]->ent[k], msg, len);
			if (st != KOLO_OK)
				return st;
		}
		if (tl)
			fusion_engine_tl_end(e, b[i]->r->name);
	}
	return KOLO_OK;
}

/* A batch packed into the fusion buffer, reduced and unpacked, one block of
 * block_bytes() at a time. AVERAGE is a SUM scaled on the way out. */
static kolo_status_t run_packed(struct kolo_engine *e, struct fused_item **b, size_t nb,
                                size_t nent, uint64_t total, bool tl, char *msg, size_t len)
{
	const struct fusion_params *p = &b[0]->r->p;
	kolo_dtype_t dt = (kolo_dtype_t)p->dtype;
	size_t esz = kolo_dtype_size(dt);
	size_t blk = block_bytes(e, esz);
	kolo_status_t st = ensure_fbuf(e, KOLO_MIN((size_t)total, blk));
	if (st != KOLO_OK)
		return st;
	struct batch_layout l = {0};
	st = layout_build(&l, b, nb, nent, esz);
	if (st != KOLO_OK)
		return st;
	kolo_op_t op = (kolo_op_t)p->op;
	double factor = p->postscale;
	if (op == KOLO_AVERAGE) {
		op = KOLO_SUM;
		factor /= (double)e->size;
	}
	for (uint64_t lo = 0, hi = 0; lo < total && st == KOLO_OK; lo = hi) {
		hi = total - lo > blk ? lo + blk : total;
		if (tl)
			tl_window(e, b, nb, l.item_off, lo, hi, "MEMCPY_IN_FUSION_BUFFER");
		pack_window(e, dt, p->prescale, &l, lo, hi);
		if (tl) {
			tl_window(e, b, nb, l.item_off, lo, hi, NULL);
			tl_window(e, b, nb, l.item_off, lo, hi,
			          fusion_kind_name(KOLO_FK_ALLREDUCE));
		}
		st = kolo_ring_allreduce(e->rc, e->fbuf, e->fbuf, (size_t)(hi - lo) / esz, dt, op,
		                         1.0, 1.0);
		if (st != KOLO_OK) {
			fusion_engine_ring_error(e, st, msg, len);
			break;
		}
		if (tl) {
			tl_window(e, b, nb, l.item_off, lo, hi, NULL);
			tl_window(e, b, nb, l.item_off, lo, hi, "MEMCPY_OUT_FUSION_BUFFER");
		}
		unpack_window(e, dt, factor, &l, lo, hi);
		if (tl)
			tl_window(e, b, nb, l.item_off, lo, hi, NULL);
	}
	layout_free(&l);
	return st;
}

/* A batch with direct items, as one allreduce over pieces: the packed items
 * in the fusion buffer (copied in unscaled; the ring scales every piece
 * alike) and each direct tensor from the caller's buffers. Which item is a
 * piece depends on the negotiated sizes only, so every rank lays the pieces
 * out alike (a rank that joined reduces zeros from scratch). */
static kolo_status_t run_pieces(struct kolo_engine *e, struct fused_item **b, size_t nb,
                                size_t nent, bool tl, char *msg, size_t len)
{
	const struct fusion_params *p = &b[0]->r->p;
	kolo_dtype_t dt = (kolo_dtype_t)p->dtype;
	size_t esz = kolo_dtype_size(dt);
	struct fused_item **packed = calloc(nb, sizeof(*packed));
	struct kolo_ring_piece *pc = calloc(nent + 1, sizeof(*pc));
	void **scratch = calloc(nent + 1, sizeof(*scratch));
	struct batch_layout l = {0};
	kolo_status_t st = packed && pc && scratch ? KOLO_OK : KOLO_ENOMEM;
	size_t npk = 0, npkent = 0, np = 1, ns = 0;
	uint64_t ptotal = 0;
	for (size_t i = 0; i < nb && st == KOLO_OK; i++) {
		if (!b[i]->direct) {
			packed[npk++] = b[i];
			npkent += b[i]->nent;
			ptotal += b[i]->bytes;
			continue;
		}
		for (size_t k = 0; k < b[i]->nent && st == KOLO_OK; k++) {
			const struct batch_entry *en = &b[i]->ent[k];
			struct kolo_ring_piece *q = &pc[np++];
			*q = (struct kolo_ring_piece){en->send, en->recv, en->count};
			if (en->send && en->recv)
				continue;
			if (!(scratch[ns] = calloc(en->count ? en->count : 1, esz))) {
				st = KOLO_ENOMEM;
				break;
			}
			if (en->send) /* the result is discarded */
				memcpy(scratch[ns], en->send, en->count * esz);
			q->send = q->recv = scratch[ns++];
		}
	}
	if (st == KOLO_OK && ptotal)
		st = ensure_fbuf(e, (size_t)ptotal);
	if (st == KOLO_OK && npk)
		st = layout_build(&l, packed, npk, npkent, esz);
	if (st == KOLO_OK) {
		pc[0] = (struct kolo_ring_piece){e->fbuf, e->fbuf, (size_t)ptotal / esz};
		if (tl)
			tl_window(e, packed, npk, l.item_off, 0, ptotal, "MEMCPY_IN_FUSION_BUFFER");
		pack_window(e, dt, 1.0, &l, 0, ptotal);
		if (tl) {
			tl_window(e, packed, npk, l.item_off, 0, ptotal, NULL);
			for (size_t i = 0; i < nb; i++)
				fusion_engine_tl_begin(e, b[i]->r->name,
				                       fusion_kind_name(KOLO_FK_ALLREDUCE));
		}
		st = kolo_ring_allreduce_pieces(e->rc, pc, np, dt, (kolo_op_t)p->op, p->prescale,
		                                p->postscale);
		if (st != KOLO_OK) {
			fusion_engine_ring_error(e, st, msg, len);
		} else {
			if (tl) {
				for (size_t i = 0; i < nb; i++)
					fusion_engine_tl_end(e, b[i]->r->name);
				tl_window(e, packed, npk, l.item_off, 0, ptotal,
				          "MEMCPY_OUT_FUSION_BUFFER");
			}
			unpack_window(e, dt, 1.0, &l, 0, ptotal);
			if (tl)
				tl_window(e, packed, npk, l.item_off, 0, ptotal, NULL);
		}
	}
	layout_free(&l);
	for (size_t i = 0; i < ns; i++)
		free(scratch[i]);
	free(scratch);
	free(pc);
	free(packed);
	return st;
}

/* ---- device tensors -------------------------------------------------------
 * Their collectives run in runtime/ (cfg.device: staged through pinned host
 * memory, or NCCL), after each op's ready event; a fused batch is packed into
 * the device fusion buffer and unpacked with device-to-device copies on
 * kolo's stream, which runs before the collective's own copies. */

static kolo_status_t dev_coll(struct kolo_engine *e, const struct kolo_dcoll *c, char *msg,
                              size_t len)
{
	if (!e->cfg.device.coll) {
		snprintf(msg, len, "device buffers, but this engine has no device path");
		return KOLO_EUNSUPPORTED;
	}
	struct kolo_errbuf eb = {{0}};
	kolo_status_t st = e->cfg.device.coll(e->cfg.device.arg, e->rc, c, &eb);
	if (st != KOLO_OK)
		snprintf(msg, len, "%s", eb.msg);
	return st;
}

static kolo_status_t dev_fail(kolo_status_t st, const struct kolo_errbuf *eb, char *msg, size_t len)
{
	snprintf(msg, len, "%s", eb->msg);
	return st;
}

static void *ready_of(const struct fused_item *it)
{
	return it->o ? it->o->op.ready_event : NULL;
}

static kolo_status_t dev_allreduce(struct kolo_engine *e, const struct fusion_params *p,
                                   const void *send, void *recv, size_t count, void *after,
                                   char *msg, size_t len)
{
	struct kolo_dcoll c = {.kind = KOLO_DC_ALLREDUCE,
	                       .send = send,
	                       .recv = recv,
	                       .count = count,
	                       .dtype = (kolo_dtype_t)p->dtype,
	                       .op = (kolo_op_t)p->op,
	                       .pre = p->prescale,
	                       .post = p->postscale,
	                       .after = after};
	return dev_coll(e, &c, msg, len);
}

/* Tensor by tensor from the caller's buffers; a joined rank reduces zeros
 * from host scratch, through the same collectives. */
static kolo_status_t dev_unfused(struct kolo_engine *e, struct fused_item **b, size_t nb, bool tl,
                                 char *msg, size_t len)
{
	const struct fusion_params *p = &b[0]->r->p;
	size_t esz = kolo_dtype_size((kolo_dtype_t)p->dtype);
	for (size_t i = 0; i < nb; i++) {
		if (tl)
			fusion_engine_tl_begin(e, b[i]->r->name,
			                       fusion_kind_name(KOLO_FK_ALLREDUCE));
		for (size_t k = 0; k < b[i]->nent; k++) {
			const struct batch_entry *en = &b[i]->ent[k];
			if (!en->count)
				continue;
			void *scratch = NULL;
			if (!en->send && !(scratch = calloc(en->count, esz)))
				return KOLO_ENOMEM;
			kolo_status_t st = dev_allreduce(e, p, scratch ? scratch : en->send,
			                                 scratch ? scratch : en->recv, en->count,
			                                 ready_of(b[i]), msg, len);
			free(scratch);
			if (st != KOLO_OK)
				return st;
		}
		if (tl)
			fusion_engine_tl_end(e, b[i]->r->name);
	}
	return KOLO_OK;
}

/* The device fusion buffer on the engine thread's current device. */
static kolo_status_t ensure_dfbuf(struct kolo_engine *e, int ordinal, size_t bytes,
                                  struct kolo_errbuf *eb)
{
	if (e->dfbuf && e->dfbuf_dev == ordinal && bytes <= e->dfbuf_cap)
		return KOLO_OK;
	kolo_gpu_free(e->dfbuf);
	e->dfbuf = NULL;
	e->dfbuf_cap = 0;
	KOLO_CHECK(kolo_gpu_malloc(&e->dfbuf, bytes, eb));
	e->dfbuf_cap = bytes;
	e->dfbuf_dev = ordinal;
	KOLO_DEBUG(SUBSYS, "device fusion buffer: %zu bytes on device %d", bytes, ordinal);
	return KOLO_OK;
}

/* The first device (or managed) buffer of the batch's ops, or -1 when this
 * rank has none (it joined: zeros). */
static int batch_ordinal(struct fused_item **b, size_t nb)
{
	for (size_t i = 0; i < nb; i++)
		for (size_t k = 0; k < b[i]->nent; k++) {
			const void *q = b[i]->ent[k].send;
			int ord;
			if (q && kolo_mem_kind(q) == KOLO_MEM_DEVICE &&
			    kolo_gpu_ptr_device(q, &ord, NULL) == KOLO_OK)
				return ord;
		}
	return -1;
}

static kolo_status_t dev_packed(struct kolo_engine *e, struct fused_item **b, size_t nb,
                                size_t nent, uint64_t total, bool tl, char *msg, size_t len)
{
	const struct fusion_params *p = &b[0]->r->p;
	size_t esz = kolo_dtype_size((kolo_dtype_t)p->dtype);
	struct batch_layout l = {0};
	KOLO_CHECK(layout_build(&l, b, nb, nent, esz));
	struct kolo_errbuf eb = {{0}};
	int ordinal = batch_ordinal(b, nb);
	kolo_status_t st = KOLO_OK;
	if (ordinal < 0) {
		/* No device here: zeros from the host buffer, through the same
		 * device collective as every other rank. */
		st = ensure_fbuf(e, (size_t)total);
		if (st == KOLO_OK) {
			memset(e->fbuf, 0, (size_t)total);
			st = dev_allreduce(e, p, e->fbuf, e->fbuf, (size_t)total / esz, NULL, msg,
			                   len);
		}
		layout_free(&l);
		return st;
	}
	void *s = NULL;
	int tmo = e->cfg.device.timeout_ms;
	st = e->cfg.device.stream ? e->cfg.device.stream(e->cfg.device.arg, ordinal, &s, &eb)
	                          : kolo_fail(&eb, KOLO_EUNSUPPORTED, "no device path");
	if (st == KOLO_OK)
		st = ensure_dfbuf(e, ordinal, (size_t)total, &eb);
	/* Each op's input is ready once its caller's stream reached the event. */
	for (size_t i = 0; i < nb && st == KOLO_OK; i++)
		if (ready_of(b[i]))
			st = kolo_gpu_stream_wait_event(s, ready_of(b[i]), &eb);
	if (st != KOLO_OK)
		goto out;
	if (tl)
		tl_window(e, b, nb, l.item_off, 0, total, "MEMCPY_IN_FUSION_BUFFER");
	for (size_t k = 0; k < l.nent && st == KOLO_OK; k++) {
		uint8_t *dst = (uint8_t *)e->dfbuf + l.entry_off[k];
		size_t n = l.ent[k]->count * esz;
		st = l.ent[k]->send ? kolo_gpu_memcpy_async(dst, l.ent[k]->send, n, s, &eb)
		                    : kolo_gpu_memset_async(dst, 0, n, s, &eb);
	}
	if (st == KOLO_OK)
		st = kolo_gpu_stream_sync(s, tmo, &eb);
	if (tl)
		tl_window(e, b, nb, l.item_off, 0, total, NULL);
	if (st != KOLO_OK)
		goto out;
	if (tl)
		tl_window(e, b, nb, l.item_off, 0, total, fusion_kind_name(KOLO_FK_ALLREDUCE));
	kolo_status_t cst =
	        dev_allreduce(e, p, e->dfbuf, e->dfbuf, (size_t)total / esz, NULL, msg, len);
	if (tl)
		tl_window(e, b, nb, l.item_off, 0, total, NULL);
	if (cst != KOLO_OK) {
		layout_free(&l);
		return cst;
	}
	if (tl)
		tl_window(e, b, nb, l.item_off, 0, total, "MEMCPY_OUT_FUSION_BUFFER");
	for (size_t k = 0; k < l.nent && st == KOLO_OK; k++)
		if (l.ent[k]->recv)
			st = kolo_gpu_memcpy_async(l.ent[k]->recv,
			                           (uint8_t *)e->dfbuf + l.entry_off[k],
			                           l.ent[k]->count * esz, s, &eb);
	if (st == KOLO_OK)
		st = kolo_gpu_stream_sync(s, tmo, &eb);
	else
		kolo_gpu_stream_sync(s, tmo, NULL);
	if (tl)
		tl_window(e, b, nb, l.item_off, 0, total, NULL);
out:
	layout_free(&l);
	if (st == KOLO_ETIMEDOUT) {
		/* Copies may still be queued against the buffer: abandon it
		 * rather than free it under them. */
		e->dfbuf = NULL;
		e->dfbuf_cap = 0;
	}
	return st == KOLO_OK ? KOLO_OK : dev_fail(st, &eb, msg, len);
}

/* A device batch: fused in the device buffer when it has several tensors
 * that fit the threshold (the same choice on every rank: it depends on the
 * negotiated sizes only), otherwise tensor by tensor. */
static kolo_status_t dev_batch(struct kolo_engine *e, struct fused_item **b, size_t nb, size_t nent,
                               uint64_t total, bool tl, char *msg, size_t len)
{
	if (nent == 1 || e->threshold == 0 || total > e->threshold)
		return dev_unfused(e, b, nb, tl, msg, len);
	if (total == 0)
		return KOLO_OK;
	return dev_packed(e, b, nb, nent, total, tl, msg, len);
}

static kolo_status_t run_batch(struct kolo_engine *e, struct fused_item **b, size_t nb, char *msg,
                               size_t len)
{
	uint64_t total = 0;
	size_t nent = 0;
	for (size_t i = 0; i < nb; i++) {
		total += b[i]->bytes;
		nent += b[i]->nent;
	}
	bool tl = fusion_engine_tl_on(e);
	if (tl)
		for (size_t i = 0; i < nb; i++)
			fusion_engine_tl_end(e, b[i]->r->name); /* QUEUE */
	if (b[0]->r->p.mem) {
		kolo_metrics_fusion_batch(nent, total, total, e->threshold);
		return dev_batch(e, b, nb, nent, total, tl, msg, len);
	}
	uint64_t packed = 0;
	for (size_t i = 0; i < nb; i++)
		packed += b[i]->direct ? 0 : b[i]->bytes;
	kolo_metrics_fusion_batch(nent, total, packed, e->threshold);
	if (nent > 1 && packed < total && b[0]->r->p.op != KOLO_ADASUM &&
	    packed <= block_bytes(e, kolo_dtype_size(b[0]->r->p.dtype)))
		return run_pieces(e, b, nb, nent, tl, msg, len);
	/* Adasum's dot products are per tensor (a group's members included). */
	if (nent == 1 || e->threshold == 0 || packed > e->threshold || b[0]->r->p.op == KOLO_ADASUM)
		return run_unfused(e, b, nb, tl, msg, len);
	if (total == 0)
		return KOLO_OK;
	return run_packed(e, b, nb, nent, total, tl, msg, len);
}

/* ---- the other kinds ---------------------------------------------------- */

/* Each returns KOLO_ENOMEM when it cannot allocate (nothing ran) and
 * otherwise KOLO_OK, with the collective's outcome in *ring_st. */

/* An allgather or alltoall into the caller's buffer whose total does not fit
 * still takes part (into a buffer of its own: the other ranks need this
 * one), then fails alone with KOLO_EINVAL (run_others goes on). */
static kolo_status_t gather_misfit(struct fusion_queued_op *o, size_t total, char *msg, size_t len)
{
	snprintf(msg, len, "%s: %zu elements came from the ranks in all; recvbuf holds %zu",
	         o->op.kind == KOLO_FK_ALLGATHER ? "allgather" : "alltoall", total,
	         o->op.recv_capacity);
	return KOLO_EINVAL;
}

static kolo_status_t run_allgather(struct kolo_engine *e, const struct fusion_params *p,
                                   struct fusion_queued_op *o, kolo_status_t *ring_st, char *msg,
                                   size_t len)
{
	kolo_dtype_t dt = (kolo_dtype_t)p->dtype;
	int n = e->size;
	size_t *counts = calloc((size_t)n, sizeof(size_t));
	size_t total = 0;
	if (!counts)
		return KOLO_ENOMEM;
	for (int i = 0; i < n; i++)
		total += counts[i] = (size_t)p->counts[i];
	bool into = o->op.recv_into && total <= o->op.recv_capacity;
	void *buf = into ? o->op.recvbuf_into : malloc(total ? total * kolo_dtype_size(dt) : 1);
	if (!buf && !into) {
		free(counts);
		return KOLO_ENOMEM;
	}
	kolo_status_t st =
	        total ? kolo_ring_allgatherv(e->rc, o->op.sendbuf, buf, counts, dt) : KOLO_OK;
	if (st == KOLO_OK)
		memcpy(o->op.recvcounts, counts, (size_t)n * sizeof(size_t));
	if (st == KOLO_OK && !o->op.recv_into)
		*o->op.recvbuf_out = buf;
	else if (!into)
		free(buf);
	free(counts);
	*ring_st = st;
	return st == KOLO_OK && o->op.recv_into && !into ? gather_misfit(o, total, msg, len)
	                                                 : KOLO_OK;
}

/* p->counts is the size x size matrix of sendcounts: row r is rank r's. */
static kolo_status_t run_alltoall(struct kolo_engine *e, const struct fusion_params *p,
                                  struct fusion_queued_op *o, kolo_status_t *ring_st, char *msg,
                                  size_t len)
{
	kolo_dtype_t dt = (kolo_dtype_t)p->dtype;
	size_t n = (size_t)e->size, me = (size_t)e->rank;
	size_t *sc = calloc(n, sizeof(size_t)), *rcv = calloc(n, sizeof(size_t));
	size_t total = 0;
	if (!sc || !rcv) {
		free(sc);
		free(rcv);
		return KOLO_ENOMEM;
	}
	for (size_t i = 0; i < n; i++) {
		sc[i] = (size_t)p->counts[me * n + i];
		total += rcv[i] = (size_t)p->counts[i * n + me];
	}
	bool into = o->op.recv_into && total <= o->op.recv_capacity;
	void *buf = into ? o->op.recvbuf_into : malloc(total ? total * kolo_dtype_size(dt) : 1);
	if (!buf && !into) {
		free(sc);
		free(rcv);
		return KOLO_ENOMEM;
	}
	kolo_status_t st = fusion_params_total(p)
	                           ? kolo_ring_alltoallv(e->rc, o->op.sendbuf, sc, buf, rcv, dt)
	                           : KOLO_OK;
	if (st == KOLO_OK)
		memcpy(o->op.recvcounts, rcv, n * sizeof(size_t));
	if (st == KOLO_OK && !o->op.recv_into)
		*o->op.recvbuf_out = buf;
	else if (!into)
		free(buf);
	free(sc);
	free(rcv);
	*ring_st = st;
	return st == KOLO_OK && o->op.recv_into && !into ? gather_misfit(o, total, msg, len)
	                                                 : KOLO_OK;
}

static kolo_status_t run_reducescatter(struct kolo_engine *e, const struct fusion_params *p,
                                       struct fusion_queued_op *o, kolo_status_t *ring_st)
{
	int n = e->size;
	*ring_st = KOLO_OK;
	if (p->counts[0] == 0)
		return KOLO_OK;
	size_t *counts = calloc((size_t)n, sizeof(size_t));
	if (!counts)
		return KOLO_ENOMEM;
	for (int i = 0; i < n; i++)
		counts[i] = kolo_reducescatter_count((size_t)p->counts[0], n, i);
	*ring_st = kolo_ring_reducescatter(e->rc, o->op.sendbuf, o->op.recvbuf, counts,
	                                   (kolo_dtype_t)p->dtype, (kolo_op_t)p->op, p->prescale,
	                                   p->postscale);
	free(counts);
	return KOLO_OK;
}

/* The caller's function on the engine thread; its failure fails only this
 * operation (the ring is still usable). */
static kolo_status_t run_exclusive(struct kolo_engine *e, struct fusion_response *r,
                                   struct fusion_queued_op *o, char *msg, size_t len)
{
	kolo_status_t st = o->op.fn(o->op.fn_arg, e->rc);
	if (st != KOLO_OK)
		fusion_engine_ring_error(e, st, msg, len);
	if (fusion_engine_tl_on(e))
		fusion_engine_tl_end(e, r->name);
	return st;
}

/* A device op of another kind: allgather and alltoall allocate their
 * output on the device of the input (kolo_free frees it), unless the
 * caller gave one. */
static kolo_status_t dev_other(struct kolo_engine *e, const struct fusion_params *p,
                               struct fusion_queued_op *o, char *msg, size_t len)
{
	kolo_dtype_t dt = (kolo_dtype_t)p->dtype;
	size_t n = (size_t)e->size, me = (size_t)e->rank, esz = kolo_dtype_size(dt);
	struct kolo_dcoll c = {.dtype = dt,
	                       .op = (kolo_op_t)p->op,
	                       .pre = p->prescale,
	                       .post = p->postscale,
	                       .root = p->root,
	                       .send = o->op.sendbuf,
	                       .recv = o->op.recvbuf,
	                       .after = o->op.ready_event};
	size_t *a = calloc(n, sizeof(size_t)), *bc = calloc(n, sizeof(size_t));
	struct kolo_errbuf eb = {{0}};
	kolo_status_t st = a && bc ? KOLO_OK : KOLO_ENOMEM;
	size_t out = 0;
	void *buf = NULL;
	bool alloc = p->kind == KOLO_FK_ALLGATHER || p->kind == KOLO_FK_ALLTOALL;
	switch (p->kind) {
	case KOLO_FK_ALLGATHER:
		c.kind = KOLO_DC_ALLGATHERV;
		for (size_t i = 0; a && i < n; i++)
			out += a[i] = (size_t)p->counts[i];
		c.counts = a;
		break;
	case KOLO_FK_ALLTOALL:
		c.kind = KOLO_DC_ALLTOALLV;
		for (size_t i = 0; a && bc && i < n; i++) {
			a[i] = (size_t)p->counts[me * n + i];
			out += bc[i] = (size_t)p->counts[i * n + me];
		}
		c.counts = a;
		c.rcounts = bc;
		break;
	case KOLO_FK_BROADCAST:
		c.kind = KOLO_DC_BROADCAST;
		c.count = (size_t)p->counts[0];
		c.send = c.recv;
		break;
	default: /* REDUCESCATTER */
		c.kind = KOLO_DC_REDUCESCATTER;
		for (size_t i = 0; a && i < n; i++)
			a[i] = kolo_reducescatter_count((size_t)p->counts[0], (int)n, (int)i);
		c.counts = a;
		break;
	}
	bool into = alloc && o->op.recv_into && out <= o->op.recv_capacity;
	if (st == KOLO_OK && alloc) {
		int ord = -1;
		void *s;
		st = kolo_gpu_ptr_device(o->op.sendbuf, &ord, &eb);
		if (st == KOLO_OK && e->cfg.device.stream)
			st = e->cfg.device.stream(e->cfg.device.arg, ord, &s, &eb);
		if (st == KOLO_OK && into)
			buf = o->op.recvbuf_into;
		else if (st == KOLO_OK)
			st = kolo_gpu_malloc(&buf, out * esz, &eb);
		c.recv = buf;
		if (st != KOLO_OK)
			dev_fail(st, &eb, msg, len);
	}
	/* Nothing to move on any rank (the counts are negotiated): no
	 * collective, as on the host path. */
	bool empty = p->kind == KOLO_FK_ALLGATHER || p->kind == KOLO_FK_ALLTOALL
	                     ? fusion_params_total(p) == 0
	                     : p->counts[0] == 0;
	if (st == KOLO_OK && !empty)
		st = dev_coll(e, &c, msg, len);
	bool given = alloc && o->op.recv_into;
	if (st == KOLO_OK && alloc)
		memcpy(o->op.recvcounts, p->kind == KOLO_FK_ALLGATHER ? a : bc, n * sizeof(size_t));
	if (st == KOLO_OK && alloc && !given)
		*o->op.recvbuf_out = buf;
	else if (!into)
		kolo_gpu_free(buf);
	if (st == KOLO_OK && given && !into)
		st = gather_misfit(o, out, msg, len);
	free(a);
	free(bc);
	return st;
}

static kolo_status_t run_other(struct kolo_engine *e, struct fusion_response *r,
                               struct fusion_queued_op *o, char *msg, size_t len)
{
	const struct fusion_params *p = &r->p;
	kolo_status_t st = KOLO_OK, ring_st = KOLO_OK;
	if (fusion_engine_tl_on(e)) {
		fusion_engine_tl_end(e, r->name);
		fusion_engine_tl_begin(e, r->name, fusion_kind_name(p->kind));
	}
	if (p->mem && (p->kind == KOLO_FK_ALLGATHER || p->kind == KOLO_FK_ALLTOALL ||
	               p->kind == KOLO_FK_BROADCAST || p->kind == KOLO_FK_REDUCESCATTER)) {
		st = dev_other(e, p, o, msg, len);
		if (fusion_engine_tl_on(e))
			fusion_engine_tl_end(e, r->name);
		return st;
	}
	switch (p->kind) {
	case KOLO_FK_ALLGATHER:
		st = run_allgather(e, p, o, &ring_st, msg, len);
		break;
	case KOLO_FK_ALLTOALL:
		st = run_alltoall(e, p, o, &ring_st, msg, len);
		break;
	case KOLO_FK_BROADCAST:
		if (p->counts[0])
			ring_st = kolo_ring_broadcast(e->rc, o->op.recvbuf, (size_t)p->counts[0],
			                              (kolo_dtype_t)p->dtype, p->root);
		break;
	case KOLO_FK_REDUCESCATTER:
		st = run_reducescatter(e, p, o, &ring_st);
		break;
	case KOLO_FK_BARRIER:
		/* Every rank reached it: the negotiation was the barrier. */
		break;
	case KOLO_FK_JOIN:
		if (o->op.last_rank)
			*o->op.last_rank = r->last_rank;
		break;
	case KOLO_FK_EXCLUSIVE:
		return run_exclusive(e, r, o, msg, len);
	default:
		return KOLO_EPROTO;
	}
	if (st != KOLO_OK)
		return st;
	if (fusion_engine_tl_on(e))
		fusion_engine_tl_end(e, r->name);
	if (ring_st != KOLO_OK)
		return fusion_engine_ring_error(e, ring_st, msg, len);
	return KOLO_OK;
}

/* ---- one cycle's responses ---------------------------------------------- */

/* The planner's view of allreduce response r (o: this rank's op, or NULL
 * when it has joined and contributes zeros). */
static kolo_status_t fused_item_init(struct kolo_engine *e, struct fusion_response *r,
                                     struct fusion_queued_op *o, struct fused_item *a,
                                     struct fusion_item *item)
{
	a->r = r;
	a->o = o;
	size_t esz = kolo_dtype_size((kolo_dtype_t)r->p.dtype);
	a->nent = r->p.kind == KOLO_FK_GROUP ? r->p.ncounts : 1;
	a->ent = calloc(a->nent ? a->nent : 1, sizeof(*a->ent));
	if (!a->ent)
		return KOLO_ENOMEM;
	for (size_t k = 0; k < a->nent; k++) {
		struct batch_entry *en = &a->ent[k];
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
	a->direct = r->p.kind == KOLO_FK_ALLREDUCE && e->cfg.direct_bytes &&
	            a->bytes >= e->cfg.direct_bytes && !r->p.mem;
	*item = (struct fusion_item){r->p.dtype, r->p.op,   r->p.prescale, r->p.postscale,
	                             a->bytes,   a->direct, r->p.mem != 0};
	return KOLO_OK;
}

/* Completes the failed responses (they need no collective) and collects the
 * allreduces into ars / items (*nar of them). */
static kolo_status_t fail_and_collect(struct kolo_engine *e, struct fusion_cycle *c,
                                      struct fused_item *ars, struct fusion_item *items,
                                      size_t *nar)
{
	for (size_t i = 0; i < c->nresp; i++) {
		struct fusion_response *r = &c->resp[i];
		struct fusion_queued_op *o =
		        r->local ? fusion_engine_find_op(e, r->local_id) : NULL;
		if (r->status != KOLO_OK) {
			if (fusion_engine_tl_on(e))
				fusion_engine_tl_end(e, r->name);
			if (o)
				KOLO_WARN(SUBSYS, "%s",
				          r->errmsg ? r->errmsg : kolo_strerror(r->status));
			fusion_engine_complete(e, o, r->status, r->errmsg);
			continue;
		}
		if (r->p.kind != KOLO_FK_ALLREDUCE && r->p.kind != KOLO_FK_GROUP)
			continue;
		kolo_flight_mark(e->cfg.flight, o ? o->fl_seq : 0, KOLO_FL_NEGOTIATED, KOLO_OK,
		                 NULL);
		kolo_status_t st = fused_item_init(e, r, o, &ars[*nar], &items[*nar]);
		if (st != KOLO_OK)
			return st;
		(*nar)++;
	}
	return KOLO_OK;
}

/* Plans the allreduces into batches and runs them in order; each op
 * completes with its batch. bl is scratch for nar pointers. */
static kolo_status_t run_batches(struct kolo_engine *e, struct fused_item *ars,
                                 const struct fusion_item *items, size_t nar, size_t *batch_of,
                                 struct fused_item **bl, char *msg, size_t len)
{
	size_t nb = fusion_plan(items, nar, e->threshold, batch_of);
	for (size_t b = 0; b < nb; b++) {
		size_t cnt = 0;
		for (size_t i = 0; i < nar; i++)
			if (batch_of[i] == b)
				bl[cnt++] = &ars[i];
		for (size_t i = 0; i < cnt; i++)
			kolo_flight_mark(e->cfg.flight, bl[i]->o ? bl[i]->o->fl_seq : 0,
			                 KOLO_FL_DATAPLANE, KOLO_OK, NULL);
		kolo_status_t bst = run_batch(e, bl, cnt, msg, len);
		uint64_t now = kolo_now_ns();
		for (size_t i = 0; i < cnt; i++) {
			if (e->at && bst == KOLO_OK) {
				uint64_t thr;
				double cyc;
				if (fusion_autotune_record(e->at, bl[i]->r->name, bl[i]->bytes, now,
				                           &thr, &cyc))
					fusion_negotiator_set_params(e->neg, thr, cyc);
			}
			fusion_engine_complete(e, bl[i]->o, bst, bst == KOLO_OK ? NULL : msg);
			bl[i]->o = NULL;
		}
		if (bst != KOLO_OK)
			return bst;
	}
	return KOLO_OK;
}

/* Runs every response that is neither failed nor an allreduce. A failed
 * EXCLUSIVE fails only itself; any other failure stops the cycle. */
static kolo_status_t run_others(struct kolo_engine *e, struct fusion_cycle *c, char *msg,
                                size_t len)
{
	for (size_t i = 0; i < c->nresp; i++) {
		struct fusion_response *r = &c->resp[i];
		if (r->status != KOLO_OK || r->p.kind == KOLO_FK_ALLREDUCE ||
		    r->p.kind == KOLO_FK_GROUP)
			continue;
		struct fusion_queued_op *o =
		        r->local ? fusion_engine_find_op(e, r->local_id) : NULL;
		if (!o) { /* cannot happen: joined ranks only see allreduces */
			snprintf(msg, len, "response '%s' without a local operation", r->name);
			return KOLO_EPROTO;
		}
		kolo_flight_mark(e->cfg.flight, o->fl_seq, KOLO_FL_NEGOTIATED, KOLO_OK, NULL);
		kolo_flight_mark(e->cfg.flight, o->fl_seq, KOLO_FL_DATAPLANE, KOLO_OK, NULL);
		kolo_status_t ost = run_other(e, r, o, msg, len);
		fusion_engine_complete(e, o, ost, ost == KOLO_OK ? NULL : msg);
		/* KOLO_EINVAL: an output that did not fit (gather_misfit), after
		 * the collective: only this operation failed. */
		if (ost != KOLO_OK && r->p.kind != KOLO_FK_EXCLUSIVE && ost != KOLO_EINVAL)
			return ost;
	}
	return KOLO_OK;
}

kolo_status_t fusion_engine_execute(struct kolo_engine *e, struct fusion_cycle *c, char *msg,
                                    size_t len)
{
	size_t cap = c->nresp ? c->nresp : 1, nar = 0;
	struct fused_item *ars = calloc(cap, sizeof(*ars));
	struct fusion_item *items = calloc(cap, sizeof(*items));
	size_t *batch_of = calloc(cap, sizeof(size_t));
	struct fused_item **bl = calloc(cap, sizeof(*bl));
	kolo_status_t st = KOLO_ENOMEM;
	if (ars && items && batch_of && bl)
		st = fail_and_collect(e, c, ars, items, &nar);
	if (st == KOLO_OK)
		st = run_batches(e, ars, items, nar, batch_of, bl, msg, len);
	if (st == KOLO_OK)
		st = run_others(e, c, msg, len);
	if (ars)
		for (size_t i = 0; i < nar; i++)
			free(ars[i].ent);
	free(ars);
	free(items);
	free(batch_of);
	free(bl);
	return st;
}
