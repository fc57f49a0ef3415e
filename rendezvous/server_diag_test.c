/* The hang classifier (server_diag.c) and the report parser
 * (server_diag_report.c), fed report JSON and member tables directly: each
 * kind of culprit, a healthy job, missing and unreadable reports. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "server_internal.h"
#include "testutil.h"

#define NOW      1733570010000LL /* the server's wall clock */
#define FRESH    (NOW - 100)     /* a report sent after the stall began */
#define OLD      (NOW - 60000)   /* a report from before it */
#define STALE_MS 6666

#define DONE(n)                                                                                    \
	"{\"seq\":1,\"cseq\":1,\"name\":\"" n "\",\"op\":\"allreduce\",\"dtype\":\"float32\","     \
	"\"bytes\":4096,\"state\":\"done\",\"age_ms\":3300.0,\"status\":\"KOLO_OK\"}"
#define OPEN(n, state, age)                                                                        \
	"{\"seq\":2,\"cseq\":0,\"name\":\"" n "\",\"op\":\"allreduce\",\"state\":\"" state         \
	"\",\"age_ms\":" #age ",\"status\":\"KOLO_OK\"}"

static struct rdzv_diag_report rep[8];
static struct rdzv_diag_member mem[8];
static char errs[8][160];
static int n_ranks;
static json_t *doc;

/* n registered ranks, fresh heartbeats, on the hosts given. */
static void members(int n, ...)
{
	memset(mem, 0, sizeof(mem));
	n_ranks = n;
	va_list ap;
	va_start(ap, n);
	for (int r = 0; r < n; r++) {
		mem[r].host = va_arg(ap, const char *);
		mem[r].worker_id = "w";
		mem[r].registered = true;
		mem[r].heartbeat_ms = 120;
	}
	va_end(ap);
}

/* Puts rank r's report: one "job" comm with the entries given. */
static void report(int r, int64_t gen, int64_t time_ms, const char *activity, int waiting_on,
                   double waiting_ms, const char *entries)
{
	char text[4096];
	snprintf(text, sizeof(text),
	         "{\"version\":1,\"rank\":%d,\"size\":%d,\"round\":1,\"host\":\"%s\",\"pid\":1,"
	         "\"gen\":%lld,\"time_ms\":%lld,\"comms\":[{\"label\":\"job\",\"rank\":%d,"
	         "\"size\":%d,\"activity\":\"%s\",\"waiting_on\":%d,\"waiting_ms\":%.1f,"
	         "\"entries\":[%s]}]}",
	         r, n_ranks, mem[r].host, (long long)gen, (long long)time_ms, r, n_ranks, activity,
	         waiting_on, waiting_ms, entries);
	ck_assert_int_eq(rdzv_diag_report_parse(text, strlen(text), &rep[r], errs[r], 160),
	                 KOLO_OK);
	mem[r].report = &rep[r];
}

/* Puts raw text as rank r's report (it may be unreadable). */
static void report_text(int r, const char *text)
{
	if (rdzv_diag_report_parse(text, strlen(text), &rep[r], errs[r], 160) == KOLO_OK)
		mem[r].report = &rep[r];
	else
		mem[r].ignored = errs[r];
}

/* When the newest request was made: by default 1 s ago, after every stall
 * below began, so a silent rank has had time to answer. */
static int64_t request_ms = NOW - 1000;

static void classify(int64_t request)
{
	struct rdzv_diag_input in = {.job = "j",
	                             .round = 1,
	                             .request = request,
	                             .min_ms = RDZV_DIAG_MIN_MS_DEFAULT,
	                             .stale_ms = STALE_MS,
	                             .now_ms = NOW,
	                             .request_ms = request_ms,
	                             .m = mem,
	                             .n = n_ranks};
	json_decref(doc);
	doc = rdzv_diag_classify(&in);
	ck_assert_ptr_nonnull(doc);
}

static void teardown(void)
{
	for (int r = 0; r < 8; r++)
		rdzv_diag_report_fini(&rep[r]);
	json_decref(doc);
	doc = NULL;
}

