"""Horovod's ``hvd.SyncBatchNorm``: batch normalization whose statistics are
those of the whole batch, over every rank (or a process set).

In training each rank sums its elements, their squares and their count per
channel (in float64), one allreduce adds them up, and every rank normalizes
with the global mean and (biased) variance; the running statistics take the
global mean and the unbiased variance, as torch's BatchNorm does on the
concatenated batch. The allreduce is kolo.torch's differentiable one (its
gradient is the allreduce of the gradients), so backward needs nothing more.
In eval mode, or on one rank, it is torch's batch norm.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from . import mpi_ops
from .mpi_ops import global_process_set


class SyncBatchNorm(_BatchNorm):
    """``torch.nn.BatchNorm{1,2,3}d`` over the whole job's batch; the
    arguments are BatchNorm's plus Horovod's ``process_set``."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: Optional[float] = 0.1,
                 affine: bool = True, track_running_stats: bool = True, device: Any = None,
                 dtype: Any = None, process_set: Any = global_process_set):
        super().__init__(num_features, eps, momentum, affine, track_running_stats,
                         device=device, dtype=dtype)
        self.process_set = process_set

    def _check_input_dim(self, input: torch.Tensor) -> None:  # noqa: A002 - torch's name
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def _momentum(self) -> float:
        if self.momentum is not None:
            return self.momentum
        return 1.0 / float(self.num_batches_tracked)  # a cumulative moving average

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002 - torch's name
        self._check_input_dim(input)
        synced = self.training and mpi_ops._size(mpi_ops._ps(self.process_set,
                                                             "SyncBatchNorm")) > 1
        if not synced:
            return super().forward(input)
        if self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
        c = input.shape[1]
        dims = [d for d in range(input.dim()) if d != 1]
        x = input.double()
        count = torch.full((1,), float(input.numel() // c), dtype=torch.float64)
        stats = torch.cat([x.sum(dims), (x * x).sum(dims), count])
        stats = mpi_ops.allreduce(stats, op=mpi_ops.Sum, name=None,
                                  process_set=self.process_set)
        n = stats[2 * c]
        mean = stats[:c] / n
        var = (stats[c:2 * c] / n - mean * mean).clamp_min(0)
        if self.track_running_stats:
            m = self._momentum()
            with torch.no_grad():
                self.running_mean.mul_(1 - m).add_(m * mean.to(self.running_mean.dtype))
                unbiased = var * n / (n - 1) if n > 1 else var
                self.running_var.mul_(1 - m).add_(m * unbiased.to(self.running_var.dtype))
        shape = [1, c] + [1] * (input.dim() - 2)
        y = (x - mean.view(shape)) * torch.rsqrt(var.view(shape) + self.eps)
        y = y.to(input.dtype)
        if self.affine:
            y = y * self.weight.view(shape) + self.bias.view(shape)
        return y


__all__ = ["SyncBatchNorm"]
