/* server_json: validation of the request bodies the server accepts. Every
 * error message is meant for the client, so it names the field. */
#include "rendezvous.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

static bool id_char(char c, bool allow_slash)
{
	return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
	       c == '.' || c == '_' || c == ':' || c == '-' || (allow_slash && c == '/');
}

static bool valid_chars(const char *s, size_t max, bool allow_slash)
{
	if (!s || !*s)
		return false;
	size_t n = 0;
	for (; s[n]; n++) {
		if (n + 1 >= max || !id_char(s[n], allow_slash))
			return false;
	}
	return true;
}

bool kolo_rdzv_valid_id(const char *s, bool allow_slash)
{
	return valid_chars(s, KOLO_RDZV_ID_MAX, allow_slash);
}

bool kolo_rdzv_valid_host(const char *s)
{
	return valid_chars(s, KOLO_RDZV_HOST_MAX, false);
}

static json_t *load_object(const char *body, size_t len, char *err, size_t errsize)
{
	if (!body || len == 0) {
		snprintf(err, errsize, "empty body: a JSON object is required");
		return NULL;
	}
	json_error_t je;
	json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
	if (!root) {
		snprintf(err, errsize, "malformed JSON: %s (line %d, column %d)", je.text, je.line,
		         je.column);
		return NULL;
	}
	if (!json_is_object(root)) {
		snprintf(err, errsize, "the body must be a JSON object");
		json_decref(root);
		return NULL;
	}
	return root;
}

/* Reads an optional integer field in [lo, hi]. Returns 1 when present, 0
 * when absent, -1 (err set) when mistyped or out of range. */
static int get_int(json_t *o, const char *name, int64_t lo, int64_t hi, int64_t *out, char *err,
                   size_t errsize)
{
	json_t *v = json_object_get(o, name);
	if (!v || json_is_null(v))
		return 0;
	if (!json_is_integer(v)) {
		snprintf(err, errsize, "field \"%s\" must be an integer", name);
		return -1;
	}
	json_int_t x = json_integer_value(v);
	if (x < lo || x > hi) {
		snprintf(err, errsize, "field \"%s\" must be in [%lld, %lld]", name, (long long)lo,
		         (long long)hi);
		return -1;
	}
	*out = x;
	return 1;
}

static int get_str(json_t *o, const char *name, const char **out, char *err, size_t errsize)
{
	json_t *v = json_object_get(o, name);
	if (!v || json_is_null(v))
		return 0;
	if (!json_is_string(v)) {
		snprintf(err, errsize, "field \"%s\" must be a string", name);
		return -1;
	}
	*out = json_string_value(v);
	return 1;
}

#define NP_MAX     1000000
#define SETTLE_MAX 3600000

kolo_status_t kolo_rdzv_parse_job_config(const char *body, size_t len,
                                         struct kolo_rdzv_job_config *cfg, char *err,
                                         size_t errsize)
{
	json_t *o = load_object(body, len, err, errsize);
	if (!o)
		return KOLO_EINVAL;
	struct kolo_rdzv_job_config c = *cfg;
	int64_t v;
	int r;
	kolo_status_t st = KOLO_EINVAL;
	if ((r = get_int(o, "min_np", 1, NP_MAX, &v, err, errsize)) < 0)
		goto out;
	if (r)
		c.min_np = (int)v;
	if ((r = get_int(o, "max_np", 0, NP_MAX, &v, err, errsize)) < 0)
		goto out;
	if (r)
		c.max_np = (int)v;
	if ((r = get_int(o, "settle_ms", 0, SETTLE_MAX, &v, err, errsize)) < 0)
		goto out;
	if (r)
		c.settle_ms = (int)v;
	if (c.max_np != 0 && c.max_np < c.min_np) {
		snprintf(err, errsize, "max_np (%d) must be 0 (no limit) or at least min_np (%d)",
		         c.max_np, c.min_np);
		goto out;
	}
	*cfg = c;
	st = KOLO_OK;
out:
	json_decref(o);
	return st;
}

