/* kolo-bench fusion: the fusion engine on the gradients of ResNet-50.
 *
 *   kolorun -np 4 -- kolo-bench fusion [--iters N] [--warmup N] [--threshold BYTES]
 *
 * Each step enqueues the 161 gradient tensors of ResNet-50 (float32, 25 557 032
 * parameters) as named allreduces (KOLO_AVERAGE, in place) in backward order,
 * as a training step's backward pass would, and waits for all of them. It
 * reports the median time per step, each step timed on every rank after a
 * barrier and taken as the maximum over the ranks:
 *   (a) fused: the engine with KOLO_FUSION_THRESHOLD (default 128 MiB);
 *   (b) unfused: the engine with threshold 0, one collective per tensor;
 *   (c) one plain kolo_allreduce of the same total, before the engine starts;
 * then a/c (the cost of negotiating and packing 161 tensors) and b/a (what
 * fusion saves). It also measures the CPU time (getrusage, every thread) of a
 * rank whose engine is up with nothing queued, over --idle seconds.
 *
 * The threshold is a parameter read when the engine starts, so (b) runs on a
 * second comm: the bench finalizes the first, sets KOLO_FUSION_THRESHOLD=0
 * and calls kolo_init again, in the job "<KOLO_JOB>.unfused" of the same
 * rendezvous server. --mode fused|unfused|plain runs one part only.
 *
 * Every figure is checked: after the timed steps each element must equal the
 * float64 average over the ranks of the values they started with. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "bench.h"
#include "kolo/async.h"
#include "kolo/kolo.h"

/* ---- ResNet-50's trainable tensors ----
 *
 * torchvision's resnet50 in its parameters() order: conv1 (64 x 3 x 7 x 7)
 * and bn1; then four stages of bottleneck blocks (3, 4, 6, 3 blocks of width
 * 64, 128, 256, 512, expansion 4). A block has conv1 1x1 (in -> w), conv2 3x3
 * (w -> w), conv3 1x1 (w -> 4w), each followed by batch norm (gamma and beta
 * of its output channels), and the first block of each stage a downsample
 * 1x1 conv (in -> 4w) with its batch norm. Convolutions have no bias. Last the
 * fully connected layer, 2048 -> 1000, with a bias. Tensors: 2 + 1 (conv1,
 * bn1) + 16 blocks x 9 + 4 downsamples x 3 + 2 (fc) = 161; parameters
 * 25 557 032, as torchvision reports. Batch norm running statistics are
 * buffers, not gradients, and are not counted. */

#define RESNET50_TENSORS 161
#define RESNET50_PARAMS  25557032ULL
#define TENSOR_NAME_MAX  64

struct tensor {
	char name[TENSOR_NAME_MAX];
	size_t count;
	size_t offset; /* into the flat gradient buffer, in forward order */
};

struct model {
	struct tensor t[RESNET50_TENSORS];
	int n;
	size_t total;
};

static void add(struct model *m, const char *prefix, const char *suffix, size_t count)
{
	if (m->n >= RESNET50_TENSORS) {
		m->n++; /* counted, so the check below fails */
		return;
	}
	struct tensor *t = &m->t[m->n++];
	snprintf(t->name, sizeof(t->name), "%s%s", prefix, suffix);
	t->count = count;
	t->offset = m->total;
	m->total += count;
}

/* A convolution (no bias) and the batch norm after it. */
static void conv_bn(struct model *m, const char *conv, const char *bn, size_t out, size_t in,
                    size_t k)
{
	add(m, conv, ".weight", out * in * k * k);
	add(m, bn, ".weight", out); /* gamma */
	add(m, bn, ".bias", out);   /* beta */
}

