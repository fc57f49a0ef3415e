/* A worker of the async-API test: run as `kolorun -np N -- async_api_worker
 * TIMELINE_PATH`. Uses only the public API (kolo.h, async.h): every async
 * collective (allgather into a buffer too), kolo_poll/kolo_wait/kolo_wait_for, callbacks, a
 * mismatch, kolo_join with uneven batches and the timeline (checked with jansson on rank 0). Exits
 * 0 when every check passed. */
#include <jansson.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kolo/async.h"
#include "kolo/kolo.h"

static int failures;
static int rank_, size_;

#define CHECK(cond, ...)                                                                           \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			fprintf(stderr, "async_api_worker: rank %d: ", rank_);                     \
			fprintf(stderr, __VA_ARGS__);                                              \
			fprintf(stderr, "\n");                                                     \
			failures++;                                                                \
		}                                                                                  \
	} while (0)

static atomic_int callbacks;

static void on_done(void *arg, kolo_status_t st)
{
	(void)arg;
	if (st == KOLO_OK)
		atomic_fetch_add(&callbacks, 1);
}

static void test_allreduce(kolo_comm_t *comm)
{
	enum { NT = 6, N = 1000 };
	float *buf[NT];
	kolo_handle_t *h[NT];
	char name[32];
	atomic_store(&callbacks, 0);
	/* Each rank enqueues in a different order. */
	for (int k = 0; k < NT; k++) {
		int t = (k + rank_ * 2) % NT;
		buf[t] = malloc(N * sizeof(float));
		for (int i = 0; i < N; i++)
			buf[t][i] = (float)(rank_ + t + i % 5);
		snprintf(name, sizeof(name), "grad.%d", t);
		kolo_status_t st = kolo_allreduce_async(comm, name, buf[t], buf[t], (size_t)(N - t),
		                                        KOLO_FLOAT32, KOLO_AVERAGE, 1.0, 1.0,
		                                        on_done, NULL, &h[t]);
		CHECK(st == KOLO_OK, "allreduce_async %s: %s", name, kolo_last_error(comm));
	}
	for (int t = 0; t < NT; t++) {
		int done = 0;
		CHECK(kolo_poll(h[t], &done) == KOLO_OK, "poll");
		CHECK(kolo_wait(h[t]) == KOLO_OK, "wait grad.%d: %s", t, kolo_last_error(comm));
		for (int i = 0; i < N - t; i++) {
			double want = (double)(size_ - 1) / 2.0 + t + i % 5;
			if (buf[t][i] != (float)want) {
				CHECK(0, "grad.%d[%d] = %g, want %g", t, i, buf[t][i], want);
				break;
			}
		}
		free(buf[t]);
	}
	CHECK(atomic_load(&callbacks) == NT, "callbacks %d", atomic_load(&callbacks));
}

static void test_grouped(kolo_comm_t *comm)
{
	double a[3], b[7];
	for (int i = 0; i < 3; i++)
		a[i] = rank_;
	for (int i = 0; i < 7; i++)
		b[i] = 1;
	const char *names[2] = {"grp.a", "grp.b"};
	const void *send[2] = {a, b};
	void *recv[2] = {a, b};
	size_t counts[2] = {3, 7};
	kolo_handle_t *h;
	CHECK(kolo_grouped_allreduce_async(comm, 2, names, send, recv, counts, KOLO_FLOAT64,
	                                   KOLO_SUM, 1.0, 2.0, NULL, NULL, &h) == KOLO_OK,
	      "grouped: %s", kolo_last_error(comm));
	CHECK(kolo_wait(h) == KOLO_OK, "grouped wait: %s", kolo_last_error(comm));
	CHECK(a[2] == 2.0 * size_ * (size_ - 1) / 2 && b[6] == 2.0 * size_, "grouped values %g %g",
	      a[2], b[6]);
}

