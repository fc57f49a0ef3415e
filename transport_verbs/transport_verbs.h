/* transport_verbs: InfiniBand and RoCE over libibverbs (docs/transport.md,
 * "Verbs"). Not yet run on hardware: CI runs it against an in-process
 * emulation of the verbs it uses, which exercises the protocol, not a NIC.
 *
 * Each conn is one reliable-connected QP; its peer's messages arrive by RDMA
 * write with immediate into a ring of slots the receiver registered for it,
 * the immediate carrying type, slot and length; slots are credits the
 * receiver returns in batches. Messages of at least cfg.verbs_rdv_bytes are
 * written straight into the receiver's registered buffer instead. A small
 * TCP socket per conn (the "CM socket", as rdma_cm and NCCL's IB transport
 * keep one) carries the authenticated handshake that exchanges the QPs, and
 * reports a dead peer at once. libibverbs is loaded with dlopen at run time:
 * without it, or without an active port, create() fails and says why. */
#ifndef KOLO_TRANSPORT_VERBS_H
#define KOLO_TRANSPORT_VERBS_H

#include <stdbool.h>
#include <stdint.h>

#include "transport.h"

extern const struct kolo_transport_ops kolo_transport_verbs_ops;

/* Whether verbs can carry this process's data plane: libibverbs loads and
 * the device that ib_device / iface pick (NULL or "": the first) has an
 * active port. When not, eb says why ("no RDMA device: libibverbs not
 * found", "no active port", ...). Thread-safe; opens and closes the device. */
bool kolo_verbs_available(const char *ib_device, const char *iface, struct kolo_errbuf *eb);

/* What kolo-info reports. */
struct kolo_verbs_port_info {
	int port;
	bool active;
	bool roce; /* link layer Ethernet; else InfiniBand */
	uint16_t lid;
};
struct kolo_verbs_dev_info {
	char name[64];
	int nports;
	struct kolo_verbs_port_info ports[4];
};
struct kolo_verbs_info {
	bool loaded;                /* the library (or the emulation) answered */
	bool emulated;              /* the emulation is in use: a protocol test, not a NIC */
	char why[KOLO_ERRBUF_SIZE]; /* when !loaded, or when no device was found */
	int ndevs;
	struct kolo_verbs_dev_info devs[8];
};
void kolo_verbs_query(struct kolo_verbs_info *out);

/* ---- the test double (verbs_emu.c) ----
 * An emulation of the verbs the transport uses: devices, PDs, MRs, CQs with
 * completion channels, RC QPs and their state machine, RDMA write with
 * immediate. A write lands only inside a registered region with the right
 * rkey (else both QPs go to error, as a remote access error does); a write
 * with immediate consumes a posted receive (RNR retry otherwise); a QP in
 * error flushes its work requests with IBV_WC_WR_FLUSH_ERR. QPs of two
 * processes (a fork after the first endpoint was created) meet in shared
 * memory; there the bytes cross through a staging ring and a send completes
 * once staged. Never chosen unless a program calls kolo_verbs_emu_enable. */
struct kolo_verbs_emu_opts {
	bool roce;    /* the port is Ethernet (GIDs, no LID) instead of InfiniBand */
	bool reorder; /* completions of different QPs leave a CQ shuffled */
};
/* Routes every verbs call of this process, and of children it forks, to the
 * emulation. Tests only; call before any verbs endpoint exists. */
void kolo_verbs_emu_enable(const struct kolo_verbs_emu_opts *opts);
void kolo_verbs_emu_set_reorder(bool on);
/* Forces the QP into the error state, as a failing link would. */
kolo_status_t kolo_verbs_emu_qp_error(uint32_t qpn);
/* Counters of what the emulation did (for tests' assertions). */
struct kolo_verbs_emu_stats {
	uint64_t writes, bytes, recv_completions, reordered, rnr_retries, flushed,
	        remote_access_errors;
};
void kolo_verbs_emu_stats(struct kolo_verbs_emu_stats *out);

/* The QP number of a verbs conn (tests: to fail it with the emulation). */
uint32_t kolo_verbs_conn_qpn(struct kolo_conn *c);

#endif /* KOLO_TRANSPORT_VERBS_H */
