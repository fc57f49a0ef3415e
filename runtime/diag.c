/* diag: the flight recorder's way out of the process. One thread per
 * process (started by its first comm, stopped with its last) that
 *   - answers diagnosis requests: it long-polls the job's KV for key
 *     diag/request/<n+1> and, when it appears, puts this worker's recorder
 *     at diag/report/<rank> (kolo-rendezvous joins the reports, GET
 *     /v1/jobs/{job}/diagnosis);
 *   - reports on its own while a collective has been open longer than
 *     KOLO_DIAG_THRESHOLD_MS, every DIAG_REPORT_MS until it completes;
 *   - writes the recorder to a file on SIGUSR1 (the handler only writes a
 *     byte to a pipe) and once on a fatal error.
 * It has its own rendezvous client, so it never waits behind the main
 * thread's calls, and works while every other thread of the worker is
 * blocked in a collective. docs/diagnosis.md. */
#include "runtime.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SUBSYS          "diag"
#define DIAG_POLL_MS    250  /* the request long poll, and the loop's pace */
#define DIAG_REPORT_MS  500  /* reports while stalled, at most this often */
#define DIAG_ENTRIES    32   /* entries per comm in a report */
#define DIAG_DEADLINE   2000 /* the reporter's retry budget per request */
#define DIAG_PUBLISH_MS 20   /* the loop's pace until this process is published */

static struct {
	pthread_mutex_t lock;
	int refs;
	pid_t pid; /* the process that started the thread (a forked child has none) */
	pthread_t thread;
	atomic_bool stop;
	int pipe[2];
	bool sig_installed;
	struct sigaction old_usr1;
	struct kolo_rdzv_client *rdzv;
	const struct kolo_comm *owner;
	/* identity, under lock */
	int rank, size;
	int64_t round;
	char host[KOLO_RDZV_HOST_MAX], job[KOLO_RDZV_ID_MAX];
	atomic_bool fatal_dumped;
} D = {.lock = PTHREAD_MUTEX_INITIALIZER, .pipe = {-1, -1}};

static void identity(struct kolo_flight_identity *id, uint64_t gen, const char *reason, char *host,
                     char *job)
{
	pthread_mutex_lock(&D.lock);
	snprintf(host, KOLO_RDZV_HOST_MAX, "%s", D.host);
	snprintf(job, KOLO_RDZV_ID_MAX, "%s", D.job);
	*id = (struct kolo_flight_identity){.rank = D.rank,
	                                    .size = D.size,
	                                    .round = D.round,
	                                    .host = host,
	                                    .job = job,
	                                    .gen = gen,
	                                    .reason = reason};
	pthread_mutex_unlock(&D.lock);
}

kolo_status_t kolo_runtime_flight_json(char **out, size_t *len)
{
	char host[KOLO_RDZV_HOST_MAX], job[KOLO_RDZV_ID_MAX];
	struct kolo_flight_identity id;
	identity(&id, 0, "scrape", host, job);
	return kolo_flight_render(&id, 0, out, len);
}

static void dump_file(const char *reason)
{
	char host[KOLO_RDZV_HOST_MAX], job[KOLO_RDZV_ID_MAX], path[1024];
	struct kolo_flight_identity id;
	identity(&id, 0, reason, host, job);
	const char *dir = kolo_param_str(KOLO_P_FLIGHT_DIR);
	if (!dir[0])
		dir = getenv("TMPDIR") && getenv("TMPDIR")[0] ? getenv("TMPDIR") : "/tmp";
	if (kolo_flight_dump(&id, dir, path, sizeof(path)) == KOLO_OK)
		KOLO_WARN(SUBSYS, "flight recorder (%s) written to %s", reason, path);
	else
		KOLO_WARN(SUBSYS, "cannot write the flight recorder (%s) to %s: %s", reason, dir,
		          strerror(errno));
}

void kolo_runtime_diag_fatal(const char *why)
{
	if (!atomic_exchange(&D.fatal_dumped, true))
		dump_file(why);
}

static void on_usr1(int sig)
{
	(void)sig;
	int saved = errno;
	char b = 1;
	if (D.pipe[1] >= 0 && write(D.pipe[1], &b, 1) < 0) {
		/* full: a dump is pending already */
	}
	errno = saved;
}

