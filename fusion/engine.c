/* engine: the background thread that owns the ring comm. It runs
 * negotiation cycles while there is work (each a list of phases: wait for
 * work, pace the cycle, hand new ops to the negotiator, exchange and decide,
 * execute, inspect stalls) and sleeps on a condition variable when idle.
 * Also the engine's configuration and lifecycle. */
#include "fusion_internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SUBSYS "fusion"

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

/* ---- queued operations ------------------------------------------------ */

void fusion_queued_op_free(struct fusion_queued_op *o)
{
	if (!o)
		return;
	free(o->name);
	fusion_params_fini(&o->p);
	free(o->sendbufs);
	free(o->recvbufs);
	free(o->gcounts);
	kolo_gpu_event_destroy(o->op.ready_event);
	free(o);
}

/* Removes o from e->ops. Lock held. */
static void unlink_op(struct kolo_engine *e, struct fusion_queued_op *o)
{
	for (struct fusion_queued_op **pp = &e->ops; *pp; pp = &(*pp)->next)
		if (*pp == o) {
			*pp = o->next;
			return;
		}
}

struct fusion_queued_op *fusion_engine_find_op(struct kolo_engine *e, uint64_t id)
{
	pthread_mutex_lock(&e->lock);
	struct fusion_queued_op *o = e->ops;
	while (o && o->id != id)
		o = o->next;
	pthread_mutex_unlock(&e->lock);
	return o;
}

/* Finishes o: unlinks it, runs the callback and completes the handle. */
void fusion_engine_complete(struct kolo_engine *e, struct fusion_queued_op *o, kolo_status_t st,
                            const char *msg)
{
	if (!o)
		return;
	pthread_mutex_lock(&e->lock);
	unlink_op(e, o);
	pthread_mutex_unlock(&e->lock);
	if (st != KOLO_OK)
		KOLO_DEBUG(SUBSYS, "'%s' failed: %s: %s", o->name, kolo_status_name(st),
		           msg ? msg : "");
	fusion_engine_metrics_done(e, o, st);
	kolo_flight_mark(e->cfg.flight, o->fl_seq, st == KOLO_OK ? KOLO_FL_DONE : KOLO_FL_FAILED,
	                 st, msg ? msg : kolo_strerror(st));
	if (o->op.cb)
		o->op.cb(o->op.cb_arg, st);
	if (o->h)
		fusion_handle_complete(o->h, st, msg);
	fusion_queued_op_free(o);
}

kolo_status_t fusion_engine_ring_error(struct kolo_engine *e, kolo_status_t st, char *msg,
                                       size_t len)
{
	snprintf(msg, len, "%s", kolo_ring_last_error(e->rc));
	if (!msg[0])
		snprintf(msg, len, "%s", kolo_strerror(st));
	return st;
}

/* ---- one cycle ---------------------------------------------------------- */

static void apply_params(struct kolo_engine *e, uint64_t thr, double cyc)
{
	if (thr != e->threshold || cyc != e->cycle_ms)
		KOLO_INFO(SUBSYS, "fusion threshold %llu bytes, cycle time %g ms",
		          (unsigned long long)thr, cyc);
	e->threshold = thr;
	e->cycle_ms = cyc;
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
	fusion_negotiator_fail_name(s->e->neg, name, KOLO_ETIMEDOUT, why);
}

static void mismatch_fail(void *arg, const char *name)
{
	struct stall_ctx *s = arg;
	char why[KOLO_ERRBUF_SIZE];
	snprintf(why, sizeof(why),
	         "ranks disagree about operation names: every rank waits for a name that others "
	         "have not submitted (for more than %g s); missing: %.300s",
	         s->e->cfg.stall_check_s, s->report);
	fusion_negotiator_fail_name(s->e->neg, name, KOLO_EMISMATCH, why);
}