static int resnet50(struct model *m)
{
	static const int blocks[4] = {3, 4, 6, 3};
	static const size_t width[4] = {64, 128, 256, 512};
	memset(m, 0, sizeof(*m));
	conv_bn(m, "conv1", "bn1", 64, 3, 7);
	size_t in = 64;
	for (int s = 0; s < 4; s++) {
		size_t w = width[s];
		for (int b = 0; b < blocks[s]; b++) {
			char p[3][48], q[3][48];
			for (int c = 0; c < 3; c++) {
				snprintf(p[c], sizeof(p[c]), "layer%d.%d.conv%d", s + 1, b, c + 1);
				snprintf(q[c], sizeof(q[c]), "layer%d.%d.bn%d", s + 1, b, c + 1);
			}
			conv_bn(m, p[0], q[0], w, in, 1);
			conv_bn(m, p[1], q[1], w, w, 3);
			conv_bn(m, p[2], q[2], 4 * w, w, 1);
			if (b == 0) {
				char dc[48], db[48];
				snprintf(dc, sizeof(dc), "layer%d.0.downsample.0", s + 1);
				snprintf(db, sizeof(db), "layer%d.0.downsample.1", s + 1);
				conv_bn(m, dc, db, 4 * w, in, 1);
			}
			in = 4 * w;
		}
	}
	add(m, "fc", ".weight", 1000 * in);
	add(m, "fc", ".bias", 1000);
	if (m->n != RESNET50_TENSORS || m->total != RESNET50_PARAMS) {
		fprintf(stderr,
		        "kolo-bench fusion: ResNet-50 table has %d tensors / %zu parameters, "
		        "expected %d / %llu\n",
		        m->n, m->total, RESNET50_TENSORS, RESNET50_PARAMS);
		return -1;
	}
	return 0;
}

/* Shrinks every tensor (for a latency-bound variant of the same step). */
static void rescale(struct model *m, double scale)
{
	m->total = 0;
	for (int j = 0; j < m->n; j++) {
		size_t c = (size_t)((double)m->t[j].count * scale);
		m->t[j].count = c ? c : 1;
		m->t[j].offset = m->total;
		m->total += m->t[j].count;
	}
}

/* ---- the bench ---- */

enum mode { MODE_ALL, MODE_FUSED, MODE_UNFUSED, MODE_PLAIN };

struct opts {
	int iters, warmup;
	double idle_s;
	long long threshold; /* -1: the engine's default */
	enum mode mode;
	double scale; /* every tensor's count times this (at least 1 element) */
};

/* A figure: the median step and the fastest and slowest; median < 0 when
 * not measured. */
struct figure {
	double median, min, max;
};

struct result {
	struct figure fused, unfused, plain;
	double idle_cpu;     /* fraction of a core; < 0 when not measured */
	long long threshold; /* the fused run's, -1 when the default */
	int size, rank;      /* in the last comm */
};

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double cpu_s(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec +
	       (double)ru.ru_stime.tv_sec + 1e-6 * (double)ru.ru_stime.tv_usec;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(double), cmp_double);
	return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Element i of rank r: small integers, so the sum over ranks is exact. */
static float value(int r, size_t i)
{
	return (float)(r + 1 + (int)(i % 7));
}

static void fill(float *buf, size_t n, int rank)
{
	for (size_t i = 0; i < n; i++)
		buf[i] = value(rank, i);
}

/* Counts elements that differ from the float64 average over the ranks (an
 * average of identical values stays put, so any number of steps agree). */
static size_t verify(const float *buf, size_t n, int size)
{
	size_t wrong = 0;
	for (size_t i = 0; i < n; i++) {
		double ref = 0;
		for (int r = 0; r < size; r++)
			ref += value(r, i);
		ref /= size;
		if (fabs((double)buf[i] - ref) > 1e-5 * ref)
			wrong++;
	}
	return wrong;
}

static void report(kolo_comm_t *comm, const char *what, kolo_status_t st)
{
	fprintf(stderr, "kolo-bench fusion: rank %d: %s: %s: %s\n", comm ? kolo_rank(comm) : -1,
	        what, kolo_strerror(st), comm ? kolo_last_error(comm) : kolo_init_error());
}

/* Once the engine runs it owns the comm's ring, so the bench's own barriers
 * and reductions go through it too (blocking calls before it starts). */
static kolo_status_t barrier(kolo_comm_t *comm, bool engine)
{
	kolo_handle_t *h = NULL;
	if (!engine)
		return kolo_barrier(comm);
	kolo_status_t st = kolo_barrier_async(comm, NULL, NULL, &h);
	return st == KOLO_OK ? kolo_wait(h) : st;
}

