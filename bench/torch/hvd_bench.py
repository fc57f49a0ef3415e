"""kolo.torch against the C engine and against DDP on gloo.

Run under kolorun, 4 ranks, one torch thread per rank:

    kolorun -np 4 -- .venv/bin/python bench/torch/hvd_bench.py overhead
    kolorun -np 4 -- .venv/bin/python bench/torch/hvd_bench.py step --model comm
    kolorun -np 4 -- .venv/bin/python bench/torch/hvd_bench.py step --model compute

``--json FILE`` also writes the figures there (rank 0), for bench/plot.py.

``overhead``: the 161 gradient tensors of torchvision's ResNet-50 (shapes
built here, no torchvision needed; the
workload of ``kolo-bench fusion``), float32, enqueued every step in backward
order (a) as named ``hvd.allreduce_async_`` calls then ``hvd.synchronize``,
and (b) through ``DistributedOptimizer``'s gradient hooks, fired by a
backward pass whose own cost is measured on this rank alone and subtracted.
Reports ms per step (median over steps of the slowest rank), (c) one plain
allreduce of the same bytes for scale, and the Python layer's cost per
tensor: the time of the loop that enqueues the 161 tensors, divided by 161.
Compare (a) with ``kolo-bench fusion``'s (a), run beside it.

``step``: step time of kolo.torch's DistributedOptimizer and of DDP on gloo
(torch.distributed, same model, batch and data, in the same processes:
gloo's process group is set up through torch's TCPStore on 127.0.0.1), for a communication-bound model (an MLP
of ~25M parameters, batch 8) and a compute-bound one (a small CNN on 32x32
images, batch 64). Interleaves kolo and gloo ``--rounds`` times.
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import kolo.torch as hvd  # noqa: E402


_seq = [0]


def slowest(t):
    """The slowest rank's value of t (every rank calls it, in the same order)."""
    _seq[0] += 1
    x = torch.tensor([t], dtype=torch.float64)
    return hvd.allreduce(x, op=hvd.Max, name=f"slowest.{_seq[0]}").item()


def write_json(args, obj):
    if args.json and hvd.rank() == 0:
        with open(args.json, "w") as f:
            json.dump(obj, f, indent=1)
            f.write("\n")


def resnet50_shapes():
    """(name, shape) of torchvision's ResNet-50 parameters, in its order,
    without torchvision: conv1/bn1, four stages of bottlenecks (3, 4, 6, 3
    blocks; the first block of each with a downsample), fc."""
    out = [("conv1.weight", (64, 3, 7, 7)), ("bn1.weight", (64,)), ("bn1.bias", (64,))]
    cin = 64
    for stage, (blocks, width) in enumerate(((3, 64), (4, 128), (6, 256), (3, 512)), 1):
        for b in range(blocks):
            pre = f"layer{stage}.{b}"
            convs = ((width, cin, 1, 1), (width, width, 3, 3), (width * 4, width, 1, 1))
            for i, shape in enumerate(convs, 1):
                out += [(f"{pre}.conv{i}.weight", shape), (f"{pre}.bn{i}.weight", (shape[0],)),
                        (f"{pre}.bn{i}.bias", (shape[0],))]
            if b == 0:
                out += [(f"{pre}.downsample.0.weight", (width * 4, cin, 1, 1)),
                        (f"{pre}.downsample.1.weight", (width * 4,)),
                        (f"{pre}.downsample.1.bias", (width * 4,))]
            cin = width * 4
    return out + [("fc.weight", (1000, 2048)), ("fc.bias", (1000,))]


def resnet50_grads():
    params = [(n, nn.Parameter(torch.zeros(s))) for n, s in resnet50_shapes()]
    assert len(params) == 161 and sum(p.numel() for _, p in params) == 25557032
    return params


