/* metrics: the per-process state behind the hooks of metrics.h, and its
 * rendering into the Prometheus text (the writer is metrics_text.c). Every
 * hot-path update is a relaxed atomic addition: counters need no order
 * among themselves, and a scrape that sees one before another only reads
 * a value that a moment later would have been right. */
#include "metrics.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "flight.h"

#define N_STATUS                       (0 KOLO_STATUS_MAP(STATUS_ONE_))
#define STATUS_ONE_(name, value, text) +1
/* A status outside the map (none is) would count under OK rather than be lost. */
#define SLOT(st) ((unsigned)(st) < N_STATUS ? (unsigned)(st) : 0u)

typedef _Atomic uint64_t counter_t;

static const char *const coll_names[KOLO_MCOLL_COUNT] = {
        [KOLO_MCOLL_ALLREDUCE] = "allreduce", [KOLO_MCOLL_ALLGATHER] = "allgather",
        [KOLO_MCOLL_BROADCAST] = "broadcast", [KOLO_MCOLL_REDUCESCATTER] = "reducescatter",
        [KOLO_MCOLL_ALLTOALL] = "alltoall",   [KOLO_MCOLL_BARRIER] = "barrier",
};
static const char *const mode_names[KOLO_MMODE_COUNT] = {"blocking", "async"};
static const char *const size_names[KOLO_MSIZE_COUNT] = {"small", "medium", "large"};
static const char *const phase_names[KOLO_MPHASE_COUNT] = {"detect", "teardown", "round", "connect",
                                                           "sync"};
static const char *const transport_names[KOLO_MTRANSPORT_COUNT] = {"tcp", "shm"};

struct lat_hist {
	counter_t b[KOLO_METRICS_LAT_BUCKETS + 1];
	counter_t sum_ns;
};

struct phase_hist {
	counter_t b[KOLO_METRICS_PHASE_BUCKETS + 1];
	counter_t sum_ns;
};

static struct {
	counter_t ops[KOLO_MCOLL_COUNT][KOLO_MMODE_COUNT];
	counter_t bytes[KOLO_MCOLL_COUNT][KOLO_MMODE_COUNT];
	counter_t fails[KOLO_MCOLL_COUNT][KOLO_MMODE_COUNT][N_STATUS];
	struct lat_hist lat[KOLO_MCOLL_COUNT][KOLO_MSIZE_COUNT];
	counter_t batches, batch_bytes;
	counter_t tensors_b[KOLO_METRICS_TENSOR_BUCKETS + 1], tensors_sum;
	counter_t fill_b[KOLO_METRICS_FILL_BUCKETS + 1], fill_sum_ppm;
	counter_t cycles, cache_hits, stall_warnings;
	counter_t transport_errors[KOLO_MTRANSPORT_COUNT][N_STATUS];
	counter_t reforms[2]; /* [at_commit] */
	struct phase_hist phase[KOLO_MPHASE_COUNT];
	/* elastic bookkeeping: when the last operation completed; the detect
	 * time of a failure not yet followed by a re-form (0: none); when the
	 * last re-form connected, until its sync (0: none pending). */
	counter_t last_ok_ns, detect_ns, connected_ns;
} m;

static atomic_bool m_on;
static _Atomic int64_t g_rank = -1, g_size = -1, g_local_rank = -1, g_round = -1;
static pthread_mutex_t id_lock = PTHREAD_MUTEX_INITIALIZER;
static char id_job[256], id_host[256];

static inline void add(counter_t *c, uint64_t v)
{
	atomic_fetch_add_explicit(c, v, memory_order_relaxed);
}

static inline uint64_t get(counter_t *c)
{
	return atomic_load_explicit(c, memory_order_relaxed);
}

/* The least i with v <= 2^i (v >= 1), capped at cap. */
static unsigned log2_ceil(uint64_t v, unsigned cap)
{
	if (v <= 1)
		return 0;
	unsigned i = 64u - (unsigned)__builtin_clzll(v - 1);
	return i < cap ? i : cap;
}

unsigned kolo_metrics_lat_bucket(uint64_t ns)
{
	return log2_ceil((ns + 999) / 1000, KOLO_METRICS_LAT_BUCKETS);
}

static unsigned phase_bucket(uint64_t ns)
{
	return log2_ceil((ns + 999999) / 1000000, KOLO_METRICS_PHASE_BUCKETS);
}

