/* The NCCL path of device collectives (docs/gpu.md, "NCCL inside a host").
 *
 * When every host's ranks hold device buffers on distinct GPUs, the ranks of
 * a host form an NCCL communicator, and:
 *   - on one host, NCCL runs the whole collective (allreduce, broadcast,
 *     allgather and reducescatter of equal blocks);
 *   - on several hosts (the hierarchy of ring/hier.c attached), an allreduce
 *     is an NCCL reduce-scatter inside the host, the staged allreduce of this
 *     rank's shard between hosts on the hierarchy's cross sub-comm
 *     (device.c, pipelined with its copies), and an NCCL allgather inside the
 *     host; the other collectives are staged whole (device.c).
 * Several ranks on one GPU (NCCL refuses two members of one communicator on
 * one device) stage everything through host memory over the flat ring, where
 * each rank is in effect its own host.
 *
 * Forming: the first device collective of a round exchanges, over the host
 * ring (an allgather of one small card per rank), each rank's GPU uuid,
 * whether it can run NCCL, and each host leader's fresh ncclUniqueId. Every
 * rank then decides alike, from the same cards, whether NCCL applies, so the
 * choice never splits the ranks. The exchange rides the round's ring rather
 * than the rendezvous KV: it is keyed by the round as the ring is, costs one
 * collective instead of a KV round trip per peer, and works for bootstrap
 * comms, which have no KV. A re-form aborts the communicator
 * (ncclCommAbort); the next round's first device collective forms a new one
 * with a new id.
 *
 * Which path a collective takes depends only on what every rank passes alike
 * (kind, counts, dtype, op, scale) and on the cards, never on this rank's own
 * memory kinds: a host buffer among device ones goes through a device
 * scratch buffer here. */
#include "runtime.h"

#include "fusion.h"
#include "gpu.h"
#include "gpu_nccl.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#define SUBSYS "device"

enum mode { M_NONE, M_ONE_HOST, M_HIER };

struct card {
	uint8_t uuid[16];
	uint8_t id[KOLO_NCCL_ID_BYTES]; /* the host leader's; zero elsewhere */
	int32_t ordinal;
	int32_t ok; /* this rank can run NCCL on its device */
};

struct nccl_state {
	struct kolo_comm *comm;
	const struct kolo_ring_comm *rc;
	int64_t round;
	enum mode mode;
	int ordinal;
	int L, H, lrank; /* ranks per host, hosts, index in the host */
	struct kolo_nccl_comm *nc;
	kolo_status_t failed; /* forming or a collective failed: every later call */
	char why[640];
	void *scratch[2]; /* device scratch for host buffers, grown */
	size_t scratch_bytes[2];
	struct nccl_state *next;
};

static pthread_mutex_t states_lock = PTHREAD_MUTEX_INITIALIZER;
static struct nccl_state *states;

static void state_free(struct nccl_state *s)
{
	kolo_nccl_comm_free(s->nc);
	kolo_gpu_free(s->scratch[0]);
	kolo_gpu_free(s->scratch[1]);
	free(s);
}

/* Unlinks comm's state (NULL when none). */
static struct nccl_state *take(struct kolo_comm *comm)
{
	pthread_mutex_lock(&states_lock);
	struct nccl_state **pp = &states, *s = NULL;
	for (; *pp; pp = &(*pp)->next)
		if ((*pp)->comm == comm) {
			s = *pp;
			*pp = s->next;
			break;
		}
	pthread_mutex_unlock(&states_lock);
	return s;
}

void kolo_device_nccl_reset(struct kolo_comm *comm)
{
	struct nccl_state *s = take(comm);
	if (!s)
		return;
	/* Peers of a lost round may never finish their part: abort, do not
	 * wait for them. */
	kolo_nccl_comm_abort(s->nc);
	state_free(s);
}

