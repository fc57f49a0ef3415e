/* server_kv: each job's key-value store, with the atomic operations of a
 * c10d store (add, compare_set, delete), and the server-wide totals that
 * bound it. Like server_state.c, no locks: the caller holds the server's. */
#include "server_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool rdzv_kv_fits(const struct rdzv_state *st, const struct rdzv_job *j, const char *key,
                  size_t len)
{
	const struct rdzv_kv_val *old = kolo_strmap_get(&j->kv, key);
	size_t old_len = old ? old->len : 0;
	return st->kv_bytes - old_len + len <= RDZV_KV_TOTAL_MAX;
}

kolo_status_t rdzv_kv_put(struct rdzv_state *st, struct rdzv_job *j, const char *key,
                          const void *data, size_t len)
{
	struct rdzv_kv_val *v = malloc(sizeof(*v) + len);
	if (!v)
		return KOLO_ENOMEM;
	v->len = len;
	if (len)
		memcpy(v->data, data, len);
	bool ok;
	struct rdzv_kv_val *old = kolo_strmap_put(&j->kv, key, v, &ok);
	if (!ok) {
		free(v);
		return KOLO_ENOMEM;
	}
	if (old) {
		st->kv_bytes -= old->len;
		free(old);
	} else {
		st->kv_keys++;
	}
	st->kv_bytes += v->len;
	rdzv_wait_wake_kv(j, key, v);
	return KOLO_OK;
}

char *rdzv_kv_copy(const struct rdzv_kv_val *v)
{
	char *b = malloc(KOLO_MAX(v->len, 1));
	if (b)
		memcpy(b, v->data, v->len);
	return b;
}

void rdzv_kv_forget(struct rdzv_state *st, struct rdzv_job *j)
{
	KOLO_STRMAP_FOREACH(&j->kv, e)
	{
		const struct rdzv_kv_val *v = e->val;
		st->kv_keys--;
		st->kv_bytes -= v->len;
	}
}

bool rdzv_kv_delete(struct rdzv_state *st, struct rdzv_job *j, const char *key)
{
	struct rdzv_kv_val *v = kolo_strmap_del(&j->kv, key);
	if (!v)
		return false;
	st->kv_keys--;
	st->kv_bytes -= v->len;
	free(v);
	return true;
}

size_t rdzv_kv_count(const struct rdzv_job *j)
{
	return j->kv.n;
}

/* Reads len bytes as [+-]digits within int64; nothing else is a number. */
static bool parse_int64(const char *s, size_t len, int64_t *out)
{
	size_t i = len > 0 && (s[0] == '-' || s[0] == '+') ? 1 : 0;
	bool neg = i == 1 && s[0] == '-';
	uint64_t limit = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
	uint64_t x = 0;
	if (i == len)
		return false;
	for (; i < len; i++) {
		if (s[i] < '0' || s[i] > '9')
			return false;
		unsigned d = (unsigned)(s[i] - '0');
		if (x > (limit - d) / 10)
			return false;
		x = x * 10 + d;
	}
	/* x is 2^63 only for INT64_MIN, which (int64_t)x cannot hold. */
	*out = neg ? (x == limit ? INT64_MIN : -(int64_t)x) : (int64_t)x;
	return true;
}

static bool add_overflows(int64_t a, int64_t b)
{
	return (b > 0 && a > INT64_MAX - b) || (b < 0 && a < INT64_MIN - b);
}

/* rdzv_kv_put behind the RDZV_KV_TOTAL_MAX check. */
static enum rdzv_kv_result store(struct rdzv_state *st, struct rdzv_job *j, const char *key,
                                 const void *data, size_t len)
{
	if (!rdzv_kv_fits(st, j, key, len))
		return RDZV_KV_FULL;
	return rdzv_kv_put(st, j, key, data, len) == KOLO_OK ? RDZV_KV_STORED : RDZV_KV_NOMEM;
}

enum rdzv_kv_result rdzv_kv_add(struct rdzv_state *st, struct rdzv_job *j, const char *key,
                                int64_t delta)
{
	const struct rdzv_kv_val *v = kolo_strmap_get(&j->kv, key);
	int64_t x = 0;
	if (v && !parse_int64(v->data, v->len, &x))
		return RDZV_KV_NOT_INT;
	if (add_overflows(x, delta))
		return RDZV_KV_OVERFLOW;
	char text[24]; /* "-9223372036854775808" and its NUL */
	int n = snprintf(text, sizeof(text), "%" PRId64, x + delta);
	return store(st, j, key, text, (size_t)n);
}

enum rdzv_kv_result rdzv_kv_compare_set(struct rdzv_state *st, struct rdzv_job *j, const char *key,
                                        const void *expected, size_t exp_len, const void *desired,
                                        size_t des_len)
{
	const struct rdzv_kv_val *v = kolo_strmap_get(&j->kv, key);
	if (!v && exp_len > 0)
		return RDZV_KV_ABSENT;
	bool match =
	        !v || (v->len == exp_len && (exp_len == 0 || !memcmp(v->data, expected, exp_len)));
	if (!match)
		return RDZV_KV_KEPT;
	return store(st, j, key, desired, des_len);
}
