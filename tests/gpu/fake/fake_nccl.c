/* fake_nccl: a test double of libnccl.so.2 over POSIX shared memory, for
 * ranks that are processes of one host using the fake libcudart (its
 * streams run the collectives, its shadows hold the data). Compiled against
 * the real nccl.h; exports only the NCCL names it defines.
 *
 * A comm is one segment named from the unique id (made by the first rank
 * to come, unlinked once every rank has mapped it): a header with a
 * process-shared robust mutex and condition variable, then one slot per
 * rank. Each chunk of a collective: every rank copies its part into its
 * slot, a generation barrier, every rank computes its output from the
 * slots, a second barrier so the slots can be reused. A slot is
 * KOLO_FAKE_NCCL_SLOT_BYTES (default 1 MiB) as the first rank found it; the
 * segment's size tells the others. Every wait has a deadline
 * (KOLO_FAKE_NCCL_TIMEOUT_MS, default 30000) and is woken in slices to look
 * at its peers, so an abort, a dead peer or a timeout becomes the comm's
 * async error and never a hang. */
#include <nccl.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "kolo_fake.h"

#define MAX_RANKS 32
#define MAGIC     "kolo-fake-nccl"
#define SLICE_NS  50000000L /* how soon a dead peer is noticed */
#define MAX_OPS   16

enum { OK_STATE, ABORTED, PEER_DIED, TIMED_OUT };

struct hdr {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int nranks, arrived, state;
	uint64_t bar_count, bar_gen;
	struct {
		int present, dev;
		pid_t pid;
		unsigned char uuid[16];
	} rank[MAX_RANKS];
};
#define HDR_BYTES ((sizeof(struct hdr) + 4095) / 4096 * 4096)

struct premul {
	bool used;
	ncclDataType_t type;
	ncclScalarResidence_t res;
	unsigned char value[8]; /* a host immediate, copied at creation */
	const void *devp;
};

struct ncclComm {
	struct hdr *h;
	size_t slot, map_bytes;
	int rank, nranks, dev, timeout_ms;
	pid_t pid[MAX_RANKS];
	int pidfd[MAX_RANKS];
	pthread_mutex_t lock; /* refs and ops */
	int refs;
	atomic_int async_err;
	char msg[256]; /* why async_err is set: written once, before it */
	struct premul ops[MAX_OPS];
};

static _Thread_local char last_msg[256];
static _Thread_local int group_depth;

static ncclResult_t err(ncclResult_t r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static ncclResult_t err(ncclResult_t r, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(last_msg, sizeof(last_msg), fmt, ap);
	va_end(ap);
	return r;
}

static char *slot(struct ncclComm *c, int r)
{
	return (char *)c->h + HDR_BYTES + (size_t)r * c->slot;
}

/* ---- waiting in the segment ----------------------------------------------- */

static void set_state(struct hdr *h, int s) /* under h->mu */
{
	if (h->state == OK_STATE)
		h->state = s;
	pthread_cond_broadcast(&h->cv);
}

static void shm_lock(struct hdr *h)
{
	if (pthread_mutex_lock(&h->mu) == EOWNERDEAD) {
		pthread_mutex_consistent(&h->mu);
		set_state(h, PEER_DIED);
	}
}

static bool peer_dead(struct ncclComm *c)
{
	for (int r = 0; r < c->nranks; r++) {
		if (r == c->rank || !c->pid[r])
			continue;
		if (c->pidfd[r] >= 0) {
			struct pollfd p = {.fd = c->pidfd[r], .events = POLLIN};
			if (poll(&p, 1, 0) > 0)
				return true;
		} else if (kill(c->pid[r], 0) != 0 && errno == ESRCH) {
			return true;
		}
	}
	return false;
}

static struct timespec deadline_in(int ms)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	t.tv_sec += ms / 1000;
	t.tv_nsec += (long)(ms % 1000) * 1000000L;
	if (t.tv_nsec >= 1000000000L) {
		t.tv_sec++;
		t.tv_nsec -= 1000000000L;
	}
	return t;
}

static bool before(const struct timespec *a, const struct timespec *b)
{
	return a->tv_sec < b->tv_sec || (a->tv_sec == b->tv_sec && a->tv_nsec < b->tv_nsec);
}