static void stall_inspect(struct kolo_engine *e, uint64_t now)
{
	if (e->rank != 0 || !e->cfg.stall_check)
		return;
	uint64_t warn_ns = (uint64_t)(e->cfg.stall_check_s * 1e9);
	if (now - e->last_stall_warn_ns >= warn_ns) {
		char rep[2048];
		size_t cnt = fusion_negotiator_stall_report(e->neg, now, warn_ns, rep, sizeof(rep));
		if (cnt) {
			KOLO_WARN(
			        SUBSYS,
			        "%zu operation(s) waiting for more than %g s: some ranks have not "
			        "enqueued them. Missing ranks: %s",
			        cnt, e->cfg.stall_check_s, rep);
			kolo_metrics_fusion_stall();
			if (e->cfg.stall_hook)
				e->cfg.stall_hook(e->cfg.stall_hook_arg, rep);
			e->last_stall_warn_ns = now;
			/* Nobody can progress: fail the stalled names everywhere
			 * instead of waiting forever (Horovod's hang). */
			if (fusion_negotiator_deadlocked(e->neg, now, warn_ns)) {
				struct stall_ctx s = {.e = e};
				snprintf(s.report, sizeof(s.report), "%.1000s", rep);
				fusion_negotiator_stalled(e->neg, now, warn_ns, mismatch_fail, &s);
			}
		}
	}
	if (e->cfg.stall_shutdown_s > 0) {
		uint64_t sd_ns = (uint64_t)(e->cfg.stall_shutdown_s * 1e9);
		struct stall_ctx s = {.e = e};
		fusion_negotiator_stall_report(e->neg, now, sd_ns, s.report, sizeof(s.report));
		fusion_negotiator_stalled(e->neg, now, sd_ns, stall_fail, &s);
	}
}

/* The gathered control blocks and messages of one cycle. */
struct cycle_exchange {
	uint8_t *block, *blocks, *mymsg, *all;
	size_t *counts, *lens;
	const uint8_t **msgs;
};

static void exchange_free(struct cycle_exchange *x)
{
	free(x->block);
	free(x->blocks);
	free(x->mymsg);
	free(x->all);
	free(x->counts);
	free(x->lens);
	free(x->msgs);
}

/* Sends this rank's control block and message and gathers every rank's:
 * the blocks first (fixed size), then the messages their lengths announce. */
static kolo_status_t exchange(struct kolo_engine *e, bool shutdown, struct cycle_exchange *x,
                              char *msg, size_t len)
{
	size_t bsz = fusion_negotiator_block_size(e->neg);
	int n = e->size;
	x->block = malloc(bsz);
	x->blocks = malloc(bsz * (size_t)n);
	x->counts = calloc((size_t)n, sizeof(size_t));
	x->lens = calloc((size_t)n, sizeof(size_t));
	x->msgs = calloc((size_t)n, sizeof(*x->msgs));
	size_t mylen = 0;
	if (!x->block || !x->blocks || !x->counts || !x->lens || !x->msgs)
		return KOLO_ENOMEM;
	kolo_status_t st = fusion_negotiator_encode(e->neg, shutdown, x->block, &x->mymsg, &mylen);
	if (st != KOLO_OK)
		return st;
	for (int r = 0; r < n; r++)
		x->counts[r] = bsz;
	st = kolo_ring_allgatherv(e->rc, x->block, x->blocks, x->counts, KOLO_UINT8);
	if (st != KOLO_OK)
		return fusion_engine_ring_error(e, st, msg, len);
	size_t total = 0;
	for (int r = 0; r < n; r++)
		total += x->lens[r] = fusion_negotiator_block_msg_len(x->blocks + (size_t)r * bsz);
	if (total) {
		x->all = malloc(total);
		if (!x->all)
			return KOLO_ENOMEM;
		st = kolo_ring_allgatherv(e->rc, x->mymsg ? x->mymsg : x->block, x->all, x->lens,
		                          KOLO_UINT8);
		if (st != KOLO_OK)
			return fusion_engine_ring_error(e, st, msg, len);
	}
	size_t off = 0;
	for (int r = 0; r < n; r++) {
		x->msgs[r] = x->all ? x->all + off : NULL;
		off += x->lens[r];
	}
	return KOLO_OK;
}

