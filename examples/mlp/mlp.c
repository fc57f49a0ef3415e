/* kolo-mlp: data-parallel training of a multi-layer perceptron with kolo.
 *
 * What a PyTorch + Horovod training script does, in plain C and float32:
 * every rank holds a replica of the model and trains on its own shard of the
 * data (rank r takes samples r, r + size, ...). Rank 0 initialises the weights
 * from --seed and broadcasts them; the other ranks start from garbage, so a
 * broken broadcast cannot go unnoticed. In each step the backward pass runs
 * from the last layer down, and each layer's weight and bias gradients are
 * handed to the fusion engine by name ("layer3.weight", ...) with
 * kolo_allreduce_async(KOLO_AVERAGE) as soon as they are computed, so their
 * reduction overlaps the backward pass of the layers below. The optimizer
 * (SGD with momentum) waits for every handle before it steps. Rank 0 prints
 * loss and accuracy per epoch; at the end every rank checks that all replicas
 * hold bitwise-identical weights.
 *
 * The task: 10 classes in 64 dimensions, each class a mixture of 8 Gaussian
 * blobs around random centres (so not linearly separable), generated from
 * --seed. A sample is a pure function of (seed, set, index), so a rank
 * generates only its own shard.
 *
 * Exit status: 0 when the target test accuracy is reached and the weights
 * are identical everywhere; 1 when the target is missed; 2 when the replicas
 * differ; 3 on a kolo error; 64 on a usage error. */
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kolo/async.h"
#include "kolo/kolo.h"

#define NCLASS     10
#define NBLOB      8 /* Gaussian blobs per class */
#define INPUT_DIM  64
#define NLAYERS    4 /* INPUT_DIM -> H -> H/2 -> H/4 -> NCLASS */
#define EVAL_BATCH 256
#define NAME_MAX_  40

#define EXIT_TARGET   1
#define EXIT_MISMATCH 2
#define EXIT_KOLO     3
#define EXIT_USAGE    64

struct options {
	int epochs;
	int batch; /* per rank, as Horovod scripts count it */
	int hidden;
	int ntrain;
	int ntest;
	double lr;
	double momentum;
	double noise;
	double target;
	uint64_t seed;
	bool no_broadcast; /* a self-test of the weight check: skip the broadcast */
};

struct layer {
	int in, out;
	float *w; /* in x out, row-major: w[i * out + o] */
	float *b;
	float *gw, *gb; /* gradients; owned by the engine while a reduction runs */
	float *vw, *vb; /* momentum */
	char wname[NAME_MAX_], bname[NAME_MAX_];
};

struct model {
	struct layer l[NLAYERS];
	size_t nparams;
};

/* Activations and deltas for a batch: act[0] is the input, act[k] the output
 * of layer k (after ReLU for hidden layers; logits for the last). */
struct workspace {
	int cap; /* rows */
	int *y;  /* labels of the batch */
	float *act[NLAYERS + 1];
	float *delta[NLAYERS + 1];
};

/* This rank's shard of one data set. */
struct shard {
	int n;
	float *x; /* n x INPUT_DIM */
	int *y;
};

struct metrics {
	double loss_sum, correct, count;
};

static int g_rank;

#define KCHECK(comm, call)                                                                         \
	do {                                                                                       \
		kolo_status_t st_ = (call);                                                        \
		if (st_ != KOLO_OK) {                                                              \
			fprintf(stderr, "kolo-mlp: rank %d: %s failed: %s: %s\n", g_rank, #call,   \
			        kolo_strerror(st_), (comm) ? kolo_last_error(comm) : "");          \
			goto fail;                                                                 \
		}                                                                                  \
	} while (0)

/* ---- deterministic random numbers ---- */

