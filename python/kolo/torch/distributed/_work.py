"""Works and futures of kolo groups: what torch and its callers wait on."""

from __future__ import annotations

import inspect
import logging
import sys
import threading
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as _c10d

from ._common import _timeout_s

log = logging.getLogger("kolo.torch.distributed")

# The file whose frames call a group's methods: torch >= 2.1 wraps every
# public collective (c10d_logger._exception_logger), so the wrapper's own
# code names another file; unwrap to the function that calls the group.
_C10D_FILE = inspect.unwrap(_c10d.all_reduce).__code__.co_filename


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

    __slots__ = ("name", "handles", "outputs", "finish", "inner", "future", "done", "failure",
                 "results")

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
        self.results: list = []


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
        """The sender of a completed recv (torch's recv from any source)."""
        if not self._op.name.endswith(".recv"):
            raise RuntimeError(f"kolo: source_rank() of {self._op.name}, which is not a recv")
        self.wait()
        return int(self._op.results[0])

    def _source_rank(self) -> int:
        return self.source_rank()


def _called_from_c10d() -> bool:
    """True when the group method was called by torch.distributed's Python
    functions (frame 0: _issue, 1: the method, 2: its caller)."""
    try:
        f = sys._getframe(3)
    except ValueError:
        return False
    return f is not None and f.f_code.co_filename == _C10D_FILE