/* The device ordinal of c's first device buffer; -1 when none. */
static int coll_ordinal(const struct kolo_dcoll *c)
{
	const void *p[2] = {c->send, c->recv};
	for (int i = 0; i < 2; i++) {
		int o;
		struct kolo_errbuf eb = {{0}};
		if (p[i] && kolo_mem_kind(p[i]) == KOLO_MEM_DEVICE &&
		    kolo_gpu_ptr_device(p[i], &o, &eb) == KOLO_OK)
			return o;
	}
	return -1;
}

static bool uuids_distinct(const struct card *cards, int first, int L)
{
	for (int i = 0; i < L; i++)
		for (int j = i + 1; j < L; j++)
			if (memcmp(cards[first + i].uuid, cards[first + j].uuid, 16) == 0)
				return false;
	return true;
}

/* The forming exchange and decision of the module comment; collective over
 * rc. A failure of the exchange itself is the collective's failure. */
static kolo_status_t form(struct nccl_state *s, struct kolo_ring_comm *rc, int ordinal,
                          struct kolo_errbuf *eb)
{
	const struct kolo_rdzv_assignment *a = &s->comm->assignment;
	const int n = a->size;
	s->L = a->local_size;
	s->H = a->cross_size;
	s->lrank = n > 0 && s->L > 0 ? a->rank % s->L : 0;
	s->ordinal = ordinal;

	struct card mine;
	memset(&mine, 0, sizeof(mine));
	mine.ordinal = ordinal;
	const char *why = NULL;
	struct kolo_errbuf leb = {{0}};
	if (!kolo_param_bool(KOLO_P_GPU_NCCL))
		why = "KOLO_GPU_NCCL=0";
	else if (!kolo_nccl_usable(&why))
		;
	else if (ordinal < 0)
		why = "no device buffer";
	else if (kolo_gpu_device_uuid(ordinal, mine.uuid, &leb) != KOLO_OK)
		why = "the GPU's uuid is unknown";
	else if (s->lrank == 0 && kolo_nccl_unique_id(mine.id, &leb) != KOLO_OK)
		why = "ncclGetUniqueId failed";
	mine.ok = why == NULL;

	struct card *cards = calloc((size_t)n, sizeof(*cards));
	size_t *counts = calloc((size_t)n, sizeof(*counts));
	if (!cards || !counts) {
		free(cards);
		free(counts);
		return kolo_fail(eb, KOLO_ENOMEM, "out of memory");
	}
	for (int r = 0; r < n; r++)
		counts[r] = sizeof(struct card);
	kolo_status_t st = kolo_ring_allgatherv(rc, &mine, cards, counts, KOLO_UINT8);
	free(counts);
	if (st != KOLO_OK) {
		free(cards);
		return kolo_fail(eb, st, "exchanging the GPUs of the ranks: %s",
		                 kolo_ring_last_error(rc));
	}

	/* The decision, alike on every rank. */
	s->mode = M_NONE;
	int bad = -1;
	for (int r = 0; r < n && bad < 0; r++)
		if (!cards[r].ok)
			bad = r;
	if (bad >= 0) {
		snprintf(s->why, sizeof(s->why), "rank %d cannot run NCCL%s%s", bad,
		         bad == a->rank && why ? ": " : "", bad == a->rank && why ? why : "");
	} else if (s->L < 2) {
		snprintf(s->why, sizeof(s->why), "one rank per host");
	} else if (s->L * s->H != n || (s->H > 1 && !kolo_ring_hier_sub(rc, true))) {
		snprintf(s->why, sizeof(s->why),
		         "no hierarchy over the hosts (uneven hosts, or KOLO_HIERARCHICAL=0)");
	} else {
		bool distinct = true;
		for (int h = 0; h < s->H && distinct; h++)
			distinct = uuids_distinct(cards, h * s->L, s->L);
		if (!distinct)
			snprintf(s->why, sizeof(s->why),
			         "ranks of one host share a GPU (NCCL needs one GPU per rank)");
		else
			s->mode = s->H == 1 ? M_ONE_HOST : M_HIER;
	}
	if (s->mode == M_NONE) {
		free(cards);
		KOLO_INFO(SUBSYS, "device collectives: staged through host memory (%s)", s->why);
		return KOLO_OK;
	}
	uint8_t id[KOLO_NCCL_ID_BYTES];
	memcpy(id, cards[a->rank - s->lrank].id, sizeof(id));
	free(cards);
	st = kolo_gpu_set_device(ordinal, eb);
	if (st == KOLO_OK)
		st = kolo_nccl_comm_init(&s->nc, s->L, s->lrank, id, s->comm->timeout_ms, eb);
	if (st != KOLO_OK) {
		s->mode = M_NONE;
		s->failed = st;
		snprintf(s->why, sizeof(s->why), "forming the NCCL communicator: %s", eb->msg);
		return kolo_fail(eb, st, "%s", s->why);
	}
	KOLO_INFO(SUBSYS, "device collectives: NCCL inside the host (%d GPUs%s), round %" PRId64,
	          s->L, s->H > 1 ? ", staged through host memory between hosts" : "", s->round);
	return KOLO_OK;
}

