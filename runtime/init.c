/* kolo_init / kolo_finalize: the bootstrap. Parameters → rendezvous client →
 * assignment → heartbeat → transport listening, its handle published in the
 * KV under "addr/<round>/<rank>" → ring comm whose peer lookup reads that
 * key. */
#include "runtime.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "fusion.h"
#include "hybrid.h"
#include "membership.h"
#include "metrics.h"
#include "transport_shm.h"
#include "transport_tcp.h"

#define SUBSYS "init"

static _Thread_local char init_error[KOLO_ERRBUF_SIZE];

KOLO_API const char *kolo_init_error(void)
{
	return init_error;
}

kolo_status_t kolo_comm_fail(struct kolo_comm *comm, kolo_status_t st, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	kolo_vfail(comm ? &comm->err : NULL, st, fmt, ap);
	va_end(ap);
	return st;
}

/* The host part of a rendezvous URL ("http://[::1]:29470/" → "::1"). */
static void url_host(const char *url, char *out, size_t size)
{
	const char *p = strstr(url, "://");
	p = p ? p + 3 : url;
	const char *end;
	if (*p == '[') {
		p++;
		end = strchr(p, ']');
	} else {
		end = p + strcspn(p, ":/");
	}
	size_t n = end ? (size_t)(end - p) : strlen(p);
	if (n >= size)
		n = size - 1;
	memcpy(out, p, n);
	out[n] = '\0';
}

/* One line to the launcher, if there is one. */
static void launcher_line(const char *line, const char *what)
{
	int64_t fd = kolo_param_int(KOLO_P_LAUNCHER_FD);
	if (fd < 0 || fd > INT32_MAX)
		return;
	size_t n = strlen(line);
	/* One write of a short line on a pipe is atomic. A launcher that went
	 * away is not our failure. */
	if (write((int)fd, line, n) != (ssize_t)n)
		KOLO_DEBUG(SUBSYS, "cannot report the %s to the launcher (fd %d): %s", what,
		           (int)fd, strerror(errno));
}

kolo_status_t kolo_runtime_report_rank(const struct kolo_comm *comm)
{
	kolo_runtime_diag_identity(comm);
	kolo_metrics_set_assignment(comm->assignment.rank, comm->assignment.size,
	                            comm->assignment.local_rank, comm->assignment.round);
	char line[96];
	snprintf(line, sizeof(line), "rank %d size %d round %" PRId64 "\n", comm->assignment.rank,
	         comm->assignment.size, comm->assignment.round);
	launcher_line(line, "rank");
	return KOLO_OK;
}

void kolo_runtime_report_worker(const struct kolo_comm *comm)
{
	char line[KOLO_RDZV_ID_MAX + 16];
	snprintf(line, sizeof(line), "worker %s\n", kolo_rdzv_worker_id(comm->rdzv));
	launcher_line(line, "worker id");
}

static kolo_status_t lookup_peer(void *ctx, int rank, struct kolo_transport_handle *out,
                                 int timeout_ms)
{
	struct kolo_comm *comm = ctx;
	if (comm->cards) {
		if (rank < 0 || rank >= comm->assignment.size)
			return kolo_comm_fail(comm, KOLO_EINVAL, "no card for rank %d", rank);
		*out = comm->cards[rank];
		return KOLO_OK;
	}
	char key[64];
	snprintf(key, sizeof(key), "addr/%" PRId64 "/%d", comm->assignment.round, rank);
	void *data = NULL;
	size_t len = 0;
	kolo_status_t st = kolo_rdzv_kv_get(comm->rdzv, key, timeout_ms, &data, &len);
	if (st != KOLO_OK)
		return kolo_comm_fail(comm, st, "looking up rank %d's address: %s", rank,
		                      kolo_rdzv_client_error(comm->rdzv));
	if (len != sizeof(*out)) {
		free(data);
		return kolo_comm_fail(comm, KOLO_EPROTO,
		                      "KV %s holds %zu bytes, not a %zu-byte handle", key, len,
		                      sizeof(*out));
	}
	memcpy(out->bytes, data, sizeof(*out));
	free(data);
	return KOLO_OK;
}

