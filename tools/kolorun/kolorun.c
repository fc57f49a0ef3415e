/* kolorun: starts N local worker processes of one kolo job.
 *
 *   kolorun -np N [--rendezvous URL] [--job ID] [--host NAME] [--token-file F]
 *           [--min-np A --max-np B] [--spares K] -- prog args...
 *
 * Without --rendezvous it runs the rendezvous server embedded, on a free
 * loopback port with a fresh random token. Each worker's stdout and stderr
 * are read through pipes and written out whole line by whole line, prefixed
 * with the worker's rank ("[2] ..."). The rank is what the rendezvous
 * assigned: the worker's runtime reports it on a third pipe (KOLO_LAUNCHER_FD)
 * as soon as kolo_init() has it; lines printed before that are prefixed with
 * the worker's slot ("[w2] ...").
 *
 * --spares K starts K workers beyond N in an elastic job of at most N: they
 * wait in kolo_init(), registered with the rendezvous (heartbeats only, no
 * data-plane traffic), and when a member dies or leaves, the next round
 * takes a spare in its place, so the job stays at N workers.
 *
 * SIGINT/SIGTERM are forwarded to the workers (each runs in its own process
 * group); a second one kills them. When a worker fails in a non-elastic job
 * the others get SIGTERM, then SIGKILL after a grace period, and kolorun
 * exits with the failed worker's status (128 + signal when it was killed).
 *
 * The workers never outlive kolorun: each is started with PR_SET_PDEATHSIG
 * SIGKILL, so when kolorun dies (SIGKILL included) the kernel kills them, and
 * the embedded server, a part of this process, goes with it. A worker that
 * dies in an elastic job (killed, or exited non-zero but not 90) is reported
 * to the rendezvous as dead (POST /failures with the worker id it reported
 * on the control pipe, "worker ID", and its round and rank), so that the
 * server drops it at once, member or waiting, and the next round forms
 * without it, even when every worker died; and any worker that dies is
 * reported in the job's KV as finished with a failure
 * ("fin/<round>/<rank>" and "fin/<round>/all" = "0", as the runtime's
 * kolo_finalize() does after a failure), so that the ranks of other
 * launchers waiting for it in kolo_finalize() stop waiting at once. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core.h"
#include "kolo/elastic.h"
#include "rendezvous.h"

#define LINE_MAX_BYTES 65536
#define GRACE_MS       5000
#define DRAIN_MS       1000
#define REPORT_MS      1000 /* budget for reporting a dead worker to the server */

extern char **environ;

enum { S_OUT, S_ERR, S_CTL, S_COUNT };

struct stream {
	int fd; /* read end, -1 once closed */
	char *buf;
	size_t len;
};

struct worker {
	int slot;
	pid_t pid; /* 0 once reaped */
	int rank;  /* -1 until reported */
	int64_t round;
	char id[KOLO_RDZV_ID_MAX]; /* its rendezvous worker id, "" until reported */
	int status;
	bool exited;
	struct stream s[S_COUNT];
};

struct opts {
	int np, min_np, max_np, settle_ms, grace_ms;
	int spares;          /* workers started beyond np, waiting to take a lost one's place */
	bool restart_failed; /* elastic: start a replacement for a failed worker */
	int max_restarts;
	const char *rendezvous, *job, *host, *token_file;
	char **argv;
};

static int sig_pipe[2] = {-1, -1};

static void on_signal(int sig)
{
	int saved = errno;
	unsigned char b = (unsigned char)sig;
	if (write(sig_pipe[1], &b, 1) < 0) {
		/* full pipe: a wakeup is already pending */
	}
	errno = saved;
}