/* One slice of waiting on the segment's condition (h->mu held), called
 * while the caller's condition is false: an error once the segment is
 * aborted, a peer is dead or the deadline has passed, otherwise success
 * after a wake-up, for the caller to look at its condition again (first: a
 * peer that completed the barrier and exited is no failure). */
static ncclResult_t shm_wait(struct ncclComm *c, const struct timespec *deadline)
{
	struct hdr *h = c->h;
	struct timespec until = deadline_in(0);
	if (h->state == OK_STATE && !before(&until, deadline))
		set_state(h, TIMED_OUT);
	if (h->state == OK_STATE && peer_dead(c))
		set_state(h, PEER_DIED);
	switch (h->state) {
	case OK_STATE:
		break;
	case TIMED_OUT:
		return err(ncclSystemError, "a peer did not answer within %d ms", c->timeout_ms);
	case ABORTED:
		return err(ncclRemoteError, "a peer aborted the communicator");
	default:
		return err(ncclRemoteError, "a peer process died");
	}
	until.tv_nsec += SLICE_NS;
	if (until.tv_nsec >= 1000000000L) {
		until.tv_sec++;
		until.tv_nsec -= 1000000000L;
	}
	if (before(deadline, &until))
		until = *deadline;
	if (pthread_cond_timedwait(&h->cv, &h->mu, &until) == EOWNERDEAD) {
		pthread_mutex_consistent(&h->mu);
		set_state(h, PEER_DIED);
	}
	return ncclSuccess;
}

static ncclResult_t barrier(struct ncclComm *c)
{
	struct timespec deadline = deadline_in(c->timeout_ms);
	struct hdr *h = c->h;
	ncclResult_t r = ncclSuccess;
	shm_lock(h);
	if (h->state != OK_STATE) {
		r = shm_wait(c, &deadline); /* the error */
	} else if (++h->bar_count == (uint64_t)c->nranks) {
		h->bar_count = 0;
		h->bar_gen++;
		pthread_cond_broadcast(&h->cv);
	} else {
		uint64_t gen = h->bar_gen;
		while (h->bar_gen == gen && r == ncclSuccess)
			r = shm_wait(c, &deadline);
	}
	pthread_mutex_unlock(&h->mu);
	return r;
}

/* ---- element arithmetic: floats in double, integers in 64 bits ----------- */

static size_t type_size(ncclDataType_t t)
{
	switch (t) {
	case ncclInt8:
	case ncclUint8:
		return 1;
	case ncclFloat16:
	case ncclBfloat16:
		return 2;
	case ncclInt32:
	case ncclUint32:
	case ncclFloat32:
		return 4;
	case ncclInt64:
	case ncclUint64:
	case ncclFloat64:
		return 8;
	default:
		return 0;
	}
}

static bool is_float(ncclDataType_t t)
{
	return t == ncclFloat16 || t == ncclBfloat16 || t == ncclFloat32 || t == ncclFloat64;
}

static float half_to_float(uint16_t h)
{
	uint32_t sign = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 31, m = h & 1023, bits;
	if (e == 31) {
		bits = sign | 0x7f800000u | m << 13;
	} else if (e) {
		bits = sign | (e + 112) << 23 | m << 13;
	} else if (m) { /* subnormal: normalise */
		e = 113;
		while (!(m & 1024)) {
			m <<= 1;
			e--;
		}
		bits = sign | e << 23 | (m & 1023) << 13;
	} else {
		bits = sign;
	}
	float f;
	memcpy(&f, &bits, 4);
	return f;
}

static uint16_t float_to_half(float f) /* round to nearest even */
{
	uint32_t x;
	memcpy(&x, &f, 4);
	uint32_t sign = (x >> 16) & 0x8000, ax = x & 0x7fffffffu;
	if (ax >= 0x7f800000u) /* inf, nan */
		return (uint16_t)(sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0));
	if (ax >= 0x477ff000u) /* rounds to >= 65520: overflow */
		return (uint16_t)(sign | 0x7c00);
	if (ax < 0x38800000u) { /* below the smallest normal: subnormal or zero */
		int shift = 126 - (int)(ax >> 23);
		if (shift > 24)
			return (uint16_t)sign;
		uint32_t m = (ax & 0x7fffffu) | 0x800000u;
		uint32_t q = m >> (shift + 1), rem = m & ((2u << shift) - 1), half = 1u << shift;
		q += rem > half || (rem == half && (q & 1));
		return (uint16_t)(sign | q);
	}
	uint32_t q = (ax >> 13) - (112u << 10), rem = ax & 0x1fff;
	q += rem > 0x1000 || (rem == 0x1000 && (q & 1));
	return (uint16_t)(sign | q);
}

