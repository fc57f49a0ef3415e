/* server_http: everything libmicrohttpd. Reading requests (headers, token,
 * body), routing them, taking the server's lock once around the handler
 * (server_api.c) and sending its reply after; suspending and resuming held
 * polls; the daemon's thread. */
#include "server_internal.h"

#include "bytes.h"

#include <errno.h>
#include <limits.h>
#include <microhttpd.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define CONNECTION_LIMIT 16384 /* each held long poll is one */
#define IDLE_TIMEOUT_S   120   /* idle keep-alive connections; held polls are exempt */
#define DISCARD_MAX      ((size_t)64 * 1024 * 1024)
#define BODY_FIRST_CAP   1024

/* ---- replies ------------------------------------------------------------ */

static const char *content_type(enum rdzv_body_type type)
{
	switch (type) {
	case RDZV_BODY_BINARY:
		return "application/octet-stream";
	case RDZV_BODY_PROMETHEUS:
		return "text/plain; version=0.0.4; charset=utf-8";
	default:
		return "application/json";
	}
}

static const char *allowed_methods(enum rdzv_endpoint ep)
{
	static const char *const allow[RDZV_EP_COUNT] = {
	        [RDZV_EP_HEALTHZ] = "GET",
	        [RDZV_EP_METRICS] = "GET",
	        [RDZV_EP_JOB] = "GET, PUT",
	        [RDZV_EP_WORKERS] = "POST",
	        [RDZV_EP_WORKER] = "DELETE",
	        [RDZV_EP_ASSIGNMENT] = "GET",
	        [RDZV_EP_HEARTBEAT] = "POST",
	        [RDZV_EP_FAILURES] = "POST",
	        [RDZV_EP_KV] = "GET, PUT, POST, DELETE",
	        [RDZV_EP_KV_STORE] = "GET",
	        [RDZV_EP_DIAGNOSIS] = "GET, POST",
	        [RDZV_EP_OTHER] = "",
	};
	return allow[ep];
}

/* Queues rep (its body is taken) and counts it. Without the lock. */
static enum MHD_Result send_reply(struct rdzv_req *r, struct rdzv_reply rep)
{
	if (rep.abort) {
		free(rep.body);
		return MHD_NO;
	}
	struct MHD_Response *resp = MHD_create_response_from_buffer(
	        rep.len, rep.body ? rep.body : (char *)"",
	        rep.body ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
	if (!resp) {
		free(rep.body);
		return MHD_NO;
	}
	if (rep.len > 0 || rep.code != 204)
		MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type(rep.type));
	if (rep.code == 401)
		MHD_add_response_header(resp, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
	if (rep.code == 405)
		MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, allowed_methods(r->ep));
	if (rep.code == 503)
		MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
	enum MHD_Result ret = MHD_queue_response(r->conn, (unsigned)rep.code, resp);
	MHD_destroy_response(resp);
	/* /metrics has no label of its own for the diagnosis: it counts as "job". */
	rdzv_metrics_count(r->s, r->ep == RDZV_EP_DIAGNOSIS ? RDZV_EP_JOB : r->ep, rep.code);
	return ret;
}

/* ---- routing ------------------------------------------------------------ */

/* Copies the segment at *p up to '/' (or to the end when rest) into out. */
static bool take_segment(const char **p, char *out, size_t size, bool rest)
{
	const char *e = rest ? *p + strlen(*p) : strchr(*p, '/');
	if (!e)
		e = *p + strlen(*p);
	size_t n = (size_t)(e - *p);
	bool ok = n > 0 && n < size;
	if (ok) {
		memcpy(out, *p, n);
		out[n] = '\0';
	} else {
		out[0] = '\0';
	}
	*p = e;
	return ok;
}

