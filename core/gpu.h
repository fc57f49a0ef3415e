/* gpu: the CUDA runtime and NCCL, loaded at run time. libkolo is compiled
 * against the CUDA and NCCL headers only (KOLO_WITH_CUDA, docs/gpu.md) and
 * opens libcudart and libnccl with dlopen on first use, so one library runs
 * on machines with and without CUDA. This module answers "is this pointer
 * device memory?", reports what it found (kolo-info), and wraps the few
 * runtime calls the device data path makes (runtime/device.c, the fusion
 * buffer on the device), so that no caller needs a CUDA header. It lives in
 * core/ because every layer above needs it. Named gpu.h, not cuda.h: the toolkit has a
 * cuda.h of its own, which gpu.c's include path must not shadow. */
#ifndef KOLO_GPU_H
#define KOLO_GPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core.h"

enum kolo_mem_kind {
	KOLO_MEM_HOST,    /* host memory, pageable or pinned: the CPU path reads it */
	KOLO_MEM_DEVICE,  /* a GPU's memory (cudaMalloc): the CPU cannot read it */
	KOLO_MEM_MANAGED, /* managed memory (cudaMallocManaged): the CPU may read it */
	KOLO_MEM_UNKNOWN, /* CUDA failed to say (an error other than "not CUDA's") */
};

/* "host", "device", "managed" or "unknown". Never NULL. */
const char *kolo_mem_kind_name(enum kolo_mem_kind kind);

/* The kind of memory ptr points into. The first call of the process loads
 * libcudart and counts the GPUs (thread-safe, once). Where no device pointer
 * can exist (built without CUDA, no libcudart, no driver, no GPU visible)
 * every pointer is KOLO_MEM_HOST and a call costs one predictable branch;
 * otherwise it is one cudaPointerGetAttributes (cost: docs/gpu.md). NULL is
 * host. Thread-safe. */
enum kolo_mem_kind kolo_mem_kind(const void *ptr);

/* Whether kolo_mem_kind can answer anything but host (libcudart loaded and
 * at least one GPU visible); when false, *why (may be NULL) gets the reason
 * ("this libkolo was built without CUDA", "CUDA driver not found
 * (libcuda.so.1): no GPU", ...), a static string. Loads as kolo_mem_kind. */
bool kolo_cuda_devices_visible(const char **why);

/* False once this process is known to hold no device memory (kolo_mem_kind
 * answers host for everything); true before the first kolo_mem_kind and
 * where a GPU is visible. One load: for the host path's fast checks. */
bool kolo_gpu_maybe_device(void);

/* Whether this libkolo was compiled with the CUDA runtime headers. */
bool kolo_cuda_built(void);

#define KOLO_CUDA_MAX_GPUS 16
#define KOLO_CUDA_WHY_SIZE 256

struct kolo_cuda_gpu {
	char name[256];
	size_t mem_bytes; /* total global memory */
	int cc_major, cc_minor;
};

/* What kolo_cuda_query found. Versions are CUDA's encoding (1000 x major + 10
 * x minor: 13000 is 13.0) and NCCL's (22809 is 2.28.9); 0 means none, and
 * the matching why_* string says why. */
struct kolo_cuda_info {
	bool built;            /* compiled with cuda_runtime_api.h */
	int header_runtime;    /* CUDART_VERSION of those headers */
	bool nccl_built;       /* compiled with nccl.h */
	int header_nccl;       /* NCCL_VERSION_CODE of that header */
	char cudart_path[256]; /* the libcudart loaded, "" when none */
	int runtime_version;   /* cudaRuntimeGetVersion */
	char why_cudart[KOLO_CUDA_WHY_SIZE];
	int driver_version; /* cudaDriverGetVersion; 0 without a driver */
	char why_driver[KOLO_CUDA_WHY_SIZE];
	int ngpus; /* cudaGetDeviceCount; 0 when it failed */
	char why_gpus[KOLO_CUDA_WHY_SIZE];
	struct kolo_cuda_gpu gpus[KOLO_CUDA_MAX_GPUS]; /* the first ngpus of them */
	char nccl_path[256];                           /* the libnccl loaded, "" when none */
	int nccl_version;                              /* ncclGetVersion */
	char why_nccl[KOLO_CUDA_WHY_SIZE];
};