static double load_f(ncclDataType_t t, const char *p)
{
	uint16_t u16;
	uint32_t u32;
	float f;
	double d;
	switch (t) {
	case ncclFloat16:
		memcpy(&u16, p, 2);
		return half_to_float(u16);
	case ncclBfloat16:
		memcpy(&u16, p, 2);
		u32 = (uint32_t)u16 << 16;
		memcpy(&f, &u32, 4);
		return f;
	case ncclFloat32:
		memcpy(&f, p, 4);
		return f;
	default:
		memcpy(&d, p, 8);
		return d;
	}
}

static void store_f(ncclDataType_t t, char *p, double v)
{
	float f = (float)v;
	uint32_t u32;
	uint16_t u16;
	switch (t) {
	case ncclFloat16:
		u16 = float_to_half(f);
		memcpy(p, &u16, 2);
		break;
	case ncclBfloat16:
		memcpy(&u32, &f, 4);
		u32 += 0x7fff + ((u32 >> 16) & 1); /* nearest even (nan kept apart) */
		u16 = (uint16_t)((f != f) ? 0x7fc0 : u32 >> 16);
		memcpy(p, &u16, 2);
		break;
	case ncclFloat32:
		memcpy(p, &f, 4);
		break;
	default:
		memcpy(p, &v, 8);
		break;
	}
}

/* Integers as 64-bit patterns: + and * wrap alike for signed and unsigned. */
static uint64_t load_i(ncclDataType_t t, const char *p)
{
	int8_t i8;
	int32_t i32;
	uint32_t u32;
	uint64_t u64;
	switch (t) {
	case ncclInt8:
		memcpy(&i8, p, 1);
		return (uint64_t)(int64_t)i8;
	case ncclUint8:
		return (unsigned char)*p;
	case ncclInt32:
		memcpy(&i32, p, 4);
		return (uint64_t)(int64_t)i32;
	case ncclUint32:
		memcpy(&u32, p, 4);
		return u32;
	default:
		memcpy(&u64, p, 8);
		return u64;
	}
}

static void store_i(ncclDataType_t t, char *p, uint64_t v)
{
	uint32_t u32 = (uint32_t)v;
	switch (type_size(t)) {
	case 1:
		*p = (char)v;
		break;
	case 4:
		memcpy(p, &u32, 4);
		break;
	default:
		memcpy(p, &v, 8);
		break;
	}
}

struct coll {
	struct ncclComm *c;
	enum { ALLREDUCE, REDUCE, REDUCESCATTER, ALLGATHER, BROADCAST } kind;
	const char *send;
	char *recv;
	size_t count;
	ncclDataType_t type;
	ncclRedOp_t op; /* a built-in one; PreMulSum is ncclSum after the scaling */
	bool premul;
	unsigned char scalar[8];
	const void *scalar_dev;
	int root;
};

/* Copies n elements of this rank's input into its slot, scaled by its own
 * PreMulSum scalar (each rank scales its input by the scalar it gave). */
static void put(struct coll *k, char *dst, const char *src, size_t n)
{
	ncclDataType_t t = k->type;
	size_t es = type_size(t);
	if (!k->premul) {
		memcpy(dst, src, n * es);
		return;
	}
	const void *s = k->scalar_dev ? kolo_fake_cuda_shadow(k->scalar_dev) : k->scalar;
	double fs = is_float(t) ? load_f(t, s) : 0;
	uint64_t is = is_float(t) ? 0 : load_i(t, s);
	for (size_t i = 0; i < n; i++) {
		if (is_float(t))
			store_f(t, dst + i * es, load_f(t, src + i * es) * fs);
		else
			store_i(t, dst + i * es, load_i(t, src + i * es) * is);
	}
}

