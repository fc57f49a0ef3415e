/* bytes: a growable byte buffer kept NUL-terminated, for bodies read in
 * pieces (the rendezvous server's requests, the client's replies). */
#ifndef KOLO_BYTES_H
#define KOLO_BYTES_H

#include <stdbool.h>
#include <stddef.h>

/* Appends n bytes of data to *buf (*len used of *cap allocated) and a NUL
 * after them, growing the buffer to at least twice its size and at least
 * min_cap. false without memory, the buffer unchanged. *buf NULL with *len
 * and *cap 0 is an empty buffer; the caller frees *buf. */
bool kolo_bytes_append(char **buf, size_t *len, size_t *cap, const void *data, size_t n,
                       size_t min_cap);

#endif /* KOLO_BYTES_H */
