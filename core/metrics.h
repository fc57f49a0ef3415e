/* metrics: the worker's counters, gauges and histograms, and their
 * Prometheus text (exposition format 0.0.4). docs/metrics.md names every
 * metric; runtime/metrics_http.c serves the text on KOLO_METRICS_LISTEN.
 *
 * In core, not runtime, because the hooks sit in every layer (the runtime's
 * collectives, fusion's batches and cycles, the transports' failures) and
 * core is the one module they all link. State is per process: one set of
 * counters however many comms the process has.
 *
 * The hooks are called on the hot path. Each is a few relaxed atomic
 * additions into fixed arrays (histograms have fixed log2 buckets chosen at
 * compile time): no lock, no allocation, callable from any thread. Until
 * kolo_metrics_enable() (the endpoint's start) every hook returns after one
 * relaxed load, and kolo_metrics_start() reads no clock: a process that
 * serves no metrics pays nothing measurable. */
#ifndef KOLO_METRICS_H
#define KOLO_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kolo/kolo.h"

/* The collective families, as the label collective="..." names them. */
enum kolo_metrics_coll {
	KOLO_MCOLL_ALLREDUCE,
	KOLO_MCOLL_ALLGATHER,
	KOLO_MCOLL_BROADCAST,
	KOLO_MCOLL_REDUCESCATTER,
	KOLO_MCOLL_ALLTOALL,
	KOLO_MCOLL_BARRIER,
	KOLO_MCOLL_COUNT
};

/* The entry point: kolo.h's blocking calls or async.h's handles. */
enum kolo_metrics_mode { KOLO_MMODE_BLOCKING, KOLO_MMODE_ASYNC, KOLO_MMODE_COUNT };

/* Size classes of the latency histograms, by the operation's bytes. */
#define KOLO_METRICS_SMALL_BYTES  (64u << 10) /* small: below 64 KiB */
#define KOLO_METRICS_MEDIUM_BYTES (16u << 20) /* medium: below 16 MiB; large: the rest */
enum kolo_metrics_size { KOLO_MSIZE_SMALL, KOLO_MSIZE_MEDIUM, KOLO_MSIZE_LARGE, KOLO_MSIZE_COUNT };

/* The phases of a re-form (runtime/reform.c), label phase="...". */
enum kolo_metrics_phase {
	KOLO_MPHASE_DETECT,   /* last completed operation -> the failed one returned */
	KOLO_MPHASE_TEARDOWN, /* kolo_reform start -> old data plane closed */
	KOLO_MPHASE_ROUND,    /* -> the next round's assignment */
	KOLO_MPHASE_CONNECT,  /* -> transport listening, address published, ring up */
	KOLO_MPHASE_SYNC,     /* -> the first kolo_state_sync after it returned */
	KOLO_MPHASE_COUNT
};

enum kolo_metrics_transport { KOLO_MTRANSPORT_TCP, KOLO_MTRANSPORT_SHM, KOLO_MTRANSPORT_COUNT };

/* Turns counting on, for the rest of the process. Idempotent. */
void kolo_metrics_enable(void);
/* Whether counting is on. */
bool kolo_metrics_enabled(void);

/* ---- hooks (hot path: lock-free, allocation-free, any thread) ---------- */

/* An operation's start for kolo_metrics_coll_done: kolo_now_ns() while
 * counting is on, else 0 (no clock read). */
uint64_t kolo_metrics_start(void);
/* An operation finished: its family, entry point, bytes (docs/metrics.md:
 * allreduce and broadcast the buffer, allgather the gathered output,
 * reducescatter the input, alltoall what this rank sends, barrier 0) and
 * when it started (kolo_metrics_start(); blocking: the call, async: the
 * enqueue). A failed one (st != KOLO_OK) counts only as a failure, by
 * status. start_ns 0 (counting was off then) records no duration. */
void kolo_metrics_coll_done(enum kolo_metrics_coll c, enum kolo_metrics_mode m, uint64_t bytes,
                            uint64_t start_ns, kolo_status_t st);
/* kolo_metrics_coll_done with the duration given (ns), for tests. */
void kolo_metrics_coll_observe(enum kolo_metrics_coll c, enum kolo_metrics_mode m, uint64_t bytes,
                               uint64_t ns, kolo_status_t st);
/* The size class of an operation of this many bytes. */
enum kolo_metrics_size kolo_metrics_size_class(uint64_t bytes);
/* The fusion engine ran one allreduce batch of `tensors` tensors and
 * `bytes` bytes, `packed` of them through a fusion buffer of threshold bytes
 * (the rest: large tensors that join the batch's pipeline in place); the
 * fill ratio is packed / threshold (0: fusion off; then none is recorded). */
