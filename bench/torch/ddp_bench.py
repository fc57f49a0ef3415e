"""DistributedDataParallel on kolo against DDP on gloo, in one run.

    kolorun -np 4 -- .venv/bin/python bench/torch/ddp_bench.py [--rounds 3] [--json out.json]

Every rank makes the default process group on kolo (``kolo://``) and a gloo
group of the same ranks (``new_group(backend="gloo")``), one torch thread
per rank, and runs the same code on each group, interleaved ``--rounds``
times (kolo, gloo, kolo, gloo, ...), so both see the same machine load:

* ``allreduce``: ``dist.all_reduce`` of 64 MiB of float32; bus bandwidth
  busbw = bytes * 2(n-1)/n / time (nccl-tests' definition);
* ``ddp comm``: step time of DDP (forward, backward with the gradient
  allreduces, SGD step) for a communication-bound model: an MLP of ~25M
  parameters with a batch of 8;
* ``ddp compute``: the same for a compute-bound model, a small CNN on 32x32
  images, batch 64;
* ``ddp view``: ``ddp comm`` with ``gradient_as_bucket_view=True``: the
  gradients live in DDP's buckets, so DDP copies nothing into or out of them;
* ``fsdp2 comm``: FSDP2 (``fully_shard`` per Linear layer and at the root, on
  a DeviceMesh of the group) training the MLP: parameters all-gathered in
  forward and backward, gradients reduce-scattered;
* ``limit``: the MLP's step without communication (DDP under ``no_sync``)
  plus one ``dist.all_reduce`` of all its gradients. When the ranks
  outnumber the CPUs, backward takes every CPU and the reductions need CPUs
  too, so no overlap can beat their sum: the physical limit of ``ddp comm``.

Times are the slowest rank's median per round, then the median over rounds.
Under torchrun (``--launcher env``) the default group is kolo over env://.
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import kolo.torch.distributed  # noqa: E402,F401 - registers the backend


def comm_model():
    """~25M parameters (float32: ~100 MB of gradients per step)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(),
                         nn.Linear(4096, 1024), nn.ReLU(), nn.Linear(1024, 10))


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.c1 = nn.Conv2d(3, 32, 3, padding=1)
        self.c2 = nn.Conv2d(32, 64, 3, padding=1)
        self.fc = nn.Linear(64 * 8 * 8, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.c1(x)), 2)
        x = F.max_pool2d(F.relu(self.c2(x)), 2)
        return self.fc(x.flatten(1))


def slowest(t):
    x = torch.tensor([t], dtype=torch.float64)
    dist.all_reduce(x, op=dist.ReduceOp.MAX)
    return x.item()


