"""kolo.torch.distributed: kolo as a ``torch.distributed`` backend.

Importing this module registers the c10d backend ``"kolo"`` and the
rendezvous scheme ``kolo://``; an unchanged DistributedDataParallel script
then runs on kolo with one changed word::

    import kolo.torch.distributed  # noqa: F401  (registers the backend)
    dist.init_process_group("kolo")                         # under torchrun (env://)
    dist.init_process_group("kolo", init_method="kolo://")  # under kolorun
    model = torch.nn.parallel.DistributedDataParallel(model)

Two ways in:

* ``kolo://`` (under ``kolorun``, or with ``KOLO_RENDEZVOUS`` set): the
  process joins kolo's rendezvous (:func:`kolo.init`); rank and size are
  kolo's. The store torch insists on is a :class:`KoloStore`, whose ``add``
  is a kolo allreduce (enough for torch's store-based barrier) and whose
  ``set``/``get`` go to the rendezvous server's KV store. Elastic jobs
  (``kolorun --min-np/--max-np``) re-form in place: see :func:`elastic_run`.
* ``env://`` or an explicit ``store=`` (torchrun, a PyTorchJob): kolo's data
  plane is bootstrapped through the c10d store torch already built
  (:func:`kolo.bootstrap_connect`), with a random job id and token that rank
  0 shares through the store. The comm is finalized after a barrier through
  the same store when the default group is destroyed or the interpreter
  exits (after :func:`kolo.abort` instead when an operation failed).

The process group is a Python subclass of ``torch.distributed.ProcessGroup``.
Every operation is issued to kolo's fusion engine under the name
``c10d.<group>.<sequence>.<kind>`` (c10d requires the same order on every
rank, so the sequence number names an operation consistently) and completed
by one thread per group that waits on kolo's handles in issue order and
completes a torch future. Tensors must be dense, contiguous CPU or CUDA
tensors of a dtype kolo knows (:func:`kolo.buffer` checks; complex tensors
travel as their real view); CUDA tensors need a libkolo with the device data
path (:func:`kolo.cuda_supported`), and then DDP with ``device_ids`` runs on
kolo as it does on nccl: kolo orders its work after torch's current stream
at the call, and the futures of operations on CUDA tensors are CUDA-aware
(``torch.futures.Future(devices=...)``), so DDP's reducer may chain them.
Reductions: SUM, AVG, MIN, MAX, PRODUCT (BAND, BOR, BXOR and PREMUL_SUM
raise ValueError).

Supported from Python (``dist.*``): all_reduce, all_reduce_coalesced,
broadcast, all_gather, all_gather_into_tensor / _all_gather_base,
all_gather_coalesced, reduce_scatter, reduce_scatter_tensor /
_reduce_scatter_base, all_to_all, all_to_all_single, reduce, gather, scatter,
barrier, and what builds on them (all_gather_object, broadcast_object_list,
gather_object, scatter_object_list, ZeroRedundancyOptimizer, DDP and its
join()). Refused: send/recv/isend/irecv (kolo has no point-to-point
operations), new_group with a subset of the ranks (kolo has one communicator
per process; use ``backend="gloo"`` for such a group), monitored_barrier
(torch allows it on gloo only). torch 1.13 dispatches only allreduce,
allgather, broadcast, reduce_scatter, barrier, send and recv of a Python
group from C++; the others are reached through the ``dist.*`` functions
(Python attribute lookup), not from C++ code that calls them directly.

Error reporting: ``dist.*`` calls get a work object whose ``wait()`` raises
kolo's own exception (:class:`kolo.MembershipError` when a peer failed, ...).
C++ callers (DDP's reducer) get a work wrapping a future that fails with a
RuntimeError carrying kolo's message. After a membership or shutdown
failure a group refuses new operations with the same error class.

Two torch functions are wrapped (only when this module is imported, and only
changing what they do for kolo groups): ``destroy_process_group`` also stops
the kolo groups' completion threads and finalizes a bootstrapped comm, and
``new_group`` refuses a subset of the ranks for the kolo backend on every
rank alike (instead of failing on the members only, leaving the others
waiting in torch's store barrier).
"""

from __future__ import annotations

import atexit
import copy
import datetime
import functools
import gc
import hashlib
import inspect
import itertools
import json
import logging
import os
import queue
import re
import secrets
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Callable, List, Optional, Sequence

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as _c10d
from torch._C._distributed_c10d import _create_work_from_future

from . import _functional

import kolo

log = logging.getLogger("kolo.torch.distributed")

BACKEND = "kolo"
SCHEME = "kolo"

_DEFAULT_TIMEOUT = _c10d.default_pg_timeout
# The file whose frames call a group's methods: torch >= 2.1 wraps every
# public collective (c10d_logger._exception_logger), so the wrapper's own
# code names another file; unwrap to the function that calls the group.
_C10D_FILE = inspect.unwrap(_c10d.all_reduce).__code__.co_filename

# Python halves of the trampoline objects (stores, groups) stay referenced
# here: once only C++ holds one, pybind11 lets its Python half go and a call
# into it fails ("pure virtual function") or hangs.
_stores: List["KoloStore"] = []
_groups: List["ProcessGroupKolo"] = []
_lock = threading.RLock()

# Failures seen by any kolo group of this process: elastic_run uses them to
# tell a collective's failure from the training function's own errors.
_failure_count = 0
_last_failure: Optional[BaseException] = None


def _note_failure(exc: BaseException) -> None:
    global _failure_count, _last_failure
    with _lock:
        _failure_count += 1
        _last_failure = exc


# ---- reductions and tensors -------------------------------------------------

_R = dist.ReduceOp
_OPS = ((_R.SUM, "sum"), (_R.AVG, "average"), (_R.MIN, "min"), (_R.MAX, "max"),
        (_R.PRODUCT, "product"))


def _op_name(op: Any) -> str:
    t = getattr(op, "op", op)
    return getattr(t, "name", str(t))


def _kolo_op(opts: Any) -> str:
    op = getattr(opts, "reduceOp", _R.SUM) if opts is not None else _R.SUM
    for torch_op, name in _OPS:
        if op == torch_op:
            return name
    raise ValueError(f"kolo: ReduceOp.{_op_name(op)} is not supported (kolo reduces with SUM, "
                     f"AVG, MIN, MAX and PRODUCT)")