static void report(uint64_t gen, const char *reason)
{
	char host[KOLO_RDZV_HOST_MAX], job[KOLO_RDZV_ID_MAX], key[64], *body;
	size_t len;
	struct kolo_flight_identity id;
	identity(&id, gen, reason, host, job);
	char *peers = kolo_runtime_diag_peers_json(D.rdzv);
	id.peers = peers;
	kolo_status_t st =
	        id.rank < 0 ? KOLO_EINVAL : kolo_flight_render(&id, DIAG_ENTRIES, &body, &len);
	free(peers);
	if (st != KOLO_OK)
		return;
	snprintf(key, sizeof(key), "diag/report/%d", id.rank);
	if (kolo_rdzv_kv_put(D.rdzv, key, body, len) != KOLO_OK)
		KOLO_DEBUG(SUBSYS, "report to the rendezvous: %s", kolo_rdzv_client_error(D.rdzv));
	free(body);
}

/* Waits up to poll_ms for request gen (true: it exists), or for the pipe
 * when there is no rendezvous. */
static bool wait_request(uint64_t gen, int poll_ms)
{
	if (!D.rdzv) {
		struct pollfd p = {.fd = D.pipe[0], .events = POLLIN};
		poll(&p, 1, poll_ms);
		return false;
	}
	char key[64];
	snprintf(key, sizeof(key), "diag/request/%" PRIu64, gen);
	void *data = NULL;
	size_t len = 0;
	uint64_t t0 = kolo_now_ns();
	kolo_status_t st = kolo_rdzv_kv_get(D.rdzv, key, poll_ms, &data, &len);
	free(data);
	/* An unreachable server fails at once: pace the loop anyway. */
	uint64_t spent_ms = (kolo_now_ns() - t0) / 1000000u;
	if (st != KOLO_OK && st != KOLO_ENOTFOUND && spent_ms < (uint64_t)poll_ms) {
		struct pollfd p = {.fd = D.pipe[0], .events = POLLIN};
		poll(&p, 1, (int)((uint64_t)poll_ms - spent_ms));
	}
	return st == KOLO_OK;
}

/* Makes request gen: a stalled worker asks every worker of the job for its
 * report, so that a rank with nothing open (blocked outside kolo) answers. */
static void ask_everyone(uint64_t gen)
{
	char key[64], val[96];
	snprintf(key, sizeof(key), "diag/request/%" PRIu64, gen);
	int n = snprintf(val, sizeof(val), "{\"request\":%" PRIu64 ",\"time_ms\":%" PRIu64 "}", gen,
	                 kolo_wall_us() / 1000);
	if (kolo_rdzv_kv_put(D.rdzv, key, val, (size_t)n) != KOLO_OK)
		KOLO_DEBUG(SUBSYS, "request to the rendezvous: %s", kolo_rdzv_client_error(D.rdzv));
}

/* Rank 0, every KOLO_STRAGGLER_LOG_S: one line when one rank of the job's
 * comm submitted last in at least half of the window's collectives. */
static void log_straggler(uint64_t now, uint64_t *next)
{
	int64_t every = kolo_param_int(KOLO_P_STRAGGLER_LOG_S);
	pthread_mutex_lock(&D.lock);
	bool mine = D.rank == 0;
	pthread_mutex_unlock(&D.lock);
	if (every <= 0 || !mine || now < *next)
		return;
	*next = now + (uint64_t)every * 1000000000ull;
	struct kolo_flight_lag l;
	if (kolo_flight_slowest(NULL, &l) && l.ops >= 32 && 2 * l.last >= l.ops && l.p50_ms >= 1.0)
		KOLO_WARN(SUBSYS,
		          "straggler: rank %d submitted last in %d of the last %d collectives, "
		          "%.1f ms after the first on median (p90 %.1f ms, max %.1f ms)",
		          l.rank, l.last, l.ops, l.p50_ms, l.p90_ms, l.max_ms);
}

static void *diag_main(void *arg)
{
	(void)arg;
	uint64_t gen = 1, last_report = 0, next_log = 0;
	bool stalled = false;
	double threshold_s = (double)kolo_param_int(KOLO_P_DIAG_THRESHOLD_MS) / 1000.0;
	while (!atomic_load(&D.stop)) {
		/* Soon after a new identity: this process's pid is published
		 * within DIAG_PUBLISH_MS, before it can be stopped. */
		bool asked = wait_request(gen, D.rdzv && !kolo_runtime_diag_peers_publish(D.rdzv)
		                                       ? DIAG_PUBLISH_MS
		                                       : DIAG_POLL_MS);
		char b[16];
		ssize_t n = read(D.pipe[0], b, sizeof(b));
		if (n > 0 && memchr(b, 1, (size_t)n)) /* 1: SIGUSR1; 0: the stop's wake-up */
			dump_file("SIGUSR1");
		uint64_t now = kolo_now_ns();
		log_straggler(now, &next_log);
		if (!D.rdzv || atomic_load(&D.stop))
			continue;
		if (asked) {
			report(gen++, "request");
			last_report = now;
			continue;
		}
		bool was = stalled;
		stalled = threshold_s > 0 && kolo_flight_oldest_open_s() >= threshold_s;
		if (stalled && !was)
			ask_everyone(gen);
		if (stalled && now - last_report >= DIAG_REPORT_MS * 1000000ull) {
			report(gen - 1, "stall");
			last_report = now;
		}
	}
	return NULL;
}

