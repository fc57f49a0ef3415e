/* Address choice and the listen handle of the TCP transport. */
#include "transport_tcp.h"
#include "tcp_internal.h"

#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* Handle layout (all other bytes zero):
 *   [0,4)   KOLO_TRANSPORT_MAGIC, little-endian
 *   [4]     KOLO_HANDLE_TCP
 *   [5]     4 or 6 (address family)
 *   [6,8)   port, network order
 *   [8,24)  address (4 or 16 bytes), network order
 *   [24,28) IPv6 scope id, little-endian
 *   [28,30) port of the liveness probe listener, network order; 0: none */
#define TCP_HANDLE_USED 30
_Static_assert(TCP_HANDLE_USED <= KOLO_TRANSPORT_HANDLE_SIZE, "TCP handle must fit the handle");

void tcp_handle_encode(const struct sockaddr_storage *ss, struct kolo_transport_handle *h)
{
	memset(h, 0, sizeof(*h));
	uint32_t magic = htole32(KOLO_TRANSPORT_MAGIC);
	memcpy(h->bytes, &magic, 4);
	h->bytes[4] = KOLO_HANDLE_TCP;
	if (ss->ss_family == AF_INET6) {
		const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)ss;
		uint32_t scope = htole32(a->sin6_scope_id);
		h->bytes[5] = 6;
		memcpy(h->bytes + 6, &a->sin6_port, 2);
		memcpy(h->bytes + 8, &a->sin6_addr, 16);
		memcpy(h->bytes + 24, &scope, 4);
	} else {
		const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
		h->bytes[5] = 4;
		memcpy(h->bytes + 6, &a->sin_port, 2);
		memcpy(h->bytes + 8, &a->sin_addr, 4);
	}
}

void tcp_handle_set_probe_port(struct kolo_transport_handle *h, uint16_t port)
{
	uint16_t p = htons(port);
	memcpy(h->bytes + 28, &p, 2);
}

uint16_t tcp_handle_probe_port(const struct kolo_transport_handle *h)
{
	uint16_t p;
	memcpy(&p, h->bytes + 28, 2);
	return ntohs(p);
}

kolo_status_t kolo_tcp_handle_decode(const struct kolo_transport_handle *h,
                                     struct sockaddr_storage *out, socklen_t *outlen)
{
	uint32_t magic;
	memcpy(&magic, h->bytes, 4);
	if (le32toh(magic) != KOLO_TRANSPORT_MAGIC || h->bytes[4] != KOLO_HANDLE_TCP)
		return KOLO_EINVAL;
	memset(out, 0, sizeof(*out));
	if (h->bytes[5] == 4) {
		struct sockaddr_in *a = (struct sockaddr_in *)out;
		a->sin_family = AF_INET;
		memcpy(&a->sin_port, h->bytes + 6, 2);
		memcpy(&a->sin_addr, h->bytes + 8, 4);
		*outlen = sizeof(*a);
	} else if (h->bytes[5] == 6) {
		struct sockaddr_in6 *a = (struct sockaddr_in6 *)out;
		uint32_t scope;
		a->sin6_family = AF_INET6;
		memcpy(&a->sin6_port, h->bytes + 6, 2);
		memcpy(&a->sin6_addr, h->bytes + 8, 16);
		memcpy(&scope, h->bytes + 24, 4);
		a->sin6_scope_id = le32toh(scope);
		*outlen = sizeof(*a);
	} else {
		return KOLO_EINVAL;
	}
	return KOLO_OK;
}

void tcp_addr_str(const struct sockaddr_storage *ss, char *out, size_t size)
{
	char ip[INET6_ADDRSTRLEN] = "?";
	if (ss->ss_family == AF_INET6) {
		const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)ss;
		inet_ntop(AF_INET6, &a->sin6_addr, ip, sizeof(ip));
		snprintf(out, size, "[%s]:%u", ip, ntohs(a->sin6_port));
	} else if (ss->ss_family == AF_INET) {
		const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
		inet_ntop(AF_INET, &a->sin_addr, ip, sizeof(ip));
		snprintf(out, size, "%s:%u", ip, ntohs(a->sin_port));
	} else {
		snprintf(out, size, "?");
	}
}

static bool usable_ifaddr(const struct ifaddrs *ifa, int family)
{
	if (!ifa->ifa_addr || ifa->ifa_addr->sa_family != family || !(ifa->ifa_flags & IFF_UP))
		return false;
	if (family == AF_INET6) {
		const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)ifa->ifa_addr;
		if (IN6_IS_ADDR_LINKLOCAL(&a->sin6_addr) && a->sin6_scope_id == 0)
			return false;
	}
	return true;
}

