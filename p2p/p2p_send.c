/* p2p sends: each peer's sends in the order queued, on one conn opened on
 * the first send to that peer once its address is published. The header and
 * the payload are queued on the conn at once; a send completes when both
 * are handed over. */
#include "p2p_internal.h"

#include <stdlib.h>

/* Backoff of the address look-up of a peer that has not published it. */
#define LOOKUP_FIRST_MS 2
#define LOOKUP_MAX_MS   100

void p2p_send_queue(struct kolo_p2p *p, struct p2p_op *op)
{
	struct p2p_peer *pe = &p->peers[op->peer];
	op->deadline_ms = kolo_now_ms() + (uint64_t)p->cfg.timeout_ms;
	op->hdr[0] = (uint64_t)P2P_MAGIC << 32 | (uint32_t)op->tag;
	op->hdr[1] = op->len;
	if (pe->sends_tail)
		pe->sends_tail->next = op;
	else
		pe->sends = op;
	pe->sends_tail = op;
}

/* Opens the conn to dst once its address is known; false while it is not
 * (or on a failure, recorded in p). */
static bool connect_peer(struct kolo_p2p *p, int dst, uint64_t now)
{
	struct p2p_peer *pe = &p->peers[dst];
	if (pe->out)
		return true;
	if (now < pe->next_lookup_ms)
		return false;
	struct kolo_transport_handle h;
	kolo_status_t st = p->cfg.lookup(p->cfg.lookup_ctx, dst, &h);
	if (st == KOLO_ENOTFOUND) {
		pe->backoff_ms =
		        KOLO_MIN(KOLO_MAX(pe->backoff_ms * 2, LOOKUP_FIRST_MS), LOOKUP_MAX_MS);
		pe->next_lookup_ms = now + (uint64_t)pe->backoff_ms;
		return false;
	}
	if (st == KOLO_OK)
		st = p->t->ops->connect(p->t, &h, dst, KOLO_P2P_TAG + (p->cfg.rank > dst),
		                        &pe->out);
	if (st != KOLO_OK) {
		p2p_fail(p, st, "connecting to rank %d for point-to-point: %s", dst,
		         p->t->err.msg[0] ? p->t->err.msg : kolo_strerror(st));
		return false;
	}
	return true;
}

/* Sends that wait for an address past their deadline fail on their own. */
static void expire_unconnected(struct kolo_p2p *p, int dst, uint64_t now)
{
	struct p2p_peer *pe = &p->peers[dst];
	struct p2p_op **pp = &pe->sends, *last = NULL;
	while (*pp) {
		struct p2p_op *op = *pp;
		if (now < op->deadline_ms) {
			last = op;
			pp = &op->next;
			continue;
		}
		*pp = op->next;
		char msg[160];
		snprintf(msg, sizeof(msg),
		         "send to rank %d: it has not opened point-to-point within %d ms "
		         "(no send or recv called there)",
		         dst, p->cfg.timeout_ms);
		p2p_op_finish(op, KOLO_ETIMEDOUT, msg);
	}
	pe->sends_tail = last;
}

static bool post(struct kolo_p2p *p, int dst, struct p2p_op *op)
{
	struct p2p_peer *pe = &p->peers[dst];
	kolo_status_t st = kolo_isend(pe->out, op->hdr, sizeof(op->hdr), &op->req_hdr);
	if (st == KOLO_OK && op->len)
		st = kolo_isend(pe->out, op->buf, op->len, &op->req_body);
	op->posted = true;
	if (st != KOLO_OK)
		p2p_fail(p, st, "sending to rank %d: %s", dst, p->t->err.msg);
	return st == KOLO_OK;
}

static bool test(struct kolo_p2p *p, int dst, struct kolo_req **req)
{
	if (!*req)
		return true;
	bool done = false;
	kolo_status_t st = p->t->ops->test(*req, &done);
	if (st != KOLO_OK) {
		*req = NULL;
		p2p_fail(p, st, "sending to rank %d: %s", dst, p->t->err.msg);
		return false;
	}
	if (done)
		*req = NULL;
	return done;
}

/* Posts dst's new sends and finishes the ones handed over, in order. */
static bool progress_peer(struct kolo_p2p *p, int dst, uint64_t now)
{
	struct p2p_peer *pe = &p->peers[dst];
	bool moved = false;
	for (struct p2p_op *op = pe->sends; op; op = op->next)
		if (!op->posted) {
			if (!post(p, dst, op))
				return true;
			moved = true;
		}
	while (pe->sends) {
		struct p2p_op *op = pe->sends;
		bool h = test(p, dst, &op->req_hdr), b = h && test(p, dst, &op->req_body);
		if (p2p_status(p) != KOLO_OK)
			return true;
		if (!b) {
			if (now >= op->deadline_ms)
				p2p_fail(p, KOLO_ETIMEDOUT,
				         "send to rank %d (tag %d, %zu bytes) made no progress "
				         "within %d ms",
				         dst, op->tag, op->len, p->cfg.timeout_ms);
			break;
		}
		pe->sends = op->next;
		if (!pe->sends)
			pe->sends_tail = NULL;
		else /* the next one's time starts now */
			pe->sends->deadline_ms = now + (uint64_t)p->cfg.timeout_ms;
		p2p_op_finish(op, KOLO_OK, "");
		moved = true;
	}
	return moved;
}

bool p2p_send_progress(struct kolo_p2p *p, uint64_t now)
{
	bool moved = false;
	for (int dst = 0; dst < p->cfg.size && p2p_status(p) == KOLO_OK; dst++) {
		struct p2p_peer *pe = &p->peers[dst];
		if (!pe->sends)
			continue;
		if (!pe->out && !connect_peer(p, dst, now)) {
			expire_unconnected(p, dst, now);
			continue;
		}
		moved = progress_peer(p, dst, now) || moved;
	}
	return moved;
}
