/* client_parse: the rendezvous client's reading of the server's replies
 * (docs/rendezvous.md). Bytes in, values out: no client, no lock, no I/O,
 * so tests/fuzz/fuzz_rdzv_reply.c can feed them anything. body need not be
 * NUL-terminated; NULL with len 0 is an empty body. */
#ifndef KOLO_RDZV_CLIENT_PARSE_H
#define KOLO_RDZV_CLIENT_PARSE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rendezvous.h"

/* The text of an {"error": "..."} reply, else the body's first 200 bytes,
 * else "" (no body); always NUL-terminated in buf. Returns buf. */
const char *rdzv_client_parse_error(const char *body, size_t len, char *buf, size_t size);
/* A join reply {"worker_id": non-empty string, "lease_ms": 1..INT32_MAX}.
 * false when malformed (outputs then unspecified). */
bool rdzv_client_parse_join(const char *body, size_t len, char wid[KOLO_RDZV_ID_MAX],
                            int *lease_ms);
/* An assignment. On success *out is filled, out->members malloc'd (the
 * caller frees it with kolo_rdzv_assignment_fini) with one member per rank,
 * and KOLO_OK comes back. KOLO_EPROTO with *why naming the fault when
 * malformed or inconsistent; KOLO_ENOMEM without memory; *out untouched
 * then. Whether the member at out->rank is this worker is the caller's
 * check. */
kolo_status_t rdzv_client_parse_assignment(const char *body, size_t len,
                                           struct kolo_rdzv_assignment *out, const char **why);
/* A heartbeat reply {"round": int, "pending_change": bool}. */
bool rdzv_client_parse_heartbeat(const char *body, size_t len, int64_t *round,
                                 bool *pending_change);
/* A job status document: its round and how many members it lists. */
bool rdzv_client_parse_job_round(const char *body, size_t len, int64_t *round, int *size);
/* A job status document: its min_np, how many members and waiting workers
 * (spares, joiners) it lists. */
bool rdzv_client_parse_job_sizes(const char *body, size_t len, int *min_np, int *members,
                                 int *waiting);

#endif /* KOLO_RDZV_CLIENT_PARSE_H */
