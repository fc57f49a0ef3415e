/* hybrid: one transport endpoint made of two, routing each peer to shared
 * memory when cfg.same_host says it is on this host and to TCP otherwise.
 * The ring sees one transport; its handle carries both sub-handles. Every
 * multi-host job runs on it. Between hosts it uses cfg->net (verbs) when
 * set, else TCP. */
#ifndef KOLO_RUNTIME_HYBRID_H
#define KOLO_RUNTIME_HYBRID_H

#include <stdbool.h>

#include "transport.h"

/* The contract of core/transport.h. create() copies cfg->same_host (NULL:
 * every peer over TCP, and no shared memory is set up); shared memory is
 * created only when some other rank is on this host. poll_fd() is -1 while
 * both sub-transports are in use; unreachable() is TCP's. */
extern const struct kolo_transport_ops kolo_transport_hybrid_ops;

/* The network transport's handle inside a hybrid handle. KOLO_EINVAL when h
 * is not a hybrid handle. */
kolo_status_t kolo_hybrid_net_handle(const struct kolo_transport_handle *h,
                                     struct kolo_transport_handle *net);

#endif
