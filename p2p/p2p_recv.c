/* p2p receives: every peer's incoming conn is accepted as it arrives and
 * read header by header. A message goes straight into the buffer of the
 * earliest posted recv that matches it; otherwise into memory, where the
 * next matching recv finds it (the posted recvs are matched against those
 * first, so no message overtakes an earlier one from its sender). */
#include "p2p_internal.h"

#include <stdlib.h>
#include <string.h>

static bool matches(const struct p2p_op *op, int src, int tag)
{
	return (op->peer == KOLO_P2P_ANY_SOURCE || op->peer == src) && op->tag == tag;
}

static void finish_mismatch(struct p2p_op *op, int src, size_t len)
{
	char msg[200];
	snprintf(msg, sizeof(msg),
	         "rank %d sent %zu bytes with tag %d; this recv is for %zu bytes (the message "
	         "stays for a recv of its size)",
	         src, len, op->tag, op->len);
	p2p_op_finish(op, KOLO_EMISMATCH, msg);
}

static void unlink_msg(struct kolo_p2p *p, struct p2p_msg *m)
{
	struct p2p_msg **pp = &p->unexpected, *prev = NULL;
	while (*pp && *pp != m) {
		prev = *pp;
		pp = &(*pp)->next;
	}
	if (!*pp)
		return;
	*pp = m->next;
	if (p->unexpected_tail == m)
		p->unexpected_tail = prev;
}

/* A message is complete in memory and op wants it. */
static void deliver(struct kolo_p2p *p, struct p2p_msg *m, struct p2p_op *op)
{
	if (m->len)
		memcpy(op->buf, m->data, m->len);
	unlink_msg(p, m);
	free(m->data);
	free(m);
	p2p_op_finish(op, KOLO_OK, "");
}

void p2p_recv_post(struct kolo_p2p *p, struct p2p_op *op)
{
	op->deadline_ms = kolo_now_ms() + (uint64_t)p->cfg.timeout_ms;
	for (struct p2p_msg *m = p->unexpected; m; m = m->next) {
		if (m->claimed || !matches(op, m->src, m->tag))
			continue;
		if (m->len != op->len) {
			finish_mismatch(op, m->src, m->len);
			return;
		}
		if (op->source)
			*op->source = m->src;
		if (m->complete)
			deliver(p, m, op);
		else
			m->claimed = op;
		return;
	}
	if (p->recvs_tail)
		p->recvs_tail->next = op;
	else
		p->recvs = op;
	p->recvs_tail = op;
}

/* Unlinks and returns the earliest posted recv for (src, tag, len); recvs
 * of that source and tag but another size fail on the way. */
static struct p2p_op *take_recv(struct kolo_p2p *p, int src, int tag, size_t len)
{
	struct p2p_op **pp = &p->recvs, *prev = NULL;
	while (*pp) {
		struct p2p_op *op = *pp;
		if (!matches(op, src, tag)) {
			prev = op;
			pp = &op->next;
			continue;
		}
		*pp = op->next;
		if (p->recvs_tail == op)
			p->recvs_tail = prev;
		op->next = NULL;
		if (op->len == len)
			return op;
		finish_mismatch(op, src, len);
	}
	return NULL;
}

/* A header arrived from src: where its payload goes. */
static void on_header(struct kolo_p2p *p, int src, uint64_t now)
{
	struct p2p_peer *pe = &p->peers[src];
	if (pe->hdr[0] >> 32 != P2P_MAGIC) {
		p2p_fail(p, KOLO_EPROTO, "rank %d sent a point-to-point header without its magic",
		         src);
		return;
	}
	int tag = (int)(int32_t)(uint32_t)pe->hdr[0];
	size_t len = (size_t)pe->hdr[1];
	void *into;
	struct p2p_op *op = take_recv(p, src, tag, len);
	if (op) {
		if (op->source)
			*op->source = src;
		pe->rx_op = op;
		into = op->buf;
	} else {
		struct p2p_msg *m = calloc(1, sizeof(*m));
		void *data = malloc(len ? len : 1);
		if (!m || !data) {
			free(m);
			free(data);
			p2p_fail(p, KOLO_ENOMEM,
			         "out of memory for a %zu-byte message from rank %d", len, src);
			return;
		}
		*m = (struct p2p_msg){.src = src, .tag = tag, .len = len, .data = data};
		if (p->unexpected_tail)
			p->unexpected_tail->next = m;
		else
			p->unexpected = m;
		p->unexpected_tail = m;
		pe->rx_msg = m;
		into = m->data;
	}
	pe->rx_since_ms = now;
	if (len) {
		kolo_status_t st = kolo_irecv(pe->in, into, len, &pe->req_body);
		if (st != KOLO_OK)
			p2p_fail(p, st, "receiving from rank %d: %s", src, p->t->err.msg);
	}
}

