/* Argument validation of the public collectives (args.c): every bad call
 * returns KOLO_EINVAL with a message before it reaches the ring or the fusion
 * engine, and a bad call that both the blocking API (kolo.h) and the async
 * API (async.h) can express gets the same status and the same message from
 * both. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "kolo/async.h"
#include "runtime.h"
#include "testutil.h"

#define SIZE 4 /* ranks of the test comm */

/* A comm whose ring is never touched: validation fails first. The ring
 * pointer only has to be non-NULL (a call that passed validation would crash
 * on it, which fails its test). */
static struct kolo_comm comm;

static void setup(void)
{
	memset(&comm, 0, sizeof(comm));
	comm.ring = (struct kolo_ring_comm *)(uintptr_t)0x1;
	comm.assignment.rank = 1;
	comm.assignment.size = SIZE;
	comm.assignment.round = 1;
}

/* ---- the table ---------------------------------------------------------- */

enum coll {
	ALLREDUCE,
	BROADCAST,
	REDUCESCATTER,
	ALLGATHER,
	ALLGATHERV,
	ALLTOALL,
	ALLTOALLV,
	GROUP,
	BARRIER
};
enum paths { BOTH, BLOCKING, ASYNC };
enum which { GOOD, NULL_COMM, NO_RING };

/* One bad call, in terms both APIs share. ALLTOALL: count is the total sent
 * (async) and the blocking call gets count / SIZE per block; ALLTOALLV: async
 * is kolo_alltoall_async with sendcounts = counts. */
struct call {
	const char *label;
	enum coll coll;
	enum paths paths;
	enum which which;
	const void *send;
	void *recv;
	size_t count;
	const size_t *counts, *rcounts; /* allgatherv: recvcounts; alltoallv; group */
	kolo_dtype_t dtype;
	kolo_op_t op;
	bool scaled; /* else both scale factors are 1 */
	double pre, post;
	int root;
	const char *name; /* async; "t" when NULL and !null_name */
	bool null_name, null_out, null_outcounts;
	int n; /* group */
	const char *const *names;
	const void *const *sbufs;
	void *const *rbufs;
	const char *needle; /* NULL: the message must be kolo_last_error(NULL)'s */
};

static float x[64], y[64];
static const size_t c1234[SIZE] = {1, 2, 3, 4};
static const size_t c_huge[SIZE] = {SIZE_MAX / 4, SIZE_MAX / 4, 0, 0};
static char long_name[1025]; /* 1024 bytes, filled by the test */
static const char *const names2[] = {"a", "b"};
static const char *const names_dup[] = {"a", "a"};
static const char *const names_empty[] = {"a", ""};
static const char *const names_long[] = {"a", long_name};
static const void *const sbufs2[] = {x, x};
static void *const rbufs2[] = {y, y};
static const void *const sbufs_null[] = {x, NULL};
static const size_t g11[] = {1, 1};

#define F32 .dtype = KOLO_FLOAT32
/* Good arguments of each collective; a row overrides one of them. */
#define AR   .coll = ALLREDUCE, .send = x, .recv = y, .count = 4, F32, .op = KOLO_SUM
#define BC   .coll = BROADCAST, .recv = x, .count = 4, F32, .root = 0
#define RS   .coll = REDUCESCATTER, .send = x, .recv = y, .count = 4, F32, .op = KOLO_SUM
#define AG   .coll = ALLGATHER, .send = x, .recv = y, .count = 2, F32
#define AGV  .coll = ALLGATHERV, .send = x, .recv = y, .count = 2, .counts = c1234, F32
#define A2A  .coll = ALLTOALL, .send = x, .recv = y, .count = 8, F32
#define A2AV .coll = ALLTOALLV, .send = x, .recv = y, .counts = c1234, .rcounts = c1234, F32
#define GR                                                                                         \
	.coll = GROUP, .paths = ASYNC, .n = 2, .names = names2, .sbufs = sbufs2, .rbufs = rbufs2,  \
	.counts = g11, F32, .op = KOLO_SUM

