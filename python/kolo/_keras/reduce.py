"""Each Keras backend's gradients averaged over every rank, as one
submission per step:

- tensorflow (Keras 3 and tf_keras): kolo.tensorflow.gradients, one
  ``tf.numpy_function`` inside the train function;
- torch: kolo.torch's asynchronous allreduces, all enqueued, then awaited;
- jax: one ``jax.experimental.io_callback(..., ordered=True)``, which runs
  inside ``jax.jit`` (the train step) and in eager mode alike: ordered, so
  it is neither dropped nor repeated, and every rank reduces in step order.

Names are ``<prefix>.<i>.<variable path>``: equal on every rank, stable
across retracing.
"""

from __future__ import annotations

from typing import Any, Callable, List

import numpy as np

import kolo
from kolo.common import arrays
from kolo.common.elastic import note_callback_error
from kolo.common.basics import global_process_set, kolo_op, process_set_comm
from kolo.common.util import predivide_scales
from kolo.common.handles import wait_all


def _names(prefix: str, variables: List[Any]) -> List[str]:
    out = []
    for i, v in enumerate(variables):
        path = getattr(v, "path", None) or getattr(v, "name", None) or ""
        out.append(f"{prefix}.{i}.{path}" if path else f"{prefix}.{i}")
    return out


def reducer(backend: str, prefix: str, op: int, compression: Any, sparse_as_dense: bool,
            predivide: float, post: float,
            process_set: Any = global_process_set) -> Callable[..., list]:
    """``reduce(grads, variables, when=None) -> grads`` for ``backend``, over
    the ranks of ``process_set``; None stays None. ``when`` (jax: a traced
    boolean) makes the host callback send only where it is true and return
    the gradients unchanged elsewhere; the other backends reduce at once."""
    comm = process_set_comm(process_set, prefix)

    def reduce(grads: list, variables: list, when: Any = None) -> list:
        n = comm.size() if comm is not None else kolo.size()
        rop, pre, post_ = predivide_scales(op, predivide, post, n)
        keep = [i for i, g in enumerate(grads) if g is not None]
        if not keep:
            return grads
        names = _names(prefix, variables)
        gs = [grads[i] for i in keep]
        ns = [names[i] for i in keep]
        vs = [variables[i] for i in keep]
        if backend == "tensorflow":
            from kolo.tensorflow import gradients as G
            out = G.reduce_gradients(gs, vs, prefix, op=op, compression=compression,
                                     sparse_as_dense=sparse_as_dense,
                                     gradient_predivide_factor=predivide, postscale=post,
                                     process_set=process_set)
        elif backend == "torch":
            out = _torch(gs, ns, rop, pre, post_, compression, process_set)
        elif backend == "jax":
            out = _jax(gs, ns, rop, pre, post_, compression, comm, when)
        else:
            raise NotImplementedError(f"kolo: the Keras backend {backend!r} is not supported "
                                      f"(tensorflow, torch, jax)")
        res = list(grads)
        for i, g in zip(keep, out):
            res[i] = g
        return res
    return reduce


def _torch(gs, ns, op, pre, post, compression, process_set):
    import kolo.torch as kt
    pairs = [compression.compress(g.contiguous()) for g in gs]
    hs = [kt.allreduce_async(c, name=n, op=op, prescale_factor=pre, postscale_factor=post,
                             process_set=process_set)
          for (c, _), n in zip(pairs, ns)]
    return [compression.decompress(kt.synchronize(h), ctx) for h, (_, ctx) in zip(hs, pairs)]


def _jax(gs, ns, op, pre, post, compression, comm, when=None):
    import jax
    from jax.experimental import io_callback
    kop = kolo_op(op)
    pairs = [compression.compress(g) for g in gs]
    sent = [p[0] for p in pairs]

    def send(xs):
        try:
            return wait_all([arrays.allreduce(np.array(x), n, kop, pre, post, comm)
                             for x, n in zip(xs, ns)])
        except kolo.Error as e:  # jax raises it as its own runtime error
            note_callback_error(e)
            raise

    shapes = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in sent]
    if when is None:
        out = io_callback(lambda *xs: send(xs), shapes, *sent, ordered=True)
    else:  # sends only where `when` is true; elsewhere copies back
        out = io_callback(lambda go, *xs: send(xs) if bool(go) else [np.array(x) for x in xs],
                          shapes, when, *sent, ordered=True)
    return [compression.decompress(o, p[1]) for o, p in zip(out, pairs)]
