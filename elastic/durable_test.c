/* Durable commits: the file format, its atomic replace, the refusal of a
 * damaged file, the writer thread, and the packed state registry. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "durable.h"
#include "membership.h"
#include "testutil.h"

static char dir[64];
static char path[256];

static void setup(void)
{
	snprintf(dir, sizeof(dir), "/tmp/kolo-durable-test-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
	kolo_durable_path(path, sizeof(path), dir, "team/job1");
}

static void teardown(void)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	char p[512];
	while (d && (e = readdir(d)))
		if (e->d_name[0] != '.' || strlen(e->d_name) > 2) {
			snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
			unlink(p);
		}
	if (d)
		closedir(d);
	rmdir(dir);
}

static int entries(void)
{
	DIR *d = opendir(dir);
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)))
		n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
	closedir(d);
	return n;
}

static kolo_status_t read_back(void **data, size_t *len, int64_t *commit)
{
	struct kolo_errbuf eb = {{0}};
	return kolo_durable_read(path, data, len, commit, &eb);
}

START_TEST(test_round_trip_and_replace)
{
	struct kolo_errbuf eb = {{0}};
	void *data;
	size_t len;
	int64_t commit = 0;
	ck_assert(strstr(path, "/kolo-team_job1.state") != NULL);
	ck_assert_int_eq(read_back(&data, &len, &commit), KOLO_ENOTFOUND);
	ck_assert_int_eq(kolo_durable_write(path, "first", 5, 10, &eb), KOLO_OK);
	ck_assert_int_eq(kolo_durable_write(path, "second!", 7, 20, &eb), KOLO_OK);
	ck_assert_int_eq(entries(), 1); /* no temporary file left */
	ck_assert_int_eq(read_back(&data, &len, &commit), KOLO_OK);
	ck_assert_int_eq(commit, 20);
	ck_assert_uint_eq(len, 7);
	ck_assert(memcmp(data, "second!", 7) == 0);
	free(data);
	ck_assert_int_eq(kolo_durable_write(path, "", 0, 30, &eb), KOLO_OK);
	ck_assert_int_eq(read_back(&data, &len, &commit), KOLO_OK);
	ck_assert_int_eq(commit, 30);
	ck_assert_uint_eq(len, 0);
	free(data);
}
END_TEST

/* Writes a 1000-byte payload, then damages byte `at` (or cuts the file to
 * `cut` bytes when cut >= 0): the read must refuse it. */
static void refuse(long at, long cut)
{
	struct kolo_errbuf eb = {{0}};
	char payload[1000];
	memset(payload, 7, sizeof(payload));
	ck_assert_int_eq(kolo_durable_write(path, payload, sizeof(payload), 5, &eb), KOLO_OK);
	if (cut >= 0) {
		ck_assert_int_eq(truncate(path, cut), 0);
	} else {
		FILE *f = fopen(path, "r+b");
		fseek(f, at, SEEK_SET);
		int c = fgetc(f);
		fseek(f, at, SEEK_SET);
		fputc(c ^ 0x10, f);
		fclose(f);
	}
	void *data = (void *)1;
	size_t len = 1;
	int64_t commit = -1;
	ck_assert_int_eq(read_back(&data, &len, &commit), KOLO_EINVAL);
	ck_assert_ptr_null(data);
	ck_assert_int_eq(commit, -1);
}

START_TEST(test_damaged_refused)
{
	refuse(0, -1);                         /* magic */
	refuse(8, -1);                         /* version */
	refuse(16, -1);                        /* commit number */
	refuse(33, -1);                        /* checksum */
	refuse(KOLO_DURABLE_HEADER + 500, -1); /* payload */
	refuse(0, KOLO_DURABLE_HEADER + 999);  /* truncated payload */
	refuse(0, 20);                         /* truncated header */
	refuse(0, 0);                          /* empty */
}
END_TEST

struct seen {
	int calls;
	int64_t commit;
	kolo_status_t st;
};

static void on_written(void *arg, int64_t commit, size_t len, kolo_status_t st, const char *err)
{
	struct seen *s = arg;
	(void)len;
	(void)err;
	s->calls++;
	s->commit = commit;
	s->st = st;
}

START_TEST(test_writer)
{
	struct kolo_durable_writer *w;
	struct seen seen = {0};
	ck_assert_int_eq(kolo_durable_writer_create(path, on_written, &seen, &w), KOLO_OK);
	char big[1 << 16];
	for (int c = 1; c <= 5; c++) {
		memset(big, c, sizeof(big));
		ck_assert_int_eq(kolo_durable_writer_put(w, big, sizeof(big), c), KOLO_OK);
	}
	/* Destroy waits for the last put: commit 5 is on disk. */
	ck_assert(kolo_durable_writer_destroy(w, 10000));
	ck_assert_int_ge(seen.calls, 1);
	ck_assert_int_eq(seen.commit, 5);
	ck_assert_int_eq(seen.st, KOLO_OK);
	void *data;
	size_t len;
	int64_t commit;
	ck_assert_int_eq(read_back(&data, &len, &commit), KOLO_OK);
	ck_assert_int_eq(commit, 5);
	ck_assert_uint_eq(len, sizeof(big));
	ck_assert_int_eq(((unsigned char *)data)[len - 1], 5);
	free(data);
}
END_TEST

