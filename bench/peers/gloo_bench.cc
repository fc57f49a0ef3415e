/* gloo_bench: Gloo's allreduce (float32, sum) measured as kolo-bench
 * measures kolo_allreduce (tools/kolo-bench/bench_coll.c; the shared parts
 * in peer_bench.h), on Gloo's public API (Debian's libgloo-dev):
 *
 *   gloo_bench -np 4 -b 1K -e 256M -f 4 --algo ring_chunked --check --json
 *   GLOO_RANK=r GLOO_SIZE=4 GLOO_ADDR=10.77.0.1 GLOO_DIR=/shared/store gloo_bench ...
 *
 * The first form forks -np ranks on 127.0.0.1, which meet through a
 * gloo::rendezvous::FileStore in a fresh folder; the second runs one rank
 * (one per host), its device bound to GLOO_ADDR, the FileStore folder
 * GLOO_DIR shared by every rank and empty at the start. Every rank connects
 * a full mesh of gloo::transport::tcp pairs.
 *
 * --algo ring_chunked: gloo::AllreduceRingChunked<float>, in place (its
 * only form), constructed once per size and run() per iteration. --algo
 * default: gloo::allreduce() with AllreduceOptions, in place or not.
 *
 * Method, for each size: fill the buffers, --warmup untimed iterations, a
 * one-element gloo::allreduce so that the ranks start together, then --iters
 * back-to-back iterations, each timed on its own; the mean and the median
 * each the maximum over the ranks, CPU time per iteration (getrusage of the
 * rank's process) averaged over the ranks; with --check the buffers are
 * refilled (the output poisoned first) and one more iteration is compared
 * with the exact sum. Gloo reports errors as exceptions: a rank that catches
 * one prints it and exits 1. */
#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include <gloo/allreduce.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include "peer_bench.h"

namespace
{

struct GlooBench {
	struct peer_opts o;
	int rank = 0, size = 0;
	bool inplace = true;
	std::shared_ptr<gloo::rendezvous::Context> ctx;
	float *sendbuf = nullptr, *recvbuf = nullptr;
	std::vector<double> times;
	uint32_t tag = 0;
};

/* One gloo::allreduce of n elements of T from in into out (in == out: in
 * place), reduced by fn. Every call gets its own tag, as every rank makes
 * the same calls in the same order. */
template <typename T>
void gloo_allreduce(GlooBench &b, const T *in, T *out, size_t n,
                    void (*fn)(void *, const void *, const void *, size_t))
{
	gloo::AllreduceOptions opts(b.ctx);
	if (in != out)
		opts.setInput(const_cast<T *>(in), n);
	opts.setOutput(out, n);
	opts.setReduceFunction(fn);
	opts.setTag(b.tag++);
	gloo::allreduce(opts);
}

void bench_size(GlooBench &b, uint64_t req_bytes, int *any_wrong)
{
	const struct peer_opts *o = &b.o;
	size_t count = (size_t)(req_bytes / sizeof(float));
	uint64_t bytes = (uint64_t)count * sizeof(float);
	int iters, warmup;
	peer_counts(o, bytes, &iters, &warmup);
	float *in = b.inplace ? b.recvbuf : b.sendbuf;
	bool ring = strcmp(o->algo, "ring_chunked") == 0;
	std::unique_ptr<gloo::AllreduceRingChunked<float>> algo;
	if (ring)
		algo.reset(new gloo::AllreduceRingChunked<float>(
		        b.ctx, std::vector<float *>{b.recvbuf}, (int)count));
	auto run_once = [&]() {
		if (ring)
			algo->run();
		else
			gloo_allreduce<float>(b, in, b.recvbuf, count, &gloo::sum<float>);
	};

	peer_fill(in, b.recvbuf, count, b.rank, false);
	for (int i = 0; i < warmup; i++)
		run_once();
	int32_t one = 1;
	gloo_allreduce<int32_t>(b, &one, &one, 1, &gloo::sum<int32_t>);
	double cpu0 = peer_cpu_s(), t0 = peer_now_s(), prev = t0;
	for (int i = 0; i < iters; i++) {
		run_once();
		double t = peer_now_s();
		b.times[(size_t)i] = t - prev;
		prev = t;
	}
	double elapsed = prev - t0, cpu = peer_cpu_s() - cpu0;
	double median = peer_median(b.times.data(), iters);

	uint64_t wrong = 0;
	if (o->check) {
		peer_fill(in, b.recvbuf, count, b.rank, true);
		run_once();
		wrong = peer_verify(b.recvbuf, count, b.size);
	}

	double mx[2] = {elapsed / iters, median}, sum[2] = {cpu / iters, (double)wrong};
	gloo_allreduce<double>(b, mx, mx, 2, &gloo::max<double>);
	gloo_allreduce<double>(b, sum, sum, 2, &gloo::sum<double>);
	if (sum[1] > 0)
		*any_wrong = 1;
	if (b.rank == 0) {
		struct peer_row r = {bytes, count, iters, mx[0], mx[1], sum[0] / b.size, sum[1]};
		peer_print_row(o, b.size, b.inplace, &r);
	}
}

/* One rank: connect, sweep, return the exit status. */
int rank_main(const struct peer_opts &o, int rank, int size, const char *addr, const char *dir)
{
	GlooBench b;
	b.o = o;
	b.rank = rank;
	b.size = size;
	b.inplace = strcmp(o.algo, "ring_chunked") == 0 || o.inplace;
	int any_wrong = 0;
	try {
		gloo::transport::tcp::attr attr;
		attr.hostname = addr;
		auto dev = gloo::transport::tcp::CreateDevice(attr);
		gloo::rendezvous::FileStore store(dir);
		b.ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
		/* the default 30 s would end a slow default-algorithm sweep */
		b.ctx->setTimeout(std::chrono::seconds(600));
		b.ctx->connectFullMesh(store, dev);

		size_t max_count = (size_t)(o.max_bytes / sizeof(float));
		b.sendbuf = peer_alloc(max_count * sizeof(float));
		b.recvbuf = peer_alloc(max_count * sizeof(float));
		b.times.resize((size_t)(o.iters ? o.iters : 200));
		if (!b.sendbuf || !b.recvbuf) {
			fprintf(stderr, "gloo_bench: rank %d: out of memory\n", rank);
			return 1;
		}
		if (rank == 0 && !o.json) {
			peer_print_header(&o,
			                  strcmp(o.algo, "ring_chunked") == 0
			                          ? "gloo_bench AllreduceRingChunked"
			                          : "gloo_bench gloo::allreduce",
			                  size, b.inplace);
		}
		for (uint64_t bytes = o.min_bytes; bytes != 0; bytes = peer_next_size(&o, bytes))
			bench_size(b, bytes, &any_wrong);
	} catch (const std::exception &e) {
		fprintf(stderr, "gloo_bench: rank %d: %s\n", rank, e.what());
		free(b.sendbuf);
		free(b.recvbuf);
		return 1;
	}
	if (any_wrong && rank == 0)
		fprintf(stderr, "gloo_bench: allreduce: wrong elements found\n");
	b.ctx.reset();
	free(b.sendbuf);
	free(b.recvbuf);
	return any_wrong ? 1 : 0;
}

/* Removes the FileStore's folder (flat: one file per key). */
void remove_store(const char *dir)
{
	DIR *d = opendir(dir);
	if (d) {
		struct dirent *e;
		while ((e = readdir(d)) != nullptr) {
			if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
				continue;
			std::string path = std::string(dir) + "/" + e->d_name;
			unlink(path.c_str());
		}
		closedir(d);
	}
	if (rmdir(dir) != 0)
		fprintf(stderr, "gloo_bench: could not remove %s: %s\n", dir, strerror(errno));
}

} // namespace

