/* verbs_emu: the test double of transport_verbs.h, a table of the verbs the
 * transport uses implemented in process. It checks what the protocol relies
 * on and a NIC would enforce: QP states, addresses, lkeys, rkeys and bounds,
 * a posted receive for every write with immediate, flushes on error. It
 * says nothing about a NIC's timing or its memory model beyond RC order.
 *
 * One lock (process-shared, robust) guards everything. QPs are entries of a
 * "fabric" table in a shared anonymous mapping made by the first device open
 * of a process tree, so QPs of a parent and of a child forked later find
 * each other by number. Within one process a write lands at once; between
 * two, it crosses a staging ring of the destination QP's fabric entry and
 * lands when the owner next calls into the emulation. */
#include "verbs_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#define EMU_QPS     256
#define EMU_WIRE    (64u << 10)
#define EMU_MAX_CQE 65536

struct fab_qp {
	uint32_t in_use;
	int32_t pid;
	uint32_t qpn;
	int32_t state;        /* enum ibv_qp_state, seen by the peer */
	uint64_t head, tail;  /* bytes into / out of the staging ring */
	struct emu_qp *local; /* valid in process `pid` only */
};

struct fabric {
	pthread_mutex_t lock;
	uint32_t next_qpn;
	struct fab_qp qps[EMU_QPS];
	uint8_t wire[EMU_QPS][EMU_WIRE];
};

/* A staged write (between processes), followed by its bytes. */
struct wire_pkt {
	uint64_t raddr;
	uint32_t rkey;
	uint32_t len; /* bytes of this piece */
	uint32_t total;
	uint32_t imm;
	uint8_t has_imm, last;
	uint8_t pad[6];
};

struct emu_ch {
	struct ibv_comp_channel ch;
	struct ibv_cq *last_cq;
};

struct emu_cq {
	struct ibv_cq cq;
	struct ibv_wc *wc;
	int n, cap;
	bool armed;
};

struct emu_mr {
	struct ibv_mr mr;
	int access;
	pid_t pid;
	struct emu_mr *next;
};

struct emu_wqe {
	struct ibv_send_wr wr;
	struct ibv_sge sge;
	size_t staged;
	struct emu_wqe *next;
};

struct emu_qp {
	struct ibv_qp qp;
	pid_t pid;
	int fi; /* fabric index */
	int max_send, max_recv;
	uint64_t *rq;
	int rq_head, rq_n;
	struct emu_wqe *sq, *sq_last;
	int sq_n;
	uint8_t rnr_retry;
	uint32_t dest_qpn;
	uint16_t dlid;
	bool global;
	union ibv_gid dgid;
	struct emu_qp *next;
};

static struct emu_opts_state {
	bool roce;
	_Atomic bool reorder;
} opts;

static struct fabric *fab;
static pthread_mutex_t fab_init_lock = PTHREAD_MUTEX_INITIALIZER;
static struct emu_qp *qps; /* this process's, under fab->lock */
static struct emu_mr *mrs; /* idem */
static uint32_t next_key = 0x1000;
static uint64_t rng = 0x9e3779b97f4a7c15ull;
static struct kolo_verbs_emu_stats stats;
static struct ibv_device emu_dev;
static struct ibv_device *emu_list[2] = {&emu_dev, NULL};

/* ---- the lock and the fabric ---- */

static bool fabric_init(void)
{
	pthread_mutex_lock(&fab_init_lock);
	if (!fab) {
		void *p = mmap(NULL, sizeof(struct fabric), PROT_READ | PROT_WRITE,
		               MAP_SHARED | MAP_ANONYMOUS, -1, 0);
		if (p != MAP_FAILED) {
			struct fabric *f = p;
			pthread_mutexattr_t a;
			pthread_mutexattr_init(&a);
			pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
			pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
			pthread_mutex_init(&f->lock, &a);
			pthread_mutexattr_destroy(&a);
			f->next_qpn = 0x100;
			fab = f;
		}
	}
	pthread_mutex_unlock(&fab_init_lock);
	return fab != NULL;
}