/* The part after /v1/jobs/{job}/. */
static void route_job_path(const char *p, struct rdzv_route *rt)
{
	if (strcmp(p, "workers") == 0) {
		rt->ep = RDZV_EP_WORKERS;
	} else if (strcmp(p, "failures") == 0) {
		rt->ep = RDZV_EP_FAILURES;
	} else if (strcmp(p, "diagnosis") == 0) {
		rt->ep = RDZV_EP_DIAGNOSIS;
	} else if (strncmp(p, "workers/", 8) == 0) {
		p += 8;
		rt->bad_id = !take_segment(&p, rt->id, sizeof(rt->id), false) ||
		             !kolo_rdzv_valid_id(rt->id, false);
		if (*p == '\0')
			rt->ep = RDZV_EP_WORKER;
		else if (strcmp(p, "/assignment") == 0)
			rt->ep = RDZV_EP_ASSIGNMENT;
		else if (strcmp(p, "/heartbeat") == 0)
			rt->ep = RDZV_EP_HEARTBEAT;
	} else if (strcmp(p, "kv") == 0) {
		rt->ep = RDZV_EP_KV_STORE;
	} else if (strncmp(p, "kv/", 3) == 0) {
		p += 3;
		rt->ep = RDZV_EP_KV;
		rt->bad_id = !take_segment(&p, rt->id, sizeof(rt->id), true) ||
		             !kolo_rdzv_valid_id(rt->id, true);
	}
}

void rdzv_http_route(const char *url, struct rdzv_route *rt)
{
	memset(rt, 0, sizeof(*rt));
	rt->ep = RDZV_EP_OTHER;
	if (strcmp(url, "/healthz") == 0) {
		rt->ep = RDZV_EP_HEALTHZ;
		return;
	}
	if (strcmp(url, "/metrics") == 0) {
		rt->ep = RDZV_EP_METRICS;
		return;
	}
	rt->v1 = strncmp(url, "/v1/", 4) == 0 || strcmp(url, "/v1") == 0;
	if (strncmp(url, "/v1/jobs/", 9) != 0)
		return;
	const char *p = url + 9;
	rt->bad_job = !take_segment(&p, rt->job, sizeof(rt->job), false) ||
	              !kolo_rdzv_valid_id(rt->job, false);
	if (*p == '\0') {
		rt->ep = RDZV_EP_JOB;
		return;
	}
	route_job_path(p + 1 /* '/' */, rt);
}

static bool method_ok(enum rdzv_endpoint ep, const char *m)
{
	bool get = strcmp(m, "GET") == 0, put = strcmp(m, "PUT") == 0;
	bool post = strcmp(m, "POST") == 0, del = strcmp(m, "DELETE") == 0;
	switch (ep) {
	case RDZV_EP_HEALTHZ:
	case RDZV_EP_METRICS:
	case RDZV_EP_ASSIGNMENT:
	case RDZV_EP_KV_STORE:
		return get;
	case RDZV_EP_JOB:
		return get || put;
	case RDZV_EP_DIAGNOSIS:
		return get || post;
	case RDZV_EP_KV:
		return get || put || post || del;
	case RDZV_EP_WORKERS:
	case RDZV_EP_HEARTBEAT:
	case RDZV_EP_FAILURES:
		return post;
	case RDZV_EP_WORKER:
		return del;
	default:
		return false;
	}
}

/* The method of a request method_ok admitted. */
static enum rdzv_method method_of(const char *m)
{
	if (strcmp(m, "PUT") == 0)
		return RDZV_PUT;
	if (strcmp(m, "POST") == 0)
		return RDZV_POST;
	if (strcmp(m, "DELETE") == 0)
		return RDZV_DELETE;
	return RDZV_GET;
}

/* Parses v as a decimal integer in [lo, hi]. */
static bool parse_int(const char *v, int64_t lo, int64_t hi, int64_t *out)
{
	char *end;
	errno = 0;
	long long x = strtoll(v, &end, 10);
	if (errno || *end || end == v || x < lo || x > hi)
		return false;
	*out = x;
	return true;
}

/* Parses an optional integer query argument in [lo, hi]. */
static bool query_int(struct MHD_Connection *c, const char *name, int64_t def, int64_t lo,
                      int64_t hi, int64_t *out)
{
	const char *v = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, name);
	if (!v || !*v) {
		*out = def;
		return true;
	}
	return parse_int(v, lo, hi, out);
}

