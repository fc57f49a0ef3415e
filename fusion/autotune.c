/* autotune: coordinate search of the fusion threshold, then of the cycle
 * time, over fixed grids, each candidate scored by the median throughput of a
 * few samples (bytes reduced per second of wall time over whole steps).
 * Rationale in docs/fusion.md. */
#include "fusion_internal.h"

#include <stdlib.h>
#include <string.h>

static const uint64_t thr_grid[] = {1ull << 20,  2ull << 20,  4ull << 20,  8ull << 20,
                                    16ull << 20, 32ull << 20, 64ull << 20, 128ull << 20};
static const double cyc_grid[] = {0.5, 1.0, 2.0, 5.0, 10.0};
#define NTHR (sizeof(thr_grid) / sizeof(thr_grid[0]))
#define NCYC (sizeof(cyc_grid) / sizeof(cyc_grid[0]))
#define MAXS 16

enum { PH_THRESHOLD, PH_CYCLE, PH_DONE };

struct fusion_autotune {
	struct fusion_autotune_config cfg;
	FILE *log;
	int phase;
	size_t cand; /* index in the current grid */
	uint64_t thr;
	double cyc;
	double best_score;
	uint64_t best_thr;
	double best_cyc;
	bool switching; /* waiting for fusion_autotune_applied */
	/* the sample being measured */
	bool started;
	char *first;
	uint64_t sample_start, sample_bytes, step_bytes;
	int steps;
	int warm_left;
	double samples[MAXS];
	int nsamples;
	int sample_no;
};

kolo_status_t fusion_autotune_create(const struct fusion_autotune_config *cfg,
                                     struct fusion_autotune **out)
{
	*out = NULL;
	struct fusion_autotune *a = calloc(1, sizeof(*a));
	if (!a)
		return KOLO_ENOMEM;
	a->cfg = *cfg;
	a->cfg.log_path = NULL;
	if (a->cfg.steps_per_sample < 1)
		a->cfg.steps_per_sample = 1;
	if (a->cfg.samples_per_candidate < 1)
		a->cfg.samples_per_candidate = 1;
	if (a->cfg.samples_per_candidate > MAXS)
		a->cfg.samples_per_candidate = MAXS;
	if (a->cfg.warmup_samples < 0)
		a->cfg.warmup_samples = 0;
	if (cfg->log_path && cfg->log_path[0]) {
		a->log = fopen(cfg->log_path, "w");
		if (!a->log) {
			free(a);
			return KOLO_ESYSTEM;
		}
		fprintf(a->log, "sample,phase,fusion_threshold,cycle_time_ms,score_bytes_per_s\n");
		fflush(a->log);
	}
	a->phase = PH_THRESHOLD;
	a->cand = 0;
	a->thr = cfg->threshold;
	a->cyc = cfg->cycle_time_ms;
	a->best_thr = cfg->threshold;
	a->best_cyc = cfg->cycle_time_ms;
	a->best_score = -1;
	/* The first candidate is the grid's first threshold: ask for it. */
	a->switching = false;
	a->warm_left = a->cfg.warmup_samples;
	*out = a;
	return KOLO_OK;
}

void fusion_autotune_destroy(struct fusion_autotune *a)
{
	if (!a)
		return;
	if (a->log) {
		fprintf(a->log, "best,final,%llu,%g,%.6g\n", (unsigned long long)a->best_thr,
		        a->best_cyc, a->best_score);
		fclose(a->log);
	}
	free(a->first);
	free(a);
}

bool fusion_autotune_done(const struct fusion_autotune *a)
{
	return a->phase == PH_DONE;
}

void fusion_autotune_best(const struct fusion_autotune *a, uint64_t *threshold, double *cycle_ms)
{
	*threshold = a->best_thr;
	*cycle_ms = a->best_cyc;
}

static void reset_sample(struct fusion_autotune *a)
{
	a->started = false;
	free(a->first);
	a->first = NULL;
	a->sample_bytes = a->step_bytes = 0;
	a->steps = 0;
}

