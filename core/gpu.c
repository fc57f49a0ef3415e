/* gpu: libcudart and libnccl resolved at run time into one table each
 * (gpu.h). Compiled with the toolkit's headers for the types and constants
 * only (KOLO_HAVE_CUDA, KOLO_HAVE_NCCL from CMake); nothing links either
 * library. Without the headers the same functions answer "built without
 * CUDA". */
#include "gpu.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sched.h>
#include <string.h>
#include <time.h>

#include "core.h"

#ifndef KOLO_HAVE_CUDA
#define KOLO_HAVE_CUDA 0
#endif
#ifndef KOLO_HAVE_NCCL
#define KOLO_HAVE_NCCL 0
#endif

#if KOLO_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif
#if KOLO_HAVE_NCCL
#include <nccl.h>
#endif

#define BUILT_WITHOUT "this libkolo was built without CUDA"

const char *kolo_mem_kind_name(enum kolo_mem_kind kind)
{
	switch (kind) {
	case KOLO_MEM_HOST:
		return "host";
	case KOLO_MEM_DEVICE:
		return "device";
	case KOLO_MEM_MANAGED:
		return "managed";
	case KOLO_MEM_UNKNOWN:
		break;
	}
	return "unknown";
}

bool kolo_cuda_built(void)
{
	return KOLO_HAVE_CUDA;
}

/* What the first call decided: until then UNSET; HOST_ONLY when no device
 * pointer can exist in this process, so kolo_mem_kind is one load and one
 * branch; PROBE when libcudart is loaded and a GPU is visible. */
enum { UNSET, HOST_ONLY, PROBE };
static atomic_int mem_state;
static pthread_once_t rt_once = PTHREAD_ONCE_INIT;
/* Written once by load_runtime, before mem_state is published. */
static const char *rt_why;

#if KOLO_HAVE_CUDA || KOLO_HAVE_NCCL
/* Copies the file name of the library that holds sym into path. */
static void lib_path(void *sym, char *path, size_t size)
{
	Dl_info di;
	if (sym && dladdr(sym, &di) && di.dli_fname)
		snprintf(path, size, "%s", di.dli_fname);
	else
		snprintf(path, size, "(unknown path)");
}
#endif

#if KOLO_HAVE_CUDA

/* Only what is used. */
struct cudart_api {
	cudaError_t (*get_device_count)(int *);
	cudaError_t (*driver_get_version)(int *);
	cudaError_t (*runtime_get_version)(int *);
	cudaError_t (*pointer_get_attributes)(struct cudaPointerAttributes *, const void *);
	const char *(*get_error_string)(cudaError_t);
	cudaError_t (*get_device_properties)(struct cudaDeviceProp *, int);
	cudaError_t (*device_get_attribute)(int *, enum cudaDeviceAttr, int);
	cudaError_t (*get_last_error)(void);
	/* The data path's (gpu.h); when one is missing, dp_missing names it and
	 * only the data path is off. */
	cudaError_t (*set_device)(int);
	cudaError_t (*get_device)(int *);
	cudaError_t (*malloc_)(void **, size_t);
	cudaError_t (*free_)(void *);
	cudaError_t (*malloc_host)(void **, size_t);
	cudaError_t (*free_host)(void *);
	cudaError_t (*memcpy_async)(void *, const void *, size_t, enum cudaMemcpyKind,
	                            cudaStream_t);
	cudaError_t (*memset_async)(void *, int, size_t, cudaStream_t);
	cudaError_t (*stream_create_with_flags)(cudaStream_t *, unsigned int);
	cudaError_t (*stream_destroy)(cudaStream_t);
	cudaError_t (*stream_query)(cudaStream_t);
	cudaError_t (*stream_wait_event)(cudaStream_t, cudaEvent_t, unsigned int);
	cudaError_t (*event_create_with_flags)(cudaEvent_t *, unsigned int);
	cudaError_t (*event_destroy)(cudaEvent_t);
	cudaError_t (*event_record)(cudaEvent_t, cudaStream_t);
	cudaError_t (*event_query)(cudaEvent_t);
	const char *(*get_error_name)(cudaError_t);
};