static const char *text(const char *key)
{
	const char *s = json_string_value(json_object_get(doc, key));
	ck_assert_msg(s != NULL, "no %s in the document", key);
	return s;
}

static size_t n_culprits(void)
{
	return json_array_size(json_object_get(doc, "culprits"));
}

static const json_t *culprit(size_t i)
{
	const json_t *c = json_array_get(json_object_get(doc, "culprits"), i);
	ck_assert_ptr_nonnull(c);
	return c;
}

static void culprit_is(size_t i, int rank, const char *kind, const char *process)
{
	const json_t *c = culprit(i);
	ck_assert_int_eq(json_integer_value(json_object_get(c, "rank")), rank);
	ck_assert_str_eq(json_string_value(json_object_get(c, "kind")), kind);
	ck_assert_str_eq(json_string_value(json_object_get(c, "process")), process);
}

static const char *rank_state(int r)
{
	const json_t *row = json_array_get(json_object_get(doc, "ranks"), (size_t)r);
	return json_string_value(json_object_get(row, "state"));
}

/* The control: open entries younger than min_ms are no stall. */
START_TEST(healthy_job)
{
	members(4, "hostA", "hostA", "hostB", "hostB");
	for (int r = 0; r < 4; r++)
		report(r, 1, FRESH, "negotiating", -1, 0,
		       DONE("step.19") "," OPEN("step.20", "submitted", 200.0));
	classify(0);
	ck_assert(json_is_false(json_object_get(doc, "stalled")));
	ck_assert_str_eq(text("summary"), "no stalled collective");
	ck_assert_uint_eq(n_culprits(), 0);
	ck_assert(json_is_null(json_object_get(doc, "stalled_op")));
	ck_assert_str_eq(rank_state(0), "busy");
	ck_assert_ptr_null(json_object_get(doc, "complete"));
}
END_TEST

/* Rank 2 skipped step.20: it completed step.19 and submitted step.21. */
START_TEST(skipped_allreduce)
{
	members(4, "h0", "h1", "hostA", "h3");
	for (int r = 0; r < 4; r++) {
		if (r != 2)
			report(r, 3, FRESH, "negotiating", -1, 0,
			       DONE("step.19") "," OPEN("step.20", "submitted", 3200.0));
	}
	report(2, 3, FRESH, "negotiating", -1, 0,
	       DONE("step.19") "," OPEN("step.21", "submitted", 150.0));
	classify(3);
	ck_assert(json_is_true(json_object_get(doc, "stalled")));
	ck_assert(json_is_true(json_object_get(doc, "complete")));
	ck_assert_uint_eq(n_culprits(), 1);
	culprit_is(0, 2, "not_submitted", "running");
	ck_assert_str_eq(json_string_value(json_object_get(culprit(0), "last_done")), "step.19");
	ck_assert_str_eq(json_string_value(json_object_get(culprit(0), "open_instead")), "step.21");
	ck_assert_str_eq(text("summary"),
	                 "rank 2 (host hostA) never submitted allreduce 'step.20' that ranks 0, 1, "
	                 "3 wait in; its last completed op was 'step.19'; it submitted 'step.21' "
	                 "instead; its process is running");
	const json_t *op = json_object_get(doc, "stalled_op");
	ck_assert_str_eq(json_string_value(json_object_get(op, "name")), "step.20");
	ck_assert_str_eq(json_string_value(json_object_get(op, "comm")), "job");
	ck_assert_int_eq(json_integer_value(json_object_get(op, "waiting_ms")), 3200);
	ck_assert_uint_eq(json_array_size(json_object_get(op, "waiting_ranks")), 3);
	ck_assert_str_eq(rank_state(0), "waiting");
	ck_assert_str_eq(rank_state(2), "busy");
}
END_TEST

/* Rank 2 never submitted and has nothing else open: the sentence of the
 * contract, word for word. */