kolo_status_t kolo_rdzv_parse_join(const char *body, size_t len, struct kolo_rdzv_join_req *out,
                                   char *err, size_t errsize)
{
	json_t *o = load_object(body, len, err, errsize);
	if (!o)
		return KOLO_EINVAL;
	kolo_status_t st = KOLO_EINVAL;
	memset(out, 0, sizeof(*out));
	out->round = -1;
	out->rank = -1;
	const char *s = NULL;
	int r = get_str(o, "host", &s, err, errsize);
	if (r < 0)
		goto out;
	if (r == 0) {
		snprintf(err, errsize, "missing field \"host\"");
		goto out;
	}
	if (!kolo_rdzv_valid_host(s)) {
		snprintf(err, errsize, "field \"host\" must be 1-%d characters of [A-Za-z0-9._:-]",
		         KOLO_RDZV_HOST_MAX - 1);
		goto out;
	}
	snprintf(out->host, sizeof(out->host), "%s", s);
	if ((r = get_str(o, "zone", &s, err, errsize)) < 0)
		goto out;
	if (r && s[0] && !kolo_rdzv_valid_host(s)) {
		snprintf(err, errsize,
		         "field \"zone\" must be empty or 1-%d characters of [A-Za-z0-9._:-]",
		         KOLO_RDZV_HOST_MAX - 1);
		goto out;
	}
	if (r)
		snprintf(out->zone, sizeof(out->zone), "%s", s);
	if ((r = get_str(o, "worker_id", &s, err, errsize)) < 0)
		goto out;
	if (r) {
		if (!kolo_rdzv_valid_id(s, false)) {
			snprintf(err, errsize,
			         "field \"worker_id\" must be 1-%d characters of [A-Za-z0-9._:-]",
			         KOLO_RDZV_ID_MAX - 1);
			goto out;
		}
		snprintf(out->worker_id, sizeof(out->worker_id), "%s", s);
	}
	int64_t round = -1, rank = -1;
	int has_round = get_int(o, "round", 0, INT64_MAX, &round, err, errsize);
	if (has_round < 0)
		goto out;
	int has_rank = get_int(o, "rank", 0, NP_MAX, &rank, err, errsize);
	if (has_rank < 0)
		goto out;
	if (has_round != has_rank) {
		snprintf(err, errsize, "fields \"round\" and \"rank\" go together");
		goto out;
	}
	if (has_round && !out->worker_id[0]) {
		snprintf(err, errsize, "a claim of \"round\" and \"rank\" needs \"worker_id\"");
		goto out;
	}
	if (has_round && round > 0) {
		out->round = round;
		out->rank = (int)rank;
	}
	st = KOLO_OK;
out:
	json_decref(o);
	return st;
}

kolo_status_t kolo_rdzv_parse_failure(const char *body, size_t len, struct kolo_rdzv_failure *out,
                                      char *err, size_t errsize)
{
	json_t *o = load_object(body, len, err, errsize);
	if (!o)
		return KOLO_EINVAL;
	kolo_status_t st = KOLO_EINVAL;
	memset(out, 0, sizeof(*out));
	out->round = -1;
	out->rank = -1;
	const char *id = NULL;
	int has_id = get_str(o, "worker_id", &id, err, errsize);
	if (has_id < 0)
		goto out;
	if (has_id && !kolo_rdzv_valid_id(id, false)) {
		snprintf(err, errsize,
		         "field \"worker_id\" must be 1-%d characters of [A-Za-z0-9._:-]",
		         KOLO_RDZV_ID_MAX - 1);
		goto out;
	}
	int64_t rd = -1, rk = -1;
	int has_round = get_int(o, "round", 0, INT64_MAX, &rd, err, errsize);
	if (has_round < 0)
		goto out;
	int has_rank = get_int(o, "rank", 0, NP_MAX, &rk, err, errsize);
	if (has_rank < 0)
		goto out;
	if (has_id && has_round != has_rank) {
		snprintf(err, errsize, "fields \"round\" and \"rank\" go together");
		goto out;
	}
	if (!has_id && !has_round) {
		snprintf(err, errsize, "missing field \"round\" (or \"worker_id\")");
		goto out;
	}
	if (!has_id && !has_rank) {
		snprintf(err, errsize, "missing field \"rank\"");
		goto out;
	}
	if (has_id)
		snprintf(out->worker_id, sizeof(out->worker_id), "%s", id);
	out->round = rd;
	out->rank = (int)rk;
	st = KOLO_OK;
out:
	json_decref(o);
	return st;
}
