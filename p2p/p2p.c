/* p2p: the object, the submission queue and the thread that drives the
 * transport. The thread makes progress while anything moves and otherwise
 * sleeps in poll() on the transport's fd and a wake-up eventfd that every
 * submission writes, so a new operation starts at once. */
#include "p2p_internal.h"

#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

/* How often the thread asks whether the comm is still sound. */
#define HEALTH_MS 50

void p2p_op_finish(struct p2p_op *op, kolo_status_t st, const char *msg)
{
	if (op->cb)
		op->cb(op->cb_arg, st);
	fusion_handle_complete(op->h, st, st == KOLO_OK ? "" : msg);
	free(op);
}

kolo_status_t p2p_status(struct kolo_p2p *p)
{
	return (kolo_status_t)atomic_load(&p->status);
}

static void wake(struct kolo_p2p *p)
{
	uint64_t one = 1;
	ssize_t n = write(p->wake_fd, &one, sizeof(one));
	(void)n; /* a full counter wakes the thread already */
}

static void fail_v(struct kolo_p2p *p, kolo_status_t st, const char *fmt, va_list ap)
{
	pthread_mutex_lock(&p->lock);
	int expected = KOLO_OK;
	if (atomic_compare_exchange_strong(&p->status, &expected, (int)st)) {
		vsnprintf(p->msg, sizeof(p->msg), fmt, ap);
		KOLO_DEBUG(SUBSYS, "failed: %s", p->msg);
	}
	pthread_mutex_unlock(&p->lock);
}

void p2p_fail(struct kolo_p2p *p, kolo_status_t st, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fail_v(p, st, fmt, ap);
	va_end(ap);
}

void kolo_p2p_close(struct kolo_p2p *p, kolo_status_t st, const char *msg)
{
	if (!p)
		return;
	p2p_fail(p, st == KOLO_OK ? KOLO_ECLOSED : st, "%s", msg ? msg : "closed");
	wake(p);
}

kolo_status_t kolo_p2p_status(struct kolo_p2p *p, struct kolo_errbuf *eb)
{
	kolo_status_t st = p2p_status(p);
	if (st != KOLO_OK && eb) {
		pthread_mutex_lock(&p->lock);
		kolo_fail(eb, st, "%s", p->msg);
		pthread_mutex_unlock(&p->lock);
	}
	return st;
}

/* Fails every operation the thread holds with st and frees the messages.
 * The conns are closed first, so the transport lets go of the buffers
 * before their owners hear of it. */
void p2p_drop_all(struct kolo_p2p *p, kolo_status_t st, const char *msg)
{
	for (int r = 0; r < p->cfg.size; r++) {
		struct p2p_peer *pe = &p->peers[r];
		p->t->ops->close(pe->out);
		p->t->ops->close(pe->in);
		pe->out = pe->in = NULL;
		pe->req_hdr = pe->req_body = NULL;
		for (struct p2p_op *op = pe->sends, *next; op; op = next) {
			next = op->next;
			p2p_op_finish(op, st, msg);
		}
		pe->sends = pe->sends_tail = NULL;
		if (pe->rx_op)
			p2p_op_finish(pe->rx_op, st, msg);
		pe->rx_op = NULL;
		pe->rx_msg = NULL;
	}
	for (struct p2p_op *op = p->recvs, *next; op; op = next) {
		next = op->next;
		p2p_op_finish(op, st, msg);
	}
	p->recvs = p->recvs_tail = NULL;
	for (struct p2p_msg *m = p->unexpected, *next; m; m = next) {
		next = m->next;
		if (m->claimed)
			p2p_op_finish(m->claimed, st, msg);
		free(m->data);
		free(m);
	}
	p->unexpected = p->unexpected_tail = NULL;
}

static void health(struct kolo_p2p *p, uint64_t now)
{
	if (now < p->next_health_ms)
		return;
	p->next_health_ms = now + HEALTH_MS;
	struct kolo_errbuf eb = {{0}};
	kolo_status_t st = p->cfg.health ? p->cfg.health(p->cfg.health_ctx, &eb) : KOLO_OK;
	if (st != KOLO_OK)
		p2p_fail(p, st, "%s", eb.msg[0] ? eb.msg : kolo_strerror(st));
}

/* Sleeps until the transport or a submission has something, or the next
 * deadline. */
