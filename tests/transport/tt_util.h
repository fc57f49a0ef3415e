/* Helpers of the transport conformance and fault tests: a table of the
 * transports under test, endpoint pairs and bounded progress loops. */
#ifndef KOLO_TT_UTIL_H
#define KOLO_TT_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "transport.h"
#include "transport_verbs.h"

/* Most ranks a test may use with a transport that has a host layout. */
#define TT_MAX_RANKS 4

struct tt_transport {
	const char *name;
	const struct kolo_transport_ops *ops;
	/* false: a post after abort() or on a failed conn is not yet refused
	 * (a known gap of that transport; the check is skipped for it). */
	bool posts_fail_after_error;
	/* The hybrid's host layout: same_host[r][q], whether ranks r and q
	 * pretend to share a host (cfg.same_host of rank r); NULL: none. */
	const bool (*same_host)[TT_MAX_RANKS];
	/* Verbs: the emulation's options (tt_config enables it); NULL for the
	 * other transports. The emulation tests the protocol, not a NIC. */
	const struct kolo_verbs_emu_opts *verbs_emu;
	/* The hybrid's transport between hosts (NULL: TCP). */
	const struct kolo_transport_ops *net;
};

/* Every transport the suites run against. */
extern const struct tt_transport tt_transports[];
extern const int tt_ntransports;

#define TT_JOB   "tt-job"
#define TT_TOKEN "tt-secret"
#define TT_ROUND 3

/* A config on 127.0.0.1 for `rank` of `size`, job TT_JOB, round TT_ROUND,
 * token TT_TOKEN, with tr's host layout (tr may be NULL: none). */
struct kolo_transport_config tt_config(const struct tt_transport *tr, int rank, int size,
                                       int streams, int timeout_ms);
/* create + listen; aborts the test on failure. */
struct kolo_transport *tt_open(const struct kolo_transport_ops *ops,
                               const struct kolo_transport_config *cfg,
                               struct kolo_transport_handle *h);

/* Two endpoints (ranks 0 and 1 of 2), a connected to b with tag 7:
 * ab is a's conn, ba is b's. */
struct tt_pair {
	const struct kolo_transport_ops *ops;
	struct kolo_transport *a, *b;
	struct kolo_transport_handle ha, hb;
	struct kolo_conn *ab, *ba;
};
void tt_pair_open(struct tt_pair *p, const struct tt_transport *tr, int streams, int timeout_ms);
void tt_pair_close(struct tt_pair *p);

/* Accepts (peer, tag) on t, driving every transport in ts meanwhile. NULL
 * after timeout_ms. */
struct kolo_conn *tt_accept(struct kolo_transport *t, int peer, int tag, struct kolo_transport **ts,
                            int nt, int timeout_ms);

/* Tests every request in reqs until all are released, driving ts with
 * wait(1 ms) when nothing moved. reqs[i] becomes NULL when released, with
 * its status in sts[i] (sts may be NULL). Returns the first failure, or
 * KOLO_ETIMEDOUT (reqs left) after timeout_ms. */
kolo_status_t tt_drive(struct kolo_transport **ts, int nt, struct kolo_req **reqs,
                       kolo_status_t *sts, int n, int timeout_ms);

/* Deterministic byte pattern and its check (index of the first wrong byte,
 * or -1). */
void tt_fill(void *buf, size_t len, uint32_t seed);
long long tt_check(const void *buf, size_t len, uint32_t seed);
/* malloc that fails the test on error. */
void *tt_alloc(size_t len);

#endif
