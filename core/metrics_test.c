/* The Prometheus text of metrics.h against values computed here: label
 * escaping, cumulative histogram buckets, counters fed through the hooks.
 * Each test runs in its own process (Check's fork mode), so each starts
 * from zeroed counters. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "metrics.h"
#include "testutil.h"

/* The value of the sample whose line starts with `series` followed by a
 * space; -1 when there is none. Fails the test on two such lines. */
static double sample(const char *text, const char *series)
{
	size_t n = strlen(series);
	double v = -1;
	int found = 0;
	for (const char *p = text; *p;) {
		const char *eol = strchr(p, '\n');
		ck_assert_msg(eol, "text does not end with a newline");
		if ((size_t)(eol - p) > n && strncmp(p, series, n) == 0 && p[n] == ' ') {
			v = strtod(p + n + 1, NULL);
			found++;
		}
		p = eol + 1;
	}
	ck_assert_msg(found <= 1, "%s appears %d times", series, found);
	return v;
}

static char *render(void)
{
	char *t = NULL;
	size_t len = 0;
	ck_assert_int_eq(kolo_metrics_render(&t, &len), KOLO_OK);
	ck_assert_uint_eq(strlen(t), len);
	return t;
}

/* The smallest i with ns <= 2^i µs, by counting up (independent of the
 * library's bit trick). */
static unsigned lat_bucket_ref(uint64_t ns)
{
	unsigned i = 0;
	while (i < KOLO_METRICS_LAT_BUCKETS && ns > (1000ull << i))
		i++;
	return i;
}

START_TEST(labels_escape_values)
{
	char out[128];
	ck_assert(kolo_metrics_labels(out, sizeof(out), "job", "a\"b\\c\nd", "host", "h",
	                              (const char *)NULL));
	ck_assert_str_eq(out, "job=\"a\\\"b\\\\c\\nd\",host=\"h\"");
	ck_assert(kolo_metrics_labels(out, sizeof(out), (const char *)NULL));
	ck_assert_str_eq(out, "");
	/* Exactly enough room for k="vv" and the NUL, then one byte short. */
	ck_assert(kolo_metrics_labels(out, 7, "k", "vv", (const char *)NULL));
	ck_assert_str_eq(out, "k=\"vv\"");
	ck_assert(!kolo_metrics_labels(out, 6, "k", "vv", (const char *)NULL));
	ck_assert_str_eq(out, "");
}
END_TEST

START_TEST(family_escapes_help)
{
	struct kolo_metrics_text t = {0};
	kolo_metrics_text_family(&t, "x_total", "counter", "a\\b\nc \"q\"");
	ck_assert(!t.oom);
	ck_assert_str_eq(t.b, "# HELP x_total a\\\\b\\nc \"q\"\n# TYPE x_total counter\n");
	free(t.b);
}
END_TEST

START_TEST(histogram_buckets_are_cumulative)
{
	const char *le[] = {"0.5", "1", "2", "4"};
	uint64_t counts[5] = {3, 0, 7, 1, 5}; /* the last: above 4 */
	struct kolo_metrics_text t = {0};
	kolo_metrics_text_histogram(&t, "h", "a=\"x\"", le, 4, counts, "12.5");
	ck_assert(!t.oom);
	char want[1024];
	size_t o = 0;
	uint64_t run = 0;
	for (int i = 0; i < 4; i++) {
		run += counts[i];
		o += (size_t)snprintf(want + o, sizeof(want) - o,
		                      "h_bucket{a=\"x\",le=\"%s\"} %" PRIu64 "\n", le[i], run);
	}
	run += counts[4];
	snprintf(want + o, sizeof(want) - o,
	         "h_bucket{a=\"x\",le=\"+Inf\"} %" PRIu64 "\nh_sum{a=\"x\"} 12.5\nh_count{a=\"x\"} "
	         "%" PRIu64 "\n",
	         run, run);
	ck_assert_str_eq(t.b, want);
	free(t.b);
	/* Without labels: no leading comma, no braces on sum and count. */
	t = (struct kolo_metrics_text){0};
	kolo_metrics_text_histogram(&t, "h", "", le, 1, (uint64_t[]){2, 1}, "3");
	ck_assert_str_eq(t.b,
	                 "h_bucket{le=\"0.5\"} 2\nh_bucket{le=\"+Inf\"} 3\nh_sum 3\nh_count 3\n");
	free(t.b);
}
END_TEST