static void usage(FILE *f)
{
	fprintf(f,
	        "usage: kolorun -np N [options] -- program [args...]\n"
	        "Starts N worker processes of one kolo job and prefixes their output with "
	        "their rank.\n\n"
	        "  -np, -n N             number of local workers\n"
	        "  --rendezvous URL      join an external rendezvous server (default: run one "
	        "embedded\n"
	        "                        on 127.0.0.1 with a fresh random token)\n"
	        "  --job ID              job id (default: $KOLO_JOB or \"default\")\n"
	        "  --host NAME           host name the workers report (KOLO_HOSTNAME)\n"
	        "  --token-file F        file holding the job's token (KOLO_TOKEN_FILE)\n"
	        "  --min-np A            elastic: fewest workers that form a round\n"
	        "  --max-np B            elastic: most workers in a round\n"
	        "  --spares K            start K more workers that wait, connected to the "
	        "rendezvous,\n"
	        "                        and take a lost worker's place in the next round: "
	        "the job\n"
	        "                        stays at N workers (elastic; --max-np is N)\n"
	        "  --restart-failed      elastic: start a replacement for each worker that "
	        "fails;\n"
	        "                        it joins the running job\n"
	        "  --max-restarts K      at most K replacements in all (default 3)\n"
	        "  --settle-ms MS        embedded server: settle time (default 200)\n"
	        "  --grace-ms MS         time between SIGTERM and SIGKILL (default %d)\n"
	        "  -h, --help            this help\n"
	        "  --version             print the version\n",
	        GRACE_MS);
}

static int parse_int(const char *s, const char *what, int lo)
{
	char *end;
	errno = 0;
	long v = strtol(s, &end, 10);
	if (errno || *end || v < lo || v > INT_MAX) {
		fprintf(stderr, "kolorun: %s must be an integer >= %d, not \"%s\"\n", what, lo, s);
		exit(2);
	}
	return (int)v;
}

static void parse_args(int argc, char **argv, struct opts *o)
{
	enum {
		O_RDZV = 256,
		O_JOB,
		O_HOST,
		O_TOKEN,
		O_MIN,
		O_MAX,
		O_SETTLE,
		O_GRACE,
		O_VERSION,
		O_RESTART,
		O_MAX_RESTARTS,
		O_SPARES
	};
	static const struct option longs[] = {
	        {"np", required_argument, NULL, 'n'},
	        {"rendezvous", required_argument, NULL, O_RDZV},
	        {"job", required_argument, NULL, O_JOB},
	        {"host", required_argument, NULL, O_HOST},
	        {"token-file", required_argument, NULL, O_TOKEN},
	        {"min-np", required_argument, NULL, O_MIN},
	        {"max-np", required_argument, NULL, O_MAX},
	        {"settle-ms", required_argument, NULL, O_SETTLE},
	        {"grace-ms", required_argument, NULL, O_GRACE},
	        {"restart-failed", no_argument, NULL, O_RESTART},
	        {"max-restarts", required_argument, NULL, O_MAX_RESTARTS},
	        {"spares", required_argument, NULL, O_SPARES},
	        {"help", no_argument, NULL, 'h'},
	        {"version", no_argument, NULL, O_VERSION},
	        {NULL, 0, NULL, 0},
	};
	*o = (struct opts){.np = -1, .settle_ms = 200, .grace_ms = GRACE_MS, .max_restarts = 3};
	int c;
	/* getopt_long_only so that the customary "-np 4" works. */
	while ((c = getopt_long_only(argc, argv, "+n:h", longs, NULL)) != -1) {
		switch (c) {
		case 'n':
			o->np = parse_int(optarg, "-np", 1);
			break;
		case O_RDZV:
			o->rendezvous = optarg;
			break;
		case O_JOB:
			o->job = optarg;
			break;
		case O_HOST:
			o->host = optarg;
			break;
		case O_TOKEN:
			o->token_file = optarg;
			break;
		case O_MIN:
			o->min_np = parse_int(optarg, "--min-np", 1);
			break;
		case O_MAX:
			o->max_np = parse_int(optarg, "--max-np", 1);
			break;
		case O_SETTLE:
			o->settle_ms = parse_int(optarg, "--settle-ms", 0);
			break;
		case O_GRACE:
			o->grace_ms = parse_int(optarg, "--grace-ms", 0);
			break;
		case O_RESTART:
			o->restart_failed = true;
			break;
		case O_MAX_RESTARTS:
			o->max_restarts = parse_int(optarg, "--max-restarts", 0);
			break;
		case O_SPARES:
			o->spares = parse_int(optarg, "--spares", 0);
			break;
		case 'h':
			usage(stdout);
			exit(0);
		case O_VERSION:
			printf("kolorun %s\n", KOLO_VERSION_STRING);
			exit(0);
		default:
			usage(stderr);
			exit(2);
		}
	}
	if (o->np < 1 || optind >= argc) {
		fprintf(stderr, "kolorun: %s\n",
		        o->np < 1 ? "-np N is required" : "no program given after --");
		usage(stderr);
		exit(2);
	}
	if (!o->min_np)
		o->min_np = o->np;
	if (o->spares > 0 && o->max_np && o->max_np != o->np) {
		fprintf(stderr,
		        "kolorun: --spares keeps the job at -np %d workers: --max-np %d would "
		        "make the spares members (leave --max-np out)\n",
		        o->np, o->max_np);
		exit(2);
	}
	if (!o->max_np)
		o->max_np = KOLO_MAX(o->np, o->min_np);
	if (o->min_np > o->max_np) {
		fprintf(stderr, "kolorun: --min-np %d exceeds --max-np %d\n", o->min_np, o->max_np);
		exit(2);
	}
	if (!o->rendezvous && o->np < o->min_np) {
		fprintf(stderr, "kolorun: -np %d < --min-np %d: no round would ever form\n", o->np,
		        o->min_np);
		exit(2);
	}
	o->argv = argv + optind;
}

