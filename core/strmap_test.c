#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strmap.h"
#include "testutil.h"

START_TEST(hash_is_fnv1a)
{
	/* FNV-1a with kolo's offset basis (see strmap.h), values worked out by
	 * hand from the definition: h = (h ^ byte) * 1099511628211 mod 2^64. */
	ck_assert_uint_eq(kolo_hash_str(""), 0x14650fb0739d0383ULL);
	ck_assert_uint_eq(kolo_hash_str("a"), 0x44bd8ad473cd9906ULL);
	ck_assert_uint_eq(kolo_hash_str("foobar"), 0x88fad7c0a8ff07f2ULL);
}
END_TEST

/* Random puts and deletes over 500 keys, checked after every step against a
 * plain array indexed by key number. */
START_TEST(matches_array_model)
{
	enum { KEYS = 500, STEPS = 20000 };
	static int vals[KEYS];
	int *model[KEYS] = {0};
	size_t model_n = 0;
	struct kolo_strmap m = {0};
	srand(7);
	for (int step = 0; step < STEPS; step++) {
		int k = rand() % KEYS;
		char key[16];
		snprintf(key, sizeof(key), "k%d", k);
		if (rand() % 3) {
			bool ok;
			void *old = kolo_strmap_put(&m, key, &vals[k], &ok);
			ck_assert(ok);
			ck_assert_ptr_eq(old, model[k]);
			model_n += model[k] == NULL;
			model[k] = &vals[k];
		} else {
			ck_assert_ptr_eq(kolo_strmap_del(&m, key), model[k]);
			model_n -= model[k] != NULL;
			model[k] = NULL;
		}
		ck_assert_uint_eq(m.n, model_n);
		ck_assert_ptr_eq(kolo_strmap_get(&m, key), model[k]);
	}
	size_t seen = 0;
	KOLO_STRMAP_FOREACH(&m, e)
	{
		int k = atoi(e->key + 1);
		ck_assert_ptr_eq(e->val, model[k]);
		seen++;
	}
	ck_assert_uint_eq(seen, model_n);
	kolo_strmap_fini(&m, NULL);
	ck_assert_uint_eq(m.n, 0);
	ck_assert_ptr_null(kolo_strmap_get(&m, "k1"));
}
END_TEST

static int freed;
static void count_free(void *p)
{
	freed++;
	free(p);
}

START_TEST(any_key_and_fini)
{
	struct kolo_strmap m = {0};
	ck_assert_ptr_null(kolo_strmap_any_key(&m));
	ck_assert_ptr_null(kolo_strmap_del(&m, "absent"));
	bool ok;
	for (int i = 0; i < 3; i++) {
		char key[8];
		snprintf(key, sizeof(key), "x%d", i);
		kolo_strmap_put(&m, key, malloc(4), &ok);
		ck_assert(ok);
	}
	const char *any = kolo_strmap_any_key(&m);
	ck_assert_ptr_nonnull(any);
	ck_assert_ptr_nonnull(kolo_strmap_get(&m, any));
	freed = 0;
	kolo_strmap_fini(&m, count_free);
	ck_assert_int_eq(freed, 3);
	ck_assert_ptr_null(kolo_strmap_any_key(&m));
}
END_TEST

static Suite *strmap_suite(void)
{
	Suite *s = suite_create("strmap");
	TCase *tc = tcase_create("strmap");
	tcase_add_test(tc, hash_is_fnv1a);
	tcase_add_test(tc, matches_array_model);
	tcase_add_test(tc, any_key_and_fini);
	suite_add_tcase(s, tc);
	return s;
}

KOLO_CHECK_MAIN(strmap_suite)
