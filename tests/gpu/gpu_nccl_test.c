/* NCCL inside a host (runtime/device_nccl.c) over the fake libcudart and
 * libnccl of tests/gpu/fake (LD_LIBRARY_PATH, set by CTest). The ranks are
 * forked processes on "hosts" named by KOLO_HOSTNAME, joined with the
 * bootstrap API through a shared mapping. Each rank holds its buffers in
 * fake device memory (which the host cannot touch: a stray host access would
 * crash the rank), on its own fake GPU or a shared one, and every result is
 * checked against a float64 reference computed here. Whether NCCL ran is
 * read from the fake's copy counters: the staged path copies the payload
 * from the device to the host, NCCL does not. */
#include <check.h>
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kolo/async.h"
#include "bootstrap_fork.h"
#include "kolo/bootstrap.h"
#include "testutil.h"

#define MAX_RANKS 4

/* The few fake runtime calls the test makes (dlsym: the test links no
 * CUDA library; libkolo opens the same libcudart.so.13). */
static int (*cuda_malloc)(void **, size_t);
static int (*cuda_free)(void *);
static int (*cuda_memcpy)(void *, const void *, size_t, int);
static int (*cuda_set_device)(int);
static void (*fake_stats)(uint64_t bytes[4], uint64_t ops[4]);
enum { H2D = 1, D2H = 2 }; /* cudaMemcpyKind */

static void *sym(void *h, const char *name)
{
	void *p = dlsym(h, name);
	ck_assert_msg(p != NULL, "fake libcudart lacks %s", name);
	return p;
}

static bool load_fake(void)
{
	void *h = dlopen("libcudart.so.13", RTLD_NOW | RTLD_LOCAL);
	if (!h || !dlsym(h, "kolo_fake_cuda_stats"))
		return false;
	void *p;
	p = sym(h, "cudaMalloc");
	memcpy(&cuda_malloc, &p, sizeof(p));
	p = sym(h, "cudaFree");
	memcpy(&cuda_free, &p, sizeof(p));
	p = sym(h, "cudaMemcpy");
	memcpy(&cuda_memcpy, &p, sizeof(p));
	p = sym(h, "cudaSetDevice");
	memcpy(&cuda_set_device, &p, sizeof(p));
	p = sym(h, "kolo_fake_cuda_stats");
	memcpy(&fake_stats, &p, sizeof(p));
	return true;
}

static uint64_t d2h_bytes(void)
{
	uint64_t b[4];
	fake_stats(b, NULL);
	return b[D2H];
}

/* Rank r's input element i: small integers, exact in every float type. */
static double input(int r, size_t i)
{
	return (double)((int)((i * 7 + (size_t)r * 13) % 23) - 11);
}

struct plan {
	int n, hosts;     /* ranks, hosts (n / hosts ranks on each) */
	bool shared_gpu;  /* every rank of a host on GPU 0 */
	bool expect_nccl; /* whether the payload must stay on the device */
};

#define FAIL(code, ...)                                                                            \
	do {                                                                                       \
		fprintf(stderr, "rank %d: ", rank);                                                \
		fprintf(stderr, __VA_ARGS__);                                                      \
		fprintf(stderr, "\n");                                                             \
		return code;                                                                       \
	} while (0)