static struct cudart_api rt;
static bool rt_loaded;
static char rt_path[256];
static int rt_version, rt_driver, rt_ngpus;
static char rt_why_cudart[KOLO_CUDA_WHY_SIZE], rt_why_driver[KOLO_CUDA_WHY_SIZE],
        rt_why_gpus[KOLO_CUDA_WHY_SIZE], rt_why_dp[KOLO_CUDA_WHY_SIZE];
static bool dp_ok; /* every data-path entry point resolved */

/* Casts through void * are how dlsym hands out functions (POSIX). */
#define RESOLVE(field, name)                                                                       \
	do {                                                                                       \
		void *p_ = dlsym(h, name);                                                         \
		if (!p_ && !missing)                                                               \
			missing = name;                                                            \
		memcpy(&rt.field, &p_, sizeof(p_));                                                \
	} while (0)

/* The header's major first (its structs are the ones compiled in), then the
 * majors whose entry points used here have the same form, then whatever
 * libcudart.so the loader finds. */
static void *open_cudart(char *tried, size_t size)
{
	char names[4][32];
	int n = 0;
	snprintf(names[n++], sizeof(names[0]), "libcudart.so.%d", CUDART_VERSION / 1000);
	for (int major = 13; major >= 12; major--)
		if (major != CUDART_VERSION / 1000)
			snprintf(names[n++], sizeof(names[0]), "libcudart.so.%d", major);
	snprintf(names[n++], sizeof(names[0]), "libcudart.so");
	size_t used = 0;
	tried[0] = '\0';
	for (int i = 0; i < n; i++) {
		void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
		if (h)
			return h;
		if (used < size)
			used += (size_t)snprintf(tried + used, size - used, "%s%s", i ? ", " : "",
			                         names[i]);
	}
	return NULL;
}

