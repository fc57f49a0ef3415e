/* device: collectives over CUDA device memory (runtime.h). Unless the NCCL
 * path takes it (kolo_device_nccl_try), a collective runs "staged": its
 * device buffers are copied into pinned host memory on kolo's streams, the
 * host collective runs there, and the result is copied back. Allreduce and
 * broadcast are pipelined by chunk: the copies from the device run ahead on
 * one stream while the ring reduces chunk k, and chunk k's copy back runs on
 * a second stream while the ring works on chunk k+1. Pre/postscale and
 * average are the ring's, applied on the staging buffer, so no kernel is
 * needed. Allgather and reducescatter run in rounds of a chunk per rank, to
 * the same effect; alltoall(v) stages its whole buffers.
 *
 * Ordering: the caller's stream gets an event at the call; both of kolo's
 * streams wait for it on the device, so kolo reads the input only after the
 * caller's kernels that produce it, and writes the output only after the
 * work queued before the call. Completion: the host waits for the last copy
 * back (bounded), so the results are on the device for every stream when
 * the call returns. */
#include "runtime.h"

#include "fusion.h"
#include "gpu.h"

#include <stdlib.h>
#include <string.h>

#define SUBSYS "device"

/* Per comm and device: two streams (in: device to host, out: host to
 * device), two pinned staging buffers (0: input, 1: output, grown, never
 * shrunk) and events marking each staged input chunk. */
struct dev_ctx {
	int ordinal;
	void *in, *out;
	void *stage[2];
	size_t stage_cap[2];
	void **ev;
	size_t nev;
	/* A failed run could not wait for its copies: they may still write the
	 * staging buffers, so the context is retired (staged() below). */
	bool lost;
	struct dev_ctx *next_retired;
};

struct kolo_device_state {
	pthread_mutex_t lock; /* one device collective at a time per comm */
	struct dev_ctx *dev[KOLO_CUDA_MAX_GPUS];
	struct dev_ctx *retired; /* lost contexts, freed with the state */
};

static _Thread_local void *user_stream;

KOLO_API kolo_status_t kolo_cuda_set_stream(void *stream)
{
	if (stream && !kolo_gpu_usable(NULL))
		return KOLO_EUNSUPPORTED;
	user_stream = stream;
	return KOLO_OK;
}

KOLO_API void *kolo_cuda_get_stream(void)
{
	return user_stream;
}

static void ctx_destroy(struct dev_ctx *x)
{
	if (!x)
		return;
	kolo_gpu_stream_destroy(x->in);
	kolo_gpu_stream_destroy(x->out);
	for (int i = 0; i < 2; i++)
		kolo_gpu_host_free(x->stage[i]);
	for (size_t i = 0; i < x->nev; i++)
		kolo_gpu_event_destroy(x->ev[i]);
	free(x->ev);
	free(x);
}

void kolo_device_state_destroy(struct kolo_device_state *d)
{
	if (!d)
		return;
	for (int i = 0; i < KOLO_CUDA_MAX_GPUS; i++)
		ctx_destroy(d->dev[i]);
	/* A retired context is freed whole once its streams have drained (a
	 * short bounded wait); otherwise only its host bookkeeping is, and its
	 * CUDA resources stay with the copies that may still use them. */
	while (d->retired) {
		struct dev_ctx *x = d->retired;
		d->retired = x->next_retired;
		if (kolo_gpu_stream_sync(x->in, 1000, NULL) == KOLO_OK &&
		    kolo_gpu_stream_sync(x->out, 1000, NULL) == KOLO_OK) {
			ctx_destroy(x);
		} else {
			free(x->ev);
			free(x);
		}
	}
	pthread_mutex_destroy(&d->lock);
	free(d);
}

static kolo_status_t state_of(struct kolo_comm *comm, struct kolo_device_state **out,
                              struct kolo_errbuf *eb)
{
	pthread_mutex_lock(&comm->device_lock);
	if (!comm->device) {
		struct kolo_device_state *d = calloc(1, sizeof(*d));
		if (d)
			pthread_mutex_init(&d->lock, NULL);
		comm->device = d;
	}
	*out = comm->device;
	pthread_mutex_unlock(&comm->device_lock);
	return *out ? KOLO_OK : kolo_fail(eb, KOLO_ENOMEM, "out of memory");
}

