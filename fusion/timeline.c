/* timeline: Chrome-trace JSON written by a thread fed through a bounded
 * queue, so the engine never waits on the disk. Each tensor is a "process"
 * (pid) named by a metadata event, as in Horovod's timeline. */
#include "fusion_internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct name_pid {
	char *name;
	int pid;
	struct name_pid *next;
};

#define NBUCKETS 1024

struct fusion_timeline {
	FILE *f;
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	char **q; /* ring of formatted events */
	size_t cap, head, count;
	bool stop;
	bool mark_cycles;
	bool first;
	uint64_t dropped;
	uint64_t t0_us;
	int next_pid;
	struct name_pid *buckets[NBUCKETS];
};

/* Writes queued events. Whenever the queue runs dry it also writes the
 * closing bracket and steps back over it, so the file on disk is a complete
 * JSON array even if the process dies without shutting down. */
static void *writer(void *arg)
{
	struct fusion_timeline *t = arg;
	bool dirty = false;
	pthread_mutex_lock(&t->lock);
	for (;;) {
		while (t->count == 0 && !t->stop) {
			if (dirty) {
				pthread_mutex_unlock(&t->lock);
				fputs("\n]\n", t->f);
				fflush(t->f);
				fseek(t->f, -3, SEEK_CUR);
				dirty = false;
				pthread_mutex_lock(&t->lock);
				continue;
			}
			pthread_cond_wait(&t->cond, &t->lock);
		}
		if (t->count == 0 && t->stop)
			break;
		char *ev = t->q[t->head];
		t->head = (t->head + 1) % t->cap;
		t->count--;
		bool first = t->first;
		t->first = false;
		pthread_mutex_unlock(&t->lock);
		fputs(first ? "\n" : ",\n", t->f);
		fputs(ev, t->f);
		free(ev);
		dirty = true;
		pthread_mutex_lock(&t->lock);
	}
	pthread_mutex_unlock(&t->lock);
	return NULL;
}

kolo_status_t fusion_timeline_create(const char *path, size_t queue_cap, bool mark_cycles,
                                     struct fusion_timeline **out, struct kolo_errbuf *eb)
{
	*out = NULL;
	struct fusion_timeline *t = calloc(1, sizeof(*t));
	if (!t)
		return KOLO_ENOMEM;
	t->cap = queue_cap ? queue_cap : 1;
	t->q = calloc(t->cap, sizeof(char *));
	if (!t->q) {
		free(t);
		return KOLO_ENOMEM;
	}
	t->f = fopen(path, "w");
	if (!t->f) {
		int e = errno;
		free(t->q);
		free(t);
		return kolo_fail(eb, KOLO_ESYSTEM, "timeline %s: %s", path, strerror(e));
	}
	fputs("[\n]\n", t->f); /* valid from the start; events overwrite "\n]\n" */
	fflush(t->f);
	fseek(t->f, -3, SEEK_CUR);
	t->first = true;
	t->mark_cycles = mark_cycles;
	t->t0_us = kolo_now_ns() / 1000;
	pthread_mutex_init(&t->lock, NULL);
	pthread_cond_init(&t->cond, NULL);
	if (pthread_create(&t->thread, NULL, writer, t) != 0) {
		fclose(t->f);
		pthread_mutex_destroy(&t->lock);
		pthread_cond_destroy(&t->cond);
		free(t->q);
		free(t);
		return kolo_fail(eb, KOLO_ESYSTEM, "timeline: cannot start the writer thread");
	}
	*out = t;
	return KOLO_OK;
}

void fusion_timeline_destroy(struct fusion_timeline *t)
{
	if (!t)
		return;
	pthread_mutex_lock(&t->lock);
	t->stop = true;
	pthread_cond_signal(&t->cond);
	pthread_mutex_unlock(&t->lock);
	pthread_join(t->thread, NULL);
	fputs("\n]\n", t->f);
	fclose(t->f);
	for (size_t i = 0; i < NBUCKETS; i++) {
		struct name_pid *np = t->buckets[i];
		while (np) {
			struct name_pid *next = np->next;
			free(np->name);
			free(np);
			np = next;
		}
	}
	pthread_mutex_destroy(&t->lock);
	pthread_cond_destroy(&t->cond);
	free(t->q);
	free(t);
}

uint64_t fusion_timeline_dropped(const struct fusion_timeline *t)
{
	struct fusion_timeline *m = (struct fusion_timeline *)t;
	pthread_mutex_lock(&m->lock);
	uint64_t d = m->dropped;
	pthread_mutex_unlock(&m->lock);
	return d;
}

/* Call with the lock held. Takes ownership of ev. */
static void push_locked(struct fusion_timeline *t, char *ev)
{
	if (!ev)
		return;
	if (t->count == t->cap || t->stop) {
		t->dropped++;
		free(ev);
		return;
	}
	t->q[(t->head + t->count) % t->cap] = ev;
	t->count++;
	pthread_cond_signal(&t->cond);
}

