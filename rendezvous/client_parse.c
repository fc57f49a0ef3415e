/* client_parse: jansson readings of the server's replies; see
 * client_parse.h. */
#include "client_parse.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ASSIGN_SIZE_MAX (1 << 20) /* most members an assignment may list */

static bool get_int(json_t *o, const char *key, int64_t *out)
{
	json_t *v = json_object_get(o, key);
	if (!json_is_integer(v))
		return false;
	*out = json_integer_value(v);
	return true;
}

static bool get_str(json_t *o, const char *key, char *out, size_t size)
{
	json_t *v = json_object_get(o, key);
	if (!json_is_string(v) || json_string_length(v) >= size)
		return false;
	memcpy(out, json_string_value(v), json_string_length(v) + 1);
	return true;
}

/* The body as a JSON object, NULL when it is none. */
static json_t *load_object(const char *body, size_t len)
{
	json_t *j = body ? json_loadb(body, len, 0, NULL) : NULL;
	if (j && !json_is_object(j)) {
		json_decref(j);
		return NULL;
	}
	return j;
}

const char *rdzv_client_parse_error(const char *body, size_t len, char *buf, size_t size)
{
	buf[0] = '\0';
	if (!body)
		return buf;
	json_t *j = json_loadb(body, len, 0, NULL);
	json_t *e = j ? json_object_get(j, "error") : NULL;
	if (json_is_string(e))
		snprintf(buf, size, "%s", json_string_value(e));
	else
		snprintf(buf, size, "%.*s", (int)KOLO_MIN(len, (size_t)200), body);
	json_decref(j);
	return buf;
}

bool rdzv_client_parse_join(const char *body, size_t len, char wid[KOLO_RDZV_ID_MAX], int *lease_ms)
{
	json_t *j = load_object(body, len);
	int64_t lease;
	bool ok = j && get_str(j, "worker_id", wid, KOLO_RDZV_ID_MAX) && wid[0] &&
	          get_int(j, "lease_ms", &lease) && lease > 0 && lease <= INT32_MAX;
	json_decref(j);
	if (ok)
		*lease_ms = (int)lease;
	return ok;
}

/* Reads members[] into m (size entries, by rank); NULL or the fault. */
static const char *read_members(json_t *members, struct kolo_rdzv_member *m, int64_t size)
{
	for (int64_t i = 0; i < size; i++)
		m[i].rank = -1;
	for (size_t i = 0; i < (size_t)size; i++) {
		json_t *e = json_array_get(members, i);
		int64_t mr;
		if (!json_is_object(e) || !get_int(e, "rank", &mr) || mr < 0 || mr >= size)
			return "malformed member";
		if (m[mr].rank != -1)
			return "duplicate member rank";
		if (!get_str(e, "worker_id", m[mr].worker_id, sizeof(m[mr].worker_id)) ||
		    !get_str(e, "host", m[mr].host, sizeof(m[mr].host)))
			return "malformed member";
		m[mr].zone[0] = '\0';
		if (json_object_get(e, "zone") &&
		    !get_str(e, "zone", m[mr].zone, sizeof(m[mr].zone)))
			return "malformed member zone";
		m[mr].rank = (int)mr;
	}
	return NULL;
}

kolo_status_t rdzv_client_parse_assignment(const char *body, size_t len,
                                           struct kolo_rdzv_assignment *out, const char **why)
{
	json_t *j = load_object(body, len);
	int64_t round, rank, size, lr, ls, cr, cs;
	json_t *members = j ? json_object_get(j, "members") : NULL;
	struct kolo_rdzv_member *m = NULL;
	kolo_status_t st = KOLO_EPROTO;
	*why = "missing or mistyped field";
	if (!j || !get_int(j, "round", &round) || !get_int(j, "rank", &rank) ||
	    !get_int(j, "size", &size) || !get_int(j, "local_rank", &lr) ||
	    !get_int(j, "local_size", &ls) || !get_int(j, "cross_rank", &cr) ||
	    !get_int(j, "cross_size", &cs) || !json_is_array(members))
		goto out;
	*why = "inconsistent values";
	/* local_size and cross_size bounded by size, so that none wraps when
	 * narrowed to int. */
	if (round < 1 || size < 1 || size > ASSIGN_SIZE_MAX || rank < 0 || rank >= size || ls < 1 ||
	    ls > size || lr < 0 || lr >= ls || cs < 1 || cs > size || cr < 0 || cr >= cs ||
	    json_array_size(members) != (size_t)size)
		goto out;
	m = calloc((size_t)size, sizeof(*m));
	if (!m) {
		*why = "out of memory";
		st = KOLO_ENOMEM;
		goto out;
	}
	*why = read_members(members, m, size);
	if (*why)
		goto out;
	*out = (struct kolo_rdzv_assignment){.round = round,
	                                     .rank = (int)rank,
	                                     .size = (int)size,
	                                     .local_rank = (int)lr,
	                                     .local_size = (int)ls,
	                                     .cross_rank = (int)cr,
	                                     .cross_size = (int)cs,
	                                     .n_members = (int)size,
	                                     .members = m};
	m = NULL;
	st = KOLO_OK;
out:
	free(m);
	json_decref(j);
	return st;
}

bool rdzv_client_parse_heartbeat(const char *body, size_t len, int64_t *round, bool *pending_change)
{
	json_t *j = load_object(body, len);
	json_t *pc = j ? json_object_get(j, "pending_change") : NULL;
	bool ok = j && get_int(j, "round", round) && json_is_boolean(pc);
	if (ok)
		*pending_change = json_is_true(pc);
	json_decref(j);
	return ok;
}

bool rdzv_client_parse_job_round(const char *body, size_t len, int64_t *round, int *size)
{
	json_t *j = body ? json_loadb(body, len, 0, NULL) : NULL;
	json_t *members = j ? json_object_get(j, "members") : NULL;
	bool ok = j && get_int(j, "round", round) && json_is_array(members);
	if (ok)
		*size = (int)json_array_size(members);
	json_decref(j);
	return ok;
}

bool rdzv_client_parse_job_sizes(const char *body, size_t len, int *min_np, int *members,
                                 int *waiting)
{
	json_t *j = body ? json_loadb(body, len, 0, NULL) : NULL;
	json_t *m = j ? json_object_get(j, "members") : NULL;
	json_t *w = j ? json_object_get(j, "waiting") : NULL;
	int64_t v = 0;
	bool ok = j && get_int(j, "min_np", &v) && json_is_array(m) && json_is_array(w);
	if (ok) {
		*min_np = (int)v;
		*members = (int)json_array_size(m);
		*waiting = (int)json_array_size(w);
	}
	json_decref(j);
	return ok;
}
