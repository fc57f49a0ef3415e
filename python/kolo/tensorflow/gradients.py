"""Gradient averaging for TensorFlow: what ``DistributedGradientTape`` and
the Keras ``DistributedOptimizer`` (tensorflow backend) share.

A step's dense gradients go as one submission (:func:`mpi_ops.allreduce_list`:
one call into kolo inside ``tf.function``, every gradient enqueued before
any is waited for, fused by kolo's engine). Each gradient is named from its
position and its variable's path (``<prefix>.<i>.<path>``), so names are
equal on every rank and do not change when a function is retraced.
IndexedSlices are allgathered unless ``sparse_as_dense``.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence

import tensorflow as tf

from kolo.common.basics import Average, global_process_set
from kolo.common.util import predivide_scales

from . import mpi_ops
from .compression import Compression


def var_name(v: Any, i: int) -> str:
    path = getattr(v, "path", None) or getattr(v, "name", None) or ""
    return f"{i}.{path}" if path else str(i)


def reduce_gradients(grads: Sequence[Any], variables: Sequence[Any], prefix: str,
                     op: int = Average, compression: Any = Compression.none,
                     sparse_as_dense: bool = False,
                     gradient_predivide_factor: float = 1.0,
                     postscale: float = 1.0,
                     process_set: Any = global_process_set) -> List[Any]:
    """The gradients averaged (``op``) over every rank (of ``process_set``),
    in order; None stays None."""
    comm = mpi_ops._ps(process_set, prefix)
    op, pre, post = predivide_scales(op, gradient_predivide_factor, postscale,
                                     mpi_ops._size(comm))
    out: List[Any] = list(grads)
    dense, names, ctxs = [], [], []
    for i, (g, v) in enumerate(zip(grads, variables)):
        if g is None:
            continue
        nm = f"{prefix}.{var_name(v, i)}"
        if isinstance(g, tf.IndexedSlices):
            if not sparse_as_dense:
                out[i] = mpi_ops.allreduce(g, op=op, name=nm, prescale_factor=pre,
                                           postscale_factor=post, process_set=process_set)
                continue
            g = tf.convert_to_tensor(g)
        c, ctx = compression.compress(tf.convert_to_tensor(g))
        dense.append((i, c))
        names.append(nm)
        ctxs.append(ctx)
    if dense:
        reduced = mpi_ops.allreduce_list([c for _, c in dense], names, op, pre, post,
                                         process_set)
        for (i, _), r, ctx in zip(dense, reduced, ctxs):
            out[i] = compression.decompress(r, ctx)
    return out


def check_predivide(op: int, gradient_predivide_factor: float) -> None:
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("kolo: gradient_predivide_factor is only supported with op=Average")


def check_groups(num_groups: int, groups: Optional[Any]) -> None:
    """kolo fuses by size (KOLO_FUSION_THRESHOLD), not by explicit groups:
    ``groups``/``num_groups`` are accepted and have no effect."""
    if groups is not None and not (isinstance(groups, list) or groups > 0):
        raise ValueError("kolo: groups should be a non-negative integer or a list of lists of "
                         "variables")
