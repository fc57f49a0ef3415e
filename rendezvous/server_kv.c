/* server_kv: each job's key-value store and the server-wide totals that
 * bound it. Like server_state.c, no locks: the caller holds the server's. */
#include "server_internal.h"

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
