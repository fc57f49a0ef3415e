/* Multi-process tests of how a job ends after a failure. One scenario per
 * ctest entry:
 *
 *   failure_test pods KOLORUN SERVER WORKER [VICTIM [async]]
 *       Four "pods" (each `kolorun -np 1 --rendezvous URL -- WORKER`) against
 *       an external kolo-rendezvous, in a loop of allreduces; the worker of
 *       rank VICTIM (default: a random one) is SIGKILLed. Every survivor
 *       must fail and exit, non-zero, within the bound of the kill.
 *   failure_test pod_launcher KOLORUN SERVER WORKER
 *       The same, but one pod's kolorun is SIGKILLed: its worker must die
 *       with it, and the other pods must exit as after a worker's death.
 *   failure_test launcher KOLORUN WORKER
 *       `kolorun -np 3 -- WORKER` (embedded server) is SIGKILLed: its
 *       workers and its server must be gone within the bound.
 *   failure_test late KOLORUN SERVER WORKER VICTIM [pod] [ABORT_RANK]
 *       Four pods finish their loop; rank VICTIM lingers before
 *       kolo_finalize() and is SIGKILLed there (pod: its kolorun is), while
 *       the others already wait in kolo_finalize() (no ring of theirs fails).
 *       They must not wait for it: with its kolorun alive, kolorun reports
 *       it; with ABORT_RANK, that rank calls kolo_abort() 0.5 s after the
 *       loop, and its "0" verdict must end rank 0's gather even though the
 *       rank rank 0 waits for is the dead one. Exit times within the bound.
 *   failure_test clean KOLORUN SERVER WORKER
 *       No failure: four pods finish, rank 2 sleeps before kolo_finalize()
 *       and the others must wait for it there; all exit 0.
 *   failure_test restart KOLORUN SERVER WORKER
 *       Elastic: the server is SIGKILLed and restarted on its port; once the
 *       workers are back on it, they start an alltoall per step, which
 *       connects ranks that are not ring neighbours for the first time:
 *       their addresses, published before the restart, must be there again
 *       (no stall of KOLO_TIMEOUT_MS, no re-form). Then a worker is
 *       SIGKILLed and the survivors must re-form within the bound and go on.
 *
 * The bound (FAILURE_TEST_BOUND_MS, default 2000) is what the tests assert
 * on every exit time; the sanitizer builds give more (tests/failure/
 * CMakeLists.txt). Times are measured from the kill to the driver's reaping
 * of each process. The driver is a child subreaper, so workers orphaned by a
 * dead kolorun are reparented to it and reaped here: "gone" means reaped.
 * Every wait has a deadline; everything still running at the end is killed. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core.h"
#include "rendezvous.h"

#define MAXP    8
#define WAIT_MS 90000

extern char **environ;

static int failures;

/* ok is evaluated once: REQUIRE's condition is often a wait. */
#define CHECK_AT(ok, text, ...)                                                                    \
	do {                                                                                       \
		if (!(ok)) {                                                                       \
			fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, text);             \
			fprintf(stderr, __VA_ARGS__);                                              \
			fprintf(stderr, "\n");                                                     \
			failures++;                                                                \
		}                                                                                  \
	} while (0)

#define EXPECT(cond, ...) CHECK_AT(cond, #cond, __VA_ARGS__)

