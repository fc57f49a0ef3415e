"""Horovod's int handles over kolo handles: an ``*_async`` call registers
an :class:`Op` (the kolo handles of its parts and the function that builds
its output) and returns an int for :func:`poll` and :func:`synchronize`.

Grouped submission is the rule: a binding enqueues every part of a call
(every tensor of a grouped op, every gradient of a step) before it waits on
any, so that kolo's engine sees them in one negotiation and no rank blocks
on one name while its peers wait on another.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, List

import kolo


class Op:
    """What one Horovod handle stands for: the kolo handles of its parts and
    ``finish(results)``, which builds the output once they are all done."""

    __slots__ = ("handles", "finish", "keep")

    def __init__(self, handles: List[kolo.Handle], finish: Callable[[list], Any],
                 keep: tuple = ()):
        self.handles = handles
        self.finish = finish
        self.keep = keep  # buffers that must live until completion

    def done(self) -> bool:
        return all(h.poll() for h in self.handles)

    def wait(self) -> Any:
        return self.finish([h.wait() for h in self.handles])

    def then(self, fn: Callable[[Any], Any]) -> "Op":
        finish = self.finish
        return Op(self.handles, lambda res: fn(finish(res)), self.keep)


def wait_all(ops: List[Op]) -> list:
    """Waits for every op (all were submitted first) and returns their
    outputs in order; the first failure is raised after every op has been
    waited for, so no handle is left pending behind it."""
    out: list = []
    first: BaseException = None  # type: ignore[assignment]
    for op in ops:
        try:
            out.append(op.wait())
        except BaseException as e:  # noqa: BLE001 - re-raised below
            out.append(None)
            if first is None:
                first = e
    if first is not None:
        raise first
    return out


_lock = threading.Lock()
_map: dict = {}
_last = 0


def register(op: Op) -> int:
    global _last
    with _lock:
        _last += 1
        _map[_last] = op
        return _last


def clear() -> None:
    """Forgets every handle (at init, shutdown and after a re-form)."""
    with _lock:
        _map.clear()


def poll(handle: int) -> bool:
    """True once the operation of ``handle`` (from an ``*_async`` call) has
    completed, after which :func:`synchronize` returns without blocking.
    Raises ValueError for a handle that is unknown or already synchronized."""
    with _lock:
        op = _map.get(handle)
    if op is None:
        raise ValueError(f"kolo: handle {handle!r} was not created or has been synchronized")
    return op.done()


def synchronize(handle: Any) -> Any:
    """Waits for the operation of ``handle`` and returns its output,
    releasing the handle. Raises the operation's kolo error. Returns None
    for an unknown handle, as Horovod does; a callable is called."""
    with _lock:
        op = _map.pop(handle, None) if isinstance(handle, int) else None
    if op is None:
        return handle() if callable(handle) else None
    return op.wait()
