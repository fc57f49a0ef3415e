/* kolo elastic API: keep training when workers join or leave.
 *
 * An elastic job (KOLO_ELASTIC=1, e.g. `kolorun --min-np A --max-np B`)
 * survives membership changes without restarting the survivors. When a
 * worker dies, every pending and later collective on every survivor fails
 * fast with KOLO_EMEMBERSHIP; kolo_reform() then takes the comm to the next
 * membership round (survivors keep their order, rank 0 stays on the oldest
 * survivor). A worker that joins a running job is added at the members' next
 * commit point, without a failure and without rolling back. SIGTERM (a spot
 * reclaim) makes a worker leave at its next commit point.
 *
 * The training state (parameters, optimiser moments, counters) is registered
 * in a kolo_state_t: commit copies it to host memory, restore goes back to
 * the last commit, sync broadcasts rank 0's copy to everyone (new members
 * included). kolo_elastic_run() runs a training function in Horovod's
 * hvd.elastic.run loop. See docs/elastic.md. */
#ifndef KOLO_ELASTIC_H
#define KOLO_ELASTIC_H

#include <stdbool.h>

#include "kolo/kolo.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kolo_state kolo_state_t;

/* true when the comm was created in elastic mode (KOLO_ELASTIC=1). */
KOLO_API bool kolo_elastic_enabled(const kolo_comm_t *comm);

/* Takes the comm to the next membership round: aborts whatever still runs
 * on it (fusion engine included), closes the ring and the transport, reports
 * the peer whose connection failed (once it is known to be dead), waits for
 * the next round (up to KOLO_ELASTIC_TIMEOUT_MS), then creates the transport
 * and the ring of the new round. Rank, size and round change; the process
 * and the comm handle stay. Blocking; not to be called concurrently with a
 * collective on the same comm. KOLO_ETIMEDOUT (with a message naming min-np)
 * when no round including this worker formed in time. KOLO_ESHUTDOWN when
 * SIGTERM (or kolo_elastic_leave) came while it waited: the worker has then
 * left the job, within about a second of the signal; also when the job
 * finished while it waited (another worker's kolo_elastic_done). */
KOLO_API kolo_status_t kolo_reform(kolo_comm_t *comm);

/* A new, empty state bound to comm. Returns KOLO_ENOMEM / KOLO_EINVAL. */
KOLO_API kolo_status_t kolo_state_create(kolo_comm_t *comm, kolo_state_t **out);
/* Frees the state (not the registered buffers). Accepts NULL. */
KOLO_API void kolo_state_destroy(kolo_state_t *state);
/* Registers count elements of dtype at buf as part of the state, under a
 * unique name. Every rank (and every worker that joins later) must register
 * the same names, counts and dtypes in the same order. buf stays the
 * caller's and must outlive the state. */
KOLO_API kolo_status_t kolo_state_register(kolo_state_t *state, const char *name, void *buf,
                                           size_t count, kolo_dtype_t dtype);
/* Copies every registered buffer to host memory, then agrees with the other
 * ranks (one small allreduce) whether a membership change is pending: a
 * worker waiting to join, or a rank asked to leave (SIGTERM). Returns KOLO_OK
 * when nothing is pending, KOLO_EMEMBERSHIP when the comm must re-form (the
 * commit is kept; kolo_elastic_run re-forms without restoring), or the
 * collective's failure. Every rank must call it at the same points. */
KOLO_API kolo_status_t kolo_state_commit(kolo_state_t *state);
/* Copies the last commit back into the registered buffers. Local. */
KOLO_API kolo_status_t kolo_state_restore(kolo_state_t *state);
/* Broadcasts every registered buffer from rank 0 and commits the result.
 * The first sync of a state on rank 0 takes the job's durable commit, when
 * there is one, into the buffers first (see kolo_durable_resume). */
KOLO_API kolo_status_t kolo_state_sync(kolo_state_t *state);
/* true after this worker left the job at a commit point (SIGTERM or
 * kolo_elastic_leave()), or the job finished while it waited in
 * kolo_reform(); it should then finalize and exit 0. */
KOLO_API bool kolo_state_left(const kolo_state_t *state);

/* Durable commits (KOLO_DURABLE_DIR, docs/durable.md): every
 * KOLO_DURABLE_EVERY-th commit, rank 0 writes the committed state to
 * <dir>/kolo-<job>.state in the background; a job whose every worker was
 * lost resumes from it. A state with registered buffers does it itself
 * (kolo_state_commit writes them, kolo_state_sync resumes them); a state
 * without (a binding that keeps the state itself) uses the three calls
 * below. */

/* The number of the last commit: the same on every rank (a joiner learns it
 * at its first commit), continued from a durable commit resumed. */
KOLO_API int64_t kolo_state_commit_number(const kolo_state_t *state);
/* true when the last commit is a durable one that this rank writes (rank
 * 0, KOLO_DURABLE_DIR set, a multiple of KOLO_DURABLE_EVERY). */
