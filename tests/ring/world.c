#include "world.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "transport_tcp.h"

static const uint8_t token[] = "ring-test-token";

static kolo_status_t lookup(void *ctx, int rank, struct kolo_transport_handle *out, int timeout_ms)
{
	struct world *w = ctx;
	(void)timeout_ms;
	if (rank < 0 || rank >= w->n)
		return KOLO_ENOTFOUND;
	*out = w->h[rank];
	return KOLO_OK;
}

void world_fail(struct world *w, const char *fmt, ...)
{
	va_list ap;
	pthread_mutex_lock(&w->lock);
	if (w->failures++ == 0) {
		va_start(ap, fmt);
		vsnprintf(w->first_failure, sizeof(w->first_failure), fmt, ap);
		va_end(ap);
	}
	if (w->failures <= 10) {
		va_start(ap, fmt);
		fprintf(stderr, "FAIL: ");
		vfprintf(stderr, fmt, ap);
		fprintf(stderr, "\n");
		va_end(ap);
	}
	pthread_mutex_unlock(&w->lock);
}

void world_sync(struct world *w)
{
	pthread_barrier_wait(&w->bar);
}

void world_init(struct world *w, int n, const struct kolo_ring_config *cfg)
{
	memset(w, 0, sizeof(*w));
	w->n = n;
	w->cfg = *cfg;
	pthread_mutex_init(&w->lock, NULL);
	pthread_barrier_init(&w->bar, NULL, (unsigned)n);
	for (int r = 0; r < n; r++) {
		struct kolo_transport_config tc = {
		        .job = "ring-test",
		        .round = 1,
		        .rank = r,
		        .size = n,
		        .token = token,
		        .token_len = sizeof(token) - 1,
		        .timeout_ms = cfg->timeout_ms,
		        .streams = 2,
		        .iface = "127.0.0.1",
		        .spin_us = cfg->spin_us,
		};
		kolo_status_t st = kolo_transport_tcp_ops.create(&tc, &w->t[r], NULL);
		if (st == KOLO_OK)
			st = kolo_transport_tcp_ops.listen(w->t[r], &w->h[r]);
		if (st != KOLO_OK)
			world_fail(w, "rank %d: transport: %s", r,
			           w->t[r] ? w->t[r]->err.msg : kolo_strerror(st));
	}
}

struct thread_arg {
	struct world *w;
	int rank;
};

static void *rank_main(void *p)
{
	struct thread_arg *a = p;
	struct world *w = a->w;
	struct kolo_ring_config cfg = w->cfg;
	cfg.transport = w->t[a->rank];
	cfg.rank = a->rank;
	cfg.size = w->n;
	cfg.lookup = lookup;
	cfg.lookup_ctx = w;
	struct kolo_errbuf eb = {{0}};
	kolo_status_t st = kolo_ring_comm_create(&cfg, &w->rc[a->rank], &eb);
	if (st != KOLO_OK)
		world_fail(w, "rank %d: comm create: %s", a->rank, eb.msg);
	world_sync(w);
	if (st == KOLO_OK)
		w->body(w, a->rank, w->rc[a->rank]);
	else
		w->body(w, a->rank, NULL);
	world_sync(w);
	kolo_ring_comm_destroy(w->rc[a->rank]);
	return NULL;
}

int world_run(struct world *w, world_body_fn body, void *arg)
{
	pthread_t th[WORLD_MAX];
	struct thread_arg args[WORLD_MAX];
	w->body = body;
	w->arg = arg;
	if (w->failures == 0) {
		for (int r = 0; r < w->n; r++) {
			args[r] = (struct thread_arg){w, r};
			pthread_create(&th[r], NULL, rank_main, &args[r]);
		}
		for (int r = 0; r < w->n; r++)
			pthread_join(th[r], NULL);
	}
	for (int r = 0; r < w->n; r++)
		kolo_transport_tcp_ops.destroy(w->t[r]);
	pthread_barrier_destroy(&w->bar);
	pthread_mutex_destroy(&w->lock);
	return w->failures;
}
