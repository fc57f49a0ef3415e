"""Horovod's TensorFlow collectives (``horovod.tensorflow``) on kolo, in
eager mode and inside ``tf.function``, each with Horovod's gradient.

Tensors reach kolo through :mod:`._bridge` (no compiled op) and Horovod's
array-level semantics are kolo.common.arrays': allgather and alltoall take
shapes that differ in dimension 0, reducescatter gives the first
``rows % size`` ranks one row more, and a mismatch raises
:class:`kolo.MismatchError` on every rank naming the ranks. Names: see
:func:`._bridge.name`. ``device_dense``/``device_sparse`` and
``ignore_name_scope`` are accepted for Horovod's signatures; kolo works on
host memory and names ops by the names given.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence

import numpy as np
import tensorflow as tf

import kolo
from kolo.common import arrays
from kolo.common.basics import (  # noqa: F401
    Adasum, Average, Max, Min, Product, ProcessSet, Sum, add_process_set, ccl_built,
    check_process_set, cross_rank, cross_size, cuda_built, ddl_built, gloo_built, gloo_enabled,
    global_process_set, init, is_homogeneous, is_initialized, kolo_op, local_rank, local_size,
    mpi_built, mpi_enabled, mpi_threads_supported, nccl_built, op_from, rank,
    process_set_comm, remove_process_set, rocm_built, shutdown, size, start_timeline,
    stop_timeline)
from kolo.common.handles import wait_all
from kolo.common.util import label, split_rows
from kolo.common.util import root as util_root, set_root

from . import _bridge as B
from ._bridge import XlaError  # noqa: F401
from .compression import Compression


def _ps(process_set: Any, what: str) -> Optional[kolo.Comm]:
    """The comm of ``process_set`` (None: every rank), resolved when the op
    is built: a graph keeps the set it was traced with."""
    return process_set_comm(process_set, what)


def _size(comm: Optional[kolo.Comm]) -> int:
    return comm.size() if comm is not None else kolo.size()



# ---- allreduce -------------------------------------------------------------


def _tensor(x: Any) -> tf.Tensor:
    return x if isinstance(x, tf.Tensor) else tf.convert_to_tensor(x)


def _allreduce(tensor: Any, name: Optional[str] = None, op: int = Sum,
               prescale_factor: float = 1.0, postscale_factor: float = 1.0,
               comm: Optional[kolo.Comm] = None) -> tf.Tensor:
    """Dense allreduce, differentiable (the gradient is the same allreduce
    of the incoming gradient)."""
    x = _tensor(tensor)
    kop = kolo_op(op)
    B.check(x, label("allreduce", name), kop)
    nm = B.name("allreduce", name, comm)

    def fn(a):
        return [arrays.allreduce(a, nm, kop, prescale_factor, postscale_factor, comm).wait()]

    @tf.custom_gradient
    def f(v):
        (y,) = B.call("allreduce", fn, [v], [v.dtype])
        y.set_shape(v.shape)

        def grad(dy):
            return _allreduce(dy, f"{name}.grad" if name else None, op, prescale_factor,
                              postscale_factor, comm)
        return y, grad

    return f(x)


def _sparse_allreduce(t: tf.IndexedSlices, op: int, pre: float, post: float,
                      name: Optional[str], process_set: Any) -> tf.IndexedSlices:
    """An IndexedSlices reduced as Horovod does: its values and indices
    allgathered (Average divides the values by the size)."""
    if op not in (Sum, Average):
        raise NotImplementedError("kolo: only Sum and Average are supported with "
                                  "tf.IndexedSlices")
    if pre != 1.0 or post != 1.0:
        raise NotImplementedError("kolo: prescale/postscale are not supported with "
                                  "tf.IndexedSlices")
    values = allgather(t.values, name=f"{name}.values" if name else None,
                       process_set=process_set)
    indices = allgather(t.indices, name=f"{name}.indices" if name else None,
                        process_set=process_set)
    if op == Average:
        values = values / tf.cast(_size(_ps(process_set, "allreduce")), values.dtype)
    return tf.IndexedSlices(values, indices, dense_shape=t.dense_shape)


def allreduce(tensor: Any, average: Optional[bool] = None, device_dense: str = "",
              device_sparse: str = "", compression: Any = Compression.none,
              op: Optional[int] = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, name: Optional[str] = None,
              process_set: ProcessSet = global_process_set,
              ignore_name_scope: bool = False) -> Any:
    """Reduces a ``tf.Tensor``, ``tf.Variable`` or ``tf.IndexedSlices`` over
    every rank (default: Average); same shape and dtype on every rank. An
    IndexedSlices is allgathered (values and indices)."""
    op = op_from(op, average)
    comm = _ps(process_set, "allreduce")
    if isinstance(tensor, tf.IndexedSlices):
        return _sparse_allreduce(tensor, op, prescale_factor, postscale_factor, name,
                                 process_set)
    x = _tensor(tensor)
    compressed, ctx = compression.compress(x)
    out = _allreduce(compressed, name, op, prescale_factor, postscale_factor, comm)
    return compression.decompress(out, ctx)


def _grouped_allreduce(tensors: List[tf.Tensor], name: Optional[str], op: int, pre: float,
                       post: float, comm: Optional[kolo.Comm] = None) -> List[tf.Tensor]:
    kop = kolo_op(op)
    for i, t in enumerate(tensors):
        B.check(t, label("grouped_allreduce", name, i), kop)
    nm = B.name("grouped_allreduce", name, comm)

    def fn(*xs):
        return arrays.grouped_allreduce(xs, nm, kop, pre, post, comm).wait()

    @tf.custom_gradient
    def f(*vs):
        ys = B.call("grouped_allreduce", fn, vs, [v.dtype for v in vs])
        for y, v in zip(ys, vs):
            y.set_shape(v.shape)

        def grad(*dys):
            return _grouped_allreduce([_tensor(d) for d in dys],
                                      f"{name}.grad" if name else None, op, pre, post, comm)
        return ys, grad

    return list(f(*tensors))


def grouped_allreduce(tensors: Sequence[Any], average: Optional[bool] = None,
                      device_dense: str = "", device_sparse: str = "",
                      compression: Any = Compression.none, op: Optional[int] = None,
                      prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      process_set: ProcessSet = global_process_set,
                      ignore_name_scope: bool = False, name: Optional[str] = None) -> List[Any]:
    """Reduces a list of tensors as one atomic group (negotiated and fused
    together); IndexedSlices among them are allgathered."""
    op = op_from(op, average)
    comm = _ps(process_set, "grouped_allreduce")
    tensors = list(tensors)
    if not tensors:
        return []
    dense = [i for i, t in enumerate(tensors) if not isinstance(t, tf.IndexedSlices)]
    out: List[Any] = [None] * len(tensors)
    for i, t in enumerate(tensors):
        if i not in dense:
            out[i] = _sparse_allreduce(t, op, prescale_factor, postscale_factor,
                                       f"{name}.{i}" if name else None, process_set)
    if dense:
        pairs = [compression.compress(_tensor(tensors[i])) for i in dense]
        reduced = _grouped_allreduce([p[0] for p in pairs], name, op, prescale_factor,
                                     postscale_factor, comm)
        for i, r, p in zip(dense, reduced, pairs):
            out[i] = compression.decompress(r, p[1])
    return out


def allreduce_list(tensors: Sequence[tf.Tensor], names: Sequence[str], op: int,
                   prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                   process_set: Any = global_process_set) -> List[tf.Tensor]:
    """A training step's dense gradients in one call: the tensors of each
    dtype are flattened and concatenated in the graph (one buffer per
    dtype), the buffers are reduced together in one grouped submission, and
    split back. A call into Python costs ~40 µs per tensor that crosses it
    (tf.numpy_function), so this keeps a step's cost flat in the number of
    gradients. Named ``<first name>#<dtype>`` (equal on every rank, stable
    across retracing). Not differentiable."""
    kop = kolo_op(op)
    comm = _ps(process_set, "allreduce")
    if kop == "adasum":  # each tensor its own dot products: no concatenation
        return [_allreduce(_tensor(t), nm, op, prescale_factor, postscale_factor, comm)
                for t, nm in zip(tensors, names)]
    for t, nm in zip(tensors, names):
        B.check(t, label("allreduce", nm), kop)
    tensors = [_tensor(t) for t in tensors]
    if not tensors:
        return []
    groups: dict = {}
    for i, t in enumerate(tensors):
        groups.setdefault(t.dtype, []).append(i)
    flats = [tf.concat([tf.reshape(tensors[i], [-1]) for i in idx], 0)
             for idx in groups.values()]
    base = names[0] if names else "allreduce_list"
    flat_names = [f"{base}#{dt.name}" for dt in groups]

    def fn(*xs):
        return wait_all([arrays.allreduce(a, nm, kop, prescale_factor, postscale_factor, comm)
                         for a, nm in zip(xs, flat_names)])

    reduced = B.call("allreduce", fn, flats, [f.dtype for f in flats])
    out: List[Any] = [None] * len(tensors)
    for flat, red, idx in zip(flats, reduced, groups.values()):
        red.set_shape(flat.shape)
        parts = tf.split(red, [tf.size(tensors[i]) for i in idx], num=len(idx))
        for i, part in zip(idx, parts):
            out[i] = tf.reshape(part, tf.shape(tensors[i]))
            out[i].set_shape(tensors[i].shape)
    return out


# ---- allgather -------------------------------------------------------------


def _gather_call(kind: str, tensors: List[tf.Tensor], names: List[str],
                 comm: Optional[kolo.Comm]) -> list:
    """[out_0, rows_0, out_1, rows_1, ...] of allgathers submitted together."""
    def fn(*xs):
        res = wait_all([arrays.allgather(a, nm, comm) for a, nm in zip(xs, names)])
        flat = []
        for out, rows in res:
            flat += [out, np.asarray(rows, np.int64)]
        return flat

    touts = []
    for t in tensors:
        touts += [t.dtype, tf.int64]
    res = B.call(kind, fn, tensors, touts)
    for i, t in enumerate(tensors):
        res[2 * i].set_shape(tf.TensorShape([None]).concatenate(t.shape[1:]))
        res[2 * i + 1].set_shape([None])
    return res


def _my_rows(g: tf.Tensor, rows: tf.Tensor, comm: Optional[kolo.Comm]) -> tf.Tensor:
    r = rank_op() if comm is None else comm.rank()
    start = tf.reduce_sum(rows[:r])
    return g[start:start + rows[r]]


def allgather(tensor: Any, name: Optional[str] = None, ignore_name_scope: bool = False,
              process_set: ProcessSet = global_process_set) -> tf.Tensor:
    """Concatenates every rank's tensor along dimension 0, in rank order;
    shapes may differ in dimension 0 only. The gradient is this rank's rows
    of the averaged incoming gradient."""
    comm = _ps(process_set, "allgather")
    x = _tensor(tensor)
    B.check(x, label("allgather", name))
    if x.shape.rank == 0:
        raise ValueError(f"kolo: {label('allgather', name)} is a scalar (0-d); allgather works "
                         f"along dimension 0 (reshape it to [1])")
    nm = B.name("allgather", name, comm)

    @tf.custom_gradient
    def f(v):
        out, rows = _gather_call("allgather", [v], [nm], comm)

        def grad(dy):
            return _my_rows(_allreduce(_tensor(dy), None, Average, comm=comm), rows, comm)
        return out, grad

    return f(x)


def grouped_allgather(tensors: Sequence[Any], name: Optional[str] = None,
                      ignore_name_scope: bool = False,
                      process_set: ProcessSet = global_process_set) -> List[tf.Tensor]:
    """Allgathers each tensor of a list, submitted together."""
    comm = _ps(process_set, "grouped_allgather")
    xs = [_tensor(t) for t in tensors]
    for i, x in enumerate(xs):
        B.check(x, label("grouped_allgather", name, i))
        if x.shape.rank == 0:
            raise ValueError(f"kolo: {label('grouped_allgather', name, i)} is a scalar (0-d)")
    base = B.name("grouped_allgather", name, comm)
    names = [f"{base}.{i}" for i in range(len(xs))]

    @tf.custom_gradient
    def f(*vs):
        res = _gather_call("grouped_allgather", list(vs), names, comm)
        outs, rows = res[0::2], res[1::2]

        def grad(*dys):
            return [_my_rows(_allreduce(_tensor(d), None, Average, comm=comm), r, comm)
                    for d, r in zip(dys, rows)]
        return outs, grad

    return list(f(*xs))


# ---- broadcast -------------------------------------------------------------


def broadcast(tensor: Any, root_rank: int, name: Optional[str] = None,
              ignore_name_scope: bool = False,
              process_set: ProcessSet = global_process_set) -> tf.Tensor:
    """Rank ``root_rank``'s tensor on every rank (a new tensor). The gradient
    is the averaged incoming gradient on the root, zero elsewhere."""
    comm = _ps(process_set, "broadcast")
    x = _tensor(tensor)
    B.check(x, label("broadcast", name))
    root = set_root(root_rank, comm, "broadcast")
    nm = B.name("broadcast", name, comm)

    @tf.custom_gradient
    def f(v):
        (y,) = B.call("broadcast", lambda a: [arrays.broadcast(a, root, nm, comm).wait()], [v],
                      [v.dtype])
        y.set_shape(v.shape)

        def grad(dy):
            g = _allreduce(_tensor(dy), None, Average, comm=comm)
            return g if kolo.rank() == util_root(root_rank) else g * 0
        return y, grad

    return f(x)


def broadcast_(variables: Sequence[tf.Variable], root_rank: int, name: Optional[str] = None,
               process_set: ProcessSet = global_process_set) -> List[tf.Tensor]:
    """Broadcasts the variables from ``root_rank`` in place (assigned), all
    submitted together; returns their new values."""
    comm = _ps(process_set, "broadcast_")
    variables = list(variables)
    if not variables:
        return []
    for i, v in enumerate(variables):
        B.check(v, label("broadcast_", name, i))
    root = set_root(root_rank, comm, "broadcast_")
    base = B.name("broadcast_", name, comm)
    names = [f"{base}.{i}" for i in range(len(variables))]

    def fn(*xs):
        return wait_all([arrays.broadcast(a, root, nm, comm) for a, nm in zip(xs, names)])

    values = [v.read_value() if B.eager() else tf.convert_to_tensor(v) for v in variables]
    outs = B.call("broadcast_", fn, values, [v.dtype for v in variables])
    assigns = [v.assign(o) for v, o in zip(variables, outs)]
    if B.eager():
        return [v.read_value() for v in variables]
    with tf.control_dependencies(assigns):
        return [tf.identity(v.read_value()) for v in variables]


# ---- alltoall --------------------------------------------------------------


def alltoall(tensor: Any, splits: Any = None, name: Optional[str] = None,
             ignore_name_scope: bool = False,
             process_set: ProcessSet = global_process_set) -> Any:
    """Sends ``splits[j]`` rows to rank j (None: equal parts) and returns the
    rows received, in rank order; with ``splits`` given, ``(output,
    received_splits)`` as Horovod does. The gradient goes back the way the
    rows came."""
    comm = _ps(process_set, "alltoall")
    x = _tensor(tensor)
    what = label("alltoall", name)
    B.check(x, what)
    if x.shape.rank == 0:
        raise ValueError(f"kolo: {what} is a scalar (0-d); alltoall works along dimension 0")
    nm = B.name("alltoall", name, comm)
    given = splits is not None
    sp = tf.cast(_tensor(splits), tf.int32) if given else tf.zeros([0], tf.int32)

    def fn(a, s):
        rows = split_rows(s if given else None, _size(comm), a.shape[0], what)
        out, recv = arrays.alltoall(a, rows, nm, comm).wait()
        return [out, np.asarray(recv, np.int32)]

    @tf.custom_gradient
    def f(v):
        out, recv = B.call("alltoall", fn, [v, sp], [v.dtype, tf.int32])
        out.set_shape(tf.TensorShape([None]).concatenate(v.shape[1:]))
        recv.set_shape([None])

        def grad(dy, *unused):
            g, _ = alltoall(_tensor(dy), splits=recv, process_set=process_set)
            pad = tf.shape(v)[0] - tf.shape(g)[0]
            return tf.pad(g, [[0, pad]] + [[0, 0]] * (v.shape.rank - 1))
        return (out, recv), grad

    out, recv = f(x)
    return (out, recv) if given else out


# ---- reducescatter ---------------------------------------------------------


def _grad_scale(op: int, pre: float, post: float, comm: Optional[kolo.Comm]) -> float:
    return (_size(comm) if op == Sum else 1) * pre * post


def reducescatter(tensor: Any, device_dense: str = "", compression: Any = Compression.none,
                  op: int = Average, name: Optional[str] = None,
                  process_set: ProcessSet = global_process_set, ignore_name_scope: bool = False,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> tf.Tensor:
    """Reduces the tensor over every rank and returns this rank's rows of the
    result (the first ``rows % size`` ranks get one row more). The gradient
    is the allgather of the incoming gradient (times size for Sum)."""
    outs = _reducescatter([_tensor(tensor)], "reducescatter", name, op, compression,
                          prescale_factor, postscale_factor, process_set)
    return outs[0]


def grouped_reducescatter(tensors: Sequence[Any], device_dense: str = "",
                          compression: Any = Compression.none, op: int = Average,
                          process_set: ProcessSet = global_process_set,
                          prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                          name: Optional[str] = None) -> List[tf.Tensor]:
    """reducescatter of each tensor of a list, submitted together."""
    return _reducescatter([_tensor(t) for t in tensors], "grouped_reducescatter", name, op,
                          compression, prescale_factor, postscale_factor, process_set)


def _reducescatter(xs: List[tf.Tensor], kind: str, name: Optional[str], op: int,
                   compression: Any, pre: float, post: float,
                   process_set: Any) -> List[tf.Tensor]:
    comm = _ps(process_set, kind)
    kop = kolo_op(op)
    if kop == "adasum":
        raise ValueError(f"kolo: {kind}: Adasum is an allreduce; reducescatter takes Sum, "
                         f"Average, Min, Max or Product")
    for i, x in enumerate(xs):
        what = label(kind, name, i if len(xs) > 1 else None)
        B.check(x, what, kop)
        if x.shape.rank == 0:
            raise ValueError(f"kolo: {what} is a scalar (0-d); reducescatter works along "
                             f"dimension 0")
    base = B.name(kind, name, comm)
    names = [base] if len(xs) == 1 else [f"{base}.{i}" for i in range(len(xs))]
    pairs = [compression.compress(x) for x in xs]

    def fn(*arrs):
        return wait_all([arrays.reducescatter(a, nm, kop, pre, post, comm)
                         for a, nm in zip(arrs, names)])

    @tf.custom_gradient
    def f(*vs):
        ys = B.call(kind, fn, vs, [v.dtype for v in vs])
        for y, v in zip(ys, vs):
            y.set_shape(tf.TensorShape([None]).concatenate(v.shape[1:]))

        def grad(*dys):
            s = _grad_scale(op, pre, post, comm)
            gs = [_tensor(d) * tf.cast(s, d.dtype) if s != 1 else _tensor(d) for d in dys]
            return grouped_allgather(gs, process_set=process_set)
        return ys, grad

    ys = f(*[p[0] for p in pairs])
    return [compression.decompress(y, p[1]) for y, p in zip(ys, pairs)]


# ---- join, barrier and the graph-time topology ops -------------------------


def _scalar_op(kind: str, value: Any, dtype: tf.DType = tf.int32) -> tf.Tensor:
    if B.eager():
        return tf.constant(value(), dtype)
    (y,) = B.call(kind, lambda: [np.asarray(value(), dtype.as_numpy_dtype)], [], [dtype])
    y.set_shape([])
    return y


def join() -> tf.Tensor:
    """This rank has run out of data: it takes part in the other ranks'
    allreduces with zeros until every rank has joined; returns the last rank
    to join."""
    return _scalar_op("join", kolo.join)


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Returns once every rank has called it (inside a graph: an op that
    does)."""
    comm = _ps(process_set, "barrier")
    if B.eager():
        kolo.barrier(comm)
        return None
    return _scalar_op("barrier", lambda: (kolo.barrier(comm), 0)[1])


