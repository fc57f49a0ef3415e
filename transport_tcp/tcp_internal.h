/* What the files of transport_tcp/ share, and only they. Public names are
 * kolo_tcp_* (transport_tcp.h); every name here is tcp_*, and file-static
 * helpers carry no prefix. The files, one job each:
 *   tcp_wire.c       the wire codec: challenge, hello, verdict, chunk header
 *   tcp_addr.c       address choice and the listen handle
 *   tcp_conn.c       conns and requests: lifetime, failure, socket setup
 *   tcp_connector.c  the connector's side of the handshake
 *   tcp_acceptor.c   the acceptor's side of the handshake
 *   tcp_stream.c     the data path of a ready stream: chunks out and in
 *   tcp_poll.c       the poll loop: interests, dispatch, deadlines
 *   tcp_probe.c      the liveness probe of other hosts
 *   transport_tcp.c  the ops table
 * Wire format and failure semantics: docs/transport.md. */
#ifndef KOLO_TCP_INTERNAL_H
#define KOLO_TCP_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "transport.h"
#include "transport_tcp.h"

/* ---- the wire format (tcp_wire.c) --------------------------------------- */

/* All integers little-endian. Every message starts with
 * KOLO_TRANSPORT_MAGIC. */
#define TCP_JOB_FIELD  128 /* the job id, NUL-padded */
#define TCP_NONCE_SIZE 32
#define TCP_MAGIC_OFF  0

/* challenge (acceptor -> connector): magic, version, nonce */
#define TCP_CHALLENGE_VERSION_OFF 4
#define TCP_CHALLENGE_NONCE_OFF   8
#define TCP_CHALLENGE_SIZE        (TCP_CHALLENGE_NONCE_OFF + TCP_NONCE_SIZE)

/* hello (connector -> acceptor); its MAC is HMAC(token, nonce ||
 * hello[0, TCP_HELLO_MAC_OFF)) with the acceptor's nonce. */
#define TCP_HELLO_VERSION_OFF    4
#define TCP_HELLO_JOB_OFF        8
#define TCP_HELLO_ROUND_OFF      136
#define TCP_HELLO_SRC_OFF        144
#define TCP_HELLO_DST_OFF        148
#define TCP_HELLO_TAG_OFF        152
#define TCP_HELLO_STREAM_OFF     156
#define TCP_HELLO_NSTREAMS_OFF   160
#define TCP_HELLO_PROBE_PORT_OFF 164 /* 32 bits; the port in the low 16 (0: none) */
#define TCP_HELLO_CNONCE_OFF     168
#define TCP_HELLO_MAC_OFF        (TCP_HELLO_CNONCE_OFF + TCP_NONCE_SIZE)
#define TCP_HELLO_SIZE           (TCP_HELLO_MAC_OFF + KOLO_HMAC_SIZE)

/* verdict (acceptor -> connector): magic, status, reason, MAC. An
 * acceptance's MAC is HMAC(token, cnonce || nonce || verdict[0,
 * TCP_VERDICT_MAC_OFF)), so the connector knows the acceptor holds the token
 * too; a refusal carries none. */
#define TCP_VERDICT_STATUS_OFF 4
#define TCP_VERDICT_REASON_OFF 8
#define TCP_REASON_SIZE        128
#define TCP_VERDICT_MAC_OFF    (TCP_VERDICT_REASON_OFF + TCP_REASON_SIZE)
#define TCP_VERDICT_SIZE       (TCP_VERDICT_MAC_OFF + KOLO_HMAC_SIZE)

/* chunk header (both ways, before each chunk's payload) */
#define TCP_CHUNK_MAGIC      0x4b434855u
#define TCP_CHUNK_LEN_OFF    4  /* 32 bits: payload bytes */
#define TCP_CHUNK_SEQ_OFF    8  /* the message's sequence number on its conn */
#define TCP_CHUNK_OFFSET_OFF 16 /* where the payload goes in the message */
#define TCP_CHUNK_MSGLEN_OFF 24 /* the whole message's length */
#define TCP_CHUNK_HDR_SIZE   32

/* The biggest handshake message: one buffer holds any of them. */
#define TCP_HANDSHAKE_MAX TCP_HELLO_SIZE

/* A hello, decoded. */
struct tcp_hello {
	char job[TCP_JOB_FIELD]; /* as on the wire: NUL-padded, maybe unterminated */
	int64_t round;
	int src, dst, tag;
	uint32_t stream, nstreams;
	uint16_t probe_port; /* the connector's liveness probe listener; 0: none */
	uint8_t cnonce[TCP_NONCE_SIZE];
};