static void lock(void)
{
	/* A process killed while holding the lock (a test kills peers) leaves
	 * the fabric as it was between two whole operations' steps; carry on. */
	if (pthread_mutex_lock(&fab->lock) == EOWNERDEAD)
		pthread_mutex_consistent(&fab->lock);
}

static void unlock(void)
{
	pthread_mutex_unlock(&fab->lock);
}

static bool pid_alive(pid_t pid)
{
	return kill(pid, 0) == 0 || errno != ESRCH;
}

static struct fab_qp *fab_find(uint32_t qpn)
{
	for (int i = 0; i < EMU_QPS; i++)
		if (fab->qps[i].in_use && fab->qps[i].qpn == qpn)
			return &fab->qps[i];
	return NULL;
}

/* The LID and GID of a process's port: peers are told apart by pid. */
static uint16_t lid_of(pid_t pid)
{
	return (uint16_t)(1 + (uint32_t)pid % 0xbffe);
}

static void gid_of(pid_t pid, union ibv_gid *g)
{
	memset(g, 0, sizeof(*g));
	g->raw[0] = 0xfe;
	g->raw[1] = 0x80;
	uint32_t p = htonl((uint32_t)pid);
	memcpy(g->raw + 12, &p, 4);
}

/* ---- completions ---- */

static void cq_push(struct ibv_cq *base, const struct ibv_wc *wc)
{
	struct emu_cq *cq = kolo_container_of(base, struct emu_cq, cq);
	if (cq->n == cq->cap) {
		int cap = cq->cap ? cq->cap * 2 : 64;
		struct ibv_wc *w = realloc(cq->wc, (size_t)cap * sizeof(*w));
		if (!w)
			abort(); /* a CQ overrun; the transport sized it */
		cq->wc = w;
		cq->cap = cap;
	}
	cq->wc[cq->n++] = *wc;
	if (cq->armed && base->channel) {
		cq->armed = false;
		struct emu_ch *ch = kolo_container_of(base->channel, struct emu_ch, ch);
		ch->last_cq = base;
		uint64_t one = 1;
		ssize_t w = write(base->channel->fd, &one, sizeof(one));
		(void)w;
	}
}

static void complete(struct ibv_cq *cq, uint64_t wr_id, enum ibv_wc_status st,
                     enum ibv_wc_opcode op, uint32_t qpn)
{
	struct ibv_wc wc;
	memset(&wc, 0, sizeof(wc));
	wc.wr_id = wr_id;
	wc.status = st;
	wc.opcode = op;
	wc.qp_num = qpn;
	cq_push(cq, &wc);
}

/* The QP goes to error: every outstanding work request is flushed. */
static void qp_error(struct emu_qp *q)
{
	q->qp.state = IBV_QPS_ERR;
	fab->qps[q->fi].state = IBV_QPS_ERR;
	while (q->rq_n) {
		complete(q->qp.recv_cq, q->rq[q->rq_head], IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV,
		         q->qp.qp_num);
		q->rq_head = (q->rq_head + 1) % q->max_recv;
		q->rq_n--;
		stats.flushed++;
	}
	while (q->sq) {
		struct emu_wqe *w = q->sq;
		q->sq = w->next;
		complete(q->qp.send_cq, w->wr.wr_id, IBV_WC_WR_FLUSH_ERR, IBV_WC_RDMA_WRITE,
		         q->qp.qp_num);
		free(w);
		stats.flushed++;
	}
	q->sq_last = NULL;
	q->sq_n = 0;
}

/* The head send failed with st; the rest is flushed. */
static void send_fail(struct emu_qp *q, enum ibv_wc_status st)
{
	struct emu_wqe *w = q->sq;
	q->sq = w->next;
	if (!q->sq)
		q->sq_last = NULL;
	q->sq_n--;
	complete(q->qp.send_cq, w->wr.wr_id, st, IBV_WC_RDMA_WRITE, q->qp.qp_num);
	free(w);
	qp_error(q);
}

static struct emu_mr *mr_by_key(uint32_t key, bool remote, pid_t pid)
{
	for (struct emu_mr *m = mrs; m; m = m->next)
		if (m->pid == pid && (remote ? m->mr.rkey : m->mr.lkey) == key)
			return m;
	return NULL;
}