START_TEST(not_submitted_summary)
{
	members(4, "h0", "h1", "hostA", "h3");
	for (int r = 0; r < 4; r++) {
		if (r != 2)
			report(r, 1, FRESH, "negotiating", -1, 0,
			       DONE("step.19") "," OPEN("step.20", "negotiated", 3200.0));
	}
	report(2, 1, FRESH, "idle", -1, 0, DONE("step.19"));
	classify(0);
	ck_assert_str_eq(text("summary"),
	                 "rank 2 (host hostA) never submitted allreduce 'step.20' that ranks 0, 1, "
	                 "3 wait in; its last completed op was 'step.19'; its process is running");
	ck_assert_str_eq(rank_state(2), "idle");
}
END_TEST

/* 0 waits on 3, 3 waits on 2, and 2 stopped: only 2 is named. */
START_TEST(chain_names_its_end)
{
	members(4, "a", "a", "b", "b");
	report(0, 1, FRESH, "executing", 3, 3000, OPEN("g", "dataplane", 3200.0));
	report(1, 1, FRESH, "executing", 2, 3000, OPEN("g", "dataplane", 3150.0));
	report(3, 1, FRESH, "executing", 2, 3000, OPEN("g", "dataplane", 3100.0));
	report(2, 1, OLD, "idle", -1, 0, DONE("f"));
	mem[2].heartbeat_ms = 9000;
	classify(0);
	ck_assert_uint_eq(n_culprits(), 1);
	culprit_is(0, 2, "unresponsive", "not_responding");
	ck_assert_str_eq(rank_state(2), "stale_report");
	ck_assert_msg(strstr(text("summary"), "rank 2 (host b) does not respond") ==
	                      text("summary"),
	              "%s", text("summary"));
}
END_TEST

/* A stopped rank inside the op is named, never the ranks waiting on it. */
START_TEST(stopped_inside_op)
{
	members(3, "a", "b", "c");
	report(0, 1, FRESH, "executing", 1, 2000, OPEN("g", "dataplane", 3200.0));
	report(1, 1, FRESH, "executing", 2, 2000, OPEN("g", "dataplane", 3100.0));
	report(2, 1, FRESH, "executing", -1, 0, OPEN("g", "dataplane", 3000.0));
	mem[2].heartbeat_ms = 8000;
	classify(0);
	ck_assert_uint_eq(n_culprits(), 1);
	culprit_is(0, 2, "unresponsive", "not_responding");
	ck_assert_ptr_nonnull(strstr(json_string_value(json_object_get(culprit(0), "detail")),
	                             "it stopped inside allreduce 'g'"));
}
END_TEST

/* A member whose lease ran out is dead; its process is gone. */
START_TEST(dead_rank)
{
	members(4, "a", "a", "b", "b");
	for (int r = 0; r < 4; r++) {
		if (r != 3)
			report(r, 1, FRESH, "negotiating", -1, 0, OPEN("s", "submitted", 12000.0));
	}
	mem[3].registered = false;
	mem[3].heartbeat_ms = -1;
	mem[3].host = NULL;
	mem[3].gone_why = "lease expired";
	classify(1);
	ck_assert_uint_eq(n_culprits(), 1);
	culprit_is(0, 3, "dead", "gone");
	ck_assert_ptr_nonnull(strstr(text("summary"), "lease expired"));
	ck_assert_str_eq(rank_state(3), "gone");
	/* The dead rank cannot answer: the request is complete without it. */
	ck_assert(json_is_true(json_object_get(doc, "complete")));
}
END_TEST

/* A ring where every rank waits on its neighbour: the link waited on
 * longest, across hosts, is named with both hosts. */
START_TEST(link_cycle)
{
	members(4, "hostA", "hostA", "hostB", "hostB");
	report(0, 1, FRESH, "executing", 3, 2900, OPEN("g", "dataplane", 3300.0));
	report(1, 1, FRESH, "executing", 0, 2950, OPEN("g", "dataplane", 3300.0));
	report(2, 1, FRESH, "executing", 1, 3100, OPEN("g", "dataplane", 3300.0));
	report(3, 1, FRESH, "executing", 2, 3000, OPEN("g", "dataplane", 3300.0));
	classify(0);
	ck_assert_uint_eq(n_culprits(), 1);
	culprit_is(0, 1, "link", "running");
	ck_assert_int_eq(json_integer_value(json_object_get(culprit(0), "peer_rank")), 2);
	ck_assert_msg(strstr(text("summary"), "a link between hostA and hostB") == text("summary"),
	              "%s", text("summary"));
}
END_TEST

