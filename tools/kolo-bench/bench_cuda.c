/* kolo-bench's CUDA side: device buffers for --device cuda and the copybw
 * subcommand (pinned host <-> device bandwidth, the other half of the limit
 * a staged device allreduce is held to).
 *
 * kolo-bench opens libcudart itself (dlopen) rather than through libkolo:
 * the bench needs cudaMalloc, cudaMemcpy and streams, which libkolo's public
 * API does not offer, and opening the very file libkolo loaded
 * (kolo_cuda_query's cudart_path) keeps the two on one runtime, so pointers
 * from one are device memory to the other. Nothing here needs a CUDA header:
 * the few types are pointers and ints, and the functions' form has not
 * changed since CUDA 11. */
#include <dlfcn.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"
#include "gpu.h"
#include "kolo/kolo.h"

/* cudaMemcpyDefault: the direction from the pointers (unified addressing). */
#define MEMCPY_DEFAULT 4

struct cudart {
	void *lib;
	int (*get_device_count)(int *);
	int (*set_device)(int);
	int (*malloc)(void **, size_t);
	int (*free)(void *);
	int (*malloc_host)(void **, size_t);
	int (*free_host)(void *);
	int (*memcpy)(void *, const void *, size_t, int);
	int (*memcpy_async)(void *, const void *, size_t, int, void *);
	int (*memset)(void *, int, size_t);
	int (*stream_create)(void **);
	int (*stream_destroy)(void *);
	int (*stream_synchronize)(void *);
	int (*device_synchronize)(void);
	const char *(*get_error_string)(int);
};

static struct cudart rt;

static const char *cuda_err(int rc)
{
	const char *s = rt.get_error_string ? rt.get_error_string(rc) : NULL;
	return s ? s : "unknown CUDA error";
}

int bench_cuda_open(int local_rank, struct bench_dev *dev, char *why, size_t why_size)
{
	const char *reason = NULL;
	if (!kolo_cuda_devices_visible(&reason)) {
		snprintf(why, why_size, "no CUDA device: %s",
		         reason ? reason : "(no reason given)");
		return -1;
	}
	static struct kolo_cuda_info info;
	kolo_cuda_query(&info);
	if (rt.lib == NULL) {
		/* The file libkolo loaded, so that both sides share one runtime. */
		const char *names[] = {info.cudart_path, "libcudart.so.13", "libcudart.so.12",
		                       "libcudart.so"};
		void *lib = NULL;
		for (size_t i = 0; i < sizeof(names) / sizeof(names[0]) && !lib; i++)
			if (names[i][0] != '\0')
				lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
		if (lib == NULL) {
			snprintf(why, why_size, "cannot open libcudart: %s", dlerror());
			return -1;
		}
		struct {
			void **slot;
			const char *name;
		} syms[] = {
		        {(void **)&rt.get_device_count, "cudaGetDeviceCount"},
		        {(void **)&rt.set_device, "cudaSetDevice"},
		        {(void **)&rt.malloc, "cudaMalloc"},
		        {(void **)&rt.free, "cudaFree"},
		        {(void **)&rt.malloc_host, "cudaMallocHost"},
		        {(void **)&rt.free_host, "cudaFreeHost"},
		        {(void **)&rt.memcpy, "cudaMemcpy"},
		        {(void **)&rt.memcpy_async, "cudaMemcpyAsync"},
		        {(void **)&rt.memset, "cudaMemset"},
		        {(void **)&rt.stream_create, "cudaStreamCreate"},
		        {(void **)&rt.stream_destroy, "cudaStreamDestroy"},
		        {(void **)&rt.stream_synchronize, "cudaStreamSynchronize"},
		        {(void **)&rt.device_synchronize, "cudaDeviceSynchronize"},
		        {(void **)&rt.get_error_string, "cudaGetErrorString"},
		};
		for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++) {
			/* POSIX: a function pointer travels through void *. */
			*syms[i].slot = dlsym(lib, syms[i].name);
			if (*syms[i].slot == NULL) {
				snprintf(why, why_size, "libcudart has no %s", syms[i].name);
				dlclose(lib);
				memset(&rt, 0, sizeof(rt));
				return -1;
			}
		}
		rt.lib = lib;
	}
	int n = 0, rc = rt.get_device_count(&n);
	if (rc != 0 || n <= 0) {
		snprintf(why, why_size, "no CUDA device: cudaGetDeviceCount: %s",
		         rc ? cuda_err(rc) : "0 devices");
		return -1;
	}
	/* Ranks of a host take the GPUs in turn; with one GPU they share it. */
	dev->ordinal = local_rank % n;
	dev->count = n;
	if ((rc = rt.set_device(dev->ordinal)) != 0) {
		snprintf(why, why_size, "cudaSetDevice(%d): %s", dev->ordinal, cuda_err(rc));
		return -1;
	}
	snprintf(dev->name, sizeof(dev->name), "%s",
	         dev->ordinal < info.ngpus ? info.gpus[dev->ordinal].name : "(unnamed GPU)");
	return 0;
}

