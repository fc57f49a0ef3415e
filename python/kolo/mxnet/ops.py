"""Horovod's MXNet collectives on ``mx.nd.NDArray``.

allreduce and broadcast (and their grouped and in-place forms) are pushed
onto MXNet's dependency engine through libkolo (include/kolo/mxnet.h): they
return at once, and MXNet orders them with every other read and write of
their arrays, so the next operation on an output waits for the collective
without an explicit wait. The others (allgather, alltoall, reducescatter),
whose output shapes depend on every rank, read their input (waiting for
it), run through kolo.common.arrays and return a new array.

A pushed operation that fails cannot raise inside MXNet's engine; libkolo
records it, and the next call of this module (or :func:`synchronize`)
raises it.
"""

from __future__ import annotations

import atexit
import ctypes
from collections import OrderedDict
from typing import Any, List, Optional, Sequence

import numpy as np

import kolo
from kolo.common import arrays, util
from kolo.common.basics import (Adasum, Average, ProcessSet, global_process_set, kolo_op,
                                op_from, process_set_comm)


def _mx():
    import mxnet as mx
    return mx


_bound = False


def _lib():
    """libkolo with MXNet's entry points resolved from the loaded libmxnet."""
    global _bound
    lib = kolo._lib_()
    if not _bound:
        mx = _mx()
        path = mx.base._LIB._name
        st = lib.kolo_mx_bind(path.encode())
        if st != 0:
            raise kolo._error(st, f"kolo.mxnet: cannot use MXNet's C API from {path}")
        _bound = True
        # At exit, before kolo's own hook finalizes the comm (atexit runs in
        # reverse, and kolo's was registered at init): operations still in
        # MXNet's queue would otherwise run on a freed comm
        atexit.register(drain)
    return lib


def drain() -> None:
    """Waits for every operation pushed onto MXNet's engine; ``shutdown()``
    and interpreter exit call it before the comm goes."""
    if _bound:
        _mx().nd.waitall()


def check_errors() -> None:
    """Raises the first failure of a pushed operation not raised yet."""
    msg = ctypes.create_string_buffer(1024)
    st = _lib().kolo_mx_take_error(msg, len(msg))
    if st != 0:
        raise kolo._error(st, msg.value.decode(errors="replace"))


def synchronize() -> None:
    """Waits for every pushed kolo operation (and all of MXNet's work), then
    raises the first failure among them, if any."""
    _mx().nd.waitall()
    check_errors()


def _dtype(t: Any, what: str) -> int:
    name = np.dtype(t.dtype).name
    if name == "bool":
        name = "uint8"
    if name not in kolo.DTYPES:
        raise TypeError(f"kolo: {what}: dtype {name} is not supported ({kolo.SUPPORTED})")
    return kolo.DTYPES[name]


def _cpu(t: Any, what: str) -> None:
    mx = _mx()
    if not isinstance(t, mx.nd.NDArray):
        raise TypeError(f"kolo: {what} takes an mx.nd.NDArray, not {type(t).__name__}")
    if t.context.device_type not in ("cpu", "cpu_pinned", "cpu_shared"):
        raise NotImplementedError(f"kolo: {what}: {t.context} arrays are not supported "
                                  f"(CPU arrays only; copy with .as_in_context(mx.cpu()))")
    if getattr(t, "stype", "default") != "default":
        raise NotImplementedError(f"kolo: {what}: {t.stype} arrays are not supported "
                                  f"(use .tostype('default'))")


# One small NDArray per name that every pushed operation of that name
# writes, so MXNet's engine runs them in push order (include/kolo/mxnet.h).
# Unnamed operations have names of their own and need none. Bounded: the
# least recently used name gives its token up first.
_TOKENS: "OrderedDict[tuple, Any]" = OrderedDict()
_TOKENS_MAX = 1 << 16


def _token(comm: Optional[kolo.Comm], name: str) -> Any:
    if ".noname." in name:
        return None
    key = (id(comm), name)
    t = _TOKENS.get(key)
    if t is None:
        t = _TOKENS[key] = _mx().nd.zeros((1,), dtype="uint8")
        if len(_TOKENS) > _TOKENS_MAX:
            _TOKENS.popitem(last=False)
    else:
        _TOKENS.move_to_end(key)
    return t.handle.value