def bench_allreduce(group, iters, nbytes):
    t = torch.ones(nbytes // 4, dtype=torch.float32)
    dist.all_reduce(t, group=group)  # warm-up (connections, buffers)
    times = []
    for _ in range(iters):
        dist.barrier(group=group)
        t0 = time.perf_counter()
        dist.all_reduce(t, group=group)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def fsdp2(model, group):
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard
    mesh = DeviceMesh.from_group(group or dist.group.WORLD, "cpu")
    for m in model:
        if isinstance(m, nn.Linear):
            fully_shard(m, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def bench_ddp(group, make, batch, steps, kind="ddp"):
    model = make()
    if kind == "fsdp2":
        ddp = fsdp2(model, group)
    else:
        ddp = torch.nn.parallel.DistributedDataParallel(
            model, process_group=group, gradient_as_bucket_view=kind == "view")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(dist.get_rank())
    x = torch.randn(*batch, generator=g)
    y = torch.randint(0, 10, (batch[0],), generator=g)
    times = []
    for s in range(steps + 1):
        dist.barrier(group=group)
        t0 = time.perf_counter()
        opt.zero_grad()
        if kind == "nosync":
            with ddp.no_sync():
                F.cross_entropy(ddp(x), y).backward()
        else:
            F.cross_entropy(ddp(x), y).backward()
        opt.step()
        if s:  # the first step builds the buckets
            times.append(time.perf_counter() - t0)
    return statistics.median(times), sum(p.numel() for p in model.parameters())


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--iters", type=int, default=5, help="allreduces per round")
    p.add_argument("--steps", type=int, default=5, help="DDP steps per round")
    p.add_argument("--mib", type=int, default=64)
    p.add_argument("--launcher", default="kolorun", choices=["kolorun", "env"])
    p.add_argument("--json", help="also write the figures here (rank 0)")
    args = p.parse_args()
    torch.set_num_threads(1)
    if args.launcher == "kolorun":
        dist.init_process_group("kolo", init_method="kolo://")
    else:
        dist.init_process_group("kolo")
    n, rank = dist.get_world_size(), dist.get_rank()
    groups = {"kolo": None, "gloo": dist.new_group(backend="gloo")}
    nbytes = args.mib << 20
    res = {b: {"allreduce_s": [], "comm_s": [], "view_s": [], "compute_s": [], "fsdp2_s": [],
               "limit_s": []} for b in groups}
    params = {}
    for r in range(args.rounds):
        for b, g in groups.items():
            res[b]["allreduce_s"].append(slowest(bench_allreduce(g, args.iters, nbytes)))
            t, params["comm"] = bench_ddp(g, comm_model, (8, 1024), args.steps)
            res[b]["comm_s"].append(slowest(t))
            t, _ = bench_ddp(g, comm_model, (8, 1024), args.steps, "view")
            res[b]["view_s"].append(slowest(t))
            t, params["compute"] = bench_ddp(g, SmallCNN, (64, 3, 32, 32), args.steps)
            res[b]["compute_s"].append(slowest(t))
            t, _ = bench_ddp(g, comm_model, (8, 1024), args.steps, "fsdp2")
            res[b]["fsdp2_s"].append(slowest(t))
            t, _ = bench_ddp(g, comm_model, (8, 1024), args.steps, "nosync")
            res[b]["limit_s"].append(slowest(t) + slowest(
                bench_allreduce(g, args.iters, params["comm"] * 4)))
        if rank == 0:
            print(f"round {r + 1}/{args.rounds}: " + "; ".join(
                f"{b} allreduce {v['allreduce_s'][-1] * 1e3:.0f} ms, comm step "
                f"{v['comm_s'][-1] * 1e3:.0f} ms, bucket view {v['view_s'][-1] * 1e3:.0f} ms, "
                f"compute step {v['compute_s'][-1] * 1e3:.1f} ms, "
                f"fsdp2 step {v['fsdp2_s'][-1] * 1e3:.0f} ms, limit {v['limit_s'][-1] * 1e3:.0f} ms"
                for b, v in res.items()), flush=True)
    if rank == 0:
        med = {b: {k: statistics.median(v) for k, v in d.items()} for b, d in res.items()}
        busbw = {b: nbytes * 2 * (n - 1) / n / med[b]["allreduce_s"] / 1e9 for b in med}
        print(f"\n{n} ranks, 1 torch thread each, median of {args.rounds} interleaved rounds "
              f"(each the slowest rank's median)")
        print(f"{'':42s} {'kolo':>10s} {'gloo':>10s} {'kolo/gloo':>10s}")
        print(f"{'allreduce ' + str(args.mib) + ' MiB f32 time (ms)':42s} "
              f"{med['kolo']['allreduce_s'] * 1e3:10.1f} {med['gloo']['allreduce_s'] * 1e3:10.1f} "
              f"{med['kolo']['allreduce_s'] / med['gloo']['allreduce_s']:10.2f}")
        print(f"{'allreduce busbw (GB/s)':42s} {busbw['kolo']:10.2f} {busbw['gloo']:10.2f} "
              f"{busbw['kolo'] / busbw['gloo']:10.2f}")
        for k, label in (("comm", f"DDP step, MLP {params['comm'] / 1e6:.1f}M params, batch 8"),
                         ("view", "the same, gradient_as_bucket_view=True"),
                         ("compute", f"DDP step, CNN {params['compute'] / 1e3:.0f}k params, b 64"),
                         ("fsdp2", "FSDP2 step, the MLP, batch 8"),
                         ("limit", "limit: MLP no_sync step + allreduce")):
            a, b = med["kolo"][f"{k}_s"], med["gloo"][f"{k}_s"]
            print(f"{label + ' (ms)':42s} {a * 1e3:10.1f} {b * 1e3:10.1f} {a / b:10.2f}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"bench": "ddp_bench", "ranks": n, "rounds": res, "median": med,
                           "busbw_GBps": busbw, "params": params, "mib": args.mib,
                           "batch": {"comm": 8, "compute": 64}, "steps": args.steps,
                           "iters": args.iters, "torch_threads": torch.get_num_threads()},
                          f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