/* dst[i] = op over the ranks r of (src + r * slot)[i], i < n. */
static void reduce(struct coll *k, char *dst, const char *src, size_t n)
{
	ncclDataType_t t = k->type;
	size_t es = type_size(t);
	int nr = k->c->nranks;
	bool sgn = t == ncclInt8 || t == ncclInt32 || t == ncclInt64;
	for (size_t i = 0; i < n; i++) {
		const char *p = src + i * es;
		if (is_float(t)) {
			double acc = load_f(t, p);
			for (int r = 1; r < nr; r++) {
				double v = load_f(t, p + (size_t)r * k->c->slot);
				switch (k->op) {
				case ncclProd:
					acc *= v;
					break;
				case ncclMax:
					acc = v > acc ? v : acc;
					break;
				case ncclMin:
					acc = v < acc ? v : acc;
					break;
				default:
					acc += v;
					break;
				}
			}
			store_f(t, dst + i * es, k->op == ncclAvg ? acc / nr : acc);
			continue;
		}
		uint64_t acc = load_i(t, p);
		for (int r = 1; r < nr; r++) {
			uint64_t v = load_i(t, p + (size_t)r * k->c->slot);
			bool less = sgn ? (int64_t)v < (int64_t)acc : v < acc;
			switch (k->op) {
			case ncclProd:
				acc *= v;
				break;
			case ncclMax:
				acc = less ? acc : v;
				break;
			case ncclMin:
				acc = less ? v : acc;
				break;
			default:
				acc += v;
				break;
			}
		}
		if (k->op == ncclAvg)
			acc = sgn ? (uint64_t)((int64_t)acc / nr) : acc / (uint64_t)nr;
		store_i(t, dst + i * es, acc);
	}
}

static ncclResult_t execute(struct coll *k)
{
	struct ncclComm *c = k->c;
	size_t es = type_size(k->type), per = c->slot / es, n;
	int me = c->rank, nr = c->nranks;
	ncclResult_t r = ncclSuccess;
	if (k->kind == REDUCESCATTER)
		per /= (size_t)nr;
	for (size_t o = 0; o < k->count && r == ncclSuccess; o += n) {
		n = k->count - o < per ? k->count - o : per;
		size_t off = o * es, bytes = n * es;
		if (k->kind == REDUCESCATTER) {
			for (int j = 0; j < nr; j++)
				put(k, slot(c, me) + (size_t)j * bytes,
				    k->send + ((size_t)j * k->count + o) * es, n);
		} else if (k->kind != BROADCAST || me == k->root) {
			put(k, slot(c, me), k->send + off, n);
		}
		if ((r = barrier(c)) != ncclSuccess)
			break;
		switch (k->kind) {
		case ALLREDUCE:
			reduce(k, k->recv + off, slot(c, 0), n);
			break;
		case REDUCE:
			if (me == k->root)
				reduce(k, k->recv + off, slot(c, 0), n);
			break;
		case REDUCESCATTER:
			reduce(k, k->recv + off, slot(c, 0) + (size_t)me * bytes, n);
			break;
		case ALLGATHER:
			for (int j = 0; j < nr; j++)
				memmove(k->recv + ((size_t)j * k->count + o) * es, slot(c, j),
				        bytes);
			break;
		case BROADCAST:
			memmove(k->recv + off, slot(c, k->root), bytes);
			break;
		}
		r = barrier(c);
	}
	return r;
}

/* ---- comms ------------------------------------------------------------------ */

static void comm_unref(struct ncclComm *c)
{
	pthread_mutex_lock(&c->lock);
	int left = --c->refs;
	pthread_mutex_unlock(&c->lock);
	if (left)
		return;
	for (int r = 0; r < MAX_RANKS; r++)
		if (c->pidfd[r] >= 0)
			close(c->pidfd[r]);
	munmap(c->h, c->map_bytes);
	pthread_mutex_destroy(&c->lock);
	free(c);
}

static void fail_comm(struct ncclComm *c, ncclResult_t r, const char *why)
{
	pthread_mutex_lock(&c->lock);
	if (atomic_load(&c->async_err) == ncclSuccess) {
		snprintf(c->msg, sizeof(c->msg), "%s", why);
		atomic_store(&c->async_err, (int)r);
	}
	pthread_mutex_unlock(&c->lock);
}