/* ---- environment ------------------------------------------------------ */

struct env {
	char **v;
	size_t n, cap;
};

static void env_set(struct env *e, const char *name, const char *value)
{
	size_t nl = strlen(name);
	char *kv = malloc(nl + strlen(value) + 2);
	if (!kv) {
		perror("kolorun");
		exit(1);
	}
	sprintf(kv, "%s=%s", name, value);
	for (size_t i = 0; i < e->n; i++) {
		if (strncmp(e->v[i], name, nl) == 0 && e->v[i][nl] == '=') {
			free(e->v[i]);
			e->v[i] = kv;
			return;
		}
	}
	if (e->n + 2 > e->cap) {
		e->cap = e->cap ? e->cap * 2 : 64;
		e->v = realloc(e->v, e->cap * sizeof(*e->v));
		if (!e->v) {
			perror("kolorun");
			exit(1);
		}
	}
	e->v[e->n++] = kv;
	e->v[e->n] = NULL;
}

static void env_unset(struct env *e, const char *name)
{
	size_t nl = strlen(name);
	for (size_t i = 0; i < e->n; i++) {
		if (strncmp(e->v[i], name, nl) == 0 && e->v[i][nl] == '=') {
			free(e->v[i]);
			e->v[i] = e->v[--e->n];
			e->v[e->n] = NULL;
			return;
		}
	}
}

static void env_init(struct env *e)
{
	*e = (struct env){0};
	for (char **p = environ; *p; p++) {
		char *eq = strchr(*p, '=');
		if (!eq)
			continue;
		char name[256];
		size_t nl = KOLO_MIN((size_t)(eq - *p), sizeof(name) - 1);
		memcpy(name, *p, nl);
		name[nl] = '\0';
		env_set(e, name, eq + 1);
	}
}

static void env_free(struct env *e)
{
	for (size_t i = 0; i < e->n; i++)
		free(e->v[i]);
	free(e->v);
}

/* The program's path, resolved in the parent: the child must only exec. */
static char *resolve(const char *prog)
{
	if (strchr(prog, '/'))
		return strdup(prog);
	const char *path = getenv("PATH");
	if (!path)
		path = "/usr/local/bin:/usr/bin:/bin";
	for (const char *p = path; *p;) {
		size_t n = strcspn(p, ":");
		char cand[PATH_MAX];
		if (snprintf(cand, sizeof(cand), "%.*s/%s", (int)n, n ? p : ".", prog) <
		    (int)sizeof(cand)) {
			struct stat st;
			if (stat(cand, &st) == 0 && S_ISREG(st.st_mode) && access(cand, X_OK) == 0)
				return strdup(cand);
		}
		p += n;
		if (*p == ':')
			p++;
	}
	return NULL;
}

/* ---- output ----------------------------------------------------------- */

static void write_all(int fd, const char *p, size_t n)
{
	while (n > 0) {
		ssize_t w = write(fd, p, n);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			return; /* our reader went away: nothing better to do */
		}
		p += w;
		n -= (size_t)w;
	}
}

/* Writes one line (without its '\n') with the worker's prefix, in one
 * write() so that lines of different workers never interleave. */
static void emit(const struct worker *w, int fd, const char *line, size_t n)
{
	char prefix[32];
	int pl = w->rank >= 0 ? snprintf(prefix, sizeof(prefix), "[%d] ", w->rank)
	                      : snprintf(prefix, sizeof(prefix), "[w%d] ", w->slot);
	char *out = malloc((size_t)pl + n + 1);
	if (!out)
		return;
	memcpy(out, prefix, (size_t)pl);
	memcpy(out + pl, line, n);
	out[(size_t)pl + n] = '\n';
	write_all(fd, out, (size_t)pl + n + 1);
	free(out);
}

