/* params: what one rank says about one named operation, the outcome of a
 * cycle, and the text that explains why the ranks' params disagree. Pure. */
#include "fusion_internal.h"

#include <stdlib.h>
#include <string.h>

const char *fusion_kind_name(int kind)
{
	switch (kind) {
	case KOLO_FK_ALLREDUCE:
		return "ALLREDUCE";
	case KOLO_FK_GROUP:
		return "GROUPED_ALLREDUCE";
	case KOLO_FK_ALLGATHER:
		return "ALLGATHER";
	case KOLO_FK_BROADCAST:
		return "BROADCAST";
	case KOLO_FK_ALLTOALL:
		return "ALLTOALL";
	case KOLO_FK_REDUCESCATTER:
		return "REDUCESCATTER";
	case KOLO_FK_BARRIER:
		return "BARRIER";
	case KOLO_FK_JOIN:
		return "JOIN";
	case KOLO_FK_EXCLUSIVE:
		return "EXCLUSIVE";
	default:
		return "UNKNOWN";
	}
}

kolo_status_t fusion_params_copy(struct fusion_params *dst, const struct fusion_params *src)
{
	*dst = *src;
	dst->counts = NULL;
	if (src->ncounts) {
		dst->counts = malloc(src->ncounts * sizeof(uint64_t));
		if (!dst->counts)
			return KOLO_ENOMEM;
		memcpy(dst->counts, src->counts, src->ncounts * sizeof(uint64_t));
	}
	return KOLO_OK;
}

void fusion_params_fini(struct fusion_params *p)
{
	if (!p)
		return;
	free(p->counts);
	p->counts = NULL;
	p->ncounts = 0;
}

bool fusion_params_equal(const struct fusion_params *a, const struct fusion_params *b)
{
	return a->kind == b->kind && a->dtype == b->dtype && a->op == b->op && a->mem == b->mem &&
	       a->root == b->root && a->prescale == b->prescale && a->postscale == b->postscale &&
	       a->ncounts == b->ncounts &&
	       (a->ncounts == 0 ||
	        memcmp(a->counts, b->counts, a->ncounts * sizeof(uint64_t)) == 0);
}

uint64_t fusion_params_total(const struct fusion_params *p)
{
	uint64_t t = 0;
	for (uint32_t i = 0; i < p->ncounts; i++)
		t += p->counts[i];
	return t;
}

void fusion_cycle_fini(struct fusion_cycle *c)
{
	if (!c)
		return;
	for (size_t i = 0; i < c->nresp; i++) {
		free(c->resp[i].name);
		free(c->resp[i].errmsg);
		fusion_params_fini(&c->resp[i].p);
	}
	free(c->resp);
	for (size_t i = 0; i < c->nticks; i++)
		free((char *)c->ticks[i].name);
	free(c->ticks);
	free(c->arrive);
	memset(c, 0, sizeof(*c));
}

/* ---- mismatch descriptions ---------------------------------------------- */

static void format_field(char *out, size_t len, int field, const struct fusion_params *p)
{
	switch (field) {
	case 0:
		snprintf(out, len, "%s", fusion_kind_name(p->kind));
		break;
	case 1:
		snprintf(out, len, "%s", kolo_dtype_name((kolo_dtype_t)p->dtype));
		break;
	case 2:
		snprintf(out, len, "%s", kolo_op_name((kolo_op_t)p->op));
		break;
	case 3:
		snprintf(out, len, "%d", (int)p->root);
		break;
	case 4:
		snprintf(out, len, "%g", p->prescale);
		break;
	case 5:
		snprintf(out, len, "%g", p->postscale);
		break;
	case 7:
		snprintf(out, len, "%s", p->mem ? "device" : "host");
		break;
	default: {
		size_t o = 0;
		out[0] = '\0';
		if (p->ncounts != 1)
			o += (size_t)snprintf(out + o, len - o, "[");
		for (uint32_t i = 0; i < p->ncounts && o < len; i++) {
			if (i == 8 && p->ncounts > 9) {
				o += (size_t)snprintf(out + o, len - o, ", ...");
				break;
			}
			o += (size_t)snprintf(out + o, len - o, "%s%llu", i ? ", " : "",
			                      (unsigned long long)p->counts[i]);
		}
		if (p->ncounts != 1 && o < len)
			snprintf(out + o, len - o, "]");
	}
	}
}

