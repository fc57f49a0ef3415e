/* Preemption notices: the providers' documents parsed (pure functions), the
 * provider list and the endpoint overrides. The documents follow the
 * providers' published formats. */
#include <string.h>

#include "preempt.h"
#include "testutil.h"

#define LEN(s) (s), strlen(s)

START_TEST(test_providers)
{
	unsigned m;
	bool probe;
	struct kolo_errbuf eb = {{0}};
	ck_assert_int_eq(kolo_preempt_parse_providers("", &m, &probe, &eb), KOLO_OK);
	ck_assert_uint_eq(m, 0);
	ck_assert_int_eq(kolo_preempt_parse_providers(NULL, &m, &probe, &eb), KOLO_OK);
	ck_assert_uint_eq(m, 0);
	ck_assert_int_eq(kolo_preempt_parse_providers("off", &m, &probe, &eb), KOLO_OK);
	ck_assert_uint_eq(m, 0);
	ck_assert_int_eq(kolo_preempt_parse_providers("0", &m, &probe, &eb), KOLO_OK);
	ck_assert_uint_eq(m, 0);
	ck_assert_int_eq(kolo_preempt_parse_providers("aws", &m, &probe, &eb), KOLO_OK);
	ck_assert_uint_eq(m, KOLO_PREEMPT_AWS);
	ck_assert(!probe);
	ck_assert_int_eq(kolo_preempt_parse_providers(" GCE, k8s,azure ", &m, &probe, &eb),
	                 KOLO_OK);
	ck_assert_uint_eq(m, KOLO_PREEMPT_GCE | KOLO_PREEMPT_K8S | KOLO_PREEMPT_AZURE);
	ck_assert_int_eq(kolo_preempt_parse_providers("auto", &m, &probe, &eb), KOLO_OK);
	ck_assert_uint_eq(m, KOLO_PREEMPT_ALL);
	ck_assert(probe);
	ck_assert_int_eq(kolo_preempt_parse_providers("aws,ibm", &m, &probe, &eb), KOLO_EINVAL);
	ck_assert_msg(strstr(eb.msg, "'ibm'"), "%s", eb.msg);
	ck_assert_uint_eq(m, 0);
	ck_assert_int_eq(kolo_preempt_parse_providers("auto,aws", &m, &probe, &eb), KOLO_EINVAL);
	ck_assert_int_eq(kolo_preempt_parse_providers("awsgce", &m, &probe, &eb), KOLO_EINVAL);
}
END_TEST

START_TEST(test_aws_instance_action)
{
	char action[32], when[64];
	const char *doc = "{\"action\": \"terminate\", \"time\": \"2026-12-07T14:32:00Z\"}";
	ck_assert(kolo_preempt_parse_aws_action(LEN(doc), action, sizeof(action), when,
	                                        sizeof(when)));
	ck_assert_str_eq(action, "terminate");
	ck_assert_str_eq(when, "2026-12-07T14:32:00Z");
	ck_assert(kolo_preempt_parse_aws_action(LEN("{\"action\":\"stop\"}"), action,
	                                        sizeof(action), when, sizeof(when)));
	ck_assert_str_eq(action, "stop");
	ck_assert_str_eq(when, "");
	ck_assert(kolo_preempt_parse_aws_action(LEN("{\"action\":\"hibernate\",\"time\":\"t\"}"),
	                                        NULL, 0, NULL, 0));
	/* Not notices: another action, no action, not JSON, an HTML 404 page. */
	ck_assert(!kolo_preempt_parse_aws_action(LEN("{\"action\":\"reboot\"}"), action,
	                                         sizeof(action), when, sizeof(when)));
	ck_assert_str_eq(action, "");
	ck_assert(!kolo_preempt_parse_aws_action(LEN("{\"time\":\"x\"}"), NULL, 0, NULL, 0));
	ck_assert(!kolo_preempt_parse_aws_action(LEN("[\"terminate\"]"), NULL, 0, NULL, 0));
	ck_assert(!kolo_preempt_parse_aws_action(LEN("<html>404 - Not Found</html>"), NULL, 0, NULL,
	                                         0));
	ck_assert(!kolo_preempt_parse_aws_action(NULL, 0, NULL, 0, NULL, 0));
}
END_TEST

