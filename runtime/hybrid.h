/* hybrid: one transport endpoint made of two, routing each peer to shared
 * memory when it is on this host and to the network transport otherwise.
 * The ring sees one transport; its handle carries both sub-handles. */
#ifndef KOLO_RUNTIME_HYBRID_H
#define KOLO_RUNTIME_HYBRID_H

#include <stdbool.h>

#include "transport.h"

/* Creates the endpoint. same_host[r] says whether rank r shares this host
 * (copied; cfg->size entries). local: the transport for same-host peers
 * (NULL: use net for everyone); net: the transport for the others. */
kolo_status_t kolo_hybrid_create(const struct kolo_transport_config *cfg, const bool *same_host,
                                 const struct kolo_transport_ops *local,
                                 const struct kolo_transport_ops *net, struct kolo_transport **out,
                                 struct kolo_errbuf *eb);

/* The network transport's handle inside a hybrid handle. KOLO_EINVAL when h
 * is not a hybrid handle. */
kolo_status_t kolo_hybrid_net_handle(const struct kolo_transport_handle *h,
                                     struct kolo_transport_handle *net);

#endif
