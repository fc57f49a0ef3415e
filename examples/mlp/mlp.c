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
	bool no_broadcast; /* a self-test of the weight check: skip the broadcast */
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
	    shard_make(&train, centres, o.noise, o.seed, STREAM_TRAIN, o.ntrain, rank, size) != 0 ||
	    shard_make(&test, centres, o.noise, o.seed, STREAM_TEST, o.ntest, rank, size) != 0 ||
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