/* Whether the query names the argument, with a value or without ("?a&b"). */
static bool query_has(struct MHD_Connection *c, const char *name)
{
	const char *v;
	return MHD_lookup_connection_value_n(c, MHD_GET_ARGUMENT_KIND, name, strlen(name), &v,
	                                     NULL) == MHD_YES;
}

/* Parses a required integer query argument in [lo, hi]. */
static bool query_int_needed(struct MHD_Connection *c, const char *name, int64_t lo, int64_t hi,
                             int64_t *out)
{
	const char *v = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, name);
	return v && parse_int(v, lo, hi, out);
}

/* A KV POST's ?add=N or ?compare_set&expected_len=L (the handler says which
 * is wrong). */
static bool kv_post_query(struct MHD_Connection *conn, struct rdzv_call *c)
{
	c->add = query_has(conn, "add");
	c->compare_set = query_has(conn, "compare_set");
	if (c->add)
		return query_int_needed(conn, "add", INT64_MIN, INT64_MAX, &c->add_n);
	return query_int_needed(conn, "expected_len", 0, KOLO_RDZV_MAX_BODY, &c->expected_len);
}

/* The call a handler sees: the route, the body and the query arguments. */
static void call_prepare(const struct rdzv_req *r, const struct rdzv_route *rt,
                         enum rdzv_method method, struct rdzv_call *c)
{
	*c = (struct rdzv_call){
	        .rt = *rt, .method = method, .body = r->body, .len = r->len, .query_ok = true};
	if (rt->ep == RDZV_EP_ASSIGNMENT)
		c->query_ok = query_int(r->conn, "after_round", 0, 0, INT64_MAX, &c->after_round) &&
		              query_int(r->conn, "timeout_ms", RDZV_POLL_DEFAULT_MS, 0,
		                        RDZV_POLL_MAX_MS, &c->timeout_ms);
	else if (rt->ep == RDZV_EP_WORKER)
		c->query_ok = query_int(r->conn, "finished", 0, 0, 1, &c->finished);
	else if (rt->ep == RDZV_EP_KV && method == RDZV_GET)
		c->query_ok =
		        query_int(r->conn, "timeout_ms", 0, 0, RDZV_POLL_MAX_MS, &c->timeout_ms);
	else if (rt->ep == RDZV_EP_KV && method == RDZV_POST)
		c->query_ok = kv_post_query(r->conn, c);
	else if (rt->ep == RDZV_EP_DIAGNOSIS && method == RDZV_GET)
		c->query_ok = query_int(r->conn, "request", 0, 0, INT64_MAX, &c->diag_request) &&
		              query_int(r->conn, "min_ms", RDZV_DIAG_MIN_MS_DEFAULT, 0,
		                        RDZV_POLL_MAX_MS, &c->diag_min_ms);
}

/* ---- requests ----------------------------------------------------------- */

static bool authorized(const struct kolo_rdzv_server *s, struct MHD_Connection *c)
{
	if (!s->token)
		return true;
	const char *h =
	        MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
	if (!h || strncasecmp(h, "Bearer ", 7) != 0)
		return false;
	return kolo_consttime_streq(h + 7, s->token);
}

