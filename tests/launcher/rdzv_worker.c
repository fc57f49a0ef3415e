/* A rendezvous client process for the launcher tests. Reads KOLO_RENDEZVOUS,
 * KOLO_JOB, KOLO_TOKEN and KOLO_HOSTNAME, joins and prints what it learns,
 * one line per fact, to stdout:
 *
 *   JOINED <worker_id>
 *   ASSIGN <round> <rank> <size> <local_rank> <local_size> <cross_rank>
 *          <cross_size> <worker_id> <host> <rank:worker_id:host>...
 *   EVICTED | KV ok | HB ok | DONE | ERROR <status> <message>
 *
 * Options:
 *   --no-heartbeat   never heartbeat (to be evicted)
 *   --rounds N       after the first round, wait for N-1 newer ones
 *   --then-wait      after the rounds, read a line from stdin, then try to
 *                    wait for a newer round (prints EVICTED when evicted)
 *   --kv             after the rounds, read a line from stdin, then put
 *                    "t/<round>/<rank>" and read every peer's key
 *   --hold           before leaving, read a line from stdin (so that nobody
 *                    leaves a round before every member has learnt it)
 *   --timeout MS     each wait (default 30000) */
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core.h"
#include "rendezvous.h"

static int timeout_ms = 30000;

static void print_assignment(const struct kolo_rdzv_client *c, const struct kolo_rdzv_assignment *a)
{
	printf("ASSIGN %" PRId64 " %d %d %d %d %d %d %s %s", a->round, a->rank, a->size,
	       a->local_rank, a->local_size, a->cross_rank, a->cross_size, kolo_rdzv_worker_id(c),
	       a->members[a->rank].host);
	for (int i = 0; i < a->n_members; i++)
		printf(" %d:%s:%s", a->members[i].rank, a->members[i].worker_id,
		       a->members[i].host);
	printf("\n");
}

static int fail(struct kolo_rdzv_client *c, kolo_status_t st, const char *what)
{
	printf("ERROR %s %s: %s\n", kolo_status_name(st), what, c ? kolo_rdzv_client_error(c) : "");
	return 1;
}

/* Blocks until the driver writes a line on stdin (bounded). */
static bool wait_stdin(void)
{
	struct pollfd p = {.fd = STDIN_FILENO, .events = POLLIN};
	if (poll(&p, 1, timeout_ms) != 1)
		return false;
	char buf[64];
	return read(STDIN_FILENO, buf, sizeof(buf)) > 0;
}

