/* A worker for the metrics test (metrics_test.sh), run under kolorun with
 * KOLO_METRICS_LISTEN set: it runs a known set of collectives, blocking and
 * async, then scrapes its own endpoint and checks that every count and byte
 * total equals what it ran. Rank 0 then scrapes rank 1's endpoint, after a
 * barrier that rank 1 entered only when its own collectives were done, and
 * checks its place and counts; a last barrier keeps rank 1's server up until
 * then. Exits 0 and prints "metrics ok" when every check passed.
 *
 *   metrics_worker [SCRAPE_FILE]   rank 0 writes its scrape there
 *   metrics_worker --elastic       under kolorun -np 3 --min-np 2: rank 2 of
 *                                  the first round exits after 3 allreduces;
 *                                  the survivors re-form, sync their state and
 *                                  check the re-form's metrics, then print
 *                                  "elastic ok" */
#include <arpa/inet.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kolo/async.h"
#include "kolo/elastic.h"
#include "kolo/kolo.h"
#include "runtime.h"

#define SCRAPE_TIMEOUT_MS 5000
#define N_SMALL           10 /* small blocking allreduces */
#define N_ASYNC           5  /* async allreduces, fused */

static int failures;

#define CHECK(cond, ...)                                                                           \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			fprintf(stderr, "metrics_worker: check failed: " __VA_ARGS__);             \
			fprintf(stderr, " (%s:%d)\n", __FILE__, __LINE__);                         \
			failures++;                                                                \
		}                                                                                  \
	} while (0)

#define OK(expr)                                                                                   \
	do {                                                                                       \
		kolo_status_t st_ = (expr);                                                        \
		if (st_ != KOLO_OK) {                                                              \
			fprintf(stderr, "metrics_worker: %s: %s: %s\n", #expr,                     \
			        kolo_status_name(st_), kolo_last_error(comm));                     \
			exit(3);                                                                   \
		}                                                                                  \
	} while (0)

/* GET path from 127.0.0.1:port with HTTP/1.0; the whole reply (malloc'd,
 * NUL-terminated) or NULL. Bounded by SCRAPE_TIMEOUT_MS per read. */
static char *http_get(int port, const char *method, const char *path)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
		if (fd >= 0)
			close(fd);
		return NULL;
	}
	char req[256];
	int n = snprintf(req, sizeof(req), "%s %s HTTP/1.0\r\nHost: localhost\r\n\r\n", method,
	                 path);
	if (write(fd, req, (size_t)n) != n) {
		close(fd);
		return NULL;
	}
	size_t len = 0, cap = 1 << 16;
	char *buf = malloc(cap);
	for (;;) {
		struct pollfd p = {.fd = fd, .events = POLLIN};
		if (!buf || poll(&p, 1, SCRAPE_TIMEOUT_MS) != 1)
			break;
		if (len + 4096 + 1 > cap) {
			char *nb = realloc(buf, cap *= 2);
			if (!nb)
				break;
			buf = nb;
		}
		ssize_t r = read(fd, buf + len, cap - len - 1);
		if (r <= 0) {
			close(fd);
			buf[len] = '\0';
			return buf;
		}
		len += (size_t)r;
	}
	close(fd);
	free(buf);
	return NULL;
}

/* The HTTP status of a reply ("HTTP/1.x CODE ..."), -1 if none. */
static int http_status(const char *reply)
{
	int code = -1;
	return reply && sscanf(reply, "HTTP/1.%*d %d", &code) == 1 ? code : -1;
}

/* The value of the sample `series` (whole name and labels), -1 if absent. */
static double sample(const char *text, const char *series)
{
	size_t n = strlen(series);
	for (const char *p = text; p && *p;) {
		if (strncmp(p, series, n) == 0 && p[n] == ' ')
			return strtod(p + n + 1, NULL);
		p = strchr(p, '\n');
		p = p ? p + 1 : NULL;
	}
	return -1;
}