/* Runs a v1 handler under the lock; sends its reply after. */
static enum MHD_Result call_handler(struct rdzv_req *r, const struct rdzv_route *rt,
                                    enum rdzv_method method)
{
	static rdzv_api_fn *const handler_of[RDZV_EP_COUNT] = {
	        [RDZV_EP_JOB] = rdzv_api_job,
	        [RDZV_EP_WORKERS] = rdzv_api_join,
	        [RDZV_EP_WORKER] = rdzv_api_leave,
	        [RDZV_EP_ASSIGNMENT] = rdzv_api_assignment,
	        [RDZV_EP_HEARTBEAT] = rdzv_api_heartbeat,
	        [RDZV_EP_FAILURES] = rdzv_api_failure,
	        [RDZV_EP_KV] = rdzv_api_kv,
	        [RDZV_EP_KV_STORE] = rdzv_api_kv_store,
	        [RDZV_EP_DIAGNOSIS] = rdzv_api_diagnosis,
	};
	struct kolo_rdzv_server *s = r->s;
	struct rdzv_call call;
	call_prepare(r, rt, method, &call);
	pthread_mutex_lock(&s->lock);
	struct rdzv_reply rep = handler_of[rt->ep](s, r, &call, kolo_now_ms());
	pthread_mutex_unlock(&s->lock);
	return rep.held ? MHD_YES : send_reply(r, rep);
}

static enum MHD_Result dispatch(struct rdzv_req *r, const char *url, const char *method)
{
	struct rdzv_route rt;
	rdzv_http_route(url, &rt);
	r->ep = rt.ep;
	if (rt.ep == RDZV_EP_HEALTHZ && method_ok(rt.ep, method))
		return send_reply(r, rdzv_reply_json(200, json_pack("{s:s}", "status", "ok")));
	if (rt.ep == RDZV_EP_METRICS && method_ok(rt.ep, method)) {
		pthread_mutex_lock(&r->s->lock);
		struct rdzv_reply rep = rdzv_metrics_text(r->s);
		pthread_mutex_unlock(&r->s->lock);
		return send_reply(r, rep);
	}
	struct rdzv_reply refusal = {0};
	if (rt.ep == RDZV_EP_OTHER)
		refusal = rdzv_reply_error(404, "no such path %s", url);
	else if (!method_ok(rt.ep, method))
		refusal = rdzv_reply_error(405, "method %s not allowed on %s", method, url);
	else if (r->too_large)
		refusal = rdzv_reply_error(413, "body larger than %d bytes", KOLO_RDZV_MAX_BODY);
	else if (rt.bad_job)
		refusal =
		        rdzv_reply_error(400, "invalid job id: 1-%d characters of [A-Za-z0-9._:-]",
		                         KOLO_RDZV_ID_MAX - 1);
	else if (rt.bad_id)
		refusal = rdzv_reply_error(400, "invalid %s: 1-%d characters of [A-Za-z0-9._:-%s]",
		                           rt.ep == RDZV_EP_KV ? "key" : "worker id",
		                           KOLO_RDZV_ID_MAX - 1, rt.ep == RDZV_EP_KV ? "/" : "");
	else
		return call_handler(r, &rt, method_of(method));
	return send_reply(r, refusal);
}

/* The first call for a request: its headers are in. */
static enum MHD_Result request_begin(struct kolo_rdzv_server *s, struct MHD_Connection *conn,
                                     const char *url, void **con_cls)
{
	struct rdzv_req *r = calloc(1, sizeof(*r));
	if (!r)
		return MHD_NO;
	r->s = s;
	r->conn = conn;
	r->fd = -1;
	*con_cls = r;
	pthread_mutex_lock(&s->lock);
	s->inflight++;
	r->counted = true;
	bool stopping = s->stopping;
	pthread_mutex_unlock(&s->lock);
	struct rdzv_route rt;
	rdzv_http_route(url, &rt);
	r->ep = rt.ep;
	if (stopping)
		return send_reply(r, rdzv_reply_error(503, "server shutting down"));
	if (rt.v1 && !authorized(s, conn)) {
		rdzv_metrics_auth_failure(s);
		return send_reply(r, rdzv_reply_error(401, "missing or wrong bearer token"));
	}
	const char *cl =
	        MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
	if (cl && strtoull(cl, NULL, 10) > KOLO_RDZV_MAX_BODY) {
		/* A client that waits for "100 Continue" gets the refusal before it
		 * sends the body; any other would see its connection reset while
		 * still sending, so its body is read and dropped first. */
		const char *ex =
		        MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_EXPECT);
		if (ex && strcasecmp(ex, "100-continue") == 0)
			return send_reply(r, rdzv_reply_error(413, "body larger than %d bytes",
			                                      KOLO_RDZV_MAX_BODY));
		r->too_large = true;
	}
	return MHD_YES;
}