/* Fills *out (loading libcudart as kolo_mem_kind, and libnccl, which nothing
 * else loads yet). For kolo-info and the tests; reads each GPU's properties,
 * so not for a hot path. Thread-safe. */
void kolo_cuda_query(struct kolo_cuda_info *out);

/* ---- the runtime calls of the device data path ---------------------------
 * Thin wrappers over the loaded libcudart. Each returns KOLO_OK, or a status
 * with "<cuda call>: <CUDA's message>" in eb: KOLO_EUNSUPPORTED when the
 * data path is unusable here (kolo_gpu_usable says why), KOLO_ENOMEM for an
 * allocation CUDA refused, KOLO_ETIMEDOUT for a wait past its deadline,
 * KOLO_ESYSTEM for any other CUDA error (CUDA's sticky last error is
 * cleared). Streams and events are void * (cudaStream_t and cudaEvent_t are
 * pointers); stream NULL is the legacy default stream. Thread-safe as CUDA
 * is. A device call acts on the calling thread's current device. */

/* Whether the device data path can run: kolo_cuda_devices_visible and every
 * entry point below resolved. When false, *why (may be NULL) gets the reason
 * (a static string). */
bool kolo_gpu_usable(const char **why);
/* The device that ptr's memory lives on (*ordinal), for device and managed
 * memory; KOLO_EINVAL for host memory. */
kolo_status_t kolo_gpu_ptr_device(const void *ptr, int *ordinal, struct kolo_errbuf *eb);
kolo_status_t kolo_gpu_set_device(int ordinal, struct kolo_errbuf *eb);
kolo_status_t kolo_gpu_get_device(int *ordinal, struct kolo_errbuf *eb);
/* Device memory on the current device; free accepts NULL. */
kolo_status_t kolo_gpu_malloc(void **ptr, size_t bytes, struct kolo_errbuf *eb);
void kolo_gpu_free(void *ptr);
/* Pinned (page-locked) host memory; free accepts NULL. */
kolo_status_t kolo_gpu_host_alloc(void **ptr, size_t bytes, struct kolo_errbuf *eb);
void kolo_gpu_host_free(void *ptr);
/* Queues a copy (cudaMemcpyDefault: any kinds, inferred by CUDA) or a
 * memset on stream. */
kolo_status_t kolo_gpu_memcpy_async(void *dst, const void *src, size_t bytes, void *stream,
                                    struct kolo_errbuf *eb);
kolo_status_t kolo_gpu_memset_async(void *dst, int value, size_t bytes, void *stream,
                                    struct kolo_errbuf *eb);
/* A non-blocking stream (no implicit order with the legacy default stream)
 * on the current device; destroy accepts NULL. */
kolo_status_t kolo_gpu_stream_create(void **stream, struct kolo_errbuf *eb);
void kolo_gpu_stream_destroy(void *stream);
/* Waits until stream has run everything queued, for at most timeout_ms
 * (polling cudaStreamQuery, so that no wait is forever; <= 0: forever). */
kolo_status_t kolo_gpu_stream_sync(void *stream, int timeout_ms, struct kolo_errbuf *eb);
/* Events without timing (cheaper); destroy accepts NULL. */
kolo_status_t kolo_gpu_event_create(void **event, struct kolo_errbuf *eb);
void kolo_gpu_event_destroy(void *event);
kolo_status_t kolo_gpu_event_record(void *event, void *stream, struct kolo_errbuf *eb);
/* *done: whether the work before the event's last record has run. */
kolo_status_t kolo_gpu_event_query(void *event, bool *done, struct kolo_errbuf *eb);
/* As kolo_gpu_stream_sync, for an event. */
kolo_status_t kolo_gpu_event_sync(void *event, int timeout_ms, struct kolo_errbuf *eb);
/* Makes later work on stream wait for event (on the device; returns at once). */
kolo_status_t kolo_gpu_stream_wait_event(void *stream, void *event, struct kolo_errbuf *eb);
/* The device's 16-byte UUID (the same in every process of the host). */
kolo_status_t kolo_gpu_device_uuid(int ordinal, uint8_t uuid[16], struct kolo_errbuf *eb);

#endif /* KOLO_GPU_H */