/* A row is the good call of its collective with one field overridden: the
 * override is the point, so the warning about it is off for the table. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Woverride-init"
static const struct call calls[] = {
        /* every collective: the comm */
        {"allreduce NULL comm", AR, .which = NULL_COMM},
        {"allreduce no ring", AR, .which = NO_RING,
         .needle = "allreduce: the comm has no data plane"},
        {"broadcast NULL comm", BC, .which = NULL_COMM},
        {"allgather no ring", AG, .which = NO_RING, .needle = "allgather: the comm has no data"},
        {"alltoall NULL comm", A2A, .which = NULL_COMM},
        {"barrier NULL comm", .coll = BARRIER, .which = NULL_COMM},
        {"barrier no ring", .coll = BARRIER, .which = NO_RING,
         .needle = "barrier: the comm has no"},
        /* allreduce */
        {"allreduce dtype", AR, .dtype = (kolo_dtype_t)99, .needle = "allreduce: invalid dtype 99"},
        {"allreduce dtype -1", AR, .dtype = (kolo_dtype_t)-1, .needle = "invalid dtype -1"},
        {"allreduce op", AR, .op = (kolo_op_t)-1, .needle = "allreduce: invalid op -1"},
        {"allreduce op count", AR, .op = KOLO_OP_COUNT, .needle = "invalid op 5"},
        {"allreduce NaN prescale", AR, .scaled = true, .pre = NAN, .post = 1,
         .needle = "allreduce: prescale nan is not finite"},
        {"allreduce inf postscale", AR, .scaled = true, .pre = 1, .post = INFINITY,
         .needle = "allreduce: postscale inf is not finite"},
        {"allreduce -inf prescale", AR, .scaled = true, .pre = -INFINITY, .post = 2,
         .needle = "prescale -inf"},
        {"allreduce NULL sendbuf", AR, .send = NULL, .needle = "allreduce: sendbuf is NULL with 4"},
        {"allreduce NULL recvbuf", AR, .recv = NULL, .needle = "allreduce: recvbuf is NULL with 4"},
        {"allreduce bytes overflow", AR, .count = SIZE_MAX / 2,
         .needle = "elements of 4 bytes overflow size_t"},
        {"allreduce dtype before op", AR, .dtype = (kolo_dtype_t)8, .op = (kolo_op_t)9,
         .needle = "invalid dtype 8"},
        {"allreduce NULL name", AR, .paths = ASYNC, .null_name = true,
         .needle = "allreduce: name is NULL"},
        {"allreduce empty name", AR, .paths = ASYNC, .name = "",
         .needle = "allreduce: name is empty"},
        {"allreduce long name", AR, .paths = ASYNC, .name = long_name,
         .needle = "allreduce: name has 1024 bytes, more than 1023"},
        /* broadcast */
        {"broadcast root = size", BC, .root = SIZE,
         .needle = "broadcast: root 4 is not a rank of 0..3"},
        {"broadcast root -1", BC, .root = -1, .needle = "root -1 is not a rank"},
        {"broadcast NULL buf", BC, .recv = NULL, .needle = "broadcast: buf is NULL with 4"},
        {"broadcast dtype", BC, .dtype = KOLO_DTYPE_COUNT, .needle = "broadcast: invalid dtype 8"},
        {"broadcast bytes overflow", BC, .count = SIZE_MAX / 4 + 1,
         .needle = "bytes overflow size_t"},
        {"broadcast empty name", BC, .paths = ASYNC, .name = "",
         .needle = "broadcast: name is empty"},
        /* reducescatter */
        {"reducescatter op", RS, .op = KOLO_OP_COUNT, .needle = "reducescatter: invalid op 5"},
        {"reducescatter NULL sendbuf", RS, .send = NULL, .needle = "sendbuf is NULL with 4"},
        {"reducescatter NULL recvbuf", RS, .recv = NULL,
         .needle = "reducescatter: recvbuf is NULL with 1 elements"},
        {"reducescatter bytes overflow", RS, .count = SIZE_MAX / 4, .dtype = KOLO_FLOAT64,
         .needle = "elements of 8 bytes overflow"},
        {"reducescatter NaN postscale", RS, .paths = ASYNC, .scaled = true, .pre = 1, .post = NAN,
         .needle = "reducescatter: postscale nan is not finite"},
        /* allgather(v) */
        {"allgather NULL sendbuf", AG, .send = NULL, .needle = "allgather: sendbuf is NULL with 2"},
        {"allgather dtype", AG, .dtype = (kolo_dtype_t)42, .needle = "allgather: invalid dtype 42"},
        {"allgather send bytes overflow", AG, .count = SIZE_MAX / 2,
         .needle = "elements of 4 bytes overflow size_t"},
        {"allgather total overflow", AG, .paths = BLOCKING, .count = SIZE_MAX / 8,
         .needle = "allgather: 4 x "},
        {"allgather NULL recvbuf", AG, .paths = BLOCKING, .recv = NULL,
         .needle = "allgather: recvbuf is NULL with 8 elements"},
        {"allgather NULL recvbuf out", AG, .paths = ASYNC, .null_out = true,
         .needle = "allgather: recvbuf is NULL"},
        {"allgather NULL recvcounts out", AG, .paths = ASYNC, .null_outcounts = true,
         .needle = "allgather: recvcounts is NULL"},
        {"allgather NULL name", AG, .paths = ASYNC, .null_name = true,
         .needle = "allgather: name is NULL"},
        {"allgatherv sendcount", AGV, .paths = BLOCKING, .count = 1,
         .needle = "allgather: sendcount 1 differs from recvcounts[1] = 2"},
        {"allgatherv NULL recvcounts", AGV, .paths = BLOCKING, .counts = NULL,
         .needle = "allgather: recvcounts is NULL"},
        {"allgatherv recvcounts overflow", AGV, .paths = BLOCKING, .counts = c_huge,
         .needle = "allgather: recvcounts[0..1] add up to more bytes than size_t holds"},
        {"allgatherv NULL recvbuf", AGV, .paths = BLOCKING, .recv = NULL,
         .needle = "recvbuf is NULL with 10 elements"},
        /* alltoall(v) */
        {"alltoall NULL sendbuf", A2A, .send = NULL, .needle = "alltoall: sendbuf is NULL with 8"},
        {"alltoall dtype", A2A, .dtype = (kolo_dtype_t)-3, .needle = "alltoall: invalid dtype -3"},
        {"alltoall NULL recvbuf", A2A, .paths = BLOCKING, .recv = NULL,
         .needle = "alltoall: recvbuf is NULL with 8"},
        {"alltoall total overflow", A2A, .paths = BLOCKING, .count = SIZE_MAX - 3,
         .needle = "alltoall: 4 x "},
        {"alltoall uneven split", A2A, .paths = ASYNC, .count = 9,
         .needle = "alltoall: count 9 does not split evenly over 4 ranks"},
        {"alltoall NULL recvbuf out", A2A, .paths = ASYNC, .null_out = true,
         .needle = "alltoall: recvbuf is NULL"},
        {"alltoall NULL recvcounts out", A2AV, .paths = ASYNC, .null_outcounts = true,
         .needle = "alltoall: recvcounts is NULL"},
        {"alltoall long name", A2A, .paths = ASYNC, .name = long_name, .needle = "name has 1024"},
        {"alltoallv sendcounts overflow", A2AV, .counts = c_huge,
         .needle = "alltoall: sendcounts[0..1] add up to more bytes than size_t holds"},
        {"alltoallv NULL sendbuf", A2AV, .send = NULL,
         .needle = "alltoall: sendbuf is NULL with 10"},
        {"alltoallv dtype", A2AV, .dtype = (kolo_dtype_t)8, .needle = "alltoall: invalid dtype 8"},
        {"alltoallv NULL sendcounts", A2AV, .paths = BLOCKING, .counts = NULL,
         .needle = "alltoall: sendcounts is NULL"},
        {"alltoallv NULL recvcounts", A2AV, .paths = BLOCKING, .rcounts = NULL,
         .needle = "alltoall: recvcounts is NULL"},
        {"alltoallv recvcounts overflow", A2AV, .paths = BLOCKING, .rcounts = c_huge,
         .needle = "alltoall: recvcounts[0..1] add up"},
        {"alltoallv NULL recvbuf", A2AV, .paths = BLOCKING, .recv = NULL,
         .needle = "alltoall: recvbuf is NULL with 10"},
        /* grouped allreduce (async only) */
        {"group NULL comm", GR, .which = NULL_COMM},
        {"group n = 0", GR, .n = 0, .needle = "grouped allreduce: n is 0"},
        {"group dtype", GR, .dtype = (kolo_dtype_t)9,
         .needle = "grouped allreduce: invalid dtype 9"},
        {"group op", GR, .op = (kolo_op_t)7, .needle = "grouped allreduce: invalid op 7"},
        {"group NaN prescale", GR, .scaled = true, .pre = NAN, .post = 1,
         .needle = "grouped allreduce: prescale nan is not finite"},
        {"group NULL names", GR, .names = NULL, .needle = "grouped allreduce: names is NULL"},
        {"group NULL sendbufs", GR, .sbufs = NULL, .needle = "sendbufs is NULL"},
        {"group NULL recvbufs", GR, .rbufs = NULL, .needle = "recvbufs is NULL"},
        {"group NULL counts", GR, .counts = NULL, .needle = "counts is NULL"},
        {"group empty name", GR, .names = names_empty,
         .needle = "grouped allreduce: names[1] is empty"},
        {"group long name", GR, .names = names_long, .needle = "names[1] has 1024 bytes"},
        {"group duplicate", GR, .names = names_dup,
         .needle = "grouped allreduce: names[0] and names[1] are both 'a'"},
        {"group NULL sendbufs[1]", GR, .sbufs = sbufs_null,
         .needle = "grouped allreduce: sendbufs[1] is NULL with 1 elements"},
        {"group counts overflow", GR, .counts = c_huge,
         .needle = "grouped allreduce: counts[0..1] add up to more bytes than size_t holds"},
};
#pragma GCC diagnostic pop
#define NCALLS ((int)(sizeof(calls) / sizeof(calls[0])))

