/* The CUDA loader and the pointer classification (gpu.h), on whatever this
 * machine has: the reasons are checked against what the test finds itself
 * with dlopen, and host memory must be host everywhere. The device side is
 * tests/gpu/gpu_device_test.c (label gpu). */
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "gpu.h"
#include "testutil.h"

static int static_buf[64];

/* Memory the CPU allocated is never device memory, GPU or not. */
START_TEST(host_memory_is_host)
{
	int stack_buf[16] = {0};
	char *heap = malloc(1 << 20);
	ck_assert_ptr_nonnull(heap);
	void *page =
	        mmap(NULL, 1 << 16, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ck_assert(page != MAP_FAILED);
	const void *ptrs[] = {stack_buf, heap, heap + (1 << 20) - 1, static_buf, page, NULL};
	for (size_t i = 0; i < sizeof(ptrs) / sizeof(ptrs[0]); i++)
		ck_assert_msg(kolo_mem_kind(ptrs[i]) == KOLO_MEM_HOST, "pointer %zu is %s", i,
		              kolo_mem_kind_name(kolo_mem_kind(ptrs[i])));
	munmap(page, 1 << 16);
	free(heap);
}
END_TEST

START_TEST(kind_names)
{
	ck_assert_str_eq(kolo_mem_kind_name(KOLO_MEM_HOST), "host");
	ck_assert_str_eq(kolo_mem_kind_name(KOLO_MEM_DEVICE), "device");
	ck_assert_str_eq(kolo_mem_kind_name(KOLO_MEM_MANAGED), "managed");
	ck_assert_str_eq(kolo_mem_kind_name(KOLO_MEM_UNKNOWN), "unknown");
	ck_assert_str_eq(kolo_mem_kind_name((enum kolo_mem_kind)42), "unknown");
}
END_TEST

/* What the test itself can see of the machine, by the same sonames. */
static bool can_open(const char *soname)
{
	void *h = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
	if (h)
		dlclose(h);
	return h != NULL;
}

/* The reason given and the query agree with each other and with what dlopen
 * finds: a machine without the driver is told so. */
START_TEST(reasons_match_machine)
{
	const char *why = NULL;
	bool visible = kolo_cuda_devices_visible(&why);
	ck_assert_ptr_nonnull(why);
	struct kolo_cuda_info ci;
	kolo_cuda_query(&ci);
	ck_assert(ci.built == kolo_cuda_built());
	if (!kolo_cuda_built()) {
		ck_assert(!visible);
		ck_assert_str_eq(why, "this libkolo was built without CUDA");
		ck_assert_str_eq(ci.cudart_path, "");
		ck_assert_int_eq(ci.ngpus, 0);
		ck_assert(!ci.nccl_built);
		return;
	}
	ck_assert_int_ge(ci.header_runtime, 11000);
	bool cudart = can_open("libcudart.so.13") || can_open("libcudart.so.12") ||
	              can_open("libcudart.so");
	ck_assert_msg(cudart == (ci.cudart_path[0] != '\0'), "dlopen %d, path '%s' (%s)", cudart,
	              ci.cudart_path, ci.why_cudart);
	if (!cudart) {
		ck_assert(!visible);
		ck_assert_ptr_nonnull(strstr(why, "libcudart"));
		return;
	}
	ck_assert_str_eq(ci.why_cudart, "");
	ck_assert_int_ge(ci.runtime_version, 11000);
	if (!can_open("libcuda.so.1")) {
		ck_assert(!visible);
		ck_assert_str_eq(why, "CUDA driver not found (libcuda.so.1): no GPU");
		ck_assert_int_eq(ci.driver_version, 0);
		ck_assert_ptr_nonnull(strstr(ci.why_driver, "libcuda.so.1"));
		ck_assert_ptr_nonnull(strstr(ci.why_gpus, "no CUDA device visible"));
	}
	ck_assert(visible == (ci.ngpus > 0));
	if (visible) {
		ck_assert_str_eq(why, "");
		ck_assert_int_gt(ci.driver_version, 0);
		ck_assert_str_eq(ci.why_gpus, "");
		ck_assert(ci.gpus[0].name[0] != '\0');
		ck_assert_uint_gt(ci.gpus[0].mem_bytes, 0);
		ck_assert_int_gt(ci.gpus[0].cc_major, 0);
	} else {
		ck_assert(why[0] != '\0');
		ck_assert(ci.why_gpus[0] != '\0');
	}
	/* NCCL: found by the same soname, or a reason. */
	if (ci.nccl_built) {
		ck_assert_int_gt(ci.header_nccl, 0);
		bool nccl = can_open("libnccl.so.2");
		ck_assert(nccl == (ci.nccl_version > 0));
		ck_assert(nccl == (ci.why_nccl[0] == '\0'));
	}
}
END_TEST

/* The first calls of the process race into the loader from many threads
 * (each Check test runs in a fresh process): all get the same answer, and
 * the sanitizer builds see the once-initialisation. */
enum { THREADS = 8 };
static const char *thread_why[THREADS];
static bool thread_visible[THREADS];

static void *first_call(void *arg)
{
	int i = (int)(intptr_t)arg;
	int local = i;
	if (kolo_mem_kind(&local) != KOLO_MEM_HOST)
		return (void *)1;
	thread_visible[i] = kolo_cuda_devices_visible(&thread_why[i]);
	return NULL;
}

START_TEST(first_calls_race)
{
	pthread_t t[THREADS];
	for (int i = 0; i < THREADS; i++)
		ck_assert_int_eq(pthread_create(&t[i], NULL, first_call, (void *)(intptr_t)i), 0);
	for (int i = 0; i < THREADS; i++) {
		void *ret;
		ck_assert_int_eq(pthread_join(t[i], &ret), 0);
		ck_assert_ptr_null(ret);
	}
	for (int i = 1; i < THREADS; i++) {
		ck_assert(thread_visible[i] == thread_visible[0]);
		ck_assert_str_eq(thread_why[i], thread_why[0]);
	}
}
END_TEST

static Suite *gpu_suite(void)
{
	Suite *s = suite_create("gpu");
	TCase *tc = tcase_create("loader");
	tcase_add_test(tc, first_calls_race);
	tcase_add_test(tc, host_memory_is_host);
	tcase_add_test(tc, kind_names);
	tcase_add_test(tc, reasons_match_machine);
	suite_add_tcase(s, tc);
	return s;
}

KOLO_CHECK_MAIN(gpu_suite)
