"""CUDA buffers in the Python layer (docs/gpu-user.md).

The CPU-only torch of the build machines cannot make a CUDA tensor, so the
plumbing is tested with stand-ins over host memory, on a job of one worker:

* a stand-in CUDA torch tensor (``device`` cuda:1, ``data_ptr`` of host
  memory) and an object with ``__cuda_array_interface__``: kolo.buffer takes
  the pointer, the device and the stream (torch's current stream, stood in
  for by ``kolo._torch_stream``; the interface's ``stream``);
* a recording proxy of libkolo: every operation on such a buffer is issued
  with this thread's kolo stream set to the buffer's stream, and the stream
  in force before is restored after (also when the call fails); host buffers
  never touch the stream;
* allgather/alltoall results kolo allocates for a device input are copied
  into the output through the CUDA runtime (stood in for by a recorder that
  copies with memmove) on the output's stream and device, synchronised,
  before kolo_free;
* a libkolo without the CUDA data path refuses CUDA tensors clearly.

The results are checked against references computed here. Where torch has
CUDA and a GPU (the GPU machine, scripts/gpu-check.sh) real CUDA tensors run
on 2 ranks through kolo.torch and the DDP backend
(workers/cuda_ops.py); here those tests are skipped with the reason.
"""
import ctypes
import pathlib
import shutil
import subprocess

import numpy
import pytest

torch = pytest.importorskip("torch")
import kolo  # noqa: E402
from kolo import _lib  # noqa: E402

from conftest import LIBRARY, results, run_worker  # noqa: E402

HAVE_CUDA = torch.cuda.is_available()
CUDA_CASES = 10  # what workers/cuda_ops.py reports per rank
FAKE_CASES = 8  # what workers/cuda_fake.py reports per rank
# The fake CUDA runtime of tests/gpu/fake, in the build folder of the libkolo
# under test (<build>/lib/libkolo.so -> <build>/tests/gpu/fake/lib).
FAKE_LIB = pathlib.Path(LIBRARY).resolve().parent.parent / "tests" / "gpu" / "fake" / "lib"


