/* Unit tests of the negotiation state machine: several ranks simulated in one
 * process, their control blocks and messages gathered by hand. */
#include <stdlib.h>
#include <string.h>

#include "fusion_internal.h"
#include "testutil.h"

#define MAXR 4

struct sim {
	int n;
	struct fusion_negotiator *neg[MAXR];
	struct fusion_cycle cyc[MAXR];
	size_t msg_bytes; /* uncached bytes exchanged in the last cycle */
};

static void sim_init(struct sim *s, int n, int cap)
{
	memset(s, 0, sizeof(*s));
	s->n = n;
	for (int r = 0; r < n; r++)
		ck_assert_int_eq(fusion_negotiator_create(r, n, cap, &s->neg[r]), KOLO_OK);
}

static void sim_fini(struct sim *s)
{
	for (int r = 0; r < s->n; r++) {
		fusion_cycle_fini(&s->cyc[r]);
		fusion_negotiator_destroy(s->neg[r]);
	}
}

static void sim_cycle_at(struct sim *s, uint64_t now)
{
	size_t bsz = fusion_negotiator_block_size(s->neg[0]);
	uint8_t *blocks = calloc((size_t)s->n, bsz);
	uint8_t *msgs[MAXR];
	size_t lens[MAXR];
	s->msg_bytes = 0;
	for (int r = 0; r < s->n; r++) {
		ck_assert_uint_eq(fusion_negotiator_block_size(s->neg[r]), bsz);
		ck_assert_int_eq(fusion_negotiator_encode(s->neg[r], false,
		                                          blocks + (size_t)r * bsz, &msgs[r],
		                                          &lens[r]),
		                 KOLO_OK);
		ck_assert_uint_eq(fusion_negotiator_block_msg_len(blocks + (size_t)r * bsz),
		                  lens[r]);
		s->msg_bytes += lens[r];
	}
	for (int r = 0; r < s->n; r++) {
		fusion_cycle_fini(&s->cyc[r]);
		ck_assert_int_eq(fusion_negotiator_decide(s->neg[r], blocks,
		                                          (const uint8_t *const *)msgs, lens, now,
		                                          &s->cyc[r]),
		                 KOLO_OK);
	}
	/* Every rank decided the same thing, in the same order. */
	for (int r = 1; r < s->n; r++) {
		ck_assert_uint_eq(s->cyc[r].nresp, s->cyc[0].nresp);
		for (size_t i = 0; i < s->cyc[0].nresp; i++) {
			ck_assert_str_eq(s->cyc[r].resp[i].name, s->cyc[0].resp[i].name);
			ck_assert_int_eq(s->cyc[r].resp[i].status, s->cyc[0].resp[i].status);
			ck_assert(fusion_params_equal(&s->cyc[r].resp[i].p, &s->cyc[0].resp[i].p));
		}
		ck_assert_int_eq(s->cyc[r].pending, s->cyc[0].pending);
	}
	for (int r = 0; r < s->n; r++)
		free(msgs[r]);
	free(blocks);
}

static void sim_cycle(struct sim *s)
{
	sim_cycle_at(s, 1000);
}

static uint64_t one_count[1];

static struct fusion_params ar(kolo_dtype_t dt, uint64_t count)
{
	static uint64_t counts[64][1];
	static int next;
	uint64_t *c = counts[next++ % 64];
	c[0] = count;
	return (struct fusion_params){.kind = KOLO_FK_ALLREDUCE,
	                              .dtype = (uint8_t)dt,
	                              .op = KOLO_SUM,
	                              .prescale = 1,
	                              .postscale = 1,
	                              .ncounts = 1,
	                              .counts = c};
}

static void submit(struct sim *s, int r, const char *name, struct fusion_params p, uint64_t id)
{
	ck_assert_int_eq(fusion_negotiator_submit(s->neg[r], name, &p, id), KOLO_OK);
}

static const struct fusion_response *find(const struct fusion_cycle *c, const char *name)
{
	for (size_t i = 0; i < c->nresp; i++)
		if (strcmp(c->resp[i].name, name) == 0)
			return &c->resp[i];
	return NULL;
}