static bool in_mr(const struct emu_mr *m, uint64_t addr, size_t len)
{
	uint64_t a = (uint64_t)(uintptr_t)m->mr.addr;
	return addr >= a && len <= m->mr.length && addr - a <= m->mr.length - len;
}

/* ---- moving bytes ---- */

/* Places a write at its target QP in this process. Returns 1 when done, 0
 * when it must be retried (no receive posted: RNR with infinite retry), -1
 * when the target refused it (then *st says how the sender sees it). */
static int land(struct emu_qp *dst, uint64_t raddr, uint32_t rkey, const void *src, size_t len,
                bool has_imm, uint32_t imm, enum ibv_wc_status *st)
{
	if (dst->qp.state != IBV_QPS_RTR && dst->qp.state != IBV_QPS_RTS) {
		*st = IBV_WC_RETRY_EXC_ERR; /* nobody answers: retries run out */
		return -1;
	}
	if (has_imm && dst->rq_n == 0)
		return 0;
	if (len > 0) {
		struct emu_mr *m = mr_by_key(rkey, true, dst->pid);
		if (!m || !(m->access & IBV_ACCESS_REMOTE_WRITE) || !in_mr(m, raddr, len)) {
			stats.remote_access_errors++;
			qp_error(dst);
			*st = IBV_WC_REM_ACCESS_ERR;
			return -1;
		}
		memcpy((void *)(uintptr_t)raddr, src, len);
	}
	stats.writes++;
	stats.bytes += len;
	if (has_imm) {
		struct ibv_wc wc;
		memset(&wc, 0, sizeof(wc));
		wc.wr_id = dst->rq[dst->rq_head];
		dst->rq_head = (dst->rq_head + 1) % dst->max_recv;
		dst->rq_n--;
		wc.status = IBV_WC_SUCCESS;
		wc.opcode = IBV_WC_RECV_RDMA_WITH_IMM;
		wc.byte_len = (uint32_t)len;
		wc.imm_data = htonl(imm);
		wc.wc_flags = IBV_WC_WITH_IMM;
		wc.qp_num = dst->qp.qp_num;
		wc.src_qp = dst->dest_qpn;
		cq_push(dst->qp.recv_cq, &wc);
		stats.recv_completions++;
	}
	return 1;
}

static void wire_copy_in(struct fab_qp *f, const void *src, size_t n)
{
	uint8_t *ring = fab->wire[f - fab->qps];
	size_t off = f->head % EMU_WIRE, first = KOLO_MIN(n, EMU_WIRE - off);
	memcpy(ring + off, src, first);
	memcpy(ring, (const uint8_t *)src + first, n - first);
	f->head += n;
}

static void wire_copy_out(struct fab_qp *f, uint64_t at, void *dst, size_t n)
{
	uint8_t *ring = fab->wire[f - fab->qps];
	size_t off = at % EMU_WIRE, first = KOLO_MIN(n, EMU_WIRE - off);
	memcpy(dst, ring + off, first);
	memcpy((uint8_t *)dst + first, ring, n - first);
}

/* Runs the head of q's send queue as far as it goes. true when it finished
 * (completed or failed), false when it waits (RNR, a full staging ring). */
