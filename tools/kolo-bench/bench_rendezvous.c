/* kolo-bench rendezvous: N simulated workers in one process (raw HTTP/1.1
 * over non-blocking sockets and epoll) against a rendezvous server, embedded
 * or at --url. Measures (1) the time from the last join until every worker
 * holds its assignment, with N long polls held open, and (2) KV requests per
 * second (PUT then GET of the same key) over keep-alive connections. */
#include "core.h"
#include "rendezvous.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bench.h"

struct hconn {
	int fd;
	char *in;
	size_t in_len, in_cap;
	size_t hdr_len, body_len; /* parsed once the headers are in */
	int status;
	bool done;
	/* per-worker / per-KV-connection state */
	char worker_id[KOLO_RDZV_ID_MAX];
	int idx;
	uint64_t seq;
	bool put_phase;
};

struct bench {
	struct addrinfo *ai;
	char hostport[300];
	char token[256];
	char job[64];
	bool external; /* a shared server: leave the job when done */
};

static int conn_open(const struct bench *b, struct hconn *c)
{
	memset(c, 0, sizeof(*c));
	c->fd = socket(b->ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (c->fd < 0)
		return -1;
	if (connect(c->fd, b->ai->ai_addr, b->ai->ai_addrlen) != 0) {
		close(c->fd);
		c->fd = -1;
		return -1;
	}
	int one = 1;
	setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	return 0;
}

static void conn_close(struct hconn *c)
{
	if (c->fd >= 0)
		close(c->fd);
	c->fd = -1;
	free(c->in);
	c->in = NULL;
}

/* The sockets are blocking; only reads use MSG_DONTWAIT. */
static int send_all(int fd, const char *p, size_t n)
{
	while (n) {
		ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

static int http_send(const struct bench *b, struct hconn *c, const char *method, const char *path,
                     const void *body, size_t len)
{
	char head[1024];
	int n = snprintf(head, sizeof(head),
	                 "%s %s HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\n"
	                 "Content-Length: %zu\r\n\r\n",
	                 method, path, b->hostport, b->token, len);
	c->in_len = 0;
	c->hdr_len = 0;
	c->done = false;
	c->status = 0;
	if (n < 0 || (size_t)n >= sizeof(head) || send_all(c->fd, head, (size_t)n) != 0)
		return -1;
	return len ? send_all(c->fd, body, len) : 0;
}

/* Reads what is available; returns 1 when a whole response is in, 0 when
 * more is needed, -1 on error or EOF. */
static int http_read(struct hconn *c, bool block)
{
	for (;;) {
		if (c->in_cap - c->in_len < 65536) {
			size_t cap = KOLO_MAX(c->in_cap * 2, (size_t)131072);
			char *n = realloc(c->in, cap);
			if (!n)
				return -1;
			c->in = n;
			c->in_cap = cap;
		}
		ssize_t r = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len - 1,
		                 block ? 0 : MSG_DONTWAIT);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return 0;
		if (r <= 0)
			return -1;
		c->in_len += (size_t)r;
		c->in[c->in_len] = '\0';
		if (!c->hdr_len) {
			char *e = strstr(c->in, "\r\n\r\n");
			if (!e)
				continue;
			c->hdr_len = (size_t)(e - c->in) + 4;
			c->status = atoi(c->in + 9);
			char *cl = strcasestr(c->in, "\r\nContent-Length:");
			c->body_len = cl && cl < e ? strtoull(cl + 17, NULL, 10) : 0;
		}
		if (c->in_len >= c->hdr_len + c->body_len) {
			c->done = true;
			return 1;
		}
	}
}

static int http_wait(struct hconn *c)
{
	int r;
	while ((r = http_read(c, true)) == 0)
		;
	return r;
}

static const char *body_of(const struct hconn *c)
{
	return c->in + c->hdr_len;
}

/* One request on a blocking connection: the status, or -1. */
static int http_call(const struct bench *b, struct hconn *c, const char *method, const char *path,
                     const char *body)
{
	if (http_send(b, c, method, path, body, body ? strlen(body) : 0) != 0 || http_wait(c) != 1)
		return -1;
	return c->status;
}

static int json_int_after(const char *s, const char *key)
{
	const char *p = strstr(s, key);
	return p ? atoi(p + strlen(key)) : -1;
}

static int join_worker(const struct bench *b, struct hconn *c, int i, int hosts)
{
	char path[256], body[128];
	snprintf(path, sizeof(path), "/v1/jobs/%s/workers", b->job);
	snprintf(body, sizeof(body), "{\"host\":\"bench-host-%d\"}", i % hosts);
	if (http_call(b, c, "POST", path, body) != 201)
		return -1;
	const char *id = strstr(body_of(c), "\"worker_id\":\"");
	if (!id)
		return -1;
	id += 13;
	size_t n = strcspn(id, "\"");
	if (n == 0 || n >= sizeof(c->worker_id))
		return -1;
	memcpy(c->worker_id, id, n);
	c->worker_id[n] = '\0';
	snprintf(path, sizeof(path),
	         "/v1/jobs/%s/workers/%s/assignment?after_round=0&timeout_ms=120000", b->job,
	         c->worker_id);
	return http_send(b, c, "GET", path, NULL, 0);
}

static double metric_value(const struct bench *b, struct hconn *mc, const char *name)
{
	if (http_call(b, mc, "GET", "/metrics", NULL) != 200)
		return -1;
	const char *p = strstr(body_of(mc), name);
	while (p && p > body_of(mc) && p[-1] != '\n')
		p = strstr(p + 1, name);
	return p ? atof(p + strlen(name)) : -1;
}

/* Phase 1. Returns ms from the last join to the last assignment, or -1. */
static double bench_round(const struct bench *b, int n, int hosts, int *errors)
{
	struct hconn *w = calloc((size_t)n, sizeof(*w));
	struct hconn mc = {.fd = -1};
	double result = -1;
	int ep = epoll_create1(EPOLL_CLOEXEC);
	if (!w || ep < 0 || conn_open(b, &mc) != 0) {
		fprintf(stderr, "bench: cannot connect\n");
		goto out;
	}
	for (int i = 0; i < n; i++)
		w[i].fd = -1;
	char path[256], body[128];
	snprintf(path, sizeof(path), "/v1/jobs/%s", b->job);
	snprintf(body, sizeof(body), "{\"min_np\":%d,\"max_np\":%d,\"settle_ms\":600000}", n, n);
	if (http_call(b, &mc, "PUT", path, body) != 200) {
		fprintf(stderr, "bench: configuring the job failed (%d): %s\n", mc.status,
		        body_of(&mc));
		goto out;
	}
	double base = metric_value(b, &mc, "kolo_rdzv_long_polls ");
	for (int i = 0; i < n - 1; i++) {
		if (conn_open(b, &w[i]) != 0 || join_worker(b, &w[i], i, hosts) != 0) {
			fprintf(stderr, "bench: worker %d could not join: %s\n", i,
			        w[i].in ? body_of(&w[i]) : strerror(errno));
			goto out;
		}
		w[i].idx = i;
	}
	/* Every long poll is held by the server before the last join. */
	uint64_t deadline = kolo_now_ms() + 60000;
	while (metric_value(b, &mc, "kolo_rdzv_long_polls ") < base + n - 1) {
		if (kolo_now_ms() > deadline) {
			fprintf(stderr, "bench: the server holds fewer than %d long polls\n",
			        n - 1);
			goto out;
		}
		kolo_sleep_ms(5);
	}
	uint64_t t0 = kolo_now_ns();
	if (conn_open(b, &w[n - 1]) != 0 || join_worker(b, &w[n - 1], n - 1, hosts) != 0) {
		fprintf(stderr, "bench: the last worker could not join\n");
		goto out;
	}
	w[n - 1].idx = n - 1;
	for (int i = 0; i < n; i++) {
		struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &w[i]};
		epoll_ctl(ep, EPOLL_CTL_ADD, w[i].fd, &ev);
	}
	int left = n;
	struct epoll_event evs[256];
	while (left > 0) {
		int k = epoll_wait(ep, evs, 256, 30000);
		if (k <= 0) {
			fprintf(stderr, "bench: %d workers got no assignment within 30 s\n", left);
			goto out;
		}
		for (int e = 0; e < k; e++) {
			struct hconn *c = evs[e].data.ptr;
			if (c->done)
				continue;
			int r = http_read(c, false);
			if (r < 0) {
				fprintf(stderr, "bench: worker %d lost its connection\n", c->idx);
				goto out;
			}
			if (r == 1) {
				left--;
				epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
			}
		}
	}
	result = (double)(kolo_now_ns() - t0) / 1e6;
	/* Check: 200, one round, ranks a permutation of 0..n-1, sizes n. */
	char *seen = calloc((size_t)n, 1);
	for (int i = 0; i < n && seen; i++) {
		const char *s = body_of(&w[i]);
		int rank = json_int_after(s, "\"rank\":");
		if (w[i].status != 200 || json_int_after(s, "\"round\":") != 1 ||
		    json_int_after(s, "\"size\":") != n || rank < 0 || rank >= n || seen[rank]) {
			if (*errors < 5)
				fprintf(stderr, "bench: bad assignment for worker %d: %d %.200s\n",
				        i, w[i].status, s);
			(*errors)++;
			continue;
		}
		seen[rank] = 1;
	}
	free(seen);
	/* Leave, so that a shared server does not keep the workers until their
	 * leases expire. */
	for (int i = 0; b->external && i < n; i++) {
		snprintf(path, sizeof(path), "/v1/jobs/%s/workers/%s", b->job, w[i].worker_id);
		if (http_call(b, &w[i], "DELETE", path, NULL) != 204)
			(*errors)++;
	}
out:
	for (int i = 0; w && i < n; i++)
		conn_close(&w[i]);
	free(w);
	conn_close(&mc);
	if (ep >= 0)
		close(ep);
	return result;
}

static int kv_issue(const struct bench *b, struct hconn *c, const char *value, size_t vlen)
{
	char path[256];
	snprintf(path, sizeof(path), "/v1/jobs/%s/kv/bench/%d/%" PRIu64, b->job, c->idx,
	         c->seq % 1024);
	if (c->put_phase)
		return http_send(b, c, "PUT", path, value, vlen);
	return http_send(b, c, "GET", path, NULL, 0);
}

/* Phase 2. Returns requests per second, or -1. */
static double bench_kv(const struct bench *b, int conns, double seconds, size_t vbytes, int *errors)
{
	struct hconn *c = calloc((size_t)conns, sizeof(*c));
	char *value = malloc(vbytes + 1);
	double result = -1;
	int ep = epoll_create1(EPOLL_CLOEXEC);
	if (!c || !value || ep < 0)
		goto out;
	for (int i = 0; i < conns; i++)
		c[i].fd = -1;
	for (size_t i = 0; i < vbytes; i++)
		value[i] = (char)('a' + i % 26);
	uint64_t requests = 0;
	uint64_t t0 = kolo_now_ns(), end = t0 + (uint64_t)(seconds * 1e9);
	for (int i = 0; i < conns; i++) {
		if (conn_open(b, &c[i]) != 0)
			goto out;
		c[i].idx = i;
		c[i].put_phase = true;
		struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &c[i]};
		epoll_ctl(ep, EPOLL_CTL_ADD, c[i].fd, &ev);
		if (kv_issue(b, &c[i], value, vbytes) != 0)
			goto out;
	}
	int active = conns;
	struct epoll_event evs[64];
	while (active > 0) {
		int k = epoll_wait(ep, evs, 64, 10000);
		if (k <= 0) {
			fprintf(stderr, "bench: KV request timed out\n");
			goto out;
		}
		for (int e = 0; e < k; e++) {
			struct hconn *h = evs[e].data.ptr;
			int r = http_read(h, false);
			if (r < 0) {
				fprintf(stderr, "bench: KV connection lost\n");
				goto out;
			}
			if (r == 0)
				continue;
			requests++;
			bool ok = h->put_phase ? h->status == 204
			                       : h->status == 200 && h->body_len == vbytes &&
			                                 memcmp(body_of(h), value, vbytes) == 0;
			if (!ok && (*errors)++ < 5)
				fprintf(stderr, "bench: KV %s answered %d\n",
				        h->put_phase ? "PUT" : "GET", h->status);
			if (!h->put_phase)
				h->seq++;
			h->put_phase = !h->put_phase;
			if (kolo_now_ns() >= end) {
				epoll_ctl(ep, EPOLL_CTL_DEL, h->fd, NULL);
				active--;
				continue;
			}
			if (kv_issue(b, h, value, vbytes) != 0)
				goto out;
		}
	}
	result = (double)requests / ((double)(kolo_now_ns() - t0) / 1e9);
out:
	for (int i = 0; c && i < conns; i++)
		conn_close(&c[i]);
	free(c);
	free(value);
	if (ep >= 0)
		close(ep);
	return result;
}