/* An allreduce of count float32 on the device, op and scales, checked. */
static int check_allreduce(kolo_comm_t *comm, int rank, const struct plan *p, size_t count,
                           kolo_op_t op, double pre, double post, bool async)
{
	float *h = malloc(count * sizeof(float));
	void *d = NULL;
	if (!h || cuda_malloc(&d, count * sizeof(float)) != 0)
		FAIL(20, "alloc");
	for (size_t i = 0; i < count; i++)
		h[i] = (float)input(rank, i);
	cuda_memcpy(d, h, count * sizeof(float), H2D);
	uint64_t before = d2h_bytes();
	kolo_status_t st;
	if (async) {
		kolo_handle_t *hd;
		st = kolo_allreduce_async(comm, "g", d, d, count, KOLO_FLOAT32, op, pre, post, NULL,
		                          NULL, &hd);
		if (st == KOLO_OK)
			st = kolo_wait(hd);
	} else {
		st = kolo_allreduce_scaled(comm, d, d, count, KOLO_FLOAT32, op, pre, post);
	}
	if (st != KOLO_OK)
		FAIL(21, "allreduce of %zu: %s", count, kolo_last_error(comm));
	uint64_t moved = d2h_bytes() - before;
	cuda_memcpy(h, d, count * sizeof(float), D2H);
	for (size_t i = 0; i < count; i++) {
		double want = op == KOLO_MIN ? INFINITY : op == KOLO_MAX ? -INFINITY : 0;
		for (int r = 0; r < p->n; r++) {
			double v = pre * input(r, i);
			want = op == KOLO_MIN   ? fmin(want, v)
			       : op == KOLO_MAX ? fmax(want, v)
			                        : want + v;
		}
		if (op == KOLO_AVERAGE)
			want /= p->n;
		want *= post;
		if (fabs(h[i] - want) > 1e-4 * (1 + fabs(want)))
			FAIL(22, "allreduce of %zu (op %d): [%zu] = %g, want %g", count, (int)op, i,
			     (double)h[i], want);
	}
	/* The staged path moves at least this rank's share of the payload
	 * to the host; NCCL inside one host moves none. */
	size_t bytes = count * sizeof(float);
	if (p->expect_nccl && p->hosts == 1 && moved != 0)
		FAIL(23, "NCCL path expected, but %llu bytes went to the host",
		     (unsigned long long)moved);
	const size_t L = (size_t)(p->n / p->hosts);
	if (p->expect_nccl && p->hosts > 1 && moved > bytes / L + L * sizeof(float))
		FAIL(24, "hierarchy expected: %llu of %zu bytes went to the host",
		     (unsigned long long)moved, bytes);
	if (!p->expect_nccl && moved < bytes / (size_t)p->n)
		FAIL(25, "staged path expected, but only %llu bytes went to the host",
		     (unsigned long long)moved);
	cuda_free(d);
	free(h);
	return 0;
}

static int check_gather_bcast(kolo_comm_t *comm, int rank, const struct plan *p)
{
	const size_t count = 1003;
	const int n = p->n;
	float *h = malloc(count * (size_t)n * sizeof(float));
	void *ds = NULL, *dr = NULL;
	if (!h || cuda_malloc(&ds, count * sizeof(float)) != 0 ||
	    cuda_malloc(&dr, count * (size_t)n * sizeof(float)) != 0)
		FAIL(30, "alloc");
	for (size_t i = 0; i < count; i++)
		h[i] = (float)input(rank, i);
	cuda_memcpy(ds, h, count * sizeof(float), H2D);
	if (kolo_allgather(comm, ds, dr, count, KOLO_FLOAT32) != KOLO_OK)
		FAIL(31, "allgather: %s", kolo_last_error(comm));
	cuda_memcpy(h, dr, count * (size_t)n * sizeof(float), D2H);
	for (int r = 0; r < n; r++)
		for (size_t i = 0; i < count; i++)
			if (h[(size_t)r * count + i] != (float)input(r, i))
				FAIL(32, "allgather [%d][%zu] = %g", r, i,
				     (double)h[(size_t)r * count + i]);
	/* Broadcast from the last rank. */
	for (size_t i = 0; i < count; i++)
		h[i] = (float)input(rank, i);
	cuda_memcpy(ds, h, count * sizeof(float), H2D);
	if (kolo_broadcast(comm, ds, count, KOLO_FLOAT32, n - 1) != KOLO_OK)
		FAIL(33, "broadcast: %s", kolo_last_error(comm));
	cuda_memcpy(h, ds, count * sizeof(float), D2H);
	for (size_t i = 0; i < count; i++)
		if (h[i] != (float)input(n - 1, i))
			FAIL(34, "broadcast [%zu] = %g", i, (double)h[i]);
	/* Reducescatter of equal blocks, into a host buffer (mixed kinds). */
	float *hs = malloc(count * (size_t)n * sizeof(float));
	for (size_t i = 0; i < count * (size_t)n; i++)
		hs[i] = (float)input(rank, i);
	cuda_memcpy(dr, hs, count * (size_t)n * sizeof(float), H2D);
	if (kolo_reducescatter(comm, dr, h, count * (size_t)n, KOLO_FLOAT32, KOLO_SUM) != KOLO_OK)
		FAIL(35, "reducescatter: %s", kolo_last_error(comm));
	for (size_t i = 0; i < count; i++) {
		double want = 0;
		for (int r = 0; r < n; r++)
			want += input(r, (size_t)rank * count + i);
		if (h[i] != (float)want)
			FAIL(36, "reducescatter [%zu] = %g, want %g", i, (double)h[i], want);
	}
	free(hs);
	cuda_free(ds);
	cuda_free(dr);
	free(h);
	return 0;
}

