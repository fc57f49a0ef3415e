/* Multi-process tests of elastic training. One scenario per ctest entry:
 *
 *   elastic_test kill WORKER [RANK]   SIGKILL of one of 4 ranks mid-allreduce
 *   elastic_test kill_async WORKER    the same through the fusion engine
 *   elastic_test term WORKER          SIGTERM: graceful leave
 *   elastic_test stop WORKER          SIGSTOP: a silent rank, found by the
 *                                     progress timeout (KOLO_TIMEOUT_MS)
 *   elastic_test join WORKER          a 4th worker joins 3
 *   elastic_test restart WORKER SERVER  the server is killed and restarted,
 *                                     then a worker is killed
 *   elastic_test minnp WORKER         survivors below min-np time out
 *   elastic_test minnp_join WORKER    ... unless a new worker comes in time
 *   elastic_test minnp_term WORKER    SIGTERM while waiting below min-np, and to a
 *                                     replacement waiting for its first round: leaves
 *                                     at once; the job goes on with new workers
 *   elastic_test hang WORKER          a rank's training thread hangs outside kolo:
 *                                     it is taken out, the others go on; when it
 *                                     wakes it joins again
 *
 * Workers are elastic_worker processes (see there for what they check);
 * this driver kills, starts and watches them, and checks every worker's
 * outcome and how long the survivors took to re-form. Every wait has a
 * deadline; children still running at the end are killed. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core.h"
#include "rendezvous.h"

#define MAXW    8
#define WAIT_MS 90000

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

struct worker {
	pid_t pid;
	int out;
	char buf[8192];
	size_t len;
	bool reaped;
	int status;
	int64_t step;             /* last STEP line */
	int64_t round;            /* last ROUND line */
	int size, rank;           /* from the last ROUND line */
	uint64_t round_at_ms;     /* when the last ROUND line came */
	int rounds;               /* ROUND lines seen */
	bool result, left, wrong; /* RESULT ok / LEFT / WRONG */
	bool opfail;              /* an async op failed with other than EMEMBERSHIP */
	bool hung;                /* printed HANG */
	int result_size;
	char failed[512]; /* FAILED line */
};

static struct worker workers[MAXW];
static int n_workers;
static char url[128];
static char job[64];
static const char token[] = "elastic-test-token-0123456789";
static const char *worker_bin;
static const char *worker_args[4] = {"200", "65536", "10", NULL}; /* steps, count, ms */
static const char *extra_env[8];

static void cleanup_all(void)
{
	for (int i = 0; i < n_workers; i++) {
		if (workers[i].pid > 0 && !workers[i].reaped) {
			kill(workers[i].pid, SIGKILL);
			waitpid(workers[i].pid, NULL, 0);
			workers[i].reaped = true;
		}
	}
}