static bool send_head(struct emu_qp *q)
{
	struct emu_wqe *w = q->sq;
	struct fab_qp *d = fab_find(q->dest_qpn);
	enum ibv_wc_status st = IBV_WC_SUCCESS;
	bool same = d && d->pid == q->pid;
	if (!d || !pid_alive(d->pid) || d->state == IBV_QPS_ERR || d->state == IBV_QPS_RESET) {
		send_fail(q, IBV_WC_RETRY_EXC_ERR);
		return true;
	}
	/* The address in the QP must be the target port's: a wrong LID or GID
	 * reaches nobody. */
	union ibv_gid g;
	gid_of(d->pid, &g);
	if (opts.roce ? !q->global || memcmp(&g, &q->dgid, sizeof(g)) != 0
	              : q->dlid != lid_of(d->pid)) {
		send_fail(q, IBV_WC_RETRY_EXC_ERR);
		return true;
	}
	size_t len = w->sge.length;
	const uint8_t *src = (const uint8_t *)(uintptr_t)w->sge.addr;
	if (len > 0) {
		struct emu_mr *m = mr_by_key(w->sge.lkey, false, q->pid);
		if (!m || !in_mr(m, w->sge.addr, len)) {
			send_fail(q, IBV_WC_LOC_PROT_ERR);
			return true;
		}
	}
	bool imm = w->wr.opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
	uint32_t immv = imm ? ntohl(w->wr.imm_data) : 0;
	if (same) {
		int r = land(d->local, w->wr.wr.rdma.remote_addr, w->wr.wr.rdma.rkey, src, len, imm,
		             immv, &st);
		if (r == 0) {
			if (q->rnr_retry == 7) {
				stats.rnr_retries++;
				return false;
			}
			send_fail(q, IBV_WC_RNR_RETRY_EXC_ERR);
			return true;
		}
		if (r < 0) {
			send_fail(q, st);
			return true;
		}
	} else {
		do {
			size_t room = EMU_WIRE - (size_t)(d->head - d->tail);
			size_t avail =
			        room > sizeof(struct wire_pkt) ? room - sizeof(struct wire_pkt) : 0;
			size_t n = KOLO_MIN(len - w->staged, avail);
			if (avail == 0 || (n == 0 && len > 0))
				return false; /* the ring is full: the owner drains it */
			struct wire_pkt p = {.raddr = w->wr.wr.rdma.remote_addr + w->staged,
			                     .rkey = w->wr.wr.rdma.rkey,
			                     .len = (uint32_t)n,
			                     .total = (uint32_t)len,
			                     .imm = immv,
			                     .has_imm = imm,
			                     .last = w->staged + n == len};
			wire_copy_in(d, &p, sizeof(p));
			wire_copy_in(d, src + w->staged, n);
			w->staged += n;
			stats.bytes += n;
		} while (w->staged < len);
		stats.writes++;
	}
	q->sq = w->next;
	if (!q->sq)
		q->sq_last = NULL;
	q->sq_n--;
	if (w->wr.send_flags & IBV_SEND_SIGNALED)
		complete(q->qp.send_cq, w->wr.wr_id, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE,
		         q->qp.qp_num);
	free(w);
	return true;
}

/* Lands what other processes staged for q. */
static void drain_wire(struct emu_qp *q)
{
	struct fab_qp *f = &fab->qps[q->fi];
	while (f->head - f->tail >= sizeof(struct wire_pkt)) {
		struct wire_pkt p;
		wire_copy_out(f, f->tail, &p, sizeof(p));
		bool imm = p.has_imm && p.last;
		if (imm && q->rq_n == 0) {
			stats.rnr_retries++;
			return;
		}
		uint8_t *tmp = malloc(p.len ? p.len : 1);
		if (!tmp)
			return;
		wire_copy_out(f, f->tail + sizeof(p), tmp, p.len);
		enum ibv_wc_status st;
		/* Each piece lands alone; the completion reports the whole write. */
		int r = land(q, p.raddr, p.rkey, tmp, p.len, false, 0, &st);
		free(tmp);
		f->tail += sizeof(p) + p.len;
		if (r < 0)
			return;
		if (imm) {
			struct ibv_wc wc;
			memset(&wc, 0, sizeof(wc));
			wc.wr_id = q->rq[q->rq_head];
			q->rq_head = (q->rq_head + 1) % q->max_recv;
			q->rq_n--;
			wc.opcode = IBV_WC_RECV_RDMA_WITH_IMM;
			wc.byte_len = p.total;
			wc.imm_data = htonl(p.imm);
			wc.wc_flags = IBV_WC_WITH_IMM;
			wc.qp_num = q->qp.qp_num;
			cq_push(q->qp.recv_cq, &wc);
			stats.recv_completions++;
		}
	}
}

/* Everything this process's QPs can do now. Under the lock. */
static void pump(void)
{
	pid_t me = getpid();
	for (struct emu_qp *q = qps; q; q = q->next) {
		if (q->pid != me)
			continue; /* a copy inherited through fork: the parent's */
		if (q->qp.state == IBV_QPS_RTR || q->qp.state == IBV_QPS_RTS)
			drain_wire(q);
		if (fab->qps[q->fi].state == IBV_QPS_ERR && q->qp.state != IBV_QPS_ERR)
			qp_error(q); /* a remote access error found by the target */
		while (q->sq && q->qp.state == IBV_QPS_RTS && send_head(q))
			;
	}
}

