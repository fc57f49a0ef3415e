/* Unit tests of the liveness probe (tcp_probe.c) on loopback: a peer that
 * answers is never lost, however long it runs; one that closes is not lost
 * either; a host that does not answer (a listener whose accept queue is full
 * drops the SYN, as a vanished host would) is lost within the timeout and
 * the notify eventfd is written. The multi-host behaviour (a cut link, a
 * partition, a SIGSTOP) is tested on namespace hosts by netns_vanish. */
#include <arpa/inet.h>
#include <check.h>
#include <netinet/in.h>
#include <poll.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tcp_internal.h"
#include "testutil.h"

#define PERIOD_MS  20
#define TIMEOUT_MS 300

static struct sockaddr_storage loopback(socklen_t *len)
{
	struct sockaddr_storage ss;
	memset(&ss, 0, sizeof(ss));
	struct sockaddr_in *a = (struct sockaddr_in *)&ss;
	a->sin_family = AF_INET;
	a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	*len = sizeof(*a);
	return ss;
}

static struct tcp_probe *start(int notify_fd)
{
	socklen_t len;
	struct sockaddr_storage ss = loopback(&len);
	struct tcp_probe_config cfg = {.period_ms = PERIOD_MS,
	                               .timeout_ms = TIMEOUT_MS,
	                               .addr = &ss,
	                               .addrlen = len,
	                               .notify_fd = notify_fd};
	struct tcp_probe *p = NULL;
	struct kolo_errbuf eb = {{0}};
	ck_assert_int_eq(tcp_probe_start(&cfg, &p, &eb), KOLO_OK);
	ck_assert_uint_ne(tcp_probe_port(p), 0);
	return p;
}

/* Whether fd becomes readable within ms. */
static bool readable_within(int fd, int ms)
{
	struct pollfd pfd = {.fd = fd, .events = POLLIN};
	return poll(&pfd, 1, ms) == 1;
}

START_TEST(answering_peer_is_not_lost)
{
	int notify = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	struct tcp_probe *a = start(notify), *b = start(-1);
	socklen_t len;
	struct sockaddr_storage ss = loopback(&len);
	tcp_probe_watch(a, 1, &ss, len, tcp_probe_port(b));
	tcp_probe_watch(a, 1, &ss, len, tcp_probe_port(b)); /* a second watch is ignored */
	/* Ten timeouts' worth of probing: b's kernel acknowledges every byte and
	 * b's thread drains them. */
	ck_assert(!readable_within(notify, 10 * TIMEOUT_MS));
	ck_assert(!tcp_probe_pending(a));
	ck_assert(!tcp_probe_lost(a, 1));
	/* Each beat found the last one acknowledged; rank 2 is not probed. */
	ck_assert_int_eq(tcp_probe_unacked_ms(a, 1), 0);
	ck_assert_int_eq(tcp_probe_unacked_ms(a, 2), -1);
	/* b goes away: its kernel closes the probe, which is an answer. */
	tcp_probe_stop(b);
	ck_assert(!readable_within(notify, 3 * TIMEOUT_MS));
	ck_assert(!tcp_probe_lost(a, 1));
	tcp_probe_stop(a);
	close(notify);
}
END_TEST

START_TEST(silent_host_is_lost)
{
	int notify = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	struct tcp_probe *a = start(notify);
	/* A listener that never accepts, its queue filled: the kernel drops
	 * every further SYN without a word, as a host that vanished. */
	socklen_t len;
	struct sockaddr_storage ss = loopback(&len);
	int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	ck_assert_int_ge(l, 0);
	ck_assert_int_eq(bind(l, (struct sockaddr *)&ss, len), 0);
	ck_assert_int_eq(listen(l, 0), 0);
	socklen_t sl = sizeof(ss);
	getsockname(l, (struct sockaddr *)&ss, &sl);
	uint16_t port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
	int fill[4];
	for (int i = 0; i < 4; i++) {
		fill[i] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
		connect(fill[i], (struct sockaddr *)&ss, sl); /* in progress or queued */
	}
	ck_assert(!tcp_probe_lost(a, 3));
	uint64_t t0 = kolo_now_ms();
	tcp_probe_watch(a, 3, &ss, sl, port);
	ck_assert_msg(readable_within(notify, 10 * TIMEOUT_MS), "no loss within %d ms",
	              10 * TIMEOUT_MS);
	uint64_t took = kolo_now_ms() - t0;
	ck_assert_uint_ge(took, TIMEOUT_MS / 2);
	ck_assert(tcp_probe_pending(a));
	ck_assert(tcp_probe_lost(a, 3));
	ck_assert(!tcp_probe_lost(a, 2));
	tcp_probe_ack(a);
	ck_assert(!tcp_probe_pending(a));
	ck_assert(tcp_probe_lost(a, 3)); /* a loss is for good */
	for (int i = 0; i < 4; i++)
		close(fill[i]);
	close(l);
	tcp_probe_stop(a);
	close(notify);
}
END_TEST

static Suite *probe_suite(void)
{
	Suite *s = suite_create("tcp_probe");
	TCase *tc = tcase_create("probe");
	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, answering_peer_is_not_lost);
	tcase_add_test(tc, silent_host_is_lost);
	suite_add_tcase(s, tc);
	return s;
}

KOLO_CHECK_MAIN(probe_suite)