/* The context of device ordinal (the current device), created on first use. */
static kolo_status_t ctx_of(struct kolo_device_state *d, int ordinal, struct dev_ctx **out,
                            struct kolo_errbuf *eb)
{
	if (ordinal < 0 || ordinal >= KOLO_CUDA_MAX_GPUS)
		return kolo_fail(eb, KOLO_EUNSUPPORTED, "device %d: kolo handles devices 0..%d",
		                 ordinal, KOLO_CUDA_MAX_GPUS - 1);
	if (!d->dev[ordinal]) {
		struct dev_ctx *x = calloc(1, sizeof(*x));
		if (!x)
			return kolo_fail(eb, KOLO_ENOMEM, "out of memory");
		x->ordinal = ordinal;
		kolo_status_t st = kolo_gpu_stream_create(&x->in, eb);
		if (st == KOLO_OK)
			st = kolo_gpu_stream_create(&x->out, eb);
		if (st != KOLO_OK) {
			ctx_destroy(x);
			return st;
		}
		KOLO_DEBUG(SUBSYS, "device %d: kolo's streams created", ordinal);
		d->dev[ordinal] = x;
	}
	*out = d->dev[ordinal];
	return KOLO_OK;
}

static kolo_status_t ensure_stage(struct dev_ctx *x, int i, size_t bytes, struct kolo_errbuf *eb)
{
	if (bytes <= x->stage_cap[i])
		return KOLO_OK;
	/* Grown by half again, so that slowly growing tensors do not reallocate
	 * pinned memory (slow: it maps pages) every call. */
	size_t cap = bytes + bytes / 2;
	kolo_gpu_host_free(x->stage[i]);
	x->stage[i] = NULL;
	x->stage_cap[i] = 0;
	KOLO_CHECK(kolo_gpu_host_alloc(&x->stage[i], cap, eb));
	x->stage_cap[i] = cap;
	KOLO_DEBUG(SUBSYS, "device %d: pinned staging buffer %d: %zu bytes", x->ordinal, i, cap);
	return KOLO_OK;
}

static kolo_status_t ensure_events(struct dev_ctx *x, size_t n, struct kolo_errbuf *eb)
{
	if (n <= x->nev)
		return KOLO_OK;
	void **ev = realloc(x->ev, n * sizeof(*ev));
	if (!ev)
		return kolo_fail(eb, KOLO_ENOMEM, "out of memory");
	x->ev = ev;
	for (; x->nev < n; x->nev++)
		KOLO_CHECK(kolo_gpu_event_create(&x->ev[x->nev], eb));
	return KOLO_OK;
}

static bool is_device(const void *p)
{
	return p && kolo_mem_kind(p) == KOLO_MEM_DEVICE;
}

static size_t chunk_bytes(size_t esz)
{
	int64_t v = kolo_param_int(KOLO_P_GPU_STAGE_CHUNK_BYTES);
	size_t c = v > 0 ? (size_t)v : SIZE_MAX;
	c -= c % esz;
	return c ? c : esz;
}

static kolo_status_t ring_fail(struct kolo_ring_comm *rc, kolo_status_t st, struct kolo_errbuf *eb)
{
	return kolo_fail(eb, st, "%s", kolo_ring_last_error(rc));
}

/* What one staged run needs: the context (NULL when no buffer is device
 * memory) and the device to restore. */
struct run {
	struct kolo_comm *comm;
	struct kolo_ring_comm *rc;
	struct dev_ctx *x;
	int saved;
	int timeout_ms;
};

/* Waits for both streams after a failure, so that no copy still touches the
 * caller's or the staging buffers; their own errors are dropped (the first
 * failure is the one reported). When they do not finish in time (the
 * caller's stream is stuck), the context is marked lost. */