#define REQUIRE(cond, ...)                                                                         \
	do {                                                                                       \
		bool ok_ = (cond);                                                                 \
		CHECK_AT(ok_, #cond, __VA_ARGS__);                                                 \
		if (!ok_) {                                                                        \
			cleanup_all();                                                             \
			exit(1);                                                                   \
		}                                                                                  \
	} while (0)

/* A kolorun process (a "pod") and what its output said. */
struct pod {
	pid_t pid;
	int np;
	int rank0; /* np 1: its worker's first rank (a re-form changes the prefix) */
	int out;   /* its stdout and stderr, -1 at EOF */
	char buf[16384];
	size_t len;
	bool reaped;
	int status;
	uint64_t exit_ms; /* when reaped */
};

/* A worker, by its first rank, from the lines its kolorun prefixed with
 * "[rank] " (for a pod of one worker, every line of the pod). */
struct worker {
	pid_t pid; /* 0 until READY */
	int pod;
	int64_t step, round;
	int size;
	uint64_t round_at_ms;
	bool triggered;
	bool failed, wrong;
	int64_t finalize_ms; /* -1 until FINALIZED */
	uint64_t failed_at_ms;
	bool reaped; /* reaped here: its kolorun had died */
	int status;
	uint64_t exit_ms;
	char url[128];
};

static struct pod pods[MAXP];
static int n_pods;
static struct worker workers[MAXP];
static const char *kolorun_bin, *server_bin, *worker_bin;
static char job[64], url[128];
static const char token[] = "failure-test-token-0123456789abcdef";
static pid_t srv_pid = -1;
static int srv_out = -1;
static int bound_ms = 2000;
static const char *worker_args[5] = {"262144", "0", NULL, NULL, NULL}; /* count, steps, ... */
static const char *extra_env[8];
static const char *const *launcher_extra; /* extra kolorun options */

static void cleanup_all(void)
{
	for (int r = 0; r < MAXP; r++)
		if (workers[r].pid > 0 && !workers[r].reaped)
			kill(workers[r].pid, SIGKILL);
	for (int i = 0; i < n_pods; i++)
		if (!pods[i].reaped)
			kill(pods[i].pid, SIGKILL);
	if (srv_pid > 0)
		kill(srv_pid, SIGKILL);
	/* We are a subreaper: reap everything, orphans included. */
	while (waitpid(-1, NULL, 0) > 0 || errno == EINTR) {
	}
	srv_pid = -1;
}

static char **child_env(void)
{
	static char tok[96];
	snprintf(tok, sizeof(tok), "KOLO_TOKEN=%s", token);
	const char *mine[] = {tok, "KOLO_IFACE=127.0.0.1",
	                      "KOLO_TOKEN_FILE=", "KOLO_LOG_LEVEL=warn"};
	size_t n = 0, m = KOLO_ARRAY_SIZE(mine), x = 0;
	while (environ[n])
		n++;
	while (extra_env[x])
		x++;
	char **env = calloc(n + m + x + 1, sizeof(*env));
	REQUIRE(env, "out of memory");
	size_t k = 0;
	/* Our own KOLO_SHM (the ctest ENVIRONMENT) passes; other KOLO_ settings do not. */
	for (size_t a = 0; a < n; a++)
		if ((strncmp(environ[a], "KOLO_", 5) != 0 ||
		     strncmp(environ[a], "KOLO_SHM=", 9) == 0) &&
		    strncmp(environ[a], "HOROVOD_", 8) != 0)
			env[k++] = environ[a];
	for (size_t b = 0; b < m; b++)
		env[k++] = (char *)mine[b];
	for (size_t b = 0; b < x; b++)
		env[k++] = (char *)extra_env[b];
	env[k] = NULL;
	return env;
}

/* Starts kolorun with `np` workers; external server when url is set. */
static struct pod *start_pod(int np, bool external)
{
	REQUIRE(n_pods < MAXP, "too many pods");
	struct pod *p = &pods[n_pods++];
	memset(p, 0, sizeof(*p));
	int o[2];
	REQUIRE(pipe2(o, O_CLOEXEC) == 0, "pipe: %s", strerror(errno));
	char nps[16];
	snprintf(nps, sizeof(nps), "%d", np);
	const char *argv[24];
	int a = 0;
	argv[a++] = kolorun_bin;
	argv[a++] = "-np";
	argv[a++] = nps;
	argv[a++] = "--job";
	argv[a++] = job;
	if (external) {
		argv[a++] = "--rendezvous";
		argv[a++] = url;
	}
	for (int i = 0; launcher_extra && launcher_extra[i]; i++)
		argv[a++] = launcher_extra[i];
	argv[a++] = "--";
	argv[a++] = worker_bin;
	for (int i = 0; worker_args[i]; i++)
		argv[a++] = worker_args[i];
	argv[a] = NULL;
	char **env = child_env();
	pid_t pid = fork();
	if (pid == 0) {
		dup2(o[1], STDOUT_FILENO);
		dup2(o[1], STDERR_FILENO);
		execve(argv[0], (char *const *)argv, env);
		_exit(127);
	}
	free(env);
	close(o[1]);
	REQUIRE(pid > 0, "fork: %s", strerror(errno));
	p->pid = pid;
	p->out = o[0];
	p->np = np;
	p->rank0 = -1;
	return p;
}

static void on_line(int pod, const char *line)
{
	int rank = -1, n = 0;
	if (sscanf(line, "[%d] %n", &rank, &n) != 1 || n == 0 || rank < 0 || rank >= MAXP) {
		fprintf(stderr, "  pod %d: %s\n", pod, line);
		return;
	}
	const char *l = line + n;
	int r, size, pid;
	long long v;
	bool ready = sscanf(l, "READY rank %d size %d pid %d", &r, &size, &pid) == 3;
	struct pod *p = &pods[pod];
	if (p->np == 1 && p->rank0 < 0 && ready)
		p->rank0 = rank;
	struct worker *w = &workers[p->np == 1 && p->rank0 >= 0 ? p->rank0 : rank];
	if (ready) {
		w->pid = pid;
		w->pod = pod;
		w->size = size;
		w->step = -1;
		w->finalize_ms = -1;
	} else if (sscanf(l, "STEP %lld", &v) == 1) {
		w->step = v;
	} else if (sscanf(l, "ROUND %lld", &v) == 1) {
		w->round = v;
		w->round_at_ms = kolo_now_ms();
		fprintf(stderr, "  pod %d: %s\n", pod, line);
	} else if (sscanf(l, "TRIGGERED %lld", &v) == 1) {
		w->triggered = true;
	} else if (sscanf(l, "FINALIZED %lld", &v) == 1) {
		w->finalize_ms = v;
		fprintf(stderr, "  pod %d: %s\n", pod, line);
	} else if (sscanf(l, "URL %127s", w->url) == 1) {
	} else {
		if (strncmp(l, "FAILED", 6) == 0 && !w->failed) {
			w->failed = true;
			w->failed_at_ms = kolo_now_ms();
		}
		if (strncmp(l, "WRONG", 5) == 0)
			w->wrong = true;
		fprintf(stderr, "  pod %d: %s\n", pod, line);
	}
}

static void reap(void)
{
	for (;;) {
		int st;
		pid_t pid = waitpid(-1, &st, WNOHANG);
		if (pid <= 0)
			return;
		uint64_t now = kolo_now_ms();
		for (int i = 0; i < n_pods; i++)
			if (pods[i].pid == pid && !pods[i].reaped) {
				pods[i].reaped = true;
				pods[i].status = st;
				pods[i].exit_ms = now;
			}
		for (int r = 0; r < MAXP; r++)
			if (workers[r].pid == pid && !workers[r].reaped) {
				workers[r].reaped = true;
				workers[r].status = st;
				workers[r].exit_ms = now;
			}
	}
}

/* Reads the pods' output and reaps for up to ms milliseconds. */
static void pump(int ms)
{
	struct pollfd pf[MAXP + 1];
	int idx[MAXP + 1], n = 0;
	for (int i = 0; i < n_pods; i++) {
		if (pods[i].out >= 0) {
			pf[n] = (struct pollfd){.fd = pods[i].out, .events = POLLIN};
			idx[n++] = i;
		}
	}
	if (srv_out >= 0) {
		pf[n] = (struct pollfd){.fd = srv_out, .events = POLLIN};
		idx[n++] = -1;
	}
	if (poll(pf, (nfds_t)n, ms) > 0) {
		for (int k = 0; k < n; k++) {
			if (!(pf[k].revents & (POLLIN | POLLHUP | POLLERR)))
				continue;
			if (idx[k] < 0) { /* the server's log: drain it */
				char tmp[4096];
				ssize_t r = read(srv_out, tmp, sizeof(tmp));
				if (r <= 0) {
					close(srv_out);
					srv_out = -1;
				}
				continue;
			}
			struct pod *p = &pods[idx[k]];
			ssize_t r = read(p->out, p->buf + p->len, sizeof(p->buf) - 1 - p->len);
			if (r <= 0) {
				close(p->out);
				p->out = -1;
				continue;
			}
			p->len += (size_t)r;
			char *nl;
			while ((nl = memchr(p->buf, '\n', p->len)) != NULL) {
				*nl = '\0';
				on_line(idx[k], p->buf);
				size_t used = (size_t)(nl - p->buf) + 1;
				memmove(p->buf, nl + 1, p->len - used);
				p->len -= used;
			}
			if (p->len == sizeof(p->buf) - 1)
				p->len = 0;
		}
	}
	reap();
}

typedef bool (*cond_fn)(void *arg);

static bool wait_for(cond_fn fn, void *arg, int timeout_ms)
{
	uint64_t end = kolo_now_ms() + (uint64_t)timeout_ms;
	while (!fn(arg)) {
		if (kolo_now_ms() >= end)
			return false;
		pump(10);
	}
	return true;
}

/* Every one of n workers is past step *arg. */
struct steps_arg {
	int n;
	int64_t step;
};

static bool all_past(void *arg)
{
	struct steps_arg *a = arg;
	for (int r = 0; r < a->n; r++)
		if (workers[r].pid == 0 || workers[r].step < a->step)
			return false;
	return true;
}

static bool pods_reaped(void *arg)
{
	(void)arg;
	for (int i = 0; i < n_pods; i++)
		if (!pods[i].reaped)
			return false;
	return true;
}

/* ---- the rendezvous server --------------------------------------------- */

static int server_start(int port, int min_np, int max_np)
{
	char listen[64], mins[16], maxs[16];
	snprintf(listen, sizeof(listen), "127.0.0.1:%d", port);
	snprintf(mins, sizeof(mins), "%d", min_np);
	snprintf(maxs, sizeof(maxs), "%d", max_np);
	int o[2];
	REQUIRE(pipe2(o, O_CLOEXEC) == 0, "pipe");
	const char *argv[] = {server_bin, "--listen",    listen, "--min-np",   mins,    "--max-np",
	                      maxs,       "--settle-ms", "200",  "--lease-ms", "10000", NULL};
	char **env = child_env();
	pid_t pid = fork();
	if (pid == 0) {
		dup2(o[1], STDOUT_FILENO);
		execve(argv[0], (char *const *)argv, env);
		_exit(127);
	}
	free(env);
	close(o[1]);
	REQUIRE(pid > 0, "fork");
	srv_pid = pid;
	char buf[1024];
	size_t len = 0;
	uint64_t end = kolo_now_ms() + 20000;
	while (kolo_now_ms() < end && len < sizeof(buf) - 1) {
		struct pollfd pf = {.fd = o[0], .events = POLLIN};
		if (poll(&pf, 1, 100) <= 0)
			continue;
		ssize_t r = read(o[0], buf + len, sizeof(buf) - 1 - len);
		if (r <= 0)
			break;
		len += (size_t)r;
		buf[len] = '\0';
		char *l = strstr(buf, "listening on ");
		if (l && strchr(l, '\n')) {
			srv_out = o[0];
			int got = atoi(strrchr(l, ':') + 1);
			snprintf(url, sizeof(url), "http://127.0.0.1:%d", got);
			return got;
		}
	}
	REQUIRE(false, "the rendezvous server did not start");
	return -1;
}

static void server_kill(void)
{
	kill(srv_pid, SIGKILL);
	waitpid(srv_pid, NULL, 0);
	srv_pid = -1;
	if (srv_out >= 0)
		close(srv_out);
	srv_out = -1;
}

/* true when something accepts TCP connections at this URL's port. */
static bool url_listens(const char *u)
{
	const char *colon = strrchr(u, ':');
	if (!colon)
		return false;
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in sa = {.sin_family = AF_INET,
	                         .sin_port = htons((uint16_t)atoi(colon + 1)),
	                         .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	bool ok = connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
	close(fd);
	return ok;
}

/* ---- scenarios ---------------------------------------------------------- */

static void start_pods(int n)
{
	for (int i = 0; i < n; i++)
		start_pod(1, true);
	struct steps_arg sa = {n, 2};
	REQUIRE(wait_for(all_past, &sa, WAIT_MS), "the %d workers did not start their loop", n);
}

static void kill_at_random_point(pid_t pid)
{
	pump((int)kolo_random_below(30));
	kill(pid, SIGKILL);
}

/* Checks that every pod but `except` exited non-zero within the bound of
 * t0, and prints the times. */
static void check_survivor_exits(int except, uint64_t t0, const char *what)
{
	REQUIRE(wait_for(pods_reaped, NULL, 60000), "some pods still run 60 s after %s", what);
	for (int r = 0; r < n_pods; r++) {
		struct worker *w = &workers[r];
		struct pod *p = &pods[w->pod];
		if (w->pod == except)
			continue;
		uint64_t ms = p->exit_ms - t0;
		fprintf(stderr,
		        "%s: rank %d: failed after %" PRIu64 " ms, finalize took %" PRId64
		        " ms, its kolorun exited after %" PRIu64 " ms with status %d\n",
		        what, r, w->failed ? w->failed_at_ms - t0 : 0, w->finalize_ms, ms,
		        WIFEXITED(p->status) ? WEXITSTATUS(p->status) : 128 + WTERMSIG(p->status));
		EXPECT(ms <= (uint64_t)bound_ms, "rank %d's pod exited %" PRIu64 " ms after %s", r,
		       ms, what);
		EXPECT(WIFEXITED(p->status) && WEXITSTATUS(p->status) != 0,
		       "rank %d's pod: status %d, want a non-zero exit", r, p->status);
		EXPECT(w->failed, "rank %d did not report a failure", r);
		EXPECT(!w->wrong, "rank %d computed a wrong sum", r);
	}
}

static void t_pods(int victim)
{
	server_start(0, 4, 4);
	start_pods(4);
	if (victim < 0)
		victim = (int)kolo_random_below(4);
	struct worker *v = &workers[victim];
	REQUIRE(v->pid > 0, "no rank %d", victim);
	kill_at_random_point(v->pid);
	uint64_t t0 = kolo_now_ms();
	char what[64];
	snprintf(what, sizeof(what), "SIGKILL of rank %d", victim);
	check_survivor_exits(v->pod, t0, what);
	struct pod *vp = &pods[v->pod];
	EXPECT(WIFEXITED(vp->status) && WEXITSTATUS(vp->status) == 128 + SIGKILL,
	       "the victim's kolorun: status %d, want exit %d", vp->status, 128 + SIGKILL);
}

static void t_pod_launcher(void)
{
	worker_args[2] = "quiet"; /* not killed by SIGPIPE: only its death signal can */
	server_start(0, 4, 4);
	start_pods(4);
	int victim = (int)kolo_random_below(4);
	struct worker *v = &workers[victim];
	struct pod *vp = &pods[v->pod];
	kill_at_random_point(vp->pid);
	uint64_t t0 = kolo_now_ms();
	char what[64];
	snprintf(what, sizeof(what), "SIGKILL of rank %d's kolorun", victim);
	check_survivor_exits(v->pod, t0, what);
	/* Its worker was reparented to us: it must be gone (reaped) too. */
	uint64_t end = kolo_now_ms() + (uint64_t)bound_ms;
	while (!v->reaped && kolo_now_ms() < end)
		pump(10);
	EXPECT(v->reaped, "rank %d's worker (pid %d) still runs %d ms after its kolorun died",
	       victim, (int)v->pid, bound_ms);
	if (v->reaped) {
		fprintf(stderr, "%s: its worker was gone after %" PRIu64 " ms (signal %d)\n", what,
		        v->exit_ms - t0, WIFSIGNALED(v->status) ? WTERMSIG(v->status) : 0);
		EXPECT(WIFSIGNALED(v->status), "rank %d's worker exited with status %d", victim,
		       v->status);
	}
}

static void t_launcher(void)
{
	worker_args[2] = "url";
	worker_args[3] = "quiet";
	struct pod *p = start_pod(3, false);
	struct steps_arg sa = {3, 2};
	REQUIRE(wait_for(all_past, &sa, WAIT_MS), "the 3 workers did not start their loop");
	char rdzv[128];
	snprintf(rdzv, sizeof(rdzv), "%s", workers[0].url);
	REQUIRE(rdzv[0] && url_listens(rdzv), "the embedded server (%s) does not answer", rdzv);
	kill_at_random_point(p->pid);
	uint64_t t0 = kolo_now_ms();
	uint64_t end = t0 + (uint64_t)bound_ms;
	for (;;) {
		bool all = true;
		for (int r = 0; r < 3; r++)
			all = all && workers[r].reaped;
		if (all || kolo_now_ms() >= end)
			break;
		pump(10);
	}
	for (int r = 0; r < 3; r++) {
		struct worker *w = &workers[r];
		EXPECT(w->reaped, "rank %d (pid %d) still runs %d ms after kolorun's SIGKILL", r,
		       (int)w->pid, bound_ms);
		if (w->reaped)
			fprintf(stderr,
			        "SIGKILL of kolorun -np 3: rank %d gone after %" PRIu64
			        " ms (signal %d)\n",
			        r, w->exit_ms - t0,
			        WIFSIGNALED(w->status) ? WTERMSIG(w->status) : 0);
	}
	EXPECT(!url_listens(rdzv), "the embedded server %s still answers", rdzv);
}

static void t_late(int victim, bool pod, int abort_rank)
{
	static char linger[64], abort_env[64];
	snprintf(linger, sizeof(linger), "FAILURE_WORKER_LINGER=%d:60000", victim);
	snprintf(abort_env, sizeof(abort_env), "FAILURE_WORKER_ABORT=%d:500", abort_rank);
	extra_env[0] = linger;
	extra_env[1] = abort_rank >= 0 ? abort_env : NULL;
	worker_args[1] = "10";
	server_start(0, 4, 4);
	for (int i = 0; i < 4; i++)
		start_pod(1, true);
	struct steps_arg sa = {4, 9};
	REQUIRE(wait_for(all_past, &sa, WAIT_MS), "the workers did not finish their loop");
	/* The others go into kolo_finalize() right after their last step. */
	pump(100);
	struct worker *v = &workers[victim];
	kill(pod ? pods[v->pod].pid : v->pid, SIGKILL);
	uint64_t t0 = kolo_now_ms();
	char what[96];
	snprintf(what, sizeof(what), "SIGKILL of rank %d%s before its kolo_finalize()", victim,
	         pod ? "'s kolorun" : "");
	REQUIRE(wait_for(pods_reaped, NULL, 60000), "some pods still run 60 s after %s", what);
	for (int r = 0; r < 4; r++) {
		struct worker *w = &workers[r];
		struct pod *p = &pods[w->pod];
		if (r == victim)
			continue;
		uint64_t ms = p->exit_ms - t0;
		int code =
		        WIFEXITED(p->status) ? WEXITSTATUS(p->status) : 128 + WTERMSIG(p->status);
		fprintf(stderr,
		        "%s: rank %d: finalize took %" PRId64
		        " ms, its kolorun exited after %" PRIu64 " ms with status %d\n",
		        what, r, w->finalize_ms, ms, code);
		EXPECT(ms <= (uint64_t)bound_ms, "rank %d's pod exited %" PRIu64 " ms after %s", r,
		       ms, what);
		EXPECT(code == (r == abort_rank ? 4 : 0), "rank %d's pod exited with %d", r, code);
		EXPECT(w->step == 9 && !w->failed && !w->wrong, "rank %d: step %" PRId64, r,
		       w->step);
	}
}

static void t_clean(void)
{
	static const char *const env[] = {"FAILURE_WORKER_LINGER=2:3000", NULL};
	memcpy(extra_env, env, sizeof(env));
	worker_args[1] = "20";
	server_start(0, 4, 4);
	for (int i = 0; i < 4; i++)
		start_pod(1, true);
	REQUIRE(wait_for(pods_reaped, NULL, WAIT_MS), "the pods did not finish");
	for (int r = 0; r < 4; r++) {
		struct worker *w = &workers[r];
		struct pod *p = &pods[w->pod];
		fprintf(stderr, "clean finish: rank %d: finalize took %" PRId64 " ms\n", r,
		        w->finalize_ms);
		EXPECT(WIFEXITED(p->status) && WEXITSTATUS(p->status) == 0, "rank %d: status %d", r,
		       p->status);
		EXPECT(w->step == 19 && !w->failed && !w->wrong, "rank %d: step %" PRId64, r,
		       w->step);
		/* Everyone but rank 2 waited in kolo_finalize() for rank 2, which
		 * slept 3 s after the last allreduce before it got there (2 s
		 * asserted: a rank may enter its own late on a loaded machine). */
		if (r != 2)
			EXPECT(w->finalize_ms >= 2000,
			       "rank %d's finalize returned after %" PRId64
			       " ms, before rank 2 reached its own",
			       r, w->finalize_ms);
	}
}

/* ---- a rendezvous restart ----------------------------------------------- */

/* The number of members of the job's current round with nobody waiting, or
 * -1 when the server does not answer. */
static int job_members(void)
{
	struct kolo_rdzv_client_config cc = {
	        .url = url, .job = job, .token = token, .host = "driver", .deadline_ms = 500};
	struct kolo_rdzv_client *c = NULL;
	struct kolo_errbuf eb = {{0}};
	char *json = NULL;
	int n = -1;
	if (kolo_rdzv_client_create(&cc, &c, &eb) == KOLO_OK &&
	    kolo_rdzv_job_status(c, &json) == KOLO_OK && strstr(json, "\"waiting\":[]")) {
		n = 0;
		for (const char *p = json; (p = strstr(p, "\"rank\"")) != NULL; p++)
			n++;
	}
	free(json);
	kolo_rdzv_client_destroy(c);
	return n;
}

static bool members_are(void *arg)
{
	if (job_members() == *(int *)arg)
		return true;
	pump(100);
	return false;
}

static bool all_triggered(void *arg)
{
	(void)arg;
	for (int r = 0; r < 4; r++)
		if (!workers[r].triggered)
			return false;
	return true;
}

struct reformed_arg {
	int victim;
	int64_t step; /* and all went on past this step */
};

static bool survivors_reformed(void *arg)
{
	struct reformed_arg *a = arg;
	for (int r = 0; r < 4; r++)
		if (r != a->victim && (workers[r].round < 2 || workers[r].step < a->step))
			return false;
	return true;
}

static void t_restart(void)
{
	static char trig[64], trig_env[96];
	snprintf(trig, sizeof(trig), "/tmp/kolo-failure-trigger-XXXXXX");
	int fd = mkstemp(trig);
	REQUIRE(fd >= 0, "mkstemp: %s", strerror(errno));
	close(fd);
	unlink(trig); /* it appears when the alltoalls are to start */
	snprintf(trig_env, sizeof(trig_env), "FAILURE_WORKER_TRIGGER=%s", trig);
	static const char *env[] = {"KOLO_ELASTIC=1", "KOLO_HEARTBEAT_MS=300", NULL, NULL};
	env[2] = trig_env;
	memcpy(extra_env, env, sizeof(env));
	worker_args[0] = "65536";
	worker_args[2] = "elastic";
	int port = server_start(0, 2, 4);
	start_pods(4);
	server_kill();
	/* Training goes on without the server. */
	int64_t s = 0;
	for (int r = 0; r < 4; r++)
		s = KOLO_MAX(s, workers[r].step);
	struct steps_arg more = {4, s + 5};
	EXPECT(wait_for(all_past, &more, 20000), "training stopped with the server");
	REQUIRE(server_start(port, 2, 4) == port, "no restart on port %d", port);
	int four = 4;
	REQUIRE(wait_for(members_are, &four, 30000), "the workers did not re-register");
	fd = open(trig, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
	REQUIRE(fd >= 0, "creating %s: %s", trig, strerror(errno));
	close(fd);
	uint64_t t0 = kolo_now_ms();
	bool ok = wait_for(all_triggered, NULL, 60000);
	uint64_t ms = kolo_now_ms() - t0;
	unlink(trig);
	REQUIRE(ok, "the alltoalls did not complete within 60 s of the trigger");
	fprintf(stderr,
	        "after the restart, the first alltoall (every pair connected) completed on all "
	        "ranks %" PRIu64 " ms after the trigger\n",
	        ms);
	EXPECT(ms <= (uint64_t)bound_ms,
	       "the first alltoall after the restart took %" PRIu64 " ms: lost addresses?", ms);
	for (int r = 0; r < 4; r++)
		EXPECT(workers[r].round == 0 && !workers[r].wrong,
		       "rank %d re-formed (round %" PRId64 ") or computed a wrong result", r,
		       workers[r].round);
	int victim = (int)kolo_random_below(4);
	s = 0;
	for (int r = 0; r < 4; r++)
		s = KOLO_MAX(s, workers[r].step);
	kill_at_random_point(workers[victim].pid);
	t0 = kolo_now_ms();
	struct reformed_arg ra = {victim, s + 3};
	REQUIRE(wait_for(survivors_reformed, &ra, 60000),
	        "the survivors did not re-form and go on after the kill");
	ms = 0;
	for (int r = 0; r < 4; r++)
		if (r != victim)
			ms = KOLO_MAX(ms, workers[r].round_at_ms - t0);
	fprintf(stderr,
	        "after the restart, SIGKILL of rank %d: the survivors re-formed in %" PRIu64
	        " ms\n",
	        victim, ms);
	EXPECT(ms <= (uint64_t)bound_ms, "re-forming took %" PRIu64 " ms", ms);
	for (int r = 0; r < 4; r++)
		EXPECT(r == victim || !workers[r].wrong, "rank %d computed a wrong result", r);
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: failure_test SCENARIO KOLORUN [SERVER] WORKER [ARGS]\n");
		return 64;
	}
	signal(SIGPIPE, SIG_IGN);
	REQUIRE(prctl(PR_SET_CHILD_SUBREAPER, 1) == 0, "PR_SET_CHILD_SUBREAPER: %s",
	        strerror(errno));
	const char *b = getenv("FAILURE_TEST_BOUND_MS");
	if (b && atoi(b) > 0)
		bound_ms = atoi(b);
	const char *sc = argv[1];
	kolorun_bin = argv[2];
	char hex[17];
	kolo_random_hex(hex, 8);
	snprintf(job, sizeof(job), "failure-%s-%s", sc, hex);
	if (strcmp(sc, "launcher") == 0) {
		worker_bin = argv[3];
		t_launcher();
	} else if (argc >= 5) {
		server_bin = argv[3];
		worker_bin = argv[4];
		if (strcmp(sc, "pods") == 0) {
			if (argc > 6 && strcmp(argv[6], "async") == 0)
				worker_args[2] = "async";
			t_pods(argc > 5 ? atoi(argv[5]) : -1);
		} else if (strcmp(sc, "pod_launcher") == 0) {
			t_pod_launcher();
		} else if (strcmp(sc, "late") == 0 && argc > 5) {
			bool pod = argc > 6 && strcmp(argv[6], "pod") == 0;
			t_late(atoi(argv[5]), pod, argc > 7 ? atoi(argv[7]) : -1);
		} else if (strcmp(sc, "restart") == 0) {
			t_restart();
		} else if (strcmp(sc, "clean") == 0) {
			t_clean();
		} else {
			fprintf(stderr, "unknown scenario %s\n", sc);
			return 64;
		}
	} else {
		fprintf(stderr, "scenario %s: too few arguments\n", sc);
		return 64;
	}
	cleanup_all();
	fprintf(stderr, "%s: %s (bound %d ms)\n", sc, failures ? "FAILED" : "ok", bound_ms);
	return failures ? 1 : 0;
}
