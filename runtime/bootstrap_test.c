/* kolo/bootstrap.h: comms built from caller-exchanged cards. The ranks are
 * forked processes that exchange host names and cards through a shared
 * mapping with a process-shared barrier, as a caller would through its own
 * store; their allreduce is checked against a sum computed here. */
#include <check.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kolo/async.h"
#include "kolo/bootstrap.h"
#include "kolo/elastic.h"
#include "bootstrap_fork.h"
#include "testutil.h"

#define MAX_RANKS 4
#define COUNT     4099

struct exchange {
	struct bootstrap_fork base;
	int local_rank[MAX_RANKS], local_size[MAX_RANKS];
	int cross_rank[MAX_RANKS], cross_size[MAX_RANKS];
	int status[MAX_RANKS];
};

static struct exchange *exchange_new(int n)
{
	struct exchange *x = bootstrap_fork_new(n, sizeof(*x));
	ck_assert_ptr_nonnull(x);
	return x;
}

/* One rank: the three steps, an allreduce, an async allgather and a ring of
 * sends and receives, then a
 * barrier through the exchange before finalizing (the caller's job). Returns
 * 0 when every result matched. host: this rank's host name (KOLO_HOSTNAME). */
static int run_rank(struct exchange *x, int rank, int n, const char *host)
{
	struct kolo_bootstrap_config cfg = {.rank = rank,
	                                    .size = n,
	                                    .job = "bootstrap-test",
	                                    .token = "secret",
	                                    .timeout_ms = 20000};
	kolo_comm_t *comm;
	int failed = bootstrap_fork_join(&x->base, &cfg, host, &comm);
	if (failed)
		return 9 + failed;
	int bad = 0;
	if (kolo_rank(comm) != rank || kolo_size(comm) != n || kolo_elastic_enabled(comm))
		bad = 13;
	x->local_rank[rank] = kolo_local_rank(comm);
	x->local_size[rank] = kolo_local_size(comm);
	x->cross_rank[rank] = kolo_cross_rank(comm);
	x->cross_size[rank] = kolo_cross_size(comm);
	double *v = malloc(COUNT * sizeof(double));
	for (int i = 0; i < COUNT; i++)
		v[i] = (double)(rank + 1) * i;
	if (kolo_allreduce(comm, v, v, COUNT, KOLO_FLOAT64, KOLO_SUM) != KOLO_OK)
		bad = 14;
	for (int i = 0; i < COUNT && !bad; i++)
		if (v[i] != (double)n * (n + 1) / 2 * i)
			bad = 15;
	int32_t mine[2] = {rank, -rank};
	void *all = NULL;
	size_t counts[MAX_RANKS];
	kolo_handle_t *h;
	if (kolo_allgather_async(comm, "g", mine, 2, KOLO_INT32, &all, counts, NULL, NULL, &h) !=
	            KOLO_OK ||
	    kolo_wait(h) != KOLO_OK)
		bad = 16;
	for (int r = 0; r < n && !bad; r++)
		if (counts[r] != 2 || ((int32_t *)all)[2 * r] != r ||
		    ((int32_t *)all)[2 * r + 1] != -r)
			bad = 17;
	kolo_free(all);
	free(v);
	/* Point-to-point around the ring, on the endpoints of the cards: a recv
	 * from any source names the left neighbour. */
	int64_t out[64], in[64];
	for (int i = 0; i < 64; i++)
		out[i] = rank * 1000 + i;
	int source = -1;
	kolo_handle_t *sh = NULL;
	if (kolo_send_async(comm, out, sizeof(out), (rank + 1) % n, 7, NULL, NULL, &sh) !=
	            KOLO_OK ||
	    kolo_recv(comm, in, sizeof(in), KOLO_ANY_SOURCE, 7, &source) != KOLO_OK ||
	    kolo_wait(sh) != KOLO_OK)
		bad = 19;
	const int left = (rank + n - 1) % n;
	for (int i = 0; i < 64 && !bad; i++)
		if (source != left || in[i] != left * 1000 + i)
			bad = 20;
	if (kolo_reform(comm) != KOLO_EINVAL)
		bad = 18;
	pthread_barrier_wait(&x->base.barrier);
	kolo_finalize(comm);
	return bad;
}

/* Forks n ranks with the given host names and waits for them (bounded by
 * Check's per-test timeout). */
static void run_job(struct exchange *x, int n, const char *const *hosts)
{
	pid_t pid[MAX_RANKS];
	for (int r = 0; r < n; r++) {
		pid[r] = fork();
		ck_assert_int_ge(pid[r], 0);
		if (pid[r] == 0)
			_exit(run_rank(x, r, n, hosts[r]));
	}
	for (int r = 0; r < n; r++) {
		int ws;
		ck_assert_int_eq(waitpid(pid[r], &ws, 0), pid[r]);
		ck_assert_msg(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "rank %d: status 0x%x", r, ws);
	}
}