static void drain(struct run *r)
{
	if (!r->x)
		return;
	if (kolo_gpu_stream_sync(r->x->in, r->timeout_ms, NULL) != KOLO_OK ||
	    kolo_gpu_stream_sync(r->x->out, r->timeout_ms, NULL) != KOLO_OK)
		r->x->lost = true;
}

/* Chunk by chunk: allreduce (bcast false) or broadcast from root (bcast
 * true, send == recv). sdev: the input is staged from the device; rdev: the
 * output goes back to it. */
static kolo_status_t chunked(struct run *r, const struct kolo_dcoll *c, bool bcast, bool sdev,
                             bool rdev, struct kolo_errbuf *eb)
{
	size_t esz = kolo_dtype_size(c->dtype), bytes = c->count * esz, blk = chunk_bytes(esz);
	size_t nchunks = bytes ? (bytes - 1) / blk + 1 : 0;
	struct dev_ctx *x = r->x;
	uint8_t *stage = NULL;
	if (x && (sdev || rdev)) {
		KOLO_CHECK(ensure_stage(x, 0, bytes, eb));
		stage = x->stage[0];
	}
	if (sdev)
		KOLO_CHECK(ensure_events(x, nchunks, eb));
	kolo_status_t st = KOLO_OK;
	/* Every chunk's copy from the device is queued at once: the stream runs
	 * them back to back while the ring works on the first ones. */
	for (size_t k = 0; sdev && k < nchunks && st == KOLO_OK; k++) {
		size_t off = k * blk, len = KOLO_MIN(blk, bytes - off);
		st = kolo_gpu_memcpy_async(stage + off, (const uint8_t *)c->send + off, len, x->in,
		                           eb);
		if (st == KOLO_OK)
			st = kolo_gpu_event_record(x->ev[k], x->in, eb);
	}
	for (size_t k = 0; k < nchunks && st == KOLO_OK; k++) {
		size_t off = k * blk, len = KOLO_MIN(blk, bytes - off), n = len / esz;
		if (sdev && (st = kolo_gpu_event_sync(x->ev[k], r->timeout_ms, eb)) != KOLO_OK) {
			char why[KOLO_ERRBUF_SIZE];
			snprintf(why, sizeof(why), "%s", eb ? eb->msg : "");
			kolo_fail(eb, st,
			          "%s: chunk %zu of %zu from device %d (after the caller's "
			          "stream): %s",
			          bcast ? "broadcast" : "allreduce", k, nchunks, x->ordinal, why);
			break;
		}
		const void *src = sdev ? (const void *)(stage + off)
		                       : (const void *)((const uint8_t *)c->send + off);
		void *dst = rdev ? (void *)(stage + off) : (void *)((uint8_t *)c->recv + off);
		kolo_status_t rs;
		if (bcast) {
			/* The root's chunk is in the stage (sdev) or the host buffer;
			 * the others receive into the stage (rdev) or the buffer. */
			rs = kolo_ring_broadcast(r->rc, sdev || rdev ? (void *)(stage + off) : dst,
			                         n, c->dtype, c->root);
		} else {
			rs = kolo_ring_allreduce(r->rc, src, dst, n, c->dtype, c->op, c->pre,
			                         c->post);
		}
		if (rs != KOLO_OK) {
			st = ring_fail(r->rc, rs, eb);
			break;
		}
		if (rdev)
			st = kolo_gpu_memcpy_async((uint8_t *)c->recv + off, stage + off, len,
			                           x->out, eb);
	}
	if (st == KOLO_OK && rdev)
		st = kolo_gpu_stream_sync(x->out, r->timeout_ms, eb);
	if (st != KOLO_OK)
		drain(r);
	return st;
}

static size_t sum(const size_t *v, int n)
{
	size_t s = 0;
	for (int i = 0; i < n; i++)
		s += v[i];
	return s;
}

/* Elements of a block of count elements in round j of pieces of ce. */
static size_t piece(size_t count, size_t j, size_t ce)
{
	size_t lo = j * ce;
	return lo >= count ? 0 : KOLO_MIN(ce, count - lo);
}

