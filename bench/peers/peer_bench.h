/* What the peer benchmarks (gloo_bench.cc, mpi_bench.c) share with each
 * other and, line for line, with kolo-bench's collective benchmarks
 * (tools/kolo-bench/bench_coll.c): the options, the sizes, the iteration
 * counts, the inputs and their exact reference, the median and the output
 * (table and JSON). Only allreduce, float32, sum: what the comparisons in
 * docs/performance.md measure. Each harness supplies the collective, the
 * synchronising call and the reduction of the results over the ranks.
 *
 * Valid C11 and C++17, so that both harnesses include it; everything is
 * static inline because each harness uses a different part of it. */
#ifndef KOLO_PEER_BENCH_H
#define KOLO_PEER_BENCH_H

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

struct peer_opts {
	uint64_t min_bytes, max_bytes, step_bytes;
	double factor;
	int iters, warmup; /* 0: chosen per size, as kolo-bench does */
	bool check, json, inplace, cpu;
	/* gloo_bench only */
	int np;           /* ranks to fork (0: from GLOO_SIZE, or 2) */
	const char *algo; /* "ring_chunked" or "default" */
	/* mpi_bench only: rank 0 writes a byte there once every rank is up */
	const char *ready_fifo;
};

/* One measured size, already reduced over the ranks. */
struct peer_row {
	uint64_t bytes;
	size_t count;
	int iters;
	double time_s, median_s; /* each the maximum over the ranks */
	double cpu_s;            /* per iteration, averaged over the ranks */
	double wrong;            /* total over the ranks; < 0 without --check */
};

/* "64M" -> 67108864; K, M, G (optionally followed by B or iB) are binary. */
static inline int peer_parse_size(const char *s, uint64_t *out)
{
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (end == s || errno != 0)
		return -1;
	uint64_t mul = 1;
	switch (*end) {
	case 'k':
	case 'K':
		mul = 1ull << 10;
		end++;
		break;
	case 'm':
	case 'M':
		mul = 1ull << 20;
		end++;
		break;
	case 'g':
	case 'G':
		mul = 1ull << 30;
		end++;
		break;
	default:
		break;
	}
	if (mul > 1 && (strcmp(end, "iB") == 0 || strcmp(end, "B") == 0))
		end += strlen(end);
	if (*end != '\0' || v > UINT64_MAX / mul)
		return -1;
	*out = v * mul;
	return 0;
}

static inline int peer_parse_int(const char *s, int lo, int *out)
{
	char *end;
	errno = 0;
	long v = strtol(s, &end, 10);
	if (end == s || *end != '\0' || errno != 0 || v < lo || v > 1000000000)
		return -1;
	*out = (int)v;
	return 0;
}

static inline void peer_usage(FILE *f, const char *name, bool gloo)
{
	fprintf(f,
	        "usage: %s [options]   (allreduce, float32, sum)\n"
	        "  -b, --minbytes SIZE   smallest size (default 8; K, M, G suffixes are binary)\n"
	        "  -e, --maxbytes SIZE   largest size (default 64M)\n"
	        "  -f, --stepfactor F    multiply the size by F each step (default 2)\n"
	        "  -i, --stepbytes SIZE  add SIZE each step instead\n"
	        "  -d, --dtype float32   the only dtype\n"
	        "  -o, --op sum          the only op\n"
	        "  -n, --iters N         timed iterations per size (default: 200 down to 5 as\n"
	        "                        the size grows, about 1 GiB of data per size)\n"
	        "  -w, --warmup N        untimed iterations first (default: iters/5, 2..20)\n"
	        "  -c, --check           verify every element against the exact sum\n"
	        "      --inplace         sendbuf == recvbuf%s\n"
	        "      --json            one JSON object per size instead of the table\n"
	        "      --cpu             add CPU time columns to the table (always in JSON)\n",
	        name, gloo ? " (ring_chunked is always in place)" : "");
	if (!gloo)
		fprintf(f, "      --ready-fifo PATH once every rank is up, rank 0 writes one byte "
		           "to the\n"
		           "                        FIFO PATH (opened by a reader first)\n");
	if (gloo)
		fprintf(f,
		        "      -np N             fork N ranks on 127.0.0.1 (default 2); with\n"
		        "                        GLOO_RANK set, run that one rank instead, of\n"
		        "                        GLOO_SIZE (or -np) ranks, on address GLOO_ADDR,\n"
		        "                        with the FileStore folder GLOO_DIR\n"
		        "      --algo NAME       ring_chunked (AllreduceRingChunked, default) or\n"
		        "                        default (gloo::allreduce)\n");
	fprintf(f, "Measured as kolo-bench measures (tools/kolo-bench/bench_coll.c).\n");
}

