"""Rank 1 raises an exception while the other ranks are in a collective
waiting for it: every rank must end promptly and kolorun exit non-zero.

Each rank reports {"ready": rank} after one good allreduce, rank 1 then
{"raising": time.time()}, and the others {"failed": exception name} when
their allreduce fails."""

import time

import torch

torch.set_num_threads(1)

import kolo.torch as hvd  # noqa: E402
from _common import report  # noqa: E402

hvd.init()
r = hvd.rank()
hvd.allreduce(torch.ones(4), name="warmup")
report({"ready": r})
if r == 1:
    report({"raising": time.time()})
    raise RuntimeError("ops_raise: rank 1 fails on purpose")
try:
    hvd.allreduce(torch.ones(4), name="never-completes")
except Exception as e:
    report({"failed": type(e).__name__, "message": str(e)})
    raise
report({"completed": r})
