/* kolo-bench: benchmarks in the manner of nccl-tests. Run under kolorun:
 *   kolorun -np 4 -- kolo-bench allreduce -b 8 -e 256M -f 2 --check */
#include <stdio.h>
#include <string.h>

#include "bench.h"

typedef int (*bench_fn)(int argc, char **argv);

struct subcommand {
	const char *name;
	const char *help;
};

static const struct subcommand subcommands[] = {
        {"allreduce", "kolo_allreduce over a sweep of sizes"},
        {"allgather", "kolo_allgather (bytes = the gathered total)"},
        {"broadcast", "kolo_broadcast from --root"},
        {"reducescatter", "kolo_reducescatter (bytes = the input total)"},
        {"alltoall", "kolo_alltoall (bytes = one rank's send buffer)"},
        {"barrier", "kolo_barrier latency"},
        {"copybw", "pinned host <-> device copy bandwidth (CUDA)"},
        {"rendezvous", "rendezvous server: joins, KV and round formation"},
        {"fusion", "fusion engine: many small named tensors"},
        {"elastic", "elastic: time to re-form after a failure"},
};

static void usage(FILE *f)
{
	fprintf(f,
	        "usage: kolo-bench <subcommand> [options]   (<subcommand> --help for its options)\n"
	        "\nsubcommands:\n");
	for (size_t i = 0; i < sizeof(subcommands) / sizeof(subcommands[0]); i++)
		fprintf(f, "  %-14s %s\n", subcommands[i].name, subcommands[i].help);
}

static bench_fn lookup(const char *name)
{
	if (kolo_bench_coll_known(name))
		return kolo_bench_coll;
	if (strcmp(name, "copybw") == 0)
		return kolo_bench_copybw;
	if (strcmp(name, "rendezvous") == 0)
		return kolo_bench_rendezvous;
	if (strcmp(name, "fusion") == 0)
		return kolo_bench_fusion;
	if (strcmp(name, "elastic") == 0)
		return kolo_bench_elastic;
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		usage(stderr);
		return 2;
	}
	const char *name = argv[1];
	if (strcmp(name, "-h") == 0 || strcmp(name, "--help") == 0 || strcmp(name, "help") == 0) {
		usage(stdout);
		return 0;
	}
	int known = 0;
	for (size_t i = 0; i < sizeof(subcommands) / sizeof(subcommands[0]); i++)
		known |= strcmp(name, subcommands[i].name) == 0;
	if (!known) {
		fprintf(stderr, "kolo-bench: unknown subcommand '%s'\n", name);
		usage(stderr);
		return 2;
	}
	bench_fn fn = lookup(name);
	if (fn == NULL) {
		fprintf(stderr, "kolo-bench: subcommand '%s' is not built in this binary\n", name);
		return 2;
	}
	return fn(argc - 1, argv + 1);
}