/* What an acceptor admits a hello against. */
struct tcp_hello_expect {
	const char *job; /* TCP_JOB_FIELD bytes, NUL-padded */
	int64_t round;
	int rank, size;
};

struct tcp_chunk_hdr {
	uint32_t len;
	uint64_t seq, offset, msglen;
};

void tcp_wire_challenge_encode(const uint8_t nonce[TCP_NONCE_SIZE],
                               uint8_t out[TCP_CHALLENGE_SIZE]);
/* Whether buf is a challenge of this wire version; copies its nonce. */
bool tcp_wire_challenge_decode(const uint8_t buf[TCP_CHALLENGE_SIZE],
                               uint8_t nonce[TCP_NONCE_SIZE]);

/* Writes the hello with its MAC over the acceptor's nonce. */
void tcp_wire_hello_encode(const struct tcp_hello *h, const uint8_t *token, size_t token_len,
                           const uint8_t nonce[TCP_NONCE_SIZE], uint8_t out[TCP_HELLO_SIZE]);
/* Whether the first 4 bytes of a message are the magic (checked as soon as
 * they arrive). */
bool tcp_wire_magic_ok(const uint8_t *buf);
/* Parses len bytes as a hello. Pure: reads buf, writes only *out and why.
 * KOLO_EPROTO, with the reason in why, for a wrong length, magic or wire
 * version. Does not authenticate: see tcp_wire_hello_verify(). */
kolo_status_t tcp_wire_hello_decode(const uint8_t *buf, size_t len, struct tcp_hello *out,
                                    char *why, size_t why_size);
/* Whether a hello's MAC proves token for the acceptor's nonce. */
bool tcp_wire_hello_verify(const uint8_t buf[TCP_HELLO_SIZE], const uint8_t *token,
                           size_t token_len, const uint8_t nonce[TCP_NONCE_SIZE]);
/* Whether an authenticated hello belongs to this endpoint: its job and round,
 * addressed to its rank, from a rank of the round, with a stream in range.
 * Pure. KOLO_EPROTO with the reason in why (printable) when not. */
kolo_status_t tcp_wire_hello_admit(const struct tcp_hello *h, const struct tcp_hello_expect *e,
                                   char *why, size_t why_size);

/* Writes a verdict: st == KOLO_OK accepts (MAC'd with token over both
 * nonces), anything else refuses with reason (cut to fit, NUL-padded). */
void tcp_wire_verdict_encode(kolo_status_t st, const char *reason, const uint8_t *token,
                             size_t token_len, const uint8_t cnonce[TCP_NONCE_SIZE],
                             const uint8_t nonce[TCP_NONCE_SIZE], uint8_t out[TCP_VERDICT_SIZE]);
/* Whether buf starts with the magic; its status and (NUL-terminated)
 * reason. */
bool tcp_wire_verdict_decode(const uint8_t buf[TCP_VERDICT_SIZE], uint32_t *status,
                             char reason[TCP_REASON_SIZE + 1]);
/* Whether an acceptance's MAC proves token for both nonces. */
bool tcp_wire_verdict_verify(const uint8_t buf[TCP_VERDICT_SIZE], const uint8_t *token,
                             size_t token_len, const uint8_t cnonce[TCP_NONCE_SIZE],
                             const uint8_t nonce[TCP_NONCE_SIZE]);

void tcp_wire_chunk_encode(const struct tcp_chunk_hdr *c, uint8_t out[TCP_CHUNK_HDR_SIZE]);
/* false: not a chunk header (bad magic). */
bool tcp_wire_chunk_decode(const uint8_t buf[TCP_CHUNK_HDR_SIZE], struct tcp_chunk_hdr *out);

/* ---- the listen handle and addresses (tcp_addr.c) ----------------------- */

/* Writes the listen handle for a bound address (port set). */
void tcp_handle_encode(const struct sockaddr_storage *ss, struct kolo_transport_handle *h);
/* "1.2.3.4:5" or "[::1]:5". */
void tcp_addr_str(const struct sockaddr_storage *ss, char *out, size_t size);
/* The port of the handle's liveness probe listener; 0: none. */
void tcp_handle_set_probe_port(struct kolo_transport_handle *h, uint16_t port);
uint16_t tcp_handle_probe_port(const struct kolo_transport_handle *h);

/* ---- the liveness probe (tcp_probe.c) ----------------------------------- */