bool kolo_runtime_param_is(enum kolo_param_id id, const char *a, const char *b, const char *c)
{
	const char *v = kolo_param_str(id);
	return strcasecmp(v, a) == 0 || strcasecmp(v, b) == 0 || strcasecmp(v, c) == 0;
}

/* Whether a waiting rank yields its CPU while it spins: by default when this
 * host runs more ranks than the CPUs one rank may use (its affinity mask,
 * capped by a container's CPU quota), where the peer whose
 * data we wait for may be runnable on our CPU (docs/performance.md). */
static bool spin_yield(const struct kolo_rdzv_assignment *a)
{
	if (kolo_runtime_param_is(KOLO_P_SPIN_YIELD, "1", "on", "true"))
		return true;
	if (kolo_runtime_param_is(KOLO_P_SPIN_YIELD, "0", "off", "false"))
		return false;
	return a->local_size > kolo_cpu_count();
}

/* Peers on this host go through shared memory unless KOLO_SHM=0. */
static bool shm_enabled(void)
{
	return !kolo_runtime_param_is(KOLO_P_SHM, "0", "off", "false");
}

/* The ring's pipeline segment: KOLO_SEGMENT_BYTES, or by default 64 KiB for
 * a ring whose hops all go through shared memory (a copy through memory
 * costs little per message, so a deeper pipeline wins) and 256 KiB where a
 * hop is TCP (each message costs system calls). docs/collectives.md. */
static size_t segment_bytes(bool all_shm)
{
	int64_t v = kolo_param_int(KOLO_P_SEGMENT_BYTES);
	if (v > 0)
		return (size_t)v;
	return all_shm ? 64u << 10 : 256u << 10;
}

/* The transport configuration for the current assignment (the data plane's
 * and the p2p endpoint's). */
void kolo_runtime_transport_config(struct kolo_comm *comm, struct kolo_transport_config *out)
{
	const struct kolo_rdzv_assignment *a = &comm->assignment;
	*out = (struct kolo_transport_config){
	        .job = comm->job,
	        .round = a->round,
	        .rank = a->rank,
	        .size = a->size,
	        .token = (const uint8_t *)comm->token,
	        .token_len = strlen(comm->token),
	        .timeout_ms = comm->timeout_ms,
	        .streams = (int)KOLO_MAX(kolo_param_int(KOLO_P_TCP_STREAMS), 0),
	        .iface = kolo_param_str(KOLO_P_IFACE),
	        .route_to = comm->route_to[0] ? comm->route_to : NULL,
	        .socket_buffer = (int)kolo_param_int(KOLO_P_SOCKET_BUFFER),
	        .spin_us = (int)kolo_param_int(KOLO_P_SPIN_US),
	        .probe_ms = (int)KOLO_MIN(KOLO_MAX(kolo_param_int(KOLO_P_PROBE_MS), 0), INT32_MAX),
	        .probe_timeout_ms = (int)KOLO_MIN(
	                KOLO_MAX(kolo_param_int(KOLO_P_PROBE_TIMEOUT_MS), 1), INT32_MAX),
	        .tcp_chunk_bytes = (size_t)KOLO_MAX(kolo_param_int(KOLO_P_TCP_CHUNK_BYTES), 0),
	        .shm_ring_bytes = (size_t)KOLO_MAX(kolo_param_int(KOLO_P_SHM_BUFFER), 0),
	        .ib_device = kolo_param_str(KOLO_P_IB_DEVICE),
	        .ib_port = (int)KOLO_MAX(kolo_param_int(KOLO_P_IB_PORT), 0),
	        .ib_gid_index = (int)KOLO_MAX(kolo_param_int(KOLO_P_IB_GID_INDEX), -1),
	        .verbs_slots = (int)KOLO_MIN(KOLO_MAX(kolo_param_int(KOLO_P_VERBS_SLOTS), 0), 128),
	        .verbs_slot_bytes = (size_t)KOLO_MAX(kolo_param_int(KOLO_P_VERBS_SLOT_BYTES), 0),
	        .verbs_rdv_bytes = (size_t)KOLO_MAX(kolo_param_int(KOLO_P_VERBS_RDV_BYTES), 0),
	        .verbs_mr_cache = (int)KOLO_MIN(KOLO_MAX(kolo_param_int(KOLO_P_VERBS_MR_CACHE), 0),
	                                        INT32_MAX),
	};
}

