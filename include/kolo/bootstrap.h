/* kolo bootstrap: a comm without the rendezvous server.
 *
 * For a caller that already knows every rank's place and can exchange a few
 * bytes between the ranks: torch.distributed's c10d store under torchrun, an
 * MPI job, a shared file system, or a job of one process. Every rank runs
 * the same three steps:
 *
 *   1. kolo_bootstrap_create(&cfg, &b), then publish kolo_bootstrap_host(b)
 *      to every rank (ranks with the same host name share memory);
 *   2. kolo_bootstrap_listen(b, hosts, card) with every rank's host name in
 *      rank order; publish the KOLO_BOOTSTRAP_CARD_SIZE bytes of card;
 *   3. kolo_bootstrap_connect(b, cards, &comm) with every rank's card in rank
 *      order (cards + r * KOLO_BOOTSTRAP_CARD_SIZE is rank r's).
 *
 * No callback is ever made: the caller moves the bytes with whatever it has,
 * on its own thread. A bootstrap comm is not elastic (there is no membership
 * service to re-form through): kolo_reform() returns KOLO_EINVAL.
 * kolo_finalize() does not synchronise with the other ranks: the caller makes
 * sure, through its own channel, that every rank has finished its collectives
 * before any rank finalizes (a barrier on the same store), or calls
 * kolo_abort() first after a failure. Point-to-point (kolo/async.h) works
 * on a bootstrap comm: each card carries the rank's p2p address too. Local ranks are the ranks of
 * one host in rank order; cross ranks as in kolo_init(). */
#ifndef KOLO_BOOTSTRAP_H
#define KOLO_BOOTSTRAP_H

#include "kolo/kolo.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KOLO_BOOTSTRAP_CARD_SIZE 256 /* bytes of one rank's card */
#define KOLO_BOOTSTRAP_HOST_MAX  256 /* bytes of a host name, with its NUL */

typedef struct kolo_bootstrap kolo_bootstrap_t;

struct kolo_bootstrap_config {
	int rank;             /* this process's rank, 0 <= rank < size */
	int size;             /* ranks in the job */
	const char *job;      /* job id shared by every rank (NULL: "default"); connections
	                         of another job are refused */
	const char *token;    /* shared secret that every connection proves (NULL or "":
	                         none) */
	const char *route_to; /* a host whose route picks this rank's address, e.g.
	                         MASTER_ADDR (NULL: KOLO_IFACE or the default route) */
	int timeout_ms;       /* no-progress timeout of a collective (0: KOLO_TIMEOUT_MS) */
};

/* Step 1. Validates cfg (copied) and determines this host's name (KOLO_HOSTNAME
 * or the system's). On failure *out is NULL and kolo_init_error() says why. */
KOLO_API kolo_status_t kolo_bootstrap_create(const struct kolo_bootstrap_config *cfg,
                                             kolo_bootstrap_t **out);
/* This rank's host name, as step 2 wants it from every rank. Never NULL. */
KOLO_API const char *kolo_bootstrap_host(const kolo_bootstrap_t *b);
/* Step 2. hosts[r] is rank r's kolo_bootstrap_host(); creates the transport
 * (shared memory to ranks of this host, TCP to the others) and the
 * point-to-point endpoint (TCP), starts listening
 * and writes this rank's card (KOLO_BOOTSTRAP_CARD_SIZE bytes) to card. Once. */
KOLO_API kolo_status_t kolo_bootstrap_listen(kolo_bootstrap_t *b, const char *const *hosts,
                                             void *card);
/* Step 3. Connects the ring from every rank's card (size * CARD_SIZE bytes,
 * rank order) and returns the comm; b is consumed whether it succeeds or not.
 * Blocks until the ring's neighbours answer, at most the timeout. */
KOLO_API kolo_status_t kolo_bootstrap_connect(kolo_bootstrap_t *b, const void *cards,
                                              kolo_comm_t **comm);
/* Frees a bootstrap that will not be connected. Accepts NULL. */
KOLO_API void kolo_bootstrap_destroy(kolo_bootstrap_t *b);

#ifdef __cplusplus
}
#endif
#endif /* KOLO_BOOTSTRAP_H */