/* A staging buffer: the context's i-th, or, with no device buffer in the
 * call (the NCCL path's host scratch), one malloc'd for the call (*tofree). */
static kolo_status_t stage(struct run *r, int i, size_t bytes, uint8_t **out, void **tofree,
                           struct kolo_errbuf *eb)
{
	*tofree = NULL;
	if (r->x) {
		KOLO_CHECK(ensure_stage(r->x, i, bytes, eb));
		*out = r->x->stage[i];
		return KOLO_OK;
	}
	*out = *tofree = malloc(bytes ? bytes : 1);
	return *out ? KOLO_OK : kolo_fail(eb, KOLO_ENOMEM, "out of memory");
}

/* Allgatherv and reducescatter in rounds: round j moves piece j (up to one
 * chunk) of every rank's block, so the copies of one round overlap the ring
 * of the next. The rounds depend on the counts only, which every rank
 * passes alike, so every rank runs the same ring calls. Round j's data sits
 * in its own region of the staging buffer (rank by rank, as the ring wants
 * it), so no region is reused while a copy may still read it. */
static kolo_status_t rounds(struct run *r, const struct kolo_dcoll *c, bool sdev, bool rdev,
                            struct kolo_errbuf *eb)
{
	int size = r->comm->assignment.size, rank = r->comm->assignment.rank;
	if (size < 1 || rank < 0 || rank >= size)
		return kolo_fail(eb, KOLO_EINVAL, "rank %d of %d", rank, size);
	bool gather = c->kind == KOLO_DC_ALLGATHERV;
	size_t esz = kolo_dtype_size(c->dtype), ce = chunk_bytes(esz) / esz, R = 0;
	size_t total = sum(c->counts, size), mine = c->counts[rank];
	for (int q = 0; q < size; q++)
		R = KOLO_MAX(R, (c->counts[q] + ce - 1) / ce);
	size_t *pc = calloc((size_t)size, sizeof(size_t)),
	       *off = calloc((size_t)size, sizeof(size_t));
	if (!pc || !off) {
		free(pc);
		free(off);
		return kolo_fail(eb, KOLO_ENOMEM, "out of memory");
	}
	for (int q = 1; q < size; q++)
		off[q] = off[q - 1] + c->counts[q - 1];
	struct dev_ctx *x = r->x;
	uint8_t *in = NULL, *out = NULL;
	void *free_in = NULL, *free_out = NULL;
	/* allgather: the input (this rank's block) is staged only from the
	 * device, the output always (its rounds' layout is not recv's).
	 * reducescatter: the input always (likewise), the output (this rank's
	 * block, whose pieces are contiguous) only to the device. */
	bool stage_in = gather ? sdev : true, stage_out = gather ? true : rdev;
	kolo_status_t st = KOLO_OK;
	if (stage_in)
		st = stage(r, 0, (gather ? mine : total) * esz, &in, &free_in, eb);
	if (st == KOLO_OK && stage_out)
		st = stage(r, 1, (gather ? total : mine) * esz, &out, &free_out, eb);
	if (st == KOLO_OK && sdev)
		st = ensure_events(x, R, eb);
	/* The copies from the device, every round's at once, an event after
	 * each round's. */
	for (size_t j = 0, roff = 0; sdev && j < R && st == KOLO_OK; j++) {
		if (gather) {
			size_t n = piece(mine, j, ce) * esz;
			st = kolo_gpu_memcpy_async(in + j * ce * esz,
			                           (const uint8_t *)c->send + j * ce * esz, n,
			                           x->in, eb);
		} else {
			for (int q = 0; q < size && st == KOLO_OK; q++) {
				size_t n = piece(c->counts[q], j, ce);
				st = kolo_gpu_memcpy_async(in + roff * esz,
				                           (const uint8_t *)c->send +
				                                   (off[q] + j * ce) * esz,
				                           n * esz, x->in, eb);
				roff += n;
			}
		}
		if (st == KOLO_OK)
			st = kolo_gpu_event_record(x->ev[j], x->in, eb);
	}
	for (size_t j = 0, roff = 0; j < R && st == KOLO_OK; j++) {
		size_t rtot = 0;
		for (int q = 0; q < size; q++)
			rtot += pc[q] = piece(c->counts[q], j, ce);
		if (sdev && (st = kolo_gpu_event_sync(x->ev[j], r->timeout_ms, eb)) != KOLO_OK)
			break;
		if (!gather && !sdev) { /* the host input, into this round's layout */
			size_t o = roff;
			for (int q = 0; q < size; o += pc[q], q++)
				memcpy(in + o * esz,
				       (const uint8_t *)c->send + (off[q] + j * ce) * esz,
				       pc[q] * esz);
		}
		kolo_status_t rs;
		if (gather) {
			const void *src =
			        sdev ? (const void *)(in + j * ce * esz)
			             : (const void *)((const uint8_t *)c->send + j * ce * esz);
			rs = kolo_ring_allgatherv(r->rc, src, out + roff * esz, pc, c->dtype);
		} else {
			void *dst = rdev ? (void *)(out + j * ce * esz)
			                 : (void *)((uint8_t *)c->recv + j * ce * esz);
			rs = kolo_ring_reducescatter(r->rc, in + roff * esz, dst, pc, c->dtype,
			                             c->op, c->pre, c->post);
		}
		if (rs != KOLO_OK) {
			st = ring_fail(r->rc, rs, eb);
			break;
		}
		/* This round's output to its place. */
		if (gather) {
			size_t o = roff;
			for (int q = 0; q < size && st == KOLO_OK; o += pc[q], q++) {
				uint8_t *dst = (uint8_t *)c->recv + (off[q] + j * ce) * esz;
				const uint8_t *src = out + o * esz;
				if (rdev)
					st = kolo_gpu_memcpy_async(dst, src, pc[q] * esz, x->out,
					                           eb);
				else
					memcpy(dst, src, pc[q] * esz);
			}
		} else if (rdev) {
			st = kolo_gpu_memcpy_async((uint8_t *)c->recv + j * ce * esz,
			                           out + j * ce * esz, pc[rank] * esz, x->out, eb);
		}
		roff += rtot;
	}
	if (st == KOLO_OK && rdev)
		st = kolo_gpu_stream_sync(x->out, r->timeout_ms, eb);
	if (st != KOLO_OK)
		drain(r);
	free(free_in);
	free(free_out);
	free(pc);
	free(off);
	return st;
}

