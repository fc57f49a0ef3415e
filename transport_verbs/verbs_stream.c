/* verbs_stream: conns and requests, the data path (eager messages through
 * slots with credits, large ones written in place after an RTS/RTR
 * exchange), the completion queue, and the progress pass. */
#include "verbs_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

/* wr_id = conn id << 8 | kind. */
enum {
	WR_SLOT_MAX = VB_MAX_SLOTS - 1, /* 0..127: a write from that staging slot */
	WR_CREDIT = 0x80,
	WR_RTR = 0x81,
	WR_RDV = 0x82,
	WR_RDV_LAST = 0x83,
	WR_RECV = 0xff,
};

/* What an RTR writes into the sender's ctrl area. */
struct rtr_msg {
	uint64_t addr, len;
	uint32_t rkey, pad;
};

/* ---- lists ---- */

static void list_push(struct vb_req_list *l, struct kolo_req *r)
{
	r->prev = l->last;
	r->next = NULL;
	if (l->last)
		l->last->next = r;
	else
		l->first = r;
	l->last = r;
}

static void list_unlink(struct vb_req_list *l, struct kolo_req *r)
{
	if (r->prev)
		r->prev->next = r->next;
	else
		l->first = r->next;
	if (r->next)
		r->next->prev = r->prev;
	else
		l->last = r->prev;
}

static void list_free(struct vb_transport *t, struct vb_req_list *l)
{
	struct kolo_req *r = l->first;
	while (r) {
		struct kolo_req *n = r->next;
		vb_mr_put(t, r->mr);
		free(r);
		r = n;
	}
	l->first = l->last = NULL;
}

/* ---- conns ---- */

void vb_conn_fail(struct vb_conn *c, kolo_status_t st, const char *fmt, ...)
{
	if (c->state == VB_CS_FAILED)
		return;
	char msg[KOLO_ERRBUF_SIZE];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	c->state = VB_CS_FAILED;
	c->failed = st;
	kolo_fail(&c->t->base.err, st, "verbs conn to rank %d (tag %d): %s", c->base.peer_rank,
	          c->base.tag, msg);
	KOLO_DEBUG(VB_SUBSYS, "%s", c->t->base.err.msg);
	/* The peer learns at once through the CM socket; its QP alone would
	 * only notice when it next writes. */
	if (c->fd >= 0)
		shutdown(c->fd, SHUT_RDWR);
}

kolo_status_t vb_conn_add(struct vb_transport *t, int fd, bool acceptor, int peer, int tag,
                          struct vb_conn **out)
{
	struct vb_conn *c = calloc(1, sizeof(*c));
	if (!c)
		return KOLO_ENOMEM;
	c->base.transport = &t->base;
	c->base.peer_rank = peer;
	c->base.tag = tag;
	c->t = t;
	c->fd = fd;
	c->id = ++t->next_id;
	c->acceptor = acceptor;
	c->state = acceptor ? VB_CS_ACCEPTOR_WAIT_HELLO : VB_CS_CONNECTOR_WAIT_NONCE;
	c->created_ns = c->last_progress_ns = kolo_now_ns();
	struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.ptr = c};
	if (epoll_ctl(t->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
		free(c);
		return KOLO_ESYSTEM;
	}
	c->next_conn = t->conns;
	t->conns = c;
	*out = c;
	return KOLO_OK;
}

void vb_conn_free(struct vb_conn *c)
{
	if (c->fd >= 0) {
		epoll_ctl(c->t->epfd, EPOLL_CTL_DEL, c->fd, NULL);
		close(c->fd);
	}
	vb_qp_teardown(c);
	list_free(c->t, &c->sends);
	list_free(c->t, &c->recvs);
	free(c);
}

static void conn_unlink(struct vb_transport *t, struct vb_conn *c)
{
	for (struct vb_conn **p = &t->conns; *p; p = &(*p)->next_conn)
		if (*p == c) {
			*p = c->next_conn;
			return;
		}
}

void vb_conn_drain(struct vb_conn *c)
{
	char buf[64];
	for (;;) {
		ssize_t n = recv(c->fd, buf, sizeof(buf), MSG_DONTWAIT);
		if (n > 0 || (n < 0 && errno == EINTR))
			continue;
		if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
			c->peer_closed = true;
			epoll_ctl(c->t->epfd, EPOLL_CTL_DEL, c->fd, NULL);
		}
		return;
	}
}

/* ---- posting ---- */

