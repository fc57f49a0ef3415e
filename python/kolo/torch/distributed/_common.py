"""Reductions, tensors and timeouts: the checks every kolo group operation shares."""

from __future__ import annotations

import datetime
import logging
from typing import Any, Optional, Sequence

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as _c10d

import kolo


log = logging.getLogger("kolo.torch.distributed")

BACKEND = "kolo"
SCHEME = "kolo"

_DEFAULT_TIMEOUT = _c10d.default_pg_timeout


# ---- reductions and tensors -------------------------------------------------

_R = dist.ReduceOp
_OPS = ((_R.SUM, "sum"), (_R.AVG, "average"), (_R.MIN, "min"), (_R.MAX, "max"),
        (_R.PRODUCT, "product"))


def _op_name(op: Any) -> str:
    t = getattr(op, "op", op)
    return getattr(t, "name", str(t))


def _kolo_op(opts: Any) -> str:
    op = getattr(opts, "reduceOp", _R.SUM) if opts is not None else _R.SUM
    for torch_op, name in _OPS:
        if op == torch_op:
            return name
    raise ValueError(f"kolo: ReduceOp.{_op_name(op)} is not supported (kolo reduces with SUM, "
                     f"AVG, MIN, MAX and PRODUCT)")


def _real(t: torch.Tensor) -> torch.Tensor:
    """The tensor kolo moves: complex tensors as their float view."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"kolo: expected a torch.Tensor, got {type(t).__name__}")
    return torch.view_as_real(t) if t.is_complex() else t


def _one(items: Sequence[Any], what: str) -> Any:
    if len(items) != 1:
        raise ValueError(f"kolo: {what} takes one tensor (list) per process, got {len(items)}; "
                         f"kolo runs one device per process")
    return items[0]


def _same(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    if a.dtype != b.dtype or a.numel() != b.numel():
        raise ValueError(f"kolo: {what}: tensor of {b.numel()} {b.dtype} where {a.numel()} "
                         f"{a.dtype} are expected")


def _flat(t: torch.Tensor, what: str, reduce: Optional[str] = None) -> torch.Tensor:
    t = _real(t)
    kolo.buffer(t, what, reduce=reduce)  # device, layout, dtype and contiguity checks
    return t.view(-1)


def _timeout_s(timeout: Any) -> float:
    if isinstance(timeout, datetime.timedelta):
        return max(timeout.total_seconds(), 0.0)
    return float(timeout)


def _kolo_timeout_ms(timeout: Any) -> int:
    """kolo's progress timeout for torch's ``timeout``: 0 (kolo's own
    KOLO_TIMEOUT_MS, 30 s by default) for torch's 30-minute default."""
    if timeout is None or timeout == _DEFAULT_TIMEOUT:
        return 0
    return int(min(max(_timeout_s(timeout) * 1000, 1), 2**31 - 1))


def _wait_bounded(h: kolo.Handle, timeout_s: float, what: str) -> Any:
    """Waits for a handle at most timeout_s (a torch timeout, not kolo's
    progress timeout: an op that waits for a live but absent rank)."""
    if not h.wait_for(timeout_s):
        raise RuntimeError(f"kolo: {what} did not complete within {timeout_s:.0f} s (not every "
                           f"rank took part)")
    return h.wait()


def _again(exc: BaseException, what: str) -> BaseException:
    """A new exception of exc's class (kolo errors keep status and name)."""
    if isinstance(exc, kolo.Error):
        return type(exc)(exc.status, exc.name, f"{what}: {exc.message}")
    return RuntimeError(f"kolo: {what}: {exc}")