/* Appends n bytes of body (NUL-terminated), or drops them past the limit. */
static enum MHD_Result request_body(struct rdzv_req *r, const char *data, size_t n)
{
	if (r->too_large || r->len + n > KOLO_RDZV_MAX_BODY) {
		r->too_large = true;
		r->discarded += n;
		/* Past this, stop reading: the connection is closed. */
		return r->discarded > DISCARD_MAX ? MHD_NO : MHD_YES;
	}
	return kolo_bytes_append(&r->body, &r->len, &r->cap, data, n, BODY_FIRST_CAP) ? MHD_YES
	                                                                              : MHD_NO;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls)
{
	(void)version;
	struct rdzv_req *r = *con_cls;
	if (!r)
		return request_begin(cls, conn, url, con_cls);
	if (*upload_data_size) {
		size_t n = *upload_data_size;
		*upload_data_size = 0;
		return request_body(r, upload_data, n);
	}
	if (r->gone)
		return MHD_NO;
	if (r->ready) {
		/* A held poll, resumed with the reply prepared for it. */
		r->ready = false;
		struct rdzv_reply rep = r->reply;
		r->reply.body = NULL;
		return send_reply(r, rep);
	}
	return dispatch(r, url, method);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
	(void)conn;
	(void)toe;
	struct kolo_rdzv_server *s = cls;
	struct rdzv_req *r = *con_cls;
	if (!r)
		return;
	*con_cls = NULL;
	pthread_mutex_lock(&s->lock);
	rdzv_wait_unlink(r);
	if (r->counted && --s->inflight == 0)
		pthread_cond_broadcast(&s->idle_cond);
	pthread_mutex_unlock(&s->lock);
	free(r->reply.body);
	free(r->body);
	free(r);
}

void rdzv_http_suspend(struct rdzv_req *r)
{
	const union MHD_ConnectionInfo *ci =
	        MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
	r->fd = ci ? ci->connect_fd : -1;
	MHD_suspend_connection(r->conn);
}

void rdzv_http_resume(struct rdzv_req *r)
{
	MHD_resume_connection(r->conn);
	/* Without an internal thread libmicrohttpd has no wake-up channel of its
	 * own: http_main has to look, even when this runs in MHD_run. */
	uint64_t one = 1;
	ssize_t n = write(r->s->wake_fd, &one, sizeof(one));
	(void)n; /* a full counter already wakes it */
}

/* ---- the daemon ------------------------------------------------------------ */

/* libmicrohttpd's MHD_LogCallback: fmt is its own format string. */
static void mhd_log(void *cls, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
	(void)cls;
	if (!kolo_log_enabled(KOLO_LOG_DEBUG, RDZV_SUB))
		return;
	char msg[512];
	vsnprintf(msg, sizeof(msg), fmt, ap);
	size_t n = strlen(msg);
	while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r'))
		msg[--n] = '\0';
	KOLO_DEBUG(RDZV_SUB, "microhttpd: %s", msg);
}

