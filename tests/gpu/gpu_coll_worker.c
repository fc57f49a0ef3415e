/* A worker of the device data-path tests: `kolorun -np N -- gpu_coll_worker
 * MODE [TIMELINE]`, over the fake CUDA runtime (LD_LIBRARY_PATH, label cuda)
 * or a real GPU (label gpu). Uses the public API only, with buffers from its
 * own dlopen of libcudart (not kolo's), read back with cudaMemcpy, and every
 * result checked against a float64 reference computed here. Exits 0 when
 * every check passed, 77 (skipped) where no device is visible.
 *
 * MODE all: every collective, blocking and async, on device buffers; mixed
 * host/device buffers; scaled and average; the stream ordering (a host
 * function holding the caller's stream before the copy of the real input:
 * kolo must wait for it); many small device tensors fused (the timeline).
 * MODE kill: the last rank SIGKILLs itself while the others are inside
 * device collectives; they must fail (not hang) and say so ("survivor").
 * MODE timeout: the caller's stream stuck past KOLO_TIMEOUT_MS gives
 * KOLO_ETIMEDOUT, and the comm works once it moves on. */
#include <dlfcn.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kolo/async.h"
#include "kolo/kolo.h"

static int failures;
static int rank_, size_;

#define CHECK(cond, ...)                                                                           \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			fprintf(stderr, "gpu_coll_worker: rank %d: line %d: ", rank_, __LINE__);   \
			fprintf(stderr, __VA_ARGS__);                                              \
			fprintf(stderr, "\n");                                                     \
			failures++;                                                                \
		}                                                                                  \
	} while (0)

/* The runtime entry points the test uses (int: cudaError_t; 4 is
 * cudaMemcpyDefault). */
static int (*cuda_get_device_count)(int *);
static int (*cuda_malloc)(void **, size_t);
static int (*cuda_free)(void *);
static int (*cuda_memcpy)(void *, const void *, size_t, int);
static int (*cuda_memcpy_async)(void *, const void *, size_t, int, void *);
static int (*cuda_stream_create)(void **);
static int (*cuda_stream_destroy)(void *);
static int (*cuda_stream_synchronize)(void *);
static int (*cuda_launch_host_func)(void *, void (*)(void *), void *);
static int (*cuda_device_synchronize)(void);
static int (*cuda_set_device)(int);
static int (*cuda_get_device)(int *);
/* GPU_COLL_SPREAD: this rank's buffers on device (rank mod GPUs), its calls
 * made with the next device current; otherwise both 0. */
static int device_ = 0, call_device_ = 0;

static void *resolve(void *h, const char *name)
{
	void *p = dlsym(h, name);
	if (!p) {
		fprintf(stderr, "gpu_coll_worker: libcudart lacks %s\n", name);
		exit(1);
	}
	return p;
}

#define RESOLVE(var, name)                                                                         \
	do {                                                                                       \
		void *p_ = resolve(h, name);                                                       \
		memcpy(&var, &p_, sizeof(p_));                                                     \
	} while (0)

static int load_cudart(void)
{
	void *h = dlopen("libcudart.so.13", RTLD_NOW | RTLD_LOCAL);
	if (!h)
		h = dlopen("libcudart.so.12", RTLD_NOW | RTLD_LOCAL);
	if (!h)
		return -1;
	RESOLVE(cuda_get_device_count, "cudaGetDeviceCount");
	RESOLVE(cuda_malloc, "cudaMalloc");
	RESOLVE(cuda_free, "cudaFree");
	RESOLVE(cuda_memcpy, "cudaMemcpy");
	RESOLVE(cuda_memcpy_async, "cudaMemcpyAsync");
	RESOLVE(cuda_stream_create, "cudaStreamCreate");
	RESOLVE(cuda_stream_destroy, "cudaStreamDestroy");
	RESOLVE(cuda_stream_synchronize, "cudaStreamSynchronize");
	RESOLVE(cuda_launch_host_func, "cudaLaunchHostFunc");
	RESOLVE(cuda_device_synchronize, "cudaDeviceSynchronize");
	RESOLVE(cuda_set_device, "cudaSetDevice");
	RESOLVE(cuda_get_device, "cudaGetDevice");
	int n = 0;
	return cuda_get_device_count(&n) == 0 && n > 0 ? n : -1;
}

