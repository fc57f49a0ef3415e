/* The autotuner finds the best grid point of a synthetic throughput model
 * and logs every sample. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fusion_internal.h"
#include "testutil.h"

/* Seconds a step takes under (threshold, cycle): best at 16 MiB and 2 ms. */
static double step_time(uint64_t thr, double cyc)
{
	double mb = (double)thr / (1 << 20);
	double a = mb > 16 ? mb - 16 : 16 - mb;
	double b = cyc > 2 ? cyc - 2 : 2 - cyc;
	return 0.1 + 0.001 * a + 0.004 * b;
}

START_TEST(test_converges)
{
	char path[] = "/tmp/kolo_at_XXXXXX";
	int fd = mkstemp(path);
	ck_assert_int_ge(fd, 0);
	close(fd);
	struct fusion_autotune_config cfg = {
	        .threshold = 128u << 20,
	        .cycle_time_ms = 1,
	        .steps_per_sample = 3,
	        .warmup_samples = 1,
	        .samples_per_candidate = 3,
	        .log_path = path,
	};
	struct fusion_autotune *a;
	ck_assert_int_eq(fusion_autotune_create(&cfg, &a), KOLO_OK);
	uint64_t thr = cfg.threshold, now = 1000000000ull;
	double cyc = cfg.cycle_time_ms;
	const char *names[] = {"w1", "b1", "w2", "b2"};
	int changes = 0;
	for (int step = 0; step < 5000 && !fusion_autotune_done(a); step++) {
		double dt = step_time(thr, cyc) / 4;
		for (int k = 0; k < 4; k++) {
			now += (uint64_t)(dt * 1e9);
			uint64_t nt;
			double nc;
			if (fusion_autotune_record(a, names[k], 1000000, now, &nt, &nc)) {
				thr = nt;
				cyc = nc;
				fusion_autotune_applied(a, now);
				changes++;
			}
		}
	}
	ck_assert(fusion_autotune_done(a));
	uint64_t bt;
	double bc;
	fusion_autotune_best(a, &bt, &bc);
	ck_assert_uint_eq(bt, 16u << 20);
	ck_assert(bc == 2.0);
	ck_assert_uint_eq(thr, bt);
	ck_assert(cyc == bc);
	ck_assert_int_ge(changes, 13); /* 8 thresholds + 5 cycle times, then the choice */
	fusion_autotune_destroy(a);
	FILE *f = fopen(path, "r");
	ck_assert_ptr_nonnull(f);
	char line[256];
	int lines = 0, chosen = 0;
	while (fgets(line, sizeof(line), f)) {
		lines++;
		if (strncmp(line, "chosen,", 7) == 0) {
			chosen++;
			ck_assert_ptr_nonnull(strstr(line, ",16777216,2,"));
		}
	}
	fclose(f);
	ck_assert_int_eq(chosen, 1);
	ck_assert_int_ge(lines, 1 + 13 * 4);
	unlink(path);
}
END_TEST

static Suite *autotune_suite(void)
{
	Suite *s = suite_create("autotune");
	TCase *tc = tcase_create("core");
	tcase_set_timeout(tc, 20);
	tcase_add_test(tc, test_converges);
	suite_add_tcase(s, tc);
	return s;
}

KOLO_CHECK_MAIN(autotune_suite)