/* ---- the table ---- */

static struct ibv_device **e_get_device_list(int *num)
{
	snprintf(emu_dev.name, sizeof(emu_dev.name), "%s", "kolo_emu0");
	emu_dev.node_type = IBV_NODE_CA;
	emu_dev.transport_type = IBV_TRANSPORT_IB;
	if (num)
		*num = 1;
	return emu_list;
}

static void e_free_device_list(struct ibv_device **l)
{
	(void)l;
}

static const char *e_get_device_name(struct ibv_device *d)
{
	return d->name;
}

static struct ibv_context *e_open_device(struct ibv_device *d)
{
	if (!fabric_init())
		return NULL;
	struct ibv_context *c = calloc(1, sizeof(*c));
	if (c)
		c->device = d;
	return c;
}

static int e_close_device(struct ibv_context *c)
{
	free(c);
	return 0;
}

static int e_query_device(struct ibv_context *c, struct ibv_device_attr *a)
{
	(void)c;
	memset(a, 0, sizeof(*a));
	a->phys_port_cnt = 1;
	a->max_qp_wr = 16384;
	a->max_cqe = EMU_MAX_CQE;
	a->max_mr_size = UINT64_MAX;
	return 0;
}

static int e_query_port(struct ibv_context *c, uint8_t port, struct ibv_port_attr *a)
{
	(void)c;
	if (port != 1)
		return EINVAL;
	memset(a, 0, sizeof(*a));
	a->state = IBV_PORT_ACTIVE;
	a->max_mtu = a->active_mtu = IBV_MTU_4096;
	a->gid_tbl_len = 4;
	a->max_msg_sz = 1u << 31;
	a->lid = opts.roce ? 0 : lid_of(getpid());
	a->link_layer = opts.roce ? IBV_LINK_LAYER_ETHERNET : IBV_LINK_LAYER_INFINIBAND;
	return 0;
}

static int e_query_gid(struct ibv_context *c, uint8_t port, int index, union ibv_gid *g)
{
	(void)c;
	if (port != 1 || index < 0 || index >= 4)
		return EINVAL;
	memset(g, 0, sizeof(*g));
	if (index == 0)
		gid_of(getpid(), g);
	return 0;
}

static struct ibv_pd *e_alloc_pd(struct ibv_context *c)
{
	struct ibv_pd *pd = calloc(1, sizeof(*pd));
	if (pd)
		pd->context = c;
	return pd;
}

static int e_dealloc_pd(struct ibv_pd *pd)
{
	free(pd);
	return 0;
}

static struct ibv_mr *e_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access)
{
	struct emu_mr *m = calloc(1, sizeof(*m));
	if (!m) {
		errno = ENOMEM;
		return NULL;
	}
	m->mr.context = pd->context;
	m->mr.pd = pd;
	m->mr.addr = addr;
	m->mr.length = len;
	m->access = access;
	m->pid = getpid();
	lock();
	m->mr.lkey = next_key++;
	m->mr.rkey = next_key++ ^ 0x5a5a0000u;
	m->next = mrs;
	mrs = m;
	unlock();
	return &m->mr;
}

static int e_dereg_mr(struct ibv_mr *mr)
{
	struct emu_mr *m = kolo_container_of(mr, struct emu_mr, mr);
	lock();
	for (struct emu_mr **p = &mrs; *p; p = &(*p)->next)
		if (*p == m) {
			*p = m->next;
			break;
		}
	unlock();
	free(m);
	return 0;
}

static struct ibv_comp_channel *e_create_comp_channel(struct ibv_context *c)
{
	struct emu_ch *ch = calloc(1, sizeof(*ch));
	if (!ch)
		return NULL;
	ch->ch.context = c;
	ch->ch.fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (ch->ch.fd < 0) {
		free(ch);
		return NULL;
	}
	return &ch->ch;
}

static int e_destroy_comp_channel(struct ibv_comp_channel *base)
{
	close(base->fd);
	free(kolo_container_of(base, struct emu_ch, ch));
	return 0;
}