START_TEST(fixed_point_text)
{
	char b[32];
	ck_assert_str_eq(kolo_metrics_fixed(b, sizeof(b), 1500000, 6), "1.5");
	ck_assert_str_eq(kolo_metrics_fixed(b, sizeof(b), 7, 9), "0.000000007");
	ck_assert_str_eq(kolo_metrics_fixed(b, sizeof(b), 16777216, 6), "16.777216");
	ck_assert_str_eq(kolo_metrics_fixed(b, sizeof(b), 2000000, 6), "2");
	ck_assert_str_eq(kolo_metrics_fixed(b, sizeof(b), 1000, 6), "0.001");
	ck_assert_str_eq(kolo_metrics_fixed(b, sizeof(b), 0, 9), "0");
}
END_TEST

START_TEST(latency_bucket_bounds)
{
	const uint64_t ns[] = {
	        0,    1,        999,      1000,           1001,           2000,
	        2001, 65536000, 65536001, 16777216000ull, 16777216001ull, UINT64_MAX / 2};
	for (size_t i = 0; i < KOLO_ARRAY_SIZE(ns); i++)
		ck_assert_uint_eq(kolo_metrics_lat_bucket(ns[i]), lat_bucket_ref(ns[i]));
	ck_assert_uint_eq(kolo_metrics_lat_bucket(1000), 0);
	ck_assert_uint_eq(kolo_metrics_lat_bucket(1001), 1);
	ck_assert_uint_eq(kolo_metrics_lat_bucket(16777216001ull), KOLO_METRICS_LAT_BUCKETS);
}
END_TEST

/* Operations through the hook: the counters, the failures by code and the
 * latency histogram equal what was fed, bucket by bucket. */
START_TEST(collectives_render_what_was_counted)
{
	uint64_t want_b[KOLO_METRICS_LAT_BUCKETS + 1] = {0}, sum_ns = 0, bytes = 0;
	int n = 0;
	srand(7);
	for (int i = 0; i < 500; i++) {
		uint64_t ns = (uint64_t)rand() % 5000000u; /* up to 5 ms */
		uint64_t b = (uint64_t)(rand() % 65536);   /* small */
		kolo_metrics_coll_observe(KOLO_MCOLL_ALLREDUCE, KOLO_MMODE_ASYNC, b, ns, KOLO_OK);
		want_b[lat_bucket_ref(ns)]++;
		sum_ns += ns;
		bytes += b;
		n++;
	}
	kolo_metrics_coll_observe(KOLO_MCOLL_BROADCAST, KOLO_MMODE_BLOCKING, 16u << 20, 3000,
	                          KOLO_OK);
	kolo_metrics_coll_observe(KOLO_MCOLL_ALLGATHER, KOLO_MMODE_BLOCKING, 8, 10, KOLO_EPEER);
	kolo_metrics_coll_observe(KOLO_MCOLL_ALLGATHER, KOLO_MMODE_BLOCKING, 8, 10, KOLO_EPEER);
	kolo_metrics_transport_error(KOLO_MTRANSPORT_TCP, KOLO_ETIMEDOUT);
	char *t = render();
	ck_assert_int_eq(
	        sample(t, "kolo_collective_ops_total{collective=\"allreduce\",mode=\"async\"}"), n);
	ck_assert_int_eq(
	        sample(t, "kolo_collective_bytes_total{collective=\"allreduce\",mode=\"async\"}"),
	        (double)bytes);
	ck_assert_int_eq(
	        sample(t, "kolo_collective_ops_total{collective=\"allreduce\",mode=\"blocking\"}"),
	        0);
	ck_assert_int_eq(
	        sample(t, "kolo_collective_ops_total{collective=\"broadcast\",mode=\"blocking\"}"),
	        1);
	ck_assert_int_eq(sample(t, "kolo_collective_ops_total{collective=\"allgather\","
	                           "mode=\"blocking\"}"),
	                 0);
	ck_assert_int_eq(sample(t, "kolo_collective_failures_total{collective=\"allgather\","
	                           "mode=\"blocking\",code=\"EPEER\"}"),
	                 2);
	ck_assert_int_eq(sample(t, "kolo_transport_errors_total{transport=\"tcp\","
	                           "code=\"ETIMEDOUT\"}"),
	                 1);
	/* 16 MiB is the first large size; 3 µs falls in le=0.000004. */
	ck_assert_int_eq(sample(t, "kolo_collective_duration_seconds_bucket{collective="
	                           "\"broadcast\",size_class=\"large\",le=\"0.000002\"}"),
	                 0);
	ck_assert_int_eq(sample(t, "kolo_collective_duration_seconds_bucket{collective="
	                           "\"broadcast\",size_class=\"large\",le=\"0.000004\"}"),
	                 1);
	uint64_t run = 0;
	for (int i = 0; i <= KOLO_METRICS_LAT_BUCKETS; i++) {
		run += want_b[i];
		char series[256], le[32];
		if (i < KOLO_METRICS_LAT_BUCKETS)
			kolo_metrics_fixed(le, sizeof(le), 1ull << i, 6);
		else
			snprintf(le, sizeof(le), "+Inf");
		snprintf(series, sizeof(series),
		         "kolo_collective_duration_seconds_bucket{collective=\"allreduce\","
		         "size_class=\"small\",le=\"%s\"}",
		         le);
		ck_assert_msg(sample(t, series) == (double)run, "%s: %g, want %" PRIu64, series,
		              sample(t, series), run);
	}
	ck_assert_int_eq(sample(t, "kolo_collective_duration_seconds_count{collective="
	                           "\"allreduce\",size_class=\"small\"}"),
	                 n);
	double s = sample(t, "kolo_collective_duration_seconds_sum{collective=\"allreduce\","
	                     "size_class=\"small\"}");
	ck_assert_msg(s > (double)sum_ns / 1e9 - 1e-9 && s < (double)sum_ns / 1e9 + 1e-9,
	              "sum %g, want %g", s, (double)sum_ns / 1e9);
	/* Nothing was counted for medium allreduces: no such series. */
	ck_assert(!strstr(t, "collective=\"allreduce\",size_class=\"medium\""));
	free(t);
}
END_TEST

