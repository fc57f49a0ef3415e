/* enqueue: turning a caller's kolo_engine_op into a queued operation and
 * handing it to the engine thread. The argument checks live here for now:
 * each refuses the op with KOLO_EINVAL and a message, and the callback is
 * then never called. */
#include "fusion_internal.h"

#include <assert.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* Kinds whose name the caller gives (a GROUP's comes from its members). */
static bool kind_is_named(int kind)
{
	return kind != KOLO_FK_BARRIER && kind != KOLO_FK_JOIN && kind != KOLO_FK_EXCLUSIVE &&
	       kind != KOLO_FK_GROUP;
}

/* Fills kind, dtype, op, root and the scales of p from op, leaving the
 * fields a kind does not use at their canonical values, so that ranks agree
 * on them. The public arguments were judged by runtime/args.c before the op
 * was built: what is asserted here is that contract; only the engine's own
 * rules (the kind) are checked. */
static kolo_status_t describe(const struct kolo_engine_op *op, struct fusion_params *p,
                              struct kolo_errbuf *eb)
{
	p->kind = (uint8_t)op->kind;
	p->dtype = (uint8_t)op->dtype;
	p->op = (uint8_t)op->op;
	p->root = op->root;
	p->prescale = op->prescale;
	p->postscale = op->postscale;
	p->mem = op->device ? 1 : 0;
	if (op->kind <= 0 || op->kind >= KOLO_FK_COUNT)
		return kolo_fail(eb, KOLO_EINVAL, "unknown operation kind %d", op->kind);
	assert(!kind_is_named(op->kind) || (op->name && op->name[0] && strlen(op->name) < 1024));
	bool typed = op->kind != KOLO_FK_BARRIER && op->kind != KOLO_FK_JOIN &&
	             op->kind != KOLO_FK_EXCLUSIVE;
	assert(!typed || (unsigned)op->dtype < KOLO_DTYPE_COUNT);
	if (!typed) {
		p->dtype = 0;
		p->mem = 0;
	}
	bool reducing = op->kind == KOLO_FK_ALLREDUCE || op->kind == KOLO_FK_GROUP ||
	                op->kind == KOLO_FK_REDUCESCATTER;
	if (reducing) {
		assert((unsigned)op->op < KOLO_OP_COUNT || op->op == KOLO_ADASUM);
		assert(isfinite(op->prescale) && isfinite(op->postscale));
	} else {
		p->op = 0;
		p->prescale = p->postscale = 1.0;
	}
	if (op->kind != KOLO_FK_BROADCAST)
		p->root = 0;
	return KOLO_OK;
}

/* Sets p->ncounts for op's kind; its buffers, root and split were judged by
 * runtime/args.c (asserted). */
static kolo_status_t check_buffers(const struct kolo_engine_op *op, int n, struct fusion_params *p,
                                   struct kolo_errbuf *eb)
{
	switch (op->kind) {
	case KOLO_FK_ALLREDUCE:
	case KOLO_FK_REDUCESCATTER:
	case KOLO_FK_BROADCAST:
		/* A reducescatter's recvbuf may be NULL when this rank's block is
		 * empty, as on the blocking path. */
		assert(!op->count || (op->kind == KOLO_FK_BROADCAST   ? op->recvbuf != NULL
		                      : op->kind == KOLO_FK_ALLREDUCE ? op->sendbuf && op->recvbuf
		                                                      : op->sendbuf != NULL));
		assert(op->kind != KOLO_FK_BROADCAST || (op->root >= 0 && op->root < n));
		p->ncounts = 1;
		break;
	case KOLO_FK_ALLGATHER:
		assert((!op->count || op->sendbuf) && (op->recvbuf_out || op->recv_into) &&
		       op->recvcounts);
		p->ncounts = 1;
		break;
	case KOLO_FK_ALLTOALL:
		assert((!op->count || op->sendbuf) && (op->recvbuf_out || op->recv_into) &&
		       op->recvcounts);
		assert(op->sendcounts || op->count % (size_t)n == 0);
		p->ncounts = (uint32_t)n;
		break;
	case KOLO_FK_GROUP:
		assert(op->n >= 1 && op->names && op->sendbufs && op->recvbufs && op->counts);
		p->ncounts = (uint32_t)op->n;
		break;
	case KOLO_FK_EXCLUSIVE:
		if (!op->fn)
			return kolo_fail(eb, KOLO_EINVAL, "exclusive operation without a function");
		break;
	default:
		break;
	}
	return KOLO_OK;
}

