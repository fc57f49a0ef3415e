/* What the files of transport_verbs/ share, and only they. The public name
 * is kolo_transport_verbs_ops (transport_verbs.h); every name here is vb_*
 * (verbs_api for the table), and file-static helpers carry no prefix. The
 * files, one job each:
 *   verbs_loader.c  the table of libibverbs entry points (dlopen/dlsym)
 *   verbs_emu.c     the in-process emulation that can replace the table
 *   verbs_dev.c     device and port choice, memlock check, the MR cache
 *   verbs_qp.c      a conn's QP and registered area, INIT→RTR→RTS
 *   verbs_conn.c    listen, connect, accept: the handshake over the CM socket
 *   verbs_stream.c  the data path: slots, credits, in-place writes, the CQ
 *   verbs.c         create/destroy, wait/abort/poll_fd and the ops table
 * docs/transport.md ("Verbs") describes the wire protocol. */
#ifndef KOLO_VERBS_INTERNAL_H
#define KOLO_VERBS_INTERNAL_H

#include <infiniband/verbs.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "transport.h"
#include "transport_verbs.h"

#define VB_SUBSYS     "verbs"
#define VB_JOB_MAX    128
#define VB_MAX_SLOTS  128        /* the immediate has 7 bits for the slot */
#define VB_MAX_SEG    (1u << 21) /* and 22 bits for the length */
#define VB_CTRL_BYTES 64
#define VB_CQ_DEPTH   16384
#define VB_WRITE_MAX  (1u << 30) /* an in-place message is cut into writes of this */

/* ---- the table of entry points (verbs_loader.c, verbs_emu.c) ----
 * Only what the transport uses. The entries that verbs.h implements as
 * static inline calls through ctx->ops (post_send, post_recv, poll_cq,
 * req_notify_cq, query_port) are small wrappers in verbs_loader.c. */
struct verbs_api {
	const char *name; /* "libibverbs.so.1" or "emulation" */
	bool emulated;
	struct ibv_device **(*get_device_list)(int *num);
	void (*free_device_list)(struct ibv_device **list);
	const char *(*get_device_name)(struct ibv_device *dev);
	struct ibv_context *(*open_device)(struct ibv_device *dev);
	int (*close_device)(struct ibv_context *ctx);
	int (*query_device)(struct ibv_context *ctx, struct ibv_device_attr *attr);
	int (*query_port)(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr);
	int (*query_gid)(struct ibv_context *ctx, uint8_t port, int index, union ibv_gid *gid);
	struct ibv_pd *(*alloc_pd)(struct ibv_context *ctx);
	int (*dealloc_pd)(struct ibv_pd *pd);
	struct ibv_mr *(*reg_mr)(struct ibv_pd *pd, void *addr, size_t len, int access);
	int (*dereg_mr)(struct ibv_mr *mr);
	struct ibv_comp_channel *(*create_comp_channel)(struct ibv_context *ctx);
	int (*destroy_comp_channel)(struct ibv_comp_channel *ch);
	struct ibv_cq *(*create_cq)(struct ibv_context *ctx, int cqe, void *cq_ctx,
	                            struct ibv_comp_channel *ch, int vector);
	int (*destroy_cq)(struct ibv_cq *cq);
	int (*req_notify_cq)(struct ibv_cq *cq, int solicited_only);
	int (*get_cq_event)(struct ibv_comp_channel *ch, struct ibv_cq **cq, void **cq_ctx);
	void (*ack_cq_events)(struct ibv_cq *cq, unsigned int n);
	int (*poll_cq)(struct ibv_cq *cq, int n, struct ibv_wc *wc);
	struct ibv_qp *(*create_qp)(struct ibv_pd *pd, struct ibv_qp_init_attr *attr);
	int (*modify_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask);
	int (*destroy_qp)(struct ibv_qp *qp);
	int (*post_send)(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad);
	int (*post_recv)(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);
	const char *(*wc_status_str)(enum ibv_wc_status st);
	/* Longest a wait may block on the completion channel (0: no limit). The
	 * emulation cannot wake a process from another one, so it slices. */
	int (*block_cap_ms)(void);
};

/* The table in use: the emulation once kolo_verbs_emu_enable() ran, else
 * libibverbs, loaded on first use. NULL with the reason in eb when the
 * library cannot be loaded. Thread-safe. */
const struct verbs_api *verbs_api_get(struct kolo_errbuf *eb);
/* Makes api the table verbs_api_get returns (the emulation, verbs_emu.c). */
void vb_loader_use(const struct verbs_api *api);

