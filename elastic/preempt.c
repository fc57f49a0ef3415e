/* The preemption watcher: one thread per provider, each reading its
 * provider's notice over HTTP (libcurl through a multi handle, so that
 * kolo_preempt_destroy() wakes a request at once), and a notice turned into
 * kolo_elastic_request_leave(). A provider that cannot be reached is logged
 * once and retried with back-off; nothing here is ever fatal. */
#include "preempt_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

/* ---- the process's notice, for kolo_elastic_preemption() ------------------- */

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_kind;
static char g_text[512];
static int64_t g_deadline = -1; /* the notice's deadline, CLOCK_MONOTONIC ms */

/* Records kind (1 hint, 2 notice) unless a stronger one is there; true
 * when it was recorded. */
bool pw_record(int kind, const char *text)
{
	pthread_mutex_lock(&g_lock);
	bool rec = kind > g_kind;
	if (rec) {
		g_kind = kind;
		snprintf(g_text, sizeof(g_text), "%s", text);
	}
	pthread_mutex_unlock(&g_lock);
	return rec;
}

int64_t pw_record_deadline(int64_t unix_ms)
{
	/* On the monotonic clock from here on: a step of the wall clock (NTP)
	 * after the notice does not move it. */
	int64_t now = (int64_t)kolo_now_ms();
	int64_t at = now + unix_ms - (int64_t)(kolo_wall_us() / 1000);
	pthread_mutex_lock(&g_lock);
	bool rec = g_deadline < 0 || at < g_deadline;
	if (rec)
		g_deadline = at;
	pthread_mutex_unlock(&g_lock);
	return rec ? KOLO_MAX(at - now, 0) : -1;
}

int64_t kolo_preempt_deadline_ms(void)
{
	pthread_mutex_lock(&g_lock);
	int64_t at = g_deadline;
	pthread_mutex_unlock(&g_lock);
	return at < 0 ? -1 : KOLO_MAX(at - (int64_t)kolo_now_ms(), 0);
}

int kolo_preempt_state(char *text, size_t len)
{
	pthread_mutex_lock(&g_lock);
	int k = g_kind;
	if (text && len)
		snprintf(text, len, "%s", g_text);
	pthread_mutex_unlock(&g_lock);
	return k;
}

/* ---- configuration ---------------------------------------------------------- */

kolo_status_t kolo_preempt_config_load(struct kolo_preempt_config *cfg, struct kolo_errbuf *eb)
{
	static char aws[512], gce[512], azure[512], k8s[512];
	memset(cfg, 0, sizeof(*cfg));
	KOLO_CHECK(kolo_preempt_parse_providers(kolo_param_str(KOLO_P_PREEMPTION), &cfg->providers,
	                                        &cfg->probe, eb));
	if (!cfg->providers)
		return KOLO_OK;
	int64_t poll = kolo_param_int(KOLO_P_PREEMPTION_POLL_MS);
	cfg->poll_ms = (int)(poll <= 0 ? 1000 : KOLO_MIN(poll, 3600000));
	cfg->rebalance_leave = kolo_param_bool(KOLO_P_PREEMPTION_REBALANCE_LEAVE);
	cfg->margin_ms =
	        (int)KOLO_MAX(KOLO_MIN(kolo_param_int(KOLO_P_PREEMPTION_MARGIN_MS), 3600000), 0);
	kolo_preempt_base_url(getenv("AWS_EC2_METADATA_SERVICE_ENDPOINT"), false,
	                      "http://169.254.169.254", aws, sizeof(aws));
	kolo_preempt_base_url(getenv("GCE_METADATA_HOST"), true, "http://metadata.google.internal",
	                      gce, sizeof(gce));
	kolo_preempt_base_url(kolo_param_str(KOLO_P_AZURE_METADATA_ENDPOINT), false,
	                      "http://169.254.169.254", azure, sizeof(azure));
	const char *api = kolo_param_str(KOLO_P_K8S_API);
	const char *kh = getenv("KUBERNETES_SERVICE_HOST"), *kp = getenv("KUBERNETES_SERVICE_PORT");
	if (api && *api) {
		kolo_preempt_base_url(api, false, "", k8s, sizeof(k8s));
	} else if (kh && *kh) {
		bool v6 = strchr(kh, ':') != NULL;
		snprintf(k8s, sizeof(k8s), "https://%s%s%s:%s", v6 ? "[" : "", kh, v6 ? "]" : "",
		         kp && *kp ? kp : "443");
	} else {
		k8s[0] = '\0';
	}
	cfg->aws_url = aws;
	cfg->gce_url = gce;
	cfg->azure_url = azure;
	cfg->k8s_api = k8s;
	cfg->k8s_token_file = kolo_param_str(KOLO_P_K8S_TOKEN_FILE);
	cfg->k8s_namespace = kolo_param_str(KOLO_P_K8S_NAMESPACE);
	const char *pod = kolo_param_str(KOLO_P_K8S_POD_NAME);
	cfg->k8s_pod = pod && *pod ? pod : getenv("HOSTNAME");
	return KOLO_OK;
}

/* ---- the threads ---------------------------------------------------------- */

/* After a notice with a deadline, on the thread that saw it: at the deadline
 * less the margin, unless the worker finalized first (which stops this
 * wait), the runtime takes the worker out of the job and the process exits
 * as a worker that left: the cloud would stop it mid-step anyway. */