static int callbacks;

static void on_done(void *arg, kolo_status_t st)
{
	(void)arg;
	(void)st;
	callbacks++;
}

static kolo_status_t blocking(kolo_comm_t *c, const struct call *k)
{
	double pre = k->scaled ? k->pre : 1.0, post = k->scaled ? k->post : 1.0;
	switch (k->coll) {
	case ALLREDUCE:
		return kolo_allreduce_scaled(c, k->send, k->recv, k->count, k->dtype, k->op, pre,
		                             post);
	case BROADCAST:
		return kolo_broadcast(c, k->recv, k->count, k->dtype, k->root);
	case REDUCESCATTER:
		ck_assert(!k->scaled);
		return kolo_reducescatter(c, k->send, k->recv, k->count, k->dtype, k->op);
	case ALLGATHER:
		return kolo_allgather(c, k->send, k->recv, k->count, k->dtype);
	case ALLGATHERV:
		return kolo_allgatherv(c, k->send, k->count, k->recv, k->counts, k->dtype);
	case ALLTOALL:
		return kolo_alltoall(c, k->send, k->recv, k->count / SIZE, k->dtype);
	case ALLTOALLV:
		return kolo_alltoallv(c, k->send, k->counts, k->recv, k->rcounts, k->dtype);
	case BARRIER:
		return kolo_barrier(c);
	case GROUP:
		break;
	}
	ck_abort_msg("%s: no blocking form", k->label);
	return KOLO_OK;
}