enum kolo_metrics_size kolo_metrics_size_class(uint64_t bytes)
{
	return bytes < KOLO_METRICS_SMALL_BYTES    ? KOLO_MSIZE_SMALL
	       : bytes < KOLO_METRICS_MEDIUM_BYTES ? KOLO_MSIZE_MEDIUM
	                                           : KOLO_MSIZE_LARGE;
}

void kolo_metrics_enable(void)
{
	atomic_store(&m_on, true);
}

bool kolo_metrics_enabled(void)
{
	return atomic_load_explicit(&m_on, memory_order_relaxed);
}

/* ---- hooks ----------------------------------------------------------------- */

uint64_t kolo_metrics_start(void)
{
	return kolo_metrics_enabled() ? kolo_now_ns() : 0;
}

/* Counts one operation, and its duration ns when timed. */
static void coll_count(enum kolo_metrics_coll c, enum kolo_metrics_mode md, uint64_t bytes,
                       bool timed, uint64_t ns, kolo_status_t st)
{
	if ((unsigned)c >= KOLO_MCOLL_COUNT || (unsigned)md >= KOLO_MMODE_COUNT)
		return;
	if (st != KOLO_OK) {
		add(&m.fails[c][md][SLOT(st)], 1);
		return;
	}
	add(&m.ops[c][md], 1);
	add(&m.bytes[c][md], bytes);
	if (!timed)
		return;
	struct lat_hist *h = &m.lat[c][kolo_metrics_size_class(bytes)];
	add(&h->b[kolo_metrics_lat_bucket(ns)], 1);
	add(&h->sum_ns, ns);
}

void kolo_metrics_coll_observe(enum kolo_metrics_coll c, enum kolo_metrics_mode md, uint64_t bytes,
                               uint64_t ns, kolo_status_t st)
{
	if (kolo_metrics_enabled())
		coll_count(c, md, bytes, true, ns, st);
}

void kolo_metrics_coll_done(enum kolo_metrics_coll c, enum kolo_metrics_mode md, uint64_t bytes,
                            uint64_t start_ns, kolo_status_t st)
{
	if (!kolo_metrics_enabled())
		return;
	if (!start_ns) {
		coll_count(c, md, bytes, false, 0, st);
		return;
	}
	uint64_t now = kolo_now_ns();
	coll_count(c, md, bytes, true, now > start_ns ? now - start_ns : 0, st);
	if (st == KOLO_OK)
		atomic_store_explicit(&m.last_ok_ns, now, memory_order_relaxed);
}

void kolo_metrics_fusion_batch(size_t tensors, uint64_t bytes, uint64_t packed, uint64_t threshold)
{
	if (!kolo_metrics_enabled())
		return;
	add(&m.batches, 1);
	add(&m.batch_bytes, bytes);
	add(&m.tensors_b[log2_ceil(tensors, KOLO_METRICS_TENSOR_BUCKETS)], 1);
	add(&m.tensors_sum, tensors);
	if (!threshold)
		return;
	/* Bucket i holds the ratios up to 2^(i-10); powers of two compare exactly. */
	double r = (double)packed / (double)threshold;
	unsigned i = 0;
	while (i < KOLO_METRICS_FILL_BUCKETS && r > (double)(1u << i) / 1024.0)
		i++;
	add(&m.fill_b[i], 1);
	add(&m.fill_sum_ppm, (uint64_t)(r * 1e6 + 0.5));
}

void kolo_metrics_fusion_cycle(uint64_t cache_hits)
{
	if (!kolo_metrics_enabled())
		return;
	add(&m.cycles, 1);
	add(&m.cache_hits, cache_hits);
}

void kolo_metrics_fusion_stall(void)
{
	if (kolo_metrics_enabled())
		add(&m.stall_warnings, 1);
}

void kolo_metrics_transport_error(enum kolo_metrics_transport t, kolo_status_t st)
{
	if (kolo_metrics_enabled() && (unsigned)t < KOLO_MTRANSPORT_COUNT)
		add(&m.transport_errors[t][SLOT(st)], 1);
}

static void phase_observe(enum kolo_metrics_phase p, uint64_t ns)
{
	add(&m.phase[p].b[phase_bucket(ns)], 1);
	add(&m.phase[p].sum_ns, ns);
}

void kolo_metrics_failure_seen(void)
{
	if (!kolo_metrics_enabled())
		return;
	uint64_t last = get(&m.last_ok_ns), now = kolo_now_ns();
	uint64_t d = last && now > last ? now - last : 1; /* 0 means "none" */
	uint64_t none = 0;
	atomic_compare_exchange_strong_explicit(&m.detect_ns, &none, d, memory_order_relaxed,
	                                        memory_order_relaxed);
}

