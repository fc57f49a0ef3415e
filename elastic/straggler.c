/* straggler: the eviction policy (straggler.h). */
#include "straggler.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct kolo_straggler {
	int window;
	double pct;
	int size;
	int steps;       /* steps recorded since the window started (capped at window) */
	int next;        /* slot of the next step */
	double *step_ms; /* [window] */
	double *lag_ms;  /* [window * size] */
	double *scratch; /* [window] */
};

struct kolo_straggler *kolo_straggler_create(int window, double pct)
{
	if (window < 1 || !(pct > 0))
		return NULL;
	struct kolo_straggler *p = calloc(1, sizeof(*p));
	if (!p)
		return NULL;
	p->window = window;
	p->pct = pct;
	p->step_ms = calloc((size_t)window, sizeof(double));
	p->scratch = calloc((size_t)window, sizeof(double));
	if (!p->step_ms || !p->scratch) {
		kolo_straggler_destroy(p);
		return NULL;
	}
	return p;
}

void kolo_straggler_destroy(struct kolo_straggler *p)
{
	if (!p)
		return;
	free(p->step_ms);
	free(p->lag_ms);
	free(p->scratch);
	free(p);
}

void kolo_straggler_reset(struct kolo_straggler *p, int size)
{
	if (!p)
		return;
	p->steps = p->next = 0;
	if (size == p->size && p->lag_ms)
		return;
	free(p->lag_ms);
	p->lag_ms = size > 0 ? calloc((size_t)p->window * (size_t)size, sizeof(double)) : NULL;
	p->size = p->lag_ms ? size : 0;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* The rank the others waited for longest in step slot i, or -1. */
static int slowest_in(const struct kolo_straggler *p, int i)
{
	const double *lag = p->lag_ms + (size_t)i * (size_t)p->size;
	int worst = -1;
	for (int r = 0; r < p->size; r++)
		if (lag[r] >= KOLO_STRAGGLER_MIN_LAG_MS && (worst < 0 || lag[r] > lag[worst]))
			worst = r;
	return worst;
}

/* The window is full: the verdict on it. */
static int judge(struct kolo_straggler *p, char *why, size_t why_len)
{
	int best = -1, best_n = 0;
	for (int r = 0; r < p->size; r++) {
		int n = 0;
		for (int i = 0; i < p->window; i++)
			n += slowest_in(p, i) == r;
		if (n > best_n) {
			best = r;
			best_n = n;
		}
	}
	if (best < 0 || 4 * best_n < 3 * p->window)
		return -1;
	for (int i = 0; i < p->window; i++) {
		double lag = p->lag_ms[(size_t)i * (size_t)p->size + (size_t)best];
		double rest = p->step_ms[i] - lag;
		p->scratch[i] = lag / (rest > 1e-3 ? rest : 1e-3);
	}
	double excess = median(p->scratch, p->window);
	if (excess * 100 <= p->pct)
		return -1;
	for (int i = 0; i < p->window; i++)
		p->scratch[i] = p->lag_ms[(size_t)i * (size_t)p->size + (size_t)best];
	double lag = median(p->scratch, p->window);
	memcpy(p->scratch, p->step_ms, (size_t)p->window * sizeof(double));
	double step = median(p->scratch, p->window);
	if (why && why_len)
		snprintf(why, why_len,
		         "rank %d was the slowest in %d of the last %d steps and made them %.0f %% "
		         "longer on median (the others waited %.1f ms for it in a step of %.1f ms; "
		         "threshold %.0f %%)",
		         best, best_n, p->window, excess * 100, lag, step, p->pct);
	return best;
}

int kolo_straggler_step(struct kolo_straggler *p, double step_ms, const double *lag_ms, int size,
                        char *why, size_t why_len)
{
	if (!p || !lag_ms || size < 2)
		return -1;
	if (size != p->size)
		kolo_straggler_reset(p, size);
	if (!p->lag_ms)
		return -1;
	p->step_ms[p->next] = step_ms;
	for (int r = 0; r < size; r++)
		p->lag_ms[(size_t)p->next * (size_t)size + (size_t)r] =
		        lag_ms[r] > 0 ? lag_ms[r] : 0;
	p->next = (p->next + 1) % p->window;
	if (p->steps < p->window)
		p->steps++;
	if (p->steps < p->window)
		return -1;
	int r = judge(p, why, why_len);
	if (r >= 0)
		p->steps = p->next = 0;
	return r;
}