/* Reports written at different times: the wait that began first is the
 * longest, whatever waiting_ms each report says. Rank 0 began waiting on 2
 * at NOW - 1000 (its report is 400 ms older), rank 1 on 0 at NOW - 800. */
START_TEST(link_edge_by_start_time)
{
	members(3, "hostA", "hostB", "hostC");
	report(0, 0, FRESH - 400, "executing", 2, 500, OPEN("g", "dataplane", 1000.0));
	report(1, 0, FRESH, "executing", 0, 700, OPEN("g", "dataplane", 1400.0));
	report(2, 0, FRESH, "executing", 1, 600, OPEN("g", "dataplane", 1400.0));
	classify(0);
	ck_assert_uint_eq(n_culprits(), 1);
	culprit_is(0, 2, "link", "running");
	ck_assert_int_eq(json_integer_value(json_object_get(culprit(0), "peer_rank")), 0);
}
END_TEST

/* A link slowed to a trickle: every rank of the ring blocks at the same
 * moment, but only rank 2's liveness probe to rank 1's host goes
 * unacknowledged. That edge is named, though rank 0's wait began first. */
START_TEST(link_edge_by_unacked_probe)
{
	members(3, "hostA", "hostB", "hostC");
	report(0, 0, FRESH, "executing", 2, 700, OPEN("g", "dataplane", 1200.0));
	report(1, 0, FRESH, "executing", 0, 600, OPEN("g", "dataplane", 1200.0));
	report_text(2, "{\"rank\":2,\"round\":1,\"time_ms\":1733570009900,\"comms\":[{"
	               "\"label\":\"job\",\"activity\":\"executing\",\"waiting_on\":1,"
	               "\"waiting_ms\":600,\"waiting_unacked_ms\":450,\"entries\":[" OPEN(
	                       "g", "dataplane", 1200.0) "]}]}");
	classify(0);
	ck_assert_uint_eq(n_culprits(), 1);
	culprit_is(0, 1, "link", "running");
	ck_assert_int_eq(json_integer_value(json_object_get(culprit(0), "peer_rank")), 2);
	ck_assert_ptr_nonnull(
	        strstr(text("summary"), "its liveness probe to hostB has waited 450 ms"));
	/* Below RDZV_DIAG_UNACKED_MS it is an edge like the others. */
	rdzv_diag_report_fini(&rep[2]);
	report(2, 0, FRESH, "executing", 1, 600, OPEN("g", "dataplane", 1200.0));
	classify(0);
	culprit_is(0, 2, "link", "running");
}
END_TEST

/* Two ranks on two hosts each waiting on the other are a link, even while
 * another rank has not submitted. */
START_TEST(two_cycle_across_hosts)
{
	members(4, "hostA", "hostA", "hostB", "hostB");
	report(0, 1, FRESH, "executing", 2, 3000, OPEN("g", "dataplane", 3300.0));
	report(2, 1, FRESH, "executing", 0, 3000, OPEN("g", "dataplane", 3300.0));
	report(1, 1, FRESH, "negotiating", -1, 0, OPEN("g", "submitted", 3300.0));
	report(3, 1, FRESH, "idle", -1, 0, DONE("f"));
	classify(0);
	ck_assert_uint_eq(n_culprits(), 2);
	culprit_is(0, 3, "not_submitted", "running");
	ck_assert_str_eq(json_string_value(json_object_get(culprit(1), "kind")), "link");
}
END_TEST

/* A cut between hostA and hostC during a ring's last transfer: rank 2
 * (hostC) completed step.10, but what it sent never reached rank 0, which
 * still waits on it there; ranks 1 and 2 wait in step.11, which rank 0 has
 * not submitted. A link, not a rank that skipped an op. */