/* The collectives whose input and output differ in size: staged whole (alltoall(v): a rank knows
 * only its own row and column of the counts, so it cannot plan rounds that every rank agrees on).
 */
static kolo_status_t whole(struct run *r, const struct kolo_dcoll *c, bool sdev, bool rdev,
                           struct kolo_errbuf *eb)
{
	int size = r->comm->assignment.size, rank = r->comm->assignment.rank;
	size_t esz = kolo_dtype_size(c->dtype), in = 0, out = 0;
	switch (c->kind) {
	case KOLO_DC_ALLGATHERV:
		in = c->counts[rank];
		out = sum(c->counts, size);
		break;
	case KOLO_DC_REDUCESCATTER:
		in = sum(c->counts, size);
		out = c->counts[rank];
		break;
	case KOLO_DC_ALLTOALLV:
		in = sum(c->counts, size);
		out = sum(c->rcounts, size);
		break;
	default:
		return kolo_fail(eb, KOLO_EINVAL, "device collective kind %d", (int)c->kind);
	}
	in *= esz;
	out *= esz;
	struct dev_ctx *x = r->x;
	const void *src = c->send;
	void *dst = c->recv;
	kolo_status_t st = KOLO_OK;
	if (sdev) {
		KOLO_CHECK(ensure_stage(x, 0, in, eb));
		src = x->stage[0];
		st = kolo_gpu_memcpy_async(x->stage[0], c->send, in, x->in, eb);
		if (st == KOLO_OK)
			st = kolo_gpu_stream_sync(x->in, r->timeout_ms, eb);
	}
	if (st == KOLO_OK && rdev) {
		st = ensure_stage(x, 1, out, eb);
		dst = x->stage[1];
	}
	kolo_status_t rs = KOLO_OK;
	if (st == KOLO_OK) {
		switch (c->kind) {
		case KOLO_DC_ALLGATHERV:
			rs = kolo_ring_allgatherv(r->rc, src, dst, c->counts, c->dtype);
			break;
		case KOLO_DC_REDUCESCATTER:
			rs = kolo_ring_reducescatter(r->rc, src, dst, c->counts, c->dtype, c->op,
			                             c->pre, c->post);
			break;
		default:
			rs = kolo_ring_alltoallv(r->rc, src, c->counts, dst, c->rcounts, c->dtype);
			break;
		}
		if (rs != KOLO_OK)
			st = ring_fail(r->rc, rs, eb);
	}
	if (st == KOLO_OK && rdev) {
		st = kolo_gpu_memcpy_async(c->recv, x->stage[1], out, x->out, eb);
		if (st == KOLO_OK)
			st = kolo_gpu_stream_sync(x->out, r->timeout_ms, eb);
	}
	if (st != KOLO_OK)
		drain(r);
	return st;
}

