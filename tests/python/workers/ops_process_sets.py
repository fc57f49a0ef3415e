"""kolo.torch's process sets (Horovod's hvd.add_process_set and process_set=),
checked on each rank against float64 numpy references computed from every
member's input.

Usage: ops_process_sets.py SEED. Each rank regenerates every rank's input
from (SEED, case, rank). Sets: the even ranks, the odd ranks (disjoint), the
first two, and every rank but the last (overlapping the others, leaving the
last rank out). Ops on several sets and on the global set run at the same
time with the same name. A rank outside a set checks that an op on it
raises. Reports {"case", "ok", "detail"} per case, then {"cases": n}.
"""

import sys
import zlib

import numpy as np
import torch

torch.set_num_threads(1)

import kolo  # noqa: E402
import kolo.torch as hvd  # noqa: E402
from _common import Cases, report  # noqa: E402

SEED = int(sys.argv[1]) if len(sys.argv) > 1 else 1

hvd.init()
R, N = hvd.rank(), hvd.size()
CASES = Cases(pass_case=True)
run = CASES.run

LISTS = {"even": list(range(0, N, 2)), "odd": list(range(1, N, 2)), "first2": [0, 1],
         "allbutlast": list(range(N - 1))}
_seen = []
for _k, _v in list(LISTS.items()):
    if not _v or _v in _seen:
        del LISTS[_k]
    else:
        _seen.append(_v)


def rng(case, rank):
    return np.random.default_rng([SEED, zlib.crc32(case.encode()), rank])


def make(case, rank, shape):
    return rng(case, rank).uniform(-1, 1, size=shape)


def close(got, want, what, tol=1e-12):
    got = got.detach().to(torch.float64).numpy()
    if got.shape != want.shape:
        return f"{what}: shape {got.shape}, expected {want.shape}"
    err = float(np.max(np.abs(got - want))) if got.size else 0.0
    return None if err <= tol * (1 + float(np.max(np.abs(want), initial=0))) else \
        f"{what}: max error {err:.3g}"


SETS = {}


def case_add(case):
    for k, ranks in LISTS.items():
        # Every rank lists the members in its own order.
        ps = hvd.add_process_set(list(reversed(ranks)) if R % 2 else ranks)
        SETS[k] = ps
        if ps.process_set_id is None or ps.ranks != ranks or ps.size() != len(ranks):
            return f"{k}: {ps} (size {ps.size()})"
        if ps.included() != (R in ranks):
            return f"{k}: included() is {ps.included()}"
        want = ranks.index(R) if R in ranks else -1
        if ps.rank() != want:
            return f"{k}: rank() {ps.rank()}, expected {want}"
    return None


def case_allreduce(case):
    """Every set this rank is in and the global set, same name, in flight
    together; Sum on float64 and Average on float32."""
    handles = []
    for k, ps in [("global", hvd.global_process_set), *SETS.items()]:
        if not ps.included():
            continue
        x = torch.from_numpy(make(f"{case}/{k}", R, (33, 5)))
        handles.append((k, ps, "sum", hvd.allreduce_async(x, name=case, op=hvd.Sum,
                                                          process_set=ps)))
        y = x.to(torch.float32)
        handles.append((k, ps, "avg", hvd.allreduce_async(y, name=case + ".avg",
                                                          process_set=ps)))
    for k, ps, op, h in handles:
        out = hvd.synchronize(h)
        members = list(range(N)) if k == "global" else ps.ranks
        want = sum(make(f"{case}/{k}", r, (33, 5)) for r in members)
        if op == "avg":
            want = want.astype(np.float32).astype(np.float64) / len(members)
        d = close(out, want, f"{k}/{op}", 1e-12 if op == "sum" else 1e-6)
        if d:
            return d
    return None


def case_allgather(case):
    for k, ps in SETS.items():
        if not ps.included():
            continue
        x = torch.from_numpy(make(f"{case}/{k}", R, (R + 1, 3)))
        out = hvd.allgather(x, name=case, process_set=ps)
        want = np.concatenate([make(f"{case}/{k}", r, (r + 1, 3)) for r in ps.ranks])
        d = close(out, want, k, 0)
        if d:
            return d
    return None


def case_broadcast(case):
    """The root is a rank of the job (Horovod's convention): the set's last member."""
    for k, ps in SETS.items():
        if not ps.included():
            continue
        root = ps.ranks[-1]
        x = torch.from_numpy(make(f"{case}/{k}", R, (7,)))
        out = hvd.broadcast(x, root, name=case, process_set=ps)
        d = close(out, make(f"{case}/{k}", root, (7,)), k, 0)
        obj = hvd.broadcast_object({"from": R}, root, process_set=ps)
        if d or obj != {"from": root}:
            return d or f"{k}: broadcast_object gave {obj}"
    return None