static void sleep_until_work(struct kolo_p2p *p, uint64_t now, bool failed)
{
	int fd = p->t->ops->poll_fd ? p->t->ops->poll_fd(p->t) : -1;
	uint64_t until = KOLO_MIN(p2p_next_deadline(p), p->next_health_ms);
	int to = failed ? -1 : (int)KOLO_MIN(until > now ? until - now : 0, (uint64_t)HEALTH_MS);
	struct pollfd pfd[2] = {{.fd = p->wake_fd, .events = POLLIN}, {.fd = fd, .events = POLLIN}};
	if (fd < 0 && !failed) {
		/* A transport without a pollable fd: its own wait, in short slices. */
		p->t->ops->wait(p->t, KOLO_MIN(to, 1));
		to = 0;
	}
	if (poll(pfd, fd >= 0 && !failed ? 2 : 1, to) > 0 && (pfd[0].revents & POLLIN)) {
		uint64_t v;
		ssize_t n = read(p->wake_fd, &v, sizeof(v));
		(void)n;
	}
}

/* The status, and its message copied into msg. */
static kolo_status_t failure(struct kolo_p2p *p, char *msg, size_t size)
{
	pthread_mutex_lock(&p->lock);
	kolo_status_t st = p2p_status(p);
	snprintf(msg, size, "%s", st == KOLO_OK ? "" : p->msg);
	pthread_mutex_unlock(&p->lock);
	return st;
}

/* Takes the submissions; false once the thread is to stop. */
static bool take_queue(struct kolo_p2p *p, struct p2p_op **ops)
{
	pthread_mutex_lock(&p->lock);
	*ops = p->queue;
	p->queue = p->queue_tail = NULL;
	bool go = !p->stop;
	pthread_mutex_unlock(&p->lock);
	return go;
}

static void *p2p_main(void *arg)
{
	struct kolo_p2p *p = arg;
	for (;;) {
		struct p2p_op *ops;
		bool go = take_queue(p, &ops);
		uint64_t now = kolo_now_ms();
		char msg[KOLO_ERRBUF_SIZE];
		kolo_status_t st = failure(p, msg, sizeof(msg));
		for (struct p2p_op *op = ops, *next; op; op = next) {
			next = op->next;
			op->next = NULL;
			if (st != KOLO_OK)
				p2p_op_finish(op, st, msg);
			else if (op->is_send)
				p2p_send_queue(p, op);
			else
				p2p_recv_post(p, op);
		}
		bool moved = false;
		if (st == KOLO_OK) {
			health(p, now);
			kolo_status_t ws = p->t->ops->wait(p->t, 0);
			if (ws != KOLO_OK)
				p2p_fail(p, ws, "%s", p->t->err.msg);
			moved = p2p_send_progress(p, now);
			moved = p2p_recv_progress(p, now) || moved;
		}
		if ((st = failure(p, msg, sizeof(msg))) != KOLO_OK)
			p2p_drop_all(p, st, msg);
		if (!go)
			break;
		if (!moved)
			sleep_until_work(p, now, st != KOLO_OK);
	}
	return NULL;
}

kolo_status_t kolo_p2p_create(const struct kolo_p2p_config *cfg, struct kolo_p2p **out,
                              struct kolo_errbuf *eb)
{
	*out = NULL;
	struct kolo_p2p *p = calloc(1, sizeof(*p));
	if (!p) {
		cfg->transport->ops->destroy(cfg->transport);
		return kolo_fail(eb, KOLO_ENOMEM, "out of memory");
	}
	p->cfg = *cfg;
	p->t = cfg->transport;
	p->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	pthread_mutex_init(&p->lock, NULL);
	atomic_init(&p->status, KOLO_OK);
	p->peers = calloc((size_t)cfg->size, sizeof(*p->peers));
	if (p->wake_fd < 0 || !p->peers) {
		kolo_p2p_destroy(p);
		return kolo_fail(eb, KOLO_ENOMEM, "p2p: out of memory or file descriptors");
	}
	int e = pthread_create(&p->thread, NULL, p2p_main, p);
	if (e != 0) {
		kolo_p2p_destroy(p);
		return kolo_fail(eb, KOLO_ESYSTEM, "p2p: cannot start its thread: %s", strerror(e));
	}
	p->started = true;
	*out = p;
	return KOLO_OK;
}

