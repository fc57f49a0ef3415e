/* elastic: the membership side of elastic training, below the runtime.
 *
 * - The state registry: the buffers that make up training state and their
 *   host-memory copies (commit / restore). Pure; the runtime does the
 *   broadcasts of sync.
 * - Failure arbitration through the rendezvous KV: a rank that sees a ring
 *   failure publishes "elastic/<round>/alive/<rank>" and "elastic/<round>/
 *   change"; the peer it suspects is reported dead only when its own alive key
 *   does not appear within confirm_ms. A ring failure cascades (a rank that
 *   fails resets all its conns), so the suspect of most ranks is a live rank
 *   that failed in turn; only the real dead one never publishes.
 * - The watcher thread: long-polls the change key of the comm's round and
 *   reads the heartbeat state, and calls back (to abort the ring) when the
 *   membership changed; it also turns SIGTERM into a leave.
 *
 * Uses the rendezvous client and core only; the runtime composes it. */
#ifndef KOLO_ELASTIC_MEMBERSHIP_H
#define KOLO_ELASTIC_MEMBERSHIP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core.h"
#include "rendezvous.h"

/* ---- state registry ----------------------------------------------------- */

#define KOLO_ELASTIC_NAME_MAX 128

struct kolo_elastic_buf {
	char name[KOLO_ELASTIC_NAME_MAX];
	void *buf; /* the caller's */
	size_t count;
	kolo_dtype_t dtype;
	size_t bytes;
	void *saved; /* host copy of the last commit; owned */
};

struct kolo_elastic_state {
	struct kolo_elastic_buf *bufs;
	size_t n, cap;
	bool saved; /* a commit exists */
};

void kolo_elastic_state_init(struct kolo_elastic_state *s);
void kolo_elastic_state_fini(struct kolo_elastic_state *s);
/* Adds a buffer. KOLO_EINVAL for a duplicate or bad name/dtype, KOLO_ENOMEM. */
kolo_status_t kolo_elastic_state_add(struct kolo_elastic_state *s, const char *name, void *buf,
                                     size_t count, kolo_dtype_t dtype, struct kolo_errbuf *eb);
/* Copies every buffer into its host copy (commit). */
void kolo_elastic_state_save(struct kolo_elastic_state *s);
/* Copies the host copies back (restore). KOLO_EINVAL when nothing was saved. */
kolo_status_t kolo_elastic_state_load(struct kolo_elastic_state *s);
/* The host copies with their names, dtypes and counts in one malloc'd
 * buffer (a durable commit, durable.h). KOLO_ENOMEM. */
kolo_status_t kolo_elastic_state_pack(const struct kolo_elastic_state *s, void **out, size_t *len);
/* Copies a packed registry into the registered buffers (not the host
 * copies). KOLO_EMISMATCH, changing nothing, when its buffers are not the
 * registered ones (names, dtypes, counts, in order). */
kolo_status_t kolo_elastic_state_unpack(struct kolo_elastic_state *s, const void *data, size_t len,
                                        struct kolo_errbuf *eb);

/* ---- arbitration (KV keys; any thread, with its own client) -------------- */

/* "elastic/<round>/alive/<rank>" and "elastic/<round>/change". */
void kolo_elastic_key_alive(char *out, size_t size, int64_t round, int rank);
void kolo_elastic_key_change(char *out, size_t size, int64_t round);
/* Publishes that `rank` is alive in `round` (it saw the round end), and when
 * change is true that the round is over, which wakes every watcher. */
kolo_status_t kolo_elastic_announce(struct kolo_rdzv_client *c, int64_t round, int rank,
                                    bool change);
/* Waits up to confirm_ms for suspect's alive key of round. *dead is true when
 * it never appeared (then the caller reports it). */
kolo_status_t kolo_elastic_confirm_dead(struct kolo_rdzv_client *c, int64_t round, int suspect,
                                        int confirm_ms, bool *dead);

/* ---- SIGTERM -------------------------------------------------------------- */

/* Installs the SIGTERM handler once per process (flag + pipe; the handler
 * does nothing else). */
kolo_status_t kolo_elastic_signal_install(void);
/* Async-signal-safe: what the handler does. */
void kolo_elastic_request_leave(void);
bool kolo_elastic_leave_requested(void);
/* kolo_elastic_leave_requested() as a rendezvous cancel hook
 * (kolo_rdzv_set_cancel): a leave ends the client's waits. */
bool kolo_elastic_leave_cancels(void *arg);
/* Clears the request once the worker left (tests that reuse a process). */
void kolo_elastic_leave_clear(void);

/* ---- the watcher ------------------------------------------------------- */

struct kolo_elastic_config {
	const char *url, *job, *token, *host; /* for the watcher's own client */
	struct kolo_rdzv_client *member;      /* the worker's client: heartbeat state */
	int poll_ms;                          /* long-poll slice of the watcher */
	int leave_grace_ms;                   /* after SIGTERM, leave at once when no commit came */
	int hang_ms; /* leave when the training thread has not re-formed this long after the
	                change callback ran (0: never) */
	/* Called on the watcher thread when round's membership changed (leave:
	 * this worker must leave now). Must not block. */
	void (*on_change)(void *arg, int64_t round, bool leave);
	void *arg;
};

struct kolo_elastic;

/* Starts the watcher thread (idle until kolo_elastic_watch). */
kolo_status_t kolo_elastic_create(const struct kolo_elastic_config *cfg, struct kolo_elastic **out,
                                  struct kolo_errbuf *eb);
/* Stops the thread (within one poll slice) and frees. Accepts NULL. */
void kolo_elastic_destroy(struct kolo_elastic *e);
/* Watches round (as rank); round 0 pauses the watch (during a re-form). */
void kolo_elastic_watch(struct kolo_elastic *e, int64_t round, int rank);
/* Tells the watcher the worker left at a commit point (no forced leave). */
void kolo_elastic_left(struct kolo_elastic *e);
/* true (once) when the watcher took the worker out of the job because its
 * training thread did not re-form within hang_ms; it must join again. */
bool kolo_elastic_take_dropped(struct kolo_elastic *e);

#endif /* KOLO_ELASTIC_MEMBERSHIP_H */
