/* kolo-doctor: why is a job stuck? Asks the rendezvous server for the job's
 * hang diagnosis (docs/rendezvous.md, "Diagnosis") and prints it in words:
 * the summary, one line per culprit, then a table of ranks.
 *
 *   kolo-doctor URL JOB [--json] [--no-request] [--wait-ms N] [--watch SECONDS]
 *
 * The token comes from KOLO_TOKEN or KOLO_TOKEN_FILE, as for every kolo
 * program; never from the command line. Exit status: 0 no stall, 1 a stall
 * (or a mismatch) was diagnosed, 2 usage or connection errors. */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "rendezvous.h"

#define EXIT_STALL          1
#define EXIT_USAGE          2
#define CONNECT_DEADLINE_MS 5000 /* retries while the server is unreachable */

struct options {
	const char *url, *job;
	bool json, request;
	int wait_ms;
	int min_ms;  /* -1: the server's default */
	int watch_s; /* 0: once */
};

static void usage(FILE *f)
{
	fprintf(f, "usage: kolo-doctor URL JOB [--json] [--no-request] [--wait-ms N] "
	           "[--min-ms N] [--watch SECONDS]\n"
	           "  URL            the rendezvous server, http://HOST:PORT\n"
	           "  JOB            the job id\n"
	           "  --json         print the server's JSON document as it is\n"
	           "  --no-request   do not ask the workers for fresh reports; judge the\n"
	           "                 reports already there\n"
	           "  --wait-ms N    wait up to N ms for every worker's report (default 3000)\n"
	           "  --min-ms N     an op open less than N ms is no stall (default: the\n"
	           "                 server's, 1000)\n"
	           "  --watch S      diagnose again every S seconds until interrupted\n"
	           "The token is read from KOLO_TOKEN or KOLO_TOKEN_FILE.\n"
	           "Exit status: 0 no stall, 1 a stall was diagnosed, 2 usage or connection "
	           "error.\n");
}

static bool parse_int(const char *s, int lo, int hi, int *out)
{
	char *end;
	errno = 0;
	long v = strtol(s, &end, 10);
	if (errno || *end || end == s || v < lo || v > hi)
		return false;
	*out = (int)v;
	return true;
}

/* Fills o from argv; false (after a message) on a usage error. */
static bool parse_args(int argc, char **argv, struct options *o)
{
	enum { O_JSON = 256, O_NOREQ, O_WAIT, O_WATCH, O_HELP, O_MIN };
	static const struct option opts[] = {
	        {"json", no_argument, NULL, O_JSON},
	        {"no-request", no_argument, NULL, O_NOREQ},
	        {"wait-ms", required_argument, NULL, O_WAIT},
	        {"watch", required_argument, NULL, O_WATCH},
	        {"help", no_argument, NULL, O_HELP},
	        {"min-ms", required_argument, NULL, O_MIN},
	        {NULL, 0, NULL, 0},
	};
	*o = (struct options){.request = true, .wait_ms = 3000, .min_ms = -1};
	int c;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		bool ok = true;
		if (c == O_JSON) {
			o->json = true;
		} else if (c == O_NOREQ) {
			o->request = false;
		} else if (c == O_WAIT) {
			ok = parse_int(optarg, 0, 3600000, &o->wait_ms);
		} else if (c == O_MIN) {
			ok = parse_int(optarg, 0, 3600000, &o->min_ms);
		} else if (c == O_WATCH) {
			ok = parse_int(optarg, 1, 86400, &o->watch_s);
		} else if (c == O_HELP || c == 'h') {
			usage(stdout);
			exit(0);
		} else {
			usage(stderr);
			return false;
		}
		if (!ok) {
			fprintf(stderr, "kolo-doctor: bad value \"%s\" for --%s\n", optarg,
			        opts[c - O_JSON].name);
			return false;
		}
	}
	if (argc - optind != 2) {
		usage(stderr);
		return false;
	}
	o->url = argv[optind];
	o->job = argv[optind + 1];
	return true;
}

/* ---- printing ------------------------------------------------------------- */

static const char *str(const json_t *o, const char *key, const char *def)
{
	const char *s = json_string_value(json_object_get(o, key));
	return s ? s : def;
}

/* An integer field as text, "-" when null, absent or below lo. */
static const char *int_text(const json_t *o, const char *key, long long lo, const char *unit,
                            char *buf, size_t size)
{
	const json_t *v = json_object_get(o, key);
	if (!json_is_integer(v) || json_integer_value(v) < lo)
		return "-";
	snprintf(buf, size, "%lld%s", (long long)json_integer_value(v), unit);
	return buf;
}

static void print_culprit(const json_t *c)
{
	const char *kind = str(c, "kind", "?");
	printf("  culprit: rank %lld (host %s), %s",
	       (long long)json_integer_value(json_object_get(c, "rank")), str(c, "host", "?"),
	       kind);
	printf(" [process %s]: %s\n", str(c, "process", "?"), str(c, "detail", ""));
}

