"""kolo: collective communication for data-parallel training, from Python.

A pure-Python layer over libkolo's C ABI (ctypes); it is never compiled
against torch, so a torch upgrade cannot break it. This module mirrors the C
API with exceptions; ``kolo.torch`` is Horovod's ``horovod.torch`` API and
``kolo.torch.distributed`` the ``torch.distributed`` backend.

Buffers are numpy arrays, torch tensors (CPU or CUDA) and objects with
``__cuda_array_interface__`` (CuPy, Numba), passed by pointer (no copy) when
contiguous; kolo's work on a CUDA buffer is ordered after the work the
current CUDA stream had queued when the operation was issued.
Asynchronous operations return a :class:`Handle`; waiting on it releases
the GIL. Python code never runs on kolo's threads.
"""

from __future__ import annotations

import atexit
import ctypes
import logging
import os
import sys
import threading
from typing import Any, Callable, List, Optional, Sequence, Tuple

from . import _lib

__version__ = "0.1.0"

log = logging.getLogger("kolo")

# ---- errors ----------------------------------------------------------------


class Error(RuntimeError):
    """A failed kolo call: ``status`` is the C status code, ``name`` its name
    (``"KOLO_EPEER"``) and ``message`` the detail from ``kolo_last_error()``."""

    def __init__(self, status: int, name: str, message: str):
        self.status = status
        self.name = name
        self.message = message
        super().__init__(f"{name}: {message}" if message else name)


class MembershipError(Error):
    """The job's membership changed or a peer failed (EMEMBERSHIP, EPEER,
    ETIMEDOUT): in an elastic job, restore the last commit and re-form."""


class MismatchError(Error):
    """Ranks disagreed about an operation (name, shape, dtype, op, root)."""


class ShutdownError(Error):
    """kolo was shut down (or this worker left the job)."""


_S = _lib.STATUS
_ERROR_CLASS = {
    _S["EMEMBERSHIP"]: MembershipError,
    _S["EPEER"]: MembershipError,
    _S["ETIMEDOUT"]: MembershipError,
    _S["EMISMATCH"]: MismatchError,
    _S["ESHUTDOWN"]: ShutdownError,
    _S["ECLOSED"]: ShutdownError,
}


def status_name(status: int) -> str:
    return _lib.text(_lib.library().kolo_status_name(status))


def _error(status: int, message: str) -> Error:
    cls = _ERROR_CLASS.get(status, Error)
    return cls(status, status_name(status), message)


# ---- dtypes and buffers ----------------------------------------------------

DTYPES = dict(_lib.DTYPES)
_TORCH_DTYPES = {
    "torch.int8": "int8",
    "torch.uint8": "uint8",
    "torch.int32": "int32",
    "torch.int64": "int64",
    "torch.float16": "float16",
    "torch.bfloat16": "bfloat16",
    "torch.float32": "float32",
    "torch.float64": "float64",
    "torch.bool": "bool",
}
_NUMPY_DTYPES = {
    "int8": "int8",
    "uint8": "uint8",
    "int32": "int32",
    "int64": "int64",
    "float16": "float16",
    "float32": "float32",
    "float64": "float64",
    "bool": "bool",
    "bfloat16": "bfloat16",  # ml_dtypes.bfloat16 (TensorFlow's and JAX's numpy bfloat16)
}
_CTYPES_DTYPES = {
    ctypes.c_int8: "int8", ctypes.c_uint8: "uint8", ctypes.c_int32: "int32",
    ctypes.c_int64: "int64", ctypes.c_float: "float32", ctypes.c_double: "float64",
}
SUPPORTED = ", ".join(list(DTYPES) + ["bool (not for sum, average or product)"])


class Buffer:
    """A contiguous buffer: pointer, element count and kolo dtype, with a
    reference to the object that owns the memory. ``device`` is None for
    host memory; for CUDA memory it is the device's ordinal (-1 where the
    object does not say, as ``__cuda_array_interface__`` does not) and
    ``stream`` the cudaStream_t (an int; 0 is the legacy default stream)
    kolo's work on it is ordered after."""

    __slots__ = ("ptr", "count", "dtype", "dtype_name", "nbytes", "owner", "device", "stream")

    def __init__(self, ptr: int, count: int, dtype_name: str, owner: Any,
                 device: Optional[int] = None, stream: Optional[int] = None):
        self.ptr = ptr
        self.count = count
        self.dtype_name = dtype_name
        self.dtype = DTYPES["uint8" if dtype_name == "bool" else dtype_name]
        self.nbytes = count * itemsize(dtype_name)
        self.owner = owner
        self.device = device
        self.stream = stream


def itemsize(dtype_name: str) -> int:
    return {"int8": 1, "uint8": 1, "bool": 1, "int32": 4, "int64": 8, "float16": 2,
            "bfloat16": 2, "float32": 4, "float64": 8}[dtype_name]


def is_torch_tensor(obj: Any) -> bool:
    return type(obj).__module__.startswith("torch") and hasattr(obj, "data_ptr")


# __cuda_array_interface__ typestr -> kolo dtype (no bfloat16: the interface
# has no name for it).
_CAI_DTYPES = {
    "|i1": "int8", "<i1": "int8", "|u1": "uint8", "<u1": "uint8", "<i4": "int32",
    "<i8": "int64", "<f2": "float16", "<f4": "float32", "<f8": "float64", "|b1": "bool",
}


def cuda_supported() -> bool:
    """Whether the loaded libkolo takes CUDA device memory (it has the CUDA
    data path: ``kolo_cuda_set_stream``). Where no GPU can run, such a
    library still refuses device pointers when an operation is issued."""
    return _lib.has("kolo_cuda_set_stream")


def _require_cuda(name: str, where: Any) -> None:
    if not cuda_supported():
        raise TypeError(f"kolo: {name} is on {where}; this libkolo ({_lib.path()}) takes host "
                        f"memory only (it has no CUDA data path: no kolo_cuda_set_stream); "
                        f"move it with .cpu() or use a newer libkolo")


def _torch_stream(t: Any) -> int:
    """The cudaStream_t of torch's current stream on ``t``'s device, as an
    int (a module function so that tests without CUDA can stand in)."""
    import torch

    return int(torch.cuda.current_stream(t.device).cuda_stream)


_EMPTY_DEVICE = {}  # device index -> a one-byte tensor whose pointer empty tensors lend


