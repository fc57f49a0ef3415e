/* straggler: the eviction policy for persistent stragglers of an elastic
 * job (docs/diagnosis.md, "Evicting a straggler"). Pure: it is fed, once per
 * training step (a commit point), the step's wall time and how long the
 * others waited for each rank during it (the sum of the rank's arrival lags,
 * core/flight.c), and says which rank to evict, if any.
 *
 * A rank is evicted when, over the last `window` steps of the round, it was
 * the slowest (the one the others waited for longest, by at least
 * KOLO_STRAGGLER_MIN_LAG_MS) in at least three steps of four, and on median
 * over the window it made the step longer by more than `pct` percent than the
 * others would have taken without it: lag / (step - lag) > pct / 100. The
 * window starts over after each decision and each new round. Whether the job
 * may shrink (min-np) is the caller's question. */
#ifndef KOLO_ELASTIC_STRAGGLER_H
#define KOLO_ELASTIC_STRAGGLER_H

#include <stddef.h>

#define KOLO_STRAGGLER_MIN_LAG_MS 0.5

struct kolo_straggler;

/* NULL when out of memory or window < 1 or pct <= 0. */
struct kolo_straggler *kolo_straggler_create(int window, double pct);
void kolo_straggler_destroy(struct kolo_straggler *p);
/* Starts the window over for a comm of size ranks (a new round). */
void kolo_straggler_reset(struct kolo_straggler *p, int size);
/* One step of step_ms, lag_ms[r] for each of the size ranks (a size other
 * than the reset's starts the window over). Returns the rank to evict, with
 * why (a sentence) filled, or -1. After a rank is named, the window starts
 * over. */
int kolo_straggler_step(struct kolo_straggler *p, double step_ms, const double *lag_ms, int size,
                        char *why, size_t why_len);

#endif /* KOLO_ELASTIC_STRAGGLER_H */