/* In-place maximum over the ranks of n doubles. */
static kolo_status_t max_f64(kolo_comm_t *comm, const char *name, double *v, size_t n, bool engine)
{
	kolo_handle_t *h = NULL;
	if (!engine)
		return kolo_allreduce(comm, v, v, n, KOLO_FLOAT64, KOLO_MAX);
	kolo_status_t st = kolo_allreduce_async(comm, name, v, v, n, KOLO_FLOAT64, KOLO_MAX, 1.0,
	                                        1.0, NULL, NULL, &h);
	return st == KOLO_OK ? kolo_wait(h) : st;
}

/* One step: every tensor enqueued in backward order, then every wait. */
static kolo_status_t engine_step(kolo_comm_t *comm, const struct model *m, float *grad,
                                 kolo_handle_t **h)
{
	kolo_status_t st = KOLO_OK;
	int nh = 0;
	for (int j = m->n - 1; j >= 0 && st == KOLO_OK; j--) {
		const struct tensor *t = &m->t[j];
		st = kolo_allreduce_async(comm, t->name, grad + t->offset, grad + t->offset,
		                          t->count, KOLO_FLOAT32, KOLO_AVERAGE, 1.0, 1.0, NULL,
		                          NULL, &h[nh]);
		if (st == KOLO_OK)
			nh++;
	}
	for (int j = 0; j < nh; j++) {
		kolo_status_t w = kolo_wait(h[j]);
		if (st == KOLO_OK)
			st = w;
	}
	return st;
}

/* Times warmup + iters steps (the engine's, or one plain allreduce) into *fig. */
static kolo_status_t time_steps(kolo_comm_t *comm, const struct opts *o, const struct model *m,
                                float *grad, bool engine, struct figure *fig)
{
	kolo_handle_t *h[RESNET50_TENSORS];
	double *t = calloc((size_t)o->iters, sizeof(double));
	if (!t)
		return KOLO_ENOMEM;
	kolo_status_t st = KOLO_OK;
	for (int it = 0; it < o->warmup + o->iters && st == KOLO_OK; it++) {
		if ((st = barrier(comm, engine)) != KOLO_OK) {
			report(comm, "barrier", st);
			break;
		}
		double t0 = now_s();
		st = engine ? engine_step(comm, m, grad, h)
		            : kolo_allreduce(comm, grad, grad, m->total, KOLO_FLOAT32,
		                             KOLO_AVERAGE);
		if (st != KOLO_OK)
			report(comm, engine ? "allreduce_async step" : "kolo_allreduce", st);
		else if (it >= o->warmup)
			t[it - o->warmup] = now_s() - t0;
	}
	/* Each step's time is the slowest rank's; the figure their median. */
	if (st == KOLO_OK &&
	    (st = max_f64(comm, "bench.times", t, (size_t)o->iters, engine)) != KOLO_OK)
		report(comm, "max of the step times", st);
	if (st == KOLO_OK) {
		fig->median = median(t, o->iters); /* sorts t */
		fig->min = t[0];
		fig->max = t[o->iters - 1];
	}
	free(t);
	return st;
}

/* Fraction of a core this process uses over idle_s with nothing queued; the
 * maximum over the ranks. */
static kolo_status_t idle_cpu(kolo_comm_t *comm, double idle_s, double *out)
{
	kolo_status_t st = barrier(comm, true);
	if (st != KOLO_OK)
		return st;
	double c0 = cpu_s(), t0 = now_s();
	struct timespec ts = {(time_t)idle_s, (long)((idle_s - (double)(time_t)idle_s) * 1e9)};
	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
	double frac = (cpu_s() - c0) / (now_s() - t0);
	st = max_f64(comm, "bench.idle", &frac, 1, true);
	if (st == KOLO_OK)
		*out = frac;
	return st;
}

/* One comm's worth of measurements: (c) before the engine starts, then the
 * engine's steps (fused or not), then its idle CPU. */
