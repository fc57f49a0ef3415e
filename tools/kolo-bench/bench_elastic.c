/* kolo-bench elastic: how long a running job takes to recover from a lost
 * worker. N ranks on loopback run a loop of allreduces with a commit point
 * after each (the state API); the bench kills one rank, chosen at random
 * (rank 0 included), and measures the time from the signal to the first
 * allreduce completed by the re-formed ring (the slowest survivor's), then
 * starts a replacement, which joins at the next commit point, and repeats.
 * --mode kill sends SIGKILL (a crash), --mode leave SIGTERM (a graceful
 * leave, e.g. a spot reclaim); --mode both runs both series.
 *
 * The workers are this binary (`kolo-bench elastic --worker`) against an
 * embedded rendezvous server. Each survivor reports its phases: detection
 * (signal -> its collective failed, or its commit saw the leave), teardown,
 * round (failure report, confirmation that the suspect is dead, and the
 * server forming the next round), connect (new transport, address
 * published, ring connected), and sync + first allreduce.
 *
 * `kolo-bench elastic --worker [--count C] [--compute-ms MS]` is the worker
 * alone, for drivers that place workers themselves (bench/netns/vanish.py
 * starts one per network-namespace host and cuts a host's link): it prints
 * "ROUND round size rank" on every (re-)formed round, "FIRST round size rank
 * t_err t_start t_down t_round t_conn t_first" (CLOCK_MONOTONIC ns) after the
 * first allreduce of a re-formed ring, and "STEP round step t" every 250 ms;
 * --compute-ms sleeps that long after each step, as a program computes
 * between its collectives. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"
#include "core.h"
#include "kolo/elastic.h"
#include "kolo/kolo.h"
#include "rendezvous.h"
#include "runtime.h"

#define MAXW 64

extern char **environ;

/* ---- the worker ----------------------------------------------------------- */

static int worker_main(size_t count, int compute_ms)
{
	kolo_comm_t *comm = NULL;
	if (kolo_init(&comm) != KOLO_OK) {
		fprintf(stderr, "worker: kolo_init: %s\n", kolo_init_error());
		return 3;
	}
	float *x = calloc(count ? count : 1, sizeof(float));
	int64_t step = 0;
	kolo_state_t *state = NULL;
	if (!x || kolo_state_create(comm, &state) != KOLO_OK ||
	    kolo_state_register(state, "step", &step, 1, KOLO_INT64) != KOLO_OK)
		return 3;
	setvbuf(stdout, NULL, _IOLBF, 0);
	printf("ROUND %" PRId64 " %d %d\n", kolo_round(comm), kolo_size(comm), kolo_rank(comm));
	kolo_status_t st = kolo_state_sync(state);
	bool reformed = false;
	uint64_t t_err = 0, next_step_line = 0;
	for (;;) {
		if (st == KOLO_OK) {
			for (size_t j = 0; j < count; j++)
				x[j] = 1.0f;
			st = kolo_allreduce(comm, x, x, count, KOLO_FLOAT32, KOLO_SUM);
			if (st == KOLO_OK && count && x[0] != (float)kolo_size(comm)) {
				printf("WRONG %g size %d\n", (double)x[0], kolo_size(comm));
				return 2;
			}
		}
		if (st == KOLO_OK && reformed) {
			uint64_t t = kolo_now_ns();
			const uint64_t *p = comm->reform_ns;
			printf("FIRST %" PRId64 " %d %d %" PRIu64 " %" PRIu64 " %" PRIu64
			       " %" PRIu64 " %" PRIu64 " %" PRIu64 "\n",
			       kolo_round(comm), kolo_size(comm), kolo_rank(comm), t_err, p[0],
			       p[1], p[2], p[3], t);
			reformed = false;
		}
		if (st == KOLO_OK) {
			step++;
			st = kolo_state_commit(state);
		}
		if (st == KOLO_OK && kolo_now_ns() >= next_step_line) {
			printf("STEP %" PRId64 " %" PRId64 " %" PRIu64 "\n", kolo_round(comm), step,
			       kolo_now_ns());
			next_step_line = kolo_now_ns() + 250000000ull;
		}
		if (st == KOLO_OK && compute_ms > 0)
			usleep((useconds_t)compute_ms * 1000u);
		if (st == KOLO_OK)
			continue;
		if (kolo_state_left(state))
			break;
		t_err = kolo_now_ns();
		if ((st = kolo_reform(comm)) != KOLO_OK) {
			fprintf(stderr, "worker: kolo_reform: %s\n", kolo_last_error(comm));
			return 3;
		}
		printf("ROUND %" PRId64 " %d %d\n", kolo_round(comm), kolo_size(comm),
		       kolo_rank(comm));
		st = kolo_state_sync(state);
		reformed = true;
	}
	kolo_state_destroy(state);
	free(x);
	kolo_finalize(comm);
	return 0;
}

