/* Unit tests of transport_tcp: address choice, the listen handle, IPv6, and
 * that an acceptor must prove the job token. The
 * transport's behaviour is tested by tests/transport/ (conformance, faults). */
#include <arpa/inet.h>
#include <check.h>
#include <endian.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tcp_internal.h"
#include "testutil.h"
#include "transport_tcp.h"

static const char *ip_of(const struct sockaddr_storage *ss, char *buf, size_t size)
{
	if (ss->ss_family == AF_INET)
		return inet_ntop(AF_INET, &((const struct sockaddr_in *)ss)->sin_addr, buf,
		                 (socklen_t)size);
	return inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)ss)->sin6_addr, buf,
	                 (socklen_t)size);
}

START_TEST(pick_literal_and_name)
{
	struct sockaddr_storage ss;
	socklen_t len = 0;
	char ip[64];
	struct kolo_errbuf eb = {{0}};
	ck_assert_int_eq(kolo_tcp_pick_address("127.0.0.1", NULL, &ss, &len, &eb), KOLO_OK);
	ck_assert_str_eq(ip_of(&ss, ip, sizeof(ip)), "127.0.0.1");
	ck_assert_uint_eq(len, sizeof(struct sockaddr_in));
	ck_assert_int_eq(kolo_tcp_pick_address("::1", NULL, &ss, &len, &eb), KOLO_OK);
	ck_assert_int_eq(ss.ss_family, AF_INET6);
	ck_assert_int_eq(kolo_tcp_pick_address("lo", NULL, &ss, &len, &eb), KOLO_OK);
	ck_assert_str_eq(ip_of(&ss, ip, sizeof(ip)), "127.0.0.1");
	ck_assert_int_eq(kolo_tcp_pick_address("no-such-if0", NULL, &ss, &len, &eb), KOLO_EINVAL);
	ck_assert_ptr_nonnull(strstr(eb.msg, "no-such-if0"));
}
END_TEST

START_TEST(pick_by_route)
{
	struct sockaddr_storage ss;
	socklen_t len = 0;
	char ip[64];
	static const char *routes[] = {"127.0.0.1", "127.0.0.1:29470", "http://127.0.0.1:29470/v1",
	                               "localhost"};
	for (size_t i = 0; i < KOLO_ARRAY_SIZE(routes); i++) {
		ck_assert_int_eq(kolo_tcp_pick_address("", routes[i], &ss, &len, NULL), KOLO_OK);
		ip_of(&ss, ip, sizeof(ip));
		ck_assert_msg(strcmp(ip, "127.0.0.1") == 0 || strcmp(ip, "::1") == 0,
		              "route to %s picked %s", routes[i], ip);
	}
	/* No hint: some address, never an error. */
	ck_assert_int_eq(kolo_tcp_pick_address(NULL, NULL, &ss, &len, NULL), KOLO_OK);
	ck_assert(ss.ss_family == AF_INET || ss.ss_family == AF_INET6);
}
END_TEST

START_TEST(handle_roundtrip)
{
	static const char token[] = "t";
	struct kolo_transport_config cfg = {.job = "j",
	                                    .round = 1,
	                                    .rank = 0,
	                                    .size = 1,
	                                    .token = (const uint8_t *)token,
	                                    .token_len = 1,
	                                    .timeout_ms = 1000,
	                                    .streams = 1,
	                                    .iface = "127.0.0.1"};
	const struct kolo_transport_ops *ops = &kolo_transport_tcp_ops;
	struct kolo_transport *t = NULL;
	struct kolo_transport_handle h;
	ck_assert_int_eq(ops->create(&cfg, &t, NULL), KOLO_OK);
	ck_assert_int_eq(ops->listen(t, &h), KOLO_OK);
	ck_assert_int_eq(ops->listen(t, &h), KOLO_EINVAL);
	uint32_t magic;
	memcpy(&magic, h.bytes, 4);
	ck_assert_uint_eq(magic, KOLO_TRANSPORT_MAGIC); /* little-endian hosts */
	struct sockaddr_storage ss;
	socklen_t len;
	ck_assert_int_eq(kolo_tcp_handle_decode(&h, &ss, &len), KOLO_OK);
	ck_assert_int_eq(ss.ss_family, AF_INET);
	ck_assert_uint_ne(ntohs(((struct sockaddr_in *)&ss)->sin_port), 0);
	struct kolo_transport_handle bad = h;
	bad.bytes[0] ^= 1;
	ck_assert_int_eq(kolo_tcp_handle_decode(&bad, &ss, &len), KOLO_EINVAL);
	struct kolo_conn *c = NULL;
	ck_assert_int_eq(ops->connect(t, &bad, 0, 1, &c), KOLO_EINVAL);
	ck_assert_ptr_null(c);
	ops->destroy(t);
	/* Bad configs: refused with the reason in the errbuf. */
	struct kolo_errbuf eb = {{0}};
	cfg.rank = 1;
	ck_assert_int_eq(ops->create(&cfg, &t, &eb), KOLO_EINVAL);
	ck_assert_ptr_nonnull(strstr(eb.msg, "rank 1 of 1"));
	cfg.rank = 0;
	cfg.iface = "no-such-if0";
	ck_assert_int_eq(ops->create(&cfg, &t, &eb), KOLO_EINVAL);
	ck_assert_ptr_nonnull(strstr(eb.msg, "no-such-if0"));
	ck_assert_int_eq(ops->create(&cfg, &t, NULL), KOLO_EINVAL); /* eb may be NULL */
}
END_TEST

