"""Every collective of the kolo c10d backend next to the same call on gloo.

Under kolorun the default group is kolo (kolo://) and a gloo group of the
same ranks is made with new_group(backend="gloo") (its rendezvous goes
through KoloStore's set/get, i.e. the rendezvous server's KV store); with
--launcher env (torchrun) the default group is kolo over env://. For
every case and dtype each rank reports what kolo and gloo computed (or the
error they raised); the test recomputes the inputs (ddp_common.case_input),
compares kolo with a float64 numpy reference and with gloo."""

import argparse

import torch
import torch.distributed as dist

import kolo.torch.distributed  # noqa: F401 - registers the backend
from _common import report
from ddp_common import DTYPES, N, OPS, as_list, case_input, seed_of

p = argparse.ArgumentParser()
p.add_argument("--launcher", default="kolorun", choices=["kolorun", "env"])
args = p.parse_args()
torch.set_num_threads(1)

if args.launcher == "kolorun":
    dist.init_process_group("kolo", init_method="kolo://")
else:  # torchrun: env://, kolo bootstrapped through torch's TCPStore
    dist.init_process_group("kolo")
rank, size = dist.get_rank(), dist.get_world_size()
gloo = dist.new_group(backend="gloo")
GROUPS = {"kolo": None, "gloo": gloo}
dt = {d: getattr(torch, d) for d in DTYPES}


def both(fn):
    out = {}
    for b, g in GROUPS.items():
        try:
            out[b] = fn(g)
        except Exception as e:  # noqa: BLE001 - the error is the result
            out[b] = {"error": f"{type(e).__name__}: {e}".splitlines()[0][:400]}
    return out


def inp(name, d, r=None, n=N, j=0):
    return case_input(torch, d, rank if r is None else r, seed_of(name, d) + 7919 * j, n)


def case(name, d, fn):
    report({"case": name, "dtype": d, "rank": rank, "size": size, **both(fn)})


for d in DTYPES:
    for op in OPS:
        def allreduce(g, op=op):
            y = inp(f"allreduce.{op}", d).clone()
            dist.all_reduce(y, op=getattr(dist.ReduceOp, op), group=g)
            return as_list(y)
        case(f"allreduce.{op}", d, allreduce)

    def allreduce_async(g):
        y = inp("allreduce_async", d).clone()
        w = dist.all_reduce(y, op=dist.ReduceOp.MAX, group=g, async_op=True)
        w.wait()
        return as_list(y)
    case("allreduce_async", d, allreduce_async)

    def broadcast(g):
        y = inp("broadcast", d).clone()
        dist.broadcast(y, src=size - 1, group=g)
        return as_list(y)
    case("broadcast", d, broadcast)

    def all_gather(g):
        outs = [torch.empty(N, dtype=dt[d]) for _ in range(size)]
        dist.all_gather(outs, inp("all_gather", d), group=g)
        return [as_list(o) for o in outs]
    case("all_gather", d, all_gather)

    def all_gather_into_tensor(g):
        out = torch.empty(size * N, dtype=dt[d])
        dist.all_gather_into_tensor(out, inp("all_gather_into_tensor", d), group=g)
        return as_list(out)
    case("all_gather_into_tensor", d, all_gather_into_tensor)

    def reduce_scatter(g):
        out = torch.empty(N, dtype=dt[d])
        dist.reduce_scatter(out, [inp("reduce_scatter", d, j=j) for j in range(size)], group=g)
        return as_list(out)
    if d != "bool":
        case("reduce_scatter", d, reduce_scatter)

    def reduce_scatter_tensor(g):
        out = torch.empty(N, dtype=dt[d])
        x = torch.cat([inp("reduce_scatter_tensor", d, j=j) for j in range(size)])
        dist.reduce_scatter_tensor(out, x, op=dist.ReduceOp.MAX, group=g)
        return as_list(out)
    case("reduce_scatter_tensor", d, reduce_scatter_tensor)

    def all_to_all_single(g):
        x = inp("all_to_all_single", d, n=2 * size)
        out = torch.empty(2 * size, dtype=dt[d])
        dist.all_to_all_single(out, x, group=g)
        return as_list(out)
    case("all_to_all_single", d, all_to_all_single)

    def all_to_all_single_uneven(g):
        # rank r sends (r + j) % 3 + 1 rows of 2 to rank j (and gets as many back)
        send = [(rank + j) % 3 + 1 for j in range(size)]
        x = inp("all_to_all_single_uneven", d, n=2 * sum(send)).view(-1, 2)
        out = torch.empty(sum(send), 2, dtype=dt[d])
        dist.all_to_all_single(out, x, output_split_sizes=send, input_split_sizes=send, group=g)
        return as_list(out)
    case("all_to_all_single_uneven", d, all_to_all_single_uneven)

    def all_to_all(g):
        # rank r sends rank j a tensor of r + 1 elements
        ins = [inp("all_to_all", d, n=rank + 1, j=j) for j in range(size)]
        outs = [torch.empty(j + 1, dtype=dt[d]) for j in range(size)]
        dist.all_to_all(outs, ins, group=g)
        return [as_list(o) for o in outs]
    case("all_to_all", d, all_to_all)

    def reduce(g):
        y = inp("reduce", d).clone()
        dist.reduce(y, dst=1 % size, op=dist.ReduceOp.MIN, group=g)
        return as_list(y) if rank == 1 % size else None
    case("reduce", d, reduce)

    def gather(g):
        outs = [torch.empty(N, dtype=dt[d]) for _ in range(size)] if rank == 0 else None
        dist.gather(inp("gather", d), outs, dst=0, group=g)
        return [as_list(o) for o in outs] if rank == 0 else None
    case("gather", d, gather)

    def scatter(g):
        out = torch.empty(N, dtype=dt[d])
        src = size - 1
        ins = [inp("scatter", d, j=j) for j in range(size)] if rank == src else None
        dist.scatter(out, ins, src=src, group=g)
        return as_list(out)
    case("scatter", d, scatter)

    def coalesced(g):
        a, b = inp("coalesced", d, j=0).clone(), inp("coalesced", d, n=3, j=1).clone()
        dist.all_reduce_coalesced([a, b], op=dist.ReduceOp.MAX, group=g)
        return [as_list(a), as_list(b)]
    case("all_reduce_coalesced", d, coalesced)