/* A GROUP's members: checks them, copies their counts and buffers, and
 * names the group "group:a,b,c". */
static kolo_status_t copy_group(const struct kolo_engine_op *op, struct fusion_queued_op *o,
                                struct kolo_errbuf *eb)
{
	size_t len = 7;
	for (int i = 0; i < op->n; i++) {
		/* Names, buffers and duplicates: judged by runtime/args.c. */
		assert(op->names[i] && op->names[i][0]);
		assert(!op->counts[i] || (op->sendbufs[i] && op->recvbufs[i]));
		len += strlen(op->names[i]) + 1;
		o->p.counts[i] = op->counts[i];
	}
	if (len >= FUSION_NAME_MAX)
		return kolo_fail(eb, KOLO_EINVAL, "grouped allreduce: names too long");
	o->name = malloc(len + 1);
	o->sendbufs = calloc(o->p.ncounts, sizeof(void *));
	o->recvbufs = calloc(o->p.ncounts, sizeof(void *));
	if (!o->name || !o->sendbufs || !o->recvbufs)
		return KOLO_ENOMEM;
	strcpy(o->name, "group:");
	for (int i = 0; i < op->n; i++) {
		strcat(o->name, op->names[i]);
		strcat(o->name, i + 1 < op->n ? "," : "");
		o->sendbufs[i] = op->sendbufs[i];
		o->recvbufs[i] = op->recvbufs[i];
	}
	return KOLO_OK;
}

/* Allocates and fills o->p.counts (a GROUP's via copy_group). */
static kolo_status_t copy_counts(const struct kolo_engine_op *op, int n, struct fusion_queued_op *o,
                                 struct kolo_errbuf *eb)
{
	struct fusion_params *p = &o->p;
	if (p->ncounts) {
		p->counts = calloc(p->ncounts, sizeof(uint64_t));
		if (!p->counts)
			return KOLO_ENOMEM;
	}
	switch (op->kind) {
	case KOLO_FK_ALLTOALL:
		for (int i = 0; i < n; i++)
			p->counts[i] = op->sendcounts ? op->sendcounts[i] : op->count / (size_t)n;
		return KOLO_OK;
	case KOLO_FK_GROUP:
		return copy_group(op, o, eb);
	default:
		if (p->ncounts)
			p->counts[0] = op->count;
		return KOLO_OK;
	}
}

/* The caller's name, or "kolo.barrier.<seq>" (join, exclusive): the same
 * on every rank, since every rank enqueues them in the same order. */
static kolo_status_t name_op(const struct kolo_engine_op *op, uint64_t seq,
                             struct fusion_queued_op *o)
{
	if (o->name)
		return KOLO_OK;
	if (kind_is_named(op->kind)) {
		o->name = strdup(op->name);
	} else {
		char nb[64];
		snprintf(nb, sizeof(nb), "kolo.%s.%llu",
		         op->kind == KOLO_FK_BARRIER
		                 ? "barrier"
		                 : (op->kind == KOLO_FK_JOIN ? "join" : "exclusive"),
		         (unsigned long long)seq);
		o->name = strdup(nb);
	}
	return o->name ? KOLO_OK : KOLO_ENOMEM;
}

/* Fills o from op, checking it. The caller's arrays are copied and its
 * pointers to them cleared, so o keeps only the buffers. */
static kolo_status_t build(struct kolo_engine *e, const struct kolo_engine_op *op, uint64_t seq,
                           struct fusion_queued_op *o, struct kolo_errbuf *eb)
{
	kolo_status_t st = describe(op, &o->p, eb);
	if (st == KOLO_OK)
		st = check_buffers(op, e->size, &o->p, eb);
	if (st == KOLO_OK)
		st = copy_counts(op, e->size, o, eb);
	if (st == KOLO_OK)
		st = name_op(op, seq, o);
	if (st != KOLO_OK)
		return st;
	o->op = *op;
	o->op.name = NULL;
	o->op.names = NULL;
	o->op.sendbufs = NULL;
	o->op.recvbufs = NULL;
	o->op.counts = NULL;
	o->op.sendcounts = NULL;
	return KOLO_OK;
}