START_TEST(test_out_of_order)
{
	struct sim s;
	sim_init(&s, 2, 16);
	submit(&s, 0, "A", ar(KOLO_FLOAT32, 10), 1);
	submit(&s, 0, "B", ar(KOLO_FLOAT32, 20), 2);
	submit(&s, 0, "C", ar(KOLO_FLOAT32, 30), 3);
	submit(&s, 1, "C", ar(KOLO_FLOAT32, 30), 13);
	submit(&s, 1, "A", ar(KOLO_FLOAT32, 10), 11);
	sim_cycle(&s);
	/* A and C are ready everywhere; B waits for rank 1. */
	ck_assert_uint_eq(s.cyc[0].nresp, 2);
	ck_assert_ptr_nonnull(find(&s.cyc[0], "A"));
	ck_assert_ptr_nonnull(find(&s.cyc[0], "C"));
	ck_assert_uint_eq(find(&s.cyc[1], "C")->local_id, 13);
	ck_assert_uint_eq(find(&s.cyc[0], "C")->local_id, 3);
	ck_assert(s.cyc[0].pending);
	ck_assert_uint_eq(fusion_negotiator_local_pending(s.neg[0]), 1);
	ck_assert_uint_eq(fusion_negotiator_local_pending(s.neg[1]), 0);
	submit(&s, 1, "B", ar(KOLO_FLOAT32, 20), 12);
	sim_cycle(&s);
	ck_assert_uint_eq(s.cyc[0].nresp, 1);
	ck_assert_str_eq(s.cyc[0].resp[0].name, "B");
	ck_assert(s.cyc[0].resp[0].local && s.cyc[1].resp[0].local);
	ck_assert(!s.cyc[0].pending);
	sim_fini(&s);
}
END_TEST

START_TEST(test_mismatch_dtype)
{
	struct sim s;
	sim_init(&s, 3, 16);
	submit(&s, 0, "W", ar(KOLO_FLOAT32, 10), 1);
	submit(&s, 1, "W", ar(KOLO_FLOAT16, 10), 1);
	submit(&s, 2, "W", ar(KOLO_FLOAT32, 10), 1);
	sim_cycle(&s);
	for (int r = 0; r < 3; r++) {
		ck_assert_uint_eq(s.cyc[r].nresp, 1);
		const struct fusion_response *x = &s.cyc[r].resp[0];
		ck_assert_int_eq(x->status, KOLO_EMISMATCH);
		ck_assert(x->local);
		ck_assert_ptr_nonnull(strstr(x->errmsg, "dtype"));
		ck_assert_ptr_nonnull(strstr(x->errmsg, "ranks 0,2: float32"));
		ck_assert_ptr_nonnull(strstr(x->errmsg, "rank 1: float16"));
		ck_assert_ptr_nonnull(strstr(x->errmsg, "'W'"));
	}
	/* Nothing of a failed op is cached. */
	ck_assert_uint_eq(fusion_negotiator_cache_size(s.neg[0]), 0);
	sim_fini(&s);
}
END_TEST

START_TEST(test_mismatch_count)
{
	struct sim s;
	sim_init(&s, 2, 16);
	submit(&s, 0, "W", ar(KOLO_FLOAT32, 10), 1);
	submit(&s, 1, "W", ar(KOLO_FLOAT32, 12), 1);
	sim_cycle(&s);
	ck_assert_int_eq(s.cyc[1].resp[0].status, KOLO_EMISMATCH);
	ck_assert_str_eq(s.cyc[1].resp[0].errmsg,
	                 "mismatched count for 'W': rank 0: 10; rank 1: 12");
	sim_fini(&s);
}
END_TEST

