"""A torchrun worker that survives restarts (run by test_torchrun_rdzv.py).

    torchrun ... torchrun_elastic.py --backend kolo|gloo --steps S --out DIR
                                     [--hold-at K --hold-world W]

DDP on a small model, one checkpoint in DIR written by rank 0 after every
step (atomically); each (re)start loads it and trains to step S. Every rank
appends one JSON line per step to DIR/progress-<pid>.jsonl: its rank, world
size, node (GROUP_RANK), agent pid, its own pid, restart count, step, loss.
When it finishes, rank 0 writes DIR/done.json with the final parameters.

With --hold-at, a world of W ranks stops after step K until the test creates
DIR/release (the test kills a node meanwhile; bounded: 120 s)."""

import argparse
import datetime
import json
import os
import sys
import time

import torch
import torch.distributed as dist

import kolo.torch.distributed  # noqa: F401 - registers backend "kolo"

LR = 0.05


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))


def batch(step, rank):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)


def save(path, obj):
    tmp = f"{path}.{os.getpid()}.tmp"
    torch.save(obj, tmp)
    os.replace(tmp, path)


def hold(path, limit_s=120.0):
    """Waits for the test's release file (a handshake with the test)."""
    end = time.monotonic() + limit_s
    while not os.path.exists(path):
        if time.monotonic() > end:
            raise RuntimeError(f"{path} did not appear within {limit_s:.0f} s")
        time.sleep(0.05)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--backend", default="kolo")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--out", required=True)
    p.add_argument("--hold-at", type=int, default=0)
    p.add_argument("--hold-world", type=int, default=0)
    args = p.parse_args()
    torch.set_num_threads(1)
    # a bounded init: a round whose peer crashed while connecting fails and is restarted
    dist.init_process_group(args.backend, timeout=datetime.timedelta(seconds=30))
    rank, world = dist.get_rank(), dist.get_world_size()
    m = model()
    opt = torch.optim.SGD(m.parameters(), lr=LR)
    ckpt = os.path.join(args.out, "checkpoint.pt")
    start = 0
    if os.path.exists(ckpt):
        state = torch.load(ckpt)
        m.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"]
    ddp = torch.nn.parallel.DistributedDataParallel(m)
    log = open(os.path.join(args.out, f"progress-{os.getpid()}.jsonl"), "a", buffering=1)
    for step in range(start, args.steps):
        x, y = batch(step, rank)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        if rank == 0:
            save(ckpt, {"model": m.state_dict(), "opt": opt.state_dict(), "step": step + 1})
        dist.barrier()  # the checkpoint of this step exists before any rank goes on
        log.write(json.dumps({"rank": rank, "world": world, "node": int(os.environ["GROUP_RANK"]),
                              "agent": os.getppid(), "pid": os.getpid(), "step": step + 1,
                              "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)),
                              "loss": loss.item(), "t": time.time(),
                              "host": os.environ.get("KOLO_HOSTNAME", "local")}) + "\n")
        if step + 1 == args.hold_at and world == args.hold_world:
            hold(os.path.join(args.out, "release"))
    params = torch.cat([q.detach().reshape(-1) for q in m.parameters()]).tolist()
    gathered = [None] * world
    dist.all_gather_object(gathered, params)
    if rank == 0:
        with open(os.path.join(args.out, "done.json"), "w") as f:
            json.dump({"world": world, "same_on_every_rank": all(g == params for g in gathered),
                       "params": params}, f)
    # Rank 0 hosts this round's TCPStore: it leaves last, so that no rank tears down its
    # group against a store that has gone (gloo aborts the process then).
    store = dist.distributed_c10d._get_default_store()
    dist.destroy_process_group()
    store.add("left", 1)
    if rank == 0:
        end = time.monotonic() + 60
        while store.add("left", 0) < world and time.monotonic() < end:
            time.sleep(0.05)
    return 0


if __name__ == "__main__":
    sys.exit(main())
