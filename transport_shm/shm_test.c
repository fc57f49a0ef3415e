/* Unit tests of the shared-memory transport: two endpoints in one process
 * (driven alternately from one thread), and a child process for crashes. */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"
#include "transport_shm.h"

static const struct kolo_transport_ops *ops = &kolo_transport_shm_ops;

static struct kolo_transport *make(int rank, int64_t round, const char *token,
                                   struct kolo_transport_handle *h)
{
	struct kolo_transport_config cfg = {
	        .job = "shmtest",
	        .round = round,
	        .rank = rank,
	        .size = 2,
	        .token = (const uint8_t *)token,
	        .token_len = strlen(token),
	        .timeout_ms = 2000,
	        .streams = 1,
	};
	struct kolo_transport *t = NULL;
	ck_assert_int_eq(ops->create(&cfg, &t, NULL), KOLO_OK);
	ck_assert_int_eq(ops->listen(t, h), KOLO_OK);
	return t;
}

/* Drives both endpoints until *done_a and *done_b or the deadline. */
static kolo_status_t drive(struct kolo_req *a, struct kolo_req *b, struct kolo_transport *ta,
                           struct kolo_transport *tb)
{
	bool da = a == NULL, db = b == NULL;
	uint64_t deadline = kolo_now_ms() + 10000;
	while (!(da && db) && kolo_now_ms() < deadline) {
		kolo_status_t st;
		if (!da && (st = ops->test(a, &da)) != KOLO_OK)
			return st;
		if (!db && (st = ops->test(b, &db)) != KOLO_OK)
			return st;
		if (!(da && db)) {
			ops->wait(ta, 0);
			ops->wait(tb, 0);
		}
	}
	return da && db ? KOLO_OK : KOLO_ETIMEDOUT;
}

/* Connects rank 0 → rank 1 with tag 7; returns both ends. */
static void pair(struct kolo_transport *t0, struct kolo_transport *t1,
                 const struct kolo_transport_handle *h1, struct kolo_conn **c0,
                 struct kolo_conn **c1)
{
	ck_assert_int_eq(ops->connect(t0, h1, 1, 7, c0), KOLO_OK);
	*c1 = NULL;
	uint64_t deadline = kolo_now_ms() + 5000;
	while (!*c1 && kolo_now_ms() < deadline) {
		/* The connector's handshake advances when its conn is tested. */
		struct kolo_req *r;
		bool done;
		ck_assert_int_eq(ops->isend(*c0, "", 0, &r), KOLO_OK);
		while (ops->test(r, &done) == KOLO_OK && !done && kolo_now_ms() < deadline) {
			ck_assert_int_eq(ops->accept(t1, 0, 7, c1), KOLO_OK);
			if (*c1) {
				/* Consume the zero-byte message on the other side. */
				struct kolo_req *rr;
				ck_assert_int_eq(ops->irecv(*c1, NULL, 0, &rr), KOLO_OK);
				ck_assert_int_eq(drive(r, rr, t0, t1), KOLO_OK);
				return;
			}
		}
		ck_assert(done);
	}
	ck_assert_ptr_nonnull(*c1);
}

