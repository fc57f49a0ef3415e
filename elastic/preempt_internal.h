/* preempt_internal: what the preemption watcher's files share
 * (preempt.c: the process's notice, the configuration and the threads;
 * preempt_http.c: requests, back-off and what a notice does;
 * preempt_providers.c: one watch loop per provider). */
#ifndef KOLO_ELASTIC_PREEMPT_INTERNAL_H
#define KOLO_ELASTIC_PREEMPT_INTERNAL_H

#include "membership.h"
#include "preempt.h"
#include "rendezvous.h"

#include <curl/curl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define SUBSYS "preempt"

#define BODY_MAX         (1u << 20)
#define BACKOFF_FIRST_MS 1000
#define BACKOFF_MAX_MS   30000
#define PROBE_TIMEOUT_MS 1000
#define AWS_TOKEN_TTL_S  21600
#define GCE_WAIT_S       300

struct watcher {
	struct kolo_preempt *p;
	unsigned kind;
	const char *name;
	pthread_t thread;
	bool started;
	CURLM *multi;
	CURL *easy;
	bool logged;    /* "cannot reach" said since the last success */
	bool reached;   /* one request succeeded */
	int backoff_ms; /* next back-off */
	bool deadline;  /* this thread recorded a notice's deadline: it waits for it */
};

struct kolo_preempt {
	struct kolo_preempt_config cfg;
	char aws_url[512], gce_url[512], azure_url[512], k8s_api[512], k8s_token[1024];
	char k8s_ns[256], k8s_pod[256];
	pid_t pid;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool stop;
	struct watcher w[4];
	char azure_event[256]; /* a Preempt event seen, to acknowledge after the leave */
};

struct resp {
	char *body;
	size_t len, cap;
	bool too_big;
	char etag[128];
	bool flavor_google;
	long code;
};

/* Records kind (1 hint, 2 notice) unless a stronger one is there; true
 * when it was recorded (preempt.c). */
bool pw_record(int kind, const char *text);
/* Records a notice's deadline (ms since 1970) unless an earlier one is
 * there; the ms left until it (0 when past), or -1 when not recorded. */
int64_t pw_record_deadline(int64_t unix_ms);

/* ---- preempt_http.c ---- */
void pw_resp_fini(struct resp *r);
/* A handle's URL, timeouts (no proxy), headers, and r for the body. */
void pw_set_common(CURL *h, const char *url, long timeout_ms, struct curl_slist *hdrs,
                   struct resp *r);
/* GET, or method with body. */
void pw_set_method(CURL *h, const char *method, const char *body);
/* Whether kolo_preempt_destroy() asked the threads to stop. */
bool pw_stopping(struct kolo_preempt *p);
/* Waits ms unless told to stop; false when stopping. */
bool pw_nap(struct kolo_preempt *p, int ms);
/* One request on the watcher's handle; cancelled at once by destroy.
 * headers: NULL-terminated. Returns the curl result (r->code: HTTP). */
CURLcode pw_request(struct watcher *w, const char *method, const char *url,
                    const char *const *headers, const char *cainfo, long timeout_ms,
                    struct resp *r);
/* A request that failed: logged once, then the back-off; false when the
 * thread should end (stopping, or a provider that never answered in auto
 * mode). */
bool pw_failed(struct watcher *w, const char *url, const char *why);
bool pw_failed_http(struct watcher *w, const char *url, CURLcode cc, const struct resp *r);
void pw_succeeded(struct watcher *w);
/* A preemption notice: recorded, logged once, and the worker leaves at its
 * next commit point. deadline: when the machine goes (ms since 1970; -1 not
 * given), recorded for this thread to wait for; a deadline learnt after the
 * notice (a pod deleted later) is given by calling it again. */
void pw_notice(struct watcher *w, const char *what, int64_t deadline);
/* An early hint (AWS's rebalance recommendation): recorded and logged. */
void pw_hint(struct watcher *w, const char *what);
/* Cuts trailing newlines and spaces. */
void pw_trim(char *s);

/* ---- preempt_providers.c: each runs until stopped or told to leave ---- */
void pw_aws_watch(struct watcher *w);
void pw_gce_watch(struct watcher *w);
void pw_azure_watch(struct watcher *w);
/* Acknowledges Azure event id (StartRequests), after the leave. */
void pw_azure_ack(struct kolo_preempt *p, const char *id);
void pw_k8s_watch(struct watcher *w);

#endif /* KOLO_ELASTIC_PREEMPT_INTERNAL_H */
