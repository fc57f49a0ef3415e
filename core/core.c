/* core: status strings, dtypes, time, randomness, HMAC, strings, files. */
#include "core.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

KOLO_API const char *kolo_strerror(kolo_status_t status)
{
	switch (status) {
#define X(name, value, text)                                                                       \
	case KOLO_##name:                                                                          \
		return text;
		KOLO_STATUS_MAP(X)
#undef X
	}
	return "unknown status";
}

KOLO_API const char *kolo_status_name(kolo_status_t status)
{
	switch (status) {
#define X(name, value, text)                                                                       \
	case KOLO_##name:                                                                          \
		return "KOLO_" #name;
		KOLO_STATUS_MAP(X)
#undef X
	}
	return "KOLO_UNKNOWN";
}

static const struct {
	const char *name;
	size_t size;
} dtypes[KOLO_DTYPE_COUNT] = {
        [KOLO_INT8] = {"int8", 1},       [KOLO_UINT8] = {"uint8", 1},
        [KOLO_INT32] = {"int32", 4},     [KOLO_INT64] = {"int64", 8},
        [KOLO_FLOAT16] = {"float16", 2}, [KOLO_BFLOAT16] = {"bfloat16", 2},
        [KOLO_FLOAT32] = {"float32", 4}, [KOLO_FLOAT64] = {"float64", 8},
};

static const char *const ops[KOLO_OP_COUNT] = {
        [KOLO_SUM] = "sum", [KOLO_AVERAGE] = "average", [KOLO_MIN] = "min",
        [KOLO_MAX] = "max", [KOLO_PRODUCT] = "product",
};

KOLO_API size_t kolo_dtype_size(kolo_dtype_t dtype)
{
	return (unsigned)dtype < KOLO_DTYPE_COUNT ? dtypes[dtype].size : 0;
}

KOLO_API const char *kolo_dtype_name(kolo_dtype_t dtype)
{
	return (unsigned)dtype < KOLO_DTYPE_COUNT ? dtypes[dtype].name : "invalid";
}

KOLO_API kolo_status_t kolo_dtype_parse(const char *name, kolo_dtype_t *out)
{
	static const struct {
		const char *alias;
		kolo_dtype_t dtype;
	} aliases[] = {{"half", KOLO_FLOAT16},   {"bf16", KOLO_BFLOAT16}, {"float", KOLO_FLOAT32},
	               {"double", KOLO_FLOAT64}, {"int", KOLO_INT32},     {"fp16", KOLO_FLOAT16},
	               {"fp32", KOLO_FLOAT32},   {"fp64", KOLO_FLOAT64}};
	if (!name)
		return KOLO_EINVAL;
	for (int i = 0; i < KOLO_DTYPE_COUNT; i++) {
		if (strcmp(name, dtypes[i].name) == 0) {
			*out = (kolo_dtype_t)i;
			return KOLO_OK;
		}
	}
	for (size_t i = 0; i < KOLO_ARRAY_SIZE(aliases); i++) {
		if (strcmp(name, aliases[i].alias) == 0) {
			*out = aliases[i].dtype;
			return KOLO_OK;
		}
	}
	return KOLO_EINVAL;
}

KOLO_API const char *kolo_op_name(kolo_op_t op)
{
	if (op == KOLO_ADASUM)
		return "adasum";
	return (unsigned)op < KOLO_OP_COUNT ? ops[op] : "invalid";
}

KOLO_API kolo_status_t kolo_op_parse(const char *name, kolo_op_t *out)
{
	if (!name)
		return KOLO_EINVAL;
	for (int i = 0; i < KOLO_OP_COUNT; i++) {
		if (strcmp(name, ops[i]) == 0) {
			*out = (kolo_op_t)i;
			return KOLO_OK;
		}
	}
	if (strcmp(name, "adasum") == 0) {
		*out = KOLO_ADASUM;
		return KOLO_OK;
	}
	if (strcmp(name, "avg") == 0 || strcmp(name, "mean") == 0) {
		*out = KOLO_AVERAGE;
		return KOLO_OK;
	}
	if (strcmp(name, "prod") == 0) {
		*out = KOLO_PRODUCT;
		return KOLO_OK;
	}
	return KOLO_EINVAL;
}

KOLO_API size_t kolo_reducescatter_count(size_t count, int size, int rank)
{
	if (size <= 0 || rank < 0 || rank >= size)
		return 0;
	size_t base = count / (size_t)size;
	return base + ((size_t)rank < count % (size_t)size ? 1 : 0);
}

kolo_status_t kolo_vfail(struct kolo_errbuf *eb, kolo_status_t st, const char *fmt, va_list ap)
{
	char msg[KOLO_ERRBUF_SIZE];
	vsnprintf(msg, sizeof(msg), fmt, ap);
	if (eb)
		memcpy(eb->msg, msg, sizeof(msg));
	KOLO_DEBUG("core", "%s: %s", kolo_status_name(st), msg);
	return st;
}