/* The device the run's streams live on: the first device buffer's. */
static kolo_status_t run_begin(struct run *r, const struct kolo_dcoll *c, bool sdev, bool rdev,
                               struct kolo_errbuf *eb)
{
	r->x = NULL;
	r->saved = -1;
	if (!sdev && !rdev)
		return KOLO_OK;
	int ordinal;
	KOLO_CHECK(kolo_gpu_ptr_device(sdev ? c->send : c->recv, &ordinal, eb));
	struct kolo_device_state *d;
	KOLO_CHECK(state_of(r->comm, &d, eb));
	KOLO_CHECK(kolo_gpu_get_device(&r->saved, eb));
	kolo_status_t st = ordinal == r->saved ? KOLO_OK : kolo_gpu_set_device(ordinal, eb);
	if (st == KOLO_OK)
		st = ctx_of(d, ordinal, &r->x, eb);
	if (st == KOLO_OK && c->after) {
		st = kolo_gpu_stream_wait_event(r->x->in, c->after, eb);
		if (st == KOLO_OK)
			st = kolo_gpu_stream_wait_event(r->x->out, c->after, eb);
	}
	return st;
}

static void run_end(struct run *r)
{
	if (r->saved >= 0 && (!r->x || r->x->ordinal != r->saved))
		kolo_gpu_set_device(r->saved, NULL);
}

/* comm's state, which staged()'s caller created. */
static struct kolo_device_state *d_of(struct kolo_comm *comm)
{
	return comm->device;
}

static kolo_status_t staged(struct kolo_comm *comm, struct kolo_ring_comm *rc,
                            const struct kolo_dcoll *c, struct kolo_errbuf *eb)
{
	struct run r = {.comm = comm, .rc = rc, .timeout_ms = comm->timeout_ms};
	bool sdev, rdev, bcast = c->kind == KOLO_DC_BROADCAST;
	if (bcast) {
		bool dev = is_device(c->recv), root = comm->assignment.rank == c->root;
		sdev = dev && root;
		rdev = dev && !root;
	} else {
		sdev = is_device(c->send);
		rdev = is_device(c->recv);
	}
	kolo_status_t st = run_begin(&r, c, sdev, rdev, eb);
	if (st == KOLO_OK) {
		if (bcast || c->kind == KOLO_DC_ALLREDUCE)
			st = chunked(&r, c, bcast, sdev, rdev, eb);
		else if (c->kind == KOLO_DC_ALLGATHERV || c->kind == KOLO_DC_REDUCESCATTER)
			st = rounds(&r, c, sdev, rdev, eb);
		else
			st = whole(&r, c, sdev, rdev, eb);
	}
	if (r.x && r.x->lost) {
		/* Its streams still hold copies into its staging buffers: retired
		 * (freeing them under the copies would be worse; the state frees
		 * them at the end), and the next collective on this device starts
		 * afresh. */
		KOLO_WARN(SUBSYS,
		          "device %d: kolo's streams did not drain after a failure; their "
		          "buffers are abandoned",
		          r.x->ordinal);
		struct kolo_device_state *d = d_of(comm);
		d->dev[r.x->ordinal] = NULL;
		r.x->next_retired = d->retired;
		d->retired = r.x;
	}
	run_end(&r);
	return st;
}