/* One negotiation cycle and the work it decides. *stop is set when the
 * engine must stop (shutdown requested by some rank). */
static kolo_status_t run_cycle(struct kolo_engine *e, bool shutdown, bool *stop, char *msg,
                               size_t len)
{
	struct cycle_exchange x = {0};
	struct fusion_cycle c = {0};
	kolo_flight_activity(e->cfg.flight, KOLO_FA_NEGOTIATING);
	kolo_status_t st = exchange(e, shutdown, &x, msg, len);
	if (st != KOLO_OK)
		goto out;
	uint64_t now = kolo_now_ns();
	st = fusion_negotiator_decide(e->neg, x.blocks, x.msgs, x.lens, now, &c);
	if (st != KOLO_OK) {
		snprintf(msg, len, "negotiation: malformed control message (%s)",
		         kolo_status_name(st));
		goto out;
	}
	e->cycles++;
	kolo_metrics_fusion_cycle(c.cache_hits);
	kolo_flight_lags(e->cfg.flight, c.arrive, e->size);
	e->others_pending = c.pending;
	fusion_engine_tl_cycle(e, &c);
	if (c.has_params) {
		apply_params(e, c.fusion_threshold, c.cycle_time_ms);
		if (e->at)
			fusion_autotune_applied(e->at, now);
	}
	if (c.shutdown) {
		*stop = true;
		st = KOLO_OK;
		goto out;
	}
	kolo_flight_activity(e->cfg.flight, KOLO_FA_EXECUTING);
	st = fusion_engine_execute(e, &c, msg, len);
	if (st == KOLO_OK)
		stall_inspect(e, kolo_now_ns());
out:
	if (st == KOLO_OK)
		kolo_flight_activity(e->cfg.flight, KOLO_FA_IDLE);
	fusion_cycle_fini(&c);
	exchange_free(&x);
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
	fusion_negotiator_drain(e->neg, fail_id, NULL);
	for (;;) {
		pthread_mutex_lock(&e->lock);
		struct fusion_queued_op *o = e->ops;
		if (o) {
			e->ops = o->next;
			o->next = NULL;
		}
		e->incoming = NULL;
		e->incoming_tail = &e->incoming;
		pthread_mutex_unlock(&e->lock);
		if (!o)
			break;
		kolo_flight_mark(e->cfg.flight, o->fl_seq, KOLO_FL_FAILED, st, msg);
		if (o->op.cb)
			o->op.cb(o->op.cb_arg, st);
		if (o->h)
			fusion_handle_complete(o->h, st, msg);
		fusion_queued_op_free(o);
	}
}

/* Phase 1: sleeps until there is something to do, or for the idle
 * heartbeat (the backoff while other ranks have work), so that an idle rank
 * still answers the others' cycles. Lock held. */
static void wait_for_work(struct kolo_engine *e)
{
	if (e->shutdown_req || e->incoming || fusion_negotiator_local_pending(e->neg) != 0)
		return;
	int ms = e->others_pending ? backoff_ms(&e->cfg) : heartbeat_ms(&e->cfg);
	struct timespec dl;
	abs_deadline(&dl, (uint64_t)ms * 1000000ull);
	while (!e->shutdown_req && !e->incoming)
		if (pthread_cond_timedwait(&e->cond, &e->lock, &dl) != 0)
			break;
}

/* Phase 2: batches: cycles start at most once per cycle time. Lock held. */
static void pace_cycle(struct kolo_engine *e)
{
	uint64_t cyc_ns = (uint64_t)(e->cycle_ms * 1e6);
	uint64_t next = e->last_cycle_ns + cyc_ns, now = kolo_now_ns();
	if (e->shutdown_req || now >= next)
		return;
	struct timespec dl;
	abs_deadline(&dl, next - now);
	while (!e->shutdown_req)
		if (pthread_cond_timedwait(&e->cond, &e->lock, &dl) != 0)
			break;
}

