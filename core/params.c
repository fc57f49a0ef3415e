/* params: the one table of KOLO_* variables (params.def) and its readers. */
#include "core.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const struct kolo_param_info table[KOLO_P_COUNT] = {
#define KOLO_PARAM(id, env, type, def, alias, help)                                                \
	[KOLO_P_##id] = {env, KOLO_PARAM_##type, def, alias, help},
#include "params.def"
#undef KOLO_PARAM
};

const struct kolo_param_info *kolo_param_info(enum kolo_param_id id)
{
	return (unsigned)id < KOLO_P_COUNT ? &table[id] : NULL;
}

const char *kolo_param_source(enum kolo_param_id id)
{
	const struct kolo_param_info *p = &table[id];
	if (getenv(p->env))
		return "env";
	if (p->alias[0] && getenv(p->alias))
		return "alias";
	return "default";
}

const char *kolo_param_str(enum kolo_param_id id)
{
	const struct kolo_param_info *p = &table[id];
	const char *v = getenv(p->env);
	if (v)
		return v;
	if (p->alias[0] && (v = getenv(p->alias)) != NULL)
		return v;
	return p->def;
}

static const char *alias_value(enum kolo_param_id id)
{
	const struct kolo_param_info *p = &table[id];
	return (!getenv(p->env) && p->alias[0]) ? getenv(p->alias) : NULL;
}

int64_t kolo_param_int(enum kolo_param_id id)
{
	const char *v = kolo_param_str(id);
	uint64_t bytes;
	if (id == KOLO_P_TIMEOUT_MS && alias_value(id)) /* Horovod's is in seconds */
		return (int64_t)(strtod(v, NULL) * 1000.0);
	if (v[0] != '-' && kolo_parse_size(v, &bytes) == KOLO_OK)
		return (int64_t)bytes;
	errno = 0;
	char *end;
	long long x = strtoll(v, &end, 0);
	if (errno || end == v) {
		KOLO_WARN("core", "%s=%s is not an integer; using %s", table[id].env, v,
		          table[id].def);
		return strtoll(table[id].def, NULL, 0);
	}
	return x;
}

double kolo_param_float(enum kolo_param_id id)
{
	const char *v = kolo_param_str(id);
	char *end;
	double x = strtod(v, &end);
	if (end == v) {
		KOLO_WARN("core", "%s=%s is not a number; using %s", table[id].env, v,
		          table[id].def);
		return strtod(table[id].def, NULL);
	}
	return x;
}

bool kolo_param_bool(enum kolo_param_id id)
{
	const char *v = kolo_param_str(id);
	return strcmp(v, "1") == 0 || strcasecmp(v, "true") == 0 || strcasecmp(v, "yes") == 0 ||
	       strcasecmp(v, "on") == 0;
}

kolo_status_t kolo_parse_size(const char *s, uint64_t *out)
{
	if (!s || !*s)
		return KOLO_EINVAL;
	errno = 0;
	char *end;
	unsigned long long x = strtoull(s, &end, 10);
	if (errno || end == s)
		return KOLO_EINVAL;
	uint64_t mult = 1;
	switch (*end) {
	case '\0':
		break;
	case 'k':
	case 'K':
		mult = 1ull << 10;
		end++;
		break;
	case 'm':
	case 'M':
		mult = 1ull << 20;
		end++;
		break;
	case 'g':
	case 'G':
		mult = 1ull << 30;
		end++;
		break;
	default:
		return KOLO_EINVAL;
	}
	if (*end && strcasecmp(end, "iB") != 0 && strcasecmp(end, "B") != 0)
		return KOLO_EINVAL;
	if (mult > 1 && x > UINT64_MAX / mult)
		return KOLO_EINVAL;
	*out = x * mult;
	return KOLO_OK;
}