def _empty_device_ptr(t: Any) -> int:
    """A device pointer on ``t``'s device for an empty CUDA tensor, whose
    ``data_ptr()`` is 0: libkolo tells device from host memory by the
    pointer, so NULL would read as host memory and an async collective whose
    other ranks pass device memory would fail as a mismatch. Nothing is read
    or written through it (the count is 0). A module function so that tests
    without CUDA can stand in."""
    import torch

    key = t.device.index if t.device.index is not None else torch.cuda.current_device()
    keep = _EMPTY_DEVICE.get(key)
    if keep is None:
        keep = _EMPTY_DEVICE[key] = torch.empty(1, dtype=torch.uint8, device=t.device)
    return keep.data_ptr()


def _cai_buffer(obj: Any, name: str) -> tuple:
    """(pointer, count, dtype, stream) of an object with
    ``__cuda_array_interface__`` (version 2 or 3)."""
    cai = obj.__cuda_array_interface__
    dt = _CAI_DTYPES.get(cai.get("typestr"))
    if dt is None:
        raise TypeError(f"kolo: {name} has typestr {cai.get('typestr')!r}, which kolo does not "
                        f"support (supported: {SUPPORTED}; bfloat16 only as a torch tensor)")
    shape = tuple(int(x) for x in cai.get("shape", ()))
    count = 1
    for x in shape:
        count *= x
    strides = cai.get("strides")
    if strides is not None and count > 1:
        want, step = [], itemsize(dt)
        for x in reversed(shape):
            want.append(step)
            step *= x
        if tuple(int(x) for x, n in zip(strides, shape) if n > 1) != tuple(
                w for w, n in zip(reversed(want), shape) if n > 1):
            raise ValueError(f"kolo: {name} is not C-contiguous (shape {shape}, strides "
                             f"{tuple(strides)}); pass a contiguous copy")
    ptr, readonly = cai["data"]
    if readonly:
        raise ValueError(f"kolo: {name} is read-only")
    # Version 3: None (no ordering needed) and 1 both mean the legacy default
    # stream, kolo's NULL; 2 is cudaStreamPerThread, passed as it is.
    stream = cai.get("stream")
    stream = 0 if stream in (None, 1) else int(stream)
    return int(ptr or 0), count, dt, stream


def buffer(obj: Any, name: str = "tensor", reduce: Optional[str] = None) -> Buffer:
    """A :class:`Buffer` over a numpy array, a torch tensor (CPU or CUDA), an
    object with ``__cuda_array_interface__`` or a ctypes array of a kolo
    dtype, without a copy. ``reduce``
    names the op for reductions (bool is refused for sum, average and
    product). A CUDA buffer records the current stream of its device (torch's
    ``torch.cuda.current_stream(device)``; the interface's ``stream``).
    Raises TypeError/ValueError naming ``name``."""
    device = stream = None
    if is_torch_tensor(obj):
        t = obj
        if t.device.type != "cpu":
            if t.device.type != "cuda":
                raise TypeError(
                    f"kolo: {name} is on {t.device}; kolo takes CPU and CUDA tensors (move "
                    f"it with .cpu())")
            _require_cuda(name, t.device)
            device = t.device.index if t.device.index is not None else -1
            stream = _torch_stream(t)
        if str(t.layout) != "torch.strided":
            raise TypeError(f"kolo: {name} is a {t.layout} tensor; kolo takes dense tensors")
        dt = _TORCH_DTYPES.get(str(t.dtype))
        if dt is None:
            raise TypeError(f"kolo: {name} has dtype {t.dtype}, which kolo does not support "
                            f"(supported: {SUPPORTED})")
        if not t.is_contiguous():
            raise ValueError(f"kolo: {name} is not contiguous (shape {tuple(t.shape)}, stride "
                             f"{t.stride()}); pass tensor.contiguous()")
        ptr, count = t.data_ptr(), t.numel()
        if device is not None and count == 0 and ptr == 0:
            ptr = _empty_device_ptr(t)
    elif hasattr(obj, "__cuda_array_interface__"):
        _require_cuda(name, "a CUDA device")
        ptr, count, dt, stream = _cai_buffer(obj, name)
        device = -1
    elif hasattr(obj, "__array_interface__") and hasattr(obj, "flags"):
        a = obj
        dt = _NUMPY_DTYPES.get(str(a.dtype))
        if dt is None or a.dtype.byteorder == ">":
            raise TypeError(f"kolo: {name} has dtype {a.dtype}, which kolo does not support "
                            f"(supported: {SUPPORTED})")
        if not a.flags["C_CONTIGUOUS"]:
            raise ValueError(f"kolo: {name} is not C-contiguous; pass numpy.ascontiguousarray()")
        if not a.flags["WRITEABLE"]:
            raise ValueError(f"kolo: {name} is read-only")
        ptr, count = a.__array_interface__["data"][0], a.size
    elif isinstance(obj, ctypes.Array) and obj._type_ in _CTYPES_DTYPES:
        # ctypes arrays: what the framework-neutral helpers use (no numpy).
        ptr, count, dt = ctypes.addressof(obj), len(obj), _CTYPES_DTYPES[obj._type_]
    else:
        raise TypeError(f"kolo: {name} is a {type(obj).__name__}; kolo takes numpy arrays, "
                        f"torch tensors, objects with __cuda_array_interface__ and ctypes "
                        f"arrays")
    if reduce == "adasum" and dt not in ("float16", "bfloat16", "float32", "float64"):
        raise TypeError(f"kolo: {name} is {dt}; adasum reduces floating-point tensors only")
    if dt == "bool" and reduce in ("sum", "average", "product"):
        raise TypeError(f"kolo: {name} is boolean; {reduce} is not defined for it (use min "
                        f"or max, or convert it)")
    return Buffer(ptr, count, dt, obj, device, stream)


def op_code(op: Any) -> int:
    """A kolo op from its name ("sum", "average", ...) or code."""
    if isinstance(op, str):
        try:
            return _lib.OPS[op.lower()]
        except KeyError:
            raise ValueError(f"kolo: unknown op {op!r} (use one of {', '.join(_lib.OPS)})")
    if isinstance(op, int) and op in _lib.OPS.values():
        return op
    raise ValueError(f"kolo: unknown op {op!r}")


OP_NAMES = {v: k for k, v in _lib.OPS.items()}

# ---- the comm --------------------------------------------------------------