/* comm's state for this round and rc, formed on first use. */
static kolo_status_t state_of(struct kolo_comm *comm, struct kolo_ring_comm *rc, int ordinal,
                              struct nccl_state **out, struct kolo_errbuf *eb)
{
	pthread_mutex_lock(&states_lock);
	struct nccl_state *s = states;
	while (s && s->comm != comm)
		s = s->next;
	pthread_mutex_unlock(&states_lock);
	if (s && (s->rc != rc || s->round != comm->assignment.round)) {
		kolo_device_nccl_reset(comm);
		s = NULL;
	}
	if (s) {
		*out = s;
		return KOLO_OK;
	}
	s = calloc(1, sizeof(*s));
	if (!s)
		return kolo_fail(eb, KOLO_ENOMEM, "out of memory");
	s->comm = comm;
	s->rc = rc;
	s->round = comm->assignment.round;
	kolo_status_t st = form(s, rc, ordinal, eb);
	if (st != KOLO_OK && !s->failed) {
		state_free(s); /* the exchange failed: try again next time */
		return st;
	}
	pthread_mutex_lock(&states_lock);
	s->next = states;
	states = s;
	pthread_mutex_unlock(&states_lock);
	*out = s;
	return st;
}

static bool all_equal(const size_t *counts, int n)
{
	for (int i = 1; i < n; i++)
		if (counts[i] != counts[0])
			return false;
	return true;
}

/* Whether c's send block lies inside its recv buffer (an in-place
 * allgather or reducescatter). */
static bool overlaps(const struct kolo_dcoll *c, int n)
{
	size_t es = kolo_dtype_size(c->dtype), rbytes = c->counts[0] * es,
	       sbytes = c->counts[0] * es;
	if (c->kind == KOLO_DC_ALLGATHERV)
		rbytes *= (size_t)n;
	else
		sbytes *= (size_t)n;
	uintptr_t s = (uintptr_t)c->send, r = (uintptr_t)c->recv;
	return s < r + rbytes && r < s + sbytes;
}

static bool is_float(kolo_dtype_t d)
{
	return d == KOLO_FLOAT16 || d == KOLO_BFLOAT16 || d == KOLO_FLOAT32 || d == KOLO_FLOAT64;
}

/* The op and scale NCCL runs a reduction of c with over n ranks (the sum's
 * scale folds average, prescale and postscale); false when NCCL cannot. */
static bool nccl_op(const struct kolo_dcoll *c, int n, kolo_op_t *op, double *scale)
{
	double s = c->pre * c->post;
	*op = c->op;
	*scale = 1.0;
	if (c->op == KOLO_AVERAGE) {
		if (!is_float(c->dtype))
			return false;
		if (s != 1.0) {
			*op = KOLO_SUM;
			*scale = s / n;
		}
		return true;
	}
	if (s == 1.0)
		return true;
	if (c->op != KOLO_SUM || !is_float(c->dtype))
		return false;
	*scale = s;
	return true;
}

