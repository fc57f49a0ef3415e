/* elastic/preempt: preemption notices of spot machines, turned into a
 * graceful leave (docs/spot.md).
 *
 * A watcher thread per enabled provider reads the provider's notice:
 * - aws: IMDSv2 (a session token, then spot/instance-action; the rebalance
 *   recommendation is an early hint, logged and exposed);
 * - gce: instance/preempted, a hanging GET (wait_for_change);
 * - azure: Scheduled Events, a "Preempt" event for this VM (acknowledged
 *   once the worker has left);
 * - k8s: the pod's own DisruptionTarget condition (SIGTERM is a leave
 *   already).
 * A notice calls kolo_elastic_request_leave(): the worker leaves at its next
 * commit point exactly as on SIGTERM. A notice's deadline (AWS's time, GCE's
 * 30 s, Azure's NotBefore, the pod's deletionTimestamp) is logged and
 * exposed; when no commit point came by the deadline less the margin, the
 * runtime takes the worker out of the job at once and the process exits.
 * Off unless KOLO_PREEMPTION names the providers (or "auto", which probes
 * each endpoint once).
 *
 * The response parsers below are pure (no I/O) and unit-tested; the HTTP is
 * in preempt.c. */
#ifndef KOLO_ELASTIC_PREEMPT_H
#define KOLO_ELASTIC_PREEMPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core.h"

enum kolo_preempt_provider {
	KOLO_PREEMPT_AWS = 1u << 0,
	KOLO_PREEMPT_GCE = 1u << 1,
	KOLO_PREEMPT_AZURE = 1u << 2,
	KOLO_PREEMPT_K8S = 1u << 3,
	KOLO_PREEMPT_ALL = 0xfu,
};

/* ---- pure parsers --------------------------------------------------------- */

/* KOLO_PREEMPTION: "" / "0" / "off" / "none" (nothing), "auto" (all, probed),
 * or a comma-separated list of aws, gce, azure, k8s (spaces allowed, case
 * ignored). KOLO_EINVAL with a message for anything else. */
kolo_status_t kolo_preempt_parse_providers(const char *list, unsigned *mask, bool *probe,
                                           struct kolo_errbuf *eb);

/* AWS spot/instance-action (200): {"action": "terminate|stop|hibernate",
 * "time": "2026-12-07T14:30:00Z"}. true when it is a notice; action and
 * time (may be NULL) get the values ("" when absent). */
bool kolo_preempt_parse_aws_action(const char *body, size_t len, char *action, size_t alen,
                                   char *when, size_t wlen);
/* AWS events/recommendations/rebalance (200): {"noticeTime": "..."}. */
bool kolo_preempt_parse_aws_rebalance(const char *body, size_t len, char *when, size_t wlen);
/* GCE instance/preempted: "TRUE" or "FALSE" (whitespace ignored). */
bool kolo_preempt_parse_gce(const char *body, size_t len);
/* Azure Scheduled Events: the first event with EventType "Preempt" whose
 * Resources name vm (any event when vm is NULL or ""); its EventId and
 * NotBefore go to id and not_before. true when there is one. */
bool kolo_preempt_parse_azure(const char *body, size_t len, const char *vm, char *id, size_t ilen,
                              char *not_before, size_t nlen);
/* A pod (GET /api/v1/namespaces/NS/pods/NAME): true when
 * status.conditions[] holds {"type": "DisruptionTarget", "status": "True"};
 * its reason and message go to reason, metadata.deletionTimestamp (the end
 * of the grace period, once the pod is deleted) to deleted ("" when
 * absent). */
bool kolo_preempt_parse_pod(const char *body, size_t len, char *reason, size_t rlen, char *deleted,
                            size_t dlen);

/* GCE gives no time: the instance stops 30 s after the notice. */
#define KOLO_PREEMPT_GCE_NOTICE_MS 30000
/* A notice's time into milliseconds since 1970 (UTC): RFC 3339 (AWS's
 * "2026-12-07T14:32:00Z", Kubernetes' timestamps; fractions and a +hh:mm
 * offset allowed) or RFC 1123 (Azure's "Mon, 07 Dec 2026 14:32:00 GMT").
 * false for an empty or malformed time. */
bool kolo_preempt_parse_time(const char *s, int64_t *unix_ms);
/* unix_ms as "2026-12-07T14:32:00Z" (whole seconds). */
void kolo_preempt_format_time(int64_t unix_ms, char *out, size_t size);

/* The base URL of a metadata service from a standard override: AWS's
 * AWS_EC2_METADATA_SERVICE_ENDPOINT is a URL (a trailing '/' dropped);
 * GCE's GCE_METADATA_HOST is host[:port] ("http://" is prefixed). def when
 * the override is NULL or empty. */
void kolo_preempt_base_url(const char *override, bool host_only, const char *def, char *out,
                           size_t size);

/* ---- the watcher ------------------------------------------------------------ */

struct kolo_preempt_config {
	unsigned providers;   /* enum kolo_preempt_provider mask; 0: no watcher */
	bool probe;           /* auto: a provider whose endpoint does not answer is dropped */
	int poll_ms;          /* poll period (GCE's hanging GET excepted) */
	bool rebalance_leave; /* AWS rebalance recommendation is a notice too */
	const char *aws_url, *gce_url, *azure_url; /* base URLs, no trailing '/' */
	const char *k8s_api;                       /* https://host:port or a loopback http:// URL */
	const char *k8s_token_file;                /* ca.crt and namespace are beside it */
	const char *k8s_namespace;                 /* "" or NULL: the namespace file */
	const char *k8s_pod;                       /* the pod's name */
	int margin_ms;                             /* act this long before a notice's deadline */
	/* Called on a watcher's thread at a notice's deadline less margin_ms,
	 * unless kolo_preempt_destroy() came first; notice: the recorded line.
	 * Returns true when it took the worker out of the job: the process then
	 * exits at once with status 0, as a worker that left (an Azure event
	 * acknowledged first). May be NULL. */
	bool (*on_deadline)(void *arg, const char *notice, int64_t left_ms);
	void *arg;
};

/* Reads the parameters (KOLO_PREEMPTION ...) and the providers' standard
 * overrides into cfg; the strings stay valid for the process's life.
 * cfg->providers is 0 when preemption notices are off. */
kolo_status_t kolo_preempt_config_load(struct kolo_preempt_config *cfg, struct kolo_errbuf *eb);

struct kolo_preempt;

/* Starts one thread per provider. *out is NULL when cfg->providers is 0. */
kolo_status_t kolo_preempt_create(const struct kolo_preempt_config *cfg, struct kolo_preempt **out,
                                  struct kolo_errbuf *eb);
/* Stops the threads (at once: every wait is cancellable) and frees. left:
 * the worker has left the job, so an Azure Preempt event it saw is
 * acknowledged now (the VM may then be evicted at once). Accepts NULL; in a
 * forked child only frees. */
void kolo_preempt_destroy(struct kolo_preempt *p, bool left);

/* The process's preemption state (kolo_elastic_preemption()): 0 none, 1 an
 * early hint (the worker stays), 2 a notice (the worker leaves); text gets
 * one line naming the provider and the notice. */
int kolo_preempt_state(char *text, size_t len);
/* Milliseconds left until the deadline of the process's notice, 0 once it
 * passed, -1 with no notice or a notice without a deadline. */
int64_t kolo_preempt_deadline_ms(void);

#endif /* KOLO_ELASTIC_PREEMPT_H */
