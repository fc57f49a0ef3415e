/* bootstrap: a comm from a rank, a size and addresses the caller exchanged
 * (kolo/bootstrap.h), without the rendezvous server. It builds the same
 * assignment and data plane as kolo_init(); only where the peers' handles
 * come from differs (comm->cards instead of the KV). A card is two transport
 * handles: the data plane's, then the point-to-point endpoint's. */
#include "runtime.h"

#include "kolo/bootstrap.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SUBSYS "init"

_Static_assert(KOLO_BOOTSTRAP_CARD_SIZE == 2 * KOLO_TRANSPORT_HANDLE_SIZE,
               "a card is two transport handles");
_Static_assert(KOLO_BOOTSTRAP_HOST_MAX == KOLO_RDZV_HOST_MAX, "host names");

struct kolo_bootstrap {
	struct kolo_comm *comm; /* owned until connect */
	bool listening;
};

KOLO_API kolo_status_t kolo_bootstrap_create(const struct kolo_bootstrap_config *cfg,
                                             kolo_bootstrap_t **out)
{
	return kolo_runtime_bootstrap_new(cfg, NULL, out);
}

kolo_status_t kolo_runtime_bootstrap_new(const struct kolo_bootstrap_config *cfg, const char *host,
                                         kolo_bootstrap_t **out)
{
	kolo_runtime_set_init_error("%s", "");
	if (!out) {
		kolo_runtime_set_init_error("kolo_bootstrap_create: out is NULL");
		return KOLO_EINVAL;
	}
	*out = NULL;
	if (!cfg || cfg->size < 1 || cfg->rank < 0 || cfg->rank >= cfg->size ||
	    cfg->timeout_ms < 0) {
		kolo_runtime_set_init_error("kolo_bootstrap_create: need 0 <= rank < size and "
		                            "timeout_ms >= 0 (rank %d, "
		                            "size %d, timeout_ms %d)",
		                            cfg ? cfg->rank : -1, cfg ? cfg->size : -1,
		                            cfg ? cfg->timeout_ms : -1);
		return KOLO_EINVAL;
	}
	const char *job = cfg->job && cfg->job[0] ? cfg->job : "default";
	if (strlen(job) >= KOLO_RDZV_ID_MAX ||
	    (cfg->route_to && strlen(cfg->route_to) >= KOLO_RDZV_HOST_MAX)) {
		kolo_runtime_set_init_error("kolo_bootstrap_create: job id or route_to too long");
		return KOLO_EINVAL;
	}
	kolo_log_configure();
	struct kolo_bootstrap *b = calloc(1, sizeof(*b));
	struct kolo_comm *comm = kolo_runtime_comm_new();
	const char *token = cfg->token ? cfg->token : "";
	if (!b || !comm || !(comm->token = strdup(token))) {
		free(b);
		kolo_runtime_comm_free(comm);
		kolo_runtime_set_init_error("out of memory");
		return KOLO_ENOMEM;
	}
	b->comm = comm;
	snprintf(comm->job, sizeof(comm->job), "%s", job);
	if (cfg->route_to)
		snprintf(comm->route_to, sizeof(comm->route_to), "%s", cfg->route_to);
	if (cfg->timeout_ms > 0)
		comm->timeout_ms = cfg->timeout_ms;
	comm->assignment.round = 1;
	comm->assignment.rank = cfg->rank;
	comm->assignment.size = cfg->size;
	if (host) {
		/* A process set: the process's comm named the host already, and
		 * the log identity stays the process's. */
		snprintf(comm->host, sizeof(comm->host), "%s", host);
	} else if (kolo_hostname(comm->host, sizeof(comm->host)) != KOLO_OK || !comm->host[0]) {
		kolo_bootstrap_destroy(b);
		kolo_runtime_set_init_error("cannot determine the host name; set KOLO_HOSTNAME");
		return KOLO_ESYSTEM;
	} else {
		kolo_log_set_identity(comm->host, cfg->rank);
	}
	*out = b;
	return KOLO_OK;
}

KOLO_API const char *kolo_bootstrap_host(const kolo_bootstrap_t *b)
{
	return b ? b->comm->host : "";
}

/* Local ranks: the ranks of one host in rank order. Cross ranks: the index
 * of this host among the hosts that have this local rank, in the order of
 * their first rank (as kolo_rdzv_assign for contiguous hosts). */