static void load_runtime(void)
{
	char tried[128];
	void *h = open_cudart(tried, sizeof(tried));
	if (!h) {
		snprintf(rt_why_cudart, sizeof(rt_why_cudart),
		         "%s not found (not installed, or not on the loader's path: "
		         "LD_LIBRARY_PATH, ldconfig)",
		         tried);
		snprintf(rt_why_driver, sizeof(rt_why_driver), "not checked: no libcudart");
		snprintf(rt_why_gpus, sizeof(rt_why_gpus), "not checked: no libcudart");
		rt_why = rt_why_cudart;
		atomic_store_explicit(&mem_state, HOST_ONLY, memory_order_release);
		return;
	}
	const char *missing = NULL;
	RESOLVE(get_device_count, "cudaGetDeviceCount");
	RESOLVE(driver_get_version, "cudaDriverGetVersion");
	RESOLVE(runtime_get_version, "cudaRuntimeGetVersion");
	RESOLVE(pointer_get_attributes, "cudaPointerGetAttributes");
	RESOLVE(get_error_string, "cudaGetErrorString");
	RESOLVE(get_device_properties, "cudaGetDeviceProperties");
	RESOLVE(device_get_attribute, "cudaDeviceGetAttribute");
	RESOLVE(get_last_error, "cudaGetLastError");
	const char *core_missing = missing;
	missing = NULL;
	RESOLVE(set_device, "cudaSetDevice");
	RESOLVE(get_device, "cudaGetDevice");
	RESOLVE(malloc_, "cudaMalloc");
	RESOLVE(free_, "cudaFree");
	RESOLVE(malloc_host, "cudaMallocHost");
	RESOLVE(free_host, "cudaFreeHost");
	RESOLVE(memcpy_async, "cudaMemcpyAsync");
	RESOLVE(memset_async, "cudaMemsetAsync");
	RESOLVE(stream_create_with_flags, "cudaStreamCreateWithFlags");
	RESOLVE(stream_destroy, "cudaStreamDestroy");
	RESOLVE(stream_query, "cudaStreamQuery");
	RESOLVE(stream_wait_event, "cudaStreamWaitEvent");
	RESOLVE(event_create_with_flags, "cudaEventCreateWithFlags");
	RESOLVE(event_destroy, "cudaEventDestroy");
	RESOLVE(event_record, "cudaEventRecord");
	RESOLVE(event_query, "cudaEventQuery");
	RESOLVE(get_error_name, "cudaGetErrorName");
	dp_ok = !missing;
	lib_path(dlsym(h, "cudaGetDeviceCount"), rt_path, sizeof(rt_path));
	if (missing)
		snprintf(rt_why_dp, sizeof(rt_why_dp), "%.200s lacks %s", rt_path, missing);
	missing = core_missing;
	lib_path(dlsym(h, "cudaGetDeviceCount"), rt_path, sizeof(rt_path));
	if (missing) {
		snprintf(rt_why_cudart, sizeof(rt_why_cudart), "%.200s lacks %s", rt_path, missing);
		snprintf(rt_why_driver, sizeof(rt_why_driver), "not checked: unusable libcudart");
		snprintf(rt_why_gpus, sizeof(rt_why_gpus), "not checked: unusable libcudart");
		rt_why = rt_why_cudart;
		dlclose(h);
		atomic_store_explicit(&mem_state, HOST_ONLY, memory_order_release);
		return;
	}
	rt_loaded = true; /* the handle stays open for the life of the process */
	if (rt.runtime_get_version(&rt_version) != cudaSuccess)
		rt_version = 0;
	/* Only a test of its presence, for the reason: libcudart opens it
	 * itself. Kept open, as libcudart keeps it. */
	void *drv = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!drv) {
		snprintf(rt_why_driver, sizeof(rt_why_driver),
		         "CUDA driver not found (libcuda.so.1): no GPU");
	} else if (rt.driver_get_version(&rt_driver) != cudaSuccess || rt_driver == 0) {
		rt_driver = 0;
		snprintf(rt_why_driver, sizeof(rt_why_driver),
		         "libcuda.so.1 found but reports no driver version");
	}
	int n = 0;
	cudaError_t e = rt.get_device_count(&n);
	if (e != cudaSuccess) {
		rt.get_last_error();
		n = 0;
		if (!drv)
			snprintf(rt_why_gpus, sizeof(rt_why_gpus),
			         "no CUDA device visible: CUDA driver not found (libcuda.so.1)");
		else
			snprintf(rt_why_gpus, sizeof(rt_why_gpus),
			         "no CUDA device visible: cudaGetDeviceCount: %s (cudaError %d)",
			         rt.get_error_string(e), (int)e);
	} else if (n == 0) {
		const char *vis = getenv("CUDA_VISIBLE_DEVICES");
		snprintf(rt_why_gpus, sizeof(rt_why_gpus), "no CUDA device visible%s%s%s",
		         vis ? " (CUDA_VISIBLE_DEVICES=" : "", vis ? vis : "", vis ? ")" : "");
	}
	rt_ngpus = n;
	if (n > 0) {
		rt_why = NULL;
		atomic_store_explicit(&mem_state, PROBE, memory_order_release);
		return;
	}
	rt_why = drv ? rt_why_gpus : rt_why_driver;
	atomic_store_explicit(&mem_state, HOST_ONLY, memory_order_release);
}

static enum kolo_mem_kind probe(const void *ptr)
{
	struct cudaPointerAttributes a;
	memset(&a, 0, sizeof(a));
	cudaError_t e = rt.pointer_get_attributes(&a, ptr);
	if (e != cudaSuccess) {
		/* Leave no error behind for the application's cudaGetLastError.
		 * Runtimes before 11.0 answered a plain host pointer this way. */
		rt.get_last_error();
		return e == cudaErrorInvalidValue ? KOLO_MEM_HOST : KOLO_MEM_UNKNOWN;
	}
	switch (a.type) {
	case cudaMemoryTypeDevice:
		return KOLO_MEM_DEVICE;
	case cudaMemoryTypeManaged:
		return KOLO_MEM_MANAGED;
	case cudaMemoryTypeHost:
	case cudaMemoryTypeUnregistered:
		break;
	}
	return KOLO_MEM_HOST;
}