static void on_body(struct kolo_p2p *p, int src)
{
	struct p2p_peer *pe = &p->peers[src];
	if (pe->rx_op)
		p2p_op_finish(pe->rx_op, KOLO_OK, "");
	else if (pe->rx_msg) {
		pe->rx_msg->complete = true;
		if (pe->rx_msg->claimed)
			deliver(p, pe->rx_msg, pe->rx_msg->claimed);
	}
	pe->rx_op = NULL;
	pe->rx_msg = NULL;
}

/* Tests *req; true when done (it is then NULL). */
static bool test(struct kolo_p2p *p, int src, struct kolo_req **req)
{
	bool done = false;
	kolo_status_t st = p->t->ops->test(*req, &done);
	if (st != KOLO_OK) {
		*req = NULL;
		p2p_fail(p, st, "receiving from rank %d: %s", src, p->t->err.msg);
		return false;
	}
	if (done)
		*req = NULL;
	return done;
}

/* One step of src's incoming conn; true when something moved. */
static bool progress_peer(struct kolo_p2p *p, int src, uint64_t now)
{
	struct p2p_peer *pe = &p->peers[src];
	bool moved = false;
	if (!pe->in) {
		kolo_status_t st =
		        p->t->ops->accept(p->t, src, KOLO_P2P_TAG + (src > p->cfg.rank), &pe->in);
		if (st != KOLO_OK)
			p2p_fail(p, st, "accepting rank %d: %s", src, p->t->err.msg);
		if (!pe->in)
			return false;
		moved = true;
	}
	for (;;) {
		if (pe->req_body) {
			if (!test(p, src, &pe->req_body)) {
				if (p2p_status(p) == KOLO_OK &&
				    now >= pe->rx_since_ms + (uint64_t)p->cfg.timeout_ms)
					p2p_fail(p, KOLO_ETIMEDOUT,
					         "a message from rank %d made no progress within "
					         "%d ms",
					         src, p->cfg.timeout_ms);
				return moved;
			}
			moved = true;
		}
		if (pe->rx_op || pe->rx_msg)
			on_body(p, src);
		if (!pe->req_hdr) {
			kolo_status_t st =
			        kolo_irecv(pe->in, pe->hdr, sizeof(pe->hdr), &pe->req_hdr);
			if (st != KOLO_OK) {
				p2p_fail(p, st, "receiving from rank %d: %s", src, p->t->err.msg);
				return true;
			}
		}
		if (!test(p, src, &pe->req_hdr))
			return moved;
		on_header(p, src, now);
		if (p2p_status(p) != KOLO_OK)
			return true;
		moved = true;
	}
}

static void expire_recvs(struct kolo_p2p *p, uint64_t now)
{
	struct p2p_op **pp = &p->recvs, *prev = NULL;
	while (*pp) {
		struct p2p_op *op = *pp;
		if (now < op->deadline_ms) {
			prev = op;
			pp = &op->next;
			continue;
		}
		*pp = op->next;
		if (p->recvs_tail == op)
			p->recvs_tail = prev;
		char msg[160], who[32] = "any rank";
		if (op->peer >= 0)
			snprintf(who, sizeof(who), "rank %d", op->peer);
		snprintf(msg, sizeof(msg), "recv: no message from %s with tag %d within %d ms", who,
		         op->tag, p->cfg.timeout_ms);
		p2p_op_finish(op, KOLO_ETIMEDOUT, msg);
	}
}

bool p2p_recv_progress(struct kolo_p2p *p, uint64_t now)
{
	bool moved = false;
	for (int src = 0; src < p->cfg.size && p2p_status(p) == KOLO_OK; src++)
		if (src != p->cfg.rank)
			moved = progress_peer(p, src, now) || moved;
	expire_recvs(p, now);
	return moved;
}

uint64_t p2p_next_deadline(const struct kolo_p2p *p)
{
	uint64_t d = UINT64_MAX;
	for (const struct p2p_op *op = p->recvs; op; op = op->next)
		d = KOLO_MIN(d, op->deadline_ms);
	for (int r = 0; r < p->cfg.size; r++) {
		const struct p2p_peer *pe = &p->peers[r];
		if (pe->sends)
			d = KOLO_MIN(d, KOLO_MIN(pe->sends->deadline_ms, pe->next_lookup_ms));
		if (pe->req_body)
			d = KOLO_MIN(d, pe->rx_since_ms + (uint64_t)p->cfg.timeout_ms);
	}
	return d;
}