static struct worker *start_worker(void)
{
	REQUIRE(n_workers < MAXW, "too many workers");
	struct worker *w = &workers[n_workers++];
	memset(w, 0, sizeof(*w));
	w->round = w->step = -1;
	int o[2];
	REQUIRE(pipe2(o, O_CLOEXEC) == 0, "pipe: %s", strerror(errno));
	char e_url[192], e_job[96], e_tok[96];
	snprintf(e_url, sizeof(e_url), "KOLO_RENDEZVOUS=%s", url);
	snprintf(e_job, sizeof(e_job), "KOLO_JOB=%s", job);
	snprintf(e_tok, sizeof(e_tok), "KOLO_TOKEN=%s", token);
	const char *mine[] = {e_url,
	                      e_job,
	                      e_tok,
	                      "KOLO_ELASTIC=1",
	                      "KOLO_IFACE=127.0.0.1",
	                      "KOLO_HEARTBEAT_MS=300",
	                      "KOLO_TOKEN_FILE=",
	                      "KOLO_LAUNCHER_FD=-1"};
	size_t n = 0, m = KOLO_ARRAY_SIZE(mine), x = 0;
	while (environ[n])
		n++;
	while (extra_env[x])
		x++;
	char **env = calloc(n + m + x + 1, sizeof(*env));
	size_t k = 0;
	/* The caller's kolo parameters are not the test's; the fake CUDA
	 * runtime's settings (tests/gpu/fake) are. */
	for (size_t a = 0; a < n; a++)
		if ((strncmp(environ[a], "KOLO_", 5) != 0 ||
		     strncmp(environ[a], "KOLO_FAKE_", 10) == 0) &&
		    strncmp(environ[a], "HOROVOD_", 8) != 0)
			env[k++] = environ[a];
	for (size_t b = 0; b < m; b++)
		env[k++] = (char *)mine[b];
	for (size_t b = 0; b < x; b++)
		env[k++] = (char *)extra_env[b];
	env[k] = NULL;
	const char *argv[] = {worker_bin,     worker_args[0], worker_args[1],
	                      worker_args[2], worker_args[3], NULL};
	pid_t pid = fork();
	if (pid == 0) {
		dup2(o[1], STDOUT_FILENO);
		execve(argv[0], (char *const *)argv, env);
		_exit(127);
	}
	free(env);
	close(o[1]);
	w->pid = pid;
	w->out = o[0];
	return w;
}

static void on_line(struct worker *w, const char *line)
{
	int64_t a;
	int b, c;
	if (sscanf(line, "STEP %" SCNd64, &a) == 1) {
		w->step = a;
	} else if (sscanf(line, "ROUND %" SCNd64 " size %d rank %d", &a, &b, &c) == 3) {
		w->round = a;
		w->size = b;
		w->rank = c;
		w->round_at_ms = kolo_now_ms();
		w->rounds++;
	} else if (sscanf(line, "RESULT ok size %d", &b) == 1) {
		w->result = true;
		w->result_size = b;
	} else if (strncmp(line, "HANG", 4) == 0) {
		w->hung = true;
	} else if (strncmp(line, "LEFT", 4) == 0) {
		w->left = true;
	} else if (strncmp(line, "FAILED", 6) == 0) {
		size_t n = KOLO_MIN(strlen(line), sizeof(w->failed) - 1);
		memmove(w->failed, line, n);
		w->failed[n] = '\0';
	} else if (strncmp(line, "OPFAIL", 6) == 0) {
		w->opfail = true;
		fprintf(stderr, "  pid %d: %s\n", (int)w->pid, line);
	} else if (strncmp(line, "WRONG", 5) == 0) {
		w->wrong = true;
		fprintf(stderr, "  pid %d: %s\n", (int)w->pid, line);
	}
}

/* Reads whatever the workers printed and reaps those that exited, for up to
 * ms milliseconds. */
static void pump(int ms)
{
	struct pollfd pf[MAXW];
	int idx[MAXW], n = 0;
	for (int i = 0; i < n_workers; i++) {
		if (workers[i].out >= 0) {
			pf[n].fd = workers[i].out;
			pf[n].events = POLLIN;
			idx[n++] = i;
		}
	}
	if (n > 0 && poll(pf, (nfds_t)n, ms) > 0) {
		for (int k = 0; k < n; k++) {
			if (!(pf[k].revents & (POLLIN | POLLHUP)))
				continue;
			struct worker *w = &workers[idx[k]];
			ssize_t r = read(w->out, w->buf + w->len, sizeof(w->buf) - 1 - w->len);
			if (r <= 0) {
				close(w->out);
				w->out = -1;
				continue;
			}
			w->len += (size_t)r;
			char *nl;
			while ((nl = memchr(w->buf, '\n', w->len)) != NULL) {
				*nl = '\0';
				on_line(w, w->buf);
				size_t used = (size_t)(nl - w->buf) + 1;
				memmove(w->buf, nl + 1, w->len - used);
				w->len -= used;
			}
			if (w->len == sizeof(w->buf) - 1)
				w->len = 0;
		}
	} else if (n == 0) {
		poll(NULL, 0, ms);
	}
	for (int i = 0; i < n_workers; i++) {
		struct worker *w = &workers[i];
		int st;
		if (!w->reaped && waitpid(w->pid, &st, WNOHANG) == w->pid) {
			w->reaped = true;
			w->status = st;
		}
	}
}