static int post_write(struct vb_conn *c, uint64_t wr_id, const void *src, uint32_t lkey, size_t len,
                      uint64_t raddr, uint32_t rkey, bool with_imm, uint32_t imm)
{
	struct ibv_sge sge = {
	        .addr = (uint64_t)(uintptr_t)src, .length = (uint32_t)len, .lkey = lkey};
	struct ibv_send_wr wr = {
	        .wr_id = c->id << 8 | wr_id,
	        .sg_list = len ? &sge : NULL,
	        .num_sge = len ? 1 : 0,
	        .opcode = with_imm ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE,
	        .send_flags = IBV_SEND_SIGNALED,
	        .imm_data = htonl(imm),
	        .wr.rdma = {.remote_addr = raddr, .rkey = rkey},
	};
	struct ibv_send_wr *bad = NULL;
	int rc = c->t->api->post_send(c->qp, &wr, &bad);
	if (rc == 0)
		c->sq_out++;
	else
		vb_conn_fail(c, KOLO_EPEER, "post_send failed: %s", strerror(rc));
	return rc;
}

static uint64_t peer_slot(const struct vb_conn *c, uint32_t s)
{
	return c->peer.area_addr + (uint64_t)s * c->peer.slot_bytes;
}

static uint64_t peer_ctrl(const struct vb_conn *c)
{
	return c->peer.area_addr + 2ull * c->peer.nslots * c->peer.slot_bytes;
}

/* A free staging slot with a credit, and room in the send queue. */
static bool can_use_slot(const struct vb_conn *c)
{
	return c->credits > 0 && !c->tx_busy[c->next_tx_slot] && c->sq_out < c->sq_depth - 2;
}

/* Writes `len` bytes from src into the peer's next slot. */
static bool slot_write(struct vb_conn *c, enum vb_imm_type type, const void *src, size_t len)
{
	uint32_t s = c->next_tx_slot;
	if (len)
		memcpy(vb_tx_slot(c, s), src, len);
	if (post_write(c, s, vb_tx_slot(c, s), c->mr->lkey, len, peer_slot(c, s), c->peer.rkey,
	               true, vb_imm(type, s, (uint32_t)len)) != 0)
		return false;
	c->tx_busy[s] = true;
	c->credits--;
	c->next_tx_slot = (s + 1) % (uint32_t)c->t->nslots;
	return true;
}

static bool send_progress(struct vb_conn *c)
{
	struct vb_transport *t = c->t;
	bool moved = false;
	for (struct kolo_req *r = c->sends.first; r && c->state == VB_CS_READY; r = r->next) {
		if (r->done)
			continue;
		if (r->len >= t->rdv_bytes && r->len > 0) {
			if (r->phase == VB_PH_EAGER) {
				if (!can_use_slot(c))
					break;
				uint64_t len = r->len;
				if (!slot_write(c, VB_IMM_RTS, &len, sizeof(len)))
					break;
				r->phase = VB_PH_RTS_SENT;
				moved = true;
			}
			if (r->phase == VB_PH_RTS_SENT) {
				if (!c->rtr_arrived)
					break;
				c->rtr_arrived = false;
				if (c->rtr_len != r->len) {
					vb_conn_fail(
					        c, KOLO_EPROTO,
					        "length mismatch: sending %zu bytes, the receive "
					        "has %llu",
					        r->len, (unsigned long long)c->rtr_len);
					break;
				}
				r->mr = vb_mr_get(t, r->buf, r->len, 0);
				if (!r->mr) {
					vb_conn_fail(c, KOLO_ESYSTEM, "%s", t->base.err.msg);
					break;
				}
				r->phase = VB_PH_WRITING;
				r->moved = 0;
			}
			/* The whole message straight into the receiver's buffer;
			 * the last write's immediate tells it so. */
			while (r->phase == VB_PH_WRITING && r->moved < r->len &&
			       c->sq_out < c->sq_depth) {
				size_t n = KOLO_MIN(r->len - r->moved, (size_t)VB_WRITE_MAX);
				bool last = r->moved + n == r->len;
				if (post_write(c, last ? WR_RDV_LAST : WR_RDV, r->buf + r->moved,
				               r->mr->mr->lkey, n, c->rtr_addr + r->moved,
				               c->rtr_rkey, last, vb_imm(VB_IMM_DONE, 0, 0)) != 0)
					return moved;
				r->moved += n;
				moved = true;
			}
			break; /* done when the last write completes (poll_cq) */
		}
		while (!r->done && can_use_slot(c)) {
			size_t n = KOLO_MIN(r->len - r->moved, (size_t)t->slot_bytes);
			bool last = r->moved + n == r->len;
			if (!slot_write(c, last ? VB_IMM_DATA_LAST : VB_IMM_DATA, r->buf + r->moved,
			                n))
				return moved;
			r->moved += n;
			r->done = last; /* copied out: the caller's buffer is free */
			moved = true;
		}
		if (!r->done)
			break;
	}
	return moved;
}