int main(int argc, char **argv)
{
	struct peer_opts o;
	int rc = peer_parse_opts(argc, argv, &o, true);
	if (rc != 0)
		return rc == 1 ? 0 : rc;

	const char *env_rank = getenv("GLOO_RANK");
	if (env_rank) {
		const char *env_size = getenv("GLOO_SIZE"), *dir = getenv("GLOO_DIR");
		const char *addr = getenv("GLOO_ADDR");
		int rank, size = o.np;
		if (peer_parse_int(env_rank, 0, &rank) != 0 ||
		    (env_size && peer_parse_int(env_size, 1, &size) != 0) || size < 1 ||
		    rank >= size || !dir) {
			fprintf(stderr, "gloo_bench: GLOO_RANK needs GLOO_SIZE (or -np) above it "
			                "and GLOO_DIR\n");
			return 2;
		}
		return rank_main(o, rank, size, addr ? addr : "127.0.0.1", dir);
	}

	int n = o.np ? o.np : 2;
	char tmpl[] = "/tmp/gloo_bench.XXXXXX";
	if (!mkdtemp(tmpl)) {
		perror("gloo_bench: mkdtemp");
		return 1;
	}
	fflush(stdout);
	std::vector<pid_t> pids;
	for (int r = 0; r < n; r++) {
		pid_t p = fork();
		if (p < 0) {
			perror("gloo_bench: fork");
			for (pid_t q : pids)
				kill(q, SIGTERM);
			break;
		}
		if (p == 0)
			_exit(rank_main(o, r, n, "127.0.0.1", tmpl));
		pids.push_back(p);
	}
	rc = (int)pids.size() == n ? 0 : 1;
	for (size_t i = 0; i < pids.size(); i++) {
		int st;
		if (waitpid(pids[i], &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
			rc = 1;
			/* a dead rank leaves the others waiting until Gloo's timeout */
			for (size_t j = i + 1; j < pids.size(); j++)
				kill(pids[j], SIGTERM);
		}
	}
	remove_store(tmpl);
	return rc;
}
