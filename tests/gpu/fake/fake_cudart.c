/* fake_cudart: a test double of libcudart.so.13 for machines without a GPU
 * (docs/gpu.md). Compiled against the real cuda_runtime_api.h so every
 * signature is checked; exports only the CUDA names it defines and the
 * kolo_fake_cuda_* test hooks (kolo_fake.h, fake_cudart.map).
 *
 * Device memory is a memfd mapped twice: the address handed out is
 * PROT_NONE, so a host access of a device pointer faults as it would on a
 * GPU, and the fake works through a RW shadow mapping. Every stream is a
 * FIFO run by its own worker thread, so work really is asynchronous and an
 * ordering mistake shows. The NULL stream does not synchronise with other
 * streams (kolo must not rely on it). Not supported: graphs, kernels, IPC,
 * peer access, use of CUDA in a fork child of a process that used it. */
#include <cuda_runtime_api.h>

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "kolo_fake.h"

#define MAX_DEV 16

static int ndev;
static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static _Thread_local int cur_dev;
static _Thread_local cudaError_t last_error;

static cudaError_t fail(cudaError_t e)
{
	last_error = e;
	return e;
}

/* ---- memory: a table of what was allocated or registered ------------ */

enum kind { K_HOST, K_DEVICE, K_MANAGED }; /* how an address may be used */
enum rtype { R_DEVICE, R_PINNED, R_REGISTERED, R_MANAGED };

struct region {
	char *ptr, *shadow; /* shadow: the host-usable address (== ptr but for device) */
	size_t size, map_size;
	enum rtype type;
	int device;
};

static pthread_mutex_t mem_lock = PTHREAD_MUTEX_INITIALIZER;
static struct region *regions;
static size_t nregions, cap_regions;
static _Atomic uint64_t stat_bytes[4], stat_ops[4];

/* Caller holds mem_lock. */
static struct region *find_region(const void *p)
{
	const char *c = p;
	for (size_t i = 0; i < nregions; i++)
		if (c >= regions[i].ptr && c < regions[i].ptr + regions[i].size)
			return &regions[i];
	return NULL;
}

static cudaError_t add_region(struct region r)
{
	pthread_mutex_lock(&mem_lock);
	if (nregions == cap_regions) {
		size_t cap = cap_regions ? 2 * cap_regions : 64;
		struct region *n = realloc(regions, cap * sizeof(*n));
		if (!n) {
			pthread_mutex_unlock(&mem_lock);
			return cudaErrorMemoryAllocation;
		}
		regions = n;
		cap_regions = cap;
	}
	regions[nregions++] = r;
	pthread_mutex_unlock(&mem_lock);
	return cudaSuccess;
}

/* Removes the region that starts at p and has one of the types in mask. */
static bool take_region(const void *p, unsigned mask, struct region *out)
{
	bool found = false;
	pthread_mutex_lock(&mem_lock);
	struct region *r = find_region(p);
	if (r && r->ptr == p && (mask & (1u << r->type))) {
		*out = *r;
		*r = regions[--nregions];
		found = true;
	}
	pthread_mutex_unlock(&mem_lock);
	return found;
}

/* The host-usable address of [p, p + n) and how it may be used; host
 * memory nobody told CUDA about is K_HOST. A range that starts in an
 * allocation must end in it. */
static cudaError_t resolve(const void *p, size_t n, enum kind *kind, void **host, int *device)
{
	cudaError_t e = cudaSuccess;
	pthread_mutex_lock(&mem_lock);
	struct region *r = find_region(p);
	*kind = K_HOST;
	*host = (void *)(uintptr_t)p;
	if (device)
		*device = -1;
	if (r) {
		size_t off = (size_t)((const char *)p - r->ptr);
		if (n > r->size - off)
			e = cudaErrorInvalidValue;
		*kind = r->type == R_DEVICE ? K_DEVICE : r->type == R_MANAGED ? K_MANAGED : K_HOST;
		*host = r->shadow + off;
		if (device)
			*device = r->device;
	}
	pthread_mutex_unlock(&mem_lock);
	return e;
}