static void copy_ifaddr(const struct ifaddrs *ifa, struct sockaddr_storage *out, socklen_t *outlen)
{
	memset(out, 0, sizeof(*out));
	if (ifa->ifa_addr->sa_family == AF_INET6) {
		memcpy(out, ifa->ifa_addr, sizeof(struct sockaddr_in6));
		((struct sockaddr_in6 *)out)->sin6_port = 0;
		*outlen = sizeof(struct sockaddr_in6);
	} else {
		memcpy(out, ifa->ifa_addr, sizeof(struct sockaddr_in));
		((struct sockaddr_in *)out)->sin_port = 0;
		*outlen = sizeof(struct sockaddr_in);
	}
}

/* name == NULL: the first non-loopback up interface. IPv4 is preferred. */
static bool find_ifaddr(const char *name, struct sockaddr_storage *out, socklen_t *outlen)
{
	struct ifaddrs *list = NULL;
	if (getifaddrs(&list) != 0)
		return false;
	bool found = false;
	static const int families[] = {AF_INET, AF_INET6};
	for (size_t f = 0; f < KOLO_ARRAY_SIZE(families) && !found; f++) {
		for (struct ifaddrs *ifa = list; ifa && !found; ifa = ifa->ifa_next) {
			if (!usable_ifaddr(ifa, families[f]))
				continue;
			if (name ? strcmp(ifa->ifa_name, name) != 0
			         : (ifa->ifa_flags & IFF_LOOPBACK))
				continue;
			copy_ifaddr(ifa, out, outlen);
			found = true;
		}
	}
	freeifaddrs(list);
	return found;
}

static bool parse_ip(const char *s, struct sockaddr_storage *out, socklen_t *outlen)
{
	memset(out, 0, sizeof(*out));
	struct sockaddr_in *a4 = (struct sockaddr_in *)out;
	struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)out;
	if (inet_pton(AF_INET, s, &a4->sin_addr) == 1) {
		a4->sin_family = AF_INET;
		*outlen = sizeof(*a4);
		return true;
	}
	if (inet_pton(AF_INET6, s, &a6->sin6_addr) == 1) {
		a6->sin6_family = AF_INET6;
		*outlen = sizeof(*a6);
		return true;
	}
	return false;
}

/* route_to may be a host, host:port, [v6]:port or a URL; keep the host. */
static void route_host(const char *route_to, char *host, size_t size)
{
	const char *p = strstr(route_to, "://");
	p = p ? p + 3 : route_to;
	size_t n = strcspn(p, "/?#");
	if (n >= size)
		n = size - 1;
	memcpy(host, p, n);
	host[n] = '\0';
	if (host[0] == '[') {
		char *end = strchr(host, ']');
		if (end) {
			*end = '\0';
			memmove(host, host + 1, strlen(host + 1) + 1);
		}
		return;
	}
	char *colon = strchr(host, ':');
	if (colon && !strchr(colon + 1, ':'))
		*colon = '\0'; /* host:port; several colons is a bare IPv6 address */
}

static bool route_address(const char *route_to, struct sockaddr_storage *out, socklen_t *outlen)
{
	char host[256];
	route_host(route_to, host, sizeof(host));
	if (!host[0])
		return false;
	struct addrinfo hints = {.ai_socktype = SOCK_DGRAM, .ai_family = AF_UNSPEC};
	struct addrinfo *res = NULL;
	if (getaddrinfo(host, "9", &hints, &res) != 0 || !res)
		return false;
	bool ok = false;
	for (struct addrinfo *ai = res; ai && !ok; ai = ai->ai_next) {
		int fd = socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
		if (fd < 0)
			continue;
		/* connect() on UDP only picks a route and a source address. */
		socklen_t len = sizeof(*out);
		if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
		    getsockname(fd, (struct sockaddr *)out, &len) == 0) {
			*outlen = len;
			if (out->ss_family == AF_INET)
				((struct sockaddr_in *)out)->sin_port = 0;
			else
				((struct sockaddr_in6 *)out)->sin6_port = 0;
			ok = true;
		}
		close(fd);
	}
	freeaddrinfo(res);
	return ok;
}

kolo_status_t kolo_tcp_pick_address(const char *iface, const char *route_to,
                                    struct sockaddr_storage *out, socklen_t *outlen,
                                    struct kolo_errbuf *eb)
{
	if (iface && iface[0]) {
		if (parse_ip(iface, out, outlen) || find_ifaddr(iface, out, outlen))
			return KOLO_OK;
		return kolo_fail(eb, KOLO_EINVAL,
		                 "KOLO_IFACE=%s is neither an IP address nor an interface with an "
		                 "address that is up",
		                 iface);
	}
	if (route_to && route_to[0] && route_address(route_to, out, outlen))
		return KOLO_OK;
	if (find_ifaddr(NULL, out, outlen))
		return KOLO_OK;
	parse_ip("127.0.0.1", out, outlen);
	return KOLO_OK;
}
