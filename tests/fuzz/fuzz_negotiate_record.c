/* Fuzz target: the negotiation record decoder (fusion/record.c), which reads
 * the messages every rank gathers from its peers each cycle, and decide.c,
 * which applies them. The input is one rank's message. Beyond "no crash":
 *  - a decoded record re-encodes to what was consumed (shorter only where a
 *    string had a NUL in it), and the re-encoding decodes to the same record;
 *  - a refused record leaves the offset alone and nothing to free;
 *  - fed to a fresh 2-rank negotiator as rank 0's and as rank 1's message,
 *    decide succeeds exactly when a plain model of the rules says it should:
 *    every record decodes, PARAMS and FAIL come from rank 0, and no rank
 *    announces a name twice while it is in the table (a FAIL takes it out);
 *    on success there is one tick per REQUEST and rank 0's last PARAMS. */
#include "fuzz.h"
#include "fusion_internal.h"

#include <stdbool.h>
#include <string.h>

static bool params_same(const struct fusion_params *a, const struct fusion_params *b)
{
	/* Bitwise: a NaN scale must survive the round trip too. */
	return a->kind == b->kind && a->dtype == b->dtype && a->op == b->op && a->root == b->root &&
	       !memcmp(&a->prescale, &b->prescale, sizeof(double)) &&
	       !memcmp(&a->postscale, &b->postscale, sizeof(double)) && a->ncounts == b->ncounts &&
	       (a->ncounts == 0 || !memcmp(a->counts, b->counts, a->ncounts * sizeof(uint64_t)));
}

static bool str_same(const char *a, const char *b)
{
	return (!a && !b) || (a && b && !strcmp(a, b));
}

static void check_decoded(const struct fusion_record *r)
{
	FUZZ_CHECK(r->type >= FUSION_RECORD_REQUEST && r->type <= FUSION_RECORD_FAIL, "type %d",
	           r->type);
	if (r->type == FUSION_RECORD_REQUEST) {
		FUZZ_CHECK(r->p.kind > 0 && r->p.kind < KOLO_FK_COUNT, "kind %d", r->p.kind);
		FUZZ_CHECK(r->p.ncounts == 0 || r->p.counts, "counts missing");
	}
	if (r->type != FUSION_RECORD_PARAMS)
		FUZZ_CHECK(r->name && strlen(r->name) < FUSION_NAME_MAX, "name");
	if (r->type == FUSION_RECORD_FAIL)
		FUZZ_CHECK(r->why != NULL, "FAIL without a reason");
}

static void encode(struct fusion_wbuf *w, const struct fusion_record *r)
{
	if (r->type == FUSION_RECORD_REQUEST)
		fusion_record_put_request(w, r->name, &r->p);
	else if (r->type == FUSION_RECORD_PARAMS)
		fusion_record_put_params(w, r->fusion_threshold, r->cycle_time_ms);
	else
		fusion_record_put_fail(w, r->status, r->name, r->why);
}

static void check_round_trip(const struct fusion_record *r, const uint8_t *in, size_t consumed)
{
	struct fusion_wbuf w = {0};
	encode(&w, r);
	if (w.oom) {
		free(w.b);
		return;
	}
	FUZZ_CHECK(w.len <= consumed, "re-encoded to %zu bytes from %zu", w.len, consumed);
	if (w.len == consumed)
		FUZZ_CHECK(!memcmp(w.b, in, consumed), "re-encoded to other bytes");
	else
		FUZZ_CHECK(memchr(in, '\0', consumed) != NULL, "shorter without a NUL to drop");
	struct fusion_record again;
	size_t off = 0;
	kolo_status_t st = fusion_record_decode(w.b, w.len, &off, &again);
	if (st != KOLO_ENOMEM) {
		FUZZ_CHECK(st == KOLO_OK, "its re-encoding does not decode: %s",
		           kolo_status_name(st));
		FUZZ_CHECK(off == w.len, "decoded %zu of %zu bytes", off, w.len);
		FUZZ_CHECK(
		        again.type == r->type && str_same(again.name, r->name) &&
		                str_same(again.why, r->why) && params_same(&again.p, &r->p) &&
		                again.fusion_threshold == r->fusion_threshold &&
		                !memcmp(&again.cycle_time_ms, &r->cycle_time_ms, sizeof(double)) &&
		                again.status == r->status,
		        "the round trip changed the record");
	}
	fusion_record_fini(&again);
	free(w.b);
}