static uint64_t splitmix64(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

/* A generator state for stream `stream` item `index` of a seed. */
static uint64_t rng_for(uint64_t seed, uint64_t stream, uint64_t index)
{
	uint64_t s = seed ^ (stream * 0xd1b54a32d192ed03ULL);
	uint64_t a = splitmix64(&s) ^ index;
	return splitmix64(&a);
}

static double uniform01(uint64_t *s)
{
	return (double)(splitmix64(s) >> 11) * 0x1.0p-53;
}

static double gaussian(uint64_t *s)
{
	double u1 = 1.0 - uniform01(s); /* (0, 1] */
	double u2 = uniform01(s);
	return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- the data set ---- */

enum { STREAM_CENTRES = 1, STREAM_TRAIN, STREAM_TEST, STREAM_INIT, STREAM_GARBAGE, STREAM_SHUFFLE };

static float *make_centres(uint64_t seed)
{
	float *c = malloc(sizeof(float) * NCLASS * NBLOB * INPUT_DIM);
	if (!c)
		return NULL;
	uint64_t s = rng_for(seed, STREAM_CENTRES, 0);
	for (int k = 0; k < NCLASS * NBLOB * INPUT_DIM; k++)
		c[k] = (float)gaussian(&s);
	return c;
}

/* Samples rank, rank + size, ... of a set of `total`. */
static int shard_make(struct shard *sh, const float *centres, const struct options *o, int stream,
                      int total, int rank, int size)
{
	sh->n = total > rank ? (total - rank + size - 1) / size : 0;
	sh->x = malloc(sizeof(float) * INPUT_DIM * (size_t)(sh->n ? sh->n : 1));
	sh->y = malloc(sizeof(int) * (size_t)(sh->n ? sh->n : 1));
	if (!sh->x || !sh->y)
		return -1;
	/* Unit variance per coordinate on average: centres ~ N(0,1), noise ~ N(0,sigma^2). */
	double scale = 1.0 / sqrt(1.0 + o->noise * o->noise);
	for (int j = 0; j < sh->n; j++) {
		uint64_t idx = (uint64_t)rank + (uint64_t)j * (uint64_t)size;
		uint64_t s = rng_for(o->seed, (uint64_t)stream, idx);
		int cls = (int)(splitmix64(&s) % NCLASS);
		int blob = (int)(splitmix64(&s) % NBLOB);
		const float *c = centres + (size_t)(cls * NBLOB + blob) * INPUT_DIM;
		float *x = sh->x + (size_t)j * INPUT_DIM;
		for (int d = 0; d < INPUT_DIM; d++)
			x[d] = (float)(scale * (c[d] + o->noise * gaussian(&s)));
		sh->y[j] = cls;
	}
	return 0;
}

static void shard_fini(struct shard *sh)
{
	free(sh->x);
	free(sh->y);
}

/* ---- the model ---- */

static void model_fini(struct model *m)
{
	for (int k = 0; k < NLAYERS; k++) {
		struct layer *L = &m->l[k];
		free(L->w), free(L->b), free(L->gw), free(L->gb), free(L->vw), free(L->vb);
	}
}

static int model_init(struct model *m, int hidden)
{
	int dims[NLAYERS + 1] = {INPUT_DIM, hidden, hidden / 2, hidden / 4, NCLASS};
	memset(m, 0, sizeof(*m));
	for (int k = 0; k < NLAYERS; k++) {
		struct layer *L = &m->l[k];
		L->in = dims[k];
		L->out = dims[k + 1];
		size_t nw = (size_t)L->in * (size_t)L->out;
		L->w = calloc(nw, sizeof(float));
		L->gw = calloc(nw, sizeof(float));
		L->vw = calloc(nw, sizeof(float));
		L->b = calloc((size_t)L->out, sizeof(float));
		L->gb = calloc((size_t)L->out, sizeof(float));
		L->vb = calloc((size_t)L->out, sizeof(float));
		if (!L->w || !L->gw || !L->vw || !L->b || !L->gb || !L->vb)
			return -1;
		snprintf(L->wname, sizeof(L->wname), "layer%d.weight", k + 1);
		snprintf(L->bname, sizeof(L->bname), "layer%d.bias", k + 1);
		m->nparams += nw + (size_t)L->out;
	}
	return 0;
}

/* He initialisation from the seed (rank 0), or garbage from the rank (others). */
static void model_fill(struct model *m, uint64_t seed, bool garbage, int rank)
{
	for (int k = 0; k < NLAYERS; k++) {
		struct layer *L = &m->l[k];
		uint64_t s = garbage ? rng_for(seed, STREAM_GARBAGE, (uint64_t)(rank * NLAYERS + k))
		                     : rng_for(seed, STREAM_INIT, (uint64_t)k);
		double sd = garbage ? 10.0 : sqrt(2.0 / L->in);
		for (size_t j = 0; j < (size_t)L->in * (size_t)L->out; j++)
			L->w[j] = (float)(sd * gaussian(&s));
		for (int o = 0; o < L->out; o++)
			L->b[o] = garbage ? (float)(sd * gaussian(&s)) : 0.0f;
	}
}

/* FNV-1a over the bytes of every parameter, in layer order. */
static uint64_t model_hash(const struct model *m)
{
	uint64_t h = 0xcbf29ce484222325ULL;
	for (int k = 0; k < NLAYERS; k++) {
		const struct layer *L = &m->l[k];
		const unsigned char *p[2] = {(const unsigned char *)L->w,
		                             (const unsigned char *)L->b};
		size_t n[2] = {sizeof(float) * (size_t)L->in * (size_t)L->out,
		               sizeof(float) * (size_t)L->out};
		for (int t = 0; t < 2; t++)
			for (size_t j = 0; j < n[t]; j++)
				h = (h ^ p[t][j]) * 0x100000001b3ULL;
	}
	return h;
}

static void workspace_fini(struct workspace *ws)
{
	for (int k = 0; k <= NLAYERS; k++)
		free(ws->act[k]), free(ws->delta[k]);
	free(ws->y);
}

static int workspace_init(struct workspace *ws, const struct model *m, int cap)
{
	memset(ws, 0, sizeof(*ws));
	ws->cap = cap;
	ws->y = malloc(sizeof(int) * (size_t)cap);
	if (!ws->y)
		return -1;
	for (int k = 0; k <= NLAYERS; k++) {
		int d = k == 0 ? m->l[0].in : m->l[k - 1].out;
		ws->act[k] = malloc(sizeof(float) * (size_t)cap * (size_t)d);
		ws->delta[k] = malloc(sizeof(float) * (size_t)cap * (size_t)d);
		if (!ws->act[k] || !ws->delta[k])
			return -1;
	}
	return 0;
}

/* ---- kernels: tight loops that the compiler vectorises at -O3 ---- */

/* y[n] = x[n] W + b for n < rows; relu clamps at 0. Zero inputs (after a ReLU)
 * are skipped. */
static void linear_forward(const float *restrict x, int rows, int in, int out,
                           const float *restrict w, const float *restrict b, float *restrict y,
                           bool relu)
{
	for (int n = 0; n < rows; n++) {
		float *restrict yr = y + (size_t)n * (size_t)out;
		const float *xr = x + (size_t)n * (size_t)in;
		for (int o = 0; o < out; o++)
			yr[o] = b[o];
		for (int i = 0; i < in; i++) {
			float a = xr[i];
			if (a == 0.0f)
				continue;
			const float *restrict wr = w + (size_t)i * (size_t)out;
			for (int o = 0; o < out; o++)
				yr[o] += a * wr[o];
		}
		if (relu)
			for (int o = 0; o < out; o++)
				yr[o] = yr[o] > 0.0f ? yr[o] : 0.0f;
	}
}

/* A dot product with eight independent accumulators, so that it vectorises
 * without reassociating a single sum (and stays deterministic). */
static float dot(const float *restrict a, const float *restrict b, int n)
{
	float acc[8] = {0};
	int j = 0;
	for (; j + 8 <= n; j += 8)
		for (int t = 0; t < 8; t++)
			acc[t] += a[j + t] * b[j + t];
	float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
	for (; j < n; j++)
		s += a[j] * b[j];
	return s;
}

/* Weight and bias gradients of a layer from its input x and output delta dy. */
static void linear_grad(const float *restrict x, const float *restrict dy, int rows, int in,
                        int out, float *restrict gw, float *restrict gb)
{
	memset(gw, 0, sizeof(float) * (size_t)in * (size_t)out);
	memset(gb, 0, sizeof(float) * (size_t)out);
	for (int n = 0; n < rows; n++) {
		const float *restrict dr = dy + (size_t)n * (size_t)out;
		const float *xr = x + (size_t)n * (size_t)in;
		for (int i = 0; i < in; i++) {
			float a = xr[i];
			if (a == 0.0f)
				continue;
			float *restrict g = gw + (size_t)i * (size_t)out;
			for (int o = 0; o < out; o++)
				g[o] += a * dr[o];
		}
		for (int o = 0; o < out; o++)
			gb[o] += dr[o];
	}
}

/* dx = dy W^T, masked by the ReLU that produced x (x == 0 means inactive). */
static void linear_backward_input(const float *restrict x, const float *restrict dy, int rows,
                                  int in, int out, const float *restrict w, float *restrict dx)
{
	for (int n = 0; n < rows; n++) {
		const float *dr = dy + (size_t)n * (size_t)out;
		const float *xr = x + (size_t)n * (size_t)in;
		float *dxr = dx + (size_t)n * (size_t)in;
		for (int i = 0; i < in; i++)
			dxr[i] = xr[i] > 0.0f ? dot(dr, w + (size_t)i * (size_t)out, out) : 0.0f;
	}
}

/* Softmax cross-entropy over logits z; writes dL/dz (mean over rows) to dz. */
static void softmax_xent(const float *z, const int *y, int rows, int nclass, float *dz,
                         struct metrics *mt)
{
	for (int n = 0; n < rows; n++) {
		const float *zr = z + (size_t)n * (size_t)nclass;
		float *dr = dz + (size_t)n * (size_t)nclass;
		int arg = 0;
		for (int c = 1; c < nclass; c++)
			if (zr[c] > zr[arg])
				arg = c;
		float mx = zr[arg], sum = 0.0f;
		for (int c = 0; c < nclass; c++) {
			dr[c] = expf(zr[c] - mx);
			sum += dr[c];
		}
		float inv = 1.0f / sum;
		for (int c = 0; c < nclass; c++)
			dr[c] = dr[c] * inv / (float)rows;
		dr[y[n]] -= 1.0f / (float)rows;
		mt->loss_sum -= log((double)expf(zr[y[n]] - mx) / (double)sum);
		mt->correct += arg == y[n];
		mt->count += 1;
	}
}

static void forward(const struct model *m, struct workspace *ws, int rows)
{
	for (int k = 0; k < NLAYERS; k++) {
		const struct layer *L = &m->l[k];
		linear_forward(ws->act[k], rows, L->in, L->out, L->w, L->b, ws->act[k + 1],
		               k < NLAYERS - 1);
	}
}

/* ---- collectives through the engine ---- */

/* In-place sum of n doubles over the ranks, through the engine by name. */
static kolo_status_t sum_f64(kolo_comm_t *comm, const char *name, double *v, size_t n)
{
	kolo_handle_t *h = NULL;
	kolo_status_t st = kolo_allreduce_async(comm, name, v, v, n, KOLO_FLOAT64, KOLO_SUM, 1.0,
	                                        1.0, NULL, NULL, &h);
	return st == KOLO_OK ? kolo_wait(h) : st;
}

/* Broadcasts every parameter (and, with momentum, the optimizer state) from
 * root, one named tensor each, and waits for all of them. */
static kolo_status_t broadcast_model(kolo_comm_t *comm, struct model *m, int root,
                                     const char *prefix, bool momentum)
{
	kolo_handle_t *h[NLAYERS * 4];
	int nh = 0;
	kolo_status_t st = KOLO_OK;
	for (int k = 0; k < NLAYERS && st == KOLO_OK; k++) {
		struct layer *L = &m->l[k];
		float *buf[4] = {L->w, L->b, L->vw, L->vb};
		size_t cnt[4] = {(size_t)L->in * (size_t)L->out, (size_t)L->out,
		                 (size_t)L->in * (size_t)L->out, (size_t)L->out};
		for (int t = 0; t < (momentum ? 4 : 2) && st == KOLO_OK; t++) {
			char name[64];
			snprintf(name, sizeof(name), "%s%s%s", prefix, t >= 2 ? "momentum." : "",
			         t % 2 ? L->bname : L->wname);
			st = kolo_broadcast_async(comm, name, buf[t], cnt[t], KOLO_FLOAT32, root,
			                          NULL, NULL, &h[nh]);
			if (st == KOLO_OK)
				nh++;
		}
	}
	for (int j = 0; j < nh; j++) {
		kolo_status_t w = kolo_wait(h[j]);
		if (st == KOLO_OK)
			st = w;
	}
	return st;
}

/* Gathers every rank's parameter hash; *same tells whether they all equal
 * rank 0's, *bad is the first rank that differs (-1 when none), *hash rank
 * 0's and *other the differing one's. Goes through the engine, like every
 * collective once the engine runs. */
static kolo_status_t check_identical(kolo_comm_t *comm, const struct model *m, const char *name,
                                     bool *same, int *bad, uint64_t *hash, uint64_t *other)
{
	int size = kolo_size(comm);
	uint64_t h = model_hash(m);
	uint64_t *all = NULL;
	size_t *counts = calloc((size_t)size, sizeof(size_t));
	kolo_handle_t *hd = NULL;
	if (!counts)
		return KOLO_ENOMEM;
	kolo_status_t st = kolo_allgather_async(comm, name, &h, 1, KOLO_INT64, (void **)&all,
	                                        counts, NULL, NULL, &hd);
	if (st == KOLO_OK)
		st = kolo_wait(hd);
	*same = true;
	*bad = -1;
	*hash = *other = h;
	for (int r = 0; st == KOLO_OK && r < size; r++) {
		if (counts[r] != 1) {
			st = KOLO_EPROTO;
			break;
		}
		if (all[r] != all[0] && *same) {
			*same = false;
			*bad = r;
			*other = all[r];
		}
		*hash = all[0];
	}
	free(all);
	free(counts);
	return st;
}

/* ---- training ---- */

static void shuffle(int *perm, int n, uint64_t seed, int rank, int epoch)
{
	uint64_t s = rng_for(seed, STREAM_SHUFFLE, ((uint64_t)rank << 32) | (uint64_t)epoch);
	for (int j = 0; j < n; j++)
		perm[j] = j;
	for (int j = n - 1; j > 0; j--) {
		int k = (int)(splitmix64(&s) % (uint64_t)(j + 1));
		int t = perm[j];
		perm[j] = perm[k];
		perm[k] = t;
	}
}

static void sgd_step(struct model *m, float lr, float mu)
{
	for (int k = 0; k < NLAYERS; k++) {
		struct layer *L = &m->l[k];
		float *p[2] = {L->w, L->b}, *g[2] = {L->gw, L->gb}, *v[2] = {L->vw, L->vb};
		size_t n[2] = {(size_t)L->in * (size_t)L->out, (size_t)L->out};
		for (int t = 0; t < 2; t++) {
			float *restrict pp = p[t], *restrict vv = v[t];
			const float *restrict gg = g[t];
			for (size_t j = 0; j < n[t]; j++) {
				vv[j] = mu * vv[j] + gg[j];
				pp[j] -= lr * vv[j];
			}
		}
	}
}

/* One minibatch: forward, backward with each layer's gradients enqueued as
 * soon as they exist, wait, step. *comm_wait accumulates the time spent
 * waiting for reductions that the backward pass did not hide. */
static kolo_status_t train_step(kolo_comm_t *comm, struct model *m, struct workspace *ws, int rows,
                                const struct options *o, struct metrics *mt, double *comm_wait)
{
	kolo_handle_t *h[2 * NLAYERS];
	int nh = 0;
	kolo_status_t st = KOLO_OK;

	forward(m, ws, rows);
	softmax_xent(ws->act[NLAYERS], ws->y, rows, NCLASS, ws->delta[NLAYERS], mt);
	for (int k = NLAYERS - 1; k >= 0; k--) {
		struct layer *L = &m->l[k];
		linear_grad(ws->act[k], ws->delta[k + 1], rows, L->in, L->out, L->gw, L->gb);
		/* Hand the gradients over now: their reduction runs while the
		 * layers below are differentiated. */
		st = kolo_allreduce_async(comm, L->wname, L->gw, L->gw,
		                          (size_t)L->in * (size_t)L->out, KOLO_FLOAT32,
		                          KOLO_AVERAGE, 1.0, 1.0, NULL, NULL, &h[nh]);
		if (st != KOLO_OK)
			break;
		nh++;
		st = kolo_allreduce_async(comm, L->bname, L->gb, L->gb, (size_t)L->out,
		                          KOLO_FLOAT32, KOLO_AVERAGE, 1.0, 1.0, NULL, NULL, &h[nh]);
		if (st != KOLO_OK)
			break;
		nh++;
		if (k > 0)
			linear_backward_input(ws->act[k], ws->delta[k + 1], rows, L->in, L->out,
			                      L->w, ws->delta[k]);
	}
	double t0 = now_s();
	for (int j = 0; j < nh; j++) {
		kolo_status_t w = kolo_wait(h[j]);
		if (st == KOLO_OK)
			st = w;
	}
	*comm_wait += now_s() - t0;
	if (st == KOLO_OK)
		sgd_step(m, (float)o->lr, (float)o->momentum);
	return st;
}

static void evaluate(const struct model *m, struct workspace *ws, const struct shard *sh,
                     struct metrics *mt)
{
	for (int j0 = 0; j0 < sh->n; j0 += ws->cap) {
		int rows = sh->n - j0 < ws->cap ? sh->n - j0 : ws->cap;
		memcpy(ws->act[0], sh->x + (size_t)j0 * INPUT_DIM,
		       sizeof(float) * (size_t)rows * INPUT_DIM);
		forward(m, ws, rows);
		for (int n = 0; n < rows; n++) {
			const float *z = ws->act[NLAYERS] + (size_t)n * NCLASS;
			int arg = 0;
			for (int c = 1; c < NCLASS; c++)
				if (z[c] > z[arg])
					arg = c;
			mt->correct += arg == sh->y[j0 + n];
			mt->count += 1;
		}
	}
}

static void usage(FILE *f)
{
	fprintf(f, "usage: kolorun -np N -- kolo-mlp [options]\n"
	           "  --epochs N     passes over the training set (default 8)\n"
	           "  --batch N      minibatch per rank (default 32; global batch = N x ranks)\n"
	           "  --lr X         learning rate (default 0.05)\n"
	           "  --momentum X   SGD momentum (default 0.9)\n"
	           "  --hidden N     width of the first hidden layer; then N/2, N/4 (default 256)\n"
	           "  --seed N       seed of the data set and the initial weights (default 1)\n"
	           "  --target X     test accuracy to reach, else exit 1 (default 0.90)\n"
	           "  --train N      training samples, split over the ranks (default 40000)\n"
	           "  --test N       held-out test samples (default 10000)\n"
	           "  --noise X      standard deviation of the noise around each blob (default "
	           "1.5)\n"
	           "  --no-broadcast skip the initial broadcast (shows that the weight check "
	           "fails)\n");
}

static int parse_options(int argc, char **argv, struct options *o)
{
	static const struct option longopts[] = {
	        {"epochs", required_argument, NULL, 'e'},
	        {"batch", required_argument, NULL, 'b'},
	        {"lr", required_argument, NULL, 'l'},
	        {"momentum", required_argument, NULL, 'm'},
	        {"hidden", required_argument, NULL, 'H'},
	        {"seed", required_argument, NULL, 's'},
	        {"target", required_argument, NULL, 't'},
	        {"train", required_argument, NULL, 'n'},
	        {"test", required_argument, NULL, 'N'},
	        {"noise", required_argument, NULL, 'z'},
	        {"no-broadcast", no_argument, NULL, 'B'},
	        {"help", no_argument, NULL, 'h'},
	        {NULL, 0, NULL, 0},
	};
	*o = (struct options){.epochs = 8,
	                      .batch = 32,
	                      .hidden = 256,
	                      .ntrain = 40000,
	                      .ntest = 10000,
	                      .lr = 0.05,
	                      .momentum = 0.9,
	                      .noise = 1.5,
	                      .target = 0.90,
	                      .seed = 1};
	int c;
	while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		switch (c) {
		case 'e':
			o->epochs = atoi(optarg);
			break;
		case 'b':
			o->batch = atoi(optarg);
			break;
		case 'l':
			o->lr = atof(optarg);
			break;
		case 'm':
			o->momentum = atof(optarg);
			break;
		case 'H':
			o->hidden = atoi(optarg);
			break;
		case 's':
			o->seed = strtoull(optarg, NULL, 0);
			break;
		case 't':
			o->target = atof(optarg);
			break;
		case 'n':
			o->ntrain = atoi(optarg);
			break;
		case 'N':
			o->ntest = atoi(optarg);
			break;
		case 'z':
			o->noise = atof(optarg);
			break;
		case 'B':
			o->no_broadcast = true;
			break;
		case 'h':
			usage(stdout);
			exit(0);
		default:
			usage(stderr);
			return -1;
		}
	}
	if (optind != argc || o->epochs < 1 || o->batch < 1 || o->hidden < 8 || o->ntrain < 1 ||
	    o->ntest < 1 || !(o->lr > 0) || !(o->momentum >= 0 && o->momentum < 1) ||
	    !(o->noise >= 0) || !(o->target >= 0 && o->target <= 1)) {
		usage(stderr);
		return -1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct options o;
	if (parse_options(argc, argv, &o) != 0)
		return EXIT_USAGE;

	kolo_comm_t *comm = NULL;
	struct model m = {0};
	struct workspace ws = {0};
	struct shard train = {0}, test = {0};
	float *centres = NULL;
	int *perm = NULL;
	int rc = EXIT_KOLO;

	kolo_status_t st = kolo_init(&comm);
	if (st != KOLO_OK) {
		fprintf(stderr, "kolo-mlp: kolo_init: %s: %s\n", kolo_strerror(st),
		        kolo_init_error());
		return EXIT_KOLO;
	}
	int rank = kolo_rank(comm), size = kolo_size(comm);
	g_rank = rank;
	bool root = rank == 0;
	setvbuf(stdout, NULL, _IOLBF, 0);

	centres = make_centres(o.seed);
	if (!centres || model_init(&m, o.hidden) != 0 ||
	    workspace_init(&ws, &m, o.batch > EVAL_BATCH ? o.batch : EVAL_BATCH) != 0 ||
	    shard_make(&train, centres, &o, STREAM_TRAIN, o.ntrain, rank, size) != 0 ||
	    shard_make(&test, centres, &o, STREAM_TEST, o.ntest, rank, size) != 0 ||
	    !(perm = malloc(sizeof(int) * (size_t)(train.n ? train.n : 1)))) {
		fprintf(stderr, "kolo-mlp: rank %d: out of memory\n", rank);
		goto fail;
	}

	/* Shards differ by at most one sample; the step counts differ only when
	 * that sample starts one more batch. Then the ranks that run out first
	 * join (contributing zeros) until the others finish the epoch. */
	int shard_max = (o.ntrain + size - 1) / size, shard_min = o.ntrain / size;
	int steps_max = (shard_max + o.batch - 1) / o.batch;
	int steps_min = (shard_min + o.batch - 1) / o.batch;
	bool uneven = steps_max != steps_min;
	if (root) {
		printf("kolo-mlp: %d ranks; model %d-%d-%d-%d-%d (%zu parameters in %d tensors); "
		       "%d train / %d test samples, %d classes\n",
		       size, INPUT_DIM, m.l[0].out, m.l[1].out, m.l[2].out, NCLASS, m.nparams,
		       2 * NLAYERS, o.ntrain, o.ntest, NCLASS);
		printf("kolo-mlp: batch %d per rank (%d global), lr %g, momentum %g, seed %" PRIu64
		       ", %d steps per epoch%s\n",
		       o.batch, o.batch * size, o.lr, o.momentum, o.seed, steps_max,
		       uneven ? " (uneven shards: kolo_join at the end of each epoch)" : "");
	}

	/* Rank 0's weights, everyone else's garbage: the broadcast must fix it. */
	model_fill(&m, o.seed, !root, rank);
	if (!o.no_broadcast)
		KCHECK(comm, broadcast_model(comm, &m, 0, "init.", false));
	bool same;
	int bad;
	uint64_t hash, other;
	KCHECK(comm, check_identical(comm, &m, "hash.init", &same, &bad, &hash, &other));
	if (!same) {
		if (root)
			printf("kolo-mlp: FAILED: initial weights differ after the broadcast: "
			       "rank %d has hash %016" PRIx64 ", rank 0 %016" PRIx64 "\n",
			       bad, other, hash);
		rc = EXIT_MISMATCH;
		goto fail;
	}
	if (root)
		printf("kolo-mlp: broadcast initial weights from rank 0 (hash %016" PRIx64 ")\n",
		       hash);

	double test_acc = 0, t_start = now_s();
	for (int epoch = 1; epoch <= o.epochs; epoch++) {
		struct metrics tr = {0};
		double comm_wait = 0, t0 = now_s();
		shuffle(perm, train.n, o.seed, rank, epoch);
		for (int j0 = 0; j0 < train.n; j0 += o.batch) {
			int rows = train.n - j0 < o.batch ? train.n - j0 : o.batch;
			for (int n = 0; n < rows; n++) {
				int s = perm[j0 + n];
				memcpy(ws.act[0] + (size_t)n * INPUT_DIM,
				       train.x + (size_t)s * INPUT_DIM, sizeof(float) * INPUT_DIM);
				ws.y[n] = train.y[s];
			}
			KCHECK(comm, train_step(comm, &m, &ws, rows, &o, &tr, &comm_wait));
		}
		if (uneven) {
			/* Ranks that joined early missed the last step's update:
			 * take the model and optimizer state from the last to join. */
			int last = -1;
			KCHECK(comm, kolo_join(comm, &last));
			KCHECK(comm, broadcast_model(comm, &m, last, "join.", true));
		}
		double t_train = now_s() - t0;

		struct metrics te = {0};
		evaluate(&m, &ws, &test, &te);
		double v[5] = {tr.loss_sum, tr.correct, tr.count, te.correct, te.count};
		KCHECK(comm, sum_f64(comm, "metrics", v, 5));
		test_acc = v[3] / v[4];
		if (root)
			printf("epoch %d/%d  loss %.4f  train acc %.4f  test acc %.4f  time %.2f s "
			       " "
			       "(waiting for gradients %.2f s)\n",
			       epoch, o.epochs, v[0] / v[2], v[1] / v[2], test_acc, t_train,
			       comm_wait);
	}
	double t_total = now_s() - t_start;

	KCHECK(comm, check_identical(comm, &m, "hash.final", &same, &bad, &hash, &other));
	bool reached = test_acc >= o.target;
	if (root) {
		printf("kolo-mlp: trained %d epochs in %.2f s\n", o.epochs, t_total);
		if (reached)
			printf("kolo-mlp: reached test accuracy %.4f >= target %.2f\n", test_acc,
			       o.target);
		else
			printf("kolo-mlp: FAILED: test accuracy %.4f < target %.2f\n", test_acc,
			       o.target);
		if (same)
			printf("kolo-mlp: weights bitwise identical on all %d ranks (hash "
			       "%016" PRIx64 ")\n",
			       size, hash);
		else
			printf("kolo-mlp: FAILED: weights differ: rank %d has hash %016" PRIx64
			       ", rank 0 %016" PRIx64 "\n",
			       bad, other, hash);
	}
	rc = !same ? EXIT_MISMATCH : !reached ? EXIT_TARGET : 0;

fail:
	free(perm);
	shard_fini(&train);
	shard_fini(&test);
	free(centres);
	workspace_fini(&ws);
	model_fini(&m);
	st = kolo_finalize(comm);
	if (st != KOLO_OK && rc == 0) {
		fprintf(stderr, "kolo-mlp: rank %d: kolo_finalize: %s\n", rank, kolo_strerror(st));
		rc = EXIT_KOLO;
	}
	return rc;
}