static bool field_equal(int field, const struct fusion_params *a, const struct fusion_params *b)
{
	switch (field) {
	case 0:
		return a->kind == b->kind;
	case 1:
		return a->dtype == b->dtype;
	case 2:
		return a->op == b->op;
	case 3:
		return a->root == b->root;
	case 4:
		return a->prescale == b->prescale;
	case 5:
		return a->postscale == b->postscale;
	case 7:
		return a->mem == b->mem;
	default:
		return a->ncounts == b->ncounts &&
		       (a->ncounts == 0 ||
		        memcmp(a->counts, b->counts, a->ncounts * sizeof(uint64_t)) == 0);
	}
}

/* Which fields must agree for a kind (kind and dtype always). */
static bool field_must_agree(int field, int kind)
{
	switch (field) {
	case 0:
	case 1:
		return true;
	case 7: /* host and device buffers take different paths */
		return kind != KOLO_FK_BARRIER && kind != KOLO_FK_JOIN && kind != KOLO_FK_EXCLUSIVE;
	case 2:
	case 4:
	case 5:
		return kind == KOLO_FK_ALLREDUCE || kind == KOLO_FK_GROUP ||
		       kind == KOLO_FK_REDUCESCATTER;
	case 3:
		return kind == KOLO_FK_BROADCAST;
	default:
		return kind == KOLO_FK_ALLREDUCE || kind == KOLO_FK_GROUP ||
		       kind == KOLO_FK_BROADCAST || kind == KOLO_FK_REDUCESCATTER;
	}
}

static const char *const field_names[] = {"operation", "dtype",     "op",    "root",
                                          "prescale",  "postscale", "count", "memory"};

bool fusion_describe_mismatch(const char *name, const struct fusion_params *const *p,
                              const bool *present, int size, char *dst, size_t dstlen)
{
	int first = -1;
	for (int r = 0; r < size; r++)
		if (present[r]) {
			first = r;
			break;
		}
	if (first < 0)
		return false;
	for (int f = 0; f < 8; f++) {
		if (f > 0 && !field_must_agree(f, p[first]->kind))
			continue;
		bool differ = false;
		for (int r = first + 1; r < size; r++)
			if (present[r] && !field_equal(f, p[first], p[r]))
				differ = true;
		if (f == 6 && !differ && p[first]->kind == KOLO_FK_ALLTOALL) {
			for (int r = first; r < size; r++)
				if (present[r] && p[r]->ncounts != (uint32_t)size)
					differ = true;
		}
		if (!differ)
			continue;
		/* "mismatched dtype for 'A': rank 0: float32; rank 1: float16" with
		 * the ranks that agree listed together. */
		size_t o = (size_t)snprintf(dst, dstlen, "mismatched %s for '%s':", field_names[f],
		                            name);
		bool *done = calloc((size_t)size, sizeof(bool));
		bool firstgroup = true;
		for (int r = 0; r < size && o < dstlen; r++) {
			if (!present[r] || (done && done[r]))
				continue;
			char ranks[128];
			size_t ro = 0;
			int cnt = 0;
			for (int q = r; q < size; q++) {
				if (!present[q] || !field_equal(f, p[r], p[q]))
					continue;
				if (done)
					done[q] = true;
				if (ro < sizeof(ranks) - 8)
					ro += (size_t)snprintf(ranks + ro, sizeof(ranks) - ro,
					                       "%s%d", cnt ? "," : "", q);
				else if (ro < sizeof(ranks) - 4)
					ro += (size_t)snprintf(ranks + ro, sizeof(ranks) - ro,
					                       ",...");
				cnt++;
			}
			char v[256];
			format_field(v, sizeof(v), f, p[r]);
			o += (size_t)snprintf(dst + o, dstlen - o, "%s rank%s %s: %s",
			                      firstgroup ? "" : ";", cnt > 1 ? "s" : "", ranks, v);
			firstgroup = false;
		}
		free(done);
		if (o >= dstlen && dstlen > 4)
			strcpy(dst + dstlen - 4, "...");
		return true;
	}
	return false;
}