void kolo_p2p_destroy(struct kolo_p2p *p)
{
	if (!p)
		return;
	if (p->started) {
		kolo_p2p_close(p, KOLO_ESHUTDOWN, "the comm was shut down");
		pthread_mutex_lock(&p->lock);
		p->stop = true;
		pthread_mutex_unlock(&p->lock);
		wake(p);
		pthread_join(p->thread, NULL);
	}
	if (p->t)
		p->t->ops->destroy(p->t);
	if (p->wake_fd >= 0)
		close(p->wake_fd);
	pthread_mutex_destroy(&p->lock);
	free(p->peers);
	free(p);
}

static kolo_status_t submit(struct kolo_p2p *p, struct p2p_op *op, kolo_handle_t **handle,
                            struct kolo_errbuf *eb)
{
	/* op belongs to the thread once queued: keep the handle apart. */
	kolo_handle_t *h = op->h = fusion_handle_create(p->cfg.owner, handle ? 2 : 1);
	if (!h) {
		free(op);
		return kolo_fail(eb, KOLO_ENOMEM, "out of memory");
	}
	pthread_mutex_lock(&p->lock);
	kolo_status_t st = p2p_status(p);
	if (st == KOLO_OK && p->stop)
		st = KOLO_ESHUTDOWN;
	if (st != KOLO_OK) {
		kolo_fail(eb, st, "%s", p->msg);
		pthread_mutex_unlock(&p->lock);
		fusion_handle_discard(op->h);
		free(op);
		return st;
	}
	if (p->queue_tail)
		p->queue_tail->next = op;
	else
		p->queue = op;
	p->queue_tail = op;
	pthread_mutex_unlock(&p->lock);
	wake(p);
	if (handle)
		*handle = h;
	return KOLO_OK;
}

static kolo_status_t check_peer(const struct kolo_p2p *p, int peer, bool any_ok,
                                struct kolo_errbuf *eb)
{
	if (any_ok && peer == KOLO_P2P_ANY_SOURCE)
		return KOLO_OK;
	if (peer < 0 || peer >= p->cfg.size)
		return kolo_fail(eb, KOLO_EINVAL, "rank %d is not in the comm (size %d)", peer,
		                 p->cfg.size);
	if (peer == p->cfg.rank)
		return kolo_fail(eb, KOLO_EINVAL, "rank %d cannot send to or receive from itself",
		                 peer);
	return KOLO_OK;
}

static struct p2p_op *op_new(bool is_send, void *buf, size_t len, int peer, int tag,
                             kolo_callback_fn cb, void *cb_arg)
{
	struct p2p_op *op = calloc(1, sizeof(*op));
	if (op)
		*op = (struct p2p_op){.is_send = is_send,
		                      .peer = peer,
		                      .tag = tag,
		                      .buf = buf,
		                      .len = len,
		                      .cb = cb,
		                      .cb_arg = cb_arg};
	return op;
}

kolo_status_t kolo_p2p_send(struct kolo_p2p *p, const void *buf, size_t len, int dst, int tag,
                            kolo_callback_fn cb, void *cb_arg, kolo_handle_t **handle,
                            struct kolo_errbuf *eb)
{
	KOLO_CHECK(check_peer(p, dst, false, eb));
	if (!buf && len)
		return kolo_fail(eb, KOLO_EINVAL, "send of %zu bytes from NULL", len);
	struct p2p_op *op = op_new(true, (void *)buf, len, dst, tag, cb, cb_arg);
	if (!op)
		return kolo_fail(eb, KOLO_ENOMEM, "out of memory");
	return submit(p, op, handle, eb);
}

kolo_status_t kolo_p2p_recv(struct kolo_p2p *p, void *buf, size_t len, int src, int tag,
                            int *source, kolo_callback_fn cb, void *cb_arg, kolo_handle_t **handle,
                            struct kolo_errbuf *eb)
{
	KOLO_CHECK(check_peer(p, src, true, eb));
	if (!buf && len)
		return kolo_fail(eb, KOLO_EINVAL, "recv of %zu bytes into NULL", len);
	struct p2p_op *op = op_new(false, buf, len, src, tag, cb, cb_arg);
	if (!op)
		return kolo_fail(eb, KOLO_ENOMEM, "out of memory");
	op->source = source;
	return submit(p, op, handle, eb);
}
