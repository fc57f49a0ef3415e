/* kolo-bench: the subcommands. Each takes the argument vector that follows
 * the program name (argv[0] is the subcommand), prints its results (rank 0
 * only, when it runs on a comm) and returns the process exit status.
 *
 * The collectives live in bench_coll.c. rendezvous, fusion and elastic are
 * optional: each is declared weak here and built when its bench_<name>.c is
 * present, so main() reports "not built" when the symbol is NULL. */
#ifndef KOLO_BENCH_H
#define KOLO_BENCH_H

/* Benchmarks the collective named argv[0] (allreduce, allgather, broadcast,
 * reducescatter, alltoall, barrier); 0 on success, 1 on a failure or a wrong
 * element, 2 on a usage error. */
int kolo_bench_coll(int argc, char **argv);
/* true when name is a collective that kolo_bench_coll() measures. */
int kolo_bench_coll_known(const char *name);

int kolo_bench_rendezvous(int argc, char **argv) __attribute__((weak));
int kolo_bench_fusion(int argc, char **argv) __attribute__((weak));
int kolo_bench_elastic(int argc, char **argv) __attribute__((weak));

#endif /* KOLO_BENCH_H */
