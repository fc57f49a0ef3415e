"""Horovod's collectives (``horovod.torch.mpi_ops``) on kolo.

Every function keeps Horovod 0.28's name, arguments and semantics:

- ``x(...)`` is blocking and differentiable (a ``torch.autograd.Function``),
  ``x_async(...)`` returns an int handle for :func:`poll` and
  :func:`synchronize`, and the in-place forms ``x_(...)``/``x_async_(...)``
  write into their argument.
- Operations are matched across ranks by name. An unnamed operation is named
  ``"<kind>.noname.<n>"`` from a per-kind counter, so unnamed operations must
  be issued in the same order on every rank. A mismatch (shape, dtype, op,
  root) fails the operation on every rank with :class:`kolo.MismatchError`
  naming the ranks; a name that some rank never submits is a stall (see
  ``KOLO_STALL_SHUTDOWN_SECONDS``).
- Tensors are CPU or CUDA tensors (CUDA with a libkolo that has the device
  data path, :func:`cuda_built`) of float16, bfloat16, float32, float64,
  int8, uint8, int32 or int64, and bool where the operation is defined for
  it (broadcast, allgather, alltoall, Min and Max). kolo's work on a CUDA
  tensor is ordered after what torch's current stream held when it was
  issued; outputs (allgather, alltoall, reducescatter) are made on the
  input's device. A non-contiguous tensor is a ``ValueError``; another
  dtype, a sparse tensor or one on another device type a ``TypeError``;
  both raised before anything is enqueued.

Process sets (``process_set=``) and ``op=Adasum`` work as in Horovod
(docs/process-sets.md, docs/collectives.md). What it adds: bfloat16, ``Compression.bf16``,
Min/Max/Product for reducescatter. Failures of the job raise ``kolo`` errors:
:class:`kolo.MembershipError` (Horovod's ``HorovodInternalError``),
:class:`kolo.MismatchError`, :class:`kolo.ShutdownError`.
"""

from __future__ import annotations

import collections.abc
import math
from typing import Any, Callable, List, Optional, Sequence

import torch

import kolo
# Lifecycle, topology, ops and handles are kolo.common's, re-exported here.
from kolo.common.basics import (  # noqa: F401
    Adasum, Average, Max, Min, Product, ProcessSet, Sum, add_process_set, ccl_built,
    cross_rank, cross_size, cuda_built, ddl_built, gloo_built, gloo_enabled, global_process_set,
    init, is_homogeneous, is_initialized, local_rank, local_size, mpi_built, mpi_enabled,
    mpi_threads_supported, nccl_built, rank, remove_process_set, rocm_built, shutdown, size,
    start_timeline, stop_timeline)
from kolo.common.basics import process_set_comm as _ps
from kolo.common.basics import kolo_op as _kolo_op
from kolo.common.basics import op_from as _op_from
from kolo.common.handles import Op as _Op
from kolo.common.handles import clear as _clear_handles  # noqa: F401
from kolo.common.handles import poll, register as _register, synchronize  # noqa: F401
from kolo.common import basics as _basics
from kolo.common.util import alltoall_meta, gathered_shapes, split_rows
from kolo.common.util import label as _label, mismatch as _mismatch
from kolo.common.util import op_name as _name, root as _root, set_root  # noqa: F401

from .compression import Compression

# ---- argument checks -------------------------------------------------------


def _rank(comm: Optional[kolo.Comm]) -> int:
    """This rank in ``comm`` (a process set's, or None: the job's)."""
    return comm.rank() if comm is not None else kolo.rank()


def _size(comm: Optional[kolo.Comm]) -> int:
    return comm.size() if comm is not None else kolo.size()




