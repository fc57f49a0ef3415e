/* durable: a committed state in a file that outlives every worker
 * (docs/durable.md).
 *
 * The file: a 40-byte header, then the payload. Header, little-endian:
 *   0  8  magic "KOLODUR\0"
 *   8  4  version (1)
 *  12  4  header size (40)
 *  16  8  commit number (int64)
 *  24  8  payload length
 *  32  8  FNV-1a 64 of bytes 0..31 and of the payload
 * A write goes to a temporary file in the same directory, is fsynced,
 * renamed over the file and the directory is fsynced: a reader sees the
 * old file or the new one, whole.
 *
 * The writer: one background thread per writer that writes the newest
 * snapshot handed to it; one handed in while it writes waits, and a newer
 * one replaces it. Pure file I/O; the runtime says what and when. */
#ifndef KOLO_ELASTIC_DURABLE_H
#define KOLO_ELASTIC_DURABLE_H

#include <stddef.h>
#include <stdint.h>

#include "core.h"

#define KOLO_DURABLE_HEADER  40
#define KOLO_DURABLE_VERSION 1

/* "<dir>/kolo-<job>.state" ('/' in the job name becomes '_'). */
void kolo_durable_path(char *out, size_t size, const char *dir, const char *job);
/* Writes commit's payload to path atomically (temporary file, fsync,
 * rename, directory fsync). KOLO_ESYSTEM with the detail in eb. */
kolo_status_t kolo_durable_write(const char *path, const void *data, size_t len, int64_t commit,
                                 struct kolo_errbuf *eb);
/* Reads path: *data (malloc'd, the caller frees), *len, *commit.
 * KOLO_ENOTFOUND when there is no file, KOLO_EINVAL when it is not a whole,
 * intact durable commit (truncated, a bad checksum, another version),
 * KOLO_ESYSTEM or KOLO_ENOMEM. */
kolo_status_t kolo_durable_read(const char *path, void **data, size_t *len, int64_t *commit,
                                struct kolo_errbuf *eb);

struct kolo_durable_writer;

/* Called on the writer's thread after each write (st: KOLO_OK or the
 * failure, detail in err). */
typedef void (*kolo_durable_written_fn)(void *arg, int64_t commit, size_t len, kolo_status_t st,
                                        const char *err);

kolo_status_t kolo_durable_writer_create(const char *path, kolo_durable_written_fn fn, void *arg,
                                         struct kolo_durable_writer **out);
/* Copies the payload and returns; the thread writes it when it is free,
 * unless a newer put replaces it first. KOLO_ENOMEM. */
kolo_status_t kolo_durable_writer_put(struct kolo_durable_writer *w, const void *data, size_t len,
                                      int64_t commit);
/* Waits up to wait_ms for the write in progress and the one waiting (a
 * worker about to be preempted); the thread goes on. true when both are
 * done. Accepts NULL. */
bool kolo_durable_writer_wait(struct kolo_durable_writer *w, int wait_ms);
/* Waits up to wait_ms for the write in progress and the one waiting, then
 * stops the thread and frees. A writer still busy after wait_ms is left to
 * finish on its own (false); true when it was stopped. Accepts NULL. */
bool kolo_durable_writer_destroy(struct kolo_durable_writer *w, int wait_ms);

#endif /* KOLO_ELASTIC_DURABLE_H */