int main(int argc, char **argv)
{
	bool heartbeat = true, then_wait = false, kv = false, hold = false;
	int rounds = 1;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--no-heartbeat") == 0)
			heartbeat = false;
		else if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc)
			rounds = atoi(argv[++i]);
		else if (strcmp(argv[i], "--then-wait") == 0)
			then_wait = true;
		else if (strcmp(argv[i], "--kv") == 0)
			kv = true;
		else if (strcmp(argv[i], "--hold") == 0)
			hold = true;
		else if (strcmp(argv[i], "--timeout") == 0 && i + 1 < argc)
			timeout_ms = atoi(argv[++i]);
		else {
			fprintf(stderr, "rdzv_worker: unknown option %s\n", argv[i]);
			return 2;
		}
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	char host[KOLO_RDZV_HOST_MAX];
	char *token = NULL;
	struct kolo_errbuf eb = {{0}};
	if (kolo_hostname(host, sizeof(host)) != KOLO_OK || kolo_token_load(&token, &eb) != KOLO_OK)
		return fail(NULL, KOLO_EINVAL, "environment");
	struct kolo_rdzv_client_config cfg = {
	        .url = kolo_param_str(KOLO_P_RENDEZVOUS),
	        .job = kolo_param_str(KOLO_P_JOB),
	        .token = token,
	        .host = host,
	        .deadline_ms = (int)kolo_param_int(KOLO_P_RDZV_DEADLINE_MS),
	};
	struct kolo_rdzv_client *c = NULL;
	struct kolo_rdzv_assignment a = {0};
	kolo_status_t st = kolo_rdzv_client_create(&cfg, &c, &eb);
	int rc = 1;
	if (st != KOLO_OK) {
		printf("ERROR %s create: %s\n", kolo_status_name(st), eb.msg);
		goto out;
	}
	if ((st = kolo_rdzv_join(c)) != KOLO_OK) {
		rc = fail(c, st, "join");
		goto out;
	}
	printf("JOINED %s\n", kolo_rdzv_worker_id(c));
	if (heartbeat && (st = kolo_rdzv_heartbeat_start(c, 0)) != KOLO_OK) {
		rc = fail(c, st, "heartbeat");
		goto out;
	}
	int64_t round = 0;
	for (int r = 0; r < rounds; r++) {
		if ((st = kolo_rdzv_wait_assignment(c, round, timeout_ms, &a)) != KOLO_OK) {
			rc = st == KOLO_EMEMBERSHIP ? (printf("EVICTED\n"), 3)
			                            : fail(c, st, "wait");
			goto out;
		}
		print_assignment(c, &a);
		round = a.round;
	}
	if (then_wait) {
		if (!wait_stdin()) {
			rc = fail(c, KOLO_ETIMEDOUT, "stdin");
			goto out;
		}
		struct kolo_rdzv_assignment b = {0};
		st = kolo_rdzv_wait_assignment(c, round, timeout_ms, &b);
		kolo_rdzv_assignment_fini(&b);
		if (st == KOLO_EMEMBERSHIP) {
			printf("EVICTED\n");
			rc = 3;
			goto out;
		}
		rc = fail(c, st, "expected eviction");
		goto out;
	}
	if (kv) {
		if (!wait_stdin()) {
			rc = fail(c, KOLO_ETIMEDOUT, "stdin");
			goto out;
		}
		char key[64], val[64];
		snprintf(key, sizeof(key), "t/%" PRId64 "/%d", a.round, a.rank);
		snprintf(val, sizeof(val), "value of rank %d", a.rank);
		if ((st = kolo_rdzv_kv_put(c, key, val, strlen(val))) != KOLO_OK) {
			rc = fail(c, st, "kv put");
			goto out;
		}
		for (int p = 0; p < a.size; p++) {
			void *data;
			size_t len;
			snprintf(key, sizeof(key), "t/%" PRId64 "/%d", a.round, p);
			snprintf(val, sizeof(val), "value of rank %d", p);
			if ((st = kolo_rdzv_kv_get(c, key, timeout_ms, &data, &len)) != KOLO_OK) {
				rc = fail(c, st, "kv get");
				goto out;
			}
			bool same = len == strlen(val) && memcmp(data, val, len) == 0;
			free(data);
			if (!same) {
				rc = fail(c, KOLO_EPROTO, "kv value differs");
				goto out;
			}
		}
		printf("KV ok\n");
		/* The heartbeat must have re-registered us, not found us evicted:
		 * wait (bounded) for a heartbeat after this point to succeed. */
		struct kolo_rdzv_hb_state hs;
		kolo_rdzv_heartbeat_state(c, &hs);
		uint64_t end = kolo_now_ms() + (uint64_t)timeout_ms;
		while (!hs.evicted && (hs.last != KOLO_OK || hs.round != a.round) &&
		       kolo_now_ms() < end) {
			kolo_sleep_ms(20);
			kolo_rdzv_heartbeat_state(c, &hs);
		}
		if (hs.evicted || hs.last != KOLO_OK || hs.round != a.round) {
			printf("ERROR heartbeat evicted=%d last=%s round=%" PRId64 "\n", hs.evicted,
			       kolo_status_name(hs.last), hs.round);
			goto out;
		}
		printf("HB ok\n");
	}
	if (hold && !wait_stdin()) {
		rc = fail(c, KOLO_ETIMEDOUT, "stdin");
		goto out;
	}
	if ((st = kolo_rdzv_leave(c)) != KOLO_OK) {
		rc = fail(c, st, "leave");
		goto out;
	}
	printf("DONE\n");
	rc = 0;
out:
	kolo_rdzv_assignment_fini(&a);
	kolo_rdzv_client_destroy(c);
	free(token);
	return rc;
}