void kolo_metrics_fusion_batch(size_t tensors, uint64_t bytes, uint64_t packed, uint64_t threshold);
/* One negotiation cycle decided, cache_hits responses from the cache. */
void kolo_metrics_fusion_cycle(uint64_t cache_hits);
/* The stall inspector warned about stalled operations. */
void kolo_metrics_fusion_stall(void);
/* A conn of transport t failed with st (the first failure of the conn). */
void kolo_metrics_transport_error(enum kolo_metrics_transport t, kolo_status_t st);
/* Elastic: a collective of the round failed with a membership failure (the
 * detect phase ends here; the first call per re-form counts). */
void kolo_metrics_failure_seen(void);
/* A re-form completed; ns are runtime/reform.c's reform_ns (start, torn
 * down, assigned, connected). at_commit: a membership change applied at a
 * commit point (join, leave) rather than a failure. */
void kolo_metrics_reform_done(const uint64_t ns[4], bool at_commit);
/* kolo_state_sync succeeded (the sync phase of a preceding re-form). */
void kolo_metrics_sync_done(void);

/* ---- process state (not hot) ------------------------------------------- */

/* The comm's place after each new assignment. */
void kolo_metrics_set_assignment(int rank, int size, int local_rank, int64_t round);
/* The job and host labels of kolo_info (copied; thread-safe). */
void kolo_metrics_set_identity(const char *job, const char *host);

/* ---- exposition ---------------------------------------------------------- */

/* The whole text of GET /metrics, malloc'd, NUL-terminated; KOLO_ENOMEM. */
kolo_status_t kolo_metrics_render(char **out, size_t *len);

/* The text being built: a growing buffer whose out-of-memory is sticky. */
struct kolo_metrics_text {
	char *b;
	size_t len, cap;
	bool oom;
};
void kolo_metrics_text_add(struct kolo_metrics_text *t, const char *fmt, ...)
        __attribute__((format(printf, 2, 3)));
/* "# HELP name help" and "# TYPE name type" (help escaped as the format
 * wants: backslash and newline). */
void kolo_metrics_text_family(struct kolo_metrics_text *t, const char *name, const char *type,
                              const char *help);
/* name{labels} value; labels is "" or a list made by kolo_metrics_labels. */
void kolo_metrics_text_sample(struct kolo_metrics_text *t, const char *name, const char *labels,
                              uint64_t value);
/* A histogram's samples: name_bucket{labels,le="le[i]"} with the running sum
 * of counts[0..i] for the nb finite bounds, then le="+Inf" (every count,
 * counts[nb] being those above the last bound), name_sum{labels} sum (the
 * text given) and name_count{labels}. counts are per bucket, not
 * cumulative. */
void kolo_metrics_text_histogram(struct kolo_metrics_text *t, const char *name, const char *labels,
                                 const char *const *le, size_t nb, const uint64_t *counts,
                                 const char *sum);
/* Writes k1="v1",k2="v2",... for the NULL-terminated key, value pairs into
 * out, each value escaped (\\, \", \n). false when out is too small (then
 * out holds ""). */
bool kolo_metrics_labels(char *out, size_t size, ...);
/* Fixed-point text of value / 10^digits, exact, trailing zeros dropped
 * ("1.5" for 1500000 and 6, "2" for 2000), into out (≥ 32 bytes). */
const char *kolo_metrics_fixed(char *out, size_t size, uint64_t value, int digits);

/* The bounds of the histograms, for tests and docs: latency le[i] = 2^i µs
 * (i < KOLO_METRICS_LAT_BUCKETS); phases le[i] = 2^i ms; tensors per batch
 * le[i] = 2^i; fill ratio le[i] = 2^(i - 10). */
#define KOLO_METRICS_LAT_BUCKETS    25 /* 1 µs .. 16.8 s */
#define KOLO_METRICS_PHASE_BUCKETS  18 /* 1 ms .. 131 s */
#define KOLO_METRICS_TENSOR_BUCKETS 11 /* 1 .. 1024 */
#define KOLO_METRICS_FILL_BUCKETS   11 /* 1/1024 .. 1 */
/* The latency bucket of ns: the least i with ns <= 2^i µs, or
 * KOLO_METRICS_LAT_BUCKETS when above them all. */
unsigned kolo_metrics_lat_bucket(uint64_t ns);

#endif /* KOLO_METRICS_H */