static void await_deadline(struct watcher *w)
{
	struct kolo_preempt *p = w->p;
	int64_t left;
	while ((left = kolo_preempt_deadline_ms()) > p->cfg.margin_ms)
		if (!pw_nap(p, (int)KOLO_MIN(left - p->cfg.margin_ms, 60000)))
			return;
	char text[512];
	kolo_preempt_state(text, sizeof(text));
	if (pw_stopping(p) || !p->cfg.on_deadline || !p->cfg.on_deadline(p->cfg.arg, text, left))
		return;
	char event[sizeof(p->azure_event)];
	pthread_mutex_lock(&p->lock);
	snprintf(event, sizeof(event), "%s", p->azure_event);
	pthread_mutex_unlock(&p->lock);
	if (event[0])
		pw_azure_ack(p, event);
	KOLO_WARN(SUBSYS, "%s: exiting with status 0, %lld ms before the deadline", w->name,
	          (long long)kolo_preempt_deadline_ms());
	_exit(0);
}

static void *watch_main(void *arg)
{
	struct watcher *w = arg;
	switch (w->kind) {
	case KOLO_PREEMPT_AWS:
		pw_aws_watch(w);
		break;
	case KOLO_PREEMPT_GCE:
		pw_gce_watch(w);
		break;
	case KOLO_PREEMPT_AZURE:
		pw_azure_watch(w);
		break;
	default:
		pw_k8s_watch(w);
		break;
	}
	if (w->deadline)
		await_deadline(w);
	return NULL;
}

kolo_status_t kolo_preempt_create(const struct kolo_preempt_config *cfg, struct kolo_preempt **out,
                                  struct kolo_errbuf *eb)
{
	*out = NULL;
	if (!cfg || !cfg->providers)
		return KOLO_OK;
	KOLO_CHECK(kolo_rdzv_http_init(eb));
	struct kolo_preempt *p = calloc(1, sizeof(*p));
	if (!p)
		return kolo_fail(eb, KOLO_ENOMEM, "preempt: out of memory");
	p->cfg = *cfg;
	if (p->cfg.poll_ms <= 0)
		p->cfg.poll_ms = 1000;
#define COPY(dst, src) snprintf(dst, sizeof(dst), "%s", (src) ? (src) : "")
	COPY(p->aws_url, cfg->aws_url);
	COPY(p->gce_url, cfg->gce_url);
	COPY(p->azure_url, cfg->azure_url);
	COPY(p->k8s_api, cfg->k8s_api);
	COPY(p->k8s_token, cfg->k8s_token_file);
	COPY(p->k8s_ns, cfg->k8s_namespace);
	COPY(p->k8s_pod, cfg->k8s_pod);
#undef COPY
	p->pid = getpid();
	pthread_mutex_init(&p->lock, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&p->cond, &ca);
	pthread_condattr_destroy(&ca);
	static const struct {
		unsigned kind;
		const char *name;
	} provs[4] = {
	        {KOLO_PREEMPT_AWS, "aws"},
	        {KOLO_PREEMPT_GCE, "gce"},
	        {KOLO_PREEMPT_AZURE, "azure"},
	        {KOLO_PREEMPT_K8S, "k8s"},
	};
	char names[64] = "";
	for (int i = 0; i < 4; i++) {
		struct watcher *w = &p->w[i];
		w->p = p;
		w->kind = provs[i].kind;
		w->name = provs[i].name;
		if (!(cfg->providers & w->kind))
			continue;
		w->multi = curl_multi_init();
		w->easy = curl_easy_init();
		if (!w->multi || !w->easy || pthread_create(&w->thread, NULL, watch_main, w) != 0) {
			KOLO_WARN(SUBSYS, "%s: cannot start the preemption watcher", w->name);
			continue;
		}
		w->started = true;
		size_t n = strlen(names);
		snprintf(names + n, sizeof(names) - n, "%s%s", n ? "," : "", w->name);
	}
	KOLO_INFO(SUBSYS, "watching for preemption notices: %s%s (poll %d ms)", names,
	          cfg->probe ? " (auto: each where its endpoint answers)" : "", p->cfg.poll_ms);
	*out = p;
	return KOLO_OK;
}

void kolo_preempt_destroy(struct kolo_preempt *p, bool left)
{
	if (!p)
		return;
	if (p->pid != getpid()) {
		/* A forked child: the threads are the parent's; nothing to join. */
		free(p);
		return;
	}
	pthread_mutex_lock(&p->lock);
	p->stop = true;
	pthread_cond_broadcast(&p->cond);
	pthread_mutex_unlock(&p->lock);
	for (int i = 0; i < 4; i++)
		if (p->w[i].started)
			curl_multi_wakeup(p->w[i].multi);
	for (int i = 0; i < 4; i++) {
		struct watcher *w = &p->w[i];
		if (w->started)
			pthread_join(w->thread, NULL);
		if (w->easy)
			curl_easy_cleanup(w->easy);
		if (w->multi)
			curl_multi_cleanup(w->multi);
	}
	if (left && p->azure_event[0])
		pw_azure_ack(p, p->azure_event);
	pthread_cond_destroy(&p->cond);
	pthread_mutex_destroy(&p->lock);
	free(p);
}
