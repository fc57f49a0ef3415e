/* The preemption watcher: one thread per provider, each reading its
 * provider's notice over HTTP (libcurl through a multi handle, so that
 * kolo_preempt_destroy() wakes a request at once), and a notice turned into
 * kolo_elastic_request_leave(). A provider that cannot be reached is logged
 * once and retried with back-off; nothing here is ever fatal. */
#include "membership.h"
#include "preempt.h"
#include "rendezvous.h"

#include <curl/curl.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#define SUBSYS "preempt"

#define BODY_MAX         (1u << 20)
#define BACKOFF_FIRST_MS 1000
#define BACKOFF_MAX_MS   30000
#define PROBE_TIMEOUT_MS 1000
#define AWS_TOKEN_TTL_S  21600
#define GCE_WAIT_S       300

/* ---- the process's notice, for kolo_elastic_preemption() ------------------- */

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_kind;
static char g_text[512];

/* Records kind (1 hint, 2 notice) unless a stronger one is there; true
 * when it was recorded. */
static bool record(int kind, const char *text)
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

/* ---- the watcher ------------------------------------------------------------ */

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

static void resp_fini(struct resp *r)
{
	free(r->body);
	memset(r, 0, sizeof(*r));
}

static size_t on_body(char *ptr, size_t size, size_t nmemb, void *ud)
{
	struct resp *r = ud;
	size_t n = size * nmemb;
	if (r->len + n + 1 > BODY_MAX) {
		r->too_big = true;
		return 0;
	}
	if (r->len + n + 1 > r->cap) {
		size_t cap = KOLO_MAX(r->cap * 2, r->len + n + 1);
		char *b = realloc(r->body, KOLO_MAX(cap, (size_t)256));
		if (!b)
			return 0;
		r->body = b;
		r->cap = KOLO_MAX(cap, (size_t)256);
	}
	memcpy(r->body + r->len, ptr, n);
	r->len += n;
	r->body[r->len] = '\0';
	return n;
}

/* Header "Name: value" (case-insensitive name) into out, trimmed. */
static bool header_value(const char *line, size_t n, const char *name, char *out, size_t size)
{
	size_t k = strlen(name);
	if (n <= k || strncasecmp(line, name, k) != 0 || line[k] != ':')
		return false;
	const char *v = line + k + 1;
	size_t m = n - k - 1;
	while (m && (*v == ' ' || *v == '\t'))
		v++, m--;
	while (m && (v[m - 1] == '\r' || v[m - 1] == '\n' || v[m - 1] == ' '))
		m--;
	snprintf(out, size, "%.*s", (int)KOLO_MIN(m, size - 1), v);
	return true;
}

static size_t on_header(char *ptr, size_t size, size_t nmemb, void *ud)
{
	struct resp *r = ud;
	size_t n = size * nmemb;
	char flavor[32];
	header_value(ptr, n, "ETag", r->etag, sizeof(r->etag));
	if (header_value(ptr, n, "Metadata-Flavor", flavor, sizeof(flavor)))
		r->flavor_google = strcmp(flavor, "Google") == 0;
	return n;
}

static bool stopping(struct kolo_preempt *p)
{
	pthread_mutex_lock(&p->lock);
	bool s = p->stop;
	pthread_mutex_unlock(&p->lock);
	return s;
}

/* Waits ms unless told to stop; false when stopping. */
static bool nap(struct kolo_preempt *p, int ms)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	ts.tv_sec += ms / 1000;
	ts.tv_nsec += (long)(ms % 1000) * 1000000L;
	if (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&p->lock);
	while (!p->stop && pthread_cond_timedwait(&p->cond, &p->lock, &ts) != ETIMEDOUT)
		;
	bool go = !p->stop;
	pthread_mutex_unlock(&p->lock);
	return go;
}

