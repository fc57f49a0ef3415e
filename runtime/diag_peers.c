/* diag_peers: what the diagnosis reporter sees of the other ranks on its
 * host, so that kolo-rendezvous can tell a stopped rank from a hung or an
 * unreachable one (docs/diagnosis.md). Each worker's reporter publishes
 * "diag/proc/<round>/<rank>" = "<pid> <start time>" once per round; a report
 * then lists, for every other rank of its host it has read that key of, the
 * state of that process in /proc: running, stopped (T, t) or gone (no such
 * process, a zombie, or another process that reused the pid). A stopped
 * process cannot say so itself; its neighbour can. */
#include "runtime.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PEERS_MAX 64 /* ranks of one host looked at */

static struct {
	pthread_mutex_t lock;
	int64_t round; /* the identity's, under lock */
	int rank, n;
	int ranks[PEERS_MAX]; /* the other ranks of this host */
	/* the reporter thread's own */
	int64_t published, tried, cached;
	pid_t pid[PEERS_MAX];
	unsigned long long start[PEERS_MAX];
} P = {.lock = PTHREAD_MUTEX_INITIALIZER, .published = -1, .tried = -1, .cached = -1};

void kolo_runtime_diag_peers_set(const struct kolo_comm *comm)
{
	const struct kolo_rdzv_assignment *a = &comm->assignment;
	pthread_mutex_lock(&P.lock);
	P.round = a->round;
	P.rank = a->rank;
	P.n = 0;
	for (int r = 0; r < a->n_members && P.n < PEERS_MAX; r++)
		if (r != a->rank && strcmp(a->members[r].host, comm->host) == 0)
			P.ranks[P.n++] = r;
	pthread_mutex_unlock(&P.lock);
}

/* The state letter and start time (clock ticks since boot) of pid. */
static bool proc_stat(pid_t pid, char *state, unsigned long long *start)
{
	char path[64], buf[1024];
	snprintf(path, sizeof(path), "/proc/%ld/stat", (long)pid);
	FILE *f = fopen(path, "r");
	if (!f)
		return false;
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	/* "pid (comm) S ppid ...": comm may hold spaces and parentheses; the
	 * start time is field 22, the 19th after the state. */
	char *p = strrchr(buf, ')');
	if (!p || p[1] != ' ' || !p[2])
		return false;
	*state = p[2];
	p += 2;
	for (int i = 0; i < 19 && p; i++) {
		p = strchr(p, ' ');
		if (p)
			p++;
	}
	if (!p)
		return false;
	*start = strtoull(p, NULL, 10);
	return true;
}

static void publish(struct kolo_rdzv_client *c, int64_t round, int rank)
{
	char state, key[64], val[64];
	unsigned long long start;
	if (!proc_stat(getpid(), &state, &start))
		return;
	snprintf(key, sizeof(key), "diag/proc/%" PRId64 "/%d", round, rank);
	int n = snprintf(val, sizeof(val), "%ld %llu", (long)getpid(), start);
	if (kolo_rdzv_kv_put(c, key, val, (size_t)n) == KOLO_OK)
		P.published = round;
}

bool kolo_runtime_diag_peers_publish(struct kolo_rdzv_client *c)
{
	pthread_mutex_lock(&P.lock);
	int64_t round = P.round;
	int rank = P.rank;
	pthread_mutex_unlock(&P.lock);
	if (!c || round <= 0)
		return false; /* the identity comes in a moment */
	if (P.published != round) {
		publish(c, round, rank); /* retried on each call until it worked */
		P.tried = round;
	}
	return P.tried == round;
}

static const char *state_word(pid_t pid, unsigned long long start)
{
	char st;
	unsigned long long now_start;
	if (!proc_stat(pid, &st, &now_start) || now_start != start || st == 'Z' || st == 'X')
		return "gone";
	return st == 'T' || st == 't' ? "stopped" : "running";
}

char *kolo_runtime_diag_peers_json(struct kolo_rdzv_client *c)
{
	int ranks[PEERS_MAX], n;
	pthread_mutex_lock(&P.lock);
	int64_t round = P.round;
	n = P.n;
	memcpy(ranks, P.ranks, (size_t)n * sizeof(int));
	pthread_mutex_unlock(&P.lock);
	if (!c || n == 0)
		return NULL;
	if (P.cached != round) {
		memset(P.pid, 0, sizeof(P.pid));
		P.cached = round;
	}
	size_t cap = 16 + (size_t)n * 48, len = 0;
	char *out = malloc(cap);
	if (!out)
		return NULL;
	len += (size_t)snprintf(out, cap, "[");
	for (int i = 0; i < n; i++) {
		if (!P.pid[i]) { /* not read yet this round */
			char key[64];
			void *data = NULL;
			size_t dl = 0;
			snprintf(key, sizeof(key), "diag/proc/%" PRId64 "/%d", round, ranks[i]);
			if (kolo_rdzv_kv_get(c, key, 0, &data, &dl) == KOLO_OK && dl < 64) {
				char v[64];
				long pid = 0;
				memcpy(v, data, dl);
				v[dl] = '\0';
				if (sscanf(v, "%ld %llu", &pid, &P.start[i]) == 2 && pid > 0)
					P.pid[i] = (pid_t)pid;
			}
			free(data);
		}
		if (P.pid[i])
			len += (size_t)snprintf(
			        out + len, cap - len, "%s{\"rank\":%d,\"state\":\"%s\"}",
			        len > 1 ? "," : "", ranks[i], state_word(P.pid[i], P.start[i]));
	}
	snprintf(out + len, cap - len, "]");
	return out;
}