void *kolo_fake_cuda_shadow_range(const void *devptr, size_t bytes, int *device)
{
	enum kind k;
	void *h;
	if (!devptr || resolve(devptr, bytes, &k, &h, device) != cudaSuccess || k != K_DEVICE)
		return NULL;
	return h;
}

void *kolo_fake_cuda_shadow(const void *devptr)
{
	return kolo_fake_cuda_shadow_range(devptr, 1, NULL);
}

void kolo_fake_cuda_stats(uint64_t bytes[4], uint64_t ops[4])
{
	for (int i = 0; i < 4; i++) {
		if (bytes)
			bytes[i] = atomic_load(&stat_bytes[i]);
		if (ops)
			ops[i] = atomic_load(&stat_ops[i]);
	}
}

/* ---- streams: a FIFO of ops and a worker thread each ----------------- */

struct event {
	uint64_t recorded, reached; /* generations, under ev_lock */
	struct timespec at;
	unsigned flags;
	int refs;
};

struct op {
	struct op *next;
	void (*run)(struct op *);
	void (*fn)(void *);
	void *arg, *dst;
	const void *src;
	size_t n;
	int value, kind;
	struct event *ev;
	uint64_t gen;
};

struct stream {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct op *head, *tail;
	uint64_t queued, done;
	int device;
	bool in_use, dead;   /* dead: inherited over fork, its worker is gone */
	struct stream *next; /* in all_streams; set before publication, never changed */
};

/* Streams are never freed, so a handle stays safe to look up and the list
 * can be walked without the lock; destroyed ones are reused. */
static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static struct stream *all_streams;
static struct stream *legacy[MAX_DEV];
static _Thread_local struct stream *per_thread[MAX_DEV];

static pthread_mutex_t ev_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ev_cond = PTHREAD_COND_INITIALIZER;

static void reach(struct op *op);

/* An event record (run NULL) completes under ev_lock and the stream's lock
 * at once, so a stream seen idle has its events reached and the other way
 * round. */
static void *worker(void *arg)
{
	struct stream *s = arg;
	for (;;) {
		pthread_mutex_lock(&s->lock);
		while (!s->head)
			pthread_cond_wait(&s->cond, &s->lock);
		struct op *op = s->head;
		s->head = op->next;
		if (!s->head)
			s->tail = NULL;
		pthread_mutex_unlock(&s->lock);
		if (op->run)
			op->run(op);
		else
			pthread_mutex_lock(&ev_lock);
		pthread_mutex_lock(&s->lock);
		s->done++;
		pthread_cond_broadcast(&s->cond);
		pthread_mutex_unlock(&s->lock);
		if (!op->run) {
			reach(op);
			pthread_mutex_unlock(&ev_lock);
		}
		free(op);
	}
	return NULL;
}

static bool stream_idle(struct stream *s)
{
	pthread_mutex_lock(&s->lock);
	bool idle = s->queued == s->done;
	pthread_mutex_unlock(&s->lock);
	return idle;
}

static int devices(void);

static struct stream *stream_new(int device)
{
	devices(); /* the fork handler is in place before any worker */
	pthread_mutex_lock(&reg_lock);
	struct stream *s;
	for (s = all_streams; s; s = s->next)
		if (!s->in_use && !s->dead && stream_idle(s))
			break;
	if (!s && (s = calloc(1, sizeof(*s)))) {
		pthread_mutex_init(&s->lock, NULL);
		pthread_cond_init(&s->cond, NULL);
		pthread_t t;
		pthread_attr_t a;
		pthread_attr_init(&a);
		pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
		if (pthread_create(&t, &a, worker, s) != 0) {
			pthread_mutex_destroy(&s->lock);
			pthread_cond_destroy(&s->cond);
			free(s);
			s = NULL;
		} else {
			s->next = all_streams;
			all_streams = s;
		}
		pthread_attr_destroy(&a);
	}
	if (s) {
		s->in_use = true;
		s->device = device;
	}
	pthread_mutex_unlock(&reg_lock);
	return s;
}

