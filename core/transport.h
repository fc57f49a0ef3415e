/* The transport contract. ring/ moves bytes only through this table, so a
 * transport (TCP, verbs, shared memory) drops in without touching the
 * collectives. Shaped after NCCL's net plugin: non-blocking connect/accept,
 * isend/irecv returning requests polled with test, an opaque fixed-size
 * listen handle exchanged out of band (the rendezvous KV).
 *
 * Objects: a kolo_transport is one rank's endpoint for one round. A kolo_conn
 * is a duplex, ordered, authenticated channel to one peer, identified by
 * (peer_rank, tag); the n-th irecv posted on a conn receives the n-th isend
 * the peer posted on its side of that conn, and the lengths must be equal.
 *
 * Threading: one thread drives a transport (all calls but abort). abort() may
 * be called from any thread and wakes a thread blocked in wait().
 *
 * Failure: a peer that closes or resets is an error at once (KOLO_EPEER); a
 * conn with pending work and no progress for cfg.timeout_ms fails with
 * KOLO_ETIMEDOUT. After an error the conn is unusable; close it. */
#ifndef KOLO_CORE_TRANSPORT_H
#define KOLO_CORE_TRANSPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core.h"

#define KOLO_TRANSPORT_HANDLE_SIZE 128
#define KOLO_TRANSPORT_MAGIC       0x6b6f6c6fu /* "kolo" */
#define KOLO_WIRE_VERSION          2

/* What listen() publishes and connect() consumes. Opaque to everyone but the
 * transport that wrote it; the first 4 bytes are KOLO_TRANSPORT_MAGIC. */
struct kolo_transport_handle {
	uint8_t bytes[KOLO_TRANSPORT_HANDLE_SIZE];
};
_Static_assert(sizeof(struct kolo_transport_handle) == KOLO_TRANSPORT_HANDLE_SIZE,
               "handle size is part of the KV protocol");

/* Byte 4 of every handle, after the magic: the transport that wrote it. The
 * values are on the wire (the KV), so they never change. */
enum kolo_handle_kind {
	KOLO_HANDLE_TCP = 1,
	KOLO_HANDLE_HYBRID = 'H',
	KOLO_HANDLE_SHM = 'S',
	KOLO_HANDLE_VERBS = 'V',
};

struct kolo_transport_config {
	const char *job;      /* job id; connections of another job are refused */
	int64_t round;        /* round; connections of another round are refused */
	int rank;             /* this endpoint's rank in the round */
	int size;             /* ranks in the round */
	const uint8_t *token; /* shared secret proving membership (may be empty) */
	size_t token_len;
	int timeout_ms;       /* no-progress timeout of a conn with pending work */
	int streams;          /* parallel streams per conn (TCP); 0 picks per peer */
	const char *iface;    /* interface name or IP address; "" or NULL picks */
	const char *route_to; /* host whose route picks the default address, or NULL */
	int socket_buffer;    /* SO_SNDBUF/SO_RCVBUF; 0 keeps autotuning */
	int spin_us;          /* busy-poll time before wait() blocks */
	/* Liveness probe of peers on other hosts (TCP; docs/elastic.md): one
	 * byte every probe_ms, a loss after probe_timeout_ms without a TCP
	 * acknowledgement. 0 disables it. */
	int probe_ms;
	int probe_timeout_ms;
	/* TCP: the largest chunk a message is cut into (KOLO_TCP_CHUNK_BYTES);
	 * shared memory: bytes of each direction's ring (KOLO_SHM_BUFFER). 0
	 * takes the parameter's default from core/params.def. */
	size_t tcp_chunk_bytes;
	size_t shm_ring_bytes;
	/* Which ranks share this endpoint's host (size entries; NULL: none
	 * known). The hybrid transport (runtime/hybrid.h) reaches those through
	 * shared memory; other transports ignore it. */
	const bool *same_host;
	/* The hybrid's transport between hosts (NULL: TCP). */
	const struct kolo_transport_ops *net;
	/* Verbs (transport_verbs.h): the device (NULL or "": the one behind
	 * iface, else the first active), its port (0: the first active), the
	 * GID index (-1 picks; a zeroed config means 0), slots per conn and
	 * their size, the size from which messages are written in place, and
	 * the registration cache's entries. 0 takes params.def's default,
	 * except verbs_mr_cache (0: no cache). */
	const char *ib_device;
	int ib_port;
	int ib_gid_index;
	int verbs_slots;
	size_t verbs_slot_bytes;
	size_t verbs_rdv_bytes;
	int verbs_mr_cache;
	/* TCP: a peer that closes or resets a conn is logged at debug level and
	 * not counted as a transport error. For endpoints whose user reports
	 * the loss itself where it matters (point-to-point: peers close their
	 * conns when they finalize). */
	bool quiet_peer_close;
};