/* The transport for the current assignment, listening. */
kolo_status_t kolo_runtime_transport_create(struct kolo_comm *comm,
                                            struct kolo_transport_handle *out)
{
	const struct kolo_rdzv_assignment *a = &comm->assignment;
	const struct kolo_transport_ops *net = NULL;
	kolo_status_t nst = kolo_runtime_net_select(comm, &net);
	if (nst != KOLO_OK)
		return nst;
	struct kolo_transport_config tc;
	kolo_runtime_transport_config(comm, &tc);
	tc.net = net;
	bool *same_host = calloc((size_t)a->size, sizeof(bool));
	if (!same_host)
		return kolo_comm_fail(comm, KOLO_ENOMEM, "out of memory");
	for (int i = 0; i < a->n_members; i++) {
		const struct kolo_rdzv_member *m = &a->members[i];
		if (m->rank >= 0 && m->rank < a->size)
			same_host[m->rank] = strcmp(m->host, comm->host) == 0;
	}
	tc.same_host = shm_enabled() ? same_host : NULL; /* NULL: TCP to everyone */
	struct kolo_errbuf eb = {{0}};
	kolo_status_t st = kolo_transport_hybrid_ops.create(&tc, &comm->transport, &eb);
	free(same_host);
	if (st != KOLO_OK)
		return kolo_comm_fail(comm, st, "creating the transport: %s", eb.msg);
	const struct kolo_transport_ops *ops = comm->transport->ops;
	memset(out, 0, sizeof(*out));
	st = ops->listen(comm->transport, out);
	if (st != KOLO_OK)
		return kolo_comm_fail(comm, st, "%s listen: %s", ops->name,
		                      comm->transport->err.msg);
	return KOLO_OK;
}

/* The ring over comm->transport, and the hierarchy where it pays. */
kolo_status_t kolo_runtime_ring_create(struct kolo_comm *comm)
{
	const struct kolo_rdzv_assignment *a = &comm->assignment;
	bool all_shm = shm_enabled();
	for (int i = 0; i < a->n_members; i++)
		all_shm = all_shm && strcmp(a->members[i].host, comm->host) == 0;
	struct kolo_ring_config rc = {
	        .transport = comm->transport,
	        .rank = a->rank,
	        .size = a->size,
	        .lookup = lookup_peer,
	        .lookup_ctx = comm,
	        .small_allreduce_bytes = (size_t)kolo_param_int(KOLO_P_SMALL_ALLREDUCE_BYTES),
	        .small_direct_ranks =
	                (int)KOLO_MIN(KOLO_MAX(kolo_param_int(KOLO_P_SMALL_DIRECT_RANKS), 0),
	                              KOLO_RING_DIRECT_MAX_RANKS),
	        .small_direct_bytes =
	                (size_t)KOLO_MAX(kolo_param_int(KOLO_P_SMALL_DIRECT_BYTES), 0),
	        .segment_bytes = segment_bytes(all_shm),
	        .timeout_ms = comm->timeout_ms,
	        .spin_us = (int)kolo_param_int(KOLO_P_SPIN_US),
	        .spin_yield = spin_yield(a),
	        .spin_yield_after_us =
	                kolo_runtime_param_is(KOLO_P_SPIN_YIELD, "0", "off", "false") ? 0 : 5,
	        .spin_move = !kolo_runtime_param_is(KOLO_P_SPIN_MOVE, "0", "off", "false") &&
	                     a->local_size <= kolo_cpu_count(),
	};
	kolo_flight_reset_members(comm->flight, NULL, a->rank, a->size, NULL);
	rc.flight = comm->flight;
	struct kolo_errbuf eb = {{0}};
	kolo_status_t st = kolo_ring_comm_create(&rc, &comm->ring, &eb);
	if (st != KOLO_OK)
		return kolo_comm_fail(comm, st, "connecting the ring: %s", eb.msg);
	return kolo_runtime_hierarchy_setup(comm, segment_bytes(shm_enabled()));
}