static cudaError_t get_stream(cudaStream_t h, struct stream **out)
{
	struct stream **slot = NULL;
	if (h == NULL || h == cudaStreamLegacy)
		slot = &legacy[cur_dev];
	else if (h == cudaStreamPerThread)
		slot = &per_thread[cur_dev];
	if (slot) {
		pthread_mutex_lock(&reg_lock);
		struct stream *s = *slot;
		pthread_mutex_unlock(&reg_lock);
		if (!s) {
			if (!(s = stream_new(cur_dev)))
				return fail(cudaErrorMemoryAllocation);
			pthread_mutex_lock(&reg_lock);
			if (*slot) /* another thread made the legacy stream first */
				s->in_use = false;
			else
				*slot = s;
			s = *slot;
			pthread_mutex_unlock(&reg_lock);
		}
		*out = s;
		return cudaSuccess;
	}
	pthread_mutex_lock(&reg_lock);
	struct stream *s;
	for (s = all_streams; s && s != (struct stream *)h; s = s->next)
		;
	bool ok = s && s->in_use && !s->dead;
	pthread_mutex_unlock(&reg_lock);
	if (!ok)
		return fail(cudaErrorInvalidResourceHandle);
	*out = s;
	return cudaSuccess;
}

static cudaError_t enqueue(cudaStream_t h, struct op *op)
{
	struct stream *s;
	cudaError_t e = get_stream(h, &s);
	if (e != cudaSuccess) {
		free(op);
		return e;
	}
	op->next = NULL;
	pthread_mutex_lock(&s->lock);
	if (s->tail)
		s->tail->next = op;
	else
		s->head = op;
	s->tail = op;
	s->queued++;
	pthread_cond_broadcast(&s->cond);
	pthread_mutex_unlock(&s->lock);
	return cudaSuccess;
}

static struct op *op_new(void (*run)(struct op *))
{
	struct op *op = calloc(1, sizeof(*op));
	if (op)
		op->run = run;
	return op;
}

static void stream_sync(struct stream *s)
{
	pthread_mutex_lock(&s->lock);
	uint64_t target = s->queued;
	while (s->done < target)
		pthread_cond_wait(&s->cond, &s->lock);
	pthread_mutex_unlock(&s->lock);
}

/* A process forked from one that used streams has none of their workers. */
static void fork_prepare(void)
{
	pthread_mutex_lock(&reg_lock);
	pthread_mutex_lock(&mem_lock);
}

static void fork_parent(void)
{
	pthread_mutex_unlock(&mem_lock);
	pthread_mutex_unlock(&reg_lock);
}

static void fork_child(void)
{
	for (struct stream *s = all_streams; s; s = s->next)
		s->dead = true;
	memset(legacy, 0, sizeof(legacy));
	memset(per_thread, 0, sizeof(per_thread));
	fork_parent();
}

static void init(void)
{
	const char *v = getenv("KOLO_FAKE_CUDA_DEVICES");
	ndev = v && *v ? atoi(v) : 1;
	ndev = ndev < 0 ? 0 : ndev > MAX_DEV ? MAX_DEV : ndev;
	pthread_atfork(fork_prepare, fork_parent, fork_child);
}

static int devices(void)
{
	pthread_once(&init_once, init);
	return ndev;
}

/* ---- errors and versions ---------------------------------------------- */

#define ERRORS(X)                                                                                  \
	X(cudaSuccess, "no error")                                                                 \
	X(cudaErrorInvalidValue, "invalid argument")                                               \
	X(cudaErrorMemoryAllocation, "out of memory")                                              \
	X(cudaErrorInvalidDevicePointer, "invalid device pointer")                                 \
	X(cudaErrorInvalidMemcpyDirection, "invalid copy direction for memcpy")                    \
	X(cudaErrorNoDevice, "no CUDA-capable device is detected")                                 \
	X(cudaErrorInvalidDevice, "invalid device ordinal")                                        \
	X(cudaErrorInvalidResourceHandle, "invalid resource handle")                               \
	X(cudaErrorNotReady, "device not ready")                                                   \
	X(cudaErrorHostMemoryAlreadyRegistered,                                                    \
	  "part or all of the requested memory range is already mapped")                           \
	X(cudaErrorHostMemoryNotRegistered,                                                        \
	  "pointer does not correspond to a registered memory region")