START_TEST(test_cache_steady_state)
{
	struct sim s;
	sim_init(&s, 2, 16);
	for (int step = 0; step < 3; step++) {
		for (int r = 0; r < 2; r++) {
			submit(&s, r, "g1", ar(KOLO_FLOAT32, 100), 1);
			submit(&s, r, "g2", ar(KOLO_FLOAT64, 7), 2);
		}
		sim_cycle(&s);
		ck_assert_uint_eq(s.cyc[0].nresp, 2);
		if (step == 0) {
			ck_assert_uint_gt(s.msg_bytes, 0);
			ck_assert_int_eq(s.cyc[0].resp[0].cache_slot, -1);
		} else {
			/* Steady state: bits only, no requests on the wire. */
			ck_assert_uint_eq(s.msg_bytes, 0);
			ck_assert_int_ge(s.cyc[0].resp[0].cache_slot, 0);
			ck_assert_uint_eq(s.cyc[0].cache_hits, 2);
		}
	}
	ck_assert_uint_eq(fusion_negotiator_cache_size(s.neg[1]), 2);
	/* A changed count evicts and fails on every rank. */
	submit(&s, 0, "g1", ar(KOLO_FLOAT32, 101), 1);
	submit(&s, 1, "g1", ar(KOLO_FLOAT32, 100), 1);
	sim_cycle(&s); /* rank 0 announces; rank 1 only set a bit, now void */
	ck_assert_uint_eq(s.cyc[0].nresp, 0);
	ck_assert_uint_eq(fusion_negotiator_cache_size(s.neg[0]), 1);
	sim_cycle(&s); /* rank 1 announces again */
	ck_assert_uint_eq(s.cyc[0].nresp, 1);
	ck_assert_int_eq(s.cyc[0].resp[0].status, KOLO_EMISMATCH);
	ck_assert_int_eq(s.cyc[1].resp[0].status, KOLO_EMISMATCH);
	sim_fini(&s);
}
END_TEST

START_TEST(test_cache_lru)
{
	struct sim s;
	sim_init(&s, 2, 2);
	const char *names[] = {"a", "b", "c", "a"};
	for (int i = 0; i < 4; i++) {
		for (int r = 0; r < 2; r++)
			submit(&s, r, names[i], ar(KOLO_INT32, 4), 1);
		sim_cycle(&s);
		ck_assert_uint_eq(s.cyc[0].nresp, 1);
		ck_assert_uint_le(fusion_negotiator_cache_size(s.neg[0]), 2);
	}
	/* "a" was evicted by "c" (least recently used), so it went the long way. */
	ck_assert_int_eq(s.cyc[0].resp[0].cache_slot, -1);
	sim_fini(&s);
}
END_TEST

START_TEST(test_cache_partial_then_ready)
{
	struct sim s;
	sim_init(&s, 3, 8);
	for (int r = 0; r < 3; r++)
		submit(&s, r, "x", ar(KOLO_FLOAT32, 4), 1);
	sim_cycle(&s);
	submit(&s, 0, "x", ar(KOLO_FLOAT32, 4), 2);
	submit(&s, 2, "x", ar(KOLO_FLOAT32, 4), 2);
	sim_cycle_at(&s, 1000);
	ck_assert_uint_eq(s.cyc[0].nresp, 0);
	ck_assert(s.cyc[0].pending);
	char rep[256];
	ck_assert_uint_eq(fusion_negotiator_stall_report(s.neg[0], 5000, 2000, rep, sizeof(rep)),
	                  1);
	ck_assert_str_eq(rep, "rank 1: [x]");
	submit(&s, 1, "x", ar(KOLO_FLOAT32, 4), 2);
	sim_cycle(&s);
	ck_assert_uint_eq(s.cyc[0].nresp, 1);
	ck_assert_int_ge(s.cyc[0].resp[0].cache_slot, 0);
	sim_fini(&s);
}
END_TEST

