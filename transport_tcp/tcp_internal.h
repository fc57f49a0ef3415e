/* Helpers shared by the files of transport_tcp/ only. */
#ifndef KOLO_TCP_INTERNAL_H
#define KOLO_TCP_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "transport.h"

/* Writes the listen handle for a bound address (port set). */
void tcp_handle_encode(const struct sockaddr_storage *ss, struct kolo_transport_handle *h);
/* "1.2.3.4:5" or "[::1]:5". */
void tcp_addr_str(const struct sockaddr_storage *ss, char *out, size_t size);
/* The port of the handle's liveness probe listener; 0: none. */
void tcp_handle_set_probe_port(struct kolo_transport_handle *h, uint16_t port);
uint16_t tcp_handle_probe_port(const struct kolo_transport_handle *h);

/* ---- the liveness probe (tcp_probe.c) ----------------------------------- */

struct tcp_probe_config {
	int period_ms;                       /* one byte per target every period */
	int timeout_ms;                      /* TCP_USER_TIMEOUT: no ack this long is a loss */
	const struct sockaddr_storage *addr; /* the address to listen on (port ignored) */
	socklen_t addrlen;
	int notify_fd; /* an eventfd written when a peer is found lost */
};

struct tcp_probe;

/* Listens and starts the probe's thread. */
kolo_status_t tcp_probe_start(const struct tcp_probe_config *cfg, struct tcp_probe **out,
                              struct kolo_errbuf *eb);
uint16_t tcp_probe_port(const struct tcp_probe *p);
/* Probes rank at addr with the given probe port (once per rank; later calls
 * are ignored, as is port 0). Thread-safe. */
void tcp_probe_watch(struct tcp_probe *p, int rank, const struct sockaddr_storage *addr,
                     socklen_t addrlen, uint16_t port);
/* Whether a loss was found since the last tcp_probe_ack(); lock-free. */
bool tcp_probe_pending(const struct tcp_probe *p);
void tcp_probe_ack(struct tcp_probe *p);
/* Whether rank was found lost. Thread-safe. */
bool tcp_probe_lost(struct tcp_probe *p, int rank);
/* Stops the thread and closes every probe. Accepts NULL. */
void tcp_probe_stop(struct tcp_probe *p);

#endif /* KOLO_TCP_INTERNAL_H */