/* ---- the immediate: type, slot, length (docs/transport.md) ---- */
enum vb_imm_type {
	VB_IMM_DATA = 0,      /* a segment of an eager message, more follow */
	VB_IMM_DATA_LAST = 1, /* the last (or only) segment of an eager message */
	VB_IMM_RTS = 2,       /* a slot holding the length of an in-place message */
	VB_IMM_CREDIT = 3,    /* length field: slots the receiver freed */
	VB_IMM_RTR = 4,       /* the ctrl area holds where the in-place message goes */
	VB_IMM_DONE = 5,      /* the in-place message is in the receiver's buffer */
};

static inline uint32_t vb_imm(enum vb_imm_type t, uint32_t slot, uint32_t len)
{
	return (uint32_t)t << 29 | (slot & 0x7fu) << 22 | (len & 0x3fffffu);
}

/* ---- objects ---- */

/* What each side tells the other about its QP and registered area. */
struct vb_qpinfo {
	uint32_t qpn, psn;
	uint64_t area_addr; /* slots, then the ctrl area */
	uint32_t rkey;
	uint32_t nslots;
	uint32_t slot_bytes;
	uint16_t lid;
	uint8_t pad[2];
	uint8_t gid[16];
};

struct vb_hello {
	uint32_t magic;
	uint32_t version;
	char job[VB_JOB_MAX];
	int64_t round;
	int32_t src_rank, dst_rank, tag;
	struct vb_qpinfo qp;
	uint8_t mac[KOLO_HMAC_SIZE];
};

enum vb_conn_state {
	VB_CS_CONNECTOR_WAIT_NONCE,
	VB_CS_CONNECTOR_WAIT_VERDICT,
	VB_CS_ACCEPTOR_WAIT_HELLO,
	VB_CS_ACCEPTOR_WAIT_READY, /* QP at RTS; the connector's QP may not be yet */
	VB_CS_READY,
	VB_CS_FAILED
};

struct vb_mr_entry;

enum vb_phase { VB_PH_EAGER, VB_PH_RTS_SENT, VB_PH_WRITING, VB_PH_RDV_WAIT };

struct kolo_req {
	struct vb_conn *c;
	bool send, done;
	enum vb_phase phase;
	uint8_t *buf;
	size_t len, moved;
	bool zero_sent;
	struct vb_mr_entry *mr; /* in-place messages: the registered user buffer */
	struct kolo_req *prev, *next;
};

struct vb_req_list {
	struct kolo_req *first, *last;
};

struct vb_arrival {
	uint8_t type, slot;
	uint32_t len;
};

struct vb_conn {
	struct kolo_conn base;
	struct vb_transport *t;
	uint64_t id; /* in every wr_id, so completions of a closed conn are ignored */
	int fd;      /* the CM socket: handshake, then a dead peer's EOF */
	enum vb_conn_state state;
	bool claimed, acceptor, peer_closed;
	bool stale_handle; /* the peer's handle is of another round */
	int64_t handle_round;
	kolo_status_t failed;
	uint8_t hs[sizeof(struct vb_hello)];
	size_t hs_len;
	uint8_t nonce[32];
	/* QP and registered area (verbs_qp.c): recv slots, send staging, ctrl
	 * rx, ctrl tx. */
	struct ibv_qp *qp;
	uint32_t psn;
	uint8_t *area;
	size_t area_len;
	struct ibv_mr *mr;
	struct vb_qpinfo peer;
	/* send side */
	int credits;
	uint32_t next_tx_slot;
	bool tx_busy[VB_MAX_SLOTS]; /* staging slot awaits its send completion */
	int sq_out, sq_depth;
	bool rtr_arrived;
	uint64_t rtr_addr, rtr_len;
	uint32_t rtr_rkey;
	/* receive side */
	struct vb_arrival arr[2 * VB_MAX_SLOTS + 8];
	unsigned arr_head, arr_count;
	int freed; /* slots consumed, not yet returned */
	struct vb_req_list sends, recvs;
	uint64_t last_progress_ns, created_ns;
	struct vb_conn *next_conn;
};

struct vb_mr_entry {
	uintptr_t addr;
	size_t len;
	int access;
	struct ibv_mr *mr;
	int refs;
	uint64_t used;
	struct vb_mr_entry *next;
};

struct vb_transport {
	struct kolo_transport base;
	const struct verbs_api *api;
	char job[VB_JOB_MAX];
	int64_t round;
	int rank;
	uint8_t *token;
	size_t token_len;
	int timeout_ms;
	char iface[64];
	char route_to[256];
	/* device (verbs_dev.c) */
	char dev_name[64];
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_comp_channel *ch;
	struct ibv_cq *cq;
	uint8_t port;
	int gid_index;
	bool roce;
	uint16_t lid;
	union ibv_gid gid;
	enum ibv_mtu mtu;
	unsigned cq_events; /* received, not yet acknowledged */
	/* protocol sizes */
	int nslots;
	uint32_t slot_bytes;
	size_t rdv_bytes;
	/* registration cache */
	struct vb_mr_entry *mrs;
	int mr_cap, mr_count;
	uint64_t mr_clock;
	/* CM socket and waiting */
	int listen_fd, epfd, abort_fd;
	_Atomic int abort_status;
	uint64_t next_id;
	struct vb_conn *conns;
};