def _comm_ptr(comm: Optional[kolo.Comm]) -> Any:
    return kolo._get(comm).ptr


def _handles(ts: Sequence[Any]) -> Any:
    return (ctypes.c_void_p * len(ts))(*[t.handle.value for t in ts])


def _push_allreduce(inputs: List[Any], outputs: List[Any], name: str, op: int, pre: float,
                    post: float, priority: int, comm: Optional[kolo.Comm]) -> None:
    """One grouped push per dtype (names ``<name>.<i>`` when grouped)."""
    lib = _lib()
    check_errors()
    code = kolo.op_code(kolo_op(op))
    by_dtype: dict = {}
    for i, t in enumerate(inputs):
        by_dtype.setdefault(_dtype(t, f"allreduce {name}"), []).append(i)
    for k, (dt, idx) in enumerate(by_dtype.items()):
        idx = [i for i in idx if inputs[i].size > 0]
        if not idx:
            continue
        if len(inputs) == 1:
            names = [name]
        else:
            names = [f"{name}.{i}" for i in idx]
        n = len(idx)
        st = lib.kolo_mx_allreduce(
            _comm_ptr(comm), n, (ctypes.c_char_p * n)(*[s.encode() for s in names]),
            _handles([inputs[i] for i in idx]), _handles([outputs[i] for i in idx]),
            (ctypes.c_size_t * n)(*[inputs[i].size for i in idx]), dt, code, float(pre),
            float(post), int(priority), _token(comm, names[0]))
        if st != 0:
            raise kolo._error(st, f"kolo.mxnet: allreduce {name}: {kolo.last_error()}")


def _reduce_args(what: str, op: Any, average: Optional[bool], process_set: ProcessSet,
                 prescale_factor: float, postscale_factor: float):
    op = op_from(op, average)
    if op == Adasum:
        raise NotImplementedError(f"kolo.mxnet: {what}: Adasum is not supported on MXNet arrays")
    comm = process_set_comm(process_set, what)
    return op, comm, kolo._scale(prescale_factor, what), kolo._scale(postscale_factor, what)


def allreduce(tensor: Any, average: Optional[bool] = None, name: Optional[str] = None,
              priority: int = 0, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set: ProcessSet = global_process_set, op: Optional[int] = None) -> Any:
    """A new array: ``tensor`` reduced over the ranks (default: averaged)."""
    _cpu(tensor, "allreduce")
    out = _mx().nd.zeros(shape=tensor.shape, ctx=tensor.context, dtype=tensor.dtype)
    return grouped_allreduce_([tensor], average, name, priority, prescale_factor,
                              postscale_factor, process_set, op, outputs=[out])[0]


def allreduce_(tensor: Any, average: Optional[bool] = None, name: Optional[str] = None,
               priority: int = 0, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
               process_set: ProcessSet = global_process_set, op: Optional[int] = None) -> Any:
    """``tensor`` reduced in place; returns it."""
    return grouped_allreduce_([tensor], average, name, priority, prescale_factor,
                              postscale_factor, process_set, op)[0]


def grouped_allreduce(tensors: Sequence[Any], average: Optional[bool] = None,
                      name: Optional[str] = None, priority: int = 0,
                      prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      process_set: ProcessSet = global_process_set,
                      op: Optional[int] = None) -> List[Any]:
    """New arrays: the tensors reduced as one group (one negotiation)."""
    mx = _mx()
    for t in tensors:
        _cpu(t, "grouped_allreduce")
    outs = [mx.nd.zeros(shape=t.shape, ctx=t.context, dtype=t.dtype) for t in tensors]
    return grouped_allreduce_(tensors, average, name, priority, prescale_factor,
                              postscale_factor, process_set, op, outputs=outs)


