/* The pure side of preemption notices: the providers' documents parsed,
 * the provider list and the endpoint overrides read. No I/O. */
#include "preempt.h"

#include <ctype.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

static void copy_out(char *out, size_t size, const char *s)
{
	if (out && size)
		snprintf(out, size, "%s", s ? s : "");
}

static const char *str_member(json_t *obj, const char *key)
{
	json_t *v = json_object_get(obj, key);
	return json_is_string(v) ? json_string_value(v) : NULL;
}

static json_t *load(const char *body, size_t len)
{
	if (!body || !len)
		return NULL;
	json_t *j = json_loadb(body, len, 0, NULL);
	if (j && !json_is_object(j)) {
		json_decref(j);
		return NULL;
	}
	return j;
}

kolo_status_t kolo_preempt_parse_providers(const char *list, unsigned *mask, bool *probe,
                                           struct kolo_errbuf *eb)
{
	static const struct {
		const char *name;
		unsigned bit;
	} names[] = {
	        {"aws", KOLO_PREEMPT_AWS},
	        {"gce", KOLO_PREEMPT_GCE},
	        {"azure", KOLO_PREEMPT_AZURE},
	        {"k8s", KOLO_PREEMPT_K8S},
	};
	*mask = 0;
	*probe = false;
	if (!list)
		return KOLO_OK;
	const char *p = list;
	unsigned m = 0;
	bool is_auto = false, off = false;
	int items = 0;
	while (*p) {
		while (*p == ',' || isspace((unsigned char)*p))
			p++;
		if (!*p)
			break;
		const char *start = p;
		while (*p && *p != ',' && !isspace((unsigned char)*p))
			p++;
		size_t n = (size_t)(p - start);
		items++;
		bool found = false;
		for (size_t i = 0; i < KOLO_ARRAY_SIZE(names); i++) {
			if (strlen(names[i].name) == n &&
			    strncasecmp(start, names[i].name, n) == 0) {
				m |= names[i].bit;
				found = true;
			}
		}
		if (found)
			continue;
		if ((n == 4 && strncasecmp(start, "auto", n) == 0)) {
			is_auto = true;
		} else if ((n == 1 && *start == '0') ||
		           (n == 3 && strncasecmp(start, "off", n) == 0) ||
		           (n == 4 && strncasecmp(start, "none", n) == 0)) {
			off = true;
		} else {
			return kolo_fail(
			        eb, KOLO_EINVAL,
			        "KOLO_PREEMPTION: unknown provider '%.*s' in '%s' (a list of "
			        "aws, gce, azure, k8s; or auto; or off)",
			        (int)KOLO_MIN(n, 64), start, list);
		}
	}
	if ((is_auto || off) && items > 1)
		return kolo_fail(eb, KOLO_EINVAL,
		                 "KOLO_PREEMPTION: '%s': auto and off stand alone, not in a list",
		                 list);
	if (is_auto) {
		*mask = KOLO_PREEMPT_ALL;
		*probe = true;
	} else if (!off) {
		*mask = m;
	}
	return KOLO_OK;
}

bool kolo_preempt_parse_aws_action(const char *body, size_t len, char *action, size_t alen,
                                   char *when, size_t wlen)
{
	copy_out(action, alen, "");
	copy_out(when, wlen, "");
	json_t *j = load(body, len);
	if (!j)
		return false;
	const char *a = str_member(j, "action");
	bool notice = a && (strcmp(a, "terminate") == 0 || strcmp(a, "stop") == 0 ||
	                    strcmp(a, "hibernate") == 0);
	if (notice) {
		copy_out(action, alen, a);
		copy_out(when, wlen, str_member(j, "time"));
	}
	json_decref(j);
	return notice;
}

bool kolo_preempt_parse_aws_rebalance(const char *body, size_t len, char *when, size_t wlen)
{
	copy_out(when, wlen, "");
	json_t *j = load(body, len);
	if (!j)
		return false;
	const char *t = str_member(j, "noticeTime");
	if (t)
		copy_out(when, wlen, t);
	json_decref(j);
	return t != NULL;
}