START_TEST(messages_in_order)
{
	struct kolo_transport_handle h0, h1;
	struct kolo_transport *t0 = make(0, 1, "tok", &h0), *t1 = make(1, 1, "tok", &h1);
	struct kolo_conn *c0, *c1;
	pair(t0, t1, &h1, &c0, &c1);
	/* Sizes around and far above the ring (4 MiB) in both directions. */
	static const size_t sizes[] = {0, 1, 4095, 4096, 1 << 20, (4 << 20) + 3, 9 << 20};
	for (size_t i = 0; i < KOLO_ARRAY_SIZE(sizes); i++) {
		size_t n = sizes[i];
		uint8_t *src = malloc(n + 1), *dst = malloc(n + 1), *back = malloc(n + 1);
		for (size_t k = 0; k < n; k++)
			src[k] = (uint8_t)(k * 131 + i);
		struct kolo_req *s, *r, *s2, *r2;
		ck_assert_int_eq(kolo_isend(c0, src, n, &s), KOLO_OK);
		ck_assert_int_eq(kolo_irecv(c1, dst, n, &r), KOLO_OK);
		ck_assert_int_eq(kolo_irecv(c0, back, n, &r2), KOLO_OK);
		ck_assert_int_eq(kolo_isend(c1, src, n, &s2), KOLO_OK);
		ck_assert_int_eq(drive(s, r, t0, t1), KOLO_OK);
		kolo_status_t st2 = drive(s2, r2, t1, t0);
		ck_assert_msg(st2 == KOLO_OK, "size %zu: %s %s", n, kolo_status_name(st2),
		              t0->err.msg);
		ck_assert(memcmp(src, dst, n) == 0);
		ck_assert(memcmp(src, back, n) == 0);
		free(src);
		free(dst);
		free(back);
	}
	/* Many small messages outstanding at once keep their order. */
	enum { N = 64 };
	uint32_t in[N], out[N];
	struct kolo_req *sr[N], *rr[N];
	for (int i = 0; i < N; i++) {
		in[i] = (uint32_t)i * 2654435761u;
		ck_assert_int_eq(kolo_irecv(c1, &out[i], sizeof(uint32_t), &rr[i]), KOLO_OK);
	}
	for (int i = 0; i < N; i++)
		ck_assert_int_eq(kolo_isend(c0, &in[i], sizeof(uint32_t), &sr[i]), KOLO_OK);
	for (int i = 0; i < N; i++)
		ck_assert_int_eq(drive(sr[i], rr[i], t0, t1), KOLO_OK);
	ck_assert(memcmp(in, out, sizeof(in)) == 0);
	ops->close(c0);
	ops->close(c1);
	ops->destroy(t0);
	ops->destroy(t1);
}
END_TEST

static kolo_status_t connect_outcome(struct kolo_transport *t0, struct kolo_transport *t1,
                                     const struct kolo_transport_handle *h1)
{
	struct kolo_conn *c0, *c1 = NULL;
	ck_assert_int_eq(ops->connect(t0, h1, 1, 3, &c0), KOLO_OK);
	struct kolo_req *r;
	uint32_t x = 42;
	ck_assert_int_eq(kolo_isend(c0, &x, sizeof(x), &r), KOLO_OK);
	bool done = false;
	kolo_status_t st = KOLO_OK;
	uint64_t deadline = kolo_now_ms() + 5000;
	while (!done && st == KOLO_OK && kolo_now_ms() < deadline) {
		st = ops->test(r, &done);
		ck_assert_int_eq(ops->accept(t1, 0, 3, &c1), KOLO_OK);
		ck_assert_ptr_null(c1); /* a refused conn never reaches accept() */
	}
	ops->close(c0);
	return st;
}

START_TEST(refuses_wrong_token_round_and_job)
{
	struct kolo_transport_handle h0, h1;
	struct kolo_transport *t1 = make(1, 5, "right", &h1);
	struct kolo_transport *bad_tok = make(0, 5, "wrong", &h0);
	ck_assert_int_eq(connect_outcome(bad_tok, t1, &h1), KOLO_EAUTH);
	struct kolo_transport *stale = make(0, 4, "right", &h0);
	ck_assert_int_eq(connect_outcome(stale, t1, &h1), KOLO_EMEMBERSHIP);
	ops->destroy(bad_tok);
	ops->destroy(stale);
	ops->destroy(t1);
}
END_TEST

START_TEST(stray_bytes_refused_real_conn_works)
{
	struct kolo_transport_handle h0, h1;
	struct kolo_transport *t0 = make(0, 1, "tok", &h0), *t1 = make(1, 1, "tok", &h1);
	/* A stray client writes garbage to the listener. */
	int fd = socket(AF_UNIX, SOCK_STREAM, 0);
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	const char *name = (const char *)h1.bytes + 8;
	memcpy(sa.sun_path + 1, name, strlen(name));
	ck_assert_int_eq(
	        connect(fd, (struct sockaddr *)&sa,
	                (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(name))),
	        0);
	uint8_t junk[300];
	for (size_t i = 0; i < sizeof(junk); i++)
		junk[i] = (uint8_t)(i * 7 + 1);
	ck_assert_int_eq(write(fd, junk, sizeof(junk)), (ssize_t)sizeof(junk));
	struct kolo_conn *c0, *c1;
	pair(t0, t1, &h1, &c0, &c1);
	double a[1000], b[1000];
	for (int i = 0; i < 1000; i++)
		a[i] = i * 0.5;
	struct kolo_req *s, *r;
	ck_assert_int_eq(kolo_isend(c0, a, sizeof(a), &s), KOLO_OK);
	ck_assert_int_eq(kolo_irecv(c1, b, sizeof(b), &r), KOLO_OK);
	ck_assert_int_eq(drive(s, r, t0, t1), KOLO_OK);
	ck_assert(memcmp(a, b, sizeof(a)) == 0);
	/* The stray was answered with a refusal and closed. */
	uint8_t buf[64];
	ssize_t n, total = 0;
	while ((n = read(fd, buf, sizeof(buf))) > 0)
		total += n;
	/* EOF, or a reset because the refusal left junk unread. */
	ck_assert(n == 0 || (n < 0 && errno == ECONNRESET));
	ck_assert_int_gt(total, 0);
	close(fd);
	ops->close(c0);
	ops->close(c1);
	ops->destroy(t0);
	ops->destroy(t1);
}
END_TEST