/* A control line from the runtime: "rank R size N round K" after each
 * assignment, "worker ID" after each join (the latest counts). Other lines
 * are ignored, so that either side may be newer. */
static void control(struct worker *w, const char *line)
{
	int rank, size;
	long long round;
	if (sscanf(line, "rank %d size %d round %lld", &rank, &size, &round) == 3 && rank >= 0) {
		w->rank = rank;
		w->round = round;
	} else if (strncmp(line, "worker ", 7) == 0 && kolo_rdzv_valid_id(line + 7, false)) {
		snprintf(w->id, sizeof(w->id), "%s", line + 7);
	}
}

/* Handles the complete lines in the stream's buffer; at EOF also the rest. */
static void flush_lines(struct worker *w, int which, bool eof)
{
	struct stream *s = &w->s[which];
	size_t start = 0;
	for (;;) {
		char *nl = s->len > start ? memchr(s->buf + start, '\n', s->len - start) : NULL;
		size_t end;
		if (nl)
			end = (size_t)(nl - s->buf);
		else if (s->len - start >= LINE_MAX_BYTES || (eof && s->len > start))
			end = s->len; /* an over-long or unterminated last line */
		else
			break;
		if (which == S_CTL) {
			/* Only whole control lines count; anything else is dropped. */
			if (nl) {
				*nl = '\0';
				control(w, s->buf + start);
			}
		} else {
			emit(w, which == S_OUT ? STDOUT_FILENO : STDERR_FILENO, s->buf + start,
			     end - start);
		}
		start = nl ? end + 1 : end;
	}
	if (start > 0) {
		memmove(s->buf, s->buf + start, s->len - start);
		s->len -= start;
	}
}

static void read_stream(struct worker *w, int which)
{
	struct stream *s = &w->s[which];
	char tmp[16384];
	ssize_t n = read(s->fd, tmp, sizeof(tmp));
	if (n < 0 && (errno == EINTR || errno == EAGAIN))
		return;
	if (n <= 0) {
		flush_lines(w, which, true);
		close(s->fd);
		s->fd = -1;
		return;
	}
	char *b = realloc(s->buf, s->len + (size_t)n + 1);
	if (!b)
		return;
	s->buf = b;
	memcpy(s->buf + s->len, tmp, (size_t)n);
	s->len += (size_t)n;
	flush_lines(w, which, false);
}

/* Reads what a reaped worker left in its control pipe: a line it wrote
 * just before dying (a new worker id) may not have been read yet. Never
 * blocks, and stops after a few reads: a child of the worker may still hold
 * the pipe open. */
static void drain_control(struct worker *w)
{
	for (int i = 0; i < 16 && w->s[S_CTL].fd >= 0; i++) {
		struct pollfd p = {.fd = w->s[S_CTL].fd, .events = POLLIN};
		if (poll(&p, 1, 0) <= 0)
			return;
		read_stream(w, S_CTL);
	}
}

/* ---- workers ---------------------------------------------------------- */

static pid_t spawn(struct worker *w, const char *path, char **argv, struct env *base,
                   const char *devnull_path)
{
	int p[S_COUNT][2];
	for (int i = 0; i < S_COUNT; i++) {
		if (pipe2(p[i], O_CLOEXEC) != 0) {
			perror("kolorun: pipe");
			return -1;
		}
	}
	char num[32];
	snprintf(num, sizeof(num), "%d", p[S_CTL][1]);
	env_set(base, "KOLO_LAUNCHER_FD", num);
	int devnull = open(devnull_path, O_RDONLY | O_CLOEXEC);
	pid_t parent = getpid();
	/* From the main thread only: the death signal comes when the thread
	 * that forked exits, and the main thread lives as long as kolorun. */
	pid_t pid = fork();
	if (pid == 0) {
		/* Only async-signal-safe calls from here on. */
		/* Die with kolorun, however it dies; if it died before this
		 * line, the signal will never come: go now. */
		if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent)
			_exit(127);
		setpgid(0, 0);
		if (devnull >= 0)
			dup2(devnull, STDIN_FILENO);
		dup2(p[S_OUT][1], STDOUT_FILENO);
		dup2(p[S_ERR][1], STDERR_FILENO);
		fcntl(p[S_CTL][1], F_SETFD, 0);
		struct sigaction sa = {.sa_handler = SIG_DFL};
		sigaction(SIGINT, &sa, NULL);
		sigaction(SIGTERM, &sa, NULL);
		sigaction(SIGCHLD, &sa, NULL);
		sigaction(SIGPIPE, &sa, NULL);
		execve(path, argv, base->v);
		static const char msg[] = "kolorun: cannot execute the program\n";
		write_all(STDERR_FILENO, msg, sizeof(msg) - 1);
		_exit(127);
	}
	if (devnull >= 0)
		close(devnull);
	for (int i = 0; i < S_COUNT; i++) {
		close(p[i][1]);
		w->s[i].fd = p[i][0];
	}
	if (pid < 0) {
		perror("kolorun: fork");
		return -1;
	}
	setpgid(pid, pid); /* also here: no race with a signal sent right away */
	return pid;
}