bool kolo_preempt_parse_gce(const char *body, size_t len)
{
	if (!body)
		return false;
	while (len && isspace((unsigned char)*body))
		body++, len--;
	while (len && isspace((unsigned char)body[len - 1]))
		len--;
	return len == 4 && strncmp(body, "TRUE", 4) == 0;
}

static bool names_vm(json_t *resources, const char *vm)
{
	if (!vm || !*vm)
		return true;
	if (!json_is_array(resources))
		return false;
	size_t i;
	json_t *r;
	json_array_foreach(resources, i, r)
	{
		if (json_is_string(r) && strcasecmp(json_string_value(r), vm) == 0)
			return true;
	}
	return false;
}

bool kolo_preempt_parse_azure(const char *body, size_t len, const char *vm, char *id, size_t ilen,
                              char *not_before, size_t nlen)
{
	copy_out(id, ilen, "");
	copy_out(not_before, nlen, "");
	json_t *j = load(body, len);
	if (!j)
		return false;
	json_t *events = json_object_get(j, "Events");
	bool found = false;
	size_t i;
	json_t *e;
	if (json_is_array(events)) {
		json_array_foreach(events, i, e)
		{
			const char *type = str_member(e, "EventType");
			if (!type || strcmp(type, "Preempt") != 0 ||
			    !names_vm(json_object_get(e, "Resources"), vm))
				continue;
			copy_out(id, ilen, str_member(e, "EventId"));
			copy_out(not_before, nlen, str_member(e, "NotBefore"));
			found = true;
			break;
		}
	}
	json_decref(j);
	return found;
}

bool kolo_preempt_parse_pod(const char *body, size_t len, char *reason, size_t rlen, char *deleted,
                            size_t dlen)
{
	copy_out(reason, rlen, "");
	copy_out(deleted, dlen, "");
	json_t *j = load(body, len);
	if (!j)
		return false;
	json_t *conds = json_object_get(json_object_get(j, "status"), "conditions");
	bool found = false;
	size_t i;
	json_t *c;
	if (json_is_array(conds)) {
		json_array_foreach(conds, i, c)
		{
			const char *type = str_member(c, "type");
			const char *status = str_member(c, "status");
			if (!type || !status || strcmp(type, "DisruptionTarget") != 0 ||
			    strcmp(status, "True") != 0)
				continue;
			const char *r = str_member(c, "reason");
			const char *m = str_member(c, "message");
			if (reason && rlen)
				snprintf(reason, rlen, "%s%s%s", r ? r : "", r && m ? ": " : "",
				         m ? m : "");
			found = true;
			break;
		}
	}
	if (found)
		copy_out(deleted, dlen,
		         str_member(json_object_get(j, "metadata"), "deletionTimestamp"));
	json_decref(j);
	return found;
}

/* Days from 1970-01-01 to y-m-d of the proleptic Gregorian calendar
 * (Howard Hinnant's days_from_civil): timegm() is not C11. */
static int64_t days_from_civil(int64_t y, int m, int d)
{
	y -= m <= 2;
	int64_t era = (y >= 0 ? y : y - 399) / 400;
	int64_t yoe = y - era * 400;
	int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
	int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
	return era * 146097 + doe - 719468;
}

static bool civil_ms(int y, int mo, int d, int h, int mi, int s, int64_t *out)
{
	if (y < 1970 || y > 9999 || mo < 1 || mo > 12 || d < 1 || d > 31 || h < 0 || h > 23 ||
	    mi < 0 || mi > 59 || s < 0 || s > 60)
		return false;
	*out = ((days_from_civil(y, mo, d) * 24 + h) * 60 + mi) * 60000 + (int64_t)s * 1000;
	return true;
}