def grouped_allreduce_(tensors: Sequence[Any], average: Optional[bool] = None,
                       name: Optional[str] = None, priority: int = 0,
                       prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set: ProcessSet = global_process_set, op: Optional[int] = None,
                       outputs: Optional[List[Any]] = None) -> List[Any]:
    """The tensors reduced in place as one group; returns them."""
    tensors = list(tensors)
    what = "allreduce" if len(tensors) == 1 else "grouped_allreduce"
    if not tensors:
        return []
    for t in tensors:
        _cpu(t, what)
    op, comm, pre, post = _reduce_args(what, op, average, process_set, prescale_factor,
                                       postscale_factor)
    outs = outputs if outputs is not None else tensors
    nm = util.op_name(what, name, comm)
    _push_allreduce(tensors, outs, nm, op, pre, post, priority, comm)
    return outs


def broadcast_(tensor: Any, root_rank: int, name: Optional[str] = None, priority: int = 0,
               process_set: ProcessSet = global_process_set) -> Any:
    """Rank ``root_rank``'s ``tensor`` on every rank, in place; returns it."""
    _cpu(tensor, "broadcast")
    comm = process_set_comm(process_set, "broadcast")
    root = util.set_root(root_rank, comm, "broadcast")
    lib = _lib()
    check_errors()
    dt = _dtype(tensor, "broadcast")
    nm = util.op_name("broadcast", name, comm)
    if tensor.size == 0:
        return tensor
    st = lib.kolo_mx_broadcast(_comm_ptr(comm), nm.encode(), tensor.handle.value, tensor.size,
                               dt, root, int(priority), _token(comm, nm))
    if st != 0:
        raise kolo._error(st, f"kolo.mxnet: broadcast {nm}: {kolo.last_error()}")
    return tensor


def broadcast(tensor: Any, root_rank: int, name: Optional[str] = None, priority: int = 0,
              process_set: ProcessSet = global_process_set) -> Any:
    """A new array holding rank ``root_rank``'s ``tensor``."""
    _cpu(tensor, "broadcast")
    return broadcast_(tensor.copy(), root_rank, name, priority, process_set)


# ---- shards: the two halves of an allreduce, in place (a sharded update) ------


def shard_range(count: int, process_set: ProcessSet = global_process_set) -> tuple:
    """``(lo, hi)``: this rank's share of an array of ``count`` elements, as
    :func:`shard_reducescatter_` leaves it and :func:`shard_allgather_`
    reads it (kolo_reducescatter_count's split: the first ``count % size``
    ranks hold one element more)."""
    comm = process_set_comm(process_set, "shard_range")
    size = comm.size() if comm is not None else kolo.size()
    rank = comm.rank() if comm is not None else kolo.rank()
    lib = kolo._lib_()
    lo = sum(lib.kolo_reducescatter_count(count, size, r) for r in range(rank))
    return lo, lo + lib.kolo_reducescatter_count(count, size, rank)


