/* Multi-process tests of the rendezvous client, kolo_init and kolorun. One
 * executable, one scenario per ctest entry:
 *
 *   launcher_test assign   RDZV_WORKER
 *   launcher_test evict    RDZV_WORKER
 *   launcher_test restart  RDZV_WORKER SERVER_PROC
 *   launcher_test late     RDZV_WORKER SERVER_PROC
 *   launcher_test kolorun  KOLORUN PRINT_ASSIGNMENT
 *   launcher_test kolorun_fail KOLORUN PRINT_ASSIGNMENT
 *   launcher_test badtoken PRINT_ASSIGNMENT
 *
 * Every wait is bounded; a child still running at the end is killed. The
 * expected assignments are computed here from the join order, independently
 * of the server's code. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core.h"
#include "rendezvous.h"

#define WAIT_MS 60000
#define MAXP    16

extern char **environ;

static int failures;

#define EXPECT(cond, ...)                                                                          \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);            \
			fprintf(stderr, __VA_ARGS__);                                              \
			fprintf(stderr, "\n");                                                     \
			failures++;                                                                \
		}                                                                                  \
	} while (0)

#define REQUIRE(cond, ...)                                                                         \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			EXPECT(cond, __VA_ARGS__);                                                 \
			cleanup_all();                                                             \
			exit(1);                                                                   \
		}                                                                                  \
	} while (0)

/* ---- child processes -------------------------------------------------- */

struct proc {
	pid_t pid;
	int out, in, err; /* pipes; -1 when not used */
	char buf[65536];
	size_t len;
	int status;
	bool reaped;
};

static struct proc *procs[64];
static int n_procs;

static void cleanup_all(void)
{
	for (int i = 0; i < n_procs; i++) {
		if (procs[i]->pid > 0 && !procs[i]->reaped) {
			kill(procs[i]->pid, SIGKILL);
			waitpid(procs[i]->pid, NULL, 0);
			procs[i]->reaped = true;
		}
	}
}

/* Starts argv with the extra environment (NULL-terminated "K=V" list); its
 * stdout (and stderr when capture_err) is read through a pipe. */
static struct proc *spawn(const char *const argv[], const char *const extra_env[], bool capture_err)
{
	struct proc *p = calloc(1, sizeof(*p));
	int o[2], i[2], e[2] = {-1, -1};
	if (!p || pipe2(o, O_CLOEXEC) || pipe2(i, O_CLOEXEC) ||
	    (capture_err && pipe2(e, O_CLOEXEC)))
		abort();
	size_t n = 0;
	while (environ[n])
		n++;
	size_t m = 0;
	while (extra_env && extra_env[m])
		m++;
	char **env = calloc(n + m + 1, sizeof(*env));
	size_t k = 0;
	for (size_t a = 0; a < n; a++) {
		bool overridden = false;
		for (size_t b = 0; b < m; b++) {
			size_t nl = strcspn(extra_env[b], "=");
			if (strncmp(environ[a], extra_env[b], nl + 1) == 0)
				overridden = true;
		}
		if (!overridden)
			env[k++] = environ[a];
	}
	for (size_t b = 0; b < m; b++)
		env[k++] = (char *)extra_env[b];
	env[k] = NULL;
	pid_t pid = fork();
	if (pid == 0) {
		dup2(o[1], STDOUT_FILENO);
		dup2(i[0], STDIN_FILENO);
		if (capture_err)
			dup2(e[1], STDERR_FILENO);
		execve(argv[0], (char *const *)argv, env);
		_exit(127);
	}
	free(env);
	close(o[1]);
	close(i[0]);
	p->pid = pid;
	p->out = o[0];
	p->in = i[1];
	p->err = -1;
	if (capture_err) {
		close(e[1]);
		p->err = e[0];
	}
	procs[n_procs++] = p;
	return p;
}