def case_alltoall(case):
    for k, ps in SETS.items():
        if not ps.included():
            continue
        n, me = len(ps.ranks), ps.rank()
        splits = [j + 1 for j in range(n)]
        x = torch.from_numpy(make(f"{case}/{k}", R, (sum(splits), 2)))
        out, recv = hvd.alltoall(x, splits=splits, name=case, process_set=ps)
        parts = []
        for i, r in enumerate(ps.ranks):
            src = make(f"{case}/{k}", r, (sum(splits), 2))
            parts.append(src[sum(splits[:me]):sum(splits[:me]) + splits[me]])
        d = close(out, np.concatenate(parts), k, 0)
        if d or recv.tolist() != [me + 1] * n:
            return d or f"{k}: received splits {recv.tolist()}"
    return None


def case_reducescatter(case):
    for k, ps in SETS.items():
        if not ps.included():
            continue
        n, me = len(ps.ranks), ps.rank()
        rows = 2 * n + 1
        x = torch.from_numpy(make(f"{case}/{k}", R, (rows, 3)))
        out = hvd.reducescatter(x, name=case, op=hvd.Sum, process_set=ps)
        total = sum(make(f"{case}/{k}", r, (rows, 3)) for r in ps.ranks)
        q, extra = divmod(rows, n)
        start = me * q + min(me, extra)
        d = close(out, total[start:start + q + (me < extra)], k, 1e-12)
        if d:
            return d
    return None


def case_grouped_and_barrier(case):
    for k, ps in SETS.items():
        if not ps.included():
            continue
        xs = [torch.from_numpy(make(f"{case}/{k}/{i}", R, (i + 2,))) for i in range(3)]
        outs = hvd.grouped_allreduce(xs, name=case, op=hvd.Sum, process_set=ps)
        for i, o in enumerate(outs):
            d = close(o, sum(make(f"{case}/{k}/{i}", r, (i + 2,)) for r in ps.ranks), k)
            if d:
                return d
        hvd.barrier(process_set=ps)
    return None


def case_outsider(case):
    """A rank outside a set is told so, and nothing is sent."""
    for k, ps in SETS.items():
        if ps.included():
            continue
        try:
            hvd.allreduce(torch.ones(3), process_set=ps)
        except ValueError as e:
            if "not in" not in str(e):
                return f"{k}: {e}"
        else:
            return f"{k}: an outsider's allreduce did not raise"
    return None


def case_optimizer(case):
    """DistributedOptimizer(process_set=even) on the even ranks equals
    single-process SGD on the members' concatenated batches."""
    ps = SETS.get("even")
    if ps is None or not ps.included():
        return None
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2).double()
    ref = torch.nn.Linear(4, 2).double()
    ref.load_state_dict(model.state_dict())
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5),
                                   named_parameters=model.named_parameters(), process_set=ps)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.5)
    for step in range(3):
        batch = {r: torch.from_numpy(make(f"{case}/{step}", r, (8, 4))) for r in ps.ranks}
        opt.zero_grad()
        model(batch[R]).pow(2).mean().backward()
        opt.step()
        ref_opt.zero_grad()
        ref(torch.cat([batch[r] for r in ps.ranks])).pow(2).mean().backward()
        ref_opt.step()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        d = close(p, q.detach().numpy(), name, 1e-12)
        if d:
            return d
    return None


def case_mismatch(case):
    """Rank 0 asks for other members than the rest: MismatchError on every
    rank, no set made, and the sets made before still work."""
    ranks = [0] if R == 0 else list(range(N))[-1:]
    try:
        hvd.add_process_set(ranks)
    except kolo.MismatchError as e:
        if "rank 0 passed" not in str(e):
            return f"message: {e}"
    else:
        return "a mismatched add_process_set did not raise"
    try:
        hvd.add_process_set([0, N])
    except ValueError as e:
        if f"rank {N} is not a rank" not in str(e) and "invalid list" not in str(e):
            return f"an invalid list: {e}"
    else:
        return "an invalid list did not raise"
    for k, ps in SETS.items():
        if ps.included():
            out = hvd.allreduce(torch.ones(2), op=hvd.Sum, process_set=ps)
            if out.tolist() != [float(ps.size())] * 2:
                return f"{k} after the mismatch: {out.tolist()}"
    return None


def case_remove(case):
    ps = SETS.pop(list(SETS)[-1])
    if not hvd.remove_process_set(ps) or hvd.remove_process_set(ps):
        return "remove_process_set did not return True, then False"
    try:
        hvd.allreduce(torch.ones(1), process_set=ps)
    except ValueError as e:
        return None if "has not been added" in str(e) else str(e)
    return "an op on a removed set did not raise"


for name, fn in [("add", case_add), ("allreduce", case_allreduce),
                 ("allgather", case_allgather), ("broadcast", case_broadcast),
                 ("alltoall", case_alltoall), ("reducescatter", case_reducescatter),
                 ("grouped_and_barrier", case_grouped_and_barrier),
                 ("outsider", case_outsider), ("optimizer", case_optimizer),
                 ("mismatch", case_mismatch), ("remove", case_remove)]:
    run(name, fn)

report({"cases": CASES.count})
hvd.shutdown()
