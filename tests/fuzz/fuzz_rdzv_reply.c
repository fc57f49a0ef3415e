/* Fuzz target: the rendezvous client's reading of the server's replies
 * (rendezvous/client_parse.c). The first byte picks the reply (error, join,
 * assignment, heartbeat, job status), the rest is its body, copied to a
 * buffer of exactly its size and not NUL-terminated, so that a read past
 * the end shows under ASan. Beyond "no crash": an accepted reply yields the
 * values the client relies on, in range, and writing them back as the
 * server would and reading that again gives the same values. */
#include "client_parse.h"
#include "fuzz.h"

#include <jansson.h>
#include <stdbool.h>
#include <string.h>

static void check_terminated(const char *s, size_t size, const char *what)
{
	FUZZ_CHECK(memchr(s, '\0', size) != NULL, "%s not terminated", what);
}

/* The error text is the body's {"error"} string or a prefix of the body. */
static void check_error(const char *body, size_t len)
{
	char buf[256];
	memset(buf, 'x', sizeof(buf));
	const char *t = rdzv_client_parse_error(len ? body : NULL, len, buf, sizeof(buf));
	FUZZ_CHECK(t == buf, "not the buffer given");
	check_terminated(buf, sizeof(buf), "error text");
	size_t n = strlen(buf);
	if (!len) {
		FUZZ_CHECK(n == 0, "text '%s' from no body", buf);
		return;
	}
	if (n <= len && memcmp(buf, body, n) == 0)
		return;
	json_t *j = json_loadb(body, len, 0, NULL);
	json_t *e = j ? json_object_get(j, "error") : NULL;
	FUZZ_CHECK(json_is_string(e) && strncmp(json_string_value(e), buf, n) == 0,
	           "text '%s' is neither the error string nor a prefix of the body", buf);
	json_decref(j);
}

static char *dump(json_t *o, size_t *len)
{
	char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
	json_decref(o);
	FUZZ_CHECK(s != NULL, "cannot write the values back");
	*len = strlen(s);
	return s;
}

static void check_join(const char *body, size_t len)
{
	char wid[KOLO_RDZV_ID_MAX];
	int lease = -1;
	if (!rdzv_client_parse_join(body, len, wid, &lease))
		return;
	check_terminated(wid, sizeof(wid), "worker_id");
	FUZZ_CHECK(wid[0] != '\0' && lease > 0, "worker_id '%s' lease %d", wid, lease);
	size_t n;
	char *again = dump(json_pack("{s:s,s:i}", "worker_id", wid, "lease_ms", lease), &n);
	char wid2[KOLO_RDZV_ID_MAX];
	int lease2 = -1;
	FUZZ_CHECK(rdzv_client_parse_join(again, n, wid2, &lease2), "refused %s", again);
	FUZZ_CHECK(strcmp(wid, wid2) == 0 && lease == lease2, "changed by a round trip: %s", again);
	free(again);
}

/* The assignment as the server writes it (server_state.c). */
static char *assignment_text(const struct kolo_rdzv_assignment *a, size_t *len)
{
	json_t *members = json_array();
	for (int i = 0; i < a->n_members; i++)
		json_array_append_new(
		        members, json_pack("{s:i,s:s,s:s}", "rank", a->members[i].rank, "worker_id",
		                           a->members[i].worker_id, "host", a->members[i].host));
	return dump(json_pack("{s:I,s:i,s:i,s:i,s:i,s:i,s:i,s:o}", "round", (json_int_t)a->round,
	                      "rank", a->rank, "size", a->size, "local_rank", a->local_rank,
	                      "local_size", a->local_size, "cross_rank", a->cross_rank,
	                      "cross_size", a->cross_size, "members", members),
	            len);
}