def _check(tensor: Any, what: str, reduce: Optional[str] = None) -> kolo.Buffer:
    """kolo's checks (CPU or CUDA, dense, supported dtype, contiguous) on a
    torch tensor; the message names ``what``."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"kolo: {what} must be a torch.Tensor, not {type(tensor).__name__}")
    return kolo.buffer(tensor, what, reduce=reduce)


def _check_rows(tensor: torch.Tensor, what: str, kind: str) -> None:
    if tensor.dim() == 0:
        raise ValueError(f"kolo: {what} is a scalar (0-d); {kind} works along dimension 0 "
                         f"(pass tensor.reshape(1))")


def _check_tensors(tensors: Any, kind: str, name: Optional[str],
                   reduce: Optional[str] = None) -> List[torch.Tensor]:
    if isinstance(tensors, torch.Tensor) or not isinstance(tensors, collections.abc.Iterable):
        raise TypeError(f"kolo: {kind} takes a list of tensors, not {type(tensors).__name__}")
    tensors = list(tensors)
    if not tensors:
        raise ValueError(f"kolo: {kind} of an empty list of tensors")
    for i, t in enumerate(tensors):
        _check(t, _label(kind, name, i), reduce)
    return tensors


def _contiguous_like(tensor: torch.Tensor, shape: Optional[Sequence[int]] = None) -> torch.Tensor:
    if shape is None:
        return torch.empty_like(tensor, memory_format=torch.contiguous_format)
    return torch.empty(tuple(shape), dtype=tensor.dtype, device=tensor.device)


# ---- allreduce -------------------------------------------------------------


def _allreduce_async(tensor: torch.Tensor, output: torch.Tensor, name: Optional[str], op: int,
                     prescale_factor: float, postscale_factor: float, process_set: Any) -> int:
    comm = _ps(process_set, "allreduce")
    kop = _kolo_op(op)
    _check(tensor, _label("allreduce", name), reduce=kop)
    if output is None:
        output = _contiguous_like(tensor)
    h = kolo.allreduce_async(tensor, None if output is tensor else output, name=name or None,
                             op=kop, prescale=prescale_factor, postscale=postscale_factor,
                             comm=comm)
    return _register(_Op([h], lambda res: output, (tensor, output)))


def allreduce_async(tensor: torch.Tensor, average: Optional[bool] = None,
                    name: Optional[str] = None, op: Optional[int] = None,
                    prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                    process_set: ProcessSet = global_process_set) -> int:
    """Starts reducing ``tensor`` over every rank into a new tensor (the
    input is not modified); returns a handle whose :func:`synchronize`
    gives the result. Every rank calls it with the same name, shape, dtype,
    op and factors. ``op`` is Average (the default), Sum, Min, Max or
    Product; the result is ``postscale * op(prescale * tensor_r)``.
    ``average`` is Horovod's deprecated spelling of op."""
    return _allreduce_async(tensor, None, name, _op_from(op, average), prescale_factor,
                            postscale_factor, process_set)


def allreduce_async_(tensor: torch.Tensor, average: Optional[bool] = None,
                     name: Optional[str] = None, op: Optional[int] = None,
                     prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                     process_set: ProcessSet = global_process_set) -> int:
    """As :func:`allreduce_async`, in place: ``tensor`` receives the result
    and must not be touched until the handle is synchronized."""
    return _allreduce_async(tensor, tensor, name, _op_from(op, average), prescale_factor,
                            postscale_factor, process_set)


