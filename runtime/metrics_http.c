/* metrics_http: the worker's Prometheus endpoint. When KOLO_METRICS_LISTEN
 * is set, the first comm of the process (kolo_init or a bootstrap comm)
 * starts a libmicrohttpd daemon on its own thread that answers GET /metrics
 * with kolo_metrics_render() and 404 elsewhere; the last comm to go stops
 * it. A scrape reads only atomics, so it never waits for a collective, nor a
 * collective for it. docs/metrics.md is the contract. */
#include "runtime.h"

#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "metrics.h"

#define SUBSYS                   "init"
#define METRICS_CONNECTION_LIMIT 16
#define METRICS_IDLE_TIMEOUT_S   10
#define METRICS_CONTENT_TYPE     "text/plain; version=0.0.4; charset=utf-8"

/* One server per process, shared by its comms. */
static pthread_mutex_t srv_lock = PTHREAD_MUTEX_INITIALIZER;
static struct MHD_Daemon *srv_daemon;
static int srv_refs, srv_port = -1;

kolo_status_t kolo_runtime_metrics_parse(const char *spec, int local_rank, char *host,
                                         size_t host_size, int *port, struct kolo_errbuf *eb)
{
	const char *colon = strrchr(spec, ':');
	size_t hl = colon ? (size_t)(colon - spec) : 0;
	if (!colon || hl >= host_size)
		return kolo_fail(
		        eb, KOLO_EINVAL,
		        "KOLO_METRICS_LISTEN=\"%s\" is not HOST:PORT or :PORT (e.g. :9400; "
		        "each worker adds its local rank to PORT)",
		        spec);
	memcpy(host, spec, hl);
	host[hl] = '\0';
	if (hl >= 2 && host[0] == '[' && host[hl - 1] == ']') { /* [v6]:port */
		memmove(host, host + 1, hl - 2);
		host[hl - 2] = '\0';
	}
	char *end;
	errno = 0;
	long p = strtol(colon + 1, &end, 10);
	if (errno || end == colon + 1 || *end || p < 0 || p > 65535)
		return kolo_fail(eb, KOLO_EINVAL,
		                 "KOLO_METRICS_LISTEN=\"%s\": the port must be a number from 0 to "
		                 "65535",
		                 spec);
	/* Port 0 asks for any free port, for every worker alike. */
	if (p > 0 && p + local_rank > 65535)
		return kolo_fail(
		        eb, KOLO_EINVAL,
		        "KOLO_METRICS_LISTEN=\"%s\": port %ld + local rank %d is above 65535", spec,
		        p, local_rank);
	*port = p > 0 ? (int)p + KOLO_MAX(local_rank, 0) : 0;
	return KOLO_OK;
}

kolo_status_t kolo_runtime_metrics_check(struct kolo_comm *comm)
{
	const char *spec = kolo_param_str(KOLO_P_METRICS_LISTEN);
	char host[256];
	int port;
	if (!spec[0])
		return KOLO_OK;
	return kolo_runtime_metrics_parse(spec, 0, host, sizeof(host), &port, &comm->err);
}

/* *fd: a listening socket on host:port (host "" or "*": every address),
 * *bound its port. */
static kolo_status_t listen_on(const char *host, int port, int *fd_out, int *bound,
                               struct kolo_errbuf *eb)
{
	char ps[16];
	snprintf(ps, sizeof(ps), "%d", port);
	struct addrinfo hints = {.ai_family = AF_UNSPEC,
	                         .ai_socktype = SOCK_STREAM,
	                         .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
	struct addrinfo *ai = NULL;
	int rc = getaddrinfo(host[0] && strcmp(host, "*") ? host : NULL, ps, &hints, &ai);
	if (rc != 0)
		return kolo_fail(eb, KOLO_EINVAL, "KOLO_METRICS_LISTEN: cannot resolve \"%s\": %s",
		                 host, gai_strerror(rc));
	int fd = -1, err = 0;
	for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
		fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
		if (fd < 0) {
			err = errno;
			continue;
		}
		int one = 1;
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 64) != 0) {
			err = errno;
			close(fd);
			fd = -1;
		}
	}
	freeaddrinfo(ai);
	if (fd < 0)
		return kolo_fail(eb, KOLO_ESYSTEM,
		                 "KOLO_METRICS_LISTEN: cannot listen on %s:%d: %s",
		                 host[0] ? host : "*", port, strerror(err));
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	*bound = port;
	if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0)
		*bound = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
		                                  : ntohs(((struct sockaddr_in *)&ss)->sin_port);
	*fd_out = fd;
	return KOLO_OK;
}

