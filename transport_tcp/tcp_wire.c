/* The TCP transport's wire codec: the handshake's three messages and the
 * chunk header, at the offsets tcp_internal.h names. Nothing here touches a
 * socket or an endpoint. */
#include "tcp_internal.h"

#include <endian.h>
#include <stdio.h>
#include <string.h>

_Static_assert(TCP_HELLO_SIZE == 232 && TCP_VERDICT_SIZE == 168, "handshake layout");
_Static_assert(TCP_HELLO_PROBE_PORT_OFF + 4 == TCP_HELLO_CNONCE_OFF, "hello fields are contiguous");
_Static_assert(TCP_HANDSHAKE_MAX >= TCP_VERDICT_SIZE && TCP_HANDSHAKE_MAX >= TCP_CHALLENGE_SIZE,
               "handshake buffer");

static void put32(uint8_t *p, uint32_t v)
{
	v = htole32(v);
	memcpy(p, &v, 4);
}

static void put64(uint8_t *p, uint64_t v)
{
	v = htole64(v);
	memcpy(p, &v, 8);
}

static uint32_t get32(const uint8_t *p)
{
	uint32_t v;
	memcpy(&v, p, 4);
	return le32toh(v);
}

static uint64_t get64(const uint8_t *p)
{
	uint64_t v;
	memcpy(&v, p, 8);
	return le64toh(v);
}

/* ---- challenge ---------------------------------------------------------- */

void tcp_wire_challenge_encode(const uint8_t nonce[TCP_NONCE_SIZE], uint8_t out[TCP_CHALLENGE_SIZE])
{
	put32(out + TCP_MAGIC_OFF, KOLO_TRANSPORT_MAGIC);
	put32(out + TCP_CHALLENGE_VERSION_OFF, KOLO_WIRE_VERSION);
	memcpy(out + TCP_CHALLENGE_NONCE_OFF, nonce, TCP_NONCE_SIZE);
}

bool tcp_wire_challenge_decode(const uint8_t buf[TCP_CHALLENGE_SIZE], uint8_t nonce[TCP_NONCE_SIZE])
{
	if (get32(buf + TCP_MAGIC_OFF) != KOLO_TRANSPORT_MAGIC ||
	    get32(buf + TCP_CHALLENGE_VERSION_OFF) != KOLO_WIRE_VERSION)
		return false;
	memcpy(nonce, buf + TCP_CHALLENGE_NONCE_OFF, TCP_NONCE_SIZE);
	return true;
}

/* ---- hello -------------------------------------------------------------- */

/* HMAC(token, nonce || hello[0, TCP_HELLO_MAC_OFF)). */
static void hello_mac(const uint8_t *hello, const uint8_t *token, size_t token_len,
                      const uint8_t *nonce, uint8_t out[KOLO_HMAC_SIZE])
{
	uint8_t msg[TCP_NONCE_SIZE + TCP_HELLO_MAC_OFF];
	memcpy(msg, nonce, TCP_NONCE_SIZE);
	memcpy(msg + TCP_NONCE_SIZE, hello, TCP_HELLO_MAC_OFF);
	kolo_hmac_sha256(token, token_len, msg, sizeof(msg), out);
}

void tcp_wire_hello_encode(const struct tcp_hello *h, const uint8_t *token, size_t token_len,
                           const uint8_t nonce[TCP_NONCE_SIZE], uint8_t out[TCP_HELLO_SIZE])
{
	memset(out, 0, TCP_HELLO_SIZE);
	put32(out + TCP_MAGIC_OFF, KOLO_TRANSPORT_MAGIC);
	put32(out + TCP_HELLO_VERSION_OFF, KOLO_WIRE_VERSION);
	memcpy(out + TCP_HELLO_JOB_OFF, h->job, TCP_JOB_FIELD);
	put64(out + TCP_HELLO_ROUND_OFF, (uint64_t)h->round);
	put32(out + TCP_HELLO_SRC_OFF, (uint32_t)h->src);
	put32(out + TCP_HELLO_DST_OFF, (uint32_t)h->dst);
	put32(out + TCP_HELLO_TAG_OFF, (uint32_t)h->tag);
	put32(out + TCP_HELLO_STREAM_OFF, h->stream);
	put32(out + TCP_HELLO_NSTREAMS_OFF, h->nstreams);
	put32(out + TCP_HELLO_PROBE_PORT_OFF, h->probe_port);
	memcpy(out + TCP_HELLO_CNONCE_OFF, h->cnonce, TCP_NONCE_SIZE);
	hello_mac(out, token, token_len, nonce, out + TCP_HELLO_MAC_OFF);
}

