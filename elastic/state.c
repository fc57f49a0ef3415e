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

/* The packed registry: u32 buffers, then per buffer u32 name length, the
 * name, u32 dtype, u64 count and the bytes; integers little-endian. */
static unsigned char *put_u(unsigned char *p, uint64_t v, int bytes)
{
	for (int i = 0; i < bytes; i++)
		p[i] = (unsigned char)(v >> (8 * i));
	return p + bytes;
}

static bool take_u(const unsigned char **p, const unsigned char *end, int bytes, uint64_t *v)
{
	if (end - *p < bytes)
		return false;
	*v = 0;
	for (int i = 0; i < bytes; i++)
		*v |= (uint64_t)(*p)[i] << (8 * i);
	*p += bytes;
	return true;
}

kolo_status_t kolo_elastic_state_pack(const struct kolo_elastic_state *s, void **out, size_t *len)
{
	size_t n = 4;
	for (size_t i = 0; i < s->n; i++)
		n += 4 + strlen(s->bufs[i].name) + 4 + 8 + s->bufs[i].bytes;
	unsigned char *buf = malloc(n);
	if (!buf)
		return KOLO_ENOMEM;
	unsigned char *p = put_u(buf, s->n, 4);
	for (size_t i = 0; i < s->n; i++) {
		const struct kolo_elastic_buf *b = &s->bufs[i];
		size_t nl = strlen(b->name);
		p = put_u(p, nl, 4);
		memcpy(p, b->name, nl);
		p = put_u(p + nl, (uint64_t)b->dtype, 4);
		p = put_u(p, b->count, 8);
		if (b->bytes)
			memcpy(p, b->saved, b->bytes);
		p += b->bytes;
	}
	*out = buf;
	*len = n;
	return KOLO_OK;
}

/* Checks that buffer b is described next in the packed registry at *p. */
static bool take_buf(const unsigned char **p, const unsigned char *end,
                     const struct kolo_elastic_buf *b)
{
	uint64_t nl, dtype, count;
	if (!take_u(p, end, 4, &nl) || nl != strlen(b->name) || (uint64_t)(end - *p) < nl ||
	    memcmp(*p, b->name, nl) != 0)
		return false;
	*p += nl;
	return take_u(p, end, 4, &dtype) && dtype == (uint64_t)b->dtype &&
	       take_u(p, end, 8, &count) && count == b->count && (uint64_t)(end - *p) >= b->bytes;
}

kolo_status_t kolo_elastic_state_unpack(struct kolo_elastic_state *s, const void *data, size_t len,
                                        struct kolo_errbuf *eb)
{
	const unsigned char *p = data, *end = p + len;
	uint64_t n;
	if (!take_u(&p, end, 4, &n) || n != s->n)
		return kolo_fail(eb, KOLO_EMISMATCH,
		                 "the saved state has other buffers than the "
		                 "registered ones");
	/* Checked whole before any buffer is written. */
	for (size_t i = 0; i < s->n; i++) {
		if (!take_buf(&p, end, &s->bufs[i]))
			return kolo_fail(
			        eb, KOLO_EMISMATCH,
			        "the saved state does not match buffer %s (name, dtype, count)",
			        s->bufs[i].name);
		p += s->bufs[i].bytes;
	}
	if (p != end)
		return kolo_fail(eb, KOLO_EMISMATCH, "the saved state has bytes after its buffers");
	p = data;
	take_u(&p, end, 4, &n);
	for (size_t i = 0; i < s->n; i++) {
		struct kolo_elastic_buf *b = &s->bufs[i];
		take_buf(&p, end, b);
		if (b->bytes)
			memcpy(b->buf, p, b->bytes);
		p += b->bytes;
	}
	return KOLO_OK;
}