const char *cudaGetErrorString(cudaError_t error)
{
#define STR(e, s)                                                                                  \
	if (error == e)                                                                            \
		return s;
	ERRORS(STR)
	return "unrecognized error code";
}

const char *cudaGetErrorName(cudaError_t error)
{
#define NAME(e, s)                                                                                 \
	if (error == e)                                                                            \
		return #e;
	ERRORS(NAME)
	return "cudaErrorUnknown";
}

cudaError_t cudaGetLastError(void)
{
	cudaError_t e = last_error;
	last_error = cudaSuccess;
	return e;
}

cudaError_t cudaPeekAtLastError(void)
{
	return last_error;
}

cudaError_t cudaDriverGetVersion(int *v)
{
	if (!v)
		return fail(cudaErrorInvalidValue);
	*v = 13000;
	return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int *v)
{
	return cudaDriverGetVersion(v);
}

/* ---- devices ------------------------------------------------------------ */

cudaError_t cudaGetDeviceCount(int *count)
{
	if (!count)
		return fail(cudaErrorInvalidValue);
	*count = devices();
	return *count ? cudaSuccess : fail(cudaErrorNoDevice);
}

static cudaError_t check_device(int d)
{
	int n = devices();
	if (!n)
		return fail(cudaErrorNoDevice);
	return d >= 0 && d < n ? cudaSuccess : fail(cudaErrorInvalidDevice);
}

cudaError_t cudaSetDevice(int device)
{
	cudaError_t e = check_device(device);
	if (e == cudaSuccess)
		cur_dev = device;
	return e;
}

cudaError_t cudaGetDevice(int *device)
{
	if (!device)
		return fail(cudaErrorInvalidValue);
	cudaError_t e = check_device(cur_dev);
	*device = cur_dev;
	return e;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int device)
{
	cudaError_t e = p ? check_device(device) : fail(cudaErrorInvalidValue);
	if (e != cudaSuccess)
		return e;
	memset(p, 0, sizeof(*p));
	snprintf(p->name, sizeof(p->name), "kolo fake GPU %d", device);
	/* The same in every process, distinct per ordinal: what NCCL's
	 * duplicate-GPU check and kolo's uuid exchange compare. */
	memcpy(p->uuid.bytes, "kolo-fake-gpu-", 14);
	p->uuid.bytes[14] = 0x5a;
	p->uuid.bytes[15] = (char)device;
	p->totalGlobalMem = (size_t)16 << 30;
	p->major = 9;
	p->minor = 0;
	p->multiProcessorCount = 132;
	p->warpSize = 32;
	p->maxThreadsPerBlock = 1024;
	p->pciBusID = 0x10 + device;
	p->unifiedAddressing = 1;
	p->canMapHostMemory = 1;
	p->managedMemory = 1;
	p->asyncEngineCount = 2;
	p->concurrentKernels = 1;
	return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device)
{
	cudaError_t e = value ? check_device(device) : fail(cudaErrorInvalidValue);
	if (e != cudaSuccess)
		return e;
	switch (attr) {
	case cudaDevAttrComputeCapabilityMajor:
		*value = 9;
		break;
	case cudaDevAttrMultiProcessorCount:
		*value = 132;
		break;
	case cudaDevAttrWarpSize:
		*value = 32;
		break;
	case cudaDevAttrMaxThreadsPerBlock:
		*value = 1024;
		break;
	case cudaDevAttrPciBusId:
		*value = 0x10 + device;
		break;
	case cudaDevAttrUnifiedAddressing:
		*value = 1;
		break;
	default:
		*value = 0;
		break;
	}
	return cudaSuccess;
}

