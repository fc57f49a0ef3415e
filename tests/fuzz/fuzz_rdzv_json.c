/* Fuzz target: the rendezvous server's request-body validation
 * (rendezvous/server_json.c). The first byte picks the parser, the rest is
 * the body. Beyond "no crash", it checks what a handler relies on: an
 * accepted body yields values in their documented ranges, a refused one a
 * message for the client, and the id and host checks agree with a plain
 * reading of their rule. */
#include "fuzz.h"
#include "rendezvous.h"

#include <stdbool.h>
#include <string.h>

/* The rule of kolo_rdzv_valid_id / _host, written out independently. */
static bool rule_ok(const char *s, size_t max, bool slash)
{
	size_t n = strlen(s);
	if (n < 1 || n > max - 1)
		return false;
	for (size_t i = 0; i < n; i++) {
		char c = s[i];
		if (!(strchr("._:-", c) || (slash && c == '/') || (c >= 'a' && c <= 'z') ||
		      (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')))
			return false;
	}
	return true;
}

static void check_err(const char *err, size_t size)
{
	FUZZ_CHECK(memchr(err, '\0', size) != NULL, "error message not terminated");
	FUZZ_CHECK(err[0] != '\0', "refused without a message");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	const char *body = (const char *)data + 1;
	size_t len = size - 1;
	char err[256];
	memset(err, 0, sizeof(err));
	switch (data[0] % 4) {
	case 0: {
		struct kolo_rdzv_job_config cfg = {.min_np = 2, .max_np = 8, .settle_ms = 100};
		struct kolo_rdzv_job_config before = cfg;
		if (kolo_rdzv_parse_job_config(body, len, &cfg, err, sizeof(err)) == KOLO_OK) {
			FUZZ_CHECK(cfg.min_np >= 1 && cfg.min_np <= 1000000, "min_np %d",
			           cfg.min_np);
			FUZZ_CHECK(cfg.max_np == 0 ||
			                   (cfg.max_np >= cfg.min_np && cfg.max_np <= 1000000),
			           "max_np %d with min_np %d", cfg.max_np, cfg.min_np);
			FUZZ_CHECK(cfg.settle_ms >= 0 && cfg.settle_ms <= 3600000, "settle_ms %d",
			           cfg.settle_ms);
		} else {
			check_err(err, sizeof(err));
			FUZZ_CHECK(!memcmp(&cfg, &before, sizeof(cfg)),
			           "a refused body changed the job");
		}
		break;
	}
	case 1: {
		struct kolo_rdzv_join_req j;
		if (kolo_rdzv_parse_join(body, len, &j, err, sizeof(err)) == KOLO_OK) {
			FUZZ_CHECK(rule_ok(j.host, KOLO_RDZV_HOST_MAX, false), "host '%s'", j.host);
			FUZZ_CHECK(!j.worker_id[0] || rule_ok(j.worker_id, KOLO_RDZV_ID_MAX, false),
			           "worker_id '%s'", j.worker_id);
			FUZZ_CHECK((j.round == -1) == (j.rank == -1), "round %lld rank %d",
			           (long long)j.round, j.rank);
			FUZZ_CHECK(j.round == -1 || (j.round >= 1 && j.rank >= 0 && j.worker_id[0]),
			           "claim round %lld rank %d by '%s'", (long long)j.round, j.rank,
			           j.worker_id);
		} else {
			check_err(err, sizeof(err));
		}
		break;
	}
	case 2: {
		struct kolo_rdzv_failure f;
		if (kolo_rdzv_parse_failure(body, len, &f, err, sizeof(err)) == KOLO_OK)
			FUZZ_CHECK((f.round >= 0) == (f.rank >= 0) && f.rank <= 1000000 &&
			                   (f.worker_id[0] ? kolo_rdzv_valid_id(f.worker_id, false)
			                                   : f.round >= 0),
			           "round %lld rank %d by '%s'", (long long)f.round, f.rank,
			           f.worker_id);
		else
			check_err(err, sizeof(err));
		break;
	}
	default: {
		/* The id checks take C strings: the body up to its first NUL. */
		char s[1024];
		size_t n = len < sizeof(s) - 1 ? len : sizeof(s) - 1;
		memcpy(s, body, n);
		s[n] = '\0';
		FUZZ_CHECK(kolo_rdzv_valid_id(s, false) == rule_ok(s, KOLO_RDZV_ID_MAX, false),
		           "valid_id('%s')", s);
		FUZZ_CHECK(kolo_rdzv_valid_id(s, true) == rule_ok(s, KOLO_RDZV_ID_MAX, true),
		           "valid_id('%s', slash)", s);
		FUZZ_CHECK(kolo_rdzv_valid_host(s) == rule_ok(s, KOLO_RDZV_HOST_MAX, false),
		           "valid_host('%s')", s);
		break;
	}
	}
	return 0;
}