/* Reads one line of stdout into line (without '\n'). false on EOF/timeout. */
static bool read_line(struct proc *p, char *line, size_t size, int timeout_ms)
{
	uint64_t end = kolo_now_ms() + (uint64_t)timeout_ms;
	for (;;) {
		char *nl = memchr(p->buf, '\n', p->len);
		if (nl) {
			size_t n = (size_t)(nl - p->buf);
			snprintf(line, size, "%.*s", (int)n, p->buf);
			memmove(p->buf, nl + 1, p->len - n - 1);
			p->len -= n + 1;
			return true;
		}
		uint64_t now = kolo_now_ms();
		if (now >= end || p->len == sizeof(p->buf) || p->out < 0)
			return false;
		struct pollfd pf = {.fd = p->out, .events = POLLIN};
		if (poll(&pf, 1, (int)(end - now)) <= 0)
			continue;
		ssize_t r = read(p->out, p->buf + p->len, sizeof(p->buf) - p->len);
		if (r <= 0) {
			close(p->out);
			p->out = -1;
			return false;
		}
		p->len += (size_t)r;
	}
}

/* Reads lines until one starts with prefix; copies it into line. */
static bool expect_line(struct proc *p, const char *prefix, char *line, size_t size, int timeout_ms)
{
	uint64_t end = kolo_now_ms() + (uint64_t)timeout_ms;
	while (kolo_now_ms() < end) {
		if (!read_line(p, line, size, (int)(end - kolo_now_ms())))
			return false;
		if (strncmp(line, prefix, strlen(prefix)) == 0)
			return true;
		fprintf(stderr, "  (pid %d) %s\n", (int)p->pid, line);
	}
	return false;
}

/* Waits for the process to exit; kills it after timeout_ms. Returns the
 * wait status. */
static int wait_exit(struct proc *p, int timeout_ms)
{
	uint64_t end = kolo_now_ms() + (uint64_t)timeout_ms;
	while (!p->reaped) {
		int st;
		pid_t r = waitpid(p->pid, &st, WNOHANG);
		if (r == p->pid) {
			p->status = st;
			p->reaped = true;
			break;
		}
		if (kolo_now_ms() >= end) {
			fprintf(stderr, "pid %d did not exit within %d ms; killing it\n",
			        (int)p->pid, timeout_ms);
			kill(p->pid, SIGKILL);
			waitpid(p->pid, &p->status, 0);
			p->reaped = true;
			p->status = -1;
			break;
		}
		/* Drain the pipe so a chatty child never blocks on it. */
		struct pollfd pf = {.fd = p->out, .events = POLLIN};
		if (p->out >= 0 && poll(&pf, 1, 10) == 1 && p->len < sizeof(p->buf)) {
			ssize_t n = read(p->out, p->buf + p->len, sizeof(p->buf) - p->len);
			if (n <= 0) {
				close(p->out);
				p->out = -1;
			} else {
				p->len += (size_t)n;
			}
		} else if (p->out < 0) {
			poll(NULL, 0, 10);
		}
	}
	return p->status;
}

static void send_line(struct proc *p, const char *s)
{
	if (write(p->in, s, strlen(s)) < 0)
		fprintf(stderr, "write to pid %d: %s\n", (int)p->pid, strerror(errno));
}

/* ---- servers ---------------------------------------------------------- */

static const char token[] = "0123456789abcdef-test-token";
static char token_file[64]; /* for kolo-rendezvous; removed at exit */

static struct kolo_rdzv_server *server_start(int min_np, int max_np, int settle_ms, int lease_ms,
                                             char *url, size_t urlsize)
{
	struct kolo_rdzv_server_config cfg = {.listen = "127.0.0.1:0",
	                                      .token = token,
	                                      .min_np = min_np,
	                                      .max_np = max_np,
	                                      .settle_ms = settle_ms,
	                                      .lease_ms = lease_ms};
	struct kolo_rdzv_server *s = NULL;
	struct kolo_errbuf eb = {{0}};
	REQUIRE(kolo_rdzv_server_start(&cfg, &s, &eb) == KOLO_OK, "server start: %s", eb.msg);
	snprintf(url, urlsize, "http://127.0.0.1:%d", kolo_rdzv_server_port(s));
	return s;
}

/* A server in its own process; returns it with *port_out set. bin is the
 * kolo-rendezvous binary (flags, token file) or the rdzv_server_proc helper
 * (positional arguments). */