class Comm:
    """A kolo communicator: the process's own (:func:`init`) or a process
    set's (:func:`process_set_create`). Every collective takes one as
    ``comm=`` (None: the process's)."""

    def __init__(self, ptr: int, bootstrap: bool, ranks: Optional[List[int]] = None):
        self.ptr = ptr
        self.bootstrap = bootstrap
        self.ranks = ranks  # a process set's members, as ranks of the process's comm
        self.names: dict[str, int] = {}
        self.name_lock = threading.Lock()

    def check(self, status: int, what: str) -> None:
        if status != 0:
            msg = _lib.text(_lib_().kolo_last_error(self.ptr)) if self.ptr else "freed"
            raise _error(status, f"{what}: {msg}")

    def rank(self) -> int:
        """This process's rank in the comm."""
        return int(_lib_().kolo_rank(self._live()))

    def size(self) -> int:
        """The number of ranks in the comm."""
        return int(_lib_().kolo_size(self._live()))

    def _live(self) -> int:
        if not self.ptr:
            raise ValueError("kolo: this process set was freed")
        return self.ptr

    def __repr__(self) -> str:
        what = "process set " + str(self.ranks) if self.ranks is not None else "comm"
        return f"<kolo {what}>"


_Comm = Comm


_comm: Optional[_Comm] = None
_comm_lock = threading.RLock()
_failed = False  # an uncaught exception is ending the interpreter


def _lib_() -> ctypes.CDLL:
    return _lib.library()


def init() -> None:
    """Joins the job: every worker calls it once before any collective.

    Under ``kolorun`` (or with ``KOLO_RENDEZVOUS`` set) this joins the
    rendezvous and connects the ring, blocking up to ``KOLO_INIT_TIMEOUT_MS``;
    without them the process runs as a job of one worker. Calling it again
    while initialized does nothing. Raises :class:`Error` on failure."""
    global _comm
    with _comm_lock:
        if _comm is not None:
            return
        lib = _lib_()
        if not os.environ.get("KOLO_RENDEZVOUS"):
            log.info("kolo: KOLO_RENDEZVOUS is not set (not under kolorun): running as a job "
                     "of one worker")
            _comm = _Comm(bootstrap_connect(0, 1, lambda b: [b])[0], True)
        else:
            ptr = _lib.c_comm_p()
            st = lib.kolo_init(ctypes.byref(ptr))
            if st == _S["ESHUTDOWN"]:
                # The job finished (a member's training completed) while
                # this worker waited for a rank, or SIGTERM asked it to leave
                # before it got one: nothing is left to do.
                print(f"kolo: {_lib.text(lib.kolo_init_error())}; exiting with status 0",
                      file=sys.stderr, flush=True)
                raise SystemExit(0)
            if st != 0:
                raise _error(st, "kolo_init: " + _lib.text(lib.kolo_init_error()))
            _comm = _Comm(ptr.value, False)
        _install_exit_hooks()


def bootstrap_connect(rank: int, size: int, allgather: Callable[[bytes], list],
                      job: str = "", token: str = "", route_to: str = "",
                      timeout_ms: int = 0) -> tuple:
    """Builds a comm without the rendezvous server (kolo/bootstrap.h).

    ``allgather(data)`` must return every rank's ``data`` in rank order; it
    is called twice, on this thread (host names, then cards). Returns
    ``(comm pointer, None)``. Used by the torch.distributed backend (through
    the c10d store) and for a job of one worker."""
    lib = _lib_()
    cfg = _lib.BootstrapConfig(rank, size, job.encode() or None, token.encode() or None,
                               route_to.encode() or None, int(timeout_ms))
    b = _lib.c_bootstrap_p()
    st = lib.kolo_bootstrap_create(ctypes.byref(cfg), ctypes.byref(b))
    if st != 0:
        raise _error(st, "kolo_bootstrap_create: " + _lib.text(lib.kolo_init_error()))
    try:
        host = lib.kolo_bootstrap_host(b)
        hosts = [bytes(h) for h in allgather(bytes(host))]
        if len(hosts) != size:
            raise ValueError(f"kolo: allgather returned {len(hosts)} host names for {size} ranks")
        harr = (ctypes.c_char_p * size)(*hosts)
        card = ctypes.create_string_buffer(_lib.BOOTSTRAP_CARD_SIZE)
        st = lib.kolo_bootstrap_listen(b, harr, card)
        if st != 0:
            raise _error(st, "kolo_bootstrap_listen: " + _lib.text(lib.kolo_init_error()))
        cards = [bytes(c) for c in allgather(card.raw)]
        if len(cards) != size or any(len(c) != _lib.BOOTSTRAP_CARD_SIZE for c in cards):
            raise ValueError("kolo: allgather returned malformed cards")
    except BaseException:
        lib.kolo_bootstrap_destroy(b)
        raise
    ptr = _lib.c_comm_p()
    st = lib.kolo_bootstrap_connect(b, b"".join(cards), ctypes.byref(ptr))
    if st != 0:
        raise _error(st, "kolo_bootstrap_connect: " + _lib.text(lib.kolo_init_error()))
    return ptr.value, None


def adopt(comm_ptr: int) -> None:
    """Makes ``comm_ptr`` (from :func:`bootstrap_connect`) this process's
    comm, as :func:`init` would. Raises if one is already initialized."""
    global _comm
    with _comm_lock:
        if _comm is not None:
            raise RuntimeError("kolo: already initialized")
        _comm = _Comm(comm_ptr, True)
        _install_exit_hooks()


def _get(comm: Optional[Comm] = None) -> Comm:
    if comm is not None:
        comm._live()
        if _comm is None:
            raise ValueError("kolo: this process set's comm was finalized")
        return comm
    c = _comm
    if c is None:
        raise ValueError("kolo has not been initialized; call init() first")
    return c


def process_set_create(ranks: Sequence[int]) -> Optional[Comm]:
    """A process set of ``ranks`` (ranks of the process's comm, any order):
    collective over every rank, in the same order as the other collectives,
    with the same members on every rank. Returns the set's :class:`Comm` on
    its members (its rank r is the r-th smallest member) and None elsewhere.
    Ranks that disagree raise :class:`MismatchError` everywhere. A set stops
    working once the process's comm re-forms: create it again then."""
    c = _get()
    try:
        members = sorted(int(r) for r in ranks)
    except (TypeError, ValueError):
        raise ValueError(f"kolo: a process set takes a list of ranks, not {ranks!r}") from None
    arr = (ctypes.c_int * max(len(members), 1))(*members)
    out = _lib.c_comm_p()
    c.check(_lib_().kolo_process_set_create(c.ptr, arr, len(members), ctypes.byref(out)),
            f"process_set_create({members})")
    return Comm(out.value, True, members) if out.value else None


