/* p2p internals: the operations, the per-peer state and the two halves of
 * the thread's work (p2p_send.c, p2p_recv.c). Everything but the submission
 * queue and the status belongs to the p2p thread. */
#ifndef KOLO_P2P_INTERNAL_H
#define KOLO_P2P_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "p2p.h"

#define P2P_MAGIC 0x6b703270u /* "kp2p" */
#define SUBSYS    "p2p"

struct p2p_op {
	struct p2p_op *next;
	bool is_send;
	int peer; /* dst; src or KOLO_P2P_ANY_SOURCE */
	int tag;
	void *buf;
	size_t len;
	int *source;
	kolo_callback_fn cb;
	void *cb_arg;
	kolo_handle_t *h;
	uint64_t deadline_ms; /* sends: the peer's address; recvs: a message */
	uint64_t hdr[2];      /* sends: the header on the wire */
	struct kolo_req *req_hdr, *req_body;
	bool posted;
};

/* A message that arrived before any recv asked for it. */
struct p2p_msg {
	struct p2p_msg *next;
	int src, tag;
	size_t len;
	void *data;
	bool complete;
	struct p2p_op *claimed; /* a recv waiting for the rest of it */
};

struct p2p_peer {
	/* sending to the peer: conn (once its address is known), the sends in
	 * the order queued, the next look-up of its address */
	struct kolo_conn *out;
	struct p2p_op *sends, *sends_tail;
	uint64_t next_lookup_ms;
	int backoff_ms;
	/* receiving from it: conn, the header being read, then where the
	 * payload goes (a recv's buffer or an unexpected message) */
	struct kolo_conn *in;
	uint64_t hdr[2];
	struct kolo_req *req_hdr, *req_body;
	struct p2p_op *rx_op;
	struct p2p_msg *rx_msg;
	uint64_t rx_since_ms;
};

struct kolo_p2p {
	struct kolo_p2p_config cfg;
	struct kolo_transport *t;
	pthread_t thread;
	bool started;
	int wake_fd;
	/* shared with the callers, under lock */
	pthread_mutex_t lock;
	struct p2p_op *queue, *queue_tail;
	bool stop;
	atomic_int status;
	char msg[KOLO_ERRBUF_SIZE];
	/* the thread's */
	struct p2p_peer *peers;
	struct p2p_op *recvs, *recvs_tail; /* posted, not matched yet */
	struct p2p_msg *unexpected, *unexpected_tail;
	uint64_t next_health_ms;
};

/* Finishes op: *source, the callback, the handle; frees it. */
void p2p_op_finish(struct p2p_op *op, kolo_status_t st, const char *msg);
/* Fails p (first failure wins) and every operation it holds. */
void p2p_fail(struct kolo_p2p *p, kolo_status_t st, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));
kolo_status_t p2p_status(struct kolo_p2p *p);

/* p2p_send.c: a queued send; progress of every peer's sends (true when
 * something moved). */
void p2p_send_queue(struct kolo_p2p *p, struct p2p_op *op);
bool p2p_send_progress(struct kolo_p2p *p, uint64_t now);
/* p2p_recv.c: a posted recv; accepting, headers, payloads, deadlines. */
void p2p_recv_post(struct kolo_p2p *p, struct p2p_op *op);
bool p2p_recv_progress(struct kolo_p2p *p, uint64_t now);
/* Fails and frees everything the thread holds (after p2p_fail). */
void p2p_drop_all(struct kolo_p2p *p, kolo_status_t st, const char *msg);
/* The earliest deadline of the thread's operations (UINT64_MAX: none). */
uint64_t p2p_next_deadline(const struct kolo_p2p *p);

#endif /* KOLO_P2P_INTERNAL_H */
