/* kolo-rendezvous: the rendezvous server as a program. */
#include "core.h"
#include "rendezvous.h"

#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

static void usage(FILE *f)
{
	fprintf(f,
	        "usage: kolo-rendezvous [options]\n"
	        "  --listen HOST:PORT   address to serve on (KOLO_LISTEN, default 0.0.0.0:%d);\n"
	        "                       port 0 picks a free port; the bound address is printed\n"
	        "                       on stdout as \"listening on HOST:PORT\"\n"
	        "  --token-file PATH    bearer token required on every /v1 request\n"
	        "                       (KOLO_TOKEN, KOLO_TOKEN_FILE; none: no authentication)\n"
	        "  --min-np N           fewest workers that form a round (KOLO_MIN_NP, 1)\n"
	        "  --max-np N           most workers in a round, 0 = no limit (KOLO_MAX_NP, 0)\n"
	        "  --settle-ms MS       form a round when no one joined for MS (KOLO_SETTLE_MS, "
	        "2000)\n"
	        "  --lease-ms MS        evict a worker silent for MS (KOLO_LEASE_MS, 10000)\n"
	        "  --job-retain-ms MS   forget a job (its configuration, KV and evictions) that\n"
	        "                       had no workers, polls or requests for MS; 0 never\n"
	        "                       (KOLO_JOB_RETAIN_MS, 3600000)\n"
	        "  --log-format F       text or json (KOLO_LOG_FORMAT, text)\n"
	        "  --help, --version\n"
	        "The HTTP API is described in docs/rendezvous.md.\n",
	        KOLO_RDZV_DEFAULT_PORT);
}

static bool parse_int(const char *s, int lo, int *out)
{
	char *end;
	errno = 0;
	long v = strtol(s, &end, 10);
	if (errno || *end || end == s || v < lo || v > 100000000)
		return false;
	*out = (int)v;
	return true;
}

static void raise_nofile(void)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
}

