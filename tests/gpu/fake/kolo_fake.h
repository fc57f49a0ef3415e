/* kolo_fake.h: the test-only exports of the fake libcudart.so.13 (and the
 * hook the fake libnccl.so.2 uses). Tests find them with dlsym, or link the
 * fake directly; they do not exist in the real runtime, so code under test
 * never calls them. */
#ifndef KOLO_FAKE_H
#define KOLO_FAKE_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

/* Host address of the shadow of a device address (interior pointers too),
 * or NULL when devptr is not inside a cudaMalloc allocation. */
void *kolo_fake_cuda_shadow(const void *devptr);

/* The same for [devptr, devptr + bytes), which must lie in one allocation;
 * *device (optional) receives its ordinal. NULL otherwise. */
void *kolo_fake_cuda_shadow_range(const void *devptr, size_t bytes, int *device);

/* Bytes and operations copied so far in this process, indexed by the
 * resolved cudaMemcpyKind (HostToHost..DeviceToDevice, never Default);
 * cudaMemset counts as DeviceToDevice. Either array may be NULL. */
void kolo_fake_cuda_stats(uint64_t bytes[4], uint64_t ops[4]);

/* Queues fn(arg) on stream (0, cudaStreamLegacy, cudaStreamPerThread or a
 * created stream), run by the stream's worker in order with the rest of its
 * work: what the fake NCCL's collectives are. */
cudaError_t kolo_fake_cuda_enqueue(cudaStream_t stream, void (*fn)(void *), void *arg);

#endif