static struct proc *server_proc(const char *bin, int port, int min_np, int max_np, int lease_ms,
                                int *port_out)
{
	char listen[64], mn[16], mx[16], lease[16];
	snprintf(listen, sizeof(listen), "127.0.0.1:%d", port);
	snprintf(mn, sizeof(mn), "%d", min_np);
	snprintf(mx, sizeof(mx), "%d", max_np);
	snprintf(lease, sizeof(lease), "%d", lease_ms);
	const char *base = strrchr(bin, '/') ? strrchr(bin, '/') + 1 : bin;
	bool real = strcmp(base, "kolo-rendezvous") == 0;
	if (real && !token_file[0]) {
		snprintf(token_file, sizeof(token_file), "/tmp/kolo-launcher-test-XXXXXX");
		int fd = mkstemp(token_file);
		REQUIRE(fd >= 0 && write(fd, token, strlen(token)) == (ssize_t)strlen(token),
		        "token file: %s", strerror(errno));
		close(fd);
	}
	const char *helper_argv[] = {bin, listen, token, mn, mx, "100", lease, NULL};
	const char *real_argv[] = {
	        bin, "--listen",    listen, "--token-file", token_file, "--min-np", mn, "--max-np",
	        mx,  "--settle-ms", "100",  "--lease-ms",   lease,      NULL};
	const char *env[] = {"KOLO_TOKEN=", NULL};
	struct proc *p = spawn(real ? real_argv : helper_argv, env, false);
	char line[256];
	REQUIRE(expect_line(p, real ? "listening on " : "PORT ", line, sizeof(line), WAIT_MS),
	        "server did not start");
	*port_out = atoi(real ? strrchr(line, ':') + 1 : line + 5);
	return p;
}

/* A port that was free a moment ago (for a server that must start later). */
static int free_port(void)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t len = sizeof(a);
	REQUIRE(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
	                getsockname(fd, (struct sockaddr *)&a, &len) == 0,
	        "free port: %s", strerror(errno));
	int port = ntohs(a.sin_port);
	close(fd);
	return port;
}

/* ---- expected assignments --------------------------------------------- */

struct expect {
	char id[KOLO_RDZV_ID_MAX];
	char host[64];
	int rank, local_rank, local_size, cross_rank, cross_size;
};

/* Horovod's rules, from the join order: hosts ordered by first join, ranks
 * contiguous per host, local rank = index within the host, cross rank =
 * index of the host among the hosts with that local rank. */
static void compute_expected(struct expect *e, int n)
{
	char hosts[MAXP][64];
	int nh = 0, count[MAXP] = {0}, host_of[MAXP];
	for (int i = 0; i < n; i++) {
		int h = 0;
		while (h < nh && strcmp(hosts[h], e[i].host) != 0)
			h++;
		if (h == nh)
			snprintf(hosts[nh++], sizeof(hosts[0]), "%s", e[i].host);
		host_of[i] = h;
		e[i].local_rank = count[h]++;
	}
	int rank = 0;
	for (int h = 0; h < nh; h++)
		for (int i = 0; i < n; i++)
			if (host_of[i] == h)
				e[i].rank = rank++;
	for (int i = 0; i < n; i++) {
		e[i].local_size = count[host_of[i]];
		e[i].cross_rank = e[i].cross_size = 0;
		for (int h = 0; h < nh; h++) {
			if (count[h] > e[i].local_rank) {
				if (h < host_of[i])
					e[i].cross_rank++;
				e[i].cross_size++;
			}
		}
	}
}

struct got {
	int64_t round;
	int rank, size, lr, ls, cr, cs;
	char id[KOLO_RDZV_ID_MAX], host[64];
	char members[4096];
};

static bool parse_assign(const char *line, struct got *g)
{
	int off = 0;
	if (sscanf(line, "ASSIGN %" SCNd64 " %d %d %d %d %d %d %127s %63s %n", &g->round, &g->rank,
	           &g->size, &g->lr, &g->ls, &g->cr, &g->cs, g->id, g->host, &off) < 9)
		return false;
	snprintf(g->members, sizeof(g->members), "%s", line + off);
	return true;
}