static void check_assignment(const char *body, size_t len)
{
	struct kolo_rdzv_assignment a = {0};
	const char *why = NULL;
	kolo_status_t st = rdzv_client_parse_assignment(body, len, &a, &why);
	if (st != KOLO_OK) {
		FUZZ_CHECK(st == KOLO_EPROTO || st == KOLO_ENOMEM, "status %d", st);
		FUZZ_CHECK(why && why[0], "refused without a reason");
		FUZZ_CHECK(a.members == NULL, "a refused reply filled the assignment");
		return;
	}
	FUZZ_CHECK(a.round >= 1 && a.size >= 1 && a.rank >= 0 && a.rank < a.size,
	           "round %lld rank %d size %d", (long long)a.round, a.rank, a.size);
	FUZZ_CHECK(a.local_rank >= 0 && a.local_rank < a.local_size && a.cross_rank >= 0 &&
	                   a.cross_rank < a.cross_size,
	           "local %d/%d cross %d/%d", a.local_rank, a.local_size, a.cross_rank,
	           a.cross_size);
	FUZZ_CHECK(a.n_members == a.size && a.members, "%d members of %d", a.n_members, a.size);
	for (int i = 0; i < a.n_members; i++) {
		FUZZ_CHECK(a.members[i].rank == i, "member %d says rank %d", i, a.members[i].rank);
		check_terminated(a.members[i].worker_id, KOLO_RDZV_ID_MAX, "member worker_id");
		check_terminated(a.members[i].host, KOLO_RDZV_HOST_MAX, "member host");
	}
	size_t n;
	char *again = assignment_text(&a, &n);
	struct kolo_rdzv_assignment b = {0};
	FUZZ_CHECK(rdzv_client_parse_assignment(again, n, &b, &why) == KOLO_OK, "refused %s (%s)",
	           again, why);
	FUZZ_CHECK(b.round == a.round && b.rank == a.rank && b.size == a.size &&
	                   b.local_rank == a.local_rank && b.local_size == a.local_size &&
	                   b.cross_rank == a.cross_rank && b.cross_size == a.cross_size &&
	                   memcmp(a.members, b.members, (size_t)a.size * sizeof(*a.members)) == 0,
	           "changed by a round trip: %s", again);
	free(again);
	kolo_rdzv_assignment_fini(&a);
	kolo_rdzv_assignment_fini(&b);
}

static void check_heartbeat(const char *body, size_t len)
{
	int64_t round = -7;
	bool pending = false;
	if (!rdzv_client_parse_heartbeat(body, len, &round, &pending))
		return;
	size_t n;
	char *again = dump(
	        json_pack("{s:I,s:b}", "round", (json_int_t)round, "pending_change", pending), &n);
	int64_t round2 = -7;
	bool pending2 = !pending;
	FUZZ_CHECK(rdzv_client_parse_heartbeat(again, n, &round2, &pending2), "refused %s", again);
	FUZZ_CHECK(round == round2 && pending == pending2, "changed by a round trip: %s", again);
	free(again);
}

static void check_job_round(const char *body, size_t len)
{
	int64_t round = -7;
	int size = -7;
	if (!rdzv_client_parse_job_round(body, len, &round, &size))
		return;
	FUZZ_CHECK(size >= 0, "size %d", size);
	/* A status document with that many members says the same. */
	json_t *members = json_array();
	for (int i = 0; i < size && i < 4096; i++)
		json_array_append_new(members, json_object());
	if (size > 4096) {
		json_decref(members);
		return;
	}
	size_t n;
	char *again =
	        dump(json_pack("{s:I,s:o}", "round", (json_int_t)round, "members", members), &n);
	int64_t round2 = -7;
	int size2 = -7;
	FUZZ_CHECK(rdzv_client_parse_job_round(again, n, &round2, &size2), "refused %s", again);
	FUZZ_CHECK(round == round2 && size == size2, "changed by a round trip: %s", again);
	free(again);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	size_t len = size - 1;
	char *body = malloc(len ? len : 1);
	FUZZ_CHECK(body != NULL, "out of memory");
	memcpy(body, data + 1, len);
	switch (data[0] % 5) {
	case 0:
		check_error(body, len);
		break;
	case 1:
		check_join(body, len);
		break;
	case 2:
		check_assignment(body, len);
		break;
	case 3:
		check_heartbeat(body, len);
		break;
	default:
		check_job_round(body, len);
		break;
	}
	free(body);
	return 0;
}
