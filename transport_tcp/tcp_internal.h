/* Helpers shared by the files of transport_tcp/ only. */
#ifndef KOLO_TCP_INTERNAL_H
#define KOLO_TCP_INTERNAL_H

#include <stddef.h>
#include <sys/socket.h>

#include "transport.h"

/* Writes the listen handle for a bound address (port set). */
void tcp_handle_encode(const struct sockaddr_storage *ss, struct kolo_transport_handle *h);
/* "1.2.3.4:5" or "[::1]:5". */
void tcp_addr_str(const struct sockaddr_storage *ss, char *out, size_t size);

#endif /* KOLO_TCP_INTERNAL_H */