/* Phase 3: hands new ops to the negotiator, oldest first. Called with the
 * lock held, returns without it; *shutdown: whether a shutdown was asked. */
static void take_incoming(struct kolo_engine *e, bool *shutdown)
{
	struct fusion_queued_op *in = e->incoming;
	e->incoming = NULL;
	e->incoming_tail = &e->incoming;
	*shutdown = e->shutdown_req;
	pthread_mutex_unlock(&e->lock);
	for (struct fusion_queued_op *o = in; o; o = o->next_in) {
		kolo_status_t sst = fusion_negotiator_submit(e->neg, o->name, &o->p, o->id);
		if (sst != KOLO_OK)
			fusion_engine_complete(e, o, sst, "cannot queue the operation");
	}
}

/* Records why the engine stopped and fails what is left with it. Lock held
 * on entry, released. */
static void stop_engine(struct kolo_engine *e, kolo_status_t st, const char *msg)
{
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
}

static void *engine_main(void *arg)
{
	struct kolo_engine *e = arg;
	char msg[KOLO_ERRBUF_SIZE];
	kolo_status_t st = KOLO_OK;
	bool stop = false;
	pthread_mutex_lock(&e->lock);
	while (st == KOLO_OK && !stop) {
		bool shutdown;
		wait_for_work(e);
		pace_cycle(e);
		take_incoming(e, &shutdown);
		e->last_cycle_ns = kolo_now_ns();
		msg[0] = '\0';
		st = run_cycle(e, shutdown, &stop, msg, sizeof(msg)); /* phases 4-6 */
		pthread_mutex_lock(&e->lock);
	}
	stop_engine(e, st, msg);
	return NULL;
}

/* ---- lifecycle ---------------------------------------------------------- */

kolo_status_t kolo_engine_create(struct kolo_ring_comm *rc, int rank, int size,
                                 const struct kolo_engine_config *cfg, struct kolo_engine **out,
                                 struct kolo_errbuf *eb)
{
	*out = NULL;
	if (!rc || !cfg || size < 1 || rank < 0 || rank >= size || cfg->timeout_ms <= 0)
		return kolo_fail(eb, KOLO_EINVAL, "engine: invalid arguments");
	struct kolo_engine *e = calloc(1, sizeof(*e));
	if (!e)
		return KOLO_ENOMEM;
	e->rc = rc;
	e->rank = rank;
	e->size = size;
	e->cfg = *cfg;
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
	kolo_status_t st = fusion_negotiator_create(rank, size, e->cfg.cache_capacity, &e->neg);
	if (st != KOLO_OK) {
		kolo_fail(eb, st, "engine: negotiator");
		goto fail;
	}
	/* "DYNAMIC" (Horovod's spelling): only kolo_timeline_start() writes. */
	if (rank == 0 && e->cfg.timeline[0] && strcmp(e->cfg.timeline, "DYNAMIC") != 0) {
		st = fusion_timeline_create(e->cfg.timeline, 1u << 20, e->cfg.timeline_mark_cycles,
		                            &e->tl, eb);
		if (st != KOLO_OK)
			goto fail;
	}
	if (rank == 0 && e->cfg.autotune) {
		struct fusion_autotune_config ac = {
		        .threshold = e->threshold,
		        .cycle_time_ms = e->cycle_ms,
		        .steps_per_sample = 10,
		        .warmup_samples = 1,
		        .samples_per_candidate = 3,
		        .log_path = e->cfg.autotune_log[0] ? e->cfg.autotune_log : NULL,
		};
		st = fusion_autotune_create(&ac, &e->at);
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
		fusion_negotiator_destroy(e->neg);
	}
	fusion_engine_tl_fini(e);
	fusion_autotune_destroy(e->at);
	free(e->fbuf);
	kolo_gpu_free(e->dfbuf);
	pthread_mutex_destroy(&e->lock);
	pthread_mutex_destroy(&e->tl_lock);
	pthread_mutex_destroy(&e->shutdown_lock);
	pthread_cond_destroy(&e->cond);
	free(e);
}
