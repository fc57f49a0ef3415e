/* kolo-elastic-mlp: the kolo-mlp training program (examples/mlp) in elastic
 * form. Same task, model and optimizer; the differences:
 *
 * - The training state (every layer's weights, biases and momentum, the
 *   epoch, the position in the epoch and the epoch's running metrics) is
 *   registered in a kolo_state_t and committed after every step; training
 *   runs in kolo_elastic_run(), so a worker that dies makes the survivors
 *   restore the last commit, re-form and go on, and a worker that joins is
 *   added at the next commit and receives the state from rank 0.
 * - The data are not split by rank once and for all: every rank generates
 *   the whole training set, and step k of an epoch takes the global batch
 *   perm[k*B*size ...] of that epoch's permutation, rank r its r-th slice of
 *   `batch` samples. A change of size changes only how the rest of the epoch
 *   is cut; no sample is lost or seen twice within an epoch, up to the
 *   remainder of an epoch that does not fill a global batch.
 * - --kill-at STEP: the worker of rank --kill-rank (default 1) of the first
 *   round kills itself with SIGKILL at global step STEP (a failure at a
 *   "random" step of a real job). Run with `kolorun --min-np 2 --max-np N
 *   --restart-failed` and the launcher starts a replacement that joins.
 *
 * At the end every rank checks that all replicas hold bitwise-identical
 * weights; exit status as kolo-mlp's (0 ok, 1 target missed, 2 replicas
 * differ, 3 kolo error, 64 usage). */
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kolo/async.h"
#include "kolo/elastic.h"
#include "kolo/kolo.h"
#include "mlp_model.h"

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
	int64_t kill_at;
	int kill_rank;
};

static int g_rank;