START_TEST(test_aws_rebalance)
{
	char when[64];
	ck_assert(kolo_preempt_parse_aws_rebalance(
	        LEN("{\"noticeTime\": \"2026-12-07T14:20:00Z\"}"), when, sizeof(when)));
	ck_assert_str_eq(when, "2026-12-07T14:20:00Z");
	ck_assert(!kolo_preempt_parse_aws_rebalance(LEN("{}"), when, sizeof(when)));
	ck_assert(!kolo_preempt_parse_aws_rebalance(LEN("Not Found"), when, sizeof(when)));
}
END_TEST

START_TEST(test_gce)
{
	ck_assert(kolo_preempt_parse_gce(LEN("TRUE")));
	ck_assert(kolo_preempt_parse_gce(LEN(" TRUE\n")));
	ck_assert(!kolo_preempt_parse_gce(LEN("FALSE")));
	ck_assert(!kolo_preempt_parse_gce(LEN("true")));
	ck_assert(!kolo_preempt_parse_gce(LEN("TRUEISH")));
	ck_assert(!kolo_preempt_parse_gce(LEN("")));
	ck_assert(!kolo_preempt_parse_gce(NULL, 0));
}
END_TEST

/* The Scheduled Events document (api-version 2020-07-01). */
static const char *azure_doc =
        "{\"DocumentIncarnation\": 3, \"Events\": ["
        "{\"EventId\": \"A1B2\", \"EventType\": \"Freeze\", \"ResourceType\": "
        "\"VirtualMachine\", \"Resources\": [\"vm-a\"], \"EventStatus\": \"Scheduled\", "
        "\"NotBefore\": \"Mon, 07 Dec 2026 14:40:00 GMT\", \"EventSource\": \"Platform\", "
        "\"DurationInSeconds\": 5},"
        "{\"EventId\": \"C3D4\", \"EventType\": \"Preempt\", \"ResourceType\": "
        "\"VirtualMachine\", \"Resources\": [\"vm-b\", \"vm-c\"], \"EventStatus\": "
        "\"Scheduled\", \"NotBefore\": \"Mon, 07 Dec 2026 14:41:00 GMT\", \"Description\": "
        "\"\", \"EventSource\": \"Platform\", \"DurationInSeconds\": -1}]}";

START_TEST(test_azure)
{
	char id[64], nb[64];
	ck_assert(kolo_preempt_parse_azure(LEN(azure_doc), "vm-c", id, sizeof(id), nb, sizeof(nb)));
	ck_assert_str_eq(id, "C3D4");
	ck_assert_str_eq(nb, "Mon, 07 Dec 2026 14:41:00 GMT");
	ck_assert(kolo_preempt_parse_azure(LEN(azure_doc), "VM-B", id, sizeof(id), NULL, 0));
	ck_assert_str_eq(id, "C3D4");
	/* Another VM's Preempt, and this VM's Freeze, are not notices. */
	ck_assert(
	        !kolo_preempt_parse_azure(LEN(azure_doc), "vm-a", id, sizeof(id), nb, sizeof(nb)));
	ck_assert_str_eq(id, "");
	/* The name could not be read: any Preempt counts. */
	ck_assert(kolo_preempt_parse_azure(LEN(azure_doc), "", id, sizeof(id), NULL, 0));
	ck_assert(kolo_preempt_parse_azure(LEN(azure_doc), NULL, id, sizeof(id), NULL, 0));
	ck_assert(!kolo_preempt_parse_azure(LEN("{\"DocumentIncarnation\": 0, \"Events\": []}"),
	                                    NULL, id, sizeof(id), NULL, 0));
	ck_assert(
	        !kolo_preempt_parse_azure(LEN("{\"Events\": {}}"), NULL, id, sizeof(id), NULL, 0));
	ck_assert(!kolo_preempt_parse_azure(LEN("oops"), NULL, id, sizeof(id), NULL, 0));
}
END_TEST

