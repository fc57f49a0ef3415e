/* A small kolo program for the launcher tests, using the public API only:
 * prints its assignment, checks the data plane with an allreduce of the
 * ranks, and finalizes.
 *
 * PRINT_ASSIGNMENT_FAIL_RANK=r and PRINT_ASSIGNMENT_FAIL_CODE=c make rank r
 * exit with status c after a barrier while the other ranks wait (up to a
 * minute) to be stopped by the launcher. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "kolo/kolo.h"

int main(void)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	kolo_comm_t *comm = NULL;
	kolo_status_t st = kolo_init(&comm);
	if (st != KOLO_OK) {
		printf("kolo_init: %s: %s\n", kolo_status_name(st), kolo_init_error());
		return 3;
	}
	int rank = kolo_rank(comm), size = kolo_size(comm);
	printf("rank %d size %d local_rank %d local_size %d cross_rank %d cross_size %d round "
	       "%lld\n",
	       rank, size, kolo_local_rank(comm), kolo_local_size(comm), kolo_cross_rank(comm),
	       kolo_cross_size(comm), (long long)kolo_round(comm));
	const char *fail_rank = getenv("PRINT_ASSIGNMENT_FAIL_RANK");
	if (fail_rank && *fail_rank) {
		int fr = atoi(fail_rank);
		if (rank != fr)
			printf("rank %d waiting for SIGTERM\n", rank);
		if ((st = kolo_barrier(comm)) != KOLO_OK) {
			printf("barrier: %s: %s\n", kolo_status_name(st), kolo_last_error(comm));
			return 4;
		}
		/* A worker that dies: no finalize (and no leak check at exit). */
		if (rank == fr)
			_exit(atoi(getenv("PRINT_ASSIGNMENT_FAIL_CODE")));
		struct timespec ts = {.tv_sec = 60};
		nanosleep(&ts, NULL);
		return 0;
	}
	double x = rank, sum = 0;
	if ((st = kolo_allreduce(comm, &x, &sum, 1, KOLO_FLOAT64, KOLO_SUM)) != KOLO_OK) {
		printf("allreduce: %s: %s\n", kolo_status_name(st), kolo_last_error(comm));
		return 4;
	}
	if (sum != size * (size - 1) / 2.0) {
		printf("allreduce: sum of ranks %g, want %g\n", sum, size * (size - 1) / 2.0);
		return 5;
	}
	if ((st = kolo_finalize(comm)) != KOLO_OK) {
		printf("kolo_finalize: %s\n", kolo_status_name(st));
		return 6;
	}
	return 0;
}
