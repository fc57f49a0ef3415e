/* kolo-transport-bench: throughput and ping-pong latency of the TCP
 * transport between two processes on loopback.
 *
 *   kolo-transport-bench [-s streams,...] [-b bytes,...] [-n total_bytes] [-p spin_us]
 *                        [-t tcp|verbs|verbs-emu]
 *
 * -t verbs runs the verbs transport instead, over the device KOLO_IB_DEVICE
 * names (or the first active one): loopback through one HCA. verbs-emu runs
 * it over the emulation (a protocol check, its figures say nothing of a NIC).
 *
 * For each stream count and message size: one-way throughput (rank 0 sends,
 * rank 1 receives, an 1-byte ack ends the timing), two-way throughput (both
 * send and receive at once, as a ring step does), and for the smallest size
 * the median one-way latency of a ping-pong. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core.h"
#include "transport_tcp.h"
#include "transport_verbs.h"

static const struct kolo_transport_ops *ops = &kolo_transport_tcp_ops;
static uint64_t spin_ns = 50000;

static void die(const char *what, kolo_status_t st)
{
	fprintf(stderr, "kolo-transport-bench: %s: %s\n", what, kolo_status_name(st));
	exit(1);
}

/* Spins on test for a while, then blocks in wait: as the ring does. */
static void complete(struct kolo_transport *t, struct kolo_req **reqs, int n)
{
	int left = n;
	uint64_t spin_until = kolo_now_ns() + spin_ns;
	while (left) {
		bool moved = false;
		for (int i = 0; i < n; i++) {
			if (!reqs[i])
				continue;
			bool done = false;
			kolo_status_t st = ops->test(reqs[i], &done);
			if (st != KOLO_OK)
				die("test", st);
			if (done) {
				reqs[i] = NULL;
				left--;
				moved = true;
			}
		}
		if (moved) {
			spin_until = kolo_now_ns() + spin_ns;
		} else if (kolo_now_ns() > spin_until) {
			kolo_status_t st = ops->wait(t, 100);
			if (st != KOLO_OK)
				die("wait", st);
		}
	}
}

