/* Failure arbitration, SIGTERM and the membership watcher. */
#include "membership.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define SUBSYS "elastic"

/* ---- arbitration -------------------------------------------------------- */

void kolo_elastic_key_alive(char *out, size_t size, int64_t round, int rank)
{
	snprintf(out, size, "elastic/%" PRId64 "/alive/%d", round, rank);
}

void kolo_elastic_key_change(char *out, size_t size, int64_t round)
{
	snprintf(out, size, "elastic/%" PRId64 "/change", round);
}

kolo_status_t kolo_elastic_announce(struct kolo_rdzv_client *c, int64_t round, int rank,
                                    bool change)
{
	char key[96];
	kolo_elastic_key_alive(key, sizeof(key), round, rank);
	kolo_status_t st = kolo_rdzv_kv_put(c, key, "1", 1);
	if (st == KOLO_OK && change) {
		kolo_elastic_key_change(key, sizeof(key), round);
		st = kolo_rdzv_kv_put(c, key, "1", 1);
	}
	if (st != KOLO_OK)
		KOLO_WARN(SUBSYS, "round %" PRId64 ": cannot publish %s: %s", round, key,
		          kolo_rdzv_client_error(c));
	return st;
}

kolo_status_t kolo_elastic_confirm_dead(struct kolo_rdzv_client *c, int64_t round, int suspect,
                                        int confirm_ms, bool *dead)
{
	char key[96];
	void *data = NULL;
	size_t len = 0;
	*dead = false;
	kolo_elastic_key_alive(key, sizeof(key), round, suspect);
	kolo_status_t st = kolo_rdzv_kv_get(c, key, confirm_ms, &data, &len);
	free(data);
	if (st == KOLO_ENOTFOUND) {
		*dead = true;
		return KOLO_OK;
	}
	return st;
}

/* ---- SIGTERM ---------------------------------------------------------- */

static atomic_int leave_flag;
static int sig_pipe[2] = {-1, -1};
static pthread_once_t sig_once = PTHREAD_ONCE_INIT;
static kolo_status_t sig_status = KOLO_OK;

static void on_sigterm(int sig)
{
	(void)sig;
	kolo_elastic_request_leave();
}