/* RFC 3339: 2026-12-07T14:32:00Z, 2026-12-07T14:32:00.25+01:00. */
static bool parse_rfc3339(const char *s, int64_t *out)
{
	int y, mo, d, h, mi, sec, n = 0;
	if (sscanf(s, "%4d-%2d-%2d%*1[Tt ]%2d:%2d:%2d%n", &y, &mo, &d, &h, &mi, &sec, &n) != 6 ||
	    n != 19 || !civil_ms(y, mo, d, h, mi, sec, out))
		return false;
	s += n;
	if (*s == '.') {
		int64_t scale = 100;
		for (s++; isdigit((unsigned char)*s); s++, scale /= 10)
			*out += (*s - '0') * scale;
	}
	if ((*s == 'Z' || *s == 'z') && !s[1])
		return true;
	int oh, om;
	n = 0;
	if ((*s != '+' && *s != '-') || sscanf(s + 1, "%2d:%2d%n", &oh, &om, &n) != 2 || n != 5 ||
	    s[6] || oh > 23 || om > 59)
		return false;
	*out -= (*s == '+' ? 1 : -1) * ((int64_t)oh * 60 + om) * 60000;
	return true;
}

/* RFC 1123 (HTTP's date): Mon, 07 Dec 2026 14:32:00 GMT. */
static bool parse_rfc1123(const char *s, int64_t *out)
{
	static const char months[] = "JanFebMarAprMayJunJulAugSepOctNovDec";
	char wday[4], mon[4], zone[4];
	int d, y, h, mi, sec, n = 0;
	if (sscanf(s, "%3s, %2d %3s %4d %2d:%2d:%2d %3s%n", wday, &d, mon, &y, &h, &mi, &sec, zone,
	           &n) != 8 ||
	    s[n] || strlen(mon) != 3 || (strcmp(zone, "GMT") != 0 && strcmp(zone, "UTC") != 0))
		return false;
	const char *m = strstr(months, mon);
	return m && (m - months) % 3 == 0 &&
	       civil_ms(y, (int)(m - months) / 3 + 1, d, h, mi, sec, out);
}

bool kolo_preempt_parse_time(const char *s, int64_t *unix_ms)
{
	if (!s)
		return false;
	while (isspace((unsigned char)*s))
		s++;
	int64_t t;
	if (!*s || !(isdigit((unsigned char)*s) ? parse_rfc3339(s, &t) : parse_rfc1123(s, &t)))
		return false;
	*unix_ms = t;
	return true;
}

void kolo_preempt_format_time(int64_t unix_ms, char *out, size_t size)
{
	int64_t secs = unix_ms >= 0 ? unix_ms / 1000 : 0, days = secs / 86400;
	int sod = (int)(secs % 86400);
	/* civil_from_days, the inverse of days_from_civil. */
	int64_t z = days + 719468, era = z / 146097, doe = z - era * 146097;
	int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
	int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100), mp = (5 * doy + 2) / 153;
	int d = (int)(doy - (153 * mp + 2) / 5 + 1), m = (int)(mp < 10 ? mp + 3 : mp - 9);
	int64_t y = yoe + era * 400 + (m <= 2);
	snprintf(out, size, "%04lld-%02d-%02dT%02d:%02d:%02dZ", (long long)y, m, d, sod / 3600,
	         sod / 60 % 60, sod % 60);
}

void kolo_preempt_base_url(const char *override, bool host_only, const char *def, char *out,
                           size_t size)
{
	if (!override)
		override = "";
	while (isspace((unsigned char)*override))
		override++;
	size_t n = strlen(override);
	while (n && (isspace((unsigned char) override[n - 1]) || override[n - 1] == '/'))
		n--;
	if (!n) {
		snprintf(out, size, "%s", def);
		return;
	}
	bool has_scheme = strstr(override, "://") != NULL;
	snprintf(out, size, "%s%.*s", host_only && !has_scheme ? "http://" : "", (int)n, override);
}