static void test_others(kolo_comm_t *comm)
{
	kolo_handle_t *h;
	/* allgather: rank r contributes r+1 values */
	int32_t mine[16];
	for (int i = 0; i <= rank_; i++)
		mine[i] = rank_;
	void *out = NULL;
	size_t *rc = calloc((size_t)size_, sizeof(size_t));
	CHECK(kolo_allgather_async(comm, "ag", mine, (size_t)rank_ + 1, KOLO_INT32, &out, rc, NULL,
	                           NULL, &h) == KOLO_OK,
	      "allgather: %s", kolo_last_error(comm));
	CHECK(kolo_wait(h) == KOLO_OK, "allgather wait: %s", kolo_last_error(comm));
	size_t o = 0;
	for (int r = 0; r < size_ && out; r++) {
		CHECK(rc[r] == (size_t)r + 1, "allgather count");
		for (size_t i = 0; i < rc[r]; i++, o++)
			CHECK(((int32_t *)out)[o] == r, "allgather value");
	}
	free(out);
	/* broadcast */
	int64_t b[4] = {rank_, rank_, rank_, rank_};
	CHECK(kolo_broadcast_async(comm, "bc", b, 4, KOLO_INT64, size_ - 1, NULL, NULL, &h) ==
	              KOLO_OK,
	      "broadcast");
	CHECK(kolo_wait(h) == KOLO_OK && b[3] == size_ - 1, "broadcast result");
	/* alltoall, equal split */
	int32_t *snd = malloc((size_t)size_ * 2 * sizeof(int32_t));
	for (int j = 0; j < size_ * 2; j++)
		snd[j] = rank_ * 100 + j / 2;
	out = NULL;
	CHECK(kolo_alltoall_async(comm, "a2a", snd, (size_t)size_ * 2, NULL, KOLO_INT32, &out, rc,
	                          NULL, NULL, &h) == KOLO_OK,
	      "alltoall: %s", kolo_last_error(comm));
	CHECK(kolo_wait(h) == KOLO_OK, "alltoall wait: %s", kolo_last_error(comm));
	for (int i = 0; i < size_ && out; i++)
		CHECK(rc[i] == 2 && ((int32_t *)out)[2 * i] == i * 100 + rank_, "alltoall value");
	free(out);
	/* alltoall into a buffer of ours; then one too small on the last rank alone */
	int32_t *into = calloc((size_t)size_ * 2, sizeof(int32_t));
	CHECK(kolo_alltoall_into_async(comm, "a2a.into", snd, (size_t)size_ * 2, NULL, KOLO_INT32,
	                               into, (size_t)size_ * 2, rc, NULL, NULL, &h) == KOLO_OK,
	      "alltoall_into: %s", kolo_last_error(comm));
	CHECK(kolo_wait(h) == KOLO_OK, "alltoall_into wait: %s", kolo_last_error(comm));
	for (int i = 0; i < size_; i++)
		CHECK(rc[i] == 2 && into[2 * i] == i * 100 + rank_ &&
		              into[2 * i + 1] == into[2 * i],
		      "alltoall_into value from rank %d: %d", i, into[2 * i]);
	size_t cap = rank_ == size_ - 1 ? (size_t)size_ * 2 - 1 : (size_t)size_ * 2;
	CHECK(kolo_alltoall_into_async(comm, "a2a.small", snd, (size_t)size_ * 2, NULL, KOLO_INT32,
	                               into, cap, rc, NULL, NULL, &h) == KOLO_OK,
	      "alltoall_into small: %s", kolo_last_error(comm));
	kolo_status_t ast = kolo_wait(h);
	CHECK(rank_ == size_ - 1 ? ast == KOLO_EINVAL : ast == KOLO_OK, "alltoall_into of %zu: %s",
	      cap, kolo_strerror(ast));
	free(into);
	free(snd);
	/* reducescatter */
	size_t count = (size_t)size_ * 3 + 1;
	float *rs = malloc(count * sizeof(float)), res[8];
	for (size_t i = 0; i < count; i++)
		rs[i] = 1;
	CHECK(kolo_reducescatter_async(comm, "rs", rs, res, count, KOLO_FLOAT32, KOLO_SUM, 1.0, 1.0,
	                               NULL, NULL, &h) == KOLO_OK,
	      "reducescatter");
	CHECK(kolo_wait(h) == KOLO_OK && res[0] == (float)size_, "reducescatter result");
	free(rs);
	free(rc);
	CHECK(kolo_barrier_async(comm, NULL, NULL, &h) == KOLO_OK, "barrier");
	CHECK(kolo_wait(h) == KOLO_OK, "barrier wait");
}

