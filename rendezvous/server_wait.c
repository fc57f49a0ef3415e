/* server_wait: the long-poll registry. An assignment poll or a KV get with
 * a timeout is held in its job's list until a change answers it, its
 * deadline passes or its client goes away; its reply is prepared here and
 * sent when libmicrohttpd re-enters the request (server_http.c). Everything
 * here runs with the server's lock held. */
#include "server_internal.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>

void rdzv_wait_hold(struct kolo_rdzv_server *s, struct rdzv_req *r, struct rdzv_job *j,
                    enum rdzv_wait_kind kind, uint64_t deadline)
{
	r->wkind = kind;
	r->job = j;
	r->deadline = deadline;
	r->wprev = NULL;
	r->wnext = j->waiters;
	if (j->waiters)
		j->waiters->wprev = r;
	j->waiters = r;
	s->n_polls++;
	rdzv_http_suspend(r);
	rdzv_timer_poke(s, deadline);
}

void rdzv_wait_unlink(struct rdzv_req *r)
{
	if (r->wkind == RDZV_WAIT_NONE)
		return;
	struct kolo_rdzv_server *s = r->s;
	if (r->wprev)
		r->wprev->wnext = r->wnext;
	else
		r->job->waiters = r->wnext;
	if (r->wnext)
		r->wnext->wprev = r->wprev;
	r->wprev = r->wnext = NULL;
	if (r->wkind == RDZV_WAIT_ASSIGN && r->worker) {
		/* A held poll kept the lease alive; it runs again from now. */
		r->worker->n_polls--;
		r->worker->lease_deadline = kolo_now_ms() + (uint64_t)s->st.cfg.lease_ms;
		rdzv_timer_poke(s, r->worker->lease_deadline);
	}
	r->wkind = RDZV_WAIT_NONE;
	r->worker = NULL;
	s->n_polls--;
}

void rdzv_wait_wake(struct rdzv_req *r, struct rdzv_reply rep)
{
	rdzv_wait_unlink(r);
	r->ready = true;
	r->reply = rep;
	rdzv_http_resume(r);
}

static void wake_error(struct rdzv_req *r, int code, const char *msg)
{
	rdzv_wait_wake(r, rdzv_reply_error(code, "%s", msg));
}

void rdzv_wait_wake_assignments(struct rdzv_job *j)
{
	for (struct rdzv_req *r = j->waiters, *nx; r; r = nx) {
		nx = r->wnext;
		if (r->wkind != RDZV_WAIT_ASSIGN ||
		    !rdzv_job_assignment_ready(j, r->worker, r->after_round))
			continue;
		size_t len = 0;
		char *b = rdzv_job_assignment_body(j, r->worker, &len);
		if (b)
			rdzv_wait_wake(r, rdzv_reply_body(200, b, len, RDZV_BODY_JSON));
		else
			wake_error(r, 500, "out of memory");
	}
}

void rdzv_wait_evict(struct rdzv_job *j, const struct rdzv_worker *w, const char *msg)
{
	for (struct rdzv_req *r = j->waiters, *nx; r; r = nx) {
		nx = r->wnext;
		if (r->wkind == RDZV_WAIT_ASSIGN && r->worker == w)
			wake_error(r, 410, msg);
	}
}

void rdzv_wait_finish_all(struct rdzv_job *j)
{
	for (struct rdzv_req *r = j->waiters, *nx; r; r = nx) {
		nx = r->wnext;
		if (r->wkind == RDZV_WAIT_ASSIGN)
			wake_error(r, 410, j->finished_text);
	}
}

void rdzv_wait_wake_kv(struct rdzv_job *j, const char *key, const struct rdzv_kv_val *v)
{
	for (struct rdzv_req *r = j->waiters, *nx; r; r = nx) {
		nx = r->wnext;
		if (r->wkind != RDZV_WAIT_KV || strcmp(r->key, key) != 0)
			continue;
		char *b = rdzv_kv_copy(v);
		if (b)
			rdzv_wait_wake(r, rdzv_reply_body(200, b, v->len, RDZV_BODY_BINARY));
		else
			wake_error(r, 500, "out of memory");
	}
}

/* Whether the peer of a held socket closed it or it failed. */
static bool client_gone(int fd)
{
	char c;
	ssize_t got = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
	return got == 0 || (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

uint64_t rdzv_wait_expire(struct rdzv_job *j, uint64_t now, bool check_sockets)
{
	uint64_t next = UINT64_MAX;
	for (struct rdzv_req *r = j->waiters, *nx; r; r = nx) {
		nx = r->wnext;
		if (r->deadline <= now) {
			if (r->wkind == RDZV_WAIT_ASSIGN)
				rdzv_wait_wake(r, rdzv_reply_body(204, NULL, 0, RDZV_BODY_JSON));
			else
				wake_error(r, 404, "no such key (timed out waiting)");
			continue;
		}
		if (check_sockets && r->fd >= 0 && client_gone(r->fd)) {
			r->gone = true;
			rdzv_wait_wake(r, rdzv_reply_body(0, NULL, 0, RDZV_BODY_JSON));
			continue;
		}
		next = KOLO_MIN(next, r->deadline);
	}
	return next;
}

void rdzv_wait_close_all(struct kolo_rdzv_server *s)
{
	KOLO_STRMAP_FOREACH(&s->st.jobs, e)
	{
		struct rdzv_job *j = e->val;
		while (j->waiters)
			wake_error(j->waiters, 503, "server shutting down");
	}
}