bool tcp_wire_magic_ok(const uint8_t *buf)
{
	return get32(buf + TCP_MAGIC_OFF) == KOLO_TRANSPORT_MAGIC;
}

kolo_status_t tcp_wire_hello_decode(const uint8_t *buf, size_t len, struct tcp_hello *out,
                                    char *why, size_t why_size)
{
	if (len != TCP_HELLO_SIZE) {
		snprintf(why, why_size, "a hello of %zu bytes, expected %d", len, TCP_HELLO_SIZE);
		return KOLO_EPROTO;
	}
	if (!tcp_wire_magic_ok(buf)) {
		snprintf(why, why_size, "bad magic (not a kolo peer)");
		return KOLO_EPROTO;
	}
	uint32_t version = get32(buf + TCP_HELLO_VERSION_OFF);
	if (version != KOLO_WIRE_VERSION) {
		snprintf(why, why_size, "wire version %u, expected %d", version, KOLO_WIRE_VERSION);
		return KOLO_EPROTO;
	}
	memcpy(out->job, buf + TCP_HELLO_JOB_OFF, TCP_JOB_FIELD);
	out->round = (int64_t)get64(buf + TCP_HELLO_ROUND_OFF);
	out->src = (int)get32(buf + TCP_HELLO_SRC_OFF);
	out->dst = (int)get32(buf + TCP_HELLO_DST_OFF);
	out->tag = (int)get32(buf + TCP_HELLO_TAG_OFF);
	out->stream = get32(buf + TCP_HELLO_STREAM_OFF);
	out->nstreams = get32(buf + TCP_HELLO_NSTREAMS_OFF);
	out->probe_port = (uint16_t)get32(buf + TCP_HELLO_PROBE_PORT_OFF);
	memcpy(out->cnonce, buf + TCP_HELLO_CNONCE_OFF, TCP_NONCE_SIZE);
	return KOLO_OK;
}

bool tcp_wire_hello_verify(const uint8_t buf[TCP_HELLO_SIZE], const uint8_t *token,
                           size_t token_len, const uint8_t nonce[TCP_NONCE_SIZE])
{
	uint8_t mac[KOLO_HMAC_SIZE];
	hello_mac(buf, token, token_len, nonce, mac);
	return kolo_consttime_equal(mac, buf + TCP_HELLO_MAC_OFF, KOLO_HMAC_SIZE);
}

/* A job id from the wire, terminated and safe to log. */
static void printable_job(const char *job, char out[TCP_JOB_FIELD + 1])
{
	memcpy(out, job, TCP_JOB_FIELD);
	out[TCP_JOB_FIELD] = '\0';
	for (char *s = out; *s; s++)
		if (*s < 0x20 || *s > 0x7e)
			*s = '?';
}

kolo_status_t tcp_wire_hello_admit(const struct tcp_hello *h, const struct tcp_hello_expect *e,
                                   char *why, size_t why_size)
{
	if (memcmp(h->job, e->job, TCP_JOB_FIELD) != 0) {
		char job[TCP_JOB_FIELD + 1], mine[TCP_JOB_FIELD + 1];
		printable_job(h->job, job);
		printable_job(e->job, mine);
		snprintf(why, why_size, "job '%.64s', this endpoint is in job '%.64s'", job, mine);
		return KOLO_EPROTO;
	}
	if (h->round != e->round) {
		snprintf(why, why_size, "%s round %lld, this endpoint is in round %lld",
		         h->round < e->round ? "stale" : "future", (long long)h->round,
		         (long long)e->round);
		return KOLO_EPROTO;
	}
	if (h->dst != e->rank) {
		snprintf(why, why_size, "addressed to rank %d, this is rank %d", h->dst, e->rank);
		return KOLO_EPROTO;
	}
	if (h->src < 0 || h->src >= e->size) {
		snprintf(why, why_size, "sender rank %d is not in [0, %d)", h->src, e->size);
		return KOLO_EPROTO;
	}
	if (h->nstreams < 1 || h->nstreams > KOLO_TCP_MAX_STREAMS || h->stream >= h->nstreams) {
		snprintf(why, why_size, "stream %u of %u is out of range", h->stream, h->nstreams);
		return KOLO_EPROTO;
	}
	return KOLO_OK;
}

