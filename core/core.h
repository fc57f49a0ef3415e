/* core: what every module shares. Status codes, logging, parameters, time,
 * randomness, HMAC and small string helpers. Nothing here knows about ranks,
 * transports or collectives. */
#ifndef KOLO_CORE_H
#define KOLO_CORE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kolo/kolo.h"

#define KOLO_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define KOLO_MIN(a, b)     ((a) < (b) ? (a) : (b))
#define KOLO_MAX(a, b)     ((a) > (b) ? (a) : (b))
#define kolo_container_of(ptr, type, member)                                                       \
	((type *)(void *)((char *)(ptr)-offsetof(type, member)))

/* ---- logging ---------------------------------------------------------- */

enum kolo_log_level {
	KOLO_LOG_TRACE = 0,
	KOLO_LOG_DEBUG,
	KOLO_LOG_INFO,
	KOLO_LOG_WARN,
	KOLO_LOG_ERROR,
	KOLO_LOG_OFF,
};

/* Reads KOLO_LOG_LEVEL / KOLO_LOG_SUBSYS / KOLO_LOG_FORMAT once. Called
 * lazily by the first log call; safe to call again. */
void kolo_log_configure(void);
/* Every line is prefixed with host and rank once they are known; rank < 0
 * means not assigned yet. Thread-safe. */
void kolo_log_set_identity(const char *host, int rank);
/* true when a message at this level for this subsystem would be printed. */
bool kolo_log_enabled(enum kolo_log_level level, const char *subsys);
void kolo_log_set_level(enum kolo_log_level level);
/* Writes one line to stderr (text or JSON per KOLO_LOG_FORMAT). Thread-safe. */
void kolo_log(enum kolo_log_level level, const char *subsys, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));

#define KOLO_TRACE(subsys, ...) kolo_log(KOLO_LOG_TRACE, subsys, __VA_ARGS__)
#define KOLO_DEBUG(subsys, ...) kolo_log(KOLO_LOG_DEBUG, subsys, __VA_ARGS__)
#define KOLO_INFO(subsys, ...)  kolo_log(KOLO_LOG_INFO, subsys, __VA_ARGS__)
#define KOLO_WARN(subsys, ...)  kolo_log(KOLO_LOG_WARN, subsys, __VA_ARGS__)
#define KOLO_ERROR(subsys, ...) kolo_log(KOLO_LOG_ERROR, subsys, __VA_ARGS__)

/* Returns `st` from the current function when it is not KOLO_OK, logging the
 * place at debug level. */
#define KOLO_CHECK(expr)                                                                           \
	do {                                                                                       \
		kolo_status_t check_st_ = (expr);                                                  \
		if (check_st_ != KOLO_OK) {                                                        \
			KOLO_DEBUG("core", "%s:%d: %s -> %s", __FILE__, __LINE__, #expr,           \
			           kolo_status_name(check_st_));                                   \
			return check_st_;                                                          \
		}                                                                                  \
	} while (0)

/* ---- error messages --------------------------------------------------- */

#define KOLO_ERRBUF_SIZE 512
/* A last-error string owned by an object (comm, client, transport). */
struct kolo_errbuf {
	char msg[KOLO_ERRBUF_SIZE];
};
/* Formats the message into eb (when not NULL), logs it at debug level and
 * returns st, so that `return kolo_fail(eb, KOLO_EINVAL, "...")` reads well. */
kolo_status_t kolo_fail(struct kolo_errbuf *eb, kolo_status_t st, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));
/* kolo_fail with a va_list, for the wrappers that name the errbuf of an
 * object (kolo_comm_fail). */
kolo_status_t kolo_vfail(struct kolo_errbuf *eb, kolo_status_t st, const char *fmt, va_list ap)
        __attribute__((format(printf, 3, 0)));

/* ---- parameters ------------------------------------------------------- */

enum kolo_param_type { KOLO_PARAM_INT, KOLO_PARAM_FLOAT, KOLO_PARAM_STRING, KOLO_PARAM_BOOL };

enum kolo_param_id {
#define KOLO_PARAM(id, env, type, def, alias, help) KOLO_P_##id,
#include "params.def"
#undef KOLO_PARAM
	KOLO_P_COUNT
};

