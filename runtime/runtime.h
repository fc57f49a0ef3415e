/* runtime: the composition root. kolo_init() reads the parameters, joins the
 * rendezvous, creates the transport for the round, publishes its address in
 * the KV (key "addr/<round>/<rank>"), and builds the ring comm. The public
 * collectives of kolo.h delegate to ring/; the async API delegates to the
 * fusion engine, created on first use. */
#ifndef KOLO_RUNTIME_H
#define KOLO_RUNTIME_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "core.h"
#include "rendezvous.h"
#include "ring.h"
#include "transport.h"

struct kolo_engine; /* fusion/ */

struct kolo_comm {
	struct kolo_rdzv_client *rdzv; /* NULL for a bootstrap comm (bootstrap.c) */
	/* Bootstrap comms: every rank's transport handle, given by the caller;
	 * NULL when the addresses come from the rendezvous KV. */
	struct kolo_transport_handle *cards;
	char job[KOLO_RDZV_ID_MAX];
	char route_to[KOLO_RDZV_HOST_MAX];      /* picks this rank's address; "" default */
	int timeout_ms;                         /* no-progress timeout of collectives */
	atomic_bool aborted;                    /* kolo_abort() was called */
	struct kolo_rdzv_assignment assignment; /* rank, size, ... of this round */
	struct kolo_transport *transport;
	struct kolo_ring_comm *ring;
	struct kolo_engine *engine; /* NULL until the async API is first used */
	pthread_mutex_t engine_lock;
	char *token;
	char host[KOLO_RDZV_HOST_MAX];
	struct kolo_errbuf err; /* kolo_last_error() */
	/* Elastic mode (reform.c); elastic is NULL when KOLO_ELASTIC is off. */
	struct kolo_elastic *elastic;
	pthread_mutex_t elastic_lock;     /* live_ring, live_round vs. the watcher */
	struct kolo_ring_comm *live_ring; /* the ring the watcher may abort */
	int64_t live_round;
	bool change_at_commit;   /* the next reform follows a commit point */
	int64_t announced_round; /* the round whose end this rank announced */
	int resets;              /* re-forms done */
	int rejoins;             /* times this process joined again after an eviction */
	bool left;               /* left the job (SIGTERM while re-forming) */
	uint64_t reform_ns[4];   /* last reform: start, torn down, assigned, connected */
};

/* Tells the launcher (kolorun, through the pipe named by KOLO_LAUNCHER_FD)
 * this worker's rank, size and round, so that it prefixes the worker's output
 * with the rank. Does nothing without a launcher; never fails. Call after
 * every new assignment. */
kolo_status_t kolo_runtime_report_rank(const struct kolo_comm *comm);

/* Records st and its message as the comm's last error and returns st. */
kolo_status_t kolo_comm_fail(struct kolo_comm *comm, kolo_status_t st, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));

struct kolo_elastic; /* elastic/ */

/* Creates the transport for comm->assignment, publishes its address and
 * connects the ring (init.c; also what kolo_reform does for a new round). */
kolo_status_t kolo_runtime_data_plane_create(struct kolo_comm *comm);
/* The two halves of it: the transport, listening, with its handle in *out;
 * then the ring (and hierarchy), whose peer addresses come from comm->cards
 * or from the KV. */
kolo_status_t kolo_runtime_transport_create(struct kolo_comm *comm,
                                            struct kolo_transport_handle *out);
kolo_status_t kolo_runtime_ring_create(struct kolo_comm *comm);

/* A zeroed comm with its locks initialised, or NULL; comm_free's inverse. */
struct kolo_comm *kolo_runtime_comm_new(void);
void kolo_runtime_comm_free(struct kolo_comm *comm);
/* Records comm's last error as this thread's kolo_init_error(), frees the
 * comm and returns st. */
kolo_status_t kolo_runtime_init_fail(struct kolo_comm *comm, kolo_status_t st);
void kolo_runtime_set_init_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Elastic mode (reform.c). start: when KOLO_ELASTIC is set, installs the
 * SIGTERM handler and starts the membership watcher for the comm's round;
 * does nothing otherwise. stop: stops the watcher; accepts a comm without
 * one. failed: what a failed collective returns: in elastic mode a peer
 * failure becomes KOLO_EMEMBERSHIP and the round's end is announced to every
 * rank; otherwise st unchanged. */
kolo_status_t kolo_runtime_elastic_start(struct kolo_comm *comm);
void kolo_runtime_elastic_stop(struct kolo_comm *comm);
kolo_status_t kolo_runtime_elastic_failed(struct kolo_comm *comm, kolo_status_t st);

#endif /* KOLO_RUNTIME_H */