def process_set_free(comm: Optional[Comm]) -> None:
    """Frees a set from :func:`process_set_create` (every member calls it;
    None does nothing). Operations still in flight on it fail."""
    if comm is None or not comm.ptr or comm is _comm:
        return
    orphans = _orphans_take()
    ptr, comm.ptr = comm.ptr, 0
    st = _lib_().kolo_process_set_free(ptr)
    _orphans_release(orphans)
    if st != 0:
        raise _error(st, f"process_set_free({comm.ranks}): a member did not take part")


def comm_pointer() -> int:
    """The kolo_comm_t * of this process (for C extensions)."""
    return _get().ptr


def is_initialized() -> bool:
    return _comm is not None


def finalize() -> None:
    """Leaves the job and frees the comm; every rank calls it at the end
    (it is also called at interpreter exit). Operations still in flight fail
    with :class:`ShutdownError`. Safe to call twice."""
    global _comm
    with _comm_lock:
        c, _comm = _comm, None
        if c is None:
            return
        lib = _lib_()
        orphans = _orphans_take()
        if _failed:
            lib.kolo_abort(c.ptr)
        lib.kolo_finalize(c.ptr)
        # Only now may the buffers of dropped handles go: until kolo_finalize
        # has stopped the engine, it may still read or write them.
        _orphans_release(orphans)


shutdown = finalize


def abort() -> None:
    """Gives up on the job after a failure this rank knows of: pending and
    later operations fail, and finalize does not wait for the others."""
    c = _comm
    if c is not None:
        _lib_().kolo_abort(c.ptr)


_hooks_installed = False


def _install_exit_hooks() -> None:
    global _hooks_installed
    if _hooks_installed:
        return
    _hooks_installed = True
    previous = sys.excepthook

    def excepthook(tp, value, tb):
        global _failed
        _failed = True
        abort()
        previous(tp, value, tb)

    sys.excepthook = excepthook
    atexit.register(finalize)


def _int(fn: str) -> int:
    return getattr(_lib_(), fn)(_get().ptr)


def rank() -> int:
    return _int("kolo_rank")


def size() -> int:
    return _int("kolo_size")


def local_rank() -> int:
    return _int("kolo_local_rank")


def local_size() -> int:
    return _int("kolo_local_size")


def cross_rank() -> int:
    return _int("kolo_cross_rank")


def cross_size() -> int:
    return _int("kolo_cross_size")


def is_homogeneous() -> bool:
    """Whether every host holds the same number of ranks."""
    return _int("kolo_is_homogeneous") == 1


def round() -> int:  # noqa: A001 - the C name
    """The membership round the comm is in (1 for the first)."""
    return _int("kolo_round")


def last_error() -> str:
    c = _comm
    return _lib.text(_lib_().kolo_last_error(c.ptr)) if c else ""


def library_path() -> Optional[str]:
    _lib_()
    return _lib.path()


# ---- handles ---------------------------------------------------------------

# Handles whose Python object died before completion: their buffers stay
# referenced here until the operation is done (kolo may still write them).
_orphans: list = []
_orphans_lock = threading.Lock()


def _orphans_take() -> list:
    """Every orphan, removed from the list; the caller releases them with
    :func:`_orphans_release` once the engine can no longer touch their
    buffers (after kolo_finalize or kolo_reform)."""
    with _orphans_lock:
        taken, _orphans[:] = list(_orphans), []
    return taken


def _orphans_release(taken: list) -> None:
    lib = _lib_()
    for ptr, _refs in taken:
        lib.kolo_handle_release(ptr)


def _orphans_reap() -> None:
    if not _orphans:
        return
    lib = _lib_()
    with _orphans_lock:
        keep = []
        for ptr, refs in _orphans:
            done = ctypes.c_int(0)
            lib.kolo_poll(ptr, ctypes.byref(done))
            if done.value:
                lib.kolo_handle_release(ptr)
            else:
                keep.append((ptr, refs))
        _orphans[:] = keep


class Handle:
    """An operation in flight. :meth:`wait` blocks (without the GIL) until it
    completes and returns its result; :meth:`poll` says whether it has. The
    buffers it uses stay referenced until then."""

    __slots__ = ("_ptr", "_refs", "_finish", "_what", "_result", "_error", "__weakref__")

    def __init__(self, ptr: int, refs: tuple, finish: Optional[Callable[[], Any]], what: str):
        self._ptr = ptr
        self._refs = refs
        self._finish = finish
        self._what = what
        self._result = None
        self._error: Optional[Error] = None

    def poll(self) -> bool:
        """True once the operation has completed (successfully or not)."""
        if self._ptr is None:
            return True
        done = ctypes.c_int(0)
        st = _lib_().kolo_poll(self._ptr, ctypes.byref(done))
        if st != 0:
            raise _error(st, f"{self._what}: kolo_poll")
        return bool(done.value)

    def wait_for(self, timeout_s: float) -> bool:
        """Waits up to ``timeout_s`` seconds for completion (without the GIL)
        and says whether it came; the operation runs on either way, and
        :meth:`wait` then gives its result."""
        if self._ptr is None:
            return True
        if not timeout_s >= 0:
            raise ValueError(f"kolo: {self._what}: timeout {timeout_s!r} is not >= 0")
        done = ctypes.c_int(0)
        ms = int(min(timeout_s, 2**31 / 1000 - 1) * 1000)
        st = _lib_().kolo_wait_for(self._ptr, ms, ctypes.byref(done))
        if st != 0:
            raise _error(st, f"{self._what}: kolo_wait_for")
        return bool(done.value)

    def wait(self) -> Any:
        """Waits for completion and returns the result (raises on failure).
        May be called again: it returns the same result or raises again."""
        if self._ptr is not None:
            ptr, self._ptr = self._ptr, None
            st = _lib_().kolo_wait(ptr)
            if st != 0:
                self._error = _error(st, f"{self._what}: {last_error()}")
                self._refs = ()
            else:
                self._result = self._finish() if self._finish else None
                self._refs = ()
        if self._error is not None:
            raise self._error
        return self._result

    def done(self) -> bool:
        return self._ptr is None

    def __del__(self):
        ptr = getattr(self, "_ptr", None)
        if ptr is not None and _lib._lib is not None:
            with _orphans_lock:
                _orphans.append((ptr, self._refs))