static int exit_code(int status)
{
	if (WIFEXITED(status))
		return WEXITSTATUS(status);
	if (WIFSIGNALED(status))
		return 128 + WTERMSIG(status);
	return 1;
}

/* ---- the job's KV ------------------------------------------------------ */

/* A client of the job at url for kolorun's own requests, or NULL with the
 * reason in eb. deadline_ms bounds its retries of an unreachable server. */
static struct kolo_rdzv_client *job_client(const char *url, const char *job, const char *token,
                                           int deadline_ms, struct kolo_errbuf *eb)
{
	char host[KOLO_RDZV_HOST_MAX];
	if (kolo_hostname(host, sizeof(host)) != KOLO_OK || !host[0])
		snprintf(host, sizeof(host), "kolorun");
	struct kolo_rdzv_client_config cc = {
	        .url = url, .job = job, .token = token, .host = host, .deadline_ms = deadline_ms};
	struct kolo_rdzv_client *c = NULL;
	return kolo_rdzv_client_create(&cc, &c, eb) == KOLO_OK ? c : NULL;
}

static bool past_deadline(void *arg)
{
	return kolo_now_ms() >= *(const uint64_t *)arg;
}

/* Elastic: tells the server that w's process is dead, which no peer can
 * know for sure (a peer's alive key may predate the death; a closed conn
 * may be a re-form), and nobody else can tell when every worker died. The
 * server drops the worker now, as at its lease's end, so that no round
 * forms with it. By its id when the worker reported one: a rank report of
 * a round already past is ignored there, and when every member dies at
 * once the first report ends the round. */
static void report_dead(struct kolo_rdzv_client *c, const struct worker *w)
{
	bool ranked = w->rank >= 0 && w->round >= 1;
	kolo_status_t st = KOLO_OK;
	if (w->id[0])
		st = kolo_rdzv_report_dead(c, w->id, ranked ? w->round : 0, w->rank);
	else if (ranked)
		st = kolo_rdzv_report_failure(c, w->round, w->rank);
	if (st == KOLO_OK)
		return;
	if (w->id[0])
		fprintf(stderr, "kolorun: cannot report worker %s as dead: %s\n", w->id,
		        kolo_rdzv_client_error(c));
	else
		fprintf(stderr,
		        "kolorun: cannot report rank %d of round %" PRId64 " as failed: %s\n",
		        w->rank, w->round, kolo_rdzv_client_error(c));
}

/* Tells the job that worker w is gone, within about REPORT_MS in all, before
 * the caller goes on (or exits): in an elastic job to the server (above);
 * and, for a worker that held a rank, the "0" verdict that kolo_finalize()
 * writes itself after a failure (runtime/init.c), which the ranks waiting
 * there for w read instead of waiting out KOLO_TIMEOUT_MS. Best effort. */
