/* Process sets (kolo/kolo.h): a comm over a subset of another comm's ranks.
 *
 * A set is a bootstrap comm (bootstrap.c) whose cards travel over the parent
 * comm instead of the caller's store, so it has everything a comm has: its
 * own rings (shared memory inside a host, the network between hosts,
 * hierarchical where that pays), its own fusion engine with its own
 * negotiation and names, and point-to-point. Ops in two sets never wait for
 * each other, and a rank outside a set never touches it.
 *
 * Creating one is collective over the parent, in two allgathers: every rank's
 * view of the member list (with its host name), then the members' cards. A
 * rank whose list differs, or is invalid, makes the call fail on every rank
 * with both lists in the message, before anything is created.
 *
 * The parent's epoch (struct kolo_set_epoch, shared with its sets by
 * reference) counts the parent's re-forms; a set made in an older epoch
 * refuses every op with KOLO_EINVAL, since its ranks no longer mean what they
 * meant (docs/elastic.md, "Process sets"). */
#include "runtime.h"

#include "kolo/bootstrap.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SUBSYS "init"

struct kolo_set_epoch {
	atomic_int refs;
	atomic_uint_least64_t gen;
};

/* One rank's view of the call: a status (0: valid), the member count and
 * the parent's size slots of sorted ranks, then its host name. */
struct view {
	int32_t status;
	int32_t n;
	int32_t seq; /* this rank's count of sets made from the comm, this one included */
	int32_t pad;
};

static size_t view_bytes(int size)
{
	return sizeof(struct view) + (size_t)size * sizeof(int32_t) + KOLO_BOOTSTRAP_HOST_MAX;
}

static int32_t *view_ranks(uint8_t *v)
{
	return (int32_t *)(v + sizeof(struct view));
}

static char *view_host(uint8_t *v, int size)
{
	return (char *)(v + sizeof(struct view) + (size_t)size * sizeof(int32_t));
}

static int cmp_int32(const void *a, const void *b)
{
	int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
	return (x > y) - (x < y);
}

/* Fills this rank's view: the ranks sorted, status 1 if any is out of range
 * or repeated (the message in comm's error). */
static void view_fill(struct kolo_comm *comm, uint8_t *v, const int *ranks, int n)
{
	const int size = comm->assignment.size;
	struct view h = {.status = 0, .n = n, .seq = comm->sets_made + 1};
	int32_t *r = view_ranks(v);
	if (!ranks || n < 1 || n > size) {
		h.status = 1;
		h.n = 0;
		kolo_comm_fail(comm, KOLO_EINVAL,
		               "kolo_process_set_create: need 1 to %d ranks, got %d%s", size, n,
		               ranks ? "" : " (ranks is NULL)");
	} else {
		for (int i = 0; i < n; i++)
			r[i] = ranks[i];
		qsort(r, (size_t)n, sizeof(*r), cmp_int32);
		for (int i = 0; i < n && h.status == 0; i++)
			if (r[i] < 0 || r[i] >= size || (i > 0 && r[i] == r[i - 1])) {
				h.status = 1;
				kolo_comm_fail(comm, KOLO_EINVAL,
				               "kolo_process_set_create: rank %d %s", (int)r[i],
				               r[i] < 0 || r[i] >= size
				                       ? "is not a rank of the comm"
				                       : "is listed twice");
			}
	}
	memcpy(v, &h, sizeof(h));
	snprintf(view_host(v, size), KOLO_BOOTSTRAP_HOST_MAX, "%s", comm->host);
}

static int list_text(char *out, size_t cap, const uint8_t *v)
{
	struct view h;
	memcpy(&h, v, sizeof(h));
	const int32_t *r = (const int32_t *)(v + sizeof(h));
	int len = snprintf(out, cap, "[");
	for (int i = 0; i < h.n && (size_t)len < cap; i++)
		len += snprintf(out + len, cap - (size_t)len, "%s%d", i ? ", " : "", (int)r[i]);
	if ((size_t)len < cap)
		len += snprintf(out + len, cap - (size_t)len, "]");
	return len;
}