static struct ibv_cq *e_create_cq(struct ibv_context *c, int cqe, void *cq_ctx,
                                  struct ibv_comp_channel *ch, int vector)
{
	(void)vector;
	if (cqe < 1 || cqe > EMU_MAX_CQE) {
		errno = EINVAL;
		return NULL;
	}
	struct emu_cq *cq = calloc(1, sizeof(*cq));
	if (!cq)
		return NULL;
	cq->cq.context = c;
	cq->cq.channel = ch;
	cq->cq.cq_context = cq_ctx;
	cq->cq.cqe = cqe;
	return &cq->cq;
}

static int e_destroy_cq(struct ibv_cq *base)
{
	struct emu_cq *cq = kolo_container_of(base, struct emu_cq, cq);
	free(cq->wc);
	free(cq);
	return 0;
}

static int e_req_notify_cq(struct ibv_cq *base, int solicited_only)
{
	(void)solicited_only;
	struct emu_cq *cq = kolo_container_of(base, struct emu_cq, cq);
	lock();
	cq->armed = true;
	unlock();
	return 0;
}

static int e_get_cq_event(struct ibv_comp_channel *base, struct ibv_cq **cq, void **cq_ctx)
{
	struct emu_ch *ch = kolo_container_of(base, struct emu_ch, ch);
	uint64_t v;
	if (read(base->fd, &v, sizeof(v)) != sizeof(v))
		return -1;
	lock();
	*cq = ch->last_cq;
	*cq_ctx = ch->last_cq ? ch->last_cq->cq_context : NULL;
	unlock();
	return *cq ? 0 : -1;
}

static void e_ack_cq_events(struct ibv_cq *cq, unsigned int n)
{
	(void)cq;
	(void)n;
}

static int e_poll_cq(struct ibv_cq *base, int n, struct ibv_wc *out)
{
	struct emu_cq *cq = kolo_container_of(base, struct emu_cq, cq);
	lock();
	pump();
	int got = 0;
	while (got < n && cq->n > 0) {
		int pick = 0;
		if (atomic_load(&opts.reorder) && cq->n > 1) {
			/* A random QP's oldest entry: order within a QP (RC) holds,
			 * order across QPs does not. */
			rng ^= rng << 13;
			rng ^= rng >> 7;
			rng ^= rng << 17;
			uint32_t qpn = cq->wc[rng % (uint64_t)cq->n].qp_num;
			while (cq->wc[pick].qp_num != qpn)
				pick++;
			if (pick)
				stats.reordered++;
		}
		out[got++] = cq->wc[pick];
		memmove(cq->wc + pick, cq->wc + pick + 1,
		        (size_t)(cq->n - pick - 1) * sizeof(*cq->wc));
		cq->n--;
	}
	unlock();
	return got;
}

static struct ibv_qp *e_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *a)
{
	if (a->qp_type != IBV_QPT_RC || !a->send_cq || !a->recv_cq || a->cap.max_send_wr < 1 ||
	    a->cap.max_recv_wr < 1 || a->cap.max_send_sge > 1) {
		errno = EINVAL;
		return NULL;
	}
	struct emu_qp *q = calloc(1, sizeof(*q));
	if (!q)
		return NULL;
	q->max_send = (int)a->cap.max_send_wr;
	q->max_recv = (int)a->cap.max_recv_wr;
	q->rq = calloc((size_t)q->max_recv, sizeof(*q->rq));
	if (!q->rq) {
		free(q);
		return NULL;
	}
	q->qp.context = pd->context;
	q->qp.pd = pd;
	q->qp.send_cq = a->send_cq;
	q->qp.recv_cq = a->recv_cq;
	q->qp.qp_context = a->qp_context;
	q->qp.qp_type = IBV_QPT_RC;
	q->qp.state = IBV_QPS_RESET;
	q->pid = getpid();
	lock();
	int fi = -1;
	for (int i = 0; i < EMU_QPS && fi < 0; i++)
		if (!fab->qps[i].in_use || !pid_alive(fab->qps[i].pid))
			fi = i;
	if (fi < 0) {
		unlock();
		free(q->rq);
		free(q);
		errno = ENOMEM;
		return NULL;
	}
	struct fab_qp *f = &fab->qps[fi];
	memset(f, 0, sizeof(*f));
	f->in_use = 1;
	f->pid = q->pid;
	f->qpn = fab->next_qpn++ & 0xffffff;
	f->state = IBV_QPS_RESET;
	f->local = q;
	q->fi = fi;
	q->qp.qp_num = f->qpn;
	q->next = qps;
	qps = q;
	unlock();
	return &q->qp;
}