static void report_gone(struct kolo_rdzv_client *c, const struct worker *w, bool elastic)
{
	bool ranked = w->rank >= 0 && w->round >= 1;
	if (!c || (!ranked && !(elastic && w->id[0])))
		return;
	uint64_t end = kolo_now_ms() + REPORT_MS;
	kolo_rdzv_set_cancel(c, past_deadline, &end);
	if (elastic)
		report_dead(c, w);
	if (!ranked) {
		kolo_rdzv_set_cancel(c, NULL, NULL);
		return;
	}
	char key[64];
	snprintf(key, sizeof(key), "fin/%" PRId64 "/%d", w->round, w->rank);
	kolo_status_t st = kolo_rdzv_kv_put(c, key, "0", 1);
	snprintf(key, sizeof(key), "fin/%" PRId64 "/all", w->round);
	if (st == KOLO_OK)
		st = kolo_rdzv_kv_put(c, key, "0", 1);
	kolo_rdzv_set_cancel(c, NULL, NULL);
	if (st != KOLO_OK)
		fprintf(stderr, "kolorun: cannot tell the job that rank %d is gone: %s\n", w->rank,
		        kolo_rdzv_client_error(c));
}

static void signal_all(struct worker *ws, int n, int sig)
{
	for (int i = 0; i < n; i++)
		if (ws[i].pid > 0)
			kill(-ws[i].pid, sig);
}