def comm_free(comm: Comm, abort: bool = False) -> None:
    """Frees a comm from :func:`bootstrap_connect` that is not the process's
    (a torch subgroup's): the caller has made sure every member is done with
    it; ``abort`` first after a failure. Operations in flight fail."""
    if not comm.ptr or comm is _comm:
        return
    orphans = _orphans_take()
    ptr, comm.ptr = comm.ptr, 0
    if abort:
        _lib_().kolo_abort(ptr)
    _lib_().kolo_finalize(ptr)
    _orphans_release(orphans)


def op_name(kind: str, name: Optional[str], comm: Optional[Comm] = None) -> bytes:
    """``name`` or, when None, ``"<kind>.noname.<n>"`` with a per-kind
    counter: unnamed operations must be issued in the same order on every
    rank. The counters restart after a re-form."""
    if name is not None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"kolo: an operation's name must be a non-empty string, not {name!r}")
        return name.encode()
    c = _get(comm)
    with c.name_lock:
        n = c.names.get(kind, 0)
        c.names[kind] = n + 1
    return f"{kind}.noname.{n}".encode()


def reset_names() -> None:
    c = _comm
    if c is not None:
        with c.name_lock:
            c.names.clear()


def _stream(*bufs: Buffer) -> Optional[int]:
    """The CUDA stream of the first device buffer among ``bufs``; None when
    every one is host memory."""
    for b in bufs:
        if b.stream is not None:
            return b.stream
    return None


def _on_stream(stream: Optional[int], fn: Callable, *args) -> int:
    """``fn(*args)`` with this thread's kolo CUDA stream set to ``stream``
    (restored after), so that kolo orders the operation after the work that
    stream holds; a plain call for host buffers (stream None)."""
    if stream is None:
        return fn(*args)
    lib = _lib_()
    prev = lib.kolo_cuda_get_stream()
    st = lib.kolo_cuda_set_stream(stream or None)
    if st != 0:
        raise _error(st, f"kolo_cuda_set_stream({stream:#x}): the CUDA runtime cannot run here")
    try:
        return fn(*args)
    finally:
        lib.kolo_cuda_set_stream(prev)


def _enqueue(fn: str, what: str, args: list, refs: tuple,
             finish: Optional[Callable[[], Any]] = None,
             stream: Optional[int] = None, comm: Optional[Comm] = None) -> Handle:
    _orphans_reap()
    c = _get(comm)
    h = _lib.c_handle_p()
    st = _on_stream(stream, getattr(_lib_(), fn), c.ptr, *args, None, None, ctypes.byref(h))
    c.check(st, what)
    return Handle(h.value, refs, finish, what)


def _scale(x: float, what: str) -> float:
    x = float(x)
    if x != x or x in (float("inf"), float("-inf")):
        raise ValueError(f"kolo: {what} must be finite, not {x}")
    return x


def _same_kind(a: Buffer, b: Buffer, what: str) -> None:
    if a.dtype_name != b.dtype_name or a.count != b.count:
        raise ValueError(f"kolo: {what}: output has {b.count} {b.dtype_name} elements, input "
                         f"{a.count} {a.dtype_name}")


def allreduce_async(send: Any, recv: Any = None, name: Optional[str] = None, op: Any = "sum",
                    prescale: float = 1.0, postscale: float = 1.0,
                    comm: Optional[Comm] = None) -> Handle:
    """Reduces ``send`` over every rank into ``recv`` (default: in place).
    Every rank calls it with the same name, count, dtype, op and scales; the
    result is ``recv``. Returns a :class:`Handle`."""
    code = op_code(op)
    s = buffer(send, "send", reduce=OP_NAMES[code])
    r = s if recv is None or recv is send else buffer(recv, "recv")
    _same_kind(s, r, "allreduce")
    pre, post = _scale(prescale, "prescale"), _scale(postscale, "postscale")
    nm = op_name("allreduce", name, comm)  # last: a failed check must not use up a name
    args = [nm, s.ptr, r.ptr, s.count, s.dtype, code, pre, post]
    result = recv if recv is not None else send
    return _enqueue("kolo_allreduce_async", f"allreduce {nm.decode()}", args, (s, r),
                    lambda: result, _stream(s, r), comm)


def grouped_allreduce_async(sends: Sequence[Any], recvs: Optional[Sequence[Any]] = None,
                            name: Optional[str] = None, op: Any = "sum", prescale: float = 1.0,
                            postscale: float = 1.0, comm: Optional[Comm] = None) -> Handle:
    """Allreduces several buffers of one dtype atomically (negotiated and
    fused together). Names are ``<name>.<i>``. The result is ``recvs``."""
    code = op_code(op)
    if not sends:
        raise ValueError("kolo: grouped allreduce of no tensors")
    ss = [buffer(t, f"tensor {i}", reduce=OP_NAMES[code]) for i, t in enumerate(sends)]
    rs = ss if recvs is None else [buffer(t, f"output {i}") for i, t in enumerate(recvs)]
    if len(rs) != len(ss):
        raise ValueError("kolo: grouped allreduce: as many outputs as inputs are needed")
    for a, b in zip(ss, rs):
        _same_kind(a, b, "grouped allreduce")
    if len({b.dtype for b in ss}) != 1:
        raise TypeError("kolo: grouped allreduce: every tensor must have the same dtype")
    pre, post = _scale(prescale, "prescale"), _scale(postscale, "postscale")
    base = op_name("grouped_allreduce", name, comm).decode()
    n = len(ss)
    names = [f"{base}.{i}".encode() for i in range(n)]
    c_names = (ctypes.c_char_p * n)(*names)
    c_send = (ctypes.c_void_p * n)(*[b.ptr for b in ss])
    c_recv = (ctypes.c_void_p * n)(*[b.ptr for b in rs])
    c_counts = (ctypes.c_size_t * n)(*[b.count for b in ss])
    result = list(recvs) if recvs is not None else list(sends)
    _orphans_reap()
    c = _get(comm)
    h = _lib.c_handle_p()
    st = _on_stream(_stream(*ss, *rs), _lib_().kolo_grouped_allreduce_async,
                    c.ptr, n, c_names, c_send, c_recv, c_counts, ss[0].dtype, code, pre, post,
                    None, None, ctypes.byref(h))
    c.check(st, f"grouped allreduce {base}")
    return Handle(h.value, (ss, rs, c_names, c_send, c_recv, c_counts), lambda: result,
                  f"grouped allreduce {base}")