cudaError_t cudaDeviceGetPCIBusId(char *id, int len, int device)
{
	cudaError_t e = id && len > 0 ? check_device(device) : fail(cudaErrorInvalidValue);
	if (e == cudaSuccess)
		snprintf(id, (size_t)len, "00000000:%02X:00.0", 0x10 + device);
	return e;
}

cudaError_t cudaDeviceSynchronize(void)
{
	cudaError_t e = check_device(cur_dev);
	if (e != cudaSuccess)
		return e;
	pthread_mutex_lock(&reg_lock);
	struct stream *s = all_streams;
	pthread_mutex_unlock(&reg_lock);
	for (; s; s = s->next) { /* not waiting under reg_lock */
		pthread_mutex_lock(&reg_lock);
		bool mine = !s->dead && s->device == cur_dev;
		pthread_mutex_unlock(&reg_lock);
		if (mine)
			stream_sync(s);
	}
	return cudaSuccess;
}

/* ---- allocation ------------------------------------------------------------ */

static size_t page_round(size_t n)
{
	size_t pg = (size_t)sysconf(_SC_PAGESIZE);
	return (n + pg - 1) / pg * pg;
}

cudaError_t cudaMalloc(void **p, size_t size)
{
	if (!p)
		return fail(cudaErrorInvalidValue);
	cudaError_t e = check_device(cur_dev);
	*p = NULL;
	if (e != cudaSuccess || size == 0)
		return e;
	size_t len = page_round(size);
	int fd = memfd_create("kolo-fake-cuda", MFD_CLOEXEC);
	if (fd < 0)
		return fail(cudaErrorMemoryAllocation);
	void *dev = MAP_FAILED, *shadow = MAP_FAILED;
	if (ftruncate(fd, (off_t)len) == 0) {
		dev = mmap(NULL, len, PROT_NONE, MAP_SHARED, fd, 0);
		shadow = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	}
	close(fd);
	struct region r = {dev, shadow, size, len, R_DEVICE, cur_dev};
	if (dev == MAP_FAILED || shadow == MAP_FAILED || add_region(r) != cudaSuccess) {
		if (dev != MAP_FAILED)
			munmap(dev, len);
		if (shadow != MAP_FAILED)
			munmap(shadow, len);
		return fail(cudaErrorMemoryAllocation);
	}
	*p = dev;
	return cudaSuccess;
}

static cudaError_t host_alloc(void **p, size_t size, enum rtype type)
{
	if (!p)
		return fail(cudaErrorInvalidValue);
	*p = NULL;
	if (size == 0)
		return cudaSuccess;
	size_t len = page_round(size);
	char *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED)
		return fail(cudaErrorMemoryAllocation);
	if (add_region((struct region){m, m, size, len, type, cur_dev}) != cudaSuccess) {
		munmap(m, len);
		return fail(cudaErrorMemoryAllocation);
	}
	*p = m;
	return cudaSuccess;
}

cudaError_t cudaMallocHost(void **p, size_t size)
{
	return host_alloc(p, size, R_PINNED);
}

cudaError_t cudaHostAlloc(void **p, size_t size, unsigned int flags)
{
	(void)flags;
	return host_alloc(p, size, R_PINNED);
}

cudaError_t cudaMallocManaged(void **p, size_t size, unsigned int flags)
{
	(void)flags;
	cudaError_t e = check_device(cur_dev);
	return e != cudaSuccess ? e : host_alloc(p, size, R_MANAGED);
}

/* Like the real one, freeing device memory waits for the device's work. */
cudaError_t cudaFree(void *p)
{
	if (!p)
		return cudaSuccess;
	struct region r;
	if (!take_region(p, 1u << R_DEVICE | 1u << R_MANAGED, &r))
		return fail(cudaErrorInvalidValue);
	int saved = cur_dev;
	cur_dev = r.device;
	cudaDeviceSynchronize();
	cur_dev = saved;
	munmap(r.ptr, r.map_size);
	if (r.shadow != r.ptr)
		munmap(r.shadow, r.map_size);
	return cudaSuccess;
}