static void set_common(CURL *h, const char *url, long timeout_ms, struct curl_slist *hdrs,
                       struct resp *r)
{
	curl_easy_setopt(h, CURLOPT_URL, url);
	curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, timeout_ms);
	curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, KOLO_MIN(timeout_ms, 2000L));
	/* Link-local and in-cluster endpoints: never through a proxy. */
	curl_easy_setopt(h, CURLOPT_NOPROXY, "*");
	curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
	curl_easy_setopt(h, CURLOPT_WRITEDATA, r);
	curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
	curl_easy_setopt(h, CURLOPT_HEADERDATA, r);
	curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
	curl_easy_setopt(h, CURLOPT_DNS_CACHE_TIMEOUT, 0L);
}

static void set_method(CURL *h, const char *method, const char *body)
{
	if (strcmp(method, "GET") == 0) {
		curl_easy_setopt(h, CURLOPT_HTTPGET, 1L);
		return;
	}
	curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
	curl_easy_setopt(h, CURLOPT_POSTFIELDS, body ? body : "");
	curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, (long)(body ? strlen(body) : 0));
}

/* One request on the watcher's handle; cancelled at once by destroy.
 * headers: NULL-terminated. Returns the curl result (r->code: HTTP). */
static CURLcode request(struct watcher *w, const char *method, const char *url,
                        const char *const *headers, const char *cainfo, long timeout_ms,
                        struct resp *r)
{
	resp_fini(r);
	struct curl_slist *hdrs = curl_slist_append(NULL, "Expect:");
	for (size_t i = 0; headers && headers[i]; i++)
		hdrs = curl_slist_append(hdrs, headers[i]);
	CURL *h = w->easy;
	curl_easy_reset(h);
	set_common(h, url, timeout_ms, hdrs, r);
	set_method(h, method, NULL);
	if (cainfo)
		curl_easy_setopt(h, CURLOPT_CAINFO, cainfo);
	CURLcode cc = CURLE_OK;
	if (curl_multi_add_handle(w->multi, h) != CURLM_OK) {
		curl_slist_free_all(hdrs);
		return CURLE_FAILED_INIT;
	}
	for (int running = 1;;) {
		if (curl_multi_perform(w->multi, &running) != CURLM_OK) {
			cc = CURLE_FAILED_INIT;
			break;
		}
		if (!running) {
			int q;
			CURLMsg *m;
			while ((m = curl_multi_info_read(w->multi, &q)))
				if (m->msg == CURLMSG_DONE)
					cc = m->data.result;
			break;
		}
		if (stopping(w->p)) {
			cc = CURLE_ABORTED_BY_CALLBACK;
			break;
		}
		curl_multi_poll(w->multi, NULL, 0, 1000, NULL);
	}
	curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r->code);
	curl_multi_remove_handle(w->multi, h);
	curl_slist_free_all(hdrs);
	return cc;
}

/* A request that failed (why). In auto mode, a provider that never answered
 * is not there: false, the thread ends. Otherwise logs once and waits the
 * back-off; false when stopping. */
static bool failed(struct watcher *w, const char *url, const char *why)
{
	struct kolo_preempt *p = w->p;
	if (stopping(p))
		return false; /* a request cut short by kolo_preempt_destroy() */
	if (p->cfg.probe && !w->reached) {
		KOLO_DEBUG(SUBSYS,
		           "%s: no answer from %s (%s): not watching it (KOLO_PREEMPTION=auto)",
		           w->name, url, why);
		return false;
	}
	if (!w->logged)
		KOLO_WARN(SUBSYS, "%s: cannot read %s (%s); retrying with back-off", w->name, url,
		          why);
	w->logged = true;
	int ms = w->backoff_ms ? w->backoff_ms : BACKOFF_FIRST_MS;
	w->backoff_ms = KOLO_MIN(ms * 2, BACKOFF_MAX_MS);
	return nap(p, ms);
}