/* Creates the data plane for the current assignment: transport, its
 * published address, the ring. */
kolo_status_t kolo_runtime_data_plane_create(struct kolo_comm *comm)
{
	const struct kolo_rdzv_assignment *a = &comm->assignment;
	struct kolo_transport_handle handle;
	kolo_status_t st = kolo_runtime_transport_create(comm, &handle);
	if (st != KOLO_OK)
		return st;
	char key[64];
	snprintf(key, sizeof(key), "addr/%" PRId64 "/%d", a->round, a->rank);
	st = kolo_rdzv_kv_put(comm->rdzv, key, handle.bytes, sizeof(handle.bytes));
	if (st != KOLO_OK)
		return kolo_comm_fail(comm, st, "publishing the address: %s",
		                      kolo_rdzv_client_error(comm->rdzv));
	return kolo_runtime_ring_create(comm);
}

struct kolo_comm *kolo_runtime_comm_new(void)
{
	struct kolo_comm *comm = calloc(1, sizeof(*comm));
	if (!comm)
		return NULL;
	pthread_mutex_init(&comm->engine_lock, NULL);
	pthread_mutex_init(&comm->elastic_lock, NULL);
	pthread_mutex_init(&comm->deadline_lock, NULL);
	pthread_mutex_init(&comm->device_lock, NULL);
	pthread_mutex_init(&comm->p2p_lock, NULL);
	atomic_init(&comm->aborted, false);
	if (kolo_param_bool(KOLO_P_FLIGHT_RECORDER))
		comm->flight = kolo_flight_create("job", -1, 0, NULL);
	int64_t to = kolo_param_int(KOLO_P_TIMEOUT_MS);
	comm->timeout_ms = (int)KOLO_MAX(KOLO_MIN(to, INT32_MAX), 1);
	return comm;
}

void kolo_runtime_set_init_error(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(init_error, sizeof(init_error), fmt, ap);
	va_end(ap);
}

void kolo_runtime_comm_free(struct kolo_comm *comm)
{
	if (!comm)
		return;
	kolo_runtime_preempt_disarm(comm);
	kolo_runtime_sets_release(comm);
	kolo_runtime_metrics_stop(comm);
	kolo_runtime_diag_stop(comm);
	kolo_runtime_elastic_stop(comm);
	kolo_runtime_durable_stop(comm);
	kolo_runtime_p2p_destroy(comm, KOLO_ESHUTDOWN, "the comm was freed");
	if (comm->p2p_transport)
		comm->p2p_transport->ops->destroy(comm->p2p_transport);
	kolo_engine_destroy(comm->engine);
	kolo_device_nccl_reset(comm);
	kolo_device_state_destroy(comm->device);
	kolo_ring_comm_destroy(comm->ring);
	kolo_flight_destroy(comm->flight);
	kolo_runtime_straggler_free(comm);
	if (comm->transport)
		comm->transport->ops->destroy(comm->transport);
	kolo_rdzv_client_destroy(comm->rdzv);
	kolo_rdzv_assignment_fini(&comm->assignment);
	pthread_mutex_destroy(&comm->engine_lock);
	pthread_mutex_destroy(&comm->elastic_lock);
	pthread_mutex_destroy(&comm->deadline_lock);
	pthread_mutex_destroy(&comm->p2p_lock);
	pthread_mutex_destroy(&comm->device_lock);
	if (comm->token) {
		memset(comm->token, 0, strlen(comm->token));
		free(comm->token);
	}
	free(comm->cards);
	free(comm->p2p_cards);
	free(comm);
}

