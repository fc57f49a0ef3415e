/* durable: a comm's durable commits (docs/durable.md): rank 0's writer,
 * the record of each write in the rendezvous KV, and the read that resumes
 * a job which lost every worker. The file itself is elastic/durable.c's. */
#include "durable.h"
#include "runtime.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SUBSYS      "elastic"
#define DURABLE_KEY "durable/commit"
/* kolo_finalize waits this long for a write in progress. */
#define DURABLE_STOP_WAIT_MS 60000

static const char *durable_dir(void)
{
	const char *d = kolo_param_str(KOLO_P_DURABLE_DIR);
	return d && d[0] ? d : NULL;
}

bool kolo_runtime_durable_due(const struct kolo_comm *comm, int64_t commit)
{
	int64_t every = kolo_param_int(KOLO_P_DURABLE_EVERY);
	if (every < 1)
		every = 1;
	return durable_dir() && comm->assignment.rank == 0 && commit > 0 && commit % every == 0;
}

/* On the writer's thread: the comm outlives it (kolo_runtime_durable_stop). */
static void on_written(void *arg, int64_t commit, size_t len, kolo_status_t st, const char *err)
{
	struct kolo_comm *comm = arg;
	if (st != KOLO_OK) {
		KOLO_WARN(SUBSYS, "%s: commit %" PRId64 " is not durable; training goes on", err,
		          commit);
		return;
	}
	KOLO_DEBUG(SUBSYS, "durable commit %" PRId64 " written (%zu bytes)", commit, len);
	if (!comm->rdzv)
		return;
	char rec[128];
	int n = snprintf(rec, sizeof(rec), "{\"commit\":%" PRId64 ",\"bytes\":%zu,\"time\":%lld}",
	                 commit, len, (long long)time(NULL));
	if (kolo_rdzv_kv_put(comm->rdzv, DURABLE_KEY, rec, (size_t)n) != KOLO_OK)
		KOLO_WARN(SUBSYS, "durable commit %" PRId64 " written, not recorded: %s", commit,
		          kolo_rdzv_client_error(comm->rdzv));
}

kolo_status_t kolo_runtime_durable_put(struct kolo_comm *comm, const void *data, size_t len,
                                       int64_t commit)
{
	const char *dir = durable_dir();
	if (!dir || comm->assignment.rank != 0)
		return KOLO_OK;
	if (!comm->durable) {
		char path[4096];
		kolo_durable_path(path, sizeof(path), dir, comm->job);
		struct kolo_durable_writer *w;
		kolo_status_t st = kolo_durable_writer_create(path, on_written, comm, &w);
		if (st != KOLO_OK) {
			KOLO_WARN(SUBSYS, "durable commits: cannot start the writer: %s",
			          kolo_strerror(st));
			return st;
		}
		pthread_mutex_lock(&comm->deadline_lock); /* a notice's deadline reads it */
		comm->durable = w;
		pthread_mutex_unlock(&comm->deadline_lock);
	}
	return kolo_durable_writer_put(comm->durable, data, len, commit);
}

/* The commit the rendezvous records as written, or -1. */
static int64_t recorded_commit(struct kolo_comm *comm)
{
	void *data = NULL;
	size_t len = 0;
	if (!comm->rdzv || kolo_rdzv_kv_get(comm->rdzv, DURABLE_KEY, 0, &data, &len) != KOLO_OK)
		return -1;
	char buf[128];
	snprintf(buf, sizeof(buf), "%.*s", (int)KOLO_MIN(len, sizeof(buf) - 1), (char *)data);
	free(data);
	const char *c = strstr(buf, "\"commit\":");
	return c ? strtoll(c + 9, NULL, 10) : -1;
}

kolo_status_t kolo_runtime_durable_resume(struct kolo_comm *comm, void **data, size_t *len,
                                          int64_t *commit)
{
	const char *dir = durable_dir();
	if (!dir || comm->assignment.rank != 0)
		return KOLO_ENOTFOUND;
	char path[4096];
	kolo_durable_path(path, sizeof(path), dir, comm->job);
	struct kolo_errbuf eb = {{0}};
	kolo_status_t st = kolo_durable_read(path, data, len, commit, &eb);
	int64_t recorded = recorded_commit(comm);
	if (st == KOLO_ENOTFOUND) {
		if (recorded > 0)
			KOLO_WARN(SUBSYS,
			          "the rendezvous records durable commit %" PRId64
			          " of job %s, but "
			          "%s does not exist here: starting without it (KOLO_DURABLE_DIR "
			          "must "
			          "be a volume that every worker reaches)",
			          recorded, comm->job, path);
		return KOLO_ENOTFOUND;
	}
	if (st != KOLO_OK)
		return kolo_comm_fail(comm, st, "%s; delete it to start the job over", eb.msg);
	if (recorded > *commit)
		KOLO_WARN(SUBSYS,
		          "%s holds commit %" PRId64 ", older than the commit %" PRId64
		          " the rendezvous records (KOLO_DURABLE_DIR must be a volume that every "
		          "worker reaches)",
		          path, *commit, recorded);
	KOLO_INFO(SUBSYS, "resuming from durable commit %" PRId64 " (%s, %zu bytes)", *commit, path,
	          *len);
	return KOLO_OK;
}

void kolo_runtime_durable_stop(struct kolo_comm *comm)
{
	if (!comm->durable)
		return;
	if (!kolo_durable_writer_destroy(comm->durable, DURABLE_STOP_WAIT_MS))
		KOLO_WARN(SUBSYS,
		          "a durable commit was still being written after %d s; left to finish "
		          "without its rendezvous record",
		          DURABLE_STOP_WAIT_MS / 1000);
	comm->durable = NULL;
}
