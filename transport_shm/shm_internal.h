/* What the files of transport_shm/ share, and only they. The public name is
 * kolo_transport_shm_ops (transport_shm.h, which also gives the design); every
 * name here is shm_*, and file-static helpers carry no prefix. The files, one
 * job each:
 *   shm_ring.c       the pair of SPSC byte rings in a memfd mapping
 *   shm_handshake.c  listen, connect, accept: the handshake over the socket
 *   shm_conn.c       conns and requests, the data path, the progress pass
 *   shm.c            create/destroy, wait/abort/poll_fd and the ops table */
#ifndef KOLO_SHM_INTERNAL_H
#define KOLO_SHM_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "transport.h"
#include "transport_shm.h"

#define SHM_JOB_MAX 128

/* The connector's hello (shm_handshake.c); shm_conn buffers one. */
struct shm_msg_hello {
	uint32_t magic;
	uint32_t version;
	char job[SHM_JOB_MAX];
	int64_t round;
	int32_t src_rank, dst_rank, tag;
	uint8_t mac[KOLO_HMAC_SIZE];
};

/* ---- shared segment (shm_ring.c) ---- */

struct shm_ring_ctl {
	_Atomic uint64_t head; /* bytes produced */
	char pad0[56];
	_Atomic uint64_t tail; /* bytes consumed */
	char pad1[56];
	_Atomic uint32_t consumer_waiting;
	char pad2[60];
	_Atomic uint32_t producer_waiting;
	char pad3[60];
	_Atomic int32_t producer_cpu; /* the CPU its producer last waited on; -1: none yet */
	char pad4[60];
};

/* ---- objects ---- */

enum shm_conn_state {
	SHM_CS_CONNECTOR_WAIT_NONCE,
	SHM_CS_CONNECTOR_WAIT_VERDICT,
	SHM_CS_ACCEPTOR_WAIT_HELLO,
	SHM_CS_READY,
	SHM_CS_FAILED
};

struct kolo_req {
	struct shm_conn *c;
	bool send;
	bool done;
	uint64_t hdr; /* the message's length as it crosses the rings (shm_conn.c) */
	uint8_t *buf;
	size_t len, moved;
	struct kolo_req *prev, *next; /* in the conn's list for this direction; next: free list */
};

struct shm_req_list {
	struct kolo_req *first, *last;
};

struct shm_conn {
	struct kolo_conn base;
	struct shm_transport *t;
	int fd;
	enum shm_conn_state state;
	bool claimed; /* returned by accept() or connect() */
	bool acceptor;
	bool peer_closed; /* EOF on the socket: what is in the ring still counts */
	kolo_status_t failed;
	uint8_t hs[sizeof(struct shm_msg_hello)];
	size_t hs_len;
	uint8_t nonce[32];
	uint8_t *map;
	size_t map_len, ring_bytes;
	struct shm_ring_ctl *tx, *rx;
	/* The consumer's tail of tx as last read: the space it leaves is
	 * reread only when it is short, so a small send does not pull the
	 * line the consumer has just written to. */
	uint64_t tx_tail;
	uint8_t *txdata, *rxdata;
	struct shm_req_list sends, recvs;
	/* Deadlines without a clock read per message: the data path counts
	 * progress, and the timeout check stamps last_progress_ns when it sees
	 * the count move (so a timeout fires between timeout_ms and timeout_ms
	 * plus one check interval after the last progress). */
	uint64_t progress, progress_seen;
	uint64_t last_progress_ns;
	unsigned tests_unchecked; /* tests since the last timeout check */
	uint64_t created_ns;
	struct shm_conn *next_conn;
};

struct shm_transport {
	struct kolo_transport base;
	char job[SHM_JOB_MAX];
	int64_t round;
	int rank;
	uint8_t *token;
	size_t token_len;
	int timeout_ms;
	size_t ring_bytes;
	int listen_fd;
	int epfd;
	int abort_fd;
	_Atomic int abort_status;
	char name[48];
	struct shm_conn *conns;
	struct kolo_req *free_reqs; /* released requests, reused by the next post */
};

static inline struct shm_transport *shm_tr(struct kolo_transport *t)
{
	return kolo_container_of(t, struct shm_transport, base);
}

static inline struct shm_conn *shm_cn(struct kolo_conn *c)
{
	return kolo_container_of(c, struct shm_conn, base);
}

/* ---- the rings (shm_ring.c) ---- */

/* Maps the segment of `memfd` into c and points c's rings at it; the
 * acceptor (create) sizes and initialises it first. */
kolo_status_t shm_ring_map(struct shm_conn *c, int memfd, size_t ring_bytes, bool create);
/* Copy into the tx ring / out of the rx ring as much as fits (at most a
 * publish step); wake the peer when it sleeps. Return the bytes moved. */
size_t shm_ring_write(struct shm_conn *c, const uint8_t *src, size_t len);
size_t shm_ring_read(struct shm_conn *c, uint8_t *dst, size_t len);
/* The same for a..alen then b..blen, published at once (a may be empty). */
size_t shm_ring_writev(struct shm_conn *c, const uint8_t *a, size_t alen, const uint8_t *b,
                       size_t blen);
/* Consumes skip bytes (already peeked), then reads up to len into dst, at
 * once; returns all it consumed. */
size_t shm_ring_readv(struct shm_conn *c, size_t skip, uint8_t *dst, size_t len);
/* Copies up to len bytes of the rx ring without consuming them. */
size_t shm_ring_peek(struct shm_conn *c, uint8_t *dst, size_t len);
/* The transport's peer_cpu(): publishes cpu, returns the peer's. */
int shm_peer_cpu(struct kolo_conn *base, int cpu);

/* ---- the handshake (shm_handshake.c) ---- */

/* Accepts every pending socket and sends each its nonce. */
void shm_accept_new(struct shm_transport *t);
/* Advance a conn's handshake with what the socket holds. */
void shm_acceptor_step(struct shm_conn *c);
void shm_connector_step(struct shm_conn *c);

kolo_status_t shm_listen(struct kolo_transport *base, struct kolo_transport_handle *out);
kolo_status_t shm_connect(struct kolo_transport *base, const struct kolo_transport_handle *peer,
                          int peer_rank, int tag, struct kolo_conn **out);
kolo_status_t shm_accept(struct kolo_transport *base, int peer_rank, int tag,
                         struct kolo_conn **out);

/* ---- conns and requests (shm_conn.c) ---- */

void shm_conn_fail(struct shm_conn *c, kolo_status_t st, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));
kolo_status_t shm_conn_add(struct shm_transport *t, int fd, bool acceptor, int peer, int tag,
                           struct shm_conn **out);
void shm_conn_free(struct shm_conn *c);
/* Drains wake-up bytes; notices a closed peer. */
void shm_conn_drain(struct shm_conn *c);
/* One pass over everything: handshakes, data, failures. Returns true when
 * any data moved. */
bool shm_progress(struct shm_transport *t);

kolo_status_t shm_isend(struct kolo_conn *c, const void *buf, size_t len, struct kolo_req **out);
kolo_status_t shm_irecv(struct kolo_conn *c, void *buf, size_t len, struct kolo_req **out);
kolo_status_t shm_test(struct kolo_req *r, bool *done);
void shm_close(struct kolo_conn *base);

#endif /* KOLO_SHM_INTERNAL_H */