cudaError_t cudaFreeHost(void *p)
{
	struct region r;
	if (!p)
		return cudaSuccess;
	if (!take_region(p, 1u << R_PINNED, &r))
		return fail(cudaErrorInvalidValue);
	munmap(r.ptr, r.map_size);
	return cudaSuccess;
}

cudaError_t cudaHostRegister(void *p, size_t size, unsigned int flags)
{
	(void)flags;
	if (!p || !size)
		return fail(cudaErrorInvalidValue);
	pthread_mutex_lock(&mem_lock);
	bool overlap = false;
	for (size_t i = 0; i < nregions; i++)
		overlap |= (char *)p < regions[i].ptr + regions[i].size &&
		           regions[i].ptr < (char *)p + size;
	pthread_mutex_unlock(&mem_lock);
	if (overlap)
		return fail(cudaErrorHostMemoryAlreadyRegistered);
	cudaError_t e = add_region((struct region){p, p, size, size, R_REGISTERED, cur_dev});
	return e == cudaSuccess ? e : fail(e);
}

cudaError_t cudaHostUnregister(void *p)
{
	struct region r;
	return take_region(p, 1u << R_REGISTERED, &r) ? cudaSuccess
	                                              : fail(cudaErrorHostMemoryNotRegistered);
}

/* CUDA 11 and later: memory CUDA does not know is "unregistered", and the
 * call succeeds. */
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *ptr)
{
	if (!a)
		return fail(cudaErrorInvalidValue);
	memset(a, 0, sizeof(*a));
	a->type = cudaMemoryTypeUnregistered;
	a->device = -2;
	a->hostPointer = (void *)(uintptr_t)ptr;
	pthread_mutex_lock(&mem_lock);
	struct region *r = ptr ? find_region(ptr) : NULL;
	if (r) {
		a->device = r->device;
		a->devicePointer = (void *)(uintptr_t)ptr;
		a->type = r->type == R_DEVICE    ? cudaMemoryTypeDevice
		          : r->type == R_MANAGED ? cudaMemoryTypeManaged
		                                 : cudaMemoryTypeHost;
		if (r->type == R_DEVICE)
			a->hostPointer = NULL;
	}
	pthread_mutex_unlock(&mem_lock);
	return cudaSuccess;
}

/* ---- copies ----------------------------------------------------------------- */

static void run_copy(struct op *op)
{
	memmove(op->dst, op->src, op->n);
	atomic_fetch_add(&stat_bytes[op->kind], op->n);
	atomic_fetch_add(&stat_ops[op->kind], 1);
}

static void run_set(struct op *op)
{
	memset(op->dst, op->value, op->n);
	atomic_fetch_add(&stat_bytes[cudaMemcpyDeviceToDevice], op->n);
	atomic_fetch_add(&stat_ops[cudaMemcpyDeviceToDevice], 1);
}

/* Whether an address of kind k may stand where want (K_HOST/K_DEVICE) is
 * asked: managed memory is both. */
static bool fits(enum kind k, enum kind want)
{
	return k == want || k == K_MANAGED;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
                            cudaStream_t stream)
{
	if (n == 0)
		return cudaSuccess;
	if (!dst || !src)
		return fail(cudaErrorInvalidValue);
	enum kind dk, sk;
	void *dh, *sh;
	if (resolve(dst, n, &dk, &dh, NULL) != cudaSuccess ||
	    resolve(src, n, &sk, &sh, NULL) != cudaSuccess)
		return fail(cudaErrorInvalidValue);
	if (kind == cudaMemcpyDefault)
		kind = (enum cudaMemcpyKind)((sk == K_DEVICE) << 1 | (dk == K_DEVICE));
	else if ((unsigned)kind > cudaMemcpyDeviceToDevice)
		return fail(cudaErrorInvalidMemcpyDirection);
	else if (!fits(sk, kind >> 1 ? K_DEVICE : K_HOST) ||
	         !fits(dk, kind & 1 ? K_DEVICE : K_HOST))
		return fail(cudaErrorInvalidValue);
	struct op *op = op_new(run_copy);
	if (!op)
		return fail(cudaErrorMemoryAllocation);
	op->dst = dh;
	op->src = sh;
	op->n = n;
	op->kind = kind;
	return enqueue(stream, op);
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind)
{
	cudaError_t e = cudaMemcpyAsync(dst, src, n, kind, NULL);
	return e != cudaSuccess ? e : cudaStreamSynchronize(NULL);
}

