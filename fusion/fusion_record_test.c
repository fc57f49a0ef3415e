/* Unit tests of the negotiation record codec (record.c) against the byte
 * layout written out by hand, its limits, and truncation at every byte. */
#include <stdlib.h>
#include <string.h>

#include "fusion_internal.h"
#include "testutil.h"

/* Appends n bytes of v at b + *o. */
static void put(uint8_t *b, size_t *o, const void *v, size_t n)
{
	memcpy(b + *o, v, n);
	*o += n;
}

/* The bytes of REQUEST "ab": ALLREDUCE float32 AVERAGE on device memory,
 * root 0, prescale 1, postscale 0.5, counts {3, 5}, in the order
 * fusion_internal.h gives. */
static size_t expected_request(uint8_t *b)
{
	const uint8_t head[5] = {FUSION_RECORD_REQUEST, KOLO_FK_ALLREDUCE, KOLO_FLOAT32,
	                         KOLO_AVERAGE, 1};
	const uint32_t root = 0, ncounts = 2, name_len = 2;
	const double scales[2] = {1.0, 0.5};
	const uint64_t counts[2] = {3, 5};
	size_t o = 0;
	put(b, &o, head, sizeof(head));
	put(b, &o, &root, 4);
	put(b, &o, scales, 16);
	put(b, &o, &ncounts, 4);
	put(b, &o, counts, 16);
	put(b, &o, &name_len, 4);
	put(b, &o, "ab", 2);
	return o;
}

START_TEST(test_request_layout_and_round_trip)
{
	uint64_t counts[2] = {3, 5};
	struct fusion_params p = {.kind = KOLO_FK_ALLREDUCE,
	                          .dtype = KOLO_FLOAT32,
	                          .op = KOLO_AVERAGE,
	                          .mem = 1,
	                          .prescale = 1.0,
	                          .postscale = 0.5,
	                          .ncounts = 2,
	                          .counts = counts};
	struct fusion_wbuf w = {0};
	fusion_record_put_request(&w, "ab", &p);
	uint8_t want[128];
	size_t n = expected_request(want);
	ck_assert(!w.oom);
	ck_assert_uint_eq(w.len, n);
	ck_assert(memcmp(w.b, want, n) == 0);

	struct fusion_record r;
	size_t off = 0;
	ck_assert_int_eq(fusion_record_decode(want, n, &off, &r), KOLO_OK);
	ck_assert_uint_eq(off, n);
	ck_assert_int_eq(r.type, FUSION_RECORD_REQUEST);
	ck_assert_str_eq(r.name, "ab");
	ck_assert(fusion_params_equal(&r.p, &p));
	/* Host and device memory are different params. */
	r.p.mem = 0;
	ck_assert(!fusion_params_equal(&r.p, &p));
	fusion_record_fini(&r);
	free(w.b);
}
END_TEST

START_TEST(test_params_and_fail)
{
	struct fusion_wbuf w = {0};
	fusion_record_put_params(&w, 1u << 20, 2.5);
	fusion_record_put_fail(&w, KOLO_ETIMEDOUT, "x", "slow");
	ck_assert_uint_eq(w.len, (1 + 8 + 8) + (1 + 1 + 4 + 1 + 4 + 4));
	struct fusion_record r;
	size_t off = 0;
	ck_assert_int_eq(fusion_record_decode(w.b, w.len, &off, &r), KOLO_OK);
	ck_assert_int_eq(r.type, FUSION_RECORD_PARAMS);
	ck_assert_uint_eq(r.fusion_threshold, 1u << 20);
	ck_assert(r.cycle_time_ms == 2.5);
	fusion_record_fini(&r);
	ck_assert_int_eq(fusion_record_decode(w.b, w.len, &off, &r), KOLO_OK);
	ck_assert_uint_eq(off, w.len);
	ck_assert_int_eq(r.type, FUSION_RECORD_FAIL);
	ck_assert_int_eq(r.status, KOLO_ETIMEDOUT);
	ck_assert_str_eq(r.name, "x");
	ck_assert_str_eq(r.why, "slow");
	fusion_record_fini(&r);
	free(w.b);
}
END_TEST

/* Every proper prefix of a record is refused, moving nothing. */
START_TEST(test_truncated)
{
	uint8_t b[128];
	size_t n = expected_request(b);
	for (size_t len = 1; len < n; len++) {
		struct fusion_record r;
		size_t off = 0;
		ck_assert_int_eq(fusion_record_decode(b, len, &off, &r), KOLO_EPROTO);
		ck_assert_uint_eq(off, 0);
		ck_assert_ptr_null(r.name);
		ck_assert_ptr_null(r.p.counts);
	}
}
END_TEST

START_TEST(test_limits)
{
	uint8_t b[128];
	size_t n = expected_request(b);
	struct fusion_record r;
	size_t off = 0;
	b[0] = 4; /* no such record type */
	ck_assert_int_eq(fusion_record_decode(b, n, &off, &r), KOLO_EPROTO);
	b[0] = FUSION_RECORD_REQUEST;
	b[1] = KOLO_FK_COUNT; /* no such kind */
	ck_assert_int_eq(fusion_record_decode(b, n, &off, &r), KOLO_EPROTO);
	b[1] = 0;
	ck_assert_int_eq(fusion_record_decode(b, n, &off, &r), KOLO_EPROTO);
	b[1] = KOLO_FK_ALLREDUCE;
	uint32_t many = 1u << 30; /* more counts than bytes left */
	memcpy(b + 24, &many, 4);
	ck_assert_int_eq(fusion_record_decode(b, n, &off, &r), KOLO_EPROTO);
	ck_assert_uint_eq(off, 0);

	/* Names up to FUSION_NAME_MAX - 1 bytes. */
	char *name = malloc(FUSION_NAME_MAX + 1);
	ck_assert_ptr_nonnull(name);
	struct fusion_params p = {.kind = KOLO_FK_BARRIER};
	for (size_t len = FUSION_NAME_MAX - 1; len <= FUSION_NAME_MAX; len++) {
		memset(name, 'n', len);
		name[len] = '\0';
		struct fusion_wbuf w = {0};
		fusion_record_put_request(&w, name, &p);
		off = 0;
		kolo_status_t st = fusion_record_decode(w.b, w.len, &off, &r);
		ck_assert_int_eq(st, len < FUSION_NAME_MAX ? KOLO_OK : KOLO_EPROTO);
		if (st == KOLO_OK)
			ck_assert_uint_eq(strlen(r.name), len);
		fusion_record_fini(&r);
		free(w.b);
	}
	free(name);
}
END_TEST

static Suite *fusion_record_suite(void)
{
	Suite *s = suite_create("fusion_record");
	TCase *tc = tcase_create("core");
	tcase_add_test(tc, test_request_layout_and_round_trip);
	tcase_add_test(tc, test_params_and_fail);
	tcase_add_test(tc, test_truncated);
	tcase_add_test(tc, test_limits);
	suite_add_tcase(s, tc);
	return s;
}

KOLO_CHECK_MAIN(fusion_record_suite)