struct tcp_probe_config {
	int period_ms;                       /* one byte per target every period */
	int timeout_ms;                      /* TCP_USER_TIMEOUT: no ack this long is a loss */
	const struct sockaddr_storage *addr; /* the address to listen on (port ignored) */
	socklen_t addrlen;
	int notify_fd; /* an eventfd written when a peer is found lost */
};

struct tcp_probe;

/* Listens and starts the probe's thread. */
kolo_status_t tcp_probe_start(const struct tcp_probe_config *cfg, struct tcp_probe **out,
                              struct kolo_errbuf *eb);
uint16_t tcp_probe_port(const struct tcp_probe *p);
/* Probes rank at addr with the given probe port (once per rank; later calls
 * are ignored, as is port 0). Thread-safe. */
void tcp_probe_watch(struct tcp_probe *p, int rank, const struct sockaddr_storage *addr,
                     socklen_t addrlen, uint16_t port);
/* Whether a loss was found since the last tcp_probe_ack(); lock-free. */
bool tcp_probe_pending(const struct tcp_probe *p);
void tcp_probe_ack(struct tcp_probe *p);
/* Whether rank was found lost. Thread-safe. */
bool tcp_probe_lost(struct tcp_probe *p, int rank);
/* How long rank's probe had waited for an acknowledgement at the last beat
 * (0: nothing waited), -1 when rank is not probed. Thread-safe. */
int tcp_probe_unacked_ms(struct tcp_probe *p, int rank);
/* Stops the thread and closes every probe. Accepts NULL. */
void tcp_probe_stop(struct tcp_probe *p);

/* ---- objects ------------------------------------------------------------ */

#define TCP_MIN_CHUNK (64u << 10)
#define TCP_MAX_CHUNK (64u << 20)
/* Bytes one stream moves per progress call, so one direction or one busy
 * stream cannot starve the others. */
#define TCP_STREAM_BUDGET (8u << 20)
/* Most incoming handshakes in progress at once. */
#define TCP_MAX_PENDING 1024

enum tcp_stream_state {
	TCP_STREAM_EMPTY,          /* acceptor: slot not arrived yet */
	TCP_STREAM_RESERVED,       /* acceptor: authenticated, verdict being written */
	TCP_STREAM_CONNECTING,     /* connector: TCP connect in progress */
	TCP_STREAM_READ_CHALLENGE, /* connector: reading the nonce */
	TCP_STREAM_WRITE_HELLO,    /* connector: writing hello + MAC */
	TCP_STREAM_READ_VERDICT,   /* connector: reading accept/refuse */
	TCP_STREAM_READY,
	TCP_STREAM_DEAD,
};

struct tcp_conn;

struct tcp_req {
	struct tcp_conn *conn;
	struct tcp_req *prev, *next;
	uint8_t *buf;
	size_t len;
	uint64_t seq;
	size_t done;  /* bytes written (send) or received (recv) */
	size_t cut;   /* send: bytes handed to streams */
	int inflight; /* send: chunks being written */
	bool is_send, started, complete;
};

struct tcp_req_list {
	struct tcp_req *head, *tail;
};

/* What an epoll event points at. */
enum tcp_poll_kind {
	TCP_POLL_WAKE,    /* the eventfd abort() and the probe write */
	TCP_POLL_LISTEN,  /* the listening socket */
	TCP_POLL_PENDING, /* an incoming handshake: obj is its tcp_pending */
	TCP_POLL_STREAM,  /* a conn's stream: obj is the tcp_conn */
};

struct tcp_poll_ref {
	enum tcp_poll_kind kind;
	int stream;
	void *obj;
};

struct tcp_stream {
	int fd;
	struct tcp_poll_ref ref;
	uint32_t ev_reg; /* events registered with epoll */
	enum tcp_stream_state state;
	uint8_t hs[TCP_HANDSHAKE_MAX];                          /* handshake bytes */
	uint8_t anonce[TCP_NONCE_SIZE], cnonce[TCP_NONCE_SIZE]; /* the acceptor's and ours */
	size_t hs_off, hs_len;
	/* send: the chunk being written */
	struct tcp_req *sreq;
	uint8_t shdr[TCP_CHUNK_HDR_SIZE];
	const uint8_t *spay;
	size_t slen, ssent; /* ssent counts header + payload */
	/* receive: the header being read, or the chunk being received */
	uint8_t rhdr[TCP_CHUNK_HDR_SIZE];
	size_t rhdr_got;
	bool in_payload, paused;
	struct tcp_chunk_hdr rchunk; /* the header of the chunk being received */
	struct tcp_req *rreq;
	uint8_t *rdst;
	size_t rleft, rlen;
};

