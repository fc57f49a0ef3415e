/* handle: the kolo_handle_t of an enqueued operation. The engine and the
 * caller each hold a reference; the engine completes it, the caller waits
 * on it or drops it, and the last one out frees it. */
#include "fusion_internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

struct kolo_handle {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int refs;
	bool done;
	kolo_status_t st;
	void *owner;
	char msg[KOLO_ERRBUF_SIZE];
};

kolo_handle_t *fusion_handle_create(void *owner, int refs)
{
	kolo_handle_t *h = calloc(1, sizeof(*h));
	if (!h)
		return NULL;
	pthread_mutex_init(&h->lock, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* kolo_handle_wait_for's deadline */
	pthread_cond_init(&h->cond, &ca);
	pthread_condattr_destroy(&ca);
	h->refs = refs;
	h->owner = owner;
	return h;
}

void kolo_handle_drop(kolo_handle_t *h)
{
	if (!h)
		return;
	pthread_mutex_lock(&h->lock);
	bool last = --h->refs == 0;
	pthread_mutex_unlock(&h->lock);
	if (last) {
		pthread_mutex_destroy(&h->lock);
		pthread_cond_destroy(&h->cond);
		free(h);
	}
}

void fusion_handle_discard(kolo_handle_t *h)
{
	if (!h)
		return;
	h->refs = 1; /* nobody else has seen it */
	kolo_handle_drop(h);
}

void fusion_handle_complete(kolo_handle_t *h, kolo_status_t st, const char *msg)
{
	pthread_mutex_lock(&h->lock);
	h->done = true;
	h->st = st;
	snprintf(h->msg, sizeof(h->msg), "%s", msg ? msg : "");
	pthread_cond_broadcast(&h->cond);
	pthread_mutex_unlock(&h->lock);
	kolo_handle_drop(h);
}

kolo_status_t kolo_handle_poll_done(kolo_handle_t *h, int *done)
{
	if (!h || !done)
		return KOLO_EINVAL;
	pthread_mutex_lock(&h->lock);
	*done = h->done;
	pthread_mutex_unlock(&h->lock);
	return KOLO_OK;
}

kolo_status_t kolo_handle_wait_release(kolo_handle_t *h, struct kolo_errbuf *eb)
{
	if (!h)
		return KOLO_EINVAL;
	pthread_mutex_lock(&h->lock);
	while (!h->done)
		pthread_cond_wait(&h->cond, &h->lock);
	kolo_status_t st = h->st;
	if (st != KOLO_OK && eb)
		snprintf(eb->msg, sizeof(eb->msg), "%s", h->msg);
	pthread_mutex_unlock(&h->lock);
	kolo_handle_drop(h);
	return st;
}

kolo_status_t kolo_handle_wait_for(kolo_handle_t *h, int timeout_ms, int *done)
{
	if (!h || !done || timeout_ms < 0)
		return KOLO_EINVAL;
	struct timespec end;
	clock_gettime(CLOCK_MONOTONIC, &end);
	end.tv_sec += timeout_ms / 1000;
	end.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
	if (end.tv_nsec >= 1000000000L) {
		end.tv_sec++;
		end.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&h->lock);
	int rc = 0;
	while (!h->done && rc != ETIMEDOUT)
		rc = pthread_cond_timedwait(&h->cond, &h->lock, &end);
	*done = h->done;
	pthread_mutex_unlock(&h->lock);
	return KOLO_OK;
}

void *kolo_handle_owner(const kolo_handle_t *h)
{
	return h ? h->owner : NULL;
}
