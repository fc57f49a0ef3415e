"""kolo.torch and the DDP backend on CUDA tensors, each result checked on
every rank against a float64 reference computed here from the known inputs.

Usage: cuda_ops.py [cuda|cpu]. ``cuda`` (the default; test_cuda_tensors.py on
the GPU machine) puts every tensor on GPU local_rank % device_count (with one
GPU the ranks share it); ``cpu`` runs the same cases on the CPU, to check the
worker itself where there is no GPU. Each case reports {"case", "ok",
"detail"}; the last report is {"cases": n}.
"""

import sys

import numpy as np
import torch

torch.set_num_threads(1)

import kolo  # noqa: E402
import kolo.torch as hvd  # noqa: E402
import kolo.torch.distributed  # noqa: E402,F401 - registers the backend
import torch.distributed as dist  # noqa: E402
from _common import Cases, report  # noqa: E402

KIND = sys.argv[1] if len(sys.argv) > 1 else "cuda"
hvd.init()
R, N = hvd.rank(), hvd.size()
if KIND == "cuda":
    DEV = torch.device("cuda", hvd.local_rank() % torch.cuda.device_count())
    torch.cuda.set_device(DEV)
else:
    DEV = torch.device("cpu")


def inp(case, rank, n=1000, dtype=torch.float32):
    """Rank ``rank``'s input of ``case`` as float64 numpy: small integers, so
    sums are exact in float32."""
    g = np.random.default_rng([sum(map(ord, case)), rank])
    return g.integers(-8, 9, n).astype(np.float64)


def dev(a, dtype=torch.float32):
    return torch.tensor(a, dtype=dtype).to(DEV)


def same(got, ref, what):
    if got.device != DEV:
        return f"{what}: result on {got.device}, want {DEV}"
    g = got.detach().double().cpu().numpy().reshape(-1)
    ref = np.asarray(ref, dtype=np.float64).reshape(-1)
    if g.shape != ref.shape:
        return f"{what}: {g.shape[0]} elements, want {ref.shape[0]}"
    bad = np.flatnonzero(np.abs(g - ref) > 1e-6 * np.maximum(1.0, np.abs(ref)))
    if bad.size:
        i = bad[0]
        return f"{what}: {bad.size} wrong, first [{i}] {g[i]} != {ref[i]}"
    return None


def c_allreduce():
    ref = sum(inp("ar", r) for r in range(N))
    return (same(hvd.allreduce(dev(inp("ar", R)), op=hvd.Sum, name="c.ar"), ref, "sum") or
            same(hvd.allreduce(dev(inp("ar", R)), op=hvd.Average, name="c.avg"), ref / N,
                 "average"))


def c_allreduce_inplace_prescale():
    t = dev(inp("ip", R))
    hvd.allreduce_(t, op=hvd.Sum, prescale_factor=0.5, postscale_factor=4.0, name="c.ip")
    return same(t, 2.0 * sum(inp("ip", r) for r in range(N)), "allreduce_ prescaled")


def c_grouped():
    ts = [dev(inp(f"g{i}", R, n=100 + i)) for i in range(3)]
    outs = hvd.grouped_allreduce(ts, op=hvd.Sum, name="c.g")
    for i, o in enumerate(outs):
        err = same(o, sum(inp(f"g{i}", r, n=100 + i) for r in range(N)), f"tensor {i}")
        if err:
            return err
    return None


def c_allgather():
    # rank r sends r + 1 rows of 3
    t = dev(inp("ag", R, n=3 * (R + 1))).view(R + 1, 3)
    out = hvd.allgather(t, name="c.ag")
    ref = np.concatenate([inp("ag", r, n=3 * (r + 1)) for r in range(N)])
    return same(out, ref, "allgather") or (
        None if tuple(out.shape) == (sum(r + 1 for r in range(N)), 3) else f"shape {out.shape}")


