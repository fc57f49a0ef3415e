/* Fuzz target: the TCP transport's hello decoder (transport_tcp/tcp_wire.c),
 * which reads the first bytes any host that connects to a listening rank
 * sends, before it is authenticated. The input is one hello. Beyond "no
 * crash":
 *  - decoding is pure: the input is untouched and a second decode gives the
 *    same hello;
 *  - it succeeds exactly for TCP_HELLO_SIZE bytes with the magic and this
 *    wire version; a refusal has a reason;
 *  - a decoded hello re-encodes to the input's bytes but for the upper half
 *    of the 32-bit probe-port field (the port is 16 bits), and the
 *    re-encoding decodes to the same hello and carries a MAC that proves the
 *    token it was made with and no other;
 *  - the input's own MAC is accepted only where it is the re-encoding's;
 *  - admission succeeds exactly when a plain model of the rules says so
 *    (same job and round, addressed to this rank, a sender of the round, a
 *    stream in range), and a refusal's reason is printable. */
#include "fuzz.h"
#include "tcp_internal.h"

#include <stdbool.h>
#include <string.h>

/* What the seed corpus's hellos are made for (make_tcp_hello_corpus.py). */
static const char token[] = "fuzz-token";
static const char job[TCP_JOB_FIELD] = "fuzz-job";
enum { ROUND = 3, RANK = 1, SIZE = 4 };
static const uint8_t nonce[TCP_NONCE_SIZE] = {0,  1,  2,  3,  4,  5,  6,  7,  8,  9,  10,
                                              11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21,
                                              22, 23, 24, 25, 26, 27, 28, 29, 30, 31};

static bool hello_same(const struct tcp_hello *a, const struct tcp_hello *b)
{
	return !memcmp(a->job, b->job, TCP_JOB_FIELD) && a->round == b->round && a->src == b->src &&
	       a->dst == b->dst && a->tag == b->tag && a->stream == b->stream &&
	       a->nstreams == b->nstreams && a->probe_port == b->probe_port &&
	       !memcmp(a->cnonce, b->cnonce, TCP_NONCE_SIZE);
}

static bool printable(const char *s)
{
	for (; *s; s++)
		if (*s < 0x20 || *s > 0x7e)
			return false;
	return true;
}

static void check_round_trip(const uint8_t *in, const struct tcp_hello *h)
{
	const uint8_t *tk = (const uint8_t *)token;
	uint8_t out[TCP_HELLO_SIZE];
	tcp_wire_hello_encode(h, tk, strlen(token), nonce, out);
	const size_t port_hi = TCP_HELLO_PROBE_PORT_OFF + 2;
	FUZZ_CHECK(!memcmp(out, in, port_hi), "re-encoded to other bytes before the probe port");
	FUZZ_CHECK(out[port_hi] == 0 && out[port_hi + 1] == 0, "probe port above 16 bits");
	FUZZ_CHECK(!memcmp(out + port_hi + 2, in + port_hi + 2, TCP_HELLO_MAC_OFF - port_hi - 2),
	           "re-encoded to other bytes after the probe port");
	struct tcp_hello again;
	char why[256];
	FUZZ_CHECK(tcp_wire_hello_decode(out, sizeof(out), &again, why, sizeof(why)) == KOLO_OK,
	           "the re-encoding does not decode: %s", why);
	FUZZ_CHECK(hello_same(h, &again), "the re-encoding decodes to another hello");
	FUZZ_CHECK(tcp_wire_hello_verify(out, tk, strlen(token), nonce),
	           "the re-encoding's MAC does not prove its token");
	FUZZ_CHECK(!tcp_wire_hello_verify(out, tk, strlen(token) - 1, nonce),
	           "the re-encoding's MAC proves another token");
	bool same_mac = !memcmp(out + TCP_HELLO_MAC_OFF, in + TCP_HELLO_MAC_OFF, KOLO_HMAC_SIZE);
	bool ok = tcp_wire_hello_verify(in, tk, strlen(token), nonce);
	if (in[port_hi] == 0 && in[port_hi + 1] == 0)
		FUZZ_CHECK(ok == same_mac, "the input's MAC is judged %s", ok ? "good" : "bad");
}

static void check_admit(const struct tcp_hello *h)
{
	struct tcp_hello_expect e = {.job = job, .round = ROUND, .rank = RANK, .size = SIZE};
	char why[256] = "";
	kolo_status_t st = tcp_wire_hello_admit(h, &e, why, sizeof(why));
	bool model = !memcmp(h->job, job, TCP_JOB_FIELD) && h->round == ROUND && h->dst == RANK &&
	             h->src >= 0 && h->src < SIZE && h->nstreams >= 1 &&
	             h->nstreams <= KOLO_TCP_MAX_STREAMS && h->stream < h->nstreams;
	FUZZ_CHECK((st == KOLO_OK) == model, "admitted: %s, model: %d (%s)", kolo_status_name(st),
	           model, why);
	if (st != KOLO_OK) {
		FUZZ_CHECK(st == KOLO_EPROTO, "refused with %s", kolo_status_name(st));
		FUZZ_CHECK(why[0] && printable(why), "reason '%s'", why);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint8_t *copy = malloc(size ? size : 1);
	FUZZ_CHECK(copy != NULL, "out of memory");
	memcpy(copy, data, size);
	struct tcp_hello h, h2;
	char why[256] = "", why2[256] = "";
	memset(&h, 0xa5, sizeof(h));
	memset(&h2, 0xa5, sizeof(h2));
	kolo_status_t st = tcp_wire_hello_decode(data, size, &h, why, sizeof(why));
	kolo_status_t st2 = tcp_wire_hello_decode(data, size, &h2, why2, sizeof(why2));
	FUZZ_CHECK(size == 0 || !memcmp(copy, data, size), "the decoder wrote to its input");
	FUZZ_CHECK(st == st2 && !strcmp(why, why2), "a second decode differs");
	/* "kolo" and the wire version, little-endian */
	static const uint8_t head[8] = {0x6f, 0x6c, 0x6f, 0x6b, KOLO_WIRE_VERSION, 0, 0, 0};
	bool model = size == TCP_HELLO_SIZE && !memcmp(data, head, sizeof(head));
	FUZZ_CHECK((st == KOLO_OK) == model, "decoded: %s, model: %d (%s)", kolo_status_name(st),
	           model, why);
	if (st != KOLO_OK) {
		FUZZ_CHECK(st == KOLO_EPROTO && why[0], "refused with %s, reason '%s'",
		           kolo_status_name(st), why);
	} else {
		FUZZ_CHECK(hello_same(&h, &h2), "a second decode gives another hello");
		check_round_trip(data, &h);
		check_admit(&h);
	}
	free(copy);
	return 0;
}