/* Every sample belongs to the family declared above it, counters end with
 * _total, and histograms have only _bucket, _sum and _count samples. */
START_TEST(every_sample_has_its_family)
{
	kolo_metrics_coll_observe(KOLO_MCOLL_BARRIER, KOLO_MMODE_BLOCKING, 0, 5000, KOLO_OK);
	kolo_metrics_fusion_batch(3, 96, 96, 128);
	kolo_metrics_set_assignment(1, 2, 1, 5);
	uint64_t ns[4] = {1000000, 3000000, 9000000, 10000000};
	kolo_metrics_reform_done(ns, false);
	kolo_metrics_sync_done();
	char *t = render();
	char family[128] = "", type[32] = "";
	int samples = 0;
	for (char *p = t; *p;) {
		char *eol = strchr(p, '\n');
		ck_assert(eol);
		*eol = '\0';
		if (strncmp(p, "# TYPE ", 7) == 0) {
			ck_assert_int_eq(sscanf(p + 7, "%127s %31s", family, type), 2);
			if (strcmp(type, "counter") == 0) {
				size_t fl = strlen(family);
				ck_assert_msg(fl > 6 && strcmp(family + fl - 6, "_total") == 0,
				              "counter %s does not end with _total", family);
			}
		} else if (p[0] != '#') {
			size_t fl = strlen(family);
			ck_assert_msg(fl && strncmp(p, family, fl) == 0, "%s outside its family",
			              p);
			const char *rest = p + fl;
			if (strcmp(type, "histogram") == 0)
				ck_assert_msg(strncmp(rest, "_bucket{", 8) == 0 ||
				                      strncmp(rest, "_sum", 4) == 0 ||
				                      strncmp(rest, "_count", 6) == 0,
				              "%s", p);
			else
				ck_assert_msg(rest[0] == ' ' || rest[0] == '{', "%s", p);
			samples++;
		}
		p = eol + 1;
	}
	ck_assert_int_gt(samples, 20);
	free(t);
}
END_TEST