static void *dmalloc(size_t bytes)
{
	void *p = NULL;
	if (device_ != call_device_)
		cuda_set_device(device_);
	int e = cuda_malloc(&p, bytes ? bytes : 1);
	if (device_ != call_device_)
		cuda_set_device(call_device_);
	if (e != 0) {
		fprintf(stderr, "gpu_coll_worker: cudaMalloc(%zu) failed\n", bytes);
		exit(1);
	}
	return p;
}

static void to_dev(void *d, const void *h, size_t bytes)
{
	if (cuda_memcpy(d, h, bytes, 4) != 0)
		CHECK(0, "cudaMemcpy to the device failed");
}

static void from_dev(void *h, const void *d, size_t bytes)
{
	if (cuda_memcpy(h, d, bytes, 4) != 0)
		CHECK(0, "cudaMemcpy from the device failed");
}

/* Rank r's element i: small integers and halves, exact in float32 sums. */
static double val(int r, size_t i)
{
	return (double)((r + 1) * (int)(i % 13)) - 3.0 + 0.5 * (double)(r % 2);
}

static float *host_vals(int r, size_t n, size_t base)
{
	float *h = malloc((n ? n : 1) * sizeof(float));
	for (size_t i = 0; i < n; i++)
		h[i] = (float)val(r, base + i);
	return h;
}

/* A device buffer holding rank r's n values starting at element base. */
static float *dev_vals(int r, size_t n, size_t base)
{
	float *h = host_vals(r, n, base), *d = dmalloc(n * sizeof(float));
	to_dev(d, h, n * sizeof(float));
	free(h);
	return d;
}

static double sum_ref(size_t i)
{
	double s = 0;
	for (int r = 0; r < size_; r++)
		s += val(r, i);
	return s;
}

/* Compares n floats of device (or host) memory with want(i). */
static void expect(const char *what, const float *buf, bool device, size_t n,
                   double (*want)(size_t, void *), void *arg)
{
	float *h = malloc((n ? n : 1) * sizeof(float));
	if (device)
		from_dev(h, buf, n * sizeof(float));
	else
		memcpy(h, buf, n * sizeof(float));
	for (size_t i = 0; i < n; i++) {
		double w = want(i, arg);
		if (fabs((double)h[i] - w) > 1e-5 * (1 + fabs(w))) {
			CHECK(0, "%s[%zu] = %g, want %g", what, i, (double)h[i], w);
			break;
		}
	}
	free(h);
}

struct scale {
	double pre, post;
	size_t base;
};

static double want_sum(size_t i, void *arg)
{
	const struct scale *s = arg;
	return s->pre * sum_ref(s->base + i) * s->post;
}

/* kolo set the device of the buffers for its work; the caller's current
 * device must be what it was. */
static void same_device(const char *what)
{
	int cur = -1;
	CHECK(cuda_get_device(&cur) == 0 && cur == call_device_,
	      "%s: the calling thread's device is %d, want %d", what, cur, call_device_);
}

static void ok(kolo_comm_t *comm, kolo_status_t st, const char *what)
{
	CHECK(st == KOLO_OK, "%s: %s: %s", what, kolo_status_name(st), kolo_last_error(comm));
	same_device(what);
}

/* ---- blocking ------------------------------------------------------------ */