/* A write that ends only when the test writes a byte to the pipe (its
 * callback reads it): a write in flight, for kolo_durable_writer_wait. */
static int gate[2];

static void on_written_gated(void *arg, int64_t commit, size_t len, kolo_status_t st,
                             const char *err)
{
	char b;
	ck_assert_int_eq(read(gate[0], &b, 1), 1);
	on_written(arg, commit, len, st, err);
}

START_TEST(test_writer_wait)
{
	struct kolo_durable_writer *w;
	struct seen seen = {0};
	ck_assert_int_eq(pipe(gate), 0);
	ck_assert_int_eq(kolo_durable_writer_create(path, on_written_gated, &seen, &w), KOLO_OK);
	ck_assert(kolo_durable_writer_wait(w, 0)); /* nothing in flight */
	ck_assert_int_eq(kolo_durable_writer_put(w, "x", 1, 7), KOLO_OK);
	ck_assert(!kolo_durable_writer_wait(w, 50)); /* in flight: not done in time */
	ck_assert_int_eq(write(gate[1], "g", 1), 1);
	ck_assert(kolo_durable_writer_wait(w, 10000));
	ck_assert_int_eq(seen.calls, 1);
	ck_assert_int_eq(seen.commit, 7);
	/* The writer goes on after a wait. */
	ck_assert_int_eq(write(gate[1], "g", 1), 1);
	ck_assert_int_eq(kolo_durable_writer_put(w, "yz", 2, 8), KOLO_OK);
	ck_assert(kolo_durable_writer_destroy(w, 10000));
	ck_assert_int_eq(seen.commit, 8);
	close(gate[0]);
	close(gate[1]);
}
END_TEST

START_TEST(test_writer_error_not_fatal)
{
	struct kolo_durable_writer *w;
	struct seen seen = {0};
	char missing[300];
	snprintf(missing, sizeof(missing), "%s/no/such/dir/x.state", dir);
	ck_assert_int_eq(kolo_durable_writer_create(missing, on_written, &seen, &w), KOLO_OK);
	ck_assert_int_eq(kolo_durable_writer_put(w, "x", 1, 3), KOLO_OK);
	ck_assert(kolo_durable_writer_destroy(w, 10000));
	ck_assert_int_eq(seen.calls, 1);
	ck_assert_int_eq(seen.st, KOLO_ESYSTEM);
}
END_TEST

START_TEST(test_pack_unpack)
{
	struct kolo_elastic_state s, t;
	struct kolo_errbuf eb = {{0}};
	double w[3] = {1.5, -2, 3};
	int64_t step = 42;
	kolo_elastic_state_init(&s);
	kolo_elastic_state_add(&s, "w", w, 3, KOLO_FLOAT64, &eb);
	kolo_elastic_state_add(&s, "step", &step, 1, KOLO_INT64, &eb);
	kolo_elastic_state_save(&s);
	void *packed;
	size_t len;
	ck_assert_int_eq(kolo_elastic_state_pack(&s, &packed, &len), KOLO_OK);
	double w2[3] = {0};
	int64_t step2 = 0;
	kolo_elastic_state_init(&t);
	kolo_elastic_state_add(&t, "w", w2, 3, KOLO_FLOAT64, &eb);
	kolo_elastic_state_add(&t, "step", &step2, 1, KOLO_INT64, &eb);
	ck_assert_int_eq(kolo_elastic_state_unpack(&t, packed, len, &eb), KOLO_OK);
	ck_assert(memcmp(w, w2, sizeof(w)) == 0 && step2 == 42);
	ck_assert_int_eq(kolo_elastic_state_unpack(&t, packed, len - 1, &eb), KOLO_EMISMATCH);
	kolo_elastic_state_fini(&t);
	/* Another count: refused, nothing written. */
	double w3[4] = {9, 9, 9, 9};
	kolo_elastic_state_init(&t);
	kolo_elastic_state_add(&t, "w", w3, 4, KOLO_FLOAT64, &eb);
	kolo_elastic_state_add(&t, "step", &step2, 1, KOLO_INT64, &eb);
	ck_assert_int_eq(kolo_elastic_state_unpack(&t, packed, len, &eb), KOLO_EMISMATCH);
	ck_assert(w3[0] == 9 && strstr(eb.msg, "buffer w") != NULL);
	kolo_elastic_state_fini(&t);
	kolo_elastic_state_fini(&s);
	free(packed);
}
END_TEST

static Suite *durable_suite(void)
{
	Suite *s = suite_create("durable");
	TCase *tc = tcase_create("file");
	tcase_set_timeout(tc, 20);
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_round_trip_and_replace);
	tcase_add_test(tc, test_damaged_refused);
	tcase_add_test(tc, test_writer);
	tcase_add_test(tc, test_writer_wait);
	tcase_add_test(tc, test_writer_error_not_fatal);
	tcase_add_test(tc, test_pack_unpack);
	suite_add_tcase(s, tc);
	return s;
}

KOLO_CHECK_MAIN(durable_suite)
