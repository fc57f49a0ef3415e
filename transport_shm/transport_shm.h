/* transport_shm: the shared-memory transport between ranks on one host.
 *
 * A conn is a pair of single-producer/single-consumer byte rings in a memfd
 * mapping that the acceptor creates and hands to the connector over an
 * abstract UNIX socket after an authenticated handshake. Nothing is ever named
 * in /dev/shm or the file system, so a crash leaks nothing: the kernel frees
 * the memory when the last process holding the mapping exits. The socket
 * stays open for the conn's life: it carries wake-ups (one byte, only when the
 * other side sleeps) and reports a dead peer at once (EOF/POLLHUP). Messages
 * cross the ring with one copy in and one copy out, each behind its 8-byte
 * length, which the receiver checks (shm_conn.c); no system call is made
 * while both sides are busy. Abstract sockets live in the network namespace,
 * so two ranks share memory only when they share a host in that sense too. */
#ifndef KOLO_TRANSPORT_SHM_H
#define KOLO_TRANSPORT_SHM_H

#include "transport.h"

extern const struct kolo_transport_ops kolo_transport_shm_ops;

#endif /* KOLO_TRANSPORT_SHM_H */