/* The sequence number that names the next op of an unnamed kind. */
static uint64_t *kind_seq(struct kolo_engine *e, int kind)
{
	if (kind == KOLO_FK_BARRIER)
		return &e->barrier_seq;
	if (kind == KOLO_FK_JOIN)
		return &e->join_seq;
	if (kind == KOLO_FK_EXCLUSIVE)
		return &e->excl_seq;
	return NULL;
}

/* o's entry in the flight recorder: its name, kind, dtype and the bytes it
 * hands over (a barrier, join or blocking call has no dtype). */
static uint64_t record(struct kolo_engine *e, const struct fusion_queued_op *o,
                       const struct kolo_engine_op *op)
{
	bool typed = op->kind != KOLO_FK_BARRIER && op->kind != KOLO_FK_JOIN &&
	             op->kind != KOLO_FK_EXCLUSIVE;
	uint64_t n = op->count;
	if (op->kind == KOLO_FK_GROUP)
		for (int i = 0; i < op->n; i++)
			n += op->counts[i];
	static const char *const ops[KOLO_FK_COUNT] = {
	        [KOLO_FK_ALLREDUCE] = "allreduce", [KOLO_FK_GROUP] = "grouped_allreduce",
	        [KOLO_FK_ALLGATHER] = "allgather", [KOLO_FK_BROADCAST] = "broadcast",
	        [KOLO_FK_ALLTOALL] = "alltoall",   [KOLO_FK_REDUCESCATTER] = "reducescatter",
	        [KOLO_FK_BARRIER] = "barrier",     [KOLO_FK_JOIN] = "join",
	        [KOLO_FK_EXCLUSIVE] = "blocking"};
	const char *name = op->kind > 0 && op->kind < KOLO_FK_COUNT ? ops[op->kind] : NULL;
	return kolo_flight_submit(e->cfg.flight, o->name, name ? name : "?",
	                          typed ? (int)op->dtype : -1,
	                          typed ? n * kolo_dtype_size(op->dtype) : 0);
}

/* Refuses o when the engine is stopping or its name is pending. Lock held. */
static kolo_status_t check_accepting(struct kolo_engine *e, const struct fusion_queued_op *o,
                                     struct kolo_errbuf *eb)
{
	if (e->stopped || e->shutdown_req) {
		kolo_status_t fst = e->stopped ? e->fail_st : KOLO_ESHUTDOWN;
		kolo_fail(eb, fst, "%s",
		          e->stopped ? e->fail_msg : "the fusion engine is shutting down");
		return fst;
	}
	for (struct fusion_queued_op *q = e->ops; q; q = q->next)
		if (strcmp(q->name, o->name) == 0)
			return kolo_fail(eb, KOLO_EINVAL,
			                 "'%s' is already pending (a name may be reused "
			                 "once its operation has completed)",
			                 o->name);
	return KOLO_OK;
}

kolo_status_t kolo_engine_enqueue(struct kolo_engine *e, const struct kolo_engine_op *op,
                                  kolo_handle_t **handle, struct kolo_errbuf *eb)
{
	if (handle)
		*handle = NULL;
	if (!e || !op)
		return kolo_fail(eb, KOLO_EINVAL, "no engine or operation");
	struct fusion_queued_op *o = calloc(1, sizeof(*o));
	if (!o)
		return KOLO_ENOMEM;
	o->enqueued_ns = kolo_metrics_start();
	if (handle) {
		o->h = fusion_handle_create(op->owner, 2);
		if (!o->h) {
			fusion_queued_op_free(o);
			return KOLO_ENOMEM;
		}
	}
	/* The lock covers numbering, so concurrent barriers get distinct names. */
	pthread_mutex_lock(&e->lock);
	uint64_t *seq = kind_seq(e, op->kind);
	kolo_status_t st = build(e, op, seq ? *seq : 0, o, eb);
	if (st == KOLO_OK)
		st = check_accepting(e, o, eb);
	if (st != KOLO_OK) {
		pthread_mutex_unlock(&e->lock);
		o->op.ready_event = NULL; /* the caller's on failure */
		fusion_handle_discard(o->h);
		fusion_queued_op_free(o);
		return st;
	}
	if (seq)
		(*seq)++;
	o->fl_seq = record(e, o, op);
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
