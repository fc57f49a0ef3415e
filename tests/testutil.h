/* Helpers shared by the Check unit tests. */
#ifndef KOLO_TESTUTIL_H
#define KOLO_TESTUTIL_H

#include <check.h>
#include <stdlib.h>

/* main() for a test executable made of one suite. Each test runs in its own
 * process (Check's fork mode) with the timeout CK_DEFAULT_TIMEOUT. */
#define KOLO_CHECK_MAIN(suite_fn)                                                                  \
	int main(void)                                                                             \
	{                                                                                          \
		SRunner *sr = srunner_create(suite_fn());                                          \
		srunner_run_all(sr, CK_NORMAL);                                                    \
		int failed = srunner_ntests_failed(sr);                                            \
		srunner_free(sr);                                                                  \
		return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;                                  \
	}

#endif
