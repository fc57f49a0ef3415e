/* verbs_qp: a conn's RC queue pair and its registered area, and the
 * INIT→RTR→RTS bring-up from what the peer sent (as rdma-core's
 * rc_pingpong does it). */
#include "verbs_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* The area: the peer's slots (it writes there), this side's send staging
 * (same shape), the ctrl area the peer writes RTRs into, and the one this
 * side writes its RTRs from. */
static size_t slots_len(const struct vb_transport *t)
{
	return (size_t)t->nslots * t->slot_bytes;
}

int vb_qp_post_recv(struct vb_conn *c)
{
	/* A write with immediate consumes a receive but no buffer. 0xff: the
	 * receive kind of the wr_id (verbs_stream.c). */
	struct ibv_recv_wr wr = {.wr_id = c->id << 8 | 0xff, .sg_list = NULL, .num_sge = 0};
	struct ibv_recv_wr *bad = NULL;
	return c->t->api->post_recv(c->qp, &wr, &bad);
}

kolo_status_t vb_qp_setup(struct vb_conn *c, struct vb_qpinfo *mine)
{
	struct vb_transport *t = c->t;
	const struct verbs_api *api = t->api;
	c->area_len = 2 * slots_len(t) + 2 * VB_CTRL_BYTES;
	void *p =
	        mmap(NULL, c->area_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED) {
		c->area = NULL;
		return KOLO_ENOMEM;
	}
	c->area = p;
	c->mr = api->reg_mr(t->pd, c->area, c->area_len,
	                    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!c->mr) {
		kolo_fail(&t->base.err, KOLO_ESYSTEM, "verbs: registering %zu bytes: %s%s",
		          c->area_len, strerror(errno),
		          errno == ENOMEM ? " (RLIMIT_MEMLOCK too low?)" : "");
		return KOLO_ESYSTEM;
	}
	/* Sends: slot writes (bounded by credits), credit returns, an RTR and
	 * the writes of an in-place message. Receives: one per write with
	 * immediate the peer may have in flight (docs/transport.md). */
	c->sq_depth = 2 * t->nslots + 8;
	int rq = 2 * t->nslots + 8;
	struct ibv_qp_init_attr ia = {
	        .send_cq = t->cq,
	        .recv_cq = t->cq,
	        .cap = {.max_send_wr = (uint32_t)c->sq_depth,
	                .max_recv_wr = (uint32_t)rq,
	                .max_send_sge = 1,
	                .max_recv_sge = 1},
	        .qp_type = IBV_QPT_RC,
	};
	c->qp = api->create_qp(t->pd, &ia);
	if (!c->qp) {
		kolo_fail(&t->base.err, KOLO_ESYSTEM, "verbs: create_qp: %s", strerror(errno));
		return KOLO_ESYSTEM;
	}
	struct ibv_qp_attr a = {
	        .qp_state = IBV_QPS_INIT,
	        .pkey_index = 0,
	        .port_num = t->port,
	        .qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE,
	};
	if (api->modify_qp(c->qp, &a,
	                   IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) !=
	    0) {
		kolo_fail(&t->base.err, KOLO_ESYSTEM, "verbs: QP to INIT failed");
		return KOLO_ESYSTEM;
	}
	for (int i = 0; i < rq; i++)
		if (vb_qp_post_recv(c) != 0) {
			kolo_fail(&t->base.err, KOLO_ESYSTEM, "verbs: post_recv failed");
			return KOLO_ESYSTEM;
		}
	uint32_t psn = 0;
	kolo_random_bytes(&psn, sizeof(psn));
	c->psn = psn & 0xffffff;
	memset(mine, 0, sizeof(*mine));
	mine->qpn = c->qp->qp_num;
	mine->psn = c->psn;
	mine->area_addr = (uint64_t)(uintptr_t)c->area;
	mine->rkey = c->mr->rkey;
	mine->nslots = (uint32_t)t->nslots;
	mine->slot_bytes = t->slot_bytes;
	mine->lid = t->lid;
	memcpy(mine->gid, t->gid.raw, 16);
	c->credits = t->nslots;
	return KOLO_OK;
}

kolo_status_t vb_qp_connect(struct vb_conn *c)
{
	struct vb_transport *t = c->t;
	const struct verbs_api *api = t->api;
	struct ibv_qp_attr a = {
	        .qp_state = IBV_QPS_RTR,
	        .path_mtu = t->mtu,
	        .dest_qp_num = c->peer.qpn,
	        .rq_psn = c->peer.psn,
	        .max_dest_rd_atomic = 1,
	        .min_rnr_timer = 12,
	        .ah_attr = {.dlid = c->peer.lid, .sl = 0, .src_path_bits = 0, .port_num = t->port},
	};
	/* RoCE routes by GID (a GRH in every packet); InfiniBand by LID. */
	if (t->roce) {
		a.ah_attr.is_global = 1;
		memcpy(a.ah_attr.grh.dgid.raw, c->peer.gid, 16);
		a.ah_attr.grh.sgid_index = (uint8_t)t->gid_index;
		a.ah_attr.grh.hop_limit = 64;
	}
	if (api->modify_qp(c->qp, &a,
	                   IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
	                           IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
	                           IBV_QP_MIN_RNR_TIMER) != 0)
		return KOLO_ESYSTEM;
	struct ibv_qp_attr b = {
	        .qp_state = IBV_QPS_RTS,
	        .timeout = 14,  /* 4.096 us * 2^14: 67 ms per try */
	        .retry_cnt = 7, /* a dead peer: about half a second */
	        .rnr_retry = 7, /* infinite: credits make RNR impossible anyway */
	        .sq_psn = c->psn,
	        .max_rd_atomic = 1,
	};
	if (api->modify_qp(c->qp, &b,
	                   IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
	                           IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) != 0)
		return KOLO_ESYSTEM;
	return KOLO_OK;
}

void vb_qp_teardown(struct vb_conn *c)
{
	const struct verbs_api *api = c->t->api;
	if (c->qp)
		api->destroy_qp(c->qp);
	if (c->mr)
		api->dereg_mr(c->mr);
	if (c->area)
		munmap(c->area, c->area_len);
	c->qp = NULL;
	c->mr = NULL;
	c->area = NULL;
}