void fusion_autotune_applied(struct fusion_autotune *a, uint64_t now_ns)
{
	(void)now_ns;
	a->switching = false;
	reset_sample(a);
	a->nsamples = 0;
	a->warm_left = a->cfg.warmup_samples;
}

static int cmp_double(const void *x, const void *y)
{
	double a = *(const double *)x, b = *(const double *)y;
	return (a > b) - (a < b);
}

/* The values of candidate `cand` in the current phase. */
static void candidate(const struct fusion_autotune *a, uint64_t *thr, double *cyc)
{
	if (a->phase == PH_THRESHOLD) {
		*thr = thr_grid[a->cand];
		*cyc = a->cfg.cycle_time_ms;
	} else {
		*thr = a->best_thr;
		*cyc = cyc_grid[a->cand];
	}
}

bool fusion_autotune_record(struct fusion_autotune *a, const char *name, uint64_t bytes,
                            uint64_t now_ns, uint64_t *threshold, double *cycle_ms)
{
	if (a->phase == PH_DONE || a->switching)
		return false;
	if (a->sample_no == 0 && !a->started && a->nsamples == 0 && a->cand == 0 &&
	    a->phase == PH_THRESHOLD && (a->thr != thr_grid[0] || a->cyc != a->cfg.cycle_time_ms)) {
		/* Start the search at the first grid point. */
		candidate(a, &a->thr, &a->cyc);
		a->switching = true;
		a->sample_no = 1;
		*threshold = a->thr;
		*cycle_ms = a->cyc;
		return true;
	}
	if (!a->started) {
		a->started = true;
		a->first = strdup(name);
		a->sample_start = now_ns;
		a->sample_bytes = bytes;
		return false;
	}
	if (a->first && strcmp(a->first, name) == 0) {
		a->steps++;
		if (a->steps >= a->cfg.steps_per_sample) {
			double secs = (double)(now_ns - a->sample_start) / 1e9;
			double score = secs > 0 ? (double)a->sample_bytes / secs : 0;
			bool warm = a->warm_left > 0;
			if (a->log) {
				fprintf(a->log, "%d,%s,%llu,%g,%.6g\n", a->sample_no,
				        warm ? "warmup"
				             : (a->phase == PH_THRESHOLD ? "threshold"
				                                         : "cycle_time"),
				        (unsigned long long)a->thr, a->cyc, score);
				fflush(a->log);
			}
			a->sample_no++;
			/* The boundary tensor opens the next sample. */
			a->sample_start = now_ns;
			a->sample_bytes = 0;
			a->steps = 0;
			if (warm) {
				a->warm_left--;
			} else {
				a->samples[a->nsamples++] = score;
			}
			if (a->nsamples >= a->cfg.samples_per_candidate) {
				qsort(a->samples, (size_t)a->nsamples, sizeof(double), cmp_double);
				double med = a->samples[a->nsamples / 2];
				if (med > a->best_score) {
					a->best_score = med;
					a->best_thr = a->thr;
					a->best_cyc = a->cyc;
				}
				a->cand++;
				size_t n = a->phase == PH_THRESHOLD ? NTHR : NCYC;
				if (a->cand >= n) {
					a->phase++;
					a->cand = 0;
				}
				if (a->phase == PH_DONE) {
					a->thr = a->best_thr;
					a->cyc = a->best_cyc;
					if (a->log) {
						fprintf(a->log, "chosen,final,%llu,%g,%.6g\n",
						        (unsigned long long)a->best_thr,
						        a->best_cyc, a->best_score);
						fflush(a->log);
					}
				} else {
					candidate(a, &a->thr, &a->cyc);
				}
				a->switching = a->phase != PH_DONE;
				*threshold = a->thr;
				*cycle_ms = a->cyc;
				return true;
			}
		}
	}
	a->sample_bytes += bytes;
	return false;
}