/* A conn over IPv6 loopback, to itself (rank 0 of 1), when ::1 exists. */
START_TEST(ipv6_loopback)
{
	static const char token[] = "t";
	struct kolo_transport_config cfg = {.job = "j",
	                                    .round = 1,
	                                    .rank = 0,
	                                    .size = 1,
	                                    .token = (const uint8_t *)token,
	                                    .token_len = 1,
	                                    .timeout_ms = 5000,
	                                    .streams = 3,
	                                    .iface = "::1"};
	const struct kolo_transport_ops *ops = &kolo_transport_tcp_ops;
	struct kolo_transport *t = NULL;
	struct kolo_transport_handle h;
	ck_assert_int_eq(ops->create(&cfg, &t, NULL), KOLO_OK);
	if (ops->listen(t, &h) != KOLO_OK) {
		ops->destroy(t); /* no IPv6 here */
		return;
	}
	struct kolo_conn *out = NULL, *in = NULL;
	ck_assert_int_eq(ops->connect(t, &h, 0, 4, &out), KOLO_OK);
	uint64_t end = kolo_now_ms() + 5000;
	while (!in && kolo_now_ms() < end) {
		ck_assert_int_eq(ops->accept(t, 0, 4, &in), KOLO_OK);
		if (!in)
			ops->wait(t, 5);
	}
	ck_assert_ptr_nonnull(in);
	char sb[3000], rb[3000];
	for (size_t i = 0; i < sizeof(sb); i++)
		sb[i] = (char)(i * 7);
	struct kolo_req *rs = NULL, *rr = NULL;
	ck_assert_int_eq(ops->isend(out, sb, sizeof(sb), &rs), KOLO_OK);
	ck_assert_int_eq(ops->irecv(in, rb, sizeof(rb), &rr), KOLO_OK);
	bool ds = false, dr = false;
	while ((!ds || !dr) && kolo_now_ms() < end) {
		if (!ds)
			ck_assert_int_eq(ops->test(rs, &ds), KOLO_OK);
		if (!dr)
			ck_assert_int_eq(ops->test(rr, &dr), KOLO_OK);
		if (!ds || !dr)
			ops->wait(t, 5);
	}
	ck_assert(ds && dr);
	ck_assert_mem_eq(sb, rb, sizeof(sb));
	ops->close(out);
	ops->close(in);
	ops->destroy(t);
}
END_TEST

/* ---- a listener that does not hold the token ---------------------------- */

/* Plays the acceptor's side of the handshake by hand (docs/transport.md):
 * challenge, read the hello, accept it with a verdict whose MAC is made with
 * `token`, then count the bytes the connector sends before it closes. */
struct rogue {
	int lfd;
	const char *token;
	int hello_bytes; /* read of the hello */
	long data_bytes; /* received after the verdict */
	bool closed;     /* the connector closed or reset after the verdict */
};

static void le32(uint8_t *p, uint32_t v)
{
	v = htole32(v);
	memcpy(p, &v, 4);
}

static bool read_full(int fd, uint8_t *buf, size_t len, int timeout_ms)
{
	size_t got = 0;
	while (got < len) {
		struct pollfd p = {.fd = fd, .events = POLLIN};
		if (poll(&p, 1, timeout_ms) <= 0)
			return false;
		ssize_t n = recv(fd, buf + got, len - got, 0);
		if (n <= 0)
			return false;
		got += (size_t)n;
	}
	return true;
}