static int run_comm(const struct opts *o, const struct model *m, float *grad, bool plain,
                    bool engine, bool unfused, struct result *res)
{
	kolo_comm_t *comm = NULL;
	int rc = 1;
	kolo_status_t st = kolo_init(&comm);
	if (st != KOLO_OK) {
		report(NULL, "kolo_init", st);
		return 1;
	}
	int rank = kolo_rank(comm), size = kolo_size(comm);
	res->size = size;
	res->rank = rank;
	size_t wrong;
	if (plain) {
		fill(grad, m->total, rank);
		if (time_steps(comm, o, m, grad, false, &res->plain) != KOLO_OK)
			goto out;
		if ((wrong = verify(grad, m->total, size)) != 0) {
			fprintf(stderr, "kolo-bench fusion: rank %d: plain allreduce: %zu wrong\n",
			        rank, wrong);
			goto out;
		}
	}
	if (engine) {
		fill(grad, m->total, rank);
		struct figure *dst = unfused ? &res->unfused : &res->fused;
		if (time_steps(comm, o, m, grad, true, dst) != KOLO_OK)
			goto out;
		if ((wrong = verify(grad, m->total, size)) != 0) {
			fprintf(stderr, "kolo-bench fusion: rank %d: %s steps: %zu wrong\n", rank,
			        unfused ? "unfused" : "fused", wrong);
			goto out;
		}
		if (!unfused && o->idle_s > 0 &&
		    (st = idle_cpu(comm, o->idle_s, &res->idle_cpu)) != KOLO_OK) {
			report(comm, "idle measurement", st);
			goto out;
		}
	}
	rc = 0;
out:
	st = kolo_finalize(comm);
	if (st != KOLO_OK) {
		report(NULL, "kolo_finalize", st);
		rc = 1;
	}
	return rc;
}

static void usage(FILE *f)
{
	fprintf(f,
	        "usage: kolorun -np N -- kolo-bench fusion [options]\n"
	        "  --iters N          timed steps per figure (default 10)\n"
	        "  --warmup N         untimed steps first (default 3)\n"
	        "  --threshold BYTES  fusion threshold of the fused run (default: the engine's,\n"
	        "                     KOLO_FUSION_THRESHOLD or 128 MiB)\n"
	        "  --idle SECONDS     idle CPU measurement (default 2; 0 skips it)\n"
	        "  --mode M           all (default), fused, unfused or plain\n"
	        "  --scale F          multiply every tensor's size by F (default 1; e.g. 0.001\n"
	        "                     for the same 161 names in a latency-bound regime)\n");
}

static int parse(int argc, char **argv, struct opts *o)
{
	static const struct option longopts[] = {
	        {"iters", required_argument, NULL, 'i'},
	        {"warmup", required_argument, NULL, 'w'},
	        {"threshold", required_argument, NULL, 't'},
	        {"idle", required_argument, NULL, 'I'},
	        {"mode", required_argument, NULL, 'm'},
	        {"scale", required_argument, NULL, 's'},
	        {"help", no_argument, NULL, 'h'},
	        {NULL, 0, NULL, 0},
	};
	*o = (struct opts){.iters = 10, .warmup = 3, .idle_s = 2.0, .threshold = -1, .scale = 1.0};
	optind = 1;
	int c;
	char *end;
	while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		switch (c) {
		case 'i':
			o->iters = (int)strtol(optarg, &end, 10);
			if (*end || o->iters < 1)
				return -1;
			break;
		case 'w':
			o->warmup = (int)strtol(optarg, &end, 10);
			if (*end || o->warmup < 0)
				return -1;
			break;
		case 't':
			o->threshold = strtoll(optarg, &end, 10);
			if (*end || o->threshold < 0)
				return -1;
			break;
		case 'I':
			o->idle_s = strtod(optarg, &end);
			if (*end || !(o->idle_s >= 0 && o->idle_s <= 60))
				return -1;
			break;
		case 's':
			o->scale = strtod(optarg, &end);
			if (*end || !(o->scale > 0 && o->scale <= 1))
				return -1;
			break;
		case 'm':
			if (strcmp(optarg, "all") == 0)
				o->mode = MODE_ALL;
			else if (strcmp(optarg, "fused") == 0)
				o->mode = MODE_FUSED;
			else if (strcmp(optarg, "unfused") == 0)
				o->mode = MODE_UNFUSED;
			else if (strcmp(optarg, "plain") == 0)
				o->mode = MODE_PLAIN;
			else
				return -1;
			break;
		case 'h':
			usage(stdout);
			exit(0);
		default:
			return -1;
		}
	}
	return optind == argc ? 0 : -1;
}

