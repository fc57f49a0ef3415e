/* Unit tests of transport_tcp: address choice, the listen handle, IPv6. The
 * transport's behaviour is tested by tests/transport/ (conformance, faults). */
#include <arpa/inet.h>
#include <check.h>
#include <netinet/in.h>
#include <string.h>

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
	ck_assert_int_eq(ops->create(&cfg, &t), KOLO_OK);
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
	/* Bad configs. */
	cfg.rank = 1;
	ck_assert_int_eq(ops->create(&cfg, &t), KOLO_EINVAL);
	cfg.rank = 0;
	cfg.iface = "no-such-if0";
	ck_assert_int_eq(ops->create(&cfg, &t), KOLO_EINVAL);
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
	ck_assert_int_eq(ops->create(&cfg, &t), KOLO_OK);
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

static Suite *tcp_suite(void)
{
	Suite *s = suite_create("transport_tcp");
	TCase *tc = tcase_create("tcp");
	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, pick_literal_and_name);
	tcase_add_test(tc, pick_by_route);
	tcase_add_test(tc, handle_roundtrip);
	tcase_add_test(tc, ipv6_loopback);
	suite_add_tcase(s, tc);
	return s;
}

KOLO_CHECK_MAIN(tcp_suite)
