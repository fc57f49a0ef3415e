/* Argument validation of the public collectives: every bad call returns
 * KOLO_EINVAL with a message before it reaches the ring. */
#include <check.h>
#include <stdint.h>
#include <string.h>

#include "runtime.h"
#include "testutil.h"

/* A comm whose ring is never touched: validation fails first. The ring
 * pointer only has to be non-NULL. */
static struct kolo_comm comm;

static void setup(void)
{
	memset(&comm, 0, sizeof(comm));
	comm.ring = (struct kolo_ring_comm *)(uintptr_t)0x1;
	comm.assignment.rank = 1;
	comm.assignment.size = 4;
	comm.assignment.round = 1;
}

#define EXPECT_EINVAL(call, needle)                                                                \
	do {                                                                                       \
		comm.err.msg[0] = '\0';                                                            \
		ck_assert_int_eq((call), KOLO_EINVAL);                                             \
		ck_assert_msg(strstr(kolo_last_error(&comm), needle), "message: %s",               \
		              kolo_last_error(&comm));                                             \
	} while (0)

START_TEST(test_null_comm)
{
	float x = 0;
	ck_assert_int_eq(kolo_allreduce(NULL, &x, &x, 1, KOLO_FLOAT32, KOLO_SUM), KOLO_EINVAL);
	ck_assert_int_eq(kolo_barrier(NULL), KOLO_EINVAL);
	ck_assert_int_eq(kolo_rank(NULL), -1);
	ck_assert_int_eq(kolo_size(NULL), -1);
	ck_assert_str_eq(kolo_last_error(NULL), "comm is NULL");
}
END_TEST

START_TEST(test_bad_args)
{
	float x[16] = {0};
	size_t counts[4] = {1, 2, 3, 4};
	EXPECT_EINVAL(kolo_allreduce(&comm, x, x, 1, (kolo_dtype_t)99, KOLO_SUM), "dtype");
	EXPECT_EINVAL(kolo_allreduce(&comm, x, x, 1, KOLO_FLOAT32, (kolo_op_t)-1), "op");
	EXPECT_EINVAL(kolo_allreduce(&comm, NULL, x, 1, KOLO_FLOAT32, KOLO_SUM), "sendbuf");
	EXPECT_EINVAL(kolo_allreduce(&comm, x, NULL, 1, KOLO_FLOAT32, KOLO_SUM), "recvbuf");
	EXPECT_EINVAL(kolo_broadcast(&comm, x, 1, KOLO_FLOAT32, 4), "root");
	EXPECT_EINVAL(kolo_broadcast(&comm, x, 1, KOLO_FLOAT32, -1), "root");
	EXPECT_EINVAL(kolo_allgatherv(&comm, x, 1, x, counts, KOLO_FLOAT32), "recvcounts[1]");
	EXPECT_EINVAL(kolo_allgatherv(&comm, x, 2, x, NULL, KOLO_FLOAT32), "recvcounts");
	EXPECT_EINVAL(kolo_allgather(&comm, x, x, SIZE_MAX / 2, KOLO_FLOAT32), "overflow");
	EXPECT_EINVAL(kolo_alltoallv(&comm, x, NULL, x, counts, KOLO_FLOAT32), "sendcounts");
	EXPECT_EINVAL(kolo_alltoall(&comm, NULL, x, 2, KOLO_INT8), "sendbuf");
	EXPECT_EINVAL(kolo_reducescatter(&comm, x, x, 4, KOLO_FLOAT64, KOLO_OP_COUNT), "op");
	EXPECT_EINVAL(kolo_reducescatter(&comm, x, NULL, 4, KOLO_FLOAT64, KOLO_SUM), "recvbuf");
}
END_TEST

START_TEST(test_getters)
{
	comm.assignment.local_rank = 1;
	comm.assignment.local_size = 2;
	comm.assignment.cross_rank = 0;
	comm.assignment.cross_size = 2;
	ck_assert_int_eq(kolo_rank(&comm), 1);
	ck_assert_int_eq(kolo_size(&comm), 4);
	ck_assert_int_eq(kolo_local_rank(&comm), 1);
	ck_assert_int_eq(kolo_local_size(&comm), 2);
	ck_assert_int_eq(kolo_cross_rank(&comm), 0);
	ck_assert_int_eq(kolo_cross_size(&comm), 2);
	ck_assert_int_eq(kolo_round(&comm), 1);
}
END_TEST

START_TEST(test_init_without_rendezvous)
{
	unsetenv("KOLO_RENDEZVOUS");
	kolo_comm_t *c = (kolo_comm_t *)&comm;
	ck_assert_int_eq(kolo_init(&c), KOLO_EINVAL);
	ck_assert_ptr_null(c);
	ck_assert_ptr_nonnull(strstr(kolo_init_error(), "KOLO_RENDEZVOUS"));
	ck_assert_int_eq(kolo_init(NULL), KOLO_EINVAL);
	ck_assert_int_eq(kolo_finalize(NULL), KOLO_OK);
}
END_TEST

static Suite *api_suite(void)
{
	Suite *s = suite_create("runtime_api");
	TCase *tc = tcase_create("api");
	tcase_add_checked_fixture(tc, setup, NULL);
	tcase_set_timeout(tc, 10);
	tcase_add_test(tc, test_null_comm);
	tcase_add_test(tc, test_bad_args);
	tcase_add_test(tc, test_getters);
	tcase_add_test(tc, test_init_without_rendezvous);
	suite_add_tcase(s, tc);
	return s;
}

KOLO_CHECK_MAIN(api_suite)