enum {
	PEER_OPT_JSON = 256,
	PEER_OPT_INPLACE,
	PEER_OPT_CPU,
	PEER_OPT_NP,
	PEER_OPT_ALGO,
	PEER_OPT_READY
};

/* Parses argv into o. Returns 0, 1 for --help (printed), 2 for a bad
 * command line (reported). "-np N" is accepted as "--np N". */
static inline int peer_parse_opts(int argc, char **argv, struct peer_opts *o, bool gloo)
{
	static const struct option longopts[] = {
	        {"minbytes", required_argument, NULL, 'b'},
	        {"maxbytes", required_argument, NULL, 'e'},
	        {"stepfactor", required_argument, NULL, 'f'},
	        {"stepbytes", required_argument, NULL, 'i'},
	        {"dtype", required_argument, NULL, 'd'},
	        {"op", required_argument, NULL, 'o'},
	        {"iters", required_argument, NULL, 'n'},
	        {"warmup", required_argument, NULL, 'w'},
	        {"check", no_argument, NULL, 'c'},
	        {"json", no_argument, NULL, PEER_OPT_JSON},
	        {"inplace", no_argument, NULL, PEER_OPT_INPLACE},
	        {"cpu", no_argument, NULL, PEER_OPT_CPU},
	        {"np", required_argument, NULL, PEER_OPT_NP},
	        {"algo", required_argument, NULL, PEER_OPT_ALGO},
	        {"ready-fifo", required_argument, NULL, PEER_OPT_READY},
	        {"help", no_argument, NULL, 'h'},
	        {NULL, 0, NULL, 0},
	};
	memset(o, 0, sizeof(*o));
	o->min_bytes = 8;
	o->max_bytes = 64ull << 20;
	o->factor = 2.0;
	o->algo = "ring_chunked";
	for (int i = 1; i < argc; i++)
		if (strcmp(argv[i], "-np") == 0)
			argv[i] = (char *)"--np";
	optind = 1;
	int c;
	while ((c = getopt_long(argc, argv, "b:e:f:i:d:o:n:w:ch", longopts, NULL)) != -1) {
		char *end;
		switch (c) {
		case 'b':
			if (peer_parse_size(optarg, &o->min_bytes) != 0)
				goto bad;
			break;
		case 'e':
			if (peer_parse_size(optarg, &o->max_bytes) != 0)
				goto bad;
			break;
		case 'f':
			o->factor = strtod(optarg, &end);
			if (end == optarg || *end != '\0' || !(o->factor > 1.0))
				goto bad;
			break;
		case 'i':
			if (peer_parse_size(optarg, &o->step_bytes) != 0 || o->step_bytes == 0)
				goto bad;
			break;
		case 'd':
			if (strcmp(optarg, "float32") != 0)
				goto bad;
			break;
		case 'o':
			if (strcmp(optarg, "sum") != 0)
				goto bad;
			break;
		case 'n':
			if (peer_parse_int(optarg, 1, &o->iters) != 0)
				goto bad;
			break;
		case 'w':
			if (peer_parse_int(optarg, 0, &o->warmup) != 0)
				goto bad;
			break;
		case 'c':
			o->check = true;
			break;
		case PEER_OPT_JSON:
			o->json = true;
			break;
		case PEER_OPT_INPLACE:
			o->inplace = true;
			break;
		case PEER_OPT_CPU:
			o->cpu = true;
			break;
		case PEER_OPT_NP:
			if (!gloo || peer_parse_int(optarg, 1, &o->np) != 0)
				goto bad;
			break;
		case PEER_OPT_ALGO:
			if (!gloo ||
			    (strcmp(optarg, "ring_chunked") != 0 && strcmp(optarg, "default") != 0))
				goto bad;
			o->algo = optarg;
			break;
		case PEER_OPT_READY:
			if (gloo)
				goto bad;
			o->ready_fifo = optarg;
			break;
		case 'h':
			peer_usage(stdout, argv[0], gloo);
			return 1;
		default:
			peer_usage(stderr, argv[0], gloo);
			return 2;
		}
	}
	if (optind != argc) {
		fprintf(stderr, "%s: unexpected argument '%s'\n", argv[0], argv[optind]);
		return 2;
	}
	if (o->min_bytes > o->max_bytes) {
		fprintf(stderr, "%s: -b is larger than -e\n", argv[0]);
		return 2;
	}
	if (o->max_bytes / sizeof(float) > 0x7fffffffu) {
		/* MPI counts and Gloo's ring_chunked count are ints */
		fprintf(stderr, "%s: -e is larger than 2^31 floats\n", argv[0]);
		return 2;
	}
	return 0;
bad:
	fprintf(stderr, "%s: bad value '%s' for -%c\n", argv[0], optarg,
	        c == PEER_OPT_NP     ? 'n'
	        : c == PEER_OPT_ALGO ? '-'
	                             : c);
	return 2;
}

