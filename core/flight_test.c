/* The flight recorder: states and the agreed order, the ring buffer's
 * wrap-around, the data plane's wait, and the JSON that reports carry
 * (docs/diagnosis.md). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "flight.h"
#include "metrics.h"
#include "testutil.h"

static const struct kolo_flight_identity ID = {
        .rank = 1, .size = 2, .round = 3, .host = "h\"1", .job = "j/x", .reason = "test"};

static char *render(int max)
{
	char *out = NULL;
	size_t len = 0;
	ck_assert_int_eq(kolo_flight_render(&ID, max, &out, &len), KOLO_OK);
	ck_assert_uint_eq(strlen(out), len);
	return out;
}

static int count(const char *s, const char *what)
{
	int n = 0;
	for (const char *p = strstr(s, what); p; p = strstr(p + 1, what))
		n++;
	return n;
}

START_TEST(states_and_order)
{
	struct kolo_flight *f = kolo_flight_create("job", 1, 2, NULL);
	uint64_t a = kolo_flight_submit(f, "grad.a", "allreduce", KOLO_FLOAT32, 16);
	uint64_t b = kolo_flight_submit(f, "grad.\"b\"", "allgather", KOLO_INT32, 8);
	uint64_t c = kolo_flight_submit(f, "grad.c", "allreduce", KOLO_FLOAT64, 8);
	ck_assert_uint_eq(a, 1);
	ck_assert_uint_eq(c, 3);
	/* b is negotiated before a: the agreed order is that of negotiation. */
	kolo_flight_mark(f, b, KOLO_FL_NEGOTIATED, KOLO_OK, NULL);
	kolo_flight_mark(f, a, KOLO_FL_NEGOTIATED, KOLO_OK, NULL);
	kolo_flight_mark(f, a, KOLO_FL_DATAPLANE, KOLO_OK, NULL);
	kolo_flight_mark(f, a, KOLO_FL_DONE, KOLO_OK, NULL);
	kolo_flight_mark(f, b, KOLO_FL_FAILED, KOLO_EMISMATCH, "rank 0 passed \"x\"");
	/* A finished entry stays finished. */
	kolo_flight_mark(f, a, KOLO_FL_FAILED, KOLO_EPEER, "late");
	char *s = render(0);
	ck_assert_ptr_nonnull(
	        strstr(s, "\"seq\":1,\"cseq\":2,\"name\":\"grad.a\",\"op\":\"allreduce\","
	                  "\"dtype\":\"float32\",\"bytes\":16,\"state\":\"done\""));
	ck_assert_ptr_nonnull(strstr(s, "\"seq\":2,\"cseq\":1,\"name\":\"grad.\\\"b\\\"\""));
	ck_assert_ptr_nonnull(strstr(s, "\"state\":\"failed\""));
	ck_assert_ptr_nonnull(strstr(s, "\"status\":\"KOLO_EMISMATCH\""));
	ck_assert_ptr_nonnull(strstr(s, "\"error\":\"rank 0 passed \\\"x\\\"\""));
	ck_assert_ptr_nonnull(strstr(s, "\"seq\":3,\"cseq\":0,\"name\":\"grad.c\""));
	ck_assert_ptr_nonnull(strstr(s, "\"host\":\"h\\\"1\""));
	ck_assert_ptr_null(strstr(s, "late"));
	ck_assert_int_eq(count(s, "\"dataplane\":"), 1); /* only a reached it */
	free(s);
	ck_assert(kolo_flight_oldest_open_s() >= 0.0);
	kolo_flight_mark(f, c, KOLO_FL_DONE, KOLO_OK, NULL);
	/* A blocking call: named when rendered, negotiated and running at once. */
	uint64_t d = kolo_flight_submit_running(f, "broadcast", 7, KOLO_UINT8, 3);
	s = render(0);
	ck_assert_ptr_nonnull(strstr(s, "\"seq\":4,\"cseq\":3,\"name\":\"broadcast.7\",\"op\":"
	                                "\"broadcast\",\"dtype\":\"uint8\",\"bytes\":3,"
	                                "\"state\":\"dataplane\""));
	free(s);
	kolo_flight_mark(f, d, KOLO_FL_DONE, KOLO_OK, NULL);
	ck_assert(kolo_flight_oldest_open_s() == 0.0);
	kolo_flight_destroy(f);
}
END_TEST