static kolo_status_t assign(struct kolo_comm *comm, const char *const *hosts)
{
	struct kolo_rdzv_assignment *a = &comm->assignment;
	const int n = a->size;
	a->members = calloc((size_t)n, sizeof(*a->members));
	int *local = calloc((size_t)n, sizeof(int));
	if (!a->members || !local) {
		free(local);
		return kolo_comm_fail(comm, KOLO_ENOMEM, "out of memory");
	}
	a->n_members = n;
	kolo_status_t st = KOLO_OK;
	for (int r = 0; r < n && st == KOLO_OK; r++) {
		if (!hosts[r] || !hosts[r][0] || strlen(hosts[r]) >= KOLO_RDZV_HOST_MAX) {
			st = kolo_comm_fail(comm, KOLO_EINVAL,
			                    "rank %d's host name is empty or too long", r);
			break;
		}
		a->members[r].rank = r;
		snprintf(a->members[r].worker_id, sizeof(a->members[r].worker_id), "rank-%d", r);
		snprintf(a->members[r].host, sizeof(a->members[r].host), "%s", hosts[r]);
		for (int q = 0; q < r; q++)
			if (strcmp(hosts[q], hosts[r]) == 0)
				local[r]++;
	}
	if (st == KOLO_OK && strcmp(hosts[a->rank], comm->host) != 0)
		st = kolo_comm_fail(comm, KOLO_EINVAL,
		                    "hosts[%d] is \"%s\", but this rank's host is \"%s\"", a->rank,
		                    hosts[a->rank], comm->host);
	if (st == KOLO_OK) {
		a->local_rank = local[a->rank];
		a->local_size = 0;
		a->cross_rank = 0;
		a->cross_size = 0;
		for (int r = 0; r < n; r++) {
			a->local_size += strcmp(hosts[r], comm->host) == 0;
			if (local[r] == a->local_rank) {
				if (r < a->rank)
					a->cross_rank++;
				a->cross_size++;
			}
		}
	}
	free(local);
	return st;
}

KOLO_API kolo_status_t kolo_bootstrap_listen(kolo_bootstrap_t *b, const char *const *hosts,
                                             void *card)
{
	if (!b || !hosts || !card || b->listening)
		return KOLO_EINVAL;
	struct kolo_comm *comm = b->comm;
	kolo_status_t st = assign(comm, hosts);
	if (st == KOLO_OK) {
		struct kolo_transport_handle ring, p2p;
		st = kolo_runtime_transport_create(comm, &ring);
		if (st == KOLO_OK)
			st = kolo_runtime_p2p_listen(comm, &comm->p2p_transport, &p2p);
		if (st == KOLO_OK) {
			memcpy(card, ring.bytes, sizeof(ring.bytes));
			memcpy((char *)card + sizeof(ring.bytes), p2p.bytes, sizeof(p2p.bytes));
		}
	}
	if (st != KOLO_OK) {
		kolo_runtime_set_init_error("%s", comm->err.msg);
		return st;
	}
	b->listening = true;
	return KOLO_OK;
}

KOLO_API kolo_status_t kolo_bootstrap_connect(kolo_bootstrap_t *b, const void *cards,
                                              kolo_comm_t **out)
{
	if (out)
		*out = NULL;
	if (!b)
		return KOLO_EINVAL;
	struct kolo_comm *comm = b->comm;
	b->comm = NULL;
	bool listening = b->listening;
	free(b);
	if (!cards || !out || !listening)
		return kolo_runtime_init_fail(
		        comm, kolo_comm_fail(comm, KOLO_EINVAL,
		                             "kolo_bootstrap_connect: needs the cards, a place "
		                             "for the comm and kolo_bootstrap_listen() first"));
	const struct kolo_rdzv_assignment *a = &comm->assignment;
	comm->cards = malloc((size_t)a->size * sizeof(*comm->cards));
	comm->p2p_cards = malloc((size_t)a->size * sizeof(*comm->p2p_cards));
	if (!comm->cards || !comm->p2p_cards)
		return kolo_runtime_init_fail(comm,
		                              kolo_comm_fail(comm, KOLO_ENOMEM, "out of memory"));
	for (int r = 0; r < a->size; r++) {
		const char *card = (const char *)cards + (size_t)r * KOLO_BOOTSTRAP_CARD_SIZE;
		memcpy(comm->cards[r].bytes, card, sizeof(comm->cards[r].bytes));
		memcpy(comm->p2p_cards[r].bytes, card + sizeof(comm->cards[r].bytes),
		       sizeof(comm->p2p_cards[r].bytes));
	}
	KOLO_INFO(SUBSYS, "bootstrap: rank %d of %d, local %d of %d, cross %d of %d (job %s)",
	          a->rank, a->size, a->local_rank, a->local_size, a->cross_rank, a->cross_size,
	          comm->job);
	kolo_status_t st = kolo_runtime_ring_create(comm);
	if (st == KOLO_OK)
		st = kolo_runtime_metrics_start(comm);
	if (st != KOLO_OK)
		return kolo_runtime_init_fail(comm, st);
	*out = comm;
	return KOLO_OK;
}

KOLO_API void kolo_bootstrap_destroy(kolo_bootstrap_t *b)
{
	if (!b)
		return;
	kolo_runtime_comm_free(b->comm);
	free(b);
}