static int hex_digit_value(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/* Percent-decoding that leaves "%00" as it is, so that a NUL can never cut
 * an id or key short: the '%' then fails validation. */
static size_t unescape(void *cls, struct MHD_Connection *c, char *s)
{
	(void)cls;
	(void)c;
	char *w = s;
	for (char *r = s; *r; r++) {
		int hi, lo;
		if (r[0] == '%' && (hi = hex_digit_value(r[1])) >= 0 &&
		    (lo = hex_digit_value(r[2])) >= 0 && (hi | lo) != 0) {
			*w++ = (char)(hi * 16 + lo);
			r += 2;
		} else {
			*w++ = *r;
		}
	}
	*w = '\0';
	return (size_t)(w - s);
}

/* Runs the daemon. Not libmicrohttpd's own polling thread: in 0.9.75 it
 * drains epoll in batches of 128 events, every epoll_wait with the timeout
 * computed before the first, so when the events come in an exact multiple of
 * 128 (255 resumed polls re-entering the epoll set plus one request, say)
 * the last call blocks with connections already marked ready, until an
 * unrelated event or an idle timeout. MHD_run never blocks, and
 * MHD_get_timeout is 0 while a connection has work pending. */
static void *http_main(void *arg)
{
	struct kolo_rdzv_server *s = arg;
	const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_EPOLL_FD);
	struct pollfd p[2] = {{.fd = di ? di->epoll_fd : -1, .events = POLLIN},
	                      {.fd = s->wake_fd, .events = POLLIN}};
	while (!atomic_load(&s->http_stop)) {
		MHD_UNSIGNED_LONG_LONG t;
		int ms = -1;
		if (MHD_get_timeout(s->d, &t) == MHD_YES)
			ms = (int)KOLO_MIN(t, (MHD_UNSIGNED_LONG_LONG)INT_MAX);
		if (poll(p, 2, ms) < 0 && errno != EINTR) {
			KOLO_ERROR(RDZV_SUB, "poll: %s", strerror(errno));
			break;
		}
		uint64_t v;
		ssize_t n = p[1].revents ? read(s->wake_fd, &v, sizeof(v)) : 0;
		(void)n; /* drained before MHD_run, so no wake-up is lost */
		MHD_run(s->d);
	}
	return NULL;
}

kolo_status_t rdzv_http_start(struct kolo_rdzv_server *s, struct kolo_errbuf *eb)
{
	s->d = MHD_start_daemon(MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG, 0,
	                        NULL, NULL, on_request, s, MHD_OPTION_EXTERNAL_LOGGER, mhd_log,
	                        NULL, MHD_OPTION_UNESCAPE_CALLBACK, unescape, NULL,
	                        MHD_OPTION_LISTEN_SOCKET, s->listen_fd, MHD_OPTION_CONNECTION_LIMIT,
	                        (unsigned)CONNECTION_LIMIT, MHD_OPTION_CONNECTION_TIMEOUT,
	                        (unsigned)IDLE_TIMEOUT_S, MHD_OPTION_NOTIFY_COMPLETED, on_completed,
	                        s, MHD_OPTION_END);
	if (!s->d)
		return kolo_fail(eb, KOLO_ESYSTEM, "cannot start the HTTP daemon");
	if (pthread_create(&s->http, NULL, http_main, s) != 0)
		return kolo_fail(eb, KOLO_ESYSTEM, "cannot start the HTTP thread");
	s->http_started = true;
	return KOLO_OK;
}

/* Waits, up to RDZV_STOP_GRACE_MS, for the requests in flight. */
static void wait_inflight(struct kolo_rdzv_server *s)
{
	pthread_mutex_lock(&s->lock);
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	ts.tv_sec += RDZV_STOP_GRACE_MS / 1000;
	while (s->inflight > 0) {
		if (pthread_cond_timedwait(&s->idle_cond, &s->lock, &ts) == ETIMEDOUT)
			break;
	}
	pthread_mutex_unlock(&s->lock);
}

void rdzv_http_stop(struct kolo_rdzv_server *s)
{
	if (s->d) {
		/* After quiescing, the listening socket is ours to close;
		 * otherwise MHD_stop_daemon closes it. */
		MHD_socket lfd = MHD_quiesce_daemon(s->d);
		s->listen_fd = lfd != MHD_INVALID_SOCKET ? lfd : -1;
		/* Let requests in flight, and the long polls just answered, finish. */
		wait_inflight(s);
	}
	if (s->http_started) {
		atomic_store(&s->http_stop, true);
		uint64_t one = 1;
		ssize_t n = write(s->wake_fd, &one, sizeof(one));
		(void)n;
		pthread_join(s->http, NULL);
	}
	if (s->d)
		MHD_stop_daemon(s->d);
	s->d = NULL;
}
