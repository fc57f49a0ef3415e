/* log: leveled, per-subsystem lines on stderr, prefixed with host and rank. */
#include "core.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

static pthread_once_t once = PTHREAD_ONCE_INIT;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static enum kolo_log_level min_level = KOLO_LOG_INFO;
static char subsystems[256] = "all";
static bool json;
static char ident_host[64];
static int ident_rank = -1;

static const char *const level_names[] = {"trace", "debug", "info", "warn", "error", "off"};

static void configure_once(void)
{
	const char *lv = kolo_param_str(KOLO_P_LOG_LEVEL);
	for (int i = 0; i <= KOLO_LOG_OFF; i++) {
		if (strcasecmp(lv, level_names[i]) == 0)
			min_level = (enum kolo_log_level)i;
	}
	if (strcasecmp(lv, "warning") == 0)
		min_level = KOLO_LOG_WARN;
	if (strcasecmp(lv, "fatal") == 0)
		min_level = KOLO_LOG_ERROR;
	snprintf(subsystems, sizeof(subsystems), "%s", kolo_param_str(KOLO_P_LOG_SUBSYS));
	json = strcmp(kolo_param_str(KOLO_P_LOG_FORMAT), "json") == 0;
}

void kolo_log_configure(void)
{
	pthread_once(&once, configure_once);
}

void kolo_log_set_level(enum kolo_log_level level)
{
	kolo_log_configure();
	pthread_mutex_lock(&lock);
	min_level = level;
	pthread_mutex_unlock(&lock);
}

void kolo_log_set_identity(const char *host, int rank)
{
	pthread_mutex_lock(&lock);
	snprintf(ident_host, sizeof(ident_host), "%s", host ? host : "");
	ident_rank = rank;
	pthread_mutex_unlock(&lock);
}

static bool subsys_on(const char *subsys)
{
	if (strcmp(subsystems, "all") == 0 || !subsys)
		return true;
	size_t n = strlen(subsys);
	for (const char *p = subsystems; (p = strstr(p, subsys)) != NULL; p += n) {
		bool start = p == subsystems || p[-1] == ',';
		bool end = p[n] == '\0' || p[n] == ',';
		if (start && end)
			return true;
	}
	return false;
}

bool kolo_log_enabled(enum kolo_log_level level, const char *subsys)
{
	kolo_log_configure();
	/* Errors and warnings are always shown; the subsystem filter narrows
	 * the chatter below them. */
	return level >= min_level && (level >= KOLO_LOG_WARN || subsys_on(subsys));
}

static void json_escape(char *out, size_t size, const char *in)
{
	size_t o = 0;
	for (; *in && o + 7 < size; in++) {
		unsigned char c = (unsigned char)*in;
		if (c == '"' || c == '\\') {
			out[o++] = '\\';
			out[o++] = (char)c;
		} else if (c < 0x20) {
			o += (size_t)snprintf(out + o, size - o, "\\u%04x", c);
		} else {
			out[o++] = (char)c;
		}
	}
	out[o] = '\0';
}

void kolo_log(enum kolo_log_level level, const char *subsys, const char *fmt, ...)
{
	if (!kolo_log_enabled(level, subsys))
		return;
	char msg[2048];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);

	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	struct tm tm;
	gmtime_r(&ts.tv_sec, &tm);
	char when[96];
	snprintf(when, sizeof(when), "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ", tm.tm_year + 1900,
	         tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000);

	char line[2800];
	pthread_mutex_lock(&lock);
	if (json) {
		char esc[2200];
		json_escape(esc, sizeof(esc), msg);
		snprintf(line, sizeof(line),
		         "{\"ts\":\"%s\",\"level\":\"%s\",\"subsys\":\"%s\",\"host\":\"%s\","
		         "\"rank\":%d,\"pid\":%d,\"msg\":\"%s\"}\n",
		         when, level_names[level], subsys ? subsys : "", ident_host, ident_rank,
		         (int)getpid(), esc);
	} else if (ident_rank >= 0) {
		snprintf(line, sizeof(line), "%s kolo %s %s:%d %s: %s\n", when, level_names[level],
		         ident_host, ident_rank, subsys ? subsys : "", msg);
	} else {
		snprintf(line, sizeof(line), "%s kolo %s %s: %s\n", when, level_names[level],
		         subsys ? subsys : "", msg);
	}
	pthread_mutex_unlock(&lock);
	/* One write per line keeps lines whole when processes share stderr. */
	ssize_t ignored = write(STDERR_FILENO, line, strlen(line));
	(void)ignored;
}