void *bench_cuda_malloc(size_t bytes, char *why, size_t why_size)
{
	void *p = NULL;
	int rc = rt.malloc(&p, bytes ? bytes : 1);
	if (rc != 0) {
		snprintf(why, why_size, "cudaMalloc(%zu): %s", bytes, cuda_err(rc));
		return NULL;
	}
	return p;
}

void bench_cuda_free(void *p)
{
	if (p && rt.free)
		rt.free(p);
}

int bench_cuda_copy(void *dst, const void *src, size_t bytes, char *why, size_t why_size)
{
	if (bytes == 0)
		return 0;
	int rc = rt.memcpy(dst, src, bytes, MEMCPY_DEFAULT);
	if (rc != 0) {
		snprintf(why, why_size, "cudaMemcpy(%zu bytes): %s", bytes, cuda_err(rc));
		return -1;
	}
	return 0;
}

/* ---- copybw --------------------------------------------------------------- */

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Seconds per copy of bytes, the mean over iters after one untimed copy;
 * both directions at once when dst2 is set (two streams). */
static int time_copies(void *dst, const void *src, void *dst2, const void *src2, size_t bytes,
                       int iters, void *s1, void *s2, double *out)
{
	int rc = 0;
	double t0 = 0;
	for (int i = 0; i <= iters && rc == 0; i++) {
		if (i == 1)
			t0 = now_s();
		rc = rt.memcpy_async(dst, src, bytes, MEMCPY_DEFAULT, s1);
		if (rc == 0 && dst2)
			rc = rt.memcpy_async(dst2, src2, bytes, MEMCPY_DEFAULT, s2);
		if (rc == 0)
			rc = rt.stream_synchronize(s1);
		if (rc == 0 && dst2)
			rc = rt.stream_synchronize(s2);
	}
	*out = (now_s() - t0) / iters;
	return rc;
}

static void copybw_usage(FILE *f)
{
	fprintf(f, "usage: [kolorun -np N --] kolo-bench copybw [options]\n"
	           "  -b, --minbytes SIZE   smallest size (default 1K)\n"
	           "  -e, --maxbytes SIZE   largest size (default 256M)\n"
	           "  -f, --stepfactor N    multiply the size by N each step (default 4)\n"
	           "  -n, --iters N         copies per size and direction (default: about 1 GiB,\n"
	           "                        5..200)\n"
	           "      --json            one JSON object per size\n"
	           "Pinned host memory (cudaMallocHost) to and from device memory (cudaMalloc)\n"
	           "with cudaMemcpyAsync on a stream of its own: h2d, d2h, and both at once\n"
	           "(bidir, the bandwidth of each direction while the other runs, as a staged\n"
	           "pipeline copies). Under kolorun every rank copies at the same time on\n"
	           "its GPU (local rank mod GPUs), as the ranks of a staged collective do; the\n"
	           "figures are the slowest rank's.\n");
}

