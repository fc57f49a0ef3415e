#!/usr/bin/env python3
"""Data-parallel PyTorch training with Horovod's API on kolo.

A Horovod training script with one changed import (``import kolo.torch as
hvd``): each worker trains a small MLP on its shard of the UCI handwritten
digits (8x8 images, 10 classes), gradients are averaged over the workers by
``hvd.DistributedOptimizer``, and the program checks at the end that it
reached the stated test accuracy and that every worker holds bitwise
identical parameters.

    build/bin/kolorun -np 4 -- .venv/bin/python examples/torch/train_digits.py
    .venv/bin/python examples/torch/train_digits.py          # one process

Data: the digits file scikit-learn ships (found in this interpreter's
scikit-learn, else Debian's python3-sklearn; read with numpy and gzip,
sklearn itself is not imported; ``scripts/setup.sh --with-digits`` installs
it into .venv), else seeded synthetic data of the same shape (10 Gaussian
classes in 64 dimensions, learnable but not linearly trivial). Nothing is
downloaded. The train/test split is fixed (it does not depend on --seed).

Exit status: 0 when the test accuracy reached --target and the parameters
are identical on every rank; 1 when the target was missed; 2 when the
replicas differ; 3 on a kolo error; 64 on a usage error.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import math
import pathlib
import sys
import time

# Run from a source checkout without installing kolo: use <repo>/python.
if importlib.util.find_spec("kolo") is None:
    _src = pathlib.Path(__file__).resolve().parents[2] / "python"
    if (_src / "kolo" / "__init__.py").exists():
        sys.path.insert(0, str(_src))

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

# examples/digits_data.py: in examples/, or beside a copy of this file.
sys.path[:0] = [str(pathlib.Path(__file__).resolve().parent),
                str(pathlib.Path(__file__).resolve().parents[1])]
import digits_data  # noqa: E402
import kolo  # noqa: E402 (found now, from the checkout if need be)
import kolo.torch as hvd  # noqa: E402

DIGITS = digits_data.digits_file()


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # usage errors exit 64, as the C examples
        self.print_usage(sys.stderr)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(64)


def add_training_args(p: argparse.ArgumentParser, lr_note: str) -> None:
    """The options this example and its elastic variant share; lr_note ends --lr's help."""
    p.add_argument("--epochs", type=int, default=10, help="passes over the data (default 10)")
    p.add_argument("--batch-size", type=int, default=32,
                   help="samples per rank and step (default 32)")
    p.add_argument("--lr", type=float, default=0.05,
                   help="learning rate of one rank's batch; the optimizer uses lr * size, "
                        f"{lr_note} (default 0.05)")
    p.add_argument("--momentum", type=float, default=0.9, help="SGD momentum (default 0.9)")
    p.add_argument("--target", type=float, default=0.9,
                   help="test accuracy the run must reach (default 0.90)")
    p.add_argument("--seed", type=int, default=1, help="model and shuffling seed (default 1)")
    p.add_argument("--data", choices=["auto", "digits", "synthetic"], default="auto",
                   help="auto: the digits file when present, else synthetic (default)")