static void test_allreduce(kolo_comm_t *comm)
{
	/* Several chunks of KOLO_GPU_STAGE_CHUNK_BYTES (the test sets 64 KiB)
	 * and a tail. */
	size_t n = 100003, bytes = n * sizeof(float);
	float *s = dev_vals(rank_, n, 0), *r = dmalloc(bytes);
	struct scale one = {1, 1, 0};
	ok(comm, kolo_allreduce(comm, s, r, n, KOLO_FLOAT32, KOLO_SUM), "allreduce");
	expect("allreduce", r, true, n, want_sum, &one);
	ok(comm, kolo_allreduce(comm, s, s, n, KOLO_FLOAT32, KOLO_SUM), "allreduce in place");
	expect("allreduce in place", s, true, n, want_sum, &one);
	/* Scaled, and average (SUM / size), on the staging buffer. */
	cuda_free(s);
	s = dev_vals(rank_, n, 0);
	struct scale sc = {2.0, 0.25, 0};
	ok(comm, kolo_allreduce_scaled(comm, s, r, n, KOLO_FLOAT32, KOLO_SUM, 2.0, 0.25),
	   "allreduce scaled");
	expect("allreduce scaled", r, true, n, want_sum, &sc);
	struct scale avg = {1, 1.0 / size_, 0};
	ok(comm, kolo_allreduce(comm, s, r, n, KOLO_FLOAT32, KOLO_AVERAGE), "allreduce average");
	expect("allreduce average", r, true, n, want_sum, &avg);
	/* Mixed: host input into a device output, and back. */
	float *h = host_vals(rank_, n, 0), *hr = malloc(bytes);
	ok(comm, kolo_allreduce(comm, h, r, n, KOLO_FLOAT32, KOLO_SUM), "allreduce host->device");
	expect("allreduce host->device", r, true, n, want_sum, &one);
	ok(comm, kolo_allreduce(comm, s, hr, n, KOLO_FLOAT32, KOLO_SUM), "allreduce device->host");
	expect("allreduce device->host", hr, false, n, want_sum, &one);
	/* float64 and int32, a few elements (one chunk). */
	double dv[5], dw[5];
	for (int i = 0; i < 5; i++)
		dv[i] = val(rank_, (size_t)i) / 3.0;
	double *dd = dmalloc(sizeof(dv));
	to_dev(dd, dv, sizeof(dv));
	ok(comm, kolo_allreduce(comm, dd, dd, 5, KOLO_FLOAT64, KOLO_MAX), "allreduce max f64");
	from_dev(dw, dd, sizeof(dw));
	for (int i = 0; i < 5; i++) {
		double m = -INFINITY;
		for (int q = 0; q < size_; q++)
			m = fmax(m, val(q, (size_t)i) / 3.0);
		CHECK(dw[i] == m, "max f64[%d] = %g, want %g", i, dw[i], m);
	}
	cuda_free(dd);
	free(h);
	free(hr);
	cuda_free(s);
	cuda_free(r);
}

struct gather {
	const size_t *counts;
	size_t base; /* element offset of each rank's values */
};

/* allgatherv's element i: which rank's block, and where in it. */
static double want_gatherv(size_t i, void *arg)
{
	const struct gather *g = arg;
	size_t off = 0;
	for (int q = 0; q < size_; q++) {
		if (i < off + g->counts[q])
			return val(q, g->base + i - off);
		off += g->counts[q];
	}
	return NAN;
}

static void test_gather_bcast(kolo_comm_t *comm)
{
	/* Sizes over several 64 KiB chunks: the staged allgather runs in rounds. */
	size_t n = 40001, counts[16];
	for (int q = 0; q < size_; q++)
		counts[q] = n;
	float *s = dev_vals(rank_, n, 0), *r = dmalloc(n * (size_t)size_ * sizeof(float));
	struct gather g = {counts, 0};
	ok(comm, kolo_allgather(comm, s, r, n, KOLO_FLOAT32), "allgather");
	expect("allgather", r, true, n * (size_t)size_, want_gatherv, &g);
	float *hr = malloc(n * (size_t)size_ * sizeof(float));
	ok(comm, kolo_allgather(comm, s, hr, n, KOLO_FLOAT32), "allgather device->host");
	expect("allgather device->host", hr, false, n * (size_t)size_, want_gatherv, &g);
	free(hr);
	/* Uneven counts, one empty; host input, device output. */
	size_t vc[16], tot = 0;
	for (int q = 0; q < size_; q++)
		tot += vc[q] = (size_t)(q == 1 ? 0 : 20000 + 3001 * q);
	float *hs = host_vals(rank_, vc[rank_], 0), *rv = dmalloc(tot * sizeof(float));
	struct gather gv = {vc, 0};
	ok(comm, kolo_allgatherv(comm, hs, vc[rank_], rv, vc, KOLO_FLOAT32), "allgatherv");
	expect("allgatherv", rv, true, tot, want_gatherv, &gv);
	free(hs);
	cuda_free(rv);
	/* Broadcast from the last rank, several chunks. */
	size_t bn = 40000;
	float *b = rank_ == size_ - 1 ? dev_vals(rank_, bn, 0) : dev_vals(rank_ + 100, bn, 0);
	ok(comm, kolo_broadcast(comm, b, bn, KOLO_FLOAT32, size_ - 1), "broadcast");
	float *hb = malloc(bn * sizeof(float));
	from_dev(hb, b, bn * sizeof(float));
	for (size_t i = 0; i < bn; i++)
		if ((double)hb[i] != val(size_ - 1, i)) {
			CHECK(0, "broadcast[%zu] = %g, want %g", i, (double)hb[i],
			      val(size_ - 1, i));
			break;
		}
	free(hb);
	cuda_free(b);
	cuda_free(s);
	cuda_free(r);
}

static double want_rs(size_t i, void *arg)
{
	const size_t *base = arg;
	return sum_ref(*base + i);
}