def gpu_visible() -> bool:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    try:
        return subprocess.run([smi, "-L"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


class StandinTensor:
    """What kolo.buffer reads of a CUDA torch tensor, over a numpy array."""

    __module__ = "torch.standin"

    def __init__(self, array: numpy.ndarray, index: int = 1):
        self.array = array
        self.device = torch.device("cuda", index)
        self.layout = torch.strided
        self.dtype = {"float32": torch.float32, "int32": torch.int32}[str(array.dtype)]
        self.shape = array.shape

    def data_ptr(self):
        return self.array.ctypes.data if self.array.size else 0  # as torch's empty tensors

    def numel(self):
        return self.array.size

    def is_contiguous(self):
        return self.array.flags["C_CONTIGUOUS"]

    def stride(self):
        return tuple(s // self.array.itemsize for s in self.array.strides)


class Cai:
    """An object with __cuda_array_interface__ (version 3) over a numpy array."""

    def __init__(self, array: numpy.ndarray, stream=None, strides=None, readonly=False):
        self.array = array
        self.__cuda_array_interface__ = {
            "shape": array.shape, "typestr": array.dtype.str, "version": 3,
            "data": (array.ctypes.data, readonly), "strides": strides, "stream": stream}


@pytest.fixture
def cuda_lib(monkeypatch):
    """A libkolo that says it has the CUDA data path; _torch_stream returns
    0x5000 + the device index."""
    monkeypatch.setattr(_lib, "_has", set(_lib._has) | set(_lib.OPTIONAL))
    monkeypatch.setattr(kolo, "_torch_stream", lambda t: 0x5000 + t.device.index)


class Recorder:
    """libkolo with the stream calls recorded: calls lists (name, stream in
    force) for every kolo_*_async and kolo_cuda_* call; the async calls go to
    the real library."""

    def __init__(self, real):
        self._real = real
        self.stream = None  # this thread's kolo stream, as the proxy keeps it
        self.calls = []
        self.freed = []
        self.fail_set = False  # kolo_cuda_set_stream fails (no CUDA)
        self.fail_call = False  # the async call raises

    def kolo_cuda_get_stream(self):
        self.calls.append(("get", self.stream))
        return self.stream

    def kolo_cuda_set_stream(self, s):
        self.calls.append(("set", s))
        if self.fail_set:
            return _lib.STATUS["EUNSUPPORTED"]
        self.stream = s
        return 0

    def kolo_free(self, p):
        self.freed.append(p)
        self._real.kolo_free(p)

    def __getattr__(self, name):
        fn = getattr(self._real, name)
        if not name.endswith("_async"):
            return fn

        def call(*args):
            self.calls.append((name, self.stream))
            if self.fail_call:
                raise RuntimeError("the call failed")
            return fn(*args)

        return call


@pytest.fixture
def rec(monkeypatch, cuda_lib):
    kolo.init()  # a job of one worker (no KOLO_RENDEZVOUS)
    r = Recorder(_lib.library())
    monkeypatch.setattr(kolo, "_lib_", lambda: r)
    return r


class FakeRuntime:
    """The few CUDA runtime calls kolo makes itself, copying with memmove."""

    def __init__(self):
        self.calls = []
        self.device = 0

    def cudaGetDevice(self, p):
        self.calls.append(("getdev", self.device))
        p._obj.value = self.device
        return 0

    def cudaSetDevice(self, d):
        self.calls.append(("setdev", d))
        self.device = d
        return 0

    def cudaMemcpyAsync(self, dst, src, n, kind, stream):
        self.calls.append(("memcpy", n, kind, stream, self.device))
        ctypes.memmove(dst, src, n)
        return 0

    def cudaStreamSynchronize(self, stream):
        self.calls.append(("sync", stream))
        return 0


# ---- kolo.buffer --------------------------------------------------------------


def test_meta_tensor_refused():
    t = torch.empty(8, device="meta")
    with pytest.raises(TypeError, match=r"grad is on meta; kolo takes CPU and CUDA tensors"):
        kolo.buffer(t, "grad")


def test_cpu_tensor_has_no_device_or_stream():
    t = torch.arange(8, dtype=torch.float32)
    b = kolo.buffer(t, "grad")
    assert (b.count, b.ptr, b.device, b.stream) == (8, t.data_ptr(), None, None)


def test_cuda_tensor_buffer(cuda_lib):
    a = numpy.arange(6, dtype=numpy.float32)
    b = kolo.buffer(StandinTensor(a, index=1), "grad")
    assert (b.ptr, b.count, b.dtype_name, b.device, b.stream) == (
        a.ctypes.data, 6, "float32", 1, 0x5001)


def test_empty_cuda_tensor_lends_a_device_pointer(cuda_lib, monkeypatch):
    # torch's empty CUDA tensors have data_ptr() 0, which libkolo would read as host memory.
    lent = []
    monkeypatch.setattr(kolo, "_empty_device_ptr", lambda t: lent.append(t.device.index) or 0x7000)
    b = kolo.buffer(StandinTensor(numpy.zeros((0, 3), dtype=numpy.float32), index=1), "rows")
    assert (b.ptr, b.count, b.nbytes, b.device, b.stream) == (0x7000, 0, 0, 1, 0x5001)
    assert lent == [1]
    a = numpy.arange(3, dtype=numpy.float32)  # a tensor with elements keeps its own pointer
    assert kolo.buffer(StandinTensor(a, index=1), "rows").ptr == a.ctypes.data
    assert lent == [1]


def test_cuda_tensor_refused_without_the_data_path(monkeypatch):
    monkeypatch.setattr(_lib, "_has", set(_lib._has) - set(_lib.OPTIONAL))
    with pytest.raises(TypeError, match=r"grad is on cuda:1; this libkolo .* takes host memory "
                                        r"only \(it has no CUDA data path"):
        kolo.buffer(StandinTensor(numpy.zeros(4, numpy.float32)), "grad")


def test_cuda_array_interface_buffer(cuda_lib):
    a = numpy.arange(12, dtype=numpy.int32).reshape(3, 4)
    for stream, want in ((None, 0), (1, 0), (2, 2), (0x7777, 0x7777)):
        b = kolo.buffer(Cai(a, stream=stream), "x")
        assert (b.ptr, b.count, b.dtype_name, b.device, b.stream) == (
            a.ctypes.data, 12, "int32", -1, want), stream
    # Explicit C-contiguous strides pass; others, read-only data and an
    # unknown typestr are refused.
    assert kolo.buffer(Cai(a, strides=(16, 4)), "x").count == 12
    with pytest.raises(ValueError, match="not C-contiguous"):
        kolo.buffer(Cai(a, strides=(4, 12)), "x")
    with pytest.raises(ValueError, match="read-only"):
        kolo.buffer(Cai(a, readonly=True), "x")
    with pytest.raises(TypeError, match="typestr '<c8'"):
        kolo.buffer(Cai(numpy.zeros(2, numpy.complex64)), "x")


# ---- streams around the enqueue --------------------------------------------------


def test_host_buffers_leave_the_stream_alone(rec):
    a = numpy.arange(4, dtype=numpy.float32)
    kolo.allreduce_async(a, name="host").wait()
    assert rec.calls == [("kolo_allreduce_async", None)]
    assert numpy.array_equal(a, numpy.arange(4, dtype=numpy.float32))  # one rank: unchanged


def test_device_ops_run_on_the_tensor_stream(rec):
    a = numpy.arange(8, dtype=numpy.float32)
    t = StandinTensor(a, index=1)
    rec.stream = 0x99  # a stream the caller had set: restored after each call
    kolo.allreduce_async(t, name="d.ar", op="sum", postscale=2.0).wait()
    assert numpy.array_equal(a, numpy.arange(8, dtype=numpy.float32) * 2.0)
    kolo.broadcast_async(t, 0, name="d.bc").wait()
    out = StandinTensor(numpy.zeros(8, numpy.float32), index=1)
    kolo.reducescatter_async(t, out, name="d.rs").wait()
    assert numpy.array_equal(out.array, a)
    kolo.grouped_allreduce_async([t, StandinTensor(numpy.ones(3, numpy.float32))],
                                 name="d.g").wait()
    want = []
    for kind in ("allreduce", "broadcast", "reducescatter", "grouped_allreduce"):
        want += [("get", 0x99), ("set", 0x5001), (f"kolo_{kind}_async", 0x5001), ("set", 0x99)]
    assert rec.calls == want
    assert rec.stream == 0x99


def test_stream_restored_when_the_call_fails(rec):
    t = StandinTensor(numpy.zeros(4, numpy.float32))
    with pytest.raises(ValueError):
        kolo.broadcast_async(t, 0, name=5)  # refused before any stream call
    assert rec.calls == []
    rec.fail_call = True
    with pytest.raises(RuntimeError, match="the call failed"):
        kolo.broadcast_async(t, 0, name="d.raise")
    assert rec.calls == [("get", None), ("set", 0x5001), ("kolo_broadcast_async", 0x5001),
                         ("set", None)]
    assert rec.stream is None
    rec.fail_call = False
    n = len(rec.calls)
    rec.fail_set = True
    with pytest.raises(kolo.Error, match="KOLO_EUNSUPPORTED: kolo_cuda_set_stream"):
        kolo.allreduce_async(t, name="d.fail")
    assert rec.calls[n:] == [("get", None), ("set", 0x5001)]  # nothing enqueued
    assert rec.stream is None


def test_gathered_results_copied_on_the_output_stream(rec, monkeypatch):
    rt = FakeRuntime()
    monkeypatch.setattr(_lib, "cudart", lambda: rt)
    a = numpy.arange(5, dtype=numpy.float32) + 1
    outs = []

    def alloc(k):
        outs.append(StandinTensor(numpy.zeros(k, numpy.float32), index=1))
        return outs[-1]

    out, counts = kolo.allgather_async(StandinTensor(a, index=1), alloc, name="d.ag").wait()
    assert out is outs[0] and counts == [5]
    assert numpy.array_equal(out.array, a)
    # On the output's device and stream, synchronised, device restored;
    # kolo's buffer freed after the copy.
    assert rt.calls == [("getdev", 0), ("setdev", 1), ("memcpy", 20, 4, 0x5001, 1),
                        ("sync", 0x5001), ("setdev", 0)]
    assert len(rec.freed) == 1 and rec.freed[0]
    rt.calls.clear()
    out, counts = kolo.alltoall_async(StandinTensor(a, index=1), alloc, splits=[5],
                                      name="d.a2a").wait()
    assert numpy.array_equal(out.array, a) and counts == [5]
    assert [c[0] for c in rt.calls] == ["getdev", "setdev", "memcpy", "sync", "setdev"]
    # A host output for a device input: the copy still goes through CUDA
    # (kolo's result is on the device), on the legacy stream.
    rt.calls.clear()
    out, _ = kolo.allgather_async(StandinTensor(a), lambda k: numpy.zeros(k, numpy.float32),
                                  name="d.ag.host").wait()
    assert numpy.array_equal(out, a)
    assert rt.calls == [("memcpy", 20, 4, None, 0), ("sync", None)]


def test_host_gathers_do_not_load_cuda(rec, monkeypatch):
    def no_cuda():
        raise AssertionError("the CUDA runtime was asked for on the host path")

    monkeypatch.setattr(_lib, "cudart", no_cuda)
    a = numpy.arange(3, dtype=numpy.float32)
    out, _ = kolo.allgather_async(a, lambda k: numpy.zeros(k, numpy.float32), name="h.ag").wait()
    assert numpy.array_equal(out, a)


# ---- device memory on ranks -----------------------------------------------------


def check_cases(res: dict, np_: int, want: int) -> None:
    assert sorted(res) == list(range(np_))
    for r, items in res.items():
        cases = [i for i in items if "case" in i]
        bad = [i for i in cases if not i["ok"]]
        assert not bad, f"rank {r}: {bad}"
        assert len(cases) == want, f"rank {r} ran {len(cases)} cases"


def run_fake_worker(env):
    res = results(run_worker(2, "cuda_fake.py", timeout=180, env=env))
    skips = [i["skip"] for items in res.values() for i in items if "skip" in i]
    if skips:
        pytest.skip(skips[0])
    check_cases(res, 2, FAKE_CASES)


@pytest.mark.skipif(not (FAKE_LIB / "libcudart.so.13").exists(),
                    reason=f"the fake CUDA runtime is not built ({FAKE_LIB})")
def test_device_memory_over_the_fake_runtime():
    """Every collective of the kolo module on 2 ranks over device memory of
    the fake CUDA runtime (a host read of it faults), inputs written on the
    worker's stream just before each call (workers/cuda_fake.py)."""
    run_fake_worker({"LD_LIBRARY_PATH": str(FAKE_LIB), "KOLO_FAKE_CUDA_DEVICES": "1"})


@pytest.mark.skipif(not gpu_visible(), reason="no GPU visible (nvidia-smi -L)")
def test_device_memory_over_the_real_runtime():
    """The same on a GPU (the GPU machine's libcudart, no torch needed)."""
    run_fake_worker(None)


def test_cuda_worker_on_cpu():
    """workers/cuda_ops.py's cases and references, on CPU tensors: the GPU
    run below checks kolo, not the worker."""
    res = results(run_worker(2, "cuda_ops.py", "cpu", timeout=180))
    check_cases(res, 2, CUDA_CASES)


# ---- real CUDA tensors (the GPU machine) ----------------------------------------


@pytest.mark.skipif(not HAVE_CUDA, reason="torch has no CUDA device here (a CPU build of torch "
                                           "or no GPU): run on the GPU machine "
                                           "(scripts/gpu-check.sh)")
@pytest.mark.parametrize("np_", [2])
def test_cuda_tensors_on_ranks(np_):
    """kolo.torch on CUDA tensors (every collective, checked against float64
    references the workers compute from the known inputs), the stream order
    (work queued on torch's stream just before an allreduce is seen by it),
    and DDP with device_ids on the kolo backend against a single-process
    reference; the ranks share GPU 0 when there is one GPU."""
    res = results(run_worker(np_, "cuda_ops.py", timeout=300))
    check_cases(res, np_, CUDA_CASES)
    for items in res.values():
        assert items[-1]["device"].startswith("cuda") and items[-1]["cuda_supported"]
