"""Horovod's collectives on numpy arrays, for the bindings whose tensors
reach kolo as host arrays (``kolo.tensorflow``, ``kolo.keras`` on every
backend, ``kolo.mxnet``): shapes travel beside the data, so allgather and
alltoall take tensors that differ in dimension 0, reducescatter splits rows
as Horovod does, and a shape mismatch fails on every rank naming the ranks.

Every function checks, names, enqueues and returns a
:class:`kolo.common.handles.Op` without waiting: a caller submits every
part of a step, then waits (:func:`kolo.common.handles.wait_all`). Outputs
are new arrays aligned to 64 bytes (:func:`empty`), so that a framework can
adopt them without a copy (TensorFlow refuses less-aligned memory).
Names are made by the caller (:func:`kolo.common.util.op_name`). Each
function takes ``comm=``: a process set's :class:`kolo.Comm` (None: the job).
"""

from __future__ import annotations

import math
from typing import List, Optional, Sequence

import numpy as np

import kolo

from .handles import Op
from .util import alltoall_meta, gathered_shapes, mismatch

ALIGN = 64


def empty(shape: Sequence[int], dtype: np.dtype) -> np.ndarray:
    """An uninitialised C-contiguous array whose data is ALIGN-aligned."""
    dtype = np.dtype(dtype)
    shape = tuple(int(x) for x in shape)
    nbytes = math.prod(shape) * dtype.itemsize
    raw = np.empty(nbytes + ALIGN, np.uint8)
    off = (-raw.ctypes.data) % ALIGN
    return raw[off:off + nbytes].view(dtype).reshape(shape)


def zeros(shape: Sequence[int], dtype: np.dtype) -> np.ndarray:
    out = empty(shape, dtype)
    out.fill(0)
    return out


def contiguous(a: np.ndarray) -> np.ndarray:
    return a if a.flags["C_CONTIGUOUS"] else np.ascontiguousarray(a)


def _size_rank(comm: Optional[kolo.Comm]) -> tuple:
    return (comm.size(), comm.rank()) if comm is not None else (kolo.size(), kolo.rank())


def allreduce(a: np.ndarray, name: str, op: str, prescale: float = 1.0,
              postscale: float = 1.0, comm: Optional[kolo.Comm] = None) -> Op:
    """Reduces ``a`` over the ranks into a new array of its shape."""
    a = contiguous(a)
    out = empty(a.shape, a.dtype)
    h = kolo.allreduce_async(a, out, name=name, op=op, prescale=prescale, postscale=postscale,
                             comm=comm)
    return Op([h], lambda res: out, (a, out))


def grouped_allreduce(arrays: Sequence[np.ndarray], name: str, op: str,
                      prescale: float = 1.0, postscale: float = 1.0,
                      comm: Optional[kolo.Comm] = None) -> Op:
    """Reduces the arrays as one atomic group (negotiated and fused
    together; names ``<name>.<i>``); arrays of several dtypes make one group
    per dtype. The result is the list of new arrays."""
    arrays = [contiguous(a) for a in arrays]
    outs = [empty(a.shape, a.dtype) for a in arrays]
    by_dtype: dict = {}
    for i, a in enumerate(arrays):
        by_dtype.setdefault(a.dtype.str, []).append(i)
    hs = []
    for k, idx in enumerate(by_dtype.values()):
        nm = name if len(by_dtype) == 1 else f"{name}#{k}"
        hs.append(kolo.grouped_allreduce_async([arrays[i] for i in idx], [outs[i] for i in idx],
                                               name=nm, op=op, prescale=prescale,
                                               postscale=postscale, comm=comm))
    return Op(hs, lambda res: outs, (arrays, outs))


def _need_rows(a: np.ndarray, what: str) -> None:
    if a.ndim == 0:
        raise ValueError(f"kolo: {what} is a scalar (0-d); it works along dimension 0 "
                         f"(reshape it to [1])")