START_TEST(wraps_and_bounds)
{
	struct kolo_flight *f = kolo_flight_create("set 1", 0, 2, (const int[]){5, 7});
	for (int i = 0; i < KOLO_FLIGHT_ENTRIES + 44; i++) {
		char name[32];
		snprintf(name, sizeof(name), "op.%d", i);
		uint64_t q = kolo_flight_submit(f, name, "broadcast", KOLO_UINT8, 1);
		kolo_flight_mark(f, q, KOLO_FL_DONE, KOLO_OK, NULL);
	}
	char *s = render(0);
	ck_assert_int_eq(count(s, "\"seq\":"), KOLO_FLIGHT_ENTRIES);
	ck_assert_ptr_nonnull(strstr(s, "\"entries\":[{\"seq\":45,"));
	free(s);
	s = render(4);
	ck_assert_int_eq(count(s, "\"seq\":"), 4);
	ck_assert_ptr_nonnull(strstr(s, "\"name\":\"op.299\""));
	ck_assert_ptr_nonnull(strstr(s, "\"members\":[5,7]"));
	ck_assert_ptr_nonnull(strstr(s, "\"waiting_on\":-1"));
	free(s);
	/* A blocked wait names the peer by its job rank. */
	kolo_flight_waiting(f, true, 1);
	kolo_flight_activity(f, KOLO_FA_NEGOTIATING);
	s = render(1);
	ck_assert_ptr_nonnull(strstr(s, "\"activity\":\"negotiating\",\"waiting_on\":7"));
	ck_assert_ptr_null(strstr(s, "waiting_unacked_ms"));
	free(s);
	/* The probe to that peer's host, while blocked on it. */
	kolo_flight_waiting_unacked(f, 450);
	s = render(1);
	ck_assert_ptr_nonnull(strstr(s, "\"waiting_unacked_ms\":450"));
	free(s);
	kolo_flight_waiting(f, false, -1);
	s = render(1);
	ck_assert_ptr_nonnull(strstr(s, "\"waiting_on\":-1,\"waiting_ms\":0.0"));
	free(s);
	kolo_flight_destroy(f);
	/* No recorder: nothing recorded, nothing fails. */
	ck_assert_uint_eq(kolo_flight_submit(NULL, "x", "allreduce", 0, 0), 0);
	kolo_flight_mark(NULL, 1, KOLO_FL_DONE, KOLO_OK, NULL);
}
END_TEST

START_TEST(dump_file)
{
	struct kolo_flight *f = kolo_flight_create("job", 1, 2, NULL);
	kolo_flight_submit(f, "open.op", "allreduce", KOLO_FLOAT32, 4);
	char dir[] = "/tmp/kolo-flight-test-XXXXXX", path[512];
	ck_assert_ptr_nonnull(mkdtemp(dir));
	ck_assert_int_eq(kolo_flight_dump(&ID, dir, path, sizeof(path)), KOLO_OK);
	ck_assert_ptr_nonnull(strstr(path, "/kolo-flight-j_x-1-"));
	FILE *fp = fopen(path, "r");
	ck_assert_ptr_nonnull(fp);
	char buf[4096];
	size_t n = fread(buf, 1, sizeof(buf) - 1, fp);
	buf[n] = '\0';
	fclose(fp);
	ck_assert_ptr_nonnull(strstr(buf, "\"name\":\"open.op\",\"op\":\"allreduce\""));
	ck_assert_ptr_nonnull(strstr(buf, "\"reason\":\"test\""));
	unlink(path);
	rmdir(dir);
	ck_assert_int_ne(kolo_flight_dump(&ID, "/nonexistent/dir", path, sizeof(path)), KOLO_OK);
	kolo_flight_destroy(f);
}
END_TEST

/* Arrival lags: rank 1 (job rank 7) arrives 2 ms after the first in every
 * collective, rank 0 in time, and one collective has no late rank. */
START_TEST(arrival_lags)
{
	struct kolo_flight *f = kolo_flight_create("set 1", 0, 2, (const int[]){5, 7});
	struct kolo_flight_lag l;
	ck_assert(!kolo_flight_slowest("set 1", &l));
	for (int i = 0; i < 40; i++)
		kolo_flight_lags(f, (const uint64_t[]){1000000000ull, 1002000000ull}, 2);
	kolo_flight_lags(f, (const uint64_t[]){1000000000ull, 1000000000ull}, 2);
	ck_assert(kolo_flight_slowest("set 1", &l));
	ck_assert_int_eq(l.rank, 7);
	ck_assert_int_eq(l.ops, 41);
	ck_assert_int_eq(l.last, 40);
	ck_assert_double_eq_tol(l.p50_ms, 2.0, 1e-3);
	ck_assert_double_eq_tol(l.max_ms, 2.0, 1e-3);
	ck_assert(!kolo_flight_slowest("job", &l) || l.rank != 7);
	struct kolo_metrics_text t = {0};
	kolo_flight_metrics(&t);
	ck_assert_ptr_nonnull(t.b);
	ck_assert_ptr_nonnull(
	        strstr(t.b, "kolo_arrival_lag_seconds{comm=\"set 1\",rank=\"7\",quantile=\"0.5\"} "
	                    "0.002\n"));
	ck_assert_ptr_nonnull(strstr(
	        t.b, "kolo_arrival_lag_seconds{comm=\"set 1\",rank=\"5\",quantile=\"1\"} 0\n"));
	ck_assert_ptr_nonnull(
	        strstr(t.b, "kolo_arrival_last_ratio{comm=\"set 1\",rank=\"7\"} 0.97"));
	free(t.b);
	char *s = render(1);
	ck_assert_ptr_nonnull(strstr(s, "\"lag\":{\"ops\":41,\"p50_ms\":[0.000,2.000],"));
	ck_assert_ptr_nonnull(strstr(s, "\"last\":[0,40]}"));
	free(s);
	kolo_flight_destroy(f);
}
END_TEST

static Suite *flight_suite(void)
{
	Suite *s = suite_create("flight");
	TCase *tc = tcase_create("flight");
	tcase_add_test(tc, states_and_order);
	tcase_add_test(tc, wraps_and_bounds);
	tcase_add_test(tc, dump_file);
	tcase_add_test(tc, arrival_lags);
	suite_add_tcase(s, tc);
	return s;
}

KOLO_CHECK_MAIN(flight_suite)