def _real(t: torch.Tensor) -> torch.Tensor:
    """The tensor kolo moves: complex tensors as their float view."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"kolo: expected a torch.Tensor, got {type(t).__name__}")
    return torch.view_as_real(t) if t.is_complex() else t


def _one(items: Sequence[Any], what: str) -> Any:
    if len(items) != 1:
        raise ValueError(f"kolo: {what} takes one tensor (list) per process, got {len(items)}; "
                         f"kolo runs one device per process")
    return items[0]


def _same(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    if a.dtype != b.dtype or a.numel() != b.numel():
        raise ValueError(f"kolo: {what}: tensor of {b.numel()} {b.dtype} where {a.numel()} "
                         f"{a.dtype} are expected")


def _flat(t: torch.Tensor, what: str, reduce: Optional[str] = None) -> torch.Tensor:
    t = _real(t)
    kolo.buffer(t, what, reduce=reduce)  # device, layout, dtype and contiguity checks
    return t.view(-1)


def _timeout_s(timeout: Any) -> float:
    if isinstance(timeout, datetime.timedelta):
        return max(timeout.total_seconds(), 0.0)
    return float(timeout)


def _kolo_timeout_ms(timeout: Any) -> int:
    """kolo's progress timeout for torch's ``timeout``: 0 (kolo's own
    KOLO_TIMEOUT_MS, 30 s by default) for torch's 30-minute default."""
    if timeout is None or timeout == _DEFAULT_TIMEOUT:
        return 0
    return int(min(max(_timeout_s(timeout) * 1000, 1), 2**31 - 1))


def _wait_bounded(h: kolo.Handle, timeout_s: float, what: str) -> Any:
    """Waits for a handle at most timeout_s (a torch timeout, not kolo's
    progress timeout: an op that waits for a live but absent rank)."""
    deadline = time.monotonic() + timeout_s
    delay = 0.0002
    while not h.poll():
        if time.monotonic() > deadline:
            raise RuntimeError(f"kolo: {what} did not complete within {timeout_s:.0f} s (not every "
                               f"rank took part)")
        time.sleep(delay)
        delay = min(delay * 2, 0.01)
    return h.wait()


# ---- works ------------------------------------------------------------------