/* Element i of rank r's input: kolo-bench's value() for float32 sum, a small
 * integer, so that the sum over the ranks is exact. */
static inline float peer_value(int r, size_t i)
{
	return (float)((double)((i * 7u + (size_t)r * 5u) % 17u) - 8.0);
}

static inline double peer_reference(int nranks, size_t i)
{
	double acc = peer_value(0, i);
	for (int r = 1; r < nranks; r++)
		acc += peer_value(r, i);
	return acc;
}

/* Fills this rank's input; with poison, first fills the output with 0x5a
 * bytes (1.5e16 as float32, never a correct result), so that an element the
 * collective never writes counts as wrong. in == out when in place. */
static inline void peer_fill(float *in, float *out, size_t count, int rank, bool poison)
{
	if (poison)
		memset(out, 0x5a, count * sizeof(float));
	for (size_t i = 0; i < count; i++)
		in[i] = peer_value(rank, i);
}

/* The output elements that differ from the exact sum (kolo-bench's float32
 * tolerance: relative 1e-5). */
static inline uint64_t peer_verify(const float *out, size_t count, int nranks)
{
	uint64_t wrong = 0;
	for (size_t i = 0; i < count; i++) {
		double ref = (double)(float)peer_reference(nranks, i);
		if (!(fabs((double)out[i] - ref) <= 1e-5 * fmax(1.0, fabs(ref))))
			wrong++;
	}
	return wrong;
}