def shard_reducescatter_(tensor: Any, name: Optional[str] = None, priority: int = 0,
                         process_set: ProcessSet = global_process_set, op: int = Average,
                         prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> Any:
    """``tensor`` (read as flat) reduced over the ranks into this rank's share
    of it, ``tensor.reshape(-1)[lo:hi]`` for :func:`shard_range`'s bounds;
    the rest of it is left as it was. Pushed onto MXNet's engine; returns
    ``tensor``."""
    op, comm, pre, post = _reduce_args("shard_reducescatter", op, None, process_set,
                                       prescale_factor, postscale_factor)
    return _push_share("shard_reducescatter", tensor, name, priority, comm,
                       kolo.op_code(kolo_op(op)), pre, post)


def shard_allgather_(tensor: Any, name: Optional[str] = None, priority: int = 0,
                     process_set: ProcessSet = global_process_set) -> Any:
    """Every rank's share of ``tensor`` (:func:`shard_range`) copied into its
    place on every rank, in place. Pushed onto MXNet's engine; returns
    ``tensor``."""
    comm = process_set_comm(process_set, "shard_allgather")
    return _push_share("shard_allgather", tensor, name, priority, comm, None, 1.0, 1.0)


def _push_share(what: str, tensor: Any, name: Optional[str], priority: int,
                comm: Optional[kolo.Comm], code: Optional[int], pre: float, post: float) -> Any:
    _cpu(tensor, what)
    lib = _lib()
    check_errors()
    dt = _dtype(tensor, what)
    nm = util.op_name(what, name, comm)
    if tensor.size == 0:
        return tensor
    if code is None:
        st = lib.kolo_mx_allgather(_comm_ptr(comm), nm.encode(), tensor.handle.value,
                                   tensor.size, dt, int(priority), _token(comm, nm))
    else:
        st = lib.kolo_mx_reducescatter(_comm_ptr(comm), nm.encode(), tensor.handle.value,
                                       tensor.size, dt, code, float(pre), float(post),
                                       int(priority), _token(comm, nm))
    if st != 0:
        raise kolo._error(st, f"kolo.mxnet: {what} {nm}: {kolo.last_error()}")
    return tensor


# ---- collectives whose output shape depends on every rank ---------------------


def _numpy(t: Any, what: str) -> np.ndarray:
    _cpu(t, what)
    check_errors()
    return arrays.contiguous(t.asnumpy())


def _array(a: np.ndarray, like: Any) -> Any:
    return _mx().nd.array(a, ctx=like.context, dtype=like.dtype)


def allgather(tensor: Any, name: Optional[str] = None, priority: int = 0,
              process_set: ProcessSet = global_process_set) -> Any:
    """Every rank's ``tensor`` concatenated along dimension 0, in rank order
    (dimension 0 may differ between ranks)."""
    comm = process_set_comm(process_set, "allgather")
    a = _numpy(tensor, "allgather")
    out, _ = arrays.allgather(a, util.op_name("allgather", name, comm), comm).wait()
    return _array(out, tensor)


def grouped_allgather(tensors: Sequence[Any], name: Optional[str] = None, priority: int = 0,
                      process_set: ProcessSet = global_process_set) -> List[Any]:
    comm = process_set_comm(process_set, "grouped_allgather")
    base = util.op_name("grouped_allgather", name, comm)
    ops = [arrays.allgather(_numpy(t, "grouped_allgather"), f"{base}.{i}", comm)
           for i, t in enumerate(tensors)]
    return [_array(op.wait()[0], t) for op, t in zip(ops, tensors)]


def alltoall(tensor: Any, splits: Any = None, name: Optional[str] = None, priority: int = 0,
             process_set: ProcessSet = global_process_set) -> Any:
    """Rows of ``tensor`` scattered to the ranks (``splits[j]`` rows to rank
    j; equal parts when None) and the rows received, in rank order."""
    comm = process_set_comm(process_set, "alltoall")
    a = _numpy(tensor, "alltoall")
    n = comm.size() if comm is not None else kolo.size()
    sp = splits.asnumpy() if hasattr(splits, "asnumpy") else splits
    rows = util.split_rows(sp, n, a.shape[0] if a.ndim else 0, "alltoall")
    out, _ = arrays.alltoall(a, rows, util.op_name("alltoall", name, comm), comm).wait()
    return _array(out, tensor)


def reducescatter(tensor: Any, op: int = Average, name: Optional[str] = None, priority: int = 0,
                  process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> Any:
    """``tensor`` reduced over the ranks, this rank's share of dimension 0."""
    comm = process_set_comm(process_set, "reducescatter")
    a = _numpy(tensor, "reducescatter")
    out = arrays.reducescatter(a, util.op_name("reducescatter", name, comm), kolo_op(op),
                               prescale_factor, postscale_factor, comm).wait()
    return _array(out, tensor)


def grouped_reducescatter(tensors: Sequence[Any], op: int = Average, name: Optional[str] = None,
                          priority: int = 0, process_set: ProcessSet = global_process_set,
                          prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> List[Any]:
    comm = process_set_comm(process_set, "grouped_reducescatter")
    base = util.op_name("grouped_reducescatter", name, comm)
    ops = [arrays.reducescatter(_numpy(t, "grouped_reducescatter"), f"{base}.{i}", kolo_op(op),
                                prescale_factor, postscale_factor, comm)
           for i, t in enumerate(tensors)]
    return [_array(o.wait(), t) for o, t in zip(ops, tensors)]