class _Failure:
    """The value a failed operation's inner future carries."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException):
        self.exc = exc


def _cuda_devices(outputs: Any) -> list:
    """The CUDA devices of the tensors in ``outputs`` (a tensor, or lists of
    them, nested), in order of appearance, each once; [] for CPU tensors."""
    found: list = []
    stack = [outputs]
    while stack:
        x = stack.pop()
        if isinstance(x, torch.Tensor):
            if x.device.type == "cuda" and x.device not in found:
                found.append(x.device)
        elif isinstance(x, (list, tuple)):
            stack.extend(reversed(x))
    return found


def _unwrap(fut: torch.futures.Future) -> Any:
    v = fut.value()
    if isinstance(v, _Failure):
        raise v.exc
    return v


class _Op:
    """One operation in flight: its kolo handles, the futures and the event
    the completion thread sets."""

    __slots__ = ("name", "handles", "outputs", "finish", "inner", "future", "done", "failure")

    def __init__(self, name: str, handles: list, outputs: Any,
                 finish: Optional[Callable[[list], None]]):
        self.name = name
        self.handles = handles
        self.outputs = outputs
        self.finish = finish
        devices = _cuda_devices(outputs)
        # A future that carries CUDA tensors must know their devices (torch
        # refuses the result otherwise) and records an event on each when
        # completed; kolo's results are already visible to every stream then.
        self.inner = torch.futures.Future(devices=devices) if devices else torch.futures.Future()
        # A failure must reach C++ consumers (DDP's reducer) as a real error of
        # the future: a callback that raises gives the chained future one.
        self.future = self.inner.then(_unwrap)
        self.done = threading.Event()
        self.failure: Optional[BaseException] = None


class _Work(dist.Work):
    """The work ``dist.*`` calls get: ``wait()`` raises kolo's exception
    (a C++ work made from a future would return normally after a failure).
    Only handed to Python callers, which keep it referenced while they use it."""

    def __init__(self, op: _Op):
        super().__init__()
        self._op = op

    def wait(self, timeout: Any = None) -> bool:
        t = None
        if timeout is not None:
            t = _timeout_s(timeout)
            t = None if t <= 0 else t
        if not self._op.done.wait(t):
            raise RuntimeError(f"kolo: {self._op.name} did not complete within {t:.1f} s")
        if self._op.failure is not None:
            raise self._op.failure
        return True

    def get_future(self) -> torch.futures.Future:
        return self._op.future

    def is_completed(self) -> bool:
        return self._op.done.is_set()

    def is_success(self) -> bool:
        return self._op.done.is_set() and self._op.failure is None

    def exception(self) -> Optional[BaseException]:
        return self._op.failure

    def result(self) -> list:
        self.wait()
        out = self._op.outputs
        return list(out) if isinstance(out, (list, tuple)) else [out]

    def synchronize(self) -> None:
        pass

    def source_rank(self) -> int:
        raise RuntimeError("kolo: source_rank() belongs to recv, which kolo does not have")


def _called_from_c10d() -> bool:
    """True when the group method was called by torch.distributed's Python
    functions (frame 0: _issue, 1: the method, 2: its caller)."""
    try:
        f = sys._getframe(3)
    except ValueError:
        return False
    return f is not None and f.f_code.co_filename == _C10D_FILE


# ---- the process group ------------------------------------------------------


class ProcessGroupKolo(dist.ProcessGroup):
    """A c10d process group over this process's kolo comm. Made by
    ``init_process_group``/``new_group`` with backend ``"kolo"``; every rank
    of the job is a member, with kolo's rank and size."""

    def __init__(self, rank: int, size: int, group_id: str, timeout: Any):
        super().__init__(rank, size)
        self._gid = group_id or "0"
        self._name = self._gid
        self._desc = "undefined"
        self._timeout = timeout
        self._seq = 0
        self._issue_lock = threading.Lock()
        self._queue: "queue.Queue[Optional[_Op]]" = queue.Queue()
        self._pending = 0
        self._idle = threading.Condition()
        self._closed: Optional[str] = None
        self._broken: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._complete, daemon=True,
                                        name=f"kolo-c10d-{self._gid}")
        self._thread.start()

    def __repr__(self) -> str:
        return f"ProcessGroupKolo(group {self._gid}, rank {self.rank()} of {self.size()})"

    def getBackendName(self) -> str:
        return BACKEND

    # -- names and teardown (torch calls these through its C++ trampoline) --

    def getGroupName(self) -> str:
        return self._name

    def setGroupName(self, name: str) -> None:
        self._name = str(name)

    def getGroupDesc(self) -> str:
        return self._desc

    def setGroupDesc(self, desc: str) -> None:
        self._desc = str(desc)

    def shutdown(self) -> None:
        """torch's destroy_process_group (2.7+): lets the operations in flight
        complete (bounded by the group's timeout, at most 30 s) and stops
        the completion thread."""
        self._shutdown("destroyed", min(_timeout_s(self._timeout), 30.0))

    def abort(self) -> None:
        """Stops the group without waiting for what is in flight: later calls
        raise, and the operations in flight complete with kolo's own
        timeout or membership error."""
        if not self._closed:
            self._closed = "aborted"
            self._queue.put(None)

    # -- issuing and completing --

    def _issue(self, kind: str, outputs: Any, launch: Callable[[str], list],
               finish: Optional[Callable[[list], None]] = None) -> Any:
        python_caller = _called_from_c10d()
        if self._closed:
            raise RuntimeError(f"kolo: {kind} on process group {self._gid}, which was "
                               f"{self._closed}")
        b = self._broken
        if b is not None:
            raise _again(b, f"{kind}: an earlier operation of process group {self._gid} failed")
        with self._issue_lock:
            name = f"c10d.{self._gid}.{self._seq}.{kind}"
            try:
                handles = launch(name)
            except kolo.Error as e:
                self._failed(e)
                raise
            self._seq += 1
            op = _Op(name, handles, outputs, finish)
            with self._idle:
                self._pending += 1
            self._queue.put(op)
        if python_caller:
            return _Work(op)
        return _create_work_from_future(op.future)

    def _failed(self, exc: BaseException) -> None:
        _note_failure(exc)
        if isinstance(exc, (kolo.MembershipError, kolo.ShutdownError)) and self._broken is None:
            self._broken = exc

    def _complete(self) -> None:
        while True:
            op = self._queue.get()
            if op is None:
                return
            failure: Optional[BaseException] = None
            results = []
            for h in op.handles:
                try:
                    results.append(h.wait())
                except BaseException as e:  # noqa: B036 - every handle must be waited for
                    failure = failure or e
            if failure is None and op.finish is not None:
                try:
                    op.finish(results)
                except BaseException as e:  # noqa: B036
                    failure = e
            if failure is not None:
                self._failed(failure)
                op.failure = failure
            try:
                op.inner.set_result(_Failure(failure) if failure is not None else op.outputs)
            except BaseException:  # noqa: B036 - a callback of torch's; never kill the thread
                log.exception("kolo: completing %s", op.name)
            op.done.set()
            op.handles = []
            with self._idle:
                self._pending -= 1
                if self._pending == 0:
                    self._idle.notify_all()

    def _drain(self, timeout_s: float) -> bool:
        """Waits until every issued operation has completed; False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._idle:
            while self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def _shutdown(self, why: str, timeout_s: float = 30.0) -> bool:
        """Stops the completion thread after the operations in flight
        (bounded); later calls raise. Returns whether it drained."""
        if self._closed:
            return True
        drained = self._drain(timeout_s)
        self._closed = why
        self._queue.put(None)
        if drained:
            self._thread.join(5.0)
        return drained

    # -- collectives --

    def allreduce(self, tensors: List[torch.Tensor], opts: Any = None) -> Any:
        op = _kolo_op(opts)
        t = _flat(_one(tensors, "allreduce"), "allreduce tensor", op)
        return self._issue("allreduce", tensors,
                           lambda n: [kolo.allreduce_async(t, name=n, op=op)])

    def allreduce_coalesced(self, tensors: List[torch.Tensor], opts: Any = None) -> Any:
        op = _kolo_op(opts)
        flats = [_flat(x, f"allreduce_coalesced tensor {i}", op) for i, x in enumerate(tensors)]
        if not flats:
            raise ValueError("kolo: allreduce_coalesced of no tensors")

        def launch(n: str) -> list:
            if len({f.dtype for f in flats}) == 1:
                return [kolo.grouped_allreduce_async(flats, name=n, op=op)]
            return [kolo.allreduce_async(f, name=f"{n}.{i}", op=op) for i, f in enumerate(flats)]

        return self._issue("allreduce_coalesced", tensors, launch)

    def broadcast(self, tensors: List[torch.Tensor], opts: Any = None) -> Any:
        root = opts.rootRank if opts is not None else 0
        if opts is not None and opts.rootTensor != 0:
            raise ValueError("kolo: broadcast takes one tensor per process (rootTensor 0)")
        self._check_root(root, "broadcast")
        t = _flat(_one(tensors, "broadcast"), "broadcast tensor")
        return self._issue("broadcast", tensors,
                           lambda n: [kolo.broadcast_async(t, root, name=n)])

    def _check_root(self, root: int, what: str) -> None:
        if not 0 <= root < self.size():
            raise ValueError(f"kolo: {what} root {root} is not a rank of this group "
                             f"(size {self.size()})")

    def _gather_flat(self, t: torch.Tensor, name: str, out: Optional[torch.Tensor]) -> list:
        """Allgathers t; the result lands in out (flat, size * t elements)
        when given, else in a new tensor. Counts are checked in finish."""
        n = self.size()
        want = n * t.numel()

        def alloc(total: int) -> torch.Tensor:
            if out is not None and total == want:
                return out
            return torch.empty(total, dtype=t.dtype, device=t.device)

        return [kolo.allgather_async(t, alloc, name=name)]

    def _counts_equal(self, results: list, per_rank: int, what: str) -> torch.Tensor:
        flat, counts = results[0]
        if any(c != per_rank for c in counts):
            raise ValueError(f"kolo: {what}: the ranks sent {list(counts)} elements; every rank "
                             f"must send {per_rank}")
        return flat

    def allgather(self, output_tensors: List[List[torch.Tensor]], input_tensors: List[torch.Tensor],
                  opts: Any = None) -> Any:
        t = _flat(_one(input_tensors, "allgather"), "allgather input")
        outs = _one(output_tensors, "allgather")
        if len(outs) != self.size():
            raise ValueError(f"kolo: allgather needs {self.size()} output tensors, got {len(outs)}")
        for o in outs:
            _same(t, _real(o), "allgather output")
        m = t.numel()

        def finish(results: list) -> None:
            flat = self._counts_equal(results, m, "allgather")
            for r, o in enumerate(outs):
                _real(o).copy_(flat[r * m:(r + 1) * m].view(_real(o).shape))

        return self._issue("allgather", outs, lambda n: self._gather_flat(t, n, None), finish)

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor,  # noqa: A002
                        opts: Any = None) -> Any:
        t = _flat(input, "all_gather_into_tensor input")
        out = _flat(output, "all_gather_into_tensor output")
        if out.dtype != t.dtype or out.numel() != self.size() * t.numel():
            raise ValueError(f"kolo: all_gather_into_tensor: output has {out.numel()} {out.dtype} "
                             f"elements, needs {self.size() * t.numel()} {t.dtype}")
        m = t.numel()

        def finish(results: list) -> None:
            flat = self._counts_equal(results, m, "all_gather_into_tensor")
            if flat.data_ptr() != out.data_ptr():
                out.copy_(flat)

        return self._issue("allgather_base", [output],
                           lambda n: self._gather_flat(t, n, out), finish)

    # torch >= 2.13 calls all_gather_into_tensor's backend entry by this name.
    all_gather_single = _allgather_base

    def allgather_coalesced(self, output_lists: List[List[torch.Tensor]],
                            input_list: List[torch.Tensor], opts: Any = None) -> Any:
        ins = [_flat(x, f"all_gather_coalesced input {i}") for i, x in enumerate(input_list)]
        if len(output_lists) != self.size() or any(len(o) != len(ins) for o in output_lists):
            raise ValueError(f"kolo: all_gather_coalesced needs {self.size()} output lists of "
                             f"{len(ins)} tensors")
        for outs in output_lists:
            for t, o in zip(ins, outs):
                _same(t, _real(o), "all_gather_coalesced output")

        def launch(n: str) -> list:
            return [h for i, t in enumerate(ins) for h in self._gather_flat(t, f"{n}.{i}", None)]

        def finish(results: list) -> None:
            for i, t in enumerate(ins):
                m = t.numel()
                flat = self._counts_equal(results[i:i + 1], m, "all_gather_coalesced")
                for r in range(self.size()):
                    o = _real(output_lists[r][i])
                    o.copy_(flat[r * m:(r + 1) * m].view(o.shape))

        return self._issue("allgather_coalesced", output_lists, launch, finish)

    def _reduce_scatter_flat(self, send: torch.Tensor, out: torch.Tensor, op: str,
                             what: str) -> Callable[[str], list]:
        n, r = self.size(), self.rank()
        m = out.numel()
        if send.numel() != n * m or send.dtype != out.dtype:
            raise ValueError(f"kolo: {what}: input has {send.numel()} {send.dtype} elements, "
                             f"needs {n * m} {out.dtype} ({n} blocks of the output's {m})")
        if kolo.reducescatter_count(n * m, n, r) != m:
            raise ValueError(f"kolo: {what}: {n * m} elements do not split into {n} blocks of {m}")
        return lambda name: [kolo.reducescatter_async(send, out, name=name, op=op)]

    def reduce_scatter(self, output_tensors: List[torch.Tensor],
                       input_tensors: List[List[torch.Tensor]], opts: Any = None) -> Any:
        op = _kolo_op(opts)
        out = _flat(_one(output_tensors, "reduce_scatter"), "reduce_scatter output", op)
        ins = _one(input_tensors, "reduce_scatter")
        if len(ins) != self.size():
            raise ValueError(f"kolo: reduce_scatter needs {self.size()} input tensors, got "
                             f"{len(ins)}")
        for x in ins:
            _same(out, _real(x), "reduce_scatter input")
        send = torch.cat([_real(x).reshape(-1) for x in ins])
        return self._issue("reduce_scatter", output_tensors,
                           self._reduce_scatter_flat(send, out, op, "reduce_scatter"))

    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor,  # noqa: A002
                             opts: Any = None) -> Any:
        op = _kolo_op(opts)
        out = _flat(output, "reduce_scatter_tensor output", op)
        send = _flat(input, "reduce_scatter_tensor input")
        return self._issue("reduce_scatter_base", [output],
                           self._reduce_scatter_flat(send, out, op, "reduce_scatter_tensor"))

    # torch >= 2.13 calls reduce_scatter_tensor's backend entry by this name.
    reduce_scatter_single = _reduce_scatter_base

    def _alltoall(self, send: torch.Tensor, splits: List[int], recv_counts: List[int],
                  out: Optional[torch.Tensor], what: str) -> tuple:
        total = sum(recv_counts)

        def alloc(n: int) -> torch.Tensor:
            if out is not None and n == total:
                return out
            return torch.empty(n, dtype=send.dtype, device=send.device)

        def launch(name: str) -> list:
            return [kolo.alltoall_async(send, alloc, splits=splits, name=name)]

        def received(results: list) -> torch.Tensor:
            flat, counts = results[0]
            if list(counts) != list(recv_counts):
                raise ValueError(f"kolo: {what}: received {list(counts)} elements from the "
                                 f"ranks, expected {list(recv_counts)}")
            return flat

        return launch, received

    def alltoall_base(self, output: torch.Tensor, input: torch.Tensor,  # noqa: A002
                      output_split_sizes: List[int], input_split_sizes: List[int],
                      opts: Any = None) -> Any:
        n = self.size()
        src = _real(input)
        dst = _real(output)
        send = _flat(input, "all_to_all_single input")
        out = _flat(output, "all_to_all_single output")
        if send.dtype != out.dtype:
            raise ValueError(f"kolo: all_to_all_single: input {send.dtype}, output {out.dtype}")

        def parts(t: torch.Tensor, sizes: List[int], what: str) -> List[int]:
            rows = t.shape[0] if t.dim() else 1
            row = t.numel() // rows if rows else 0
            if not sizes:
                if rows % n:
                    raise ValueError(f"kolo: all_to_all_single: {what} has {rows} rows, which do "
                                     f"not split into {n} equal parts; give split sizes")
                return [rows // n * row] * n
            if len(sizes) != n or any(s < 0 for s in sizes) or sum(sizes) != rows:
                raise ValueError(f"kolo: all_to_all_single: {what} split sizes {list(sizes)} must "
                                 f"be {n} counts adding up to its {rows} rows")
            return [s * row for s in sizes]

        splits = parts(src, list(input_split_sizes), "input")
        recv = parts(dst, list(output_split_sizes), "output")
        launch, received = self._alltoall(send, splits, recv, out, "all_to_all_single")

        def finish(results: list) -> None:
            flat = received(results)
            if flat.data_ptr() != out.data_ptr():
                out.copy_(flat)

        return self._issue("alltoall_base", [output], launch, finish)

    def alltoall(self, output_tensors: List[torch.Tensor], input_tensors: List[torch.Tensor],
                 opts: Any = None) -> Any:
        n = self.size()
        if len(output_tensors) != n or len(input_tensors) != n:
            raise ValueError(f"kolo: all_to_all needs {n} input and {n} output tensors")
        ins = [_real(x) for x in input_tensors]
        outs = [_real(x) for x in output_tensors]
        dtypes = {x.dtype for x in ins + outs}
        if len(dtypes) != 1:
            raise ValueError(f"kolo: all_to_all: tensors of several dtypes {sorted(map(str, dtypes))}")
        send = torch.cat([x.reshape(-1) for x in ins])
        kolo.buffer(send, "all_to_all input")
        launch, received = self._alltoall(send, [x.numel() for x in ins],
                                          [x.numel() for x in outs], None, "all_to_all")

        def finish(results: list) -> None:
            flat = received(results)
            at = 0
            for o in outs:
                o.copy_(flat[at:at + o.numel()].view(o.shape))
                at += o.numel()

        return self._issue("alltoall", output_tensors, launch, finish)

    def reduce(self, tensors: List[torch.Tensor], opts: Any = None) -> Any:
        op = _kolo_op(opts)
        root = opts.rootRank if opts is not None else 0
        self._check_root(root, "reduce")
        t = _real(_one(tensors, "reduce"))
        kolo.buffer(t, "reduce tensor", reduce=op)
        tmp = t.reshape(-1).clone()  # kolo has no reduce: an allreduce, kept by the root

        def finish(results: list) -> None:
            if self.rank() == root:
                t.view(-1).copy_(tmp)

        return self._issue("reduce", tensors,
                           lambda n: [kolo.allreduce_async(tmp, name=n, op=op)], finish)

    def gather(self, output_tensors: List[List[torch.Tensor]], input_tensors: List[torch.Tensor],
               opts: Any = None) -> Any:
        root = opts.rootRank if opts is not None else 0
        self._check_root(root, "gather")
        t = _flat(_one(input_tensors, "gather"), "gather input")
        outs: List[torch.Tensor] = []
        if self.rank() == root:
            outs = _one(output_tensors, "gather")
            if len(outs) != self.size():
                raise ValueError(f"kolo: gather needs {self.size()} output tensors on the root, "
                                 f"got {len(outs)}")
            for o in outs:
                _same(t, _real(o), "gather output")
        m = t.numel()

        def finish(results: list) -> None:
            flat = self._counts_equal(results, m, "gather")
            for r, o in enumerate(outs):
                _real(o).copy_(flat[r * m:(r + 1) * m].view(_real(o).shape))

        return self._issue("gather", output_tensors, lambda n: self._gather_flat(t, n, None),
                           finish)

    def scatter(self, output_tensors: List[torch.Tensor],
                input_tensors: List[List[torch.Tensor]], opts: Any = None) -> Any:
        root = opts.rootRank if opts is not None else 0
        self._check_root(root, "scatter")
        n = self.size()
        out = _flat(_one(output_tensors, "scatter"), "scatter output")
        m = out.numel()
        if self.rank() == root:
            ins = _one(input_tensors, "scatter")
            if len(ins) != n:
                raise ValueError(f"kolo: scatter needs {n} input tensors on the root, got {len(ins)}")
            for x in ins:
                _same(out, _real(x), "scatter input")
            send = torch.cat([_real(x).reshape(-1) for x in ins])
            splits = [m] * n
        else:
            # Empty, but with a real device address when on the GPU: every rank
            # passes the same kind of memory, and a NULL pointer reads as host.
            send = (torch.empty(1, dtype=out.dtype, device=out.device)[:0] if out.is_cuda
                    else torch.empty(0, dtype=out.dtype))
            splits = [0] * n
        recv = [m if r == root else 0 for r in range(n)]
        launch, received = self._alltoall(send, splits, recv, out, "scatter")

        def finish(results: list) -> None:
            flat = received(results)
            if flat.data_ptr() != out.data_ptr():
                out.copy_(flat)

        return self._issue("scatter", output_tensors, launch, finish)

    def barrier(self, opts: Any = None) -> Any:
        return self._issue("barrier", [], lambda n: [kolo.barrier_async()])

    def send(self, tensors: List[torch.Tensor], dst: int, tag: int = 0) -> Any:
        raise RuntimeError("kolo: send/isend is not supported: kolo has collectives only, no "
                           "point-to-point operations (use a gloo group for them: "
                           "dist.new_group(backend='gloo'))")

    def recv(self, tensors: List[torch.Tensor], src: int, tag: int = 0) -> Any:
        raise RuntimeError("kolo: recv/irecv is not supported: kolo has collectives only, no "
                           "point-to-point operations (use a gloo group for them: "
                           "dist.new_group(backend='gloo'))")

    def recv_anysource(self, tensors: List[torch.Tensor], tag: int = 0) -> Any:
        return self.recv(tensors, -1, tag)


def _again(exc: BaseException, what: str) -> BaseException:
    """A new exception of exc's class (kolo errors keep status and name)."""
    if isinstance(exc, kolo.Error):
        return type(exc)(exc.status, exc.name, f"{what}: {exc.message}")
    return RuntimeError(f"kolo: {what}: {exc}")


