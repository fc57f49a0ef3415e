/* mpi_bench: Open MPI's MPI_Allreduce (float32, sum) measured as kolo-bench
 * measures kolo_allreduce (tools/kolo-bench/bench_coll.c; the shared parts
 * in peer_bench.h). Run under mpirun:
 *
 *   mpirun -np 4 [--mca btl tcp,self --mca btl_tcp_if_include lo] \
 *          mpi_bench -b 1K -e 256M -f 4 --inplace --check --json
 *
 * Method, for each size: fill the buffers, --warmup untimed iterations, a
 * one-element MPI_Allreduce so that the ranks start together (nothing
 * returns from it before every rank has entered it, whatever algorithm Open
 * MPI picks), then --iters back-to-back iterations, each timed on its own.
 * The mean and the median are each the maximum over the ranks; CPU time per
 * iteration (getrusage) is averaged over the ranks. With --check the buffers
 * are refilled (the output poisoned first) and one more iteration is
 * compared with the exact sum. */
#define _GNU_SOURCE /* getopt_long, clock_gettime under -std=c11 */
#include <mpi.h>

#include <fcntl.h>
#include <unistd.h>

#include "peer_bench.h"

struct mpi_bench {
	struct peer_opts o;
	int rank, size;
	float *sendbuf, *recvbuf;
	double *times;
};

static void bench_size(struct mpi_bench *b, uint64_t req_bytes, int *any_wrong)
{
	const struct peer_opts *o = &b->o;
	size_t count = (size_t)(req_bytes / sizeof(float));
	uint64_t bytes = (uint64_t)count * sizeof(float);
	int iters, warmup;
	peer_counts(o, bytes, &iters, &warmup);
	float *in = o->inplace ? b->recvbuf : b->sendbuf;
	const void *send = o->inplace ? MPI_IN_PLACE : (const void *)b->sendbuf;
	int n = (int)count;

	peer_fill(in, b->recvbuf, count, b->rank, false);
	for (int i = 0; i < warmup; i++)
		MPI_Allreduce(send, b->recvbuf, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
	int one = 1;
	MPI_Allreduce(MPI_IN_PLACE, &one, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
	double cpu0 = peer_cpu_s(), t0 = peer_now_s(), prev = t0;
	for (int i = 0; i < iters; i++) {
		MPI_Allreduce(send, b->recvbuf, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
		double t = peer_now_s();
		b->times[i] = t - prev;
		prev = t;
	}
	double elapsed = prev - t0, cpu = peer_cpu_s() - cpu0;
	double median = peer_median(b->times, iters);

	uint64_t wrong = 0;
	if (o->check) {
		peer_fill(in, b->recvbuf, count, b->rank, true);
		MPI_Allreduce(send, b->recvbuf, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
		wrong = peer_verify(b->recvbuf, count, b->size);
	}

	double mx[2] = {elapsed / iters, median}, sum[2] = {cpu / iters, (double)wrong};
	MPI_Allreduce(MPI_IN_PLACE, mx, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
	MPI_Allreduce(MPI_IN_PLACE, sum, 2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
	if (sum[1] > 0)
		*any_wrong = 1;
	if (b->rank == 0) {
		struct peer_row r = {bytes, count, iters, mx[0], mx[1], sum[0] / b->size, sum[1]};
		peer_print_row(o, b->size, o->inplace, &r);
	}
}

/* --ready-fifo: after a barrier (every rank is up), rank 0 writes one byte to
 * the FIFO (as kolo-bench does; bench/latency/latency_holds.py). */
static void signal_ready(const struct mpi_bench *b)
{
	MPI_Barrier(MPI_COMM_WORLD);
	int fd = b->rank == 0 ? open(b->o.ready_fifo, O_WRONLY | O_NONBLOCK | O_CLOEXEC) : -2;
	if (fd == -1 || (fd >= 0 && (write(fd, "r", 1) != 1 || close(fd) != 0))) {
		fprintf(stderr, "mpi_bench: --ready-fifo %s: %s\n", b->o.ready_fifo,
		        strerror(errno));
		MPI_Abort(MPI_COMM_WORLD, 1);
	}
}

int main(int argc, char **argv)
{
	struct mpi_bench b;
	memset(&b, 0, sizeof(b));
	/* MPI_Init first: Open MPI may add or remove arguments */
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &b.rank);
	MPI_Comm_size(MPI_COMM_WORLD, &b.size);
	/* Errors abort the job by default (MPI_ERRORS_ARE_FATAL): a failed
	 * collective never prints a row. */
	int rc = peer_parse_opts(argc, argv, &b.o, false);
	if (rc != 0) {
		MPI_Finalize();
		return rc == 1 ? 0 : rc;
	}
	size_t max_count = (size_t)(b.o.max_bytes / sizeof(float));
	b.sendbuf = peer_alloc(max_count * sizeof(float));
	b.recvbuf = peer_alloc(max_count * sizeof(float));
	b.times = (double *)calloc((size_t)(b.o.iters ? b.o.iters : 200), sizeof(double));
	if (!b.sendbuf || !b.recvbuf || !b.times) {
		fprintf(stderr, "mpi_bench: rank %d: out of memory\n", b.rank);
		MPI_Abort(MPI_COMM_WORLD, 1);
	}
	if (b.rank == 0 && !b.o.json)
		peer_print_header(&b.o, "mpi_bench MPI_Allreduce", b.size, b.o.inplace);
	if (b.o.ready_fifo)
		signal_ready(&b);
	int any_wrong = 0;
	for (uint64_t bytes = b.o.min_bytes; bytes != 0; bytes = peer_next_size(&b.o, bytes))
		bench_size(&b, bytes, &any_wrong);
	if (any_wrong && b.rank == 0)
		fprintf(stderr, "mpi_bench: allreduce: wrong elements found\n");
	free(b.times);
	free(b.sendbuf);
	free(b.recvbuf);
	MPI_Finalize();
	return any_wrong ? 1 : 0;
}