static void return_credits(struct vb_conn *c, bool force)
{
	int batch = KOLO_MAX(c->t->nslots / 2, 1);
	if (c->state != VB_CS_READY || c->freed == 0 || (!force && c->freed < batch) ||
	    c->sq_out >= c->sq_depth)
		return;
	if (post_write(c, WR_CREDIT, NULL, 0, 0, peer_slot(c, 0), c->peer.rkey, true,
	               vb_imm(VB_IMM_CREDIT, 0, (uint32_t)c->freed)) == 0)
		c->freed = 0;
}

static void arr_pop(struct vb_conn *c)
{
	c->arr_head = (c->arr_head + 1) % KOLO_ARRAY_SIZE(c->arr);
	c->arr_count--;
}

static bool recv_progress(struct vb_conn *c)
{
	struct vb_transport *t = c->t;
	bool moved = false;
	for (struct kolo_req *r = c->recvs.first; r && c->state != VB_CS_FAILED; r = r->next) {
		if (r->done)
			continue;
		while (!r->done && c->arr_count > 0 && c->state != VB_CS_FAILED) {
			struct vb_arrival a = c->arr[c->arr_head];
			if (r->phase == VB_PH_RDV_WAIT) {
				if (a.type != VB_IMM_DONE) {
					vb_conn_fail(c, KOLO_EPROTO,
					             "expected the end of an in-place "
					             "message");
					break;
				}
				arr_pop(c);
				vb_mr_put(t, r->mr);
				r->mr = NULL;
				r->done = true;
				moved = true;
				break;
			}
			if (a.type == VB_IMM_RTS) {
				uint64_t len;
				memcpy(&len, vb_rx_slot(c, a.slot), sizeof(len));
				if (len != r->len) {
					vb_conn_fail(c, KOLO_EPROTO,
					             "length mismatch: %llu bytes sent, the "
					             "receive has %zu",
					             (unsigned long long)len, r->len);
					break;
				}
				if (c->sq_out >= c->sq_depth)
					return moved; /* the RTR waits for room */
				r->mr = vb_mr_get(t, r->buf, r->len,
				                  IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
				if (!r->mr) {
					vb_conn_fail(c, KOLO_ESYSTEM, "%s", t->base.err.msg);
					break;
				}
				struct rtr_msg m = {.addr = (uint64_t)(uintptr_t)r->buf,
				                    .len = r->len,
				                    .rkey = r->mr->mr->rkey};
				memcpy(vb_ctrl_tx(c), &m, sizeof(m));
				arr_pop(c);
				c->freed++;
				if (post_write(c, WR_RTR, vb_ctrl_tx(c), c->mr->lkey, sizeof(m),
				               peer_ctrl(c), c->peer.rkey, true,
				               vb_imm(VB_IMM_RTR, 0, sizeof(m))) != 0)
					break;
				r->phase = VB_PH_RDV_WAIT;
				moved = true;
				continue;
			}
			if (a.type != VB_IMM_DATA && a.type != VB_IMM_DATA_LAST) {
				vb_conn_fail(c, KOLO_EPROTO, "unexpected message type %u", a.type);
				break;
			}
			if (a.len > r->len - r->moved ||
			    (a.type == VB_IMM_DATA && a.len == r->len - r->moved) ||
			    (a.type == VB_IMM_DATA_LAST && a.len != r->len - r->moved)) {
				vb_conn_fail(
				        c, KOLO_EPROTO,
				        "length mismatch: the message does not fit the %zu-byte "
				        "receive",
				        r->len);
				break;
			}
			if (a.len)
				memcpy(r->buf + r->moved, vb_rx_slot(c, a.slot), a.len);
			r->moved += a.len;
			arr_pop(c);
			c->freed++;
			r->done = a.type == VB_IMM_DATA_LAST;
			moved = true;
		}
		if (!r->done)
			break;
	}
	return_credits(c, false);
	return moved;
}

static bool conn_pending(const struct vb_conn *c)
{
	for (struct kolo_req *r = c->sends.first; r; r = r->next)
		if (!r->done)
			return true;
	for (struct kolo_req *r = c->recvs.first; r; r = r->next)
		if (!r->done)
			return true;
	return false;
}

static bool conn_progress(struct vb_conn *c)
{
	if (c->state != VB_CS_READY)
		return false;
	bool moved = recv_progress(c);
	moved |= send_progress(c);
	if (moved)
		c->last_progress_ns = kolo_now_ns();
	if (c->peer_closed && conn_pending(c) && c->state == VB_CS_READY)
		vb_conn_fail(c, KOLO_EPEER, "peer closed the connection");
	return moved;
}

/* ---- the completion queue ---- */

static struct vb_conn *conn_by_id(struct vb_transport *t, uint64_t id)
{
	for (struct vb_conn *c = t->conns; c; c = c->next_conn)
		if (c->id == id)
			return c;
	return NULL;
}

static void on_recv(struct vb_conn *c, const struct ibv_wc *wc)
{
	if (vb_qp_post_recv(c) != 0) {
		vb_conn_fail(c, KOLO_EPEER, "post_recv failed");
		return;
	}
	uint32_t imm = ntohl(wc->imm_data);
	uint32_t type = imm >> 29, slot = imm >> 22 & 0x7f, len = imm & 0x3fffff;
	switch (type) {
	case VB_IMM_CREDIT:
		c->credits += (int)len;
		if (c->credits > c->t->nslots)
			vb_conn_fail(c, KOLO_EPROTO, "peer returned more credits than it had");
		return;
	case VB_IMM_RTR: {
		struct rtr_msg m;
		memcpy(&m, vb_ctrl_rx(c), sizeof(m));
		c->rtr_arrived = true;
		c->rtr_addr = m.addr;
		c->rtr_len = m.len;
		c->rtr_rkey = m.rkey;
		return;
	}
	case VB_IMM_DATA:
	case VB_IMM_DATA_LAST:
	case VB_IMM_RTS:
		if (slot >= (uint32_t)c->t->nslots || len > c->t->slot_bytes) {
			vb_conn_fail(c, KOLO_EPROTO, "bad immediate %#x", imm);
			return;
		}
		break;
	case VB_IMM_DONE:
		break;
	default:
		vb_conn_fail(c, KOLO_EPROTO, "bad immediate %#x", imm);
		return;
	}
	if (c->arr_count == KOLO_ARRAY_SIZE(c->arr)) {
		vb_conn_fail(c, KOLO_EPROTO, "peer wrote past its credits");
		return;
	}
	c->arr[(c->arr_head + c->arr_count) % KOLO_ARRAY_SIZE(c->arr)] =
	        (struct vb_arrival){.type = (uint8_t)type, .slot = (uint8_t)slot, .len = len};
	c->arr_count++;
}

static void on_send(struct vb_conn *c, unsigned kind)
{
	c->sq_out--;
	if (kind <= WR_SLOT_MAX) {
		c->tx_busy[kind] = false;
	} else if (kind == WR_RDV_LAST) {
		for (struct kolo_req *r = c->sends.first; r; r = r->next)
			if (!r->done && r->phase == VB_PH_WRITING) {
				vb_mr_put(c->t, r->mr);
				r->mr = NULL;
				r->done = true;
				break;
			}
	}
}

bool vb_poll_cq(struct vb_transport *t)
{
	bool any = false;
	struct ibv_wc wc[32];
	int n;
	while ((n = t->api->poll_cq(t->cq, 32, wc)) > 0) {
		any = true;
		for (int i = 0; i < n; i++) {
			struct vb_conn *c = conn_by_id(t, wc[i].wr_id >> 8);
			unsigned kind = (unsigned)(wc[i].wr_id & 0xff);
			if (!c || c->state == VB_CS_FAILED)
				continue; /* a closed conn's flushes */
			if (wc[i].status != IBV_WC_SUCCESS) {
				/* Flush, retry exceeded, remote access: the QP is in
				 * error and stays there. */
				vb_conn_fail(c, KOLO_EPEER, "QP %u error: %s (%s completion)",
				             c->qp ? c->qp->qp_num : 0,
				             t->api->wc_status_str(wc[i].status),
				             kind == WR_RECV ? "receive" : "send");
				continue;
			}
			c->last_progress_ns = kolo_now_ns();
			if (kind == WR_RECV)
				on_recv(c, &wc[i]);
			else
				on_send(c, kind);
		}
	}
	if (n < 0)
		for (struct vb_conn *c = t->conns; c; c = c->next_conn)
			vb_conn_fail(c, KOLO_EPEER, "poll_cq failed");
	return any;
}

/* ---- the progress pass ---- */

static void check_timeout(struct vb_conn *c, uint64_t now)
{
	struct vb_transport *t = c->t;
	uint64_t limit = (uint64_t)t->timeout_ms * 1000000ull;
	if (t->timeout_ms <= 0 || now < c->last_progress_ns)
		return;
	if (c->state == VB_CS_READY && conn_pending(c) && now - c->last_progress_ns > limit)
		vb_conn_fail(c, KOLO_ETIMEDOUT, "no progress for %d ms", t->timeout_ms);
	else if (c->state != VB_CS_READY && c->state != VB_CS_FAILED && now - c->created_ns > limit)
		vb_conn_fail(c, KOLO_ETIMEDOUT, "handshake not finished after %d ms",
		             t->timeout_ms);
}

bool vb_progress(struct vb_transport *t)
{
	vb_accept_new(t);
	bool any = vb_poll_cq(t);
	uint64_t now = kolo_now_ns();
	struct vb_conn **p = &t->conns;
	while (*p) {
		struct vb_conn *c = *p;
		if (c->state == VB_CS_ACCEPTOR_WAIT_HELLO || c->state == VB_CS_ACCEPTOR_WAIT_READY)
			vb_acceptor_step(c);
		else if (c->state == VB_CS_CONNECTOR_WAIT_NONCE ||
		         c->state == VB_CS_CONNECTOR_WAIT_VERDICT)
			vb_connector_step(c);
		/* Unclaimed handshakes that failed are strays: drop them. */
		if (c->acceptor && !c->claimed && c->state == VB_CS_FAILED) {
			*p = c->next_conn;
			vb_conn_free(c);
			continue;
		}
		if (c->state == VB_CS_READY) {
			vb_conn_drain(c);
			if (conn_progress(c))
				any = true;
		}
		check_timeout(c, now);
		p = &c->next_conn;
	}
	return any;
}

/* ---- requests ---- */

static kolo_status_t post(struct kolo_conn *base, void *buf, size_t len, bool send,
                          struct kolo_req **out)
{
	struct vb_conn *c = vb_cn(base);
	int ab = atomic_load(&c->t->abort_status);
	if (ab != KOLO_OK)
		return (kolo_status_t)ab;
	if (c->state == VB_CS_FAILED)
		return c->failed;
	struct kolo_req *r = calloc(1, sizeof(*r));
	if (!r)
		return KOLO_ENOMEM;
	r->c = c;
	r->send = send;
	r->buf = buf;
	r->len = len;
	if (!conn_pending(c))
		c->last_progress_ns = kolo_now_ns();
	list_push(send ? &c->sends : &c->recvs, r);
	if (send && c->state == VB_CS_READY)
		send_progress(c);
	*out = r;
	return KOLO_OK;
}

kolo_status_t vb_isend(struct kolo_conn *c, const void *buf, size_t len, struct kolo_req **out)
{
	return post(c, (void *)buf, len, true, out);
}

kolo_status_t vb_irecv(struct kolo_conn *c, void *buf, size_t len, struct kolo_req **out)
{
	return post(c, buf, len, false, out);
}

static void req_release(struct kolo_req *r)
{
	list_unlink(r->send ? &r->c->sends : &r->c->recvs, r);
	vb_mr_put(r->c->t, r->mr);
	free(r);
}

kolo_status_t vb_test(struct kolo_req *r, bool *done)
{
	struct vb_conn *c = r->c;
	struct vb_transport *t = c->t;
	*done = false;
	int ab = atomic_load(&t->abort_status);
	if (ab != KOLO_OK) {
		req_release(r);
		return (kolo_status_t)ab;
	}
	if (!r->done) {
		if (c->state == VB_CS_READY) {
			vb_poll_cq(t);
			vb_conn_drain(c);
			conn_progress(c);
		} else {
			vb_progress(t);
		}
	}
	if (r->done) {
		*done = true;
		req_release(r);
		return KOLO_OK;
	}
	if (c->state == VB_CS_FAILED) {
		kolo_status_t st = c->failed;
		req_release(r);
		return st;
	}
	check_timeout(c, kolo_now_ns());
	return KOLO_OK;
}

void vb_close(struct kolo_conn *base)
{
	if (!base)
		return;
	struct vb_conn *c = vb_cn(base);
	conn_unlink(c->t, c);
	vb_conn_free(c);
}

uint32_t kolo_verbs_conn_qpn(struct kolo_conn *base)
{
	struct vb_conn *c = vb_cn(base);
	return c->qp ? c->qp->qp_num : 0;
}