static kolo_status_t async(kolo_comm_t *c, const struct call *k, kolo_handle_t **h)
{
	double pre = k->scaled ? k->pre : 1.0, post = k->scaled ? k->post : 1.0;
	const char *name = k->null_name ? NULL : (k->name ? k->name : "t");
	static void *out;
	static size_t outcounts[SIZE];
	void **o = k->null_out ? NULL : &out;
	size_t *oc = k->null_outcounts ? NULL : outcounts;
	switch (k->coll) {
	case ALLREDUCE:
		return kolo_allreduce_async(c, name, k->send, k->recv, k->count, k->dtype, k->op,
		                            pre, post, on_done, NULL, h);
	case BROADCAST:
		return kolo_broadcast_async(c, name, k->recv, k->count, k->dtype, k->root, on_done,
		                            NULL, h);
	case REDUCESCATTER:
		return kolo_reducescatter_async(c, name, k->send, k->recv, k->count, k->dtype,
		                                k->op, pre, post, on_done, NULL, h);
	case ALLGATHER:
		return kolo_allgather_async(c, name, k->send, k->count, k->dtype, o, oc, on_done,
		                            NULL, h);
	case ALLTOALL:
		return kolo_alltoall_async(c, name, k->send, k->count, NULL, k->dtype, o, oc,
		                           on_done, NULL, h);
	case ALLTOALLV:
		return kolo_alltoall_async(c, name, k->send, 0, k->counts, k->dtype, o, oc, on_done,
		                           NULL, h);
	case GROUP:
		return kolo_grouped_allreduce_async(c, k->n, k->names, k->sbufs, k->rbufs,
		                                    k->counts, k->dtype, k->op, pre, post, on_done,
		                                    NULL, h);
	case BARRIER:
		return kolo_barrier_async(c, on_done, NULL, h);
	case ALLGATHERV:
		break;
	}
	ck_abort_msg("%s: no async form", k->label);
	return KOLO_OK;
}

