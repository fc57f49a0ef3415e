/* Host memory of every kind passes the argument checker (runtime/args.c) on
 * every machine, GPU or not: the device-memory check added for CUDA must not
 * refuse what the CPU path runs; and where the device data path cannot run,
 * its calls and kolo_cuda_set_stream refuse with the reason. The device
 * side is gpu_device_test.c and gpu_coll_worker.c. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "gpu.h"
#include "kolo/kolo.h"
#include "runtime.h"
#include "testutil.h"

#define SIZE  4
#define COUNT 256

static struct kolo_comm comm;
static float static_buf[SIZE * COUNT];

static void setup(void)
{
	memset(&comm, 0, sizeof(comm));
	comm.ring = (struct kolo_ring_comm *)(uintptr_t)0x1; /* never touched */
	comm.assignment.rank = 1;
	comm.assignment.size = SIZE;
	comm.assignment.round = 1;
}

static void pass(kolo_status_t st, const char *what)
{
	ck_assert_msg(st == KOLO_OK, "%s: %s (%s)", what, kolo_status_name(st), comm.err.msg);
}

START_TEST(host_buffers_pass)
{
	float stack_buf[SIZE * COUNT];
	float *heap = malloc(sizeof(float) * SIZE * COUNT);
	ck_assert_ptr_nonnull(heap);
	void *page = mmap(NULL, sizeof(float) * SIZE * COUNT, PROT_READ | PROT_WRITE,
	                  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ck_assert(page != MAP_FAILED);
	float *bufs[] = {stack_buf, heap, static_buf, page};
	size_t counts[SIZE] = {COUNT, COUNT, COUNT, COUNT};
	for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) {
		float *s = bufs[i], *r = bufs[(i + 1) % 4];
		ck_assert(kolo_mem_kind(s) == KOLO_MEM_HOST);
		pass(kolo_args_allreduce(&comm, s, r, COUNT, KOLO_FLOAT32, KOLO_SUM, 1, 1),
		     "allreduce");
		pass(kolo_args_allreduce(&comm, s, s, COUNT, KOLO_FLOAT32, KOLO_SUM, 1, 1),
		     "allreduce in place");
		pass(kolo_args_reducescatter(&comm, s, r, SIZE * COUNT, KOLO_FLOAT32, KOLO_SUM, 1,
		                             1),
		     "reducescatter");
		pass(kolo_args_broadcast(&comm, s, COUNT, KOLO_FLOAT32, 0), "broadcast");
		pass(kolo_args_allgather(&comm, s, COUNT, KOLO_FLOAT32), "allgather");
		pass(kolo_args_alltoall(&comm, s, SIZE * COUNT, NULL, KOLO_FLOAT32, NULL),
		     "alltoall");
		pass(kolo_args_alltoall(&comm, s, 0, counts, KOLO_FLOAT32, NULL), "alltoallv");
		pass(kolo_args_buf(&comm, "allgather", "recvbuf", r, SIZE * COUNT), "recvbuf");
		pass(kolo_args_ptr(&comm, "allgather", "recvbuf", r), "recvbuf pointer");
		const char *names[2] = {"a", "b"};
		const void *sb[2] = {s, s + COUNT};
		void *rb[2] = {r, r + COUNT};
		pass(kolo_args_grouped_allreduce(&comm, 2, names, sb, rb, counts, KOLO_FLOAT32,
		                                 KOLO_SUM, 1, 1),
		     "grouped allreduce");
	}
	/* NULL with no elements stays legal; NULL with elements stays EINVAL. */
	pass(kolo_args_buf(&comm, "allreduce", "sendbuf", NULL, 0), "NULL, 0 elements");
	ck_assert_int_eq(kolo_args_buf(&comm, "allreduce", "sendbuf", NULL, 1), KOLO_EINVAL);
	munmap(page, sizeof(float) * SIZE * COUNT);
	free(heap);
}
END_TEST

/* Where the device data path cannot run (no GPU, no driver, a build without
 * CUDA: every CI machine), its calls refuse with the reason rather than
 * fail some other way, and a stream cannot be set. */
START_TEST(unusable_refuses)
{
	const char *why = NULL;
	if (kolo_gpu_usable(&why))
		return; /* a GPU (or the fake runtime) is here: gpu_coll_* cover it */
	ck_assert_msg(why && why[0], "no reason given");
	ck_assert_int_eq(kolo_cuda_set_stream((void *)(uintptr_t)0x10), KOLO_EUNSUPPORTED);
	ck_assert_ptr_null(kolo_cuda_get_stream());
	ck_assert_int_eq(kolo_cuda_set_stream(NULL), KOLO_OK);
	struct kolo_errbuf eb = {{0}};
	void *p = (void *)(uintptr_t)0x20, *s = (void *)(uintptr_t)0x30;
	ck_assert_int_eq(kolo_gpu_malloc(&p, 64, &eb), KOLO_EUNSUPPORTED);
	ck_assert_ptr_null(p);
	ck_assert_msg(strstr(eb.msg, why) != NULL, "'%s' lacks '%s'", eb.msg, why);
	ck_assert_int_eq(kolo_gpu_stream_create(&s, &eb), KOLO_EUNSUPPORTED);
	ck_assert_ptr_null(s);
	kolo_gpu_free(NULL);
	kolo_gpu_host_free(NULL);
	kolo_gpu_stream_destroy(NULL);
	kolo_gpu_event_destroy(NULL);
}
END_TEST

static Suite *gpu_args_suite(void)
{
	Suite *s = suite_create("gpu_args");
	TCase *tc = tcase_create("host");
	tcase_add_checked_fixture(tc, setup, NULL);
	tcase_add_test(tc, host_buffers_pass);
	tcase_add_test(tc, unusable_refuses);
	suite_add_tcase(s, tc);
	return s;
}

KOLO_CHECK_MAIN(gpu_args_suite)