/* Every rank judges all views the same way, so all fail or none does. */
static kolo_status_t views_agree(struct kolo_comm *comm, uint8_t *all, size_t vb)
{
	const int size = comm->assignment.size, me = comm->assignment.rank;
	for (int q = 0; q < size; q++) {
		struct view h;
		memcpy(&h, all + (size_t)q * vb, sizeof(h));
		if (h.status != 0)
			return q == me ? KOLO_EINVAL
			               : kolo_comm_fail(
			                         comm, KOLO_EINVAL,
			                         "kolo_process_set_create: rank %d passed an "
			                         "invalid list of ranks",
			                         q);
	}
	for (int q = 1; q < size; q++) {
		const uint8_t *a = all, *b = all + (size_t)q * vb;
		struct view ha, hb;
		memcpy(&ha, a, sizeof(ha));
		memcpy(&hb, b, sizeof(hb));
		if (ha.n == hb.n &&
		    memcmp(a + sizeof(ha), b + sizeof(hb), (size_t)ha.n * sizeof(int32_t)) == 0)
			continue;
		char la[256], lb[256];
		list_text(la, sizeof(la), a);
		list_text(lb, sizeof(lb), b);
		return kolo_comm_fail(
		        comm, KOLO_EMISMATCH,
		        "kolo_process_set_create: ranks disagree on the members: rank "
		        "0 passed %s, rank %d passed %s",
		        la, q, lb);
	}
	return KOLO_OK;
}

/* The members' half: listen, exchange cards over the parent (every rank
 * takes part; non-members send a zero card), connect. slot: this rank's index
 * among the members, -1 for a non-member. */
static kolo_status_t join(struct kolo_comm *comm, const int32_t *members, int n, int slot,
                          const uint8_t *views, size_t vb, kolo_comm_t **out)
{
	const int size = comm->assignment.size;
	enum { CARD = KOLO_BOOTSTRAP_CARD_SIZE, ENTRY = CARD + 8 };
	uint8_t mine[ENTRY] = {0};
	uint8_t *all = malloc((size_t)size * ENTRY);
	uint8_t *cards = malloc((size_t)n * CARD);
	const char **hosts = calloc((size_t)n, sizeof(*hosts));
	kolo_bootstrap_t *b = NULL;
	kolo_status_t st = KOLO_OK;
	if (!all || !cards || !hosts) {
		free(all);
		free(cards);
		free((void *)hosts);
		return kolo_comm_fail(comm, KOLO_ENOMEM, "kolo_process_set_create: out of memory");
	}
	if (slot >= 0) {
		char job[KOLO_RDZV_ID_MAX];
		snprintf(job, sizeof(job), "%.*s/set%" PRId64 ".%d", KOLO_RDZV_ID_MAX - 48,
		         comm->job, comm->assignment.round, comm->sets_made);
		struct kolo_bootstrap_config cfg = {.rank = slot,
		                                    .size = n,
		                                    .job = job,
		                                    .token = comm->token,
		                                    .route_to = comm->route_to,
		                                    .timeout_ms = comm->timeout_ms};
		for (int i = 0; i < n; i++)
			hosts[i] = view_host((uint8_t *)views + (size_t)members[i] * vb, size);
		st = kolo_runtime_bootstrap_new(&cfg, comm->host, &b);
		if (st == KOLO_OK)
			st = kolo_bootstrap_listen(b, hosts, mine + 8);
		if (st != KOLO_OK) {
			kolo_comm_fail(comm, st, "kolo_process_set_create: %s", kolo_init_error());
			mine[0] = 1;
		}
	}
	/* Everyone takes part even after a local failure: the others must
	 * learn of it rather than wait. */
	kolo_status_t ag = kolo_allgather(comm, mine, all, ENTRY, KOLO_UINT8);
	if (st == KOLO_OK && ag != KOLO_OK)
		st = ag;
	for (int i = 0; i < n && st == KOLO_OK; i++) {
		const uint8_t *e = all + (size_t)members[i] * ENTRY;
		if (e[0])
			st = kolo_comm_fail(comm, KOLO_ESYSTEM,
			                    "kolo_process_set_create: rank %d could not open its "
			                    "endpoints",
			                    (int)members[i]);
		else
			memcpy(cards + (size_t)i * CARD, e + 8, CARD);
	}
	if (st == KOLO_OK && slot >= 0) {
		kolo_comm_t *set = NULL;
		st = kolo_bootstrap_connect(b, cards, &set);
		b = NULL;
		if (st != KOLO_OK)
			kolo_comm_fail(comm, st, "kolo_process_set_create: %s", kolo_init_error());
		else
			*out = set;
	}
	kolo_bootstrap_destroy(b);
	free((void *)hosts);
	free(cards);
	free(all);
	return st;
}

