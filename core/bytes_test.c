#include <stdlib.h>
#include <string.h>

#include "bytes.h"
#include "testutil.h"

/* Pieces of every length up to 300 appended in turn equal their
 * concatenation made by hand, with a NUL after, at every step. */
START_TEST(append_matches_concatenation)
{
	char *buf = NULL;
	size_t len = 0, cap = 0;
	static char want[300 * 301 / 2 + 1];
	size_t want_len = 0;
	char piece[300] = {0};
	for (size_t n = 0; n < 300; n++) {
		for (size_t i = 0; i < n; i++)
			piece[i] = (char)('a' + (n + i) % 26);
		ck_assert(kolo_bytes_append(&buf, &len, &cap, piece, n, 0));
		for (size_t i = 0; i < n; i++)
			want[want_len++] = piece[i];
		ck_assert_uint_eq(len, want_len);
		ck_assert_uint_gt(cap, len);
		ck_assert(memcmp(buf, want, len) == 0);
		ck_assert_int_eq(buf[len], '\0');
	}
	free(buf);
}
END_TEST

START_TEST(first_growth_honours_min_cap)
{
	char *buf = NULL;
	size_t len = 0, cap = 0;
	ck_assert(kolo_bytes_append(&buf, &len, &cap, "ab", 2, 1024));
	ck_assert_uint_eq(cap, 1024);
	ck_assert_str_eq(buf, "ab");
	ck_assert(kolo_bytes_append(&buf, &len, &cap, NULL, 0, 1024));
	ck_assert_uint_eq(len, 2);
	free(buf);
}
END_TEST

static Suite *bytes_suite(void)
{
	Suite *s = suite_create("bytes");
	TCase *tc = tcase_create("bytes");
	tcase_add_test(tc, append_matches_concatenation);
	tcase_add_test(tc, first_growth_honours_min_cap);
	suite_add_tcase(s, tc);
	return s;
}

KOLO_CHECK_MAIN(bytes_suite)
