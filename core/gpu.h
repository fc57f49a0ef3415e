/* gpu: the CUDA runtime and NCCL, loaded at run time. libkolo is compiled
 * against the CUDA and NCCL headers only (KOLO_WITH_CUDA, docs/gpu.md) and
 * opens libcudart and libnccl with dlopen on first use, so one library runs
 * on machines with and without CUDA. This module only answers "is this
 * pointer device memory?" and reports what it found (kolo-info); the data
 * path over device memory is not written yet, so runtime/args.c refuses
 * device pointers with the reason. It lives in core/ because every layer
 * above will need it (the argument checker, the fusion buffer on the device,
 * NCCL inside a host in ring/). Named gpu.h, not cuda.h: the toolkit has a
 * cuda.h of its own, which gpu.c's include path must not shadow. */
#ifndef KOLO_GPU_H
#define KOLO_GPU_H

#include <stdbool.h>
#include <stddef.h>

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

#endif /* KOLO_GPU_H */
