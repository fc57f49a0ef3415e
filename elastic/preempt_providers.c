/* preempt_providers: the watch loop of each provider: AWS IMDSv2, GCE
 * metadata, Azure Scheduled Events, and the pod's DisruptionTarget
 * condition on Kubernetes (docs/spot.md). */
#include "preempt_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

/* ---- AWS IMDSv2 ---- */

void pw_aws_watch(struct watcher *w)
{
	struct kolo_preempt *p = w->p;
	char url[768], token[1024] = "", hdr[1100];
	uint64_t token_at = 0;
	bool rebalance_seen = false;
	struct resp r = {0};
	while (!pw_stopping(p)) {
		long timeout = w->reached || !p->cfg.probe ? 5000 : PROBE_TIMEOUT_MS;
		bool fresh = false;
		if (!token[0] ||
		    kolo_now_ms() - token_at > (uint64_t)(AWS_TOKEN_TTL_S - 300) * 1000) {
			snprintf(url, sizeof(url), "%s/latest/api/token", p->aws_url);
			const char *h[] = {"X-aws-ec2-metadata-token-ttl-seconds: 21600", NULL};
			CURLcode cc = pw_request(w, "PUT", url, h, NULL, timeout, &r);
			if (cc != CURLE_OK || r.code != 200 || !r.len || r.len >= sizeof(token)) {
				if (!pw_failed_http(w, url, cc, &r))
					break;
				continue;
			}
			snprintf(token, sizeof(token), "%s", r.body);
			pw_trim(token);
			token_at = kolo_now_ms();
			fresh = true;
		}
		snprintf(hdr, sizeof(hdr), "X-aws-ec2-metadata-token: %s", token);
		const char *h[] = {hdr, NULL};
		snprintf(url, sizeof(url), "%s/latest/meta-data/spot/instance-action", p->aws_url);
		CURLcode cc = pw_request(w, "GET", url, h, NULL, timeout, &r);
		if (cc == CURLE_OK && r.code == 401) { /* the token expired: a new one */
			token[0] = '\0';
			if (!fresh)
				continue;
			if (!pw_failed(w, url, "HTTP 401 with a new token")) /* not at once again */
				break;
			continue;
		}
		if (cc != CURLE_OK || (r.code != 200 && r.code != 404)) {
			if (!pw_failed_http(w, url, cc, &r))
				break;
			continue;
		}
		pw_succeeded(w);
		char action[32], when[64], what[160];
		if (r.code == 200 &&
		    kolo_preempt_parse_aws_action(r.body, r.len, action, sizeof(action), when,
		                                  sizeof(when))) {
			snprintf(what, sizeof(what), "spot instance-action %s at %s", action,
			         when[0] ? when : "(no time)");
			int64_t at;
			pw_notice(w, what, kolo_preempt_parse_time(when, &at) ? at : -1);
			break;
		}
		snprintf(url, sizeof(url), "%s/latest/meta-data/events/recommendations/rebalance",
		         p->aws_url);
		cc = pw_request(w, "GET", url, h, NULL, timeout, &r);
		if (cc == CURLE_OK && r.code == 200 && !rebalance_seen &&
		    kolo_preempt_parse_aws_rebalance(r.body, r.len, when, sizeof(when))) {
			rebalance_seen = true;
			snprintf(what, sizeof(what), "rebalance recommendation (noticeTime %s)",
			         when);
			if (p->cfg.rebalance_leave) {
				pw_notice(w, what, -1); /* no deadline until an instance-action */
				break;
			}
			pw_hint(w, what);
		}
		if (!pw_nap(p, p->cfg.poll_ms))
			break;
	}
	pw_resp_fini(&r);
}

/* ---- GCE ---- */

void pw_gce_watch(struct watcher *w)
{
	struct kolo_preempt *p = w->p;
	char url[768], etag[128] = "";
	struct resp r = {0};
	const char *h[] = {"Metadata-Flavor: Google", NULL};
	while (!pw_stopping(p)) {
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
		CURLcode cc = pw_request(w, "GET", url, h, NULL, timeout, &r);
		if (cc != CURLE_OK || r.code != 200 || (!w->reached && !r.flavor_google)) {
			etag[0] = '\0';
			if (cc == CURLE_OK && r.code == 200) {
				if (!pw_failed(w, url, "no Metadata-Flavor: Google in the answer"))
					break;
			} else if (!pw_failed_http(w, url, cc, &r)) {
				break;
			}
			continue;
		}
		pw_succeeded(w);
		if (kolo_preempt_parse_gce(r.body, r.len)) {
			/* GCE gives no time: documented as 30 s from the notice. */
			int64_t at = (int64_t)(kolo_wall_us() / 1000) + KOLO_PREEMPT_GCE_NOTICE_MS;
			char when[32], what[96];
			kolo_preempt_format_time(at, when, sizeof(when));
			snprintf(what, sizeof(what), "instance/preempted is TRUE, stopping at %s",
			         when);
			pw_notice(w, what, at);
			break;
		}
		if (r.etag[0] && strspn(r.etag, "0123456789abcdefABCDEF-_") == strlen(r.etag)) {
			snprintf(etag, sizeof(etag), "%s", r.etag);
		} else if (!etag[0] && !pw_nap(p, p->cfg.poll_ms)) {
			break; /* no usable ETag: poll instead */
		}
	}
	pw_resp_fini(&r);
}

