/* kolo-bench's collective benchmarks, in the manner of nccl-tests, on the
 * public API only.
 *
 * Method, for each size: fill the buffers, run --warmup iterations, sync
 * the ranks, then time --iters back-to-back iterations, each timed on its
 * own. time_us is the mean per iteration, median_us the median and (JSON
 * only) max_us the slowest, each the maximum over the ranks. algbw = bytes / time_us; busbw = algbw
 * times nccl-tests' factor (allreduce 2(n-1)/n; allgather, reducescatter, alltoall (n-1)/n;
 * broadcast 1). cpu_s is the process CPU time (user + system, every thread, from getrusage) per
 * iteration, averaged over the ranks; bus_gb_per_cpu_s is the bus bytes a rank sends (and receives)
 * per CPU-second.
 *
 * With --check, the buffers are refilled and one more iteration runs; every
 * output element is compared with a float64 reference that each rank computes
 * from the known inputs: element i of rank r is a small integer that depends
 * on (r, i), so sums are exact in every dtype (8-bit sums up to 15 ranks).
 *
 * With --device cuda the collective's buffers are CUDA device memory
 * (bench_cuda.c; each rank on GPU local rank mod the GPUs): the inputs are
 * written into host buffers and copied up with cudaMemcpy before the sweep
 * and before the checked iteration, and the outputs are copied back and
 * checked as the host path checks them. The timed loop is the collective
 * alone: a blocking collective returns with its result on the device. */
#include <errno.h>
#include <fcntl.h>
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
#include <unistd.h>

#include "bench.h"
#include "kolo/kolo.h"

enum coll { C_ALLREDUCE, C_ALLGATHER, C_BROADCAST, C_REDUCESCATTER, C_ALLTOALL, C_BARRIER };

static const char *const coll_names[] = {
        [C_ALLREDUCE] = "allreduce", [C_ALLGATHER] = "allgather",
        [C_BROADCAST] = "broadcast", [C_REDUCESCATTER] = "reducescatter",
        [C_ALLTOALL] = "alltoall",   [C_BARRIER] = "barrier",
};

#define NCOLLS ((int)(sizeof(coll_names) / sizeof(coll_names[0])))

struct opts {
	enum coll coll;
	uint64_t min_bytes, max_bytes, step_bytes;
	double factor;
	kolo_dtype_t dtype;
	kolo_op_t op;
	int iters, warmup; /* 0: chosen per size */
	int root;
	bool check, json, inplace, cpu;
	bool device; /* --device cuda */
	int sets;    /* --sets K: K disjoint process sets of contiguous ranks, run at once */
	const char *ready_fifo; /* --ready-fifo PATH: rank 0 writes a byte there when all are up */
};

/* One size of the sweep: element counts of this rank's buffers. */
struct shape {
	size_t count;      /* elements of the "bytes" buffer (what the row reports) */
	size_t send_count; /* elements in sendbuf */
	size_t recv_count; /* elements in recvbuf */
	size_t block;      /* allgather/alltoall: elements per rank block */
	size_t rs_offset;  /* reducescatter: offset of this rank's block */
};

struct bench {
	struct opts o;
	kolo_comm_t *comm;  /* what is measured: the job's comm, or this rank's set */
	kolo_comm_t *world; /* the job's comm */
	int set;            /* --sets: which set this rank is in */
	int rank, size;
	size_t esize;
	void *sendbuf, *recvbuf; /* what the collective gets: host or device memory */
	void *hsend, *hrecv;     /* their host images (the same buffers on the host) */
	size_t send_bytes, recv_bytes;
	struct bench_dev dev;
	double *times;
};