struct tcp_transport;

struct tcp_conn {
	struct kolo_conn base;
	struct tcp_transport *t;
	struct tcp_conn *prev, *next;
	bool incoming, accepted;
	int nstreams, nready;
	struct tcp_req_list sendq, recvq, doneq;
	struct tcp_req *cut_req; /* next send request to cut chunks from */
	uint64_t next_send_seq, next_recv_seq;
	uint64_t last_progress_ms;
	kolo_status_t err;
	char errmsg[256];
	char peer_addr[64];
	struct tcp_stream streams[KOLO_TCP_MAX_STREAMS];
};

enum tcp_pending_state {
	TCP_PENDING_WRITE_CHALLENGE,
	TCP_PENDING_READ_HELLO,
	TCP_PENDING_WRITE_VERDICT,
};

/* An incoming connection whose handshake is not done; not a conn yet. */
struct tcp_pending {
	struct tcp_pending *prev, *next;
	int fd;
	struct tcp_poll_ref ref;
	uint32_t ev_reg;
	enum tcp_pending_state state;
	uint8_t nonce[TCP_NONCE_SIZE];
	uint8_t cnonce[TCP_NONCE_SIZE]; /* the connector's, from its hello */
	uint8_t buf[TCP_HANDSHAKE_MAX];
	size_t off, len;
	uint64_t deadline_ms;
	kolo_status_t verdict;
	struct tcp_conn *target; /* accepted: the conn the stream joins */
	int stream;
	uint16_t probe_port; /* the connector's liveness probe listener; 0: none */
	char peer[64];
};

struct tcp_transport {
	struct kolo_transport base;
	char job[TCP_JOB_FIELD]; /* NUL-padded */
	int64_t round;
	int rank, size;
	uint8_t *token;
	size_t token_len;
	int timeout_ms, streams, socket_buffer;
	size_t chunk_bytes;
	int listen_fd, wake_fd;
	atomic_int abort_st;
	struct sockaddr_storage addr;
	socklen_t addrlen;
	char addr_str[64];
	struct tcp_conn *conns;
	struct tcp_pending *pendings;
	int npending;
	struct tcp_req *free_reqs;
	int epfd;
	struct tcp_poll_ref wake_ref, listen_ref;
	uint64_t last_sweep_ms;
	int probe_ms, probe_timeout_ms;
	bool quiet_peer_close;
	struct tcp_probe *probe; /* NULL: no liveness probe */
	char lost_msg[256];      /* set with the abort that a lost peer caused */
};

static inline struct tcp_transport *tcp_transport_of(struct kolo_transport *kt)
{
	return kolo_container_of(kt, struct tcp_transport, base);
}

static inline struct tcp_conn *tcp_conn_of(struct kolo_conn *kc)
{
	return kolo_container_of(kc, struct tcp_conn, base);
}

/* ---- conns and requests (tcp_conn.c) ------------------------------------ */

/* The endpoint's conns and handshakes are lists linked through prev/next
 * with only a head: push at the front, unlink from anywhere. */
#define TCP_LIST_PUSH(head, node)                                                                  \
	do {                                                                                       \
		(node)->prev = NULL;                                                               \
		(node)->next = (head);                                                             \
		if (head)                                                                          \
			(head)->prev = (node);                                                     \
		(head) = (node);                                                                   \
	} while (0)
#define TCP_LIST_UNLINK(head, node)                                                                \
	do {                                                                                       \
		if ((node)->prev)                                                                  \
			(node)->prev->next = (node)->next;                                         \
		else                                                                               \
			(head) = (node)->next;                                                     \
		if ((node)->next)                                                                  \
			(node)->next->prev = (node)->prev;                                         \
	} while (0)

void tcp_req_list_append(struct tcp_req_list *l, struct tcp_req *r);
void tcp_req_list_remove(struct tcp_req_list *l, struct tcp_req *r);
/* A zeroed request from the endpoint's free list (NULL: out of memory). */
struct tcp_req *tcp_req_get(struct tcp_transport *t);
void tcp_req_put(struct tcp_transport *t, struct tcp_req *r);
/* Moves r from its queue to the conn's done queue. */
void tcp_req_complete(struct tcp_conn *c, struct tcp_req *r);