static kolo_status_t epoch_get(struct kolo_comm *comm)
{
	if (comm->epoch)
		return KOLO_OK;
	struct kolo_set_epoch *e = malloc(sizeof(*e));
	if (!e)
		return kolo_comm_fail(comm, KOLO_ENOMEM, "out of memory");
	atomic_init(&e->refs, 1);
	atomic_init(&e->gen, 0);
	comm->epoch = e;
	return KOLO_OK;
}

KOLO_API kolo_status_t kolo_process_set_create(kolo_comm_t *comm, const int *ranks, int n,
                                               kolo_comm_t **set)
{
	if (!comm || !set)
		return comm ? kolo_comm_fail(comm, KOLO_EINVAL,
		                             "kolo_process_set_create: set is NULL")
		            : KOLO_EINVAL;
	*set = NULL;
	KOLO_CHECK(kolo_args_comm(comm, "kolo_process_set_create"));
	KOLO_CHECK(epoch_get(comm));
	const int size = comm->assignment.size, me = comm->assignment.rank;
	const size_t vb = view_bytes(size);
	uint8_t *mine = calloc(1, vb), *all = malloc((size_t)size * vb);
	if (!mine || !all) {
		free(mine);
		free(all);
		return kolo_comm_fail(comm, KOLO_ENOMEM, "out of memory");
	}
	view_fill(comm, mine, ranks, n);
	kolo_status_t st = kolo_allgather(comm, mine, all, vb, KOLO_UINT8);
	if (st == KOLO_OK)
		st = views_agree(comm, all, vb);
	if (st == KOLO_OK) {
		/* The set's number, the same on every rank: a rank that joined
		 * the job later has made fewer sets. */
		for (int q = 0; q < size; q++) {
			struct view h;
			memcpy(&h, all + (size_t)q * vb, sizeof(h));
			comm->sets_made = KOLO_MAX(comm->sets_made, h.seq);
		}
		const int32_t *members = view_ranks(mine);
		int slot = -1;
		for (int i = 0; i < n; i++)
			if (members[i] == me)
				slot = i;
		st = join(comm, members, n, slot, all, vb, set);
		if (st == KOLO_OK && *set) {
			atomic_fetch_add(&comm->epoch->refs, 1);
			(*set)->parent_epoch = comm->epoch;
			(*set)->parent_gen = atomic_load(&comm->epoch->gen);
			char label[32];
			snprintf(label, sizeof(label), "set %d", comm->sets_made);
			kolo_flight_reset_members((*set)->flight, label, kolo_rank(*set), n,
			                          members);
			KOLO_INFO(SUBSYS, "process set %d: rank %d of %d", comm->sets_made,
			          kolo_rank(*set), n);
		}
	}
	free(mine);
	free(all);
	return st;
}

KOLO_API kolo_status_t kolo_process_set_free(kolo_comm_t *set)
{
	if (!set)
		return KOLO_OK;
	if (!set->parent_epoch)
		return kolo_comm_fail(
		        set, KOLO_EINVAL,
		        "kolo_process_set_free: not a process set (use kolo_finalize)");
	/* Every member has finished with the set once the barrier returns, so
	 * no connection closes under data a peer still has to read. A set that
	 * is already broken (a re-form, a lost member) closes without it. */
	kolo_status_t st = KOLO_OK;
	if (set->ring && kolo_runtime_set_check(set, "kolo_process_set_free") == KOLO_OK &&
	    !atomic_load(&set->aborted))
		st = kolo_barrier(set);
	kolo_finalize(set);
	return st;
}

kolo_status_t kolo_runtime_set_check(struct kolo_comm *comm, const char *coll)
{
	if (!comm->parent_epoch || atomic_load(&comm->parent_epoch->gen) == comm->parent_gen)
		return KOLO_OK;
	return kolo_args_fail(comm, coll,
	                      "this process set was made before its comm re-formed (or was "
	                      "finalized): its ranks are gone; create the set again");
}

void kolo_runtime_sets_invalidate(struct kolo_comm *comm)
{
	if (comm->epoch)
		atomic_fetch_add(&comm->epoch->gen, 1);
}

static void epoch_put(struct kolo_set_epoch *e)
{
	if (e && atomic_fetch_sub(&e->refs, 1) == 1)
		free(e);
}

void kolo_runtime_sets_release(struct kolo_comm *comm)
{
	kolo_runtime_sets_invalidate(comm);
	epoch_put(comm->epoch);
	epoch_put(comm->parent_epoch);
	comm->epoch = comm->parent_epoch = NULL;
}