/* alltoall: what this rank receives from rank q at element j of q's block
 * for this rank: q's values starting at (this rank's) offset in q's send. */
static void test_rs_alltoall(kolo_comm_t *comm)
{
	/* Blocks over several 64 KiB chunks: the staged reducescatter runs in
	 * rounds; device, host into device, device into host. */
	size_t n = 100003;
	float *s = dev_vals(rank_, n, 0), *hs = host_vals(rank_, n, 0);
	size_t mine = kolo_reducescatter_count(n, size_, rank_), base = 0;
	for (int q = 0; q < rank_; q++)
		base += kolo_reducescatter_count(n, size_, q);
	float *r = dmalloc(mine * sizeof(float)), *hr = malloc(mine * sizeof(float));
	ok(comm, kolo_reducescatter(comm, s, r, n, KOLO_FLOAT32, KOLO_SUM), "reducescatter");
	expect("reducescatter", r, true, mine, want_rs, &base);
	ok(comm, kolo_reducescatter(comm, hs, r, n, KOLO_FLOAT32, KOLO_SUM),
	   "reducescatter host->device");
	expect("reducescatter host->device", r, true, mine, want_rs, &base);
	ok(comm, kolo_reducescatter(comm, s, hr, n, KOLO_FLOAT32, KOLO_SUM),
	   "reducescatter device->host");
	expect("reducescatter device->host", hr, false, mine, want_rs, &base);
	free(hr);
	free(hs);
	cuda_free(r);
	cuda_free(s);

	/* alltoall: rank q sends block j = q's values [j * c, (j + 1) * c). */
	size_t c = 777, all = c * (size_t)size_;
	float *as = dev_vals(rank_, all, 0), *ar = dmalloc(all * sizeof(float));
	ok(comm, kolo_alltoall(comm, as, ar, c, KOLO_FLOAT32), "alltoall");
	float *h = malloc(all * sizeof(float));
	from_dev(h, ar, all * sizeof(float));
	for (int q = 0; q < size_; q++)
		for (size_t j = 0; j < c; j++) {
			double w = val(q, (size_t)rank_ * c + j);
			if ((double)h[(size_t)q * c + j] != w) {
				CHECK(0, "alltoall from %d [%zu] = %g, want %g", q, j,
				      (double)h[(size_t)q * c + j], w);
				q = size_;
				break;
			}
		}
	free(h);
	/* alltoallv: rank q sends (q + j + 1) * 10 elements to rank j. */
	size_t sc[16], rc[16], st = 0, rt = 0;
	for (int j = 0; j < size_; j++) {
		st += sc[j] = (size_t)(rank_ + j + 1) * 10;
		rt += rc[j] = (size_t)(j + rank_ + 1) * 10;
	}
	float *vs = dev_vals(rank_, st, 0), *vr = dmalloc(rt * sizeof(float));
	ok(comm, kolo_alltoallv(comm, vs, sc, vr, rc, KOLO_FLOAT32), "alltoallv");
	h = malloc(rt * sizeof(float));
	from_dev(h, vr, rt * sizeof(float));
	size_t off = 0;
	for (int q = 0; q < size_; q++) {
		size_t soff = 0; /* where q's block for this rank starts in q's send */
		for (int j = 0; j < rank_; j++)
			soff += (size_t)(q + j + 1) * 10;
		for (size_t j = 0; j < rc[q]; j++)
			if ((double)h[off + j] != val(q, soff + j)) {
				CHECK(0, "alltoallv from %d [%zu] = %g, want %g", q, j,
				      (double)h[off + j], val(q, soff + j));
				break;
			}
		off += rc[q];
	}
	free(h);
	cuda_free(vs);
	cuda_free(vr);
	cuda_free(as);
	cuda_free(ar);
}

/* ---- the stream ordering ------------------------------------------------- */

/* Holds the caller's stream for *arg ms (150 when NULL): what a long kernel
 * producing the input is. */
static void hold(void *arg)
{
	long ms = arg ? *(const long *)arg : 150;
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000 * 1000};
	nanosleep(&ts, NULL);
}