kolo_status_t kolo_fail(struct kolo_errbuf *eb, kolo_status_t st, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	kolo_vfail(eb, st, fmt, ap);
	va_end(ap);
	return st;
}

/* ---- time ---- */

uint64_t kolo_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t kolo_now_ms(void)
{
	return kolo_now_ns() / 1000000ull;
}

uint64_t kolo_wall_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000ull + (uint64_t)ts.tv_nsec / 1000ull;
}

void kolo_sleep_ms(uint64_t ms)
{
	struct timespec ts = {.tv_sec = (time_t)(ms / 1000),
	                      .tv_nsec = (long)(ms % 1000) * 1000000L};
	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

void kolo_deadline_ts(struct timespec *ts, int clock, int ms)
{
	clock_gettime((clockid_t)clock, ts);
	ts->tv_sec += ms / 1000;
	ts->tv_nsec += (long)(ms % 1000) * 1000000L;
	if (ts->tv_nsec >= 1000000000L) {
		ts->tv_sec++;
		ts->tv_nsec -= 1000000000L;
	}
}

/* ---- randomness and authentication ---- */

kolo_status_t kolo_random_bytes(void *buf, size_t len)
{
	uint8_t *p = buf;
	while (len > 0) {
		ssize_t n = getrandom(p, len, 0);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return KOLO_ESYSTEM;
		}
		p += n;
		len -= (size_t)n;
	}
	return KOLO_OK;
}

uint64_t kolo_random_below(uint64_t bound)
{
	/* Rejection sampling keeps the distribution uniform. */
	uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
	uint64_t x;
	do {
		if (kolo_random_bytes(&x, sizeof(x)) != KOLO_OK)
			x = kolo_now_ns() * 0x9e3779b97f4a7c15ull;
	} while (x >= limit);
	return x % bound;
}

kolo_status_t kolo_random_hex(char *out, size_t len)
{
	static const char hex[] = "0123456789abcdef";
	uint8_t bytes[256];
	if (len > sizeof(bytes))
		return KOLO_EINVAL;
	KOLO_CHECK(kolo_random_bytes(bytes, len));
	for (size_t i = 0; i < len; i++) {
		out[2 * i] = hex[bytes[i] >> 4];
		out[2 * i + 1] = hex[bytes[i] & 15];
	}
	out[2 * len] = '\0';
	return KOLO_OK;
}

static void crypto_init(void)
{
	/* Without NO_ATEXIT, OpenSSL frees its state from an exit handler. A
	 * program that calls exit() while a kolo thread still runs (the
	 * heartbeat, an embedded rendezvous server checking a token, a
	 * handshake) would have that thread use freed locks and crash. The
	 * state it leaves stays reachable until the process ends. */
	OPENSSL_init_crypto(OPENSSL_INIT_NO_ATEXIT, NULL);
}

void kolo_crypto_init(void)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;
	pthread_once(&once, crypto_init);
}

void kolo_hmac_sha256(const void *key, size_t keylen, const void *msg, size_t msglen,
                      uint8_t out[KOLO_HMAC_SIZE])
{
	kolo_crypto_init();
	unsigned int outlen = KOLO_HMAC_SIZE;
	static const uint8_t empty = 0;
	HMAC(EVP_sha256(), keylen ? key : &empty, (int)keylen, msg, msglen, out, &outlen);
}

bool kolo_consttime_equal(const void *a, const void *b, size_t len)
{
	return CRYPTO_memcmp(a, b, len) == 0;
}

bool kolo_consttime_streq(const char *a, const char *b)
{
	/* Compare MACs of both strings: the time depends on the lengths only,
	 * and a length difference leaks nothing about the content. */
	static const uint8_t key[16] = "kolo-streq-key";
	uint8_t ma[KOLO_HMAC_SIZE], mb[KOLO_HMAC_SIZE];
	kolo_hmac_sha256(key, sizeof(key), a, strlen(a), ma);
	kolo_hmac_sha256(key, sizeof(key), b, strlen(b), mb);
	return CRYPTO_memcmp(ma, mb, sizeof(ma)) == 0;
}

/* ---- strings and files ---- */

kolo_status_t kolo_strfmt(char *out, size_t size, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(out, size, fmt, ap);
	va_end(ap);
	return (n < 0 || (size_t)n >= size) ? KOLO_EINVAL : KOLO_OK;
}