/* A device view of buf for NCCL: buf itself when it is device memory,
 * otherwise scratch slot i of `bytes` (filled from buf first when fill). */
static kolo_status_t device_view(struct nccl_state *s, int i, const void *buf, size_t bytes,
                                 bool fill, void *stream, void **out, struct kolo_errbuf *eb)
{
	if (!buf || bytes == 0 || kolo_mem_kind(buf) == KOLO_MEM_DEVICE) {
		*out = (void *)buf;
		return KOLO_OK;
	}
	if (s->scratch_bytes[i] < bytes) {
		kolo_status_t st = kolo_gpu_stream_sync(stream, s->comm->timeout_ms, eb);
		if (st != KOLO_OK)
			return st;
		kolo_gpu_free(s->scratch[i]);
		s->scratch[i] = NULL;
		s->scratch_bytes[i] = 0;
		st = kolo_gpu_malloc(&s->scratch[i], bytes, eb);
		if (st != KOLO_OK)
			return st;
		s->scratch_bytes[i] = bytes;
	}
	*out = s->scratch[i];
	return fill ? kolo_gpu_memcpy_async(*out, buf, bytes, stream, eb) : KOLO_OK;
}

/* Waits for stream in slices, so that an aborted ring (a re-form, the
 * watcher) or an NCCL error ends the wait at once, not at the deadline. */
static kolo_status_t wait_stream(struct nccl_state *s, struct kolo_ring_comm *rc, void *stream,
                                 struct kolo_errbuf *eb)
{
	uint64_t deadline =
	        kolo_now_ms() + (uint64_t)(s->comm->timeout_ms > 0 ? s->comm->timeout_ms : 60000);
	for (;;) {
		struct kolo_errbuf seb = {{0}};
		kolo_status_t st = kolo_gpu_stream_sync(stream, 50, &seb);
		if (st == KOLO_OK) /* a kernel NCCL gave up on still ends: ask NCCL */
			return kolo_nccl_comm_status(s->nc, eb);
		if (st != KOLO_ETIMEDOUT)
			return kolo_fail(eb, st, "%s", seb.msg);
		st = kolo_nccl_comm_status(s->nc, eb);
		if (st != KOLO_OK)
			return st;
		st = kolo_ring_comm_status(rc);
		if (st != KOLO_OK)
			return kolo_fail(eb, st, "the ring failed while NCCL ran: %s",
			                 kolo_ring_last_error(rc));
		if (kolo_now_ms() >= deadline)
			return kolo_fail(eb, KOLO_ETIMEDOUT,
			                 "NCCL made no progress within %d ms (a peer on this host "
			                 "is stuck or gone)",
			                 s->comm->timeout_ms);
	}
}

/* The hierarchical allreduce: reduce-scatter inside the host, the staged
 * allreduce of the shard between hosts, allgather inside the host. The
 * elements past the last whole block (count % L) are reduced to the host's
 * first rank, allreduced between hosts by it and broadcast back. */