def check_training_args(p: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """Refuses the shared options' bad values with exit 64 (p.error)."""
    if a.epochs < 1 or a.batch_size < 1 or not a.lr > 0 or not 0 <= a.target <= 1:
        p.error("--epochs and --batch-size must be >= 1, --lr > 0, 0 <= --target <= 1")


def parse_args(argv=None) -> argparse.Namespace:
    p = Parser(description=__doc__.split("\n\n")[0])
    add_training_args(p, "as Horovod recommends")
    p.add_argument("--no-broadcast", action="store_true",
                   help="skip the initial broadcast of the parameters and optimizer state "
                        "(each rank keeps its own random start: the replicas then differ, "
                        "and the final check fails)")
    p.add_argument("--save", metavar="PATH",
                   help="rank 0 saves the trained model's state_dict to PATH (torch.save)")
    a = p.parse_args(argv)
    check_training_args(p, a)
    return a


# ---- data ------------------------------------------------------------------


def dataset(kind: str):
    """(train TensorDataset, test TensorDataset, description): the digits or
    the synthetic stand-in, split as examples/digits_data.py does."""
    xtr, ytr, xte, yte, what = digits_data.load(kind)
    mk = lambda x, y: TensorDataset(torch.from_numpy(x), torch.from_numpy(y))  # noqa
    return mk(xtr, ytr), mk(xte, yte), what


# ---- model -----------------------------------------------------------------


class MLP(torch.nn.Module):
    def __init__(self, dim: int = 64, hidden: int = 128, classes: int = 10):
        super().__init__()
        self.fc1 = torch.nn.Linear(dim, hidden)
        self.fc2 = torch.nn.Linear(hidden, hidden // 2)
        self.fc3 = torch.nn.Linear(hidden // 2, classes)

    def forward(self, x):
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


def flat_parameters(model: torch.nn.Module) -> torch.Tensor:
    """Every entry of the state dict, in key order, as one float32 vector."""
    sd = model.state_dict()
    return torch.cat([sd[k].detach().reshape(-1).float() for k in sorted(sd)])


def fingerprint(t: torch.Tensor) -> str:
    return hashlib.sha256(t.numpy().tobytes()).hexdigest()[:16]


def metric_average(value: float, name: str) -> float:
    """Horovod's metric_average: the mean of value over the ranks."""
    return hvd.allreduce(torch.tensor(value, dtype=torch.float64), name=name).item()


# ---- training --------------------------------------------------------------


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    hvd.init()
    rank, size = hvd.rank(), hvd.size()

    def say(msg: str) -> None:
        if rank == 0:
            print(f"train_digits: {msg}", flush=True)

    train_ds, test_ds, what = dataset(args.data)
    # Each rank starts from its own random weights: only the broadcast makes
    # them equal, so a broken broadcast cannot go unnoticed.
    torch.manual_seed(args.seed + 1000 * rank)
    model = MLP()
    nparams = sum(p.numel() for p in model.parameters())
    lr = args.lr * size
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=args.momentum)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())

    sampler = DistributedSampler(train_ds, num_replicas=size, rank=rank, shuffle=True,
                                 seed=args.seed)
    loader = DataLoader(train_ds, batch_size=args.batch_size, sampler=sampler)
    test_x, test_y = test_ds.tensors
    mine = slice(rank, None, size)  # this rank's share of the test set, no padding
    say(f"{size} rank{'s' if size > 1 else ''}; {what}: {len(train_ds)} train / "
        f"{len(test_ds)} test samples; MLP 64-128-64-10 ({nparams} parameters)")
    say(f"batch {args.batch_size} per rank ({args.batch_size * size} global), lr "
        f"{args.lr} x {size} = {lr:g}, momentum {args.momentum}, seed {args.seed}, "
        f"{len(loader)} steps per epoch")

    if not args.no_broadcast:
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        say(f"broadcast the initial parameters from rank 0 (sha256 "
            f"{fingerprint(flat_parameters(model))})")
    else:
        say("--no-broadcast: every rank keeps its own initial parameters")

    start = time.perf_counter()
    test_acc = 0.0
    for epoch in range(1, args.epochs + 1):
        t0 = time.perf_counter()
        sampler.set_epoch(epoch)
        # Cosine decay of the learning rate over the run: a large scaled lr
        # early, a settled model at the end.
        for group in opt.param_groups:
            group["lr"] = lr * 0.5 * (1 + math.cos(math.pi * (epoch - 1) / args.epochs))
        model.train()
        loss_sum, correct, seen = 0.0, 0, 0
        for x, y in loader:
            opt.zero_grad()
            out = model(x)
            loss = F.cross_entropy(out, y)
            loss.backward()
            opt.step()
            loss_sum += loss.item() * len(y)
            correct += (out.argmax(1) == y).sum().item()
            seen += len(y)
        train_loss = metric_average(loss_sum / seen, "metric.train_loss")
        train_acc = metric_average(correct / seen, "metric.train_acc")
        model.eval()
        with torch.no_grad():
            pred = model(test_x[mine]).argmax(1)
        counts = torch.tensor([(pred == test_y[mine]).sum().item(), len(pred)],
                              dtype=torch.float64)
        counts = hvd.allreduce(counts, op=hvd.Sum, name="metric.test_counts")
        test_acc = (counts[0] / counts[1]).item()
        say(f"epoch {epoch:2d}/{args.epochs}  loss {train_loss:.4f}  train acc "
            f"{train_acc:.4f}  test acc {test_acc:.4f}  time {time.perf_counter() - t0:.2f} s")
    say(f"trained {args.epochs} epochs in {time.perf_counter() - start:.2f} s")

    return finish(model, test_acc, args, "train_digits", say, rank_hash=size > 1)


def finish(model: torch.nn.Module, test_acc: float, args, name: str, say,
           rank_hash: bool = True) -> int:
    """The end of a run, on every rank: checks the stated accuracy and that
    every rank holds bitwise-identical parameters (an allgather of them),
    prints this rank's parameter hash (when rank_hash), saves rank 0's
    model with --save and shuts kolo down. Returns the exit status: 0, 1
    (accuracy missed) or 2 (replicas differ)."""
    rank, size = hvd.rank(), hvd.size()
    # Every rank must hold the same bits: gather every rank's parameters.
    flat = flat_parameters(model)
    everyone = hvd.allgather(flat.unsqueeze(0), name="check.parameters")
    differ = [r for r in range(size) if not torch.equal(everyone[r], everyone[0])]
    status = 0
    if test_acc >= args.target:
        say(f"reached test accuracy {test_acc:.4f} >= target {args.target:.2f}")
    else:
        say(f"MISSED the target: test accuracy {test_acc:.4f} < {args.target:.2f}")
        status = 1
    if differ:
        gap = max((everyone[r] - everyone[0]).abs().max().item() for r in differ)
        say(f"REPLICAS DIFFER: ranks {differ} hold other parameters than rank 0 (largest "
            f"difference {gap:.3g})")
        status = 2
    elif size > 1:
        say(f"parameters bitwise identical on all {size} ranks (sha256 {fingerprint(flat)})")
    else:
        say(f"one rank: nothing to compare (parameters sha256 {fingerprint(flat)})")
    if rank_hash:
        print(f"{name}: rank {rank}: parameters sha256 {fingerprint(flat)}", flush=True)
    if args.save and rank == 0:
        torch.save(model.state_dict(), args.save)
    hvd.shutdown()
    return status


def run_main(main_fn, name: str) -> None:
    """Runs main_fn and exits with its status; a kolo error is reported
    with this rank, the job is aborted (the others do not wait for us) and
    the exit status is 3."""
    try:
        sys.exit(main_fn())
    except kolo.Error as e:
        who = kolo.rank() if kolo.is_initialized() else "?"
        print(f"{name}: rank {who}: kolo error: {e}", file=sys.stderr)
        kolo.abort()
        sys.exit(3)


if __name__ == "__main__":
    run_main(main, "train_digits")
