"""Backend "kolo" under what torch 2.x builds on a process group (run by
test_ddp_torch2.py): group names, DeviceMesh, functional collectives, FSDP2
(fully_shard), ZeroRedundancyOptimizer, destroy_process_group(group).

Every computation runs twice in the same processes, on the kolo default
group and on a gloo group of the same ranks, and reports both; the test
compares them with each other and with references it computes itself.
``--launcher=env``: initialised from torchrun's environment (test_ddp_torchrun.py)."""

import sys

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

import kolo.torch.distributed  # noqa: F401 - registers backend "kolo"
from _common import report

torch.set_num_threads(1)
N = 12  # elements per functional-collective input: divisible by 2, 3 and 4
STEPS = 4


def fc_input(rank, j=0):
    return torch.arange(N, dtype=torch.float64) * (rank + 1) + 0.25 * j - rank


def functional(pg, size):
    """The functional collectives whose C++ path torch 2.13 routes to a Python group."""
    rank = dist.get_rank()
    x = fc_input(rank)
    out = {
        "all_reduce": funcol.all_reduce(x, "sum", pg),
        "all_reduce_max": funcol.all_reduce(x, "max", pg),
        "broadcast": funcol.broadcast(x, size - 1, pg),
        "all_to_all_single": funcol.all_to_all_single(x, None, None, pg),
    }
    a, b = funcol.all_reduce_coalesced([x, fc_input(rank, 1)], "sum", pg)
    out["all_reduce_coalesced"] = torch.cat([a, b])
    return {k: funcol.wait_tensor(v).tolist() for k, v in out.items()}


def p2p_value(src, dst, k=0):
    return torch.arange(5, dtype=torch.float64) + 100 * src + 10 * dst + k


def p2p(pg, rank, size):
    """Point-to-point on group pg: a ring through batch_isend_irecv, tags
    received out of order, recv from any source, isend/irecv of other dtypes."""
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    got = torch.zeros(5, dtype=torch.float64)
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, p2p_value(rank, nxt), nxt, pg),
                                   dist.P2POp(dist.irecv, got, prv, pg)])
    for r in reqs:
        r.wait()
    out = {"ring": got.tolist()}
    if rank == 0:
        dist.send(p2p_value(0, 1, 5), 1, group=pg, tag=5)
        dist.send(p2p_value(0, 1, 6), 1, group=pg, tag=6)
    elif rank == 1:
        a, b = torch.zeros(5, dtype=torch.float64), torch.zeros(5, dtype=torch.float64)
        w6 = dist.irecv(b, 0, group=pg, tag=6)
        w5 = dist.irecv(a, 0, group=pg, tag=5)
        w6.wait()
        w5.wait()
        out["tags"] = [a.tolist(), b.tolist()]
    if rank == 0:
        seen = []
        for _ in range(size - 1):
            t = torch.zeros(5, dtype=torch.float64)
            src = dist.recv(t, None, group=pg, tag=9)
            seen.append([src, t.tolist()])
        out["any"] = sorted(seen)
    else:
        dist.send(p2p_value(rank, 0), 0, group=pg, tag=9)
    ints = torch.zeros(7, dtype=torch.int64)
    bf = torch.zeros(3, dtype=torch.bfloat16)
    w = [dist.isend(torch.arange(7, dtype=torch.int64) * (rank + 1), nxt, group=pg, tag=1),
         dist.isend(torch.full((3,), rank + 0.5, dtype=torch.bfloat16), nxt, group=pg, tag=2),
         dist.irecv(bf, prv, group=pg, tag=2), dist.irecv(ints, prv, group=pg, tag=1)]
    for x in w:
        x.wait()
    out["dtypes"] = [ints.tolist(), bf.float().tolist()]
    return out


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16),
                               torch.nn.ReLU(), torch.nn.Linear(16, 4))


def batch(step, rank):
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(6, 8, generator=g), torch.randn(6, 4, generator=g)


def full_params(m):
    """The model's parameters, gathered from their shards where sharded."""
    out = []
    for p in m.parameters():
        t = p.full_tensor() if hasattr(p, "full_tensor") else p
        out.append(t.detach().reshape(-1))
    return torch.cat(out).double().tolist()


def fsdp2(mesh, rank):
    from torch.distributed.fsdp import fully_shard
    m = model()
    for layer in m:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(m, mesh=mesh)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    losses, params = [], []
    for s in range(STEPS):
        x, y = batch(s, rank)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(m(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        params.append(full_params(m))
    return {"losses": losses, "params": params}


def zero(pg, rank):
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP
    m = DDP(model(), process_group=pg)
    opt = ZeroRedundancyOptimizer(m.parameters(), optimizer_class=torch.optim.Adam, lr=0.01,
                                  process_group=pg)
    params = []
    for s in range(STEPS):
        x, y = batch(s, rank)
        opt.zero_grad()
        torch.nn.functional.mse_loss(m(x), y).backward()
        opt.step()
        params.append(full_params(m.module))
    return {"params": params}


def main():
    if "--launcher=env" in sys.argv:  # torchrun's env:// and its store
        dist.init_process_group("kolo")
    else:
        dist.init_process_group("kolo", init_method="kolo://")
    rank, size = dist.get_rank(), dist.get_world_size()
    world = dist.group.WORLD
    gloo = dist.new_group(backend="gloo")
    sub = dist.new_group()
    report({"case": "names", "world": world.group_name, "desc": world.group_desc,
            "sub": sub.group_name, "gloo": gloo.group_name,
            "sub_backend": dist.get_backend(sub)})

    kolo_mesh = init_device_mesh("cpu", (size,))
    gloo_mesh = DeviceMesh.from_group(gloo, "cpu")
    report({"case": "mesh", "group_name": kolo_mesh.get_group().group_name,
            "mesh_backend": dist.get_backend(kolo_mesh.get_group()),
            "world": world.group_name})

    for backend, pg, mesh in (("kolo", world, kolo_mesh), ("gloo", gloo, gloo_mesh)):
        tag = {"backend": backend, "rank": rank}
        report({"case": "functional", **tag, **functional(pg, size)})
        report({"case": "p2p", **tag, **p2p(pg, rank, size)})
        report({"case": "fsdp2", **tag, **fsdp2(mesh, rank)})
        report({"case": "zero", **tag, **zero(pg, rank)})

    # A kolo subgroup destroyed on its own: the world goes on.
    x = torch.full((3,), float(rank + 1))
    dist.all_reduce(x, group=sub)
    dist.destroy_process_group(sub)
    try:
        dist.all_reduce(torch.ones(1), group=sub)
        after = "no error"
    except Exception as e:  # noqa: BLE001 - the message is the result
        after = f"{type(e).__name__}: {e}"
    y = torch.full((2,), float(rank))
    dist.all_reduce(y)
    report({"case": "destroy_group", "sum": x.tolist(), "after": after, "world_sum": y.tolist(),
            "thread_alive": sub._thread.is_alive()})
    dist.destroy_process_group()
    report({"case": "done", "rank": rank, "size": size})
    return 0


if __name__ == "__main__":
    sys.exit(main())
