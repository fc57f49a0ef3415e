/* runtime: the composition root. kolo_init() reads the parameters, joins the
 * rendezvous, creates the transport for the round, publishes its address in
 * the KV (key "addr/<round>/<rank>"), and builds the ring comm. The public
 * collectives of kolo.h delegate to ring/; the async API delegates to the
 * fusion engine, created on first use. */
#ifndef KOLO_RUNTIME_H
#define KOLO_RUNTIME_H

#include <pthread.h>
#include <stdbool.h>

#include "core.h"
#include "rendezvous.h"
#include "ring.h"
#include "transport.h"

struct kolo_engine; /* fusion/ */

struct kolo_comm {
	struct kolo_rdzv_client *rdzv;
	struct kolo_rdzv_assignment assignment; /* rank, size, ... of this round */
	struct kolo_transport *transport;
	struct kolo_ring_comm *ring;
	struct kolo_engine *engine; /* NULL until the async API is first used */
	pthread_mutex_t engine_lock;
	char *token;
	char host[KOLO_RDZV_HOST_MAX];
	struct kolo_errbuf err; /* kolo_last_error() */
};

/* Tells the launcher (kolorun, through the pipe named by KOLO_LAUNCHER_FD)
 * this worker's rank, size and round, so that it prefixes the worker's output
 * with the rank. Does nothing without a launcher; never fails. Call after
 * every new assignment. */
kolo_status_t kolo_runtime_report_rank(const struct kolo_comm *comm);

/* Records st and its message as the comm's last error and returns st. */
kolo_status_t kolo_comm_fail(struct kolo_comm *comm, kolo_status_t st, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

#endif /* KOLO_RUNTIME_H */
