/* server_listen: the server's listening socket, from "HOST:PORT". */
#include "server_internal.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define LISTEN_BACKLOG  4096
#define LISTEN_HOST_MAX 256

/* Splits "HOST:PORT" ("[V6]:PORT" too) into host and the port's text. */
static kolo_status_t split_listen_addr(const char *listen_addr, char *host, size_t host_size,
                                       const char **port, struct kolo_errbuf *eb)
{
	const char *colon = strrchr(listen_addr, ':');
	if (!colon || colon == listen_addr || (size_t)(colon - listen_addr) >= host_size)
		return kolo_fail(eb, KOLO_EINVAL, "listen address \"%s\" is not HOST:PORT",
		                 listen_addr);
	size_t hl = (size_t)(colon - listen_addr);
	memcpy(host, listen_addr, hl);
	host[hl] = '\0';
	if (host[0] == '[' && hl > 2 && host[hl - 1] == ']') {
		memmove(host, host + 1, hl - 2);
		host[hl - 2] = '\0';
	}
	char *end;
	long p = strtol(colon + 1, &end, 10);
	if (*end || end == colon + 1 || p < 0 || p > 65535)
		return kolo_fail(eb, KOLO_EINVAL, "bad port in listen address \"%s\"", listen_addr);
	*port = colon + 1;
	return KOLO_OK;
}

/* The first address of ai that binds and listens; -1 and *err otherwise. */
static int bind_first(const struct addrinfo *ai, int *err)
{
	for (const struct addrinfo *a = ai; a; a = a->ai_next) {
		int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
		if (fd < 0) {
			*err = errno;
			continue;
		}
		int one = 1;
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, LISTEN_BACKLOG) == 0)
			return fd;
		*err = errno;
		close(fd);
	}
	return -1;
}

kolo_status_t rdzv_listen_open(const char *listen_addr, int *fd_out, int *port_out,
                               struct kolo_errbuf *eb)
{
	char host[LISTEN_HOST_MAX];
	const char *port = NULL;
	kolo_status_t st = split_listen_addr(listen_addr, host, sizeof(host), &port, eb);
	if (st != KOLO_OK)
		return st;
	struct addrinfo hints = {.ai_family = AF_UNSPEC,
	                         .ai_socktype = SOCK_STREAM,
	                         .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
	struct addrinfo *ai = NULL;
	int rc = getaddrinfo(host[0] && strcmp(host, "*") ? host : NULL, port, &hints, &ai);
	if (rc != 0)
		return kolo_fail(eb, KOLO_EINVAL, "cannot resolve listen host \"%s\": %s", host,
		                 gai_strerror(rc));
	int err = 0;
	int fd = bind_first(ai, &err);
	freeaddrinfo(ai);
	if (fd < 0)
		return kolo_fail(eb, KOLO_ESYSTEM, "cannot listen on %s: %s", listen_addr,
		                 strerror(err));
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	if (getsockname(fd, (struct sockaddr *)&ss, &sl) != 0) {
		close(fd);
		return kolo_fail(eb, KOLO_ESYSTEM, "getsockname: %s", strerror(errno));
	}
	*port_out = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
	                                     : ntohs(((struct sockaddr_in *)&ss)->sin_port);
	*fd_out = fd;
	return KOLO_OK;
}