START_TEST(fusion_and_elastic_render_what_was_counted)
{
	/* 96 of 128 bytes: ratio 0.75, first under le=1; 300 of 128: above 1;
	 * fusion off: no ratio. */
	kolo_metrics_fusion_batch(3, 96, 96, 128);
	kolo_metrics_fusion_batch(1, 300, 300, 128);
	kolo_metrics_fusion_batch(2, 10, 10, 0);
	kolo_metrics_fusion_batch(1, 1, 1, 1u << 20); /* below 1/1024: the first bucket */
	/* 64 of 1000 bytes through the buffer, the rest large tensors joined in
	 * place: the buffer is half full, though the batch is far larger. */
	kolo_metrics_fusion_batch(2, 1000, 64, 128);
	kolo_metrics_fusion_cycle(4);
	kolo_metrics_fusion_cycle(0);
	kolo_metrics_fusion_stall();
	uint64_t ns[4] = {1000000, 3000000, 9000000, 10000000}; /* 2, 6, 1 ms */
	kolo_metrics_reform_done(ns, false);
	kolo_metrics_reform_done(ns, true);
	kolo_metrics_set_assignment(3, 4, 1, 7);
	kolo_metrics_set_identity("j\"ob", "host-1");
	char *t = render();
	ck_assert_int_eq(sample(t, "kolo_fusion_batches_total"), 5);
	ck_assert_int_eq(sample(t, "kolo_fusion_batch_bytes_total"), 1407);
	ck_assert_int_eq(sample(t, "kolo_fusion_cycles_total"), 2);
	ck_assert_int_eq(sample(t, "kolo_fusion_cache_hits_total"), 4);
	ck_assert_int_eq(sample(t, "kolo_fusion_stall_warnings_total"), 1);
	ck_assert_int_eq(sample(t, "kolo_fusion_batch_tensors_bucket{le=\"1\"}"), 2);
	ck_assert_int_eq(sample(t, "kolo_fusion_batch_tensors_bucket{le=\"2\"}"), 4);
	ck_assert_int_eq(sample(t, "kolo_fusion_batch_tensors_bucket{le=\"4\"}"), 5);
	ck_assert_int_eq(sample(t, "kolo_fusion_batch_tensors_sum"), 9);
	ck_assert_int_eq(sample(t, "kolo_fusion_batch_fill_ratio_bucket{le=\"0.0009765625\"}"), 1);
	ck_assert_int_eq(sample(t, "kolo_fusion_batch_fill_ratio_bucket{le=\"0.5\"}"), 2);
	ck_assert_int_eq(sample(t, "kolo_fusion_batch_fill_ratio_bucket{le=\"1\"}"), 3);
	ck_assert_int_eq(sample(t, "kolo_fusion_batch_fill_ratio_bucket{le=\"+Inf\"}"), 4);
	ck_assert_int_eq(sample(t, "kolo_fusion_batch_fill_ratio_count"), 4);
	double fs =
	        sample(t, "kolo_fusion_batch_fill_ratio_sum"); /* 0.75 + 300/128 + 2^-20 + 0.5 */
	ck_assert_msg(fs > 3.59375 && fs < 3.593752, "fill ratio sum %.7f", fs);
	ck_assert_int_eq(sample(t, "kolo_elastic_reforms_total{cause=\"failure\"}"), 1);
	ck_assert_int_eq(sample(t, "kolo_elastic_reforms_total{cause=\"commit\"}"), 1);
	/* teardown 2 ms: le=0.002 holds both; round 6 ms: first under 0.008. */
	ck_assert_int_eq(sample(t, "kolo_elastic_reform_phase_seconds_bucket{phase=\"teardown\","
	                           "le=\"0.001\"}"),
	                 0);
	ck_assert_int_eq(sample(t, "kolo_elastic_reform_phase_seconds_bucket{phase=\"teardown\","
	                           "le=\"0.002\"}"),
	                 2);
	ck_assert_int_eq(sample(t, "kolo_elastic_reform_phase_seconds_bucket{phase=\"round\","
	                           "le=\"0.004\"}"),
	                 0);
	ck_assert_int_eq(sample(t, "kolo_elastic_reform_phase_seconds_bucket{phase=\"round\","
	                           "le=\"0.008\"}"),
	                 2);
	ck_assert_int_eq(sample(t, "kolo_elastic_reform_phase_seconds_count{phase=\"connect\"}"),
	                 2);
	/* No failure was seen and no sync followed: no such phases. */
	ck_assert(!strstr(t, "phase=\"detect\""));
	ck_assert(!strstr(t, "phase=\"sync\""));
	ck_assert_int_eq(sample(t, "kolo_rank"), 3);
	ck_assert_int_eq(sample(t, "kolo_size"), 4);
	ck_assert_int_eq(sample(t, "kolo_local_rank"), 1);
	ck_assert_int_eq(sample(t, "kolo_round"), 7);
	ck_assert_int_eq(sample(t, "kolo_info{version=\"" KOLO_VERSION_STRING
	                           "\",job=\"j\\\"ob\",host=\"host-1\",rank=\"3\"}"),
	                 1);
	free(t);
}
END_TEST