static int run_rank(struct bootstrap_fork *x, int rank, const struct plan *p)
{
	const int L = p->n / p->hosts;
	char host[32];
	snprintf(host, sizeof(host), "gpuhost%d", rank / L);
	if (cuda_set_device(p->shared_gpu ? 0 : rank % L) != 0)
		FAIL(10, "cudaSetDevice");
	struct kolo_bootstrap_config cfg = {
	        .rank = rank, .size = p->n, .job = "gpu-nccl-test", .timeout_ms = 20000};
	kolo_comm_t *comm;
	if (bootstrap_fork_join(x, &cfg, host, &comm) != 0)
		FAIL(11, "join failed");
	if (kolo_local_size(comm) != L || kolo_cross_size(comm) != p->hosts)
		FAIL(12, "local %d cross %d", kolo_local_size(comm), kolo_cross_size(comm));
	static const size_t counts[] = {1, 5, 4096, 100003, 262147};
	int bad = 0;
	for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]) && !bad; k++)
		bad = check_allreduce(comm, rank, p, counts[k], KOLO_SUM, 1, 1, false);
	if (!bad)
		bad = check_allreduce(comm, rank, p, 77777, KOLO_AVERAGE, 1, 1, false);
	if (!bad)
		bad = check_allreduce(comm, rank, p, 77777, KOLO_AVERAGE, 0.5, 3, true);
	if (!bad)
		bad = check_allreduce(comm, rank, p, 9999, KOLO_SUM, 0.25, 2, true);
	if (!bad)
		bad = check_allreduce(comm, rank, p, 30001, KOLO_MAX, 1, 1, false);
	if (!bad)
		bad = check_allreduce(comm, rank, p, 30001, KOLO_MIN, 1, 1, true);
	if (!bad)
		bad = check_gather_bcast(comm, rank, p);
	pthread_barrier_wait(&x->barrier);
	kolo_finalize(comm);
	return bad;
}

static void run_job(const struct plan *p)
{
	if (!load_fake()) {
		fprintf(stderr, "SKIP: the fake libcudart.so.13 is not on LD_LIBRARY_PATH\n");
		return;
	}
	struct bootstrap_fork *x = bootstrap_fork_new(p->n, sizeof(*x));
	ck_assert_ptr_nonnull(x);
	pid_t pids[MAX_RANKS];
	for (int r = 0; r < p->n; r++) {
		pids[r] = fork();
		ck_assert_int_ge(pids[r], 0);
		if (pids[r] == 0) {
			alarm(50); /* a hang kills the rank, and the test fails */
			_exit(run_rank(x, r, p));
		}
	}
	for (int r = 0; r < p->n; r++) {
		int wst;
		ck_assert_int_eq(waitpid(pids[r], &wst, 0), pids[r]);
		ck_assert_msg(WIFEXITED(wst), "rank %d died with signal %d", r,
		              WIFSIGNALED(wst) ? WTERMSIG(wst) : 0);
		ck_assert_msg(WEXITSTATUS(wst) == 0, "rank %d failed with %d (its stderr says why)",
		              r, WEXITSTATUS(wst));
	}
	munmap(x, sizeof(*x));
}

START_TEST(one_host_two_gpus)
{
	struct plan p = {.n = 2, .hosts = 1, .expect_nccl = true};
	run_job(&p);
}
END_TEST

START_TEST(one_host_three_gpus)
{
	struct plan p = {.n = 3, .hosts = 1, .expect_nccl = true};
	run_job(&p);
}
END_TEST

START_TEST(two_hosts_two_gpus_each)
{
	struct plan p = {.n = 4, .hosts = 2, .expect_nccl = true};
	run_job(&p);
}
END_TEST

START_TEST(two_ranks_share_a_gpu)
{
	struct plan p = {.n = 2, .hosts = 1, .shared_gpu = true, .expect_nccl = false};
	run_job(&p);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("gpu_nccl");
	TCase *tc = tcase_create("nccl");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, one_host_two_gpus);
	tcase_add_test(tc, one_host_three_gpus);
	tcase_add_test(tc, two_hosts_two_gpus_each);
	tcase_add_test(tc, two_ranks_share_a_gpu);
	suite_add_tcase(s, tc);
	return s;
}

KOLO_CHECK_MAIN(suite)