static bool failed_http(struct watcher *w, const char *url, CURLcode cc, const struct resp *r)
{
	char why[160];
	if (cc != CURLE_OK)
		snprintf(why, sizeof(why), "%s", curl_easy_strerror(cc));
	else
		snprintf(why, sizeof(why), "HTTP %ld", r->code);
	return failed(w, url, why);
}

static void succeeded(struct watcher *w)
{
	if (w->logged)
		KOLO_INFO(SUBSYS, "%s: the endpoint answers again", w->name);
	w->logged = false;
	w->reached = true;
	w->backoff_ms = 0;
}

static void notice(struct watcher *w, const char *what)
{
	char text[512];
	snprintf(text, sizeof(text), "%.8s: %.480s", w->name, what);
	if (record(2, text))
		KOLO_WARN(SUBSYS,
		          "%s: preemption notice: %s: leaving the job at the next commit point",
		          w->name, what);
	kolo_elastic_request_leave();
}

static void hint(struct watcher *w, const char *what)
{
	char text[512];
	snprintf(text, sizeof(text), "%.8s: %.480s", w->name, what);
	if (record(1, text))
		KOLO_WARN(SUBSYS, "%s: early hint of a preemption: %s (the worker stays)", w->name,
		          what);
}

static void trim(char *s)
{
	size_t n = strlen(s);
	while (n && (s[n - 1] == '\n' || s[n - 1] == '\r' || s[n - 1] == ' '))
		s[--n] = '\0';
}

/* ---- AWS IMDSv2 ---- */

static void aws_watch(struct watcher *w)
{
	struct kolo_preempt *p = w->p;
	char url[768], token[1024] = "", hdr[1100];
	uint64_t token_at = 0;
	bool rebalance_seen = false;
	struct resp r = {0};
	while (!stopping(p)) {
		long timeout = w->reached || !p->cfg.probe ? 5000 : PROBE_TIMEOUT_MS;
		bool fresh = false;
		if (!token[0] ||
		    kolo_now_ms() - token_at > (uint64_t)(AWS_TOKEN_TTL_S - 300) * 1000) {
			snprintf(url, sizeof(url), "%s/latest/api/token", p->aws_url);
			const char *h[] = {"X-aws-ec2-metadata-token-ttl-seconds: 21600", NULL};
			CURLcode cc = request(w, "PUT", url, h, NULL, timeout, &r);
			if (cc != CURLE_OK || r.code != 200 || !r.len || r.len >= sizeof(token)) {
				if (!failed_http(w, url, cc, &r))
					break;
				continue;
			}
			snprintf(token, sizeof(token), "%s", r.body);
			trim(token);
			token_at = kolo_now_ms();
			fresh = true;
		}
		snprintf(hdr, sizeof(hdr), "X-aws-ec2-metadata-token: %s", token);
		const char *h[] = {hdr, NULL};
		snprintf(url, sizeof(url), "%s/latest/meta-data/spot/instance-action", p->aws_url);
		CURLcode cc = request(w, "GET", url, h, NULL, timeout, &r);
		if (cc == CURLE_OK && r.code == 401) { /* the token expired: a new one */
			token[0] = '\0';
			if (!fresh)
				continue;
			if (!failed(w, url, "HTTP 401 with a new token")) /* not at once again */
				break;
			continue;
		}
		if (cc != CURLE_OK || (r.code != 200 && r.code != 404)) {
			if (!failed_http(w, url, cc, &r))
				break;
			continue;
		}
		succeeded(w);
		char action[32], when[64], what[160];
		if (r.code == 200 &&
		    kolo_preempt_parse_aws_action(r.body, r.len, action, sizeof(action), when,
		                                  sizeof(when))) {
			snprintf(what, sizeof(what), "spot instance-action %s at %s", action,
			         when[0] ? when : "(no time)");
			notice(w, what);
			break;
		}
		snprintf(url, sizeof(url), "%s/latest/meta-data/events/recommendations/rebalance",
		         p->aws_url);
		cc = request(w, "GET", url, h, NULL, timeout, &r);
		if (cc == CURLE_OK && r.code == 200 && !rebalance_seen &&
		    kolo_preempt_parse_aws_rebalance(r.body, r.len, when, sizeof(when))) {
			rebalance_seen = true;
			snprintf(what, sizeof(what), "rebalance recommendation (noticeTime %s)",
			         when);
			if (p->cfg.rebalance_leave) {
				notice(w, what);
				break;
			}
			hint(w, what);
		}
		if (!nap(p, p->cfg.poll_ms))
			break;
	}
	resp_fini(&r);
}