#define KCHECK(comm, call)                                                                         \
	do {                                                                                       \
		kolo_status_t st_ = (call);                                                        \
		if (st_ != KOLO_OK) {                                                              \
			fprintf(stderr, "kolo-elastic-mlp: rank %d: %s failed: %s: %s\n", g_rank,  \
			        #call, kolo_strerror(st_), (comm) ? kolo_last_error(comm) : "");   \
			goto fail;                                                                 \
		}                                                                                  \
	} while (0)

/* Every rank's parameter hash equal to rank 0's? (*bad: first that is not.) */
static kolo_status_t check_identical(kolo_comm_t *comm, const struct model *m, bool *same, int *bad,
                                     uint64_t *hash)
{
	int size = kolo_size(comm);
	uint64_t h = model_hash(m);
	uint64_t *all = NULL;
	size_t *counts = calloc((size_t)size, sizeof(size_t));
	kolo_handle_t *hd = NULL;
	if (!counts)
		return KOLO_ENOMEM;
	kolo_status_t st = kolo_allgather_async(comm, "hash.final", &h, 1, KOLO_INT64,
	                                        (void **)&all, counts, NULL, NULL, &hd);
	if (st == KOLO_OK)
		st = kolo_wait(hd);
	*same = true;
	*bad = -1;
	*hash = h;
	for (int r = 0; st == KOLO_OK && r < size; r++) {
		if (counts[r] != 1) {
			st = KOLO_EPROTO;
			break;
		}
		if (all[r] != all[0] && *same) {
			*same = false;
			*bad = r;
		}
		*hash = all[0];
	}
	free(all);
	free(counts);
	return st;
}

/* ---- training ---- */

static void shuffle(int *perm, int n, uint64_t seed, int epoch)
{
	uint64_t s = rng_for(seed, STREAM_SHUFFLE, (uint64_t)epoch);
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
 * soon as they exist, wait, step. */
static kolo_status_t train_step(kolo_comm_t *comm, struct model *m, struct workspace *ws, int rows,
                                const struct options *o, struct metrics *mt)
{
	kolo_handle_t *h[2 * NLAYERS];
	int nh = 0;
	kolo_status_t st = KOLO_OK;

	forward(m, ws, rows);
	softmax_xent(ws->act[NLAYERS], ws->y, rows, NCLASS, ws->delta[NLAYERS], mt);
	for (int k = NLAYERS - 1; k >= 0; k--) {
		struct layer *L = &m->l[k];
		linear_grad(ws->act[k], ws->delta[k + 1], rows, L->in, L->out, L->gw, L->gb);
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
	for (int j = 0; j < nh; j++) {
		kolo_status_t w = kolo_wait(h[j]);
		if (st == KOLO_OK)
			st = w;
	}
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

/* What kolo_elastic_run's function needs. The first five fields are the
 * state registered besides the model. */
struct run {
	int64_t epoch;  /* 1-based; epochs + 1 when done */
	int64_t offset; /* samples of this epoch already consumed */
	int64_t gstep;  /* global steps done */
	double tr[3];   /* this epoch's training loss sum, correct, count */
	double test_acc;
	const struct options *o;
	struct model *m;
	struct workspace *ws;
	struct shard *train, *test;
	int *perm;
	int64_t perm_epoch;
};

static kolo_status_t train_fn(kolo_comm_t *comm, kolo_state_t *state, void *arg)
{
	struct run *r = arg;
	const struct options *o = r->o;
	int rank = kolo_rank(comm), size = kolo_size(comm);
	g_rank = rank;
	printf("kolo-elastic-mlp: round %" PRId64 ": rank %d of %d, epoch %" PRId64
	       ", step %" PRId64 " (re-forms so far: %d)\n",
	       kolo_round(comm), rank, size, r->epoch, r->gstep, kolo_elastic_resets(comm));
	bool first_round = kolo_elastic_resets(comm) == 0 && kolo_round(comm) == 1;
	int64_t gbatch = (int64_t)o->batch * size;
	while (r->epoch <= o->epochs) {
		if (r->perm_epoch != r->epoch) {
			shuffle(r->perm, r->train->n, o->seed, (int)r->epoch);
			r->perm_epoch = r->epoch;
		}
		if (r->offset + gbatch <= r->train->n) {
			if (o->kill_at >= 0 && r->gstep == o->kill_at && first_round &&
			    rank == o->kill_rank) {
				printf("kolo-elastic-mlp: rank %d: killing myself (SIGKILL) at "
				       "step "
				       "%" PRId64 "\n",
				       rank, r->gstep);
				fflush(stdout);
				raise(SIGKILL);
			}
			int64_t base = r->offset + (int64_t)rank * o->batch;
			for (int n = 0; n < o->batch; n++) {
				int s = r->perm[base + n];
				memcpy(r->ws->act[0] + (size_t)n * INPUT_DIM,
				       r->train->x + (size_t)s * INPUT_DIM,
				       sizeof(float) * INPUT_DIM);
				r->ws->y[n] = r->train->y[s];
			}
			struct metrics mt = {0};
			kolo_status_t st = train_step(comm, r->m, r->ws, o->batch, o, &mt);
			if (st != KOLO_OK)
				return st;
			double v[3] = {mt.loss_sum, mt.correct, mt.count};
			if ((st = sum_f64(comm, "metrics.train", v, 3)) != KOLO_OK)
				return st;
			for (int j = 0; j < 3; j++)
				r->tr[j] += v[j];
			r->offset += gbatch;
			r->gstep++;
		} else {
			/* End of the epoch: the test set, split over the current ranks. */
			struct shard part = {0};
			int lo = (int)((int64_t)r->test->n * rank / size);
			int hi = (int)((int64_t)r->test->n * (rank + 1) / size);
			part.n = hi - lo;
			part.x = r->test->x + (size_t)lo * INPUT_DIM;
			part.y = r->test->y + lo;
			struct metrics te = {0};
			evaluate(r->m, r->ws, &part, &te);
			double v[2] = {te.correct, te.count};
			kolo_status_t st = sum_f64(comm, "metrics.test", v, 2);
			if (st != KOLO_OK)
				return st;
			r->test_acc = v[0] / v[1];
			if (rank == 0)
				printf("epoch %" PRId64 "/%d  loss %.4f  train acc %.4f  test acc "
				       "%.4f  (%d ranks)\n",
				       r->epoch, o->epochs, r->tr[0] / r->tr[2],
				       r->tr[1] / r->tr[2], r->test_acc, size);
			r->epoch++;
			r->offset = 0;
			memset(r->tr, 0, sizeof(r->tr));
		}
		kolo_status_t st = kolo_state_commit(state);
		if (st != KOLO_OK)
			return st;
	}
	return KOLO_OK;
}

static void usage(FILE *f)
{
	fprintf(f, "usage: kolorun --min-np A --max-np B -np N [--restart-failed] -- "
	           "kolo-elastic-mlp [options]\n"
	           "  --epochs N     passes over the training set (default 8)\n"
	           "  --batch N      minibatch per rank (default 32)\n"
	           "  --lr X         learning rate (default 0.05)\n"
	           "  --momentum X   SGD momentum (default 0.9)\n"
	           "  --hidden N     width of the first hidden layer; then N/2, N/4 (default 256)\n"
	           "  --seed N       seed of the data set and the initial weights (default 1)\n"
	           "  --target X     test accuracy to reach, else exit 1 (default 0.90)\n"
	           "  --train N      training samples (default 40000)\n"
	           "  --test N       held-out test samples (default 10000)\n"
	           "  --noise X      standard deviation of the noise around each blob (default "
	           "1.5)\n"
	           "  --kill-at N    the worker of rank --kill-rank kills itself at global step N\n"
	           "  --kill-rank R  (default 1)\n");
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
	        {"kill-at", required_argument, NULL, 'K'},
	        {"kill-rank", required_argument, NULL, 'R'},
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
	                      .seed = 1,
	                      .kill_at = -1,
	                      .kill_rank = 1};
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
		case 'K':
			o->kill_at = atoll(optarg);
			break;
		case 'R':
			o->kill_rank = atoi(optarg);
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

static kolo_status_t register_state(kolo_state_t *state, struct model *m, struct run *r)
{
	kolo_status_t st = KOLO_OK;
	for (int k = 0; k < NLAYERS && st == KOLO_OK; k++) {
		struct layer *L = &m->l[k];
		size_t nw = (size_t)L->in * (size_t)L->out;
		char name[64];
		snprintf(name, sizeof(name), "%s", L->wname);
		st = kolo_state_register(state, name, L->w, nw, KOLO_FLOAT32);
		snprintf(name, sizeof(name), "%s", L->bname);
		if (st == KOLO_OK)
			st = kolo_state_register(state, name, L->b, (size_t)L->out, KOLO_FLOAT32);
		snprintf(name, sizeof(name), "momentum.%s", L->wname);
		if (st == KOLO_OK)
			st = kolo_state_register(state, name, L->vw, nw, KOLO_FLOAT32);
		snprintf(name, sizeof(name), "momentum.%s", L->bname);
		if (st == KOLO_OK)
			st = kolo_state_register(state, name, L->vb, (size_t)L->out, KOLO_FLOAT32);
	}
	if (st == KOLO_OK)
		st = kolo_state_register(state, "epoch", &r->epoch, 1, KOLO_INT64);
	if (st == KOLO_OK)
		st = kolo_state_register(state, "offset", &r->offset, 1, KOLO_INT64);
	if (st == KOLO_OK)
		st = kolo_state_register(state, "gstep", &r->gstep, 1, KOLO_INT64);
	if (st == KOLO_OK)
		st = kolo_state_register(state, "metrics", r->tr, 3, KOLO_FLOAT64);
	return st;
}

int main(int argc, char **argv)
{
	struct options o;
	if (parse_options(argc, argv, &o) != 0)
		return EXIT_USAGE;

	kolo_comm_t *comm = NULL;
	kolo_state_t *state = NULL;
	struct model m = {0};
	struct workspace ws = {0};
	struct shard train = {0}, test = {0};
	float *centres = NULL;
	int *perm = NULL;
	int rc = EXIT_KOLO;

	kolo_status_t st = kolo_init(&comm);
	if (st == KOLO_ESHUTDOWN) { /* the job finished before this worker got a rank */
		printf("kolo-elastic-mlp: %s; nothing to do\n", kolo_init_error());
		return 0;
	}
	if (st != KOLO_OK) {
		fprintf(stderr, "kolo-elastic-mlp: kolo_init: %s: %s\n", kolo_strerror(st),
		        kolo_init_error());
		return EXIT_KOLO;
	}
	int rank = kolo_rank(comm);
	g_rank = rank;
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (!kolo_elastic_enabled(comm) && rank == 0)
		printf("kolo-elastic-mlp: not an elastic job (KOLO_ELASTIC is off): a failure "
		       "will be fatal\n");

	/* The whole data set on every rank: the split follows the membership. */
	centres = make_centres(o.seed);
	if (!centres || model_init(&m, o.hidden) != 0 ||
	    workspace_init(&ws, &m, o.batch > EVAL_BATCH ? o.batch : EVAL_BATCH) != 0 ||
	    shard_make(&train, centres, o.noise, o.seed, STREAM_TRAIN, o.ntrain, 0, 1) != 0 ||
	    shard_make(&test, centres, o.noise, o.seed, STREAM_TEST, o.ntest, 0, 1) != 0 ||
	    !(perm = malloc(sizeof(int) * (size_t)o.ntrain))) {
		fprintf(stderr, "kolo-elastic-mlp: rank %d: out of memory\n", rank);
		goto fail;
	}
	if (rank == 0)
		printf("kolo-elastic-mlp: model %d-%d-%d-%d-%d (%zu parameters); %d train / %d "
		       "test samples; batch %d per rank, lr %g, momentum %g, seed %" PRIu64 "\n",
		       INPUT_DIM, m.l[0].out, m.l[1].out, m.l[2].out, NCLASS, m.nparams, o.ntrain,
		       o.ntest, o.batch, o.lr, o.momentum, o.seed);

	/* Rank 0's weights, everyone else's garbage: the state sync must fix it
	 * (a worker that joins later starts from garbage too). */
	model_fill(&m, o.seed, rank != 0, rank);
	struct run r = {.epoch = 1,
	                .o = &o,
	                .m = &m,
	                .ws = &ws,
	                .train = &train,
	                .test = &test,
	                .perm = perm};
	KCHECK(comm, kolo_state_create(comm, &state));
	KCHECK(comm, register_state(state, &m, &r));
	double t0 = now_s();
	st = kolo_elastic_run(comm, state, train_fn, &r);
	if (st == KOLO_ESHUTDOWN && kolo_state_left(state)) {
		bool evicted = kolo_elastic_evicted(comm);
		printf("kolo-elastic-mlp: %s the job at step %" PRId64 "\n",
		       evicted ? "evicted as a straggler from" : "left", r.gstep);
		rc = evicted ? KOLO_EXIT_EVICTED : 0;
		goto fail;
	}
	KCHECK(comm, st);
	rank = kolo_rank(comm);
	int size = kolo_size(comm);
	bool same;
	int bad;
	uint64_t hash;
	KCHECK(comm, check_identical(comm, &m, &same, &bad, &hash));
	bool reached = r.test_acc >= o.target;
	if (rank == 0) {
		printf("kolo-elastic-mlp: trained %d epochs (%" PRId64
		       " steps) in %.2f s; %d re-forms; finished with %d ranks\n",
		       o.epochs, r.gstep, now_s() - t0, kolo_elastic_resets(comm), size);
		if (reached)
			printf("kolo-elastic-mlp: reached test accuracy %.4f >= target %.2f\n",
			       r.test_acc, o.target);
		else
			printf("kolo-elastic-mlp: FAILED: test accuracy %.4f < target %.2f\n",
			       r.test_acc, o.target);
		if (same)
			printf("kolo-elastic-mlp: weights bitwise identical on all %d ranks (hash "
			       "%016" PRIx64 ")\n",
			       size, hash);
		else
			printf("kolo-elastic-mlp: FAILED: weights differ: rank %d differs from "
			       "rank 0\n",
			       bad);
	}
	rc = !same ? EXIT_MISMATCH : !reached ? EXIT_TARGET : 0;

fail:
	kolo_state_destroy(state);
	free(perm);
	shard_fini(&train);
	shard_fini(&test);
	free(centres);
	workspace_fini(&ws);
	model_fini(&m);
	st = kolo_finalize(comm);
	if (st != KOLO_OK && rc == 0) {
		fprintf(stderr, "kolo-elastic-mlp: rank %d: kolo_finalize: %s\n", rank,
		        kolo_strerror(st));
		rc = EXIT_KOLO;
	}
	return rc;
}