/* ---- the driver ------------------------------------------------------------ */

struct wproc {
	pid_t pid;
	int out;
	char buf[4096];
	size_t len;
	int rank, size; /* from ROUND lines; -1 until known */
	int64_t round;
	bool gone;
	/* the last FIRST line */
	int64_t first_round;
	uint64_t t_err, t_start, t_down, t_round, t_conn, t_first;
};

static struct wproc w[MAXW];
static int nw;
static char env_url[160], env_job[96];
static const char env_tok[] = "KOLO_TOKEN=elastic-bench-token";
static char self_exe[4096];
static size_t opt_count = 1024;

static int spawn_worker(void)
{
	struct wproc *p = &w[nw];
	memset(p, 0, sizeof(*p));
	p->rank = p->size = -1;
	p->round = -1;
	int o[2];
	if (pipe2(o, O_CLOEXEC) != 0)
		return -1;
	char cnt[32];
	snprintf(cnt, sizeof(cnt), "%zu", opt_count);
	const char *argv[] = {self_exe, "elastic", "--worker", "--count", cnt, NULL};
	const char *mine[] = {env_url,
	                      env_job,
	                      env_tok,
	                      "KOLO_ELASTIC=1",
	                      "KOLO_IFACE=127.0.0.1",
	                      "KOLO_HEARTBEAT_MS=100",
	                      "KOLO_TOKEN_FILE=",
	                      "KOLO_LAUNCHER_FD=-1",
	                      "KOLO_LOG_LEVEL=warn"};
	size_t n = 0, m = KOLO_ARRAY_SIZE(mine);
	while (environ[n])
		n++;
	char **env = calloc(n + m + 1, sizeof(*env));
	if (!env)
		return -1;
	size_t k = 0;
	for (size_t a = 0; a < n; a++) {
		/* The caller's KOLO_* settings pass (KOLO_ELASTIC_CONFIRM_MS, ...),
		 * but for the ones set here. */
		bool ours = false;
		for (size_t b = 0; b < m; b++) {
			size_t nl = strcspn(mine[b], "=");
			ours |= strncmp(environ[a], mine[b], nl + 1) == 0;
		}
		if (!ours)
			env[k++] = environ[a];
	}
	for (size_t b = 0; b < m; b++)
		env[k++] = (char *)mine[b];
	pid_t pid = fork();
	if (pid == 0) {
		dup2(o[1], STDOUT_FILENO);
		execve(argv[0], (char *const *)argv, env);
		_exit(127);
	}
	free(env);
	close(o[1]);
	p->pid = pid;
	p->out = o[0];
	nw++;
	return 0;
}

static void on_line(struct wproc *p, const char *l)
{
	int64_t r;
	int s, k;
	uint64_t a[6];
	if (sscanf(l, "ROUND %" SCNd64 " %d %d", &r, &s, &k) == 3) {
		p->round = r;
		p->size = s;
		p->rank = k;
	} else if (sscanf(l,
	                  "FIRST %" SCNd64 " %d %d %" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64
	                  " %" SCNu64 " %" SCNu64,
	                  &r, &s, &k, &a[0], &a[1], &a[2], &a[3], &a[4], &a[5]) == 9) {
		p->first_round = r;
		p->round = r;
		p->size = s;
		p->rank = k;
		p->t_err = a[0];
		p->t_start = a[1];
		p->t_down = a[2];
		p->t_round = a[3];
		p->t_conn = a[4];
		p->t_first = a[5];
	} else if (strncmp(l, "WRONG", 5) == 0) {
		fprintf(stderr, "kolo-bench elastic: worker %d: %s\n", (int)p->pid, l);
	}
}

