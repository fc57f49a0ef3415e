/* The timeline writer produces Chrome-trace JSON that parses. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fusion_internal.h"
#include "testutil.h"

static json_t *load(const char *path)
{
	json_error_t err;
	json_t *j = json_load_file(path, 0, &err);
	if (!j)
		ck_abort_msg("%s:%d: %s", path, err.line, err.text);
	ck_assert(json_is_array(j));
	return j;
}

static int count_events(json_t *arr, const char *ph, const char *name)
{
	int n = 0;
	size_t i;
	json_t *ev;
	json_array_foreach(arr, i, ev)
	{
		const char *p = json_string_value(json_object_get(ev, "ph"));
		const char *nm = json_string_value(json_object_get(ev, "name"));
		if (p && strcmp(p, ph) == 0 && (!name || (nm && strcmp(nm, name) == 0)))
			n++;
	}
	return n;
}

START_TEST(test_events)
{
	char path[] = "/tmp/kolo_tl_XXXXXX";
	int fd = mkstemp(path);
	ck_assert_int_ge(fd, 0);
	close(fd);
	struct fusion_timeline *t;
	struct kolo_errbuf eb = {{0}};
	ck_assert_int_eq(fusion_timeline_create(path, 1024, true, &t, &eb), KOLO_OK);
	uint64_t ts = kolo_now_ns() / 1000;
	fusion_timeline_mark_cycle(t, ts);
	fusion_timeline_negotiate_begin(t, "layer1/\"w\"", KOLO_FK_ALLREDUCE, ts);
	fusion_timeline_rank_ready(t, "layer1/\"w\"", 0, ts + 1);
	fusion_timeline_rank_ready(t, "layer1/\"w\"", 1, ts + 5);
	fusion_timeline_negotiate_end(t, "layer1/\"w\"", ts + 5);
	const char *acts[] = {"QUEUE", "MEMCPY_IN_FUSION_BUFFER", "ALLREDUCE",
	                      "MEMCPY_OUT_FUSION_BUFFER"};
	for (int i = 0; i < 4; i++) {
		fusion_timeline_begin(t, "layer1/\"w\"", acts[i], ts + 6 + (uint64_t)i);
		fusion_timeline_end(t, "layer1/\"w\"", ts + 7 + (uint64_t)i);
	}
	fusion_timeline_begin(t, "b", "BROADCAST", ts + 20);
	fusion_timeline_end(t, "b", ts + 21);
	fusion_timeline_destroy(t);

	json_t *j = load(path);
	ck_assert_int_eq(count_events(j, "M", "process_name"), 2);
	ck_assert_int_eq(count_events(j, "B", "NEGOTIATE_ALLREDUCE"), 1);
	ck_assert_int_eq(count_events(j, "i", "0"), 1);
	ck_assert_int_eq(count_events(j, "i", "1"), 1);
	ck_assert_int_eq(count_events(j, "i", "CYCLE_START"), 1);
	for (int i = 0; i < 4; i++)
		ck_assert_int_eq(count_events(j, "B", acts[i]), 1);
	ck_assert_int_eq(count_events(j, "E", NULL), 6);
	/* The tensor's name is in its process metadata, escaped correctly. */
	size_t i;
	json_t *ev;
	bool found = false;
	json_array_foreach(j, i, ev)
	{
		json_t *args = json_object_get(ev, "args");
		const char *nm = json_string_value(json_object_get(args, "name"));
		if (nm && strcmp(nm, "layer1/\"w\"") == 0)
			found = true;
	}
	ck_assert(found);
	json_decref(j);
	unlink(path);
}
END_TEST

START_TEST(test_empty_and_bounded)
{
	char path[] = "/tmp/kolo_tl_XXXXXX";
	int fd = mkstemp(path);
	ck_assert_int_ge(fd, 0);
	close(fd);
	struct fusion_timeline *t;
	struct kolo_errbuf eb = {{0}};
	ck_assert_int_eq(fusion_timeline_create(path, 4, false, &t, &eb), KOLO_OK);
	fusion_timeline_destroy(t);
	json_t *j = load(path);
	ck_assert_uint_eq(json_array_size(j), 0);
	json_decref(j);

	/* A tiny queue drops instead of blocking, and the file stays valid. */
	ck_assert_int_eq(fusion_timeline_create(path, 2, false, &t, &eb), KOLO_OK);
	for (int k = 0; k < 10000; k++)
		fusion_timeline_begin(t, "x", "QUEUE", (uint64_t)k);
	uint64_t dropped = fusion_timeline_dropped(t);
	fusion_timeline_destroy(t);
	j = load(path);
	ck_assert_uint_eq(json_array_size(j) + dropped, 10002);
	json_decref(j);
	unlink(path);

	ck_assert_int_ne(fusion_timeline_create("/nonexistent/dir/x.json", 4, false, &t, &eb),
	                 KOLO_OK);
	ck_assert_ptr_nonnull(strstr(eb.msg, "/nonexistent/dir/x.json"));
}
END_TEST

static Suite *timeline_suite(void)
{
	Suite *s = suite_create("timeline");
	TCase *tc = tcase_create("core");
	tcase_set_timeout(tc, 20);
	tcase_add_test(tc, test_events);
	tcase_add_test(tc, test_empty_and_bounded);
	suite_add_tcase(s, tc);
	return s;
}

KOLO_CHECK_MAIN(timeline_suite)
