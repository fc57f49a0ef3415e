/* A driver for the fuzz targets in builds without libFuzzer (gcc, the ASan
 * and TSan builds): it runs every file of a corpus, then a bounded number of
 * mutants of them, made by a seeded generator, so a run is reproducible.
 * It has no coverage feedback; clang's libFuzzer (scripts/fuzz.sh) explores,
 * this replays what was found and keeps a cheap random search in every CI
 * run.
 *
 *   fuzz_TARGET [--runs N] [--seconds S] [--seed N] [--max-len N]
 *               [--dict FILE] [--save FILE] CORPUS_DIR_OR_FILE...
 *
 * --save writes each input to FILE before running it, so after a crash FILE
 * holds the input that caused it (run it again: fuzz_TARGET --runs 0 FILE). */
#include "fuzz.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static size_t min_sz(size_t a, size_t b)
{
	return a < b ? a : b;
}

struct blob {
	uint8_t *p;
	size_t n;
};

struct blobs {
	struct blob *v;
	size_t n, cap;
};

static void *xrealloc(void *p, size_t n)
{
	p = realloc(p, n ? n : 1);
	if (!p) {
		fprintf(stderr, "fuzz driver: out of memory\n");
		exit(2);
	}
	return p;
}

static void blobs_add(struct blobs *b, const uint8_t *p, size_t n)
{
	if (b->n == b->cap) {
		b->cap = b->cap ? 2 * b->cap : 64;
		b->v = xrealloc(b->v, b->cap * sizeof(*b->v));
	}
	b->v[b->n].p = xrealloc(NULL, n);
	memcpy(b->v[b->n].p, p, n);
	b->v[b->n].n = n;
	b->n++;
}

static void blobs_free(struct blobs *b)
{
	for (size_t i = 0; i < b->n; i++)
		free(b->v[i].p);
	free(b->v);
}

static bool read_file(const char *path, uint8_t **out, size_t *len)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return false;
	size_t cap = 4096, n = 0;
	uint8_t *p = xrealloc(NULL, cap);
	size_t got;
	while ((got = fread(p + n, 1, cap - n, f)) > 0) {
		n += got;
		if (n == cap) {
			cap *= 2;
			p = xrealloc(p, cap);
		}
	}
	bool ok = !ferror(f);
	fclose(f);
	if (!ok) {
		free(p);
		return false;
	}
	*out = p;
	*len = n;
	return true;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Adds a file, or every regular file of a directory in name order. */
static bool load_corpus(const char *path, struct blobs *out)
{
	struct stat st;
	if (stat(path, &st) != 0) {
		fprintf(stderr, "fuzz driver: %s: %s\n", path, strerror(errno));
		return false;
	}
	if (!S_ISDIR(st.st_mode)) {
		uint8_t *p;
		size_t n;
		if (!read_file(path, &p, &n)) {
			fprintf(stderr, "fuzz driver: cannot read %s\n", path);
			return false;
		}
		blobs_add(out, p, n);
		free(p);
		return true;
	}
	DIR *d = opendir(path);
	if (!d) {
		fprintf(stderr, "fuzz driver: %s: %s\n", path, strerror(errno));
		return false;
	}
	char **names = NULL;
	size_t nn = 0;
	struct dirent *e;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		names = xrealloc(names, (nn + 1) * sizeof(*names));
		size_t len = strlen(path) + strlen(e->d_name) + 2;
		names[nn] = xrealloc(NULL, len);
		snprintf(names[nn], len, "%s/%s", path, e->d_name);
		nn++;
	}
	closedir(d);
	qsort(names, nn, sizeof(*names), cmp_str);
	bool ok = true;
	for (size_t i = 0; i < nn; i++) {
		if (ok && stat(names[i], &st) == 0 && S_ISREG(st.st_mode))
			ok = load_corpus(names[i], out);
		free(names[i]);
	}
	free(names);
	return ok;
}

/* A libFuzzer dictionary: lines of name="value" or "value", with \\, \" and
 * \xNN escapes; # starts a comment. */
