"""kolo.torch with op=hvd.Adasum: the allreduce (float32, float64, bfloat16)
and DistributedOptimizer(op=Adasum), checked against float64 numpy
references (_common.adasum_ref). The optimizer's reference: every rank's
local SGD-with-momentum step on its own batch, replayed here for every rank,
then each parameter's change replaced by the Adasum of the ranks' changes,
as Horovod's Adasum optimizer does. Usage: torch_adasum.py SEED."""

import sys
import zlib

import numpy as np
import torch

torch.set_num_threads(1)

import kolo.torch as hvd  # noqa: E402
from _common import Cases, adasum_ref, report  # noqa: E402

SEED = int(sys.argv[1]) if len(sys.argv) > 1 else 1
hvd.init()
R, N = hvd.rank(), hvd.size()
CASES = Cases(pass_case=True)


def data(case, rank, shape):
    g = np.random.default_rng([SEED, zlib.crc32(case.encode()), rank])
    common = np.random.default_rng([SEED, zlib.crc32(case.encode())]).normal(size=shape)
    return common + 0.5 * g.normal(size=shape)


def case_allreduce(case):
    for dt, tol in ((torch.float64, 1e-13), (torch.float32, 1e-5), (torch.bfloat16, 3e-2)):
        x = torch.from_numpy(data(case, R, (17, 3))).to(dt)
        out = hvd.allreduce(x, op=hvd.Adasum, name=f"{case}.{dt}")
        want = adasum_ref([torch.from_numpy(data(case, r, (17, 3))).to(dt).double().numpy()
                           for r in range(N)])
        err = float((out.double().reshape(-1) - torch.from_numpy(want)).abs().max())
        if out.dtype != dt or err > tol * float(np.abs(want).max()):
            return f"{dt}: error {err:.3g}"
    return None


def model():
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(),
                               torch.nn.Linear(4, 1)).double()


def batch(step, rank):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(6, 5, generator=g, dtype=torch.float64), \
        torch.randn(6, 1, generator=g, dtype=torch.float64)


def case_optimizer(case):
    m = model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=m.named_parameters(), op=hvd.Adasum)
    replicas = [model() for _ in range(N)]
    ropts = [torch.optim.SGD(x.parameters(), lr=0.1, momentum=0.9) for x in replicas]
    for step in range(4):
        x, y = batch(step, R)
        opt.zero_grad()
        torch.nn.functional.mse_loss(m(x), y).backward()
        opt.step()
        # The reference: each rank's local step, then Adasum of the changes.
        starts = [p.detach().clone() for p in replicas[0].parameters()]
        deltas = []
        for r, (rep, ro) in enumerate(zip(replicas, ropts)):
            xr, yr = batch(step, r)
            ro.zero_grad()
            torch.nn.functional.mse_loss(rep(xr), yr).backward()
            ro.step()
            deltas.append([(p.detach() - s).numpy() for p, s in zip(rep.parameters(), starts)])
        with torch.no_grad():
            for i, s in enumerate(starts):
                new = s + torch.from_numpy(
                    adasum_ref([d[i] for d in deltas]).reshape(s.shape))
                for rep in replicas:
                    list(rep.parameters())[i].copy_(new)
        for p, q in zip(m.parameters(), replicas[0].parameters()):
            err = float((p - q).abs().max())
            if err > 1e-12:
                return f"step {step}: parameters differ from the reference by {err:.3g}"
    return None


CASES.run("allreduce", case_allreduce)
CASES.run("optimizer", case_optimizer)
report({"cases": CASES.count})
hvd.shutdown()