def allreduce_(tensor: torch.Tensor, average: Optional[bool] = None, name: Optional[str] = None,
               op: Optional[int] = None, prescale_factor: float = 1.0,
               postscale_factor: float = 1.0,
               process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Reduces ``tensor`` in place over every rank and returns it (blocking;
    not differentiable)."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                        postscale_factor, process_set))


class _Allreduce(torch.autograd.Function):
    """allreduce; the gradient is the allreduce of the output's gradient with
    the same op and factors (Horovod's rule)."""

    @staticmethod
    def forward(ctx, tensor, average, name, op, prescale_factor, postscale_factor, process_set):
        ctx.average, ctx.op = average, op
        ctx.prescale_factor, ctx.postscale_factor = prescale_factor, postscale_factor
        ctx.process_set = process_set
        return synchronize(allreduce_async(tensor, average, name, op, prescale_factor,
                                           postscale_factor, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        grad = allreduce(grad_output.contiguous(), average=ctx.average, op=ctx.op,
                         prescale_factor=ctx.prescale_factor,
                         postscale_factor=ctx.postscale_factor, process_set=ctx.process_set)
        return grad, None, None, None, None, None, None


def allreduce(tensor: torch.Tensor, average: Optional[bool] = None, name: Optional[str] = None,
              compression: Any = Compression.none, op: Optional[int] = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Reduces ``tensor`` over every rank and returns the result in a new
    tensor of the same shape and dtype (blocking). Every rank calls it with
    the same name, shape, dtype, op and factors. Differentiable: the gradient
    is the allreduce of the result's gradient with the same op. With
    ``compression`` the tensor travels compressed (Compression.fp16/bf16)."""
    compressed, cctx = compression.compress(tensor)
    out = _Allreduce.apply(compressed, average, name, op, prescale_factor, postscale_factor,
                           process_set)
    return compression.decompress(out, cctx)


def _grouped_allreduce_async(tensors: Any, in_place: bool, name: Optional[str], op: int,
                             prescale_factor: float, postscale_factor: float,
                             process_set: Any) -> int:
    comm = _ps(process_set, "grouped_allreduce")
    kop = _kolo_op(op)
    tensors = _check_tensors(tensors, "grouped_allreduce", name, reduce=kop)
    outputs = tensors if in_place else [_contiguous_like(t) for t in tensors]
    h = kolo.grouped_allreduce_async(tensors, None if in_place else outputs,
                                     name=name or None, op=kop, prescale=prescale_factor,
                                     postscale=postscale_factor, comm=comm)
    result = tuple(outputs)
    return _register(_Op([h], lambda res: result, (tensors, outputs)))


def grouped_allreduce_async(tensors: Sequence[torch.Tensor], average: Optional[bool] = None,
                            name: Optional[str] = None, op: Optional[int] = None,
                            prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                            process_set: ProcessSet = global_process_set) -> int:
    """Starts reducing a list of tensors of one dtype as one group
    (negotiated and fused together; members are named ``<name>.<i>``);
    :func:`synchronize` gives a tuple of new tensors."""
    return _grouped_allreduce_async(tensors, False, name, _op_from(op, average), prescale_factor,
                                    postscale_factor, process_set)


def grouped_allreduce_async_(tensors: Sequence[torch.Tensor], average: Optional[bool] = None,
                             name: Optional[str] = None, op: Optional[int] = None,
                             prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                             process_set: ProcessSet = global_process_set) -> int:
    """As :func:`grouped_allreduce_async`, in place."""
    return _grouped_allreduce_async(tensors, True, name, _op_from(op, average),
                                    prescale_factor, postscale_factor, process_set)


def grouped_allreduce_(tensors: Sequence[torch.Tensor], average: Optional[bool] = None,
                       name: Optional[str] = None, op: Optional[int] = None,
                       prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set: ProcessSet = global_process_set) -> tuple:
    """Reduces the tensors in place as one group; returns them (blocking)."""
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                postscale_factor, process_set))


class _GroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, average, name, op, prescale_factor, postscale_factor, process_set,
                *tensors):
        ctx.average, ctx.op = average, op
        ctx.prescale_factor, ctx.postscale_factor = prescale_factor, postscale_factor
        ctx.process_set = process_set
        return tuple(synchronize(grouped_allreduce_async(list(tensors), average, name, op,
                                                         prescale_factor, postscale_factor,
                                                         process_set)))

    @staticmethod
    def backward(ctx, *grad_output):
        grads = grouped_allreduce([g.contiguous() for g in grad_output], average=ctx.average,
                                  op=ctx.op, prescale_factor=ctx.prescale_factor,
                                  postscale_factor=ctx.postscale_factor,
                                  process_set=ctx.process_set)
        return (None,) * 6 + tuple(grads)


def grouped_allreduce(tensors: Sequence[torch.Tensor], average: Optional[bool] = None,
                      name: Optional[str] = None, compression: Any = Compression.none,
                      op: Optional[int] = None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0,
                      process_set: ProcessSet = global_process_set) -> List[torch.Tensor]:
    """Reduces a list of tensors as one group and returns a list of new
    tensors (blocking, differentiable)."""
    tensors = list(tensors)
    if not tensors:
        raise ValueError("kolo: grouped_allreduce of an empty list of tensors")
    pairs = [compression.compress(t) for t in tensors]
    outs = _GroupedAllreduce.apply(average, name, op, prescale_factor, postscale_factor,
                                   process_set, *[p[0] for p in pairs])
    return [compression.decompress(o, p[1]) for o, p in zip(outs, pairs)]


def sparse_allreduce_async(tensor: torch.Tensor, name: Optional[str], op: int,
                           process_set: ProcessSet = global_process_set) -> Callable[[], Any]:
    """Reduces a sparse COO tensor as Horovod does: allgathers the indices
    and values of every rank (so duplicate indices add up). Returns a
    callable that waits and gives the sparse result; Average divides the
    values by size(). Only Sum and Average are defined."""
    comm = _ps(process_set, "sparse_allreduce_async")
    kop = _kolo_op(op)
    if kop not in ("sum", "average"):
        raise ValueError(f"kolo: sparse_allreduce_async sums (op Sum or Average), not {kop}")
    if not isinstance(tensor, torch.Tensor) or not tensor.is_sparse:
        raise TypeError("kolo: sparse_allreduce_async takes a sparse COO torch tensor")
    indices = tensor._indices().transpose(0, 1).contiguous()
    values = tensor._values().contiguous()
    base = _name("sparse_allreduce", name, comm)
    h_values = allgather_async(values, name=f"{base}.values", process_set=process_set)
    h_indices = allgather_async(indices, name=f"{base}.indices", process_set=process_set)
    n, shape = _size(comm), tensor.size()

    def handle() -> torch.Tensor:
        vals = synchronize(h_values)
        idx = synchronize(h_indices)
        if kop == "average":
            vals = vals / n
        return torch.sparse_coo_tensor(idx.transpose(0, 1), vals, shape)

    return handle


# ---- allgather -------------------------------------------------------------


def _start_allgather(tensor: torch.Tensor, base: str, comm: Optional[kolo.Comm]) -> _Op:
    """Enqueues the allgather of ``tensor`` (checked) and of its shape; the
    op's result is ``(output, rows of each rank)``. The shapes let every
    rank check that only the first dimension differs."""
    shape = torch.tensor([tensor.dim(), *tensor.shape], dtype=torch.int64)
    h_shape = kolo.allgather_async(shape, lambda k: torch.empty(k, dtype=torch.int64),
                                   name=f"{base}#shape", comm=comm)
    h_data = kolo.allgather_async(
        tensor, lambda k: torch.empty(k, dtype=tensor.dtype, device=tensor.device), name=base,
        comm=comm)

    def finish(res):
        (shapes_flat, shape_counts), (flat, _counts) = res
        shapes = gathered_shapes(shapes_flat, shape_counts)
        if len({s[1:] for s in shapes}) != 1 or len({len(s) for s in shapes}) != 1:
            raise _mismatch(f"allgather {base}", shapes,
                            "only the first dimension may differ between ranks")
        rows = [s[0] for s in shapes]
        return flat.view(sum(rows), *shapes[0][1:]), rows

    return _Op([h_shape, h_data], finish, (tensor, shape))


def _allgather_op(tensor: torch.Tensor, name: Optional[str], process_set: Any,
                  kind: str = "allgather") -> _Op:
    comm = _ps(process_set, kind)
    what = _label(kind, name)
    _check(tensor, what)
    _check_rows(tensor, what, kind)
    return _start_allgather(tensor, _name(kind, name, comm), comm)


def allgather_async(tensor: torch.Tensor, name: Optional[str] = None,
                    process_set: ProcessSet = global_process_set) -> int:
    """Starts concatenating every rank's ``tensor`` along dimension 0, in
    rank order; the first dimension may differ between ranks, the others
    must match. :func:`synchronize` gives the new tensor."""
    return _register(_allgather_op(tensor, name, process_set).then(lambda r: r[0]))


class _Allgather(torch.autograd.Function):
    """allgather; the gradient is the average over ranks of the output's
    gradient, narrowed to this rank's rows (Horovod's rule)."""

    @staticmethod
    def forward(ctx, tensor, name, process_set):
        out, rows = _allgather_op(tensor, name, process_set).wait()
        r = _rank(_ps(process_set, "allgather"))
        ctx.offset, ctx.rows, ctx.process_set = sum(rows[:r]), rows[r], process_set
        return out

    @staticmethod
    def backward(ctx, grad_output):
        grad = allreduce(grad_output.contiguous(), op=Average, process_set=ctx.process_set)
        return grad.narrow(0, ctx.offset, ctx.rows), None, None


def allgather(tensor: torch.Tensor, name: Optional[str] = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Concatenates every rank's ``tensor`` along dimension 0 in rank order
    and returns the new tensor (blocking, differentiable). Every rank calls
    it with the same name and dtype; shapes may differ in dimension 0 only."""
    return _Allgather.apply(tensor, name, process_set)


def _grouped_allgather_op(tensors: Any, name: Optional[str], process_set: Any) -> _Op:
    comm = _ps(process_set, "grouped_allgather")
    tensors = _check_tensors(tensors, "grouped_allgather", name)
    for i, t in enumerate(tensors):
        _check_rows(t, _label("grouped_allgather", name, i), "grouped_allgather")
    base = _name("grouped_allgather", name, comm)
    parts = [_start_allgather(t, f"{base}.{i}", comm) for i, t in enumerate(tensors)]
    bounds, at = [], 0
    for p in parts:
        bounds.append((at, at + len(p.handles)))
        at += len(p.handles)

    def finish(res):
        return [p.finish(res[a:b]) for p, (a, b) in zip(parts, bounds)]

    return _Op([h for p in parts for h in p.handles], finish, tuple(tensors))


def grouped_allgather_async(tensors: Sequence[torch.Tensor], name: Optional[str] = None,
                            process_set: ProcessSet = global_process_set) -> int:
    """Starts allgathering each tensor of a list (members named
    ``<name>.<i>``); :func:`synchronize` gives a tuple of new tensors."""
    return _register(_grouped_allgather_op(tensors, name, process_set)
                     .then(lambda rs: tuple(r[0] for r in rs)))


class _GroupedAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, process_set, *tensors):
        results = _grouped_allgather_op(list(tensors), name, process_set).wait()
        r = _rank(_ps(process_set, "grouped_allgather"))
        ctx.spans = [(sum(rows[:r]), rows[r]) for _, rows in results]
        ctx.process_set = process_set
        return tuple(out for out, _ in results)

    @staticmethod
    def backward(ctx, *grad_output):
        grads = grouped_allreduce([g.contiguous() for g in grad_output], op=Average,
                                  process_set=ctx.process_set)
        return (None, None) + tuple(g.narrow(0, off, n) for g, (off, n) in zip(grads, ctx.spans))


def grouped_allgather(tensors: Sequence[torch.Tensor], name: Optional[str] = None,
                      process_set: ProcessSet = global_process_set) -> List[torch.Tensor]:
    """Allgathers each tensor of a list; returns a list of new tensors
    (blocking, differentiable)."""
    tensors = list(tensors)
    if not tensors:
        raise ValueError("kolo: grouped_allgather of an empty list of tensors")
    return list(_GroupedAllgather.apply(name, process_set, *tensors))


# ---- broadcast -------------------------------------------------------------


def _broadcast_async(tensor: torch.Tensor, output: Optional[torch.Tensor], root_rank: Any,
                     name: Optional[str], process_set: Any) -> int:
    comm = _ps(process_set, "broadcast")
    _check(tensor, _label("broadcast", name))
    root = set_root(root_rank, comm, "broadcast")
    if output is None:
        if _rank(comm) == root:
            with torch.no_grad():
                output = tensor.clone(memory_format=torch.contiguous_format)
        else:
            output = _contiguous_like(tensor)
    h = kolo.broadcast_async(output, root, name=name or None, comm=comm)
    return _register(_Op([h], lambda res: output, (tensor, output)))


def broadcast_async(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
                    process_set: ProcessSet = global_process_set) -> int:
    """Starts copying rank ``root_rank``'s ``tensor`` to every rank, into a
    new tensor (the input is not modified). Every rank calls it with the
    same name, shape, dtype and root. :func:`synchronize` gives the result."""
    return _broadcast_async(tensor, None, root_rank, name, process_set)


def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
                     process_set: ProcessSet = global_process_set) -> int:
    """As :func:`broadcast_async`, in place: ``tensor`` receives the root's
    value."""
    return _broadcast_async(tensor, tensor, root_rank, name, process_set)


def broadcast_(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
               process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Copies the root's ``tensor`` into ``tensor`` on every rank and returns
    it (blocking; not differentiable)."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


class _Broadcast(torch.autograd.Function):
    """broadcast; the gradient is the average over ranks of the output's
    gradient on the root and zero elsewhere (Horovod's rule)."""

    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return synchronize(broadcast_async(tensor, root_rank, name, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        grad = allreduce(grad_output.contiguous(), op=Average, process_set=ctx.process_set)
        if kolo.rank() != ctx.root_rank:  # root_rank is a rank of the job
            grad = torch.zeros_like(grad)
        return grad, None, None, None


def broadcast(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Returns rank ``root_rank``'s ``tensor`` on every rank, in a new tensor
    (blocking, differentiable)."""
    return _Broadcast.apply(tensor, root_rank, name, process_set)


# ---- alltoall --------------------------------------------------------------


def _split_rows(splits: Any, n: int, rows: int) -> List[int]:
    if isinstance(splits, torch.Tensor):
        if splits.dtype.is_floating_point or splits.dtype.is_complex or splits.dim() > 1:
            raise TypeError(f"kolo: alltoall splits must be a 1-d integer tensor or a list of "
                            f"ints, not a {splits.dtype} tensor of shape {tuple(splits.shape)}")
    return split_rows(splits, n, rows, "alltoall")


def _alltoall_op(tensor: torch.Tensor, splits: Any, name: Optional[str],
                 process_set: Any) -> _Op:
    """The op's result is ``(output, rows received from each rank)``."""
    comm = _ps(process_set, "alltoall")
    what = _label("alltoall", name)
    _check(tensor, what)
    _check_rows(tensor, what, "alltoall")
    n = _size(comm)
    d0, trailing = tensor.shape[0], tuple(tensor.shape[1:])
    if splits is None:
        if d0 % n:
            raise ValueError(f"kolo: {what} has {d0} rows, which do not split equally over "
                             f"{n} ranks; pass splits")
        rows = [d0 // n] * n
    else:
        rows = _split_rows(splits, n, d0)
    base = _name("alltoall", name, comm)
    row = math.prod(trailing)
    send = tensor if sum(rows) == d0 else tensor.narrow(0, 0, sum(rows))
    # To each rank: the rows it gets and this rank's trailing shape (checked
    # to match on every rank).
    meta = torch.tensor([x for j in range(n) for x in (rows[j], len(trailing), *trailing)],
                        dtype=torch.int64)
    h_meta = kolo.alltoall_async(meta, lambda k: torch.empty(k, dtype=torch.int64),
                                 name=f"{base}#splits", comm=comm)
    h_data = kolo.alltoall_async(
        send, lambda k: torch.empty(k, dtype=tensor.dtype, device=tensor.device),
        splits=[x * row for x in rows], name=base, comm=comm)

    def finish(res):
        (meta_in, meta_counts), (flat, _counts) = res
        recv, shapes = alltoall_meta(meta_in, meta_counts)
        if len(set(shapes)) != 1:
            raise _mismatch(f"alltoall {base}", [(None,) + s for s in shapes],
                            "only the first dimension may differ between ranks")
        return flat.view(sum(recv), *trailing), recv

    return _Op([h_meta, h_data], finish, (tensor, send, meta))


def alltoall_async(tensor: torch.Tensor, splits: Any = None, name: Optional[str] = None,
                   process_set: ProcessSet = global_process_set) -> int:
    """Starts an alltoall: rank r sends ``splits[j]`` rows of ``tensor``
    (dimension 0, in order) to rank j (None: equal parts) and receives the
    rows every rank sends it, in rank order. :func:`synchronize` gives
    ``(output, received_splits)``: received_splits[i] is the rows from rank i
    (int32, or the dtype of a ``splits`` tensor)."""
    sdtype = splits.dtype if isinstance(splits, torch.Tensor) else torch.int32

    def result(r):
        out, recv = r
        return out, torch.tensor(recv, dtype=sdtype)

    return _register(_alltoall_op(tensor, splits, name, process_set).then(result))


class _Alltoall(torch.autograd.Function):
    """alltoall; the gradient goes back the way the rows came (an alltoall
    with the received splits); rows that were not sent get zero."""

    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        output, received = synchronize(alltoall_async(tensor, splits, name, process_set))
        ctx.received, ctx.rows, ctx.process_set = received, tensor.shape[0], process_set
        if splits is None:
            return output
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx, grad_output, *unused):
        grad, _ = alltoall(grad_output.contiguous(), splits=ctx.received,
                           process_set=ctx.process_set)
        if grad.shape[0] < ctx.rows:
            pad = grad.new_zeros((ctx.rows - grad.shape[0],) + tuple(grad.shape[1:]))
            grad = torch.cat([grad, pad])
        return grad, None, None, None


def alltoall(tensor: torch.Tensor, splits: Any = None, name: Optional[str] = None,
             process_set: ProcessSet = global_process_set) -> Any:
    """Sends ``splits[j]`` rows of ``tensor`` to rank j and returns the rows
    received from every rank, concatenated in rank order (blocking,
    differentiable). With ``splits`` the result is ``(output,
    received_splits)``, else ``output``; splits default to equal parts."""
    return _Alltoall.apply(tensor, splits, name, process_set)


# ---- reducescatter ---------------------------------------------------------


def _reducescatter_op(tensor: torch.Tensor, name: Optional[str], op: int, process_set: Any,
                      prescale_factor: float, postscale_factor: float,
                      kind: str = "reducescatter", base: Optional[str] = None) -> _Op:
    """Checks and enqueues; ``base`` set means already checked and named."""
    kop = _kolo_op(op)
    if kop == "adasum":
        raise ValueError(f"kolo: {kind}: Adasum is an allreduce; reducescatter takes Sum, "
                         f"Average, Min, Max or Product")
    comm = _ps(process_set, kind)
    if base is None:
        what = _label(kind, name)
        _check(tensor, what, reduce=kop)
        _check_rows(tensor, what, kind)
        base = _name(kind, name, comm)
    n, r = _size(comm), _rank(comm)
    d0, trailing = tensor.shape[0], tuple(tensor.shape[1:])
    q, extra = divmod(d0, n)
    mine = q + (1 if r < extra else 0)
    if extra == 0:
        # kolo's block of count/size elements is this rank's q rows.
        send = tensor
        out = torch.empty((q,) + trailing, dtype=tensor.dtype, device=tensor.device)
    else:
        # Horovod gives the first d0 % size ranks one row more: pad every
        # rank's block to q + 1 rows so that kolo's equal blocks line up.
        send = tensor.new_zeros((n * (q + 1),) + trailing)
        at = 0
        with torch.no_grad():
            for j in range(n):
                k = q + (1 if j < extra else 0)
                send[j * (q + 1):j * (q + 1) + k] = tensor[at:at + k]
                at += k
        out = torch.empty((q + 1,) + trailing, dtype=tensor.dtype,
                          device=tensor.device)
    h = kolo.reducescatter_async(send, out, name=base, op=kop, prescale=prescale_factor,
                                 postscale=postscale_factor, comm=comm)
    return _Op([h], lambda res: out if out.shape[0] == mine else out.narrow(0, 0, mine),
               (tensor, send, out))


def reducescatter_async(tensor: torch.Tensor, name: Optional[str] = None, op: int = Average,
                        process_set: ProcessSet = global_process_set,
                        prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> int:
    """Starts reducing ``tensor`` over every rank and leaving each rank its
    block of dimension 0: with d rows and n ranks, rank r gets d // n rows,
    one more when r < d % n, in rank order. Every rank calls it with the
    same name, shape, dtype, op and factors. ``op`` is Average (the
    default), Sum, Min, Max or Product. :func:`synchronize` gives the
    block."""
    return _register(_reducescatter_op(tensor, name, op, process_set, prescale_factor,
                                       postscale_factor))


class _Reducescatter(torch.autograd.Function):
    """reducescatter; the gradient is the allgather of the output's gradient,
    times size() for Sum and times the factors (Horovod's rule)."""

    @staticmethod
    def forward(ctx, tensor, name, op, process_set, prescale_factor, postscale_factor):
        ctx.op, ctx.process_set = op, process_set
        ctx.scale = prescale_factor * postscale_factor
        return synchronize(reducescatter_async(tensor, name, op, process_set, prescale_factor,
                                               postscale_factor))

    @staticmethod
    def backward(ctx, grad_output):
        grad = grad_output.contiguous()
        scale = ctx.scale * (_size(_ps(ctx.process_set, "reducescatter")) if ctx.op == Sum
                             else 1)
        if scale != 1:
            grad = grad * scale
        return allgather(grad, process_set=ctx.process_set), None, None, None, None, None


def reducescatter(tensor: torch.Tensor, name: Optional[str] = None,
                  compression: Any = Compression.none, op: int = Average,
                  process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> torch.Tensor:
    """Reduces ``tensor`` over every rank and returns this rank's block of
    dimension 0 (see :func:`reducescatter_async`); blocking, differentiable."""
    compressed, cctx = compression.compress(tensor)
    out = _Reducescatter.apply(compressed, name, op, process_set, prescale_factor,
                               postscale_factor)
    return compression.decompress(out, cctx)


def _grouped_reducescatter_op(tensors: Any, name: Optional[str], op: int, process_set: Any,
                              prescale_factor: float, postscale_factor: float) -> _Op:
    comm = _ps(process_set, "grouped_reducescatter")
    kop = _kolo_op(op)
    tensors = _check_tensors(tensors, "grouped_reducescatter", name, reduce=kop)
    for i, t in enumerate(tensors):
        _check_rows(t, _label("grouped_reducescatter", name, i), "grouped_reducescatter")
    base = _name("grouped_reducescatter", name, comm)
    parts = [_reducescatter_op(t, None, op, process_set, prescale_factor, postscale_factor,
                               base=f"{base}.{i}") for i, t in enumerate(tensors)]
    return _Op([p.handles[0] for p in parts],
               lambda res: tuple(p.finish([x]) for p, x in zip(parts, res)),
               tuple(p.keep for p in parts))


def grouped_reducescatter_async(tensors: Sequence[torch.Tensor], name: Optional[str] = None,
                                op: int = Average,
                                process_set: ProcessSet = global_process_set,
                                prescale_factor: float = 1.0,
                                postscale_factor: float = 1.0) -> int:
    """Starts a reducescatter of each tensor of a list (members named
    ``<name>.<i>``); :func:`synchronize` gives a tuple of blocks."""
    return _register(_grouped_reducescatter_op(tensors, name, op, process_set, prescale_factor,
                                               postscale_factor))


class _GroupedReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, process_set, prescale_factor, postscale_factor, *tensors):
        ctx.op, ctx.process_set = op, process_set
        ctx.scale = prescale_factor * postscale_factor
        return tuple(synchronize(grouped_reducescatter_async(
            list(tensors), name, op, process_set, prescale_factor, postscale_factor)))

    @staticmethod
    def backward(ctx, *grad_output):
        scale = ctx.scale * (_size(_ps(ctx.process_set, "grouped_reducescatter"))
                             if ctx.op == Sum else 1)
        grads = [g.contiguous() * scale if scale != 1 else g.contiguous() for g in grad_output]
        return (None,) * 5 + tuple(grouped_allgather(grads, process_set=ctx.process_set))


def grouped_reducescatter(tensors: Sequence[torch.Tensor], name: Optional[str] = None,
                          compression: Any = Compression.none, op: int = Average,
                          process_set: ProcessSet = global_process_set,
                          prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> List[torch.Tensor]:
    """Reducescatters each tensor of a list; returns a list of blocks
    (blocking, differentiable)."""
    tensors = list(tensors)
    if not tensors:
        raise ValueError("kolo: grouped_reducescatter of an empty list of tensors")
    pairs = [compression.compress(t) for t in tensors]
    outs = _GroupedReducescatter.apply(name, op, process_set, prescale_factor, postscale_factor,
                                       *[p[0] for p in pairs])
    return [compression.decompress(o, p[1]) for o, p in zip(outs, pairs)]


# ---- join and barrier ------------------------------------------------------


def join(device: int = -1) -> int:
    """This rank has run out of data: until every rank has joined, it takes
    part in the other ranks' allreduces with zeros. Blocks until all ranks
    have joined and returns the last rank to join. ``device`` is accepted
    for Horovod's signature; kolo's zeros are host memory."""
    return kolo.join()


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Returns once every rank (of ``process_set``) has called it."""
    kolo.barrier(_ps(process_set, "barrier"))


__all__ = list(_basics.__all__) + [
    # collectives
    "allreduce", "allreduce_async", "allreduce_", "allreduce_async_",
    "grouped_allreduce", "grouped_allreduce_async", "grouped_allreduce_",
    "grouped_allreduce_async_", "sparse_allreduce_async",
    "allgather", "allgather_async", "grouped_allgather", "grouped_allgather_async",
    "broadcast", "broadcast_async", "broadcast_", "broadcast_async_",
    "alltoall", "alltoall_async", "reducescatter", "reducescatter_async",
    "grouped_reducescatter", "grouped_reducescatter_async",
    "join", "barrier", "poll", "synchronize",
]