static void test_stream_order(kolo_comm_t *comm)
{
	size_t n = 50000, bytes = n * sizeof(float);
	float *d = dmalloc(bytes), *junk = host_vals(rank_ + 1000, n, 0);
	float *real = host_vals(rank_, n, 0);
	void *s = NULL;
	CHECK(cuda_stream_create(&s) == 0, "cudaStreamCreate");
	to_dev(d, junk, bytes);
	struct scale one = {1, 1, 0};
	for (int async = 0; async < 2; async++) {
		to_dev(d, junk, bytes);
		ok(comm, kolo_cuda_set_stream(s), "kolo_cuda_set_stream");
		CHECK(kolo_cuda_get_stream() == s, "kolo_cuda_get_stream");
		/* The real input arrives on s only after the host function: kolo,
		 * ordered after s, reduces it; kolo reading at once reduces junk. */
		CHECK(cuda_launch_host_func(s, hold, NULL) == 0, "cudaLaunchHostFunc");
		CHECK(cuda_memcpy_async(d, real, bytes, 4, s) == 0, "cudaMemcpyAsync");
		if (async) {
			kolo_handle_t *h = NULL;
			ok(comm,
			   kolo_allreduce_async(comm, "order", d, d, n, KOLO_FLOAT32, KOLO_SUM, 1,
			                        1, NULL, NULL, &h),
			   "allreduce_async after the stream");
			ok(comm, kolo_wait(h), "wait");
		} else {
			ok(comm, kolo_allreduce(comm, d, d, n, KOLO_FLOAT32, KOLO_SUM),
			   "allreduce after the stream");
		}
		ok(comm, kolo_cuda_set_stream(NULL), "kolo_cuda_set_stream(NULL)");
		expect(async ? "async after the stream" : "allreduce after the stream", d, true, n,
		       want_sum, &one);
	}
	cuda_stream_synchronize(s);
	cuda_stream_destroy(s);
	free(junk);
	free(real);
	cuda_free(d);
}

/* ---- async --------------------------------------------------------------- */

/* How many tensors named prefix* have a phase event in the timeline (Chrome
 * trace: each tensor is a pid, named by its process_name record). -1 when
 * the file cannot be read. */
static int tensors_with(const char *path, const char *prefix, const char *phase)
{
	json_error_t err;
	json_t *root = json_load_file(path, 0, &err);
	if (!json_is_array(root)) {
		json_decref(root);
		return -1;
	}
	enum { MAXPID = 4096 };
	static char named[MAXPID], hit[MAXPID];
	memset(named, 0, sizeof(named));
	memset(hit, 0, sizeof(hit));
	size_t i;
	json_t *ev;
	json_array_foreach(root, i, ev)
	{
		const char *name = json_string_value(json_object_get(ev, "name"));
		json_int_t pid = json_integer_value(json_object_get(ev, "pid"));
		if (!name || pid < 0 || pid >= MAXPID)
			continue;
		if (strcmp(name, "process_name") == 0) {
			const char *t = json_string_value(
			        json_object_get(json_object_get(ev, "args"), "name"));
			named[pid] = t && strncmp(t, prefix, strlen(prefix)) == 0;
		} else if (strcmp(name, phase) == 0) {
			hit[pid] = 1;
		}
	}
	json_decref(root);
	int n = 0;
	for (int p = 0; p < MAXPID; p++)
		n += named[p] && hit[p];
	return n;
}

