/* The TCP transport's data path on a ready stream: send requests are cut
 * into chunks that go to whichever stream has room, and each chunk is
 * received straight into its posted buffer. */
#include "tcp_internal.h"

#include <errno.h>
#include <sys/socket.h>
#include <sys/uio.h>

/* ---- send --------------------------------------------------------------- */

static size_t chunk_len(const struct tcp_conn *c, size_t total, size_t remaining)
{
	size_t cb = c->t->chunk_bytes;
	if (c->nstreams > 1 && total > TCP_MIN_CHUNK) {
		/* Spread a mid-size message over every stream; large ones are
		 * cut into chunk_bytes pieces that streams take as they drain. */
		size_t even = (total + (size_t)c->nstreams - 1) / (size_t)c->nstreams;
		even = (even + 4095) & ~(size_t)4095;
		cb = KOLO_MIN(cb, KOLO_MAX(even, (size_t)TCP_MIN_CHUNK));
	}
	return KOLO_MIN(remaining, cb);
}

/* Hands the stream the next chunk of the first send not fully cut. */
static bool take_chunk(struct tcp_conn *c, struct tcp_stream *s)
{
	struct tcp_req *r = c->cut_req;
	if (!r)
		return false;
	size_t off = r->cut;
	size_t n = chunk_len(c, r->len, r->len - off);
	struct tcp_chunk_hdr h = {
	        .len = (uint32_t)n, .seq = r->seq, .offset = off, .msglen = r->len};
	tcp_wire_chunk_encode(&h, s->shdr);
	s->sreq = r;
	s->spay = r->buf + off;
	s->slen = n;
	s->ssent = 0;
	r->cut += n;
	r->inflight++;
	r->started = true;
	if (r->cut == r->len)
		c->cut_req = r->next;
	return true;
}

static void chunk_sent(struct tcp_conn *c, struct tcp_stream *s)
{
	struct tcp_req *r = s->sreq;
	s->sreq = NULL;
	r->done += s->slen;
	r->inflight--;
	if (r->cut == r->len && r->inflight == 0)
		tcp_req_complete(c, r);
}

/* Data waits until every stream of the conn is in: a message sent before
 * that could complete while a handshake is half done, and the sender could
 * stop driving the endpoint while the acceptor still waits for the rest of
 * the conn's streams. */
bool tcp_stream_want_send(const struct tcp_conn *c, const struct tcp_stream *s)
{
	return c->nready == c->nstreams && (s->sreq || c->cut_req);
}

void tcp_stream_send(struct tcp_conn *c, struct tcp_stream *s)
{
	size_t moved = 0;
	while (!c->err && moved < TCP_STREAM_BUDGET) {
		if (!s->sreq && !take_chunk(c, s))
			return;
		struct iovec iov[2];
		int niov = 0;
		if (s->ssent < TCP_CHUNK_HDR_SIZE)
			iov[niov++] =
			        (struct iovec){s->shdr + s->ssent, TCP_CHUNK_HDR_SIZE - s->ssent};
		size_t pay_off = s->ssent > TCP_CHUNK_HDR_SIZE ? s->ssent - TCP_CHUNK_HDR_SIZE : 0;
		if (s->slen > pay_off)
			iov[niov++] =
			        (struct iovec){(void *)(s->spay + pay_off), s->slen - pay_off};
		struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)niov};
		ssize_t n = sendmsg(s->fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n < 0) {
			if (tcp_conn_io_stop(c, n, false))
				return;
			continue;
		}
		tcp_conn_touch(c);
		moved += (size_t)n;
		s->ssent += (size_t)n;
		if (s->ssent == TCP_CHUNK_HDR_SIZE + s->slen)
			chunk_sent(c, s);
	}
}

/* ---- receive ------------------------------------------------------------ */

static struct tcp_req *find_recv(struct tcp_conn *c, uint64_t seq)
{
	for (struct tcp_req *r = c->recvq.head; r && r->seq <= seq; r = r->next)
		if (r->seq == seq)
			return r;
	return NULL;
}

static void chunk_received(struct tcp_conn *c, struct tcp_stream *s)
{
	struct tcp_req *r = s->rreq;
	r->done += s->rlen;
	r->started = true;
	s->in_payload = false;
	s->rreq = NULL;
	if (r->done == r->len)
		tcp_req_complete(c, r);
}