START_TEST(lost_transfer_is_a_link)
{
	members(3, "hostA", "hostB", "hostC");
	report(0, 0, FRESH, "executing", 2, 1400,
	       DONE("step.9") "," OPEN("step.10", "dataplane", 1500.0));
	for (int r = 1; r < 3; r++)
		report(r, 0, FRESH, "negotiating", -1, 0,
		       DONE("step.10") "," OPEN("step.11", "submitted", 1450.0));
	classify(0);
	ck_assert_uint_eq(n_culprits(), 1);
	culprit_is(0, 2, "link", "running");
	ck_assert_int_eq(json_integer_value(json_object_get(culprit(0), "peer_rank")), 0);
	ck_assert_str_eq(
	        text("summary"),
	        "a link between hostC and hostA: rank 0 (hostA) has waited 1400 ms in "
	        "allreduce 'step.10' for data from rank 2 (hostC), which completed it: what "
	        "it sent did not arrive; ranks 1, 2 wait in allreduce 'step.11'");
	/* The same rank 0 waiting on nobody is a rank that has not submitted. */
	rdzv_diag_report_fini(&rep[0]);
	report(0, 0, FRESH, "executing", -1, 0,
	       DONE("step.9") "," OPEN("step.10", "dataplane", 1500.0));
	classify(0);
	ck_assert_uint_eq(n_culprits(), 1);
	culprit_is(0, 0, "not_submitted", "running");
}
END_TEST

/* The same loss seen from the other side: rank 0 completed step.16 and
 * negotiates step.17; rank 1 still waits in step.16 for its data, and rank 2
 * waits on rank 1. */
START_TEST(lost_transfer_to_a_waiting_rank)
{
	members(3, "hostA", "hostB", "hostC");
	report(0, 0, FRESH, "negotiating", -1, 0,
	       DONE("step.16") "," OPEN("step.17", "submitted", 1400.0));
	report(1, 0, FRESH, "executing", 0, 1400, OPEN("step.16", "dataplane", 1500.0));
	report(2, 0, FRESH, "executing", 1, 1390, OPEN("step.16", "dataplane", 1500.0));
	classify(0);
	ck_assert_uint_eq(n_culprits(), 1);
	culprit_is(0, 0, "link", "running");
	ck_assert_int_eq(json_integer_value(json_object_get(culprit(0), "peer_rank")), 1);
	ck_assert_str_eq(
	        text("summary"),
	        "a link between hostA and hostB: rank 1 (hostB) has waited 1400 ms in "
	        "allreduce 'step.16' for data from rank 0 (hostA), which completed it: what "
	        "it sent did not arrive");
}
END_TEST

/* A rank's own wait on itself is ignored: it never blames itself. */
START_TEST(never_blames_itself)
{
	members(2, "a", "b");
	report(0, 1, FRESH, "executing", 0, 3000, OPEN("g", "dataplane", 3300.0));
	report(1, 1, FRESH, "executing", -1, 0, OPEN("g", "dataplane", 3300.0));
	classify(0);
	ck_assert(json_is_true(json_object_get(doc, "stalled")));
	ck_assert_uint_eq(n_culprits(), 0);
	ck_assert_ptr_nonnull(strstr(text("summary"), "no rank is to blame"));
}
END_TEST

/* A negotiation mismatch: the failed entry's text names both sides. */
START_TEST(mismatch)
{
	members(4, "a", "a", "b", "b");
	const char *err = "allreduce 'w': rank 0 passed shape [4], rank 2 passed [8]";
	char entry[512];
	snprintf(entry, sizeof(entry),
	         "{\"name\":\"w\",\"op\":\"allreduce\",\"state\":\"failed\",\"age_ms\":500,"
	         "\"status\":\"KOLO_EMISMATCH\",\"error\":\"%s\"}",
	         err);
	for (int r = 0; r < 4; r++)
		report(r, 1, FRESH, "idle", -1, 0, entry);
	classify(0);
	ck_assert(json_is_false(json_object_get(doc, "stalled")));
	ck_assert_uint_eq(n_culprits(), 1);
	/* Rank 0 reported it first; the other side it names is rank 2. */
	culprit_is(0, 2, "mismatch", "running");
	ck_assert_ptr_nonnull(
	        strstr(json_string_value(json_object_get(culprit(0), "detail")), err));
	ck_assert_ptr_nonnull(strstr(text("summary"), err));
}
END_TEST