static void sig_setup(void)
{
	if (pipe2(sig_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
		sig_status = KOLO_ESYSTEM;
		return;
	}
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_sigterm;
	sigemptyset(&sa.sa_mask);
	sa.sa_flags = SA_RESTART;
	if (sigaction(SIGTERM, &sa, NULL) != 0)
		sig_status = KOLO_ESYSTEM;
}

kolo_status_t kolo_elastic_signal_install(void)
{
	pthread_once(&sig_once, sig_setup);
	return sig_status;
}

void kolo_elastic_request_leave(void)
{
	int saved = errno;
	atomic_store(&leave_flag, 1);
	if (sig_pipe[1] >= 0) {
		ssize_t n = write(sig_pipe[1], "t", 1);
		(void)n; /* a full pipe already says it */
	}
	errno = saved;
}

bool kolo_elastic_leave_requested(void)
{
	return atomic_load(&leave_flag) != 0;
}

bool kolo_elastic_leave_cancels(void *arg)
{
	(void)arg;
	return kolo_elastic_leave_requested();
}

void kolo_elastic_leave_clear(void)
{
	atomic_store(&leave_flag, 0);
}

/* ---- the watcher -------------------------------------------------------- */

struct kolo_elastic {
	struct kolo_elastic_config cfg;
	struct kolo_rdzv_client *client; /* the watcher thread's own */
	pthread_t thread;
	bool started;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool stop;
	int64_t round; /* watched round; 0 paused */
	int rank;
	int64_t fired;     /* last round the change callback ran for */
	uint64_t fired_ms; /* when */
	bool left;         /* left at a commit point */
	bool leave_done;   /* forced leave done */
	bool dropping;     /* taking the worker out (hang), outside the lock */
	bool dropped;      /* taken out; kolo_elastic_take_dropped() reads it */
};

static void drain_pipe(void)
{
	char buf[64];
	while (sig_pipe[0] >= 0 && read(sig_pipe[0], buf, sizeof(buf)) > 0) {
	}
}

static void fire(struct kolo_elastic *e, int64_t round, int rank, bool leave, const char *why)
{
	pthread_mutex_lock(&e->lock);
	bool skip = (!leave && e->fired >= round) || e->round != round;
	if (!skip) {
		e->fired = round; /* once per round (a forced leave ends it too) */
		e->fired_ms = kolo_now_ms();
	}
	pthread_mutex_unlock(&e->lock);
	if (skip)
		return;
	KOLO_INFO(SUBSYS, "round %" PRId64 ": %s", round, why);
	/* Alive first: a peer that sees our conns reset must not report us. A
	 * leaving worker says the round is over but not that it stays. */
	if (leave) {
		char key[96];
		kolo_elastic_key_change(key, sizeof(key), round);
		kolo_rdzv_kv_put(e->client, key, "1", 1);
	} else {
		kolo_elastic_announce(e->client, round, rank, false);
	}
	e->cfg.on_change(e->cfg.arg, round, leave);
}

/* Called with e->lock held, after the change callback ran for the watched
 * round. Its collectives were aborted then, so the training thread should
 * have paused the watch in kolo_reform() within moments. When it has not
 * for hang_ms, it is stuck outside kolo (a deadlock, a step that never
 * ends): its watcher and heartbeat would keep it "alive" and the others
 * would wait for it until KOLO_ELASTIC_TIMEOUT_MS. Take it out of the job
 * instead; if the thread ever reaches kolo_reform(), it joins again. */
static void check_hang(struct kolo_elastic *e, int64_t round)
{
	if (e->cfg.hang_ms <= 0 || e->left || e->dropped || e->fired != round ||
	    kolo_now_ms() - e->fired_ms < (uint64_t)e->cfg.hang_ms)
		return;
	e->dropping = true;
	pthread_mutex_unlock(&e->lock);
	KOLO_ERROR(SUBSYS,
	           "round %" PRId64 " ended %d ms ago and this worker's training thread has not "
	           "re-formed (it is stuck outside kolo): leaving the job so that the others go "
	           "on (KOLO_ELASTIC_HANG_MS)",
	           round, e->cfg.hang_ms);
	if (kolo_rdzv_leave(e->cfg.member) != KOLO_OK)
		KOLO_WARN(SUBSYS, "leave: %s", kolo_rdzv_client_error(e->cfg.member));
	pthread_mutex_lock(&e->lock);
	e->dropping = false;
	e->dropped = true;
	pthread_cond_broadcast(&e->cond);
}

static void *watch_main(void *arg)
{
	struct kolo_elastic *e = arg;
	uint64_t leave_at = 0;
	pthread_mutex_lock(&e->lock);
	while (!e->stop) {
		int64_t round = e->round;
		int rank = e->rank;
		bool left = e->left, leave_done = e->leave_done;
		if (round > 0 && e->fired >= round)
			check_hang(e, round);
		if (round <= 0 || e->fired >= round) {
			struct timespec dl;
			kolo_deadline_ts(&dl, CLOCK_MONOTONIC, e->cfg.poll_ms);
			pthread_cond_timedwait(&e->cond, &e->lock, &dl);
			pthread_mutex_unlock(&e->lock);
			drain_pipe();
			pthread_mutex_lock(&e->lock);
			continue;
		}
		pthread_mutex_unlock(&e->lock);
		drain_pipe();
		if (kolo_elastic_leave_requested() && !left && !leave_done) {
			uint64_t now = kolo_now_ms();
			if (!leave_at) {
				leave_at = now + (uint64_t)e->cfg.leave_grace_ms;
				KOLO_INFO(
				        SUBSYS,
				        "asked to leave (SIGTERM, kolo_elastic_leave or a "
				        "preemption notice): leaving at the next commit point (at "
				        "most %d ms)",
				        e->cfg.leave_grace_ms);
			} else if (now >= leave_at) {
				pthread_mutex_lock(&e->lock);
				e->leave_done = true;
				pthread_mutex_unlock(&e->lock);
				fire(e, round, rank, true, "no commit point came: leaving now");
			}
		}
		char key[96];
		kolo_elastic_key_change(key, sizeof(key), round);
		void *data = NULL;
		size_t len = 0;
		int slice = e->cfg.poll_ms;
		if (leave_at && !leave_done)
			slice = KOLO_MIN(slice, 50);
		kolo_status_t st = kolo_rdzv_kv_get(e->client, key, slice, &data, &len);
		free(data);
		if (st == KOLO_OK) {
			fire(e, round, rank, false,
			     "membership changed (a peer saw the round end)");
		} else {
			struct kolo_rdzv_hb_state hb;
			kolo_rdzv_heartbeat_state(e->cfg.member, &hb);
			if (hb.evicted)
				fire(e, round, rank, false, "this worker was evicted");
			else if (hb.last == KOLO_OK && hb.round > round)
				fire(e, round, rank, false, "the rendezvous formed a newer round");
			else if (st != KOLO_ENOTFOUND)
				kolo_sleep_ms((uint64_t)KOLO_MIN(slice, 100));
		}
		pthread_mutex_lock(&e->lock);
	}
	pthread_mutex_unlock(&e->lock);
	return NULL;
}

kolo_status_t kolo_elastic_create(const struct kolo_elastic_config *cfg, struct kolo_elastic **out,
                                  struct kolo_errbuf *eb)
{
	*out = NULL;
	if (!cfg || !cfg->member || !cfg->on_change)
		return kolo_fail(eb, KOLO_EINVAL, "elastic: invalid configuration");
	struct kolo_elastic *e = calloc(1, sizeof(*e));
	if (!e)
		return kolo_fail(eb, KOLO_ENOMEM, "elastic: out of memory");
	e->cfg = *cfg;
	if (e->cfg.poll_ms <= 0)
		e->cfg.poll_ms = 250;
	if (e->cfg.leave_grace_ms < 0)
		e->cfg.leave_grace_ms = 0;
	pthread_mutex_init(&e->lock, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&e->cond, &ca);
	pthread_condattr_destroy(&ca);
	/* Short retry budget: the watcher must stay responsive while the
	 * server restarts; it simply tries again next slice. */
	struct kolo_rdzv_client_config cc = {
	        .url = cfg->url,
	        .job = cfg->job,
	        .token = cfg->token,
	        .host = cfg->host,
	        .deadline_ms = 1000,
	};
	kolo_status_t st = kolo_rdzv_client_create(&cc, &e->client, eb);
	if (st != KOLO_OK)
		goto fail;
	if (pthread_create(&e->thread, NULL, watch_main, e) != 0) {
		st = kolo_fail(eb, KOLO_ESYSTEM, "elastic: cannot start the watcher");
		goto fail;
	}
	e->started = true;
	*out = e;
	return KOLO_OK;
fail:
	kolo_elastic_destroy(e);
	return st;
}

void kolo_elastic_destroy(struct kolo_elastic *e)
{
	if (!e)
		return;
	if (e->started) {
		pthread_mutex_lock(&e->lock);
		e->stop = true;
		pthread_cond_broadcast(&e->cond);
		pthread_mutex_unlock(&e->lock);
		pthread_join(e->thread, NULL);
	}
	kolo_rdzv_client_destroy(e->client);
	pthread_cond_destroy(&e->cond);
	pthread_mutex_destroy(&e->lock);
	free(e);
}

void kolo_elastic_watch(struct kolo_elastic *e, int64_t round, int rank)
{
	pthread_mutex_lock(&e->lock);
	while (e->dropping) /* a leave in flight finishes first */
		pthread_cond_wait(&e->cond, &e->lock);
	e->round = round;
	e->rank = rank;
	pthread_cond_broadcast(&e->cond);
	pthread_mutex_unlock(&e->lock);
}

bool kolo_elastic_take_dropped(struct kolo_elastic *e)
{
	pthread_mutex_lock(&e->lock);
	while (e->dropping)
		pthread_cond_wait(&e->cond, &e->lock);
	bool d = e->dropped;
	e->dropped = false;
	pthread_mutex_unlock(&e->lock);
	return d;
}

void kolo_elastic_left(struct kolo_elastic *e)
{
	pthread_mutex_lock(&e->lock);
	e->left = true;
	e->round = 0;
	pthread_mutex_unlock(&e->lock);
}