static void run_coll(void *arg)
{
	struct coll *k = arg;
	struct ncclComm *c = k->c;
	if (atomic_load(&c->async_err) == ncclSuccess) {
		ncclResult_t r = execute(k);
		if (r != ncclSuccess)
			fail_comm(c, r, last_msg);
	}
	comm_unref(c);
	free(k);
}

static void id_name(const ncclUniqueId *id, char *name, size_t size)
{
	snprintf(name, size, "%.60s", id->internal + sizeof(MAGIC));
}

ncclResult_t ncclGetVersion(int *version)
{
	if (!version)
		return err(ncclInvalidArgument, "version is NULL");
	*version = NCCL_VERSION_CODE;
	return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
	unsigned char rnd[16];
	if (!id)
		return err(ncclInvalidArgument, "uniqueId is NULL");
	if (getrandom(rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd))
		return err(ncclSystemError, "getrandom: %s", strerror(errno));
	memset(id, 0, sizeof(*id));
	memcpy(id->internal, MAGIC, sizeof(MAGIC));
	char *name = id->internal + sizeof(MAGIC);
	int len = snprintf(name, 64, "/%s-", MAGIC); /* a file of /dev/shm once used */
	for (int i = 0; i < 16; i++)
		len += snprintf(name + len, 64 - (size_t)len, "%02x", rnd[i]);
	return ncclSuccess;
}

/* The comm's segment, made by the first rank to come: each newcomer that
 * finds none initialises one under a name of its own and links it to the
 * id's name, so a rank sees the segment only once it is initialised, and
 * every loser of the race opens the winner's. Nothing exists for an id no
 * rank has used. */