def overhead(args):
    params = resnet50_grads()
    grads = [(n, torch.full_like(p, float(hvd.rank() + 1))) for n, p in params]
    order = list(reversed(grads))  # backward order: fc.bias first
    total = sum(g.numel() for _, g in grads)
    flat = torch.ones(total)

    def plain():
        hvd.barrier()
        t = time.perf_counter()
        hvd.allreduce_(flat, name="plain", op=hvd.Average)
        return time.perf_counter() - t

    enq = []

    def engine():
        hvd.barrier()
        t = time.perf_counter()
        hs = [hvd.allreduce_async_(g, name=n, op=hvd.Average) for n, g in order]
        enq.append(time.perf_counter() - t)
        for h in hs:
            hvd.synchronize(h)
        return time.perf_counter() - t

    # (b) DistributedOptimizer: a model whose parameters have ResNet-50's shapes
    # and whose backward is one cheap elementwise product per parameter.
    class Shapes(nn.Module):
        def __init__(self):
            super().__init__()
            self.ps = nn.ParameterList([nn.Parameter(p.detach().clone()) for _, p in params])

        def forward(self):
            return sum((p * 1e-3).sum() for p in self.ps)

    model = Shapes()
    names = [(n.replace(".", "_"), p) for (n, _), p in zip(params, model.ps)]
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                                   named_parameters=names)

    def optimizer_step():
        hvd.barrier()
        t = time.perf_counter()
        opt.zero_grad()
        model().backward()
        opt.step()
        return time.perf_counter() - t

    local = Shapes()

    def backward_only():
        t = time.perf_counter()
        local.zero_grad()
        local().backward()
        return time.perf_counter() - t

    figs = {}
    for name, fn in (("plain", plain), ("engine", engine), ("optimizer", optimizer_step),
                     ("backward", backward_only)):
        for _ in range(args.warmup):
            fn()
        figs[name] = statistics.median(slowest(fn()) for _ in range(args.iters)) * 1e3
    per_tensor = statistics.median(enq) / 161 * 1e6
    if hvd.rank() == 0:
        print(f"# hvd_bench overhead: 161 ResNet-50 tensors, {total} float32, {hvd.size()} ranks")
        print(f"(c) one allreduce_ of {total * 4 / 1e6:.0f} MB      {figs['plain']:8.2f} ms/step")
        print(f"(a) 161 allreduce_async_ + synchronize  {figs['engine']:8.2f} ms/step")
        print(f"(o) DistributedOptimizer step          {figs['optimizer']:8.2f} ms/step"
              f"   (of which backward alone {figs['backward']:.2f} ms)")
        print(f"a/c = {figs['engine'] / figs['plain']:.3f}   "
              f"(o - backward)/a = {(figs['optimizer'] - figs['backward']) / figs['engine']:.3f}")
        print(f"enqueue cost per tensor: {per_tensor:.1f} us")
    write_json(args, {"bench": "hvd_bench overhead", "ranks": hvd.size(), "tensors": 161,
                      "params": total, "iters": args.iters, "warmup": args.warmup,
                      "median_ms": figs, "enqueue_us_per_tensor": per_tensor})


def step(args):
    import torch.distributed as dist

    torch.manual_seed(0)
    if args.model == "comm":
        def make():
            torch.manual_seed(0)
            return nn.Sequential(nn.Linear(2048, 4096), nn.ReLU(), nn.Linear(4096, 4096),
                                 nn.ReLU(), nn.Linear(4096, 1000))
        x = torch.randn(8, 2048)
        y = torch.randint(0, 1000, (8,))
    else:
        def make():
            torch.manual_seed(0)
            return nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                 nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                 nn.Flatten(), nn.Linear(64 * 8 * 8, 10))
        x = torch.randn(64, 3, 32, 32)
        y = torch.randint(0, 10, (64,))
    nparams = sum(p.numel() for p in make().parameters())
    # gloo through torch's own TCPStore on rank 0 of this host.
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(args.port))
    dist.init_process_group("gloo", rank=hvd.rank(), world_size=hvd.size())

    def run_kolo():
        m = make()
        opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.01),
                                       named_parameters=m.named_parameters())
        hvd.broadcast_parameters(m.state_dict(), root_rank=0)

        def one():
            opt.zero_grad()
            F.cross_entropy(m(x), y).backward()
            opt.step()
        return one

    def run_gloo():
        m = nn.parallel.DistributedDataParallel(make())
        opt = torch.optim.SGD(m.parameters(), lr=0.01)

        def one():
            opt.zero_grad()
            F.cross_entropy(m(x), y).backward()
            opt.step()
        return one

    res = {"kolo": [], "gloo": []}
    for _ in range(args.rounds):
        for name, mk in (("kolo", run_kolo), ("gloo", run_gloo)):
            one = mk()
            for _ in range(args.warmup):
                one()
            hvd.barrier()
            t = time.perf_counter()
            for _ in range(args.iters):
                one()
            res[name].append(slowest((time.perf_counter() - t) / args.iters) * 1e3)
    if hvd.rank() == 0:
        k, g = statistics.median(res["kolo"]), statistics.median(res["gloo"])
        print(f"# hvd_bench step --model {args.model}: {nparams} parameters, batch {x.shape[0]}, "
              f"{hvd.size()} ranks, {torch.get_num_threads()} torch thread(s)")
        print(f"kolo.torch DistributedOptimizer  {k:8.2f} ms/step  (rounds: "
              f"{', '.join(f'{v:.1f}' for v in res['kolo'])})")
        print(f"DDP on gloo                      {g:8.2f} ms/step  (rounds: "
              f"{', '.join(f'{v:.1f}' for v in res['gloo'])})")
        print(f"gloo/kolo = {g / k:.2f}")
        write_json(args, {
            "bench": "hvd_bench step", "model": args.model,
            "model_desc": "MLP" if args.model == "comm" else "CNN",
            "params": nparams, "batch": int(x.shape[0]), "ranks": hvd.size(),
            "torch_threads": torch.get_num_threads(), "iters": args.iters,
            "warmup": args.warmup, "rounds": args.rounds,
            "ms_per_step": res, "median_ms": {"kolo": k, "gloo": g},
            "labels": {"kolo": "kolo.torch DistributedOptimizer", "gloo": "DDP on gloo"}})
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["overhead", "step"])
    ap.add_argument("--model", choices=["comm", "compute"], default="comm")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--port", type=int, default=29512)
    ap.add_argument("--json", help="also write the figures to this file (rank 0)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    hvd.init()
    overhead(args) if args.what == "overhead" else step(args)


if __name__ == "__main__":
    main()
