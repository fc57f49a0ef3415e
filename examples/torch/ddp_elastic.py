#!/usr/bin/env python3
"""Elastic DistributedDataParallel on kolo: training that survives a
SIGKILLed worker and takes in a worker added mid-run, without restarting
the survivors.

    kolorun --min-np 2 --max-np 4 -np 3 --restart-failed --max-restarts 1 -- \\
        .venv/bin/python examples/torch/ddp_elastic.py --kill-at 60 --kill-rank 1

Rank 1 kills itself with SIGKILL at step 60. The two survivors' DDP step
fails with kolo.MembershipError; elastic_run restores their last commit,
destroys the process group, re-forms kolo's comm (kolo.reform(), in place)
and re-creates the group and the DDP wrapper at size 2. kolorun starts a
replacement, which joins at the survivors' next commit point and starts from
rank 0's model and optimizer state. (--hold-for-size 3 makes the survivors
wait for it at that commit point, so that the run always shows the join.)
A worker can also be added by hand with a second kolorun against the same
external rendezvous server (docs/elastic.md). ``--term-at S --term-rank R``
makes rank R send itself SIGTERM at step S instead (a spot reclaim): it
leaves the job at its next commit point and exits 0, and the others re-form
at once without rolling back.

Every rank's share of a step depends only on the step, its rank and the
world size (the global batch of 24 splits evenly over 2, 3 or 4 ranks), so
whatever the membership history, the run ends with the weights of a
single-process run over the same batches, up to float rounding:
``--reference`` trains that single-process run and prints its weights.
"""

import argparse
import gzip
import hashlib
import json
import os
import signal
import sys
import time

import numpy as np
import torch
import torch.distributed as dist

import kolo
import kolo.torch.distributed as kdist

DIGITS = "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz"


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=24, help="global batch (divisible by 2, 3, 4)")
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--kill-at", type=int, default=-1, help="step at which --kill-rank dies")
    p.add_argument("--kill-rank", type=int, default=1)
    p.add_argument("--term-at", type=int, default=-1,
                   help="step at which --term-rank sends itself SIGTERM (a graceful leave)")
    p.add_argument("--term-rank", type=int, default=2)
    p.add_argument("--hold-for-size", type=int, default=0,
                   help="after the job shrank, wait at the next commit point (at most "
                        "--hold-timeout s) until it has this many workers again")
    p.add_argument("--hold-timeout", type=float, default=60.0)
    p.add_argument("--reference", action="store_true",
                   help="train the same batches in one process, without kolo")
    p.add_argument("--report", action="store_true", help="print KOLO-RESULT lines (tests)")
    return p.parse_args()


def dataset(n=480):
    if os.path.exists(DIGITS):
        with gzip.open(DIGITS) as f:
            a = np.loadtxt(f, delimiter=",")[:n]
        x, y = a[:, :64] / 16.0, a[:, 64]
    else:  # seeded blobs, 10 classes, 64 features
        rng = np.random.default_rng(0)
        centers = rng.normal(0, 1, (10, 64))
        y = rng.integers(0, 10, n)
        x = centers[y] + rng.normal(0, 0.8, (n, 64))
    return torch.from_numpy(x.astype(np.float32)), torch.from_numpy(y.astype(np.int64))


def make_model(hidden):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.Tanh(),
                               torch.nn.Linear(hidden, 10))


def batch_indices(step, rank, size, batch, n):
    """Rank's part of step's global batch: a function of step, rank, size."""
    start = (step * batch) % n
    idx = [(start + i) % n for i in range(batch)]
    per = batch // size
    return idx[rank * per:(rank + 1) * per]


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def report(obj):
    sys.stdout.write("KOLO-RESULT " + json.dumps(obj) + "\n")
    sys.stdout.flush()


def reference(args):
    x, y = dataset()
    model = make_model(args.hidden)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    for step in range(args.steps):
        idx = batch_indices(step, 0, 1, args.batch, len(y))
        loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    acc = (model(x).argmax(1) == y).float().mean().item()
    print(f"reference: {args.steps} steps in one process, accuracy {acc:.3f}")
    if args.report:
        report({"reference": flat(model).double().tolist(), "accuracy": acc})


def main():
    args = parse_args()
    torch.set_num_threads(1)
    if args.reference:
        return reference(args)
    if args.batch % 12:
        sys.exit("--batch must be divisible by 2, 3 and 4")
    x, y = dataset()
    model = make_model(args.hidden)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    state = kdist.ElasticState(model, opt, step=0, sizes=[])
    victim = {}

    def train(state):
        rank, size = dist.get_rank(), dist.get_world_size()
        if "me" not in victim:  # the first start of this process decides (a replacement never)
            victim["me"] = kolo.round() == 1 and rank == args.kill_rank
            victim["leaver"] = kolo.round() == 1 and rank == args.term_rank
        print(f"round {kolo.round()}: rank {rank} of {size}, from step {state.step}", flush=True)
        if not state.sizes or state.sizes[-1][1] != size:
            state.sizes = state.sizes + [[state.step, size]]
        while state.step < args.steps:
            idx = batch_indices(state.step, rank, size, args.batch, len(y))
            loss = torch.nn.functional.cross_entropy(state.ddp(x[idx]), y[idx])
            opt.zero_grad()
            if victim["me"] and state.step == args.kill_at:
                print(f"step {state.step}: killing myself (SIGKILL)", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            if victim["leaver"] and state.step == args.term_at:
                print(f"step {state.step}: SIGTERM to myself (leaving at the next commit)",
                      flush=True)
                victim["leaver"] = False
                os.kill(os.getpid(), signal.SIGTERM)
            loss.backward()
            opt.step()
            state.step += 1
            if rank == 0 and state.step % 50 == 0:
                print(f"step {state.step}: loss {loss.item():.4f} on {size} workers", flush=True)
            state.commit()
            if size < args.hold_for_size and state.step < args.steps:
                end = time.monotonic() + args.hold_timeout
                while time.monotonic() < end:  # commit raises when the join is announced
                    time.sleep(0.05)
                    state.commit()
        return True

    if kdist.elastic_run(train, state) is None:
        print("left the job (SIGTERM)", flush=True)
        return
    rank, size = dist.get_rank(), dist.get_world_size()
    w = flat(model)
    hashes = [None] * size
    dist.all_gather_object(hashes, hashlib.sha256(w.numpy().tobytes()).hexdigest()[:16])
    acc = (model(x).argmax(1) == y).float().mean().item()
    if rank == 0:
        same = len(set(hashes)) == 1
        print(f"trained {state.step} steps, world sizes {state.sizes}, "
              f"{kolo.elastic_resets() if kolo.elastic_enabled() else 0} re-forms; accuracy "
              f"{acc:.3f}; weights {'bitwise identical' if same else 'DIFFERENT'} on all "
              f"{size} ranks (hash {hashes[0]})", flush=True)
    if args.report:
        report({"rank": rank, "size": size, "step": state.step, "sizes": state.sizes,
                "hashes": hashes, "accuracy": acc, "round": kolo.round(),
                "params": w.double().tolist() if rank == 0 else None})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