static bool cancelled(void *arg)
{
	(void)arg;
	return atomic_load(&D.stop);
}

static void install_usr1(void)
{
	struct sigaction sa = {0};
	sa.sa_handler = on_usr1;
	sigemptyset(&sa.sa_mask);
	sa.sa_flags = SA_RESTART;
	struct sigaction cur;
	if (sigaction(SIGUSR1, NULL, &cur) != 0)
		return;
	/* The application's own handler stays. */
	if (cur.sa_handler != SIG_DFL && cur.sa_handler != SIG_IGN)
		return;
	D.sig_installed = sigaction(SIGUSR1, &sa, &D.old_usr1) == 0;
}

static kolo_status_t start(const struct kolo_comm *comm)
{
	if (pipe(D.pipe) != 0)
		return KOLO_ESYSTEM;
	for (int i = 0; i < 2; i++)
		fcntl(D.pipe[i], F_SETFL, fcntl(D.pipe[i], F_GETFL) | O_NONBLOCK);
	const char *url = kolo_param_str(KOLO_P_RENDEZVOUS);
	if (comm->rdzv && url[0]) {
		struct kolo_rdzv_client_config cc = {.url = url,
		                                     .job = comm->job,
		                                     .token = comm->token,
		                                     .host = comm->host,
		                                     .deadline_ms = DIAG_DEADLINE};
		struct kolo_errbuf eb = {{0}};
		if (kolo_rdzv_client_create(&cc, &D.rdzv, &eb) == KOLO_OK)
			kolo_rdzv_set_cancel(D.rdzv, cancelled, NULL);
		else
			KOLO_WARN(SUBSYS, "no diagnosis reports: %s", eb.msg);
	}
	atomic_store(&D.stop, false);
	if (pthread_create(&D.thread, NULL, diag_main, NULL) != 0) {
		kolo_rdzv_client_destroy(D.rdzv);
		D.rdzv = NULL;
		close(D.pipe[0]);
		close(D.pipe[1]);
		D.pipe[0] = D.pipe[1] = -1;
		return KOLO_ESYSTEM;
	}
	install_usr1();
	D.pid = getpid();
	return KOLO_OK;
}

void kolo_runtime_diag_identity(const struct kolo_comm *comm)
{
	pthread_mutex_lock(&D.lock);
	if (D.owner == comm) {
		const struct kolo_rdzv_assignment *a = &comm->assignment;
		D.rank = a->rank;
		D.size = a->size;
		D.round = a->round;
		snprintf(D.host, sizeof(D.host), "%s", comm->host);
		snprintf(D.job, sizeof(D.job), "%s", comm->job);
		kolo_runtime_diag_peers_set(comm);
	}
	pthread_mutex_unlock(&D.lock);
}

void kolo_runtime_diag_start(struct kolo_comm *comm)
{
	if (comm->diag || !comm->flight)
		return;
	pthread_mutex_lock(&D.lock);
	if (D.refs > 0 && D.pid != getpid()) /* a child forked with comms alive */
		D.refs = 0;
	bool ok = D.refs > 0 || start(comm) == KOLO_OK;
	if (ok && D.refs++ == 0)
		D.owner = comm;
	pthread_mutex_unlock(&D.lock);
	comm->diag = ok;
	kolo_runtime_diag_identity(comm);
}

void kolo_runtime_diag_stop(struct kolo_comm *comm)
{
	if (!comm->diag)
		return;
	comm->diag = false;
	pthread_mutex_lock(&D.lock);
	if (D.owner == comm)
		D.owner = NULL;
	bool last = --D.refs == 0 && D.pid == getpid();
	if (last) {
		atomic_store(&D.stop, true);
		char b = 0;
		if (write(D.pipe[1], &b, 1) < 0) {
			/* the pipe is full: the thread wakes anyway */
		}
	}
	pthread_mutex_unlock(&D.lock);
	if (!last)
		return;
	pthread_join(D.thread, NULL);
	if (D.sig_installed)
		sigaction(SIGUSR1, &D.old_usr1, NULL);
	D.sig_installed = false;
	kolo_rdzv_client_destroy(D.rdzv);
	D.rdzv = NULL;
	close(D.pipe[0]);
	close(D.pipe[1]);
	D.pipe[0] = D.pipe[1] = -1;
}