def _cuda_copy(dst: Buffer, src: int, nbytes: int) -> None:
    """Copies nbytes from src to dst, either or both CUDA memory, with
    cudaMemcpyAsync on dst's stream (the legacy default stream for a host
    dst) and waits for it: src is freed next. On dst's device when it is
    known (the stream belongs to it)."""
    rt = _lib.cudart()
    stream = dst.stream or None
    prev = ctypes.c_int(-1)
    switch = dst.device is not None and dst.device >= 0
    if switch and rt.cudaGetDevice(ctypes.byref(prev)) == 0:
        rt.cudaSetDevice(dst.device)
    try:
        rc = rt.cudaMemcpyAsync(dst.ptr, src, nbytes, _lib.CUDA_MEMCPY_DEFAULT, stream)
        if rc == 0:
            rc = rt.cudaStreamSynchronize(stream)
    finally:
        if switch and prev.value >= 0:
            rt.cudaSetDevice(prev.value)
    if rc != 0:
        raise RuntimeError(f"kolo: copying {nbytes} bytes into the output: CUDA error {rc}: "
                           f"{_lib.text(rt.cudaGetErrorString(rc))}")


def _gathered(recv_ptr: ctypes.c_void_p, counts, itemsz: int, alloc: Callable[[int], Any],
              on_device: bool = False) -> tuple:
    """The result of an allgather/alltoall: ``alloc(total)`` filled from the
    buffer kolo allocated (on the device when the input was, ``on_device``),
    which is then freed."""
    total = sum(counts)
    try:
        out = alloc(total)
        if total:
            ob = buffer(out, "output")
            if on_device or ob.device is not None:
                _cuda_copy(ob, recv_ptr.value, total * itemsz)
            else:
                ctypes.memmove(ob.ptr, recv_ptr.value, total * itemsz)
    finally:
        _lib_().kolo_free(recv_ptr.value)
    return out, list(counts)


def allgather_async(send: Any, alloc: Callable[[int], Any], name: Optional[str] = None,
                    comm: Optional[Comm] = None) -> Handle:
    """Gathers every rank's ``send`` (counts may differ by rank) in rank
    order. ``alloc(n)`` makes the output of n elements of send's dtype.
    The result is ``(output, counts)``."""
    s = buffer(send, "send")
    n = _get(comm).size()
    counts = (ctypes.c_size_t * n)()
    recv = ctypes.c_void_p()
    nm = op_name("allgather", name, comm)
    isz = itemsize(s.dtype_name)
    dev = s.device is not None
    return _enqueue("kolo_allgather_async", f"allgather {nm.decode()}",
                    [nm, s.ptr, s.count, s.dtype, ctypes.byref(recv), counts],
                    (s, counts, recv), lambda: _gathered(recv, counts, isz, alloc, dev),
                    s.stream, comm)


def allgather_into_async(send: Any, out: Any, name: Optional[str] = None,
                         comm: Optional[Comm] = None) -> Handle:
    """Gathers every rank's ``send`` in rank order into ``out`` (of send's
    dtype and kind of memory), which must hold them all: no allocation and
    no copy. The result is ``(out, counts)``; the elements of ``out`` past the
    gathered total are left as they were."""
    s, o = buffer(send, "send"), buffer(out, "output")
    if o.dtype_name != s.dtype_name:
        raise ValueError(f"kolo: allgather: output is {o.dtype_name}, input {s.dtype_name}")
    counts = (ctypes.c_size_t * _get(comm).size())()
    nm = op_name("allgather", name, comm)
    return _enqueue("kolo_allgather_into_async", f"allgather {nm.decode()}",
                    [nm, s.ptr, s.count, s.dtype, o.ptr, o.count, counts], (s, o, counts),
                    lambda: (out, list(counts)), _stream(s, o), comm)


def broadcast_async(buf: Any, root: int, name: Optional[str] = None,
                    comm: Optional[Comm] = None) -> Handle:
    """Broadcasts ``buf`` from rank ``root`` (of ``comm``) in place; the
    result is ``buf``."""
    b = buffer(buf, "tensor")
    n = _get(comm).size()
    if not isinstance(root, int) or not 0 <= root < n:
        raise ValueError(f"kolo: broadcast root {root!r} is not a rank of this job (size {n})")
    nm = op_name("broadcast", name, comm)
    return _enqueue("kolo_broadcast_async", f"broadcast {nm.decode()}",
                    [nm, b.ptr, b.count, b.dtype, root], (b,), lambda: buf, b.stream, comm)


def alltoall_async(send: Any, alloc: Callable[[int], Any],
                   splits: Optional[Sequence[int]] = None, name: Optional[str] = None,
                   comm: Optional[Comm] = None) -> Handle:
    """Sends ``splits[j]`` elements of ``send`` (in order) to rank j (None:
    equal parts). The result is ``(output, received counts)``."""
    s = buffer(send, "send")
    c_splits = _splits(s, splits, comm)
    counts = (ctypes.c_size_t * _get(comm).size())()
    recv = ctypes.c_void_p()
    nm = op_name("alltoall", name, comm)
    isz = itemsize(s.dtype_name)
    dev = s.device is not None
    return _enqueue("kolo_alltoall_async", f"alltoall {nm.decode()}",
                    [nm, s.ptr, s.count, c_splits, s.dtype, ctypes.byref(recv), counts],
                    (s, counts, recv, c_splits),
                    lambda: _gathered(recv, counts, isz, alloc, dev), s.stream, comm)


def _splits(s: Buffer, splits: Optional[Sequence[int]], comm: Optional[Comm] = None) -> Any:
    """An alltoall's splits as a C array (None: equal parts), checked."""
    n = _get(comm).size()
    c_splits = None
    if splits is not None:
        splits = [int(x) for x in splits]
        if len(splits) != n or any(x < 0 for x in splits) or sum(splits) != s.count:
            raise ValueError(f"kolo: alltoall splits {splits} must be {n} non-negative counts "
                             f"adding up to the {s.count} elements sent")
        c_splits = (ctypes.c_size_t * n)(*splits)
    elif s.count % n:
        raise ValueError(f"kolo: alltoall of {s.count} elements does not split into {n} equal "
                         f"parts; give splits")
    return c_splits