/* Ranks 2 and 3 sent nothing (their heartbeats are fresh): both named,
 * and the request is not complete until they answer. */
START_TEST(missing_reports)
{
	members(4, "a", "a", "b", "b");
	report(0, 2, FRESH, "negotiating", -1, 0, OPEN("s", "submitted", 5000.0));
	report(1, 2, FRESH, "negotiating", -1, 0, OPEN("s", "submitted", 5000.0));
	classify(2);
	ck_assert(json_is_false(json_object_get(doc, "complete")));
	ck_assert_uint_eq(n_culprits(), 2);
	culprit_is(0, 2, "unresponsive", "not_responding");
	culprit_is(1, 3, "unresponsive", "not_responding");
	ck_assert_str_eq(rank_state(3), "no_report");
	ck_assert(json_is_null(json_object_get(json_array_get(json_object_get(doc, "ranks"), 3),
	                                       "report_age_ms")));
	report(2, 2, FRESH, "idle", -1, 0, "");
	report(3, 1, FRESH, "idle", -1, 0, "");
	classify(2);
	ck_assert(json_is_false(json_object_get(doc, "complete"))); /* 3 answered request 1 */
	teardown();
	members(4, "a", "a", "b", "b");
	for (int r = 0; r < 4; r++)
		report(r, 2, FRESH, "idle", -1, 0, "");
	classify(2);
	ck_assert(json_is_true(json_object_get(doc, "complete")));
}
END_TEST

/* Bad JSON is ignored and said; missing and extra fields are tolerated. */
START_TEST(unreadable_report)
{
	members(3, "a", "b", "c");
	report(0, 1, FRESH, "negotiating", -1, 0, OPEN("s", "submitted", 4000.0));
	report_text(1, "{\"rank\":1,\"comms\":[{\"label\":\"job\"");
	report_text(2, "{\"rank\":2,\"time_ms\":"
	               "1733570009990"
	               ",\"extra\":[1,2],"
	               "\"comms\":[{\"label\":\"job\",\"entries\":[{\"name\":\"t\",\"x\":1},7]},"
	               "\"junk\"]}");
	ck_assert_int_eq(rep[2].n_comms, 1);
	ck_assert_int_eq(rep[2].comms[0].n_entries, 1);
	ck_assert_int_eq(rep[2].comms[0].waiting_on, -1);
	classify(0);
	ck_assert_uint_eq(n_culprits(), 2);
	culprit_is(0, 1, "unresponsive", "running");
	ck_assert_ptr_nonnull(
	        strstr(json_string_value(json_object_get(culprit(0), "detail")), "bad report"));
	culprit_is(1, 2, "not_submitted", "running");
	const json_t *row = json_array_get(json_object_get(doc, "ranks"), 1);
	ck_assert_ptr_nonnull(json_object_get(row, "report_error"));
	struct rdzv_diag_report bad;
	char e[160];
	ck_assert_int_eq(rdzv_diag_report_parse("[1]", 3, &bad, e, sizeof(e)), KOLO_EINVAL);
	ck_assert_int_eq(rdzv_diag_report_parse("{\"rank\":\"1\"}", 11, &bad, e, sizeof(e)),
	                 KOLO_EINVAL);
	ck_assert_int_eq(rdzv_diag_report_parse(NULL, 0, &bad, e, sizeof(e)), KOLO_EINVAL);
}
END_TEST

