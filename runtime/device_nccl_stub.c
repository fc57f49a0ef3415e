/* device_nccl_stub: the NCCL path's defaults (runtime.h): it never applies,
 * so every device collective runs staged, and there is no communicator to
 * reset. Weak, so that device_nccl.c's definitions replace them where that
 * file is built. */
#include "runtime.h"

__attribute__((weak)) kolo_status_t kolo_device_nccl_try(struct kolo_comm *comm,
                                                         struct kolo_ring_comm *rc,
                                                         const struct kolo_dcoll *c,
                                                         struct kolo_errbuf *eb)
{
	(void)comm, (void)rc, (void)c, (void)eb;
	return KOLO_EUNSUPPORTED;
}

__attribute__((weak)) void kolo_device_nccl_reset(struct kolo_comm *comm)
{
	(void)comm;
}