cudaError_t cudaMemsetAsync(void *p, int value, size_t n, cudaStream_t stream)
{
	if (n == 0)
		return cudaSuccess;
	enum kind k;
	void *h;
	if (!p || resolve(p, n, &k, &h, NULL) != cudaSuccess || !fits(k, K_DEVICE))
		return fail(cudaErrorInvalidValue);
	struct op *op = op_new(run_set);
	if (!op)
		return fail(cudaErrorMemoryAllocation);
	op->dst = h;
	op->n = n;
	op->value = value;
	return enqueue(stream, op);
}

cudaError_t cudaMemset(void *p, int value, size_t n)
{
	cudaError_t e = cudaMemsetAsync(p, value, n, NULL);
	return e != cudaSuccess ? e : cudaStreamSynchronize(NULL);
}

static void run_fn(struct op *op)
{
	op->fn(op->arg);
}

cudaError_t kolo_fake_cuda_enqueue(cudaStream_t stream, void (*fn)(void *), void *arg)
{
	if (!fn)
		return fail(cudaErrorInvalidValue);
	struct op *op = op_new(run_fn);
	if (!op)
		return fail(cudaErrorMemoryAllocation);
	op->fn = fn;
	op->arg = arg;
	return enqueue(stream, op);
}

cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void *userData)
{
	return kolo_fake_cuda_enqueue(stream, fn, userData);
}

/* ---- stream calls ------------------------------------------------------------ */

cudaError_t cudaStreamCreateWithPriority(cudaStream_t *p, unsigned int flags, int priority)
{
	(void)flags;
	(void)priority;
	if (!p)
		return fail(cudaErrorInvalidValue);
	cudaError_t e = check_device(cur_dev);
	if (e != cudaSuccess)
		return e;
	struct stream *s = stream_new(cur_dev);
	if (!s)
		return fail(cudaErrorMemoryAllocation);
	*p = (cudaStream_t)s;
	return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *p, unsigned int flags)
{
	return cudaStreamCreateWithPriority(p, flags, 0);
}

cudaError_t cudaStreamCreate(cudaStream_t *p)
{
	return cudaStreamCreateWithPriority(p, 0, 0);
}

/* Returns at once; the stream's queued work still runs (as in CUDA), and
 * the stream is reused only once it is idle. */
cudaError_t cudaStreamDestroy(cudaStream_t h)
{
	struct stream *s;
	if (!h || h == cudaStreamLegacy || h == cudaStreamPerThread)
		return fail(cudaErrorInvalidResourceHandle);
	cudaError_t e = get_stream(h, &s);
	if (e != cudaSuccess)
		return e;
	pthread_mutex_lock(&reg_lock);
	s->in_use = false;
	pthread_mutex_unlock(&reg_lock);
	return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t h)
{
	struct stream *s;
	cudaError_t e = get_stream(h, &s);
	if (e == cudaSuccess)
		stream_sync(s);
	return e;
}

cudaError_t cudaStreamQuery(cudaStream_t h)
{
	struct stream *s;
	cudaError_t e = get_stream(h, &s);
	if (e == cudaSuccess && !stream_idle(s))
		e = cudaErrorNotReady; /* a state, not an error: not recorded */
	return e;
}

/* ---- events ------------------------------------------------------------------ */

static void event_unref(struct event *e) /* under ev_lock */
{
	if (--e->refs == 0)
		free(e);
}