static char *fmt_event(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *fmt_event(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	char *s = NULL;
	if (vasprintf(&s, fmt, ap) < 0)
		s = NULL;
	va_end(ap);
	return s;
}

static void json_escape(char *out, size_t size, const char *in)
{
	size_t o = 0;
	for (const unsigned char *p = (const unsigned char *)in; *p && o + 7 < size; p++) {
		if (*p == '"' || *p == '\\') {
			out[o++] = '\\';
			out[o++] = (char)*p;
		} else if (*p < 0x20) {
			o += (size_t)snprintf(out + o, size - o, "\\u%04x", *p);
		} else {
			out[o++] = (char)*p;
		}
	}
	out[o] = '\0';
}

static uint64_t hash(const char *s)
{
	uint64_t h = 1469598103934665603ull;
	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 1099511628211ull;
	return h;
}

/* The pid of a tensor, announcing it with metadata events the first time.
 * Lock held. */
static int pid_of(struct fusion_timeline *t, const char *name)
{
	uint64_t b = hash(name) % NBUCKETS;
	for (struct name_pid *np = t->buckets[b]; np; np = np->next)
		if (strcmp(np->name, name) == 0)
			return np->pid;
	struct name_pid *np = calloc(1, sizeof(*np));
	if (!np || !(np->name = strdup(name))) {
		free(np);
		return 0;
	}
	np->pid = ++t->next_pid;
	np->next = t->buckets[b];
	t->buckets[b] = np;
	char esc[1024];
	json_escape(esc, sizeof(esc), name);
	push_locked(t, fmt_event("{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,"
	                         "\"args\":{\"name\":\"%s\"}}",
	                         np->pid, esc));
	push_locked(t, fmt_event("{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%d,"
	                         "\"args\":{\"sort_index\":%d}}",
	                         np->pid, np->pid));
	return np->pid;
}

static uint64_t rel(const struct fusion_timeline *t, uint64_t ts_us)
{
	return ts_us > t->t0_us ? ts_us - t->t0_us : 0;
}

void fusion_timeline_negotiate_begin(struct fusion_timeline *t, const char *name, int kind,
                                     uint64_t ts_us)
{
	pthread_mutex_lock(&t->lock);
	int pid = pid_of(t, name);
	push_locked(t, fmt_event("{\"name\":\"NEGOTIATE_%s\",\"ph\":\"B\",\"ts\":%llu,"
	                         "\"pid\":%d,\"tid\":0}",
	                         fusion_kind_name(kind), (unsigned long long)rel(t, ts_us), pid));
	pthread_mutex_unlock(&t->lock);
}

void fusion_timeline_rank_ready(struct fusion_timeline *t, const char *name, int rank,
                                uint64_t ts_us)
{
	pthread_mutex_lock(&t->lock);
	int pid = pid_of(t, name);
	push_locked(t, fmt_event("{\"name\":\"%d\",\"ph\":\"i\",\"s\":\"t\",\"ts\":%llu,"
	                         "\"pid\":%d,\"tid\":0,\"args\":{\"rank\":%d}}",
	                         rank, (unsigned long long)rel(t, ts_us), pid, rank));
	pthread_mutex_unlock(&t->lock);
}

void fusion_timeline_negotiate_end(struct fusion_timeline *t, const char *name, uint64_t ts_us)
{
	fusion_timeline_end(t, name, ts_us);
}

void fusion_timeline_begin(struct fusion_timeline *t, const char *name, const char *activity,
                           uint64_t ts_us)
{
	pthread_mutex_lock(&t->lock);
	int pid = pid_of(t, name);
	push_locked(t, fmt_event("{\"name\":\"%s\",\"ph\":\"B\",\"ts\":%llu,\"pid\":%d,\"tid\":0}",
	                         activity, (unsigned long long)rel(t, ts_us), pid));
	pthread_mutex_unlock(&t->lock);
}

void fusion_timeline_end(struct fusion_timeline *t, const char *name, uint64_t ts_us)
{
	pthread_mutex_lock(&t->lock);
	int pid = pid_of(t, name);
	push_locked(t, fmt_event("{\"ph\":\"E\",\"ts\":%llu,\"pid\":%d,\"tid\":0}",
	                         (unsigned long long)rel(t, ts_us), pid));
	pthread_mutex_unlock(&t->lock);
}

void fusion_timeline_mark_cycle(struct fusion_timeline *t, uint64_t ts_us)
{
	if (!t->mark_cycles)
		return;
	pthread_mutex_lock(&t->lock);
	push_locked(t, fmt_event("{\"name\":\"CYCLE_START\",\"ph\":\"i\",\"s\":\"g\",\"ts\":%llu,"
	                         "\"pid\":0,\"tid\":0}",
	                         (unsigned long long)rel(t, ts_us)));
	pthread_mutex_unlock(&t->lock);
}