/* Points the stream at the posted receive of the chunk whose header it
 * holds. false: paused (not posted yet) or the conn failed. */
bool tcp_stream_bind_chunk(struct tcp_conn *c, struct tcp_stream *s)
{
	const struct tcp_chunk_hdr *h = &s->rchunk;
	struct tcp_req *r = find_recv(c, h->seq);
	if (!r) {
		if (h->seq >= c->next_recv_seq) {
			/* Leave the rest in the socket: TCP flow control holds
			 * the sender until the receive is posted. */
			s->paused = true;
			return false;
		}
		tcp_conn_fail(c, KOLO_EPROTO,
		              "rank %d (tag %d) sent a chunk of message %llu, which is "
		              "already complete",
		              c->base.peer_rank, c->base.tag, (unsigned long long)h->seq);
		return false;
	}
	s->paused = false;
	if (h->msglen != r->len) {
		tcp_conn_fail(c, KOLO_EPROTO,
		              "rank %d (tag %d) sent %llu bytes as message %llu; the "
		              "matching receive expects %zu",
		              c->base.peer_rank, c->base.tag, (unsigned long long)h->msglen,
		              (unsigned long long)h->seq, r->len);
		return false;
	}
	if (h->offset > r->len || h->len > r->len - h->offset || h->len > r->len - r->done) {
		tcp_conn_fail(c, KOLO_EPROTO, "rank %d (tag %d) sent a chunk outside message %llu",
		              c->base.peer_rank, c->base.tag, (unsigned long long)h->seq);
		return false;
	}
	s->rreq = r;
	s->rdst = r->buf + h->offset;
	s->rleft = h->len;
	s->rlen = h->len;
	s->in_payload = true;
	if (h->len == 0)
		chunk_received(c, s);
	return true;
}

bool tcp_stream_want_recv(const struct tcp_conn *c, const struct tcp_stream *s)
{
	return !s->paused && (s->in_payload || s->rhdr_got > 0 || c->recvq.head);
}

/* Reads the rest of a chunk header. false: stop (nothing more now, or the
 * conn failed). */
static bool recv_header(struct tcp_conn *c, struct tcp_stream *s)
{
	while (s->rhdr_got < TCP_CHUNK_HDR_SIZE) {
		ssize_t n = recv(s->fd, s->rhdr + s->rhdr_got, TCP_CHUNK_HDR_SIZE - s->rhdr_got,
		                 MSG_DONTWAIT);
		if (n <= 0) {
			if (tcp_conn_io_stop(c, n, true))
				return false;
			continue;
		}
		tcp_conn_touch(c);
		s->rhdr_got += (size_t)n;
	}
	s->rhdr_got = 0;
	if (!tcp_wire_chunk_decode(s->rhdr, &s->rchunk)) {
		tcp_conn_fail(c, KOLO_EPROTO, "rank %d (tag %d) sent a corrupt chunk header",
		              c->base.peer_rank, c->base.tag);
		return false;
	}
	return tcp_stream_bind_chunk(c, s);
}

void tcp_stream_recv(struct tcp_conn *c, struct tcp_stream *s)
{
	size_t moved = 0;
	while (!c->err && moved < TCP_STREAM_BUDGET && tcp_stream_want_recv(c, s)) {
		if (!s->in_payload) {
			if (!recv_header(c, s))
				return;
			continue;
		}
		/* The payload goes straight into the posted buffer; the next
		 * header rides along in the same readv. */
		struct iovec iov[2] = {{s->rdst, s->rleft}, {s->rhdr, TCP_CHUNK_HDR_SIZE}};
		ssize_t n = readv(s->fd, iov, 2);
		if (n <= 0) {
			if (tcp_conn_io_stop(c, n, true))
				return;
			continue;
		}
		tcp_conn_touch(c);
		moved += (size_t)n;
		if ((size_t)n < s->rleft) {
			s->rdst += n;
			s->rleft -= (size_t)n;
			continue;
		}
		s->rhdr_got = (size_t)n - s->rleft;
		s->rleft = 0;
		chunk_received(c, s);
	}
}