/* Checks every field of every worker's assignment against e (by worker id). */
static void check_round(struct got *g, struct expect *e, int n, int64_t round)
{
	char want_members[4096] = "";
	for (int r = 0; r < n; r++) {
		for (int i = 0; i < n; i++) {
			if (e[i].rank != r)
				continue;
			size_t o = strlen(want_members);
			snprintf(want_members + o, sizeof(want_members) - o, "%s%d:%s:%s",
			         r ? " " : "", r, e[i].id, e[i].host);
		}
	}
	for (int i = 0; i < n; i++) {
		int j = 0;
		while (j < n && strcmp(g[j].id, e[i].id) != 0)
			j++;
		if (j == n) {
			EXPECT(0, "no assignment for worker %s", e[i].id);
			continue;
		}
		EXPECT(g[j].round == round, "%s: round %" PRId64 " != %" PRId64, e[i].id,
		       g[j].round, round);
		EXPECT(g[j].rank == e[i].rank, "%s: rank %d != %d", e[i].id, g[j].rank, e[i].rank);
		EXPECT(g[j].size == n, "%s: size %d != %d", e[i].id, g[j].size, n);
		EXPECT(g[j].lr == e[i].local_rank, "%s: local_rank %d != %d", e[i].id, g[j].lr,
		       e[i].local_rank);
		EXPECT(g[j].ls == e[i].local_size, "%s: local_size %d != %d", e[i].id, g[j].ls,
		       e[i].local_size);
		EXPECT(g[j].cr == e[i].cross_rank, "%s: cross_rank %d != %d", e[i].id, g[j].cr,
		       e[i].cross_rank);
		EXPECT(g[j].cs == e[i].cross_size, "%s: cross_size %d != %d", e[i].id, g[j].cs,
		       e[i].cross_size);
		EXPECT(strcmp(g[j].host, e[i].host) == 0, "%s: host %s != %s", e[i].id, g[j].host,
		       e[i].host);
		EXPECT(strcmp(g[j].members, want_members) == 0, "%s: members\n  got  %s\n  want %s",
		       e[i].id, g[j].members, want_members);
	}
}

/* When the join order is unknown (workers that re-registered after a server
 * restart arrive in whatever order their retries took), the rank order of
 * the members is a join order that yields the same ranks: check every field
 * against it, and that exactly the workers that joined are members. */
