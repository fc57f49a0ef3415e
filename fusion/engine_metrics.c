/* engine_metrics: what a completed async operation adds to the worker's
 * metrics (core/metrics.h): its family, its bytes and the time from its
 * enqueue. JOIN and EXCLUSIVE are not collectives of their own: a blocking
 * collective that runs as EXCLUSIVE is counted by the blocking API. */
#include "fusion_internal.h"

static const int kind_metric[KOLO_FK_COUNT] = {
        [KOLO_FK_ALLREDUCE] = KOLO_MCOLL_ALLREDUCE + 1,
        [KOLO_FK_GROUP] = KOLO_MCOLL_ALLREDUCE + 1,
        [KOLO_FK_ALLGATHER] = KOLO_MCOLL_ALLGATHER + 1,
        [KOLO_FK_BROADCAST] = KOLO_MCOLL_BROADCAST + 1,
        [KOLO_FK_ALLTOALL] = KOLO_MCOLL_ALLTOALL + 1,
        [KOLO_FK_REDUCESCATTER] = KOLO_MCOLL_REDUCESCATTER + 1,
        [KOLO_FK_BARRIER] = KOLO_MCOLL_BARRIER + 1,
}; /* + 1: 0 means not counted */

void fusion_engine_metrics_done(const struct kolo_engine *e, const struct fusion_queued_op *o,
                                kolo_status_t st)
{
	int kind = o->op.kind;
	if (!kolo_metrics_enabled() || kind <= 0 || kind >= KOLO_FK_COUNT || !kind_metric[kind])
		return;
	uint64_t elems = fusion_params_total(&o->p);
	/* An allgather counts its output: every rank's count, known (in the
	 * caller's recvcounts) once it has succeeded. */
	if (kind == KOLO_FK_ALLGATHER && st == KOLO_OK && o->op.recvcounts) {
		elems = 0;
		for (int r = 0; r < e->size; r++)
			elems += o->op.recvcounts[r];
	}
	uint64_t bytes =
	        kind == KOLO_FK_BARRIER ? 0 : elems * kolo_dtype_size((kolo_dtype_t)o->p.dtype);
	kolo_metrics_coll_done((enum kolo_metrics_coll)(kind_metric[kind] - 1), KOLO_MMODE_ASYNC,
	                       bytes, o->enqueued_ns, st);
}
