/* An in-process world for the ring tests: n ranks, one thread each, each
 * with its own TCP transport endpoint on 127.0.0.1 and its own ring comm. */
#ifndef KOLO_TESTS_RING_WORLD_H
#define KOLO_TESTS_RING_WORLD_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>

#include "ring.h"

#define WORLD_MAX 16

struct world;

/* Runs in every rank's thread once its comm exists. */
typedef void (*world_body_fn)(struct world *w, int rank, struct kolo_ring_comm *rc);

struct world {
	int n;
	struct kolo_transport *t[WORLD_MAX];
	struct kolo_transport_handle h[WORLD_MAX];
	struct kolo_ring_comm *rc[WORLD_MAX];
	pthread_barrier_t bar;
	struct kolo_ring_config cfg; /* rank, transport and lookup are filled in */
	world_body_fn body;
	void *arg;
	/* Failures recorded by any thread (never exits early: others would hang). */
	pthread_mutex_t lock;
	int failures;
	char first_failure[512];
};

/* Creates n listening endpoints. cfg supplies the ring parameters. */
void world_init(struct world *w, int n, const struct kolo_ring_config *cfg);
/* Runs body on every rank (each thread creates and destroys its comm), joins
 * the threads and frees the endpoints. Returns the number of failures. */
int world_run(struct world *w, world_body_fn body, void *arg);
/* Records a failure (thread-safe). */
void world_fail(struct world *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A barrier between the rank threads (test-side synchronisation only). */
void world_sync(struct world *w);

#endif