typedef bool (*cond_fn)(void *arg);

static bool wait_for(cond_fn fn, void *arg, int timeout_ms)
{
	uint64_t end = kolo_now_ms() + (uint64_t)timeout_ms;
	while (!fn(arg)) {
		if (kolo_now_ms() >= end)
			return false;
		pump(20);
	}
	return true;
}

static bool all_step(void *arg)
{
	int64_t s = *(int64_t *)arg;
	for (int i = 0; i < n_workers; i++)
		if (!workers[i].reaped && workers[i].step < s)
			return false;
	return true;
}

static bool all_exited(void *arg)
{
	(void)arg;
	for (int i = 0; i < n_workers; i++)
		if (!workers[i].reaped || workers[i].out >= 0)
			return false;
	return true;
}

/* The survivors (not reaped, not `except`) all printed a ROUND > round. */
struct reformed_arg {
	int64_t round;
	struct worker *except;
};

static bool all_reformed(void *arg)
{
	struct reformed_arg *a = arg;
	for (int i = 0; i < n_workers; i++) {
		struct worker *w = &workers[i];
		if (w == a->except || (w->reaped && w->out < 0))
			continue;
		if (w->round <= a->round)
			return false;
	}
	return true;
}

static struct worker *by_rank(int rank)
{
	for (int i = 0; i < n_workers; i++)
		if (!workers[i].reaped && workers[i].rank == rank)
			return &workers[i];
	return NULL;
}

static struct kolo_rdzv_server *server;

static void server_up(int min_np, int max_np)
{
	struct kolo_rdzv_server_config cfg = {.listen = "127.0.0.1:0",
	                                      .token = token,
	                                      .min_np = min_np,
	                                      .max_np = max_np,
	                                      .settle_ms = 300,
	                                      .lease_ms = 10000};
	struct kolo_errbuf eb = {{0}};
	REQUIRE(kolo_rdzv_server_start(&cfg, &server, &eb) == KOLO_OK, "server: %s", eb.msg);
	snprintf(url, sizeof(url), "http://127.0.0.1:%d", kolo_rdzv_server_port(server));
}

static void start_n(int n)
{
	for (int i = 0; i < n; i++)
		start_worker();
	int64_t s = 3;
	REQUIRE(wait_for(all_step, &s, WAIT_MS), "the %d workers did not start training", n);
}

/* Checks that every worker but `dead` (NULL: none) finished with the right
 * result at size want_size. */
static void check_finish(struct worker *dead, int want_size)
{
	EXPECT(wait_for(all_exited, NULL, WAIT_MS), "workers did not finish");
	cleanup_all();
	for (int i = 0; i < n_workers; i++) {
		struct worker *w = &workers[i];
		if (w == dead)
			continue;
		EXPECT(WIFEXITED(w->status) && WEXITSTATUS(w->status) == 0 && w->result,
		       "worker pid %d: status %d result %d %s", (int)w->pid, w->status, w->result,
		       w->failed);
		EXPECT(w->result_size == want_size, "worker pid %d finished at size %d, not %d",
		       (int)w->pid, w->result_size, want_size);
		EXPECT(!w->wrong, "worker pid %d computed a wrong result", (int)w->pid);
		EXPECT(!w->opfail,
		       "worker pid %d: an async op failed with other than "
		       "KOLO_EMEMBERSHIP",
		       (int)w->pid);
	}
}

static int pick_rank(int argc, char **argv, int n)
{
	if (argc > 3)
		return atoi(argv[3]);
	uint64_t r = 0;
	kolo_random_bytes(&r, sizeof(r));
	return (int)(r % (uint64_t)n);
}