static void pump(int ms)
{
	struct pollfd pf[MAXW];
	int idx[MAXW], n = 0;
	for (int i = 0; i < nw; i++)
		if (w[i].out >= 0) {
			pf[n].fd = w[i].out;
			pf[n].events = POLLIN;
			idx[n++] = i;
		}
	if (n == 0 || poll(pf, (nfds_t)n, ms) <= 0)
		return;
	for (int k = 0; k < n; k++) {
		if (!(pf[k].revents & (POLLIN | POLLHUP)))
			continue;
		struct wproc *p = &w[idx[k]];
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
			on_line(p, p->buf);
			size_t used = (size_t)(nl - p->buf) + 1;
			memmove(p->buf, nl + 1, p->len - used);
			p->len -= used;
		}
		if (p->len == sizeof(p->buf) - 1)
			p->len = 0;
	}
}

/* Waits until the live workers are exactly `ranks`, all in one round after
 * `after`, each with a FIRST line of that round (or, for the first round,
 * a ROUND line). Returns that round or -1 on timeout. */
static int64_t wait_formed(int ranks, int64_t after, bool need_first, int timeout_ms)
{
	uint64_t end = kolo_now_ms() + (uint64_t)timeout_ms;
	while (kolo_now_ms() < end) {
		pump(20);
		int live = 0;
		int64_t round = -1;
		bool ok = true;
		for (int i = 0; i < nw; i++) {
			if (w[i].gone)
				continue;
			live++;
			int64_t r = need_first ? w[i].first_round : w[i].round;
			if (r <= after || (round >= 0 && r != round))
				ok = false;
			round = r;
		}
		if (ok && live == ranks)
			return round;
	}
	return -1;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

enum { PH_TOTAL, PH_DETECT, PH_DOWN, PH_ROUND, PH_CONNECT, PH_FIRST, PH_COUNT };
static const char *const ph_names[PH_COUNT] = {"total", "detect",  "teardown",
                                               "round", "connect", "sync+first"};

static int series(int ranks, int kills, int sig, int64_t *round)
{
	double ph[PH_COUNT][256];
	int done = 0;
	const char *what = sig == SIGKILL ? "SIGKILL" : "SIGTERM";
	for (int k = 0; k < kills && k < 256; k++) {
		/* Everybody in one round, past a few steps. */
		int64_t r = wait_formed(ranks, *round, false, 60000);
		if (r < 0) {
			fprintf(stderr, "kolo-bench elastic: %d ranks did not form a round\n",
			        ranks);
			return 1;
		}
		*round = r;
		pump(50);
		int victim_rank = (int)kolo_random_below((uint64_t)ranks);
		struct wproc *v = NULL;
		for (int i = 0; i < nw; i++)
			if (!w[i].gone && w[i].rank == victim_rank)
				v = &w[i];
		if (!v)
			return 1;
		uint64_t t0 = kolo_now_ns();
		kill(v->pid, sig);
		v->gone = true;
		r = wait_formed(ranks - 1, *round, true, 60000);
		if (r < 0) {
			fprintf(stderr, "kolo-bench elastic: survivors did not re-form\n");
			return 1;
		}
		*round = r;
		/* The slowest survivor's first allreduce ends the recovery; the
		 * phases are that survivor's. */
		struct wproc *s = NULL;
		for (int i = 0; i < nw; i++)
			if (!w[i].gone && (!s || w[i].t_first > s->t_first))
				s = &w[i];
		uint64_t det = s->t_err > t0 ? s->t_err : t0;
		double v_ms[PH_COUNT] = {(double)(s->t_first - t0) / 1e6,
		                         (double)(det - t0) / 1e6,
		                         (double)(s->t_down - det) / 1e6,
		                         (double)(s->t_round - s->t_down) / 1e6,
		                         (double)(s->t_conn - s->t_round) / 1e6,
		                         (double)(s->t_first - s->t_conn) / 1e6};
		for (int p = 0; p < PH_COUNT; p++)
			ph[p][done] = v_ms[p];
		done++;
		printf("%s %2d: rank %d of %d -> round %" PRId64 " of %d ranks: %.1f ms "
		       "(detect %.1f, teardown %.1f, round %.1f, connect %.1f, sync+first %.1f)\n",
		       what, k + 1, victim_rank, ranks, r, ranks - 1, v_ms[0], v_ms[1], v_ms[2],
		       v_ms[3], v_ms[4], v_ms[5]);
		fflush(stdout);
		/* Reap the victim; start a replacement, which joins at a commit. */
		waitpid(v->pid, NULL, 0);
		if (spawn_worker() != 0)
			return 1;
	}
	if (done == 0)
		return 1;
	printf("%s: median over %d: ", what, done);
	for (int p = 0; p < PH_COUNT; p++)
		printf("%s%s %.1f ms", p ? ", " : "", ph_names[p], median(ph[p], done));
	printf("\n");
	fflush(stdout);
	return 0;
}

static void usage(FILE *f)
{
	fprintf(f, "usage: kolo-bench elastic [--ranks N] [--kills K] [--mode kill|leave|both] "
	           "[--count ELEMENTS]\n"
	           "  --ranks N    ranks on loopback (default 4)\n"
	           "  --kills K    failures per series (default 10)\n"
	           "  --mode M     kill (SIGKILL), leave (SIGTERM) or both (default both)\n"
	           "  --count C    float32 elements per allreduce (default 1024)\n"
	           "  --worker [--count C] [--compute-ms MS]  one worker alone (for external "
	           "drivers)\n");
}

int kolo_bench_elastic(int argc, char **argv)
{
	static const struct option longopts[] = {{"ranks", required_argument, NULL, 'n'},
	                                         {"kills", required_argument, NULL, 'k'},
	                                         {"mode", required_argument, NULL, 'm'},
	                                         {"count", required_argument, NULL, 'c'},
	                                         {"worker", no_argument, NULL, 'W'},
	                                         {"compute-ms", required_argument, NULL, 'C'},
	                                         {"help", no_argument, NULL, 'h'},
	                                         {NULL, 0, NULL, 0}};
	int ranks = 4, kills = 10, compute_ms = 0, c;
	bool worker = false;
	const char *mode = "both";
	optind = 1;
	while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		switch (c) {
		case 'n':
			ranks = atoi(optarg);
			break;
		case 'k':
			kills = atoi(optarg);
			break;
		case 'm':
			mode = optarg;
			break;
		case 'c':
			opt_count = (size_t)strtoull(optarg, NULL, 0);
			break;
		case 'W':
			worker = true;
			break;
		case 'C':
			compute_ms = atoi(optarg);
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (worker)
		return worker_main(opt_count, compute_ms);
	bool do_kill = strcmp(mode, "kill") == 0 || strcmp(mode, "both") == 0;
	bool do_leave = strcmp(mode, "leave") == 0 || strcmp(mode, "both") == 0;
	if (ranks < 3 || ranks > MAXW / 4 || kills < 1 || kills > 100 || (!do_kill && !do_leave)) {
		usage(stderr);
		return 2;
	}
	ssize_t n = readlink("/proc/self/exe", self_exe, sizeof(self_exe) - 1);
	if (n <= 0)
		return 1;
	self_exe[n] = '\0';
	signal(SIGPIPE, SIG_IGN);
	struct kolo_rdzv_server_config cfg = {.listen = "127.0.0.1:0",
	                                      .token = env_tok + strlen("KOLO_TOKEN="),
	                                      .min_np = 2,
	                                      .max_np = ranks,
	                                      .settle_ms = 100,
	                                      .lease_ms = 10000};
	struct kolo_rdzv_server *srv = NULL;
	struct kolo_errbuf eb = {{0}};
	if (kolo_rdzv_server_start(&cfg, &srv, &eb) != KOLO_OK) {
		fprintf(stderr, "kolo-bench elastic: server: %s\n", eb.msg);
		return 1;
	}
	snprintf(env_url, sizeof(env_url), "KOLO_RENDEZVOUS=http://127.0.0.1:%d",
	         kolo_rdzv_server_port(srv));
	char hex[17];
	kolo_random_hex(hex, 8);
	snprintf(env_job, sizeof(env_job), "KOLO_JOB=bench-elastic-%s", hex);
	printf("# kolo-bench elastic: %d ranks on loopback, allreduce of %zu float32, a commit "
	       "after each; %d failures per series\n",
	       ranks, opt_count, kills);
	int rc = 0;
	for (int i = 0; i < ranks && rc == 0; i++)
		rc = spawn_worker();
	int64_t round = 0;
	if (rc == 0 && do_kill)
		rc = series(ranks, kills, SIGKILL, &round);
	if (rc == 0 && do_leave)
		rc = series(ranks, kills, SIGTERM, &round);
	for (int i = 0; i < nw; i++) {
		if (w[i].pid > 0) {
			kill(w[i].pid, SIGKILL);
			waitpid(w[i].pid, NULL, 0);
		}
		if (w[i].out >= 0)
			close(w[i].out);
	}
	kolo_rdzv_server_stop(srv);
	return rc;
}