static int e_modify_qp(struct ibv_qp *base, struct ibv_qp_attr *a, int mask)
{
	struct emu_qp *q = kolo_container_of(base, struct emu_qp, qp);
	int rc = 0;
	lock();
	enum ibv_qp_state cur = q->qp.state, to = (mask & IBV_QP_STATE) ? a->qp_state : cur;
	if (to == IBV_QPS_ERR) {
		qp_error(q);
	} else if (to == IBV_QPS_INIT && (cur == IBV_QPS_RESET || cur == IBV_QPS_INIT)) {
		if (!(mask & IBV_QP_ACCESS_FLAGS) || !(mask & IBV_QP_PORT) || a->port_num != 1)
			rc = EINVAL;
	} else if (to == IBV_QPS_RTR && cur == IBV_QPS_INIT) {
		int need = IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
		           IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
		if ((mask & need) != need || (opts.roce && !a->ah_attr.is_global)) {
			rc = EINVAL;
		} else {
			q->dest_qpn = a->dest_qp_num;
			q->dlid = a->ah_attr.dlid;
			q->global = a->ah_attr.is_global;
			q->dgid = a->ah_attr.grh.dgid;
		}
	} else if (to == IBV_QPS_RTS && cur == IBV_QPS_RTR) {
		int need = IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
		           IBV_QP_MAX_QP_RD_ATOMIC;
		if ((mask & need) != need)
			rc = EINVAL;
		else
			q->rnr_retry = a->rnr_retry;
	} else if (to != cur) {
		rc = EINVAL;
	}
	if (rc == 0 && to != IBV_QPS_ERR) {
		q->qp.state = to;
		fab->qps[q->fi].state = (int32_t)to;
	}
	unlock();
	return rc;
}

static int e_destroy_qp(struct ibv_qp *base)
{
	struct emu_qp *q = kolo_container_of(base, struct emu_qp, qp);
	lock();
	for (struct emu_qp **p = &qps; *p; p = &(*p)->next)
		if (*p == q) {
			*p = q->next;
			break;
		}
	memset(&fab->qps[q->fi], 0, sizeof(fab->qps[q->fi]));
	while (q->sq) {
		struct emu_wqe *w = q->sq;
		q->sq = w->next;
		free(w);
	}
	unlock();
	free(q->rq);
	free(q);
	return 0;
}

static int e_post_send(struct ibv_qp *base, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
	struct emu_qp *q = kolo_container_of(base, struct emu_qp, qp);
	int rc = 0;
	lock();
	for (; wr; wr = wr->next) {
		bool ok_op =
		        wr->opcode == IBV_WR_RDMA_WRITE || wr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
		if (!ok_op || wr->num_sge > 1 || q->sq_n >= q->max_send ||
		    (q->qp.state != IBV_QPS_RTS && q->qp.state != IBV_QPS_ERR)) {
			rc = q->sq_n >= q->max_send ? ENOMEM : EINVAL;
			*bad = wr;
			break;
		}
		if (q->qp.state == IBV_QPS_ERR) {
			complete(q->qp.send_cq, wr->wr_id, IBV_WC_WR_FLUSH_ERR, IBV_WC_RDMA_WRITE,
			         q->qp.qp_num);
			stats.flushed++;
			continue;
		}
		struct emu_wqe *w = calloc(1, sizeof(*w));
		if (!w) {
			rc = ENOMEM;
			*bad = wr;
			break;
		}
		w->wr = *wr;
		w->wr.next = NULL;
		if (wr->num_sge == 1)
			w->sge = wr->sg_list[0];
		w->wr.sg_list = &w->sge;
		if (q->sq_last)
			q->sq_last->next = w;
		else
			q->sq = w;
		q->sq_last = w;
		q->sq_n++;
	}
	pump();
	unlock();
	return rc;
}

