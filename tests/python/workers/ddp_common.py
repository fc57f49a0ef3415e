"""Inputs, models and data shared by the DDP workers and their tests.

The tests import this module too, to recompute every input and to train the
single-process references, so the workers report only what they computed."""

import gzip
import os

import numpy as np

DTYPES = ["float32", "float64", "float16", "bfloat16", "int8", "uint8", "int32", "int64", "bool"]
OPS = ["SUM", "AVG", "MIN", "MAX", "PRODUCT"]
N = 7  # elements of each collective input


def case_input(torch, dtype, rank, seed, n=N):
    """Rank ``rank``'s input for case ``seed``: small values, so integer
    sums and products over 4 ranks stay in range and float16 stays exact
    enough; floats are never NaN."""
    g = torch.Generator().manual_seed(1000 * seed + rank)
    if dtype == "bool":
        return torch.randint(0, 2, (n,), generator=g).bool()
    if dtype == "uint8":
        return torch.randint(0, 4, (n,), generator=g).to(torch.uint8)
    if dtype.startswith("int"):
        return torch.randint(-3, 4, (n,), generator=g).to(getattr(torch, dtype))
    x = torch.randn(n, generator=g, dtype=torch.float64)
    return x.to(getattr(torch, dtype))


def as_list(t):
    """A tensor's values as JSON-friendly Python numbers (float64 for floats)."""
    if t.is_floating_point():
        return t.double().reshape(-1).tolist()
    return t.long().reshape(-1).tolist()


def seed_of(name, dtype):
    """A stable seed per (case, dtype)."""
    h = 0
    for ch in f"{name}/{dtype}":
        h = (h * 131 + ord(ch)) % 100003
    return h


# ---- training --------------------------------------------------------------

DIGITS = "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz"


def dataset(n=480, features=64, classes=10, seed=0):
    """(x float32 [n, features], y int64 [n]): the UCI digits when sklearn's
    copy is installed (first n rows, scaled to [0, 1]), else seeded blobs."""
    if os.path.exists(DIGITS) and features == 64 and classes == 10:
        with gzip.open(DIGITS) as f:
            a = np.loadtxt(f, delimiter=",")[:n]
        return (a[:, :64] / 16.0).astype(np.float32), a[:, 64].astype(np.int64)
    rng = np.random.default_rng(seed)
    centers = rng.normal(0, 1, (classes, features))
    y = rng.integers(0, classes, n)
    x = centers[y] + rng.normal(0, 0.8, (n, features))
    return x.astype(np.float32), y.astype(np.int64)


def make_model(torch, seed=0, features=64, hidden=32, classes=10):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(features, hidden), torch.nn.Tanh(),
                               torch.nn.Linear(hidden, classes))


def flat_params(torch, model):
    return torch.cat([p.detach().reshape(-1).double() for p in model.parameters()]).tolist()


def shard(step, rank, size, batch, n):
    """Indices of rank's part of the global batch of step (batch divisible
    by size): the data a rank sees depends only on step, rank and size."""
    start = (step * batch) % n
    idx = [(start + i) % n for i in range(batch)]
    per = batch // size
    return idx[rank * per:(rank + 1) * per]


def ref_training(torch, steps_per_rank, size, batch=24, hidden=16):
    """Single-process training over the batches of a DDP run where rank r
    trains steps_per_rank[r] steps: the loss at step s is the sum over the
    ranks still training of their shard's mean loss, divided by the initial
    world size (DDP's gradient average, join() included). Returns (params
    after each step, {rank: [loss at each of its steps]})."""
    x, y = (torch.from_numpy(a) for a in dataset())
    model = make_model(torch, seed=0, hidden=hidden)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    params, losses = [], {r: [] for r in range(size)}
    for s in range(max(steps_per_rank)):
        total = 0
        for r in range(size):
            if s < steps_per_rank[r]:
                idx = shard(s, r, size, batch, len(y))
                loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
                losses[r].append(loss.item())
                total = total + loss
        opt.zero_grad()
        (total / size).backward()
        opt.step()
        params.append(flat_params(torch, model))
    return params, losses


PROJ = np.random.default_rng(7).normal(size=(3, 2000))


def project(v):
    """Three fixed random projections of a parameter vector (what ddp_train
    reports for every rank and step)."""
    v = np.asarray(v, dtype=np.float64)
    return (PROJ[:, :len(v)] @ v).tolist()
