#!/usr/bin/env python3
"""Elastic data-parallel PyTorch training with Horovod's API on kolo.

The job of train_digits.py (same data, split, model, optimizer, learning-rate
schedule, stated accuracy and final check; its code is imported, not
copied) written in Horovod's elastic style, so that it goes on when workers
die, leave (SIGTERM) or are added mid-run, without restarting the others:

    build/bin/kolorun -np 3 --min-np 2 --max-np 4 -- \\
        .venv/bin/python examples/torch/train_digits_elastic.py

- ``@hvd.elastic.run`` wraps the training function; the model, the
  optimizer, an ``hvd.elastic.ElasticSampler`` and the counters (epoch,
  step, last test accuracy) live in ``hvd.elastic.TorchState`` and are
  committed after every step (``sampler.record_batch`` then
  ``state.commit()``), and once more at the end of each epoch;
- there is no explicit broadcast: the elastic loop syncs the state from
  rank 0 before training and after every re-form (a joiner gets rank 0's
  weights, momentum buffers, sampler position and counters);
- a reset callback sets the learning rate for the new size (lr x size, as
  the plain example, on the same cosine over the epochs) and prints one line
  per re-form on every rank: ``re-formed: size S, rank R, step N``.

To add a worker, start the job against a ``kolo-rendezvous`` server
(``--rendezvous URL --token-file F --job J``) and run a second
``kolorun -np 1`` with the same flags (docs/elastic.md). ``--hold-for-size
K`` makes a job smaller than K wait at its next commit point (up to
``--hold-s`` seconds) for workers to join, so that a demonstration or test
always sees the join; ``--slow-ms`` adds a delay to every step, to leave
time to act on a running job; ``--step-report`` has rank 0 print every
committed step.

The training loss and accuracy printed per epoch count the samples trained
since the epoch began or since the last re-form, whichever is later (a
re-form starts the loop again); the test accuracy is that of the whole model.

Exit status as train_digits.py: 0 when the test accuracy reached --target
and the parameters are identical on every rank; 1 when the target was
missed; 2 when the replicas differ; 3 on a kolo error; 64 on a usage error.
A worker that leaves (SIGTERM) exits 0 without the final check.
"""

from __future__ import annotations

import argparse
import math
import os
import pathlib
import sys
import time

# The plain example (the same folder) brings the data, the model and the
# checkout's kolo onto sys.path.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import train_digits as plain  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

import kolo.torch as hvd  # noqa: E402

NAME = "train_digits_elastic"
POLL_S = 0.02  # pause between two polls of the commit point while holding


def parse_args(argv=None) -> argparse.Namespace:
    p = plain.Parser(description=__doc__.split("\n\n")[0])
    plain.add_training_args(p, "set again after every re-form")
    p.add_argument("--hold-for-size", type=int, default=0, metavar="K",
                   help="while the job has fewer than K workers, wait at the next commit "
                        "point for workers to join (at most --hold-s; default 0: never)")
    p.add_argument("--hold-s", type=float, default=60.0,
                   help="the longest one hold lasts, in seconds (default 60)")
    p.add_argument("--slow-ms", type=float, default=0.0,
                   help="sleep this long in every step (default 0)")
    p.add_argument("--step-report", action="store_true",
                   help="rank 0 prints 'step N committed' after every step")
    p.add_argument("--save", metavar="PATH",
                   help="rank 0 saves the trained model's state_dict to PATH (torch.save)")
    a = p.parse_args(argv)
    plain.check_training_args(p, a)
    if a.hold_for_size < 0 or a.hold_s < 0 or a.slow_ms < 0:
        p.error("--hold-for-size, --hold-s and --slow-ms must be >= 0")
    return a