/* Staged, under the state's lock (one staged collective at a time per comm:
 * they share the streams and staging buffers). */
static kolo_status_t staged_locked(struct kolo_comm *comm, struct kolo_ring_comm *rc,
                                   const struct kolo_dcoll *c, struct kolo_errbuf *eb)
{
	struct kolo_device_state *d;
	KOLO_CHECK(state_of(comm, &d, eb));
	pthread_mutex_lock(&d->lock);
	kolo_status_t st = staged(comm, rc, c, eb);
	pthread_mutex_unlock(&d->lock);
	return st;
}

kolo_status_t kolo_device_run(struct kolo_comm *comm, struct kolo_ring_comm *rc,
                              const struct kolo_dcoll *c, struct kolo_errbuf *eb)
{
	/* The NCCL path's choice depends on what every rank passes alike, so
	 * every rank takes the same path. */
	kolo_status_t st = kolo_device_nccl_try(comm, rc, c, eb);
	if (st != KOLO_EUNSUPPORTED)
		return st;
	return staged_locked(comm, rc, c, eb);
}

kolo_status_t kolo_device_allreduce(struct kolo_comm *comm, struct kolo_ring_comm *rc,
                                    const void *sendbuf, void *recvbuf, size_t count,
                                    kolo_dtype_t dtype, kolo_op_t op, double prescale,
                                    double postscale, void *after, struct kolo_errbuf *eb)
{
	struct kolo_dcoll c = {.kind = KOLO_DC_ALLREDUCE,
	                       .send = sendbuf,
	                       .recv = recvbuf,
	                       .count = count,
	                       .dtype = dtype,
	                       .op = op,
	                       .pre = prescale,
	                       .post = postscale,
	                       .after = after};
	return staged_locked(comm, rc, &c, eb);
}

kolo_status_t kolo_device_ready_event(void **event, struct kolo_errbuf *eb)
{
	KOLO_CHECK(kolo_gpu_event_create(event, eb));
	kolo_status_t st = kolo_gpu_event_record(*event, user_stream, eb);
	if (st != KOLO_OK) {
		kolo_gpu_event_destroy(*event);
		*event = NULL;
	}
	return st;
}

/* ---- the engine's hooks ----------------------------------------------------- */

static kolo_status_t hook_coll(void *arg, struct kolo_ring_comm *rc, const struct kolo_dcoll *c,
                               struct kolo_errbuf *eb)
{
	return kolo_device_run(arg, rc, c, eb);
}

/* The engine thread's current device becomes ordinal: it packs the fusion
 * buffer there. */
static kolo_status_t hook_stream(void *arg, int ordinal, void **stream, struct kolo_errbuf *eb)
{
	struct kolo_device_state *d;
	struct dev_ctx *x;
	KOLO_CHECK(state_of(arg, &d, eb));
	KOLO_CHECK(kolo_gpu_set_device(ordinal, eb));
	pthread_mutex_lock(&d->lock);
	kolo_status_t st = ctx_of(d, ordinal, &x, eb);
	pthread_mutex_unlock(&d->lock);
	*stream = st == KOLO_OK ? x->in : NULL;
	return st;
}

void kolo_device_engine_hooks(struct kolo_comm *comm, struct kolo_engine_device *out)
{
	*out = (struct kolo_engine_device){.coll = hook_coll,
	                                   .stream = hook_stream,
	                                   .arg = comm,
	                                   .timeout_ms = comm->timeout_ms};
}