/* Kills the worker of rank victim with sig once everybody is past step
 * `after`, at a random point of a step, and returns how long the survivors
 * took to print their next ROUND. */
static uint64_t kill_and_reform(int victim, int sig, int64_t after, struct worker **out)
{
	REQUIRE(wait_for(all_step, &after, WAIT_MS), "no progress before the kill");
	struct worker *w = by_rank(victim);
	REQUIRE(w, "no worker has rank %d", victim);
	int64_t round = w->round;
	poll(NULL, 0, (int)kolo_random_below(10));
	uint64_t t0 = kolo_now_ms();
	kill(w->pid, sig);
	struct reformed_arg ra = {.round = round, .except = w};
	REQUIRE(wait_for(all_reformed, &ra, WAIT_MS), "survivors did not re-form after %s",
	        strsignal(sig));
	uint64_t last = 0;
	for (int i = 0; i < n_workers; i++)
		if (&workers[i] != w && workers[i].round > round)
			last = KOLO_MAX(last, workers[i].round_at_ms);
	*out = w;
	return last - t0;
}

static void t_kill(int argc, char **argv)
{
	server_up(2, 0);
	start_n(4);
	int victim = pick_rank(argc, argv, 4);
	struct worker *dead;
	uint64_t ms = kill_and_reform(victim, SIGKILL, 20, &dead);
	fprintf(stderr, "SIGKILL of rank %d: survivors re-formed in %" PRIu64 " ms\n", victim, ms);
	EXPECT(ms < 5000, "re-forming took %" PRIu64 " ms", ms);
	check_finish(dead, 3);
	EXPECT(WIFSIGNALED(dead->status) && WTERMSIG(dead->status) == SIGKILL,
	       "the victim's status is %d", dead->status);
}

static void t_term(int argc, char **argv)
{
	server_up(2, 0);
	start_n(4);
	int victim = pick_rank(argc, argv, 4);
	struct worker *left;
	uint64_t ms = kill_and_reform(victim, SIGTERM, 20, &left);
	fprintf(stderr, "SIGTERM of rank %d: survivors re-formed in %" PRIu64 " ms\n", victim, ms);
	EXPECT(ms < 3000, "re-forming took %" PRIu64 " ms", ms);
	check_finish(left, 3);
	EXPECT(WIFEXITED(left->status) && WEXITSTATUS(left->status) == 0 && left->left,
	       "the leaver's status is %d (left %d) %s", left->status, left->left, left->failed);
}

static void t_stop(int argc, char **argv)
{
	/* Lease and progress timeout far apart: the timeout must be what
	 * detects the silent rank. */
	static const char *const env[] = {"KOLO_TIMEOUT_MS=1500", NULL};
	memcpy(extra_env, env, sizeof(env));
	server_up(2, 0);
	start_n(4);
	int victim = pick_rank(argc, argv, 4);
	struct worker *stopped;
	uint64_t ms = kill_and_reform(victim, SIGSTOP, 20, &stopped);
	fprintf(stderr, "SIGSTOP of rank %d: survivors re-formed in %" PRIu64 " ms\n", victim, ms);
	EXPECT(ms >= 1000 && ms < 6000, "re-forming took %" PRIu64 " ms", ms);
	kill(stopped->pid, SIGKILL);
	check_finish(stopped, 3);
}

/* A rank paused past the progress timeout (a long GC pause, a stalled VM) is
 * reported and evicted while the others go on at size 3. When it resumes it
 * finds itself evicted, joins again as a new worker, and the job grows back
 * to 4 and finishes there with the right result on every worker. */