void kolo_metrics_reform_done(const uint64_t ns[4], bool at_commit)
{
	if (!kolo_metrics_enabled())
		return;
	add(&m.reforms[at_commit ? 1 : 0], 1);
	uint64_t d = atomic_exchange_explicit(&m.detect_ns, 0, memory_order_relaxed);
	if (d && !at_commit)
		phase_observe(KOLO_MPHASE_DETECT, d);
	for (int p = 0; p < 3; p++)
		if (ns[p + 1] >= ns[p])
			phase_observe((enum kolo_metrics_phase)(KOLO_MPHASE_TEARDOWN + p),
			              ns[p + 1] - ns[p]);
	atomic_store_explicit(&m.connected_ns, ns[3] ? ns[3] : 1, memory_order_relaxed);
}

void kolo_metrics_sync_done(void)
{
	if (!kolo_metrics_enabled())
		return;
	uint64_t c = atomic_exchange_explicit(&m.connected_ns, 0, memory_order_relaxed);
	uint64_t now = kolo_now_ns();
	if (c)
		phase_observe(KOLO_MPHASE_SYNC, now > c ? now - c : 0);
}

void kolo_metrics_set_assignment(int rank, int size, int local_rank, int64_t round)
{
	atomic_store(&g_rank, rank);
	atomic_store(&g_size, size);
	atomic_store(&g_local_rank, local_rank);
	atomic_store(&g_round, round);
}

void kolo_metrics_set_identity(const char *job, const char *host)
{
	pthread_mutex_lock(&id_lock);
	snprintf(id_job, sizeof(id_job), "%s", job ? job : "");
	snprintf(id_host, sizeof(id_host), "%s", host ? host : "");
	pthread_mutex_unlock(&id_lock);
}

/* ---- rendering --------------------------------------------------------- */

/* le text of the latency (base 1 µs) and phase (base 1 ms) buckets:
 * seconds, exact (each bound is a whole number of µs). */
static void le_seconds(char (*le)[24], const char **lep, size_t nb, uint64_t base_us)
{
	for (size_t i = 0; i < nb; i++)
		lep[i] = kolo_metrics_fixed(le[i], sizeof(le[i]), base_us << i, 6);
}

static void render_info(struct kolo_metrics_text *t)
{
	char labels[1024], rank[24];
	snprintf(rank, sizeof(rank), "%" PRId64, atomic_load(&g_rank));
	pthread_mutex_lock(&id_lock);
	if (!kolo_metrics_labels(labels, sizeof(labels), "version", KOLO_VERSION_STRING, "job",
	                         id_job, "host", id_host, "rank", rank, (const char *)NULL))
		kolo_metrics_labels(labels, sizeof(labels), "version", KOLO_VERSION_STRING,
		                    (const char *)NULL);
	pthread_mutex_unlock(&id_lock);
	kolo_metrics_text_family(t, "kolo_info", "gauge",
	                         "Always 1; the labels say which kolo, job, host and rank this "
	                         "process is.");
	kolo_metrics_text_sample(t, "kolo_info", labels, 1);
	static const struct {
		const char *name, *help;
		_Atomic int64_t *v;
	} gauges[] = {
	        {"kolo_rank", "This process's rank in the current round.", &g_rank},
	        {"kolo_size", "Ranks in the current round.", &g_size},
	        {"kolo_local_rank", "This process's rank among those of its host.", &g_local_rank},
	        {"kolo_round", "The current round (membership generation).", &g_round},
	};
	for (size_t i = 0; i < KOLO_ARRAY_SIZE(gauges); i++) {
		kolo_metrics_text_family(t, gauges[i].name, "gauge", gauges[i].help);
		int64_t v = atomic_load(gauges[i].v);
		if (v >= 0)
			kolo_metrics_text_sample(t, gauges[i].name, "", (uint64_t)v);
	}
}

static const char *code_name(unsigned s)
{
	return kolo_status_name((kolo_status_t)s) + 5; /* past "KOLO_" */
}