/* A process set is judged among its members only. */
START_TEST(process_set)
{
	members(4, "a", "b", "c", "d");
	const char *set_waits =
	        "{\"rank\":0,\"round\":1,\"time_ms\":1733570009900,\"comms\":["
	        "{\"label\":\"set 1\",\"members\":[0,2],\"activity\":\"negotiating\","
	        "\"waiting_on\":-1,\"entries\":[" OPEN("x", "submitted", 2500) "]}]}";
	report_text(0, set_waits);
	report_text(2, "{\"rank\":2,\"round\":1,\"time_ms\":1733570009900,\"comms\":["
	               "{\"label\":\"job\",\"entries\":[]},"
	               "{\"label\":\"set 1\",\"members\":[0,2],\"entries\":[]}]}");
	classify(0);
	ck_assert_str_eq(
	        json_string_value(json_object_get(json_object_get(doc, "stalled_op"), "comm")),
	        "set 1");
	ck_assert_uint_eq(n_culprits(), 1);
	culprit_is(0, 2, "not_submitted", "running");
}
END_TEST

/* A rank that sent nothing is not blamed while a request made during the
 * stall is younger than RDZV_DIAG_ANSWER_MS, nor before any request: a
 * live worker with nothing open reports only when asked. */
START_TEST(silent_rank_gets_time_to_answer)
{
	members(4, "a", "a", "b", "b");
	for (int r = 0; r < 4; r++)
		if (r != 2)
			report(r, 1, FRESH, "negotiating", -1, 0, OPEN("s", "submitted", 3000.0));
	int64_t young[] = {NOW - 100, 0, NOW - 60000};
	for (int i = 0; i < 3; i++) {
		request_ms = young[i];
		classify(0);
		ck_assert(json_is_true(json_object_get(doc, "stalled")));
		ck_assert_uint_eq(n_culprits(), 0);
		ck_assert_ptr_nonnull(strstr(text("summary"), "waiting for the reports of 1 rank"));
	}
	request_ms = NOW - RDZV_DIAG_ANSWER_MS;
	classify(0);
	ck_assert_uint_eq(n_culprits(), 1);
	culprit_is(0, 2, "unresponsive", "not_responding");
	request_ms = NOW - 1000;
}
END_TEST

/* Rank 3, on rank 2's host, says what it sees of rank 2's process
 * ("peers"); the others wait in negotiation. */
static void witnessed(const char *state)
{
	char t[1024];
	for (int r = 0; r < 4; r++)
		rdzv_diag_report_fini(&rep[r]);
	members(4, "a", "a", "b", "b");
	for (int r = 0; r < 2; r++)
		report(r, 1, FRESH, "negotiating", -1, 0, OPEN("s", "submitted", 3000.0));
	snprintf(t, sizeof(t),
	         "{\"rank\":3,\"round\":1,\"host\":\"b\",\"time_ms\":%lld,\"peers\":[{\"rank\":2,"
	         "\"state\":\"%s\"},{\"rank\":\"x\"},7],\"comms\":[{\"label\":\"job\","
	         "\"activity\":\"negotiating\",\"waiting_on\":-1,\"entries\":[" OPEN(
	                 "s", "submitted", 3000.0) "]}]}",
	         (long long)FRESH, state);
	report_text(3, t);
	ck_assert_ptr_nonnull(mem[3].report);
	classify(0);
	ck_assert_uint_eq(n_culprits(), 1);
}

START_TEST(stopped_running_or_gone_seen_on_its_host)
{
	witnessed("stopped");
	culprit_is(0, 2, "unresponsive", "stopped");
	ck_assert_ptr_nonnull(strstr(text("summary"), "is stopped: rank 3 on the same host sees"));
	witnessed("running");
	culprit_is(0, 2, "unresponsive", "running");
	ck_assert_ptr_nonnull(
	        strstr(text("summary"), "it is hung, or cannot reach the rendezvous"));
	witnessed("gone");
	culprit_is(0, 2, "dead", "gone");
	witnessed("sleeping"); /* a state it does not know: no witness */
	culprit_is(0, 2, "unresponsive", "not_responding");
	/* A witness from another host is none. */
	witnessed("stopped");
	mem[3].host = "c";
	rep[3].host = "c";
	classify(0);
	culprit_is(0, 2, "unresponsive", "not_responding");
}
END_TEST