/* The properties struct grows between CUDA versions, and a libcudart newer
 * than the headers may write more of it: room to spare. Only its head (name,
 * uuid, luid, node mask, totalGlobalMem) has kept its place in every version
 * since 10; the compute capability comes from attributes, whose numbers are
 * fixed. */
union props_room {
	struct cudaDeviceProp p;
	char room[8192];
};

static void query_gpus(struct kolo_cuda_info *out)
{
	int n = rt_ngpus < KOLO_CUDA_MAX_GPUS ? rt_ngpus : KOLO_CUDA_MAX_GPUS;
	union props_room *pr = calloc(1, sizeof(*pr));
	if (!pr) {
		snprintf(out->why_gpus, sizeof(out->why_gpus), "out of memory");
		return;
	}
	for (int i = 0; i < n; i++) {
		struct kolo_cuda_gpu *g = &out->gpus[i];
		memset(pr, 0, sizeof(*pr));
		if (rt.get_device_properties(&pr->p, i) == cudaSuccess) {
			snprintf(g->name, sizeof(g->name), "%.*s", (int)sizeof(g->name) - 1,
			         pr->p.name);
			g->mem_bytes = pr->p.totalGlobalMem;
		} else {
			rt.get_last_error();
			snprintf(g->name, sizeof(g->name), "(properties unavailable)");
		}
		if (rt.device_get_attribute(&g->cc_major, cudaDevAttrComputeCapabilityMajor, i) !=
		            cudaSuccess ||
		    rt.device_get_attribute(&g->cc_minor, cudaDevAttrComputeCapabilityMinor, i) !=
		            cudaSuccess) {
			rt.get_last_error();
			g->cc_major = g->cc_minor = 0;
		}
	}
	free(pr);
}

#else /* !KOLO_HAVE_CUDA */

static void load_runtime(void)
{
	rt_why = BUILT_WITHOUT;
	atomic_store_explicit(&mem_state, HOST_ONLY, memory_order_release);
}

static enum kolo_mem_kind probe(const void *ptr)
{
	(void)ptr;
	return KOLO_MEM_HOST;
}

#endif /* KOLO_HAVE_CUDA */

static int state(void)
{
	int s = atomic_load_explicit(&mem_state, memory_order_acquire);
	if (s == UNSET) {
		pthread_once(&rt_once, load_runtime);
		s = atomic_load_explicit(&mem_state, memory_order_acquire);
	}
	return s;
}

enum kolo_mem_kind kolo_mem_kind(const void *ptr)
{
	int s = atomic_load_explicit(&mem_state, memory_order_acquire);
	if (s == HOST_ONLY || !ptr)
		return KOLO_MEM_HOST;
	if (s == UNSET && state() == HOST_ONLY)
		return KOLO_MEM_HOST;
	return probe(ptr);
}

bool kolo_gpu_maybe_device(void)
{
	return atomic_load_explicit(&mem_state, memory_order_acquire) != HOST_ONLY;
}

bool kolo_cuda_devices_visible(const char **why)
{
	bool visible = state() == PROBE;
	if (why)
		*why = visible ? "" : rt_why;
	return visible;
}

/* ---- the data path's runtime calls (gpu.h) ------------------------------ */

#if KOLO_HAVE_CUDA

bool kolo_gpu_usable(const char **why)
{
	const char *w = NULL;
	bool ok = kolo_cuda_devices_visible(&w) && dp_ok;
	if (why)
		*why = ok ? "" : (dp_ok ? w : rt_why_dp);
	return ok;
}