int main(int argc, char **argv)
{
	enum {
		O_LISTEN = 256,
		O_TOKEN_FILE,
		O_MIN,
		O_MAX,
		O_SETTLE,
		O_LEASE,
		O_RETAIN,
		O_LOGF,
		O_HELP,
		O_VER
	};
	static const struct option opts[] = {
	        {"listen", required_argument, NULL, O_LISTEN},
	        {"token-file", required_argument, NULL, O_TOKEN_FILE},
	        {"min-np", required_argument, NULL, O_MIN},
	        {"max-np", required_argument, NULL, O_MAX},
	        {"settle-ms", required_argument, NULL, O_SETTLE},
	        {"lease-ms", required_argument, NULL, O_LEASE},
	        {"job-retain-ms", required_argument, NULL, O_RETAIN},
	        {"log-format", required_argument, NULL, O_LOGF},
	        {"help", no_argument, NULL, O_HELP},
	        {"version", no_argument, NULL, O_VER},
	        {NULL, 0, NULL, 0},
	};
	const char *listen_addr = NULL, *token_file = NULL, *log_format = NULL;
	int min_np = -1, max_np = -1, settle_ms = -1, lease_ms = -1, retain_ms = -1;
	int c;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		bool ok = true;
		switch (c) {
		case O_LISTEN:
			listen_addr = optarg;
			break;
		case O_TOKEN_FILE:
			token_file = optarg;
			break;
		case O_MIN:
			ok = parse_int(optarg, 1, &min_np);
			break;
		case O_MAX:
			ok = parse_int(optarg, 0, &max_np);
			break;
		case O_SETTLE:
			ok = parse_int(optarg, 0, &settle_ms);
			break;
		case O_LEASE:
			ok = parse_int(optarg, 1, &lease_ms);
			break;
		case O_RETAIN:
			ok = parse_int(optarg, 0, &retain_ms);
			break;
		case O_LOGF:
			log_format = optarg;
			ok = strcmp(optarg, "text") == 0 || strcmp(optarg, "json") == 0;
			break;
		case O_HELP:
		case 'h':
			usage(stdout);
			return 0;
		case O_VER:
			printf("kolo-rendezvous %s\n", KOLO_VERSION_STRING);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
		if (!ok) {
			fprintf(stderr, "kolo-rendezvous: bad value \"%s\" for --%s\n", optarg,
			        opts[c - O_LISTEN].name);
			return 2;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "kolo-rendezvous: unexpected argument \"%s\"\n", argv[optind]);
		usage(stderr);
		return 2;
	}
	/* The log reads its format once, at the first line. */
	if (log_format)
		setenv("KOLO_LOG_FORMAT", log_format, 1);
	if (!listen_addr)
		listen_addr = kolo_param_str(KOLO_P_LISTEN);
	if (min_np < 0)
		min_np = (int)kolo_param_int(KOLO_P_MIN_NP);
	if (max_np < 0)
		max_np = (int)kolo_param_int(KOLO_P_MAX_NP);
	if (settle_ms < 0)
		settle_ms = (int)kolo_param_int(KOLO_P_SETTLE_MS);
	if (lease_ms < 0)
		lease_ms = (int)kolo_param_int(KOLO_P_LEASE_MS);
	if (retain_ms < 0)
		retain_ms = (int)kolo_param_int(KOLO_P_JOB_RETAIN_MS);
	if (min_np < 1 || max_np < 0 || settle_ms < 0 || lease_ms < 1 || retain_ms < 0 ||
	    (max_np && max_np < min_np)) {
		fprintf(stderr, "kolo-rendezvous: need min-np >= 1, max-np 0 or >= min-np, "
		                "settle-ms >= 0, lease-ms >= 1, job-retain-ms >= 0\n");
		return 2;
	}

	struct kolo_errbuf eb = {{0}};
	char *token = NULL;
	if (token_file) {
		size_t len;
		if (kolo_read_file(token_file, 4096, &token, &len) != KOLO_OK) {
			fprintf(stderr, "kolo-rendezvous: cannot read token file %s\n", token_file);
			return 1;
		}
		if (len == 0) {
			fprintf(stderr, "kolo-rendezvous: token file %s is empty\n", token_file);
			free(token);
			return 1;
		}
	} else if (kolo_token_load(&token, &eb) != KOLO_OK) {
		fprintf(stderr, "kolo-rendezvous: %s\n", eb.msg);
		return 1;
	}
	raise_nofile();

	/* Signals are taken by sigwait in this thread; the server's threads
	 * inherit the mask. */
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGTERM);
	pthread_sigmask(SIG_BLOCK, &set, NULL);
	signal(SIGPIPE, SIG_IGN);

	struct kolo_rdzv_server_config cfg = {
	        .listen = listen_addr,
	        .token = token,
	        .min_np = min_np,
	        .max_np = max_np,
	        .settle_ms = settle_ms,
	        .lease_ms = lease_ms,
	        .job_retain_ms = retain_ms,
	        .log_json = log_format && strcmp(log_format, "json") == 0,
	};
	struct kolo_rdzv_server *srv = NULL;
	if (kolo_rdzv_server_start(&cfg, &srv, &eb) != KOLO_OK) {
		fprintf(stderr, "kolo-rendezvous: %s\n", eb.msg);
		free(token);
		return 1;
	}
	char host[256];
	const char *colon = strrchr(listen_addr, ':');
	snprintf(host, sizeof(host), "%.*s", (int)(colon - listen_addr), listen_addr);
	printf("listening on %s:%d\n", host, kolo_rdzv_server_port(srv));
	fflush(stdout);

	int sig = 0;
	sigwait(&set, &sig);
	KOLO_INFO("rdzv", "signal %d: finishing requests in flight and exiting", sig);
	kolo_rdzv_server_stop(srv);
	free(token);
	return 0;
}