def c_allgather_empty():
    # rank 0 has no rows: an empty tensor (data_ptr() 0 on CUDA) beside the others' rows
    rows = 0 if R == 0 else R
    t = dev(inp("age", R, n=3 * rows)).view(rows, 3)
    out = hvd.allgather(t, name="c.age")
    ref = np.concatenate([inp("age", r, n=3 * (0 if r == 0 else r)) for r in range(N)])
    return same(out, ref, "allgather with an empty rank") or (
        None if tuple(out.shape) == (sum(range(N)), 3) else f"shape {out.shape}")


def c_broadcast():
    root = N - 1
    t = dev(inp("bc", R))
    hvd.broadcast_(t, root_rank=root, name="c.bc")
    return same(t, inp("bc", root), "broadcast")


def c_alltoall():
    t = dev(inp("a2a", R, n=4 * N)).view(N, 4)  # row j goes to rank j
    out = hvd.alltoall(t, name="c.a2a")
    ref = np.concatenate([inp("a2a", r, n=4 * N)[4 * R:4 * R + 4] for r in range(N)])
    return same(out, ref, "alltoall")


def c_reducescatter():
    t = dev(inp("rs", R, n=6 * N)).view(2 * N, 3)
    out = hvd.reducescatter(t, op=hvd.Sum, name="c.rs")
    full = sum(inp("rs", r, n=6 * N) for r in range(N))
    return same(out, full[6 * R:6 * R + 6], "reducescatter")


def c_stream_order():
    """Work queued on torch's current (side) stream just before the
    allreduce, behind a long kernel, must be what kolo reduces: kolo waits
    for the stream, not for the host."""
    if KIND != "cuda":
        return same(hvd.allreduce(dev(np.full(64, R + 1.0)), op=hvd.Sum, name="c.so"),
                    np.full(64, N * (N + 1) / 2), "stream order")
    s = torch.cuda.Stream(device=DEV)
    with torch.cuda.stream(s):
        t = torch.zeros(1 << 20, device=DEV)
        torch.cuda._sleep(100_000_000)  # ~50 ms of GPU time before the fill
        t.fill_(R + 1.0)
        h = hvd.allreduce_async(t, op=hvd.Sum, name="c.so")
    out = hvd.synchronize(h)
    torch.cuda.synchronize()
    return same(out, np.full(1 << 20, N * (N + 1) / 2), "stream order")


def c_ddp():
    """Two steps of DDP(device_ids) on the kolo backend against the same
    training on one process over the whole batch."""
    torch.manual_seed(7)
    ref_model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 1))
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 1))
    model.load_state_dict(ref_model.state_dict())
    model = model.to(DEV)
    if not dist.is_initialized():
        dist.init_process_group("kolo", init_method="kolo://")
    ddp = torch.nn.parallel.DistributedDataParallel(
        model, device_ids=[DEV.index] if KIND == "cuda" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref_model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(11)
    for _step in range(2):
        x = torch.randn(4 * N, 6, generator=g)
        y = torch.randn(4 * N, 1, generator=g)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x[4 * R:4 * R + 4].to(DEV)),
                                            y[4 * R:4 * R + 4].to(DEV))
        loss.backward()
        opt.step()
        ref_opt.zero_grad()
        torch.nn.functional.mse_loss(ref_model(x), y).backward()
        ref_opt.step()
    got = torch.cat([p.detach().reshape(-1).double().cpu() for p in model.parameters()])
    ref = torch.cat([p.detach().reshape(-1).double() for p in ref_model.parameters()])
    err = (got - ref).abs().max().item()
    return None if err < 1e-5 else f"DDP parameters differ from the reference by {err}"


cases = Cases()
for name, fn in [("allreduce", c_allreduce), ("allreduce_ prescale", c_allreduce_inplace_prescale),
                 ("grouped_allreduce", c_grouped), ("allgather", c_allgather),
                 ("allgather, one rank empty", c_allgather_empty), ("broadcast", c_broadcast), ("alltoall", c_alltoall),
                 ("reducescatter", c_reducescatter), ("stream order", c_stream_order),
                 ("ddp", c_ddp)]:
    cases.run(name, fn)
report({"cases": cases.count, "device": str(DEV), "cuda_supported": kolo.cuda_supported()})
if dist.is_initialized():
    dist.destroy_process_group()