static void test_async(kolo_comm_t *comm, const char *timeline)
{
	enum { NT = 12 };
	size_t n = 257;
	float *t[NT];
	kolo_handle_t *h[NT];
	char name[32];
	if (rank_ == 0 && timeline)
		ok(comm, kolo_timeline_start(comm, timeline), "timeline_start");
	/* Many small device tensors, enqueued together: one fused batch (or a
	 * few), packed into the device fusion buffer. */
	for (int k = 0; k < NT; k++) {
		t[k] = dev_vals(rank_, n, (size_t)k * n);
		snprintf(name, sizeof(name), "fuse.%d", k);
		ok(comm,
		   kolo_allreduce_async(comm, name, t[k], t[k], n, KOLO_FLOAT32, KOLO_AVERAGE, 1, 1,
		                        NULL, NULL, &h[k]),
		   "allreduce_async");
	}
	for (int k = 0; k < NT; k++) {
		ok(comm, kolo_wait(h[k]), "wait fuse");
		struct scale avg = {1, 1.0 / size_, (size_t)k * n};
		expect("fused average", t[k], true, n, want_sum, &avg);
		cuda_free(t[k]);
	}
	/* Grouped: one device and one host tensor. */
	float *ga = dev_vals(rank_, 100, 0), *gb = host_vals(rank_, 50, 100);
	const char *names[2] = {"grp.a", "grp.b"};
	const void *sb[2] = {ga, gb};
	void *rb[2] = {ga, gb};
	size_t gc[2] = {100, 50};
	kolo_handle_t *gh;
	ok(comm,
	   kolo_grouped_allreduce_async(comm, 2, names, sb, rb, gc, KOLO_FLOAT32, KOLO_SUM, 3.0,
	                                1.0, NULL, NULL, &gh),
	   "grouped");
	ok(comm, kolo_wait(gh), "wait grouped");
	struct scale g3 = {3.0, 1, 0}, g3b = {3.0, 1, 100};
	expect("grouped device", ga, true, 100, want_sum, &g3);
	expect("grouped host", gb, false, 50, want_sum, &g3b);
	cuda_free(ga);
	free(gb);

	/* allgather / alltoall allocate their output on the device. */
	size_t counts[16], rcounts[16];
	size_t an = (size_t)(100 + rank_);
	float *as = dev_vals(rank_, an, 0);
	void *out = NULL;
	kolo_handle_t *ah;
	ok(comm,
	   kolo_allgather_async(comm, "ag", as, an, KOLO_FLOAT32, &out, counts, NULL, NULL, &ah),
	   "allgather_async");
	ok(comm, kolo_wait(ah), "wait allgather");
	size_t tot = 0;
	for (int q = 0; q < size_; q++) {
		CHECK(counts[q] == (size_t)(100 + q), "allgather counts[%d] = %zu", q, counts[q]);
		tot += counts[q];
	}
	struct gather g = {counts, 0};
	expect("allgather_async (device output)", out, true, tot, want_gatherv, &g);
	kolo_free(out);
	cuda_free(as);

	size_t c = 33, all = c * (size_t)size_;
	float *ts = dev_vals(rank_, all, 0);
	out = NULL;
	ok(comm,
	   kolo_alltoall_async(comm, "a2a", ts, all, NULL, KOLO_FLOAT32, &out, rcounts, NULL, NULL,
	                       &ah),
	   "alltoall_async");
	ok(comm, kolo_wait(ah), "wait alltoall");
	float *hh = malloc(all * sizeof(float));
	from_dev(hh, out, all * sizeof(float));
	for (int q = 0; q < size_; q++) {
		CHECK(rcounts[q] == c, "alltoall rcounts[%d] = %zu", q, rcounts[q]);
		for (size_t j = 0; j < c; j++)
			if ((double)hh[(size_t)q * c + j] != val(q, (size_t)rank_ * c + j)) {
				CHECK(0, "alltoall_async from %d [%zu]", q, j);
				break;
			}
	}
	free(hh);
	kolo_free(out);
	cuda_free(ts);

	/* broadcast and reducescatter. */
	float *b = dev_vals(rank_ == 0 ? 0 : rank_ + 50, 999, 0);
	ok(comm, kolo_broadcast_async(comm, "bc", b, 999, KOLO_FLOAT32, 0, NULL, NULL, &ah),
	   "broadcast_async");
	ok(comm, kolo_wait(ah), "wait broadcast");
	hh = malloc(999 * sizeof(float));
	from_dev(hh, b, 999 * sizeof(float));
	for (size_t i = 0; i < 999; i++)
		if ((double)hh[i] != val(0, i)) {
			CHECK(0, "broadcast_async[%zu] = %g", i, (double)hh[i]);
			break;
		}
	free(hh);
	cuda_free(b);
	size_t rn = 1001, mine = kolo_reducescatter_count(rn, size_, rank_), base = 0;
	for (int q = 0; q < rank_; q++)
		base += kolo_reducescatter_count(rn, size_, q);
	float *rs = dev_vals(rank_, rn, 0), *rr = dmalloc(mine * sizeof(float));
	ok(comm,
	   kolo_reducescatter_async(comm, "rs", rs, rr, rn, KOLO_FLOAT32, KOLO_SUM, 1, 1, NULL,
	                            NULL, &ah),
	   "reducescatter_async");
	ok(comm, kolo_wait(ah), "wait reducescatter");
	expect("reducescatter_async", rr, true, mine, want_rs, &base);
	cuda_free(rs);
	cuda_free(rr);

	/* A blocking device collective now that the engine owns the ring: it
	 * runs on the engine thread (kolo_engine_run_exclusive), device set
	 * there and put back. */
	size_t bn = 70000;
	float *bd = dev_vals(rank_, bn, 0);
	ok(comm, kolo_allreduce(comm, bd, bd, bn, KOLO_FLOAT32, KOLO_SUM),
	   "allreduce through the engine");
	struct scale one = {1, 1, 0};
	expect("allreduce through the engine", bd, true, bn, want_sum, &one);
	cuda_free(bd);

	/* Rank 0 passes device memory, the others host memory, under one name:
	 * the ranks would take different paths, so every rank fails it with
	 * the mismatch named, and nothing hangs. */
	float *mm = rank_ == 0 ? dev_vals(0, 64, 0) : host_vals(rank_, 64, 0);
	ok(comm,
	   kolo_allreduce_async(comm, "mixed.kinds", mm, mm, 64, KOLO_FLOAT32, KOLO_SUM, 1, 1, NULL,
	                        NULL, &ah),
	   "allreduce_async mixed kinds");
	kolo_status_t mst = kolo_wait(ah);
	CHECK(mst == KOLO_EMISMATCH, "mixed kinds gave %s", kolo_status_name(mst));
	CHECK(strstr(kolo_last_error(comm), "mismatched memory for 'mixed.kinds'") &&
	              strstr(kolo_last_error(comm), "rank 0: device"),
	      "mixed kinds message '%s'", kolo_last_error(comm));
	if (rank_ == 0)
		cuda_free(mm);
	else
		free(mm);

	if (rank_ == 0 && timeline) {
		ok(comm, kolo_timeline_stop(comm), "timeline_stop");
		int in = tensors_with(timeline, "fuse.", "MEMCPY_IN_FUSION_BUFFER");
		int outn = tensors_with(timeline, "fuse.", "MEMCPY_OUT_FUSION_BUFFER");
		/* Every tensor packed into the device fusion buffer has its own
		 * copy-in and copy-out: most of them were fused (the first may have
		 * gone alone, in a cycle of its own). */
		CHECK(in >= NT / 2 && outn >= NT / 2,
		      "fusion: %d of %d tensors copied into and %d out of the device fusion buffer",
		      in, NT, outn);
		printf("gpu_coll_worker: %d of %d small device tensors went through the device "
		       "fusion buffer\n",
		       in, NT);
	}
}