static inline struct vb_transport *vb_tr(struct kolo_transport *t)
{
	return kolo_container_of(t, struct vb_transport, base);
}

static inline struct vb_conn *vb_cn(struct kolo_conn *c)
{
	return kolo_container_of(c, struct vb_conn, base);
}

/* Slot s of the peer's messages / of this side's send staging, and the two
 * ctrl areas, in c's registered area (verbs_qp.c lays it out). */
static inline uint8_t *vb_rx_slot(struct vb_conn *c, uint32_t s)
{
	return c->area + (size_t)s * c->t->slot_bytes;
}

static inline uint8_t *vb_tx_slot(struct vb_conn *c, uint32_t s)
{
	return c->area + (size_t)(c->t->nslots + (int)s) * c->t->slot_bytes;
}

static inline uint8_t *vb_ctrl_rx(struct vb_conn *c)
{
	return c->area + 2 * (size_t)c->t->nslots * c->t->slot_bytes;
}

static inline uint8_t *vb_ctrl_tx(struct vb_conn *c)
{
	return vb_ctrl_rx(c) + VB_CTRL_BYTES;
}

/* ---- device (verbs_dev.c) ---- */

/* Opens the device and port cfg picks, its PD, completion channel and CQ. */
kolo_status_t vb_dev_open(struct vb_transport *t, const struct kolo_transport_config *cfg,
                          struct kolo_errbuf *eb);
void vb_dev_close(struct vb_transport *t);
/* Logs a loud warning when RLIMIT_MEMLOCK is below what `need` bytes take. */
void vb_memlock_check(const struct vb_transport *t, size_t need);
/* A registration covering [buf, buf+len) with at least `access`, from the
 * cache or new; NULL with the reason in t->base.err. vb_mr_put releases it
 * (the cache keeps up to mr_cap unused ones, least recently used first out). */
struct vb_mr_entry *vb_mr_get(struct vb_transport *t, void *buf, size_t len, int access);
void vb_mr_put(struct vb_transport *t, struct vb_mr_entry *e);
void vb_mr_clear(struct vb_transport *t);

/* ---- QP (verbs_qp.c) ---- */

/* Creates the conn's QP (taken to INIT), registers its area and posts its
 * receives; fills `mine` with what the peer needs. */
kolo_status_t vb_qp_setup(struct vb_conn *c, struct vb_qpinfo *mine);
/* INIT→RTR→RTS towards the peer c->peer describes. */
kolo_status_t vb_qp_connect(struct vb_conn *c);
void vb_qp_teardown(struct vb_conn *c);
/* Posts one receive (write-with-immediate consumes one). */
int vb_qp_post_recv(struct vb_conn *c);

/* ---- CM socket and handshake (verbs_conn.c) ---- */

void vb_accept_new(struct vb_transport *t);
void vb_acceptor_step(struct vb_conn *c);
void vb_connector_step(struct vb_conn *c);
kolo_status_t vb_listen(struct kolo_transport *base, struct kolo_transport_handle *out);
kolo_status_t vb_connect(struct kolo_transport *base, const struct kolo_transport_handle *peer,
                         int peer_rank, int tag, struct kolo_conn **out);
kolo_status_t vb_accept(struct kolo_transport *base, int peer_rank, int tag,
                        struct kolo_conn **out);

/* ---- conns and the data path (verbs_stream.c) ---- */

void vb_conn_fail(struct vb_conn *c, kolo_status_t st, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));
kolo_status_t vb_conn_add(struct vb_transport *t, int fd, bool acceptor, int peer, int tag,
                          struct vb_conn **out);
void vb_conn_free(struct vb_conn *c);
void vb_conn_drain(struct vb_conn *c);
/* One pass: handshakes, the CQ, data, deadlines. true when anything moved. */
bool vb_progress(struct vb_transport *t);
/* Polls the CQ and dispatches every completion. true when any arrived. */
bool vb_poll_cq(struct vb_transport *t);

kolo_status_t vb_isend(struct kolo_conn *c, const void *buf, size_t len, struct kolo_req **out);
kolo_status_t vb_irecv(struct kolo_conn *c, void *buf, size_t len, struct kolo_req **out);
kolo_status_t vb_test(struct kolo_req *r, bool *done);
void vb_close(struct kolo_conn *base);

#endif /* KOLO_VERBS_INTERNAL_H */