static kolo_status_t hier_allreduce(struct nccl_state *s, struct kolo_ring_comm *rc,
                                    const struct kolo_dcoll *c, const void *send, void *recv,
                                    kolo_op_t op, double scale, void *stream,
                                    struct kolo_errbuf *eb)
{
	const size_t es = kolo_dtype_size(c->dtype), q = c->count / (size_t)s->L,
	             tail = c->count % (size_t)s->L;
	char *r = recv;
	const char *sd = send;
	void *shard = r + (size_t)s->lrank * q * es, *rtail = r + (size_t)s->L * q * es;
	kolo_status_t st = kolo_nccl_group_start(eb);
	if (st != KOLO_OK)
		return st;
	/* NCCL sums first (SUM with the caller's op for MIN/MAX/PROD); the scale
	 * is applied once, between hosts. */
	kolo_op_t local_op = op == KOLO_AVERAGE ? KOLO_SUM : op;
	if (q)
		st = kolo_nccl_reduce_scatter(s->nc, send, shard, q, c->dtype, local_op, 1.0,
		                              stream, eb);
	if (st == KOLO_OK && tail)
		st = kolo_nccl_reduce(s->nc, sd + (size_t)s->L * q * es, rtail, tail, c->dtype,
		                      local_op, 0, stream, eb);
	kolo_status_t gst = kolo_nccl_group_end(s->nc, eb);
	if (st == KOLO_OK)
		st = gst;
	if (st != KOLO_OK)
		return st;
	/* Between hosts: SUM scaled by the folded factor, or AVERAGE over all n
	 * ranks as a sum times 1 / n. */
	struct kolo_ring_comm *cross = kolo_ring_hier_sub(rc, true);
	kolo_op_t xop = op;
	double post = scale;
	if (op == KOLO_AVERAGE) {
		xop = KOLO_SUM;
		post = 1.0 / (double)(s->L * s->H);
	}
	if (q)
		st = kolo_device_allreduce(s->comm, cross, shard, shard, q, c->dtype, xop, 1.0,
		                           post, NULL, eb);
	if (st == KOLO_OK && tail && s->lrank == 0)
		st = kolo_device_allreduce(s->comm, cross, rtail, rtail, tail, c->dtype, xop, 1.0,
		                           post, NULL, eb);
	if (st != KOLO_OK)
		return st;
	st = kolo_nccl_group_start(eb);
	if (st != KOLO_OK)
		return st;
	if (q)
		st = kolo_nccl_all_gather(s->nc, shard, recv, q, c->dtype, stream, eb);
	if (st == KOLO_OK && tail)
		st = kolo_nccl_broadcast(s->nc, rtail, rtail, tail, c->dtype, 0, stream, eb);
	gst = kolo_nccl_group_end(s->nc, eb);
	return st != KOLO_OK ? st : gst;
}