START_TEST(test_join)
{
	struct sim s;
	sim_init(&s, 3, 8);
	struct fusion_params j = {.kind = KOLO_FK_JOIN, .prescale = 1, .postscale = 1};
	submit(&s, 1, "kolo.join.0", j, 9);
	submit(&s, 0, "g", ar(KOLO_FLOAT32, 5), 1);
	submit(&s, 2, "g", ar(KOLO_FLOAT32, 5), 1);
	sim_cycle(&s);
	/* g runs with rank 1 contributing zeros. */
	ck_assert_uint_eq(s.cyc[0].nresp, 1);
	ck_assert_int_eq(s.cyc[1].resp[0].status, KOLO_OK);
	ck_assert(!s.cyc[1].resp[0].local);
	ck_assert(s.cyc[0].resp[0].local);
	/* Broadcast is refused while a rank has joined. */
	uint64_t c5[1] = {5};
	struct fusion_params b = {.kind = KOLO_FK_BROADCAST,
	                          .dtype = KOLO_FLOAT32,
	                          .prescale = 1,
	                          .postscale = 1,
	                          .ncounts = 1,
	                          .counts = c5};
	submit(&s, 0, "b", b, 2);
	submit(&s, 2, "b", b, 2);
	sim_cycle(&s);
	ck_assert_int_eq(s.cyc[0].resp[0].status, KOLO_EUNSUPPORTED);
	ck_assert_ptr_nonnull(strstr(s.cyc[2].resp[0].errmsg, "rank 1"));
	submit(&s, 2, "kolo.join.0", j, 3);
	sim_cycle(&s);
	ck_assert_uint_eq(s.cyc[0].nresp, 0);
	submit(&s, 0, "kolo.join.0", j, 4);
	sim_cycle(&s);
	ck_assert_uint_eq(s.cyc[0].nresp, 1);
	ck_assert_int_eq(s.cyc[0].resp[0].p.kind, KOLO_FK_JOIN);
	ck_assert_int_eq(s.cyc[1].resp[0].last_rank, 0);
	ck_assert(s.cyc[1].resp[0].local);
	ck_assert(!s.cyc[0].pending);
	/* Joined state is reset: a new allreduce needs everyone again. */
	submit(&s, 0, "g", ar(KOLO_FLOAT32, 5), 5);
	sim_cycle(&s);
	ck_assert_uint_eq(s.cyc[0].nresp, 0);
	sim_fini(&s);
}
END_TEST

START_TEST(test_allgather_counts)
{
	struct sim s;
	sim_init(&s, 3, 8);
	for (int step = 0; step < 2; step++) {
		for (int r = 0; r < 3; r++) {
			uint64_t c[1] = {(uint64_t)(r + 1)};
			struct fusion_params p = {.kind = KOLO_FK_ALLGATHER,
			                          .dtype = KOLO_INT64,
			                          .prescale = 1,
			                          .postscale = 1,
			                          .ncounts = 1,
			                          .counts = c};
			submit(&s, r, "ag", p, 1);
		}
		sim_cycle(&s);
		ck_assert_uint_eq(s.cyc[0].nresp, 1);
		ck_assert_int_eq(s.cyc[0].resp[0].status, KOLO_OK);
		ck_assert_uint_eq(s.cyc[2].resp[0].p.ncounts, 3);
		for (int r = 0; r < 3; r++)
			ck_assert_uint_eq(s.cyc[1].resp[0].p.counts[r], (uint64_t)(r + 1));
		if (step == 1)
			ck_assert_int_ge(s.cyc[0].resp[0].cache_slot, 0);
	}
	sim_fini(&s);
}
END_TEST

START_TEST(test_fail_name_and_params)
{
	struct sim s;
	sim_init(&s, 2, 8);
	submit(&s, 0, "late", ar(KOLO_FLOAT32, 3), 1);
	sim_cycle(&s);
	ck_assert_uint_eq(s.cyc[0].nresp, 0);
	ck_assert_int_eq(fusion_negotiator_fail_name(s.neg[0], "late", KOLO_ETIMEDOUT, "stalled"),
	                 KOLO_OK);
	fusion_negotiator_set_params(s.neg[0], 4096, 2.5);
	sim_cycle(&s);
	for (int r = 0; r < 2; r++) {
		ck_assert_uint_eq(s.cyc[r].nresp, 1);
		ck_assert_int_eq(s.cyc[r].resp[0].status, KOLO_ETIMEDOUT);
		ck_assert_str_eq(s.cyc[r].resp[0].errmsg, "stalled");
		ck_assert(s.cyc[r].has_params);
		ck_assert_uint_eq(s.cyc[r].fusion_threshold, 4096);
		ck_assert(s.cyc[r].cycle_time_ms == 2.5);
	}
	ck_assert(s.cyc[0].resp[0].local);
	ck_assert(!s.cyc[1].resp[0].local);
	ck_assert(!s.cyc[0].pending);
	sim_fini(&s);
}
END_TEST

