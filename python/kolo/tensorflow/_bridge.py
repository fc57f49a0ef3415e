"""How TensorFlow tensors reach kolo and come back, without a compiled op.

Measured on TF 2.21 (CPU), 4 MiB float32 (docs/tensorflow.md, "How tensors
travel"): ``EagerTensor._numpy()`` is a zero-copy view (``.numpy()`` copies,
106 µs); ``tf.experimental.dlpack.from_dlpack`` adopts a numpy array
without a copy (1 µs; ``tf.convert_to_tensor`` copies, 236 µs). So in eager
mode inputs go as views and outputs come back through DLPack, from arrays
aligned to 64 bytes (TensorFlow aborts the process on less-aligned memory).
bfloat16, which DLPack cannot name, travels as uint16 and is bitcast.

Inside ``tf.function`` every kolo call is one ``tf.numpy_function``
(stateful; its inputs arrive as views): a call costs about 0.1-0.2 ms
beyond the graph's own, so a training step submits all its gradients in one
call (submit all, then wait). XLA cannot compile a Python function (no
EagerPyFunc kernel on XLA devices), so a call under ``jit_compile=True``
raises :class:`XlaError` when it is traced, naming the way out.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, List, Sequence

import numpy as np
import tensorflow as tf

import kolo
from kolo.common import arrays, util
from kolo.common.elastic import note_callback_error

try:
    from tensorflow.python.ops import control_flow_util as _cfu
except ImportError:  # pragma: no cover - depends on the TF version
    _cfu = None

# TF dtypes kolo carries, by kolo name.
_KOLO_DTYPES = {
    tf.float16: "float16", tf.bfloat16: "bfloat16", tf.float32: "float32",
    tf.float64: "float64", tf.int8: "int8", tf.uint8: "uint8", tf.int32: "int32",
    tf.int64: "int64", tf.bool: "bool",
}
SUPPORTED = "float16, bfloat16, float32, float64, int8, uint8, int32, int64, bool"


class XlaError(RuntimeError):
    """A kolo collective was traced inside an XLA-compiled function."""

    ag_pass_through = True  # autograph re-raises it as it is, not as a StagingError


def check(t: Any, what: str, reduce: str = "") -> None:
    """A dtype kolo carries (bool not for sum, average or product)."""
    dt = t.dtype
    if dt not in _KOLO_DTYPES:
        raise TypeError(f"kolo: {what} has dtype {dt.name}, which kolo does not support "
                        f"(supported: {SUPPORTED})")
    if dt == tf.bool and reduce in ("sum", "average", "product"):
        raise TypeError(f"kolo: {what} is boolean; {reduce} is not defined for it (use Min "
                        f"or Max, or cast it)")


def eager() -> bool:
    return tf.executing_eagerly()


def _in_xla() -> bool:
    if _cfu is None:
        return False
    return bool(_cfu.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()))


_UNNAMED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # graph -> counters


def name(kind: str, given: Any, comm: Any = None) -> str:
    """The operation's name: ``given``, or in eager mode kolo's per-kind
    counter of ``comm`` (unnamed ops in the same order on every rank of
    it), or inside a
    graph ``<kind>.graph.<i>``, i counting this graph's unnamed ops of that
    kind at trace time, so that retracing gives the same names."""
    if given:
        return str(given)
    if eager():
        return util.op_name(kind, None, comm)
    g = tf.compat.v1.get_default_graph()
    counters = _UNNAMED.setdefault(g, {})
    key = (kind, tuple(comm.ranks) if comm is not None else None)  # counted per comm
    i = counters.get(key, 0)
    counters[key] = i + 1
    return f"{kind}.graph.{i}"


def to_numpy(t: Any) -> np.ndarray:
    """An eager tensor (or variable) as a numpy array, without a copy where
    TensorFlow allows."""
    if isinstance(t, tf.Variable):
        t = t.read_value()
    fn = getattr(t, "_numpy", None)
    a = fn() if fn is not None else t.numpy()
    return host(a)


def host(a: Any) -> np.ndarray:
    """What a numpy_function receives, as a writable ndarray (0-d tensors
    arrive as read-only numpy scalars)."""
    if not isinstance(a, np.ndarray) or not a.flags["WRITEABLE"]:
        a = np.array(a)
    return a


def to_tf(a: np.ndarray) -> tf.Tensor:
    """A numpy array (from :func:`kolo.common.arrays.empty`) as an eager
    tensor, adopted without a copy when aligned."""
    if a.ctypes.data % arrays.ALIGN or not a.flags["C_CONTIGUOUS"]:
        return tf.convert_to_tensor(a)
    if a.dtype.name == "bfloat16":
        return tf.bitcast(tf.experimental.dlpack.from_dlpack(a.view(np.uint16).__dlpack__()),
                          tf.bfloat16)
    return tf.experimental.dlpack.from_dlpack(a.__dlpack__())


def call(kind: str, fn: Callable[..., List[np.ndarray]], inputs: Sequence[Any],
         touts: Sequence[tf.DType]) -> List[tf.Tensor]:
    """Runs ``fn(*numpy arrays) -> [numpy arrays]`` on ``inputs``: directly in
    eager mode, as one stateful ``tf.numpy_function`` inside a graph."""
    if eager():
        return [to_tf(o) for o in fn(*[to_numpy(x) for x in inputs])]
    if _in_xla():
        raise XlaError(
            f"kolo: {kind} inside an XLA-compiled function (jit_compile=True): XLA cannot "
            f"run kolo's Python call. Compile without XLA (tf.function(jit_compile=False); "
            f"Keras: model.compile(..., jit_compile=False)), or keep the collective outside "
            f"the compiled function")

    def run(*xs):
        try:
            return fn(*[host(x) for x in xs])
        except kolo.Error as e:  # TensorFlow raises it as an OpError
            note_callback_error(e)
            raise

    outs = tf.numpy_function(run, list(inputs), list(touts), stateful=True,
                             name=f"kolo_{kind}")
    return list(outs) if isinstance(outs, (list, tuple)) else [outs]