static void reach(struct op *op) /* under ev_lock */
{
	if (op->gen > op->ev->reached) {
		op->ev->reached = op->gen;
		clock_gettime(CLOCK_MONOTONIC, &op->ev->at);
	}
	event_unref(op->ev);
	pthread_cond_broadcast(&ev_cond);
}

static void run_wait(struct op *op)
{
	pthread_mutex_lock(&ev_lock);
	while (op->ev->reached < op->gen)
		pthread_cond_wait(&ev_cond, &ev_lock);
	event_unref(op->ev);
	pthread_mutex_unlock(&ev_lock);
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *p, unsigned int flags)
{
	if (!p)
		return fail(cudaErrorInvalidValue);
	struct event *e = calloc(1, sizeof(*e));
	if (!e)
		return fail(cudaErrorMemoryAllocation);
	e->flags = flags;
	e->refs = 1;
	*p = (cudaEvent_t)e;
	return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *p)
{
	return cudaEventCreateWithFlags(p, cudaEventDefault);
}

cudaError_t cudaEventDestroy(cudaEvent_t h)
{
	if (!h)
		return fail(cudaErrorInvalidResourceHandle);
	pthread_mutex_lock(&ev_lock);
	event_unref((struct event *)h);
	pthread_mutex_unlock(&ev_lock);
	return cudaSuccess;
}

/* op->gen is the generation to reach (record) or to wait for (wait). */
static cudaError_t event_op(cudaEvent_t h, cudaStream_t stream, void (*run)(struct op *),
                            bool record)
{
	struct stream *s;
	if (!h)
		return fail(cudaErrorInvalidResourceHandle);
	cudaError_t err = get_stream(stream, &s);
	struct op *op = err == cudaSuccess ? op_new(run) : NULL;
	if (!op)
		return err == cudaSuccess ? fail(cudaErrorMemoryAllocation) : err;
	struct event *e = (struct event *)h;
	pthread_mutex_lock(&ev_lock);
	op->ev = e;
	op->gen = record ? ++e->recorded : e->recorded;
	e->refs++;
	pthread_mutex_unlock(&ev_lock);
	return enqueue(stream, op);
}

cudaError_t cudaEventRecordWithFlags(cudaEvent_t event, cudaStream_t stream, unsigned int flags)
{
	(void)flags;
	return event_op(event, stream, NULL, true);
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
	return event_op(event, stream, NULL, true);
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags)
{
	(void)flags;
	return event_op(event, stream, run_wait, false);
}

cudaError_t cudaEventQuery(cudaEvent_t h)
{
	if (!h)
		return fail(cudaErrorInvalidResourceHandle);
	struct event *e = (struct event *)h;
	pthread_mutex_lock(&ev_lock);
	bool done = e->reached >= e->recorded;
	pthread_mutex_unlock(&ev_lock);
	return done ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t h)
{
	if (!h)
		return fail(cudaErrorInvalidResourceHandle);
	struct event *e = (struct event *)h;
	pthread_mutex_lock(&ev_lock);
	while (e->reached < e->recorded)
		pthread_cond_wait(&ev_cond, &ev_lock);
	pthread_mutex_unlock(&ev_lock);
	return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end)
{
	struct event *a = (struct event *)start, *b = (struct event *)end;
	if (!ms || !a || !b)
		return fail(cudaErrorInvalidValue);
	cudaError_t e = cudaSuccess;
	pthread_mutex_lock(&ev_lock);
	if ((a->flags | b->flags) & cudaEventDisableTiming || !a->recorded || !b->recorded)
		e = cudaErrorInvalidResourceHandle;
	else if (a->reached < a->recorded || b->reached < b->recorded)
		e = cudaErrorNotReady;
	else
		*ms = (float)((double)(b->at.tv_sec - a->at.tv_sec) * 1e3 +
		              (double)(b->at.tv_nsec - a->at.tv_nsec) / 1e6);
	pthread_mutex_unlock(&ev_lock);
	return e == cudaSuccess || e == cudaErrorNotReady ? e : fail(e);
}