/* The status for CUDA error e of call, with its message in eb; CUDA's last
 * error is cleared so that the application's cudaGetLastError does not see
 * kolo's. */
static kolo_status_t cuda_fail(struct kolo_errbuf *eb, const char *call, cudaError_t e)
{
	rt.get_last_error();
	kolo_status_t st = e == cudaErrorMemoryAllocation ? KOLO_ENOMEM : KOLO_ESYSTEM;
	return kolo_fail(eb, st, "%s: %s (%s)", call, rt.get_error_string(e), rt.get_error_name(e));
}

#define USABLE(eb)                                                                                 \
	do {                                                                                       \
		const char *why_;                                                                  \
		if (!kolo_gpu_usable(&why_))                                                       \
			return kolo_fail(eb, KOLO_EUNSUPPORTED, "CUDA is not usable: %s", why_);   \
	} while (0)

#define CALL(eb, name, expr)                                                                       \
	do {                                                                                       \
		cudaError_t e_ = (expr);                                                           \
		if (e_ != cudaSuccess)                                                             \
			return cuda_fail(eb, name, e_);                                            \
	} while (0)

kolo_status_t kolo_gpu_ptr_device(const void *ptr, int *ordinal, struct kolo_errbuf *eb)
{
	USABLE(eb);
	struct cudaPointerAttributes a;
	memset(&a, 0, sizeof(a));
	CALL(eb, "cudaPointerGetAttributes", rt.pointer_get_attributes(&a, ptr));
	if (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged)
		return kolo_fail(eb, KOLO_EINVAL, "%p is not device memory", ptr);
	*ordinal = a.device;
	return KOLO_OK;
}

kolo_status_t kolo_gpu_set_device(int ordinal, struct kolo_errbuf *eb)
{
	USABLE(eb);
	CALL(eb, "cudaSetDevice", rt.set_device(ordinal));
	return KOLO_OK;
}

kolo_status_t kolo_gpu_get_device(int *ordinal, struct kolo_errbuf *eb)
{
	USABLE(eb);
	CALL(eb, "cudaGetDevice", rt.get_device(ordinal));
	return KOLO_OK;
}

kolo_status_t kolo_gpu_malloc(void **ptr, size_t bytes, struct kolo_errbuf *eb)
{
	*ptr = NULL;
	USABLE(eb);
	CALL(eb, "cudaMalloc", rt.malloc_(ptr, bytes ? bytes : 1));
	return KOLO_OK;
}

void kolo_gpu_free(void *ptr)
{
	if (ptr && dp_ok && rt.free_(ptr) != cudaSuccess)
		rt.get_last_error();
}

kolo_status_t kolo_gpu_host_alloc(void **ptr, size_t bytes, struct kolo_errbuf *eb)
{
	*ptr = NULL;
	USABLE(eb);
	CALL(eb, "cudaMallocHost", rt.malloc_host(ptr, bytes ? bytes : 1));
	return KOLO_OK;
}

void kolo_gpu_host_free(void *ptr)
{
	if (ptr && dp_ok && rt.free_host(ptr) != cudaSuccess)
		rt.get_last_error();
}

kolo_status_t kolo_gpu_memcpy_async(void *dst, const void *src, size_t bytes, void *stream,
                                    struct kolo_errbuf *eb)
{
	if (!bytes)
		return KOLO_OK;
	CALL(eb, "cudaMemcpyAsync",
	     rt.memcpy_async(dst, src, bytes, cudaMemcpyDefault, (cudaStream_t)stream));
	return KOLO_OK;
}

kolo_status_t kolo_gpu_memset_async(void *dst, int value, size_t bytes, void *stream,
                                    struct kolo_errbuf *eb)
{
	if (!bytes)
		return KOLO_OK;
	CALL(eb, "cudaMemsetAsync", rt.memset_async(dst, value, bytes, (cudaStream_t)stream));
	return KOLO_OK;
}