static void usage(FILE *f, const char *name)
{
	fprintf(f,
	        "usage: kolorun -np N -- kolo-bench %s [options]\n"
	        "  -b, --minbytes SIZE   smallest size (default 8; K, M, G suffixes are binary)\n"
	        "  -e, --maxbytes SIZE   largest size (default 64M)\n"
	        "  -f, --stepfactor F    multiply the size by F each step (default 2)\n"
	        "  -i, --stepbytes SIZE  add SIZE each step instead\n"
	        "  -d, --dtype NAME      int8 uint8 int32 int64 float16 bfloat16 float32 float64\n"
	        "  -o, --op NAME         sum average min max product adasum (default sum)\n"
	        "  -n, --iters N         timed iterations per size (default: 200 down to 5 as\n"
	        "                        the size grows, about 1 GiB of data per size)\n"
	        "  -w, --warmup N        untimed iterations first (default: iters/5, 2..20)\n"
	        "  -r, --root R          broadcast root (default 0)\n"
	        "  -c, --check           verify every element against a float64 reference\n"
	        "      --inplace         allreduce with sendbuf == recvbuf\n"
	        "      --json            one JSON object per size instead of the table\n"
	        "      --cpu             add CPU time columns to the table (always in JSON)\n"
	        "      --sets K          split the ranks into K process sets of contiguous ranks\n"
	        "                        that run the benchmark at the same time\n"
	        "      --device KIND     cpu (default): host buffers; cuda: CUDA device buffers\n"
	        "                        (GPU local rank mod GPUs), checked through host copies\n"
	        "      --ready-fifo PATH once every rank is up, rank 0 writes one byte to the\n"
	        "                        FIFO PATH (opened by a reader first), then the sweep "
	        "starts\n"
	        "Sizes are the total buffer, as in nccl-tests: the gathered output of\n"
	        "allgather, the input of reducescatter, one rank's send buffer of alltoall.\n",
	        name);
}

/* --ready-fifo: after a barrier (every rank is up), rank 0 writes one byte to
 * the FIFO, so that a script can start something beside the sweep at the
 * same point of every job (bench/latency/latency_holds.py). */
static int signal_ready(struct bench *b)
{
	kolo_status_t st = kolo_barrier(b->world);
	if (st != KOLO_OK) {
		fprintf(stderr, "kolo-bench: barrier: %s\n", kolo_status_name(st));
		return -1;
	}
	int fd = b->rank == 0 ? open(b->o.ready_fifo, O_WRONLY | O_NONBLOCK | O_CLOEXEC) : -2;
	if (fd == -1 || (fd >= 0 && (write(fd, "r", 1) != 1 || close(fd) != 0))) {
		fprintf(stderr, "kolo-bench: --ready-fifo %s: %s\n", b->o.ready_fifo,
		        strerror(errno));
		return -1;
	}
	return 0;
}

int kolo_bench_parse_size(const char *s, uint64_t *out)
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

static int parse_int(const char *s, int lo, int *out)
{
	char *end;
	errno = 0;
	long v = strtol(s, &end, 10);
	if (end == s || *end != '\0' || errno != 0 || v < lo || v > 1000000000)
		return -1;
	*out = (int)v;
	return 0;
}

enum { OPT_JSON = 256, OPT_INPLACE, OPT_CPU, OPT_DEVICE, OPT_SETS, OPT_READY };

static int parse_opts(int argc, char **argv, struct opts *o)
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
	        {"root", required_argument, NULL, 'r'},
	        {"check", no_argument, NULL, 'c'},
	        {"json", no_argument, NULL, OPT_JSON},
	        {"inplace", no_argument, NULL, OPT_INPLACE},
	        {"cpu", no_argument, NULL, OPT_CPU},
	        {"device", required_argument, NULL, OPT_DEVICE},
	        {"sets", required_argument, NULL, OPT_SETS},
	        {"ready-fifo", required_argument, NULL, OPT_READY},
	        {"help", no_argument, NULL, 'h'},
	        {NULL, 0, NULL, 0},
	};
	*o = (struct opts){.min_bytes = 8,
	                   .max_bytes = 64ull << 20,
	                   .factor = 2.0,
	                   .dtype = KOLO_FLOAT32,
	                   .op = KOLO_SUM};
	for (o->coll = 0; (int)o->coll < NCOLLS; o->coll++)
		if (strcmp(argv[0], coll_names[o->coll]) == 0)
			break;
	optind = 1;
	int c;
	while ((c = getopt_long(argc, argv, "b:e:f:i:d:o:n:w:r:ch", longopts, NULL)) != -1) {
		char *end;
		switch (c) {
		case 'b':
			if (kolo_bench_parse_size(optarg, &o->min_bytes) != 0)
				goto bad;
			break;
		case 'e':
			if (kolo_bench_parse_size(optarg, &o->max_bytes) != 0)
				goto bad;
			break;
		case 'f':
			o->factor = strtod(optarg, &end);
			if (end == optarg || *end != '\0' || !(o->factor > 1.0))
				goto bad;
			break;
		case 'i':
			if (kolo_bench_parse_size(optarg, &o->step_bytes) != 0 ||
			    o->step_bytes == 0)
				goto bad;
			break;
		case 'd':
			if (kolo_dtype_parse(optarg, &o->dtype) != KOLO_OK)
				goto bad;
			break;
		case 'o':
			if (kolo_op_parse(optarg, &o->op) != KOLO_OK)
				goto bad;
			break;
		case 'n':
			if (parse_int(optarg, 1, &o->iters) != 0)
				goto bad;
			break;
		case 'w':
			if (parse_int(optarg, 0, &o->warmup) != 0)
				goto bad;
			break;
		case 'r':
			if (parse_int(optarg, 0, &o->root) != 0)
				goto bad;
			break;
		case 'c':
			o->check = true;
			break;
		case OPT_JSON:
			o->json = true;
			break;
		case OPT_INPLACE:
			o->inplace = true;
			break;
		case OPT_SETS:
			if (parse_int(optarg, 1, &o->sets) != 0)
				goto bad;
			break;
		case OPT_CPU:
			o->cpu = true;
			break;
		case OPT_READY:
			o->ready_fifo = optarg;
			break;
		case OPT_DEVICE:
			if (strcmp(optarg, "cuda") == 0)
				o->device = true;
			else if (strcmp(optarg, "cpu") == 0)
				o->device = false;
			else {
				fprintf(stderr,
				        "kolo-bench %s: --device is cpu or cuda, not '%s'\n",
				        argv[0], optarg);
				return 2;
			}
			break;
		case 'h':
			usage(stdout, argv[0]);
			return 1;
		default:
			usage(stderr, argv[0]);
			return 2;
		}
	}
	if (optind != argc) {
		fprintf(stderr, "kolo-bench %s: unexpected argument '%s'\n", argv[0], argv[optind]);
		return 2;
	}
	if (o->check && o->op == KOLO_ADASUM) {
		fprintf(stderr,
		        "kolo-bench %s: --check has no reference for adasum (the tests "
		        "check it)\n",
		        argv[0]);
		return 2;
	}
	if (o->min_bytes > o->max_bytes) {
		fprintf(stderr, "kolo-bench %s: -b is larger than -e\n", argv[0]);
		return 2;
	}
	if (o->inplace && o->coll != C_ALLREDUCE && o->coll != C_BROADCAST) {
		fprintf(stderr,
		        "kolo-bench %s: --inplace applies to allreduce (broadcast is always in "
		        "place)\n",
		        argv[0]);
		return 2;
	}
	return 0;