static void *open_segment(const char *name, size_t *bytes)
{
	char path[128], tmp[160];
	snprintf(path, sizeof(path), "/dev/shm%s", name);
	snprintf(tmp, sizeof(tmp), "%s.%d", path, (int)getpid());
	for (int attempt = 0; attempt < 2; attempt++) {
		struct stat st;
		void *m = MAP_FAILED;
		int fd = open(path, O_RDWR | O_CLOEXEC);
		if (fd >= 0) {
			if (fstat(fd, &st) == 0 && (size_t)st.st_size > HDR_BYTES) {
				*bytes = (size_t)st.st_size;
				m = mmap(NULL, *bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
			}
			close(fd);
			return m;
		}
		if (errno != ENOENT ||
		    (fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600)) < 0)
			return MAP_FAILED;
		const char *v = getenv("KOLO_FAKE_NCCL_SLOT_BYTES");
		size_t slot = v && atol(v) >= 4096 ? (size_t)atol(v) / 64 * 64 : (size_t)1 << 20;
		*bytes = HDR_BYTES + MAX_RANKS * slot;
		if (ftruncate(fd, (off_t)*bytes) == 0)
			m = mmap(NULL, *bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		close(fd);
		if (m != MAP_FAILED) {
			struct hdr *h = m;
			pthread_mutexattr_t ma;
			pthread_mutexattr_init(&ma);
			pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
			pthread_mutexattr_setrobust(&ma, PTHREAD_MUTEX_ROBUST);
			pthread_mutex_init(&h->mu, &ma);
			pthread_mutexattr_destroy(&ma);
			pthread_condattr_t ca;
			pthread_condattr_init(&ca);
			pthread_condattr_setpshared(&ca, PTHREAD_PROCESS_SHARED);
			pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
			pthread_cond_init(&h->cv, &ca);
			pthread_condattr_destroy(&ca);
		}
		int linked = m != MAP_FAILED ? link(tmp, path) : -1, why = errno;
		unlink(tmp);
		if (linked == 0 || m == MAP_FAILED || why != EEXIST)
			return linked == 0 ? m : MAP_FAILED;
		munmap(m, *bytes); /* another rank was first */
	}
	return MAP_FAILED;
}

/* Every rank arrives (or the deadline passes), then each checks that no two
 * ranks share a GPU, as NCCL does. */
static ncclResult_t join(struct ncclComm *c, const unsigned char uuid[16])
{
	struct hdr *h = c->h;
	struct timespec deadline = deadline_in(c->timeout_ms);
	ncclResult_t r = ncclSuccess;
	shm_lock(h);
	if (h->nranks && h->nranks != c->nranks)
		r = err(ncclInvalidArgument, "nranks %d, but another rank said %d", c->nranks,
		        h->nranks);
	else if (h->rank[c->rank].present)
		r = err(ncclInvalidUsage, "rank %d joined twice", c->rank);
	if (r != ncclSuccess) {
		pthread_mutex_unlock(&h->mu);
		return r;
	}
	h->nranks = c->nranks;
	h->rank[c->rank].present = 1;
	h->rank[c->rank].pid = getpid();
	h->rank[c->rank].dev = c->dev;
	memcpy(h->rank[c->rank].uuid, uuid, 16);
	h->arrived++;
	pthread_cond_broadcast(&h->cv);
	while (h->arrived < c->nranks && r == ncclSuccess)
		r = shm_wait(c, &deadline);
	int arrived = h->arrived;
	for (int i = 0; i < c->nranks && r == ncclSuccess; i++) {
		c->pid[i] = h->rank[i].pid;
		if (i != c->rank && !memcmp(h->rank[i].uuid, uuid, 16))
			r = err(ncclInvalidUsage,
			        "Duplicate GPU detected: rank %d and rank %d both on "
			        "CUDA device %d",
			        i, c->rank, c->dev);
	}
	pthread_mutex_unlock(&h->mu);
	if (r == ncclSystemError)
		r = err(r, "%d of %d ranks arrived within %d ms", arrived, c->nranks,
		        c->timeout_ms);
	return r;
}

ncclResult_t ncclCommInitRank(ncclComm_t *out, int nranks, ncclUniqueId id, int rank)
{
	char name[64];
	struct cudaDeviceProp prop;
	if (!out)
		return err(ncclInvalidArgument, "comm is NULL");
	*out = NULL;
	if (nranks < 1 || nranks > MAX_RANKS || rank < 0 || rank >= nranks)
		return err(ncclInvalidArgument, "rank %d of %d (the fake has at most %d ranks)",
		           rank, nranks, MAX_RANKS);
	if (memcmp(id.internal, MAGIC, sizeof(MAGIC)))
		return err(ncclInvalidArgument, "not a unique id from this ncclGetUniqueId");
	struct ncclComm *c = calloc(1, sizeof(*c));
	if (!c)
		return err(ncclSystemError, "out of memory");
	c->rank = rank;
	c->nranks = nranks;
	c->refs = 1;
	const char *v = getenv("KOLO_FAKE_NCCL_TIMEOUT_MS");
	c->timeout_ms = v && atoi(v) > 0 ? atoi(v) : 30000;
	for (int i = 0; i < MAX_RANKS; i++)
		c->pidfd[i] = -1;
	pthread_mutex_init(&c->lock, NULL);
	if (cudaGetDevice(&c->dev) != cudaSuccess ||
	    cudaGetDeviceProperties(&prop, c->dev) != cudaSuccess) {
		cudaGetLastError();
		pthread_mutex_destroy(&c->lock);
		free(c);
		return err(ncclUnhandledCudaError, "no current CUDA device");
	}
	id_name(&id, name, sizeof(name));
	void *m = open_segment(name, &c->map_bytes);
	if (m == MAP_FAILED) {
		int why = errno;
		pthread_mutex_destroy(&c->lock);
		free(c);
		return err(ncclSystemError, "shared memory /dev/shm%s: %s", name, strerror(why));
	}
	c->slot = (c->map_bytes - HDR_BYTES) / MAX_RANKS;
	c->h = m;
	ncclResult_t r = join(c, (const unsigned char *)prop.uuid.bytes);
	char path[128];
	snprintf(path, sizeof(path), "/dev/shm%s", name);
	unlink(path); /* every rank has it mapped, or the comm failed */
	if (r != ncclSuccess) {
		char msg[sizeof(last_msg)];
		memcpy(msg, last_msg, sizeof(msg));
		comm_unref(c);
		return err(r, "%s", msg);
	}
	for (int i = 0; i < nranks; i++)
		if (i != rank)
			c->pidfd[i] = (int)syscall(SYS_pidfd_open, c->pid[i], 0);
	*out = c;
	return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t *config)
{
	(void)config; /* always blocking */
	return ncclCommInitRank(comm, nranks, id, rank);
}

ncclResult_t ncclCommFinalize(ncclComm_t comm)
{
	return comm ? ncclSuccess : err(ncclInvalidArgument, "comm is NULL");
}

/* Queued collectives hold references: the segment goes with the last. */
ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
	if (comm)
		comm_unref(comm);
	return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm)
{
	if (!comm)
		return ncclSuccess;
	shm_lock(comm->h);
	set_state(comm->h, ABORTED);
	pthread_mutex_unlock(&comm->h->mu);
	fail_comm(comm, ncclRemoteError, "the communicator was aborted");
	comm_unref(comm);
	return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *out)
{
	if (!comm || !out)
		return err(ncclInvalidArgument, "comm or asyncError is NULL");
	*out = (ncclResult_t)atomic_load(&comm->async_err);
	return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count)
{
	if (!comm || !count)
		return err(ncclInvalidArgument, "comm or count is NULL");
	*count = comm->nranks;
	return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device)
{
	if (!comm || !device)
		return err(ncclInvalidArgument, "comm or device is NULL");
	*device = comm->dev;
	return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank)
{
	if (!comm || !rank)
		return err(ncclInvalidArgument, "comm or rank is NULL");
	*rank = comm->rank;
	return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r)
{
	switch (r) {
	case ncclSuccess:
		return "no error";
	case ncclUnhandledCudaError:
		return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
	case ncclSystemError:
		return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
	case ncclInternalError:
		return "internal error - please report this issue to the NCCL developers";
	case ncclInvalidArgument:
		return "invalid argument (run with NCCL_DEBUG=WARN for details)";
	case ncclInvalidUsage:
		return "invalid usage (run with NCCL_DEBUG=WARN for details)";
	case ncclRemoteError:
		return "remote process exited or there was a network error";
	case ncclInProgress:
		return "NCCL operation in progress";
	default:
		return "unknown result code";
	}
}