/* One rank per host: the probe of a rank waiting on the silent one tells an
 * unreachable host from a live host whose process says nothing. */
START_TEST(unreachable_or_alive_by_the_probe)
{
	int64_t unacked[] = {900, 0};
	for (int i = 0; i < 2; i++) {
		char t[1024];
		for (int r = 0; r < 3; r++)
			rdzv_diag_report_fini(&rep[r]);
		members(3, "a", "b", "c");
		report(0, 1, FRESH, "executing", 1, 1500, OPEN("g", "dataplane", 3000.0));
		snprintf(t, sizeof(t),
		         "{\"rank\":2,\"round\":1,\"host\":\"c\",\"time_ms\":%lld,\"comms\":[{"
		         "\"label\":\"job\",\"activity\":\"executing\",\"waiting_on\":1,"
		         "\"waiting_ms\":1500,\"waiting_unacked_ms\":%lld,\"entries\":[" OPEN(
		                 "g", "dataplane", 3000.0) "]}]}",
		         (long long)FRESH, (long long)unacked[i]);
		report_text(2, t);
		classify(0);
		ck_assert_uint_eq(n_culprits(), 1);
		culprit_is(0, 1, "unresponsive", i == 0 ? "unreachable" : "not_responding");
		ck_assert_ptr_nonnull(
		        strstr(text("summary"),
		               i == 0 ? "is unreachable: its host has not acknowledged "
		                        "rank 2's liveness probe for 900 ms"
		                      : "while its host answers rank 2's liveness probe"));
	}
}
END_TEST

/* The skipper's next op may be older than the op the others wait in: the
 * stalled op is the one most ranks have open. */
START_TEST(skipped_op_younger_than_the_next)
{
	members(4, "a", "a", "b", "b");
	for (int r = 0; r < 4; r++)
		if (r != 2)
			report(r, 1, FRESH, "negotiating", -1, 0,
			       DONE("step.19") "," OPEN("step.20", "submitted", 3000.0));
	report(2, 1, FRESH, "negotiating", -1, 0,
	       DONE("step.19") "," OPEN("step.21", "submitted", 3100.0));
	classify(0);
	ck_assert_uint_eq(n_culprits(), 1);
	culprit_is(0, 2, "not_submitted", "running");
	ck_assert_str_eq(
	        json_string_value(json_object_get(json_object_get(doc, "stalled_op"), "name")),
	        "step.20");
}
END_TEST

static Suite *server_diag_suite(void)
{
	Suite *s = suite_create("server_diag");
	TCase *tc = tcase_create("classify");
	tcase_add_checked_fixture(tc, NULL, teardown);
	tcase_add_test(tc, healthy_job);
	tcase_add_test(tc, skipped_allreduce);
	tcase_add_test(tc, not_submitted_summary);
	tcase_add_test(tc, chain_names_its_end);
	tcase_add_test(tc, stopped_inside_op);
	tcase_add_test(tc, dead_rank);
	tcase_add_test(tc, link_cycle);
	tcase_add_test(tc, two_cycle_across_hosts);
	tcase_add_test(tc, link_edge_by_start_time);
	tcase_add_test(tc, link_edge_by_unacked_probe);
	tcase_add_test(tc, lost_transfer_is_a_link);
	tcase_add_test(tc, lost_transfer_to_a_waiting_rank);
	tcase_add_test(tc, never_blames_itself);
	tcase_add_test(tc, mismatch);
	tcase_add_test(tc, missing_reports);
	tcase_add_test(tc, unreadable_report);
	tcase_add_test(tc, process_set);
	tcase_add_test(tc, silent_rank_gets_time_to_answer);
	tcase_add_test(tc, skipped_op_younger_than_the_next);
	tcase_add_test(tc, stopped_running_or_gone_seen_on_its_host);
	tcase_add_test(tc, unreachable_or_alive_by_the_probe);
	suite_add_tcase(s, tc);
	return s;
}

KOLO_CHECK_MAIN(server_diag_suite)