static enum MHD_Result reply(struct MHD_Connection *conn, unsigned code, char *body, size_t len,
                             enum MHD_ResponseMemoryMode mode, const char *type)
{
	struct MHD_Response *r = MHD_create_response_from_buffer(len, body, mode);
	if (!r) {
		if (mode == MHD_RESPMEM_MUST_FREE)
			free(body);
		return MHD_NO;
	}
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
	if (code == MHD_HTTP_METHOD_NOT_ALLOWED)
		MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
	enum MHD_Result ret = MHD_queue_response(conn, code, r);
	MHD_destroy_response(r);
	return ret;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **req_cls)
{
	(void)cls;
	(void)version;
	(void)upload_data;
	(void)req_cls;
	*upload_data_size = 0; /* a body, if any, is ignored */
	static char not_found[] =
	        "not found: the metrics are at /metrics, the flight recorder at /flight\n",
	            no_method[] = "method not allowed: GET /metrics\n",
	            no_memory[] = "out of memory\n";
	bool flight = strcmp(url, "/flight") == 0;
	if (strcmp(url, "/metrics") != 0 && !flight)
		return reply(conn, MHD_HTTP_NOT_FOUND, not_found, strlen(not_found),
		             MHD_RESPMEM_PERSISTENT, "text/plain");
	if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
		return reply(conn, MHD_HTTP_METHOD_NOT_ALLOWED, no_method, strlen(no_method),
		             MHD_RESPMEM_PERSISTENT, "text/plain");
	char *text = NULL;
	size_t len = 0;
	kolo_status_t st =
	        flight ? kolo_runtime_flight_json(&text, &len) : kolo_metrics_render(&text, &len);
	if (st != KOLO_OK)
		return reply(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, no_memory, strlen(no_memory),
		             MHD_RESPMEM_PERSISTENT, "text/plain");
	return reply(conn, MHD_HTTP_OK, text, len, MHD_RESPMEM_MUST_FREE,
	             flight ? "application/json" : METRICS_CONTENT_TYPE);
}

static void mhd_log(void *cls, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));
static void mhd_log(void *cls, const char *fmt, va_list ap)
{
	(void)cls;
	if (!kolo_log_enabled(KOLO_LOG_DEBUG, SUBSYS))
		return;
	char msg[512];
	vsnprintf(msg, sizeof(msg), fmt, ap);
	msg[strcspn(msg, "\r\n")] = '\0';
	KOLO_DEBUG(SUBSYS, "metrics: microhttpd: %s", msg);
}

kolo_status_t kolo_runtime_metrics_start(struct kolo_comm *comm)
{
	const struct kolo_rdzv_assignment *a = &comm->assignment;
	kolo_metrics_set_assignment(a->rank, a->size, a->local_rank, a->round);
	kolo_runtime_diag_start(comm);
	const char *spec = kolo_param_str(KOLO_P_METRICS_LISTEN);
	if (!spec[0] || comm->metrics)
		return KOLO_OK;
	pthread_mutex_lock(&srv_lock);
	kolo_status_t st = KOLO_OK;
	if (srv_refs == 0) {
		char host[256];
		int port = 0, fd = -1;
		kolo_metrics_set_identity(comm->job, comm->host);
		st = kolo_runtime_metrics_parse(spec, a->local_rank, host, sizeof(host), &port,
		                                &comm->err);
		if (st == KOLO_OK)
			st = listen_on(host, port, &fd, &srv_port, &comm->err);
		if (st == KOLO_OK) {
			srv_daemon = MHD_start_daemon(
			        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_USE_ERROR_LOG,
			        0, NULL, NULL, on_request, NULL, MHD_OPTION_EXTERNAL_LOGGER,
			        mhd_log, NULL, MHD_OPTION_LISTEN_SOCKET, fd,
			        MHD_OPTION_CONNECTION_LIMIT, (unsigned)METRICS_CONNECTION_LIMIT,
			        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)METRICS_IDLE_TIMEOUT_S,
			        MHD_OPTION_END);
			if (!srv_daemon) {
				close(fd);
				st = kolo_comm_fail(comm, KOLO_ESYSTEM,
				                    "KOLO_METRICS_LISTEN: cannot start the HTTP "
				                    "server on port %d",
				                    srv_port);
			}
		}
		if (st == KOLO_OK)
			kolo_metrics_enable();
		if (st == KOLO_OK)
			KOLO_INFO(SUBSYS, "metrics: serving http://%s:%d/metrics",
			          host[0] ? host : "*", srv_port);
	}
	if (st == KOLO_OK) {
		srv_refs++;
		comm->metrics = true;
	}
	pthread_mutex_unlock(&srv_lock);
	return st;
}

void kolo_runtime_metrics_stop(struct kolo_comm *comm)
{
	if (!comm->metrics)
		return;
	comm->metrics = false;
	pthread_mutex_lock(&srv_lock);
	if (--srv_refs == 0) {
		MHD_stop_daemon(srv_daemon); /* closes the listening socket */
		srv_daemon = NULL;
		srv_port = -1;
	}
	pthread_mutex_unlock(&srv_lock);
}

int kolo_runtime_metrics_port(void)
{
	pthread_mutex_lock(&srv_lock);
	int p = srv_port;
	pthread_mutex_unlock(&srv_lock);
	return p;
}