/* The comm's async error, or this thread's last failed call. */
const char *ncclGetLastError(ncclComm_t comm)
{
	return comm && atomic_load(&comm->async_err) != ncclSuccess ? comm->msg : last_msg;
}

/* Each rank queues the same calls in the same order, so a group needs
 * nothing more here. (nccl.h declares these without a prototype.) */
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);

ncclResult_t ncclGroupStart(void)
{
	group_depth++;
	return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void)
{
	if (group_depth == 0)
		return err(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
	group_depth--;
	return ncclSuccess;
}

ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar, ncclDataType_t type,
                                      ncclScalarResidence_t res, ncclComm_t comm)
{
	if (!op || !scalar || !comm || !type_size(type))
		return err(ncclInvalidArgument, "PreMulSum: a NULL argument or an unknown type");
	if (res == ncclScalarDevice && !kolo_fake_cuda_shadow_range(scalar, type_size(type), NULL))
		return err(ncclInvalidArgument, "PreMulSum: the scalar is not device memory");
	pthread_mutex_lock(&comm->lock);
	int i = 0;
	while (i < MAX_OPS && comm->ops[i].used)
		i++;
	if (i < MAX_OPS) {
		struct premul *p = &comm->ops[i];
		*p = (struct premul){true, type, res, {0}, res == ncclScalarDevice ? scalar : NULL};
		if (res != ncclScalarDevice)
			memcpy(p->value, scalar, type_size(type));
		*op = (ncclRedOp_t)(ncclNumOps + i);
	}
	pthread_mutex_unlock(&comm->lock);
	return i < MAX_OPS ? ncclSuccess
	                   : err(ncclInvalidUsage, "more than %d PreMulSum ops", MAX_OPS);
}

ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm)
{
	int i = (int)op - ncclNumOps;
	if (!comm || i < 0 || i >= MAX_OPS)
		return err(ncclInvalidArgument, "not an op from ncclRedOpCreatePreMulSum");
	pthread_mutex_lock(&comm->lock);
	bool used = comm->ops[i].used;
	comm->ops[i].used = false;
	pthread_mutex_unlock(&comm->lock);
	return used ? ncclSuccess : err(ncclInvalidArgument, "op %d is not in use", (int)op);
}