START_TEST(detect_and_sync_follow_a_failure)
{
	kolo_metrics_coll_done(KOLO_MCOLL_ALLREDUCE, KOLO_MMODE_BLOCKING, 4, kolo_metrics_start(),
	                       KOLO_OK);
	kolo_metrics_failure_seen();
	kolo_metrics_failure_seen(); /* only the first of a re-form counts */
	uint64_t now = kolo_now_ns();
	uint64_t ns[4] = {now, now, now, now};
	kolo_metrics_reform_done(ns, false);
	kolo_metrics_sync_done();
	kolo_metrics_sync_done(); /* a sync without a re-form before it: none */
	char *t = render();
	ck_assert_int_eq(sample(t, "kolo_elastic_reform_phase_seconds_count{phase=\"detect\"}"), 1);
	ck_assert_int_eq(sample(t, "kolo_elastic_reform_phase_seconds_count{phase=\"sync\"}"), 1);
	free(t);
}
END_TEST

/* Before kolo_metrics_enable nothing counts and no clock is read. */
START_TEST(off_until_enabled)
{
	ck_assert(!kolo_metrics_enabled());
	ck_assert_uint_eq(kolo_metrics_start(), 0);
	kolo_metrics_coll_done(KOLO_MCOLL_ALLREDUCE, KOLO_MMODE_BLOCKING, 8, 0, KOLO_OK);
	kolo_metrics_coll_observe(KOLO_MCOLL_ALLREDUCE, KOLO_MMODE_BLOCKING, 8, 10, KOLO_OK);
	kolo_metrics_fusion_batch(2, 8, 8, 64);
	kolo_metrics_fusion_cycle(1);
	kolo_metrics_transport_error(KOLO_MTRANSPORT_SHM, KOLO_EPEER);
	kolo_metrics_enable();
	ck_assert_uint_gt(kolo_metrics_start(), 0);
	/* Started while off: counted, without a duration. */
	kolo_metrics_coll_done(KOLO_MCOLL_BROADCAST, KOLO_MMODE_ASYNC, 8, 0, KOLO_OK);
	char *t = render();
	ck_assert_int_eq(
	        sample(t, "kolo_collective_ops_total{collective=\"allreduce\",mode=\"blocking\"}"),
	        0);
	ck_assert_int_eq(
	        sample(t, "kolo_collective_ops_total{collective=\"broadcast\",mode=\"async\"}"), 1);
	ck_assert(!strstr(t, "kolo_collective_duration_seconds_bucket"));
	ck_assert_int_eq(sample(t, "kolo_fusion_batches_total"), 0);
	ck_assert_int_eq(sample(t, "kolo_fusion_cycles_total"), 0);
	ck_assert(!strstr(t, "kolo_transport_errors_total{"));
	free(t);
}
END_TEST

static void enable(void)
{
	kolo_metrics_enable();
}

static Suite *metrics_suite(void)
{
	Suite *s = suite_create("metrics");
	TCase *off = tcase_create("off");
	tcase_add_test(off, off_until_enabled);
	suite_add_tcase(s, off);
	TCase *tc = tcase_create("metrics");
	/* In the forked child of each test. */
	tcase_add_checked_fixture(tc, enable, NULL);
	tcase_add_test(tc, labels_escape_values);
	tcase_add_test(tc, family_escapes_help);
	tcase_add_test(tc, histogram_buckets_are_cumulative);
	tcase_add_test(tc, fixed_point_text);
	tcase_add_test(tc, latency_bucket_bounds);
	tcase_add_test(tc, collectives_render_what_was_counted);
	tcase_add_test(tc, every_sample_has_its_family);
	tcase_add_test(tc, fusion_and_elastic_render_what_was_counted);
	tcase_add_test(tc, detect_and_sync_follow_a_failure);
	suite_add_tcase(s, tc);
	return s;
}

KOLO_CHECK_MAIN(metrics_suite)
