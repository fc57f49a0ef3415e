"""A rank SIGKILLed in the middle of a training step (non-elastic job).

    ddp_kill.py --launcher kolorun|env --victim R --kill-at S --timeout T
                [--model ddp|fsdp2|functional|allreduce|recv]

Every rank trains a small model, wrapped in DDP or sharded with FSDP2's
fully_shard, or (functional) runs a step of functional all_reduces over a
DeviceMesh, or (recv) passes its loss around the ring with dist.isend to the
right and dist.recv from the left; rank R reports the time and kills itself
with SIGKILL just before its backward pass (its collectives) of step S, or
(recv) before it sends, so its right neighbour waits in recv for it. Each survivor
reports when its step raised, what it raised and how long the step took,
then re-raises (the process ends as a user's would, through the uncaught
exception). SIGTERM from the launcher (which stops the job once a worker
died) is ignored for a few seconds so that the report gets out."""

import argparse
import datetime
import os
import signal
import time

import torch
import torch.distributed as dist

import kolo.torch.distributed  # noqa: F401 - registers the backend
from _common import report
from ddp_common import dataset, make_model, shard

p = argparse.ArgumentParser()
p.add_argument("--launcher", default="kolorun", choices=["kolorun", "env"])
p.add_argument("--victim", type=int, default=1)
p.add_argument("--kill-at", type=int, default=3)
p.add_argument("--timeout", type=float, default=20.0)
p.add_argument("--model", default="ddp", choices=["ddp", "fsdp2", "functional", "allreduce", "recv"])
args = p.parse_args()
torch.set_num_threads(1)
signal.signal(signal.SIGTERM, lambda *_: None)

timeout = datetime.timedelta(seconds=args.timeout)
if args.launcher == "kolorun":
    dist.init_process_group("kolo", init_method="kolo://", timeout=timeout)
else:
    dist.init_process_group("kolo", timeout=timeout)
rank, size = dist.get_rank(), dist.get_world_size()
x_all, y_all = (torch.from_numpy(a) for a in dataset())
model = make_model(torch, seed=0)
if args.model == "ddp":
    ddp = torch.nn.parallel.DistributedDataParallel(model)
elif args.model in ("recv", "allreduce"):
    ddp = model
else:
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (size,))
    ddp = model
    if args.model == "fsdp2":
        from torch.distributed.fsdp import fully_shard
        ddp = fully_shard(model, mesh=mesh)
opt = torch.optim.SGD(model.parameters(), lr=0.1)


def ring(loss):
    """The loss around the ring: sent right, received from the left."""
    left = torch.empty(1)
    w = dist.isend(loss.detach().reshape(1), (rank + 1) % size)
    dist.recv(left, (rank - 1) % size)
    w.wait()


def backward(loss):
    if args.model == "recv":
        ring(loss)
        loss.backward()
        return
    if args.model == "allreduce":  # dist.all_reduce's work.wait() raises
        loss.backward()
        works = [dist.all_reduce(p.grad, async_op=True) for p in model.parameters()]
        for w in works:
            w.wait()
        return
    if args.model != "functional":
        loss.backward()
        return
    import torch.distributed._functional_collectives as funcol
    loss.backward()
    for p in model.parameters():
        p.grad = funcol.wait_tensor(funcol.all_reduce(p.grad, "avg", mesh.get_group()))

report({"rank": rank, "size": size, "started": True,
        "kolo_timeout_ms": os.environ.get("KOLO_TIMEOUT_MS")})

for s in range(args.kill_at + 5):
    idx = shard(s, rank, size, 24, len(y_all))
    t0 = time.time()
    try:
        loss = torch.nn.functional.cross_entropy(ddp(x_all[idx]), y_all[idx])
        opt.zero_grad()
        if rank == args.victim and s == args.kill_at:
            report({"rank": rank, "killed_at": time.time(), "step": s})
            os.kill(os.getpid(), signal.SIGKILL)
        backward(loss)
        opt.step()
    except Exception as e:
        now = time.time()
        report({"rank": rank, "step": s, "raised_at": now, "step_s": now - t0,
                "error_type": type(e).__name__, "error": str(e).splitlines()[0][:500]})
        raise
report({"rank": rank, "finished": True})