/* The buffers' shadows, checked to be device memory of the comm's GPU. */
static ncclResult_t buffer(struct ncclComm *c, const void *p, size_t bytes, const char *what,
                           char **out)
{
	int dev = -1;
	*out = kolo_fake_cuda_shadow_range(p, bytes, &dev);
	if (!*out || dev != c->dev)
		return err(ncclInvalidArgument, "%s %p (%zu bytes) is not memory of CUDA device %d",
		           what, p, bytes, c->dev);
	return ncclSuccess;
}

static ncclResult_t submit(struct coll k, const void *send, void *recv, size_t send_n,
                           size_t recv_n, cudaStream_t stream)
{
	struct ncclComm *c = k.c;
	size_t es = type_size(k.type);
	if (!c)
		return err(ncclInvalidArgument, "comm is NULL");
	if (!es)
		return err(ncclInvalidArgument, "datatype %d is not supported", (int)k.type);
	if (k.root < 0 || k.root >= c->nranks)
		return err(ncclInvalidArgument, "root %d of %d ranks", k.root, c->nranks);
	if ((int)k.op >= ncclNumOps) {
		int i = (int)k.op - ncclNumOps;
		pthread_mutex_lock(&c->lock);
		bool ok = i < MAX_OPS && c->ops[i].used && c->ops[i].type == k.type;
		if (ok) {
			k.premul = true;
			memcpy(k.scalar, c->ops[i].value, sizeof(k.scalar));
			k.scalar_dev = c->ops[i].devp;
		}
		pthread_mutex_unlock(&c->lock);
		if (!ok)
			return err(ncclInvalidArgument, "op %d is no PreMulSum of this type",
			           (int)k.op);
		k.op = ncclSum;
	} else if ((int)k.op < 0) {
		return err(ncclInvalidArgument, "op %d", (int)k.op);
	}
	if (k.count == 0)
		return ncclSuccess;
	ncclResult_t r = ncclSuccess;
	char *s = NULL, *d = NULL;
	if (send_n && (r = buffer(c, send, send_n * es, "sendbuff", &s)) != ncclSuccess)
		return r;
	if (recv_n && (r = buffer(c, recv, recv_n * es, "recvbuff", &d)) != ncclSuccess)
		return r;
	struct coll *q = malloc(sizeof(*q));
	if (!q)
		return err(ncclSystemError, "out of memory");
	*q = k;
	q->send = s;
	q->recv = d;
	pthread_mutex_lock(&c->lock);
	c->refs++;
	pthread_mutex_unlock(&c->lock);
	if (kolo_fake_cuda_enqueue(stream, run_coll, q) != cudaSuccess) {
		cudaGetLastError();
		comm_unref(c);
		free(q);
		return err(ncclUnhandledCudaError, "stream %p: not a stream", (void *)stream);
	}
	return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
	struct coll k = {.c = comm, .kind = ALLREDUCE, .count = count, .type = type, .op = op};
	return submit(k, send, recv, count, count, stream);
}

ncclResult_t ncclReduce(const void *send, void *recv, size_t count, ncclDataType_t type,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream)
{
	struct coll k = {
	        .c = comm, .kind = REDUCE, .count = count, .type = type, .op = op, .root = root};
	bool me = comm && comm->rank == root;
	return submit(k, send, recv, count, me ? count : 0, stream);
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t recvcount, ncclDataType_t type,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
	struct coll k = {
	        .c = comm, .kind = REDUCESCATTER, .count = recvcount, .type = type, .op = op};
	return submit(k, send, recv, recvcount * (comm ? (size_t)comm->nranks : 0), recvcount,
	              stream);
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t sendcount, ncclDataType_t type,
                           ncclComm_t comm, cudaStream_t stream)
{
	struct coll k = {.c = comm, .kind = ALLGATHER, .count = sendcount, .type = type};
	return submit(k, send, recv, sendcount, sendcount * (comm ? (size_t)comm->nranks : 0),
	              stream);
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t type,
                           int root, ncclComm_t comm, cudaStream_t stream)
{
	struct coll k = {.c = comm, .kind = BROADCAST, .count = count, .type = type, .root = root};
	bool me = comm && comm->rank == root;
	return submit(k, send, recv, me ? count : 0, count, stream);
}

ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t type, int root, ncclComm_t comm,
                       cudaStream_t stream)
{
	return ncclBroadcast(buff, buff, count, type, root, comm, stream);
}