static kolo_status_t nccl_try(struct kolo_comm *comm, struct kolo_ring_comm *rc,
                              const struct kolo_dcoll *c, struct kolo_errbuf *eb)
{
	const int n = comm->assignment.size;
	if (n < 2 || !rc)
		return KOLO_EUNSUPPORTED;
	int ordinal = coll_ordinal(c);
	struct nccl_state *s = NULL;
	kolo_status_t st = state_of(comm, rc, ordinal, &s, eb);
	if (st != KOLO_OK)
		return st;
	if (s->failed)
		return kolo_fail(eb, s->failed, "%s", s->why);
	if (s->mode == M_NONE)
		return KOLO_EUNSUPPORTED;

	/* What NCCL takes; everything else is staged whole (device.c). */
	kolo_op_t op = c->op;
	double scale = 1.0;
	size_t send_elems = 0, recv_elems = 0;
	const bool one = s->mode == M_ONE_HOST;
	switch (c->kind) {
	case KOLO_DC_ALLREDUCE:
		if (!nccl_op(c, n, &op, &scale))
			return KOLO_EUNSUPPORTED;
		send_elems = recv_elems = c->count;
		break;
	case KOLO_DC_BROADCAST:
		if (!one)
			return KOLO_EUNSUPPORTED;
		send_elems = recv_elems = c->count;
		break;
	case KOLO_DC_ALLGATHERV:
		/* kolo's in place (the block at the start, or at its place) is not
		 * NCCL's: staged. */
		if (!one || !all_equal(c->counts, n) || overlaps(c, n))
			return KOLO_EUNSUPPORTED;
		send_elems = c->counts[0];
		recv_elems = c->counts[0] * (size_t)n;
		break;
	case KOLO_DC_REDUCESCATTER:
		if (!one || !all_equal(c->counts, n) || overlaps(c, n) ||
		    !nccl_op(c, n, &op, &scale))
			return KOLO_EUNSUPPORTED;
		send_elems = c->counts[0] * (size_t)n;
		recv_elems = c->counts[0];
		break;
	default:
		return KOLO_EUNSUPPORTED;
	}
	if (ordinal >= 0 && ordinal != s->ordinal)
		return kolo_fail(eb, KOLO_EINVAL,
		                 "device buffers on cuda:%d, but this rank's NCCL communicator of "
		                 "round %" PRId64 " is on cuda:%d (keep one GPU per rank)",
		                 ordinal, s->round, s->ordinal);

	struct kolo_engine_device hooks;
	kolo_device_engine_hooks(comm, &hooks);
	void *stream = NULL;
	st = kolo_gpu_set_device(s->ordinal, eb);
	if (st == KOLO_OK)
		st = hooks.stream(hooks.arg, s->ordinal, &stream, eb);
	if (st == KOLO_OK && c->after)
		st = kolo_gpu_stream_wait_event(stream, c->after, eb);
	if (st != KOLO_OK)
		return st;

	const size_t es = kolo_dtype_size(c->dtype);
	const void *send_host = c->kind == KOLO_DC_BROADCAST ? c->recv : c->send;
	void *dsend = NULL, *drecv = NULL;
	const bool in_place = send_host == c->recv;
	st = device_view(s, 0, send_host, send_elems * es, true, stream, &dsend, eb);
	if (st == KOLO_OK) {
		if (in_place)
			drecv = dsend;
		else
			st = device_view(s, 1, c->recv, recv_elems * es, false, stream, &drecv, eb);
	}
	if (st != KOLO_OK)
		return st;

	switch (c->kind) {
	case KOLO_DC_ALLREDUCE:
		st = one ? kolo_nccl_all_reduce(s->nc, dsend, drecv, c->count, c->dtype, op, scale,
		                                stream, eb)
		         : hier_allreduce(s, rc, c, dsend, drecv, op, scale, stream, eb);
		break;
	case KOLO_DC_BROADCAST:
		st = kolo_nccl_broadcast(s->nc, dsend, drecv, c->count, c->dtype, c->root, stream,
		                         eb);
		break;
	case KOLO_DC_ALLGATHERV:
		st = kolo_nccl_all_gather(s->nc, dsend, drecv, send_elems, c->dtype, stream, eb);
		break;
	case KOLO_DC_REDUCESCATTER:
		st = kolo_nccl_reduce_scatter(s->nc, dsend, drecv, recv_elems, c->dtype, op, scale,
		                              stream, eb);
		break;
	default:
		break;
	}
	if (st == KOLO_OK && drecv != c->recv && c->recv)
		st = kolo_gpu_memcpy_async(c->recv, drecv, recv_elems * es, stream, eb);
	if (st == KOLO_OK)
		st = wait_stream(s, rc, stream, eb);
	if (st != KOLO_OK) {
		/* The communicator's members may be anywhere in it now: give it
		 * up; the round's end (a re-form) forms a new one. */
		kolo_nccl_comm_abort(s->nc);
		s->failed = st == KOLO_EUNSUPPORTED ? KOLO_ESYSTEM : st;
		snprintf(s->why, sizeof(s->why), "NCCL failed earlier in round %" PRId64 ": %s",
		         s->round, eb->msg);
		return s->failed;
	}
	return KOLO_OK;
}

/* The calling thread's current device is the caller's: NCCL runs on the
 * round's device and the caller's is put back. */
kolo_status_t kolo_device_nccl_try(struct kolo_comm *comm, struct kolo_ring_comm *rc,
                                   const struct kolo_dcoll *c, struct kolo_errbuf *eb)
{
	int saved = -1, now = -1;
	if (kolo_gpu_get_device(&saved, NULL) != KOLO_OK)
		saved = -1;
	kolo_status_t st = nccl_try(comm, rc, c, eb);
	if (saved >= 0 && kolo_gpu_get_device(&now, NULL) == KOLO_OK && now != saved)
		kolo_gpu_set_device(saved, NULL);
	return st;
}