# ---- the store --------------------------------------------------------------

_KV_KEY = re.compile(r"[A-Za-z0-9._:/-]+")


class _RendezvousKV:
    """The rendezvous server's KV store (docs/rendezvous.md), for KoloStore."""

    def __init__(self, url: str, job: str, token: str):
        self.url = url.rstrip("/")
        self.job = job
        self.token = token

    @classmethod
    def from_env(cls) -> Optional["_RendezvousKV"]:
        url = os.environ.get("KOLO_RENDEZVOUS")
        if not url:
            return None
        token = os.environ.get("KOLO_TOKEN", "")
        if not token and os.environ.get("KOLO_TOKEN_FILE"):
            with open(os.environ["KOLO_TOKEN_FILE"], encoding="utf-8") as f:
                token = f.read().strip()
        return cls(url, os.environ.get("KOLO_JOB") or "default", token)

    def _request(self, method: str, key: str, data: Optional[bytes], query: str,
                 timeout_s: float) -> tuple:
        path = f"{self.url}/v1/jobs/{urllib.parse.quote(self.job, safe='')}/kv/" \
               f"{urllib.parse.quote(key, safe='/:')}{query}"
        req = urllib.request.Request(path, data=data, method=method)
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        if data is not None:
            req.add_header("Content-Type", "application/octet-stream")
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def put(self, key: str, value: bytes) -> None:
        code, body = self._request("PUT", key, value, "", 30.0)
        if code not in (200, 204):
            raise RuntimeError(f"kolo: store set {key!r}: rendezvous answered {code}: "
                               f"{body[:200].decode(errors='replace')}")

    def get(self, key: str, timeout_s: float) -> bytes:
        deadline = time.monotonic() + timeout_s
        while True:
            left = max(0.0, deadline - time.monotonic())
            slice_ms = int(min(left, 30.0) * 1000)
            code, body = self._request("GET", key, None, f"?timeout_ms={slice_ms}",
                                       slice_ms / 1000 + 10)
            if code == 200:
                return body
            if code != 404:
                raise RuntimeError(f"kolo: store get {key!r}: rendezvous answered {code}: "
                                   f"{body[:200].decode(errors='replace')}")
            if time.monotonic() >= deadline:
                raise RuntimeError(f"kolo: store key {key!r} was not set within {timeout_s:.0f} s")