static void print_ranks(const json_t *ranks)
{
	printf("\n%-5s %-20s %-13s %-14s %-10s %-24s %s\n", "rank", "host", "state", "process",
	       "waiting on", "open op", "heartbeat");
	size_t i;
	const json_t *r;
	json_array_foreach(ranks, i, r)
	{
		char w[24], hb[32];
		printf("%-5lld %-20s %-13s %-14s %-10s %-24s %s\n",
		       (long long)json_integer_value(json_object_get(r, "rank")),
		       str(r, "host", "?"), str(r, "state", "?"), str(r, "process", "?"),
		       int_text(r, "waiting_on", 0, "", w, sizeof(w)), str(r, "open", "-"),
		       int_text(r, "heartbeat_ms", 0, " ms ago", hb, sizeof(hb)));
		const char *err = str(r, "report_error", NULL);
		if (err)
			printf("      (its report was not used: %s)\n", err);
	}
}

static void print_words(const json_t *doc)
{
	printf("job %s, round %lld: %s\n", str(doc, "job", "?"),
	       (long long)json_integer_value(json_object_get(doc, "round")),
	       str(doc, "summary", "(no summary)"));
	const json_t *req = json_object_get(doc, "complete");
	if (json_is_false(req))
		printf("  (not every worker answered request %lld in time: the reports may be "
		       "old)\n",
		       (long long)json_integer_value(json_object_get(doc, "request")));
	size_t i;
	const json_t *c;
	json_array_foreach(json_object_get(doc, "culprits"), i, c) print_culprit(c);
	json_array_foreach(json_object_get(doc, "stragglers"), i, c)
	{
		printf("  straggler: rank %lld submitted last in %lld of the last %lld "
		       "collectives, "
		       "%.1f ms after the first on median (p90 %.1f ms)\n",
		       (long long)json_integer_value(json_object_get(c, "rank")),
		       (long long)json_integer_value(json_object_get(c, "last")),
		       (long long)json_integer_value(json_object_get(c, "ops")),
		       json_number_value(json_object_get(c, "p50_ms")),
		       json_number_value(json_object_get(c, "p90_ms")));
	}
	print_ranks(json_object_get(doc, "ranks"));
}

/* One diagnosis, printed; its exit status. */
static int diagnose(struct kolo_rdzv_client *c, const struct options *o)
{
	char *text = NULL;
	if (kolo_rdzv_diagnosis(c, o->request, o->wait_ms, o->min_ms, &text) != KOLO_OK) {
		fprintf(stderr, "kolo-doctor: %s\n", kolo_rdzv_client_error(c));
		return EXIT_USAGE;
	}
	json_error_t je;
	json_t *doc = json_loads(text, 0, &je);
	if (!json_is_object(doc)) {
		fprintf(stderr, "kolo-doctor: the server's answer is not a JSON object: %s\n",
		        je.text);
		free(text);
		json_decref(doc);
		return EXIT_USAGE;
	}
	if (o->json)
		printf("%s\n", text);
	else
		print_words(doc);
	fflush(stdout);
	bool stalled = json_is_true(json_object_get(doc, "stalled")) ||
	               json_array_size(json_object_get(doc, "culprits")) > 0;
	free(text);
	json_decref(doc);
	return stalled ? EXIT_STALL : 0;
}

int main(int argc, char **argv)
{
	struct options o;
	if (!parse_args(argc, argv, &o))
		return EXIT_USAGE;
	struct kolo_errbuf eb = {{0}};
	char *token = NULL;
	if (kolo_token_load(&token, &eb) != KOLO_OK) {
		fprintf(stderr, "kolo-doctor: %s\n", eb.msg);
		return EXIT_USAGE;
	}
	char host[KOLO_RDZV_HOST_MAX];
	if (kolo_hostname(host, sizeof(host)) != KOLO_OK || !host[0])
		snprintf(host, sizeof(host), "kolo-doctor");
	struct kolo_rdzv_client_config cc = {.url = o.url,
	                                     .job = o.job,
	                                     .token = token,
	                                     .host = host,
	                                     .deadline_ms = CONNECT_DEADLINE_MS};
	struct kolo_rdzv_client *c = NULL;
	kolo_status_t st = kolo_rdzv_client_create(&cc, &c, &eb);
	free(token);
	if (st != KOLO_OK) {
		fprintf(stderr, "kolo-doctor: %s\n", eb.msg);
		return EXIT_USAGE;
	}
	int rc = diagnose(c, &o);
	while (o.watch_s > 0 && rc != EXIT_USAGE) {
		kolo_sleep_ms((uint64_t)o.watch_s * 1000);
		printf("\n");
		rc = diagnose(c, &o);
	}
	kolo_rdzv_client_destroy(c);
	return rc;
}