/* The message a path left: comm's last error, or what kolo_last_error says
 * for a NULL comm. */
static const char *message(kolo_comm_t *c)
{
	return kolo_last_error(c);
}

START_TEST(test_bad_call)
{
	const struct call *k = &calls[_i];
	memset(long_name, 'a', 1024);
	kolo_comm_t *c = k->which == NULL_COMM ? NULL : &comm;
	if (k->which == NO_RING)
		comm.ring = NULL;
	char msg_blocking[KOLO_ERRBUF_SIZE] = "", msg_async[KOLO_ERRBUF_SIZE] = "";
	kolo_status_t st_blocking = KOLO_OK, st_async = KOLO_OK;
	if (k->paths != ASYNC) {
		comm.err.msg[0] = '\0';
		st_blocking = blocking(c, k);
		snprintf(msg_blocking, sizeof(msg_blocking), "%s", message(c));
		ck_assert_msg(st_blocking == KOLO_EINVAL, "%s: blocking returned %s (%s)", k->label,
		              kolo_status_name(st_blocking), msg_blocking);
	}
	if (k->paths != BLOCKING) {
		comm.err.msg[0] = '\0';
		kolo_handle_t *h = (kolo_handle_t *)(uintptr_t)0x2;
		st_async = async(c, k, &h);
		snprintf(msg_async, sizeof(msg_async), "%s", message(c));
		ck_assert_msg(st_async == KOLO_EINVAL, "%s: async returned %s (%s)", k->label,
		              kolo_status_name(st_async), msg_async);
		/* async.h: on an error no handle is returned and no callback runs. */
		ck_assert_msg(h == NULL, "%s: a handle came back with an error", k->label);
		ck_assert_int_eq(callbacks, 0);
	}
	if (k->paths == BOTH)
		ck_assert_msg(strcmp(msg_blocking, msg_async) == 0,
		              "%s: the paths disagree:\n  blocking: %s\n  async:    %s", k->label,
		              msg_blocking, msg_async);
	const char *msg = k->paths == ASYNC ? msg_async : msg_blocking;
	if (k->needle)
		ck_assert_msg(strstr(msg, k->needle), "%s: message \"%s\" lacks \"%s\"", k->label,
		              msg, k->needle);
	else
		ck_assert_str_eq(msg, "comm is NULL");
}
END_TEST

/* What the checker must let through: a refusal of any of these would be a
 * bug as real as letting a bad call pass. Called directly (the test comm has
 * no ring to run them on). */
