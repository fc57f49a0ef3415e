/* fake_cuda_test: the fake libcudart.so.13 and libnccl.so.2, opened by path
 * as libkolo opens the real ones: device memory the host cannot touch,
 * copies of every kind, streams that really run asynchronously, events,
 * pointer attributes, and NCCL collectives between forked rank processes
 * checked against a double reference computed here. */
#include <check.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kolo_fake.h"

/* clang-format off */
#define FNS(X)                                                                                     \
	X(cudaMalloc) X(cudaFree) X(cudaMemcpy) X(cudaMemcpyAsync) X(cudaMemset)                   \
	X(cudaMemsetAsync) X(cudaMallocHost) X(cudaFreeHost) X(cudaHostRegister)                   \
	X(cudaHostUnregister) X(cudaMallocManaged) X(cudaPointerGetAttributes) X(cudaStreamCreate) \
	X(cudaStreamDestroy) X(cudaStreamSynchronize) X(cudaStreamQuery) X(cudaStreamWaitEvent)    \
	X(cudaEventCreate) X(cudaEventRecord) X(cudaEventQuery) X(cudaEventSynchronize)            \
	X(cudaEventDestroy) X(cudaEventElapsedTime) X(cudaLaunchHostFunc) X(cudaSetDevice)         \
	X(cudaGetDeviceCount) X(cudaGetDeviceProperties) X(cudaGetLastError)                       \
	X(kolo_fake_cuda_shadow) X(kolo_fake_cuda_stats) X(ncclGetUniqueId) X(ncclCommInitRank)    \
	X(ncclAllReduce) X(ncclReduceScatter) X(ncclAllGather) X(ncclBroadcast) X(ncclReduce)      \
	X(ncclRedOpCreatePreMulSum) X(ncclRedOpDestroy) X(ncclCommAbort) X(ncclCommDestroy)        \
	X(ncclCommGetAsyncError) X(ncclGetVersion) X(ncclGetLastError)
/* clang-format on */
#define DECL(f) static __typeof__(&f) f##_p;
FNS(DECL)
#define F(f) (f##_p)