struct kolo_param_info {
	const char *env;
	enum kolo_param_type type;
	const char *def;
	const char *alias; /* "" when none */
	const char *help;
};

const struct kolo_param_info *kolo_param_info(enum kolo_param_id id);
/* The raw string: the KOLO_ variable, else its alias, else the default.
 * Never NULL. Reads the environment on every call: call once at init, not in
 * a hot path. */
const char *kolo_param_str(enum kolo_param_id id);
int64_t kolo_param_int(enum kolo_param_id id);
double kolo_param_float(enum kolo_param_id id);
bool kolo_param_bool(enum kolo_param_id id);
/* Where the value came from: "env", "alias" or "default". */
const char *kolo_param_source(enum kolo_param_id id);
/* Parses sizes such as "64M", "1G", "4096", "128KiB" into bytes. */
kolo_status_t kolo_parse_size(const char *s, uint64_t *out);

/* ---- time ------------------------------------------------------------- */

/* CLOCK_MONOTONIC in nanoseconds / milliseconds. */
uint64_t kolo_now_ns(void);
uint64_t kolo_now_ms(void);
/* CLOCK_REALTIME in microseconds (for logs and traces). */
uint64_t kolo_wall_us(void);
/* Sleeps for ms milliseconds (restarts on EINTR). Not for synchronisation. */
void kolo_sleep_ms(uint64_t ms);
struct timespec;
/* *ts = now on clock (CLOCK_MONOTONIC, CLOCK_REALTIME) plus ms: the
 * deadline of a pthread_cond_timedwait on a condition of that clock. */
void kolo_deadline_ts(struct timespec *ts, int clock, int ms);

/* ---- randomness and authentication ------------------------------------ */

/* Fills buf with len bytes from the kernel's CSPRNG. */
kolo_status_t kolo_random_bytes(void *buf, size_t len);
/* A uniformly distributed integer in [0, bound). bound > 0. */
uint64_t kolo_random_below(uint64_t bound);
/* Lower-case hex encoding of len random bytes into out (2*len+1 bytes). */
kolo_status_t kolo_random_hex(char *out, size_t len);

#define KOLO_HMAC_SIZE 32
/* Initialises OpenSSL once, without its exit handler (see core.c). Called
 * by kolo_hmac_sha256 and before libcurl, which would otherwise initialise
 * OpenSSL first, with the handler. */
void kolo_crypto_init(void);
/* HMAC-SHA256(key, msg). */
void kolo_hmac_sha256(const void *key, size_t keylen, const void *msg, size_t msglen,
                      uint8_t out[KOLO_HMAC_SIZE]);
/* Compares in time that depends only on len. Returns true when equal. */
bool kolo_consttime_equal(const void *a, const void *b, size_t len);
/* Compares two strings in time that depends only on their lengths. */
bool kolo_consttime_streq(const char *a, const char *b);

/* ---- strings and files ------------------------------------------------ */

/* snprintf that reports truncation: KOLO_EINVAL when out was too small. */
kolo_status_t kolo_strfmt(char *out, size_t size, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));
/* Reads a whole small file (≤ max bytes) into a new NUL-terminated buffer,
 * trailing whitespace removed. The caller frees *out. */
kolo_status_t kolo_read_file(const char *path, size_t max, char **out, size_t *len);
/* CPUs this process can use: those of its affinity mask, capped by a cgroup
 * CPU quota (cgroup v2 cpu.max, or v1 cfs_quota_us / cfs_period_us), rounded
 * up. A container limited to 2 CPUs on a 64-CPU node counts 2. ≥ 1. */
int kolo_cpu_count(void);
/* The CPUs a quota allows, rounded up: quota / period as in cgroup v2's
 * cpu.max ("max 100000" or "200000 100000"). 0 when there is no limit or the
 * text is not a quota. For tests. */
int kolo_cpu_quota_parse(const char *cpu_max);
/* The host name to report: KOLO_HOSTNAME when set, else gethostname(). */
kolo_status_t kolo_hostname(char *out, size_t size);
/* The job's shared secret from KOLO_TOKEN or KOLO_TOKEN_FILE; "" when none.
 * The caller frees *out. */
kolo_status_t kolo_token_load(char **out, struct kolo_errbuf *eb);

#endif /* KOLO_CORE_H */