def objects(g):
    got = [None] * size
    dist.all_gather_object(got, {"rank": rank, "s": "x" * (rank + 1)}, group=g)
    b = [{"from": rank, "list": list(range(rank + 3))}, rank * 10]
    dist.broadcast_object_list(b, src=size - 1, group=g)
    gathered = [None] * size if rank == 0 else None
    dist.gather_object(("g", rank), gathered, dst=0, group=g)
    mine = [None]
    src = size - 1
    dist.scatter_object_list(mine, [{"to": j} for j in range(size)] if rank == src else None,
                             src=src, group=g)
    return [got, b, gathered, mine[0]]


case("objects", "none", objects)


def barrier(g):
    dist.barrier(group=g)
    return True


case("barrier", "none", barrier)


def refused():
    """What must be refused clearly; each entry is the error text."""
    out = {}
    tries = {
        "BAND": lambda: dist.all_reduce(torch.ones(3, dtype=torch.int32),
                                        op=dist.ReduceOp.BAND),
        "BXOR": lambda: dist.all_reduce(torch.ones(3, dtype=torch.int32),
                                        op=dist.ReduceOp.BXOR),
        "int16": lambda: dist.all_reduce(torch.ones(3, dtype=torch.int16)),
        "noncontiguous": lambda: dist.all_reduce(torch.ones(3, 2).t()),
        "bool_sum": lambda: dist.all_reduce(torch.ones(3, dtype=torch.bool)),
    }
    for k, fn in tries.items():
        try:
            fn()
            out[k] = None
        except Exception as e:  # noqa: BLE001
            out[k] = f"{type(e).__name__}: {e}".splitlines()[0][:300]
    # The group still works after every refusal (nothing was enqueued).
    y = torch.full((2,), float(rank))
    dist.all_reduce(y)
    out["after"] = y.tolist()
    full = dist.new_group(list(range(size)))
    z = torch.ones(1)
    dist.all_reduce(z, group=full)
    out["full_new_group"] = [z.item(), dist.get_backend(full)]
    # A subgroup of the first and last ranks: a kolo comm of its own.
    sub = dist.new_group([0, size - 1])
    w = torch.full((1,), float(rank + 1))
    if rank in (0, size - 1):
        dist.all_reduce(w, group=sub)
    out["subgroup"] = w.item()
    return out


report({"case": "refused", "rank": rank, "size": size, "errors": refused(),
        "backend": dist.get_backend(), "pg": repr(dist.distributed_c10d._get_default_group())})
dist.destroy_process_group()
