/* flight: the flight recorder. Every comm (the job's and each process set's)
 * keeps a ring buffer of its most recent collectives: a local sequence
 * number, the agreed position among the comm's collectives (cseq, the same
 * on every rank), name, op, dtype, bytes, state and when it entered each
 * state. Beside the entries, what the comm's data plane is blocked on now:
 * the peer and since when. It is always on and cheap: a transition is a few
 * stores under an uncontended lock, and the data plane writes only when a
 * wait blocks (after its spin), never on a wait answered while spinning.
 *
 * Readers (the metrics endpoint, the SIGUSR1 and fatal-error dumps, the
 * diagnosis reporter) take a snapshot as JSON from any thread; a reader never
 * waits for a collective. docs/diagnosis.md is the format's contract. */
#ifndef KOLO_FLIGHT_H
#define KOLO_FLIGHT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core.h"

enum kolo_flight_state {
	KOLO_FL_SUBMITTED,  /* the caller handed it over */
	KOLO_FL_NEGOTIATED, /* every rank submitted it; its place in the order is cseq */
	KOLO_FL_DATAPLANE,  /* its bytes are moving */
	KOLO_FL_DONE,
	KOLO_FL_FAILED,
	KOLO_FL_NSTATES
};

/* What the comm's collective thread is doing (the engine's, or a blocking
 * call's caller). */
enum kolo_flight_activity {
	KOLO_FA_IDLE,
	KOLO_FA_NEGOTIATING, /* the engine exchanges what each rank submitted */
	KOLO_FA_EXECUTING,   /* the engine runs negotiated collectives */
	KOLO_FA_BLOCKING,    /* a blocking collective runs on the caller's thread */
};

#define KOLO_FLIGHT_ENTRIES  256 /* entries kept per comm */
#define KOLO_FLIGHT_NAME_MAX 96  /* bytes of a name kept (longer names are cut) */

struct kolo_flight;

/* A recorder for a comm labelled label ("job", "set 1") of size ranks, this
 * rank being rank; members[i] is the job rank of member i (NULL: identity).
 * Registered in the process's list of recorders until destroyed. NULL when
 * out of memory: every call below accepts a NULL recorder and does nothing. */
struct kolo_flight *kolo_flight_create(const char *label, int rank, int size, const int *members);
void kolo_flight_destroy(struct kolo_flight *f);
/* A new round (elastic re-form), or a comm that turned out to be a process
 * set: its label (NULL: unchanged), rank, size and members change; the
 * entries stay. */
void kolo_flight_reset_members(struct kolo_flight *f, const char *label, int rank, int size,
                               const int *members);

/* A new collective: returns its sequence number (1, 2, ...), 0 for a NULL
 * recorder. op is a static string ("allreduce"). */
uint64_t kolo_flight_submit(struct kolo_flight *f, const char *name, const char *op, int dtype,
                            uint64_t bytes);
/* A blocking collective that runs at once (no negotiation): one entry
 * named "<op>.<number>" (the name is formatted only when rendered), already
 * negotiated and in the data plane. The cheapest record: one lock. */
uint64_t kolo_flight_submit_running(struct kolo_flight *f, const char *op, uint64_t number,
                                    int dtype, uint64_t bytes);
/* Moves entry seq to state (NEGOTIATED gives it the next cseq; DONE and
 * FAILED take st and, for FAILED, the message). An entry that has left the
 * buffer is ignored. */
void kolo_flight_mark(struct kolo_flight *f, uint64_t seq, enum kolo_flight_state state,
                      kolo_status_t st, const char *msg);
void kolo_flight_activity(struct kolo_flight *f, enum kolo_flight_activity a);
/* The data plane blocked (after its spin) waiting for peer (a rank of the
 * comm, shown as its job rank; -1: not known), or, with blocked false, is no longer blocked. */
void kolo_flight_waiting(struct kolo_flight *f, bool blocked, int peer);
/* While blocked: how long the liveness probe to that peer's host has waited
 * for an acknowledgement (0: nothing outstanding; it is a network path that
 * stopped answering or all but stalled when it grows). */
void kolo_flight_waiting_unacked(struct kolo_flight *f, int ms);

/* ---- arrival lags (stragglers) ------------------------------------------
 * For every negotiated collective, when each rank's submission was seen:
 * a rank's lag is how long after the first rank's its submission arrived,
 * i.e. how long the others waited for it. The recorder keeps the last
 * KOLO_FLIGHT_LAG_WINDOW collectives' lags per rank, and which rank arrived
 * last (by at least KOLO_FLIGHT_LAST_MIN_MS; none otherwise). */
#define KOLO_FLIGHT_LAG_WINDOW  256
#define KOLO_FLIGHT_LAST_MIN_MS 0.5
/* arrive[r]: kolo_now_ns() of the cycle that first saw rank r's submission,
 * 0 for a rank that took no part (joined); n ranks (the comm's size). */
void kolo_flight_lags(struct kolo_flight *f, const uint64_t *arrive, int n);
/* Each rank's lags summed (ms) since the comm last changed size, into
 * out[n]: how long the others waited for each rank in all. false (zeros)
 * when no lag of a comm of n ranks was recorded. */
bool kolo_flight_lag_totals(struct kolo_flight *f, double *out, int n);
struct kolo_flight_lag {
	int rank; /* a job rank */
	int ops;  /* collectives in the window */
	int last; /* of them, those where this rank arrived last */
	double p50_ms, p90_ms, max_ms;
};
/* The rank of comm label (NULL: the job's comm, "job") that arrived last most
 * often in the window, with its lags; false when there is no such comm or
 * no collective arrived with a lag. */
bool kolo_flight_slowest(const char *label, struct kolo_flight_lag *out);
struct kolo_metrics_text;
/* The lags as Prometheus gauges (kolo_arrival_lag_seconds by quantile,
 * kolo_arrival_last_ratio), per comm and rank. */
void kolo_flight_metrics(struct kolo_metrics_text *t);

/* Seconds since the oldest open entry of any recorder of the process was
 * submitted, or 0 when none is open. */
double kolo_flight_oldest_open_s(void);

/* The snapshot of every recorder of the process, as JSON (docs/diagnosis.md):
 * identity fields, then "comms". max_entries bounds the entries per comm
 * (the newest; 0: all). *out is malloc'd. */
struct kolo_flight_identity {
	int rank, size;
	int64_t round;
	const char *host, *job;
	uint64_t gen; /* the diagnosis request answered, 0: none */
	const char *reason;
	const char *peers; /* a JSON array of the host's other ranks' processes, or NULL */
};
kolo_status_t kolo_flight_render(const struct kolo_flight_identity *id, int max_entries, char **out,
                                 size_t *len);
/* Writes the snapshot to dir/kolo-flight-<job>-<rank>-<pid>.json (atomically,
 * through a temporary file); the path in path (≥ 512 bytes). */
kolo_status_t kolo_flight_dump(const struct kolo_flight_identity *id, const char *dir, char *path,
                               size_t path_size);

const char *kolo_flight_state_name(enum kolo_flight_state s);

#endif /* KOLO_FLIGHT_H */
