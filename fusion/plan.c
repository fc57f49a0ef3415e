/* plan: which ready allreduces share one pass through the fusion buffer. */
#include "fusion_internal.h"

static bool same_key(const struct fusion_item *a, const struct fusion_item *b)
{
	/* Adasum's dot products are per tensor: such a tensor goes alone. */
	return a->op != KOLO_ADASUM && a->dtype == b->dtype && a->op == b->op &&
	       a->prescale == b->prescale && a->postscale == b->postscale && a->device == b->device;
}

size_t fusion_plan(const struct fusion_item *items, size_t n, uint64_t threshold, size_t *batch_of)
{
	const size_t unset = (size_t)-1;
	size_t nb = 0;
	for (size_t i = 0; i < n; i++)
		batch_of[i] = unset;
	for (size_t i = 0; i < n; i++) {
		if (batch_of[i] != unset)
			continue;
		size_t b = nb++;
		batch_of[i] = b;
		if (threshold == 0 || (!items[i].direct && items[i].bytes >= threshold))
			continue;
		uint64_t used = items[i].direct ? 0 : items[i].bytes;
		/* Look ahead past items of another kind (mixed precision interleaves
		 * float16 and float32 gradients) and past ones that no longer fit. */
		for (size_t j = i + 1; j < n; j++) {
			if (batch_of[j] != unset || !same_key(&items[i], &items[j]))
				continue;
			if (!items[j].direct) {
				if (items[j].bytes > threshold - used)
					continue;
				used += items[j].bytes;
			}
			batch_of[j] = b;
		}
	}
	return nb;
}