START_TEST(test_no_cache)
{
	struct sim s;
	sim_init(&s, 2, 0);
	for (int step = 0; step < 2; step++) {
		for (int r = 0; r < 2; r++)
			submit(&s, r, "g", ar(KOLO_FLOAT32, 3), 1);
		sim_cycle(&s);
		ck_assert_uint_eq(s.cyc[0].nresp, 1);
		ck_assert_uint_gt(s.msg_bytes, 0);
	}
	(void)one_count;
	sim_fini(&s);
}
END_TEST

START_TEST(test_stall_report_format)
{
	struct sim s;
	sim_init(&s, 3, 0);
	char name[16];
	for (int i = 0; i < 7; i++) {
		snprintf(name, sizeof(name), "t%d", i);
		submit(&s, 0, name, ar(KOLO_FLOAT32, 1), (uint64_t)i);
		submit(&s, 1, name, ar(KOLO_FLOAT32, 1), (uint64_t)i);
	}
	submit(&s, 2, "t6", ar(KOLO_FLOAT32, 1), 6);
	submit(&s, 0, "u", ar(KOLO_FLOAT32, 1), 99);
	sim_cycle_at(&s, 10);
	char rep[512];
	ck_assert_uint_eq(fusion_negotiator_stall_report(s.neg[1], 100, 50, rep, sizeof(rep)), 7);
	ck_assert_str_eq(rep, "rank 1: [u]; rank 2: [t0, t1, t2, t3, t4, \xe2\x80\xa6]");
	ck_assert_uint_eq(fusion_negotiator_stall_report(s.neg[1], 20, 50, rep, sizeof(rep)), 0);
	sim_fini(&s);
}
END_TEST

/* Ranks that each wait for a name another has not submitted are
 * deadlocked; a rank that is merely behind (its names are a subset of the
 * others') is not. */
START_TEST(test_deadlock)
{
	struct sim s;
	sim_init(&s, 3, 8);
	submit(&s, 0, "a", ar(KOLO_FLOAT32, 1), 1);
	submit(&s, 1, "a", ar(KOLO_FLOAT32, 1), 1);
	sim_cycle_at(&s, 10);
	ck_assert(!fusion_negotiator_deadlocked(s.neg[0], 100, 50)); /* rank 2 is behind */
	submit(&s, 2, "b", ar(KOLO_FLOAT32, 1), 1);
	sim_cycle_at(&s, 20);
	ck_assert(!fusion_negotiator_deadlocked(s.neg[0], 60, 50)); /* b is too young */
	ck_assert(fusion_negotiator_deadlocked(s.neg[0], 100, 50));
	submit(&s, 2, "a", ar(KOLO_FLOAT32, 1), 2);
	sim_cycle_at(&s, 30);
	ck_assert(!fusion_negotiator_deadlocked(s.neg[0], 1000, 50)); /* a ran; 0 and 1 are idle */
	sim_fini(&s);
}
END_TEST

