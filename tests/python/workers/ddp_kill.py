"""A rank SIGKILLed in the middle of a DDP step (non-elastic job).

    ddp_kill.py --launcher kolorun|env --victim R --kill-at S --timeout T

Every rank trains a small DDP model; rank R reports the time and kills
itself with SIGKILL just before its backward pass of step S. Each survivor
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
ddp = torch.nn.parallel.DistributedDataParallel(model)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
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
        loss.backward()
        opt.step()
    except Exception as e:
        now = time.time()
        report({"rank": rank, "step": s, "raised_at": now, "step_s": now - t0,
                "error_type": type(e).__name__, "error": str(e).splitlines()[0][:500]})
        raise
report({"rank": rank, "finished": True})