class KoloStore(dist.Store):
    """The store of a ``kolo://`` group.

    ``add(key, n)`` with n != 0 is a collective: every rank calls it once for
    a key (as torch's store-based barrier does) and gets the sum over the
    ranks (a kolo allreduce); ``add(key, 0)`` returns that sum. ``set``,
    ``get`` and ``wait`` use the rendezvous server's KV store (keys scoped to
    the membership round), so torch code that exchanges bytes through the
    store (a gloo group made with ``new_group(backend="gloo")``) works.
    Other methods raise."""

    def __init__(self) -> None:
        super().__init__()
        self._counts: dict = {}
        self._kv = _RendezvousKV.from_env()
        self._round = kolo.round() if kolo.is_initialized() else 0

    def _seconds(self) -> float:
        try:
            return _timeout_s(self.timeout)
        except Exception:  # noqa: BLE001 - an older torch without the property
            return 300.0

    def add(self, key: str, value: int) -> int:
        if value == 0:
            return self._counts.get(key, 0)
        x = torch.tensor([int(value)], dtype=torch.int64)
        h = kolo.allreduce_async(x, name=f"c10d.store.{key}", op="sum")
        _wait_bounded(h, self._seconds(), f"the store add of {key!r} (a collective under kolo://)")
        self._counts[key] = self._counts.get(key, 0) + int(x.item())
        return self._counts[key]

    def _kv_key(self, key: str) -> str:
        k = f"c10d/r{self._round}/{key}"
        if len(k) <= 127 and _KV_KEY.fullmatch(k) and "//" not in k:
            return k
        return f"c10d/r{self._round}/h/{hashlib.sha256(key.encode()).hexdigest()[:64]}"

    def _need_kv(self, what: str) -> _RendezvousKV:
        if self._kv is None:
            raise RuntimeError(f"kolo: store {what} needs the rendezvous server's KV store, and "
                               f"this process has none (KOLO_RENDEZVOUS is not set: a job of "
                               f"one worker)")
        return self._kv

    def set(self, key: str, value: Any) -> None:
        data = value.encode() if isinstance(value, str) else bytes(value)
        self._need_kv("set").put(self._kv_key(key), data)

    def get(self, key: str) -> bytes:
        return self._need_kv("get").get(self._kv_key(key), self._seconds())

    def wait(self, keys: List[str], timeout: Any = None) -> None:
        t = self._seconds() if timeout is None else _timeout_s(timeout)
        kv = self._need_kv("wait")
        deadline = time.monotonic() + t
        for k in keys:
            kv.get(self._kv_key(k), max(0.0, deadline - time.monotonic()))

    def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
        raise RuntimeError("kolo: KoloStore has no compare_set (set, get, wait and the "
                           "collective add only)")