/* ---- GCE ---- */

static void gce_watch(struct watcher *w)
{
	struct kolo_preempt *p = w->p;
	char url[768], etag[128] = "";
	struct resp r = {0};
	const char *h[] = {"Metadata-Flavor: Google", NULL};
	while (!stopping(p)) {
		/* The first read returns the value and its ETag; then a hanging
		 * GET returns when it differs from that ETag (or after
		 * timeout_sec, with the same value). */
		long timeout = w->reached || !p->cfg.probe ? 5000 : PROBE_TIMEOUT_MS;
		if (etag[0]) {
			snprintf(url, sizeof(url),
			         "%s/computeMetadata/v1/instance/preempted?wait_for_change=true&"
			         "last_etag=%s&timeout_sec=%d",
			         p->gce_url, etag, GCE_WAIT_S);
			timeout = (GCE_WAIT_S + 30) * 1000L;
		} else {
			snprintf(url, sizeof(url), "%s/computeMetadata/v1/instance/preempted",
			         p->gce_url);
		}
		CURLcode cc = request(w, "GET", url, h, NULL, timeout, &r);
		if (cc != CURLE_OK || r.code != 200 || (!w->reached && !r.flavor_google)) {
			etag[0] = '\0';
			if (cc == CURLE_OK && r.code == 200) {
				if (!failed(w, url, "no Metadata-Flavor: Google in the answer"))
					break;
			} else if (!failed_http(w, url, cc, &r)) {
				break;
			}
			continue;
		}
		succeeded(w);
		if (kolo_preempt_parse_gce(r.body, r.len)) {
			notice(w, "instance/preempted is TRUE");
			break;
		}
		if (r.etag[0] && strspn(r.etag, "0123456789abcdefABCDEF-_") == strlen(r.etag)) {
			snprintf(etag, sizeof(etag), "%s", r.etag);
		} else if (!etag[0] && !nap(p, p->cfg.poll_ms)) {
			break; /* no usable ETag: poll instead */
		}
	}
	resp_fini(&r);
}

/* ---- Azure Scheduled Events ---- */

