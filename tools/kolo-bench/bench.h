/* kolo-bench: the subcommands. Each takes the argument vector that follows
 * the program name (argv[0] is the subcommand), prints its results (rank 0
 * only, when it runs on a comm) and returns the process exit status.
 *
 * The collectives live in bench_coll.c. rendezvous, fusion and elastic are
 * optional: each is declared weak here and built when its bench_<name>.c is
 * present, so main() reports "not built" when the symbol is NULL. */
#ifndef KOLO_BENCH_H
#define KOLO_BENCH_H

#include <stddef.h>
#include <stdint.h>

/* Benchmarks the collective named argv[0] (allreduce, allgather, broadcast,
 * reducescatter, alltoall, barrier); 0 on success, 1 on a failure or a wrong
 * element, 2 on a usage error. */
int kolo_bench_coll(int argc, char **argv);
/* "64M" -> 67108864: K, M, G (optionally followed by B or iB) are binary;
 * 0, or -1 for a malformed size. */
int kolo_bench_parse_size(const char *s, uint64_t *out);
/* true when name is a collective that kolo_bench_coll() measures. */
int kolo_bench_coll_known(const char *name);

/* Pinned host <-> device copy bandwidth (bench_cuda.c); 0, 1 on a failure
 * (no CUDA device among them), 2 on a usage error. */
int kolo_bench_copybw(int argc, char **argv);

/* ---- bench_cuda.c: device buffers for --device cuda ----------------------
 * Each returns 0 (or a pointer) on success and otherwise writes the reason
 * into why (why_size bytes). */
struct bench_dev {
	int ordinal; /* the GPU this process uses: local rank mod the GPUs */
	int count;   /* GPUs visible */
	char name[256];
};
/* Loads libcudart (the same file libkolo loaded) and selects this rank's
 * GPU; fails with the reason when no GPU is visible. */
int bench_cuda_open(int local_rank, struct bench_dev *dev, char *why, size_t why_size);
void *bench_cuda_malloc(size_t bytes, char *why, size_t why_size);
void bench_cuda_free(void *p); /* NULL is fine */
/* A synchronous copy between any two of host and device memory. */
int bench_cuda_copy(void *dst, const void *src, size_t bytes, char *why, size_t why_size);

int kolo_bench_rendezvous(int argc, char **argv) __attribute__((weak));
int kolo_bench_fusion(int argc, char **argv) __attribute__((weak));
int kolo_bench_elastic(int argc, char **argv) __attribute__((weak));

#endif /* KOLO_BENCH_H */
