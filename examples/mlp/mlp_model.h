/* The model, data and maths shared by the training examples (kolo-mlp and
 * kolo-elastic-mlp): a deterministic synthetic classification task, a
 * multi-layer perceptron in float32 with plain loops that -O3 vectorises, and
 * a named float64 sum through the fusion engine. Header-only (static inline),
 * so each example stays one file plus this. */
#ifndef KOLO_EXAMPLES_MLP_MODEL_H
#define KOLO_EXAMPLES_MLP_MODEL_H

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

/* ---- deterministic random numbers ---- */

static inline uint64_t splitmix64(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

/* A generator state for stream `stream` item `index` of a seed. */
static inline uint64_t rng_for(uint64_t seed, uint64_t stream, uint64_t index)
{
	uint64_t s = seed ^ (stream * 0xd1b54a32d192ed03ULL);
	uint64_t a = splitmix64(&s) ^ index;
	return splitmix64(&a);
}

static inline double uniform01(uint64_t *s)
{
	return (double)(splitmix64(s) >> 11) * 0x1.0p-53;
}

static inline double gaussian(uint64_t *s)
{
	double u1 = 1.0 - uniform01(s); /* (0, 1] */
	double u2 = uniform01(s);
	return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

static inline double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- the data set ---- */

enum { STREAM_CENTRES = 1, STREAM_TRAIN, STREAM_TEST, STREAM_INIT, STREAM_GARBAGE, STREAM_SHUFFLE };

static inline float *make_centres(uint64_t seed)
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
static inline int shard_make(struct shard *sh, const float *centres, double noise, uint64_t seed,
                             int stream, int total, int rank, int size)
{
	sh->n = total > rank ? (total - rank + size - 1) / size : 0;
	sh->x = malloc(sizeof(float) * INPUT_DIM * (size_t)(sh->n ? sh->n : 1));
	sh->y = malloc(sizeof(int) * (size_t)(sh->n ? sh->n : 1));
	if (!sh->x || !sh->y)
		return -1;
	/* Unit variance per coordinate on average: centres ~ N(0,1), noise ~ N(0,sigma^2). */
	double scale = 1.0 / sqrt(1.0 + noise * noise);
	for (int j = 0; j < sh->n; j++) {
		uint64_t idx = (uint64_t)rank + (uint64_t)j * (uint64_t)size;
		uint64_t s = rng_for(seed, (uint64_t)stream, idx);
		int cls = (int)(splitmix64(&s) % NCLASS);
		int blob = (int)(splitmix64(&s) % NBLOB);
		const float *c = centres + (size_t)(cls * NBLOB + blob) * INPUT_DIM;
		float *x = sh->x + (size_t)j * INPUT_DIM;
		for (int d = 0; d < INPUT_DIM; d++)
			x[d] = (float)(scale * (c[d] + noise * gaussian(&s)));
		sh->y[j] = cls;
	}
	return 0;
}

static inline void shard_fini(struct shard *sh)
{
	free(sh->x);
	free(sh->y);
}

/* ---- the model ---- */

static inline void model_fini(struct model *m)
{
	for (int k = 0; k < NLAYERS; k++) {
		struct layer *L = &m->l[k];
		free(L->w), free(L->b), free(L->gw), free(L->gb), free(L->vw), free(L->vb);
	}
}

static inline int model_init(struct model *m, int hidden)
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
static inline void model_fill(struct model *m, uint64_t seed, bool garbage, int rank)
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
static inline uint64_t model_hash(const struct model *m)
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

static inline void workspace_fini(struct workspace *ws)
{
	for (int k = 0; k <= NLAYERS; k++)
		free(ws->act[k]), free(ws->delta[k]);
	free(ws->y);
}

static inline int workspace_init(struct workspace *ws, const struct model *m, int cap)
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
static inline void linear_forward(const float *restrict x, int rows, int in, int out,
                                  const float *restrict w, const float *restrict b,
                                  float *restrict y, bool relu)
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
static inline float dot(const float *restrict a, const float *restrict b, int n)
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
static inline void linear_grad(const float *restrict x, const float *restrict dy, int rows, int in,
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
static inline void linear_backward_input(const float *restrict x, const float *restrict dy,
                                         int rows, int in, int out, const float *restrict w,
                                         float *restrict dx)
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
static inline void softmax_xent(const float *z, const int *y, int rows, int nclass, float *dz,
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

static inline void forward(const struct model *m, struct workspace *ws, int rows)
{
	for (int k = 0; k < NLAYERS; k++) {
		const struct layer *L = &m->l[k];
		linear_forward(ws->act[k], rows, L->in, L->out, L->w, L->b, ws->act[k + 1],
		               k < NLAYERS - 1);
	}
}

/* ---- collectives through the engine ---- */

/* In-place sum of n doubles over the ranks, through the engine by name. */
static inline kolo_status_t sum_f64(kolo_comm_t *comm, const char *name, double *v, size_t n)
{
	kolo_handle_t *h = NULL;
	kolo_status_t st = kolo_allreduce_async(comm, name, v, v, n, KOLO_FLOAT64, KOLO_SUM, 1.0,
	                                        1.0, NULL, NULL, &h);
	return st == KOLO_OK ? kolo_wait(h) : st;
}

#endif /* KOLO_EXAMPLES_MLP_MODEL_H */