kolo_status_t kolo_read_file(const char *path, size_t max, char **out, size_t *len)
{
	*out = NULL;
	FILE *f = fopen(path, "rb");
	if (!f)
		return errno == ENOENT ? KOLO_ENOTFOUND : KOLO_ESYSTEM;
	char *buf = malloc(max + 1);
	if (!buf) {
		fclose(f);
		return KOLO_ENOMEM;
	}
	size_t n = fread(buf, 1, max + 1, f);
	int err = ferror(f);
	fclose(f);
	if (err || n > max) {
		free(buf);
		return err ? KOLO_ESYSTEM : KOLO_EINVAL;
	}
	while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ' ||
	                 buf[n - 1] == '\t'))
		n--;
	buf[n] = '\0';
	*out = buf;
	if (len)
		*len = n;
	return KOLO_OK;
}

int kolo_cpu_quota_parse(const char *text)
{
	char quota[32];
	long long period = 0;
	if (!text || sscanf(text, "%31s %lld", quota, &period) != 2 || period <= 0)
		return 0;
	char *end;
	errno = 0;
	long long q = strtoll(quota, &end, 10);
	if (errno || *end || q <= 0) /* "max" or -1: no limit */
		return 0;
	long long n = (q + period - 1) / period;
	return n > INT_MAX ? INT_MAX : (int)n;
}

/* The quota of cgroup v1, whose two numbers live in two files. */
static int cpu_quota_v1(void)
{
	char *q = NULL, *p = NULL, text[96];
	int n = 0;
	if (kolo_read_file("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", 64, &q, NULL) == KOLO_OK &&
	    kolo_read_file("/sys/fs/cgroup/cpu/cpu.cfs_period_us", 64, &p, NULL) == KOLO_OK &&
	    kolo_strfmt(text, sizeof(text), "%s %s", q, p) == KOLO_OK)
		n = kolo_cpu_quota_parse(text);
	free(q);
	free(p);
	return n;
}

/* The tightest cpu.max of cgroup v2 from this process's cgroup up to the
 * root (in a container with its own cgroup namespace the path is "/"). */
static int cpu_quota_v2(void)
{
	char *self = NULL;
	if (kolo_read_file("/proc/self/cgroup", 4096, &self, NULL) != KOLO_OK)
		return 0;
	char *line = strstr(self, "0::");
	if (!line || (line != self && line[-1] != '\n')) {
		free(self);
		return 0; /* no cgroup v2 */
	}
	char path[1024];
	size_t len = strcspn(line + 3, "\n");
	while (len > 0 && line[3 + len - 1] == '/')
		len--;
	if (kolo_strfmt(path, sizeof(path), "/sys/fs/cgroup%.*s", (int)len, line + 3) != KOLO_OK) {
		free(self);
		return 0;
	}
	free(self);
	int best = 0;
	for (;;) {
		char file[1100], *max = NULL;
		if (kolo_strfmt(file, sizeof(file), "%s/cpu.max", path) == KOLO_OK &&
		    kolo_read_file(file, 64, &max, NULL) == KOLO_OK) {
			int q = kolo_cpu_quota_parse(max);
			if (q > 0 && (best == 0 || q < best))
				best = q;
		}
		free(max);
		if (strcmp(path, "/sys/fs/cgroup") == 0)
			break;
		*strrchr(path, '/') = '\0';
	}
	return best;
}

int kolo_cpu_count(void)
{
	cpu_set_t set;
	long n = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set)
	                                                      : sysconf(_SC_NPROCESSORS_ONLN);
	/* Hybrid hierarchies keep the cpu controller in v1. */
	int quota = cpu_quota_v2();
	if (quota <= 0)
		quota = cpu_quota_v1();
	if (quota > 0 && quota < n)
		n = quota;
	return n > 0 ? (int)KOLO_MIN(n, (long)INT_MAX) : 1;
}

kolo_status_t kolo_hostname(char *out, size_t size)
{
	const char *h = kolo_param_str(KOLO_P_HOSTNAME);
	if (h[0])
		return kolo_strfmt(out, size, "%s", h);
	if (gethostname(out, size) != 0)
		return KOLO_ESYSTEM;
	out[size - 1] = '\0';
	return KOLO_OK;
}

kolo_status_t kolo_token_load(char **out, struct kolo_errbuf *eb)
{
	*out = NULL;
	const char *tok = kolo_param_str(KOLO_P_TOKEN);
	if (tok[0]) {
		*out = strdup(tok);
		return *out ? KOLO_OK : KOLO_ENOMEM;
	}
	const char *path = kolo_param_str(KOLO_P_TOKEN_FILE);
	if (!path[0]) {
		*out = strdup("");
		return *out ? KOLO_OK : KOLO_ENOMEM;
	}
	kolo_status_t st = kolo_read_file(path, 4096, out, NULL);
	if (st != KOLO_OK)
		return kolo_fail(eb, st, "cannot read token file %s: %s", path, strerror(errno));
	if (!(*out)[0]) {
		free(*out);
		*out = NULL;
		return kolo_fail(eb, KOLO_EINVAL, "token file %s is empty", path);
	}
	return KOLO_OK;
}