KOLO_API bool kolo_durable_due(const kolo_state_t *state);
/* Copies len bytes (the caller's serialised committed state) and returns at
 * once: a background thread writes them as the last commit's durable
 * commit, a newer put replacing one not yet started. Does nothing
 * (KOLO_OK) unless KOLO_DURABLE_DIR is set and this is rank 0. A write that
 * fails is logged, never fatal; kolo_finalize waits for the last one. */
KOLO_API kolo_status_t kolo_durable_put(kolo_state_t *state, const void *data, size_t len);
/* Before the state's first sync: on rank 0 of a state that never
 * committed, the job's durable commit: *data (free with kolo_free), *len
 * and its *commit, from which the state's commit numbers go on. KOLO_OK,
 * KOLO_ENOTFOUND (not rank 0, already committed, durable commits off, no
 * file), or KOLO_EINVAL for a damaged file (it is not overwritten; delete
 * it to start over). */
KOLO_API kolo_status_t kolo_durable_resume(kolo_state_t *state, void **data, size_t *len,
                                           int64_t *commit);

/* The exit status of a worker evicted as a straggler (KOLO_STRAGGLER_EVICT_PCT,
 * docs/diagnosis.md): kolorun does not restart it, and a Kubernetes pod
 * failure policy can match it. */
#define KOLO_EXIT_EVICTED 90
/* true after the job's straggler policy evicted this worker at a commit
 * point (kolo_state_left() is then true too); it should finalize and exit
 * with KOLO_EXIT_EVICTED, and must not join the job again. */
KOLO_API bool kolo_elastic_evicted(const kolo_comm_t *comm);

/* Asks this worker to leave the job at its next commit point, as SIGTERM
 * does in an elastic worker. Thread-safe and async-signal-safe. */
KOLO_API void kolo_elastic_leave(void);
/* true once this worker was asked to leave: SIGTERM in an elastic worker,
 * kolo_elastic_leave() or a preemption notice. When kolo_init returned
 * KOLO_ESHUTDOWN, it tells a worker that left before it got a rank (true)
 * from one whose job finished while it waited (false). */
KOLO_API bool kolo_elastic_leaving(void);

/* The preemption notices this process saw (KOLO_PREEMPTION, docs/spot.md):
 * 0 none; 1 an early hint (AWS's rebalance recommendation: logged, the
 * worker stays); 2 a notice (the worker leaves at its next commit point, as
 * on SIGTERM). buf (may be NULL) gets one line naming the provider and the
 * notice, e.g. "aws: spot instance-action terminate at 2026-...". */
KOLO_API int kolo_elastic_preemption(char *buf, size_t len);
/* Milliseconds left until the deadline of that notice (AWS's instance-action
 * time, GCE's 30 s from the notice, Azure's NotBefore, the pod's
 * deletionTimestamp), 0 once it passed, -1 with no notice or a notice
 * without a deadline. A training loop may commit early when it is short: a
 * worker that has not reached a commit point KOLO_PREEMPTION_MARGIN_MS
 * before the deadline leaves the job at once and its process exits 0 (the
 * others restore their last commit). Thread-safe. */
KOLO_API int64_t kolo_elastic_preemption_deadline_ms(void);

/* The training function run by kolo_elastic_run: it reads the state it needs
 * (it has been synced), trains, calls kolo_state_commit() at its commit
 * points and returns the first failure of a collective or of a commit, or
 * KOLO_OK when training is done. */
typedef kolo_status_t (*kolo_train_fn)(kolo_comm_t *comm, kolo_state_t *state, void *arg);

/* Horovod's hvd.elastic.run for C: sync, then fn. When fn fails with
 * KOLO_EMEMBERSHIP, KOLO_EPEER or KOLO_ETIMEDOUT: restore the last commit
 * (not when the change was announced at a commit), kolo_reform(), sync and
 * call fn again. Stops after KOLO_ELASTIC_RESET_LIMIT re-forms (0: no limit)
 * or when kolo_reform() fails. Returns KOLO_OK when fn finished,
 * KOLO_ESHUTDOWN when this worker left the job (exit 0), else the error
 * (detail in kolo_last_error()). */
KOLO_API kolo_status_t kolo_elastic_run(kolo_comm_t *comm, kolo_state_t *state, kolo_train_fn fn,
                                        void *arg);
/* Says that this worker's training is complete (kolo_elastic_run says so
 * itself when fn returns KOLO_OK): its kolo_finalize() then tells the
 * rendezvous that the job finished. No round forms after that, and workers
 * still waiting to join the job (spares beyond max-np, evicted workers) end
 * their wait with KOLO_ESHUTDOWN and should exit 0. Not for a worker that
 * stops early on its own: the whole job ends with it. */
KOLO_API void kolo_elastic_done(kolo_comm_t *comm);
/* Re-forms this comm has done since kolo_init(). */
KOLO_API int kolo_elastic_resets(const kolo_comm_t *comm);

#ifdef __cplusplus
}
#endif
#endif /* KOLO_ELASTIC_H */