static void t_stop_resume(int argc, char **argv)
{
	static const char *const env[] = {"KOLO_TIMEOUT_MS=1500", NULL};
	memcpy(extra_env, env, sizeof(env));
	worker_args[0] = "1000"; /* steps: time for the paused one to come back */
	server_up(2, 0);
	start_n(4);
	int victim = pick_rank(argc, argv, 4);
	struct worker *paused;
	kill_and_reform(victim, SIGSTOP, 20, &paused);
	int64_t round = 0;
	for (int i = 0; i < n_workers; i++)
		if (&workers[i] != paused) {
			EXPECT(workers[i].size == 3, "a survivor is at size %d", workers[i].size);
			round = KOLO_MAX(round, workers[i].round);
		}
	kill(paused->pid, SIGCONT);
	struct reformed_arg ra = {.round = round, .except = NULL};
	REQUIRE(wait_for(all_reformed, &ra, WAIT_MS), "the resumed worker did not come back");
	for (int i = 0; i < n_workers; i++)
		EXPECT(workers[i].size == 4, "worker %d is at size %d after the rejoin", i,
		       workers[i].size);
	check_finish(NULL, 4);
}

static void t_join(void)
{
	server_up(2, 4);
	start_n(3);
	int64_t s = 15;
	REQUIRE(wait_for(all_step, &s, WAIT_MS), "no progress");
	int64_t round = workers[0].round;
	struct worker *nw = start_worker();
	struct reformed_arg ra = {.round = round, .except = NULL};
	REQUIRE(wait_for(all_reformed, &ra, WAIT_MS), "the job did not grow");
	for (int i = 0; i < n_workers; i++)
		EXPECT(workers[i].size == 4, "worker %d is at size %d after the join", i,
		       workers[i].size);
	EXPECT(nw->rank == 3, "the new worker has rank %d, not 3", nw->rank);
	check_finish(NULL, 4);
}

static bool all_failed(void *arg)
{
	struct worker *except = arg;
	for (int i = 0; i < n_workers; i++)
		if (&workers[i] != except && !(workers[i].reaped && workers[i].out < 0))
			return false;
	return true;
}

static void t_minnp(bool join)
{
	static const char *const env[] = {"KOLO_ELASTIC_TIMEOUT_MS=4000", NULL};
	memcpy(extra_env, env, sizeof(env));
	server_up(3, 0);
	start_n(3);
	int64_t after = 10;
	REQUIRE(wait_for(all_step, &after, WAIT_MS), "no progress");
	struct worker *dead = by_rank(2);
	REQUIRE(dead, "no rank 2");
	kill(dead->pid, SIGKILL);
	if (join) {
		/* Below min-np: nothing re-forms until a new worker comes. */
		pump(1000);
		for (int i = 0; i < 2; i++)
			EXPECT(workers[i].rounds == 1, "worker %d re-formed below min-np", i);
		start_worker();
		check_finish(dead, 3);
		return;
	}
	REQUIRE(wait_for(all_failed, dead, 30000), "survivors did not give up");
	for (int i = 0; i < n_workers; i++) {
		struct worker *w = &workers[i];
		if (w == dead)
			continue;
		EXPECT(WIFEXITED(w->status) && WEXITSTATUS(w->status) == 3,
		       "survivor pid %d: status %d", (int)w->pid, w->status);
		EXPECT(strstr(w->failed, "min-np") != NULL, "survivor pid %d said: %s", (int)w->pid,
		       w->failed);
	}
}

/* GET /v1/jobs/{job} from the server (malloc'd JSON), or NULL. */
static char *job_status_json(void)
{
	struct kolo_rdzv_client_config cc = {
	        .url = url, .job = job, .token = token, .host = "driver", .deadline_ms = 500};
	struct kolo_rdzv_client *c = NULL;
	struct kolo_errbuf eb = {{0}};
	char *json = NULL;
	if (kolo_rdzv_client_create(&cc, &c, &eb) != KOLO_OK ||
	    kolo_rdzv_job_status(c, &json) != KOLO_OK) {
		free(json);
		json = NULL;
	}
	kolo_rdzv_client_destroy(c);
	return json;
}

static int count_of(const char *s, const char *what)
{
	int n = 0;
	for (const char *p = s; p && (p = strstr(p, what)) != NULL; p++)
		n++;
	return n;
}

