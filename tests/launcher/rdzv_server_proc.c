/* The rendezvous server as a process of its own, for tests that must kill it
 * (SIGKILL) and start it again on the same port:
 *
 *   rdzv_server_proc LISTEN TOKEN MIN_NP MAX_NP SETTLE_MS LEASE_MS
 *
 * Prints "PORT <n>" once serving; stops on SIGTERM/SIGINT. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

#include "core.h"
#include "rendezvous.h"

int main(int argc, char **argv)
{
	if (argc != 7) {
		fprintf(stderr,
		        "usage: rdzv_server_proc LISTEN TOKEN MIN MAX SETTLE_MS LEASE_MS\n");
		return 2;
	}
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	pthread_sigmask(SIG_BLOCK, &set, NULL); /* before the server's threads exist */
	struct kolo_rdzv_server_config cfg = {
	        .listen = argv[1],
	        .token = argv[2],
	        .min_np = atoi(argv[3]),
	        .max_np = atoi(argv[4]),
	        .settle_ms = atoi(argv[5]),
	        .lease_ms = atoi(argv[6]),
	};
	struct kolo_rdzv_server *s = NULL;
	struct kolo_errbuf eb = {{0}};
	if (kolo_rdzv_server_start(&cfg, &s, &eb) != KOLO_OK) {
		fprintf(stderr, "rdzv_server_proc: %s\n", eb.msg);
		return 1;
	}
	printf("PORT %d\n", kolo_rdzv_server_port(s));
	fflush(stdout);
	int sig;
	sigwait(&set, &sig);
	kolo_rdzv_server_stop(s);
	return 0;
}