int kolo_bench_copybw(int argc, char **argv)
{
	static const struct option longopts[] = {
	        {"minbytes", required_argument, NULL, 'b'},
	        {"maxbytes", required_argument, NULL, 'e'},
	        {"stepfactor", required_argument, NULL, 'f'},
	        {"iters", required_argument, NULL, 'n'},
	        {"json", no_argument, NULL, 'j'},
	        {"help", no_argument, NULL, 'h'},
	        {NULL, 0, NULL, 0},
	};
	uint64_t minb = 1ull << 10, maxb = 256ull << 20;
	int factor = 4, iters_opt = 0;
	bool json = false;
	optind = 1;
	int c;
	while ((c = getopt_long(argc, argv, "b:e:f:n:h", longopts, NULL)) != -1) {
		char *end;
		long v;
		switch (c) {
		case 'b':
			if (kolo_bench_parse_size(optarg, &minb) != 0 || minb == 0)
				goto bad;
			break;
		case 'e':
			if (kolo_bench_parse_size(optarg, &maxb) != 0 || maxb == 0)
				goto bad;
			break;
		case 'f':
		case 'n':
			v = strtol(optarg, &end, 10);
			if (end == optarg || *end != '\0' || v < (c == 'f' ? 2 : 1) || v > 1000000)
				goto bad;
			*(c == 'f' ? &factor : &iters_opt) = (int)v;
			break;
		case 'j':
			json = true;
			break;
		case 'h':
			copybw_usage(stdout);
			return 0;
		default:
			copybw_usage(stderr);
			return 2;
		}
	}
	if (optind != argc || minb > maxb) {
		copybw_usage(stderr);
		return 2;
	}

	/* Under kolorun the ranks start each size together and report the
	 * slowest; alone, it is one process. */
	kolo_comm_t *comm = NULL;
	int rank = 0, size = 1, local = 0;
	if (getenv("KOLO_RENDEZVOUS")) {
		kolo_status_t st = kolo_init(&comm);
		if (st != KOLO_OK) {
			fprintf(stderr, "kolo-bench copybw: kolo_init: %s: %s\n",
			        kolo_status_name(st), kolo_init_error());
			return 1;
		}
		rank = kolo_rank(comm);
		size = kolo_size(comm);
		local = kolo_local_rank(comm);
	}
	int rc = 1;
	char why[512] = "";
	struct bench_dev dev;
	void *host = NULL, *host2 = NULL, *d1 = NULL, *d2 = NULL, *s1 = NULL, *s2 = NULL;
	if (bench_cuda_open(local, &dev, why, sizeof(why)) != 0) {
		fprintf(stderr, "kolo-bench copybw: rank %d: %s\n", rank, why);
		goto out;
	}
	int e;
	if ((e = rt.malloc_host(&host, maxb)) != 0 || (e = rt.malloc_host(&host2, maxb)) != 0) {
		fprintf(stderr, "kolo-bench copybw: cudaMallocHost(%" PRIu64 "): %s\n", maxb,
		        cuda_err(e));
		goto out;
	}
	if (!(d1 = bench_cuda_malloc(maxb, why, sizeof(why))) ||
	    !(d2 = bench_cuda_malloc(maxb, why, sizeof(why)))) {
		fprintf(stderr, "kolo-bench copybw: %s\n", why);
		goto out;
	}
	if ((e = rt.stream_create(&s1)) != 0 || (e = rt.stream_create(&s2)) != 0) {
		fprintf(stderr, "kolo-bench copybw: cudaStreamCreate: %s\n", cuda_err(e));
		goto out;
	}
	memset(host, 0x11, maxb);
	memset(host2, 0x22, maxb);
	if (rank == 0 && !json) {
		printf("# kolo-bench copybw: %d rank%s, device cuda:%d %s (%d visible), pinned "
		       "host "
		       "memory, cudaMemcpyAsync\n",
		       size, size == 1 ? "" : "s", dev.ordinal, dev.name, dev.count);
		printf("# %12s %6s %10s %10s %10s\n", "bytes", "iters", "h2d_GB/s", "d2h_GB/s",
		       "bidir_GB/s");
		fflush(stdout);
	}
	for (uint64_t bytes = minb;; bytes *= (uint64_t)factor) {
		if (bytes > maxb)
			bytes = maxb;
		uint64_t auto_it = (1ull << 30) / bytes;
		int iters = iters_opt       ? iters_opt
		            : auto_it < 5   ? 5
		            : auto_it > 200 ? 200
		                            : (int)auto_it;
		int32_t one = 1;
		if (comm && kolo_allreduce(comm, &one, &one, 1, KOLO_INT32, KOLO_SUM) != KOLO_OK)
			goto coll_fail;
		double t[3];
		if ((e = time_copies(d1, host, NULL, NULL, bytes, iters, s1, s2, &t[0])) != 0 ||
		    (e = time_copies(host, d1, NULL, NULL, bytes, iters, s1, s2, &t[1])) != 0 ||
		    (e = time_copies(d2, host2, host, d1, bytes, iters, s1, s2, &t[2])) != 0) {
			fprintf(stderr, "kolo-bench copybw: rank %d: copy of %" PRIu64 ": %s\n",
			        rank, bytes, cuda_err(e));
			goto out;
		}
		if (comm && kolo_allreduce(comm, t, t, 3, KOLO_FLOAT64, KOLO_MAX) != KOLO_OK)
			goto coll_fail;
		double h2d = (double)bytes / t[0] / 1e9, d2h = (double)bytes / t[1] / 1e9;
		double bidir = (double)bytes / t[2] / 1e9;
		if (rank == 0 && json)
			printf("{\"op\":\"copybw\",\"bytes\":%" PRIu64 ",\"ranks\":%d,\"iters\":%d,"
			       "\"h2d_gbps\":%.4f,\"d2h_gbps\":%.4f,\"bidir_gbps\":%.4f,"
			       "\"device\":%d}\n",
			       bytes, size, iters, h2d, d2h, bidir, dev.ordinal);
		else if (rank == 0)
			printf("  %12" PRIu64 " %6d %10.3f %10.3f %10.3f\n", bytes, iters, h2d, d2h,
			       bidir);
		fflush(stdout);
		if (bytes >= maxb)
			break;
	}
	rc = 0;
	goto out;
coll_fail:
	fprintf(stderr, "kolo-bench copybw: rank %d: allreduce: %s\n", rank, kolo_last_error(comm));
out:
	if (s1)
		rt.stream_destroy(s1);
	if (s2)
		rt.stream_destroy(s2);
	bench_cuda_free(d1);
	bench_cuda_free(d2);
	if (host)
		rt.free_host(host);
	if (host2)
		rt.free_host(host2);
	if (comm && kolo_finalize(comm) != KOLO_OK && rc == 0)
		rc = 1;
	return rc;
bad:
	fprintf(stderr, "kolo-bench copybw: bad value '%s' for -%c\n", optarg, c);
	return 2;
}