def alltoall_into_async(send: Any, out: Any, splits: Optional[Sequence[int]] = None,
                        name: Optional[str] = None, comm: Optional[Comm] = None) -> Handle:
    """:func:`alltoall_async` straight into ``out`` (of send's dtype and kind
    of memory), which must hold what arrives: no allocation and no copy. The
    result is ``(out, received counts)``."""
    s, o = buffer(send, "send"), buffer(out, "output")
    if o.dtype_name != s.dtype_name:
        raise ValueError(f"kolo: alltoall: output is {o.dtype_name}, input {s.dtype_name}")
    c_splits = _splits(s, splits, comm)
    counts = (ctypes.c_size_t * _get(comm).size())()
    nm = op_name("alltoall", name, comm)
    return _enqueue("kolo_alltoall_into_async", f"alltoall {nm.decode()}",
                    [nm, s.ptr, s.count, c_splits, s.dtype, o.ptr, o.count, counts],
                    (s, o, counts, c_splits), lambda: (out, list(counts)), _stream(s, o), comm)


def reducescatter_count(count: int, n: int, r: int) -> int:
    return int(_lib_().kolo_reducescatter_count(count, n, r))


def reducescatter_async(send: Any, recv: Any, name: Optional[str] = None, op: Any = "sum",
                        prescale: float = 1.0, postscale: float = 1.0,
                        comm: Optional[Comm] = None) -> Handle:
    """Reduces ``send`` over the ranks and leaves rank r its block of
    ``reducescatter_count(send elements, size, r)`` elements in ``recv``."""
    code = op_code(op)
    s = buffer(send, "send", reduce=OP_NAMES[code])
    r = buffer(recv, "recv")
    c = _get(comm)
    want = reducescatter_count(s.count, c.size(), c.rank())
    if r.count != want or r.dtype_name != s.dtype_name:
        raise ValueError(f"kolo: reducescatter output needs {want} {s.dtype_name} elements, "
                         f"has {r.count} {r.dtype_name}")
    pre, post = _scale(prescale, "prescale"), _scale(postscale, "postscale")
    nm = op_name("reducescatter", name, comm)
    return _enqueue("kolo_reducescatter_async", f"reducescatter {nm.decode()}",
                    [nm, s.ptr, r.ptr, s.count, s.dtype, code, pre, post], (s, r),
                    lambda: recv, _stream(s, r), comm)


def barrier_async(comm: Optional[Comm] = None) -> Handle:
    _orphans_reap()
    c = _get(comm)
    h = _lib.c_handle_p()
    c.check(_lib_().kolo_barrier_async(c.ptr, None, None, ctypes.byref(h)), "barrier")
    return Handle(h.value, (), None, "barrier")


def barrier(comm: Optional[Comm] = None) -> None:
    """Returns once every rank (of ``comm``) has called it."""
    barrier_async(comm).wait()


# ---- point-to-point ----------------------------------------------------------

ANY_SOURCE = -1


def _p2p_args(peer: Optional[int], tag: int, what: str, comm: Optional[Comm] = None) -> tuple:
    c = _get(comm)
    n = c.size()
    if peer is not None and (not isinstance(peer, int) or not 0 <= peer < n):
        raise ValueError(f"kolo: {what}: rank {peer!r} is not in the job (size {n})")
    if peer is not None and peer == c.rank():
        raise ValueError(f"kolo: {what}: rank {peer} is this rank")
    if not isinstance(tag, int) or not -2**31 <= tag < 2**31:
        raise ValueError(f"kolo: {what}: tag {tag!r} is not a 32-bit integer")
    return (ANY_SOURCE if peer is None else peer), tag


def send_async(tensor: Any, dst: int, tag: int = 0, comm: Optional[Comm] = None) -> Handle:
    """Sends the bytes of ``tensor`` (host memory) to rank ``dst`` with
    ``tag``. Completes once they are handed to the transport; the tensor must
    stay unchanged until then. Messages from one rank with one tag arrive in
    the order sent."""
    b = buffer(tensor, "send tensor")
    dst, tag = _p2p_args(dst, tag, "send", comm)
    return _enqueue("kolo_send_async", f"send to rank {dst} (tag {tag})",
                    [b.ptr, b.nbytes, dst, tag], (b,), comm=comm)


def recv_async(tensor: Any, src: Optional[int] = None, tag: int = 0,
               comm: Optional[Comm] = None) -> Handle:
    """Receives a message of exactly ``tensor``'s size with ``tag`` from rank
    ``src`` (None: from any rank) into ``tensor``. ``wait()`` returns the
    sender's rank. A message of another size raises MismatchError and stays
    for a recv that fits."""
    b = buffer(tensor, "recv tensor")
    src, tag = _p2p_args(src, tag, "recv", comm)
    source = ctypes.c_int(-1)
    who = "any rank" if src == ANY_SOURCE else f"rank {src}"
    return _enqueue("kolo_recv_async", f"recv from {who} (tag {tag})",
                    [b.ptr, b.nbytes, src, tag, ctypes.byref(source)], (b, source),
                    lambda: source.value, comm=comm)


def send(tensor: Any, dst: int, tag: int = 0, comm: Optional[Comm] = None) -> None:
    """:func:`send_async` and wait."""
    send_async(tensor, dst, tag, comm).wait()


def recv(tensor: Any, src: Optional[int] = None, tag: int = 0,
         comm: Optional[Comm] = None) -> int:
    """:func:`recv_async` and wait; returns the sender's rank."""
    return recv_async(tensor, src, tag, comm).wait()


def join() -> int:
    """This rank has no more data: it takes part in the others' allreduces
    with zeros until every rank has joined. Returns the last rank to join."""
    c = _get()
    last = ctypes.c_int(-1)
    c.check(_lib_().kolo_join(c.ptr, ctypes.byref(last)), "join")
    return last.value


def timeline_start(path: str) -> None:
    c = _get()
    c.check(_lib_().kolo_timeline_start(c.ptr, os.fsencode(path)), "timeline_start")


def timeline_stop() -> None:
    c = _get()
    c.check(_lib_().kolo_timeline_stop(c.ptr), "timeline_stop")


# ---- elastic ---------------------------------------------------------------


def elastic_enabled() -> bool:
    c = _comm
    return bool(c and _lib_().kolo_elastic_enabled(c.ptr))