START_TEST(test_one_host)
{
	const char *hosts[] = {"hostA", "hostA", "hostA"};
	struct exchange *x = exchange_new(3);
	run_job(x, 3, hosts);
	for (int r = 0; r < 3; r++) {
		ck_assert_int_eq(x->local_rank[r], r);
		ck_assert_int_eq(x->local_size[r], 3);
		ck_assert_int_eq(x->cross_rank[r], 0);
		ck_assert_int_eq(x->cross_size[r], 1);
	}
	munmap(x, sizeof(*x));
}
END_TEST

/* Hosts interleaved by rank (as torchrun may number them): local ranks in
 * rank order per host, TCP between hosts, shared memory inside. */
START_TEST(test_two_hosts_interleaved)
{
	const char *hosts[] = {"hostA", "hostB", "hostA", "hostB"};
	struct exchange *x = exchange_new(4);
	run_job(x, 4, hosts);
	const int local[] = {0, 0, 1, 1}, cross[] = {0, 1, 0, 1};
	for (int r = 0; r < 4; r++) {
		ck_assert_int_eq(x->local_rank[r], local[r]);
		ck_assert_int_eq(x->local_size[r], 2);
		ck_assert_int_eq(x->cross_rank[r], cross[r]);
		ck_assert_int_eq(x->cross_size[r], 2);
	}
	munmap(x, sizeof(*x));
}
END_TEST

START_TEST(test_single_rank)
{
	struct kolo_bootstrap_config cfg = {.rank = 0, .size = 1};
	kolo_bootstrap_t *b;
	ck_assert_int_eq(kolo_bootstrap_create(&cfg, &b), KOLO_OK);
	const char *hosts[] = {kolo_bootstrap_host(b)};
	uint8_t card[KOLO_BOOTSTRAP_CARD_SIZE];
	ck_assert_int_eq(kolo_bootstrap_listen(b, hosts, card), KOLO_OK);
	kolo_comm_t *comm;
	ck_assert_int_eq(kolo_bootstrap_connect(b, card, &comm), KOLO_OK);
	float v[3] = {1, 2, 3};
	ck_assert_int_eq(kolo_allreduce(comm, v, v, 3, KOLO_FLOAT32, KOLO_AVERAGE), KOLO_OK);
	ck_assert(v[0] == 1 && v[1] == 2 && v[2] == 3);
	ck_assert_int_eq(kolo_finalize(comm), KOLO_OK);
}
END_TEST

START_TEST(test_bad_calls)
{
	kolo_bootstrap_t *b = (kolo_bootstrap_t *)1;
	struct kolo_bootstrap_config cfg = {.rank = 2, .size = 2};
	ck_assert_int_eq(kolo_bootstrap_create(&cfg, &b), KOLO_EINVAL);
	ck_assert_ptr_null(b);
	ck_assert_msg(strstr(kolo_init_error(), "rank 2, size 2"), "%s", kolo_init_error());
	ck_assert_int_eq(kolo_bootstrap_create(NULL, &b), KOLO_EINVAL);
	/* This rank's entry in hosts must be its own host name. */
	cfg.rank = 0;
	setenv("KOLO_HOSTNAME", "hostA", 1);
	ck_assert_int_eq(kolo_bootstrap_create(&cfg, &b), KOLO_OK);
	const char *hosts[] = {"hostB", "hostA"};
	uint8_t card[KOLO_BOOTSTRAP_CARD_SIZE];
	ck_assert_int_eq(kolo_bootstrap_listen(b, hosts, card), KOLO_EINVAL);
	ck_assert_msg(strstr(kolo_init_error(), "hosts[0]"), "%s", kolo_init_error());
	/* connect before a successful listen is refused and consumes b. */
	kolo_comm_t *comm = (kolo_comm_t *)1;
	ck_assert_int_eq(kolo_bootstrap_connect(b, card, &comm), KOLO_EINVAL);
	ck_assert_ptr_null(comm);
	kolo_bootstrap_destroy(NULL);
}
END_TEST

static Suite *bootstrap_suite(void)
{
	Suite *s = suite_create("bootstrap");
	TCase *tc = tcase_create("bootstrap");
	tcase_add_test(tc, test_one_host);
	tcase_add_test(tc, test_two_hosts_interleaved);
	tcase_add_test(tc, test_single_rank);
	tcase_add_test(tc, test_bad_calls);
	suite_add_tcase(s, tc);
	return s;
}

KOLO_CHECK_MAIN(bootstrap_suite)