bad:
	fprintf(stderr, "kolo-bench %s: bad value '%s' for -%c\n", argv[0], optarg, c);
	return 2;
}

/* ---- deterministic inputs and their float64 reference ----------------- */

/* Element i of rank r's input: a small integer, so that sums and products
 * over the ranks are exact in every dtype. */
static inline double value(int r, size_t i, kolo_op_t op, kolo_dtype_t dt)
{
	if (op == KOLO_PRODUCT) {
		unsigned m = (unsigned)((i + (size_t)r) % 3u);
		double v = m == 0 ? -1.0 : (m == 1 || r >= 6) ? 1.0 : 2.0;
		return dt == KOLO_UINT8 ? fabs(v) : v;
	}
	double v = (double)((i * 7u + (size_t)r * 5u) % 17u) - 8.0;
	return dt == KOLO_UINT8 ? v + 8.0 : v;
}

static double reference(int nranks, size_t i, kolo_op_t op, kolo_dtype_t dt)
{
	double acc = value(0, i, op, dt);
	for (int r = 1; r < nranks; r++) {
		double v = value(r, i, op, dt);
		switch (op) {
		case KOLO_SUM:
		case KOLO_AVERAGE:
			acc += v;
			break;
		case KOLO_MIN:
			acc = v < acc ? v : acc;
			break;
		case KOLO_MAX:
			acc = v > acc ? v : acc;
			break;
		case KOLO_PRODUCT:
			acc *= v;
			break;
		default:
			break;
		}
	}
	return op == KOLO_AVERAGE ? acc / nranks : acc;
}

static uint16_t f32_to_f16(float f)
{
	uint32_t x;
	memcpy(&x, &f, sizeof(x));
	uint32_t sign = (x >> 16) & 0x8000u;
	uint32_t exp = (x >> 23) & 0xffu;
	uint32_t man = x & 0x7fffffu;
	if (exp == 0xff)
		return (uint16_t)(sign | 0x7c00u | (man ? 0x200u : 0));
	int e = (int)exp - 127 + 15;
	if (e >= 31)
		return (uint16_t)(sign | 0x7c00u);
	if (e <= 0) {
		if (e < -10)
			return (uint16_t)sign;
		man |= 0x800000u;
		unsigned shift = (unsigned)(14 - e);
		uint32_t h = man >> shift, rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
		if (rem > mid || (rem == mid && (h & 1)))
			h++;
		return (uint16_t)(sign | h);
	}
	uint32_t h = ((uint32_t)e << 10) | (man >> 13), rem = man & 0x1fffu;
	if (rem > 0x1000u || (rem == 0x1000u && (h & 1)))
		h++; /* a carry into the exponent is still right */
	return (uint16_t)(sign | h);
}