static void check_round_any_order(struct got *g, int n, int64_t round, const struct expect *joined)
{
	struct expect e[MAXP];
	memset(e, 0, sizeof(e));
	char copy[4096];
	snprintf(copy, sizeof(copy), "%s", g[0].members);
	int k = 0;
	for (char *save = NULL, *t = strtok_r(copy, " ", &save); t && k < MAXP;
	     t = strtok_r(NULL, " ", &save), k++) {
		char *c1 = strchr(t, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
		REQUIRE(c1 && c2 && atoi(t) == k, "bad member %s", t);
		snprintf(e[k].id, sizeof(e[k].id), "%.*s", (int)(c2 - c1 - 1), c1 + 1);
		snprintf(e[k].host, sizeof(e[k].host), "%s", c2 + 1);
	}
	REQUIRE(k == n, "%d members, want %d", k, n);
	for (int i = 0; i < n; i++) {
		int j = 0;
		while (j < n && strcmp(e[j].id, joined[i].id) != 0)
			j++;
		EXPECT(j < n && strcmp(e[j].host, joined[i].host) == 0,
		       "worker %s@%s is not a member", joined[i].id, joined[i].host);
	}
	compute_expected(e, n);
	check_round(g, e, n, round);
}

/* Starts n workers one after another (each joined before the next starts,
 * so the join order is known) and records their ids in e. */
static void start_workers(struct proc **w, struct expect *e, int n, const char *bin,
                          const char *url, const char *job, const char *const hosts[],
                          const char *const extra_args[], int extra_at)
{
	for (int i = 0; i < n; i++) {
		char env_url[256], env_job[160], env_host[320], env_tok[96];
		snprintf(env_url, sizeof(env_url), "KOLO_RENDEZVOUS=%s", url);
		snprintf(env_job, sizeof(env_job), "KOLO_JOB=%s", job);
		snprintf(env_host, sizeof(env_host), "KOLO_HOSTNAME=%s", hosts[i]);
		snprintf(env_tok, sizeof(env_tok), "KOLO_TOKEN=%s", token);
		const char *env[] = {env_url, env_job, env_host, env_tok, "KOLO_TOKEN_FILE=", NULL};
		const char *argv[8] = {bin};
		int a = 1;
		for (int k = 0; i == extra_at && extra_args && extra_args[k]; k++)
			argv[a++] = extra_args[k];
		for (int k = 0; i != extra_at && extra_args && extra_args[k + 4]; k++)
			argv[a++] = extra_args[k + 4];
		argv[a] = NULL;
		w[i] = spawn(argv, env, false);
		char line[256];
		REQUIRE(expect_line(w[i], "JOINED ", line, sizeof(line), WAIT_MS),
		        "worker %d did not join", i);
		snprintf(e[i].id, sizeof(e[i].id), "%.127s", line + 7);
		snprintf(e[i].host, sizeof(e[i].host), "%s", hosts[i]);
	}
}

static void collect_round(struct proc **w, struct got *g, int n)
{
	char line[8192];
	for (int i = 0; i < n; i++) {
		REQUIRE(expect_line(w[i], "ASSIGN ", line, sizeof(line), WAIT_MS),
		        "worker %d got no assignment", i);
		REQUIRE(parse_assign(line, &g[i]), "bad line %s", line);
	}
}

/* ---- scenarios -------------------------------------------------------- */

/* 9 workers on 3 hosts joining interleaved, unevenly (4/3/2). */
static void t_assign(const char *worker)
{
	enum { N = 9 };
	static const char *const hosts[N] = {"hb", "ha", "hb", "hc", "ha", "hb", "hc", "ha", "hb"};
	char url[128];
	struct kolo_rdzv_server *s = server_start(N, N, 60000, 10000, url, sizeof(url));
	struct proc *w[N];
	struct expect e[N];
	struct got g[N];
	const char *args[] = {NULL, NULL, NULL, NULL, "--hold", NULL};
	start_workers(w, e, N, worker, url, "assign", hosts, args, -1);
	compute_expected(e, N);
	collect_round(w, g, N);
	check_round(g, e, N, 1);
	for (int i = 0; i < N; i++)
		send_line(w[i], "go\n");
	for (int i = 0; i < N; i++)
		EXPECT(WIFEXITED(wait_exit(w[i], WAIT_MS)) && WEXITSTATUS(w[i]->status) == 0,
		       "worker %d status %d", i, w[i]->status);
	kolo_rdzv_server_stop(s);
}

/* A worker that stops heartbeating is evicted; the survivors get round 2 at
 * once, in their old relative order. */
static void t_evict(const char *worker)
{
	enum { N = 4 };
	static const char *const hosts[N] = {"ha", "hb", "ha", "hb"};
	char url[128];
	struct kolo_rdzv_server *s = server_start(2, N, 60000, 1500, url, sizeof(url));
	struct proc *w[N];
	struct expect e[N], e2[N - 1];
	struct got g[N], g2[N - 1];
	/* Worker 1 (rank 2: host hb) never heartbeats; the others wait for 2 rounds. */
	const char *args[] = {"--no-heartbeat", "--then-wait", NULL,     NULL,
	                      "--rounds",       "2",           "--hold", NULL};
	start_workers(w, e, N, worker, url, "evict", hosts, args, 1);
	compute_expected(e, N);
	collect_round(w, g, N);
	check_round(g, e, N, 1);
	uint64_t t0 = kolo_now_ms();
	struct proc *surv[N - 1];
	for (int i = 0, k = 0; i < N; i++) {
		if (i == 1)
			continue;
		e2[k] = e[i];
		surv[k++] = w[i];
	}
	compute_expected(e2, N - 1);
	collect_round(surv, g2, N - 1);
	uint64_t took = kolo_now_ms() - t0;
	check_round(g2, e2, N - 1, 2);
	EXPECT(took < 1500 + 5000, "the new round took %" PRIu64 " ms", took);
	for (int i = 0; i < N - 1; i++)
		send_line(surv[i], "go\n");
	send_line(w[1], "go\n");
	char line[256];
	EXPECT(expect_line(w[1], "EVICTED", line, sizeof(line), WAIT_MS),
	       "the silent worker was not told it was evicted");
	for (int i = 0; i < N; i++) {
		int st = wait_exit(w[i], WAIT_MS);
		int want = i == 1 ? 3 : 0;
		EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == want, "worker %d status %d", i, st);
	}
	kolo_rdzv_server_stop(s);
}

