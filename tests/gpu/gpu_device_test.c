/* On a machine with a GPU: device memory is recognised (gpu.h) and every
 * collective, blocking and async, refuses it with KOLO_EUNSUPPORTED and a
 * message naming the buffer, until the device data path exists. Elsewhere it
 * exits 77 (ctest: skipped) with the reason. Label gpu.
 *
 * The buffers come from the test's own dlopen of libcudart, not from kolo's
 * loader, so the classification is checked against allocations kolo did not
 * make. The comm is a fake whose ring is never touched (as in
 * runtime/api_test.c): a call that got past the checker would crash on it,
 * which fails the test. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu.h"
#include "runtime.h"
#include "testutil.h"
#include "kolo/async.h"

#define SIZE  2    /* ranks of the fake comm */
#define COUNT 1024 /* float elements per rank */

/* The few runtime entry points the test allocates with (int: cudaError_t). */
static int (*cuda_malloc)(void **, size_t);
static int (*cuda_malloc_managed)(void **, size_t, unsigned);
static int (*cuda_malloc_host)(void **, size_t);
static int (*cuda_free)(void *);
static int (*cuda_free_host)(void *);

static void resolve(void *h, const char *name, void *fn)
{
	void *p = dlsym(h, name);
	ck_assert_msg(p != NULL, "libcudart lacks %s", name);
	memcpy(fn, &p, sizeof(p));
}

static void load_cudart(void)
{
	const char *names[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so"};
	void *h = NULL;
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]) && !h; i++)
		h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
	ck_assert_msg(h != NULL, "kolo saw a GPU but the test cannot open libcudart");
	resolve(h, "cudaMalloc", &cuda_malloc);
	resolve(h, "cudaMallocManaged", &cuda_malloc_managed);
	resolve(h, "cudaMallocHost", &cuda_malloc_host);
	resolve(h, "cudaFree", &cuda_free);
	resolve(h, "cudaFreeHost", &cuda_free_host);
}

static struct kolo_comm comm;
static float *dev; /* SIZE x COUNT floats on GPU 0 */
static float host_a[SIZE * COUNT], host_b[SIZE * COUNT];
static size_t counts[SIZE] = {COUNT, COUNT};
static int callbacks;

static void setup(void)
{
	memset(&comm, 0, sizeof(comm));
	comm.ring = (struct kolo_ring_comm *)(uintptr_t)0x1;
	comm.assignment.rank = 0;
	comm.assignment.size = SIZE;
	comm.assignment.round = 1;
	load_cudart();
	void *p = NULL;
	ck_assert_int_eq(cuda_malloc(&p, sizeof(float) * SIZE * COUNT), 0);
	dev = p;
}

static void teardown(void)
{
	if (dev)
		cuda_free(dev);
	dev = NULL;
}

/* ---- classification ------------------------------------------------------ */

START_TEST(kinds)
{
	void *managed = NULL, *pinned = NULL;
	ck_assert_int_eq(cuda_malloc_managed(&managed, 4096, 1 /* cudaMemAttachGlobal */), 0);
	ck_assert_int_eq(cuda_malloc_host(&pinned, 4096), 0);
	float local[4];
	char *heap = malloc(4096);
	struct {
		const char *what;
		const void *ptr;
		enum kolo_mem_kind want;
	} cases[] = {
	        {"cudaMalloc", dev, KOLO_MEM_DEVICE},
	        {"cudaMalloc + 1000 elements", dev + 1000, KOLO_MEM_DEVICE},
	        {"cudaMallocManaged", managed, KOLO_MEM_MANAGED},
	        {"cudaMallocHost", pinned, KOLO_MEM_HOST},
	        {"malloc", heap, KOLO_MEM_HOST},
	        {"stack", local, KOLO_MEM_HOST},
	        {"static", host_a, KOLO_MEM_HOST},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		enum kolo_mem_kind k = kolo_mem_kind(cases[i].ptr);
		ck_assert_msg(k == cases[i].want, "%s: %s, want %s", cases[i].what,
		              kolo_mem_kind_name(k), kolo_mem_kind_name(cases[i].want));
	}
	/* Managed and pinned memory pass the checker: the CPU path reads them. */
	ck_assert_int_eq(kolo_args_buf(&comm, "allreduce", "sendbuf", managed, 16), KOLO_OK);
	ck_assert_int_eq(kolo_args_buf(&comm, "allreduce", "sendbuf", pinned, 16), KOLO_OK);
	cuda_free(managed);
	cuda_free_host(pinned);
	free(heap);
}
END_TEST