kolo_status_t kolo_runtime_init_fail(struct kolo_comm *comm, kolo_status_t st)
{
	snprintf(init_error, sizeof(init_error), "%s", comm->err.msg);
	if (st == KOLO_ESHUTDOWN) /* the job finished before this worker was in a round */
		KOLO_INFO(SUBSYS, "kolo_init: %s", init_error);
	else
		KOLO_ERROR(SUBSYS, "kolo_init failed: %s: %s", kolo_strerror(st), init_error);
	/* Leave so that the others form their round without us at once (not
	 * when the server is unreachable: that would only wait again). */
	if (comm->rdzv && st != KOLO_ERENDEZVOUS && st != KOLO_EAUTH)
		kolo_rdzv_leave(comm->rdzv);
	kolo_runtime_comm_free(comm);
	return st;
}

/* An elastic worker may be reclaimed while it waits for its first round,
 * which can take until the others reach a commit point or replacements
 * come: SIGTERM (or kolo_elastic_leave) ends the join and the wait within
 * a second, and the worker leaves the waiting list at once rather than
 * being assigned a rank it will never take up. */
static void elastic_wait_cancellable(struct kolo_comm *comm)
{
	if (kolo_elastic_signal_install() != KOLO_OK)
		KOLO_WARN(SUBSYS, "cannot install the SIGTERM handler; a reclaim will look like a "
		                  "failure");
	kolo_rdzv_set_cancel(comm->rdzv, kolo_elastic_leave_cancels, NULL);
}

/* Clears the cancel hook; true when the join or the wait (status st) ended
 * because this worker was asked to leave: comm->err then says so, and the
 * leave that kolo_runtime_init_fail sends goes through. */
static bool left_before_rank(struct kolo_comm *comm, bool elastic, kolo_status_t st)
{
	kolo_rdzv_set_cancel(comm->rdzv, NULL, NULL);
	if (!elastic || st != KOLO_ESHUTDOWN || !kolo_elastic_leave_requested())
		return false;
	kolo_comm_fail(comm, KOLO_ESHUTDOWN,
	               "this worker left job %s before it got a rank (SIGTERM or "
	               "kolo_elastic_leave)",
	               kolo_param_str(KOLO_P_JOB));
	return true;
}

