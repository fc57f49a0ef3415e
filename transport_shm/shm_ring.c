/* shm_ring: the two single-producer/single-consumer byte rings of a conn,
 * in one memfd mapping behind a header page of counters. */
#include "shm_internal.h"

#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#define PUBLISH_BYTES (256u << 10) /* publish progress at least this often */

#define SEG_HEADER 4096u
/* rings[0] carries connector → acceptor, rings[1] acceptor → connector. */
struct seg_header {
	struct shm_ring_ctl rings[2];
};
_Static_assert(sizeof(struct seg_header) <= SEG_HEADER, "header fits its page");

kolo_status_t shm_ring_map(struct shm_conn *c, int memfd, size_t ring_bytes, bool create)
{
	size_t len = SEG_HEADER + 2 * ring_bytes;
	if (create && ftruncate(memfd, (off_t)len) != 0)
		return KOLO_ESYSTEM;
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
	if (p == MAP_FAILED)
		return KOLO_ENOMEM;
	c->map = p;
	c->map_len = len;
	c->ring_bytes = ring_bytes;
	struct seg_header *h = p;
	uint8_t *d0 = (uint8_t *)p + SEG_HEADER, *d1 = d0 + ring_bytes;
	if (create) {
		for (int i = 0; i < 2; i++) {
			atomic_init(&h->rings[i].head, 0);
			atomic_init(&h->rings[i].tail, 0);
			atomic_init(&h->rings[i].consumer_waiting, 0);
			atomic_init(&h->rings[i].producer_waiting, 0);
			atomic_init(&h->rings[i].producer_cpu, -1);
		}
	}
	if (c->acceptor) {
		c->rx = &h->rings[0];
		c->rxdata = d0;
		c->tx = &h->rings[1];
		c->txdata = d1;
	} else {
		c->tx = &h->rings[0];
		c->txdata = d0;
		c->rx = &h->rings[1];
		c->rxdata = d1;
	}
	return KOLO_OK;
}

static void wake_peer(struct shm_conn *c)
{
	static const char b = 'w';
	ssize_t n = send(c->fd, &b, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
	(void)n; /* a full socket buffer already holds a wake-up */
}

/* Copies n bytes in at ring offset pos (wrapping). */
static void copy_in(struct shm_conn *c, uint64_t pos, const uint8_t *src, size_t n)
{
	size_t off = (size_t)(pos % c->ring_bytes), first = KOLO_MIN(n, c->ring_bytes - off);
	memcpy(c->txdata + off, src, first);
	memcpy(c->txdata, src + first, n - first);
}

/* Copies n bytes out from ring offset pos (wrapping). */
static void copy_out(const struct shm_conn *c, uint64_t pos, uint8_t *dst, size_t n)
{
	size_t off = (size_t)(pos % c->ring_bytes), first = KOLO_MIN(n, c->ring_bytes - off);
	memcpy(dst, c->rxdata + off, first);
	memcpy(dst + first, c->rxdata, n - first);
}

size_t shm_ring_writev(struct shm_conn *c, const uint8_t *a, size_t alen, const uint8_t *b,
                       size_t blen)
{
	uint64_t head = atomic_load_explicit(&c->tx->head, memory_order_relaxed);
	size_t space = c->ring_bytes - (size_t)(head - c->tx_tail);
	if (space < alen + blen) {
		c->tx_tail = atomic_load_explicit(&c->tx->tail, memory_order_acquire);
		space = c->ring_bytes - (size_t)(head - c->tx_tail);
	}
	size_t n = KOLO_MIN(KOLO_MIN(space, alen + blen), (size_t)PUBLISH_BYTES);
	if (n == 0)
		return 0;
	size_t na = KOLO_MIN(n, alen);
	if (na)
		copy_in(c, head, a, na);
	if (n > na)
		copy_in(c, head + na, b, n - na);
	atomic_store_explicit(&c->tx->head, head + n, memory_order_seq_cst);
	if (atomic_load_explicit(&c->tx->consumer_waiting, memory_order_seq_cst))
		wake_peer(c);
	return n;
}

size_t shm_ring_write(struct shm_conn *c, const uint8_t *src, size_t len)
{
	return shm_ring_writev(c, NULL, 0, src, len);
}

size_t shm_ring_peek(struct shm_conn *c, uint8_t *dst, size_t len)
{
	uint64_t tail = atomic_load_explicit(&c->rx->tail, memory_order_relaxed);
	uint64_t head = atomic_load_explicit(&c->rx->head, memory_order_acquire);
	size_t n = KOLO_MIN((size_t)(head - tail), len);
	if (n)
		copy_out(c, tail, dst, n);
	return n;
}

size_t shm_ring_readv(struct shm_conn *c, size_t skip, uint8_t *dst, size_t len)
{
	uint64_t tail = atomic_load_explicit(&c->rx->tail, memory_order_relaxed);
	uint64_t head = atomic_load_explicit(&c->rx->head, memory_order_acquire);
	size_t n = KOLO_MIN(KOLO_MIN((size_t)(head - tail), skip + len), (size_t)PUBLISH_BYTES);
	if (n == 0)
		return 0;
	if (n > skip)
		copy_out(c, tail + skip, dst, n - skip);
	atomic_store_explicit(&c->rx->tail, tail + n, memory_order_seq_cst);
	if (atomic_load_explicit(&c->rx->producer_waiting, memory_order_seq_cst))
		wake_peer(c);
	return n;
}

size_t shm_ring_read(struct shm_conn *c, uint8_t *dst, size_t len)
{
	return shm_ring_readv(c, 0, dst, len);
}

int shm_peer_cpu(struct kolo_conn *base, int cpu)
{
	struct shm_conn *c = shm_cn(base);
	if (c->state != SHM_CS_READY)
		return -1;
	/* Written only when it changes: the line stays shared while we stay. */
	if (atomic_load_explicit(&c->tx->producer_cpu, memory_order_relaxed) != cpu)
		atomic_store_explicit(&c->tx->producer_cpu, cpu, memory_order_relaxed);
	return atomic_load_explicit(&c->rx->producer_cpu, memory_order_relaxed);
}
