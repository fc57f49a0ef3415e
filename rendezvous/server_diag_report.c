/* server_diag_report: reading a worker's flight-recorder report (the JSON a
 * worker puts at diag/report/<rank>) into plain structs for the classifier.
 * Lenient by design: a report is the workers' evidence, so every field but
 * "rank" is optional and a field of the wrong type reads as absent. */
#include "server_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *str_field(const json_t *o, const char *key)
{
	const char *s = json_string_value(json_object_get(o, key));
	return s ? s : "";
}

static int64_t int_field(const json_t *o, const char *key, int64_t def)
{
	const json_t *v = json_object_get(o, key);
	if (json_is_integer(v))
		return json_integer_value(v);
	if (json_is_real(v))
		return (int64_t)json_real_value(v);
	return def;
}

static double num_field(const json_t *o, const char *key)
{
	const json_t *v = json_object_get(o, key);
	return json_is_number(v) ? json_number_value(v) : 0.0;
}

/* A rank field: an integer in [-1, RDZV_DIAG_RANKS_MAX), else -1. */
static int rank_field(const json_t *o, const char *key)
{
	int64_t r = int_field(o, key, -1);
	return r >= 0 && r < RDZV_DIAG_RANKS_MAX ? (int)r : -1;
}

static enum rdzv_diag_state state_of(const char *s)
{
	static const char *const names[] = {
	        [RDZV_DIAG_SUBMITTED] = "submitted", [RDZV_DIAG_NEGOTIATED] = "negotiated",
	        [RDZV_DIAG_DATAPLANE] = "dataplane", [RDZV_DIAG_DONE] = "done",
	        [RDZV_DIAG_FAILED] = "failed",
	};
	for (int i = 0; i < RDZV_DIAG_UNKNOWN; i++) {
		if (strcmp(s, names[i]) == 0)
			return (enum rdzv_diag_state)i;
	}
	return RDZV_DIAG_UNKNOWN;
}

bool rdzv_diag_state_open(enum rdzv_diag_state s)
{
	return s == RDZV_DIAG_SUBMITTED || s == RDZV_DIAG_NEGOTIATED || s == RDZV_DIAG_DATAPLANE;
}

static void entry_read(const json_t *o, struct rdzv_diag_entry *e)
{
	e->name = str_field(o, "name");
	e->op = str_field(o, "op");
	e->status = str_field(o, "status");
	e->error = str_field(o, "error");
	e->state = state_of(str_field(o, "state"));
	e->age_ms = num_field(o, "age_ms");
}

/* members: global ranks; entries that are not ranks are skipped. */
static bool members_read(const json_t *a, struct rdzv_diag_comm *c)
{
	size_t n = json_array_size(a);
	if (n == 0)
		return true;
	c->members = malloc(n * sizeof(*c->members));
	if (!c->members)
		return false;
	for (size_t i = 0; i < n; i++) {
		const json_t *v = json_array_get(a, i);
		int64_t r = json_is_integer(v) ? json_integer_value(v) : -1;
		if (r >= 0 && r < RDZV_DIAG_RANKS_MAX)
			c->members[c->n_members++] = (int)r;
	}
	return true;
}

static bool comm_read(const json_t *o, struct rdzv_diag_comm *c)
{
	c->label = str_field(o, "label");
	c->activity = str_field(o, "activity");
	c->waiting_on = rank_field(o, "waiting_on");
	c->waiting_ms = num_field(o, "waiting_ms");
	c->waiting_unacked_ms = json_is_number(json_object_get(o, "waiting_unacked_ms"))
	                                ? num_field(o, "waiting_unacked_ms")
	                                : -1;
	if (!members_read(json_object_get(o, "members"), c))
		return false;
	const json_t *a = json_object_get(o, "entries");
	size_t n = json_array_size(a);
	if (n == 0)
		return true;
	c->entries = calloc(n, sizeof(*c->entries));
	if (!c->entries)
		return false;
	for (size_t i = 0; i < n; i++) {
		const json_t *e = json_array_get(a, i);
		if (json_is_object(e))
			entry_read(e, &c->entries[c->n_entries++]);
	}
	return true;
}

static bool comms_read(const json_t *a, struct rdzv_diag_report *r)
{
	size_t n = json_array_size(a);
	if (n == 0)
		return true;
	r->comms = calloc(n, sizeof(*r->comms));
	if (!r->comms)
		return false;
	for (size_t i = 0; i < n; i++) {
		const json_t *o = json_array_get(a, i);
		if (!json_is_object(o))
			continue;
		if (!comm_read(o, &r->comms[r->n_comms++]))
			return false;
	}
	return true;
}

/* "peers": [{"rank": r, "state": "running"|"stopped"|"gone"}, ...]; other
 * states and malformed items are skipped. */
static bool peers_read(const json_t *a, struct rdzv_diag_report *r)
{
	static const char *const names[] = {[RDZV_PROC_RUNNING] = "running",
	                                    [RDZV_PROC_STOPPED] = "stopped",
	                                    [RDZV_PROC_GONE] = "gone"};
	size_t n = json_array_size(a);
	if (n == 0)
		return true;
	r->peers = calloc(n, sizeof(*r->peers));
	if (!r->peers)
		return false;
	for (size_t i = 0; i < n; i++) {
		const json_t *o = json_array_get(a, i);
		int rank = json_is_object(o) ? rank_field(o, "rank") : -1;
		const char *st = json_is_object(o) ? str_field(o, "state") : "";
		for (int k = 0; rank >= 0 && k < (int)KOLO_ARRAY_SIZE(names); k++) {
			if (strcmp(st, names[k]) == 0) {
				r->peers[r->n_peers++] =
				        (struct rdzv_diag_peer){rank, (enum rdzv_diag_proc)k};
				break;
			}
		}
	}
	return true;
}

kolo_status_t rdzv_diag_report_parse(const char *text, size_t len, struct rdzv_diag_report *out,
                                     char *err, size_t errsize)
{
	memset(out, 0, sizeof(*out));
	json_error_t je;
	out->root = json_loadb(text ? text : "", len, JSON_REJECT_DUPLICATES, &je);
	const char *why = NULL;
	if (!out->root)
		why = je.text;
	else if (!json_is_object(out->root))
		why = "not a JSON object";
	else if ((out->rank = rank_field(out->root, "rank")) < 0)
		why = "no integer \"rank\"";
	if (why) {
		snprintf(err, errsize, "bad report: %s", why);
		rdzv_diag_report_fini(out);
		return KOLO_EINVAL;
	}
	out->size = (int)KOLO_MIN(int_field(out->root, "size", -1), RDZV_DIAG_RANKS_MAX);
	out->round = int_field(out->root, "round", -1);
	out->gen = int_field(out->root, "gen", 0);
	out->time_ms = int_field(out->root, "time_ms", 0);
	out->host = str_field(out->root, "host");
	out->worker_id = str_field(out->root, "worker_id");
	if (!comms_read(json_object_get(out->root, "comms"), out) ||
	    !peers_read(json_object_get(out->root, "peers"), out)) {
		snprintf(err, errsize, "out of memory");
		rdzv_diag_report_fini(out);
		return KOLO_ENOMEM;
	}
	return KOLO_OK;
}

void rdzv_diag_report_fini(struct rdzv_diag_report *r)
{
	for (int i = 0; i < r->n_comms; i++) {
		free(r->comms[i].members);
		free(r->comms[i].entries);
	}
	free(r->comms);
	free(r->peers);
	json_decref(r->root);
	memset(r, 0, sizeof(*r));
	r->rank = -1;
}