/* A conn with nstreams empty streams, on t's list (NULL: out of memory). */
struct tcp_conn *tcp_conn_new(struct tcp_transport *t, int peer_rank, int tag, int nstreams);
/* Resets its sockets, releases its requests and frees it. */
void tcp_conn_free(struct tcp_transport *t, struct tcp_conn *c);
/* Marks the conn failed (first failure wins) and resets its sockets so the
 * peer fails fast too. Requests fail when tested. */
void tcp_conn_fail(struct tcp_conn *c, kolo_status_t st, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));
/* Records progress: the no-progress timer restarts. */
void tcp_conn_touch(struct tcp_conn *c);
/* Whether the conn has requests pending (only those can time out). */
bool tcp_conn_busy(const struct tcp_conn *c);
/* n <= 0 from a socket call: true means stop (EAGAIN or the conn failed),
 * false means retry (EINTR). */
bool tcp_conn_io_stop(struct tcp_conn *c, ssize_t n, bool reading);

/* Closes fd with a reset (SO_LINGER 0), after taking it out of the epoll
 * set. Accepts -1. */
void tcp_fd_reset_close(struct tcp_transport *t, int fd);
/* Registers (EPOLL_CTL_ADD) or updates (EPOLL_CTL_MOD) fd's interest. */
bool tcp_fd_poll_set(struct tcp_transport *t, int op, int fd, struct tcp_poll_ref *ref,
                     uint32_t *ev_reg, uint32_t ev);
/* TCP_NODELAY, keepalive, TCP_USER_TIMEOUT and the socket buffers. */
void tcp_fd_set_options(const struct tcp_transport *t, int fd);

/* ---- the connector (tcp_connector.c) ------------------------------------ */

/* Starts stream idx of an outgoing conn: a non-blocking connect to addr.
 * Fails the conn when the connect fails at once. */
kolo_status_t tcp_connector_start(struct tcp_conn *c, int idx, const struct sockaddr_storage *addr,
                                  socklen_t addrlen);
/* Moves a connecting stream's handshake on as far as its socket allows.
 * revents: from poll, or 0 when called blindly. */
void tcp_connector_step(struct tcp_conn *c, struct tcp_stream *s, short revents);

/* ---- the acceptor (tcp_acceptor.c) -------------------------------------- */

/* Accepts every waiting connection and starts its handshake. */
void tcp_acceptor_accept(struct tcp_transport *t);
/* Moves an incoming handshake on as far as its socket allows. */
void tcp_acceptor_step(struct tcp_transport *t, struct tcp_pending *p);
/* Drops the handshake: if it had been accepted, its conn fails. */
void tcp_acceptor_drop(struct tcp_transport *t, struct tcp_pending *p, const char *why);
/* Closes and frees a handshake. */
void tcp_pending_free(struct tcp_transport *t, struct tcp_pending *p);

/* ---- the data path (tcp_stream.c) --------------------------------------- */

/* Whether a ready stream has something to write, or wants to read. */
bool tcp_stream_want_send(const struct tcp_conn *c, const struct tcp_stream *s);
bool tcp_stream_want_recv(const struct tcp_conn *c, const struct tcp_stream *s);
/* Writes chunks / reads chunks, up to TCP_STREAM_BUDGET bytes. */
void tcp_stream_send(struct tcp_conn *c, struct tcp_stream *s);
void tcp_stream_recv(struct tcp_conn *c, struct tcp_stream *s);
/* Points a paused stream at the receive just posted for its chunk. */
bool tcp_stream_bind_chunk(struct tcp_conn *c, struct tcp_stream *s);

/* ---- the poll loop (tcp_poll.c) ----------------------------------------- */

/* One stream's progress: handshake or data. revents: from poll, or 0. */
void tcp_stream_progress(struct tcp_conn *c, struct tcp_stream *s, short revents);
void tcp_conn_progress(struct tcp_conn *c);
/* Waits up to timeout_ms (or the next deadline) and progresses whatever is
 * ready; then sweeps deadlines and the probe's losses. */
void tcp_poll_progress(struct tcp_transport *t, int timeout_ms);
/* Fails the conns to every peer the probe lost, and the endpoint. */
void tcp_poll_fail_lost(struct tcp_transport *t);

/* ---- the ops (transport_tcp.c) ------------------------------------------ */

void tcp_transport_abort(struct kolo_transport *kt, kolo_status_t st);
/* Whether peer is this host: a loopback address or the one t listens on. */
bool tcp_transport_same_host(const struct tcp_transport *t, const struct sockaddr_storage *peer);

#endif /* KOLO_TCP_INTERNAL_H */