static void usage(FILE *f)
{
	fprintf(f, "usage: kolo-bench rendezvous [--workers N] [--hosts H] [--url URL --token T]\n"
	           "                             [--kv-conns C] [--kv-seconds S] [--kv-bytes B] "
	           "[--json]\n"
	           "  --workers N     simulated workers, each holding a long poll (1024)\n"
	           "  --hosts H       simulated host names the workers spread over (32)\n"
	           "  --url URL       an external server (http://HOST:PORT); default: an embedded\n"
	           "                  server on 127.0.0.1:0 with a random token\n"
	           "  --token T       the external server's token (default: KOLO_TOKEN)\n"
	           "  --kv-conns C    keep-alive connections for the KV loop (8)\n"
	           "  --kv-seconds S  duration of the KV loop (2)\n"
	           "  --kv-bytes B    value size (64)\n"
	           "  --json          also print the figures as one JSON line\n");
}

int kolo_bench_rendezvous(int argc, char **argv)
{
	static const struct option opts[] = {
	        {"workers", required_argument, NULL, 'w'},
	        {"hosts", required_argument, NULL, 'H'},
	        {"url", required_argument, NULL, 'u'},
	        {"token", required_argument, NULL, 't'},
	        {"kv-conns", required_argument, NULL, 'c'},
	        {"kv-seconds", required_argument, NULL, 's'},
	        {"kv-bytes", required_argument, NULL, 'b'},
	        {"json", no_argument, NULL, 'j'},
	        {"help", no_argument, NULL, 'h'},
	        {NULL, 0, NULL, 0},
	};
	int workers = 1024, hosts = 32, conns = 8;
	double seconds = 2;
	long vbytes = 64;
	const char *url = NULL, *token = NULL;
	bool json = false;
	int o;
	optind = 1;
	while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (o) {
		case 'w':
			workers = atoi(optarg);
			break;
		case 'H':
			hosts = atoi(optarg);
			break;
		case 'u':
			url = optarg;
			break;
		case 't':
			token = optarg;
			break;
		case 'c':
			conns = atoi(optarg);
			break;
		case 's':
			seconds = atof(optarg);
			break;
		case 'b':
			vbytes = atol(optarg);
			break;
		case 'j':
			json = true;
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (workers < 1 || hosts < 1 || conns < 1 || conns > 1024 || seconds <= 0 || vbytes < 0 ||
	    vbytes > KOLO_RDZV_MAX_BODY) {
		usage(stderr);
		return 2;
	}
	signal(SIGPIPE, SIG_IGN);
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < (rlim_t)(2 * workers + 64))
		fprintf(stderr,
		        "bench: warning: RLIMIT_NOFILE %llu may be too low for %d workers\n",
		        (unsigned long long)rl.rlim_cur, workers);

	struct bench b;
	memset(&b, 0, sizeof(b));
	struct kolo_rdzv_server *srv = NULL;
	struct kolo_errbuf eb = {{0}};
	char *env_token = NULL;
	int rc = 1;
	char host[256], port[16];
	char hex[17];
	if (kolo_random_hex(hex, 8) != KOLO_OK)
		snprintf(hex, sizeof(hex), "%d", (int)getpid());
	snprintf(b.job, sizeof(b.job), "bench-%s", hex);
	if (!url) {
		if (kolo_random_hex(b.token, 16) != KOLO_OK) {
			fprintf(stderr, "bench: no randomness for a token\n");
			return 1;
		}
		struct kolo_rdzv_server_config cfg = {.listen = "127.0.0.1:0",
		                                      .token = b.token,
		                                      .min_np = 1,
		                                      .settle_ms = 2000,
		                                      .lease_ms = 600000};
		if (kolo_rdzv_server_start(&cfg, &srv, &eb) != KOLO_OK) {
			fprintf(stderr, "bench: cannot start the server: %s\n", eb.msg);
			return 1;
		}
		snprintf(host, sizeof(host), "127.0.0.1");
		snprintf(port, sizeof(port), "%d", kolo_rdzv_server_port(srv));
	} else {
		b.external = true;
		const char *p = strncmp(url, "http://", 7) == 0 ? url + 7 : url;
		const char *colon = strrchr(p, ':');
		size_t hl = colon ? (size_t)(colon - p) : strlen(p);
		if (hl == 0 || hl >= sizeof(host)) {
			fprintf(stderr, "bench: bad --url %s\n", url);
			return 2;
		}
		memcpy(host, p, hl);
		host[hl] = '\0';
		snprintf(port, sizeof(port), "%.*s", colon ? (int)strcspn(colon + 1, "/") : 0,
		         colon ? colon + 1 : "");
		if (!port[0])
			snprintf(port, sizeof(port), "%d", KOLO_RDZV_DEFAULT_PORT);
		if (!token) {
			if (kolo_token_load(&env_token, &eb) != KOLO_OK) {
				fprintf(stderr, "bench: %s\n", eb.msg);
				return 1;
			}
			token = env_token;
		}
		snprintf(b.token, sizeof(b.token), "%s", token);
	}
	snprintf(b.hostport, sizeof(b.hostport), "%s:%s", host, port);
	struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
	if (getaddrinfo(host, port, &hints, &b.ai) != 0) {
		fprintf(stderr, "bench: cannot resolve %s\n", b.hostport);
		goto out;
	}
	printf("# rendezvous bench: %d workers on %d hosts, server %s (%s)\n", workers,
	       KOLO_MIN(hosts, workers), b.hostport, srv ? "embedded" : "external");
	fflush(stdout);
	int errors = 0;
	double ms = bench_round(&b, workers, hosts, &errors);
	if (ms < 0)
		goto out;
	printf("round formation: all %d workers had their assignment %.1f ms after the last join "
	       "(%d long polls held)\n",
	       workers, ms, workers - 1);
	fflush(stdout);
	double rps = bench_kv(&b, conns, seconds, (size_t)vbytes, &errors);
	if (rps < 0)
		goto out;
	printf("kv throughput: %.0f requests/s (PUT then GET, %d keep-alive connections, "
	       "%ld-byte values, %.1f s)\n",
	       rps, conns, vbytes, seconds);
	if (json)
		printf("{\"workers\":%d,\"hosts\":%d,\"assignment_ms\":%.3f,\"kv_requests_per_s\":%"
		       ".0f,"
		       "\"kv_connections\":%d,\"kv_value_bytes\":%ld,\"errors\":%d}\n",
		       workers, KOLO_MIN(hosts, workers), ms, rps, conns, vbytes, errors);
	if (errors)
		fprintf(stderr, "bench: %d wrong answers\n", errors);
	rc = errors ? 1 : 0;
out:
	if (b.ai)
		freeaddrinfo(b.ai);
	kolo_rdzv_server_stop(srv);
	free(env_token);
	return rc;
}