/* ---- verdict ------------------------------------------------------------ */

/* HMAC(token, cnonce || nonce || verdict[0, TCP_VERDICT_MAC_OFF)). */
static void verdict_mac(const uint8_t *v, const uint8_t *token, size_t token_len,
                        const uint8_t *cnonce, const uint8_t *nonce, uint8_t out[KOLO_HMAC_SIZE])
{
	uint8_t msg[2 * TCP_NONCE_SIZE + TCP_VERDICT_MAC_OFF];
	memcpy(msg, cnonce, TCP_NONCE_SIZE);
	memcpy(msg + TCP_NONCE_SIZE, nonce, TCP_NONCE_SIZE);
	memcpy(msg + 2 * TCP_NONCE_SIZE, v, TCP_VERDICT_MAC_OFF);
	kolo_hmac_sha256(token, token_len, msg, sizeof(msg), out);
}

void tcp_wire_verdict_encode(kolo_status_t st, const char *reason, const uint8_t *token,
                             size_t token_len, const uint8_t cnonce[TCP_NONCE_SIZE],
                             const uint8_t nonce[TCP_NONCE_SIZE], uint8_t out[TCP_VERDICT_SIZE])
{
	memset(out, 0, TCP_VERDICT_SIZE);
	put32(out + TCP_MAGIC_OFF, KOLO_TRANSPORT_MAGIC);
	put32(out + TCP_VERDICT_STATUS_OFF, (uint32_t)st);
	memcpy(out + TCP_VERDICT_REASON_OFF, reason, strnlen(reason, TCP_REASON_SIZE - 1));
	if (st == KOLO_OK)
		verdict_mac(out, token, token_len, cnonce, nonce, out + TCP_VERDICT_MAC_OFF);
}

bool tcp_wire_verdict_decode(const uint8_t buf[TCP_VERDICT_SIZE], uint32_t *status,
                             char reason[TCP_REASON_SIZE + 1])
{
	if (!tcp_wire_magic_ok(buf))
		return false;
	*status = get32(buf + TCP_VERDICT_STATUS_OFF);
	memcpy(reason, buf + TCP_VERDICT_REASON_OFF, TCP_REASON_SIZE);
	reason[TCP_REASON_SIZE] = '\0';
	return true;
}

bool tcp_wire_verdict_verify(const uint8_t buf[TCP_VERDICT_SIZE], const uint8_t *token,
                             size_t token_len, const uint8_t cnonce[TCP_NONCE_SIZE],
                             const uint8_t nonce[TCP_NONCE_SIZE])
{
	uint8_t mac[KOLO_HMAC_SIZE];
	verdict_mac(buf, token, token_len, cnonce, nonce, mac);
	return kolo_consttime_equal(mac, buf + TCP_VERDICT_MAC_OFF, KOLO_HMAC_SIZE);
}

/* ---- chunk header ------------------------------------------------------- */

void tcp_wire_chunk_encode(const struct tcp_chunk_hdr *c, uint8_t out[TCP_CHUNK_HDR_SIZE])
{
	put32(out + TCP_MAGIC_OFF, TCP_CHUNK_MAGIC);
	put32(out + TCP_CHUNK_LEN_OFF, c->len);
	put64(out + TCP_CHUNK_SEQ_OFF, c->seq);
	put64(out + TCP_CHUNK_OFFSET_OFF, c->offset);
	put64(out + TCP_CHUNK_MSGLEN_OFF, c->msglen);
}

bool tcp_wire_chunk_decode(const uint8_t buf[TCP_CHUNK_HDR_SIZE], struct tcp_chunk_hdr *out)
{
	if (get32(buf + TCP_MAGIC_OFF) != TCP_CHUNK_MAGIC)
		return false;
	out->len = get32(buf + TCP_CHUNK_LEN_OFF);
	out->seq = get64(buf + TCP_CHUNK_SEQ_OFF);
	out->offset = get64(buf + TCP_CHUNK_OFFSET_OFF);
	out->msglen = get64(buf + TCP_CHUNK_MSGLEN_OFF);
	return true;
}
