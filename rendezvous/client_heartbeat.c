/* client_heartbeat: the rendezvous client's heartbeat thread, and what a
 * server restart asks of the worker: the server answers 410 "unknown
 * worker" once it has lost its soft state, and the worker then registers
 * again under the id, round and rank it holds and puts again the KV entries
 * it put in that round (client_kv.c keeps them; the restart lost them too). */
#include "client_internal.h"
#include "client_parse.h"

#include <curl/curl.h>
#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- heartbeat -------------------------------------------------------- */

static char *hb_path(struct kolo_rdzv_client *c, struct rdzv_client_req *q)
{
	return rdzv_client_worker_path(c, q, "/heartbeat");
}

static kolo_status_t heartbeat_once(struct kolo_rdzv_client *c, CURL *h)
{
	struct rdzv_client_req q = {.method = "POST",
	                            .body = "{}",
	                            .blen = 2,
	                            .ctype = "application/json",
	                            .timeout_ms = RDZV_CLIENT_SHORT_REQ_MS,
	                            .heartbeat = true,
	                            .worker_path = true};
	struct rdzv_client_resp r = {0};
	struct kolo_errbuf eb = {{0}};
	char etext[256];
	kolo_status_t st = rdzv_client_request(c, h, &q, &r, &eb, hb_path);
	int64_t round = -1;
	bool pending_change = false;
	if (st == KOLO_OK) {
		if (r.code != 200 ||
		    !rdzv_client_parse_heartbeat(r.body, r.len, &round, &pending_change))
			st = kolo_fail(&eb, KOLO_EPROTO, "heartbeat: HTTP %ld: %s", r.code,
			               rdzv_client_error_text(&r, etext, sizeof(etext)));
	}
	pthread_mutex_lock(&c->lock);
	if (st == KOLO_OK) {
		c->hb.round = round;
		c->hb.pending_change = pending_change;
	}
	if (st != KOLO_ESHUTDOWN)
		c->hb.last = st;
	if (st == KOLO_EMEMBERSHIP)
		c->hb.evicted = true;
	if (st != KOLO_OK && st != KOLO_ESHUTDOWN)
		c->hb_err = eb;
	pthread_mutex_unlock(&c->lock);
	rdzv_client_resp_fini(&r);
	if (st != KOLO_OK && st != KOLO_ESHUTDOWN)
		KOLO_WARN(RDZV_CLIENT_SUB, "heartbeat failed: %s", eb.msg);
	return st;
}

static void *hb_main(void *arg)
{
	struct kolo_rdzv_client *c = arg;
	CURL *h = curl_easy_init();
	if (!h) {
		pthread_mutex_lock(&c->lock);
		c->hb.last = KOLO_ENOMEM;
		pthread_mutex_unlock(&c->lock);
		return NULL;
	}
	for (;;) {
		kolo_status_t st = heartbeat_once(c, h);
		if (st == KOLO_EMEMBERSHIP || st == KOLO_ESHUTDOWN)
			break;
		pthread_mutex_lock(&c->lock);
		int period = c->hb_period_ms > 0 ? c->hb_period_ms : KOLO_MAX(c->lease_ms / 3, 10);
		pthread_mutex_unlock(&c->lock);
		if (!rdzv_client_backoff_wait(c, true, period))
			break;
	}
	curl_easy_cleanup(h);
	return NULL;
}

kolo_status_t kolo_rdzv_heartbeat_start(struct kolo_rdzv_client *c, int period_ms)
{
	if (!rdzv_client_is_joined(c))
		return kolo_fail(&c->err, KOLO_EINVAL, "heartbeat before join");
	if (c->hb_running)
		return KOLO_OK;
	c->hb_period_ms = period_ms;
	c->hb_stop = false;
	int rc = pthread_create(&c->hb_thread, NULL, hb_main, c);
	if (rc != 0)
		return kolo_fail(&c->err, KOLO_ESYSTEM, "pthread_create: %s", strerror(rc));
	c->hb_running = true;
	return KOLO_OK;
}

void kolo_rdzv_heartbeat_stop(struct kolo_rdzv_client *c)
{
	if (!c || !c->hb_running)
		return;
	pthread_mutex_lock(&c->lock);
	c->hb_stop = true;
	pthread_cond_broadcast(&c->hb_cond);
	pthread_mutex_unlock(&c->lock);
	pthread_join(c->hb_thread, NULL);
	c->hb_running = false;
}