/* The server's job is between rounds with exactly `want` workers waiting. */
static bool waiting_is(void *arg)
{
	char *json = job_status_json();
	bool ok = json && count_of(json, "\"worker_id\"") == *(int *)arg &&
	          strstr(json, "\"state\":\"waiting\"") != NULL;
	free(json);
	if (!ok)
		pump(50);
	return ok;
}

/* SIGTERM to w; the ms until it exited and closed its output (at most 10 s). */
static uint64_t sigterm_until_gone(struct worker *w)
{
	uint64_t t0 = kolo_now_ms();
	kill(w->pid, SIGTERM);
	uint64_t end = t0 + 10000;
	while (!(w->reaped && w->out < 0) && kolo_now_ms() < end)
		pump(20);
	return kolo_now_ms() - t0;
}

/* A spot reclaim while the survivors wait below min-np for replacements: the
 * SIGTERMed worker must leave within seconds (not when a round forms or
 * KOLO_ELASTIC_TIMEOUT_MS ends the wait), and the job goes on with the other
 * survivor once two new workers come. */
static void t_minnp_term(void)
{
	static const char *const env[] = {"KOLO_ELASTIC_TIMEOUT_MS=60000", NULL};
	memcpy(extra_env, env, sizeof(env));
	server_up(3, 0);
	start_n(3);
	int64_t after = 10;
	REQUIRE(wait_for(all_step, &after, WAIT_MS), "no progress");
	struct worker *dead = by_rank(2), *leaver = by_rank(0), *stays = by_rank(1);
	REQUIRE(dead && leaver && stays, "ranks 0-2 not found");
	kill(dead->pid, SIGKILL);
	int two = 2;
	REQUIRE(wait_for(waiting_is, &two, WAIT_MS),
	        "the survivors are not waiting for a round after the kill");
	uint64_t ms = sigterm_until_gone(leaver);
	fprintf(stderr, "SIGTERM while waiting for a round: the worker left in %" PRIu64 " ms\n",
	        ms);
	REQUIRE(leaver->reaped, "the SIGTERMed worker still waits after %" PRIu64 " ms", ms);
	EXPECT(ms < 3000, "leaving took %" PRIu64 " ms", ms);
	EXPECT(WIFEXITED(leaver->status) && WEXITSTATUS(leaver->status) == 0 && leaver->left,
	       "the leaver's status is %d (left %d) %s", leaver->status, leaver->left,
	       leaver->failed);
	int one = 1;
	EXPECT(wait_for(waiting_is, &one, 5000), "the server still counts the leaver");
	/* A replacement reclaimed while it waits for its first round. */
	struct worker *fresh = start_worker();
	REQUIRE(wait_for(waiting_is, &two, WAIT_MS), "the replacement is not waiting");
	ms = sigterm_until_gone(fresh);
	fprintf(stderr, "SIGTERM before a rank: the worker left in %" PRIu64 " ms\n", ms);
	EXPECT(ms < 3000, "leaving before a rank took %" PRIu64 " ms", ms);
	EXPECT(fresh->reaped && WIFEXITED(fresh->status) && WEXITSTATUS(fresh->status) == 0 &&
	               fresh->left,
	       "the replacement's status is %d (left %d)", fresh->status, fresh->left);
	EXPECT(wait_for(waiting_is, &one, 5000), "the server still counts the replacement");
	start_worker();
	start_worker();
	EXPECT(wait_for(all_exited, NULL, WAIT_MS), "workers did not finish");
	cleanup_all();
	for (int i = 0; i < n_workers; i++) {
		struct worker *w = &workers[i];
		if (w == dead || w == leaver || w == fresh)
			continue;
		EXPECT(WIFEXITED(w->status) && WEXITSTATUS(w->status) == 0 && w->result &&
		               w->result_size == 3 && !w->wrong,
		       "worker pid %d: status %d result %d size %d %s", (int)w->pid, w->status,
		       w->result, w->result_size, w->failed);
	}
}

