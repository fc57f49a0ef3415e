/* p2p: point-to-point messages between any two ranks (send, recv from one
 * rank or from any, with tags), beside the collectives. A p2p owns its own
 * transport endpoint and a thread that drives it, so a recv that waits never
 * holds up the fusion engine and a collective never holds up a recv.
 *
 * Wire: one conn per direction and pair, opened by the sender on its first
 * message to that peer; every message is a 16-byte header (magic, tag,
 * length) and its payload. Matching is MPI's: a recv takes the earliest
 * message from its source (or from any) with its tag, and messages from one
 * sender with one tag arrive in the order sent. A message that no recv has
 * asked for yet is received into memory and waits there. docs/p2p.md. */
#ifndef KOLO_P2P_H
#define KOLO_P2P_H

#include <stddef.h>

#include "core.h"
#include "fusion.h"
#include "kolo/async.h"
#include "transport.h"

#define KOLO_P2P_ANY_SOURCE (-1)
/* Conn tags of the p2p endpoint: the sender's tag is TAG + (sender > peer). */
#define KOLO_P2P_TAG 0x7000

/* Looks up peer `rank`'s p2p listen handle without blocking: KOLO_ENOTFOUND
 * while it is not published yet (the peer has not used p2p so far). */
typedef kolo_status_t (*kolo_p2p_lookup_fn)(void *ctx, int rank, struct kolo_transport_handle *out);
/* KOLO_OK while the comm the p2p belongs to is sound; otherwise its status,
 * with the reason in eb. Called from the p2p thread every few tens of ms. */
typedef kolo_status_t (*kolo_p2p_health_fn)(void *ctx, struct kolo_errbuf *eb);

struct kolo_p2p_config {
	struct kolo_transport *transport; /* listening; the p2p owns it from create on */
	int rank, size;
	kolo_p2p_lookup_fn lookup;
	void *lookup_ctx;
	kolo_p2p_health_fn health; /* may be NULL */
	void *health_ctx;
	/* How long a send waits for its peer's address and a recv for its
	 * message, and the no-progress limit of a message under way. */
	int timeout_ms;
	void *owner; /* stored in the handles (kolo_handle_owner) */
};

struct kolo_p2p;

/* Starts the p2p thread. On failure the transport is destroyed too. */
kolo_status_t kolo_p2p_create(const struct kolo_p2p_config *cfg, struct kolo_p2p **out,
                              struct kolo_errbuf *eb);
/* Fails every pending and later operation with st and msg; non-blocking,
 * thread-safe, the first failure wins. */
void kolo_p2p_close(struct kolo_p2p *p, kolo_status_t st, const char *msg);
/* Closes with KOLO_ESHUTDOWN (pending operations fail), stops the thread,
 * destroys the transport and frees. Accepts NULL. */
void kolo_p2p_destroy(struct kolo_p2p *p);
/* KOLO_OK, or the failure every later operation gets (message in eb). */
kolo_status_t kolo_p2p_status(struct kolo_p2p *p, struct kolo_errbuf *eb);

/* Queues len bytes of buf for rank dst with tag. buf stays untouched by the
 * caller until the operation completes: cb (on the p2p thread), then the
 * handle is done. It completes once the bytes are handed to the transport
 * (the peer may not have received them yet). As async.h: an error return
 * means no callback and no handle. Thread-safe. */
kolo_status_t kolo_p2p_send(struct kolo_p2p *p, const void *buf, size_t len, int dst, int tag,
                            kolo_callback_fn cb, void *cb_arg, kolo_handle_t **handle,
                            struct kolo_errbuf *eb);
/* Receives a message of exactly len bytes with tag from src (or from any
 * rank: KOLO_P2P_ANY_SOURCE) into buf; *source (may be NULL) gets the sender
 * before the callback runs. A message of another length fails the recv with
 * KOLO_EMISMATCH and stays for a recv that fits. Thread-safe. */
kolo_status_t kolo_p2p_recv(struct kolo_p2p *p, void *buf, size_t len, int src, int tag,
                            int *source, kolo_callback_fn cb, void *cb_arg, kolo_handle_t **handle,
                            struct kolo_errbuf *eb);

#endif /* KOLO_P2P_H */