static void parse_list(const char *s, size_t *out, int *n, int max)
{
	*n = 0;
	char *dup = strdup(s), *save = NULL;
	for (char *tok = strtok_r(dup, ",", &save); tok && *n < max;
	     tok = strtok_r(NULL, ",", &save)) {
		uint64_t v;
		if (kolo_parse_size(tok, &v) != KOLO_OK) {
			fprintf(stderr, "bad size %s\n", tok);
			exit(2);
		}
		out[(*n)++] = (size_t)v;
	}
	free(dup);
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

/* One rank's part for one stream count. Rank 0 prints. */
static void run(int rank, int streams, const size_t *sizes, int nsizes, size_t total,
                struct kolo_transport *t, struct kolo_conn *c)
{
	size_t maxlen = 0;
	for (int k = 0; k < nsizes; k++)
		maxlen = KOLO_MAX(maxlen, sizes[k]);
	uint8_t *sb = malloc(maxlen ? maxlen : 1), *rb = malloc(maxlen ? maxlen : 1);
	if (!sb || !rb)
		die("malloc", KOLO_ENOMEM);
	memset(sb, 1, maxlen);
	memset(rb, 0, maxlen);
	uint8_t ack = 0;
	enum { WINDOW = 8 };
	for (int k = 0; k < nsizes; k++) {
		size_t len = sizes[k];
		int iters = (int)KOLO_MAX(
		        (size_t)4, KOLO_MIN(total / KOLO_MAX(len, (size_t)1), (size_t)20000));
		double gbps[2];
		for (int mode = 0; mode < 2; mode++) {
			/* mode 0: one-way; mode 1: both ways at once. */
			uint64_t t0 = 0;
			for (int rep = -1; rep < 1; rep++) { /* rep -1: warm-up */
				if (rep == 0)
					t0 = kolo_now_ns();
				int done = 0;
				while (done < iters) {
					struct kolo_req *reqs[2 * WINDOW];
					int n = 0;
					for (int w = 0; w < WINDOW && done < iters; w++, done++) {
						kolo_status_t st = KOLO_OK;
						if (rank == 0 || mode == 1)
							st = ops->isend(c, sb, len, &reqs[n++]);
						if (st == KOLO_OK && (rank == 1 || mode == 1))
							st = ops->irecv(c, rb, len, &reqs[n++]);
						if (st != KOLO_OK)
							die("post", st);
					}
					complete(t, reqs, n);
				}
				struct kolo_req *r = NULL;
				kolo_status_t st = rank == 0 ? ops->irecv(c, &ack, 1, &r)
				                             : ops->isend(c, &ack, 1, &r);
				if (st != KOLO_OK)
					die("ack", st);
				complete(t, &r, 1);
			}
			double s = (double)(kolo_now_ns() - t0) / 1e9;
			gbps[mode] = (double)len * iters / s / 1e9;
		}
		if (rank == 0)
			printf("%8d %12zu %8d %14.3f %14.3f\n", streams, len, iters, gbps[0],
			       gbps[1]);
	}
	/* Latency: ping-pong of the smallest size. */
	size_t len = sizes[0];
	enum { PINGS = 2000 };
	uint64_t *lat = malloc(PINGS * sizeof(*lat));
	for (int i = -100; i < PINGS; i++) {
		uint64_t t0 = kolo_now_ns();
		struct kolo_req *r = NULL;
		for (int leg = 0; leg < 2; leg++) {
			kolo_status_t st = (leg == rank) ? ops->isend(c, sb, len, &r)
			                                 : ops->irecv(c, rb, len, &r);
			if (st != KOLO_OK)
				die("ping", st);
			complete(t, &r, 1);
		}
		if (i >= 0)
			lat[i] = kolo_now_ns() - t0;
	}
	qsort(lat, PINGS, sizeof(*lat), cmp_u64);
	if (rank == 0)
		printf("%8d %12zu latency (half round trip, median) %.2f us\n", streams, len,
		       (double)lat[PINGS / 2] / 2000.0);
	free(lat);
	free(sb);
	free(rb);
}

int main(int argc, char **argv)
{
	size_t streams_list[8] = {1, 2, 4}, sizes[32] = {8, 65536, 1u << 20, 16u << 20, 64u << 20};
	int nstreams = 3, nsizes = 5;
	size_t total = 1u << 30;
	int opt;
	while ((opt = getopt(argc, argv, "s:b:n:p:t:h")) != -1) {
		switch (opt) {
		case 's':
			parse_list(optarg, streams_list, &nstreams, 8);
			break;
		case 'b':
			parse_list(optarg, sizes, &nsizes, 32);
			break;
		case 'p':
			spin_ns = (uint64_t)atoll(optarg) * 1000u;
			break;
		case 't':
			if (strcmp(optarg, "verbs") == 0 || strcmp(optarg, "verbs-emu") == 0) {
				ops = &kolo_transport_verbs_ops;
				if (strcmp(optarg, "verbs-emu") == 0)
					kolo_verbs_emu_enable(&(struct kolo_verbs_emu_opts){0});
			} else if (strcmp(optarg, "tcp") != 0) {
				fprintf(stderr,
				        "kolo-transport-bench: -t tcp, verbs or verbs-emu\n");
				return 2;
			}
			break;
		case 'n': {
			uint64_t v;
			if (kolo_parse_size(optarg, &v) != KOLO_OK)
				return 2;
			total = (size_t)v;
			break;
		}
		default:
			fprintf(stderr,
			        "usage: %s [-s 1,2,4] [-b 8,64K,1M,64M] [-n 1G] [-p spin_us] "
			        "[-t tcp|verbs|verbs-emu]\n",
			        argv[0]);
			return 2;
		}
	}
	printf("%8s %12s %8s %14s %14s\n", "streams", "bytes", "iters", "oneway_GB/s",
	       "twoway_GB/s");
	fflush(stdout);
	for (int si = 0; si < nstreams; si++) {
		int streams = (int)streams_list[si];
		static const char token[] = "bench";
		struct kolo_transport_config cfg = {
		        .job = "bench",
		        .round = 1,
		        .rank = 0,
		        .size = 2,
		        .token = (const uint8_t *)token,
		        .token_len = sizeof(token) - 1,
		        .timeout_ms = 30000,
		        .streams = streams,
		        .iface = "127.0.0.1",
		        .ib_device = getenv("KOLO_IB_DEVICE"),
		        .ib_gid_index = -1,
		        .verbs_mr_cache = 64,
		};
		struct kolo_transport *t0 = NULL;
		struct kolo_transport_handle h0;
		kolo_status_t st = ops->create(&cfg, &t0, NULL);
		if (st == KOLO_OK)
			st = ops->listen(t0, &h0);
		if (st != KOLO_OK)
			die("listen", st);
		fflush(stdout);
		pid_t pid = fork();
		if (pid == 0) {
			struct kolo_transport *t1 = NULL;
			struct kolo_conn *c = NULL;
			cfg.rank = 1;
			if (ops->create(&cfg, &t1, NULL) != KOLO_OK ||
			    ops->connect(t1, &h0, 0, 1, &c) != KOLO_OK)
				_exit(1);
			run(1, streams, sizes, nsizes, total, t1, c);
			ops->close(c);
			ops->destroy(t1);
			_exit(0);
		}
		struct kolo_conn *c = NULL;
		uint64_t end = kolo_now_ms() + 10000;
		while (!c && kolo_now_ms() < end) {
			if (ops->accept(t0, 1, 1, &c) != KOLO_OK)
				die("accept", KOLO_EPEER);
			if (!c)
				ops->wait(t0, 10);
		}
		if (!c)
			die("accept", KOLO_ETIMEDOUT);
		run(0, streams, sizes, nsizes, total, t0, c);
		fflush(stdout);
		int wst = 0;
		waitpid(pid, &wst, 0);
		ops->close(c);
		ops->destroy(t0);
	}
	return 0;
}