static void render_collectives(struct kolo_metrics_text *t)
{
	char labels[256], sum[32];
	kolo_metrics_text_family(t, "kolo_collective_ops_total", "counter",
	                         "Collective operations completed successfully.");
	for (int c = 0; c < KOLO_MCOLL_COUNT; c++)
		for (int md = 0; md < KOLO_MMODE_COUNT; md++) {
			kolo_metrics_labels(labels, sizeof(labels), "collective", coll_names[c],
			                    "mode", mode_names[md], (const char *)NULL);
			kolo_metrics_text_sample(t, "kolo_collective_ops_total", labels,
			                         get(&m.ops[c][md]));
		}
	kolo_metrics_text_family(t, "kolo_collective_bytes_total", "counter",
	                         "Bytes of the collective operations completed successfully.");
	for (int c = 0; c < KOLO_MCOLL_COUNT; c++)
		for (int md = 0; md < KOLO_MMODE_COUNT; md++) {
			kolo_metrics_labels(labels, sizeof(labels), "collective", coll_names[c],
			                    "mode", mode_names[md], (const char *)NULL);
			kolo_metrics_text_sample(t, "kolo_collective_bytes_total", labels,
			                         get(&m.bytes[c][md]));
		}
	kolo_metrics_text_family(t, "kolo_collective_failures_total", "counter",
	                         "Collective operations that failed, by status code.");
	for (int c = 0; c < KOLO_MCOLL_COUNT; c++)
		for (int md = 0; md < KOLO_MMODE_COUNT; md++)
			for (unsigned s = 0; s < N_STATUS; s++) {
				uint64_t v = get(&m.fails[c][md][s]);
				if (!v)
					continue;
				kolo_metrics_labels(labels, sizeof(labels), "collective",
				                    coll_names[c], "mode", mode_names[md], "code",
				                    code_name(s), (const char *)NULL);
				kolo_metrics_text_sample(t, "kolo_collective_failures_total",
				                         labels, v);
			}
	char le[KOLO_METRICS_LAT_BUCKETS][24];
	const char *lep[KOLO_METRICS_LAT_BUCKETS];
	le_seconds(le, lep, KOLO_METRICS_LAT_BUCKETS, 1);
	kolo_metrics_text_family(t, "kolo_collective_duration_seconds", "histogram",
	                         "Time of successful collective operations (blocking: the call; "
	                         "async: enqueue to completion), by size class.");
	for (int c = 0; c < KOLO_MCOLL_COUNT; c++)
		for (int s = 0; s < KOLO_MSIZE_COUNT; s++) {
			struct lat_hist *h = &m.lat[c][s];
			uint64_t counts[KOLO_METRICS_LAT_BUCKETS + 1], n = 0;
			for (int i = 0; i <= KOLO_METRICS_LAT_BUCKETS; i++)
				n += counts[i] = get(&h->b[i]);
			if (!n)
				continue;
			kolo_metrics_labels(labels, sizeof(labels), "collective", coll_names[c],
			                    "size_class", size_names[s], (const char *)NULL);
			kolo_metrics_text_histogram(
			        t, "kolo_collective_duration_seconds", labels, lep,
			        KOLO_METRICS_LAT_BUCKETS, counts,
			        kolo_metrics_fixed(sum, sizeof(sum), get(&h->sum_ns), 9));
		}
}

static void render_fusion(struct kolo_metrics_text *t)
{
	char sum[32];
	static const struct {
		const char *name, *help;
		counter_t *v;
	} counters[] = {
	        {"kolo_fusion_batches_total", "Allreduce batches the fusion engine ran.",
	         &m.batches},
	        {"kolo_fusion_batch_bytes_total", "Bytes of the allreduce batches.",
	         &m.batch_bytes},
	        {"kolo_fusion_cycles_total", "Negotiation cycles decided.", &m.cycles},
	        {"kolo_fusion_cache_hits_total",
	         "Operations the negotiation served from the response cache.", &m.cache_hits},
	        {"kolo_fusion_stall_warnings_total",
	         "Stall warnings: operations some ranks enqueued and others did not (rank 0).",
	         &m.stall_warnings},
	};
	for (size_t i = 0; i < KOLO_ARRAY_SIZE(counters); i++) {
		kolo_metrics_text_family(t, counters[i].name, "counter", counters[i].help);
		kolo_metrics_text_sample(t, counters[i].name, "", get(counters[i].v));
	}
	char le[KOLO_METRICS_TENSOR_BUCKETS][24];
	const char *lep[KOLO_METRICS_TENSOR_BUCKETS];
	uint64_t counts[KOLO_METRICS_TENSOR_BUCKETS + 1];
	for (int i = 0; i < KOLO_METRICS_TENSOR_BUCKETS; i++) {
		snprintf(le[i], sizeof(le[i]), "%d", 1 << i);
		lep[i] = le[i];
	}
	for (int i = 0; i <= KOLO_METRICS_TENSOR_BUCKETS; i++)
		counts[i] = get(&m.tensors_b[i]);
	snprintf(sum, sizeof(sum), "%" PRIu64, get(&m.tensors_sum));
	kolo_metrics_text_family(t, "kolo_fusion_batch_tensors", "histogram",
	                         "Tensors per allreduce batch.");
	kolo_metrics_text_histogram(t, "kolo_fusion_batch_tensors", "", lep,
	                            KOLO_METRICS_TENSOR_BUCKETS, counts, sum);
	char fle[KOLO_METRICS_FILL_BUCKETS][24];
	const char *flep[KOLO_METRICS_FILL_BUCKETS];
	uint64_t fcounts[KOLO_METRICS_FILL_BUCKETS + 1];
	for (int i = 0; i < KOLO_METRICS_FILL_BUCKETS; i++)
		flep[i] = kolo_metrics_fixed(fle[i], sizeof(fle[i]),
		                             10000000000ull >> (KOLO_METRICS_FILL_BUCKETS - 1 - i),
		                             10);
	for (int i = 0; i <= KOLO_METRICS_FILL_BUCKETS; i++)
		fcounts[i] = get(&m.fill_b[i]);
	kolo_metrics_text_family(t, "kolo_fusion_batch_fill_ratio", "histogram",
	                         "Bytes of an allreduce batch over the fusion buffer's size "
	                         "(above 1: a batch too large for the buffer).");
	kolo_metrics_text_histogram(t, "kolo_fusion_batch_fill_ratio", "", flep,
	                            KOLO_METRICS_FILL_BUCKETS, fcounts,
	                            kolo_metrics_fixed(sum, sizeof(sum), get(&m.fill_sum_ppm), 6));
}