kolo_status_t kolo_gpu_stream_create(void **stream, struct kolo_errbuf *eb)
{
	*stream = NULL;
	USABLE(eb);
	cudaStream_t s;
	CALL(eb, "cudaStreamCreateWithFlags",
	     rt.stream_create_with_flags(&s, cudaStreamNonBlocking));
	*stream = s;
	return KOLO_OK;
}

void kolo_gpu_stream_destroy(void *stream)
{
	if (stream && dp_ok && rt.stream_destroy((cudaStream_t)stream) != cudaSuccess)
		rt.get_last_error();
}

/* Polls query (cudaStreamQuery or cudaEventQuery) until it stops answering
 * cudaErrorNotReady or timeout_ms passes. The first microseconds only yield
 * (a staged chunk is usually that close); later polls sleep, growing to
 * 200 µs, so that a long wait costs no CPU. */
static kolo_status_t poll_ready(cudaError_t (*query)(void *), void *obj, const char *name,
                                int timeout_ms, struct kolo_errbuf *eb)
{
	uint64_t t0 = kolo_now_ns(), sleep_ns = 2000;
	for (;;) {
		cudaError_t e = query(obj);
		if (e == cudaSuccess)
			return KOLO_OK;
		if (e != cudaErrorNotReady)
			return cuda_fail(eb, name, e);
		uint64_t waited = kolo_now_ns() - t0;
		if (timeout_ms > 0 && waited >= (uint64_t)timeout_ms * 1000000u)
			return kolo_fail(eb, KOLO_ETIMEDOUT,
			                 "%s: the device work did not finish within %d ms", name,
			                 timeout_ms);
		if (waited < 50000) {
			sched_yield();
			continue;
		}
		struct timespec ts = {0, (long)sleep_ns};
		nanosleep(&ts, NULL);
		if (sleep_ns < 200000)
			sleep_ns *= 2;
	}
}

static cudaError_t stream_query(void *s)
{
	return rt.stream_query((cudaStream_t)s);
}

static cudaError_t event_query(void *ev)
{
	return rt.event_query((cudaEvent_t)ev);
}

kolo_status_t kolo_gpu_stream_sync(void *stream, int timeout_ms, struct kolo_errbuf *eb)
{
	USABLE(eb);
	return poll_ready(stream_query, stream, "cudaStreamQuery", timeout_ms, eb);
}

kolo_status_t kolo_gpu_event_create(void **event, struct kolo_errbuf *eb)
{
	*event = NULL;
	USABLE(eb);
	cudaEvent_t ev;
	CALL(eb, "cudaEventCreateWithFlags",
	     rt.event_create_with_flags(&ev, cudaEventDisableTiming));
	*event = ev;
	return KOLO_OK;
}

void kolo_gpu_event_destroy(void *event)
{
	if (event && dp_ok && rt.event_destroy((cudaEvent_t)event) != cudaSuccess)
		rt.get_last_error();
}

kolo_status_t kolo_gpu_event_record(void *event, void *stream, struct kolo_errbuf *eb)
{
	CALL(eb, "cudaEventRecord", rt.event_record((cudaEvent_t)event, (cudaStream_t)stream));
	return KOLO_OK;
}

kolo_status_t kolo_gpu_event_query(void *event, bool *done, struct kolo_errbuf *eb)
{
	cudaError_t e = rt.event_query((cudaEvent_t)event);
	*done = e == cudaSuccess;
	if (e != cudaSuccess && e != cudaErrorNotReady)
		return cuda_fail(eb, "cudaEventQuery", e);
	return KOLO_OK;
}

kolo_status_t kolo_gpu_event_sync(void *event, int timeout_ms, struct kolo_errbuf *eb)
{
	return poll_ready(event_query, event, "cudaEventQuery", timeout_ms, eb);
}

