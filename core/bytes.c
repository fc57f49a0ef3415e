/* bytes: see bytes.h. */
#include "bytes.h"

#include <stdlib.h>
#include <string.h>

bool kolo_bytes_append(char **buf, size_t *len, size_t *cap, const void *data, size_t n,
                       size_t min_cap)
{
	if (*len + n + 1 > *cap) {
		size_t grown = *cap * 2 > *len + n + 1 ? *cap * 2 : *len + n + 1;
		grown = grown > min_cap ? grown : min_cap;
		char *b = realloc(*buf, grown);
		if (!b)
			return false;
		*buf = b;
		*cap = grown;
	}
	if (n)
		memcpy(*buf + *len, data, n);
	*len += n;
	(*buf)[*len] = '\0';
	return true;
}