START_TEST(killed_peer_is_an_error_at_once)
{
	struct kolo_transport_handle h0, h1;
	struct kolo_transport *t1 = make(1, 1, "tok", &h1);
	int ready[2];
	ck_assert_int_eq(pipe(ready), 0);
	pid_t pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		/* Child: rank 0 sends 1 MiB of a 64 MiB message, then waits to die. */
		struct kolo_transport *t0 = make(0, 1, "tok", &h0);
		struct kolo_conn *c0;
		if (ops->connect(t0, &h1, 1, 1, &c0) != KOLO_OK)
			_exit(1);
		size_t n = 64u << 20;
		uint8_t *buf = calloc(1, n);
		struct kolo_req *r;
		bool done = false;
		kolo_isend(c0, buf, n, &r);
		bool told = false;
		for (;;) {
			if (ops->test(r, &done) != KOLO_OK || done)
				_exit(2);
			if (!told) {
				ssize_t w = write(ready[1], "r", 1);
				(void)w;
				told = true;
			}
			ops->wait(t0, 100);
		}
	}
	close(ready[1]);
	struct kolo_conn *c1 = NULL;
	uint64_t deadline = kolo_now_ms() + 5000;
	while (!c1 && kolo_now_ms() < deadline) {
		ck_assert_int_eq(ops->accept(t1, 0, 1, &c1), KOLO_OK);
		ops->wait(t1, 50);
	}
	ck_assert_ptr_nonnull(c1);
	size_t n = 64u << 20;
	uint8_t *dst = malloc(n);
	struct kolo_req *r;
	ck_assert_int_eq(kolo_irecv(c1, dst, n, &r), KOLO_OK);
	char b;
	ck_assert_int_eq(read(ready[0], &b, 1), 1);
	/* The child has put part of the message in the ring (and blocks when it
	 * is full): kill it mid-message. */
	bool done = false;
	uint64_t t_kill = kolo_now_ms();
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	kolo_status_t st = KOLO_OK;
	while (st == KOLO_OK && !done && kolo_now_ms() < t_kill + 5000) {
		st = ops->test(r, &done);
		if (st == KOLO_OK && !done)
			ops->wait(t1, 100);
	}
	ck_assert_int_eq(st, KOLO_EPEER);
	/* Well inside the 2 s progress timeout: death is seen, not timed out. */
	ck_assert_uint_lt(kolo_now_ms() - t_kill, 1500);
	free(dst);
	ops->close(c1);
	ops->destroy(t1);
	close(ready[0]);
}
END_TEST

START_TEST(abort_wakes_wait)
{
	struct kolo_transport_handle h;
	struct kolo_transport *t = make(0, 1, "tok", &h);
	ops->abort(t, KOLO_EMEMBERSHIP);
	uint64_t t0 = kolo_now_ms();
	ck_assert_int_eq(ops->wait(t, 5000), KOLO_EMEMBERSHIP);
	ck_assert_uint_lt(kolo_now_ms() - t0, 1000);
	ops->destroy(t);
}
END_TEST

static Suite *shm_suite(void)
{
	Suite *s = suite_create("transport_shm");
	TCase *tc = tcase_create("shm");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, messages_in_order);
	tcase_add_test(tc, refuses_wrong_token_round_and_job);
	tcase_add_test(tc, stray_bytes_refused_real_conn_works);
	tcase_add_test(tc, killed_peer_is_an_error_at_once);
	tcase_add_test(tc, abort_wakes_wait);
	suite_add_tcase(s, tc);
	return s;
}

KOLO_CHECK_MAIN(shm_suite)
