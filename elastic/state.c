/* The state registry: registered buffers and their host copies. */
#include "membership.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kolo_elastic_state_init(struct kolo_elastic_state *s)
{
	memset(s, 0, sizeof(*s));
}

void kolo_elastic_state_fini(struct kolo_elastic_state *s)
{
	if (!s)
		return;
	for (size_t i = 0; i < s->n; i++)
		free(s->bufs[i].saved);
	free(s->bufs);
	memset(s, 0, sizeof(*s));
}

kolo_status_t kolo_elastic_state_add(struct kolo_elastic_state *s, const char *name, void *buf,
                                     size_t count, kolo_dtype_t dtype, struct kolo_errbuf *eb)
{
	size_t es = kolo_dtype_size(dtype);
	if (!name || !name[0] || strlen(name) >= KOLO_ELASTIC_NAME_MAX)
		return kolo_fail(eb, KOLO_EINVAL, "state: a name needs 1..%d characters",
		                 KOLO_ELASTIC_NAME_MAX - 1);
	if (es == 0)
		return kolo_fail(eb, KOLO_EINVAL, "state %s: invalid dtype %d", name, (int)dtype);
	if ((!buf && count > 0) || count > SIZE_MAX / es)
		return kolo_fail(eb, KOLO_EINVAL, "state %s: bad buffer (%zu elements)", name,
		                 count);
	for (size_t i = 0; i < s->n; i++)
		if (strcmp(s->bufs[i].name, name) == 0)
			return kolo_fail(eb, KOLO_EINVAL, "state %s: registered twice", name);
	if (s->n == s->cap) {
		size_t cap = s->cap ? 2 * s->cap : 8;
		struct kolo_elastic_buf *nb = realloc(s->bufs, cap * sizeof(*nb));
		if (!nb)
			return kolo_fail(eb, KOLO_ENOMEM, "state: out of memory");
		s->bufs = nb;
		s->cap = cap;
	}
	struct kolo_elastic_buf *b = &s->bufs[s->n];
	memset(b, 0, sizeof(*b));
	snprintf(b->name, sizeof(b->name), "%s", name);
	b->buf = buf;
	b->count = count;
	b->dtype = dtype;
	b->bytes = count * es;
	b->saved = malloc(b->bytes ? b->bytes : 1);
	if (!b->saved)
		return kolo_fail(eb, KOLO_ENOMEM, "state %s: cannot allocate %zu bytes", name,
		                 b->bytes);
	/* A buffer registered after a commit joins it as it is now. */
	if (b->bytes)
		memcpy(b->saved, buf, b->bytes);
	s->n++;
	return KOLO_OK;
}

void kolo_elastic_state_save(struct kolo_elastic_state *s)
{
	for (size_t i = 0; i < s->n; i++)
		if (s->bufs[i].bytes)
			memcpy(s->bufs[i].saved, s->bufs[i].buf, s->bufs[i].bytes);
	s->saved = true;
}

kolo_status_t kolo_elastic_state_load(struct kolo_elastic_state *s)
{
	if (!s->saved)
		return KOLO_EINVAL;
	for (size_t i = 0; i < s->n; i++)
		if (s->bufs[i].bytes)
			memcpy(s->bufs[i].buf, s->bufs[i].saved, s->bufs[i].bytes);
	return KOLO_OK;
}