/* Kill the server (SIGKILL) while clients wait for a round, restart it on the
 * same port: the clients re-register and still get their round. Then kill it
 * again while the round runs: heartbeats re-register with round and rank, the
 * KV works, and nobody notices. */
static void t_restart(const char *worker, const char *server_bin)
{
	enum { N = 4 };
	static const char *const hosts[N] = {"ha", "hb", "ha", "hc"};
	int port;
	struct proc *srv = server_proc(server_bin, 0, N, N, 1500, &port);
	char url[128];
	snprintf(url, sizeof(url), "http://127.0.0.1:%d", port);
	struct proc *w[N];
	struct expect e[N];
	struct got g[N];
	const char *args[] = {NULL, NULL, NULL, NULL, "--kv", NULL};
	/* Three join and wait; the round needs four. */
	start_workers(w, e, N - 1, worker, url, "restart", hosts, args, -1);
	kill(srv->pid, SIGKILL);
	wait_exit(srv, WAIT_MS);
	int port2;
	srv = server_proc(server_bin, port, N, N, 1500, &port2);
	REQUIRE(port2 == port, "restarted on %d, not %d", port2, port);
	start_workers(w + N - 1, e + N - 1, 1, worker, url, "restart", hosts + N - 1, args, -1);
	/* The waiting workers re-registered under their old ids. */
	collect_round(w, g, N);
	check_round_any_order(g, N, 1, e);
	/* Second restart, while the round runs. */
	kill(srv->pid, SIGKILL);
	wait_exit(srv, WAIT_MS);
	srv = server_proc(server_bin, port, N, N, 1500, &port2);
	REQUIRE(port2 == port, "restarted on %d, not %d", port2, port);
	/* The restarted server rebuilds round 1 from the heartbeats' claims. */
	struct kolo_rdzv_client_config cc = {.url = url,
	                                     .job = "restart",
	                                     .token = token,
	                                     .host = "driver",
	                                     .deadline_ms = 5000};
	struct kolo_rdzv_client *c = NULL;
	struct kolo_errbuf eb = {{0}};
	REQUIRE(kolo_rdzv_client_create(&cc, &c, &eb) == KOLO_OK, "client: %s", eb.msg);
	bool rebuilt = false;
	char *status = NULL;
	for (uint64_t end = kolo_now_ms() + WAIT_MS; !rebuilt && kolo_now_ms() < end;) {
		free(status);
		status = NULL;
		if (kolo_rdzv_job_status(c, &status) == KOLO_OK) {
			json_t *j = json_loads(status, 0, NULL);
			json_t *m = json_object_get(j, "members");
			rebuilt = json_integer_value(json_object_get(j, "round")) == 1 &&
			          json_is_string(json_object_get(j, "state")) &&
			          strcmp(json_string_value(json_object_get(j, "state")),
			                 "running") == 0 &&
			          json_array_size(m) == N;
			json_decref(j);
		}
		if (!rebuilt)
			kolo_sleep_ms(50); /* polling the server's state, bounded */
	}
	EXPECT(rebuilt, "the server did not rebuild round 1: %s", status ? status : "(none)");
	free(status);
	kolo_rdzv_client_destroy(c);
	for (int i = 0; i < N; i++)
		send_line(w[i], "go\n");
	char line[256];
	for (int i = 0; i < N; i++) {
		EXPECT(expect_line(w[i], "KV ok", line, sizeof(line), WAIT_MS), "worker %d: KV", i);
		EXPECT(expect_line(w[i], "HB ok", line, sizeof(line), WAIT_MS), "worker %d: HB", i);
		EXPECT(expect_line(w[i], "DONE", line, sizeof(line), WAIT_MS), "worker %d: done",
		       i);
		int st = wait_exit(w[i], WAIT_MS);
		EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == 0, "worker %d status %d", i, st);
	}
	kill(srv->pid, SIGTERM);
	EXPECT(WIFEXITED(wait_exit(srv, WAIT_MS)), "server did not stop on SIGTERM");
}