START_TEST(test_pod)
{
	char reason[128], deleted[64];
	const char *pod = "{\"kind\": \"Pod\", \"apiVersion\": \"v1\", \"metadata\": {\"name\": "
	                  "\"train-0\"}, \"status\": {\"phase\": \"Running\", \"conditions\": ["
	                  "{\"type\": \"Ready\", \"status\": \"True\"},"
	                  "{\"type\": \"DisruptionTarget\", \"status\": \"True\", \"reason\": "
	                  "\"TerminationByKubelet\", \"message\": \"node shutdown\", "
	                  "\"lastTransitionTime\": \"2026-12-07T14:30:00Z\"}]}}";
	ck_assert(
	        kolo_preempt_parse_pod(LEN(pod), reason, sizeof(reason), deleted, sizeof(deleted)));
	ck_assert_str_eq(reason, "TerminationByKubelet: node shutdown");
	ck_assert_str_eq(deleted, ""); /* not deleted yet: no deadline */
	const char *no = "{\"status\": {\"conditions\": [{\"type\": \"DisruptionTarget\", "
	                 "\"status\": \"False\"}, {\"type\": \"Ready\", \"status\": \"True\"}]}}";
	ck_assert(!kolo_preempt_parse_pod(LEN(no), reason, sizeof(reason), NULL, 0));
	ck_assert_str_eq(reason, "");
	ck_assert(!kolo_preempt_parse_pod(LEN("{\"status\": {\"phase\": \"Pending\"}}"), NULL, 0,
	                                  NULL, 0));
	ck_assert(!kolo_preempt_parse_pod(LEN("{\"kind\": \"Status\", \"code\": 403}"), NULL, 0,
	                                  NULL, 0));
	const char *bare = "{\"status\": {\"conditions\": [{\"type\": \"DisruptionTarget\", "
	                   "\"status\": \"True\"}]}}";
	ck_assert(kolo_preempt_parse_pod(LEN(bare), reason, sizeof(reason), deleted,
	                                 sizeof(deleted)));
	ck_assert_str_eq(reason, "");
	/* Deleted: the grace period ends at metadata.deletionTimestamp. */
	const char *gone = "{\"metadata\": {\"name\": \"train-0\", \"deletionTimestamp\": "
	                   "\"2026-12-07T14:30:30Z\", \"deletionGracePeriodSeconds\": 30}, "
	                   "\"status\": {\"conditions\": [{\"type\": \"DisruptionTarget\", "
	                   "\"status\": \"True\", \"reason\": \"PreemptionByScheduler\"}]}}";
	ck_assert(kolo_preempt_parse_pod(LEN(gone), reason, sizeof(reason), deleted,
	                                 sizeof(deleted)));
	ck_assert_str_eq(deleted, "2026-12-07T14:30:30Z");
	int64_t at;
	ck_assert(kolo_preempt_parse_time(deleted, &at));
	ck_assert_int_eq(at, 1796653830000LL);
	/* A deletionTimestamp without the condition is no notice (SIGTERM is). */
	const char *deleting = "{\"metadata\": {\"deletionTimestamp\": \"2026-12-07T14:30:30Z\"},"
	                       " \"status\": {\"conditions\": []}}";
	ck_assert(!kolo_preempt_parse_pod(LEN(deleting), NULL, 0, deleted, sizeof(deleted)));
	ck_assert_str_eq(deleted, "");
}
END_TEST