def _set_by_id(process_set_id: int) -> Any:
    from kolo.common import basics
    if process_set_id == 0:
        return global_process_set
    ps = basics._sets.get(process_set_id)
    if ps is None:
        raise ValueError(f"kolo: no process set has id {process_set_id}")
    return ps


def size_op(process_set_id: int = 0, name: Optional[str] = None) -> tf.Tensor:
    """The number of ranks (of the process set), read when the op runs (it
    changes in an elastic job)."""
    if process_set_id == 0:
        return _scalar_op("size", kolo.size)
    n = _set_by_id(process_set_id).size()
    return _scalar_op("size", lambda: n)


def rank_op(name: Optional[str] = None) -> tf.Tensor:
    return _scalar_op("rank", kolo.rank)


def local_size_op(name: Optional[str] = None) -> tf.Tensor:
    return _scalar_op("local_size", kolo.local_size)


def local_rank_op(name: Optional[str] = None) -> tf.Tensor:
    return _scalar_op("local_rank", kolo.local_rank)


def process_set_included_op(process_set_id: int = 0, name: Optional[str] = None) -> tf.Tensor:
    """1 when this process is in the process set, else 0."""
    included = 1 if _set_by_id(process_set_id).included() else 0
    return _scalar_op("process_set_included", lambda: included)