/* The client starts before the server exists and retries until it is up;
 * with no server at all it fails by its deadline with a clear message. */
static void t_late(const char *worker, const char *server_bin)
{
	int port = free_port();
	char env_url[128], env_tok[96];
	snprintf(env_url, sizeof(env_url), "KOLO_RENDEZVOUS=http://127.0.0.1:%d", port);
	snprintf(env_tok, sizeof(env_tok), "KOLO_TOKEN=%s", token);
	const char *env[] = {env_url,
	                     env_tok,
	                     "KOLO_JOB=late",
	                     "KOLO_HOSTNAME=ha",
	                     "KOLO_TOKEN_FILE=",
	                     "KOLO_RDZV_DEADLINE_MS=30000",
	                     NULL};
	const char *argv[] = {worker, NULL};
	struct proc *w = spawn(argv, env, false);
	/* Let the client fail to connect a few times first (this is the
	 * scenario, not a synchronisation). */
	kolo_sleep_ms(700);
	int port2;
	struct proc *srv = server_proc(server_bin, port, 1, 1, 5000, &port2);
	REQUIRE(port2 == port, "server on %d, not %d", port2, port);
	char line[512];
	EXPECT(expect_line(w, "JOINED", line, sizeof(line), WAIT_MS), "late join failed");
	EXPECT(expect_line(w, "ASSIGN 1 0 1", line, sizeof(line), WAIT_MS), "no assignment");
	int st = wait_exit(w, WAIT_MS);
	EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == 0, "worker status %d", st);
	kill(srv->pid, SIGTERM);
	wait_exit(srv, WAIT_MS);

	/* Nobody listens: a clear error after the deadline. */
	const char *env2[] = {env_url,
	                      env_tok,
	                      "KOLO_JOB=late",
	                      "KOLO_HOSTNAME=ha",
	                      "KOLO_TOKEN_FILE=",
	                      "KOLO_RDZV_DEADLINE_MS=800",
	                      NULL};
	uint64_t t0 = kolo_now_ms();
	w = spawn(argv, env2, false);
	EXPECT(expect_line(w, "ERROR", line, sizeof(line), WAIT_MS), "no error line");
	uint64_t took = kolo_now_ms() - t0;
	EXPECT(strstr(line, "KOLO_ERENDEZVOUS") && strstr(line, "unreachable"), "error: %s", line);
	EXPECT(took >= 800 && took < 20000, "failed after %" PRIu64 " ms", took);
	wait_exit(w, WAIT_MS);
}

/* Runs kolorun and returns its stdout lines in out (NUL-separated). */
static struct proc *run_kolorun(const char *kolorun, const char *prog, const char *const extra[],
                                const char *const env[])
{
	const char *argv[16] = {kolorun};
	int a = 1;
	for (int k = 0; extra[k]; k++)
		argv[a++] = extra[k];
	argv[a++] = "--";
	argv[a++] = prog;
	argv[a] = NULL;
	return spawn(argv, env, false);
}

static void t_kolorun(const char *kolorun, const char *prog)
{
	const char *extra[] = {"-np", "4", NULL};
	const char *env[] = {"KOLO_RENDEZVOUS=", NULL};
	struct proc *p = run_kolorun(kolorun, prog, extra, env);
	bool seen[4] = {false};
	char line[512];
	int n = 0;
	while (n < 4 && expect_line(p, "[", line, sizeof(line), WAIT_MS)) {
		int pre, rank, size, lr, ls, cr, cs;
		if (sscanf(line,
		           "[%d] rank %d size %d local_rank %d local_size %d cross_rank %d "
		           "cross_size %d",
		           &pre, &rank, &size, &lr, &ls, &cr, &cs) != 7) {
			fprintf(stderr, "  %s\n", line);
			continue;
		}
		n++;
		EXPECT(pre == rank, "prefix [%d] on rank %d's line", pre, rank);
		EXPECT(rank >= 0 && rank < 4 && !seen[rank], "rank %d twice or out of range", rank);
		if (rank >= 0 && rank < 4)
			seen[rank] = true;
		EXPECT(size == 4 && lr == rank && ls == 4 && cr == 0 && cs == 1, "line: %s", line);
	}
	EXPECT(n == 4, "%d assignment lines", n);
	int st = wait_exit(p, WAIT_MS);
	EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == 0, "kolorun status %d", st);
}