static void load(void)
{
	void *rt = dlopen(KOLO_FAKE_LIBDIR "/libcudart.so.13", RTLD_NOW | RTLD_GLOBAL);
	void *nc = dlopen(KOLO_FAKE_LIBDIR "/libnccl.so.2", RTLD_NOW | RTLD_GLOBAL);
	if (!rt || !nc) {
		fprintf(stderr, "dlopen: %s\n", dlerror());
		exit(1);
	}
	void *p;
#define LOAD(f)                                                                                    \
	if (!(p = dlsym(#f[0] == 'n' ? nc : rt, #f))) {                                            \
		fprintf(stderr, "dlsym %s: %s\n", #f, dlerror());                                  \
		exit(1);                                                                           \
	}                                                                                          \
	memcpy(&f##_p, &p, sizeof(p));
	FNS(LOAD)
}

#define CK(call) ck_assert_int_eq((int)(call), 0)

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* ---- memory -------------------------------------------------------------- */

START_TEST(device_memory_faults_on_host_access)
{
	char *d;
	CK(F(cudaMalloc)((void **)&d, 10000));
	char *sh = F(kolo_fake_cuda_shadow)(d);
	ck_assert_ptr_nonnull(sh);
	ck_assert_ptr_eq(F(kolo_fake_cuda_shadow)(d + 9999), sh + 9999);
	ck_assert_ptr_null(F(kolo_fake_cuda_shadow)(d + 10000));
	sh[5000] = 7; /* the shadow is the host's way in */
	for (int write = 0; write < 2; write++) {
		pid_t pid = fork();
		if (pid == 0) {
			signal(SIGSEGV, SIG_DFL); /* a sanitizer's handler would exit instead */
			volatile char *v = d + 5000;
			if (write)
				*v = 1;
			_exit(*v == 7 ? 0 : 3);
		}
		int st;
		ck_assert_int_eq(waitpid(pid, &st, 0), pid);
		ck_assert_msg(WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV,
		              "a host %s of device memory did not fault (status %#x)",
		              write ? "write" : "read", st);
	}
	CK(F(cudaFree)(d));
	ck_assert_ptr_null(F(kolo_fake_cuda_shadow)(d));
	ck_assert_int_eq(F(cudaFree)(d), cudaErrorInvalidValue);
	ck_assert_int_eq(F(cudaGetLastError)(), cudaErrorInvalidValue);
	ck_assert_int_eq(F(cudaGetLastError)(), cudaSuccess);
}
END_TEST

START_TEST(memcpy_every_kind)
{
	enum { N = 1000, SZ = 8192 };
	char *h = malloc(SZ), *h2 = calloc(1, SZ), *ph, *m, *d1, *d2;
	for (int i = 0; i < SZ; i++)
		h[i] = (char)(i * 7 + 1);
	CK(F(cudaMallocHost)((void **)&ph, SZ));
	CK(F(cudaMallocManaged)((void **)&m, SZ, cudaMemAttachGlobal));
	CK(F(cudaMalloc)((void **)&d1, SZ));
	CK(F(cudaMalloc)((void **)&d2, SZ));
	uint64_t b0[4], b1[4];
	F(kolo_fake_cuda_stats)(b0, NULL);
	CK(F(cudaMemcpy)(d1 + 100, h, N, cudaMemcpyHostToDevice));
	ck_assert_mem_eq(F(kolo_fake_cuda_shadow)(d1) + 100, h, N);
	CK(F(cudaMemcpy)(d2 + 7, d1 + 100, N, cudaMemcpyDeviceToDevice));
	ck_assert_mem_eq(F(kolo_fake_cuda_shadow)(d2) + 7, h, N);
	CK(F(cudaMemcpy)(ph + 3, d2 + 7, N, cudaMemcpyDeviceToHost));
	ck_assert_mem_eq(ph + 3, h, N);
	CK(F(cudaMemcpy)(m + 11, ph + 3, N, cudaMemcpyHostToHost));
	ck_assert_mem_eq(m + 11, h, N);
	/* Default: inferred from the addresses; managed memory stands for host. */
	CK(F(cudaMemcpy)(d1 + 4000, m + 11, N, cudaMemcpyDefault));    /* H2D */
	CK(F(cudaMemcpy)(d2 + 4001, d1 + 4000, N, cudaMemcpyDefault)); /* D2D */
	CK(F(cudaMemcpy)(h2 + 5, d2 + 4001, N, cudaMemcpyDefault));    /* D2H */
	CK(F(cudaMemcpy)(h2 + 2000, h2 + 5, N, cudaMemcpyDefault));    /* H2H */
	ck_assert_mem_eq(h2 + 5, h, N);
	ck_assert_mem_eq(h2 + 2000, h, N);
	F(kolo_fake_cuda_stats)(b1, NULL);
	for (int k = 0; k < 4; k++)
		ck_assert_uint_eq(b1[k] - b0[k], 2 * N);
	/* A wrong direction, a range past the allocation's end. */
	ck_assert_int_eq(F(cudaMemcpy)(h2, h, N, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
	ck_assert_int_eq(F(cudaMemcpy)(h2, d1, N, cudaMemcpyHostToHost), cudaErrorInvalidValue);
	ck_assert_int_eq(F(cudaMemcpy)(d1 + SZ - 10, h, 11, cudaMemcpyDefault),
	                 cudaErrorInvalidValue);
	ck_assert_int_eq(F(cudaMemcpy)(d1, h, 1, (enum cudaMemcpyKind)9),
	                 cudaErrorInvalidMemcpyDirection);
	CK(F(cudaMemset)(d1 + 1, 0x5a, 3));
	const char *s1 = F(kolo_fake_cuda_shadow)(d1);
	ck_assert(s1[0] == 0 && s1[1] == 0x5a && s1[3] == 0x5a && s1[4] == 0);
	ck_assert_int_eq(F(cudaMemset)(h2, 0, 1), cudaErrorInvalidValue);
	F(cudaGetLastError)();
	CK(F(cudaFree)(d1));
	CK(F(cudaFree)(d2));
	CK(F(cudaFree)(m));
	CK(F(cudaFreeHost)(ph));
	free(h);
	free(h2);
}
END_TEST

START_TEST(pointer_attributes_and_devices)
{
	struct cudaPointerAttributes a;
	int n;
	CK(F(cudaGetDeviceCount)(&n));
	ck_assert_int_eq(n, 3);
	struct cudaDeviceProp p[3];
	for (int i = 0; i < 3; i++) {
		char want[64];
		CK(F(cudaGetDeviceProperties)(&p[i], i));
		snprintf(want, sizeof(want), "kolo fake GPU %d", i);
		ck_assert_str_eq(p[i].name, want);
		for (int j = 0; j < i; j++) {
			ck_assert(memcmp(p[i].uuid.bytes, p[j].uuid.bytes, 16) != 0);
			ck_assert_int_ne(p[i].pciBusID, p[j].pciBusID);
		}
	}
	ck_assert_int_eq(F(cudaSetDevice)(3), cudaErrorInvalidDevice);
	char *d, *ph, *m, stack[64];
	CK(F(cudaSetDevice)(2));
	CK(F(cudaMalloc)((void **)&d, 4096));
	CK(F(cudaSetDevice)(1));
	CK(F(cudaMallocHost)((void **)&ph, 100));
	CK(F(cudaMallocManaged)((void **)&m, 100, cudaMemAttachGlobal));
	CK(F(cudaPointerGetAttributes)(&a, d + 4095));
	ck_assert_int_eq(a.type, cudaMemoryTypeDevice);
	ck_assert_int_eq(a.device, 2);
	ck_assert_ptr_eq(a.devicePointer, d + 4095);
	CK(F(cudaPointerGetAttributes)(&a, ph + 50));
	ck_assert_int_eq(a.type, cudaMemoryTypeHost);
	ck_assert_int_eq(a.device, 1);
	CK(F(cudaPointerGetAttributes)(&a, m));
	ck_assert_int_eq(a.type, cudaMemoryTypeManaged);
	CK(F(cudaPointerGetAttributes)(&a, stack + 1));
	ck_assert_int_eq(a.type, cudaMemoryTypeUnregistered);
	CK(F(cudaHostRegister)(stack, sizeof(stack), 0));
	ck_assert_int_eq(F(cudaHostRegister)(stack + 8, 8, 0),
	                 cudaErrorHostMemoryAlreadyRegistered);
	CK(F(cudaPointerGetAttributes)(&a, stack + 63));
	ck_assert_int_eq(a.type, cudaMemoryTypeHost);
	CK(F(cudaHostUnregister)(stack));
	ck_assert_int_eq(F(cudaHostUnregister)(stack), cudaErrorHostMemoryNotRegistered);
	CK(F(cudaPointerGetAttributes)(&a, stack));
	ck_assert_int_eq(a.type, cudaMemoryTypeUnregistered);
	CK(F(cudaFree)(d));
	CK(F(cudaPointerGetAttributes)(&a, d));
	ck_assert_int_eq(a.type, cudaMemoryTypeUnregistered);
	CK(F(cudaFree)(m));
	CK(F(cudaFreeHost)(ph));
	F(cudaGetLastError)();
}
END_TEST

/* ---- streams and events -------------------------------------------------- */

/* A host function that blocks its stream until the test opens it. */
struct gate {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int entered, open;
	int order[4], norder;
};
static struct gate g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, {0}, 0};

static void gate_fn(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&g.mu);
	g.entered++;
	pthread_cond_broadcast(&g.cv);
	while (!g.open)
		pthread_cond_wait(&g.cv, &g.mu);
	pthread_mutex_unlock(&g.mu);
}

static void gate_wait_entered(int n)
{
	pthread_mutex_lock(&g.mu);
	while (g.entered < n)
		pthread_cond_wait(&g.cv, &g.mu);
	pthread_mutex_unlock(&g.mu);
}

static void gate_open(void)
{
	pthread_mutex_lock(&g.mu);
	g.open = 1;
	pthread_cond_broadcast(&g.cv);
	pthread_mutex_unlock(&g.mu);
}

static void mark_fn(void *arg) /* notes that its stream reached it */
{
	pthread_mutex_lock(&g.mu);
	g.order[g.norder++] = (int)(intptr_t)arg;
	g.entered++;
	pthread_cond_broadcast(&g.cv);
	pthread_mutex_unlock(&g.mu);
}

START_TEST(async_copy_waits_for_host_function)
{
	enum { N = 1 << 16 };
	char *d, *ph, *h = malloc(N), *h2 = malloc(N);
	for (int i = 0; i < N; i++)
		h[i] = (char)(i ^ 0x33);
	CK(F(cudaMalloc)((void **)&d, N));
	CK(F(cudaMallocHost)((void **)&ph, N));
	memset(ph, 0, N);
	CK(F(cudaMemcpy)(d, h, N, cudaMemcpyHostToDevice));
	cudaStream_t s;
	cudaEvent_t e0, e1;
	CK(F(cudaStreamCreate)(&s));
	CK(F(cudaEventCreate)(&e0));
	CK(F(cudaEventCreate)(&e1));
	CK(F(cudaEventQuery)(e1)); /* never recorded: complete */
	CK(F(cudaEventRecord)(e0, s));
	CK(F(cudaLaunchHostFunc)(s, gate_fn, NULL));
	CK(F(cudaMemcpyAsync)(ph, d, N, cudaMemcpyDeviceToHost, s));
	CK(F(cudaEventRecord)(e1, s));
	gate_wait_entered(1);
	ck_assert_int_eq(F(cudaEventQuery)(e1), cudaErrorNotReady);
	ck_assert_int_eq(F(cudaStreamQuery)(s), cudaErrorNotReady);
	float ms;
	ck_assert_int_eq(F(cudaEventElapsedTime)(&ms, e0, e1), cudaErrorNotReady);
	ck_assert_int_eq(ph[1], 0);
	/* The legacy stream does not wait for s. */
	CK(F(cudaMemcpy)(h2, d, N, cudaMemcpyDeviceToHost));
	ck_assert_mem_eq(h2, h, N);
	gate_open();
	CK(F(cudaEventSynchronize)(e1));
	ck_assert_mem_eq(ph, h, N);
	CK(F(cudaEventQuery)(e1));
	CK(F(cudaStreamQuery)(s));
	CK(F(cudaEventElapsedTime)(&ms, e0, e1));
	ck_assert(ms >= 0);
	CK(F(cudaEventDestroy)(e0));
	CK(F(cudaEventDestroy)(e1));
	CK(F(cudaStreamDestroy)(s));
	ck_assert_int_eq(F(cudaStreamSynchronize)(s), cudaErrorInvalidResourceHandle);
	F(cudaGetLastError)();
	CK(F(cudaFree)(d));
	CK(F(cudaFreeHost)(ph));
	free(h);
	free(h2);
}
END_TEST

START_TEST(stream_waits_for_event_of_another)
{
	enum { N = 4096 };
	char *d, *ph;
	CK(F(cudaMalloc)((void **)&d, N));
	CK(F(cudaMallocHost)((void **)&ph, N));
	memset(ph, 0, N);
	CK(F(cudaMemset)(d, 0, N));
	cudaStream_t s1, s2;
	cudaEvent_t e, e2;
	CK(F(cudaStreamCreate)(&s1));
	CK(F(cudaStreamCreate)(&s2));
	CK(F(cudaEventCreate)(&e));
	CK(F(cudaEventCreate)(&e2));
	CK(F(cudaLaunchHostFunc)(s1, gate_fn, NULL));
	CK(F(cudaMemsetAsync)(d, 0x5a, N, s1));
	CK(F(cudaLaunchHostFunc)(s1, mark_fn, (void *)1));
	CK(F(cudaEventRecord)(e, s1));
	CK(F(cudaLaunchHostFunc)(s2, mark_fn, (void *)2));
	CK(F(cudaStreamWaitEvent)(s2, e, 0));
	CK(F(cudaMemcpyAsync)(ph, d, N, cudaMemcpyDeviceToHost, s2));
	CK(F(cudaLaunchHostFunc)(s2, mark_fn, (void *)3));
	CK(F(cudaEventRecord)(e2, s2));
	gate_wait_entered(2); /* s1 is in the gate, s2 past its first mark */
	ck_assert_int_eq(F(cudaEventQuery)(e2), cudaErrorNotReady);
	gate_open();
	CK(F(cudaStreamSynchronize)(s2));
	CK(F(cudaEventQuery)(e));
	for (int i = 0; i < N; i++)
		ck_assert_int_eq(ph[i], 0x5a);
	pthread_mutex_lock(&g.mu);
	ck_assert_int_eq(g.norder, 3);
	ck_assert(g.order[0] == 2 && g.order[1] == 1 && g.order[2] == 3);
	pthread_mutex_unlock(&g.mu);
	CK(F(cudaEventDestroy)(e));
	CK(F(cudaEventDestroy)(e2));
	CK(F(cudaStreamDestroy)(s1));
	CK(F(cudaStreamDestroy)(s2));
	CK(F(cudaFree)(d));
	CK(F(cudaFreeHost)(ph));
}
END_TEST

/* ---- NCCL between forked ranks ------------------------------------------- */

static ncclUniqueId id;
static int pipefd[2] = {-1, -1};

/* Forks n ranks running fn; the exit status of each in st[]. */
static void run_ranks(int n, int (*fn)(int, int), int *st)
{
	pid_t pid[4];
	CK(F(ncclGetUniqueId)(&id));
	for (int r = 0; r < n; r++) {
		pid[r] = fork();
		ck_assert_int_ge(pid[r], 0);
		if (pid[r] == 0)
			_exit(fn(r, n));
	}
	if (pipefd[0] >= 0) { /* the ranks hold it now */
		close(pipefd[0]);
		close(pipefd[1]);
		pipefd[0] = pipefd[1] = -1;
	}
	for (int r = 0; r < n; r++)
		ck_assert_int_eq(waitpid(pid[r], &st[r], 0), pid[r]);
}

static void expect_exit0(int n, int (*fn)(int, int))
{
	int st[4];
	run_ranks(n, fn, st);
	for (int r = 0; r < n; r++)
		ck_assert_msg(WIFEXITED(st[r]) && WEXITSTATUS(st[r]) == 0,
		              "rank %d of %d: status %#x", r, n, st[r]);
}

#define RCHECK(cond, ...)                                                                          \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			fprintf(stderr, "rank %d: line %d: ", rank, __LINE__);                     \
			fprintf(stderr, __VA_ARGS__);                                              \
			fprintf(stderr, "\n");                                                     \
			return 1;                                                                  \
		}                                                                                  \
	} while (0)

/* Inputs exactly representable in half precision; prod near 1. */
static double input(int rank, size_t i, int op)
{
	if (op == ncclProd)
		return 1 + (double)((i + (size_t)rank) % 5) / 64;
	return (double)((int)((i * 13 + (size_t)rank * 7) % 41) - 20) / 4;
}

/* Half precision by hand (no compiler type for it everywhere): the inputs
 * are exact in it, so no rounding is needed on the way in. */
static uint16_t to_half(double v)
{
	int e;
	double m = frexp(fabs(v), &e); /* v = m * 2^e, m in [0.5, 1) */
	if (v == 0)
		return 0;
	return (uint16_t)((v < 0) << 15 | (e + 14) << 10 | ((unsigned)ldexp(m, 11) & 1023));
}

static double from_half(uint16_t h)
{
	int e = (h >> 10) & 31, m = h & 1023;
	double v = e ? ldexp(1024 + m, e - 25) : ldexp(m, -24);
	return h >> 15 ? -v : v;
}

static void put(int f16, void *buf, size_t i, double v)
{
	if (f16)
		((uint16_t *)buf)[i] = to_half(v);
	else
		((float *)buf)[i] = (float)v;
}

static double get(int f16, const void *buf, size_t i)
{
	return f16 ? from_half(((const uint16_t *)buf)[i]) : (double)((const float *)buf)[i];
}

static double ref_reduce(int op, int n, size_t i, const double *scale)
{
	double acc = input(0, i, op) * (scale ? scale[0] : 1);
	for (int r = 1; r < n; r++) {
		double v = input(r, i, op) * (scale ? scale[r] : 1);
		acc = op == ncclProd  ? acc * v
		      : op == ncclMax ? fmax(acc, v)
		      : op == ncclMin ? fmin(acc, v)
		                      : acc + v;
	}
	return op == ncclAvg ? acc / n : acc;
}

static int close_enough(int f16, double got, double want)
{
	return fabs(got - want) <= (f16 ? 2e-3 : 1e-6) * (1 + fabs(want));
}

/* Every collective, float32 and float16, counts that span several chunks. */
static int rank_collectives(int rank, int n)
{
	const size_t count = 40009; /* elements: several 64 KiB slots, a partial one */
	ncclComm_t comm;
	cudaStream_t s;
	RCHECK(F(cudaSetDevice)(rank) == 0, "setdevice");
	RCHECK(F(ncclCommInitRank)(&comm, n, id, rank) == 0, "init");
	RCHECK(F(cudaStreamCreate)(&s) == 0, "stream");
	size_t big = count * (size_t)n * 4;
	void *h = malloc(big), *out = malloc(big), *dsend, *drecv;
	RCHECK(F(cudaMalloc)(&dsend, big) == 0 && F(cudaMalloc)(&drecv, big) == 0, "malloc");
	for (int f16 = 0; f16 < 2; f16++) {
		ncclDataType_t t = f16 ? ncclFloat16 : ncclFloat32;
		size_t es = f16 ? 2 : 4;
		double scale[4];
		for (int r = 0; r < n; r++)
			scale[r] = 0.5 * (r + 1);
		for (int op = 0; op <= ncclNumOps; op++) { /* ncclNumOps: PreMulSum */
			int bop = op == ncclNumOps ? ncclSum : op;
			for (size_t i = 0; i < count; i++)
				put(f16, h, i, input(rank, i, bop));
			ncclRedOp_t rop = (ncclRedOp_t)op;
			uint16_t s16 = to_half(scale[rank]);
			float s32 = (float)scale[rank];
			if (op == ncclNumOps)
				RCHECK(F(ncclRedOpCreatePreMulSum)(
				               &rop, f16 ? (void *)&s16 : (void *)&s32, t,
				               ncclScalarHostImmediate, comm) == 0,
				       "premulsum");
			/* Sum in place, the others out of place. */
			void *dst = op == ncclSum ? dsend : drecv;
			RCHECK(F(cudaMemcpyAsync)(dsend, h, count * es, cudaMemcpyHostToDevice,
			                          s) == 0,
			       "h2d");
			RCHECK(F(ncclAllReduce)(dsend, dst, count, t, rop, comm, s) == 0,
			       "allreduce");
			RCHECK(F(cudaMemcpyAsync)(out, dst, count * es, cudaMemcpyDeviceToHost,
			                          s) == 0,
			       "d2h");
			RCHECK(F(cudaStreamSynchronize)(s) == 0, "sync");
			for (size_t i = 0; i < count; i++) {
				double want =
				        ref_reduce(bop, n, i, op == ncclNumOps ? scale : NULL);
				RCHECK(close_enough(f16, get(f16, out, i), want),
				       "allreduce f16=%d op %d [%zu]: %g, want %g", f16, op, i,
				       get(f16, out, i), want);
			}
			if (op == ncclNumOps)
				RCHECK(F(ncclRedOpDestroy)(rop, comm) == 0, "op destroy");
		}
		/* Reduce-scatter (sum): block j of every rank's input reduced on rank j. */
		for (size_t i = 0; i < count * (size_t)n; i++)
			put(f16, h, i, input(rank, i, ncclSum));
		RCHECK(F(cudaMemcpy)(dsend, h, count * (size_t)n * es, cudaMemcpyHostToDevice) == 0,
		       "h2d");
		RCHECK(F(ncclReduceScatter)(dsend, drecv, count, t, ncclSum, comm, s) == 0, "rs");
		RCHECK(F(cudaStreamSynchronize)(s) == 0 &&
		               F(cudaMemcpy)(out, drecv, count * es, cudaMemcpyDeviceToHost) == 0,
		       "rs copy");
		for (size_t i = 0; i < count; i++) {
			double want = ref_reduce(ncclSum, n, (size_t)rank * count + i, NULL);
			RCHECK(close_enough(f16, get(f16, out, i), want), "rs f16=%d [%zu]", f16,
			       i);
		}
		/* Allgather, then broadcast from the last rank, then reduce (max) to rank 0. */
		for (size_t i = 0; i < count; i++)
			put(f16, h, i, input(rank, i, ncclSum));
		RCHECK(F(cudaMemcpy)(dsend, h, count * es, cudaMemcpyHostToDevice) == 0, "h2d");
		RCHECK(F(ncclAllGather)(dsend, drecv, count, t, comm, s) == 0, "allgather");
		RCHECK(F(cudaStreamSynchronize)(s) == 0 &&
		               F(cudaMemcpy)(out, drecv, count * (size_t)n * es,
		                             cudaMemcpyDeviceToHost) == 0,
		       "ag copy");
		for (size_t i = 0; i < count * (size_t)n; i++)
			RCHECK(get(f16, out, i) == input((int)(i / count), i % count, ncclSum),
			       "allgather f16=%d [%zu]", f16, i);
		int root = n - 1;
		RCHECK(F(ncclBroadcast)(rank == root ? dsend : NULL, drecv, count, t, root, comm,
		                        s) == 0,
		       "broadcast");
		RCHECK(F(ncclReduce)(dsend, dsend, count, t, ncclMax, 0, comm, s) == 0, "reduce");
		RCHECK(F(cudaStreamSynchronize)(s) == 0 &&
		               F(cudaMemcpy)(out, drecv, count * es, cudaMemcpyDeviceToHost) == 0,
		       "bc copy");
		for (size_t i = 0; i < count; i++)
			RCHECK(get(f16, out, i) == input(root, i, ncclSum),
			       "broadcast f16=%d [%zu]", f16, i);
		if (rank == 0) {
			RCHECK(F(cudaMemcpy)(out, dsend, count * es, cudaMemcpyDeviceToHost) == 0,
			       "copy");
			for (size_t i = 0; i < count; i++)
				RCHECK(get(f16, out, i) == ref_reduce(ncclMax, n, i, NULL),
				       "reduce f16=%d [%zu]", f16, i);
		}
	}
	/* Host memory is refused, as by NCCL. */
	RCHECK(F(ncclAllReduce)(h, drecv, count, ncclFloat32, ncclSum, comm, s) ==
	               ncclInvalidArgument,
	       "host buffer accepted");
	ncclResult_t ae;
	RCHECK(F(ncclCommGetAsyncError)(comm, &ae) == 0 && ae == ncclSuccess, "async error %d", ae);
	RCHECK(F(ncclCommDestroy)(comm) == 0, "destroy");
	F(cudaFree)(dsend);
	F(cudaFree)(drecv);
	free(h);
	free(out);
	return 0;
}

START_TEST(nccl_collectives_2_and_3_ranks)
{
	setenv("KOLO_FAKE_NCCL_SLOT_BYTES", "65536", 1);
	int v;
	CK(F(ncclGetVersion)(&v));
	ck_assert_int_eq(v, 22809);
	expect_exit0(2, rank_collectives);
	expect_exit0(3, rank_collectives);
}
END_TEST

static int rank_same_device(int rank, int n)
{
	ncclComm_t comm;
	RCHECK(F(cudaSetDevice)(0) == 0, "setdevice");
	ncclResult_t r = F(ncclCommInitRank)(&comm, n, id, rank);
	RCHECK(r == ncclInvalidUsage, "init on a shared GPU: %d", r);
	return 0;
}

START_TEST(nccl_refuses_two_ranks_on_one_gpu)
{
	expect_exit0(2, rank_same_device);
}
END_TEST

/* Rank 0 aborts while rank 1 waits in an allreduce; rank 0 stays alive
 * until the parent closes the pipe, so it is the abort that rank 1 sees. */
static int rank_abort(int rank, int n)
{
	ncclComm_t comm;
	cudaStream_t s;
	void *d;
	char c = 0;
	RCHECK(F(cudaSetDevice)(rank) == 0 && F(cudaStreamCreate)(&s) == 0, "setup");
	RCHECK(F(cudaMalloc)(&d, 4096) == 0, "malloc");
	RCHECK(F(ncclCommInitRank)(&comm, n, id, rank) == 0, "init");
	if (rank == 0) {
		close(pipefd[1]);
		RCHECK(read(pipefd[0], &c, 1) == 1, "read"); /* rank 1 is in its allreduce */
		RCHECK(F(ncclCommAbort)(comm) == 0, "abort");
		RCHECK(read(pipefd[0], &c, 1) == 0, "read eof");
		return 0;
	}
	double t0 = now_s();
	RCHECK(F(ncclAllReduce)(d, d, 1024, ncclFloat32, ncclSum, comm, s) == 0, "allreduce");
	RCHECK(write(pipefd[1], &c, 1) == 1, "write");
	close(pipefd[1]);
	RCHECK(F(cudaStreamSynchronize)(s) == 0, "sync");
	ncclResult_t ae;
	RCHECK(F(ncclCommGetAsyncError)(comm, &ae) == 0 && ae == ncclRemoteError, "async error %d",
	       ae);
	RCHECK(now_s() - t0 < 10, "took %.1f s (the timeout, not the abort)", now_s() - t0);
	RCHECK(strstr(F(ncclGetLastError)(comm), "aborted"), "why: %s", F(ncclGetLastError)(comm));
	F(ncclCommAbort)(comm);
	return 0;
}

START_TEST(nccl_abort_wakes_waiting_peer)
{
	setenv("KOLO_FAKE_NCCL_TIMEOUT_MS", "20000", 1);
	ck_assert_int_eq(pipe(pipefd), 0);
	int st[2];
	run_ranks(2, rank_abort, st);
	for (int r = 0; r < 2; r++)
		ck_assert_msg(WIFEXITED(st[r]) && WEXITSTATUS(st[r]) == 0, "rank %d: %#x", r,
		              st[r]);
}
END_TEST

static void die_fn(void *arg)
{
	(void)arg;
	raise(SIGKILL);
}

/* One allreduce that all complete, then rank 0 dies as the next begins. */
static int rank_killed(int rank, int n)
{
	ncclComm_t comm;
	cudaStream_t s;
	float *d, x = 1;
	RCHECK(F(cudaSetDevice)(rank) == 0 && F(cudaStreamCreate)(&s) == 0, "setup");
	RCHECK(F(cudaMalloc)((void **)&d, 1 << 22) == 0, "malloc");
	RCHECK(F(cudaMemcpy)(d, &x, 4, cudaMemcpyHostToDevice) == 0, "h2d");
	RCHECK(F(ncclCommInitRank)(&comm, n, id, rank) == 0, "init");
	RCHECK(F(ncclAllReduce)(d, d, 1, ncclFloat32, ncclSum, comm, s) == 0, "allreduce");
	RCHECK(F(cudaStreamSynchronize)(s) == 0, "sync"); /* the legacy stream would not wait */
	RCHECK(F(cudaMemcpy)(&x, d, 4, cudaMemcpyDeviceToHost) == 0 && x == (float)n, "sum %g", x);
	double t0 = now_s();
	if (rank == 0)
		F(cudaLaunchHostFunc)(s, die_fn, NULL);
	RCHECK(F(ncclAllReduce)(d, d, 1 << 20, ncclFloat32, ncclSum, comm, s) == 0, "allreduce");
	RCHECK(F(cudaStreamSynchronize)(s) == 0, "sync");
	ncclResult_t ae;
	RCHECK(F(ncclCommGetAsyncError)(comm, &ae) == 0 && ae == ncclRemoteError, "async error %d",
	       ae);
	RCHECK(now_s() - t0 < 10, "took %.1f s (the timeout, not the death)", now_s() - t0);
	RCHECK(strstr(F(ncclGetLastError)(comm), "died"), "why: %s", F(ncclGetLastError)(comm));
	/* Later collectives fail at once. */
	RCHECK(F(ncclAllReduce)(d, d, 1, ncclFloat32, ncclSum, comm, s) == 0, "allreduce");
	RCHECK(F(cudaStreamSynchronize)(s) == 0, "sync");
	F(ncclCommAbort)(comm);
	return 0;
}

START_TEST(nccl_peer_killed_mid_collective)
{
	setenv("KOLO_FAKE_NCCL_TIMEOUT_MS", "20000", 1);
	int st[3];
	run_ranks(3, rank_killed, st);
	ck_assert_msg(WIFSIGNALED(st[0]) && WTERMSIG(st[0]) == SIGKILL, "rank 0: %#x", st[0]);
	for (int r = 1; r < 3; r++)
		ck_assert_msg(WIFEXITED(st[r]) && WEXITSTATUS(st[r]) == 0, "rank %d: %#x", r,
		              st[r]);
}
END_TEST

START_TEST(nccl_init_times_out)
{
	setenv("KOLO_FAKE_NCCL_TIMEOUT_MS", "300", 1);
	ncclComm_t comm;
	CK(F(ncclGetUniqueId)(&id));
	double t0 = now_s();
	ck_assert_int_eq(F(ncclCommInitRank)(&comm, 2, id, 0), ncclSystemError);
	double took = now_s() - t0;
	ck_assert_msg(took >= 0.29 && took < 10, "took %.2f s", took);
}
END_TEST

static Suite *fake_suite(void)
{
	Suite *s = suite_create("fake_cuda");
	TCase *tc = tcase_create("cudart");
	tcase_add_test(tc, device_memory_faults_on_host_access);
	tcase_add_test(tc, memcpy_every_kind);
	tcase_add_test(tc, pointer_attributes_and_devices);
	tcase_add_test(tc, async_copy_waits_for_host_function);
	tcase_add_test(tc, stream_waits_for_event_of_another);
	suite_add_tcase(s, tc);
	tc = tcase_create("nccl");
	tcase_add_test(tc, nccl_collectives_2_and_3_ranks);
	tcase_add_test(tc, nccl_refuses_two_ranks_on_one_gpu);
	tcase_add_test(tc, nccl_abort_wakes_waiting_peer);
	tcase_add_test(tc, nccl_peer_killed_mid_collective);
	tcase_add_test(tc, nccl_init_times_out);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	/* Before any call into the fake, which reads it once. */
	setenv("KOLO_FAKE_CUDA_DEVICES", "3", 1);
	load();
	SRunner *sr = srunner_create(fake_suite());
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
