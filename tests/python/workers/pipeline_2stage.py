"""Worker of test_pipelining.py (2 ranks under kolorun): a two-stage
torch.distributed.pipelining schedule (GPipe and 1F1B, 4 microbatches) on a
kolo group and on a gloo group of the same ranks. Each rank holds one stage
of the same seeded model; every step reports the loss (last stage) and the
stage's parameters, which the test compares across backends and with
single-process training of the whole model on the whole batch."""

import sys

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

import kolo.torch.distributed  # noqa: F401 - registers backend "kolo"
from _common import report

D, BATCH, MICRO, STEPS, LR = 16, 8, 4, 3, 0.1


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(D, D), torch.nn.Tanh(), torch.nn.Linear(D, D),
                               torch.nn.Tanh(), torch.nn.Linear(D, 1))


def batch(step):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(BATCH, D, generator=g), torch.randn(BATCH, 1, generator=g)


def stage_of(full, rank):
    return full[:2] if rank == 0 else full[2:]


def loss_fn(out, target):
    return torch.nn.functional.mse_loss(out, target, reduction="sum")


def train(backend, group, rank, kind):
    mod = stage_of(model(), rank)
    stage = PipelineStage(mod, rank, 2, torch.device("cpu"), group=group)
    cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[kind]
    sched = cls(stage, n_microbatches=MICRO, loss_fn=loss_fn)
    opt = torch.optim.SGD(mod.parameters(), lr=LR)
    for step in range(STEPS):
        x, y = batch(step)
        opt.zero_grad()
        losses = []
        if rank == 0:
            sched.step(x)
        else:
            sched.step(target=y, losses=losses)
        opt.step()
        report({"case": kind, "backend": backend, "rank": rank, "step": step,
                "loss": float(sum(l.detach() for l in losses)) if losses else None,
                "params": [p.detach().flatten().tolist() for p in mod.parameters()]})


def main():
    dist.init_process_group("kolo", init_method="kolo://")
    rank = dist.get_rank()
    assert dist.get_world_size() == 2
    gloo = dist.new_group(backend="gloo")
    for kind in ("gpipe", "1f1b"):
        for backend, group in (("kolo", dist.group.WORLD), ("gloo", gloo)):
            train(backend, group, rank, kind)
            dist.barrier(group=gloo)
    dist.destroy_process_group()
    report({"case": "done", "rank": rank})
    return 0


if __name__ == "__main__":
    sys.exit(main())
