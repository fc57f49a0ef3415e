"""The kolo module on CUDA device memory without torch's CUDA: buffers are
objects with ``__cuda_array_interface__`` over cudaMalloc'd memory of the
CUDA runtime found first (the fake of tests/gpu/fake through
LD_LIBRARY_PATH on machines without a GPU, the real one on a GPU machine).

Each input is written on a stream of the worker's own with cudaMemcpyAsync
just before the operation is issued, without waiting, behind a host
function that holds the stream for 50 ms: kolo must order its work after
that stream (the interface's ``stream``), or it reduces the zeros the
buffer held before. Results are read back
with cudaMemcpy and checked against float64 references computed here.
Reports {"case", "ok", "detail"} per case, then {"cases": n}."""

import ctypes
import sys
import time

import numpy as np

import kolo
from _common import Cases, report

rt = ctypes.CDLL("libcudart.so.13")
for name, args in {"cudaMalloc": [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t],
                   "cudaFree": [ctypes.c_void_p],
                   "cudaMemcpy": [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int],
                   "cudaMemcpyAsync": [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                       ctypes.c_int, ctypes.c_void_p],
                   "cudaStreamCreate": [ctypes.POINTER(ctypes.c_void_p)],
                   "cudaStreamSynchronize": [ctypes.c_void_p],
                   "cudaSetDevice": [ctypes.c_int]}.items():
    getattr(rt, name).argtypes = args
    getattr(rt, name).restype = ctypes.c_int
DEFAULT = 4  # cudaMemcpyDefault
HOSTFN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
rt.cudaLaunchHostFunc.argtypes = [ctypes.c_void_p, HOSTFN, ctypes.c_void_p]
rt.cudaLaunchHostFunc.restype = ctypes.c_int


@HOSTFN
def hold(_arg):
    # On the stream's own thread: what follows on the stream waits for it.
    time.sleep(0.05)


def ck(rc, what):
    if rc != 0:
        raise RuntimeError(f"{what}: CUDA error {rc}")


kolo.init()
R, N = kolo.rank(), kolo.size()
ck(rt.cudaSetDevice(0), "cudaSetDevice")
STREAM = ctypes.c_void_p()
ck(rt.cudaStreamCreate(ctypes.byref(STREAM)), "cudaStreamCreate")
keep = []  # host arrays of asynchronous copies, alive until the end


class DeviceArray:
    """count float32 elements of device memory, with the interface."""

    def __init__(self, count, stream=None):
        p = ctypes.c_void_p()
        ck(rt.cudaMalloc(ctypes.byref(p), max(count, 1) * 4), "cudaMalloc")
        self.ptr, self.count = p.value, count
        self.__cuda_array_interface__ = {"shape": (count,), "typestr": "<f4", "version": 3,
                                         "data": (self.ptr, False), "strides": None,
                                         "stream": stream}

    def write_async(self, values):
        a = np.ascontiguousarray(values, dtype=np.float32)
        keep.append(a)
        ck(rt.cudaLaunchHostFunc(STREAM, hold, None), "cudaLaunchHostFunc")
        ck(rt.cudaMemcpyAsync(self.ptr, a.ctypes.data, a.nbytes, DEFAULT, STREAM), "h2d")

    def read(self):
        a = np.empty(self.count, np.float32)
        ck(rt.cudaMemcpy(a.ctypes.data, self.ptr, a.nbytes, DEFAULT), "d2h")
        return a


def inp(case, rank, n):
    g = np.random.default_rng([sum(map(ord, case)), rank])
    return g.integers(-8, 9, n).astype(np.float64)


def same(got, ref, what):
    ref = np.asarray(ref, np.float64)
    if got.shape != ref.shape:
        return f"{what}: {got.shape} != {ref.shape}"
    bad = np.flatnonzero(got.astype(np.float64) != ref)
    return None if bad.size == 0 else f"{what}: {bad.size} wrong, first [{bad[0]}]"


def on_stream(case, n):
    d = DeviceArray(n, stream=STREAM.value)
    d.write_async(inp(case, R, n))
    return d


def c_allreduce():
    n = 1 << 18
    d = on_stream("ar", n)
    kolo.allreduce_async(d, name="f.ar", op="sum").wait()
    return same(d.read(), sum(inp("ar", r, n) for r in range(N)), "allreduce")


def c_allreduce_out_of_place_average():
    n = 1000
    d, out = on_stream("av", n), DeviceArray(n, stream=STREAM.value)
    kolo.allreduce_async(d, out, name="f.av", op="average", prescale=2.0).wait()
    return same(out.read(), 2.0 * sum(inp("av", r, n) for r in range(N)) / N, "average")


def c_broadcast():
    n = 4096
    d = on_stream("bc", n)
    kolo.broadcast_async(d, N - 1, name="f.bc").wait()
    return same(d.read(), inp("bc", N - 1, n), "broadcast")


def c_reducescatter():
    n = 10 * N + 3
    d = on_stream("rs", n)
    mine = kolo.reducescatter_count(n, N, R)
    at = sum(kolo.reducescatter_count(n, N, r) for r in range(R))
    out = DeviceArray(mine, stream=STREAM.value)
    kolo.reducescatter_async(d, out, name="f.rs").wait()
    return same(out.read(), sum(inp("rs", r, n) for r in range(N))[at:at + mine],
                "reducescatter")


def c_allgather():
    d = on_stream("ag", 100 + R)
    out, counts = kolo.allgather_async(d, lambda k: DeviceArray(k), name="f.ag").wait()
    return same(out.read(), np.concatenate([inp("ag", r, 100 + r) for r in range(N)]),
                "allgather") or (None if counts == [100 + r for r in range(N)] else
                                 f"counts {counts}")


def c_allgather_to_host():
    d = on_stream("agh", 50)
    out, _ = kolo.allgather_async(d, lambda k: np.zeros(k, np.float32), name="f.agh").wait()
    return same(out, np.concatenate([inp("agh", r, 50) for r in range(N)]), "allgather to host")


def c_alltoall():
    d = on_stream("a2a", 8 * N)
    out, counts = kolo.alltoall_async(d, lambda k: DeviceArray(k), name="f.a2a").wait()
    ref = np.concatenate([inp("a2a", r, 8 * N)[8 * R:8 * R + 8] for r in range(N)])
    return same(out.read(), ref, "alltoall")


def c_grouped():
    ds = [on_stream(f"g{i}", 300 + i) for i in range(3)]
    kolo.grouped_allreduce_async(ds, name="f.g").wait()
    for i, d in enumerate(ds):
        err = same(d.read(), sum(inp(f"g{i}", r, 300 + i) for r in range(N)), f"tensor {i}")
        if err:
            return err
    return None


cases = Cases()
if not kolo.cuda_supported():
    report({"skip": f"{kolo.library_path()} has no CUDA data path"})
    sys.exit(0)
for name, fn in [("allreduce", c_allreduce), ("average", c_allreduce_out_of_place_average),
                 ("broadcast", c_broadcast), ("reducescatter", c_reducescatter),
                 ("allgather", c_allgather), ("allgather to host", c_allgather_to_host),
                 ("alltoall", c_alltoall), ("grouped", c_grouped)]:
    cases.run(name, fn)
ck(rt.cudaStreamSynchronize(STREAM), "sync")
report({"cases": cases.count})
