/* On a machine with a GPU (label gpu) or over the fake runtime (label cuda):
 * device memory is recognised (gpu.h), and every collective's argument
 * checker accepts it and counts it as device memory, which sends the call
 * down the device path (the collectives themselves: gpu_coll_worker.c).
 * Elsewhere it exits 77 (ctest: skipped) with the reason.
 *
 * The buffers come from the test's own dlopen of libcudart, not from kolo's
 * loader, so the classification is checked against allocations kolo did not
 * make. The comm is a fake whose ring is never touched (as in
 * runtime/api_test.c): only the checkers run. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu.h"
#include "runtime.h"
#include "testutil.h"

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
	/* Managed and pinned memory pass the checker as host memory: the CPU
	 * path reads them. */
	kolo_args_mem_reset();
	ck_assert_int_eq(kolo_args_buf(&comm, "allreduce", "sendbuf", managed, 16), KOLO_OK);
	ck_assert_int_eq(kolo_args_buf(&comm, "allreduce", "sendbuf", pinned, 16), KOLO_OK);
	ck_assert_int_eq(kolo_args_mem_device(), 0);
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

/* ---- every collective's checker accepts device memory ------------------- */

/* Each family's checks with device buffers where the call has them: they
 * pass (the data path can run here), and kolo_args_mem_device counts the
 * device buffers, which is how api.c and async.c choose the device path. */
START_TEST(accepted)
{
	const char *names[2] = {"a", "b"};
	const void *sbufs[2] = {host_a, dev};
	void *rbufs[2] = {host_b, dev + COUNT};
#define CASE(w, call, nd)                                                                          \
	do {                                                                                       \
		kolo_args_mem_reset();                                                             \
		kolo_status_t st_ = (call);                                                        \
		ck_assert_msg(st_ == KOLO_OK, "%s: %s (%s)", w, kolo_status_name(st_),             \
		              comm.err.msg);                                                       \
		ck_assert_msg(kolo_args_mem_device() == nd, "%s: %d device buffers, want %d", w,   \
		              kolo_args_mem_device(), nd);                                         \
	} while (0)
	CASE("allreduce", kolo_args_allreduce(&comm, dev, dev, COUNT, KOLO_FLOAT32, KOLO_SUM, 1, 1),
	     2);
	CASE("allreduce mixed",
	     kolo_args_allreduce(&comm, host_a, dev, COUNT, KOLO_FLOAT32, KOLO_SUM, 0.5, 2), 1);
	CASE("reducescatter",
	     kolo_args_reducescatter(&comm, dev, host_b, SIZE * COUNT, KOLO_FLOAT32, KOLO_SUM, 1,
	                             1),
	     1);
	CASE("broadcast", kolo_args_broadcast(&comm, dev, COUNT, KOLO_FLOAT32, 1), 1);
	CASE("allgather", kolo_args_allgather(&comm, dev, COUNT, KOLO_FLOAT32), 1);
	CASE("alltoallv", kolo_args_alltoall(&comm, dev, 0, counts, KOLO_FLOAT32, NULL), 1);
	CASE("grouped",
	     kolo_args_grouped_allreduce(&comm, 2, names, sbufs, rbufs, counts, KOLO_FLOAT32,
	                                 KOLO_SUM, 1, 1),
	     2);
	CASE("host only",
	     kolo_args_allreduce(&comm, host_a, host_b, COUNT, KOLO_FLOAT32, KOLO_SUM, 1, 1), 0);
#undef CASE
}
END_TEST

static Suite *gpu_device_suite(void)
{
	Suite *s = suite_create("gpu_device");
	TCase *tc = tcase_create("device");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, kinds);
	tcase_add_test(tc, cost_per_call);
	tcase_add_test(tc, accepted);
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