static double ns_per_call(const void *ptr, int n)
{
	struct timespec a, b;
	int sink = 0;
	clock_gettime(CLOCK_MONOTONIC, &a);
	for (int i = 0; i < n; i++)
		sink += kolo_mem_kind(ptr) == KOLO_MEM_DEVICE;
	clock_gettime(CLOCK_MONOTONIC, &b);
	ck_assert(sink == 0 || sink == n);
	return ((double)(b.tv_sec - a.tv_sec) * 1e9 + (double)(b.tv_nsec - a.tv_nsec)) / n;
}

/* A figure for docs/gpu.md, not a bound: printed, asserted only to exist. */
START_TEST(cost_per_call)
{
	enum { N = 200000 };
	double h = ns_per_call(host_a, N), d = ns_per_call(dev, N);
	printf("kolo_mem_kind: %.1f ns per call on a host pointer, %.1f ns on a device pointer "
	       "(cudaPointerGetAttributes, %d calls each)\n",
	       h, d, N);
	fflush(stdout);
	ck_assert(h > 0 && d > 0);
}
END_TEST

/* ---- every collective refuses device memory ------------------------------ */

enum coll {
	ALLREDUCE,
	ALLREDUCE_SCALED,
	BROADCAST,
	REDUCESCATTER,
	ALLGATHER,
	ALLGATHERV,
	ALLTOALL,
	ALLTOALLV,
	A_ALLREDUCE,
	A_BROADCAST,
	A_REDUCESCATTER,
	A_ALLGATHER,
	A_ALLTOALL,
	A_ALLTOALLV,
	A_GROUP,
};

struct call {
	enum coll coll;
	bool dev_send, dev_recv;
	const char *needle; /* "<collective>: <buffer> is CUDA device memory" */
};

static const struct call calls[] = {
        {ALLREDUCE, true, false, "allreduce: sendbuf is CUDA device memory"},
        {ALLREDUCE, false, true, "allreduce: recvbuf is CUDA device memory"},
        {ALLREDUCE, true, true, "allreduce: sendbuf is CUDA device memory"},
        {ALLREDUCE_SCALED, true, false, "allreduce: sendbuf is CUDA device memory"},
        {BROADCAST, false, true, "broadcast: buf is CUDA device memory"},
        {REDUCESCATTER, true, false, "reducescatter: sendbuf is CUDA device memory"},
        {REDUCESCATTER, false, true, "reducescatter: recvbuf is CUDA device memory"},
        {ALLGATHER, true, false, "allgather: sendbuf is CUDA device memory"},
        {ALLGATHER, false, true, "allgather: recvbuf is CUDA device memory"},
        {ALLGATHERV, true, false, "allgather: sendbuf is CUDA device memory"},
        {ALLGATHERV, false, true, "allgather: recvbuf is CUDA device memory"},
        {ALLTOALL, true, false, "alltoall: sendbuf is CUDA device memory"},
        {ALLTOALL, false, true, "alltoall: recvbuf is CUDA device memory"},
        {ALLTOALLV, true, false, "alltoall: sendbuf is CUDA device memory"},
        {ALLTOALLV, false, true, "alltoall: recvbuf is CUDA device memory"},
        {A_ALLREDUCE, true, false, "allreduce: sendbuf is CUDA device memory"},
        {A_ALLREDUCE, false, true, "allreduce: recvbuf is CUDA device memory"},
        {A_BROADCAST, false, true, "broadcast: buf is CUDA device memory"},
        {A_REDUCESCATTER, true, false, "reducescatter: sendbuf is CUDA device memory"},
        {A_REDUCESCATTER, false, true, "reducescatter: recvbuf is CUDA device memory"},
        {A_ALLGATHER, true, false, "allgather: sendbuf is CUDA device memory"},
        {A_ALLTOALL, true, false, "alltoall: sendbuf is CUDA device memory"},
        {A_ALLTOALLV, true, false, "alltoall: sendbuf is CUDA device memory"},
        {A_GROUP, true, false, "grouped allreduce: sendbufs[1] is CUDA device memory"},
        {A_GROUP, false, true, "grouped allreduce: recvbufs[1] is CUDA device memory"},
};

static void on_done(void *arg, kolo_status_t st)
{
	(void)arg;
	(void)st;
	callbacks++;
}

