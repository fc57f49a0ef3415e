/* transport_tcp: the TCP implementation of the transport contract
 * (core/transport.h). Several TCP streams per conn; every message is cut into
 * chunks that go to whichever stream has room and are received straight into
 * the posted buffer. Wire format, handshake and failure semantics:
 * docs/transport.md. */
#ifndef KOLO_TRANSPORT_TCP_H
#define KOLO_TRANSPORT_TCP_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/socket.h>

#include "transport.h"

/* Most streams one conn may have; cfg.streams is clamped to it (0 picks per
 * peer: 1 on this host, 2 to another). */
#define KOLO_TCP_MAX_STREAMS 16

extern const struct kolo_transport_ops kolo_transport_tcp_ops;

/* The address the transport listens on for this cfg.iface / cfg.route_to:
 * an interface name or IP literal; else the local address of a UDP socket
 * connected to route_to (nothing is sent); else the first non-loopback up
 * interface; else 127.0.0.1. The port is 0. */
kolo_status_t kolo_tcp_pick_address(const char *iface, const char *route_to,
                                    struct sockaddr_storage *out, socklen_t *outlen,
                                    struct kolo_errbuf *eb);

/* Decodes a TCP listen handle into a socket address (for tools and tests).
 * KOLO_EINVAL when the handle is not a TCP handle. */
kolo_status_t kolo_tcp_handle_decode(const struct kolo_transport_handle *h,
                                     struct sockaddr_storage *out, socklen_t *outlen);

/* Whether the host behind a TCP handle answers at the network level within
 * timeout_ms: a connection to its probe port (else its data port) is
 * accepted or refused. False for silence, an unreachable route, or a handle
 * that is not TCP. Blocks up to timeout_ms; needs no endpoint. */
bool kolo_tcp_host_answers(const struct kolo_transport_handle *h, int timeout_ms);

#endif /* KOLO_TRANSPORT_TCP_H */