struct kolo_transport_ops;

/* Base of every transport endpoint; concrete ones embed it first. */
struct kolo_transport {
	const struct kolo_transport_ops *ops;
	struct kolo_errbuf err; /* detail of the last failure */
};

/* Base of every connection. */
struct kolo_conn {
	struct kolo_transport *transport;
	int peer_rank;
	int tag;
};

/* A pending isend/irecv; owned by the transport. */
struct kolo_req;

struct kolo_transport_ops {
	const char *name;
	/* Creates an endpoint; copies what it needs from cfg. On an error the
	 * detail goes to eb (which may be NULL) and *out stays NULL. */
	kolo_status_t (*create)(const struct kolo_transport_config *cfg,
	                        struct kolo_transport **out, struct kolo_errbuf *eb);
	/* Starts listening and writes the handle peers connect to. Once. */
	kolo_status_t (*listen)(struct kolo_transport *t, struct kolo_transport_handle *out);
	/* Starts a connection to peer_rank at `peer`, identified on both sides by
	 * tag. Never blocks: the conn is returned at once, and sends queue until
	 * the handshake is done. A refused handshake fails the conn's requests. */
	kolo_status_t (*connect)(struct kolo_transport *t, const struct kolo_transport_handle *peer,
	                         int peer_rank, int tag, struct kolo_conn **out);
	/* Returns the authenticated conn that peer_rank opened with tag, or
	 * *out = NULL when it has not arrived yet. Never blocks. Handshakes of
	 * stray, stale-round or unauthenticated connections are refused and
	 * logged while accept() or wait() run; they never reach a conn. */
	kolo_status_t (*accept)(struct kolo_transport *t, int peer_rank, int tag,
	                        struct kolo_conn **out);
	/* Queue len bytes to send / receive. buf must stay valid until the
	 * request completes or the conn is closed. len may be 0. */
	kolo_status_t (*isend)(struct kolo_conn *c, const void *buf, size_t len,
	                       struct kolo_req **out);
	kolo_status_t (*irecv)(struct kolo_conn *c, void *buf, size_t len, struct kolo_req **out);
	/* Makes progress without blocking. *done = true when the request is
	 * complete; the request is then released. On an error the request is
	 * released too and the status says why (detail in t->err). */
	kolo_status_t (*test)(struct kolo_req *req, bool *done);
	/* Blocks until some pending request or handshake may progress, at most
	 * timeout_ms (0 returns at once), or until abort(). Returns the abort
	 * status after abort(), else KOLO_OK. */
	kolo_status_t (*wait)(struct kolo_transport *t, int timeout_ms);
	/* Thread-safe, idempotent: every pending and later operation fails with
	 * st (≠ KOLO_OK), and wait() returns. */
	void (*abort)(struct kolo_transport *t, kolo_status_t st);
	/* Closes a conn with a reset so the peer fails fast. Pending requests on
	 * it are released. Accepts NULL. */
	void (*close)(struct kolo_conn *c);
	/* Closes all conns and the listener and frees the endpoint. Accepts NULL. */
	void (*destroy)(struct kolo_transport *t);
	/* Optional (may be NULL): an fd that polls readable whenever wait() might
	 * return without blocking, so that one thread can block on several
	 * transports at once (the runtime combines shared memory inside a host
	 * with TCP between hosts). The fd stays owned by the transport. */
	int (*poll_fd)(struct kolo_transport *t);
	/* Optional (may be NULL): whether peer_rank's host stopped answering at
	 * the network level (no acknowledgement within probe_timeout_ms), as
	 * opposed to a peer that closed, reset or was slow. Thread-safe. */
	bool (*unreachable)(struct kolo_transport *t, int peer_rank);
	/* Optional (may be NULL): how long the liveness probe to peer_rank's host
	 * has waited for an acknowledgement (0: it has none outstanding), -1 when
	 * that host is not probed. Thread-safe. */
	int (*unacked_ms)(struct kolo_transport *t, int peer_rank);
	/* Optional (may be NULL): tells c's peer that the caller runs on CPU
	 * `cpu` now and returns the CPU the peer last said it runs on, or -1
	 * when that is unknown (a peer on another host, a conn not ready). */
	int (*peer_cpu)(struct kolo_conn *c, int cpu);
};

static inline kolo_status_t kolo_isend(struct kolo_conn *c, const void *buf, size_t len,
                                       struct kolo_req **out)
{
	return c->transport->ops->isend(c, buf, len, out);
}

static inline kolo_status_t kolo_irecv(struct kolo_conn *c, void *buf, size_t len,
                                       struct kolo_req **out)
{
	return c->transport->ops->irecv(c, buf, len, out);
}

#endif /* KOLO_CORE_TRANSPORT_H */