static void azure_watch(struct watcher *w)
{
	struct kolo_preempt *p = w->p;
	char url[768], vm[256] = "";
	bool named = false;
	struct resp r = {0};
	const char *h[] = {"Metadata: true", NULL};
	while (!stopping(p)) {
		long timeout = w->reached || !p->cfg.probe ? 10000 : PROBE_TIMEOUT_MS;
		snprintf(url, sizeof(url), "%s/metadata/scheduledevents?api-version=2020-07-01",
		         p->azure_url);
		CURLcode cc = request(w, "GET", url, h, NULL, timeout, &r);
		if (cc != CURLE_OK || r.code != 200) {
			if (!failed_http(w, url, cc, &r))
				break;
			continue;
		}
		succeeded(w);
		if (!named) { /* this VM's name: its events name it in Resources */
			named = true;
			char nurl[768];
			struct resp n = {0};
			snprintf(nurl, sizeof(nurl),
			         "%s/metadata/instance/compute/"
			         "name?api-version=2021-02-01&format=text",
			         p->azure_url);
			cc = request(w, "GET", nurl, h, NULL, 5000, &n);
			if (cc == CURLE_OK && n.code == 200 && n.len && n.len < sizeof(vm)) {
				snprintf(vm, sizeof(vm), "%s", n.body);
				trim(vm);
			} else {
				KOLO_INFO(
				        SUBSYS,
				        "azure: cannot read this VM's name (%s): any Preempt event "
				        "counts",
				        cc != CURLE_OK ? curl_easy_strerror(cc) : "HTTP error");
			}
			resp_fini(&n);
			if (stopping(p))
				break;
			cc = request(w, "GET", url, h, NULL, timeout,
			             &r); /* again, knowing the name */
			if (cc != CURLE_OK || r.code != 200)
				continue;
		}
		char id[200], nb[64], what[400];
		if (kolo_preempt_parse_azure(r.body, r.len, vm, id, sizeof(id), nb, sizeof(nb))) {
			pthread_mutex_lock(&p->lock);
			snprintf(p->azure_event, sizeof(p->azure_event), "%s", id);
			pthread_mutex_unlock(&p->lock);
			snprintf(what, sizeof(what),
			         "scheduled event Preempt %s for %s, not before %s", id,
			         vm[0] ? vm : "this VM", nb[0] ? nb : "(no time)");
			notice(w, what);
			break;
		}
		if (!nap(p, p->cfg.poll_ms))
			break;
	}
	resp_fini(&r);
}

/* After the worker left: tells Azure to go on with the event now. */
static void azure_ack(struct kolo_preempt *p, const char *id)
{
	char url[768], body[400], hdr[] = "Metadata: true";
	snprintf(url, sizeof(url), "%s/metadata/scheduledevents?api-version=2020-07-01",
	         p->azure_url);
	snprintf(body, sizeof(body), "{\"StartRequests\":[{\"EventId\":\"%s\"}]}", id);
	CURL *h = curl_easy_init();
	if (!h)
		return;
	struct resp r = {0};
	struct curl_slist *hdrs = curl_slist_append(NULL, hdr);
	hdrs = curl_slist_append(hdrs, "Content-Type: application/json");
	hdrs = curl_slist_append(hdrs, "Expect:");
	set_common(h, url, 2000, hdrs, &r);
	set_method(h, "POST", body);
	CURLcode cc = curl_easy_perform(h);
	curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r.code);
	if (cc == CURLE_OK && r.code / 100 == 2)
		KOLO_INFO(SUBSYS, "azure: acknowledged event %s (the worker has left)", id);
	else
		KOLO_WARN(SUBSYS, "azure: acknowledging event %s: %s", id,
		          cc != CURLE_OK ? curl_easy_strerror(cc) : "HTTP error");
	curl_slist_free_all(hdrs);
	curl_easy_cleanup(h);
	resp_fini(&r);
}

/* ---- Kubernetes: the pod's DisruptionTarget condition ---- */

static bool loopback_http(const char *url)
{
	static const char *const ok[] = {"http://127.", "http://localhost:", "http://localhost/",
	                                 "http://[::1]"};
	for (size_t i = 0; i < KOLO_ARRAY_SIZE(ok); i++)
		if (strncmp(url, ok[i], strlen(ok[i])) == 0)
			return true;
	return strcmp(url, "http://localhost") == 0;
}

static bool read_small(const char *path, char *out, size_t size)
{
	FILE *f = fopen(path, "re");
	if (!f)
		return false;
	size_t n = fread(out, 1, size - 1, f);
	fclose(f);
	out[n] = '\0';
	trim(out);
	return n > 0 && n < size - 1;
}

