/* The fuzz targets' common interface: each target defines
 * LLVMFuzzerTestOneInput and is linked either with libFuzzer
 * (KOLO_SANITIZER=fuzzer, clang) or with driver.c, which replays a corpus
 * and mutants of it in any build. A target reports a broken invariant with
 * FUZZ_CHECK, which aborts, so both drivers keep the input that did it. */
#ifndef KOLO_FUZZ_H
#define KOLO_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_CHECK(cond, ...)                                                                      \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			fprintf(stderr, "%s:%d: FUZZ_CHECK(%s) failed: ", __FILE__, __LINE__,      \
			        #cond);                                                            \
			fprintf(stderr, __VA_ARGS__);                                              \
			fputc('\n', stderr);                                                       \
			abort();                                                                   \
		}                                                                                  \
	} while (0)

#endif /* KOLO_FUZZ_H */