KOLO_API kolo_status_t kolo_init(kolo_comm_t **out)
{
	init_error[0] = '\0';
	if (!out) {
		snprintf(init_error, sizeof(init_error), "kolo_init: comm is NULL");
		return KOLO_EINVAL;
	}
	*out = NULL;
	kolo_log_configure();
	struct kolo_comm *comm = kolo_runtime_comm_new();
	if (!comm) {
		snprintf(init_error, sizeof(init_error), "out of memory");
		return KOLO_ENOMEM;
	}
	kolo_status_t st;
	const char *url = kolo_param_str(KOLO_P_RENDEZVOUS);
	snprintf(comm->job, sizeof(comm->job), "%s", kolo_param_str(KOLO_P_JOB));
	url_host(url, comm->route_to, sizeof(comm->route_to));
	if (!url[0])
		return kolo_runtime_init_fail(
		        comm, kolo_comm_fail(comm, KOLO_EINVAL,
		                             "KOLO_RENDEZVOUS is not set: run under kolorun "
		                             "or set it to the rendezvous server's URL"));
	if ((st = kolo_token_load(&comm->token, &comm->err)) != KOLO_OK)
		return kolo_runtime_init_fail(comm, st);
	if (kolo_hostname(comm->host, sizeof(comm->host)) != KOLO_OK || !comm->host[0])
		return kolo_runtime_init_fail(comm,
		                              kolo_comm_fail(comm, KOLO_ESYSTEM,
		                                             "cannot determine the host name; set "
		                                             "KOLO_HOSTNAME"));
	kolo_log_set_identity(comm->host, -1);
	if ((st = kolo_runtime_metrics_check(comm)) != KOLO_OK)
		return kolo_runtime_init_fail(comm, st);
	struct kolo_rdzv_client_config cc = {
	        .url = url,
	        .job = kolo_param_str(KOLO_P_JOB),
	        .token = comm->token,
	        .host = comm->host,
	        .zone = kolo_param_str(KOLO_P_ZONE),
	        .deadline_ms = (int)kolo_param_int(KOLO_P_RDZV_DEADLINE_MS),
	};
	if ((st = kolo_rdzv_client_create(&cc, &comm->rdzv, &comm->err)) != KOLO_OK)
		return kolo_runtime_init_fail(comm, st);
	bool elastic = kolo_param_bool(KOLO_P_ELASTIC);
	if (elastic)
		elastic_wait_cancellable(comm);
	/* Asked to leave before kolo_init (a program's own SIGTERM handler
	 * calling kolo_elastic_leave): the job never hears of this worker. */
	st = elastic && kolo_elastic_leave_requested() ? KOLO_ESHUTDOWN
	                                               : kolo_rdzv_join(comm->rdzv);
	if (st != KOLO_OK) {
		if (!left_before_rank(comm, elastic, st))
			kolo_comm_fail(comm, st, "joining job %s at %s: %s", cc.job, url,
			               kolo_rdzv_client_error(comm->rdzv));
		return kolo_runtime_init_fail(comm, st);
	}
	kolo_runtime_report_worker(comm);
	/* Heartbeat while waiting too: a long wait must not cost the lease. */
	if ((st = kolo_rdzv_heartbeat_start(comm->rdzv,
	                                    (int)kolo_param_int(KOLO_P_HEARTBEAT_MS))) != KOLO_OK)
		return kolo_runtime_init_fail(
		        comm, kolo_comm_fail(comm, st, "%s", kolo_rdzv_client_error(comm->rdzv)));
	int timeout = (int)KOLO_MIN(kolo_param_int(KOLO_P_INIT_TIMEOUT_MS), INT32_MAX);
	st = kolo_rdzv_wait_assignment(comm->rdzv, 0, timeout, &comm->assignment);
	if (left_before_rank(comm, elastic, st))
		return kolo_runtime_init_fail(comm, st);
	if (st != KOLO_OK) {
		if (st == KOLO_ESHUTDOWN)
			kolo_comm_fail(comm, st, "job %s ended before this worker got a rank: %s",
			               cc.job, kolo_rdzv_client_error(comm->rdzv));
		else
			kolo_comm_fail(comm, st, "waiting for a round of job %s at %s: %s", cc.job,
			               url, kolo_rdzv_client_error(comm->rdzv));
		return kolo_runtime_init_fail(comm, st);
	}
	const struct kolo_rdzv_assignment *a = &comm->assignment;
	kolo_log_set_identity(comm->host, a->rank);
	kolo_runtime_report_rank(comm);
	if ((st = kolo_runtime_metrics_start(comm)) != KOLO_OK)
		return kolo_runtime_init_fail(comm, st);
	KOLO_INFO(SUBSYS,
	          "round %" PRId64 ": rank %d of %d, local %d of %d, cross %d of %d (worker %s)",
	          a->round, a->rank, a->size, a->local_rank, a->local_size, a->cross_rank,
	          a->cross_size, kolo_rdzv_worker_id(comm->rdzv));
	if ((st = kolo_runtime_elastic_connect(comm)) != KOLO_OK)
		return kolo_runtime_init_fail(comm, st);
	if ((st = kolo_runtime_elastic_start(comm)) != KOLO_OK)
		return kolo_runtime_init_fail(comm, st);
	*out = comm;
	return KOLO_OK;
}

/* true when this rank's data plane has failed or was given up: the other
 * ranks cannot all be waiting for a clean finish. A failed ring has reset
 * every conn, whichever way it failed (a peer, a timeout, an abort). */
static bool comm_failed(const struct kolo_comm *comm)
{
	return atomic_load(&comm->aborted) || kolo_ring_failed_peer(comm->ring) >= 0 ||
	       (comm->ring && kolo_ring_comm_status(comm->ring) != KOLO_OK);
}