static bool load_dict(const char *path, struct blobs *out)
{
	FILE *f = fopen(path, "r");
	if (!f) {
		fprintf(stderr, "fuzz driver: %s: %s\n", path, strerror(errno));
		return false;
	}
	char line[1024];
	while (fgets(line, sizeof(line), f)) {
		char *q = strchr(line, '"');
		if (!q || line[strspn(line, " \t")] == '#')
			continue;
		uint8_t v[1024];
		size_t n = 0;
		for (char *s = q + 1; *s && *s != '"' && n < sizeof(v); s++) {
			if (*s == '\\' && s[1] == 'x' && s[2] && s[3]) {
				char hex[3] = {s[2], s[3], 0};
				v[n++] = (uint8_t)strtoul(hex, NULL, 16);
				s += 3;
			} else if (*s == '\\' && s[1]) {
				v[n++] = (uint8_t) * ++s;
			} else {
				v[n++] = (uint8_t)*s;
			}
		}
		if (n)
			blobs_add(out, v, n);
	}
	fclose(f);
	return true;
}

/* xorshift64*: small, seedable, good enough to pick mutations. */
static uint64_t rng_state;

static uint64_t rnd(void)
{
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return rng_state * 0x2545F4914F6CDD1Dull;
}

static size_t below(size_t n)
{
	return n ? (size_t)(rnd() % n) : 0;
}

/* Replaces [at, at + del) of buf (length *n <= cap) with ins, cut to fit. */
static void replace_range(uint8_t *buf, size_t *n, size_t cap, size_t at, size_t del,
                          const uint8_t *ins, size_t nins)
{
	if (*n > cap)
		*n = cap;
	if (at > *n)
		at = *n;
	if (del > *n - at)
		del = *n - at;
	size_t rest = *n - at - del; /* the bytes after the cut */
	size_t room = cap - at - rest;
	if (nins > room)
		nins = room;
	memmove(buf + at + nins, buf + at + del, rest);
	for (size_t i = 0; i < nins; i++)
		buf[at + i] = ins[i];
	*n = at + nins + rest;
}

static const char *const numbers[] = {"0",
                                      "-1",
                                      "1",
                                      "2147483647",
                                      "2147483648",
                                      "-2147483649",
                                      "1e9",
                                      "9223372036854775807",
                                      "9223372036854775808",
                                      "1.5",
                                      "99999999999999999999999"};

static void mutate_once(uint8_t *buf, size_t *n, size_t cap, const struct blobs *corpus,
                        const struct blobs *dict)
{
	static const uint8_t special[] = {0,    1,    0x7f, 0x80, 0xff, '{', '}', '[', ']',
	                                  '"',  ':',  ',',  '%',  '/',  '?', '&', '=', '\r',
	                                  '\n', '\\', ' ',  '\t', '0',  '9', '-'};
	uint8_t tmp[64];
	switch (below(11)) {
	case 0: /* flip a bit */
		if (*n)
			buf[below(*n)] ^= (uint8_t)(1u << below(8));
		break;
	case 1: /* a random byte */
		if (*n)
			buf[below(*n)] = (uint8_t)rnd();
		break;
	case 2: /* a byte that parsers care about */
		if (*n)
			buf[below(*n)] = special[below(sizeof(special))];
		break;
	case 3: { /* insert random bytes */
		size_t k = 1 + below(8);
		for (size_t i = 0; i < k; i++)
			tmp[i] = (uint8_t)rnd();
		replace_range(buf, n, cap, below(*n + 1), 0, tmp, k);
		break;
	}
	case 4: /* delete a range */
		if (*n)
			replace_range(buf, n, cap, below(*n), 1 + below(16), tmp, 0);
		break;
	case 5: /* repeat a range of itself */
		if (*n) {
			size_t from = below(*n), k = 1 + below(min_sz(*n - from, sizeof(tmp)));
			memcpy(tmp, buf + from, k);
			replace_range(buf, n, cap, below(*n + 1), 0, tmp, k);
		}
		break;
	case 6:
	case 7: /* insert or overwrite with a dictionary word */
		if (dict->n) {
			const struct blob *w = &dict->v[below(dict->n)];
			size_t at = below(*n + 1);
			replace_range(buf, n, cap, at, below(2) ? 0 : w->n, w->p, w->n);
		}
		break;
	case 8: /* cross over with another corpus entry */
		if (corpus->n) {
			const struct blob *o = &corpus->v[below(corpus->n)];
			size_t from = below(o->n + 1);
			size_t at = below(*n + 1);
			replace_range(buf, n, cap, at, *n - at, o->p + from, o->n - from);
		}
		break;
	case 9: /* truncate */
		*n = below(*n + 1);
		break;
	default: { /* replace a decimal number with an edge value */
		size_t start = below(*n + 1);
		while (start < *n && !(buf[start] >= '0' && buf[start] <= '9'))
			start++;
		size_t end = start;
		while (end < *n && buf[end] >= '0' && buf[end] <= '9')
			end++;
		const char *num = numbers[below(sizeof(numbers) / sizeof(numbers[0]))];
		replace_range(buf, n, cap, start, end - start, (const uint8_t *)num, strlen(num));
		break;
	}
	}
}