static void t_kolorun_fail(const char *kolorun, const char *prog)
{
	/* Rank 2 exits with 7 after kolo_init; the others block until killed. */
	const char *extra[] = {"-np", "4", "--grace-ms", "2000", NULL};
	const char *env[] = {"KOLO_RENDEZVOUS=", "PRINT_ASSIGNMENT_FAIL_RANK=2",
	                     "PRINT_ASSIGNMENT_FAIL_CODE=7", NULL};
	uint64_t t0 = kolo_now_ms();
	struct proc *p = run_kolorun(kolorun, prog, extra, env);
	int st = wait_exit(p, WAIT_MS);
	uint64_t took = kolo_now_ms() - t0;
	EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == 7, "kolorun status %d (want exit 7)", st);
	EXPECT(took < 30000, "kolorun took %" PRIu64 " ms", took);
	/* kolorun waited for every worker: none is left running. */
	char line[512];
	int hanging = 0;
	while (read_line(p, line, sizeof(line), 100))
		if (strstr(line, "waiting for SIGTERM"))
			hanging++;
	EXPECT(hanging == 3, "%d workers were running when rank 2 failed", hanging);
}

static void t_badtoken(const char *prog)
{
	char url[128];
	struct kolo_rdzv_server *s = server_start(1, 1, 100, 10000, url, sizeof(url));
	char env_url[160];
	snprintf(env_url, sizeof(env_url), "KOLO_RENDEZVOUS=%s", url);
	const char *env[] = {env_url, "KOLO_TOKEN=not-the-token", "KOLO_TOKEN_FILE=", NULL};
	const char *argv[] = {prog, NULL};
	struct proc *p = spawn(argv, env, true);
	/* print_assignment prints the failure on stdout. */
	char line[1024];
	EXPECT(expect_line(p, "kolo_init", line, sizeof(line), WAIT_MS), "no failure line");
	EXPECT(strstr(line, "KOLO_EAUTH") && strstr(line, "401") && strstr(line, "KOLO_TOKEN"),
	       "unclear error: %s", line);
	int st = wait_exit(p, WAIT_MS);
	EXPECT(WIFEXITED(st) && WEXITSTATUS(st) != 0, "status %d", st);
	kolo_rdzv_server_stop(s);
}

int main(int argc, char **argv)
{
	signal(SIGPIPE, SIG_IGN);
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc >= 3 && strcmp(argv[1], "assign") == 0)
		t_assign(argv[2]);
	else if (argc >= 3 && strcmp(argv[1], "evict") == 0)
		t_evict(argv[2]);
	else if (argc >= 4 && strcmp(argv[1], "restart") == 0)
		t_restart(argv[2], argv[3]);
	else if (argc >= 4 && strcmp(argv[1], "late") == 0)
		t_late(argv[2], argv[3]);
	else if (argc >= 4 && strcmp(argv[1], "kolorun") == 0)
		t_kolorun(argv[2], argv[3]);
	else if (argc >= 4 && strcmp(argv[1], "kolorun_fail") == 0)
		t_kolorun_fail(argv[2], argv[3]);
	else if (argc >= 3 && strcmp(argv[1], "badtoken") == 0)
		t_badtoken(argv[2]);
	else {
		fprintf(stderr, "usage: see the comment at the top of launcher_test.c\n");
		return 2;
	}
	cleanup_all();
	for (int i = 0; i < n_procs; i++) {
		if (procs[i]->out >= 0)
			close(procs[i]->out);
		if (procs[i]->err >= 0)
			close(procs[i]->err);
		close(procs[i]->in);
		free(procs[i]);
	}
	if (token_file[0])
		unlink(token_file);
	printf("%s: %s (%d failures)\n", argv[1], failures ? "FAIL" : "ok", failures);
	return failures ? 1 : 0;
}