void kolo_rdzv_heartbeat_state(struct kolo_rdzv_client *c, struct kolo_rdzv_hb_state *out)
{
	pthread_mutex_lock(&c->lock);
	*out = c->hb;
	pthread_mutex_unlock(&c->lock);
}

/* ---- re-registration ------------------------------------------------- */

kolo_status_t rdzv_client_reregister(struct kolo_rdzv_client *c, CURL *h, bool heartbeat,
                                     uint64_t seen_gen, struct kolo_errbuf *eb)
{
	kolo_status_t st = KOLO_OK;
	pthread_mutex_lock(&c->reg_lock);
	pthread_mutex_lock(&c->lock);
	bool done = c->reg_gen != seen_gen;
	char wid[KOLO_RDZV_ID_MAX];
	snprintf(wid, sizeof(wid), "%s", c->worker_id);
	int64_t round = c->round;
	int rank = c->rank;
	pthread_mutex_unlock(&c->lock);
	if (!done) {
		json_t *body =
		        round > 0 && rank >= 0
		                ? json_pack("{s:s,s:s,s:I,s:i}", "host", c->host, "worker_id", wid,
		                            "round", (json_int_t)round, "rank", rank)
		                : json_pack("{s:s,s:s}", "host", c->host, "worker_id", wid);
		if (!body)
			st = kolo_fail(eb, KOLO_ENOMEM, "out of memory");
		else
			st = rdzv_client_register(c, h, heartbeat, body, eb);
		if (st == KOLO_OK)
			KOLO_INFO(RDZV_CLIENT_SUB,
			          "re-registered as worker %s (round %" PRId64 ", rank %d)",
			          c->worker_id, round, rank);
		/* Under reg_lock: a request that saw the restart too goes on
		 * once the round's keys are back. */
		if (st == KOLO_OK && round > 0)
			rdzv_client_republish(c, h, heartbeat);
	}
	pthread_mutex_unlock(&c->reg_lock);
	return st;
}

/* Puts again the entries rdzv_client_remember() kept for the round this worker holds,
 * after a re-registration; on h, the re-registering thread's handle. A
 * failure is logged: the request that re-registered goes on regardless. */
void rdzv_client_republish(struct kolo_rdzv_client *c, CURL *h, bool heartbeat)
{
	struct rdzv_client_owned copy[RDZV_CLIENT_OWNED_MAX];
	int n = 0;
	pthread_mutex_lock(&c->lock);
	if (c->owned_round == c->round) {
		for (; n < c->n_owned; n++) {
			copy[n] = c->owned[n];
			copy[n].val = malloc(KOLO_MAX(copy[n].len, (size_t)1));
			if (!copy[n].val)
				break;
			memcpy(copy[n].val, c->owned[n].val, copy[n].len);
		}
	}
	int64_t round = c->round;
	pthread_mutex_unlock(&c->lock);
	int done = 0;
	for (int i = 0; i < n; i++) {
		struct rdzv_client_req q = {.method = "PUT",
		                            .body = copy[i].val,
		                            .blen = copy[i].len,
		                            .ctype = "application/octet-stream",
		                            .timeout_ms = RDZV_CLIENT_SHORT_REQ_MS,
		                            .heartbeat = heartbeat};
		struct kolo_errbuf eb = {{0}};
		struct rdzv_client_resp r = {0};
		kolo_status_t st = rdzv_client_kv_path(c, copy[i].key, "", &q);
		if (st == KOLO_OK)
			st = rdzv_client_request(c, h, &q, &r, &eb, NULL);
		if (st == KOLO_OK && (r.code == 204 || r.code == 200))
			done++;
		else
			KOLO_WARN(RDZV_CLIENT_SUB,
			          "cannot put KV key %s again after the restart: %s", copy[i].key,
			          st == KOLO_OK ? "refused" : eb.msg);
		rdzv_client_resp_fini(&r);
		free(copy[i].val);
	}
	if (n > 0)
		KOLO_INFO(RDZV_CLIENT_SUB,
		          "put %d KV entries of round %" PRId64 " again after a restart", done,
		          round);
}