static int e_post_recv(struct ibv_qp *base, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	struct emu_qp *q = kolo_container_of(base, struct emu_qp, qp);
	int rc = 0;
	lock();
	for (; wr; wr = wr->next) {
		if (q->qp.state == IBV_QPS_RESET || q->rq_n >= q->max_recv) {
			rc = q->rq_n >= q->max_recv ? ENOMEM : EINVAL;
			*bad = wr;
			break;
		}
		if (q->qp.state == IBV_QPS_ERR) {
			complete(q->qp.recv_cq, wr->wr_id, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV,
			         q->qp.qp_num);
			stats.flushed++;
			continue;
		}
		q->rq[(q->rq_head + q->rq_n) % q->max_recv] = wr->wr_id;
		q->rq_n++;
	}
	pump();
	unlock();
	return rc;
}

static const char *e_wc_status_str(enum ibv_wc_status st)
{
	switch (st) {
	case IBV_WC_SUCCESS:
		return "success";
	case IBV_WC_LOC_PROT_ERR:
		return "local protection error";
	case IBV_WC_WR_FLUSH_ERR:
		return "Work Request Flushed Error";
	case IBV_WC_REM_ACCESS_ERR:
		return "remote access error";
	case IBV_WC_RETRY_EXC_ERR:
		return "transport retry counter exceeded";
	case IBV_WC_RNR_RETRY_EXC_ERR:
		return "RNR retry counter exceeded";
	default:
		return "error";
	}
}

static int e_block_cap_ms(void)
{
	return 2; /* a write staged by another process wakes nobody */
}

static const struct verbs_api emu_api = {
        .name = "emulation",
        .emulated = true,
        .get_device_list = e_get_device_list,
        .free_device_list = e_free_device_list,
        .get_device_name = e_get_device_name,
        .open_device = e_open_device,
        .close_device = e_close_device,
        .query_device = e_query_device,
        .query_port = e_query_port,
        .query_gid = e_query_gid,
        .alloc_pd = e_alloc_pd,
        .dealloc_pd = e_dealloc_pd,
        .reg_mr = e_reg_mr,
        .dereg_mr = e_dereg_mr,
        .create_comp_channel = e_create_comp_channel,
        .destroy_comp_channel = e_destroy_comp_channel,
        .create_cq = e_create_cq,
        .destroy_cq = e_destroy_cq,
        .req_notify_cq = e_req_notify_cq,
        .get_cq_event = e_get_cq_event,
        .ack_cq_events = e_ack_cq_events,
        .poll_cq = e_poll_cq,
        .create_qp = e_create_qp,
        .modify_qp = e_modify_qp,
        .destroy_qp = e_destroy_qp,
        .post_send = e_post_send,
        .post_recv = e_post_recv,
        .wc_status_str = e_wc_status_str,
        .block_cap_ms = e_block_cap_ms,
};

/* ---- the test hooks (transport_verbs.h) ---- */

void kolo_verbs_emu_enable(const struct kolo_verbs_emu_opts *o)
{
	opts.roce = o && o->roce;
	atomic_store(&opts.reorder, o && o->reorder);
	vb_loader_use(&emu_api);
}

void kolo_verbs_emu_set_reorder(bool on)
{
	atomic_store(&opts.reorder, on);
}

kolo_status_t kolo_verbs_emu_qp_error(uint32_t qpn)
{
	if (!fab)
		return KOLO_ENOTFOUND;
	kolo_status_t st = KOLO_ENOTFOUND;
	lock();
	struct fab_qp *f = fab_find(qpn);
	if (f && f->pid == getpid() && f->local) {
		qp_error(f->local);
		st = KOLO_OK;
	} else if (f) {
		f->state = IBV_QPS_ERR; /* its owner flushes it at its next call */
		st = KOLO_OK;
	}
	unlock();
	return st;
}

void kolo_verbs_emu_stats(struct kolo_verbs_emu_stats *out)
{
	if (!fab) {
		memset(out, 0, sizeof(*out));
		return;
	}
	lock();
	*out = stats;
	unlock();
}