def say(msg: str) -> None:
    """Rank 0 (of the job now) prints msg."""
    if hvd.rank() == 0:
        print(f"{NAME}: {msg}", flush=True)


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    hvd.init()

    train_ds, test_ds, what = plain.dataset(args.data)
    # Every process starts from its own random weights: only the elastic
    # loop's sync from rank 0 makes them equal (for a joiner too).
    torch.manual_seed(args.seed + 1000 * hvd.rank() + os.getpid())
    model = plain.MLP()
    nparams = sum(p.numel() for p in model.parameters())
    opt = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=args.momentum)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    sampler = hvd.elastic.ElasticSampler(train_ds, shuffle=True, seed=args.seed)
    loader = DataLoader(train_ds, batch_size=args.batch_size, sampler=sampler)
    test_x, test_y = test_ds.tensors
    state = hvd.elastic.TorchState(model, opt, sampler=sampler, epoch=0, step=0, test_acc=0.0)

    def set_lr() -> float:
        """lr x size on train_digits.py's cosine over the epochs; every rank
        calls it at the start of each epoch's loop and after a re-form."""
        lr = (args.lr * hvd.size() *
              0.5 * (1 + math.cos(math.pi * min(state.epoch, args.epochs - 1) / args.epochs)))
        for group in opt.param_groups:
            group["lr"] = lr
        return lr

    def on_reset() -> None:
        lr = set_lr()
        print(f"{NAME}: re-formed: size {hvd.size()}, rank {hvd.rank()}, step {state.step} "
              f"(epoch {state.epoch + 1}, lr {lr:g})", flush=True)

    state.register_reset_callbacks([on_reset])
    # No collective before the elastic function: a joiner syncs there.
    print(f"{NAME}: rank {hvd.rank()} of {hvd.size()}: pid {os.getpid()}", flush=True)
    say(f"{what}: {len(train_ds)} train / {len(test_ds)} test samples; MLP 64-128-64-10 "
        f"({nparams} parameters); batch {args.batch_size} per rank, lr {args.lr} x size, "
        f"momentum {args.momentum}, seed {args.seed}")

    def hold() -> None:
        """Polls the commit point (every rank the same number of times)
        until a joiner raises HostsUpdatedInterrupt, or --hold-s passed."""
        if hvd.size() >= args.hold_for_size:
            return
        say(f"size {hvd.size()} < {args.hold_for_size}: waiting up to {args.hold_s:g} s for "
            f"workers to join (step {state.step})")
        for _ in range(max(1, int(args.hold_s / POLL_S))):
            state.check_host_updates()
            time.sleep(POLL_S)
        say(f"no worker joined within {args.hold_s:g} s; going on at size {hvd.size()}")

    @hvd.elastic.run
    def train(state) -> None:
        rank, size = hvd.rank(), hvd.size()
        print(f"{NAME}: rank {rank} of {size}: training from step {state.step} (epoch "
              f"{state.epoch + 1}, parameters sha256 "
              f"{plain.fingerprint(plain.flat_parameters(model))})", flush=True)
        held = False
        mine = slice(rank, None, size)  # this rank's share of the test set
        while state.epoch < args.epochs:
            t0 = time.perf_counter()
            lr = set_lr()
            model.train()
            loss_sum, correct, seen = 0.0, 0, 0
            for b, (x, y) in enumerate(loader):
                if not held:
                    held = True
                    hold()
                opt.zero_grad()
                out = model(x)
                loss = F.cross_entropy(out, y)
                loss.backward()
                opt.step()
                loss_sum += loss.item() * len(y)
                correct += (out.argmax(1) == y).sum().item()
                seen += len(y)
                if args.slow_ms:
                    time.sleep(args.slow_ms / 1000)
                sampler.record_batch(b, args.batch_size)
                state.step += 1
                state.commit()
                if args.step_report:
                    say(f"step {state.step} committed (epoch {state.epoch + 1}, size {size})")
            train_m = hvd.allreduce(torch.tensor([loss_sum, correct, seen], dtype=torch.float64),
                                    op=hvd.Sum, name="metric.train")
            model.eval()
            with torch.no_grad():
                pred = model(test_x[mine]).argmax(1)
            counts = torch.tensor([(pred == test_y[mine]).sum().item(), len(pred)],
                                  dtype=torch.float64)
            counts = hvd.allreduce(counts, op=hvd.Sum, name="metric.test_counts")
            state.test_acc = (counts[0] / counts[1]).item()
            n = max(train_m[2].item(), 1.0)
            say(f"epoch {state.epoch + 1:2d}/{args.epochs}  loss {train_m[0].item() / n:.4f}  "
                f"train acc {train_m[1].item() / n:.4f}  test acc {state.test_acc:.4f}  size "
                f"{size}  lr {lr:g}  step {state.step}  time {time.perf_counter() - t0:.2f} s")
            state.epoch += 1
            sampler.set_epoch(state.epoch)
            state.commit()

    start = time.perf_counter()
    train(state)  # a worker that leaves exits 0 in there
    size = hvd.size()
    say(f"trained {args.epochs} epochs ({state.step} steps) in "
        f"{time.perf_counter() - start:.2f} s, ending at size {size}")

    return plain.finish(model, state.test_acc, args, NAME, say)


if __name__ == "__main__":
    plain.run_main(main, NAME)