def allgather(a: np.ndarray, name: str, comm: Optional[kolo.Comm] = None) -> Op:
    """Concatenates every rank's ``a`` along dimension 0, in rank order; the
    result is ``(output, rows of each rank)``. Shapes may differ in
    dimension 0 only."""
    _need_rows(a, f"allgather {name}")
    a = contiguous(a)
    shape = np.array([a.ndim, *a.shape], np.int64)
    h_shape = kolo.allgather_async(shape, lambda k: empty((k,), np.int64), name=f"{name}#shape",
                                   comm=comm)
    h_data = kolo.allgather_async(a, lambda k: empty((k,), a.dtype), name=name, comm=comm)

    def finish(res):
        (shapes_flat, counts), (flat, _) = res
        shapes = gathered_shapes(shapes_flat, counts)
        if len({s[1:] for s in shapes}) != 1 or len({len(s) for s in shapes}) != 1:
            raise mismatch(f"allgather {name}", shapes,
                           "only the first dimension may differ between ranks")
        rows = [s[0] for s in shapes]
        return flat.reshape((sum(rows),) + shapes[0][1:]), rows

    return Op([h_shape, h_data], finish, (a, shape))


def broadcast(a: np.ndarray, root: int, name: str, comm: Optional[kolo.Comm] = None) -> Op:
    """Rank ``root``'s ``a`` (root a rank of ``comm``) on every rank, in a new array."""
    out = empty(a.shape, a.dtype)
    out[...] = a
    h = kolo.broadcast_async(out, root, name=name, comm=comm)
    return Op([h], lambda res: out, (out,))


def alltoall(a: np.ndarray, rows: List[int], name: str,
             comm: Optional[kolo.Comm] = None) -> Op:
    """Sends ``rows[j]`` rows of ``a`` (in order) to rank j; the result is
    ``(rows received from every rank in rank order, received row counts)``.
    Only dimension 0 may differ between ranks."""
    _need_rows(a, f"alltoall {name}")
    a = contiguous(a)
    n = _size_rank(comm)[0]
    trailing = tuple(a.shape[1:])
    row = math.prod(trailing)
    send = a if sum(rows) == a.shape[0] else a[:sum(rows)]
    meta = np.array([x for j in range(n) for x in (rows[j], len(trailing), *trailing)],
                    np.int64)
    h_meta = kolo.alltoall_async(meta, lambda k: empty((k,), np.int64), name=f"{name}#splits",
                                 comm=comm)
    h_data = kolo.alltoall_async(send, lambda k: empty((k,), a.dtype),
                                 splits=[x * row for x in rows], name=name, comm=comm)

    def finish(res):
        (meta_in, meta_counts), (flat, _) = res
        recv, shapes = alltoall_meta(meta_in, meta_counts)
        if len(set(shapes)) != 1:
            raise mismatch(f"alltoall {name}", [(None,) + s for s in shapes],
                           "only the first dimension may differ between ranks")
        return flat.reshape((sum(recv),) + trailing), recv

    return Op([h_meta, h_data], finish, (a, send, meta))


def reducescatter_rows(d0: int, n: int, r: int) -> int:
    """Rank r's rows of a reducescatter of d0 rows over n ranks: Horovod
    gives the first ``d0 % n`` ranks one row more."""
    q, extra = divmod(d0, n)
    return q + (1 if r < extra else 0)


def reducescatter(a: np.ndarray, name: str, op: str, prescale: float = 1.0,
                  postscale: float = 1.0, comm: Optional[kolo.Comm] = None) -> Op:
    """Reduces ``a`` over the ranks and returns this rank's rows of the
    result (:func:`reducescatter_rows`)."""
    _need_rows(a, f"reducescatter {name}")
    a = contiguous(a)
    n, r = _size_rank(comm)
    d0, trailing = a.shape[0], tuple(a.shape[1:])
    q, extra = divmod(d0, n)
    mine = reducescatter_rows(d0, n, r)
    if extra == 0:
        send = a
        out = empty((q,) + trailing, a.dtype)
    else:
        # Pad every rank's block to q + 1 rows so that kolo's equal blocks
        # line up with Horovod's uneven ones.
        send = zeros((n * (q + 1),) + trailing, a.dtype)
        at = 0
        for j in range(n):
            k = reducescatter_rows(d0, n, j)
            send[j * (q + 1):j * (q + 1) + k] = a[at:at + k]
            at += k
        out = empty((q + 1,) + trailing, a.dtype)
    h = kolo.reducescatter_async(send, out, name=name, op=op, prescale=prescale,
                                 postscale=postscale, comm=comm)
    return Op([h], lambda res: out if out.shape[0] == mine else out[:mine], (a, send, out))