static void test_mismatch(kolo_comm_t *comm)
{
	float v[8] = {0};
	kolo_handle_t *h;
	size_t n = rank_ == 1 ? 8 : 4;
	CHECK(kolo_allreduce_async(comm, "mismatch", v, v, n, KOLO_FLOAT32, KOLO_SUM, 1.0, 1.0,
	                           NULL, NULL, &h) == KOLO_OK,
	      "enqueue");
	/* A pending name cannot be enqueued twice. */
	CHECK(kolo_allreduce_async(comm, "mismatch", v, v, n, KOLO_FLOAT32, KOLO_SUM, 1.0, 1.0,
	                           NULL, NULL, NULL) == KOLO_EINVAL,
	      "duplicate accepted");
	kolo_status_t st = kolo_wait(h);
	CHECK(st == KOLO_EMISMATCH, "mismatch gave %s", kolo_status_name(st));
	CHECK(strstr(kolo_last_error(comm), "rank 1: 8") != NULL, "mismatch message '%s'",
	      kolo_last_error(comm));
}

/* kolo_allgather_into_async: rank r's r+1 values land in the caller's
 * buffer; an output too small on rank 0 alone fails that rank's op only,
 * and the next collective runs on every rank. */
static void test_allgather_into(kolo_comm_t *comm)
{
	size_t total = (size_t)size_ * (size_t)(size_ + 1) / 2;
	int32_t mine[16], *out = calloc(total + 1, sizeof(int32_t));
	size_t *rc = calloc((size_t)size_, sizeof(size_t));
	for (int i = 0; i <= rank_; i++)
		mine[i] = 100 * rank_ + i;
	kolo_handle_t *h = NULL;
	CHECK(kolo_allgather_into_async(comm, "agi", mine, (size_t)rank_ + 1, KOLO_INT32, out,
	                                total + 1, rc, NULL, NULL, &h) == KOLO_OK,
	      "allgather_into: %s", kolo_last_error(comm));
	CHECK(kolo_wait(h) == KOLO_OK, "allgather_into wait: %s", kolo_last_error(comm));
	size_t o = 0;
	for (int r = 0; r < size_; r++) {
		CHECK(rc[r] == (size_t)r + 1, "allgather_into count of rank %d: %zu", r, rc[r]);
		for (size_t i = 0; i < rc[r]; i++, o++)
			CHECK(out[o] == 100 * r + (int32_t)i, "allgather_into value %zu: %d", o,
			      out[o]);
	}
	size_t cap = rank_ == 0 ? total - 1 : total;
	CHECK(kolo_allgather_into_async(comm, "agi.small", mine, (size_t)rank_ + 1, KOLO_INT32, out,
	                                cap, rc, NULL, NULL, &h) == KOLO_OK,
	      "allgather_into small: %s", kolo_last_error(comm));
	kolo_status_t st = kolo_wait(h);
	CHECK(rank_ == 0 ? st == KOLO_EINVAL && strstr(kolo_last_error(comm), "recvbuf holds")
	                 : st == KOLO_OK,
	      "allgather_into with %zu of %zu: %s (%s)", cap, total, kolo_strerror(st),
	      kolo_last_error(comm));
	int64_t b = rank_;
	CHECK(kolo_broadcast_async(comm, "agi.after", &b, 1, KOLO_INT64, 0, NULL, NULL, &h) ==
	                      KOLO_OK &&
	              kolo_wait(h) == KOLO_OK && b == 0,
	      "broadcast after a failed allgather_into: %s", kolo_last_error(comm));
	free(out);
	free(rc);
}

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* kolo_wait_for: a recv whose message is not sent yet is not done after its
 * deadline and keeps its handle; once the left neighbour has sent (after a
 * barrier that every rank enters only past its own timed wait) it is. */