static void print_figure(const char *label, const struct figure *f)
{
	printf("%-40s %9.2f ms/step   (min %.2f, max %.2f)\n", label, 1e3 * f->median, 1e3 * f->min,
	       1e3 * f->max);
}

static void print(const struct result *r, const struct model *m, const struct opts *o)
{
	printf("# kolo-bench fusion: ResNet-50 gradients%s, %d float32 tensors, %zu parameters "
	       "(%.3g MB), %d ranks\n",
	       o->scale != 1.0 ? " (scaled)" : "", m->n, m->total, 4e-6 * (double)m->total,
	       r->size);
	printf("# each figure: median over %d steps after %d warmup, per step the slowest rank\n",
	       o->iters, o->warmup);
	char label[64];
	if (r->fused.median >= 0) {
		if (r->threshold >= 0)
			snprintf(label, sizeof(label), "(a) fused, threshold %lld B", r->threshold);
		else
			snprintf(label, sizeof(label), "(a) fused, default threshold");
		print_figure(label, &r->fused);
	}
	if (r->unfused.median >= 0)
		print_figure("(b) unfused, threshold 0", &r->unfused);
	if (r->plain.median >= 0) {
		snprintf(label, sizeof(label), "(c) one kolo_allreduce of %.3g MB",
		         4e-6 * (double)m->total);
		print_figure(label, &r->plain);
	}
	if (r->fused.median > 0 && r->plain.median > 0)
		printf("a/c = %.3f\n", r->fused.median / r->plain.median);
	if (r->fused.median > 0 && r->unfused.median > 0)
		printf("b/a = %.3f\n", r->unfused.median / r->fused.median);
	if (r->idle_cpu >= 0)
		printf("idle engine CPU: %.2f%% of a core (slowest rank, %.1f s with nothing "
		       "queued)\n",
		       100.0 * r->idle_cpu, o->idle_s);
}

int kolo_bench_fusion(int argc, char **argv)
{
	struct opts o;
	struct model m;
	if (parse(argc, argv, &o) != 0) {
		usage(stderr);
		return 2;
	}
	if (resnet50(&m) != 0)
		return 1;
	if (o.scale != 1.0)
		rescale(&m, o.scale);
	float *grad = malloc(sizeof(float) * m.total);
	if (!grad) {
		fprintf(stderr, "kolo-bench fusion: out of memory\n");
		return 1;
	}
	struct result r = {
	        .fused.median = -1, .unfused.median = -1, .plain.median = -1, .idle_cpu = -1};
	/* The threshold of the fused run; the engine reads it when it starts. */
	char *env = getenv("KOLO_FUSION_THRESHOLD");
	r.threshold = o.threshold >= 0 ? o.threshold : env ? strtoll(env, NULL, 10) : -1;
	if (o.threshold >= 0) {
		char v[32];
		snprintf(v, sizeof(v), "%lld", o.threshold);
		setenv("KOLO_FUSION_THRESHOLD", v, 1);
	}
	int rc = 0;
	switch (o.mode) {
	case MODE_ALL:
		rc = run_comm(&o, &m, grad, true, true, false, &r);
		if (rc == 0) {
			/* A job of its own for the second comm: workers of the first
			 * may still be leaving when the fastest rejoin. */
			const char *job = getenv("KOLO_JOB");
			char job2[256];
			snprintf(job2, sizeof(job2), "%s.unfused", job && *job ? job : "default");
			setenv("KOLO_JOB", job2, 1);
			setenv("KOLO_FUSION_THRESHOLD", "0", 1);
			rc = run_comm(&o, &m, grad, false, true, true, &r);
		}
		break;
	case MODE_FUSED:
		rc = run_comm(&o, &m, grad, false, true, r.threshold == 0, &r);
		break;
	case MODE_UNFUSED:
		setenv("KOLO_FUSION_THRESHOLD", "0", 1);
		rc = run_comm(&o, &m, grad, false, true, true, &r);
		break;
	case MODE_PLAIN:
		rc = run_comm(&o, &m, grad, true, false, false, &r);
		break;
	}
	/* Every figure was reduced over the ranks: rank 0 prints. */
	if (rc == 0 && r.rank == 0)
		print(&r, &m, &o);
	free(grad);
	return rc;
}