/* ---- a stuck stream ------------------------------------------------------ */

static double ms_since(const struct timespec *t0)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)(t.tv_sec - t0->tv_sec) * 1e3 + (double)(t.tv_nsec - t0->tv_nsec) / 1e6;
}

/* The caller's stream stays blocked past KOLO_TIMEOUT_MS (the script sets
 * 500 ms; the hold is 2 s): the collective must fail with KOLO_ETIMEDOUT and
 * say why, on every rank (each waits for its own stream), and once the
 * stream has moved on the comm works again. */
static int run_timeout(kolo_comm_t *comm)
{
	size_t n = 5000;
	float *d = dev_vals(rank_, n, 0);
	void *s = NULL;
	static long ms = 2000;
	CHECK(cuda_stream_create(&s) == 0, "cudaStreamCreate");
	ok(comm, kolo_cuda_set_stream(s), "kolo_cuda_set_stream");
	CHECK(cuda_launch_host_func(s, hold, &ms) == 0, "cudaLaunchHostFunc");
	struct timespec t0;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	kolo_status_t st = kolo_allreduce(comm, d, d, n, KOLO_FLOAT32, KOLO_SUM);
	double took = ms_since(&t0);
	printf("gpu_coll_worker: rank %d: stuck stream: %s after %.0f ms: %s\n", rank_,
	       kolo_status_name(st), took, kolo_last_error(comm));
	CHECK(st == KOLO_ETIMEDOUT, "stuck stream: %s, want KOLO_ETIMEDOUT", kolo_status_name(st));
	CHECK(strstr(kolo_last_error(comm), "did not finish within") != NULL, "message: %s",
	      kolo_last_error(comm));
	CHECK(took < 1900, "the timeout took %.0f ms (the hold is 2000)", took);
	/* The stream moves on; the copies kolo had queued behind it then run
	 * (they still read the buffer), so the device is synchronised before
	 * the buffer is reused, as after any failed device collective. The
	 * next collective, on a fresh context, works. */
	CHECK(cuda_stream_synchronize(s) == 0, "cudaStreamSynchronize");
	CHECK(cuda_device_synchronize() == 0, "cudaDeviceSynchronize");
	float *h = host_vals(rank_, n, 0);
	to_dev(d, h, n * sizeof(float));
	free(h);
	ok(comm, kolo_allreduce(comm, d, d, n, KOLO_FLOAT32, KOLO_SUM), "allreduce after");
	struct scale one = {1, 1, 0};
	expect("allreduce after the timeout", d, true, n, want_sum, &one);
	ok(comm, kolo_cuda_set_stream(NULL), "kolo_cuda_set_stream(NULL)");
	cuda_stream_destroy(s);
	cuda_free(d);
	ok(comm, kolo_finalize(comm), "finalize");
	if (!failures)
		printf("gpu_coll_worker: rank %d of %d: every check passed\n", rank_, size_);
	return failures ? 1 : 0;
}

