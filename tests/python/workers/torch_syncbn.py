"""hvd.SyncBatchNorm on N ranks against torch's BatchNorm on the ranks'
concatenated batch in one process: outputs, the input's gradient, the
affine parameters' gradients summed over the ranks, and the running statistics after 3 steps, for
BatchNorm1d and 2d inputs; eval mode uses the running statistics."""

import sys

import torch

torch.set_num_threads(1)

import kolo.torch as hvd  # noqa: E402
from _common import Cases, report  # noqa: E402

hvd.init()
R, N = hvd.rank(), hvd.size()
CASES = Cases(pass_case=True)


def batch(shape, step, rank):
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(*shape, generator=g, dtype=torch.float64) * (rank + 1) + rank


def compare(case, shape, make):
    sync = make(hvd.SyncBatchNorm(shape[1]).double())
    ref = make(torch.nn.BatchNorm1d(shape[1]) if len(shape) < 4 else
               torch.nn.BatchNorm2d(shape[1])).double()
    for step in range(3):
        xs = [batch(shape, step, r).requires_grad_() for r in range(N)]
        y = sync(xs[R])
        w = torch.linspace(-1, 1, y.numel(), dtype=torch.float64).view_as(y)
        (y * w).sum().backward()
        full = torch.cat([x.detach() for x in xs]).requires_grad_()
        yr = ref(full)
        (yr * torch.cat([w] * N)).sum().backward()
        rows = shape[0]
        checks = {"output": (y, yr[R * rows:(R + 1) * rows]),
                  "input grad": (xs[R].grad, full.grad[R * rows:(R + 1) * rows]),
                  # The affine parameters' gradients are each rank's share
                  # (DistributedOptimizer adds them up, as in Horovod).
                  "weight grad": (hvd.allreduce(sync.weight.grad, op=hvd.Sum),
                                  ref.weight.grad),
                  "bias grad": (hvd.allreduce(sync.bias.grad, op=hvd.Sum), ref.bias.grad),
                  "running_mean": (sync.running_mean, ref.running_mean),
                  "running_var": (sync.running_var, ref.running_var)}
        for what, (a, b) in checks.items():
            err = float((a - b).abs().max())
            if err > 1e-9:
                return f"step {step}: {what} differs by {err:.3g}"
        sync.zero_grad()
        ref.zero_grad()
    sync.eval()
    ref.eval()
    x = batch(shape, 9, R)
    err = float((sync(x) - ref(x)).abs().max())
    return None if err < 1e-12 else f"eval differs by {err:.3g}"


CASES.run("bn1d", lambda c: compare(c, (5, 3), lambda m: m))
CASES.run("bn2d", lambda c: compare(c, (2, 4, 3, 3), lambda m: m))
report({"cases": CASES.count})
hvd.shutdown()
