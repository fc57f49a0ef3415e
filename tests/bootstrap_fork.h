/* Ranks in forked processes joined with the bootstrap API (kolo/bootstrap.h):
 * they exchange host names and cards through a shared mapping with a
 * process-shared barrier, as a caller would through its own store
 * (torchrun's, a file system). For the tests that need several "hosts" in one
 * machine without a rendezvous server. Create the exchange before forking. */
#ifndef KOLO_TESTS_BOOTSTRAP_FORK_H
#define KOLO_TESTS_BOOTSTRAP_FORK_H

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "kolo/bootstrap.h"

#define BOOTSTRAP_FORK_MAX_RANKS 8

struct bootstrap_fork {
	pthread_barrier_t barrier; /* of every rank */
	char hosts[BOOTSTRAP_FORK_MAX_RANKS][KOLO_BOOTSTRAP_HOST_MAX];
	uint8_t cards[BOOTSTRAP_FORK_MAX_RANKS][KOLO_BOOTSTRAP_CARD_SIZE];
};

/* A zeroed exchange of `bytes` (at least sizeof(struct bootstrap_fork), which
 * starts it: a test may append its own shared fields) for n ranks, shared
 * with the children forked after it; NULL on failure. munmap it after. */
static inline void *bootstrap_fork_new(int n, size_t bytes)
{
	if (n < 1 || n > BOOTSTRAP_FORK_MAX_RANKS || bytes < sizeof(struct bootstrap_fork))
		return NULL;
	struct bootstrap_fork *x =
	        mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (x == MAP_FAILED)
		return NULL;
	memset(x, 0, bytes);
	pthread_barrierattr_t attr;
	pthread_barrierattr_init(&attr);
	pthread_barrierattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
	int rc = pthread_barrier_init(&x->barrier, &attr, (unsigned)n);
	pthread_barrierattr_destroy(&attr);
	if (rc != 0) {
		munmap(x, bytes);
		return NULL;
	}
	return x;
}

/* The three bootstrap steps of rank cfg->rank on `host` (KOLO_HOSTNAME):
 * 0 with *out the comm, or 1, 2, 3 for the step that failed (its message on
 * stderr). Every rank must call it. */
static inline int bootstrap_fork_join(struct bootstrap_fork *x,
                                      const struct kolo_bootstrap_config *cfg, const char *host,
                                      kolo_comm_t **out)
{
	const int rank = cfg->rank, n = cfg->size;
	setenv("KOLO_HOSTNAME", host, 1);
	kolo_bootstrap_t *b;
	if (kolo_bootstrap_create(cfg, &b) != KOLO_OK) {
		fprintf(stderr, "rank %d: create: %s\n", rank, kolo_init_error());
		return 1;
	}
	snprintf(x->hosts[rank], sizeof(x->hosts[rank]), "%s", kolo_bootstrap_host(b));
	pthread_barrier_wait(&x->barrier);
	const char *hosts[BOOTSTRAP_FORK_MAX_RANKS];
	for (int r = 0; r < n; r++)
		hosts[r] = x->hosts[r];
	if (kolo_bootstrap_listen(b, hosts, x->cards[rank]) != KOLO_OK) {
		fprintf(stderr, "rank %d: listen: %s\n", rank, kolo_init_error());
		kolo_bootstrap_destroy(b);
		return 2;
	}
	pthread_barrier_wait(&x->barrier);
	if (kolo_bootstrap_connect(b, x->cards, out) != KOLO_OK) {
		fprintf(stderr, "rank %d: connect: %s\n", rank, kolo_init_error());
		return 3;
	}
	return 0;
}

#endif
