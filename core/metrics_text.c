/* metrics_text: the Prometheus text exposition format 0.0.4, written into a
 * growing buffer: families (# HELP, # TYPE), samples, histograms, label
 * lists with their values escaped. Knows nothing of kolo's metrics. */
#include "metrics.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bytes.h"

#define TEXT_MIN_CAP (64u << 10) /* one allocation for a typical scrape */

static void text_put(struct kolo_metrics_text *t, const char *s, size_t n)
{
	if (!t->oom && !kolo_bytes_append(&t->b, &t->len, &t->cap, s, n, TEXT_MIN_CAP))
		t->oom = true;
}

void kolo_metrics_text_add(struct kolo_metrics_text *t, const char *fmt, ...)
{
	char small[512];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(small, sizeof(small), fmt, ap);
	va_end(ap);
	if (n < 0) {
		t->oom = true;
		return;
	}
	if ((size_t)n < sizeof(small)) {
		text_put(t, small, (size_t)n);
		return;
	}
	char *big = malloc((size_t)n + 1);
	if (!big) {
		t->oom = true;
		return;
	}
	va_start(ap, fmt);
	vsnprintf(big, (size_t)n + 1, fmt, ap);
	va_end(ap);
	text_put(t, big, (size_t)n);
	free(big);
}

void kolo_metrics_text_family(struct kolo_metrics_text *t, const char *name, const char *type,
                              const char *help)
{
	kolo_metrics_text_add(t, "# HELP %s ", name);
	/* HELP text escapes backslash and newline (not the quote). */
	for (const char *p = help; *p; p++) {
		if (*p == '\\')
			text_put(t, "\\\\", 2);
		else if (*p == '\n')
			text_put(t, "\\n", 2);
		else
			text_put(t, p, 1);
	}
	kolo_metrics_text_add(t, "\n# TYPE %s %s\n", name, type);
}

void kolo_metrics_text_sample(struct kolo_metrics_text *t, const char *name, const char *labels,
                              uint64_t value)
{
	if (labels[0])
		kolo_metrics_text_add(t, "%s{%s} %" PRIu64 "\n", name, labels, value);
	else
		kolo_metrics_text_add(t, "%s %" PRIu64 "\n", name, value);
}

void kolo_metrics_text_histogram(struct kolo_metrics_text *t, const char *name, const char *labels,
                                 const char *const *le, size_t nb, const uint64_t *counts,
                                 const char *sum)
{
	const char *sep = labels[0] ? "," : "";
	uint64_t run = 0;
	for (size_t i = 0; i < nb; i++) {
		run += counts[i];
		kolo_metrics_text_add(t, "%s_bucket{%s%sle=\"%s\"} %" PRIu64 "\n", name, labels,
		                      sep, le[i], run);
	}
	run += counts[nb];
	kolo_metrics_text_add(t, "%s_bucket{%s%sle=\"+Inf\"} %" PRIu64 "\n", name, labels, sep,
	                      run);
	if (labels[0]) {
		kolo_metrics_text_add(t, "%s_sum{%s} %s\n", name, labels, sum);
		kolo_metrics_text_add(t, "%s_count{%s} %" PRIu64 "\n", name, labels, run);
	} else {
		kolo_metrics_text_add(t, "%s_sum %s\n", name, sum);
		kolo_metrics_text_add(t, "%s_count %" PRIu64 "\n", name, run);
	}
}

bool kolo_metrics_labels(char *out, size_t size, ...)
{
	va_list ap;
	va_start(ap, size);
	size_t o = 0;
	bool ok = size > 0;
	for (const char *k; ok && (k = va_arg(ap, const char *)) != NULL;) {
		const char *v = va_arg(ap, const char *);
		int n = snprintf(out + o, size - o, "%s%s=\"", o ? "," : "", k);
		if (n < 0 || (size_t)n >= size - o) {
			ok = false;
			break;
		}
		o += (size_t)n;
		for (const char *p = v; *p && ok; p++) {
			const char *e = *p == '\\'   ? "\\\\"
			                : *p == '"'  ? "\\\""
			                : *p == '\n' ? "\\n"
			                             : NULL;
			size_t el = e ? 2 : 1;
			if (o + el + 2 > size) { /* room for the closing quote and NUL */
				ok = false;
				break;
			}
			memcpy(out + o, e ? e : p, el);
			o += el;
		}
		if (ok && o + 2 <= size)
			out[o++] = '"';
		else
			ok = false;
	}
	va_end(ap);
	if (size)
		out[ok ? o : 0] = '\0';
	return ok;
}

const char *kolo_metrics_fixed(char *out, size_t size, uint64_t value, int digits)
{
	uint64_t scale = 1;
	for (int i = 0; i < digits; i++)
		scale *= 10;
	int n = snprintf(out, size, "%" PRIu64 ".%0*" PRIu64, value / scale, digits, value % scale);
	if (n > 0 && (size_t)n < size && digits > 0) {
		while (out[n - 1] == '0')
			out[--n] = '\0';
		if (out[n - 1] == '.')
			out[--n] = '\0';
	}
	return out;
}
