/* server: the rendezvous server's lifecycle and its timer. One mutex guards
 * all state (server_internal.h). Two threads of ours: the HTTP thread runs
 * libmicrohttpd (server_http.c), and the timer drives settle periods, lease
 * expiry, poll deadlines, disconnect detection and progress logs, as the
 * phases of timer_pass. Requests that change a job wake the timer when they
 * bring a deadline forward. docs/rendezvous.md is the contract. */
#include "server_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#define TIMER_MAX_SLEEP_MS 60000 /* a pass at least this often, with nothing due */

void rdzv_timer_poke(struct kolo_rdzv_server *s, uint64_t deadline)
{
	if (deadline < s->timer_next)
		pthread_cond_signal(&s->cond);
}

/* One pass over every job; returns when the next is due. With lock held. */
static uint64_t timer_pass(struct kolo_rdzv_server *s, uint64_t now)
{
	uint64_t next = now + TIMER_MAX_SLEEP_MS;
	bool check_sockets = now >= s->last_liveness + RDZV_LIVENESS_MS;
	if (check_sockets)
		s->last_liveness = now;
	rdzv_job_sweep(&s->st, now);
	KOLO_STRMAP_FOREACH(&s->st.jobs, e)
	{
		struct rdzv_job *j = e->val;
		next = KOLO_MIN(next, rdzv_job_retain_deadline(&s->st, j));
		next = KOLO_MIN(next, rdzv_job_expire_leases(j, now));
		rdzv_job_tick(&s->st, j, now);
		next = KOLO_MIN(next, rdzv_job_settle_deadline(j));
		next = KOLO_MIN(next, rdzv_wait_expire(j, now, check_sockets));
		if (j->waiters)
			next = KOLO_MIN(next, s->last_liveness + RDZV_LIVENESS_MS);
		next = KOLO_MIN(next, rdzv_job_log_waiting(j, now));
	}
	return next;
}

static void *timer_main(void *arg)
{
	struct kolo_rdzv_server *s = arg;
	pthread_mutex_lock(&s->lock);
	while (!s->stopping) {
		uint64_t now = kolo_now_ms();
		uint64_t next = timer_pass(s, now);
		if (next <= now)
			continue;
		s->timer_next = next;
		/* The cond uses CLOCK_MONOTONIC (see kolo_rdzv_server_start). */
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		uint64_t wait_ms = next - now;
		ts.tv_sec += (time_t)(wait_ms / 1000);
		ts.tv_nsec += (long)(wait_ms % 1000) * 1000000L;
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
		pthread_cond_timedwait(&s->cond, &s->lock, &ts);
		s->timer_next = 0;
	}
	pthread_mutex_unlock(&s->lock);
	return NULL;
}

/* Sentinels, the lock and the conds of a new server. */
static void server_init(struct kolo_rdzv_server *s, const struct kolo_rdzv_server_config *cfg)
{
	s->st.cfg = *cfg;
	s->st.cfg.listen = NULL;
	s->st.cfg.token = NULL;
	if (s->st.cfg.lease_ms <= 0)
		s->st.cfg.lease_ms = (int)strtol(kolo_param_info(KOLO_P_LEASE_MS)->def, NULL, 10);
	s->listen_fd = -1;
	s->wake_fd = -1;
	atomic_init(&s->http_stop, false);
	pthread_mutex_init(&s->lock, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&s->cond, &ca);
	pthread_cond_init(&s->idle_cond, &ca);
	pthread_condattr_destroy(&ca);
}

kolo_status_t kolo_rdzv_server_start(const struct kolo_rdzv_server_config *cfg,
                                     struct kolo_rdzv_server **out, struct kolo_errbuf *eb)
{
	*out = NULL;
	struct kolo_rdzv_server *s = calloc(1, sizeof(*s));
	if (!s)
		return kolo_fail(eb, KOLO_ENOMEM, "out of memory");
	server_init(s, cfg);
	kolo_status_t st;
	if (cfg->token && cfg->token[0] && !(s->token = strdup(cfg->token))) {
		st = kolo_fail(eb, KOLO_ENOMEM, "out of memory");
		goto fail;
	}
	s->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (s->wake_fd < 0) {
		st = kolo_fail(eb, KOLO_ESYSTEM, "eventfd: %s", strerror(errno));
		goto fail;
	}
	const char *listen =
	        cfg->listen && *cfg->listen ? cfg->listen : kolo_param_info(KOLO_P_LISTEN)->def;
	st = rdzv_listen_open(listen, &s->listen_fd, &s->port, eb);
	if (st != KOLO_OK)
		goto fail;
	st = rdzv_http_start(s, eb);
	if (st != KOLO_OK)
		goto fail;
	if (pthread_create(&s->timer, NULL, timer_main, s) != 0) {
		st = kolo_fail(eb, KOLO_ESYSTEM, "cannot start the timer thread");
		goto fail;
	}
	s->timer_started = true;
	KOLO_INFO(RDZV_SUB,
	          "serving on port %d (auth %s; defaults min_np=%d max_np=%d settle_ms=%d "
	          "lease_ms=%d)",
	          s->port, s->token ? "on" : "off", cfg->min_np, cfg->max_np, cfg->settle_ms,
	          s->st.cfg.lease_ms);
	*out = s;
	return KOLO_OK;
fail:
	kolo_rdzv_server_stop(s);
	return st;
}

int kolo_rdzv_server_port(const struct kolo_rdzv_server *s)
{
	return s ? s->port : -1;
}

void kolo_rdzv_server_stop(struct kolo_rdzv_server *s)
{
	if (!s)
		return;
	pthread_mutex_lock(&s->lock);
	s->stopping = true;
	rdzv_wait_close_all(s);
	pthread_cond_broadcast(&s->cond);
	pthread_mutex_unlock(&s->lock);
	if (s->timer_started)
		pthread_join(s->timer, NULL);
	rdzv_http_stop(s);
	if (s->listen_fd >= 0)
		close(s->listen_fd);
	if (s->wake_fd >= 0)
		close(s->wake_fd);
	kolo_strmap_fini(&s->st.jobs, rdzv_job_free);
	free(s->token);
	pthread_cond_destroy(&s->cond);
	pthread_cond_destroy(&s->idle_cond);
	pthread_mutex_destroy(&s->lock);
	free(s);
}
