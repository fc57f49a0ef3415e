/* args: the one judge of a public collective's arguments (runtime.h). The
 * blocking entry points (api.c) and the async ones (async.c) call the same
 * functions here before anything runs, so a bad call gets the same status and
 * the same message on both paths, and the layers below (ring/, fusion/) never
 * see one. */
#include "runtime.h"

#include "gpu.h"
#include "ring.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* The longest name of an async operation, as fusion's negotiation takes it. */
#define NAME_MAX_BYTES 1023

kolo_status_t kolo_args_fail(struct kolo_comm *comm, const char *coll, const char *fmt, ...)
{
	char what[KOLO_ERRBUF_SIZE];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	return kolo_comm_fail(comm, KOLO_EINVAL, "%s: %s", coll, what);
}

kolo_status_t kolo_args_comm(struct kolo_comm *comm, const char *coll)
{
	/* No comm, no place for a message: kolo_last_error(NULL) says why. */
	if (!comm)
		return KOLO_EINVAL;
	if (!comm->ring)
		return kolo_args_fail(comm, coll,
		                      "the comm has no data plane (finalized, or its "
		                      "last re-form did not complete)");
	return kolo_runtime_set_check(comm, coll);
}

kolo_status_t kolo_args_dtype(struct kolo_comm *comm, const char *coll, kolo_dtype_t dtype)
{
	if ((unsigned)dtype >= KOLO_DTYPE_COUNT)
		return kolo_args_fail(comm, coll, "invalid dtype %d", (int)dtype);
	return KOLO_OK;
}

/* Every element-wise op is defined on every dtype (ring/reduce.c has a
 * kernel for each pair; AVERAGE on integers rounds like any integer
 * scaling). Adasum: allreduces of floating-point host memory only. */
static kolo_status_t check_op(struct kolo_comm *comm, const char *coll, kolo_op_t op,
                              kolo_dtype_t dtype, bool adasum_ok)
{
	if (op == KOLO_ADASUM && adasum_ok) {
		if (!kolo_adasum_dtype(dtype))
			return kolo_args_fail(comm, coll,
			                      "adasum takes float16, bfloat16, float32 or float64, "
			                      "not %s",
			                      kolo_dtype_name(dtype));
		return KOLO_OK;
	}
	if ((unsigned)op >= KOLO_OP_COUNT)
		return kolo_args_fail(comm, coll, "invalid op %d%s", (int)op,
		                      op == KOLO_ADASUM ? " (adasum is for allreduce only)" : "");
	return KOLO_OK;
}

/* A NaN or infinite factor would turn every element into NaN or Inf (and
 * integers into undefined conversions). */
static kolo_status_t check_scales(struct kolo_comm *comm, const char *coll, double prescale,
                                  double postscale)
{
	if (!isfinite(prescale))
		return kolo_args_fail(comm, coll, "prescale %g is not finite", prescale);
	if (!isfinite(postscale))
		return kolo_args_fail(comm, coll, "postscale %g is not finite", postscale);
	return KOLO_OK;
}

kolo_status_t kolo_args_elements(struct kolo_comm *comm, const char *coll, size_t count,
                                 size_t blocks, kolo_dtype_t dtype, size_t *total)
{
	size_t es = kolo_dtype_size(dtype);
	if (blocks && count > SIZE_MAX / blocks / es) {
		if (blocks == 1)
			return kolo_args_fail(
			        comm, coll, "%zu elements of %zu bytes overflow size_t", count, es);
		return kolo_args_fail(comm, coll, "%zu x %zu elements of %zu bytes overflow size_t",
		                      blocks, count, es);
	}
	if (total)
		*total = count * blocks;
	return KOLO_OK;
}

kolo_status_t kolo_args_counts(struct kolo_comm *comm, const char *coll, const char *what,
                               const size_t *counts, kolo_dtype_t dtype, size_t *total)
{
	if (!counts)
		return kolo_args_fail(comm, coll, "%s is NULL", what);
	size_t es = kolo_dtype_size(dtype), sum = 0;
	for (int i = 0; i < comm->assignment.size; i++) {
		if (counts[i] > SIZE_MAX / es - sum)
			return kolo_args_fail(comm, coll,
			                      "%s[0..%d] add up to more bytes than size_t holds",
			                      what, i);
		sum += counts[i];
	}
	if (total)
		*total = sum;
	return KOLO_OK;
}

/* Buffers of device memory seen by this thread's checks since the reset. */
static _Thread_local int mem_device;

/* Where no device pointer can exist (core/gpu.h) neither touches the
 * thread-local: in a shared library each access is a call. */
void kolo_args_mem_reset(void)
{
	if (kolo_gpu_maybe_device())
		mem_device = 0;
}

int kolo_args_mem_device(void)
{
	return kolo_gpu_maybe_device() ? mem_device : 0;
}

/* Device memory takes the device path (runtime/device.c) where it can run,
 * and is refused with the reason where it cannot, rather than faulting inside
 * a transport. Where no GPU is visible kolo_mem_kind is one branch (core/gpu.h).
 * Managed memory is host memory here: the CPU path reads it. */