static void k8s_watch(struct watcher *w)
{
	struct kolo_preempt *p = w->p;
	char dir[1024], ca[1100], nsfile[1100], ns[256], url[1536];
	snprintf(dir, sizeof(dir), "%s", p->k8s_token);
	char *slash = strrchr(dir, '/');
	if (slash)
		*slash = '\0';
	else
		snprintf(dir, sizeof(dir), ".");
	snprintf(ca, sizeof(ca), "%s/ca.crt", dir);
	snprintf(nsfile, sizeof(nsfile), "%s/namespace", dir);
	const char *missing = NULL;
	char token[8192];
	if (!p->k8s_api[0])
		missing = "the API server (KUBERNETES_SERVICE_HOST or KOLO_K8S_API)";
	else if (!p->k8s_pod[0])
		missing = "the pod's name (HOSTNAME or KOLO_K8S_POD_NAME)";
	else if (!read_small(p->k8s_token, token, sizeof(token)))
		missing = "a service-account token (KOLO_K8S_TOKEN_FILE)";
	if (p->k8s_ns[0])
		snprintf(ns, sizeof(ns), "%s", p->k8s_ns);
	else if (!missing && !read_small(nsfile, ns, sizeof(ns)))
		missing = "the pod's namespace (the namespace file or KOLO_K8S_NAMESPACE)";
	bool https = strncmp(p->k8s_api, "https://", 8) == 0;
	if (!missing && !https && !loopback_http(p->k8s_api))
		missing = "an https:// API URL (plain http only on loopback)";
	if (missing) {
		if (p->cfg.probe)
			KOLO_DEBUG(SUBSYS, "k8s: no %s: not watching the pod", missing);
		else
			KOLO_WARN(SUBSYS,
			          "k8s: no %s: not watching the pod's DisruptionTarget condition "
			          "(SIGTERM still makes the worker leave)",
			          missing);
		return;
	}
	snprintf(url, sizeof(url), "%s/api/v1/namespaces/%s/pods/%s", p->k8s_api, ns, p->k8s_pod);
	struct resp r = {0};
	char auth[8300];
	while (!stopping(p)) {
		read_small(p->k8s_token, token, sizeof(token)); /* the kubelet rotates it */
		snprintf(auth, sizeof(auth), "Authorization: Bearer %s", token);
		const char *h[] = {auth, "Accept: application/json", NULL};
		long timeout = w->reached || !p->cfg.probe ? 5000 : PROBE_TIMEOUT_MS;
		CURLcode cc = request(w, "GET", url, h, https ? ca : NULL, timeout, &r);
		if (cc == CURLE_OK && (r.code == 401 || r.code == 403) && !w->logged)
			KOLO_WARN(
			        SUBSYS,
			        "k8s: HTTP %ld reading pod %s/%s: the pod may not read its own "
			        "status (a Role with get on pods); SIGTERM still makes the worker "
			        "leave",
			        r.code, ns, p->k8s_pod);
		if (cc != CURLE_OK || r.code != 200) {
			if (cc == CURLE_OK && (r.code == 401 || r.code == 403))
				w->logged = true;
			if (!failed_http(w, url, cc, &r))
				break;
			continue;
		}
		succeeded(w);
		char reason[300], what[1000];
		if (kolo_preempt_parse_pod(r.body, r.len, reason, sizeof(reason))) {
			snprintf(what, sizeof(what), "pod %s/%s has condition DisruptionTarget%s%s",
			         ns, p->k8s_pod, reason[0] ? ": " : "", reason);
			notice(w, what);
			break;
		}
		if (!nap(p, p->cfg.poll_ms))
			break;
	}
	resp_fini(&r);
}

static void *watch_main(void *arg)
{
	struct watcher *w = arg;
	switch (w->kind) {
	case KOLO_PREEMPT_AWS:
		aws_watch(w);
		break;
	case KOLO_PREEMPT_GCE:
		gce_watch(w);
		break;
	case KOLO_PREEMPT_AZURE:
		azure_watch(w);
		break;
	default:
		k8s_watch(w);
		break;
	}
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
		azure_ack(p, p->azure_event);
	pthread_cond_destroy(&p->cond);
	pthread_mutex_destroy(&p->lock);
	free(p);
}