/* ---- Azure Scheduled Events ---- */

void pw_azure_watch(struct watcher *w)
{
	struct kolo_preempt *p = w->p;
	char url[768], vm[256] = "";
	bool named = false;
	struct resp r = {0};
	const char *h[] = {"Metadata: true", NULL};
	while (!pw_stopping(p)) {
		long timeout = w->reached || !p->cfg.probe ? 10000 : PROBE_TIMEOUT_MS;
		snprintf(url, sizeof(url), "%s/metadata/scheduledevents?api-version=2020-07-01",
		         p->azure_url);
		CURLcode cc = pw_request(w, "GET", url, h, NULL, timeout, &r);
		if (cc != CURLE_OK || r.code != 200) {
			if (!pw_failed_http(w, url, cc, &r))
				break;
			continue;
		}
		pw_succeeded(w);
		if (!named) { /* this VM's name: its events name it in Resources */
			named = true;
			char nurl[768];
			struct resp n = {0};
			snprintf(nurl, sizeof(nurl),
			         "%s/metadata/instance/compute/"
			         "name?api-version=2021-02-01&format=text",
			         p->azure_url);
			cc = pw_request(w, "GET", nurl, h, NULL, 5000, &n);
			if (cc == CURLE_OK && n.code == 200 && n.len && n.len < sizeof(vm)) {
				snprintf(vm, sizeof(vm), "%s", n.body);
				pw_trim(vm);
			} else {
				KOLO_INFO(
				        SUBSYS,
				        "azure: cannot read this VM's name (%s): any Preempt event "
				        "counts",
				        cc != CURLE_OK ? curl_easy_strerror(cc) : "HTTP error");
			}
			pw_resp_fini(&n);
			if (pw_stopping(p))
				break;
			cc = pw_request(w, "GET", url, h, NULL, timeout,
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
			         vm[0] ? vm : "this VM", nb[0] ? nb : "(no time: now)");
			/* An empty NotBefore: the event may start at any moment. */
			int64_t at = (int64_t)(kolo_wall_us() / 1000);
			pw_notice(w, what, !nb[0] || kolo_preempt_parse_time(nb, &at) ? at : -1);
			break;
		}
		if (!pw_nap(p, p->cfg.poll_ms))
			break;
	}
	pw_resp_fini(&r);
}

/* After the worker left: tells Azure to go on with the event now. */
void pw_azure_ack(struct kolo_preempt *p, const char *id)
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
	pw_set_common(h, url, 2000, hdrs, &r);
	pw_set_method(h, "POST", body);
	CURLcode cc = curl_easy_perform(h);
	curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r.code);
	if (cc == CURLE_OK && r.code / 100 == 2)
		KOLO_INFO(SUBSYS, "azure: acknowledged event %s (the worker has left)", id);
	else
		KOLO_WARN(SUBSYS, "azure: acknowledging event %s: %s", id,
		          cc != CURLE_OK ? curl_easy_strerror(cc) : "HTTP error");
	curl_slist_free_all(hdrs);
	curl_easy_cleanup(h);
	pw_resp_fini(&r);
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
	pw_trim(out);
	return n > 0 && n < size - 1;
}

void pw_k8s_watch(struct watcher *w)
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
	bool noticed = false;
	while (!pw_stopping(p)) {
		read_small(p->k8s_token, token, sizeof(token)); /* the kubelet rotates it */
		snprintf(auth, sizeof(auth), "Authorization: Bearer %s", token);
		const char *h[] = {auth, "Accept: application/json", NULL};
		long timeout = w->reached || !p->cfg.probe ? 5000 : PROBE_TIMEOUT_MS;
		CURLcode cc = pw_request(w, "GET", url, h, https ? ca : NULL, timeout, &r);
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
			if (!pw_failed_http(w, url, cc, &r))
				break;
			continue;
		}
		pw_succeeded(w);
		char reason[300], deleted[64], what[1100];
		int64_t at;
		if (kolo_preempt_parse_pod(r.body, r.len, reason, sizeof(reason), deleted,
		                           sizeof(deleted))) {
			/* The deadline is the end of the grace period, known once the
			 * pod is deleted: until then the notice stands without one,
			 * and the pod is read again. */
			bool timed = kolo_preempt_parse_time(deleted, &at);
			if (!noticed || timed) {
				snprintf(what, sizeof(what),
				         "pod %s/%s has condition DisruptionTarget%s%s%s%s", ns,
				         p->k8s_pod, reason[0] ? ": " : "", reason,
				         timed ? ", deleted at " : "", timed ? deleted : "");
				pw_notice(w, what, timed ? at : -1);
				noticed = true;
			}
			if (timed)
				break;
		}
		if (!pw_nap(p, p->cfg.poll_ms))
			break;
	}
	pw_resp_fini(&r);
}