def reform() -> None:
    """Takes the comm to the next membership round (elastic jobs). Raises
    :class:`ShutdownError` when this worker left the job meanwhile."""
    c = _get()
    orphans = _orphans_take()
    st = _lib_().kolo_reform(c.ptr)
    _orphans_release(orphans)  # after the reform has stopped the old round's engine
    reset_names()
    c.check(st, "reform")


#: The exit status of a worker evicted as a straggler (C KOLO_EXIT_EVICTED).
EXIT_EVICTED = 90


def elastic_evicted() -> bool:
    """True after the job's straggler policy (``KOLO_STRAGGLER_EVICT_PCT``)
    evicted this worker at a commit point; it then leaves the job and exits
    with :data:`EXIT_EVICTED` (``hvd.elastic.run`` does so)."""
    c = _comm
    return bool(c and _lib_().kolo_elastic_evicted(c.ptr))


def elastic_resets() -> int:
    return _int("kolo_elastic_resets")


def elastic_done() -> None:
    """Says that this worker's training is complete: its :func:`finalize`
    then tells the rendezvous that the job finished, so that workers still
    waiting to join it exit 0 instead of waiting (the elastic loop of
    kolo.torch calls it when the training function returns)."""
    c = _comm
    if c is not None:
        _lib_().kolo_elastic_done(c.ptr)


class Commit:
    """kolo's commit point without registered buffers: :meth:`check` is the
    one small allreduce that tells whether a join or a leave is pending.
    The training state itself is kept by the caller (kolo.torch.elastic)."""

    def __init__(self):
        c = _get()
        p = _lib.c_state_p()
        c.check(_lib_().kolo_state_create(c.ptr, ctypes.byref(p)), "kolo_state_create")
        self._ptr = p.value

    def check(self) -> bool:
        """True when the job must re-form (a change is pending); raises the
        collective's failure otherwise."""
        st = _lib_().kolo_state_commit(self._ptr)
        if st == _S["EMEMBERSHIP"]:
            return True
        _get().check(st, "commit")
        return False

    def left(self) -> bool:
        """True after this worker left the job at a commit (SIGTERM)."""
        return bool(_lib_().kolo_state_left(self._ptr))

    def number(self) -> int:
        """The number of the last commit, the same on every rank."""
        return int(_lib_().kolo_state_commit_number(self._ptr))

    def durable_due(self) -> bool:
        """True when the last commit is a durable one that this rank writes
        (``KOLO_DURABLE_DIR``, docs/durable.md)."""
        return bool(_lib_().kolo_durable_due(self._ptr))

    def durable_put(self, data: bytes) -> None:
        """Hands ``data`` (the committed state, serialised) to the background
        writer as the last commit's durable commit; returns at once."""
        _get().check(_lib_().kolo_durable_put(self._ptr, data, len(data)), "durable put")

    def durable_resume(self) -> Optional[Tuple[int, bytes]]:
        """Before the first sync, on rank 0 of a state that never committed:
        ``(commit, data)`` of the job's durable commit, else None."""
        data, size, commit = ctypes.c_void_p(), ctypes.c_size_t(), ctypes.c_int64()
        st = _lib_().kolo_durable_resume(self._ptr, ctypes.byref(data), ctypes.byref(size),
                                         ctypes.byref(commit))
        if st == _S["ENOTFOUND"]:
            return None
        _get().check(st, "durable resume")
        try:
            return commit.value, ctypes.string_at(data, size.value) if size.value else b""
        finally:
            _lib_().kolo_free(data)

    def close(self) -> None:
        if self._ptr is not None:
            _lib_().kolo_state_destroy(self._ptr)
            self._ptr = None

    def __del__(self):
        if getattr(self, "_ptr", None) is not None and _lib._lib is not None:
            self.close()


def elastic_leave() -> None:
    """Leave the job at the next commit point, as SIGTERM does."""
    _lib_().kolo_elastic_leave()


def elastic_leaving() -> bool:
    """True once this worker was asked to leave (SIGTERM in an elastic
    worker, :func:`elastic_leave`, a preemption notice): it leaves at its
    next commit point."""
    return bool(_lib_().kolo_elastic_leaving())


def elastic_preemption() -> tuple:
    """The preemption notices this process saw (``KOLO_PREEMPTION``,
    docs/spot.md): ``(kind, text)`` with kind 0 (none), 1 (an early hint such
    as AWS's rebalance recommendation: the worker stays) or 2 (a notice: the
    worker leaves at its next commit point); text names the provider and the
    notice."""
    buf = ctypes.create_string_buffer(512)
    kind = _lib_().kolo_elastic_preemption(buf, len(buf))
    return int(kind), buf.value.decode("utf-8", "replace")


def elastic_preemption_deadline_ms() -> int:
    """Milliseconds left until the deadline of this process's preemption
    notice (AWS's instance-action ``time``, GCE's 30 s from the notice,
    Azure's ``NotBefore``, the pod's ``deletionTimestamp``), 0 once it
    passed, -1 with no notice or a notice without a deadline. Local: any
    rank, any thread, any time (also before :func:`init`). A training loop
    can commit early when it is short: a worker that has not reached a
    commit point ``KOLO_PREEMPTION_MARGIN_MS`` before the deadline leaves the
    job at once and its process exits 0 (the others restore their last
    commit)."""
    return int(_lib_().kolo_elastic_preemption_deadline_ms())


from .runner import run  # noqa: E402  (horovod.run)

__all__ = [
    "Error", "MembershipError", "MismatchError", "ShutdownError", "Buffer", "Handle", "Commit",
    "init", "finalize", "shutdown", "abort", "is_initialized", "rank", "size", "local_rank",
    "local_size", "cross_rank", "cross_size", "round", "last_error", "allreduce_async",
    "grouped_allreduce_async", "allgather_async", "allgather_into_async", "alltoall_into_async", "broadcast_async", "alltoall_async",
    "reducescatter_async", "reducescatter_count", "barrier_async", "barrier", "join",
    "send_async", "recv_async", "send", "recv", "ANY_SOURCE",
    "timeline_start", "timeline_stop", "elastic_enabled", "reform", "elastic_resets",
    "elastic_leave", "elastic_leaving", "elastic_preemption", "elastic_preemption_deadline_ms", "elastic_done", "elastic_evicted", "EXIT_EVICTED", "bootstrap_connect", "adopt", "buffer", "status_name", "cuda_supported",
    "run",
]