kolo_status_t kolo_gpu_stream_wait_event(void *stream, void *event, struct kolo_errbuf *eb)
{
	CALL(eb, "cudaStreamWaitEvent",
	     rt.stream_wait_event((cudaStream_t)stream, (cudaEvent_t)event, 0));
	return KOLO_OK;
}

kolo_status_t kolo_gpu_device_uuid(int ordinal, uint8_t uuid[16], struct kolo_errbuf *eb)
{
	USABLE(eb);
	union props_room *pr = calloc(1, sizeof(*pr));
	if (!pr)
		return kolo_fail(eb, KOLO_ENOMEM, "out of memory");
	cudaError_t e = rt.get_device_properties(&pr->p, ordinal);
	if (e == cudaSuccess)
		memcpy(uuid, pr->p.uuid.bytes, 16);
	free(pr);
	if (e != cudaSuccess)
		return cuda_fail(eb, "cudaGetDeviceProperties", e);
	return KOLO_OK;
}

#else /* !KOLO_HAVE_CUDA */

bool kolo_gpu_usable(const char **why)
{
	if (why)
		*why = BUILT_WITHOUT;
	return false;
}

#define UNSUPPORTED(eb) kolo_fail(eb, KOLO_EUNSUPPORTED, "CUDA is not usable: " BUILT_WITHOUT)

kolo_status_t kolo_gpu_ptr_device(const void *ptr, int *ordinal, struct kolo_errbuf *eb)
{
	(void)ptr;
	*ordinal = -1;
	return UNSUPPORTED(eb);
}

kolo_status_t kolo_gpu_set_device(int ordinal, struct kolo_errbuf *eb)
{
	(void)ordinal;
	return UNSUPPORTED(eb);
}

kolo_status_t kolo_gpu_get_device(int *ordinal, struct kolo_errbuf *eb)
{
	*ordinal = -1;
	return UNSUPPORTED(eb);
}

kolo_status_t kolo_gpu_malloc(void **ptr, size_t bytes, struct kolo_errbuf *eb)
{
	(void)bytes;
	*ptr = NULL;
	return UNSUPPORTED(eb);
}

void kolo_gpu_free(void *ptr)
{
	(void)ptr;
}

kolo_status_t kolo_gpu_host_alloc(void **ptr, size_t bytes, struct kolo_errbuf *eb)
{
	(void)bytes;
	*ptr = NULL;
	return UNSUPPORTED(eb);
}

void kolo_gpu_host_free(void *ptr)
{
	(void)ptr;
}

kolo_status_t kolo_gpu_memcpy_async(void *dst, const void *src, size_t bytes, void *stream,
                                    struct kolo_errbuf *eb)
{
	(void)dst, (void)src, (void)bytes, (void)stream;
	return UNSUPPORTED(eb);
}

kolo_status_t kolo_gpu_memset_async(void *dst, int value, size_t bytes, void *stream,
                                    struct kolo_errbuf *eb)
{
	(void)dst, (void)value, (void)bytes, (void)stream;
	return UNSUPPORTED(eb);
}

kolo_status_t kolo_gpu_stream_create(void **stream, struct kolo_errbuf *eb)
{
	*stream = NULL;
	return UNSUPPORTED(eb);
}

void kolo_gpu_stream_destroy(void *stream)
{
	(void)stream;
}

kolo_status_t kolo_gpu_stream_sync(void *stream, int timeout_ms, struct kolo_errbuf *eb)
{
	(void)stream, (void)timeout_ms;
	return UNSUPPORTED(eb);
}

kolo_status_t kolo_gpu_event_create(void **event, struct kolo_errbuf *eb)
{
	*event = NULL;
	return UNSUPPORTED(eb);
}

void kolo_gpu_event_destroy(void *event)
{
	(void)event;
}

kolo_status_t kolo_gpu_event_record(void *event, void *stream, struct kolo_errbuf *eb)
{
	(void)event, (void)stream;
	return UNSUPPORTED(eb);
}