/* How often rank 0's gather looks for a "0" verdict that another rank
 * published while it waits for one that may be gone. */
#define FIN_SLICE_MS 100
/* After a failure: the budget for saying so in the KV and leaving the job.
 * Best effort: when the server does not answer, nobody is left to tell. */
#define FIN_FAILED_MS 1000

/* kolo_rdzv_set_cancel hook: the rendezvous requests of finalize end at the
 * deadline *arg (kolo_now_ms()). */
static bool past_deadline(void *arg)
{
	return kolo_now_ms() >= *(const uint64_t *)arg;
}

static bool fin_value_is(const void *data, size_t len, char v)
{
	return len == 1 && ((const char *)data)[0] == v;
}

/* Waits until every rank has finished with the data plane, so that closing
 * our connections cannot cut off data a peer still has to read (a reset
 * discards it). Through the KV, not the data plane: the last message of any
 * data-plane barrier could itself be cut off. Each rank reports "1" (done) or
 * "0" (failed) under fin/<round>/<rank>; rank 0 gathers them and publishes
 * the verdict under fin/<round>/all, which a failed rank publishes at once
 * itself, so that nobody waits for ranks that are gone. kolorun does the same
 * for a worker that dies (tools/kolorun), so a rank that died outside a
 * collective does not hold the others either. Rank 0 gathers in slices and
 * stops on a "0" verdict: the rank it waits for may be the dead one. Bounded
 * by KOLO_TIMEOUT_MS (FIN_FAILED_MS after a failure), server retries
 * included. */
static void finalize_sync(struct kolo_comm *comm, bool failed)
{
	const struct kolo_rdzv_assignment *a = &comm->assignment;
	if (a->size <= 1 || !comm->rdzv)
		return;
	uint64_t end = kolo_now_ms() + (uint64_t)(failed ? FIN_FAILED_MS : comm->timeout_ms);
	kolo_rdzv_set_cancel(comm->rdzv, past_deadline, &end);
	char key[64], all_key[64];
	void *data = NULL;
	size_t len = 0;
	kolo_status_t st;
	const char *mine = failed ? "0" : "1";
	snprintf(all_key, sizeof(all_key), "fin/%" PRId64 "/all", a->round);
	snprintf(key, sizeof(key), "fin/%" PRId64 "/%d", a->round, a->rank);
	if ((st = kolo_rdzv_kv_put(comm->rdzv, key, mine, 1)) != KOLO_OK)
		goto fail;
	if (failed) {
		KOLO_INFO(SUBSYS, "finalize after a failure: not waiting for the other ranks");
		st = kolo_rdzv_kv_put(comm->rdzv, all_key, "0", 1);
		if (st != KOLO_OK)
			goto fail;
		goto out;
	}
	if (a->rank == 0) {
		bool all_done = true;
		for (int r = 1; r < a->size && all_done;) {
			uint64_t now = kolo_now_ms();
			if (now >= end) {
				st = KOLO_ETIMEDOUT;
				goto fail;
			}
			int slice = (int)KOLO_MIN(end - now, (uint64_t)FIN_SLICE_MS);
			snprintf(key, sizeof(key), "fin/%" PRId64 "/%d", a->round, r);
			st = kolo_rdzv_kv_get(comm->rdzv, key, slice, &data, &len);
			if (st == KOLO_OK) {
				all_done = fin_value_is(data, len, '1');
				r++;
			}
			free(data);
			data = NULL;
			if (st == KOLO_ENOTFOUND) {
				/* Rank r may be gone: has a failed rank said so? */
				st = kolo_rdzv_kv_get(comm->rdzv, all_key, 0, &data, &len);
				if (st == KOLO_OK && fin_value_is(data, len, '0'))
					all_done = false;
				free(data);
				data = NULL;
				if (st == KOLO_ENOTFOUND)
					st = KOLO_OK;
			}
			if (st != KOLO_OK)
				goto fail;
		}
		st = kolo_rdzv_kv_put(comm->rdzv, all_key, all_done ? "1" : "0", 1);
		if (st != KOLO_OK)
			goto fail;
		if (!all_done)
			KOLO_INFO(SUBSYS, "finalize: a rank failed; not waiting for the others");
	} else {
		uint64_t now = kolo_now_ms();
		st = kolo_rdzv_kv_get(comm->rdzv, all_key, now < end ? (int)(end - now) : 0, &data,
		                      &len);
		free(data);
		if (st != KOLO_OK)
			goto fail;
	}
	goto out;
fail:
	if (st == KOLO_ETIMEDOUT || st == KOLO_ESHUTDOWN)
		KOLO_WARN(SUBSYS, "finalize: %s within %d ms; closing anyway",
		          failed ? "the rendezvous did not take the failure report"
		                 : "not every rank reported done",
		          failed ? FIN_FAILED_MS : comm->timeout_ms);
	else
		KOLO_WARN(SUBSYS, "finalize: %s (%s); closing anyway",
		          failed ? "cannot report the failure" : "not every rank reported done",
		          kolo_rdzv_client_error(comm->rdzv));
out:
	kolo_rdzv_set_cancel(comm->rdzv, NULL, NULL);
}