/* ---- kill ---------------------------------------------------------------- */

/* The last rank's killer: it dies while its main thread, like every other
 * rank, is inside a staged device allreduce. */
static void *killer(void *arg)
{
	(void)arg;
	struct timespec ts = {0, 30 * 1000 * 1000};
	nanosleep(&ts, NULL);
	raise(SIGKILL);
	return NULL;
}

static int run_kill(kolo_comm_t *comm)
{
	size_t n = 1 << 21;
	float *d = dev_vals(rank_, n, 0);
	/* kolorun stops the others (SIGTERM) as soon as one worker dies: what
	 * is checked is what the survivors' collectives return, so they stay
	 * until they have said it (SIGKILL after kolorun's grace still ends
	 * one that hung). */
	signal(SIGTERM, SIG_IGN);
	ok(comm, kolo_barrier(comm), "barrier");
	pthread_t t;
	if (rank_ == size_ - 1)
		pthread_create(&t, NULL, killer, NULL);
	struct timespec t0;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	/* Blocking device allreduces (many chunks each) until one fails: the
	 * peer dies inside one of them. */
	kolo_status_t b = KOLO_OK;
	int rounds = 0;
	for (; rounds < 10000 && b == KOLO_OK; rounds++)
		b = kolo_allreduce(comm, d, d, n, KOLO_FLOAT32, KOLO_MAX);
	double ms = ms_since(&t0);
	/* And an async one after it: it fails too, at once. */
	kolo_handle_t *h = NULL;
	kolo_status_t a = kolo_allreduce_async(comm, "doomed", d, d, n, KOLO_FLOAT32, KOLO_SUM, 1,
	                                       1, NULL, NULL, &h);
	if (a == KOLO_OK)
		a = kolo_wait(h);
	printf("survivor rank %d: async %s, blocking %s after %.0f ms (%d allreduces): %s\n", rank_,
	       kolo_status_name(a), kolo_status_name(b), ms, rounds, kolo_last_error(comm));
	fflush(stdout);
	CHECK(a != KOLO_OK && b != KOLO_OK, "collectives with a dead peer succeeded");
	cuda_free(d);
	kolo_finalize(comm);
	return failures ? 1 : 3; /* 3: failed as it must */
}

int main(int argc, char **argv)
{
	const char *mode = argc > 1 ? argv[1] : "all";
	const char *timeline = argc > 2 ? argv[2] : NULL;
	int ngpus = load_cudart();
	if (ngpus < 1) {
		printf("gpu_coll_worker: skipped: no libcudart or no CUDA device visible\n");
		return 77;
	}
	kolo_comm_t *comm;
	if (kolo_init(&comm) != KOLO_OK) {
		fprintf(stderr, "gpu_coll_worker: kolo_init: %s\n", kolo_init_error());
		return 1;
	}
	rank_ = kolo_rank(comm);
	size_ = kolo_size(comm);
	if (size_ > 16) {
		fprintf(stderr, "gpu_coll_worker: at most 16 ranks\n");
		return 1;
	}
	/* GPU_COLL_SPREAD: each rank's buffers on its own device where there are
	 * enough (rank mod GPUs), its calls made with another device current,
	 * so the staged path switches devices and must put the caller's back. */
	if (getenv("GPU_COLL_SPREAD")) {
		device_ = rank_ % ngpus;
		call_device_ = (rank_ + 1) % ngpus;
		CHECK(cuda_set_device(call_device_) == 0, "cudaSetDevice(%d)", call_device_);
	}
	if (strcmp(mode, "kill") == 0)
		return run_kill(comm);
	if (strcmp(mode, "timeout") == 0)
		return run_timeout(comm);
	test_allreduce(comm);
	test_gather_bcast(comm);
	test_rs_alltoall(comm);
	test_stream_order(comm);
	test_async(comm, timeline);
	ok(comm, kolo_barrier(comm), "barrier");
	cuda_device_synchronize();
	kolo_status_t st = kolo_finalize(comm);
	CHECK(st == KOLO_OK, "finalize: %s", kolo_status_name(st));
	if (!failures)
		printf("gpu_coll_worker: rank %d of %d: every check passed\n", rank_, size_);
	return failures ? 1 : 0;
}