# ---- joining: kolo:// and env:// ---------------------------------------------


def _join_kolo(timeout: Any) -> None:
    """kolo.init() for kolo://, after checking the launcher and setting
    KOLO_TIMEOUT_MS from torch's timeout (unless the user set it)."""
    if kolo.is_initialized():
        return
    if not os.environ.get("KOLO_RENDEZVOUS") and int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
        raise RuntimeError(
            "kolo: init_method='kolo://' joins kolo's rendezvous (run under kolorun, or set "
            "KOLO_RENDEZVOUS), but this process was started by torchrun or another launcher "
            f"(WORLD_SIZE={os.environ.get('WORLD_SIZE')}): use init_process_group('kolo') "
            "(env://) there")
    ms = _kolo_timeout_ms(timeout)
    if ms and not os.environ.get("KOLO_TIMEOUT_MS") and not os.environ.get(
            "HOROVOD_GLOO_TIMEOUT_SECONDS"):
        os.environ["KOLO_TIMEOUT_MS"] = str(ms)
    kolo.init()


def _rendezvous(url: str, timeout: Any = _DEFAULT_TIMEOUT, **kwargs: Any):
    """The ``kolo://`` rendezvous handler: yields (KoloStore, rank, size)."""
    query = urllib.parse.parse_qs(urllib.parse.urlparse(url).query)
    want_rank = int(query.get("rank", ["-1"])[0])
    want_size = int(query.get("world_size", ["-1"])[0])
    _join_kolo(timeout)
    rank, size = kolo.rank(), kolo.size()
    if want_rank not in (-1, rank) or want_size not in (-1, size):
        raise ValueError(f"kolo: init_process_group(rank={want_rank}, world_size={want_size}) but "
                         f"kolo's rendezvous made this process rank {rank} of {size}; leave rank "
                         f"and world_size out with kolo://")
    store = KoloStore()
    with _lock:
        _stores.append(store)
    yield store, rank, size
    raise RuntimeError("kolo: kolo:// cannot rendezvous again; in an elastic job call "
                       "kolo.reform(), then init_process_group again (see elastic_run)")


class _Bootstrap:
    """The comm this module bootstrapped through a c10d store (env://)."""

    def __init__(self, store: Any, rank: int, size: int, prefix: str, timeout: Any):
        self.store = store
        self.rank = rank
        self.size = size
        self.prefix = prefix
        self.timeout = timeout


_boot: Optional[_Bootstrap] = None
_boot_count = 0
_exit_hook = False

FINALIZE_BARRIER_S = 60.0  # longest wait for the other ranks before finalizing


def _bootstrap(store: Any, rank: int, size: int, timeout: Any) -> None:
    """Connects kolo's data plane through the c10d store (every rank)."""
    global _boot, _boot_count, _exit_hook
    prefix = f"kolo/bootstrap/{_boot_count}"
    _boot_count += 1
    if rank == 0:
        store.set(f"{prefix}/secret", json.dumps({"job": "torch-" + secrets.token_hex(8),
                                                  "token": secrets.token_hex(32)}))
    secret = json.loads(bytes(store.get(f"{prefix}/secret")).decode())
    calls = itertools.count()

    def allgather(data: bytes) -> list:
        i = next(calls)
        store.set(f"{prefix}/allgather{i}/{rank}", data)
        return [bytes(store.get(f"{prefix}/allgather{i}/{r}")) for r in range(size)]

    ptr, _ = kolo.bootstrap_connect(rank, size, allgather, job=secret["job"],
                                    token=secret["token"],
                                    route_to=os.environ.get("MASTER_ADDR", ""),
                                    timeout_ms=_kolo_timeout_ms(timeout))
    kolo.adopt(ptr)
    _boot = _Bootstrap(store, rank, size, prefix, timeout)
    if not _exit_hook:
        _exit_hook = True
        atexit.register(_finish_bootstrap)  # runs before kolo's own atexit finalize