int main(int argc, char **argv)
{
	struct opts o;
	parse_args(argc, argv, &o);
	kolo_log_configure();
	signal(SIGPIPE, SIG_IGN);

	char *path = resolve(o.argv[0]);
	if (!path) {
		fprintf(stderr, "kolorun: %s: command not found\n", o.argv[0]);
		return 127;
	}
	const char *job = o.job ? o.job : kolo_param_str(KOLO_P_JOB);
	struct env env;
	env_init(&env);
	env_set(&env, "KOLO_JOB", job);
	if (o.host)
		env_set(&env, "KOLO_HOSTNAME", o.host);
	/* Elastic: a range of sizes (or KOLO_ELASTIC). Then a failed worker is
	 * not fatal while enough remain: min-np of ours with the embedded
	 * server; with an external one the job spans other launchers too, so
	 * the server decides and we only need one worker left. */
	bool elastic = o.min_np < o.max_np || o.spares > 0 || kolo_param_bool(KOLO_P_ELASTIC);
	int nproc = o.np + o.spares; /* members, then the spares beyond max-np */
	if (elastic)
		env_set(&env, "KOLO_ELASTIC", "1");
	int min_alive = o.rendezvous ? 1 : o.min_np;

	struct kolo_rdzv_server *server = NULL;
	struct kolo_rdzv_client *reporter = NULL; /* tells the job about dead workers */
	struct kolo_errbuf eb = {{0}};
	char url[512];
	if (!o.rendezvous) {
		char token[65];
		if (kolo_random_hex(token, 32) != KOLO_OK) {
			fprintf(stderr, "kolorun: cannot draw a random token\n");
			return 1;
		}
		struct kolo_rdzv_server_config sc = {
		        .listen = "127.0.0.1:0",
		        .token = token,
		        .min_np = o.min_np,
		        .max_np = o.max_np,
		        .settle_ms = o.settle_ms,
		        .lease_ms = (int)kolo_param_int(KOLO_P_LEASE_MS),
		        .log_json = strcmp(kolo_param_str(KOLO_P_LOG_FORMAT), "json") == 0,
		};
		if (kolo_rdzv_server_start(&sc, &server, &eb) != KOLO_OK) {
			fprintf(stderr, "kolorun: cannot start the rendezvous server: %s\n",
			        eb.msg);
			return 1;
		}
		snprintf(url, sizeof(url), "http://127.0.0.1:%d", kolo_rdzv_server_port(server));
		reporter = job_client(url, job, token, REPORT_MS, &eb);
		env_set(&env, "KOLO_TOKEN", token);
		env_unset(&env, "KOLO_TOKEN_FILE");
		memset(token, 0, sizeof(token));
	} else {
		snprintf(url, sizeof(url), "%s", o.rendezvous);
		if (o.token_file) {
			env_set(&env, "KOLO_TOKEN_FILE", o.token_file);
			env_unset(&env, "KOLO_TOKEN");
		}
		char *tok = NULL;
		if (o.token_file) {
			setenv("KOLO_TOKEN_FILE", o.token_file, 1);
			unsetenv("KOLO_TOKEN");
		}
		kolo_status_t st = kolo_token_load(&tok, &eb);
		if (o.min_np != o.np || o.max_np != o.np || o.spares > 0) {
			/* Tell the external server about the elastic range. */
			struct kolo_rdzv_client *c = NULL;
			if (st == KOLO_OK)
				c = job_client(url, job, tok,
				               (int)kolo_param_int(KOLO_P_RDZV_DEADLINE_MS), &eb);
			if (c)
				st = kolo_rdzv_job_configure(c, o.min_np, o.max_np,
				                             (int)kolo_param_int(KOLO_P_SETTLE_MS));
			if (st != KOLO_OK || !c) {
				fprintf(stderr, "kolorun: cannot configure job %s: %s\n", job,
				        c ? kolo_rdzv_client_error(c) : eb.msg);
				kolo_rdzv_client_destroy(c);
				free(tok);
				return 1;
			}
			kolo_rdzv_client_destroy(c);
		}
		if (st == KOLO_OK)
			reporter = job_client(url, job, tok, REPORT_MS, &eb);
		if (tok)
			memset(tok, 0, strlen(tok));
		free(tok);
	}
	if (!reporter)
		fprintf(stderr, "kolorun: dead workers will not be reported to the job: %s\n",
		        eb.msg);
	env_set(&env, "KOLO_RENDEZVOUS", url);

	if (pipe2(sig_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
		perror("kolorun: pipe");
		return 1;
	}
	struct sigaction sa = {.sa_handler = on_signal};
	sigemptyset(&sa.sa_mask);
	sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
	sigaction(SIGCHLD, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);

	/* Slots: the first np workers and the spares, then one per replacement. */
	int n_slots = nproc, restarts = 0;
	int cap = nproc + (elastic && o.restart_failed ? o.max_restarts : 0);
	struct worker *ws = calloc((size_t)cap, sizeof(*ws));
	struct pollfd *pfds = calloc((size_t)cap * S_COUNT + 1, sizeof(*pfds));
	if (!ws || !pfds) {
		perror("kolorun");
		return 1;
	}
	int running = 0, failed_slot = -1, result = 0, n_failed = 0, n_ok = 0, n_evicted = 0;
	for (int i = 0; i < nproc; i++) {
		ws[i].slot = i;
		ws[i].rank = -1;
		for (int k = 0; k < S_COUNT; k++)
			ws[i].s[k].fd = -1;
		ws[i].pid = spawn(&ws[i], path, o.argv, &env, "/dev/null");
		if (ws[i].pid < 0) {
			ws[i].pid = 0;
			ws[i].exited = true;
			ws[i].status = 1 << 8;
			failed_slot = i;
			result = 1;
			break;
		}
		running++;
	}

	bool stopping = failed_slot >= 0;
	uint64_t kill_at = 0, drain_until = 0;
	if (stopping) {
		signal_all(ws, n_slots, SIGTERM);
		kill_at = kolo_now_ms() + (uint64_t)o.grace_ms;
	}
	for (;;) {
		int nfds = 0;
		pfds[nfds++] = (struct pollfd){.fd = sig_pipe[0], .events = POLLIN};
		/* Control pipes first: a rank report precedes the output it labels. */
		for (int k = S_CTL; k >= 0; k--)
			for (int i = 0; i < n_slots; i++)
				if (ws[i].s[k].fd >= 0)
					pfds[nfds++] = (struct pollfd){.fd = ws[i].s[k].fd,
					                               .events = POLLIN};
		if (running == 0 && (nfds == 1 || (drain_until && kolo_now_ms() >= drain_until)))
			break;
		if (running == 0 && !drain_until)
			drain_until = kolo_now_ms() + DRAIN_MS;
		int timeout = -1;
		uint64_t now = kolo_now_ms();
		if (kill_at && running > 0)
			timeout = kill_at > now ? (int)(kill_at - now) : 0;
		if (drain_until)
			timeout = drain_until > now ? (int)(drain_until - now) : 0;
		int rc = poll(pfds, (nfds_t)nfds, timeout);
		if (rc < 0 && errno != EINTR) {
			perror("kolorun: poll");
			break;
		}
		for (int j = 1; rc > 0 && j < nfds; j++) {
			if (!pfds[j].revents)
				continue;
			for (int i = 0; i < n_slots; i++)
				for (int k = 0; k < S_COUNT; k++)
					if (ws[i].s[k].fd == pfds[j].fd)
						read_stream(&ws[i], k);
		}
		if (rc > 0 && pfds[0].revents) {
			unsigned char sigs[64];
			ssize_t n = read(sig_pipe[0], sigs, sizeof(sigs));
			for (ssize_t j = 0; j < n; j++) {
				if (sigs[j] != SIGINT && sigs[j] != SIGTERM)
					continue;
				if (stopping) {
					signal_all(ws, n_slots, SIGKILL);
				} else {
					fprintf(stderr,
					        "kolorun: got signal %d; stopping the workers\n",
					        sigs[j]);
					stopping = true;
					if (!result)
						result = 128 + sigs[j];
					signal_all(ws, n_slots, sigs[j]);
					kill_at = kolo_now_ms() + (uint64_t)o.grace_ms;
				}
			}
		}
		/* Reap. */
		for (;;) {
			int status;
			pid_t pid = waitpid(-1, &status, WNOHANG);
			if (pid <= 0)
				break;
			for (int i = 0; i < n_slots; i++) {
				if (ws[i].pid != pid)
					continue;
				ws[i].pid = 0;
				ws[i].exited = true;
				ws[i].status = status;
				running--;
				drain_control(&ws[i]);
				int code = exit_code(status);
				if (code == 0) {
					n_ok++;
					break;
				}
				char who[32];
				if (ws[i].rank >= 0)
					snprintf(who, sizeof(who), "rank %d", ws[i].rank);
				else
					snprintf(who, sizeof(who), "worker w%d", i);
				if (elastic && code == KOLO_EXIT_EVICTED && !stopping) {
					/* It left the job at a commit point: not a failure,
					 * and not to be restarted. */
					fprintf(stderr,
					        "kolorun: %s (pid %d) was evicted as a straggler; "
					        "not "
					        "restarted\n",
					        who, (int)pid);
					n_evicted++;
					break;
				}
				report_gone(reporter, &ws[i], elastic);
				n_failed++;
				if (stopping) {
					break;
				}
				if (WIFSIGNALED(status))
					fprintf(stderr,
					        "kolorun: %s (pid %d) was killed by signal %d\n",
					        who, (int)pid, WTERMSIG(status));
				else
					fprintf(stderr,
					        "kolorun: %s (pid %d) exited with status %d\n", who,
					        (int)pid, code);
				if (elastic && nproc - n_failed >= min_alive) {
					fprintf(stderr,
					        "kolorun: elastic job: %d workers remain (min "
					        "%d)\n",
					        nproc - n_failed, min_alive);
					if (o.restart_failed && restarts < o.max_restarts &&
					    n_slots < cap) {
						struct worker *nw = &ws[n_slots];
						nw->slot = n_slots;
						nw->rank = -1;
						for (int k = 0; k < S_COUNT; k++)
							nw->s[k].fd = -1;
						nw->pid =
						        spawn(nw, path, o.argv, &env, "/dev/null");
						if (nw->pid > 0) {
							restarts++;
							n_failed--;
							running++;
							n_slots++;
							fprintf(stderr,
							        "kolorun: started replacement w%d "
							        "(pid %d; %d of at most %d)\n",
							        nw->slot, (int)nw->pid, restarts,
							        o.max_restarts);
						} else {
							nw->pid = 0;
						}
					}
					break;
				}
				result = code;
				failed_slot = i;
				stopping = true;
				if (running > 0)
					fprintf(stderr, "kolorun: stopping the other %d workers\n",
					        running);
				signal_all(ws, n_slots, SIGTERM);
				kill_at = kolo_now_ms() + (uint64_t)o.grace_ms;
				break;
			}
		}
		if (kill_at && running > 0 && kolo_now_ms() >= kill_at) {
			fprintf(stderr,
			        "kolorun: %d workers still running after %d ms; killing them\n",
			        running, o.grace_ms);
			signal_all(ws, n_slots, SIGKILL);
			kill_at = 0;
		}
	}
	for (int i = 0; i < n_slots; i++) {
		for (int k = 0; k < S_COUNT; k++) {
			if (ws[i].s[k].fd >= 0) {
				flush_lines(&ws[i], k, true);
				close(ws[i].s[k].fd);
			}
			free(ws[i].s[k].buf);
		}
	}
	free(ws);
	free(pfds);
	env_free(&env);
	free(path);
	kolo_rdzv_client_destroy(reporter);
	kolo_rdzv_server_stop(server);
	close(sig_pipe[0]);
	close(sig_pipe[1]);
	/* Every worker of ours was evicted as a straggler: say so (a pod's
	 * failure policy can tell it from a failure and from a success). */
	if (result == 0 && n_evicted > 0 && n_ok == 0)
		result = KOLO_EXIT_EVICTED;
	return result;
}