static void render_elastic(struct kolo_metrics_text *t)
{
	char labels[128], sum[32];
	kolo_metrics_text_family(t, "kolo_elastic_reforms_total", "counter",
	                         "Re-forms of the comm into a new round, by cause.");
	static const char *const causes[2] = {"failure", "commit"};
	for (int i = 0; i < 2; i++) {
		kolo_metrics_labels(labels, sizeof(labels), "cause", causes[i], (const char *)NULL);
		kolo_metrics_text_sample(t, "kolo_elastic_reforms_total", labels,
		                         get(&m.reforms[i]));
	}
	char le[KOLO_METRICS_PHASE_BUCKETS][24];
	const char *lep[KOLO_METRICS_PHASE_BUCKETS];
	le_seconds(le, lep, KOLO_METRICS_PHASE_BUCKETS, 1000);
	kolo_metrics_text_family(t, "kolo_elastic_reform_phase_seconds", "histogram",
	                         "Duration of each phase of a re-form.");
	for (int p = 0; p < KOLO_MPHASE_COUNT; p++) {
		uint64_t counts[KOLO_METRICS_PHASE_BUCKETS + 1], n = 0;
		for (int i = 0; i <= KOLO_METRICS_PHASE_BUCKETS; i++)
			n += counts[i] = get(&m.phase[p].b[i]);
		if (!n)
			continue;
		kolo_metrics_labels(labels, sizeof(labels), "phase", phase_names[p],
		                    (const char *)NULL);
		kolo_metrics_text_histogram(
		        t, "kolo_elastic_reform_phase_seconds", labels, lep,
		        KOLO_METRICS_PHASE_BUCKETS, counts,
		        kolo_metrics_fixed(sum, sizeof(sum), get(&m.phase[p].sum_ns), 9));
	}
	kolo_metrics_text_family(t, "kolo_transport_errors_total", "counter",
	                         "Data-plane connections that failed, by transport and status "
	                         "code.");
	for (int tr = 0; tr < KOLO_MTRANSPORT_COUNT; tr++)
		for (unsigned s = 0; s < N_STATUS; s++) {
			uint64_t v = get(&m.transport_errors[tr][s]);
			if (!v)
				continue;
			kolo_metrics_labels(labels, sizeof(labels), "transport",
			                    transport_names[tr], "code", code_name(s),
			                    (const char *)NULL);
			kolo_metrics_text_sample(t, "kolo_transport_errors_total", labels, v);
		}
}

kolo_status_t kolo_metrics_render(char **out, size_t *len)
{
	struct kolo_metrics_text t = {0};
	render_info(&t);
	render_collectives(&t);
	render_fusion(&t);
	render_elastic(&t);
	kolo_flight_metrics(&t);
	if (t.oom || !t.b) {
		free(t.b);
		return KOLO_ENOMEM;
	}
	*out = t.b;
	*len = t.len;
	return KOLO_OK;
}