static void test_wait_for(kolo_comm_t *comm)
{
	int left = (rank_ + size_ - 1) % size_, right = (rank_ + 1) % size_;
	int32_t got = -1, mine = 1000 + rank_;
	kolo_handle_t *h = NULL;
	CHECK(kolo_recv_async(comm, &got, sizeof(got), left, 91, NULL, NULL, NULL, &h) == KOLO_OK,
	      "recv_async: %s", kolo_last_error(comm));
	int done = 1;
	double t0 = now_s();
	CHECK(kolo_wait_for(h, 40, &done) == KOLO_OK, "wait_for");
	double waited = now_s() - t0;
	CHECK(!done, "wait_for: a recv with no message sent is done");
	CHECK(waited >= 0.039 && waited < 5.0, "wait_for waited %.3f s for a 40 ms deadline",
	      waited);
	CHECK(kolo_wait_for(h, -1, &done) == KOLO_EINVAL, "wait_for accepts a negative timeout");
	CHECK(kolo_barrier(comm) == KOLO_OK, "barrier: %s", kolo_last_error(comm));
	CHECK(kolo_send(comm, &mine, sizeof(mine), right, 91) == KOLO_OK, "send: %s",
	      kolo_last_error(comm));
	CHECK(kolo_wait_for(h, 20000, &done) == KOLO_OK && done, "wait_for: not done after 20 s");
	CHECK(kolo_wait(h) == KOLO_OK && got == 1000 + left, "recv got %d from %d", (int)got, left);
}

static void test_join(kolo_comm_t *comm)
{
	int batches = 1 + rank_;
	for (int b = 0; b < batches; b++) {
		double g = 1;
		kolo_handle_t *h;
		CHECK(kolo_allreduce_async(comm, "jgrad", &g, &g, 1, KOLO_FLOAT64, KOLO_SUM, 1.0,
		                           1.0, NULL, NULL, &h) == KOLO_OK,
		      "join enqueue");
		CHECK(kolo_wait(h) == KOLO_OK, "join wait");
		CHECK(g == size_ - b, "batch %d: %g, want %d", b, g, size_ - b);
	}
	int last = -1;
	CHECK(kolo_join(comm, &last) == KOLO_OK, "kolo_join: %s", kolo_last_error(comm));
	CHECK(last == size_ - 1, "last rank %d", last);
}

static void check_timeline(const char *path)
{
	json_error_t err;
	json_t *j = json_load_file(path, 0, &err);
	CHECK(j && json_is_array(j), "timeline %s: line %d: %s", path, err.line, err.text);
	if (!j)
		return;
	int neg = 0, ar = 0, names = 0;
	size_t i;
	json_t *ev;
	json_array_foreach(j, i, ev)
	{
		const char *nm = json_string_value(json_object_get(ev, "name"));
		if (!nm)
			continue;
		neg += strcmp(nm, "NEGOTIATE_ALLREDUCE") == 0;
		ar += strcmp(nm, "ALLREDUCE") == 0;
		names += strcmp(nm, "process_name") == 0;
	}
	CHECK(neg >= 6 && ar >= 6 && names >= 6, "timeline events %d %d %d", neg, ar, names);
	json_decref(j);
}

int main(int argc, char **argv)
{
	kolo_comm_t *comm = NULL;
	if (kolo_init(&comm) != KOLO_OK) {
		fprintf(stderr, "async_api_worker: kolo_init: %s\n", kolo_init_error());
		return 2;
	}
	rank_ = kolo_rank(comm);
	size_ = kolo_size(comm);
	const char *tl = argc > 1 ? argv[1] : NULL;
	if (tl)
		CHECK(kolo_timeline_start(comm, tl) == KOLO_OK, "timeline: %s",
		      kolo_last_error(comm));
	test_allreduce(comm);
	if (tl)
		CHECK(kolo_timeline_stop(comm) == KOLO_OK, "timeline stop");
	if (tl && rank_ == 0)
		check_timeline(tl);
	test_grouped(comm);
	test_others(comm);
	test_mismatch(comm);
	test_wait_for(comm);
	test_allgather_into(comm);
	test_join(comm);
	/* The same names again: now served from the response cache. */
	test_allreduce(comm);
	kolo_status_t st = kolo_finalize(comm);
	CHECK(st == KOLO_OK, "finalize: %s", kolo_strerror(st));
	if (failures)
		fprintf(stderr, "async_api_worker: rank %d: %d failure(s)\n", rank_, failures);
	else if (rank_ == 0)
		printf("async_api_worker: all checks passed on %d ranks\n", size_);
	return failures ? 1 : 0;
}