/* A rank whose training thread hangs outside kolo (a deadlock in user code,
 * here 6 s of it) while its watcher and heartbeat keep it alive: the others
 * time out on it (KOLO_TIMEOUT_MS), cannot report it (it says it is alive),
 * and would wait for KOLO_ELASTIC_TIMEOUT_MS (60 s here). Its watcher takes
 * it out of the job after KOLO_ELASTIC_HANG_MS (2 s), and the others go on at
 * size 3. When the thread wakes, its kolo_reform() joins again as a new
 * worker, the others admit it at a commit point, and all finish at size 4
 * with the right result. */
static bool one_hung(void *arg)
{
	(void)arg;
	for (int i = 0; i < n_workers; i++)
		if (workers[i].hung)
			return true;
	return false;
}

static void t_hang(void)
{
	static const char *const env[] = {"KOLO_TIMEOUT_MS=1500", "KOLO_ELASTIC_HANG_MS=2000",
	                                  "KOLO_ELASTIC_TIMEOUT_MS=60000",
	                                  "ELASTIC_WORKER_HANG=2:20:6000", NULL};
	memcpy(extra_env, env, sizeof(env));
	worker_args[0] = "1000"; /* steps: time for the hung one to come back */
	server_up(2, 0);
	start_n(4);
	REQUIRE(wait_for(one_hung, NULL, WAIT_MS), "no worker hung");
	uint64_t t0 = kolo_now_ms();
	struct worker *hung = NULL;
	for (int i = 0; i < n_workers; i++)
		if (workers[i].hung)
			hung = &workers[i];
	struct reformed_arg ra = {.round = hung->round, .except = hung};
	REQUIRE(wait_for(all_reformed, &ra, 30000),
	        "the others did not re-form without the hung rank");
	uint64_t ms = kolo_now_ms() - t0;
	fprintf(stderr, "hung rank 2: the others re-formed %" PRIu64 " ms after it hung\n", ms);
	EXPECT(ms < 15000, "re-forming took %" PRIu64 " ms", ms);
	int64_t round = 0;
	for (int i = 0; i < n_workers; i++)
		if (&workers[i] != hung) {
			EXPECT(workers[i].size == 3, "worker %d is at size %d", i, workers[i].size);
			round = KOLO_MAX(round, workers[i].round);
		}
	ra = (struct reformed_arg){.round = round, .except = NULL};
	REQUIRE(wait_for(all_reformed, &ra, WAIT_MS), "the hung worker did not come back");
	for (int i = 0; i < n_workers; i++)
		EXPECT(workers[i].size == 4, "worker %d is at size %d after the rejoin", i,
		       workers[i].size);
	check_finish(NULL, 4);
}

/* ---- server restart --------------------------------------------------- */

static pid_t srv_pid = -1;
static int srv_out = -1;
static char token_path[64];

static int server_proc(const char *bin, int port)
{
	char listen[64];
	snprintf(listen, sizeof(listen), "127.0.0.1:%d", port);
	int o[2];
	REQUIRE(pipe2(o, O_CLOEXEC) == 0, "pipe");
	const char *argv[] = {bin,     "--listen", listen, "--token-file", token_path, "--min-np",
	                      "2",     "--max-np", "0",    "--settle-ms",  "300",      "--lease-ms",
	                      "10000", NULL};
	pid_t pid = fork();
	if (pid == 0) {
		dup2(o[1], STDOUT_FILENO);
		execv(bin, (char *const *)argv);
		_exit(127);
	}
	close(o[1]);
	srv_pid = pid;
	srv_out = o[0];
	char buf[512];
	size_t len = 0;
	uint64_t end = kolo_now_ms() + 20000;
	while (kolo_now_ms() < end && len < sizeof(buf) - 1) {
		struct pollfd pf = {.fd = srv_out, .events = POLLIN};
		if (poll(&pf, 1, 100) <= 0)
			continue;
		ssize_t r = read(srv_out, buf + len, sizeof(buf) - 1 - len);
		if (r <= 0)
			break;
		len += (size_t)r;
		buf[len] = '\0';
		char *l = strstr(buf, "listening on ");
		if (l && strchr(l, '\n'))
			return atoi(strrchr(l, ':') + 1);
	}
	REQUIRE(false, "the server did not start");
	return -1;
}

