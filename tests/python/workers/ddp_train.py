"""DDP training on kolo and on gloo, in one process, from the same seed and data.

    ddp_train.py [--launcher kolorun|env] [--mode plain|join] [--steps S] [--batch B]

kolorun: the default group is kolo (kolo://) and gloo a new_group of every
rank. env (torchrun): the default group is kolo over env:// (bootstrapped
through torch's TCPStore) and gloo a new_group again. Each rank reports, per
backend, its loss at every step and three projections of the parameters
after every step (identical on every rank when DDP works); rank 0 also
reports all the parameters after every step, one line per step; the test compares them with gloo and with a
single-process reference (ddp_common). In join mode rank r has steps + r
batches and trains inside DDP's join() context."""

import argparse
import os

import torch
import torch.distributed as dist

import kolo.torch.distributed  # noqa: F401 - registers the backend
from _common import report
from ddp_common import dataset, flat_params, make_model, project, shard

p = argparse.ArgumentParser()
p.add_argument("--launcher", default="kolorun", choices=["kolorun", "env"])
p.add_argument("--mode", default="plain", choices=["plain", "join"])
p.add_argument("--optimizer", default="sgd", choices=["sgd", "zero"],
               help="zero: torch's ZeroRedundancyOptimizer over SGD (sharded state, broadcasts)")
p.add_argument("--steps", type=int, default=6)
p.add_argument("--batch", type=int, default=24)
p.add_argument("--hidden", type=int, default=16)
p.add_argument("--reinit", action="store_true",
               help="then destroy the group, make it again and allreduce once more")
p.add_argument("--reinit-port", type=int, default=0,
               help="env://: MASTER_PORT of the second group (torch 1.13 cannot reopen "
                    "rank 0's TCPStore on the same port reliably, whatever the backend)")
args = p.parse_args()
torch.set_num_threads(1)

if args.launcher == "kolorun":
    dist.init_process_group("kolo", init_method="kolo://")
else:
    dist.init_process_group("kolo")
rank, size = dist.get_rank(), dist.get_world_size()
gloo = dist.new_group(backend="gloo")
x_all, y_all = (torch.from_numpy(a) for a in dataset())
n = len(y_all)


def projections(model):
    return project(flat_params(torch, model))


def train(group):
    model = make_model(torch, seed=0, hidden=args.hidden)
    ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=group)
    if args.optimizer == "zero":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD,
                                      process_group=group, lr=0.1, momentum=0.9)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    steps = args.steps + (rank if args.mode == "join" else 0)
    losses, projs = [], []
    name = "kolo" if group is None else "gloo"

    def step(s):
        idx = shard(s, rank, size, args.batch, n)
        loss = torch.nn.functional.cross_entropy(ddp(x_all[idx]), y_all[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        projs.append(projections(model))
        if rank == 0:  # one line per step: kolorun splits lines longer than 64 KiB
            report({"backend": name, "step": s, "params": flat_params(torch, model)})

    if args.mode == "join":
        with ddp.join():
            for s in range(steps):
                step(s)
    else:
        for s in range(steps):
            step(s)
    out = {"losses": losses, "projections": projs, "final": projections(model)}
    if args.optimizer == "zero":  # gathers every rank's shard of the state on rank 0
        opt.consolidate_state_dict(to=0)
        if rank == 0:
            st = opt.state_dict()["state"]
            out["zero_state"] = sorted(int(k) for k in st)
            out["zero_momentum"] = torch.cat([st[k]["momentum_buffer"].reshape(-1).double()
                                              for k in sorted(st)]).tolist()
    return out


for backend, group in (("kolo", None), ("gloo", gloo)):
    report({"backend": backend, "rank": rank, "size": size, "mode": args.mode,
            "pg": dist.get_backend(group), **train(group)})
dist.destroy_process_group()
if args.reinit:  # a new kolo comm (env://: bootstrapped again through the store)
    if args.reinit_port:
        os.environ["MASTER_PORT"] = str(args.reinit_port)
    dist.init_process_group("kolo", init_method="kolo://" if args.launcher == "kolorun" else None)
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    report({"rank": rank, "reinit": t.item(), "size": dist.get_world_size()})
    dist.destroy_process_group()