kolo_status_t kolo_gpu_event_query(void *event, bool *done, struct kolo_errbuf *eb)
{
	(void)event;
	*done = false;
	return UNSUPPORTED(eb);
}

kolo_status_t kolo_gpu_event_sync(void *event, int timeout_ms, struct kolo_errbuf *eb)
{
	(void)event, (void)timeout_ms;
	return UNSUPPORTED(eb);
}

kolo_status_t kolo_gpu_stream_wait_event(void *stream, void *event, struct kolo_errbuf *eb)
{
	(void)stream, (void)event;
	return UNSUPPORTED(eb);
}

kolo_status_t kolo_gpu_device_uuid(int ordinal, uint8_t uuid[16], struct kolo_errbuf *eb)
{
	(void)ordinal;
	memset(uuid, 0, 16);
	return UNSUPPORTED(eb);
}

#endif /* KOLO_HAVE_CUDA */

/* ---- NCCL: only its version so far (kolo-info) ------------------------ */

#if KOLO_HAVE_NCCL
static pthread_once_t nccl_once = PTHREAD_ONCE_INIT;
static char nccl_path[256];
static int nccl_version;
static char nccl_why[KOLO_CUDA_WHY_SIZE];

static void load_nccl(void)
{
	void *h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		snprintf(nccl_why, sizeof(nccl_why),
		         "libnccl.so.2 not found (not installed, or not on the loader's path)");
		return;
	}
	ncclResult_t (*get_version)(int *);
	void *p = dlsym(h, "ncclGetVersion");
	memcpy(&get_version, &p, sizeof(p));
	lib_path(p, nccl_path, sizeof(nccl_path));
	if (!p) {
		snprintf(nccl_why, sizeof(nccl_why), "%.200s lacks ncclGetVersion", nccl_path);
		dlclose(h);
		return;
	}
	if (get_version(&nccl_version) != ncclSuccess) {
		nccl_version = 0;
		snprintf(nccl_why, sizeof(nccl_why), "ncclGetVersion failed");
	}
	/* the handle stays open: the data path will use it */
}
#endif

void kolo_cuda_query(struct kolo_cuda_info *out)
{
	memset(out, 0, sizeof(*out));
	state();
	out->built = KOLO_HAVE_CUDA;
	out->nccl_built = KOLO_HAVE_NCCL;
#if KOLO_HAVE_CUDA
	out->header_runtime = CUDART_VERSION;
	snprintf(out->cudart_path, sizeof(out->cudart_path), "%s", rt_loaded ? rt_path : "");
	out->runtime_version = rt_version;
	out->driver_version = rt_driver;
	out->ngpus = rt_ngpus;
	snprintf(out->why_cudart, sizeof(out->why_cudart), "%s", rt_why_cudart);
	snprintf(out->why_driver, sizeof(out->why_driver), "%s", rt_why_driver);
	snprintf(out->why_gpus, sizeof(out->why_gpus), "%s", rt_why_gpus);
	if (rt_ngpus > 0)
		query_gpus(out);
#else
	snprintf(out->why_cudart, sizeof(out->why_cudart), "%s", BUILT_WITHOUT);
	snprintf(out->why_driver, sizeof(out->why_driver), "%s", BUILT_WITHOUT);
	snprintf(out->why_gpus, sizeof(out->why_gpus), "%s", BUILT_WITHOUT);
#endif
#if KOLO_HAVE_NCCL
	pthread_once(&nccl_once, load_nccl);
	out->header_nccl = NCCL_VERSION_CODE;
	snprintf(out->nccl_path, sizeof(out->nccl_path), "%s", nccl_path);
	out->nccl_version = nccl_version;
	snprintf(out->why_nccl, sizeof(out->why_nccl), "%s", nccl_why);
#else
	snprintf(out->why_nccl, sizeof(out->why_nccl), "%s",
	         KOLO_HAVE_CUDA ? "this libkolo was built without NCCL (nccl.h not found)"
	                        : BUILT_WITHOUT);
#endif
}
