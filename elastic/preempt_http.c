/* preempt_http: the watcher's requests over libcurl (a multi handle, so
 * that kolo_preempt_destroy() wakes a request at once), the back-off, and
 * what a notice or a hint does. */
#include "preempt_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

void pw_resp_fini(struct resp *r)
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

bool pw_stopping(struct kolo_preempt *p)
{
	pthread_mutex_lock(&p->lock);
	bool s = p->stop;
	pthread_mutex_unlock(&p->lock);
	return s;
}

/* Waits ms unless told to stop; false when stopping. */
bool pw_nap(struct kolo_preempt *p, int ms)
{
	struct timespec ts;
	kolo_deadline_ts(&ts, CLOCK_MONOTONIC, ms);
	pthread_mutex_lock(&p->lock);
	while (!p->stop && pthread_cond_timedwait(&p->cond, &p->lock, &ts) != ETIMEDOUT)
		;
	bool go = !p->stop;
	pthread_mutex_unlock(&p->lock);
	return go;
}

void pw_set_common(CURL *h, const char *url, long timeout_ms, struct curl_slist *hdrs,
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

void pw_set_method(CURL *h, const char *method, const char *body)
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
CURLcode pw_request(struct watcher *w, const char *method, const char *url,
                    const char *const *headers, const char *cainfo, long timeout_ms, struct resp *r)
{
	pw_resp_fini(r);
	struct curl_slist *hdrs = curl_slist_append(NULL, "Expect:");
	for (size_t i = 0; headers && headers[i]; i++)
		hdrs = curl_slist_append(hdrs, headers[i]);
	CURL *h = w->easy;
	curl_easy_reset(h);
	pw_set_common(h, url, timeout_ms, hdrs, r);
	pw_set_method(h, method, NULL);
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
		if (pw_stopping(w->p)) {
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

/* A request that pw_failed (why). In auto mode, a provider that never answered
 * is not there: false, the thread ends. Otherwise logs once and waits the
 * back-off; false when stopping. */
bool pw_failed(struct watcher *w, const char *url, const char *why)
{
	struct kolo_preempt *p = w->p;
	if (pw_stopping(p))
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
	return pw_nap(p, ms);
}

bool pw_failed_http(struct watcher *w, const char *url, CURLcode cc, const struct resp *r)
{
	char why[160];
	if (cc != CURLE_OK)
		snprintf(why, sizeof(why), "%s", curl_easy_strerror(cc));
	else
		snprintf(why, sizeof(why), "HTTP %ld", r->code);
	return pw_failed(w, url, why);
}

void pw_succeeded(struct watcher *w)
{
	if (w->logged)
		KOLO_INFO(SUBSYS, "%s: the endpoint answers again", w->name);
	w->logged = false;
	w->reached = true;
	w->backoff_ms = 0;
}

void pw_notice(struct watcher *w, const char *what, int64_t deadline)
{
	char text[512];
	snprintf(text, sizeof(text), "%.8s: %.480s", w->name, what);
	bool first = pw_record(2, text);
	int64_t left = deadline >= 0 ? pw_record_deadline(deadline) : -1;
	if (left >= 0)
		w->deadline = true;
	if (first && left < 0)
		KOLO_WARN(SUBSYS,
		          "%s: preemption notice: %s: leaving the job at the next commit point",
		          w->name, what);
	else if (left >= 0)
		KOLO_WARN(SUBSYS,
		          "%s: %s%s, in %lld s: leaving the job at the next commit point, or at "
		          "once %d ms before then (KOLO_PREEMPTION_MARGIN_MS)",
		          w->name, first ? "preemption notice: " : "", what,
		          (long long)((left + 500) / 1000), w->p->cfg.margin_ms);
	kolo_elastic_request_leave();
}

void pw_hint(struct watcher *w, const char *what)
{
	char text[512];
	snprintf(text, sizeof(text), "%.8s: %.480s", w->name, what);
	if (pw_record(1, text))
		KOLO_WARN(SUBSYS, "%s: early hint of a preemption: %s (the worker stays)", w->name,
		          what);
}

void pw_trim(char *s)
{
	size_t n = strlen(s);
	while (n && (s[n - 1] == '\n' || s[n - 1] == '\r' || s[n - 1] == ' '))
		s[--n] = '\0';
}