START_TEST(test_deadline_times)
{
	int64_t at = 0;
	/* AWS instance-action's time (RFC 3339, UTC). */
	char action[32], when[64];
	const char *doc = "{\"action\": \"terminate\", \"time\": \"2026-12-07T14:32:00Z\"}";
	ck_assert(kolo_preempt_parse_aws_action(LEN(doc), action, sizeof(action), when,
	                                        sizeof(when)));
	ck_assert(kolo_preempt_parse_time(when, &at));
	ck_assert_int_eq(at, 1796653920000LL);
	/* RFC 3339 variants: fractions, offsets, a leap day. */
	ck_assert(kolo_preempt_parse_time("2026-12-07T14:32:00.250Z", &at));
	ck_assert_int_eq(at, 1796653920250LL);
	ck_assert(kolo_preempt_parse_time("2026-12-07T15:32:00+01:00", &at));
	ck_assert_int_eq(at, 1796653920000LL);
	ck_assert(kolo_preempt_parse_time("2026-12-07T09:02:00-05:30", &at));
	ck_assert_int_eq(at, 1796653920000LL);
	ck_assert(kolo_preempt_parse_time("2000-02-29T00:00:00Z", &at));
	ck_assert_int_eq(at, 951782400000LL);
	ck_assert(kolo_preempt_parse_time("1970-01-01T00:00:00Z", &at));
	ck_assert_int_eq(at, 0);
	/* Azure's NotBefore (RFC 1123). */
	char id[64], nb[64];
	ck_assert(kolo_preempt_parse_azure(LEN(azure_doc), "vm-c", id, sizeof(id), nb, sizeof(nb)));
	ck_assert(kolo_preempt_parse_time(nb, &at));
	ck_assert_int_eq(at, 1796654460000LL);
	ck_assert(kolo_preempt_parse_time("Mon, 07 Dec 2026 14:32:00 UTC", &at));
	ck_assert_int_eq(at, 1796653920000LL);
	/* An empty NotBefore (the event may start now) is no time: the
	 * watcher takes the moment of the notice. */
	const char *now_doc = "{\"Events\": [{\"EventId\": \"E1\", \"EventType\": \"Preempt\", "
	                      "\"Resources\": [\"vm-c\"], \"EventStatus\": \"Started\", "
	                      "\"NotBefore\": \"\"}]}";
	ck_assert(kolo_preempt_parse_azure(LEN(now_doc), "vm-c", id, sizeof(id), nb, sizeof(nb)));
	ck_assert_str_eq(nb, "");
	at = 7;
	ck_assert(!kolo_preempt_parse_time(nb, &at));
	ck_assert(!kolo_preempt_parse_time(NULL, &at));
	/* Malformed: no zone, a bad month or day, trailing bytes, another zone. */
	ck_assert(!kolo_preempt_parse_time("2026-12-07T14:32:00", &at));
	ck_assert(!kolo_preempt_parse_time("2026-13-07T14:32:00Z", &at));
	ck_assert(!kolo_preempt_parse_time("2026-12-32T14:32:00Z", &at));
	ck_assert(!kolo_preempt_parse_time("2026-12-07T14:32:00Zx", &at));
	ck_assert(!kolo_preempt_parse_time("2026-12-07", &at));
	ck_assert(!kolo_preempt_parse_time("Mon, 07 Dez 2026 14:32:00 GMT", &at));
	ck_assert(!kolo_preempt_parse_time("Mon, 07 Dec 2026 14:32:00 PST", &at));
	ck_assert(!kolo_preempt_parse_time("tomorrow", &at));
	ck_assert_int_eq(at, 7);
	/* The log's form, and back. */
	char out[32];
	kolo_preempt_format_time(1796653920250LL, out, sizeof(out));
	ck_assert_str_eq(out, "2026-12-07T14:32:00Z");
	kolo_preempt_format_time(951782400000LL + 86399000, out, sizeof(out));
	ck_assert_str_eq(out, "2000-02-29T23:59:59Z");
	ck_assert(kolo_preempt_parse_time(out, &at));
	ck_assert_int_eq(at, 951782400000LL + 86399000);
}
END_TEST

START_TEST(test_base_url)
{
	char out[128];
	kolo_preempt_base_url(NULL, false, "http://169.254.169.254", out, sizeof(out));
	ck_assert_str_eq(out, "http://169.254.169.254");
	kolo_preempt_base_url("", false, "http://169.254.169.254", out, sizeof(out));
	ck_assert_str_eq(out, "http://169.254.169.254");
	kolo_preempt_base_url("http://127.0.0.1:1338/", false, "x", out, sizeof(out));
	ck_assert_str_eq(out, "http://127.0.0.1:1338");
	kolo_preempt_base_url("http://[fd00:ec2::254]", false, "x", out, sizeof(out));
	ck_assert_str_eq(out, "http://[fd00:ec2::254]");
	kolo_preempt_base_url("127.0.0.1:8080", true, "x", out, sizeof(out));
	ck_assert_str_eq(out, "http://127.0.0.1:8080");
	kolo_preempt_base_url("metadata.google.internal", true, "x", out, sizeof(out));
	ck_assert_str_eq(out, "http://metadata.google.internal");
}
END_TEST

static Suite *preempt_suite(void)
{
	Suite *s = suite_create("preempt");
	TCase *tc = tcase_create("parse");
	tcase_set_timeout(tc, 10);
	tcase_add_test(tc, test_providers);
	tcase_add_test(tc, test_aws_instance_action);
	tcase_add_test(tc, test_aws_rebalance);
	tcase_add_test(tc, test_gce);
	tcase_add_test(tc, test_azure);
	tcase_add_test(tc, test_pod);
	tcase_add_test(tc, test_deadline_times);
	tcase_add_test(tc, test_base_url);
	suite_add_tcase(s, tc);
	return s;
}

KOLO_CHECK_MAIN(preempt_suite)