static bool members_are(void *arg)
{
	char *json = job_status_json();
	bool ok = json && count_of(json, "\"rank\"") == *(int *)arg &&
	          strstr(json, "\"waiting\":[]") != NULL;
	free(json);
	if (!ok)
		pump(100);
	return ok;
}

static void t_restart(const char *server_bin)
{
	snprintf(token_path, sizeof(token_path), "/tmp/kolo-elastic-test-XXXXXX");
	int fd = mkstemp(token_path);
	REQUIRE(fd >= 0 && write(fd, token, strlen(token)) == (ssize_t)strlen(token), "token");
	close(fd);
	int port = server_proc(server_bin, 0);
	snprintf(url, sizeof(url), "http://127.0.0.1:%d", port);
	start_n(4);
	int64_t after = 15;
	REQUIRE(wait_for(all_step, &after, WAIT_MS), "no progress");
	kill(srv_pid, SIGKILL);
	waitpid(srv_pid, NULL, 0);
	close(srv_out);
	int64_t before = workers[0].step;
	/* Training goes on without the server. */
	int64_t more = before + 40;
	EXPECT(wait_for(all_step, &more, 20000), "training stopped with the server");
	REQUIRE(server_proc(server_bin, port) == port, "restart on port %d", port);
	int four = 4;
	REQUIRE(wait_for(members_are, &four, 30000), "the workers did not re-register");
	struct worker *dead;
	uint64_t ms = kill_and_reform((int)kolo_random_below(4), SIGKILL, more + 5, &dead);
	fprintf(stderr, "after the restart, SIGKILL: survivors re-formed in %" PRIu64 " ms\n", ms);
	check_finish(dead, 3);
	kill(srv_pid, SIGKILL);
	waitpid(srv_pid, NULL, 0);
	unlink(token_path);
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: elastic_test SCENARIO WORKER [ARG]\n");
		return 64;
	}
	signal(SIGPIPE, SIG_IGN);
	worker_bin = argv[2];
	char hex[17];
	kolo_random_hex(hex, 8);
	snprintf(job, sizeof(job), "elastic-%s-%s", argv[1], hex);
	const char *sc = argv[1];
	if (strcmp(sc, "kill") == 0) {
		t_kill(argc, argv);
	} else if (strcmp(sc, "kill_async") == 0) {
		worker_args[3] = "async";
		t_kill(argc, argv);
	} else if (strcmp(sc, "term") == 0) {
		t_term(argc, argv);
	} else if (strcmp(sc, "stop") == 0) {
		t_stop(argc, argv);
	} else if (strcmp(sc, "stop_resume") == 0) {
		t_stop_resume(argc, argv);
	} else if (strcmp(sc, "join") == 0) {
		t_join();
	} else if (strcmp(sc, "minnp") == 0) {
		t_minnp(false);
	} else if (strcmp(sc, "minnp_join") == 0) {
		t_minnp(true);
	} else if (strcmp(sc, "minnp_term") == 0) {
		t_minnp_term();
	} else if (strcmp(sc, "hang") == 0) {
		t_hang();
	} else if (strcmp(sc, "restart") == 0 && argc > 3) {
		t_restart(argv[3]);
	} else {
		fprintf(stderr, "unknown scenario %s\n", sc);
		return 64;
	}
	cleanup_all();
	kolo_rdzv_server_stop(server);
	if (failures)
		fprintf(stderr, "%s: %d failure(s)\n", sc, failures);
	else
		fprintf(stderr, "%s: ok\n", sc);
	return failures ? 1 : 0;
}
