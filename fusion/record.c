/* record: the codec of the records in a rank's negotiation message (the
 * format is in fusion_internal.h). Decoding reads only its arguments, so it
 * can be fuzzed on its own (tests/fuzz/fuzz_negotiate_record.c); decide.c
 * applies what it returns. */
#include "fusion_internal.h"

#include <stdlib.h>
#include <string.h>

/* The longest reason a FAIL record may carry (exclusive). */
#define FAIL_WHY_MAX 65536

/* ---- encoding ----------------------------------------------------------- */

static void put_bytes(struct fusion_wbuf *w, const void *p, size_t len)
{
	if (w->oom)
		return;
	if (w->len + len > w->cap) {
		size_t cap = w->cap ? w->cap * 2 : 256;
		while (cap < w->len + len)
			cap *= 2;
		uint8_t *nb = realloc(w->b, cap);
		if (!nb) {
			w->oom = true;
			return;
		}
		w->b = nb;
		w->cap = cap;
	}
	memcpy(w->b + w->len, p, len);
	w->len += len;
}

/* put_u8, put_u32, put_u64, put_f64: one field in host byte order. */
#define DEFINE_PUT(name, type)                                                                     \
	static void name(struct fusion_wbuf *w, type v)                                            \
	{                                                                                          \
		put_bytes(w, &v, sizeof(v));                                                       \
	}
DEFINE_PUT(put_u8, uint8_t)
DEFINE_PUT(put_u32, uint32_t)
DEFINE_PUT(put_u64, uint64_t)
DEFINE_PUT(put_f64, double)
static void put_str(struct fusion_wbuf *w, const char *s)
{
	uint32_t l = (uint32_t)strlen(s);
	put_u32(w, l);
	put_bytes(w, s, l);
}

void fusion_record_put_request(struct fusion_wbuf *w, const char *name,
                               const struct fusion_params *p)
{
	put_u8(w, FUSION_RECORD_REQUEST);
	put_u8(w, p->kind);
	put_u8(w, p->dtype);
	put_u8(w, p->op);
	put_u8(w, p->mem);
	put_u32(w, (uint32_t)p->root);
	put_f64(w, p->prescale);
	put_f64(w, p->postscale);
	put_u32(w, p->ncounts);
	for (uint32_t k = 0; k < p->ncounts; k++)
		put_u64(w, p->counts[k]);
	put_str(w, name);
}

void fusion_record_put_params(struct fusion_wbuf *w, uint64_t fusion_threshold,
                              double cycle_time_ms)
{
	put_u8(w, FUSION_RECORD_PARAMS);
	put_u64(w, fusion_threshold);
	put_f64(w, cycle_time_ms);
}

void fusion_record_put_fail(struct fusion_wbuf *w, kolo_status_t st, const char *name,
                            const char *why)
{
	put_u8(w, FUSION_RECORD_FAIL);
	put_u8(w, (uint8_t)st);
	put_str(w, name);
	put_str(w, why);
}

/* ---- decoding ----------------------------------------------------------- */

/* A reader over one message; bad is sticky and reads past the end give 0. */
struct reader {
	const uint8_t *b;
	size_t len, off;
	bool bad;
};

static void get_bytes(struct reader *r, void *p, size_t len)
{
	if (r->bad || r->len - r->off < len) {
		r->bad = true;
		memset(p, 0, len);
		return;
	}
	memcpy(p, r->b + r->off, len);
	r->off += len;
}

/* get_u8, get_u32, get_u64, get_f64: one field, 0 past the end. */
#define DEFINE_GET(name, type)                                                                     \
	static type name(struct reader *r)                                                         \
	{                                                                                          \
		type v;                                                                            \
		get_bytes(r, &v, sizeof(v));                                                       \
		return v;                                                                          \
	}
DEFINE_GET(get_u8, uint8_t)
DEFINE_GET(get_u32, uint32_t)
DEFINE_GET(get_u64, uint64_t)
DEFINE_GET(get_f64, double)
/* A malloc'd copy of a length-prefixed string shorter than max, or NULL
 * (r->bad set). */
static char *get_str(struct reader *r, size_t max)
{
	uint32_t l = get_u32(r);
	if (r->bad || l >= max || r->len - r->off < l) {
		r->bad = true;
		return NULL;
	}
	char *s = malloc((size_t)l + 1);
	if (!s) {
		r->bad = true;
		return NULL;
	}
	memcpy(s, r->b + r->off, l);
	s[l] = '\0';
	r->off += l;
	return s;
}

static kolo_status_t decode_request(struct reader *rd, struct fusion_record *out)
{
	struct fusion_params *p = &out->p;
	p->kind = get_u8(rd);
	p->dtype = get_u8(rd);
	p->op = get_u8(rd);
	p->mem = get_u8(rd);
	p->root = (int32_t)get_u32(rd);
	p->prescale = get_f64(rd);
	p->postscale = get_f64(rd);
	p->ncounts = get_u32(rd);
	/* Bound ncounts by the bytes left before allocating for it. */
	if (rd->bad || p->ncounts > (rd->len - rd->off) / 8 || p->kind == 0 ||
	    p->kind >= KOLO_FK_COUNT)
		return KOLO_EPROTO;
	if (p->ncounts) {
		p->counts = malloc(p->ncounts * sizeof(uint64_t));
		if (!p->counts)
			return KOLO_ENOMEM;
		for (uint32_t k = 0; k < p->ncounts; k++)
			p->counts[k] = get_u64(rd);
	}
	out->name = get_str(rd, FUSION_NAME_MAX);
	return out->name ? KOLO_OK : KOLO_EPROTO;
}

static kolo_status_t decode_params(struct reader *rd, struct fusion_record *out)
{
	out->fusion_threshold = get_u64(rd);
	out->cycle_time_ms = get_f64(rd);
	return rd->bad ? KOLO_EPROTO : KOLO_OK;
}

static kolo_status_t decode_fail(struct reader *rd, struct fusion_record *out)
{
	out->status = (kolo_status_t)get_u8(rd);
	out->name = get_str(rd, FUSION_NAME_MAX);
	out->why = get_str(rd, FAIL_WHY_MAX);
	return out->name && out->why ? KOLO_OK : KOLO_EPROTO;
}

kolo_status_t fusion_record_decode(const uint8_t *msg, size_t len, size_t *off,
                                   struct fusion_record *out)
{
	memset(out, 0, sizeof(*out));
	struct reader rd = {msg, len, *off, false};
	kolo_status_t st;
	out->type = get_u8(&rd);
	switch (out->type) {
	case FUSION_RECORD_REQUEST:
		st = decode_request(&rd, out);
		break;
	case FUSION_RECORD_PARAMS:
		st = decode_params(&rd, out);
		break;
	case FUSION_RECORD_FAIL:
		st = decode_fail(&rd, out);
		break;
	default:
		st = KOLO_EPROTO;
	}
	if (st != KOLO_OK) {
		fusion_record_fini(out);
		return st;
	}
	*off = rd.off;
	return KOLO_OK;
}

void fusion_record_fini(struct fusion_record *r)
{
	if (!r)
		return;
	free(r->name);
	free(r->why);
	fusion_params_fini(&r->p);
	memset(r, 0, sizeof(*r));
}
