"""``broadcast_object`` and ``allgather_object`` for every binding: the
object is pickled (with cloudpickle when it is installed, as Horovod does,
so that lambdas and local classes travel too; plain pickle otherwise), and
its size, then its bytes travel as ctypes arrays, so no framework (and not
numpy) is needed. Only ranks of one job, which already trust each other,
ever unpickle them. Every rank calls each function, in the same order, with
the same ``name`` or all without one (unnamed calls are numbered in call
order).
"""

from __future__ import annotations

import ctypes
import io
import pickle
from typing import Any, Callable, List, Optional

import kolo

from . import util

try:  # as Horovod: objects that plain pickle refuses (lambdas, local classes)
    import cloudpickle as _pickler
except ImportError:  # pragma: no cover - depends on the environment
    _pickler = pickle


def dumps(obj: Any) -> bytes:
    b = io.BytesIO()
    _pickler.dump(obj, b)
    return b.getvalue()


def loads(data: bytes) -> Any:
    return pickle.loads(data)


def broadcast_object(obj: Any, root_rank: int = 0, name: Optional[str] = None,
                     comm: Optional[kolo.Comm] = None) -> Any:
    """Returns rank ``root_rank``'s ``obj`` on every rank (the others' ``obj``
    is ignored, and may be None). With ``comm`` (a process set's), over its
    members; ``root_rank`` stays a rank of the job, as in Horovod."""
    root_rank = util.set_root(root_rank, comm, "broadcast_object")
    name = util.op_name("broadcast_object", name, comm)
    is_root = (comm.rank() if comm is not None else kolo.rank()) == root_rank
    data = dumps(obj) if is_root else b""
    size = (ctypes.c_int64 * 1)(len(data))
    kolo.broadcast_async(size, root_rank, name + ".sz", comm=comm).wait()
    buf = (ctypes.c_uint8 * int(size[0])).from_buffer_copy(data) if is_root else \
        (ctypes.c_uint8 * int(size[0]))()
    kolo.broadcast_async(buf, root_rank, name + ".t", comm=comm).wait()
    return obj if is_root else loads(bytes(buf))


def broadcast_object_fn(root_rank: int = 0, name: Optional[str] = None) -> Callable:
    """Horovod's decorator: ``fn`` runs on ``root_rank`` only, and its result
    is broadcast to every rank (which all call the decorated function)."""
    def wrap(fn: Callable) -> Callable:
        def run(*args: Any, **kwargs: Any) -> Any:
            result = fn(*args, **kwargs) if kolo.rank() == root_rank else None
            return broadcast_object(result, root_rank, name or getattr(fn, "__name__", None))
        return run
    return wrap


def allgather_object(obj: Any, name: Optional[str] = None) -> List[Any]:
    """Returns the list of every rank's ``obj``, in rank order."""
    data = dumps(obj)
    name = util.op_name("allgather_object", name)
    send = (ctypes.c_uint8 * len(data)).from_buffer_copy(data) if data else \
        (ctypes.c_uint8 * 0)()
    raw, counts = kolo.allgather_async(send, lambda n: (ctypes.c_uint8 * n)(),
                                       name=name + ".t").wait()
    raw = bytes(raw)
    out, at = [], 0
    for n in counts:
        out.append(loads(raw[at:at + n]))
        at += n
    return out