static kolo_status_t run(const struct call *k, kolo_handle_t **h)
{
	const float *s = k->dev_send ? dev : host_a;
	float *r = k->dev_recv ? dev : host_b;
	kolo_comm_t *c = &comm;
	static void *out;
	static size_t outcounts[SIZE];
	const char *names[2] = {"a", "b"};
	const void *sbufs[2] = {host_a, s};
	void *rbufs[2] = {host_b + COUNT, r};
	switch (k->coll) {
	case ALLREDUCE:
		return kolo_allreduce(c, s, r, COUNT, KOLO_FLOAT32, KOLO_SUM);
	case ALLREDUCE_SCALED:
		return kolo_allreduce_scaled(c, s, r, COUNT, KOLO_FLOAT32, KOLO_SUM, 0.5, 2.0);
	case BROADCAST:
		return kolo_broadcast(c, r, COUNT, KOLO_FLOAT32, 0);
	case REDUCESCATTER:
		return kolo_reducescatter(c, s, r, SIZE * COUNT, KOLO_FLOAT32, KOLO_SUM);
	case ALLGATHER:
		return kolo_allgather(c, s, r, COUNT, KOLO_FLOAT32);
	case ALLGATHERV:
		return kolo_allgatherv(c, s, COUNT, r, counts, KOLO_FLOAT32);
	case ALLTOALL:
		return kolo_alltoall(c, s, r, COUNT, KOLO_FLOAT32);
	case ALLTOALLV:
		return kolo_alltoallv(c, s, counts, r, counts, KOLO_FLOAT32);
	case A_ALLREDUCE:
		return kolo_allreduce_async(c, "t", s, r, COUNT, KOLO_FLOAT32, KOLO_SUM, 1.0, 1.0,
		                            on_done, NULL, h);
	case A_BROADCAST:
		return kolo_broadcast_async(c, "t", r, COUNT, KOLO_FLOAT32, 0, on_done, NULL, h);
	case A_REDUCESCATTER:
		return kolo_reducescatter_async(c, "t", s, r, SIZE * COUNT, KOLO_FLOAT32, KOLO_SUM,
		                                1.0, 1.0, on_done, NULL, h);
	case A_ALLGATHER:
		return kolo_allgather_async(c, "t", s, COUNT, KOLO_FLOAT32, &out, outcounts,
		                            on_done, NULL, h);
	case A_ALLTOALL:
		return kolo_alltoall_async(c, "t", s, SIZE * COUNT, NULL, KOLO_FLOAT32, &out,
		                           outcounts, on_done, NULL, h);
	case A_ALLTOALLV:
		return kolo_alltoall_async(c, "t", s, 0, counts, KOLO_FLOAT32, &out, outcounts,
		                           on_done, NULL, h);
	case A_GROUP:
		return kolo_grouped_allreduce_async(c, 2, names, sbufs, rbufs, counts, KOLO_FLOAT32,
		                                    KOLO_SUM, 1.0, 1.0, on_done, NULL, h);
	}
	ck_abort_msg("no such call");
	return KOLO_OK;
}

START_TEST(refused)
{
	const struct call *k = &calls[_i];
	comm.err.msg[0] = '\0';
	kolo_handle_t *h = (kolo_handle_t *)(uintptr_t)0x2;
	kolo_status_t st = run(k, &h);
	const char *msg = kolo_last_error(&comm);
	ck_assert_msg(st == KOLO_EUNSUPPORTED, "call %d: %s (%s)", _i, kolo_status_name(st), msg);
	ck_assert_msg(strstr(msg, k->needle), "call %d: \"%s\" lacks \"%s\"", _i, msg, k->needle);
	ck_assert_msg(strstr(msg, "not supported yet"), "call %d: \"%s\"", _i, msg);
	if (k->coll >= A_ALLREDUCE)
		ck_assert_msg(h == NULL, "call %d: a handle came back with an error", _i);
	ck_assert_int_eq(callbacks, 0);
}
END_TEST

static Suite *gpu_device_suite(void)
{
	Suite *s = suite_create("gpu_device");
	TCase *tc = tcase_create("device");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, kinds);
	tcase_add_test(tc, cost_per_call);
	tcase_add_loop_test(tc, refused, 0, (int)(sizeof(calls) / sizeof(calls[0])));
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	const char *why;
	if (!kolo_cuda_devices_visible(&why)) {
		printf("SKIP: no GPU visible: %s\n", why);
		return 77;
	}
	/* No fork per test: CUDA, initialised here by the check above, is not
	 * usable in a forked child. A crash still fails the test. */
	SRunner *sr = srunner_create(gpu_device_suite());
	srunner_set_fork_status(sr, CK_NOFORK);
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