/* The model of what decide makes of the message, from rank `from`. */
struct expect {
	bool ok;
	size_t requests;
	bool has_params;
	uint64_t threshold;
};

/* Names in the model's table (each announced once by the sender). */
struct names {
	char **v;
	size_t n;
};

static bool names_take(struct names *t, const char *name)
{
	for (size_t i = 0; i < t->n; i++)
		if (!strcmp(t->v[i], name)) {
			free(t->v[i]);
			t->v[i] = t->v[--t->n];
			return true;
		}
	return false;
}

static void apply_to_model(struct expect x[2], struct names *tab, const struct fusion_record *r)
{
	if (r->type == FUSION_RECORD_REQUEST) {
		if (names_take(tab, r->name)) {
			x[0].ok = x[1].ok = false; /* announced twice */
			return;
		}
		char **v = realloc(tab->v, (tab->n + 1) * sizeof(*v));
		FUZZ_CHECK(v != NULL, "out of memory");
		tab->v = v;
		tab->v[tab->n] = strdup(r->name);
		FUZZ_CHECK(tab->v[tab->n] != NULL, "out of memory");
		tab->n++;
		x[0].requests++;
		x[1].requests++;
	} else if (r->type == FUSION_RECORD_PARAMS) {
		x[1].ok = false;
		x[0].has_params = true;
		x[0].threshold = r->fusion_threshold;
	} else {
		x[1].ok = false;
		names_take(tab, r->name);
	}
}

static void check_decide(const uint8_t *data, size_t size, int from, const struct expect *x)
{
	struct fusion_negotiator *n;
	FUZZ_CHECK(fusion_negotiator_create(0, 2, 4, &n) == KOLO_OK, "create");
	size_t bsz = fusion_negotiator_block_size(n);
	uint8_t blocks[2 * 16];
	FUZZ_CHECK(2 * bsz <= sizeof(blocks), "block size %zu", bsz);
	memset(blocks, 0, sizeof(blocks));
	const uint8_t *msgs[2] = {NULL, NULL};
	size_t lens[2] = {0, 0};
	msgs[from] = data;
	lens[from] = size;
	struct fusion_cycle c;
	kolo_status_t st = fusion_negotiator_decide(n, blocks, msgs, lens, 1000, &c);
	if (st != KOLO_ENOMEM) {
		FUZZ_CHECK((st == KOLO_OK) == x->ok, "rank %d's message: decide says %s", from,
		           kolo_status_name(st));
		if (st == KOLO_OK) {
			FUZZ_CHECK(c.nticks == x->requests, "%zu ticks for %zu requests", c.nticks,
			           x->requests);
			FUZZ_CHECK(c.has_params == x->has_params &&
			                   (!x->has_params || c.fusion_threshold == x->threshold),
			           "PARAMS not applied as sent");
			for (size_t i = 0; i < c.nresp; i++)
				FUZZ_CHECK(c.resp[i].status != KOLO_OK || !c.resp[i].local,
				           "a response claims an op this rank never submitted");
		}
	}
	fusion_cycle_fini(&c);
	fusion_negotiator_destroy(n);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct expect x[2] = {{.ok = true}, {.ok = true}};
	struct names tab = {0};
	size_t off = 0;
	while (off < size) {
		struct fusion_record r;
		size_t before = off;
		kolo_status_t st = fusion_record_decode(data, size, &off, &r);
		if (st != KOLO_OK) {
			FUZZ_CHECK(st == KOLO_EPROTO || st == KOLO_ENOMEM, "decode: %s",
			           kolo_status_name(st));
			FUZZ_CHECK(off == before, "a refused record moved the offset");
			FUZZ_CHECK(!r.name && !r.why && !r.p.counts,
			           "a refused record holds memory");
			x[0].ok = x[1].ok = false;
			break;
		}
		FUZZ_CHECK(off > before && off <= size, "offset %zu after %zu of %zu", off, before,
		           size);
		check_decoded(&r);
		check_round_trip(&r, data + before, off - before);
		apply_to_model(x, &tab, &r);
		fusion_record_fini(&r);
	}
	for (size_t i = 0; i < tab.n; i++)
		free(tab.v[i]);
	free(tab.v);
	check_decide(data, size, 0, &x[0]);
	check_decide(data, size, 1, &x[1]);
	return 0;
}