/* The input about to run, kept in the --save file (-1: none). */
static int save_fd = -1;

static void save(const uint8_t *p, size_t n)
{
	if (save_fd < 0)
		return;
	if ((n && pwrite(save_fd, p, n, 0) != (ssize_t)n) || ftruncate(save_fd, (off_t)n) != 0) {
		fprintf(stderr, "fuzz driver: --save: %s\n", strerror(errno));
		exit(2);
	}
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void usage(const char *prog)
{
	fprintf(stderr,
	        "usage: %s [--runs N] [--seconds S] [--seed N] [--max-len N] [--dict FILE]\n"
	        "          [--save FILE] CORPUS_DIR_OR_FILE...\n",
	        prog);
}

int main(int argc, char **argv)
{
	long runs = 10000, max_len = 4096;
	double seconds = 30;
	uint64_t seed = 1;
	const char *save_path = NULL;
	struct blobs corpus = {0}, dict = {0};
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		bool has_val = i + 1 < argc;
		if (!strcmp(a, "--runs") && has_val)
			runs = strtol(argv[++i], NULL, 10);
		else if (!strcmp(a, "--seconds") && has_val)
			seconds = strtod(argv[++i], NULL);
		else if (!strcmp(a, "--seed") && has_val)
			seed = strtoull(argv[++i], NULL, 10);
		else if (!strcmp(a, "--max-len") && has_val)
			max_len = strtol(argv[++i], NULL, 10);
		else if (!strcmp(a, "--dict") && has_val) {
			if (!load_dict(argv[++i], &dict))
				return 2;
		} else if (!strcmp(a, "--save") && has_val)
			save_path = argv[++i];
		else if (a[0] == '-') {
			usage(argv[0]);
			return 2;
		} else if (!load_corpus(a, &corpus))
			return 2;
	}
	if (runs < 0 || max_len < 1 || seconds <= 0) {
		usage(argv[0]);
		return 2;
	}
	if (save_path) {
		save_fd = open(save_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
		if (save_fd < 0) {
			fprintf(stderr, "fuzz driver: %s: %s\n", save_path, strerror(errno));
			return 2;
		}
	}
	rng_state = seed * 0x9E3779B97F4A7C15ull + 1;
	double t0 = now_s();
	for (size_t i = 0; i < corpus.n; i++) {
		save(corpus.v[i].p, corpus.v[i].n);
		LLVMFuzzerTestOneInput(corpus.v[i].p, corpus.v[i].n);
	}
	size_t cap = (size_t)max_len;
	uint8_t *buf = xrealloc(NULL, cap);
	long done = 0;
	for (; done < runs && now_s() - t0 < seconds; done++) {
		size_t n = 0;
		if (corpus.n) {
			const struct blob *b = &corpus.v[below(corpus.n)];
			n = min_sz(b->n, cap);
			memcpy(buf, b->p, n);
		}
		for (size_t k = 1 + below(5); k > 0; k--)
			mutate_once(buf, &n, cap, &corpus, &dict);
		save(buf, n);
		/* A copy of exactly n bytes, so ASan sees a read past the end. */
		uint8_t *in = xrealloc(NULL, n);
		memcpy(in, buf, n);
		LLVMFuzzerTestOneInput(in, n);
		free(in);
	}
	printf("%s: %zu corpus inputs and %ld mutants (seed %llu) in %.1f s: no failure\n", argv[0],
	       corpus.n, done, (unsigned long long)seed, now_s() - t0);
	fflush(stdout);
	free(buf);
	if (save_fd >= 0)
		close(save_fd);
	blobs_free(&corpus);
	blobs_free(&dict);
	return 0;
}