KOLO_API void kolo_abort(kolo_comm_t *comm)
{
	if (!comm)
		return;
	atomic_store(&comm->aborted, true);
	pthread_mutex_lock(&comm->engine_lock);
	if (comm->engine)
		kolo_engine_abort(comm->engine, KOLO_ECLOSED);
	pthread_mutex_unlock(&comm->engine_lock);
	kolo_runtime_p2p_close(comm, KOLO_ECLOSED, "the comm was aborted (kolo_abort)");
	pthread_mutex_lock(&comm->elastic_lock);
	struct kolo_ring_comm *ring = comm->elastic ? comm->live_ring : comm->ring;
	if (ring)
		kolo_ring_abort(ring, KOLO_ECLOSED);
	pthread_mutex_unlock(&comm->elastic_lock);
}

KOLO_API kolo_status_t kolo_finalize(kolo_comm_t *comm)
{
	if (!comm)
		return KOLO_OK;
	kolo_runtime_preempt_disarm(comm);
	/* The last durable commit on disk and recorded before the worker leaves. */
	kolo_runtime_durable_stop(comm);
	kolo_runtime_elastic_stop(comm);
	/* The engine owns the ring while it runs: stop it first. */
	kolo_engine_destroy(comm->engine);
	comm->engine = NULL;
	bool failed = comm_failed(comm);
	kolo_runtime_p2p_destroy(comm, KOLO_ESHUTDOWN, "the comm was finalized");
	if (comm->ring)
		finalize_sync(comm, failed);
	kolo_ring_comm_destroy(comm->ring);
	comm->ring = NULL;
	if (comm->transport)
		comm->transport->ops->destroy(comm->transport);
	comm->transport = NULL;
	/* After a failure the leave is best effort too: a dead server must not
	 * hold a failed rank for the client's whole retry budget. */
	uint64_t leave_by = kolo_now_ms() + FIN_FAILED_MS;
	if (failed && comm->rdzv)
		kolo_rdzv_set_cancel(comm->rdzv, past_deadline, &leave_by);
	/* A worker whose training completed ends the job for the workers
	 * still waiting to join it (kolo_elastic_done). */
	kolo_status_t st = KOLO_OK;
	if (comm->rdzv)
		st = comm->done && !failed ? kolo_rdzv_finish(comm->rdzv)
		                           : kolo_rdzv_leave(comm->rdzv);
	if (failed && comm->rdzv)
		kolo_rdzv_set_cancel(comm->rdzv, NULL, NULL);
	if (st != KOLO_OK)
		KOLO_WARN(SUBSYS, "leaving the rendezvous failed: %s",
		          kolo_rdzv_client_error(comm->rdzv));
	kolo_log_set_identity(comm->host, -1);
	kolo_runtime_comm_free(comm);
	return st;
}