static inline double peer_now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline double peer_cpu_s(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
	       (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
}

static inline int peer_cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* Sorts times and returns their median. */
static inline double peer_median(double *times, int n)
{
	qsort(times, (size_t)n, sizeof(double), peer_cmp_double);
	return n % 2 ? times[n / 2] : 0.5 * (times[n / 2 - 1] + times[n / 2]);
}

/* About 1 GiB of data per size, between 5 and 200 iterations. */
static inline int peer_auto_iters(uint64_t bytes)
{
	uint64_t it = (1ull << 30) / (bytes ? bytes : 1);
	return it < 5 ? 5 : it > 200 ? 200 : (int)it;
}

/* The iterations and warmups of one size, as kolo-bench chooses them. */
static inline void peer_counts(const struct peer_opts *o, uint64_t bytes, int *iters, int *warmup)
{
	*iters = o->iters ? o->iters : peer_auto_iters(bytes);
	*warmup = o->warmup;
	if (!o->iters && !*warmup)
		*warmup = *iters / 5 < 2 ? 2 : *iters / 5 > 20 ? 20 : *iters / 5;
}

/* The next size of the sweep, or 0 after the last. */
static inline uint64_t peer_next_size(const struct peer_opts *o, uint64_t bytes)
{
	uint64_t next =
	        o->step_bytes ? bytes + o->step_bytes : (uint64_t)((double)bytes * o->factor);
	if (next <= bytes)
		next = bytes + 1;
	if (next > o->max_bytes || bytes == o->max_bytes)
		return 0;
	return next;
}

static inline void peer_print_header(const struct peer_opts *o, const char *what, int nranks,
                                     bool inplace)
{
	printf("# %s: %d ranks, dtype float32, op sum, %s, check %s\n", what, nranks,
	       inplace ? "in place" : "out of place", o->check ? "on" : "off");
	printf("# %12s %12s %8s %6s %11s %11s %10s %10s %7s%s\n", "bytes", "count", "dtype",
	       "iters", "time_us", "median_us", "algbw_GB/s", "busbw_GB/s", "wrong",
	       o->cpu ? "     cpu_us bus_GB/cpu_s" : "");
	fflush(stdout);
}

/* kolo-bench's row: the same columns, the same JSON keys. */
static inline void peer_print_row(const struct peer_opts *o, int nranks, bool inplace,
                                  const struct peer_row *r)
{
	double factor = 2.0 * (nranks - 1) / nranks;
	double algbw = r->time_s > 0 ? (double)r->bytes / r->time_s / 1e9 : 0.0;
	double busbw = algbw * factor;
	double bus_bytes = (double)r->bytes * factor;
	double per_cpu = r->cpu_s > 0 ? bus_bytes / r->cpu_s / 1e9 : 0.0;
	char wrong[32];
	if (o->check)
		snprintf(wrong, sizeof(wrong), "%.0f", r->wrong);
	else
		snprintf(wrong, sizeof(wrong), o->json ? "null" : "N/A");
	if (o->json) {
		printf("{\"op\":\"allreduce\",\"bytes\":%" PRIu64 ",\"count\":%zu,\"dtype\":"
		       "\"float32\",\"ranks\":%d,\"time_us\":%.3f,\"algbw_gbps\":%.4f,"
		       "\"busbw_gbps\":%.4f,\"wrong\":%s,\"median_us\":%.3f,\"iters\":%d,"
		       "\"cpu_s\":%.6g,\"bus_gb_per_cpu_s\":%.4f,\"redop\":\"sum\","
		       "\"inplace\":%s}\n",
		       r->bytes, r->count, nranks, r->time_s * 1e6, algbw, busbw, wrong,
		       r->median_s * 1e6, r->iters, r->cpu_s, per_cpu, inplace ? "true" : "false");
	} else {
		printf("  %12" PRIu64 " %12zu %8s %6d %11.2f %11.2f %10.3f %10.3f %7s", r->bytes,
		       r->count, "float32", r->iters, r->time_s * 1e6, r->median_s * 1e6, algbw,
		       busbw, wrong);
		if (o->cpu)
			printf(" %10.1f %12.3f", r->cpu_s * 1e6, per_cpu);
		printf("\n");
	}
	fflush(stdout);
}

static inline float *peer_alloc(size_t bytes)
{
	size_t sz = (bytes + 4095) & ~(size_t)4095;
	return (float *)aligned_alloc(4096, sz ? sz : 4096);
}

#endif