def _store_barrier(b: _Bootstrap, deadline_s: float) -> bool:
    key = f"{b.prefix}/finalize"
    b.store.add(key, 1)
    end = time.monotonic() + deadline_s
    while b.store.add(key, 0) < b.size:
        if time.monotonic() > end:
            return False
        time.sleep(0.005)
    return True


def _finish_bootstrap() -> None:
    """Finalizes a bootstrapped comm: barrier through the store (unless an
    operation failed), then kolo.finalize(); kolo.abort() first when the
    barrier could not be completed or something failed."""
    global _boot
    b, _boot = _boot, None
    if b is None or not kolo.is_initialized():
        return
    limit = min(_timeout_s(b.timeout), FINALIZE_BARRIER_S)
    drained = all(pg._shutdown("destroyed", limit) for pg in list(_groups))
    failed = _failure_count > 0 or bool(getattr(kolo, "_failed", False)) or not drained
    ok = False
    if not failed:
        try:
            ok = _store_barrier(b, limit)
        except Exception as e:  # noqa: BLE001 - the store's host may be gone
            log.info("kolo: the finalize barrier through the store failed: %s", e)
    if not ok:
        kolo.abort()
    kolo.finalize()


# ---- the backend creator ----------------------------------------------------


def _subset_error(ranks: Sequence[int], size: int) -> ValueError:
    return ValueError(
        f"kolo: a process group of ranks {list(ranks)} of {size}: kolo has one communicator per "
        f"process, so a kolo group has every rank (new_group() or new_group(ranks=range(world)));"
        f" make subgroups with backend='gloo'")


def _create(opts: Any, pg_options: Any = None) -> ProcessGroupKolo:
    """Backend.register_backend's creator (extended API)."""
    if pg_options is not None:
        raise ValueError("kolo: process group options (pg_options) are not supported")
    ranks = list(opts.global_ranks_in_group)
    if not kolo.is_initialized():
        if ranks:
            raise RuntimeError("kolo: the default process group must use kolo before new_group")
        _bootstrap(opts.store, opts.group_rank, opts.group_size, opts.timeout)
    rank, size = kolo.rank(), kolo.size()
    if ranks and ranks != list(range(size)):
        raise _subset_error(ranks, size)
    if opts.group_size != size or opts.group_rank != rank:
        raise RuntimeError(f"kolo: torch made this process rank {opts.group_rank} of "
                           f"{opts.group_size}, but the kolo comm it joined says rank {rank} of "
                           f"{size}")
    pg = ProcessGroupKolo(rank, size, str(opts.group_id), opts.timeout)
    with _lock:
        _groups.append(pg)
        global _groups_hook
        if not _groups_hook:  # registered after kolo's own: runs before its finalize
            _groups_hook = True
            atexit.register(_stop_groups)
    return pg


_groups_hook = False


def _stop_groups() -> None:
    """At interpreter exit: lets the operations in flight complete and stops
    the completion threads, so that none runs Python code while the
    interpreter is finalized."""
    for pg in _kolo_groups():
        pg._shutdown("stopped at interpreter exit", min(_timeout_s(pg._timeout), 30.0))


def _kolo_groups() -> List[ProcessGroupKolo]:
    return [pg for pg in _groups if not pg._closed]


_orig_destroy = _c10d.destroy_process_group
_orig_new_group = _c10d.new_group


@functools.wraps(_orig_destroy)
def destroy_process_group(group: Optional[Any] = None) -> None:
    whole = group is None or group is _c10d.GroupMember.WORLD
    targets = [pg for pg in _kolo_groups() if whole or pg is group]
    _orig_destroy(group)
    for pg in targets:
        pg._shutdown("destroyed")
    if whole and _boot is not None:
        _finish_bootstrap()


@functools.wraps(_orig_new_group)
def new_group(ranks: Optional[Sequence[int]] = None, *args: Any, **kwargs: Any) -> Any:
    backend = kwargs.get("backend", args[1] if len(args) > 1 else None)
    if ranks is not None and _c10d.is_initialized():
        if backend is None:
            backend = _c10d.get_backend()
        n = _c10d.get_world_size()
        if str(backend).lower() == BACKEND and sorted(ranks) != list(range(n)):
            raise _subset_error(sorted(ranks), n)
    return _orig_new_group(ranks, *args, **kwargs)


def _register() -> None:
    if BACKEND.upper() not in dist.Backend._plugins:
        if "devices" in inspect.signature(dist.Backend.register_backend).parameters:
            dist.Backend.register_backend(BACKEND, _create, extended_api=True,
                                          devices=["cpu", "cuda"])
        else:  # torch < 2.2
            dist.Backend.register_backend(BACKEND, _create, extended_api=True)
    import torch.distributed.rendezvous  # noqa: F401 - the module, not dist.rendezvous()
    handlers = sys.modules["torch.distributed.rendezvous"]._rendezvous_handlers
    if SCHEME not in handlers:
        dist.register_rendezvous_handler(SCHEME, _rendezvous)
    _functional.register()
    for mod in (_c10d, dist):
        if getattr(mod, "destroy_process_group", None) is _orig_destroy:
            mod.destroy_process_group = destroy_process_group
        if getattr(mod, "new_group", None) is _orig_new_group:
            mod.new_group = new_group


_register()


def init(timeout: Any = _DEFAULT_TIMEOUT) -> None:
    """``init_process_group("kolo", init_method="kolo://")`` unless a default
    group exists. Every worker of a kolorun job calls it."""
    if not dist.is_initialized():
        dist.init_process_group(BACKEND, init_method=f"{SCHEME}://", timeout=timeout)


# ---- elastic DDP --------------------------------------------------------------


class _Reform(Exception):
    """A join or leave was announced at a commit point: re-form, no restore."""