static float f16_to_f32(uint16_t h)
{
	unsigned exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
	float v;
	if (exp == 0)
		v = ldexpf((float)man, -24);
	else if (exp == 31)
		v = man ? NAN : INFINITY;
	else
		v = ldexpf((float)(man | 0x400u), (int)exp - 25);
	return (h & 0x8000u) ? -v : v;
}

static uint16_t f32_to_bf16(float f)
{
	uint32_t x;
	memcpy(&x, &f, sizeof(x));
	if ((x & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((x >> 16) | 0x40u);
	x += 0x7fffu + ((x >> 16) & 1u);
	return (uint16_t)(x >> 16);
}

static float bf16_to_f32(uint16_t h)
{
	uint32_t x = (uint32_t)h << 16;
	float f;
	memcpy(&f, &x, sizeof(f));
	return f;
}

static inline void store(void *buf, size_t i, kolo_dtype_t dt, double v)
{
	switch (dt) {
	case KOLO_INT8:
		((int8_t *)buf)[i] = (int8_t)v;
		break;
	case KOLO_UINT8:
		((uint8_t *)buf)[i] = (uint8_t)v;
		break;
	case KOLO_INT32:
		((int32_t *)buf)[i] = (int32_t)v;
		break;
	case KOLO_INT64:
		((int64_t *)buf)[i] = (int64_t)v;
		break;
	case KOLO_FLOAT16:
		((uint16_t *)buf)[i] = f32_to_f16((float)v);
		break;
	case KOLO_BFLOAT16:
		((uint16_t *)buf)[i] = f32_to_bf16((float)v);
		break;
	case KOLO_FLOAT32:
		((float *)buf)[i] = (float)v;
		break;
	case KOLO_FLOAT64:
		((double *)buf)[i] = v;
		break;
	default:
		break;
	}
}

static inline double load(const void *buf, size_t i, kolo_dtype_t dt)
{
	switch (dt) {
	case KOLO_INT8:
		return ((const int8_t *)buf)[i];
	case KOLO_UINT8:
		return ((const uint8_t *)buf)[i];
	case KOLO_INT32:
		return ((const int32_t *)buf)[i];
	case KOLO_INT64:
		return (double)((const int64_t *)buf)[i];
	case KOLO_FLOAT16:
		return f16_to_f32(((const uint16_t *)buf)[i]);
	case KOLO_BFLOAT16:
		return bf16_to_f32(((const uint16_t *)buf)[i]);
	case KOLO_FLOAT32:
		return ((const float *)buf)[i];
	case KOLO_FLOAT64:
		return ((const double *)buf)[i];
	default:
		return NAN;
	}
}

/* Whether got matches the float64 reference ref in dtype dt. Integer
 * averages may round either way; floats get a relative tolerance a little
 * above the dtype's rounding. */
static bool matches(double got, double ref, kolo_dtype_t dt, kolo_op_t op)
{
	double tol;
	switch (dt) {
	case KOLO_FLOAT16:
		tol = 2e-3;
		break;
	case KOLO_BFLOAT16:
		tol = 1.6e-2;
		break;
	case KOLO_FLOAT32:
		tol = 1e-5;
		break;
	case KOLO_FLOAT64:
		tol = 1e-12;
		break;
	default:
		return op == KOLO_AVERAGE ? fabs(got - ref) < 1.0 : got == ref;
	}
	return fabs(got - ref) <= tol * fmax(1.0, fabs(ref));
}

/* ---- one size --------------------------------------------------------- */

static struct shape shape_for(const struct bench *b, uint64_t bytes)
{
	size_t n = (size_t)b->size, total = (size_t)(bytes / b->esize);
	struct shape s = {0};
	switch (b->o.coll) {
	case C_ALLREDUCE:
	case C_BROADCAST:
		s.count = s.send_count = s.recv_count = total;
		break;
	case C_ALLGATHER:
		s.block = total / n;
		s.count = s.recv_count = s.block * n;
		s.send_count = s.block;
		break;
	case C_REDUCESCATTER:
		s.count = s.send_count = total;
		for (int r = 0; r < b->rank; r++)
			s.rs_offset += kolo_reducescatter_count(total, b->size, r);
		s.recv_count = kolo_reducescatter_count(total, b->size, b->rank);
		break;
	case C_ALLTOALL:
		s.block = total / n;
		s.count = s.send_count = s.recv_count = s.block * n;
		break;
	case C_BARRIER:
		break;
	}
	return s;
}

static double busbw_factor(enum coll c, int n)
{
	switch (c) {
	case C_ALLREDUCE:
		return 2.0 * (n - 1) / n;
	case C_ALLGATHER:
	case C_REDUCESCATTER:
	case C_ALLTOALL:
		return (double)(n - 1) / n;
	case C_BROADCAST:
		return 1.0;
	default:
		return 0.0;
	}
}

/* The poison left in outputs before a checked run: 0x5a bytes are never a
 * correct result (1.5e16 as float32, 90 as int8). */
static void fill_host(struct bench *b, const struct shape *s, bool poison)
{
	kolo_dtype_t dt = b->o.dtype;
	kolo_op_t op = b->o.op;
	void *in = b->o.inplace || b->o.coll == C_BROADCAST ? b->hrecv : b->hsend;
	if (poison)
		memset(b->hrecv, 0x5a, s->recv_count * b->esize);
	if (b->o.coll == C_BROADCAST && b->rank != b->o.root)
		return;
	int r = b->o.coll == C_BROADCAST ? b->o.root : b->rank;
	for (size_t i = 0; i < s->send_count; i++)
		store(in, i, dt, value(r, i, op, dt));
}

/* Fills the inputs (and, with poison, the outputs); on the device through
 * the host images. 0, or -1 with the reason printed. */
static int fill(struct bench *b, const struct shape *s, bool poison)
{
	fill_host(b, s, poison);
	if (!b->o.device)
		return 0;
	char why[512];
	bool in_recv = b->o.inplace || b->o.coll == C_BROADCAST;
	/* In place (and broadcast) the input is the output buffer: send_count
	 * == recv_count there. */
	if ((!in_recv &&
	     bench_cuda_copy(b->sendbuf, b->hsend, s->send_count * b->esize, why, sizeof(why))) ||
	    ((poison || in_recv) &&
	     bench_cuda_copy(b->recvbuf, b->hrecv, s->recv_count * b->esize, why, sizeof(why)))) {
		fprintf(stderr, "kolo-bench: rank %d: filling the device buffers: %s\n", b->rank,
		        why);
		return -1;
	}
	return 0;
}

/* The number of output elements that differ from the reference. */
static uint64_t verify(const struct bench *b, const struct shape *s)
{
	kolo_dtype_t dt = b->o.dtype;
	kolo_op_t op = b->o.op;
	int n = b->size;
	uint64_t wrong = 0;
	for (size_t i = 0; i < s->recv_count; i++) {
		double ref;
		switch (b->o.coll) {
		case C_ALLREDUCE:
			ref = reference(n, i, op, dt);
			break;
		case C_REDUCESCATTER:
			ref = reference(n, s->rs_offset + i, op, dt);
			break;
		case C_ALLGATHER:
			ref = value((int)(i / s->block), i % s->block, op, dt);
			break;
		case C_BROADCAST:
			ref = value(b->o.root, i, op, dt);
			break;
		case C_ALLTOALL:
			ref = value((int)(i / s->block), (size_t)b->rank * s->block + i % s->block,
			            op, dt);
			break;
		default:
			ref = 0;
			break;
		}
		/* The reference goes through the dtype too (float16 averages). */
		if (dt == KOLO_FLOAT16 || dt == KOLO_BFLOAT16 || dt == KOLO_FLOAT32) {
			unsigned char tmp[8];
			store(tmp, 0, dt, ref);
			ref = load(tmp, 0, dt);
		}
		if (!matches(load(b->hrecv, i, dt), ref, dt, op))
			wrong++;
	}
	return wrong;
}

static kolo_status_t run_once(struct bench *b, const struct shape *s)
{
	kolo_comm_t *c = b->comm;
	kolo_dtype_t dt = b->o.dtype;
	const void *in = b->o.inplace ? b->recvbuf : b->sendbuf;
	switch (b->o.coll) {
	case C_ALLREDUCE:
		return kolo_allreduce(c, in, b->recvbuf, s->count, dt, b->o.op);
	case C_ALLGATHER:
		return kolo_allgather(c, b->sendbuf, b->recvbuf, s->block, dt);
	case C_BROADCAST:
		return kolo_broadcast(c, b->recvbuf, s->count, dt, b->o.root);
	case C_REDUCESCATTER:
		return kolo_reducescatter(c, b->sendbuf, b->recvbuf, s->count, dt, b->o.op);
	case C_ALLTOALL:
		return kolo_alltoall(c, b->sendbuf, b->recvbuf, s->block, dt);
	case C_BARRIER:
		return kolo_barrier(c);
	}
	return KOLO_EINVAL;
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double cpu_s(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
	       (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* About 1 GiB of data per size, between 5 and 200 iterations. */
static int auto_iters(uint64_t bytes)
{
	uint64_t it = (1ull << 30) / (bytes ? bytes : 1);
	return it < 5 ? 5 : it > 200 ? 200 : (int)it;
}

static int fail_coll(const struct bench *b, const char *what, uint64_t bytes, kolo_status_t st)
{
	fprintf(stderr, "kolo-bench: rank %d: %s of %" PRIu64 " bytes failed: %s: %s\n", b->rank,
	        what, bytes, kolo_status_name(st), kolo_last_error(b->comm));
	return 1;
}

static void print_header(const struct bench *b)
{
	const struct opts *o = &b->o;
	bool reduces = o->coll == C_ALLREDUCE || o->coll == C_REDUCESCATTER;
	char extra[64] = "";
	if (reduces)
		snprintf(extra, sizeof(extra), ", op %s, %s", kolo_op_name(o->op),
		         o->inplace ? "in place" : "out of place");
	else if (o->coll == C_BROADCAST)
		snprintf(extra, sizeof(extra), ", root %d", o->root);
	printf("# kolo-bench %s: %d ranks, dtype %s%s, check %s, device %s\n", coll_names[o->coll],
	       b->size, kolo_dtype_name(o->dtype), extra, o->check ? "on" : "off",
	       o->device ? "cuda" : "cpu");
	if (o->device)
		printf("# device: rank 0 on cuda:%d %s (%d visible; ranks take local rank mod "
		       "GPUs)\n",
		       b->dev.ordinal, b->dev.name, b->dev.count);
	printf("# %12s %12s %8s %6s %11s %11s %10s %10s %7s%s\n", "bytes", "count", "dtype",
	       "iters", "time_us", "median_us", "algbw_GB/s", "busbw_GB/s", "wrong",
	       o->cpu ? "     cpu_us bus_GB/cpu_s" : "");
	fflush(stdout);
}

struct row {
	uint64_t bytes;
	size_t count;
	int iters;
	double time_s, median_s, max_s, cpu_s, wrong;
};

static void print_row(const struct bench *b, const struct row *r)
{
	const struct opts *o = &b->o;
	double algbw = r->time_s > 0 ? (double)r->bytes / r->time_s / 1e9 : 0.0;
	double busbw = algbw * busbw_factor(o->coll, b->size);
	double bus_bytes = (double)r->bytes * busbw_factor(o->coll, b->size);
	double per_cpu = r->cpu_s > 0 ? bus_bytes / r->cpu_s / 1e9 : 0.0;
	char wrong[32];
	if (o->check)
		snprintf(wrong, sizeof(wrong), "%.0f", r->wrong);
	else
		snprintf(wrong, sizeof(wrong), o->json ? "null" : "N/A");
	if (o->json) {
		printf("{\"op\":\"%s\",\"bytes\":%" PRIu64 ",\"count\":%zu,\"dtype\":\"%s\","
		       "\"ranks\":%d,\"time_us\":%.3f,\"algbw_gbps\":%.4f,\"busbw_gbps\":%.4f,"
		       "\"wrong\":%s,\"median_us\":%.3f,\"iters\":%d,\"cpu_s\":%.6g,"
		       "\"bus_gb_per_cpu_s\":%.4f,\"device\":\"%s\",\"max_us\":%.3f",
		       coll_names[o->coll], r->bytes, r->count, kolo_dtype_name(o->dtype), b->size,
		       r->time_s * 1e6, algbw, busbw, wrong, r->median_s * 1e6, r->iters, r->cpu_s,
		       per_cpu, o->device ? "cuda" : "cpu", r->max_s * 1e6);
		if (o->coll == C_ALLREDUCE || o->coll == C_REDUCESCATTER)
			printf(",\"redop\":\"%s\"", kolo_op_name(o->op));
		if (o->coll == C_ALLREDUCE)
			printf(",\"inplace\":%s", o->inplace ? "true" : "false");
		if (o->sets > 1)
			printf(",\"set\":%d,\"sets\":%d", b->set, o->sets);
		if (o->coll == C_BROADCAST)
			printf(",\"root\":%d", o->root);
		printf("}\n");
	} else {
		printf("  %12" PRIu64 " %12zu %8s %6d %11.2f %11.2f %10.3f %10.3f %7s", r->bytes,
		       r->count, kolo_dtype_name(o->dtype), r->iters, r->time_s * 1e6,
		       r->median_s * 1e6, algbw, busbw, wrong);
		if (o->cpu)
			printf(" %10.1f %12.3f", r->cpu_s * 1e6, per_cpu);
		printf("\n");
	}
	fflush(stdout);
}

static int bench_size(struct bench *b, uint64_t req_bytes, int *any_wrong)
{
	const struct opts *o = &b->o;
	struct shape s = shape_for(b, req_bytes);
	uint64_t bytes = (uint64_t)s.count * b->esize;
	int iters = o->iters ? o->iters : auto_iters(bytes);
	int warmup = o->warmup;
	if (!o->iters && !warmup)
		warmup = iters / 5 < 2 ? 2 : iters / 5 > 20 ? 20 : iters / 5;
	const char *what = coll_names[o->coll];
	kolo_status_t st;

	if (fill(b, &s, false) != 0)
		return 1;
	for (int i = 0; i < warmup; i++)
		if ((st = run_once(b, &s)) != KOLO_OK)
			return fail_coll(b, what, bytes, st);
	/* Start together. A one-element allreduce rather than kolo_barrier():
	 * nothing returns from it before every rank has entered it, whatever the
	 * barrier's algorithm. */
	int32_t one = 1;
	if ((st = kolo_allreduce(b->comm, &one, &one, 1, KOLO_INT32, KOLO_SUM)) != KOLO_OK)
		return fail_coll(b, "the start allreduce", bytes, st);
	double cpu0 = cpu_s(), t0 = now_s(), prev = t0;
	for (int i = 0; i < iters; i++) {
		if ((st = run_once(b, &s)) != KOLO_OK)
			return fail_coll(b, what, bytes, st);
		double t = now_s();
		b->times[i] = t - prev;
		prev = t;
	}
	double elapsed = prev - t0, cpu = cpu_s() - cpu0;
	qsort(b->times, (size_t)iters, sizeof(double), cmp_double);
	double median = iters % 2 ? b->times[iters / 2]
	                          : 0.5 * (b->times[iters / 2 - 1] + b->times[iters / 2]);

	uint64_t wrong = 0;
	if (o->check) {
		if (fill(b, &s, true) != 0)
			return 1;
		if ((st = run_once(b, &s)) != KOLO_OK)
			return fail_coll(b, what, bytes, st);
		char why[512];
		if (b->o.device && bench_cuda_copy(b->hrecv, b->recvbuf, s.recv_count * b->esize,
		                                   why, sizeof(why)) != 0) {
			fprintf(stderr, "kolo-bench: rank %d: reading the result back: %s\n",
			        b->rank, why);
			return 1;
		}
		wrong = verify(b, &s);
	}

	double mx[3] = {elapsed / iters, median, b->times[iters - 1]},
	       sum[2] = {cpu / iters, (double)wrong};
	if ((st = kolo_allreduce(b->comm, mx, mx, 3, KOLO_FLOAT64, KOLO_MAX)) != KOLO_OK ||
	    (st = kolo_allreduce(b->comm, sum, sum, 2, KOLO_FLOAT64, KOLO_SUM)) != KOLO_OK)
		return fail_coll(b, "allreduce of the results", 16, st);
	if (sum[1] > 0)
		*any_wrong = 1;
	if (b->rank == 0) {
		struct row r = {.bytes = bytes,
		                .count = s.count,
		                .iters = iters,
		                .time_s = mx[0],
		                .median_s = mx[1],
		                .max_s = mx[2],
		                .cpu_s = sum[0] / b->size,
		                .wrong = sum[1]};
		print_row(b, &r);
	}
	return 0;
}

static void *alloc_buf(size_t bytes)
{
	size_t sz = (bytes + 4095) & ~(size_t)4095;
	return aligned_alloc(4096, sz ? sz : 4096);
}

int kolo_bench_coll_known(const char *name)
{
	for (int i = 0; i < NCOLLS; i++)
		if (strcmp(name, coll_names[i]) == 0)
			return 1;
	return 0;
}

/* --sets K: every rank makes the K sets (collective over the job), then
 * measures in its own; the sets run side by side. */
static int split_sets(struct bench *b)
{
	const int n = kolo_size(b->world), k = b->o.sets;
	if (n % k) {
		fprintf(stderr, "kolo-bench: --sets %d does not divide %d ranks\n", k, n);
		return -1;
	}
	int m = n / k, ranks[256];
	if (m > 256)
		return -1;
	for (int s = 0; s < k; s++) {
		kolo_comm_t *set = NULL;
		for (int i = 0; i < m; i++)
			ranks[i] = s * m + i;
		kolo_status_t st = kolo_process_set_create(b->world, ranks, m, &set);
		if (st != KOLO_OK) {
			fprintf(stderr, "kolo-bench: process set %d: %s\n", s,
			        kolo_last_error(b->world));
			return -1;
		}
		if (set) {
			b->comm = set;
			b->set = s;
		}
	}
	return 0;
}

int kolo_bench_coll(int argc, char **argv)
{
	struct bench b = {0};
	int rc = parse_opts(argc, argv, &b.o);
	if (rc != 0)
		return rc == 1 ? 0 : rc;
	if (b.o.coll == C_BARRIER)
		b.o.min_bytes = b.o.max_bytes = 0;
	b.esize = kolo_dtype_size(b.o.dtype);

	kolo_status_t st = kolo_init(&b.comm);
	if (st != KOLO_OK) {
		fprintf(stderr, "kolo-bench: kolo_init: %s: %s\n", kolo_status_name(st),
		        kolo_init_error());
		return 1;
	}
	b.world = b.comm;
	rc = 1;
	if (b.o.sets > 1 && split_sets(&b) != 0)
		goto out;
	b.rank = kolo_rank(b.comm);
	b.size = kolo_size(b.comm);
	if (b.o.root >= b.size) {
		if (b.rank == 0)
			fprintf(stderr, "kolo-bench: --root %d but only %d ranks\n", b.o.root,
			        b.size);
		rc = 2;
		goto out;
	}

	/* Buffers for the largest size, allocated once. */
	struct shape big = shape_for(&b, b.o.max_bytes);
	b.send_bytes = big.send_count * b.esize;
	b.recv_bytes =
	        (big.recv_count > big.send_count ? big.recv_count : big.send_count) * b.esize;
	b.hsend = alloc_buf(b.send_bytes);
	b.hrecv = alloc_buf(b.recv_bytes);
	int max_iters = b.o.iters ? b.o.iters : 200;
	b.times = calloc((size_t)max_iters, sizeof(double));
	if (!b.hsend || !b.hrecv || !b.times) {
		fprintf(stderr, "kolo-bench: rank %d: out of memory for %" PRIu64 " bytes\n",
		        b.rank, b.o.max_bytes);
		goto out;
	}
	b.sendbuf = b.hsend;
	b.recvbuf = b.hrecv;
	if (b.o.device) {
		char why[512];
		memset(b.hsend, 0, b.send_bytes);
		memset(b.hrecv, 0, b.recv_bytes);
		b.sendbuf = b.recvbuf = NULL;
		if (bench_cuda_open(kolo_local_rank(b.comm), &b.dev, why, sizeof(why)) != 0 ||
		    !(b.sendbuf = bench_cuda_malloc(b.send_bytes, why, sizeof(why))) ||
		    !(b.recvbuf = bench_cuda_malloc(b.recv_bytes, why, sizeof(why)))) {
			fprintf(stderr, "kolo-bench: rank %d: --device cuda: %s\n", b.rank, why);
			goto out;
		}
	}
	if (b.rank == 0 && !b.o.json)
		print_header(&b);
	if (b.o.ready_fifo && signal_ready(&b) != 0)
		goto out;

	int any_wrong = 0;
	uint64_t bytes = b.o.min_bytes;
	for (;;) {
		if (bench_size(&b, bytes, &any_wrong) != 0)
			goto out;
		uint64_t next = b.o.step_bytes ? bytes + b.o.step_bytes
		                               : (uint64_t)((double)bytes * b.o.factor);
		if (next <= bytes)
			next = bytes + 1;
		if (next > b.o.max_bytes || bytes == b.o.max_bytes)
			break;
		bytes = next;
	}
	rc = any_wrong ? 1 : 0;
	if (any_wrong && b.rank == 0)
		fprintf(stderr, "kolo-bench: %s: wrong elements found\n", coll_names[b.o.coll]);
out:
	free(b.times);
	if (b.o.device) {
		bench_cuda_free(b.sendbuf);
		bench_cuda_free(b.recvbuf);
	}
	free(b.hsend);
	free(b.hrecv);
	if (b.comm != b.world)
		kolo_process_set_free(b.comm);
	st = kolo_finalize(b.world);
	if (st != KOLO_OK && rc == 0) {
		fprintf(stderr, "kolo-bench: kolo_finalize: %s\n", kolo_status_name(st));
		rc = 1;
	}
	return rc;
}