START_TEST(test_good_calls)
{
	memset(long_name, 'a', 1023);
	const size_t zeros[SIZE] = {0};
	ck_assert_int_eq(kolo_args_allreduce(&comm, NULL, NULL, 0, KOLO_FLOAT32, KOLO_SUM, 1, 1),
	                 KOLO_OK);
	ck_assert_int_eq(
	        kolo_args_allreduce(&comm, x, x, 4, KOLO_BFLOAT16, KOLO_PRODUCT, -1e308, 0.0),
	        KOLO_OK);
	for (int d = 0; d < KOLO_DTYPE_COUNT; d++)
		for (int o = 0; o < KOLO_OP_COUNT; o++)
			ck_assert_int_eq(kolo_args_allreduce(&comm, x, y, 1, (kolo_dtype_t)d,
			                                     (kolo_op_t)o, 0.5, 2),
			                 KOLO_OK);
	/* The largest count whose bytes fit. */
	ck_assert_int_eq(
	        kolo_args_allreduce(&comm, x, y, SIZE_MAX / 4, KOLO_FLOAT32, KOLO_SUM, 1, 1),
	        KOLO_OK);
	/* Rank 1 of 4 receives no element of a reducescatter of 1: its recvbuf may
	 * be NULL. */
	ck_assert_uint_eq(kolo_reducescatter_count(1, SIZE, 1), 0);
	ck_assert_int_eq(kolo_args_reducescatter(&comm, x, NULL, 1, KOLO_INT8, KOLO_MAX, 1, 1),
	                 KOLO_OK);
	ck_assert_int_eq(kolo_args_broadcast(&comm, x, 4, KOLO_INT64, SIZE - 1), KOLO_OK);
	ck_assert_int_eq(kolo_args_broadcast(&comm, NULL, 0, KOLO_INT64, 0), KOLO_OK);
	ck_assert_int_eq(kolo_args_allgather(&comm, NULL, 0, KOLO_UINT8), KOLO_OK);
	size_t total = 1;
	ck_assert_int_eq(kolo_args_alltoall(&comm, NULL, 0, zeros, KOLO_INT32, &total), KOLO_OK);
	ck_assert_uint_eq(total, 0);
	ck_assert_int_eq(kolo_args_alltoall(&comm, x, 99, c1234, KOLO_INT32, &total), KOLO_OK);
	ck_assert_uint_eq(total, 10); /* sendcounts, not count */
	ck_assert_int_eq(kolo_args_alltoall(&comm, x, 8, NULL, KOLO_INT32, &total), KOLO_OK);
	ck_assert_uint_eq(total, 8);
	ck_assert_int_eq(kolo_args_name(&comm, "allreduce", "name", long_name), KOLO_OK);
	static const void *const sb[] = {NULL, x};
	static void *const rb[] = {NULL, y};
	static const size_t cn[] = {0, 3};
	ck_assert_int_eq(kolo_args_grouped_allreduce(&comm, 2, names2, sb, rb, cn, KOLO_FLOAT16,
	                                             KOLO_AVERAGE, 1, 0.25),
	                 KOLO_OK);
}
END_TEST

START_TEST(test_null_comm)
{
	float v = 0;
	ck_assert_int_eq(kolo_allreduce(NULL, &v, &v, 1, KOLO_FLOAT32, KOLO_SUM), KOLO_EINVAL);
	ck_assert_int_eq(kolo_barrier(NULL), KOLO_EINVAL);
	ck_assert_int_eq(kolo_join(NULL, NULL), KOLO_EINVAL);
	ck_assert_int_eq(kolo_timeline_start(NULL, "x"), KOLO_EINVAL);
	ck_assert_int_eq(kolo_rank(NULL), -1);
	ck_assert_int_eq(kolo_size(NULL), -1);
	ck_assert_str_eq(kolo_last_error(NULL), "comm is NULL");
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

/* Hosts a, a, b, b (2 + 2): homogeneous; a, a, a, b (3 + 1): not. */
START_TEST(test_is_homogeneous)
{
	struct kolo_rdzv_member m[SIZE];
	memset(m, 0, sizeof(m));
	const char *even[SIZE] = {"a", "a", "b", "b"}, *odd[SIZE] = {"a", "a", "a", "b"};
	comm.assignment.members = m;
	comm.assignment.n_members = SIZE;
	comm.assignment.local_size = 2;
	for (int r = 0; r < SIZE; r++)
		snprintf(m[r].host, sizeof(m[r].host), "%s", even[r]);
	ck_assert_int_eq(kolo_is_homogeneous(&comm), 1);
	for (int r = 0; r < SIZE; r++)
		snprintf(m[r].host, sizeof(m[r].host), "%s", odd[r]);
	comm.assignment.local_size = 3;
	ck_assert_int_eq(kolo_is_homogeneous(&comm), 0);
	comm.assignment.local_size = 1;
	ck_assert_int_eq(kolo_is_homogeneous(&comm), 0);
	comm.assignment.members = NULL;
	comm.assignment.n_members = 0;
	ck_assert_int_eq(kolo_is_homogeneous(NULL), -1);
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
	tcase_add_loop_test(tc, test_bad_call, 0, NCALLS);
	tcase_add_test(tc, test_good_calls);
	tcase_add_test(tc, test_null_comm);
	tcase_add_test(tc, test_getters);
	tcase_add_test(tc, test_is_homogeneous);
	tcase_add_test(tc, test_init_without_rendezvous);
	suite_add_tcase(s, tc);
	return s;
}

KOLO_CHECK_MAIN(api_suite)