class ElasticState:
    """What an elastic DDP job keeps across membership changes: the plain
    ``model`` (not DDP-wrapped), its ``optimizer`` and picklable attributes
    given as keywords (``step=0, epoch=0``, read and set as attributes).

    ``ddp`` is the DistributedDataParallel wrapper of ``model``, rebuilt by
    :func:`elastic_run` on every (re)start with ``ddp_kwargs``. Every worker
    builds the same state; after a re-form rank 0's copy wins."""

    def __init__(self, model: torch.nn.Module, optimizer: Optional[torch.optim.Optimizer] = None,
                 ddp_kwargs: Optional[dict] = None, **attrs: Any):
        d = self.__dict__
        d["model"] = model
        d["optimizer"] = optimizer
        d["ddp_kwargs"] = dict(ddp_kwargs or {})
        d["ddp"] = None
        d["_attrs"] = dict(attrs)
        d["_saved"] = None
        d["_commit"] = None

    def __getattr__(self, name: str) -> Any:
        attrs = self.__dict__.get("_attrs", {})
        if name in attrs:
            return attrs[name]
        raise AttributeError(f"ElasticState has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self.__dict__["_attrs"]:
            self.__dict__["_attrs"][name] = value
        else:
            self.__dict__[name] = value

    def save(self) -> None:
        """Copies the state in memory (local; no communication)."""
        opt = self.optimizer.state_dict() if self.optimizer is not None else None
        self.__dict__["_saved"] = (copy.deepcopy(self.model.state_dict()), copy.deepcopy(opt),
                                   copy.deepcopy(self._attrs))

    def restore(self) -> None:
        """Goes back to the last :meth:`save`/:meth:`commit` (local)."""
        if self._saved is None:
            return
        model, opt, attrs = self._saved
        with torch.no_grad():
            self.model.load_state_dict(model)
        if self.optimizer is not None and opt is not None:
            self.optimizer.load_state_dict(opt)
        self.model.zero_grad(set_to_none=True)
        self.__dict__["_attrs"] = copy.deepcopy(attrs)

    def commit(self) -> None:
        """A commit point; every rank calls it at the same step. Saves the
        state, then (elastic jobs) agrees with the others whether a worker
        joins or leaves, and if so raises to re-form (caught by
        :func:`elastic_run`; the saved state is kept, nothing is lost)."""
        self.save()
        if not kolo.elastic_enabled():
            return
        if self._commit is None:
            self.__dict__["_commit"] = kolo.Commit()
        if self._commit.check():
            raise _Reform()

    def sync(self) -> None:
        """Makes every rank hold rank 0's state and wraps the model in a new
        DDP (whose construction broadcasts rank 0's parameters and buffers).
        Every rank of the (new) default group calls it; elastic_run does."""
        objs = [self._attrs, self.optimizer.state_dict() if self.optimizer is not None else None]
        dist.broadcast_object_list(objs, src=0)
        if dist.get_rank() != 0:
            self.__dict__["_attrs"] = objs[0]
            if self.optimizer is not None and objs[1] is not None:
                self.optimizer.load_state_dict(objs[1])
        self.model.zero_grad(set_to_none=True)
        self.__dict__["ddp"] = torch.nn.parallel.DistributedDataParallel(self.model,
                                                                         **self.ddp_kwargs)
        self.save()

    def _drop_ddp(self) -> None:
        self.__dict__["ddp"] = None


def _membership_failure(exc: BaseException, mark: int) -> bool:
    if isinstance(exc, kolo.MembershipError):
        return True
    return _failure_count > mark and isinstance(_last_failure, kolo.MembershipError)


def _teardown() -> None:
    groups = _kolo_groups()
    if dist.is_initialized():
        destroy_process_group()
    for pg in groups:
        pg._shutdown("destroyed for a re-form", 30.0)
    gc.collect()  # the old DDP's reducer (and its autograd hooks) must go now


def elastic_run(train: Callable[..., Any], state: ElasticState, *args: Any,
                timeout: Any = _DEFAULT_TIMEOUT, **kwargs: Any) -> Any:
    """Runs ``train(state, *args, **kwargs)`` on a DDP model that survives
    membership changes (``kolorun --min-np A --max-np B``). Every worker calls
    it; a worker added later calls it too and starts from rank 0's state.

    Before each (re)start it makes the default group (kolo://), broadcasts
    rank 0's optimizer state and attributes and re-wraps ``state.model`` in
    DDP (``state.ddp``). When a collective fails because a peer died or
    hung (kolo.MembershipError, directly or as the RuntimeError of a DDP
    step), it restores the last commit; when a join or leave is announced at
    ``state.commit()``, it keeps the state. Either way it destroys the group,
    re-forms kolo's comm in place (``kolo.reform()``: the survivors are not
    restarted), and starts again. ``train`` must use ``dist.get_rank()`` and
    ``dist.get_world_size()`` afresh on every call, and commit at points every
    rank reaches together. ``KOLO_ELASTIC_RESET_LIMIT`` bounds the re-forms.

    Returns what ``train`` returns, or None on a worker that left the job
    (SIGTERM; it should then exit 0). Other exceptions propagate."""
    limit = int(os.environ.get("KOLO_ELASTIC_RESET_LIMIT", "0") or 0)
    resets = 0
    since: Optional[tuple] = None  # (monotonic time, why) of the last re-form's cause
    while True:
        restore = True
        mark = _failure_count
        try:
            init(timeout)
            state.sync()
            if since is not None:
                (log.warning if since[1] == "failure" else log.info)(
                    "kolo: elastic DDP: training again as rank %d of %d, %.0f ms after the %s",
                    dist.get_rank(), dist.get_world_size(), 1000 * (time.monotonic() - since[0]),
                    since[1])
                since = None
            result = train(state, *args, **kwargs)
            kolo.elastic_done()
            return result
        except _Reform:
            restore = False
            log.info("kolo: elastic DDP: a worker joins or leaves; re-forming")
        except kolo.ShutdownError:
            if state._commit is not None and state._commit.left():
                return None
            raise
        except Exception as e:  # noqa: BLE001 - classified, re-raised unless a membership change
            if not (_membership_failure(e, mark) and kolo.is_initialized()
                    and kolo.elastic_enabled()):
                raise
            log.warning("kolo: elastic DDP: %s; restoring the last commit and re-forming",
                        str(e).splitlines()[0])
            del e  # its traceback holds the old DDP and the step's tensors
        if limit and resets >= limit:
            raise RuntimeError(f"kolo: elastic DDP re-formed {resets} times "
                               f"(KOLO_ELASTIC_RESET_LIMIT={limit})")
        if since is None:
            since = (time.monotonic(), "failure" if restore else "membership change")
        state._drop_ddp()
        _teardown()
        if restore:
            state.restore()
        try:
            kolo.reform()
        except kolo.ShutdownError:
            if state._commit is not None and state._commit.left():
                return None
            raise
        resets += 1


__all__ = ["BACKEND", "KoloStore", "ProcessGroupKolo", "ElasticState", "elastic_run", "init",
           "destroy_process_group", "new_group"]