static double coll(const char *text, const char *what, const char *name, const char *mode)
{
	char series[256];
	snprintf(series, sizeof(series), "kolo_collective_%s_total{collective=\"%s\",mode=\"%s\"}",
	         what, name, mode);
	return sample(text, series);
}

static double hist_count(const char *text, const char *name, const char *size_class)
{
	char series[256];
	snprintf(series, sizeof(series),
	         "kolo_collective_duration_seconds_count{collective=\"%s\",size_class=\"%s\"}",
	         name, size_class);
	return sample(text, series);
}

/* A scrape of port's /metrics: 200, the 0.0.4 content type; its body. */
static char *scrape(int port)
{
	char *reply = http_get(port, "GET", "/metrics");
	CHECK(http_status(reply) == 200, "GET /metrics on port %d: status %d", port,
	      http_status(reply));
	CHECK(reply && strstr(reply, "text/plain; version=0.0.4"), "no 0.0.4 content type");
	char *body = reply ? strstr(reply, "\r\n\r\n") : NULL;
	if (!body) {
		free(reply);
		fprintf(stderr, "metrics_worker: no reply from port %d\n", port);
		exit(3);
	}
	memmove(reply, body + 4, strlen(body + 4) + 1);
	return reply;
}

static double phase_count(const char *text, const char *phase)
{
	char series[128];
	snprintf(series, sizeof(series), "kolo_elastic_reform_phase_seconds_count{phase=\"%s\"}",
	         phase);
	return sample(text, series);
}

/* The sum of every sample of the family name (all label sets). */
static double family_sum(const char *text, const char *name)
{
	size_t n = strlen(name);
	double sum = 0;
	for (const char *p = text; p && *p;) {
		if (strncmp(p, name, n) == 0 && (p[n] == '{' || p[n] == ' ')) {
			const char *v = strchr(p, ' ');
			sum += v ? strtod(v + 1, NULL) : 0;
		}
		p = strchr(p, '\n');
		p = p ? p + 1 : NULL;
	}
	return sum;
}

/* One failure re-form: rank 2 of round 1 dies after 3 steps; the others'
 * 4th allreduce fails, they re-form and sync, and then their metrics must
 * show one failure re-form with every phase, the new round, and the
 * failure. */
static int elastic_main(kolo_comm_t *comm)
{
	int64_t step = 0;
	float x[4];
	kolo_state_t *state = NULL;
	OK(kolo_state_create(comm, &state));
	OK(kolo_state_register(state, "step", &step, 1, KOLO_INT64));
	OK(kolo_state_sync(state));
	const int64_t first_round = kolo_round(comm);
	kolo_status_t st = KOLO_OK;
	while (step < 6) {
		for (int j = 0; j < 4; j++)
			x[j] = 1.0f;
		st = kolo_allreduce(comm, x, x, 4, KOLO_FLOAT32, KOLO_SUM);
		if (st == KOLO_OK) {
			CHECK(x[0] == (float)kolo_size(comm), "allreduce gave %g", (double)x[0]);
			step++;
			st = kolo_state_commit(state);
		}
		if (st == KOLO_OK && kolo_round(comm) == first_round && kolo_rank(comm) == 2 &&
		    step == 3) {
			fflush(stdout);
			_exit(0); /* a worker gone without a word */
		}
		if (st == KOLO_OK)
			continue;
		CHECK(st == KOLO_EMEMBERSHIP, "step %" PRId64 ": %s", step, kolo_status_name(st));
		OK(kolo_reform(comm));
		OK(kolo_state_sync(state));
		char *t = scrape(kolo_runtime_metrics_port());
		CHECK(sample(t, "kolo_elastic_reforms_total{cause=\"failure\"}") == 1,
		      "failure re-forms %g",
		      sample(t, "kolo_elastic_reforms_total{cause=\"failure\"}"));
		for (const char *const *ph = (const char *const[]){"detect", "teardown", "round",
		                                                   "connect", "sync", NULL};
		     *ph; ph++)
			CHECK(phase_count(t, *ph) == 1, "phase %s: %g", *ph, phase_count(t, *ph));
		CHECK(sample(t, "kolo_round") == (double)kolo_round(comm) &&
		              kolo_round(comm) > first_round,
		      "round %g, comm's %" PRId64, sample(t, "kolo_round"), kolo_round(comm));
		CHECK(sample(t, "kolo_size") == 2, "size %g", sample(t, "kolo_size"));
		CHECK(sample(t, "kolo_collective_failures_total{collective=\"allreduce\",mode="
		                "\"blocking\",code=\"EMEMBERSHIP\"}") == 1,
		      "no failed allreduce counted");
		/* The survivor next to the dead rank counts the transport error; the
		 * other may have learnt of the end of the round from the rendezvous
		 * first, so the check is on the sum over the new round. */
		double terr = family_sum(t, "kolo_transport_errors_total");
		OK(kolo_allreduce(comm, &terr, &terr, 1, KOLO_FLOAT64, KOLO_SUM));
		CHECK(terr >= 1, "no transport error counted on any survivor");
		free(t);
	}
	CHECK(kolo_elastic_resets(comm) == 1, "%d re-forms", kolo_elastic_resets(comm));
	kolo_state_destroy(state);
	kolo_finalize(comm);
	if (failures)
		return 1;
	printf("elastic ok\n");
	return 0;
}

