/* durable_writer: the background thread that writes durable commits, the
 * newest first come. */
#include "durable.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SUBSYS "elastic"

struct kolo_durable_writer {
	pthread_mutex_t lock;
	pthread_cond_t wake; /* a put, or stop */
	pthread_cond_t idle; /* a write (and its callback) ended, or the thread did */
	pthread_t thread;
	char *path;
	kolo_durable_written_fn fn;
	void *arg;
	void *pending; /* the payload waiting, owned */
	size_t pending_len;
	int64_t pending_commit;
	bool has_pending, busy, in_callback, stop, detached;
};

static void writer_free(struct kolo_durable_writer *w)
{
	pthread_mutex_destroy(&w->lock);
	pthread_cond_destroy(&w->wake);
	pthread_cond_destroy(&w->idle);
	free(w->pending);
	free(w->path);
	free(w);
}

static void write_one(struct kolo_durable_writer *w)
{
	void *data = w->pending;
	size_t len = w->pending_len;
	int64_t commit = w->pending_commit;
	w->pending = NULL;
	w->has_pending = false;
	w->busy = true;
	pthread_mutex_unlock(&w->lock);
	struct kolo_errbuf eb = {{0}};
	kolo_status_t st = kolo_durable_write(w->path, data, len, commit, &eb);
	free(data);
	pthread_mutex_lock(&w->lock);
	if (!w->detached && w->fn) {
		/* Once detached the runtime that gave fn may be gone. */
		w->in_callback = true;
		pthread_mutex_unlock(&w->lock);
		w->fn(w->arg, commit, len, st, eb.msg);
		pthread_mutex_lock(&w->lock);
		w->in_callback = false;
	}
	w->busy = false;
	pthread_cond_broadcast(&w->idle);
}

static void *writer_main(void *arg)
{
	struct kolo_durable_writer *w = arg;
	pthread_mutex_lock(&w->lock);
	for (;;) {
		while (!w->has_pending && !w->stop)
			pthread_cond_wait(&w->wake, &w->lock);
		if (!w->has_pending)
			break;
		write_one(w);
	}
	bool free_it = w->detached;
	pthread_cond_broadcast(&w->idle);
	pthread_mutex_unlock(&w->lock);
	if (free_it)
		writer_free(w);
	return NULL;
}

kolo_status_t kolo_durable_writer_create(const char *path, kolo_durable_written_fn fn, void *arg,
                                         struct kolo_durable_writer **out)
{
	*out = NULL;
	struct kolo_durable_writer *w = calloc(1, sizeof(*w));
	if (!w)
		return KOLO_ENOMEM;
	w->path = strdup(path);
	w->fn = fn;
	w->arg = arg;
	pthread_mutex_init(&w->lock, NULL);
	pthread_cond_init(&w->wake, NULL);
	pthread_cond_init(&w->idle, NULL);
	kolo_status_t st = !w->path                                                ? KOLO_ENOMEM
	                   : pthread_create(&w->thread, NULL, writer_main, w) != 0 ? KOLO_ESYSTEM
	                                                                           : KOLO_OK;
	if (st != KOLO_OK) {
		writer_free(w);
		return st;
	}
	*out = w;
	return KOLO_OK;
}

kolo_status_t kolo_durable_writer_put(struct kolo_durable_writer *w, const void *data, size_t len,
                                      int64_t commit)
{
	void *copy = malloc(len ? len : 1);
	if (!copy)
		return KOLO_ENOMEM;
	if (len)
		memcpy(copy, data, len);
	pthread_mutex_lock(&w->lock);
	if (w->has_pending)
		KOLO_DEBUG(SUBSYS, "durable: commit %lld replaces commit %lld, not written yet",
		           (long long)commit, (long long)w->pending_commit);
	free(w->pending);
	w->pending = copy;
	w->pending_len = len;
	w->pending_commit = commit;
	w->has_pending = true;
	pthread_cond_signal(&w->wake);
	pthread_mutex_unlock(&w->lock);
	return KOLO_OK;
}

bool kolo_durable_writer_wait(struct kolo_durable_writer *w, int wait_ms)
{
	if (!w)
		return true;
	struct timespec until;
	kolo_deadline_ts(&until, CLOCK_REALTIME, wait_ms);
	pthread_mutex_lock(&w->lock);
	int rc = 0;
	while ((w->busy || w->has_pending) && rc != ETIMEDOUT)
		rc = pthread_cond_timedwait(&w->idle, &w->lock, &until);
	bool idle = !w->busy && !w->has_pending;
	pthread_mutex_unlock(&w->lock);
	return idle;
}

bool kolo_durable_writer_destroy(struct kolo_durable_writer *w, int wait_ms)
{
	if (!w)
		return true;
	struct timespec until;
	kolo_deadline_ts(&until, CLOCK_REALTIME, wait_ms);
	pthread_mutex_lock(&w->lock);
	w->stop = true;
	pthread_cond_signal(&w->wake);
	int rc = 0;
	while ((w->busy || w->has_pending) && rc != ETIMEDOUT)
		rc = pthread_cond_timedwait(&w->idle, &w->lock, &until);
	if (w->busy || w->has_pending) {
		w->detached = true;
		while (w->in_callback)
			pthread_cond_wait(&w->idle, &w->lock);
		pthread_mutex_unlock(&w->lock);
		pthread_detach(w->thread);
		return false;
	}
	pthread_mutex_unlock(&w->lock);
	pthread_join(w->thread, NULL);
	writer_free(w);
	return true;
}
