/* durable: the file of a durable commit and its background writer. */
#include "durable.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static const char MAGIC[8] = "KOLODUR";

void kolo_durable_path(char *out, size_t size, const char *dir, const char *job)
{
	int n = snprintf(out, size, "%s/kolo-%s.state", dir, job);
	size_t from = strlen(dir) + 1;
	for (size_t i = from; n > 0 && i < size && out[i]; i++)
		if (out[i] == '/')
			out[i] = '_';
}

static uint64_t fnv1a(uint64_t h, const unsigned char *p, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		h ^= p[i];
		h *= 1099511628211ULL;
	}
	return h;
}

static void put_le(unsigned char *p, uint64_t v, int bytes)
{
	for (int i = 0; i < bytes; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

static uint64_t get_le(const unsigned char *p, int bytes)
{
	uint64_t v = 0;
	for (int i = 0; i < bytes; i++)
		v |= (uint64_t)p[i] << (8 * i);
	return v;
}

static uint64_t checksum(const unsigned char *hdr, const void *data, size_t len)
{
	uint64_t h = fnv1a(14695981039346656037ULL, hdr, 32);
	return fnv1a(h, data, len);
}

static bool write_all(int fd, const void *buf, size_t len)
{
	const char *p = buf;
	while (len > 0) {
		ssize_t n = write(fd, p, len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return false;
		p += n;
		len -= (size_t)n;
	}
	return true;
}

static kolo_status_t sys_fail(struct kolo_errbuf *eb, const char *what, const char *path)
{
	return kolo_fail(eb, KOLO_ESYSTEM, "durable: %s %s: %s", what, path, strerror(errno));
}

/* fsync of the directory that holds path, so that the rename is durable. */
static kolo_status_t sync_dir(const char *path, struct kolo_errbuf *eb)
{
	char dir[4096];
	snprintf(dir, sizeof(dir), "%s", path);
	char *slash = strrchr(dir, '/');
	if (slash)
		*(slash == dir ? slash + 1 : slash) = '\0';
	else
		snprintf(dir, sizeof(dir), ".");
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return sys_fail(eb, "cannot open the directory", dir);
	int rc = fsync(fd);
	close(fd);
	return rc == 0 ? KOLO_OK : sys_fail(eb, "cannot fsync the directory", dir);
}

kolo_status_t kolo_durable_write(const char *path, const void *data, size_t len, int64_t commit,
                                 struct kolo_errbuf *eb)
{
	unsigned char hdr[KOLO_DURABLE_HEADER];
	memcpy(hdr, MAGIC, 8);
	put_le(hdr + 8, KOLO_DURABLE_VERSION, 4);
	put_le(hdr + 12, KOLO_DURABLE_HEADER, 4);
	put_le(hdr + 16, (uint64_t)commit, 8);
	put_le(hdr + 24, len, 8);
	put_le(hdr + 32, checksum(hdr, data, len), 8);
	char tmp[4200];
	snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", path, (long)getpid());
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0)
		return sys_fail(eb, "cannot create", tmp);
	bool ok = write_all(fd, hdr, sizeof(hdr)) && write_all(fd, data, len) && fsync(fd) == 0;
	int saved = errno;
	if (close(fd) != 0 && ok) {
		ok = false;
		saved = errno;
	}
	if (!ok) {
		unlink(tmp);
		errno = saved;
		return sys_fail(eb, "cannot write", tmp);
	}
	if (rename(tmp, path) != 0) {
		saved = errno;
		unlink(tmp);
		errno = saved;
		return sys_fail(eb, "cannot rename the temporary file to", path);
	}
	return sync_dir(path, eb);
}

static bool read_all(int fd, void *buf, size_t len)
{
	char *p = buf;
	while (len > 0) {
		ssize_t n = read(fd, p, len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return false;
		p += n;
		len -= (size_t)n;
	}
	return true;
}

/* Checks the header against the file's size; *len is the payload's. */
static kolo_status_t check_header(const unsigned char *hdr, off_t size, const char *path,
                                  size_t *len, struct kolo_errbuf *eb)
{
	if (memcmp(hdr, MAGIC, 8) != 0)
		return kolo_fail(eb, KOLO_EINVAL, "durable: %s is not a durable commit", path);
	uint64_t version = get_le(hdr + 8, 4), hsize = get_le(hdr + 12, 4);
	if (version != KOLO_DURABLE_VERSION || hsize != KOLO_DURABLE_HEADER)
		return kolo_fail(eb, KOLO_EINVAL, "durable: %s has version %llu, not %d", path,
		                 (unsigned long long)version, KOLO_DURABLE_VERSION);
	uint64_t want = get_le(hdr + 24, 8);
	if ((uint64_t)size - KOLO_DURABLE_HEADER != want)
		return kolo_fail(eb, KOLO_EINVAL,
		                 "durable: %s holds %lld payload bytes, its header says %llu", path,
		                 (long long)size - KOLO_DURABLE_HEADER, (unsigned long long)want);
	*len = (size_t)want;
	return KOLO_OK;
}

kolo_status_t kolo_durable_read(const char *path, void **data, size_t *len, int64_t *commit,
                                struct kolo_errbuf *eb)
{
	*data = NULL;
	*len = 0;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0 && errno == ENOENT)
		return kolo_fail(eb, KOLO_ENOTFOUND, "durable: no file %s", path);
	if (fd < 0)
		return sys_fail(eb, "cannot open", path);
	unsigned char hdr[KOLO_DURABLE_HEADER];
	struct stat sb;
	kolo_status_t st = KOLO_OK;
	if (fstat(fd, &sb) != 0)
		st = sys_fail(eb, "cannot stat", path);
	else if (sb.st_size < KOLO_DURABLE_HEADER || !read_all(fd, hdr, sizeof(hdr)))
		st = kolo_fail(eb, KOLO_EINVAL, "durable: %s is shorter than a header", path);
	else
		st = check_header(hdr, sb.st_size, path, len, eb);
	void *buf = st == KOLO_OK ? malloc(*len ? *len : 1) : NULL;
	if (st == KOLO_OK && !buf)
		st = kolo_fail(eb, KOLO_ENOMEM, "durable: cannot allocate %zu bytes", *len);
	if (st == KOLO_OK && !read_all(fd, buf, *len))
		st = kolo_fail(eb, KOLO_EINVAL, "durable: %s ends early", path);
	close(fd);
	if (st == KOLO_OK && checksum(hdr, buf, *len) != get_le(hdr + 32, 8))
		st = kolo_fail(eb, KOLO_EINVAL, "durable: %s fails its checksum", path);
	if (st != KOLO_OK) {
		free(buf);
		*len = 0;
		return st;
	}
	*data = buf;
	*commit = (int64_t)get_le(hdr + 16, 8);
	return KOLO_OK;
}