START_TEST(test_plan)
{
	struct fusion_item it[] = {
	        {KOLO_FLOAT32, KOLO_SUM, 1, 1, 40, false, false},
	        {KOLO_FLOAT16, KOLO_SUM, 1, 1, 10, false, false},
	        {KOLO_FLOAT32, KOLO_SUM, 1, 1, 50, false, false},
	        {KOLO_FLOAT32, KOLO_SUM, 1, 1, 20, false, false},
	        {KOLO_FLOAT32, KOLO_SUM, 1, 1, 500, false, false},
	        {KOLO_FLOAT16, KOLO_SUM, 1, 1, 10, false, false},
	        {KOLO_FLOAT32, KOLO_AVERAGE, 1, 1, 5, false, false},
	};
	size_t b[7];
	ck_assert_uint_eq(fusion_plan(it, 7, 100, b), 5);
	size_t want[] = {0, 1, 0, 2, 3, 1, 4};
	for (int i = 0; i < 7; i++)
		ck_assert_uint_eq(b[i], want[i]);
	/* Threshold 0: no fusion. */
	ck_assert_uint_eq(fusion_plan(it, 7, 0, b), 7);
	for (size_t i = 0; i < 7; i++)
		ck_assert_uint_eq(b[i], i);
	/* Look-ahead past a tensor that no longer fits. */
	struct fusion_item it2[] = {{KOLO_FLOAT32, KOLO_SUM, 1, 1, 60, false, false},
	                            {KOLO_FLOAT32, KOLO_SUM, 1, 1, 60, false, false},
	                            {KOLO_FLOAT32, KOLO_SUM, 1, 1, 30, false, false}};
	ck_assert_uint_eq(fusion_plan(it2, 3, 100, b), 2);
	ck_assert_uint_eq(b[2], 0);
	/* A direct item (large enough to skip the buffer) joins the batch of its
	 * kind without taking room: 60 + 60 packed would not fit in 100. */
	it2[1].direct = true;
	ck_assert_uint_eq(fusion_plan(it2, 3, 100, b), 1);
	ck_assert_uint_eq(b[1], 0);
	ck_assert_uint_eq(b[2], 0);
	/* ... but a direct item of another kind does not. */
	it2[1].dtype = KOLO_FLOAT16;
	ck_assert_uint_eq(fusion_plan(it2, 3, 100, b), 2);
	ck_assert_uint_eq(b[1], 1);
	/* A direct item larger than the threshold is still batched. */
	struct fusion_item it3[] = {{KOLO_FLOAT32, KOLO_SUM, 1, 1, 500, true, false},
	                            {KOLO_FLOAT32, KOLO_SUM, 1, 1, 30, false, false},
	                            {KOLO_FLOAT32, KOLO_SUM, 1, 1, 700, true, false}};
	ck_assert_uint_eq(fusion_plan(it3, 3, 100, b), 1);
	/* Device items batch only with device items (the device fusion
	 * buffer), even of the same kind. */
	struct fusion_item it4[] = {{KOLO_FLOAT32, KOLO_SUM, 1, 1, 10, false, true},
	                            {KOLO_FLOAT32, KOLO_SUM, 1, 1, 10, false, false},
	                            {KOLO_FLOAT32, KOLO_SUM, 1, 1, 10, false, true}};
	ck_assert_uint_eq(fusion_plan(it4, 3, 100, b), 2);
	ck_assert_uint_eq(b[0], 0);
	ck_assert_uint_eq(b[1], 1);
	ck_assert_uint_eq(b[2], 0);
	/* Threshold 0 still runs every item alone. */
	ck_assert_uint_eq(fusion_plan(it3, 3, 0, b), 3);
}
END_TEST

static Suite *negotiate_suite(void)
{
	Suite *s = suite_create("negotiate");
	TCase *tc = tcase_create("core");
	tcase_set_timeout(tc, 20);
	tcase_add_test(tc, test_out_of_order);
	tcase_add_test(tc, test_mismatch_dtype);
	tcase_add_test(tc, test_mismatch_count);
	tcase_add_test(tc, test_cache_steady_state);
	tcase_add_test(tc, test_cache_lru);
	tcase_add_test(tc, test_cache_partial_then_ready);
	tcase_add_test(tc, test_join);
	tcase_add_test(tc, test_allgather_counts);
	tcase_add_test(tc, test_fail_name_and_params);
	tcase_add_test(tc, test_no_cache);
	tcase_add_test(tc, test_stall_report_format);
	tcase_add_test(tc, test_deadlock);
	tcase_add_test(tc, test_plan);
	suite_add_tcase(s, tc);
	return s;
}

KOLO_CHECK_MAIN(negotiate_suite)