static void *rogue_main(void *arg)
{
	struct rogue *r = arg;
	struct pollfd lp = {.fd = r->lfd, .events = POLLIN};
	if (poll(&lp, 1, 5000) <= 0)
		return NULL;
	int fd = accept(r->lfd, NULL, NULL);
	if (fd < 0)
		return NULL;
	uint8_t ch[40] = {0}, hello[232], v[168] = {0}, msg[64 + 136];
	le32(ch, KOLO_TRANSPORT_MAGIC);
	le32(ch + 4, KOLO_WIRE_VERSION);
	for (int i = 0; i < 32; i++)
		ch[8 + i] = (uint8_t)(3 * i + 5);
	if (send(fd, ch, sizeof(ch), MSG_NOSIGNAL) != (ssize_t)sizeof(ch) ||
	    !read_full(fd, hello, sizeof(hello), 5000)) {
		close(fd);
		return NULL;
	}
	r->hello_bytes = (int)sizeof(hello);
	le32(v, KOLO_TRANSPORT_MAGIC); /* status 0: accepted */
	memcpy(v + 8, "accepted", 8);
	memcpy(msg, hello + 168, 32); /* the connector's nonce */
	memcpy(msg + 32, ch + 8, 32);
	memcpy(msg + 64, v, 136);
	kolo_hmac_sha256(r->token, strlen(r->token), msg, sizeof(msg), v + 136);
	if (send(fd, v, sizeof(v), MSG_NOSIGNAL) != (ssize_t)sizeof(v)) {
		close(fd);
		return NULL;
	}
	for (;;) {
		struct pollfd p = {.fd = fd, .events = POLLIN};
		if (poll(&p, 1, 3000) <= 0)
			break; /* neither data nor a close */
		char buf[4096];
		ssize_t n = recv(fd, buf, sizeof(buf), 0);
		if (n <= 0) {
			r->closed = true;
			break;
		}
		r->data_bytes += n;
		if (r->data_bytes >= 32 + 1000)
			break; /* chunk header and payload: the data reached us */
	}
	close(fd);
	return NULL;
}

/* Connects to a rogue listener that accepts with a MAC made from `token`,
 * sends 1000 bytes, and returns the send's final status (KOLO_OK when it
 * completed). The transport's token is "secret". */
static kolo_status_t send_to_rogue(const char *token, struct rogue *r)
{
	static const char secret[] = "secret";
	memset(r, 0, sizeof(*r));
	r->token = token;
	r->lfd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_storage ss = {0};
	struct sockaddr_in *a = (struct sockaddr_in *)&ss;
	a->sin_family = AF_INET;
	a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	socklen_t len = sizeof(*a);
	ck_assert_int_eq(bind(r->lfd, (struct sockaddr *)a, len), 0);
	ck_assert_int_eq(listen(r->lfd, 4), 0);
	ck_assert_int_eq(getsockname(r->lfd, (struct sockaddr *)&ss, &len), 0);
	struct kolo_transport_handle h;
	tcp_handle_encode(&ss, &h);
	pthread_t th;
	ck_assert_int_eq(pthread_create(&th, NULL, rogue_main, r), 0);

	struct kolo_transport_config cfg = {.job = "j",
	                                    .round = 1,
	                                    .rank = 0,
	                                    .size = 2,
	                                    .token = (const uint8_t *)secret,
	                                    .token_len = strlen(secret),
	                                    .timeout_ms = 5000,
	                                    .streams = 1,
	                                    .iface = "127.0.0.1"};
	const struct kolo_transport_ops *ops = &kolo_transport_tcp_ops;
	struct kolo_transport *t = NULL;
	ck_assert_int_eq(ops->create(&cfg, &t, NULL), KOLO_OK);
	struct kolo_conn *c = NULL;
	ck_assert_int_eq(ops->connect(t, &h, 1, 9, &c), KOLO_OK);
	char buf[1000];
	memset(buf, 0x5a, sizeof(buf));
	struct kolo_req *req = NULL;
	kolo_status_t st = ops->isend(c, buf, sizeof(buf), &req);
	bool done = false;
	uint64_t end = kolo_now_ms() + 8000;
	while (st == KOLO_OK && !done && kolo_now_ms() < end) {
		st = ops->test(req, &done);
		if (st == KOLO_OK && !done)
			ops->wait(t, 5);
	}
	if (st == KOLO_OK && !done)
		st = KOLO_ETIMEDOUT;
	ops->close(c);
	ops->destroy(t);
	pthread_join(th, NULL);
	close(r->lfd);
	return st;
}

START_TEST(acceptor_must_prove_token)
{
	struct rogue r;
	/* Control: a listener that holds the token is a peer; the data reaches it. */
	ck_assert_int_eq(send_to_rogue("secret", &r), KOLO_OK);
	ck_assert_int_eq(r.hello_bytes, 232);
	ck_assert_int_ge(r.data_bytes, 32 + 1000);
	/* One that does not gets an EAUTH at the verdict and not a byte of data. */
	ck_assert_int_eq(send_to_rogue("not-the-token", &r), KOLO_EAUTH);
	ck_assert_int_eq(r.hello_bytes, 232);
	ck_assert_int_eq(r.data_bytes, 0);
	ck_assert(r.closed);
}
END_TEST

static Suite *tcp_suite(void)
{
	Suite *s = suite_create("transport_tcp");
	TCase *tc = tcase_create("tcp");
	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, pick_literal_and_name);
	tcase_add_test(tc, pick_by_route);
	tcase_add_test(tc, handle_roundtrip);
	tcase_add_test(tc, ipv6_loopback);
	tcase_add_test(tc, acceptor_must_prove_token);
	suite_add_tcase(s, tc);
	return s;
}

KOLO_CHECK_MAIN(tcp_suite)