static kolo_status_t check_host(struct kolo_comm *comm, const char *coll, const char *what,
                                const void *ptr)
{
	if (kolo_mem_kind(ptr) != KOLO_MEM_DEVICE)
		return KOLO_OK;
	const char *why;
	if (kolo_gpu_usable(&why)) {
		mem_device++;
		return KOLO_OK;
	}
	return kolo_comm_fail(comm, KOLO_EUNSUPPORTED,
	                      "%s: %s is CUDA device memory, which this process cannot use: %s "
	                      "(docs/gpu.md)",
	                      coll, what, why);
}

kolo_status_t kolo_args_buf(struct kolo_comm *comm, const char *coll, const char *what,
                            const void *buf, size_t count)
{
	if (!buf && count > 0)
		return kolo_args_fail(comm, coll, "%s is NULL with %zu elements", what, count);
	return check_host(comm, coll, what, buf);
}

kolo_status_t kolo_args_same_memory(struct kolo_comm *comm, const char *coll, const void *sendbuf,
                                    size_t sendcount, const void *recvbuf, size_t recvcount)
{
	if (!sendcount || !recvcount)
		return KOLO_OK;
	bool dev_s = kolo_mem_kind(sendbuf) == KOLO_MEM_DEVICE;
	bool dev_r = kolo_mem_kind(recvbuf) == KOLO_MEM_DEVICE;
	if (dev_s != dev_r)
		return kolo_args_fail(comm, coll, "sendbuf is %s memory and recvbuf %s memory",
		                      dev_s ? "device" : "host", dev_r ? "device" : "host");
	return KOLO_OK;
}

kolo_status_t kolo_args_ptr(struct kolo_comm *comm, const char *coll, const char *what,
                            const void *ptr)
{
	if (!ptr)
		return kolo_args_fail(comm, coll, "%s is NULL", what);
	return check_host(comm, coll, what, ptr);
}

kolo_status_t kolo_args_name(struct kolo_comm *comm, const char *coll, const char *what,
                             const char *name)
{
	if (!name)
		return kolo_args_fail(comm, coll, "%s is NULL", what);
	size_t len = strlen(name);
	if (len == 0)
		return kolo_args_fail(comm, coll, "%s is empty", what);
	if (len > NAME_MAX_BYTES)
		return kolo_args_fail(comm, coll, "%s has %zu bytes, more than %d", what, len,
		                      NAME_MAX_BYTES);
	return KOLO_OK;
}

/* ---- one function per collective: the checks both paths share ---------- */

/* Adasum runs on the host: device buffers are refused (the checks before
 * counted them, kolo_args_mem_device). */
static kolo_status_t adasum_host(struct kolo_comm *comm, const char *coll, const void *sendbuf,
                                 const void *recvbuf, size_t count)
{
	if (count && kolo_gpu_maybe_device() &&
	    (kolo_mem_kind(sendbuf) != KOLO_MEM_HOST || kolo_mem_kind(recvbuf) != KOLO_MEM_HOST)) {
		kolo_comm_fail(comm, KOLO_EUNSUPPORTED,
		               "%s: adasum reduces host memory only; this buffer is CUDA device "
		               "memory",
		               coll);
		return KOLO_EUNSUPPORTED;
	}
	return KOLO_OK;
}

/* What every reduction checks: comm, dtype, op, scales, the byte count of
 * count elements and the send buffer. */
static kolo_status_t check_reduction(struct kolo_comm *comm, const char *coll, const void *sendbuf,
                                     size_t count, kolo_dtype_t dtype, kolo_op_t op,
                                     double prescale, double postscale)
{
	KOLO_CHECK(kolo_args_comm(comm, coll));
	KOLO_CHECK(kolo_args_dtype(comm, coll, dtype));
	KOLO_CHECK(check_op(comm, coll, op, dtype, strcmp(coll, "allreduce") == 0));
	KOLO_CHECK(check_scales(comm, coll, prescale, postscale));
	KOLO_CHECK(kolo_args_elements(comm, coll, count, 1, dtype, NULL));
	return kolo_args_buf(comm, coll, "sendbuf", sendbuf, count);
}

kolo_status_t kolo_args_allreduce(struct kolo_comm *comm, const void *sendbuf, const void *recvbuf,
                                  size_t count, kolo_dtype_t dtype, kolo_op_t op, double prescale,
                                  double postscale)
{
	static const char coll[] = "allreduce";
	KOLO_CHECK(check_reduction(comm, coll, sendbuf, count, dtype, op, prescale, postscale));
	KOLO_CHECK(kolo_args_buf(comm, coll, "recvbuf", recvbuf, count));
	return op == KOLO_ADASUM ? adasum_host(comm, coll, sendbuf, recvbuf, count) : KOLO_OK;
}

kolo_status_t kolo_args_reducescatter(struct kolo_comm *comm, const void *sendbuf,
                                      const void *recvbuf, size_t count, kolo_dtype_t dtype,
                                      kolo_op_t op, double prescale, double postscale)
{
	static const char coll[] = "reducescatter";
	KOLO_CHECK(check_reduction(comm, coll, sendbuf, count, dtype, op, prescale, postscale));
	return kolo_args_buf(
	        comm, coll, "recvbuf", recvbuf,
	        kolo_reducescatter_count(count, comm->assignment.size, comm->assignment.rank));
}