int main(int argc, char **argv)
{
	kolo_comm_t *comm = NULL;
	if (kolo_init(&comm) != KOLO_OK) {
		fprintf(stderr, "metrics_worker: kolo_init: %s\n", kolo_init_error());
		return 3;
	}
	if (argc > 1 && strcmp(argv[1], "--elastic") == 0)
		return elastic_main(comm);
	const int rank = kolo_rank(comm), size = kolo_size(comm);
	const char *listen = getenv("KOLO_METRICS_LISTEN");
	const char *colon = listen ? strrchr(listen, ':') : NULL;
	int base = colon ? atoi(colon + 1) : -1;
	int port = kolo_runtime_metrics_port();
	CHECK(port > 0, "no metrics server (KOLO_METRICS_LISTEN=%s)", listen ? listen : "");
	if (base > 0)
		CHECK(port == base + kolo_local_rank(comm), "port %d, want %d + local rank %d",
		      port, base, kolo_local_rank(comm));

	/* The collectives, and what each adds (bytes as docs/metrics.md). */
	const size_t small_n = 2, medium_n = 25600, large_n = 4u << 20; /* floats */
	float *buf = calloc(large_n * (size_t)size, sizeof(float));
	float *out = calloc(large_n * (size_t)size, sizeof(float));
	if (!buf || !out)
		return 3;
	uint64_t ar_bytes = 0;
	for (int i = 0; i < N_SMALL; i++) {
		buf[0] = 1.0f;
		OK(kolo_allreduce(comm, buf, out, small_n, KOLO_FLOAT32, KOLO_SUM));
		CHECK(out[0] == (float)size, "allreduce gave %g", (double)out[0]);
		ar_bytes += small_n * 4;
	}
	OK(kolo_allreduce(comm, buf, out, medium_n, KOLO_FLOAT32, KOLO_SUM));
	OK(kolo_allreduce(comm, buf, out, large_n, KOLO_FLOAT32, KOLO_SUM));
	ar_bytes += (medium_n + large_n) * 4;
	OK(kolo_allgather(comm, buf, out, 16, KOLO_FLOAT32));
	OK(kolo_broadcast(comm, buf, 1000, KOLO_FLOAT32, 0));
	OK(kolo_reducescatter(comm, buf, out, 64 * (size_t)size, KOLO_FLOAT32, KOLO_SUM));
	OK(kolo_alltoall(comm, buf, out, 8, KOLO_INT32));
	OK(kolo_barrier(comm));
	OK(kolo_barrier(comm));

	kolo_handle_t *h[N_ASYNC + 5];
	for (int i = 0; i < N_ASYNC; i++) {
		char name[32];
		snprintf(name, sizeof(name), "t%d", i);
		OK(kolo_allreduce_async(comm, name, buf + i * 1000, out + i * 1000, 1000,
		                        KOLO_FLOAT32, KOLO_SUM, 1.0, 1.0, NULL, NULL, &h[i]));
	}
	void *gathered = NULL, *exchanged = NULL;
	size_t *gcounts = calloc((size_t)size, sizeof(size_t));
	size_t *acounts = calloc((size_t)size, sizeof(size_t));
	if (!gcounts || !acounts)
		return 3;
	OK(kolo_allgather_async(comm, "g", buf, 10 + (size_t)rank, KOLO_FLOAT64, &gathered, gcounts,
	                        NULL, NULL, &h[N_ASYNC]));
	OK(kolo_broadcast_async(comm, "b", buf, 300, KOLO_INT8, 0, NULL, NULL, &h[N_ASYNC + 1]));
	OK(kolo_reducescatter_async(comm, "r", buf, out, 40 * (size_t)size, KOLO_FLOAT32, KOLO_SUM,
	                            1.0, 1.0, NULL, NULL, &h[N_ASYNC + 2]));
	OK(kolo_alltoall_async(comm, "a", buf, 4 * (size_t)size, NULL, KOLO_INT64, &exchanged,
	                       acounts, NULL, NULL, &h[N_ASYNC + 3]));
	OK(kolo_barrier_async(comm, NULL, NULL, &h[N_ASYNC + 4]));
	for (int i = 0; i < N_ASYNC + 5; i++)
		OK(kolo_wait(h[i]));
	kolo_free(gathered);
	kolo_free(exchanged);
	/* Every rank's allgather count: 10 + its rank, 8 bytes each. */
	uint64_t ag_async = 0;
	for (int r = 0; r < size; r++)
		ag_async += (10 + (uint64_t)r) * 8;

	char *t = scrape(port);
	const char *B = "blocking", *A = "async";
	CHECK(coll(t, "ops", "allreduce", B) == N_SMALL + 2, "blocking allreduce ops %g",
	      coll(t, "ops", "allreduce", B));
	CHECK(coll(t, "bytes", "allreduce", B) == (double)ar_bytes, "blocking allreduce bytes %g",
	      coll(t, "bytes", "allreduce", B));
	/* The histograms count both modes: the async allreduces are small. */
	CHECK(hist_count(t, "allreduce", "small") == N_SMALL + N_ASYNC, "small allreduces %g",
	      hist_count(t, "allreduce", "small"));
	CHECK(hist_count(t, "allreduce", "medium") == 1, "medium allreduces %g",
	      hist_count(t, "allreduce", "medium"));
	CHECK(hist_count(t, "allreduce", "large") == 1, "large allreduces %g",
	      hist_count(t, "allreduce", "large"));
	CHECK(coll(t, "bytes", "allgather", B) == 16.0 * 4 * size, "allgather bytes %g",
	      coll(t, "bytes", "allgather", B));
	CHECK(coll(t, "bytes", "broadcast", B) == 4000, "broadcast bytes %g",
	      coll(t, "bytes", "broadcast", B));
	CHECK(coll(t, "bytes", "reducescatter", B) == 256.0 * size, "reducescatter bytes %g",
	      coll(t, "bytes", "reducescatter", B));
	CHECK(coll(t, "bytes", "alltoall", B) == 32.0 * size, "alltoall bytes %g",
	      coll(t, "bytes", "alltoall", B));
	CHECK(coll(t, "ops", "barrier", B) == 2, "barriers %g", coll(t, "ops", "barrier", B));
	CHECK(coll(t, "ops", "allreduce", A) == N_ASYNC, "async allreduce ops %g",
	      coll(t, "ops", "allreduce", A));
	CHECK(coll(t, "bytes", "allreduce", A) == N_ASYNC * 4000.0, "async allreduce bytes %g",
	      coll(t, "bytes", "allreduce", A));
	CHECK(coll(t, "bytes", "allgather", A) == (double)ag_async, "async allgather bytes %g",
	      coll(t, "bytes", "allgather", A));
	CHECK(coll(t, "bytes", "broadcast", A) == 300, "async broadcast bytes %g",
	      coll(t, "bytes", "broadcast", A));
	CHECK(coll(t, "bytes", "reducescatter", A) == 160.0 * size, "async reducescatter %g",
	      coll(t, "bytes", "reducescatter", A));
	CHECK(coll(t, "bytes", "alltoall", A) == 32.0 * size, "async alltoall bytes %g",
	      coll(t, "bytes", "alltoall", A));
	CHECK(coll(t, "ops", "barrier", A) == 1, "async barriers %g", coll(t, "ops", "barrier", A));
	for (const char *const *c = (const char *const[]){"allgather", "broadcast", "reducescatter",
	                                                  "alltoall", NULL};
	     *c; c++)
		CHECK(coll(t, "ops", *c, B) == 1 && coll(t, "ops", *c, A) == 1, "%s ops %g/%g", *c,
		      coll(t, "ops", *c, B), coll(t, "ops", *c, A));
	/* Each async allreduce tensor is in exactly one batch. */
	CHECK(sample(t, "kolo_fusion_batch_tensors_sum") == N_ASYNC, "tensors in batches %g",
	      sample(t, "kolo_fusion_batch_tensors_sum"));
	CHECK(sample(t, "kolo_fusion_cycles_total") >= 1, "no negotiation cycle");
	CHECK(sample(t, "kolo_rank") == rank && sample(t, "kolo_size") == size, "rank %g size %g",
	      sample(t, "kolo_rank"), sample(t, "kolo_size"));
	CHECK(!strstr(t, "kolo_collective_failures_total{"), "a failure was counted");
	if (rank == 0 && argc > 1) {
		FILE *f = fopen(argv[1], "w");
		CHECK(f && fputs(t, f) >= 0 && fclose(f) == 0, "cannot write %s", argv[1]);
	}
	free(t);
	char *r = http_get(port, "GET", "/other");
	CHECK(http_status(r) == 404, "GET /other: %d", http_status(r));
	free(r);
	r = http_get(port, "POST", "/metrics");
	CHECK(http_status(r) == 405, "POST /metrics: %d", http_status(r));
	free(r);

	/* Rank 0 scrapes rank 1: after this barrier rank 1's allreduces are
	 * done, and it waits in the next until rank 0 is through. */
	int32_t mine = port, *ports = calloc((size_t)size, sizeof(int32_t));
	if (!ports)
		return 3;
	OK(kolo_allgather(comm, &mine, ports, 1, KOLO_INT32));
	OK(kolo_barrier(comm));
	if (rank == 0 && size > 1) {
		char *o = scrape(ports[1]);
		CHECK(sample(o, "kolo_rank") == 1, "rank 1's endpoint says rank %g",
		      sample(o, "kolo_rank"));
		CHECK(coll(o, "ops", "allreduce", B) == N_SMALL + 2, "rank 1's allreduces %g",
		      coll(o, "ops", "allreduce", B));
		free(o);
	}
	OK(kolo_barrier(comm));
	free(ports);
	free(gcounts);
	free(acounts);
	free(buf);
	free(out);
	kolo_finalize(comm);
	/* The last comm of the process stopped the server. */
	r = http_get(port, "GET", "/metrics");
	CHECK(!r, "port %d still answers after kolo_finalize", port);
	free(r);
	if (failures)
		return 1;
	printf("metrics ok: rank %d port %d\n", rank, port);
	return 0;
}