kolo_status_t kolo_args_broadcast(struct kolo_comm *comm, const void *buf, size_t count,
                                  kolo_dtype_t dtype, int root)
{
	static const char coll[] = "broadcast";
	KOLO_CHECK(kolo_args_comm(comm, coll));
	KOLO_CHECK(kolo_args_dtype(comm, coll, dtype));
	if (root < 0 || root >= comm->assignment.size)
		return kolo_args_fail(comm, coll, "root %d is not a rank of 0..%d", root,
		                      comm->assignment.size - 1);
	KOLO_CHECK(kolo_args_elements(comm, coll, count, 1, dtype, NULL));
	return kolo_args_buf(comm, coll, "buf", buf, count);
}

kolo_status_t kolo_args_allgather(struct kolo_comm *comm, const void *sendbuf, size_t sendcount,
                                  kolo_dtype_t dtype)
{
	static const char coll[] = "allgather";
	KOLO_CHECK(kolo_args_comm(comm, coll));
	KOLO_CHECK(kolo_args_dtype(comm, coll, dtype));
	KOLO_CHECK(kolo_args_elements(comm, coll, sendcount, 1, dtype, NULL));
	return kolo_args_buf(comm, coll, "sendbuf", sendbuf, sendcount);
}

kolo_status_t kolo_args_alltoall(struct kolo_comm *comm, const void *sendbuf, size_t count,
                                 const size_t *sendcounts, kolo_dtype_t dtype, size_t *total)
{
	static const char coll[] = "alltoall";
	KOLO_CHECK(kolo_args_comm(comm, coll));
	KOLO_CHECK(kolo_args_dtype(comm, coll, dtype));
	size_t sum = count;
	if (sendcounts) {
		KOLO_CHECK(kolo_args_counts(comm, coll, "sendcounts", sendcounts, dtype, &sum));
	} else {
		KOLO_CHECK(kolo_args_elements(comm, coll, count, 1, dtype, NULL));
		if (count % (size_t)comm->assignment.size)
			return kolo_args_fail(comm, coll,
			                      "count %zu does not split evenly over %d ranks",
			                      count, comm->assignment.size);
	}
	KOLO_CHECK(kolo_args_buf(comm, coll, "sendbuf", sendbuf, sum));
	if (total)
		*total = sum;
	return KOLO_OK;
}

kolo_status_t kolo_args_grouped_allreduce(struct kolo_comm *comm, int n, const char *const *names,
                                          const void *const *sendbufs, void *const *recvbufs,
                                          const size_t *counts, kolo_dtype_t dtype, kolo_op_t op,
                                          double prescale, double postscale)
{
	static const char coll[] = "grouped allreduce";
	KOLO_CHECK(kolo_args_comm(comm, coll));
	KOLO_CHECK(kolo_args_dtype(comm, coll, dtype));
	KOLO_CHECK(check_op(comm, coll, op, dtype, true));
	KOLO_CHECK(check_scales(comm, coll, prescale, postscale));
	if (n < 1)
		return kolo_args_fail(comm, coll, "n is %d; a group needs at least one tensor", n);
	KOLO_CHECK(kolo_args_ptr(comm, coll, "names", names));
	KOLO_CHECK(kolo_args_ptr(comm, coll, "sendbufs", sendbufs));
	KOLO_CHECK(kolo_args_ptr(comm, coll, "recvbufs", recvbufs));
	KOLO_CHECK(kolo_args_ptr(comm, coll, "counts", counts));
	/* The group is reduced in one fusion buffer: its total must fit too. */
	size_t es = kolo_dtype_size(dtype), sum = 0;
	char what[32];
	for (int i = 0; i < n; i++) {
		snprintf(what, sizeof(what), "names[%d]", i);
		KOLO_CHECK(kolo_args_name(comm, coll, what, names[i]));
		for (int j = 0; j < i; j++)
			if (strcmp(names[i], names[j]) == 0)
				return kolo_args_fail(comm, coll,
				                      "names[%d] and names[%d] are both '%s'", j, i,
				                      names[i]);
		if (counts[i] > SIZE_MAX / es - sum)
			return kolo_args_fail(
			        comm, coll, "counts[0..%d] add up to more bytes than size_t holds",
			        i);
		sum += counts[i];
		snprintf(what, sizeof(what), "sendbufs[%d]", i);
		KOLO_CHECK(kolo_args_buf(comm, coll, what, sendbufs[i], counts[i]));
		snprintf(what, sizeof(what), "recvbufs[%d]", i);
		KOLO_CHECK(kolo_args_buf(comm, coll, what, recvbufs[i], counts[i]));
		if (op == KOLO_ADASUM)
			KOLO_CHECK(adasum_host(comm, coll, sendbufs[i], recvbufs[i], counts[i]));
	}
	return KOLO_OK;
}
